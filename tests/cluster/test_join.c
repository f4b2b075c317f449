/* Members that no cluster file names, with real idallocd processes
 * (README, Runbook: "Add nodes with new ids or addresses", "Move a node to
 * new addresses"):
 *
 *  - a cluster created by a 3-node file grows to 5 with `idallocd --join`
 *    and `idalloc member add ID PEER CLIENT` for nodes 4 and 5, which no
 *    node's file names, without restarting nodes 1-3, while two clients
 *    allocate and reserve; then shrinks to 3 by removing nodes 1 and 2,
 *    which are killed; clients given only the addresses of nodes 1-3 keep
 *    working; every acknowledged id is kept, none given twice; then every
 *    remaining node restarts and the membership, addresses included, is
 *    still there. The Runbook's commands are run as written there (certs
 *    add, idallocd --join, member add, member remove);
 *  - a dead node replaced by a node with a new id (remove, --join, add);
 *  - a joined node whose disk is replaced, re-admitted by the leader;
 *  - a member stopped and restarted with its data directory on new
 *    addresses, `member update`: the others dial the new address, it
 *    catches up, writes go on, and it can lead;
 *  - bad input: malformed, unspecified, equal and taken addresses, a
 *    non-member, a node never heard from: a clear error, exit 2 or 1,
 *    nothing changed; the node's own checks of forged requests; idallocd
 *    refusing addresses it cannot use.
 *
 * Every wait polls with a generous deadline (a loaded 2-core machine). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"
#include "src/common/frame.h"
#include "tests/cluster/members_load.h"
#include "tests/lib/forge.h"
#include "tests/lib/harness.h"

static struct tc c;

static void teardown(void)
{
    tc_destroy(&c);
}

/* The client addresses of the cluster file's nodes 1-3. */
static char file_addrs[512];
/* Ports drawn for addresses outside the file. */
static unsigned taken[16];
static size_t n_taken;

static void new_addr(char *out, size_t cap)
{
    unsigned p = ml_new_port(&c, taken, n_taken);
    taken[n_taken++] = p;
    snprintf(out, cap, "127.0.0.1:%u", p);
}

/* Start a node that is in no cluster file, as the Runbook says: its
 * certificate, then idallocd --join with addresses of its own. */
static void start_new_node(int id, char *peer, char *client)
{
    char out[4096];
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs add %s --node %d 2>&1",
                        tc_bin("idalloc"), c.tls, id),
                 0, "%s", out);
    new_addr(peer, 32);
    new_addr(client, 32);
    snprintf(c.node_args[id - 1], sizeof(c.node_args[0]),
             "--peer %s --client %s --join %.300s", peer, client, file_addrs);
    tc_spawn(&c, id - 1);
}

static int alive(int i)
{
    return c.pid[i] != 0 && waitpid(c.pid[i], NULL, WNOHANG) == 0;
}

/* Until the load threads acknowledged @more operations beyond now. */
static void wait_progress(const struct ml_load *ld, uint64_t more)
{
    uint64_t before = ld[0].acked + ld[1].acked;
    for (uint64_t end = tc_now_ms() + 30000;
         tc_now_ms() < end && ld[0].acked + ld[1].acked < before + more;) {
        tc_sleep_ms(100);
    }
    cr_assert_geq(ld[0].acked + ld[1].acked, before + more, "the load stopped");
}

