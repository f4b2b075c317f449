/* Log replication: per-peer progress, AppendEntries both ways, commit
 * and proposals. Internal helpers: raft/internal.h. */
#include "raft/raft.h"

#include <limits.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"
#include "raft/testing.h"

struct ida_raft_progress *ida__raft_progress_of(struct ida_raft *r,
                                                ida_node_id id)
{
    int s = ida__raft_member_slot(&r->conf, id);
    return s < 0 ? NULL : &r->prs[s];
}

void ida__raft_become_probe(struct ida_raft_progress *pr)
{
    pr->state = IDA_RAFT_PROBE;
    pr->next = pr->match + 1;
    pr->probe_sent = false;
    pr->inflight_count = 0;
    pr->inflight_head = 0;
}

static void become_replicate(struct ida_raft_progress *pr)
{
    pr->state = IDA_RAFT_REPLICATE;
    pr->next = pr->match + 1;
    pr->probe_sent = false;
    pr->inflight_count = 0;
    pr->inflight_head = 0;
}

static void free_inflight(struct ida_raft_progress *pr, ida_index upto)
{
    while (pr->inflight_count > 0 && pr->inflight[pr->inflight_head] <= upto) {
        pr->inflight_head = (pr->inflight_head + 1) % IDA_RAFT_INFLIGHT_MAX;
        pr->inflight_count--;
    }
}

/* One AppendEntries from pr->next (Figure 2), within the flow control of
 * the peer's progress state. Whether it was an append with entries in
 * replicate mode, after which more may follow at once. */
static bool send_one_append(struct ida_raft *r,
                            struct ida_raft_progress *pr,
                            bool allow_empty)
{
    if (pr->id == r->cfg.id) {
        return false;
    }
    if (pr->state == IDA_RAFT_SNAPSHOT) {
        ida__raft_send_snapshot_chunk(r, pr);
        return false;
    }
    if (pr->state == IDA_RAFT_PROBE && pr->probe_sent) {
        return false;
    }
    if (pr->state == IDA_RAFT_REPLICATE &&
        pr->inflight_count >= r->cfg.max_inflight) {
        return false;
    }
    ida_index prev = pr->next - 1;
    if (prev < r->snap_index) {
        /* The entries the peer needs were compacted: InstallSnapshot. */
        ida__raft_start_snapshot(r, pr);
        return false;
    }
    IDA_ASSERT(prev <= ida__raft_last_index(r)); /* next <= last + 1 */
    ida_index avail = ida__raft_last_index(r) - prev;
    size_t n =
        avail < r->cfg.max_msg_entries ? (size_t)avail : r->cfg.max_msg_entries;
    if (r->cfg.max_msg_bytes > 0 && n > 1) {
        size_t bytes = ida__raft_entry_at(r, prev + 1)->len;
        size_t k = 1;
        while (k < n) {
            size_t len = ida__raft_entry_at(r, prev + 1 + k)->len;
            if (bytes >= r->cfg.max_msg_bytes ||
                len > r->cfg.max_msg_bytes - bytes) {
                break;
            }
            bytes += len;
            k++;
        }
        n = k;
    }
    if (n == 0 && !allow_empty) {
        return false;
    }
    struct ida_raft_msg m;
    ida__raft_msg_init(&m, IDA_RAFT_MSG_APPEND_ENTRIES, pr->id, r->term);
    m.u.append_entries.prev_log_index = prev;
    m.u.append_entries.prev_log_term = ida__raft_term_at(r, prev);
    m.u.append_entries.n_entries = n;
    m.u.append_entries.commit_index = r->commit;
    m.u.append_entries.read_ctx = r->read_seq;
    m.ents_first_ = prev + 1;
    m.ents_last_term_ = n ? ida__raft_term_at(r, prev + n) : 0;
    ida__raft_send_now(r, &m);
    if (pr->state == IDA_RAFT_PROBE) {
        pr->probe_sent = true;
    } else if (n > 0) {
        unsigned slot =
            (pr->inflight_head + pr->inflight_count) % IDA_RAFT_INFLIGHT_MAX;
        pr->inflight[slot] = prev + n;
        pr->inflight_count++;
        pr->next = prev + n + 1;
        return true;
    }
    return false;
}

