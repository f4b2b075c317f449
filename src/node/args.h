/* The command line of bin/idallocd: parsing only (no I/O), so it is
 * unit-tested and fuzzed (tests/node/test_args.c, tests/fuzz/fuzz_cli.c).
 *
 *   idallocd --config FILE --node ID [--data DIR]
 *            [--peer ADDR --client ADDR] [--metrics ADDR]
 *            [--join ADDR,ADDR,... | --single-node]
 *            [--log-level LEVEL] [--log-format text|json]
 *   idallocd --config FILE --node ID [--data DIR] --export-backup OUT
 *   idallocd --config FILE --node ID [--data DIR] --import-backup FILE
 *            [--advance-sequences N]
 *   idallocd -h|--help | --version
 *
 * Each option takes its value from the next argument or after `=`
 * (`--data=DIR`). A value may not look like an option (start with `-`),
 * except after `=`: `--config --node 1` is "--config needs a value", not a
 * cluster file called "--node". Empty values are refused: `--data ''`
 * would put the node's files at /nodeID. Addresses must parse (IPv4:PORT
 * or [IPv6]:PORT; --join takes a comma-separated list of them); --peer and
 * --client go together. --single-node takes no value. --export-backup and
 * --import-backup do not run the node, and take none of the options that
 * only a running node uses; --advance-sequences (a number of ids below
 * 2^64) goes with --import-backup only. */
#ifndef IDA_NODE_ARGS_H
#define IDA_NODE_ARGS_H

#include "src/common/config.h"
#include "src/node/node.h"

enum ida_node_args_result {
    IDA_NODE_ARGS_RUN = 0, /* @o is filled: run the node */
    IDA_NODE_ARGS_HELP,    /* -h or --help: print the usage, exit 0 */
    IDA_NODE_ARGS_VERSION, /* --version: print the version, exit 0 */
    IDA_NODE_ARGS_BAD,     /* bad usage: @errmsg says why, exit 2 */
};

/* Parse argv (argv[0] is the program) into @o, whose pointers borrow argv.
 * @errmsg (IDA_ERRMSG_MAX bytes) gets a one-line message on
 * IDA_NODE_ARGS_BAD. */
enum ida_node_args_result ida_node_args_parse(int argc,
                                              char **argv,
                                              struct ida_node_opts *o,
                                              char *errmsg);

/* The text printed by --help. */
extern const char ida_node_usage[];

#endif /* IDA_NODE_ARGS_H */
