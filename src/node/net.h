/* The node's network: TCP for peers and clients on one libuv loop.
 *
 * DESIGN: the net module owns a libuv loop running on a thread of its own
 * (a libuv loop belongs to one thread). Other threads never touch libuv
 * handles: they encode a message, append it to the net's outbox (a mutex
 * guarded list) and wake the loop with uv_async_send(), which coalesces, so
 * the loop drains the whole outbox each time.
 *
 * Peers: every node dials the nodes of its address book and uses that
 * outbound connection only to send; it receives on the connections other
 * nodes dialled to it. So each pair has one connection per direction and
 * there is no tie-breaking. The book starts as the other nodes of the
 * cluster file; the node replaces it whenever its membership in effect
 * changes (ida_net_set_peers(), src/node/book.h): new nodes are dialled,
 * links to nodes no longer named are closed, a node whose address changed
 * is re-dialled at the new one. A message to a peer that is not connected
 * is dropped (Raft retransmits), and so is a message that would push the
 * bytes queued to a slow peer past peer_queue_bytes_max: a slow or dead
 * peer never blocks the node or grows its memory. Lost connections are
 * re-dialled with exponential backoff between reconnect_min_ms and
 * reconnect_max_ms; a peer whose first message arrives on a link it opened
 * is up, so our link to it, if waiting out that backoff, is dialled at
 * once. An inbound peer message of another cluster, not
 * addressed to this node, or claiming id 0 or this node's own id closes
 * that connection; with peer TLS so does a message whose `from` is not the
 * node named by the link's certificate. Messages from a node that is not
 * in the book (a node asking to join, or one the membership dropped) are
 * passed on like the others: the raft processor decides what they may do
 * (src/node/member.h).
 *
 * Clients: each accepted connection gets an id (never reused). Every frame
 * must be a ClientRequest: a frame over max_frame_bytes (refused at its
 * header), of another type, or one that does not decode is answered (when
 * it decodes far enough) or just closes that connection; other connections
 * are unaffected. Replies go to a connection id; a reply to a closed
 * connection is dropped. A client that half-closes (shutdown(SHUT_WR))
 * after its requests still gets their replies; the connection closes once
 * they are written. RegisterClient requests past the first
 * IDA_NET_REGISTERS_PER_CONN_MAX of a connection are answered IDA_ELIMIT
 * and not passed on (one connection cannot fill the session table); one
 * answered with ida_net_reply_uncounted() registered nothing and no longer
 * counts.
 *
 * Limits (the cluster file's client_* lines; src/node/netlim.h has the
 * bookkeeping): at most client_connections_max ordinary client connections
 * plus client_connections_reserve that may only ask for status; when all
 * are taken a new one evicts the least recently active connection idle for
 * a second, or is accepted and closed at once. At start the soft
 * RLIMIT_NOFILE is raised to the hard limit and the two counts are clamped
 * so that descriptors stay for peers (accepted peer connections are capped
 * at 4 per node + 8, the least recently active idle one evicted),
 * outbound links, data files and logs. A client connection is closed after
 * client_idle_timeout_ms without a request or reply, or when a frame is not
 * whole client_frame_timeout_ms after it started (30 s for peers); when its
 * queued replies would pass client_queue_bytes_max (it does not read them);
 * when the replies queued to all clients would pass client_output_bytes_max
 * (the connection with the most queued goes first); and when the partial
 * frames buffered from all clients would pass client_input_bytes_max (the
 * one whose buffer would grow). A buffer grows with the bytes that arrived,
 * never to the announced length at once (src/common/frame.h), so an idle
 * connection costs a few hundred bytes. Closes for these reasons are
 * logged as one summary line a second at most ("net: closed 1000
 * connection(s) in the last 1.0 s: 1000 frame timeout"), and the heap is
 * trimmed (malloc_trim) after large buffers were freed.
 *
 * Handler callbacks run on the net thread and must not block: hand the work
 * to another thread and return.
 */
#ifndef IDA_NET_H
#define IDA_NET_H

/* RegisterClient requests accepted on one client connection. */
#define IDA_NET_REGISTERS_PER_CONN_MAX 16
/* Peers in the book at once (src/node/book.h's NODE_BOOK_MAX fits). */
#define IDA_NET_PEERS_MAX 40
/* The highest node id (the cluster file's rule). */
#define IDA_NET_NODE_ID_MAX 65535

#include <stddef.h>
#include <stdint.h>

#include "proto/idalloc.pb-c.h"
#include "src/common/config.h"

