#include "src/pool/queue.h"

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

#define NIL UINT32_MAX

/* Interleaving points for tests/pool/test_queue_interleave.c, which compiles
 * this file with a definition that runs other queue operations right there,
 * as another thread preempting this one could. Nothing in normal builds. */
#ifndef IDA_QUEUE_HOOK
#define IDA_QUEUE_HOOK(q, point) ((void)0)
#endif

/* One cache line per node: a producer filling a node must not steal the
 * line a consumer is reading in the node next to it. */
struct ida__qnode
{
    /* Queue link: (tag << 32) | index of the next node, NIL at the tail. The
     * tag grows on every change and is never reset, so a CAS by a thread that
     * read the link before the node was recycled fails. */
    _Atomic uint64_t next;
    /* Free-list link (index only; the stack top carries the tag). */
    _Atomic uint32_t free_next;
    /* The item; atomic because a slow popper may read it while the node is
     * being recycled (its CAS on head then fails and the value is unused). */
    _Atomic(void *) value;
    char pad[64 - 2 * sizeof(uint64_t) - sizeof(void *)];
};

_Static_assert(sizeof(struct ida__qnode) == 64, "one node per cache line");

static inline uint64_t pack(uint32_t index, uint32_t tag)
{
    return ((uint64_t)tag << 32) | index;
}

static inline uint32_t idx_of(uint64_t link)
{
    return (uint32_t)link;
}

static inline uint32_t tag_of(uint64_t link)
{
    return (uint32_t)(link >> 32);
}

/* Free nodes live on two tagged Treiber stacks: consumers push the nodes
 * they free onto free_top, producers pop from alloc_top, and a producer that
 * finds alloc_top empty takes the whole free_top stack at once. So in the
 * steady state the two sides do not write the same stack word for every
 * message (one shared free list cost a cache-line transfer per operation).
 * Price: while one producer moves a stack over (a few instructions), another
 * producer may see both stacks empty and report "full" (IDA_EBUSY) early. */

/* Push the private chain @first..(free_next)..NIL onto alloc_top. */
static void give_back(struct ida_queue *q, uint32_t first)
{
    uint32_t last = first;
    for (;;) {
        uint32_t next = atomic_load_explicit(&q->nodes[last].free_next,
                                             memory_order_relaxed);
        if (next == NIL) {
            break;
        }
        last = next;
    }
    uint64_t top = atomic_load_explicit(&q->alloc_top, memory_order_relaxed);
    for (;;) {
        atomic_store_explicit(&q->nodes[last].free_next, idx_of(top),
                              memory_order_relaxed);
        if (atomic_compare_exchange_weak_explicit(
                &q->alloc_top, &top, pack(first, tag_of(top) + 1),
                memory_order_release, memory_order_relaxed)) {
            return;
        }
    }
}

/* Take every node consumers freed; returns one of them (the rest go to
 * alloc_top) or NIL when there is none. */
static uint32_t take_freed(struct ida_queue *q)
{
    uint64_t f = atomic_load_explicit(&q->free_top, memory_order_acquire);
    do {
        if (idx_of(f) == NIL) {
            return NIL;
        }
    } while (!atomic_compare_exchange_weak_explicit(
        &q->free_top, &f, pack(NIL, tag_of(f) + 1), memory_order_acq_rel,
        memory_order_acquire));
    /* The chain is now reachable by this thread only. */
    IDA_QUEUE_HOOK(q, "after_steal");
    uint32_t mine = idx_of(f);
    uint32_t rest =
        atomic_load_explicit(&q->nodes[mine].free_next, memory_order_relaxed);
    if (rest != NIL) {
        give_back(q, rest);
    }
    return mine;
}

/* How often node_alloc() looks again when both free stacks seem empty. */
#define NODE_ALLOC_RETRIES 256

/* A node for a push; NIL when the queue is full. Both stacks can look
 * empty for a moment while another producer holds the nodes it just took
 * from the consumers' stack (between take_freed's steal and its give_back):
 * look again a bounded number of times before reporting "full", so a push
 * fails only when the queue is full or a producer was preempted right in
 * that window (still lock-free: the retries are bounded). */
