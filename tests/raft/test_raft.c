/* Unit tests of the Raft core (raft/raft.h), driven by hand through the
 * harness (tests/raft/harness.h): elections, pre-vote, check-quorum, the
 * Raft paper's Figure 7 and Figure 8 scenarios, term and vote persistence,
 * conflict resolution, flow control, snapshots, ReadIndex, transfer. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"

/* --- fixture -------------------------------------------------------------- */

static void setup3(void)
{
    h_init(3);
}

static void teardown(void)
{
    h_close();
}

/* --- helpers -------------------------------------------------------------- */

static struct ida_raft_config base_config(void)
{
    struct ida_raft_config c = {
        .id = 1,
        .voters = {1, 2, 3},
        .n_voters = 3,
        .election_ticks = 10,
        .heartbeat_ticks = 1,
        .max_inflight = 4,
        .max_msg_entries = 8,
        .snapshot_chunk_bytes = 8,
    };
    return c;
}

static struct ida_raft_msg vote_req(ida_node_id from,
                                    ida_node_id to,
                                    ida_term term,
                                    ida_index last_index,
                                    ida_term last_term)
{
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_REQUEST_VOTE;
    m.from = from;
    m.to = to;
    m.term = term;
    m.u.request_vote.last_log_index = last_index;
    m.u.request_vote.last_log_term = last_term;
    return m;
}

/* The single message of @type in @b (msgs or msgs_after_persist). */
static const struct ida_raft_msg *find_msg(const struct ida_raft_batch *b,
                                           enum ida_raft_msg_type type,
                                           bool after_persist)
{
    const struct ida_raft_msg *ms =
        after_persist ? b->msgs_after_persist : b->msgs;
    size_t n = after_persist ? b->n_msgs_after_persist : b->n_msgs;
    for (size_t i = 0; i < n; i++) {
        if (ms[i].type == type) {
            return &ms[i];
        }
    }
    return NULL;
}

static ida_node_id the_leader(void)
{
    ida_node_id found = 0;
    for (int k = 1; k <= H.n; k++) {
        if (H.up[k] && ida_raft_role(&H.r[k]) == IDA_RAFT_LEADER) {
            cr_assert_eq(found, 0, "two leaders: %u and %d", found, k);
            found = (ida_node_id)k;
        }
    }
    return found;
}

/* --- configuration and input validation ---------------------------------- */

Test(raft_config, rejects_bad_configs)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    ida_raft_close(&r);
    c = base_config();
    c.id = 0;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
    c = base_config();
    c.election_ticks = 1;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
    c = base_config();
    c.voters[2] = 2;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL, "duplicate voter");
    c = base_config();
    c.max_inflight = IDA_RAFT_INFLIGHT_MAX + 1;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
}

Test(raft_config, rejects_inconsistent_restore)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    struct ida_entry e[2] = {{.term = 1, .index = 1}, {.term = 1, .index = 3}};
    struct ida_raft_restore st = {
        .hard_state = {.term = 1}, .entries = e, .n_entries = 2};
    cr_assert_eq(ida_raft_init(&r, &c, &st), IDA_EINVAL, "index gap");
    e[1].index = 2;
    e[1].term = 2;
    cr_assert_eq(ida_raft_init(&r, &c, &st), IDA_EINVAL,
                 "entry term above the hard state term");
    st.hard_state.term = 2;
    uint8_t junk[3] = {0xff, 0xff, 0xff};
    e[1].type = IDA_ENTRY_CONFIG;
    e[1].data = junk;
    e[1].len = sizeof(junk);
    cr_assert_eq(ida_raft_init(&r, &c, &st), IDA_EINVAL, "corrupt config");
    e[1].type = IDA_ENTRY_NORMAL;
    e[1].data = NULL;
    e[1].len = 0;
    st.hard_state.vote = 2;
    st.hard_state.commit = 2;
    cr_assert_eq(ida_raft_init(&r, &c, &st), 0);
    cr_assert_eq(ida_raft_last_index(&r), 2);
    cr_assert_eq(ida_raft_term(&r), 2);
    cr_assert_eq(ida_raft_commit(&r), 2);
    ida_raft_close(&r);
}

