/* libidalloc: the I/O thread of a client object (src/client/client.h has
 * the design; the calls' state machine is src/client/call.c).
 *
 * One thread per client runs poll() over a wake pipe and one non-blocking
 * connection per node, opened when a call first needs it. Each pass of the
 * loop takes the calls submitted since the last (the whole queue at once),
 * sweeps failed connections, fires due timers, writes what the calls
 * queued on each connection (every frame queued meanwhile leaves in one
 * send), then sleeps in poll() until a socket, the pipe or the next timer
 * wakes it. Answers are decoded as they arrive and matched to their call by
 * request_seq (a connection's calls in flight are hashed by seq); an
 * earlier attempt's answer that settles a call still live ends it
 * (ida__call_late_answer()), and an answer whose call gave up is dropped. With
 * TLS, each connection's session is driven through memory buffers
 * (src/common/tls.h): the handshake when the TCP connection is up, then
 * ciphertext in and out.
 *
 * A connection that fails (refused, reset, garbage, a TLS failure, no
 * connection or handshake within attempt_timeout_ms) is marked FAILED
 * where it is seen and closed by the next sweep, which fails its calls: the
 * ones sent with IDA_ECLOSED (they may have acted), the ones waiting to be
 * sent as not sent. Nothing closes a socket in the middle of decoding it.
 *
 * Timers: one per call at a time (the attempt's end, a backoff, the call
 * deadline while it waits for the session), in a binary min-heap sized for
 * IDALLOC_IN_FLIGHT_MAX calls, so arming one never allocates.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "src/client/client.h"

/* The client whose I/O thread this is (NULL on every other thread). */
static _Thread_local const struct idalloc_client *tl_loop;

int ida__client_on_loop(const struct idalloc_client *c)
{
    return c != NULL && tl_loop == c;
}

/* --- lists -------------------------------------------------------------- */

void ida__alist_push(struct ida_alist *l, struct ida_acall *a)
{
    IDA_ASSERT(a->list == NULL);
    a->list = l;
    a->next = NULL;
    a->prev = l->tail;
    if (l->tail != NULL) {
        l->tail->next = a;
    } else {
        l->head = a;
    }
    l->tail = a;
}

void ida__alist_del(struct ida_acall *a)
{
    struct ida_alist *l = a->list;
    if (l == NULL) {
        return;
    }
    if (a->prev != NULL) {
        a->prev->next = a->next;
    } else {
        l->head = a->next;
    }
    if (a->next != NULL) {
        a->next->prev = a->prev;
    } else {
        l->tail = a->prev;
    }
    a->list = NULL;
    a->next = a->prev = NULL;
}

struct ida_acall *ida__alist_pop(struct ida_alist *l)
{
    struct ida_acall *a = l->head;
    if (a != NULL) {
        ida__alist_del(a);
    }
    return a;
}

/* --- timers ------------------------------------------------------------- */

static void heap_put(struct idalloc_client *c, size_t i, struct ida_acall *a)
{
    c->heap[i] = a;
    a->heap_at = i;
}

static void sift_up(struct idalloc_client *c, size_t i)
{
    struct ida_acall *a = c->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (c->heap[p]->due_ms <= a->due_ms) {
            break;
        }
        heap_put(c, i, c->heap[p]);
        i = p;
    }
    heap_put(c, i, a);
}

static void sift_down(struct idalloc_client *c, size_t i)
{
    struct ida_acall *a = c->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        uint64_t due = a->due_ms;
        if (l < c->heap_len && c->heap[l]->due_ms < due) {
            m = l;
            due = c->heap[l]->due_ms;
        }
        if (l + 1 < c->heap_len && c->heap[l + 1]->due_ms < due) {
            m = l + 1;
        }
        if (m == i) {
            break;
        }
        heap_put(c, i, c->heap[m]);
        i = m;
    }
    heap_put(c, i, a);
}

void ida__timer_clear(struct idalloc_client *c, struct ida_acall *a)
{
    size_t i = a->heap_at;
    if (i == SIZE_MAX) {
        return;
    }
    a->heap_at = SIZE_MAX;
    struct ida_acall *last = c->heap[--c->heap_len];
    if (i == c->heap_len) {
        return;
    }
    heap_put(c, i, last);
    sift_up(c, i);
    sift_down(c, last->heap_at);
}

