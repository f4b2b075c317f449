/* A lost disk never costs an acknowledged id (src/node/member.h,
 * raft/admission.h), with real idallocd processes:
 *
 * one follower is paused while an alloc is acknowledged by the leader and
 * the other follower; the leader is killed; the other follower's data
 * directory is deleted and the node restarted empty; the paused follower
 * wakes up. Before incarnations the empty node voted for the stale one,
 * which then handed the same id to another tag. Now the two cannot form a
 * quorum (the cluster is unavailable, never wrong); when the old leader
 * comes back, the empty node is re-admitted as a new incarnation by the
 * leader, and the first tag still holds its id. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "idalloc_errors.h"
#include "tests/lib/harness.h"

static struct tc c;

static void teardown(void)
{
    tc_destroy(&c);
}

/* Status of node @i (0-based) asked directly, with a short timeout. */
static int node_status(int i, struct idalloc_node_status *s)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = c.cfg.nodes[i].client.text;
    o.call_timeout_ms = 500;
    o.attempt_timeout_ms = 300;
    struct idalloc_client *cl = NULL;
    if (idalloc_client_new(&o, &cl, NULL) != 0) {
        return -1;
    }
    int rv = idalloc_node_status(cl, 0, s, tc_detail());
    idalloc_client_free(cl);
    return rv;
}

/* The index of the node that says it leads, waiting up to @ms; -1. */
static int wait_leader_among(const int *nodes, int k, unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        for (int j = 0; j < k; j++) {
            struct idalloc_node_status s;
            if (node_status(nodes[j], &s) == 0 &&
                strcmp(s.role, "leader") == 0) {
                return nodes[j];
            }
        }
        tc_sleep_ms(50);
    }
    return -1;
}

static int file_contains(const char *path, const char *needle)
{
    char cmd[600], out[64];
    snprintf(cmd, sizeof(cmd), "grep -c '%s' %s", needle, path);
    return tc_run(out, sizeof(out), "%s", cmd) == 0;
}

Test(lostdisk,
     an_empty_node_cannot_elect_a_stale_one,
     .fini = teardown,
     .timeout = 90)
{
    tc_start(&c, 3, NULL);
    int all[3] = {0, 1, 2};
    int l = wait_leader_among(all, 3, 15000);
    cr_assert_geq(l, 0, "no leader");
    int p = (l + 1) % 3; /* paused */
    int w = (l + 2) % 3; /* wiped */
    struct idalloc_client *cl = tc_client(&c, 5000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 100, NULL,
                                     tc_detail()),
                 0);
    uint64_t warm;
    cr_assert_eq(idalloc_alloc(cl, "b", "warm", &warm, NULL, tc_detail()), 0);
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 10000));

    /* The alloc acknowledged by the leader and w alone. */
    tc_signal(&c, p, SIGSTOP);
    uint64_t first;
    cr_assert_eq(idalloc_alloc(cl, "b", "first", &first, NULL, tc_detail()), 0,
                 "%s", tc_errmsg());
    idalloc_client_free(cl);

    /* Leader dies; w's disk is lost; p wakes up. */
    tc_signal(&c, l, SIGKILL);
    tc_signal(&c, w, SIGKILL);
    char out[256];
    cr_assert_eq(
        tc_run(out, sizeof(out), "rm -rf %s/data/node%d", c.dir, w + 1), 0);
    tc_spawn(&c, w);
    tc_signal(&c, p, SIGCONT);

    /* p and the empty w must not make a quorum. */
    int two[2] = {p, w};
    cr_assert_lt(wait_leader_among(two, 2, 3000), 0,
                 "the stale node and the empty one elected a leader");

    /* The old leader comes back with its disk: the cluster heals, the
     * empty node is re-admitted, and "first" still holds its id. */
    tc_spawn(&c, l);
    cl = tc_client(&c, 10000);
    uint64_t got;
    int rv = idalloc_lookup(cl, "b", "first", &got, tc_detail());
    cr_assert_eq(rv, 0, "lookup of the acknowledged tag: %s",
                 idalloc_strerror(rv));
    cr_assert_eq(got, first, "the acknowledged id changed");
    uint64_t second;
    cr_assert_eq(idalloc_alloc(cl, "b", "second", &second, NULL, tc_detail()),
                 0);
    cr_assert_neq(second, first, "the same id was handed out twice");
    cr_assert_neq(second, warm);

    /* Re-admission: within a while, w is a voter again and caught up. */
    int lead = wait_leader_among(all, 3, 10000);
    cr_assert_geq(lead, 0);
    char log[400], wlog[400];
    snprintf(wlog, sizeof(wlog), "%s/node%d.log", c.dir, w + 1);
    bool promoted = false;
    for (uint64_t end = tc_now_ms() + 20000; tc_now_ms() < end && !promoted;) {
        struct idalloc_node_status s;
        /* A promoted w answers as a follower of the leader with the
         * leader's applied index, and the leader logged three steps. */
        snprintf(log, sizeof(log), "%s/node%d.log", c.dir, lead + 1);
        promoted = file_contains(wlog, "joined the cluster") &&
                   node_status(w, &s) == 0 &&
                   s.leader_id == (unsigned)lead + 1 &&
                   file_contains(log, "proposed 3 voters, 0 learners");
        if (!promoted) {
            tc_sleep_ms(100);
        }
    }
    cr_assert(promoted, "the new incarnation was not re-admitted");
    /* With w a voter again, the cluster survives losing p. */
    tc_signal(&c, p, SIGKILL);
    uint64_t third;
    rv = idalloc_alloc(cl, "b", "third", &third, NULL, tc_detail());
    cr_assert_eq(rv, 0, "w does not count after re-admission: %s",
                 idalloc_strerror(rv));
    cr_assert(third != first && third != second && third != warm);
    idalloc_client_free(cl);
}
