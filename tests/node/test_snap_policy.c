/* src/node/snap_policy: when a node snapshots. */
#include <criterion/criterion.h>

#include "src/node/snap_policy.h"

static uint64_t entries_until_due(struct ida_snap_policy *p, size_t len)
{
    uint64_t n = 0;
    while (!ida_snap_policy_due(p)) {
        ida_snap_policy_applied(p, len);
        n++;
        cr_assert_lt(n, 100000000, "never due");
    }
    return n;
}

Test(snap_policy, floor_plus_at_most_half_of_it)
{
    for (uint64_t seed = 1; seed <= 50; seed++) {
        struct ida_snap_policy p;
        ida_snap_policy_init(&p, 1000, seed);
        uint64_t n = entries_until_due(&p, 100);
        cr_assert_geq(n, 1000);
        cr_assert_leq(n, 1500);
    }
}

/* Nodes with different seeds snapshot at different indexes. */
Test(snap_policy, nodes_do_not_snapshot_together)
{
    uint64_t at[3];
    for (int i = 0; i < 3; i++) {
        struct ida_snap_policy p;
        ida_snap_policy_init(&p, 10000, (uint64_t)(i + 1) * 7919);
        at[i] = entries_until_due(&p, 50);
    }
    cr_assert(at[0] != at[1] || at[1] != at[2],
              "three nodes snapshot at %llu %llu %llu",
              (unsigned long long)at[0], (unsigned long long)at[1],
              (unsigned long long)at[2]);
}

/* Amortized: after a snapshot of S bytes, the next one waits for S / D
 * bytes of log (D = IDA_SNAP_LOG_DIVISOR), so the bytes encoded per byte
 * applied stay <= D however big the state grows. */
Test(snap_policy, cost_per_applied_byte_stays_bounded)
{
    struct ida_snap_policy p;
    ida_snap_policy_init(&p, 100, 42);
    uint64_t state = 0, applied = 0, encoded = 0;
    for (int round = 0; round < 200000; round++) {
        ida_snap_policy_applied(&p, 64);
        applied += 64;
        state += 40; /* the state grows with every entry */
        if (ida_snap_policy_due(&p)) {
            encoded += state;
            ida_snap_policy_taken(&p, (size_t)state);
        }
    }
    /* Snapshot k+1 waits for S_k / D log bytes, so the sum of all
     * snapshots but the last is at most D times what was applied: encoded
     * <= D applied + S_last. */
    cr_assert_leq(encoded, IDA_SNAP_LOG_DIVISOR * applied + state,
                  "encoded %llu bytes for %llu applied",
                  (unsigned long long)encoded, (unsigned long long)applied);
    /* The old rule (every 100 entries) would have encoded ~ n^2/2. */
    uint64_t old = 0;
    for (uint64_t k = 100; k <= 200000; k += 100) {
        old += k * 40;
    }
    cr_assert_gt(old, 50 * encoded);
}

Test(snap_policy, a_restored_snapshot_counts_as_the_last_one)
{
    struct ida_snap_policy p;
    ida_snap_policy_init(&p, 10, 3);
    p.last_bytes = 1 << 20;
    uint64_t n = entries_until_due(&p, 100);
    cr_assert_geq(n, (1 << 20) / IDA_SNAP_LOG_DIVISOR / 100,
                  "due after %llu entries", (unsigned long long)n);
}

/* What a restart replays and the log holds in memory: once the floor is
 * passed, a snapshot is due as soon as the log reaches S / D bytes, not
 * later (one entry of slack). */
