/* The core's own invariants, checked after every public call and on role
 * changes (as canonical/raft's log.c asserts its own state). Only state the
 * core derives itself is checked here, never a field a peer message sets
 * directly: peer input gets an error code, not a crash. Internal helpers:
 * raft/internal.h. */
#include "raft/raft.h"

#include "base/assert.h"
#include "raft/internal.h"

/* The log holds [snap_index + 1, last_index], consecutive, with terms that
 * never exceed the current term; the cursors that point into it stay
 * inside it. */
static void check_log(const struct ida_raft *r)
{
    ida_index last = ida__raft_last_index(r);
    IDA_ASSERT(r->n_log <= r->cap_log);
    if (r->n_log > 0) {
        IDA_ASSERT(r->log[0].index == r->snap_index + 1);
        IDA_ASSERT(r->log[r->n_log - 1].index == last);
        /* Entries enter the log only with a term <= the term of the
         * message (or hard state) that brought them, and terms only grow. */
        IDA_ASSERT(r->log[r->n_log - 1].term <= r->term);
    }
    IDA_ASSERT(r->stable <= last);
    IDA_ASSERT(r->unsent > r->snap_index);
    IDA_ASSERT(r->unsent <= last + 1);
    for (unsigned k = 0; k < r->pending_count; k++) {
        unsigned p = (r->pending_head + k) % IDA_RAFT_PENDING_MAX;
        IDA_ASSERT(r->pending[p].last <= last); /* clamped on truncation */
    }
}

/* snapshot <= applied <= commit <= last index: nothing is applied before
 * it commits, and nothing commits that the log does not hold. */
static void check_commit(const struct ida_raft *r)
{
    IDA_ASSERT(r->snap_index <= r->applied);
    IDA_ASSERT(r->applied <= r->commit);
    IDA_ASSERT(r->commit <= ida__raft_last_index(r));
}

/* A candidate and a leader voted for themselves in their term; a leader's
 * progress of every member stays within its log, and its pipelines within
 * their bounds. */
static void check_role(const struct ida_raft *r)
{
    IDA_ASSERT(r->conf.n >= 1);
    IDA_ASSERT(r->conf.n <= IDA_RAFT_NODES_MAX);
    IDA_ASSERT(r->conf.n_learners <= IDA_RAFT_NODES_MAX);
    IDA_ASSERT(r->pending_count <= IDA_RAFT_PENDING_MAX);
    IDA_ASSERT(r->term <= IDA_RAFT_TERM_MAX); /* term + 1 never wraps */
    if (r->role == IDA_RAFT_CANDIDATE || r->role == IDA_RAFT_LEADER) {
        IDA_ASSERT(r->vote == r->cfg.id);
    }
    if (r->role != IDA_RAFT_LEADER) {
        return;
    }
    IDA_ASSERT(r->leader == r->cfg.id);
    for (size_t i = 0; i < ida__raft_n_members(r); i++) {
        const struct ida_raft_progress *pr = &r->prs[i];
        IDA_ASSERT(pr->id == ida__raft_member_id(r, i));
        /* A peer's claim above our last index is ignored, and a leader's
         * log never shrinks. */
        IDA_ASSERT(pr->match <= ida__raft_last_index(r));
        /* send_append reads the log from next - 1. */
        IDA_ASSERT(pr->next <= ida__raft_last_index(r) + 1);
        IDA_ASSERT(pr->inflight_count <= r->cfg.max_inflight);
        /* Snapshot mode: what is in flight lies within the snapshot. */
        if (pr->state == IDA_RAFT_SNAPSHOT && pr->snap_index == r->snap_index) {
            IDA_ASSERT(pr->snap_acked <= pr->snap_offset);
            IDA_ASSERT(pr->snap_offset <= r->snap_len);
        }
        IDA_ASSERT(pr->read_ack <= r->read_seq);
    }
}

void ida__raft_check_invariants(const struct ida_raft *r)
{
    check_log(r);
    check_commit(r);
    check_role(r);
}
