/* Bad input against a live 3-node cluster: names, tags and counts at and
 * past every limit through the CLI (a clear message, exit 2, and no change
 * of state), list output of a tag holding a newline, and forged requests
 * whose tag or pool name holds a NUL byte (which protobuf `string` fields
 * used to cut: "alice\0evil" was alice). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "proto/idalloc.pb-c.h"
#include "src/common/frame.h"
#include "tests/lib/harness.h"

static struct tc c;
static char out[65536];

static void setup3(void)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 10000), 0, "no leader elected");
}

static void teardown(void)
{
    tc_destroy(&c);
}

/* `idalloc --cluster ADDRS ARGS`: stdout into `out`, the exit code. */
static int cli(const char *args)
{
    return tc_run(out, sizeof(out),
                  "%s --timeout 10000 --cluster %s %s 2>/dev/null",
                  tc_bin("idalloc"), c.addrs, args);
}

/* The same with stderr into `out`; expects exit @code and @needle. */
static void cli_refused(const char *args, int code, const char *needle)
{
    int rv = tc_run(out, sizeof(out),
                    "%s --timeout 10000 --cluster %s %s 2>&1 >/dev/null",
                    tc_bin("idalloc"), c.addrs, args);
    cr_assert_eq(rv, code, "idalloc %s: exit %d, want %d: %s", args, rv, code,
                 out);
    cr_assert(strstr(out, needle) != NULL, "idalloc %s: \"%s\" lacks \"%s\"",
              args, out, needle);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
}

static char *repeat(char ch, size_t n)
{
    static char buf[4][512];
    static int k;
    char *b = buf[k++ % 4];
    memset(b, ch, n);
    b[n] = '\0';
    return b;
}

Test(bad_input,
     limits_through_the_cli,
     .init = setup3,
     .fini = teardown,
     .timeout = 180)
{
    char args[1024];
    cr_assert_eq(cli("pool create b --kind bounded --size 10"), 0);
    cr_assert_eq(cli("pool create s --kind sequence"), 0);
    cr_assert_eq(cli("pool create p --kind prefix"), 0);

    /* Tags: 128 bytes is the limit. */
    snprintf(args, sizeof(args), "alloc b --tag %s", repeat('t', 128));
    cr_assert_eq(cli(args), 0);
    cr_assert_str_eq(out, "0\n");
    snprintf(args, sizeof(args), "alloc b --tag %s", repeat('t', 129));
    cli_refused(args, 2, "tag of 129 bytes, at most 128");
    snprintf(args, sizeof(args), "prefix p --tag %s", repeat('t', 129));
    cli_refused(args, 2, "at most 128");
    snprintf(args, sizeof(args), "lookup b --tag %s", repeat('t', 129));
    cli_refused(args, 2, "at most 128");
    cli_refused("alloc b --tag ''", 2, "tag must not be empty");
    cli_refused("alloc b --tag $(printf 'a\\377')", 2,
                "tag is not valid UTF-8");
    cli_refused("free b 0 --tag $(printf '\\300\\257')", 2, "not valid UTF-8");
    cli_refused("alloc b --tag", 2, "--tag needs a value");
    cli_refused("alloc b --tag --json", 2,
                "--tag needs a value, not the option");
    cr_assert_eq(cli("alloc b --tag $(printf 'caf\\303\\251')"), 0);
    cr_assert_str_eq(out, "1\n");

    /* Pool names: 1-64 of A-Za-z0-9._:- */
    snprintf(args, sizeof(args), "pool create %s --kind sequence",
             repeat('n', 64));
    cr_assert_eq(cli(args), 0);
    snprintf(args, sizeof(args), "pool create %s --kind sequence",
             repeat('n', 65));
    cli_refused(args, 2, "pool name must be 1-64 characters");
    cli_refused("pool create 'a b' --kind sequence", 2, "pool name must be");
    cli_refused("pool create '' --kind sequence", 2, "pool name must be");
    cli_refused("reserve 'b/1' --count 1", 2, "pool name must be");

    /* Counts and ids. */
    cr_assert_eq(cli("reserve s --count 16777216"), 0);
    cr_assert_str_eq(out, "1 16777216\n");
    cli_refused("reserve s --count 16777217", 2, "bad --count");
    cli_refused("reserve s --count 0", 2, "bad --count");
    cli_refused("reserve s --count -1", 2, "--count needs a value");
    cli_refused("reserve s --count 99999999999999999999999", 2, "bad --count");
    cli_refused("next s --count 10000001", 2, "bad --count");
    cli_refused("free b 18446744073709551616 --tag x", 2, "bad id");
    cli_refused("free b 10 --tag x", 2, "id is outside the pool");
    cli_refused("free b 18446744073709551615 --tag x", 2, "outside the pool");
    cli_refused("pool create x --kind bounded --size 18446744073709551616", 2,
                "bad --size");
    cli_refused("pool create x --kind bounded --size 0", 2, "bad --size");
    cr_assert_eq(
        cli("pool create x --kind bounded --size 18446744073709551615"), 0);
    cli_refused("alloc s --tag a", 1, "needs a bounded pool");
    cli_refused("alloc nosuch --tag a", 1, "no pool");

    /* Nothing refused changed anything: the holdings and the next block. */
    cr_assert_eq(cli("list b"), 0);
    char want[300];
    snprintf(want, sizeof(want), "0 %s\n1 caf\xc3\xa9\n", repeat('t', 128));
    cr_assert_str_eq(out, want);
    cr_assert_eq(cli("reserve s --count 1"), 0);
    cr_assert_str_eq(out, "16777217 16777217\n");
}

