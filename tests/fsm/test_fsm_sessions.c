/* fsm/ sessions (fsm/fsm.h, "Sessions"): registration, first answers,
 * request fingerprints, the acknowledgement floor, bounds, expiry by log
 * time, and the session-table attack: nobody evicts an active session. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"
#include "tests/fsm/fsm_helpers.h"

static struct ida_fsm *f;
static struct fx_batch b;
static const uint64_t now_ms = 1000000;

#define SEQ IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE
#define BND IDALLOC__POOL_KIND__POOL_KIND_BOUNDED

static void setup(void)
{
    cr_assert_eq(ida_fsm_new(&f), 0);
    fx_auto_ack = false; /* these tests say what they acknowledge */
    fx_register(f, 1, now_ms);
    fx_batch_init(&b, now_ms);
    fx_add_create(&b, 1, 1, "s", SEQ, 0);
    fx_add_create(&b, 1, 2, "u", BND, 10);
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    cr_assert_eq(out.replies[0].result.error, 0);
    cr_assert_eq(out.replies[1].result.error, 0);
}

static void teardown(void)
{
    ida_heap_fault_set(0, 0);
    ida_fsm_free(f);
    fx_auto_ack = true;
}

TestSuite(sessions, .init = setup, .fini = teardown);

#define assert_ok(r) \
    cr_assert_eq((r).error, 0, "error %d: %s", (r).error, (r).error_msg)
#define assert_err(r, code)                                                   \
    cr_assert_eq((r).error, (code), "want %d got %d (%s)", (code), (r).error, \
                 (r).error_msg)

/* One reserve of @count from @client with @seq (and @ack) at @t. */
static struct ida_fsm_reply reserve_at(uint64_t t,
                                       uint64_t client,
                                       uint64_t seq,
                                       uint64_t count,
                                       uint64_t ack)
{
    struct ida_fsm_applied out;
    fx_batch_init(&b, t);
    fx_add_reserve(&b, client, seq, "s", count);
    b.cmd[0].ack_below = ack;
    fx_apply(f, &b, &out);
    return out.replies[0];
}

static struct ida_fsm_reply reserve1(uint64_t client,
                                     uint64_t seq,
                                     uint64_t count)
{
    return reserve_at(now_ms, client, seq, count, 0);
}

/* The first id the next reserve of "s" would get (asks as client 1 with a
 * fresh seq, so it costs one id). */
static uint64_t next_first(uint64_t *seq)
{
    struct ida_fsm_reply r = reserve1(1, ++*seq, 1);
    assert_ok(r.result);
    cr_assert_not(r.cached);
    return r.result.id;
}

Test(sessions, unregistered_client_is_never_executed)
{
    uint64_t seq = 100;
    uint64_t before = next_first(&seq);
    size_t sessions = ida_fsm_session_count(f);
    struct ida_fsm_reply r = reserve1(50, 1, 7);
    assert_err(r.result, IDA_EEXPIRED);
    cr_assert_not(r.cached);
    cr_assert_eq(ida_fsm_session_count(f), sessions, "no session created");
    cr_assert_eq(next_first(&seq), before + 1, "nothing was reserved");
    /* Registered, the same request runs; registering again changes
     * nothing and its answer is not kept. */
    fx_register(f, 50, now_ms);
    r = reserve1(50, 1, 7);
    assert_ok(r.result);
    fx_batch_init(&b, now_ms);
    fx_add_register(&b, 50, 1);
    struct ida_fsm_result reg = fx_one(f, &b);
    assert_ok(reg);
    cr_assert_eq(reg.op, IDA_FSM_OP_REGISTER);
    cr_assert_not(reg.flag, "the session existed");
    r = reserve1(50, 1, 7);
    cr_assert(r.cached, "registering again kept the session's answers");
}