/* Replicate mode pipelines: appends go until the in-flight bound or the
 * end of the log, at most cfg.max_append_burst of them in one call (each
 * acknowledgement, proposal or tick that calls again sends more; raft.h
 * says when the window fills). Every append is encoded by the thread
 * that runs the core: unbounded, the acknowledgement of a snapshot
 * installed by a follower 40 k entries behind sent 32 appends of 1 MiB in
 * one step, which held a node's raft processor 40 to 75 ms. */
void ida__raft_send_append(struct ida_raft *r,
                           struct ida_raft_progress *pr,
                           bool allow_empty)
{
    unsigned burst =
        r->cfg.max_append_burst != 0 ? r->cfg.max_append_burst : UINT_MAX;
    while (send_one_append(r, pr, allow_empty) && --burst > 0) {
        allow_empty = false;
    }
}

/* A heartbeat: an empty AppendEntries at the peer's match index, which the
 * peer is known to hold, carrying the commit index it can use. */
void ida__raft_send_heartbeat(struct ida_raft *r, struct ida_raft_progress *pr)
{
    if (pr->id == r->cfg.id) {
        return;
    }
    if (pr->match < r->snap_index) {
        pr->probe_sent = false;
        ida__raft_send_append(r, pr, true);
        return;
    }
    struct ida_raft_msg m;
    ida__raft_msg_init(&m, IDA_RAFT_MSG_APPEND_ENTRIES, pr->id, r->term);
    m.u.append_entries.prev_log_index = pr->match;
    m.u.append_entries.prev_log_term = ida__raft_term_at(r, pr->match);
    m.u.append_entries.commit_index =
        r->commit < pr->match ? r->commit : pr->match;
    m.u.append_entries.read_ctx = r->read_seq;
    ida__raft_fill_gossip(r, &m);
    ida__raft_send_now(r, &m);
}

void ida__raft_broadcast_append(struct ida_raft *r, bool allow_empty)
{
    for (size_t i = 0; i < ida__raft_n_members(r); i++) {
        struct ida_raft_progress *pr = &r->prs[i];
        if (allow_empty && pr->state == IDA_RAFT_REPLICATE &&
            pr->next > ida__raft_last_index(r)) {
            ida__raft_send_heartbeat(
                r, pr); /* nothing new: just the commit index */
        } else {
            ida__raft_send_append(r, pr, allow_empty);
        }
    }
}

/* A new commit index travels with the next append, and a heartbeat (each
 * heartbeat interval) takes it to a follower that has nothing new:
 * nothing is sent for it alone. An empty append per follower per commit
 * (and its answer) was a wake-up of every node's network and Raft threads
 * per write at low load, for news nobody waits for: the leader answers
 * the client, and followers only apply (reads are served by the leader).
 * Entries that wait go out now, as on every acknowledgement. */
void ida__raft_committed(struct ida_raft *r)
{
    ida__raft_broadcast_append(r, false);
}

void ida__raft_tick_heartbeat_peer(struct ida_raft *r,
                                   struct ida_raft_progress *pr)
{
    switch (pr->state) {
        case IDA_RAFT_PROBE:
            pr->probe_sent = false; /* the probe may be lost: probe again */
            ida__raft_send_append(r, pr, true);
            break;
        case IDA_RAFT_REPLICATE:
            if (pr->inflight_count > 0 && !pr->acked) {
                /* No progress over a heartbeat interval: appends were lost. */
                ida__raft_become_probe(pr);
                ida__raft_send_append(r, pr, true);
            } else {
                ida__raft_send_heartbeat(r, pr);
            }
            pr->acked = false;
            break;
        case IDA_RAFT_SNAPSHOT:
            ida__raft_tick_snapshot(r, pr);
            break;
    }
}

