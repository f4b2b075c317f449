#include "src/client/cli.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "src/common/config.h"

static const char usage_all[] =
    "usage: idalloc [--cluster ADDR,ADDR,...|--config FILE] [--timeout MS]\n"
    "               [--tls-dir DIR [--tls-client NAME]] COMMAND [ARGS]\n"
    "       idalloc -h|--help | --version | COMMAND --help\n"
    "\n"
    "commands:\n"
    "  pool create NAME --kind sequence|bounded|prefix [--size N]\n"
    "  alloc POOL --tag TAG          print the id TAG holds (new or old)\n"
    "  free POOL ID --tag TAG        free ID held by TAG\n"
    "  lookup POOL --tag TAG         print the id TAG holds\n"
    "  list POOL                     print \"ID TAG\" per holding, in id "
    "order\n"
    "  reserve POOL --count N        print \"FIRST LAST\" (inclusive)\n"
    "  next POOL [--count K] [--format dec|hex]   reserve K ids, one a line\n"
    "  prefix POOL --tag TAG         print the prefix as hex\n"
    "  status [--verbose]            one line per node (--verbose: peers, "
    "errors)\n"
    "  bench --op alloc|reserve|next|prefix --pool POOL --clients C\n"
    "        --duration SECONDS [--count N] [--threads T | --blocking] "
    "[--json]\n"
    "  member list                   one line per member (and waiting node)\n"
    "  member add|remove|promote ID  change the membership (README, "
    "Runbook)\n"
    "  member add ID PEER_ADDR CLIENT_ADDR   add node ID at these addresses\n"
    "  member update ID PEER_ADDR CLIENT_ADDR   member ID moved there\n"
    "  leader transfer [--to ID]     hand leadership to another voter\n"
    "  snapshot save FILE            back the whole state up into FILE\n"
    "  snapshot restore FILE [--advance-sequences N]   into a new cluster\n"
    "  certs create DIR --nodes N [--clients K] [--force]\n"
    "  certs add DIR (--node I | --client J) [--force]\n"
    "                                a development CA and certificates "
    "(idalloc\n"
    "                                certs --help)\n"
    "\n"
    "options:\n"
    "  --cluster ADDR,...  client addresses of nodes (default: "
    "$IDALLOC_CLUSTER,\n"
    "                      else " IDA_CLI_DEFAULT_CLUSTER
    ");\n"
    "                      one reachable node is enough: the others are "
    "learned\n"
    "  --config FILE       take the client addresses from a cluster file\n"
    "  --timeout MS        give up a call after MS milliseconds, retries "
    "included\n"
    "                      (default 5000; 1 to 3600000)\n"
    "  --json, -w json     (after the command) one JSON document on stdout:\n"
    "                      status, member list, list, lookup, alloc, "
    "reserve,\n"
    "                      next (at most 1000000 ids), prefix, bench\n"
    "  --tls-dir DIR       speak TLS to the client port (a cluster with "
    "client_tls\n"
    "                      on or required), trusting DIR/ca.crt (default:\n"
    "                      $IDALLOC_TLS_DIR; unset or empty: plaintext)\n"
    "  --tls-client NAME   present DIR/NAME.crt with key DIR/NAME.key (e.g.\n"
    "                      client1; default: $IDALLOC_TLS_CLIENT); client_tls\n"
    "                      required needs it\n"
    "  -h, --help          this text; `idalloc COMMAND --help` for one "
    "command\n"
    "  --version           print the version\n"
    "A value may follow its option or an `=` (--tag=VALUE); one that starts\n"
    "with `-` must use `=`. Pool names: 1-64 of A-Za-z0-9._:-; tags: 1-128\n"
    "bytes of UTF-8. `list` escapes \\, newline, tab and control bytes in "
    "tags.\n"
    "\n"
    "pool create, alloc, free, reserve, next and prefix also take\n"
    "  --request-id ID     repeat an earlier call whose outcome was unknown "
    "(exit 3):\n"
    "                      ID is what it printed on stderr; the same "
    "command with\n"
    "                      the same arguments then prints the first answer "
    "if it\n"
    "                      acted, and acts now if it never did (exactly "
    "once)\n"
    "\n"
    "exit codes: 0 success; 1 a definite no (not found, pool exhausted, tag\n"
    "mismatch, no such pool, wrong kind of pool, request id reused with other\n"
    "arguments); 2 bad usage or input; 3 outcome unknown (no leader "
    "reachable,\n"
    "timeout): repeating with --request-id is safe. `status` has its own\n"
    "(see idalloc status --help).\n";

