/* The deterministic cluster simulator.
 *
 * One process, one thread, a seeded PRNG and a virtual clock in
 * milliseconds. 3 or 5 nodes each run the real Raft core (raft/raft.h)
 * behind a simulated network (per-link delay, loss, duplication, reordering,
 * partitions) and a simulated disk (a durable image plus written-but-unsynced
 * batches; a crash drops all or a random suffix of the unsynced ones, and
 * may keep part of the first dropped, as storage can: sim_disk.c; a
 * restart rebuilds the node from the durable image only). Every node runs
 * the real allocator state machine (fsm/): clients send pool creates,
 * tagged allocs and frees, reserves and prefix allocs as CommandBatch
 * entries, with their (client_id, request_seq) sessions, and lookups as
 * ReadIndex reads; snapshots are the allocator's FsmState bytes.
 *
 * Invariants are checked after every event (see sim.c, "checks"; the
 * allocator's own in tests/sim/sim_alloc.c).
 */
#ifndef IDA_SIM_H
#define IDA_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum sim_mode {
    SIM_SAFETY = 0,   /* any faults, all the time */
    SIM_LIVENESS = 1, /* faults, then heal: progress within a bound */
};

struct sim_opts
{
    uint64_t seed;
    int nodes; /* 3 or 5 */
    enum sim_mode mode;
    uint32_t bugs;        /* enum ida_raft_bug, negative controls only */
    uint64_t duration_ms; /* virtual run length; 0: the default */
    FILE *trace;          /* NULL: no readable trace */
    /* Faults off by default. no_wipe: never restart a node with an empty
     * disk (a new incarnation). rollback: restart nodes from an older copy
     * of their own disk (same incarnation), one lost disk at a time; rule
     * A4 of raft/admission.h catches it only where a live member heard
     * what the copy lacks, so it can lose acknowledged entries and is not
     * part of the safety runs. rollback_old: only copies taken before the
     * node's last start (a backup put back), which A4 catches whenever a
     * live member heard the later start. */
    bool no_wipe;
    bool rollback;
    bool rollback_old;
    /* Negative controls of the allocator checks only: the Raft-level
     * checks (election safety, log matching, leader completeness, commit
     * durability, replicas' states) are off, so a broken core can only be
     * caught by what the clients were answered (tests/sim/sim_alloc.c). */
    bool client_checks_only;
    /* A stream of garbage peer messages (random types, terms up to 2^64-1,
     * indices, lengths, snapshot bytes) from ids that are not members,
     * every few ms to a random node; each must leave the node's term,
     * role, commit and log exactly as they were (raft.h: a message that
     * fails a check changes nothing). */
    bool garbage;
};

struct sim_result
{
    bool ok;
    char violation[512];  /* what broke, when !ok */
    bool alloc_violation; /* found by the allocator checks (sim_alloc.c) */
    uint64_t trace_hash;  /* over every event: same seed, same hash */
    uint64_t events;
    uint64_t acked;     /* client requests answered */
    uint64_t ids_acked; /* bounded ids, sequence ids and prefixes acked */
    uint64_t garbage;   /* garbage messages stepped (opts.garbage) */
    uint64_t reads;     /* linearizable reads answered */
    uint64_t elections; /* terms that had a leader */
    uint64_t crashes;
    uint64_t snapshots_sent;   /* InstallSnapshot chunks delivered */
    uint64_t members_changed;  /* voters removed or added */
    uint64_t transfers;        /* TimeoutNow delivered */
    uint64_t wipes;            /* restarts with an empty disk */
    uint64_t readmitted;       /* emptied nodes voters again */
    uint64_t scenarios;        /* scripted lost-disk scenarios run */
    uint64_t rollbacks;        /* restarts from an older disk copy */
    uint64_t rollbacks_caught; /* nodes told their state went back (A4) */
    uint64_t foreign;          /* messages dropped as IDA_EFOREIGN */
    uint64_t checks_later;     /* snapshot checks whose verdict came later */
    uint64_t checks_stale;     /* ... that installed nothing (stale) */
    uint64_t end_ms;
};

/* Run one seed. Returns 0, or IDA_ENOMEM. The outcome is in @res. */
int sim_run(const struct sim_opts *opts, struct sim_result *res);

/* The default virtual duration of a seed in @mode. */
uint64_t sim_default_duration_ms(enum sim_mode mode);

#endif /* IDA_SIM_H */
