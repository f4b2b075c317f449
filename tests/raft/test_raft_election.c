/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): elections, pre-vote, check-quorum, term and vote
 * persistence. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "raft/testing.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

/* --- elections ---------------------------------------------------------------
 */

TestSuite(raft, .init = setup3, .fini = teardown);

Test(raft, election_elects_one_leader_and_commits_a_noop)
{
    h_start_all();
    h_elect(1);
    cr_assert_eq(the_leader(), 1);
    cr_assert_eq(ida_raft_term(&H.r[1]), 1);
    /* §6.4: the new leader's no-op commits and is applied everywhere. */
    h_tick(1, 1);
    h_deliver_all();
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq(ida_raft_commit(&H.r[k]), 1, "node %d", k);
        cr_assert_eq(H.applied[k], 1, "node %d", k);
        cr_assert_eq(ida_raft_leader(&H.r[k]), 1, "node %d", k);
        const struct ida_entry *e = ida_raft_entry(&H.r[k], 1);
        cr_assert_not_null(e);
        cr_assert_eq(e->type, IDA_ENTRY_NOOP);
    }
}

Test(raft, single_node_cluster_elects_itself)
{
    h_close();
    h_init(1);
    h_start_all();
    h_elect(1);
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER);
    h_propose(1, 3);
    cr_assert_eq(ida_raft_commit(&H.r[1]), 4);
    cr_assert_eq(H.applied[1], 4);
}

Test(raft, vote_needs_an_up_to_date_log)
{
    ida_term t[] = {1, 1, 2};
    h_set_log(1, t, 3, 2, 0);
    h_start_all();
    /* Candidate with an older last term: rejected (§5.4.1). */
    struct ida_raft_msg m = vote_req(2, 1, 3, 5, 1);
    cr_assert_eq(ida_raft_step(&H.r[1], &m), 0);
    struct ida_raft_batch b;
    cr_assert(ida_raft_ready(&H.r[1], &b));
    const struct ida_raft_msg *resp =
        find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true);
    cr_assert_not_null(resp);
    cr_assert_not(resp->u.response_vote.granted);
    cr_assert_eq(b.hard_state.vote, 0);
    /* Same last term, shorter log: rejected. */
    m = vote_req(2, 1, 4, 2, 2);
    ida_raft_step(&H.r[1], &m);
    ida_raft_ready(&H.r[1], &b);
    resp = find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true);
    cr_assert_not(resp->u.response_vote.granted);
    /* Same last term, same length: granted, and the vote is in the hard
     * state of the same batch whose after-persist messages carry it. */
    m = vote_req(3, 1, 5, 3, 2);
    ida_raft_step(&H.r[1], &m);
    ida_raft_ready(&H.r[1], &b);
    resp = find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true);
    cr_assert(resp->u.response_vote.granted);
    cr_assert(b.has_hard_state);
    cr_assert_eq(b.hard_state.term, 5);
    cr_assert_eq(b.hard_state.vote, 3);
    cr_assert_null(find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, false),
                   "a vote must never be sent before it is persisted");
    /* One vote per term: node 2 asks in the same term. */
    m = vote_req(2, 1, 5, 9, 4); /* (a last term above 5 is refused) */
    ida_raft_step(&H.r[1], &m);
    ida_raft_ready(&H.r[1], &b);
    resp = find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true);
    cr_assert_not(resp->u.response_vote.granted);
}

Test(raft, vote_without_log_check_bug_grants_stale_candidates)
{
    /* The negative-control switch does what it says. */
    H.bugs = IDA_RAFT_BUG_VOTE_NO_LOG_CHECK;
    ida_term t[] = {1, 1, 2};
    h_set_log(1, t, 3, 2, 0);
    h_start_all();
    struct ida_raft_msg m = vote_req(2, 1, 3, 1, 1);
    ida_raft_step(&H.r[1], &m);
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[1], &b);
    cr_assert(find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true)
                  ->u.response_vote.granted);
}

Test(raft, term_and_vote_survive_a_restart)
{
    h_start_all();
    struct ida_raft_msg m = vote_req(2, 1, 7, 0, 0);
    ida_raft_step(&H.r[1], &m);
    h_collect(1); /* persists the batch */
    h_drop_all();
    cr_assert_eq(H.disk[1].hs.term, 7);
    cr_assert_eq(H.disk[1].hs.vote, 2);
    h_crash(1);
    h_start(1);
    cr_assert_eq(ida_raft_term(&H.r[1]), 7);
    /* Another candidate of term 7 does not get a second vote. */
    m = vote_req(3, 1, 7, 0, 0);
    ida_raft_step(&H.r[1], &m);
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[1], &b);
    cr_assert_not(find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true)
                      ->u.response_vote.granted);
}

