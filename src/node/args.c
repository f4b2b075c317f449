#include "src/node/args.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

const char ida_node_usage[] =
    "usage: idallocd --config FILE --node ID [--data DIR]\n"
    "                [--peer ADDR --client ADDR] [--metrics ADDR]\n"
    "                [--join ADDR,ADDR,... | --single-node]\n"
    "                [--log-level LEVEL] [--log-format text|json]\n"
    "       idallocd --config FILE --node ID [--data DIR] --export-backup OUT\n"
    "       idallocd --config FILE --node ID [--data DIR] --import-backup "
    "FILE\n"
    "                [--advance-sequences N]\n"
    "       idallocd -h|--help | --version\n"
    "\n"
    "Run node ID of the cluster described by FILE (see README.md, \"Cluster\n"
    "file\"). The node keeps its Raft log, hard state and snapshots in\n"
    "DATA/nodeID, where DATA is the cluster file's data_dir unless --data\n"
    "is given. The cluster file also sets the client port's limits\n"
    "(client_connections_max, client_idle_timeout_ms, ...); at start the\n"
    "node raises its soft descriptor limit (RLIMIT_NOFILE) to the hard one.\n"
    "Logs go to stderr, one line per event.\n"
    "\n"
    "  --config FILE  the cluster file (required): the cluster's name, TLS\n"
    "                 and settings; its node lines are the first membership\n"
    "                 and where the other nodes are until the membership\n"
    "                 says otherwise\n"
    "  --node ID      this node's id (required)\n"
    "  --data DIR     keep data in DIR/nodeID instead of data_dir/nodeID\n"
    "  --peer ADDR --client ADDR   where this node listens (peers, clients),\n"
    "                 over its line of the cluster file; required when the\n"
    "                 file has no line for ID. A node restarted on new\n"
    "                 addresses with its data directory is reached there\n"
    "                 once `idalloc member update ID PEER CLIENT` committed\n"
    "  --metrics ADDR serve /metrics and /healthz there (over the file's\n"
    "                 metrics=)\n"
    "  --join ADDR,ADDR,...   client addresses of running members: a node\n"
    "                 whose data directory is new asks them for the\n"
    "                 membership (retrying every second until one answers),\n"
    "                 never creates a cluster, and waits to be added by\n"
    "                 `idalloc member add ID PEER CLIENT` (as a learner;\n"
    "                 promoted once caught up with auto_rejoin on). Its\n"
    "                 certificate (tls_dir/nodeID.crt) must exist: idalloc\n"
    "                 certs add DIR --node ID. Ignored when the data\n"
    "                 directory already holds a membership\n"
    "  --single-node  the cluster file names this node alone: at the first\n"
    "                 start of a new data directory, create the cluster of\n"
    "                 this one node at once (with no other node to ask, a\n"
    "                 node whose whole directory was lost then starts over\n"
    "                 empty and hands out ids again: for development, or\n"
    "                 the first start only). Without it a one-node file\n"
    "                 waits, like any first start, for nodes to hear from;\n"
    "                 ignored when the directory already holds a membership\n"
    "  --export-backup OUT   do not run the node: write what its (stopped)\n"
    "                 data directory holds, its snapshot and every entry of\n"
    "                 its log, as a backup file OUT for `idalloc snapshot\n"
    "                 restore` into a new cluster. The forced recovery after\n"
    "                 losing a majority (README, Runbook); prints the state's\n"
    "                 index and term (export every survivor, restore the one\n"
    "                 with the highest term, then index)\n"
    "  --import-backup FILE   do not run the node: write a new data\n"
    "                 directory for it that holds the backup FILE's pools\n"
    "                 as a cluster of this node alone, then exit. Started,\n"
    "                 it waits until every other node of the cluster file\n"
    "                 answers that its directory is new, then leads; those\n"
    "                 nodes join it (added and promoted by auto_rejoin, or\n"
    "                 by idalloc member add and promote) and receive the\n"
    "                 state by InstallSnapshot: the way to seed a new\n"
    "                 cluster from a backup of any size (`snapshot restore`\n"
    "                 takes at most 4 MiB). Import one node only. Refused\n"
    "                 when the node's directory exists and is not empty, or\n"
    "                 when the backup was taken from a cluster of the name\n"
    "                 the cluster file gives\n"
    "  --advance-sequences N   with --import-backup: move every sequence\n"
    "                 pool N ids on (default 0), past what the old cluster\n"
    "                 handed out after the backup\n"
    "  --log-level LEVEL   debug, info, warn or error: overrides the cluster\n"
    "                 file's log_level\n"
    "  --log-format text|json   text (default): one line per event;\n"
    "                 json: one JSON object per line with the same fields\n"
    "                 (ts, level, node, msg)\n"
    "  -h, --help     this text\n"
    "  --version      print the version\n"
    "Values may also follow an `=` (--data=DIR); that is the only way to\n"
    "give a value that starts with `-`.\n"
    "\n"
    "SIGINT or SIGTERM: stop accepting requests, finish the storage step in\n"
    "flight, close the data files, exit 0. Exit 2: bad usage, cluster file\n"
    "or TLS files (its tls_dir: ca.crt, nodeID.crt, nodeID.key); 1: the data\n"
    "directory cannot be used (foreign, newer format, lost or untrusted\n"
    "state, I/O error), the addresses cannot be bound, or --join found\n"
    "this node's address in use by a member; also 1 when the node stops\n"
    "itself because its peers showed that its data directory went back to\n"
    "an older copy (it marks the directory untrusted: remove it to rejoin\n"
    "as a new incarnation, README Runbook).\n";

