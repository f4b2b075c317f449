/* libidalloc against scripted servers on real loopback sockets: leader
 * hints, retries with the same request id, timeouts, dead nodes, garbage,
 * pipelining from many threads, and next() with one refill in flight. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "idalloc.h"
#include "src/client/testing.h"
#include "tests/client/fakeserver.h"

/* --- fixture ------------------------------------------------------------ */

/* --- tests -------------------------------------------------------------- */

Test(client, alloc_round_trip, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(1000, 5000);
    uint64_t id1, id2;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id1, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(call.state, IDALLOC_CALL_DONE);
    cr_assert_eq(call.seq, fx_srv[0].seen_seq[0]);
    cr_assert_eq(fx_srv[0].registers, 1, "the first write registers a session");
    cr_assert_eq(memcmp(fx_srv[0].registered, fx_srv[0].seen_client[0], 16), 0);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id2, NULL, NULL), 0);
    /* The fake answers 1000 + request_seq: distinct seqs, matched answers. */
    cr_assert_eq(id1, 1000 + fx_srv[0].seen_seq[0]);
    cr_assert_eq(id2, 1000 + fx_srv[0].seen_seq[1]);
    cr_assert_neq(fx_srv[0].seen_seq[0], fx_srv[0].seen_seq[1]);
}

Test(client, follows_not_leader_hint_with_same_request_id, .fini = fx_teardown)
{
    fx_start(2, FAKE_NOT_LEADER, FAKE_ANSWER, 0);
    strcpy(fx_srv[0].hint_addr, fx_srv[1].addr);
    fx_connect(1000, 5000);
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(fake_seen(&fx_srv[0]), 1);
    cr_assert_eq(fake_seen(&fx_srv[1]), 1);
    cr_assert_eq(fx_srv[0].seen_seq[0], fx_srv[1].seen_seq[0],
                 "same request_seq");
    cr_assert_eq(memcmp(fx_srv[0].seen_client[0], fx_srv[1].seen_client[0], 16),
                 0, "same client_id");
    /* The leader is remembered: the next call goes straight to it. */
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t2", &id, NULL, NULL), 0);
    cr_assert_eq(fake_seen(&fx_srv[0]), 1);
    cr_assert_eq(fake_seen(&fx_srv[1]), 2);
}

Test(client, silent_node_is_retried_elsewhere_with_same_id, .fini = fx_teardown)
{
    fx_start(2, FAKE_SILENT, FAKE_ANSWER, 0);
    fx_connect(100, 5000);
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(fake_seen(&fx_srv[0]), 1);
    cr_assert_eq(fx_srv[0].seen_seq[0], fx_srv[1].seen_seq[0]);
    cr_assert_eq(id, 1000 + fx_srv[0].seen_seq[0]);
}

/* An attempt's answer that comes after the attempt timed out, while the
 * call is at another node or waiting to try again, settles the call: the
 * node answers every attempt 100 ms late against a 30 ms attempt timeout,
 * so no answer comes while its own attempt is on. (Dropped, as before,
 * the call went round the three nodes until its deadline: a backup whose
 * 1 MiB chunks take longer than the attempt timeout never finished.) */
Test(client,
     an_answer_later_than_its_attempt_settles_the_call,
     .fini = fx_teardown)
{
    fx_start(3, FAKE_LATE, FAKE_SILENT, FAKE_SILENT);
    pthread_mutex_lock(&fx_srv[0].mu);
    fx_srv[0].late_ms = 100;
    pthread_mutex_unlock(&fx_srv[0].mu);
    fx_connect(30, 3000);
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_geq(fake_seen(&fx_srv[0]), 1);
    cr_assert_geq(fake_seen(&fx_srv[1]), 1, "the call moved on meanwhile");
    /* The silent servers may still be taking attempts: read under their
     * locks. */
    uint64_t seq0 = fake_seen_seq(&fx_srv[0], 0);
    uint64_t seq1 = fake_seen_seq(&fx_srv[1], 0);
    cr_assert_eq(id, 1000 + seq0);
    cr_assert_eq(seq1, seq0, "the attempts carry one request id");
}

