/* The network's internals, shared by its files (src/node/net.h is the
 * contract with the rest of the node). Everything here runs on net's loop
 * thread unless a field says otherwise.
 *
 *   net.c       the loop thread, the outbox other threads fill, the public
 *               calls, writes (struct batch: one uv_write per link per
 *               wake-up) and small helpers;
 *   net_peer.c  the nodes this node dials (struct peer) and the book that
 *               decides them (ida_net_set_peers());
 *   net_conn.c  accepted connections (struct conn): clients and peers
 *               that dialled us, their frames, their TLS layer (helpers in
 *               net_tls.c) and the client port's limits (bookkeeping in
 *               netlim.c). */
#ifndef IDA_NODE_NET_INTERNAL_H
#define IDA_NODE_NET_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "src/common/frame.h"
#include "src/node/net.h"
#include "src/node/net_tls.h"
#include "src/node/netlim.h"

#define BUCKETS        1024
#define READ_BUF_BYTES 65536

/* An encoded frame on its way to a peer or a client connection. Once it is
 * queued on a link, next chains the frames of its batch (struct batch). */
struct outmsg
{
    struct outmsg *next;
    int to_peer;
    unsigned peer;
    uint64_t conn_id;
    int counted; /* in its client connection's out_bytes */
    int uncount; /* ida_net_reply_uncounted(): a registration undone */
    size_t len;
    uv_write_t req; /* used by the first frame of a batch */
    uint8_t data[];
};

/* The plaintext frames queued to one link during one loop wake-up: they
 * leave in one uv_write with a buffer each (batch_flush()). */
struct batch
{
    struct outmsg *head, **tail;
    unsigned count;
    size_t bytes;
};

enum peer_state { PEER_DOWN, PEER_CONNECTING, PEER_UP };

/* A node this node dials (one of the book, ida_net_set_peers()). Its
 * memory lives until every libuv handle it owns is closed: removing a
 * peer closes them, and the last close callback frees it. */
struct peer
{
    struct ida_net *net;
    unsigned id;
    struct ida_addr addr; /* where it is dialled */
    unsigned slot;        /* in ida_net.peers */
    unsigned refs;        /* its handles not closed yet (timer, tcp) */
    int removed;          /* out of the book: freed once refs is 0 */
    uv_tcp_t *tcp;        /* NULL when there is no connection or attempt */
    enum peer_state state;
    uv_connect_t connect_req;
    uv_timer_t timer; /* reconnect backoff */
    unsigned backoff_ms;
    uint64_t up_since_ms; /* loop time the link last came up */
    char *rbuf;           /* outbound connections read only to notice EOF */
    struct ida_tls *tls;  /* with peer_tls: the link's session */
    struct batch out;     /* plaintext: frames of this wake-up */
};

/* An accepted connection: a client, or a peer that dialled us. Reads go
 * through the loop's one buffer (ida_net.rbuf): the decoder copies what it
 * keeps, so an idle connection holds no buffer at all. */
struct conn
{
    uv_tcp_t tcp;
    struct ida_net *net;
    int is_client;
    int closing;
    int eof; /* a client half-closed: answer what it asked, then close */
    uint64_t id;
    unsigned registers;   /* RegisterClient requests passed on, less those
                             answered not leader (clients) */
    struct ida_tls *tls;  /* NULL: plaintext (or not decided yet) */
    int tls_sniff;        /* client_tls on: the first byte decides */
    int tls_checked;      /* the peer's identity was checked */
    unsigned tls_node_id; /* inbound peer link: its certificate's node */
    int dirty;            /* on the net's dirty list (flush_dirty()) */
    struct conn *dirty_next;
    struct batch out; /* plaintext: replies of this wake-up */
    struct ida_frame_decoder dec;
    struct ida_netlim_entry lim; /* limits bookkeeping (netlim.h) */
    size_t out_bytes;            /* client: replies queued, not yet written */
    unsigned frames;             /* whole frames of the current read */
    int peer_heard;              /* peer link: its first message came */
    struct conn *hnext;          /* client id hash chain */
    struct conn *prev, *next;    /* all connections */
};

struct ida_net
{
    struct ida_net_config cfg;
    const struct ida_config_node *self;
    struct ida_net_handler h;
    uv_loop_t loop;
    uv_tcp_t peer_listener, client_listener;
    uv_async_t wake;
    uv_thread_t thread;
    pthread_mutex_t mu; /* guards the outbox and stopping */
    struct outmsg *out_head, **out_tail;
    int stopping;
    int loop_stopping; /* the loop thread's own copy of stopping */
    struct peer *peers[IDA_NET_PEERS_MAX]; /* the loop's; NULL: free slot */
    /* Under mu: the peers other threads asked for (ida_net_set_peers()),
     * to be applied by the loop when want_new, and their ids, to which
     * ida_net_send_peer() may send. */
    struct ida_net_peer want[IDA_NET_PEERS_MAX];
    size_t n_want;
    int want_new;
    struct conn *buckets[BUCKETS];
    struct conn *all;
    uint64_t next_conn_id;
    /* Client port limits (the loop thread's). */
    struct ida_netlim lim;
    struct ida_frame_budget in_budget; /* client decoders' buffers */
    size_t client_out_bytes;           /* replies queued to all clients */
    size_t mem_peak;                   /* of the two since the last trim */
    uv_timer_t sweep;
    char rbuf[READ_BUF_BYTES]; /* every accepted connection reads here */
    /* Each slot's node id and whether its link is up, for other threads. */
    atomic_uint slot_id[IDA_NET_PEERS_MAX];
    atomic_int peer_up[IDA_NET_PEERS_MAX];
    struct ida_net_tls tls;
    struct ida_net_refusals refusals;
    struct conn *dirty; /* client links with output to hand to libuv */
    atomic_uint_fast64_t st_peer_sent, st_peer_dropped, st_peer_received,
        st_peer_rejected, st_client_requests, st_client_replies,
        st_client_rejected, st_clients_open, st_limit_closed, st_in_bytes,
        st_out_bytes;
};

