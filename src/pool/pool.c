/* The message-passing pool; the design is in pool.h. About 800 lines in one
 * file on purpose: the worker loop, the sharder and start/stop all work on the
 * private worker and target structs defined here. */
#include "src/pool/pool.h"

#include <sched.h>

#include <errno.h>
#include <stdalign.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"

/* Messages handled per processor per loop, so one busy inbox cannot starve
 * the worker's other processors. */
#define BATCH_MAX  64
#define NONE       UINT32_MAX
#define CONF_BIT   31u
#define COUNT_MASK ((1u << CONF_BIT) - 1)
/* While spinning: looks at the inboxes, a pause between two, before each
 * sched_yield(). A yield per look made each look cost a system call, and a
 * round trip between two spinning workers 5 us instead of 0.5
 * (tests/pool/bench_pool.c, section 2). */
#define SPIN_POLLS 64

struct target
{
    const char *name;
    const struct ida_proc_ops *ops; /* NULL for an external target */
    void *state;
    ida_pool_notify_fn notify;
    void *notify_arg;
    uint32_t ping_interval_us;
    uint32_t k;              /* index among processors (NONE for external) */
    struct ida_rqueue inbox; /* Vyukov ring: see queue.h */
    /* Read by every sender; written only when the assignment changes.
     * Kept off the lines the running worker writes on every run (below):
     * sharing a line with them cost a cache miss per send. */
    alignas(64) _Atomic uint32_t owner; /* worker to wake, per assignment */
    alignas(64) pthread_mutex_t lock;   /* shard lock: held by its worker */
    atomic_flag running;                /* exclusivity check (asserted) */
    /* Owned by the processor: touched only by the worker holding @lock. */
    int64_t ping_due_ns; /* CLOCK_MONOTONIC; 0: set by the first loop */
    struct ida_sftimer ping_sf;
    struct ida_sftimer recv_sf;
    uint64_t busy_ns; /* since the last switch; written if can_be_updated */
};

struct worker
{
    alignas(64) struct ida_pool *pool;
    pthread_t thread;
    bool thread_started;
    uint32_t index;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Read by every sender to this worker's processors; written only when
     * the worker parks. On its own line: the fields below change on every
     * loop, and sharing a line with them cost senders a cache miss. */
    alignas(64) _Atomic int sleeping;
    /* Thread-local state of the sharder (only this worker's thread
     * touches it while running). */
    alignas(64) int local; /* the assignment in use: 0, 1 or -1 (none yet) */
    bool can_be_updated;
    bool idle;
    struct ida_wtimer reshard_timer;
    void *errctx; /* from cfg.errors.open, or NULL */
    _Atomic uint64_t delivered;
    _Atomic uint64_t pings;
};

struct ida_pool
{
    struct ida_pool_config cfg;
    /* By id; each target allocated alone, since a mutex must not move. */
    struct target **t;
    uint32_t n;
    uint32_t cap;
    uint32_t *procs; /* processor ids by index k */
    uint32_t nproc;
    uint32_t nthreads;
    struct worker *w;
    /* Shadow pages: assign[c][k] = worker of processor k in assignment c;
     * order[c] lists processors grouped by worker, start[c][i] is where
     * worker i's group begins. */
    uint32_t *assign[2];
    uint32_t *order[2];
    uint32_t *start[2];
    _Atomic uint32_t shadow; /* bit 31: current assignment; low: promises */
    uint64_t *edge_ns;       /* [k * nproc + j]: k's receive time from j */
    uint64_t *scratch_proc;  /* plan input, worker 0 only */
    _Atomic bool started;
    _Atomic bool stopping;
    bool stopped;
    _Atomic uint64_t reshards;
    _Atomic uint64_t dropped;
    _Atomic uint64_t drained;
};

/* --- messages ------------------------------------------------------------- */

_Static_assert(offsetof(struct ida_msg, data) == 16,
               "payload starts 16-byte aligned");

