/* The asynchronous calls against scripted servers on real loopback sockets:
 * every call completes exactly once, on the I/O thread; hints and retries
 * keep the request id; a dead and a silent node; a deadline leaves the
 * call UNKNOWN with its id and the repeat gets the first answer; the bounds
 * are definite errors at submit; free() completes every call in flight. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idalloc.h"
#include "src/client/testing.h"
#include "tests/client/fakeserver.h"

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* --- one completion per call ---------------------------------------------
 * A struct op is one call: its call struct, how many times its callback
 * ran, what it got, and on which thread. */
struct op
{
    struct idalloc_call call;
    atomic_int completions;
    int error;
    struct idalloc_result res;
    enum idalloc_call_state state;
    pthread_t thread;
};

static atomic_int done_total;

static void on_done(struct idalloc_client *c,
                    struct idalloc_call *call,
                    const struct idalloc_result *res,
                    void *arg)
{
    struct op *o = arg;
    (void)c;
    o->error = res->error;
    o->res = *res;
    o->state = call->state;
    o->thread = pthread_self();
    atomic_fetch_add(&o->completions, 1);
    atomic_fetch_add(&done_total, 1);
}

/* Wait up to @ms for @n completions in all. */
static int wait_done(int n, unsigned ms)
{
    uint64_t end = fx_now_ms() + ms;
    while (atomic_load(&done_total) < n && fx_now_ms() < end) {
        sleep_ms(1);
    }
    return atomic_load(&done_total) >= n;
}

#define MANY      3000
#define SUBMITTER 3
static struct op many[MANY];

static void *submitter(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = t; i < MANY; i += SUBMITTER) {
        idalloc_call_init(&many[i].call);
        char tag[32];
        snprintf(tag, sizeof(tag), "t%d", i);
        int rv = idalloc_alloc_async(fx_cli, "p", tag, &many[i].call, on_done,
                                     &many[i]);
        if (rv != 0) {
            return (void *)(intptr_t)rv;
        }
    }
    return NULL;
}

Test(async, every_call_completes_exactly_once, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(2000, 10000);
    atomic_store(&done_total, 0);
    pthread_t t[SUBMITTER];
    for (int i = 0; i < SUBMITTER; i++) {
        pthread_create(&t[i], NULL, submitter, (void *)(intptr_t)i);
    }
    for (int i = 0; i < SUBMITTER; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_null(r, "submit failed: %s",
                       idalloc_errname((int)(intptr_t)r));
    }
    cr_assert(wait_done(MANY, 20000), "%d of %d completed",
              atomic_load(&done_total), MANY);
    sleep_ms(100); /* a second completion would show by now */
    cr_assert_eq(atomic_load(&done_total), MANY);
    for (int i = 0; i < MANY; i++) {
        struct op *o = &many[i];
        cr_assert_eq(atomic_load(&o->completions), 1, "call %d: %d", i,
                     atomic_load(&o->completions));
        cr_assert_eq(o->error, 0, "call %d: %s", i, o->call.errmsg);
        cr_assert_eq(o->state, IDALLOC_CALL_DONE);
        /* The fake answers 1000 + request_seq: the right answer reached
         * the right call. */
        cr_assert_eq(o->res.id, 1000 + o->call.seq, "call %d", i);
        cr_assert(pthread_equal(o->thread, many[0].thread),
                  "callbacks run on the client's one I/O thread");
    }
    cr_assert_eq(fake_seen(&fx_srv[0]), MANY);
    cr_assert_eq(fx_srv[0].registers, 1, "one session for every call");
    cr_assert_eq(fx_srv[0].nconns, 1);
}