static void sort_desc(ida_index *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        ida_index v = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] < v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* Figure 2, rules for leaders: "If there exists an N such that N >
 * commitIndex, a majority of matchIndex[i] >= N, and log[N].term ==
 * currentTerm: set commitIndex = N". The leader counts itself only up to
 * what it has persisted (§10.2.1). */
bool ida__raft_maybe_commit(struct ida_raft *r)
{
    ida_index m[IDA_RAFT_NODES_MAX];
    for (size_t i = 0; i < r->conf.n; i++) {
        m[i] = r->conf.voters[i] == r->cfg.id ? r->stable : r->prs[i].match;
    }
    sort_desc(m, r->conf.n);
    ida_index n = m[ida__raft_quorum(r) - 1];
    if (n <= r->commit) {
        return false;
    }
    bool old_ok = (r->bugs & IDA_RAFT_BUG_COMMIT_OLD_TERM) != 0;
    if (ida__raft_term_at(r, n) != r->term && !old_ok) {
        return false;
    }
    IDA_ASSERT(n <= ida__raft_last_index(r));
    r->commit = n;
    return true;
}

/* Checks of an AppendResponse against the leader's log and its progress of
 * the sender, before anything is changed. A follower answers appends of
 * this leader (same term), which carry entries of its log: the indexes it
 * reports are at most the last index, the conflict hint at most the
 * rejected index, and read_ctx a sequence number this leader sent. */
static int check_append_response(const struct ida_raft *r,
                                 const struct ida_raft_append_response *ar)
{
    ida_index last = ida__raft_last_index(r);
    if (ar->read_ctx > r->read_seq) {
        return IDA_EPROTO;
    }
    if (ar->success) {
        return ar->match_index > last ? IDA_EPROTO : 0;
    }
    if (ar->reject_index > last) {
        return IDA_EPROTO;
    }
    if (ar->reject_index != 0 &&
        (ar->conflict_index == 0 || ar->conflict_index > ar->reject_index)) {
        return IDA_EPROTO;
    }
    return 0;
}

int ida__raft_handle_append_response(struct ida_raft *r,
                                     const struct ida_raft_msg *m)
{
    struct ida_raft_progress *pr = ida__raft_progress_of(r, m->from);
    const struct ida_raft_append_response *ar = &m->u.append_response;
    if (pr == NULL) {
        return 0; /* not (or no longer) a member */
    }
    int rv = check_append_response(r, ar);
    if (rv != 0) {
        return rv;
    }
    pr->recent_active = true;
    if (ar->read_ctx > pr->read_ack) {
        pr->read_ack = ar->read_ctx;
        ida__raft_check_reads(r);
    }
    if (ar->success) {
        if (ar->match_index > pr->match) {
            pr->match = ar->match_index;
            pr->acked = true;
            free_inflight(pr, pr->match);
            if (pr->next <= pr->match) {
                pr->next = pr->match + 1;
            }
            if (pr->state == IDA_RAFT_PROBE ||
                (pr->state == IDA_RAFT_SNAPSHOT &&
                 pr->match >= pr->snap_index)) {
                become_replicate(pr);
            }
            if (ida__raft_maybe_commit(r)) {
                ida__raft_committed(r);
            }
            if (r->transferee == pr->id &&
                pr->match == ida__raft_last_index(r)) {
                ida__raft_send_timeout_now(r, pr->id);
            }
        } else if (pr->state == IDA_RAFT_PROBE) {
            pr->probe_sent = false;
        }
        ida__raft_send_append(r, pr, false);
        return 0;
    }
    /* Rejected. Ignore answers to appends the progress no longer expects
     * (reordered or duplicated messages). */
    if (ar->reject_index <= pr->match) {
        return 0;
    }
    if (pr->state == IDA_RAFT_PROBE && ar->reject_index != pr->next - 1) {
        return 0;
    }
    if (pr->state == IDA_RAFT_SNAPSHOT) {
        return 0;
    }
    /* Fast backtracking (§5.3): skip a whole conflicting term at once. */
    ida_index next = ar->conflict_index;
    if (ar->conflict_term != 0) {
        ida_index i = ar->reject_index;
        while (i > r->snap_index &&
               ida__raft_term_at(r, i) > ar->conflict_term) {
            i--;
        }
        if (i > r->snap_index && ida__raft_term_at(r, i) == ar->conflict_term) {
            next = i + 1;
        }
    }
    if (next > ar->reject_index) {
        next = ar->reject_index;
    }
    /* pr->next stays in [match + 1, last + 1]: send_append reads the log
     * from next - 1 (a next past last + 1 would make it count entries that
     * do not exist, and the follower would get bogus probes for good). */
    if (next < pr->match + 1) {
        next = pr->match + 1;
    }
    if (next > ida__raft_last_index(r) + 1) {
        next = ida__raft_last_index(r) + 1;
    }
    ida__raft_become_probe(pr);
    pr->next = next;
    ida__raft_send_append(r, pr, true);
    return 0;
}

