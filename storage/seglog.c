/* A log of records in segment files (storage/seglog.h). */
#define _DEFAULT_SOURCE /* pwritev, preadv, DT_REG */
#include "storage/seglog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fdio.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"

#define MAGIC        "IDASEGL1"
#define VERSION      1
#define HDR_USED     68 /* of the header block: the fields, then the crc */
#define HDR_CRC_AT   64
#define ZERO_STEP    (1u << 20)
#define NAME_MAX_LEN 64

struct seg
{
    uint64_t seq;
    uint64_t first_lsn; /* its first record's LSN */
    uint64_t last_lsn;  /* its last one's (first_lsn - 1: none yet) */
    size_t bytes;       /* the file's size */
    int fd;
    bool dirty; /* written since the last sync */
};

struct ida_seglog
{
    char *dir;
    struct ida_seglog_options o;
    struct seg *segs; /* in sequence order; the last takes the appends */
    size_t n, cap;
    size_t off; /* where the next record goes in the last segment */
    uint64_t next_lsn;
    uint64_t synced_lsn;
    uint64_t next_seq; /* of the next segment made */
    int failed;        /* sticky: a write or a flush failed */
    /* The next segment, being made (spare_fd >= 0) or made (ready). */
    int spare_fd;
    size_t spare_done;
    bool spare_ready;
    uint64_t spare_seq;
};

/* --- little-endian fields --------------------------------------------------
 */

/* --- files ------------------------------------------------------------------
 */

static void seg_name(char *buf, const char *prefix, uint64_t seq)
{
    snprintf(buf, NAME_MAX_LEN, "%s-%016llx", prefix, (unsigned long long)seq);
}

/* @dir/@name into @buf (PATH_MAX-ish); false if it does not fit. */
static bool join(char *buf, size_t size, const char *dir, const char *name)
{
    int k = snprintf(buf, size, "%s/%s", dir, name);
    return k > 0 && (size_t)k < size;
}

static void say(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
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

/* Read up to @len bytes at @at; the count read (short at the end of the
 * file), or -1. */
static ssize_t pread_some(int fd, void *buf, size_t len, off_t at)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, p + got, len - got, at + (off_t)got);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            break;
        }
        got += (size_t)r;
    }
    return (ssize_t)got;
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
static int header_decode(const struct ida_seglog *l,
                         const uint8_t *h,
                         uint64_t seq,
                         uint64_t *first_lsn)
{
    if (memcmp(h, MAGIC, 8) != 0 ||
        ida__get_le32(h + HDR_CRC_AT) != ida__crc32c(0, h, HDR_CRC_AT)) {
        return 1;
    }
    if (ida__get_le32(h + 8) != VERSION || ida__get_le32(h + 12) != HDR_USED) {
        return IDA_EVERSION;
    }
    if (memcmp(h + 32, l->o.ident, IDA_SEGLOG_IDENT_BYTES) != 0) {
        return IDA_EFOREIGN;
    }
    if (ida__get_le64(h + 16) != seq) {
        return IDA_ECORRUPT;
    }
    *first_lsn = ida__get_le64(h + 24);
    return 0;
}

/* --- records ----------------------------------------------------------------
 */

static size_t record_bytes(size_t len)
{
    return (IDA_SEGLOG_RECORD_HDR_BYTES + len + 7) & ~(size_t)7;
}

/* The record at @p (@avail bytes from there to the segment's end), if one
 * checks: its LSN, synced and length. */
static bool record_check(const uint8_t *p,
                         size_t avail,
                         uint64_t *lsn,
                         uint64_t *synced,
                         size_t *len)
{
    if (avail < IDA_SEGLOG_RECORD_HDR_BYTES) {
        return false;
    }
    uint32_t n = ida__get_le32(p + 4);
    if (n == 0 || n > avail - IDA_SEGLOG_RECORD_HDR_BYTES) {
        return false;
    }
    uint32_t crc = ida__crc32c(0, p + 4, IDA_SEGLOG_RECORD_HDR_BYTES - 4 + n);
    if (crc != ida__get_le32(p)) {
        return false;
    }
    *lsn = ida__get_le64(p + 8);
    *synced = ida__get_le64(p + 16);
    *len = n;
    return true;
}