Test(join, three_to_five_by_join_then_three, .fini = teardown, .timeout = 500)
{
    tc_setup(&c, 3, NULL);
    snprintf(file_addrs, sizeof(file_addrs), "%s", c.addrs);
    c.n = 5; /* nodes 4 and 5 are started later, outside the file */
    n_taken = 0;
    for (int i = 0; i < 3; i++) {
        tc_spawn(&c, i);
    }
    cr_assert_geq(tc_wait_leader(&c, 30000), 0, "no leader");
    pid_t first[3] = {c.pid[0], c.pid[1], c.pid[2]};
    struct idalloc_client *op = ml_client_of(file_addrs);
    ml_pools(op);

    static struct ml_load ld[2];
    atomic_int stop = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ml_load_start(&ld[i], i, &stop, ml_client_of(file_addrs), &th[i]);
    }
    tc_sleep_ms(500);
    uint64_t acked0 = ld[0].acked + ld[1].acked;

    /* 3 -> 5: nodes 4 and 5 join; the operator adds them with their
     * addresses; auto_rejoin promotes them once caught up. */
    char peer[2][32], client[2][32], out[8192];
    for (int k = 0; k < 2; k++) {
        int id = 4 + k;
        start_new_node(id, peer[k], client[k]);
        cr_assert(
            ml_wait_log(&c, id, "waiting to be added to cluster test", 30000),
            "node %d did not learn the cluster", id);
        ml_wait_heard(op, (unsigned)id); /* listed as waiting */
        int rc = ml_cli(out, sizeof(out), "--config %s member add %d %s %s",
                        c.conf, id, peer[k], client[k]);
        cr_assert_eq(rc, 0, "member add %d: %s", id, out);
        cr_assert_str_eq(out, "added\n");
        ml_wait_voter(op, (unsigned)id, 1);
        ml_wait_member_at(op, (unsigned)id, peer[k], client[k]);
        strcat(c.addrs, ",");
        strcat(c.addrs, client[k]);
    }
    cr_assert_eq(ml_count_voters(op), 5);
    /* A new data directory for node 5 may not take node 4's address: --join
     * finds it in the membership and stops (exit 1). */
    char spare[32];
    new_addr(spare, sizeof(spare));
    int rc =
        tc_run(out, sizeof(out),
               "timeout 30 %s --config %s --node 5 --data %s/spare "
               "--peer %s --client %s --join %s 2>&1",
               tc_bin("idallocd"), c.conf, c.dir, peer[0], spare, file_addrs);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "is member 4's") != NULL, "%s", out);
    /* Nodes 1-3 never restarted; they dial 4 and 5 where the membership
     * says. */
    char up[2][64];
    for (int k = 0; k < 2; k++) {
        snprintf(up[k], sizeof(up[k]), "net: peer %d up (%s, TLS)", 4 + k,
                 peer[k]);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(c.pid[i], first[i]);
        cr_assert(alive(i), "node %d exited", i + 1);
        for (int k = 0; k < 2; k++) {
            cr_assert(ml_wait_log(&c, i + 1, up[k], 10000),
                      "node %d never dialled node %d at %s", i + 1, 4 + k,
                      peer[k]);
        }
    }
    cr_assert(
        ml_log_has(&c, 1, "members not at their file addresses: node 4 at"),
        "node 1 did not say the membership differs from its file");

    /* 5 -> 3: nodes 1 and 2 leave (the leader among them hands over
     * first), then die. */
    for (int id = 1; id <= 2; id++) {
        rc = ml_cli(out, sizeof(out), "--config %s member remove %d", c.conf,
                    id);
        cr_assert_eq(rc, 0, "member remove %d: %s", id, out);
        cr_assert_str_eq(out, "removed\n");
        ml_wait_voter(op, (unsigned)id, 0);
    }
    cr_assert_eq(ml_count_voters(op), 3);
    uint64_t during = ld[0].acked + ld[1].acked - acked0;
    tc_signal(&c, 0, SIGKILL);
    tc_signal(&c, 1, SIGKILL);
    wait_progress(ld, 40);
    /* A client that knows only the file's addresses (two of them dead). */
    rc = tc_run(out, sizeof(out), "%s --cluster %s alloc b --tag fresh 2>&1",
                tc_bin("idalloc"), file_addrs);
    cr_assert_eq(rc, 0, "%s", out);
    /* Node 3 names the new members' client addresses to clients. */
    rc = tc_run(out, sizeof(out), "%s --cluster %s status 2>&1",
                tc_bin("idalloc"), c.cfg.nodes[2].client.text);
    cr_assert(strstr(out, client[0]) != NULL && strstr(out, client[1]) != NULL,
              "status through node 3 does not name 4 and 5: %s", out);
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
    }
    cr_assert_gt(during, 50, "too little load during the changes (%llu)",
                 (unsigned long long)during);
    ml_check_acked(op, ld, 2, during);
    for (int i = 0; i < 2; i++) {
        idalloc_client_free(ld[i].cl);
    }
    idalloc_client_free(op);

    /* Every node that is left restarts: 4 and 5 are only in the
     * membership, which their logs hold with its addresses. */
    for (int i = 2; i < 5; i++) {
        cr_assert_eq(tc_signal(&c, i, SIGTERM), 0, "node %d exit", i + 1);
    }
    for (int i = 2; i < 5; i++) {
        tc_spawn(&c, i);
    }
    op = ml_client_of(file_addrs); /* only node 3 answers there */
    for (int k = 0; k < 2; k++) {
        ml_wait_member_at(op, (unsigned)(4 + k), peer[k], client[k]);
    }
    cr_assert_eq(ml_count_voters(op), 3);
    uint64_t id;
    cr_assert_eq(
        idalloc_alloc(op, "b", "after-restart", &id, NULL, tc_detail()), 0,
        "%s", tc_errmsg());
    cr_assert(ml_log_has(&c, 4, "--join is not needed (ignored)"));
    idalloc_client_free(op);
}

