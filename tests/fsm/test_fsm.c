/* fsm/: pools, bad input, sessions, entries, processor protocol. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "tests/fsm/fsm_helpers.h"

/* --- fixture ------------------------------------------------------------- */

static struct ida_fsm *f;
static struct fx_batch b;
static uint64_t seq;
static uint64_t now_ms = 1000000;

/* The clients the tests use, registered at now_ms. */
static void register_clients(struct ida_fsm *g)
{
    static const uint64_t clients[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 99};
    for (size_t i = 0; i < sizeof(clients) / sizeof(clients[0]); i++) {
        fx_register(g, clients[i], now_ms);
    }
}

static void setup(void)
{
    cr_assert_eq(ida_fsm_new(&f), 0);
    seq = 0;
    fx_auto_ack = true;
    register_clients(f);
}

static void teardown(void)
{
    ida_heap_fault_set(0, 0);
    ida_fsm_free(f);
}

TestSuite(fsm, .init = setup, .fini = teardown);

/* --- helpers -------------------------------------------------------------- */

#define SEQ IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE
#define BND IDALLOC__POOL_KIND__POOL_KIND_BOUNDED
#define PFX IDALLOC__POOL_KIND__POOL_KIND_PREFIX

static struct ida_fsm_result create(const char *name,
                                    Idalloc__PoolKind kind,
                                    uint64_t size)
{
    fx_batch_init(&b, now_ms);
    fx_add_create(&b, 1, ++seq, name, kind, size);
    return fx_one(f, &b);
}

static struct ida_fsm_result alloc(const char *pool, const char *tag)
{
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 1, ++seq, pool, tag);
    return fx_one(f, &b);
}

static struct ida_fsm_result release(const char *pool,
                                     uint64_t id,
                                     const char *tag)
{
    fx_batch_init(&b, now_ms);
    fx_add_free(&b, 1, ++seq, pool, id, tag);
    return fx_one(f, &b);
}

static struct ida_fsm_result reserve(const char *pool, uint64_t count)
{
    fx_batch_init(&b, now_ms);
    fx_add_reserve(&b, 1, ++seq, pool, count);
    return fx_one(f, &b);
}

static struct ida_fsm_result prefix(const char *pool, const char *tag)
{
    fx_batch_init(&b, now_ms);
    fx_add_prefix(&b, 1, ++seq, pool, tag);
    return fx_one(f, &b);
}

#define assert_ok(r) \
    cr_assert_eq((r).error, 0, "error %d: %s", (r).error, (r).error_msg)
#define assert_err(r, code)                                             \
    do {                                                                \
        struct ida_fsm_result r_ = (r);                                 \
        cr_assert_eq(r_.error, (code), "want %d got %d (%s)", (code),   \
                     r_.error, r_.error_msg);                           \
        cr_assert_neq(r_.error_msg[0], '\0', "an error has a message"); \
    } while (0)

/* --- pools ------------------------------------------------------------------
 */

Test(fsm, create_is_idempotent_for_same_parameters)
{
    struct ida_fsm_result r = create("p", BND, 10);
    assert_ok(r);
    cr_assert_eq(r.op, IDA_FSM_OP_POOL_CREATE);
    cr_assert(r.flag, "first create creates");
    r = create("p", BND, 10);
    assert_ok(r);
    cr_assert_not(r.flag, "same parameters: created = false");
    assert_err(create("p", BND, 11), IDA_EPOOLEXISTS);
    assert_err(create("p", SEQ, 0), IDA_EPOOLEXISTS);
    cr_assert_eq(ida_fsm_pool_count(f), 1);
}

