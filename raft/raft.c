/* The Raft core: init, step dispatch, tick and accessors. DESIGN and
 * contracts: raft/raft.h; the rest of the core is spread over the raft/ .c
 * files declared in raft/internal.h. Rules from the paper are quoted where
 * they are implemented ("Figure 2" is the Raft paper's summary figure; "§"
 * numbers are the Raft dissertation's).
 */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"
#include "raft/testing.h"

/* Messages with a term lower than ours. */
static void step_stale(struct ida_raft *r, const struct ida_raft_msg *m)
{
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES ||
        m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
        /* A leader cut off from us kept its old term while we moved on;
         * with pre-vote it may never hear our higher term otherwise. A
         * follower that fell behind gets only InstallSnapshot chunks, no
         * appends, so those must be answered too, or a stale leader sending
         * a snapshot is never told to step down. Without pre-vote and
         * check-quorum too (Figure 2: the reply carries our term): our own
         * campaigns were to tell it, but they go only to the voters our
         * log names, and a log behind a membership change may not count
         * the leader among them (simulator liveness seed 7722996: a voter
         * whose log ended while the leader's new incarnation was still a
         * learner campaigned to a removed node for 5 s while the leader,
         * never told, kept term 4). */
        struct ida_raft_msg resp;
        ida__raft_msg_init(&resp, IDA_RAFT_MSG_APPEND_RESPONSE, m->from,
                           r->term);
        ida__raft_send_now(r, &resp);
    } else if (m->type == IDA_RAFT_MSG_REQUEST_VOTE) {
        /* Figure 2: "reply false if term < currentTerm", with our term. A
         * candidate that never hears our term can otherwise be stuck behind
         * a voter that campaigns for a membership naming only itself and a
         * dead node, and never asks the candidate (make chaos's sim-long,
         * liveness seed 104430, without pre-vote). */
        struct ida_raft_msg resp;
        ida__raft_msg_init(&resp, IDA_RAFT_MSG_RESPONSE_VOTE, m->from, r->term);
        resp.u.response_vote.pre_vote = m->u.request_vote.pre_vote;
        ida__raft_send_now(r, &resp);
    }
}

static int step_role(struct ida_raft *r, const struct ida_raft_msg *m)
{
    switch (m->type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            ida__raft_handle_request_vote(r, m);
            return 0;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
            ida__raft_handle_vote_response(r, m);
            return 0;
        case IDA_RAFT_MSG_APPEND_ENTRIES:
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT:
            if (r->role == IDA_RAFT_LEADER) {
                return IDA_EPROTO; /* two leaders in one term */
            }
            if (r->role != IDA_RAFT_FOLLOWER) {
                ida__raft_become_follower(r, r->term, m->from);
            }
            r->leader = m->from;
            r->election_elapsed = 0;
            return m->type == IDA_RAFT_MSG_APPEND_ENTRIES
                       ? ida__raft_handle_append(r, m)
                       : ida__raft_handle_install_snapshot(r, m);
        case IDA_RAFT_MSG_APPEND_RESPONSE:
            return r->role == IDA_RAFT_LEADER
                       ? ida__raft_handle_append_response(r, m)
                       : 0;
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE:
            return r->role == IDA_RAFT_LEADER
                       ? ida__raft_handle_snapshot_response(r, m)
                       : 0;
        case IDA_RAFT_MSG_TIMEOUT_NOW:
            /* §3.10: the leader asks us to start an election at once; only
             * the leader we follow in this term may. */
            if (r->role == IDA_RAFT_FOLLOWER && r->leader == m->from &&
                ida__raft_promotable(r)) {
                ida__raft_campaign(r, false, true);
            }
            return 0;
    }
    return IDA_EINVAL;
}

