/* bin/idallocd's command line (src/node/args.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "src/node/args.h"

static struct ida_node_opts o;
static char err[IDA_ERRMSG_MAX];

/* Parse a command line split at '|' (so empty arguments can be written). */
static enum ida_node_args_result parse(const char *line)
{
    static char buf[512];
    static char *argv[32];
    int argc = 0;
    strcpy(buf, line);
    argv[argc++] = "idallocd";
    char *p = buf;
    for (;;) {
        argv[argc++] = p;
        char *bar = strchr(p, '|');
        if (bar == NULL) {
            break;
        }
        *bar = '\0';
        p = bar + 1;
    }
    return ida_node_args_parse(argc, argv, &o, err);
}

static void bad(const char *line, const char *needle)
{
    cr_assert_eq(parse(line), IDA_NODE_ARGS_BAD, "accepted: %s", line);
    cr_assert(strstr(err, needle) != NULL,
              "\"%s\": message \"%s\" lacks \"%s\"", line, err, needle);
}

Test(node_args, good_lines)
{
    cr_assert_eq(parse("--config|c.conf|--node|2"), IDA_NODE_ARGS_RUN, "%s",
                 err);
    cr_assert_str_eq(o.config_path, "c.conf");
    cr_assert_eq(o.node_id, 2);
    cr_assert_null(o.data_dir);
    cr_assert_eq(parse("--node=65535|--data=/tmp/x|--config=-odd.conf"),
                 IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_str_eq(o.config_path, "-odd.conf");
    cr_assert_str_eq(o.data_dir, "/tmp/x");
    cr_assert_eq(o.node_id, 65535);
    cr_assert_eq(parse("--config|c|--help"), IDA_NODE_ARGS_HELP);
    cr_assert_eq(parse("--version"), IDA_NODE_ARGS_VERSION);
    cr_assert(strstr(ida_node_usage, "--data=DIR") != NULL);
}

/* `--data ''` used to put the node's files at /nodeID; an option where a
 * value belongs used to become the value (`--config --node 1` read a
 * cluster file called "--node"). */
Test(node_args, bad_lines_are_named)
{
    bad("--config|c|--node|1|--data|",
        "--data needs a value, not an empty "
        "string (the node's files would go to "
        "/nodeID)");
    bad("--config|c|--node|1|--data=", "--data needs a value, not an empty");
    bad("--config||--node|1", "--config needs a value, not an empty string");
    bad("--config|--node|1", "--config needs a value, not the option --node");
    bad("--node|--config|c", "--node needs a value, not the option --config");
    bad("--config|c|--node", "--node needs a value (see --help)");
    bad("--foo", "unknown option --foo (see --help)");
    bad("--foo=1|--config|c|--node|1", "unknown option --foo (see --help)");
    bad("--config|c|--node|1|--bogus", "unknown option --bogus");
    bad("-x", "unknown option -x");
    bad("--config|c", "--config and --node are required");
    bad("--config|c|--node|0", "bad --node \"0\"");
    bad("--config|c|--node|65536", "bad --node \"65536\"");
    bad("--config|c|--node|1x", "bad --node \"1x\"");
    bad("--config|c|--node|99999999999999999999", "bad --node");
    bad("--config|c|--config|d|--node|1", "--config given twice");
}

/* A node's own addresses and --join (src/node/member.h: joining). */
Test(node_args, addresses_and_join)
{
    cr_assert_eq(parse("--config|c|--node|4|--peer|127.0.0.1:7104|--client|"
                       "127.0.0.1:7204|--join|127.0.0.1:7201,[::1]:7202|"
                       "--metrics|127.0.0.1:7304"),
                 IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_str_eq(o.peer_addr, "127.0.0.1:7104");
    cr_assert_str_eq(o.client_addr, "127.0.0.1:7204");
    cr_assert_str_eq(o.metrics_addr, "127.0.0.1:7304");
    cr_assert_str_eq(o.join, "127.0.0.1:7201,[::1]:7202");
    cr_assert_eq(parse("--config|c|--node|1"), IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_null(o.peer_addr);
    cr_assert_null(o.join);
    bad("--config|c|--node|4|--peer|127.0.0.1:7104",
        "--peer and --client go together");
    bad("--config|c|--node|4|--client|127.0.0.1:7104",
        "--peer and --client go together");
    bad("--config|c|--node|4|--peer|host:1|--client|127.0.0.1:2",
        "bad --peer \"host:1\"");
    bad("--config|c|--node|4|--peer|127.0.0.1:1|--client|127.0.0.1:0",
        "bad --client");
    bad("--config|c|--node|4|--metrics|127.0.0.1", "bad --metrics");
    bad("--config|c|--node|4|--join|127.0.0.1:1,,127.0.0.1:2", "bad --join");
    bad("--config|c|--node|4|--join|127.0.0.1:1,", "bad --join");
    bad("--config|c|--node|4|--join|127.0.0.1:1,x:2",
        "bad --join address \"x:2\"");
    cr_assert(strstr(ida_node_usage, "--join") != NULL);
}

/* --single-node takes no value and goes with neither --join nor
 * --export-backup. */
Test(node_args, single_node)
{
    cr_assert_eq(parse("--config|c|--single-node|--node|1"), IDA_NODE_ARGS_RUN,
                 "%s", err);
    cr_assert_eq(o.single_node, 1);
    cr_assert_str_eq(o.config_path, "c");
    cr_assert_eq(parse("--config|c|--node|1"), IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_eq(o.single_node, 0);
    bad("--config|c|--node|1|--single-node|--join|127.0.0.1:1",
        "--single-node creates a cluster and --join joins one");
    bad("--config|c|--node|1|--export-backup|f|--single-node",
        "--export-backup takes no --single-node");
    bad("--config|c|--node|1|--single-node=1", "unknown option --single-node");
    cr_assert(strstr(ida_node_usage, "--single-node") != NULL);
}

/* --import-backup FILE takes --advance-sequences N (a count below 2^64,
 * nothing else) and none of a running node's options. */
Test(node_args, import_backup)
{
    cr_assert_eq(parse("--config|c|--node|1|--import-backup|f.ida"),
                 IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_str_eq(o.import_backup, "f.ida");
    cr_assert_eq(o.advance_sequences, 0);
    cr_assert_eq(parse("--config|c|--node|1|--import-backup=f|--data|d|"
                       "--advance-sequences|18446744073709551615"),
                 IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_eq(o.advance_sequences, UINT64_MAX);
    cr_assert_str_eq(o.data_dir, "d");
    cr_assert_eq(parse("--config|c|--node|1"), IDA_NODE_ARGS_RUN, "%s", err);
    cr_assert_null(o.import_backup);
    bad("--config|c|--node|1|--import-backup|f|--advance-sequences|"
        "18446744073709551616",
        "bad --advance-sequences \"18446744073709551616\"");
    bad("--config|c|--node|1|--import-backup|f|--advance-sequences|1e6",
        "bad --advance-sequences \"1e6\"");
    bad("--config|c|--node|1|--import-backup|f|--advance-sequences=-1",
        "bad --advance-sequences \"-1\"");
    bad("--config|c|--node|1|--advance-sequences|5",
        "--advance-sequences goes with --import-backup");
    const char *others[] = {"--single-node", "--join|127.0.0.1:1",
                            "--export-backup|g",
                            "--peer|127.0.0.1:1|--client|"
                            "127.0.0.1:2",
                            "--metrics|127.0.0.1:3"};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        char line[256];
        snprintf(line, sizeof(line), "--config|c|--node|1|--import-backup|f|%s",
                 others[i]);
        bad(line, "--import-backup writes a new data directory and exits");
    }
    cr_assert(strstr(ida_node_usage, "--import-backup FILE") != NULL);
    cr_assert(strstr(ida_node_usage, "--advance-sequences N") != NULL);
}