void ida__timer_set(struct idalloc_client *c, struct ida_acall *a, uint64_t due)
{
    ida__timer_clear(c, a);
    /* At most IDALLOC_IN_FLIGHT_MAX calls and the registration: the heap
     * was sized for them at start. */
    IDA_ASSERT(c->heap_len < c->heap_cap);
    a->due_ms = due;
    heap_put(c, c->heap_len++, a);
    sift_up(c, a->heap_at);
}

/* --- connections -------------------------------------------------------- */

static void conn_fail(struct ida_client_conn *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void conn_fail(struct ida_client_conn *k, const char *fmt, ...)
{
    if (k->state == IDA_CONN_FAILED) {
        return; /* the first reason is the one */
    }
    k->state = IDA_CONN_FAILED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->why, sizeof(k->why), fmt, ap);
    va_end(ap);
}

/* Append @n bytes to @k's output. */
static int out_append(struct ida_client_conn *k, const uint8_t *p, size_t n)
{
    if (k->out_off > 0 && k->out_len + n > k->out_cap) {
        memmove(k->out, k->out + k->out_off, k->out_len - k->out_off);
        k->out_len -= k->out_off;
        k->out_off = 0;
    }
    if (k->out_len + n > k->out_cap) {
        size_t cap = k->out_cap == 0 ? 4096 : k->out_cap;
        while (cap < k->out_len + n) {
            cap *= 2;
        }
        uint8_t *q = ida_realloc(k->out, cap);
        if (q == NULL) {
            return IDA_ENOMEM;
        }
        k->out = q;
        k->out_cap = cap;
    }
    memcpy(k->out + k->out_len, p, n);
    k->out_len += n;
    return 0;
}

/* Move the ciphertext the TLS session produced into @k's output. */
static int tls_take(struct ida_client_conn *k)
{
    uint8_t buf[16384];
    size_t n;
    while ((n = ida_tls_out_take(k->tls, buf, sizeof(buf))) > 0) {
        if (out_append(k, buf, n) != 0) {
            return IDA_ENOMEM;
        }
    }
    return 0;
}

/* Write as much of @k's output as the socket takes now. */
static void conn_flush(struct ida_client_conn *k)
{
    while (k->out_off < k->out_len) {
        ssize_t w = send(k->fd, k->out + k->out_off, k->out_len - k->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            k->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return; /* poll() says when */
        } else {
            conn_fail(k, "%s: connection closed", k->addr.text);
            k->out_off = k->out_len = 0;
            return;
        }
    }
    k->out_off = k->out_len = 0;
}

/* Put @a on the wire of ready connection @k. */
static void send_now(struct ida_client_conn *k, struct ida_acall *a)
{
    ida__alist_push(&k->bucket[a->req->request_seq % IDA_CONN_BUCKETS], a);
    a->phase = IDA_AC_SENT;
    int rv = k->tls != NULL ? ida_tls_write(k->tls, a->frame, a->frame_len)
                            : out_append(k, a->frame, a->frame_len);
    if (rv == 0 && k->tls != NULL) {
        rv = tls_take(k);
    }
    if (rv != 0) {
        /* The call is on the bucket: the sweep ends its attempt. */
        conn_fail(k, "%s: %s", k->addr.text,
                  rv == IDA_ENOMEM ? "out of memory" : "TLS write failed");
    }
}

static void conn_ready(struct ida_client_conn *k)
{
    k->state = IDA_CONN_READY;
    struct ida_acall *a;
    while ((a = ida__alist_pop(&k->pending)) != NULL) {
        send_now(k, a);
    }
}

/* The TCP connection of @k is up. */
static void conn_connected(struct idalloc_client *c, struct ida_client_conn *k)
{
    int one = 1;
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (c->tls == NULL) {
        conn_ready(k);
        return;
    }
    if (ida_tls_new(c->tls, &k->tls) != 0 || tls_take(k) != 0) {
        conn_fail(k, "%s: out of memory", k->addr.text);
        return;
    }
    k->state = IDA_CONN_HANDSHAKE; /* within the same connect_due_ms */
}