static int check_config(const struct ida_raft_config *cfg)
{
    if (cfg->id == 0 || cfg->n_voters == 0 ||
        cfg->n_voters > IDA_RAFT_NODES_MAX || cfg->heartbeat_ticks == 0 ||
        cfg->election_ticks < 2 * cfg->heartbeat_ticks ||
        cfg->max_inflight == 0 || cfg->max_inflight > IDA_RAFT_INFLIGHT_MAX ||
        cfg->max_msg_entries == 0 || cfg->snapshot_chunk_bytes == 0 ||
        cfg->snapshot_max_inflight > IDA_RAFT_INFLIGHT_MAX ||
        cfg->conf_decode == NULL) {
        return IDA_EINVAL;
    }
    for (size_t i = 0; i < cfg->n_voters; i++) {
        if (cfg->voters[i] == 0) {
            return IDA_EINVAL;
        }
        for (size_t j = i + 1; j < cfg->n_voters; j++) {
            if (cfg->voters[i] == cfg->voters[j]) {
                return IDA_EINVAL;
            }
        }
    }
    return 0;
}

static int check_restore(const struct ida_raft_config *cfg,
                         const struct ida_raft_restore *st)
{
    if ((st->snapshot_index == 0) != (st->snapshot_term == 0) ||
        st->hard_state.term > IDA_RAFT_TERM_MAX ||
        (st->snapshot_data != NULL && st->snapshot_take != NULL) ||
        (st->snapshot_in_storage &&
         (st->snapshot_data != NULL || st->snapshot_take != NULL ||
          st->snapshot_index == 0)) ||
        (st->snapshot_len > 0 && st->snapshot_data == NULL &&
         st->snapshot_take == NULL && !st->snapshot_in_storage) ||
        (st->snapshot_config_len > 0 && st->snapshot_config == NULL)) {
        return IDA_EINVAL;
    }
    struct ida_raft_conf c;
    if (st->snapshot_config_len > 0 &&
        ida__raft_conf_decode(cfg, st->snapshot_config, st->snapshot_config_len,
                              &c) != 0) {
        return IDA_EINVAL;
    }
    ida_term prev_term = st->snapshot_term;
    for (size_t i = 0; i < st->n_entries; i++) {
        const struct ida_entry *e = &st->entries[i];
        if (e->index != st->snapshot_index + 1 + i || e->term < prev_term ||
            e->term > st->hard_state.term || e->term == 0 ||
            (e->len > 0 && e->data == NULL)) {
            return IDA_EINVAL;
        }
        if (e->type == IDA_ENTRY_CONFIG &&
            ida__raft_conf_decode(cfg, e->data, e->len, &c) != 0) {
            return IDA_EINVAL;
        }
        prev_term = e->term;
    }
    return 0;
}

static int restore_state(struct ida_raft *r, const struct ida_raft_restore *st)
{
    int rv = ida__raft_log_reserve(r, st->n_entries);
    if (rv != 0) {
        return rv;
    }
    if (st->snapshot_index > 0) {
        if (st->snapshot_in_storage) {
            r->snap_data = NULL; /* the application keeps it (contract 7) */
        } else if (st->snapshot_take != NULL) {
            r->snap_data = st->snapshot_take; /* given back on failure */
        } else {
            rv = ida__raft_copy_data(st->snapshot_data, st->snapshot_len,
                                     &r->snap_data);
        }
        if (rv != 0) {
            return rv;
        }
        r->snap_len = st->snapshot_len;
        r->snap_index = st->snapshot_index;
        r->snap_term = st->snapshot_term;
        rv = ida__raft_copy_data(st->snapshot_config, st->snapshot_config_len,
                                 &r->snap_conf);
        if (rv != 0) {
            return rv;
        }
        r->snap_conf_len = st->snapshot_config_len;
    }
    for (size_t i = 0; i < st->n_entries; i++) {
        const struct ida_entry *e = &st->entries[i];
        uint8_t *d;
        rv = ida__raft_copy_data(e->data, e->len, &d);
        if (rv != 0) {
            return rv;
        }
        ida__raft_log_push(r, e->term, e->type, d, e->len);
    }
    r->term = st->hard_state.term;
    r->vote = st->hard_state.vote;
    r->commit = st->hard_state.commit;
    if (r->commit < r->snap_index) {
        r->commit = r->snap_index;
    }
    if (r->commit > ida__raft_last_index(r)) {
        r->commit = ida__raft_last_index(r);
    }
    return 0;
}

