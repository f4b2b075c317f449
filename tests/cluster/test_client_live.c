/* The CLI and the client library against a live 3-node cluster: every
 * command with its output and exit code, next() from 8 threads, and a
 * leader killed in the middle of a stream of allocs. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/client/testing.h"
#include "tests/lib/harness.h"

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

Test(cli_live, every_command, .init = setup3, .fini = teardown, .timeout = 120)
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
    cr_assert_eq(cli("lookup users --tag zed"), 1,
                 "not found is a definite no");
    cr_assert_eq(cli("list users"), 0);
    cr_assert_str_eq(out, "0 alice\n1 bob\n");
    cr_assert_eq(cli("free users 1 --tag alice"), 1, "tag mismatch");
    cr_assert_eq(cli_err("free users 1 --tag alice"), 1);
    cr_assert(strstr(out, "another tag") != NULL, "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
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
    cr_assert(strstr(out, " log=") != NULL && strstr(out, " snapshot=") != NULL,
              "%s", out);
    /* --verbose: the leader's view of its two peers. */
    cr_assert_eq(cli("status --verbose"), 0);
    int peers = 0;
    for (char *p = out; (p = strstr(p, "\n  peer=")) != NULL; p++) {
        peers++;
    }
    cr_assert_eq(peers, 2, "%s", out);
    cr_assert(strstr(out, "state=replicate") != NULL, "%s", out);
    cr_assert_eq(cli("status --json"), 0, "%s", out);
    cr_assert(strncmp(out, "{\"nodes\":[", 10) == 0, "%s", out);
    cr_assert_eq(cli("free bp 0 --tag t --json"), 2,
                 "--json does not apply to free");

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

/* Nothing listening: nothing was sent, so the outcome is known (not done)
 * and retrying is safe; still exit 3 like every "try again". */
Test(cli_live, nothing_reachable_is_exit_3)
{
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster 127.0.0.1:1 --timeout 300 alloc p "
                        "--tag t 2>&1",
                        tc_bin("idalloc")),
                 3);
    cr_assert(strstr(out, "nothing was sent") != NULL, "%s", out);
    cr_assert(strstr(out, "retrying is safe") != NULL, "%s", out);
    cr_assert(strstr(out, "outcome unknown") == NULL, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster 127.0.0.1:1 --timeout 300 status",
                        tc_bin("idalloc")),
                 3, "status with no leader reachable");
}

