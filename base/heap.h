/* Allocation through one door so tests can fail the Nth call.
 *
 * ida_malloc() and friends behave like their libc twins. Tests arm a fault
 * with ida_heap_fault_set(delay, repeat): the next @delay calls succeed, then
 * @repeat calls fail (return NULL), then all succeed again; repeat < 0 means
 * fail forever. The fault state is process-wide and atomic; it is a test hook
 * and disarmed by default (ida_heap_fault_set(0, 0)). */
#ifndef IDA_HEAP_H
#define IDA_HEAP_H

#include <stddef.h>

void *ida_malloc(size_t size);
void *ida_calloc(size_t count, size_t size);
void *ida_realloc(void *ptr, size_t size);
void ida_free(void *ptr);
/* Duplicate @len bytes of @src plus a terminating NUL. */
char *ida_strndup(const char *src, size_t len);

void ida_heap_fault_set(int delay, int repeat);

/* The size of a huge page (Linux transparent huge pages on x86-64 and
 * arm64 with 4 KiB pages): the unit of the hints here and of
 * base/collapse.h. */
#define IDA_HUGE_PAGE ((size_t)2 << 20)
/* A hint, no more: the @size bytes at @p (fresh from ida_calloc or
 * ida_malloc) are a large table read at random, so back them with huge
 * pages where the system allows (Linux transparent huge pages in
 * "madvise" mode). One TLB entry then covers 2 MiB instead of 4 KiB, which
 * halves the cost of a random probe into a table of hundreds of MB. Does
 * nothing for small blocks or where unsupported; contents are unchanged. */
void ida_heap_hint_huge(void *p, size_t size);

/* The whole pages inside the @size bytes at @p, every byte of which the
 * caller has zeroed and will only read until it frees the block, go back to
 * the system now; they still read as zero (an anonymous page given back is
 * mapped afresh, zeroed, when next read). A large table emptied a piece at
 * a time so gives its memory back a piece at a time, and its free() has
 * little left to unmap: unmapping 128 MB at once held the caller ~5 ms. */
void ida_heap_release_zeroed(void *p, size_t size);

/* ida_malloc() and the hint above, for a large block read or written at
 * random (a table of hundreds of MB, a slab of records, a snapshot read
 * back). Not aligned: a version that aligned such blocks to 2 MiB, so all
 * of each could be huge pages and not only the whole 2 MiB pages inside it,
 * made a restore of 10 M allocations into fresh memory (a restart's) about
 * a tenth slower, not faster (session 13's note: each huge page is found
 * and cleared whole at its first touch, compaction included). Freed with
 * ida_free(). */
void *ida_malloc_huge(size_t size);

/* ida_malloc() of @size bytes at an address that is a multiple of @align
 * (a power of two, at least sizeof(void *)); NULL when out of memory or
 * @align is not one. Freed with ida_free(). */
void *ida_malloc_aligned(size_t align, size_t size);
/* The out-of-memory policy.
 *
 * Code that can report ENOMEM does: the cores and storage return it and
 * leave their state as it was. Where a processor cannot go on without the
 * memory (a committed entry that must reach the fsm, a storage step the Raft
 * core waits for), dropping the work would stall or diverge the node, and
 * an assertion would call it a programmer error, which it is not. Such
 * places call ida_oom(): it writes one line naming @what to stderr (without
 * allocating) and ends the process with exit status IDA_OOM_EXIT. A node
 * loses nothing by it: everything it acknowledged is durable, and it rejoins
 * as after a crash when restarted. */
#define IDA_OOM_EXIT 70
_Noreturn void ida_oom(const char *what);

/* @expr must be a pointer or return code that says whether memory was had:
 * IDA_OOM_CHECK(p != NULL, "...") ends the process by ida_oom() when not. */
#define IDA_OOM_CHECK(ok, what) ((ok) ? (void)0 : ida_oom(what))

#endif /* IDA_HEAP_H */
