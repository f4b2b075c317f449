/* libidalloc: connections, pipelined calls, leader following, retries.
 *
 * DESIGN: one TCP connection per node, opened lazily. A call encodes its
 * ClientRequest, registers a waiter keyed by request_seq on the connection,
 * queues the frame and sleeps on the waiter's condition variable. One call
 * at a time is the connection's writer: it sends every frame queued, and
 * what was queued while it sent, so concurrent calls share one send
 * (conn_flush()). A reader
 * thread per connection decodes frames and hands each response to the
 * waiter with the same request_seq, so many calls from many threads are in
 * flight on one connection at once (pipelining). A response whose waiter
 * gave up is dropped.
 *
 * Outcome: a call that ends without an answer is IDA_EUNAVAIL when the
 * request never reached a node, or reached only nodes that answered "not
 * leader" (not carried out, retrying is safe), else IDA_ETIMEDOUT (it may
 * have taken effect: retry with the same request id).
 *
 * Retries: a call has a request_seq fixed for its whole life. On a timeout,
 * a dead connection or an answer that does not settle it (not leader, busy,
 * leadership lost) it moves on to another node with the SAME client_id and
 * request_seq, following the NOT_LEADER hint when there is one, until the
 * call deadline; the cluster's session table turns a retry of a request that
 * already took effect into its first answer.
 *
 * Sessions (fsm/fsm.h, "Sessions"): the first write registers the client id
 * (a logged RegisterClient; reg_mu lets one thread do it while the others
 * wait). Each write takes the next seq and stays in c->outstanding until
 * it is answered, or, when it ended unknown and the caller holds its
 * struct idalloc_call, until a repeat is answered or the caller releases
 * it. Every write carries the lowest outstanding seq as its
 * acknowledgement floor: the cluster keeps every answer at or above it.
 * A session's seqs start at a random 62-bit offset, so two sessions used by
 * one process (a repeated call of another process's session) never share a
 * seq on a connection, where answers are matched by seq.
 * IDA_EEXPIRED ("no such session, nothing executed") for a fresh write that
 * no earlier attempt may have delivered makes the library register a new
 * session and send the write again under it; for a repeated write, or one
 * an earlier attempt may have delivered, it is IDA_ESESSION: the first
 * attempt may have acted and its answer is gone.
 */
#include "src/client/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "src/common/config.h"
#include "src/common/frame.h"

/* Why the last connection attempt of this thread failed, when it was more
 * than "cannot connect" (a TLS handshake refused); copied into the call's
 * detail by the same thread within the same call. */
static _Thread_local char connect_why[200];

const char *idalloc_version(void)
{
    return IDALLOC_VERSION;
}

unsigned idalloc_api_version(void)
{
    return IDALLOC_API_VERSION;
}

void ida__call_error(struct idalloc_call *call, const char *fmt, ...)
{
    if (call == NULL) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->errmsg, sizeof(call->errmsg), fmt, ap);
    va_end(ap);
}

uint64_t ida__client_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* --- waiters ------------------------------------------------------------- */

struct waiter
{
    uint64_t seq;
    pthread_cond_t cond;
    int done;
    int err; /* 0: resp set; else IDA_ECLOSED */
    Idalloc__ClientResponse *resp;
    struct waiter *next;
};

static void remove_waiter(struct ida_client_conn *k, struct waiter *w)
{
    for (struct waiter **p = &k->waiters; *p != NULL; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            return;
        }
    }
}

/* Fail every waiter of a connection that just died. Holds k->mu. */
static void fail_waiters(struct ida_client_conn *k)
{
    for (struct waiter *w = k->waiters; w != NULL; w = w->next) {
        w->done = 1;
        w->err = IDA_ECLOSED;
        pthread_cond_signal(&w->cond);
    }
    k->waiters = NULL;
}

/* --- reader thread ------------------------------------------------------- */

static int on_frame(void *arg,
                    enum ida_frame_type type,
                    const uint8_t *payload,
                    uint32_t len)
{
    struct ida_client_conn *k = arg;
    if (type != IDA_FRAME_CLIENT_RESPONSE) {
        return IDA_EPROTO;
    }
    Idalloc__ClientResponse *r =
        idalloc__client_response__unpack(NULL, len, payload);
    if (r == NULL) {
        return IDA_EPROTO;
    }
    pthread_mutex_lock(&k->mu);
    struct waiter *w = k->waiters;
    while (w != NULL && w->seq != r->request_seq) {
        w = w->next;
    }
    if (w != NULL) {
        remove_waiter(k, w);
        w->resp = r;
        w->done = 1;
        pthread_cond_signal(&w->cond);
        r = NULL;
    }
    pthread_mutex_unlock(&k->mu);
    if (r != NULL) { /* its caller gave up: drop it */
        idalloc__client_response__free_unpacked(r, NULL);
    }
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n);

/* --- TLS (src/common/tls.h) ------------------------------------------------
 * A session per connection, driven over the blocking socket: the handshake
 * in ensure_connected() before the reader starts, then the reader feeds it
 * ciphertext and callers encrypt under k->tls_mu. The reader gathers the
 * plaintext under tls_mu and decodes it after releasing it: on_frame()
 * takes k->mu, which a writer holds while it takes tls_mu. */

/* Send the ciphertext the session produced. Holds k->tls_mu (or is the
 * only user, during the handshake). */
