/* Faults (partitions, loss, crashes, membership changes, transfers),
 * healing and the liveness checks. */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "src/node/convert.h"
#include "tests/sim/sim_internal.h"

struct node *sim__find_leader(struct sim *s)
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

/* Membership edits that keep each member's bound incarnation with it. */
static void conf_remove_voter(struct ida_raft_conf *c, int k)
{
    c->n--;
    c->voters[k] = c->voters[c->n];
    c->voter_inc[k] = c->voter_inc[c->n];
}

static void conf_promote(struct ida_raft_conf *c, int j)
{
    c->voters[c->n] = c->learners[j];
    c->voter_inc[c->n++] = c->learner_inc[j];
    c->n_learners--;
    c->learners[j] = c->learners[c->n_learners];
    c->learner_inc[j] = c->learner_inc[c->n_learners];
}

static void conf_add_learner(struct ida_raft_conf *c,
                             ida_node_id id,
                             uint64_t inc)
{
    c->learners[c->n_learners] = id;
    c->learner_inc[c->n_learners++] = inc;
}

/* Propose @next at leader @ld. Returns the core's answer. */
static int propose_conf(struct sim *s,
                        struct node *ld,
                        const struct ida_raft_conf *next)
{
    uint8_t buf[512];
    size_t len;
    if (node_conf_encode(next, buf, sizeof(buf), &len) != 0) {
        s->oom = true;
        return IDA_ENOMEM;
    }
    return ida_raft_propose(&ld->raft, IDA_ENTRY_CONFIG, buf, len, NULL, NULL);
}

/* Whether every running node's membership is the full cluster, with no
 * learner and no re-admission under way: only then may a replacement start
 * by removing a live voter, so that a re-admission and a replacement never
 * leave a two-voter membership that one more death stops for good. */
static bool confs_settled(const struct sim *s)
{
    if (s->rejoin != 0) {
        return false;
    }
    for (int k = 0; k < s->n; k++) {
        const struct node *u = &s->nodes[k];
        if (u->up && !u->dead) {
            const struct ida_raft_conf *c = ida_raft_voters(&u->raft);
            if ((int)c->n != s->n_boot || c->n_learners != 0) {
                return false;
            }
        }
    }
    return true;
}

/* Replace a node (dissertation §4.1/§4.2.1, one server at a time): remove a
 * voter (it dies for good); add a fresh node with an empty disk as a
 * learner; promote the learner to voter once it caught up. At most one
 * dead voter is ever in a configuration, so a majority can stay alive. */
