/* Accepted connections (struct conn, src/node/net_internal.h): clients, and
 * peers that dialled this node. Their frames, their TLS layer (helpers in
 * src/node/net_tls.c) and the client port's limits (bookkeeping in
 * src/node/netlim.c). */
#include "src/node/net_internal.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/common/frame.h"

/* Client port limits that are not in the cluster file (net.h). */
#define PEER_FRAME_TIMEOUT_MS 30000
#define EVICT_IDLE_MS         1000
#define SUMMARY_MS            1000
#define TRIM_SLACK_BYTES      (1u << 20)

/* --- accepted connections ---------------------------------------------------
 */

static void conn_closed(uv_handle_t *h)
{
    struct conn *k = h->data;
    ida_tls_free(k->tls);
    ida_frame_decoder_close(&k->dec);
    ida_free(k);
}

void ida__net_conn_close(struct conn *k)
{
    struct ida_net *n = k->net;
    if (k->closing) {
        return;
    }
    k->closing = 1;
    ida_netlim_remove(&n->lim, &k->lim);
    n->client_out_bytes -= k->out_bytes; /* write_cb skips closing ones */
    k->out_bytes = 0;
    /* Its frames were counted in out_bytes, released just above. */
    ida__net_batch_drop(&k->out);
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
    ida__net_conn_close(k);
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
        ida__net_conn_close(conn_of(victim));
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
        ida__net_conn_close(k);
    }
}

/* write_cb of a counted reply; @k is still allocated (uv_close runs the
 * cancelled writes' callbacks before its own). */
void ida__net_client_written(struct conn *k, size_t len)
{
    if (k->closing) {
        return; /* ida__net_conn_close() released its bytes */
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
        ida__net_conn_close(conn_of(e));
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
void ida__net_limits_init(struct ida_net *n)
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
void ida__net_limits_start(struct ida_net *n)
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

struct outmsg *ida__net_new_outmsg(size_t payload_len, enum ida_frame_type t)
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
    struct outmsg *m = ida__net_new_outmsg(len, IDA_FRAME_CLIENT_RESPONSE);
    atomic_fetch_add(&n->st_client_rejected, 1);
    IDA_DEBUG("net: client connection %llu: %s", (unsigned long long)k->id,
              why);
    if (m != NULL) {
        idalloc__client_response__pack(&r, m->data + IDA_FRAME_HEADER_BYTES);
        ida__net_link_write((uv_stream_t *)&k->tcp, k->tls, m);
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
    struct peer *p = ida__net_peer_by_id(n, id);
    if (p == NULL || p->state != PEER_DOWN || p->removed || n->loop_stopping) {
        return;
    }
    uv_timer_stop(&p->timer);
    p->backoff_ms = n->cfg.reconnect_min_ms;
    ida__net_peer_connect(p);
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
        ida__net_refusal(n, "dropping peer connection from %s: %s", host, why);
        atomic_fetch_add(&n->st_peer_rejected, 1);
        if (m != NULL) {
            idalloc__peer_message__free_unpacked(m, NULL);
        }
        ida__net_conn_close(k);
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
    ida__net_refusal(n, "peer connection from %s refused: %s%s", host,
                     id.kind == IDA_TLS_CLIENT_ID
                         ? "a client certificate on the peer "
                           "port: "
                         : "its certificate names ",
                     ida_tls_identity_text(id, who, sizeof(who)));
    atomic_fetch_add(&n->st_peer_rejected, 1);
    ida__net_conn_close(k);
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
        ida__net_refusal(
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
        ida__net_conn_close(k);
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
        ida__net_conn_close(k);
        return;
    }
    if (nread == 0) {
        return;
    }
    k->frames = 0;
    int rv = conn_input(k, (const uint8_t *)buf->base, (size_t)nread);
    if (rv != 0 && !k->closing) {
        /* Framing error (garbage, oversized, input cap) or a TLS failure:
         * nothing to answer to. A TLS ida__net_refusal is logged once per
         * reason and address; other client errors are summarised once a second
         * (a flood of them must not flood the log); a peer's is worth a
         * line. */
        if (k->tls != NULL && !k->dec.failed) {
            char host[64];
            ida_net_remote_host(&k->tcp, host, sizeof(host));
            ida__net_refusal(k->net, "%s connection from %s refused: %s",
                             k->is_client ? "client" : "peer", host,
                             ida_tls_errmsg(k->tls)[0] != '\0'
                                 ? ida_tls_errmsg(k->tls)
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
            ida__net_conn_close(k);
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
    ida__net_batch_init(&k->out);
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
    uv_read_start((uv_stream_t *)&k->tcp, ida__net_alloc_conn_rbuf,
                  conn_read_cb);
}

void ida__net_on_client_accept(uv_stream_t *l, int status)
{
    on_accept(l, status, 1);
}

void ida__net_on_peer_accept(uv_stream_t *l, int status)
{
    on_accept(l, status, 0);
}

/* Put @k on the list ida__net_flush_dirty() walks at the end of this wake-up.
 */
static void mark_dirty(struct conn *k)
{
    if (!k->dirty) {
        k->dirty = 1;
        k->dirty_next = k->net->dirty;
        k->net->dirty = k;
    }
}

void ida__net_send_to_client(struct ida_net *n, struct outmsg *m)
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
         * ida__net_flush_dirty(); the per-connection cap counts what the link
         * holds back (libuv's queue and the session's output). The cap across
         * all clients counts plaintext connections only. */
        if (ida__net_link_queued((uv_stream_t *)&k->tcp, k->tls, &k->out) +
                m->len >
            n->cfg.client_queue_bytes_max) {
            ida_free(m);
            limit_close(k, IDA_NETLIM_QUEUE);
            return;
        }
        if (ida__net_link_queue(k->tls, &k->out, m) != 0) {
            ida__net_conn_close(k);
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
        ida__net_link_queue(NULL, &k->out, m);
    }
    mark_dirty(k);
    ida_netlim_touch(&n->lim, &k->lim, loop_ms(n));
    atomic_fetch_add(&n->st_client_replies, 1);
}

/* Hand what wake_cb() queued to libuv: one write per link (TLS records
 * through the session, plaintext frames through ida__net_batch_flush()). */
void ida__net_flush_dirty(struct ida_net *n)
{
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX; i++) {
        struct peer *p = n->peers[i];
        if (p == NULL || p->state != PEER_UP) {
            continue;
        }
        int rv = p->tls != NULL
                     ? ida_net_tls_flush(p->tls, (uv_stream_t *)p->tcp)
                     : ida__net_batch_flush(&p->out, (uv_stream_t *)p->tcp);
        if (rv != 0) {
            ida__net_peer_down(p);
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
                     : ida__net_batch_flush(&k->out, (uv_stream_t *)&k->tcp);
        if (rv != 0) {
            ida__net_conn_close(
                k); /* releases the counts of the frames dropped */
        }
    }
}
