/* Bounded multi-producer multi-consumer queues of pointers.
 *
 * DESIGN
 *
 * struct ida_queue is the lock-free queue: the Michael-Scott linked queue
 * (PODC 1996: a dummy node at the head, CAS on tail->next to link, CAS on
 * head to unlink) with the paper's own reclamation scheme instead of
 * double-width-CAS reference counters:
 *
 *   - Nodes live in one array allocated by ida_queue_init(); a link is a
 *     32-bit node index plus a 32-bit modification tag packed in one 64-bit
 *     word, so every CAS is a plain 64-bit CAS (no double-width CAS, no
 *     -mcx16, works under TSan and valgrind).
 *   - A dequeued node goes back to a free list (tagged Treiber stacks in the
 *     same array: consumers push onto one, producers pop from another and
 *     take the consumers' whole stack when theirs runs dry, so the two sides
 *     do not fight over one word); it is never returned to the heap while
 *     the queue lives, so
 *     a slow thread that still reads a recycled node reads valid memory, and
 *     the tag makes its CAS fail (no ABA). ida_queue_close() frees the array:
 *     every node is freed.
 *   - Fields a slow thread may read while the node is being recycled (next,
 *     value) are atomics, so the scheme is data-race free in C11 terms.
 *
 * Why not reference counters: they need a 128-bit CAS (pointer + external
 * count) and a heap allocation per push and per dummy node, and hot paths do
 * not malloc. Unlike the ring below (Vyukov), push and pop here are
 * lock-free: a thread retries only because another thread's CAS succeeded.
 * The pool's inboxes nevertheless use the ring, which measured about twice
 * as fast (see struct ida_rqueue); this queue stays as the lock-free
 * reference and for callers that cannot accept a preempted producer
 * delaying consumers.
 * The tag wraps after 2^32 modifications of one link; a thread would have to
 * sleep through exactly that many operations between its load and its CAS
 * for ABA to strike (the classic counted-pointer assumption).
 *
 * Capacity (every queue has a fixed capacity): the node array
 * holds @capacity + 1 nodes (one is the dummy), so at most @capacity items
 * are queued; a push into a full queue returns IDA_EBUSY and changes nothing:
 * back-pressure, never growth. (With several producers, the free nodes can
 * be out of sight for a few instructions while another producer moves them
 * over; push looks again a bounded number of times, so it still returns
 * IDA_EBUSY on a queue that is not full only if that producer is preempted
 * right there. IDA_EBUSY always means "keep the item and retry later": a
 * caller that drops it loses the item.)
 *
 * struct ida_mqueue is the same contract on a pthread mutex and a ring
 * buffer, kept for the benchmark (tests/pool/bench_pool.c) and as a fallback.
 *
 * Items are opaque non-NULL pointers; the queue never dereferences them. The
 * queue owns nothing but its nodes: ownership of an item passes from the
 * pusher to the popper (see src/pool/pool.h for messages).
 */
#ifndef IDA_POOL_QUEUE_H
#define IDA_POOL_QUEUE_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <pthread.h>

/* Largest capacity: node indices are 32-bit and UINT32_MAX means "none". */
#define IDA_QUEUE_CAPACITY_MAX (1u << 30)

struct ida__qnode;

struct ida_queue
{
    /* Each hot word on its own cache line: producers hit tail and
     * alloc_top, consumers head and free_top. */
    alignas(64) _Atomic uint64_t head; /* (tag << 32) | node index */
    alignas(64) _Atomic uint64_t tail;
    alignas(64) _Atomic uint64_t alloc_top; /* free nodes for producers */
    alignas(64) _Atomic uint64_t free_top;  /* nodes freed by consumers */
    alignas(64) struct ida__qnode *nodes;
    uint32_t capacity;
};

/* Frees one item left in a queue at close; @arg is the caller's. */
typedef void (*ida_queue_item_free_fn)(void *item, void *arg);

