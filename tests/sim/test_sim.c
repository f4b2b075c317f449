/* The simulator in `make test` (every node runs the real allocator, fsm/;
 * disks emptied by default: a restart with a new incarnation, re-admitted by
 * the membership procedure): 2,600 safety seeds, 700 liveness seeds, the
 * same-seed-same-trace check and the negative controls (a core broken on
 * purpose must be caught within 1,000 seeds, by all the checks and by the
 * allocator's checks alone). `make sim-long` (part of `make chaos`) runs
 * 20,000 seeds of each mode and size. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <string.h>

#include "raft/raft.h"
#include "raft/testing.h"
#include "tests/sim/sim.h"

/* --- helpers -------------------------------------------------------------- */

/* Run seeds [first, first+count); fail on the first violation with the
 * replay command. Returns the number of acknowledged client requests. */
static uint64_t run_seeds(uint64_t first,
                          uint64_t count,
                          int nodes,
                          enum sim_mode mode)
{
    uint64_t acked = 0, elections = 0, crashes = 0, snaps = 0, transfers = 0;
    uint64_t reads = 0, members = 0, wipes = 0, readmitted = 0, ids = 0;
    for (uint64_t sd = first; sd < first + count; sd++) {
        struct sim_opts o = {.seed = sd, .nodes = nodes, .mode = mode};
        struct sim_result r;
        cr_assert_eq(sim_run(&o, &r), 0, "seed %" PRIu64 ": out of memory", sd);
        cr_assert(r.ok,
                  "seed %" PRIu64
                  ": %s\nreplay: build/prog/sim --seeds 1 "
                  "--start %" PRIu64 " --mode %s --nodes %d --trace",
                  sd, r.violation, sd,
                  mode == SIM_SAFETY ? "safety" : "liveness", nodes);
        acked += r.acked;
        reads += r.reads;
        elections += r.elections;
        crashes += r.crashes;
        snaps += r.snapshots_sent;
        transfers += r.transfers;
        members += r.members_changed;
        wipes += r.wipes;
        readmitted += r.readmitted;
        ids += r.ids_acked;
    }
    /* The runs must have exercised what they claim to test. */
    cr_assert_gt(acked, count * 10, "too few requests acknowledged");
    cr_assert_gt(ids, count * 10, "too few ids and prefixes acknowledged");
    cr_assert_gt(reads, count, "too few reads");
    cr_assert_gt(elections, count, "too few elections");
    cr_assert_gt(crashes, count / 2, "too few crashes");
    cr_assert_gt(snaps, 0, "no InstallSnapshot was ever delivered");
    cr_assert_gt(transfers, 0, "no leadership transfer happened");
    cr_assert_gt(members, count / 4, "too few membership changes");
    cr_assert_gt(wipes, count / 4, "too few disks emptied");
    cr_assert_gt(readmitted, wipes / 2, "too few emptied nodes re-admitted");
    return acked;
}

/* Seeds until the first violation, at most @limit. Returns the seed, 0 if
 * none failed. */
static uint64_t first_violation(uint32_t bugs,
                                int nodes,
                                bool client_checks_only,
                                uint64_t limit,
                                char *why,
                                size_t why_len)
{
    for (uint64_t sd = 1; sd <= limit; sd++) {
        struct sim_opts o = {.seed = sd,
                             .nodes = nodes,
                             .bugs = bugs,
                             .client_checks_only = client_checks_only};
        struct sim_result r;
        cr_assert_eq(sim_run(&o, &r), 0, "seed %" PRIu64 ": out of memory", sd);
        if (!r.ok) {
            snprintf(why, why_len, "%s", r.violation);
            /* With only the allocator's checks on, only they may fire. */
            cr_assert(!client_checks_only || r.alloc_violation,
                      "seed %" PRIu64 ": not an allocator check: %s", sd,
                      r.violation);
            return sd;
        }
    }
    return 0;
}

static void expect_caught_by(uint32_t bugs,
                             bool client_checks_only,
                             const char *what)
{
    char why[512] = "";
    uint64_t sd =
        first_violation(bugs, 3, client_checks_only, 1000, why, sizeof(why));
    cr_assert_neq(sd, 0, "%s: no violation found in 1000 seeds", what);
    cr_log_info("%s caught at seed %" PRIu64 ": %s", what, sd, why);
    /* The same seed with a correct core passes: the core's bug, not the
     * seed, is what the checker found. */
    struct sim_opts o = {.seed = sd, .nodes = 3};
    struct sim_result r;
    cr_assert_eq(sim_run(&o, &r), 0);
    cr_assert(r.ok, "seed %" PRIu64 " fails without the bug: %s", sd,
              r.violation);
}