Test(cli_live, conventions, .init = setup3, .fini = teardown, .timeout = 120)
{
    const char *progs[] = {"idalloc", "idallocd"};
    for (int i = 0; i < 2; i++) {
        for (int h = 0; h < 2; h++) {
            cr_assert_eq(tc_run(out, sizeof(out), "%s %s", tc_bin(progs[i]),
                                h ? "-h" : "--help"),
                         0);
            cr_assert(strncmp(out, "usage: ", 7) == 0, "%s", out);
        }
        cr_assert_eq(tc_run(out, sizeof(out), "%s --version", tc_bin(progs[i])),
                     0);
        char want[64];
        snprintf(want, sizeof(want), "%s %s\n", progs[i], idalloc_version());
        cr_assert_str_eq(out, want);
        cr_assert_eq(
            tc_run(out, sizeof(out), "%s --foo 2>&1", tc_bin(progs[i])), 2);
        cr_assert(strstr(out, "unknown option --foo") != NULL, "%s", out);
    }
    cr_assert_str_eq(idalloc_version(), IDALLOC_VERSION);
    cr_assert_eq(cli("alloc --help"), 0);
    cr_assert(strncmp(out, "usage: idalloc alloc", 20) == 0, "%s", out);

    /* next --count K reserves exactly K: a reserve after it goes on at K+1. */
    cr_assert_eq(cli("pool create s --kind sequence"), 0);
    cr_assert_eq(cli("next s --count 3"), 0);
    cr_assert_str_eq(out, "1\n2\n3\n");
    cr_assert_eq(cli("reserve s --count 2"), 0);
    cr_assert_str_eq(out, "4 5\n");
    cr_assert_eq(cli_err("reserve s --count 0"), 2);
    cr_assert(strstr(out, "16777216") != NULL, "%s", out);

    /* Wrong kinds say which kind is needed, list included. */
    cr_assert_eq(cli_err("list s"), 1);
    cr_assert(strstr(out, "needs a bounded pool") != NULL, "%s", out);
    cr_assert_eq(cli_err("alloc s --tag t"), 1);
    cr_assert(strstr(out, "needs a bounded pool") != NULL, "%s", out);

    /* A pool conflict is said once. */
    cr_assert_eq(cli_err("pool create s --kind bounded --size 3"), 1);
    cr_assert(strstr(out, "already exists") != NULL, "%s", out);
    cr_assert_null(strstr(strstr(out, "exists") + 1, "exists"),
                   "said twice: %s", out);

    /* bench: a pool of the wrong kind is refused before the run; a run in
     * which nothing succeeded exits non-zero. */
    cr_assert_eq(cli_err("bench --op alloc --pool s --clients 1 --duration 1"),
                 1);
    cr_assert(strstr(out, "not a bounded pool") != NULL, "%s", out);
    cr_assert(strstr(out, "bench: 1s") == NULL, "the run started: %s", out);
    cr_assert_eq(cli("pool create full --kind bounded --size 1"), 0);
    cr_assert_eq(cli("alloc full --tag only"), 0);
    cr_assert_eq(cli_err("bench --op alloc --pool full --clients 1 "
                         "--duration 1"),
                 1);
    cr_assert(strstr(out, "no request succeeded") != NULL, "%s", out);
}

/* status: 0 with a leader and every node; 1 when a node is down. */
Test(cli_live,
     status_exit_codes,
     .init = setup3,
     .fini = teardown,
     .timeout = 120)
{
    cr_assert_eq(cli("status"), 0, "%s", out);
    int leader = tc_wait_leader(&c, 10000);
    cr_assert_geq(leader, 0);
    tc_signal(&c, (leader + 1) % 3, SIGKILL);
    cr_assert_eq(cli("status"), 1, "%s", out);
    cr_assert(strstr(out, "unreachable") != NULL, "%s", out);
}

#define NEXT_THREADS    8
#define NEXT_PER_THREAD 1000000
static uint64_t *next_ids;

