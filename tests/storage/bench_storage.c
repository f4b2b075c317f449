/* bench_storage: entries persisted per second by storage/ at batch sizes 1,
 * 16 and 256 (100-byte entries, each batch also sets the hard state, as a
 * Raft Ready does), side by side with the raw fdatasync rate of the same
 * directory measured in the same run.
 *
 * The physical limit of a durable batch is one fdatasync, so the ratio
 * printed is commits/s divided by raw fdatasyncs/s (= entries/s divided by
 * raw rate x batch size). LMDB's durable commit syncs twice (the data pages,
 * then the meta page that makes them visible), so about 0.5 is expected.
 *
 * The raw rate is of appends, which also flush the file's new size. A log
 * file kept beside LMDB (a write-ahead log: one flush per commit) would
 * overwrite blocks already written instead, which flushes no metadata: that
 * floor is measured too ("overwrite"), interleaved the same way, and the
 * batch=1 commit rate is also given against it. So is storage/seglog.h,
 * the segment log made for that: one record of an entry and a hard state
 * (128 bytes) appended and flushed per commit, in 16 MiB segments (the
 * first made at open, as a node's would be; none fills in a run).
 *
 * Environment: BENCH_SECONDS (default 3) of storage time per batch size,
 * run as 0.5 s slices interleaved with 0.25 s raw slices; TMPDIR picks the
 * file system (default /tmp). statfs() and its magic numbers are Linux
 * specific, hence _GNU_SOURCE. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "storage/seglog.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#define ENTRY_BYTES 100

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *fs_name(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) != 0) {
        return "unknown";
    }
    switch ((unsigned long)sf.f_type) {
        case 0xEF53:
            return "ext2/3/4";
        case 0x01021994:
            return "tmpfs (fdatasync is a no-op: figures are not disk figures)";
        case 0x58465342:
            return "xfs";
        case 0x9123683E:
            return "btrfs";
        case 0x794C7630:
            return "overlayfs";
        default:
            return "other";
    }
}

/* A file of WAL_FILE_BYTES, written and flushed once, for the overwrites
 * of raw_rate(). */
#define WAL_FILE_BYTES (1 << 20)
static void wal_file_make(const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    static char zero[WAL_FILE_BYTES];
    if (fd < 0 || write(fd, zero, sizeof(zero)) != (ssize_t)sizeof(zero) ||
        fsync(fd) != 0 || close(fd) != 0) {
        perror("wal file");
        exit(1);
    }
}

/* Writes of 128 bytes, each followed by fdatasync, for @secs, per second:
 * appends to a new file in @dir (@wal NULL), or overwrites in the blocks
 * of @wal (wal_file_make()), a block further each time. */
static double raw_rate(const char *dir, const char *wal, double secs)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/raw", dir);
    int fd = wal != NULL ? open(wal, O_WRONLY)
                         : open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) {
        perror("open");
        exit(1);
    }
    char buf[128];
    memset(buf, 'x', sizeof(buf));
    long n = 0;
    double t0 = now_s(), t;
    do {
        ssize_t w = wal != NULL ? pwrite(fd, buf, sizeof(buf),
                                         (off_t)(n * 4096 % WAL_FILE_BYTES))
                                : write(fd, buf, sizeof(buf));
        if (w != (ssize_t)sizeof(buf) || fdatasync(fd) != 0) {
            perror("write/fdatasync");
            exit(1);
        }
        n++;
        t = now_s();
    } while (t - t0 < secs);
    close(fd);
    if (wal == NULL) {
        unlink(path);
    }
    return (double)n / (t - t0);
}

struct run
{
    size_t batch;
    struct ida_storage s;
    struct ida_entry *es;
    uint8_t *data;
    ida_index next;
    double entries, commits, seconds; /* summed over slices */
    double ratios[64];                /* commits/s over raw/s, per slice */
};

static void run_open(struct run *r, const char *base, size_t batch)
{
    char dir[400];
    snprintf(dir, sizeof(dir), "%s/node-b%zu", base, batch);
    struct ida_storage_opts o = {.cluster = "bench", .node_id = 1};
    memset(r, 0, sizeof(*r));
    r->batch = batch;
    r->next = 1;
    if (ida_storage_open(&r->s, dir, &o) != 0) {
        fprintf(stderr, "bench: %s\n", r->s.errmsg);
        exit(1);
    }
    r->es = ida_malloc(batch * sizeof(*r->es));
    r->data = ida_malloc(batch * ENTRY_BYTES);
    memset(r->data, 0xab, batch * ENTRY_BYTES);
}

