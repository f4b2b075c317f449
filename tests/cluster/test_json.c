/* idalloc --json against a real 3-node cluster: every command that prints
 * an answer prints one JSON document that jansson parses, with the values
 * the plain output and the library give; tags are escaped; a non-UTF-8 tag
 * is refused before anything is sent; errors are documents too. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "tests/lib/harness.h"

static struct tc c;
static char out[1 << 20];

static void setup(void)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader elected");
}

static void teardown(void)
{
    tc_destroy(&c);
}

/* Run `idalloc --cluster ADDRS ARGS`; parse stdout as one JSON document
 * (the whole of it: trailing garbage fails). *code gets the exit code. */
static json_t *idalloc_json(int *code, const char *args)
{
    *code = tc_run(out, sizeof(out), "%s --cluster %s --timeout 20000 %s",
                   tc_bin("idalloc"), c.addrs, args);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    cr_assert_not_null(j, "idalloc %s: not JSON (%s at %d): %s", args, e.text,
                       e.position, out);
    cr_assert(json_is_object(j), "idalloc %s: not an object: %s", args, out);
    return j;
}

static json_t *ok_json(const char *args)
{
    int code;
    json_t *j = idalloc_json(&code, args);
    cr_assert_eq(code, 0, "idalloc %s: exit %d: %s", args, code, out);
    return j;
}

static long long num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_string(v), "%s is not a string", key);
    return json_string_value(v);
}

