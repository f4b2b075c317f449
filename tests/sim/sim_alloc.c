/* The allocator's invariants, checked on what the clients were answered
 * (struct sim_model in tests/sim/sim_internal.h):
 *  - bounded pool: an id acknowledged to one tag is never acknowledged to
 *    another while the first holds it (only a free of it, under way or
 *    answered, lets it go); a tag keeps its id (a later alloc answers it,
 *    "existed"); a free of a held id answers "freed", never "already free"
 *    or "held by another tag"; a lookup (ReadIndex) answers exactly the id
 *    the tag holds, or "not found" when it holds none;
 *  - sequence pool: acknowledged blocks never overlap, and have the size
 *    asked for;
 *  - prefix pool: a tag's prefix never changes; no prefix equals or starts
 *    another;
 *  - pool creates: exactly one "created" per pool;
 *  - after the faults healed (liveness mode): the leader holds every
 *    acknowledged holding, and every node at the leader's applied index has
 *    the leader's state, byte for byte.
 * Each client owns its tags and sends one request at a time, retrying it
 * with the same request_seq until answered, so every request before the
 * current one was answered and the model is exact for its own tags. */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/sim/sim_internal.h"

/* A violation found by the allocator checks (sim_result.alloc_violation). */
static void alloc_violation(struct sim *s, const char *fmt, ...)
{
    if (s->failed) {
        return;
    }
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    s->res->alloc_violation = true;
    sim__violation(s, "allocator: %s", buf);
}

bool sim__raft_checks(const struct sim *s)
{
    return !s->o.client_checks_only;
}

/* The next request of client @ci (not busy). The first three create the
 * pools; then reads are 20%, and writes pick an op. */
void sim__alloc_next_req(struct sim *s, int ci, struct sim_req *r)
{
    struct client *c = &s->clients[ci];
    memset(r, 0, sizeof(*r));
    if (c->seq < 3) {
        r->op = (enum sim_op)(SIM_OP_CREATE_BOUNDED + c->seq);
        return;
    }
    r->tag = (int)sim__below(&s->rng, TAGS);
    if (sim__chance(&s->rng, 20)) {
        r->op = SIM_OP_LOOKUP;
        return;
    }
    uint64_t k = sim__below(&s->rng, 100);
    if (k < 35) {
        r->op = SIM_OP_ALLOC;
    } else if (k < 55) {
        /* Free one of our holdings (its id and tag), if any. */
        r->op = SIM_OP_ALLOC;
        for (int i = 0; i < TAGS; i++) {
            int t = (r->tag + i) % TAGS;
            if (s->model.held[ci][t] != 0) {
                r->op = SIM_OP_FREE;
                r->tag = t;
                r->id = s->model.held[ci][t] - 1;
                break;
            }
        }
    } else if (k < 80) {
        r->op = SIM_OP_RESERVE;
        r->count = 1 + sim__below(&s->rng, RESERVE_MAX);
    } else {
        r->op = SIM_OP_PREFIX;
    }
}

/* Client @ci is freeing @id right now: its free may have been applied
 * already, so the id may be someone else's. */
static bool free_under_way(const struct sim *s, uint32_t owner, uint64_t id)
{
    int ci = (int)((owner - 1) / TAGS);
    const struct client *c = &s->clients[ci];
    return c->busy && !c->is_read && c->req.op == SIM_OP_FREE &&
           c->req.id == id && c->req.tag == (int)((owner - 1) % TAGS);
}

static void mark_sequence(struct sim *s, uint64_t id, int ci, uint64_t seq)
{
    size_t word = (size_t)(id / 64);
    size_t cap = s->ids_cap;
    s->ids_seen = sim__grow(s, s->ids_seen, &cap, word + 1, sizeof(uint64_t));
    s->ids_cap = cap;
    if (s->ids_seen == NULL) {
        return;
    }
    if (s->ids_seen[word] & (1ULL << (id % 64))) {
        alloc_violation(s,
                        "sequence id %" PRIu64
                        " handed out twice (client %d seq %" PRIu64 ")",
                        id, ci, seq);
    }
    s->ids_seen[word] |= 1ULL << (id % 64);
}

