/* build/prog/sim: run simulator seeds (make sim SEEDS=N START=S MODE=...).
 *
 *   sim --seeds N --start S --mode safety|liveness --nodes 3|5
 *       [--trace] [--duration MS] [--bugs MASK] [--no-wipe]
 *       [--rollback|--rollback-old]
 *       [--garbage]
 *       [--client-checks-only]
 *
 * Prints each failing seed with the command that replays it with a trace,
 * then "N passed, M failed"; exits 1 if any seed failed. --trace prints the
 * readable event trace of every seed run (use it with --seeds 1).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/sim/sim.h"

static const char *argv_duration(uint64_t d)
{
    static char buf[24];
    snprintf(buf, sizeof(buf), "%" PRIu64, d);
    return buf;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: sim --seeds N --start S --mode safety|liveness "
            "--nodes 3|5 [--trace] [--duration MS] [--bugs MASK] "
            "[--no-wipe] [--rollback|--rollback-old] [--client-checks-only] "
            "[--garbage]\n");
    return 2;
}

int main(int argc, char **argv)
{
    uint64_t seeds = 1000, start = 1, duration = 0;
    struct sim_opts o = {.nodes = 3, .mode = SIM_SAFETY};
    const char *mode = "safety";
    bool trace = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--trace") == 0) {
            trace = true;
            continue;
        }
        if (strcmp(a, "--no-wipe") == 0) {
            o.no_wipe = true;
            continue;
        }
        if (strcmp(a, "--rollback") == 0) {
            o.rollback = true;
            continue;
        }
        if (strcmp(a, "--rollback-old") == 0) {
            o.rollback = o.rollback_old = true;
            continue;
        }
        if (strcmp(a, "--client-checks-only") == 0) {
            o.client_checks_only = true;
            continue;
        }
        if (strcmp(a, "--garbage") == 0) {
            o.garbage = true;
            continue;
        }
        if (v == NULL) {
            return usage();
        }
        i++;
        if (strcmp(a, "--seeds") == 0) {
            seeds = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--start") == 0) {
            start = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--mode") == 0) {
            mode = v;
            if (strcmp(v, "safety") == 0) {
                o.mode = SIM_SAFETY;
            } else if (strcmp(v, "liveness") == 0) {
                o.mode = SIM_LIVENESS;
            } else {
                return usage();
            }
        } else if (strcmp(a, "--nodes") == 0) {
            o.nodes = atoi(v);
            if (o.nodes != 3 && o.nodes != 5) {
                return usage();
            }
        } else if (strcmp(a, "--duration") == 0) {
            duration = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--bugs") == 0) {
            o.bugs = (uint32_t)strtoul(v, NULL, 0);
        } else {
            return usage();
        }
    }
    o.duration_ms = duration;
    o.trace = trace ? stdout : NULL;
    uint64_t passed = 0, failed = 0, acked = 0, wipes = 0, readmitted = 0;
    uint64_t scenarios = 0, rollbacks = 0, caught = 0, foreign = 0;
    uint64_t later = 0, stale = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t sd = start; sd < start + seeds; sd++) {
        struct sim_result r;
        o.seed = sd;
        int rv = sim_run(&o, &r);
        acked += r.acked;
        wipes += r.wipes;
        readmitted += r.readmitted;
        scenarios += r.scenarios;
        rollbacks += r.rollbacks;
        caught += r.rollbacks_caught;
        foreign += r.foreign;
        later += r.checks_later;
        stale += r.checks_stale;
        if (rv == 0 && r.ok) {
            passed++;
            if (trace) {
                printf("seed %" PRIu64 " ok: trace hash %016" PRIx64
                       ", %" PRIu64 " events, %" PRIu64 " acked, %" PRIu64
                       " reads, %" PRIu64 " leaders, %" PRIu64
                       " crashes, %" PRIu64 " snapshot chunks, %" PRIu64
                       " transfers, %" PRIu64 " membership changes\n",
                       sd, r.trace_hash, r.events, r.acked, r.reads,
                       r.elections, r.crashes, r.snapshots_sent, r.transfers,
                       r.members_changed);
            }
            continue;
        }
        failed++;
        char bugs[64] = "";
        snprintf(bugs, sizeof(bugs), "%s%s%s%s", o.no_wipe ? " --no-wipe" : "",
                 o.rollback_old ? " --rollback-old"
                 : o.rollback   ? " --rollback"
                                : "",
                 o.client_checks_only ? " --client-checks-only" : "",
                 o.garbage ? " --garbage" : "");
        if (o.bugs != 0) {
            size_t bl = strlen(bugs);
            snprintf(bugs + bl, sizeof(bugs) - bl, " --bugs 0x%x", o.bugs);
        }
        printf("FAIL seed %" PRIu64
               ": %s\n  replay: build/prog/sim --seeds 1 "
               "--start %" PRIu64 " --mode %s --nodes %d%s%s%s --trace\n",
               sd, rv ? "out of memory" : r.violation, sd, mode, o.nodes, bugs,
               duration ? " --duration " : "",
               duration ? argv_duration(duration) : "");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) +
                  (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr,
            "%.1f seeds/s, %" PRIu64 " requests acked, %" PRIu64
            " disks emptied (%" PRIu64 " in the scripted scenario), %" PRIu64
            " re-admitted, %" PRIu64 " foreign messages dropped, %" PRIu64
            " rollbacks (%" PRIu64 " told by a peer), %" PRIu64
            " snapshot checks answered later (%" PRIu64
            " stale: the term or role moved on, or the index was held)\n",
            secs > 0 ? (double)seeds / secs : 0.0, acked, wipes, scenarios,
            readmitted, foreign, rollbacks, caught, later, stale);
    printf("%" PRIu64 " passed, %" PRIu64 " failed\n", passed, failed);
    return failed ? 1 : 0;
}
