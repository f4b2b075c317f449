/* The deterministic cluster simulator. Contract: tests/sim/sim.h.
 *
 * DESIGN
 * Discrete events on a virtual millisecond clock: the loop jumps to the
 * earliest pending event (packet delivery, node tick, disk sync, client
 * action, fault, restart), handles everything due at that instant in a fixed
 * order, and after each input drains the node's batches (ida_raft_ready) and
 * runs the checks. Every random choice comes from one splitmix64 stream
 * seeded by the seed, so a seed replays exactly; every event is folded into
 * a trace hash.
 *
 * The node runtime modelled here follows the persistence contract of
 * raft/raft.h: batch.msgs go to the network at once, the batch's writes go to
 * the disk's unsynced queue, and msgs_after_persist wait for the sync that
 * makes the batch durable; a crash loses them with the unsynced writes.
 *
 * Checks (a violation stops the seed):
 *  - election safety: at most one leader per term;
 *  - log matching: an (index, term) pair always carries the same entry and
 *    follows the same previous term, in every log that ever held it;
 *  - leader completeness: a new leader holds every committed entry;
 *  - commit durability: when a leader advances its commit index, the entry
 *    is durable (in the disk image, not just written) on a majority;
 *  - state machine safety: every node applies a prefix of one global
 *    committed sequence, with the same results; a restored snapshot equals
 *    the global state at its index; commit indexes never decrease;
 *  - clients: no id is handed out twice; an acknowledged request is never
 *    lost (its entry stays in the global sequence; in liveness mode every
 *    node ends up applying it); a retried request returns its first answer;
 *    a ReadIndex read sees every write acknowledged before it started;
 *  - the core itself: IDA_EPROTO from ida_raft_step() (a leader
 *    contradicting a committed entry, two leaders in a term), and a batch
 *    that would leave a gap in storage;
 *  - liveness mode: after the faults heal, a leader is elected and every
 *    client completes a request within LIVENESS_BOUND_MS.
 */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"

#define NODES_MAX         8 /* slots: 5 + replacements */
#define CLIENTS           4
#define TICK_MS           10
#define ELECTION_TICKS    10
#define HEARTBEAT_TICKS   2
#define CLIENT_TIMEOUT_MS 400
#define LIVENESS_BOUND_MS 3000
#define SNAPSHOT_EVERY    24 /* applied entries between app snapshots */
#define NEVER             UINT64_MAX

/* --- PRNG --------------------------------------------------------------- */

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t *s, uint64_t n)
{
    return n == 0 ? 0 : rnd(s) % n;
}

static bool chance(uint64_t *s, unsigned percent)
{
    return below(s, 100) < percent;
}

/* --- the test state machine ---------------------------------------------
 * A counter handing out ids, with a session table: (client, seq) applied
 * twice answers the first id. Commands are 12 bytes: client u32, seq u64.
 * This is the seam where fsm/ plugs in: apply, snapshot, restore, read. */

struct fsm
{
    ida_index applied;
    uint64_t counter;
    uint64_t last_seq[CLIENTS];
    uint64_t last_result[CLIENTS];
};

static void cmd_encode(uint8_t out[12], uint32_t client, uint64_t seq)
{
    memcpy(out, &client, 4);
    memcpy(out + 4, &seq, 8);
}

/* Returns the id handed out, or 0: the session already moved past @seq. */
static uint64_t fsm_apply(struct fsm *f, const struct ida_entry *e)
{
    IDA_ASSERT(e->index == f->applied + 1);
    f->applied = e->index;
    if (e->type != IDA_ENTRY_NORMAL || e->len != 12) {
        return 0;
    }
    uint32_t c;
    uint64_t seq;
    memcpy(&c, e->data, 4);
    memcpy(&seq, e->data + 4, 8);
    IDA_ASSERT(c < CLIENTS);
    if (seq < f->last_seq[c]) {
        return 0;
    }
    if (seq == f->last_seq[c]) {
        return f->last_result[c];
    }
    f->counter++;
    f->last_seq[c] = seq;
    f->last_result[c] = f->counter;
    return f->counter;
}

/* --- simulator state ---------------------------------------------------- */

struct packet
{
    uint64_t at;
    uint64_t seq;
    struct ida_raft_msg m; /* entries / data point into the copies below */
    struct ida_entry *ents;
    uint8_t *blob;
    uint8_t *conf; /* InstallSnapshot config bytes */
};

struct write
{
    uint64_t id;
    bool has_hs;
    struct ida_hard_state hs;
    bool has_snap;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap;
    size_t snap_len;
    uint8_t *snap_conf;
    size_t snap_conf_len;
    struct ida_entry *ents;
    size_t n_ents;
    struct packet *msgs; /* after-persist messages, not yet scheduled */
    size_t n_msgs;
};

struct disk
{
    struct ida_hard_state hs;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap;
    size_t snap_len;
    uint8_t *snap_conf; /* the snapshot's encoded config, NULL: bootstrap */
    size_t snap_conf_len;
    struct ida_entry *ents;
    size_t n, cap;
};

struct proposal
{
    int client;
    uint64_t seq;
    ida_index index;
    ida_term term;
};

struct pread
{
    int client;
    uint64_t ctx;
    ida_index index; /* 0 until the core confirmed it */
};

struct node
{
    ida_node_id id;
    bool up;
    bool dead; /* removed from the cluster for good */
    struct ida_raft raft;
    struct disk disk;
    struct write *writes;
    size_t n_writes, cap_writes;
    uint64_t sync_at;
    uint64_t next_tick;
    uint64_t restart_at;
    struct fsm fsm;
    ida_index last_commit; /* this incarnation */
    enum ida_raft_role last_role;
    struct proposal props[64];
    size_t n_props;
    struct pread reads[16];
    size_t n_reads;
};

struct client
{
    uint64_t seq; /* current request */
    bool busy;
    bool is_read;
    uint64_t read_floor; /* max id acked when the read started */
    uint64_t sent_at;
    uint64_t timeout_at;
    uint64_t next_at;  /* next send / resend */
    int target;        /* node index */
    uint64_t *answers; /* by seq; 0: none */
    size_t cap_answers;
    bool done_after_heal;
};

struct lm_slot
{
    ida_index index;
    ida_term term;
    uint64_t hash;
    ida_term prev_term;
};

struct sim
{
    struct sim_opts o;
    struct sim_result *res;
    uint64_t rng;
    uint64_t now;
    int n;      /* node slots in use (ids 1..n) */
    int n_boot; /* the bootstrap cluster: ids 1..n_boot */
    struct node nodes[NODES_MAX];
    struct client clients[CLIENTS];
    /* network */
    struct packet *net;
    size_t n_net, cap_net;
    uint64_t pkt_seq;
    bool blocked[NODES_MAX][NODES_MAX];
    unsigned loss_pct, dup_pct, delay_max_ms;
    uint64_t next_fault;
    uint64_t heal_at;
    uint64_t healed_at; /* NEVER until the faults healed */
    bool faults_on;
    ida_node_id retire; /* a removed leader: dies once it stepped down */
    bool pre_vote;      /* per seed: both settings must be safe */
    bool check_quorum;
    /* global knowledge */
    ida_term *glob_term; /* committed entries by index */
    uint64_t *glob_hash;
    uint64_t *glob_counter; /* fsm counter after applying index, 0: unknown */
    size_t glob_len, glob_cap;
    size_t glob_applied;
    ida_node_id *leaders; /* by term */
    size_t cap_leaders;
    struct lm_slot *lm; /* log matching table, open addressing */
    size_t lm_cap, lm_used;
    uint64_t max_acked_id;
    uint64_t *ids_seen; /* bitmap over ids handed out to clients */
    size_t ids_cap;
    bool failed;
    bool oom;
};

/* --- trace and violations ----------------------------------------------- */

