/* The pool: processors, sends, back-pressure, external targets, pings,
 * blocking processors, stop modes, and exclusivity while resharding.
 *
 * No test sleeps for timing: a test that waits for something to happen polls
 * a condition (with sched_yield) and asserts on counts, never on time. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/errtop.h"
#include "src/pool/pool.h"

/* --- fixture ----------------------------------------------------------------
 */

static struct ida_pool *pool;

static void teardown(void)
{
    ida_pool_close(pool);
    pool = NULL;
}

static void new_pool(uint32_t threads, uint32_t reshard_ms)
{
    struct ida_pool_config cfg = {0};
    cfg.threads = threads;
    cfg.reshard_interval_ms = reshard_ms;
    cfg.idle_wait_us = 200;
    cr_assert_eq(ida_pool_new(&cfg, &pool), 0);
}

/* --- helpers: a processor that forwards counters ----------------------------
 *
 * Every processor checks exclusivity with an atomic owner flag (a violation is
 * counted and asserted on by the test thread) and also keeps plain, non-atomic
 * counters that ThreadSanitizer would report if two threads ever ran it at
 * once. */

#define PROCS_MAX 16

#define PARKED_MAX 64

struct node
{
    _Atomic int in_use;
    uint64_t received; /* plain on purpose: the processor's own state */
    uint64_t hops_sum;
    uint32_t next; /* where to forward */
    uint32_t sink; /* external target for finished tokens */
    struct ida_msg *parked[PARKED_MAX]; /* refused by a busy inbox */
    uint32_t parked_to[PARKED_MAX];
    size_t n_parked;
};

static struct node nodes[PROCS_MAX];
static _Atomic uint32_t exclusivity_violations;
static _Atomic uint32_t send_failures;
static _Atomic uint32_t busy_parks; /* sends retried later (IDA_EBUSY) */

struct token
{
    uint64_t hops_left;
    uint64_t hops_done;
};

static void enter(struct node *n)
{
    if (atomic_exchange(&n->in_use, 1) != 0) {
        atomic_fetch_add(&exclusivity_violations, 1);
    }
}

static void leave(struct node *n)
{
    atomic_store(&n->in_use, 0);
}

/* pool.h: never wait for IDA_EBUSY inside a callback; keep the message and
 * send it again later. Parked tokens keep their order; any other send error
 * is a failure of the test. */
static void flush_parked(struct node *n, struct ida_sender *s)
{
    while (n->n_parked > 0) {
        int rv = ida_send(s, n->parked_to[0], n->parked[0]);
        if (rv == IDA_EBUSY) {
            return;
        }
        if (rv != 0) {
            atomic_fetch_add(&send_failures, 1);
            ida_msg_free(n->parked[0]);
        }
        n->n_parked--;
        memmove(n->parked, n->parked + 1, n->n_parked * sizeof(n->parked[0]));
        memmove(n->parked_to, n->parked_to + 1,
                n->n_parked * sizeof(n->parked_to[0]));
    }
}

static void send_or_park(struct node *n,
                         struct ida_sender *s,
                         uint32_t to,
                         struct ida_msg *msg)
{
    flush_parked(n, s);
    int rv = n->n_parked == 0 ? ida_send(s, to, msg) : IDA_EBUSY;
    if (rv == IDA_EBUSY && n->n_parked < PARKED_MAX) {
        n->parked[n->n_parked] = msg;
        n->parked_to[n->n_parked++] = to;
        atomic_fetch_add(&busy_parks, 1);
        return;
    }
    if (rv != 0) {
        atomic_fetch_add(&send_failures, 1);
        ida_msg_free(msg);
    }
}

static void forward_receive(void *state,
                            struct ida_msg *msg,
                            struct ida_sender *s)
{
    struct node *n = state;
    enter(n);
    struct token *t = (struct token *)msg->data;
    n->received++;
    n->hops_sum += t->hops_done;
    uint32_t to = n->next;
    if (t->hops_left == 0) {
        to = n->sink;
    } else {
        t->hops_left--;
        t->hops_done++;
    }
    send_or_park(n, s, to, msg);
    leave(n);
}

