/* The deterministic cluster simulator: PRNG, trace, main loop and
 * sim_run(). Contract: tests/sim/sim.h; the other parts are declared in
 * tests/sim/sim_internal.h.
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
 *    committed sequence, with the same results (a hash chained per index);
 *    every snapshot taken or restored at an index has the same bytes as
 *    every other there; commit indexes never decrease;
 *  - clients: a retried request returns its first answer; the allocator's
 *    invariants on every answer (tests/sim/sim_alloc.c: no id held by two
 *    tags, no acknowledged alloc lost, exact lookups through ReadIndex,
 *    blocks never overlap, prefixes never clash; in liveness mode the
 *    leader holds every acknowledged holding at the end);
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
#include "tests/sim/sim_internal.h"

uint64_t sim__rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t sim__below(uint64_t *s, uint64_t n)
{
    return n == 0 ? 0 : sim__rnd(s) % n;
}

bool sim__chance(uint64_t *s, unsigned percent)
{
    return sim__below(s, 100) < percent;
}

void sim__hash_in(struct sim *s, uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t v[5] = {s->now, a, b, c, d};
    for (int i = 0; i < 5; i++) {
        s->res->trace_hash ^= v[i];
        s->res->trace_hash *= 0x100000001B3ULL;
        s->res->trace_hash ^= s->res->trace_hash >> 29;
    }
    s->res->events++;
}

void sim__tracef(struct sim *s, const char *fmt, ...)
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

void sim__violation(struct sim *s, const char *fmt, ...)
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
    sim__tracef(s, "VIOLATION %s", s->res->violation);
}

void *sim__grow(struct sim *s, void *p, size_t *cap, size_t need, size_t elem)
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

uint64_t sim__entry_hash(const struct ida_entry *e)
{
    uint64_t h = 0xCBF29CE484222325ULL ^ (uint64_t)e->type;
    for (size_t i = 0; i < e->len; i++) {
        h = (h ^ e->data[i]) * 0x100000001B3ULL;
    }
    return h;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t next_time(struct sim *s)
{
    uint64_t t = min_u64(min_u64(s->next_fault, s->heal_at), s->garbage_at);
    if (s->rejoin != 0) {
        t = min_u64(t, s->rejoin_next);
    }
    if (s->scen_phase != 0) {
        t = min_u64(t, s->scen_at);
    }
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
        struct node *nd = &s->nodes[sim__node_slot(s, p.m.to)];
        sim__hash_in(s, 11, p.m.from, p.m.to,
                     (uint64_t)p.m.type * 1000003 + p.m.term);
        if (nd->up) {
            if (p.m.type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
                s->res->snapshots_sent++;
            } else if (p.m.type == IDA_RAFT_MSG_TIMEOUT_NOW) {
                s->res->transfers++;
            }
            if (s->o.trace != NULL) {
                char d[160];
                sim__tracef(s, "deliver %s", sim__msg_desc(&p.m, d, sizeof(d)));
            }
            sim__node_step(s, nd, &p.m);
        }
        sim__packet_free(&p);
    }
}

static void run_instant(struct sim *s, uint64_t deadline)
{
    if (s->now >= s->heal_at) {
        s->heal_at = NEVER;
        sim__heal(s);
        (void)deadline;
    }
    if (s->now >= s->next_fault) {
        sim__fault(s);
    }
    if (s->now >= s->garbage_at) {
        sim__garbage(s);
        s->garbage_at = s->now + 1 + sim__below(&s->rng, 10);
    }
    if (s->scen_phase != 0 && s->now >= s->scen_at) {
        sim__scenario_step(s);
    }
    for (int k = 0; k < s->n && !s->failed; k++) {
        struct node *nd = &s->nodes[k];
        if (nd->untrusted) {
            sim__untrusted_step(s, nd);
        }
        if (!nd->up && !nd->dead && s->now >= nd->restart_at) {
            if (nd->needs_boot && !sim__boot_from_peer(s, nd)) {
                nd->restart_at = s->now + 50; /* no live peer yet */
                continue;
            }
            sim__tracef(s, "node %u restart", nd->id);
            sim__hash_in(s, 12, nd->id, 0, 0);
            if (sim__node_start(s, nd) != 0) {
                s->oom = true;
                return;
            }
            sim__drain(s, nd);
        }
        if (nd->up && s->now >= nd->sync_at) {
            sim__node_sync(s, nd);
        }
        if (nd->up && s->now >= nd->check_at) {
            sim__node_checked(s, nd);
        }
    }
    deliver_due(s);
    sim__retire_removed_leader(s);
    if (s->rejoin != 0 && s->now >= s->rejoin_next && !s->failed) {
        sim__rejoin_step(s);
    }
    for (int k = 0; k < s->n && !s->failed; k++) {
        struct node *nd = &s->nodes[k];
        if (nd->up && s->now >= nd->next_tick) {
            nd->next_tick += TICK_MS;
            ida_raft_tick(&nd->raft);
            sim__drain(s, nd);
        }
    }
    for (int c = 0; c < CLIENTS && !s->failed; c++) {
        sim__client_tick(s, c);
    }
}

