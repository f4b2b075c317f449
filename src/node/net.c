/* The node's network (src/node/net.h). Longer than STYLE's 800 lines:
 * peers and the book that decides them (section "the book"), accepted
 * connections, their TLS layer (the section "the TLS layer
 * of accepted connections", helpers in src/node/net_tls.c) and the client
 * port's limits (section "client port limits", bookkeeping in
 * src/node/netlim.c) share struct peer and struct conn; splitting them into
 * files needs an internal header carrying both (left for later). */
#include "src/node/net.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/common/frame.h"
#include "src/node/net_tls.h"
#include "src/node/netlim.h"

#define BUCKETS        1024
#define READ_BUF_BYTES 65536
/* Client port limits that are not in the cluster file (net.h). */
#define PEER_FRAME_TIMEOUT_MS 30000
#define EVICT_IDLE_MS         1000
#define SUMMARY_MS            1000
#define TRIM_SLACK_BYTES      (1u << 20)
/* Frames handed to libuv in one uv_write (one writev) at most. */
#define BATCH_FRAMES_MAX 256

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

/* --- helpers ----------------------------------------------------------------
 */

static int to_sockaddr(const struct ida_addr *a, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (a->family == AF_INET6) {
        return uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)ss);
    }
    return uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)ss);
}

/* The loop thread's peer @id, NULL if net does not dial it. */
static struct peer *peer_by_id(struct ida_net *n, unsigned id)
{
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX; i++) {
        if (n->peers[i] != NULL && n->peers[i]->id == id) {
            return n->peers[i];
        }
    }
    return NULL;
}

/* Whether @id is among the peers asked for (under mu). */
static int peer_wanted(const struct ida_net *n, unsigned id)
{
    for (size_t i = 0; i < n->n_want; i++) {
        if (n->want[i].id == id) {
            return 1;
        }
    }
    return 0;
}

static void alloc_peer_rbuf(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    struct peer *p = h->data;
    (void)hint;
    *buf = uv_buf_init(p->rbuf, READ_BUF_BYTES);
}

static void alloc_conn_rbuf(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    struct conn *k = h->data;
    (void)hint;
    *buf = uv_buf_init(k->net->rbuf, READ_BUF_BYTES);
}

/* --- writes -----------------------------------------------------------------
 */

static void client_written(struct conn *k, size_t len);

/* The frames of one uv_write, chained from req->data: each counted one
 * releases its bytes of the connection's and the global output count. */
static void write_cb(uv_write_t *req, int status)
{
    struct outmsg *m = req->data;
    /* @req lives in the first frame, freed by the first round. */
    void *link = req->handle->data;
    (void)status; /* a failed write shows up as a read error/EOF too */
    while (m != NULL) {
        struct outmsg *next = m->next;
        if (m->counted) {
            client_written(link, m->len);
        }
        ida_free(m);
        m = next;
    }
}

static void free_chain(struct outmsg *m)
{
    while (m != NULL) {
        struct outmsg *next = m->next;
        ida_free(m);
        m = next;
    }
}

/* Write @m alone on @stream at once; takes ownership of @m. */
static int write_msg(uv_stream_t *stream, struct outmsg *m)
{
    uv_buf_t b = uv_buf_init((char *)m->data, (unsigned)m->len);
    m->next = NULL;
    m->req.data = m;
    int rv = uv_write(&m->req, stream, &b, 1, write_cb);
    if (rv != 0) {
        ida_free(m);
    }
    return rv;
}

/* --- coalesced plaintext writes (struct batch) ---------------------------- */

static void batch_init(struct batch *b)
{
    b->head = NULL;
    b->tail = &b->head;
    b->count = 0;
    b->bytes = 0;
}

static void batch_push(struct batch *b, struct outmsg *m)
{
    m->next = NULL;
    *b->tail = m;
    b->tail = &m->next;
    b->count++;
    b->bytes += m->len;
}

/* Free the frames never handed to libuv (the link is closing). Their
 * counted bytes are released by whoever closes the link (conn_close()). */
static void batch_drop(struct batch *b)
{
    free_chain(b->head);
    batch_init(b);
}

/* Hand every frame of @b to libuv on @stream: one uv_write (one writev)
 * for up to BATCH_FRAMES_MAX frames, whose write_cb frees them. On error
 * the frames not handed over are freed, @b is empty and the error is
 * returned: the caller closes the link. */
static int batch_flush(struct batch *b, uv_stream_t *stream)
{
    uv_buf_t bufs[BATCH_FRAMES_MAX];
    while (b->head != NULL) {
        struct outmsg *first = b->head, *last = NULL, *m = first;
        unsigned nbufs = 0;
        while (m != NULL && nbufs < BATCH_FRAMES_MAX) {
            bufs[nbufs++] = uv_buf_init((char *)m->data, (unsigned)m->len);
            last = m;
            m = m->next;
        }
        last->next = NULL; /* the chain write_cb walks */
        b->head = m;
        first->req.data = first;
        int rv = uv_write(&first->req, stream, bufs, nbufs, write_cb);
        if (rv != 0) {
            free_chain(first);
            batch_drop(b);
            return rv;
        }
    }
    batch_init(b);
    return 0;
}

/* Write @m on a link at once, through its TLS session when it has one (@tls
 * may be NULL); takes ownership of @m. */
static int link_write(uv_stream_t *stream,
                      struct ida_tls *tls,
                      struct outmsg *m)
{
    if (tls == NULL) {
        return write_msg(stream, m);
    }
    int rv = ida_tls_write(tls, m->data, m->len);
    ida_free(m);
    return rv != 0 ? rv : ida_net_tls_flush(tls, stream);
}

/* What a link holds back: libuv's write queue, the frames of this wake-up
 * and, with TLS, ciphertext not handed to libuv yet. */
static size_t link_queued(uv_stream_t *stream,
                          struct ida_tls *tls,
                          const struct batch *b)
{
    return uv_stream_get_write_queue_size(stream) + b->bytes +
           (tls != NULL ? ida_tls_out_pending(tls) : 0);
}

/* Queue @m on a link until flush_dirty() at the end of wake_cb(), so that
 * every message of one wake-up leaves in one write: with TLS as a record
 * in the session's output, else in @b. Takes ownership of @m. */
static int link_queue(struct ida_tls *tls, struct batch *b, struct outmsg *m)
{
    if (tls == NULL) {
        batch_push(b, m);
        return 0;
    }
    int rv = ida_tls_write(tls, m->data, m->len);
    ida_free(m);
    return rv;
}

