/* Membership commands end to end with real idallocd processes (README,
 * "Runbook"): member list, remove and re-add a follower (promoted
 * automatically), leader transfer; with auto_rejoin off, a wiped node is
 * listed as waiting and re-admitted by the operator's remove, add and
 * promote through the CLI, and acknowledged allocations survive.
 *
 * Every wait polls with a generous deadline (a loaded 2-core machine). */
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

/* The member list, retried until it answers (up to @ms). */
static int list_members(struct idalloc_client *cl,
                        struct idalloc_member_list *l,
                        unsigned ms)
{
    int rv = -1;
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        rv = idalloc_member_list(cl, l, tc_detail());
        if (rv == 0) {
            return 0;
        }
        tc_sleep_ms(100);
    }
    return rv;
}

static const struct idalloc_member *find(const struct idalloc_member_list *l,
                                         unsigned id,
                                         int waiting)
{
    for (size_t i = 0; i < l->n; i++) {
        if (l->members[i].id == id && l->members[i].waiting == waiting) {
            return &l->members[i];
        }
    }
    return NULL;
}

static size_t count_voters(const struct idalloc_member_list *l)
{
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        k += l->members[i].voter && !l->members[i].waiting;
    }
    return k;
}

/* Wait until node @id (1-based) is a voter (@voter) or not, up to @ms. */
static int wait_voter(struct idalloc_client *cl,
                      unsigned id,
                      int voter,
                      unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (idalloc_member_list(cl, &l, tc_detail()) == 0) {
            const struct idalloc_member *m = find(&l, id, 0);
            if ((m != NULL && m->voter) == voter) {
                return 1;
            }
        }
        tc_sleep_ms(200);
    }
    return 0;
}

/* The leader's index (0-based) from the member list, -1 if unknown. */
static int leader_of(struct idalloc_client *cl)
{
    struct idalloc_member_list l;
    if (list_members(cl, &l, 10000) != 0 || l.leader_id == 0) {
        return -1;
    }
    return (int)l.leader_id - 1;
}