Test(snap_policy, the_log_between_snapshots_stays_under_a_share_of_the_state)
{
    struct ida_snap_policy p;
    ida_snap_policy_init(&p, 10, 5);
    const size_t len = 100;
    for (uint64_t s = 1000; s <= 50000000; s *= 7) {
        ida_snap_policy_taken(&p, (size_t)s);
        uint64_t n = entries_until_due(&p, len);
        uint64_t bytes = n * len;
        uint64_t floor_bytes = p.threshold_entries * len;
        uint64_t share = s / IDA_SNAP_LOG_DIVISOR;
        cr_assert_leq(bytes, (floor_bytes > share ? floor_bytes : share) + len,
                      "state %llu: log of %llu bytes", (unsigned long long)s,
                      (unsigned long long)bytes);
        cr_assert_geq(bytes, share, "state %llu: due after %llu bytes",
                      (unsigned long long)s, (unsigned long long)bytes);
    }
}

/* --- turns (snap_policy.h, TURNS) --------------------------------------- */

static int wait_at(struct ida_snap_policy *p,
                   int busy,
                   uint64_t now,
                   uint64_t *waited)
{
    return ida_snap_policy_wait(p, busy, now, waited);
}

/* Nobody busy: a random pause of up to IDA_SNAP_SETTLE_MS, then go (no
 * wait for a peer reported). */
Test(snap_policy, a_due_snapshot_pauses_then_goes)
{
    for (uint64_t seed = 1; seed <= 20; seed++) {
        struct ida_snap_policy p;
        ida_snap_policy_init(&p, 10, seed);
        uint64_t waited = 99, t = 1000;
        while (wait_at(&p, 0, t, &waited)) {
            t++;
            cr_assert_leq(t, 1000 + IDA_SNAP_SETTLE_MS, "no pause ends");
        }
        cr_assert_gt(t, 1000, "no pause at all");
        cr_assert_eq(waited, 0, "no peer was busy");
    }
}

Test(snap_policy, a_due_snapshot_waits_while_a_peer_encodes)
{
    struct ida_snap_policy p;
    ida_snap_policy_init(&p, 10, 7);
    uint64_t waited = 99;
    cr_assert_eq(wait_at(&p, 1, 2000, &waited), 1);
    cr_assert_eq(wait_at(&p, 1, 2500, &waited), 1);
    /* The peer is done: a random pause, then go. */
    uint64_t t = 3200;
    while (wait_at(&p, 0, t, &waited)) {
        t++;
        cr_assert_leq(t, 3200 + IDA_SNAP_SETTLE_MS, "no pause ends");
    }
    cr_assert_gt(t, 3200);
    cr_assert_eq(waited, t - 2000);
    /* taken() ends a wait under way. */
    cr_assert_eq(wait_at(&p, 1, 9000, &waited), 1);
    ida_snap_policy_taken(&p, 100);
    cr_assert_eq(wait_at(&p, 0, 9001, &waited), 1, "a new wait's pause");
}

/* A peer that starts during the pause: the pause drawn before no longer
 * counts; a new one starts once that peer is done. */
Test(snap_policy, a_peer_busy_during_the_pause_draws_a_new_one)
{
    int tried = 0;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        struct ida_snap_policy p;
        ida_snap_policy_init(&p, 10, seed);
        uint64_t waited;
        cr_assert_eq(wait_at(&p, 1, 1000, &waited), 1);
        cr_assert_eq(wait_at(&p, 0, 1100, &waited), 1, "the pause starts");
        /* When that pause would end (on a copy). */
        struct ida_snap_policy q = p;
        uint64_t end = 1101;
        while (wait_at(&q, 0, end, &waited)) {
            end++;
        }
        if (end < 1103) {
            continue; /* no room for a peer within it */
        }
        tried++;
        cr_assert_eq(wait_at(&p, 1, 1101, &waited), 1);
        cr_assert_eq(wait_at(&p, 0, end, &waited), 1,
                     "seed %llu: went at the old pause's end",
                     (unsigned long long)seed);
    }
    cr_assert_geq(tried, 40);
}

/* A peer that always says it is busy delays a snapshot by the cap, never
 * stops it: three times the node's own last encode, within [1 s, 60 s],
 * 10 s before the first. */
