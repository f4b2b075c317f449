/* The CLI and the client library against a live 3-node cluster: every
 * command with its output and exit code, next() from 8 threads, and a
 * leader killed in the middle of a stream of allocs. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cluster/harness.h"

static struct tc c;
static struct idalloc_client *cl;
static char out[65536];

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

/* Run `idalloc --cluster ADDRS ARGS`, stdout into `out`; the exit code. */
static int cli(const char *args)
{
    return tc_run(out, sizeof(out), "%s --cluster %s %s 2>/dev/null",
                  tc_bin("idalloc"), c.addrs, args);
}

/* Same, stderr into `out`. */
static int cli_err(const char *args)
{
    return tc_run(out, sizeof(out), "%s --cluster %s %s 2>&1 >/dev/null",
                  tc_bin("idalloc"), c.addrs, args);
}

Test(cli_live, every_command, .init = setup3, .fini = teardown,
     .timeout = 120)
{
    cr_assert_eq(cli("pool create users --kind bounded --size 10"), 0);
    cr_assert_str_eq(out, "created\n");
    cr_assert_eq(cli("pool create users --kind bounded --size 10"), 0);
    cr_assert_str_eq(out, "exists\n");
    cr_assert_eq(cli("alloc users --tag alice"), 0);
    cr_assert_str_eq(out, "0\n");
    cr_assert_eq(cli("alloc users --tag bob"), 0);
    cr_assert_str_eq(out, "1\n");
    cr_assert_eq(cli("alloc users --tag alice"), 0);
    cr_assert_str_eq(out, "0\n");
    cr_assert_eq(cli("lookup users --tag bob"), 0);
    cr_assert_str_eq(out, "1\n");
    cr_assert_eq(cli("lookup users --tag zed"), 1, "not found is a definite no");
    cr_assert_eq(cli("list users"), 0);
    cr_assert_str_eq(out, "0 alice\n1 bob\n");
    cr_assert_eq(cli("free users 1 --tag alice"), 1, "tag mismatch");
    cr_assert_eq(cli_err("free users 1 --tag alice"), 1);
    cr_assert(strstr(out, "another tag") != NULL, "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s",
                 out);
    cr_assert_eq(cli("free users 1 --tag bob"), 0);
    cr_assert_str_eq(out, "freed\n");
    cr_assert_eq(cli("free users 1 --tag bob"), 0);
    cr_assert_str_eq(out, "already free\n");
    cr_assert_eq(cli("alloc nosuchpool --tag a"), 1);

    cr_assert_eq(cli("pool create seq --kind sequence"), 0);
    cr_assert_eq(cli("reserve seq --count 10"), 0);
    unsigned long long f, l;
    cr_assert_eq(sscanf(out, "%llu %llu", &f, &l), 2);
    cr_assert_eq(l - f, 9);
    cr_assert_eq(cli("next seq --count 3"), 0);
    unsigned long long a, b, d;
    cr_assert_eq(sscanf(out, "%llu\n%llu\n%llu", &a, &b, &d), 3);
    cr_assert(a > l && b > a && d > b, "next ids: %s", out);
    cr_assert_eq(cli("next seq --format hex"), 0);
    cr_assert_eq(strlen(out), 20, "hex id: %s", out);
    cr_assert_eq(out[4], '-');

    cr_assert_eq(cli("pool create dirs --kind prefix"), 0);
    cr_assert_eq(cli("prefix dirs --tag d1"), 0);
    char first[64];
    strcpy(first, out);
    cr_assert_eq(cli("prefix dirs --tag d1"), 0);
    cr_assert_str_eq(out, first, "same tag, same prefix");

    cr_assert_eq(cli("status"), 0);
    int lines = 0, leaders = 0;
    for (char *p = out; (p = strchr(p, '\n')) != NULL; p++) {
        lines++;
    }
    for (char *p = out; (p = strstr(p, "role=leader")) != NULL; p++) {
        leaders++;
    }
    cr_assert_eq(lines, 3, "one line per node: %s", out);
    cr_assert_eq(leaders, 1, "%s", out);

    cr_assert_eq(cli("alloc users"), 2, "usage error");
    cr_assert_eq(cli("pool create x --kind nope"), 2);
    cr_assert_eq(cli("bench --op alloc --pool bp --clients 4 --duration 1"), 0);
    cr_assert(strncmp(out, "op=alloc clients=4 ok=", 22) == 0, "%s", out);
    cr_assert(strstr(out, "errors=0 unknown=0") != NULL, "%s", out);
    cr_assert_eq(cli("bench --op next --pool bs --clients 2 --duration 1 "
                     "--json"),
                 0);
    cr_assert(strncmp(out, "{\"op\":\"next\"", 12) == 0, "%s", out);
}