Test(member, list_remove_readd_transfer, .fini = teardown, .timeout = 180)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader");
    struct idalloc_client *cl = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    uint64_t a;
    cr_assert_eq(idalloc_alloc(cl, "b", "a", &a, NULL, tc_detail()), 0);

    /* Three voters, each bound to its data directory's incarnation. */
    struct idalloc_member_list l;
    cr_assert_eq(list_members(cl, &l, 10000), 0, "%s", tc_errmsg());
    cr_assert_eq(count_voters(&l), 3);
    for (unsigned id = 1; id <= 3; id++) {
        const struct idalloc_member *m = find(&l, id, 0);
        cr_assert(m != NULL && m->voter, "node %u is not a voter", id);
        cr_assert_neq(m->incarnation, 0, "node %u is unbound", id);
        cr_assert_str_eq(m->client_addr, c.cfg.nodes[id - 1].client.text);
    }
    int lead = leader_of(cl);
    cr_assert_geq(lead, 0);
    int f = (lead + 1) % 3; /* removed and re-added */
    int g = (lead + 2) % 3; /* killed once f is back */
    uint64_t f_inc = find(&l, (unsigned)f + 1, 0)->incarnation; /* above */

    /* Remove a follower: two voters; writes still work. */
    int changed = 0;
    int rv = idalloc_member_change(cl, IDALLOC_MEMBER_REMOVE, (unsigned)f + 1,
                                   &changed, tc_detail());
    cr_assert_eq(rv, 0, "remove: %s", tc_errmsg());
    cr_assert_eq(changed, 1);
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    cr_assert_eq(count_voters(&l), 2);
    cr_assert_null(find(&l, (unsigned)f + 1, 0));
    /* Removing it again changes nothing. */
    cr_assert_eq(idalloc_member_change(cl, IDALLOC_MEMBER_REMOVE,
                                       (unsigned)f + 1, &changed, tc_detail()),
                 0);
    cr_assert_eq(changed, 0);
    uint64_t b;
    cr_assert_eq(idalloc_alloc(cl, "b", "b", &b, NULL, tc_detail()), 0, "%s",
                 tc_errmsg());
    /* Not re-admitted on its own (it keeps its incarnation). */
    tc_sleep_ms(1500);
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    cr_assert_eq(count_voters(&l), 2, "the removed node came back by itself");
    /* A node that is not a member: nothing to remove (a repeated remove
     * answers the same). */
    changed = -1;
    cr_assert_eq(idalloc_member_change(cl, IDALLOC_MEMBER_REMOVE, 9, &changed,
                                       tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(changed, 0);
    cr_assert_eq(idalloc_member_change(cl, IDALLOC_MEMBER_PROMOTE,
                                       (unsigned)f + 1, NULL, tc_detail()),
                 IDA_EREFUSED, "promoting a non-learner");

    /* Re-add it: a learner with its incarnation, promoted once caught up
     * (auto_rejoin on by default). */
    rv = idalloc_member_change(cl, IDALLOC_MEMBER_ADD, (unsigned)f + 1,
                               &changed, tc_detail());
    cr_assert_eq(rv, 0, "add: %s", tc_errmsg());
    cr_assert_eq(changed, 1);
    cr_assert(wait_voter(cl, (unsigned)f + 1, 1, 30000),
              "the re-added node was not promoted");
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    cr_assert_eq(count_voters(&l), 3);
    const struct idalloc_member *fm = find(&l, (unsigned)f + 1, 0);
    cr_assert(fm != NULL);
    cr_assert_eq(fm->incarnation, f_inc);

    /* It counts again: writes work with g down. */
    tc_signal(&c, g, SIGKILL);
    uint64_t d;
    rv = idalloc_alloc(cl, "b", "d", &d, NULL, tc_detail());
    cr_assert_eq(rv, 0, "the re-added node does not count: %s", tc_errmsg());
    cr_assert(d != a && d != b);
    tc_spawn(&c, g);

    /* Leader transfer moves leadership to the node asked for. */
    lead = leader_of(cl);
    cr_assert_geq(lead, 0);
    int to = (lead + 1) % 3;
    unsigned got = 0;
    rv = -1;
    for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && rv != 0;) {
        /* Refused while the target has not caught up after its restart. */
        rv = idalloc_leader_transfer(cl, (unsigned)to + 1, &got, tc_detail());
        if (rv != 0) {
            tc_sleep_ms(500);
        }
    }
    cr_assert_eq(rv, 0, "transfer: %s", tc_errmsg());
    int moved = got == (unsigned)to + 1; /* the old leader saw it */
    for (uint64_t end = tc_now_ms() + 20000; tc_now_ms() < end && !moved;) {
        moved = tc_wait_leader(&c, 2000) == to;
    }
    cr_assert(moved, "leadership did not move to node %d", to + 1);
    cr_assert_eq(idalloc_lookup(cl, "b", "a", &d, tc_detail()), 0);
    cr_assert_eq(d, a);
    idalloc_client_free(cl);
}

Test(member, remove_the_leader, .fini = teardown, .timeout = 120)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader");
    struct idalloc_client *cl = tc_client(&c, 15000);
    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    int lead = leader_of(cl);
    cr_assert_geq(lead, 0);
    /* Handed over first, then removed by the new leader. */
    int rv = idalloc_member_change(cl, IDALLOC_MEMBER_REMOVE,
                                   (unsigned)lead + 1, NULL, tc_detail());
    cr_assert_eq(rv, 0, "remove the leader: %s", tc_errmsg());
    struct idalloc_member_list l;
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    cr_assert_eq(count_voters(&l), 2);
    cr_assert_null(find(&l, (unsigned)lead + 1, 0));
    cr_assert_neq(l.leader_id, (unsigned)lead + 1);
    uint64_t first;
    cr_assert_eq(idalloc_reserve(cl, "s", 10, &first, tc_detail()), 0, "%s",
                 tc_errmsg());
    idalloc_client_free(cl);
}