Test(raft_config, step_rejects_misaddressed_messages)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    struct ida_raft_msg m = vote_req(2, 3, 1, 0, 0);
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "addressed to node 3");
    m = vote_req(0, 1, 1, 0, 0);
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "from node 0");
    m = vote_req(2, 1, 0, 0, 0);
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "term 0");
    m.type = 99;
    m.term = 1;
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "unknown type");
    cr_assert_eq(ida_raft_term(&r), 0, "rejected input changes nothing");
    ida_raft_close(&r);
}

/* A node that moved to a higher term must tell a stale leader, or with
 * pre-vote and check-quorum neither side ever moves: the node's pre-votes
 * are refused (the leader is alive) and it ignores the leader's lower-term
 * messages. A node that fell behind gets only InstallSnapshot chunks, so
 * those must be answered like appends (simulator liveness seed 103056). */
Test(raft, stale_install_snapshot_is_answered_with_the_higher_term)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    c.pre_vote = true;
    c.check_quorum = true;
    struct ida_raft_restore rs = {.hard_state = {.term = 5}};
    cr_assert_eq(ida_raft_init(&r, &c, &rs), 0);
    static const uint8_t data[4] = {1, 2, 3, 4};
    enum ida_raft_msg_type types[2] = {IDA_RAFT_MSG_INSTALL_SNAPSHOT,
                                       IDA_RAFT_MSG_APPEND_ENTRIES};
    for (int k = 0; k < 2; k++) {
        struct ida_raft_msg m;
        memset(&m, 0, sizeof(m));
        m.type = types[k];
        m.from = 2;
        m.to = 1;
        m.term = 2;
        if (k == 0) {
            m.u.install_snapshot.last_index = 48;
            m.u.install_snapshot.last_term = 2;
            m.u.install_snapshot.data = data;
            m.u.install_snapshot.len = sizeof(data);
            m.u.install_snapshot.total_size = sizeof(data);
            m.u.install_snapshot.done = true;
        }
        cr_assert_eq(ida_raft_step(&r, &m), 0);
        struct ida_raft_batch b;
        cr_assert(ida_raft_ready(&r, &b), "no answer to a stale message");
        bool answered = false;
        for (size_t i = 0; i < b.n_msgs; i++) {
            answered |= b.msgs[i].to == 2 && b.msgs[i].term == 5;
        }
        cr_assert(answered, "the stale leader must hear term 5 (type %d)",
                  (int)types[k]);
        cr_assert_eq(ida_raft_term(&r), 5, "our term does not change");
        if (b.id != 0) {
            ida_raft_persisted(&r, b.id);
        }
    }
    ida_raft_close(&r);
}

Test(raft_config, propose_fails_fast_when_not_leader)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    uint8_t d = 1;
    cr_assert_eq(ida_raft_propose(&r, IDA_ENTRY_NORMAL, &d, 1, NULL, NULL),
                 IDA_ENOTLEADER);
    cr_assert_eq(ida_raft_read_index(&r, 1), IDA_ENOTLEADER);
    cr_assert_eq(ida_raft_transfer(&r, 2), IDA_ENOTLEADER);
    cr_assert_eq(ida_raft_last_index(&r), 0);
    ida_raft_close(&r);
}

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
    m = vote_req(2, 1, 5, 9, 9);
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

/* --- replication -------------------------------------------------------------
 */

Test(raft, many_proposals_go_out_in_one_append)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    H.max_entries_in_msg = 0;
    h_propose(1, 40);
    h_deliver_all();
    cr_assert_eq(H.max_entries_in_msg, 40, "40 proposals, one append");
    h_tick(1, 1); /* the heartbeat carries the new commit index */
    h_deliver_all();
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq(ida_raft_commit(&H.r[k]), 41, "node %d", k);
    }
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

Test(raft, append_that_contradicts_a_committed_entry_is_a_protocol_error)
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

/* --- membership changes (dissertation §4.1) ------------------------------- */

TestSuite(raft_conf, .init = setup3, .fini = teardown);

static bool voters_are(ida_node_id id, const ida_node_id *v, size_t n)
{
    const struct ida_raft_conf *c = ida_raft_voters(&H.r[id]);
    if (c->n != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (ida_raft_conf_slot(c, v[i]) < 0) {
            return false;
        }
    }
    return true;
}

