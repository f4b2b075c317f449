/* libidalloc: idalloc_next(), ids from locally held blocks.
 *
 * The bookkeeping is src/client/nextblock.c; this file adds the threads.
 * Every pool's block state is guarded by the client mutex c->mu. A refill
 * is an asynchronous reserve (idalloc_reserve_async()) whose callback, on
 * the client's I/O thread, lands the block, so a caller never pays a round
 * trip unless its pool ran completely dry; nextblock guarantees at most one
 * refill in flight per pool whatever the number of callers. A refill that
 * ends unknown is repeated once with its request id from its callback (if
 * it acted, that returns its block instead of losing it), then released.
 *
 * Fast path (no lock, no atomic read-modify-write, no system call): each
 * thread keeps, per (client, pool), a small run of ids [lo, hi) taken from
 * the pool's block under c->mu in one go (a "grab" of up to GRAB_MAX ids,
 * at most a sixteenth of the block size, so a block is shared fairly and a
 * thread that stops calling strands few ids). A call that finds its run
 * non-empty returns lo++; only an empty run takes the mutex. The run lives
 * in a struct next_slot that the pool owns (so idalloc_next_stats() can sum
 * what each thread handed out after the thread is gone) and the thread
 * finds through a _Thread_local cache keyed by the client's generation, a
 * number no other client object ever gets, so a cache entry of a freed
 * client is never followed. Ids still in a run when its thread exits or
 * the client is freed are never handed out (like the rest of a block).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/heap.h"
#include "src/client/client.h"
#include "src/client/nextblock.h"

#define POOL_NAME_BYTES_MAX 255
#define GRAB_MAX            256
#define TL_CACHE            4

/* One thread's run of ids of one pool; written by that thread only. The
 * padding keeps two threads' hot words off one cache line. */
struct next_slot
{
    uint64_t lo, hi;
    _Atomic uint64_t served; /* relaxed stores by the owner, read by stats */
    struct next_slot *next;
    char pad[64];
};

struct ida_next_pool
{
    char *name;
    struct ida_next_blocks b;
    pthread_cond_t cond;        /* a refill landed or failed */
    uint64_t refill_n;          /* ids the refill in flight asked for */
    int refill_repeated;        /* it was repeated once already */
    struct idalloc_call refill; /* its call struct */
    int last_err;               /* error of the last failed refill */
    char last_errmsg[IDALLOC_ERRMSG_MAX]; /* and its detail */
    uint64_t fail_gen;                    /* bumped on each failed refill */
    uint64_t in_flight, max_in_flight;
    struct next_slot *slots; /* every thread's run, freed with the pool */
    struct ida_next_pool *next;
};

struct tl_entry
{
    uint64_t gen; /* client generation; 0: empty */
    struct ida_next_pool *pool;
    struct next_slot *slot;
};

static _Thread_local struct tl_entry tl_cache[TL_CACHE];
static _Thread_local unsigned tl_victim;
static atomic_uint_fast64_t client_gens;

static void cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

static void abs_deadline(uint64_t deadline_ms, struct timespec *ts)
{
    ts->tv_sec = (time_t)(deadline_ms / 1000);
    ts->tv_nsec = (long)(deadline_ms % 1000) * 1000000;
}

/* Holds c->mu. */
static struct ida_next_pool *find_pool(struct idalloc_client *c,
                                       const char *name,
                                       int create)
{
    for (struct ida_next_pool *p = c->next_pools; p != NULL; p = p->next) {
        if (strcmp(p->name, name) == 0) {
            return p;
        }
    }
    if (!create) {
        return NULL;
    }
    struct ida_next_pool *p = ida_calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    p->name = ida_strndup(name, strlen(name));
    if (p->name == NULL) {
        ida_free(p);
        return NULL;
    }
    ida_next_init(&p->b, c->opts.next_block_min, c->opts.next_block_max);
    cond_init_monotonic(&p->cond);
    p->next = c->next_pools;
    c->next_pools = p;
    return p;
}

void ida__client_next_init(struct idalloc_client *c)
{
    c->next_gen = atomic_fetch_add(&client_gens, 1) + 1;
}

