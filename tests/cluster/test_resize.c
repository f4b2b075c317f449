/* Membership changes under client load with real idallocd processes
 * (README, "Runbook"): a 5-node cluster file run as 3 voters, grown to 5
 * and shrunk to 3 others (3 -> 5 -> 3) with `member remove` / `member
 * add` while two clients allocate by tag and reserve blocks. Every
 * acknowledged id is checked at the end: each tag still holds the id it was
 * acknowledged, no id was acknowledged to two tags, no two acknowledged
 * blocks overlap. The nodes log that their membership differs from the
 * cluster file. Then the removed nodes are killed, and one load client,
 * given only their addresses, keeps working; then one of the final voters
 * is killed and writes go on (the two others are a majority of the final
 * membership; the removed nodes count for nothing).
 *
 * Every wait polls with a generous deadline (a loaded 2-core machine). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idalloc_errors.h"
#include "tests/cluster/members_load.h"
#include "tests/lib/harness.h"

static struct tc c;

static void teardown(void)
{
    tc_destroy(&c);
}

/* A client given only the client addresses of nodes 1 and 2 (both are
 * removed, then killed): it must find the others through the cluster. */
static struct idalloc_client *client_of_1_and_2(void)
{
    char addrs[128];
    snprintf(addrs, sizeof(addrs), "%s,%s", c.cfg.nodes[0].client.text,
             c.cfg.nodes[1].client.text);
    return ml_client_of(addrs);
}

Test(resize,
     three_to_five_to_three_under_load,
     .fini = teardown,
     .timeout = 400)
{
    tc_start(&c, 5, NULL);
    cr_assert_geq(tc_wait_leader(&c, 30000), 0, "no leader");
    struct idalloc_client *op = tc_client(&c, 10000);
    ml_pools(op);

    /* Three voters to start from: 4 and 5 leave. */
    ml_change(op, IDALLOC_MEMBER_REMOVE, 4, NULL, NULL);
    ml_change(op, IDALLOC_MEMBER_REMOVE, 5, NULL, NULL);
    cr_assert_eq(ml_count_voters(op), 3);

    static struct ml_load ld[2];
    atomic_int stop = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ml_load_start(&ld[i], i, &stop,
                      i == 1 ? client_of_1_and_2() : tc_client(&c, 5000),
                      &th[i]);
    }
    uint64_t acked0 = 0;
    tc_sleep_ms(1000);

    /* 3 -> 5: the operator adds 4 and 5 back; auto_rejoin promotes them
     * once caught up. */
    acked0 = ld[0].acked + ld[1].acked;
    ml_change(op, IDALLOC_MEMBER_ADD, 4, NULL, NULL);
    ml_wait_voter(op, 4, 1);
    ml_change(op, IDALLOC_MEMBER_ADD, 5, NULL, NULL);
    ml_wait_voter(op, 5, 1);
    cr_assert_eq(ml_count_voters(op), 5);
    tc_sleep_ms(1000);

    /* 5 -> 3: two of the first three leave (the leader among them hands
     * over first). */
    ml_change(op, IDALLOC_MEMBER_REMOVE, 1, NULL, NULL);
    ml_wait_voter(op, 1, 0);
    ml_change(op, IDALLOC_MEMBER_REMOVE, 2, NULL, NULL);
    ml_wait_voter(op, 2, 0);
    cr_assert_eq(ml_count_voters(op), 3);
    tc_sleep_ms(1000);
    uint64_t during = ld[0].acked + ld[1].acked - acked0;
    /* The nodes say the membership no longer is the cluster file's. */
    char out[4096];
    cr_assert_eq(tc_run(out, sizeof(out),
                        "grep -l 'membership in effect (voters .*; learners "
                        "none) differs from the cluster file' %s/node*.log",
                        c.dir),
                 0, "no node said its membership differs from the file");

    /* The removed nodes stop: the client given only their addresses keeps
     * working (it learned the others from the cluster). */
    tc_signal(&c, 0, SIGKILL);
    tc_signal(&c, 1, SIGKILL);
    uint64_t before = ld[1].acked;
    for (uint64_t end = tc_now_ms() + 30000;
         tc_now_ms() < end && ld[1].acked < before + 20;) {
        tc_sleep_ms(100);
    }
    cr_assert_geq(ld[1].acked, before + 20,
                  "the client of nodes 1 and 2 stopped when they did");

    /* One of the final voters dies: 2 of 3 still make a majority. */
    struct idalloc_member_list ml;
    cr_assert_eq(idalloc_member_list(op, &ml, tc_detail()), 0);
    int victim = -1;
    for (size_t i = 0; i < ml.n; i++) {
        if (ml.members[i].voter && !ml.members[i].waiting &&
            ml.members[i].id != ml.leader_id) {
            victim = (int)ml.members[i].id - 1;
        }
    }
    cr_assert_geq(victim, 0);
    tc_signal(&c, victim, SIGKILL);
    uint64_t after = ld[0].acked + ld[1].acked;
    for (uint64_t end = tc_now_ms() + 30000;
         tc_now_ms() < end && ld[0].acked + ld[1].acked < after + 20;) {
        tc_sleep_ms(100);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
    }
    cr_assert_geq(ld[0].acked + ld[1].acked, after + 20,
                  "writes stopped after a final voter died");
    cr_assert_gt(during, 50, "too little load during the changes (%llu)",
                 (unsigned long long)during);

    ml_check_acked(op, ld, 2, during);
    for (int i = 0; i < 2; i++) {
        idalloc_client_free(ld[i].cl);
    }
    idalloc_client_free(op);
}