Test(client, dead_address_is_skipped, .fini = fx_teardown)
{
    /* Server 0 is started and stopped at once: its port refuses. */
    fx_start(2, FAKE_ANSWER, FAKE_ANSWER, 0);
    fake_stop(&fx_srv[0]);
    char dead[64];
    strcpy(dead, fx_srv[0].addr);
    fake_start(&fx_srv[0], FAKE_ANSWER); /* keep the fixture symmetrical */
    struct idalloc_options o;
    idalloc_options_init(&o);
    char addrs[160];
    snprintf(addrs, sizeof(addrs), "%s,%s", dead, fx_srv[1].addr);
    o.addresses = addrs;
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, NULL), 0);
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(fake_seen(&fx_srv[1]), 1);
}

Test(client, all_silent_times_out_as_unknown, .fini = fx_teardown)
{
    fx_start(2, FAKE_SILENT, FAKE_SILENT, 0);
    fx_connect(50, 400);
    uint64_t t0 = fx_now_ms(), id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    int rv = idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call);
    uint64_t took = fx_now_ms() - t0;
    cr_assert_eq(rv, IDA_ETIMEDOUT);
    cr_assert_eq(idalloc_errclass(rv), IDA_ERR_CLASS_UNKNOWN);
    cr_assert_geq(took, 400, "gave up before the deadline");
    cr_assert_lt(took, 5000, "a call must not hang (took %llu ms)",
                 (unsigned long long)took);
    cr_assert(strstr(call.errmsg, "outcome unknown") != NULL, "%s",
              call.errmsg);
    cr_assert_eq(call.state, IDALLOC_CALL_UNKNOWN);
    cr_assert_eq(call.error, IDA_ETIMEDOUT);
    /* Every attempt carried the same request id. */
    cr_assert_geq(fake_seen(&fx_srv[0]) + fake_seen(&fx_srv[1]), 2);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < fake_seen(&fx_srv[i]); k++) {
            cr_assert_eq(fx_srv[i].seen_seq[k], fx_srv[0].seen_seq[0]);
        }
    }
}

Test(client, nothing_reachable_is_unavailable)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    /* Port 1 on loopback: nothing listens there. */
    o.addresses = "127.0.0.1:1";
    o.call_timeout_ms = 200;
    o.attempt_timeout_ms = 50;
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, NULL), 0);
    uint64_t id;
    int rv = idalloc_alloc(fx_cli, "p", "t", &id, NULL, NULL);
    cr_assert_eq(rv, IDA_EUNAVAIL, "got %s", idalloc_errname(rv));
    cr_assert_eq(idalloc_exit_code(rv), 3);
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
}

Test(client, definite_error_is_passed_through, .fini = fx_teardown)
{
    fx_start(1, FAKE_ERROR, 0, 0);
    fx_srv[0].error = IDA_EEXHAUSTED;
    fx_connect(1000, 5000);
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    int rv = idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call);
    cr_assert_eq(rv, IDA_EEXHAUSTED);
    cr_assert_eq(idalloc_errclass(rv), IDA_ERR_CLASS_DEFINITE);
    cr_assert_str_eq(call.errmsg, "scripted failure");
    cr_assert_eq(call.state, IDALLOC_CALL_DONE);
    cr_assert_eq(fake_seen(&fx_srv[0]), 1, "a definite answer is not retried");
}

Test(client,
     garbage_answer_drops_the_connection_and_retries,
     .fini = fx_teardown)
{
    fx_start(2, FAKE_GARBAGE, FAKE_ANSWER, 0);
    fx_connect(1000, 5000);
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(fx_srv[0].seen_seq[0], fx_srv[1].seen_seq[0]);
}