Test(join, a_member_moves_to_new_addresses, .fini = teardown, .timeout = 300)
{
    tc_start(&c, 3, NULL);
    n_taken = 0;
    int lead = tc_wait_leader(&c, 30000);
    cr_assert_geq(lead, 0, "no leader");
    struct idalloc_client *op = ml_client_of(c.addrs);
    ml_pools(op);
    static struct ml_load ld[2];
    atomic_int stop = 0;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ml_load_start(&ld[i], i, &stop, ml_client_of(c.addrs), &th[i]);
    }
    tc_sleep_ms(500);
    uint64_t acked0 = ld[0].acked + ld[1].acked;

    /* A follower stops and comes back with its data directory on new
     * addresses: it says the membership names it elsewhere. */
    int f = (lead + 1) % 3, id = f + 1;
    char peer[32], client[32], out[8192], old_peer[64];
    snprintf(old_peer, sizeof(old_peer), "%s", c.cfg.nodes[f].peer.text);
    new_addr(peer, sizeof(peer));
    new_addr(client, sizeof(client));
    cr_assert_eq(tc_signal(&c, f, SIGTERM), 0);
    snprintf(c.node_args[f], sizeof(c.node_args[0]), "--peer %s --client %s",
             peer, client);
    tc_spawn(&c, f);
    char says[160];
    snprintf(says, sizeof(says),
             "membership in effect names this node (%d) at peer %s", id,
             old_peer);
    cr_assert(ml_wait_log(&c, id, says, 30000), "node %d did not say so", id);
    /* It tells the others where it is; they say what to run. */
    char hint[160];
    snprintf(hint, sizeof(hint), "run idalloc member update %d %s %s", id, peer,
             client);
    for (int i = 0; i < 3; i++) {
        if (i != f) {
            cr_assert(ml_wait_log(&c, i + 1, hint, 30000), "node %d", i + 1);
        }
    }
    wait_progress(ld, 20); /* the two others serve meanwhile */
    /* An update elsewhere than it says it listens is refused. */
    char typo[32];
    new_addr(typo, sizeof(typo));
    int rc = ml_cli(out, sizeof(out), "--config %s member update %d %s %s",
                    c.conf, id, typo, client);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "says it listens on") != NULL, "%s", out);

    rc = ml_cli(out, sizeof(out), "--config %s member update %d %s %s", c.conf,
                id, peer, client);
    cr_assert_eq(rc, 0, "member update: %s", out);
    cr_assert_str_eq(out, "updated\n");
    ml_wait_member_at(op, (unsigned)id, peer, client);
    char moved[160], up[96];
    snprintf(moved, sizeof(moved), "net: node %d moved from %s to %s", id,
             old_peer, peer);
    snprintf(up, sizeof(up), "net: peer %d up (%s, TLS)", id, peer);
    for (int i = 0; i < 3; i++) {
        if (i != f) {
            cr_assert(ml_wait_log(&c, i + 1, moved, 10000), "node %d", i + 1);
            cr_assert(ml_wait_log(&c, i + 1, up, 10000), "node %d", i + 1);
        }
    }
    rc = ml_cli(out, sizeof(out), "--config %s member update %d %s %s", c.conf,
                id, peer, client);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out, "already at these addresses\n");

    /* It catches up at its new address, and can lead. */
    snprintf(c.addrs, sizeof(c.addrs), "%s", "");
    for (int i = 0; i < 3; i++) {
        strcat(c.addrs, i > 0 ? "," : "");
        strcat(c.addrs, i == f ? client : c.cfg.nodes[i].client.text);
    }
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 30000),
              "node %d did not catch up", id);
    rc = ml_cli(out, sizeof(out), "--cluster %s leader transfer --to %d",
                c.addrs, id);
    cr_assert_eq(rc, 0, "leader transfer: %s", out);
    char led[32];
    snprintf(led, sizeof(led), "leader=%d\n", id);
    cr_assert_str_eq(out, led);
    wait_progress(ld, 20);
    uint64_t during = ld[0].acked + ld[1].acked - acked0;
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
    }
    ml_check_acked(op, ld, 2, during);
    for (int i = 0; i < 2; i++) {
        idalloc_client_free(ld[i].cl);
    }
    idalloc_client_free(op);
}