Test(fsm, create_rejects_bad_names_kinds_sizes)
{
    char longname[IDA_POOL_NAME_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_err(create(longname, SEQ, 0), IDA_EINVAL);
    longname[IDA_POOL_NAME_MAX] = '\0'; /* exactly the maximum: fine */
    assert_ok(create(longname, SEQ, 0));
    assert_err(create("", SEQ, 0), IDA_EINVAL);
    assert_err(create("has space", SEQ, 0), IDA_EINVAL);
    assert_err(create("slash/no", SEQ, 0), IDA_EINVAL);
    assert_err(create("k", IDALLOC__POOL_KIND__POOL_KIND_UNSPECIFIED, 0),
               IDA_EINVAL);
    assert_err(create("k", (Idalloc__PoolKind)9, 0), IDA_EINVAL);
    assert_err(create("k", BND, 0), IDA_EINVAL);
    assert_err(create("k", SEQ, 5), IDA_EINVAL);
    assert_err(create("k", PFX, 5), IDA_EINVAL);
    cr_assert_eq(ida_fsm_pool_count(f), 1, "rejected creates add nothing");
}

Test(fsm, unknown_pool_and_wrong_kind)
{
    assert_ok(create("s", SEQ, 0));
    assert_ok(create("b", BND, 4));
    assert_ok(create("x", PFX, 0));
    assert_err(alloc("nope", "t"), IDA_ENOPOOL);
    assert_err(release("nope", 0, "t"), IDA_ENOPOOL);
    assert_err(reserve("nope", 1), IDA_ENOPOOL);
    assert_err(prefix("nope", "t"), IDA_ENOPOOL);
    assert_err(alloc("s", "t"), IDA_EKIND);
    assert_err(alloc("x", "t"), IDA_EKIND);
    assert_err(release("s", 0, "t"), IDA_EKIND);
    assert_err(reserve("b", 1), IDA_EKIND);
    assert_err(reserve("x", 1), IDA_EKIND);
    assert_err(prefix("b", "t"), IDA_EKIND);
    assert_err(prefix("s", "t"), IDA_EKIND);
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "s", "t", &id), IDA_EKIND);
    cr_assert_eq(ida_fsm_lookup(f, "nope", "t", &id), IDA_ENOPOOL);
    cr_assert_eq(ida_fsm_lookup(f, "bad name", "t", &id), IDA_EINVAL);
    struct ida_fsm_holding h[IDA_LIST_LIMIT_MAX];
    size_t n;
    bool more;
    cr_assert_eq(ida_fsm_list(f, "x", false, 0, 0, h, &n, &more), IDA_EKIND);
    cr_assert_eq(ida_fsm_list(f, "zz", false, 0, 0, h, &n, &more), IDA_ENOPOOL);
    /* Within a batch the pool named last is compared first (fsm.c,
     * pool_of_cmd()): another kind, another name of its length, a longer
     * name and an unknown one still get their own answers. */
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 1, ++seq, "b", "t");
    fx_add_reserve(&b, 1, ++seq, "b", 1);
    fx_add_alloc(&b, 1, ++seq, "s", "t");
    fx_add_alloc(&b, 1, ++seq, "n", "t");
    fx_add_alloc(&b, 1, ++seq, "bb", "t");
    fx_add_reserve(&b, 1, ++seq, "s", 1);
    fx_add_alloc(&b, 1, ++seq, "b", "t");
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    cr_assert_eq(out.count, 7);
    assert_ok(out.replies[0].result);
    assert_err(out.replies[1].result, IDA_EKIND);
    assert_err(out.replies[2].result, IDA_EKIND);
    assert_err(out.replies[3].result, IDA_ENOPOOL);
    assert_err(out.replies[4].result, IDA_ENOPOOL);
    assert_ok(out.replies[5].result);
    assert_ok(out.replies[6].result);
    cr_assert(out.replies[6].result.flag, "t holds its id already");
    cr_assert_eq(out.replies[6].result.id, out.replies[0].result.id);
}

/* The pool named last is remembered with the state it belongs to: a state
 * restored in place of one that just used it answers from its own pools
 * (a remembered pool of the state replaced would be freed memory). */
Test(fsm, a_restored_state_answers_from_its_own_pools)
{
    assert_ok(create("b", BND, 4));
    struct ida_fsm_result r = alloc("b", "t0");
    assert_ok(r);
    cr_assert_eq(r.id, 0);
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    r = alloc("b", "t1");
    assert_ok(r);
    cr_assert_eq(r.id, 1);
    cr_assert_eq(ida_fsm_restore(f, snap, len), 0);
    ida_free(snap);
    r = alloc("b", "t2");
    assert_ok(r);
    cr_assert_eq(r.id, 1, "the restored pool holds t0 only");
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "b", "t1", &id), IDA_ENOTFOUND);
}

/* --- bounded -----------------------------------------------------------------
 */

Test(fsm, bounded_lowest_free_and_same_tag_same_id)
{
    assert_ok(create("b", BND, 100));
    for (uint64_t i = 0; i < 10; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "t%llu", (unsigned long long)i);
        struct ida_fsm_result r = alloc("b", tag);
        assert_ok(r);
        cr_assert_eq(r.id, i);
        cr_assert_not(r.flag);
    }
    struct ida_fsm_result r = alloc("b", "t3");
    assert_ok(r);
    cr_assert_eq(r.id, 3);
    cr_assert(r.flag, "existed");
    r = release("b", 3, "t3");
    assert_ok(r);
    cr_assert(r.flag, "freed");
    r = release("b", 3, "t3");
    assert_ok(r);
    cr_assert_not(r.flag, "a second free finds it free");
    r = release("b", 7, "t3");
    assert_err(r, IDA_ETAGMISMATCH);
    r = release("b", 50, "zzz");
    assert_ok(r);
    cr_assert_not(r.flag, "never-held id is already free");
    r = release("b", 100, "t1");
    assert_err(r, IDA_EINVAL);
    r = alloc("b", "new");
    cr_assert_eq(r.id, 3, "the freed id is the lowest free");
    uint64_t id = 99;
    cr_assert_eq(ida_fsm_lookup(f, "b", "new", &id), 0);
    cr_assert_eq(id, 3);
    cr_assert_eq(ida_fsm_lookup(f, "b", "t3", &id), IDA_ENOTFOUND);
    cr_assert_eq(ida_fsm_lookup(f, "b", "t7", &id), 0);
    cr_assert_eq(id, 7, "the mismatched free did not free 7");
}

