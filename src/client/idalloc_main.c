/* bin/idalloc: the command line client (DESIGN.md, "CLI"). Results on
 * stdout, one-line errors on stderr, exit codes 0/1/2/3 as documented in
 * `idalloc --help`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/heap.h"
#include "idalloc.h"
#include "src/client/bench.h"
#include "src/client/cli.h"
#include "src/client/cli_backup.h"
#include "src/client/cli_certs.h"
#include "src/client/cli_json.h"
#include "src/client/client.h"

/* One call of this run: its request id (--request-id, or a fresh one) and
 * error detail. */
static struct idalloc_call call;

static int report_error(const char *what, int rv)
{
    const char *detail = call.errmsg;
    if (rv == IDA_EUNAVAIL && detail[0] != '\0') {
        /* The detail says it all: whether anything was sent, and why. */
        fprintf(stderr, "idalloc: %s: %s\n", what, detail);
    } else if (detail[0] != '\0' && strcmp(detail, idalloc_strerror(rv)) != 0) {
        fprintf(stderr, "idalloc: %s: %s (%s)\n", what, idalloc_strerror(rv),
                detail);
    } else {
        fprintf(stderr, "idalloc: %s: %s\n", what, idalloc_strerror(rv));
    }
    char id[IDALLOC_CALL_ID_TEXT_MAX];
    if (call.state == IDALLOC_CALL_UNKNOWN &&
        idalloc_call_format(&call, id) == 0) {
        fprintf(stderr,
                "idalloc: %s: request id %s: repeat the same command with "
                "--request-id %s to learn its outcome (exactly once)\n",
                what, id, id);
    }
    return idalloc_exit_code(rv);
}

static int cmd_list(struct idalloc_client *c, const char *pool)
{
    int has_after = 0, more = 1;
    uint64_t after = 0;
    while (more) {
        struct idalloc_holding *h;
        size_t n;
        int rv =
            idalloc_list(c, pool, has_after, after, 0, &h, &n, &more, &call);
        if (rv != 0) {
            return report_error("list", rv);
        }
        for (size_t i = 0; i < n; i++) {
            /* One line per holding, whatever the tag holds. */
            char tag[4 * IDA_CLIENT_TAG_BYTES_MAX + 1];
            if (strlen(h[i].tag) > IDA_CLIENT_TAG_BYTES_MAX) {
                idalloc_holdings_free(h, n);
                return report_error("list", IDA_EPROTO);
            }
            ida_cli_escape(h[i].tag, tag);
            printf("%llu %s\n", (unsigned long long)h[i].id, tag);
        }
        if (n > 0) {
            after = h[n - 1].id;
            has_after = 1;
        } else {
            more = 0; /* an empty page ends the walk whatever it says */
        }
        idalloc_holdings_free(h, n);
    }
    return 0;
}

/* Exactly K ids in one reserve: taking them through idalloc_next() would
 * reserve whole blocks and throw the rest away when the process exits. */
static int cmd_next(struct idalloc_client *c, const struct ida_cli *cli)
{
    uint64_t first;
    int rv = idalloc_reserve(c, cli->pool, cli->count, &first, &call);
    if (rv != 0) {
        return report_error("next", rv);
    }
    for (uint64_t id = first; id < first + cli->count; id++) {
        if (cli->hex) {
            char buf[IDALLOC_HEX_ID_LEN + 1];
            idalloc_format_hex(id, buf);
            puts(buf);
        } else {
            printf("%llu\n", (unsigned long long)id);
        }
    }
    return 0;
}

static void print_details(const struct idalloc_node_status *s)
{
    for (size_t k = 0; k < s->n_peers; k++) {
        printf("  peer=%u match=%llu next=%llu state=%s connected=%s\n",
               s->peers[k].node_id, (unsigned long long)s->peers[k].match_index,
               (unsigned long long)s->peers[k].next_index, s->peers[k].state,
               s->peers[k].connected ? "yes" : "no");
    }
    for (size_t k = 0; k < s->n_errors; k++) {
        time_t t = (time_t)(s->errors[k].last_seen_unix_ms / 1000);
        struct tm tm;
        char when[32];
        gmtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        printf("  error=%s count=%llu last_seen=%s text=\"%s\"\n",
               idalloc_errname(s->errors[k].code),
               (unsigned long long)s->errors[k].count, when, s->errors[k].text);
    }
}

