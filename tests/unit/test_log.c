/* base/log.h: the text line and the JSON line (--log-format json) carry the
 * same fields; JSON lines parse, with the message escaped (quotes,
 * backslashes, control characters) and bytes that are not UTF-8 replaced. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

static int fds[2];
static char buf[16384];

static void setup(void)
{
    cr_assert_eq(pipe(fds), 0);
    ida_log_set_fd(fds[1]);
    ida_log_set_node(7);
    ida_log_set_level(IDA_LOG_INFO);
}

static void teardown(void)
{
    ida_log_set_fd(2);
    ida_log_set_json(0);
    close(fds[0]);
    close(fds[1]);
}

/* What the logger wrote since the last call (one write per line). */
static const char *drain(void)
{
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    cr_assert_gt(n, 0);
    buf[n] = '\0';
    return buf;
}

Test(log, text_line, .init = setup, .fini = teardown)
{
    IDA_WARN("raft: became leader term=%d", 3);
    const char *l = drain();
    cr_assert_eq(strlen(l),
                 24 + strlen(" WARN node=7 raft: became leader "
                             "term=3\n"),
                 "%s", l);
    cr_assert_str_eq(l + 24, " WARN node=7 raft: became leader term=3\n");
}

Test(log,
     json_line_parses_with_the_same_fields,
     .init = setup,
     .fini = teardown)
{
    ida_log_set_json(1);
    IDA_ERROR(
        "a \"quoted\" back\\slash, a tab\there, a newline\nthere, "
        "caf\xc3\xa9, bad \xff\xfe byte");
    const char *l = drain();
    cr_assert_eq(strchr(l, '\n'), l + strlen(l) - 1, "one line: %s", l);
    json_error_t e;
    json_t *j = json_loads(l, 0, &e);
    cr_assert_not_null(j, "%s: %s", e.text, l);
    cr_assert_str_eq(json_string_value(json_object_get(j, "level")), "ERROR");
    cr_assert_eq(json_integer_value(json_object_get(j, "node")), 7);
    const char *ts = json_string_value(json_object_get(j, "ts"));
    cr_assert_eq(strlen(ts), 24, "%s", ts);
    cr_assert_eq(ts[23], 'Z');
    cr_assert_str_eq(json_string_value(json_object_get(j, "msg")),
                     "a \"quoted\" back\\slash, a tab\there, a newline\nthere, "
                     "caf\xc3\xa9, bad \xef\xbf\xbd\xef\xbf\xbd byte");
    json_decref(j);
    /* The level still filters. */
    IDA_DEBUG("not shown");
    IDA_INFO("shown");
    l = drain();
    cr_assert(strstr(l, "\"msg\":\"shown\"") != NULL, "%s", l);
    cr_assert_null(strstr(l, "not shown"), "%s", l);
}
