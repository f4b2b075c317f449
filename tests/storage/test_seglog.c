#define _DEFAULT_SOURCE /* usleep */
/* storage/seglog.h: a log of records in segment files, against real files:
 * records replayed in order across segments, a torn tail dropped and
 * written past, durable records that were damaged or removed refused,
 * foreign and other-version segments refused, release, the spare made in
 * steps or by the maker's thread (with released segments removed there),
 * a whole spare gone on in by the next open (one holding anything else
 * removed),
 * bad input changing nothing, and processes killed while they append and
 * flush, with and without the maker. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "storage/seglog.h"
#include "tests/storage/helpers.h"

#define SEG    (64u * 1024u)
#define MAXREC 3000

static char tmp[256];
static char dir[300];

static void setup(void)
{
    cr_assert_eq(ida_test_tmpdir(tmp, sizeof(tmp), "seglog"), 0);
    snprintf(dir, sizeof(dir), "%s/log", tmp);
}

static void teardown(void)
{
    ida_test_rmrf(tmp);
}

TestSuite(seglog, .init = setup, .fini = teardown);

static struct ida_seglog_options opts(char who)
{
    struct ida_seglog_options o = {.segment_bytes = SEG};
    memset(o.ident, who, sizeof(o.ident));
    return o;
}

/* The deterministic content of record @lsn (of generation @gen). */
static size_t rec_len(uint64_t lsn)
{
    return 1 + (size_t)((lsn * 7919u) % MAXREC);
}

static void rec_fill(uint8_t *buf, uint64_t lsn, int gen)
{
    size_t n = rec_len(lsn);
    for (size_t i = 0; i < n; i++) {
        buf[i] = (uint8_t)(lsn * 31u + i + (size_t)gen * 101u);
    }
}

/* What open replayed. */
struct seen
{
    uint64_t first, last, count;
    int bad;       /* records whose bytes were not their LSN's */
    int ended;     /* the end of the replay was told */
    int gen[4096]; /* the generation each LSN's bytes matched */
    struct ida_seglog_pos pos[4096];
};

static int on_record(void *ctx,
                     uint64_t lsn,
                     const uint8_t *data,
                     size_t len,
                     struct ida_seglog_pos pos)
{
    struct seen *s = ctx;
    if (lsn == 0) {
        s->ended = 1; /* the replay's end */
        return 0;
    }
    if (s->count == 0) {
        s->first = lsn;
    } else if (lsn != s->last + 1) {
        s->bad++;
    }
    s->last = lsn;
    s->count++;
    uint8_t want[MAXREC];
    int gen = -1;
    for (int g = 0; g < 2 && gen < 0; g++) {
        rec_fill(want, lsn, g);
        if (len == rec_len(lsn) && memcmp(want, data, len) == 0) {
            gen = g;
        }
    }
    if (gen < 0) {
        s->bad++;
    }
    if (lsn < 4096) {
        s->gen[lsn] = gen;
        s->pos[lsn] = pos;
    }
    return 0;
}

static struct ida_seglog *open_opts(struct ida_seglog_options o, struct seen *s)
{
    struct ida_seglog *l = NULL;
    char err[512];
    if (s != NULL) {
        memset(s, 0, sizeof(*s));
    }
    int rv = ida_seglog_open(dir, &o, s != NULL ? on_record : NULL, s, &l, err,
                             sizeof(err));
    cr_assert_eq(rv, 0, "open: %s (%s)", idalloc_strerror(rv), err);
    cr_assert(s == NULL || s->ended, "the end of the replay is told");
    return l;
}

static struct ida_seglog *open_ok(char who, struct seen *s)
{
    return open_opts(opts(who), s);
}

/* With the maker (o.behind: THE MAKER in seglog.h). */
static struct ida_seglog *open_behind(struct seen *s)
{
    struct ida_seglog_options o = opts('a');
    o.behind = true;
    return open_opts(o, s);
}

static int open_rv(char who, uint64_t min_lsn, char *err, size_t errlen)
{
    struct ida_seglog_options o = opts(who);
    o.min_lsn = min_lsn;
    struct ida_seglog *l = NULL;
    int rv = ida_seglog_open(dir, &o, NULL, NULL, &l, err, errlen);
    if (rv == 0) {
        ida_seglog_close(l);
    }
    return rv;
}

static void append_gen(struct ida_seglog *l,
                       uint64_t lsn,
                       int gen,
                       struct ida_seglog_pos *pos)
{
    uint8_t buf[MAXREC];
    rec_fill(buf, lsn, gen);
    size_t n = rec_len(lsn);
    /* In two pieces, as a caller gathers a header and a body. */
    struct iovec v[2] = {{buf, n / 2}, {buf + n / 2, n - n / 2}};
    uint64_t got = 0;
    int k = v[0].iov_len == 0 ? 1 : 2;
    int rv = ida_seglog_append(l, k == 2 ? v : v + 1, k, &got, pos);
    cr_assert_eq(rv, 0, "append %llu: %s", (unsigned long long)lsn,
                 idalloc_strerror(rv));
    cr_assert_eq(got, lsn);
}

static void append_n(struct ida_seglog *l, uint64_t from, uint64_t to)
{
    for (uint64_t lsn = from; lsn <= to; lsn++) {
        append_gen(l, lsn, 0, NULL);
    }
}

/* The path of segment file @seq of the log in @d. */
static void seg_path(char path[600], const char *d, uint64_t seq)
{
    snprintf(path, 600, "%s/seg-%016llx", d, (unsigned long long)seq);
}

/* The segment file holding @pos, and the file offset of byte @k of the
 * record's data. */
static void flip(struct ida_seglog_pos pos, size_t k)
{
    char path[600];
    seg_path(path, dir, pos.seq);
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0, "%s", path);
    off_t at = (off_t)(pos.off + IDA_SEGLOG_RECORD_HDR_BYTES + k);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x40;
    cr_assert_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

