/* Queues: the lock-free ida_queue and its mutex twin ida_mqueue, one
 * contract: FIFO, bounded (full is IDA_EBUSY), every item popped exactly once
 * with each producer's order kept, nothing leaked at close. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/pool/queue.h"

/* --- helpers: one table of operations for both queue kinds ---------------- */

struct ops
{
    const char *name;
    size_t size;
    int (*init)(void *q, uint32_t capacity);
    void (*close)(void *q, ida_queue_item_free_fn cb, void *arg);
    int (*push)(void *q, void *item);
    void *(*pop)(void *q);
    bool (*empty)(void *q);
};

static int lf_init(void *q, uint32_t c)
{
    return ida_queue_init(q, c);
}
static void lf_close(void *q, ida_queue_item_free_fn cb, void *arg)
{
    ida_queue_close(q, cb, arg);
}
static int lf_push(void *q, void *i)
{
    return ida_queue_push(q, i);
}
static void *lf_pop(void *q)
{
    return ida_queue_pop(q);
}
static bool lf_empty(void *q)
{
    return ida_queue_empty(q);
}
static int mx_init(void *q, uint32_t c)
{
    return ida_mqueue_init(q, c);
}
static void mx_close(void *q, ida_queue_item_free_fn cb, void *arg)
{
    ida_mqueue_close(q, cb, arg);
}
static int mx_push(void *q, void *i)
{
    return ida_mqueue_push(q, i);
}
static void *mx_pop(void *q)
{
    return ida_mqueue_pop(q);
}
static bool mx_empty(void *q)
{
    return ida_mqueue_empty(q);
}

static int rq_init(void *q, uint32_t c)
{
    return ida_rqueue_init(q, c);
}
static void rq_close(void *q, ida_queue_item_free_fn cb, void *arg)
{
    ida_rqueue_close(q, cb, arg);
}
static int rq_push(void *q, void *i)
{
    return ida_rqueue_push(q, i);
}
static void *rq_pop(void *q)
{
    return ida_rqueue_pop(q);
}
static bool rq_empty(void *q)
{
    return ida_rqueue_empty(q);
}

static const struct ops RING = {
    "ring",  sizeof(struct ida_rqueue), rq_init, rq_close, rq_push, rq_pop,
    rq_empty};
static const struct ops LOCKFREE = {
    "lock-free", sizeof(struct ida_queue), lf_init, lf_close, lf_push, lf_pop,
    lf_empty};
static const struct ops MUTEX = {
    "mutex", sizeof(struct ida_mqueue), mx_init, mx_close, mx_push, mx_pop,
    mx_empty};

/* Items are tagged integers (the queue never dereferences them). */
static void *item_of(uint32_t producer, uint32_t seq)
{
    return (void *)(uintptr_t)(((uint64_t)(producer + 1) << 32) | seq);
}
static uint32_t producer_of(void *item)
{
    return (uint32_t)((uintptr_t)item >> 32) - 1;
}
static uint32_t seq_of(void *item)
{
    return (uint32_t)(uintptr_t)item;
}

/* --- single-threaded contract --------------------------------------------- */

static void check_fifo_and_bound_cap(const struct ops *o, uint32_t cap)
{
    _Alignas(64) unsigned char mem[1024];
    cr_assert(o->size <= sizeof(mem));
    void *q = mem;
    cr_assert_eq(o->init(q, 0), IDA_EINVAL, "%s: capacity 0", o->name);
    cr_assert_eq(o->init(q, IDA_QUEUE_CAPACITY_MAX + 1), IDA_EINVAL);
    cr_assert_eq(o->init(q, cap), 0);
    cr_assert(o->empty(q));
    cr_assert_null(o->pop(q));
    /* Many rounds, so nodes are recycled well past the array size. */
    for (uint32_t round = 0; round < 1000; round++) {
        for (uint32_t i = 0; i < cap; i++) {
            cr_assert_eq(o->push(q, item_of(0, round * cap + i)), 0);
        }
        cr_assert_eq(o->push(q, item_of(0, 99999)), IDA_EBUSY,
                     "%s: a full queue refuses", o->name);
        cr_assert_not(o->empty(q));
        for (uint32_t i = 0; i < cap; i++) {
            void *it = o->pop(q);
            cr_assert_eq(seq_of(it), round * cap + i, "%s: FIFO", o->name);
        }
        cr_assert_null(o->pop(q), "%s: the refused item never got in", o->name);
        cr_assert(o->empty(q));
    }
    o->close(q, NULL, NULL);
}

static void check_fifo_and_bound(const struct ops *o)
{
    check_fifo_and_bound_cap(o, 3);
}