static void hash_in(struct sim *s,
                    uint64_t a,
                    uint64_t b,
                    uint64_t c,
                    uint64_t d)
{
    uint64_t v[5] = {s->now, a, b, c, d};
    for (int i = 0; i < 5; i++) {
        s->res->trace_hash ^= v[i];
        s->res->trace_hash *= 0x100000001B3ULL;
        s->res->trace_hash ^= s->res->trace_hash >> 29;
    }
    s->res->events++;
}

static void tracef(struct sim *s, const char *fmt, ...)
{
    if (s->o.trace == NULL) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(s->o.trace, "%8" PRIu64 "ms ", s->now);
    vfprintf(s->o.trace, fmt, ap);
    fputc('\n', s->o.trace);
    va_end(ap);
}

static void violation(struct sim *s, const char *fmt, ...)
{
    if (s->failed) {
        return;
    }
    s->failed = true;
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(s->res->violation, sizeof(s->res->violation),
                     "t=%" PRIu64 "ms: ", s->now);
    vsnprintf(s->res->violation + k, sizeof(s->res->violation) - (size_t)k, fmt,
              ap);
    va_end(ap);
    tracef(s, "VIOLATION %s", s->res->violation);
}

static void *grow(struct sim *s, void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) {
        return p;
    }
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        c *= 2;
    }
    void *q = ida_realloc(p, c * elem);
    if (q == NULL) {
        s->oom = true;
        return NULL;
    }
    memset((char *)q + *cap * elem, 0, (c - *cap) * elem);
    *cap = c;
    return q;
}

static uint64_t entry_hash(const struct ida_entry *e)
{
    uint64_t h = 0xCBF29CE484222325ULL ^ (uint64_t)e->type;
    for (size_t i = 0; i < e->len; i++) {
        h = (h ^ e->data[i]) * 0x100000001B3ULL;
    }
    return h;
}

/* --- network -------------------------------------------------------------- */

static void packet_free(struct packet *p)
{
    if (p->ents != NULL) {
        for (size_t i = 0; i < p->m.u.append_entries.n_entries; i++) {
            ida_free(p->ents[i].data);
        }
    }
    ida_free(p->ents);
    ida_free(p->blob);
    ida_free(p->conf);
    p->conf = NULL;
    p->ents = NULL;
    p->blob = NULL;
}

/* Deep copy of @m (entries and snapshot data). */
static bool packet_copy(struct packet *p, const struct ida_raft_msg *m)
{
    memset(p, 0, sizeof(*p));
    p->m = *m;
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
        m->u.append_entries.n_entries > 0) {
        size_t n = m->u.append_entries.n_entries;
        p->ents = ida_calloc(n, sizeof(*p->ents));
        if (p->ents == NULL) {
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            p->ents[i] = m->u.append_entries.entries[i];
            p->ents[i].data = NULL;
            if (p->ents[i].len > 0) {
                p->ents[i].data = ida_malloc(p->ents[i].len);
                if (p->ents[i].data == NULL) {
                    p->m.u.append_entries.n_entries = i;
                    packet_free(p);
                    return false;
                }
                memcpy(p->ents[i].data, m->u.append_entries.entries[i].data,
                       p->ents[i].len);
            }
        }
        p->m.u.append_entries.entries = p->ents;
    }
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        m->u.install_snapshot.len > 0) {
        p->blob = ida_malloc(m->u.install_snapshot.len);
        if (p->blob == NULL) {
            return false;
        }
        memcpy(p->blob, m->u.install_snapshot.data, m->u.install_snapshot.len);
        p->m.u.install_snapshot.data = p->blob;
    }
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        m->u.install_snapshot.config_len > 0) {
        p->conf = ida_malloc(m->u.install_snapshot.config_len);
        if (p->conf == NULL) {
            return false;
        }
        memcpy(p->conf, m->u.install_snapshot.config,
               m->u.install_snapshot.config_len);
        p->m.u.install_snapshot.config = p->conf;
    }
    return true;
}

static int node_slot(const struct sim *s, ida_node_id id)
{
    IDA_ASSERT(id >= 1 && (int)id <= s->n);
    return (int)id - 1;
}

/* A readable one-line description of @m for the trace. */
static const char *msg_desc(const struct ida_raft_msg *m, char *buf, size_t n)
{
    int k =
        snprintf(buf, n, "%u->%u term %" PRIu64 " ", m->from, m->to, m->term);
    if (k < 0 || (size_t)k >= n) {
        return buf;
    }
    char *p = buf + k;
    size_t left = n - (size_t)k;
    switch (m->type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            snprintf(p, left, "%sRequestVote last %" PRIu64 "/%" PRIu64 "%s",
                     m->u.request_vote.pre_vote ? "Pre" : "",
                     m->u.request_vote.last_log_index,
                     m->u.request_vote.last_log_term,
                     m->u.request_vote.transfer ? " transfer" : "");
            break;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
            snprintf(p, left, "%sResponseVote %s",
                     m->u.response_vote.pre_vote ? "Pre" : "",
                     m->u.response_vote.granted ? "granted" : "rejected");
            break;
        case IDA_RAFT_MSG_APPEND_ENTRIES:
            snprintf(p, left,
                     "AppendEntries prev %" PRIu64 "/%" PRIu64
                     " n=%zu commit "
                     "%" PRIu64,
                     m->u.append_entries.prev_log_index,
                     m->u.append_entries.prev_log_term,
                     m->u.append_entries.n_entries,
                     m->u.append_entries.commit_index);
            break;
        case IDA_RAFT_MSG_APPEND_RESPONSE:
            if (m->u.append_response.success) {
                snprintf(p, left, "AppendResponse ok match %" PRIu64,
                         m->u.append_response.match_index);
            } else {
                snprintf(p, left,
                         "AppendResponse reject %" PRIu64 " hint %" PRIu64
                         "/%" PRIu64,
                         m->u.append_response.reject_index,
                         m->u.append_response.conflict_index,
                         m->u.append_response.conflict_term);
            }
            break;
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT:
            snprintf(p, left,
                     "InstallSnapshot %" PRIu64 "/%" PRIu64 " offset %" PRIu64
                     " len %zu%s",
                     m->u.install_snapshot.last_index,
                     m->u.install_snapshot.last_term,
                     m->u.install_snapshot.offset, m->u.install_snapshot.len,
                     m->u.install_snapshot.done ? " done" : "");
            break;
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE:
            snprintf(p, left, "SnapshotResponse %" PRIu64 " next %" PRIu64 "%s",
                     m->u.snapshot_response.last_index,
                     m->u.snapshot_response.next_offset,
                     m->u.snapshot_response.done ? " done" : "");
            break;
        case IDA_RAFT_MSG_TIMEOUT_NOW:
            snprintf(p, left, "TimeoutNow");
            break;
    }
    return buf;
}

/* Put a packet on the wire: loss, duplication, delay (reordering). */
static void net_send(struct sim *s, struct packet *p)
{
    int from = node_slot(s, p->m.from), to = node_slot(s, p->m.to);
    if (s->blocked[from][to] || chance(&s->rng, s->loss_pct)) {
        hash_in(s, 1, p->m.from, p->m.to, p->m.type);
        if (s->o.trace != NULL) {
            char d[160];
            tracef(s, "drop    %s", msg_desc(&p->m, d, sizeof(d)));
        }
        packet_free(p);
        return;
    }
    int copies = chance(&s->rng, s->dup_pct) ? 2 : 1;
    for (int c = 0; c < copies; c++) {
        struct packet q = *p;
        if (c == 1) {
            struct ida_raft_msg m = p->m;
            if (!packet_copy(&q, &m)) {
                s->oom = true;
                return;
            }
        }
        q.at = s->now + 1 + below(&s->rng, s->delay_max_ms);
        q.seq = s->pkt_seq++;
        s->net = grow(s, s->net, &s->cap_net, s->n_net + 1, sizeof(*s->net));
        if (s->net == NULL) {
            packet_free(&q);
            return;
        }
        s->net[s->n_net++] = q;
    }
}