Test(fsm, bounded_exhausted_is_an_error)
{
    assert_ok(create("b", BND, 3));
    assert_ok(alloc("b", "a"));
    assert_ok(alloc("b", "b"));
    assert_ok(alloc("b", "c"));
    assert_err(alloc("b", "d"), IDA_EEXHAUSTED);
    struct ida_fsm_result r = alloc("b", "b");
    assert_ok(r);
    cr_assert(r.flag, "an existing tag still gets its id when full");
    assert_ok(release("b", 1, "b"));
    r = alloc("b", "d");
    assert_ok(r);
    cr_assert_eq(r.id, 1);
}

Test(fsm, bounded_tags_bounded_and_checked)
{
    assert_ok(create("b", BND, 10));
    char tag[IDA_TAG_BYTES_MAX + 2];
    memset(tag, 'x', sizeof(tag) - 1);
    tag[sizeof(tag) - 1] = '\0';
    assert_err(alloc("b", tag), IDA_ETOOBIG);
    assert_err(release("b", 0, tag), IDA_ETOOBIG);
    assert_err(alloc("b", ""), IDA_EINVAL);
    tag[IDA_TAG_BYTES_MAX] = '\0';
    struct ida_fsm_result r = alloc("b", tag);
    assert_ok(r);
    cr_assert_eq(r.id, 0, "the first rejected allocs took nothing");
    cr_assert(ida_fsm_tag_valid(tag));
    cr_assert_not(ida_fsm_tag_valid(""));
}

/* A NUL byte inside a tag or a pool name is refused: proto `string`
 * fields used to cut it, so "alice\0evil" was alice's tag and "p\0q" created
 * p. A tag that is not UTF-8 is refused too (batches of version 2). Nothing
 * changes. */
Test(fsm, nul_bytes_and_bad_utf8_are_refused)
{
    static const char evil[] = "alice\0evil", pq[] = "p\0q";
    assert_ok(create("b", BND, 10));
    assert_ok(alloc("b", "alice"));
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 1, ++seq, "b", "x");
    b.op[0].alloc.tag =
        (ProtobufCBinaryData){sizeof(evil) - 1, (uint8_t *)evil};
    struct ida_fsm_result r = fx_one(f, &b);
    assert_err(r, IDA_EINVAL);
    cr_assert_str_eq(r.error_msg, "tag holds a NUL byte");
    fx_batch_init(&b, now_ms);
    fx_add_free(&b, 1, ++seq, "b", 0, "x");
    b.op[0].free.tag = (ProtobufCBinaryData){sizeof(evil) - 1, (uint8_t *)evil};
    assert_err(fx_one(f, &b), IDA_EINVAL);
    fx_batch_init(&b, now_ms);
    fx_add_create(&b, 1, ++seq, "x", SEQ, 0);
    b.op[0].create.name = (ProtobufCBinaryData){3, (uint8_t *)pq};
    r = fx_one(f, &b);
    assert_err(r, IDA_EINVAL);
    cr_assert(strstr(r.error_msg, "pool name") != NULL);
    cr_assert_eq(ida_fsm_pool_count(f), 1, "p was not created");
    fx_batch_init(&b, now_ms);
    fx_add_alloc(&b, 1, ++seq, "x", "bob");
    b.op[0].alloc.pool = (ProtobufCBinaryData){3, (uint8_t *)"b\0q"};
    assert_err(fx_one(f, &b), IDA_EINVAL);
    static const char *const bad_utf8[] = {"\xff",         "a\xc3",
                                           "\xc3\x28",     "\xc0\xaf",
                                           "\xed\xa0\x80", "\xf4\x90\x80\x80"};
    for (size_t i = 0; i < sizeof(bad_utf8) / sizeof(bad_utf8[0]); i++) {
        r = alloc("b", bad_utf8[i]);
        assert_err(r, IDA_EINVAL);
        cr_assert_str_eq(r.error_msg, "tag is not valid UTF-8");
        assert_err(prefix("b", bad_utf8[i]), IDA_EKIND);
    }
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "b", "alice", &id), 0);
    cr_assert_eq(id, 0, "alice keeps her id");
    cr_assert_eq(ida_fsm_lookup(f, "b", "\xff", &id), IDA_EINVAL);
    r = alloc("b", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x90\x8d");
    assert_ok(r);
    cr_assert_eq(r.id, 1, "the refused allocs took nothing");
    cr_assert_not(ida_fsm_tag_valid("\xff"));
    /* A batch of version 1 is applied with the rule it was written under
     * (any bytes but NUL), so an old log replays to the same state. */
    fx_batch_init(&b, now_ms);
    b.version = 1;
    fx_add_alloc(&b, 1, ++seq, "b", "\xff");
    r = fx_one(f, &b);
    assert_ok(r);
    cr_assert_eq(r.id, 2);
    fx_batch_init(&b, now_ms);
    b.version = 1;
    fx_add_alloc(&b, 1, ++seq, "b", "x");
    b.op[0].alloc.tag =
        (ProtobufCBinaryData){sizeof(evil) - 1, (uint8_t *)evil};
    assert_err(fx_one(f, &b), IDA_EINVAL);
}