/* Exit 0: a leader is known and every node answered; 1: a leader serves
 * but some node did not answer; 3: no leader reachable. The node count can
 * grow while asking: answers name every member. */
static int cmd_status(struct idalloc_client *c, int verbose)
{
    int answered = 0, missing = 0, leader = 0, last = 0;
    for (size_t i = 0; i < idalloc_node_count(c); i++) {
        struct idalloc_node_status s;
        int rv = idalloc_node_status(c, i, &s, &call);
        if (rv != 0) {
            printf("node=? addr=%s error=\"%s\"\n", s.address,
                   rv == IDA_EUNAVAIL || rv == IDA_ECLOSED
                       ? "unreachable"
                       : idalloc_strerror(rv));
            last = rv;
            missing++;
            continue;
        }
        answered++;
        leader |= strcmp(s.role, "leader") == 0;
        printf(
            "node=%u addr=%s role=%s term=%llu commit=%llu applied=%llu "
            "leader=%u log=%llu..%llu snapshot=%llu\n",
            s.node_id, s.address, s.role, (unsigned long long)s.term,
            (unsigned long long)s.commit_index,
            (unsigned long long)s.applied_index, s.leader_id,
            (unsigned long long)s.log_first_index,
            (unsigned long long)s.log_last_index,
            (unsigned long long)s.snapshot_index);
        if (verbose) {
            print_details(&s);
        }
    }
    if (answered == 0) {
        fprintf(stderr,
                "idalloc: status: no node answered (last: %s); is the "
                "cluster running at these addresses? (`make run` starts the "
                "local one)\n",
                call.errmsg);
        return idalloc_exit_code(last) == 3 ? 3 : idalloc_exit_code(last);
    }
    if (!leader) {
        fprintf(stderr,
                "idalloc: status: no leader among the nodes that answered "
                "(an election may be under way, or a majority is down); "
                "try again\n");
        return 3;
    }
    if (missing > 0) {
        fprintf(stderr,
                "idalloc: status: %d node(s) did not answer; the leader "
                "serves without them\n",
                missing);
        return 1;
    }
    return 0;
}

static int cmd_member_list(struct idalloc_client *c)
{
    struct idalloc_member_list *l = ida_malloc(sizeof(*l));
    if (l == NULL) {
        return report_error("member list", IDA_ENOMEM);
    }
    int rv = idalloc_member_list(c, l, &call);
    if (rv != 0) {
        ida_free(l);
        return report_error("member list", rv);
    }
    for (size_t i = 0; i < l->n; i++) {
        const struct idalloc_member *m = &l->members[i];
        printf(
            "id=%u role=%s incarnation=%016llx match=%llu connected=%s "
            "peer=%s client=%s%s\n",
            m->id,
            m->waiting ? "waiting"
            : m->voter ? "voter"
                       : "learner",
            (unsigned long long)m->incarnation,
            (unsigned long long)m->match_index, m->connected ? "yes" : "no",
            m->peer_addr, m->client_addr,
            m->id == l->leader_id && !m->waiting ? " leader" : "");
    }
    ida_free(l);
    return 0;
}