Test(cli_live, nothing_reachable_is_exit_3)
{
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster 127.0.0.1:1 --timeout 300 alloc p "
                        "--tag t 2>&1",
                        tc_bin("idalloc")),
                 3);
    cr_assert(strstr(out, "outcome unknown") != NULL, "%s", out);
}

#define NEXT_THREADS 8
#define NEXT_PER_THREAD 1000000
static uint64_t *next_ids;

static void *next_worker(void *arg)
{
    uint64_t *dst = arg;
    for (int i = 0; i < NEXT_PER_THREAD; i++) {
        if (idalloc_next(cl, "seq", &dst[i]) != 0) {
            return (void *)1;
        }
    }
    return NULL;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

Test(client_live, next_from_8_threads, .init = setup3, .fini = teardown,
     .timeout = 180)
{
    cr_assert_eq(idalloc_pool_create(cl, "seq", IDALLOC_POOL_SEQUENCE, 0,
                                     NULL),
                 0);
    next_ids = malloc(sizeof(uint64_t) * NEXT_THREADS * NEXT_PER_THREAD);
    pthread_t t[NEXT_THREADS];
    for (int i = 0; i < NEXT_THREADS; i++) {
        pthread_create(&t[i], NULL, next_worker,
                       next_ids + (size_t)i * NEXT_PER_THREAD);
    }
    for (int i = 0; i < NEXT_THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_null(r, "next failed: %s", idalloc_last_error());
    }
    size_t n = (size_t)NEXT_THREADS * NEXT_PER_THREAD;
    qsort(next_ids, n, sizeof(uint64_t), cmp_u64);
    for (size_t i = 1; i < n; i++) {
        cr_assert_neq(next_ids[i], next_ids[i - 1], "id %llu twice",
                      (unsigned long long)next_ids[i]);
    }
    free(next_ids);
    struct idalloc_next_stats st;
    cr_assert_eq(idalloc_next_stats(cl, "seq", &st), 0);
    cr_assert_eq(st.handed_out, n);
    cr_assert_eq(st.refills_max_in_flight, 1, "more than one refill at once");
    cr_assert_lt(st.refills, 10000, "refills: %llu",
                 (unsigned long long)st.refills);
}

Test(client_live, leader_kill_during_allocs, .init = setup3, .fini = teardown,
     .timeout = 180)
{
    enum { N = 600 };
    static uint64_t ids[N], seqs[N];
    static int rvs[N];
    idalloc_client_free(cl);
    cl = tc_client(&c, 3000); /* short deadline: get unknowns, not waits */
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL),
                 0);
    int unknown = 0;
    for (int i = 0; i < N; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "k%d", i);
        if (i == N / 3) {
            tc_signal(&c, tc_wait_leader(&c, 5000), SIGKILL);
        }
        rvs[i] = idalloc_alloc(cl, "b", tag, &ids[i], NULL);
        seqs[i] = idalloc_last_request_seq();
        cr_assert(rvs[i] == 0 || idalloc_errclass(rvs[i]) ==
                                     IDA_ERR_CLASS_UNKNOWN,
                  "alloc %d: %s", i, idalloc_errname(rvs[i]));
        unknown += rvs[i] != 0;
    }
    /* Retry the unknown ones with their own request ids. */
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    for (int i = 0; i < N; i++) {
        if (rvs[i] != 0) {
            char tag[32];
            snprintf(tag, sizeof(tag), "k%d", i);
            idalloc_retry_with(seqs[i]);
            rvs[i] = idalloc_alloc(cl, "b", tag, &ids[i], NULL);
            cr_assert(rvs[i] == 0 || rvs[i] == IDA_ESESSION,
                      "retry %d: %s", i, idalloc_errname(rvs[i]));
            if (rvs[i] == IDA_ESESSION) { /* answer gone: ask by tag */
                cr_assert_eq(idalloc_lookup(cl, "b", tag, &ids[i]), 0);
            }
        }
    }
    qsort(ids, N, sizeof(uint64_t), cmp_u64);
    for (int i = 1; i < N; i++) {
        cr_assert_neq(ids[i], ids[i - 1], "id %llu twice",
                      (unsigned long long)ids[i]);
    }
    cr_log_info("unknown outcomes during the kill: %d", unknown);
}
