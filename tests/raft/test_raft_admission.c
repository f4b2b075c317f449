/* Admission (raft/admission.h): a node with a new incarnation never votes,
 * campaigns or counts as its old self; the lost-disk scenario loses nothing;
 * with the rule switched off (negative control) it loses the entry. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "idalloc_errors.h"
#include "raft/raft.h"
#include "raft/testing.h"
#include "src/node/convert.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(admission, .init = setup3_bound, .fini = teardown);

/* The count of messages of @type that @id sends in its next batches. */
static size_t sent_by(ida_node_id id, enum ida_raft_msg_type type)
{
    size_t n = 0;
    struct ida_raft_batch b;
    while (ida_raft_ready(&H.r[id], &b)) {
        for (size_t i = 0; i < b.n_msgs; i++) {
            n += b.msgs[i].type == type;
        }
        for (size_t i = 0; i < b.n_msgs_after_persist; i++) {
            n += b.msgs_after_persist[i].type == type;
        }
        if (b.id != 0) {
            ida_raft_persisted(&H.r[id], b.id);
        }
    }
    return n;
}

Test(admission, bound_members_are_admitted_and_elect_as_before)
{
    h_start_all();
    for (int k = 1; k <= 3; k++) {
        cr_assert(ida_raft_admitted(&H.r[k]), "node %d", k);
    }
    h_elect(1);
    cr_assert_eq(the_leader(), 1);
    h_propose(1, 3);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 4);
}

Test(admission, a_new_incarnation_never_campaigns)
{
    H.inc[2] = 99; /* its directory is not the one the membership names */
    h_start((ida_node_id)2);
    cr_assert_not(ida_raft_admitted(&H.r[2]));
    size_t asks = 0;
    for (int i = 0; i < 200; i++) {
        ida_raft_tick(&H.r[2]);
        asks += sent_by(2, IDA_RAFT_MSG_REQUEST_VOTE);
    }
    cr_assert_eq(asks, 0, "it asked for votes");
    cr_assert_eq(ida_raft_role(&H.r[2]), IDA_RAFT_FOLLOWER);
    cr_assert_eq(ida_raft_term(&H.r[2]), 0);
}

static bool vote_granted_by(ida_node_id id, bool pre)
{
    struct ida_raft_msg m = vote_req(1, id, 5, 10, 4);
    m.from_inc = 11;
    m.u.request_vote.pre_vote = pre;
    cr_assert_eq(ida_raft_step(&H.r[id], &m), 0);
    struct ida_raft_batch b;
    if (!ida_raft_ready(&H.r[id], &b)) {
        return false; /* no answer at all: nothing granted */
    }
    const struct ida_raft_msg *r =
        find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, !pre);
    if (r == NULL) {
        return false;
    }
    cr_assert_eq(H.r[id].vote, r->u.response_vote.granted && !pre ? 1 : 0);
    return r->u.response_vote.granted;
}

Test(admission, a_new_incarnation_grants_no_vote_nor_pre_vote)
{
    H.inc[2] = 99;
    h_start((ida_node_id)2);
    cr_assert_not(vote_granted_by(2, true));
    cr_assert_not(vote_granted_by(2, false));
}

Test(admission, control_the_old_incarnation_grants_the_same_vote)
{
    h_start((ida_node_id)2);
    cr_assert(vote_granted_by(2, true));
    cr_assert(vote_granted_by(2, false));
}

/* Append to @id's disk a config entry at term 1 holding @c. */
static void disk_conf(ida_node_id id, const struct ida_raft_conf *c)
{
    uint8_t buf[256];
    size_t len;
    cr_assert_eq(node_conf_encode(c, buf, sizeof(buf), &len), 0);
    struct h_disk *d = &H.disk[id];
    d->ents[d->n] = (struct ida_entry){.index = d->n + 1,
                                       .term = 1,
                                       .type = IDA_ENTRY_CONFIG,
                                       .data = malloc(len),
                                       .len = len};
    cr_assert_not_null(d->ents[d->n].data);
    memcpy(d->ents[d->n].data, buf, len);
    d->n++;
    d->hs.term = 1;
}

/* Voters 1 and @v2 bound to their incarnations, and @learner (if not 0)
 * bound to @learner_inc. */
