/* Pool benchmarks (make bench): figures, not pass/fail.
 *
 *  1. Lock-free vs mutex queue, 1 producer + 1
 *     consumer and 2 + 2, BENCH_QUEUE_MSGS messages per configuration
 *     (default 10 million), ops/s and the ratio lock-free / mutex.
 *  2. Round trip between two processors on different worker threads:
 *     median and p99 latency.
 *  3. Pool throughput on a 4-processor ring (messages delivered per second).
 *  4. Low-overhead timer cost per call against clock_gettime.
 * A free-list allocator lost to glibc malloc here (42 vs 17 ns per
 * alloc+free pair) and is not used.
 *
 * Environment: BENCH_QUEUE_MSGS=N changes the queue run length. */

/* _GNU_SOURCE for pthread_setaffinity_np(): queue threads are pinned so a
 * producer and its consumer really run on different cores (unpinned, the
 * scheduler of this shared 2-core machine often puts both on one core, and
 * the figure then measures batches handed over by sched_yield, not
 * concurrent access). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/pool/pool.h"
#include "src/pool/queue.h"
#include "src/pool/timer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- 1. queues
 * ---------------------------------------------------------------- */

enum qkind { Q_LINKED, Q_MUTEX, Q_RING };
static const char *const qkind_name[] = {"lock-free", "mutex", "ring"};

struct qrun
{
    enum qkind kind;
    struct ida_queue lf;
    struct ida_mqueue mx;
    struct ida_rqueue rq;
    uint64_t per_producer;
    uint64_t total;
    _Atomic int producers_done;
    int producers;
    _Atomic uint64_t popped;
    _Atomic uint64_t full_retries;
    _Atomic uint64_t empty_retries;
    _Atomic uint64_t checksum;
};

static int qpush(struct qrun *r, void *item)
{
    switch (r->kind) {
        case Q_LINKED:
            return ida_queue_push(&r->lf, item);
        case Q_MUTEX:
            return ida_mqueue_push(&r->mx, item);
        default:
            return ida_rqueue_push(&r->rq, item);
    }
}

static void *qpop(struct qrun *r)
{
    switch (r->kind) {
        case Q_LINKED:
            return ida_queue_pop(&r->lf);
        case Q_MUTEX:
            return ida_mqueue_pop(&r->mx);
        default:
            return ida_rqueue_pop(&r->rq);
    }
}

/* Back off: spin a little, then give the core away (2 cores, 4 threads). */
static void backoff(unsigned *fails)
{
    if (++*fails > 64) {
        sched_yield();
        *fails = 0;
    }
}

struct qarg
{
    struct qrun *r;
    int cpu;
};

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    /* Best effort: a failure only makes the figure noisier. */
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *qproducer(void *arg)
{
    struct qarg *qa = arg;
    struct qrun *r = qa->r;
    pin(qa->cpu);
    uint64_t retries = 0;
    unsigned fails = 0;
    for (uint64_t i = 1; i <= r->per_producer; i++) {
        while (qpush(r, (void *)(uintptr_t)i) != 0) {
            retries++;
            backoff(&fails);
        }
    }
    atomic_fetch_add(&r->full_retries, retries);
    atomic_fetch_add(&r->producers_done, 1);
    return NULL;
}

static void *qconsumer(void *arg)
{
    struct qarg *qa = arg;
    struct qrun *r = qa->r;
    pin(qa->cpu);
    uint64_t sum = 0, retries = 0, n = 0;
    unsigned fails = 0;
    for (;;) {
        void *it = qpop(r);
        if (it == NULL) {
            /* Done when every producer finished and the queue is still
             * empty after that (their pushes happened before). */
            if (atomic_load(&r->producers_done) == r->producers &&
                (it = qpop(r)) == NULL) {
                break;
            }
            if (it == NULL) {
                retries++;
                backoff(&fails);
                continue;
            }
        }
        sum += (uintptr_t)it;
        n++;
    }
    atomic_fetch_add(&r->popped, n);
    atomic_fetch_add(&r->checksum, sum);
    atomic_fetch_add(&r->empty_retries, retries);
    return NULL;
}

static struct qrun qr;