struct ida_msg *ida_msg_new(uint32_t type, size_t len)
{
    if (len > SIZE_MAX - sizeof(struct ida_msg)) {
        return NULL;
    }
    struct ida_msg *m = ida_malloc(sizeof(*m) + len);
    if (m == NULL) {
        return NULL;
    }
    m->type = type;
    m->from = IDA_POOL_OUTSIDE;
    m->len = len;
    memset(m->data, 0, len);
    return m;
}

void ida_msg_free(struct ida_msg *msg)
{
    ida_free(msg);
}

/* --- setup ---------------------------------------------------------------- */

int ida_pool_new(const struct ida_pool_config *cfg, struct ida_pool **out)
{
    IDA_ASSERT(out != NULL);
    if (cfg == NULL || cfg->threads > IDA_POOL_THREADS_MAX ||
        (cfg->errors.open != NULL && cfg->errors.add == NULL)) {
        return IDA_EINVAL;
    }
    struct ida_pool *p = ida_calloc(1, sizeof(*p));
    if (p == NULL) {
        return IDA_ENOMEM;
    }
    p->cfg = *cfg;
    if (p->cfg.idle_wait_us == 0) {
        p->cfg.idle_wait_us = 1000;
    }
    if (p->cfg.drain_max == 0) {
        p->cfg.drain_max = 1000000;
    }
    atomic_init(&p->shadow, 0);
    atomic_init(&p->started, false);
    atomic_init(&p->stopping, false);
    atomic_init(&p->reshards, 0);
    atomic_init(&p->dropped, 0);
    atomic_init(&p->drained, 0);
    *out = p;
    return 0;
}

static int add_target(struct ida_pool *p,
                      const struct ida_proc_config *c,
                      ida_pool_notify_fn notify,
                      void *notify_arg,
                      uint32_t capacity,
                      uint32_t *id_out)
{
    if (atomic_load(&p->started) || p->n >= IDA_POOL_PROCESSORS_MAX) {
        return IDA_EINVAL;
    }
    if (capacity == 0) {
        capacity = IDA_POOL_INBOX_DEFAULT;
    }
    if (capacity > IDA_QUEUE_CAPACITY_MAX) {
        return IDA_EINVAL;
    }
    if (p->n == p->cap) {
        uint32_t cap = p->cap == 0 ? 8 : p->cap * 2;
        struct target **ts = ida_realloc(p->t, (size_t)cap * sizeof(*ts));
        if (ts == NULL) {
            return IDA_ENOMEM;
        }
        p->t = ts;
        p->cap = cap;
    }
    /* Aligned as its type says, so its cache-line groups are real lines. */
    struct target *t = ida_malloc_aligned(alignof(struct target), sizeof(*t));
    if (t == NULL) {
        return IDA_ENOMEM;
    }
    memset(t, 0, sizeof(*t));
    int rv = ida_rqueue_init(&t->inbox, capacity);
    if (rv != 0) {
        ida_free(t);
        return rv;
    }
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        ida_rqueue_close(&t->inbox, NULL, NULL);
        ida_free(t);
        return IDA_ENOMEM;
    }
    if (c != NULL) {
        t->name = c->name != NULL ? c->name : "processor";
        t->ops = c->ops;
        t->state = c->state;
        t->ping_interval_us = c->ping_interval_us;
    } else {
        t->name = "external";
        t->notify = notify;
        t->notify_arg = notify_arg;
    }
    t->k = NONE;
    atomic_init(&t->owner, 0);
    atomic_flag_clear(&t->running);
    t->ping_due_ns = 0;
    ida_sftimer_init(&t->ping_sf, NULL, NULL);
    ida_sftimer_init(&t->recv_sf, NULL, NULL);
    p->t[p->n] = t;
    *id_out = p->n++;
    return 0;
}