Test(async, results_of_every_operation, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_srv[0].next_block = 77;
    fx_connect(1000, 5000);
    atomic_store(&done_total, 0);
    static struct op o[6];
    memset(o, 0, sizeof(o));
    cr_assert_eq(idalloc_pool_create_async(fx_cli, "b", IDALLOC_POOL_BOUNDED,
                                           10, NULL, on_done, &o[0]),
                 0);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "b", "x", NULL, on_done, &o[1]),
                 0);
    cr_assert_eq(idalloc_free_async(fx_cli, "b", 3, "x", NULL, on_done, &o[2]),
                 0);
    cr_assert_eq(
        idalloc_lookup_async(fx_cli, "b", "four", NULL, on_done, &o[3]), 0);
    cr_assert_eq(idalloc_reserve_async(fx_cli, "s", 5, NULL, on_done, &o[4]),
                 0);
    cr_assert_eq(idalloc_prefix_async(fx_cli, "f", "ab", NULL, on_done, &o[5]),
                 0);
    cr_assert(wait_done(6, 10000));
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(o[i].error, 0, "op %d: %s", i,
                     idalloc_strerror(o[i].error));
    }
    cr_assert_eq(o[0].res.created, 1);
    cr_assert_geq(o[1].res.id, 1000);
    cr_assert_eq(o[2].res.freed, 1);
    cr_assert_eq(o[3].res.id, 4);
    cr_assert_eq(o[4].res.id, 77);
    cr_assert_eq(o[4].res.count, 5);
    cr_assert_eq(o[5].res.prefix_len, 3);
    cr_assert_eq(o[5].res.prefix[0], 0xab);
    cr_assert_eq(o[5].res.prefix[1], 2);
    cr_assert_eq(o[5].res.existed, 1);
    /* The blocking forms give the same results (the same code path). */
    uint64_t id;
    cr_assert_eq(idalloc_lookup(fx_cli, "b", "four", &id, NULL), 0);
    cr_assert_eq(id, 4);
    cr_assert_eq(idalloc_reserve(fx_cli, "s", 5, &id, NULL), 0);
    cr_assert_eq(id, 82);
}

Test(async, follows_the_hint_with_the_same_request_id, .fini = fx_teardown)
{
    fx_start(2, FAKE_NOT_LEADER, FAKE_ANSWER, 0);
    strcpy(fx_srv[0].hint_addr, fx_srv[1].addr);
    fx_connect(1000, 5000);
    atomic_store(&done_total, 0);
    static struct op o;
    memset(&o, 0, sizeof(o));
    idalloc_call_init(&o.call);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", &o.call, on_done, &o),
                 0);
    cr_assert(wait_done(1, 10000));
    cr_assert_eq(o.error, 0, "%s", o.call.errmsg);
    cr_assert_eq(fake_seen(&fx_srv[0]), 1);
    cr_assert_eq(fake_seen(&fx_srv[1]), 1);
    cr_assert_eq(fx_srv[0].seen_seq[0], o.call.seq);
    cr_assert_eq(fx_srv[1].seen_seq[0], o.call.seq, "same request_seq");
    cr_assert_eq(memcmp(fx_srv[0].seen_client[0], fx_srv[1].seen_client[0], 16),
                 0);
}

/* Node 0 is silent, node 1 dead (its port refuses): every call gets
 * through node 2 with the request id it was first sent with. */