/* Files of the log's directory whose names start with @prefix-. */
static int count_files(const char *prefix)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    size_t k = strlen(prefix);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        n += strncmp(e->d_name, prefix, k) == 0 && e->d_name[k] == '-';
    }
    closedir(d);
    return n;
}

Test(seglog, records_come_back_in_order_across_segments_and_read_again)
{
    struct seen s;
    struct ida_seglog *l = open_ok('a', &s);
    cr_assert_eq(s.count, 0);
    cr_assert_eq(ida_seglog_next_lsn(l), 1);
    struct ida_seglog_pos pos[1001];
    for (uint64_t lsn = 1; lsn <= 1000; lsn++) {
        append_gen(l, lsn, 0, &pos[lsn]);
        if (lsn % 37 == 0) {
            cr_assert_eq(ida_seglog_sync(l), 0);
            cr_assert_eq(ida_seglog_synced_lsn(l), lsn);
        }
    }
    cr_assert_eq(ida_seglog_sync(l), 0);
    cr_assert_gt(ida_seglog_segments(l), 10,
                 "1000 records of ~1.5 KB "
                 "fill many 64 KiB segments");
    /* Read again from where append said, this process and the next. */
    for (uint64_t lsn = 1; lsn <= 1000; lsn += 97) {
        uint8_t *d;
        size_t n;
        uint8_t want[MAXREC];
        cr_assert_eq(ida_seglog_read(l, pos[lsn], lsn, &d, &n), 0);
        rec_fill(want, lsn, 0);
        cr_assert(n == rec_len(lsn) && memcmp(d, want, n) == 0);
        ida_free(d);
    }
    uint8_t *d;
    size_t n;
    cr_assert_eq(ida_seglog_read(l, pos[5], 6, &d, &n), IDA_ENOTFOUND,
                 "another LSN's place");
    ida_seglog_close(l);
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 1000);
    cr_assert_eq(s.first, 1);
    cr_assert_eq(s.last, 1000);
    cr_assert_eq(s.bad, 0);
    cr_assert_eq(ida_seglog_next_lsn(l), 1001);
    cr_assert_eq(ida_seglog_synced_lsn(l), 1000);
    cr_assert_eq(s.pos[500].seq, pos[500].seq);
    cr_assert_eq(s.pos[500].off, pos[500].off);
    /* The next records follow, in a segment of their own. */
    append_n(l, 1001, 1010);
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 1010);
    cr_assert_eq(s.bad, 0);
    ida_seglog_close(l);
}

/* The sizes of the segment files, in sequence order (up to @cap). */
static size_t segment_sizes(off_t *out, size_t cap)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    char names[32][64];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < 32) {
        if (strncmp(de->d_name, "seg-", 4) == 0) {
            snprintf(names[n++], sizeof(names[0]), "%.40s", de->d_name);
        }
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]),
          (int (*)(const void *, const void *))strcmp);
    for (size_t i = 0; i < n && i < cap; i++) {
        char p[400];
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        struct stat st;
        cr_assert_eq(stat(p, &st), 0);
        out[i] = st.st_size;
    }
    return n;
}

/* An open that makes a smaller segment (open_segment_bytes) writes less;
 * a record that does not fit it goes on in a whole one, and every record
 * comes back. */
Test(seglog, an_open_may_start_in_a_smaller_segment)
{
    struct ida_seglog_options o = opts('a');
    o.segment_bytes = 4 * SEG;
    o.open_segment_bytes = SEG;
    struct ida_seglog *l = NULL;
    char err[512];
    cr_assert_eq(ida_seglog_open(dir, &o, NULL, NULL, &l, err, sizeof(err)), 0,
                 "%s", err);
    append_n(l, 1, 100); /* ~75 KB: more than the first holds */
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    off_t sizes[32];
    size_t n = segment_sizes(sizes, 32);
    cr_assert_geq(n, 2);
    cr_assert_eq(sizes[0], SEG, "the open's segment is small");
    cr_assert_eq(sizes[1], 4 * SEG, "the next is whole");
    struct seen s;
    memset(&s, 0, sizeof(s));
    cr_assert_eq(ida_seglog_open(dir, &o, on_record, &s, &l, err, sizeof(err)),
                 0, "%s", err);
    cr_assert(s.count == 100 && s.first == 1 && s.bad == 0);
    ida_seglog_close(l);
    o.open_segment_bytes = 8 * SEG;
    cr_assert_eq(ida_seglog_open(dir, &o, NULL, NULL, &l, err, sizeof(err)),
                 IDA_EINVAL, "larger than a segment");
}

/* Records written after the last flush may be lost or torn: the first bad
 * one ends the log, later ones that are whole are dropped with it (they
 * were never acknowledged), and the appends after it never meet them. */
Test(seglog, a_torn_tail_is_dropped_and_written_past)
{
    struct ida_seglog *l = open_ok('a', NULL);
    struct ida_seglog_pos pos[11];
    for (uint64_t lsn = 1; lsn <= 10; lsn++) {
        append_gen(l, lsn, 0, &pos[lsn]);
        if (lsn == 7) {
            cr_assert_eq(ida_seglog_sync(l), 0);
        }
    }
    ida_seglog_close(l); /* 8..10 were never flushed */
    cr_assert_eq(pos[9].seq, pos[10].seq);
    flip(pos[9], 0);
    struct seen s;
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 8, "8 is whole, 9 torn, 10 dropped with it");
    cr_assert_eq(s.bad, 0);
    cr_assert_eq(ida_seglog_next_lsn(l), 9);
    append_gen(l, 9, 1, NULL);
    append_gen(l, 10, 1, NULL);
    append_gen(l, 11, 1, NULL);
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 11);
    cr_assert_eq(s.bad, 0);
    cr_assert_eq(s.gen[8], 0);
    cr_assert_eq(s.gen[9], 1, "the new 9, not the torn one");
    cr_assert_eq(s.gen[10], 1, "the new 10, not the stale whole one");
    ida_seglog_close(l);
}