/* --- net.c ---------------------------------------------------------------- */

int ida__net_to_sockaddr(const struct ida_addr *a, struct sockaddr_storage *ss);
/* The loop thread's peer @id, NULL if net does not dial it. */
struct peer *ida__net_peer_by_id(struct ida_net *n, unsigned id);
/* libuv's allocation callbacks: a peer link's own buffer, and the loop's
 * one buffer for every accepted connection. */
void ida__net_alloc_peer_rbuf(uv_handle_t *h, size_t hint, uv_buf_t *buf);
void ida__net_alloc_conn_rbuf(uv_handle_t *h, size_t hint, uv_buf_t *buf);
void ida__net_batch_init(struct batch *b);
/* Free the frames never handed to libuv (the link is closing). Their
 * counted bytes are released by whoever closes the link (conn_close()). */
void ida__net_batch_drop(struct batch *b);
/* Hand every frame of @b to libuv on @stream in one uv_write per
 * BATCH_FRAMES_MAX frames; on error @b is emptied and the error returned:
 * the caller closes the link. */
int ida__net_batch_flush(struct batch *b, uv_stream_t *stream);
/* Write @m on a link at once, through its TLS session when it has one (@tls
 * may be NULL); takes ownership of @m. */
int ida__net_link_write(uv_stream_t *stream,
                        struct ida_tls *tls,
                        struct outmsg *m);
/* What a link holds back: libuv's write queue, the frames of this wake-up
 * and, with TLS, ciphertext not handed to libuv yet. */
size_t ida__net_link_queued(uv_stream_t *stream,
                            struct ida_tls *tls,
                            const struct batch *b);
/* Queue @m on a link until flush_dirty() at the end of the wake-up: with
 * TLS as a record in the session's output, else in @b. Takes ownership. */
int ida__net_link_queue(struct ida_tls *tls, struct batch *b, struct outmsg *m);
/* Log a refused or failed link (rate-limited, src/node/net_tls.h). */
void ida__net_refusal(struct ida_net *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* --- net_peer.c ----------------------------------------------------------- */

/* Dial @p (a peer of the book, down). */
void ida__net_peer_connect(struct peer *p);
/* Drop the connection (if any) and schedule the next attempt. */
void ida__net_peer_down(struct peer *p);
/* @p leaves the book: its link closes, its memory goes with the last
 * handle. @notify: tell the handler if it was up. */
void ida__net_peer_remove(struct peer *p, int notify);
/* Make @want (@count) the peers: dial new ones, close links to the nodes
 * it no longer names, move those whose address changed. */
void ida__net_apply_peers(struct ida_net *n,
                          const struct ida_net_peer *want,
                          size_t count);
/* Queue @m (from the outbox) on its peer's link, or drop it. */
void ida__net_send_to_peer(struct ida_net *n, struct outmsg *m);

/* --- net_conn.c ----------------------------------------------------------- */

/* Close @k (a second call does nothing): out of the limits, the client
 * hash and the list of connections, its queued output's count released,
 * its handle closed (its memory goes in the close callback). */
void ida__net_conn_close(struct conn *k);
/* write_cb of a counted reply; @k is still allocated. */
void ida__net_client_written(struct conn *k, size_t len);
/* Raise RLIMIT_NOFILE, fit the client connections in it, set up the
 * bookkeeping (in ida_net_start(), before the loop thread); then start the
 * sweep (on the loop). */
void ida__net_limits_init(struct ida_net *n);
void ida__net_limits_start(struct ida_net *n);
/* A frame of @payload_len bytes of type @t, its header written and its
 * routing fields zero (the caller sets them); NULL when out of memory. */
struct outmsg *ida__net_new_outmsg(size_t payload_len, enum ida_frame_type t);
/* The listeners' connection callbacks. */
void ida__net_on_client_accept(uv_stream_t *l, int status);
void ida__net_on_peer_accept(uv_stream_t *l, int status);
/* Queue @m (from the outbox) on its client connection, or drop it. */
void ida__net_send_to_client(struct ida_net *n, struct outmsg *m);
/* Hand what the wake-up queued to libuv: one write per link. */
void ida__net_flush_dirty(struct ida_net *n);

#endif /* IDA_NODE_NET_INTERNAL_H */