static void expect_caught(uint32_t bugs, const char *what)
{
    expect_caught_by(bugs, false, what);
}

/* --- safety and liveness ----------------------------------------------------
 */

Test(sim, safety_3_nodes_seeds_1_to_1000, .timeout = 600)
{
    run_seeds(1, 1000, 3, SIM_SAFETY);
}

Test(sim, safety_3_nodes_seeds_1001_to_2000, .timeout = 600)
{
    run_seeds(1001, 1000, 3, SIM_SAFETY);
}

Test(sim, safety_5_nodes_600_seeds, .timeout = 600)
{
    run_seeds(1, 600, 5, SIM_SAFETY);
}

Test(sim, liveness_3_nodes_500_seeds, .timeout = 600)
{
    run_seeds(1, 500, 3, SIM_LIVENESS);
}

Test(sim, liveness_5_nodes_200_seeds, .timeout = 600)
{
    run_seeds(1, 200, 5, SIM_LIVENESS);
}

/* A stream of garbage peer messages from non-members (sim.h, garbage):
 * every one leaves the node it reached as it was, and the runs stay safe
 * and live. */
static void run_garbage(uint64_t first,
                        uint64_t count,
                        int nodes,
                        enum sim_mode mode)
{
    uint64_t garbage = 0;
    for (uint64_t sd = first; sd < first + count; sd++) {
        struct sim_opts o = {
            .seed = sd, .nodes = nodes, .mode = mode, .garbage = true};
        struct sim_result r;
        cr_assert_eq(sim_run(&o, &r), 0, "seed %" PRIu64 ": out of memory", sd);
        cr_assert(r.ok, "seed %" PRIu64 " (--garbage): %s", sd, r.violation);
        garbage += r.garbage;
    }
    cr_assert_gt(garbage, count * 100, "too few garbage messages: %" PRIu64,
                 garbage);
    cr_log_info("%" PRIu64 " garbage messages in %" PRIu64 " seeds", garbage,
                count);
}

Test(sim, garbage_from_non_members_changes_nothing_safety, .timeout = 600)
{
    run_garbage(1, 300, 3, SIM_SAFETY);
}

Test(sim, garbage_from_non_members_changes_nothing_liveness, .timeout = 600)
{
    run_garbage(1, 150, 5, SIM_LIVENESS);
}

/* Negative control: a core that reads strangers' vote requests and answers
 * lets the garbage move its term, and the check says so. */
Test(sim, garbage_check_catches_a_core_that_hears_strangers, .timeout = 600)
{
    for (uint64_t sd = 1; sd <= 200; sd++) {
        struct sim_opts o = {.seed = sd,
                             .nodes = 3,
                             .garbage = true,
                             .bugs = IDA_RAFT_BUG_HEAR_STRANGERS};
        struct sim_result r;
        cr_assert_eq(sim_run(&o, &r), 0);
        if (!r.ok) {
            cr_assert(strstr(r.violation, "garbage from non-member") != NULL,
                      "seed %" PRIu64 ": %s", sd, r.violation);
            cr_log_info("hearing strangers caught at seed %" PRIu64 ": %s", sd,
                        r.violation);
            return;
        }
    }
    cr_assert_fail("a core that hears strangers passed 200 garbage seeds");
}

/* --- determinism ------------------------------------------------------------
 */

Test(sim, same_seed_same_trace)
{
    uint64_t prev = 0;
    for (uint64_t sd = 1; sd <= 20; sd++) {
        struct sim_opts o = {.seed = sd, .nodes = sd % 2 ? 3 : 5};
        struct sim_result a, b;
        cr_assert_eq(sim_run(&o, &a), 0);
        cr_assert_eq(sim_run(&o, &b), 0);
        cr_assert_eq(a.trace_hash, b.trace_hash, "seed %" PRIu64, sd);
        cr_assert_eq(a.events, b.events, "seed %" PRIu64, sd);
        cr_assert_eq(a.acked, b.acked, "seed %" PRIu64, sd);
        cr_assert_gt(a.events, 1000, "seed %" PRIu64 " did little", sd);
        /* Different seeds take different paths. */
        cr_assert_neq(a.trace_hash, prev, "seed %" PRIu64, sd);
        prev = a.trace_hash;
    }
    struct sim_opts o = {.seed = 7, .nodes = 3, .mode = SIM_LIVENESS};
    struct sim_result a, b;
    cr_assert_eq(sim_run(&o, &a), 0);
    cr_assert_eq(sim_run(&o, &b), 0);
    cr_assert_eq(a.trace_hash, b.trace_hash);
}

