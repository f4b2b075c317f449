/* bench_fsm: apply throughput per pool kind, memory per tagged allocation
 * at 10 million live allocations, snapshot and restore time of that state.
 *
 * Run with no arguments (make bench), or `bench_fsm N` for N live bounded
 * allocations (default 10,000,000). Restores are timed on one thread, then
 * with a second thread lent (ida_fsm_restore_with(), as a node restores);
 * IDA_BENCH_RESTORES=K times each (default 2; more to profile).
 * IDA_BENCH_COLLAPSE=1 runs the huge-page collapser a node runs
 * (base/collapse.h) while it fills.
 *
 * `bench_fsm --restore FILE` times restores of the state in a backup file
 * (`idalloc snapshot save`, or `idallocd --export-backup` of a node's data
 * directory: a real state, of the size a deployment or `make bench-scale`
 * left): IDA_BENCH_RESTORES times (default 3) each with a second thread
 * lent and on one thread, alternating, each into a new state machine. The
 * first is into memory the process never had, as a restart's is; later
 * ones may reuse what malloc kept of the one before (IDA_BENCH_RESTORES=1
 * in a loop of processes times only cold ones).
 *
 * Throughput counts only ida_fsm_apply() (each batch of 64 commands is
 * encoded before its clock starts, as the node receives it from the log).
 * The baseline, measured in the same run on the same bytes, is protobuf-c
 * decoding alone (idalloc__command_batch__unpack + free), which apply used
 * until fsm/batch.c read the common batches by hand: a ratio below 2 means
 * the whole apply costs less than twice protobuf-c's decode of it. Each
 * row also gives its slowest batch: a stall that comes once in millions of
 * commands (a table growing) hides in a mean; the node's processor would
 * hold every client that long (issue 19 allows 10 ms). The machine's own
 * pauses are the baseline for it, measured first in the same run: a
 * virtual machine stops a busy loop now and then (here up to 15 ms), and
 * a batch it stops looks as slow as one that did that much work.
 *
 * Memory is the growth of glibc's allocated bytes (mallinfo2(): uordblks,
 * live heap chunks with their malloc overhead, plus hblkhd, live mmapped
 * blocks; freed memory malloc keeps is not counted) while the allocations
 * are applied, divided by their number; RSS growth (/proc/self/statm) is
 * printed next to it. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/collapse.h"
#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "src/common/backup.h"
#include "src/node/lend.h"
#include "src/node/snap_stream.h"
#include "tests/fsm/fsm_helpers.h"

#define BATCH   64
#define CLIENTS 64

static struct fx_batch b;
static uint64_t client_seq[CLIENTS];
static uint64_t next_client;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long rss_kb(void)
{
    FILE *fp = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (fp != NULL) {
        if (fscanf(fp, "%ld %ld", &pages, &resident) != 2) {
            resident = 0;
        }
        fclose(fp);
    }
    return resident * 4;
}

/* Bytes in use: small chunks from the heap plus large mmapped ones (hash
 * tables, chunk directories). */
static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void die(const char *what, int rv)
{
    fprintf(stderr, "bench_fsm: %s: %s\n", what, idalloc_strerror(rv));
    exit(1);
}

/* Round-robin over CLIENTS sessions, each with increasing seqs. */
static void next_cmd(uint64_t *client, uint64_t *seq)
{
    *client = 1 + next_client % CLIENTS;
    *seq = ++client_seq[next_client % CLIENTS];
    next_client++;
}

enum kind { K_RESERVE, K_ALLOC, K_FREE, K_PREFIX };

/* Fill the batch with @n commands of @kind, numbering tags from *@tag. */
static void fill(enum kind kind, size_t n, uint64_t *tag)
{
    fx_batch_init(&b, 1000);
    for (size_t i = 0; i < n; i++) {
        uint64_t c, s;
        char t[32];
        next_cmd(&c, &s);
        snprintf(t, sizeof(t), "tag-%08llu", (unsigned long long)*tag);
        switch (kind) {
            case K_RESERVE:
                fx_add_reserve(&b, c, s, "seq", 1 + (*tag % 100));
                break;
            case K_ALLOC:
                fx_add_alloc(&b, c, s, "bnd", t);
                break;
            case K_FREE:
                fx_add_free(&b, c, s, "bnd", *tag, t);
                break;
            case K_PREFIX:
                fx_add_prefix(&b, c, s, "pfx", t);
                break;
        }
        (*tag)++;
    }
}

struct rate
{
    double apply_s;
    double decode_s;
    double slowest_s;   /* the slowest batch's apply */
    uint64_t over_10ms; /* batches whose apply took longer than 10 ms */
    uint64_t commands;
};