static const char *const usage_cmd[] = {
    [IDA_CLI_HELP] = usage_all,
    [IDA_CLI_POOL_CREATE] =
        "usage: idalloc pool create NAME --kind sequence|bounded|prefix "
        "[--size N]\n"
        "       [--request-id ID]\n"
        "Create a pool. bounded pools need --size N: ids are [0, N).\n"
        "Prints \"created\" or \"exists\" (an identical pool was there).\n",
    [IDA_CLI_ALLOC] =
        "usage: idalloc alloc POOL --tag TAG [--request-id ID] [--json]\n"
        "Allocate the lowest free id of bounded pool POOL to TAG and print "
        "it.\nA TAG that already holds an id gets the same id back.\n",
    [IDA_CLI_FREE] =
        "usage: idalloc free POOL ID --tag TAG [--request-id ID]\n"
        "Free ID if TAG holds it. Prints \"freed\" or "
        "\"already free\".\n",
    [IDA_CLI_LOOKUP] =
        "usage: idalloc lookup POOL --tag TAG [--json]\n"
        "Print the id TAG holds in bounded pool POOL (exit "
        "1 if none).\n",
    [IDA_CLI_LIST] =
        "usage: idalloc list POOL [--json]\n"
        "Print every holding of bounded pool POOL as \"ID "
        "TAG\", in id order.\n",
    [IDA_CLI_RESERVE] =
        "usage: idalloc reserve POOL --count N [--request-id ID] [--json]\n"
        "Reserve N (1 to 16777216 = 2^24) consecutive ids of sequence pool "
        "POOL;\nprint \"FIRST LAST\".\n",
    [IDA_CLI_NEXT] =
        "usage: idalloc next POOL [--count K] [--format dec|hex] "
        "[--request-id ID] [--json]\n"
        "Reserve exactly K (default 1, at most 10000000) ids of sequence pool "
        "POOL\nin one request and print them, one a line. hex prints "
        "0000-0000-0000-0001\nstyle ids whose string order is their numeric "
        "order.\n",
    [IDA_CLI_PREFIX] =
        "usage: idalloc prefix POOL --tag TAG [--request-id ID] [--json]\n"
        "Allocate a short prefix of prefix pool POOL to TAG "
        "(or return the one\nit holds) and print it as "
        "hex.\n",
    [IDA_CLI_STATUS] =
        "usage: idalloc status [--verbose] [--json]\n"
        "Ask every node; print one line per node: id, address, role, term,\n"
        "commit index, applied index, leader, log range and last snapshot (or\n"
        "the error for a node that did not answer). --verbose adds indented\n"
        "lines: the leader's view of each peer (match and next index,\n"
        "replication state, connected) and the node's most frequent errors.\n"
        "Nodes the cluster names are asked too, not only those given.\n"
        "\n"
        "--json (or -w json), here and after list, lookup, alloc, reserve,\n"
        "next (at most 1000000 ids), prefix, member list and bench: one JSON\n"
        "document on stdout instead (README, \"JSON output\").\n"
        "\n"
        "exit codes: 0 a leader is known and every node answered; 1 a leader\n"
        "serves but some node did not answer; 3 no leader reachable.\n",
    [IDA_CLI_BENCH] =
        "usage: idalloc bench --op alloc|reserve|next|prefix --pool POOL "
        "--clients C\n"
        "                     --duration SECONDS [--count N]\n"
        "                     [--threads T | --blocking] [--json]\n"
        "Drive load for SECONDS with C requests in flight, creating POOL if "
        "it does\nnot exist. By default the C requests are C closed loops "
        "of asynchronous\ncalls (idalloc_alloc_async() and the like: each "
        "completion submits the\nslot's next request) on T client objects "
        "(--threads, 1 to 16, default 1),\nso the bench runs T I/O threads "
        "and pipelines the requests on one\nconnection per node and "
        "client object. --blocking runs the C requests\nfrom C threads "
        "sharing one client object, each making one blocking call\nat a "
        "time (the way applications with a thread per request do; --op next\n"
        "always runs so, next() being served from local blocks). --count is "
        "the\nreserve block size (1 to 16777216, default 1). Progress goes "
        "to stderr each\nsecond; the summary line (or a JSON object with "
        "--json) to stdout: ok,\nerrors (definite), unknown (outcome "
        "unknown), and the latency of every\nrequest from its submit to its "
        "answer. Only ids the cluster acknowledged\nare counted. A POOL of "
        "the wrong kind for --op is refused before the run\n(exit 1); a run "
        "in which no request succeeded exits 1 (definite errors)\nor 3 "
        "(outcomes unknown).\n",
    [IDA_CLI_MEMBER_LIST] =
        "usage: idalloc member list [--json]\n"
        "       idalloc member add|remove|promote ID\n"
        "       idalloc member add|update ID PEER_ADDR CLIENT_ADDR\n"
        "Ask the leader for the membership in effect; print one line per "
        "member:\n"
        "  id=ID role=voter|learner incarnation=HEX match=INDEX "
        "connected=yes|no\n"
        "  peer=ADDR client=ADDR\n"
        "then one line with role=waiting per node that is not a member with "
        "the\nincarnation it speaks with (a replaced data directory waiting "
        "for\nre-admission, a removed node, or a node asking to join, at the "
        "addresses\nit announced). match is the leader's replication "
        "progress. Addresses are\nthe membership's (README, Runbook).\n",
    [IDA_CLI_MEMBER_ADD] =
        "usage: idalloc member add ID [PEER_ADDR CLIENT_ADDR]\n"
        "Add node ID as a learner, bound to the incarnation it last spoke "
        "with (it\nmust be running: a new node is started with idallocd "
        "--join), at\nPEER_ADDR and CLIENT_ADDR (where it listens; without "
        "them, at its line\nof the cluster file). Every node dials it there "
        "once the change\ncommitted. With `auto_rejoin on` in the cluster "
        "file the leader promotes\nit to voter once caught up; else use "
        "`member promote`.\nPrints \"added\" once the change committed, or "
        "\"already a member\".\nRefused (exit 1): an address another member "
        "uses, not the addresses\nthe node says it listens on, a member at "
        "other addresses (member update).\nexit codes: 0 done; 1 refused "
        "(reason on stderr); 2 usage or a bad\naddress (nothing sent); 3 "
        "outcome unknown or no leader: retrying is safe.\n",
    [IDA_CLI_MEMBER_UPDATE] =
        "usage: idalloc member update ID PEER_ADDR CLIENT_ADDR\n"
        "Member ID (voter or learner) now listens on PEER_ADDR and "
        "CLIENT_ADDR\n(restarted there with its data directory: idallocd "
        "--peer ADDR --client\nADDR). The same members, ID at its new "
        "addresses; every node dials the\nnew peer address once the change "
        "committed. Prints \"updated\" once the\nchange committed, or "
        "\"already at these addresses\".\nexit codes: 0 done; 1 refused "
        "(not a member, an address another member\nuses); 2 usage or a bad "
        "address; 3 outcome unknown or no leader.\n",
    [IDA_CLI_MEMBER_REMOVE] =
        "usage: idalloc member remove ID\n"
        "Remove member ID (voter or learner). The last voter cannot be "
        "removed.\nRemoving the leader hands leadership to a caught-up voter "
        "first; the new\nleader removes it. A removed node keeps running "
        "and is listed as waiting;\nit is not re-admitted until `member "
        "add`. Prints \"removed\" once the\nchange committed, or \"not a "
        "member\".\nexit codes: 0 done; 1 refused; 2 usage; 3 outcome "
        "unknown or no leader.\n",
    [IDA_CLI_MEMBER_PROMOTE] =
        "usage: idalloc member promote ID\n"
        "Make learner ID a voter. Refused (exit 1) while it has not caught "
        "up\n(its match index, in `member list`, is below the commit index). "
        "Prints\n\"promoted\" once the change committed, or \"already a "
        "voter\".\nexit codes: 0 done; 1 refused; 2 usage; 3 outcome unknown "
        "or no leader.\n",
    [IDA_CLI_SNAPSHOT_SAVE] =
        "usage: idalloc snapshot save FILE\n"
        "       idalloc snapshot restore FILE [--advance-sequences N]\n"
        "save: copy the whole state from the leader, at an index that holds "
        "every\nwrite acknowledged before the command, into FILE (written "
        "atomically:\ntemporary file, fsync, rename) with its index, term, "
        "cluster name and a\nchecksum. Prints \"saved FILE index=I term=T "
        "cluster=NAME bytes=B\".\n",
    [IDA_CLI_SNAPSHOT_RESTORE] =
        "usage: idalloc snapshot restore FILE [--advance-sequences N] "
        "[--request-id ID]\n"
        "Load the pools of backup FILE into a NEW cluster: one that has no "
        "pools\nand another name than the cluster the backup was taken "
        "from. Ids handed\nout after the backup was taken can be handed out "
        "again: --advance-sequences N\nmoves every sequence pool N ids on "
        "(pass more than the cluster could have\nreserved since the "
        "backup); bounded and prefix pools are as they were at\nthe backup's "
        "index (README, \"Backup and restore\"). A damaged or foreign "
        "file\nis refused with one line, changing nothing.\n"
        "--request-id ID repeats a restore whose outcome was unknown (exit "
        "3 names\nits id).\n"
        "exit codes: 0 done; 1 refused (the cluster has pools); 2 bad usage, "
        "a bad\nfile, or a backup of this very cluster; 3 outcome "
        "unknown.\n",
    [IDA_CLI_LEADER_TRANSFER] =
        "usage: idalloc leader transfer [--to ID]\n"
        "Hand leadership to voter ID (default: a caught-up voter). Prints\n"
        "\"leader=N\" once the old leader stepped down (N: the new leader, 0 "
        "if not\nknown yet). exit codes: 0 done; 1 refused or the transfer "
        "did not complete\n(the old leader still leads); 2 usage; 3 no "
        "leader reachable.\n",
};