static void *next_worker(void *arg)
{
    uint64_t *dst = arg;
    for (int i = 0; i < NEXT_PER_THREAD; i++) {
        if (idalloc_next(cl, "seq", &dst[i], NULL) != 0) {
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

/* A write repeated by another process with --request-id: the first
 * answer, IDA_EREUSED for other arguments, "outcome unknown for good" for a
 * session the cluster does not know. */
Test(cli_live,
     request_id_repeats_a_write_from_another_process,
     .init = setup3,
     .fini = teardown,
     .timeout = 120)
{
    cr_assert_eq(
        idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL, NULL), 0);
    struct idalloc_client *keeper = tc_client(&c, 10000);
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t first;
    cr_assert_eq(idalloc_reserve(keeper, "s", 5, &first, &call), 0);
    idalloc_client_free(keeper); /* sends nothing more: the answer stays */
    char id[IDALLOC_CALL_ID_TEXT_MAX], args[256], want[64];
    cr_assert_eq(idalloc_call_format(&call, id), 0);
    snprintf(args, sizeof(args), "reserve s --count 5 --request-id %s", id);
    cr_assert_eq(cli(args), 0, "%s", out);
    snprintf(want, sizeof(want), "%llu %llu\n", (unsigned long long)first,
             (unsigned long long)first + 4);
    cr_assert_str_eq(out, want, "the repeat printed another block");
    snprintf(args, sizeof(args), "reserve s --count 6 --request-id %s", id);
    cr_assert_eq(cli_err(args), 1, "%s", out);
    cr_assert(strstr(out, "request id reused") != NULL, "%s", out);
    cr_assert_eq(cli("reserve s --count 1"), 0);
    snprintf(want, sizeof(want), "%llu %llu\n", (unsigned long long)first + 5,
             (unsigned long long)first + 5);
    cr_assert_str_eq(out, want, "a repeat acted");
    cr_assert_eq(cli_err("reserve s --count 5 --request-id "
                         "00112233445566778899aabbccddeeff:4294967296"),
                 3, "%s", out);
    cr_assert(strstr(out, "expired") != NULL, "%s", out);
}

Test(client_live,
     next_from_8_threads,
     .init = setup3,
     .fini = teardown,
     .timeout = 180)
{
    cr_assert_eq(
        idalloc_pool_create(cl, "seq", IDALLOC_POOL_SEQUENCE, 0, NULL, NULL),
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
        cr_assert_null(r, "next failed");
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

/* 256 calls in flight on one client object (256 threads), allocs and
 * reserves with a deadline shorter than a failover, through two leader
 * kills: calls in flight when a leader dies end "unknown". Every unknown one
 * is repeated with its struct idalloc_call until it is answered: the
 * cluster keeps every answer above the client's acknowledgement floor, so
 * none is lost (0 IDA_ESESSION), and each repeat gives the first answer
 * (a reserve repeated twice gets the same block; blocks never overlap). */
#define KILL_THREADS    256
#define KILL_PER_THREAD 12
struct kill_op
{
    int rv;
    int reserve; /* else an alloc */
    uint64_t id; /* alloc: the id; reserve: the first of 4 */
    struct idalloc_call call;
};
static struct kill_op kops[KILL_THREADS][KILL_PER_THREAD];
static int kill_done[KILL_THREADS];

static int kill_op_run(struct kill_op *o, int t, int i)
{
    char tag[32];
    snprintf(tag, sizeof(tag), "k%d-%d", t, i);
    return o->reserve ? idalloc_reserve(cl, "s", 4, &o->id, &o->call)
                      : idalloc_alloc(cl, "b", tag, &o->id, NULL, &o->call);
}

static void *kill_worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < KILL_PER_THREAD; i++) {
        struct kill_op *o = &kops[t][i];
        idalloc_call_init(&o->call);
        o->reserve = (t + i) % 2;
        o->rv = kill_op_run(o, t, i);
        __atomic_store_n(&kill_done[t], i + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int ops_done(void)
{
    int n = 0;
    for (int t = 0; t < KILL_THREADS; t++) {
        n += __atomic_load_n(&kill_done[t], __ATOMIC_ACQUIRE);
    }
    return n;
}

Test(client_live,
     calls_in_flight_through_leader_kills_resolve_by_repeat,
     .init = setup3,
     .fini = teardown,
     .timeout = 300)
{
    struct idalloc_client *admin = cl;
    cl = tc_client(&c, 250); /* the workers' client: short deadlines */
    cr_assert_eq(idalloc_pool_create(admin, "b", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL, NULL),
                 0);
    cr_assert_eq(
        idalloc_pool_create(admin, "s", IDALLOC_POOL_SEQUENCE, 0, NULL, NULL),
        0);
    static pthread_t th[KILL_THREADS];
    for (int t = 0; t < KILL_THREADS; t++) {
        cr_assert_eq(
            pthread_create(&th[t], NULL, kill_worker, (void *)(intptr_t)t), 0);
    }
    /* Kill the leader at a third, and the next one at two thirds. */
    const int total = KILL_THREADS * KILL_PER_THREAD;
    for (int round = 1; round <= 2; round++) {
        while (ops_done() < total * round / 3) {
            tc_sleep_ms(5);
        }
        int l = tc_wait_leader(&c, 5000);
        cr_assert_geq(l, 0);
        tc_signal(&c, l, SIGKILL);
        tc_spawn(&c, l);
    }
    for (int t = 0; t < KILL_THREADS; t++) {
        pthread_join(th[t], NULL);
    }
    int unknown = 0;
    for (int t = 0; t < KILL_THREADS; t++) {
        for (int i = 0; i < KILL_PER_THREAD; i++) {
            int rv = kops[t][i].rv;
            cr_assert(rv == 0 || idalloc_errclass(rv) == IDA_ERR_CLASS_UNKNOWN,
                      "op k%d-%d: %s (%s)", t, i, idalloc_errname(rv),
                      kops[t][i].call.errmsg);
            cr_assert_neq(rv, IDA_ESESSION, "op k%d-%d: %s", t, i,
                          kops[t][i].call.errmsg);
            unknown += rv != 0;
        }
    }
    cr_log_info("unknown outcomes during the kills: %d of %d", unknown, total);
    cr_assert_gt(unknown, 0,
                 "the kills produced no unknown outcome: the "
                 "replay path was not exercised");
    uint64_t floor;
    size_t outstanding;
    ida__client_floor(cl, &floor, &outstanding);
    cr_assert_geq(outstanding, 1, "unknown calls keep their answers wanted");
    /* Repeat every unknown one with its call struct until it settles. */
    cr_assert_geq(tc_wait_leader(&c, 10000), 0);
    int repeated = 0;
    for (int t = 0; t < KILL_THREADS; t++) {
        for (int i = 0; i < KILL_PER_THREAD; i++) {
            struct kill_op *o = &kops[t][i];
            if (o->rv == 0) {
                continue;
            }
            repeated++;
            for (int tries = 0; o->rv != 0 && tries < 40; tries++) {
                cr_assert(o->call.state == IDALLOC_CALL_UNKNOWN ||
                              o->call.state == IDALLOC_CALL_NEW,
                          "k%d-%d: state %d", t, i, o->call.state);
                uint64_t seq = o->call.seq;
                o->rv = kill_op_run(o, t, i);
                cr_assert(seq == 0 || o->call.seq == seq,
                          "a repeat must keep its request id");
                cr_assert_neq(o->rv, IDA_ESESSION,
                              "k%d-%d: the answer was lost: %s", t, i,
                              o->call.errmsg);
                if (o->rv != 0) {
                    tc_sleep_ms(50);
                }
            }
            cr_assert_eq(o->rv, 0, "repeat of k%d-%d: %s (%s)", t, i,
                         idalloc_errname(o->rv), o->call.errmsg);
            cr_assert_eq(o->call.state, IDALLOC_CALL_DONE);
        }
    }
    ida__client_floor(cl, &floor, &outstanding);
    cr_assert_eq(outstanding, 0, "every call settled");
    /* Each settled reserve repeated once more from another client object
     * (as another process would, by its request id): the same block while
     * the cluster keeps its answer, IDA_ESESSION once the worker client's
     * floor passed it; never a second block. */
    int same = 0;
    for (int t = 0; t < KILL_THREADS; t++) {
        for (int i = 0; i < KILL_PER_THREAD; i++) {
            struct kill_op *o = &kops[t][i];
            if (!o->reserve || o->call.seq == 0) {
                continue;
            }
            struct idalloc_call again = o->call;
            again.state = IDALLOC_CALL_UNKNOWN;
            uint64_t first = 0;
            int rv = idalloc_reserve(admin, "s", 4, &first, &again);
            cr_assert(rv == 0 || rv == IDA_ESESSION, "k%d-%d: %s (%s)", t, i,
                      idalloc_errname(rv), again.errmsg);
            if (rv == 0) {
                cr_assert_eq(first, o->id, "k%d-%d: a second block", t, i);
                same++;
            }
        }
    }
    /* How many answers were still kept depends on the floor the last writes
     * carried, so `same` is only reported. The positive case, made
     * certain: a reserve whose answer no later write of its client
     * released, repeated from another client object, gets its block. */
    cr_log_info("reserves repeated from another client: %d same block", same);
    struct idalloc_call last;
    idalloc_call_init(&last);
    uint64_t last_first = 0, again_first = 0;
    cr_assert_eq(idalloc_reserve(cl, "s", 4, &last_first, &last), 0, "%s",
                 last.errmsg);
    struct idalloc_call again = last;
    again.state = IDALLOC_CALL_UNKNOWN;
    cr_assert_eq(idalloc_reserve(admin, "s", 4, &again_first, &again), 0, "%s",
                 again.errmsg);
    cr_assert_eq(again_first, last_first, "a repeat got a second block");
    /* No id twice, every tag holds the id it was answered, no block
     * overlaps another. */
    static uint64_t ids[KILL_THREADS * KILL_PER_THREAD];
    static uint64_t firsts[KILL_THREADS * KILL_PER_THREAD];
    int n = 0, nf = 0;
    for (int t = 0; t < KILL_THREADS; t++) {
        for (int i = 0; i < KILL_PER_THREAD; i++) {
            char tag[32];
            uint64_t held;
            snprintf(tag, sizeof(tag), "k%d-%d", t, i);
            if (kops[t][i].reserve) {
                firsts[nf++] = kops[t][i].id;
                continue;
            }
            cr_assert_eq(idalloc_lookup(admin, "b", tag, &held, NULL), 0);
            cr_assert_eq(held, kops[t][i].id, "tag %s", tag);
            ids[n++] = kops[t][i].id;
        }
    }
    cr_log_info("repeated with their request ids: %d, all answered", repeated);
    qsort(ids, (size_t)n, sizeof(uint64_t), cmp_u64);
    for (int i = 1; i < n; i++) {
        cr_assert_neq(ids[i], ids[i - 1], "id %llu twice",
                      (unsigned long long)ids[i]);
    }
    qsort(firsts, (size_t)nf, sizeof(uint64_t), cmp_u64);
    for (int i = 1; i < nf; i++) {
        cr_assert_geq(
            firsts[i], firsts[i - 1] + 4, "blocks %llu and %llu overlap",
            (unsigned long long)firsts[i - 1], (unsigned long long)firsts[i]);
    }
    idalloc_client_free(admin);
}

/* A client given only a follower's address follows the NOT_LEADER hint to
 * the leader (an address it was not given) and learns every member. */
Test(client_live,
     follower_address_alone_is_enough,
     .init = setup3,
     .fini = teardown,
     .timeout = 60)
{
    int leader = tc_wait_leader(&c, 10000);
    cr_assert_geq(leader, 0);
    int follower = (leader + 1) % 3;
    char addr[64];
    snprintf(addr, sizeof(addr), "%s", c.cfg.nodes[follower].client.text);
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = addr;
    o.call_timeout_ms = 20000;
    struct idalloc_client *one;
    cr_assert_eq(idalloc_client_new(&o, &one, NULL), 0);
    cr_assert_eq(idalloc_node_count(one), 1);
    uint64_t t0 = tc_now_ms();
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(
        idalloc_pool_create(one, "f", IDALLOC_POOL_BOUNDED, 10, NULL, &call), 0,
        "%s", call.errmsg);
    uint64_t id;
    cr_assert_eq(idalloc_alloc(one, "f", "x", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    /* One attempt per node at most; a timeout would take seconds. */
    cr_assert_lt(tc_now_ms() - t0, 3000, "took %llu ms",
                 (unsigned long long)(tc_now_ms() - t0));
    cr_assert_eq(idalloc_node_count(one), 3, "members not learned");
    idalloc_client_free(one);

    /* The CLI too: status lists all three nodes from one address. */
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --timeout 10000 alloc f --tag y",
                        tc_bin("idalloc"), addr),
                 0, "%s", out);
    cr_assert_str_eq(out, "1\n");
    tc_run(out, sizeof(out), "%s --cluster %s status", tc_bin("idalloc"), addr);
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "node=")) != NULL; p++) {
        lines++;
    }
    cr_assert_eq(lines, 3, "status from one address:\n%s", out);
}