Test(sessions, retry_returns_first_answer_and_does_not_act)
{
    fx_register(f, 7, now_ms);
    fx_batch_init(&b, now_ms);
    fx_add_reserve(&b, 7, 1, "s", 5);
    fx_add_alloc(&b, 7, 2, "u", "t");
    fx_add_free(&b, 7, 3, "u", 0, "t");
    fx_add_alloc(&b, 7, 4, "nope", "t"); /* an error is kept too */
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    struct ida_fsm_reply first[4];
    memcpy(first, out.replies, sizeof(first));
    for (int i = 0; i < 4; i++) {
        cr_assert_not(first[i].cached);
    }
    cr_assert(first[2].result.flag, "freed");
    /* Retry all four, in another order, in a later entry. */
    fx_batch_init(&b, now_ms + 10);
    fx_add_alloc(&b, 7, 4, "nope", "t");
    fx_add_free(&b, 7, 3, "u", 0, "t");
    fx_add_alloc(&b, 7, 2, "u", "t");
    fx_add_reserve(&b, 7, 1, "s", 5);
    fx_apply(f, &b, &out);
    for (int i = 0; i < 4; i++) {
        const struct ida_fsm_reply *r = &out.replies[3 - i];
        cr_assert(r->cached);
        cr_assert(fx_result_eq(&r->result, &first[i].result),
                  "command %d: same answer", i);
        cr_assert_eq(r->request_seq, first[i].request_seq);
    }
    /* Nothing acted twice: the tag is still free, the next block follows
     * the first one. */
    uint64_t id, seq = 100;
    cr_assert_eq(ida_fsm_lookup(f, "u", "t", &id), IDA_ENOTFOUND);
    cr_assert_eq(next_first(&seq), 6);
    /* Another client with the same seq is a different request. */
    fx_register(f, 8, now_ms);
    struct ida_fsm_reply r = reserve1(8, 1, 5);
    cr_assert_not(r.cached);
    cr_assert_eq(r.result.id, 7);
}

Test(sessions, replay_with_other_arguments_is_request_id_reused)
{
    fx_register(f, 7, now_ms);
    struct ida_fsm_reply first = reserve1(7, 1, 100);
    assert_ok(first.result);
    cr_assert_eq(first.result.id, 1);
    /* Same seq, other count / pool / operation: refused, nothing acts. */
    assert_err(reserve1(7, 1, 101).result, IDA_EREUSED);
    struct ida_fsm_applied out;
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 7, 1, "u", "x");
    fx_add_free(&b, 7, 1, "u", 0, "x");
    fx_add_create(&b, 7, 1, "s", SEQ, 0);
    fx_apply(f, &b, &out);
    for (int i = 0; i < 3; i++) {
        assert_err(out.replies[i].result, IDA_EREUSED);
        cr_assert_not(out.replies[i].cached);
    }
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "u", "x", &id), IDA_ENOTFOUND);
    /* The kept answer is untouched: the right replay still gets it. */
    struct ida_fsm_reply again = reserve1(7, 1, 100);
    cr_assert(again.cached);
    cr_assert(fx_result_eq(&again.result, &first.result));
    uint64_t seq = 100;
    cr_assert_eq(next_first(&seq), 101, "only the first reserve acted");
    /* A free replayed with another tag or id is another request too. */
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 7, 2, "u", "t");
    fx_add_free(&b, 7, 3, "u", 0, "t");
    fx_add_free(&b, 7, 3, "u", 0, "T");
    fx_add_free(&b, 7, 3, "u", 1, "t");
    fx_add_free(&b, 7, 3, "u", 0, "t");
    fx_apply(f, &b, &out);
    cr_assert(out.replies[1].result.flag, "freed");
    assert_err(out.replies[2].result, IDA_EREUSED);
    assert_err(out.replies[3].result, IDA_EREUSED);
    cr_assert(out.replies[4].cached);
}

