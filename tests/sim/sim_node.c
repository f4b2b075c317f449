/* Simulated nodes: the node runtime around one Raft core (batches,
 * sync, apply, snapshots, crash and restart). */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "raft/testing.h"
#include "src/node/convert.h"
#include "tests/sim/sim_internal.h"

static void fail_pending(struct sim *s, struct node *nd)
{
    for (size_t i = 0; i < nd->n_props; i++) {
        sim__client_retry(s, nd->props[i].client, 0);
    }
    nd->n_props = 0;
    for (size_t i = 0; i < nd->n_reads; i++) {
        sim__client_retry(s, nd->reads[i].client, 0);
        sim__tracef(s, "node %u read of client %d failed: leadership lost",
                    nd->id, nd->reads[i].client);
    }
    nd->n_reads = 0;
}

void sim__serve_reads(struct sim *s, struct node *nd)
{
    size_t k = 0;
    for (size_t i = 0; i < nd->n_reads; i++) {
        struct pread *r = &nd->reads[i];
        if (r->index != 0 && ida_fsm_applied_index(nd->fsm) >= r->index) {
            int ci = r->client;
            uint64_t seq = r->ctx & ((1ULL << CTX_SHIFT) - 1);
            const struct client *c = &s->clients[ci];
            if (c->busy && c->is_read && c->seq == seq) {
                char tag[32];
                uint64_t id = 0;
                sim__tag_name(tag, sizeof(tag), ci, c->req.tag);
                int rv = ida_fsm_lookup(nd->fsm, "b", tag, &id);
                sim__client_read_answer(s, ci, seq, rv, id);
            }
        } else {
            nd->reads[k++] = *r;
        }
    }
    nd->n_reads = k;
}

/* The state after index @i is the global one: the chain of results, and at
 * every snapshot the snapshot bytes (canonical: equal states, equal
 * bytes). */
static void check_state(struct sim *s, struct node *nd, size_t i)
{
    if (i <= s->glob_applied) {
        if (s->glob_chain[i] != nd->chain) {
            sim__violation(s,
                           "node %u's results up to index %zu differ from "
                           "the cluster's",
                           nd->id, i);
        }
    } else {
        IDA_ASSERT(i == s->glob_applied + 1);
        s->glob_chain[i] = nd->chain;
        s->glob_snap[i] = 0;
        s->glob_applied = i;
    }
}

/* Record or compare the snapshot hash @h of the state at index @i. */
static void check_snap(struct sim *s, struct node *nd, size_t i, uint64_t h)
{
    if (!sim__raft_checks(s) || i > s->glob_applied) {
        return;
    }
    if (s->glob_snap[i] == 0) {
        s->glob_snap[i] = h;
    } else if (s->glob_snap[i] != h) {
        sim__violation(s,
                       "node %u's state at index %zu differs from another "
                       "node's state there",
                       nd->id, i);
    }
}

static void apply_entry(struct sim *s,
                        struct node *nd,
                        const struct ida_entry *e)
{
    ida_index applied = ida_fsm_applied_index(nd->fsm);
    if (e->index != applied + 1) {
        sim__violation(
            s, "node %u asked to apply index %" PRIu64 " after %" PRIu64,
            nd->id, e->index, applied);
        return;
    }
    struct ida_fsm_applied out;
    int rv = ida_fsm_apply(nd->fsm, e->index, e->type, e->data, e->len, &out);
    if (rv == IDA_ENOMEM) {
        s->oom = true;
        return;
    }
    if (rv != 0 || out.entry_error != 0) {
        sim__violation(s, "node %u applying index %" PRIu64 ": %s", nd->id,
                       e->index, idalloc_errname(rv ? rv : out.entry_error));
        return;
    }
    for (size_t k = 0; k < out.count; k++) {
        uint64_t h = sim__result_hash(&out.replies[k].result);
        nd->chain = (nd->chain ^ h) * 0x100000001B3ULL + e->index;
    }
    size_t i = (size_t)e->index;
    sim__hash_in(s, 4, nd->id, i, nd->chain);
    if (sim__raft_checks(s)) {
        if (i > s->glob_len || s->glob_term[i] != e->term ||
            s->glob_hash[i] != sim__entry_hash(e)) {
            sim__violation(s,
                           "node %u applied index %zu term %" PRIu64
                           " that is not the committed entry",
                           nd->id, i, e->term);
            return;
        }
        check_state(s, nd, i);
    }
    for (size_t k = 0; k < nd->n_props; k++) {
        struct proposal *p = &nd->props[k];
        if (p->index != e->index) {
            continue;
        }
        if (p->term == e->term) {
            uint8_t cid[IDA_CLIENT_ID_BYTES];
            sim__client_id(p->client, cid);
            const struct ida_fsm_reply *rep = NULL;
            for (size_t j = 0; j < out.count; j++) {
                if (out.replies[j].request_seq == p->seq &&
                    memcmp(out.replies[j].client_id, cid, sizeof(cid)) == 0) {
                    rep = &out.replies[j];
                }
            }
            if (rep == NULL) {
                sim__violation(s,
                               "node %u: entry %" PRIu64
                               " of its proposal has no answer for it",
                               nd->id, e->index);
                return;
            }
            sim__client_answer(s, p->client, p->seq, &rep->result);
        } else {
            sim__client_retry(s, p->client, 0); /* lost: unknown outcome */
        }
        nd->props[k] = nd->props[--nd->n_props];
        break;
    }
}