Test(snap_policy, a_wait_ends_at_the_cap)
{
    const struct
    {
        uint64_t encode_ms, cap_ms;
    } c[] = {{0, 10000},
             {2000, 6000},
             {100, 1000},
             {40000, 60000},
             {UINT64_MAX / 2, 60000}};
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct ida_snap_policy p;
        ida_snap_policy_init(&p, 10, 7);
        if (c[i].encode_ms > 0) {
            ida_snap_policy_encoded(&p, c[i].encode_ms);
        }
        cr_assert_eq(ida_snap_policy_wait_cap_ms(&p), c[i].cap_ms);
        uint64_t waited, t0 = 5000;
        cr_assert_eq(wait_at(&p, 1, t0, &waited), 1);
        cr_assert_eq(wait_at(&p, 1, t0 + c[i].cap_ms - 1, &waited), 1);
        cr_assert_eq(wait_at(&p, 1, t0 + c[i].cap_ms, &waited), 0,
                     "case %zu: still waiting at the cap", i);
        cr_assert_eq(waited, c[i].cap_ms);
    }
}

Test(snap_policy, peers_reports_first_hand_relayed_and_expired)
{
    struct ida_snap_peers s = {0};
    cr_assert_eq(ida_snap_peers_busy(&s, 100, 0), 0);
    ida_snap_peers_heard(&s, 2, 0, 1, 1000); /* a leader relays */
    cr_assert_eq(ida_snap_peers_busy(&s, 1000, 1), 0,
                 "a relay is not passed on again");
    cr_assert_eq(ida_snap_peers_busy(&s, 1000, 0), 1);
    ida_snap_peers_heard(&s, 3, 1, 0, 1500); /* a follower's own */
    cr_assert_eq(ida_snap_peers_busy(&s, 1500, 1), 1);
    /* Newer news from the same peer replaces the older. */
    ida_snap_peers_heard(&s, 3, 0, 0, 1600);
    ida_snap_peers_heard(&s, 2, 0, 0, 1600);
    cr_assert_eq(ida_snap_peers_busy(&s, 1600, 0), 0);
    cr_assert_eq(s.n, 2);
    /* A report not renewed is forgotten. */
    ida_snap_peers_heard(&s, 3, 1, 0, 2000);
    cr_assert_eq(ida_snap_peers_busy(&s, 2000 + IDA_SNAP_HEARD_MS - 1, 1), 1);
    cr_assert_eq(ida_snap_peers_busy(&s, 2000 + IDA_SNAP_HEARD_MS, 1), 0);
}

/* CATCH-UP: a leader waits for a live follower being sent a snapshot or
 * far behind, not for one keeping up, nor for one not heard from. */
Test(snap_policy, a_follower_catching_up_holds_the_leaders_snapshot)
{
    struct ida_snap_peers s = {0};
    uint64_t commit = 50000;
    cr_assert_eq(ida_snap_follower_behind(&s, 2, 1, 0, commit, 1000), 0,
                 "a follower never heard from counts");
    ida_snap_peers_heard(&s, 2, 0, 0, 1000);
    ida_snap_peers_heard(&s, 3, 0, 0, 1000);
    /* Being sent a snapshot, whatever its match. */
    cr_assert_eq(ida_snap_follower_behind(&s, 2, 1, commit, commit, 1000), 1);
    /* Replaying after a snapshot or a restart: behind by more than the
     * lag. */
    uint64_t edge = commit - IDA_SNAP_CATCHUP_LAG;
    cr_assert_eq(ida_snap_follower_behind(&s, 2, 0, edge - 1, commit, 1000), 1);
    cr_assert_eq(ida_snap_follower_behind(&s, 2, 0, edge, commit, 1000), 0,
                 "a follower keeping up holds snapshots");
    cr_assert_eq(ida_snap_follower_behind(&s, 3, 0, commit, commit, 1000), 0);
    /* Silent for IDA_SNAP_HEARD_MS (dead, cut off): no longer waited for. */
    cr_assert_eq(ida_snap_follower_behind(&s, 2, 1, 0, commit,
                                          1000 + IDA_SNAP_HEARD_MS - 1),
                 1);
    cr_assert_eq(
        ida_snap_follower_behind(&s, 2, 1, 0, commit, 1000 + IDA_SNAP_HEARD_MS),
        0);
}

