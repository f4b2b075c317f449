/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): snapshots. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(raft, .init = setup3, .fini = teardown);

/* --- snapshots -------------------------------------------------------------
 */

Test(raft, lagging_follower_gets_a_chunked_snapshot)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    h_propose(1, 30);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 31);
    const uint8_t snap[] = "state machine at index 20 (27 bytes)";
    cr_assert_eq(ida_raft_compact(&H.r[1], 20, snap, sizeof(snap)), 0);
    cr_assert_null(ida_raft_entry(&H.r[1], 20));
    cr_assert_eq(ida_raft_term_at(&H.r[1], 20), 1);
    cr_assert_eq(ida_raft_compact(&H.r[1], 40, snap, 1), IDA_EINVAL,
                 "not applied yet");
    cr_assert_eq(ida_raft_compact(&H.r[1], 10, snap, 1), IDA_EINVAL,
                 "before the snapshot");
    h_heal();
    for (int i = 0; i < 20; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_geq(H.snapshot_chunks, sizeof(snap) / 8, "chunked (8 bytes)");
    cr_assert_eq(H.disk[3].snap_index, 20);
    cr_assert_eq(H.disk[3].snap_len, sizeof(snap));
    cr_assert_eq(memcmp(H.disk[3].snap, snap, sizeof(snap)), 0);
    cr_assert_eq(ida_raft_commit(&H.r[3]), 31);
    cr_assert_eq(H.applied[3], 31, "snapshot, then entries 21..31");
    cr_assert_eq(ida_raft_last_index(&H.r[3]), 31);
    /* And it survives a restart from its disk. */
    h_crash(3);
    h_start(3);
    cr_assert_eq(ida_raft_last_index(&H.r[3]), 31);
    cr_assert_eq(ida_raft_term_at(&H.r[3], 20), 1);
}
