/* TLS engine: OpenSSL driven through memory buffers, for any I/O model.
 *
 * DESIGN: a session never touches a socket. The owner feeds it the bytes
 * that arrived (ciphertext in, ida_tls_feed(), which hands out the
 * plaintext through a callback), gives it plaintext to send
 * (ida_tls_write()) and takes the ciphertext it produced
 * (ida_tls_out_take()) to write wherever it likes. So the node drives it
 * from its libuv loop (src/node/net_tls.h) and the client library from a
 * blocking socket and a reader thread (src/client/client.c), with the same
 * code. TLS 1.3 only; both sides present a certificate of the cluster CA
 * (mutual TLS), except a client on a port that takes clients without one.
 *
 * IDENTITIES: the certificate's subject common name says who holds it
 * (`idalloc certs create` writes these, src/client/cli_certs.h):
 *   CN=idalloc-node-I     node I (I in [1, 65535], decimal, no leading 0)
 *   CN=idalloc-client-J   a client (J in [1, 65535])
 * Anything else, or a certificate with more than one CN, has no identity
 * (IDA_TLS_NONE). Who may use which identity where is the caller's rule
 * (the node accepts only node certificates on its peer port). The CA key
 * is the root of trust: whoever holds it can mint any identity.
 *
 * THREADING: a context is immutable after ida_tls_ctx_new() and may be
 * shared by many sessions on many threads. A session is used by one thread
 * at a time (the caller serialises: the client library holds a mutex).
 *
 * MEMORY: contexts and sessions allocate through OpenSSL (not base/heap.h).
 */
#ifndef IDA_TLS_H
#define IDA_TLS_H

#include <stddef.h>
#include <stdint.h>

enum ida_tls_role {
    IDA_TLS_CLIENT = 1,    /* we dial: verify the server's chain */
    IDA_TLS_SERVER_MUTUAL, /* we accept: a client certificate is required */
    IDA_TLS_SERVER_CERT_OPTIONAL, /* we accept: a certificate is verified if
                                     one is sent, but none is required */
};

enum ida_tls_kind {
    IDA_TLS_NONE = 0, /* no certificate, or one without an idalloc identity */
    IDA_TLS_NODE,
    IDA_TLS_CLIENT_ID,
};

struct ida_tls_identity
{
    enum ida_tls_kind kind;
    unsigned id; /* node or client number; 0 with IDA_TLS_NONE */
};

struct ida_tls_ctx;
struct ida_tls;

/* A context for @role trusting only the CA certificate(s) in @ca_file
 * (PEM). @cert_file/@key_file (PEM) are our certificate and its key; both
 * or neither (a client without a certificate). Every file is read here;
 * the key must match the certificate and the certificate must chain to the
 * CA. Returns 0, IDA_EINVAL (bad arguments), IDA_ECONFIG (a file missing,
 * unreadable, not PEM, a key of another certificate, a certificate of
 * another CA: @errmsg, IDA_ERRMSG_MAX bytes, names the file and the reason)
 * or IDA_ENOMEM. */
int ida_tls_ctx_new(enum ida_tls_role role,
                    const char *ca_file,
                    const char *cert_file,
                    const char *key_file,
                    struct ida_tls_ctx **out,
                    char *errmsg);
void ida_tls_ctx_free(struct ida_tls_ctx *c);
/* The identity of the context's own certificate (IDA_TLS_NONE without). */
struct ida_tls_identity ida_tls_ctx_identity(const struct ida_tls_ctx *c);

/* A session of @c's role. A client session has its ClientHello ready in
 * the output at once (ida_tls_out_take()). Returns 0 or IDA_ENOMEM. */
int ida_tls_new(struct ida_tls_ctx *c, struct ida_tls **out);
void ida_tls_free(struct ida_tls *s);

/* Plaintext that arrived: @data is borrowed for the call. A nonzero return
 * stops ida_tls_feed(), which returns it. */
typedef int (*ida_tls_plain_cb)(void *arg, const uint8_t *data, size_t len);

/* Feed @len bytes of ciphertext from the network. Advances the handshake,
 * then calls @cb for each piece of plaintext that could be decrypted (in
 * order). Output may be produced (handshake replies, alerts): take it with
 * ida_tls_out_take() after every call. Returns 0 (more input may be
 * needed), IDA_EPROTO (a TLS failure: handshake, verification, a bad
 * record; ida_tls_errmsg() says why; the session is failed and every later
 * call returns IDA_EPROTO), IDA_ECLOSED (the peer sent close_notify) or the
 * callback's value. */
int ida_tls_feed(struct ida_tls *s,
                 const uint8_t *data,
                 size_t len,
                 ida_tls_plain_cb cb,
                 void *arg);

/* Whether the handshake completed (the peer's chain is verified). */
int ida_tls_ready(const struct ida_tls *s);

/* The peer's identity, valid once ida_tls_ready(). */
struct ida_tls_identity ida_tls_peer(const struct ida_tls *s);

/* Encrypt @len bytes of plaintext into the output. Precondition:
 * ida_tls_ready(). Returns 0, IDA_EPROTO (failed session) or IDA_ENOMEM. */
int ida_tls_write(struct ida_tls *s, const uint8_t *data, size_t len);

/* Ciphertext waiting to be sent, and taking up to @cap bytes of it into
 * @buf (returns how many). */
size_t ida_tls_out_pending(const struct ida_tls *s);
size_t ida_tls_out_take(struct ida_tls *s, uint8_t *buf, size_t cap);

/* Why the session failed ("" while healthy). */
const char *ida_tls_errmsg(const struct ida_tls *s);

/* "node 3", "client 2" or "no idalloc identity", into @buf (@cap bytes). */
const char *ida_tls_identity_text(struct ida_tls_identity id,
                                  char *buf,
                                  size_t cap);

/* Parse a subject CN: the identity it names (IDA_TLS_NONE if none). */
struct ida_tls_identity ida_tls_identity_parse(const char *cn);

/* The first byte of a TLS handshake record (a ClientHello starts with it).
 * A frame starts with IDA_FRAME_MAGIC (0xA1), so the first byte of a
 * connection tells the two apart. */
#define IDA_TLS_RECORD_HANDSHAKE 0x16

#endif /* IDA_TLS_H */