Test(client, bad_options_are_rejected)
{
    struct idalloc_options o;
    char err[IDALLOC_ERRMSG_MAX];
    idalloc_options_init(&o);
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), IDA_EINVAL);
    o.addresses = "localhost:7";
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), IDA_EINVAL);
    cr_assert(strstr(err, "bad address") != NULL, "%s", err);
    o.addresses = "127.0.0.1:7";
    o.config_path = "x.conf";
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), IDA_EINVAL);
    o.addresses = NULL;
    o.config_path = "/nonexistent/x.conf";
    cr_assert_neq(idalloc_client_new(&o, &fx_cli, err), 0);
    cr_assert(strstr(err, "/nonexistent/x.conf") != NULL, "%s", err);
    o.config_path = "cluster-configs/local-3.conf";
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), 0, "%s", err);
    cr_assert_eq(idalloc_node_count(fx_cli), 3);
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
}

/* --- many threads ----------------------------------------------------------
 */

#define THREADS 8
#define CALLS   300

static void *alloc_worker(void *arg)
{
    long bad = 0;
    (void)arg;
    for (int i = 0; i < CALLS; i++) {
        uint64_t id;
        if (idalloc_alloc(fx_cli, "p", "t", &id, NULL, NULL) != 0 ||
            id < 1000) {
            bad++;
        }
    }
    return (void *)bad;
}

Test(client, pipelined_calls_from_many_threads, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(2000, 10000);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        pthread_create(&t[i], NULL, alloc_worker, NULL);
    }
    long bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)r;
    }
    cr_assert_eq(bad, 0);
    cr_assert_eq(fake_seen(&fx_srv[0]), THREADS * CALLS);
    cr_assert_eq(fx_srv[0].nconns, 1, "one connection shared by all threads");
}

#define NEXT_PER_THREAD 20000
static uint64_t next_ids[4][NEXT_PER_THREAD];

static void *next_worker(void *arg)
{
    uint64_t *out = arg;
    for (int i = 0; i < NEXT_PER_THREAD; i++) {
        if (idalloc_next(fx_cli, "seq", &out[i], NULL) != 0) {
            return (void *)1;
        }
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

Test(client,
     next_from_threads_is_unique_with_one_refill_in_flight,
     .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(2000, 10000);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        pthread_create(&t[i], NULL, next_worker, next_ids[i]);
    }
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_null(r, "next failed");
    }
    static uint64_t all[4 * NEXT_PER_THREAD];
    memcpy(all, next_ids, sizeof(all));
    qsort(all, 4 * NEXT_PER_THREAD, sizeof(all[0]), cmp_u64);
    for (size_t i = 1; i < 4 * NEXT_PER_THREAD; i++) {
        cr_assert_neq(all[i], all[i - 1], "id %llu twice",
                      (unsigned long long)all[i]);
    }
    struct idalloc_next_stats st;
    cr_assert_eq(idalloc_next_stats(fx_cli, "seq", &st), 0);
    cr_assert_eq(st.handed_out, 4 * NEXT_PER_THREAD);
    cr_assert_eq(st.refills_max_in_flight, 1);
    cr_assert_eq(fake_seen(&fx_srv[0]), (int)st.refills,
                 "every refill is one reserve request");
    /* Blocks grew: far fewer refills than ids. */
    cr_assert_lt(st.refills, 200, "refills: %llu",
                 (unsigned long long)st.refills);
}

/* The per-thread runs of next() belong to their client: a new client on the
 * same thread (here, with the freed client's address likely reused) never
 * hands out the old client's leftover ids, and stats count what each
 * thread handed out after the thread is gone. */