int ida_pool_add(struct ida_pool *p,
                 const struct ida_proc_config *c,
                 uint32_t *id_out)
{
    IDA_ASSERT(p != NULL && id_out != NULL);
    if (c == NULL || c->ops == NULL || c->ops->receive == NULL) {
        return IDA_EINVAL;
    }
    return add_target(p, c, NULL, NULL, c->inbox_capacity, id_out);
}

int ida_pool_add_external(struct ida_pool *p,
                          uint32_t inbox_capacity,
                          ida_pool_notify_fn notify,
                          void *notify_arg,
                          uint32_t *id_out)
{
    IDA_ASSERT(p != NULL && id_out != NULL);
    return add_target(p, NULL, notify, notify_arg, inbox_capacity, id_out);
}

/* --- assignments ---------------------------------------------------------- */

/* Group processors of assignment @c by worker (counting sort). */
static void build_order(struct ida_pool *p, int c)
{
    uint32_t *start = p->start[c];
    memset(start, 0, (p->nthreads + 1) * sizeof(*start));
    for (uint32_t k = 0; k < p->nproc; k++) {
        IDA_ASSERT(p->assign[c][k] < p->nthreads);
        start[p->assign[c][k] + 1]++;
    }
    for (uint32_t i = 0; i < p->nthreads; i++) {
        start[i + 1] += start[i];
    }
    uint32_t fill[IDA_POOL_THREADS_MAX];
    memcpy(fill, start, p->nthreads * sizeof(*fill));
    for (uint32_t k = 0; k < p->nproc; k++) {
        p->order[c][fill[p->assign[c][k]]++] = k;
    }
    IDA_ASSERT(start[p->nthreads] == p->nproc);
}

/* Worker @w takes the current assignment: release the old processors, then
 * lock the new ones. Releasing
 * everything before locking anything is what rules out deadlock. */
static void switch_assignment(struct worker *w, int cur)
{
    struct ida_pool *p = w->pool;
    if (w->local >= 0) {
        const uint32_t *ord = p->order[w->local];
        for (uint32_t i = p->start[w->local][w->index];
             i < p->start[w->local][w->index + 1]; i++) {
            pthread_mutex_unlock(&p->t[p->procs[ord[i]]]->lock);
        }
    }
    const uint32_t *ord = p->order[cur];
    for (uint32_t i = p->start[cur][w->index]; i < p->start[cur][w->index + 1];
         i++) {
        uint32_t k = ord[i];
        struct target *t = p->t[p->procs[k]];
        pthread_mutex_lock(&t->lock);
        atomic_store(&t->owner, w->index);
        /* Fresh statistics for the new period (only this worker writes
         * processor k's row until the next switch). */
        t->busy_ns = 0;
        memset(&p->edge_ns[(size_t)k * p->nproc], 0,
               p->nproc * sizeof(*p->edge_ns));
        ida_sftimer_reset(&t->ping_sf);
        ida_sftimer_reset(&t->recv_sf);
    }
    w->local = cur;
    w->can_be_updated = true;
    ida_wtimer_reset(&w->reshard_timer);
    w->idle = false;
}

static void release_all(struct worker *w)
{
    struct ida_pool *p = w->pool;
    if (w->local < 0) {
        return;
    }
    const uint32_t *ord = p->order[w->local];
    for (uint32_t i = p->start[w->local][w->index];
         i < p->start[w->local][w->index + 1]; i++) {
        pthread_mutex_unlock(&p->t[p->procs[ord[i]]]->lock);
    }
    w->local = -1;
}

/* NoUpdatePromise: stop updating statistics and count in, unless the
 * assignment already flipped (then this worker switches first). */
static void promise_no_update(struct worker *w)
{
    struct ida_pool *p = w->pool;
    w->can_be_updated = false;
    uint32_t s = atomic_load_explicit(&p->shadow, memory_order_acquire);
    for (;;) {
        if ((int)(s >> CONF_BIT) != w->local) {
            return;
        }
        IDA_ASSERT((s & COUNT_MASK) < p->nthreads);
        if (atomic_compare_exchange_weak_explicit(&p->shadow, &s, s + 1,
                                                  memory_order_acq_rel,
                                                  memory_order_acquire)) {
            return;
        }
    }
}