/* A record later records say was durable, damaged: refused, in any
 * segment, and the files are left as they were. */
Test(seglog, a_damaged_durable_record_is_refused)
{
    struct ida_seglog *l = open_ok('a', NULL);
    struct ida_seglog_pos pos[301];
    for (uint64_t lsn = 1; lsn <= 300; lsn++) {
        append_gen(l, lsn, 0, &pos[lsn]);
        if (lsn % 10 == 0) {
            cr_assert_eq(ida_seglog_sync(l), 0);
        }
    }
    ida_seglog_close(l);
    uint64_t victims[] = {5, 10, 150, 290};
    for (size_t i = 0; i < sizeof(victims) / sizeof(victims[0]); i++) {
        uint64_t v = victims[i];
        flip(pos[v], rec_len(v) - 1);
        char err[512];
        cr_assert_eq(open_rv('a', 0, err, sizeof(err)), IDA_ECORRUPT,
                     "LSN %llu damaged", (unsigned long long)v);
        char want[64];
        snprintf(want, sizeof(want), "ends at LSN %llu,",
                 (unsigned long long)(v - 1));
        cr_assert(strstr(err, want) != NULL, "%s", err);
        flip(pos[v], rec_len(v) - 1); /* mended: opens whole again */
        struct seen s;
        l = open_ok('a', &s);
        cr_assert_eq(s.count, 300);
        ida_seglog_close(l);
    }
}

/* The last record flushed, damaged, with nothing after it: only the
 * caller's floor can tell it from a torn tail. */
Test(seglog, the_floor_tells_a_damaged_last_record_from_a_torn_one)
{
    struct ida_seglog *l = open_ok('a', NULL);
    struct ida_seglog_pos pos[6];
    for (uint64_t lsn = 1; lsn <= 5; lsn++) {
        append_gen(l, lsn, 0, &pos[lsn]);
    }
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    flip(pos[5], 0);
    char err[512];
    cr_assert_eq(open_rv('a', 5, err, sizeof(err)), IDA_ECORRUPT);
    cr_assert(strstr(err, "LSN 5 was durable") != NULL, "%s", err);
    struct seen s;
    l = open_ok('a', &s); /* no floor: a torn tail */
    cr_assert_eq(s.count, 4);
    ida_seglog_close(l);
}

/* A segment removed from the middle (or rolled back): refused. */
Test(seglog, a_missing_segment_is_refused)
{
    struct ida_seglog *l = open_ok('a', NULL);
    struct ida_seglog_pos pos[201];
    for (uint64_t lsn = 1; lsn <= 200; lsn++) {
        append_gen(l, lsn, 0, &pos[lsn]);
        cr_assert_eq(ida_seglog_sync(l), 0);
    }
    ida_seglog_close(l);
    char path[512];
    snprintf(path, sizeof(path), "%s/seg-%016llx", dir,
             (unsigned long long)pos[100].seq);
    cr_assert_eq(unlink(path), 0);
    char err[512];
    cr_assert_eq(open_rv('a', 0, err, sizeof(err)), IDA_ECORRUPT);
    cr_assert(strstr(err, "durable") != NULL, "%s", err);
}

Test(seglog, another_nodes_or_versions_segments_are_refused)
{
    struct ida_seglog *l = open_ok('a', NULL);
    struct ida_seglog_pos pos;
    append_gen(l, 1, 0, &pos);
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    char err[512];
    cr_assert_eq(open_rv('b', 0, err, sizeof(err)), IDA_EFOREIGN);
    cr_assert(strstr(err, "another node") != NULL, "%s", err);
    /* Its version changed (and its checksum made right). */
    char path[512];
    snprintf(path, sizeof(path), "%s/seg-%016llx", dir,
             (unsigned long long)pos.seq);
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t h[68];
    cr_assert_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    h[8] = 2;
    uint32_t crc = ida__crc32c(0, h, 64);
    for (int i = 0; i < 4; i++) {
        h[64 + i] = (uint8_t)(crc >> (8 * i));
    }
    cr_assert_eq(pwrite(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    close(fd);
    cr_assert_eq(open_rv('a', 0, err, sizeof(err)), IDA_EVERSION);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "a refused segment stays");
}

Test(seglog, release_removes_whole_segments_below_an_lsn)
{
    struct ida_seglog *l = open_ok('a', NULL);
    struct ida_seglog_pos pos[401];
    for (uint64_t lsn = 1; lsn <= 400; lsn++) {
        append_gen(l, lsn, 0, &pos[lsn]);
    }
    cr_assert_eq(ida_seglog_sync(l), 0);
    size_t before = ida_seglog_segments(l);
    cr_assert_eq(ida_seglog_release(l, 200), 0);
    size_t after = ida_seglog_segments(l);
    cr_assert_lt(after, before);
    uint8_t *d;
    size_t n;
    cr_assert_eq(ida_seglog_read(l, pos[1], 1, &d, &n), IDA_ENOTFOUND);
    cr_assert_eq(ida_seglog_read(l, pos[200], 200, &d, &n), 0,
                 "200 is kept: its segment is not all below 200");
    ida_free(d);
    ida_seglog_close(l);
    struct seen s;
    l = open_ok('a', &s);
    cr_assert_gt(s.first, 1);
    cr_assert_leq(s.first, 200);
    cr_assert_eq(s.last, 400);
    cr_assert_eq(s.bad, 0);
    /* Everything: only the segment appends go to stays. */
    cr_assert_eq(ida_seglog_release(l, 401), 0);
    ida_seglog_close(l);
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 0);
    cr_assert_eq(ida_seglog_next_lsn(l), 401, "LSNs go on");
    ida_seglog_close(l);
}

/* The next segment is made a piece at a time, and an append that needs it
 * takes it; what a process that died left half made is removed. */
