/* Rule A4 of raft/admission.h: a node restarted from an older copy of its
 * own directory learns it from its peers, which echo back what it told
 * them (its latest start, its highest durable term, what it acknowledged),
 * and takes no part any more. Honest restarts never raise the alarm. With
 * boot ids off (the rule's only input) the scenario loses an acknowledged
 * entry: the negative control. */
#include <criterion/criterion.h>
#include <string.h>

#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

/* The bound 3-node harness, where a node may be told its state went back. */
static void setup_rollback(void)
{
    setup3_bound();
    H.allow_lost_state = true;
}

TestSuite(rollback, .init = setup_rollback, .fini = teardown);

/* Messages @id sends in its next batches. */
static size_t sent_any(ida_node_id id)
{
    size_t n = 0;
    struct ida_raft_batch b;
    while (ida_raft_ready(&H.r[id], &b)) {
        n += b.n_msgs + b.n_msgs_after_persist;
        if (b.id != 0) {
            ida_raft_persisted(&H.r[id], b.id);
        }
    }
    return n;
}

static void settle(void)
{
    for (int i = 0; i < 5; i++) {
        h_tick(the_leader(), 1);
        h_deliver_all();
    }
}

/* The lost-disk scenario of admission's tests, with a directory put back
 * instead of emptied: node 2's copy is taken, node 2 restarts once (node 3
 * hears of that start through the leader's gossip), 3 is cut off while e
 * is acknowledged by 1 and 2, 1 dies, 2 restarts from its copy (no e), 3
 * comes back. */
static void restored_copy(bool *elected, bool *e_lost)
{
    h_start_all();
    h_elect(1);
    h_propose(1, 2);
    settle();
    struct h_disk copy;
    h_disk_copy(2, &copy);
    h_crash(2);
    h_start((ida_node_id)2); /* an honest restart: boot count 2 */
    settle();                /* 1 hears it, and gossips it to 3 */
    h_isolate(3);
    h_propose(1, 1);
    h_deliver_all();
    ida_index e = ida_raft_last_index(&H.r[1]);
    ida_term e_term = ida_raft_term_at(&H.r[1], e);
    cr_assert_eq(ida_raft_commit(&H.r[1]), e, "e committed by 1 and 2");
    h_crash(1);
    h_disk_restore(2, &copy); /* boot count 1 on disk: starts as 2 again */
    h_disk_free(&copy);
    h_start((ida_node_id)2);
    h_heal();
    H.cut[1][2] = H.cut[2][1] = H.cut[1][3] = H.cut[3][1] = true;
    *elected = false;
    for (int i = 0; i < 300; i++) {
        h_tick(3, 1);
        h_tick(2, 1);
        h_deliver_all();
        *elected |= ida_raft_role(&H.r[3]) == IDA_RAFT_LEADER ||
                    ida_raft_role(&H.r[2]) == IDA_RAFT_LEADER;
    }
    /* e is lost if a node committed another entry at e's index. */
    *e_lost = false;
    for (ida_node_id k = 2; k <= 3; k++) {
        *e_lost |= ida_raft_commit(&H.r[k]) >= e &&
                   ida_raft_term_at(&H.r[k], e) != e_term;
    }
}

Test(rollback, a_copy_from_before_the_last_start_is_told_by_a_follower)
{
    bool elected, e_lost;
    restored_copy(&elected, &e_lost);
    struct ida_raft_rollback rb;
    cr_assert(ida_raft_rolled_back(&H.r[2], &rb), "node 2 was not told");
    cr_assert_eq(rb.kind, IDA_RAFT_ROLLBACK_BOOT);
    cr_assert_eq(rb.by, 3, "node 3 heard of the later start by gossip");
    cr_assert_eq(rb.told >> 32, rb.have >> 32, "same count, another start");
    cr_assert_not(elected, "a node without e was elected");
    cr_assert_not(e_lost);
    cr_assert_gt(H.lost_state, 0);
}

Test(rollback, negative_control_without_boot_ids_the_entry_is_lost)
{
    H.no_boots = true;
    bool elected, e_lost;
    restored_copy(&elected, &e_lost);
    cr_assert_not(ida_raft_rolled_back(&H.r[2], NULL));
    cr_assert(elected, "without boot ids 2 and 3 elect a leader without e");
    cr_assert(e_lost, "which commits over the acknowledged entry");
}

Test(rollback, a_term_that_went_back_is_told_by_the_new_leader)
{
    h_start_all();
    h_elect(1);
    h_propose(1, 1);
    settle();
    ida_term t1 = ida_raft_term(&H.r[2]);
    struct h_disk copy;
    h_disk_copy(2, &copy);
    /* 1 is cut off; 2 and 3 elect one of them at a higher term, which
     * node 2 makes durable (its vote or its candidacy). */
    h_isolate(1);
    ida_node_id ld = 0;
    for (int i = 0; i < 100 && ld == 0; i++) {
        h_tick(2, 1);
        h_tick(3, 1);
        h_deliver_all();
        ld = ida_raft_role(&H.r[2]) == IDA_RAFT_LEADER   ? 2
             : ida_raft_role(&H.r[3]) == IDA_RAFT_LEADER ? 3
                                                         : 0;
    }
    cr_assert_neq(ld, 0, "no leader among 2 and 3");
    h_tick(ld, 1);
    h_deliver_all();
    cr_assert_gt(ida_raft_term(&H.r[2]), t1);
    h_disk_restore(2, &copy); /* same count + 1: no boot alarm */
    h_disk_free(&copy);
    h_start((ida_node_id)2);
    for (int i = 0; i < 30; i++) {
        h_tick(2, 1);
        h_tick(3, 1);
        h_deliver_all();
    }
    struct ida_raft_rollback rb;
    cr_assert(ida_raft_rolled_back(&H.r[2], &rb));
    cr_assert_eq(rb.kind, IDA_RAFT_ROLLBACK_TERM);
    cr_assert_eq(rb.by, 3);
    cr_assert_eq(rb.have, t1);
    cr_assert_gt(rb.told, t1);
}