/* Reshard, on worker 0 only: when every worker has promised, nobody writes
 * statistics or reads the spare assignment, so both are ours. */
static void try_reshard(struct ida_pool *p)
{
    uint32_t s = atomic_load_explicit(&p->shadow, memory_order_acquire);
    if ((s & COUNT_MASK) < p->nthreads) {
        return;
    }
    int cur = (int)(s >> CONF_BIT);
    int next = !cur;
    for (uint32_t k = 0; k < p->nproc; k++) {
        p->scratch_proc[k] = p->t[p->procs[k]]->busy_ns;
    }
    if (p->cfg.plan != NULL) {
        p->cfg.plan(p->cfg.plan_arg, p->nproc, p->scratch_proc, p->edge_ns,
                    p->nthreads, p->assign[cur], p->assign[next]);
    } else {
        ida_pool_plan(p->nproc, p->scratch_proc, p->edge_ns, p->nthreads,
                      p->assign[cur], p->assign[next]);
    }
    build_order(p, next);
    uint32_t flipped = (uint32_t)next << CONF_BIT;
    /* Nobody else can change the word now: all have promised. */
    bool ok = atomic_compare_exchange_strong_explicit(
        &p->shadow, &s, flipped, memory_order_acq_rel, memory_order_acquire);
    IDA_ASSERT(ok);
    atomic_fetch_add_explicit(&p->reshards, 1, memory_order_relaxed);
}

/* --- running processors --------------------------------------------------- */

static void wake_owner(struct ida_pool *p, struct target *t)
{
    if (!atomic_load_explicit(&p->started, memory_order_acquire) ||
        p->w == NULL) {
        return;
    }
    struct worker *w = &p->w[atomic_load(&t->owner)];
    /* seq_cst pairs with the sleeper's "sleeping = 1; check inboxes". */
    if (atomic_load(&w->sleeping)) {
        pthread_mutex_lock(&w->mu);
        pthread_mutex_unlock(&w->mu);
        pthread_cond_signal(&w->cv);
    }
}

static int deliver(struct ida_pool *p,
                   uint32_t from,
                   uint32_t to,
                   struct ida_msg *msg)
{
    IDA_ASSERT(msg != NULL);
    if (to >= p->n) {
        return IDA_EINVAL;
    }
    struct target *t = p->t[to];
    msg->from = from;
    int rv = ida_rqueue_push(&t->inbox, msg);
    if (rv != 0) {
        return rv;
    }
    /* From here on @msg belongs to the receiver: do not touch it. */
    if (t->ops == NULL) {
        if (t->notify != NULL) {
            t->notify(t->notify_arg);
        }
    } else {
        wake_owner(p, t);
    }
    return 0;
}

int ida_send(struct ida_sender *s, uint32_t to, struct ida_msg *msg)
{
    IDA_ASSERT(s != NULL && s->pool != NULL);
    return deliver(s->pool, s->self, to, msg);
}

int ida_pool_post(struct ida_pool *p, uint32_t to, struct ida_msg *msg)
{
    IDA_ASSERT(p != NULL);
    if (atomic_load(&p->stopping)) {
        return IDA_ESTOPPED;
    }
    return deliver(p, IDA_POOL_OUTSIDE, to, msg);
}

struct ida_msg *ida_pool_external_pop(struct ida_pool *p, uint32_t id)
{
    IDA_ASSERT(p != NULL);
    if (id >= p->n || p->t[id]->ops != NULL) {
        return NULL;
    }
    return ida_rqueue_pop(&p->t[id]->inbox);
}

bool ida_sender_more(const struct ida_sender *s)
{
    IDA_ASSERT(s != NULL && s->pool != NULL && s->self < s->pool->n);
    return !ida_rqueue_empty(&s->pool->t[s->self]->inbox);
}