Test(seglog, the_spare_is_made_in_steps_and_leftovers_are_removed)
{
    struct ida_seglog *l = open_ok('a', NULL);
    int busy = 0, rv;
    while ((rv = ida_seglog_prepare(l, SEG / 8)) == IDA_EBUSY) {
        busy++;
    }
    cr_assert_eq(rv, 0);
    cr_assert_geq(busy, 7, "a segment of 64 KiB in steps of 8 KiB");
    cr_assert_eq(ida_seglog_segments(l), 2);
    cr_assert_eq(ida_seglog_prepare(l, SEG / 8), 0, "ready: nothing to do");
    append_n(l, 1, 100); /* fills the first and takes the spare */
    cr_assert_eq(ida_seglog_sync(l), 0);
    cr_assert_eq(ida_seglog_prepare(l, SEG / 8), IDA_EBUSY);
    ida_seglog_close(l); /* a half-made spare is removed */
    cr_assert_eq(count_files("tmp"), 0);
    cr_assert_geq(count_files("seg"), 2, "the segments are counted");
    /* What a process that died leaves: a half-made spare, and a segment
     * it was switching to whose header never reached the disk. */
    char path[512];
    snprintf(path, sizeof(path), "%s/tmp-%016llx", dir, 99ull);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(path, sizeof(path), "%s/seg-%016llx", dir, 98ull);
    fd = open(path, O_CREAT | O_WRONLY, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, SEG), 0);
    close(fd);
    snprintf(path, sizeof(path), "%s/seg-%016llx", dir, 97ull);
    fd = open(path, O_CREAT | O_WRONLY, 0600); /* made, nothing written */
    cr_assert_geq(fd, 0);
    close(fd);
    struct seen s;
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 100);
    cr_assert_eq(count_files("tmp"), 0);
    snprintf(path, sizeof(path), "%s/seg-%016llx", dir, 98ull);
    cr_assert_neq(access(path, F_OK), 0, "the empty segment is removed");
    snprintf(path, sizeof(path), "%s/seg-%016llx", dir, 97ull);
    cr_assert_neq(access(path, F_OK), 0, "and the one of 0 bytes");
    ida_seglog_close(l);
}

/* The segment files: how many, and their lowest and highest sequence
 * numbers (UINT64_MAX and 0 when none). */
static int seg_seqs(uint64_t *lo, uint64_t *hi)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    *lo = UINT64_MAX;
    *hi = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        unsigned long long seq;
        if (sscanf(e->d_name, "seg-%16llx", &seq) == 1) {
            *lo = seq < *lo ? seq : *lo;
            *hi = seq > *hi ? seq : *hi;
            n++;
        }
    }
    closedir(d);
    return n;
}

/* The highest sequence number of the segment files (0: none). */
static uint64_t last_seg(void)
{
    uint64_t lo, hi;
    seg_seqs(&lo, &hi);
    return hi;
}

/* A log of records 1..50, flushed, and a whole spare made after them;
 * closed. The spare's sequence number. */
static uint64_t fifty_and_a_spare(void)
{
    struct ida_seglog *l = open_ok('a', NULL);
    append_n(l, 1, 50);
    cr_assert_eq(ida_seglog_sync(l), 0);
    cr_assert_eq(ida_seglog_prepare(l, 0), 0, "the spare made whole");
    uint64_t spare = last_seg();
    ida_seglog_close(l);
    cr_assert_eq(last_seg(), spare, "close keeps a whole spare");
    return spare;
}

/* A whole spare left by the last process (header naming no LSN, zeros
 * after it) is where appends go on after an open: no new segment is
 * made, the spare is not removed (freeing a 64 MiB file's pages held a
 * node's restart ~50 ms). */
Test(seglog, an_open_goes_on_in_a_whole_spare)
{
    uint64_t spare = fifty_and_a_spare();
    int files = count_files("seg");
    struct seen s;
    struct ida_seglog *l = open_ok('a', &s);
    cr_assert_eq(s.count, 50);
    cr_assert_eq(count_files("seg"), files, "no segment made, none removed");
    cr_assert_eq(last_seg(), spare);
    append_n(l, 51, 60);
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    l = open_ok('a', &s);
    cr_assert(s.count == 60 && s.first == 1 && s.bad == 0);
    cr_assert_eq(s.pos[51].seq, spare, "51 went to the spare");
    cr_assert_eq(s.pos[51].off, IDA_SEGLOG_HEADER_BYTES);
    ida_seglog_close(l);
}

/* The bytes of record @lsn as a log of its own writes it (records before
 * it flushed up to @synced); *@len their count. */
static uint8_t *record_bytes(uint64_t lsn, uint64_t synced, size_t *len)
{
    char other[sizeof(dir)], err[512];
    snprintf(other, sizeof(other), "%s/other", tmp);
    ida_test_rmrf(other);
    struct ida_seglog_options o = opts('a');
    struct ida_seglog *l = NULL;
    cr_assert_eq(ida_seglog_open(other, &o, NULL, NULL, &l, err, sizeof(err)),
                 0, "%s", err);
    append_n(l, 1, synced);
    cr_assert_eq(ida_seglog_sync(l), 0);
    append_n(l, synced + 1, lsn - 1);
    struct ida_seglog_pos pos;
    append_gen(l, lsn, 0, &pos);
    ida_seglog_close(l);
    char seg[600];
    seg_path(seg, other, pos.seq);
    *len = (IDA_SEGLOG_RECORD_HDR_BYTES + rec_len(lsn) + 7) & ~(size_t)7;
    uint8_t *rec = ida_calloc(1, *len);
    int fd = open(seg, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pread(fd, rec, *len, (off_t)pos.off), (ssize_t)*len);
    close(fd);
    return rec;
}

/* Write @len bytes of @buf at @off into segment file @seq. */
static void poke(uint64_t seq, const void *buf, size_t len, off_t off)
{
    char seg[600];
    seg_path(seg, dir, seq);
    int fd = open(seg, O_WRONLY);
    cr_assert_geq(fd, 0, "%s", seg);
    cr_assert_eq(pwrite(fd, buf, len, off), (ssize_t)len);
    close(fd);
}

