/* A snapshot larger than one storage step (1 MiB) is stored in steps
 * between raft batches (src/node/storage_proc.c), as the child encoding it
 * writes it (never whole in the node's memory): writes go on meanwhile,
 * every node completes it, and after all three are killed at once the
 * cluster comes back with every acknowledged allocation, from the stored
 * snapshot plus the log that followed it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/* The largest snapshot node @i says it stored, in bytes; *@streamed: how
 * many of its snapshots over 1 MiB it stored as their encoder wrote them. */
static size_t stored_snapshot_bytes_streamed(int i, int *streamed)
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
            *streamed +=
                n > (1u << 20) && strstr(b, "stored as it was encoded") != NULL;
        }
    }
    fclose(f);
    return best;
}

static size_t stored_snapshot_bytes(int i)
{
    int streamed = 0;
    return stored_snapshot_bytes_streamed(i, &streamed);
}

/* A cluster snapshotting every 200 entries (then by its size), with a
 * client and bounded pool "b". */
static void start_with_pool(void)
{
    tc_start(&c, 3, "snapshot_interval_entries 200\n");
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    cl = tc_client(&c, 20000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL, tc_detail()),
                 0);
}

/* THREADS writers at once, of tag threads THREADS * @round on; true when
 * every alloc succeeded. */
static bool write_round(int round)
{
    pthread_t th[THREADS];
    bool ok = true;
    for (int t = 0; t < THREADS; t++) {
        pthread_create(&th[t], NULL, writer,
                       (void *)(intptr_t)(THREADS * round + t));
    }
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        ok &= r == NULL;
    }
    return ok;
}

/* Kill all three nodes at once, start them again, and find every tag of
 * the first round (threads 0..THREADS-1) with its id. */
static void kill_all_then_check(void)
{
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

Test(snapshot_steps,
     large_snapshot_stored_in_steps_survives_kill_all,
     .fini = teardown,
     .timeout = 240)
{
    start_with_pool();
    cr_assert(write_round(0), "alloc failed: %s", tc_errmsg());
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
        write_round(++round);
    }
    for (int i = 0; i < 3; i++) {
        int streamed = 0;
        cr_assert_gt(stored_snapshot_bytes_streamed(i, &streamed), 1u << 20,
                     "node %d stored no snapshot over 1 MiB", i + 1);
        cr_assert_gt(streamed, 0,
                     "node %d stored no snapshot as it was encoded", i + 1);
    }
    kill_all_then_check();
}

/* Kill node @i's snapshot children (a node forks nothing else): how many. */
static int kill_children(int i)
{
    char cmd[64], line[32];
    snprintf(cmd, sizeof(cmd), "pgrep -P %d", (int)c.pid[i]);
    FILE *p = popen(cmd, "r");
    int n = 0;
    while (p != NULL && fgets(line, sizeof(line), p) != NULL) {
        pid_t child = (pid_t)atoi(line);
        n += child > 0 && kill(child, SIGKILL) == 0;
    }
    if (p != NULL) {
        pclose(p);
    }
    return n;
}

/* How many snapshot children the nodes saw fail. */
static int children_failed(void)
{
    int n = 0;
    for (int i = 0; i < 3; i++) {
        n += tc_log_count(&c, i, "the snapshot child for index");
    }
    return n;
}

static atomic_int killing = 1;

/* Kill snapshot children until the nodes saw a few fail (a kill may also
 * hit a child that just exited: only the nodes' logs count). */
static void *killer(void *arg)
{
    (void)arg;
    while (atomic_load(&killing) && children_failed() < 4) {
        for (int i = 0; i < 3; i++) {
            kill_children(i);
        }
        tc_sleep_ms(2);
    }
    return NULL;
}

/* A snapshot child killed while its bytes stream into storage costs nothing
 * but a retry: what it sent is dropped, the next snapshot is stored, and
 * after all three nodes are killed the cluster comes back with every
 * acknowledged allocation. */
Test(snapshot_steps,
     child_killed_mid_stream_costs_nothing,
     .fini = teardown,
     .timeout = 240)
{
    start_with_pool();
    pthread_t k;
    pthread_create(&k, NULL, killer, NULL);
    for (int round = 0; round < 30 && children_failed() < 4; round++) {
        cr_assert(write_round(round), "alloc failed: %s", tc_errmsg());
    }
    atomic_store(&killing, 0);
    pthread_join(k, NULL);
    cr_assert_gt(children_failed(), 0, "no snapshot child died mid-way");
    /* Without the killer, every node stores a snapshot again as its
     * encoder writes it. */
    const char *streamed = "stored as it was encoded";
    int before[3];
    for (int i = 0; i < 3; i++) {
        before[i] = tc_log_count(&c, i, streamed);
    }
    uint64_t deadline = tc_now_ms() + 120000;
    for (int round = 100;; round++) {
        int all = 1;
        for (int i = 0; i < 3; i++) {
            all &= tc_log_count(&c, i, streamed) > before[i];
        }
        if (all || tc_now_ms() > deadline) {
            break;
        }
        write_round(round);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_gt(tc_log_count(&c, i, streamed), before[i],
                     "node %d stored no snapshot after the kills", i + 1);
    }
    kill_all_then_check();
}