static void membership_change(struct sim *s, struct node *ld)
{
    const struct ida_raft_conf before = *ida_raft_voters(&ld->raft);
    const struct ida_raft_conf *cur = &before;
    struct ida_raft_conf next = *cur;
    int dead_voter = -1;
    for (size_t i = 0; i < cur->n; i++) {
        if (s->nodes[sim__node_slot(s, cur->voters[i])].dead) {
            dead_voter = (int)i;
        }
    }
    ida_node_id victim = 0, added = 0, promoted = 0;
    if (cur->n_learners > 0) {
        /* Promote once it holds the leader's committed log. */
        ida_node_id l = cur->learners[0];
        const struct ida_raft_progress *pr = ida_raft_progress_of(&ld->raft, l);
        if (pr == NULL || pr->match < ida_raft_commit(&ld->raft) ||
            s->nodes[sim__node_slot(s, l)].dead) {
            return;
        }
        promoted = l;
        conf_promote(&next, 0);
    } else if (dead_voter >= 0) {
        victim = cur->voters[dead_voter];
    } else if ((int)cur->n < s->n_boot) {
        if (s->n == NODES_MAX) {
            return;
        }
        added = (ida_node_id)(s->n + 1);
        s->nodes[s->n].inc = sim__new_inc(s);
        conf_add_learner(&next, added, s->nodes[s->n].inc);
    } else if (cur->n > 1 && confs_settled(s)) {
        victim = cur->voters[sim__below(&s->rng, cur->n)];
    } else {
        return;
    }
    if (victim != 0) {
        conf_remove_voter(&next, ida_raft_conf_slot(&next, victim));
    }
    int rv = propose_conf(s, ld, &next);
    if (s->oom) {
        return;
    }
    sim__tracef(s, "fault: leader %u proposes %s node %u: %s", ld->id,
                victim  ? "removing"
                : added ? "adding learner"
                        : "promoting",
                victim  ? victim
                : added ? added
                        : promoted,
                rv ? idalloc_errname(rv) : "ok");
    sim__hash_in(s, 13, victim, added, (uint64_t)rv * 100 + promoted);
    if (rv != 0) {
        return;
    }
    s->res->members_changed++;
    if (added != 0) {
        struct node *nd = &s->nodes[s->n++];
        uint64_t inc = nd->inc;
        memset(nd, 0, sizeof(*nd));
        nd->id = added;
        nd->inc = inc;
        /* A joining node learns the membership from the cluster. */
        nd->boot.n = cur->n;
        memcpy(nd->boot.voters, cur->voters, sizeof(cur->voters));
        memcpy(nd->boot.voter_inc, cur->voter_inc, sizeof(cur->voter_inc));
        if (sim__node_start(s, nd) != 0) {
            s->oom = true;
            return;
        }
    } else if (victim == ld->id) {
        /* A removed leader leads until the entry commits, then steps
         * down; it dies after that (retire_removed_leader). */
        s->retire = victim;
    } else if (victim != 0) {
        struct node *v = &s->nodes[sim__node_slot(s, victim)];
        if (v->up) {
            sim__node_crash(s, v);
        }
        v->dead = true;
    }
    sim__drain(s, ld);
}

void sim__retire_removed_leader(struct sim *s)
{
    if (s->retire == 0) {
        return;
    }
    struct node *v = &s->nodes[sim__node_slot(s, s->retire)];
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
        sim__node_crash(s, v);
    }
    v->dead = true;
    s->retire = 0;
}

/* --- lost disks (raft/admission.h) --------------------------------------- */

/* The membership a down node @u restarts with: the latest config entry on
 * its disk, else its snapshot's, else its bootstrap one. */
static bool disk_conf(const struct node *u, struct ida_raft_conf *out)
{
    if (u->needs_boot) {
        return false;
    }
    const struct disk *d = &u->disk;
    for (size_t i = d->n; i-- > 0;) {
        if (d->ents[i].type == IDA_ENTRY_CONFIG) {
            memset(out, 0, sizeof(*out));
            return node_conf_decode(d->ents[i].data, d->ents[i].len, out) == 0;
        }
    }
    memset(out, 0, sizeof(*out));
    if (d->snap_conf_len > 0) {
        return node_conf_decode(d->snap_conf, d->snap_conf_len, out) == 0;
    }
    *out = u->boot;
    return true;
}

/* Whether node @nd may lose its disk now: no other node is emptied and not
 * yet re-admitted, no membership change of the replacement procedure is
 * under way, and every live node's membership is the full cluster with
 * @nd as a voter and no dead member. Then the others stay a majority of
 * admitted voters: the cluster stays able to re-admit @nd. */
/* Whether some node lost state that is not yet replaced: a rolled-back
 * disk (caught or not) counts like an emptied one being re-admitted. */
static bool state_lost_somewhere(const struct sim *s, const struct node *but)
{
    for (int k = 0; k < s->n; k++) {
        const struct node *u = &s->nodes[k];
        if (u != but && (u->has_rolled || u->untrusted)) {
            return true;
        }
    }
    return false;
}

static bool wipe_ok(struct sim *s, const struct node *nd)
{
    if (s->rejoin != 0 || s->retire != 0 || nd->dead || nd->needs_boot ||
        state_lost_somewhere(s, nd)) {
        return false; /* one lost disk at a time: more is a lost majority */
    }
    for (int k = 0; k < s->n; k++) {
        const struct node *u = &s->nodes[k];
        struct ida_raft_conf dc;
        const struct ida_raft_conf *c = &dc;
        if (u->dead) {
            continue;
        }
        if (u->up) {
            c = ida_raft_voters(&u->raft);
        } else if (!disk_conf(u, &dc)) {
            return false;
        }
        if ((int)c->n != s->n_boot || c->n_learners != 0 ||
            ida_raft_conf_slot(c, nd->id) < 0) {
            return false;
        }
        for (size_t i = 0; i < c->n; i++) {
            if (s->nodes[sim__node_slot(s, c->voters[i])].dead) {
                return false;
            }
        }
    }
    return true;
}

