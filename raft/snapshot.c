/* Snapshots: chunked InstallSnapshot both ways and compaction. Internal
 * helpers: raft/internal.h. */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"

/* Chunks of the snapshot in flight to @pr, [snap_acked, snap_offset). */
static uint64_t chunks_in_flight(const struct ida_raft *r,
                                 const struct ida_raft_progress *pr)
{
    uint64_t bytes = pr->snap_offset - pr->snap_acked;
    uint64_t chunk = r->cfg.snapshot_chunk_bytes;
    return bytes / chunk + (bytes % chunk != 0);
}

/* Send again from @at, which the follower holds: one chunk at a time until
 * it takes one (a refused chunk is followed by the refusals of the others
 * sent after it; a probe does not multiply them). */
static void rewind_to(struct ida_raft_progress *pr, uint64_t at)
{
    pr->snap_acked = at;
    pr->snap_offset = at;
    pr->snap_probe = true;
    pr->snap_done_sent = false;
}

/* Send the chunks of the snapshot the window allows: from snap_offset, at
 * most cfg.snapshot_max_inflight chunks past snap_acked (one while
 * probing), each of cfg.snapshot_chunk_bytes but the last, which carries
 * done. */
void ida__raft_send_snapshot_chunk(struct ida_raft *r,
                                   struct ida_raft_progress *pr)
{
    if (pr->snap_index != r->snap_index) {
        /* A newer snapshot replaced the one being sent: start over. */
        pr->snap_index = r->snap_index;
        rewind_to(pr, 0);
    }
    unsigned window = r->cfg.snapshot_max_inflight;
    if (window == 0 || pr->snap_probe) {
        window = 1;
    }
    while (!pr->snap_done_sent && chunks_in_flight(r, pr) < window) {
        IDA_ASSERT(pr->snap_offset <= r->snap_len);
        uint64_t left = r->snap_len - pr->snap_offset;
        size_t len = left < r->cfg.snapshot_chunk_bytes
                         ? (size_t)left
                         : r->cfg.snapshot_chunk_bytes;
        struct ida_raft_msg m;
        ida__raft_msg_init(&m, IDA_RAFT_MSG_INSTALL_SNAPSHOT, pr->id, r->term);
        m.u.install_snapshot.last_index = r->snap_index;
        m.u.install_snapshot.last_term = r->snap_term;
        m.u.install_snapshot.offset = pr->snap_offset;
        m.u.install_snapshot.len = len;
        m.u.install_snapshot.done = pr->snap_offset + len == r->snap_len;
        m.u.install_snapshot.total_size = r->snap_len;
        ida__raft_send_now(r, &m);
        pr->snap_offset += len;
        pr->snap_done_sent = m.u.install_snapshot.done;
    }
}

void ida__raft_start_snapshot(struct ida_raft *r, struct ida_raft_progress *pr)
{
    pr->state = IDA_RAFT_SNAPSHOT;
    pr->snap_index = r->snap_index;
    /* A probe first: the follower may hold part of this snapshot already
     * (from an earlier transfer) and says how much. */
    rewind_to(pr, 0);
    pr->acked = false;
    ida__raft_send_snapshot_chunk(r, pr);
}

/* Heartbeat tick of a follower in snapshot mode. */
void ida__raft_tick_snapshot(struct ida_raft *r, struct ida_raft_progress *pr)
{
    if (!pr->acked) {
        /* Nothing taken over a heartbeat interval: chunks or answers were
         * lost (or the follower is busy checking the last one). Resend
         * from what it holds, one chunk at a time. */
        rewind_to(pr, pr->snap_acked);
    }
    pr->acked = false;
    ida__raft_send_snapshot_chunk(r, pr);
}

