/* idallocd as a real 3-node cluster: operations, leader kill, restart of
 * everything, bad frames, a foreign data directory, catch-up by snapshot. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/common/frame.h"
#include "tests/lib/harness.h"

static struct tc c;
static struct idalloc_client *cl;

static void setup3(void)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 10000), 0, "no leader elected");
    cl = tc_client(&c, 10000);
}

static void teardown(void)
{
    if (cl != NULL) {
        idalloc_client_free(cl);
        cl = NULL;
    }
    tc_destroy(&c);
}

Test(cluster, every_operation, .init = setup3, .fini = teardown, .timeout = 60)
{
    int created;
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 3, &created,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(created, 1);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 3, &created,
                                     tc_detail()),
                 0);
    cr_assert_eq(created, 0, "an identical pool already exists");
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 4, NULL,
                                     tc_detail()),
                 IDA_EPOOLEXISTS);
    uint64_t id;
    int existed;
    const char *tags[] = {"alice", "bob", "carol"};
    for (uint64_t i = 0; i < 3; i++) {
        cr_assert_eq(
            idalloc_alloc(cl, "b", tags[i], &id, &existed, tc_detail()), 0,
            "%s", tc_errmsg());
        cr_assert_eq(id, i, "lowest free id first");
        cr_assert_eq(existed, 0);
    }
    cr_assert_eq(idalloc_alloc(cl, "b", "bob", &id, &existed, tc_detail()), 0);
    cr_assert_eq(id, 1);
    cr_assert_eq(existed, 1, "the same tag gets its id back");
    cr_assert_eq(idalloc_alloc(cl, "b", "dave", &id, NULL, tc_detail()),
                 IDA_EEXHAUSTED);
    int freed;
    cr_assert_eq(idalloc_free(cl, "b", 1, "alice", &freed, tc_detail()),
                 IDA_ETAGMISMATCH);
    cr_assert_eq(idalloc_free(cl, "b", 1, "bob", &freed, tc_detail()), 0);
    cr_assert_eq(freed, 1);
    cr_assert_eq(idalloc_free(cl, "b", 1, "bob", &freed, tc_detail()), 0);
    cr_assert_eq(freed, 0, "free is idempotent");
    cr_assert_eq(idalloc_lookup(cl, "b", "carol", &id, tc_detail()), 0);
    cr_assert_eq(id, 2);
    cr_assert_eq(idalloc_lookup(cl, "b", "bob", &id, tc_detail()),
                 IDA_ENOTFOUND);
    struct idalloc_holding *h;
    size_t n;
    int more;
    cr_assert_eq(idalloc_list(cl, "b", 0, 0, 0, &h, &n, &more, tc_detail()), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(h[0].id, 0);
    cr_assert_str_eq(h[0].tag, "alice");
    cr_assert_eq(h[1].id, 2);
    idalloc_holdings_free(h, n);

    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    uint64_t f1, f2;
    cr_assert_eq(idalloc_reserve(cl, "s", 100, &f1, tc_detail()), 0);
    cr_assert_eq(idalloc_reserve(cl, "s", 5, &f2, tc_detail()), 0);
    cr_assert(f2 >= f1 + 100 || f2 + 5 <= f1, "blocks overlap");

    cr_assert_eq(
        idalloc_pool_create(cl, "p", IDALLOC_POOL_PREFIX, 0, NULL, tc_detail()),
        0);
    uint8_t p1[9], p2[9];
    size_t l1, l2;
    cr_assert_eq(idalloc_prefix(cl, "p", "dir1", p1, &l1, NULL, tc_detail()),
                 0);
    cr_assert_eq(idalloc_prefix(cl, "p", "dir2", p2, &l2, NULL, tc_detail()),
                 0);
    size_t m = l1 < l2 ? l1 : l2;
    cr_assert_neq(memcmp(p1, p2, m), 0, "one prefix is a prefix of another");

    cr_assert_eq(idalloc_alloc(cl, "nope", "t", &id, NULL, tc_detail()),
                 IDA_ENOPOOL);
    cr_assert_eq(idalloc_reserve(cl, "b", 1, &f1, tc_detail()), IDA_EKIND);
}

/* Allocate @count tags "t<base+i>" in pool "b", recording their ids. */
static void alloc_tags(int base, int count, uint64_t *ids)
{
    for (int i = 0; i < count; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "t%d", base + i);
        int rv = idalloc_alloc(cl, "b", tag, &ids[base + i], NULL, tc_detail());
        cr_assert_eq(rv, 0, "alloc %s: %s", tag, tc_errmsg());
    }
}

