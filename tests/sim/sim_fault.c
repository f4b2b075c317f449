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
        victim = cur->voters[sim__below(&s->rng, cur->n)];
    } else {
        return;
    }
    if (victim != 0) {
        int k = ida_raft_conf_slot(&next, victim);
        next.voters[k] = next.voters[--next.n];
    }
    uint8_t buf[256];
    size_t len;
    if (node_conf_encode(&next, buf, sizeof(buf), &len) != 0) {
        s->oom = true;
        return;
    }
    int rv =
        ida_raft_propose(&ld->raft, IDA_ENTRY_CONFIG, buf, len, NULL, NULL);
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
        memset(nd, 0, sizeof(*nd));
        nd->id = added;
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

void sim__fault(struct sim *s)
{
    unsigned k = (unsigned)sim__below(&s->rng, 100);
    int a = (int)sim__below(&s->rng, (uint64_t)s->n);
    struct node *ld = sim__find_leader(s);
    sim__hash_in(s, 10, k, (uint64_t)a, 0);
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
        if (ld != NULL && s->retire == 0) {
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

void sim__liveness_final_check(struct sim *s)
{
    struct node *ld = sim__find_leader(s);
    IDA_ASSERT(ld != NULL);
    /* Nothing acknowledged is lost: the leader applied everything up to a
     * commit index of its own term, which covers every acknowledged
     * write (leader completeness), so its counter covers every acked id. */
    if (ld->fsm.counter < s->max_acked_id) {
        sim__violation(s, "leader %u counter %" PRIu64 " < acked id %" PRIu64,
                       ld->id, ld->fsm.counter, s->max_acked_id);
    }
}