static void wipe(struct sim *s, struct node *nd, uint64_t restart_in)
{
    sim__node_wipe(s, nd);
    nd->restart_at = s->now + restart_in;
    s->rejoin = nd->id;
    s->rejoin_next = s->now + 20;
}

void sim__untrusted_step(struct sim *s, struct node *nd)
{
    if (nd->untrusted && !nd->up && wipe_ok(s, nd)) {
        sim__tracef(s, "operator: node %u's untrusted directory is emptied",
                    nd->id);
        wipe(s, nd, 5 + sim__below(&s->rng, 200));
    }
}

bool sim__boot_from_peer(struct sim *s, struct node *nd)
{
    /* From the leader: a lagging peer may still bind another member's
     * previous incarnation, and a node whose log holds no membership drops
     * every message of that member's current incarnation (A2) for good. */
    struct node *peer = sim__find_leader(s);
    if (peer == NULL || peer == nd) {
        return false;
    }
    const struct ida_raft_conf *c = ida_raft_voters(&peer->raft);
    memset(&nd->boot, 0, sizeof(nd->boot));
    nd->boot.n = c->n;
    memcpy(nd->boot.voters, c->voters, sizeof(c->voters));
    memcpy(nd->boot.voter_inc, c->voter_inc, sizeof(c->voter_inc));
    nd->needs_boot = false;
    sim__hash_in(s, 16, nd->id, peer->id, c->n);
    sim__tracef(s, "node %u learns the membership (%zu voters) from node %u",
                nd->id, c->n, peer->id);
    return true;
}

/* The operator's (or auto-rejoin's) procedure for an emptied node, one
 * single-server change at a time at the leader (A3): remove the old
 * incarnation, add the new one as a learner, promote it once it caught
 * up. Each step waits until the previous change committed (EBUSY). */
void sim__rejoin_step(struct sim *s)
{
    s->rejoin_next = s->now + 20 + sim__below(&s->rng, 30);
    struct node *w = &s->nodes[sim__node_slot(s, s->rejoin)];
    struct node *ld = sim__find_leader(s);
    if (w->dead) {
        s->rejoin = 0;
        return;
    }
    if (!w->up || ld == NULL) {
        return;
    }
    const struct ida_raft_conf *cur = ida_raft_voters(&ld->raft);
    struct ida_raft_conf next = *cur;
    int vs = ida_raft_conf_slot(cur, w->id);
    int ls = ida_raft_conf_learner_slot(cur, w->id);
    const char *what;
    if (vs >= 0 && cur->voter_inc[vs] == w->inc) {
        if (ld->raft.conf_index <= ida_raft_commit(&ld->raft)) {
            sim__tracef(s, "node %u re-admitted", w->id);
            sim__hash_in(s, 17, w->id, ida_raft_commit(&ld->raft), 0);
            s->res->readmitted++;
            s->rejoin = 0;
        }
        return;
    }
    if (ld == w) {
        return; /* only a core that ignores incarnations gets here */
    }
    if (vs >= 0) {
        what = "removing the old incarnation of";
        conf_remove_voter(&next, vs);
    } else if (ls >= 0 && cur->learner_inc[ls] == w->inc) {
        const struct ida_raft_progress *pr =
            ida_raft_progress_of(&ld->raft, w->id);
        if (pr == NULL || pr->match < ida_raft_commit(&ld->raft)) {
            return;
        }
        what = "promoting";
        conf_promote(&next, ls);
    } else if (ls >= 0) {
        what = "rebinding learner";
        next.learner_inc[ls] = w->inc;
    } else {
        what = "adding as a learner";
        conf_add_learner(&next, w->id, w->inc);
    }
    int rv = propose_conf(s, ld, &next);
    if (s->oom) {
        return;
    }
    sim__tracef(s, "rejoin: leader %u proposes %s node %u: %s", ld->id, what,
                w->id, rv ? idalloc_errname(rv) : "ok");
    sim__hash_in(s, 18, ld->id, w->id, (uint64_t)rv);
    if (rv == 0) {
        s->res->members_changed++;
    }
    sim__drain(s, ld);
}

