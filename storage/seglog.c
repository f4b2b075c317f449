/* A log of records in segment files (storage/seglog.h): appends, flushes,
 * the spare, reads; open and recovery are in seglog_open.c. */
#define _GNU_SOURCE /* pwritev, sync_file_range */
#include "storage/seglog.h"
#include "storage/seglog_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/fdio.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

#define MAGIC      "IDASEGL1"
#define VERSION    1
#define HDR_USED   68 /* of the header block: the fields, then the crc */
#define HDR_CRC_AT 64
#define ZERO_STEP  (1u << 20)
/* The maker writes the spare in pieces of this size, each written back
 * before the next, and rests this long between them unless an append
 * waits for it (THE MAKER in seglog.h): at most a piece in the disk's
 * queue ahead of an append's flush, and about 50 MB/s at most. */
#define MAKER_PIECE   IDA_SEGLOG_MAKER_PIECE
#define MAKER_REST_NS 4000000
/* ... and rests only while the segment appends go to has this much room
 * left: an open's first segment (1 MiB) or a log filling fast does not
 * wait for a spare made at leisure. */
#define MAKER_HURRY_ROOM (16u << 20)

/* --- files --- */

void ida__seglog_name(char *buf, const char *prefix, uint64_t seq)
{
    snprintf(buf, IDA__SEGLOG_NAME_MAX, "%s-%016llx", prefix,
             (unsigned long long)seq);
}

/* @dir/@name into @buf (PATH_MAX-ish); false if it does not fit. */
bool ida__seglog_join(char *buf, size_t size, const char *dir, const char *name)
{
    int k = snprintf(buf, size, "%s/%s", dir, name);
    return k > 0 && (size_t)k < size;
}

void ida__seglog_say(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Test hook (seglog.h, ida__seglog_fault_set()): [0] removals of segment
 * files, [1] writes of a spare; off (skip < 0) unless a test arms it. */
static struct
{
    atomic_int skip, fail, code;
} faults[2] = {{-1, 0, 0}, {-1, 0, 0}};

void ida__seglog_fault_set(int what, int skip, int fail, int code)
{
    if (what == 0 || what == 1) {
        atomic_store(&faults[what].fail, fail);
        atomic_store(&faults[what].code, code);
        atomic_store(&faults[what].skip, skip);
    }
}

/* Test hook (seglog.h, ida__seglog_maker_counts()). */
static _Atomic uint64_t maker_rests, maker_pieces;

void ida__seglog_maker_counts(uint64_t *rests, uint64_t *pieces)
{
    *rests = atomic_load(&maker_rests);
    *pieces = atomic_load(&maker_pieces);
}

/* The injected failure of this call of kind @what (its code), else 0. */
static int fault_hit(int what)
{
    if (atomic_load_explicit(&faults[what].skip, memory_order_relaxed) < 0) {
        return 0;
    }
    if (atomic_fetch_sub(&faults[what].skip, 1) > 0) {
        return 0;
    }
    atomic_store(&faults[what].skip, 0);
    int left = atomic_load(&faults[what].fail);
    if (left == 0) {
        atomic_store(&faults[what].skip, -1); /* done: off again */
        return 0;
    }
    if (left > 0) {
        atomic_store(&faults[what].fail, left - 1);
    }
    return atomic_load(&faults[what].code);
}

static int pwrite_all(int fd, const void *buf, size_t len, off_t at)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = pwrite(fd, p, len, at);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return errno == ENOSPC ? IDA_ENOSPC : IDA_EIO;
        }
        p += w;
        len -= (size_t)w;
        at += w;
    }
    return 0;
}