static int tls_send_out(struct ida_client_conn *k, int fd)
{
    uint8_t buf[16384];
    size_t n;
    while ((n = ida_tls_out_take(k->tls, buf, sizeof(buf))) > 0) {
        int rv = write_all(fd, buf, n);
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

struct plain_buf
{
    uint8_t *p;
    size_t len, cap;
};

/* Append @n bytes to the growable buffer (*p, *len, *cap), doubling from
 * @first. IDA_ENOMEM: nothing changed. */
static int buf_append(uint8_t **p,
                      size_t *len,
                      size_t *cap,
                      size_t first,
                      const uint8_t *data,
                      size_t n)
{
    if (*len + n > *cap) {
        size_t c = *cap == 0 ? first : *cap;
        while (c < *len + n) {
            c *= 2;
        }
        uint8_t *q = ida_realloc(*p, c);
        if (q == NULL) {
            return IDA_ENOMEM;
        }
        *p = q;
        *cap = c;
    }
    memcpy(*p + *len, data, n);
    *len += n;
    return 0;
}

static int gather_plain(void *arg, const uint8_t *data, size_t len)
{
    struct plain_buf *b = arg;
    return buf_append(&b->p, &b->len, &b->cap, 32768, data, len);
}

static int no_plain(void *arg, const uint8_t *data, size_t len)
{
    (void)arg, (void)data, (void)len;
    return IDA_EPROTO; /* a node says nothing before it is asked */
}

/* The TLS handshake on the new connection @fd, within @timeout_ms; on 0
 * k->tls is the session and the node showed a node certificate of the
 * CA. Else IDA_EUNAVAIL (nothing was sent; connect_why says why) or
 * IDA_ENOMEM. */
static int tls_handshake(struct idalloc_client *c,
                         struct ida_client_conn *k,
                         int fd,
                         uint64_t timeout_ms)
{
    if (ida_tls_new(c->tls, &k->tls) != 0) {
        return IDA_ENOMEM;
    }
    uint64_t end = ida__client_now_ms() + timeout_ms;
    const char *why = NULL;
    uint8_t buf[16384];
    while (why == NULL) {
        if (tls_send_out(k, fd) != 0) {
            why = "connection closed during the TLS handshake";
            break;
        }
        if (ida_tls_ready(k->tls)) {
            break;
        }
        uint64_t now = ida__client_now_ms();
        if (now >= end) {
            why = "TLS handshake timed out";
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(end - now));
        if (pr <= 0) {
            continue; /* EINTR or the deadline: checked above */
        }
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
            why = "connection closed during the TLS handshake";
        } else if (ida_tls_feed(k->tls, buf, (size_t)n, no_plain, NULL) != 0) {
            why = ida_tls_errmsg(k->tls);
            tls_send_out(k, fd); /* the alert, if any */
        }
    }
    char who[48];
    struct ida_tls_identity id = ida_tls_peer(k->tls);
    if (why == NULL && id.kind != IDA_TLS_NODE) {
        snprintf(connect_why, sizeof(connect_why),
                 "%s: its certificate names %s, not a node", k->addr.text,
                 ida_tls_identity_text(id, who, sizeof(who)));
    } else if (why != NULL) {
        snprintf(connect_why, sizeof(connect_why), "%s: %s", k->addr.text, why);
    } else {
        return 0;
    }
    ida_tls_free(k->tls);
    k->tls = NULL;
    return IDA_EUNAVAIL;
}

static void *reader_main(void *arg)
{
    struct ida_client_conn *k = arg;
    struct ida_frame_decoder dec;
    int rv = ida_frame_decoder_init(&dec, IDA_FRAME_PAYLOAD_BYTES_DEFAULT);
    IDA_ASSERT(rv == 0);
    uint8_t buf[16384];
    struct plain_buf plain = {0};
    for (;;) {
        ssize_t n = read(k->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        const uint8_t *data = buf;
        size_t len = (size_t)n;
        if (k->tls != NULL) {
            plain.len = 0;
            pthread_mutex_lock(&k->tls_mu);
            rv = ida_tls_feed(k->tls, buf, (size_t)n, gather_plain, &plain);
            int srv = tls_send_out(k, k->fd);
            pthread_mutex_unlock(&k->tls_mu);
            if (rv != 0 || srv != 0) {
                break;
            }
            data = plain.p;
            len = plain.len;
        }
        if (len > 0 &&
            ida_frame_decoder_feed(&dec, data, len, on_frame, k) != 0) {
            break;
        }
    }
    ida_free(plain.p);
    ida_frame_decoder_close(&dec);
    pthread_mutex_lock(&k->mu);
    k->dead = 1;
    fail_waiters(k);
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* --- connections -----------------------------------------------------------
 */

static int connect_with_timeout(const struct ida_addr *a,
                                uint64_t timeout_ms,
                                int *out)
{
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
    int fd = socket(a->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return IDA_EIO;
    }
    int rv = connect(fd, (struct sockaddr *)&ss, sl);
    if (rv != 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof(err);
        if (poll(&p, 1, (int)timeout_ms) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) {
            rv = 0;
        }
    }
    if (rv != 0) {
        close(fd);
        return IDA_EUNAVAIL;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* A write never blocks a caller forever on a stuck peer. */
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    *out = fd;
    return 0;
}

/* Make sure @k has a live connection. Holds k->mu (released while joining
 * a dead reader: the dead connection is detached first, so two callers
 * never join the same thread). */
static int ensure_connected(struct idalloc_client *c,
                            struct ida_client_conn *k,
                            uint64_t timeout_ms)
{
    while (k->fd >= 0 && k->dead) {
        if (k->writing) { /* the writer still uses fd and tls */
            pthread_cond_wait(&k->written, &k->mu);
            continue;
        }
        /* Frames queued for the dead connection: their waiters failed. */
        k->out_len = 0;
        int old = k->fd;
        pthread_t t = k->reader;
        struct ida_tls *tls = k->tls;
        k->fd = -1;
        k->tls = NULL;
        pthread_mutex_unlock(&k->mu);
        pthread_join(t, NULL);
        close(old);
        ida_tls_free(tls);
        pthread_mutex_lock(&k->mu);
    }
    if (k->fd >= 0) {
        return 0;
    }
    int fd;
    uint64_t start = ida__client_now_ms();
    int rv = connect_with_timeout(&k->addr, timeout_ms, &fd);
    if (rv == 0 && c->tls != NULL) {
        uint64_t spent = ida__client_now_ms() - start;
        rv = tls_handshake(c, k, fd,
                           spent < timeout_ms ? timeout_ms - spent : 1);
        if (rv != 0) {
            close(fd);
        }
    }
    if (rv != 0) {
        return rv;
    }
    k->fd = fd;
    k->dead = 0;
    if (pthread_create(&k->reader, NULL, reader_main, k) != 0) {
        close(fd);
        k->fd = -1;
        ida_tls_free(k->tls);
        k->tls = NULL;
        return IDA_ENOMEM;
    }
    return 0;
}

/* Send a frame on @k's connection, through its TLS session if any. */
static int conn_send(struct ida_client_conn *k, const uint8_t *p, size_t n)
{
    if (k->tls == NULL) {
        return write_all(k->fd, p, n);
    }
    pthread_mutex_lock(&k->tls_mu);
    int rv = ida_tls_write(k->tls, p, n);
    if (rv == 0) {
        rv = tls_send_out(k, k->fd);
    }
    pthread_mutex_unlock(&k->tls_mu);
    return rv != 0 ? IDA_ECLOSED : 0;
}

/* Append a frame to @k's queue for the writer. Holds k->mu. IDA_ENOMEM:
 * nothing was queued. */
static int conn_queue(struct ida_client_conn *k, const uint8_t *p, size_t n)
{
    return buf_append(&k->out, &k->out_len, &k->out_cap, 4096, p, n);
}

/* Become @k's writer: send what the calls queued, one send per round for
 * every frame queued meanwhile, until nothing is left. Holds k->mu, and
 * releases it while sending (the reader and other callers go on), so
 * concurrent calls' frames leave together. fd and tls stay as they are
 * while writing (ensure_connected() waits). A failed send shuts the
 * connection down: the reader then fails every waiter (IDA_ECLOSED), and
 * the frames still queued are dropped. */
static int conn_flush(struct ida_client_conn *k)
{
    IDA_ASSERT(!k->writing);
    k->writing = 1;
    int rv = 0;
    while (rv == 0 && k->out_len > 0) {
        uint8_t *b = k->wbuf;
        size_t cap = k->wbuf_cap, len = k->out_len;
        k->wbuf = k->out;
        k->wbuf_cap = k->out_cap;
        k->out = b;
        k->out_cap = cap;
        k->out_len = 0;
        pthread_mutex_unlock(&k->mu);
        rv = conn_send(k, k->wbuf, len);
        pthread_mutex_lock(&k->mu);
    }
    if (rv != 0) {
        k->out_len = 0;
        shutdown(k->fd, SHUT_RDWR); /* the reader reaps it */
    }
    k->writing = 0;
    pthread_cond_broadcast(&k->written);
    return rv;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return IDA_ECLOSED;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void deadline_ts(uint64_t timeout_ms, struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(timeout_ms / 1000);
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

/* The frame of a call: encoded once, on its first attempt. */
struct call_frame
{
    Idalloc__ClientRequest *req;
    uint8_t *buf;
    size_t len;
};

static int encode_frame(struct idalloc_client *c, struct call_frame *f)
{
    (void)c;
    if (f->buf != NULL) {
        return 0;
    }
    size_t n = idalloc__client_request__get_packed_size(f->req);
    if (n > IDA_FRAME_PAYLOAD_BYTES_DEFAULT) {
        return IDA_ETOOBIG;
    }
    f->buf = ida_malloc(IDA_FRAME_HEADER_BYTES + n);
    if (f->buf == NULL) {
        return IDA_ENOMEM;
    }
    ida_frame_header_encode(f->buf, IDA_FRAME_CLIENT_REQUEST, n);
    idalloc__client_request__pack(f->req, f->buf + IDA_FRAME_HEADER_BYTES);
    f->len = IDA_FRAME_HEADER_BYTES + n;
    return 0;
}

/* One attempt on one node. *sent tells whether the request may have reached
 * it (so the outcome is unknown on failure). */
static int attempt(struct idalloc_client *c,
                   struct ida_client_conn *k,
                   struct call_frame *f,
                   uint64_t timeout_ms,
                   Idalloc__ClientResponse **resp,
                   int *sent)
{
    struct waiter w = {0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cond, &ca);
    pthread_condattr_destroy(&ca);
    *sent = 0;
    pthread_mutex_lock(&k->mu);
    int rv = ensure_connected(c, k, timeout_ms);
    if (rv == 0) {
        rv = encode_frame(c, f);
    }
    if (rv == 0) {
        w.seq = f->req->request_seq;
        w.next = k->waiters;
        k->waiters = &w;
        rv = conn_queue(k, f->buf, f->len);
        if (rv != 0) {
            remove_waiter(k, &w);
        }
    }
    if (rv == 0) {
        *sent = 1;
        /* With a writer at work the frame leaves with its next round;
         * else this call writes. A failed send shut the connection down:
         * the reader fails the waiter (unless its answer came first). */
        if (!k->writing) {
            (void)conn_flush(k);
        }
    }
    if (rv == 0) {
        struct timespec ts;
        deadline_ts(timeout_ms, &ts);
        while (!w.done && rv == 0) {
            if (pthread_cond_timedwait(&w.cond, &k->mu, &ts) == ETIMEDOUT) {
                rv = IDA_ETIMEDOUT;
            }
        }
        if (w.done) {
            rv = w.err;
        } else {
            remove_waiter(k, &w);
        }
    }
    pthread_mutex_unlock(&k->mu);
    pthread_cond_destroy(&w.cond);
    if (rv == 0) {
        *resp = w.resp;
    }
    return rv;
}

/* --- calls -----------------------------------------------------------------
 */

static size_t conn_by_client_addr(const struct idalloc_client *c,
                                  const char *addr)
{
    size_t n = atomic_load(&c->nconns);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(c->conns[i].addr.text, addr) == 0) {
            return i;
        }
    }
    return SIZE_MAX;
}

size_t ida__client_learn(struct idalloc_client *c, const char *addr)
{
    struct ida_addr a;
    if (addr == NULL || ida_addr_parse(addr, &a) != 0) {
        return SIZE_MAX;
    }
    size_t i = conn_by_client_addr(c, a.text);
    if (i != SIZE_MAX) {
        return i;
    }
    pthread_mutex_lock(&c->conns_mu);
    i = conn_by_client_addr(c, a.text); /* another thread may have added it */
    size_t n = atomic_load(&c->nconns);
    if (i == SIZE_MAX && n < IDA_CONFIG_NODES_MAX) {
        struct ida_client_conn *k = &c->conns[n];
        k->addr = a;
        k->fd = -1;
        k->dead = 0;
        k->waiters = NULL;
        k->tls = NULL;
        pthread_mutex_init(&k->mu, NULL);
        pthread_mutex_init(&k->tls_mu, NULL);
        pthread_cond_init(&k->written, NULL);
        atomic_store(&c->nconns, n + 1); /* publishes the filled slot */
        i = n;
    }
    pthread_mutex_unlock(&c->conns_mu);
    return i;
}

void ida__client_learn_members(struct idalloc_client *c,
                               const Idalloc__ClientResponse *r)
{
    for (size_t i = 0; i < r->n_member_addrs; i++) {
        (void)ida__client_learn(c, r->member_addrs[i]);
    }
}

/* Answers that do not settle a request: try elsewhere with the same id. */
static int retryable(uint32_t err)
{
    return err == IDA_ENOTLEADER || err == IDA_EBUSY || err == IDA_ESTOPPED ||
           err == IDA_ELEADERLOST || err == IDA_EUNAVAIL;
}

/* --- sessions ------------------------------------------------------------ */

static int random_bytes(uint8_t *p, size_t n);

/* A new session: a random client id and seqs from a random offset in
 * [2^32, 2^62); reads (not kept by the cluster) take seqs of their own at
 * 2^63 and above. Holds sess_mu. */
static int new_session_locked(struct idalloc_client *c)
{
    uint8_t r[24];
    if (random_bytes(r, sizeof(r)) != 0) {
        return IDA_EIO;
    }
    memcpy(c->client_id, r, 16);
    uint64_t off = 0;
    for (int i = 0; i < 8; i++) {
        off = off << 8 | r[16 + i];
    }
    c->next_seq = (UINT64_C(1) << 32) + (off >> 3);
    c->next_read_seq = (UINT64_C(1) << 63) + (off >> 3);
    c->registered = 0;
    c->n_outstanding = 0;
    return 0;
}

/* Holds sess_mu. */
static uint64_t floor_locked(const struct idalloc_client *c)
{
    uint64_t f = c->next_seq;
    for (size_t i = 0; i < c->n_outstanding; i++) {
        if (c->outstanding[i] < f) {
            f = c->outstanding[i];
        }
    }
    return f;
}

/* Holds sess_mu. 0 or IDA_ELIMIT. */
static int outstanding_add_locked(struct idalloc_client *c, uint64_t seq)
{
    for (size_t i = 0; i < c->n_outstanding; i++) {
        if (c->outstanding[i] == seq) {
            return 0;
        }
    }
    if (c->n_outstanding == IDALLOC_OUTSTANDING_MAX) {
        return IDA_ELIMIT;
    }
    c->outstanding[c->n_outstanding++] = seq;
    return 0;
}

/* Forget @seq of session @id (if it is still the session). */
static void outstanding_del(struct idalloc_client *c,
                            const uint8_t *id,
                            uint64_t seq)
{
    pthread_mutex_lock(&c->sess_mu);
    if (memcmp(id, c->client_id, 16) == 0) {
        for (size_t i = 0; i < c->n_outstanding; i++) {
            if (c->outstanding[i] == seq) {
                c->outstanding[i] = c->outstanding[--c->n_outstanding];
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->sess_mu);
}

void ida__client_floor(struct idalloc_client *c,
                       uint64_t *floor,
                       size_t *outstanding)
{
    pthread_mutex_lock(&c->sess_mu);
    *floor = floor_locked(c);
    *outstanding = c->n_outstanding;
    pthread_mutex_unlock(&c->sess_mu);
}

void idalloc_call_init(struct idalloc_call *t)
{
    memset(t, 0, sizeof(*t));
    t->struct_size = sizeof(*t);
}

int idalloc_call_release(struct idalloc_client *c, struct idalloc_call *t)
{
    if (c == NULL || t == NULL || t->state != IDALLOC_CALL_UNKNOWN) {
        return IDA_EINVAL;
    }
    outstanding_del(c, t->client_id, t->seq);
    t->state = IDALLOC_CALL_LOST;
    return 0;
}

int idalloc_call_format(const struct idalloc_call *t, char *buf)
{
    if (t == NULL || buf == NULL || t->seq == 0) {
        return IDA_EINVAL;
    }
    for (int i = 0; i < 16; i++) {
        snprintf(buf + 2 * i, 3, "%02x", t->client_id[i]);
    }
    snprintf(buf + 32, IDALLOC_CALL_ID_TEXT_MAX - 32, ":%llu",
             (unsigned long long)t->seq);
    return 0;
}

static int hexval(char ch)
{
    return ch >= '0' && ch <= '9'   ? ch - '0'
           : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
           : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                    : -1;
}

int idalloc_call_parse(const char *text, struct idalloc_call *t)
{
    if (text == NULL || t == NULL || strnlen(text, 64) < 34 ||
        text[32] != ':') {
        return IDA_EINVAL;
    }
    uint8_t id[16];
    for (int i = 0; i < 16; i++) {
        int hi = hexval(text[2 * i]), lo = hexval(text[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return IDA_EINVAL;
        }
        id[i] = (uint8_t)(hi << 4 | lo);
    }
    uint64_t seq = 0;
    for (const char *p = text + 33; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || seq > (UINT64_MAX - 9) / 10) {
            return IDA_EINVAL;
        }
        seq = seq * 10 + (uint64_t)(*p - '0');
    }
    if (seq == 0) {
        return IDA_EINVAL;
    }
    idalloc_call_init(t);
    memcpy(t->client_id, id, 16);
    t->seq = seq;
    t->state = IDALLOC_CALL_UNKNOWN;
    return 0;
}

/* --- calls -----------------------------------------------------------------
 */

int ida__client_call_node(struct idalloc_client *c,
                          size_t node,
                          Idalloc__ClientRequest *req,
                          Idalloc__ClientResponse **resp)
{
    req->version = IDA_WIRE_VERSION;
    pthread_mutex_lock(&c->sess_mu);
    uint8_t id[16];
    memcpy(id, c->client_id, 16);
    req->request_seq = c->next_read_seq++;
    pthread_mutex_unlock(&c->sess_mu);
    req->client_id.data = id;
    req->client_id.len = sizeof(id);
    struct call_frame f = {.req = req};
    int sent;
    int rv =
        attempt(c, &c->conns[node], &f, c->opts.call_timeout_ms, resp, &sent);
    ida_free(f.buf);
    return rv;
}

/* Send @req as it is (every field set) to the leader with retries until the
 * call deadline (see ida__client_call). *@earlier_sent: an attempt before
 * the one that answered may have reached a node. */
static int send_call(struct idalloc_client *c,
                     Idalloc__ClientRequest *req,
                     struct idalloc_call *call,
                     Idalloc__ClientResponse **resp,
                     int *earlier_sent)
{
    struct call_frame f = {.req = req};
    int rv = 0;
    uint64_t deadline = ida__client_now_ms() + c->opts.call_timeout_ms;
    size_t target = atomic_load(&c->leader) % atomic_load(&c->nconns);
    uint64_t backoff = 10;
    int maybe_sent = 0, any_sent = 0;
    char why[256] = "no attempt made";
    for (;;) {
        uint64_t now = ida__client_now_ms();
        if (now >= deadline) {
            break;
        }
        uint64_t budget = deadline - now;
        if (budget > c->opts.attempt_timeout_ms) {
            budget = c->opts.attempt_timeout_ms;
        }
        struct ida_client_conn *k = &c->conns[target];
        int sent;
        Idalloc__ClientResponse *r = NULL;
        *earlier_sent = maybe_sent;
        connect_why[0] = '\0';
        rv = attempt(c, k, &f, budget, &r, &sent);
        /* Sent and not answered "not leader" (which means not carried
         * out): it may have taken effect. */
        maybe_sent |= sent && !(rv == 0 && r->result != NULL &&
                                r->result->error == IDA_ENOTLEADER);
        any_sent |= sent;
        if (rv == IDA_ETOOBIG || rv == IDA_ENOMEM) {
            ida__call_error(call, "request too large or out of memory");
            ida_free(f.buf);
            return rv;
        }
        if (rv == 0) {
            ida__client_learn_members(c, r);
        }
        size_t next = (target + 1) % atomic_load(&c->nconns);
        if (rv == 0 && r->result != NULL && retryable(r->result->error)) {
            /* Follow the hint wherever it points, even to a node we were
             * not given: the cluster knows its members. */
            size_t hint = r->leader_addr[0] != '\0'
                              ? ida__client_learn(c, r->leader_addr)
                              : SIZE_MAX;
            snprintf(why, sizeof(why), "%s: %s", k->addr.text,
                     idalloc_strerror((int)r->result->error));
            idalloc__client_response__free_unpacked(r, NULL);
            if (hint != SIZE_MAX && hint != target) {
                target = hint; /* follow the hint at once */
                continue;
            }
            target = next;
        } else if (rv == 0 && r->result == NULL) {
            idalloc__client_response__free_unpacked(r, NULL);
            snprintf(why, sizeof(why), "%s: response without a result",
                     k->addr.text);
            target = next;
        } else if (rv == 0) {
            atomic_store(&c->leader, target);
            ida_free(f.buf);
            *resp = r;
            return 0;
        } else {
            if (!sent && connect_why[0] != '\0') {
                snprintf(why, sizeof(why), "%s", connect_why);
            } else {
                snprintf(why, sizeof(why), "%s: %s", k->addr.text,
                         sent ? idalloc_strerror(rv) : "cannot connect");
            }
            target = next;
        }
        uint64_t left = deadline - ida__client_now_ms();
        if ((int64_t)left > 0) {
            sleep_ms(backoff < left ? backoff : left);
        }
        backoff = backoff * 2 > 200 ? 200 : backoff * 2;
    }
    ida_free(f.buf);
    if (maybe_sent) {
        ida__call_error(call,
                        "no answer within %u ms (last: %s); outcome unknown",
                        c->opts.call_timeout_ms, why);
        return IDA_ETIMEDOUT;
    }
    ida__call_error(
        call,
        any_sent ? "no node accepted it within %u ms, it was not carried out "
                   "(last: %s); retrying is safe"
                 : "nothing was sent: no node reachable within %u ms (last "
                   "tried %s); retrying is safe",
        c->opts.call_timeout_ms, why);
    return IDA_EUNAVAIL;
}

/* Register the session if it is not yet (one thread at a time). */
static int ensure_session(struct idalloc_client *c, struct idalloc_call *call)
{
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->sess_mu);
    int registered = c->registered;
    uint8_t id[16];
    memcpy(id, c->client_id, 16);
    pthread_mutex_unlock(&c->sess_mu);
    int rv = 0;
    if (!registered) {
        Idalloc__ClientRequest req = IDALLOC__CLIENT_REQUEST__INIT;
        Idalloc__RegisterClient op = IDALLOC__REGISTER_CLIENT__INIT;
        req.version = IDA_WIRE_VERSION;
        req.client_id.data = id;
        req.client_id.len = sizeof(id);
        req.request_seq = 1; /* registrations are not kept: any seq */
        req.op_case = IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT;
        req.register_client = &op;
        Idalloc__ClientResponse *r = NULL;
        int earlier;
        rv = send_call(c, &req, call, &r, &earlier);
        if (rv == 0) {
            const Idalloc__CommandResult *res = r->result;
            if (res->error != 0) {
                rv = (int)res->error;
                ida__call_error(call, "registering a session: %s",
                                res->error_msg[0] != '\0'
                                    ? res->error_msg
                                    : idalloc_strerror(rv));
            } else if (res->result_case !=
                       IDALLOC__COMMAND_RESULT__RESULT_REGISTER_CLIENT) {
                rv = IDA_EPROTO;
                ida__call_error(call, "registering a session: wrong answer");
            }
            idalloc__client_response__free_unpacked(r, NULL);
        } else if (rv == IDA_ETIMEDOUT) {
            /* The registration may have happened; the write itself was
             * not sent. */
            rv = IDA_EUNAVAIL;
            ida__call_error(call,
                            "could not register a session within %u ms; the "
                            "call was not sent",
                            c->opts.call_timeout_ms);
        }
        if (rv == 0) {
            pthread_mutex_lock(&c->sess_mu);
            if (memcmp(id, c->client_id, 16) == 0) {
                c->registered = 1;
            }
            pthread_mutex_unlock(&c->sess_mu);
        }
    }
    pthread_mutex_unlock(&c->reg_mu);
    return rv;
}

/* Is @r a "no such session" answer? Frees it then. */
static int expired(Idalloc__ClientResponse *r)
{
    if (r->result->error != IDA_EEXPIRED) {
        return 0;
    }
    idalloc__client_response__free_unpacked(r, NULL);
    return 1;
}

int ida__client_call(struct idalloc_client *c,
                     Idalloc__ClientRequest *req,
                     int write,
                     struct idalloc_call *call,
                     Idalloc__ClientResponse **resp)
{
    IDA_ASSERT(call != NULL);
    req->version = IDA_WIRE_VERSION;
    uint8_t id[16];
    int earlier;
    int rv;
    if (!write) {
        pthread_mutex_lock(&c->sess_mu);
        memcpy(id, c->client_id, 16);
        req->request_seq = c->next_read_seq++;
        pthread_mutex_unlock(&c->sess_mu);
        req->client_id.data = id;
        req->client_id.len = sizeof(id);
        return send_call(c, req, call, resp, &earlier);
    }
    if (call->state == IDALLOC_CALL_UNKNOWN && call->seq != 0) {
        /* A repeat: the same request id, whatever session it came from. */
        pthread_mutex_lock(&c->sess_mu);
        int own = memcmp(call->client_id, c->client_id, 16) == 0;
        rv = own ? outstanding_add_locked(c, call->seq) : 0;
        req->ack_below = own ? floor_locked(c) : 0;
        pthread_mutex_unlock(&c->sess_mu);
        if (rv != 0) {
            ida__call_error(call, "%d calls outstanding on this client",
                            IDALLOC_OUTSTANDING_MAX);
            return rv;
        }
        memcpy(id, call->client_id, 16);
        req->client_id.data = id;
        req->client_id.len = sizeof(id);
        req->request_seq = call->seq;
        rv = send_call(c, req, call, resp, &earlier);
        if (rv == 0 && expired(*resp)) {
            ida__call_error(call,
                            "the session of this call expired: outcome "
                            "unknown for good");
            rv = IDA_ESESSION;
        }
        return rv;
    }
    for (int round = 0;; round++) {
        rv = ensure_session(c, call);
        if (rv != 0) {
            return rv;
        }
        pthread_mutex_lock(&c->sess_mu);
        uint64_t seq = c->next_seq;
        rv = seq - floor_locked(c) >= IDALLOC_SPAN_MAX
                 ? IDA_ELIMIT
                 : outstanding_add_locked(c, seq);
        if (rv == 0) {
            c->next_seq++;
            req->ack_below = floor_locked(c);
            memcpy(id, c->client_id, 16);
        }
        pthread_mutex_unlock(&c->sess_mu);
        if (rv != 0) {
            ida__call_error(call,
                            "%d calls outstanding, or %d writes since the "
                            "oldest unknown call: repeat or release it",
                            IDALLOC_OUTSTANDING_MAX, IDALLOC_SPAN_MAX);
            return rv;
        }
        memcpy(call->client_id, id, 16);
        call->seq = seq;
        req->client_id.data = id;
        req->client_id.len = sizeof(id);
        req->request_seq = seq;
        rv = send_call(c, req, call, resp, &earlier);
        if (rv != 0 || !expired(*resp)) {
            return rv;
        }
        outstanding_del(c, id, seq);
        if (earlier || round > 0) {
            /* An earlier attempt may have acted before the session went. */
            ida__call_error(call,
                            "the session expired during the call: outcome "
                            "unknown");
            return IDA_ESESSION;
        }
        /* Definitely not executed: a new session, and the call again. */
        pthread_mutex_lock(&c->sess_mu);
        if (memcmp(id, c->client_id, 16) == 0) {
            rv = new_session_locked(c);
        }
        pthread_mutex_unlock(&c->sess_mu);
        if (rv != 0) {
            ida__call_error(call, "cannot read /dev/urandom");
            return rv;
        }
        req->ack_below = 0;
    }
}

int ida__client_finish(struct idalloc_client *c,
                       struct idalloc_call *call,
                       int rv,
                       int keep,
                       int replay)
{
    call->error = rv;
    if (rv == 0) {
        call->errmsg[0] = '\0';
    }
    if (call->seq == 0) {
        return rv; /* never got a request id: nothing was sent */
    }
    if (rv == IDA_EUNAVAIL && !replay) {
        /* Not carried out: the call struct is fresh again. */
        outstanding_del(c, call->client_id, call->seq);
        call->seq = 0;
        call->state = IDALLOC_CALL_NEW;
        return rv;
    }
    int unknown = idalloc_errclass(rv) == IDA_ERR_CLASS_UNKNOWN ||
                  (rv == IDA_EUNAVAIL && replay);
    if (unknown && rv != IDA_ESESSION && keep) {
        call->state = IDALLOC_CALL_UNKNOWN;
        return rv;
    }
    outstanding_del(c, call->client_id, call->seq);
    call->state = unknown ? IDALLOC_CALL_LOST : IDALLOC_CALL_DONE;
    return rv;
}

/* --- lifecycle --------------------------------------------------------------
 */

void idalloc_options_init(struct idalloc_options *o)
{
    *o = (struct idalloc_options){
        .struct_size = sizeof(*o),
        .attempt_timeout_ms = 1000,
        .call_timeout_ms = 5000,
        .next_block_min = 16,
        .next_block_max = 65536,
    };
}

static int add_conn(struct idalloc_client *c, const char *addr, char *errmsg)
{
    if (c->nconns == IDA_CONFIG_NODES_MAX) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX, "more than %d addresses",
                 IDA_CONFIG_NODES_MAX);
        return IDA_EINVAL;
    }
    struct ida_client_conn *k = &c->conns[c->nconns];
    if (ida_addr_parse(addr, &k->addr) != 0) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                 "bad address \"%s\": expected IPv4:PORT or [IPv6]:PORT", addr);
        return IDA_EINVAL;
    }
    if (conn_by_client_addr(c, k->addr.text) != SIZE_MAX) {
        return 0; /* listed twice: one connection is enough */
    }
    k->fd = -1;
    k->tls = NULL;
    pthread_mutex_init(&k->mu, NULL);
    pthread_mutex_init(&k->tls_mu, NULL);
    pthread_cond_init(&k->written, NULL);
    atomic_store(&c->nconns, c->nconns + 1);
    return 0;
}

static int parse_addresses(struct idalloc_client *c,
                           const char *list,
                           char *errmsg)
{
    char buf[1024];
    if (strlen(list) >= sizeof(buf)) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX, "address list too long");
        return IDA_EINVAL;
    }
    strcpy(buf, list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        int rv = add_conn(c, t, errmsg);
        if (rv != 0) {
            return rv;
        }
    }
    if (c->nconns == 0) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX, "no address given");
        return IDA_EINVAL;
    }
    return 0;
}

