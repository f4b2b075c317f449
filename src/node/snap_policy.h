/* When a node takes a snapshot: a pure rule, unit-tested in
 * tests/node/test_snap_policy.c.
 *
 * DESIGN (issue 19: snapshot cost amortized to a constant per applied
 * entry, and nodes not all snapshotting at the same moment).
 *
 * A snapshot costs time and bytes in proportion to the state, S bytes. The
 * old rule, "every snapshot_interval_entries entries", paid S every N
 * entries: with millions of live allocations, S grows and so does the cost
 * per entry, without bound. The rule here snapshots only once the entries
 * applied since the last snapshot carry at least as many bytes as that
 * snapshot had (bytes_since >= last_bytes; but see the divisor below):
 * snapshot k+1 is paid for by at
 * least S_k bytes of log, so all snapshots together encode at most the
 * bytes applied plus the last snapshot: O(1) per byte applied, whatever the
 * state's size. The price is memory and
 * replay time: the log kept between snapshots is at most about the size of
 * the state (S), and a restart replays at most that much.
 *
 * The threshold is S / IDA_SNAP_LOG_DIVISOR rather than S: a log entry
 * carries more bytes per command than the state keeps per allocation (a
 * request id, a session, the pool name: about 45 bytes against 19), so a
 * log as big as S is two to three times as many commands as the state has
 * allocations, and replaying it at a restart took as long as rebuilding
 * the state (at 10 M allocations, 0.75 s of a 2.4 s restart). S / 2
 * halves the replay and the memory the log takes, for twice the snapshot
 * work: still O(1) per byte applied (encoded <= 2 x applied + S), and done
 * by a forked child off the critical path (bgsnap.h). The divisor weighs
 * two targets of the same run against each other (10 M allocations, 2
 * cores shared by three nodes and the load; make bench-scale):
 * - throughput under load: each snapshot costs its node ~1 to 1.5 s of CPU
 *   (the child's encoding of 180 MB, storing it, copy-on-write faults).
 *   With S / 2 the full cluster ran at 84 to 98% of the empty one's rate
 *   (target 80%); with S / 3 at 76% and with S / 4 at 75% (one run each:
 *   two to three snapshots fell in the 30 s measured);
 * - restart: the rebuild takes ~1.2 s, then the log since the snapshot
 *   replays at ~12 us per entry (~2 KB). With S / 2 a node killed just
 *   before its next snapshot replays ~43 k entries, ~0.55 s: about 2.05 s
 *   in all, the target's edge (measured: 1.67 and 1.74 s); S / 3
 *   would make it ~1.87 s.
 * Throughput is paid all the time, the worst restart only by a node killed
 * at the wrong moment: S / 2. A new node's catch-up replays the leader's
 * log since its snapshot, so it weighs the same way.
 *
 * snapshot_interval_entries stays the floor (a small state still snapshots
 * every N entries, so the log of a quiet-but-busy cluster stays short), and
 * each threshold gets a random extra of up to half the floor, drawn per
 * snapshot from a per-node seed: three nodes that applied the same entries
 * no longer snapshot at the same index (the stall all three paid together
 * at once, which cost a leader its check-quorum in the run).
 */
#ifndef IDA_NODE_SNAP_POLICY_H
#define IDA_NODE_SNAP_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* A snapshot is due once the log since the last one holds that snapshot's
 * size divided by this (and the floor's entries). */
#define IDA_SNAP_LOG_DIVISOR 2

struct ida_snap_policy
{
    uint64_t floor_entries; /* snapshot_interval_entries, >= 1 */
    uint64_t rng;           /* xorshift state, never 0 */
    /* Since the last snapshot (or restore, or start). */
    uint64_t entries_since, bytes_since;
    uint64_t threshold_entries; /* floor plus this round's random extra */
    uint64_t last_bytes;        /* size of the last snapshot; 0: none yet */
};

/* @seed: different on every node (node id and incarnation mixed in). */
void ida_snap_policy_init(struct ida_snap_policy *p,
                          uint64_t floor_entries,
                          uint64_t seed);

/* An entry of @len bytes was applied. */
void ida_snap_policy_applied(struct ida_snap_policy *p, size_t len);

/* Whether to snapshot now. */
int ida_snap_policy_due(const struct ida_snap_policy *p);

/* A snapshot of @bytes was taken (or installed from the leader, or
 * restored at start: the log since it is what counts). Draws the next
 * threshold. */
void ida_snap_policy_taken(struct ida_snap_policy *p, size_t bytes);

#endif /* IDA_NODE_SNAP_POLICY_H */