static void header_encode(uint8_t *h,
                          const struct ida_seglog *l,
                          uint64_t seq,
                          uint64_t first_lsn)
{
    memset(h, 0, IDA_SEGLOG_HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    ida__put_le32(h + 8, VERSION);
    ida__put_le32(h + 12, HDR_USED);
    ida__put_le64(h + 16, seq);
    ida__put_le64(h + 24, first_lsn);
    memcpy(h + 32, l->o.ident, IDA_SEGLOG_IDENT_BYTES);
    ida__put_le32(h + HDR_CRC_AT, ida__crc32c(0, h, HDR_CRC_AT));
}

/* The header @h of the segment named with @seq: 0 with *@first_lsn, 1 for
 * bytes that are no header (torn, never written), or IDA_EVERSION,
 * IDA_EFOREIGN, IDA_ECORRUPT. */
int ida__seglog_header_decode(const struct ida_seglog *l,
                              const uint8_t *h,
                              uint64_t seq,
                              uint64_t *first_lsn)
{
    if (memcmp(h, MAGIC, 8) != 0 ||
        ida__le32(h + HDR_CRC_AT) != ida__crc32c(0, h, HDR_CRC_AT)) {
        return 1;
    }
    if (ida__le32(h + 8) != VERSION || ida__le32(h + 12) != HDR_USED) {
        return IDA_EVERSION;
    }
    if (memcmp(h + 32, l->o.ident, IDA_SEGLOG_IDENT_BYTES) != 0) {
        return IDA_EFOREIGN;
    }
    if (ida__le64(h + 16) != seq) {
        return IDA_ECORRUPT;
    }
    *first_lsn = ida__le64(h + 24);
    return 0;
}

/* --- records --- */

size_t ida__seglog_record_bytes(size_t len)
{
    return (IDA_SEGLOG_RECORD_HDR_BYTES + len + 7) & ~(size_t)7;
}

/* The record at @p (@avail bytes from there to the segment's end), if one
 * checks: its LSN, synced and length. */
bool ida__seglog_record_check(const uint8_t *p,
                              size_t avail,
                              uint64_t *lsn,
                              uint64_t *synced,
                              size_t *len)
{
    if (avail < IDA_SEGLOG_RECORD_HDR_BYTES) {
        return false;
    }
    uint32_t n = ida__le32(p + 4);
    if (n == 0 || n > avail - IDA_SEGLOG_RECORD_HDR_BYTES) {
        return false;
    }
    uint32_t crc = ida__crc32c(0, p + 4, IDA_SEGLOG_RECORD_HDR_BYTES - 4 + n);
    if (crc != ida__le32(p)) {
        return false;
    }
    *lsn = ida__le64(p + 8);
    *synced = ida__le64(p + 16);
    *len = n;
    return true;
}

/* --- segments --- */

int ida__seglog_push(struct ida_seglog *l, const struct seg *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap > 0 ? 2 * l->cap : 8;
        struct seg *v = ida_realloc(l->segs, cap * sizeof(*v));
        if (v == NULL) {
            return IDA_ENOMEM;
        }
        l->segs = v;
        l->cap = cap;
    }
    l->segs[l->n++] = *s;
    return 0;
}

int ida__seglog_unlink(const char *dir, const char *name)
{
    char path[4096];
    if (!ida__seglog_join(path, sizeof(path), dir, name) ||
        (unlink(path) != 0 && errno != ENOENT)) {
        return IDA_EIO;
    }
    return 0;
}

static void spare_drop(struct ida_seglog *l)
{
    if (l->spare_fd >= 0) {
        close(l->spare_fd);
        char name[IDA__SEGLOG_NAME_MAX];
        ida__seglog_name(name, l->spare_ready ? "seg" : "tmp", l->spare_seq);
        (void)ida__seglog_unlink(l->dir, name);
    }
    l->spare_fd = -1;
    l->spare_done = 0;
    l->spare_ready = false;
}

/* Write the spare @fd (@bytes long, *@done of it written: @h, its header,
 * first, then zeros) onward, at most @budget bytes (the header is written
 * whole); @wait: each piece's writeback is waited for before the next. */
static int spare_fill(int fd,
                      const uint8_t *h,
                      size_t bytes,
                      size_t *done,
                      size_t budget,
                      bool wait)
{
    static uint8_t zeros[ZERO_STEP]; /* never written: .bss, not 1 MiB of
                                        .rodata in every binary */
    unsigned flags =
        SYNC_FILE_RANGE_WRITE | (wait ? SYNC_FILE_RANGE_WAIT_AFTER : 0);
    int rv = 0;
    while (rv == 0 && *done < bytes && budget > 0) {
        size_t k = bytes - *done;
        k = k < ZERO_STEP ? k : ZERO_STEP;
        k = k < budget ? k : budget;
        if ((rv = fault_hit(1)) != 0) {
            break;
        }
        if (*done == 0) {
            rv = pwrite_all(fd, h, IDA_SEGLOG_HEADER_BYTES, 0);
            k = IDA_SEGLOG_HEADER_BYTES;
        } else {
            rv = pwrite_all(fd, zeros, k, (off_t)*done);
            /* Start its writeback now: the flush that ends the segment
             * then has little left to write, instead of the whole of it
             * at once. */
            if (rv == 0) {
                (void)sync_file_range(fd, (off_t)*done, (off_t)k, flags);
            }
        }
        if (rv == 0) {
            *done += k;
            budget = k < budget ? budget - k : 0;
        }
    }
    return rv;
}