/* The CLI's member list output has a line for @id with @role. */
static int cli_lists(const char *role, int id, char *out, size_t cap)
{
    int rc = tc_run(out, cap, "%s --config %s --timeout 5000 member list",
                    tc_bin("idalloc"), c.conf);
    char needle[64];
    snprintf(needle, sizeof(needle), "id=%d role=%s ", id, role);
    return rc == 0 && strstr(out, needle) != NULL;
}

Test(member, wiped_node_readmitted_by_hand, .fini = teardown, .timeout = 180)
{
    tc_start(&c, 3, "auto_rejoin off\n");
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader");
    struct idalloc_client *cl = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                     tc_detail()),
                 0);
    uint64_t ids[5];
    char tag[16];
    for (int i = 0; i < 5; i++) {
        snprintf(tag, sizeof(tag), "t%d", i);
        cr_assert_eq(idalloc_alloc(cl, "b", tag, &ids[i], NULL, tc_detail()),
                     0);
    }
    int lead = leader_of(cl);
    cr_assert_geq(lead, 0);
    int w = (lead + 1) % 3; /* wiped */
    int o = (lead + 2) % 3; /* killed at the end */
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 20000));

    /* w's disk dies: it comes back empty, a new incarnation. */
    tc_signal(&c, w, SIGKILL);
    char out[4096];
    cr_assert_eq(
        tc_run(out, sizeof(out), "rm -rf %s/data/node%d", c.dir, w + 1), 0);
    tc_spawn(&c, w);

    /* Listed as waiting; with auto_rejoin off nobody re-admits it. */
    int waiting = 0;
    for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && !waiting;) {
        waiting = cli_lists("waiting", w + 1, out, sizeof(out));
        if (!waiting) {
            tc_sleep_ms(300);
        }
    }
    cr_assert(waiting, "the wiped node is not listed as waiting:\n%s", out);
    tc_sleep_ms(1500);
    cr_assert(cli_lists("waiting", w + 1, out, sizeof(out)),
              "re-admitted with auto_rejoin off:\n%s", out);
    struct idalloc_member_list l;
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    const struct idalloc_member *nw = find(&l, (unsigned)w + 1, 1);
    const struct idalloc_member *old = find(&l, (unsigned)w + 1, 0);
    cr_assert(nw != NULL && old != NULL, "node %d: no waiting line", w + 1);
    uint64_t new_inc = nw->incarnation;
    cr_assert_neq(new_inc, old->incarnation);
    cr_assert(old->voter, "the old incarnation is still a voter");

    /* Adding it while the old incarnation is a member is refused. */
    int rc = tc_run(out, sizeof(out), "%s --config %s member add %d 2>&1",
                    tc_bin("idalloc"), c.conf, w + 1);
    cr_assert_eq(rc, 1, "member add over the old incarnation: %d %s", rc, out);

    /* The operator: remove the old incarnation, add the new, promote. */
    rc = tc_run(out, sizeof(out), "%s --config %s member remove %d 2>&1",
                tc_bin("idalloc"), c.conf, w + 1);
    cr_assert_eq(rc, 0, "member remove: %s", out);
    cr_assert(strstr(out, "removed") != NULL, "%s", out);
    rc = tc_run(out, sizeof(out), "%s --config %s member add %d 2>&1",
                tc_bin("idalloc"), c.conf, w + 1);
    cr_assert_eq(rc, 0, "member add: %s", out);
    cr_assert(strstr(out, "added") != NULL, "%s", out);
    rc = -1;
    for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && rc != 0;) {
        /* exit 1 while it catches up */
        rc = tc_run(out, sizeof(out), "%s --config %s member promote %d 2>&1",
                    tc_bin("idalloc"), c.conf, w + 1);
        cr_assert(rc == 0 || rc == 1 || rc == 3, "promote: %d %s", rc, out);
        if (rc != 0) {
            tc_sleep_ms(300);
        }
    }
    cr_assert_eq(rc, 0, "member promote: %s", out);
    cr_assert(cli_lists("voter", w + 1, out, sizeof(out)), "%s", out);
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    old = find(&l, (unsigned)w + 1, 0);
    cr_assert(old != NULL && old->voter);
    cr_assert_eq(old->incarnation, new_inc);
    cr_assert_null(find(&l, (unsigned)w + 1, 1), "still waiting");

    /* w counts: with o gone the cluster still serves, and every
     * acknowledged allocation kept its id. */
    tc_signal(&c, o, SIGKILL);
    for (int i = 0; i < 5; i++) {
        snprintf(tag, sizeof(tag), "t%d", i);
        uint64_t got;
        int rv = idalloc_lookup(cl, "b", tag, &got, tc_detail());
        cr_assert_eq(rv, 0, "lookup %s: %s", tag, tc_errmsg());
        cr_assert_eq(got, ids[i]);
    }
    uint64_t nid;
    cr_assert_eq(idalloc_alloc(cl, "b", "after", &nid, NULL, tc_detail()), 0,
                 "%s", tc_errmsg());
    for (int i = 0; i < 5; i++) {
        cr_assert_neq(nid, ids[i]);
    }
    idalloc_client_free(cl);
}

