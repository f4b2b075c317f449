/* The Raft core. DESIGN and contracts: raft/raft.h.
 *
 * Layout of this file: helpers (log, output queues), role changes,
 * replication (leader), message handlers, then the public calls. Rules from
 * the paper are quoted where they are implemented ("Figure 2" is the Raft
 * paper's summary figure; "§" numbers are the Raft dissertation's).
 */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

/* --- helpers ------------------------------------------------------------ */

static ida_index last_index(const struct ida_raft *r)
{
    return r->snap_index + r->n_log;
}

static ida_term term_at(const struct ida_raft *r, ida_index i)
{
    if (i == r->snap_index) {
        return r->snap_term;
    }
    if (i < r->snap_index || i > last_index(r)) {
        return 0;
    }
    return r->log[i - r->snap_index - 1].term;
}

static ida_term last_term(const struct ida_raft *r)
{
    return term_at(r, last_index(r));
}

static struct ida_entry *entry_at(const struct ida_raft *r, ida_index i)
{
    IDA_ASSERT(i > r->snap_index);
    IDA_ASSERT(i <= last_index(r));
    return &r->log[i - r->snap_index - 1];
}

static int voter_slot(const struct ida_raft *r, ida_node_id id)
{
    return ida_raft_conf_slot(&r->conf, id);
}

/* Members: voters, then learners; prs[] is indexed the same way. */
static size_t n_members(const struct ida_raft *r)
{
    return r->conf.n + r->conf.n_learners;
}

static ida_node_id member_id(const struct ida_raft *r, size_t i)
{
    return i < r->conf.n ? r->conf.voters[i] : r->conf.learners[i - r->conf.n];
}

static int member_slot(const struct ida_raft_conf *c, ida_node_id id)
{
    int s = ida_raft_conf_slot(c, id);
    if (s >= 0) {
        return s;
    }
    s = ida_raft_conf_learner_slot(c, id);
    return s < 0 ? -1 : (int)c->n + s;
}

static size_t quorum(const struct ida_raft *r)
{
    return r->conf.n / 2 + 1;
}

static uint64_t rng_next(struct ida_raft *r)
{
    /* xorshift64*: deterministic, seeded by the config. */
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 0x2545F4914F6CDD1DULL;
}

static void randomize_timeout(struct ida_raft *r)
{
    /* §3.4: election timeouts chosen randomly from [T, 2T). */
    r->randomized_timeout =
        r->cfg.election_ticks + (unsigned)(rng_next(r) % r->cfg.election_ticks);
}

static int log_reserve(struct ida_raft *r, size_t extra)
{
    if (r->n_log + extra <= r->cap_log) {
        return 0;
    }
    size_t cap = r->cap_log ? r->cap_log : 64;
    while (cap < r->n_log + extra) {
        cap *= 2;
    }
    struct ida_entry *log = ida_realloc(r->log, cap * sizeof(*log));
    if (log == NULL) {
        return IDA_ENOMEM;
    }
    r->log = log;
    r->cap_log = cap;
    return 0;
}

static int copy_data(const uint8_t *data, size_t len, uint8_t **out)
{
    *out = NULL;
    if (len == 0) {
        return 0;
    }
    *out = ida_malloc(len);
    if (*out == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(*out, data, len);
    return 0;
}

/* Append one entry whose data is already owned by the core; capacity must
 * have been reserved. */
static void log_push(struct ida_raft *r,
                     ida_term term,
                     enum ida_entry_type type,
                     uint8_t *data,
                     size_t len)
{
    IDA_ASSERT(r->n_log < r->cap_log);
    IDA_ASSERT(term >= last_term(r));
    struct ida_entry *e = &r->log[r->n_log++];
    e->term = term;
    e->index = last_index(r);
    e->type = type;
    e->data = data;
    e->len = len;
}

/* Drop entries >= @from from memory. Everything that referred to them as
 * "durable" or "handed out" is pulled back. */
static void log_truncate(struct ida_raft *r, ida_index from)
{
    IDA_ASSERT(from > r->snap_index);
    IDA_ASSERT(from > r->commit);
    for (ida_index i = from; i <= last_index(r); i++) {
        ida_free(entry_at(r, i)->data);
    }
    r->n_log = from - r->snap_index - 1;
    if (r->unsent > from) {
        r->unsent = from;
    }
    if (r->stable >= from) {
        r->stable = from - 1;
    }
    for (unsigned k = 0; k < r->pending_count; k++) {
        unsigned p = (r->pending_head + k) % IDA_RAFT_PENDING_MAX;
        if (r->pending[p].last >= from) {
            r->pending[p].last = from - 1;
        }
    }
}

/* Drop entries <= @upto (they are inside the snapshot). */
static void log_compact(struct ida_raft *r, ida_index upto, ida_term term)
{
    IDA_ASSERT(upto > r->snap_index);
    ida_index keep_from = upto + 1;
    if (upto > last_index(r)) {
        for (size_t i = 0; i < r->n_log; i++) {
            ida_free(r->log[i].data);
        }
        r->n_log = 0;
    } else {
        size_t drop = (size_t)(upto - r->snap_index);
        for (size_t i = 0; i < drop; i++) {
            ida_free(r->log[i].data);
        }
        if (drop < r->n_log) {
            memmove(r->log, r->log + drop, (r->n_log - drop) * sizeof(*r->log));
        }
        r->n_log -= drop;
    }
    r->snap_index = upto;
    r->snap_term = term;
    if (r->unsent < keep_from) {
        r->unsent = keep_from;
    }
}

/* --- output queues ------------------------------------------------------ */

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

static void send_now(struct ida_raft *r, struct ida_raft_msg *m)
{
    m->from = r->cfg.id;
    queue_msg(&r->msgs, &r->n_msgs, &r->cap_msgs, m);
}

/* Messages that depend on this node's durable state (votes, acks). */
static void send_after_persist(struct ida_raft *r, struct ida_raft_msg *m)
{
    if (r->cfg.bugs & IDA_RAFT_BUG_ACK_BEFORE_PERSIST) {
        send_now(r, m);
        return;
    }
    m->from = r->cfg.id;
    queue_msg(&r->msgs_ap, &r->n_msgs_ap, &r->cap_msgs_ap, m);
}

static void msg_init(struct ida_raft_msg *m,
                     enum ida_raft_msg_type type,
                     ida_node_id to,
                     ida_term term)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->to = to;
    m->term = term;
}