/* --- disk ----------------------------------------------------------------- */

static void disk_free_entries_from(struct disk *d, size_t k)
{
    for (size_t i = k; i < d->n; i++) {
        ida_free(d->ents[i].data);
    }
    if (k < d->n) {
        d->n = k;
    }
}

static ida_index disk_last(const struct disk *d)
{
    return d->snap_index + d->n;
}

static ida_term disk_term_at(const struct disk *d, ida_index i)
{
    if (i == d->snap_index) {
        return d->snap_term;
    }
    if (i < d->snap_index || i > disk_last(d)) {
        return 0;
    }
    return d->ents[i - d->snap_index - 1].term;
}

static void write_free(struct write *w)
{
    ida_free(w->snap);
    ida_free(w->snap_conf);
    for (size_t i = 0; i < w->n_ents; i++) {
        ida_free(w->ents[i].data);
    }
    ida_free(w->ents);
    for (size_t i = 0; i < w->n_msgs; i++) {
        packet_free(&w->msgs[i]);
    }
    ida_free(w->msgs);
    memset(w, 0, sizeof(*w));
}

/* Make @w durable: rule 1 of the persistence contract. Takes ownership of
 * the write's data. */
static void disk_apply(struct sim *s, struct node *nd, struct write *w)
{
    struct disk *d = &nd->disk;
    if (w->has_hs) {
        d->hs = w->hs;
    }
    if (w->has_snap) {
        ida_free(d->snap);
        d->snap = w->snap;
        w->snap = NULL;
        d->snap_len = w->snap_len;
        d->snap_index = w->snap_index;
        d->snap_term = w->snap_term;
        ida_free(d->snap_conf);
        d->snap_conf = w->snap_conf;
        d->snap_conf_len = w->snap_conf_len;
        w->snap_conf = NULL;
        disk_free_entries_from(d, 0);
    }
    if (w->n_ents > 0) {
        ida_index first = w->ents[0].index;
        if (first > disk_last(d) + 1) {
            violation(s,
                      "node %u: batch entries from %" PRIu64
                      " leave a gap after stored index %" PRIu64,
                      nd->id, first, disk_last(d));
        }
        if (first > d->snap_index) {
            disk_free_entries_from(d, (size_t)(first - d->snap_index - 1));
        }
        d->ents = grow(s, d->ents, &d->cap, d->n + w->n_ents, sizeof(*d->ents));
        for (size_t i = 0; i < w->n_ents && d->ents != NULL; i++) {
            if (w->ents[i].index <= d->snap_index) {
                continue; /* inside the stored snapshot */
            }
            d->ents[d->n++] = w->ents[i];
            w->ents[i].data = NULL;
        }
    }
}

/* --- checks --------------------------------------------------------------- */

static bool glob_reserve(struct sim *s, size_t need)
{
    size_t c1 = s->glob_cap, c2 = s->glob_cap, c3 = s->glob_cap;
    s->glob_term = grow(s, s->glob_term, &c1, need + 1, sizeof(ida_term));
    s->glob_hash = grow(s, s->glob_hash, &c2, need + 1, sizeof(uint64_t));
    s->glob_counter = grow(s, s->glob_counter, &c3, need + 1, sizeof(uint64_t));
    s->glob_cap = c1;
    return s->glob_term != NULL && s->glob_hash != NULL &&
           s->glob_counter != NULL;
}

static void lm_check(struct sim *s, struct node *nd, const struct ida_entry *e)
{
    if (s->lm_used * 2 >= s->lm_cap) {
        size_t ncap = s->lm_cap ? s->lm_cap * 2 : 1024;
        struct lm_slot *t = ida_calloc(ncap, sizeof(*t));
        if (t == NULL) {
            s->oom = true;
            return;
        }
        for (size_t i = 0; i < s->lm_cap; i++) {
            if (s->lm[i].term != 0) {
                size_t h = (size_t)((s->lm[i].index * 31 + s->lm[i].term) *
                                        0x9E3779B97F4A7C15ULL >>
                                    7) %
                           ncap;
                while (t[h].term != 0) {
                    h = (h + 1) % ncap;
                }
                t[h] = s->lm[i];
            }
        }
        ida_free(s->lm);
        s->lm = t;
        s->lm_cap = ncap;
    }
    ida_term prev =
        e->index == 1 ? 0 : ida_raft_term_at(&nd->raft, e->index - 1);
    uint64_t hash = entry_hash(e);
    size_t h =
        (size_t)((e->index * 31 + e->term) * 0x9E3779B97F4A7C15ULL >> 7) %
        s->lm_cap;
    while (s->lm[h].term != 0) {
        if (s->lm[h].index == e->index && s->lm[h].term == e->term) {
            /* prev == 0 when the previous entry was compacted away. */
            if (s->lm[h].hash != hash ||
                (prev != 0 && s->lm[h].prev_term != prev)) {
                violation(s,
                          "log matching: node %u entry %" PRIu64
                          " term %" PRIu64 " differs from another log",
                          nd->id, e->index, e->term);
            }
            return;
        }
        h = (h + 1) % s->lm_cap;
    }
    s->lm[h] = (struct lm_slot){e->index, e->term, hash, prev};
    s->lm_used++;
}

static void check_leader(struct sim *s, struct node *nd)
{
    ida_term t = ida_raft_term(&nd->raft);
    s->leaders = grow(s, s->leaders, &s->cap_leaders, (size_t)t + 1,
                      sizeof(*s->leaders));
    if (s->leaders == NULL) {
        return;
    }
    if (s->leaders[t] == 0) {
        s->leaders[t] = nd->id;
        s->res->elections++;
        tracef(s, "node %u leader of term %" PRIu64, nd->id, t);
    } else if (s->leaders[t] != nd->id) {
        violation(s,
                  "election safety: nodes %u and %u both leader of term "
                  "%" PRIu64,
                  s->leaders[t], nd->id, t);
        return;
    }
    if (nd->last_role == IDA_RAFT_LEADER) {
        return;
    }
    /* Leader completeness: the new leader holds every committed entry. */
    for (size_t i = 1; i <= s->glob_len; i++) {
        ida_term have = ida_raft_term_at(&nd->raft, i);
        if (have != 0 && have != s->glob_term[i]) {
            violation(s,
                      "leader completeness: leader %u term %" PRIu64
                      " has term %" PRIu64
                      " at committed index %zu "
                      "(committed term %" PRIu64 ")",
                      nd->id, t, have, i, s->glob_term[i]);
            return;
        }
        if (have == 0 && i > ida_raft_last_index(&nd->raft)) {
            violation(s,
                      "leader completeness: leader %u term %" PRIu64
                      " lacks committed index %zu",
                      nd->id, t, i);
            return;
        }
    }
}