static double bench_queue(enum qkind kind, int pairs, uint64_t msgs)
{
    memset(&qr, 0, sizeof(qr));
    qr.kind = kind;
    qr.per_producer = msgs / (uint64_t)pairs;
    qr.total = qr.per_producer * (uint64_t)pairs;
    qr.producers = pairs;
    int rv = kind == Q_LINKED  ? ida_queue_init(&qr.lf, 1024)
             : kind == Q_MUTEX ? ida_mqueue_init(&qr.mx, 1024)
                               : ida_rqueue_init(&qr.rq, 1024);
    if (rv != 0) {
        fprintf(stderr, "queue init: %s\n", idalloc_strerror(rv));
        exit(1);
    }
    pthread_t th[8];
    struct qarg args[8];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 2) {
        cores = 2;
    }
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < pairs; i++) {
        /* Producer i and consumer i on different cores. */
        args[2 * i] = (struct qarg){&qr, (i + 1) % (int)cores};
        args[2 * i + 1] = (struct qarg){&qr, i % (int)cores};
        pthread_create(&th[2 * i], NULL, qconsumer, &args[2 * i]);
        pthread_create(&th[2 * i + 1], NULL, qproducer, &args[2 * i + 1]);
    }
    for (int i = 0; i < 2 * pairs; i++) {
        pthread_join(th[i], NULL);
    }
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    uint64_t expect =
        (uint64_t)pairs * qr.per_producer * (qr.per_producer + 1) / 2;
    if (atomic_load(&qr.checksum) != expect ||
        atomic_load(&qr.popped) != qr.total) {
        fprintf(stderr, "queue bench: checksum mismatch: lost or duplicated\n");
        exit(1);
    }
    if (kind == Q_LINKED) {
        ida_queue_close(&qr.lf, NULL, NULL);
    } else if (kind == Q_MUTEX) {
        ida_mqueue_close(&qr.mx, NULL, NULL);
    } else {
        ida_rqueue_close(&qr.rq, NULL, NULL);
    }
    double ops = (double)qr.total / secs;
    printf(
        "  %-9s %d+%d  %5.2f s  cpu %5.2f s  %6.2f M msgs/s"
        "  (full retries %lu, empty retries %lu)\n",
        qkind_name[kind], pairs, pairs, secs, cpu, ops / 1e6,
        (unsigned long)atomic_load(&qr.full_retries),
        (unsigned long)atomic_load(&qr.empty_retries));
    return ops;
}

static double median3(const double *v)
{
    double a = v[0], b = v[1], c = v[2];
    if ((a <= b && b <= c) || (c <= b && b <= a)) {
        return b;
    }
    if ((b <= a && a <= c) || (c <= a && a <= b)) {
        return a;
    }
    return c;
}

static void bench_queues(void)
{
    uint64_t msgs = 10000000;
    const char *env = getenv("BENCH_QUEUE_MSGS");
    if (env != NULL) {
        msgs = strtoull(env, NULL, 10);
    }
    printf(
        "1. queues: %lu messages per run, "
        "capacity 1024\n",
        (unsigned long)msgs);
    /* The machine is shared: alternate the kinds and keep the median of
     * three runs of each. */
    for (int pairs = 1; pairs <= 2; pairs++) {
        double lf[3], mx[3], rq[3];
        for (int rep = 0; rep < 3; rep++) {
            lf[rep] = bench_queue(Q_LINKED, pairs, msgs);
            mx[rep] = bench_queue(Q_MUTEX, pairs, msgs);
            rq[rep] = bench_queue(Q_RING, pairs, msgs);
        }
        double lfm = median3(lf), mxm = median3(mx), rqm = median3(rq);
        printf(
            "  => %d+%d median lock-free %.2f M/s, mutex %.2f M/s, "
            "ring %.2f M/s; ratio lock-free/mutex = %.2f, ring/mutex = "
            "%.2f (the pool uses the ring)\n",
            pairs, pairs, lfm / 1e6, mxm / 1e6, rqm / 1e6, lfm / mxm,
            rqm / mxm);
    }
}

