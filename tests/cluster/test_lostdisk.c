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
#include <sys/wait.h>

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

/* Wait up to @ms for node @i's process to exit; its exit status, or -1 if
 * it is still running (or died of a signal). */
static int wait_exit(int i, unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        int st;
        pid_t r = waitpid(c.pid[i], &st, WNOHANG);
        if (r == c.pid[i]) {
            c.pid[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        tc_sleep_ms(50);
    }
    return -1;
}

/* Rule A4 (raft/admission.h) with real processes: a follower's directory is
 * copied, the follower restarts (a later start) and acknowledges more, then
 * the copy is put back. The node learns from its peers that its state went
 * back, marks the directory untrusted and exits 1; started again it is
 * refused at once with one line. The Runbook's remedy (remove the
 * directory, start the node) re-admits it as a new incarnation, and every
 * acknowledged id is kept. */
Test(lostdisk,
     a_directory_put_back_is_told_and_refused,
     .fini = teardown,
     .timeout = 120)
{
    tc_start(&c, 3, NULL);
    int all[3] = {0, 1, 2};
    int l = wait_leader_among(all, 3, 15000);
    cr_assert_geq(l, 0, "no leader");
    int f = (l + 1) % 3;
    struct idalloc_client *cl = tc_client(&c, 5000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                     tc_detail()),
                 0);
    uint64_t ids[40];
    char tag[32];
    for (int k = 0; k < 10; k++) {
        snprintf(tag, sizeof(tag), "t%d", k);
        cr_assert_eq(idalloc_alloc(cl, "b", tag, &ids[k], NULL, tc_detail()),
                     0);
    }
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 10000));
    char out[256];
    tc_signal(&c, f, SIGKILL);
    cr_assert_eq(tc_run(out, sizeof(out), "cp -a %s/data/node%d %s/copy", c.dir,
                        f + 1, c.dir),
                 0);
    tc_spawn(&c, f); /* a later start, which the others hear */
    for (int k = 10; k < 40; k++) {
        snprintf(tag, sizeof(tag), "t%d", k);
        cr_assert_eq(idalloc_alloc(cl, "b", tag, &ids[k], NULL, tc_detail()),
                     0);
    }
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 10000),
              "node %d did not catch up", f + 1);

    /* The older copy put back. */
    tc_signal(&c, f, SIGKILL);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "rm -rf %s/data/node%d && mv %s/copy %s/data/node%d",
                        c.dir, f + 1, c.dir, c.dir, f + 1),
                 0);
    tc_spawn(&c, f);
    cr_assert_eq(wait_exit(f, 15000), 1,
                 "the node restarted from a copy did not stop with status 1");
    char flog[400];
    snprintf(flog, sizeof(flog), "%s/node%d.log", c.dir, f + 1);
    cr_assert(file_contains(flog, "went back to an older copy"));
    cr_assert(file_contains(flog, "marked .* untrusted"));

    /* Started again: refused at once, one line, exit 1. */
    tc_spawn(&c, f);
    cr_assert_eq(wait_exit(f, 10000), 1, "the untrusted directory was used");
    cr_assert(file_contains(flog, "is marked untrusted"));

    /* Writes went on meanwhile, on the two others. */
    uint64_t more;
    cr_assert_eq(idalloc_alloc(cl, "b", "more", &more, NULL, tc_detail()), 0);

    /* The Runbook: remove the directory, start the node. */
    cr_assert_eq(
        tc_run(out, sizeof(out), "rm -rf %s/data/node%d", c.dir, f + 1), 0);
    tc_spawn(&c, f);
    bool back = false;
    for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && !back;) {
        struct idalloc_node_status s;
        back = node_status(f, &s) == 0 && s.leader_id != 0 &&
               s.applied_index >= tc_commit_index(&c) &&
               file_contains(flog, "joined the cluster");
        if (!back) {
            tc_sleep_ms(100);
        }
    }
    cr_assert(back, "the node did not rejoin as a new incarnation");
    for (int k = 0; k < 40; k++) {
        snprintf(tag, sizeof(tag), "t%d", k);
        uint64_t got;
        cr_assert_eq(idalloc_lookup(cl, "b", tag, &got, tc_detail()), 0);
        cr_assert_eq(got, ids[k], "%s moved", tag);
    }
    idalloc_client_free(cl);
}