/* README, Runbook, "Replace a dead node with a new id": node 2 dies with
 * its machine; the operator removes it, starts node 4 elsewhere with
 * --join and adds it; the cluster is back to three voters. */
Test(join,
     a_dead_node_is_replaced_by_a_new_id,
     .fini = teardown,
     .timeout = 300)
{
    tc_setup(&c, 3, NULL);
    snprintf(file_addrs, sizeof(file_addrs), "%s", c.addrs);
    c.n = 4;
    n_taken = 0;
    for (int i = 0; i < 3; i++) {
        tc_spawn(&c, i);
    }
    cr_assert_geq(tc_wait_leader(&c, 30000), 0, "no leader");
    struct idalloc_client *op = ml_client_of(file_addrs);
    uint64_t before;
    cr_assert_eq(idalloc_pool_create(op, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_reserve(op, "s", 100, &before, tc_detail()), 0, "%s",
                 tc_errmsg());
    tc_signal(&c, 1, SIGKILL);
    char out[4096], peer[32], client[32];
    int rc = ml_cli(out, sizeof(out), "--config %s member remove 2", c.conf);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out, "removed\n");
    start_new_node(4, peer, client);
    cr_assert(ml_wait_log(&c, 4, "waiting to be added", 30000));
    ml_wait_heard(op, 4);
    rc = ml_cli(out, sizeof(out), "--config %s member add 4 %s %s", c.conf,
                peer, client);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out, "added\n");
    ml_wait_voter(op, 4, 1);
    cr_assert_eq(ml_count_voters(op), 3);
    rc = ml_cli(out, sizeof(out), "--config %s member list", c.conf);
    cr_assert(strstr(out, "id=4 role=voter incarnation=") != NULL, "%s", out);
    const char *two = strstr(out, "id=2 ");
    cr_assert(two == NULL || strncmp(two, "id=2 role=waiting", 17) == 0,
              "node 2 is still a member: %s", out);
    /* Node 1 or 3 may die now: the two others are a majority. */
    struct idalloc_member_list ml;
    cr_assert_eq(idalloc_member_list(op, &ml, tc_detail()), 0);
    int victim = ml.leader_id == 1 ? 2 : 0; /* index: node 3 or node 1 */
    tc_signal(&c, victim, SIGKILL);
    uint64_t after;
    int rv = -1;
    for (uint64_t end = tc_now_ms() + 30000; rv != 0 && tc_now_ms() < end;) {
        rv = idalloc_reserve(op, "s", 100, &after, tc_detail());
    }
    cr_assert_eq(rv, 0, "%s", tc_errmsg());
    cr_assert_geq(after, before + 100, "blocks overlap");
    idalloc_client_free(op);
}