static void conn_connect(struct idalloc_client *c, struct ida_client_conn *k)
{
    const struct ida_addr *a = &k->addr;
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof(ss));
    if (a->family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(a->port);
        inet_pton(AF_INET6, a->host, &s6->sin6_addr);
        sl = sizeof(*s6);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(a->port);
        inet_pton(AF_INET, a->host, &s4->sin_addr);
        sl = sizeof(*s4);
    }
    k->why[0] = '\0';
    k->fd = socket(a->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (k->fd < 0) {
        k->state = IDA_CONN_CONNECTING; /* so that conn_fail() marks it */
        conn_fail(k, "%s: cannot connect (no socket)", a->text);
        return;
    }
    int rv = ida_frame_decoder_init(&k->dec, IDA_FRAME_PAYLOAD_BYTES_DEFAULT);
    IDA_ASSERT(rv == 0);
    k->dec_live = 1;
    k->connect_due_ms = ida__client_now_ms() + c->opts.attempt_timeout_ms;
    k->state = IDA_CONN_CONNECTING;
    rv = connect(k->fd, (struct sockaddr *)&ss, sl);
    if (rv == 0) {
        conn_connected(c, k);
    } else if (errno != EINPROGRESS && errno != EINTR) {
        conn_fail(k, "%s: cannot connect", a->text);
    }
}

static void conn_close(struct ida_client_conn *k)
{
    if (k->fd >= 0) {
        close(k->fd);
        k->fd = -1;
    }
    ida_tls_free(k->tls);
    k->tls = NULL;
    if (k->dec_live) {
        ida_frame_decoder_close(&k->dec);
        k->dec_live = 0;
    }
    k->out_off = k->out_len = 0;
    k->state = IDA_CONN_IDLE;
}

int ida__loop_ready(const struct idalloc_client *c, size_t i)
{
    const struct ida_client_conn *k = &c->conns[i];
    return k->state == IDA_CONN_READY && k->out_off == k->out_len;
}

int ida__loop_flush(struct idalloc_client *c, size_t i)
{
    struct ida_client_conn *k = &c->conns[i];
    conn_flush(k);
    return k->state != IDA_CONN_READY || k->out_off != k->out_len;
}

void ida__loop_send(struct idalloc_client *c, struct ida_acall *a)
{
    struct ida_client_conn *k = &c->conns[a->target];
    if (k->state == IDA_CONN_IDLE) {
        conn_connect(c, k);
    }
    if (k->state == IDA_CONN_READY) {
        send_now(k, a);
        return;
    }
    a->phase = IDA_AC_CONNECT;
    ida__alist_push(&k->pending, a);
}

/* Close failed connections and end their calls' attempts; give up
 * connections that did not come up in time. */
static void sweep(struct idalloc_client *c, uint64_t now)
{
    size_t n = atomic_load(&c->nconns);
    for (size_t i = 0; i < n; i++) {
        struct ida_client_conn *k = &c->conns[i];
        if ((k->state == IDA_CONN_CONNECTING ||
             k->state == IDA_CONN_HANDSHAKE) &&
            now >= k->connect_due_ms) {
            conn_fail(k,
                      k->state == IDA_CONN_HANDSHAKE
                          ? "%s: TLS handshake timed out"
                          : "%s: cannot connect",
                      k->addr.text);
        }
        if (k->state != IDA_CONN_FAILED) {
            continue;
        }
        struct ida_alist unsent = {0}, sent = {0};
        struct ida_acall *a;
        while ((a = ida__alist_pop(&k->pending)) != NULL) {
            ida__alist_push(&unsent, a);
        }
        for (size_t b = 0; b < IDA_CONN_BUCKETS; b++) {
            while ((a = ida__alist_pop(&k->bucket[b])) != NULL) {
                ida__alist_push(&sent, a);
            }
        }
        char why[sizeof(k->why)];
        memcpy(why, k->why, sizeof(why));
        conn_close(k); /* a later attempt connects again */
        while ((a = ida__alist_pop(&unsent)) != NULL) {
            ida__call_attempt_failed(c, a, 0, 0, why);
        }
        while ((a = ida__alist_pop(&sent)) != NULL) {
            ida__call_attempt_failed(c, a, 1, IDA_ECLOSED, NULL);
        }
    }
}