int ida__raft_handle_snapshot_response(struct ida_raft *r,
                                       const struct ida_raft_msg *m)
{
    struct ida_raft_progress *pr = ida__raft_progress_of(r, m->from);
    const struct ida_raft_snapshot_response *sr = &m->u.snapshot_response;
    if (pr == NULL) {
        return 0;
    }
    /* A follower answers chunks of snapshots this leader sent: never one
     * past our own snapshot, never an offset past the one being sent. */
    if (sr->last_index > r->snap_index ||
        (pr->state == IDA_RAFT_SNAPSHOT && sr->last_index == pr->snap_index &&
         pr->snap_index == r->snap_index && sr->next_offset > r->snap_len)) {
        return IDA_EPROTO;
    }
    pr->recent_active = true;
    if (pr->state != IDA_RAFT_SNAPSHOT || sr->last_index != pr->snap_index) {
        return 0;
    }
    if (sr->done && sr->success) {
        if (pr->snap_index > pr->match) {
            pr->match = pr->snap_index;
        }
        ida__raft_become_probe(pr);
        if (ida__raft_maybe_commit(r)) {
            ida__raft_committed(r);
        }
        ida__raft_send_append(r, pr, true);
        return 0;
    }
    if (pr->snap_index != r->snap_index) {
        /* About a snapshot replaced since (its offsets are not the new
         * one's): the new one is sent from byte 0. */
        ida__raft_send_snapshot_chunk(r, pr);
        return 0;
    }
    uint64_t at = sr->next_offset; /* the follower holds [0, at) */
    if (sr->success) {
        /* A chunk taken. An answer at or below what we know is an earlier
         * one arriving late (or twice): nothing new. */
        if (at > pr->snap_acked) {
            pr->snap_acked = at;
            pr->acked = true;
            pr->snap_probe = false;
            if (pr->snap_offset < at) {
                pr->snap_offset = at; /* after a rewind: skip what it has */
            }
        }
    } else if (!(pr->snap_probe && at == pr->snap_acked &&
                 pr->snap_offset > at)) {
        /* A chunk refused: a gap (one before it was lost), a chunk it
         * already holds, another snapshot in progress there, or a failed
         * check (at 0). Its refusal of the chunks sent after it says the
         * same while the probe from @at is out: those are ignored above. */
        if (at > pr->snap_acked) {
            pr->acked = true;
        }
        rewind_to(pr, at);
    }
    ida__raft_send_snapshot_chunk(r, pr);
    return 0;
}

/* Answer @to about the snapshot at @last_index: @taken (success) or
 * refused, holding [0, @next_offset) of it (0: nothing of it), @done once
 * installed. */
static void snapshot_reply_to(struct ida_raft *r,
                              ida_node_id to,
                              ida_index last_index,
                              uint64_t next_offset,
                              bool taken,
                              bool done,
                              bool after_persist)
{
    struct ida_raft_msg resp;
    ida__raft_msg_init(&resp, IDA_RAFT_MSG_SNAPSHOT_RESPONSE, to, r->term);
    resp.u.snapshot_response.last_index = last_index;
    resp.u.snapshot_response.next_offset = next_offset;
    resp.u.snapshot_response.done = done;
    resp.u.snapshot_response.success = taken;
    if (after_persist) {
        ida__raft_send_after_persist(r, &resp);
    } else {
        ida__raft_send_now(r, &resp);
    }
}

/* Answer the chunk @m (see snapshot_reply_to()). */
static void snapshot_reply(struct ida_raft *r,
                           const struct ida_raft_msg *m,
                           uint64_t next_offset,
                           bool taken,
                           bool done,
                           bool after_persist)
{
    snapshot_reply_to(r, m->from, m->u.install_snapshot.last_index, next_offset,
                      taken, done, after_persist);
}

/* Forget the snapshot being received. */
static void rcv_forget(struct ida_raft *r)
{
    ida_free(r->rcv_data);
    r->rcv_data = NULL;
    r->rcv_len = r->rcv_cap = 0;
    r->rcv_index = 0;
    r->rcv_total = 0;
    r->rcv_checking = false;
}

