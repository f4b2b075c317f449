/* Fuzz the idalloc command line parser (src/client/cli.h).
 *
 * The input is split at NUL bytes into arguments (argv[0] is "idalloc").
 * Checked: the result is 0 or IDA_EINVAL with a message; a parsed command
 * has what its command needs (a pool, a tag, counts and ids within their
 * limits), and every pointer it holds points into argv. */
#include <string.h>

#include "idalloc_errors.h"
#include "src/client/cli.h"
#include "tests/fuzz/fuzz.h"

#define ARGS_MAX 24

static int in_argv(const char *p, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (p == argv[i]) {
            return 1;
        }
    }
    return 0;
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
    argv[argc++] = "idalloc";
    for (size_t at = 0; at <= size && argc <= ARGS_MAX;) {
        argv[argc++] = buf + at;
        at += strlen(buf + at) + 1;
    }
    argv[argc] = NULL;

    struct ida_cli c;
    char err[IDALLOC_ERRMSG_MAX];
    int rv = ida_cli_parse(argc, argv, &c, err);
    if (rv != 0) {
        FUZZ_CHECK(rv == IDA_EINVAL);
        FUZZ_CHECK(err[0] != '\0' && strlen(err) < sizeof(err));
        return 0;
    }
    FUZZ_CHECK(c.cluster == NULL || c.config == NULL);
    FUZZ_CHECK(c.cluster == NULL || in_argv(c.cluster, argc, argv));
    FUZZ_CHECK(c.config == NULL || in_argv(c.config, argc, argv));
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
            break;
        default:
            break;
    }
    return 0;
}