Test(async, silent_and_dead_nodes_are_retried_past, .fini = fx_teardown)
{
    fx_start(3, FAKE_SILENT, FAKE_ANSWER, FAKE_ANSWER);
    char dead[64];
    strcpy(dead, fx_srv[1].addr);
    fake_stop(&fx_srv[1]);
    fake_start(&fx_srv[1], FAKE_ANSWER); /* the fixture stops it again */
    char addrs[256];
    snprintf(addrs, sizeof(addrs), "%s,%s,%s", fx_srv[0].addr, dead,
             fx_srv[2].addr);
    fx_cli = fx_new_client(addrs, 100, 5000);
    atomic_store(&done_total, 0);
    enum { N = 50 };
    static struct op o[N];
    memset(o, 0, sizeof(o));
    for (int i = 0; i < N; i++) {
        idalloc_call_init(&o[i].call);
        cr_assert_eq(
            idalloc_alloc_async(fx_cli, "p", "t", &o[i].call, on_done, &o[i]),
            0);
    }
    cr_assert(wait_done(N, 10000));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(o[i].error, 0, "call %d: %s", i, o[i].call.errmsg);
        cr_assert_eq(o[i].res.id, 1000 + o[i].call.seq);
    }
    /* Every call first went to the silent node, then to node 2 under the
     * same id. */
    cr_assert_eq(fake_seen(&fx_srv[0]), N);
    cr_assert_eq(fake_seen(&fx_srv[2]), N);
    for (int i = 0; i < N; i++) {
        int found = 0;
        for (int k = 0; k < N; k++) {
            found |= fx_srv[0].seen_seq[k] == fx_srv[2].seen_seq[i];
        }
        cr_assert(found, "seq %llu reached node 2 only",
                  (unsigned long long)fx_srv[2].seen_seq[i]);
    }
    /* (Nothing can have reached the dead address: it refuses; server 1
     * was started again on another port only for the fixture to stop.) */
}

/* A leader that acts and never answers: the deadline leaves the call
 * UNKNOWN with its request id; a fresh call then acts anew, and the repeat
 * of the unknown one (the same call struct) gets the FIRST answer back,
 * which it can only get by carrying the first request id. */
Test(async,
     deadline_then_exact_repeat_gets_the_first_answer,
     .fini = fx_teardown)
{
    fx_start(1, FAKE_ACT_SILENT, 0, 0);
    fx_srv[0].keep = 1;
    fx_connect(100, 300);
    atomic_store(&done_total, 0);
    static struct op o, fresh, again;
    memset(&o, 0, sizeof(o));
    idalloc_call_init(&o.call);
    uint64_t t0 = fx_now_ms();
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", &o.call, on_done, &o),
                 0);
    cr_assert(wait_done(1, 10000));
    cr_assert_geq(fx_now_ms() - t0, 300, "ended before its deadline");
    cr_assert_eq(o.error, IDA_ETIMEDOUT, "%s", idalloc_errname(o.error));
    cr_assert_eq(o.state, IDALLOC_CALL_UNKNOWN);
    cr_assert(strstr(o.call.errmsg, "outcome unknown") != NULL, "%s",
              o.call.errmsg);
    uint64_t seq = o.call.seq;
    cr_assert_neq(seq, 0);
    uint64_t first = fake_kept_value(&fx_srv[0], o.call.client_id, seq);
    cr_assert_eq(first, 5000, "the fake acted on the first attempt");
    uint64_t floor;
    size_t n;
    ida__client_floor(fx_cli, &floor, &n);
    cr_assert_eq(n, 1, "the unknown call's answer stays wanted");
    fake_set_mode(&fx_srv[0], FAKE_ANSWER);
    memset(&fresh, 0, sizeof(fresh));
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "u", NULL, on_done, &fresh),
                 0);
    cr_assert(wait_done(2, 10000));
    cr_assert_eq(fresh.error, 0);
    cr_assert_eq(fresh.res.id, 5001, "a fresh call acts anew");
    /* The repeat: same struct, same operation and arguments. */
    memset(&again, 0, sizeof(again));
    cr_assert_eq(
        idalloc_alloc_async(fx_cli, "p", "t", &o.call, on_done, &again), 0);
    cr_assert(wait_done(3, 10000));
    cr_assert_eq(again.error, 0, "%s", o.call.errmsg);
    cr_assert_eq(again.res.id, first, "the repeat got a second answer");
    cr_assert_eq(o.call.seq, seq, "the repeat kept its request id");
    cr_assert_eq(again.state, IDALLOC_CALL_DONE);
    ida__client_floor(fx_cli, &floor, &n);
    cr_assert_eq(n, 0, "settled: no answer wanted any more");
    cr_assert_eq(atomic_load(&o.completions), 1);
    cr_assert_eq(atomic_load(&again.completions), 1);
}