/* An operator's removal is part of the membership (src/node/member.h): a
 * removed node is not re-admitted by a leader that was restarted since
 * (auto_rejoin on), whatever data directory it comes back with, until the
 * operator adds it back. */
Test(member,
     removal_survives_a_restart_of_the_others,
     .fini = teardown,
     .timeout = 180)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader");
    struct idalloc_client *cl = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    uint64_t a;
    cr_assert_eq(idalloc_alloc(cl, "b", "a", &a, NULL, tc_detail()), 0);
    int lead = leader_of(cl);
    cr_assert_geq(lead, 0);
    int f = (lead + 1) % 3; /* removed; keeps running */
    int g = (lead + 2) % 3;
    int changed = 0;
    cr_assert_eq(idalloc_member_change(cl, IDALLOC_MEMBER_REMOVE,
                                       (unsigned)f + 1, &changed, tc_detail()),
                 0, "remove: %s", tc_errmsg());
    cr_assert_eq(changed, 1); /* committed: durable on both voters left */

    /* Both members restart: neither remembers anything of the removal but
     * what their data directories hold. The removed node's disk is replaced
     * meanwhile: it comes back as a new incarnation, learns the membership
     * from the leader and asks to be let in, as a replaced disk does (which
     * a leader re-admits by itself, auto_rejoin on). */
    tc_signal(&c, lead, SIGKILL);
    tc_signal(&c, g, SIGKILL);
    tc_signal(&c, f, SIGKILL);
    char out[4096];
    cr_assert_eq(
        tc_run(out, sizeof(out), "rm -rf %s/data/node%d", c.dir, f + 1), 0);
    tc_spawn(&c, lead);
    tc_spawn(&c, g);
    tc_spawn(&c, f);
    idalloc_client_free(cl);
    cl = tc_client(&c, 10000);

    /* The new leader hears the removed node (listed as waiting) and does
     * not re-admit it. */
    int waiting = 0;
    for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && !waiting;) {
        waiting = cli_lists("waiting", f + 1, out, sizeof(out));
        if (!waiting) {
            tc_sleep_ms(300);
        }
    }
    cr_assert(waiting, "the removed node is not listed as waiting:\n%s", out);
    tc_sleep_ms(3000);
    struct idalloc_member_list l;
    cr_assert_eq(list_members(cl, &l, 10000), 0);
    cr_assert_eq(count_voters(&l), 2, "the removed node came back by itself");
    cr_assert_null(find(&l, (unsigned)f + 1, 0),
                   "the removed node is a member again");
    uint64_t got;
    cr_assert_eq(idalloc_lookup(cl, "b", "a", &got, tc_detail()), 0, "%s",
                 tc_errmsg());
    cr_assert_eq(got, a);

    /* The operator adds it back: the record goes, it is promoted (auto). */
    cr_assert_eq(idalloc_member_change(cl, IDALLOC_MEMBER_ADD, (unsigned)f + 1,
                                       &changed, tc_detail()),
                 0, "add: %s", tc_errmsg());
    cr_assert_eq(changed, 1);
    cr_assert(wait_voter(cl, (unsigned)f + 1, 1, 30000),
              "the node added back was not promoted");
    idalloc_client_free(cl);
}
