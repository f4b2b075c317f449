/* The huge-page collapser (collapse.h). */
#define _DEFAULT_SOURCE /* madvise, mincore */
#include "base/collapse.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

#define HUGE ((uintptr_t)IDA_HUGE_PAGE)

/* The PAGEMAP_SCAN ioctl of /proc/self/pagemap (Linux 6.7; not in older
 * headers): which pages of a range are on a huge page (WARMING). */
struct pm_region
{
    uint64_t start, end, categories;
};
struct pm_scan
{
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages,
        category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PM_SCAN      _IOWR('f', 16, struct pm_scan)
#define PM_PAGE_HUGE (1u << 6)

unsigned ida_collapse_sweep_ms = IDA_COLLAPSE_SWEEP_MS;

struct range
{
    uintptr_t lo, hi; /* 2 MiB-aligned */
};

static struct
{
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    atomic_bool running; /* started, not stopped */
    bool stopping;       /* the thread is to leave */
    bool sweeping;       /* sweeps when idle (ida_collapse_start()) */
    bool sweep_soon;     /* ida_collapse_sweep_soon() asked */
    _Atomic pid_t owner; /* the process the thread runs in */
    atomic_bool busy;    /* a collapse is under way, or about to be */
    atomic_bool paused;  /* ida_collapse_pause() holds it */
    struct range q[IDA_COLLAPSE_QUEUE];
    unsigned head, count;
    struct ida_collapse_stats stats;
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The whole 2 MiB pieces inside [@p, @p + @size): [*@lo, *@hi); false
 * when there are none. */
static bool pieces_inside(uintptr_t p,
                          size_t size,
                          uintptr_t *lo,
                          uintptr_t *hi)
{
    *lo = (p + HUGE - 1) & ~(HUGE - 1);
    *hi = (p + size) & ~(HUGE - 1);
    return p != 0 && *hi > *lo;
}

/* Whether the collapser runs in this process (a forked child has none). Read
 * without the mutex: in a forked child it may be held by a thread that no
 * longer exists. */
static bool runs_here(void)
{
    return atomic_load(&C.running) && atomic_load(&C.owner) == getpid();
}

/* Whether the 2 MiB at @lo is in memory but for IDA_COLLAPSE_HOLES_MAX
 * pages at most. */
static bool resident(uintptr_t lo)
{
    static _Thread_local unsigned char vec[HUGE / 4096];
    long page = sysconf(_SC_PAGESIZE);
    size_t n = page > 0 ? HUGE / (size_t)page : 0;
    if (n == 0 || n > sizeof(vec) || mincore((void *)lo, HUGE, vec) != 0) {
        return false; /* unmapped (ENOMEM), or pages of another size */
    }
    size_t holes = 0;
    for (size_t i = 0; i < n && holes <= IDA_COLLAPSE_HOLES_MAX; i++) {
        holes += !(vec[i] & 1);
    }
    return holes <= IDA_COLLAPSE_HOLES_MAX;
}

/* What a collapser step needs of its own (WARMING): a 2 MiB-aligned piece
 * of a mapping hinted for huge pages, faulted and given back before each
 * collapse; /proc/self/pagemap, open, to ask whether a piece is huge
 * already (-1: not asked, every piece is warmed for). */
struct stepper
{
    void *map;     /* 2 pieces, or MAP_FAILED */
    uint8_t *warm; /* the aligned piece inside it */
    int pagemap;
};

static void stepper_open(struct stepper *st)
{
    st->map = mmap(NULL, 2 * HUGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    st->warm = NULL;
    uintptr_t lo, hi;
    if (st->map != MAP_FAILED &&
        pieces_inside((uintptr_t)st->map, 2 * HUGE, &lo, &hi)) {
        st->warm = (uint8_t *)lo;
        ida_heap_hint_huge(st->warm, HUGE);
    }
    st->pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
}

static void stepper_close(struct stepper *st)
{
    if (st->map != MAP_FAILED) {
        munmap(st->map, 2 * HUGE);
    }
    if (st->pagemap >= 0) {
        close(st->pagemap);
    }
}

/* Whether the 2 MiB at @lo are one huge page already: false when unknown
 * (no PAGEMAP_SCAN: a kernel before 6.7; asked no more). */
static bool already_huge(struct stepper *st, uintptr_t lo)
{
    if (st->pagemap < 0) {
        return false;
    }
    struct pm_region r = {0};
    struct pm_scan a = {.size = sizeof(a),
                        .start = lo,
                        .end = lo + HUGE,
                        .vec = (uintptr_t)&r,
                        .vec_len = 1,
                        .category_mask = PM_PAGE_HUGE,
                        .return_mask = PM_PAGE_HUGE};
    int n = ioctl(st->pagemap, PM_SCAN, &a);
    if (n < 0 && (errno == ENOTTY || errno == EINVAL)) {
        close(st->pagemap);
        st->pagemap = -1;
    }
    return n == 1 && r.start == lo && r.end == lo + HUGE;
}

/* Fault a huge page in and give it back (WARMING). */
static void warm_up(struct stepper *st)
{
    if (st->warm != NULL) {
        *(volatile uint8_t *)st->warm = 1;
        (void)madvise(st->warm, HUGE, MADV_DONTNEED);
    }
}

/* What became of a piece. */
enum piece {
    PIECE_AWAY = -1,   /* left alone without asking: not in memory */
    PIECE_REFUSED = 0, /* the kernel refused it */
    PIECE_DONE = 1,    /* collapsed now */
    PIECE_ALREADY = 2, /* huge already: nothing asked of the kernel */
};

static enum piece collapse_piece(struct stepper *st, uintptr_t lo)
{
    if (!resident(lo)) {
        return PIECE_AWAY;
    }
    if (already_huge(st, lo)) {
        return PIECE_ALREADY;
    }
    warm_up(st);
    return madvise((void *)lo, HUGE, MADV_COLLAPSE) == 0 ? PIECE_DONE
                                                         : PIECE_REFUSED;
}

static void count_piece(enum piece rv)
{
    pthread_mutex_lock(&C.mu);
    C.stats.collapsed += rv == PIECE_DONE;
    C.stats.already += rv == PIECE_ALREADY;
    C.stats.skipped += rv == PIECE_AWAY || rv == PIECE_REFUSED;
    pthread_mutex_unlock(&C.mu);
}

size_t ida_collapse_range(void *p, size_t size, size_t *skipped)
{
    uintptr_t lo, hi;
    size_t done = 0, left = 0;
    struct stepper st;
    stepper_open(&st);
    bool any = pieces_inside((uintptr_t)p, size, &lo, &hi);
    for (uintptr_t a = lo; any && a < hi; a += HUGE) {
        enum piece rv = collapse_piece(&st, a);
        count_piece(rv);
        if (rv == PIECE_DONE || rv == PIECE_ALREADY) {
            done++;
        } else {
            left++;
        }
    }
    stepper_close(&st);
    if (skipped != NULL) {
        *skipped = left;
    }
    return done;
}

/* Queue [@lo, @hi) (2 MiB-aligned, non-empty) with C.mu held; false when
 * the queue is full. */
static bool push_locked(uintptr_t lo, uintptr_t hi)
{
    if (C.count == IDA_COLLAPSE_QUEUE) {
        return false;
    }
    unsigned at = (C.head + C.count) % IDA_COLLAPSE_QUEUE;
    C.q[at] = (struct range){lo, hi};
    C.count++;
    return true;
}

/* A mapping of /proc/self/smaps as the sweep reads it. */
struct mapping
{
    uintptr_t lo, hi;
    bool ours;             /* private, anonymous, writable */
    unsigned long anon_kb; /* in memory */
    unsigned long huge_kb; /* of which on huge pages */
};

/* Queue @m if it is ours, holds a 2 MiB piece's worth of memory not on
 * huge pages, and is not sparse (at most IDA_COLLAPSE_SPARSE times the
 * memory it holds). */
static void sweep_one(const struct mapping *m)
{
    uintptr_t lo, hi;
    if (!m->ours || !pieces_inside(m->lo, m->hi - m->lo, &lo, &hi) ||
        m->anon_kb < m->huge_kb + HUGE / 1024 ||
        (hi - lo) / 1024 / IDA_COLLAPSE_SPARSE > m->anon_kb) {
        return;
    }
    pthread_mutex_lock(&C.mu);
    (void)push_locked(lo, hi); /* full: the next sweep */
    pthread_mutex_unlock(&C.mu);
}

/* The sweep: every private anonymous writable mapping of this process
 * (/proc/self/smaps: malloc's heaps, large blocks, stacks) with a piece's
 * worth of memory not on huge pages, queued whole; the residency check then
 * leaves alone the pieces not in memory. Mappings reserved and sparsely
 * touched (a sanitizer's shadow: terabytes with megabytes in memory) are
 * not walked: a piece costs a mincore() even when not in memory. */
static void sweep(void)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    char line[512];
    struct mapping m = {0};
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        unsigned long a, b, ino, kb;
        char perms[8];
        int path = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu %n", &a, &b, perms, &ino,
                   &path) >= 4) {
            sweep_one(&m);
            m = (struct mapping){
                .lo = a,
                .hi = b,
                .ours = strcmp(perms, "rw-p") == 0 && ino == 0 &&
                        (line[path] == '\0' ||
                         strncmp(line + path, "[heap]", 6) == 0)};
        } else if (sscanf(line, "Anonymous: %lu kB", &kb) == 1) {
            m.anon_kb = kb;
        } else if (sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
            m.huge_kb = kb;
        }
    }
    sweep_one(&m);
    if (fp != NULL) {
        fclose(fp);
    }
    pthread_mutex_lock(&C.mu);
    C.stats.sweeps++;
    pthread_mutex_unlock(&C.mu);
}

