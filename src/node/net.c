/* The node's network (src/node/net.h): the loop thread, the outbox other
 * threads fill, the public calls, and the writes every link shares. Peers
 * this node dials are in net_peer.c, accepted connections in net_conn.c;
 * what they share is in net_internal.h. */
#include "src/node/net.h"

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
#include "src/node/net_internal.h"

/* Frames handed to libuv in one uv_write (one writev) at most. */
#define BATCH_FRAMES_MAX 256

/* --- helpers ----------------------------------------------------------------
 */

int ida__net_to_sockaddr(const struct ida_addr *a, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (a->family == AF_INET6) {
        return uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)ss);
    }
    return uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)ss);
}

/* The loop thread's peer @id, NULL if net does not dial it. */
struct peer *ida__net_peer_by_id(struct ida_net *n, unsigned id)
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

void ida__net_alloc_peer_rbuf(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    struct peer *p = h->data;
    (void)hint;
    *buf = uv_buf_init(p->rbuf, READ_BUF_BYTES);
}

void ida__net_alloc_conn_rbuf(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    struct conn *k = h->data;
    (void)hint;
    *buf = uv_buf_init(k->net->rbuf, READ_BUF_BYTES);
}

/* --- writes -----------------------------------------------------------------
 */

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
            ida__net_client_written(link, m->len);
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

void ida__net_batch_init(struct batch *b)
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
 * counted bytes are released by whoever closes the link
 * (ida__net_conn_close()). */
void ida__net_batch_drop(struct batch *b)
{
    free_chain(b->head);
    ida__net_batch_init(b);
}

/* Hand every frame of @b to libuv on @stream: one uv_write (one writev)
 * for up to BATCH_FRAMES_MAX frames, whose write_cb frees them. On error
 * the frames not handed over are freed, @b is empty and the error is
 * returned: the caller closes the link. */
int ida__net_batch_flush(struct batch *b, uv_stream_t *stream)
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
            ida__net_batch_drop(b);
            return rv;
        }
    }
    ida__net_batch_init(b);
    return 0;
}

/* Write @m on a link at once, through its TLS session when it has one (@tls
 * may be NULL); takes ownership of @m. */
int ida__net_link_write(uv_stream_t *stream,
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
size_t ida__net_link_queued(uv_stream_t *stream,
                            struct ida_tls *tls,
                            const struct batch *b)
{
    return uv_stream_get_write_queue_size(stream) + b->bytes +
           (tls != NULL ? ida_tls_out_pending(tls) : 0);
}

/* Queue @m on a link until ida__net_flush_dirty() at the end of wake_cb(), so
 * that every message of one wake-up leaves in one write: with TLS as a record
 * in the session's output, else in @b. Takes ownership of @m. */
int ida__net_link_queue(struct ida_tls *tls, struct batch *b, struct outmsg *m)
{
    if (tls == NULL) {
        batch_push(b, m);
        return 0;
    }
    int rv = ida_tls_write(tls, m->data, m->len);
    ida_free(m);
    return rv;
}

void ida__net_refusal(struct ida_net *n, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    ida_net_refusal_log(&n->refusals, uv_now(&n->loop), text);
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
            ida__net_peer_remove(n->peers[i], 0);
        }
    }
    while (n->all != NULL) {
        ida__net_conn_close(n->all);
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
        ida__net_apply_peers(n, want, count);
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
            ida__net_send_to_peer(n, m);
        } else {
            ida__net_send_to_client(n, m);
        }
        m = next;
    }
    ida__net_flush_dirty(n);
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
    int rv = ida__net_to_sockaddr(a, &ss);
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
    ida__net_limits_init(n);
    int rv = ida_net_tls_open(cfg->cluster, cfg->self_id, &n->tls, errmsg);
    if (rv == 0 && !cfg->cluster->peer_tls) {
        IDA_WARN(
            "net: peer_tls off: peer links are plaintext and "
            "unauthenticated; anyone who can reach %s can speak as a member",
            self->peer.text);
    }
    if (rv == 0) {
        rv = listen_on(n, &n->peer_listener, &self->peer,
                       ida__net_on_peer_accept, "peer", errmsg);
    }
    if (rv == 0) {
        rv = listen_on(n, &n->client_listener, &self->client,
                       ida__net_on_client_accept, "client", errmsg);
    }
    if (rv != 0) {
        abort_start(n);
        return rv;
    }
    uv_async_init(&n->loop, &n->wake, wake_cb);
    n->wake.data = n;
    ida__net_limits_start(n);
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
    struct outmsg *m = ida__net_new_outmsg(len, IDA_FRAME_PEER);
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
    struct outmsg *m = ida__net_new_outmsg(len, IDA_FRAME_CLIENT_RESPONSE);
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