static int cmd_member_change(struct idalloc_client *c,
                             const struct ida_cli *cli)
{
    static const char *const what[] = {"member add", "member remove",
                                       "member promote", "member update"};
    static const char *const done[] = {"added", "removed", "promoted",
                                       "updated"};
    static const char *const already[] = {"already a member", "not a member",
                                          "already a voter",
                                          "already at these addresses"};
    enum idalloc_member_op op =
        cli->cmd == IDA_CLI_MEMBER_ADD       ? IDALLOC_MEMBER_ADD
        : cli->cmd == IDA_CLI_MEMBER_REMOVE  ? IDALLOC_MEMBER_REMOVE
        : cli->cmd == IDA_CLI_MEMBER_PROMOTE ? IDALLOC_MEMBER_PROMOTE
                                             : IDALLOC_MEMBER_UPDATE;
    int k = cli->cmd == IDA_CLI_MEMBER_ADD       ? 0
            : cli->cmd == IDA_CLI_MEMBER_REMOVE  ? 1
            : cli->cmd == IDA_CLI_MEMBER_PROMOTE ? 2
                                                 : 3;
    int changed = 0;
    int rv =
        cli->peer_addr != NULL
            ? idalloc_member_change_addrs(c, op, cli->node, cli->peer_addr,
                                          cli->client_addr, &changed, &call)
            : idalloc_member_change(c, op, cli->node, &changed, &call);
    if (rv != 0) {
        return report_error(what[k], rv);
    }
    puts(changed ? done[k] : already[k]);
    return 0;
}