/* Log a refused or failed link (rate-limited, src/node/net_tls.h). */
static void refusal(struct ida_net *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void refusal(struct ida_net *n, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    ida_net_refusal_log(&n->refusals, uv_now(&n->loop), text);
}

/* --- peers (outbound) ----------------------------------------------------- */

static void peer_connect(struct peer *p);

static void peer_timer_cb(uv_timer_t *t)
{
    peer_connect(t->data);
}

/* One handle of @p is closed: the last one of a removed peer frees it. */
static void peer_release(struct peer *p)
{
    IDA_ASSERT(p->refs > 0);
    if (--p->refs == 0 && p->removed) {
        ida_free(p->rbuf);
        ida_free(p);
    }
}

static void peer_tcp_closed(uv_handle_t *h)
{
    struct peer *p = h->data;
    ida_free(h);
    peer_release(p);
}

static void peer_timer_closed(uv_handle_t *h)
{
    peer_release(h->data);
}

/* Drop the connection (if any) and schedule the next attempt. */
static void peer_down(struct peer *p)
{
    struct ida_net *n = p->net;
    int was_up = p->state == PEER_UP;
    if (p->tcp != NULL) {
        uv_close((uv_handle_t *)p->tcp, peer_tcp_closed);
        p->tcp = NULL;
    }
    ida_tls_free(p->tls);
    p->tls = NULL;
    batch_drop(&p->out);
    p->state = PEER_DOWN;
    atomic_store(&n->peer_up[p->slot], 0);
    if (was_up &&
        uv_now(&n->loop) - p->up_since_ms >= n->cfg.reconnect_max_ms) {
        /* A link that held is re-dialled at once; one that drops right
         * after the handshake (a peer that refuses our certificate only
         * once it has checked it) keeps backing off. */
        p->backoff_ms = n->cfg.reconnect_min_ms;
    }
    if (was_up) {
        IDA_INFO("net: peer %u down", p->id);
        if (n->h.peer_state != NULL) {
            n->h.peer_state(n->h.arg, p->id, 0);
        }
    }
    if (!n->loop_stopping && !p->removed) {
        uv_timer_start(&p->timer, peer_timer_cb, p->backoff_ms, 0);
        p->backoff_ms *= 2;
        if (p->backoff_ms > n->cfg.reconnect_max_ms) {
            p->backoff_ms = n->cfg.reconnect_max_ms;
        }
    }
}

/* The link to @p is ready to carry messages. */
static void peer_up(struct peer *p)
{
    struct ida_net *n = p->net;
    p->state = PEER_UP;
    p->up_since_ms = uv_now(&n->loop);
    atomic_store(&n->peer_up[p->slot], 1);
    IDA_INFO("net: peer %u up (%s%s)", p->id, p->addr.text,
             p->tls != NULL ? ", TLS" : "");
    if (n->h.peer_state != NULL) {
        n->h.peer_state(n->h.arg, p->id, 1);
    }
}

static int ignore_plain(void *arg, const uint8_t *data, size_t len)
{
    (void)arg, (void)data, (void)len;
    return 0; /* data on an outbound link is not expected */
}

/* TLS on an outbound link: the handshake, then the check that the
 * certificate names the node we dialled. */
static void peer_tls_input(struct peer *p, const uint8_t *data, size_t len)
{
    struct ida_net *n = p->net;
    int rv = ida_tls_feed(p->tls, data, len, ignore_plain, NULL);
    /* Also after a failure: the alert tells the other side why. */
    int frv = ida_net_tls_flush(p->tls, (uv_stream_t *)p->tcp);
    rv = rv != 0 ? rv : frv;
    if (rv != 0) {
        refusal(n, "link to node %u (%s) failed: %s", p->id, p->addr.text,
                ida_tls_errmsg(p->tls)[0] != '\0' ? ida_tls_errmsg(p->tls)
                                                  : idalloc_strerror(rv));
        peer_down(p);
        return;
    }
    if (p->state == PEER_UP || !ida_tls_ready(p->tls)) {
        return;
    }
    struct ida_tls_identity id = ida_tls_peer(p->tls);
    if (id.kind == IDA_TLS_NODE && id.id == p->id) {
        peer_up(p);
        return;
    }
    char who[48];
    refusal(n, "link to node %u (%s) refused: its certificate names %s", p->id,
            p->addr.text, ida_tls_identity_text(id, who, sizeof(who)));
    peer_down(p);
}

static void peer_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct peer *p = s->data;
    if (nread < 0) { /* EOF or error: the peer went away */
        peer_down(p);
    } else if (nread > 0 && p->tls != NULL) {
        peer_tls_input(p, (const uint8_t *)buf->base, (size_t)nread);
    }
    /* Plaintext data on an outbound connection is not expected; it is
     * ignored. */
}

static void peer_connect_cb(uv_connect_t *req, int status)
{
    struct peer *p = req->data;
    struct ida_net *n = p->net;
    if (status == UV_ECANCELED) {
        return; /* closed while connecting (stop or peer_down) */
    }
    if (status != 0) {
        peer_down(p);
        return;
    }
    uv_tcp_nodelay(p->tcp, 1);
    uv_read_start((uv_stream_t *)p->tcp, alloc_peer_rbuf, peer_read_cb);
    if (n->tls.peer_out == NULL) {
        peer_up(p);
        return;
    }
    /* Up only once the handshake proved whom we reached. */
    if (ida_tls_new(n->tls.peer_out, &p->tls) != 0 ||
        ida_net_tls_flush(p->tls, (uv_stream_t *)p->tcp) != 0) {
        peer_down(p);
    }
}

static void peer_connect(struct peer *p)
{
    struct ida_net *n = p->net;
    if (n->loop_stopping || p->removed || p->state != PEER_DOWN) {
        return;
    }
    struct sockaddr_storage ss;
    to_sockaddr(&p->addr, &ss);
    p->tcp = ida_malloc(sizeof(*p->tcp));
    if (p->tcp == NULL) {
        uv_timer_start(&p->timer, peer_timer_cb, p->backoff_ms, 0);
        return;
    }
    uv_tcp_init(&n->loop, p->tcp);
    p->tcp->data = p;
    p->refs++; /* peer_tcp_closed() */
    p->connect_req.data = p;
    p->state = PEER_CONNECTING;
    int rv = uv_tcp_connect(&p->connect_req, p->tcp, (struct sockaddr *)&ss,
                            peer_connect_cb);
    if (rv != 0) {
        peer_down(p);
    }
}

static void send_to_peer(struct ida_net *n, struct outmsg *m)
{
    struct peer *p = peer_by_id(n, m->peer);
    if (p == NULL || p->state != PEER_UP ||
        link_queued((uv_stream_t *)p->tcp, p->tls, &p->out) + m->len >
            n->cfg.peer_queue_bytes_max) {
        atomic_fetch_add(&n->st_peer_dropped, 1);
        ida_free(m);
        return;
    }
    if (link_queue(p->tls, &p->out, m) != 0) {
        atomic_fetch_add(&n->st_peer_dropped, 1);
        peer_down(p);
        return;
    }
    atomic_fetch_add(&n->st_peer_sent, 1);
}

/* --- the book: which peers are dialled (ida_net_set_peers()) -------------- */