/* IDALLOC_IN_FLIGHT_MAX calls in flight: the next is refused at submit
 * (definite, its callback never runs, its call struct as it was); free()
 * then completes each call in flight exactly once before it returns. */
Test(async, in_flight_bound_then_free_completes_every_call, .fini = fx_teardown)
{
    fx_start(1, FAKE_SILENT, 0, 0);
    fx_connect(60000, 60000);
    atomic_store(&done_total, 0);
    static struct op o[IDALLOC_IN_FLIGHT_MAX + 1];
    memset(o, 0, sizeof(o));
    for (int i = 0; i < IDALLOC_IN_FLIGHT_MAX; i++) {
        cr_assert_eq(
            idalloc_lookup_async(fx_cli, "p", "t", NULL, on_done, &o[i]), 0,
            "call %d", i);
    }
    struct op *last = &o[IDALLOC_IN_FLIGHT_MAX];
    idalloc_call_init(&last->call);
    int rv = idalloc_alloc_async(fx_cli, "p", "t", &last->call, on_done, last);
    cr_assert_eq(rv, IDA_ELIMIT, "got %s", idalloc_errname(rv));
    cr_assert_eq(idalloc_errclass(rv), IDA_ERR_CLASS_DEFINITE);
    cr_assert_eq(last->call.state, IDALLOC_CALL_NEW);
    cr_assert_eq(last->call.seq, 0);
    cr_assert(strstr(last->call.errmsg, "in flight") != NULL, "%s",
              last->call.errmsg);
    /* Let the I/O thread put them on the wire, then free. */
    uint64_t end = fx_now_ms() + 20000;
    while (fake_seen(&fx_srv[0]) < IDALLOC_IN_FLIGHT_MAX && fx_now_ms() < end) {
        sleep_ms(5);
    }
    cr_assert_eq(fake_seen(&fx_srv[0]), IDALLOC_IN_FLIGHT_MAX);
    cr_assert_eq(atomic_load(&done_total), 0);
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
    cr_assert_eq(atomic_load(&done_total), IDALLOC_IN_FLIGHT_MAX,
                 "free() returned before every callback ran");
    for (int i = 0; i < IDALLOC_IN_FLIGHT_MAX; i++) {
        cr_assert_eq(atomic_load(&o[i].completions), 1);
        cr_assert_eq(o[i].error, IDA_ECLOSED, "call %d: %s", i,
                     idalloc_errname(o[i].error));
    }
    cr_assert_eq(atomic_load(&last->completions), 0);
}

/* Writes whose answers are wanted (unknown and kept): past
 * IDALLOC_OUTSTANDING_MAX a write is refused at submit, a read is not;
 * releasing one lets the next write through. */