/* Apply @total commands of @kind to @f; tags from @tag0. */
static struct rate run(struct ida_fsm *f,
                       enum kind kind,
                       uint64_t total,
                       uint64_t tag0)
{
    struct rate r = {0, 0, 0, 0, 0};
    uint64_t tag = tag0;
    while (r.commands < total) {
        size_t n = total - r.commands < BATCH ? total - r.commands : BATCH;
        fill(kind, n, &tag);
        size_t len;
        uint8_t *buf = fx_batch_pack(&b, &len);
        /* Baseline: decode only. */
        double t0 = now_s();
        Idalloc__CommandBatch *m =
            idalloc__command_batch__unpack(NULL, len, buf);
        idalloc__command_batch__free_unpacked(m, NULL);
        double t1 = now_s();
        struct ida_fsm_applied out;
        int rv = ida_fsm_apply(f, ida_fsm_applied_index(f) + 1,
                               IDA_ENTRY_NORMAL, buf, len, &out);
        double t2 = now_s();
        free(buf);
        if (rv != 0) {
            die("apply", rv);
        }
        for (size_t i = 0; i < out.count; i++) {
            if (out.replies[i].result.error != 0) {
                die("command", out.replies[i].result.error);
            }
        }
        r.decode_s += t1 - t0;
        r.apply_s += t2 - t1;
        if (t2 - t1 > r.slowest_s) {
            r.slowest_s = t2 - t1;
        }
        r.over_10ms += t2 - t1 > 0.010;
        r.commands += n;
    }
    return r;
}

/* Spin @secs seconds reading the clock: the longest gap between two
 * reads, and how many gaps were longer than 10 ms. */
static void machine_pauses(double secs)
{
    double t0 = now_s(), last = t0, longest = 0;
    uint64_t over = 0;
    for (double t = t0; t - t0 < secs; t = now_s()) {
        if (t - last > longest) {
            longest = t - last;
        }
        over += t - last > 0.010;
        last = t;
    }
    printf(
        "baseline: this machine's own pauses (a busy loop of %.0f s): "
        "longest %.2f ms, %llu over 10 ms\n",
        secs, longest * 1e3, (unsigned long long)over);
}

static void print_rate(const char *what, struct rate r)
{
    double apply = (double)r.commands / r.apply_s;
    double decode = (double)r.commands / r.decode_s;
    printf(
        "%-28s %10llu cmds  %8.0f kcmd/s applied  (decode-only baseline "
        "%8.0f kcmd/s, apply/decode time ratio %.2f)  slowest batch %.2f ms, "
        "%llu over 10 ms\n",
        what, (unsigned long long)r.commands, apply / 1e3, decode / 1e3,
        r.apply_s / r.decode_s, r.slowest_s * 1e3,
        (unsigned long long)r.over_10ms);
}

static void create(struct ida_fsm *f,
                   const char *name,
                   Idalloc__PoolKind kind,
                   uint64_t size)
{
    uint64_t c, s;
    next_cmd(&c, &s);
    fx_batch_init(&b, 1000);
    fx_add_create(&b, c, s, name, kind, size);
    size_t len;
    uint8_t *buf = fx_batch_pack(&b, &len);
    struct ida_fsm_applied out;
    int rv = ida_fsm_apply(f, ida_fsm_applied_index(f) + 1, IDA_ENTRY_NORMAL,
                           buf, len, &out);
    free(buf);
    if (rv != 0 || out.replies[0].result.error != 0) {
        die("create", rv != 0 ? rv : out.replies[0].result.error);
    }
}

/* How many restores to time: IDA_BENCH_RESTORES, else @dflt. */
static int restores_wanted(int dflt)
{
    const char *nr = getenv("IDA_BENCH_RESTORES");
    return nr != NULL ? atoi(nr) : dflt;
}

/* Restore @data into a new state machine (*@g, the caller's, NULL when
 * ida_fsm_new failed), with a thread lent when @lent; *@secs the restore's
 * time. Returns the restore's error, or 0. */
static int timed_restore(const uint8_t *data,
                         size_t len,
                         bool lent,
                         struct ida_fsm **g,
                         double *secs)
{
    struct ida__lend l;
    ida__lend_init(&l);
    *g = NULL;
    int rv = ida_fsm_new(g);
    double t0 = now_s();
    rv = rv != 0 ? rv
                 : ida_fsm_restore_with(*g, data, len, lent ? &l.helper : NULL);
    *secs = now_s() - t0;
    return rv;
}

