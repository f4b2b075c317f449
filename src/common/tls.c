#include "src/common/tls.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "base/assert.h"
#include "idalloc_errors.h"
#include "src/common/config.h"

#define TLS_READ_CHUNK_BYTES 16384

struct ida_tls_ctx
{
    SSL_CTX *ssl;
    enum ida_tls_role role;
    struct ida_tls_identity self;
};

struct ida_tls
{
    SSL *ssl;
    BIO *rbio; /* network -> SSL: what ida_tls_feed() wrote */
    BIO *wbio; /* SSL -> network: what ida_tls_out_take() reads */
    int ready;
    int failed; /* sticky IDA_EPROTO */
    struct ida_tls_identity peer;
    char errmsg[256];
};

/* The reason of OpenSSL's most recent error, or @dflt. Clears the queue. */
static const char *ossl_reason(char *buf, size_t cap, const char *dflt)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;
    snprintf(buf, cap, "%s", r != NULL ? r : dflt);
    ERR_clear_error();
    return buf;
}

struct ida_tls_identity ida_tls_identity_parse(const char *cn)
{
    struct ida_tls_identity none = {IDA_TLS_NONE, 0};
    static const struct
    {
        const char *prefix;
        enum ida_tls_kind kind;
    } forms[] = {{"idalloc-node-", IDA_TLS_NODE},
                 {"idalloc-client-", IDA_TLS_CLIENT_ID}};
    for (size_t k = 0; k < sizeof(forms) / sizeof(forms[0]); k++) {
        size_t pl = strlen(forms[k].prefix);
        if (strncmp(cn, forms[k].prefix, pl) != 0) {
            continue;
        }
        const char *d = cn + pl;
        size_t n = strlen(d);
        if (n == 0 || n > 5 || d[0] == '0') {
            return none;
        }
        unsigned v = 0;
        for (size_t i = 0; i < n; i++) {
            if (d[i] < '0' || d[i] > '9') {
                return none;
            }
            v = v * 10 + (unsigned)(d[i] - '0');
        }
        if (v > 65535) {
            return none;
        }
        return (struct ida_tls_identity){forms[k].kind, v};
    }
    return none;
}

/* The identity of @x: its one subject CN, parsed. */
static struct ida_tls_identity cert_identity(X509 *x)
{
    struct ida_tls_identity none = {IDA_TLS_NONE, 0};
    X509_NAME *name = x != NULL ? X509_get_subject_name(x) : NULL;
    if (name == NULL) {
        return none;
    }
    int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
    if (i < 0 || X509_NAME_get_index_by_NID(name, NID_commonName, i) >= 0) {
        return none; /* no CN, or two: ambiguous */
    }
    ASN1_STRING *s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    int len = ASN1_STRING_length(s);
    const unsigned char *p = ASN1_STRING_get0_data(s);
    char cn[64];
    if (len <= 0 || (size_t)len >= sizeof(cn) ||
        memchr(p, '\0', (size_t)len) != NULL) {
        return none;
    }
    memcpy(cn, p, (size_t)len);
    cn[len] = '\0';
    return ida_tls_identity_parse(cn);
}

const char *ida_tls_identity_text(struct ida_tls_identity id,
                                  char *buf,
                                  size_t cap)
{
    if (id.kind == IDA_TLS_NODE) {
        snprintf(buf, cap, "node %u", id.id);
    } else if (id.kind == IDA_TLS_CLIENT_ID) {
        snprintf(buf, cap, "client %u", id.id);
    } else {
        snprintf(buf, cap, "no idalloc identity");
    }
    return buf;
}

/* --- contexts ------------------------------------------------------------ */

/* A clear message for a file we cannot open, before OpenSSL's reason. */
static int check_readable(const char *what, const char *path, char *errmsg)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "cannot read %s %s: %s", what, path,
                 strerror(errno));
        return IDA_ECONFIG;
    }
    fclose(f);
    return 0;
}

/* Our certificate must chain to the CA we trust: a node given a
 * certificate of another cluster's CA would be refused by every peer. */
static int check_own_chain(SSL_CTX *ctx, const char *cert_file, char *errmsg)
{
    X509 *x = SSL_CTX_get0_certificate(ctx);
    X509_STORE_CTX *sc = X509_STORE_CTX_new();
    if (sc == NULL) {
        return IDA_ENOMEM;
    }
    int rv = 0;
    if (X509_STORE_CTX_init(sc, SSL_CTX_get_cert_store(ctx), x, NULL) != 1) {
        rv = IDA_ENOMEM;
    } else if (X509_verify_cert(sc) != 1) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "certificate %s does not verify against the CA: %s", cert_file,
                 X509_verify_cert_error_string(X509_STORE_CTX_get_error(sc)));
        rv = IDA_ECONFIG;
    }
    X509_STORE_CTX_free(sc);
    ERR_clear_error();
    return rv;
}