int ida_raft_init(struct ida_raft *r,
                  const struct ida_raft_config *cfg,
                  const struct ida_raft_restore *restore)
{
    IDA_ASSERT(r != NULL);
    IDA_ASSERT(cfg != NULL);
    memset(r, 0, sizeof(*r));
    int rv = check_config(cfg);
    if (rv == 0 && restore != NULL) {
        rv = check_restore(cfg, restore);
    }
    if (rv != 0) {
        return rv;
    }
    r->cfg = *cfg;
    r->rng = (cfg->seed ^ ((uint64_t)cfg->id * 0x9E3779B97F4A7C15ULL)) | 1;
    if (restore != NULL) {
        rv = restore_state(r, restore);
    }
    if (rv == 0) {
        rv = ida__raft_conf_refresh(r);
    }
    if (rv != 0) {
        if (restore != NULL && restore->snapshot_take != NULL &&
            r->snap_data == restore->snapshot_take) {
            r->snap_data = NULL; /* still the caller's */
        }
        ida_raft_close(r);
        return rv;
    }
    r->applied = r->snap_index;
    r->stable = ida__raft_last_index(r);
    r->unsent = ida__raft_last_index(r) + 1;
    r->hs_out.term = r->term;
    r->hs_out.vote = r->vote;
    r->hs_out.commit = r->commit;
    r->next_batch_id = 1;
    r->role = IDA_RAFT_FOLLOWER;
    ida__raft_randomize_timeout(r);
    ida__raft_check_invariants(r);
    return 0;
}

void ida_raft_close(struct ida_raft *r)
{
    for (size_t i = 0; i < r->n_log; i++) {
        ida_free(r->log[i].data);
    }
    ida_free(r->log);
    (void)ida_raft_release(r, SIZE_MAX);
    ida_free(r->garbage);
    ida_free(r->snap_data);
    ida_free(r->rcv_data);
    ida_free(r->snap_conf);
    ida_free(r->rcv_conf);
    ida_free(r->msgs);
    ida_free(r->msgs_ap);
    ida_free(r->reads_pending);
    ida_free(r->reads_ready);
    memset(r, 0, sizeof(*r));
}

static void tick(struct ida_raft *r)
{
    ida__raft_begin(r);
    if (r->rollback.kind != IDA_RAFT_ROLLBACK_NONE) {
        return; /* rule A4: this node's state is not to be trusted */
    }
    if (r->role != IDA_RAFT_LEADER) {
        r->election_elapsed++;
        if (ida__raft_promotable(r) &&
            r->election_elapsed >= r->randomized_timeout) {
            r->election_elapsed = 0;
            ida__raft_campaign(r, r->cfg.pre_vote, false);
        }
        return;
    }
    r->heartbeat_elapsed++;
    r->election_elapsed++;
    if (r->election_elapsed >= r->cfg.election_ticks) {
        r->election_elapsed = 0;
        /* §6.2 check-quorum: a leader that did not hear from a majority
         * within an election timeout steps down. */
        if (r->cfg.check_quorum && !ida__raft_quorum_active(r)) {
            ida__raft_become_follower(r, r->term, 0);
            return;
        }
        r->transferee = 0; /* §3.10: abort a transfer that did not finish */
    }
    if (r->heartbeat_elapsed >= r->cfg.heartbeat_ticks) {
        r->heartbeat_elapsed = 0;
        for (size_t i = 0; i < ida__raft_n_members(r); i++) {
            if (r->prs[i].id != r->cfg.id) {
                ida__raft_tick_heartbeat_peer(r, &r->prs[i]);
            }
        }
    }
}

void ida_raft_tick(struct ida_raft *r)
{
    tick(r);
    ida__raft_check_invariants(r);
}

/* The entries of an AppendEntries follow prev_log_index one by one, with
 * terms that never decrease from prev_log_term and never exceed the
 * message's term (Figure 2: a leader sends entries of its log, whose terms
 * are at most its own). */