const char *ida_cli_usage(enum ida_cli_cmd cmd)
{
    if ((unsigned)cmd >= sizeof(usage_cmd) / sizeof(usage_cmd[0]) ||
        usage_cmd[cmd] == NULL) {
        return usage_all; /* --version has no text of its own */
    }
    return usage_cmd[cmd];
}

void ida_cli_escape(const char *tag, char *out)
{
    static const char hex[] = "0123456789abcdef";
    for (const unsigned char *c = (const unsigned char *)tag; *c != '\0'; c++) {
        const char *e = *c == '\\'   ? "\\\\"
                        : *c == '\n' ? "\\n"
                        : *c == '\t' ? "\\t"
                        : *c == '\r' ? "\\r"
                                     : NULL;
        if (e != NULL) {
            *out++ = e[0];
            *out++ = e[1];
        } else if (*c < 0x20 || *c == 0x7f) {
            *out++ = '\\';
            *out++ = 'x';
            *out++ = hex[*c >> 4];
            *out++ = hex[*c & 15];
        } else {
            *out++ = (char)*c;
        }
    }
    *out = '\0';
}

static int fail(char *errmsg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int fail(char *errmsg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, IDALLOC_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    return IDA_EINVAL;
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (s == NULL || *s == '\0' || strlen(s) > 20) {
        return -1;
    }
    uint64_t v = 0;
    for (; *s != '\0'; s++) {
        if (!isdigit((unsigned char)*s)) {
            return -1;
        }
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) {
            return -1;
        }
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

struct cmd_name
{
    const char *name;
    enum ida_cli_cmd cmd;
};

static const struct cmd_name commands[] = {
    {"alloc", IDA_CLI_ALLOC},     {"free", IDA_CLI_FREE},
    {"lookup", IDA_CLI_LOOKUP},   {"list", IDA_CLI_LIST},
    {"reserve", IDA_CLI_RESERVE}, {"next", IDA_CLI_NEXT},
    {"prefix", IDA_CLI_PREFIX},   {"status", IDA_CLI_STATUS},
    {"bench", IDA_CLI_BENCH},
};

/* The parse state: positional arguments and flags after the command. */
struct args
{
    const char *pos[4];
    int npos;
    const char *kind, *size, *tag, *count, *format, *op, *pool, *clients,
        *duration, *to, *advance, *reqid, *threads;
    int json;
    int verbose;
    int blocking;
};

/* Flags that take a value, and where it goes (@flag: @n bytes). */
static const char **flag_slot(struct args *a, const char *flag, size_t n)
{
    static const char *const names[] = {"--kind",
                                        "--size",
                                        "--tag",
                                        "--count",
                                        "--format",
                                        "--op",
                                        "--clients",
                                        "--duration",
                                        "--pool",
                                        "--to",
                                        "--advance-sequences",
                                        "--request-id",
                                        "--threads"};
    const char **slots[] = {&a->kind,   &a->size, &a->tag,     &a->count,
                            &a->format, &a->op,   &a->clients, &a->duration,
                            &a->pool,   &a->to,   &a->advance, &a->reqid,
                            &a->threads};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strlen(names[i]) == n && strncmp(flag, names[i], n) == 0) {
            return slots[i];
        }
    }
    return NULL;
}