Test(sessions, ack_floor_drops_the_answers_below_it)
{
    fx_register(f, 5, now_ms);
    for (uint64_t s = 1; s <= 10; s++) {
        assert_ok(reserve1(5, s, 1).result);
    }
    uint64_t kept = ida_fsm_results_count(f);
    /* seq 11 says: answers below 6 are no longer needed. */
    struct ida_fsm_reply r = reserve_at(now_ms, 5, 11, 1, 6);
    assert_ok(r.result);
    cr_assert_eq(ida_fsm_results_count(f), kept + 1 - 5);
    uint64_t seq = 100;
    uint64_t before = next_first(&seq);
    /* Below the floor: gone, and never executed again. */
    r = reserve1(5, 3, 1);
    assert_err(r.result, IDA_ESESSION);
    cr_assert_not(r.cached);
    r = reserve1(5, 5, 1);
    assert_err(r.result, IDA_ESESSION);
    /* At and above it: kept. A lower floor later changes nothing. */
    r = reserve_at(now_ms, 5, 6, 1, 2);
    cr_assert(r.cached);
    r = reserve1(5, 7, 1);
    cr_assert(r.cached);
    cr_assert_eq(next_first(&seq), before + 1, "no replay acted");
    /* A floor above the request's own seq is malformed. */
    r = reserve_at(now_ms, 5, 12, 1, 13);
    assert_err(r.result, IDA_EINVAL);
    r = reserve_at(now_ms, 5, 12, 1, 12);
    assert_ok(r.result);
    cr_assert_not(r.cached, "the malformed request did not act");
}

/* Reserves from @client with seqs 1..IDA_SESSION_RESULTS_MAX and no floor,
 * every answer kept: the session's bound. Returns the next seq. */
static uint64_t fill_answers(uint64_t client)
{
    struct ida_fsm_applied out;
    uint64_t s = 1;
    while (s <= IDA_SESSION_RESULTS_MAX) {
        fx_batch_init(&b, now_ms);
        for (int i = 0; i < FX_BATCH_MAX && s <= IDA_SESSION_RESULTS_MAX; i++) {
            fx_add_reserve(&b, client, s++, "s", 1);
        }
        fx_apply(f, &b, &out);
        for (size_t i = 0; i < out.count; i++) {
            assert_ok(out.replies[i].result);
        }
    }
    return s;
}

Test(sessions, answers_above_the_floor_are_bounded)
{
    fx_register(f, 6, now_ms);
    uint64_t s = fill_answers(6);
    uint64_t seq = 100;
    uint64_t before = next_first(&seq);
    /* The next one is refused; its refusal is kept like an answer, so a
     * duplicate of it never acts later either. */
    struct ida_fsm_reply r = reserve1(6, s, 1);
    assert_err(r.result, IDA_ELIMIT);
    r = reserve1(6, s, 1);
    cr_assert(r.cached);
    assert_err(r.result, IDA_ELIMIT);
    /* Acknowledging lets new requests in. */
    r = reserve_at(now_ms, 6, s + 1, 1, 512);
    assert_ok(r.result);
    cr_assert_eq(r.result.id, before + 1);
    /* A client that keeps going without a floor is refused, then loses
     * its session after IDA_SESSION_REFUSED_MAX refusals. */
    uint64_t t = s + 2, oks = 0;
    for (;; t++) {
        r = reserve1(6, t, 1);
        if (r.result.error != 0) {
            break;
        }
        oks++;
    }
    /* The bound, 511 dropped by the floor, one more (seq s + 1). */
    cr_assert_eq(oks,
                 IDA_SESSION_RESULTS_MAX - (IDA_SESSION_RESULTS_MAX - 511 + 1));
    int refused = 1; /* seq s above */
    while (r.result.error == IDA_ELIMIT) {
        refused++;
        r = reserve1(6, ++t, 1);
    }
    assert_err(r.result, IDA_EEXPIRED);
    cr_assert_eq(refused, IDA_SESSION_REFUSED_MAX);
    assert_err(reserve1(6, t + 1, 1).result, IDA_EEXPIRED);
    cr_assert_eq(next_first(&seq), before + 2 + oks,
                 "no refused request acted");
}

/* With both bounds full (every answer and every refusal kept), a command
 * whose floor drops one answer is executed and its answer kept: the floor
 * makes the room. (A review found it had none there once acks stopped
 * moving the answers down: every replica stopped on an assertion.) */
