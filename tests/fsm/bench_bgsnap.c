/* make bench: what a snapshot costs the fsm processor, in line versus
 * encoded by a forked child (src/node/bgsnap.h), at N live tagged
 * allocations (argument; default 2,000,000; issue 19 names 10,000,000:
 * `build/bench/bench_bgsnap 10000000`).
 *   in line: ida_fsm_snapshot() on the applying thread, all of it a pause;
 *   child:   the pause is fork() alone (page tables); the encoding runs in
 *            the child while the parent polls the pipe, timed to the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/collapse.h"
#include "base/heap.h"
#include "fsm/fsm.h"
#include "src/node/bgsnap.h"
#include "tests/fsm/fsm_helpers.h"

static struct fx_batch b;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void apply(struct ida_fsm *f)
{
    size_t len;
    uint8_t *buf = fx_batch_pack(&b, &len);
    struct ida_fsm_applied out;
    if (ida_fsm_apply(f, ida_fsm_applied_index(f) + 1, IDA_ENTRY_NORMAL, buf,
                      len, &out) != 0) {
        fprintf(stderr, "bench_bgsnap: apply failed\n");
        exit(1);
    }
    free(buf);
}

/* The process's anonymous memory and the part of it on huge pages, in
 * MiB (/proc/self/smaps_rollup): a fork copies a page table entry for
 * each 4 KiB page of the rest. */
static void anon_mib(double *anon, double *huge)
{
    FILE *fp = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    unsigned long long kb;
    *anon = *huge = 0;
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "Anonymous: %llu kB", &kb) == 1) {
            *anon = (double)kb / 1024;
        } else if (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
            *huge = (double)kb / 1024;
        }
    }
    if (fp != NULL) {
        fclose(fp);
    }
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    /* IDA_BENCH_COLLAPSE=1: the collapser runs (collapse.h), and the fork
     * waits until it took all the fsm gave it; =2: it also sweeps, as in a
     * node, and the fork waits for a sweep done after the fill. */
    const char *col = getenv("IDA_BENCH_COLLAPSE");
    int collapse = col != NULL ? atoi(col) : 0;
    if (collapse == 2) {
        ida_collapse_sweep_ms = 200;
    }
    if (collapse > 0 && ida_collapse_start(collapse == 2) != 0) {
        fprintf(stderr, "bench_bgsnap: this system cannot collapse\n");
        return 1;
    }
    struct ida_fsm *f;
    if (n <= 0 || ida_fsm_new(&f) != 0) {
        return 1;
    }
    uint64_t seq = 0;
    /* The 64 clients' sessions first: a command of a client without one is
     * refused (and the state would stay empty). */
    for (uint64_t c = 1; c <= 64; c++) {
        fx_register(f, c, 1000);
    }
    fx_batch_init(&b, 1000);
    fx_add_create(&b, 1, ++seq, "p", IDALLOC__POOL_KIND__POOL_KIND_BOUNDED,
                  (uint64_t)n + 1);
    apply(f);
    for (long i = 0; i < n;) {
        fx_batch_init(&b, 1000);
        for (int k = 0; k < 64 && i < n; k++, i++) {
            char tag[32];
            snprintf(tag, sizeof(tag), "tag-%09ld", i);
            fx_add_alloc(&b, 1 + (uint64_t)(i % 64), ++seq, "p", tag);
        }
        apply(f);
    }
    uint64_t id;
    if (ida_fsm_lookup(f, "p", "tag-000000000", &id) != 0) {
        fprintf(stderr, "bench_bgsnap: the allocations were not made\n");
        return 1;
    }
    double t0 = now_s();
    uint64_t sweeps0 = ida_collapse_stats().sweeps;
    while (collapse > 0 &&
           (ida_collapse_stats().waiting > 0 ||
            (collapse == 2 && ida_collapse_stats().sweeps < sweeps0 + 2))) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    if (collapse > 0) {
        char tail[64];
        snprintf(tail, sizeof(tail), ", %.1f s after the fill", now_s() - t0);
        fx_print_collapser(tail);
    }
    double anon, huge;
    anon_mib(&anon, &huge);
    t0 = now_s();
    uint8_t *data;
    size_t len;
    if (ida_fsm_snapshot(f, &data, &len) != 0) {
        return 1;
    }
    double inline_s = now_s() - t0;
    ida_free(data);
    struct ida_bgsnap bg = {0};
    t0 = now_s();
    if (ida_bgsnap_start(&bg, f, ida_fsm_applied_index(f), 1) != 0) {
        fprintf(stderr, "bench_bgsnap: fork failed\n");
        return 1;
    }
    double pause_s = now_s() - t0, worst_poll = 0;
    int rv;
    do {
        double p0 = now_s();
        rv = ida_bgsnap_poll(&bg, 1u << 20, &data, &len);
        double d = now_s() - p0;
        worst_poll = d > worst_poll ? d : worst_poll;
        if (rv == 0) {
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
    } while (rv == 0);
    double total_s = now_s() - t0;
    if (rv != 1) {
        fprintf(stderr, "bench_bgsnap: the child failed (%d)\n", rv);
        return 1;
    }
    printf(
        "snapshot of %ld live allocations (%.1f MB): in line %.0f ms "
        "(all a pause of the fsm processor); child: fork pause %.1f ms, "
        "longest 1 MiB read step %.1f ms, done after %.0f ms; pause "
        "ratio child/in-line %.3f; anonymous memory %.0f MiB, %.0f MiB of "
        "it on huge pages\n",
        n, (double)len / 1e6, inline_s * 1e3, pause_s * 1e3, worst_poll * 1e3,
        total_s * 1e3, pause_s / inline_s, anon, huge);
    ida_free(data);
    ida_fsm_free(f);
    ida_collapse_stop();
    return 0;
}