static void acked_alloc(struct sim *s,
                        int ci,
                        uint64_t seq,
                        const struct sim_req *r,
                        const struct ida_fsm_result *res)
{
    struct sim_model *m = &s->model;
    uint64_t had = m->held[ci][r->tag];
    if (res->error == IDA_EEXHAUSTED && had == 0) {
        return;
    }
    if (res->error != 0) {
        alloc_violation(s, "client %d seq %" PRIu64 " alloc c%d-t%d: %s%s", ci,
                        seq, ci, r->tag, idalloc_errname(res->error),
                        had ? " though the tag holds an id" : "");
        return;
    }
    uint64_t id = res->id;
    if (id >= BOUNDED_SIZE) {
        alloc_violation(s,
                        "client %d seq %" PRIu64 " alloc: id %" PRIu64
                        " outside the pool",
                        ci, seq, id);
        return;
    }
    if (had != 0) {
        if (had - 1 != id || !res->flag) {
            alloc_violation(s,
                            "tag c%d-t%d holds id %" PRIu64
                            " but alloc (seq %" PRIu64 ") answered %" PRIu64
                            " existed=%d: an acknowledged alloc was lost",
                            ci, r->tag, had - 1, seq, id, res->flag);
        }
        return;
    }
    if (res->flag) {
        alloc_violation(s,
                        "tag c%d-t%d holds no id but alloc (seq %" PRIu64
                        ") answered %" PRIu64 " as held before",
                        ci, r->tag, seq, id);
        return;
    }
    uint32_t prev = m->owner[id];
    if (prev != 0 && !free_under_way(s, prev, id)) {
        alloc_violation(s,
                        "id %" PRIu64 " handed to tag c%d-t%d (seq %" PRIu64
                        ") while tag c%u-t%u holds it",
                        id, ci, r->tag, seq, (prev - 1) / TAGS,
                        (prev - 1) % TAGS);
        return;
    }
    if (prev != 0) {
        /* The other tag's free was applied first: it holds nothing now. */
        m->held[(prev - 1) / TAGS][(prev - 1) % TAGS] = 0;
    }
    m->owner[id] = (uint32_t)(ci * TAGS + r->tag + 1);
    m->held[ci][r->tag] = id + 1;
    s->res->ids_acked++;
}

static void acked_free(struct sim *s,
                       int ci,
                       uint64_t seq,
                       const struct sim_req *r,
                       const struct ida_fsm_result *res)
{
    struct sim_model *m = &s->model;
    if (res->error != 0 || !res->flag) {
        alloc_violation(s,
                        "client %d seq %" PRIu64 " free of id %" PRIu64
                        " held by c%d-t%d: %s",
                        ci, seq, r->id, ci, r->tag,
                        res->error ? idalloc_errname(res->error)
                                   : "already free (the alloc was lost)");
        return;
    }
    uint32_t me = (uint32_t)(ci * TAGS + r->tag + 1);
    if (m->owner[r->id] == me) {
        m->owner[r->id] = 0;
    }
    m->held[ci][r->tag] = 0;
}

static bool starts_with(const uint8_t *a,
                        size_t la,
                        const uint8_t *b,
                        size_t lb)
{
    return la <= lb && memcmp(a, b, la) == 0;
}

static void acked_prefix(struct sim *s,
                         int ci,
                         uint64_t seq,
                         const struct sim_req *r,
                         const struct ida_fsm_result *res)
{
    struct sim_model *m = &s->model;
    if (res->error != 0 || res->prefix_len == 0 ||
        res->prefix_len > IDA_PREFIX_BYTES_MAX) {
        alloc_violation(
            s, "client %d seq %" PRIu64 " prefix alloc: %s", ci, seq,
            res->error ? idalloc_errname(res->error) : "bad length");
        return;
    }
    uint8_t have = m->pfx_len[ci][r->tag];
    if (have != 0) {
        if (have != res->prefix_len || !res->flag ||
            memcmp(m->pfx[ci][r->tag], res->prefix, have) != 0) {
            alloc_violation(s, "tag c%d-t%d's prefix changed (seq %" PRIu64 ")",
                            ci, r->tag, seq);
        }
        return;
    }
    if (res->flag) {
        alloc_violation(
            s, "tag c%d-t%d had no prefix but seq %" PRIu64 " says it existed",
            ci, r->tag, seq);
        return;
    }
    for (int oc = 0; oc < CLIENTS; oc++) {
        for (int ot = 0; ot < TAGS; ot++) {
            uint8_t ol = m->pfx_len[oc][ot];
            if (ol == 0) {
                continue;
            }
            if (starts_with(m->pfx[oc][ot], ol, res->prefix, res->prefix_len) ||
                starts_with(res->prefix, res->prefix_len, m->pfx[oc][ot], ol)) {
                alloc_violation(s,
                                "prefix of tag c%d-t%d (seq %" PRIu64
                                ") clashes with tag c%d-t%d's",
                                ci, r->tag, seq, oc, ot);
                return;
            }
        }
    }
    memcpy(m->pfx[ci][r->tag], res->prefix, res->prefix_len);
    m->pfx_len[ci][r->tag] = res->prefix_len;
    s->res->ids_acked++;
}