/* The scripted lost-disk scenario (the one admission.h describes): phase 1
 * isolates a follower C of leader L; phase 2, once L and the other
 * followers acknowledged entries C lacks, crashes L, empties the disk of a
 * follower B whose log matched L's, and reconnects C. Without admission,
 * B votes for C as its old self and C leads without the entries. */
static void scenario_start(struct sim *s, struct node *ld)
{
    int l = sim__node_slot(s, ld->id);
    int c = (int)sim__below(&s->rng, (uint64_t)s->n);
    if (c == l || s->nodes[c].dead || !wipe_ok(s, &s->nodes[c])) {
        return;
    }
    for (int b = 0; b < s->n; b++) {
        block(s, c, b);
        block(s, b, c);
    }
    s->scen_phase = 1;
    s->scen_l = ld->id;
    s->scen_c = (ida_node_id)(c + 1);
    s->scen_at = s->now + 50 + sim__below(&s->rng, 250);
    sim__tracef(s, "fault: scenario: isolate follower %d of leader %u", c + 1,
                ld->id);
}

void sim__scenario_step(struct sim *s)
{
    s->scen_phase = 0;
    struct node *ld = &s->nodes[sim__node_slot(s, s->scen_l)];
    int c = sim__node_slot(s, s->scen_c);
    for (int b = 0; b < s->n; b++) {
        s->blocked[c][b] = s->blocked[b][c] = false;
    }
    if (!ld->up || ida_raft_role(&ld->raft) != IDA_RAFT_LEADER) {
        return;
    }
    ida_index last = ida_raft_last_index(&ld->raft);
    struct node *victim = NULL;
    for (int k = 0; k < s->n; k++) {
        struct node *u = &s->nodes[k];
        const struct ida_raft_progress *pr =
            ida_raft_progress_of(&ld->raft, u->id);
        if (u != ld && k != c && u->up && pr != NULL && pr->match == last &&
            wipe_ok(s, u)) {
            victim = u;
        }
    }
    if (victim == NULL) {
        return;
    }
    sim__tracef(s,
                "fault: scenario: leader %u crashes, node %u loses its "
                "disk, node %d reconnects",
                ld->id, victim->id, c + 1);
    sim__hash_in(s, 19, ld->id, victim->id, (uint64_t)c);
    s->res->scenarios++;
    sim__node_crash(s, ld);
    ld->restart_at = s->now + 200 + sim__below(&s->rng, 800);
    wipe(s, victim, 1 + sim__below(&s->rng, 20));
}

/* Restart node @nd from the older copy of its own disk (same incarnation):
 * not caught by admission (raft/admission.h), so only with opts.rollback. */
static void rollback(struct sim *s, struct node *nd)
{
    if (!nd->has_old || nd->dead || nd->untrusted || s->rejoin != 0 ||
        s->scen_phase != 0 || state_lost_somewhere(s, NULL)) {
        return; /* one lost disk at a time: more is a lost majority */
    }
    if (s->o.rollback_old && nd->old.boots >= nd->disk.boots) {
        return; /* the copy is of this life */
    }
    if (nd->up) {
        sim__node_crash(s, nd);
    }
    /* What it acknowledged was durable on this image (the commit
     * durability check counts it); keep the furthest one. */
    if (!nd->has_rolled || nd->disk.snap_index + nd->disk.n >=
                               nd->rolled.snap_index + nd->rolled.n) {
        sim__disk_free(&nd->rolled);
        nd->rolled = nd->disk;
        nd->has_rolled = true;
    } else {
        sim__disk_free(&nd->disk);
    }
    nd->disk = nd->old;
    memset(&nd->old, 0, sizeof(nd->old));
    nd->has_old = false;
    nd->restart_at = s->now + 5 + sim__below(&s->rng, 200);
    s->res->rollbacks++;
    sim__hash_in(s, 20, nd->id, nd->disk.snap_index + nd->disk.n, 0);
    sim__tracef(s,
                "fault: node %u restarts from an older copy of its disk "
                "(last index %" PRIu64 ")",
                nd->id, nd->disk.snap_index + nd->disk.n);
}

