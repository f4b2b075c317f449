/* libidalloc: idalloc_next(), ids from locally held blocks.
 *
 * The bookkeeping is src/client/nextblock.c; this file adds the threads.
 * Every pool's state is guarded by the client mutex c->mu. One refiller
 * thread per client performs the reserve calls, so a caller never pays a
 * round trip unless its pool ran completely dry; nextblock guarantees at
 * most one refill in flight per pool whatever the number of callers.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/heap.h"
#include "src/client/client.h"
#include "src/client/nextblock.h"

#define POOL_NAME_BYTES_MAX 255

struct ida_next_pool
{
    char *name;
    struct ida_next_blocks b;
    pthread_cond_t cond; /* a refill landed or failed */
    uint64_t want;       /* ids the refiller should reserve; 0: none */
    int last_err;        /* error of the last failed refill */
    char last_errmsg[IDALLOC_ERRMSG_MAX]; /* and its detail */
    uint64_t fail_gen;                    /* bumped on each failed refill */
    uint64_t in_flight, max_in_flight;
    struct ida_next_pool *next;
};

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

static struct ida_next_pool *pool_wanting_refill(struct idalloc_client *c)
{
    for (struct ida_next_pool *p = c->next_pools; p != NULL; p = p->next) {
        if (p->want > 0) {
            return p;
        }
    }
    return NULL;
}

static void *refiller_main(void *arg)
{
    struct idalloc_client *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        struct ida_next_pool *p = pool_wanting_refill(c);
        if (p == NULL) {
            pthread_cond_wait(&c->refill_cond, &c->mu);
            continue;
        }
        uint64_t n = p->want;
        p->want = 0;
        pthread_mutex_unlock(&c->mu);
        uint64_t first = 0;
        struct idalloc_call call;
        idalloc_call_init(&call);
        int rv = idalloc_reserve(c, p->name, n, &first, &call);
        /* An unknown refill is repeated once with its request id: if it
         * acted, that returns its block instead of losing it. */
        if (call.state == IDALLOC_CALL_UNKNOWN) {
            rv = idalloc_reserve(c, p->name, n, &first, &call);
        }
        if (call.state == IDALLOC_CALL_UNKNOWN) {
            (void)idalloc_call_release(c, &call);
        }
        pthread_mutex_lock(&c->mu);
        p->in_flight--;
        if (rv == 0) {
            ida_next_refilled(&p->b, first, n, ida__client_now_ms());
        } else {
            ida_next_refill_failed(&p->b);
            p->last_err = rv;
            snprintf(p->last_errmsg, sizeof(p->last_errmsg), "%s", call.errmsg);
            p->fail_gen++;
        }
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int ida__client_next_start(struct idalloc_client *c)
{
    cond_init_monotonic(&c->refill_cond);
    if (pthread_create(&c->refiller, NULL, refiller_main, c) != 0) {
        pthread_cond_destroy(&c->refill_cond);
        return IDA_ENOMEM;
    }
    c->refiller_running = 1;
    return 0;
}

void ida__client_next_stop(struct idalloc_client *c)
{
    if (!c->refiller_running) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    pthread_cond_broadcast(&c->refill_cond);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->refiller, NULL);
    c->refiller_running = 0;
    pthread_cond_destroy(&c->refill_cond);
    while (c->next_pools != NULL) {
        struct ida_next_pool *p = c->next_pools;
        c->next_pools = p->next;
        pthread_cond_destroy(&p->cond);
        ida_free(p->name);
        ida_free(p);
    }
}

/* Ask the refiller for @n ids for @p. Holds c->mu. */
static void request_refill(struct idalloc_client *c,
                           struct ida_next_pool *p,
                           uint64_t n)
{
    p->want = n;
    p->in_flight++;
    if (p->in_flight > p->max_in_flight) {
        p->max_in_flight = p->in_flight;
    }
    pthread_cond_signal(&c->refill_cond);
}

int idalloc_next(struct idalloc_client *c,
                 const char *pool,
                 uint64_t *id,
                 struct idalloc_call *call)
{
    if (call != NULL) {
        call->errmsg[0] = '\0';
        call->state = IDALLOC_CALL_DONE;
        call->seq = 0;
    }
    if (pool == NULL || id == NULL || strlen(pool) > POOL_NAME_BYTES_MAX) {
        ida__call_error(call,
                        "next: a pool name of at most %d bytes and an "
                        "id are needed",
                        POOL_NAME_BYTES_MAX);
        if (call != NULL) {
            call->error = IDA_EINVAL;
        }
        return IDA_EINVAL;
    }
    uint64_t deadline = ida__client_now_ms() + c->opts.call_timeout_ms;
    int rv = 0;
    pthread_mutex_lock(&c->mu);
    struct ida_next_pool *p = find_pool(c, pool, 1);
    if (p == NULL) {
        pthread_mutex_unlock(&c->mu);
        return IDA_ENOMEM;
    }
    for (;;) {
        uint64_t refill;
        enum ida_next_take_result r =
            ida_next_take(&p->b, ida__client_now_ms(), id, &refill);
        if (refill > 0) {
            request_refill(c, p, refill);
        }
        if (r == IDA_NEXT_OK) {
            break;
        }
        uint64_t gen = p->fail_gen;
        struct timespec ts;
        abs_deadline(deadline, &ts);
        int w = 0;
        while (p->b.cur == p->b.cur_end && p->fail_gen == gen && w == 0) {
            w = pthread_cond_timedwait(&p->cond, &c->mu, &ts);
        }
        if (p->fail_gen != gen) {
            rv = p->last_err;
            ida__call_error(call, "next: refilling pool %s failed: %s", pool,
                            p->last_errmsg[0] != '\0' ? p->last_errmsg
                                                      : idalloc_strerror(rv));
            break;
        }
        if (w == ETIMEDOUT && p->b.cur == p->b.cur_end) {
            rv = IDA_ETIMEDOUT;
            ida__call_error(call, "next: no block for pool %s within %u ms",
                            pool, c->opts.call_timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (call != NULL) {
        call->error = rv;
    }
    return rv;
}

int idalloc_next_stats(struct idalloc_client *c,
                       const char *pool,
                       struct idalloc_next_stats *out)
{
    pthread_mutex_lock(&c->mu);
    struct ida_next_pool *p = find_pool(c, pool, 0);
    if (p != NULL) {
        *out = (struct idalloc_next_stats){
            .handed_out = p->b.handed_out,
            .refills = p->b.refills,
            .refills_max_in_flight = p->max_in_flight,
            .waits = p->b.waits,
            .block_size = p->b.block_size,
        };
    }
    pthread_mutex_unlock(&c->mu);
    return p != NULL ? 0 : IDA_ENOTFOUND;
}