/* Initialise @q for at most @capacity queued items. Returns 0, IDA_EINVAL if
 * @capacity is 0 or above IDA_QUEUE_CAPACITY_MAX, IDA_ENOMEM; on error
 * nothing needs closing. Not thread-safe (no other thread may see @q yet). */
int ida_queue_init(struct ida_queue *q, uint32_t capacity);

/* Release @q. Items still queued are handed to @free_cb (if not NULL) in FIFO
 * order, then every node is freed. No other thread may use @q any more. */
void ida_queue_close(struct ida_queue *q,
                     ida_queue_item_free_fn free_cb,
                     void *arg);

/* Append @item (not NULL). Returns 0: @item is queued and now belongs to
 * whoever pops it; IDA_EBUSY: the queue is full, nothing changed, @item is
 * still the caller's. Lock-free; any thread. Pushes of one thread are popped
 * in the order they were pushed. */
int ida_queue_push(struct ida_queue *q, void *item);

/* Remove and return the oldest item, or NULL if the queue was empty at the
 * linearization point. Lock-free; any thread. */
void *ida_queue_pop(struct ida_queue *q);

/* True if the queue held no item when looked at (a hint: another thread may
 * push right after). Sequentially consistent, so a thread that announces it
 * is going to sleep and then sees "empty" cannot miss a push that checks the
 * announcement afterwards (used by the pool's wake-up protocol). */
bool ida_queue_empty(struct ida_queue *q);

/* struct ida_rqueue: Vyukov's bounded MPMC array ring (1024cores.net,
 * "Bounded MPMC queue"). Each cell carries a sequence number: a producer
 * claims position pos with one CAS on enqueue_pos when cell[pos].seq == pos,
 * writes the item and publishes it by storing seq = pos + 1; a consumer
 * claims pos with one CAS on dequeue_pos when seq == pos + 1, reads the item
 * and frees the cell for the next lap with seq = pos + size. One CAS per
 * operation and no free list: about twice the lock-free linked queue's
 * throughput here (tests/pool/bench_pool.c, section 1), which is why the
 * pool's inboxes use it.
 *
 * The price, which the linked queue does not pay: it is not lock-free. A
 * producer preempted between its CAS and its publishing store holds up the
 * consumers of that one cell (they see it empty) until it runs again; other
 * producers are not held up. In the pool a message can then be late by one
 * scheduling slice, never lost or reordered within one producer.
 *
 * Capacity is rounded up to a power of two, at least 2
 * (ida_rqueue_capacity() tells);
 * otherwise the contract is ida_queue's, including the sequentially
 * consistent ida_rqueue_empty() of the wake-up protocol: a claimed cell
 * counts as not empty even before its item is published. */
struct ida__rcell;

struct ida_rqueue
{
    alignas(64) _Atomic uint64_t enqueue_pos;
    alignas(64) _Atomic uint64_t dequeue_pos;
    alignas(64) struct ida__rcell *cells;
    uint64_t mask;
};

int ida_rqueue_init(struct ida_rqueue *q, uint32_t capacity);
void ida_rqueue_close(struct ida_rqueue *q,
                      ida_queue_item_free_fn free_cb,
                      void *arg);
int ida_rqueue_push(struct ida_rqueue *q, void *item);
void *ida_rqueue_pop(struct ida_rqueue *q);
bool ida_rqueue_empty(struct ida_rqueue *q);
uint32_t ida_rqueue_capacity(const struct ida_rqueue *q);

/* The mutex twin: same contract, same capacity semantics. */
struct ida_mqueue
{
    pthread_mutex_t mu;
    void **ring;
    uint32_t capacity;
    uint32_t first; /* index of the oldest item */
    uint32_t count;
};

int ida_mqueue_init(struct ida_mqueue *q, uint32_t capacity);
void ida_mqueue_close(struct ida_mqueue *q,
                      ida_queue_item_free_fn free_cb,
                      void *arg);
int ida_mqueue_push(struct ida_mqueue *q, void *item);
void *ida_mqueue_pop(struct ida_mqueue *q);
bool ida_mqueue_empty(struct ida_mqueue *q);

#endif /* IDA_POOL_QUEUE_H */
