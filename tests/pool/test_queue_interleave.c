/* The lock-free queue under chosen interleavings: this file compiles
 * src/pool/queue.c with a hook that, at one named point of one operation, runs
 * other operations to completion, exactly as a thread preempting it there
 * could. The dangerous cases are the ones where the node the interrupted
 * operation looked at has been dequeued and recycled meanwhile (ABA): its
 * CAS must fail and the retry must see the new state.
 *
 * (The libida.a copy of queue.o is not linked: every ida_queue_* symbol is
 * defined here, so the archive member is never pulled in.) */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

struct ida_queue;
static void hook(struct ida_queue *q, const char *point);
#define IDA_QUEUE_HOOK(q, point) hook(q, point)
#include "src/pool/queue.c"

/* --- fixture and helpers
 * ------------------------------------------------------ */

static struct ida_queue q;
static const char *hook_point;
static void (*hook_action)(struct ida_queue *q);
static int hook_fired;

static void setup(void)
{
    cr_assert_eq(ida_queue_init(&q, 4), 0);
    hook_point = NULL;
    hook_action = NULL;
    hook_fired = 0;
}

static void teardown(void)
{
    ida_queue_close(&q, NULL, NULL);
}

static void hook(struct ida_queue *hq, const char *point)
{
    if (hook_point == NULL || strcmp(point, hook_point) != 0) {
        return;
    }
    hook_point = NULL; /* once; nested operations run unhooked */
    hook_fired++;
    hook_action(hq);
}

static void *it(uintptr_t v)
{
    return (void *)v;
}

static uintptr_t pop_v(void)
{
    return (uintptr_t)ida_queue_pop(&q);
}

static void push_v(uintptr_t v)
{
    cr_assert_eq(ida_queue_push(&q, it(v)), 0);
}

/* The queue still works: many rounds through every node, in order. */
static void assert_healthy(void)
{
    for (uintptr_t r = 1; r <= 100; r++) {
        for (uintptr_t i = 0; i < 4; i++) {
            push_v(1000 * r + i);
        }
        cr_assert_eq(ida_queue_push(&q, it(7)), IDA_EBUSY, "capacity kept");
        for (uintptr_t i = 0; i < 4; i++) {
            cr_assert_eq(pop_v(), 1000 * r + i);
        }
        cr_assert_null(ida_queue_pop(&q));
    }
}

/* A broken queue tends to loop forever (a cycle in the list), so each test
 * has a generous timeout: hitting it is a failure, not slowness. */
TestSuite(interleave, .init = setup, .fini = teardown, .timeout = 10);

/* --- pop interrupted after its snapshot
 * --------------------------------------- */

/* Another consumer takes the head, and the freed dummy is reused at once
 * (LIFO free list) as the new last node: head node == tail node again, the
 * case where reading tail after validating head moved tail backwards. */
static void steal_head_and_recycle(struct ida_queue *hq)
{
    (void)hq;
    cr_assert_eq(pop_v(), 1);
    push_v(10);
    push_v(11);
}

Test(interleave, pop_snapshot_head_dequeued_and_recycled)
{
    push_v(1);
    push_v(2);
    hook_point = "pop_snapshot";
    hook_action = steal_head_and_recycle;
    cr_assert_eq(pop_v(), 2, "retried on the new head");
    cr_assert_eq(hook_fired, 1);
    cr_assert_eq(pop_v(), 10);
    cr_assert_eq(pop_v(), 11);
    cr_assert_null(ida_queue_pop(&q));
    assert_healthy();
}

/* The full ABA: while the pop is interrupted, its head node (the dummy D)
 * and its next node (N) are both dequeued, reused for two new items, and
 * dequeued again. Now D is head and tail again, and N is free. A pop that
 * read tail only after validating head would see head == tail and "help"
 * tail forward to N: a free node, which the next push links to itself. */
static void full_cycle(struct ida_queue *hq)
{
    (void)hq;
    cr_assert_eq(pop_v(), 1);
    cr_assert_eq(pop_v(), 2);
    push_v(10);
    push_v(11);
    cr_assert_eq(pop_v(), 10);
    cr_assert_eq(pop_v(), 11);
}

Test(interleave, pop_snapshot_head_and_next_recycled_queue_empty)
{
    push_v(1);
    push_v(2);
    hook_point = "pop_snapshot";
    hook_action = full_cycle;
    cr_assert_null(ida_queue_pop(&q), "empty after the retry");
    cr_assert_eq(hook_fired, 1);
    assert_healthy();
}

