/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): replication, flow control, conflict resolution
 * and the Raft paper's Figure 7 and Figure 8 scenarios. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "raft/testing.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(raft, .init = setup3, .fini = teardown);

/* --- replication -------------------------------------------------------------
 */

/* Node 1 elected and heard by all, then 40 proposals on it (not yet
 * delivered). */
static void leader_proposes_40(void)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    H.max_entries_in_msg = 0;
    h_propose(1, 40);
}

Test(raft, many_proposals_go_out_in_one_append)
{
    leader_proposes_40();
    h_deliver_all();
    cr_assert_eq(H.max_entries_in_msg, 40, "40 proposals, one append");
    h_tick(1, 1); /* the heartbeat carries the new commit index */
    h_deliver_all();
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq(ida_raft_commit(&H.r[k]), 41, "node %d", k);
    }
}

/* cfg.max_msg_bytes: an append carries entries while their bytes stay
 * within it (h_propose()'s entries have 4 bytes), and at least one entry
 * even when that one alone is larger. */
static void append_bytes_capped(size_t cap, size_t want)
{
    H.max_msg_bytes = cap;
    leader_proposes_40();
    for (int i = 0; i < 40; i++) {
        h_deliver_all();
        h_tick(1, 1);
    }
    h_deliver_all();
    cr_assert_eq(H.max_entries_in_msg, want, "cap %zu: %zu entries at most",
                 cap, H.max_entries_in_msg);
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq(ida_raft_commit(&H.r[k]), 41, "node %d", k);
    }
}

Test(raft, append_bytes_are_capped)
{
    append_bytes_capped(10, 2);
}

Test(raft, an_entry_larger_than_the_cap_still_goes)
{
    append_bytes_capped(3, 1);
}

Test(raft, leader_counts_itself_only_once_persisted)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    H.hold[1] = true;   /* the leader's own fsync is slow */
    H.cut[1][3] = true; /* and only node 2 gets the entry */
    h_propose(1, 1);
    h_deliver_all();
    /* The append went out before the leader persisted (parallel persist)
     * and node 2 acked it, but 1 of 3 durable copies is no majority. */
    cr_assert_eq(H.r[1].prs[1].match, 2);
    cr_assert_eq(ida_raft_commit(&H.r[1]), 1);
    h_release(1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 2);
}

/* Node 1 elected and heard by all, then one entry of it replicated and
 * committed (index 2, after the term's no-op); returns its commit index. */
static ida_index leader_commits_one(void)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_propose(1, 1);
    h_deliver_all();
    ida_index c = ida_raft_commit(&H.r[1]);
    cr_assert_eq(c, 2, "the entry is committed");
    return c;
}

/* The commit index is volatile state (Figure 2): a change of it alone is
 * no batch to persist (one device flush per write on the leader, for
 * nothing); it rides with the next entries, and a restart learns the rest
 * from the leader. */
Test(raft, a_commit_alone_is_not_persisted_but_rides_with_entries)
{
    ida_index c = leader_commits_one();
    cr_assert_lt(H.disk[1].hs.commit, c, "a commit alone is not written");
    struct ida_raft_batch b;
    cr_assert_not(ida_raft_ready(&H.r[1], &b) && b.must_persist,
                  "nothing to persist");
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_geq(H.disk[1].hs.commit, c, "it rode with the next entry");
    for (int k = 2; k <= 3; k++) {
        cr_assert_eq(H.disk[k].hs.term, 1, "node %d: the term is durable", k);
    }
    /* A restart with the lagging commit loses nothing: the leader's
     * appends bring it back. */
    h_crash(1);
    h_start(1);
    for (int i = 0; i < 60; i++) {
        for (int k = 1; k <= 3; k++) {
            h_tick(k, 1);
        }
        h_deliver_all();
    }
    for (int k = 1; k <= 3; k++) {
        cr_assert_geq(ida_raft_commit(&H.r[k]), 3, "node %d", k);
        cr_assert_geq(H.applied[k], 3, "node %d applied", k);
    }
}

