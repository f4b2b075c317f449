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