static int run(struct idalloc_client *c,
               const struct idalloc_options *opts,
               const struct ida_cli *cli)
{
    uint64_t id, first;
    int flag = 0, rv = 0;
    uint8_t prefix[9];
    size_t plen;
    switch (cli->cmd) {
        case IDA_CLI_POOL_CREATE:
            rv = idalloc_pool_create(c, cli->pool, cli->kind, cli->size, &flag,
                                     &call);
            if (rv == 0) {
                puts(flag ? "created" : "exists");
            } else if (rv == IDA_EPOOLEXISTS) {
                fprintf(stderr,
                        "idalloc: pool create: pool \"%s\" already exists "
                        "with another kind or size; pick another name\n",
                        cli->pool);
                return idalloc_exit_code(rv);
            }
            return rv != 0 ? report_error("pool create", rv) : 0;
        case IDA_CLI_ALLOC:
        case IDA_CLI_LOOKUP:
            rv = cli->cmd == IDA_CLI_ALLOC
                     ? idalloc_alloc(c, cli->pool, cli->tag, &id, NULL, &call)
                     : idalloc_lookup(c, cli->pool, cli->tag, &id, &call);
            if (rv == 0) {
                printf("%llu\n", (unsigned long long)id);
            }
            return rv != 0
                       ? report_error(
                             cli->cmd == IDA_CLI_ALLOC ? "alloc" : "lookup", rv)
                       : 0;
        case IDA_CLI_FREE:
            rv = idalloc_free(c, cli->pool, cli->id, cli->tag, &flag, &call);
            if (rv == 0) {
                puts(flag ? "freed" : "already free");
            }
            return rv != 0 ? report_error("free", rv) : 0;
        case IDA_CLI_LIST:
            return cmd_list(c, cli->pool);
        case IDA_CLI_RESERVE:
            rv = idalloc_reserve(c, cli->pool, cli->count, &first, &call);
            if (rv == 0) {
                printf("%llu %llu\n", (unsigned long long)first,
                       (unsigned long long)(first + cli->count - 1));
            }
            return rv != 0 ? report_error("reserve", rv) : 0;
        case IDA_CLI_NEXT:
            return cmd_next(c, cli);
        case IDA_CLI_PREFIX:
            rv = idalloc_prefix(c, cli->pool, cli->tag, prefix, &plen, NULL,
                                &call);
            if (rv == 0) {
                for (size_t i = 0; i < plen; i++) {
                    printf("%02x", prefix[i]);
                }
                putchar('\n');
            }
            return rv != 0 ? report_error("prefix", rv) : 0;
        case IDA_CLI_STATUS:
            return cmd_status(c, cli->verbose);
        case IDA_CLI_BENCH:
            rv = ida_bench_run(c, opts, cli);
            return rv != 0 ? idalloc_exit_code(rv) : 0;
        case IDA_CLI_MEMBER_LIST:
            return cmd_member_list(c);
        case IDA_CLI_MEMBER_ADD:
        case IDA_CLI_MEMBER_REMOVE:
        case IDA_CLI_MEMBER_PROMOTE:
        case IDA_CLI_MEMBER_UPDATE:
            return cmd_member_change(c, cli);
        case IDA_CLI_LEADER_TRANSFER: {
            unsigned leader = 0;
            rv = idalloc_leader_transfer(c, cli->node, &leader, &call);
            if (rv == 0) {
                printf("leader=%u\n", leader);
            }
            return rv != 0 ? report_error("leader transfer", rv) : 0;
        }
        case IDA_CLI_SNAPSHOT_SAVE:
        case IDA_CLI_SNAPSHOT_RESTORE:
            return ida_cli_snapshot_run(c, cli, &call);
        case IDA_CLI_HELP:
        case IDA_CLI_VERSION:
            break;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct ida_cli cli;
    char err[IDALLOC_ERRMSG_MAX];
    if (argc >= 2 && strcmp(argv[1], "certs") == 0) {
        return ida_certs_main(argc - 1, argv + 1); /* no cluster needed */
    }
    if (ida_cli_parse(argc, argv, &cli, err) != 0) {
        fprintf(stderr, "idalloc: %s\n", err);
        return 2; /* usage */
    }
    if (cli.cmd == IDA_CLI_HELP) {
        fputs(ida_cli_usage(cli.help_for), stdout);
        return 0;
    }
    if (cli.cmd == IDA_CLI_VERSION) {
        printf("idalloc %s\n", idalloc_version());
        return 0;
    }
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.config_path = cli.config;
    o.addresses = cli.cluster;
    if (o.addresses == NULL && o.config_path == NULL) {
        o.addresses = getenv("IDALLOC_CLUSTER");
        if (o.addresses == NULL || o.addresses[0] == '\0') {
            o.addresses = IDA_CLI_DEFAULT_CLUSTER;
        }
    }
    char ca[1100], crt[1100], key[1100];
    const char *tls_dir = cli.tls_dir, *tls_client = cli.tls_client;
    if (tls_dir == NULL) {
        tls_dir = getenv("IDALLOC_TLS_DIR");
    }
    if (tls_client == NULL) {
        tls_client = getenv("IDALLOC_TLS_CLIENT");
    }
    if (tls_client != NULL && tls_client[0] != '\0' &&
        (tls_dir == NULL || tls_dir[0] == '\0')) {
        fprintf(stderr,
                "idalloc: --tls-client needs --tls-dir DIR (or "
                "$IDALLOC_TLS_DIR)\n");
        return 2;
    }
    if (tls_dir != NULL && tls_dir[0] != '\0') {
        snprintf(ca, sizeof(ca), "%s/ca.crt", tls_dir);
        o.tls_ca_file = ca;
        if (tls_client != NULL && tls_client[0] != '\0') {
            snprintf(crt, sizeof(crt), "%s/%s.crt", tls_dir, tls_client);
            snprintf(key, sizeof(key), "%s/%s.key", tls_dir, tls_client);
            o.tls_cert_file = crt;
            o.tls_key_file = key;
        }
    }
    if (cli.timeout_ms != 0) {
        o.call_timeout_ms = cli.timeout_ms;
        if (o.attempt_timeout_ms > cli.timeout_ms) {
            o.attempt_timeout_ms = cli.timeout_ms;
        }
    }
    idalloc_call_init(&call);
    if (cli.request_id != NULL &&
        idalloc_call_parse(cli.request_id, &call) != 0) {
        fprintf(stderr, "idalloc: bad --request-id \"%s\"\n", cli.request_id);
        return 2; /* ida_cli_parse() checked it already */
    }
    struct idalloc_client *c;
    int rv = idalloc_client_new(&o, &c, err);
    if (rv != 0) {
        fprintf(stderr, "idalloc: %s\n",
                err[0] != '\0' ? err : idalloc_strerror(rv));
        return rv == IDA_EINVAL || rv == IDA_ECONFIG || rv == IDA_EIO ? 2 : 3;
    }
    int code = cli.json && cli.cmd != IDA_CLI_BENCH
                   ? ida_cli_json_run(c, &cli, &call)
                   : run(c, &o, &cli);
    fflush(stdout);
    idalloc_client_free(c);
    return code;
}