static void peer_add(struct ida_net *n, const struct ida_net_peer *w)
{
    unsigned slot = 0;
    while (slot < IDA_NET_PEERS_MAX && n->peers[slot] != NULL) {
        slot++;
    }
    struct peer *p =
        slot < IDA_NET_PEERS_MAX ? ida_calloc(1, sizeof(*p)) : NULL;
    char *rbuf = p != NULL ? ida_malloc(READ_BUF_BYTES) : NULL;
    if (rbuf == NULL) {
        /* Raft retransmits to whoever it can reach; the next change of the
         * book tries again. */
        IDA_WARN("net: cannot dial node %u (%s): %s", w->id, w->addr.text,
                 p == NULL && slot == IDA_NET_PEERS_MAX ? "too many peers"
                                                        : "out of memory");
        ida_free(p);
        return;
    }
    p->net = n;
    p->id = w->id;
    p->addr = w->addr;
    p->slot = slot;
    p->rbuf = rbuf;
    p->backoff_ms = n->cfg.reconnect_min_ms;
    batch_init(&p->out);
    uv_timer_init(&n->loop, &p->timer);
    p->timer.data = p;
    p->refs = 1; /* the timer: peer_timer_closed() */
    n->peers[slot] = p;
    atomic_store(&n->slot_id[slot], p->id);
    atomic_store(&n->peer_up[slot], 0);
    peer_connect(p);
}

/* @p leaves the book: its link closes, its memory goes with the last
 * handle (peer_release()). @notify: tell the handler if it was up. */
static void peer_remove(struct peer *p, int notify)
{
    struct ida_net *n = p->net;
    int was_up = p->state == PEER_UP;
    n->peers[p->slot] = NULL;
    atomic_store(&n->slot_id[p->slot], 0);
    atomic_store(&n->peer_up[p->slot], 0);
    p->removed = 1;
    p->state = PEER_DOWN;
    if (p->tcp != NULL) {
        uv_close((uv_handle_t *)p->tcp, peer_tcp_closed);
        p->tcp = NULL;
    }
    ida_tls_free(p->tls);
    p->tls = NULL;
    batch_drop(&p->out);
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, peer_timer_closed);
    if (was_up && notify && n->h.peer_state != NULL) {
        n->h.peer_state(n->h.arg, p->id, 0);
    }
}

/* @p is now at @a: its link to the old address closes and it is dialled
 * at once at the new one. */
static void peer_move(struct peer *p, const struct ida_addr *a)
{
    struct ida_net *n = p->net;
    p->addr = *a;
    if (p->state != PEER_DOWN) {
        peer_down(p);
    }
    p->backoff_ms = n->cfg.reconnect_min_ms;
    uv_timer_start(&p->timer, peer_timer_cb, 0, 0);
}

/* Make @want (@count) the peers: dial new ones, close links to the nodes
 * it no longer names, move those whose address changed. */
static void apply_peers(struct ida_net *n,
                        const struct ida_net_peer *want,
                        size_t count)
{
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX; i++) {
        struct peer *p = n->peers[i];
        if (p == NULL) {
            continue;
        }
        size_t k = 0;
        while (k < count && want[k].id != p->id) {
            k++;
        }
        if (k == count) {
            IDA_INFO("net: node %u (%s) is no longer a peer", p->id,
                     p->addr.text);
            peer_remove(p, 1);
        } else if (strcmp(want[k].addr.text, p->addr.text) != 0) {
            IDA_INFO("net: node %u moved from %s to %s", p->id, p->addr.text,
                     want[k].addr.text);
            peer_move(p, &want[k].addr);
        }
    }
    for (size_t k = 0; k < count; k++) {
        if (peer_by_id(n, want[k].id) == NULL) {
            peer_add(n, &want[k]);
        }
    }
}

/* --- accepted connections ---------------------------------------------------
 */

static void conn_closed(uv_handle_t *h)
{
    struct conn *k = h->data;
    ida_tls_free(k->tls);
    ida_frame_decoder_close(&k->dec);
    ida_free(k);
}

static void conn_close(struct conn *k)
{
    struct ida_net *n = k->net;
    if (k->closing) {
        return;
    }
    k->closing = 1;
    ida_netlim_remove(&n->lim, &k->lim);
    n->client_out_bytes -= k->out_bytes; /* write_cb skips closing ones */
    k->out_bytes = 0;
    batch_drop(&k->out); /* counted in out_bytes, released just above */
    if (k->is_client) {
        struct conn **pp = &n->buckets[k->id % BUCKETS];
        while (*pp != k) {
            pp = &(*pp)->hnext;
        }
        *pp = k->hnext;
        atomic_fetch_sub(&n->st_clients_open, 1);
    }
    if (k->prev != NULL) {
        k->prev->next = k->next;
    } else {
        n->all = k->next;
    }
    if (k->next != NULL) {
        k->next->prev = k->prev;
    }
    uv_close((uv_handle_t *)&k->tcp, conn_closed);
}

/* --- client port limits (net.h, netlim.h) -----------------------------------
 * Everything that enforces a limit is here; the read, accept and write
 * paths only call these. */

static struct conn *conn_of(struct ida_netlim_entry *e)
{
    return (struct conn *)((char *)e - offsetof(struct conn, lim));
}

static uint64_t loop_ms(struct ida_net *n)
{
    return uv_now(&n->loop);
}

/* Close @k for a limit: counted for the summary line, not logged alone. */
static void limit_close(struct conn *k, enum ida_netlim_reason why)
{
    ida_netlim_count(&k->net->lim, why);
    conn_close(k);
}

/* Remember the high-water mark of buffered bytes (for malloc_trim). */
static void note_mem(struct ida_net *n)
{
    size_t now = n->in_budget.used + n->client_out_bytes;
    if (now > n->mem_peak) {
        n->mem_peak = now;
    }
}

/* A new connection: its slot (netlim.h, admission). Returns 0, or -1 when
 * it is refused (the caller closes it). A connection evicted to make room
 * is closed here. */
static int limit_admit(struct conn *k)
{
    struct ida_net *n = k->net;
    struct ida_netlim_entry *victim;
    int cls = ida_netlim_admit(
        &n->lim, k->is_client ? IDA_NETLIM_CLIENT : IDA_NETLIM_PEER, loop_ms(n),
        &victim);
    if (victim != NULL) {
        conn_close(conn_of(victim));
    }
    if (cls < 0) {
        return -1;
    }
    ida_netlim_add(&n->lim, &k->lim, (enum ida_netlim_class)cls, loop_ms(n));
    if (k->is_client) {
        ida_frame_decoder_set_budget(&k->dec, &n->in_budget);
    }
    return 0;
}

/* After a read fed the decoder: activity and the frame timeout. */
static void limit_after_read(struct conn *k)
{
    struct ida_net *n = k->net;
    /* A TLS handshake under way counts as a frame that started: a
     * connection that never finishes it meets the frame timeout. */
    int partial =
        !ida_frame_decoder_idle(&k->dec) || (k->tls != NULL && !k->tls_checked);
    ida_netlim_input(&n->lim, &k->lim, partial, k->frames, loop_ms(n));
    note_mem(n);
}

/* A reserve connection may only ask for status. */
static int limit_allows(const struct conn *k, const Idalloc__ClientRequest *r)
{
    return k->lim.cls != IDA_NETLIM_RESERVE ||
           r->op_case == IDALLOC__CLIENT_REQUEST__OP_STATUS;
}

