/* What the files of a chaos run share (tests/chaos/chaos.h is the contract):
 * chaos.c sets up, heals and checks; clients.c runs the clients and
 * learns what they could not; nemesis.c injects
 * the faults (kill, pause, partitions, restarts, wipes, rollbacks);
 * operator.c is the operator: membership changes, leader transfers and the
 * README Runbook's replacement of a wiped node, all through bin/idalloc.
 *
 * THE AVAILABILITY RULE. Never more than a minority of the cluster file's
 * nodes is unavailable at once (with 3 nodes: one). A node is unavailable
 * while the nemesis's current fault touches it (faulted) and while it is
 * reserved (unavail): taken out of the membership by the operator, wiped
 * and not yet re-admitted, or restored from an older copy and neither
 * re-admitted (after rule A4 stopped it) nor caught up. Counting a removed node
 * as unavailable among all the file's nodes is stricter than counting the
 * voters in effect, so a change in flight (old or new membership) is covered
 * too. A second wipe while one is being re-admitted, a full restart during any
 * of this and a fault on a voter while a replacement runs on 2 of 3 voters are
 * therefore never scheduled: the nemesis moves such a fault onto an unavailable
 * node or skips it, the operator waits for room.
 *
 * A freeze (such a restored node not settled yet) admits faults only on
 * reserved nodes and no voluntary operator action, so no leader changes while a
 * node's disk is older than what it acknowledged.
 *
 * THREADING. One nemesis thread, one operator thread, the client threads;
 * the fields under "guarded by mu" are read and written under mu only.
 * c.pid[] is touched by the nemesis thread alone while the run lasts. */
#ifndef IDA_CHAOS_RUN_H
#define IDA_CHAOS_RUN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "idalloc.h"
#include "tests/chaos/chaos.h"
#include "tests/chaos/checker.h"
#include "tests/lib/harness.h"

struct proxy;

struct run
{
    const struct chaos_opts *o;
    struct tc c;
    struct proxy *px;
    struct history h;
    struct chaos_report *r;
    volatile int stop;
    uint64_t t0;
    pthread_mutex_t mu;
    /* guarded by mu: */
    uint64_t leader_kills[4096];
    unsigned n_leader_kills;
    unsigned unavail; /* bit i: node i reserved (see above) */
    unsigned faulted; /* bit i: node i touched by the current fault */
    bool freeze;      /* a restored node not settled yet */
    bool op_busy;     /* the operator is in an action */
    /* A wiped node (or one rule A4 stopped, then wiped) handed to the operator:
     * it replaces it by hand (manual_rejoin) or waits for the leader to
     * re-admit it, then releases the reservation and sets replace_node to
     * -1. replace_old_inc: the incarnation the membership had for it. */
    int replace_node;
    uint64_t replace_old_inc;
    int rollback_node;         /* the node whose older copy is kept, or -1 */
    volatile int nemesis_done; /* the nemesis thread ended (healed) */
};

uint64_t chaos_rnd(uint64_t *s);
uint64_t chaos_now(struct run *x);
/* Sleep lo..hi ms (drawn from @rng); returns early once the run stops. */
void chaos_nap(struct run *x, uint64_t *rng, unsigned lo, unsigned hi);
/* The availability rule: may the nodes of @set be unavailable at once?
 * (Fewer than half of the file's nodes.) Pure; callers hold mu and pass
 * unavail | faulted | what they add. */
bool chaos_minority(const struct run *x, unsigned set);
/* With $IDA_CHAOS_TRACE set: one line on stderr, with the run's clock. */
void chaos_trace(struct run *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Record a liveness failure (a change, re-admission or catch-up that did
 * not complete); thread-safe. */
void chaos_failure(struct run *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Node status through the library: 0 or an error code. */
int chaos_status(struct run *x, int i, struct idalloc_node_status *s);
/* The node that claims to lead with the highest term, or -1. */
int chaos_find_leader(struct run *x);
/* The leader's member list, 0 or an error code (one try, @ms timeout). */
int chaos_members(struct run *x, struct idalloc_member_list *l, unsigned ms);
/* Node @id's entry (1-based id) in @l that is (@waiting) or is not a
 * waiting line, or NULL. */
const struct idalloc_member *chaos_member(const struct idalloc_member_list *l,
                                          unsigned id,
                                          int waiting);

/* Node @i ended on its own with wait status @status: a failure naming it
 * and its log's last ERROR line. */
void chaos_node_ended(struct run *x, int i, int status);
/* clients.c: start the client threads (x->o->clients), and join them once
 * x->stop is set. */
void chaos_clients_start(struct run *x);
void chaos_clients_join(struct run *x);
/* After the run and the healing: learn the outcomes still unknown, replay
 * a sample of acknowledged requests, read the final holdings; then count
 * client operations that got a definite error (a failure). */
void chaos_resolve(struct run *x);
void chaos_replay_acked(struct run *x);
void chaos_read_final(struct run *x);
void chaos_definite_failures(struct run *x);
void *chaos_nemesis_main(void *arg);
void *chaos_operator_main(void *arg);
/* After the run: wait until every node of the file is a voter again with no
 * waiting line (up to @ms); false if not. */
bool chaos_membership_whole(struct run *x, unsigned ms);

#endif
