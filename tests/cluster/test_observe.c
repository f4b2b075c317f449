/* What an operator sees: `log_level debug` traces one request from receipt
 * to answer and one election; `status --verbose` shows the errors clients
 * were answered. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/harness.h"

/* --- fixture ------------------------------------------------------------- */

static struct tc c;
static struct idalloc_client *cl;
static char out[65536];

static void teardown(void)
{
    if (cl != NULL) {
        idalloc_client_free(cl);
        cl = NULL;
    }
    tc_destroy(&c);
}

/* --- helpers ------------------------------------------------------------- */

/* Whether node @i's log holds @needle, polled for up to @ms. */
static int log_has(int i, const char *needle, unsigned ms)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/node%d.log", c.dir, i + 1);
    static char buf[1 << 20];
    for (uint64_t end = tc_now_ms() + ms;;) {
        buf[0] = '\0';
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            buf[n] = '\0';
            fclose(f);
        }
        if (strstr(buf, needle) != NULL) {
            return 1;
        }
        if (tc_now_ms() >= end) {
            return 0;
        }
        tc_sleep_ms(100);
    }
}

/* --- tests --------------------------------------------------------------- */

Test(observe,
     debug_traces_a_request_and_an_election,
     .fini = teardown,
     .timeout = 120)
{
    tc_start(&c, 3, "log_level debug\n");
    int leader = tc_wait_leader(&c, 20000);
    cr_assert_geq(leader, 0, "no leader elected");
    cr_assert(log_has(leader, "raft: election started", 5000));
    cr_assert(log_has(leader, "raft: became leader", 5000));
    int voted = 0;
    for (int i = 0; i < 3; i++) {
        voted |= i != leader && log_has(i, "raft: granted vote to node", 0);
    }
    cr_assert(voted, "no follower logged the vote it granted");
    cr_assert(log_has(leader, "our vote request", 5000));

    cl = tc_client(&c, 20000);
    cr_assert_eq(idalloc_pool_create(cl, "p", IDALLOC_POOL_BOUNDED, 10, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(cl, "p", "t", &id, NULL, &call), 0);
    const uint8_t *cid = call.client_id;
    char name[64], want[128];
    snprintf(name, sizeof(name), "req %02x%02x%02x%02x/%llu:", cid[0], cid[1],
             cid[2], cid[3], (unsigned long long)call.seq);
    const char *steps[] = {"received", "proposed in entry", "applied at entry"};
    for (int k = 0; k < 3; k++) {
        snprintf(want, sizeof(want), "%s %s", name, steps[k]);
        cr_assert(log_has(leader, want, 5000), "leader's log lacks \"%s\"",
                  want);
    }
    cr_assert(log_has(leader, "committed", 5000));
    cr_assert(log_has(leader, "answered ok", 5000));
}

Test(observe, status_verbose_shows_the_errors, .fini = teardown, .timeout = 120)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader elected");
    cl = tc_client(&c, 20000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 10, NULL,
                                     tc_detail()),
                 0);
    uint64_t v;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(idalloc_alloc(cl, "nosuch", "t", &v, NULL, tc_detail()),
                     IDA_ENOPOOL);
        cr_assert_eq(idalloc_reserve(cl, "b", 1, &v, tc_detail()), IDA_EKIND);
    }
    /* No more errors come: the burst must reach status on its own. */
    int seen = 0;
    for (uint64_t end = tc_now_ms() + 20000; !seen && tc_now_ms() < end;) {
        tc_run(out, sizeof(out), "%s --cluster %s status --verbose",
               tc_bin("idalloc"), c.addrs);
        seen = strstr(out, "error=IDA_ENOPOOL count=3") != NULL &&
               strstr(out, "error=IDA_EKIND count=3") != NULL;
        if (!seen) {
            tc_sleep_ms(250);
        }
    }
    cr_assert(seen, "status --verbose shows no errors:\n%s", out);
}