Test(rollback, acknowledged_entries_that_went_back_are_told_by_the_leader)
{
    h_start_all();
    h_elect(1);
    settle();
    struct h_disk copy;
    h_disk_copy(2, &copy);
    ida_index copied_last = H.disk[2].snap_index + H.disk[2].n;
    h_propose(1, 5);
    settle();
    cr_assert_gt(ida_raft_progress_of(&H.r[1], 2)->match, copied_last);
    h_disk_restore(2, &copy); /* same term, a later start: only the acks */
    h_disk_free(&copy);
    h_start((ida_node_id)2);
    settle();
    struct ida_raft_rollback rb;
    cr_assert(ida_raft_rolled_back(&H.r[2], &rb));
    cr_assert_eq(rb.kind, IDA_RAFT_ROLLBACK_MATCH);
    cr_assert_eq(rb.by, 1);
    cr_assert_eq(rb.have, copied_last);
}

Test(rollback, a_rolled_back_node_takes_no_part)
{
    h_start_all();
    h_elect(1);
    settle();
    struct h_disk copy;
    h_disk_copy(2, &copy);
    h_propose(1, 3);
    settle();
    h_disk_restore(2, &copy);
    h_disk_free(&copy);
    h_start((ida_node_id)2);
    settle();
    cr_assert(ida_raft_rolled_back(&H.r[2], NULL));
    h_crash(1);
    h_drop_all();
    size_t sent = 0;
    for (int i = 0; i < 200; i++) {
        ida_raft_tick(&H.r[2]);
        sent += sent_any(2);
    }
    cr_assert_eq(sent, 0, "it sent %zu messages", sent);
    cr_assert_eq(ida_raft_role(&H.r[2]), IDA_RAFT_FOLLOWER);
    /* A vote request: refused as lost state, nothing answered. */
    struct ida_raft_msg m = vote_req(3, 2, ida_raft_term(&H.r[2]) + 5, 100, 1);
    m.from_inc = 33;
    cr_assert_eq(ida_raft_step(&H.r[2], &m), IDA_ELOSTSTATE);
    cr_assert_eq(sent_any(2), 0);
}

/* Restarts and replaced disks, with writes going on. A wiped voter comes
 * back as another incarnation, which the membership (bound to the boot
 * incarnations) never admits again in this test, so only one node is ever
 * wiped (again and again): the two others keep a majority, and the test
 * checks that they went on committing to the end (without that, a second
 * wiped voter left no majority and the rounds after it proved nothing). */
Test(rollback, honest_restarts_and_wipes_never_raise_the_alarm)
{
    h_start_all();
    h_elect(1);
    uint64_t rng = 12345;
    uint64_t next_inc = 1000;
    ida_node_id wiped = 0;
    ida_index commit_at[301] = {0};
    int wipes = 0;
    for (int round = 0; round < 300; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ida_node_id victim = (ida_node_id)(1 + (rng >> 33) % 3);
        ida_node_id ld = the_leader();
        if (ld != 0) {
            h_propose(ld, 1 + (int)((rng >> 20) % 3));
        }
        if ((rng >> 40) % 4 == 0) {
            h_crash(victim);
            h_start(victim);
        } else if ((rng >> 40) % 37 == 1 &&
                   (wiped != 0 || (ld != 0 && victim != ld))) {
            /* A replaced disk: another incarnation, never an alarm. */
            wiped = wiped != 0 ? wiped : victim;
            h_wipe(wiped, next_inc++);
            h_start(wiped);
            wipes++;
        }
        for (int k = 1; k <= 3; k++) {
            h_tick((ida_node_id)k, 1);
        }
        h_deliver_all();
        for (int k = 1; k <= 3; k++) {
            ida_index ci = ida_raft_commit(&H.r[k]);
            commit_at[round + 1] =
                ci > commit_at[round + 1] ? ci : commit_at[round + 1];
        }
    }
    cr_assert_geq(wipes, 2, "%d wipes", wipes);
    cr_assert_gt(commit_at[300], commit_at[250],
                 "nothing committed in the last 50 rounds (%llu)",
                 (unsigned long long)commit_at[300]);
    cr_assert_eq(H.lost_state, 0, "an honest restart raised the alarm");
    for (int k = 1; k <= 3; k++) {
        cr_assert_not(ida_raft_rolled_back(&H.r[k], NULL), "node %d", k);
    }
}
