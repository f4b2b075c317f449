/* The Restore command (`idalloc snapshot restore`): a backup's pools come
 * into an empty state machine, sequences moved on by advance_sequences; a
 * state machine with pools, a damaged state and an advance past the end of
 * a sequence are refused with nothing changed; the answer is kept like any
 * other (a retry gets it, snapshots carry it). */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "tests/fsm/fsm_helpers.h"

#define C1 1
#define C2 2

/* The source: a sequence at 101, a bounded pool with two holdings, a
 * prefix pool with one tag. Returns its snapshot bytes. */
static uint8_t *source_state(size_t *len, uint64_t *index)
{
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    fx_register(f, C1, 1000); /* writes need a session (fsm.h, Sessions) */
    struct fx_batch b;
    fx_batch_init(&b, 1000);
    fx_add_create(&b, C1, 1, "s", IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE, 0);
    fx_add_create(&b, C1, 2, "b", IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, 10);
    fx_add_create(&b, C1, 3, "p", IDALLOC__POOL_KIND__POOL_KIND_PREFIX, 0);
    fx_add_reserve(&b, C1, 4, "s", 100);
    fx_add_alloc(&b, C1, 5, "b", "alice");
    fx_add_alloc(&b, C1, 6, "b", "bob");
    fx_add_prefix(&b, C1, 7, "p", "x");
    struct ida_fsm_applied ap;
    fx_apply(f, &b, &ap);
    uint8_t *s = fx_snapshot(f, len);
    *index = ida_fsm_applied_index(f);
    ida_fsm_free(f);
    return s;
}

static struct ida_fsm_result restore(struct ida_fsm *f,
                                     uint64_t seq,
                                     const uint8_t *state,
                                     size_t len,
                                     uint64_t advance)
{
    struct fx_batch b;
    fx_batch_init(&b, 2000);
    /* A create gives the command its client id and seq; then it becomes a
     * Restore. */
    fx_add_create(&b, C2, seq, "unused", IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE,
                  0);
    static Idalloc__Restore r;
    idalloc__restore__init(&r);
    r.state.data = (uint8_t *)state;
    r.state.len = len;
    r.from_cluster = "old";
    r.from_index = 7;
    r.advance_sequences = advance;
    b.cmd[0].op_case = IDALLOC__COMMAND__OP_RESTORE;
    b.cmd[0].restore = &r;
    return fx_one(f, &b);
}

Test(fsm_restore, pools_come_over_with_sequences_advanced)
{
    size_t len;
    uint64_t idx;
    uint8_t *s = source_state(&len, &idx);
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    fx_register(f, C2, 2000);
    /* No acknowledgement floor: the retry below wants seq 1's answer kept
     * after seqs 2 and 3. */
    fx_auto_ack = false;
    struct ida_fsm_result r = restore(f, 1, s, len, 1000);
    cr_assert_eq(r.error, 0, "%s", r.error_msg);
    cr_assert_eq(r.op, IDA_FSM_OP_RESTORE);
    cr_assert_eq(r.id, 7);
    cr_assert_eq(r.count, 3);
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "b", "alice", &id), 0);
    cr_assert_eq(id, 0);
    cr_assert_eq(ida_fsm_lookup(f, "b", "bob", &id), 0);
    cr_assert_eq(id, 1);
    struct fx_batch b;
    fx_batch_init(&b, 3000);
    fx_add_reserve(&b, C2, 2, "s", 1);
    struct ida_fsm_result rr = fx_one(f, &b);
    cr_assert_eq(rr.error, 0);
    cr_assert_eq(rr.id, 101 + 1000, "the sequence was at 101, advanced 1000");
    fx_batch_init(&b, 3000);
    fx_add_alloc(&b, C2, 3, "b", "carol");
    rr = fx_one(f, &b);
    cr_assert_eq(rr.id, 2, "the next free id after the restored ones");

    /* A retry gets the kept answer, also after a snapshot round trip. */
    size_t slen;
    uint8_t *snap = fx_snapshot(f, &slen);
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_restore(g, snap, slen), 0);
    struct ida_fsm_result again = restore(g, 1, s, len, 1000);
    cr_assert(fx_result_eq(&again, &r));
    ida_free(snap);
    ida_fsm_free(g);
    ida_fsm_free(f);
    ida_free(s);
}