Test(raft, forget_vote_bug_votes_twice_after_restart)
{
    H.bugs = IDA_RAFT_BUG_FORGET_VOTE;
    h_start_all();
    struct ida_raft_msg m = vote_req(2, 1, 7, 0, 0);
    ida_raft_step(&H.r[1], &m);
    h_collect(1);
    h_drop_all();
    h_crash(1);
    h_start(1);
    m = vote_req(3, 1, 7, 0, 0);
    ida_raft_step(&H.r[1], &m);
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[1], &b);
    cr_assert(find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true)
                  ->u.response_vote.granted);
}

Test(raft, ack_is_sent_only_after_persist)
{
    h_start_all();
    h_elect(1);
    h_deliver_all();
    H.hold[2] = true; /* node 2's disk is slow */
    h_propose(1, 1);
    h_deliver_all();
    /* Node 1 and 3 hold the entry, but node 2 has not acked it. */
    cr_assert_eq(ida_raft_commit(&H.r[1]), 2, "1 and 3 make a majority");
    struct ida_raft_progress *pr = &H.r[1].prs[1];
    cr_assert_eq(pr->id, 2);
    cr_assert_lt(pr->match, 2, "node 2 acked before persisting");
    h_release(2);
    h_deliver_all();
    cr_assert_eq(H.r[1].prs[1].match, 2);
}

Test(raft, pre_vote_keeps_a_partitioned_node_from_raising_its_term)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    ida_term t = ida_raft_term(&H.r[1]);
    h_isolate(3);
    h_tick(3, 100); /* many election timeouts, alone */
    h_deliver_all();
    cr_assert_eq(ida_raft_term(&H.r[3]), t, "pre-vote must not bump the term");
    cr_assert_eq(ida_raft_role(&H.r[3]), IDA_RAFT_PRE_CANDIDATE);
    h_heal();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(the_leader(), 1, "the rejoining node did not disrupt");
    cr_assert_eq(ida_raft_term(&H.r[1]), t);
    cr_assert_eq(ida_raft_role(&H.r[3]), IDA_RAFT_FOLLOWER);
}

Test(raft, without_pre_vote_a_partitioned_node_raises_its_term)
{
    H.pre_vote = false;
    h_start_all();
    h_elect(1);
    ida_term t = ida_raft_term(&H.r[1]);
    h_isolate(3);
    h_tick(3, 100);
    cr_assert_gt(ida_raft_term(&H.r[3]), t + 2);
}

Test(raft, check_quorum_makes_an_isolated_leader_step_down)
{
    h_start_all();
    h_elect(1);
    h_isolate(1);
    h_tick(1, 25); /* more than an election timeout */
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_FOLLOWER);
    /* Proposals now fail fast and the batch says leadership was lost. */
    uint8_t d = 0;
    cr_assert_eq(ida_raft_propose(&H.r[1], IDA_ENTRY_NORMAL, &d, 1, NULL, NULL),
                 IDA_ENOTLEADER);
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[1], &b);
    cr_assert_eq(b.role, IDA_RAFT_FOLLOWER);
}

Test(raft, leader_stickiness_ignores_disruptive_votes)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    /* Node 2 hears from the leader; a higher-term vote request from node 3
     * (not a transfer) is ignored: no term change. */
    ida_term t = ida_raft_term(&H.r[2]);
    struct ida_raft_msg m = vote_req(3, 2, t + 5, 100, t);
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    cr_assert_eq(ida_raft_term(&H.r[2]), t);
    m.u.request_vote.transfer = true;
    ida_raft_step(&H.r[2], &m);
    cr_assert_eq(ida_raft_term(&H.r[2]), t + 5, "a transfer bypasses it");
}

Test(raft, a_stale_vote_request_is_refused_with_our_term)
{
    /* Figure 2: "reply false if term < currentTerm". Without the answer a
     * candidate behind us may never learn our term (seen in the simulator
     * with a voter campaigning for a membership that leaves it out). */
    H.disk[1].hs.term = 5;
    h_start_all();
    struct ida_raft_msg m = vote_req(2, 1, 3, 100, 3);
    cr_assert_eq(ida_raft_step(&H.r[1], &m), 0);
    struct ida_raft_batch b;
    cr_assert(ida_raft_ready(&H.r[1], &b));
    const struct ida_raft_msg *resp =
        find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, false);
    cr_assert_not_null(resp, "a stale vote request was not answered");
    cr_assert_not(resp->u.response_vote.granted);
    cr_assert_eq(resp->term, 5);
    cr_assert_eq(ida_raft_term(&H.r[1]), 5);
}