/* Resend what a full (or, rarely, momentarily busy) inbox refused. */
static void forward_ping(void *state, struct ida_sender *s)
{
    struct node *n = state;
    enter(n);
    flush_parked(n, s);
    leave(n);
}

static const struct ida_proc_ops forward_ops = {forward_receive, forward_ping};

static uint32_t add_forwarders(uint32_t count, uint32_t *sink_out, bool ring)
{
    uint32_t sink;
    cr_assert_eq(ida_pool_add_external(pool, 1u << 16, NULL, NULL, &sink), 0);
    memset(nodes, 0, sizeof(nodes));
    uint32_t first = 0;
    for (uint32_t i = 0; i < count; i++) {
        /* The ping resends tokens a busy inbox refused (see
         * send_or_park). */
        struct ida_proc_config c = {"fwd", &forward_ops, &nodes[i], 8192, 500};
        uint32_t id;
        cr_assert_eq(ida_pool_add(pool, &c, &id), 0);
        if (i == 0) {
            first = id;
        }
        cr_assert_eq(id, first + i, "ids are dense");
    }
    for (uint32_t i = 0; i < count; i++) {
        nodes[i].next = ring ? first + (i + 1) % count
                             : (i + 1 < count ? first + i + 1 : sink);
        nodes[i].sink = sink;
    }
    *sink_out = sink;
    return first;
}

static struct ida_msg *new_token(uint64_t hops)
{
    struct ida_msg *m = ida_msg_new(7, sizeof(struct token));
    cr_assert_not_null(m);
    struct token *t = (struct token *)m->data;
    t->hops_left = hops;
    t->hops_done = 0;
    return m;
}

static void post(uint32_t to, struct ida_msg *m)
{
    int rv;
    while ((rv = ida_pool_post(pool, to, m)) == IDA_EBUSY) {
        sched_yield();
    }
    cr_assert_eq(rv, 0);
}

/* Collect @count finished tokens from @sink; returns the sum of their hops. */
static uint64_t collect(uint32_t sink, uint64_t count)
{
    uint64_t hops = 0;
    for (uint64_t got = 0; got < count;) {
        struct ida_msg *m = ida_pool_external_pop(pool, sink);
        if (m == NULL) {
            sched_yield();
            continue;
        }
        hops += ((struct token *)m->data)->hops_done;
        ida_msg_free(m);
        got++;
    }
    return hops;
}

/* --- tests ------------------------------------------------------------------
 */

TestSuite(pool, .fini = teardown);

Test(pool, chain_totals_are_exact)
{
    new_pool(2, 0);
    uint32_t sink;
    uint32_t first = add_forwarders(6, &sink, false);
    cr_assert_eq(ida_pool_start(pool), 0);
    cr_assert_eq(ida_pool_threads(pool), 2);
    const uint64_t tokens = 5000;
    for (uint64_t i = 0; i < tokens; i++) {
        /* Enough hops to pass the whole chain. */
        post(first, new_token(100));
    }
    /* Each of the 6 counts one hop as it forwards (the last one to the
     * sink). */
    uint64_t hops = collect(sink, tokens);
    cr_assert_eq(hops, tokens * 6);
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(nodes[i].received, tokens, "node %d", i);
    }
    cr_assert_eq(atomic_load(&exclusivity_violations), 0);
    cr_assert_eq(atomic_load(&send_failures), 0);
    struct ida_pool_stats st;
    ida_pool_get_stats(pool, &st);
    cr_assert_eq(st.delivered, tokens * 6);
}

/* The ring runs in rounds while the pool reshards every millisecond with a
 * planner that moves every processor to another thread each time; rounds go
 * on until at least 20 switches happened. */