/* Make room for @len more bytes of replies to @k: the per-connection cap
 * closes @k; the cap of all connections closes the connection with the most
 * queued (perhaps @k) until the rest fits. Returns whether @k stays open. */
static int limit_output(struct conn *k, size_t len)
{
    struct ida_net *n = k->net;
    if (k->out_bytes + len > n->cfg.client_queue_bytes_max) {
        limit_close(k, IDA_NETLIM_QUEUE);
        return 0;
    }
    while (!k->closing &&
           n->client_out_bytes + len > n->cfg.client_output_bytes_max) {
        struct conn *big = k;
        for (struct conn *c = n->all; c != NULL; c = c->next) {
            if (c->is_client && c->out_bytes > big->out_bytes) {
                big = c;
            }
        }
        limit_close(big, IDA_NETLIM_OUTPUT);
    }
    return !k->closing;
}

/* Count @k's queued reply bytes. */
static void limit_queued(struct conn *k, struct outmsg *m)
{
    m->counted = 1;
    k->out_bytes += m->len;
    k->net->client_out_bytes += m->len;
    note_mem(k->net);
}

/* A half-closed client whose replies are all written is closed. */
static void maybe_finish(struct conn *k)
{
    if (k->eof && !k->closing && k->lim.pending == 0 && k->out_bytes == 0) {
        conn_close(k);
    }
}

/* write_cb of a counted reply; @k is still allocated (uv_close runs the
 * cancelled writes' callbacks before its own). */
static void client_written(struct conn *k, size_t len)
{
    if (k->closing) {
        return; /* conn_close() released its bytes */
    }
    k->out_bytes -= len;
    k->net->client_out_bytes -= len;
    maybe_finish(k);
}

/* The client shut its side down with nothing partial buffered: stop
 * reading, answer what it asked, then close (maybe_finish). */
static void client_half_closed(struct conn *k)
{
    k->eof = 1;
    uv_read_stop((uv_stream_t *)&k->tcp);
    maybe_finish(k);
}

static void publish_stats(struct ida_net *n)
{
    uint64_t closed = 0;
    for (int r = 0; r < IDA_NETLIM_REASONS; r++) {
        closed += n->lim.closed_total[r];
    }
    atomic_store(&n->st_limit_closed, closed);
    atomic_store(&n->st_in_bytes, n->in_budget.used);
    atomic_store(&n->st_out_bytes, n->client_out_bytes);
}

/* Timeouts, the summary line, and giving freed memory back. */
static void sweep_cb(uv_timer_t *t)
{
    struct ida_net *n = t->data;
    uint64_t now = loop_ms(n);
    enum ida_netlim_reason why;
    struct ida_netlim_entry *e;
    while ((e = ida_netlim_expired(&n->lim, now, &why)) != NULL) {
        conn_close(conn_of(e));
    }
    char line[256];
    if (ida_netlim_summary(&n->lim, now, line, sizeof(line))) {
        IDA_WARN("net: %s", line);
    }
    size_t in_use = n->in_budget.used + n->client_out_bytes;
    if (n->mem_peak > in_use + TRIM_SLACK_BYTES) {
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        n->mem_peak = in_use;
    }
    publish_stats(n);
}

/* Raise RLIMIT_NOFILE, fit the client connections in it, set up the
 * bookkeeping. Runs in ida_net_start(), before the loop thread. */
static void limits_init(struct ida_net *n)
{
    struct ida_net_config *c = &n->cfg;
    uint64_t nodes = c->cluster->node_count;
    uint64_t peer_max = 4 * nodes + 8;
    uint64_t cmax = c->client_connections_max;
    uint64_t rmax = c->client_connections_reserve;
    uint64_t nofile = ida_netlim_raise_nofile();
    /* Kept for everything but client connections: accepted and outbound
     * peer links, LMDB, logs, listeners, libuv's own. */
    uint64_t fd_reserve = 64 + peer_max + nodes;
    if (nofile > 0 && ida_netlim_clamp(nofile, fd_reserve, &cmax, &rmax)) {
        IDA_WARN(
            "net: RLIMIT_NOFILE is %llu: client connections limited to %llu "
            "(+%llu for status) instead of %u (+%u); raise the hard limit "
            "(ulimit -Hn) to allow more",
            (unsigned long long)nofile, (unsigned long long)cmax,
            (unsigned long long)rmax, c->client_connections_max,
            c->client_connections_reserve);
    }
    struct ida_netlim_config lc = {
        .client_max = cmax,
        .reserve_max = rmax,
        .peer_max = peer_max,
        .idle_timeout_ms = c->client_idle_timeout_ms,
        .frame_timeout_ms = c->client_frame_timeout_ms,
        .peer_frame_timeout_ms = PEER_FRAME_TIMEOUT_MS,
        .evict_idle_ms = EVICT_IDLE_MS,
        .summary_ms = SUMMARY_MS,
    };
    ida_netlim_init(&n->lim, &lc, loop_ms(n));
    n->in_budget.max = c->client_input_bytes_max;
    IDA_INFO(
        "net: client port limits: %llu connections (+%llu for status), idle "
        "%u ms, frame %u ms, queue %zu, output %zu, input %zu bytes; "
        "descriptors %llu",
        (unsigned long long)cmax, (unsigned long long)rmax,
        c->client_idle_timeout_ms, c->client_frame_timeout_ms,
        c->client_queue_bytes_max, c->client_output_bytes_max,
        c->client_input_bytes_max, (unsigned long long)nofile);
}

/* The sweep runs a few times per shortest timeout, at most every 250 ms. */
static void limits_start(struct ida_net *n)
{
    uint64_t every = n->cfg.client_frame_timeout_ms;
    if (n->cfg.client_idle_timeout_ms < every) {
        every = n->cfg.client_idle_timeout_ms;
    }
    every /= 4;
    every = every < 10 ? 10 : every > 250 ? 250 : every;
    uv_timer_init(&n->loop, &n->sweep);
    n->sweep.data = n;
    uv_timer_start(&n->sweep, sweep_cb, every, every);
}

static struct conn *client_by_id(struct ida_net *n, uint64_t id)
{
    for (struct conn *k = n->buckets[id % BUCKETS]; k != NULL; k = k->hnext) {
        if (k->id == id) {
            return k;
        }
    }
    return NULL;
}

static struct outmsg *new_outmsg(size_t payload_len, enum ida_frame_type t)
{
    struct outmsg *m =
        ida_malloc(sizeof(*m) + IDA_FRAME_HEADER_BYTES + payload_len);
    if (m != NULL) {
        memset(m, 0, sizeof(*m)); /* routing fields: set by the caller */
        ida_frame_header_encode(m->data, t, payload_len);
        m->len = IDA_FRAME_HEADER_BYTES + payload_len;
    }
    return m;
}