/* The spare @fd (seq @seq) written whole: flushed, named seg-, and the
 * directory @dir flushed. 0 or IDA_EIO. */
static int spare_finish(const char *dir, int fd, uint64_t seq)
{
    char tmp[IDA__SEGLOG_NAME_MAX], name[IDA__SEGLOG_NAME_MAX];
    char from[4096], to[4096];
    ida__seglog_name(tmp, "tmp", seq);
    ida__seglog_name(name, "seg", seq);
    if (fdatasync(fd) != 0 || !ida__seglog_join(from, sizeof(from), dir, tmp) ||
        !ida__seglog_join(to, sizeof(to), dir, name) || rename(from, to) != 0 ||
        ida_fsync_dir(dir) != 0) {
        return IDA_EIO;
    }
    return 0;
}

/* The spare made (@rv 0: ready) or not (it is removed). Returns @rv. */
static int spare_made(struct ida_seglog *l, int rv)
{
    if (rv != 0) {
        spare_drop(l);
        return rv;
    }
    l->spare_done = l->spare_bytes;
    l->spare_ready = true;
    l->next_seq = l->spare_seq + 1;
    return 0;
}

/* Remove the segment files @seqs[0..@n), in order, each removal durable
 * (the directory flushed) before the next: a crash leaves the segments
 * kept a run without a hole. 0, or IDA_EIO (or the code a test injects):
 * the rest are left, and the caller removes no newer one (gone_failed()). */
static int remove_segments(const char *dir, const uint64_t *seqs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char name[IDA__SEGLOG_NAME_MAX];
        ida__seglog_name(name, "seg", seqs[i]);
        int rv = fault_hit(0);
        if (rv != 0 || ida__seglog_unlink(dir, name) != 0 ||
            ida_fsync_dir(dir) != 0) {
            return rv != 0 ? rv : IDA_EIO;
        }
    }
    return 0;
}

/* THE MAKER (seglog.h): one job on a thread of its own, either the spare
 * made whole or released segments removed. */
struct ida__seglog_maker
{
    pthread_t thread;
    const char *dir; /* the log's: it outlives the maker (close waits) */
    bool make;       /* the spare; else the segments @seqs */
    int fd;
    size_t bytes, done;
    uint64_t seq;
    uint64_t *seqs;
    size_t n;
    int rv;
    atomic_bool hurry;   /* its owner waits for it: no more rests */
    atomic_bool abandon; /* its owner drops the spare: stop making it */
    atomic_bool finished;
    uint8_t header[IDA_SEGLOG_HEADER_BYTES];
};

static void *maker_main(void *arg)
{
    struct ida__seglog_maker *m = arg;
    if (m->make) {
        while (m->rv == 0 && m->done < m->bytes) {
            if (atomic_load_explicit(&m->abandon, memory_order_relaxed)) {
                m->rv = IDA_ESTOPPED; /* half made: dropped by the owner */
                break;
            }
            m->rv = spare_fill(m->fd, m->header, m->bytes, &m->done,
                               MAKER_PIECE, true);
            atomic_fetch_add_explicit(&maker_pieces, 1, memory_order_relaxed);
            if (m->done < m->bytes &&
                !atomic_load_explicit(&m->hurry, memory_order_relaxed)) {
                struct timespec rest = {0, MAKER_REST_NS};
                nanosleep(&rest, NULL);
                atomic_fetch_add_explicit(&maker_rests, 1,
                                          memory_order_relaxed);
            }
        }
        if (m->rv == 0) {
            m->rv = spare_finish(m->dir, m->fd, m->seq);
        }
    } else {
        m->rv = remove_segments(m->dir, m->seqs, m->n);
    }
    atomic_store_explicit(&m->finished, true, memory_order_release);
    return NULL;
}