/* The checks the node runs at its door: a reason for each rule, and a C
 * string of what was valid. */
Test(fsm, wire_names_and_tags_are_checked_and_copied)
{
    char name[IDA_POOL_NAME_MAX + 1], tag[IDA_TAG_BYTES_MAX + 1];
    char big[IDA_TAG_BYTES_MAX + 1];
    memset(big, 'x', sizeof(big));
    const char *why;
    ProtobufCBinaryData in = {4, (uint8_t *)"a.b:"};
    cr_assert_eq(ida_fsm_pool_name_get(&in, name, &why), 0);
    cr_assert_str_eq(name, "a.b:");
    in = (ProtobufCBinaryData){3, (uint8_t *)"p\0q"};
    cr_assert_eq(ida_fsm_pool_name_get(&in, name, &why), IDA_EINVAL);
    cr_assert(strstr(why, "pool name") != NULL);
    cr_assert_str_eq(name, "");
    in = (ProtobufCBinaryData){IDA_POOL_NAME_MAX + 1, (uint8_t *)big};
    cr_assert_eq(ida_fsm_pool_name_get(&in, name, &why), IDA_EINVAL);
    in = (ProtobufCBinaryData){IDA_POOL_NAME_MAX, (uint8_t *)big};
    cr_assert_eq(ida_fsm_pool_name_get(&in, name, &why), 0);
    in = (ProtobufCBinaryData){0, NULL};
    cr_assert_eq(ida_fsm_pool_name_get(&in, name, &why), IDA_EINVAL);
    cr_assert_eq(ida_fsm_tag_get(&in, tag, &why), IDA_EINVAL);
    cr_assert_str_eq(why, "tag must not be empty");
    in = (ProtobufCBinaryData){IDA_TAG_BYTES_MAX, (uint8_t *)big};
    cr_assert_eq(ida_fsm_tag_get(&in, tag, &why), 0);
    cr_assert_eq(strlen(tag), IDA_TAG_BYTES_MAX);
    in = (ProtobufCBinaryData){IDA_TAG_BYTES_MAX + 1, (uint8_t *)big};
    cr_assert_eq(ida_fsm_tag_get(&in, tag, &why), IDA_ETOOBIG);
    in = (ProtobufCBinaryData){10, (uint8_t *)"alice\0evil"};
    cr_assert_eq(ida_fsm_tag_get(&in, tag, &why), IDA_EINVAL);
    cr_assert_str_eq(why, "tag holds a NUL byte");
    in = (ProtobufCBinaryData){2, (uint8_t *)"\xc0\xaf"};
    cr_assert_eq(ida_fsm_tag_get(&in, tag, &why), IDA_EINVAL);
    cr_assert_str_eq(why, "tag is not valid UTF-8");
}

Test(fsm, bounded_huge_size_is_sparse)
{
    /* 2^40 and 2^64-1 ids: memory follows allocations, not the size. */
    assert_ok(create("huge", BND, UINT64_C(1) << 40));
    assert_ok(create("max", BND, UINT64_MAX));
    for (int i = 0; i < 5000; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "t%d", i);
        struct ida_fsm_result r = alloc(i % 2 ? "huge" : "max", tag);
        assert_ok(r);
        cr_assert_eq(r.id, (uint64_t)i / 2);
    }
    struct ida_fsm_result r = release("max", UINT64_MAX - 1, "t0");
    assert_ok(r);
    cr_assert_not(r.flag);
    r = release("huge", UINT64_C(1) << 40, "t1");
    assert_err(r, IDA_EINVAL);
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    cr_assert_lt(len, 200000, "snapshot grows with holdings: %zu", len);
    ida_free(snap);
}

