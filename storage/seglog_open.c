/* A log of records in segment files: open and recovery (storage/seglog.h,
 * RECOVERY). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fdio.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"
#include "storage/seglog.h"
#include "storage/seglog_internal.h"

/* --- open and recovery --- */

/* A file of the directory at open. */
struct found
{
    uint64_t seq;
    int fd;
    size_t bytes;
    uint8_t *buf; /* its whole content, mapped read-only (NULL: empty) */
    int hdr;      /* ida__seglog_header_decode(): 0 ok, 1 none */
    uint64_t first_lsn;
    bool used; /* holds records recovered */
    bool zero; /* nothing but zeros after its header (recover() found) */
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
        ida__seglog_say(err, errlen, "cannot read the log directory %s: %s",
                        l->dir, strerror(errno));
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
            rv = ida__seglog_unlink(l->dir, nm);
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
        if (!ida__seglog_join(path, sizeof(path), l->dir, nm) ||
            (x->fd = open(path, O_RDWR | O_CLOEXEC)) < 0 ||
            fstat(x->fd, &st) != 0) {
            ida__seglog_say(err, errlen, "cannot open the log segment %s: %s",
                            path, strerror(errno));
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
            ida__seglog_say(err, errlen, "cannot map the log segment %s: %s",
                            path, strerror(errno));
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

/* Whether @n bytes at @p are all zero (read 4 KiB at a time, 8 bytes at
 * a step, the last few one by one). */
static bool all_zero(const uint8_t *p, size_t n)
{
    size_t words = n & ~(size_t)7;
    for (size_t page = 0; page < words; page += 4096) {
        size_t end = words - page < 4096 ? words : page + 4096;
        uint64_t acc = 0;
        for (size_t i = page; i < end; i += 8) {
            uint64_t w;
            memcpy(&w, p + i, sizeof(w));
            acc |= w;
        }
        if (acc != 0) {
            return false;
        }
    }
    for (size_t i = words; i < n; i++) {
        if (p[i] != 0) {
            return false;
        }
    }
    return true;
}

/* Whether bytes from @from of @x hold a record (at any multiple of 8) of
 * LSN >= @b saying that @b was durable. */
static bool durable_after(const struct found *x, size_t from, uint64_t b)
{
    for (size_t at = (from + 7) & ~(size_t)7;
         at + IDA_SEGLOG_RECORD_HDR_BYTES <= x->bytes; at += 8) {
        uint64_t lsn, synced;
        size_t len;
        if (ida__le64(x->buf + at + 16) >= b &&
            ida__le64(x->buf + at + 8) >= b &&
            ida__seglog_record_check(x->buf + at, x->bytes - at, &lsn, &synced,
                                     &len)) {
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
            x->hdr =
                ida__seglog_header_decode(l, x->buf, x->seq, &x->first_lsn);
        }
        if (x->hdr > 1) {
            ida__seglog_say(
                err, errlen,
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
            if (!ida__seglog_record_check(x->buf + at, x->bytes - at, &lsn,
                                          &synced, &len) ||
                lsn != expect) {
                break;
            }
            if (fn != NULL) {
                int rv = fn(ctx, lsn, x->buf + at + IDA_SEGLOG_RECORD_HDR_BYTES,
                            len, (struct ida_seglog_pos){x->seq, at});
                if (rv != 0) {
                    if (err != NULL && errlen > 0 && err[0] == '\0') {
                        ida__seglog_say(err, errlen, "replaying LSN %llu: %s",
                                        (unsigned long long)lsn,
                                        idalloc_strerror(rv));
                    }
                    return rv;
                }
            }
            x->used = true;
            expect++;
            at += ida__seglog_record_bytes(len);
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
        from = (from + 7) & ~(size_t)7;
        if (f[j].bytes <= from) {
            continue;
        }
        /* Zeros hold no record (and are one read of the bytes, where a
         * record is looked for at every multiple of 8). */
        if (all_zero(f[j].buf + from, f[j].bytes - from)) {
            f[j].zero = from == IDA_SEGLOG_HEADER_BYTES;
            continue;
        }
        if (durable_after(&f[j], from, expect)) {
            ida__seglog_say(
                err, errlen,
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
        ida__seglog_say(
            err, errlen,
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

/* Whether @x, the directory's last file, is a spare the maker finished (a
 * header of this log naming no first LSN, zeros after it, segment_bytes
 * long): the segment appends go on in, as it is (seglog.h, RECOVERY). */
static bool spare_whole(const struct ida_seglog *l, const struct found *x)
{
    uint64_t first = 1;
    return !x->used && x->buf != NULL && x->bytes == l->o.segment_bytes &&
           ida__seglog_header_decode(l, x->buf, x->seq, &first) == 0 &&
           first == 0 && x->zero;
}

int ida_seglog_open(const char *dir,
                    const struct ida_seglog_options *o,
                    ida_seglog_record_fn fn,
                    void *ctx,
                    struct ida_seglog **out,
                    char *err,
                    size_t errlen)
{
    ida__seglog_say(err, errlen, "%s", "");
    if (dir == NULL || o == NULL || out == NULL ||
        o->segment_bytes < IDA_SEGLOG_SEGMENT_MIN ||
        o->segment_bytes % 4096 != 0 ||
        o->segment_bytes > IDA_SEGLOG_SEGMENT_MAX ||
        (o->open_segment_bytes != 0 &&
         (o->open_segment_bytes < IDA_SEGLOG_SEGMENT_MIN ||
          o->open_segment_bytes % 4096 != 0 ||
          o->open_segment_bytes > o->segment_bytes))) {
        ida__seglog_say(err, errlen,
                        "bad log options (segment bytes: a multiple of 4096, "
                        "from 64 KiB to 1 GiB; open segment bytes too, at "
                        "most segment bytes)");
        return IDA_EINVAL;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        ida__seglog_say(err, errlen, "cannot create the log directory %s: %s",
                        dir, strerror(errno));
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
            ida__seglog_say(err, errlen,
                            "cannot flush log segment seg-%016llx: %s",
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
        rv = ida__seglog_push(l, &s);
        if (rv == 0) {
            f[i].fd = -1;
        }
    }
    /* Appends go to a new segment: the bytes after the end of the last one
     * may hold records of a tail that was not durable, never to be read as
     * records again. It is durable (its header says the next LSN) before
     * the segments that hold nothing recovered go, so that the log never
     * forgets where its LSNs were. The new segment is a whole spare the
     * last process left, when the last file is one (spare_whole()), else
     * one made here. */
    l->next_lsn = end;
    l->synced_lsn = end - 1;
    size_t kept = n; /* a spare taken as the new segment; n: none */
    if (rv == 0 && n > 0 && spare_whole(l, &f[n - 1])) {
        kept = n - 1;
        l->spare_fd = f[kept].fd;
        f[kept].fd = -1;
        l->spare_seq = f[kept].seq;
        l->spare_bytes = l->spare_done = f[kept].bytes;
        l->spare_ready = true;
        l->next_seq = f[kept].seq + 1;
    }
    if (rv == 0) {
        l->spare_small = true;
        rv = ida__seglog_switch(l);
        l->spare_small = false;
        if (rv != 0) {
            ida__seglog_say(err, errlen, "cannot make a log segment in %s: %s",
                            l->dir, idalloc_strerror(rv));
        }
    }
    if (rv == 0) {
        rv = ida_seglog_sync(l);
    }
    /* A spare taken over was named by the last process, which may have
     * died before it flushed the directory: its name is made durable
     * before any removal is (a file system may write those out of
     * order), as a segment made here is before the removals. */
    if (rv == 0 && kept < n && ida_fsync_dir(l->dir) != 0) {
        rv = IDA_EIO;
    }
    for (size_t i = 0; rv == 0 && i < n; i++) {
        char name[IDA__SEGLOG_NAME_MAX];
        ida__seglog_name(name, "seg", f[i].seq);
        rv = f[i].used || i == kept ? 0 : ida__seglog_unlink(l->dir, name);
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