static bool valid_entries(const struct ida_raft_msg *m)
{
    const struct ida_raft_append_entries *ae = &m->u.append_entries;
    if (ae->n_entries > 0 && ae->entries == NULL) {
        return false;
    }
    if (ae->n_entries > IDA_RAFT_INDEX_MAX - ae->prev_log_index) {
        return false; /* prev + n would pass the index bound (or wrap) */
    }
    ida_term prev_t = ae->prev_log_term;
    for (size_t j = 0; j < ae->n_entries; j++) {
        const struct ida_entry *e = &ae->entries[j];
        if (e->index != ae->prev_log_index + 1 + j || e->term < prev_t ||
            e->term > m->term || e->term == 0 ||
            (e->len > 0 && e->data == NULL)) {
            return false;
        }
        prev_t = e->term;
    }
    return true;
}

/* InstallSnapshot: a chunk [offset, offset + len) of a snapshot of
 * total_size bytes, which the config bounds; done on the last chunk. */
static bool valid_snapshot_chunk(const struct ida_raft *r,
                                 const struct ida_raft_msg *m)
{
    const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
    size_t max = r->cfg.snapshot_bytes_max ? r->cfg.snapshot_bytes_max
                                           : IDA_RAFT_SNAPSHOT_BYTES_DEFAULT;
    if (is->last_index == 0 || is->last_index > IDA_RAFT_INDEX_MAX ||
        is->last_term == 0 || is->last_term > m->term ||
        (is->len > 0 && is->data == NULL) ||
        (is->config_len > 0 && is->config == NULL)) {
        return false;
    }
    if (is->total_size > max || is->offset > is->total_size ||
        is->len > is->total_size - is->offset) {
        return false; /* offset + len <= total_size <= max, no wrap */
    }
    return !is->done || is->offset + is->len == is->total_size;
}

/* Checks of a message against itself and the config, before anything of
 * the core is touched. Checks against the receiver's state (its log, its
 * progress of the sender) are made by the handlers, also before they
 * change anything. Returns 0 or IDA_EINVAL. */
static int valid_msg(const struct ida_raft *r, const struct ida_raft_msg *m)
{
    /* Messages from non-members are read: a new leader's config may not
     * have reached us yet (dissertation §4.1); see step(). */
    if (m->to != r->cfg.id || m->from == r->cfg.id || m->from == 0 ||
        m->term == 0 || m->term > IDA_RAFT_TERM_MAX) {
        return IDA_EINVAL;
    }
    /* Rule A4's echoes: a node takes any term it hears, so no term it
     * heard from anyone is above its own. */
    if (m->to_term > m->term || m->to_match > IDA_RAFT_INDEX_MAX ||
        m->n_gossip > IDA_RAFT_NODES_MAX) {
        return IDA_EINVAL;
    }
    for (size_t i = 0; i < m->n_gossip; i++) {
        if (m->gossip[i].term > m->term) {
            return IDA_EINVAL;
        }
    }
    switch (m->type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            /* The candidate's log ends at or below its (pre-vote) term. */
            if (m->u.request_vote.last_log_index > IDA_RAFT_INDEX_MAX ||
                m->u.request_vote.last_log_term > m->term ||
                (m->u.request_vote.last_log_index == 0) !=
                    (m->u.request_vote.last_log_term == 0)) {
                return IDA_EINVAL;
            }
            return 0;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
        case IDA_RAFT_MSG_TIMEOUT_NOW:
            return 0;
        case IDA_RAFT_MSG_APPEND_ENTRIES: {
            const struct ida_raft_append_entries *ae = &m->u.append_entries;
            if (ae->prev_log_index > IDA_RAFT_INDEX_MAX ||
                ae->commit_index > IDA_RAFT_INDEX_MAX ||
                ae->prev_log_term > m->term ||
                (ae->prev_log_index == 0) != (ae->prev_log_term == 0) ||
                !valid_entries(m)) {
                return IDA_EINVAL;
            }
            return 0;
        }
        case IDA_RAFT_MSG_APPEND_RESPONSE: {
            const struct ida_raft_append_response *ar = &m->u.append_response;
            if (ar->match_index > IDA_RAFT_INDEX_MAX ||
                ar->reject_index > IDA_RAFT_INDEX_MAX ||
                ar->conflict_index > IDA_RAFT_INDEX_MAX ||
                ar->conflict_term > m->term) {
                return IDA_EINVAL;
            }
            return 0;
        }
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT:
            return valid_snapshot_chunk(r, m) ? 0 : IDA_EINVAL;
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE:
            if (m->u.snapshot_response.last_index > IDA_RAFT_INDEX_MAX ||
                m->u.snapshot_response.next_offset > IDA_RAFT_INDEX_MAX) {
                return IDA_EINVAL;
            }
            return 0;
    }
    return IDA_EINVAL;
}

