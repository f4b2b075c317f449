/* The idalloc command line parser: every command, and bad usage. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "src/client/cli.h"

static struct ida_cli cli;
static char err[IDALLOC_ERRMSG_MAX];

/* Parse a space-separated command line (no quoting needed in tests). */
static int parse(const char *line)
{
    static char buf[512];
    static char *argv[32];
    int argc = 0;
    strcpy(buf, line);
    argv[argc++] = "idalloc";
    for (char *t = strtok(buf, " "); t != NULL; t = strtok(NULL, " ")) {
        argv[argc++] = t;
    }
    return ida_cli_parse(argc, argv, &cli, err);
}

static void bad(const char *line, const char *needle)
{
    cr_assert_eq(parse(line), IDA_EINVAL, "accepted: %s", line);
    cr_assert(strstr(err, needle) != NULL,
              "\"%s\": message \"%s\" lacks \"%s\"", line, err, needle);
}

Test(cli, pool_create)
{
    cr_assert_eq(parse("pool create users --kind bounded --size 1000"), 0, "%s",
                 err);
    cr_assert_eq(cli.cmd, IDA_CLI_POOL_CREATE);
    cr_assert_str_eq(cli.pool, "users");
    cr_assert_eq(cli.kind, IDALLOC_POOL_BOUNDED);
    cr_assert_eq(cli.size, 1000);
    cr_assert_eq(parse("pool create s --kind sequence"), 0, "%s", err);
    cr_assert_eq(cli.kind, IDALLOC_POOL_SEQUENCE);
    cr_assert_eq(parse("pool create p --kind prefix"), 0, "%s", err);
    bad("pool create u --kind bounded", "needs --size");
    bad("pool create s --kind sequence --size 5", "bounded pools only");
    bad("pool create u --kind tree", "unknown kind");
    bad("pool create u", "--kind is required");
    bad("pool delete u --kind prefix", "pool create NAME");
    bad("pool create u --kind bounded --size 0", "bad --size");
    bad("pool create u --kind bounded --size 99999999999999999999999",
        "bad --size");
}