static struct ida_raft_conf conf_of(ida_node_id v2,
                                    ida_node_id learner,
                                    uint64_t learner_inc)
{
    struct ida_raft_conf c = {.n = 2};
    c.voters[0] = 1;
    c.voter_inc[0] = H.inc[1];
    c.voters[1] = v2;
    c.voter_inc[1] = H.inc[v2];
    if (learner != 0) {
        c.learners[0] = learner;
        c.learner_inc[0] = learner_inc;
        c.n_learners = 1;
    }
    return c;
}

/* Node @id starts with a log whose membership has voters 1 and 3 and
 * @id as a learner bound to @bound_inc. */
static void start_as_learner(ida_node_id id, uint64_t bound_inc)
{
    struct ida_raft_conf c = conf_of(3, id, bound_inc);
    disk_conf(id, &c);
    h_start(id);
    cr_assert_not(ida_raft_admitted(&H.r[id]), "a learner is not admitted");
}

/* A learner under its own incarnation grants votes: it may have been
 * promoted without knowing it yet, and the other voters may need its vote
 * to elect the leader that would tell it (rule A1). It still never
 * campaigns. Bound to another incarnation, it grants nothing. */
Test(admission, a_learner_of_its_own_incarnation_grants_votes)
{
    start_as_learner(2, H.inc[2]);
    cr_assert(vote_granted_by(2, true));
    cr_assert(vote_granted_by(2, false));
    size_t asks = 0;
    for (int i = 0; i < 200; i++) {
        ida_raft_tick(&H.r[2]);
        asks += sent_by(2, IDA_RAFT_MSG_REQUEST_VOTE);
    }
    cr_assert_eq(asks, 0, "a learner asked for votes");
}

/* The simulator's seed 109893, reduced: node 3 was added as a learner and
 * promoted; the promotion reached node 2's log, not node 3's; node 1 (the
 * old leader) is gone. Voters {1, 2, 3} in node 2's log: it needs node
 * 3's vote, and node 3 must give it, or no leader is ever elected. */
Test(admission, a_promoted_learner_that_does_not_know_it_elects_a_leader)
{
    struct ida_raft_conf learner = conf_of(2, 3, H.inc[3]);
    disk_conf(3, &learner);
    disk_conf(2, &learner);
    struct ida_raft_conf all = conf_of(2, 0, 0);
    all.voters[2] = 3;
    all.voter_inc[2] = H.inc[3];
    all.n = 3;
    disk_conf(2, &all);
    h_start(2);
    h_start(3);
    cr_assert(ida_raft_admitted(&H.r[2]));
    cr_assert_not(ida_raft_admitted(&H.r[3]));
    h_elect(2);
    cr_assert_eq(ida_raft_role(&H.r[2]), IDA_RAFT_LEADER, "no leader");
    h_propose(2, 1);
    h_deliver_all();
    h_tick(2, 1);
    h_deliver_all();
    cr_assert(ida_raft_admitted(&H.r[3]), "node 3 learned its promotion");
}

Test(admission, a_learner_of_another_incarnation_grants_nothing)
{
    start_as_learner(2, 99);
    cr_assert_not(vote_granted_by(2, true));
    cr_assert_not(vote_granted_by(2, false));
}

Test(admission, an_answer_from_another_incarnation_changes_nothing)
{
    h_start((ida_node_id)1);
    /* A vote granted by node 2's new incarnation, at a high term. */
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_RESPONSE_VOTE;
    m.from = 2;
    m.to = 1;
    m.term = 50;
    m.u.response_vote.granted = true;
    m.from_inc = 99;
    cr_assert_eq(ida_raft_step(&H.r[1], &m), IDA_EFOREIGN);
    cr_assert_eq(ida_raft_term(&H.r[1]), 0, "the term moved");
    struct ida_raft_batch b;
    cr_assert_not(ida_raft_ready(&H.r[1], &b), "it answered");
    /* The same answer from the bound incarnation is looked at. */
    m.from_inc = 22;
    cr_assert_eq(ida_raft_step(&H.r[1], &m), 0);
    cr_assert_eq(ida_raft_term(&H.r[1]), 50);
}

Test(admission, a_stale_member_hears_a_readmitted_candidate)
{
    /* Node 1's membership still names node 2's old incarnation; node 2 was
     * re-admitted with incarnation 99 elsewhere and now campaigns: node 1
     * must look at the request (it may be the only winnable election). */
    h_start((ida_node_id)1);
    struct ida_raft_msg m = vote_req(2, 1, 5, 10, 4);
    m.from_inc = 99;
    cr_assert_eq(ida_raft_step(&H.r[1], &m), 0);
    cr_assert_eq(ida_raft_term(&H.r[1]), 5);
    struct ida_raft_batch b;
    cr_assert(ida_raft_ready(&H.r[1], &b));
    const struct ida_raft_msg *r =
        find_msg(&b, IDA_RAFT_MSG_RESPONSE_VOTE, true);
    cr_assert_not_null(r);
    cr_assert(r->u.response_vote.granted);
}

