/* The nodes this node dials (struct peer, src/node/net_internal.h) and the
 * book that decides them (ida_net_set_peers(), src/node/net.h). */
#include "src/node/net_internal.h"

#include <stdatomic.h>
#include <string.h>
#include <uv.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"

/* --- peers (outbound) ----------------------------------------------------- */

static void peer_timer_cb(uv_timer_t *t)
{
    ida__net_peer_connect(t->data);
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

/* Close @p's connection (if any): its socket, its TLS session, the frames
 * of this wake-up not handed to libuv yet. */
static void close_link(struct peer *p)
{
    if (p->tcp != NULL) {
        uv_close((uv_handle_t *)p->tcp, peer_tcp_closed);
        p->tcp = NULL;
    }
    ida_tls_free(p->tls);
    p->tls = NULL;
    ida__net_batch_drop(&p->out);
}

/* Drop the connection (if any) and schedule the next attempt. */
void ida__net_peer_down(struct peer *p)
{
    struct ida_net *n = p->net;
    int was_up = p->state == PEER_UP;
    close_link(p);
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
        ida__net_refusal(
            n, "link to node %u (%s) failed: %s", p->id, p->addr.text,
            ida_tls_errmsg(p->tls)[0] != '\0' ? ida_tls_errmsg(p->tls)
                                              : idalloc_strerror(rv));
        ida__net_peer_down(p);
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
    ida__net_refusal(
        n, "link to node %u (%s) refused: its certificate names %s", p->id,
        p->addr.text, ida_tls_identity_text(id, who, sizeof(who)));
    ida__net_peer_down(p);
}

static void peer_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct peer *p = s->data;
    if (nread < 0) { /* EOF or error: the peer went away */
        ida__net_peer_down(p);
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
        return; /* closed while connecting (stop or ida__net_peer_down) */
    }
    if (status != 0) {
        ida__net_peer_down(p);
        return;
    }
    uv_tcp_nodelay(p->tcp, 1);
    uv_read_start((uv_stream_t *)p->tcp, ida__net_alloc_peer_rbuf,
                  peer_read_cb);
    if (n->tls.peer_out == NULL) {
        peer_up(p);
        return;
    }
    /* Up only once the handshake proved whom we reached. */
    if (ida_tls_new(n->tls.peer_out, &p->tls) != 0 ||
        ida_net_tls_flush(p->tls, (uv_stream_t *)p->tcp) != 0) {
        ida__net_peer_down(p);
    }
}

void ida__net_peer_connect(struct peer *p)
{
    struct ida_net *n = p->net;
    if (n->loop_stopping || p->removed || p->state != PEER_DOWN) {
        return;
    }
    struct sockaddr_storage ss;
    ida__net_to_sockaddr(&p->addr, &ss);
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
        ida__net_peer_down(p);
    }
}

void ida__net_send_to_peer(struct ida_net *n, struct outmsg *m)
{
    struct peer *p = ida__net_peer_by_id(n, m->peer);
    if (p == NULL || p->state != PEER_UP ||
        ida__net_link_queued((uv_stream_t *)p->tcp, p->tls, &p->out) + m->len >
            n->cfg.peer_queue_bytes_max) {
        atomic_fetch_add(&n->st_peer_dropped, 1);
        ida_free(m);
        return;
    }
    if (ida__net_link_queue(p->tls, &p->out, m) != 0) {
        atomic_fetch_add(&n->st_peer_dropped, 1);
        ida__net_peer_down(p);
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
    ida__net_batch_init(&p->out);
    uv_timer_init(&n->loop, &p->timer);
    p->timer.data = p;
    p->refs = 1; /* the timer: peer_timer_closed() */
    n->peers[slot] = p;
    atomic_store(&n->slot_id[slot], p->id);
    atomic_store(&n->peer_up[slot], 0);
    ida__net_peer_connect(p);
}

/* @p leaves the book: its link closes, its memory goes with the last
 * handle (peer_release()). @notify: tell the handler if it was up. */
void ida__net_peer_remove(struct peer *p, int notify)
{
    struct ida_net *n = p->net;
    int was_up = p->state == PEER_UP;
    n->peers[p->slot] = NULL;
    atomic_store(&n->slot_id[p->slot], 0);
    atomic_store(&n->peer_up[p->slot], 0);
    p->removed = 1;
    p->state = PEER_DOWN;
    close_link(p);
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
        ida__net_peer_down(p);
    }
    p->backoff_ms = n->cfg.reconnect_min_ms;
    uv_timer_start(&p->timer, peer_timer_cb, 0, 0);
}

/* Make @want (@count) the peers: dial new ones, close links to the nodes
 * it no longer names, move those whose address changed. */
void ida__net_apply_peers(struct ida_net *n,
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
            ida__net_peer_remove(p, 1);
        } else if (strcmp(want[k].addr.text, p->addr.text) != 0) {
            IDA_INFO("net: node %u moved from %s to %s", p->id, p->addr.text,
                     want[k].addr.text);
            peer_move(p, &want[k].addr);
        }
    }
    for (size_t k = 0; k < count; k++) {
        if (ida__net_peer_by_id(n, want[k].id) == NULL) {
            peer_add(n, &want[k]);
        }
    }
}