/* Answer a request with @err without passing it on. */
static void refuse_client(struct conn *k,
                          uint64_t seq,
                          int err,
                          const char *why)
{
    struct ida_net *n = k->net;
    Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    res.error = (uint32_t)err;
    res.error_msg = (char *)why;
    r.version = IDA_WIRE_VERSION;
    r.request_seq = seq;
    r.result = &res;
    size_t len = idalloc__client_response__get_packed_size(&r);
    struct outmsg *m = new_outmsg(len, IDA_FRAME_CLIENT_RESPONSE);
    atomic_fetch_add(&n->st_client_rejected, 1);
    IDA_DEBUG("net: client connection %llu: %s", (unsigned long long)k->id,
              why);
    if (m != NULL) {
        idalloc__client_response__pack(&r, m->data + IDA_FRAME_HEADER_BYTES);
        link_write((uv_stream_t *)&k->tcp, k->tls, m);
    }
}

/* Answer a request that could not be read, then hang up. */
static void reject_client(struct conn *k,
                          uint64_t seq,
                          int err,
                          const char *why,
                          enum ida_netlim_reason reason)
{
    refuse_client(k, seq, err, why);
    limit_close(k, reason); /* uv_close lets queued writes finish or cancel */
}

static int on_client_frame(void *arg,
                           enum ida_frame_type type,
                           const uint8_t *p,
                           uint32_t len)
{
    struct conn *k = arg;
    struct ida_net *n = k->net;
    k->frames++;
    if (type != IDA_FRAME_CLIENT_REQUEST) {
        reject_client(k, 0, IDA_EPROTO, "frame is not a client request",
                      IDA_NETLIM_PROTOCOL);
        return IDA_EPROTO;
    }
    Idalloc__ClientRequest *req = idalloc__client_request__unpack(NULL, len, p);
    if (req == NULL) {
        reject_client(k, 0, IDA_EPROTO, "undecodable client request",
                      IDA_NETLIM_PROTOCOL);
        return IDA_EPROTO;
    }
    if (req->version != IDA_WIRE_VERSION || !limit_allows(k, req)) {
        int busy = req->version == IDA_WIRE_VERSION;
        uint64_t seq = req->request_seq;
        idalloc__client_request__free_unpacked(req, NULL);
        reject_client(k, seq, busy ? IDA_EBUSY : IDA_EVERSION,
                      busy ? "node at its client connection limit: this "
                             "connection may only ask for status"
                           : "unsupported wire version",
                      busy ? IDA_NETLIM_RESERVE_ONLY : IDA_NETLIM_PROTOCOL);
        return busy ? IDA_EBUSY : IDA_EVERSION;
    }
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT &&
        k->registers >= IDA_NET_REGISTERS_PER_CONN_MAX) {
        /* One connection cannot fill the session table (fsm/fsm.h,
         * "Sessions"); an honest client registers once per session. The
         * refused ones are not counted: the count never wraps. */
        uint64_t seq = req->request_seq;
        idalloc__client_request__free_unpacked(req, NULL);
        refuse_client(k, seq, IDA_ELIMIT,
                      "too many session registrations on one connection");
        return 0;
    }
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT) {
        k->registers++;
    }
    atomic_fetch_add(&n->st_client_requests, 1);
    k->lim.pending++;
    n->h.client_request(n->h.arg, k->id, req);
    return 0;
}

/* Node @id spoke first on a link it opened to us: it is up, so our own
 * link to it, if it waits out a reconnect backoff, is dialled now. A node
 * that comes back (a restart, a new data directory) hears from us only on
 * that link (answers to its Hello, a leader's appends and snapshot), and
 * the backoff may have grown to reconnect_max_ms while it was away. Once
 * per inbound connection, so a peer that keeps refusing our link does not
 * make us dial it faster than it dials us. */
static void peer_heard(struct ida_net *n, unsigned id)
{
    struct peer *p = peer_by_id(n, id);
    if (p == NULL || p->state != PEER_DOWN || p->removed || n->loop_stopping) {
        return;
    }
    uv_timer_stop(&p->timer);
    p->backoff_ms = n->cfg.reconnect_min_ms;
    peer_connect(p);
}

static int on_peer_frame(void *arg,
                         enum ida_frame_type type,
                         const uint8_t *p,
                         uint32_t len)
{
    struct conn *k = arg;
    struct ida_net *n = k->net;
    k->frames++;
    Idalloc__PeerMessage *m = type == IDA_FRAME_PEER
                                  ? idalloc__peer_message__unpack(NULL, len, p)
                                  : NULL;
    char bad[128];
    const char *why = m == NULL ? "undecodable or not a peer message"
                      : m->version != IDA_WIRE_VERSION ? "unsupported version"
                      : strcmp(m->cluster, n->cfg.cluster->cluster) != 0
                          ? "message of another cluster"
                      : m->to != n->cfg.self_id ? "message for another node"
                      : m->from == 0 || m->from > IDA_NET_NODE_ID_MAX ||
                              m->from == n->cfg.self_id
                          ? "message from an impossible node id"
                          : NULL;
    if (why == NULL && k->tls != NULL && m->from != k->tls_node_id) {
        /* Only a node's key can speak as that node. */
        snprintf(bad, sizeof(bad),
                 "message from node %u on the link of node %u's certificate",
                 (unsigned)m->from, k->tls_node_id);
        why = bad;
    }
    if (why != NULL) {
        char host[64];
        ida_net_remote_host(&k->tcp, host, sizeof(host));
        refusal(n, "dropping peer connection from %s: %s", host, why);
        atomic_fetch_add(&n->st_peer_rejected, 1);
        if (m != NULL) {
            idalloc__peer_message__free_unpacked(m, NULL);
        }
        conn_close(k);
        return IDA_EPROTO;
    }
    atomic_fetch_add(&n->st_peer_received, 1);
    if (!k->peer_heard) {
        k->peer_heard = 1;
        peer_heard(n, m->from);
    }
    n->h.peer_message(n->h.arg, m);
    return 0;
}

/* --- the TLS layer of accepted connections (src/node/net_tls.h) ------------
 * Under the frame decoder: ciphertext in, plaintext to the decoder. */

/* The identity of an inbound peer link's certificate: a node other than
 * us (any node id: a node that is not a member yet asks to join on such a
 * link; the raft processor decides what its messages may do). The client
 * port takes any certificate of the CA. */
static int conn_tls_check(struct conn *k)
{
    struct ida_net *n = k->net;
    k->tls_checked = 1;
    if (k->is_client) {
        return 0;
    }
    struct ida_tls_identity id = ida_tls_peer(k->tls);
    if (id.kind == IDA_TLS_NODE && id.id != n->cfg.self_id) {
        k->tls_node_id = id.id;
        return 0;
    }
    char who[48], host[64];
    ida_net_remote_host(&k->tcp, host, sizeof(host));
    refusal(n, "peer connection from %s refused: %s%s", host,
            id.kind == IDA_TLS_CLIENT_ID ? "a client certificate on the peer "
                                           "port: "
                                         : "its certificate names ",
            ida_tls_identity_text(id, who, sizeof(who)));
    atomic_fetch_add(&n->st_peer_rejected, 1);
    conn_close(k);
    return IDA_EPROTO;
}