static void reject_append(struct ida_raft *r,
                          const struct ida_raft_msg *m,
                          ida_index conflict_index,
                          ida_term conflict_term)
{
    struct ida_raft_msg resp;
    ida__raft_msg_init(&resp, IDA_RAFT_MSG_APPEND_RESPONSE, m->from, r->term);
    resp.u.append_response.success = false;
    resp.u.append_response.reject_index = m->u.append_entries.prev_log_index;
    resp.u.append_response.conflict_index = conflict_index;
    resp.u.append_response.conflict_term = conflict_term;
    resp.u.append_response.read_ctx = m->u.append_entries.read_ctx;
    ida__raft_send_now(r, &resp); /* a rejection claims nothing about our log */
}

static void accept_append(struct ida_raft *r,
                          const struct ida_raft_msg *m,
                          ida_index match)
{
    struct ida_raft_msg resp;
    ida__raft_msg_init(&resp, IDA_RAFT_MSG_APPEND_RESPONSE, m->from, r->term);
    resp.u.append_response.success = true;
    resp.u.append_response.match_index = match;
    resp.u.append_response.read_ctx = m->u.append_entries.read_ctx;
    /* The leader counts this as a durable replica: persist first. */
    ida__raft_send_after_persist(r, &resp);
}

/* Figure 2 AppendEntries receiver, steps 2-5. */
int ida__raft_handle_append(struct ida_raft *r, const struct ida_raft_msg *m)
{
    const struct ida_raft_append_entries *ae = &m->u.append_entries;
    ida_index prev = ae->prev_log_index;
    if (prev < r->commit) {
        /* Everything up to our commit index matches every leader's log. */
        accept_append(r, m, r->commit);
        return 0;
    }
    if (prev > ida__raft_last_index(r)) {
        reject_append(r, m, ida__raft_last_index(r) + 1, 0);
        return 0;
    }
    ida_term t = ida__raft_term_at(r, prev);
    if (t != ae->prev_log_term) {
        /* Hint: the first index of the conflicting term. */
        ida_index first = prev;
        while (first - 1 > r->snap_index &&
               ida__raft_term_at(r, first - 1) == t) {
            first--;
        }
        reject_append(r, m, first, t);
        return 0;
    }
    /* Indexes and terms of the entries were checked by valid_msg()
     * (raft/raft.c); the configs they carry must decode. */
    for (size_t j = 0; j < ae->n_entries; j++) {
        const struct ida_entry *e = &ae->entries[j];
        if (e->type == IDA_ENTRY_CONFIG) {
            struct ida_raft_conf c;
            int rv = ida__raft_conf_decode(&r->cfg, e->data, e->len, &c);
            if (rv != 0) {
                return rv;
            }
        }
    }
    /* Find the first new or conflicting entry. */
    size_t k = 0;
    while (k < ae->n_entries && prev + 1 + k <= ida__raft_last_index(r) &&
           ida__raft_term_at(r, prev + 1 + k) == ae->entries[k].term) {
        k++;
    }
    if (k < ae->n_entries) {
        ida_index idx = prev + 1 + k;
        if (idx <= r->commit) {
            /* A leader contradicts a committed entry. Unreachable: prev
             * >= commit here (the answer above takes the rest), so idx >
             * commit; kept should that answer ever change. */
            return IDA_EPROTO;
        }
        int rv = ida__raft_log_reserve(r, ae->n_entries - k);
        if (rv != 0) {
            return rv;
        }
        bool conf_changed = false;
        if (idx <= ida__raft_last_index(r)) {
            /* Figure 2 step 3: "If an existing entry conflicts with a new
             * one (same index but different terms), delete the existing
             * entry and all that follow it". */
            conf_changed = idx <= r->conf_index;
            ida__raft_log_truncate(r, idx);
        }
        /* Step 4: append any new entries not already in the log. */
        for (; k < ae->n_entries && rv == 0; k++) {
            const struct ida_entry *e = &ae->entries[k];
            uint8_t *d;
            rv = ida__raft_copy_data(e->data, e->len, &d);
            if (rv == 0) {
                ida__raft_log_push(r, e->term, e->type, d, e->len);
                conf_changed |= e->type == IDA_ENTRY_CONFIG;
            }
        }
        /* §4.1: a server uses the latest configuration in its log, whether
         * or not it is committed. */
        if (conf_changed) {
            int crv = ida__raft_conf_refresh(r);
            rv = rv != 0 ? rv : crv;
        }
        if (rv != 0) {
            return rv; /* a valid prefix was appended, nothing acked */
        }
    }
    ida_index last_new = prev + ae->n_entries;
    /* Figure 2 step 5: commitIndex = min(leaderCommit, index of last new
     * entry). */
    ida_index c = ae->commit_index < last_new ? ae->commit_index : last_new;
    if (c > r->commit) {
        r->commit = c;
    }
    accept_append(r, m, last_new);
    return 0;
}