static void check_tags(int count, const uint64_t *ids)
{
    for (int i = 0; i < count; i++) {
        char tag[32];
        uint64_t id;
        snprintf(tag, sizeof(tag), "t%d", i);
        cr_assert_eq(idalloc_lookup(cl, "b", tag, &id, tc_detail()), 0,
                     "lookup %s: %s", tag, tc_errmsg());
        cr_assert_eq(id, ids[i], "tag %s moved", tag);
        for (int k = 0; k < i; k++) {
            cr_assert_neq(ids[k], ids[i], "id %llu twice",
                          (unsigned long long)ids[i]);
        }
    }
}

Test(cluster,
     leader_kill_loses_nothing,
     .init = setup3,
     .fini = teardown,
     .timeout = 90)
{
    static uint64_t ids[400];
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 100000,
                                     NULL, tc_detail()),
                 0);
    alloc_tags(0, 100, ids);
    int old = tc_wait_leader(&c, 5000);
    cr_assert_geq(old, 0);
    uint64_t t0 = tc_now_ms();
    tc_signal(&c, old, SIGKILL);
    int leader = tc_wait_leader(&c, 10000);
    cr_assert_geq(leader, 0, "no new leader");
    cr_assert_neq(leader, old);
    cr_assert_lt(tc_now_ms() - t0, 10000);
    alloc_tags(100, 100, ids);
    tc_spawn(&c, old);
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 15000),
              "the restarted node did not catch up");
    alloc_tags(200, 50, ids);
    check_tags(250, ids);
}

Test(cluster,
     restart_all_keeps_state,
     .init = setup3,
     .fini = teardown,
     .timeout = 90)
{
    static uint64_t ids[100];
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                     tc_detail()),
                 0);
    alloc_tags(0, 60, ids);
    uint64_t first;
    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_reserve(cl, "s", 1000, &first, &call), 0);
    for (int i = 0; i < 3; i++) {
        int st = tc_signal(&c, i, SIGTERM);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "node %d did not exit 0 on SIGTERM", i + 1);
    }
    for (int i = 0; i < 3; i++) {
        tc_spawn(&c, i);
    }
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    check_tags(60, ids);
    /* The session and its answer survived the restart: a repeat of the
     * reserve (from a new client object, by its request id) gets its
     * block back. */
    struct idalloc_client *other = tc_client(&c, 10000);
    call.state = IDALLOC_CALL_UNKNOWN;
    uint64_t again = 0;
    cr_assert_eq(idalloc_reserve(other, "s", 1000, &again, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(again, first, "the repeat got another block");
    idalloc_client_free(other);
    uint64_t next;
    cr_assert_eq(idalloc_reserve(cl, "s", 10, &next, tc_detail()), 0);
    cr_assert_geq(next, first + 1000, "a block was handed out twice");
}

static int raw_connect(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

Test(cluster,
     bad_frames_do_not_hurt,
     .init = setup3,
     .fini = teardown,
     .timeout = 60)
{
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 10, NULL,
                                     tc_detail()),
                 0);
    for (int i = 0; i < 3; i++) {
        int fd = raw_connect(c.cfg.nodes[i].client.port);
        cr_assert_eq(write(fd, "garbage!garbage!", 16), 16);
        close(fd);
        fd = raw_connect(c.cfg.nodes[i].client.port);
        uint8_t hdr[IDA_FRAME_HEADER_BYTES];
        ida_frame_header_encode(hdr, IDA_FRAME_CLIENT_REQUEST, 60u << 20);
        cr_assert_eq(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
        close(fd);
        /* Peer port too: garbage from a stranger. */
        fd = raw_connect(c.cfg.nodes[i].peer.port);
        cr_assert_eq(write(fd, "\xa1\x03\x00\x00\x00\x02\xff\xff", 8), 8);
        close(fd);
    }
    uint64_t id;
    cr_assert_eq(idalloc_alloc(cl, "b", "x", &id, NULL, tc_detail()), 0, "%s",
                 tc_errmsg());
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kill(c.pid[i], 0), 0, "node %d died", i + 1);
    }
}