static int conn_plain(void *arg, const uint8_t *data, size_t len)
{
    struct conn *k = arg;
    if (!k->tls_checked) {
        int rv = conn_tls_check(k);
        if (rv != 0) {
            return rv;
        }
    }
    return ida_frame_decoder_feed(
        &k->dec, data, len, k->is_client ? on_client_frame : on_peer_frame, k);
}

/* Bytes that arrived on @k: through TLS when the link has it. */
static int conn_input(struct conn *k, const uint8_t *data, size_t len)
{
    struct ida_net *n = k->net;
    if (k->tls_sniff) {
        /* client_tls on: a frame starts with IDA_FRAME_MAGIC, TLS with a
         * handshake record. */
        k->tls_sniff = 0;
        if (data[0] == IDA_TLS_RECORD_HANDSHAKE &&
            ida_tls_new(n->tls.client, &k->tls) != 0) {
            return IDA_ENOMEM;
        }
    }
    if (k->tls != NULL && !k->tls_checked && data[0] == IDA_FRAME_MAGIC &&
        !ida_tls_ready(k->tls)) {
        /* Say what it is: a node or client configured without TLS. */
        char host[64];
        ida_net_remote_host(&k->tcp, host, sizeof(host));
        refusal(
            n,
            "%s connection from %s refused: plaintext frames on a TLS "
            "port (%s)",
            k->is_client ? "client" : "peer", host,
            k->is_client ? "client_tls required" : "is peer_tls off there?");
        if (k->is_client) {
            atomic_fetch_add(&n->st_client_rejected, 1);
        } else {
            atomic_fetch_add(&n->st_peer_rejected, 1);
        }
        conn_close(k);
        return IDA_EPROTO;
    }
    if (k->tls == NULL) {
        return ida_frame_decoder_feed(
            &k->dec, data, len, k->is_client ? on_client_frame : on_peer_frame,
            k);
    }
    int rv = ida_tls_feed(k->tls, data, len, conn_plain, k);
    if (!k->closing) { /* handshake replies and alerts */
        int frv = ida_net_tls_flush(k->tls, (uv_stream_t *)&k->tcp);
        rv = rv != 0 ? rv : frv;
    }
    if (rv == 0 && !k->tls_checked && ida_tls_ready(k->tls)) {
        rv = conn_tls_check(k);
    }
    return rv;
}

static void conn_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *k = s->data;
    if (nread == UV_EOF && k->is_client && ida_frame_decoder_idle(&k->dec)) {
        client_half_closed(k);
        return;
    }
    if (nread < 0) {
        conn_close(k);
        return;
    }
    if (nread == 0) {
        return;
    }
    k->frames = 0;
    int rv = conn_input(k, (const uint8_t *)buf->base, (size_t)nread);
    if (rv != 0 && !k->closing) {
        /* Framing error (garbage, oversized, input cap) or a TLS failure:
         * nothing to answer to. A TLS refusal is logged once per reason
         * and address; other client errors are summarised once a second
         * (a flood of them must not flood the log); a peer's is worth a
         * line. */
        if (k->tls != NULL && !k->dec.failed) {
            char host[64];
            ida_net_remote_host(&k->tcp, host, sizeof(host));
            refusal(k->net, "%s connection from %s refused: %s",
                    k->is_client ? "client" : "peer", host,
                    ida_tls_errmsg(k->tls)[0] != '\0' ? ida_tls_errmsg(k->tls)
                                                      : idalloc_strerror(rv));
        }
        if (k->is_client) {
            atomic_fetch_add(&k->net->st_client_rejected, 1);
            IDA_DEBUG("net: closing client connection: %s", k->dec.errmsg);
            limit_close(
                k, rv == IDA_EBUSY ? IDA_NETLIM_INPUT : IDA_NETLIM_PROTOCOL);
        } else {
            atomic_fetch_add(&k->net->st_peer_rejected, 1);
            if (k->tls == NULL || k->dec.failed) {
                IDA_WARN("net: closing peer connection: %s", k->dec.errmsg);
            }
            conn_close(k);
        }
    }
    if (!k->closing) {
        limit_after_read(k);
    }
}

/* The TLS of a new connection, by port and setting. */
static int conn_tls_start(struct conn *k)
{
    struct ida_net *n = k->net;
    if (!k->is_client) {
        return n->tls.peer_in != NULL ? ida_tls_new(n->tls.peer_in, &k->tls)
                                      : 0;
    }
    if (n->cfg.cluster->client_tls == IDA_CLIENT_TLS_REQUIRED) {
        return ida_tls_new(n->tls.client, &k->tls);
    }
    k->tls_sniff = n->cfg.cluster->client_tls == IDA_CLIENT_TLS_ON;
    return 0;
}

static void on_accept(uv_stream_t *listener, int status, int is_client)
{
    struct ida_net *n = listener->data;
    if (status != 0) {
        return;
    }
    struct conn *k = ida_calloc(1, sizeof(*k));
    if (k == NULL) {
        return; /* the pending connection stays in the backlog */
    }
    k->net = n;
    k->is_client = is_client;
    batch_init(&k->out);
    ida_frame_decoder_init(&k->dec, n->cfg.max_frame_bytes);
    uv_tcp_init(&n->loop, &k->tcp);
    k->tcp.data = k;
    if (uv_accept(listener, (uv_stream_t *)&k->tcp) != 0 ||
        limit_admit(k) != 0) {
        k->closing = 1; /* refused: closed at once, not left in the backlog */
        uv_close((uv_handle_t *)&k->tcp, conn_closed);
        return;
    }
    uv_tcp_nodelay(&k->tcp, 1);
    if (conn_tls_start(k) != 0) {
        k->closing = 1;
        uv_close((uv_handle_t *)&k->tcp, conn_closed);
        return;
    }
    k->next = n->all;
    if (n->all != NULL) {
        n->all->prev = k;
    }
    n->all = k;
    if (is_client) {
        k->id = ++n->next_conn_id;
        k->hnext = n->buckets[k->id % BUCKETS];
        n->buckets[k->id % BUCKETS] = k;
        atomic_fetch_add(&n->st_clients_open, 1);
    }
    uv_read_start((uv_stream_t *)&k->tcp, alloc_conn_rbuf, conn_read_cb);
}

static void on_client_accept(uv_stream_t *l, int status)
{
    on_accept(l, status, 1);
}

static void on_peer_accept(uv_stream_t *l, int status)
{
    on_accept(l, status, 0);
}

/* Put @k on the list flush_dirty() walks at the end of this wake-up. */
static void mark_dirty(struct conn *k)
{
    if (!k->dirty) {
        k->dirty = 1;
        k->dirty_next = k->net->dirty;
        k->net->dirty = k;
    }
}