/* The item was read, then before the CAS others drain the queue and refill
 * it through the same nodes: the CAS must fail (tag), no item twice. */
static void drain_and_refill(struct ida_queue *hq)
{
    (void)hq;
    cr_assert_eq(pop_v(), 1);
    cr_assert_eq(pop_v(), 2);
    push_v(3);
}

Test(interleave, pop_before_cas_queue_drained_and_refilled)
{
    push_v(1);
    push_v(2);
    hook_point = "pop_before_cas";
    hook_action = drain_and_refill;
    cr_assert_eq(pop_v(), 3, "not 1 again");
    cr_assert_null(ida_queue_pop(&q));
    assert_healthy();
}

/* The queue goes from one item to empty inside the snapshot. */
static void take_last(struct ida_queue *hq)
{
    (void)hq;
    cr_assert_eq(pop_v(), 1);
}

Test(interleave, pop_snapshot_last_item_taken)
{
    push_v(1);
    hook_point = "pop_snapshot";
    hook_action = take_last;
    cr_assert_null(ida_queue_pop(&q), "empty after the retry");
    assert_healthy();
}

/* --- push interrupted
 * ------------------------------------------------------------ */

/* Tail moves on and its node is recycled between the snapshot and the
 * validation. */
static void push_pop_push(struct ida_queue *hq)
{
    (void)hq;
    push_v(2);
    cr_assert_eq(pop_v(), 2);
    push_v(3);
}

Test(interleave, push_snapshot_tail_recycled)
{
    hook_point = "push_snapshot";
    hook_action = push_pop_push;
    push_v(1);
    cr_assert_eq(hook_fired, 1);
    cr_assert_eq(pop_v(), 3);
    cr_assert_eq(pop_v(), 1);
    cr_assert_null(ida_queue_pop(&q));
    assert_healthy();
}

Test(interleave, push_before_link_tail_recycled)
{
    /* The pusher saw tail->next == NIL; before it links, the tail node is
     * dequeued and reused as a new last node whose next is NIL again: only
     * the tag tells the two lives apart. */
    hook_point = "push_before_link";
    hook_action = push_pop_push;
    push_v(1);
    cr_assert_eq(hook_fired, 1);
    cr_assert_eq(pop_v(), 3);
    cr_assert_eq(pop_v(), 1);
    cr_assert_null(ida_queue_pop(&q));
    assert_healthy();
}

/* The queue fills up completely while a push is interrupted: the push
 * already holds its node, so it still succeeds (capacity counts nodes). */
static void fill_others(struct ida_queue *hq)
{
    (void)hq;
    push_v(2);
    push_v(3);
    push_v(4);
    cr_assert_eq(ida_queue_push(&q, it(5)), IDA_EBUSY);
}

Test(interleave, push_interrupted_while_queue_fills)
{
    hook_point = "push_snapshot";
    hook_action = fill_others;
    push_v(1);
    cr_assert_eq(pop_v(), 2);
    cr_assert_eq(pop_v(), 3);
    cr_assert_eq(pop_v(), 4);
    cr_assert_eq(pop_v(), 1);
    cr_assert_null(ida_queue_pop(&q));
    assert_healthy();
}

/* --- refilling the producers' free stack ------------------------------------
 */

static int nested_rv;
static void push_during_steal(struct ida_queue *hq)
{
    (void)hq;
    nested_rv = ida_queue_push(&q, it(2));
}

Test(interleave, push_while_another_producer_moves_freed_nodes)
{
    /* Use every node once, so all of them sit on the consumers' stack. */
    for (uintptr_t i = 0; i < 4; i++) {
        push_v(100 + i);
    }
    for (uintptr_t i = 0; i < 4; i++) {
        cr_assert_eq(pop_v(), 100 + i);
    }
    hook_point = "after_steal";
    hook_action = push_during_steal;
    push_v(1);
    cr_assert_eq(hook_fired, 1);
    /* The documented window: the nodes are in the first producer's hands,
     * so the second one is told "full" and keeps its item. */
    cr_assert_eq(nested_rv, IDA_EBUSY);
    /* No node was lost: three more fit, then the queue is full. */
    push_v(2);
    push_v(3);
    push_v(4);
    cr_assert_eq(ida_queue_push(&q, it(5)), IDA_EBUSY);
    for (uintptr_t i = 1; i <= 4; i++) {
        cr_assert_eq(pop_v(), i);
    }
    cr_assert_null(ida_queue_pop(&q));
    assert_healthy();
}
