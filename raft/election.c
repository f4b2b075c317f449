/* Elections: terms, pre-vote, votes, campaigns, leadership transfer.
 * Internal helpers: raft/internal.h. */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"
#include "raft/testing.h"

static uint64_t rng_next(struct ida_raft *r)
{
    /* xorshift64*: deterministic, seeded by the config. */
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 0x2545F4914F6CDD1DULL;
}

void ida__raft_randomize_timeout(struct ida_raft *r)
{
    /* §3.4: election timeouts chosen randomly from [T, 2T). */
    r->randomized_timeout =
        r->cfg.election_ticks + (unsigned)(rng_next(r) % r->cfg.election_ticks);
}

static void reset(struct ida_raft *r, ida_term term)
{
    if (term != r->term) {
        IDA_ASSERT(term > r->term);
        r->term = term;
        r->vote = 0;
    }
    r->leader = 0;
    r->election_elapsed = 0;
    r->heartbeat_elapsed = 0;
    ida__raft_randomize_timeout(r);
    memset(r->votes, 0, sizeof(r->votes));
    memset(r->voted, 0, sizeof(r->voted));
    r->transferee = 0;
    r->n_reads_pending = 0;
    r->broadcast = false;
}

void ida__raft_become_follower(struct ida_raft *r,
                               ida_term term,
                               ida_node_id lead)
{
    reset(r, term);
    r->role = IDA_RAFT_FOLLOWER;
    r->leader = lead;
    ida__raft_check_invariants(r);
}

static void become_leader(struct ida_raft *r)
{
    IDA_ASSERT(r->role == IDA_RAFT_CANDIDATE);
    reset(r, r->term);
    r->role = IDA_RAFT_LEADER;
    r->leader = r->cfg.id;
    for (size_t i = 0; i < ida__raft_n_members(r); i++) {
        struct ida_raft_progress *pr = &r->prs[i];
        memset(pr, 0, sizeof(*pr));
        pr->id = ida__raft_member_id(r, i);
        pr->next = ida__raft_last_index(r) + 1;
        pr->state = IDA_RAFT_PROBE;
        pr->recent_active = true;
    }
    /* §6.4: a leader commits a blank no-op entry at the start of its term,
     * which also commits everything before it (Figure 8). If the log cannot
     * grow the no-op is missing; the leader then cannot commit, check-quorum
     * or the next election recovers. */
    if (ida__raft_log_reserve(r, 1) == 0) {
        ida__raft_log_push(r, r->term, IDA_ENTRY_NOOP, NULL, 0);
    }
    r->broadcast = true;
    ida__raft_check_invariants(r);
}

static bool record_vote(struct ida_raft *r,
                        ida_node_id from,
                        bool granted,
                        size_t *yes,
                        size_t *no)
{
    int s = ida__raft_voter_slot(r, from);
    if (s < 0) {
        return false;
    }
    if (!r->voted[s]) {
        r->voted[s] = true;
        r->votes[s] = granted;
    }
    *yes = *no = 0;
    for (size_t i = 0; i < r->conf.n; i++) {
        if (r->voted[i]) {
            *(r->votes[i] ? yes : no) += 1;
        }
    }
    return true;
}

void ida__raft_campaign(struct ida_raft *r, bool pre, bool transfer)
{
    ida_term vote_term;
    if (r->term >= IDA_RAFT_TERM_MAX) {
        /* The term space is used up (only a peer could have brought us
         * here): term + 1 would be refused by everyone, or wrap. */
        return;
    }
    if (pre) {
        /* §9.6 pre-vote: ask first whether we could win, without touching
         * the term, so a partitioned node cannot disrupt the cluster. */
        reset(r, r->term);
        r->role = IDA_RAFT_PRE_CANDIDATE;
        vote_term = r->term + 1;
    } else {
        /* Figure 2: increment currentTerm, vote for self. */
        reset(r, r->term + 1);
        r->role = IDA_RAFT_CANDIDATE;
        r->vote = r->cfg.id;
        vote_term = r->term;
    }
    size_t yes, no;
    record_vote(r, r->cfg.id, true, &yes, &no);
    if (yes >= ida__raft_quorum(r)) {
        if (pre) {
            ida__raft_campaign(r, false, transfer);
        } else {
            become_leader(r);
        }
        return;
    }
    for (size_t i = 0; i < r->conf.n; i++) {
        if (r->conf.voters[i] == r->cfg.id) {
            continue;
        }
        struct ida_raft_msg m;
        ida__raft_msg_init(&m, IDA_RAFT_MSG_REQUEST_VOTE, r->conf.voters[i],
                           vote_term);
        m.u.request_vote.pre_vote = pre;
        m.u.request_vote.last_log_index = ida__raft_last_index(r);
        m.u.request_vote.last_log_term = ida__raft_last_term(r);
        m.u.request_vote.transfer = transfer;
        if (pre) {
            ida__raft_send_now(r, &m); /* nothing of ours to persist */
        } else {
            /* Our term and self-vote must be durable first, or a crash
             * could let us vote for another candidate in this term. */
            ida__raft_send_after_persist(r, &m);
        }
    }
}