static void check_commit(struct sim *s, struct node *nd)
{
    ida_index c = ida_raft_commit(&nd->raft);
    if (c < nd->last_commit) {
        violation(s,
                  "node %u commit index went back from %" PRIu64 " to %" PRIu64,
                  nd->id, nd->last_commit, c);
        return;
    }
    if (c == nd->last_commit) {
        return;
    }
    if (!glob_reserve(s, (size_t)c)) {
        return;
    }
    for (ida_index i = nd->last_commit + 1; i <= c; i++) {
        const struct ida_entry *e = ida_raft_entry(&nd->raft, i);
        if (e == NULL) {
            continue; /* inside a snapshot */
        }
        if (i <= s->glob_len && s->glob_term[i] != 0) {
            if (s->glob_term[i] != e->term ||
                s->glob_hash[i] != entry_hash(e)) {
                violation(s,
                          "node %u committed index %" PRIu64 " term %" PRIu64
                          ", the cluster committed term "
                          "%" PRIu64 " there",
                          nd->id, i, e->term, s->glob_term[i]);
                return;
            }
        } else {
            if (i > s->glob_len + 1) {
                violation(s, "node %u committed %" PRIu64 " past unknown %zu",
                          nd->id, i, s->glob_len + 1);
                return;
            }
            s->glob_term[i] = e->term;
            s->glob_hash[i] = entry_hash(e);
            s->glob_len = (size_t)i;
        }
    }
    if (ida_raft_role(&nd->raft) == IDA_RAFT_LEADER) {
        /* Commit durability: the entry is on the disks of a majority of
         * the voters the leader counts. */
        const struct ida_raft_conf *v = ida_raft_voters(&nd->raft);
        size_t have = 0;
        for (size_t k = 0; k < v->n; k++) {
            const struct disk *d = &s->nodes[node_slot(s, v->voters[k])].disk;
            if (d->snap_index >= c || disk_term_at(d, c) == s->glob_term[c]) {
                have++;
            }
        }
        if (have < v->n / 2 + 1) {
            violation(s,
                      "leader %u committed index %" PRIu64
                      " durable on only %zu of %zu voters' disks",
                      nd->id, c, have, v->n);
        }
    }
    nd->last_commit = c;
}

/* --- clients -------------------------------------------------------------- */

static void ids_mark(struct sim *s, uint64_t id, int client, uint64_t seq)
{
    size_t word = (size_t)(id / 64);
    size_t cap = s->ids_cap;
    s->ids_seen = grow(s, s->ids_seen, &cap, word + 1, sizeof(uint64_t));
    s->ids_cap = cap;
    if (s->ids_seen == NULL) {
        return;
    }
    if (s->ids_seen[word] & (1ULL << (id % 64))) {
        violation(s,
                  "id %" PRIu64 " handed out twice (client %d seq %" PRIu64 ")",
                  id, client, seq);
    }
    s->ids_seen[word] |= 1ULL << (id % 64);
}

static void client_answer(struct sim *s, int ci, uint64_t seq, uint64_t id)
{
    struct client *c = &s->clients[ci];
    hash_in(s, 2, (uint64_t)ci, seq, id);
    if (id == 0) {
        return; /* the session moved past this retry */
    }
    size_t cap = c->cap_answers;
    c->answers = grow(s, c->answers, &cap, (size_t)seq + 1, sizeof(uint64_t));
    c->cap_answers = cap;
    if (c->answers == NULL) {
        return;
    }
    if (c->answers[seq] != 0) {
        if (c->answers[seq] != id) {
            violation(s,
                      "client %d seq %" PRIu64 " answered %" PRIu64
                      " then %" PRIu64,
                      ci, seq, c->answers[seq], id);
        }
        return;
    }
    if (!c->busy || c->is_read || c->seq != seq) {
        return; /* a late answer to an abandoned request: keep nothing */
    }
    c->answers[seq] = id;
    ids_mark(s, id, ci, seq);
    if (id > s->max_acked_id) {
        s->max_acked_id = id;
    }
    c->busy = false;
    c->next_at = s->now + below(&s->rng, 30);
    if (c->sent_at >= s->healed_at) {
        c->done_after_heal = true;
    }
    s->res->acked++;
    tracef(s, "client %d seq %" PRIu64 " acked id %" PRIu64, ci, seq, id);
}

static void client_retry(struct sim *s, int ci, ida_node_id hint)
{
    struct client *c = &s->clients[ci];
    if (!c->busy) {
        return;
    }
    c->target = hint ? node_slot(s, hint) : (int)below(&s->rng, (uint64_t)s->n);
    c->next_at = s->now + 5 + below(&s->rng, 20);
}

static void client_read_answer(struct sim *s, int ci, uint64_t ctx, uint64_t v)
{
    struct client *c = &s->clients[ci];
    if (!c->busy || !c->is_read || c->seq != ctx) {
        return;
    }
    hash_in(s, 3, (uint64_t)ci, ctx, v);
    if (v < c->read_floor) {
        violation(s,
                  "client %d read %" PRIu64 " sees counter %" PRIu64
                  " but id %" PRIu64 " was acked before it started",
                  ci, ctx, v, c->read_floor);
    }
    c->busy = false;
    c->next_at = s->now + below(&s->rng, 30);
    if (c->sent_at >= s->healed_at) {
        c->done_after_heal = true;
    }
    s->res->reads++;
}

/* --- nodes ---------------------------------------------------------------- */

#define CTX_SHIFT 48 /* read ctx: client << CTX_SHIFT | seq */

static void fail_pending(struct sim *s, struct node *nd)
{
    for (size_t i = 0; i < nd->n_props; i++) {
        client_retry(s, nd->props[i].client, 0);
    }
    nd->n_props = 0;
    for (size_t i = 0; i < nd->n_reads; i++) {
        client_retry(s, nd->reads[i].client, 0);
        tracef(s, "node %u read of client %d failed: leadership lost", nd->id,
               nd->reads[i].client);
    }
    nd->n_reads = 0;
}

static void serve_reads(struct sim *s, struct node *nd)
{
    size_t k = 0;
    for (size_t i = 0; i < nd->n_reads; i++) {
        struct pread *r = &nd->reads[i];
        if (r->index != 0 && nd->fsm.applied >= r->index) {
            client_read_answer(s, r->client, r->ctx & ((1ULL << CTX_SHIFT) - 1),
                               nd->fsm.counter);
        } else {
            nd->reads[k++] = *r;
        }
    }
    nd->n_reads = k;
}

static void apply_entry(struct sim *s,
                        struct node *nd,
                        const struct ida_entry *e)
{
    if (e->index != nd->fsm.applied + 1) {
        violation(s, "node %u asked to apply index %" PRIu64 " after %" PRIu64,
                  nd->id, e->index, nd->fsm.applied);
        return;
    }
    uint64_t id = fsm_apply(&nd->fsm, e);
    size_t i = (size_t)e->index;
    hash_in(s, 4, nd->id, i, id);
    if (i > s->glob_len || s->glob_term[i] != e->term ||
        s->glob_hash[i] != entry_hash(e)) {
        violation(s,
                  "node %u applied index %zu term %" PRIu64
                  " that is not the committed entry",
                  nd->id, i, e->term);
        return;
    }
    if (i <= s->glob_applied) {
        if (s->glob_counter[i] != nd->fsm.counter) {
            violation(s, "node %u state after index %zu differs", nd->id, i);
        }
    } else {
        IDA_ASSERT(i == s->glob_applied + 1);
        s->glob_counter[i] = nd->fsm.counter;
        s->glob_applied = i;
    }
    for (size_t k = 0; k < nd->n_props; k++) {
        struct proposal *p = &nd->props[k];
        if (p->index != e->index) {
            continue;
        }
        if (p->term == e->term) {
            client_answer(s, p->client, p->seq, id);
        } else {
            client_retry(s, p->client, 0); /* lost: unknown outcome */
        }
        nd->props[k] = nd->props[--nd->n_props];
        break;
    }
}

