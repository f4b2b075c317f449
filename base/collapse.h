/* Huge pages for large blocks already written: a background thread that
 * collapses them (Linux madvise(MADV_COLLAPSE), 6.1 and later).
 *
 * WHY. A large table or slab block that the fsm fills a command at a time
 * is faulted in 4 KiB pages (base/heap.h: a huge page faulted on first
 * touch cost a command 5 to 11 ms here), then hinted for huge pages once
 * written. The hint leaves the work to khugepaged, which scans 4096 pages
 * every 10 s by default: a 256 MB table waits minutes. Until then:
 *   - every fork() of a snapshot child (src/node/bgsnap.h) copies a page
 *     table entry per 4 KiB page and takes a reference on each page, while
 *     the fsm processor waits: 11 to 39 ms for 900 MB here, under 1 ms
 *     once the same memory is huge (issue 19 allows 10 ms);
 *   - every probe of a grown tag table misses the TLB (bench_fsm's lookup
 *     rows ran 20 to 40% slower right after a growth).
 * So a node runs this thread: blocks handed to ida_heap_settle_huge() are
 * queued instead of hinted; the thread collapses them 2 MiB at a time.
 *
 * SWEEPS. The fsm's tables and slabs are not all a fork copies: malloc's
 * heaps (the fsm's chunks of ids, the Raft log's entries, buffers) were a
 * third to a half of a node's memory, in 4 KiB pages. So once nothing was
 * queued for a while, the thread sweeps: it queues every private anonymous
 * writable mapping of the process (/proc/self/smaps) that holds a 2 MiB
 * piece's worth of small pages and is not sparse (IDA_COLLAPSE_SPARSE: a
 * sanitizer's shadow is terabytes with megabytes in memory, and walking it
 * a piece at a time took minutes), and collapses each 2 MiB piece of them
 * that is in memory (SAFETY). A piece already huge costs an ioctl
 * (WARMING); a piece with more pages not in memory than SAFETY
 * allows (free heap given back, a stack's unused part) costs a mincore()
 * and is left alone.
 *
 * COST AND PACE. A collapse allocates a huge page and copies the 512 small
 * ones into it holding the process's memory map lock, and the mapping's,
 * for writing: meanwhile a fork(), an mmap() or munmap(), and a fault in
 * that mapping (the 2 MiB being copied are unmapped) wait for it. It took
 * 0.6 to 0.8 ms when the system had a huge page at hand, 10 to 20 ms here
 * when this virtual machine's host had to back the page first (WARMING).
 * khugepaged's collapses take the same locks for the same work; this
 * thread does that work sooner, and paced: after each collapse it sleeps
 * IDA_COLLAPSE_REST times as long as the collapse took (at least 20 us),
 * so it holds the locks at most a fifth of the time, and whoever waits,
 * waits for one collapse at most. The fsm processor does wait now and
 * then, at an mmap, munmap or madvise of its own (a new slab block, a
 * table growing and giving its old table back, malloc growing its heap).
 * Against it: a snapshot child's fork held the processor 20 to 37 ms at
 * 10 M before, at most 9.1 ms with this pace (make bench-scale), and
 * probes of a grown table miss the TLB no more. Paced four times slower,
 * forks went back up to 19.4 ms: what the collapser has not reached by a
 * fork, the fork copies.
 *
 * WARMING. The slow collapses were the host's work, done under the lock:
 * the guest kernel handed the collapse a huge page of memory the host had
 * never backed, and the copy into it faulted on the host. So before each
 * collapse the thread faults a huge page into a mapping of its own and
 * gives it straight back (MADV_DONTNEED): the host's work is done there,
 * under no lock anyone else takes but that mapping's, and the page goes
 * back to this CPU's free list, where the collapse's allocation finds it.
 * Collapsing 10 GB in 4 KiB pages here, one piece after another: without
 * it 789 of 5000 collapses took over 5 ms (10 over 10 ms, the slowest
 * 18.4 ms); with it 22 and 47 in two runs (2 and 3 over 10 ms, the
 * slowest 10.7 ms), 0.5 to 0.8 ms on average, the warming 1.6 to 2 ms.
 * A piece found huge already (the PAGEMAP_SCAN ioctl of
 * /proc/self/pagemap, Linux 6.7) is neither warmed for nor asked again,
 * so a sweep over memory mostly huge costs an ioctl a piece; without that
 * ioctl every piece in memory is warmed for.
 *
 * SAFETY. A collapse never changes what memory reads: a range freed, or
 * handed to someone else, between the queueing and the collapse is still
 * collapsed correctly, or refused (unmapped: ENOMEM), and either is
 * harmless. What must not happen is filling holes: a collapse maps a whole
 * huge page, so 2 MiB of a table whose pages were given back
 * (ida_heap_release_zeroed()) would take memory again. A 2 MiB piece is
 * therefore collapsed only when mincore() finds all of its pages in memory
 * just before, but for IDA_COLLAPSE_HOLES_MAX (a page given back between
 * the two costs at most that 2 MiB once, never contents). The few holes
 * allowed are a heap's: malloc's padding between two aligned blocks is
 * 2 MiB of small allocations with a page or two never touched, and a
 * sweep (below) found hundreds of such pieces. Memory is given back in
 * larger runs (64 KiB at the least in tagtab.c, 16 pages), so at most
 * 32 KiB a piece is taken again for them. khugepaged itself fills up to
 * 511 missing pages of 512 by default.
 *
 * FORK. A fork() takes the memory map lock for writing too, so it would
 * wait for a collapse under way (up to 20 ms here). The fsm processor
 * pauses the collapser around each fork of a child (ida_collapse_pause():
 * a snapshot's, src/node/fsm_proc.c; a backup's copy,
 * src/node/backup_copy.c), and when a collapse is under way it forks a
 * batch later instead. (In a 10 M fill without the
 * pause, one fork of 23 held the processor 24.8 ms, the others 1.2 to
 * 7 ms.)
 *
 * THREADS AND FORK. ida_heap_settle_huge() may be called from any thread;
 * it takes a mutex the collapser holds only to pop a range, never across a
 * madvise. A child forked while the thread ran (a snapshot child) has no
 * collapser: its calls only hint, never touch the mutex the fork copied.
 *
 * Without ida_collapse_start() (tests, tools, a kernel without
 * MADV_COLLAPSE, a cluster file with "huge_page_collapse off")
 * ida_heap_settle_huge() is ida_heap_hint_huge(). The node's metrics
 * show what the collapser did (idalloc_huge_page_*, from
 * ida_collapse_stats()). */