Test(sessions, a_floor_at_both_bounds_makes_room, .timeout = 60)
{
    fx_register(f, 6, now_ms);
    uint64_t s = fill_answers(6);
    for (int i = 0; i < IDA_SESSION_REFUSED_MAX; i++) {
        struct ida_fsm_reply q = reserve1(6, s++, 1);
        assert_err(q.result, IDA_ELIMIT);
    }
    struct ida_fsm_reply r = reserve_at(now_ms, 6, s, 1, 2);
    assert_ok(r.result);
    cr_assert_not(r.cached);
    uint64_t id = r.result.id;
    r = reserve_at(now_ms, 6, s, 1, 2);
    cr_assert(r.cached, "its answer was kept");
    cr_assert_eq(r.result.id, id);
    assert_err(reserve1(6, 1, 1).result, IDA_ESESSION);
}

Test(sessions, sessions_expire_by_log_time_only)
{
    fx_register(f, 20, now_ms);
    cr_assert_eq(reserve1(20, 1, 1).result.id, 1);
    /* A leader whose clock is behind does not move time back. */
    fx_register(f, 21, now_ms - 500000);
    cr_assert_eq(ida_fsm_now_ms(f), now_ms);
    /* NOOPs do not move time. */
    struct ida_fsm_applied o;
    cr_assert_eq(ida_fsm_apply(f, ida_fsm_applied_index(f) + 1, IDA_ENTRY_NOOP,
                               NULL, 0, &o),
                 0);
    /* Just before the TTL nothing expires; client 20 retries in time. */
    uint64_t late = now_ms + IDA_SESSION_TTL_MS - 1;
    fx_register(f, 22, late);
    cr_assert_eq(ida_fsm_session_count(f), 4);
    struct ida_fsm_reply r = reserve_at(late, 20, 1, 1, 0);
    cr_assert(r.cached);
    cr_assert_eq(r.result.id, 1);
    /* At the TTL, clients 1 and 21 (idle since now_ms) expire. */
    r = reserve_at(now_ms + IDA_SESSION_TTL_MS, 22, 1, 1, 0);
    assert_ok(r.result);
    cr_assert_eq(r.result.id, 2);
    cr_assert_eq(ida_fsm_session_count(f), 2);
    /* A too-late retry of client 21 is never executed. */
    r = reserve_at(now_ms + IDA_SESSION_TTL_MS, 21, 1, 1, 0);
    assert_err(r.result, IDA_EEXPIRED);
    r = reserve_at(now_ms + IDA_SESSION_TTL_MS, 22, 2, 1, 0);
    cr_assert_eq(r.result.id, 3, "the expired client's retry took nothing");
}

/* The attack of the session table: 65,537 requests from random client ids,
 * then 65,537 registrations, cannot make a replay of a reserve act twice
 * or a late retry of a free free the id its tag took again. */
