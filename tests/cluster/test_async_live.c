/* The asynchronous client API against a live 3-node cluster: every
 * operation; 1,200 calls in flight on one client object (one I/O thread,
 * no caller threads) through a leader killed (dead) and a leader stopped
 * (silent), every unknown outcome resolved by repeating it with its call
 * struct, no id given twice and the reserved blocks tiling their range (a
 * block acted on twice would leave a hole); free() with calls in flight,
 * the unknown ones repeated on another client object. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/client/testing.h"
#include "tests/lib/harness.h"

static struct tc c;
static struct idalloc_client *admin;

static void setup3(void)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 10000), 0, "no leader elected");
    admin = tc_client(&c, 10000);
}

static void teardown(void)
{
    idalloc_client_free(admin);
    admin = NULL;
    tc_destroy(&c);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Blocks of @n ids at @firsts[0..k) are disjoint and leave no hole: each
 * starts where the one before ends. */
static void assert_tiled(uint64_t *firsts, int k, uint64_t n)
{
    qsort(firsts, (size_t)k, sizeof(uint64_t), cmp_u64);
    for (int i = 1; i < k; i++) {
        cr_assert_eq(
            firsts[i], firsts[i - 1] + n, "blocks at %llu and %llu: %s",
            (unsigned long long)firsts[i - 1], (unsigned long long)firsts[i],
            firsts[i] < firsts[i - 1] + n
                ? "overlap"
                : "a hole (a block reserved and never reported)");
    }
}

/* --- one call, waited for ------------------------------------------------ */

struct one
{
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    struct idalloc_result res;
    enum idalloc_call_state state;
};