#ifndef IDA_BASE_COLLAPSE_H
#define IDA_BASE_COLLAPSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The collapser sleeps this many times as long as each collapse took. */
#define IDA_COLLAPSE_REST 4
/* Pages of a 2 MiB piece that may be missing from memory (SAFETY). */
#define IDA_COLLAPSE_HOLES_MAX 8
/* Ranges waiting at most; a range more is only hinted (khugepaged's). */
#define IDA_COLLAPSE_QUEUE 1024
/* A sweep leaves alone a mapping larger than this many times the memory
 * it holds (SWEEPS). */
#define IDA_COLLAPSE_SPARSE 16
/* Idle this long, the collapser sweeps (ida_collapse_start()): the
 * default of ida_collapse_sweep_ms, which tests lower. */
#define IDA_COLLAPSE_SWEEP_MS 5000
extern unsigned ida_collapse_sweep_ms;

/* Start the thread; with @sweeps, it also sweeps the process whenever
 * nothing was queued for ida_collapse_sweep_ms (SWEEPS above). 0; ENOSYS
 * when this system cannot collapse (tried on a page of its own: an old
 * kernel, huge pages "never"), or the error of pthread_create().
 * Idempotent. */
int ida_collapse_start(bool sweeps);

/* Sweep as soon as nothing is queued, without waiting
 * ida_collapse_sweep_ms (when the thread sweeps at all): a large state was
 * just built in small pages (a snapshot installed or rebuilt), and the
 * next snapshot child's fork may come within seconds (it took 26.1 ms
 * three seconds after a 171 MB install at 10 M). No-op without a
 * collapser in this process. */
void ida_collapse_sweep_soon(void);

/* Whether the collapser runs in this process. */
bool ida_collapse_running(void);

/* Stop the thread and forget what waits (nothing is collapsed after it
 * returns). Idempotent. */
void ida_collapse_stop(void);

/* Keep the collapser from starting a collapse until ida_collapse_resume():
 * for a fork(), which would wait for one under way (FORK above). False, and
 * nothing kept, when one is under way now: try again a little later. True
 * without a collapser. */
bool ida_collapse_pause(void);
void ida_collapse_resume(void);

/* The @size bytes at @p are written and will live long: the whole 2 MiB
 * pages inside them queued for the collapser when it runs in this process,
 * else hinted for huge pages (ida_heap_hint_huge(): khugepaged's). Not
 * both: the hint's madvise takes the memory map lock for writing (it
 * splits the mapping), and would wait for a collapse under way. */
void ida_heap_settle_huge(void *p, size_t size);

/* Collapse the whole 2 MiB pieces inside the @size bytes at @p that are in
 * memory (SAFETY), now, on the calling thread, unpaced: the collapser's
 * step, for tests. Returns how many pieces are huge after it (collapsed
 * now, or already); *@skipped (may be NULL) the pieces left alone for a
 * page not resident, or refused. */
size_t ida_collapse_range(void *p, size_t size, size_t *skipped);

struct ida_collapse_stats
{
    uint64_t queued;    /* ranges handed to the collapser */
    uint64_t dropped;   /* ranges only hinted: the queue was full */
    uint64_t collapsed; /* 2 MiB pieces collapsed */
    uint64_t already;   /* pieces found huge already (not asked again) */
    uint64_t skipped;   /* pieces left alone (pages not in memory, or
                           the kernel refused) */
    uint64_t waiting;   /* pieces queued, not yet taken */
    uint64_t sweeps;    /* sweeps of the process's mappings */
};

/* What the collapser of this process did so far. */
struct ida_collapse_stats ida_collapse_stats(void);

#endif /* IDA_BASE_COLLAPSE_H */
