/* Output queues and the ready/persisted cycle (raft.h PERSISTENCE
 * CONTRACT). Internal helpers: raft/internal.h. */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"
#include "raft/testing.h"

/* Queue @m. On allocation failure the message is dropped: Raft tolerates
 * that exactly like a message lost by the network. */
static void queue_msg(struct ida_raft_msg **arr,
                      size_t *n,
                      size_t *cap,
                      const struct ida_raft_msg *m)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        struct ida_raft_msg *a = ida_realloc(*arr, c * sizeof(*a));
        if (a == NULL) {
            return;
        }
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = *m;
}

void ida__raft_send_now(struct ida_raft *r, struct ida_raft_msg *m)
{
    m->from = r->cfg.id;
    m->from_inc = r->cfg.incarnation;
    ida__raft_fill_echo(r, m, false);
    queue_msg(&r->msgs, &r->n_msgs, &r->cap_msgs, m);
}

/* Messages that depend on this node's durable state (votes, acks). */
void ida__raft_send_after_persist(struct ida_raft *r, struct ida_raft_msg *m)
{
    if (r->bugs & IDA_RAFT_BUG_ACK_BEFORE_PERSIST) {
        ida__raft_send_now(r, m);
        return;
    }
    m->from = r->cfg.id;
    m->from_inc = r->cfg.incarnation;
    ida__raft_fill_echo(r, m, true);
    queue_msg(&r->msgs_ap, &r->n_msgs_ap, &r->cap_msgs_ap, m);
}

void ida__raft_msg_init(struct ida_raft_msg *m,
                        enum ida_raft_msg_type type,
                        ida_node_id to,
                        ida_term term)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->to = to;
    m->term = term;
}

/* Outputs handed out by the last ready() are invalid from the next call. */
void ida__raft_begin(struct ida_raft *r)
{
    if (r->msgs_handed) {
        r->n_msgs = 0;
        r->msgs_handed = false;
    }
    if (r->ap_handed) {
        r->n_msgs_ap = 0;
        r->ap_handed = false;
    }
    if (r->n_reads_out > 0) {
        r->n_reads_ready -= r->n_reads_out;
        memmove(r->reads_ready, r->reads_ready + r->n_reads_out,
                r->n_reads_ready * sizeof(*r->reads_ready));
        r->n_reads_out = 0;
    }
}

/* Drop queued appends whose entries changed since they were queued (the
 * log was truncated or compacted) and point the rest at the log. */
static size_t resolve_msgs(struct ida_raft *r)
{
    size_t out = 0;
    for (size_t i = 0; i < r->n_msgs; i++) {
        struct ida_raft_msg *m = &r->msgs[i];
        if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
            m->u.append_entries.n_entries > 0) {
            ida_index first = m->ents_first_;
            ida_index last = first + m->u.append_entries.n_entries - 1;
            if (first <= r->snap_index || last > ida__raft_last_index(r) ||
                ida__raft_term_at(r, last) != m->ents_last_term_) {
                continue;
            }
            m->u.append_entries.entries = ida__raft_entry_at(r, first);
        }
        if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
            const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
            if (is->last_index != r->snap_index ||
                is->offset + is->len > r->snap_len) {
                continue;
            }
            m->u.install_snapshot.data =
                is->len && r->snap_data ? r->snap_data + is->offset : NULL;
            m->u.install_snapshot.config = r->snap_conf;
            m->u.install_snapshot.config_len = r->snap_conf_len;
        }
        r->msgs[out++] = *m;
    }
    return out;
}