void ida_sender_error(struct ida_sender *s, int code, const char *text)
{
    if (s->errctx != NULL) {
        s->pool->cfg.errors.add(s->errctx, code, text);
    }
}

static int64_t nonneg(int64_t d)
{
    return d > 0 ? d : 0;
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool pings(const struct target *t)
{
    return t->ops->ping != NULL && t->ping_interval_us > 0;
}

/* Run processor @k once: ping if due at @now, then up to BATCH_MAX
 * messages. Returns whether it did anything. Caller holds the processor's
 * lock. Pings are timed with the clock itself, read once per loop of the
 * worker: an idle worker sleeps until a ping is due (idle_until()), and a
 * predicting timer (timer.h) would not see that sleep at once. */
static bool run_processor(struct worker *w, uint32_t k, int64_t now)
{
    struct ida_pool *p = w->pool;
    uint32_t id = p->procs[k];
    struct target *t = p->t[id];
    struct ida_sender s = {p, id, w->index, w->errctx};
    bool upd = w->can_be_updated;
    bool worked = false;
    bool was_running = atomic_flag_test_and_set(&t->running);
    IDA_ASSERT(!was_running);
    int64_t period = (int64_t)t->ping_interval_us * 1000;
    if (pings(t) && t->ping_due_ns == 0) {
        t->ping_due_ns = now + period; /* the first ping after one period */
    }
    if (pings(t) && now >= t->ping_due_ns) {
        t->ping_due_ns = now + period;
        if (upd) {
            ida_sftimer_start(&t->ping_sf);
        }
        t->ops->ping(t->state, &s);
        if (upd) {
            t->busy_ns += (uint64_t)nonneg(ida_sftimer_finish(&t->ping_sf));
        }
        atomic_fetch_add_explicit(&w->pings, 1, memory_order_relaxed);
        worked = true;
    }
    uint64_t n = 0;
    struct ida_msg *m;
    while (n < BATCH_MAX && (m = ida_rqueue_pop(&t->inbox)) != NULL) {
        uint32_t from = m->from;
        if (upd) {
            ida_sftimer_start(&t->recv_sf);
        }
        t->ops->receive(t->state, m, &s);
        if (upd) {
            uint64_t d = (uint64_t)nonneg(ida_sftimer_finish(&t->recv_sf));
            t->busy_ns += d;
            if (from < p->n && p->t[from]->k != NONE) {
                p->edge_ns[(size_t)k * p->nproc + p->t[from]->k] += d;
            }
        }
        n++;
    }
    atomic_flag_clear(&t->running);
    if (n > 0) {
        atomic_fetch_add_explicit(&w->delivered, n, memory_order_relaxed);
    }
    return worked || n > 0;
}

static bool my_inboxes_empty(struct worker *w)
{
    struct ida_pool *p = w->pool;
    const uint32_t *ord = p->order[w->local];
    for (uint32_t i = p->start[w->local][w->index];
         i < p->start[w->local][w->index + 1]; i++) {
        if (!ida_rqueue_empty(&p->t[p->procs[ord[i]]]->inbox)) {
            return false;
        }
    }
    return true;
}

/* A pause inside a spin-wait loop: the core (or a hyperthread sibling, or
 * the hypervisor) learns that this thread only waits. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Poll this worker's inboxes for up to spin_us. Returns true when one
 * holds a message (no need to park). */
static bool spin_for_work(struct worker *w)
{
    struct ida_pool *p = w->pool;
    if (p->cfg.spin_us == 0) {
        return false;
    }
    int64_t end = mono_ns() + (int64_t)p->cfg.spin_us * 1000;
    do {
        for (int i = 0; i < SPIN_POLLS; i++) {
            if (!my_inboxes_empty(w) || atomic_load(&p->stopping)) {
                return true;
            }
            cpu_relax();
        }
        sched_yield();
    } while (mono_ns() < end);
    return false;
}

/* Until when (CLOCK_MONOTONIC) an idle worker may sleep: the first ping
 * of its processors that is due, at most idle_wait_us from @now. */
static int64_t idle_until(const struct worker *w, int64_t now)
{
    const struct ida_pool *p = w->pool;
    int64_t until = now + (int64_t)p->cfg.idle_wait_us * 1000;
    const uint32_t *ord = p->order[w->local];
    for (uint32_t i = p->start[w->local][w->index];
         i < p->start[w->local][w->index + 1]; i++) {
        const struct target *t = p->t[p->procs[ord[i]]];
        if (pings(t) && t->ping_due_ns != 0 && t->ping_due_ns < until) {
            until = t->ping_due_ns;
        }
    }
    return until;
}

/* PreProcess: sleep (bounded) when the last loop found nothing to do. */
static void idle_wait(struct worker *w)
{
    struct ida_pool *p = w->pool;
    if (spin_for_work(w)) {
        return;
    }
    int64_t now = mono_ns(), until = idle_until(w, now);
    if (until <= now) {
        return; /* a ping is due */
    }
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->sleeping, 1);
    if (my_inboxes_empty(w) && !atomic_load(&p->stopping)) {
        struct timespec ts = {(time_t)(until / 1000000000),
                              (long)(until % 1000000000)};
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    atomic_store(&w->sleeping, 0);
    pthread_mutex_unlock(&w->mu);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct ida_pool *p = w->pool;
    bool resharding = p->cfg.reshard_interval_ms > 0;
    while (!atomic_load_explicit(&p->stopping, memory_order_acquire)) {
        uint32_t s = atomic_load_explicit(&p->shadow, memory_order_acquire);
        int cur = (int)(s >> CONF_BIT);
        if (cur != w->local) {
            switch_assignment(w, cur);
        }
        if (w->idle) {
            idle_wait(w);
        }
        w->idle = true;
        const uint32_t *ord = p->order[w->local];
        int64_t now = mono_ns();
        for (uint32_t i = p->start[w->local][w->index];
             i < p->start[w->local][w->index + 1]; i++) {
            if (run_processor(w, ord[i], now)) {
                w->idle = false;
            }
        }
        if (w->errctx != NULL && p->cfg.errors.tick != NULL) {
            /* Errors of a burst reach the sink's output even when no
             * further error comes to trigger it. */
            p->cfg.errors.tick(w->errctx);
        }
        if (resharding) {
            if (w->can_be_updated && ida_wtimer_check(&w->reshard_timer)) {
                promise_no_update(w);
            }
            if (w->index == 0 && !w->can_be_updated) {
                try_reshard(p);
            }
        }
    }
    release_all(w);
    if (w->errctx != NULL && p->cfg.errors.flush != NULL) {
        p->cfg.errors.flush(w->errctx);
    }
    return NULL;
}

/* --- start and stop ------------------------------------------------------- */

static uint32_t count_threads(const struct ida_pool *p)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n = p->cfg.threads;
    if (n == 0) {
        n = cores > 0 ? (uint32_t)cores : 1;
    }
    if (n > p->nproc) {
        n = p->nproc;
    }
    if (n > IDA_POOL_THREADS_MAX) {
        n = IDA_POOL_THREADS_MAX;
    }
    return n;
}