/* The value after option argv[@i], or NULL when there is none or the next
 * argument looks like an option: `--tag --json` is a missing tag, not the
 * tag "--json" (a value that starts with `-` goes after `=`). */
static const char *value_of(int argc, char **argv, int i)
{
    return i + 1 < argc && argv[i + 1][0] != '-' ? argv[i + 1] : NULL;
}

static int needs_value(char *errmsg,
                       const char *cmd,
                       const char *flag,
                       int argc,
                       char **argv,
                       int i)
{
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    return fail(errmsg, "%s%s%s needs a value%s%s (see idalloc %s%s--help)",
                cmd != NULL ? cmd : "", cmd != NULL ? ": " : "", flag,
                next != NULL ? ", not the option " : "",
                next != NULL ? next : "", cmd != NULL ? cmd : "",
                cmd != NULL ? " " : "");
}

static int collect(int argc,
                   char **argv,
                   int i,
                   const char *cmd,
                   struct args *a,
                   char *errmsg)
{
    for (; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--json") == 0) {
            a->json = 1;
            continue;
        }
        if (strcmp(s, "-w") == 0) {
            /* -w json (kubectl's -o, etcdctl's -w): the same as --json. */
            if (i + 1 >= argc || (strcmp(argv[i + 1], "json") != 0 &&
                                  strcmp(argv[i + 1], "plain") != 0)) {
                return fail(errmsg, "%s: -w needs json or plain", cmd);
            }
            a->json |= strcmp(argv[++i], "json") == 0;
            continue;
        }
        if (strcmp(s, "--verbose") == 0) {
            a->verbose = 1;
            continue;
        }
        if (strcmp(s, "--blocking") == 0) {
            a->blocking = 1;
            continue;
        }
        if (s[0] == '-' && s[1] != '\0') {
            const char *eq = strchr(s, '=');
            size_t n = eq != NULL ? (size_t)(eq - s) : strlen(s);
            const char **slot = flag_slot(a, s, n);
            if (slot == NULL) {
                return fail(errmsg,
                            "%s: unknown option %.*s (see idalloc %s --help)",
                            cmd, (int)n, s, cmd);
            }
            const char *v = eq != NULL ? eq + 1 : value_of(argc, argv, i);
            if (v == NULL) {
                return needs_value(errmsg, cmd, s, argc, argv, i);
            }
            if (*slot != NULL) {
                return fail(errmsg, "%s: %.*s given twice", cmd, (int)n, s);
            }
            *slot = v;
            i += eq != NULL ? 0 : 1;
            continue;
        }
        if (a->npos == 4) {
            return fail(
                errmsg,
                "%s: unexpected argument \"%s\" (see idalloc %s --help)", cmd,
                s, cmd);
        }
        a->pos[a->npos++] = s;
    }
    return 0;
}

/* Every flag given must be one that @cmd accepts (a bitmask below). */
enum {
    F_KIND = 1,
    F_SIZE = 2,
    F_TAG = 4,
    F_COUNT = 8,
    F_FORMAT = 16,
    F_BENCH = 32,
    F_VERBOSE = 64,
    F_TO = 128,
    F_JSON = 256, /* --json, -w json (src/client/cli_json.h) */
    F_ADVANCE = 512,
    F_REQID = 1024,
};