bool ida_raft_ready(struct ida_raft *r, struct ida_raft_batch *b)
{
    IDA_ASSERT(r != NULL);
    IDA_ASSERT(b != NULL);
    ida__raft_begin(r);
    memset(b, 0, sizeof(*b));
    if (r->role == IDA_RAFT_LEADER && r->broadcast) {
        r->broadcast = false;
        ida__raft_broadcast_append(r, false);
    }
    bool work = false;
    if (r->pending_count < IDA_RAFT_PENDING_MAX) {
        ida_index last = 0;
        if (r->snap_unsent) {
            r->snap_unsent = false;
            b->has_snapshot = true;
            b->snapshot.index = r->snap_index;
            b->snapshot.term = r->snap_term;
            b->snapshot.data = r->snap_data;
            b->snapshot.len = r->snap_len;
            b->snapshot.config = r->snap_conf;
            b->snapshot.config_len = r->snap_conf_len;
            last = r->snap_index;
        }
        if (r->unsent <= ida__raft_last_index(r)) {
            b->entries = ida__raft_entry_at(r, r->unsent);
            b->n_entries = (size_t)(ida__raft_last_index(r) - r->unsent + 1);
            last = ida__raft_last_index(r);
            r->unsent = last + 1;
        }
        /* The term and vote must be durable before anything depends on
         * them; the commit index need not be (Figure 2 lists commitIndex
         * as volatile): it rides with entries or a snapshot that are
         * written anyway, and a change of it alone is no batch (see
         * PERSISTENCE CONTRACT 1). */
        struct ida_hard_state hs = {r->term, r->vote, r->commit};
        if (hs.term != r->hs_out.term || hs.vote != r->hs_out.vote ||
            (hs.commit != r->hs_out.commit &&
             (b->has_snapshot || b->n_entries > 0))) {
            b->has_hard_state = true;
            b->hard_state = hs;
            r->hs_out = hs;
        }
        b->must_persist =
            b->has_hard_state || b->has_snapshot || b->n_entries > 0;
        if (b->must_persist || r->n_msgs_ap > 0) {
            b->id = r->next_batch_id++;
            unsigned p =
                (r->pending_head + r->pending_count) % IDA_RAFT_PENDING_MAX;
            r->pending[p].id = b->id;
            r->pending[p].last = last;
            r->pending_count++;
        }
        b->msgs_after_persist = r->msgs_ap;
        b->n_msgs_after_persist = r->n_msgs_ap;
        r->ap_handed = true;
        work = b->must_persist || b->n_msgs_after_persist > 0;
    }
    r->n_msgs = resolve_msgs(r);
    b->msgs = r->msgs;
    b->n_msgs = r->n_msgs;
    r->msgs_handed = true;
    /* Figure 2: "If commitIndex > lastApplied: apply". Only entries that
     * are durable here too, so a restart never un-applies anything. */
    ida_index lim = r->commit < r->stable ? r->commit : r->stable;
    if (lim > r->applied) {
        b->committed = ida__raft_entry_at(r, r->applied + 1);
        b->n_committed = (size_t)(lim - r->applied);
        r->applied = lim;
    }
    b->reads = r->reads_ready;
    b->n_reads = r->n_reads_ready;
    r->n_reads_out = r->n_reads_ready;
    b->role = r->role;
    b->leader = r->leader;
    b->term = r->term;
    ida__raft_check_invariants(r);
    return work || b->n_msgs > 0 || b->n_committed > 0 || b->n_reads > 0;
}

void ida_raft_persisted(struct ida_raft *r, uint64_t id)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    bool any = false;
    while (r->pending_count > 0 && r->pending[r->pending_head].id <= id) {
        ida_index last = r->pending[r->pending_head].last;
        if (last > r->stable) {
            r->stable = last;
        }
        r->pending_head = (r->pending_head + 1) % IDA_RAFT_PENDING_MAX;
        r->pending_count--;
        any = true;
    }
    IDA_ASSERT(r->stable <= ida__raft_last_index(r));
    if (any && r->role == IDA_RAFT_LEADER && ida__raft_maybe_commit(r)) {
        ida__raft_committed(r);
    }
    ida__raft_step_down_if_removed(r);
    ida__raft_check_invariants(r);
}