static int alloc_tables(struct ida_pool *p)
{
    size_t np = p->nproc;
    p->procs = ida_calloc(np, sizeof(*p->procs));
    p->edge_ns = ida_calloc(np * np, sizeof(*p->edge_ns));
    p->scratch_proc = ida_calloc(np, sizeof(*p->scratch_proc));
    p->w =
        ida_malloc_aligned(alignof(struct worker), p->nthreads * sizeof(*p->w));
    if (p->w != NULL) {
        memset(p->w, 0, p->nthreads * sizeof(*p->w));
    }
    bool ok = p->procs && p->edge_ns && p->scratch_proc && p->w;
    for (int c = 0; c < 2; c++) {
        p->assign[c] = ida_calloc(np, sizeof(uint32_t));
        p->order[c] = ida_calloc(np, sizeof(uint32_t));
        p->start[c] = ida_calloc(p->nthreads + 1, sizeof(uint32_t));
        ok = ok && p->assign[c] && p->order[c] && p->start[c];
    }
    return ok ? 0 : IDA_ENOMEM;
}

static void free_tables(struct ida_pool *p)
{
    ida_free(p->procs);
    ida_free(p->edge_ns);
    ida_free(p->scratch_proc);
    ida_free(p->w);
    p->procs = NULL;
    p->edge_ns = NULL;
    p->scratch_proc = NULL;
    p->w = NULL;
    for (int c = 0; c < 2; c++) {
        ida_free(p->assign[c]);
        ida_free(p->order[c]);
        ida_free(p->start[c]);
        p->assign[c] = p->order[c] = p->start[c] = NULL;
    }
}