/* Free every pool: after the I/O thread stopped (no refill in flight). */
void ida__client_next_free(struct idalloc_client *c)
{
    while (c->next_pools != NULL) {
        struct ida_next_pool *p = c->next_pools;
        c->next_pools = p->next;
        pthread_cond_destroy(&p->cond);
        while (p->slots != NULL) {
            struct next_slot *sl = p->slots;
            p->slots = sl->next;
            ida_free(sl);
        }
        ida_free(p->name);
        ida_free(p);
    }
}

/* The refill ended @rv (its first id @first). Holds c->mu. */
static void refill_ended(struct ida_next_pool *p, int rv, uint64_t first)
{
    p->in_flight--;
    if (rv == 0) {
        ida_next_refilled(&p->b, first, p->refill_n, ida__client_now_ms());
    } else {
        ida_next_refill_failed(&p->b);
        p->last_err = rv;
        snprintf(p->last_errmsg, sizeof(p->last_errmsg), "%s",
                 p->refill.errmsg);
        p->fail_gen++;
    }
    pthread_cond_broadcast(&p->cond);
}

/* A refill's callback, on the I/O thread. */
static void refill_done(struct idalloc_client *c,
                        struct idalloc_call *call,
                        const struct idalloc_result *res,
                        void *arg)
{
    struct ida_next_pool *p = arg;
    int rv = res->error;
    uint64_t first = res->id;
    if (call->state == IDALLOC_CALL_UNKNOWN && !p->refill_repeated) {
        p->refill_repeated = 1;
        if (idalloc_reserve_async(c, p->name, p->refill_n, call, refill_done,
                                  p) == 0) {
            return; /* the repeat's callback lands it */
        }
    }
    if (call->state == IDALLOC_CALL_UNKNOWN) {
        (void)idalloc_call_release(c, call);
    }
    pthread_mutex_lock(&c->mu);
    refill_ended(p, rv, first);
    pthread_mutex_unlock(&c->mu);
}

/* Reserve @n ids for @p. Holds c->mu. */
static void request_refill(struct idalloc_client *c,
                           struct ida_next_pool *p,
                           uint64_t n)
{
    p->in_flight++;
    if (p->in_flight > p->max_in_flight) {
        p->max_in_flight = p->in_flight;
    }
    p->refill_n = n;
    p->refill_repeated = 0;
    idalloc_call_init(&p->refill);
    if (idalloc_reserve_async(c, p->name, n, &p->refill, refill_done, p) != 0) {
        refill_ended(p, p->refill.error, 0);
    }
}

/* This thread's slot for (@c, @p), created on first use. Holds c->mu. */
static struct next_slot *slot_for(struct idalloc_client *c,
                                  struct ida_next_pool *p)
{
    for (unsigned i = 0; i < TL_CACHE; i++) {
        if (tl_cache[i].gen == c->next_gen && tl_cache[i].pool == p) {
            return tl_cache[i].slot;
        }
    }
    struct next_slot *sl = ida_calloc(1, sizeof(*sl));
    if (sl == NULL) {
        return NULL;
    }
    sl->next = p->slots;
    p->slots = sl;
    unsigned v = tl_victim++ % TL_CACHE;
    tl_cache[v] = (struct tl_entry){.gen = c->next_gen, .pool = p, .slot = sl};
    return sl;
}

/* Hand out one id of @sl's run. */
static inline uint64_t serve(struct next_slot *sl)
{
    atomic_store_explicit(
        &sl->served,
        atomic_load_explicit(&sl->served, memory_order_relaxed) + 1,
        memory_order_relaxed);
    return sl->lo++;
}

/* A next() call ends: it never has an outcome to resolve (a refill that
 * ended unknown is repeated by its callback, not by the caller). */
static void call_done(struct idalloc_call *call, int rv)
{
    if (call != NULL) {
        call->state = IDALLOC_CALL_DONE;
        call->seq = 0;
        call->error = rv;
    }
}