Test(sessions, attack_cannot_evict_an_active_session, .timeout = 120)
{
    struct ida_fsm_applied out;
    /* The honest client 1: a block, then user:42 takes id 0, frees it and
     * takes it again (seqs 3-6). */
    struct ida_fsm_reply blk = reserve1(1, 3, 100);
    cr_assert_eq(blk.result.id, 1);
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 1, 4, "u", "user:42");
    fx_add_free(&b, 1, 5, "u", 0, "user:42");
    fx_add_alloc(&b, 1, 6, "u", "user:42");
    fx_apply(f, &b, &out);
    cr_assert_eq(out.replies[0].result.id, 0);
    cr_assert(out.replies[1].result.flag);
    cr_assert_eq(out.replies[2].result.id, 0);
    uint64_t first_free_answer_flag = out.replies[1].result.flag;
    /* 65,537 requests from random client ids: none is executed. */
    uint64_t rng = 0x9e3779b97f4a7c15;
    uint64_t attackers = 0;
    while (attackers < IDA_SESSIONS_MAX + 1) {
        fx_batch_init(&b, now_ms + 1000);
        for (int i = 0; i < FX_BATCH_MAX && attackers < IDA_SESSIONS_MAX + 1;
             i++, attackers++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            fx_add_reserve(&b, rng | (1ull << 63), 1, "s", 100);
        }
        fx_apply(f, &b, &out);
        for (size_t i = 0; i < out.count; i++) {
            assert_err(out.replies[i].result, IDA_EEXPIRED);
        }
    }
    cr_assert_eq(ida_fsm_session_count(f), 1);
    /* 65,537 registrations fill the table and are then refused. */
    int refused = 0;
    for (uint64_t c = 0; c < IDA_SESSIONS_MAX + 1;) {
        fx_batch_init(&b, now_ms + 2000);
        for (int i = 0; i < FX_BATCH_MAX && c < IDA_SESSIONS_MAX + 1;
             i++, c++) {
            fx_add_register(&b, 1000000 + c, 1);
        }
        fx_apply(f, &b, &out);
        for (size_t i = 0; i < out.count; i++) {
            refused += out.replies[i].result.error == IDA_ELIMIT;
        }
    }
    cr_assert_eq(ida_fsm_session_count(f), IDA_SESSIONS_MAX);
    cr_assert_eq(refused, 2, "the table held 1 + 65,535 of them");
    /* The honest client's replays get their first answers. */
    struct ida_fsm_reply r = reserve_at(now_ms + 3000, 1, 3, 100, 0);
    cr_assert(r.cached, "replay of the reserve");
    cr_assert_eq(r.result.id, 1, "[1,100], not a second block");
    fx_batch_init(&b, now_ms + 3000);
    fx_add_free(&b, 1, 5, "u", 0, "user:42");
    fx_apply(f, &b, &out);
    cr_assert(out.replies[0].cached, "the late free retry is a replay");
    cr_assert_eq(out.replies[0].result.flag, first_free_answer_flag);
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "u", "user:42", &id), 0,
                 "user:42 still holds its id");
    cr_assert_eq(id, 0);
    uint64_t seq = 100;
    cr_assert_eq(next_first(&seq), 101, "one block only");
    /* Once attackers idled IDA_SESSION_EVICT_IDLE_MS while client 1 kept
     * working, a registration drops an attacker's session, not client 1. */
    uint64_t t = now_ms + 2000 + IDA_SESSION_EVICT_IDLE_MS;
    r = reserve_at(t - 1, 1, ++seq, 1, 0);
    assert_ok(r.result);
    fx_register(f, 77, t);
    cr_assert_eq(ida_fsm_session_count(f), IDA_SESSIONS_MAX);
    r = reserve_at(t, 1, 3, 100, 0);
    cr_assert(r.cached, "client 1 kept its session");
}

Test(sessions, sessions_survive_snapshot_and_restore)
{
    fx_register(f, 7, now_ms);
    struct ida_fsm_reply a = reserve1(7, 10, 3);
    struct ida_fsm_reply c = reserve_at(now_ms, 7, 12, 4, 10);
    assert_ok(a.result);
    assert_ok(c.result);
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_restore(g, snap, len), 0);
    cr_assert_eq(ida_fsm_results_count(g), ida_fsm_results_count(f));
    /* Same bytes again: canonical, fingerprints included. */
    size_t len2;
    uint8_t *snap2 = fx_snapshot(g, &len2);
    cr_assert_eq(len2, len);
    cr_assert_eq(memcmp(snap, snap2, len), 0);
    ida_free(snap);
    ida_free(snap2);
    struct ida_fsm *keep = f;
    f = g;
    struct ida_fsm_reply r = reserve1(7, 10, 3);
    cr_assert(r.cached);
    cr_assert(fx_result_eq(&r.result, &a.result));
    assert_err(reserve1(7, 10, 4).result, IDA_EREUSED);
    r = reserve1(7, 12, 4);
    cr_assert(r.cached);
    cr_assert_eq(r.result.id, c.result.id);
    f = keep;
    ida_fsm_free(g);
}

/* Fingerprints are kept in snapshots (a session's answers): a command
 * answered before an upgrade must still be recognised after it. These
 * values were computed by the code that wrote the snapshots of earlier
 * versions (ida__hash_stable, FNV-1a); a change of hash fails here. */