/* --- reading ------------------------------------------------------------ */

struct reader
{
    struct idalloc_client *c;
    struct ida_client_conn *k;
    uint8_t *plain; /* a TLS connection's plaintext of one read */
    size_t plain_len, plain_cap;
};

static int gather_plain(void *arg, const uint8_t *data, size_t len)
{
    struct reader *r = arg;
    if (r->plain_len + len > r->plain_cap) {
        size_t cap = r->plain_cap == 0 ? 65536 : r->plain_cap;
        while (cap < r->plain_len + len) {
            cap *= 2;
        }
        uint8_t *q = ida_realloc(r->plain, cap);
        if (q == NULL) {
            return IDA_ENOMEM;
        }
        r->plain = q;
        r->plain_cap = cap;
    }
    memcpy(r->plain + r->plain_len, data, len);
    r->plain_len += len;
    return 0;
}

static int no_plain(void *arg, const uint8_t *data, size_t len)
{
    (void)arg, (void)data, (void)len;
    return IDA_EPROTO; /* a node says nothing before it is asked */
}

static int on_frame(void *arg,
                    enum ida_frame_type type,
                    const uint8_t *payload,
                    uint32_t len)
{
    struct reader *rd = arg;
    if (type != IDA_FRAME_CLIENT_RESPONSE) {
        return IDA_EPROTO;
    }
    Idalloc__ClientResponse *r =
        idalloc__client_response__unpack(NULL, len, payload);
    if (r == NULL) {
        return IDA_EPROTO;
    }
    struct ida_alist *b = &rd->k->bucket[r->request_seq % IDA_CONN_BUCKETS];
    struct ida_acall *a = b->head;
    while (a != NULL && a->req->request_seq != r->request_seq) {
        a = a->next;
    }
    if (a == NULL) {
        /* An earlier attempt's answer (its call moved on), or its call
         * gave up: then it is dropped. */
        if (!ida__call_late_answer(rd->c, (size_t)(rd->k - rd->c->conns), r)) {
            idalloc__client_response__free_unpacked(r, NULL);
        }
        return 0;
    }
    ida__alist_del(a);
    ida__call_answered(rd->c, a, r);
    return 0;
}

static void conn_read(struct reader *rd)
{
    struct ida_client_conn *k = rd->k;
    uint8_t buf[65536];
    ssize_t n = read(k->fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
    }
    if (n <= 0) {
        conn_fail(k,
                  k->state == IDA_CONN_HANDSHAKE
                      ? "%s: connection closed during the TLS handshake"
                      : "%s: connection closed",
                  k->addr.text);
        return;
    }
    const uint8_t *data = buf;
    size_t len = (size_t)n;
    if (k->state == IDA_CONN_HANDSHAKE) {
        int rv = ida_tls_feed(k->tls, buf, len, no_plain, NULL);
        if (tls_take(k) != 0) {
            conn_fail(k, "%s: out of memory", k->addr.text);
        } else if (rv != 0) {
            conn_fail(k, "%s: %s", k->addr.text, ida_tls_errmsg(k->tls));
            conn_flush(k); /* the alert, if any */
        } else if (ida_tls_ready(k->tls)) {
            char who[48];
            struct ida_tls_identity id = ida_tls_peer(k->tls);
            if (id.kind != IDA_TLS_NODE) {
                conn_fail(k, "%s: its certificate names %s, not a node",
                          k->addr.text,
                          ida_tls_identity_text(id, who, sizeof(who)));
            } else {
                conn_ready(k);
            }
        }
        return;
    }
    if (k->tls != NULL) {
        rd->plain_len = 0;
        int rv = ida_tls_feed(k->tls, buf, len, gather_plain, rd);
        if (tls_take(k) != 0 || rv != 0) {
            conn_fail(k, "%s: %s", k->addr.text,
                      rv != 0 ? ida_tls_errmsg(k->tls) : "out of memory");
            return;
        }
        data = rd->plain;
        len = rd->plain_len;
    }
    if (len > 0 &&
        ida_frame_decoder_feed(&k->dec, data, len, on_frame, rd) != 0) {
        conn_fail(k, "%s: malformed answer (%s)", k->addr.text,
                  k->dec.errmsg[0] != '\0' ? k->dec.errmsg : "not a response");
    }
}