static int check_flags(const struct args *a,
                       unsigned allowed,
                       const char *cmd,
                       char *errmsg)
{
    struct
    {
        const char *v;
        unsigned bit;
        const char *name;
    } f[] = {{a->kind, F_KIND, "--kind"},
             {a->size, F_SIZE, "--size"},
             {a->tag, F_TAG, "--tag"},
             {a->count, F_COUNT, "--count"},
             {a->format, F_FORMAT, "--format"},
             {a->op, F_BENCH, "--op"},
             {a->pool, F_BENCH, "--pool"},
             {a->clients, F_BENCH, "--clients"},
             {a->duration, F_BENCH, "--duration"},
             {a->threads, F_BENCH, "--threads"},
             {a->to, F_TO, "--to"},
             {a->advance, F_ADVANCE, "--advance-sequences"},
             {a->reqid, F_REQID, "--request-id"}};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (f[i].v != NULL && (allowed & f[i].bit) == 0) {
            return fail(errmsg, "%s: %s does not apply", cmd, f[i].name);
        }
    }
    if (a->json && (allowed & (F_BENCH | F_JSON)) == 0) {
        return fail(errmsg, "%s: --json does not apply", cmd);
    }
    if (a->verbose && (allowed & F_VERBOSE) == 0) {
        return fail(errmsg, "%s: --verbose does not apply", cmd);
    }
    if (a->blocking && (allowed & F_BENCH) == 0) {
        return fail(errmsg, "%s: --blocking does not apply", cmd);
    }
    struct idalloc_call t;
    if (a->reqid != NULL && idalloc_call_parse(a->reqid, &t) != 0) {
        return fail(errmsg,
                    "%s: bad --request-id \"%s\" (32 hex digits, ':', a "
                    "decimal number, as printed by an earlier call)",
                    cmd, a->reqid);
    }
    return 0;
}

static int want_pos(const struct args *a, int n, const char *cmd, char *errmsg)
{
    if (a->npos != n) {
        return fail(errmsg,
                    "%s: expected %d argument%s, got %d (see "
                    "idalloc %s --help)",
                    cmd, n, n == 1 ? "" : "s", a->npos, cmd);
    }
    return 0;
}

static int need(const char *v, const char *flag, const char *cmd, char *errmsg)
{
    return v == NULL ? fail(errmsg, "%s: %s is required", cmd, flag) : 0;
}

static int parse_pool_create(struct args *a, struct ida_cli *c, char *errmsg)
{
    int rv = check_flags(a, F_KIND | F_SIZE | F_REQID, "pool create", errmsg);
    if (rv == 0 && (a->npos != 2 || strcmp(a->pos[0], "create") != 0)) {
        rv = fail(errmsg, "pool: expected \"pool create NAME --kind KIND\"");
    }
    if (rv == 0) {
        rv = need(a->kind, "--kind", "pool create", errmsg);
    }
    if (rv != 0) {
        return rv;
    }
    c->pool = a->pos[1];
    if (strcmp(a->kind, "sequence") == 0) {
        c->kind = IDALLOC_POOL_SEQUENCE;
    } else if (strcmp(a->kind, "bounded") == 0) {
        c->kind = IDALLOC_POOL_BOUNDED;
    } else if (strcmp(a->kind, "prefix") == 0) {
        c->kind = IDALLOC_POOL_PREFIX;
    } else {
        return fail(errmsg,
                    "pool create: unknown kind \"%s\" (sequence, "
                    "bounded or prefix)",
                    a->kind);
    }
    if (a->size != NULL) {
        if (parse_u64(a->size, &c->size) != 0 || c->size == 0) {
            return fail(errmsg, "pool create: bad --size \"%s\"", a->size);
        }
        c->has_size = 1;
    }
    if (c->kind == IDALLOC_POOL_BOUNDED && !c->has_size) {
        return fail(errmsg, "pool create: a bounded pool needs --size N");
    }
    if (c->kind != IDALLOC_POOL_BOUNDED && c->has_size) {
        return fail(errmsg,
                    "pool create: --size applies to bounded pools "
                    "only");
    }
    return 0;
}

static int parse_count(const char *s,
                       uint64_t max,
                       const char *cmd,
                       uint64_t *out,
                       char *errmsg)
{
    if (parse_u64(s, out) != 0 || *out == 0 || *out > max) {
        return fail(errmsg, "%s: bad --count \"%s\" (1 to %llu)", cmd, s,
                    (unsigned long long)max);
    }
    return 0;
}

static int parse_bench(struct args *a, struct ida_cli *c, char *errmsg)
{
    int rv = check_flags(a, F_BENCH | F_COUNT, "bench", errmsg);
    if (rv == 0) {
        rv = want_pos(a, 0, "bench", errmsg);
    }
    const char *req[] = {a->op, a->pool, a->clients, a->duration};
    const char *names[] = {"--op", "--pool", "--clients", "--duration"};
    for (int i = 0; rv == 0 && i < 4; i++) {
        rv = need(req[i], names[i], "bench", errmsg);
    }
    if (rv != 0) {
        return rv;
    }
    static const char *const ops[] = {"alloc", "reserve", "next", "prefix"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(a->op, ops[i]) == 0) {
            c->bench_op = (enum ida_cli_bench_op)(i + 1);
        }
    }
    if (c->bench_op == 0) {
        return fail(errmsg,
                    "bench: unknown --op \"%s\" (alloc, reserve, "
                    "next or prefix)",
                    a->op);
    }
    c->pool = a->pool;
    uint64_t v;
    if (parse_u64(a->clients, &v) != 0 || v == 0 ||
        v > IDA_CLI_BENCH_CLIENTS_MAX) {
        return fail(errmsg, "bench: bad --clients \"%s\" (1 to %d)", a->clients,
                    IDA_CLI_BENCH_CLIENTS_MAX);
    }
    c->clients = (unsigned)v;
    if (parse_u64(a->duration, &v) != 0 || v == 0 || v > 86400) {
        return fail(errmsg,
                    "bench: bad --duration \"%s\" (1 to 86400 "
                    "seconds)",
                    a->duration);
    }
    c->duration_s = (unsigned)v;
    c->bench_blocking = a->blocking;
    c->bench_threads = c->bench_blocking ? 0 : 1;
    if (a->threads != NULL && c->bench_blocking) {
        return fail(errmsg,
                    "bench: --threads does not apply with --blocking (C "
                    "threads, one blocking call each)");
    }
    if (a->threads != NULL) {
        if (parse_u64(a->threads, &v) != 0 || v == 0 ||
            v > IDA_CLI_BENCH_THREADS_MAX) {
            return fail(errmsg, "bench: bad --threads \"%s\" (1 to %d)",
                        a->threads, IDA_CLI_BENCH_THREADS_MAX);
        }
        c->bench_threads = (unsigned)v;
    }
    if (c->bench_threads > c->clients) {
        c->bench_threads = c->clients; /* at least one request each */
    }
    c->count = 1;
    if (a->count != NULL) {
        rv = parse_count(a->count, IDALLOC_RESERVE_COUNT_MAX, "bench",
                         &c->count, errmsg);
    }
    c->json = a->json;
    return rv;
}