static void rotate_plan(void *arg,
                        uint32_t nproc,
                        const uint64_t *proc_ns,
                        const uint64_t *edge_ns,
                        uint32_t nthreads,
                        const uint32_t *old_assign,
                        uint32_t *new_assign)
{
    (void)arg;
    (void)proc_ns;
    (void)edge_ns;
    for (uint32_t k = 0; k < nproc; k++) {
        new_assign[k] = (old_assign[k] + 1 + k % 2) % nthreads;
    }
}

static void check_ring_while_resharding_spin(ida_pool_plan_fn plan,
                                             uint32_t threads,
                                             uint32_t spin_us)
{
    struct ida_pool_config cfg = {0};
    cfg.threads = threads;
    cfg.spin_us = spin_us;
    cfg.reshard_interval_ms = 1;
    cfg.idle_wait_us = 200;
    cfg.plan = plan;
    cr_assert_eq(ida_pool_new(&cfg, &pool), 0);
    uint32_t sink;
    const uint32_t nproc = 4;
    uint32_t first = add_forwarders(nproc, &sink, true);
    cr_assert_eq(ida_pool_start(pool), 0);
    const uint64_t tokens = 8, hops = 2000;
    uint64_t rounds = 0;
    struct ida_pool_stats st;
    do {
        for (uint64_t i = 0; i < tokens; i++) {
            post(first + (uint32_t)(i % nproc), new_token(hops));
        }
        cr_assert_eq(collect(sink, tokens), tokens * hops,
                     "every hop of every token, round %lu",
                     (unsigned long)rounds);
        rounds++;
        ida_pool_get_stats(pool, &st);
    } while (st.reshards < 20);
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    uint64_t received = 0;
    for (uint32_t i = 0; i < nproc; i++) {
        received += nodes[i].received;
    }
    /* Each token is received hops + 1 times (the last one sends it out). */
    cr_assert_eq(received, rounds * tokens * (hops + 1));
    cr_assert_eq(atomic_load(&exclusivity_violations), 0);
    cr_assert_eq(atomic_load(&send_failures), 0);
    ida_pool_get_stats(pool, &st);
    cr_assert_eq(st.delivered, received);
}

static void check_ring_while_resharding(ida_pool_plan_fn plan, uint32_t threads)
{
    check_ring_while_resharding_spin(plan, threads, 0);
}

/* Workers that poll before they park (spin_us) lose nothing either, also
 * with more threads than cores, and still stop. */
Test(pool, ring_exact_and_exclusive_with_spinning_workers)
{
    check_ring_while_resharding_spin(rotate_plan, 4, 100);
}

Test(pool, ring_exact_and_exclusive_while_resharding_rotating)
{
    check_ring_while_resharding(rotate_plan, 2);
}

Test(pool, ring_exact_and_exclusive_while_resharding_greedy)
{
    check_ring_while_resharding(NULL, 2);
}

Test(pool, ring_exact_and_exclusive_with_more_threads_than_cores)
{
    check_ring_while_resharding(rotate_plan, 4);
}

Test(pool, threads_capped_by_processors)
{
    new_pool(8, 0);
    uint32_t sink;
    add_forwarders(3, &sink, false);
    cr_assert_eq(ida_pool_start(pool), 0);
    cr_assert_eq(ida_pool_threads(pool), 3);
}

Test(pool, start_without_processors_is_refused)
{
    new_pool(2, 0);
    uint32_t ext;
    cr_assert_eq(ida_pool_add_external(pool, 4, NULL, NULL, &ext), 0);
    cr_assert_eq(ida_pool_start(pool), IDA_EINVAL);
}