static int maker_run(struct ida_seglog *l,
                     struct ida__seglog_maker *m,
                     bool hurry)
{
    m->dir = l->dir;
    atomic_init(&m->hurry, hurry);
    atomic_init(&m->abandon, false);
    atomic_init(&m->finished, false);
    if (pthread_create(&m->thread, NULL, maker_main, m) != 0) {
        return IDA_EIO;
    }
    l->maker = m;
    return 0;
}

/* Whether the segment appends go to has little room left (the maker
 * should not rest). */
static bool room_short(const struct ida_seglog *l)
{
    return l->n == 0 || l->segs[l->n - 1].bytes < l->off + MAKER_HURRY_ROOM;
}

/* Hand the spare being made to a maker: 0, or nonzero when none could
 * start (the spare is as it was). */
static int maker_start_spare(struct ida_seglog *l)
{
    struct ida__seglog_maker *m = ida_calloc(1, sizeof(*m));
    if (m == NULL) {
        return IDA_ENOMEM;
    }
    m->make = true;
    m->fd = l->spare_fd;
    m->bytes = l->spare_bytes;
    m->done = l->spare_done;
    m->seq = l->spare_seq;
    header_encode(m->header, l, l->spare_seq, 0); /* 0: not used yet */
    int rv = maker_run(l, m, room_short(l));
    if (rv != 0) {
        ida_free(m);
    }
    return rv;
}

/* Keep the first failure of removing released segments (@rv nonzero) for
 * every later release to return, and remove none from then on: the one that
 * failed, and any after it in its job, are still there, and removing a
 * newer one would leave a hole in the run of segment files, which the next
 * open reads as a log that lost records (a damaged disk). They are all
 * left for the next open, oldest first, as a crash leaves them. */
static void gone_failed(struct ida_seglog *l, int rv)
{
    if (rv != 0 && l->gone_rv == 0) {
        l->gone_rv = rv;
    }
}

/* Remove the segments released so far (l->gone) here, in line; none after
 * a failure (gone_failed()): they are left for the next open. */
static void remove_gone(struct ida_seglog *l)
{
    if (l->gone_rv == 0 && l->n_gone > 0) {
        gone_failed(l, remove_segments(l->dir, l->gone, l->n_gone));
    }
    l->n_gone = 0;
}

/* Hand the segments released so far (l->gone) to a maker when none is at
 * work; in line when none can start. None after a failure (gone_failed()). */
static void maker_start_removal(struct ida_seglog *l)
{
    if (l->gone_rv != 0) {
        l->n_gone = 0; /* left for the next open */
    }
    if (l->maker != NULL || l->n_gone == 0) {
        return;
    }
    struct ida__seglog_maker *m = ida_calloc(1, sizeof(*m));
    if (m != NULL) {
        m->seqs = l->gone;
        m->n = l->n_gone;
        if (maker_run(l, m, false) == 0) {
            l->gone = NULL;
            l->n_gone = l->cap_gone = 0;
            return;
        }
        ida_free(m);
    }
    remove_gone(l);
}

/* The maker's outcome, the maker gone: for the spare, as spare_made(); for
 * a removal 0 (a failure is kept: gone_failed()).
 * IDA_EBUSY (the maker kept) while it works, unless @wait. */
static int maker_end(struct ida_seglog *l, bool wait)
{
    struct ida__seglog_maker *m = l->maker;
    if (!wait && !atomic_load_explicit(&m->finished, memory_order_acquire)) {
        return IDA_EBUSY;
    }
    atomic_store_explicit(&m->hurry, true, memory_order_relaxed);
    (void)pthread_join(m->thread, NULL);
    int rv = m->rv;
    bool make = m->make;
    l->maker = NULL;
    if (make) {
        ida_free(m);
        return spare_made(l, rv); /* which sets (or drops) spare_done */
    }
    ida_free(m->seqs);
    ida_free(m);
    gone_failed(l, rv);
    return 0;
}