/* §9.6 leader stickiness: this node heard from a leader within an election
 * timeout (a leader counts itself). */
static bool in_lease(const struct ida_raft *r)
{
    return r->cfg.check_quorum && r->leader != 0 &&
           r->election_elapsed < r->cfg.election_ticks;
}

static int step(struct ida_raft *r, const struct ida_raft_msg *m)
{
    IDA_ASSERT(r != NULL);
    IDA_ASSERT(m != NULL);
    ida__raft_begin(r);
    int rv = valid_msg(r, m);
    if (rv != 0) {
        return rv;
    }
    /* Rule A4 of raft/admission.h: our own state must not have gone back
     * behind what this member heard from us. */
    rv = ida__raft_check_rollback(r, m);
    if (rv != 0) {
        return rv;
    }
    /* Rule A2 of raft/admission.h: another incarnation of a member speaks
     * for nothing the member promised: its answers (votes, acks) count for
     * nothing here. A node that is not admitted counts nothing anyway. */
    bool answer = m->type == IDA_RAFT_MSG_RESPONSE_VOTE ||
                  m->type == IDA_RAFT_MSG_APPEND_RESPONSE ||
                  m->type == IDA_RAFT_MSG_SNAPSHOT_RESPONSE;
    if (!(r->bugs & IDA_RAFT_BUG_IGNORE_INCARNATION) && answer &&
        ida_raft_admitted(r) &&
        !ida_raft_conf_inc_ok(&r->conf, m->from, m->from_inc)) {
        return IDA_EFOREIGN;
    }
    bool is_vote = m->type == IDA_RAFT_MSG_REQUEST_VOTE;
    if (!(r->bugs & IDA_RAFT_BUG_HEAR_STRANGERS) && (answer || is_vote) &&
        ida__raft_member_slot(&r->conf, m->from) < 0) {
        /* A node outside our membership (voters and learners) is never
         * asked anything, so its answers are never needed; and its vote
         * requests are those of a removed or unknown server (§4.2.3: they
         * only disrupt). A candidate of a configuration our log has not
         * reached is known to the voters whose logs are up to date, and
         * those are the votes it can win with (its log must be at least as
         * new as theirs). Dropped before its term is looked at, so a
         * stranger cannot push our term up this way (the simulator's
         * --garbage runs check it). Ignored and counted, not an error: a
         * removed member's messages still in flight end here too. */
        r->dropped++;
        return 0;
    }
    if (m->term > r->term && m->type == IDA_RAFT_MSG_TIMEOUT_NOW) {
        /* §3.10: a leader sends TimeoutNow only to a member that
         * acknowledged its whole log, so at the leader's term: a genuine
         * one never carries a term above ours. Honouring only the leader
         * of our current term, a forged one must not move our term either
         * (each such step would depose the leader). */
        return 0;
    }
    if (m->term > r->term) {
        /* A node outside our membership may lead a configuration our log
         * has not reached yet (§4.1), so its term is not ignored for good;
         * but while we hear from a leader we know, nothing it says can be
         * needed: it waits out the lease, as a disruptive candidate does.
         * So a stranger cannot push up the terms of a healthy cluster. */
        if (ida__raft_member_slot(&r->conf, m->from) < 0 && in_lease(r)) {
            return 0;
        }
        if (is_vote) {
            /* §4.2.3 / §9.6: while we hear from a leader, ignore vote
             * requests, unless the leader itself asked for this election. */
            if (in_lease(r) && !m->u.request_vote.transfer) {
                return 0;
            }
        }
        bool pre_req = is_vote && m->u.request_vote.pre_vote;
        bool pre_ok = m->type == IDA_RAFT_MSG_RESPONSE_VOTE &&
                      m->u.response_vote.pre_vote && m->u.response_vote.granted;
        if (!pre_req && !pre_ok) {
            /* Figure 2: "If RPC request or response contains term T >
             * currentTerm: set currentTerm = T, convert to follower". */
            bool from_leader = m->type == IDA_RAFT_MSG_APPEND_ENTRIES ||
                               m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT;
            ida__raft_become_follower(r, m->term, from_leader ? m->from : 0);
        }
    } else if (m->term < r->term) {
        step_stale(r, m);
        return 0;
    } else if ((m->type == IDA_RAFT_MSG_APPEND_ENTRIES ||
                m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) &&
               r->leader != 0 && r->leader != m->from) {
        return IDA_EPROTO; /* Election Safety: one leader per term */
    }
    rv = step_role(r, m);
    ida__raft_step_down_if_removed(r);
    return rv;
}

