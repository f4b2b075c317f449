/* The greedy resharding plan (declared and explained in pool.h). */
#include "src/pool/pool.h"

#include <string.h>

#include "base/assert.h"

struct plan
{
    uint32_t n;
    const uint64_t *d; /* duration of each processor */
    const uint64_t *edge_ns;
    bool left[IDA_POOL_PROCESSORS_MAX];        /* not assigned yet */
    uint64_t passing[IDA_POOL_PROCESSORS_MAX]; /* edge time to chosen */
    uint64_t chosen_ns;
};

/* Give @i to thread @th and account its edges
 * to the processors still left. */
static void choose(struct plan *pl, uint32_t i, uint32_t th, uint32_t *out)
{
    IDA_ASSERT(pl->left[i]);
    out[i] = th;
    pl->left[i] = false;
    pl->chosen_ns += pl->d[i];
    for (uint32_t j = 0; j < pl->n; j++) {
        if (pl->left[j]) {
            pl->passing[j] += pl->edge_ns[(size_t)i * pl->n + j] +
                              pl->edge_ns[(size_t)j * pl->n + i];
        }
    }
}

/* Among processors left that fit under @cap: most edge time to the chosen
 * ones, then the longest, then the lowest index. NONE-like n if none. */
static uint32_t best_fit(const struct plan *pl, uint64_t cap)
{
    uint32_t best = pl->n;
    for (uint32_t i = 0; i < pl->n; i++) {
        if (!pl->left[i] || pl->chosen_ns + pl->d[i] > cap) {
            continue;
        }
        if (best == pl->n || pl->passing[i] > pl->passing[best] ||
            (pl->passing[i] == pl->passing[best] && pl->d[i] > pl->d[best])) {
            best = i;
        }
    }
    return best;
}

void ida_pool_plan(uint32_t nproc,
                   const uint64_t *proc_ns,
                   const uint64_t *edge_ns,
                   uint32_t nthreads,
                   const uint32_t *old_assign,
                   uint32_t *new_assign)
{
    IDA_ASSERT(nthreads >= 1);
    IDA_ASSERT(nproc <= IDA_POOL_PROCESSORS_MAX);
    uint64_t total = 0;
    for (uint32_t i = 0; i < nproc; i++) {
        total += proc_ns[i];
    }
    if (total == 0) {
        /* Nothing measured: no reason to move anything. */
        for (uint32_t i = 0; i < nproc; i++) {
            new_assign[i] =
                old_assign[i] < nthreads ? old_assign[i] : i % nthreads;
        }
        return;
    }
    struct plan pl;
    pl.n = nproc;
    pl.d = proc_ns;
    pl.edge_ns = edge_ns;
    for (uint32_t i = 0; i < nproc; i++) {
        pl.left[i] = true;
    }
    uint64_t avg = total / nthreads;
    uint64_t cap = avg + avg / 8; /* what "fits": see pool.h */
    uint64_t load[IDA_POOL_THREADS_MAX] = {0};
    for (uint32_t th = 0; th < nthreads && th < IDA_POOL_THREADS_MAX; th++) {
        pl.chosen_ns = 0;
        memset(pl.passing, 0, nproc * sizeof(pl.passing[0]));
        uint32_t heaviest = nproc;
        for (uint32_t i = 0; i < nproc; i++) {
            if (pl.left[i] && (heaviest == nproc || pl.d[i] > pl.d[heaviest])) {
                heaviest = i;
            }
        }
        if (heaviest < nproc && pl.d[heaviest] > avg) {
            choose(&pl, heaviest, th, new_assign);
        }
        for (;;) {
            uint32_t i = best_fit(&pl, cap);
            if (i == nproc) {
                break;
            }
            choose(&pl, i, th, new_assign);
        }
        load[th] = pl.chosen_ns;
    }
    /* What fits nowhere goes to the least loaded
     * thread instead of being left without one. */
    for (uint32_t i = 0; i < nproc; i++) {
        if (!pl.left[i]) {
            continue;
        }
        uint32_t least = 0;
        for (uint32_t th = 1; th < nthreads; th++) {
            if (load[th] < load[least]) {
                least = th;
            }
        }
        new_assign[i] = least;
        pl.left[i] = false;
        load[least] += proc_ns[i];
    }
    for (uint32_t i = 0; i < nproc; i++) {
        IDA_ASSERT(new_assign[i] < nthreads);
    }
}