/* Batches of r->batch entries (plus a hard state) for @secs; returns the
 * commits per second of this slice. */
static double run_slice(struct run *r, double secs)
{
    long commits = 0;
    ida_index first = r->next;
    double t0 = now_s(), t;
    do {
        for (size_t i = 0; i < r->batch; i++) {
            r->es[i] = (struct ida_entry){.term = 1,
                                          .index = r->next + i,
                                          .type = IDA_ENTRY_NORMAL,
                                          .data = r->data + i * ENTRY_BYTES,
                                          .len = ENTRY_BYTES};
        }
        struct ida_storage_batch b;
        ida_storage_batch_init(&r->s, &b);
        struct ida_hard_state hs = {1, 1, r->next};
        int rv = ida_storage_batch_append(&r->s, &b, r->es, r->batch);
        if (rv == 0) {
            rv = ida_storage_batch_set_hard_state(&r->s, &b, &hs);
        }
        if (rv == 0) {
            rv = ida_storage_batch_commit(&r->s, &b);
        }
        if (rv != 0) {
            fprintf(stderr, "bench: %s\n", r->s.errmsg);
            exit(1);
        }
        r->next += r->batch;
        commits++;
        t = now_s();
    } while (t - t0 < secs);
    r->entries += (double)(r->next - first);
    r->commits += (double)commits;
    r->seconds += t - t0;
    return (double)commits / (t - t0);
}

static void run_close(struct run *r)
{
    ida_storage_close(&r->s);
    ida_free(r->es);
    ida_free(r->data);
}

/* storage/seglog.h: one 128-byte record (an entry and a hard state)
 * appended and flushed per commit, for @secs; commits per second. */
