/* The forced recovery after losing a majority (README, Runbook), with real
 * processes and the Runbook's commands as written: two of three nodes and
 * their disks are lost; the cluster stays unavailable (never wrong); the
 * survivor, stopped, is exported with `idallocd --export-backup`; a new
 * cluster (another name) is seeded with `idalloc snapshot restore
 * --advance-sequences`; every allocation the survivor held is there, and
 * sequences start past what was handed out. Exporting a running node, a
 * missing directory and a bad option change nothing. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/lib/harness.h"

#define TAGS 200

static struct tc a, b;
static char out[1 << 16];

static void teardown(void)
{
    tc_destroy(&a);
    tc_destroy(&b);
}

/* The new cluster's name: "recovered" (the old one is "test"). */
static void rename_cluster(struct tc *t, void *arg)
{
    (void)arg;
    char cmd[800];
    snprintf(cmd, sizeof(cmd),
             "sed -i 's/^cluster test$/cluster recovered/' %s", t->conf);
    cr_assert_eq(system(cmd), 0);
}

static int idallocd(const char *args)
{
    return tc_run(out, sizeof(out), "%s --config %s %s 2>&1",
                  tc_bin("idallocd"), a.conf, args);
}

Test(recover,
     a_lost_majority_is_recovered_from_the_survivor,
     .fini = teardown,
     .timeout = 180)
{
    tc_start(&a, 3, NULL);
    int l = tc_wait_leader(&a, 20000);
    cr_assert_geq(l, 0, "no leader");
    struct idalloc_client *cl = tc_client(&a, 10000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 100000,
                                     NULL, tc_detail()),
                 0);
    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    cr_assert_eq(
        idalloc_pool_create(cl, "p", IDALLOC_POOL_PREFIX, 0, NULL, tc_detail()),
        0);
    uint64_t ids[TAGS], seq_max = 0;
    for (int i = 0; i < TAGS; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "t%d", i);
        cr_assert_eq(idalloc_alloc(cl, "b", tag, &ids[i], NULL, tc_detail()),
                     0);
        uint64_t first;
        cr_assert_eq(idalloc_reserve(cl, "s", 100, &first, tc_detail()), 0);
        seq_max = first + 99;
    }
    uint8_t px[9];
    size_t plen;
    cr_assert_eq(
        idalloc_prefix(cl, "p", "before", px, &plen, NULL, tc_detail()), 0);
    idalloc_client_free(cl);
    /* The survivor holds everything acknowledged (the test waits for it:
     * what only the lost nodes held is what no recovery can give back). */
    cr_assert(tc_wait_applied(&a, tc_commit_index(&a), 10000));

    /* Two nodes and their disks are lost; the leader among them. */
    int s = (l + 1) % 3;
    for (int i = 0; i < 3; i++) {
        if (i != s) {
            tc_signal(&a, i, SIGKILL);
            cr_assert_eq(
                tc_run(out, sizeof(out), "rm -rf %s/data/node%d", a.dir, i + 1),
                0);
        }
    }
    /* Unavailable, never wrong: no write is acknowledged. */
    struct idalloc_client *lone = tc_client(&a, 1500);
    uint64_t id;
    int rv = idalloc_alloc(lone, "b", "during", &id, NULL, tc_detail());
    cr_assert_neq(rv, 0, "a lone node acknowledged a write");
    idalloc_client_free(lone);

    /* Export while it runs: refused, the directory is in use. */
    char file[400], args[800];
    snprintf(file, sizeof(file), "%s/survivor.ida", a.dir);
    snprintf(args, sizeof(args), "--node %d --export-backup %s", s + 1, file);
    cr_assert_eq(idallocd(args), 1, "%s", out);
    cr_assert(strstr(out, "in use by another idallocd") != NULL, "%s", out);
    /* A lost node has nothing to export (and nothing is created). */
    char lost[800];
    snprintf(lost, sizeof(lost), "--node %d --export-backup %s/lost.ida",
             (s + 1) % 3 + 1, a.dir);
    cr_assert_eq(idallocd(lost), 1, "%s", out);
    cr_assert(strstr(out, "holds no node state") != NULL, "%s", out);
    cr_assert_neq(tc_run(out, sizeof(out), "test -e %s/data/node%d", a.dir,
                         (s + 1) % 3 + 1),
                  0, "the export created the lost node's directory");
    /* An option of a running node with it: usage error. */
    snprintf(lost, sizeof(lost), "--node %d --export-backup %s --join %s",
             s + 1, file, a.cfg.nodes[0].client.text);
    cr_assert_eq(idallocd(lost), 2, "%s", out);

    /* The Runbook: stop the survivor, export it. */
    tc_signal(&a, s, SIGTERM);
    cr_assert_eq(idallocd(args), 0, "%s", out);
    cr_assert(strstr(out, "exported node") != NULL, "%s", out);
    cr_assert(strstr(out, "pools=3") != NULL, "%s", out);

    /* A new cluster under another name, seeded from the export. */
    tc_start_edited(&b, 3, NULL, rename_cluster, NULL);
    cr_assert_geq(tc_wait_leader(&b, 20000), 0, "no leader in the new one");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --timeout 20000 snapshot restore %s "
                        "--advance-sequences 1000000 2>&1",
                        tc_bin("idalloc"), b.addrs, file),
                 0, "%s", out);
    cr_assert(strstr(out, "restored 3 pool(s) of cluster test") != NULL, "%s",
              out);
    cl = tc_client(&b, 20000);
    for (int i = 0; i < TAGS; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "t%d", i);
        cr_assert_eq(idalloc_lookup(cl, "b", tag, &id, tc_detail()), 0,
                     "%s lost: %s", tag, tc_errmsg());
        cr_assert_eq(id, ids[i], "%s moved", tag);
    }
    uint64_t first;
    cr_assert_eq(idalloc_reserve(cl, "s", 1, &first, tc_detail()), 0);
    cr_assert_gt(first, seq_max + 1000000 - 1,
                 "reserve gave %llu; the old cluster handed out up to %llu",
                 (unsigned long long)first, (unsigned long long)seq_max);
    int existed = 0;
    uint8_t px2[9];
    size_t plen2;
    cr_assert_eq(
        idalloc_prefix(cl, "p", "before", px2, &plen2, &existed, tc_detail()),
        0);
    cr_assert(existed);
    cr_assert_eq(plen2, plen);
    cr_assert_eq(memcmp(px2, px, plen), 0, "the prefix of \"before\" changed");
    uint64_t fresh;
    cr_assert_eq(idalloc_alloc(cl, "b", "fresh", &fresh, NULL, tc_detail()), 0);
    for (int i = 0; i < TAGS; i++) {
        cr_assert_neq(fresh, ids[i], "an id was handed out twice");
    }
    idalloc_client_free(cl);
}
