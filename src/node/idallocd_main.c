/* bin/idallocd: run one node of an idalloc cluster.
 *
 *   idallocd --config FILE --node ID [--data DIR]
 *
 * Config errors and a foreign data directory stop it with one line on
 * stderr (exit 2 for usage and config, 1 for storage) before anything is
 * bound. SIGINT/SIGTERM stop it cleanly (exit 0). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "idalloc_errors.h"
#include "idalloc_version.h"
#include "src/node/node.h"

static const char usage[] =
    "usage: idallocd --config FILE --node ID [--data DIR]\n"
    "                [--log-level LEVEL] [--log-format text|json]\n"
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
    "  --config FILE  the cluster file (required)\n"
    "  --node ID      this node's id in the cluster file (required)\n"
    "  --data DIR     keep data in DIR/nodeID instead of data_dir/nodeID\n"
    "  --log-level LEVEL   debug, info, warn or error: overrides the cluster\n"
    "                 file's log_level\n"
    "  --log-format text|json   text (default): one line per event;\n"
    "                 json: one JSON object per line with the same fields\n"
    "                 (ts, level, node, msg)\n"
    "  -h, --help     this text\n"
    "  --version      print the version\n"
    "\n"
    "SIGINT or SIGTERM: stop accepting requests, finish the storage step in\n"
    "flight, close the data files, exit 0. Exit 2: bad usage, cluster file\n"
    "or TLS files (its tls_dir: ca.crt, nodeID.crt, nodeID.key); 1: the data\n"
    "directory cannot be used (foreign, newer format,\n"
    "I/O error) or the addresses cannot be bound.\n";

/* --log-level and --log-format (applied once the cluster file is read). */
static int log_level_set = 0;
static enum ida_log_level log_level_arg;

static int parse_args(int argc, char **argv, struct ida_node_opts *o)
{
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--version") == 0) {
            printf("idallocd %s\n", IDALLOC_VERSION);
            exit(0);
        }
        if (strcmp(a, "--config") != 0 && strcmp(a, "--data") != 0 &&
            strcmp(a, "--node") != 0 && strcmp(a, "--log-level") != 0 &&
            strcmp(a, "--log-format") != 0) {
            fprintf(stderr, "idallocd: unknown option %s (see --help)\n", a);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "idallocd: %s needs a value (see --help)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--config") == 0) {
            o->config_path = v;
        } else if (strcmp(a, "--data") == 0) {
            o->data_dir = v;
        } else if (strcmp(a, "--log-level") == 0) {
            if (ida_log_level_parse(v, &log_level_arg) != 0) {
                fprintf(stderr,
                        "idallocd: bad --log-level \"%s\" (debug, info, "
                        "warn or error)\n",
                        v);
                return -1;
            }
            log_level_set = 1;
        } else if (strcmp(a, "--log-format") == 0) {
            if (strcmp(v, "json") != 0 && strcmp(v, "text") != 0) {
                fprintf(stderr,
                        "idallocd: bad --log-format \"%s\" (text or "
                        "json)\n",
                        v);
                return -1;
            }
            ida_log_set_json(strcmp(v, "json") == 0);
        } else if (strcmp(a, "--node") == 0) {
            char *end;
            unsigned long id = strtoul(v, &end, 10);
            if (*v == '\0' || *end != '\0' || id == 0 || id > 65535) {
                fprintf(stderr, "idallocd: bad --node \"%s\"\n", v);
                return -1;
            }
            o->node_id = (unsigned)id;
        }
    }
    if (o->config_path == NULL || o->node_id == 0) {
        fprintf(stderr,
                "idallocd: --config and --node are required (see "
                "--help)\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct ida_node_opts o;
    if (parse_args(argc, argv, &o) != 0) {
        return 2;
    }
    /* Every thread inherits this mask; only main takes the signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    static struct ida_node node;
    char err[IDA_ERRMSG_MAX] = "";
    int rv = ida_node_open(&node, &o, err);
    if (rv != 0) {
        fprintf(stderr, "idallocd: %s\n", err);
        return rv == IDA_ECONFIG || rv == IDA_EINVAL ? 2 : 1;
    }
    if (log_level_set) {
        ida_log_set_level(log_level_arg); /* over the cluster file's */
    }
    rv = ida_node_start(&node, err);
    if (rv != 0) {
        fprintf(stderr, "idallocd: %s\n", err);
        return 1;
    }
    int sig = 0;
    sigwait(&set, &sig);
    IDA_INFO("node: signal %d: stopping", sig);
    ida_node_close(&node);
    IDA_INFO("node: stopped");
    return 0;
}