void sim__fault(struct sim *s)
{
    unsigned k = (unsigned)sim__below(&s->rng, 100);
    int a = (int)sim__below(&s->rng, (uint64_t)s->n);
    struct node *ld = sim__find_leader(s);
    sim__hash_in(s, 10, k, (uint64_t)a, 0);
    unsigned extra = (unsigned)sim__below(&s->rng, 100);
    if (!s->o.no_wipe && extra < 8) {
        if (extra < 4 && ld != NULL && s->scen_phase == 0) {
            scenario_start(s, ld);
        } else if (extra >= 4 && s->scen_phase == 0 &&
                   wipe_ok(s, &s->nodes[a])) {
            wipe(s, &s->nodes[a], 5 + sim__below(&s->rng, 300));
        }
        s->next_fault = s->now + 20 + sim__below(&s->rng, 400);
        return;
    }
    if (s->o.rollback && extra >= 8 && extra < 14) {
        rollback(s, &s->nodes[a]);
        s->next_fault = s->now + 20 + sim__below(&s->rng, 400);
        return;
    }
    if (k < 18) {
        if (s->nodes[a].up) {
            sim__node_crash(s, &s->nodes[a]);
            /* Quick restarts put a node back into the same election. */
            s->nodes[a].restart_at =
                s->now + (sim__chance(&s->rng, 50)
                              ? 5 + sim__below(&s->rng, 100)
                              : 100 + sim__below(&s->rng, 1500));
        }
    } else if (k < 32) {
        if (ld != NULL) {
            int l = sim__node_slot(s, ld->id);
            for (int b = 0; b < s->n; b++) {
                block(s, l, b);
                block(s, b, l);
            }
            sim__tracef(s, "fault: isolate leader %u", ld->id);
        }
    } else if (k < 42) {
        bool side[NODES_MAX];
        for (int b = 0; b < s->n; b++) {
            side[b] = sim__chance(&s->rng, 50);
        }
        split(s, side);
        sim__tracef(s, "fault: random partition");
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
        sim__tracef(s, "fault: bridge through node %d", a + 1);
    } else if (k < 58) {
        int b = (int)sim__below(&s->rng, (uint64_t)s->n);
        block(s, a, b);
        sim__tracef(s, "fault: asymmetric %d->%d cut", a + 1, b + 1);
    } else if (k < 76) {
        heal_links(s);
        sim__tracef(s, "fault: heal partitions");
    } else if (k < 86) {
        s->loss_pct = (unsigned)sim__below(&s->rng, 30);
        s->dup_pct = (unsigned)sim__below(&s->rng, 10);
        s->delay_max_ms = 1 + (unsigned)sim__below(&s->rng, 30);
        sim__tracef(s, "fault: loss %u%% dup %u%% delay <= %ums", s->loss_pct,
                    s->dup_pct, s->delay_max_ms);
    } else if (k < 92) {
        if (ld != NULL) {
            int rv = ida_raft_transfer(&ld->raft, (ida_node_id)(a + 1));
            sim__tracef(s, "fault: transfer %u -> %d: %s", ld->id, a + 1,
                        rv ? idalloc_errname(rv) : "ok");
            sim__drain(s, ld);
        }
    } else if (k < 98) {
        if (ld != NULL && s->retire == 0 && s->rejoin == 0 &&
            s->scen_phase == 0) {
            membership_change(s, ld);
        }
    } else {
        restart_all(s);
    }
    s->next_fault = s->now + 20 + sim__below(&s->rng, 400);
}