Test(fsm, list_in_id_order_with_paging)
{
    assert_ok(create("b", BND, 10000));
    for (int i = 0; i < 5000; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "tag-%d", i);
        assert_ok(alloc("b", tag));
    }
    /* Free every third id so pages cross holes and chunk borders. */
    for (int i = 0; i < 5000; i += 3) {
        char tag[16];
        snprintf(tag, sizeof(tag), "tag-%d", i);
        assert_ok(release("b", (uint64_t)i, tag));
    }
    static struct ida_fsm_holding h[IDA_LIST_LIMIT_MAX];
    size_t n;
    bool more = true, has_after = false;
    uint64_t after = 0, seen = 0, expect = 1;
    while (more) {
        cr_assert_eq(ida_fsm_list(f, "b", has_after, after, 7, h, &n, &more),
                     0);
        cr_assert(n <= 7);
        for (size_t i = 0; i < n; i++) {
            if (expect % 3 == 0) {
                expect++;
            }
            cr_assert_eq(h[i].id, expect);
            char tag[16];
            snprintf(tag, sizeof(tag), "tag-%llu", (unsigned long long)expect);
            cr_assert_str_eq(h[i].tag, tag);
            expect++;
            seen++;
        }
        if (n > 0) {
            after = h[n - 1].id;
            has_after = true;
        }
        cr_assert(n == 7 || !more);
    }
    cr_assert_eq(seen, 5000 - 1667);
    /* Limits: 0 means the default, too large is clamped. */
    cr_assert_eq(ida_fsm_list(f, "b", false, 0, 0, h, &n, &more), 0);
    cr_assert_eq(n, IDA_LIST_LIMIT_DEFAULT);
    cr_assert(more);
    cr_assert_eq(ida_fsm_list(f, "b", false, 0, 100000, h, &n, &more), 0);
    cr_assert_eq(n, IDA_LIST_LIMIT_MAX);
    cr_assert_eq(ida_fsm_list(f, "b", true, UINT64_MAX, 5, h, &n, &more), 0);
    cr_assert_eq(n, 0);
    cr_assert_not(more);
}

/* --- sequence
 * ------------------------------------------------------------------- */

Test(fsm, sequence_blocks_never_overlap)
{
    assert_ok(create("s", SEQ, 0));
    uint64_t next = 1;
    for (uint64_t n = 1; n < 200; n += 7) {
        struct ida_fsm_result r = reserve("s", n);
        assert_ok(r);
        cr_assert_eq(r.op, IDA_FSM_OP_RESERVE);
        cr_assert_eq(r.id, next);
        cr_assert_eq(r.count, n);
        next += n;
    }
    assert_err(reserve("s", 0), IDA_EINVAL);
    assert_err(reserve("s", IDA_RESERVE_COUNT_MAX + 1), IDA_ETOOBIG);
    struct ida_fsm_result r = reserve("s", IDA_RESERVE_COUNT_MAX);
    assert_ok(r);
    cr_assert_eq(r.id, next, "rejected reserves took nothing");
}

/* Restore @f from a forged FsmState with one pool. */
static void forge_one_pool(Idalloc__PoolState *pool)
{
    Idalloc__FsmState m;
    idalloc__fsm_state__init(&m);
    m.version = IDA_FSM_STATE_VERSION;
    Idalloc__PoolState *pools[1] = {pool};
    m.n_pools = 1;
    m.pools = pools;
    m.applied_index = 7;
    size_t len;
    uint8_t *buf = fx_forge(&m, &len);
    cr_assert_eq(ida_fsm_restore(f, buf, len), 0);
    free(buf);
    cr_assert_eq(ida_fsm_applied_index(f), 7);
    register_clients(f); /* the forged state has no session */
}

Test(fsm, sequence_end_of_space_is_an_error)
{
    /* Reaching 2^64 by reserves takes 2^40 commands: start near the end
     * from a (valid, protobuf-c packed) snapshot instead. */
    Idalloc__PoolState p;
    Idalloc__SequenceState s;
    idalloc__pool_state__init(&p);
    idalloc__sequence_state__init(&s);
    p.name = "s";
    p.kind = SEQ;
    s.next = UINT64_MAX - 10;
    p.sequence = &s;
    forge_one_pool(&p);
    assert_err(reserve("s", 11), IDA_EEXHAUSTED);
    struct ida_fsm_result r = reserve("s", 10);
    assert_ok(r);
    cr_assert_eq(r.id, UINT64_MAX - 10);
    cr_assert_eq(r.count, 10, "the last block ends at UINT64_MAX");
    assert_err(reserve("s", 1), IDA_EEXHAUSTED);
}

/* --- prefix
 * --------------------------------------------------------------------- */