/* Client @ci's request @seq (@r) was answered @res, for the first time. */
void sim__alloc_acked(struct sim *s,
                      int ci,
                      uint64_t seq,
                      const struct sim_req *r,
                      const struct ida_fsm_result *res)
{
    if (res->error == IDA_ESESSION) {
        /* One request at a time, retried until answered: the session
         * always still holds the answer. */
        alloc_violation(s, "client %d seq %" PRIu64 ": session lost its answer",
                        ci, seq);
        return;
    }
    switch (r->op) {
        case SIM_OP_CREATE_BOUNDED:
        case SIM_OP_CREATE_SEQUENCE:
        case SIM_OP_CREATE_PREFIX: {
            int p = (int)(r->op - SIM_OP_CREATE_BOUNDED);
            if (res->error != 0 || (res->flag && s->model.created[p])) {
                alloc_violation(
                    s, "client %d seq %" PRIu64 " pool create: %s", ci, seq,
                    res->error ? idalloc_errname(res->error) : "created twice");
            }
            s->model.created[p] |= res->flag;
            break;
        }
        case SIM_OP_ALLOC:
            acked_alloc(s, ci, seq, r, res);
            break;
        case SIM_OP_FREE:
            acked_free(s, ci, seq, r, res);
            break;
        case SIM_OP_RESERVE:
            if (res->error != 0 || res->count != r->count || res->id == 0 ||
                res->id + res->count < res->id) {
                alloc_violation(
                    s, "client %d seq %" PRIu64 " reserve: %s", ci, seq,
                    res->error ? idalloc_errname(res->error) : "bad block");
                break;
            }
            for (uint64_t i = 0; i < res->count && !s->failed; i++) {
                mark_sequence(s, res->id + i, ci, seq);
            }
            s->res->ids_acked += res->count;
            break;
        case SIM_OP_PREFIX:
            acked_prefix(s, ci, seq, r, res);
            break;
        case SIM_OP_LOOKUP:
            IDA_ASSERT(!"reads are answered by sim__alloc_read");
    }
}

/* Client @ci's lookup of its tag @r->tag answered (@rv, @id). */
void sim__alloc_read(struct sim *s,
                     int ci,
                     uint64_t seq,
                     const struct sim_req *r,
                     int rv,
                     uint64_t id)
{
    uint64_t held = s->model.held[ci][r->tag];
    bool ok = held != 0 ? (rv == 0 && id == held - 1) : rv == IDA_ENOTFOUND;
    if (!ok) {
        alloc_violation(s,
                        "client %d read %" PRIu64
                        ": lookup of c%d-t%d answered "
                        "%s %" PRIu64 ", the tag holds %s%" PRIu64,
                        ci, seq, ci, r->tag, rv ? idalloc_errname(rv) : "id",
                        id, held ? "id " : "nothing ", held ? held - 1 : 0);
    }
}

/* After the faults healed: the leader @ld applied a commit index of its own
 * term, which covers every acknowledged write (leader completeness). */
void sim__alloc_final(struct sim *s, struct node *ld)
{
    for (int ci = 0; ci < CLIENTS && !s->failed; ci++) {
        for (int t = 0; t < TAGS; t++) {
            uint64_t held = s->model.held[ci][t];
            const struct client *c = &s->clients[ci];
            if (held == 0 || (c->busy && !c->is_read &&
                              c->req.op == SIM_OP_FREE && c->req.tag == t)) {
                continue;
            }
            char tag[32];
            sim__tag_name(tag, sizeof(tag), ci, t);
            uint64_t id = 0;
            int rv = ida_fsm_lookup(ld->fsm, "b", tag, &id);
            if (rv != 0 || id != held - 1) {
                alloc_violation(s,
                                "leader %u lost tag %s's id %" PRIu64
                                " (lookup: %s %" PRIu64 ")",
                                ld->id, tag, held - 1,
                                rv ? idalloc_errname(rv) : "id", id);
                return;
            }
        }
    }
    if (!sim__raft_checks(s)) {
        return;
    }
    uint64_t want;
    if (!sim__fsm_snapshot_hash(s, ld->fsm, &want)) {
        return;
    }
    ida_index at = ida_fsm_applied_index(ld->fsm);
    for (int k = 0; k < s->n; k++) {
        struct node *nd = &s->nodes[k];
        uint64_t h;
        if (!nd->up || nd == ld || ida_fsm_applied_index(nd->fsm) != at) {
            continue;
        }
        if (!sim__fsm_snapshot_hash(s, nd->fsm, &h)) {
            return;
        }
        if (h != want) {
            alloc_violation(s,
                            "node %u's state at index %" PRIu64
                            " differs from leader %u's",
                            nd->id, at, ld->id);
            return;
        }
    }
}