static void install_snapshot(struct ida_raft *r)
{
    ida_index s = r->rcv_index;
    ida_term t = r->rcv_term;
    if (s <= ida__raft_last_index(r) && ida__raft_term_at(r, s) == t) {
        /* §5: "If existing log entry has same index and term as snapshot's
         * last included entry, retain log entries following it". */
        ida__raft_log_compact(r, s, t);
    } else {
        /* The whole log is older or conflicting: drop it (its data as a
         * compaction's, freed a piece at a time: MEMORY). */
        ida__raft_log_drop_all(r);
        ida__raft_log_compact(r, s, t);
    }
    /* The snapshot batch rewrites the whole stored log (raft.h rule 1), so
     * the retained suffix goes out again with it, and nothing after the
     * snapshot counts as durable (or is applied) before that batch is. */
    r->unsent = s + 1;
    if (r->stable > s) {
        r->stable = s;
    }
    for (unsigned k = 0; k < r->pending_count; k++) {
        unsigned p = (r->pending_head + k) % IDA_RAFT_PENDING_MAX;
        if (r->pending[p].last > s) {
            r->pending[p].last = s;
        }
    }
    ida_free(r->snap_data);
    r->snap_data = r->rcv_data;
    r->snap_len = r->rcv_len;
    r->rcv_data = NULL; /* the snapshot's now */
    rcv_forget(r);
    ida_free(r->snap_conf);
    r->snap_conf = r->rcv_conf;
    r->snap_conf_len = r->rcv_conf_len;
    r->rcv_conf = NULL;
    r->rcv_conf_len = 0;
    r->snap_unsent = true;
    if (r->conf_index <= s) {
        r->conf_index = 0;
    }
    r->commit = s;
    r->applied = s; /* the state machine restores the snapshot */
}

/* Make room for @need bytes of the snapshot being received: the buffer
 * grows with what arrived (doubling, up to the announced total), never to
 * a size a message only announces. */
static int rcv_reserve(struct ida_raft *r, size_t need)
{
    if (need <= r->rcv_cap && r->rcv_data != NULL) {
        return 0;
    }
    size_t cap = r->rcv_cap ? r->rcv_cap : 64;
    while (cap < need) {
        cap *= 2;
    }
    if (cap > r->rcv_total && r->rcv_total >= need) {
        cap = r->rcv_total ? (size_t)r->rcv_total : 1;
    }
    uint8_t *d = ida_realloc(r->rcv_data, cap);
    if (d == NULL) {
        return IDA_ENOMEM;
    }
    r->rcv_data = d;
    r->rcv_cap = cap;
    return 0;
}

/* Figure 13 InstallSnapshot receiver. The chunk's own consistency (offset
 * + len <= total_size <= cfg.snapshot_bytes_max, done on the last byte,
 * last_term <= term) was checked by valid_msg() (raft/raft.c). Chunks are
 * taken in order only (a gap or an overlap is refused, with the offset we
 * hold, so a leader with several chunks in flight goes back there); the
 * bytes of one snapshot at most are kept; the log and the state machine
 * are given up only once the whole snapshot arrived. */