int ida_seglog_prepare(struct ida_seglog *l, size_t max_bytes)
{
    if (l->maker != NULL && l->maker->make) {
        if (room_short(l)) {
            atomic_store_explicit(&l->maker->hurry, true, memory_order_relaxed);
        }
        int rv = maker_end(l, max_bytes == 0);
        if (rv != IDA_EBUSY) {
            /* Made or not: the segments released meanwhile go first (a
             * spare that failed on a full disk may fit once they are). */
            maker_start_removal(l);
        }
        return rv;
    }
    if (l->maker != NULL) {
        (void)maker_end(l, false); /* a removal: the spare is not its */
    }
    maker_start_removal(l); /* released segments before a new spare */
    if (l->spare_ready) {
        return 0;
    }
    if (l->spare_fd < 0) {
        char tmp[IDA__SEGLOG_NAME_MAX], path[4096];
        l->spare_seq = l->next_seq;
        ida__seglog_name(tmp, "tmp", l->spare_seq);
        if (!ida__seglog_join(path, sizeof(path), l->dir, tmp)) {
            return IDA_EIO;
        }
        l->spare_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (l->spare_fd < 0) {
            return IDA_EIO;
        }
        l->spare_done = 0;
        l->spare_bytes = l->spare_small && l->o.open_segment_bytes > 0
                             ? l->o.open_segment_bytes
                             : l->o.segment_bytes;
    }
    if (l->o.behind && max_bytes > 0) {
        /* Behind a removal still at work, the spare waits for the maker
         * (an append that needs it makes it in line meanwhile). */
        if (l->maker != NULL || maker_start_spare(l) == 0) {
            return IDA_EBUSY;
        }
    }
    uint8_t h[IDA_SEGLOG_HEADER_BYTES];
    header_encode(h, l, l->spare_seq, 0); /* 0: not used yet */
    int rv = spare_fill(l->spare_fd, h, l->spare_bytes, &l->spare_done,
                        max_bytes > 0 ? max_bytes : l->spare_bytes, false);
    if (rv == 0 && l->spare_done < l->spare_bytes) {
        return IDA_EBUSY;
    }
    if (rv == 0) {
        rv = spare_finish(l->dir, l->spare_fd, l->spare_seq);
    }
    return spare_made(l, rv);
}

/* The segments released so far removed now, in line, a removal at work
 * waited for (none after a failure: gone_failed()). */
static void remove_now(struct ida_seglog *l)
{
    if (l->maker != NULL && !l->maker->make) {
        (void)maker_end(l, true);
    }
    remove_gone(l);
}

/* Make the spare the segment appends go to, its first record @next_lsn
 * (its header says so, durable with the next sync). */
int ida__seglog_switch(struct ida_seglog *l)
{
    int rv = ida_seglog_prepare(l, 0);
    if (rv != 0 && l->o.behind) {
        /* That call may only have collected the maker's failure (the spare
         * it was making is dropped), and a full disk may have room once
         * the released segments are gone: those first, then the spare
         * made whole once more, here. (In line, that call made it.) */
        remove_now(l);
        rv = ida_seglog_prepare(l, 0);
    }
    if (rv != 0) {
        return rv;
    }
    uint8_t h[IDA_SEGLOG_HEADER_BYTES];
    header_encode(h, l, l->spare_seq, l->next_lsn);
    rv = pwrite_all(l->spare_fd, h, sizeof(h), 0);
    if (rv != 0) {
        return rv;
    }
    struct seg s = {.seq = l->spare_seq,
                    .first_lsn = l->next_lsn,
                    .last_lsn = l->next_lsn - 1,
                    .bytes = l->spare_bytes,
                    .fd = l->spare_fd,
                    .dirty = true};
    rv = ida__seglog_push(l, &s);
    if (rv != 0) {
        return rv;
    }
    l->spare_fd = -1;
    l->spare_ready = false;
    l->spare_done = 0;
    l->off = IDA_SEGLOG_HEADER_BYTES;
    return 0;
}