Test(cli, tagged_commands)
{
    cr_assert_eq(parse("alloc users --tag alice"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_ALLOC);
    cr_assert_str_eq(cli.pool, "users");
    cr_assert_str_eq(cli.tag, "alice");
    cr_assert_eq(parse("free users 17 --tag alice"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_FREE);
    cr_assert_eq(cli.id, 17);
    cr_assert_eq(parse("lookup users --tag bob"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_LOOKUP);
    cr_assert_eq(parse("prefix dirs --tag d1"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_PREFIX);
    bad("alloc users", "--tag is required");
    bad("alloc --tag x", "expected 1 argument");
    bad("free users --tag a", "expected 2 arguments");
    bad("free users x1 --tag a", "bad id");
    bad("alloc users --tag a --tag b", "given twice");
    bad("alloc users --tag a --count 3", "--count does not apply");
    bad("alloc users --tag", "--tag needs a value");
}

Test(cli, sequence_commands)
{
    cr_assert_eq(parse("reserve s --count 100"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_RESERVE);
    cr_assert_eq(cli.count, 100);
    cr_assert_eq(parse("next s"), 0);
    cr_assert_eq(cli.count, 1);
    cr_assert_eq(cli.hex, 0);
    cr_assert_eq(parse("next s --count 5 --format hex"), 0);
    cr_assert_eq(cli.count, 5);
    cr_assert_eq(cli.hex, 1);
    bad("reserve s", "--count is required");
    bad("reserve s --count 0", "bad --count");
    bad("next s --format oct", "bad --format");
    bad("next s --count 10000001", "bad --count");
}

Test(cli, list_status_and_globals)
{
    cr_assert_eq(parse("--cluster 127.0.0.1:1,127.0.0.1:2 --timeout 250 "
                       "list users"),
                 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_LIST);
    cr_assert_str_eq(cli.cluster, "127.0.0.1:1,127.0.0.1:2");
    cr_assert_eq(cli.timeout_ms, 250);
    cr_assert_eq(parse("--config c.conf status"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_STATUS);
    cr_assert_str_eq(cli.config, "c.conf");
    bad("--cluster a --config b status", "not both");
    bad("--timeout 0 status", "bad --timeout");
    bad("--bogus 1 status", "unknown option --bogus");
    bad("--cluster a --cluster b status", "--cluster given twice");
    bad("status extra", "expected 0 arguments");
    cr_assert_eq(parse("status --verbose"), 0);
    cr_assert_eq(cli.verbose, 1);
    bad("alloc p --tag t --verbose", "--verbose does not apply");
    bad("", "no command");
    bad("frobnicate", "unknown command");
}

Test(cli, help_everywhere)
{
    cr_assert_eq(parse("--help"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_HELP);
    cr_assert_eq(cli.help_for, IDA_CLI_HELP);
    cr_assert_eq(parse("alloc --help"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_HELP);
    cr_assert_eq(cli.help_for, IDA_CLI_ALLOC);
    cr_assert(strstr(ida_cli_usage(IDA_CLI_ALLOC), "--tag TAG") != NULL);
    const char *helps[] = {"-h",
                           "alloc -h",
                           "status -h",
                           "pool create -h",
                           "bench --op alloc -h",
                           "next s --help"};
    for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
        cr_assert_eq(parse(helps[i]), 0, "%s: %s", helps[i], err);
        cr_assert_eq(cli.cmd, IDA_CLI_HELP, "%s", helps[i]);
    }
    for (int c = IDA_CLI_HELP; c <= IDA_CLI_BENCH; c++) {
        cr_assert(
            strncmp(ida_cli_usage((enum ida_cli_cmd)c), "usage: ", 7) == 0,
            "command %d has no usage", c);
    }
}

Test(cli, bench)
{
    cr_assert_eq(parse("bench --op reserve --pool s --clients 64 --duration "
                       "10 --count 100 --json"),
                 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_BENCH);
    cr_assert_eq(cli.bench_op, IDA_BENCH_RESERVE);
    cr_assert_eq(cli.clients, 64);
    cr_assert_eq(cli.duration_s, 10);
    cr_assert_eq(cli.count, 100);
    cr_assert_eq(cli.json, 1);
    cr_assert_eq(parse("bench --op alloc --pool b --clients 1 --duration 1"),
                 0);
    cr_assert_eq(cli.count, 1);
    /* Asynchronous closed loops on one client object by default. */
    cr_assert_eq(cli.bench_blocking, 0);
    cr_assert_eq(cli.bench_threads, 1);
    cr_assert_eq(parse("bench --op alloc --pool b --clients 64 --duration 1 "
                       "--threads 2"),
                 0, "%s", err);
    cr_assert_eq(cli.bench_threads, 2);
    cr_assert_eq(parse("bench --op alloc --pool b --clients 1 --duration 1 "
                       "--threads=2"),
                 0, "%s", err);
    cr_assert_eq(cli.bench_threads, 1, "no more threads than requests");
    cr_assert_eq(parse("bench --op alloc --pool b --clients 8 --duration 1 "
                       "--blocking"),
                 0, "%s", err);
    cr_assert_eq(cli.bench_blocking, 1);
    cr_assert_eq(cli.bench_threads, 0);
    bad("bench --op alloc --pool b --clients 8 --duration 1 --blocking "
        "--threads 2",
        "--threads does not apply with --blocking");
    bad("bench --op alloc --pool b --clients 8 --duration 1 --threads 0",
        "bad --threads");
    bad("bench --op alloc --pool b --clients 8 --duration 1 --threads 17",
        "bad --threads");
    bad("alloc p --tag t --blocking", "--blocking does not apply");
    bad("alloc p --tag t --threads 2", "--threads does not apply");
    bad("bench --op alloc --pool b --clients 1", "--duration is required");
    bad("bench --op fly --pool b --clients 1 --duration 1", "unknown --op");
    bad("bench --op alloc --pool b --clients 0 --duration 1", "bad --clients");
    bad("bench --op alloc --pool b --clients 1 --duration 0", "bad --duration");
    bad("free p 1 --tag t --json", "--json does not apply");
    bad("pool create p --kind sequence --json", "--json does not apply");
}

Test(cli, json_on_the_commands_that_print_answers)
{
    const char *yes[] = {"status --json",
                         "status --verbose -w json",
                         "member list --json",
                         "list p --json",
                         "lookup p --tag t --json",
                         "alloc p --tag t -w json",
                         "reserve p --count 5 --json",
                         "next p --count 3 --format hex --json",
                         "prefix p --tag t --json"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        cr_assert_eq(parse(yes[i]), 0, "%s: %s", yes[i], err);
        cr_assert_eq(cli.json, 1, "%s", yes[i]);
    }
    cr_assert_eq(parse("alloc p --tag t -w plain"), 0, "%s", err);
    cr_assert_eq(cli.json, 0);
    cr_assert_eq(parse("alloc p --tag t"), 0, "%s", err);
    cr_assert_eq(cli.json, 0);
    bad("alloc p --tag t -w yaml", "-w needs json or plain");
    bad("alloc p --tag t -w", "-w needs json or plain");
    /* Every id is in the one document: a lower limit than plain output. */
    cr_assert_eq(parse("next p --count 10000000"), 0, "%s", err);
    cr_assert_eq(parse("next p --count 1000000 --json"), 0, "%s", err);
    bad("next p --count 1000001 --json", "bad --count");
}

Test(cli, conventions)
{
    cr_assert_eq(parse("--version"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_VERSION);
    /* Unknown options are named as unknown, wherever they are. */
    bad("--foo", "unknown option --foo");
    bad("--foo status", "unknown option --foo");
    bad("-x status", "unknown option -x");
    bad("status -x", "unknown option -x");
    bad("alloc p --tag t --colour red", "unknown option --colour");
    bad("alloc p --tag", "--tag needs a value");
    /* Limits are the real ones: reserve takes up to 2^24 ids. */
    bad("reserve s --count 0", "(1 to 16777216)");
    bad("reserve s --count 16777217", "(1 to 16777216)");
    cr_assert_eq(parse("reserve s --count 16777216"), 0, "%s", err);
    cr_assert_eq(cli.count, 16777216);
    bad("bench --op reserve --pool s --clients 1 --duration 1 --count 0",
        "(1 to 16777216)");
    bad("next s --count 10000001", "(1 to 10000000)");
}

Test(cli, membership)
{
    cr_assert_eq(parse("member list"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_MEMBER_LIST);
    cr_assert_eq(parse("member add 3"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_MEMBER_ADD);
    cr_assert_eq(cli.node, 3);
    cr_assert_eq(parse("--config c.conf member remove 2"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_MEMBER_REMOVE);
    cr_assert_eq(cli.node, 2);
    cr_assert_eq(parse("member promote 1"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_MEMBER_PROMOTE);
    cr_assert_eq(parse("leader transfer"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_LEADER_TRANSFER);
    cr_assert_eq(cli.node, 0);
    cr_assert_eq(parse("leader transfer --to 2"), 0, "%s", err);
    cr_assert_eq(cli.node, 2);
    cr_assert_eq(parse("member add --help"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_HELP);
    cr_assert_eq(cli.help_for, IDA_CLI_MEMBER_ADD);
    cr_assert_eq(parse("member --help"), 0, "%s", err);
    cr_assert_eq(cli.help_for, IDA_CLI_MEMBER_LIST);
    cr_assert_eq(parse("leader transfer -h"), 0, "%s", err);
    cr_assert_eq(cli.help_for, IDA_CLI_LEADER_TRANSFER);
    cr_assert(strstr(ida_cli_usage(IDA_CLI_MEMBER_PROMOTE), "caught") != NULL);
    bad("member", "a subcommand is needed");
    bad("member join 2", "unknown subcommand");
    bad("member add", "expected 1 or 3 arguments");
    bad("member add 0", "bad node id");
    bad("member remove x", "bad node id");
    bad("member list 2", "expected 0 arguments");
    bad("member add 2 --to 3", "--to does not apply");
    bad("leader transfer --to 0", "bad node id");
    bad("leader elect", "unknown subcommand");
}

/* member add ID PEER CLIENT and member update: the addresses are checked
 * before anything is sent (exit 2). */
Test(cli, membership_with_addresses)
{
    cr_assert_eq(parse("member add 4 127.0.0.1:7104 127.0.0.1:7204"), 0, "%s",
                 err);
    cr_assert_eq(cli.cmd, IDA_CLI_MEMBER_ADD);
    cr_assert_eq(cli.node, 4);
    cr_assert_str_eq(cli.peer_addr, "127.0.0.1:7104");
    cr_assert_str_eq(cli.client_addr, "127.0.0.1:7204");
    cr_assert_eq(parse("member add 4"), 0, "%s", err);
    cr_assert_null(cli.peer_addr);
    cr_assert_eq(parse("member update 2 [::1]:1 [::1]:2"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_MEMBER_UPDATE);
    cr_assert_str_eq(cli.client_addr, "[::1]:2");
    cr_assert_eq(parse("member update --help"), 0, "%s", err);
    cr_assert_eq(cli.help_for, IDA_CLI_MEMBER_UPDATE);
    cr_assert(strstr(ida_cli_usage(IDA_CLI_MEMBER_UPDATE), "PEER_ADDR") !=
              NULL);
    bad("member add 4 127.0.0.1:7104", "expected 1 or 3 arguments");
    bad("member add 4 a b c", "expected 1 or 3 arguments");
    bad("member add 4 127.0.0.1 127.0.0.1:2", "bad peer address");
    bad("member add 4 127.0.0.1:1 localhost:2", "bad client address");
    bad("member add 4 0.0.0.0:1 127.0.0.1:2", "not an address other nodes");
    bad("member add 4 127.0.0.1:1 [::]:2", "not an address other nodes");
    bad("member add 4 127.0.0.1:1 127.0.0.1:1", "are the same");
    bad("member update 2", "expected 3 arguments");
    bad("member update 2 127.0.0.1:1", "expected 3 arguments");
    bad("member remove 2 127.0.0.1:1 127.0.0.1:2", "expected 1 argument");
    bad("member promote 2 127.0.0.1:1 127.0.0.1:2", "expected 1 argument");
}

Test(cli, snapshot_save_and_restore)
{
    cr_assert_eq(parse("snapshot save /tmp/b.ida"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_SNAPSHOT_SAVE);
    cr_assert_str_eq(cli.file, "/tmp/b.ida");
    cr_assert_eq(parse("snapshot restore b.ida --advance-sequences 5000"), 0,
                 "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_SNAPSHOT_RESTORE);
    cr_assert_str_eq(cli.file, "b.ida");
    cr_assert_eq(cli.advance, 5000);
    cr_assert_eq(parse("snapshot restore b.ida"), 0, "%s", err);
    cr_assert_eq(cli.advance, 0);
    cr_assert_eq(parse("snapshot --help"), 0, "%s", err);
    cr_assert_eq(cli.cmd, IDA_CLI_HELP);
    cr_assert_eq(cli.help_for, IDA_CLI_SNAPSHOT_SAVE);
    bad("snapshot save", "expected 1 argument");
    bad("snapshot save a b", "expected 1 argument");
    bad("snapshot save f --advance-sequences 1", "does not apply");
    bad("snapshot restore f --advance-sequences -1", "needs a value");
    bad("snapshot restore f --advance-sequences=-1", "bad --advance-sequences");
    bad("snapshot copy f", "unknown subcommand");
    bad("snapshot", "a subcommand is needed");
}

Test(cli, request_id_on_writes_only)
{
    const char *id = "00112233445566778899aabbccddeeff:4294967301";
    char line[256];
    const char *writes[] = {
        "alloc p --tag t",       "free p 3 --tag t",
        "reserve s --count 5",   "next s --count 2",
        "prefix x --tag t",      "pool create p --kind sequence",
        "snapshot restore b.ida"};
    for (size_t i = 0; i < sizeof(writes) / sizeof(writes[0]); i++) {
        snprintf(line, sizeof(line), "%s --request-id %s", writes[i], id);
        cr_assert_eq(parse(line), 0, "%s: %s", line, err);
        cr_assert_str_eq(cli.request_id, id);
    }
    cr_assert_eq(parse("alloc p --tag t"), 0);
    cr_assert_null(cli.request_id);
    snprintf(line, sizeof(line), "lookup p --tag t --request-id %s", id);
    bad(line, "--request-id does not apply");
    snprintf(line, sizeof(line), "status --request-id %s", id);
    bad(line, "--request-id does not apply");
    snprintf(line, sizeof(line), "snapshot save b.ida --request-id %s", id);
    bad(line, "--request-id does not apply");
    bad("alloc p --tag t --request-id 12:3", "bad --request-id");
    bad("alloc p --tag t --request-id "
        "00112233445566778899aabbccddeeff:0",
        "bad --request-id");
    bad("alloc p --tag t --request-id", "needs a value");
}

/* Found by tests/fuzz/fuzz_cli.c: `--version` parses to IDA_CLI_VERSION,
 * whose usage text was NULL (a caller printing it would crash). Every
 * command value has a text. */
Test(cli, every_command_has_a_usage_text)
{
    for (int c = IDA_CLI_HELP; c <= IDA_CLI_LEADER_TRANSFER; c++) {
        const char *u = ida_cli_usage((enum ida_cli_cmd)c);
        cr_assert(u != NULL && strncmp(u, "usage: idalloc", 14) == 0,
                  "command %d", c);
    }
    cr_assert_eq(parse("--version"), 0);
    cr_assert_eq(cli.cmd, IDA_CLI_VERSION);
    cr_assert_not_null(ida_cli_usage(cli.cmd));
}

/* An option where a value belongs is a missing value, named as such (it
 * used to become the value: `alloc p --tag --json` allocated to the tag
 * "--json"); a value that starts with `-` goes after `=`; unknown options
 * are named, with or without `=`; empty addresses are refused. */
Test(cli, options_are_never_taken_as_values)
{
    bad("alloc p --tag --json", "--tag needs a value, not the option --json");
    bad("alloc p --tag --foo", "--tag needs a value, not the option --foo");
    bad("alloc p --tag", "--tag needs a value (see idalloc alloc --help)");
    bad("--cluster --timeout 5 status",
        "--cluster needs a value, not the "
        "option --timeout");
    bad("--timeout", "--timeout needs a value (see idalloc --help)");
    bad("--bogus=1 status", "unknown option --bogus (");
    bad("alloc p --bogus=1 --tag x", "alloc: unknown option --bogus (");
    bad("alloc p --bogus", "alloc: unknown option --bogus (");
    bad("status --bogus", "status: unknown option --bogus");
    bad("--cluster= status", "--cluster needs a value, not an empty string");
    cr_assert_eq(parse("alloc p --tag=--json"), 0, "%s", err);
    cr_assert_str_eq(cli.tag, "--json");
    cr_assert_eq(parse("--cluster=127.0.0.1:1 --timeout=20 reserve s "
                       "--count=3"),
                 0, "%s", err);
    cr_assert_str_eq(cli.cluster, "127.0.0.1:1");
    cr_assert_eq(cli.timeout_ms, 20);
    cr_assert_eq(cli.count, 3);
    cr_assert_eq(parse("alloc p --tag=a=b"), 0, "%s", err);
    cr_assert_str_eq(cli.tag, "a=b");
    bad("alloc p --tag=x --tag=y", "--tag given twice");
}

/* list prints one line per holding: a tag holding a newline used to print
 * as two lines. */
Test(cli, tags_are_escaped_for_one_line_output)
{
    char out[4 * 32 + 1];
    ida_cli_escape("plain \xc3\xa9t\xc3\xa9", out);
    cr_assert_str_eq(out, "plain \xc3\xa9t\xc3\xa9");
    ida_cli_escape("a\nb\tc\rd\\e", out);
    cr_assert_str_eq(out, "a\\nb\\tc\\rd\\\\e");
    ida_cli_escape("\x01\x1f\x7f", out);
    cr_assert_str_eq(out, "\\x01\\x1f\\x7f");
    ida_cli_escape("", out);
    cr_assert_str_eq(out, "");
}