static void take_snapshot(struct sim *s, struct node *nd)
{
    struct disk *d = &nd->disk;
    ida_index at = nd->fsm.applied;
    if (at < d->snap_index + SNAPSHOT_EVERY || at <= nd->raft.snap_index) {
        return;
    }
    ida_term t = ida_raft_term_at(&nd->raft, at);
    uint8_t *data = ida_malloc(sizeof(nd->fsm));
    if (data == NULL) {
        s->oom = true;
        return;
    }
    memcpy(data, &nd->fsm, sizeof(nd->fsm));
    /* The application stores its snapshot durably first, then tells the
     * core; storage drops the log it covers. */
    if (disk_term_at(d, at) != t) {
        violation(s, "node %u applied index %" PRIu64 " is not durable", nd->id,
                  at);
        ida_free(data);
        return;
    }
    /* Drop the stored entries the snapshot covers, keep the rest. */
    size_t drop = (size_t)(at - d->snap_index);
    for (size_t i = 0; i < drop; i++) {
        ida_free(d->ents[i].data);
    }
    if (drop < d->n) {
        memmove(d->ents, d->ents + drop, (d->n - drop) * sizeof(*d->ents));
    }
    d->n -= drop;
    ida_free(d->snap);
    d->snap = data;
    d->snap_len = sizeof(nd->fsm);
    d->snap_index = at;
    d->snap_term = t;
    int rv = ida_raft_compact(&nd->raft, at, data, sizeof(nd->fsm));
    if (rv != 0) {
        violation(s, "node %u compact at %" PRIu64 ": %s", nd->id, at,
                  idalloc_errname(rv));
        return;
    }
    /* Storage keeps the snapshot's config with it (raft.h). */
    size_t clen;
    const uint8_t *conf = ida_raft_snapshot_config(&nd->raft, &clen);
    ida_free(d->snap_conf);
    d->snap_conf = NULL;
    d->snap_conf_len = 0;
    if (clen > 0) {
        d->snap_conf = ida_malloc(clen);
        if (d->snap_conf == NULL) {
            s->oom = true;
            return;
        }
        memcpy(d->snap_conf, conf, clen);
        d->snap_conf_len = clen;
    }
    hash_in(s, 5, nd->id, at, t);
    tracef(s, "node %u snapshot at %" PRIu64, nd->id, at);
}

static void restore_fsm(struct sim *s,
                        struct node *nd,
                        const uint8_t *data,
                        size_t len,
                        ida_index index)
{
    if (len != sizeof(nd->fsm)) {
        violation(s, "node %u snapshot of %zu bytes", nd->id, len);
        return;
    }
    memcpy(&nd->fsm, data, len);
    if (nd->fsm.applied != index) {
        violation(s,
                  "node %u snapshot index %" PRIu64 " holds state of %" PRIu64,
                  nd->id, index, nd->fsm.applied);
    }
    if (index <= s->glob_applied && s->glob_counter[index] != nd->fsm.counter) {
        violation(s,
                  "node %u snapshot at %" PRIu64
                  " differs from the "
                  "committed state",
                  nd->id, index);
    }
}

static bool copy_write(struct sim *s,
                       struct node *nd,
                       const struct ida_raft_batch *b,
                       struct write *w)
{
    memset(w, 0, sizeof(*w));
    w->id = b->id;
    w->has_hs = b->has_hard_state;
    w->hs = b->hard_state;
    if (b->has_snapshot) {
        w->has_snap = true;
        w->snap_index = b->snapshot.index;
        w->snap_term = b->snapshot.term;
        w->snap_len = b->snapshot.len;
        w->snap = ida_malloc(b->snapshot.len ? b->snapshot.len : 1);
        if (w->snap == NULL) {
            return false;
        }
        memcpy(w->snap, b->snapshot.data, b->snapshot.len);
        if (b->snapshot.config_len > 0) {
            w->snap_conf = ida_malloc(b->snapshot.config_len);
            if (w->snap_conf == NULL) {
                return false;
            }
            memcpy(w->snap_conf, b->snapshot.config, b->snapshot.config_len);
            w->snap_conf_len = b->snapshot.config_len;
        }
    }
    if (b->n_entries > 0) {
        w->ents = ida_calloc(b->n_entries, sizeof(*w->ents));
        if (w->ents == NULL) {
            return false;
        }
        for (size_t i = 0; i < b->n_entries; i++) {
            w->ents[i] = b->entries[i];
            w->ents[i].data = NULL;
            w->n_ents = i + 1;
            if (b->entries[i].len > 0) {
                w->ents[i].data = ida_malloc(b->entries[i].len);
                if (w->ents[i].data == NULL) {
                    return false;
                }
                memcpy(w->ents[i].data, b->entries[i].data, b->entries[i].len);
            }
        }
    }
    if (b->n_msgs_after_persist > 0) {
        w->msgs = ida_calloc(b->n_msgs_after_persist, sizeof(*w->msgs));
        if (w->msgs == NULL) {
            return false;
        }
        for (size_t i = 0; i < b->n_msgs_after_persist; i++) {
            if (!packet_copy(&w->msgs[i], &b->msgs_after_persist[i])) {
                return false;
            }
            w->n_msgs = i + 1;
        }
    }
    (void)s;
    (void)nd;
    return true;
}

static void handle_batch(struct sim *s,
                         struct node *nd,
                         struct ida_raft_batch *b)
{
    hash_in(s, 6, nd->id, b->id, b->n_entries * 1000 + b->n_msgs);
    for (size_t i = 0; i < b->n_entries; i++) {
        lm_check(s, nd, &b->entries[i]);
    }
    for (size_t i = 0; i < b->n_msgs; i++) {
        struct packet p;
        if (!packet_copy(&p, &b->msgs[i])) {
            s->oom = true;
            return;
        }
        net_send(s, &p);
    }
    if (b->id != 0) {
        nd->writes = grow(s, nd->writes, &nd->cap_writes, nd->n_writes + 1,
                          sizeof(*nd->writes));
        if (nd->writes == NULL) {
            return;
        }
        struct write *w = &nd->writes[nd->n_writes++];
        if (!copy_write(s, nd, b, w)) {
            s->oom = true;
            return;
        }
        if (nd->sync_at == NEVER) {
            nd->sync_at = s->now + 1 + below(&s->rng, 8);
        }
    }
    for (size_t i = 0; i < b->n_committed; i++) {
        apply_entry(s, nd, &b->committed[i]);
    }
    for (size_t i = 0; i < b->n_reads; i++) {
        for (size_t k = 0; k < nd->n_reads; k++) {
            if (nd->reads[k].ctx == b->reads[i].ctx) {
                nd->reads[k].index = b->reads[i].index;
            }
        }
    }
    serve_reads(s, nd);
    if (b->n_committed > 0) {
        take_snapshot(s, nd);
    }
}

/* Drain the core's work and check the invariants. */
static void drain(struct sim *s, struct node *nd)
{
    struct ida_raft_batch b;
    for (int guard = 0; guard < 16 && !s->failed && !s->oom; guard++) {
        check_commit(s, nd);
        if (ida_raft_role(&nd->raft) == IDA_RAFT_LEADER) {
            check_leader(s, nd);
        } else if (nd->last_role == IDA_RAFT_LEADER) {
            fail_pending(s, nd); /* fail fast: leadership lost */
        }
        if (nd->last_role != ida_raft_role(&nd->raft)) {
            tracef(s, "node %u is %s in term %" PRIu64, nd->id,
                   ida_raft_role_name(ida_raft_role(&nd->raft)),
                   ida_raft_term(&nd->raft));
        }
        nd->last_role = ida_raft_role(&nd->raft);
        if (!ida_raft_ready(&nd->raft, &b)) {
            break;
        }
        handle_batch(s, nd, &b);
    }
}

static void node_step(struct sim *s,
                      struct node *nd,
                      const struct ida_raft_msg *m)
{
    int rv = ida_raft_step(&nd->raft, m);
    if (rv == IDA_EPROTO || rv == IDA_EINVAL) {
        violation(s,
                  "node %u rejected a message from %u (type %d term "
                  "%" PRIu64 "): %s",
                  nd->id, m->from, m->type, m->term, idalloc_errname(rv));
    } else if (rv != 0) {
        s->oom = true;
    }
    drain(s, nd);
}

static void node_crash(struct sim *s, struct node *nd);