/* A new commit index is not sent on its own: it travels with the next
 * append, or with the next heartbeat when there is nothing new (an empty
 * append per follower per commit, and its answer, woke every node once more
 * per write). */
Test(raft, a_new_commit_rides_the_next_append_or_heartbeat)
{
    ida_index c = leader_commits_one();
    for (int k = 2; k <= 3; k++) {
        cr_assert_lt(ida_raft_commit(&H.r[k]), c, "node %d: not sent alone", k);
    }
    h_propose(1, 1);
    h_deliver_all();
    for (int k = 2; k <= 3; k++) {
        cr_assert_geq(ida_raft_commit(&H.r[k]), c, "node %d: with the append",
                      k);
    }
    c = ida_raft_commit(&H.r[1]);
    cr_assert_eq(c, 3);
    h_tick(1, 1); /* a heartbeat interval */
    h_deliver_all();
    for (int k = 2; k <= 3; k++) {
        cr_assert_eq(ida_raft_commit(&H.r[k]), c, "node %d: the heartbeat", k);
        cr_assert_eq(H.applied[k], c, "node %d applied", k);
    }
}

Test(raft, replicate_mode_bounds_inflight_appends)
{
    H.max_msg_entries = 1;
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(H.r[1].prs[1].state, IDA_RAFT_REPLICATE);
    H.cut[2][1] = true; /* node 2's acks are lost */
    H.cut[3][1] = true;
    size_t before = H.appends_sent;
    h_propose(1, 20);
    h_deliver_all();
    /* Two followers, at most max_inflight (4) appends each. */
    cr_assert_eq(H.appends_sent - before, 8);
    cr_assert_eq(H.r[1].prs[1].inflight_count, 4);
    h_heal();
    for (int i = 0; i < 30; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(ida_raft_commit(&H.r[2]), 21, "recovered after heal");
}

/* Node 3 cut off while node 1 commits 20 entries with node 2 (one entry
 * an append), then healed: the most appends to node 3 that one call of
 * the leader's core sent while node 3 caught up. */
static size_t most_appends_in_one_call(unsigned burst)
{
    H.max_msg_entries = 1;
    H.max_append_burst = burst;
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    h_propose(1, 20);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 21);
    h_heal();
    size_t most = 0;
    for (int i = 0; i < 60 && ida_raft_last_index(&H.r[3]) < 21; i++) {
        h_tick(1, 1);
        size_t before = H.appends_to[3];
        while (h_deliver_one()) {
            size_t sent = H.appends_to[3] - before;
            most = sent > most ? sent : most;
            before = H.appends_to[3];
        }
    }
    cr_assert_eq(ida_raft_last_index(&H.r[3]), 21, "node 3 caught up");
    return most;
}

/* The acknowledgement that puts a follower far behind in replicate mode
 * sends at most max_append_burst appends (each later one sends more, and
 * it catches up); unbounded, the same scenario fills the window (4) in
 * one call. */
Test(raft, a_follower_far_behind_gets_a_burst_of_appends_per_call)
{
    cr_assert_eq(most_appends_in_one_call(2), 2);
}

Test(raft, without_a_burst_bound_one_call_fills_the_window)
{
    cr_assert_eq(most_appends_in_one_call(0), 4);
}

/* Figure 7 of the Raft paper: the leader of term 8 and six followers (a)-(f)
 * with missing, extra and conflicting entries. A new leader with the
 * figure's log brings each into agreement. */
