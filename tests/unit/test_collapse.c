/* The huge-page collapser (base/collapse.h), against the real kernel: a
 * block written in 4 KiB pages ends on huge pages with its bytes intact,
 * pages given back stay given back, and a forked child only hints.
 * Skipped where the system cannot collapse (ida_collapse_start()). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, mincore */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/collapse.h"
#include "base/heap.h"

#define MIB   ((size_t)1 << 20)
#define PIECE (2 * MIB)

/* kB of huge pages in the mapping that holds @p (/proc/self/smaps). */
static unsigned long huge_kb(const void *p)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(fp);
    char line[512];
    bool in = false;
    unsigned long kb = 0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        unsigned long lo, hi, v;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
            strchr(line, ':') != NULL && strstr(line, "kB") == NULL) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (in && sscanf(line, "AnonHugePages: %lu kB", &v) == 1) {
            kb = v;
        }
    }
    fclose(fp);
    return kb;
}

/* Bytes of written_block()'s mapping. */
#define BLOCK_BYTES (5 * PIECE)

/* A mapping of BLOCK_BYTES in 4 KiB pages; *@lo the first 2 MiB boundary
 * a page or more into it, with 3 whole pieces after it written with a
 * pattern. Its first page and what follows the 3 pieces are PROT_NONE, so
 * the written part is a mapping of its own: /proc/self/smaps counts its
 * huge pages alone (a neighbour with the same flags would merge into it).
 * No advice: in the "madvise" mode of transparent huge pages khugepaged
 * leaves it alone, and a collapse does not need it. */
static void *written_block(uint8_t **lo)
{
    void *m = mmap(NULL, BLOCK_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    uintptr_t at = ((uintptr_t)m + 4096 + PIECE - 1) & ~(uintptr_t)(PIECE - 1);
    *lo = (uint8_t *)at;
    cr_assert_eq(mprotect(m, 4096, PROT_NONE), 0);
    cr_assert_eq(
        mprotect(*lo + 3 * PIECE, (uintptr_t)m + BLOCK_BYTES - (at + 3 * PIECE),
                 PROT_NONE),
        0);
    for (size_t i = 0; i < 3 * PIECE; i++) {
        (*lo)[i] = (uint8_t)(i * 7 + i / 4096);
    }
    if (huge_kb(*lo) != 0) {
        cr_skip_test("written memory came on huge pages (THP \"always\")");
    }
    return m;
}

static void pattern_intact(const uint8_t *lo, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        if (lo[i] != (uint8_t)(i * 7 + i / 4096)) {
            cr_assert_fail("byte %zu changed", i);
        }
    }
}