static enum ida_node_args_result bad(char *errmsg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static enum ida_node_args_result bad(char *errmsg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, IDA_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    return IDA_NODE_ARGS_BAD;
}

enum ida_node_args_result ida_node_args_parse(int argc,
                                              char **argv,
                                              struct ida_node_opts *o,
                                              char *errmsg)
{
    static const char *const names[] = {
        "--config",        "--node",          "--data",
        "--log-level",     "--log-format",    "--peer",
        "--client",        "--metrics",       "--join",
        "--export-backup", "--import-backup", "--advance-sequences"};
    enum { NAMES = 12 };
    const char *vals[NAMES] = {NULL};
    memset(o, 0, sizeof(*o));
    errmsg[0] = '\0';
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--single-node") == 0) {
            o->single_node = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            return IDA_NODE_ARGS_HELP;
        }
        if (strcmp(a, "--version") == 0) {
            return IDA_NODE_ARGS_VERSION;
        }
        const char *eq = strchr(a, '=');
        size_t n = eq != NULL ? (size_t)(eq - a) : strlen(a);
        int k = 0;
        while (k < NAMES &&
               (strlen(names[k]) != n || strncmp(a, names[k], n))) {
            k++;
        }
        if (k == NAMES) {
            return bad(errmsg, "unknown option %.*s (see --help)", (int)n, a);
        }
        const char *v;
        if (eq != NULL) {
            v = eq + 1;
        } else if (i + 1 < argc && argv[i + 1][0] != '-') {
            v = argv[++i];
        } else {
            return bad(errmsg, "%s needs a value%s%s (see --help)", names[k],
                       i + 1 < argc ? ", not the option " : "",
                       i + 1 < argc ? argv[i + 1] : "");
        }
        if (vals[k] != NULL) {
            return bad(errmsg, "%s given twice", names[k]);
        }
        if (v[0] == '\0') {
            return bad(errmsg, "%s needs a value, not an empty string%s",
                       names[k],
                       k == 2 ? " (the node's files would go to /nodeID)" : "");
        }
        vals[k] = v;
    }
    if (vals[0] == NULL || vals[1] == NULL) {
        return bad(errmsg, "--config and --node are required (see --help)");
    }
    unsigned long id = 0;
    const char *s = vals[1];
    for (; *s >= '0' && *s <= '9' && id <= 65535; s++) {
        id = id * 10 + (unsigned long)(*s - '0');
    }
    if (*s != '\0' || id == 0 || id > 65535) {
        return bad(errmsg, "bad --node \"%s\": expected a number in [1, 65535]",
                   vals[1]);
    }
    if (vals[3] != NULL) {
        if (ida_log_level_parse(vals[3], &o->log_level) != 0) {
            return bad(errmsg,
                       "bad --log-level \"%s\" (debug, info, warn or error)",
                       vals[3]);
        }
        o->has_log_level = 1;
    }
    if (vals[4] != NULL) {
        if (strcmp(vals[4], "json") != 0 && strcmp(vals[4], "text") != 0) {
            return bad(errmsg, "bad --log-format \"%s\" (text or json)",
                       vals[4]);
        }
        o->log_json = strcmp(vals[4], "json") == 0;
    }
    if ((vals[5] == NULL) != (vals[6] == NULL)) {
        return bad(errmsg, "--peer and --client go together (see --help)");
    }
    struct ida_addr a;
    for (int k = 5; k <= 7; k++) {
        if (vals[k] != NULL && ida_addr_parse(vals[k], &a) != 0) {
            return bad(errmsg,
                       "bad %s \"%s\": expected IPv4:PORT or [IPv6]:PORT",
                       names[k], vals[k]);
        }
    }
    if (vals[8] != NULL) {
        char one[IDA_ADDR_TEXT_MAX];
        for (const char *p = vals[8];;) {
            size_t len = strcspn(p, ",");
            if (len == 0 || len >= sizeof(one)) {
                return bad(errmsg,
                           "bad --join \"%s\": expected client addresses "
                           "ADDR,ADDR,...",
                           vals[8]);
            }
            memcpy(one, p, len);
            one[len] = '\0';
            if (ida_addr_parse(one, &a) != 0) {
                return bad(errmsg,
                           "bad --join address \"%s\": expected IPv4:PORT "
                           "or [IPv6]:PORT",
                           one);
            }
            if (p[len] == '\0') {
                break;
            }
            p += len + 1;
        }
    }
    o->config_path = vals[0];
    o->node_id = (unsigned)id;
    o->data_dir = vals[2];
    o->peer_addr = vals[5];
    o->client_addr = vals[6];
    o->metrics_addr = vals[7];
    o->join = vals[8];
    o->export_backup = vals[9];
    if (o->export_backup != NULL &&
        (o->join != NULL || o->peer_addr != NULL || o->metrics_addr != NULL)) {
        return bad(errmsg,
                   "--export-backup reads a stopped node's directory: it "
                   "takes no --join, --peer, --client or --metrics");
    }
    if (o->single_node && (o->join != NULL || o->export_backup != NULL)) {
        return bad(errmsg, o->join != NULL
                               ? "--single-node creates a cluster and --join "
                                 "joins one: give one of them"
                               : "--export-backup takes no --single-node");
    }
    o->import_backup = vals[10];
    if (o->import_backup != NULL &&
        (o->export_backup != NULL || o->join != NULL || o->single_node ||
         o->peer_addr != NULL || o->metrics_addr != NULL)) {
        return bad(errmsg,
                   "--import-backup writes a new data directory and exits: "
                   "it takes no --export-backup, --join, --single-node, "
                   "--peer, --client or --metrics");
    }
    if (vals[11] != NULL) {
        if (o->import_backup == NULL) {
            return bad(errmsg, "--advance-sequences goes with --import-backup");
        }
        uint64_t v = 0;
        const char *d = vals[11];
        for (; *d >= '0' && *d <= '9'; d++) {
            uint64_t digit = (uint64_t)(*d - '0');
            if (v > (UINT64_MAX - digit) / 10) {
                break;
            }
            v = v * 10 + digit;
        }
        if (*d != '\0') {
            return bad(errmsg,
                       "bad --advance-sequences \"%s\": expected a number "
                       "of ids in [0, 2^64)",
                       vals[11]);
        }
        o->advance_sequences = v;
    }
    return IDA_NODE_ARGS_RUN;
}