Test(pool, bad_arguments_are_refused)
{
    struct ida_pool_config cfg = {0};
    cfg.threads = IDA_POOL_THREADS_MAX + 1;
    struct ida_pool *p = NULL;
    cr_assert_eq(ida_pool_new(&cfg, &p), IDA_EINVAL);
    new_pool(1, 0);
    uint32_t id;
    struct ida_proc_ops no_receive = {NULL, NULL};
    struct ida_proc_config c = {"x", &no_receive, NULL, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &id), IDA_EINVAL);
    struct ida_proc_config big = {"x", &forward_ops, NULL,
                                  IDA_QUEUE_CAPACITY_MAX + 1, 0};
    cr_assert_eq(ida_pool_add(pool, &big, &id), IDA_EINVAL);
    struct ida_proc_config ok = {"x", &forward_ops, &nodes[0], 0, 0};
    cr_assert_eq(ida_pool_add(pool, &ok, &id), 0);
    struct ida_msg *m = new_token(0);
    cr_assert_eq(ida_pool_post(pool, id + 5, m), IDA_EINVAL, "no such target");
    ida_msg_free(m); /* still ours after an error */
    cr_assert_eq(ida_pool_start(pool), 0);
    cr_assert_eq(ida_pool_start(pool), IDA_EINVAL, "already started");
    cr_assert_eq(ida_pool_add(pool, &ok, &id), IDA_EINVAL, "after start");
}

/* A processor that counts, for stop modes and back-pressure. */
static _Atomic uint64_t counted;
static void count_receive(void *state,
                          struct ida_msg *msg,
                          struct ida_sender *s)
{
    (void)state;
    (void)s;
    atomic_fetch_add(&counted, 1);
    ida_msg_free(msg);
}
static const struct ida_proc_ops count_ops = {count_receive, NULL};

Test(pool, full_inbox_is_back_pressure_and_keeps_ownership)
{
    new_pool(1, 0);
    uint32_t id;
    struct ida_proc_config c = {"count", &count_ops, NULL, 4, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &id), 0);
    /* Not started: nothing drains the inbox. */
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ida_pool_post(pool, id, ida_msg_new(1, 0)), 0);
    }
    struct ida_msg *m = ida_msg_new(1, 0);
    cr_assert_eq(ida_pool_post(pool, id, m), IDA_EBUSY);
    cr_assert_eq(ida_pool_start(pool), 0);
    /* Still ours: deliver it once there is room. */
    post(id, m);
    while (atomic_load(&counted) < 5) {
        sched_yield();
    }
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    cr_assert_eq(atomic_load(&counted), 5);
}

Test(pool, stop_drain_delivers_everything_queued)
{
    new_pool(2, 0);
    uint32_t a, b;
    struct ida_proc_config c = {"count", &count_ops, NULL, 100000, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &a), 0);
    cr_assert_eq(ida_pool_add(pool, &c, &b), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    for (int i = 0; i < 20000; i++) {
        post(i % 2 ? a : b, ida_msg_new(1, 0));
    }
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    cr_assert_eq(atomic_load(&counted), 20000);
    cr_assert_eq(ida_pool_post(pool, a, (struct ida_msg *)&c), IDA_ESTOPPED,
                 "posts after stop are refused");
    struct ida_pool_stats st;
    ida_pool_get_stats(pool, &st);
    cr_assert_eq(st.delivered, 20000);
    cr_assert_eq(st.dropped, 0);
}

/* ida_sender_more(): a processor sees whether messages wait behind the one
 * it is given (storage's group commit puts a commit off while they do).
 * Three messages posted before the start: the first two see more, the
 * last does not. */
static int more_seen[4];
static _Atomic int more_n;

static void more_receive(void *state, struct ida_msg *msg, struct ida_sender *s)
{
    (void)state;
    int i = atomic_load(&more_n);
    if (i < 4) {
        more_seen[i] = ida_sender_more(s);
    }
    atomic_store(&more_n, i + 1);
    ida_msg_free(msg);
}

static const struct ida_proc_ops more_ops = {more_receive, NULL};

