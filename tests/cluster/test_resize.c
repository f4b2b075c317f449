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
#include "tests/lib/harness.h"

#define TAGS_MAX   20000
#define BLOCKS_MAX 20000

static struct tc c;

static void teardown(void)
{
    tc_destroy(&c);
}

/* One load thread: tagged allocs, and reserves of 10 ids every 4th op. */
struct load
{
    int no;
    struct idalloc_client *cl;
    atomic_int *stop;
    uint64_t ids[TAGS_MAX]; /* id + 1 acknowledged for tag k, 0: none */
    size_t tags;            /* tags tried */
    uint64_t first[BLOCKS_MAX];
    size_t blocks;
    uint64_t acked, unknown;
};

static void *load_main(void *arg)
{
    struct load *l = arg;
    char tag[32];
    size_t k = 0;
    for (uint64_t op = 0; !atomic_load(l->stop) && k < TAGS_MAX; op++) {
        if (op % 4 == 3 && l->blocks < BLOCKS_MAX) {
            uint64_t first;
            int rv = idalloc_reserve(l->cl, "s", 10, &first, tc_detail());
            if (rv == 0) {
                l->first[l->blocks++] = first;
                l->acked++;
            } else {
                l->unknown++;
            }
            continue;
        }
        snprintf(tag, sizeof(tag), "w%d-%zu", l->no, k);
        uint64_t id;
        int rv = idalloc_alloc(l->cl, "b", tag, &id, NULL, tc_detail());
        if (rv == 0) {
            l->ids[k] = id + 1;
            l->acked++;
            k++; /* an unknown outcome asks again for the same tag */
        } else {
            l->unknown++;
            tc_sleep_ms(20);
        }
    }
    l->tags = k;
    return NULL;
}

static size_t count_voters(struct idalloc_client *cl)
{
    struct idalloc_member_list l;
    if (idalloc_member_list(cl, &l, tc_detail()) != 0) {
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < l.n; i++) {
        k += l.members[i].voter && !l.members[i].waiting;
    }
    return k;
}

static int is_voter(struct idalloc_client *cl, unsigned id)
{
    struct idalloc_member_list l;
    if (idalloc_member_list(cl, &l, tc_detail()) != 0) {
        return -1;
    }
    for (size_t i = 0; i < l.n; i++) {
        if (l.members[i].id == id && !l.members[i].waiting) {
            return l.members[i].voter;
        }
    }
    return 0;
}

/* One change, repeated while its outcome is unknown (repeating is safe:
 * a change already made answers changed = 0). */
static void change(struct idalloc_client *cl,
                   enum idalloc_member_op op,
                   unsigned id)
{
    int rv = -1;
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        rv = idalloc_member_change(cl, op, id, NULL, tc_detail());
        if (rv == 0 || idalloc_errclass(rv) == IDA_ERR_CLASS_DEFINITE) {
            break;
        }
        tc_sleep_ms(200);
    }
    cr_assert_eq(rv, 0, "member change %d of node %u: %s", op, id, tc_errmsg());
}

/* Until the leader has heard node @id (member list shows it, waiting or
 * member): a link to a node the others did not know yet comes up after
 * its reconnect backoff (up to reconnect_max_ms, longer with TLS, whose
 * refused handshakes count as failed links). */
static void wait_heard(struct idalloc_client *cl, unsigned id)
{
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (idalloc_member_list(cl, &l, tc_detail()) == 0) {
            for (size_t i = 0; i < l.n; i++) {
                if (l.members[i].id == id) {
                    return;
                }
            }
        }
        tc_sleep_ms(200);
    }
    cr_assert_fail("node %u never heard from", id);
}

static void wait_voter(struct idalloc_client *cl, unsigned id, int voter)
{
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        if (is_voter(cl, id) == voter) {
            return;
        }
        tc_sleep_ms(200);
    }
    cr_assert_fail("node %u: voter is not %d after 60 s", id, voter);
}

