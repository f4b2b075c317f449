/* Block bookkeeping of idalloc_next(): pure, single-threaded, no clock.
 *
 * DESIGN (seed 003 and its pitfall): ids are handed out from the current
 * block [cur, cur_end). When half of it is used and no refill is pending, the
 * caller is told to start exactly one refill; its block is kept as the spare
 * and becomes current when the current block runs dry. A caller that finds
 * no id and a refill in flight waits for it instead of starting another, so
 * concurrent callers never waste blocks on parallel refills.
 *
 * The block size adapts within [min, max]: a block used up in under
 * IDA_NEXT_FAST_MS doubles the size of the next request, a block that lasted
 * over IDA_NEXT_SLOW_MS halves it. Time comes in as @now_ms.
 *
 * The caller serialises all calls (the client holds a mutex). handed_out
 * counts ids given to callers of take/take_n (next.c hands them on to
 * per-thread caches).
 */
#ifndef IDA_NEXTBLOCK_H
#define IDA_NEXTBLOCK_H

#include <stdint.h>

#define IDA_NEXT_FAST_MS 1000
#define IDA_NEXT_SLOW_MS 10000

struct ida_next_blocks
{
    uint64_t cur, cur_end;     /* ids ready to hand out */
    uint64_t spare, spare_end; /* a prefetched block, empty if equal */
    int refill_in_flight;
    uint64_t block_size, min, max;
    uint64_t block_started_ms; /* when the current block came into use */
    /* statistics */
    uint64_t handed_out, refills, waits;
};

/* @min and @max must satisfy 1 <= min <= max. */
void ida_next_init(struct ida_next_blocks *b, uint64_t min, uint64_t max);

enum ida_next_take_result {
    IDA_NEXT_OK = 0,   /* *id is set */
    IDA_NEXT_WAIT = 1, /* no id: wait for the refill in flight */
};

/* Take one id. When a refill must start now, *refill_count is set to the
 * number of ids to reserve (and the refill is marked in flight), else 0.
 * The caller must then call ida_next_refilled() or
 * ida_next_refill_failed() exactly once. */
enum ida_next_take_result ida_next_take(struct ida_next_blocks *b,
                                        uint64_t now_ms,
                                        uint64_t *id,
                                        uint64_t *refill_count);

/* Take up to @want ids (at least one; never more than the current block
 * holds): [*first, *first + *count). Same refill rule as ida_next_take(),
 * judged on the ids left after this take. */
enum ida_next_take_result ida_next_take_n(struct ida_next_blocks *b,
                                          uint64_t now_ms,
                                          uint64_t want,
                                          uint64_t *first,
                                          uint64_t *count,
                                          uint64_t *refill_count);

/* The refill in flight got [first, first + count). */
void ida_next_refilled(struct ida_next_blocks *b,
                       uint64_t first,
                       uint64_t count,
                       uint64_t now_ms);

/* The refill in flight failed; the next take may start another. */
void ida_next_refill_failed(struct ida_next_blocks *b);

#endif /* IDA_NEXTBLOCK_H */
