/* The chaos run: a cluster of real idallocd processes behind a link proxy,
 * concurrent clients recording a history, a seeded nemesis that kills,
 * pauses, partitions, restarts, wipes and (optionally) rolls back nodes,
 * and an operator that changes the membership and transfers leadership
 * through bin/idalloc while the faults go on, and replaces wiped nodes by
 * the README Runbook's steps when auto_rejoin is off. Never more than a
 * minority of the nodes is unavailable at once (tests/chaos/run.h, "the
 * availability rule"). Afterwards everything is healed, unknown outcomes
 * are resolved, a sample of acknowledged requests is replayed, the final
 * state is read, and the history is checked. */
#ifndef IDA_CHAOS_H
#define IDA_CHAOS_H

#include <stdbool.h>
#include <stdint.h>

#include "tests/chaos/checker.h"

struct chaos_opts
{
    unsigned duration_s;
    int nodes; /* 3 or 5 */
    uint64_t seed;
    unsigned clients; /* client threads, each with its own client object */
    const char *history_path; /* where to write the history, or NULL */
    /* auto_rejoin off: a wiped node is replaced by the operator's remove,
     * add and promote (README, Runbook) instead of by the leader. */
    bool manual_rejoin;
    /* No membership changes or leader transfers by the operator (wiped
     * nodes are still re-admitted). */
    bool no_members;
    /* The rollback nemesis: a follower's data directory is copied while it
     * is paused, and later the node is killed, restarted from the copy and
     * watched until rule A4 (raft/admission.h) stopped it and it was
     * re-admitted as a new incarnation, or it caught up unnoticed. Off by
     * default: combined with other faults a node restarted from an older
     * copy can lose acknowledged entries (README, Known limitations), so
     * no other fault, leader change or membership change is scheduled
     * until then. */
    bool rollback;
};

enum chaos_fault {
    F_KILL,
    F_KILL_LEADER,
    F_PAUSE,
    F_PAUSE_LEADER,
    F_ISOLATE_LEADER,
    F_SPLIT,
    F_ONE_WAY,
    F_RESTART_ALL,
    F_WIPE,     /* a follower's data directory deleted, the node restarted */
    F_ROLLBACK, /* a node restarted from an older copy of its directory */
    F_KINDS
};

/* The operator's work, all through bin/idalloc. removes, adds, promotes:
 * steps that ended with exit 0; already: those of them answered "already
 * ..." or "not a member" (made before, e.g. by the leader's automatic
 * promotion, or by the CLI's own attempt whose answer a leader change
 * lost). */
struct chaos_members
{
    unsigned cycles;       /* a node removed, added back and promoted */
    unsigned replacements; /* wiped nodes replaced by hand (Runbook) */
    unsigned readmissions; /* wiped nodes re-admitted by the leader */
    unsigned removes, adds, promotes, already;
    unsigned transfers, transfers_failed; /* leader transfer exit 0 / not */
    unsigned commands;                    /* bin/idalloc runs */
    unsigned exits[4];                    /* their exit codes 0, 1, 3, other */
    unsigned postponed; /* actions dropped: no room under the rule */
};

struct chaos_rollbacks
{
    unsigned copies;    /* copies taken */
    unsigned restored;  /* nodes restarted from a copy (F_ROLLBACK) */
    unsigned detected;  /* stopped by rule A4, then re-admitted */
    unsigned caught_up; /* caught up unnoticed */
    unsigned dropped;   /* copies never restored */
    /* restores whose log (from the node's start line) ended below what
     * the leader had committed when the node was killed, by how much */
    unsigned rewound;
    uint64_t rewound_sum, rewound_max;
};

struct chaos_report
{
    unsigned faults[F_KINDS];
    unsigned moved;   /* faults moved onto an unavailable node (the rule) */
    unsigned skipped; /* faults skipped for the rule */
    struct chaos_members m;
    struct chaos_rollbacks rb;
    /* Operator actions, re-admissions or catch-ups that did not complete,
     * a membership not whole after healing, a node that ended on its own:
     * failures, though not violations of the promises the checker
     * proves. */
    unsigned failures;
    bool membership_whole;
    size_t definite;         /* client operations with a definite error */
    unsigned settled_in_run; /* unknown outcomes learnt by a worker's repeat */
    struct check_report check;
    uint64_t longest_unavailable_ms;
    uint64_t kill_to_write_p50_ms, kill_to_write_p99_ms;
    unsigned kill_samples;
    int setup_failed;
    char failure[4][200];
};

/* Run; returns the number of violations (or -1 if the cluster could not be
 * set up or healed). r->failures counts the liveness failures. */
long chaos_run(const struct chaos_opts *o, struct chaos_report *r);
void chaos_report_print(const struct chaos_opts *o,
                        const struct chaos_report *r);
unsigned chaos_faults_total(const struct chaos_report *r);
const char *chaos_fault_name(enum chaos_fault f);

#endif