/* A client given only the client addresses of nodes 1 and 2 (both are
 * removed, then killed): it must find the others through the cluster. */
static struct idalloc_client *client_of_1_and_2(void)
{
    char addrs[128];
    snprintf(addrs, sizeof(addrs), "%s,%s", c.cfg.nodes[0].client.text,
             c.cfg.nodes[1].client.text);
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = addrs;
    o.call_timeout_ms = 5000;
    o.attempt_timeout_ms = 500;
    struct idalloc_client *cl;
    char err[IDALLOC_ERRMSG_MAX];
    cr_assert_eq(idalloc_client_new(&o, &cl, err), 0, "%s", err);
    return cl;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every acknowledged tag still holds its id; no id was acknowledged to two
 * tags; no two acknowledged blocks overlap. */
static void check_acked(struct idalloc_client *op,
                        const struct load *ld,
                        uint64_t during)
{
    uint64_t *all = calloc(2 * TAGS_MAX, sizeof(uint64_t));
    uint64_t *blocks = calloc(2 * BLOCKS_MAX, sizeof(uint64_t));
    cr_assert(all != NULL && blocks != NULL);
    size_t n_all = 0, n_blocks = 0;
    char tag[32];
    for (int i = 0; i < 2; i++) {
        for (size_t k = 0; k < ld[i].tags; k++) {
            if (ld[i].ids[k] == 0) {
                continue;
            }
            snprintf(tag, sizeof(tag), "w%d-%zu", i, k);
            uint64_t got = 0;
            int rv = -1;
            for (int t = 0; t < 20 && rv != 0; t++) {
                rv = idalloc_lookup(op, "b", tag, &got, tc_detail());
            }
            cr_assert_eq(rv, 0, "lookup %s: %s", tag, tc_errmsg());
            cr_assert_eq(got, ld[i].ids[k] - 1,
                         "tag %s was acknowledged id %llu, holds %llu", tag,
                         (unsigned long long)(ld[i].ids[k] - 1),
                         (unsigned long long)got);
            all[n_all++] = got;
        }
        for (size_t b = 0; b < ld[i].blocks; b++) {
            blocks[n_blocks++] = ld[i].first[b];
        }
    }
    qsort(all, n_all, sizeof(uint64_t), cmp_u64);
    for (size_t k = 1; k < n_all; k++) {
        cr_assert_neq(all[k], all[k - 1], "id %llu acknowledged to two tags",
                      (unsigned long long)all[k]);
    }
    qsort(blocks, n_blocks, sizeof(uint64_t), cmp_u64);
    for (size_t k = 1; k < n_blocks; k++) {
        cr_assert_geq(
            blocks[k], blocks[k - 1] + 10, "blocks at %llu and %llu overlap",
            (unsigned long long)blocks[k - 1], (unsigned long long)blocks[k]);
    }
    cr_log_info(
        "resize: %zu tags and %zu blocks acknowledged (%llu during "
        "the changes), %llu unknown outcomes retried",
        n_all, n_blocks, (unsigned long long)during,
        (unsigned long long)(ld[0].unknown + ld[1].unknown));
    free(all);
    free(blocks);
}

Test(resize,
     three_to_five_to_three_under_load,
     .fini = teardown,
     .timeout = 400)
{
    tc_start(&c, 5, NULL);
    cr_assert_geq(tc_wait_leader(&c, 30000), 0, "no leader");
    struct idalloc_client *op = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(op, "b", IDALLOC_POOL_BOUNDED, 1000000,
                                     NULL, tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_pool_create(op, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());

    /* Three voters to start from: 4 and 5 leave. */
    change(op, IDALLOC_MEMBER_REMOVE, 4);
    change(op, IDALLOC_MEMBER_REMOVE, 5);
    cr_assert_eq(count_voters(op), 3);

    static struct load ld[2];
    atomic_int stop = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&ld[i], 0, sizeof(ld[i]));
        ld[i].no = i;
        ld[i].stop = &stop;
        ld[i].cl = i == 1 ? client_of_1_and_2() : tc_client(&c, 5000);
        cr_assert_eq(pthread_create(&th[i], NULL, load_main, &ld[i]), 0);
    }
    uint64_t acked0 = 0;
    tc_sleep_ms(1000);