/* The incarnation of member @id in the leader's list (0: not a member). */
static uint64_t incarnation_of(struct idalloc_client *cl, unsigned id)
{
    struct idalloc_member_list l;
    if (idalloc_member_list(cl, &l, tc_detail()) != 0) {
        return 0;
    }
    for (size_t i = 0; i < l.n; i++) {
        if (l.members[i].id == id && !l.members[i].waiting) {
            return l.members[i].incarnation;
        }
    }
    return 0;
}

/* A node that is in no cluster file loses its disk and comes back with the
 * same command line: with auto_rejoin on the leader re-admits the new
 * incarnation (remove, add as a learner at the addresses it announces,
 * promote), as for a node of the file. */
Test(join,
     a_joined_node_with_a_new_disk_is_readmitted,
     .fini = teardown,
     .timeout = 300)
{
    tc_setup(&c, 3, NULL);
    snprintf(file_addrs, sizeof(file_addrs), "%s", c.addrs);
    c.n = 4;
    n_taken = 0;
    for (int i = 0; i < 3; i++) {
        tc_spawn(&c, i);
    }
    cr_assert_geq(tc_wait_leader(&c, 30000), 0, "no leader");
    struct idalloc_client *op = ml_client_of(file_addrs);
    char peer[32], client[32];
    start_new_node(4, peer, client);
    ml_wait_heard(op, 4);
    ml_change(op, IDALLOC_MEMBER_ADD, 4, peer, client);
    ml_wait_voter(op, 4, 1);
    uint64_t old = incarnation_of(op, 4);
    cr_assert_neq(old, 0);
    tc_signal(&c, 3, SIGKILL);
    char out[512];
    cr_assert_eq(tc_run(out, sizeof(out), "rm -rf %s/data/node4", c.dir), 0);
    tc_spawn(&c, 3);
    uint64_t now = old;
    for (uint64_t end = tc_now_ms() + 60000;
         tc_now_ms() < end &&
         (now == old || now == 0 || ml_is_voter(op, 4) != 1);) {
        tc_sleep_ms(200);
        now = incarnation_of(op, 4);
    }
    cr_assert(now != old && now != 0 && ml_is_voter(op, 4) == 1,
              "node 4 was not re-admitted as a new incarnation");
    ml_wait_member_at(op, 4, peer, client);
    uint64_t first;
    cr_assert_eq(idalloc_pool_create(op, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_reserve(op, "s", 10, &first, tc_detail()), 0, "%s",
                 tc_errmsg());
    idalloc_client_free(op);
}

/* --- bad input -------------------------------------------------------- */

/* Send one MemberChange straight to @addr (no client library: the node's
 * own checks); its answer's error code, or -1. */
static int forged_change(const char *addr,
                         Idalloc__MemberChange__Op op,
                         unsigned id,
                         const char *peer,
                         const char *client)
{
    Idalloc__ClientRequest r = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__MemberChange mc = IDALLOC__MEMBER_CHANGE__INIT;
    uint8_t cid[16] = {7, 7, 7};
    r.client_id.data = cid;
    r.client_id.len = sizeof(cid);
    r.request_seq = 1;
    mc.op = op;
    mc.id = id;
    mc.peer_addr = (char *)peer;
    mc.client_addr = (char *)client;
    r.op_case = IDALLOC__CLIENT_REQUEST__OP_MEMBER_CHANGE;
    r.member_change = &mc;
    size_t len;
    uint8_t *frame = forge_client_frame(&r, &len);
    int fd = forge_connect(addr);
    int err = -1;
    uint8_t hdr[IDA_FRAME_HEADER_BYTES], body[4096];
    if (fd >= 0 && forge_send(fd, frame, len) == 0 &&
        recv(fd, hdr, sizeof(hdr), MSG_WAITALL) == (ssize_t)sizeof(hdr)) {
        uint32_t n = (uint32_t)hdr[2] << 24 | (uint32_t)hdr[3] << 16 |
                     (uint32_t)hdr[4] << 8 | hdr[5];
        if (n <= sizeof(body) && recv(fd, body, n, MSG_WAITALL) == (ssize_t)n) {
            Idalloc__ClientResponse *a =
                idalloc__client_response__unpack(NULL, n, body);
            if (a != NULL && a->result != NULL) {
                err = (int)a->result->error;
            }
            idalloc__client_response__free_unpacked(a, NULL);
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    free(frame);
    return err;
}

/* `member list` without its fields that move on their own (a member's
 * match index, whether its link is up): the membership alone. */
static void member_list(char *out, size_t cap)
{
    cr_assert_eq(ml_cli(out, cap, "--config %s member list", c.conf), 0, "%s",
                 out);
    static const char *const moving[] = {" match=", " connected="};
    for (size_t k = 0; k < sizeof(moving) / sizeof(moving[0]); k++) {
        for (char *p; (p = strstr(out, moving[k])) != NULL;) {
            size_t n = strcspn(p + 1, " \n") + 1; /* the field, its space */
            memmove(p, p + n, strlen(p + n) + 1);
        }
    }
}

Test(join,
     bad_addresses_are_refused_and_change_nothing,
     .fini = teardown,
     .timeout = 200)
{
    tc_start(&c, 3, NULL);
    n_taken = 0;
    int lead = tc_wait_leader(&c, 30000);
    cr_assert_geq(lead, 0, "no leader");
    char before[4096], after[4096], out[4096], a[32], b[32];
    member_list(before, sizeof(before));
    uint64_t commit = tc_commit_index(&c);
    new_addr(a, sizeof(a));
    new_addr(b, sizeof(b));
    const char *p2 = c.cfg.nodes[1].peer.text;
    const char *c1 = c.cfg.nodes[0].client.text;
    const char *c3 = c.cfg.nodes[2].client.text;
    struct
    {
        char args[256];
        int exit;
        const char *says;
    } cases[] = {
        {"member add 4 127.0.0.1 127.0.0.1:5", 2, "bad peer address"},
        {"member add 4 0.0.0.0:5000 127.0.0.1:5001", 2,
         "not an address other nodes can dial"},
        {"member add 4 127.0.0.1:5000 [::]:5001", 2,
         "not an address other nodes can dial"},
        {"member add 4 127.0.0.1:5000 127.0.0.1:5000", 2, "are the same"},
        {"member update 2 127.0.0.1:5000", 2, "expected 3 arguments"},
        {"member promote 2 127.0.0.1:5000 127.0.0.1:5001", 2,
         "expected 1 argument"},
        {"", 1, "is used by member 2"},
        {"", 1, "is used by member 3"},
        {"", 1, "is used by member 1"},
        {"", 1, "is not a member"},
        {"", 1, "has not been heard from"},
        {"member add 4", 1, "is not in the cluster file: give its addresses"},
        {"", 1, "to move it: idalloc member update 2"},
    };
    snprintf(cases[6].args, sizeof(cases[6].args), "member add 4 %s %s", p2, a);
    snprintf(cases[7].args, sizeof(cases[7].args), "member add 4 %s %s", a, c3);
    snprintf(cases[8].args, sizeof(cases[8].args), "member update 2 %s %s", c1,
             a);
    snprintf(cases[9].args, sizeof(cases[9].args), "member update 9 %s %s", a,
             b);
    snprintf(cases[10].args, sizeof(cases[10].args), "member add 4 %s %s", a,
             b);
    snprintf(cases[12].args, sizeof(cases[12].args), "member add 2 %s %s", a,
             b);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc =
            ml_cli(out, sizeof(out), "--config %s %s", c.conf, cases[i].args);
        cr_assert_eq(rc, cases[i].exit, "`%s`: exit %d: %s", cases[i].args, rc,
                     out);
        cr_assert(strstr(out, cases[i].says) != NULL, "`%s`: %s", cases[i].args,
                  out);
        cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1,
                     "`%s`: one line: %s", cases[i].args, out);
    }
    /* The node's own checks, for requests that did not come through the
     * client library. */
    const char *at = c.cfg.nodes[lead].client.text;
    cr_assert_eq(
        forged_change(at, IDALLOC__MEMBER_CHANGE__OP__ADD, 4, "127.0.0.1", b),
        IDA_EINVAL);
    cr_assert_eq(forged_change(at, IDALLOC__MEMBER_CHANGE__OP__ADD, 4,
                               "0.0.0.0:5000", b),
                 IDA_EINVAL);
    cr_assert_eq(forged_change(at, IDALLOC__MEMBER_CHANGE__OP__ADD, 4, a, a),
                 IDA_EINVAL);
    cr_assert_eq(forged_change(at, IDALLOC__MEMBER_CHANGE__OP__ADD, 4, a, ""),
                 IDA_EINVAL, "one address alone");
    cr_assert_eq(
        forged_change(at, IDALLOC__MEMBER_CHANGE__OP__UPDATE, 2, "", ""),
        IDA_EINVAL, "update without addresses");
    cr_assert_eq(forged_change(at, IDALLOC__MEMBER_CHANGE__OP__REMOVE, 2, a, b),
                 IDA_EINVAL, "remove takes no addresses");
    cr_assert_eq(
        forged_change(at, IDALLOC__MEMBER_CHANGE__OP__ADD, 70000, a, b),
        IDA_EINVAL, "node id past 65535");
    member_list(after, sizeof(after));
    cr_assert_str_eq(before, after, "the membership changed: %s then %s",
                     before, after);
    cr_assert_eq(tc_commit_index(&c), commit, "something was proposed");

    /* idallocd: addresses it cannot use stop it before it touches a data
     * directory (exit 2). */
    struct
    {
        char args[256];
        const char *says;
    } starts[] = {
        {"--node 4", "no node 4 in cluster test: give its addresses"},
        {"", "is node 2's in the cluster file"},
        {"", "is not an address other nodes can dial"},
        {"", "--peer and --client go together"},
        {"", "bad --join address"},
        {"", "is node 2's in the cluster file"},
        {"", "is also this node's client address"},
    };
    snprintf(starts[1].args, sizeof(starts[1].args),
             "--node 4 --peer %s --client %s", p2, b);
    snprintf(starts[2].args, sizeof(starts[2].args),
             "--node 4 --peer 0.0.0.0:%u --client %s", taken[0], b);
    snprintf(starts[3].args, sizeof(starts[3].args), "--node 4 --peer %s", a);
    snprintf(starts[4].args, sizeof(starts[4].args),
             "--node 4 --peer %s --client %s --join %s,nowhere:1", a, b, c1);
    /* --metrics too: another node's address, or one of its own two. */
    snprintf(starts[5].args, sizeof(starts[5].args),
             "--node 4 --peer %s --client %s --metrics %s", a, b, p2);
    snprintf(starts[6].args, sizeof(starts[6].args),
             "--node 4 --peer %s --client %s --metrics %s", a, b, b);
    for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
        int rc = tc_run(out, sizeof(out), "timeout 10 %s --config %s %s 2>&1",
                        tc_bin("idallocd"), c.conf, starts[i].args);
        cr_assert_eq(rc, 2, "`%s`: exit %d: %s", starts[i].args, rc, out);
        cr_assert(strstr(out, starts[i].says) != NULL, "`%s`: %s",
                  starts[i].args, out);
    }
    char data4[400];
    snprintf(data4, sizeof(data4), "%s/data/node4", c.dir);
    cr_assert_neq(access(data4, F_OK), 0, "a data directory was made");
}