void sim__heal(struct sim *s)
{
    sim__tracef(s, "heal: all faults end");
    s->healed_at = s->now;
    s->faults_on = false;
    s->scen_phase = 0;
    heal_links(s);
    s->loss_pct = 0;
    s->dup_pct = 0;
    s->delay_max_ms = 5;
    restart_all(s);
    s->next_fault = NEVER;
}

bool sim__liveness_done(struct sim *s)
{
    struct node *ld = sim__find_leader(s);
    if (ld == NULL) {
        return false;
    }
    /* The leader knows the commit index (an entry of its term committed)
     * and applied it. */
    ida_index c = ida_raft_commit(&ld->raft);
    if (ida_raft_term_at(&ld->raft, c) != ida_raft_term(&ld->raft) ||
        ida_fsm_applied_index(ld->fsm) < c) {
        return false;
    }
    if (s->rejoin != 0) {
        return false; /* the emptied node is not re-admitted yet */
    }
    for (int k = 0; k < CLIENTS; k++) {
        if (!s->clients[k].done_after_heal) {
            return false;
        }
    }
    return true;
}

void sim__liveness_final_check(struct sim *s)
{
    struct node *ld = sim__find_leader(s);
    IDA_ASSERT(ld != NULL);
    /* Nothing acknowledged is lost: the leader applied everything up to a
     * commit index of its own term, which covers every acknowledged
     * write (leader completeness). */
    sim__alloc_final(s, ld);
}

/* --- garbage from non-members --------------------------------------------- */

static uint64_t garbage_u64(struct sim *s, uint64_t near)
{
    switch (sim__below(&s->rng, 8)) {
        case 0:
            return 0;
        case 1:
            return near;
        case 2:
            return near + 1;
        case 3:
            return near + 1 + sim__below(&s->rng, 1000);
        case 4:
            return UINT64_MAX;
        case 5:
            return UINT64_MAX - 1;
        case 6:
            return near > 0 ? near - 1 : 0;
        default:
            return sim__rnd(&s->rng);
    }
}