int ida_raft_step(struct ida_raft *r, const struct ida_raft_msg *m)
{
    int rv = step(r, m);
    if (rv == IDA_EINVAL || rv == IDA_EPROTO) {
        r->dropped++;
    } else if (rv != IDA_ELOSTSTATE) {
        ida__raft_record_seen(r, m); /* after the step: see its comment */
    }
    ida__raft_check_invariants(r);
    return rv;
}

enum ida_raft_role ida_raft_role(const struct ida_raft *r)
{
    return r->role;
}

ida_node_id ida_raft_leader(const struct ida_raft *r)
{
    return r->leader;
}

ida_term ida_raft_term(const struct ida_raft *r)
{
    return r->term;
}

ida_index ida_raft_commit(const struct ida_raft *r)
{
    return r->commit;
}

ida_index ida_raft_last_index(const struct ida_raft *r)
{
    return ida__raft_last_index(r);
}

uint64_t ida_raft_dropped(const struct ida_raft *r)
{
    return r->dropped;
}

ida_index ida_raft_snapshot_index(const struct ida_raft *r)
{
    return r->snap_index;
}

uint64_t ida_raft_receiving(const struct ida_raft *r,
                            ida_index *index,
                            ida_term *term)
{
    *index = r->rcv_len > 0 ? r->rcv_index : 0;
    *term = r->rcv_len > 0 ? r->rcv_term : 0;
    return r->rcv_len;
}

const uint8_t *ida_raft_snapshot_config(const struct ida_raft *r, size_t *len)
{
    *len = r->snap_conf_len;
    return r->snap_conf;
}

const struct ida_raft_progress *ida_raft_progress_of(const struct ida_raft *r,
                                                     ida_node_id id)
{
    int k = ida__raft_member_slot(&r->conf, id);
    if (r->role != IDA_RAFT_LEADER || k < 0) {
        return NULL;
    }
    return &r->prs[k];
}

const struct ida_raft_conf *ida_raft_voters(const struct ida_raft *r)
{
    return &r->conf;
}

ida_term ida_raft_term_at(const struct ida_raft *r, ida_index index)
{
    return ida__raft_term_at(r, index);
}

const struct ida_entry *ida_raft_entry(const struct ida_raft *r,
                                       ida_index index)
{
    if (index <= r->snap_index || index > ida__raft_last_index(r)) {
        return NULL;
    }
    return ida__raft_entry_at(r, index);
}

const char *ida_raft_role_name(enum ida_raft_role role)
{
    switch (role) {
        case IDA_RAFT_FOLLOWER:
            return "follower";
        case IDA_RAFT_PRE_CANDIDATE:
            return "pre-candidate";
        case IDA_RAFT_CANDIDATE:
            return "candidate";
        case IDA_RAFT_LEADER:
            return "leader";
    }
    return "?";
}