Test(fsm_restore, refused_with_nothing_changed)
{
    size_t len;
    uint64_t idx;
    uint8_t *s = source_state(&len, &idx);
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    fx_register(f, C2, 2000);

    /* Damaged state: every byte flipped in turn is refused. */
    for (size_t i = 0; i < len; i += 7) {
        s[i] ^= 0x40;
        struct ida_fsm_result r = restore(f, 1 + i, s, len, 0);
        s[i] ^= 0x40;
        cr_assert_eq(r.error, IDA_ECORRUPT, "byte %zu", i);
    }
    /* Past the end of a sequence. */
    struct ida_fsm_result r = restore(f, 100000, s, len, UINT64_MAX - 50);
    cr_assert_eq(r.error, IDA_EEXHAUSTED);
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "b", "alice", &id), IDA_ENOPOOL,
                 "nothing came in");

    /* Into a state machine with pools. */
    struct fx_batch b;
    fx_batch_init(&b, 3000);
    fx_add_create(&b, C2, 100001, "mine",
                  IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE, 0);
    cr_assert_eq(fx_one(f, &b).error, 0);
    r = restore(f, 100002, s, len, 0);
    cr_assert_eq(r.error, IDA_EEXIST);
    cr_assert_eq(ida_fsm_lookup(f, "b", "alice", &id), IDA_ENOPOOL);
    fx_batch_init(&b, 3000);
    fx_add_reserve(&b, C2, 100003, "mine", 1);
    cr_assert_eq(fx_one(f, &b).id, 1, "the cluster's own pool is as it was");
    ida_fsm_free(f);
    ida_free(s);
}

/* ida_fsm_import() (idallocd --import-backup): the pools of the backup, as
 * the Restore command brings them, into a new state machine that then
 * stands at the given index, with no session; refusals change nothing. */
Test(fsm_restore, import_seeds_a_new_state_machine)
{
    size_t len;
    uint64_t idx;
    uint8_t *s = source_state(&len, &idx);
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    cr_assert_eq(ida_fsm_import(f, s, len, 1000, 0), IDA_EINVAL, "index 0");
    /* Damaged, then past the end of a sequence: nothing comes in. */
    for (size_t i = 0; i < len; i += 5) {
        s[i] ^= 0x20;
        int rv = ida_fsm_import(f, s, len, 0, 1);
        s[i] ^= 0x20;
        cr_assert_eq(rv, IDA_ECORRUPT, "byte %zu", i);
    }
    cr_assert_eq(ida_fsm_import(f, s, len, UINT64_MAX - 50, 1), IDA_EEXHAUSTED);
    cr_assert_eq(ida_fsm_pool_count(f), 0);
    cr_assert_eq(ida_fsm_applied_index(f), 0);

    cr_assert_eq(ida_fsm_import(f, s, len, 1000, 1), 0);
    cr_assert_eq(ida_fsm_applied_index(f), 1);
    cr_assert_eq(ida_fsm_pool_count(f), 3);
    cr_assert_eq(ida_fsm_session_count(f), 0, "the old clients' sessions");
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "b", "alice", &id), 0);
    cr_assert_eq(id, 0);
    cr_assert_eq(ida_fsm_lookup(f, "b", "bob", &id), 0);
    cr_assert_eq(id, 1);
    /* Not new any more: refused, unchanged. */
    cr_assert_eq(ida_fsm_import(f, s, len, 0, 1), IDA_EINVAL);
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    fx_register(g, C1, 10);
    cr_assert_eq(ida_fsm_import(g, s, len, 0, 11), IDA_EINVAL,
                 "a state machine that applied entries");
    ida_fsm_free(g);

    /* The next entry applies at index 2 and sees the advanced sequence
     * and the restored holdings. */
    fx_register(f, C2, 2);
    struct fx_batch b;
    fx_batch_init(&b, 3);
    fx_add_reserve(&b, C2, 1, "s", 1);
    struct ida_fsm_result r = fx_one(f, &b);
    cr_assert_eq(r.error, 0, "%s", r.error_msg);
    cr_assert_eq(r.id, 101 + 1000, "the sequence was at 101, advanced 1000");
    fx_batch_init(&b, 4);
    fx_add_alloc(&b, C2, 2, "b", "carol");
    r = fx_one(f, &b);
    cr_assert_eq(r.id, 2, "the next free id after the imported ones");
    ida_fsm_free(f);
    ida_free(s);
}