/* The benchmarks' results come back to an external target whose notify
 * posts this semaphore: the main thread sleeps meanwhile. (It used to poll
 * with sched_yield(), a third runnable thread beside two workers on two
 * cores, which measured the scheduler's sharing more than the pool.) */
static sem_t sink_sem;

static void sink_notify(void *arg)
{
    (void)arg;
    sem_post(&sink_sem);
}

static uint32_t add_sink(struct ida_pool *p, uint32_t capacity)
{
    uint32_t sink;
    sem_init(&sink_sem, 0, 0);
    if (ida_pool_add_external(p, capacity, sink_notify, NULL, &sink) != 0) {
        abort();
    }
    return sink;
}

static struct ida_msg *wait_sink(struct ida_pool *p, uint32_t sink)
{
    struct ida_msg *m;
    while ((m = ida_pool_external_pop(p, sink)) == NULL) {
        sem_wait(&sink_sem);
    }
    return m;
}

/* --- 2. round trip ----------------------------------------------------------
 */

#define RTT_SAMPLES 20000

struct rtt
{
    uint32_t peer;
    uint32_t done_sink;
    int64_t sent_ns;
    uint32_t count;
    int64_t samples[RTT_SAMPLES];
};

static struct rtt rtt_a;

static void rtt_a_receive(void *state, struct ida_msg *m, struct ida_sender *s)
{
    struct rtt *r = state;
    int64_t now = ida_clock_monotonic_ns(NULL);
    if (m->type == 1) { /* a reply */
        r->samples[r->count++] = now - r->sent_ns;
    }
    if (r->count == RTT_SAMPLES) {
        ida_send(s, r->done_sink, m);
        return;
    }
    m->type = 0;
    r->sent_ns = ida_clock_monotonic_ns(NULL);
    if (ida_send(s, r->peer, m) != 0) {
        abort();
    }
}

