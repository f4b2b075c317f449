/* Free-list multi-level allocator (seed 004 §2.1, §3.1).
 *
 * DESIGN
 *
 * Memory comes from the heap in segments (1 MiB, or more for a big request)
 * that are carved into blocks: [front control | data | back control]. The
 * front holds the data size, the list links, the block's offset in its
 * segment, the segment size and whether the allocator owns (= is free) the
 * block; the back points to the front so the block before a freed one can be
 * found. Free blocks sit in one list per level floor(log2(data size)).
 * Allocation takes a big enough block from the request's level or the first
 * non-empty higher level, splits off the rest as a new free block, and only
 * asks the heap for a new segment when no level has one. Free merges the
 * block with free neighbours in the same segment, then files it by its new
 * size. Segments go back to the heap only at ida_flalloc_close().
 *
 * Not thread-safe: one allocator per thread (the seed's thread_local
 * instance), and a block must be freed through the allocator (so the thread)
 * that allocated it. That is why the pool does NOT use it for message
 * buffers: a message is allocated by the sender's thread and freed by the
 * receiver's. tests/pool/bench_pool.c measures it against glibc malloc on a
 * one-thread pattern (the figures are in the module's README section).
 */
#ifndef IDA_POOL_FLALLOC_H
#define IDA_POOL_FLALLOC_H

#include <stddef.h>

#define IDA_FLALLOC_LEVELS        48
#define IDA_FLALLOC_SEGMENT_BYTES (1u << 20)

struct ida__flblock;
struct ida__flsegment;

struct ida_flalloc
{
    struct ida__flblock *lists[IDA_FLALLOC_LEVELS];
    struct ida__flsegment *segments;
    size_t segment_count;
};

/* Initialise an empty allocator. Returns 0 (cannot fail today; int for the
 * contract). */
int ida_flalloc_init(struct ida_flalloc *a);

/* Return every segment to the heap. Blocks still allocated become invalid. */
void ida_flalloc_close(struct ida_flalloc *a);

/* @size bytes (16-byte aligned), or NULL if @size is 0 or the heap is out
 * of memory (nothing changed then). */
void *ida_flalloc_alloc(struct ida_flalloc *a, size_t size);

/* Give back @ptr, which @a returned; NULL is ignored. */
void ida_flalloc_free(struct ida_flalloc *a, void *ptr);

/* Walk the free lists, checking each block's controls (asserts). Returns
 * the number of free blocks; @whole_out (if not NULL) gets how many of them
 * span a whole segment. For tests and statistics. */
size_t ida_flalloc_free_blocks(const struct ida_flalloc *a, size_t *whole_out);

#endif /* IDA_POOL_FLALLOC_H */
