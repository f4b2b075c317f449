/* A short chaos round in `make test`: 40 seconds, a dozen or more faults
 * (kills, pauses, partitions, wipes) and the operator's membership changes
 * through bin/idalloc meanwhile, then every promise checked, every change
 * completed and the membership whole again. Long runs: make chaos
 * DURATION=600 [CHAOS_ARGS=...]. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "tests/chaos/chaos.h"

Test(chaos, short_round_keeps_every_promise, .timeout = 400)
{
    const char *e = getenv("IDA_CHAOS_TEST_SECONDS");
    struct chaos_opts o = {.duration_s = e != NULL ? (unsigned)atoi(e) : 40,
                           .nodes = 3,
                           .seed = 7,
                           .clients = 4,
                           .history_path = NULL};
    struct chaos_report r;
    long v = chaos_run(&o, &r);
    chaos_report_print(&o, &r);
    cr_assert_geq(v, 0, "the cluster did not come up or heal");
    cr_assert_eq(v, 0, "%ld violations, first: %s", v, r.check.examples[0]);
    cr_assert_eq(r.failures, 0, "%u liveness failures, first: %s", r.failures,
                 r.failure[0]);
    cr_assert(r.membership_whole, "the membership is not whole");
    cr_assert_geq(chaos_faults_total(&r), 12, "only %u faults",
                  chaos_faults_total(&r));
    unsigned changes = r.m.removes + r.m.adds + r.m.promotes + r.m.transfers;
    cr_assert_geq(changes, 1, "no membership change or leader transfer");
    size_t ok = 0;
    for (int k = H_ALLOC; k <= H_PREFIX; k++) {
        ok += r.check.ops[k][O_OK];
    }
    cr_assert_gt(ok, 1000, "the clients barely ran (%zu ok)", ok);
}