static int load_config(struct idalloc_client *c, const char *path, char *errmsg)
{
    struct ida_config *cfg = ida_malloc(sizeof(*cfg));
    char msg[IDA_ERRMSG_MAX];
    if (cfg == NULL) {
        return IDA_ENOMEM;
    }
    int rv = ida_config_load(path, cfg, msg);
    if (rv != 0) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX, "%s", msg);
    }
    for (unsigned i = 0; rv == 0 && i < cfg->node_count; i++) {
        rv = add_conn(c, cfg->nodes[i].client.text, errmsg);
    }
    ida_free(cfg);
    return rv;
}

static int random_bytes(uint8_t *p, size_t n)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return IDA_EIO;
    }
    ssize_t r = read(fd, p, n);
    close(fd);
    return r == (ssize_t)n ? 0 : IDA_EIO;
}

int idalloc_client_new(const struct idalloc_options *o,
                       struct idalloc_client **out,
                       char *errmsg)
{
    char scratch[IDALLOC_ERRMSG_MAX];
    if (errmsg == NULL) {
        errmsg = scratch;
    }
    errmsg[0] = '\0';
    struct idalloc_options opts;
    idalloc_options_init(&opts);
    if (o != NULL &&
        (o->struct_size < offsetof(struct idalloc_options, next_block_max) +
                              sizeof(o->next_block_max) ||
         o->struct_size > sizeof(opts))) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                 "options.struct_size %zu: not set by idalloc_options_init() "
                 "of this library",
                 o->struct_size);
        return IDA_EINVAL;
    }
    if (o != NULL) {
        /* Fields of a newer header than the caller's keep their defaults. */
        memcpy(&opts, o, o->struct_size);
        opts.struct_size = sizeof(opts);
        o = &opts;
    }
    if (o == NULL || (o->addresses == NULL) == (o->config_path == NULL)) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                 "give exactly one of addresses and config_path");
        return IDA_EINVAL;
    }
    if (o->attempt_timeout_ms == 0 || o->call_timeout_ms == 0 ||
        o->next_block_min == 0 || o->next_block_min > o->next_block_max) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                 "timeouts must be > 0 and 0 < next_block_min <= "
                 "next_block_max");
        return IDA_EINVAL;
    }
    struct idalloc_client *c = ida_calloc(1, sizeof(*c));
    if (c == NULL) {
        return IDA_ENOMEM;
    }
    c->opts = *o;
    c->opts.addresses = NULL;
    c->opts.config_path = NULL;
    pthread_mutex_init(&c->sess_mu, NULL);
    pthread_mutex_init(&c->reg_mu, NULL);
    c->opts.tls_ca_file = NULL; /* read here, not kept */
    c->opts.tls_cert_file = NULL;
    c->opts.tls_key_file = NULL;
    atomic_init(&c->leader, 0);
    atomic_init(&c->nconns, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->conns_mu, NULL);
    int rv = o->addresses != NULL ? parse_addresses(c, o->addresses, errmsg)
                                  : load_config(c, o->config_path, errmsg);
    if (rv == 0) {
        c->outstanding =
            ida_malloc(IDALLOC_OUTSTANDING_MAX * sizeof(*c->outstanding));
        rv = c->outstanding == NULL ? IDA_ENOMEM : 0;
    }
    if (rv == 0 && new_session_locked(c) != 0) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX, "cannot read /dev/urandom");
        rv = IDA_EIO;
    }
    if (rv == 0 && o->tls_ca_file != NULL) {
        char msg[IDA_ERRMSG_MAX];
        rv = ida_tls_ctx_new(IDA_TLS_CLIENT, o->tls_ca_file, o->tls_cert_file,
                             o->tls_key_file, &c->tls, msg);
        if (rv != 0) {
            snprintf(errmsg, IDALLOC_ERRMSG_MAX, "%s", msg);
            rv = rv == IDA_EINVAL ? IDA_EINVAL : IDA_ECONFIG;
        }
    } else if (rv == 0 &&
               (o->tls_cert_file != NULL || o->tls_key_file != NULL)) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                 "a TLS certificate or key needs tls_ca_file too");
        rv = IDA_EINVAL;
    }
    if (rv == 0) {
        rv = ida__client_next_start(c);
    }
    if (rv != 0) {
        idalloc_client_free(c);
        return rv;
    }
    *out = c;
    return 0;
}

void idalloc_client_free(struct idalloc_client *c)
{
    if (c == NULL) {
        return;
    }
    ida__client_next_stop(c);
    for (size_t i = 0; i < c->nconns; i++) {
        struct ida_client_conn *k = &c->conns[i];
        if (k->fd >= 0) {
            shutdown(k->fd, SHUT_RDWR);
            pthread_join(k->reader, NULL);
            close(k->fd);
        }
        ida_tls_free(k->tls);
        pthread_mutex_destroy(&k->mu);
        pthread_mutex_destroy(&k->tls_mu);
        pthread_cond_destroy(&k->written);
        ida_free(k->out);
        ida_free(k->wbuf);
    }
    ida_tls_ctx_free(c->tls);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->conns_mu);
    pthread_mutex_destroy(&c->sess_mu);
    pthread_mutex_destroy(&c->reg_mu);
    ida_free(c->outstanding);
    ida_free(c);
}

size_t idalloc_node_count(const struct idalloc_client *c)
{
    return c->nconns;
}
