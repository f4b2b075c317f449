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
 * the state (at 10 M allocations, 0.75 s of a 2.4 s restart). A divisor D
 * bounds the replay and the memory the log takes by S / D, for D times the
 * snapshot work of D = 1: still O(1) per byte applied (encoded <= D x
 * applied + S), and done by a forked child off the critical path
 * (bgsnap.h). The divisor weighs two targets of the same run against each
 * other (10 M allocations, 2 cores shared by three nodes and the load;
 * make bench-scale):
 * - throughput under load: each snapshot costs its node ~1 to 1.5 s of CPU
 *   (the child's encoding of 180 MB, storing it, copy-on-write faults).
 *   Before nodes took turns (TURNS below), S / 2 ran at 84 to 98% of the
 *   empty cluster's rate (target 80%), S / 3 at 76% and S / 4 at 75%
 *   (one run each). With turns, S / 3 ran at 82% and 74% (10,626 of
 *   12,937 and 9,987 of 13,504 allocs/s, two runs on 2026-11-27);
 * - restart: the rebuild takes ~1.1 s, then the log since the snapshot
 *   replays (about 13% faster since each command is worked out once,
 *   ahead: fsm_internal.h, struct ida__cmd_pre). On a kept 10.7 M state
 *   (scripts/bench/kept-restart.py) a log of 24.4 k entries (78 MB, S /
 *   2.3) replayed in 0.43 to 0.57 s and the node served after 1.66 to
 *   1.98 s (six runs); with S / 2 the log reaches ~28 k entries before
 *   the next snapshot, ~0.1 s more: the worst restart is at the target's
 *   edge, about 1.8 to 2.1 s. S / 3 bounds the log at ~19 k entries; a
 *   log that long gave 1.61 to 1.99 s in five runs, the rebuild's own
 *   swing (0.9 to 1.4 s) larger than the difference.
 * Throughput is paid all the time, the worst restart only by a node killed
 * at the wrong moment, and S / 3 gave up the throughput target in one of
 * two runs for ~0.1 s of worst restart: S / 2. A new node's catch-up
 * replays the leader's log since its snapshot, so it weighs the same way.
 *
 * snapshot_interval_entries stays the floor (a small state still snapshots
 * every N entries, so the log of a quiet-but-busy cluster stays short), and
 * each threshold gets a random extra of up to half the floor, drawn per
 * snapshot from a per-node seed: three nodes that applied the same entries
 * no longer snapshot at the same index (the stall all three paid together
 * at once, which cost a leader its check-quorum in the run).
 *
 * TURNS. The random extra separates small states only: once the bytes rule
 * decides, nodes of one state have the same threshold, and nodes that
 * installed the same snapshot go on in step (at 10 M allocations two nodes
 * snapshotted within 1% of each other's index every time, their children
 * encoding 3 to 6 s at once on 2 cores). A random threshold does not keep
 * them apart (three random points on a period put two within a sixth of it
 * three times in four); knowing the others' does. So nodes take turns:
 * every peer message says whether its sender has a child encoding a
 * snapshot (or a backup's copy), and a leader's appends say whether one of
 * its other followers has (PeerMessage.snapshotting, peer_snapshotting;
 * followers hear one another only through the leader, and only first-hand
 * reports are passed on, and a follower's own report is not relayed back
 * to it, so a report cannot circle back). A node whose
 * snapshot is due while a peer's child runs (or a child of its own making
 * a backup's copy, src/node/backup_copy.h) waits for it
 * (ida_snap_policy_wait()), up to a cap of three times its own last encode
 * (a peer of the same state takes about as long; two may be ahead), at
 * least 1 s and at most 60 s, 10 s when it has not encoded one yet. Once
 * the peer is done, a node that waited goes after a random pause of up to
 * IDA_SNAP_SETTLE_MS, and waits again if another one went first: two
 * nodes that waited for the same child do not start together. A snapshot
 * that finds nobody busy pauses the same way first: nodes that installed
 * the same snapshot fall due on the same entry, which every one of them
 * applies within a few ms, and would otherwise fork together before any
 * report could travel (a report reaches a follower from another in two
 * hops, through the leader). The pause costs a snapshot up to a second of
 * log, which is nothing beside the period at any size where turns
 * matter. The reports are advice: a member that always says it is busy
 * (broken, or forged) delays snapshots by the cap (each of the node it
 * tells; told to a leader, each of every follower's), never stops one,
 * and costs nothing else; a report not renewed within IDA_SNAP_HEARD_MS is
 * forgotten (a peer that died mid-snapshot). Only reports at the node's
 * current term from a member count, relays only from the leader it
 * follows. Two nodes whose pauses end within a report's travel of each
 * other still both go (under load a few ms of a 1 s pause).
 *
 * CATCH-UP. A leader's snapshot ends by dropping the log up to its index.
 * A follower that still needs some of that log (one receiving a snapshot,
 * which will want the entries after it; one that restarted and replays
 * what it missed) then needs a whole snapshot again: at 10 M allocations
 * a new node received 180 MB, and the leader, having taken its next
 * snapshot meanwhile, sent 180 MB more (make bench-scale: 44 MB/s start
 * to caught up, against 102 to 129 MB/s in runs where it did not). So a
 * leader's due snapshot also waits, the same way and up to the same cap,
 * while a follower heard from lately (IDA_SNAP_HEARD_MS) is being sent a
 * snapshot or is more than IDA_SNAP_CATCHUP_LAG entries behind the
 * commit index (ida_snap_follower_behind()). A follower keeping up is a
 * few entries behind (an entry is a batch of commands); one that is
 * slow for good costs each snapshot the cap, never more.
 *
 * HOLD. The wait above is decided before the fork; a follower that comes
 * while the child already encodes (a wiped node re-admitted 3 s into an
 * encode, in one bench-scale run of four) was still sent the snapshot
 * stored, and then, the new one replacing it 1.6 s into the transfer, the
 * new one from byte 0: 44 MB/s learner added to installed, against 120 to
 * 160 MB/s. So once encoded and stored (still invisible: storage's writer
 * is done but not finished), a leader's snapshot is held back from
 * replacing the one stored, and the log it covers stays, while a follower
 * catches up as above, for at most IDA_SNAP_HOLD_MS (ida_snap_hold();
 * a newer snapshot replacing one held keeps the first one's start). The
 * transfer under way goes on with the snapshot it started, and the entries
 * after it that the follower then needs are still in the log. Holding costs
 * the log since the older snapshot for that long more (memory, and a
 * longer replay if the leader restarts meanwhile) and, in storage, both
 * snapshots' bytes; a crash while holding is a crash before the finishing
 * step, which loses nothing (the older snapshot and the whole log are
 * what is durable). A node that is no longer leader lets go at once.
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
    /* Turns (see TURNS): when a due snapshot started waiting for a peer's
     * (valid when waiting), and how long this node's last encode took. */
    int waiting;
    uint64_t waiting_since_ms;
    uint64_t settle_until_ms; /* 0: a peer was busy at the last look */
    int waited_for_peer;      /* this wait saw a peer busy */
    uint64_t encode_ms;       /* 0: none measured yet */
};

/* After a wait, the pause before going is drawn from [1, this] ms. */
#define IDA_SNAP_SETTLE_MS 1000

/* What a peer said of its snapshots (see TURNS). */
#define IDA_SNAP_PEERS_MAX 16
/* A report not renewed within this long is forgotten. */
#define IDA_SNAP_HEARD_MS 3000
struct ida_snap_peers
{
    struct
    {
        uint32_t id;
        int own;     /* its own child runs */
        int relayed; /* it is a leader and another of its followers' runs */
        uint64_t heard_ms;
    } p[IDA_SNAP_PEERS_MAX];
    size_t n;
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

/* This node's last snapshot took @ms to encode (the wait's cap). */
void ida_snap_policy_encoded(struct ida_snap_policy *p, uint64_t ms);

/* A snapshot is due at @now_ms (monotonic): whether to put it off (see
 * TURNS): for a random pause of up to IDA_SNAP_SETTLE_MS, drawn again
 * after every look at which a peer's child was encoding (@peer_busy), and
 * never past the cap. A return of 0 ends the wait; how long it lasted is
 * in *@waited_ms when a peer was seen busy (else 0). */
int ida_snap_policy_wait(struct ida_snap_policy *p,
                         int peer_busy,
                         uint64_t now_ms,
                         uint64_t *waited_ms);

/* The wait's cap at the current encode time, in ms. */
uint64_t ida_snap_policy_wait_cap_ms(const struct ida_snap_policy *p);

/* Peer @id's message at @now_ms said @own (its child runs) and @relayed
 * (it leads, and another follower's child runs). Full table: the report
 * heard longest ago gives way. */
void ida_snap_peers_heard(struct ida_snap_peers *s,
                          uint32_t id,
                          int own,
                          int relayed,
                          uint64_t now_ms);

/* Whether a peer's child runs, as reported within IDA_SNAP_HEARD_MS of
 * @now_ms: first-hand reports only (what a leader passes on), or those
 * and relayed ones (what decides a wait). */
int ida_snap_peers_busy(const struct ida_snap_peers *s,
                        uint64_t now_ms,
                        int first_hand_only);

/* What a leader relays, as one word (kept in an atomic): how many peers
 * report first-hand that their child runs (counted up to 2) and, when it
 * is one, its id. */
uint64_t ida_snap_peers_relay_word(const struct ida_snap_peers *s,
                                   uint64_t now_ms);

/* Entries a follower may be behind the commit index and still count as
 * keeping up (CATCH-UP). */
#define IDA_SNAP_CATCHUP_LAG 1024

/* Whether a leader's due snapshot waits for follower @id (CATCH-UP): heard
 * from within IDA_SNAP_HEARD_MS of @now_ms (@s: every member's message at
 * the current term is noted there) and either being sent a snapshot
 * (@sending) or, at @match, more than IDA_SNAP_CATCHUP_LAG entries behind
 * @commit. */
int ida_snap_follower_behind(const struct ida_snap_peers *s,
                             uint32_t id,
                             int sending,
                             uint64_t match,
                             uint64_t commit,
                             uint64_t now_ms);

/* HOLD: a leader's snapshot done encoding waits at most this long. At
 * 100 MB/s that covers a transfer of 3 GB. */
#define IDA_SNAP_HOLD_MS 30000

/* Whether a snapshot done encoding, held since @since_ms, is still held at
 * @now_ms (HOLD): on a leader (@leader) while a follower catches up
 * (@behind), and not past IDA_SNAP_HOLD_MS. */
int ida_snap_hold(int leader, int behind, uint64_t since_ms, uint64_t now_ms);

/* Whether a leader holding @word tells follower @to that another
 * follower's child runs (its own report is not echoed back to it). */
int ida_snap_relay_to(uint64_t word, uint32_t to);

#endif /* IDA_NODE_SNAP_POLICY_H */