int idalloc_next(struct idalloc_client *c,
                 const char *pool,
                 uint64_t *id,
                 struct idalloc_call *call)
{
    if (pool == NULL || id == NULL) {
        if (call != NULL) {
            call->errmsg[0] = '\0';
        }
        ida__call_error(call, "next: a pool name and an id are needed");
        call_done(call, IDA_EINVAL);
        return IDA_EINVAL;
    }
    for (unsigned i = 0; i < TL_CACHE; i++) {
        struct tl_entry *e = &tl_cache[i];
        if (e->gen == c->next_gen && e->slot->lo < e->slot->hi &&
            strcmp(e->pool->name, pool) == 0) {
            *id = serve(e->slot);
            if (call != NULL) {
                call->errmsg[0] = '\0';
                call_done(call, 0);
            }
            return 0;
        }
    }
    if (call != NULL) {
        call->errmsg[0] = '\0';
    }
    if (ida__client_on_loop(c)) {
        /* It may have to wait for a refill, which this thread lands. */
        ida__call_error(call,
                        "next: a blocking call from a completion callback "
                        "would wait for its own thread");
        call_done(call, IDA_EINVAL);
        return IDA_EINVAL;
    }
    if (strlen(pool) > POOL_NAME_BYTES_MAX) {
        ida__call_error(call, "next: a pool name of at most %d bytes is needed",
                        POOL_NAME_BYTES_MAX);
        call_done(call, IDA_EINVAL);
        return IDA_EINVAL;
    }
    uint64_t deadline = ida__client_now_ms() + c->opts.call_timeout_ms;
    int rv = 0;
    pthread_mutex_lock(&c->mu);
    struct ida_next_pool *p = find_pool(c, pool, 1);
    struct next_slot *sl = p != NULL ? slot_for(c, p) : NULL;
    if (sl == NULL) {
        pthread_mutex_unlock(&c->mu);
        ida__call_error(call, "next: out of memory");
        call_done(call, IDA_ENOMEM);
        return IDA_ENOMEM;
    }
    for (;;) {
        uint64_t refill, first = 0, n = 0;
        uint64_t grab = p->b.block_size / 16;
        grab = grab < 1 ? 1 : grab > GRAB_MAX ? GRAB_MAX : grab;
        enum ida_next_take_result r = ida_next_take_n(
            &p->b, ida__client_now_ms(), grab, &first, &n, &refill);
        if (refill > 0) {
            request_refill(c, p, refill);
        }
        if (r == IDA_NEXT_OK) {
            sl->lo = first;
            sl->hi = first + n;
            *id = serve(sl);
            break;
        }
        uint64_t gen = p->fail_gen;
        struct timespec ts;
        abs_deadline(deadline, &ts);
        int w = 0;
        while (p->b.cur == p->b.cur_end && p->b.spare == p->b.spare_end &&
               p->fail_gen == gen && w == 0) {
            w = pthread_cond_timedwait(&p->cond, &c->mu, &ts);
        }
        if (p->fail_gen != gen) {
            rv = p->last_err;
            ida__call_error(call, "next: refilling pool %s failed: %s", pool,
                            p->last_errmsg[0] != '\0' ? p->last_errmsg
                                                      : idalloc_strerror(rv));
            break;
        }
        if (w == ETIMEDOUT && p->b.cur == p->b.cur_end &&
            p->b.spare == p->b.spare_end) {
            rv = IDA_ETIMEDOUT;
            ida__call_error(call, "next: no block for pool %s within %u ms",
                            pool, c->opts.call_timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    call_done(call, rv);
    return rv;
}

/* Ids callers got: what every thread's run served. Holds c->mu. */
static uint64_t served_sum(struct ida_next_pool *p)
{
    uint64_t sum = 0;
    for (struct next_slot *sl = p->slots; sl != NULL; sl = sl->next) {
        sum += atomic_load_explicit(&sl->served, memory_order_relaxed);
    }
    return sum;
}

int idalloc_next_stats(struct idalloc_client *c,
                       const char *pool,
                       struct idalloc_next_stats *out)
{
    pthread_mutex_lock(&c->mu);
    struct ida_next_pool *p = find_pool(c, pool, 0);
    if (p != NULL) {
        *out = (struct idalloc_next_stats){
            .handed_out = served_sum(p),
            .refills = p->b.refills,
            .refills_max_in_flight = p->max_in_flight,
            .waits = p->b.waits,
            .block_size = p->b.block_size,
        };
    }
    pthread_mutex_unlock(&c->mu);
    return p != NULL ? 0 : IDA_ENOTFOUND;
}