Test(cluster,
     foreign_data_directory_is_refused,
     .init = setup3,
     .fini = teardown,
     .timeout = 60)
{
    tc_signal(&c, 0, SIGTERM);
    /* The same data_dir, another cluster name. */
    char other[400], out[512];
    snprintf(other, sizeof(other), "%s/other.conf", c.dir);
    int rv = tc_run(out, sizeof(out),
                    "sed 's/^cluster test/cluster other/' "
                    "%s > %s && echo ok",
                    c.conf, other);
    cr_assert_eq(rv, 0);
    rv = tc_run(out, sizeof(out), "%s --config %s --node 1 2>&1",
                tc_bin("idallocd"), other);
    cr_assert_eq(rv, 1, "exit %d: %s", rv, out);
    cr_assert(strstr(out, "node1") != NULL, "names the directory: %s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    /* Nothing was overwritten: the real node starts on it again. */
    tc_spawn(&c, 0);
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 10000));
}

/* A cluster file of one node. Without --single-node the node waits, like
 * any first start, for nodes to hear from (with no one to ask, creating the
 * cluster is the operator's call: a node whose directory was lost would
 * otherwise start over and hand ids out again). With it, the node creates
 * the cluster by itself, serves, and after a kill leads again with its
 * state (the flag changes nothing once the directory holds a membership). */
Test(cluster, one_node_is_a_cluster_of_its_own, .fini = teardown, .timeout = 60)
{
    tc_setup(&c, 1, NULL);
    tc_spawn(&c, 0);
    cr_assert_lt(tc_wait_leader(&c, 2000), 0, "created without --single-node");
    for (uint64_t end = tc_now_ms() + 10000;
         tc_now_ms() < end &&
         tc_log_count(&c, 0, "start it with --single-node") == 0;) {
        tc_sleep_ms(100);
    }
    cr_assert_geq(tc_log_count(&c, 0, "start it with --single-node"), 1);
    tc_signal(&c, 0, SIGKILL);
    snprintf(c.node_args[0], sizeof(c.node_args[0]), "--single-node");
    tc_spawn(&c, 0);
    cr_assert_eq(tc_wait_leader(&c, 10000), 0, "the lone node did not lead");
    cl = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 10, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    uint64_t id;
    cr_assert_eq(idalloc_alloc(cl, "b", "a", &id, NULL, tc_detail()), 0);
    cr_assert_eq(id, 0);
    idalloc_client_free(cl);
    cl = NULL;
    tc_signal(&c, 0, SIGKILL);
    tc_spawn(&c, 0);
    cr_assert_eq(tc_wait_leader(&c, 10000), 0, "no leader after a restart");
    cl = tc_client(&c, 10000);
    int existed;
    cr_assert_eq(idalloc_alloc(cl, "b", "a", &id, &existed, tc_detail()), 0);
    cr_assert_eq(id, 0);
    cr_assert_eq(existed, 1, "the tag kept its id across the kill");
    cr_assert_eq(idalloc_alloc(cl, "b", "b", &id, NULL, tc_detail()), 0);
    cr_assert_eq(id, 1);
}

/* A first start counts only recent answers: node 2 heard node 1 say its
 * directory is new, then node 1 went away (it could come back seeded by an
 * import, or with a membership); node 3 starting later must not make node
 * 2 create the cluster on node 1's old answer. Node 1 back (still new),
 * the three create it. */