Test(client, next_runs_belong_to_their_client, .fini = fx_teardown)
{
    fx_start(2, FAKE_ANSWER, FAKE_ANSWER, 0);
    fx_srv[1].next_block = 1u << 30;
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = fx_srv[0].addr;
    char err[IDALLOC_ERRMSG_MAX];
    struct idalloc_client *a = NULL;
    cr_assert_eq(idalloc_client_new(&o, &a, err), 0, "%s", err);
    uint64_t id;
    cr_assert_eq(idalloc_next(a, "seq", &id, NULL), 0);
    cr_assert_lt(id, 1u << 30);
    idalloc_client_free(a);
    o.addresses = fx_srv[1].addr;
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), 0, "%s", err);
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(idalloc_next(fx_cli, "seq", &id, NULL), 0);
        cr_assert_geq(id, 1u << 30, "id %llu came from the freed client",
                      (unsigned long long)id);
    }
    /* A pool of another name never shares a run. */
    cr_assert_eq(idalloc_next(fx_cli, "seq2", &id, NULL), 0);
    struct idalloc_next_stats st;
    cr_assert_eq(idalloc_next_stats(fx_cli, "seq", &st), 0);
    cr_assert_eq(st.handed_out, 100);
    cr_assert_eq(idalloc_next_stats(fx_cli, "seq2", &st), 0);
    cr_assert_eq(st.handed_out, 1);
}

static void set_mode(struct fake_server *s, enum fake_mode m)
{
    pthread_mutex_lock(&s->mu);
    s->mode = m;
    pthread_mutex_unlock(&s->mu);
}

Test(client, unknown_call_is_repeated_with_its_request_id, .fini = fx_teardown)
{
    fx_start(1, FAKE_SILENT, 0, 0);
    fx_connect(50, 300);
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t id, floor;
    size_t n;
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call),
                 IDA_ETIMEDOUT);
    cr_assert_eq(call.state, IDALLOC_CALL_UNKNOWN);
    uint64_t seq = call.seq;
    cr_assert_geq(fake_seen(&fx_srv[0]), 1); /* and reads seen_seq after it */
    cr_assert_eq(seq, fx_srv[0].seen_seq[0]);
    ida__client_floor(fx_cli, &floor, &n);
    cr_assert_eq(n, 1, "the unknown call's answer stays wanted");
    cr_assert_eq(floor, seq);
    set_mode(&fx_srv[0], FAKE_ANSWER);
    /* A fresh write meanwhile carries the unknown one's seq as its floor. */
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "u", &id, NULL, NULL), 0);
    int k = fake_seen(&fx_srv[0]) - 1;
    cr_assert_gt(fx_srv[0].seen_seq[k], seq);
    cr_assert_eq(fx_srv[0].seen_ack[k], seq, "floor below the unknown call");
    /* The repeat carries the same request id and settles the call. */
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    k = fake_seen(&fx_srv[0]) - 1;
    cr_assert_eq(fx_srv[0].seen_seq[k], seq, "the repeat carried the old id");
    cr_assert_eq(memcmp(fx_srv[0].seen_client[k], fx_srv[0].seen_client[0], 16),
                 0);
    cr_assert_eq(id, 1000 + seq);
    cr_assert_eq(call.state, IDALLOC_CALL_DONE);
    ida__client_floor(fx_cli, &floor, &n);
    cr_assert_eq(n, 0, "resolved: no answer wanted any more");
    cr_assert_gt(floor, seq);
    /* A DONE call struct used again is a fresh call. */
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call), 0);
    cr_assert_gt(call.seq, seq);
}

Test(client, released_call_lets_the_floor_rise, .fini = fx_teardown)
{
    fx_start(1, FAKE_SILENT, 0, 0);
    fx_connect(50, 300);
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t id, floor;
    size_t n;
    cr_assert_eq(idalloc_reserve(fx_cli, "s", 10, &id, &call), IDA_ETIMEDOUT);
    cr_assert_eq(idalloc_call_release(fx_cli, &call), 0);
    cr_assert_eq(call.state, IDALLOC_CALL_LOST);
    cr_assert_eq(idalloc_call_release(fx_cli, &call), IDA_EINVAL);
    ida__client_floor(fx_cli, &floor, &n);
    cr_assert_eq(n, 0);
    set_mode(&fx_srv[0], FAKE_ANSWER);
    cr_assert_eq(idalloc_reserve(fx_cli, "s", 10, &id, NULL), 0);
    int k = fake_seen(&fx_srv[0]) - 1;
    cr_assert_eq(fx_srv[0].seen_ack[k], fx_srv[0].seen_seq[k],
                 "nothing outstanding: the floor is the request itself");
}