int ida__raft_handle_install_snapshot(struct ida_raft *r,
                                      const struct ida_raft_msg *m)
{
    const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
    if (is->last_index <= r->commit) {
        /* We already hold (and match) everything it covers, but perhaps
         * only in memory (a snapshot installed a moment ago, a commit index
         * learned before its entries were persisted): "done" may only leave
         * once that is durable, or a crash makes the leader believe we hold
         * what we lost and it never sends it again. */
        snapshot_reply(r, m, 0, true, true, true);
        return 0;
    }
    if (r->rcv_checking) {
        /* The bytes are the checker's until its verdict: a chunk of that
         * snapshot is answered "all held, not installed yet"; one of
         * another is refused (its sender starts over later). */
        bool same =
            r->rcv_index == is->last_index && r->rcv_term == is->last_term &&
            r->rcv_total == is->total_size && r->term == r->rcv_check_term;
        snapshot_reply(r, m, same ? r->rcv_len : 0, same, false, false);
        return 0;
    }
    if (is->offset == 0 &&
        (r->rcv_len == 0 || r->rcv_index != is->last_index ||
         r->rcv_term != is->last_term || r->rcv_total != is->total_size)) {
        /* The first chunk of another snapshot (or of the one in progress
         * when nothing of it arrived yet): start over. A first chunk of
         * the one in progress is a chunk we hold, answered below. */
        if (is->config_len > 0) {
            struct ida_raft_conf c;
            int rv =
                ida__raft_conf_decode(&r->cfg, is->config, is->config_len, &c);
            if (rv != 0) {
                return rv;
            }
        }
        uint8_t *conf;
        int rv = ida__raft_copy_data(is->config, is->config_len, &conf);
        if (rv != 0) {
            return rv;
        }
        ida_free(r->rcv_conf);
        r->rcv_conf = conf;
        r->rcv_conf_len = is->config_len;
        r->rcv_index = is->last_index;
        r->rcv_term = is->last_term;
        r->rcv_total = is->total_size;
        r->rcv_len = 0;
    }
    if (r->rcv_index != is->last_index || r->rcv_term != is->last_term ||
        is->offset != r->rcv_len) {
        /* Another snapshot, a gap or a chunk we hold (chunks are taken in
         * order only): refused, and the leader told where we are. */
        bool same =
            r->rcv_index == is->last_index && r->rcv_term == is->last_term;
        snapshot_reply(r, m, same ? r->rcv_len : 0, false, false, false);
        return 0;
    }
    if (is->total_size != r->rcv_total) {
        /* One leader sends one snapshot per index, of one size. */
        return IDA_EPROTO;
    }
    int rv = rcv_reserve(r, r->rcv_len + is->len);
    if (rv != 0) {
        return rv;
    }
    if (is->len > 0) {
        memcpy(r->rcv_data + r->rcv_len, is->data, is->len);
    }
    r->rcv_len += is->len;
    if (!is->done) {
        snapshot_reply(r, m, r->rcv_len, true, false, false);
        return 0;
    }
    IDA_ASSERT(r->rcv_len == r->rcv_total); /* done: offset + len == total */
    size_t len = r->rcv_len;
    int verdict =
        r->cfg.snapshot_check != NULL
            ? r->cfg.snapshot_check(r->cfg.snapshot_check_arg, r->rcv_index,
                                    r->rcv_term, r->rcv_data, len)
            : 0;
    if (verdict == IDA_RAFT_CHECK_PENDING) {
        /* Checked outside: ida_raft_snapshot_checked() goes on. */
        r->rcv_checking = true;
        r->rcv_from = m->from;
        r->rcv_check_term = r->term;
        snapshot_reply(r, m, len, true, false, false);
        return 0;
    }
    if (verdict != 0) {
        /* Nothing was given up: forget what arrived, keep the log. */
        rcv_forget(r);
        snapshot_reply(r, m, 0, false, false, false);
        return IDA_EPROTO;
    }
    install_snapshot(r);
    /* The config was validated at offset 0: only allocation can fail; the
     * snapshot stands and the membership is recomputed at the next change
     * or restart. */
    (void)ida__raft_conf_refresh(r);
    snapshot_reply(r, m, len, true, true, true);
    return 0;
}

