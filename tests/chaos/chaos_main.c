/* build/prog/chaos: make chaos [DURATION=s] [NODES=3|5] [SEED=n]
 * [CHAOS_ARGS="--manual-rejoin --rollback ..."]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/chaos/chaos.h"

static const char usage[] =
    "usage: chaos [--duration S] [--nodes 3|5] [--seed N] [--clients C] "
    "[--history FILE]\n"
    "             [--manual-rejoin] [--no-members] [--rollback]\n"
    "  runs a cluster of real idallocd processes ($IDA_BINDIR, default "
    "bin/) under\n"
    "  a seeded nemesis for S seconds (default 60), with an operator "
    "changing the\n"
    "  membership through bin/idalloc, then checks every promise.\n"
    "  --manual-rejoin  auto_rejoin off: each wiped node is replaced by "
    "the README\n"
    "                   Runbook's member remove/add/promote\n"
    "  --no-members     no membership changes or leader transfers by the "
    "operator\n"
    "  --rollback       also restart nodes from an older copy of their "
    "data\n"
    "                   directory (rule A4 must stop them; nothing else "
    "runs until\n"
    "                   they are re-admitted or caught up: off by "
    "default)\n"
    "  exit 0 when there is no violation and no liveness failure, 1 "
    "otherwise,\n"
    "  2 for bad usage\n";

int main(int argc, char **argv)
{
    struct chaos_opts o = {.duration_s = 60,
                           .nodes = 3,
                           .seed = 1,
                           .clients = 4,
                           .history_path = "build/chaos-history.txt"};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (strcmp(k, "-h") == 0 || strcmp(k, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(k, "--manual-rejoin") == 0) {
            o.manual_rejoin = true;
            continue;
        }
        if (strcmp(k, "--no-members") == 0) {
            o.no_members = true;
            continue;
        }
        if (strcmp(k, "--rollback") == 0) {
            o.rollback = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "chaos: %s needs a value\n%s", k, usage);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(k, "--duration") == 0) {
            o.duration_s = (unsigned)atoi(v);
        } else if (strcmp(k, "--nodes") == 0) {
            o.nodes = atoi(v);
        } else if (strcmp(k, "--seed") == 0) {
            o.seed = strtoull(v, NULL, 10);
        } else if (strcmp(k, "--clients") == 0) {
            o.clients = (unsigned)atoi(v);
        } else if (strcmp(k, "--history") == 0) {
            o.history_path = v;
        } else {
            fprintf(stderr, "chaos: unknown option %s\n%s", k, usage);
            return 2;
        }
    }
    if ((o.nodes != 3 && o.nodes != 5) || o.duration_s == 0 || o.clients == 0) {
        fputs(usage, stderr);
        return 2;
    }
    struct chaos_report r;
    long v = chaos_run(&o, &r);
    chaos_report_print(&o, &r);
    printf("history: %s (check it again: build/prog/chaos_check %s)\n",
           o.history_path, o.history_path);
    if (v < 0) {
        printf("chaos: FAILED to run\n");
        return 1;
    }
    bool ok = v == 0 && r.failures == 0;
    printf("chaos: %s\n", ok       ? "PASSED"
                          : v != 0 ? "FAILED (violations)"
                                   : "FAILED (liveness)");
    return ok ? 0 : 1;
}
