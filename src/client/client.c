/* libidalloc: client objects, sessions and call structs. The calls
 * themselves are src/client/call.c, the I/O thread src/client/loop.c
 * (src/client/client.h has the design).
 *
 * Sessions (fsm/fsm.h, "Sessions"): the first write registers the client id
 * (a logged RegisterClient, sent by the I/O thread while the writes that
 * need it wait). Each write takes the next seq and stays in c->outstanding
 * until it is answered, or, when it ended unknown and the caller holds its
 * struct idalloc_call, until a repeat is answered or the caller releases
 * it. Every write carries the lowest outstanding seq as its
 * acknowledgement floor: the cluster keeps every answer at or above it.
 * A session's seqs start at a random 62-bit offset, so two sessions used by
 * one process (a repeated call of another process's session) never share a
 * seq on a connection, where answers are matched by seq.
 */
#include "src/client/client.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "src/common/config.h"

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

/* --- nodes -----------------------------------------------------------------
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

/* Fill slot @k (not published yet) for address @a. */
static void conn_slot_init(struct ida_client_conn *k, const struct ida_addr *a)
{
    memset(k, 0, sizeof(*k));
    k->addr = *a;
    k->fd = -1;
    k->state = IDA_CONN_IDLE;
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
        conn_slot_init(&c->conns[n], &a);
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

size_t idalloc_node_count(const struct idalloc_client *c)
{
    return atomic_load(&c->nconns);
}

/* --- sessions --------------------------------------------------------------
 */

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

uint64_t ida__floor_locked(const struct idalloc_client *c)
{
    uint64_t f = c->next_seq;
    for (size_t i = 0; i < c->n_outstanding; i++) {
        if (c->outstanding[i] < f) {
            f = c->outstanding[i];
        }
    }
    return f;
}

int ida__outstanding_add_locked(struct idalloc_client *c, uint64_t seq)
{
    for (size_t i = 0; i < c->n_outstanding; i++) {
        if (c->outstanding[i] == seq) {
            return 0;
        }
    }
    if (c->n_outstanding + c->n_unseq >= IDALLOC_OUTSTANDING_MAX) {
        return IDA_ELIMIT;
    }
    c->outstanding[c->n_outstanding++] = seq;
    return 0;
}

void ida__outstanding_del(struct idalloc_client *c,
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
    *floor = ida__floor_locked(c);
    *outstanding = c->n_outstanding;
    pthread_mutex_unlock(&c->sess_mu);
}

static int limit_error(struct idalloc_call *call)
{
    ida__call_error(call,
                    "%d calls outstanding, or %d writes since the oldest "
                    "unknown call: repeat or release it",
                    IDALLOC_OUTSTANDING_MAX, IDALLOC_SPAN_MAX);
    return IDA_ELIMIT;
}

/* The next seq of the session for @a, its request id set in a->req. */
static int assign_locked(struct idalloc_client *c, struct ida_acall *a)
{
    uint64_t seq = c->next_seq;
    if (seq - ida__floor_locked(c) >= IDALLOC_SPAN_MAX ||
        ida__outstanding_add_locked(c, seq) != 0) {
        return limit_error(a->call);
    }
    c->next_seq++;
    memcpy(a->id, c->client_id, 16);
    a->req->client_id.data = a->id;
    a->req->client_id.len = 16;
    a->req->request_seq = seq;
    a->req->ack_below = ida__floor_locked(c);
    a->own = 1;
    a->has_seq = 1;
    memcpy(a->call->client_id, a->id, 16);
    a->call->seq = seq;
    return 0;
}

int ida__session_fresh_locked(struct idalloc_client *c,
                              struct ida_acall *a,
                              int *assigned)
{
    *assigned = 0;
    if (c->registered) {
        int rv = assign_locked(c, a);
        *assigned = rv == 0;
        return rv;
    }
    if (c->n_outstanding + c->n_unseq >= IDALLOC_OUTSTANDING_MAX) {
        return limit_error(a->call);
    }
    c->n_unseq++;
    a->reserved = 1;
    return 0;
}

int ida__session_assign_locked(struct idalloc_client *c, struct ida_acall *a)
{
    IDA_ASSERT(a->reserved && c->registered);
    a->reserved = 0;
    c->n_unseq--;
    return assign_locked(c, a);
}

int ida__session_renew_locked(struct idalloc_client *c, const uint8_t *id)
{
    if (memcmp(id, c->client_id, 16) != 0) {
        return 0; /* another call renewed it already */
    }
    return new_session_locked(c);
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
        call->state = IDALLOC_CALL_NEW;
        return rv; /* never got a request id: nothing was sent */
    }
    if (rv == IDA_EUNAVAIL && !replay) {
        /* Not carried out: the call struct is fresh again. */
        ida__outstanding_del(c, call->client_id, call->seq);
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
    ida__outstanding_del(c, call->client_id, call->seq);
    call->state = unknown ? IDALLOC_CALL_LOST : IDALLOC_CALL_DONE;
    return rv;
}

/* --- call structs ----------------------------------------------------------
 */

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
    ida__outstanding_del(c, t->client_id, t->seq);
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

/* --- lifecycle -------------------------------------------------------------
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
    size_t n = atomic_load(&c->nconns);
    if (n == IDA_CONFIG_NODES_MAX) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX, "more than %d addresses",
                 IDA_CONFIG_NODES_MAX);
        return IDA_EINVAL;
    }
    struct ida_addr a;
    if (ida_addr_parse(addr, &a) != 0) {
        snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                 "bad address \"%s\": expected IPv4:PORT or [IPv6]:PORT", addr);
        return IDA_EINVAL;
    }
    if (conn_by_client_addr(c, a.text) != SIZE_MAX) {
        return 0; /* listed twice: one connection is enough */
    }
    conn_slot_init(&c->conns[n], &a);
    atomic_store(&c->nconns, n + 1);
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
    if (atomic_load(&c->nconns) == 0) {
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
    c->opts.tls_ca_file = NULL; /* read here, not kept */
    c->opts.tls_cert_file = NULL;
    c->opts.tls_key_file = NULL;
    pthread_mutex_init(&c->sess_mu, NULL);
    pthread_mutex_init(&c->q_mu, NULL);
    pthread_mutex_init(&c->lp_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->conns_mu, NULL);
    atomic_init(&c->leader, 0);
    atomic_init(&c->nconns, 0);
    atomic_init(&c->n_calls, 0);
    atomic_init(&c->wake_pending, 0);
    c->wake_fd[0] = c->wake_fd[1] = -1;
    ida__client_next_init(c);
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
        rv = ida__loop_start(c);
        if (rv != 0) {
            snprintf(errmsg, IDALLOC_ERRMSG_MAX,
                     "cannot start the I/O thread: %s", idalloc_strerror(rv));
        }
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
    /* A completion callback would wait here for its own thread. */
    IDA_ASSERT(!ida__client_on_loop(c));
    if (c->loop_running) {
        ida__loop_stop(c); /* every call completes, callbacks included */
    }
    ida__client_next_free(c);
    ida_tls_ctx_free(c->tls);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->conns_mu);
    pthread_mutex_destroy(&c->sess_mu);
    pthread_mutex_destroy(&c->q_mu);
    pthread_mutex_destroy(&c->lp_mu);
    ida_free(c->outstanding);
    ida_free(c->heap);
    ida_free(c);
}