static void figure7_case(const ida_term *f, size_t nf, ida_term fterm)
{
    static const ida_term leader[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6};
    h_init(3);
    H.pre_vote = false;
    h_set_log(1, leader, 10, 8, 0);
    h_set_log(2, f, nf, fterm, 0);
    /* Node 3 is empty and votes for node 1. */
    h_start_all();
    h_elect(1);
    cr_assert_eq(the_leader(), 1);
    for (int i = 0; i < 5; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert(h_same_log(1, 2), "follower log differs from the leader's");
    cr_assert_eq(ida_raft_last_index(&H.r[2]), 11);
    cr_assert_eq(ida_raft_commit(&H.r[2]), 11);
    /* Fast backtracking: about one rejection per conflicting term. */
    cr_assert_leq(H.rejects, 4, "%zu rejections", H.rejects);
}

Test(raft_fig7, a_missing_one)
{
    const ida_term f[] = {1, 1, 1, 4, 4, 5, 5, 6, 6};
    figure7_case(f, 9, 6);
    h_close();
}

Test(raft_fig7, b_missing_many)
{
    const ida_term f[] = {1, 1, 1, 4};
    figure7_case(f, 4, 4);
    h_close();
}

Test(raft_fig7, c_one_extra)
{
    const ida_term f[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6};
    figure7_case(f, 11, 6);
    h_close();
}

Test(raft_fig7, d_extra_of_a_later_term)
{
    const ida_term f[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7};
    figure7_case(f, 12, 7);
    h_close();
}

Test(raft_fig7, e_missing_and_extra)
{
    const ida_term f[] = {1, 1, 1, 4, 4, 4, 4};
    figure7_case(f, 7, 4);
    h_close();
}

Test(raft_fig7, f_many_conflicting_terms)
{
    const ida_term f[] = {1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3};
    figure7_case(f, 11, 3);
    h_close();
}

Test(raft, follower_rejection_carries_the_conflict_hint)
{
    ida_term t[] = {1, 2, 2, 2, 3};
    h_set_log(2, t, 5, 3, 1);
    h_start_all();
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_APPEND_ENTRIES;
    m.from = 1;
    m.to = 2;
    m.term = 5;
    m.u.append_entries.prev_log_index = 4;
    m.u.append_entries.prev_log_term = 4;
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[2], &b);
    const struct ida_raft_msg *r =
        find_msg(&b, IDA_RAFT_MSG_APPEND_RESPONSE, false);
    cr_assert_not_null(r);
    cr_assert_not(r->u.append_response.success);
    cr_assert_eq(r->u.append_response.reject_index, 4);
    cr_assert_eq(r->u.append_response.conflict_term, 2);
    cr_assert_eq(r->u.append_response.conflict_index, 2,
                 "first index of term 2");
    /* Past the end: conflict_term 0, conflict_index = last + 1. */
    m.u.append_entries.prev_log_index = 9;
    ida_raft_step(&H.r[2], &m);
    ida_raft_ready(&H.r[2], &b);
    r = find_msg(&b, IDA_RAFT_MSG_APPEND_RESPONSE, false);
    cr_assert_eq(r->u.append_response.conflict_term, 0);
    cr_assert_eq(r->u.append_response.conflict_index, 6);
}

/* An append whose entries contradict a committed one (only a faulty or
 * forged leader sends it) is answered with the commit index and changes
 * nothing: the entries after a prev below the commit index are never
 * read. */
Test(raft, append_that_contradicts_a_committed_entry_changes_nothing)
{
    ida_term t[] = {1, 1, 1};
    h_set_log(2, t, 3, 1, 3);
    h_start_all();
    struct ida_entry e = {.term = 2, .index = 3, .type = IDA_ENTRY_NORMAL};
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_APPEND_ENTRIES;
    m.from = 1;
    m.to = 2;
    m.term = 2;
    m.u.append_entries.prev_log_index = 2;
    m.u.append_entries.prev_log_term = 1;
    m.u.append_entries.entries = &e;
    m.u.append_entries.n_entries = 1;
    /* prev (2) < commit (3): answered with the commit index, no change. */
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    cr_assert_eq(ida_raft_term_at(&H.r[2], 3), 1);
    cr_assert_eq(ida_raft_last_index(&H.r[2]), 3);
    struct ida_raft_batch b;
    cr_assert(ida_raft_ready(&H.r[2], &b));
    const struct ida_raft_msg *r =
        find_msg(&b, IDA_RAFT_MSG_APPEND_RESPONSE, true);
    cr_assert_not_null(r, "no answer");
    cr_assert(r->u.append_response.success);
    cr_assert_eq(r->u.append_response.match_index, 3);
    cr_assert_eq(b.n_entries, 0, "entries to persist");
}