/* The ring rounds its capacity up to a power of two, and says so. */
Test(queue, ring_fifo_and_bound)
{
    check_fifo_and_bound_cap(&RING, 4);
    struct ida_rqueue q;
    cr_assert_eq(ida_rqueue_init(&q, 3), 0);
    cr_assert_eq(ida_rqueue_capacity(&q), 4);
    ida_rqueue_close(&q, NULL, NULL);
    /* Capacity 1 becomes 2: one cell would let a push overwrite an item
     * not yet popped (its published seq equals the next position). */
    cr_assert_eq(ida_rqueue_init(&q, 1), 0);
    cr_assert_eq(ida_rqueue_capacity(&q), 2);
    cr_assert_eq(ida_rqueue_push(&q, item_of(0, 1)), 0);
    cr_assert_eq(ida_rqueue_push(&q, item_of(0, 2)), 0);
    cr_assert_eq(ida_rqueue_push(&q, item_of(0, 3)), IDA_EBUSY);
    cr_assert_eq(seq_of(ida_rqueue_pop(&q)), 1);
    cr_assert_eq(seq_of(ida_rqueue_pop(&q)), 2);
    cr_assert_null(ida_rqueue_pop(&q));
    ida_rqueue_close(&q, NULL, NULL);
}

Test(queue, lockfree_fifo_and_bound)
{
    check_fifo_and_bound(&LOCKFREE);
}

Test(queue, mutex_fifo_and_bound)
{
    check_fifo_and_bound(&MUTEX);
}

static void count_free(void *item, void *arg)
{
    (*(int *)arg)++;
    ida_free(item);
}

/* Heap items left inside are handed to the callback: ASan/valgrind would
 * report a leak otherwise (and the count proves each is handed once). */
static void check_close_frees(const struct ops *o)
{
    _Alignas(64) unsigned char mem[1024];
    void *q = mem;
    cr_assert(o->size <= sizeof(mem));
    cr_assert_eq(o->init(q, 16), 0);
    for (int i = 0; i < 10; i++) {
        void *p = ida_malloc(32);
        cr_assert_not_null(p);
        cr_assert_eq(o->push(q, p), 0);
    }
    ida_free(o->pop(q));
    int freed = 0;
    o->close(q, count_free, &freed);
    cr_assert_eq(freed, 9);
}

Test(queue, ring_close_frees_items_left)
{
    check_close_frees(&RING);
}

Test(queue, lockfree_close_frees_items_left)
{
    check_close_frees(&LOCKFREE);
}

Test(queue, mutex_close_frees_items_left)
{
    check_close_frees(&MUTEX);
}

Test(queue, init_reports_out_of_memory)
{
    struct ida_queue q;
    struct ida_mqueue m;
    ida_heap_fault_set(0, 1);
    cr_assert_eq(ida_queue_init(&q, 8), IDA_ENOMEM);
    ida_heap_fault_set(0, 1);
    cr_assert_eq(ida_mqueue_init(&m, 8), IDA_ENOMEM);
    ida_heap_fault_set(0, 0);
    cr_assert_eq(ida_queue_init(&q, 8), 0);
    ida_queue_close(&q, NULL, NULL);
}

/* --- P producers x M messages, C consumers -------------------------------- */

#define MSGS_PER_PRODUCER 20000
#define PRODUCERS_MAX     8

struct run
{
    const struct ops *o;
    void *q;
    uint32_t producers;
    uint32_t consumers;
    _Atomic uint64_t popped;
    _Atomic uint32_t seen[PRODUCERS_MAX][MSGS_PER_PRODUCER];
    _Atomic uint32_t order_violations;
    _Atomic uint32_t foreign_items;
};

struct worker_arg
{
    struct run *r;
    uint32_t index;
};

static void *producer_main(void *arg)
{
    struct worker_arg *a = arg;
    for (uint32_t s = 0; s < MSGS_PER_PRODUCER; s++) {
        /* Full is back-pressure: retry until the consumers make room. */
        while (a->r->o->push(a->r->q, item_of(a->index, s)) == IDA_EBUSY) {
            sched_yield();
        }
    }
    return NULL;
}

static void *consumer_main(void *arg)
{
    struct worker_arg *a = arg;
    struct run *r = a->r;
    uint64_t total = (uint64_t)r->producers * MSGS_PER_PRODUCER;
    int64_t last[PRODUCERS_MAX];
    for (int i = 0; i < PRODUCERS_MAX; i++) {
        last[i] = -1;
    }
    while (atomic_load(&r->popped) < total) {
        void *it = r->o->pop(r->q);
        if (it == NULL) {
            sched_yield();
            continue;
        }
        uint32_t p = producer_of(it), s = seq_of(it);
        if (p >= r->producers || s >= MSGS_PER_PRODUCER) {
            atomic_fetch_add(&r->foreign_items, 1);
            continue;
        }
        /* One consumer sees each producer's items in push order. */
        if ((int64_t)s <= last[p]) {
            atomic_fetch_add(&r->order_violations, 1);
        }
        last[p] = s;
        atomic_fetch_add(&r->seen[p][s], 1);
        atomic_fetch_add(&r->popped, 1);
    }
    return NULL;
}