static int load_files(struct ida_tls_ctx *c,
                      const char *ca_file,
                      const char *cert_file,
                      const char *key_file,
                      char *errmsg)
{
    char why[160];
    int rv = check_readable("CA certificate", ca_file, errmsg);
    if (rv != 0) {
        return rv;
    }
    if (SSL_CTX_load_verify_locations(c->ssl, ca_file, NULL) != 1) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "bad CA certificate %s: %s", ca_file,
                 ossl_reason(why, sizeof(why), "not a PEM certificate"));
        return IDA_ECONFIG;
    }
    if (c->role != IDA_TLS_CLIENT) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca_file);
        if (names != NULL) {
            SSL_CTX_set_client_CA_list(c->ssl, names); /* takes ownership */
        }
    }
    if (cert_file == NULL) {
        return 0;
    }
    if ((rv = check_readable("certificate", cert_file, errmsg)) != 0 ||
        (rv = check_readable("key", key_file, errmsg)) != 0) {
        return rv;
    }
    if (SSL_CTX_use_certificate_file(c->ssl, cert_file, SSL_FILETYPE_PEM) !=
        1) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "bad certificate %s: %s", cert_file,
                 ossl_reason(why, sizeof(why), "not a PEM certificate"));
        return IDA_ECONFIG;
    }
    if (SSL_CTX_use_PrivateKey_file(c->ssl, key_file, SSL_FILETYPE_PEM) != 1) {
        if (ERR_GET_REASON(ERR_peek_last_error()) ==
            X509_R_KEY_VALUES_MISMATCH) {
            ERR_clear_error();
            snprintf(errmsg, IDA_ERRMSG_MAX,
                     "key %s does not belong to certificate %s", key_file,
                     cert_file);
            return IDA_ECONFIG;
        }
        snprintf(errmsg, IDA_ERRMSG_MAX, "bad key %s: %s", key_file,
                 ossl_reason(why, sizeof(why), "not a PEM private key"));
        return IDA_ECONFIG;
    }
    if (SSL_CTX_check_private_key(c->ssl) != 1) {
        ERR_clear_error();
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "key %s does not belong to certificate %s", key_file,
                 cert_file);
        return IDA_ECONFIG;
    }
    c->self = cert_identity(SSL_CTX_get0_certificate(c->ssl));
    return check_own_chain(c->ssl, cert_file, errmsg);
}

int ida_tls_ctx_new(enum ida_tls_role role,
                    const char *ca_file,
                    const char *cert_file,
                    const char *key_file,
                    struct ida_tls_ctx **out,
                    char *errmsg)
{
    errmsg[0] = '\0';
    if (ca_file == NULL || (cert_file == NULL) != (key_file == NULL) ||
        (role != IDA_TLS_CLIENT && cert_file == NULL)) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "TLS needs a CA file, and a certificate with its key (a "
                 "server always)");
        return IDA_EINVAL;
    }
    struct ida_tls_ctx *c = OPENSSL_zalloc(sizeof(*c));
    if (c == NULL) {
        return IDA_ENOMEM;
    }
    c->role = role;
    c->ssl = SSL_CTX_new(role == IDA_TLS_CLIENT ? TLS_client_method()
                                                : TLS_server_method());
    if (c->ssl == NULL) {
        OPENSSL_free(c);
        return IDA_ENOMEM;
    }
    SSL_CTX_set_min_proto_version(c->ssl, TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(c->ssl, TLS1_3_VERSION);
    /* Long-lived links: no resumption, so no tickets to send or keep. */
    SSL_CTX_set_session_cache_mode(c->ssl, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(c->ssl, 0);
    /* An idle connection keeps no 34 KiB of record buffers. */
    SSL_CTX_set_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
    int verify = role == IDA_TLS_SERVER_MUTUAL
                     ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                     : SSL_VERIFY_PEER;
    SSL_CTX_set_verify(c->ssl, verify, NULL);
    SSL_CTX_set_verify_depth(c->ssl, 4);
    int rv = load_files(c, ca_file, cert_file, key_file, errmsg);
    if (rv != 0) {
        ida_tls_ctx_free(c);
        return rv;
    }
    *out = c;
    return 0;
}

void ida_tls_ctx_free(struct ida_tls_ctx *c)
{
    if (c != NULL) {
        SSL_CTX_free(c->ssl);
        OPENSSL_free(c);
    }
}

struct ida_tls_identity ida_tls_ctx_identity(const struct ida_tls_ctx *c)
{
    return c->self;
}

/* --- sessions ------------------------------------------------------------ */

static int fail(struct ida_tls *s, const char *fmt, const char *arg)
{
    s->failed = IDA_EPROTO;
    snprintf(s->errmsg, sizeof(s->errmsg), fmt, arg);
    ERR_clear_error();
    return IDA_EPROTO;
}

/* A failed handshake or record: say why, the verification result first. */
static int fail_ssl(struct ida_tls *s, int ret)
{
    char why[160];
    int e = SSL_get_error(s->ssl, ret);
    long vr = SSL_get_verify_result(s->ssl);
    if (vr != X509_V_OK) {
        return fail(s, "peer certificate refused: %s",
                    X509_verify_cert_error_string(vr));
    }
    if (e == SSL_ERROR_SSL) {
        return fail(s, "TLS failure: %s",
                    ossl_reason(why, sizeof(why), "protocol error"));
    }
    snprintf(why, sizeof(why), "SSL error %d", e);
    return fail(s, "TLS failure: %s", why);
}

int ida_tls_new(struct ida_tls_ctx *c, struct ida_tls **out)
{
    struct ida_tls *s = OPENSSL_zalloc(sizeof(*s));
    if (s == NULL) {
        return IDA_ENOMEM;
    }
    s->ssl = SSL_new(c->ssl);
    s->rbio = BIO_new(BIO_s_mem());
    s->wbio = BIO_new(BIO_s_mem());
    if (s->ssl == NULL || s->rbio == NULL || s->wbio == NULL) {
        BIO_free(s->rbio);
        BIO_free(s->wbio);
        SSL_free(s->ssl);
        OPENSSL_free(s);
        ERR_clear_error();
        return IDA_ENOMEM;
    }
    /* An empty input BIO means "wait for more", not end of stream. */
    BIO_set_mem_eof_return(s->rbio, -1);
    SSL_set_bio(s->ssl, s->rbio, s->wbio); /* the SSL owns both */
    if (c->role == IDA_TLS_CLIENT) {
        SSL_set_connect_state(s->ssl);
        ERR_clear_error();
        int r = SSL_do_handshake(s->ssl); /* writes the ClientHello */
        int e = SSL_get_error(s->ssl, r);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            fail_ssl(s, r);
        }
    } else {
        SSL_set_accept_state(s->ssl);
    }
    *out = s;
    return 0;
}