Test(json,
     every_command_prints_one_document,
     .init = setup,
     .fini = teardown,
     .timeout = 180)
{
    int code;
    char plain[256];
    cr_assert_eq(tc_run(plain, sizeof(plain),
                        "%s --cluster %s pool create b --kind bounded "
                        "--size 100 && %s --cluster %s pool create s --kind "
                        "sequence && %s --cluster %s pool create x --kind "
                        "prefix",
                        tc_bin("idalloc"), c.addrs, tc_bin("idalloc"), c.addrs,
                        tc_bin("idalloc"), c.addrs),
                 0, "%s", plain);

    /* alloc: a tag with a quote, a backslash and a non-ASCII letter comes
     * back as the same string. */
    json_t *j = ok_json("alloc b --tag 'q\"b\\c' --json");
    cr_assert_eq(num(j, "id"), 0);
    cr_assert_str_eq(str(j, "tag"), "q\"b\\c");
    cr_assert_str_eq(str(j, "pool"), "b");
    json_decref(j);
    j = ok_json("alloc b --tag 'caf\xc3\xa9' -w json");
    cr_assert_eq(num(j, "id"), 1);
    cr_assert_str_eq(str(j, "tag"), "caf\xc3\xa9");
    json_decref(j);
    j = ok_json("lookup b --tag 'caf\xc3\xa9' --json");
    cr_assert_eq(num(j, "id"), 1);
    json_decref(j);

    /* list: both holdings in id order, tags intact. */
    j = ok_json("list b --json");
    json_t *h = json_object_get(j, "holdings");
    cr_assert(json_is_array(h));
    cr_assert_eq(json_array_size(h), 2);
    cr_assert_eq(num(json_array_get(h, 0), "id"), 0);
    cr_assert_str_eq(str(json_array_get(h, 0), "tag"), "q\"b\\c");
    cr_assert_eq(num(json_array_get(h, 1), "id"), 1);
    cr_assert_str_eq(str(json_array_get(h, 1), "tag"), "caf\xc3\xa9");
    json_decref(j);

    /* A tag that is not UTF-8 is refused before anything is sent. */
    code = tc_run(out, sizeof(out),
                  "%s --cluster %s alloc b --tag \"$(printf 'a\\377')\" "
                  "--json 2>&1",
                  tc_bin("idalloc"), c.addrs);
    cr_assert_eq(code, 2, "exit %d: %s", code, out);
    cr_assert(strstr(out, "not valid UTF-8") != NULL, "%s", out);
    j = ok_json("list b --json");
    cr_assert_eq(json_array_size(json_object_get(j, "holdings")), 2);
    json_decref(j);
    /* A non-UTF-8 tag already held (the plain CLI sends it; nodes that
     * refuse such tags answer exit 2 and there is nothing to list) comes
     * back from list as tag_hex. */
    code = tc_run(out, sizeof(out),
                  "%s --cluster %s alloc b --tag \"$(printf 'a\\377')\" 2>&1",
                  tc_bin("idalloc"), c.addrs);
    if (code == 0) {
        j = ok_json("list b --json");
        json_t *hs = json_object_get(j, "holdings");
        cr_assert_eq(json_array_size(hs), 3);
        json_t *last = json_array_get(hs, 2);
        cr_assert_null(json_object_get(last, "tag"));
        cr_assert_str_eq(str(last, "tag_hex"), "61ff");
        json_decref(j);
        cr_assert_eq(tc_run(out, sizeof(out),
                            "%s --cluster %s free b 2 --tag \"$(printf "
                            "'a\\377')\" 2>&1",
                            tc_bin("idalloc"), c.addrs),
                     0, "%s", out);
    } else {
        cr_assert_eq(code, 2, "refused as bad input: %s", out);
    }

    /* reserve and next: contiguous, non-overlapping blocks. */
    j = ok_json("reserve s --count 5 --json");
    cr_assert_eq(num(j, "first"), 1); /* sequences start at 1 */
    cr_assert_eq(num(j, "last"), 5);
    cr_assert_eq(num(j, "count"), 5);
    json_decref(j);
    j = ok_json("next s --count 3 --json");
    json_t *ids = json_object_get(j, "ids");
    cr_assert_eq(json_array_size(ids), 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(json_integer_value(json_array_get(ids, i)),
                     (long long)(6 + i));
    }
    json_decref(j);
    j = ok_json("next s --count 2 --format hex --json");
    ids = json_object_get(j, "ids");
    cr_assert_str_eq(json_string_value(json_array_get(ids, 0)),
                     "0000-0000-0000-0009");
    cr_assert_str_eq(json_string_value(json_array_get(ids, 1)),
                     "0000-0000-0000-000a");
    json_decref(j);

    /* prefix: hex, the same one again for the same tag. */
    j = ok_json("prefix x --tag t1 --json");
    char first[32];
    snprintf(first, sizeof(first), "%s", str(j, "prefix"));
    cr_assert_gt(strlen(first), 0);
    cr_assert_eq(strspn(first, "0123456789abcdef"), strlen(first));
    json_decref(j);
    j = ok_json("prefix x --tag t1 --json");
    cr_assert_str_eq(str(j, "prefix"), first);
    json_decref(j);

    /* status: three nodes, one leader, every node named. */
    j = ok_json("status --verbose --json");
    json_t *nodes = json_object_get(j, "nodes");
    cr_assert_eq(json_array_size(nodes), 3);
    cr_assert_eq(num(j, "answered"), 3);
    cr_assert_eq(num(j, "missing"), 0);
    long long leader = num(j, "leader");
    int leaders = 0;
    for (size_t i = 0; i < 3; i++) {
        json_t *n = json_array_get(nodes, i);
        leaders += strcmp(str(n, "role"), "leader") == 0;
        cr_assert_eq(num(n, "leader"), leader);
        cr_assert_geq(num(n, "commit"), 1);
        cr_assert(json_is_array(json_object_get(n, "peers")));
    }
    cr_assert_eq(leaders, 1);
    json_decref(j);

    /* member list: three voters, the leader flagged. */
    j = ok_json("member list --json");
    json_t *m = json_object_get(j, "members");
    cr_assert_eq(json_array_size(m), 3);
    cr_assert_eq(num(j, "leader"), leader);
    for (size_t i = 0; i < 3; i++) {
        json_t *e = json_array_get(m, i);
        cr_assert_str_eq(str(e, "role"), "voter");
        cr_assert_eq(strlen(str(e, "incarnation")), 16);
        cr_assert_eq(json_is_true(json_object_get(e, "leader")),
                     num(e, "id") == leader);
    }
    json_decref(j);

    /* bench: acknowledged requests counted. */
    j = ok_json(
        "bench --op reserve --pool s --clients 2 --duration 1 "
        "--count 10 --json 2>/dev/null");
    cr_assert_str_eq(str(j, "op"), "reserve");
    cr_assert_gt(num(j, "ok"), 0);
    cr_assert(json_is_real(json_object_get(j, "p99_ms")));
    json_decref(j);

    /* An error is a document too, with the plain exit code. */
    j = idalloc_json(&code, "lookup b --tag nobody --json 2>/dev/null");
    cr_assert_eq(code, 1, "exit %d", code);
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(str(e, "code"), "IDA_ENOTFOUND");
    json_decref(j);
}