Test(raft_conf, add_a_voter)
{
    h_close();
    h_init(4);
    H.bootstrap_n = 3; /* node 4 is new: not in the bootstrap config */
    h_start_all();
    h_tick(4, 100);
    cr_assert_eq(ida_raft_role(&H.r[4]), IDA_RAFT_FOLLOWER,
                 "a non-member never campaigns");
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v4[] = {1, 2, 3, 4};
    cr_assert_eq(h_propose_conf(1, v4, 4), 0);
    cr_assert(voters_are(1, v4, 4), "in effect when appended");
    cr_assert_eq(h_propose_conf(1, v4, 3), IDA_EBUSY, "one change at a time");
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    for (int k = 1; k <= 4; k++) {
        cr_assert(voters_are((ida_node_id)k, v4, 4), "node %d", k);
        cr_assert_eq(ida_raft_commit(&H.r[k]), 2, "node %d", k);
    }
    /* 3 of 4 are now needed: with 3 and 4 down nothing commits. */
    h_crash(3);
    h_crash(4);
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 2);
    h_close();
}

Test(raft_conf, rejects_more_than_one_change)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id two_new[] = {1, 2, 3, 4, 5};
    cr_assert_eq(h_propose_conf(1, two_new, 5), IDA_EINVAL);
    const ida_node_id swap[] = {1, 2, 4};
    cr_assert_eq(h_propose_conf(1, swap, 3), IDA_EINVAL, "add + remove");
    const ida_node_id same[] = {1, 2, 3};
    cr_assert_eq(h_propose_conf(1, same, 3), IDA_EINVAL, "no change");
    uint8_t junk[2] = {0xff, 0x01};
    cr_assert_eq(
        ida_raft_propose(&H.r[1], IDA_ENTRY_CONFIG, junk, 2, NULL, NULL),
        IDA_EINVAL);
    cr_assert_eq(ida_raft_last_index(&H.r[1]), 1, "nothing appended");
}

Test(raft_conf, config_waits_for_the_leaders_first_commit)
{
    h_start_all();
    h_tick(1, 20);
    while (ida_raft_role(&H.r[1]) != IDA_RAFT_LEADER && h_deliver_one()) {
    }
    const ida_node_id v2[] = {1, 2};
    cr_assert_eq(h_propose_conf(1, v2, 2), IDA_EBUSY);
    h_deliver_all();
    cr_assert_eq(h_propose_conf(1, v2, 2), 0);
}

Test(raft_conf, remove_a_follower)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v2[] = {1, 2};
    cr_assert_eq(h_propose_conf(1, v2, 2), 0);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 2);
    h_crash(3);
    h_propose(1, 3);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 5, "2 of 2 commit without 3");
    h_crash(2);
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 5, "1 of 2 is no majority");
}

Test(raft_conf, removed_leader_steps_down_after_commit)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v23[] = {2, 3};
    H.cut[2][1] = H.cut[3][1] = true; /* acks do not come back yet */
    cr_assert_eq(h_propose_conf(1, v23, 2), 0);
    h_deliver_all();
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER,
                 "leads until the entry commits");
    h_heal();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_FOLLOWER);
    ida_node_id l = 0;
    for (int i = 0; i < 100 && l == 0; i++) {
        h_tick(2, 1);
        h_tick(3, 1);
        h_deliver_all();
        l = the_leader();
    }
    cr_assert(l == 2 || l == 3, "2 and 3 elect a leader without 1: %u", l);
    h_tick(1, 100);
    h_deliver_all();
    cr_assert_neq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER);
}

Test(raft_conf, truncated_config_entry_is_undone)
{
    h_start_all();
    uint8_t buf[64];
    size_t len;
    struct ida_raft_conf c = {.voters = {1, 2}, .n = 2};
    cr_assert_eq(ida_raft_conf_encode(&c, buf, sizeof(buf), &len), 0);
    struct ida_entry e = {.term = 1,
                          .index = 1,
                          .type = IDA_ENTRY_CONFIG,
                          .data = buf,
                          .len = len};
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_APPEND_ENTRIES;
    m.from = 1;
    m.to = 2;
    m.term = 1;
    m.u.append_entries.entries = &e;
    m.u.append_entries.n_entries = 1;
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    const ida_node_id v12[] = {1, 2}, v123[] = {1, 2, 3};
    cr_assert(voters_are(2, v12, 2), "in effect when appended");
    /* A leader of term 2 overwrites index 1: the config is undone. */
    struct ida_entry e2 = {.term = 2, .index = 1, .type = IDA_ENTRY_NOOP};
    m.from = 3;
    m.term = 2;
    m.u.append_entries.entries = &e2;
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    cr_assert(voters_are(2, v123, 3));
}