/* The TCP connect of @k ended (poll said writable or error). */
static void conn_connect_done(struct idalloc_client *c,
                              struct ida_client_conn *k)
{
    int err = 0;
    socklen_t el = sizeof(err);
    if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        conn_fail(k, "%s: cannot connect", k->addr.text);
        return;
    }
    conn_connected(c, k);
}

/* --- the loop ----------------------------------------------------------- */

void ida__loop_wake(struct idalloc_client *c)
{
    if (atomic_exchange(&c->wake_pending, 1) == 0) {
        ssize_t w;
        do {
            w = write(c->wake_fd[1], "w", 1);
        } while (w < 0 && errno == EINTR);
        /* EAGAIN: the pipe is full of wake-ups already. */
    }
}

/* Take every call submitted from other threads, then those the loop's
 * own callbacks submitted (which may submit more). */
static void take_submitted(struct idalloc_client *c)
{
    pthread_mutex_lock(&c->q_mu);
    struct ida_acall *a = c->q_head;
    c->q_head = c->q_tail = NULL;
    if (c->closing) {
        c->loop_closing = 1;
    }
    pthread_mutex_unlock(&c->q_mu);
    while (a != NULL) {
        struct ida_acall *next = a->next;
        a->next = NULL;
        ida__call_intake(c, a);
        a = next;
    }
    while ((a = c->lq_head) != NULL) {
        c->lq_head = a->next;
        if (c->lq_head == NULL) {
            c->lq_tail = NULL;
        }
        a->next = NULL;
        ida__call_intake(c, a);
    }
}

static void fire_timers(struct idalloc_client *c, uint64_t now)
{
    while (c->heap_len > 0 && c->heap[0]->due_ms <= now) {
        struct ida_acall *a = c->heap[0];
        ida__timer_clear(c, a);
        ida__call_timer_fired(c, a);
    }
}

/* Milliseconds until the next timer or connect deadline. With none, an
 * attempt's timeout: a call sent meanwhile by another thread (its timer
 * due an attempt's timeout after it) then needs no wake-up. */
static int poll_timeout(struct idalloc_client *c, uint64_t now)
{
    uint64_t due = now + c->opts.attempt_timeout_ms;
    if (c->heap_len > 0) {
        due = c->heap[0]->due_ms;
    }
    size_t n = atomic_load(&c->nconns);
    for (size_t i = 0; i < n; i++) {
        const struct ida_client_conn *k = &c->conns[i];
        if ((k->state == IDA_CONN_CONNECTING ||
             k->state == IDA_CONN_HANDSHAKE) &&
            k->connect_due_ms < due) {
            due = k->connect_due_ms;
        }
    }
    if (due <= now) {
        return 0;
    }
    return due - now > 60000 ? 60000 : (int)(due - now);
}