static uint32_t node_alloc(struct ida_queue *q)
{
    uint64_t top = atomic_load_explicit(&q->alloc_top, memory_order_acquire);
    for (int retries = 0;;) {
        uint32_t i = idx_of(top);
        if (i == NIL) {
            uint32_t got = take_freed(q);
            if (got != NIL || retries++ == NODE_ALLOC_RETRIES) {
                return got;
            }
            top = atomic_load_explicit(&q->alloc_top, memory_order_acquire);
            continue;
        }
        /* May read a node another producer just took and reused: the tag
         * on alloc_top makes the CAS below fail in that case. */
        uint32_t next =
            atomic_load_explicit(&q->nodes[i].free_next, memory_order_relaxed);
        if (atomic_compare_exchange_weak_explicit(
                &q->alloc_top, &top, pack(next, tag_of(top) + 1),
                memory_order_acq_rel, memory_order_acquire)) {
            return i;
        }
    }
}

static void free_push(struct ida_queue *q, uint32_t i)
{
    uint64_t top = atomic_load_explicit(&q->free_top, memory_order_relaxed);
    for (;;) {
        atomic_store_explicit(&q->nodes[i].free_next, idx_of(top),
                              memory_order_relaxed);
        if (atomic_compare_exchange_weak_explicit(
                &q->free_top, &top, pack(i, tag_of(top) + 1),
                memory_order_release, memory_order_relaxed)) {
            return;
        }
    }
}

/* ida_malloc gives 16-byte alignment; nodes want 64. Over-allocate and
 * keep the raw pointer just before the array. */
static struct ida__qnode *aligned_alloc_nodes(uint32_t n)
{
    size_t bytes = (size_t)n * sizeof(struct ida__qnode) + 64 + sizeof(void *);
    char *raw = ida_malloc(bytes);
    if (raw == NULL) {
        return NULL;
    }
    uintptr_t a = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    return (struct ida__qnode *)a;
}

static void free_nodes(struct ida__qnode *nodes)
{
    ida_free(((void **)nodes)[-1]);
}

int ida_queue_init(struct ida_queue *q, uint32_t capacity)
{
    IDA_ASSERT(q != NULL);
    if (capacity == 0 || capacity > IDA_QUEUE_CAPACITY_MAX) {
        return IDA_EINVAL;
    }
    uint32_t n = capacity + 1;
    struct ida__qnode *nodes = aligned_alloc_nodes(n);
    if (nodes == NULL) {
        return IDA_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        atomic_init(&nodes[i].next, pack(NIL, 0));
        atomic_init(&nodes[i].free_next, i + 1 < n ? i + 1 : NIL);
        atomic_init(&nodes[i].value, NULL);
    }
    /* Node 0 is the first dummy; 1..capacity are free. */
    atomic_init(&nodes[0].free_next, NIL);
    q->nodes = nodes;
    q->capacity = capacity;
    atomic_init(&q->head, pack(0, 0));
    atomic_init(&q->tail, pack(0, 0));
    atomic_init(&q->alloc_top, pack(n > 1 ? 1 : NIL, 0));
    atomic_init(&q->free_top, pack(NIL, 0));
    return 0;
}

void ida_queue_close(struct ida_queue *q,
                     ida_queue_item_free_fn free_cb,
                     void *arg)
{
    IDA_ASSERT(q != NULL);
    void *item;
    while ((item = ida_queue_pop(q)) != NULL) {
        if (free_cb != NULL) {
            free_cb(item, arg);
        }
    }
    free_nodes(q->nodes);
    q->nodes = NULL;
}

int ida_queue_push(struct ida_queue *q, void *item)
{
    IDA_ASSERT(item != NULL);
    uint32_t n = node_alloc(q);
    if (n == NIL) {
        return IDA_EBUSY;
    }
    struct ida__qnode *node = &q->nodes[n];
    atomic_store_explicit(&node->value, item, memory_order_relaxed);
    /* NIL with a fresh tag: a stale CAS that expects the link this node had
     * in an earlier life must fail. */
    uint64_t old = atomic_load_explicit(&node->next, memory_order_relaxed);
    atomic_store_explicit(&node->next, pack(NIL, tag_of(old) + 1),
                          memory_order_relaxed);

    uint64_t tail;
    for (;;) {
        tail = atomic_load_explicit(&q->tail, memory_order_acquire);
        struct ida__qnode *t = &q->nodes[idx_of(tail)];
        uint64_t next = atomic_load_explicit(&t->next, memory_order_acquire);
        IDA_QUEUE_HOOK(q, "push_snapshot");
        if (tail != atomic_load_explicit(&q->tail, memory_order_acquire)) {
            continue;
        }
        if (idx_of(next) == NIL) {
            IDA_QUEUE_HOOK(q, "push_before_link");
            /* Linking is the linearization point; seq_cst so the pool's
             * "announce sleep, then check empty" protocol sees it. */
            if (atomic_compare_exchange_weak_explicit(
                    &t->next, &next, pack(n, tag_of(next) + 1),
                    memory_order_seq_cst, memory_order_relaxed)) {
                break;
            }
        } else {
            /* Tail lags behind: help move it, then retry. */
            atomic_compare_exchange_strong_explicit(
                &q->tail, &tail, pack(idx_of(next), tag_of(tail) + 1),
                memory_order_release, memory_order_relaxed);
        }
    }
    atomic_compare_exchange_strong_explicit(
        &q->tail, &tail, pack(n, tag_of(tail) + 1), memory_order_release,
        memory_order_relaxed);
    return 0;
}