Test(raft_conf, config_survives_compaction_and_restart)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v2[] = {1, 2};
    cr_assert_eq(h_propose_conf(1, v2, 2), 0);
    h_propose(1, 2);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[2]), 4);
    cr_assert_eq(ida_raft_compact(&H.r[2], 3, (const uint8_t *)"s", 1), 0);
    /* The harness disk keeps no compaction; rebuild node 2 from a disk
     * holding the snapshot and its config, as storage would. */
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[2], &b);
    struct ida_raft_restore st = {
        .hard_state = H.disk[2].hs,
        .snapshot_index = 3,
        .snapshot_term = ida_raft_term_at(&H.r[2], 3),
        .snapshot_data = (const uint8_t *)"s",
        .snapshot_len = 1,
        .snapshot_config = H.r[2].snap_conf,
        .snapshot_config_len = H.r[2].snap_conf_len,
        .entries = ida_raft_entry(&H.r[2], 4),
        .n_entries = 1,
    };
    cr_assert_gt(st.snapshot_config_len, 0, "the snapshot keeps the config");
    struct ida_raft fresh;
    struct ida_raft_config cfg = H.r[2].cfg;
    cr_assert_eq(ida_raft_init(&fresh, &cfg, &st), 0);
    const struct ida_raft_conf *c = ida_raft_voters(&fresh);
    cr_assert_eq(c->n, 2);
    cr_assert_geq(ida_raft_conf_slot(c, 1), 0);
    cr_assert_geq(ida_raft_conf_slot(c, 2), 0);
    ida_raft_close(&fresh);
}

/* --- allocation failures (STYLE.md §9) -------------------------------------
 */

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

Test(raft_conf, learner_catches_up_without_voting_then_is_promoted)
{
    h_close();
    h_init(4);
    H.bootstrap_n = 3;
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_propose(1, 5);
    h_deliver_all();
    /* Add node 4 as a learner: same voters, one more learner. */
    struct ida_raft_conf c = {
        .voters = {1, 2, 3}, .n = 3, .learners = {4}, .n_learners = 1};
    uint8_t buf[128];
    size_t len;
    cr_assert_eq(ida_raft_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(
        ida_raft_propose(&H.r[1], IDA_ENTRY_CONFIG, buf, len, NULL, NULL), 0);
    h_collect(1);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_last_index(&H.r[4]), ida_raft_last_index(&H.r[1]),
                 "the learner received the log");
    cr_assert_eq(ida_raft_voters(&H.r[1])->n, 3, "but does not vote");
    h_tick(4, 100);
    cr_assert_eq(ida_raft_role(&H.r[4]), IDA_RAFT_FOLLOWER,
                 "a learner never campaigns");
    cr_assert_eq(ida_raft_transfer(&H.r[1], 4), IDA_EINVAL,
                 "nor takes leadership");
    /* With 2 and 3 down, leader + learner are no majority of 3 voters. */
    h_crash(2);
    h_crash(3);
    ida_index commit = ida_raft_commit(&H.r[1]);
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), commit);
    /* Promote it: 4 voters, and 1 + 4 make no majority of 4 either, but
     * with node 2 back the entry commits. */
    h_start(2);
    h_tick(1, 1);
    h_deliver_all();
    c.voters[3] = 4;
    c.n = 4;
    c.n_learners = 0;
    cr_assert_eq(ida_raft_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(
        ida_raft_propose(&H.r[1], IDA_ENTRY_CONFIG, buf, len, NULL, NULL), 0);
    h_collect(1);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_voters(&H.r[4])->n, 4);
    cr_assert_eq(ida_raft_commit(&H.r[1]), ida_raft_last_index(&H.r[1]),
                 "1, 2 and 4 are a majority of 4");
    h_close();
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