struct ida_net_config
{
    const struct ida_config *cluster; /* borrowed until ida_net_stop() */
    unsigned self_id;
    /* This node's addresses, bound by ida_net_start(); NULL: its line of
     * @cluster. Borrowed until ida_net_stop(). */
    const struct ida_config_node *self;
    uint32_t max_frame_bytes;      /* 0: IDA_FRAME_PAYLOAD_BYTES_DEFAULT */
    size_t peer_queue_bytes_max;   /* 0: 64 MiB */
    size_t client_queue_bytes_max; /* 0: 16 MiB */
    /* Client port limits (the cluster file's lines of the same names). */
    size_t client_output_bytes_max;      /* 0: 64 MiB */
    size_t client_input_bytes_max;       /* 0: 64 MiB */
    unsigned client_connections_max;     /* 0: 4096 */
    unsigned client_connections_reserve; /* status only, past the max */
    unsigned client_idle_timeout_ms;     /* 0: 300000 */
    unsigned client_frame_timeout_ms;    /* 0: 10000 */
    unsigned reconnect_min_ms;           /* 0: 50 */
    unsigned reconnect_max_ms;           /* 0: 2000 */
};

struct ida_net_handler
{
    /* A decoded request from client connection @conn_id. Ownership of @req
     * passes to the callee (idalloc__client_request__free_unpacked). */
    void (*client_request)(void *arg,
                           uint64_t conn_id,
                           Idalloc__ClientRequest *req);
    /* A validated peer message (cluster and `to` checked, `from` another
     * node id, with peer TLS the link certificate's). Ownership passes
     * (idalloc__peer_message__free_unpacked). */
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
    uint64_t clients_closed_by_limits; /* refused, evicted, timed out, capped */
    uint64_t client_input_bytes;       /* partial frames buffered now */
    uint64_t client_output_bytes;      /* replies queued now */
};

struct ida_net;

/* Bind the peer and client addresses of node @cfg->self_id, then start the
 * loop thread, which dials the other nodes of the cluster file. Binding
 * happens before this returns, so "address in use" is reported here
 * (IDA_EIO with the address in @errmsg, IDA_ERRMSG_MAX). Also IDA_EINVAL
 * (no @cfg->self and self_id not in the cluster) or IDA_ENOMEM. */
int ida_net_start(const struct ida_net_config *cfg,
                  const struct ida_net_handler *h,
                  struct ida_net **out,
                  char *errmsg);

/* Stop: close every connection and listener, join the loop thread, free.
 * Messages still in the outbox are dropped. */
void ida_net_stop(struct ida_net *n);

/* A node to dial: its id and peer address. */
struct ida_net_peer
{
    unsigned id;
    struct ida_addr addr;
};

/* Thread-safe. Make @peers (@count; this node's own id is skipped) the
 * address book: from the return on, messages may be sent to exactly these
 * ids; the loop then dials the new ones, closes the links of nodes not
 * named any more and re-dials at its new address a node whose address
 * changed (each logged). Returns 0, or IDA_ELIMIT (more than
 * IDA_NET_PEERS_MAX others; nothing changed). @peers is copied. */
int ida_net_set_peers(struct ida_net *n,
                      const struct ida_net_peer *peers,
                      size_t count);

/* Thread-safe. Encode @m (from, to, cluster and version are filled in here)
 * and queue it for peer @to. Returns 0 (queued; it may still be dropped if
 * the peer is down), IDA_EINVAL (not a peer of the book, or this node),
 * IDA_ETOOBIG, IDA_ENOMEM or IDA_ESTOPPED. @m stays the caller's. */
int ida_net_send_peer(struct ida_net *n, unsigned to, Idalloc__PeerMessage *m);

/* Thread-safe. Encode @r (version filled in) and queue it for client
 * connection @conn_id. Same returns as ida_net_send_peer(). */
int ida_net_reply(struct ida_net *n,
                  uint64_t conn_id,
                  Idalloc__ClientResponse *r);

/* ida_net_reply() answering a RegisterClient of that connection that
 * registered nothing (IDA_ENOTLEADER): it no longer counts toward the
 * connection's IDA_NET_REGISTERS_PER_CONN_MAX, so a client repeating its
 * registration through an election is told "no leader", not the limit. */
int ida_net_reply_uncounted(struct ida_net *n,
                            uint64_t conn_id,
                            Idalloc__ClientResponse *r);

/* Thread-safe snapshot of the counters. */
void ida_net_get_stats(struct ida_net *n, struct ida_net_stats *out);

/* Whether our outbound connection to @node_id is up. Thread-safe. */
int ida_net_peer_up(struct ida_net *n, unsigned node_id);

#endif /* IDA_NET_H */