/* --- segments ---------------------------------------------------------------
 */

static int segs_push(struct ida_seglog *l, const struct seg *s)
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

static int unlink_in(const struct ida_seglog *l, const char *name)
{
    char path[4096];
    if (!join(path, sizeof(path), l->dir, name) ||
        (unlink(path) != 0 && errno != ENOENT)) {
        return IDA_EIO;
    }
    return 0;
}

static void spare_drop(struct ida_seglog *l)
{
    if (l->spare_fd >= 0) {
        close(l->spare_fd);
        char name[NAME_MAX_LEN];
        seg_name(name, l->spare_ready ? "seg" : "tmp", l->spare_seq);
        (void)unlink_in(l, name);
    }
    l->spare_fd = -1;
    l->spare_done = 0;
    l->spare_ready = false;
}

int ida_seglog_prepare(struct ida_seglog *l, size_t max_bytes)
{
    if (l->spare_ready) {
        return 0;
    }
    size_t bytes = l->o.segment_bytes;
    char tmp[NAME_MAX_LEN], path[4096];
    seg_name(tmp, "tmp", l->spare_seq);
    if (!join(path, sizeof(path), l->dir, tmp)) {
        return IDA_EIO;
    }
    int rv = 0;
    if (l->spare_fd < 0) {
        l->spare_seq = l->next_seq;
        seg_name(tmp, "tmp", l->spare_seq);
        if (!join(path, sizeof(path), l->dir, tmp)) {
            return IDA_EIO;
        }
        l->spare_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (l->spare_fd < 0) {
            return IDA_EIO;
        }
        l->spare_done = 0;
    }
    static const uint8_t zeros[ZERO_STEP];
    size_t budget = max_bytes > 0 ? max_bytes : bytes;
    while (rv == 0 && l->spare_done < bytes && budget > 0) {
        size_t k = bytes - l->spare_done;
        k = k < ZERO_STEP ? k : ZERO_STEP;
        k = k < budget ? k : budget;
        if (l->spare_done == 0) {
            uint8_t h[IDA_SEGLOG_HEADER_BYTES];
            header_encode(h, l, l->spare_seq, 0); /* 0: not used yet */
            rv = pwrite_all(l->spare_fd, h, sizeof(h), 0);
            k = sizeof(h);
        } else {
            rv = pwrite_all(l->spare_fd, zeros, k, (off_t)l->spare_done);
        }
        if (rv == 0) {
            l->spare_done += k;
            budget = k < budget ? budget - k : 0;
        }
    }
    if (rv == 0 && l->spare_done < bytes) {
        return IDA_EBUSY;
    }
    char name[NAME_MAX_LEN], to[4096];
    seg_name(name, "seg", l->spare_seq);
    if (rv == 0 &&
        (fdatasync(l->spare_fd) != 0 || !join(to, sizeof(to), l->dir, name) ||
         rename(path, to) != 0 || ida_fsync_dir(l->dir) != 0)) {
        rv = IDA_EIO;
    }
    if (rv != 0) {
        spare_drop(l);
        return rv;
    }
    l->spare_ready = true;
    l->next_seq = l->spare_seq + 1;
    return 0;
}

/* Make the spare the segment appends go to, its first record @next_lsn
 * (its header says so, durable with the next sync). */