static void send_to_client(struct ida_net *n, struct outmsg *m)
{
    struct conn *k = client_by_id(n, m->conn_id);
    if (k == NULL || k->closing) {
        ida_free(m); /* the client went away */
        return;
    }
    if (k->lim.pending > 0) {
        k->lim.pending--;
    }
    if (m->uncount && k->registers > 0) {
        k->registers--;
    }
    if (k->tls != NULL) {
        /* TLS: the reply becomes ciphertext held by the session until
         * flush_dirty(); the per-connection cap counts what the link holds
         * back (libuv's queue and the session's output). The cap across
         * all clients counts plaintext connections only. */
        if (link_queued((uv_stream_t *)&k->tcp, k->tls, &k->out) + m->len >
            n->cfg.client_queue_bytes_max) {
            ida_free(m);
            limit_close(k, IDA_NETLIM_QUEUE);
            return;
        }
        if (link_queue(k->tls, &k->out, m) != 0) {
            conn_close(k);
            return;
        }
    } else {
        /* Plaintext: counted from now (out_bytes covers the batch and
         * libuv's queue), released frame by frame by write_cb. */
        if (!limit_output(k, m->len)) {
            ida_free(m);
            return;
        }
        limit_queued(k, m);
        link_queue(NULL, &k->out, m);
    }
    mark_dirty(k);
    ida_netlim_touch(&n->lim, &k->lim, loop_ms(n));
    atomic_fetch_add(&n->st_client_replies, 1);
}

/* Hand what wake_cb() queued to libuv: one write per link (TLS records
 * through the session, plaintext frames through batch_flush()). */
static void flush_dirty(struct ida_net *n)
{
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX; i++) {
        struct peer *p = n->peers[i];
        if (p == NULL || p->state != PEER_UP) {
            continue;
        }
        int rv = p->tls != NULL
                     ? ida_net_tls_flush(p->tls, (uv_stream_t *)p->tcp)
                     : batch_flush(&p->out, (uv_stream_t *)p->tcp);
        if (rv != 0) {
            peer_down(p);
        }
    }
    while (n->dirty != NULL) {
        struct conn *k = n->dirty;
        n->dirty = k->dirty_next;
        k->dirty = 0;
        if (k->closing) {
            continue;
        }
        int rv = k->tls != NULL
                     ? ida_net_tls_flush(k->tls, (uv_stream_t *)&k->tcp)
                     : batch_flush(&k->out, (uv_stream_t *)&k->tcp);
        if (rv != 0) {
            conn_close(k); /* releases the counts of the frames dropped */
        }
    }
}

/* --- the loop thread --------------------------------------------------------
 */

static void close_all(struct ida_net *n)
{
    uv_close((uv_handle_t *)&n->peer_listener, NULL);
    uv_close((uv_handle_t *)&n->client_listener, NULL);
    uv_close((uv_handle_t *)&n->wake, NULL);
    uv_close((uv_handle_t *)&n->sweep, NULL);
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX; i++) {
        if (n->peers[i] != NULL) {
            peer_remove(n->peers[i], 0);
        }
    }
    while (n->all != NULL) {
        conn_close(n->all);
    }
}

/* Take a new set of peers if one was asked for (ida_net_set_peers()). */
static void take_peers(struct ida_net *n)
{
    struct ida_net_peer want[IDA_NET_PEERS_MAX];
    size_t count = 0;
    pthread_mutex_lock(&n->mu);
    int fresh = n->want_new && !n->stopping;
    if (fresh) {
        count = n->n_want;
        memcpy(want, n->want, count * sizeof(want[0]));
        n->want_new = 0;
    }
    pthread_mutex_unlock(&n->mu);
    if (fresh) {
        apply_peers(n, want, count);
    }
}

static void wake_cb(uv_async_t *a)
{
    struct ida_net *n = a->data;
    take_peers(n);
    pthread_mutex_lock(&n->mu);
    struct outmsg *m = n->out_head;
    n->out_head = NULL;
    n->out_tail = &n->out_head;
    int stopping = n->stopping;
    pthread_mutex_unlock(&n->mu);
    while (m != NULL) {
        struct outmsg *next = m->next;
        if (stopping) {
            ida_free(m);
        } else if (m->to_peer) {
            send_to_peer(n, m);
        } else {
            send_to_client(n, m);
        }
        m = next;
    }
    flush_dirty(n);
    if (stopping && !n->loop_stopping) {
        n->loop_stopping = 1;
        close_all(n);
    }
}

static void loop_main(void *arg)
{
    struct ida_net *n = arg;
    take_peers(n);
    uv_run(&n->loop, UV_RUN_DEFAULT);
}

/* --- public -----------------------------------------------------------------
 */

static int listen_on(struct ida_net *n,
                     uv_tcp_t *t,
                     const struct ida_addr *a,
                     uv_connection_cb cb,
                     const char *what,
                     char *errmsg)
{
    struct sockaddr_storage ss;
    uv_tcp_init(&n->loop, t);
    t->data = n;
    int rv = to_sockaddr(a, &ss);
    if (rv == 0) {
        rv = uv_tcp_bind(t, (struct sockaddr *)&ss, 0);
    }
    if (rv == 0) {
        rv = uv_listen((uv_stream_t *)t, 511, cb);
    }
    if (rv != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "cannot listen on %s address %s: %s",
                 what, a->text, uv_strerror(rv));
        return IDA_EIO;
    }
    return 0;
}

static void set_defaults(struct ida_net_config *c)
{
    if (c->max_frame_bytes == 0) {
        c->max_frame_bytes = IDA_FRAME_PAYLOAD_BYTES_DEFAULT;
    }
    if (c->peer_queue_bytes_max == 0) {
        c->peer_queue_bytes_max = 64u << 20;
    }
    if (c->client_queue_bytes_max == 0) {
        c->client_queue_bytes_max = 16u << 20;
    }
    if (c->client_output_bytes_max == 0) {
        c->client_output_bytes_max = 64u << 20;
    }
    if (c->client_output_bytes_max < c->client_queue_bytes_max) {
        c->client_output_bytes_max = c->client_queue_bytes_max;
    }
    if (c->client_input_bytes_max == 0) {
        c->client_input_bytes_max = 64u << 20;
    }
    if (c->client_connections_max == 0) {
        c->client_connections_max = 4096;
    }
    if (c->client_idle_timeout_ms == 0) {
        c->client_idle_timeout_ms = 300000;
    }
    if (c->client_frame_timeout_ms == 0) {
        c->client_frame_timeout_ms = 10000;
    }
    if (c->reconnect_min_ms == 0) {
        c->reconnect_min_ms = 50;
    }
    if (c->reconnect_max_ms < c->reconnect_min_ms) {
        c->reconnect_max_ms =
            c->reconnect_min_ms > 2000 ? c->reconnect_min_ms : 2000;
    }
}