Test(async, outstanding_bound_is_refused_at_submit, .fini = fx_teardown)
{
    fx_start(1, FAKE_SILENT, 0, 0);
    /* Every call must be on the wire before its deadline (else it ends
     * "nothing was sent", not unknown): 200 ms was too short for the
     * 3,000 of them under valgrind. */
    fx_connect(100, 800);
    atomic_store(&done_total, 0);
    static struct op o[IDALLOC_OUTSTANDING_MAX + 2];
    memset(o, 0, sizeof(o));
    for (int i = 0; i < IDALLOC_OUTSTANDING_MAX; i++) {
        idalloc_call_init(&o[i].call);
        cr_assert_eq(
            idalloc_alloc_async(fx_cli, "p", "t", &o[i].call, on_done, &o[i]),
            0, "call %d", i);
    }
    cr_assert(wait_done(IDALLOC_OUTSTANDING_MAX, 30000));
    for (int i = 0; i < IDALLOC_OUTSTANDING_MAX; i++) {
        cr_assert_eq(o[i].state, IDALLOC_CALL_UNKNOWN, "call %d: %s", i,
                     o[i].call.errmsg);
    }
    struct op *x = &o[IDALLOC_OUTSTANDING_MAX];
    idalloc_call_init(&x->call);
    int rv = idalloc_reserve_async(fx_cli, "s", 1, &x->call, on_done, x);
    cr_assert_eq(rv, IDA_ELIMIT, "got %s", idalloc_errname(rv));
    cr_assert_eq(x->call.state, IDALLOC_CALL_NEW);
    cr_assert(strstr(x->call.errmsg, "outstanding") != NULL, "%s",
              x->call.errmsg);
    /* A repeat of an unknown one is accepted (its answer is wanted
     * already); a read is not bounded by it. */
    struct op *r = &o[1];
    atomic_store(&r->completions, 0);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", &r->call, on_done, r),
                 0);
    struct op *rd = &o[IDALLOC_OUTSTANDING_MAX + 1];
    cr_assert_eq(idalloc_lookup_async(fx_cli, "p", "t", NULL, on_done, rd), 0);
    cr_assert(wait_done(IDALLOC_OUTSTANDING_MAX + 2, 10000));
    cr_assert_eq(r->error, IDA_ETIMEDOUT);
    cr_assert_eq(r->state, IDALLOC_CALL_UNKNOWN);
    cr_assert_eq(rd->error, IDA_ETIMEDOUT);
    /* Releasing one lets a fresh write through. */
    cr_assert_eq(idalloc_call_release(fx_cli, &o[0].call), 0);
    cr_assert_eq(idalloc_reserve_async(fx_cli, "s", 1, &x->call, on_done, x),
                 0);
    cr_assert(wait_done(IDALLOC_OUTSTANDING_MAX + 3, 10000));
    cr_assert_eq(x->error, IDA_ETIMEDOUT);
    cr_assert_eq(atomic_load(&x->completions), 1);
}

/* A callback may submit (a closed loop), runs on the I/O thread, and gets
 * IDA_EINVAL from the blocking calls instead of a deadlock. */
struct loop_state
{
    atomic_int left;
    atomic_int blocking_rv, next_rv, status_rv;
    pthread_t io;
    atomic_int other_thread;
    atomic_int failures; /* an error or a refused submit (no cr_assert off
                          * the test's thread) */
};
static struct loop_state ls;

static void loop_done(struct idalloc_client *c,
                      struct idalloc_call *call,
                      const struct idalloc_result *res,
                      void *arg)
{
    (void)call;
    if (res->error != 0) {
        atomic_fetch_add(&ls.failures, 1);
    }
    if (!pthread_equal(pthread_self(), ls.io)) {
        atomic_store(&ls.other_thread, 1);
    }
    uint64_t id;
    struct idalloc_node_status st;
    atomic_store(&ls.blocking_rv, idalloc_alloc(c, "p", "x", &id, NULL, NULL));
    atomic_store(&ls.next_rv, idalloc_next(c, "s", &id, NULL));
    atomic_store(&ls.status_rv, idalloc_node_status(c, 0, &st, NULL));
    if (atomic_fetch_sub(&ls.left, 1) > 1 &&
        idalloc_alloc_async(c, "p", "t", NULL, loop_done, arg) != 0) {
        atomic_fetch_add(&ls.failures, 1);
    }
    atomic_fetch_add(&done_total, 1);
}

static void first_done(struct idalloc_client *c,
                       struct idalloc_call *call,
                       const struct idalloc_result *res,
                       void *arg)
{
    (void)c, (void)call, (void)res, (void)arg;
    ls.io = pthread_self();
    atomic_fetch_add(&done_total, 1);
}

