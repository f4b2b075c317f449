/* The invariant checks run after every event (the list is in
 * tests/sim/sim.c). */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/sim/sim_internal.h"

static bool glob_reserve(struct sim *s, size_t need)
{
    size_t c1 = s->glob_cap, c2 = s->glob_cap, c3 = s->glob_cap;
    size_t c4 = s->glob_cap;
    s->glob_term = sim__grow(s, s->glob_term, &c1, need + 1, sizeof(ida_term));
    s->glob_hash = sim__grow(s, s->glob_hash, &c2, need + 1, sizeof(uint64_t));
    s->glob_chain =
        sim__grow(s, s->glob_chain, &c3, need + 1, sizeof(uint64_t));
    s->glob_snap = sim__grow(s, s->glob_snap, &c4, need + 1, sizeof(uint64_t));
    s->glob_cap = c1;
    return s->glob_term != NULL && s->glob_hash != NULL &&
           s->glob_chain != NULL && s->glob_snap != NULL;
}

void sim__lm_check(struct sim *s, struct node *nd, const struct ida_entry *e)
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
    uint64_t hash = sim__entry_hash(e);
    size_t h =
        (size_t)((e->index * 31 + e->term) * 0x9E3779B97F4A7C15ULL >> 7) %
        s->lm_cap;
    while (s->lm[h].term != 0) {
        if (s->lm[h].index == e->index && s->lm[h].term == e->term) {
            /* prev == 0 when the previous entry was compacted away. */
            if (s->lm[h].hash != hash ||
                (prev != 0 && s->lm[h].prev_term != prev)) {
                sim__violation(s,
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

void sim__check_leader(struct sim *s, struct node *nd)
{
    ida_term t = ida_raft_term(&nd->raft);
    s->leaders = sim__grow(s, s->leaders, &s->cap_leaders, (size_t)t + 1,
                           sizeof(*s->leaders));
    if (s->leaders == NULL) {
        return;
    }
    if (s->leaders[t] == 0) {
        s->leaders[t] = nd->id;
        s->res->elections++;
        sim__tracef(s, "node %u leader of term %" PRIu64, nd->id, t);
    } else if (s->leaders[t] != nd->id) {
        sim__violation(s,
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
            sim__violation(s,
                           "leader completeness: leader %u term %" PRIu64
                           " has term %" PRIu64
                           " at committed index %zu "
                           "(committed term %" PRIu64 ")",
                           nd->id, t, have, i, s->glob_term[i]);
            return;
        }
        if (have == 0 && i > ida_raft_last_index(&nd->raft)) {
            sim__violation(s,
                           "leader completeness: leader %u term %" PRIu64
                           " lacks committed index %zu",
                           nd->id, t, i);
            return;
        }
    }
}

void sim__check_commit(struct sim *s, struct node *nd)
{
    ida_index c = ida_raft_commit(&nd->raft);
    if (c < nd->last_commit) {
        sim__violation(
            s, "node %u commit index went back from %" PRIu64 " to %" PRIu64,
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
                s->glob_hash[i] != sim__entry_hash(e)) {
                sim__violation(s,
                               "node %u committed index %" PRIu64
                               " term %" PRIu64
                               ", the cluster committed term "
                               "%" PRIu64 " there",
                               nd->id, i, e->term, s->glob_term[i]);
                return;
            }
        } else {
            if (i > s->glob_len + 1) {
                sim__violation(s,
                               "node %u committed %" PRIu64 " past unknown %zu",
                               nd->id, i, s->glob_len + 1);
                return;
            }
            s->glob_term[i] = e->term;
            s->glob_hash[i] = sim__entry_hash(e);
            s->glob_len = (size_t)i;
        }
    }
    if (ida_raft_role(&nd->raft) == IDA_RAFT_LEADER) {
        /* Commit durability: the entry is on the disks of a majority of
         * the voters the leader counts. */
        const struct ida_raft_conf *v = ida_raft_voters(&nd->raft);
        size_t have = 0;
        for (size_t k = 0; k < v->n; k++) {
            /* The disk of the incarnation the membership binds: an
             * acknowledgement of an incarnation whose disk was emptied
             * since counts with the image it had. */
            const struct node *u = &s->nodes[sim__node_slot(s, v->voters[k])];
            const struct disk *d = &u->disk;
            if (v->voter_inc[k] != 0 && v->voter_inc[k] != u->inc) {
                if (v->voter_inc[k] != u->lost_inc) {
                    continue;
                }
                d = &u->lost;
            }
            if (d->snap_index >= c ||
                sim__disk_term_at(d, c) == s->glob_term[c]) {
                have++;
            } else if (d == &u->disk && u->has_rolled &&
                       (u->rolled.snap_index >= c ||
                        sim__disk_term_at(&u->rolled, c) == s->glob_term[c])) {
                have++; /* acknowledged before its disk went back */
            }
        }
        if (have < v->n / 2 + 1) {
            sim__violation(s,
                           "leader %u committed index %" PRIu64
                           " durable on only %zu of %zu voters' disks",
                           nd->id, c, have, v->n);
        }
    }
    nd->last_commit = c;
}