/* --- membership ---------------------------------------------------------- */

/* Make @c the membership in effect (from the entry at @index, 0: from the
 * snapshot or bootstrap). Progress of voters that stay is kept. */
static void conf_apply(struct ida_raft *r,
                       const struct ida_raft_conf *c,
                       ida_index index)
{
    struct ida_raft_progress old[2 * IDA_RAFT_NODES_MAX];
    struct ida_raft_conf old_conf = r->conf;
    memcpy(old, r->prs, sizeof(old));
    r->conf = *c;
    r->conf_index = index;
    for (size_t i = 0; i < n_members(r); i++) {
        int k = member_slot(&old_conf, member_id(r, i));
        if (k >= 0) {
            r->prs[i] = old[k];
            continue;
        }
        struct ida_raft_progress *pr = &r->prs[i];
        memset(pr, 0, sizeof(*pr));
        pr->id = member_id(r, i);
        pr->next = r->snap_index + r->n_log + 1;
        pr->state = IDA_RAFT_PROBE;
        pr->recent_active = true;
    }
    memset(r->votes, 0, sizeof(r->votes));
    memset(r->voted, 0, sizeof(r->voted));
}

static void conf_bootstrap(const struct ida_raft *r, struct ida_raft_conf *c)
{
    memset(c, 0, sizeof(*c));
    memcpy(c->voters, r->cfg.voters, sizeof(c->voters));
    c->n = r->cfg.n_voters;
}

/* Recompute the membership in effect: the latest config entry of the log,
 * else the snapshot's config, else bootstrap. Entries were validated when
 * they entered the log, so decoding fails only on allocation. */
static int conf_refresh(struct ida_raft *r)
{
    struct ida_raft_conf c;
    for (ida_index i = r->snap_index + r->n_log; i > r->snap_index; i--) {
        const struct ida_entry *e = &r->log[i - r->snap_index - 1];
        if (e->type == IDA_ENTRY_CONFIG) {
            int rv = ida_raft_conf_decode(e->data, e->len, &c);
            if (rv != 0) {
                return rv;
            }
            conf_apply(r, &c, i);
            return 0;
        }
    }
    if (r->snap_conf_len > 0) {
        int rv = ida_raft_conf_decode(r->snap_conf, r->snap_conf_len, &c);
        if (rv != 0) {
            return rv;
        }
    } else {
        conf_bootstrap(r, &c);
    }
    conf_apply(r, &c, 0);
    return 0;
}

/* --- role changes ------------------------------------------------------- */

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
    randomize_timeout(r);
    memset(r->votes, 0, sizeof(r->votes));
    memset(r->voted, 0, sizeof(r->voted));
    r->transferee = 0;
    r->n_reads_pending = 0;
    r->broadcast = false;
}

static void become_follower(struct ida_raft *r, ida_term term, ida_node_id lead)
{
    reset(r, term);
    r->role = IDA_RAFT_FOLLOWER;
    r->leader = lead;
}

static void become_leader(struct ida_raft *r)
{
    IDA_ASSERT(r->role == IDA_RAFT_CANDIDATE);
    reset(r, r->term);
    r->role = IDA_RAFT_LEADER;
    r->leader = r->cfg.id;
    for (size_t i = 0; i < n_members(r); i++) {
        struct ida_raft_progress *pr = &r->prs[i];
        memset(pr, 0, sizeof(*pr));
        pr->id = member_id(r, i);
        pr->next = last_index(r) + 1;
        pr->state = IDA_RAFT_PROBE;
        pr->recent_active = true;
    }
    /* §6.4: a leader commits a blank no-op entry at the start of its term,
     * which also commits everything before it (Figure 8). If the log cannot
     * grow the no-op is missing; the leader then cannot commit, check-quorum
     * or the next election recovers. */
    if (log_reserve(r, 1) == 0) {
        log_push(r, r->term, IDA_ENTRY_NOOP, NULL, 0);
    }
    r->broadcast = true;
}