/* Commands of the form `CMD POOL [ID] --tag TAG`. */
static int parse_tagged(struct args *a,
                        struct ida_cli *c,
                        const char *name,
                        int with_id,
                        char *errmsg)
{
    unsigned reqid = strcmp(name, "lookup") == 0 ? 0 : F_REQID;
    int rv = check_flags(a, (with_id ? F_TAG : F_TAG | F_JSON) | reqid, name,
                         errmsg);
    if (rv == 0) {
        rv = want_pos(a, with_id ? 2 : 1, name, errmsg);
    }
    if (rv == 0) {
        rv = need(a->tag, "--tag", name, errmsg);
    }
    if (rv != 0) {
        return rv;
    }
    c->pool = a->pos[0];
    c->tag = a->tag;
    if (with_id && parse_u64(a->pos[1], &c->id) != 0) {
        return fail(errmsg, "%s: bad id \"%s\"", name, a->pos[1]);
    }
    return 0;
}

static int parse_node_id(const char *s,
                         const char *cmd,
                         unsigned *out,
                         char *errmsg)
{
    uint64_t v;
    if (parse_u64(s, &v) != 0 || v == 0 || v > UINT32_MAX) {
        return fail(errmsg, "%s: bad node id \"%s\" (1 to %u)", cmd, s,
                    (unsigned)UINT32_MAX);
    }
    *out = (unsigned)v;
    return 0;
}

static int parse_member(struct args *a, struct ida_cli *c, char *errmsg)
{
    static const char *const names[] = {"member list", "member add",
                                        "member remove", "member promote",
                                        "member update"};
    const char *cmd = names[c->cmd - IDA_CLI_MEMBER_LIST];
    int rv =
        check_flags(a, c->cmd == IDA_CLI_MEMBER_LIST ? F_JSON : 0, cmd, errmsg);
    if (c->cmd == IDA_CLI_MEMBER_LIST) {
        return rv != 0 ? rv : want_pos(a, 0, cmd, errmsg);
    }
    if (rv == 0 && c->cmd == IDA_CLI_MEMBER_ADD && a->npos != 1 &&
        a->npos != 3) {
        return fail(errmsg,
                    "%s: expected 1 or 3 arguments (ID [PEER_ADDR "
                    "CLIENT_ADDR]), got %d (see idalloc %s --help)",
                    cmd, a->npos, cmd);
    }
    if (rv == 0 && c->cmd != IDA_CLI_MEMBER_ADD) {
        rv = want_pos(a, c->cmd == IDA_CLI_MEMBER_UPDATE ? 3 : 1, cmd, errmsg);
    }
    rv = rv != 0 ? rv : parse_node_id(a->pos[0], cmd, &c->node, errmsg);
    if (rv != 0 || a->npos != 3) {
        return rv;
    }
    struct ida_addr peer, client;
    for (int i = 1; i <= 2; i++) {
        struct ida_addr *x = i == 1 ? &peer : &client;
        if (ida_addr_parse(a->pos[i], x) != 0) {
            return fail(errmsg,
                        "%s: bad %s address \"%s\": expected IPv4:PORT or "
                        "[IPv6]:PORT",
                        cmd, i == 1 ? "peer" : "client", a->pos[i]);
        }
        if (ida_addr_unspecified(x)) {
            return fail(errmsg,
                        "%s: %s is not an address other nodes can dial (it "
                        "means any address); give the node's own IP",
                        cmd, a->pos[i]);
        }
    }
    if (strcmp(peer.host, client.host) == 0 && peer.port == client.port) {
        return fail(errmsg,
                    "%s: the peer and the client address are the same (%s)",
                    cmd, a->pos[1]);
    }
    c->peer_addr = a->pos[1];
    c->client_addr = a->pos[2];
    return 0;
}