/* A client of nodes @from..@to (1-based) only. */
static struct idalloc_client *client_of(int from, int to)
{
    char addrs[512] = "";
    size_t len = 0;
    for (int i = from; i <= to && len < sizeof(addrs); i++) {
        int n = snprintf(addrs + len, sizeof(addrs) - len, "%s%s",
                         i > from ? "," : "", c.cfg.nodes[i - 1].client.text);
        len += n > 0 ? (size_t)n : 0;
    }
    return ml_client_of(addrs);
}

/* Nodes with new ids and addresses (README, Runbook, "Add nodes with new
 * ids or addresses"): a cluster created by a 3-node file; nodes 4 and 5
 * start on addresses it does not name, with a file that adds their lines;
 * nodes 1-3 are restarted one at a time with that file (writes go on);
 * 4 and 5 become voters; 1 and 2 are removed and killed. Clients given
 * only the first three nodes' addresses keep working throughout. */
Test(resize,
     new_ids_and_addresses_by_extending_the_cluster_file,
     .fini = teardown,
     .timeout = 400)
{
    tc_setup(&c, 5, NULL); /* c.conf: the extended file, nodes 1-5 */
    char old[300], out[4096];
    snprintf(old, sizeof(old), "%s/old.conf", c.dir);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "grep -v '^node [45] ' %s > %s && grep -c '^node' %s",
                        c.conf, old, old),
                 0);
    cr_assert_str_eq(out, "3\n");
    for (int i = 0; i < 3; i++) {
        snprintf(c.node_conf[i], sizeof(c.node_conf[i]), "%s", old);
        tc_spawn(&c, i);
    }
    cr_assert_geq(tc_wait_leader(&c, 30000), 0, "no leader");
    struct idalloc_client *op = client_of(1, 3);
    ml_pools(op);
    cr_assert_eq(ml_count_voters(op), 3);

    static struct ml_load ld[2];
    atomic_int stop = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ml_load_start(&ld[i], i, &stop, client_of(1, 3), &th[i]);
    }
    tc_sleep_ms(500);
    uint64_t acked0 = ld[0].acked + ld[1].acked;

    /* The new machines start with the extended file: the old nodes do not
     * know them yet, so they wait. */
    tc_spawn(&c, 3);
    tc_spawn(&c, 4);
    tc_sleep_ms(1000);
    cr_assert_eq(ml_count_voters(op), 3);

    /* Rolling restart of the old nodes with the extended file. */
    for (int i = 0; i < 3; i++) {
        tc_signal(&c, i, SIGTERM);
        c.node_conf[i][0] = '\0';
        tc_spawn(&c, i);
        /* (tc_wait_leader would also wait for 4 and 5, still outside.) */
        int led = 0;
        for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && !led;) {
            struct idalloc_member_list ml;
            led = idalloc_member_list(op, &ml, tc_detail()) == 0 &&
                  ml.leader_id != 0;
            if (!led) {
                tc_sleep_ms(200);
            }
        }
        cr_assert(led, "no leader after restarting node %d", i + 1);
    }

    /* 3 -> 5: added (auto_rejoin on promotes them once caught up). */
    ml_wait_heard(op, 4);
    ml_change(op, IDALLOC_MEMBER_ADD, 4, NULL, NULL);
    ml_wait_voter(op, 4, 1);
    ml_wait_heard(op, 5);
    ml_change(op, IDALLOC_MEMBER_ADD, 5, NULL, NULL);
    ml_wait_voter(op, 5, 1);
    cr_assert_eq(ml_count_voters(op), 5);

    /* 5 -> 3: nodes 1 and 2 leave and stop; the clients, given only the
     * addresses of 1-3, go on with 3, 4 and 5. */
    ml_change(op, IDALLOC_MEMBER_REMOVE, 1, NULL, NULL);
    ml_wait_voter(op, 1, 0);
    ml_change(op, IDALLOC_MEMBER_REMOVE, 2, NULL, NULL);
    ml_wait_voter(op, 2, 0);
    cr_assert_eq(ml_count_voters(op), 3);
    tc_signal(&c, 0, SIGKILL);
    tc_signal(&c, 1, SIGKILL);
    uint64_t before = ld[0].acked + ld[1].acked;
    for (uint64_t end = tc_now_ms() + 30000;
         tc_now_ms() < end && (ld[0].acked + ld[1].acked) < before + 40;) {
        tc_sleep_ms(100);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
    }
    cr_assert_geq(ld[0].acked + ld[1].acked, before + 40,
                  "writes stopped once nodes 1 and 2 were gone");
    uint64_t during = before - acked0;
    cr_assert_gt(during, 50, "too little load during the changes (%llu)",
                 (unsigned long long)during);
    ml_check_acked(op, ld, 2, during);
    for (int i = 0; i < 2; i++) {
        idalloc_client_free(ld[i].cl);
    }
    idalloc_client_free(op);
}