static void rtt_b_receive(void *state, struct ida_msg *m, struct ida_sender *s)
{
    uint32_t a = *(uint32_t *)state;
    m->type = 1;
    if (ida_send(s, a, m) != 0) {
        abort();
    }
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void bench_rtt(uint32_t idle_wait_us, uint32_t spin_us)
{
    static const struct ida_proc_ops a_ops = {rtt_a_receive, NULL};
    static const struct ida_proc_ops b_ops = {rtt_b_receive, NULL};
    struct ida_pool *p;
    struct ida_pool_config cfg = {0};
    cfg.threads = 2;
    cfg.idle_wait_us = idle_wait_us;
    cfg.spin_us = spin_us;
    ida_pool_new(&cfg, &p);
    uint32_t a, b;
    static uint32_t a_id;
    memset(&rtt_a, 0, sizeof(rtt_a));
    uint32_t sink = add_sink(p, 16);
    struct ida_proc_config ca = {"a", &a_ops, &rtt_a, 0, 0};
    struct ida_proc_config cb = {"b", &b_ops, &a_id, 0, 0};
    ida_pool_add(p, &ca, &a);
    ida_pool_add(p, &cb, &b);
    a_id = a;
    rtt_a.peer = b;
    rtt_a.done_sink = sink;
    ida_pool_start(p);
    if (ida_pool_owner(p, a) == ida_pool_owner(p, b)) {
        printf("  (a and b on one thread?)\n");
    }
    ida_pool_post(p, a, ida_msg_new(2, 8));
    ida_msg_free(wait_sink(p, sink));
    ida_pool_close(p);
    qsort(rtt_a.samples, RTT_SAMPLES, sizeof(int64_t), cmp_i64);
    printf(
        "  idle_wait_us=%-5u spin_us=%-3u round trip over %d: median %.1f "
        "us, p99 %.1f us, max %.1f us\n",
        idle_wait_us, spin_us, RTT_SAMPLES,
        rtt_a.samples[RTT_SAMPLES / 2] / 1e3,
        rtt_a.samples[RTT_SAMPLES * 99 / 100] / 1e3,
        rtt_a.samples[RTT_SAMPLES - 1] / 1e3);
}

/* --- 3. ring
 * ------------------------------------------------------------------ */

struct ring_node
{
    uint32_t next;
    uint32_t sink;
};

static struct ring_node ring[4];

static void ring_receive(void *state, struct ida_msg *m, struct ida_sender *s)
{
    struct ring_node *n = state;
    uint64_t *left = (uint64_t *)m->data;
    uint32_t to = n->next;
    if (*left == 0) {
        to = n->sink;
    } else {
        (*left)--;
    }
    /* 64 tokens never fill an inbox of 4096; waiting here on a full one
     * could deadlock (see pool.h). */
    if (ida_send(s, to, m) != 0) {
        abort();
    }
}

static void bench_ring(uint32_t threads, uint32_t reshard_ms, uint32_t spin_us)
{
    static const struct ida_proc_ops ops = {ring_receive, NULL};
    struct ida_pool *p;
    struct ida_pool_config cfg = {0};
    cfg.threads = threads;
    cfg.reshard_interval_ms = reshard_ms;
    cfg.spin_us = spin_us;
    ida_pool_new(&cfg, &p);
    uint32_t ids[4];
    uint32_t sink = add_sink(p, 1024);
    for (int i = 0; i < 4; i++) {
        struct ida_proc_config c = {"ring", &ops, &ring[i], 0, 0};
        ida_pool_add(p, &c, &ids[i]);
    }
    for (int i = 0; i < 4; i++) {
        ring[i].next = ids[(i + 1) % 4];
        ring[i].sink = sink;
    }
    ida_pool_start(p);
    const int tokens = 64;
    const uint64_t hops = 100000;
    double t0 = now_s();
    for (int i = 0; i < tokens; i++) {
        struct ida_msg *m = ida_msg_new(0, sizeof(uint64_t));
        *(uint64_t *)m->data = hops;
        ida_pool_post(p, ids[i % 4], m);
    }
    for (int got = 0; got < tokens; got++) {
        ida_msg_free(wait_sink(p, sink));
    }
    double secs = now_s() - t0;
    struct ida_pool_stats st;
    ida_pool_get_stats(p, &st);
    ida_pool_close(p);
    printf(
        "  threads=%u resharding=%-4s spin_us=%-3u %lu deliveries in %.2f s: "
        "%.2f M msgs/s (%lu reshards)\n",
        threads, reshard_ms ? "on" : "off", spin_us,
        (unsigned long)st.delivered, secs, (double)st.delivered / secs / 1e6,
        (unsigned long)st.reshards);
}

/* --- 4. timers ---------------------------------------------------------------
 */

static void bench_timers(void)
{
    const int n = 20000000;
    struct ida_ptimer t;
    ida_ptimer_init(&t, NULL, NULL);
    int64_t sink = 0;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        sink += ida_ptimer_passed(&t);
    }
    double timer_ns = (now_s() - t0) / n * 1e9;
    t0 = now_s();
    for (int i = 0; i < n; i++) {
        sink += ida_clock_monotonic_ns(NULL);
    }
    double clock_ns = (now_s() - t0) / n * 1e9;
    struct ida_sftimer sf;
    ida_sftimer_init(&sf, NULL, NULL);
    t0 = now_s();
    for (int i = 0; i < n; i++) {
        ida_sftimer_start(&sf);
        sink += ida_sftimer_finish(&sf);
    }
    double sf_ns = (now_s() - t0) / n * 1e9;
    printf(
        "4. timers: periodic timer %.2f ns/call, clock_gettime(MONOTONIC) "
        "%.2f ns/call, ratio %.2f; start+finish pair %.2f ns "
        "(checksum %ld)\n",
        timer_ns, clock_ns, clock_ns / timer_ns, sf_ns, (long)(sink & 1));
}

int main(void)
{
    double t0 = now_s();
    bench_queues();
    printf("2. round trip between two processors on two worker threads\n");
    bench_rtt(1000, 0);
    bench_rtt(1000, 50);
    printf("3. pool throughput, 4-processor ring, 64 tokens x 100000 hops\n");
    bench_ring(1, 0, 0);
    bench_ring(2, 0, 0);
    bench_ring(2, 100, 0);
    bench_ring(2, 0, 50);
    bench_ring(2, 100, 50);
    bench_timers();
    printf("total %.1f s\n", now_s() - t0);
    return 0;
}