Test(pool, a_processor_sees_whether_more_messages_wait)
{
    new_pool(1, 0);
    uint32_t a;
    struct ida_proc_config c = {"more", &more_ops, NULL, 16, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &a), 0);
    for (int i = 0; i < 3; i++) {
        post(a, ida_msg_new(1, 0));
    }
    cr_assert_eq(ida_pool_start(pool), 0);
    while (atomic_load(&more_n) < 3) {
        sched_yield();
    }
    cr_assert(more_seen[0] && more_seen[1], "two messages were waiting");
    cr_assert(!more_seen[2], "none was waiting behind the last");
}

static void pause_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* count_receive(), but the first message waits until held_open: the
 * worker is held while the test queues more and asks for the stop. */
static atomic_bool held_open, held_entered;

static void held_receive(void *state, struct ida_msg *msg, struct ida_sender *s)
{
    if (!atomic_exchange(&held_entered, true)) {
        while (!atomic_load(&held_open)) {
            pause_us(1000);
        }
    }
    count_receive(state, msg, s);
}
static const struct ida_proc_ops held_ops = {held_receive, NULL};

/* Lets the held worker go once the stop was asked: a post to @arg's
 * processor is refused from then on (the posts made before are counted). */
struct opener
{
    uint32_t to, extra;
};

static void *open_held_later(void *arg)
{
    struct opener *o = arg;
    for (;;) {
        struct ida_msg *m = ida_msg_new(1, 0);
        int rv = ida_pool_post(pool, o->to, m);
        if (rv == 0) {
            o->extra++;
        } else {
            ida_msg_free(m);
            if (rv == IDA_ESTOPPED) {
                break;
            }
        }
        pause_us(1000);
    }
    atomic_store(&held_open, true);
    return NULL;
}

Test(pool, stop_drop_frees_what_was_not_delivered)
{
    new_pool(1, 0);
    uint32_t a;
    struct ida_proc_config c = {"count", &held_ops, NULL, 100000, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &a), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    post(a, ida_msg_new(1, 0));
    while (!atomic_load(&held_entered)) {
        pause_us(100);
    }
    /* The worker is in its first receive: these wait in the inbox. */
    for (int i = 1; i < 20000; i++) {
        post(a, ida_msg_new(1, 0));
    }
    pthread_t opener;
    struct opener o = {a, 0};
    cr_assert_eq(pthread_create(&opener, NULL, open_held_later, &o), 0);
    ida_pool_stop(pool, IDA_POOL_STOP_DROP);
    pthread_join(opener, NULL);
    struct ida_pool_stats st;
    ida_pool_get_stats(pool, &st);
    /* Every message was either delivered or freed (ASan/valgrind check the
     * freeing); none twice; and most were freed undelivered (the worker
     * finishes at most the batch it was in). */
    cr_assert_eq(atomic_load(&counted), st.delivered);
    cr_assert_eq(st.delivered + st.dropped, 20000 + o.extra);
    cr_assert_gt(st.dropped, 10000, "%llu dropped",
                 (unsigned long long)st.dropped);
}

/* External target: notify runs on the sending thread after the push. */
static _Atomic uint64_t notified;
static void notify_cb(void *arg)
{
    cr_assert_eq(arg, &notified);
    atomic_fetch_add(&notified, 1);
}

static void echo_receive(void *state, struct ida_msg *msg, struct ida_sender *s)
{
    uint32_t ext = *(uint32_t *)state;
    msg->type = 99;
    cr_assert_eq(ida_send(s, ext, msg), 0);
}
static const struct ida_proc_ops echo_ops = {echo_receive, NULL};

