/* Crash durability with real processes: kill -9 at random moments, reopen,
 * check every reported batch (see tests/storage/crash.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/storage/crash.h"
#include "tests/storage/helpers.h"

#define ROUNDS 60

Test(storage_crash, kill9_rounds_keep_every_reported_batch, .timeout = 300)
{
    char dir[256];
    cr_assert_eq(ida_test_tmpdir(dir, sizeof(dir), "crash"), 0);
    const char *env = getenv("SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : 20261121;
    struct ida_crash_stats st;
    char err[512] = "";
    int rv = ida_crash_run(dir, ROUNDS, seed, &st, err, sizeof(err));
    cr_log_info(
        "crash: %u rounds, %lu steps reported, %u in-flight found, "
        "%u killed before any report, %lu entries checked, %lu snapshot "
        "steps",
        st.rounds, st.batches_reported, st.in_flight_found,
        st.killed_before_first_report, st.entries_checked,
        st.snapshots_reported);
    ida_test_rmrf(dir);
    cr_assert_eq(rv, 0, "%s", err);
    cr_assert_eq(st.rounds, ROUNDS);
    /* The kills must land mid-run, or the test proves nothing. */
    cr_assert_gt(st.batches_reported, 0);
    cr_assert_lt(st.child_finished, ROUNDS);
    cr_assert_gt(st.snapshots_reported, 0, "snapshot steps were exercised");
}