void ida__raft_send_timeout_now(struct ida_raft *r, ida_node_id to)
{
    struct ida_raft_msg m;
    ida__raft_msg_init(&m, IDA_RAFT_MSG_TIMEOUT_NOW, to, r->term);
    ida__raft_send_now(r, &m);
}

/* Whether this node is a learner of its own membership under its own
 * incarnation (rule A1 of raft/admission.h). */
static bool own_learner(const struct ida_raft *r)
{
    int s = ida_raft_conf_learner_slot(&r->conf, r->cfg.id);
    return s >= 0 && r->conf.learner_inc[s] != 0 &&
           r->conf.learner_inc[s] == r->cfg.incarnation;
}

void ida__raft_handle_request_vote(struct ida_raft *r,
                                   const struct ida_raft_msg *m)
{
    const struct ida_raft_request_vote *rv = &m->u.request_vote;
    bool can_vote = r->vote == m->from || (r->vote == 0 && r->leader == 0) ||
                    (rv->pre_vote && m->term > r->term);
    /* §5.4.1: grant only if the candidate's log is at least as up to date
     * as ours: later last term, or same last term and at least as long. */
    bool up_to_date = rv->last_log_term > ida__raft_last_term(r) ||
                      (rv->last_log_term == ida__raft_last_term(r) &&
                       rv->last_log_index >= ida__raft_last_index(r));
    if (r->bugs & IDA_RAFT_BUG_VOTE_NO_LOG_CHECK) {
        up_to_date = true;
    }
    /* Rule A1 of raft/admission.h: a node that is not a member of its own
     * membership under its incarnation (a new, empty incarnation)
     * promised nothing and may not vote. A learner under its own
     * incarnation may: it may have been promoted without knowing it yet
     * (the promotion is in the leader's log, not in its own), and the
     * other voters may need its vote to elect the leader that would tell
     * it. */
    bool grant =
        can_vote && up_to_date && (ida_raft_admitted(r) || own_learner(r));
    if (!grant && r->term == 0) {
        return; /* a refusal at term 0 tells nothing and is not valid */
    }
    struct ida_raft_msg resp;
    ida__raft_msg_init(&resp, IDA_RAFT_MSG_RESPONSE_VOTE, m->from,
                       grant ? m->term : r->term);
    resp.u.response_vote.pre_vote = rv->pre_vote;
    resp.u.response_vote.granted = grant;
    if (rv->pre_vote) {
        ida__raft_send_now(r, &resp); /* changes nothing of ours */
        return;
    }
    if (grant) {
        r->vote = m->from;
        r->election_elapsed = 0;
    }
    ida__raft_send_after_persist(r, &resp);
}

void ida__raft_handle_vote_response(struct ida_raft *r,
                                    const struct ida_raft_msg *m)
{
    bool pre = m->u.response_vote.pre_vote;
    if ((r->role == IDA_RAFT_PRE_CANDIDATE) != pre ||
        (r->role != IDA_RAFT_PRE_CANDIDATE && r->role != IDA_RAFT_CANDIDATE)) {
        return;
    }
    size_t yes, no;
    if (!record_vote(r, m->from, m->u.response_vote.granted, &yes, &no)) {
        return;
    }
    if (yes >= ida__raft_quorum(r)) {
        if (pre) {
            ida__raft_campaign(r, false, false);
        } else {
            become_leader(r);
        }
    } else if (no >= ida__raft_quorum(r)) {
        ida__raft_become_follower(r, r->term, 0);
    }
}

bool ida__raft_quorum_active(struct ida_raft *r)
{
    size_t active = 0;
    for (size_t i = 0; i < r->conf.n; i++) {
        if (r->conf.voters[i] == r->cfg.id || r->prs[i].recent_active) {
            active++;
        }
        r->prs[i].recent_active = false;
    }
    return active >= ida__raft_quorum(r);
}

int ida_raft_transfer(struct ida_raft *r, ida_node_id to)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    if (r->role != IDA_RAFT_LEADER) {
        return IDA_ENOTLEADER;
    }
    struct ida_raft_progress *pr = ida__raft_progress_of(r, to);
    if (pr == NULL || to == r->cfg.id || ida__raft_voter_slot(r, to) < 0) {
        return IDA_EINVAL;
    }
    if (r->transferee != 0) {
        return IDA_EBUSY;
    }
    r->transferee = to;
    r->election_elapsed = 0; /* the transfer must finish within a timeout */
    if (pr->match == ida__raft_last_index(r)) {
        ida__raft_send_timeout_now(r, to);
    } else {
        ida__raft_send_append(r, pr, true);
    }
    ida__raft_check_invariants(r);
    return 0;
}