/* Whether segment file @seq is there. */
static bool seg_exists(uint64_t seq)
{
    char seg[600];
    seg_path(seg, dir, seq);
    return access(seg, F_OK) == 0;
}

/* A spare whose header names no LSN but whose bytes are not all zeros
 * (records of a segment switched to, written back to the disk before its
 * header was, when the machine stopped) is removed as before, never
 * written into: here it holds a whole record of the very LSN that comes
 * next, which a log going on in it would read back as its own. */
Test(seglog, a_spare_holding_anything_but_zeros_is_not_gone_on_in)
{
    size_t len;
    uint8_t *rec = record_bytes(51, 50, &len); /* says 50 was durable */
    uint64_t spare = fifty_and_a_spare();
    poke(spare, rec, len, IDA_SEGLOG_HEADER_BYTES);
    ida_free(rec);
    struct seen s;
    struct ida_seglog *l = open_ok('a', &s);
    cr_assert_eq(s.count, 50);
    cr_assert(!seg_exists(spare), "that spare is removed");
    cr_assert_gt(last_seg(), spare, "appends go on in a new segment");
    ida_seglog_close(l);
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 50, "the stray record 51 never comes back");
    cr_assert_eq(ida_seglog_next_lsn(l), 51);
    ida_seglog_close(l);
}

/* Every byte of a spare counts, to its last one; and a spare of another
 * size than the log's segments is not gone on in either. */
Test(seglog, a_spare_is_gone_on_in_only_if_it_is_all_zeros_and_whole)
{
    uint64_t spare = fifty_and_a_spare();
    uint8_t one = 1;
    poke(spare, &one, 1, SEG - 1);
    struct ida_seglog *l = open_ok('a', NULL);
    cr_assert(!seg_exists(spare), "a byte at its end: removed");
    ida_seglog_close(l);
    ida_test_rmrf(dir);
    spare = fifty_and_a_spare();
    struct ida_seglog_options o = opts('a');
    o.segment_bytes = 2 * SEG;
    struct seen s;
    l = open_opts(o, &s);
    cr_assert_eq(s.count, 50);
    cr_assert(!seg_exists(spare), "of another segment size: removed");
    ida_seglog_close(l);
}

/* A record deep in a spare (past its first pages) that says an LSN after
 * the log's end was durable makes the open refuse, as anywhere after the
 * end: zeros are skipped, nothing else is. */
Test(seglog, a_durable_claim_deep_in_a_spare_is_refused)
{
    size_t len;
    uint8_t *rec = record_bytes(52, 51, &len); /* says 51 was durable */
    uint64_t spare = fifty_and_a_spare();
    poke(spare, rec, len, (off_t)(SEG - 2 * 4096));
    ida_free(rec);
    char err[512];
    cr_assert_eq(open_rv('a', 0, err, sizeof(err)), IDA_ECORRUPT, "%s", err);
    cr_assert(seg_exists(spare), "nothing is changed");
}

/* Whether the segment files' sequence numbers form one run; *@n their
 * number. (Not so in general: an open that removes an empty segment a
 * crash left does not use its number again. Here, without a crash, a hole
 * is a segment removed while an older one stays.) */
static bool seg_files_one_run(int *n)
{
    uint64_t lo, hi;
    *n = seg_seqs(&lo, &hi);
    return *n > 0 && hi - lo + 1 == (uint64_t)*n;
}

static void faults_off(void)
{
    ida__seglog_fault_set(0, -1, 0, 0);
    ida__seglog_fault_set(1, -1, 0, 0);
}

/* Files of released segments still there beside the one appends go to
 * and the spare, or a spare being made. */
static bool released_files_left(void)
{
    int seg = count_files("seg");
    return seg < 1 || seg > 2 || count_files("tmp") > 0;
}

/* Call prepare and release below @lsn until the maker removed what was
 * released (one or two segment files left), for at most 10 s. */
static bool pump_removal(struct ida_seglog *l, uint64_t lsn)
{
    for (int i = 0; i < 10000; i++) {
        int rv = ida_seglog_prepare(l, SEG / 8);
        cr_assert(rv == 0 || rv == IDA_EBUSY, "prepare: %s",
                  idalloc_strerror(rv));
        cr_assert_eq(ida_seglog_release(l, lsn), 0);
        if (!released_files_left()) {
            return true;
        }
        usleep(1000);
    }
    return false;
}

static bool two_segment_files(void)
{
    return count_files("seg") == 2 && count_files("tmp") == 0;
}

/* With o.behind a thread makes the spare whole and removes what release
 * let go of, in order; appends never wait for it but to take a spare
 * still being made, and close waits for whatever it began. */