Test(pool, external_target_gets_replies_and_notifications)
{
    new_pool(2, 0);
    static uint32_t ext;
    cr_assert_eq(ida_pool_add_external(pool, 1024, notify_cb, &notified, &ext),
                 0);
    uint32_t echo;
    struct ida_proc_config c = {"echo", &echo_ops, &ext, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &echo), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    cr_assert_eq(ida_pool_threads(pool), 1, "externals are not shards");
    for (int i = 0; i < 100; i++) {
        post(echo, ida_msg_new(1, 0));
    }
    for (int got = 0; got < 100;) {
        struct ida_msg *m = ida_pool_external_pop(pool, ext);
        if (m == NULL) {
            sched_yield();
            continue;
        }
        cr_assert_eq(m->type, 99);
        cr_assert_eq(m->from, echo, "from is the sending processor");
        ida_msg_free(m);
        got++;
    }
    cr_assert_eq(atomic_load(&notified), 100);
    cr_assert_null(ida_pool_external_pop(pool, echo), "not an external");
}

/* Pings: periodic calls without any message. */
struct pinger
{
    _Atomic uint64_t pings;
};
static void pinger_ping(void *state, struct ida_sender *s)
{
    (void)s;
    struct pinger *p = state;
    atomic_fetch_add(&p->pings, 1);
}
static const struct ida_proc_ops pinger_ops = {count_receive, pinger_ping};

Test(pool, ping_is_called_periodically)
{
    new_pool(1, 0);
    static struct pinger pg, silent;
    uint32_t id;
    struct ida_proc_config c = {"pinger", &pinger_ops, &pg, 0, 500};
    cr_assert_eq(ida_pool_add(pool, &c, &id), 0);
    struct ida_proc_config c2 = {"silent", &pinger_ops, &silent, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &c2, &id), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    while (atomic_load(&pg.pings) < 5) {
        sched_yield();
    }
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    cr_assert_eq(atomic_load(&silent.pings), 0, "interval 0: no ping");
    struct ida_pool_stats st;
    ida_pool_get_stats(pool, &st);
    cr_assert_eq(st.pings, atomic_load(&pg.pings));
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* An idle worker sleeps until its next ping is due, not for idle_wait_us:
 * with a cap of 10 s, a 2 ms ping still runs about every 2 ms (and never
 * more often). */
Test(pool, idle_worker_wakes_for_its_pings)
{
    struct ida_pool_config cfg = {.threads = 1, .idle_wait_us = 10000000};
    cr_assert_eq(ida_pool_new(&cfg, &pool), 0);
    static struct pinger pg;
    uint32_t id;
    struct ida_proc_config c = {"pinger", &pinger_ops, &pg, 0, 2000};
    cr_assert_eq(ida_pool_add(pool, &c, &id), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    uint64_t t0 = now_us();
    sleep_us(200000);
    uint64_t n = atomic_load(&pg.pings), us = now_us() - t0;
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    cr_assert_geq(n, 20, "%llu pings in %llu us at one per 2 ms",
                  (unsigned long long)n, (unsigned long long)us);
    cr_assert_leq(n, us / 2000 + 1, "%llu pings in %llu us: too often",
                  (unsigned long long)n, (unsigned long long)us);
}

/* A message wakes a sleeping worker at once, whatever idle_wait_us: 200
 * round trips, each waiting for the last, against a 10 s cap (one lost
 * wake-up would cost 10 s). */
Test(pool, message_wakes_a_sleeping_worker)
{
    struct ida_pool_config cfg = {.threads = 1, .idle_wait_us = 10000000};
    cr_assert_eq(ida_pool_new(&cfg, &pool), 0);
    static uint32_t ext;
    cr_assert_eq(ida_pool_add_external(pool, 16, NULL, NULL, &ext), 0);
    uint32_t echo;
    struct ida_proc_config c = {"echo", &echo_ops, &ext, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &echo), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    uint64_t t0 = now_us();
    for (int i = 0; i < 200; i++) {
        if (i % 20 == 0) {
            sleep_us(2000); /* let the worker park */
        }
        post(echo, ida_msg_new(1, 0));
        struct ida_msg *m;
        while ((m = ida_pool_external_pop(pool, ext)) == NULL) {
            cr_assert_lt(now_us() - t0, 5000000, "round trip %d lost", i);
            sched_yield();
        }
        ida_msg_free(m);
    }
}

/* A processor blocked inside receive (like storage in fsync) does not stop
 * processors on other threads. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;
static _Atomic bool blocker_inside;

static void blocker_receive(void *state,
                            struct ida_msg *msg,
                            struct ida_sender *s)
{
    (void)state;
    (void)s;
    atomic_store(&blocker_inside, true);
    pthread_mutex_lock(&gate_mu);
    while (!gate_open) {
        pthread_cond_wait(&gate_cv, &gate_mu);
    }
    pthread_mutex_unlock(&gate_mu);
    ida_msg_free(msg);
}
static const struct ida_proc_ops blocker_ops = {blocker_receive, NULL};

Test(pool, blocked_processor_does_not_stop_other_threads)
{
    new_pool(2, 1);
    uint32_t blocker, counter;
    struct ida_proc_config b = {"blocker", &blocker_ops, NULL, 0, 0};
    struct ida_proc_config c = {"count", &count_ops, NULL, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &b, &blocker), 0);
    cr_assert_eq(ida_pool_add(pool, &c, &counter), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    cr_assert_neq(ida_pool_owner(pool, blocker), ida_pool_owner(pool, counter),
                  "initial sharding by modulo");
    post(blocker, ida_msg_new(1, 0));
    while (!atomic_load(&blocker_inside)) {
        sched_yield();
    }
    for (int i = 0; i < 1000; i++) {
        post(counter, ida_msg_new(1, 0));
    }
    /* Would hang here if the blocked thread held up the others; resharding
     * is on but cannot switch while one worker is blocked. */
    while (atomic_load(&counted) < 1000) {
        sched_yield();
    }
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN);
    cr_assert_eq(atomic_load(&counted), 1000);
}

