/* The node's TLS: its contexts, the glue between a TLS session
 * (src/common/tls.h) and a libuv stream, and the rate-limited log of
 * refused links. Used by net on its loop thread only (src/node/net_conn.c,
 * net_peer.c).
 *
 * DESIGN: the cluster file's `tls_dir DIR` names the files (README, "TLS"):
 * DIR/ca.crt is the only CA trusted, DIR/nodeI.crt and DIR/nodeI.key are
 * node I's certificate (CN=idalloc-node-I) and key. With `peer_tls` on,
 * every peer link is mutual TLS 1.3: an inbound link must present a node
 * certificate of the CA (a client certificate is refused), an outbound link
 * must reach the node it dialled (its certificate names that node id), and
 * net_conn.c checks that every message's `from` is the node id of the
 * certificate of its link. `client_tls on` lets the client port take TLS
 * and plain connections (told apart by their first byte: a frame starts
 * with IDA_FRAME_MAGIC 0xA1, a TLS ClientHello with 0x16); `required`
 * only TLS with a certificate of the CA.
 *
 * Refusals are logged once per reason and remote address, and again at most
 * every IDA_NET_REFUSAL_LOG_MS with the number of repeats in between, so a
 * misconfigured or hostile peer that reconnects every 50 ms does not flood
 * the log.
 */
#ifndef IDA_NET_TLS_H
#define IDA_NET_TLS_H

#include <stdint.h>
#include <uv.h>

#include "src/common/config.h"
#include "src/common/tls.h"

#define IDA_NET_REFUSAL_LOG_MS 60000
#define IDA_NET_REFUSAL_SLOTS  32

struct ida_net_tls
{
    struct ida_tls_ctx *peer_in;  /* inbound peer links: mutual TLS */
    struct ida_tls_ctx *peer_out; /* outbound peer links */
    struct ida_tls_ctx *client;   /* the client port; NULL when off */
};

/* Load the contexts @cfg asks for (none with peer_tls off and client_tls
 * off: *out is all NULL) for node @self_id. Checks that the node's
 * certificate names node @self_id. Returns 0, IDA_ECONFIG (a file missing,
 * unreadable, mismatched or of another CA; @errmsg names it) or
 * IDA_ENOMEM. On error nothing is left allocated. */
int ida_net_tls_open(const struct ida_config *cfg,
                     unsigned self_id,
                     struct ida_net_tls *out,
                     char *errmsg);
void ida_net_tls_close(struct ida_net_tls *t);

/* Write the ciphertext waiting in @s on @stream (a no-op when none).
 * Returns 0, IDA_ENOMEM or IDA_ECLOSED (the stream refused the write). */
int ida_net_tls_flush(struct ida_tls *s, uv_stream_t *stream);

/* The address of @tcp's remote end without the port ("127.0.0.1"), or
 * "?", into @buf. */
void ida_net_remote_host(uv_tcp_t *tcp, char *buf, size_t cap);

struct ida_net_refusal_slot
{
    char key[192];
    uint64_t last_ms;
    uint64_t repeats;
};

struct ida_net_refusals
{
    struct ida_net_refusal_slot slot[IDA_NET_REFUSAL_SLOTS];
};

/* Log the refusal @text (one line, WARN) unless the same text was logged
 * less than IDA_NET_REFUSAL_LOG_MS before @now_ms; then only count it. */
void ida_net_refusal_log(struct ida_net_refusals *r,
                         uint64_t now_ms,
                         const char *text);

#endif /* IDA_NET_TLS_H */