Test(sessions, fingerprints_never_change)
{
    Idalloc__Command c = IDALLOC__COMMAND__INIT;
    Idalloc__Alloc a = IDALLOC__ALLOC__INIT;
    a.pool.data = (uint8_t *)"pool-a";
    a.pool.len = 6;
    a.tag.data = (uint8_t *)"order-12345";
    a.tag.len = 11;
    c.op_case = IDALLOC__COMMAND__OP_ALLOC;
    c.alloc = &a;
    cr_assert_eq(ida__fsm_fingerprint(&c), UINT64_C(0xc1a441ae36b6a3ac));
    Idalloc__Reserve r = IDALLOC__RESERVE__INIT;
    r.pool.data = (uint8_t *)"seq";
    r.pool.len = 3;
    r.count = 64;
    c.op_case = IDALLOC__COMMAND__OP_RESERVE;
    c.reserve = &r;
    cr_assert_eq(ida__fsm_fingerprint(&c), UINT64_C(0x352cc3476e41b178));
    /* The first step is written out for some operations: each must be the
     * stable hash of the seed's and the operation's 16 bytes. */
    for (int op = 0; op < 64; op++) {
        uint8_t k[16];
        for (int i = 0; i < 8; i++) {
            k[i] = (uint8_t)(UINT64_C(0x6964616c6c6f6331) >> (8 * i));
            k[8 + i] = (uint8_t)((uint64_t)op >> (8 * i));
        }
        cr_assert_eq(ida__fsm_fingerprint_start(op), ida__hash_stable(k, 16),
                     "operation %d", op);
    }
}

/* A client with many calls in flight acks on every command, so the answers
 * it keeps slide along (fsm_internal.h, struct ida__session: an ack moves
 * their start, a keep makes room at the end). Every answer in the window is
 * kept and found by a retry, none below it is, out-of-order arrivals
 * included, across the room being made many times and a snapshot. */
Test(sessions, a_sliding_window_of_answers_is_kept_exactly, .timeout = 60)
{
    enum { WINDOW = 100, CALLS = 3000 };
    static uint64_t first[CALLS + 1];
    fx_register(f, 9, now_ms);
    uint64_t kept0 = ida_fsm_results_count(f);
    for (uint64_t s = 1; s <= CALLS; s++) {
        /* Pairs arrive swapped (s+1 before s) half of the time. */
        uint64_t seq = s % 4 == 1 && s < CALLS ? s + 1 : s % 4 == 2 ? s - 1 : s;
        uint64_t ack = s > WINDOW ? s - WINDOW : 0;
        struct ida_fsm_reply r = reserve_at(now_ms, 9, seq, 1, ack);
        assert_ok(r.result);
        cr_assert_not(r.cached, "seq %llu ran once", (unsigned long long)seq);
        first[seq] = r.result.id;
        if (s == CALLS / 2) {
            size_t len;
            uint8_t *snap = fx_snapshot(f, &len);
            struct ida_fsm *g;
            cr_assert_eq(ida_fsm_new(&g), 0);
            cr_assert_eq(ida_fsm_restore(g, snap, len), 0);
            ida_free(snap);
            ida_fsm_free(f);
            f = g; /* the rest runs on the restored copy */
        }
        if (s % 97 == 0 || s == CALLS) {
            /* Everything from the floor up that has run is kept. */
            uint64_t lo = ack > 0 ? ack : 1;
            uint64_t kept = 0;
            for (uint64_t q = lo; q <= s + 1 && q <= CALLS; q++) {
                if (first[q] == 0) {
                    continue; /* its swapped pair has not run yet */
                }
                kept++;
                r = reserve_at(now_ms, 9, q, 1, ack);
                cr_assert(r.cached, "seq %llu in the window is kept",
                          (unsigned long long)q);
                cr_assert_eq(r.result.id, first[q]);
            }
            cr_assert_eq(ida_fsm_results_count(f), kept0 + kept);
            if (lo > 1) {
                r = reserve_at(now_ms, 9, lo - 1, 1, 0);
                assert_err(r.result, IDA_ESESSION);
            }
        }
    }
    const struct ida__session *s9 = f->lru_tail;
    cr_assert_leq(s9->cap, 4 * WINDOW, "memory follows the window (%u)",
                  s9->cap);
}
