/* idalloc_next() block bookkeeping: one refill in flight, prefetch at half,
 * no id twice, block size adapting within bounds. */
#include <criterion/criterion.h>

#include "src/client/nextblock.h"

static struct ida_next_blocks b;

static void setup(void)
{
    ida_next_init(&b, 16, 1024);
}

Test(nextblock, first_take_waits_and_starts_one_refill, .init = setup)
{
    uint64_t id, want;
    cr_assert_eq(ida_next_take(&b, 0, &id, &want), IDA_NEXT_WAIT);
    cr_assert_eq(want, 16);
    for (int i = 0; i < 10; i++) {
        cr_assert_eq(ida_next_take(&b, 0, &id, &want), IDA_NEXT_WAIT);
        cr_assert_eq(want, 0, "a second refill while one is in flight");
    }
    ida_next_refilled(&b, 100, 16, 0);
    cr_assert_eq(ida_next_take(&b, 0, &id, &want), IDA_NEXT_OK);
    cr_assert_eq(id, 100);
    cr_assert_eq(b.refills, 1);
    cr_assert_eq(b.waits, 11);
}

Test(nextblock, prefetch_when_half_used_then_switch, .init = setup)
{
    uint64_t id, want;
    ida_next_take(&b, 0, &id, &want);
    ida_next_refilled(&b, 0, 16, 0);
    uint64_t asked_at = 0;
    for (uint64_t i = 0; i < 16; i++) {
        cr_assert_eq(ida_next_take(&b, 0, &id, &want), IDA_NEXT_OK);
        cr_assert_eq(id, i);
        if (want > 0) {
            cr_assert_eq(asked_at, 0, "only one prefetch per block");
            asked_at = i;
            ida_next_refilled(&b, 5000, want, 0);
        }
    }
    cr_assert_eq(asked_at, 7, "prefetch once half the block is used");
    /* The spare becomes current without waiting. */
    cr_assert_eq(ida_next_take(&b, 100, &id, &want), IDA_NEXT_OK);
    cr_assert_eq(id, 5000);
    cr_assert_eq(b.waits, 1, "only the very first call waited");
}

Test(nextblock, fast_use_grows_blocks_up_to_max, .init = setup)
{
    uint64_t id, want, next_first = 0, sizes[16];
    int n = 0;
    ida_next_take(&b, 0, &id, &want);
    for (int round = 0; round < 2000 && n < 16; round++) {
        if (want > 0) {
            sizes[n++] = want;
            ida_next_refilled(&b, next_first, want, 0);
            next_first += want;
        }
        ida_next_take(&b, 0, &id, &want); /* clock never moves: fast */
    }
    cr_assert_geq(n, 8);
    cr_assert_eq(sizes[0], 16);
    for (int i = 1; i < n; i++) {
        cr_assert_geq(sizes[i], sizes[i - 1]);
        cr_assert_leq(sizes[i], 1024);
    }
    cr_assert_eq(sizes[n - 1], 1024, "grows to the maximum");
}

Test(nextblock, slow_use_shrinks_blocks_to_min)
{
    ida_next_init(&b, 16, 1024);
    b.block_size = 1024;
    uint64_t id, want, now = 0, next_first = 0;
    ida_next_take(&b, now, &id, &want);
    uint64_t last_want = 0;
    for (int i = 0; i < 20000; i++) {
        if (want > 0) {
            last_want = want;
            ida_next_refilled(&b, next_first, want, now);
            next_first += want;
        }
        now += 1000; /* 1 s per id: even a minimum block lasts > 10 s */
        ida_next_take(&b, now, &id, &want);
    }
    cr_assert_eq(last_want, 16, "shrinks to the minimum, got %llu",
                 (unsigned long long)last_want);
}

Test(nextblock, failed_refill_allows_a_new_one, .init = setup)
{
    uint64_t id, want;
    cr_assert_eq(ida_next_take(&b, 0, &id, &want), IDA_NEXT_WAIT);
    cr_assert_gt(want, 0);
    ida_next_refill_failed(&b);
    cr_assert_eq(ida_next_take(&b, 0, &id, &want), IDA_NEXT_WAIT);
    cr_assert_gt(want, 0, "after a failure the next take retries");
    cr_assert_eq(b.refills, 2);
}

Test(nextblock, random_interleaving_never_repeats_an_id)
{
    /* Refills land after a random number of takes; blocks come from a
     * counter, so every id handed out must be distinct and covered. */
    static uint8_t seen[1 << 20];
    uint64_t x = 88172645463325252ull, next_first = 0, now = 0;
    uint64_t pending = 0, delay = 0, id, want;
    ida_next_init(&b, 4, 256);
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        now += x % 3;
        if (pending > 0 && delay-- == 0) {
            ida_next_refilled(&b, next_first, pending, now);
            next_first += pending;
            pending = 0;
        }
        enum ida_next_take_result r = ida_next_take(&b, now, &id, &want);
        if (want > 0) {
            cr_assert_eq(pending, 0, "two refills in flight");
            pending = want;
            delay = x % 40;
        }
        if (r == IDA_NEXT_OK) {
            cr_assert_lt(id, next_first, "id from no block");
            cr_assert_lt(id, sizeof(seen));
            cr_assert_eq(seen[id], 0, "id %llu twice", (unsigned long long)id);
            seen[id] = 1;
        }
    }
    cr_assert_gt(b.handed_out, 100000);
}

Test(nextblock, take_n_stays_inside_the_block_and_prefetches, .init = setup)
{
    uint64_t first, n, want, id;
    ida_next_take(&b, 0, &id, &want);
    ida_next_refilled(&b, 1000, 16, 0);
    cr_assert_eq(ida_next_take_n(&b, 0, 6, &first, &n, &want), IDA_NEXT_OK);
    cr_assert_eq(first, 1000);
    cr_assert_eq(n, 6);
    cr_assert_eq(want, 0, "10 left of 16: no prefetch yet");
    cr_assert_eq(ida_next_take_n(&b, 0, 6, &first, &n, &want), IDA_NEXT_OK);
    cr_assert_eq(first, 1006);
    cr_assert_gt(want, 0, "4 left: prefetch");
    cr_assert_eq(ida_next_take_n(&b, 0, 100, &first, &n, &want), IDA_NEXT_OK);
    cr_assert_eq(first, 1012);
    cr_assert_eq(n, 4, "never past the block's end");
    cr_assert_eq(ida_next_take_n(&b, 0, 1, &first, &n, &want), IDA_NEXT_WAIT);
    cr_assert_eq(n, 0);
    cr_assert_eq(b.handed_out, 16);
}
