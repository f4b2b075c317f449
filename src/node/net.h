/* The node's network: TCP for peers and clients on one libuv loop.
 *
 * DESIGN: the net module owns a libuv loop running on a thread of its own
 * (a libuv loop belongs to one thread). Other threads never touch libuv
 * handles: they encode a message, append it to the net's outbox (a mutex
 * guarded list) and wake the loop with uv_async_send(), which coalesces, so
 * the loop drains the whole outbox each time.
 *
 * Peers: every node dials every other node and uses that outbound
 * connection only to send; it receives on the connections other nodes
 * dialled to it. So each pair has one connection per direction and there
 * is no tie-breaking. A message to a peer that is not connected is dropped
 * (Raft retransmits), and so is a message that would push the bytes queued
 * to a slow peer past peer_queue_bytes_max: a slow or dead peer never
 * blocks the node or grows its memory. Lost connections are re-dialled
 * with exponential backoff between reconnect_min_ms and reconnect_max_ms.
 * An inbound peer message of another cluster, not addressed to this node,
 * or from an unknown node closes that connection.
 *
 * Clients: each accepted connection gets an id (never reused). Every frame
 * must be a ClientRequest: a frame over max_frame_bytes, of another type,
 * or one that does not decode is answered (when it decodes far enough) or
 * just closes that connection; other connections are unaffected. Replies
 * go to a connection id; a reply to a closed connection is dropped. A client
 * that does not read its replies is disconnected once client_queue_bytes_max
 * is queued to it. RegisterClient requests past the first
 * IDA_NET_REGISTERS_PER_CONN_MAX of a connection are answered IDA_ELIMIT
 * and not passed on (one connection cannot fill the session table).
 *
 * Handler callbacks run on the net thread and must not block: hand the work
 * to another thread and return.
 */
#ifndef IDA_NET_H
#define IDA_NET_H

/* RegisterClient requests accepted on one client connection. */
#define IDA_NET_REGISTERS_PER_CONN_MAX 16

#include <stddef.h>
#include <stdint.h>

#include "proto/idalloc.pb-c.h"
#include "src/common/config.h"

struct ida_net_config
{
    const struct ida_config *cluster; /* borrowed until ida_net_stop() */
    unsigned self_id;
    uint32_t max_frame_bytes;      /* 0: IDA_FRAME_PAYLOAD_BYTES_DEFAULT */
    size_t peer_queue_bytes_max;   /* 0: 64 MiB */
    size_t client_queue_bytes_max; /* 0: 16 MiB */
    unsigned reconnect_min_ms;     /* 0: 50 */
    unsigned reconnect_max_ms;     /* 0: 2000 */
};

struct ida_net_handler
{
    /* A decoded request from client connection @conn_id. Ownership of @req
     * passes to the callee (idalloc__client_request__free_unpacked). */
    void (*client_request)(void *arg,
                           uint64_t conn_id,
                           Idalloc__ClientRequest *req);
    /* A validated peer message (cluster and `to` checked, `from` a known
     * other node). Ownership passes (idalloc__peer_message__free_unpacked). */
    void (*peer_message)(void *arg, Idalloc__PeerMessage *msg);
    /* Our outbound connection to @node_id came up (1) or went down (0). May
     * be NULL. */
    void (*peer_state)(void *arg, unsigned node_id, int up);
    void *arg;
};

struct ida_net_stats
{
    uint64_t peer_sent, peer_dropped, peer_received, peer_rejected;
    uint64_t client_requests, client_replies, client_rejected;
    uint64_t clients_open;
};

struct ida_net;

/* Bind the peer and client addresses of node @cfg->self_id, then start the
 * loop thread. Binding happens before this returns, so "address in use" is
 * reported here (IDA_EIO with the address in @errmsg, IDA_ERRMSG_MAX). Also
 * IDA_EINVAL (self_id not in the cluster) or IDA_ENOMEM. */
int ida_net_start(const struct ida_net_config *cfg,
                  const struct ida_net_handler *h,
                  struct ida_net **out,
                  char *errmsg);

/* Stop: close every connection and listener, join the loop thread, free.
 * Messages still in the outbox are dropped. */
void ida_net_stop(struct ida_net *n);

/* Thread-safe. Encode @m (from, to, cluster and version are filled in here)
 * and queue it for peer @to. Returns 0 (queued; it may still be dropped if
 * the peer is down), IDA_EINVAL (unknown peer), IDA_ETOOBIG, IDA_ENOMEM or
 * IDA_ESTOPPED. @m stays the caller's. */
int ida_net_send_peer(struct ida_net *n, unsigned to, Idalloc__PeerMessage *m);

/* Thread-safe. Encode @r (version filled in) and queue it for client
 * connection @conn_id. Same returns as ida_net_send_peer(). */
int ida_net_reply(struct ida_net *n,
                  uint64_t conn_id,
                  Idalloc__ClientResponse *r);

/* Thread-safe snapshot of the counters. */
void ida_net_get_stats(struct ida_net *n, struct ida_net_stats *out);

/* Whether our outbound connection to @node_id is up. Thread-safe. */
int ida_net_peer_up(struct ida_net *n, unsigned node_id);

#endif /* IDA_NET_H */