Test(seglog, the_maker_makes_the_spare_and_removes_released_segments)
{
    struct ida_seglog *l = open_behind(NULL);
    cr_assert_eq(ida_seglog_prepare(l, SEG / 8), IDA_EBUSY,
                 "the first call starts the maker and returns");
    /* No more calls: the maker writes it all (in line, 8 KiB a call, it
     * would take eight), and names it seg- once it is flushed. */
    for (int i = 0; i < 10000 && !two_segment_files(); i++) {
        usleep(1000);
    }
    cr_assert(two_segment_files(), "the maker made the spare alone");
    int rv, tries = 0; /* it may still be flushing the directory */
    while ((rv = ida_seglog_prepare(l, SEG / 8)) == IDA_EBUSY &&
           ++tries < 10000) {
        usleep(1000);
    }
    cr_assert_eq(rv, 0, "the spare is made: %s", idalloc_strerror(rv));
    cr_assert(two_segment_files());
    cr_assert_eq(ida_seglog_segments(l), 2);
    /* Appends across several segments: each switch takes the spare the
     * maker began (waiting for it), or makes one in line. */
    for (uint64_t lsn = 1; lsn <= 400; lsn++) {
        append_gen(l, lsn, 0, NULL);
        if (lsn % 7 == 0) {
            (void)ida_seglog_prepare(l, SEG / 8);
        }
    }
    cr_assert_eq(ida_seglog_sync(l), 0);
    size_t kept = ida_seglog_segments(l);
    cr_assert_geq(kept, 4, "400 records span segments of 64 KiB");
    /* Every segment below the last goes; the files follow. */
    cr_assert_eq(ida_seglog_release(l, 401), 0);
    cr_assert_leq(ida_seglog_segments(l), 2, "gone from the log at once");
    cr_assert(pump_removal(l, 401), "the released files are removed: %d left",
              count_files("seg"));
    append_n(l, 401, 450);
    cr_assert_eq(ida_seglog_sync(l), 0);
    /* Close with the maker at work: it finishes, nothing half made. */
    cr_assert_eq(ida_seglog_release(l, 451), 0);
    (void)ida_seglog_prepare(l, SEG / 8);
    ida_seglog_close(l);
    cr_assert_eq(count_files("tmp"), 0, "close waited for the maker");
    struct seen s;
    l = open_behind(&s);
    cr_assert_eq(s.bad, 0);
    cr_assert_eq(s.last, 450);
    cr_assert_gt(s.first, 300, "released below 401, then 451");
    cr_assert_eq(ida_seglog_next_lsn(l), 451);
    ida_seglog_close(l);
}

/* A removal that fails (with the maker or in line) stops all removals:
 * the segment it failed on and every newer one stay, so the files stay a
 * run, every later release says so, and the log opens again whole. */
static void failed_removal(bool behind)
{
    struct ida_seglog_options o = opts('a');
    o.behind = behind;
    struct ida_seglog *l = open_opts(o, NULL);
    append_n(l, 1, 600);
    cr_assert_eq(ida_seglog_sync(l), 0);
    int files, now;
    cr_assert(seg_files_one_run(&files));
    cr_assert_geq(files, 6, "600 records span segments of 64 KiB");
    ida__seglog_fault_set(0, 0, -1, IDA_EIO); /* every removal fails */
    int rv = ida_seglog_release(l, 200);
    for (int i = 0; behind && rv == 0 && i < 10000; i++) {
        usleep(1000); /* until the maker's failure is collected */
        rv = ida_seglog_release(l, 400);
    }
    cr_assert_eq(rv, IDA_EIO, "the failure is told: %s", idalloc_strerror(rv));
    faults_off(); /* removals would work again: none is tried */
    cr_assert_eq(ida_seglog_release(l, 500), IDA_EIO, "and told again");
    (void)ida_seglog_prepare(l, SEG / 8);
    append_n(l, 601, 700);
    cr_assert_eq(ida_seglog_sync(l), 0);
    cr_assert_eq(ida_seglog_release(l, 650), IDA_EIO);
    ida_seglog_close(l);
    cr_assert(seg_files_one_run(&now), "no hole in the segment files");
    cr_assert_geq(now, files, "none of them was removed");
    struct seen s;
    l = open_opts(o, &s);
    cr_assert_eq(s.bad, 0);
    cr_assert_eq(s.first, 1, "released, but left for this open to replay");
    cr_assert_eq(s.last, 700);
    cr_assert_eq(s.count, 700);
    ida_seglog_close(l);
}

Test(seglog, a_failed_removal_with_the_maker_removes_nothing_newer)
{
    failed_removal(true);
}

Test(seglog, a_failed_removal_in_line_removes_nothing_newer)
{
    failed_removal(false);
}

/* Flush and close @l, then open the log again (with the maker) into *@s:
 * every record whole, the last @last. */
static void sync_and_reopen(struct ida_seglog *l, struct seen *s, uint64_t last)
{
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    l = open_behind(s);
    cr_assert_eq(s->bad, 0);
    cr_assert_eq(s->last, last);
    ida_seglog_close(l);
}

/* While no spare can be made (a full disk), the maker removes what was
 * released instead of only trying the spare again: that is what frees
 * the room. Then an append makes the spare in line. */
Test(seglog, released_segments_go_while_the_spare_cannot_be_made)
{
    struct ida_seglog *l = open_behind(NULL);
    append_n(l, 1, 400);
    cr_assert_eq(ida_seglog_sync(l), 0);
    int files;
    cr_assert(seg_files_one_run(&files));
    cr_assert_geq(files, 4);
    ida__seglog_fault_set(1, 0, -1, IDA_ENOSPC); /* every spare write */
    cr_assert_eq(ida_seglog_prepare(l, SEG / 8), IDA_EBUSY, "a spare begins");
    cr_assert_eq(ida_seglog_release(l, 401), 0, "all but the last go");
    int rv = IDA_EBUSY, failed = 0;
    for (int i = 0; i < 5000 && count_files("seg") > 1; i++) {
        rv = ida_seglog_prepare(l, SEG / 8);
        cr_assert(rv == IDA_EBUSY || rv == IDA_ENOSPC, "prepare: %s",
                  idalloc_strerror(rv));
        failed += rv == IDA_ENOSPC;
        usleep(1000);
    }
    cr_assert_eq(count_files("seg"), 1, "the released files are removed");
    cr_assert_geq(failed, 1, "the spare's failure was told");
    faults_off();
    append_n(l, 401, 500); /* the spare is made when an append needs it */
    struct seen s;
    sync_and_reopen(l, &s, 500);
    cr_assert_leq(s.first, 400, "the segment 400 was in is kept");
}

/* A spare the maker failed to make (its failure not yet collected) does
 * not fail the append that needs a segment: that append makes one. */