static void *loop_main(void *arg)
{
    struct idalloc_client *c = arg;
    tl_loop = c;
    pthread_mutex_lock(&c->lp_mu);
    struct reader rd = {.c = c};
    struct pollfd pfd[1 + IDA_CONFIG_NODES_MAX];
    size_t node_of[1 + IDA_CONFIG_NODES_MAX];
    for (;;) {
        take_submitted(c);
        if (c->loop_closing) {
            ida__call_close_all(c);
            take_submitted(c); /* callbacks' submits: refused already */
            if (c->live == NULL) {
                break;
            }
        }
        uint64_t now = ida__client_now_ms();
        sweep(c, now);
        fire_timers(c, now);
        if (c->lq_head != NULL) {
            continue; /* callbacks submitted calls: take them first */
        }
        size_t n = atomic_load(&c->nconns), np = 1;
        int failed = 0;
        pfd[0] = (struct pollfd){.fd = c->wake_fd[0], .events = POLLIN};
        for (size_t i = 0; i < n; i++) {
            struct ida_client_conn *k = &c->conns[i];
            if (k->fd >= 0 && (k->state == IDA_CONN_READY ||
                               k->state == IDA_CONN_HANDSHAKE)) {
                conn_flush(k);
            }
            if (k->state == IDA_CONN_FAILED) {
                failed = 1; /* the next sweep closes it: do not sleep */
            }
            if (k->fd < 0 || k->state == IDA_CONN_FAILED) {
                continue;
            }
            short ev = k->state == IDA_CONN_CONNECTING ? POLLOUT : POLLIN;
            if (k->out_len > k->out_off) {
                ev |= POLLOUT;
            }
            pfd[np] = (struct pollfd){.fd = k->fd, .events = ev};
            node_of[np++] = i;
        }
        uint64_t t = ida__client_now_ms();
        int timeout = failed ? 0 : poll_timeout(c, t);
        c->poll_until = t + (uint64_t)timeout;
        pthread_mutex_unlock(&c->lp_mu);
        int pr = poll(pfd, np, timeout);
        pthread_mutex_lock(&c->lp_mu);
        if (pr <= 0) {
            continue; /* EINTR or a timer */
        }
        if (pfd[0].revents != 0) {
            char drain[64];
            while (read(c->wake_fd[0], drain, sizeof(drain)) > 0) {
            }
            /* After the drain and before taking the queue: a submit after
             * this writes a new byte. */
            atomic_store(&c->wake_pending, 0);
        }
        for (size_t j = 1; j < np; j++) {
            struct ida_client_conn *k = &c->conns[node_of[j]];
            short re = pfd[j].revents;
            if (re == 0 || k->state == IDA_CONN_FAILED) {
                continue;
            }
            if (k->state == IDA_CONN_CONNECTING) {
                conn_connect_done(c, k);
                continue;
            }
            if (re & (POLLIN | POLLERR | POLLHUP)) {
                rd.k = k;
                conn_read(&rd);
            }
            if ((re & POLLOUT) && k->state != IDA_CONN_FAILED) {
                conn_flush(k);
            }
        }
    }
    ida_free(rd.plain);
    pthread_mutex_unlock(&c->lp_mu);
    return NULL;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 ||
                   fcntl(fd, F_SETFD, FD_CLOEXEC) != 0
               ? -1
               : 0;
}

int ida__loop_start(struct idalloc_client *c)
{
    c->heap_cap = IDALLOC_IN_FLIGHT_MAX + 2;
    c->heap = ida_malloc(c->heap_cap * sizeof(*c->heap));
    if (c->heap == NULL) {
        return IDA_ENOMEM;
    }
    c->poll_until = 0;
    if (pipe(c->wake_fd) != 0) {
        c->wake_fd[0] = c->wake_fd[1] = -1;
        return IDA_EIO;
    }
    if (set_nonblock(c->wake_fd[0]) != 0 || set_nonblock(c->wake_fd[1]) != 0 ||
        pthread_create(&c->loop, NULL, loop_main, c) != 0) {
        close(c->wake_fd[0]);
        close(c->wake_fd[1]);
        c->wake_fd[0] = c->wake_fd[1] = -1;
        return IDA_ENOMEM;
    }
    c->loop_running = 1;
    return 0;
}

void ida__loop_stop(struct idalloc_client *c)
{
    pthread_mutex_lock(&c->q_mu);
    c->closing = 1;
    pthread_mutex_unlock(&c->q_mu);
    ida__loop_wake(c);
    pthread_join(c->loop, NULL);
    c->loop_running = 0;
    size_t n = atomic_load(&c->nconns);
    for (size_t i = 0; i < n; i++) {
        conn_close(&c->conns[i]);
        ida_free(c->conns[i].out);
        c->conns[i].out = NULL;
    }
    close(c->wake_fd[0]);
    close(c->wake_fd[1]);
    c->wake_fd[0] = c->wake_fd[1] = -1;
}
