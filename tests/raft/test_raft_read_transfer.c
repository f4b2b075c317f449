/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): ReadIndex and leadership transfer. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(raft, .init = setup3, .fini = teardown);

/* --- ReadIndex ----------------------------------------------------------- */

Test(raft, read_index_confirms_leadership_with_a_quorum)
{
    h_start_all();
    h_tick(1, 20);
    while (ida_raft_role(&H.r[1]) != IDA_RAFT_LEADER && h_deliver_one()) {
    }
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER);
    cr_assert_eq(ida_raft_read_index(&H.r[1], 41), IDA_EBUSY,
                 "no entry of its term committed yet");
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_read_index(&H.r[1], 42), 0);
    h_collect(1);
    cr_assert_eq(H.n_reads_done[1], 0, "not before a quorum answered");
    h_deliver_all();
    cr_assert_eq(H.n_reads_done[1], 1);
    cr_assert_eq(H.reads_done[1][0], 42);
    /* A leader cut off from the others never confirms a read. */
    h_isolate(1);
    cr_assert_eq(ida_raft_read_index(&H.r[1], 43), 0);
    h_tick(1, 5);
    h_deliver_all();
    cr_assert_eq(H.n_reads_done[1], 1);
}

/* --- leadership transfer ---------------------------------------------------
 */

Test(raft, transfer_hands_leadership_to_an_up_to_date_follower)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    ida_term t = ida_raft_term(&H.r[1]);
    cr_assert_eq(ida_raft_transfer(&H.r[1], 1), IDA_EINVAL, "to itself");
    cr_assert_eq(ida_raft_transfer(&H.r[1], 3), 0);
    uint8_t d = 0;
    cr_assert_eq(ida_raft_propose(&H.r[1], IDA_ENTRY_NORMAL, &d, 1, NULL, NULL),
                 IDA_EBUSY, "no proposals while transferring");
    h_collect(1);
    h_deliver_all();
    cr_assert_eq(the_leader(), 3);
    cr_assert_eq(ida_raft_term(&H.r[3]), t + 1);
}

Test(raft, transfer_aborts_after_an_election_timeout)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    cr_assert_eq(ida_raft_transfer(&H.r[1], 3), 0);
    h_collect(1);
    h_deliver_all();
    uint8_t d = 0;
    cr_assert_eq(ida_raft_propose(&H.r[1], IDA_ENTRY_NORMAL, &d, 1, NULL, NULL),
                 IDA_EBUSY);
    h_tick(1, 11);
    h_deliver_all();
    cr_assert_eq(the_leader(), 1, "node 2 keeps it in the quorum");
    cr_assert_eq(ida_raft_propose(&H.r[1], IDA_ENTRY_NORMAL, &d, 1, NULL, NULL),
                 0, "the transfer was aborted");
}

Test(raft, transfer_to_a_lagging_follower_catches_it_up_first)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    h_propose(1, 5);
    h_deliver_all();
    h_heal();
    cr_assert_lt(ida_raft_last_index(&H.r[3]), 6);
    cr_assert_eq(ida_raft_transfer(&H.r[1], 3), 0);
    h_collect(1);
    h_deliver_all();
    /* Node 3 got the missing entries, then TimeoutNow, and won (its log is
     * as up to date as anyone's). */
    cr_assert_eq(the_leader(), 3);
    cr_assert_geq(ida_raft_last_index(&H.r[3]), 6);
    cr_assert_eq(ida_raft_term_at(&H.r[3], 6), ida_raft_term_at(&H.r[1], 6));
}