Test(client, call_repeated_from_another_client_object, .fini = fx_teardown)
{
    fx_start(1, FAKE_SILENT, 0, 0);
    fx_connect(50, 300);
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t id;
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call),
                 IDA_ETIMEDOUT);
    char text[IDALLOC_CALL_ID_TEXT_MAX];
    cr_assert_eq(idalloc_call_format(&call, text), 0);
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
    /* The first object's registrations (more than one when its first
     * timed out, as under valgrind). */
    int registers = fx_srv[0].registers;
    cr_assert_geq(registers, 1);
    set_mode(&fx_srv[0], FAKE_ANSWER);
    /* As another process would: a new object, the id from its text. */
    struct idalloc_call again;
    cr_assert_eq(idalloc_call_parse(text, &again), 0);
    cr_assert_eq(again.state, IDALLOC_CALL_UNKNOWN);
    fx_connect(1000, 5000);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &again), 0, "%s",
                 again.errmsg);
    int k = fake_seen(&fx_srv[0]) - 1;
    cr_assert_eq(fx_srv[0].seen_seq[k], call.seq);
    cr_assert_eq(memcmp(fx_srv[0].seen_client[k], call.client_id, 16), 0);
    cr_assert_eq(fx_srv[0].seen_ack[k], 0, "no floor for another's session");
    cr_assert_eq(fx_srv[0].registers, registers,
                 "a repeat needs no session of its own");
    cr_assert_eq(id, 1000 + call.seq);
    /* Bad texts are refused. */
    struct idalloc_call bad;
    cr_assert_eq(idalloc_call_parse("", &bad), IDA_EINVAL);
    cr_assert_eq(idalloc_call_parse("00112233445566778899aabbccddeeff:0", &bad),
                 IDA_EINVAL);
    cr_assert_eq(idalloc_call_parse("00112233445566778899aabbccddeefg:1", &bad),
                 IDA_EINVAL);
    cr_assert_eq(
        idalloc_call_parse(
            "00112233445566778899aabbccddeeff:99999999999999999999", &bad),
        IDA_EINVAL);
    cr_assert_eq(
        idalloc_call_parse("00112233445566778899aabbccddeeff:1x", &bad),
        IDA_EINVAL);
    struct idalloc_call fresh;
    idalloc_call_init(&fresh);
    cr_assert_eq(idalloc_call_format(&fresh, text), IDA_EINVAL);
}

Test(client,
     expired_session_registers_anew_for_a_fresh_call,
     .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(1000, 5000);
    uint64_t id;
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "a", &id, NULL, NULL), 0);
    pthread_mutex_lock(&fx_srv[0].mu);
    fx_srv[0].expire_next = 1;
    pthread_mutex_unlock(&fx_srv[0].mu);
    struct idalloc_call call;
    idalloc_call_init(&call);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "b", &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(fx_srv[0].registers, 2, "a new session was registered");
    cr_assert_eq(fake_seen(&fx_srv[0]), 3);
    cr_assert_neq(
        memcmp(fx_srv[0].seen_client[1], fx_srv[0].seen_client[2], 16), 0,
        "sent again under the new session");
    cr_assert_eq(memcmp(call.client_id, fx_srv[0].seen_client[2], 16), 0);
    cr_assert_eq(id, 1000 + fx_srv[0].seen_seq[2]);
}