static void one_done(struct idalloc_client *cl,
                     struct idalloc_call *call,
                     const struct idalloc_result *res,
                     void *arg)
{
    (void)cl;
    struct one *o = arg;
    pthread_mutex_lock(&o->mu);
    o->res = *res;
    o->state = call->state;
    o->done = 1;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void one_init(struct one *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
}

static struct idalloc_result one_wait(struct one *o)
{
    pthread_mutex_lock(&o->mu);
    while (!o->done) {
        pthread_cond_wait(&o->cv, &o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    struct idalloc_result r = o->res;
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    return r;
}

Test(async_live,
     every_operation,
     .init = setup3,
     .fini = teardown,
     .timeout = 120)
{
    struct one o;
    struct idalloc_call call;
    struct idalloc_result r;
    idalloc_call_init(&call);
    one_init(&o);
    cr_assert_eq(idalloc_pool_create_async(admin, "b", IDALLOC_POOL_BOUNDED,
                                           100, &call, one_done, &o),
                 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, 0, "%s", call.errmsg);
    cr_assert_eq(r.created, 1);
    cr_assert_eq(o.state, IDALLOC_CALL_DONE);
    one_init(&o);
    cr_assert_eq(idalloc_pool_create_async(admin, "s", IDALLOC_POOL_SEQUENCE, 0,
                                           NULL, one_done, &o),
                 0);
    cr_assert_eq(one_wait(&o).error, 0);
    one_init(&o);
    cr_assert_eq(idalloc_pool_create_async(admin, "p", IDALLOC_POOL_PREFIX, 0,
                                           NULL, one_done, &o),
                 0);
    cr_assert_eq(one_wait(&o).error, 0);

    one_init(&o);
    cr_assert_eq(idalloc_alloc_async(admin, "b", "x", &call, one_done, &o), 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, 0, "%s", call.errmsg);
    cr_assert_eq(r.id, 0);
    cr_assert_eq(r.existed, 0);
    uint64_t id;
    cr_assert_eq(idalloc_lookup(admin, "b", "x", &id, NULL), 0);
    cr_assert_eq(id, 0);
    one_init(&o);
    cr_assert_eq(idalloc_alloc_async(admin, "b", "x", NULL, one_done, &o), 0);
    r = one_wait(&o);
    cr_assert_eq(r.id, 0);
    cr_assert_eq(r.existed, 1, "the tag's id again");
    one_init(&o);
    cr_assert_eq(idalloc_lookup_async(admin, "b", "x", NULL, one_done, &o), 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, 0);
    cr_assert_eq(r.id, 0);

    one_init(&o);
    cr_assert_eq(idalloc_reserve_async(admin, "s", 10, NULL, one_done, &o), 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, 0);
    cr_assert_eq(r.count, 10);
    uint64_t first;
    cr_assert_eq(idalloc_reserve(admin, "s", 1, &first, NULL), 0);
    cr_assert_eq(first, r.id + 10, "the next block follows");

    one_init(&o);
    cr_assert_eq(idalloc_prefix_async(admin, "p", "t", NULL, one_done, &o), 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, 0);
    cr_assert_geq(r.prefix_len, 1);
    uint8_t pre[9];
    size_t plen;
    int existed;
    cr_assert_eq(idalloc_prefix(admin, "p", "t", pre, &plen, &existed, NULL),
                 0);
    cr_assert_eq(existed, 1);
    cr_assert_eq(plen, r.prefix_len);
    cr_assert_eq(memcmp(pre, r.prefix, plen), 0);

    one_init(&o);
    cr_assert_eq(idalloc_free_async(admin, "b", 0, "x", &call, one_done, &o),
                 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, 0, "%s", call.errmsg);
    cr_assert_eq(r.freed, 1);
    one_init(&o);
    cr_assert_eq(idalloc_lookup_async(admin, "b", "x", &call, one_done, &o), 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, IDA_ENOTFOUND);
    cr_assert_eq(idalloc_errclass(r.error), IDA_ERR_CLASS_DEFINITE);
    one_init(&o);
    cr_assert_eq(idalloc_reserve_async(admin, "nope", 1, &call, one_done, &o),
                 0);
    r = one_wait(&o);
    cr_assert_eq(r.error, IDA_ENOPOOL);
    cr_assert_eq(o.state, IDALLOC_CALL_DONE);
}

/* --- 1,200 calls in flight through a dead and a silent leader ------------
 * Each slot runs PER_SLOT operations one after the other from its
 * callbacks (allocs and reserves of 4 alternating), with a deadline shorter
 * than a failover: calls in flight when the leader dies or stops end
 * UNKNOWN and are repeated at once with their call struct (the same request
 * id) until they are answered; calls that were not carried out (NEW) are
 * sent afresh. */
#define SLOTS    1200
#define PER_SLOT 10
struct kop
{
    int rv;      /* final: 0, or the definite error that ended it */
    int reserve; /* else an alloc */
    uint64_t id; /* alloc: the id; reserve: the first of 4 */
    uint64_t seq0;
    struct idalloc_call call;
};
static struct kop kops[SLOTS][PER_SLOT];
struct kslot
{
    int s, i;
};
static struct kslot kslots[SLOTS];
static struct idalloc_client *worker;
static atomic_int ops_done, slots_done, in_flight, max_in_flight;
static atomic_int unknowns, not_carried, seq_changed, lost, refused;

static void kill_done(struct idalloc_client *cl,
                      struct idalloc_call *call,
                      const struct idalloc_result *res,
                      void *arg);

static void kill_submit(struct kslot *k)
{
    struct kop *o = &kops[k->s][k->i];
    char tag[32];
    snprintf(tag, sizeof(tag), "k%d-%d", k->s, k->i);
    int n = atomic_fetch_add(&in_flight, 1) + 1,
        m = atomic_load(&max_in_flight);
    while (n > m && !atomic_compare_exchange_weak(&max_in_flight, &m, n)) {
    }
    int rv =
        o->reserve
            ? idalloc_reserve_async(worker, "s", 4, &o->call, kill_done, k)
            : idalloc_alloc_async(worker, "b", tag, &o->call, kill_done, k);
    if (rv != 0) { /* no cr_assert off the test's thread */
        atomic_fetch_sub(&in_flight, 1);
        atomic_fetch_add(&refused, 1);
        o->rv = rv;
        atomic_fetch_add(&slots_done, 1);
    }
}

static void kill_next(struct kslot *k)
{
    atomic_fetch_add(&ops_done, 1);
    if (++k->i == PER_SLOT) {
        atomic_fetch_add(&slots_done, 1);
        return;
    }
    struct kop *o = &kops[k->s][k->i];
    idalloc_call_init(&o->call);
    o->reserve = (k->s + k->i) % 2;
    kill_submit(k);
}

static void kill_done(struct idalloc_client *cl,
                      struct idalloc_call *call,
                      const struct idalloc_result *res,
                      void *arg)
{
    (void)cl;
    struct kslot *k = arg;
    struct kop *o = &kops[k->s][k->i];
    atomic_fetch_sub(&in_flight, 1);
    if (res->error == 0) {
        if (o->seq0 != 0 && call->seq != o->seq0) {
            atomic_fetch_add(&seq_changed, 1);
        }
        o->rv = 0;
        o->id = res->id;
        kill_next(k);
    } else if (call->state == IDALLOC_CALL_UNKNOWN) {
        atomic_fetch_add(&unknowns, 1);
        if (o->seq0 == 0) {
            o->seq0 = call->seq;
        } else if (call->seq != o->seq0) {
            atomic_fetch_add(&seq_changed, 1);
        }
        kill_submit(k); /* the exact repeat */
    } else if (call->state == IDALLOC_CALL_NEW) {
        atomic_fetch_add(&not_carried, 1); /* not carried out: afresh */
        kill_submit(k);
    } else {
        /* DONE with a definite error, or LOST (IDA_ESESSION). */
        atomic_fetch_add(&lost, 1);
        o->rv = res->error;
        kill_next(k);
    }
}

Test(async_live,
     calls_in_flight_through_a_dead_and_a_silent_leader_resolve_by_repeat,
     .init = setup3,
     .fini = teardown,
     .timeout = 300)
{
    cr_assert_eq(idalloc_pool_create(admin, "b", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL, NULL),
                 0);
    cr_assert_eq(
        idalloc_pool_create(admin, "s", IDALLOC_POOL_SEQUENCE, 0, NULL, NULL),
        0);
    worker = tc_client(&c, 250); /* deadlines shorter than a failover */
    for (int s = 0; s < SLOTS; s++) {
        kslots[s] = (struct kslot){.s = s, .i = 0};
        idalloc_call_init(&kops[s][0].call);
        kops[s][0].reserve = s % 2;
    }
    for (int s = 0; s < SLOTS; s++) {
        kill_submit(&kslots[s]);
    }
    const int total = SLOTS * PER_SLOT;
    /* A third in: kill -9 the leader (a dead node; restarted at once). Two
     * thirds in: SIGSTOP the leader for 1.5 s (a silent node). */
    for (int round = 1; round <= 2; round++) {
        uint64_t end = tc_now_ms() + 120000;
        while (atomic_load(&ops_done) < total * round / 3 &&
               tc_now_ms() < end) {
            tc_sleep_ms(2);
        }
        int l = tc_wait_leader(&c, 10000);
        cr_assert_geq(l, 0);
        cr_log_info("round %d: %d of %d done, %d in flight; leader %d", round,
                    atomic_load(&ops_done), total, atomic_load(&in_flight),
                    l + 1);
        if (round == 1) {
            tc_signal(&c, l, SIGKILL);
            tc_spawn(&c, l);
        } else {
            tc_signal(&c, l, SIGSTOP);
            tc_sleep_ms(1500);
            tc_signal(&c, l, SIGCONT);
        }
    }
    uint64_t end = tc_now_ms() + 180000;
    while (atomic_load(&slots_done) < SLOTS && tc_now_ms() < end) {
        tc_sleep_ms(10);
    }
    cr_assert_eq(atomic_load(&slots_done), SLOTS, "%d slots still running",
                 SLOTS - atomic_load(&slots_done));
    cr_log_info(
        "max in flight %d; unknown outcomes %d (all repeated), not "
        "carried out %d",
        atomic_load(&max_in_flight), atomic_load(&unknowns),
        atomic_load(&not_carried));
    cr_assert_geq(atomic_load(&max_in_flight), 1000);
    cr_assert_eq(atomic_load(&refused), 0, "a submit was refused");
    cr_assert_eq(atomic_load(&lost), 0, "a call ended with an error or LOST");
    cr_assert_eq(atomic_load(&seq_changed), 0,
                 "a repeat must keep its request id");
    cr_assert_gt(atomic_load(&unknowns), 0,
                 "the kills produced no unknown outcome: the repeat path was "
                 "not exercised");
    uint64_t floor;
    size_t outstanding;
    ida__client_floor(worker, &floor, &outstanding);
    cr_assert_eq(outstanding, 0, "every call settled");
    /* A settled reserve repeated from another client object (as another
     * process would) gets its block, or IDA_ESESSION once the worker's
     * floor released it; never a second block. */
    int same = 0;
    for (int s = 0; s < SLOTS; s += 7) {
        struct kop *o = &kops[s][PER_SLOT - 1];
        if (!o->reserve) {
            o = &kops[s][PER_SLOT - 2];
        }
        struct idalloc_call again = o->call;
        again.state = IDALLOC_CALL_UNKNOWN;
        uint64_t first = 0;
        int rv = idalloc_reserve(admin, "s", 4, &first, &again);
        cr_assert(rv == 0 || rv == IDA_ESESSION, "%s (%s)", idalloc_errname(rv),
                  again.errmsg);
        if (rv == 0) {
            cr_assert_eq(first, o->id, "slot %d: a second block", s);
            same++;
        }
    }
    cr_log_info("reserves repeated from another client: %d same block", same);
    idalloc_client_free(worker);
    worker = NULL;
    /* No id twice, every tag holds the id it was answered, and the blocks
     * tile their range. */
    static uint64_t ids[SLOTS * PER_SLOT], firsts[SLOTS * PER_SLOT];
    int n = 0, nf = 0;
    for (int s = 0; s < SLOTS; s++) {
        for (int i = 0; i < PER_SLOT; i++) {
            if (kops[s][i].reserve) {
                firsts[nf++] = kops[s][i].id;
                continue;
            }
            char tag[32];
            uint64_t held;
            snprintf(tag, sizeof(tag), "k%d-%d", s, i);
            cr_assert_eq(idalloc_lookup(admin, "b", tag, &held, NULL), 0);
            cr_assert_eq(held, kops[s][i].id, "tag %s", tag);
            ids[n++] = kops[s][i].id;
        }
    }
    qsort(ids, (size_t)n, sizeof(uint64_t), cmp_u64);
    for (int i = 1; i < n; i++) {
        cr_assert_neq(ids[i], ids[i - 1], "id %llu twice",
                      (unsigned long long)ids[i]);
    }
    assert_tiled(firsts, nf, 4);
    uint64_t next;
    cr_assert_eq(idalloc_reserve(admin, "s", 4, &next, NULL), 0);
    cr_assert_eq(next, firsts[nf - 1] + 4, "a block past the last reported");
}

/* --- free() with calls in flight ----------------------------------------- */

#define FREE_CALLS 1000
struct fop
{
    struct idalloc_call call;
    atomic_int completions;
    int rv;
    uint64_t first;
    enum idalloc_call_state state;
};
static struct fop fops[FREE_CALLS];

static void free_done(struct idalloc_client *cl,
                      struct idalloc_call *call,
                      const struct idalloc_result *res,
                      void *arg)
{
    (void)cl;
    struct fop *o = arg;
    o->rv = res->error;
    o->first = res->id;
    o->state = call->state;
    atomic_fetch_add(&o->completions, 1);
}

Test(async_live,
     free_with_calls_in_flight_then_repeat_elsewhere,
     .init = setup3,
     .fini = teardown,
     .timeout = 120)
{
    cr_assert_eq(
        idalloc_pool_create(admin, "s", IDALLOC_POOL_SEQUENCE, 0, NULL, NULL),
        0);
    struct idalloc_client *cl = tc_client(&c, 5000);
    uint64_t warm;
    cr_assert_eq(idalloc_reserve(cl, "s", 4, &warm, NULL), 0);
    /* The leader stops (silent): the first half goes on the wire and waits
     * there; the second half is submitted right before free(), so much of
     * it is never sent. */
    int l = tc_wait_leader(&c, 10000);
    cr_assert_geq(l, 0);
    tc_signal(&c, l, SIGSTOP);
    for (int i = 0; i < FREE_CALLS; i++) {
        if (i == FREE_CALLS / 2) {
            tc_sleep_ms(100); /* within the first attempt (500 ms) */
        }
        idalloc_call_init(&fops[i].call);
        cr_assert_eq(idalloc_reserve_async(cl, "s", 4, &fops[i].call, free_done,
                                           &fops[i]),
                     0);
    }
    idalloc_client_free(cl);
    tc_signal(&c, l, SIGCONT);
    int ok = 0, unknown = 0, unsent = 0;
    for (int i = 0; i < FREE_CALLS; i++) {
        struct fop *o = &fops[i];
        cr_assert_eq(atomic_load(&o->completions), 1,
                     "call %d completed %d times by free()'s return", i,
                     atomic_load(&o->completions));
        if (o->rv == 0) {
            cr_assert_eq(o->state, IDALLOC_CALL_DONE);
            ok++;
        } else if (o->rv == IDA_ECLOSED) {
            cr_assert_eq(o->state, IDALLOC_CALL_UNKNOWN);
            cr_assert_neq(o->call.seq, 0, "an unknown call keeps its id");
            unknown++;
        } else {
            cr_assert_eq(o->rv, IDA_EUNAVAIL, "call %d: %s (%s)", i,
                         idalloc_errname(o->rv), o->call.errmsg);
            cr_assert_eq(o->state, IDALLOC_CALL_NEW);
            unsent++;
        }
    }
    cr_log_info("at free(): %d answered, %d unknown, %d never sent", ok,
                unknown, unsent);
    cr_assert_geq(unknown, FREE_CALLS / 2, "sent and unanswered: unknown");
    /* Settle them on another client object: the unknown ones by their
     * request id, the unsent ones afresh. */
    for (int i = 0; i < FREE_CALLS; i++) {
        struct fop *o = &fops[i];
        if (o->rv == 0) {
            continue;
        }
        int rv = idalloc_reserve(admin, "s", 4, &o->first, &o->call);
        cr_assert_eq(rv, 0, "call %d: %s (%s)", i, idalloc_errname(rv),
                     o->call.errmsg);
    }
    static uint64_t firsts[FREE_CALLS + 1];
    for (int i = 0; i < FREE_CALLS; i++) {
        firsts[i] = fops[i].first;
    }
    firsts[FREE_CALLS] = warm;
    assert_tiled(firsts, FREE_CALLS + 1, 4);
    uint64_t next;
    cr_assert_eq(idalloc_reserve(admin, "s", 4, &next, NULL), 0);
    cr_assert_eq(next, firsts[FREE_CALLS] + 4,
                 "a block was reserved and never reported");
}
