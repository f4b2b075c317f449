/* A snapshot larger than one storage step (1 MiB) is stored in steps
 * between raft batches (src/node/storage_proc.c): writes go on meanwhile,
 * every node completes it, and after all three are killed at once the
 * cluster comes back with every acknowledged allocation, from the stored
 * snapshot plus the log that followed it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/harness.h"

#define THREADS    8
#define PER_THREAD 1400
#define TAG_BYTES  120

static struct tc c;
static struct idalloc_client *cl;
static uint64_t ids[THREADS][PER_THREAD];

static void teardown(void)
{
    if (cl != NULL) {
        idalloc_client_free(cl);
        cl = NULL;
    }
    tc_destroy(&c);
}

static void *writer(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        char tag[TAG_BYTES + 1];
        tc_long_tag(tag, TAG_BYTES, t, i);
        uint64_t extra, *dst = t < THREADS ? &ids[t][i] : &extra;
        if (idalloc_alloc(cl, "b", tag, dst, NULL, tc_detail()) != 0) {
            return (void *)1;
        }
    }
    return NULL;
}

/* The largest snapshot node @i says it stored, in bytes. */
static size_t stored_snapshot_bytes(int i)
{
    char path[400], line[512];
    snprintf(path, sizeof(path), "%s/node%d.log", c.dir, i + 1);
    FILE *f = fopen(path, "r");
    size_t best = 0;
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "storage: snapshot at index");
        const char *b = p != NULL ? strstr(p, " (") : NULL;
        if (b != NULL) {
            size_t n = strtoull(b + 2, NULL, 10);
            best = n > best ? n : best;
        }
    }
    fclose(f);
    return best;
}

Test(snapshot_steps,
     large_snapshot_stored_in_steps_survives_kill_all,
     .fini = teardown,
     .timeout = 240)
{
    tc_start(&c, 3, "snapshot_interval_entries 200\n");
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    cl = tc_client(&c, 20000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL, tc_detail()),
                 0);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        pthread_create(&th[t], NULL, writer, (void *)(intptr_t)t);
    }
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        cr_assert_null(r, "alloc failed: %s", tc_errmsg());
    }
    /* Every node stored a snapshot of more than one step. A node
     * snapshots again only after as many log bytes as its last snapshot
     * (src/node/snap_policy.h), so more writes may be needed: rounds of
     * THREADS writers (tags of other threads, checked only by the node)
     * until every node has one. */
    uint64_t deadline = tc_now_ms() + 120000;
    int round = 0;
    for (;;) {
        int all = 1;
        for (int i = 0; i < 3; i++) {
            all &= stored_snapshot_bytes(i) > (1u << 20);
        }
        if (all || tc_now_ms() > deadline) {
            break;
        }
        for (int t = 0; t < THREADS; t++) {
            pthread_create(&th[t], NULL, writer,
                           (void *)(intptr_t)(THREADS * (1 + round) + t));
        }
        for (int t = 0; t < THREADS; t++) {
            pthread_join(th[t], NULL);
        }
        round++;
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_gt(stored_snapshot_bytes(i), 1u << 20,
                     "node %d stored no snapshot over 1 MiB", i + 1);
    }
    idalloc_client_free(cl);
    cl = NULL;
    for (int i = 0; i < 3; i++) {
        tc_signal(&c, i, SIGKILL);
    }
    for (int i = 0; i < 3; i++) {
        tc_spawn(&c, i);
    }
    cr_assert_geq(tc_wait_leader(&c, 20000), 0);
    cl = tc_client(&c, 20000);
    for (int t = 0; t < THREADS; t++) {
        for (int i = 0; i < PER_THREAD; i++) {
            char tag[TAG_BYTES + 1];
            uint64_t id;
            tc_long_tag(tag, TAG_BYTES, t, i);
            cr_assert_eq(idalloc_lookup(cl, "b", tag, &id, tc_detail()), 0,
                         "lookup: %s", tc_errmsg());
            cr_assert_eq(id, ids[t][i], "tag %d-%d moved", t, i);
        }
    }
}