/* Pop the next piece to collapse into *@lo; false when told to stop. With
 * nothing queued for ida_collapse_sweep_ms, the sweep queues more. */
static bool next_piece(uintptr_t *lo)
{
    pthread_mutex_lock(&C.mu);
    while (!C.stopping && C.count == 0) {
        if (C.sweep_soon && C.sweeping) {
            C.sweep_soon = false;
            pthread_mutex_unlock(&C.mu);
            sweep();
            pthread_mutex_lock(&C.mu);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        uint64_t ns = (uint64_t)until.tv_nsec +
                      (uint64_t)ida_collapse_sweep_ms * 1000000u;
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        if (pthread_cond_timedwait(&C.cv, &C.mu, &until) == ETIMEDOUT &&
            !C.stopping && C.count == 0 && C.sweeping) {
            pthread_mutex_unlock(&C.mu);
            sweep();
            pthread_mutex_lock(&C.mu);
        }
    }
    bool go = !C.stopping;
    if (go) {
        struct range *r = &C.q[C.head];
        *lo = r->lo;
        r->lo += HUGE;
        if (r->lo >= r->hi) {
            C.head = (C.head + 1) % IDA_COLLAPSE_QUEUE;
            C.count--;
        }
    }
    pthread_mutex_unlock(&C.mu);
    return go;
}

/* Mark the collapser busy for a collapse it is about to start, once no
 * pause holds it (ida_collapse_pause()); false when told to stop meanwhile.
 * The two sides store their own flag, then read the other's (sequentially
 * consistent): at least one of them sees the other and backs off. */
static bool enter_busy(void)
{
    for (;;) {
        atomic_store(&C.busy, true);
        if (!atomic_load(&C.paused)) {
            return true;
        }
        atomic_store(&C.busy, false);
        pthread_mutex_lock(&C.mu);
        bool stopping = C.stopping;
        pthread_mutex_unlock(&C.mu);
        if (stopping) {
            return false;
        }
        sleep_ns(1000000u);
    }
}

static void *collapser_main(void *arg)
{
    (void)arg;
    uintptr_t lo;
    struct stepper st;
    stepper_open(&st);
    while (next_piece(&lo) && enter_busy()) {
        uint64_t t0 = mono_ns();
        enum piece rv = collapse_piece(&st, lo);
        uint64_t took = mono_ns() - t0;
        atomic_store(&C.busy, false);
        count_piece(rv);
        /* A piece not in memory, or huge already, cost a mincore() and an
         * ioctl, no lock for long: on at once. After a collapse, a rest,
         * at least a little. (The warming is in @took: it is short once
         * the host backs the page, and the collapse then is too.) */
        uint64_t rest = IDA_COLLAPSE_REST * took;
        if (rv == PIECE_DONE || rv == PIECE_REFUSED) {
            sleep_ns(rest > 20000u ? rest : 20000u);
        }
    }
    stepper_close(&st);
    return NULL;
}

/* Whether this system collapses: tried on a 2 MiB piece of a mapping of
 * its own, written first. */
static bool can_collapse(void)
{
    size_t len = 2 * HUGE;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        return false;
    }
    uintptr_t lo, hi;
    (void)pieces_inside((uintptr_t)m, len, &lo, &hi); /* one at least */
    memset((void *)lo, 1, HUGE);
    int rc = madvise((void *)lo, HUGE, MADV_COLLAPSE);
    /* EAGAIN or ENOMEM: no huge page free right now, which passes. */
    bool ok = rc == 0 || errno == EAGAIN || errno == ENOMEM;
    munmap(m, len);
    return ok;
}