Test(async, callbacks_may_submit_but_not_block, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(1000, 5000);
    atomic_store(&done_total, 0);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", NULL, first_done, NULL),
                 0);
    cr_assert(wait_done(1, 10000));
    cr_assert(!pthread_equal(ls.io, pthread_self()));
    atomic_store(&ls.left, 1000);
    atomic_store(&ls.blocking_rv, -1);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", NULL, loop_done, NULL),
                 0);
    cr_assert(wait_done(1001, 20000), "%d", atomic_load(&done_total));
    cr_assert_eq(atomic_load(&ls.other_thread), 0);
    cr_assert_eq(atomic_load(&ls.failures), 0);
    cr_assert_eq(atomic_load(&ls.blocking_rv), IDA_EINVAL);
    cr_assert_eq(atomic_load(&ls.next_rv), IDA_EINVAL);
    cr_assert_eq(atomic_load(&ls.status_rv), IDA_EINVAL);
    cr_assert_eq(fake_seen(&fx_srv[0]), 1001, "blocking calls sent nothing");
}

Test(async, refused_submits_leave_nothing_behind, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(1000, 5000);
    atomic_store(&done_total, 0);
    static struct op o;
    memset(&o, 0, sizeof(o));
    idalloc_call_init(&o.call);
    char tag[130];
    memset(tag, 't', sizeof(tag));
    tag[129] = '\0';
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", tag, &o.call, on_done, &o),
                 IDA_ETOOBIG);
    cr_assert(strstr(o.call.errmsg, "at most 128") != NULL, "%s",
              o.call.errmsg);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "a b", "t", &o.call, on_done, &o),
                 IDA_EINVAL);
    cr_assert_eq(idalloc_reserve_async(fx_cli, "s", 0, &o.call, on_done, &o),
                 IDA_EINVAL);
    cr_assert_eq(
        idalloc_reserve_async(fx_cli, "s", IDALLOC_RESERVE_COUNT_MAX + 1,
                              &o.call, on_done, &o),
        IDA_EINVAL);
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", &o.call, NULL, &o),
                 IDA_EINVAL);
    cr_assert_eq(
        idalloc_pool_create_async(fx_cli, "p", (enum idalloc_pool_kind)9, 0,
                                  &o.call, on_done, &o),
        IDA_EINVAL);
    /* A call struct another call holds is refused untouched. */
    struct idalloc_call busy;
    idalloc_call_init(&busy);
    busy.state = IDALLOC_CALL_IN_FLIGHT;
    strcpy(busy.errmsg, "mine");
    cr_assert_eq(idalloc_alloc_async(fx_cli, "p", "t", &busy, on_done, &o),
                 IDA_EINVAL);
    uint64_t id;
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &busy), IDA_EINVAL);
    cr_assert_str_eq(busy.errmsg, "mine");
    cr_assert_eq(busy.state, IDALLOC_CALL_IN_FLIGHT);
    sleep_ms(50);
    cr_assert_eq(atomic_load(&done_total), 0, "a refused call's callback ran");
    cr_assert_eq(fake_seen(&fx_srv[0]), 0, "nothing was sent");
    cr_assert_eq(o.call.state, IDALLOC_CALL_NEW);
    /* The arguments are copied at submit: the caller's buffers can go. */
    char *p = strdup("pool"), *t = strdup("tag");
    cr_assert_eq(idalloc_lookup_async(fx_cli, p, t, NULL, on_done, &o), 0);
    memset(p, 'X', strlen(p));
    memset(t, 0, 3);
    free(p);
    free(t);
    cr_assert(wait_done(1, 10000));
    cr_assert_eq(o.error, 0);
    cr_assert_eq(o.res.id, 3, "the fake answers the tag's length");
}

/* Writes submitted before the session exists wait for one registration,
 * then get distinct request ids. */
Test(async, first_writes_share_one_registration, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(1000, 5000);
    atomic_store(&done_total, 0);
    enum { N = 200 };
    static struct op o[N];
    memset(o, 0, sizeof(o));
    for (int i = 0; i < N; i++) {
        idalloc_call_init(&o[i].call);
        cr_assert_eq(
            idalloc_reserve_async(fx_cli, "s", 2, &o[i].call, on_done, &o[i]),
            0);
    }
    cr_assert(wait_done(N, 10000));
    cr_assert_eq(fx_srv[0].registers, 1);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(o[i].error, 0, "%s", o[i].call.errmsg);
        cr_assert_eq(memcmp(o[i].call.client_id, fx_srv[0].registered, 16), 0);
        for (int k = 0; k < i; k++) {
            cr_assert_neq(o[i].call.seq, o[k].call.seq);
            cr_assert_neq(o[i].res.id, o[k].res.id, "one block twice");
        }
    }
}

