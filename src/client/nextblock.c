#include "src/client/nextblock.h"

#include "base/assert.h"

void ida_next_init(struct ida_next_blocks *b, uint64_t min, uint64_t max)
{
    IDA_ASSERT(min >= 1 && min <= max);
    *b = (struct ida_next_blocks){.block_size = min, .min = min, .max = max};
}

/* A block is used up: adapt the size of the next request to how long it
 * lasted. */
static void adapt(struct ida_next_blocks *b, uint64_t now_ms)
{
    uint64_t lasted = now_ms - b->block_started_ms;
    if (lasted < IDA_NEXT_FAST_MS && b->block_size <= b->max / 2) {
        b->block_size *= 2;
    } else if (lasted < IDA_NEXT_FAST_MS) {
        b->block_size = b->max;
    } else if (lasted > IDA_NEXT_SLOW_MS && b->block_size / 2 >= b->min) {
        b->block_size /= 2;
    }
}

/* The current block ran dry: promote the spare. */
static void switch_to_spare(struct ida_next_blocks *b, uint64_t now_ms)
{
    adapt(b, now_ms);
    b->cur = b->spare;
    b->cur_end = b->spare_end;
    b->spare = b->spare_end = 0;
    b->block_started_ms = now_ms;
}

enum ida_next_take_result ida_next_take_n(struct ida_next_blocks *b,
                                          uint64_t now_ms,
                                          uint64_t want,
                                          uint64_t *first,
                                          uint64_t *count,
                                          uint64_t *refill_count)
{
    *refill_count = 0;
    *count = 0;
    if (want == 0) {
        want = 1;
    }
    if (b->cur == b->cur_end && b->spare != b->spare_end) {
        switch_to_spare(b, now_ms);
    }
    uint64_t avail = b->cur_end - b->cur;
    uint64_t take = avail < want ? avail : want;
    uint64_t left = avail - take;
    /* Prefetch once half the block is used, never two refills at once. */
    if (!b->refill_in_flight && b->spare == b->spare_end &&
        left <= b->block_size / 2) {
        b->refill_in_flight = 1;
        b->refills++;
        *refill_count = b->block_size;
    }
    if (take == 0) {
        b->waits++;
        return IDA_NEXT_WAIT;
    }
    *first = b->cur;
    *count = take;
    b->cur += take;
    b->handed_out += take;
    return IDA_NEXT_OK;
}

enum ida_next_take_result ida_next_take(struct ida_next_blocks *b,
                                        uint64_t now_ms,
                                        uint64_t *id,
                                        uint64_t *refill_count)
{
    uint64_t n;
    return ida_next_take_n(b, now_ms, 1, id, &n, refill_count);
}

void ida_next_refilled(struct ida_next_blocks *b,
                       uint64_t first,
                       uint64_t count,
                       uint64_t now_ms)
{
    IDA_ASSERT(b->refill_in_flight);
    IDA_ASSERT(count > 0 && first + count > first);
    b->refill_in_flight = 0;
    if (b->cur == b->cur_end) {
        /* Callers ran dry before the refill came: the block was too small
         * (the very first block has nothing to adapt to). */
        if (b->handed_out > 0) {
            adapt(b, now_ms);
        }
        b->cur = first;
        b->cur_end = first + count;
        b->block_started_ms = now_ms;
    } else {
        IDA_ASSERT(b->spare == b->spare_end);
        b->spare = first;
        b->spare_end = first + count;
    }
}

void ida_next_refill_failed(struct ida_next_blocks *b)
{
    IDA_ASSERT(b->refill_in_flight);
    b->refill_in_flight = 0;
}