Test(fsm, prefix_encoding_and_idempotence)
{
    assert_ok(create("x", PFX, 0));
    struct ida_fsm_result a = prefix("x", "users");
    assert_ok(a);
    cr_assert_eq(a.op, IDA_FSM_OP_PREFIX_ALLOC);
    cr_assert_not(a.flag);
    /* First window is [0, 64): one length byte 1 and one value byte. */
    cr_assert_eq(a.prefix_len, 2);
    cr_assert_eq(a.prefix[0], 1);
    cr_assert_lt(a.prefix[1], 64);
    struct ida_fsm_result again = prefix("x", "users");
    assert_ok(again);
    cr_assert(again.flag);
    cr_assert_eq(again.prefix_len, a.prefix_len);
    cr_assert_eq(memcmp(again.prefix, a.prefix, a.prefix_len), 0);
    char tag[IDA_TAG_BYTES_MAX + 2];
    memset(tag, 'q', sizeof(tag) - 1);
    tag[sizeof(tag) - 1] = '\0';
    assert_err(prefix("x", tag), IDA_ETOOBIG);
    assert_err(prefix("x", ""), IDA_EINVAL);
}

static int cmp_bytes(const void *x_, const void *y_)
{
    return memcmp(x_, y_, IDA_PREFIX_BYTES_MAX);
}

/* 40000 prefixes cross every window size (64, 1024, 8192): none repeats
 * and none is a prefix of another. */
Test(fsm, prefix_never_repeats_and_is_prefix_free)
{
    enum { N = 40000 };
    assert_ok(create("x", PFX, 0));
    static uint8_t all[N][IDA_PREFIX_BYTES_MAX];
    static uint8_t lens[N];
    int per_len[10] = {0};
    for (int i = 0; i < N; i += FX_BATCH_MAX) {
        fx_batch_init(&b, now_ms);
        for (int j = i; j < i + FX_BATCH_MAX && j < N; j++) {
            char tag[16];
            snprintf(tag, sizeof(tag), "d%d", j);
            fx_add_prefix(&b, 1, ++seq, "x", tag);
        }
        struct ida_fsm_applied out;
        fx_apply(f, &b, &out);
        for (size_t k = 0; k < out.count; k++) {
            const struct ida_fsm_result *r = &out.replies[k].result;
            assert_ok(*r);
            cr_assert_not(r->flag);
            memset(all[i + (int)k], 0, IDA_PREFIX_BYTES_MAX);
            memcpy(all[i + (int)k], r->prefix, r->prefix_len);
            lens[i + (int)k] = r->prefix_len;
            cr_assert_eq(r->prefix[0] + 1, r->prefix_len);
            cr_assert(r->prefix_len == 2 || r->prefix[1] != 0, "minimal");
            per_len[r->prefix_len]++;
        }
    }
    cr_assert_gt(per_len[2], 0);
    cr_assert_gt(per_len[3], 0, "crossed into 2-byte values");
    /* Sorted, a prefix of another would sit right before an extension of
     * itself, so adjacent pairs suffice; zero padding cannot fake it since
     * the length byte differs for different lengths. */
    (void)lens;
    qsort(all, N, IDA_PREFIX_BYTES_MAX, cmp_bytes);
    for (int i = 1; i < N; i++) {
        cr_assert_neq(memcmp(all[i - 1], all[i], IDA_PREFIX_BYTES_MAX), 0,
                      "prefix repeated");
        size_t l = (size_t)all[i - 1][0] + 1;
        cr_assert_neq(memcmp(all[i - 1], all[i], l), 0,
                      "a prefix is a prefix of another");
    }
    /* HCA density: windows advance at half full, so the values used are
     * at most about twice the count. */
    uint64_t maxv = 0;
    for (int i = 0; i < N; i++) {
        uint64_t v = 0;
        for (int k = 1; k <= all[i][0]; k++) {
            v = (v << 8) | all[i][k];
        }
        maxv = v > maxv ? v : maxv;
    }
    cr_assert_lt(maxv, 2 * N + 8192 + 1024, "max value %llu",
                 (unsigned long long)maxv);
}

Test(fsm, prefix_same_log_same_choice)
{
    /* Two replicas fed the same entries pick the same candidates. */
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    register_clients(g);
    fx_batch_init(&b, now_ms);
    fx_add_create(&b, 1, 1, "x", PFX, 0);
    for (int i = 0; i < 100; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "r%d", i);
        fx_add_prefix(&b, 1, (uint64_t)i + 2, "x", tag);
    }
    struct ida_fsm_applied o1, o2;
    fx_apply(f, &b, &o1);
    fx_apply(g, &b, &o2);
    cr_assert_eq(o1.count, o2.count);
    for (size_t i = 0; i < o1.count; i++) {
        cr_assert_eq(memcmp(&o1.replies[i].result.prefix,
                            &o2.replies[i].result.prefix, IDA_PREFIX_BYTES_MAX),
                     0);
    }
    size_t l1, l2;
    uint8_t *s1 = fx_snapshot(f, &l1), *s2 = fx_snapshot(g, &l2);
    cr_assert_eq(l1, l2);
    cr_assert_eq(memcmp(s1, s2, l1), 0);
    ida_free(s1);
    ida_free(s2);
    ida_fsm_free(g);
}