/* bench_fsm --restore FILE (above). */
static int restore_file(const char *path)
{
    struct ida_backup bk;
    char err[IDA_ERRMSG_MAX];
    int rv = ida_backup_read(path, &bk, err);
    if (rv != 0) {
        fprintf(stderr, "bench_fsm: %s\n", err);
        return 1;
    }
    int restores = restores_wanted(3);
    printf("bench_fsm: restores of the state in %s (index %llu, %.1f MB)\n",
           path, (unsigned long long)bk.index, (double)bk.state_len / 1e6);
    double sum[2] = {0, 0};
    for (int i = 0; i < restores && rv == 0; i++) {
        for (int lent = 1; lent >= 0 && rv == 0; lent--) {
            struct ida_fsm *g;
            double secs;
            rv = timed_restore(bk.state, bk.state_len, lent, &g, &secs);
            ida_fsm_free(g);
            if (rv == 0) {
                printf("  restore %d %s: %.3f s\n", i + 1,
                       lent ? "two threads" : "one thread ", secs);
                sum[lent] += secs;
            }
        }
    }
    if (rv != 0) {
        fprintf(stderr, "bench_fsm: restore: %s\n", idalloc_strerror(rv));
    } else if (restores > 0) {
        printf("mean: two threads %.3f s, one thread %.3f s\n",
               sum[1] / restores, sum[0] / restores);
    }
    /* Decoded ahead as it would arrive (512 KiB chunks, as a leader sends
     * it), then restored with two threads: what is left after the last
     * byte came. */
    double ahead_sum[2] = {0, 0};
    for (int i = 0; i < restores && rv == 0; i++) {
        struct ida_fsm_ahead *a = NULL;
        double t0 = now_s();
        rv = ida_fsm_ahead_new(bk.state_len, &a);
        for (size_t at = 0; rv == 0 && at < bk.state_len;) {
            at +=
                bk.state_len - at < 512 * 1024 ? bk.state_len - at : 512 * 1024;
            ida_fsm_ahead_step(a, bk.state, at);
        }
        double t1 = now_s();
        struct ida__lend l;
        ida__lend_init(&l);
        struct ida_fsm *g = NULL;
        if (rv == 0) {
            rv = ida_fsm_new(&g);
        }
        double t2 = now_s();
        if (rv == 0) {
            rv = ida_fsm_restore_ahead(g, bk.state, bk.state_len, &l.helper, a);
        }
        double t3 = now_s();
        if (rv == 0) {
            printf(
                "  ahead %d: %llu holdings decoded ahead in %.3f s, then "
                "the restore (two threads) %.3f s\n",
                i + 1, (unsigned long long)ida_fsm_ahead_holdings(a), t1 - t0,
                t3 - t2);
            ahead_sum[0] += t1 - t0;
            ahead_sum[1] += t3 - t2;
        }
        ida_fsm_free(g);
        ida_fsm_ahead_free(a);
    }
    if (rv == 0 && restores > 0) {
        printf("mean: decoding ahead %.3f s, the restore after it %.3f s\n",
               ahead_sum[0] / restores, ahead_sum[1] / restores);
    }
    ida_backup_free(&bk);
    return rv != 0;
}

/* A node's check of a leader's snapshot (src/node/snap_stream.h): the
 * bytes fed in 512 KiB chunks to the thread that decodes them as they
 * come, then restored with what it decoded. The thread runs while chunks
 * are fed and the check joins it (make tsan-fsm runs this under
 * ThreadSanitizer). Returns whether the state re-snapshots identical. */
static bool streamed(const uint8_t *snap, size_t len)
{
    const size_t chunk = 512 * 1024;
    double t0 = now_s();
    size_t first = len < chunk ? len : chunk;
    struct ida__snap_stream *st =
        ida__snap_stream_start(1, 1, len, snap, first);
    if (st == NULL) {
        die("stream", IDA_ENOMEM);
    }
    for (size_t at = first; at + chunk < len; at += chunk) {
        ida__snap_stream_feed(st, snap + at, chunk);
    }
    double t1 = now_s();
    struct ida_fsm *g;
    int rv = ida_fsm_new(&g);
    uint64_t ahead = 0;
    struct ida__snap_stream_times tm;
    rv = rv != 0 ? rv : ida__snap_stream_restore(st, g, snap, len, &ahead, &tm);
    double t2 = now_s();
    uint8_t *again = NULL;
    size_t l = 0;
    if (rv == 0) {
        rv = ida_fsm_snapshot(g, &again, &l);
    }
    if (rv != 0) {
        die("streamed restore", rv);
    }
    bool same = l == len && memcmp(snap, again, len) == 0;
    printf(
        "decoded as it arrives (512 KiB chunks fed at once, a node's "
        "check): %llu holdings ahead, %.2f s feeding, %.2f s after the last "
        "chunk (%.2f s decoding the bytes not yet decoded, %.2f s "
        "comparing, %.2f s restoring)%s\n",
        (unsigned long long)ahead, t1 - t0, t2 - t1, (double)tm.lag_us / 1e6,
        (double)tm.cmp_us / 1e6, (double)tm.restore_us / 1e6,
        same ? "" : " (re-snapshot DIFFERS)");
    ida_free(again);
    ida_fsm_free(g);
    return same;
}