int ida_raft_snapshot_checked(struct ida_raft *r,
                              ida_index index,
                              ida_term term,
                              int verdict)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    if (!r->rcv_checking || r->rcv_index != index || r->rcv_term != term) {
        return IDA_EINVAL;
    }
    ida_node_id from = r->rcv_from;
    if (r->term != r->rcv_check_term || r->role != IDA_RAFT_FOLLOWER ||
        index <= r->commit || r->rollback.kind != IDA_RAFT_ROLLBACK_NONE) {
        /* Another term (another leader, or an election: a log this node
         * may have grown since must not be cut under it), held already, or
         * told its state went back (rule A4: it steps and sends nothing
         * more): nothing to install. The leader of the day sends again. */
        rcv_forget(r);
        return IDA_RAFT_CHECK_STALE;
    }
    int rv = 0;
    if (verdict != 0) {
        rcv_forget(r);
        snapshot_reply_to(r, from, index, 0, false, false, false);
        rv = IDA_EPROTO;
    } else {
        size_t len = r->rcv_len;
        install_snapshot(r);
        (void)ida__raft_conf_refresh(r); /* as in the receiver above */
        snapshot_reply_to(r, from, index, len, true, true, true);
    }
    ida__raft_check_invariants(r);
    return rv;
}

void ida_raft_snapshot_stored(struct ida_raft *r, ida_index index)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    if (index == r->snap_index && !r->snap_unsent) {
        ida_free(r->snap_data);
        r->snap_data = NULL;
    }
}

uint8_t *ida_raft_snapshot_take(struct ida_raft *r, ida_index index)
{
    IDA_ASSERT(r != NULL);
    /* No ida__raft_begin(): the batch being handled stays valid. */
    if (index != r->snap_index || r->snap_unsent || r->snap_data == NULL) {
        return NULL;
    }
    uint8_t *d = r->snap_data;
    r->snap_data = NULL;
    return d;
}

/* The last config entry in (snapshot index, @index], NULL if none. */
static const struct ida_entry *config_entry_upto(const struct ida_raft *r,
                                                 ida_index index)
{
    for (ida_index i = index; i > r->snap_index; i--) {
        const struct ida_entry *e = ida__raft_entry_at(r, i);
        if (e->type == IDA_ENTRY_CONFIG) {
            return e;
        }
    }
    return NULL;
}

int ida_raft_config_at(const struct ida_raft *r,
                       ida_index index,
                       const uint8_t **conf,
                       size_t *len)
{
    IDA_ASSERT(r != NULL && conf != NULL && len != NULL);
    *conf = NULL;
    *len = 0;
    if (index > r->applied || index <= r->snap_index) {
        return IDA_EINVAL;
    }
    const struct ida_entry *ce = config_entry_upto(r, index);
    *conf = ce != NULL ? ce->data : r->snap_conf;
    *len = ce != NULL ? ce->len : r->snap_conf_len;
    return 0;
}

int ida_raft_compact(struct ida_raft *r,
                     ida_index index,
                     const uint8_t *data,
                     size_t len)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    if (index > r->applied || index <= r->snap_index) {
        return IDA_EINVAL;
    }
    uint8_t *d = NULL; /* NULL with len > 0: the application keeps it */
    int rv = data != NULL ? ida__raft_copy_data(data, len, &d) : 0;
    if (rv != 0) {
        return rv;
    }
    /* The snapshot keeps the config in effect at @index. */
    const struct ida_entry *ce = config_entry_upto(r, index);
    uint8_t *conf = NULL;
    if (ce != NULL) {
        rv = ida__raft_copy_data(ce->data, ce->len, &conf);
        if (rv != 0) {
            ida_free(d);
            return rv;
        }
        ida_free(r->snap_conf);
        r->snap_conf = conf;
        r->snap_conf_len = ce->len;
    }
    ida_term t = ida__raft_term_at(r, index);
    IDA_ASSERT(t != 0);
    ida__raft_log_compact(r, index, t);
    if (r->conf_index <= index) {
        r->conf_index = 0; /* now the snapshot's config */
    }
    ida_free(r->snap_data);
    r->snap_data = d;
    r->snap_len = len;
    ida__raft_check_invariants(r);
    return 0;
}