Test(snap_policy, an_encoded_snapshot_is_held_while_a_follower_catches_up)
{
    uint64_t t0 = 5000;
    cr_assert_eq(ida_snap_hold(1, 1, t0, t0), 1);
    cr_assert_eq(ida_snap_hold(1, 1, t0, t0 + IDA_SNAP_HOLD_MS - 1), 1);
    cr_assert_eq(ida_snap_hold(1, 1, t0, t0 + IDA_SNAP_HOLD_MS), 0,
                 "a follower slow for good costs the cap, no more");
    cr_assert_eq(ida_snap_hold(1, 0, t0, t0 + 1), 0, "caught up: it goes");
    cr_assert_eq(ida_snap_hold(0, 1, t0, t0 + 1), 0,
                 "no longer leader: nobody is sent this node's snapshot");
}

Test(snap_policy, a_full_table_drops_the_oldest_report)
{
    struct ida_snap_peers s = {0};
    for (uint32_t id = 1; id <= IDA_SNAP_PEERS_MAX; id++) {
        ida_snap_peers_heard(&s, id, id == 5, 0, 1000 + id);
    }
    cr_assert_eq(ida_snap_peers_busy(&s, 1100, 1), 1);
    /* Node 1's report is the oldest: node 100 takes its place. */
    ida_snap_peers_heard(&s, 100, 0, 0, 1200);
    cr_assert_eq(s.n, IDA_SNAP_PEERS_MAX);
    for (size_t i = 0; i < s.n; i++) {
        cr_assert_neq(s.p[i].id, 1);
    }
    cr_assert_eq(ida_snap_peers_busy(&s, 1200, 1), 1, "node 5 kept");
}

/* A leader relays first-hand reports only, and not a follower's own back
 * to it. */
Test(snap_policy, a_leader_relays_the_others_reports_only)
{
    struct ida_snap_peers s = {0};
    uint64_t w = ida_snap_peers_relay_word(&s, 1000);
    cr_assert_eq(ida_snap_relay_to(w, 2), 0);
    ida_snap_peers_heard(&s, 2, 1, 0, 1000); /* follower 2's child runs */
    ida_snap_peers_heard(&s, 3, 0, 1, 1000); /* a relay, not first-hand */
    w = ida_snap_peers_relay_word(&s, 1000);
    cr_assert_eq(ida_snap_relay_to(w, 2), 0, "echoed back to node 2");
    cr_assert_eq(ida_snap_relay_to(w, 3), 1);
    cr_assert_eq(ida_snap_relay_to(w, 4), 1);
    ida_snap_peers_heard(&s, 3, 1, 0, 1000); /* and follower 3's */
    w = ida_snap_peers_relay_word(&s, 1000);
    cr_assert_eq(ida_snap_relay_to(w, 2), 1, "node 3's is news to 2");
    cr_assert_eq(ida_snap_relay_to(w, 3), 1, "node 2's is news to 3");
    /* Expired reports are not relayed. */
    w = ida_snap_peers_relay_word(&s, 1000 + IDA_SNAP_HEARD_MS);
    cr_assert_eq(ida_snap_relay_to(w, 4), 0);
}

/* The point of turns, modelled: three nodes of one state whose snapshots
 * fall due within a few hundred ms of each other (what the bytes rule
 * gives them), each encoding for 4 s, hearing the others through a leader
 * (node 0) with M_DELAY ms per message. Without turns their children run
 * together for seconds; with them, only for what the news takes to
 * travel. */