int ida_seglog_append(struct ida_seglog *l,
                      const struct iovec *iov,
                      int n,
                      uint64_t *lsn,
                      struct ida_seglog_pos *pos)
{
    if (l->failed != 0) {
        return l->failed;
    }
    if (n < 0 || n > 62 || (n > 0 && iov == NULL)) {
        return IDA_EINVAL;
    }
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len > IDA_SEGLOG_RECORD_MAX(l->o.segment_bytes)) {
            return IDA_ETOOBIG;
        }
        len += iov[i].iov_len;
    }
    if (len == 0) {
        return IDA_EINVAL;
    }
    if (len > IDA_SEGLOG_RECORD_MAX(l->o.segment_bytes)) {
        return IDA_ETOOBIG;
    }
    size_t rb = ida__seglog_record_bytes(len);
    struct seg *cur = &l->segs[l->n - 1];
    if (l->off + rb > cur->bytes) {
        int rv = ida__seglog_switch(l);
        if (rv != 0) {
            /* A spare that could not be made, even after the released
             * segments went (a full disk), and a write that failed are
             * sticky. */
            if (rv == IDA_EIO || rv == IDA_ENOSPC) {
                l->failed = rv;
            }
            return rv;
        }
        cur = &l->segs[l->n - 1];
    }
    uint8_t h[IDA_SEGLOG_RECORD_HDR_BYTES];
    ida__put_le32(h + 4, (uint32_t)len);
    ida__put_le64(h + 8, l->next_lsn);
    ida__put_le64(h + 16, l->synced_lsn);
    uint32_t crc = ida__crc32c(0, h + 4, sizeof(h) - 4);
    for (int i = 0; i < n; i++) {
        crc = ida__crc32c(crc, iov[i].iov_base, iov[i].iov_len);
    }
    ida__put_le32(h, crc);
    static const uint8_t pad[8];
    struct iovec v[64];
    v[0] = (struct iovec){h, sizeof(h)};
    for (int i = 0; i < n; i++) {
        v[1 + i] = iov[i];
    }
    int k = n + 1;
    if (rb > IDA_SEGLOG_RECORD_HDR_BYTES + len) {
        v[k++] =
            (struct iovec){(void *)pad, rb - IDA_SEGLOG_RECORD_HDR_BYTES - len};
    }
    /* One pwritev; a short one (rare) finishes piece by piece. */
    off_t at = (off_t)l->off;
    ssize_t w = pwritev(cur->fd, v, k, at);
    int rv = w < 0 ? (errno == ENOSPC ? IDA_ENOSPC : IDA_EIO) : 0;
    size_t done = w > 0 ? (size_t)w : 0, start = 0;
    for (int i = 0; rv == 0 && done < rb && i < k; i++) {
        size_t vl = v[i].iov_len;
        if (start + vl > done) {
            size_t from = done - start;
            rv = pwrite_all(cur->fd, (const uint8_t *)v[i].iov_base + from,
                            vl - from, at + (off_t)done);
            done += vl - from;
        }
        start += vl;
    }
    if (rv != 0) {
        l->failed = rv;
        return rv;
    }
    if (lsn != NULL) {
        *lsn = l->next_lsn;
    }
    if (pos != NULL) {
        *pos = (struct ida_seglog_pos){cur->seq, l->off};
    }
    cur->last_lsn = l->next_lsn;
    cur->dirty = true;
    l->next_lsn++;
    l->off += rb;
    return 0;
}

int ida_seglog_sync(struct ida_seglog *l)
{
    if (l->failed != 0) {
        return l->failed;
    }
    for (size_t i = 0; i < l->n; i++) {
        if (l->segs[i].dirty && fdatasync(l->segs[i].fd) != 0) {
            l->failed = IDA_EIO;
            return l->failed;
        }
        l->segs[i].dirty = false;
    }
    l->synced_lsn = l->next_lsn - 1;
    return 0;
}

/* Take the oldest segment out of the log (its file stays): its seq. */
static uint64_t take_oldest(struct ida_seglog *l)
{
    uint64_t seq = l->segs[0].seq;
    close(l->segs[0].fd);
    memmove(l->segs, l->segs + 1, (l->n - 1) * sizeof(*l->segs));
    l->n--;
    return seq;
}

/* ida_seglog_release() with o.behind: the segments go to l->gone, in
 * order, and a maker removes them (one job at a time, so in that order). */
static int release_behind(struct ida_seglog *l, uint64_t lsn)
{
    if (l->maker != NULL && !l->maker->make) {
        (void)maker_end(l, false); /* a spare's is for prepare to collect */
    }
    while (l->gone_rv == 0 && l->n > 1 && l->segs[0].last_lsn < lsn) {
        if (l->n_gone == l->cap_gone) {
            size_t cap = l->cap_gone > 0 ? 2 * l->cap_gone : 8;
            uint64_t *v = ida_realloc(l->gone, cap * sizeof(*v));
            if (v == NULL) {
                break; /* kept for now: the next release takes it */
            }
            l->gone = v;
            l->cap_gone = cap;
        }
        l->gone[l->n_gone++] = take_oldest(l);
    }
    maker_start_removal(l);
    return l->gone_rv;
}

