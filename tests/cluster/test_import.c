/* Seeding a new cluster from a backup larger than a frame, with real
 * processes: `idalloc snapshot restore` sends the backup as one write and
 * refuses one over 4 MiB, so the forced recovery of a cluster of any real
 * size needs `idallocd --import-backup` (src/node/import.h). Cluster A
 * holds 43,200 holdings with 120-byte tags (a backup of more than 5 MB);
 * its backup is imported into node 1 of a new cluster B; all of B's nodes
 * are started, and nodes 2 and 3 (new directories) join and receive the
 * state by InstallSnapshot. Then B lists exactly A's holdings, with node 1
 * leading and again once it is gone; sequences start past the advance;
 * B's three nodes, stopped, export the same state. Every refusal (a node
 * directory that holds something, the backup's own cluster name, a
 * damaged file, an advance past 2^64, a running node's option) changes
 * nothing and leaves nothing where a node would start. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/common/backup.h"
#include "tests/lib/harness.h"

#define THREADS    16
#define PER_THREAD 2700
#define TAG_BYTES  120
#define ADVANCE    1000000

static struct tc a, b;
static struct idalloc_client *cl;
static char out[1 << 16];

static void teardown(void)
{
    if (cl != NULL) {
        idalloc_client_free(cl);
        cl = NULL;
    }
    tc_destroy(&a);
    tc_destroy(&b);
}

/* Thread @arg: PER_THREAD allocations in "b". */
static void *writer(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        char tag[TAG_BYTES + 1];
        tc_long_tag(tag, TAG_BYTES, t, i);
        uint64_t id;
        if (idalloc_alloc(cl, "b", tag, &id, NULL, tc_detail()) != 0) {
            return (void *)1;
        }
    }
    return NULL;
}

/* The new cluster's name: "seeded" (the old one is "test"). */
static void rename_cluster(struct tc *t)
{
    cr_assert_eq(
        tc_run(out, sizeof(out), "sed -i 's/^cluster test$/cluster seeded/' %s",
               t->conf),
        0);
}

/* idallocd --config B --node 1 @args; its exit status. */
static int import(const char *args)
{
    return tc_run(out, sizeof(out), "%s --config %s --node 1 %s 2>&1",
                  tc_bin("idallocd"), b.conf, args);
}

/* Nothing where node 1 of B would start, and no staging left. */
static void assert_nothing_written(const char *why)
{
    char cmd[800];
    snprintf(cmd, sizeof(cmd),
             "test -e %s/data/node1 || test -e "
             "%s/data/.import-node1",
             b.dir, b.dir);
    cr_assert_neq(tc_run(out, sizeof(out), "%s", cmd), 0,
                  "%s left a directory behind", why);
}

/* `idalloc list b` of the cluster at @addrs into @file; its exit status. */
static int list_to(const char *addrs, const char *file)
{
    return tc_run(out, sizeof(out),
                  "%s --cluster %s --timeout 60000 list b > %s 2>&1",
                  tc_bin("idalloc"), addrs, file);
}

/* Cluster A (3 nodes, cluster "test") with a client in @cl and the bounded
 * pool "b" of @size ids. */