Test(pool, close_frees_messages_left_in_external_inboxes)
{
    new_pool(1, 0);
    uint32_t ext, id;
    cr_assert_eq(ida_pool_add_external(pool, 16, NULL, NULL, &ext), 0);
    struct ida_proc_config c = {"echo", &echo_ops, &ext, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &id), 0);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(ida_pool_post(pool, ext, ida_msg_new(1, 64)), 0);
    }
    /* Never started; teardown's close must free the 5 (valgrind/ASan). */
}

/* --- the greedy plan (pure function) ----------------------------------------
 */

Test(plan, keeps_assignment_without_measurements)
{
    uint64_t proc[4] = {0}, edge[16] = {0};
    uint32_t old[4] = {1, 0, 1, 0}, out[4];
    ida_pool_plan(4, proc, edge, 2, old, out);
    cr_assert_arr_eq(out, old, sizeof(out));
}

Test(plan, heavy_processor_gets_a_thread_of_its_own)
{
    uint64_t proc[4] = {1000, 10, 10, 10}, edge[16] = {0};
    uint32_t old[4] = {0, 0, 1, 1}, out[4];
    ida_pool_plan(4, proc, edge, 2, old, out);
    for (int i = 1; i < 4; i++) {
        cr_assert_neq(out[i], out[0], "light %d shares with the heavy one", i);
    }
}

/* Plan four processors @proc with edges @edge on two threads (from the
 * assignment 0 1 0 1): @a with @b, @c with @d, and the two pairs apart. */
static void check_pairs(const uint64_t *proc,
                        const uint64_t *edge,
                        uint32_t a,
                        uint32_t b,
                        uint32_t c,
                        uint32_t d)
{
    uint32_t old[4] = {0, 1, 0, 1}, out[4];
    ida_pool_plan(4, proc, edge, 2, old, out);
    cr_assert_eq(out[a], out[b], "%u and %u apart: %u %u %u %u", a, b, out[0],
                 out[1], out[2], out[3]);
    cr_assert_eq(out[c], out[d]);
    cr_assert_neq(out[a], out[c], "load is balanced");
}