static struct run run; /* fixture: big, so static */

static void check_mpmc_cap(const struct ops *o,
                           uint32_t producers,
                           uint32_t consumers,
                           uint32_t capacity)
{
    _Alignas(64) unsigned char mem[1024];
    run.o = o;
    cr_assert(o->size <= sizeof(mem));
    run.q = mem;
    run.producers = producers;
    run.consumers = consumers;
    atomic_store(&run.popped, 0);
    /* A small capacity keeps the queue full often: back-pressure and node
     * recycling under contention are what is being tested. */
    cr_assert_eq(o->init(run.q, capacity), 0);
    pthread_t th[2 * PRODUCERS_MAX];
    struct worker_arg args[2 * PRODUCERS_MAX];
    uint32_t n = 0;
    for (uint32_t i = 0; i < consumers; i++, n++) {
        args[n] = (struct worker_arg){&run, i};
        cr_assert_eq(pthread_create(&th[n], NULL, consumer_main, &args[n]), 0);
    }
    for (uint32_t i = 0; i < producers; i++, n++) {
        args[n] = (struct worker_arg){&run, i};
        cr_assert_eq(pthread_create(&th[n], NULL, producer_main, &args[n]), 0);
    }
    for (uint32_t i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
    }
    cr_assert_eq(atomic_load(&run.foreign_items), 0);
    cr_assert_eq(atomic_load(&run.order_violations), 0,
                 "%s: per-producer order", o->name);
    for (uint32_t p = 0; p < producers; p++) {
        for (uint32_t s = 0; s < MSGS_PER_PRODUCER; s++) {
            cr_assert_eq(atomic_load(&run.seen[p][s]), 1,
                         "%s: item %u/%u popped %u times", o->name, p, s,
                         atomic_load(&run.seen[p][s]));
        }
    }
    cr_assert_null(o->pop(run.q), "nothing extra");
    o->close(run.q, NULL, NULL);
}

static void check_mpmc(const struct ops *o,
                       uint32_t producers,
                       uint32_t consumers)
{
    check_mpmc_cap(o, producers, consumers, 64);
}

/* Capacity 2: every node is recycled all the time, with more threads than
 * cores, so a thread is often preempted mid-operation while its node is
 * reused (the ABA and "tail behind head" cases). */
Test(queue, lockfree_stress_tiny_capacity_4_producers_4_consumers)
{
    check_mpmc_cap(&LOCKFREE, 4, 4, 2);
}
Test(queue, lockfree_stress_tiny_capacity_8_producers_1_consumer)
{
    check_mpmc_cap(&LOCKFREE, 8, 1, 1);
}
Test(queue, mutex_stress_tiny_capacity_4_producers_4_consumers)
{
    check_mpmc_cap(&MUTEX, 4, 4, 2);
}

/* The ring, with more threads than cores: a producer is often preempted
 * between claiming a cell and publishing it. */
Test(queue, ring_stress_tiny_capacity_4_producers_4_consumers)
{
    check_mpmc_cap(&RING, 4, 4, 2);
}
Test(queue, ring_stress_tiny_capacity_8_producers_1_consumer)
{
    check_mpmc_cap(&RING, 8, 1, 1);
}
Test(queue, ring_2_producers_2_consumers)
{
    check_mpmc(&RING, 2, 2);
}
Test(queue, ring_8_producers_8_consumers)
{
    check_mpmc(&RING, 8, 8);
}

Test(queue, lockfree_1_producer_1_consumer)
{
    check_mpmc(&LOCKFREE, 1, 1);
}
Test(queue, lockfree_2_producers_2_consumers)
{
    check_mpmc(&LOCKFREE, 2, 2);
}
Test(queue, lockfree_4_producers_3_consumers)
{
    check_mpmc(&LOCKFREE, 4, 3);
}
Test(queue, lockfree_8_producers_2_consumers)
{
    check_mpmc(&LOCKFREE, 8, 2);
}
Test(queue, lockfree_8_producers_8_consumers)
{
    check_mpmc(&LOCKFREE, 8, 8);
}
Test(queue, mutex_1_producer_1_consumer)
{
    check_mpmc(&MUTEX, 1, 1);
}
Test(queue, mutex_2_producers_2_consumers)
{
    check_mpmc(&MUTEX, 2, 2);
}
Test(queue, mutex_4_producers_3_consumers)
{
    check_mpmc(&MUTEX, 4, 3);
}
Test(queue, mutex_8_producers_8_consumers)
{
    check_mpmc(&MUTEX, 8, 8);
}