int ida_seglog_release(struct ida_seglog *l, uint64_t lsn)
{
    if (l->o.behind) {
        return release_behind(l, lsn);
    }
    /* Oldest first, each removal durable before the next (remove_segments):
     * a crash leaves the segments kept a run without a hole. */
    while (l->gone_rv == 0 && l->n > 1 && l->segs[0].last_lsn < lsn) {
        uint64_t seq = take_oldest(l);
        gone_failed(l, remove_segments(l->dir, &seq, 1));
    }
    return l->gone_rv;
}

int ida_seglog_read(struct ida_seglog *l,
                    struct ida_seglog_pos pos,
                    uint64_t lsn,
                    uint8_t **data,
                    size_t *len)
{
    const struct seg *s = NULL;
    for (size_t i = 0; i < l->n && s == NULL; i++) {
        s = l->segs[i].seq == pos.seq ? &l->segs[i] : NULL;
    }
    if (s == NULL || lsn < s->first_lsn || lsn > s->last_lsn ||
        pos.off < IDA_SEGLOG_HEADER_BYTES || pos.off % 8 != 0 ||
        pos.off > s->bytes - IDA_SEGLOG_RECORD_HDR_BYTES) {
        return IDA_ENOTFOUND;
    }
    uint8_t h[IDA_SEGLOG_RECORD_HDR_BYTES];
    if (ida__storage_read_at(s->fd, h, sizeof(h), (off_t)pos.off) != 1) {
        return IDA_EIO;
    }
    size_t n = ida__le32(h + 4);
    size_t avail = s->bytes - pos.off;
    if (ida__le64(h + 8) != lsn) {
        return IDA_ENOTFOUND;
    }
    if (n == 0 || n > avail - IDA_SEGLOG_RECORD_HDR_BYTES) {
        return IDA_ECORRUPT;
    }
    uint8_t *buf = ida_malloc(IDA_SEGLOG_RECORD_HDR_BYTES + n);
    if (buf == NULL) {
        return IDA_ENOMEM;
    }
    size_t want = IDA_SEGLOG_RECORD_HDR_BYTES + n;
    if (ida__storage_read_at(s->fd, buf, want, (off_t)pos.off) != 1) {
        ida_free(buf);
        return IDA_EIO;
    }
    uint64_t got_lsn, synced;
    size_t got_len;
    if (!ida__seglog_record_check(buf, avail, &got_lsn, &synced, &got_len) ||
        got_lsn != lsn) {
        ida_free(buf);
        return IDA_ECORRUPT;
    }
    memmove(buf, buf + IDA_SEGLOG_RECORD_HDR_BYTES, n);
    *data = buf;
    *len = n;
    return 0;
}

uint64_t ida_seglog_next_lsn(const struct ida_seglog *l)
{
    return l->next_lsn;
}

uint64_t ida_seglog_synced_lsn(const struct ida_seglog *l)
{
    return l->synced_lsn;
}

size_t ida_seglog_segments(const struct ida_seglog *l)
{
    return l->n + (l->spare_ready ? 1 : 0);
}

void ida_seglog_close(struct ida_seglog *l)
{
    if (l == NULL) {
        return;
    }
    if (l->maker != NULL) {
        /* A removal finishes what it began; a spare being made (a tmp-
         * file, which the next open would remove anyway) is left half made
         * and removed below (waiting for a whole one held a node's stop
         * for up to 65 MiB of writes). */
        if (l->maker->make) {
            atomic_store_explicit(&l->maker->abandon, true,
                                  memory_order_relaxed);
        }
        (void)maker_end(l, true);
    }
    remove_gone(l); /* else the next open */
    ida_free(l->gone);
    for (size_t i = 0; i < l->n; i++) {
        close(l->segs[i].fd);
    }
    if (l->spare_fd >= 0 && !l->spare_ready) {
        spare_drop(l); /* half made: removed */
    } else if (l->spare_fd >= 0) {
        close(l->spare_fd); /* made: the next open goes on in it */
    }
    ida_free(l->segs);
    ida_free(l->dir);
    ida_free(l);
}
