/* The TLS engine (src/common/tls.h) in memory: two sessions pumped into
 * each other, no socket. Identities, a mutual handshake and data both
 * ways, byte-at-a-time input, refused certificates, bad files. Certificates
 * come from ida_certs_create() (src/client/cli_certs.h) in a temporary
 * directory. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idalloc_errors.h"
#include "src/client/cli_certs.h"
#include "src/common/config.h"
#include "src/common/tls.h"

static char dir[64], other[80];
static char err[IDA_ERRMSG_MAX];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ida-tls-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(ida_certs_create(dir, 3, 1, 0, err), 0, "%s", err);
    snprintf(other, sizeof(other), "%s/other", dir);
    cr_assert_eq(ida_certs_create(other, 1, 1, 0, err), 0, "%s", err);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static const char *f(const char *d, const char *name)
{
    static char buf[8][160];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof(buf[0]), "%s/%s", d, name);
    return p;
}

static struct ida_tls_ctx *ctx(enum ida_tls_role role,
                               const char *d,
                               const char *who)
{
    char crt[32], key[32];
    snprintf(crt, sizeof(crt), "%s.crt", who);
    snprintf(key, sizeof(key), "%s.key", who);
    struct ida_tls_ctx *c;
    cr_assert_eq(
        ida_tls_ctx_new(role, f(dir, "ca.crt"), who != NULL ? f(d, crt) : NULL,
                        who != NULL ? f(d, key) : NULL, &c, err),
        0, "%s", err);
    return c;
}

struct sink
{
    uint8_t buf[65536];
    size_t len;
};

static int collect(void *arg, const uint8_t *data, size_t len)
{
    struct sink *s = arg;
    cr_assert_leq(s->len + len, sizeof(s->buf));
    memcpy(s->buf + s->len, data, len);
    s->len += len;
    return 0;
}

/* Move what @from produced into @to, @step bytes per feed. */
static int pump(struct ida_tls *from,
                struct ida_tls *to,
                struct sink *sink,
                size_t step)
{
    uint8_t buf[65536];
    size_t n = ida_tls_out_take(from, buf, sizeof(buf));
    for (size_t i = 0; i < n; i += step) {
        int rv = ida_tls_feed(to, buf + i, n - i < step ? n - i : step, collect,
                              sink);
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

/* Run a handshake between @cs and @ss to the end; 0 or the first error. */
static int handshake(struct ida_tls *cs,
                     struct ida_tls *ss,
                     struct sink *cin,
                     struct sink *sin,
                     size_t step)
{
    for (int i = 0; i < 10; i++) {
        int rv = pump(cs, ss, sin, step);
        if (rv == 0) {
            rv = pump(ss, cs, cin, step);
        }
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

Test(tls, identities_are_parsed_strictly)
{
    struct ida_tls_identity id = ida_tls_identity_parse("idalloc-node-3");
    cr_assert_eq(id.kind, IDA_TLS_NODE);
    cr_assert_eq(id.id, 3);
    id = ida_tls_identity_parse("idalloc-client-65535");
    cr_assert_eq(id.kind, IDA_TLS_CLIENT_ID);
    cr_assert_eq(id.id, 65535);
    const char *bad[] = {"idalloc-node-0",
                         "idalloc-node-03",
                         "idalloc-node-",
                         "idalloc-node-65536",
                         "idalloc-node-3x",
                         "idalloc-node--3",
                         "node-3",
                         "idalloc-ca",
                         "",
                         "idalloc-node-123456"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(ida_tls_identity_parse(bad[i]).kind, IDA_TLS_NONE, "%s",
                     bad[i]);
    }
}

Test(tls, mutual_handshake_then_data_both_ways, .init = setup, .fini = teardown)
{
    struct ida_tls_ctx *sc = ctx(IDA_TLS_SERVER_MUTUAL, dir, "node1");
    struct ida_tls_ctx *cc = ctx(IDA_TLS_CLIENT, dir, "node2");
    cr_assert_eq(ida_tls_ctx_identity(sc).kind, IDA_TLS_NODE);
    cr_assert_eq(ida_tls_ctx_identity(sc).id, 1);
    /* Whole records and one byte at a time. */
    for (size_t step = 65536; step >= 1; step = step == 1 ? 0 : 1) {
        struct ida_tls *cs, *ss;
        cr_assert_eq(ida_tls_new(cc, &cs), 0);
        cr_assert_eq(ida_tls_new(sc, &ss), 0);
        cr_assert_gt(ida_tls_out_pending(cs), 0, "no ClientHello");
        struct sink *cin = calloc(1, sizeof(*cin)),
                    *sin = calloc(1, sizeof(*sin));
        cr_assert_eq(handshake(cs, ss, cin, sin, step), 0, "%s / %s",
                     ida_tls_errmsg(cs), ida_tls_errmsg(ss));
        cr_assert(ida_tls_ready(cs) && ida_tls_ready(ss));
        cr_assert_eq(ida_tls_peer(ss).kind, IDA_TLS_NODE);
        cr_assert_eq(ida_tls_peer(ss).id, 2);
        cr_assert_eq(ida_tls_peer(cs).id, 1);
        static uint8_t big[40000];
        for (size_t i = 0; i < sizeof(big); i++) {
            big[i] = (uint8_t)(i * 7);
        }
        cr_assert_eq(ida_tls_write(cs, big, sizeof(big)), 0);
        cr_assert_eq(pump(cs, ss, sin, step), 0, "%s", ida_tls_errmsg(ss));
        cr_assert_eq(sin->len, sizeof(big));
        cr_assert_eq(memcmp(sin->buf, big, sizeof(big)), 0);
        cr_assert_eq(ida_tls_write(ss, (const uint8_t *)"pong", 4), 0);
        cr_assert_eq(pump(ss, cs, cin, step), 0);
        cr_assert_eq(cin->len, 4);
        cr_assert_eq(memcmp(cin->buf, "pong", 4), 0);
        /* A flipped bit in a record fails the session for good. */
        cr_assert_eq(ida_tls_write(cs, big, 100), 0);
        uint8_t buf[256];
        size_t n = ida_tls_out_take(cs, buf, sizeof(buf));
        buf[n - 3] ^= 1;
        cr_assert_eq(ida_tls_feed(ss, buf, n, collect, sin), IDA_EPROTO);
        cr_assert_neq(ida_tls_errmsg(ss)[0], '\0');
        cr_assert_eq(ida_tls_feed(ss, buf, 1, collect, sin), IDA_EPROTO,
                     "sticky");
        ida_tls_free(cs);
        ida_tls_free(ss);
        free(cin);
        free(sin);
    }
    ida_tls_ctx_free(sc);
    ida_tls_ctx_free(cc);
}

/* The server refuses a client without a certificate, or with one of
 * another CA; the client refuses a server of another CA. */
Test(tls,
     foreign_and_missing_certificates_are_refused,
     .init = setup,
     .fini = teardown)
{
    struct ida_tls_ctx *sc = ctx(IDA_TLS_SERVER_MUTUAL, dir, "node1");
    struct ida_tls_ctx *anon = ctx(IDA_TLS_CLIENT, dir, NULL);
    struct ida_tls *cs, *ss;
    struct sink *cin = calloc(1, sizeof(*cin)), *sin = calloc(1, sizeof(*sin));
    ida_tls_new(anon, &cs);
    ida_tls_new(sc, &ss);
    cr_assert_eq(handshake(cs, ss, cin, sin, 65536), IDA_EPROTO);
    cr_assert(
        strstr(ida_tls_errmsg(ss), "did not return a certificate") != NULL,
        "%s", ida_tls_errmsg(ss));
    ida_tls_free(cs);
    ida_tls_free(ss);
    /* A client trusting another CA does not accept our node. */
    struct ida_tls_ctx *foreign;
    cr_assert_eq(ida_tls_ctx_new(IDA_TLS_CLIENT, f(other, "ca.crt"),
                                 f(other, "client1.crt"),
                                 f(other, "client1.key"), &foreign, err),
                 0, "%s", err);
    ida_tls_new(foreign, &cs);
    ida_tls_new(sc, &ss);
    cr_assert_eq(handshake(cs, ss, cin, sin, 65536), IDA_EPROTO);
    cr_assert(strstr(ida_tls_errmsg(cs), "peer certificate refused") != NULL,
              "%s", ida_tls_errmsg(cs));
    ida_tls_free(cs);
    ida_tls_free(ss);
    ida_tls_ctx_free(foreign);
    ida_tls_ctx_free(anon);
    ida_tls_ctx_free(sc);
    free(cin);
    free(sin);
}

Test(tls, bad_files_are_named, .init = setup, .fini = teardown)
{
    struct ida_tls_ctx *c;
    cr_assert_eq(ida_tls_ctx_new(IDA_TLS_CLIENT, f(dir, "nope.crt"), NULL, NULL,
                                 &c, err),
                 IDA_ECONFIG);
    cr_assert(strstr(err, "cannot read CA certificate") != NULL, "%s", err);
    cr_assert_eq(
        ida_tls_ctx_new(IDA_TLS_SERVER_MUTUAL, f(dir, "ca.crt"),
                        f(dir, "node1.crt"), f(dir, "node2.key"), &c, err),
        IDA_ECONFIG);
    cr_assert(strstr(err, "does not belong to certificate") != NULL, "%s", err);
    cr_assert_eq(
        ida_tls_ctx_new(IDA_TLS_SERVER_MUTUAL, f(dir, "ca.crt"),
                        f(other, "node1.crt"), f(other, "node1.key"), &c, err),
        IDA_ECONFIG);
    cr_assert(strstr(err, "does not verify against the CA") != NULL, "%s", err);
    cr_assert_eq(ida_tls_ctx_new(IDA_TLS_SERVER_MUTUAL, f(dir, "ca.crt"), NULL,
                                 NULL, &c, err),
                 IDA_EINVAL, "a server needs a certificate");
    cr_assert_eq(ida_certs_create(dir, 1, 0, 0, err), IDA_EEXIST);
    cr_assert(strstr(err, "refusing to overwrite") != NULL, "%s", err);
}