static bool record_vote(struct ida_raft *r,
                        ida_node_id from,
                        bool granted,
                        size_t *yes,
                        size_t *no)
{
    int s = voter_slot(r, from);
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

static void campaign(struct ida_raft *r, bool pre, bool transfer)
{
    ida_term vote_term;
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
    if (yes >= quorum(r)) {
        if (pre) {
            campaign(r, false, transfer);
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
        msg_init(&m, IDA_RAFT_MSG_REQUEST_VOTE, r->conf.voters[i], vote_term);
        m.u.request_vote.pre_vote = pre;
        m.u.request_vote.last_log_index = last_index(r);
        m.u.request_vote.last_log_term = last_term(r);
        m.u.request_vote.transfer = transfer;
        if (pre) {
            send_now(r, &m); /* nothing of ours to persist */
        } else {
            /* Our term and self-vote must be durable first, or a crash
             * could let us vote for another candidate in this term. */
            send_after_persist(r, &m);
        }
    }
}

/* --- replication (leader) ----------------------------------------------- */

static struct ida_raft_progress *progress_of(struct ida_raft *r, ida_node_id id)
{
    int s = member_slot(&r->conf, id);
    return s < 0 ? NULL : &r->prs[s];
}

static void become_probe(struct ida_raft_progress *pr)
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

static void send_snapshot_chunk(struct ida_raft *r,
                                struct ida_raft_progress *pr)
{
    if (pr->snap_sent) {
        return;
    }
    if (pr->snap_index != r->snap_index) {
        /* A newer snapshot replaced the one being sent: start over. */
        pr->snap_index = r->snap_index;
        pr->snap_offset = 0;
    }
    uint64_t left = r->snap_len - pr->snap_offset;
    size_t len = left < r->cfg.snapshot_chunk_bytes
                     ? (size_t)left
                     : r->cfg.snapshot_chunk_bytes;
    struct ida_raft_msg m;
    msg_init(&m, IDA_RAFT_MSG_INSTALL_SNAPSHOT, pr->id, r->term);
    m.u.install_snapshot.last_index = r->snap_index;
    m.u.install_snapshot.last_term = r->snap_term;
    m.u.install_snapshot.offset = pr->snap_offset;
    m.u.install_snapshot.len = len;
    m.u.install_snapshot.done = pr->snap_offset + len == r->snap_len;
    m.u.install_snapshot.total_size = r->snap_len;
    send_now(r, &m);
    pr->snap_sent = true;
}

static void start_snapshot(struct ida_raft *r, struct ida_raft_progress *pr)
{
    pr->state = IDA_RAFT_SNAPSHOT;
    pr->snap_index = r->snap_index;
    pr->snap_offset = 0;
    pr->snap_sent = false;
    send_snapshot_chunk(r, pr);
}

/* Send the entries from pr->next (Figure 2 AppendEntries), within the flow
 * control of the peer's progress state. */
static void send_append(struct ida_raft *r,
                        struct ida_raft_progress *pr,
                        bool allow_empty)
{
    if (pr->id == r->cfg.id) {
        return;
    }
    if (pr->state == IDA_RAFT_SNAPSHOT) {
        send_snapshot_chunk(r, pr);
        return;
    }
    if (pr->state == IDA_RAFT_PROBE && pr->probe_sent) {
        return;
    }
    if (pr->state == IDA_RAFT_REPLICATE &&
        pr->inflight_count >= r->cfg.max_inflight) {
        return;
    }
    ida_index prev = pr->next - 1;
    if (prev < r->snap_index) {
        /* The entries the peer needs were compacted: InstallSnapshot. */
        start_snapshot(r, pr);
        return;
    }
    ida_index avail = last_index(r) - prev;
    size_t n =
        avail < r->cfg.max_msg_entries ? (size_t)avail : r->cfg.max_msg_entries;
    if (n == 0 && !allow_empty) {
        return;
    }
    struct ida_raft_msg m;
    msg_init(&m, IDA_RAFT_MSG_APPEND_ENTRIES, pr->id, r->term);
    m.u.append_entries.prev_log_index = prev;
    m.u.append_entries.prev_log_term = term_at(r, prev);
    m.u.append_entries.n_entries = n;
    m.u.append_entries.commit_index = r->commit;
    m.u.append_entries.read_ctx = r->read_seq;
    m.ents_first_ = prev + 1;
    m.ents_last_term_ = n ? term_at(r, prev + n) : 0;
    send_now(r, &m);
    if (pr->state == IDA_RAFT_PROBE) {
        pr->probe_sent = true;
    } else if (n > 0) {
        unsigned slot =
            (pr->inflight_head + pr->inflight_count) % IDA_RAFT_INFLIGHT_MAX;
        pr->inflight[slot] = prev + n;
        pr->inflight_count++;
        pr->next = prev + n + 1;
        /* Replicate mode pipelines: keep sending up to the in-flight
         * bound. */
        send_append(r, pr, false);
    }
}

/* A heartbeat: an empty AppendEntries at the peer's match index, which the
 * peer is known to hold, carrying the commit index it can use. */
static void send_heartbeat(struct ida_raft *r, struct ida_raft_progress *pr)
{
    if (pr->id == r->cfg.id) {
        return;
    }
    if (pr->match < r->snap_index) {
        pr->probe_sent = false;
        send_append(r, pr, true);
        return;
    }
    struct ida_raft_msg m;
    msg_init(&m, IDA_RAFT_MSG_APPEND_ENTRIES, pr->id, r->term);
    m.u.append_entries.prev_log_index = pr->match;
    m.u.append_entries.prev_log_term = term_at(r, pr->match);
    m.u.append_entries.commit_index =
        r->commit < pr->match ? r->commit : pr->match;
    m.u.append_entries.read_ctx = r->read_seq;
    send_now(r, &m);
}

static void broadcast_append(struct ida_raft *r, bool allow_empty)
{
    for (size_t i = 0; i < n_members(r); i++) {
        struct ida_raft_progress *pr = &r->prs[i];
        if (allow_empty && pr->state == IDA_RAFT_REPLICATE &&
            pr->next > last_index(r)) {
            send_heartbeat(r, pr); /* nothing new: just the commit index */
        } else {
            send_append(r, pr, allow_empty);
        }
    }
}

static void tick_heartbeat_peer(struct ida_raft *r,
                                struct ida_raft_progress *pr)
{
    switch (pr->state) {
        case IDA_RAFT_PROBE:
            pr->probe_sent = false; /* the probe may be lost: probe again */
            send_append(r, pr, true);
            break;
        case IDA_RAFT_REPLICATE:
            if (pr->inflight_count > 0 && !pr->acked) {
                /* No progress over a heartbeat interval: appends were lost. */
                become_probe(pr);
                send_append(r, pr, true);
            } else {
                send_heartbeat(r, pr);
            }
            pr->acked = false;
            break;
        case IDA_RAFT_SNAPSHOT:
            pr->snap_sent = false; /* resend the chunk, it may be lost */
            send_snapshot_chunk(r, pr);
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
static bool maybe_commit(struct ida_raft *r)
{
    ida_index m[IDA_RAFT_NODES_MAX];
    for (size_t i = 0; i < r->conf.n; i++) {
        m[i] = r->conf.voters[i] == r->cfg.id ? r->stable : r->prs[i].match;
    }
    sort_desc(m, r->conf.n);
    ida_index n = m[quorum(r) - 1];
    if (n <= r->commit) {
        return false;
    }
    bool old_ok = (r->cfg.bugs & IDA_RAFT_BUG_COMMIT_OLD_TERM) != 0;
    if (term_at(r, n) != r->term && !old_ok) {
        return false;
    }
    IDA_ASSERT(n <= last_index(r));
    r->commit = n;
    return true;
}

static void check_reads(struct ida_raft *r)
{
    size_t done = 0;
    while (done < r->n_reads_pending) {
        uint64_t seq = r->reads_pending[done].seq;
        size_t acks = 0;
        for (size_t i = 0; i < r->conf.n; i++) {
            if (r->conf.voters[i] == r->cfg.id || r->prs[i].read_ack >= seq) {
                acks++;
            }
        }
        if (acks < quorum(r)) {
            break;
        }
        struct ida_raft_read rd = {.ctx = r->reads_pending[done].ctx,
                                   .index = r->reads_pending[done].index};
        if (r->n_reads_ready == r->cap_reads_ready) {
            size_t c = r->cap_reads_ready ? r->cap_reads_ready * 2 : 16;
            struct ida_raft_read *a =
                ida_realloc(r->reads_ready, c * sizeof(*a));
            if (a == NULL) {
                break; /* retried at the next acknowledgement */
            }
            r->reads_ready = a;
            r->cap_reads_ready = c;
        }
        r->reads_ready[r->n_reads_ready++] = rd;
        done++;
    }
    if (done > 0) {
        memmove(r->reads_pending, r->reads_pending + done,
                (r->n_reads_pending - done) * sizeof(*r->reads_pending));
        r->n_reads_pending -= done;
    }
}

static void send_timeout_now(struct ida_raft *r, ida_node_id to)
{
    struct ida_raft_msg m;
    msg_init(&m, IDA_RAFT_MSG_TIMEOUT_NOW, to, r->term);
    send_now(r, &m);
}

/* --- handlers: leader --------------------------------------------------- */

static void handle_append_response(struct ida_raft *r,
                                   const struct ida_raft_msg *m)
{
    struct ida_raft_progress *pr = progress_of(r, m->from);
    const struct ida_raft_append_response *ar = &m->u.append_response;
    if (pr == NULL) {
        return; /* not (or no longer) a member */
    }
    pr->recent_active = true;
    if (ar->read_ctx > pr->read_ack && ar->read_ctx <= r->read_seq) {
        pr->read_ack = ar->read_ctx;
        check_reads(r);
    }
    if (ar->success) {
        if (ar->match_index > last_index(r)) {
            return; /* impossible from a correct peer: ignore */
        }
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
            if (maybe_commit(r)) {
                broadcast_append(r, true);
            }
            if (r->transferee == pr->id && pr->match == last_index(r)) {
                send_timeout_now(r, pr->id);
            }
        } else if (pr->state == IDA_RAFT_PROBE) {
            pr->probe_sent = false;
        }
        send_append(r, pr, false);
        return;
    }
    /* Rejected. Ignore answers to appends the progress no longer expects
     * (reordered or duplicated messages). */
    if (ar->reject_index <= pr->match) {
        return;
    }
    if (pr->state == IDA_RAFT_PROBE && ar->reject_index != pr->next - 1) {
        return;
    }
    if (pr->state == IDA_RAFT_SNAPSHOT) {
        return;
    }
    /* Fast backtracking (§5.3): skip a whole conflicting term at once. */
    ida_index next = ar->conflict_index;
    if (ar->conflict_term != 0) {
        ida_index i =
            ar->reject_index < last_index(r) ? ar->reject_index : last_index(r);
        while (i > r->snap_index && term_at(r, i) > ar->conflict_term) {
            i--;
        }
        if (i > r->snap_index && term_at(r, i) == ar->conflict_term) {
            next = i + 1;
        }
    }
    if (next > ar->reject_index) {
        next = ar->reject_index;
    }
    if (next < pr->match + 1) {
        next = pr->match + 1;
    }
    become_probe(pr);
    pr->next = next;
    send_append(r, pr, true);
}

static void handle_snapshot_response(struct ida_raft *r,
                                     const struct ida_raft_msg *m)
{
    struct ida_raft_progress *pr = progress_of(r, m->from);
    const struct ida_raft_snapshot_response *sr = &m->u.snapshot_response;
    if (pr == NULL) {
        return;
    }
    pr->recent_active = true;
    if (pr->state != IDA_RAFT_SNAPSHOT || sr->last_index != pr->snap_index) {
        return;
    }
    if (sr->done && sr->success) {
        if (pr->snap_index > pr->match) {
            pr->match = pr->snap_index;
        }
        become_probe(pr);
        if (maybe_commit(r)) {
            broadcast_append(r, true);
        }
        send_append(r, pr, true);
        return;
    }
    pr->snap_sent = false;
    pr->snap_offset =
        sr->success && sr->next_offset <= r->snap_len ? sr->next_offset : 0;
    send_snapshot_chunk(r, pr);
}

/* --- handlers: everyone ------------------------------------------------- */

static void handle_request_vote(struct ida_raft *r,
                                const struct ida_raft_msg *m)
{
    const struct ida_raft_request_vote *rv = &m->u.request_vote;
    bool can_vote = r->vote == m->from || (r->vote == 0 && r->leader == 0) ||
                    (rv->pre_vote && m->term > r->term);
    /* §5.4.1: grant only if the candidate's log is at least as up to date
     * as ours: later last term, or same last term and at least as long. */
    bool up_to_date = rv->last_log_term > last_term(r) ||
                      (rv->last_log_term == last_term(r) &&
                       rv->last_log_index >= last_index(r));
    if (r->cfg.bugs & IDA_RAFT_BUG_VOTE_NO_LOG_CHECK) {
        up_to_date = true;
    }
    bool grant = can_vote && up_to_date;
    struct ida_raft_msg resp;
    msg_init(&resp, IDA_RAFT_MSG_RESPONSE_VOTE, m->from,
             grant ? m->term : r->term);
    resp.u.response_vote.pre_vote = rv->pre_vote;
    resp.u.response_vote.granted = grant;
    if (rv->pre_vote) {
        send_now(r, &resp); /* changes nothing of ours */
        return;
    }
    if (grant) {
        r->vote = m->from;
        r->election_elapsed = 0;
    }
    send_after_persist(r, &resp);
}

static void reject_append(struct ida_raft *r,
                          const struct ida_raft_msg *m,
                          ida_index conflict_index,
                          ida_term conflict_term)
{
    struct ida_raft_msg resp;
    msg_init(&resp, IDA_RAFT_MSG_APPEND_RESPONSE, m->from, r->term);
    resp.u.append_response.success = false;
    resp.u.append_response.reject_index = m->u.append_entries.prev_log_index;
    resp.u.append_response.conflict_index = conflict_index;
    resp.u.append_response.conflict_term = conflict_term;
    resp.u.append_response.read_ctx = m->u.append_entries.read_ctx;
    send_now(r, &resp); /* a rejection claims nothing about our log */
}

static void accept_append(struct ida_raft *r,
                          const struct ida_raft_msg *m,
                          ida_index match)
{
    struct ida_raft_msg resp;
    msg_init(&resp, IDA_RAFT_MSG_APPEND_RESPONSE, m->from, r->term);
    resp.u.append_response.success = true;
    resp.u.append_response.match_index = match;
    resp.u.append_response.read_ctx = m->u.append_entries.read_ctx;
    /* The leader counts this as a durable replica: persist first. */
    send_after_persist(r, &resp);
}

/* Figure 2 AppendEntries receiver, steps 2-5. */
static int handle_append(struct ida_raft *r, const struct ida_raft_msg *m)
{
    const struct ida_raft_append_entries *ae = &m->u.append_entries;
    ida_index prev = ae->prev_log_index;
    if (prev < r->commit) {
        /* Everything up to our commit index matches every leader's log. */
        accept_append(r, m, r->commit);
        return 0;
    }
    if (prev > last_index(r)) {
        reject_append(r, m, last_index(r) + 1, 0);
        return 0;
    }
    ida_term t = term_at(r, prev);
    if (t != ae->prev_log_term) {
        /* Hint: the first index of the conflicting term. */
        ida_index first = prev;
        while (first - 1 > r->snap_index && term_at(r, first - 1) == t) {
            first--;
        }
        reject_append(r, m, first, t);
        return 0;
    }
    /* Validate first: consecutive indexes, terms never decreasing and
     * never above the sender's term. */
    ida_term prev_t = ae->prev_log_term;
    for (size_t j = 0; j < ae->n_entries; j++) {
        const struct ida_entry *e = &ae->entries[j];
        if (e->index != prev + 1 + j || e->term < prev_t || e->term > m->term ||
            (e->len > 0 && e->data == NULL)) {
            return IDA_EPROTO;
        }
        if (e->type == IDA_ENTRY_CONFIG) {
            struct ida_raft_conf c;
            int rv = ida_raft_conf_decode(e->data, e->len, &c);
            if (rv != 0) {
                return rv;
            }
        }
        prev_t = e->term;
    }
    /* Find the first new or conflicting entry. */
    size_t k = 0;
    while (k < ae->n_entries && prev + 1 + k <= last_index(r) &&
           term_at(r, prev + 1 + k) == ae->entries[k].term) {
        k++;
    }
    if (k < ae->n_entries) {
        ida_index idx = prev + 1 + k;
        if (idx <= r->commit) {
            return IDA_EPROTO; /* a leader contradicts a committed entry */
        }
        int rv = log_reserve(r, ae->n_entries - k);
        if (rv != 0) {
            return rv;
        }
        bool conf_changed = false;
        if (idx <= last_index(r)) {
            /* Figure 2 step 3: "If an existing entry conflicts with a new
             * one (same index but different terms), delete the existing
             * entry and all that follow it". */
            conf_changed = idx <= r->conf_index;
            log_truncate(r, idx);
        }
        /* Step 4: append any new entries not already in the log. */
        for (; k < ae->n_entries && rv == 0; k++) {
            const struct ida_entry *e = &ae->entries[k];
            uint8_t *d;
            rv = copy_data(e->data, e->len, &d);
            if (rv == 0) {
                log_push(r, e->term, e->type, d, e->len);
                conf_changed |= e->type == IDA_ENTRY_CONFIG;
            }
        }
        /* §4.1: a server uses the latest configuration in its log, whether
         * or not it is committed. */
        if (conf_changed) {
            int crv = conf_refresh(r);
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

static void snapshot_reply(struct ida_raft *r,
                           const struct ida_raft_msg *m,
                           uint64_t next_offset,
                           bool done,
                           bool after_persist)
{
    struct ida_raft_msg resp;
    msg_init(&resp, IDA_RAFT_MSG_SNAPSHOT_RESPONSE, m->from, r->term);
    resp.u.snapshot_response.last_index = m->u.install_snapshot.last_index;
    resp.u.snapshot_response.next_offset = next_offset;
    resp.u.snapshot_response.done = done;
    resp.u.snapshot_response.success = true;
    if (after_persist) {
        send_after_persist(r, &resp);
    } else {
        send_now(r, &resp);
    }
}

static void install_snapshot(struct ida_raft *r)
{
    ida_index s = r->rcv_index;
    ida_term t = r->rcv_term;
    if (s <= last_index(r) && term_at(r, s) == t) {
        /* §5: "If existing log entry has same index and term as snapshot's
         * last included entry, retain log entries following it". */
        log_compact(r, s, t);
    } else {
        /* The whole log is older or conflicting: drop it. */
        for (size_t i = 0; i < r->n_log; i++) {
            ida_free(r->log[i].data);
        }
        r->n_log = 0;
        log_compact(r, s, t);
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
    r->rcv_data = NULL;
    r->rcv_len = r->rcv_cap = 0;
    r->rcv_index = 0;
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

static int handle_install_snapshot(struct ida_raft *r,
                                   const struct ida_raft_msg *m)
{
    const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
    if (is->last_index <= r->commit) {
        /* We already hold (and match) everything it covers. */
        snapshot_reply(r, m, 0, true, false);
        return 0;
    }
    if (is->offset == 0) {
        if (is->total_size > SIZE_MAX / 2) {
            return IDA_EPROTO;
        }
        if (r->rcv_cap < is->total_size || r->rcv_data == NULL) {
            size_t cap = is->total_size ? (size_t)is->total_size : 1;
            uint8_t *d = ida_realloc(r->rcv_data, cap);
            if (d == NULL) {
                return IDA_ENOMEM;
            }
            r->rcv_data = d;
            r->rcv_cap = cap;
        }
        if (is->config_len > 0) {
            struct ida_raft_conf c;
            int rv = ida_raft_conf_decode(is->config, is->config_len, &c);
            if (rv != 0) {
                return rv;
            }
        }
        uint8_t *conf;
        int rv = copy_data(is->config, is->config_len, &conf);
        if (rv != 0) {
            return rv;
        }
        ida_free(r->rcv_conf);
        r->rcv_conf = conf;
        r->rcv_conf_len = is->config_len;
        r->rcv_index = is->last_index;
        r->rcv_term = is->last_term;
        r->rcv_len = 0;
    }
    if (r->rcv_index != is->last_index || r->rcv_term != is->last_term ||
        is->offset != r->rcv_len) {
        /* Another snapshot or a gap: tell the leader where we are. */
        snapshot_reply(r, m, r->rcv_index == is->last_index ? r->rcv_len : 0,
                       false, false);
        return 0;
    }
    if (r->rcv_len + is->len > r->rcv_cap ||
        r->rcv_len + is->len > is->total_size) {
        return IDA_EPROTO;
    }
    if (is->len > 0) {
        memcpy(r->rcv_data + r->rcv_len, is->data, is->len);
    }
    r->rcv_len += is->len;
    if (!is->done) {
        snapshot_reply(r, m, r->rcv_len, false, false);
        return 0;
    }
    if (r->rcv_len != is->total_size) {
        return IDA_EPROTO;
    }
    size_t len = r->rcv_len;
    install_snapshot(r);
    /* The config was validated at offset 0: only allocation can fail; the
     * snapshot stands and the membership is recomputed at the next change
     * or restart. */
    (void)conf_refresh(r);
    snapshot_reply(r, m, len, true, true);
    return 0;
}

/* Messages with a term lower than ours. */
static void step_stale(struct ida_raft *r, const struct ida_raft_msg *m)
{
    if ((m->type == IDA_RAFT_MSG_APPEND_ENTRIES ||
         m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) &&
        (r->cfg.check_quorum || r->cfg.pre_vote)) {
        /* A leader cut off from us kept its old term while we moved on;
         * with pre-vote it may never hear our higher term otherwise. A
         * follower that fell behind gets only InstallSnapshot chunks, no
         * appends, so those must be answered too (found by the simulator:
         * liveness seeds 103056, 108615, 119693). */
        struct ida_raft_msg resp;
        msg_init(&resp, IDA_RAFT_MSG_APPEND_RESPONSE, m->from, r->term);
        send_now(r, &resp);
    } else if (m->type == IDA_RAFT_MSG_REQUEST_VOTE &&
               m->u.request_vote.pre_vote) {
        struct ida_raft_msg resp;
        msg_init(&resp, IDA_RAFT_MSG_RESPONSE_VOTE, m->from, r->term);
        resp.u.response_vote.pre_vote = true;
        send_now(r, &resp);
    }
}

static void handle_vote_response(struct ida_raft *r,
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
    if (yes >= quorum(r)) {
        if (pre) {
            campaign(r, false, false);
        } else {
            become_leader(r);
        }
    } else if (no >= quorum(r)) {
        become_follower(r, r->term, 0);
    }
}

static bool promotable(const struct ida_raft *r)
{
    return voter_slot(r, r->cfg.id) >= 0;
}

static int step_role(struct ida_raft *r, const struct ida_raft_msg *m)
{
    switch (m->type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            handle_request_vote(r, m);
            return 0;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
            handle_vote_response(r, m);
            return 0;
        case IDA_RAFT_MSG_APPEND_ENTRIES:
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT:
            if (r->role == IDA_RAFT_LEADER) {
                return IDA_EPROTO; /* two leaders in one term */
            }
            if (r->role != IDA_RAFT_FOLLOWER) {
                become_follower(r, r->term, m->from);
            }
            r->leader = m->from;
            r->election_elapsed = 0;
            return m->type == IDA_RAFT_MSG_APPEND_ENTRIES
                       ? handle_append(r, m)
                       : handle_install_snapshot(r, m);
        case IDA_RAFT_MSG_APPEND_RESPONSE:
            if (r->role == IDA_RAFT_LEADER) {
                handle_append_response(r, m);
            }
            return 0;
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE:
            if (r->role == IDA_RAFT_LEADER) {
                handle_snapshot_response(r, m);
            }
            return 0;
        case IDA_RAFT_MSG_TIMEOUT_NOW:
            /* §3.10: the leader asks us to start an election at once. */
            if (r->role == IDA_RAFT_FOLLOWER && promotable(r)) {
                campaign(r, false, true);
            }
            return 0;
    }
    return IDA_EINVAL;
}

/* --- public ------------------------------------------------------------- */

/* §4.2.2: a leader that is not part of the configuration steps down once
 * the entry that removed it has committed. */
static void step_down_if_removed(struct ida_raft *r)
{
    if (r->role == IDA_RAFT_LEADER && voter_slot(r, r->cfg.id) < 0 &&
        r->commit >= r->conf_index) {
        become_follower(r, r->term, 0);
    }
}

/* Outputs handed out by the last ready() are invalid from the next call. */
static void begin(struct ida_raft *r)
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

static int check_config(const struct ida_raft_config *cfg)
{
    if (cfg->id == 0 || cfg->n_voters == 0 ||
        cfg->n_voters > IDA_RAFT_NODES_MAX || cfg->heartbeat_ticks == 0 ||
        cfg->election_ticks < 2 * cfg->heartbeat_ticks ||
        cfg->max_inflight == 0 || cfg->max_inflight > IDA_RAFT_INFLIGHT_MAX ||
        cfg->max_msg_entries == 0 || cfg->snapshot_chunk_bytes == 0) {
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
    (void)cfg;
    if ((st->snapshot_index == 0) != (st->snapshot_term == 0) ||
        (st->snapshot_len > 0 && st->snapshot_data == NULL) ||
        (st->snapshot_config_len > 0 && st->snapshot_config == NULL)) {
        return IDA_EINVAL;
    }
    struct ida_raft_conf c;
    if (st->snapshot_config_len > 0 &&
        ida_raft_conf_decode(st->snapshot_config, st->snapshot_config_len,
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
            ida_raft_conf_decode(e->data, e->len, &c) != 0) {
            return IDA_EINVAL;
        }
        prev_term = e->term;
    }
    return 0;
}

static int restore_state(struct ida_raft *r, const struct ida_raft_restore *st)
{
    int rv = log_reserve(r, st->n_entries);
    if (rv != 0) {
        return rv;
    }
    if (st->snapshot_index > 0) {
        rv = copy_data(st->snapshot_data, st->snapshot_len, &r->snap_data);
        if (rv != 0) {
            return rv;
        }
        r->snap_len = st->snapshot_len;
        r->snap_index = st->snapshot_index;
        r->snap_term = st->snapshot_term;
        rv = copy_data(st->snapshot_config, st->snapshot_config_len,
                       &r->snap_conf);
        if (rv != 0) {
            return rv;
        }
        r->snap_conf_len = st->snapshot_config_len;
    }
    for (size_t i = 0; i < st->n_entries; i++) {
        const struct ida_entry *e = &st->entries[i];
        uint8_t *d;
        rv = copy_data(e->data, e->len, &d);
        if (rv != 0) {
            return rv;
        }
        log_push(r, e->term, e->type, d, e->len);
    }
    r->term = st->hard_state.term;
    r->vote = st->hard_state.vote;
    if (r->cfg.bugs & IDA_RAFT_BUG_FORGET_VOTE) {
        r->vote = 0;
    }
    r->commit = st->hard_state.commit;
    if (r->commit < r->snap_index) {
        r->commit = r->snap_index;
    }
    if (r->commit > last_index(r)) {
        r->commit = last_index(r);
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
        if (rv != 0) {
            ida_raft_close(r);
            return rv;
        }
    }
    rv = conf_refresh(r);
    if (rv != 0) {
        ida_raft_close(r);
        return rv;
    }
    r->applied = r->snap_index;
    r->stable = last_index(r);
    r->unsent = last_index(r) + 1;
    r->hs_out.term = r->term;
    r->hs_out.vote = r->vote;
    r->hs_out.commit = r->commit;
    r->next_batch_id = 1;
    r->role = IDA_RAFT_FOLLOWER;
    randomize_timeout(r);
    return 0;
}

void ida_raft_close(struct ida_raft *r)
{
    for (size_t i = 0; i < r->n_log; i++) {
        ida_free(r->log[i].data);
    }
    ida_free(r->log);
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

static bool quorum_active(struct ida_raft *r)
{
    size_t active = 0;
    for (size_t i = 0; i < r->conf.n; i++) {
        if (r->conf.voters[i] == r->cfg.id || r->prs[i].recent_active) {
            active++;
        }
        r->prs[i].recent_active = false;
    }
    return active >= quorum(r);
}

void ida_raft_tick(struct ida_raft *r)
{
    begin(r);
    if (r->role != IDA_RAFT_LEADER) {
        r->election_elapsed++;
        if (promotable(r) && r->election_elapsed >= r->randomized_timeout) {
            r->election_elapsed = 0;
            campaign(r, r->cfg.pre_vote, false);
        }
        return;
    }
    r->heartbeat_elapsed++;
    r->election_elapsed++;
    if (r->election_elapsed >= r->cfg.election_ticks) {
        r->election_elapsed = 0;
        /* §6.2 check-quorum: a leader that did not hear from a majority
         * within an election timeout steps down. */
        if (r->cfg.check_quorum && !quorum_active(r)) {
            become_follower(r, r->term, 0);
            return;
        }
        r->transferee = 0; /* §3.10: abort a transfer that did not finish */
    }
    if (r->heartbeat_elapsed >= r->cfg.heartbeat_ticks) {
        r->heartbeat_elapsed = 0;
        for (size_t i = 0; i < n_members(r); i++) {
            if (r->prs[i].id != r->cfg.id) {
                tick_heartbeat_peer(r, &r->prs[i]);
            }
        }
    }
}

static bool valid_msg(const struct ida_raft *r, const struct ida_raft_msg *m)
{
    /* Messages from non-members are fine: a new leader's config may not
     * have reached us yet (dissertation §4.1). */
    if (m->to != r->cfg.id || m->from == r->cfg.id || m->from == 0 ||
        m->term == 0) {
        return false;
    }
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
        m->u.append_entries.n_entries > 0 &&
        m->u.append_entries.entries == NULL) {
        return false;
    }
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        (m->u.install_snapshot.last_index == 0 ||
         (m->u.install_snapshot.len > 0 &&
          m->u.install_snapshot.data == NULL))) {
        return false;
    }
    return m->type >= IDA_RAFT_MSG_REQUEST_VOTE &&
           m->type <= IDA_RAFT_MSG_TIMEOUT_NOW;
}

int ida_raft_step(struct ida_raft *r, const struct ida_raft_msg *m)
{
    IDA_ASSERT(r != NULL);
    IDA_ASSERT(m != NULL);
    begin(r);
    if (!valid_msg(r, m)) {
        return IDA_EINVAL;
    }
    bool is_vote = m->type == IDA_RAFT_MSG_REQUEST_VOTE;
    if (m->term > r->term) {
        if (is_vote) {
            /* §4.2.3 / §9.6: while we hear from a leader, ignore vote
             * requests, unless the leader itself asked for this election. */
            bool in_lease = r->cfg.check_quorum && r->leader != 0 &&
                            r->election_elapsed < r->cfg.election_ticks;
            if (in_lease && !m->u.request_vote.transfer) {
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
            become_follower(r, m->term, from_leader ? m->from : 0);
        }
    } else if (m->term < r->term) {
        step_stale(r, m);
        return 0;
    }
    int rv = step_role(r, m);
    step_down_if_removed(r);
    return rv;
}

int ida_raft_propose(struct ida_raft *r,
                     enum ida_entry_type type,
                     const uint8_t *data,
                     size_t len,
                     ida_index *index,
                     ida_term *term)
{
    IDA_ASSERT(r != NULL);
    begin(r);
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
        /* §4.1: one server at a time, one change at a time; and (the fix
         * of the single-server change bug, raft-dev 2015) only after this
         * leader committed an entry of its own term. */
        if (r->conf_index > r->commit || term_at(r, r->commit) != r->term) {
            return IDA_EBUSY;
        }
        int rv = ida_raft_conf_decode(data, len, &c);
        if (rv == IDA_ENOMEM) {
            return rv;
        }
        if (rv != 0 || !ida_raft_conf_one_change(&r->conf, &c)) {
            return IDA_EINVAL;
        }
    }
    int rv = log_reserve(r, 1);
    if (rv != 0) {
        return rv;
    }
    uint8_t *d;
    rv = copy_data(data, len, &d);
    if (rv != 0) {
        return rv;
    }
    log_push(r, r->term, type, d, len);
    if (type == IDA_ENTRY_CONFIG) {
        conf_apply(r, &c, last_index(r)); /* in effect when appended */
    }
    r->broadcast = true; /* sent at ready(): many proposals, one append */
    if (index != NULL) {
        *index = last_index(r);
    }
    if (term != NULL) {
        *term = r->term;
    }
    return 0;
}

int ida_raft_read_index(struct ida_raft *r, uint64_t ctx)
{
    IDA_ASSERT(r != NULL);
    begin(r);
    if (r->role != IDA_RAFT_LEADER) {
        return IDA_ENOTLEADER;
    }
    /* §6.4 step 1: the leader must know the latest commit index, which it
     * does once an entry of its own term committed. */
    if (term_at(r, r->commit) != r->term) {
        return IDA_EBUSY;
    }
    if (r->n_reads_pending == r->cap_reads_pending) {
        size_t c = r->cap_reads_pending ? r->cap_reads_pending * 2 : 16;
        void *a = ida_realloc(r->reads_pending, c * sizeof(*r->reads_pending));
        if (a == NULL) {
            return IDA_ENOMEM;
        }
        r->reads_pending = a;
        r->cap_reads_pending = c;
    }
    r->read_seq++;
    r->reads_pending[r->n_reads_pending].ctx = ctx;
    r->reads_pending[r->n_reads_pending].seq = r->read_seq;
    r->reads_pending[r->n_reads_pending].index = r->commit;
    r->n_reads_pending++;
    /* §6.4 steps 2-3: confirm leadership with a round of heartbeats. */
    for (size_t i = 0; i < r->conf.n; i++) {
        send_heartbeat(r, &r->prs[i]);
    }
    check_reads(r); /* a single voter is its own quorum */
    return 0;
}

int ida_raft_transfer(struct ida_raft *r, ida_node_id to)
{
    IDA_ASSERT(r != NULL);
    begin(r);
    if (r->role != IDA_RAFT_LEADER) {
        return IDA_ENOTLEADER;
    }
    struct ida_raft_progress *pr = progress_of(r, to);
    if (pr == NULL || to == r->cfg.id || voter_slot(r, to) < 0) {
        return IDA_EINVAL;
    }
    if (r->transferee != 0) {
        return IDA_EBUSY;
    }
    r->transferee = to;
    r->election_elapsed = 0; /* the transfer must finish within a timeout */
    if (pr->match == last_index(r)) {
        send_timeout_now(r, to);
    } else {
        send_append(r, pr, true);
    }
    return 0;
}

int ida_raft_compact(struct ida_raft *r,
                     ida_index index,
                     const uint8_t *data,
                     size_t len)
{
    IDA_ASSERT(r != NULL);
    begin(r);
    if (index > r->applied || index <= r->snap_index ||
        (len > 0 && data == NULL)) {
        return IDA_EINVAL;
    }
    uint8_t *d;
    int rv = copy_data(data, len, &d);
    if (rv != 0) {
        return rv;
    }
    /* The snapshot keeps the config in effect at @index. */
    const struct ida_entry *ce = NULL;
    for (ida_index i = index; i > r->snap_index && ce == NULL; i--) {
        if (entry_at(r, i)->type == IDA_ENTRY_CONFIG) {
            ce = entry_at(r, i);
        }
    }
    uint8_t *conf = NULL;
    if (ce != NULL) {
        rv = copy_data(ce->data, ce->len, &conf);
        if (rv != 0) {
            ida_free(d);
            return rv;
        }
        ida_free(r->snap_conf);
        r->snap_conf = conf;
        r->snap_conf_len = ce->len;
    }
    ida_term t = term_at(r, index);
    IDA_ASSERT(t != 0);
    log_compact(r, index, t);
    if (r->conf_index <= index) {
        r->conf_index = 0; /* now the snapshot's config */
    }
    ida_free(r->snap_data);
    r->snap_data = d;
    r->snap_len = len;
    return 0;
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
            if (first <= r->snap_index || last > last_index(r) ||
                term_at(r, last) != m->ents_last_term_) {
                continue;
            }
            m->u.append_entries.entries = entry_at(r, first);
        }
        if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
            const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
            if (is->last_index != r->snap_index ||
                is->offset + is->len > r->snap_len) {
                continue;
            }
            m->u.install_snapshot.data =
                is->len ? r->snap_data + is->offset : NULL;
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
    begin(r);
    memset(b, 0, sizeof(*b));
    if (r->role == IDA_RAFT_LEADER && r->broadcast) {
        r->broadcast = false;
        broadcast_append(r, false);
    }
    bool work = false;
    if (r->pending_count < IDA_RAFT_PENDING_MAX) {
        struct ida_hard_state hs = {r->term, r->vote, r->commit};
        if (hs.term != r->hs_out.term || hs.vote != r->hs_out.vote ||
            hs.commit != r->hs_out.commit) {
            b->has_hard_state = true;
            b->hard_state = hs;
            r->hs_out = hs;
        }
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
        if (r->unsent <= last_index(r)) {
            b->entries = entry_at(r, r->unsent);
            b->n_entries = (size_t)(last_index(r) - r->unsent + 1);
            last = last_index(r);
            r->unsent = last + 1;
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
        b->committed = entry_at(r, r->applied + 1);
        b->n_committed = (size_t)(lim - r->applied);
        r->applied = lim;
    }
    b->reads = r->reads_ready;
    b->n_reads = r->n_reads_ready;
    r->n_reads_out = r->n_reads_ready;
    b->role = r->role;
    b->leader = r->leader;
    b->term = r->term;
    return work || b->n_msgs > 0 || b->n_committed > 0 || b->n_reads > 0;
}

void ida_raft_persisted(struct ida_raft *r, uint64_t id)
{
    IDA_ASSERT(r != NULL);
    begin(r);
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
    IDA_ASSERT(r->stable <= last_index(r));
    if (any && r->role == IDA_RAFT_LEADER && maybe_commit(r)) {
        broadcast_append(r, true);
    }
    step_down_if_removed(r);
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
    return last_index(r);
}

const uint8_t *ida_raft_snapshot_config(const struct ida_raft *r, size_t *len)
{
    *len = r->snap_conf_len;
    return r->snap_conf;
}

const struct ida_raft_progress *ida_raft_progress_of(const struct ida_raft *r,
                                                     ida_node_id id)
{
    int k = member_slot(&r->conf, id);
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
    return term_at(r, index);
}

const struct ida_entry *ida_raft_entry(const struct ida_raft *r,
                                       ida_index index)
{
    if (index <= r->snap_index || index > last_index(r)) {
        return NULL;
    }
    return entry_at(r, index);
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