Test(cluster,
     first_start_counts_only_recent_answers,
     .fini = teardown,
     .timeout = 60)
{
    tc_setup(&c, 3, NULL);
    tc_spawn(&c, 0);
    tc_spawn(&c, 1);
    for (uint64_t end = tc_now_ms() + 10000;
         tc_now_ms() < end &&
         tc_log_count(&c, 1, "waiting to hear from node(s) 3") == 0;) {
        tc_sleep_ms(100);
    }
    cr_assert_geq(tc_log_count(&c, 1, "waiting to hear from node(s) 3"), 1,
                  "node 2 did not hear node 1");
    tc_signal(&c, 0, SIGKILL);
    tc_sleep_ms(5000); /* well past NODE_HEARD_RECENT_MS (3 s) */
    tc_spawn(&c, 2);
    /* Node 2 says whom it waits for: node 1 alone, heard new too long ago
     * (node 3 heard). "node(s) 1 (" and not "node(s) 1": its first line,
     * before it heard anyone, was "node(s) 1, 3", and matched at once. */
    const char *only1 = "waiting to hear from node(s) 1 (";
    for (uint64_t end = tc_now_ms() + 12000;
         tc_now_ms() < end && tc_log_count(&c, 1, only1) == 0;) {
        tc_sleep_ms(100);
    }
    cr_assert_geq(tc_log_count(&c, 1, only1), 1,
                  "node 2 does not name node 1 alone");
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(tc_log_count(&c, i, "created the cluster"), 0,
                     "node %d created the cluster without node 1", i + 1);
        cr_assert_eq(tc_log_count(&c, i, "joined the cluster"), 0,
                     "node %d joined a cluster made without node 1", i + 1);
    }
    tc_spawn(&c, 0);
    cr_assert_geq(tc_wait_leader(&c, 15000), 0, "no leader with all three");
}

/* --single-node with a cluster file of several nodes: exit 2, nothing
 * created. */
Test(cluster, single_node_needs_a_one_node_file, .fini = teardown)
{
    char out[512];
    tc_setup(&c, 3, NULL);
    cr_assert_eq(
        tc_run(out, sizeof(out), "%s --config %s --node 1 --single-node 2>&1",
               tc_bin("idallocd"), c.conf),
        2, "%s", out);
    cr_assert(strstr(out,
                     "--single-node needs a cluster file whose only node "
                     "line is node 1's (it has 3)") != NULL,
              "%s", out);
    cr_assert_neq(tc_run(out, sizeof(out), "test -e %s/data/node1", c.dir), 0,
                  "a data directory was created");
}

Test(cluster, bad_usage_and_config)
{
    char out[512];
    cr_assert_eq(tc_run(out, sizeof(out), "%s 2>&1", tc_bin("idallocd")), 2);
    cr_assert(strstr(out, "--config and --node are required") != NULL, "%s",
              out);
    cr_assert_eq(tc_run(out, sizeof(out), "%s --help", tc_bin("idallocd")), 0);
    cr_assert(strstr(out, "usage: idallocd") != NULL);
    cr_assert_eq(
        tc_run(out, sizeof(out), "%s --config /nonexistent.conf --node 1 2>&1",
               tc_bin("idallocd")),
        2);
    cr_assert(strstr(out, "/nonexistent.conf") != NULL, "%s", out);
}