static void sim_free(struct sim *s)
{
    for (int k = 0; k < s->n; k++) {
        struct node *nd = &s->nodes[k];
        for (size_t i = 0; i < nd->n_writes; i++) {
            sim__write_free(&nd->writes[i]);
        }
        ida_free(nd->writes);
        if (nd->up) {
            ida_raft_close(&nd->raft);
            ida_fsm_free(nd->fsm);
        }
        sim__disk_free_entries_from(&nd->disk, 0);
        ida_free(nd->disk.ents);
        ida_free(nd->disk.snap);
        ida_free(nd->disk.snap_conf);
        sim__disk_free(&nd->old);
        sim__disk_free(&nd->lost);
        sim__disk_free(&nd->rolled);
    }
    for (size_t i = 0; i < s->n_net; i++) {
        sim__packet_free(&s->net[i]);
    }
    ida_free(s->net);
    for (int c = 0; c < CLIENTS; c++) {
        ida_free(s->clients[c].answers);
    }
    ida_free(s->glob_term);
    ida_free(s->glob_hash);
    ida_free(s->glob_chain);
    ida_free(s->glob_snap);
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
    s->next_fault = 100 + sim__below(&s->rng, 300);
    s->heal_at = opts->mode == SIM_LIVENESS ? dur : NEVER;
    s->garbage_at = opts->garbage ? 20 : NEVER;
    s->healed_at = NEVER;
    s->faults_on = true;
    s->pre_vote = sim__chance(&s->rng, 70);
    s->check_quorum = sim__chance(&s->rng, 70);
    uint64_t end = opts->mode == SIM_LIVENESS ? dur + LIVENESS_BOUND_MS : dur;
    struct ida_raft_conf boot = {.n = (size_t)s->n};
    for (int k = 0; k < s->n; k++) {
        s->nodes[k].inc = sim__new_inc(s);
        boot.voters[k] = (ida_node_id)(k + 1);
        boot.voter_inc[k] = s->nodes[k].inc;
    }
    for (int k = 0; k < s->n; k++) {
        s->nodes[k].id = (ida_node_id)(k + 1);
        s->nodes[k].boot = boot;
        if (sim__node_start(s, &s->nodes[k]) != 0) {
            s->oom = true;
        }
    }
    for (int c = 0; c < CLIENTS; c++) {
        s->clients[c].target = (int)sim__below(&s->rng, (uint64_t)s->n);
        s->clients[c].next_at = 50 + sim__below(&s->rng, 100);
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
            sim__liveness_done(s)) {
            sim__liveness_final_check(s);
            break;
        }
    }
    if (!s->failed && !s->oom && opts->mode == SIM_LIVENESS && s->now >= end) {
        sim__violation(s, "liveness: %s %ums after the faults healed",
                       sim__find_leader(s) == NULL
                           ? "no leader"
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