/* Odd-numbered nodes keep their snapshot's bytes on their disk only, as
 * idallocd does (raft.h contract 7): the core compacts and restarts with
 * none and their InstallSnapshot chunks are filled from the disk when sent
 * (fill_chunk()); even-numbered ones hand the core a copy. A cluster runs
 * both ways at once. */
static bool host_keeps_snapshot(const struct node *nd)
{
    return nd->id % 2 == 1;
}

/* Fill an InstallSnapshot chunk the core sent without bytes from @nd's
 * disk, into @m. False (the chunk is dropped, as storage does) when the
 * disk holds another snapshot than the chunk's. */
static bool fill_chunk(struct sim *s,
                       const struct node *nd,
                       struct ida_raft_msg *m)
{
    struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
    const struct disk *d = &nd->disk;
    if (!host_keeps_snapshot(nd) && sim__raft_checks(s)) {
        sim__violation(s, "node %u sent a chunk without bytes", nd->id);
    }
    if (d->snap_index != is->last_index || d->snap_term != is->last_term ||
        d->snap_len != is->total_size || is->offset > d->snap_len ||
        is->len > d->snap_len - is->offset) {
        s->chunks_unfilled++;
        return false;
    }
    is->data = d->snap + is->offset;
    return true;
}

static void take_snapshot(struct sim *s, struct node *nd)
{
    struct disk *d = &nd->disk;
    ida_index at = ida_fsm_applied_index(nd->fsm);
    if (at < d->snap_index + SNAPSHOT_EVERY || at <= nd->raft.snap_index) {
        return;
    }
    ida_term t = ida_raft_term_at(&nd->raft, at);
    uint8_t *data;
    size_t len;
    if (ida_fsm_snapshot(nd->fsm, &data, &len) != 0) {
        s->oom = true;
        return;
    }
    check_snap(s, nd, (size_t)at, sim__bytes_hash(data, len));
    /* The application stores its snapshot durably first, then tells the
     * core; storage drops the log it covers. */
    if (sim__disk_term_at(d, at) != t) {
        if (sim__raft_checks(s)) {
            sim__violation(s,
                           "node %u applied index %" PRIu64 " is not durable",
                           nd->id, at);
        }
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
    d->snap_len = len;
    d->snap_index = at;
    d->snap_term = t;
    int rv = ida_raft_compact(&nd->raft, at,
                              host_keeps_snapshot(nd) ? NULL : data, len);
    if (rv != 0) {
        sim__violation(s, "node %u compact at %" PRIu64 ": %s", nd->id, at,
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
    sim__hash_in(s, 5, nd->id, at, t);
    sim__tracef(s, "node %u snapshot at %" PRIu64 " (%zu bytes)", nd->id, at,
                len);
}

static void restore_fsm(struct sim *s,
                        struct node *nd,
                        const uint8_t *data,
                        size_t len,
                        ida_index index)
{
    int rv = ida_fsm_restore(nd->fsm, data, len);
    if (rv == IDA_ENOMEM) {
        s->oom = true;
        return;
    }
    if (rv != 0) {
        sim__violation(s,
                       "node %u snapshot at %" PRIu64 " does not restore: %s",
                       nd->id, index, idalloc_errname(rv));
        return;
    }
    if (ida_fsm_applied_index(nd->fsm) != index) {
        sim__violation(
            s, "node %u snapshot index %" PRIu64 " holds state of %" PRIu64,
            nd->id, index, ida_fsm_applied_index(nd->fsm));
        return;
    }
    check_snap(s, nd, (size_t)index, sim__bytes_hash(data, len));
    /* The results before the snapshot are the cluster's (checked above
     * through the state they produced). */
    nd->chain = sim__raft_checks(s) && index <= s->glob_applied
                    ? s->glob_chain[index]
                    : 0;
}

/* The node's check of a snapshot from the leader (the node's
 * snapshot_check: a scratch state machine restores it). The simulator's
 * snapshots are honest: a refusal is a violation. */
static int snapshot_check(void *arg,
                          ida_index index,
                          ida_term term,
                          const uint8_t *data,
                          size_t len)
{
    struct node *nd = arg;
    struct sim *s = nd->sim;
    struct ida_fsm *f = NULL;
    int rv = ida_fsm_new(&f);
    if (rv == 0) {
        rv = ida_fsm_restore(f, data, len);
    }
    ida_index held = rv == 0 ? ida_fsm_applied_index(f) : 0;
    ida_fsm_free(f);
    if (rv == IDA_ENOMEM) {
        s->oom = true;
    } else if (rv != 0) {
        sim__violation(s, "a snapshot of %zu bytes from a leader: %s", len,
                       idalloc_errname(rv));
    } else if (held != index) {
        /* The node refuses it (src/node/raft_snap.c, ida__rp_snapshot_check).
         */
        sim__violation(s,
                       "a snapshot at index %" PRIu64
                       " from a leader holds the state of %" PRIu64,
                       index, held);
        rv = IDA_ECORRUPT;
    }
    if (nd->disk.boots / 2 % 2 == 1) {
        /* Checked outside the core: the verdict comes later, while the node
         * goes on hearing heartbeats, voting and ticking (sim__node_checked()).
         * Within two ticks; while faults run, one in four takes up to three
         * election timeouts (a slow disk or CPU), long enough for elections
         * to move the term on under it. Healed, checks are quick again: a
         * check slower than the leader's snapshots come (every 24 entries
         * here) would have a node chase snapshots for ever. */
        uint64_t most = s->faults_on && sim__chance(&s->rng, 25)
                            ? 3 * ELECTION_TICKS * TICK_MS
                            : 2 * TICK_MS;
        nd->check_at = s->now + 1 + sim__below(&s->rng, most);
        nd->check_index = index;
        nd->check_term = term;
        nd->check_rv = rv;
        nd->check_hash = sim__bytes_hash(data, len);
        sim__tracef(s,
                    "node %u checks the snapshot at %" PRIu64 " until %" PRIu64,
                    nd->id, index, nd->check_at);
        return IDA_RAFT_CHECK_PENDING;
    }
    return rv;
}

void sim__node_checked(struct sim *s, struct node *nd)
{
    nd->check_at = NEVER;
    s->res->checks_later++;
    if (sim__raft_checks(s) &&
        sim__bytes_hash(nd->raft.rcv_data, nd->raft.rcv_len) !=
            nd->check_hash) {
        sim__violation(s,
                       "node %u: the snapshot bytes under check changed "
                       "before the verdict",
                       nd->id);
        return;
    }
    int rv = ida_raft_snapshot_checked(&nd->raft, nd->check_index,
                                       nd->check_term, nd->check_rv);
    s->res->checks_stale += rv == IDA_RAFT_CHECK_STALE;
    sim__hash_in(s, 22, nd->id, nd->check_index, (uint64_t)rv);
    sim__tracef(s,
                "node %u: the check of the snapshot at %" PRIu64 " ends (%s)",
                nd->id, nd->check_index,
                rv == 0                      ? "ok"
                : rv == IDA_RAFT_CHECK_STALE ? "stale: nothing installed"
                                             : idalloc_errname(rv));
    if (rv == IDA_EPROTO && sim__raft_checks(s)) {
        sim__violation(s, "node %u refused an honest snapshot", nd->id);
    }
    sim__drain(s, nd);
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
            if (!sim__packet_copy(&w->msgs[i], &b->msgs_after_persist[i])) {
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
    sim__hash_in(s, 6, nd->id, b->id, b->n_entries * 1000 + b->n_msgs);
    for (size_t i = 0; i < b->n_entries && sim__raft_checks(s); i++) {
        sim__lm_check(s, nd, &b->entries[i]);
    }
    for (size_t i = 0; i < b->n_msgs; i++) {
        struct packet p;
        struct ida_raft_msg m = b->msgs[i];
        if (m.type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
            m.u.install_snapshot.data == NULL && m.u.install_snapshot.len > 0 &&
            !fill_chunk(s, nd, &m)) {
            continue;
        }
        if (!sim__packet_copy(&p, &m)) {
            s->oom = true;
            return;
        }
        sim__net_send(s, &p);
    }
    if (b->id != 0) {
        nd->writes = sim__grow(s, nd->writes, &nd->cap_writes, nd->n_writes + 1,
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
            nd->sync_at = s->now + 1 + sim__below(&s->rng, 8);
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
    sim__serve_reads(s, nd);
    if (b->n_committed > 0) {
        take_snapshot(s, nd);
    }
}

/* Drain the core's work and check the invariants. */
void sim__drain(struct sim *s, struct node *nd)
{
    struct ida_raft_batch b;
    /* Compacted entries freed a few at a time, as the node does (raft.h,
     * MEMORY): whatever waits must never be read again. */
    (void)ida_raft_release(&nd->raft, 8);
    for (int guard = 0; guard < 16 && !s->failed && !s->oom; guard++) {
        if (sim__raft_checks(s)) {
            sim__check_commit(s, nd);
        }
        if (ida_raft_role(&nd->raft) == IDA_RAFT_LEADER) {
            if (sim__raft_checks(s)) {
                sim__check_leader(s, nd);
            }
        } else if (nd->last_role == IDA_RAFT_LEADER) {
            fail_pending(s, nd); /* fail fast: leadership lost */
        }
        if (nd->last_role != ida_raft_role(&nd->raft)) {
            sim__tracef(s, "node %u is %s in term %" PRIu64, nd->id,
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

void sim__node_step(struct sim *s,
                    struct node *nd,
                    const struct ida_raft_msg *m)
{
    int rv = ida_raft_step(&nd->raft, m);
    if (rv == IDA_ELOSTSTATE) {
        /* Rule A4: a peer told it its state went back. The real node marks
         * its directory untrusted and stops; the operator empties it. */
        struct ida_raft_rollback rb;
        ida_raft_rolled_back(&nd->raft, &rb);
        if (!s->o.rollback) {
            sim__violation(s,
                           "false alarm: node %u told by %u that its state "
                           "went back (kind %d: told %" PRIu64 ", has %" PRIu64
                           ") with no disk put back",
                           nd->id, m->from, (int)rb.kind, rb.told, rb.have);
            return;
        }
        s->res->rollbacks_caught++;
        sim__hash_in(s, 21, nd->id, m->from, rb.kind);
        sim__tracef(s,
                    "node %u learns from %u that its state went back "
                    "(kind %d: told %" PRIu64 ", has %" PRIu64 "): it stops",
                    nd->id, m->from, (int)rb.kind, rb.told, rb.have);
        sim__node_crash(s, nd);
        nd->untrusted = true;
        nd->restart_at = NEVER;
        return;
    }
    if (rv == IDA_EFOREIGN) {
        /* Another incarnation of a member (raft/admission.h A2). */
        s->res->foreign++;
        sim__hash_in(s, 14, nd->id, m->from, m->from_inc);
        sim__tracef(s,
                    "node %u dropped a message of %u's incarnation %016" PRIx64,
                    nd->id, m->from, m->from_inc);
    } else if (rv == IDA_EPROTO || rv == IDA_EINVAL) {
        if (!sim__raft_checks(s)) {
            sim__tracef(s, "node %u rejected a message from %u: %s", nd->id,
                        m->from, idalloc_errname(rv));
            sim__drain(s, nd);
            return;
        }
        sim__violation(s,
                       "node %u rejected a message from %u (type %d term "
                       "%" PRIu64 "): %s",
                       nd->id, m->from, m->type, m->term, idalloc_errname(rv));
    } else if (rv != 0) {
        s->oom = true;
    }
    sim__drain(s, nd);
}

void sim__node_sync(struct sim *s, struct node *nd)
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
        sim__disk_apply(s, nd, w);
        last_id = w->id;
    }
    sim__hash_in(s, 7, nd->id, last_id, n);
    if (s->o.rollback && sim__chance(&s->rng, 3)) {
        /* Keep a copy of the durable image: the "older copy of the disk"
         * a rollback restarts from. */
        sim__disk_free(&nd->old);
        nd->has_old = sim__disk_copy(&nd->old, &nd->disk);
        if (!nd->has_old) {
            s->oom = true;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct write *w = &nd->writes[i];
        for (size_t k = 0; k < w->n_msgs; k++) {
            if (w->msgs[k].m.type == IDA_RAFT_MSG_RESPONSE_VOTE &&
                w->msgs[k].m.u.response_vote.granted) {
                voted = true;
            }
            sim__net_send(s, &w->msgs[k]);
            memset(&w->msgs[k], 0, sizeof(w->msgs[k]));
        }
        sim__write_free(w);
    }
    if (snap != 0) {
        restore_fsm(s, nd, nd->disk.snap, nd->disk.snap_len, snap);
    }
    if (s->faults_on && sim__chance(&s->rng, voted ? 25 : 2)) {
        /* Crash point (FoundationDB's "buggify" style): right after an
         * fsync whose votes and acks went out, most often after a vote,
         * the moment a forgotten vote or an early ack would matter. */
        sim__tracef(s, "fault: node %u crashes right after a sync", nd->id);
        sim__node_crash(s, nd);
        nd->restart_at = s->now + 1 + sim__below(&s->rng, 50);
        return;
    }
    nd->n_writes = 0;
    ida_raft_persisted(&nd->raft, last_id);
    if (snap != 0 && host_keeps_snapshot(nd)) {
        ida_raft_snapshot_stored(&nd->raft, snap); /* the disk has it */
    }
    sim__drain(s, nd);
    sim__serve_reads(s, nd);
}

int sim__node_start(struct sim *s, struct node *nd)
{
    /* Rule A4: the start is counted on the disk before the node speaks. */
    nd->disk.boots++;
    struct ida_raft_config cfg = {
        .boot = nd->disk.boots << 32 | ((sim__rnd(&s->rng) & 0xffffffffu) | 1),
        .id = nd->id,
        .n_voters = nd->boot.n,
        .incarnation = nd->inc,
        .election_ticks = ELECTION_TICKS,
        .heartbeat_ticks = HEARTBEAT_TICKS,
        .seed = sim__rnd(&s->rng),
        .pre_vote = s->pre_vote,
        .check_quorum = s->check_quorum,
        .max_inflight = 4,
        .max_msg_entries = 8,
        /* Every other start caps an append at 100 bytes of entries (a few
         * commands): varied without drawing from the rng. */
        .max_msg_bytes = nd->disk.boots % 2 == 0 ? 0 : 100,
        /* And no bound on the appends one call sends, or 1 or 2. */
        .max_append_burst = (unsigned)(nd->disk.boots / 2 % 3),
        .snapshot_chunk_bytes = 64,
        .snapshot_max_inflight = 4,
        .conf_decode = node_conf_decode,
        .snapshot_check = snapshot_check,
        .snapshot_check_arg = nd,
    };
    IDA_ASSERT(nd->inc != 0 && nd->boot.n > 0 && !nd->needs_boot);
    for (size_t k = 0; k < nd->boot.n; k++) {
        cfg.voters[k] = nd->boot.voters[k];
        cfg.voter_inc[k] = nd->boot.voter_inc[k];
    }
    struct disk *d = &nd->disk;
    struct ida_raft_restore st = {
        .hard_state = d->hs,
        .snapshot_index = d->snap_index,
        .snapshot_term = d->snap_term,
        .snapshot_data = host_keeps_snapshot(nd) ? NULL : d->snap,
        .snapshot_in_storage = host_keeps_snapshot(nd) && d->snap_index > 0,
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
    ida_raft_testing_set_bugs(&nd->raft, s->o.bugs);
    rv = ida_fsm_new(&nd->fsm);
    if (rv != 0) {
        ida_raft_close(&nd->raft);
        return rv;
    }
    nd->chain = 0;
    if (d->snap_index > 0) {
        restore_fsm(s, nd, d->snap, d->snap_len, d->snap_index);
    }
    nd->up = true;
    nd->sim = s;
    nd->check_at = NEVER;
    nd->last_commit = ida_raft_commit(&nd->raft);
    nd->last_role = IDA_RAFT_FOLLOWER;
    nd->sync_at = NEVER;
    nd->next_tick = s->now + 1 + sim__below(&s->rng, TICK_MS);
    nd->restart_at = NEVER;
    return 0;
}

void sim__node_crash(struct sim *s, struct node *nd)
{
    /* Unsynced writes: all lost, or a random prefix reached the disk. */
    size_t keep = sim__chance(&s->rng, 50)
                      ? 0
                      : (size_t)sim__below(&s->rng, nd->n_writes + 1);
    /* ... and the next one may have, in part: its term and vote, and a
     * prefix of its entries (sim__disk_apply_part()). */
    size_t part = SIZE_MAX;
    if (keep < nd->n_writes && sim__chance(&s->rng, 25)) {
        part = (size_t)sim__below(&s->rng, nd->writes[keep].n_ents + 1);
    }
    for (size_t i = 0; i < nd->n_writes; i++) {
        if (i < keep) {
            sim__disk_apply(s, nd, &nd->writes[i]);
        } else if (i == keep && part != SIZE_MAX) {
            sim__disk_apply_part(s, nd, &nd->writes[i], part);
        }
        sim__write_free(&nd->writes[i]);
    }
    nd->n_writes = 0;
    sim__hash_in(s, 8, nd->id, keep, 0);
    sim__tracef(s, "node %u crash (kept %zu unsynced writes%s)", nd->id, keep,
                part != SIZE_MAX ? " and part of the next" : "");
    nd->n_props = 0; /* their clients time out and retry */
    nd->n_reads = 0;
    ida_raft_close(&nd->raft);
    ida_fsm_free(nd->fsm);
    nd->fsm = NULL;
    nd->up = false;
    nd->sync_at = NEVER;
    nd->next_tick = NEVER;
    nd->check_at = NEVER; /* the checking thread died with it */
    s->res->crashes++;
}

uint64_t sim__new_inc(struct sim *s)
{
    uint64_t inc;
    do {
        inc = sim__rnd(&s->rng);
    } while (inc == 0);
    return inc;
}

/* The disk is replaced: the node (crashed if it was up) comes back with an
 * empty data directory, a new incarnation and no bootstrap membership yet
 * (it learns one from a live peer when it restarts). */
void sim__node_wipe(struct sim *s, struct node *nd)
{
    if (nd->up) {
        sim__node_crash(s, nd);
    }
    sim__disk_free(&nd->lost);
    if (nd->has_rolled) {
        /* What the incarnation acknowledged from, not the copy. */
        nd->lost = nd->rolled;
        memset(&nd->rolled, 0, sizeof(nd->rolled));
        nd->has_rolled = false;
        sim__disk_free(&nd->disk);
    } else {
        nd->lost = nd->disk;
    }
    nd->lost_inc = nd->inc;
    nd->untrusted = false;
    memset(&nd->disk, 0, sizeof(nd->disk));
    sim__disk_free(&nd->old);
    nd->has_old = false;
    nd->inc = sim__new_inc(s);
    memset(&nd->boot, 0, sizeof(nd->boot));
    nd->needs_boot = true;
    s->res->wipes++;
    sim__hash_in(s, 15, nd->id, nd->inc, 0);
    sim__tracef(s, "node %u disk emptied: new incarnation %016" PRIx64, nd->id,
                nd->inc);
}