#define M_NODES 3
#define M_DELAY 5 /* ms per message: appends flow every few ms under load */
static uint64_t overlap_ms(int turns,
                           const uint64_t due[M_NODES],
                           uint64_t seed)
{
    const uint64_t encode = 4000, delay = M_DELAY;
    struct ida_snap_policy p[M_NODES];
    struct ida_snap_peers heard[M_NODES];
    uint64_t start[M_NODES], end[M_NODES];
    for (int i = 0; i < M_NODES; i++) {
        ida_snap_policy_init(&p[i], 10, seed * M_NODES + (uint64_t)i);
        ida_snap_policy_encoded(&p[i], encode);
        heard[i] = (struct ida_snap_peers){0};
        start[i] = end[i] = 0;
    }
    uint64_t overlap = 0;
    for (uint64_t t = 1; t < 60000; t++) {
        int running = 0;
        for (int i = 0; i < M_NODES; i++) {
            running += start[i] != 0 && t < end[i];
        }
        overlap += running > 1;
        /* Every `delay` ms each node hears what was true `delay` ago:
         * the leader tells each follower its own and what it heard of
         * the other before (first-hand, not the follower's own: two hops
         * from one follower to the other); followers tell the leader
         * their own. */
        if (t % delay == 0) {
            uint64_t then = t - delay;
            int own[M_NODES];
            for (int i = 0; i < M_NODES; i++) {
                own[i] = start[i] != 0 && start[i] <= then && then < end[i];
            }
            uint64_t word = ida_snap_peers_relay_word(&heard[0], t);
            for (int f = 1; f < M_NODES; f++) {
                ida_snap_peers_heard(&heard[f], 0, own[0],
                                     ida_snap_relay_to(word, (uint32_t)f), t);
            }
            for (int f = 1; f < M_NODES; f++) {
                ida_snap_peers_heard(&heard[0], (uint32_t)f, own[f], 0, t);
            }
        }
        for (int i = 0; i < M_NODES; i++) {
            if (start[i] != 0 || t < due[i]) {
                continue;
            }
            uint64_t waited;
            if (turns &&
                ida_snap_policy_wait(
                    &p[i], ida_snap_peers_busy(&heard[i], t, 0), t, &waited)) {
                continue;
            }
            start[i] = t;
            end[i] = t + encode;
        }
    }
    for (int i = 0; i < M_NODES; i++) {
        cr_assert_neq(start[i], 0, "node %d never snapshotted", i);
    }
    return overlap;
}

Test(snap_policy, nodes_take_turns_to_snapshot)
{
    const uint64_t cases[][M_NODES] = {
        {1000, 1300, 1500}, /* all three within 0.5 s */
        {2000, 2100, 9000}, /* two followers in step */
        {3030, 3000, 9000}, /* a follower, then the leader */
        {2000, 2000, 9000}, /* the leader and a follower on one entry */
        {4000, 4000, 4000}, /* all three on one entry */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        uint64_t without = 0, with = 0, runs_apart = 0;
        const uint64_t runs = 50;
        for (uint64_t seed = 1; seed <= runs; seed++) {
            without += overlap_ms(0, cases[c], seed);
            uint64_t o = overlap_ms(1, cases[c], seed);
            with += o;
            /* Apart but for what the news takes: two hops through the
             * leader, each up to two of the model's steps. */
            runs_apart += o <= 4 * M_DELAY;
        }
        cr_assert_geq(without, runs * 3000,
                      "case %zu: the model overlaps %llu ms", c,
                      (unsigned long long)without);
        /* Two nodes whose pauses end within the news' travel of each
         * other still both go: two draws from [1, 1000] ms within 20 ms
         * of each other, about 4% of the time (more with three). */
        cr_assert_geq(runs_apart, runs * 9 / 10,
                      "case %zu: children apart in %llu runs of %llu", c,
                      (unsigned long long)runs_apart, (unsigned long long)runs);
        cr_assert_leq(with * 10, without, "case %zu: %llu ms against %llu", c,
                      (unsigned long long)with, (unsigned long long)without);
    }
}