static void node_sync(struct sim *s, struct node *nd)
{
    nd->sync_at = NEVER;
    size_t n = nd->n_writes;
    uint64_t last_id = 0;
    ida_index snap = 0; /* the newest snapshot this sync made durable */
    bool voted = false; /* this sync released a vote */
    for (size_t i = 0; i < n; i++) {
        struct write *w = &nd->writes[i];
        if (w->has_snap) {
            snap = w->snap_index;
        }
        disk_apply(s, nd, w);
        last_id = w->id;
    }
    hash_in(s, 7, nd->id, last_id, n);
    for (size_t i = 0; i < n; i++) {
        struct write *w = &nd->writes[i];
        for (size_t k = 0; k < w->n_msgs; k++) {
            if (w->msgs[k].m.type == IDA_RAFT_MSG_RESPONSE_VOTE &&
                w->msgs[k].m.u.response_vote.granted) {
                voted = true;
            }
            net_send(s, &w->msgs[k]);
            memset(&w->msgs[k], 0, sizeof(w->msgs[k]));
        }
        write_free(w);
    }
    if (snap != 0) {
        restore_fsm(s, nd, nd->disk.snap, nd->disk.snap_len, snap);
    }
    if (s->faults_on && chance(&s->rng, voted ? 25 : 2)) {
        /* Crash point (FoundationDB's "buggify" style): right after an
         * fsync whose votes and acks went out, most often after a vote,
         * the moment a forgotten vote or an early ack would matter. */
        tracef(s, "fault: node %u crashes right after a sync", nd->id);
        node_crash(s, nd);
        nd->restart_at = s->now + 1 + below(&s->rng, 50);
        return;
    }
    nd->n_writes = 0;
    ida_raft_persisted(&nd->raft, last_id);
    drain(s, nd);
    serve_reads(s, nd);
}

static int node_start(struct sim *s, struct node *nd)
{
    struct ida_raft_config cfg = {
        .id = nd->id,
        .n_voters = (size_t)s->n_boot,
        .election_ticks = ELECTION_TICKS,
        .heartbeat_ticks = HEARTBEAT_TICKS,
        .seed = rnd(&s->rng),
        .pre_vote = s->pre_vote,
        .check_quorum = s->check_quorum,
        .max_inflight = 4,
        .max_msg_entries = 8,
        .snapshot_chunk_bytes = 40,
        .bugs = s->o.bugs,
    };
    for (int k = 0; k < s->n_boot; k++) {
        cfg.voters[k] = (ida_node_id)(k + 1);
    }
    struct disk *d = &nd->disk;
    struct ida_raft_restore st = {
        .hard_state = d->hs,
        .snapshot_index = d->snap_index,
        .snapshot_term = d->snap_term,
        .snapshot_data = d->snap,
        .snapshot_len = d->snap_len,
        .snapshot_config = d->snap_conf,
        .snapshot_config_len = d->snap_conf_len,
        .entries = d->ents,
        .n_entries = d->n,
    };
    int rv = ida_raft_init(&nd->raft, &cfg, &st);
    if (rv != 0) {
        return rv;
    }
    memset(&nd->fsm, 0, sizeof(nd->fsm));
    if (d->snap_index > 0) {
        restore_fsm(s, nd, d->snap, d->snap_len, d->snap_index);
    }
    nd->up = true;
    nd->last_commit = ida_raft_commit(&nd->raft);
    nd->last_role = IDA_RAFT_FOLLOWER;
    nd->sync_at = NEVER;
    nd->next_tick = s->now + 1 + below(&s->rng, TICK_MS);
    nd->restart_at = NEVER;
    return 0;
}

static void node_crash(struct sim *s, struct node *nd)
{
    /* Unsynced writes: all lost, or a random prefix reached the disk. */
    size_t keep =
        chance(&s->rng, 50) ? 0 : (size_t)below(&s->rng, nd->n_writes + 1);
    for (size_t i = 0; i < nd->n_writes; i++) {
        if (i < keep) {
            disk_apply(s, nd, &nd->writes[i]);
        }
        write_free(&nd->writes[i]);
    }
    nd->n_writes = 0;
    hash_in(s, 8, nd->id, keep, 0);
    tracef(s, "node %u crash (kept %zu unsynced writes)", nd->id, keep);
    nd->n_props = 0; /* their clients time out and retry */
    nd->n_reads = 0;
    ida_raft_close(&nd->raft);
    nd->up = false;
    nd->sync_at = NEVER;
    nd->next_tick = NEVER;
    s->res->crashes++;
}

/* --- clients and faults --------------------------------------------------- */

static void client_send(struct sim *s, int ci)
{
    struct client *c = &s->clients[ci];
    if (!c->busy) {
        c->busy = true;
        c->seq++;
        c->is_read = chance(&s->rng, 20);
        c->read_floor = s->max_acked_id;
        c->sent_at = s->now;
    }
    c->timeout_at = s->now + CLIENT_TIMEOUT_MS;
    c->next_at = NEVER;
    struct node *nd = &s->nodes[c->target];
    hash_in(s, 9, (uint64_t)ci, c->seq, (uint64_t)c->target);
    if (!nd->up) {
        tracef(s, "client %d seq %" PRIu64 " -> node %u: down", ci, c->seq,
               nd->id);
        /* Connection refused: try another node soon. */
        c->target = (int)below(&s->rng, (uint64_t)s->n);
        c->next_at = s->now + 20 + below(&s->rng, 20);
        return;
    }
    int rv;
    if (c->is_read) {
        uint64_t ctx = ((uint64_t)ci << CTX_SHIFT) | c->seq;
        rv = nd->n_reads < 16 ? ida_raft_read_index(&nd->raft, ctx) : IDA_EBUSY;
        if (rv == 0) {
            nd->reads[nd->n_reads++] = (struct pread){ci, ctx, 0};
        }
    } else {
        uint8_t cmd[12];
        cmd_encode(cmd, (uint32_t)ci, c->seq);
        ida_index index;
        ida_term term;
        rv = nd->n_props < 64
                 ? ida_raft_propose(&nd->raft, IDA_ENTRY_NORMAL, cmd,
                                    sizeof(cmd), &index, &term)
                 : IDA_EBUSY;
        if (rv == 0) {
            nd->props[nd->n_props++] =
                (struct proposal){ci, c->seq, index, term};
        }
    }
    tracef(s, "client %d %s seq %" PRIu64 " -> node %u: %s", ci,
           c->is_read ? "read" : "write", c->seq, nd->id,
           rv ? idalloc_errname(rv) : "ok");
    if (rv == IDA_ENOTLEADER) {
        client_retry(s, ci, ida_raft_leader(&nd->raft));
    } else if (rv == IDA_EBUSY) {
        c->next_at = s->now + 20;
    } else if (rv != 0) {
        s->oom = true;
    }
    drain(s, nd);
    serve_reads(s, nd);
}

static void client_tick(struct sim *s, int ci)
{
    struct client *c = &s->clients[ci];
    if (c->busy && s->now >= c->timeout_at) {
        /* Timed out: the outcome is unknown, retry with the same seq. */
        c->target = (int)below(&s->rng, (uint64_t)s->n);
        client_send(s, ci);
        return;
    }
    if (s->now >= c->next_at) {
        client_send(s, ci);
    }
}

static struct node *find_leader(struct sim *s)
{
    struct node *best = NULL;
    for (int k = 0; k < s->n; k++) {
        struct node *nd = &s->nodes[k];
        if (nd->up && ida_raft_role(&nd->raft) == IDA_RAFT_LEADER &&
            (best == NULL ||
             ida_raft_term(&nd->raft) > ida_raft_term(&best->raft))) {
            best = nd;
        }
    }
    return best;
}

static void heal_links(struct sim *s)
{
    memset(s->blocked, 0, sizeof(s->blocked));
}

