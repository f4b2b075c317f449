/* The idalloc command line: parsing only (no I/O), so it is unit-tested.
 *
 *   idalloc [--cluster ADDR,ADDR,...|--config FILE] [--timeout MS]
 *           [--tls-dir DIR [--tls-client NAME]] COMMAND ...
 *
 * See ida_cli_usage() for every command. Without --cluster or --config the
 * CLI uses $IDALLOC_CLUSTER, else the client addresses of the local 3-node
 * cluster (127.0.0.1:7201,127.0.0.1:7202,127.0.0.1:7203).
 */
#ifndef IDA_CLI_H
#define IDA_CLI_H

#include <stdint.h>

#include "idalloc.h"

#define IDA_CLI_DEFAULT_CLUSTER "127.0.0.1:7201,127.0.0.1:7202,127.0.0.1:7203"
#define IDA_CLI_NEXT_COUNT_MAX  10000000
/* next --json holds every id in one document: a tenth of the plain limit. */
#define IDA_CLI_NEXT_JSON_COUNT_MAX 1000000
#define IDA_CLI_BENCH_CLIENTS_MAX   4096
#define IDA_CLI_BENCH_THREADS_MAX   16

enum ida_cli_cmd {
    IDA_CLI_HELP = 0,
    IDA_CLI_POOL_CREATE,
    IDA_CLI_ALLOC,
    IDA_CLI_FREE,
    IDA_CLI_LOOKUP,
    IDA_CLI_LIST,
    IDA_CLI_RESERVE,
    IDA_CLI_NEXT,
    IDA_CLI_PREFIX,
    IDA_CLI_STATUS,
    IDA_CLI_BENCH,
    IDA_CLI_VERSION, /* --version */
    IDA_CLI_MEMBER_LIST,
    IDA_CLI_MEMBER_ADD,
    IDA_CLI_MEMBER_REMOVE,
    IDA_CLI_MEMBER_PROMOTE,
    IDA_CLI_MEMBER_UPDATE,
    IDA_CLI_LEADER_TRANSFER,
    IDA_CLI_SNAPSHOT_SAVE,    /* snapshot save FILE (cli_backup.h) */
    IDA_CLI_SNAPSHOT_RESTORE, /* snapshot restore FILE [--advance-...] */
};

enum ida_cli_bench_op {
    IDA_BENCH_ALLOC = 1,
    IDA_BENCH_RESERVE,
    IDA_BENCH_NEXT,
    IDA_BENCH_PREFIX,
};

struct ida_cli
{
    const char *cluster;    /* addresses, or NULL */
    const char *config;     /* cluster file, or NULL */
    const char *tls_dir;    /* --tls-dir: CA (and client) files, or NULL */
    const char *tls_client; /* --tls-client NAME: DIR/NAME.crt, .key */
    unsigned timeout_ms;    /* per call, retries included; 0: library default */
    enum ida_cli_cmd cmd;
    enum ida_cli_cmd help_for; /* with IDA_CLI_HELP: the command, or HELP */
    const char *pool;          /* pool create: the name */
    const char *tag;
    uint64_t id;
    enum idalloc_pool_kind kind;
    uint64_t size; /* bounded pool size */
    int has_size;
    uint64_t count; /* reserve/next/bench --count */
    int hex;        /* next --format hex */
    enum ida_cli_bench_op bench_op;
    unsigned clients;
    unsigned duration_s;
    /* bench: C requests in flight driven by bench_threads client objects
     * through the asynchronous API (default 1), or, with --blocking, by C
     * threads each making one blocking call at a time (bench_threads 0). */
    unsigned bench_threads;
    int bench_blocking;
    int json;      /* --json or -w json: one JSON document (cli_json.h) */
    int verbose;   /* status --verbose */
    unsigned node; /* member add/remove/promote ID, leader transfer --to */
    /* member add ID PEER CLIENT, member update: the node's addresses
     * (checked: they parse, not 0.0.0.0 or ::, distinct); NULL: none. */
    const char *peer_addr;
    const char *client_addr;
    const char *file; /* snapshot save/restore FILE */
    uint64_t advance; /* snapshot restore --advance-sequences N */
    /* --request-id of a write (idalloc_call_parse() accepts it), or NULL */
    const char *request_id;
};

/* Parse argv (argv[0] is the program). Returns 0 or IDA_EINVAL with a
 * one-line message in @errmsg (IDALLOC_ERRMSG_MAX bytes). `-h` or `--help`
 * anywhere gives cmd = IDA_CLI_HELP with help_for set; `--version` before
 * the command gives IDA_CLI_VERSION. Pointers in @out borrow argv. */
int ida_cli_parse(int argc, char **argv, struct ida_cli *out, char *errmsg);

/* Write @tag into @out (at least 4 * strlen(@tag) + 1 bytes) as one line of
 * plain output: a backslash becomes `\\`, newline, tab and carriage return
 * `\n`, `\t`, `\r`, other bytes below 0x20 and 0x7f `\xHH`; everything
 * else (UTF-8 included) is copied. `list` prints tags this way, so a tag
 * holding a newline is still one line. */
void ida_cli_escape(const char *tag, char *out);

/* The usage text of @cmd (IDA_CLI_HELP: the overview). */
const char *ida_cli_usage(enum ida_cli_cmd cmd);

#endif /* IDA_CLI_H */