Test(plan, chatty_pairs_are_put_together)
{
    /* Four equal processors; 0<->2 and 1<->3 exchange a lot. */
    uint64_t proc[4] = {100, 100, 100, 100}, edge[16] = {0};
    edge[0 * 4 + 2] = 50;
    edge[2 * 4 + 0] = 50;
    edge[1 * 4 + 3] = 50;
    edge[3 * 4 + 1] = 50;
    check_pairs(proc, edge, 0, 2, 1, 3);
}

Test(plan, chatty_pairs_with_uneven_loads_are_put_together)
{
    /* A ring 0 -> 1 -> 2 -> 3 -> 0 as measured: loads a few percent apart,
     * each receiving from its predecessor. 0 and 1 together come to 204,
     * over the average (201); they belong together all the same. */
    uint64_t proc[4] = {104, 100, 97, 101}, edge[16] = {0};
    edge[1 * 4 + 0] = 60;
    edge[2 * 4 + 1] = 60;
    edge[3 * 4 + 2] = 60;
    edge[0 * 4 + 3] = 10;
    check_pairs(proc, edge, 0, 1, 2, 3);
}

Test(plan, every_processor_gets_a_thread)
{
    /* 5, 5, 5 on 2 threads: average 7.5, so the third fits nowhere under
     * a plain greedy rule; it must still get a thread. */
    uint64_t proc[3] = {5, 5, 5}, edge[9] = {0};
    uint32_t old[3] = {0, 1, 0}, out[3] = {9, 9, 9};
    ida_pool_plan(3, proc, edge, 2, old, out);
    uint32_t per[2] = {0, 0};
    for (int i = 0; i < 3; i++) {
        cr_assert_lt(out[i], 2);
        per[out[i]]++;
    }
    cr_assert(per[0] >= 1 && per[1] >= 1, "both threads used");
}

/* --- error top in the pool
 * ----------------------------------------------------- */

/* --- allocation failures
 * ------------------------------------------------------ */

/* Fail the Nth allocation of new + add + add_external + start for every N:
 * each call returns IDA_ENOMEM or succeeds, and close releases whatever was
 * built (ASan and valgrind check that nothing leaks). */
Test(pool, every_allocation_failure_is_reported_and_cleaned_up)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/tmp/ida-pool-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    /* Failed error-top restores are logged as warnings: keep them out of the
     * test output. */
    int devnull = open("/dev/null", O_WRONLY);
    cr_assert_geq(devnull, 0);
    ida_log_set_fd(devnull);
    struct ida_errtop_where where = {dir, 1};
    int successes = 0, failures = 0;
    for (int n = 0; n < 120; n++) {
        struct ida_pool_config cfg = {0};
        cfg.threads = 2;
        ida_errtop_sink(&cfg.errors, &where);
        struct ida_pool *p = NULL;
        ida_heap_fault_set(n, 1);
        int rv = ida_pool_new(&cfg, &p);
        uint32_t id;
        struct ida_proc_config c = {"count", &count_ops, NULL, 8, 0};
        for (int i = 0; rv == 0 && i < 3; i++) {
            rv = ida_pool_add(p, &c, &id);
        }
        if (rv == 0) {
            rv = ida_pool_add_external(p, 8, NULL, NULL, &id);
        }
        if (rv == 0) {
            rv = ida_pool_start(p);
        }
        ida_heap_fault_set(0, 0);
        cr_assert(rv == 0 || rv == IDA_ENOMEM, "n=%d rv=%d", n, rv);
        if (rv == 0) {
            successes++;
            cr_assert_eq(ida_pool_threads(p), 2);
        } else {
            failures++;
        }
        ida_pool_close(p);
    }
    cr_assert_gt(successes, 0);
    cr_assert_gt(failures, 10, "the walk reached many allocation sites");
    ida_log_set_fd(2);
    close(devnull);
    cr_assert_eq(rmdir(dir), 0, "no file left behind");
}