Test(seglog, an_append_makes_the_spare_the_maker_failed_to_make)
{
    struct ida_seglog *l = open_behind(NULL);
    ida__seglog_fault_set(1, 0, 1, IDA_EIO); /* the next spare write, once */
    cr_assert_eq(ida_seglog_prepare(l, SEG / 8), IDA_EBUSY);
    usleep(100000);      /* the maker fails at its first write, and stops */
    append_n(l, 1, 300); /* switches segments: the first collects it */
    struct seen s;
    sync_and_reopen(l, &s, 300);
    cr_assert_eq(s.first, 1);
}

/* THE MAKER's pacing (seglog.h): a spare made at leisure is written a
 * piece at a time with a rest after each piece but the last; none while
 * the segment appends go to is short of room (an open's first, 1 MiB
 * here), and the rests stop once an append waits for the spare. */
#define PACED_SEG (20u << 20)

/* Call prepare until the spare is made. */
static void prepared(struct ida_seglog *l)
{
    int rv, tries = 0;
    while ((rv = ida_seglog_prepare(l, 1u << 20)) == IDA_EBUSY &&
           ++tries < 60000) {
        usleep(1000);
    }
    cr_assert_eq(rv, 0, "the spare is made: %s", idalloc_strerror(rv));
}

static uint64_t rests(void)
{
    uint64_t r, p;
    ida__seglog_maker_counts(&r, &p);
    return r;
}

static uint64_t pieces_written(void)
{
    uint64_t r, p;
    ida__seglog_maker_counts(&r, &p);
    return p;
}

/* Until the maker, at leisure, has rested once since @r0. */
static void wait_rest(uint64_t r0)
{
    for (int i = 0; i < 60000 && rests() == r0; i++) {
        usleep(1000);
    }
    cr_assert_gt(rests() - r0, 0, "the maker rests");
}

/* A log with the maker, of 20 MiB segments, whose opens start a 1 MiB
 * one. */
static struct ida_seglog_options paced_opts(void)
{
    struct ida_seglog_options o = opts('a');
    o.behind = true;
    o.segment_bytes = PACED_SEG;
    o.open_segment_bytes = 1u << 20;
    return o;
}

/* @len bytes of record data (the caller frees). */
static uint8_t *filled(size_t len)
{
    uint8_t *buf = ida_malloc(len);
    cr_assert_not_null(buf);
    memset(buf, 0x5a, len);
    return buf;
}

/* One record of @len bytes (of @buf's). */
static void append_big(struct ida_seglog *l, uint8_t *buf, size_t len)
{
    struct iovec v = {buf, len};
    int rv = ida_seglog_append(l, &v, 1, NULL, NULL);
    cr_assert_eq(rv, 0, "append of %zu bytes: %s", len, idalloc_strerror(rv));
}

Test(seglog, the_maker_rests_between_pieces_unless_hurried, .timeout = 120)
{
    struct ida_seglog_options o = paced_opts();
    struct ida_seglog *l = open_opts(o, NULL);
    size_t big = PACED_SEG - (1u << 20) / 2; /* fits no segment with data */
    uint8_t *buf = filled(big);
    uint64_t pieces = PACED_SEG / IDA_SEGLOG_MAKER_PIECE;

    /* Appends go to the open's 1 MiB segment: the spare is made hurried. */
    uint64_t r0 = rests();
    prepared(l);
    cr_assert_eq(rests() - r0, 0,
                 "no rest while appends have less than 16 MiB of room");

    /* A 1 MiB record moves appends to that 20 MiB spare: room enough, so
     * the next spare is made at leisure, resting after every piece. */
    append_big(l, buf, 1u << 20);
    r0 = rests();
    prepared(l);
    cr_assert_eq(rests() - r0, pieces - 1,
                 "a rest after each of the %llu pieces but the last",
                 (unsigned long long)pieces);

    /* Fill that segment, and move on to the spare with room to spare. */
    append_big(l, buf, PACED_SEG - (2u << 20));
    append_big(l, buf, 1u << 20);
    r0 = rests();
    cr_assert_eq(ida_seglog_prepare(l, 1u << 20), IDA_EBUSY);
    wait_rest(r0);
    /* This record fits only in the spare: the append waits for it, and
     * the maker stops resting (79 rests would take 316 ms at least). */
    append_big(l, buf, big);
    cr_assert_lt(rests() - r0, pieces - 1,
                 "an append waiting for the spare ended the rests");
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    ida_free(buf);
}

/* Close stops a spare being made after the piece in hand and removes it
 * (the next open would remove a half-made one anyway), instead of writing all
 * of it first; the log opens again with every record. */
Test(seglog, close_drops_a_half_made_spare, .timeout = 120)
{
    struct ida_seglog_options o = paced_opts();
    struct ida_seglog *l = open_opts(o, NULL);
    uint8_t *buf = filled(1u << 20);
    prepared(l);
    append_big(l, buf, 1u << 20); /* appends move to a 20 MiB segment */
    cr_assert_eq(ida_seglog_sync(l), 0);
    uint64_t r0 = rests(), p0 = pieces_written();
    cr_assert_eq(ida_seglog_prepare(l, 1u << 20), IDA_EBUSY);
    wait_rest(r0);
    ida_seglog_close(l);
    uint64_t wrote = pieces_written() - p0;
    cr_assert_lt(wrote, PACED_SEG / IDA_SEGLOG_MAKER_PIECE,
                 "close did not wait for the whole spare (%llu pieces)",
                 (unsigned long long)wrote);
    cr_assert_eq(count_files("tmp"), 0, "the half-made spare is removed");
    l = open_opts(o, NULL);
    cr_assert_eq(ida_seglog_next_lsn(l), 2, "the record is still there");
    ida_seglog_close(l);
    ida_free(buf);
}

