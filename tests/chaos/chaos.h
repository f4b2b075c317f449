/* The chaos run: a cluster of real idallocd processes behind a link proxy,
 * concurrent clients recording a history, and a seeded nemesis that kills,
 * pauses, partitions and restarts nodes. Afterwards everything is healed,
 * unknown outcomes are resolved, a sample of acknowledged requests is
 * replayed, the final state is read, and the history is checked. */
#ifndef IDA_CHAOS_H
#define IDA_CHAOS_H

#include <stdint.h>

#include "tests/chaos/checker.h"

struct chaos_opts
{
    unsigned duration_s;
    int nodes; /* 3 or 5 */
    uint64_t seed;
    unsigned clients; /* client threads, each with its own client object */
    const char *history_path; /* where to write the history, or NULL */
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
    F_WIPE, /* a follower's data directory deleted, the node restarted */
    F_KINDS
};

struct chaos_report
{
    unsigned faults[F_KINDS];
    struct check_report check;
    uint64_t longest_unavailable_ms;
    uint64_t kill_to_write_p50_ms, kill_to_write_p99_ms;
    unsigned kill_samples;
    int setup_failed;
};

/* Run; returns the number of violations (or -1 if the cluster could not be
 * set up or healed). */
long chaos_run(const struct chaos_opts *o, struct chaos_report *r);
void chaos_report_print(const struct chaos_opts *o,
                        const struct chaos_report *r);
unsigned chaos_faults_total(const struct chaos_report *r);
const char *chaos_fault_name(enum chaos_fault f);

#endif