static double seglog_slice(struct ida_seglog *l, double secs)
{
    uint8_t rec[ENTRY_BYTES + 28];
    memset(rec, 0xab, sizeof(rec));
    long commits = 0;
    double t0 = now_s(), t;
    do {
        struct iovec v = {rec, sizeof(rec)};
        if (ida_seglog_append(l, &v, 1, NULL, NULL) != 0 ||
            ida_seglog_sync(l) != 0) {
            fprintf(stderr, "bench: seglog append/sync failed\n");
            exit(1);
        }
        commits++;
        t = now_s();
    } while (t - t0 < secs);
    return (double)commits / (t - t0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* REOPEN: a log of REOPEN_RECORDS records of REOPEN_RECORD_BYTES in
 * segments of REOPEN_SEGMENT_BYTES, flushed, a whole spare made after them
 * (as the maker leaves one), then opened again REOPEN_ROUNDS times (the
 * spare made again before each, after a record appended): a restart's
 * open. The baseline is reading the same files once with pread() in the
 * same run, the least an open that checks every record could do. */
#define REOPEN_RECORDS       20000
#define REOPEN_RECORD_BYTES  2048
#define REOPEN_SEGMENT_BYTES (64u << 20)
#define REOPEN_ROUNDS        3

/* Seconds to read every file of @dir once (pread, 1 MiB at a time). */
static double read_files(const char *dir)
{
    static uint8_t buf[1 << 20];
    DIR *d = opendir(dir);
    double t0 = now_s();
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char path[900];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        off_t at = 0;
        ssize_t k;
        while (fd >= 0 && (k = pread(fd, buf, sizeof(buf), at)) > 0) {
            at += k;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    double t = now_s() - t0;
    if (d != NULL) {
        closedir(d);
    }
    return t;
}

/* Prints the reopen figure; 0, or 1 with a message. */
static int reopen_figure(const char *base)
{
    char dir[400], err[256];
    snprintf(dir, sizeof(dir), "%s/reopen", base);
    struct ida_seglog_options o = {.segment_bytes = REOPEN_SEGMENT_BYTES,
                                   .open_segment_bytes = 1u << 20};
    static uint8_t rec[REOPEN_RECORD_BYTES];
    struct ida_seglog *l = NULL;
    int rv = ida_seglog_open(dir, &o, NULL, NULL, &l, err, sizeof(err));
    struct iovec v = {rec, sizeof(rec)};
    uint64_t lsn;
    for (uint64_t i = 0; rv == 0 && i < REOPEN_RECORDS; i++) {
        memset(rec, (int)i, sizeof(rec));
        rv = ida_seglog_append(l, &v, 1, &lsn, NULL);
    }
    double open_s[REOPEN_ROUNDS], read_s[REOPEN_ROUNDS];
    for (int r = 0; rv == 0 && r < REOPEN_ROUNDS; r++) {
        if (r > 0) {
            /* As a restarted node appends: what the open went on in. */
            rv = ida_seglog_append(l, &v, 1, &lsn, NULL);
        }
        rv = rv == 0 ? ida_seglog_sync(l) : rv;
        rv = rv == 0 ? ida_seglog_prepare(l, 0) : rv;
        ida_seglog_close(l);
        l = NULL;
        read_s[r] = read_files(dir);
        double t0 = now_s();
        rv = rv == 0
                 ? ida_seglog_open(dir, &o, NULL, NULL, &l, err, sizeof(err))
                 : rv;
        open_s[r] = now_s() - t0;
    }
    ida_seglog_close(l);
    if (rv != 0) {
        fprintf(stderr, "bench: reopen: %s %s\n", idalloc_strerror(rv), err);
        return 1;
    }
    qsort(open_s, REOPEN_ROUNDS, sizeof(double), cmp_double);
    qsort(read_s, REOPEN_ROUNDS, sizeof(double), cmp_double);
    printf(
        "seglog reopen (%d records of %d bytes, %u MiB segments, a whole "
        "spare after them): median %.1f ms [min %.1f, max %.1f]; reading "
        "its files once: median %.1f ms; ratio %.2f\n",
        REOPEN_RECORDS, REOPEN_RECORD_BYTES, REOPEN_SEGMENT_BYTES >> 20,
        open_s[REOPEN_ROUNDS / 2] * 1000, open_s[0] * 1000,
        open_s[REOPEN_ROUNDS - 1] * 1000, read_s[REOPEN_ROUNDS / 2] * 1000,
        open_s[REOPEN_ROUNDS / 2] / read_s[REOPEN_ROUNDS / 2]);
    return 0;
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* GB/s of a CRC-32C function over @size-byte buffers: 512 bytes, the size
 * of a typical log entry batch slice, and 1 MiB, a stretch of a snapshot
 * read back (the hardware version's three side-by-side runs). */
static double crc_rate(uint32_t (*f)(uint32_t, const void *, size_t),
                       size_t size)
{
    static uint8_t buf[1 << 20];
    memset(buf, 0x5a, size);
    uint32_t c = 0;
    long n = 0;
    int per = size >= 65536 ? 20 : 10000;
    double t0 = now_sec(), t;
    do {
        for (int i = 0; i < per; i++) {
            c = f(c, buf, size);
        }
        n += per;
        t = now_sec();
    } while (t - t0 < 0.5);
    buf[0] = (uint8_t)c; /* keep the work */
    return (double)n * (double)size / (t - t0) / 1e9;
}

int main(void)
{
    for (size_t size = 512; size <= (1u << 20); size <<= 11) {
        double hw = crc_rate(ida__crc32c, size);
        double sw = crc_rate(ida__crc32c_portable, size);
        printf(
            "crc32c over %zu-byte buffers: %s %.2f GB/s, portable "
            "slicing-by-8 %.2f GB/s (ratio %.1f)\n",
            size, ida__crc32c_hw() ? "sse4.2" : "portable", hw, sw, hw / sw);
    }
    const char *env = getenv("BENCH_SECONDS");
    double secs = env ? atof(env) : 3.0;
    if (secs <= 0) {
        secs = 3.0;
    }
    /* The disk is shared and its speed drifts: measure in short slices,
     * each storage slice right after a raw slice, and compare each storage
     * slice with the raw slice just before it. */
    int slices = (int)(secs / 0.5);
    if (slices < 1) {
        slices = 1;
    }
    if (slices > 64) {
        slices = 64;
    }
    char base[256];
    if (ida_test_tmpdir(base, sizeof(base), "bench") != 0) {
        perror("mkdtemp");
        return 1;
    }
    printf(
        "storage bench: %s (%s), %d-byte entries, %d slices of 0.5 s "
        "per figure\n",
        base, fs_name(base), ENTRY_BYTES, slices);
    const size_t sizes[] = {1, 16, 256};
    struct run *runs = ida_calloc(3, sizeof(*runs));
    for (size_t i = 0; i < 3; i++) {
        run_open(&runs[i], base, sizes[i]);
    }
    char wal[400];
    snprintf(wal, sizeof(wal), "%s/wal", base);
    wal_file_make(wal);
    double raw_sum = 0, raw_rates[3 * 64], over_sum = 0, over_rates[64];
    double one_over[64], seg_over[64], seg_lmdb[64], seg_sum = 0;
    char segdir[400], err[256];
    snprintf(segdir, sizeof(segdir), "%s/seglog", base);
    struct ida_seglog_options so = {.segment_bytes = 16u << 20};
    struct ida_seglog *sl = NULL;
    if (ida_seglog_open(segdir, &so, NULL, NULL, &sl, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    int raw_count = 0;
    for (int k = 0; k < slices; k++) {
        double over = raw_rate(base, wal, 0.25);
        over_sum += over;
        over_rates[k] = over;
        double seg = seglog_slice(sl, 0.5);
        seg_sum += seg;
        seg_over[k] = seg / over;
        for (size_t i = 0; i < 3; i++) {
            double raw = raw_rate(base, NULL, 0.25);
            raw_sum += raw;
            raw_rates[raw_count++] = raw;
            double rate = run_slice(&runs[i], 0.5);
            runs[i].ratios[k] = rate / raw;
            if (i == 0) {
                one_over[k] = rate / over;
                seg_lmdb[k] = seg / rate;
            }
        }
    }
    unlink(wal);
    ida_seglog_close(sl);
    qsort(raw_rates, (size_t)raw_count, sizeof(double), cmp_double);
    printf(
        "raw fdatasync (128-byte append + fdatasync): mean %.0f/s, median "
        "%.0f/s, min %.0f/s, max %.0f/s\n",
        raw_sum / raw_count, raw_rates[raw_count / 2], raw_rates[0],
        raw_rates[raw_count - 1]);
    qsort(over_rates, (size_t)slices, sizeof(double), cmp_double);
    qsort(one_over, (size_t)slices, sizeof(double), cmp_double);
    printf(
        "raw fdatasync, overwrite (128 bytes into a block already written + "
        "fdatasync: a log file's floor): mean %.0f/s, median %.0f/s, min "
        "%.0f/s, max %.0f/s; batch=1 commits/s over it: median %.2f [min "
        "%.2f, max %.2f]\n",
        over_sum / slices, over_rates[slices / 2], over_rates[0],
        over_rates[slices - 1], one_over[slices / 2], one_over[0],
        one_over[slices - 1]);
    qsort(seg_over, (size_t)slices, sizeof(double), cmp_double);
    qsort(seg_lmdb, (size_t)slices, sizeof(double), cmp_double);
    printf(
        "seglog (storage/seglog.h: a 128-byte record appended + flushed per "
        "commit): mean %.0f commits/s; over the overwrite floor: median "
        "%.2f [min %.2f, max %.2f]; over LMDB's batch=1 commits: median "
        "%.2f [min %.2f, max %.2f]\n",
        seg_sum / slices, seg_over[slices / 2], seg_over[0],
        seg_over[slices - 1], seg_lmdb[slices / 2], seg_lmdb[0],
        seg_lmdb[slices - 1]);
    for (size_t i = 0; i < 3; i++) {
        struct run *r = &runs[i];
        qsort(r->ratios, (size_t)slices, sizeof(double), cmp_double);
        printf(
            "batch=%-4zu entries/s=%-9.0f commits/s=%-7.0f "
            "ratio(commits/s / raw fdatasync/s): median %.2f "
            "[min %.2f, max %.2f]\n",
            r->batch, r->entries / r->seconds, r->commits / r->seconds,
            r->ratios[slices / 2], r->ratios[0], r->ratios[slices - 1]);
        run_close(r);
    }
    ida_free(runs);
    int failed = reopen_figure(base);
    ida_test_rmrf(base);
    return failed;
}