void *ida_queue_pop(struct ida_queue *q)
{
    /* Fast "empty": a consumer polling an empty queue then touches neither
     * tail nor the free list, the lines producers write. */
    if (ida_queue_empty(q)) {
        return NULL;
    }
    uint64_t head;
    void *item;
    for (;;) {
        /* Read head, tail and head->next, then check head did not change:
         * only then do the three form a consistent snapshot (head was the
         * dummy all along, so tail was at or after it and next is its real
         * successor). Reading tail after the check is wrong: head may have
         * moved and its node been recycled as the new last node, and
         * "helping" would then move tail backwards onto a freed node. */
        head = atomic_load_explicit(&q->head, memory_order_acquire);
        uint64_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
        struct ida__qnode *h = &q->nodes[idx_of(head)];
        uint64_t next = atomic_load_explicit(&h->next, memory_order_seq_cst);
        IDA_QUEUE_HOOK(q, "pop_snapshot");
        if (head != atomic_load_explicit(&q->head, memory_order_acquire)) {
            continue;
        }
        if (idx_of(head) == idx_of(tail)) {
            if (idx_of(next) == NIL) {
                return NULL;
            }
            /* Tail lags behind the node just linked: move it first, so head
             * never passes tail. */
            atomic_compare_exchange_strong_explicit(
                &q->tail, &tail, pack(idx_of(next), tag_of(tail) + 1),
                memory_order_release, memory_order_relaxed);
            continue;
        }
        IDA_ASSERT(idx_of(next) != NIL); /* head != tail: not the last */
        /* Read before the CAS: once head moves, the next node is the new
         * dummy and may be recycled by the next pop. */
        item = atomic_load_explicit(&q->nodes[idx_of(next)].value,
                                    memory_order_relaxed);
        IDA_QUEUE_HOOK(q, "pop_before_cas");
        if (atomic_compare_exchange_weak_explicit(
                &q->head, &head, pack(idx_of(next), tag_of(head) + 1),
                memory_order_acq_rel, memory_order_relaxed)) {
            break;
        }
    }
    IDA_ASSERT(item != NULL);
    free_push(q, idx_of(head));
    return item;
}

bool ida_queue_empty(struct ida_queue *q)
{
    for (;;) {
        uint64_t head = atomic_load_explicit(&q->head, memory_order_seq_cst);
        uint64_t next = atomic_load_explicit(&q->nodes[idx_of(head)].next,
                                             memory_order_seq_cst);
        if (head == atomic_load_explicit(&q->head, memory_order_seq_cst)) {
            return idx_of(next) == NIL;
        }
    }
}

/* --- mutex twin ----------------------------------------------------------- */

int ida_mqueue_init(struct ida_mqueue *q, uint32_t capacity)
{
    IDA_ASSERT(q != NULL);
    if (capacity == 0 || capacity > IDA_QUEUE_CAPACITY_MAX) {
        return IDA_EINVAL;
    }
    q->ring = ida_malloc((size_t)capacity * sizeof(*q->ring));
    if (q->ring == NULL) {
        return IDA_ENOMEM;
    }
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        ida_free(q->ring);
        return IDA_ENOMEM;
    }
    q->capacity = capacity;
    q->first = 0;
    q->count = 0;
    return 0;
}

void ida_mqueue_close(struct ida_mqueue *q,
                      ida_queue_item_free_fn free_cb,
                      void *arg)
{
    void *item;
    while ((item = ida_mqueue_pop(q)) != NULL) {
        if (free_cb != NULL) {
            free_cb(item, arg);
        }
    }
    pthread_mutex_destroy(&q->mu);
    ida_free(q->ring);
    q->ring = NULL;
}

