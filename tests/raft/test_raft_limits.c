/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): allocation failures and the bound on batches
 * awaiting persistence. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(raft, .init = setup3, .fini = teardown);

/* --- allocation failures ------------------------------------------------ */

/* Each failed allocation returns a code and changes nothing. */

Test(raft, failed_allocations_change_nothing)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    uint8_t d[100] = {7};
    /* Propose: fail the Nth allocation for N = 0, 1, ... until it works. */
    for (int n = 0;; n++) {
        ida_index last = ida_raft_last_index(&H.r[1]);
        ida_heap_fault_set(n, 1);
        int rv = ida_raft_propose(&H.r[1], IDA_ENTRY_NORMAL, d, sizeof(d), NULL,
                                  NULL);
        ida_heap_fault_set(0, 0);
        if (rv == 0) {
            cr_assert_eq(ida_raft_last_index(&H.r[1]), last + 1);
            break;
        }
        cr_assert_eq(rv, IDA_ENOMEM);
        cr_assert_eq(ida_raft_last_index(&H.r[1]), last, "n=%d", n);
        cr_assert_lt(n, 10);
    }
    /* Follower side: an append whose copy fails is not acknowledged, and
     * the follower still catches up afterwards. */
    h_collect(1);
    ida_heap_fault_set(0, -1);
    h_deliver_all(); /* every allocation fails: appends are lost */
    ida_heap_fault_set(0, 0);
    for (int i = 0; i < 5; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(ida_raft_commit(&H.r[2]), 2);
    cr_assert(h_same_log(1, 2));
    cr_assert(h_same_log(1, 3));
}

Test(raft, at_most_pending_max_batches_await_persistence)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    H.hold[1] = true;
    for (int i = 0; i < IDA_RAFT_PENDING_MAX + 6; i++) {
        h_propose(1, 1);
    }
    cr_assert_eq(H.r[1].pending_count, IDA_RAFT_PENDING_MAX);
    cr_assert_lt(H.r[1].unsent, ida_raft_last_index(&H.r[1]) + 1,
                 "the last entries wait for a free slot");
    h_release(1); /* persists the 64, then the rest goes out */
    h_release(1);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    ida_index last = ida_raft_last_index(&H.r[1]);
    cr_assert_eq(last, 1 + IDA_RAFT_PENDING_MAX + 6);
    cr_assert_eq(H.r[1].unsent, last + 1);
    cr_assert_eq(H.disk[1].n, last, "everything reached the leader's disk");
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq(ida_raft_commit(&H.r[k]), last, "node %d", k);
    }
}