static int init_worker(struct ida_pool *p, struct worker *w, uint32_t i)
{
    w->pool = p;
    w->index = i;
    w->local = -1;
    w->idle = false;
    atomic_init(&w->sleeping, 0);
    atomic_init(&w->delivered, 0);
    atomic_init(&w->pings, 0);
    ida_wtimer_init(&w->reshard_timer,
                    (int64_t)p->cfg.reshard_interval_ms * 1000000, NULL, NULL);
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        return IDA_ENOMEM;
    }
    /* Timed waits on CLOCK_MONOTONIC: a wall-clock step must not turn the
     * bounded idle wait into a long sleep. */
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        pthread_mutex_destroy(&w->mu);
        return IDA_ENOMEM;
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_destroy(&w->mu);
        return IDA_ENOMEM;
    }
    if (p->cfg.errors.open != NULL) {
        w->errctx = p->cfg.errors.open(p->cfg.errors.arg, i);
    }
    return 0;
}

static void close_worker(struct worker *w)
{
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    if (w->errctx != NULL && w->pool->cfg.errors.close != NULL) {
        w->pool->cfg.errors.close(w->errctx);
    }
    w->errctx = NULL;
}

static void join_workers(struct ida_pool *p)
{
    atomic_store(&p->stopping, true);
    for (uint32_t i = 0; i < p->nthreads; i++) {
        struct worker *w = &p->w[i];
        pthread_mutex_lock(&w->mu);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    for (uint32_t i = 0; i < p->nthreads; i++) {
        if (p->w[i].thread_started) {
            pthread_join(p->w[i].thread, NULL);
            p->w[i].thread_started = false;
        }
    }
}

int ida_pool_start(struct ida_pool *p)
{
    IDA_ASSERT(p != NULL);
    if (atomic_load(&p->started)) {
        return IDA_EINVAL;
    }
    for (uint32_t id = 0; id < p->n; id++) {
        if (p->t[id]->ops != NULL) {
            p->nproc++;
        }
    }
    if (p->nproc == 0) {
        return IDA_EINVAL;
    }
    p->nthreads = count_threads(p);
    int rv = alloc_tables(p);
    if (rv != 0) {
        goto err_after_count;
    }
    for (uint32_t id = 0, k = 0; id < p->n; id++) {
        if (p->t[id]->ops != NULL) {
            p->t[id]->k = k;
            p->procs[k++] = id;
        }
    }
    /* Initial sharding: by modulo. */
    for (uint32_t k = 0; k < p->nproc; k++) {
        p->assign[0][k] = k % p->nthreads;
        atomic_store(&p->t[p->procs[k]]->owner, k % p->nthreads);
    }
    build_order(p, 0);
    uint32_t inited = 0;
    for (; inited < p->nthreads; inited++) {
        rv = init_worker(p, &p->w[inited], inited);
        if (rv != 0) {
            goto err_after_workers;
        }
    }
    atomic_store(&p->started, true);
    for (uint32_t i = 0; i < p->nthreads; i++) {
        if (pthread_create(&p->w[i].thread, NULL, worker_main, &p->w[i]) != 0) {
            rv = IDA_ENOMEM;
            join_workers(p);
            atomic_store(&p->started, false);
            atomic_store(&p->stopping, false);
            goto err_after_workers;
        }
        p->w[i].thread_started = true;
    }
    return 0;

err_after_workers:
    for (uint32_t i = 0; i < inited; i++) {
        close_worker(&p->w[i]);
    }
    for (uint32_t id = 0; id < p->n; id++) {
        p->t[id]->k = NONE;
    }
err_after_count:
    free_tables(p);
    p->nproc = 0;
    p->nthreads = 0;
    return rv;
}

uint32_t ida_pool_threads(const struct ida_pool *p)
{
    return p->nthreads;
}

/* Deliver what is left on the calling thread (all workers joined, so it
 * alone runs processors now). */
static void drain(struct ida_pool *p)
{
    uint64_t budget = p->cfg.drain_max;
    bool progress = true;
    while (progress && budget > 0) {
        progress = false;
        for (uint32_t k = 0; k < p->nproc && budget > 0; k++) {
            uint32_t id = p->procs[k];
            struct target *t = p->t[id];
            struct ida_sender s = {p, id, NONE, NULL};
            struct ida_msg *m;
            while (budget > 0 && (m = ida_rqueue_pop(&t->inbox)) != NULL) {
                t->ops->receive(t->state, m, &s);
                budget--;
                atomic_fetch_add(&p->drained, 1);
                progress = true;
            }
        }
    }
}

static void drop_msg_cb(void *item, void *arg)
{
    struct ida_pool *p = arg;
    atomic_fetch_add(&p->dropped, 1);
    ida_msg_free(item);
}

void ida_pool_stop(struct ida_pool *p, enum ida_pool_stop_mode mode)
{
    IDA_ASSERT(p != NULL);
    if (p->stopped) {
        return;
    }
    p->stopped = true;
    if (!atomic_load(&p->started)) {
        atomic_store(&p->stopping, true);
        return;
    }
    join_workers(p);
    if (mode == IDA_POOL_STOP_DRAIN) {
        drain(p);
    }
    /* Whatever is left in processor inboxes will never be delivered. */
    for (uint32_t k = 0; k < p->nproc; k++) {
        struct ida_msg *m;
        while ((m = ida_rqueue_pop(&p->t[p->procs[k]]->inbox)) != NULL) {
            drop_msg_cb(m, p);
        }
    }
}

void ida_pool_close(struct ida_pool *p)
{
    if (p == NULL) {
        return;
    }
    ida_pool_stop(p, IDA_POOL_STOP_DROP);
    for (uint32_t id = 0; id < p->n; id++) {
        struct target *t = p->t[id];
        ida_rqueue_close(&t->inbox, drop_msg_cb, p);
        pthread_mutex_destroy(&t->lock);
        ida_free(t);
    }
    if (p->w != NULL) {
        for (uint32_t i = 0; i < p->nthreads; i++) {
            close_worker(&p->w[i]);
        }
    }
    free_tables(p);
    ida_free(p->t);
    ida_free(p);
}

void ida_pool_get_stats(struct ida_pool *p, struct ida_pool_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->reshards = atomic_load(&p->reshards);
    out->dropped = atomic_load(&p->dropped);
    out->delivered = atomic_load(&p->drained);
    if (p->w != NULL) {
        for (uint32_t i = 0; i < p->nthreads; i++) {
            out->delivered += atomic_load(&p->w[i].delivered);
            out->pings += atomic_load(&p->w[i].pings);
        }
    }
}

uint32_t ida_pool_owner(struct ida_pool *p, uint32_t id)
{
    IDA_ASSERT(id < p->n);
    return atomic_load(&p->t[id]->owner);
}