static void close_walk_cb(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

/* A failed start: close the handles opened so far and free. */
static void abort_start(struct ida_net *n)
{
    uv_walk(&n->loop, close_walk_cb, NULL);
    uv_run(&n->loop, UV_RUN_DEFAULT);
    uv_loop_close(&n->loop);
    ida_net_tls_close(&n->tls);
    pthread_mutex_destroy(&n->mu);
    ida_free(n);
}

int ida_net_start(const struct ida_net_config *cfg,
                  const struct ida_net_handler *h,
                  struct ida_net **out,
                  char *errmsg)
{
    const struct ida_config_node *self =
        cfg->self != NULL ? cfg->self
                          : ida_config_node(cfg->cluster, cfg->self_id);
    if (self == NULL || h->client_request == NULL || h->peer_message == NULL) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "node %u is not in cluster %s",
                 cfg->self_id, cfg->cluster->cluster);
        return IDA_EINVAL;
    }
    struct ida_net *n = ida_calloc(1, sizeof(*n));
    if (n == NULL) {
        return IDA_ENOMEM;
    }
    n->cfg = *cfg;
    set_defaults(&n->cfg);
    n->self = self;
    n->h = *h;
    n->out_tail = &n->out_head;
    pthread_mutex_init(&n->mu, NULL);
    uv_loop_init(&n->loop);
    limits_init(n);
    int rv = ida_net_tls_open(cfg->cluster, cfg->self_id, &n->tls, errmsg);
    if (rv == 0 && !cfg->cluster->peer_tls) {
        IDA_WARN(
            "net: peer_tls off: peer links are plaintext and "
            "unauthenticated; anyone who can reach %s can speak as a member",
            self->peer.text);
    }
    if (rv == 0) {
        rv = listen_on(n, &n->peer_listener, &self->peer, on_peer_accept,
                       "peer", errmsg);
    }
    if (rv == 0) {
        rv = listen_on(n, &n->client_listener, &self->client, on_client_accept,
                       "client", errmsg);
    }
    if (rv != 0) {
        abort_start(n);
        return rv;
    }
    uv_async_init(&n->loop, &n->wake, wake_cb);
    n->wake.data = n;
    limits_start(n);
    /* The peers until the node says otherwise: the other nodes of the
     * cluster file (dialled once the loop runs). */
    for (unsigned i = 0; i < cfg->cluster->node_count; i++) {
        const struct ida_config_node *node = &cfg->cluster->nodes[i];
        if (node->id != cfg->self_id && n->n_want < IDA_NET_PEERS_MAX) {
            n->want[n->n_want++] =
                (struct ida_net_peer){.id = node->id, .addr = node->peer};
        }
    }
    n->want_new = 1;
    if (uv_thread_create(&n->thread, loop_main, n) != 0) {
        abort_start(n);
        return IDA_ENOMEM;
    }
    *out = n;
    return 0;
}

void ida_net_stop(struct ida_net *n)
{
    pthread_mutex_lock(&n->mu);
    n->stopping = 1;
    pthread_mutex_unlock(&n->mu);
    uv_async_send(&n->wake);
    uv_thread_join(&n->thread);
    uv_loop_close(&n->loop); /* every peer was freed by its close callbacks */
    ida_net_tls_close(&n->tls);
    pthread_mutex_destroy(&n->mu);
    ida_free(n);
}

/* Queue @m for the loop thread; frees it when stopping, or when it is for
 * a peer that is not in the book. */
static int enqueue(struct ida_net *n, struct outmsg *m)
{
    pthread_mutex_lock(&n->mu);
    int rv = n->stopping                              ? IDA_ESTOPPED
             : m->to_peer && !peer_wanted(n, m->peer) ? IDA_EINVAL
                                                      : 0;
    if (rv == 0) {
        m->next = NULL;
        *n->out_tail = m;
        n->out_tail = &m->next;
    }
    pthread_mutex_unlock(&n->mu);
    if (rv != 0) {
        ida_free(m);
        return rv;
    }
    uv_async_send(&n->wake);
    return 0;
}

int ida_net_set_peers(struct ida_net *n,
                      const struct ida_net_peer *peers,
                      size_t count)
{
    struct ida_net_peer want[IDA_NET_PEERS_MAX];
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        if (peers[i].id == n->cfg.self_id) {
            continue;
        }
        if (k == IDA_NET_PEERS_MAX) {
            return IDA_ELIMIT;
        }
        want[k++] = peers[i];
    }
    pthread_mutex_lock(&n->mu);
    memcpy(n->want, want, k * sizeof(want[0]));
    n->n_want = k;
    n->want_new = 1;
    pthread_mutex_unlock(&n->mu);
    uv_async_send(&n->wake);
    return 0;
}

int ida_net_send_peer(struct ida_net *n, unsigned to, Idalloc__PeerMessage *pm)
{
    if (to == n->cfg.self_id) {
        return IDA_EINVAL;
    }
    pm->version = IDA_WIRE_VERSION;
    pm->from = n->cfg.self_id;
    pm->to = to;
    pm->cluster = (char *)n->cfg.cluster->cluster;
    size_t len = idalloc__peer_message__get_packed_size(pm);
    if (len > n->cfg.max_frame_bytes) {
        return IDA_ETOOBIG;
    }
    struct outmsg *m = new_outmsg(len, IDA_FRAME_PEER);
    if (m == NULL) {
        return IDA_ENOMEM;
    }
    idalloc__peer_message__pack(pm, m->data + IDA_FRAME_HEADER_BYTES);
    m->to_peer = 1;
    m->peer = to;
    return enqueue(n, m);
}

static int reply(struct ida_net *n,
                 uint64_t conn_id,
                 Idalloc__ClientResponse *r,
                 int uncount)
{
    r->version = IDA_WIRE_VERSION;
    size_t len = idalloc__client_response__get_packed_size(r);
    if (len > n->cfg.max_frame_bytes) {
        return IDA_ETOOBIG;
    }
    struct outmsg *m = new_outmsg(len, IDA_FRAME_CLIENT_RESPONSE);
    if (m == NULL) {
        return IDA_ENOMEM;
    }
    idalloc__client_response__pack(r, m->data + IDA_FRAME_HEADER_BYTES);
    m->conn_id = conn_id;
    m->uncount = uncount;
    return enqueue(n, m);
}

int ida_net_reply(struct ida_net *n,
                  uint64_t conn_id,
                  Idalloc__ClientResponse *r)
{
    return reply(n, conn_id, r, 0);
}

int ida_net_reply_uncounted(struct ida_net *n,
                            uint64_t conn_id,
                            Idalloc__ClientResponse *r)
{
    return reply(n, conn_id, r, 1);
}

void ida_net_get_stats(struct ida_net *n, struct ida_net_stats *out)
{
    *out = (struct ida_net_stats){
        .peer_sent = atomic_load(&n->st_peer_sent),
        .peer_dropped = atomic_load(&n->st_peer_dropped),
        .peer_received = atomic_load(&n->st_peer_received),
        .peer_rejected = atomic_load(&n->st_peer_rejected),
        .client_requests = atomic_load(&n->st_client_requests),
        .client_replies = atomic_load(&n->st_client_replies),
        .client_rejected = atomic_load(&n->st_client_rejected),
        .clients_open = atomic_load(&n->st_clients_open),
        .clients_closed_by_limits = atomic_load(&n->st_limit_closed),
        .client_input_bytes = atomic_load(&n->st_in_bytes),
        .client_output_bytes = atomic_load(&n->st_out_bytes),
    };
}

int ida_net_peer_up(struct ida_net *n, unsigned node_id)
{
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX; i++) {
        if (atomic_load(&n->slot_id[i]) == node_id) {
            return atomic_load(&n->peer_up[i]);
        }
    }
    return 0;
}