/* free() with calls in flight: those sent end IDA_ECLOSED and UNKNOWN with
 * their request ids, and a repeat from another client object gets the
 * answer the first attempt got; those never sent (no node reachable) end
 * IDA_EUNAVAIL, state NEW. */
Test(async, free_in_flight_then_repeat_elsewhere, .fini = fx_teardown)
{
    fx_start(1, FAKE_ACT_SILENT, 0, 0);
    fx_srv[0].keep = 1;
    fx_connect(60000, 60000);
    atomic_store(&done_total, 0);
    enum { N = 500 };
    static struct op o[N];
    memset(o, 0, sizeof(o));
    for (int i = 0; i < N; i++) {
        idalloc_call_init(&o[i].call);
        char tag[16];
        snprintf(tag, sizeof(tag), "f%d", i);
        cr_assert_eq(
            idalloc_alloc_async(fx_cli, "p", tag, &o[i].call, on_done, &o[i]),
            0);
    }
    uint64_t end = fx_now_ms() + 20000;
    while (fake_seen(&fx_srv[0]) < N && fx_now_ms() < end) {
        sleep_ms(5);
    }
    cr_assert_eq(fake_seen(&fx_srv[0]), N);
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
    cr_assert_eq(atomic_load(&done_total), N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(atomic_load(&o[i].completions), 1);
        cr_assert_eq(o[i].error, IDA_ECLOSED, "%s", o[i].call.errmsg);
        cr_assert_eq(o[i].state, IDALLOC_CALL_UNKNOWN);
        cr_assert_neq(o[i].call.seq, 0);
    }
    /* Repeat each from a new client object, as another process would. */
    fake_set_mode(&fx_srv[0], FAKE_ANSWER);
    fx_connect(1000, 10000);
    atomic_store(&done_total, 0);
    static struct op again[N];
    memset(again, 0, sizeof(again));
    for (int i = 0; i < N; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "f%d", i);
        cr_assert_eq(idalloc_alloc_async(fx_cli, "p", tag, &o[i].call, on_done,
                                         &again[i]),
                     0);
    }
    cr_assert(wait_done(N, 20000));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(again[i].error, 0, "%s", o[i].call.errmsg);
        cr_assert_eq(
            again[i].res.id,
            fake_kept_value(&fx_srv[0], o[i].call.client_id, o[i].call.seq),
            "call %d: the repeat did not get the first answer", i);
    }
    cr_assert_eq(fx_srv[0].nkept, N, "the fake acted once per call");

    /* Never sent: nothing listens (port 1), calls cycle through refused
     * connections until free(). */
    struct idalloc_client *none = fx_new_client("127.0.0.1:1", 50, 60000);
    atomic_store(&done_total, 0);
    static struct op u[8];
    memset(u, 0, sizeof(u));
    for (int i = 0; i < 8; i++) {
        idalloc_call_init(&u[i].call);
        cr_assert_eq(
            idalloc_alloc_async(none, "p", "t", &u[i].call, on_done, &u[i]), 0);
    }
    sleep_ms(100);
    idalloc_client_free(none);
    cr_assert_eq(atomic_load(&done_total), 8);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(u[i].error, IDA_EUNAVAIL, "%s",
                     idalloc_errname(u[i].error));
        cr_assert_eq(u[i].state, IDALLOC_CALL_NEW);
        cr_assert(strstr(u[i].call.errmsg, "nothing was done") != NULL, "%s",
                  u[i].call.errmsg);
    }
}
