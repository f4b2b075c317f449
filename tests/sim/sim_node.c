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
        if (r->index != 0 && nd->fsm.applied >= r->index) {
            sim__client_read_answer(s, r->client,
                                    r->ctx & ((1ULL << CTX_SHIFT) - 1),
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
        sim__violation(
            s, "node %u asked to apply index %" PRIu64 " after %" PRIu64,
            nd->id, e->index, nd->fsm.applied);
        return;
    }
    uint64_t id = sim__fsm_apply(&nd->fsm, e);
    size_t i = (size_t)e->index;
    sim__hash_in(s, 4, nd->id, i, id);
    if (i > s->glob_len || s->glob_term[i] != e->term ||
        s->glob_hash[i] != sim__entry_hash(e)) {
        sim__violation(s,
                       "node %u applied index %zu term %" PRIu64
                       " that is not the committed entry",
                       nd->id, i, e->term);
        return;
    }
    if (i <= s->glob_applied) {
        if (s->glob_counter[i] != nd->fsm.counter) {
            sim__violation(s, "node %u state after index %zu differs", nd->id,
                           i);
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
            sim__client_answer(s, p->client, p->seq, id);
        } else {
            sim__client_retry(s, p->client, 0); /* lost: unknown outcome */
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
    if (sim__disk_term_at(d, at) != t) {
        sim__violation(s, "node %u applied index %" PRIu64 " is not durable",
                       nd->id, at);
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
    sim__tracef(s, "node %u snapshot at %" PRIu64, nd->id, at);
}

static void restore_fsm(struct sim *s,
                        struct node *nd,
                        const uint8_t *data,
                        size_t len,
                        ida_index index)
{
    if (len != sizeof(nd->fsm)) {
        sim__violation(s, "node %u snapshot of %zu bytes", nd->id, len);
        return;
    }
    memcpy(&nd->fsm, data, len);
    if (nd->fsm.applied != index) {
        sim__violation(
            s, "node %u snapshot index %" PRIu64 " holds state of %" PRIu64,
            nd->id, index, nd->fsm.applied);
    }
    if (index <= s->glob_applied && s->glob_counter[index] != nd->fsm.counter) {
        sim__violation(s,
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
    for (size_t i = 0; i < b->n_entries; i++) {
        sim__lm_check(s, nd, &b->entries[i]);
    }
    for (size_t i = 0; i < b->n_msgs; i++) {
        struct packet p;
        if (!sim__packet_copy(&p, &b->msgs[i])) {
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
    for (int guard = 0; guard < 16 && !s->failed && !s->oom; guard++) {
        sim__check_commit(s, nd);
        if (ida_raft_role(&nd->raft) == IDA_RAFT_LEADER) {
            sim__check_leader(s, nd);
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
    if (rv == IDA_EFOREIGN) {
        /* Another incarnation of a member (raft/admission.h A2). */
        s->res->foreign++;
        sim__hash_in(s, 14, nd->id, m->from, m->from_inc);
        sim__tracef(s,
                    "node %u dropped a message of %u's incarnation %016" PRIx64,
                    nd->id, m->from, m->from_inc);
    } else if (rv == IDA_EPROTO || rv == IDA_EINVAL) {
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
    sim__drain(s, nd);
    sim__serve_reads(s, nd);
}

int sim__node_start(struct sim *s, struct node *nd)
{
    struct ida_raft_config cfg = {
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
        .snapshot_chunk_bytes = 40,
        .conf_decode = node_conf_decode,
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
    ida_raft_testing_set_bugs(&nd->raft, s->o.bugs);
    memset(&nd->fsm, 0, sizeof(nd->fsm));
    if (d->snap_index > 0) {
        restore_fsm(s, nd, d->snap, d->snap_len, d->snap_index);
    }
    nd->up = true;
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
    for (size_t i = 0; i < nd->n_writes; i++) {
        if (i < keep) {
            sim__disk_apply(s, nd, &nd->writes[i]);
        }
        sim__write_free(&nd->writes[i]);
    }
    nd->n_writes = 0;
    sim__hash_in(s, 8, nd->id, keep, 0);
    sim__tracef(s, "node %u crash (kept %zu unsynced writes)", nd->id, keep);
    nd->n_props = 0; /* their clients time out and retry */
    nd->n_reads = 0;
    ida_raft_close(&nd->raft);
    nd->up = false;
    nd->sync_at = NEVER;
    nd->next_tick = NEVER;
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
    nd->lost = nd->disk;
    nd->lost_inc = nd->inc;
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