int ida_raft_propose(struct ida_raft *r,
                     enum ida_entry_type type,
                     const uint8_t *data,
                     size_t len,
                     ida_index *index,
                     ida_term *term)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    if (r->role != IDA_RAFT_LEADER) {
        return IDA_ENOTLEADER;
    }
    if (r->transferee != 0) {
        return IDA_EBUSY;
    }
    if ((type != IDA_ENTRY_NORMAL && type != IDA_ENTRY_NOOP &&
         type != IDA_ENTRY_CONFIG) ||
        (len > 0 && data == NULL)) {
        return IDA_EINVAL;
    }
    struct ida_raft_conf c;
    if (type == IDA_ENTRY_CONFIG) {
        /* §4.1: one server at a time, one change at a time; and only
         * after this leader committed an entry of its own term, so its
         * change cannot overlap an uncommitted change of an earlier leader
         * (two such changes need not share a majority). */
        if (r->conf_index > r->commit ||
            ida__raft_term_at(r, r->commit) != r->term) {
            return IDA_EBUSY;
        }
        int rv = ida__raft_conf_decode(&r->cfg, data, len, &c);
        if (rv == IDA_ENOMEM) {
            return rv;
        }
        /* The same members are no change of quorums: such an entry only
         * carries what the application keeps in a membership (the node's
         * addresses, src/node/book.h). */
        if (rv != 0 || (!ida_raft_conf_one_change(&r->conf, &c) &&
                        !ida_raft_conf_same_members(&r->conf, &c))) {
            return IDA_EINVAL;
        }
    }
    int rv = ida__raft_log_reserve(r, 1);
    if (rv != 0) {
        return rv;
    }
    uint8_t *d;
    rv = ida__raft_copy_data(data, len, &d);
    if (rv != 0) {
        return rv;
    }
    ida__raft_log_push(r, r->term, type, d, len);
    if (type == IDA_ENTRY_CONFIG) {
        ida__raft_conf_apply(
            r, &c, ida__raft_last_index(r)); /* in effect when appended */
    }
    r->broadcast = true; /* sent at ready(): many proposals, one append */
    if (index != NULL) {
        *index = ida__raft_last_index(r);
    }
    if (term != NULL) {
        *term = r->term;
    }
    ida__raft_check_invariants(r);
    return 0;
}
