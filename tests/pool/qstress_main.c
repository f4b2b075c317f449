/* Long stress of the lock-free queue (make pool-stress SECONDS=n): rounds of
 * P producers and C consumers on a tiny queue, checking after each round that
 * every item was popped exactly once and in per-producer order, with a
 * watchdog that fails the run if no item moves for 10 seconds (a livelock,
 * e.g. a corrupted list). Too slow for `make test`; races that need a thread
 * preempted inside a window of a few instructions show up here.
 *
 * Usage: qstress [SECONDS] (default 20). Exit 0 when clean.
 *
 * _GNU_SOURCE for pthread_setaffinity_np(): threads are pinned round-robin
 * to the cores, so two threads share a core and preempt each other inside
 * queue operations (the bench_pool setup that exposed a pop bug which the
 * unpinned runs never hit). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/pool/queue.h"

#define PER_PRODUCER 200000
#define THREADS_MAX  8

static struct ida_queue q;
static _Atomic uint64_t moved;
static _Atomic int producers_done;
static int producers;
static _Atomic uint64_t bad;
static uint8_t seen[THREADS_MAX][PER_PRODUCER];
static _Atomic uint64_t popped_total;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long cores = 2;

static void pin(int i)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(i % cores, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *producer(void *arg)
{
    uint64_t p = (uint64_t)(uintptr_t)arg;
    pin((int)p);
    for (uint64_t s = 0; s < PER_PRODUCER; s++) {
        void *item = (void *)(uintptr_t)(((p + 1) << 32) | s);
        while (ida_queue_push(&q, item) == IDA_EBUSY) {
            sched_yield();
        }
        atomic_fetch_add_explicit(&moved, 1, memory_order_relaxed);
    }
    atomic_fetch_add(&producers_done, 1);
    return NULL;
}

static void *consumer(void *arg)
{
    pin((int)(uintptr_t)arg + 1);
    int64_t last[THREADS_MAX];
    for (int i = 0; i < THREADS_MAX; i++) {
        last[i] = -1;
    }
    for (;;) {
        void *it = ida_queue_pop(&q);
        if (it == NULL) {
            if (atomic_load(&producers_done) == producers &&
                (it = ida_queue_pop(&q)) == NULL) {
                return NULL;
            }
            if (it == NULL) {
                sched_yield();
                continue;
            }
        }
        uint64_t v = (uintptr_t)it;
        uint64_t p = (v >> 32) - 1, s = v & 0xffffffffu;
        if (p >= (uint64_t)producers || s >= PER_PRODUCER ||
            (int64_t)s <= last[p]) {
            atomic_fetch_add(&bad, 1);
            continue;
        }
        last[p] = (int64_t)s;
        /* Distinct (p, s) per pop: plain byte writes do not race. */
        seen[p][s]++;
        atomic_fetch_add_explicit(&popped_total, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&moved, 1, memory_order_relaxed);
    }
}

static int round_once(int np, int nc, uint32_t capacity)
{
    producers = np;
    atomic_store(&producers_done, 0);
    atomic_store(&popped_total, 0);
    memset(seen, 0, sizeof(seen));
    if (ida_queue_init(&q, capacity) != 0) {
        return 1;
    }
    pthread_t th[2 * THREADS_MAX];
    int n = 0;
    for (int i = 0; i < nc; i++) {
        pthread_create(&th[n++], NULL, consumer, (void *)(uintptr_t)i);
    }
    for (int i = 0; i < np; i++) {
        pthread_create(&th[n++], NULL, producer, (void *)(uintptr_t)i);
    }
    /* Watchdog: the main thread checks that items keep moving. */
    uint64_t last_moved = atomic_load(&moved);
    double last_change = now_s();
    while (atomic_load(&popped_total) < (uint64_t)np * PER_PRODUCER ||
           atomic_load(&producers_done) < np) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
        uint64_t m = atomic_load(&moved);
        if (m != last_moved) {
            last_moved = m;
            last_change = now_s();
        } else if (now_s() - last_change > 10.0) {
            fprintf(stderr, "qstress: no progress for 10 s (livelock)\n");
            return 2;
        }
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
    }
    int rv = atomic_load(&bad) ? 3 : 0;
    for (int p = 0; p < np && rv == 0; p++) {
        for (int s = 0; s < PER_PRODUCER; s++) {
            if (seen[p][s] != 1) {
                fprintf(stderr, "qstress: item %d/%d popped %u times\n", p, s,
                        seen[p][s]);
                rv = 4;
                break;
            }
        }
    }
    if (ida_queue_pop(&q) != NULL) {
        rv = 5;
    }
    ida_queue_close(&q, NULL, NULL);
    return rv;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 20.0;
    cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) {
        cores = 1;
    }
    static const int shapes[][3] = {{2, 2, 2}, {4, 4, 1}, {8, 2, 4},
                                    {1, 8, 2}, {3, 3, 3}, {2, 2, 1024}};
    double t0 = now_s();
    uint64_t rounds = 0;
    while (now_s() - t0 < seconds) {
        const int *sh = shapes[rounds % (sizeof(shapes) / sizeof(shapes[0]))];
        int rv = round_once(sh[0], sh[1], (uint32_t)sh[2]);
        if (rv != 0) {
            fprintf(stderr,
                    "qstress: FAILED (code %d) in round %lu: %d producers, "
                    "%d consumers, capacity %d\n",
                    rv, (unsigned long)rounds, sh[0], sh[1], sh[2]);
            return 1;
        }
        rounds++;
    }
    printf("qstress: %lu rounds, %lu items, clean\n", (unsigned long)rounds,
           (unsigned long)(atomic_load(&moved) / 2));
    return 0;
}