Test(admission, acks_of_another_incarnation_do_not_commit)
{
    h_start_all();
    h_elect(1);
    h_propose(1, 1);
    h_deliver_all();
    ida_index before = ida_raft_commit(&H.r[1]);
    /* Only node 2 could ack (3 is cut off); node 2's acks now come from
     * another incarnation: the leader must not count them. */
    h_isolate(3);
    h_crash(2);
    H.inc[2] = 99; /* same disk, but it claims another incarnation */
    h_start((ida_node_id)2);
    h_propose(1, 2);
    for (int i = 0; i < 30; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(ida_raft_commit(&H.r[1]), before, "foreign acks counted");
    cr_assert_gt(H.foreign, 0, "node 2 answered: its answers were dropped");
}

/* The lost-disk scenario: 1 leads; 3 is cut off while entry e is
 * acknowledged by 1 and 2; 1 dies; 2 comes back with an empty disk (a new
 * incarnation); 3 is reconnected. Returns whether e survives on a node that
 * could lead, and whether 3 was elected. */
static void lost_disk(bool *elected3, bool *e_lost)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    h_propose(1, 1);
    h_deliver_all();
    ida_index e = ida_raft_last_index(&H.r[1]);
    ida_term e_term = ida_raft_term_at(&H.r[1], e);
    cr_assert_eq(ida_raft_commit(&H.r[1]), e, "e committed by 1 and 2");
    h_crash(1);
    h_wipe(2, 999);
    h_start((ida_node_id)2);
    h_heal();
    H.cut[1][2] = H.cut[2][1] = H.cut[1][3] = H.cut[3][1] = true;
    *elected3 = false;
    for (int i = 0; i < 300; i++) {
        h_tick(3, 1);
        h_tick(2, 1);
        h_deliver_all();
        *elected3 |= ida_raft_role(&H.r[3]) == IDA_RAFT_LEADER;
    }
    /* e is lost if node 3 committed another entry at e's index. */
    *e_lost =
        ida_raft_commit(&H.r[3]) >= e && ida_raft_term_at(&H.r[3], e) != e_term;
}

Test(admission, lost_disk_cannot_elect_a_stale_leader)
{
    bool elected3, e_lost;
    lost_disk(&elected3, &e_lost);
    cr_assert_not(elected3, "the stale node was elected with the empty one");
    cr_assert_not(e_lost);
    /* The empty node never voted: its term may not move past 0 by voting. */
    cr_assert_eq(ida_raft_role(&H.r[2]), IDA_RAFT_FOLLOWER);
}

Test(admission, negative_control_without_the_rule_the_entry_is_lost)
{
    H.bugs = IDA_RAFT_BUG_IGNORE_INCARNATION;
    bool elected3, e_lost;
    lost_disk(&elected3, &e_lost);
    cr_assert(elected3, "without the rule the empty node elects node 3");
    cr_assert(e_lost, "and node 3 commits over the acknowledged entry");
}

Test(admission, rebinding_a_voter_is_two_changes_binding_is_one)
{
    struct ida_raft_conf a = {
        .voters = {1, 2, 3}, .n = 3, .voter_inc = {11, 22, 33}};
    struct ida_raft_conf b = a;
    b.voter_inc[1] = 99;
    cr_assert_not(ida_raft_conf_one_change(&a, &b));
    struct ida_raft_conf removed = {
        .voters = {1, 3}, .n = 2, .voter_inc = {11, 33}};
    cr_assert(ida_raft_conf_one_change(&a, &removed));
    struct ida_raft_conf learner = removed;
    learner.learners[0] = 2;
    learner.learner_inc[0] = 99;
    learner.n_learners = 1;
    cr_assert(ida_raft_conf_one_change(&removed, &learner));
    struct ida_raft_conf promoted = {
        .voters = {1, 3, 2}, .n = 3, .voter_inc = {11, 33, 99}};
    cr_assert(ida_raft_conf_one_change(&learner, &promoted));
    struct ida_raft_conf unbound = {.voters = {1, 2, 3}, .n = 3};
    cr_assert(ida_raft_conf_one_change(&unbound, &a), "binding");
    cr_assert_not(ida_raft_conf_one_change(&a, &a));
}