Test(client,
     expired_session_on_a_repeat_is_unknown_for_good,
     .fini = fx_teardown)
{
    fx_start(1, FAKE_SILENT, 0, 0);
    fx_connect(50, 300);
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t id, floor;
    size_t n;
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call),
                 IDA_ETIMEDOUT);
    pthread_mutex_lock(&fx_srv[0].mu);
    fx_srv[0].mode = FAKE_ANSWER;
    fx_srv[0].expire_next = 1;
    pthread_mutex_unlock(&fx_srv[0].mu);
    int rv = idalloc_alloc(fx_cli, "p", "t", &id, NULL, &call);
    cr_assert_eq(rv, IDA_ESESSION, "got %s", idalloc_errname(rv));
    cr_assert_eq(idalloc_errclass(rv), IDA_ERR_CLASS_UNKNOWN);
    cr_assert_eq(call.state, IDALLOC_CALL_LOST);
    cr_assert(strstr(call.errmsg, "expired") != NULL, "%s", call.errmsg);
    ida__client_floor(fx_cli, &floor, &n);
    cr_assert_eq(n, 0);
}

Test(client, options_of_another_size_are_refused)
{
    struct idalloc_options o;
    char err[IDALLOC_ERRMSG_MAX];
    idalloc_options_init(&o);
    cr_assert_eq(o.struct_size, sizeof(o));
    o.addresses = "127.0.0.1:7";
    o.struct_size = sizeof(o) + 8;
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), IDA_EINVAL);
    cr_assert(strstr(err, "struct_size") != NULL, "%s", err);
    o.struct_size = 0;
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), IDA_EINVAL);
    o.struct_size = sizeof(o);
    cr_assert_eq(idalloc_client_new(&o, &fx_cli, err), 0, "%s", err);
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
    cr_assert_eq(idalloc_api_version(), IDALLOC_API_VERSION);
}

/* The library refuses what the cluster would, with the rule in the error
 * detail, and sends nothing: tags 1-128 bytes of UTF-8, pool names 1-64 of
 * A-Za-z0-9._:- (a C string cannot hold a NUL byte: the node and the state
 * machine refuse one that a forged client sends, tests/cluster). */
Test(client, bad_names_and_tags_are_refused_before_sending, .fini = fx_teardown)
{
    fx_start(1, FAKE_ANSWER, 0, 0);
    fx_connect(1000, 5000);
    char tag[130], pool[66];
    memset(tag, 't', sizeof(tag));
    memset(pool, 'p', sizeof(pool));
    uint64_t id;
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint8_t pre[9];
    size_t plen;
    tag[129] = '\0';
    cr_assert_eq(idalloc_alloc(fx_cli, "p", tag, &id, NULL, &call),
                 IDA_ETOOBIG);
    cr_assert(strstr(call.errmsg, "at most 128") != NULL, "%s", call.errmsg);
    cr_assert_eq(idalloc_alloc(fx_cli, "p", "\xff", &id, NULL, &call),
                 IDA_EINVAL);
    cr_assert(strstr(call.errmsg, "not valid UTF-8") != NULL);
    cr_assert_eq(idalloc_free(fx_cli, "p", 0, "a\xc3", NULL, &call),
                 IDA_EINVAL);
    cr_assert_eq(idalloc_lookup(fx_cli, "p", "", &id, &call), IDA_EINVAL);
    cr_assert_eq(
        idalloc_prefix(fx_cli, "p", "\xed\xa0\x80", pre, &plen, NULL, &call),
        IDA_EINVAL);
    pool[65] = '\0';
    cr_assert_eq(idalloc_reserve(fx_cli, pool, 1, &id, &call), IDA_EINVAL);
    cr_assert(strstr(call.errmsg, "pool name must be") != NULL);
    cr_assert_eq(idalloc_pool_create(fx_cli, "a b", IDALLOC_POOL_SEQUENCE, 0,
                                     NULL, &call),
                 IDA_EINVAL);
    cr_assert_eq(fake_seen(&fx_srv[0]), 0, "nothing was sent");
    tag[128] = '\0';
    pool[64] = '\0';
    cr_assert_eq(idalloc_alloc(fx_cli, pool, tag, &id, NULL, &call), 0, "%s",
                 call.errmsg);
    cr_assert_eq(
        idalloc_alloc(fx_cli, "p", "\xc3\xa9t\xc3\xa9", &id, NULL, &call), 0);
    cr_assert_eq(fake_seen(&fx_srv[0]), 2);
}