/* --- negative controls: a checker that never fires is worth nothing ----------
 */

Test(sim, catches_votes_without_log_check, .timeout = 600)
{
    expect_caught(IDA_RAFT_BUG_VOTE_NO_LOG_CHECK, "vote without log check");
}

Test(sim, catches_ack_before_persist, .timeout = 600)
{
    expect_caught(IDA_RAFT_BUG_ACK_BEFORE_PERSIST, "ack before persist");
}

Test(sim, catches_forgotten_vote, .timeout = 600)
{
    expect_caught(IDA_RAFT_BUG_FORGET_VOTE, "vote forgotten on restart");
}

/* Admission (raft/admission.h): with incarnations ignored, a node whose
 * disk was emptied votes and acknowledges as its old self, and the
 * simulator (which empties disks by default) finds the lost entry. The
 * safety runs above cover the same seeds with the rule on. */
Test(sim, catches_ignored_incarnation, .timeout = 600)
{
    expect_caught(IDA_RAFT_BUG_IGNORE_INCARNATION,
                  "emptied disk votes as its old incarnation");
}

/* The allocator's own checks (tests/sim/sim_alloc.c) with every Raft-level
 * check off: a core that lets an emptied disk vote as its old self, or that
 * acknowledges before persisting, is caught by what the clients were
 * answered alone (an acknowledged id handed out again, a lost alloc, a
 * lookup that disagrees). */
Test(sim, allocator_checks_catch_ignored_incarnation, .timeout = 600)
{
    expect_caught_by(IDA_RAFT_BUG_IGNORE_INCARNATION, true,
                     "allocator checks, emptied disk votes as its old self");
}

Test(sim, allocator_checks_catch_votes_without_log_check, .timeout = 600)
{
    expect_caught_by(IDA_RAFT_BUG_VOTE_NO_LOG_CHECK, true,
                     "allocator checks, vote without log check");
}

/* Rule A4 (raft/admission.h): nodes restarted from a copy of their disk
 * taken before their last start. No rule can save every such run (the
 * members that heard the later start may all be down), so this checks that
 * the rule is at work: it tells rolled-back nodes, and fewer seeds lose an
 * acknowledged entry than with the rule off (IDA_RAFT_BUG_IGNORE_ROLLBACK,
 * the negative control) on the same seeds. Every other run checks the
 * converse: no honest restart is ever told (a false alarm is a violation). */
static unsigned rollback_failures(uint32_t bugs, uint64_t *caught)
{
    unsigned failed = 0;
    *caught = 0;
    for (uint64_t sd = 1; sd <= 400; sd++) {
        struct sim_opts o = {.seed = sd,
                             .nodes = 3,
                             .mode = SIM_SAFETY,
                             .bugs = bugs,
                             .rollback = true,
                             .rollback_old = true};
        struct sim_result r;
        cr_assert_eq(sim_run(&o, &r), 0, "seed %" PRIu64 ": out of memory", sd);
        failed += !r.ok;
        *caught += r.rollbacks_caught;
    }
    return failed;
}

Test(sim, rolled_back_disks_are_told_and_lose_less, .timeout = 600)
{
    uint64_t caught_on, caught_off;
    unsigned with_rule = rollback_failures(0, &caught_on);
    unsigned without =
        rollback_failures(IDA_RAFT_BUG_IGNORE_ROLLBACK, &caught_off);
    cr_log_info("rollback-old, 400 seeds: %u failed with rule A4 (%" PRIu64
                " nodes told), %u without",
                with_rule, caught_on, without);
    cr_assert_eq(caught_off, 0, "the control told a node anyway");
    cr_assert_gt(caught_on, 100, "only %" PRIu64 " rolled-back nodes told",
                 caught_on);
    cr_assert_lt(with_rule, without,
                 "rule A4 saved nothing: %u failed with it, %u without",
                 with_rule, without);
}