void sim__garbage(struct sim *s)
{
    int up[5], n_up = 0;
    for (int k = 0; k < s->n; k++) {
        if (s->nodes[k].up) {
            up[n_up++] = k;
        }
    }
    if (n_up == 0) {
        return;
    }
    struct node *nd = &s->nodes[up[sim__below(&s->rng, (uint64_t)n_up)]];
    static uint8_t junk[96];
    static struct ida_entry ents[3];
    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)sim__rnd(&s->rng);
    }
    ida_term term = ida_raft_term(&nd->raft);
    ida_index last = ida_raft_last_index(&nd->raft);
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = (enum ida_raft_msg_type)sim__below(&s->rng, 9); /* 0, 8: bad */
    m.from = (ida_node_id)(100 + sim__below(&s->rng, 50)); /* never a member */
    m.to = sim__chance(&s->rng, 90) ? nd->id : (ida_node_id)sim__rnd(&s->rng);
    m.term = garbage_u64(s, term);
    m.from_inc = sim__rnd(&s->rng);
    if ((m.type == IDA_RAFT_MSG_APPEND_ENTRIES ||
         m.type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) &&
        (m.term > term ||
         (m.term == term && ida_raft_leader(&nd->raft) == 0))) {
        /* A leader's message from a stranger is honoured when it brings a
         * newer term (or the current one, no leader known yet) and the
         * node hears no leader: the leader of a configuration its log has
         * not reached (raft.c, step()). Without authentication (TLS keeps
         * strangers off the peer port) such a message cannot be told from
         * a genuine one, so the garbage stream sends these only at terms
         * the core must refuse: older ones. */
        m.term = term > 0 ? sim__below(&s->rng, term) : 0;
    }
    switch (m.type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            m.u.request_vote.pre_vote = sim__chance(&s->rng, 50);
            m.u.request_vote.transfer = sim__chance(&s->rng, 50);
            m.u.request_vote.last_log_index = garbage_u64(s, last);
            m.u.request_vote.last_log_term = garbage_u64(s, term);
            break;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
            m.u.response_vote.pre_vote = sim__chance(&s->rng, 50);
            m.u.response_vote.granted = true;
            break;
        case IDA_RAFT_MSG_APPEND_ENTRIES: {
            struct ida_raft_append_entries *a = &m.u.append_entries;
            a->prev_log_index = garbage_u64(s, last);
            a->prev_log_term = garbage_u64(s, term);
            a->commit_index = garbage_u64(s, last);
            a->read_ctx = sim__rnd(&s->rng);
            a->n_entries = (size_t)sim__below(&s->rng, 4);
            for (size_t i = 0; i < a->n_entries; i++) {
                ents[i] = (struct ida_entry){
                    .index = a->prev_log_index + 1 + i,
                    .term = garbage_u64(s, term),
                    .type = (uint8_t)sim__below(&s->rng, 4),
                    .data = junk,
                    .len = (size_t)sim__below(&s->rng, sizeof(junk)),
                };
            }
            a->entries = a->n_entries > 0 ? ents : NULL;
            break;
        }
        case IDA_RAFT_MSG_APPEND_RESPONSE: {
            struct ida_raft_append_response *a = &m.u.append_response;
            a->success = sim__chance(&s->rng, 50);
            a->match_index = garbage_u64(s, last);
            a->reject_index = garbage_u64(s, last);
            a->conflict_term = garbage_u64(s, term);
            a->conflict_index = garbage_u64(s, last);
            a->read_ctx = sim__rnd(&s->rng);
            break;
        }
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT: {
            struct ida_raft_install_snapshot *a = &m.u.install_snapshot;
            a->last_index = garbage_u64(s, last);
            a->last_term = garbage_u64(s, term);
            a->offset = sim__chance(&s->rng, 70) ? 0 : sim__rnd(&s->rng);
            a->data = junk;
            a->len = (size_t)sim__below(&s->rng, sizeof(junk));
            a->done = sim__chance(&s->rng, 70);
            if (sim__chance(&s->rng, 50)) {
                a->config = junk;
                a->config_len = (size_t)sim__below(&s->rng, sizeof(junk));
            }
            break;
        }
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE: {
            struct ida_raft_snapshot_response *a = &m.u.snapshot_response;
            a->last_index = garbage_u64(s, last);
            a->next_offset = sim__rnd(&s->rng);
            a->done = sim__chance(&s->rng, 50);
            a->success = sim__chance(&s->rng, 50);
            break;
        }
        default:
            break;
    }
    enum ida_raft_role role = ida_raft_role(&nd->raft);
    ida_index commit = ida_raft_commit(&nd->raft);
    ida_node_id leader = ida_raft_leader(&nd->raft);
    ida_term last_term = ida_raft_term_at(&nd->raft, last);
    sim__hash_in(s, 15, nd->id, m.from, (uint64_t)m.type);
    s->res->garbage++;
    int rv = ida_raft_step(&nd->raft, &m);
    if (rv == IDA_ENOMEM) {
        s->oom = true;
        return;
    }
    if (ida_raft_term(&nd->raft) != term || ida_raft_role(&nd->raft) != role ||
        ida_raft_commit(&nd->raft) != commit ||
        ida_raft_leader(&nd->raft) != leader ||
        ida_raft_last_index(&nd->raft) != last ||
        ida_raft_term_at(&nd->raft, last) != last_term) {
        sim__violation(
            s,
            "garbage from non-member %u (type %d term %" PRIu64
            ") changed node %u: term %" PRIu64 " -> %" PRIu64
            ", commit %" PRIu64 " -> %" PRIu64 ", last %" PRIu64 " -> %" PRIu64,
            m.from, (int)m.type, m.term, nd->id, term, ida_raft_term(&nd->raft),
            commit, ida_raft_commit(&nd->raft), last,
            ida_raft_last_index(&nd->raft));
        return;
    }
    /* Whatever the core queued in answer goes through the normal path
     * (an answer to a non-member is dropped by the network). */
    sim__drain(s, nd);
}