static void block(struct sim *s, int a, int b)
{
    if (a != b) {
        s->blocked[a][b] = true;
    }
}

static void split(struct sim *s, const bool *side)
{
    for (int a = 0; a < s->n; a++) {
        for (int b = 0; b < s->n; b++) {
            if (side[a] != side[b]) {
                block(s, a, b);
            }
        }
    }
}

static void restart_all(struct sim *s)
{
    for (int k = 0; k < s->n; k++) {
        if (!s->nodes[k].up && !s->nodes[k].dead) {
            s->nodes[k].restart_at = s->now;
        }
    }
}

/* Replace a node (dissertation §4.1/§4.2.1, one server at a time): remove a
 * voter (it dies for good); add a fresh node with an empty disk as a
 * learner; promote the learner to voter once it caught up. At most one
 * dead voter is ever in a configuration, so a majority can stay alive. */
static void membership_change(struct sim *s, struct node *ld)
{
    const struct ida_raft_conf *cur = ida_raft_voters(&ld->raft);
    struct ida_raft_conf next = *cur;
    int dead_voter = -1;
    for (size_t i = 0; i < cur->n; i++) {
        if (s->nodes[node_slot(s, cur->voters[i])].dead) {
            dead_voter = (int)i;
        }
    }
    ida_node_id victim = 0, added = 0, promoted = 0;
    if (cur->n_learners > 0) {
        /* Promote once it holds the leader's committed log. */
        ida_node_id l = cur->learners[0];
        const struct ida_raft_progress *pr = ida_raft_progress_of(&ld->raft, l);
        if (pr == NULL || pr->match < ida_raft_commit(&ld->raft) ||
            s->nodes[node_slot(s, l)].dead) {
            return;
        }
        promoted = l;
        next.learners[0] = next.learners[--next.n_learners];
        next.voters[next.n++] = l;
    } else if (dead_voter >= 0) {
        victim = cur->voters[dead_voter];
    } else if ((int)cur->n < s->n_boot) {
        if (s->n == NODES_MAX) {
            return;
        }
        added = (ida_node_id)(s->n + 1);
        next.learners[next.n_learners++] = added;
    } else if (cur->n > 1) {
        victim = cur->voters[below(&s->rng, cur->n)];
    } else {
        return;
    }
    if (victim != 0) {
        int k = ida_raft_conf_slot(&next, victim);
        next.voters[k] = next.voters[--next.n];
    }
    uint8_t buf[256];
    size_t len;
    if (ida_raft_conf_encode(&next, buf, sizeof(buf), &len) != 0) {
        s->oom = true;
        return;
    }
    int rv =
        ida_raft_propose(&ld->raft, IDA_ENTRY_CONFIG, buf, len, NULL, NULL);
    tracef(s, "fault: leader %u proposes %s node %u: %s", ld->id,
           victim  ? "removing"
           : added ? "adding learner"
                   : "promoting",
           victim  ? victim
           : added ? added
                   : promoted,
           rv ? idalloc_errname(rv) : "ok");
    hash_in(s, 13, victim, added, (uint64_t)rv * 100 + promoted);
    if (rv != 0) {
        return;
    }
    s->res->members_changed++;
    if (added != 0) {
        struct node *nd = &s->nodes[s->n++];
        memset(nd, 0, sizeof(*nd));
        nd->id = added;
        if (node_start(s, nd) != 0) {
            s->oom = true;
            return;
        }
    } else if (victim == ld->id) {
        /* A removed leader leads until the entry commits, then steps
         * down; it dies after that (retire_removed_leader). */
        s->retire = victim;
    } else if (victim != 0) {
        struct node *v = &s->nodes[node_slot(s, victim)];
        if (v->up) {
            node_crash(s, v);
        }
        v->dead = true;
    }
    drain(s, ld);
}

static void retire_removed_leader(struct sim *s)
{
    if (s->retire == 0) {
        return;
    }
    struct node *v = &s->nodes[node_slot(s, s->retire)];
    if (v->up && ida_raft_role(&v->raft) == IDA_RAFT_LEADER) {
        return;
    }
    if (v->up && ida_raft_voters(&v->raft)->n > 0 &&
        ida_raft_conf_slot(ida_raft_voters(&v->raft), v->id) >= 0) {
        /* It lost leadership before the removal committed (the entry may
         * be gone): it stays a member. */
        s->retire = 0;
        return;
    }
    if (v->up) {
        node_crash(s, v);
    }
    v->dead = true;
    s->retire = 0;
}

static void fault(struct sim *s)
{
    unsigned k = (unsigned)below(&s->rng, 100);
    int a = (int)below(&s->rng, (uint64_t)s->n);
    struct node *ld = find_leader(s);
    hash_in(s, 10, k, (uint64_t)a, 0);
    if (k < 18) {
        if (s->nodes[a].up) {
            node_crash(s, &s->nodes[a]);
            /* Quick restarts put a node back into the same election. */
            s->nodes[a].restart_at =
                s->now + (chance(&s->rng, 50) ? 5 + below(&s->rng, 100)
                                              : 100 + below(&s->rng, 1500));
        }
    } else if (k < 32) {
        if (ld != NULL) {
            int l = node_slot(s, ld->id);
            for (int b = 0; b < s->n; b++) {
                block(s, l, b);
                block(s, b, l);
            }
            tracef(s, "fault: isolate leader %u", ld->id);
        }
    } else if (k < 42) {
        bool side[NODES_MAX];
        for (int b = 0; b < s->n; b++) {
            side[b] = chance(&s->rng, 50);
        }
        split(s, side);
        tracef(s, "fault: random partition");
    } else if (k < 50) {
        /* Bridge: two halves, node a talks to both. */
        bool side[NODES_MAX];
        for (int b = 0; b < s->n; b++) {
            side[b] = b < s->n / 2;
        }
        split(s, side);
        for (int b = 0; b < s->n; b++) {
            s->blocked[a][b] = s->blocked[b][a] = false;
        }
        tracef(s, "fault: bridge through node %d", a + 1);
    } else if (k < 58) {
        int b = (int)below(&s->rng, (uint64_t)s->n);
        block(s, a, b);
        tracef(s, "fault: asymmetric %d->%d cut", a + 1, b + 1);
    } else if (k < 76) {
        heal_links(s);
        tracef(s, "fault: heal partitions");
    } else if (k < 86) {
        s->loss_pct = (unsigned)below(&s->rng, 30);
        s->dup_pct = (unsigned)below(&s->rng, 10);
        s->delay_max_ms = 1 + (unsigned)below(&s->rng, 30);
        tracef(s, "fault: loss %u%% dup %u%% delay <= %ums", s->loss_pct,
               s->dup_pct, s->delay_max_ms);
    } else if (k < 92) {
        if (ld != NULL) {
            int rv = ida_raft_transfer(&ld->raft, (ida_node_id)(a + 1));
            tracef(s, "fault: transfer %u -> %d: %s", ld->id, a + 1,
                   rv ? idalloc_errname(rv) : "ok");
            drain(s, ld);
        }
    } else if (k < 98) {
        if (ld != NULL && s->retire == 0) {
            membership_change(s, ld);
        }
    } else {
        restart_all(s);
    }
    s->next_fault = s->now + 20 + below(&s->rng, 400);
}

static void heal(struct sim *s)
{
    tracef(s, "heal: all faults end");
    s->healed_at = s->now;
    s->faults_on = false;
    heal_links(s);
    s->loss_pct = 0;
    s->dup_pct = 0;
    s->delay_max_ms = 5;
    restart_all(s);
    s->next_fault = NEVER;
}