void ida_tls_free(struct ida_tls *s)
{
    if (s != NULL) {
        SSL_free(s->ssl);
        OPENSSL_free(s);
    }
}

int ida_tls_feed(struct ida_tls *s,
                 const uint8_t *data,
                 size_t len,
                 ida_tls_plain_cb cb,
                 void *arg)
{
    if (s->failed) {
        return s->failed;
    }
    ERR_clear_error();
    while (len > 0) {
        int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
        int w = BIO_write(s->rbio, data, chunk);
        if (w <= 0) {
            ERR_clear_error();
            return IDA_ENOMEM;
        }
        data += w;
        len -= (size_t)w;
    }
    if (!s->ready) {
        int r = SSL_do_handshake(s->ssl);
        if (r != 1) {
            int e = SSL_get_error(s->ssl, r);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                return 0;
            }
            return fail_ssl(s, r);
        }
        s->ready = 1;
        X509 *x = SSL_get0_peer_certificate(s->ssl);
        s->peer = cert_identity(x);
    }
    uint8_t buf[TLS_READ_CHUNK_BYTES];
    for (;;) {
        int n = SSL_read(s->ssl, buf, sizeof(buf));
        if (n > 0) {
            int rv = cb(arg, buf, (size_t)n);
            if (rv != 0) {
                return rv;
            }
            continue;
        }
        int e = SSL_get_error(s->ssl, n);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            return 0;
        }
        if (e == SSL_ERROR_ZERO_RETURN) {
            return IDA_ECLOSED;
        }
        return fail_ssl(s, n);
    }
}

int ida_tls_ready(const struct ida_tls *s)
{
    return s->ready;
}

struct ida_tls_identity ida_tls_peer(const struct ida_tls *s)
{
    return s->peer;
}

int ida_tls_write(struct ida_tls *s, const uint8_t *data, size_t len)
{
    IDA_ASSERT(s->ready); /* the caller writes only after the handshake */
    if (s->failed) {
        return s->failed;
    }
    ERR_clear_error();
    while (len > 0) {
        int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
        int w = SSL_write(s->ssl, data, chunk);
        if (w <= 0) {
            return fail_ssl(s, w);
        }
        data += w;
        len -= (size_t)w;
    }
    return 0;
}

size_t ida_tls_out_pending(const struct ida_tls *s)
{
    return BIO_ctrl_pending(s->wbio);
}

size_t ida_tls_out_take(struct ida_tls *s, uint8_t *buf, size_t cap)
{
    int chunk = cap > (1u << 30) ? 1 << 30 : (int)cap;
    int n = BIO_read(s->wbio, buf, chunk);
    return n > 0 ? (size_t)n : 0;
}

const char *ida_tls_errmsg(const struct ida_tls *s)
{
    return s->errmsg;
}