/* A tag holding a newline, a tab or a backslash is one line of `list`. */
Test(bad_input,
     list_escapes_tags,
     .init = setup3,
     .fini = teardown,
     .timeout = 120)
{
    cr_assert_eq(cli("pool create b --kind bounded --size 10"), 0);
    cr_assert_eq(cli("alloc b --tag \"$(printf 'two\\nlines')\""), 0);
    cr_assert_eq(cli("alloc b --tag \"$(printf 'tab\\there\\\\')\""), 0);
    cr_assert_eq(cli("list b"), 0);
    cr_assert_str_eq(out, "0 two\\nlines\n1 tab\\there\\\\\n");
    cr_assert_eq(cli("lookup b --tag \"$(printf 'two\\nlines')\""), 0);
    cr_assert_str_eq(out, "0\n");
}

static int raw_connect(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void read_all(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        cr_assert_gt(r, 0, "no answer");
        p += r;
        n -= (size_t)r;
    }
}

/* Send @req as a forged client on a raw connection to node @i; the answer. */
static Idalloc__ClientResponse *forge(int i, Idalloc__ClientRequest *req)
{
    static uint8_t cid[16] = {0xf0, 0x12};
    req->version = IDA_WIRE_VERSION;
    req->client_id.data = cid;
    req->client_id.len = sizeof(cid);
    uint8_t buf[1024];
    size_t n = idalloc__client_request__pack(req, buf + IDA_FRAME_HEADER_BYTES);
    ida_frame_header_encode(buf, IDA_FRAME_CLIENT_REQUEST, n);
    int fd = raw_connect(c.cfg.nodes[i].client.port);
    n += IDA_FRAME_HEADER_BYTES;
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    uint8_t hdr[IDA_FRAME_HEADER_BYTES];
    read_all(fd, hdr, sizeof(hdr));
    uint32_t len = (uint32_t)hdr[2] << 24 | (uint32_t)hdr[3] << 16 |
                   (uint32_t)hdr[4] << 8 | hdr[5];
    cr_assert_leq(len, sizeof(buf));
    read_all(fd, buf, len);
    close(fd);
    Idalloc__ClientResponse *r =
        idalloc__client_response__unpack(NULL, len, buf);
    cr_assert_not_null(r);
    cr_assert_not_null(r->result);
    return r;
}

Test(bad_input,
     nul_bytes_from_a_forged_client_are_refused,
     .init = setup3,
     .fini = teardown,
     .timeout = 120)
{
    cr_assert_eq(cli("pool create b --kind bounded --size 10"), 0);
    cr_assert_eq(cli("alloc b --tag alice"), 0);
    cr_assert_str_eq(out, "0\n");
    for (int i = 0; i < 3; i++) { /* every node: before the leader check */
        Idalloc__ClientRequest req = IDALLOC__CLIENT_REQUEST__INIT;
        Idalloc__Alloc a = IDALLOC__ALLOC__INIT;
        a.pool = (ProtobufCBinaryData){1, (uint8_t *)"b"};
        a.tag = (ProtobufCBinaryData){10, (uint8_t *)"alice\0evil"};
        req.op_case = IDALLOC__CLIENT_REQUEST__OP_ALLOC;
        req.alloc = &a;
        req.request_seq = 1 + (uint64_t)i;
        Idalloc__ClientResponse *r = forge(i, &req);
        cr_assert_eq(r->result->error, IDA_EINVAL, "node %d: %u", i + 1,
                     r->result->error);
        cr_assert_str_eq(r->result->error_msg, "tag holds a NUL byte");
        idalloc__client_response__free_unpacked(r, NULL);

        Idalloc__PoolCreate pc = IDALLOC__POOL_CREATE__INIT;
        pc.name = (ProtobufCBinaryData){3, (uint8_t *)"p\0q"};
        pc.kind = IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE;
        req.op_case = IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE;
        req.pool_create = &pc;
        req.request_seq = 10 + (uint64_t)i;
        r = forge(i, &req);
        cr_assert_eq(r->result->error, IDA_EINVAL);
        cr_assert(strstr(r->result->error_msg, "pool name") != NULL, "%s",
                  r->result->error_msg);
        idalloc__client_response__free_unpacked(r, NULL);

        Idalloc__Lookup l = IDALLOC__LOOKUP__INIT;
        l.pool = (ProtobufCBinaryData){1, (uint8_t *)"b"};
        l.tag = (ProtobufCBinaryData){2, (uint8_t *)"\xff\xfe"};
        req.op_case = IDALLOC__CLIENT_REQUEST__OP_LOOKUP;
        req.lookup = &l;
        r = forge(i, &req);
        cr_assert_eq(r->result->error, IDA_EINVAL);
        cr_assert_str_eq(r->result->error_msg, "tag is not valid UTF-8");
        idalloc__client_response__free_unpacked(r, NULL);
    }
    /* Nothing changed: alice alone holds an id, no pool p was made. */
    cr_assert_eq(cli("list b"), 0);
    cr_assert_str_eq(out, "0 alice\n");
    cr_assert_eq(cli("reserve p --count 1"), 1, "no pool p");
    cr_assert_eq(cli("alloc b --tag alice"), 0);
    cr_assert_str_eq(out, "0\n");
}