static void start_a(uint64_t size)
{
    tc_start(&a, 3, NULL);
    cr_assert_geq(tc_wait_leader(&a, 20000), 0, "no leader");
    cl = tc_client(&a, 20000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, size, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
}

/* What node @i of @t says of itself. */
static struct idalloc_node_status status_of(struct tc *t, int i)
{
    struct idalloc_client *c1 = tc_client(t, 2000);
    struct idalloc_node_status ns;
    cr_assert_eq(idalloc_node_status(c1, (size_t)i, &ns, NULL), 0);
    idalloc_client_free(c1);
    return ns;
}

/* The idalloc_raft_role{role="@role"} gauge of the node whose metrics
 * port is @port (-1 when absent). */
static int role_gauge(unsigned port, const char *role)
{
    static char body[1 << 16];
    cr_assert_eq(tc_http(port, "GET", "/metrics", body, sizeof(body)), 200);
    char series[64];
    snprintf(series, sizeof(series), "idalloc_raft_role{role=\"%s\"}", role);
    return (int)tc_metric(body, series);
}

static int whole(struct idalloc_client *c3)
{
    struct idalloc_member_list m;
    if (idalloc_member_list(c3, &m, NULL) != 0) {
        return 0;
    }
    int voters = 0;
    for (size_t i = 0; i < m.n; i++) {
        voters += m.members[i].voter && !m.members[i].waiting;
    }
    return voters == 3 && m.n == 3;
}

Test(import,
     a_backup_larger_than_a_frame_seeds_a_new_cluster,
     .fini = teardown,
     .timeout = 300)
{
    /* Cluster A and its state. */
    start_a(1000000);
    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    cr_assert_eq(
        idalloc_pool_create(cl, "p", IDALLOC_POOL_PREFIX, 0, NULL, tc_detail()),
        0);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        pthread_create(&th[t], NULL, writer, (void *)(intptr_t)t);
    }
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        cr_assert_null(r, "a write failed: %s", tc_errmsg());
    }
    uint64_t seq_last;
    cr_assert_eq(idalloc_reserve(cl, "s", 1000, &seq_last, tc_detail()), 0);
    seq_last += 999;
    uint8_t px[9];
    size_t plen;
    cr_assert_eq(
        idalloc_prefix(cl, "p", "before", px, &plen, NULL, tc_detail()), 0);
    idalloc_client_free(cl);
    cl = NULL;
    /* Cluster B, written but not started: the backup and listings go in
     * its directory (A's goes with A). */
    tc_setup(&b, 3, NULL);
    char file[400], want[400], got[400];
    snprintf(file, sizeof(file), "%s/a.ida", b.dir);
    snprintf(want, sizeof(want), "%s/a.list", b.dir);
    snprintf(got, sizeof(got), "%s/b.list", b.dir);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --timeout 60000 snapshot save %s 2>&1",
                        tc_bin("idalloc"), a.addrs, file),
                 0, "%s", out);
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_gt(st.st_size, 4 << 20,
                 "a backup of %lld bytes: snapshot restore would take it",
                 (long long)st.st_size);
    cr_assert_eq(list_to(a.addrs, want), 0, "%s", out);
    tc_destroy(&a); /* the old cluster is gone */

    char args[1200];
    /* Refused, nothing written: the backup's own cluster name. */
    snprintf(args, sizeof(args), "--import-backup %s", file);
    cr_assert_eq(import(args), 2, "%s", out);
    cr_assert(strstr(out, "an import makes a new cluster") != NULL, "%s", out);
    assert_nothing_written("the same cluster name");
    rename_cluster(&b);
    /* A damaged file. */
    char bad[400];
    snprintf(bad, sizeof(bad), "%s/bad.ida", b.dir);
    cr_assert_eq(tc_run(out, sizeof(out), "head -c 3000000 %s > %s", file, bad),
                 0);
    snprintf(args, sizeof(args), "--import-backup %s", bad);
    cr_assert_eq(import(args), 2, "%s", out);
    assert_nothing_written("a damaged file");
    /* An advance that carries the sequence past 2^64. */
    snprintf(args, sizeof(args),
             "--import-backup %s --advance-sequences 18446744073709551000",
             file);
    cr_assert_eq(import(args), 2, "%s", out);
    cr_assert(strstr(out, "past the end of 64 bits") != NULL, "%s", out);
    assert_nothing_written("an advance past 2^64");
    /* The Runbook's older order: B was started before the import, so every
     * node of it holds a membership of cluster "seeded". */
    cr_assert_eq(tc_spawn_all(&b), 0, "a node of B could not bind");
    cr_assert_geq(tc_wait_leader(&b, 20000), 0, "no leader in B");
    /* What the restore does with it: refused, pointing at the import. */
    cr_assert_neq(tc_run(out, sizeof(out),
                         "%s --cluster %s --timeout 20000 snapshot restore %s "
                         "2>&1",
                         tc_bin("idalloc"), b.addrs, file),
                  0, "%s", out);
    cr_assert(strstr(out, "message or value too large") != NULL &&
                  strstr(out, "idallocd --import-backup") != NULL,
              "%s", out);
    for (int i = 0; i < 3; i++) {
        tc_signal(&b, i, SIGTERM);
    }
    /* A node directory that holds a node is never written. */
    snprintf(args, sizeof(args), "--import-backup %s --advance-sequences %d",
             file, ADVANCE);
    cr_assert_eq(import(args), 1, "%s", out);
    cr_assert(strstr(out, "exists and is not empty") != NULL, "%s", out);
    cr_assert_eq(
        tc_run(out, sizeof(out), "test -s %s/data/node1/data.mdb", b.dir), 0,
        "the refused import touched node 1's directory");
    cr_assert_eq(tc_run(out, sizeof(out), "rm -r %s/data/node1", b.dir), 0);
    /* Another import of node 1 under way (its lock held, here by this
     * process): refused, nothing written. */
    char lock[400];
    snprintf(lock, sizeof(lock), "%s/data/.import-node1.lock", b.dir);
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(lfd, 0);
    cr_assert_eq(flock(lfd, LOCK_EX | LOCK_NB), 0);
    int rv = import(args);
    cr_assert(rv != 0 && strstr(out, "another import of node 1 runs?") != NULL,
              "exit %d: %s", rv, out);
    assert_nothing_written("an import under way");
    close(lfd);
    cr_assert_eq(import(args), 0, "%s", out);
    cr_assert(strstr(out, "3 pool(s) of cluster test") != NULL, "%s", out);
    /* The node's directory is left, no staging and no lock file. */
    cr_assert_eq(tc_run(out, sizeof(out), "ls -A %s/data", b.dir), 0);
    cr_assert(strstr(out, "node1\n") != NULL && strstr(out, ".import") == NULL,
              "in the data directory: %s", out);
    cr_assert_eq(import(args), 1, "a second import: %s", out);
    cr_assert(strstr(out, "exists and is not empty") != NULL, "%s", out);

    /* Nodes 2 and 3 still hold the earlier start: node 1 must not lead
     * (they would elect a leader of their own and overwrite it). */
    cr_assert_eq(tc_spawn_all(&b), 0, "a node of B could not bind");
    uint64_t t0 = tc_now_ms();
    while (tc_log_count(&b, 0, "answered with a membership") == 0 &&
           tc_now_ms() - t0 < 20000) {
        tc_sleep_ms(100);
    }
    cr_assert_geq(tc_log_count(&b, 0, "answered with a membership"), 1,
                  "node 1 did not say why it waits");
    struct idalloc_node_status ns = status_of(&b, 0);
    cr_assert_str_eq(ns.role, "seeded", "node 1 is %s beside nodes 2 and 3",
                     ns.role);
    cr_assert_eq(ns.term, 1, "node 1 took part (term %llu)",
                 (unsigned long long)ns.term);
    cr_assert_eq(tc_log_count(&b, 0, "now leads cluster"), 0);
    /* The remedy the line names: stop them all, then new directories
     * for them (one at a time, a new node could join what is left of the
     * old cluster's leadership). */
    for (int i = 1; i < 3; i++) {
        tc_signal(&b, i, SIGTERM);
    }
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(
            tc_run(out, sizeof(out), "rm -r %s/data/node%d", b.dir, i + 1), 0);
        tc_spawn(&b, i);
    }
    cl = tc_client(&b, 20000);
    t0 = tc_now_ms();
    while (!whole(cl) && tc_now_ms() - t0 < 120000) {
        tc_sleep_ms(100);
    }
    cr_assert(whole(cl), "nodes 2 and 3 were not added as voters in 120 s");
    cr_assert_eq(tc_log_count(&b, 0, "now leads cluster"), 1);
    cr_assert_geq(tc_wait_leader(&b, 20000), 0, "no leader in B");
    cr_assert_eq(list_to(b.addrs, got), 0, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out), "cmp %s %s 2>&1", want, got), 0,
                 "B does not list A's holdings: %s", out);
    for (int i = 1; i < 3; i++) {
        cr_assert_geq(tc_log_count(&b, i, "fsm: installed snapshot"), 1,
                      "node %d did not install a snapshot", i + 1);
    }

    /* What nodes 2 and 3 received: node 1 gone, they list it too. */
    idalloc_client_free(cl);
    cl = NULL;
    tc_signal(&b, 0, SIGKILL);
    int l = tc_wait_leader(&b, 20000);
    cr_assert(l == 1 || l == 2, "no leader among nodes 2 and 3");
    cr_assert_eq(list_to(b.addrs, got), 0, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out), "cmp %s %s 2>&1", want, got), 0,
                 "nodes 2 and 3 do not list A's holdings: %s", out);
    cl = tc_client(&b, 20000);
    uint64_t first;
    cr_assert_eq(idalloc_reserve(cl, "s", 1, &first, tc_detail()), 0);
    cr_assert_gt(first, seq_last + ADVANCE - 1,
                 "reserve gave %llu; A handed out up to %llu",
                 (unsigned long long)first, (unsigned long long)seq_last);
    int existed = 0;
    uint8_t px2[9];
    size_t plen2;
    cr_assert_eq(
        idalloc_prefix(cl, "p", "before", px2, &plen2, &existed, tc_detail()),
        0);
    cr_assert(existed && plen2 == plen && memcmp(px2, px, plen) == 0,
              "the prefix of \"before\" changed");
    uint64_t fresh;
    cr_assert_eq(idalloc_alloc(cl, "b", "fresh", &fresh, NULL, tc_detail()), 0);
    cr_assert_eq(fresh, (uint64_t)THREADS * PER_THREAD,
                 "the first free id after %d holdings is %llu",
                 THREADS * PER_THREAD, (unsigned long long)fresh);
    idalloc_client_free(cl);
    cl = NULL;

    /* Node 1 back; then all three, stopped, hold the same state. */
    tc_spawn(&b, 0);
    cr_assert(tc_wait_applied(&b, tc_commit_index(&b), 30000));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tc_signal(&b, i, SIGTERM), 0,
                     "node %d did not stop "
                     "cleanly",
                     i + 1);
    }
    struct ida_backup x[3];
    for (int i = 0; i < 3; i++) {
        char f[400], err[IDA_ERRMSG_MAX];
        snprintf(f, sizeof(f), "%s/node%d.ida", b.dir, i + 1);
        cr_assert_eq(tc_run(out, sizeof(out),
                            "%s --config %s --node %d --export-backup %s 2>&1",
                            tc_bin("idallocd"), b.conf, i + 1, f),
                     0, "export of node %d: %s", i + 1, out);
        cr_assert_eq(ida_backup_read(f, &x[i], err), 0, "%s", err);
    }
    for (int i = 1; i < 3; i++) {
        cr_assert(x[i].index == x[0].index &&
                      x[i].state_len == x[0].state_len &&
                      memcmp(x[i].state, x[0].state, x[0].state_len) == 0,
                  "node %d's state differs from node 1's", i + 1);
    }
    for (int i = 0; i < 3; i++) {
        ida_backup_free(&x[i]);
    }
}