int ida_mqueue_push(struct ida_mqueue *q, void *item)
{
    IDA_ASSERT(item != NULL);
    int rv = 0;
    pthread_mutex_lock(&q->mu);
    if (q->count == q->capacity) {
        rv = IDA_EBUSY;
    } else {
        q->ring[(q->first + q->count) % q->capacity] = item;
        q->count++;
    }
    pthread_mutex_unlock(&q->mu);
    return rv;
}

void *ida_mqueue_pop(struct ida_mqueue *q)
{
    void *item = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->count > 0) {
        item = q->ring[q->first];
        q->first = (q->first + 1) % q->capacity;
        q->count--;
    }
    pthread_mutex_unlock(&q->mu);
    return item;
}

bool ida_mqueue_empty(struct ida_mqueue *q)
{
    pthread_mutex_lock(&q->mu);
    bool empty = q->count == 0;
    pthread_mutex_unlock(&q->mu);
    return empty;
}

/* --- Vyukov's ring ---------------------------------------------------------
 */

struct ida__rcell
{
    _Atomic uint64_t seq;
    void *item; /* written before seq's release store, read after its
                   acquire load: ordered by seq */
};

int ida_rqueue_init(struct ida_rqueue *q, uint32_t capacity)
{
    if (capacity == 0 || capacity > IDA_QUEUE_CAPACITY_MAX) {
        return IDA_EINVAL;
    }
    /* At least two cells: with one, a published cell's seq (pos + 1) equals
     * the next position, and a second push would overwrite the item. */
    uint64_t size = 2;
    while (size < capacity) {
        size <<= 1;
    }
    q->cells = ida_calloc(size, sizeof(*q->cells));
    if (q->cells == NULL) {
        return IDA_ENOMEM;
    }
    for (uint64_t i = 0; i < size; i++) {
        atomic_init(&q->cells[i].seq, i);
    }
    q->mask = size - 1;
    atomic_init(&q->enqueue_pos, 0);
    atomic_init(&q->dequeue_pos, 0);
    return 0;
}

void ida_rqueue_close(struct ida_rqueue *q,
                      ida_queue_item_free_fn free_cb,
                      void *arg)
{
    void *item;
    while ((item = ida_rqueue_pop(q)) != NULL) {
        if (free_cb != NULL) {
            free_cb(item, arg);
        }
    }
    ida_free(q->cells);
    q->cells = NULL;
}

int ida_rqueue_push(struct ida_rqueue *q, void *item)
{
    IDA_ASSERT(item != NULL);
    uint64_t pos = atomic_load_explicit(&q->enqueue_pos, memory_order_relaxed);
    struct ida__rcell *c;
    for (;;) {
        c = &q->cells[pos & q->mask];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            /* seq_cst: the wake-up protocol orders this claim before the
             * pusher's look at the owner's "sleeping" flag. */
            if (atomic_compare_exchange_weak_explicit(
                    &q->enqueue_pos, &pos, pos + 1, memory_order_seq_cst,
                    memory_order_relaxed)) {
                break;
            }
        } else if (dif < 0) {
            return IDA_EBUSY; /* the cell still holds last lap's item */
        } else {
            pos = atomic_load_explicit(&q->enqueue_pos, memory_order_relaxed);
        }
    }
    c->item = item;
    atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
    return 0;
}

void *ida_rqueue_pop(struct ida_rqueue *q)
{
    uint64_t pos = atomic_load_explicit(&q->dequeue_pos, memory_order_relaxed);
    struct ida__rcell *c;
    for (;;) {
        c = &q->cells[pos & q->mask];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - (pos + 1));
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(
                    &q->dequeue_pos, &pos, pos + 1, memory_order_relaxed,
                    memory_order_relaxed)) {
                break;
            }
        } else if (dif < 0) {
            return NULL; /* empty (or its producer has not published yet) */
        } else {
            pos = atomic_load_explicit(&q->dequeue_pos, memory_order_relaxed);
        }
    }
    void *item = c->item;
    atomic_store_explicit(&c->seq, pos + q->mask + 1, memory_order_release);
    return item;
}

bool ida_rqueue_empty(struct ida_rqueue *q)
{
    uint64_t d = atomic_load(&q->dequeue_pos);
    return atomic_load(&q->enqueue_pos) == d;
}

uint32_t ida_rqueue_capacity(const struct ida_rqueue *q)
{
    return (uint32_t)(q->mask + 1);
}