    /* 3 -> 5: the operator adds 4 and 5 back; auto_rejoin promotes them
     * once caught up. */
    acked0 = ld[0].acked + ld[1].acked;
    change(op, IDALLOC_MEMBER_ADD, 4);
    wait_voter(op, 4, 1);
    change(op, IDALLOC_MEMBER_ADD, 5);
    wait_voter(op, 5, 1);
    cr_assert_eq(count_voters(op), 5);
    tc_sleep_ms(1000);

    /* 5 -> 3: two of the first three leave (the leader among them hands
     * over first). */
    change(op, IDALLOC_MEMBER_REMOVE, 1);
    wait_voter(op, 1, 0);
    change(op, IDALLOC_MEMBER_REMOVE, 2);
    wait_voter(op, 2, 0);
    cr_assert_eq(count_voters(op), 3);
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

    check_acked(op, ld, during);
    for (int i = 0; i < 2; i++) {
        idalloc_client_free(ld[i].cl);
    }
    idalloc_client_free(op);
}

/* A client of nodes @from..@to (1-based) only. */
static struct idalloc_client *client_of(int from, int to)
{
    char addrs[256] = "";
    for (int i = from; i <= to; i++) {
        char a[48];
        snprintf(a, sizeof(a), "%s%s", i > from ? "," : "",
                 c.cfg.nodes[i - 1].client.text);
        strcat(addrs, a);
    }
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = addrs;
    o.call_timeout_ms = 5000;
    o.attempt_timeout_ms = 500;
    struct idalloc_client *cl;
    char err[IDALLOC_ERRMSG_MAX];
    cr_assert_eq(idalloc_client_new(&o, &cl, err), 0, "%s", err);
    return cl;
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
    cr_assert_eq(idalloc_pool_create(op, "b", IDALLOC_POOL_BOUNDED, 1000000,
                                     NULL, tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_pool_create(op, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(count_voters(op), 3);

    static struct load ld[2];
    atomic_int stop = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&ld[i], 0, sizeof(ld[i]));
        ld[i].no = i;
        ld[i].stop = &stop;
        ld[i].cl = client_of(1, 3);
        cr_assert_eq(pthread_create(&th[i], NULL, load_main, &ld[i]), 0);
    }
    tc_sleep_ms(500);
    uint64_t acked0 = ld[0].acked + ld[1].acked;

    /* The new machines start with the extended file: the old nodes do not
     * know them yet, so they wait. */
    tc_spawn(&c, 3);
    tc_spawn(&c, 4);
    tc_sleep_ms(1000);
    cr_assert_eq(count_voters(op), 3);

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
    wait_heard(op, 4);
    change(op, IDALLOC_MEMBER_ADD, 4);
    wait_voter(op, 4, 1);
    wait_heard(op, 5);
    change(op, IDALLOC_MEMBER_ADD, 5);
    wait_voter(op, 5, 1);
    cr_assert_eq(count_voters(op), 5);

    /* 5 -> 3: nodes 1 and 2 leave and stop; the clients, given only the
     * addresses of 1-3, go on with 3, 4 and 5. */
    change(op, IDALLOC_MEMBER_REMOVE, 1);
    wait_voter(op, 1, 0);
    change(op, IDALLOC_MEMBER_REMOVE, 2);
    wait_voter(op, 2, 0);
    cr_assert_eq(count_voters(op), 3);
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
    check_acked(op, ld, during);
    for (int i = 0; i < 2; i++) {
        idalloc_client_free(ld[i].cl);
    }
    idalloc_client_free(op);
}