static int parse_command(struct args *a, struct ida_cli *c, char *errmsg)
{
    int rv;
    c->request_id = a->reqid; /* checked by check_flags */
    switch (c->cmd) {
        case IDA_CLI_MEMBER_LIST:
        case IDA_CLI_MEMBER_ADD:
        case IDA_CLI_MEMBER_REMOVE:
        case IDA_CLI_MEMBER_PROMOTE:
        case IDA_CLI_MEMBER_UPDATE:
            return parse_member(a, c, errmsg);
        case IDA_CLI_LEADER_TRANSFER:
            rv = check_flags(a, F_TO, "leader transfer", errmsg);
            rv = rv != 0 ? rv : want_pos(a, 0, "leader transfer", errmsg);
            if (rv == 0 && a->to != NULL) {
                rv = parse_node_id(a->to, "leader transfer", &c->node, errmsg);
            }
            return rv;
        case IDA_CLI_POOL_CREATE:
            return parse_pool_create(a, c, errmsg);
        case IDA_CLI_ALLOC:
            return parse_tagged(a, c, "alloc", 0, errmsg);
        case IDA_CLI_LOOKUP:
            return parse_tagged(a, c, "lookup", 0, errmsg);
        case IDA_CLI_PREFIX:
            return parse_tagged(a, c, "prefix", 0, errmsg);
        case IDA_CLI_FREE:
            return parse_tagged(a, c, "free", 1, errmsg);
        case IDA_CLI_LIST:
            rv = check_flags(a, F_JSON, "list", errmsg);
            rv = rv != 0 ? rv : want_pos(a, 1, "list", errmsg);
            c->pool = a->pos[0];
            return rv;
        case IDA_CLI_STATUS:
            rv = check_flags(a, F_VERBOSE | F_JSON, "status", errmsg);
            c->verbose = a->verbose;
            return rv != 0 ? rv : want_pos(a, 0, "status", errmsg);
        case IDA_CLI_RESERVE:
            rv = check_flags(a, F_COUNT | F_JSON | F_REQID, "reserve", errmsg);
            rv = rv != 0 ? rv : want_pos(a, 1, "reserve", errmsg);
            rv = rv != 0 ? rv : need(a->count, "--count", "reserve", errmsg);
            c->pool = a->pos[0];
            return rv != 0 ? rv
                           : parse_count(a->count, IDALLOC_RESERVE_COUNT_MAX,
                                         "reserve", &c->count, errmsg);
        case IDA_CLI_NEXT:
            rv = check_flags(a, F_COUNT | F_FORMAT | F_JSON | F_REQID, "next",
                             errmsg);
            rv = rv != 0 ? rv : want_pos(a, 1, "next", errmsg);
            c->pool = a->pos[0];
            c->count = 1;
            if (rv == 0 && a->count != NULL) {
                rv = parse_count(a->count,
                                 a->json ? IDA_CLI_NEXT_JSON_COUNT_MAX
                                         : IDA_CLI_NEXT_COUNT_MAX,
                                 "next", &c->count, errmsg);
            }
            if (rv == 0 && a->format != NULL) {
                if (strcmp(a->format, "hex") == 0) {
                    c->hex = 1;
                } else if (strcmp(a->format, "dec") != 0) {
                    rv = fail(errmsg,
                              "next: bad --format \"%s\" (dec or "
                              "hex)",
                              a->format);
                }
            }
            return rv;
        case IDA_CLI_BENCH:
            return parse_bench(a, c, errmsg);
        case IDA_CLI_SNAPSHOT_SAVE:
        case IDA_CLI_SNAPSHOT_RESTORE: {
            const char *name = c->cmd == IDA_CLI_SNAPSHOT_SAVE
                                   ? "snapshot save"
                                   : "snapshot restore";
            /* A restore is a write: one whose outcome is unknown is
             * repeated with its request id, like the others. */
            rv = check_flags(
                a, c->cmd == IDA_CLI_SNAPSHOT_RESTORE ? F_ADVANCE | F_REQID : 0,
                name, errmsg);
            rv = rv != 0 ? rv : want_pos(a, 1, name, errmsg);
            c->file = a->pos[0];
            if (rv == 0 && a->advance != NULL &&
                parse_u64(a->advance, &c->advance) != 0) {
                rv = fail(errmsg,
                          "snapshot restore: bad --advance-sequences \"%s\" "
                          "(0 to 18446744073709551615)",
                          a->advance);
            }
            return rv;
        }
        case IDA_CLI_HELP:
        case IDA_CLI_VERSION:
            break;
    }
    return 0;
}

static int is_help(const char *s)
{
    return strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0;
}

/* Global options before the command; *at is the index of the command,
 * *done is set by --help or --version (out->cmd says which). */
static int parse_globals(int argc,
                         char **argv,
                         struct ida_cli *c,
                         char *errmsg,
                         int *at,
                         int *done)
{
    int i = 1;
    while (i < argc && argv[i][0] == '-' && argv[i][1] != '\0') {
        const char *s = argv[i];
        if (is_help(s) || strcmp(s, "--version") == 0) {
            c->cmd = is_help(s) ? IDA_CLI_HELP : IDA_CLI_VERSION;
            *done = 1;
            *at = argc;
            return 0;
        }
        const char *eq = strchr(s, '=');
        int n = eq != NULL ? (int)(eq - s) : (int)strlen(s);
        const char **slot =
            strncmp(s, "--cluster", (size_t)n) == 0 && n == 9   ? &c->cluster
            : strncmp(s, "--config", (size_t)n) == 0 && n == 8  ? &c->config
            : strncmp(s, "--tls-dir", (size_t)n) == 0 && n == 9 ? &c->tls_dir
            : strncmp(s, "--tls-client", (size_t)n) == 0 && n == 12
                ? &c->tls_client
                : NULL;
        if (slot == NULL && !(n == 9 && strncmp(s, "--timeout", 9) == 0)) {
            return fail(errmsg, "unknown option %.*s (see idalloc --help)", n,
                        s);
        }
        const char *v = eq != NULL ? eq + 1 : value_of(argc, argv, i);
        if (v == NULL) {
            return needs_value(errmsg, NULL, s, argc, argv, i);
        }
        uint64_t t;
        if (slot != NULL) {
            if (*slot != NULL) {
                return fail(errmsg, "%.*s given twice", n, s);
            }
            if (v[0] == '\0') {
                return fail(errmsg, "%.*s needs a value, not an empty string",
                            n, s);
            }
            *slot = v;
        } else {
            if (parse_u64(v, &t) != 0 || t == 0 || t > 3600000) {
                return fail(errmsg, "bad --timeout \"%s\" (1 to 3600000 ms)",
                            v);
            }
            c->timeout_ms = (unsigned)t;
        }
        i += eq != NULL ? 1 : 2;
    }
    if (c->cluster != NULL && c->config != NULL) {
        return fail(errmsg, "give --cluster or --config, not both");
    }
    *at = i;
    return 0;
}