/* Sessions: tests/fsm/test_fsm_sessions.c. */

/* --- entries and malformed input
 * ------------------------------------------------------ */

Test(fsm, noop_and_config_advance_index_only)
{
    ida_fsm_free(f); /* a fresh state machine, index 0 */
    cr_assert_eq(ida_fsm_new(&f), 0);
    struct ida_fsm_applied out;
    cr_assert_eq(ida_fsm_apply(f, 1, IDA_ENTRY_NOOP, NULL, 0, &out), 0);
    cr_assert_eq(
        ida_fsm_apply(f, 2, IDA_ENTRY_CONFIG, (const uint8_t *)"x", 1, &out),
        0);
    cr_assert_eq(out.count, 0);
    cr_assert_eq(ida_fsm_applied_index(f), 2);
    cr_assert_eq(ida_fsm_apply(f, 2, IDA_ENTRY_NOOP, NULL, 0, &out), IDA_EINVAL,
                 "an index twice");
    cr_assert_eq(ida_fsm_apply(f, 4, IDA_ENTRY_NOOP, NULL, 0, &out), IDA_EINVAL,
                 "a gap");
    cr_assert_eq(ida_fsm_apply(f, 3, (enum ida_entry_type)7, NULL, 0, &out),
                 IDA_EINVAL);
    cr_assert_eq(ida_fsm_applied_index(f), 2);
}

Test(fsm, malformed_batches_are_deterministic_noops)
{
    assert_ok(create("s", SEQ, 0));
    size_t l0;
    uint8_t *before = fx_snapshot(f, &l0);
    struct ida_fsm_applied out;
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12};
    ida_index i = ida_fsm_applied_index(f);
    cr_assert_eq(
        ida_fsm_apply(f, ++i, IDA_ENTRY_NORMAL, garbage, sizeof(garbage), &out),
        0);
    cr_assert_eq(out.entry_error, IDA_EPROTO);
    cr_assert_eq(out.count, 0);
    /* A valid batch of an unknown version. */
    Idalloc__CommandBatch m;
    idalloc__command_batch__init(&m);
    m.version = IDA_BATCH_VERSION + 1;
    uint8_t buf[16];
    size_t n = idalloc__command_batch__pack(&m, buf);
    cr_assert_eq(ida_fsm_apply(f, ++i, IDA_ENTRY_NORMAL, buf, n, &out), 0);
    cr_assert_eq(out.entry_error, IDA_EVERSION);
    /* Empty data: version 0. */
    cr_assert_eq(ida_fsm_apply(f, ++i, IDA_ENTRY_NORMAL, NULL, 0, &out), 0);
    cr_assert_eq(out.entry_error, IDA_EVERSION);
    cr_assert_eq(ida_fsm_applied_index(f), i);
    /* Only the applied index moved. */
    size_t l1;
    uint8_t *after = fx_snapshot(f, &l1);
    Idalloc__FsmState *a = idalloc__fsm_state__unpack(NULL, l0, before);
    Idalloc__FsmState *c = idalloc__fsm_state__unpack(NULL, l1, after);
    cr_assert_not_null(a);
    cr_assert_not_null(c);
    cr_assert_eq(c->applied_index, a->applied_index + 3);
    c->applied_index = a->applied_index;
    c->checksum = a->checksum = 0;
    uint8_t *pa = malloc(l0), *pc = malloc(l1);
    size_t na = idalloc__fsm_state__pack(a, pa);
    size_t nc = idalloc__fsm_state__pack(c, pc);
    cr_assert_eq(na, nc);
    cr_assert_eq(memcmp(pa, pc, na), 0);
    free(pa);
    free(pc);
    idalloc__fsm_state__free_unpacked(a, NULL);
    idalloc__fsm_state__free_unpacked(c, NULL);
    ida_free(before);
    ida_free(after);
}