static bool liveness_done(struct sim *s)
{
    struct node *ld = find_leader(s);
    if (ld == NULL) {
        return false;
    }
    /* The leader knows the commit index (an entry of its term committed)
     * and applied it. */
    ida_index c = ida_raft_commit(&ld->raft);
    if (ida_raft_term_at(&ld->raft, c) != ida_raft_term(&ld->raft) ||
        ld->fsm.applied < c) {
        return false;
    }
    for (int k = 0; k < CLIENTS; k++) {
        if (!s->clients[k].done_after_heal) {
            return false;
        }
    }
    return true;
}

static void liveness_final_check(struct sim *s)
{
    struct node *ld = find_leader(s);
    IDA_ASSERT(ld != NULL);
    /* Nothing acknowledged is lost: the leader applied everything up to a
     * commit index of its own term, which covers every acknowledged
     * write (leader completeness), so its counter covers every acked id. */
    if (ld->fsm.counter < s->max_acked_id) {
        violation(s, "leader %u counter %" PRIu64 " < acked id %" PRIu64,
                  ld->id, ld->fsm.counter, s->max_acked_id);
    }
}

/* --- main loop ------------------------------------------------------------ */

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t next_time(struct sim *s)
{
    uint64_t t = min_u64(s->next_fault, s->heal_at);
    for (int k = 0; k < s->n; k++) {
        struct node *nd = &s->nodes[k];
        if (nd->up) {
            t = min_u64(t, min_u64(nd->next_tick, nd->sync_at));
        } else if (!nd->dead) {
            t = min_u64(t, nd->restart_at);
        }
    }
    for (size_t i = 0; i < s->n_net; i++) {
        t = min_u64(t, s->net[i].at);
    }
    for (int c = 0; c < CLIENTS; c++) {
        t = min_u64(t, s->clients[c].next_at);
        if (s->clients[c].busy) {
            t = min_u64(t, s->clients[c].timeout_at);
        }
    }
    return t;
}

static void deliver_due(struct sim *s)
{
    for (;;) {
        /* The due packet with the lowest sequence number first. */
        size_t best = s->n_net;
        for (size_t i = 0; i < s->n_net; i++) {
            if (s->net[i].at <= s->now &&
                (best == s->n_net || s->net[i].seq < s->net[best].seq)) {
                best = i;
            }
        }
        if (best == s->n_net || s->failed || s->oom) {
            return;
        }
        struct packet p = s->net[best];
        s->net[best] = s->net[--s->n_net];
        struct node *nd = &s->nodes[node_slot(s, p.m.to)];
        hash_in(s, 11, p.m.from, p.m.to,
                (uint64_t)p.m.type * 1000003 + p.m.term);
        if (nd->up) {
            if (p.m.type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
                s->res->snapshots_sent++;
            } else if (p.m.type == IDA_RAFT_MSG_TIMEOUT_NOW) {
                s->res->transfers++;
            }
            if (s->o.trace != NULL) {
                char d[160];
                tracef(s, "deliver %s", msg_desc(&p.m, d, sizeof(d)));
            }
            node_step(s, nd, &p.m);
        }
        packet_free(&p);
    }
}

static void run_instant(struct sim *s, uint64_t deadline)
{
    if (s->now >= s->heal_at) {
        s->heal_at = NEVER;
        heal(s);
        (void)deadline;
    }
    if (s->now >= s->next_fault) {
        fault(s);
    }
    for (int k = 0; k < s->n && !s->failed; k++) {
        struct node *nd = &s->nodes[k];
        if (!nd->up && !nd->dead && s->now >= nd->restart_at) {
            tracef(s, "node %u restart", nd->id);
            hash_in(s, 12, nd->id, 0, 0);
            if (node_start(s, nd) != 0) {
                s->oom = true;
                return;
            }
            drain(s, nd);
        }
        if (nd->up && s->now >= nd->sync_at) {
            node_sync(s, nd);
        }
    }
    deliver_due(s);
    retire_removed_leader(s);
    for (int k = 0; k < s->n && !s->failed; k++) {
        struct node *nd = &s->nodes[k];
        if (nd->up && s->now >= nd->next_tick) {
            nd->next_tick += TICK_MS;
            ida_raft_tick(&nd->raft);
            drain(s, nd);
        }
    }
    for (int c = 0; c < CLIENTS && !s->failed; c++) {
        client_tick(s, c);
    }
}

static void sim_free(struct sim *s)
{
    for (int k = 0; k < s->n; k++) {
        struct node *nd = &s->nodes[k];
        for (size_t i = 0; i < nd->n_writes; i++) {
            write_free(&nd->writes[i]);
        }
        ida_free(nd->writes);
        if (nd->up) {
            ida_raft_close(&nd->raft);
        }
        disk_free_entries_from(&nd->disk, 0);
        ida_free(nd->disk.ents);
        ida_free(nd->disk.snap);
        ida_free(nd->disk.snap_conf);
    }
    for (size_t i = 0; i < s->n_net; i++) {
        packet_free(&s->net[i]);
    }
    ida_free(s->net);
    for (int c = 0; c < CLIENTS; c++) {
        ida_free(s->clients[c].answers);
    }
    ida_free(s->glob_term);
    ida_free(s->glob_hash);
    ida_free(s->glob_counter);
    ida_free(s->leaders);
    ida_free(s->lm);
    ida_free(s->ids_seen);
}

uint64_t sim_default_duration_ms(enum sim_mode mode)
{
    return mode == SIM_LIVENESS ? 5000 : 10000;
}

int sim_run(const struct sim_opts *opts, struct sim_result *res)
{
    struct sim *s = ida_calloc(1, sizeof(*s));
    if (s == NULL) {
        return IDA_ENOMEM;
    }
    memset(res, 0, sizeof(*res));
    s->o = *opts;
    s->res = res;
    s->rng = opts->seed * 0xD1B54A32D192ED03ULL + 1;
    s->n = opts->nodes;
    s->n_boot = opts->nodes;
    IDA_ASSERT(s->n >= 1 && s->n <= 5);
    uint64_t dur = opts->duration_ms ? opts->duration_ms
                                     : sim_default_duration_ms(opts->mode);
    s->delay_max_ms = 5;
    s->next_fault = 100 + below(&s->rng, 300);
    s->heal_at = opts->mode == SIM_LIVENESS ? dur : NEVER;
    s->healed_at = NEVER;
    s->faults_on = true;
    s->pre_vote = chance(&s->rng, 70);
    s->check_quorum = chance(&s->rng, 70);
    uint64_t end = opts->mode == SIM_LIVENESS ? dur + LIVENESS_BOUND_MS : dur;
    for (int k = 0; k < s->n; k++) {
        s->nodes[k].id = (ida_node_id)(k + 1);
        if (node_start(s, &s->nodes[k]) != 0) {
            s->oom = true;
        }
    }
    for (int c = 0; c < CLIENTS; c++) {
        s->clients[c].target = (int)below(&s->rng, (uint64_t)s->n);
        s->clients[c].next_at = 50 + below(&s->rng, 100);
    }
    while (!s->failed && !s->oom) {
        uint64_t t = next_time(s);
        if (t > end) {
            s->now = end;
            break;
        }
        s->now = t;
        run_instant(s, end);
        if (opts->mode == SIM_LIVENESS && s->heal_at == NEVER &&
            liveness_done(s)) {
            liveness_final_check(s);
            break;
        }
    }
    if (!s->failed && !s->oom && opts->mode == SIM_LIVENESS && s->now >= end) {
        violation(s, "liveness: %s %ums after the faults healed",
                  find_leader(s) == NULL ? "no leader"
                                         : "client requests still pending",
                  LIVENESS_BOUND_MS);
    }
    res->end_ms = s->now;
    res->ok = !s->failed && !s->oom;
    if (s->oom && !s->failed) {
        snprintf(res->violation, sizeof(res->violation), "out of memory");
    }
    bool oom = s->oom && !s->failed;
    sim_free(s);
    ida_free(s);
    return oom ? IDA_ENOMEM : 0;
}
