/* Fuzz the command line parsers of both programs: idalloc's
 * (src/client/cli.h) and, for inputs that start with "idallocd" and a NUL
 * byte, idallocd's (src/node/args.h).
 *
 * The input is split at NUL bytes into arguments. Checked: the result is
 * success or a usage error with a message; a parsed command has what its
 * command needs (a pool, a tag, counts and ids within their limits, no
 * empty value), and every pointer it holds points into argv. */
#include <string.h>

#include "idalloc_errors.h"
#include "src/client/cli.h"
#include "src/node/args.h"
#include "tests/fuzz/fuzz.h"

#define ARGS_MAX 24

/* @p is an argument, or the part of one after its `=`. */
static int in_argv(const char *p, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (p == argv[i] ||
            (p > argv[i] && p <= argv[i] + strlen(argv[i]) && p[-1] == '=')) {
            return 1;
        }
    }
    return 0;
}

static void daemon_args(int argc, char **argv)
{
    struct ida_node_opts o;
    char err[IDA_ERRMSG_MAX];
    enum ida_node_args_result r = ida_node_args_parse(argc, argv, &o, err);
    FUZZ_CHECK(r >= IDA_NODE_ARGS_RUN && r <= IDA_NODE_ARGS_BAD);
    if (r == IDA_NODE_ARGS_BAD) {
        FUZZ_CHECK(err[0] != '\0' && strlen(err) < sizeof(err));
    }
    if (r != IDA_NODE_ARGS_RUN) {
        return;
    }
    FUZZ_CHECK(o.config_path != NULL && o.config_path[0] != '\0');
    FUZZ_CHECK(in_argv(o.config_path, argc, argv));
    FUZZ_CHECK(o.node_id >= 1 && o.node_id <= 65535);
    FUZZ_CHECK(o.data_dir == NULL ||
               (o.data_dir[0] != '\0' && in_argv(o.data_dir, argc, argv)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) {
        return 0;
    }
    static char buf[4097];
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[ARGS_MAX + 2];
    int argc = 0;
    size_t at = 0;
    int daemon = size >= 9 && memcmp(buf, "idallocd", 9) == 0;
    argv[argc++] = daemon ? buf : "idalloc";
    at = daemon ? 9 : 0;
    while (at <= size && argc <= ARGS_MAX) {
        argv[argc++] = buf + at;
        at += strlen(buf + at) + 1;
    }
    argv[argc] = NULL;
    if (daemon) {
        daemon_args(argc, argv);
        return 0;
    }

    struct ida_cli c;
    char err[IDALLOC_ERRMSG_MAX];
    int rv = ida_cli_parse(argc, argv, &c, err);
    if (rv != 0) {
        FUZZ_CHECK(rv == IDA_EINVAL);
        FUZZ_CHECK(err[0] != '\0' && strlen(err) < sizeof(err));
        return 0;
    }
    /* --help and --version end the parse where they stand. */
    FUZZ_CHECK(c.cmd == IDA_CLI_HELP || c.cmd == IDA_CLI_VERSION ||
               c.cluster == NULL || c.config == NULL);
    FUZZ_CHECK(c.cluster == NULL ||
               (c.cluster[0] != '\0' && in_argv(c.cluster, argc, argv)));
    FUZZ_CHECK(c.config == NULL ||
               (c.config[0] != '\0' && in_argv(c.config, argc, argv)));
    FUZZ_CHECK(c.timeout_ms <= 3600000);
    FUZZ_CHECK(ida_cli_usage(c.cmd) != NULL);
    FUZZ_CHECK(ida_cli_usage(c.help_for) != NULL);
    switch (c.cmd) {
        case IDA_CLI_POOL_CREATE:
            FUZZ_CHECK(c.pool != NULL && in_argv(c.pool, argc, argv));
            FUZZ_CHECK(c.kind >= IDALLOC_POOL_SEQUENCE &&
                       c.kind <= IDALLOC_POOL_PREFIX);
            FUZZ_CHECK((c.kind == IDALLOC_POOL_BOUNDED) == (c.has_size != 0));
            FUZZ_CHECK(!c.has_size || c.size >= 1);
            break;
        case IDA_CLI_ALLOC:
        case IDA_CLI_FREE:
        case IDA_CLI_LOOKUP:
        case IDA_CLI_PREFIX:
            FUZZ_CHECK(c.pool != NULL && in_argv(c.pool, argc, argv));
            FUZZ_CHECK(c.tag != NULL && in_argv(c.tag, argc, argv));
            break;
        case IDA_CLI_LIST:
            FUZZ_CHECK(c.pool != NULL && in_argv(c.pool, argc, argv));
            break;
        case IDA_CLI_RESERVE:
            FUZZ_CHECK(c.pool != NULL);
            FUZZ_CHECK(c.count >= 1 && c.count <= IDALLOC_RESERVE_COUNT_MAX);
            break;
        case IDA_CLI_NEXT:
            FUZZ_CHECK(c.pool != NULL);
            FUZZ_CHECK(c.count >= 1 && c.count <= IDA_CLI_NEXT_COUNT_MAX);
            break;
        case IDA_CLI_BENCH:
            FUZZ_CHECK(c.pool != NULL);
            FUZZ_CHECK(c.bench_op >= IDA_BENCH_ALLOC &&
                       c.bench_op <= IDA_BENCH_PREFIX);
            FUZZ_CHECK(c.clients >= 1 &&
                       c.clients <= IDA_CLI_BENCH_CLIENTS_MAX);
            FUZZ_CHECK(c.duration_s >= 1 && c.duration_s <= 86400);
            FUZZ_CHECK(c.count >= 1 && c.count <= IDALLOC_RESERVE_COUNT_MAX);
            break;
        case IDA_CLI_MEMBER_ADD:
        case IDA_CLI_MEMBER_REMOVE:
        case IDA_CLI_MEMBER_PROMOTE:
            FUZZ_CHECK(c.node >= 1);
            FUZZ_CHECK((c.peer_addr == NULL) == (c.client_addr == NULL));
            FUZZ_CHECK(c.peer_addr == NULL || c.cmd == IDA_CLI_MEMBER_ADD);
            break;
        case IDA_CLI_MEMBER_UPDATE:
            FUZZ_CHECK(c.node >= 1);
            FUZZ_CHECK(c.peer_addr != NULL && c.client_addr != NULL);
            break;
        default:
            break;
    }
    return 0;
}