/* `member SUB` and `leader SUB`: out->cmd, or IDA_CLI_HELP when @sub is
 * "" or --help follows (the group's usage). */
static int parse_group(const char *name,
                       const char *sub,
                       struct ida_cli *out,
                       char *errmsg)
{
    static const struct cmd_name subs[] = {
        {"member list", IDA_CLI_MEMBER_LIST},
        {"member add", IDA_CLI_MEMBER_ADD},
        {"member remove", IDA_CLI_MEMBER_REMOVE},
        {"member promote", IDA_CLI_MEMBER_PROMOTE},
        {"member update", IDA_CLI_MEMBER_UPDATE},
        {"leader transfer", IDA_CLI_LEADER_TRANSFER},
        {"snapshot save", IDA_CLI_SNAPSHOT_SAVE},
        {"snapshot restore", IDA_CLI_SNAPSHOT_RESTORE},
    };
    char full[64];
    snprintf(full, sizeof(full), "%s %s", name, sub);
    out->cmd = IDA_CLI_HELP;
    for (size_t k = 0; k < sizeof(subs) / sizeof(subs[0]); k++) {
        if (strcmp(full, subs[k].name) == 0) {
            out->cmd = subs[k].cmd;
        }
    }
    if (out->cmd == IDA_CLI_HELP && sub[0] != '\0') {
        return fail(errmsg,
                    "%s: unknown subcommand \"%s\" (see idalloc %s "
                    "--help)",
                    name, sub, name);
    }
    return 0;
}

int ida_cli_parse(int argc, char **argv, struct ida_cli *out, char *errmsg)
{
    memset(out, 0, sizeof(*out));
    errmsg[0] = '\0';
    int i = argc, done = 0;
    int rv = parse_globals(argc, argv, out, errmsg, &i, &done);
    if (rv != 0 || done) {
        return rv; /* out->cmd is IDA_CLI_HELP or IDA_CLI_VERSION */
    }
    if (i >= argc) {
        return fail(errmsg, "no command (see idalloc --help)");
    }
    const char *name = argv[i++];
    const char *sub = i < argc && argv[i][0] != '-' ? argv[i] : "";
    char full[64] = "";
    if (strcmp(name, "member") == 0 || strcmp(name, "leader") == 0 ||
        strcmp(name, "snapshot") == 0) {
        rv = parse_group(name, sub, out, errmsg);
        if (rv != 0) {
            return rv;
        }
        snprintf(full, sizeof(full), "%s %s", name, sub);
        if (out->cmd != IDA_CLI_HELP) {
            i++;
            name = full;
        } else {
            int help = 0;
            for (int k = i; k < argc; k++) {
                help |= is_help(argv[k]);
            }
            if (!help) {
                return fail(errmsg,
                            "%s: a subcommand is needed (see idalloc %s "
                            "--help)",
                            name, name);
            }
            out->help_for = strcmp(name, "member") == 0 ? IDA_CLI_MEMBER_LIST
                            : strcmp(name, "leader") == 0
                                ? IDA_CLI_LEADER_TRANSFER
                                : IDA_CLI_SNAPSHOT_SAVE;
            return 0;
        }
    } else if (strcmp(name, "pool") == 0) {
        out->cmd = IDA_CLI_POOL_CREATE;
    } else if (strcmp(name, "help") == 0) {
        out->cmd = IDA_CLI_HELP;
        return 0;
    } else {
        for (size_t k = 0; k < sizeof(commands) / sizeof(commands[0]); k++) {
            if (strcmp(name, commands[k].name) == 0) {
                out->cmd = commands[k].cmd;
            }
        }
        if (out->cmd == IDA_CLI_HELP && strcmp(name, "certs") == 0) {
            /* bin/idalloc runs `certs` only as its first word: it reads
             * no cluster and takes none of the options above. */
            return fail(errmsg,
                        "certs takes no global options: run \"idalloc "
                        "certs ...\" with certs first (see idalloc certs "
                        "--help)");
        }
        if (out->cmd == IDA_CLI_HELP) {
            return fail(errmsg, "unknown command \"%s\" (see idalloc --help)",
                        name);
        }
    }
    for (int k = i; k < argc; k++) {
        if (is_help(argv[k])) {
            out->help_for = out->cmd;
            out->cmd = IDA_CLI_HELP;
            return 0;
        }
    }
    struct args a = {0};
    rv = collect(argc, argv, i,
                 out->cmd == IDA_CLI_POOL_CREATE ? "pool create" : name, &a,
                 errmsg);
    rv = rv != 0 ? rv : parse_command(&a, out, errmsg);
    out->json = a.json;
    return rv;
}