static int switch_segment(struct ida_seglog *l)
{
    int rv = ida_seglog_prepare(l, 0);
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
                    .bytes = l->o.segment_bytes,
                    .fd = l->spare_fd,
                    .dirty = true};
    rv = segs_push(l, &s);
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
    size_t rb = record_bytes(len);
    struct seg *cur = &l->segs[l->n - 1];
    if (l->off + rb > cur->bytes) {
        int rv = switch_segment(l);
        if (rv != 0) {
            /* A spare that could not be made (a full disk) fails this
             * append alone; a write that failed is sticky. */
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

int ida_seglog_release(struct ida_seglog *l, uint64_t lsn)
{
    /* Oldest first, each removal durable before the next: a crash leaves
     * the segments kept a run without a hole. */
    while (l->n > 1 && l->segs[0].last_lsn < lsn) {
        char name[NAME_MAX_LEN];
        seg_name(name, "seg", l->segs[0].seq);
        close(l->segs[0].fd);
        if (unlink_in(l, name) != 0 || ida_fsync_dir(l->dir) != 0) {
            memmove(l->segs, l->segs + 1, (l->n - 1) * sizeof(*l->segs));
            l->n--;
            return IDA_EIO;
        }
        memmove(l->segs, l->segs + 1, (l->n - 1) * sizeof(*l->segs));
        l->n--;
    }
    return 0;
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
    if (pread_some(s->fd, h, sizeof(h), (off_t)pos.off) != (ssize_t)sizeof(h)) {
        return IDA_EIO;
    }
    size_t n = ida__get_le32(h + 4);
    size_t avail = s->bytes - pos.off;
    if (ida__get_le64(h + 8) != lsn) {
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
    if (pread_some(s->fd, buf, want, (off_t)pos.off) != (ssize_t)want) {
        ida_free(buf);
        return IDA_EIO;
    }
    uint64_t got_lsn, synced;
    size_t got_len;
    if (!record_check(buf, avail, &got_lsn, &synced, &got_len) ||
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
    for (size_t i = 0; i < l->n; i++) {
        close(l->segs[i].fd);
    }
    if (l->spare_fd >= 0 && !l->spare_ready) {
        spare_drop(l); /* half made: removed */
    } else if (l->spare_fd >= 0) {
        close(l->spare_fd); /* made: the next open removes it */
    }
    ida_free(l->segs);
    ida_free(l->dir);
    ida_free(l);
}

/* --- open and recovery ------------------------------------------------------
 */

/* A file of the directory at open. */
struct found
{
    uint64_t seq;
    int fd;
    size_t bytes;
    uint8_t *buf; /* its whole content, mapped read-only (NULL: empty) */
    int hdr;      /* header_decode(): 0 ok, 1 none */
    uint64_t first_lsn;
    bool used; /* holds records recovered */
};

static int cmp_found(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void found_free(struct found *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (f[i].fd >= 0) {
            close(f[i].fd);
        }
        if (f[i].buf != NULL) {
            munmap(f[i].buf, f[i].bytes);
        }
    }
    ida_free(f);
}

/* The directory's segment files, read whole, in sequence order (tmp-
 * leftovers removed). */
static int list_segments(struct ida_seglog *l,
                         struct found **out,
                         size_t *nout,
                         char *err,
                         size_t errlen)
{
    DIR *d = opendir(l->dir);
    if (d == NULL) {
        say(err, errlen, "cannot read the log directory %s: %s", l->dir,
            strerror(errno));
        return IDA_EIO;
    }
    struct found *f = NULL;
    size_t n = 0, cap = 0;
    int rv = 0;
    struct dirent *e;
    while (rv == 0 && (e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        bool seg = strncmp(nm, "seg-", 4) == 0,
             tmp = strncmp(nm, "tmp-", 4) == 0;
        if ((!seg && !tmp) || strlen(nm) != 20 ||
            strspn(nm + 4, "0123456789abcdef") != 16) {
            continue;
        }
        if (tmp) {
            rv = unlink_in(l, nm);
            continue;
        }
        if (n == cap) {
            cap = cap > 0 ? 2 * cap : 8;
            struct found *v = ida_realloc(f, cap * sizeof(*v));
            if (v == NULL) {
                rv = IDA_ENOMEM;
                break;
            }
            f = v;
        }
        struct found *x = &f[n++];
        *x = (struct found){.seq = strtoull(nm + 4, NULL, 16), .fd = -1};
        char path[4096];
        struct stat st;
        if (!join(path, sizeof(path), l->dir, nm) ||
            (x->fd = open(path, O_RDWR | O_CLOEXEC)) < 0 ||
            fstat(x->fd, &st) != 0) {
            say(err, errlen, "cannot open the log segment %s: %s", path,
                strerror(errno));
            rv = IDA_EIO;
            break;
        }
        /* Mapped, not read into memory: a log of many segments is read
         * one page at a time, its memory the page cache's. */
        x->bytes = (size_t)st.st_size;
        void *m = x->bytes > 0
                      ? mmap(NULL, x->bytes, PROT_READ, MAP_SHARED, x->fd, 0)
                      : NULL;
        if (m == MAP_FAILED) {
            say(err, errlen, "cannot map the log segment %s: %s", path,
                strerror(errno));
            rv = IDA_EIO;
        } else {
            x->buf = m;
        }
    }
    closedir(d);
    if (rv != 0) {
        found_free(f, n);
        return rv;
    }
    if (n > 1) {
        qsort(f, n, sizeof(*f), cmp_found);
    }
    *out = f;
    *nout = n;
    return 0;
}

/* Whether bytes from @from of @x hold a record (at any multiple of 8) of
 * LSN >= @b saying that @b was durable. */
static bool durable_after(const struct found *x, size_t from, uint64_t b)
{
    for (size_t at = (from + 7) & ~(size_t)7;
         at + IDA_SEGLOG_RECORD_HDR_BYTES <= x->bytes; at += 8) {
        uint64_t lsn, synced;
        size_t len;
        if (ida__get_le64(x->buf + at + 16) >= b &&
            ida__get_le64(x->buf + at + 8) >= b &&
            record_check(x->buf + at, x->bytes - at, &lsn, &synced, &len)) {
            return true;
        }
    }
    return false;
}

/* The records of @f[0..n) in order, as the header comment's RECOVERY
 * says; *@end_lsn the first not recovered. */
static int recover(struct ida_seglog *l,
                   struct found *f,
                   size_t n,
                   ida_seglog_record_fn fn,
                   void *ctx,
                   uint64_t *end_lsn,
                   char *err,
                   size_t errlen)
{
    uint64_t expect = 0; /* 0: the first segment sets it */
    size_t i = 0, at = 0;
    for (; i < n; i++) {
        struct found *x = &f[i];
        if (x->bytes < IDA_SEGLOG_HEADER_BYTES + IDA_SEGLOG_RECORD_HDR_BYTES ||
            x->bytes % 4096 != 0) {
            x->hdr = 1; /* too short to be one: made when the process died */
        } else {
            x->hdr = header_decode(l, x->buf, x->seq, &x->first_lsn);
        }
        if (x->hdr > 1) {
            say(err, errlen,
                "log segment seq-%016llx: %s (its header: another node's, "
                "version or name)",
                (unsigned long long)x->seq, idalloc_strerror(x->hdr));
            return x->hdr;
        }
        if (x->hdr == 1 || x->first_lsn == 0 ||
            (expect != 0 && x->first_lsn != expect)) {
            break; /* no header, a spare, or not the next record */
        }
        if (expect == 0) {
            expect = x->first_lsn;
        }
        at = IDA_SEGLOG_HEADER_BYTES;
        for (;;) {
            uint64_t lsn, synced;
            size_t len;
            if (!record_check(x->buf + at, x->bytes - at, &lsn, &synced,
                              &len) ||
                lsn != expect) {
                break;
            }
            if (fn != NULL) {
                int rv = fn(ctx, lsn, x->buf + at + IDA_SEGLOG_RECORD_HDR_BYTES,
                            len, (struct ida_seglog_pos){x->seq, at});
                if (rv != 0) {
                    if (err != NULL && errlen > 0 && err[0] == '\0') {
                        say(err, errlen, "replaying LSN %llu: %s",
                            (unsigned long long)lsn, idalloc_strerror(rv));
                    }
                    return rv;
                }
            }
            x->used = true;
            expect++;
            at += record_bytes(len);
        }
        /* The rest of this segment is what a record that did not fit left
         * (zeros), or the end. The next segment says which. */
    }
    if (expect == 0) {
        expect = 1; /* no records at all */
    }
    /* The end is at @expect: nothing after it may say that it was durable
     * (the rest of the last segment read, every later file). */
    size_t last = i > 0 ? i - 1 : 0;
    for (size_t j = last; j < n; j++) {
        size_t from = j == last && i > 0 ? at : IDA_SEGLOG_HEADER_BYTES;
        if (f[j].bytes > IDA_SEGLOG_HEADER_BYTES &&
            durable_after(&f[j], from, expect)) {
            say(err, errlen,
                "the log ends at LSN %llu, but log segment seg-%016llx holds "
                "a later record written after LSN %llu or later was "
                "durable: records that were made durable are lost (a "
                "damaged or rolled-back disk)",
                (unsigned long long)(expect - 1), (unsigned long long)f[j].seq,
                (unsigned long long)expect);
            return IDA_ECORRUPT;
        }
    }
    if (l->o.min_lsn >= expect) {
        say(err, errlen,
            "the log ends at LSN %llu, but LSN %llu was durable: records "
            "that were made durable are lost (a damaged or rolled-back disk, "
            "or segments removed)",
            (unsigned long long)(expect - 1), (unsigned long long)l->o.min_lsn);
        return IDA_ECORRUPT;
    }
    /* The caller's last word, before anything is changed. */
    if (fn != NULL) {
        int rv = fn(ctx, 0, NULL, 0, (struct ida_seglog_pos){0, 0});
        if (rv != 0) {
            return rv;
        }
    }
    *end_lsn = expect;
    return 0;
}

int ida_seglog_open(const char *dir,
                    const struct ida_seglog_options *o,
                    ida_seglog_record_fn fn,
                    void *ctx,
                    struct ida_seglog **out,
                    char *err,
                    size_t errlen)
{
    say(err, errlen, "%s", "");
    if (dir == NULL || o == NULL || out == NULL ||
        o->segment_bytes < IDA_SEGLOG_SEGMENT_MIN ||
        o->segment_bytes % 4096 != 0 ||
        o->segment_bytes > IDA_SEGLOG_SEGMENT_MAX) {
        say(err, errlen,
            "bad log options (segment bytes: a multiple of 4096, "
            "from 64 KiB to 1 GiB)");
        return IDA_EINVAL;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        say(err, errlen, "cannot create the log directory %s: %s", dir,
            strerror(errno));
        return IDA_EIO;
    }
    struct ida_seglog *l = ida_calloc(1, sizeof(*l));
    if (l == NULL || (l->dir = ida_malloc(strlen(dir) + 1)) == NULL) {
        ida_free(l);
        return IDA_ENOMEM;
    }
    memcpy(l->dir, dir, strlen(dir) + 1);
    l->o = *o;
    l->spare_fd = -1;
    struct found *f = NULL;
    size_t n = 0;
    uint64_t end = 1;
    int rv = list_segments(l, &f, &n, err, errlen);
    if (rv == 0) {
        rv = recover(l, f, n, fn, ctx, &end, err, errlen);
    }
    /* Keep the segments that hold recovered records (made durable now: a
     * process that died may have left them in the page cache only). */
    for (size_t i = 0; rv == 0 && i < n; i++) {
        l->next_seq = f[i].seq + 1;
        if (!f[i].used) {
            continue;
        }
        if (fdatasync(f[i].fd) != 0) {
            say(err, errlen, "cannot flush log segment seg-%016llx: %s",
                (unsigned long long)f[i].seq, strerror(errno));
            rv = IDA_EIO;
            break;
        }
        struct seg s = {.seq = f[i].seq,
                        .first_lsn = f[i].first_lsn,
                        .bytes = f[i].bytes,
                        .fd = f[i].fd};
        uint64_t next = i + 1 < n && f[i + 1].used ? f[i + 1].first_lsn : end;
        s.last_lsn = next - 1;
        rv = segs_push(l, &s);
        if (rv == 0) {
            f[i].fd = -1;
        }
    }
    /* Appends go to a new segment: the bytes after the end of the last one
     * may hold records of a tail that was not durable, never to be read as
     * records again. It is durable (its header says the next LSN) before
     * the segments that hold nothing recovered go, so that the log never
     * forgets where its LSNs were. */
    l->next_lsn = end;
    l->synced_lsn = end - 1;
    if (rv == 0) {
        rv = switch_segment(l);
        if (rv != 0) {
            say(err, errlen, "cannot make a log segment in %s: %s", l->dir,
                idalloc_strerror(rv));
        }
    }
    if (rv == 0) {
        rv = ida_seglog_sync(l);
    }
    for (size_t i = 0; rv == 0 && i < n; i++) {
        char name[NAME_MAX_LEN];
        seg_name(name, "seg", f[i].seq);
        rv = f[i].used ? 0 : unlink_in(l, name);
    }
    found_free(f, n);
    if (rv == 0 && ida_fsync_dir(l->dir) != 0) {
        rv = IDA_EIO;
    }
    if (rv != 0) {
        ida_seglog_close(l);
        return rv;
    }
    *out = l;
    return 0;
}