/* Figure 8 of the Raft paper, with 5 nodes. S1 (leader of term 4) has an
 * entry of term 2 at index 2 on a majority (S1, S2, S3) but its own term-4
 * no-op is not yet durable on a majority. Counting replicas of the old term
 * would commit index 2; S5 (last term 3) can then win with S3 and S4 and
 * overwrite it. */
static void figure8(uint32_t bugs, ida_index *s1_commit, ida_term *s3_term2)
{
    h_close();
    h_init(5);
    H.pre_vote = false;
    H.check_quorum = false;
    H.max_msg_entries = 1;
    H.bugs = bugs;
    const ida_term s12[] = {1, 2}, s34[] = {1}, s5[] = {1, 3};
    h_set_log(1, s12, 2, 3, 1);
    h_set_log(2, s12, 2, 3, 1);
    h_set_log(3, s34, 1, 3, 1);
    h_set_log(4, s34, 1, 3, 1);
    h_set_log(5, s5, 2, 3, 1);
    h_start_all();
    H.cut[1][5] = H.cut[5][1] = true; /* S5 is away during S1's term */
    h_tick(1, 20); /* S1 campaigns for term 4; its vote is persisted */
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_CANDIDATE);
    H.hold[1] = true; /* from now on S1's own writes stay unpersisted */
    /* Votes from S2, S3, S4 (S5's log is more up to date), then S1
     * replicates: S2 takes the no-op, S3 index 2 only (one entry per
     * append). Stop as soon as S1 learned that S3 holds index 2. */
    for (int i = 0; i < 500; i++) {
        if (ida_raft_role(&H.r[1]) == IDA_RAFT_LEADER &&
            H.r[1].prs[2].match >= 2 && H.r[1].prs[1].match >= 3) {
            break;
        }
        cr_assert(h_deliver_one(), "queue ran dry");
    }
    cr_assert_eq(ida_raft_term(&H.r[1]), 4);
    cr_assert_eq(ida_raft_term_at(&H.r[3], 2), 2);
    *s1_commit = ida_raft_commit(&H.r[1]);
    h_crash(1); /* its unpersisted no-op is gone */
    h_drop_all();
    h_heal();
    H.cut[2][5] = H.cut[5][2] = true; /* S5 reaches S3 and S4 only */
    h_tick(5, 40);
    h_deliver_all();
    cr_assert_eq(ida_raft_role(&H.r[5]), IDA_RAFT_LEADER);
    for (int i = 0; i < 5; i++) {
        h_tick(5, 1);
        h_deliver_all();
    }
    *s3_term2 = ida_raft_term_at(&H.r[3], 2);
}

Test(raft_fig8, commit_rule_counts_only_current_term_entries)
{
    ida_index commit;
    ida_term t;
    figure8(0, &commit, &t);
    cr_assert_eq(commit, 1, "an old-term entry must not be committed");
    cr_assert_eq(t, 3, "S5 legally replaced the uncommitted entry");
    h_close();
}

Test(raft_fig8, counting_old_terms_loses_a_committed_entry)
{
    ida_index commit;
    ida_term t;
    figure8(IDA_RAFT_BUG_COMMIT_OLD_TERM, &commit, &t);
    cr_assert_geq(commit, 2, "the bug commits index 2 (term 2)");
    cr_assert_eq(t, 3, "and S5 overwrote the 'committed' index 2");
    h_close();
}