static bool resident(const void *p)
{
    unsigned char v = 0;
    cr_assert_eq(mincore((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, &v),
                 0);
    return v & 1;
}

static void need_collapser(void)
{
    int rv = ida_collapse_start(false);
    if (rv == ENOSYS) {
        cr_skip_test("this system cannot collapse (MADV_COLLAPSE)");
    }
    cr_assert_eq(rv, 0);
}

/* The collapser with sweeps after @idle_ms without work, or the test
 * skipped. */
static void need_sweeper(unsigned idle_ms)
{
    ida_collapse_sweep_ms = idle_ms;
    int rv = ida_collapse_start(true);
    if (rv == ENOSYS) {
        cr_skip_test("this system cannot collapse (MADV_COLLAPSE)");
    }
    cr_assert_eq(rv, 0);
}

/* Wait up to @secs until @lo's mapping holds @kb of huge pages, then stop
 * the collapser: its counts. */
static struct ida_collapse_stats stop_once_huge(const void *lo,
                                                unsigned long kb,
                                                int secs)
{
    for (int i = 0; i < secs * 100 && huge_kb(lo) < kb; i++) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    struct ida_collapse_stats st = ida_collapse_stats();
    ida_collapse_stop();
    return st;
}

Test(collapse, settle_without_the_collapser_queues_nothing)
{
    uint8_t *lo;
    void *m = written_block(&lo);
    struct ida_collapse_stats a = ida_collapse_stats();
    ida_heap_settle_huge(lo, 3 * PIECE);
    struct ida_collapse_stats b = ida_collapse_stats();
    cr_assert_eq(b.queued, a.queued);
    cr_assert_eq(b.waiting, 0);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, a_written_block_ends_on_huge_pages_unchanged)
{
    need_collapser();
    ida_collapse_stop(); /* the step alone, on this thread */
    uint8_t *lo;
    void *m = written_block(&lo); /* in 4 KiB pages, or skipped */
    size_t skipped = 99;
    /* From a byte after the boundary: only whole pieces inside count. */
    size_t done = ida_collapse_range(lo - 1, 3 * PIECE + 2, &skipped);
    cr_assert_eq(done, 3);
    cr_assert_eq(skipped, 0);
    cr_assert_eq(huge_kb(lo), 3 * PIECE / 1024);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

/* Linux 6.7 or later: the PAGEMAP_SCAN ioctl that tells a huge piece. */
static bool kernel_tells_huge(void)
{
    struct utsname u;
    int major = 0, minor = 0;
    return uname(&u) == 0 && sscanf(u.release, "%d.%d", &major, &minor) == 2 &&
           (major > 6 || (major == 6 && minor >= 7));
}

Test(collapse, a_huge_piece_is_not_collapsed_again)
{
    need_collapser();
    ida_collapse_stop();
    if (!kernel_tells_huge()) {
        cr_skip_test("no PAGEMAP_SCAN before Linux 6.7");
    }
    uint8_t *lo;
    void *m = written_block(&lo);
    cr_assert_eq(ida_collapse_range(lo, 3 * PIECE, NULL), 3);
    struct ida_collapse_stats a = ida_collapse_stats();
    size_t skipped = 99;
    cr_assert_eq(ida_collapse_range(lo, 3 * PIECE, &skipped), 3);
    struct ida_collapse_stats b = ida_collapse_stats();
    cr_assert_eq(skipped, 0);
    cr_assert_eq(b.already, a.already + 3);
    cr_assert_eq(b.collapsed, a.collapsed, "a huge piece collapsed again");
    cr_assert_eq(huge_kb(lo), 3 * PIECE / 1024);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, pages_given_back_are_not_taken_again)
{
    need_collapser();
    ida_collapse_stop();
    uint8_t *lo;
    void *m = written_block(&lo);
    /* Half of the middle piece zeroed and given back, as a table being
     * emptied gives its memory back a piece at a time (tagtab.c). A
     * collapse would map all 2 MiB of it again. */
    size_t half = PIECE / 2;
    memset(lo + PIECE, 0, half);
    ida_heap_release_zeroed(lo + PIECE, half);
    cr_assert(!resident(lo + PIECE));
    size_t skipped = 0;
    size_t done = ida_collapse_range(lo, 3 * PIECE, &skipped);
    cr_assert_eq(done, 2);
    cr_assert_eq(skipped, 1);
    cr_assert_eq(huge_kb(lo), 2 * PIECE / 1024);
    for (size_t i = 0; i < half; i += 4096) {
        cr_assert(!resident(lo + PIECE + i), "page %zu taken again", i);
    }
    pattern_intact(lo, 0, PIECE);
    pattern_intact(lo, PIECE + half, 3 * PIECE);
    cr_assert_eq(lo[PIECE + 12345], 0);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, the_collapser_takes_what_is_settled)
{
    need_collapser();
    struct ida_collapse_stats a = ida_collapse_stats();
    uint8_t *lo;
    void *m = written_block(&lo);
    ida_heap_settle_huge(lo, 3 * PIECE);
    struct ida_collapse_stats b = ida_collapse_stats();
    cr_assert_eq(b.queued, a.queued + 1);
    /* Paced, but 3 pieces take well under a second here. */
    for (int i = 0;
         i < 1000 && (b.waiting > 0 ||
                      b.collapsed + b.skipped < a.collapsed + a.skipped + 3);
         i++) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        b = ida_collapse_stats();
    }
    ida_collapse_stop();
    cr_assert_eq(b.waiting, 0);
    cr_assert_eq(b.collapsed, a.collapsed + 3);
    cr_assert_eq(huge_kb(lo), 3 * PIECE / 1024);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, a_forked_child_only_hints)
{
    need_collapser();
    uint8_t *lo;
    void *m = written_block(&lo);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* Nothing was queued, so the collapser waited with the mutex
         * free at the fork and the child may read the counts; a settle
         * that queued would count, and nothing would ever take it. */
        alarm(10);
        struct ida_collapse_stats a = ida_collapse_stats();
        ida_heap_settle_huge(lo, 3 * PIECE);
        struct ida_collapse_stats b = ida_collapse_stats();
        _exit(b.queued == a.queued && huge_kb(lo) == 0 ? 0 : 3);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    ida_collapse_stop();
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d",
              status);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, a_full_queue_drops_to_a_hint)
{
    /* Paused, the collapser takes at most the first piece of the first
     * range, which stays queued until its last piece is taken. */
    need_collapser();
    cr_assert(ida_collapse_pause());
    uint8_t *lo;
    void *m = written_block(&lo);
    struct ida_collapse_stats a = ida_collapse_stats();
    for (int i = 0; i < IDA_COLLAPSE_QUEUE + 64; i++) {
        ida_heap_settle_huge(lo, 3 * PIECE);
    }
    struct ida_collapse_stats b = ida_collapse_stats();
    ida_collapse_resume();
    ida_collapse_stop();
    cr_assert_eq(b.queued, a.queued + IDA_COLLAPSE_QUEUE);
    cr_assert_eq(b.dropped, a.dropped + 64);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, a_sweep_takes_memory_nobody_settled)
{
    need_sweeper(50);
    uint8_t *lo;
    void *m = written_block(&lo); /* malloc's heaps are never settled */
    /* Half of its last piece given back: the sweep must leave it so. */
    memset(lo + 2 * PIECE, 0, PIECE / 2);
    ida_heap_release_zeroed(lo + 2 * PIECE, PIECE / 2);
    struct ida_collapse_stats st = stop_once_huge(lo, 2 * PIECE / 1024, 5);
    cr_assert_geq(st.sweeps, 1);
    cr_assert_eq(huge_kb(lo), 2 * PIECE / 1024);
    cr_assert(!resident(lo + 2 * PIECE));
    pattern_intact(lo, 0, 2 * PIECE);
    pattern_intact(lo, 2 * PIECE + PIECE / 2, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

/* A sweep asked for comes at once, not after the idle wait (a minute
 * here: the 10 s wait gives up long before). */
Test(collapse, a_sweep_asked_for_comes_at_once, .timeout = 30)
{
    need_sweeper(60000);
    uint8_t *lo;
    void *m = written_block(&lo);
    ida_collapse_sweep_soon();
    struct ida_collapse_stats st = stop_once_huge(lo, 3 * PIECE / 1024, 10);
    cr_assert_eq(st.sweeps, 1);
    cr_assert_eq(huge_kb(lo), 3 * PIECE / 1024);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}

Test(collapse, a_pause_holds_collapses_until_resumed)
{
    need_collapser();
    uint8_t *lo;
    void *m = written_block(&lo);
    /* Idle, so nothing is under way: the pause holds. */
    cr_assert(ida_collapse_pause());
    struct ida_collapse_stats a = ida_collapse_stats();
    ida_heap_settle_huge(lo, 3 * PIECE);
    nanosleep(&(struct timespec){0, 200000000}, NULL);
    struct ida_collapse_stats b = ida_collapse_stats();
    cr_assert_eq(b.collapsed + b.skipped, a.collapsed + a.skipped,
                 "collapsed while paused");
    cr_assert_eq(huge_kb(lo), 0);
    ida_collapse_resume();
    for (int i = 0; i < 500 && huge_kb(lo) < 3 * PIECE / 1024; i++) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    ida_collapse_stop();
    cr_assert_eq(huge_kb(lo), 3 * PIECE / 1024);
    pattern_intact(lo, 0, 3 * PIECE);
    munmap(m, BLOCK_BYTES);
}