Test(fsm, oversized_batch_is_a_noop)
{
    assert_ok(create("s", SEQ, 0));
    fx_batch_init(&b, now_ms);
    fx_add_reserve(&b, 3, 1, "s", 1);
    /* IDA_BATCH_COMMANDS_MAX + 1 copies of one command. */
    size_t n = IDA_BATCH_COMMANDS_MAX + 1;
    Idalloc__Command **many = malloc(n * sizeof(*many));
    for (size_t i = 0; i < n; i++) {
        many[i] = &b.cmd[0];
    }
    Idalloc__CommandBatch m;
    idalloc__command_batch__init(&m);
    m.version = IDA_BATCH_VERSION;
    m.n_commands = n;
    m.commands = many;
    size_t len = idalloc__command_batch__get_packed_size(&m);
    uint8_t *buf = malloc(len);
    idalloc__command_batch__pack(&m, buf);
    struct ida_fsm_applied out;
    ida_index i = ida_fsm_applied_index(f) + 1;
    cr_assert_eq(ida_fsm_apply(f, i, IDA_ENTRY_NORMAL, buf, len, &out), 0);
    cr_assert_eq(out.entry_error, IDA_ETOOBIG);
    cr_assert_eq(out.count, 0);
    cr_assert_eq(ida_fsm_applied_index(f), i);
    struct ida_fsm_result r = reserve("s", 1);
    cr_assert_eq(r.id, 1, "none of the commands acted");
    free(buf);
    free(many);
}

Test(fsm, malformed_commands_get_einval)
{
    assert_ok(create("s", SEQ, 0));
    fx_batch_init(&b, now_ms);
    fx_add_reserve(&b, 3, 1, "s", 1);
    b.cmd[0].op_case = IDALLOC__COMMAND__OP__NOT_SET; /* no op */
    fx_add_reserve(&b, 3, 2, "s", 1);
    b.cmd[1].client_id.len = 5;       /* short client id */
    fx_add_reserve(&b, 3, 0, "s", 1); /* seq 0 */
    fx_add_reserve(&b, 3, 3, "s", 1); /* fine */
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    assert_err(out.replies[0].result, IDA_EINVAL);
    assert_err(out.replies[1].result, IDA_EINVAL);
    assert_err(out.replies[2].result, IDA_EINVAL);
    assert_ok(out.replies[3].result);
    cr_assert_eq(out.replies[3].result.id, 1, "nothing else acted");
}

/* --- out of memory
 * ----------------------------------------------------------------------- */

/* Fail the Nth allocation for N = 0, 1, ... until an alloc goes through:
 * each failure is IDA_ENOMEM with the applied index unmoved; no leaks
 * (checked under ASan/valgrind). */
Test(fsm, enomem_on_every_allocation_path)
{
    assert_ok(create("b", BND, 100000));
    assert_ok(create("x", PFX, 0));
    const char *pools[2] = {"b", "x"};
    for (int k = 0; k < 2; k++) {
        for (int n = 0;; n++) {
            fx_batch_init(&b, now_ms);
            char tag[16];
            snprintf(tag, sizeof(tag), "m%d", n);
            fx_add_register(&b, 100 + (uint64_t)n, 1);
            if (k == 0) {
                fx_add_alloc(&b, 100 + (uint64_t)n, 2, pools[k], tag);
            } else {
                fx_add_prefix(&b, 100 + (uint64_t)n, 2, pools[k], tag);
            }
            size_t len;
            uint8_t *buf = fx_batch_pack(&b, &len);
            ida_index idx = ida_fsm_applied_index(f);
            struct ida_fsm_applied out;
            ida_heap_fault_set(n, 1);
            int rv =
                ida_fsm_apply(f, idx + 1, IDA_ENTRY_NORMAL, buf, len, &out);
            ida_heap_fault_set(0, 0);
            free(buf);
            if (rv == 0) {
                cr_assert_gt(n, 0, "the first allocation must matter");
                assert_ok(out.replies[0].result);
                assert_ok(out.replies[1].result);
                break;
            }
            cr_assert_eq(rv, IDA_ENOMEM);
            cr_assert_eq(ida_fsm_applied_index(f), idx);
            cr_assert_lt(n, 100);
        }
    }
}

/* No memory to decode an entry is IDA_ENOMEM, never "malformed". */
Test(fsm, enomem_while_decoding_is_not_a_malformed_entry)
{
    fx_batch_init(&b, now_ms);
    fx_add_create(&b, 1, 1, "s", SEQ, 0);
    size_t len;
    uint8_t *buf = fx_batch_pack(&b, &len);
    struct ida_fsm_applied out;
    ida_index i = ida_fsm_applied_index(f);
    ida_heap_fault_set(0, 1); /* the first allocation: the decode arena */
    int rv = ida_fsm_apply(f, i + 1, IDA_ENTRY_NORMAL, buf, len, &out);
    ida_heap_fault_set(0, 0);
    cr_assert_eq(rv, IDA_ENOMEM);
    cr_assert_eq(ida_fsm_applied_index(f), i);
    cr_assert_eq(ida_fsm_pool_count(f), 0);
    cr_assert_eq(ida_fsm_apply(f, i + 1, IDA_ENTRY_NORMAL, buf, len, &out), 0);
    cr_assert_eq(out.entry_error, 0);
    cr_assert(out.replies[0].result.flag);
    free(buf);
}