Test(seglog, bad_input_changes_nothing)
{
    struct ida_seglog_options o = opts('a');
    struct ida_seglog *l = NULL;
    char err[256];
    o.segment_bytes = SEG + 100;
    cr_assert_eq(ida_seglog_open(dir, &o, NULL, NULL, &l, err, sizeof(err)),
                 IDA_EINVAL);
    cr_assert(strstr(err, "multiple of 4096") != NULL);
    o.segment_bytes = 4096;
    cr_assert_eq(ida_seglog_open(dir, &o, NULL, NULL, &l, err, sizeof(err)),
                 IDA_EINVAL);
    l = open_ok('a', NULL);
    append_n(l, 1, 3);
    static uint8_t big[SEG];
    struct iovec v = {big, IDA_SEGLOG_RECORD_MAX(SEG) + 1};
    cr_assert_eq(ida_seglog_append(l, &v, 1, NULL, NULL), IDA_ETOOBIG);
    v.iov_len = 0;
    cr_assert_eq(ida_seglog_append(l, &v, 1, NULL, NULL), IDA_EINVAL);
    cr_assert_eq(ida_seglog_append(l, NULL, 0, NULL, NULL), IDA_EINVAL);
    cr_assert_eq(ida_seglog_next_lsn(l), 4);
    /* The largest record fits in a segment of its own. */
    v.iov_len = IDA_SEGLOG_RECORD_MAX(SEG);
    uint64_t lsn;
    cr_assert_eq(ida_seglog_append(l, &v, 1, &lsn, NULL), 0);
    cr_assert_eq(lsn, 4);
    append_n(l, 5, 6);
    cr_assert_eq(ida_seglog_sync(l), 0);
    ida_seglog_close(l);
    struct seen s;
    l = open_ok('a', &s);
    cr_assert_eq(s.count, 6);
    cr_assert_eq(s.bad, 1, "the big record is not of the generated kind");
    ida_seglog_close(l);
}

/* The writer of killed_writers(), in the child: appends, flushes (each
 * flush's LSN reported on @fd) and makes spares; with @behind, the maker
 * works and each flush releases the segments 300 records behind it. */
static void writer(int fd, uint64_t from, uint64_t r, bool behind)
{
    struct ida_seglog_options o = opts('a');
    o.behind = behind;
    struct ida_seglog *c = NULL;
    if (ida_seglog_open(dir, &o, NULL, NULL, &c, NULL, 0) != 0) {
        _exit(3);
    }
    for (uint64_t lsn = from;; lsn++) {
        uint8_t buf[MAXREC];
        rec_fill(buf, lsn, 0);
        struct iovec v = {buf, rec_len(lsn)};
        if (ida_seglog_append(c, &v, 1, NULL, NULL) != 0) {
            _exit(4);
        }
        if (ida_test_rand(&r) % 4 == 0) {
            if (ida_seglog_sync(c) != 0) {
                _exit(5);
            }
            if (write(fd, &lsn, sizeof(lsn)) != sizeof(lsn)) {
                _exit(6);
            }
            /* Reported before it is released below. */
            if (behind && lsn > 300 && ida_seglog_release(c, lsn - 300) != 0) {
                _exit(7);
            }
        }
        if (ida_test_rand(&r) % (behind ? 8 : 16) == 0) {
            int rv = ida_seglog_prepare(c, SEG / 4);
            if (behind && rv != 0 && rv != IDA_EBUSY) {
                _exit(8);
            }
        }
    }
}

/* Twelve writers killed (SIGKILL) at random while they work: every record
 * whose flush returned is there, whole, after each, and (@behind: with
 * segments released behind a window of 300 records) the log starts at or
 * below the last release and has no hole. */
static void killed_writers(uint64_t seed, bool behind)
{
    uint64_t total = 0;
    struct ida_seglog_options o = opts('a');
    o.behind = behind;
    for (int round = 0; round < 12; round++) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        struct seen s;
        struct ida_seglog *l = open_opts(o, &s);
        uint64_t from = ida_seglog_next_lsn(l);
        ida_seglog_close(l);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            writer(fds[1], from, seed + (uint64_t)round, behind);
        }
        close(fds[1]);
        /* Killed at a random moment once it flushed 100 to 300 records
         * (within 3 s): a fixed delay gave a writer on a busy machine's
         * disk (a CI run beside it) time for only a dozen. */
        uint64_t synced = from - 1, v;
        uint64_t want = from - 1 + 100 + ida_test_rand(&seed) % 201;
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        for (int t = 0; synced < want && t < 300 && poll(&pf, 1, 10) >= 0;
             t++) {
            if ((pf.revents & POLLIN) != 0 &&
                read(fds[0], &v, sizeof(v)) == (ssize_t)sizeof(v)) {
                synced = v;
            }
        }
        usleep((useconds_t)(ida_test_rand(&seed) % 20000));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the writer died on its own: %d",
                  WEXITSTATUS(status));
        while (read(fds[0], &v, sizeof(v)) == (ssize_t)sizeof(v)) {
            synced = v;
        }
        close(fds[0]);
        l = open_opts(o, &s);
        cr_assert_eq(s.bad, 0);
        cr_assert_geq(s.last, synced,
                      "round %d: flushed up to %llu, found %llu", round,
                      (unsigned long long)synced, (unsigned long long)s.last);
        uint64_t floor = behind && synced > 300 ? synced - 300 : 1;
        cr_assert_leq(
            s.first, floor, "round %d: released below %llu at most, first %llu",
            round, (unsigned long long)floor, (unsigned long long)s.first);
        total += s.last - (from - 1);
        ida_seglog_close(l);
    }
    cr_assert_gt(total, behind ? 1000 : 100, "the writers wrote: %llu records",
                 (unsigned long long)total);
    cr_assert_eq(count_files("tmp"), 0, "open removes a half-made spare");
}

/* Processes killed (SIGKILL) at random while they append and flush: every
 * record whose flush returned is there, whole, after each. */
Test(seglog, kill_9_while_appending_loses_no_flushed_record, .timeout = 60)
{
    killed_writers(12345, false);
}

/* The same with the maker (o.behind) at work, and segments released
 * behind the flushes. */
Test(seglog,
     kill_9_while_the_maker_works_loses_no_flushed_record,
     .timeout = 60)
{
    killed_writers(777, true);
}