static struct tc one;

static void teardown_small(void)
{
    teardown();
    tc_destroy(&one);
}

/* Two imported nodes of one cluster file each see that the other holds a
 * membership: neither leads (each would lead a cluster of its own under
 * one name). A cluster file of one node has nobody to ask: it leads once
 * no node spoke to it as a member for the quiet time. */
Test(import,
     two_imports_wait_and_a_one_node_file_opens,
     .fini = teardown_small,
     .timeout = 120)
{
    start_a(100);
    uint64_t id;
    cr_assert_eq(idalloc_alloc(cl, "b", "kept", &id, NULL, tc_detail()), 0);
    idalloc_client_free(cl);
    cl = NULL;
    tc_setup(&b, 3, NULL);
    rename_cluster(&b);
    char file[400];
    snprintf(file, sizeof(file), "%s/a.ida", b.dir);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --timeout 20000 snapshot save %s 2>&1",
                        tc_bin("idalloc"), a.addrs, file),
                 0, "%s", out);
    tc_destroy(&a);

    for (int i = 1; i <= 2; i++) {
        cr_assert_eq(tc_run(out, sizeof(out),
                            "%s --config %s --node %d --import-backup %s 2>&1",
                            tc_bin("idallocd"), b.conf, i, file),
                     0, "import into node %d: %s", i, out);
    }
    unsigned mport = tc_add_metrics(&b, 0);
    cr_assert_eq(tc_spawn_all(&b), 0, "a node of B could not bind");
    uint64_t t0 = tc_now_ms();
    while ((tc_log_count(&b, 0, "answered with a membership") == 0 ||
            tc_log_count(&b, 1, "answered with a membership") == 0) &&
           tc_now_ms() - t0 < 20000) {
        tc_sleep_ms(100);
    }
    for (int i = 0; i < 2; i++) {
        cr_assert_geq(tc_log_count(&b, i, "answered with a membership"), 1,
                      "node %d did not say why it waits", i + 1);
        struct idalloc_node_status ns = status_of(&b, i);
        cr_assert_str_eq(ns.role, "seeded", "node %d is %s", i + 1, ns.role);
        cr_assert_eq(ns.term, 1, "node %d took part (term %llu)", i + 1,
                     (unsigned long long)ns.term);
        cr_assert_eq(tc_log_count(&b, i, "now leads cluster"), 0);
    }
    /* Its metrics say so too, not "follower". */
    cr_assert_eq(role_gauge(mport, "seeded"), 1);
    cr_assert_eq(role_gauge(mport, "follower"), 0);

    /* One node alone. */
    tc_setup(&one, 1, NULL);
    rename_cluster(&one);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --config %s --node 1 --import-backup %s 2>&1",
                        tc_bin("idallocd"), one.conf, file),
                 0, "%s", out);
    unsigned oport = tc_add_metrics(&one, 0);
    cr_assert_eq(tc_spawn_all(&one), 0);
    cr_assert_geq(tc_wait_leader(&one, 20000), 0, "the one node never led");
    cr_assert_eq(tc_log_count(&one, 0, "now leads cluster"), 1);
    for (uint64_t end = tc_now_ms() + 5000;
         role_gauge(oport, "leader") != 1 && tc_now_ms() < end;) {
        tc_sleep_ms(50);
    }
    cr_assert_eq(role_gauge(oport, "leader"), 1);
    cr_assert_eq(role_gauge(oport, "seeded"), 0);
    cl = tc_client(&one, 20000);
    uint64_t got;
    cr_assert_eq(idalloc_lookup(cl, "b", "kept", &got, tc_detail()), 0, "%s",
                 tc_errmsg());
    cr_assert_eq(got, id);
}