Test(json,
     status_of_a_cluster_with_a_node_down,
     .init = setup,
     .fini = teardown,
     .timeout = 120)
{
    int leader = tc_wait_leader(&c, 20000);
    int victim = (leader + 1) % 3;
    tc_signal(&c, victim, SIGKILL);
    int code;
    json_t *j = idalloc_json(&code, "status --json 2>/dev/null");
    cr_assert_eq(code, 1, "exit %d: %s", code, out);
    cr_assert_eq(num(j, "answered"), 2);
    cr_assert_eq(num(j, "missing"), 1);
    int unreachable = 0;
    json_t *nodes = json_object_get(j, "nodes");
    for (size_t i = 0; i < json_array_size(nodes); i++) {
        json_t *e = json_object_get(json_array_get(nodes, i), "error");
        unreachable +=
            e != NULL && strcmp(json_string_value(e), "unreachable") == 0;
    }
    cr_assert_eq(unreachable, 1);
    json_decref(j);
}

/* idallocd --log-format json: every line of a running node's log is one
 * JSON object with ts, level, node and msg; bad values are usage errors. */
Test(json, daemon_logs_json_lines, .fini = teardown, .timeout = 60)
{
    tc_setup(&c, 3, NULL);
    int rv = tc_run(out, sizeof(out),
                    "timeout -s TERM 2 %s --config %s --node 1 "
                    "--log-format json --log-level debug 2>&1",
                    tc_bin("idallocd"), c.conf);
    cr_assert(rv == 0 || rv == 124, "exit %d: %s", rv, out);
    int lines = 0, started = 0;
    char *save;
    for (char *l = strtok_r(out, "\n", &save); l != NULL;
         l = strtok_r(NULL, "\n", &save)) {
        json_error_t e;
        json_t *j = json_loads(l, 0, &e);
        cr_assert_not_null(j, "not JSON (%s): %s", e.text, l);
        cr_assert(json_is_string(json_object_get(j, "ts")), "%s", l);
        cr_assert(json_is_string(json_object_get(j, "level")), "%s", l);
        cr_assert_eq(json_integer_value(json_object_get(j, "node")), 1);
        const char *msg = json_string_value(json_object_get(j, "msg"));
        cr_assert_not_null(msg, "%s", l);
        started += strncmp(msg, "node: started", 13) == 0;
        json_decref(j);
        lines++;
    }
    cr_assert_geq(lines, 3);
    cr_assert_eq(started, 1);
    rv = tc_run(out, sizeof(out),
                "%s --config %s --node 1 --log-format xml 2>&1",
                tc_bin("idallocd"), c.conf);
    cr_assert_eq(rv, 2, "%s", out);
    rv = tc_run(out, sizeof(out),
                "%s --config %s --node 1 --log-level loud 2>&1",
                tc_bin("idallocd"), c.conf);
    cr_assert_eq(rv, 2, "%s", out);
}