Test(cluster, follower_catches_up_by_snapshot, .fini = teardown, .timeout = 120)
{
    tc_start(&c, 3, "snapshot_interval_entries 20\n");
    int leader = tc_wait_leader(&c, 10000);
    cr_assert_geq(leader, 0);
    cl = tc_client(&c, 10000);
    int down = (leader + 1) % 3;
    tc_signal(&c, down, SIGKILL);
    static uint64_t ids[300];
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 100000,
                                     NULL, tc_detail()),
                 0);
    /* A reserve of a client that sends nothing after it: its answer is
     * kept in the session, which the snapshot must carry. */
    struct idalloc_client *keeper = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(keeper, "s", IDALLOC_POOL_SEQUENCE, 0,
                                     NULL, tc_detail()),
                 0);
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t first;
    cr_assert_eq(idalloc_reserve(keeper, "s", 77, &first, &call), 0);
    idalloc_client_free(keeper);
    alloc_tags(0, 200, ids);
    /* A snapshot that falls due pauses up to a second before it starts
     * (src/node/snap_policy.h, TURNS): wait until the leader's log no
     * longer holds the follower's place (trimmed once its snapshot is
     * stored), so the follower must install one. */
    struct idalloc_node_status ls;
    for (uint64_t end = tc_now_ms() + 20000;; tc_sleep_ms(100)) {
        cr_assert_eq(idalloc_node_status(cl, (size_t)leader, &ls, tc_detail()),
                     0);
        if (ls.log_first_index > 100) {
            break;
        }
        cr_assert_lt(tc_now_ms(), end, "the leader's log was not compacted");
    }
    tc_spawn(&c, down);
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 20000),
              "the follower did not catch up");
    struct idalloc_node_status s;
    cr_assert_eq(idalloc_node_status(cl, (size_t)down, &s, tc_detail()), 0);
    cr_assert_gt(s.snapshot_index, 0, "the follower has no snapshot");
    cr_assert_geq(
        tc_log_count(&c, down, "received from the leader and checked"), 1,
        "the follower installed no snapshot from the leader");
    /* It can lead with what it got, sessions included: the reserve
     * repeated by its request id gets its first block. */
    tc_signal(&c, leader, SIGKILL);
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    check_tags(200, ids);
    call.state = IDALLOC_CALL_UNKNOWN;
    uint64_t again = 0;
    cr_assert_eq(idalloc_reserve(cl, "s", 77, &again, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(again, first, "the repeat got another block");
    call.state = IDALLOC_CALL_UNKNOWN; /* DONE: the next use would be fresh */
    cr_assert_eq(idalloc_reserve(cl, "s", 78, &again, &call), IDA_EREUSED,
                 "same request id, other count");
}

/* A follower paused for three election timeouts (SIGSTOP: what an
 * overloaded machine does to a process, in the large) comes back without
 * an election: the ticks it could not see are forgotten, so it reads the
 * leader's heartbeats waiting in its inbox before its election timer
 * counts again; and it says in its log that it ran late. */
Test(cluster,
     paused_follower_comes_back_quietly,
     .init = setup3,
     .fini = teardown,
     .timeout = 60)
{
    int l = tc_wait_leader(&c, 10000);
    cr_assert_geq(l, 0);
    int f = (l + 1) % 3;
    struct idalloc_node_status s0, s;
    cr_assert_eq(idalloc_node_status(cl, (size_t)l, &s0, tc_detail()), 0, "%s",
                 tc_errmsg());
    cr_assert_eq(tc_log_count(&c, f, "raft: ticks ran"), 0);
    tc_signal(&c, f, SIGSTOP);
    tc_sleep_ms(1000);
    tc_signal(&c, f, SIGCONT);
    uint64_t end = tc_now_ms() + 5000;
    while (tc_log_count(&c, f, "raft: ticks ran") == 0 && tc_now_ms() < end) {
        tc_sleep_ms(20);
    }
    cr_assert_eq(tc_log_count(&c, f, "raft: ticks ran"), 1);
    tc_sleep_ms(600); /* two election timeouts */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(idalloc_node_status(cl, (size_t)i, &s, tc_detail()), 0,
                     "node %d: %s", i + 1, tc_errmsg());
        cr_assert_eq(s.term, s0.term, "node %d: term %llu -> %llu", i + 1,
                     (unsigned long long)s0.term, (unsigned long long)s.term);
        cr_assert_eq(s.leader_id, (unsigned)l + 1);
    }
    uint64_t first;
    int created;
    cr_assert_eq(idalloc_pool_create(cl, "after", IDALLOC_POOL_SEQUENCE, 0,
                                     &created, tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_reserve(cl, "after", 1, &first, tc_detail()), 0, "%s",
                 tc_errmsg());
}