int ida_collapse_start(bool sweeps)
{
    if (runs_here()) {
        return 0;
    }
    if (!can_collapse()) {
        return ENOSYS;
    }
    pthread_mutex_lock(&C.mu);
    C.stopping = false;
    C.sweeping = sweeps;
    C.sweep_soon = false;
    C.head = C.count = 0;
    C.owner = getpid();
    int rc = pthread_create(&C.thread, NULL, collapser_main, NULL);
    C.running = rc == 0;
    pthread_mutex_unlock(&C.mu);
    return rc;
}

bool ida_collapse_running(void)
{
    return runs_here();
}

void ida_collapse_sweep_soon(void)
{
    if (!runs_here()) {
        return;
    }
    pthread_mutex_lock(&C.mu);
    C.sweep_soon = true;
    pthread_cond_signal(&C.cv);
    pthread_mutex_unlock(&C.mu);
}

void ida_collapse_stop(void)
{
    bool join = runs_here();
    pthread_mutex_lock(&C.mu);
    C.stopping = true;
    C.running = false;
    C.count = 0;
    pthread_cond_signal(&C.cv);
    pthread_mutex_unlock(&C.mu);
    if (join) {
        pthread_join(C.thread, NULL);
    }
}

void ida_heap_settle_huge(void *p, size_t size)
{
    uintptr_t lo, hi;
    bool queued = false;
    if (pieces_inside((uintptr_t)p, size, &lo, &hi) && runs_here()) {
        pthread_mutex_lock(&C.mu);
        queued = push_locked(lo, hi);
        C.stats.queued += queued;
        C.stats.dropped += !queued;
        pthread_cond_signal(&C.cv);
        pthread_mutex_unlock(&C.mu);
    }
    if (!queued) {
        ida_heap_hint_huge(p, size);
    }
}

bool ida_collapse_pause(void)
{
    atomic_store(&C.paused, true);
    if (atomic_load(&C.busy)) {
        atomic_store(&C.paused, false);
        return false;
    }
    return true;
}

void ida_collapse_resume(void)
{
    atomic_store(&C.paused, false);
}

struct ida_collapse_stats ida_collapse_stats(void)
{
    pthread_mutex_lock(&C.mu);
    struct ida_collapse_stats s = C.stats;
    s.waiting = 0;
    for (unsigned i = 0; i < C.count; i++) {
        const struct range *r = &C.q[(C.head + i) % IDA_COLLAPSE_QUEUE];
        s.waiting += (r->hi - r->lo) / HUGE;
    }
    pthread_mutex_unlock(&C.mu);
    return s;
}