static void count_applied(void *ctx,
                          const struct ida_entry *e,
                          const struct ida_fsm_applied *ap)
{
    (void)e;
    *(uint64_t *)ctx += ap->count;
}

/* A restart's replay: the state in @snap restored, then a log of batches
 * of new allocations (one per 500 live ones, at least 1,000 entries: ~20 k
 * of 64 at 10 M, as a node replays after its snapshot) applied on one
 * thread and with a thread lent to decode ahead (ida_fsm_apply_entries()),
 * alternating, IDA_BENCH_RESTORES times (default 2) each. Both must leave
 * the same state: false if not. */
static bool replay(const uint8_t *snap, size_t len, uint64_t live)
{
    size_t n = live / 500 > 1000 ? (size_t)(live / 500) : 1000;
    struct ida_entry *log = calloc(n, sizeof(*log));
    if (log == NULL) {
        die("replay", IDA_ENOMEM);
    }
    uint64_t tag = 2 * live + 4000000, base = 0;
    for (size_t i = 0; i < n; i++) {
        fill(K_ALLOC, BATCH, &tag);
        log[i].type = IDA_ENTRY_NORMAL;
        log[i].term = 1;
        log[i].data = fx_batch_pack(&b, &log[i].len);
    }
    int rounds = restores_wanted(2) > 0 ? restores_wanted(2) : 1;
    double sum[2] = {0, 0};
    uint8_t *want = NULL;
    size_t want_len = 0;
    bool same = true;
    printf("replay of %zu entries of %d allocations after the restore:", n,
           BATCH);
    for (int r = 0; r < rounds; r++) {
        for (int lent = 0; lent < 2; lent++) {
            struct ida_fsm *g;
            double secs;
            int rv = timed_restore(snap, len, true, &g, &secs);
            base = rv == 0 ? ida_fsm_applied_index(g) : 0;
            for (size_t i = 0; i < n; i++) {
                log[i].index = base + 1 + i;
            }
            struct ida__lend l;
            ida__lend_init(&l);
            uint64_t answers = 0;
            size_t done = 0;
            double t0 = now_s();
            rv = rv != 0
                     ? rv
                     : ida_fsm_apply_entries(g, log, n, lent ? &l.helper : NULL,
                                             count_applied, &answers, &done);
            secs = now_s() - t0;
            uint8_t *got = NULL;
            size_t got_len = 0;
            rv = rv != 0 ? rv : ida_fsm_snapshot(g, &got, &got_len);
            if (rv != 0 || done != n || answers != n * BATCH) {
                die("replay", rv != 0 ? rv : IDA_EINVAL);
            }
            if (want == NULL) {
                want = got;
                want_len = got_len;
            } else {
                same = same && got_len == want_len &&
                       memcmp(got, want, got_len) == 0;
                ida_free(got);
            }
            ida_fsm_free(g);
            sum[lent] += secs;
            printf(" %s %.3f s", lent ? "lent" : "one", secs);
        }
    }
    printf(
        "\nreplay: one thread %.0f kcmd/s, decoding ahead on a lent "
        "thread %.0f kcmd/s (ratio %.2f)%s\n",
        (double)n * BATCH * rounds / sum[0] / 1e3,
        (double)n * BATCH * rounds / sum[1] / 1e3, sum[0] / sum[1],
        same ? "" : "; the states DIFFER");
    ida_free(want);
    for (size_t i = 0; i < n; i++) {
        free(log[i].data);
    }
    free(log);
    return same;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--restore") == 0) {
        return restore_file(argv[2]);
    }
    uint64_t live = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000;
    /* IDA_BENCH_COLLAPSE=1: written tables and slabs are collapsed into
     * huge pages by a thread that also sweeps, as in a node
     * (base/collapse.h); its pauses of this thread then show in the
     * slowest batches. */
    const char *col = getenv("IDA_BENCH_COLLAPSE");
    bool collapse = col != NULL && strcmp(col, "1") == 0;
    if (collapse && ida_collapse_start(true) != 0) {
        fprintf(stderr, "bench_fsm: this system cannot collapse\n");
        return 1;
    }
    struct ida_fsm *f;
    int rv = ida_fsm_new(&f);
    if (rv != 0) {
        die("new", rv);
    }
    /* Every client registers its session first, as the library does; each
     * command then acknowledges the answers before it (fx_auto_ack). */
    for (uint64_t c = 1; c <= CLIENTS; c++) {
        fx_register(f, c, 1000);
    }
    create(f, "seq", IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE, 0);
    create(f, "pfx", IDALLOC__POOL_KIND__POOL_KIND_PREFIX, 0);
    create(f, "bnd", IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, UINT64_C(1) << 40);
    printf(
        "bench_fsm: batches of %d commands from %d clients, tags "
        "\"tag-%%08u\" (12 bytes)\n",
        BATCH, CLIENTS);
    machine_pauses(5.0);

    print_rate("sequence reserve", run(f, K_RESERVE, 2000000, 0));
    print_rate("prefix alloc (new tags)", run(f, K_PREFIX, 1000000, 0));

    /* The bounded pool: memory per live allocation. Everything but the
     * pool's growth is already allocated (sessions, reply array). */
    size_t heap0 = heap_bytes();
    long rss0 = rss_kb();
    struct rate ra = run(f, K_ALLOC, live, 0);
    size_t heap1 = heap_bytes();
    long rss1 = rss_kb();
    print_rate("bounded alloc (new tags)", ra);
    printf(
        "memory: %llu live tagged allocations: %.1f bytes/allocation "
        "(mallinfo2 uordblks+hblkhd delta %.1f MB), RSS delta %.1f bytes/"
        "allocation; target < 64\n",
        (unsigned long long)live, (double)(heap1 - heap0) / (double)live,
        (double)(heap1 - heap0) / 1e6,
        (double)(rss1 - rss0) * 1024.0 / (double)live);

    print_rate("bounded alloc (existing)", run(f, K_ALLOC, 1000000, 0));
    /* Free and re-take 1M ids in the full pool. */
    print_rate("bounded free", run(f, K_FREE, 1000000, live / 2));
    print_rate("bounded alloc (refill)", run(f, K_ALLOC, 1000000, live / 2));
    if (collapse) {
        fx_print_collapser("");
    }

    double t0 = now_s();
    uint8_t *snap;
    size_t len;
    rv = ida_fsm_snapshot(f, &snap, &len);
    double t1 = now_s();
    if (rv != 0) {
        die("snapshot", rv);
    }
    struct ida_fsm *g;
    rv = ida_fsm_new(&g);
    if (rv != 0) {
        die("new", rv);
    }
    double t2 = now_s();
    rv = ida_fsm_restore(g, snap, len);
    double t3 = now_s();
    if (rv != 0) {
        die("restore", rv);
    }
    uint8_t *snap2;
    size_t len2;
    rv = ida_fsm_snapshot(g, &snap2, &len2);
    if (rv != 0) {
        die("snapshot", rv);
    }
    bool same = len == len2 && memcmp(snap, snap2, len) == 0;
    printf(
        "snapshot of the %llu-allocation state: %.1f MB in %.2f s; "
        "restore %.2f s; restored state re-snapshots identical: %s\n",
        (unsigned long long)live, (double)len / 1e6, t1 - t0, t3 - t2,
        same ? "yes" : "NO");
    /* Restore again into fresh state machines: the first restore of a
     * process pays for faulting in memory the system never gave it before
     * (on a virtual machine, often the larger part); later ones show the
     * decoding alone. */
    /* IDA_BENCH_RESTORES: how many (2 by default; more to profile). The
     * same again with a second thread lent (what a node does). */
    int restores = restores_wanted(2);
    for (int lent = 0; lent < 2; lent++) {
        printf("restore again%s:", lent ? ", two threads" : "");
        for (int i = 0; i < restores; i++) {
            ida_free(snap2);
            ida_fsm_free(g);
            double secs;
            rv = timed_restore(snap, len, lent, &g, &secs);
            if (rv == 0) {
                rv = ida_fsm_snapshot(g, &snap2, &len2);
            }
            if (rv != 0) {
                die("restore", rv);
            }
            same = same && len == len2 && memcmp(snap, snap2, len) == 0;
            printf(" %.2f s", secs);
        }
        printf("%s\n", same ? "" : " (re-snapshot DIFFERS)");
    }
    ida_free(snap2);
    ida_fsm_free(g);
    same = streamed(snap, len) && same;
    same = replay(snap, len, live) && same;
    ida_free(snap);
    ida_fsm_free(f);
    return same ? 0 : 1;
}
