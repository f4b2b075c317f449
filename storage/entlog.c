/* The Raft log's entries over a segment log (storage/entlog.h). */
#include "storage/entlog.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/storage.h"

#define HDR_BYTES  40
#define ENTRY_HDR  16
#define VERSION    1
#define FLAG_RESET 1

/* One entry of the index. */
struct ent
{
    ida_term term;
    uint64_t rec; /* its record's number (struct ida_entlog, r) */
    uint32_t off; /* its data's offset in the record's bytes */
    uint32_t len;
    uint8_t type;
};

/* A record entries point into. */
struct rec
{
    struct ida_seglog_pos pos;
    uint64_t lsn;
};

struct ida_entlog
{
    struct ida_seglog *sl;
    ida_index prev_index;
    ida_term prev_term;
    ida_index snap_index; /* replay: how far a reset may reach */
    ida_term snap_term;
    struct ent *e; /* e[start + i] is entry prev_index + 1 + i */
    size_t start, n, cap;
    struct rec *r; /* r[i] is record number rbase + i */
    size_t rn, rcap;
    uint64_t rbase;
    ida_index commit;
    /* Replay only. */
    bool known;      /* rlast means something */
    ida_index rlast; /* the last index of the log replayed so far */
    bool floating;   /* the entries replayed are stale (see take_record()) */
    ida_index float_first; /* the first of them */
    ida_term at_prev;      /* the term of entry prev_index replayed (0: none) */
    char *err;
    size_t errlen;
};

static void say(struct ida_entlog *l, const char *fmt, ...)
{
    if (l->err == NULL || l->errlen == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, l->errlen, fmt, ap);
    va_end(ap);
}

static ida_index last_index(const struct ida_entlog *l)
{
    return l->prev_index + l->n;
}

static struct ent *ent_at(const struct ida_entlog *l, ida_index index)
{
    return &l->e[l->start + (size_t)(index - l->prev_index - 1)];
}

/* Drop the entries from @from on (from > prev_index). */
static void cut_from(struct ida_entlog *l, ida_index from)
{
    if (from <= last_index(l)) {
        l->n = (size_t)(from - l->prev_index - 1);
    }
}

/* Room for @more entries after the last: the array's front moved down
 * if that makes it, else the array grown. 0 or IDA_ENOMEM (unchanged). */
static int ent_room(struct ida_entlog *l, size_t more)
{
    size_t want = l->n + more;
    if (l->start + want <= l->cap) {
        return 0;
    }
    if (l->start > 0) {
        memmove(l->e, l->e + l->start, l->n * sizeof(*l->e));
        l->start = 0;
        if (want <= l->cap) {
            return 0;
        }
    }
    size_t cap = l->cap > 0 ? 2 * l->cap : 1024;
    while (cap < want) {
        cap *= 2;
    }
    struct ent *v = ida_realloc(l->e, cap * sizeof(*v));
    if (v == NULL) {
        return IDA_ENOMEM;
    }
    l->e = v;
    l->cap = cap;
    return 0;
}

/* Room for one more record. 0 or IDA_ENOMEM (unchanged). */
static int rec_room(struct ida_entlog *l)
{
    if (l->rn < l->rcap) {
        return 0;
    }
    size_t cap = l->rcap > 0 ? 2 * l->rcap : 256;
    struct rec *v = ida_realloc(l->r, cap * sizeof(*v));
    if (v == NULL) {
        return IDA_ENOMEM;
    }
    l->r = v;
    l->rcap = cap;
    return 0;
}

static bool type_ok(unsigned t)
{
    return t == IDA_ENTRY_NORMAL || t == IDA_ENTRY_NOOP ||
           t == IDA_ENTRY_CONFIG;
}

/* --- replay --- */

/* The end of the replay: the log must follow the snapshot. */
static int replay_end(struct ida_entlog *l)
{
    if (l->floating) {
        say(l,
            "the log's first records hold entries from %llu, but entries "
            "%llu to %llu are missing (a segment removed?)",
            (unsigned long long)l->float_first,
            (unsigned long long)(l->prev_index + 1),
            (unsigned long long)(l->float_first - 1));
        return IDA_ECORRUPT;
    }
    if (l->n > 0 && l->at_prev != 0 && l->at_prev != l->prev_term) {
        say(l,
            "the log holds entry %llu of term %llu, but the snapshot there "
            "is of term %llu, and entries follow",
            (unsigned long long)l->prev_index, (unsigned long long)l->at_prev,
            (unsigned long long)l->prev_term);
        return IDA_ECORRUPT;
    }
    if (l->n > 0 && ent_at(l, l->prev_index + 1)->term < l->prev_term) {
        say(l, "entry %llu has term %llu, below the snapshot's %llu",
            (unsigned long long)(l->prev_index + 1),
            (unsigned long long)ent_at(l, l->prev_index + 1)->term,
            (unsigned long long)l->prev_term);
        return IDA_ECORRUPT;
    }
    return 0;
}

/* A reset (ida_entlog_compact() of a log that does not match its
 * snapshot): the log is the snapshot at (@upto, @term), nothing after. */
static int take_reset(struct ida_entlog *l,
                      uint64_t lsn,
                      ida_index upto,
                      ida_term term)
{
    if (term == 0 || upto > l->snap_index ||
        (upto > l->prev_index && upto == l->snap_index &&
         term != l->snap_term)) {
        say(l,
            "log record %llu: the log was reset to a snapshot at %llu (term "
            "%llu), but the snapshot kept is at %llu (term %llu): a snapshot "
            "lost or rolled back",
            (unsigned long long)lsn, (unsigned long long)upto,
            (unsigned long long)term, (unsigned long long)l->snap_index,
            (unsigned long long)l->snap_term);
        return IDA_ECORRUPT;
    }
    if (upto > l->prev_index) {
        /* The compaction that wrote it ended before its caller recorded
         * the new prev: the log begins there. */
        l->prev_index = upto;
        l->prev_term = term;
    }
    l->n = 0; /* older than the reset: covered or discarded */
    l->floating = false;
    l->known = true;
    l->rlast = upto;
    l->at_prev = upto == l->prev_index ? term : 0;
    return 0;
}

/* Take one record (@data, @len bytes, at @pos; lsn 0: the replay ended),
 * its bytes checked as a hostile peer's would be. */
static int take_record(void *ctx,
                       uint64_t lsn,
                       const uint8_t *data,
                       size_t len,
                       struct ida_seglog_pos pos)
{
    struct ida_entlog *l = ctx;
    if (lsn == 0) {
        return replay_end(l);
    }
    if (len < HDR_BYTES || data[0] != VERSION || data[1] > FLAG_RESET) {
        say(l, "log record %llu: not a batch of this version",
            (unsigned long long)lsn);
        return IDA_ECORRUPT;
    }
    ida_index trunc = ida__le64(data + 8), commit = ida__le64(data + 16);
    ida_index first = ida__le64(data + 24);
    uint32_t count = ida__le32(data + 32);
    int rv = 0;
    if (data[1] == FLAG_RESET) {
        if (count != 0) {
            say(l, "log record %llu: a reset that carries entries",
                (unsigned long long)lsn);
            return IDA_ECORRUPT;
        }
        rv = take_reset(l, lsn, trunc, first);
    } else if (trunc != 0 && l->known && trunc > l->rlast + 1) {
        say(l, "log record %llu: truncates at %llu, the log ending at %llu",
            (unsigned long long)lsn, (unsigned long long)trunc,
            (unsigned long long)l->rlast);
        rv = IDA_ECORRUPT;
    } else if (trunc != 0 && l->floating && trunc > l->prev_index + 1 &&
               trunc <= l->float_first) {
        say(l,
            "log record %llu: truncates at %llu, but the entries from %llu "
            "to %llu are missing (a segment removed?)",
            (unsigned long long)lsn, (unsigned long long)trunc,
            (unsigned long long)(l->prev_index + 1),
            (unsigned long long)(l->float_first - 1));
        rv = IDA_ECORRUPT;
    } else if (trunc != 0) {
        /* Of entries the snapshot covers (an old truncation in a segment
         * still kept): everything taken so far is older, so gone. */
        if (trunc <= l->prev_index + 1) {
            l->n = 0;
            l->floating = false;
        } else if (!l->known) {
            l->floating = true; /* nothing replayed reaches it */
            l->float_first = trunc;
        } else {
            cut_from(l, trunc);
        }
        if (trunc <= l->prev_index) {
            l->at_prev = 0;
        }
        l->known = true;
        l->rlast = trunc - 1;
    }
    if (rv != 0) {
        return rv;
    }
    if (count > 0 && !l->known && first > l->prev_index + 1) {
        /* The segments kept may begin with records whose entries a later
         * truncation replaced, and whose log began in a segment released:
         * compaction keeps the record of the first entry it keeps, not
         * what precedes it in its segment. Such entries are stale: taken
         * (for the checks of what follows) but not indexed, until a
         * truncation at or below prev_index + 1 ends them. A log that
         * never gets one lost its beginning (replay_end()). */
        l->floating = true;
        l->float_first = first;
    } else if (count > 0 &&
               ((l->known && first != l->rlast + 1) || first == 0)) {
        say(l,
            "log record %llu: entries from %llu do not continue the log "
            "(ending at %llu, snapshot at %llu)",
            (unsigned long long)lsn, (unsigned long long)first,
            (unsigned long long)l->rlast, (unsigned long long)l->prev_index);
        return IDA_ECORRUPT;
    }
    uint64_t recno = l->rbase + l->rn;
    size_t at = HDR_BYTES;
    ida_term last_term = l->n > 0 ? ent_at(l, last_index(l))->term : 0;
    for (uint32_t i = 0; i < count; i++) {
        if (len - at < ENTRY_HDR) {
            say(l, "log record %llu: entry %u of %u cut short",
                (unsigned long long)lsn, i + 1, count);
            return IDA_ECORRUPT;
        }
        ida_term term = ida__le64(data + at);
        unsigned type = data[at + 8];
        uint32_t n = ida__le32(data + at + 12);
        if (term == 0 || !type_ok(type) || n > IDA_STORAGE_ENTRY_BYTES_MAX ||
            n > len - at - ENTRY_HDR || term < last_term) {
            say(l,
                "log record %llu: entry %llu is not one this log could "
                "hold (term %llu after %llu, type %u, %u bytes)",
                (unsigned long long)lsn, (unsigned long long)(first + i),
                (unsigned long long)term, (unsigned long long)last_term, type,
                n);
            return IDA_ECORRUPT;
        }
        last_term = term;
        ida_index index = first + i;
        if (index == l->prev_index) {
            l->at_prev = term;
        }
        if (index > l->prev_index && !l->floating) {
            struct ent x = {.term = term,
                            .rec = recno,
                            .off = (uint32_t)(at + ENTRY_HDR),
                            .len = n,
                            .type = (uint8_t)type};
            rv = ent_room(l, 1);
            if (rv != 0) {
                return rv;
            }
            l->e[l->start + l->n++] = x;
        }
        at += ENTRY_HDR + n;
    }
    if (count > 0) {
        l->known = true;
        l->rlast = first + count - 1;
    }
    if (commit > l->commit) {
        l->commit = commit;
    }
    /* Every record gets a number (entries name theirs); the list drops
     * its older end as compaction releases them. */
    rv = rec_room(l);
    if (rv == 0) {
        l->r[l->rn++] = (struct rec){pos, lsn};
    }
    return rv;
}

/* A log about to replay its records after (@prev_index, @prev_term), with
 * the snapshot at (@snap_index, @snap_term); NULL: no memory. */
static struct ida_entlog *entlog_new(ida_index prev_index,
                                     ida_term prev_term,
                                     ida_index snap_index,
                                     ida_term snap_term,
                                     char *err,
                                     size_t errlen)
{
    struct ida_entlog *l = ida_calloc(1, sizeof(*l));
    if (l == NULL) {
        return NULL;
    }
    l->prev_index = prev_index;
    l->prev_term = prev_term;
    l->snap_index = snap_index > prev_index ? snap_index : prev_index;
    l->snap_term = snap_index > prev_index ? snap_term : prev_term;
    l->err = err;
    l->errlen = errlen;
    return l;
}

/* The replay ended well. */
static void replay_done(struct ida_entlog *l)
{
    if (l->commit > last_index(l) && l->commit > l->prev_index) {
        l->commit = last_index(l); /* never beyond what the log holds */
    }
    l->err = NULL;
    l->errlen = 0;
}

int ida_entlog_open(const char *dir,
                    const struct ida_seglog_options *o,
                    ida_index prev_index,
                    ida_term prev_term,
                    ida_index snap_index,
                    ida_term snap_term,
                    struct ida_entlog **out,
                    char *err,
                    size_t errlen)
{
    struct ida_entlog *l =
        entlog_new(prev_index, prev_term, snap_index, snap_term, err, errlen);
    if (l == NULL) {
        return IDA_ENOMEM;
    }
    int rv = ida_seglog_open(dir, o, take_record, l, &l->sl, err, errlen);
    if (rv != 0) {
        ida_entlog_close(l);
        return rv;
    }
    replay_done(l);
    *out = l;
    return 0;
}

int ida__entlog_replay(ida_index prev_index,
                       ida_term prev_term,
                       ida_index snap_index,
                       ida_term snap_term,
                       const uint8_t *const *recs,
                       const size_t *lens,
                       size_t n,
                       struct ida_entlog **out,
                       char *err,
                       size_t errlen)
{
    struct ida_entlog *l =
        entlog_new(prev_index, prev_term, snap_index, snap_term, err, errlen);
    if (l == NULL) {
        return IDA_ENOMEM;
    }
    int rv = 0;
    for (size_t i = 0; rv == 0 && i < n; i++) {
        rv = take_record(l, i + 1, recs[i], lens[i],
                         (struct ida_seglog_pos){0, 0});
    }
    if (rv == 0) {
        rv = take_record(l, 0, NULL, 0, (struct ida_seglog_pos){0, 0});
    }
    if (rv != 0) {
        ida_entlog_close(l);
        return rv;
    }
    replay_done(l);
    *out = l;
    return 0;
}

void ida_entlog_close(struct ida_entlog *l)
{
    if (l == NULL) {
        return;
    }
    ida_seglog_close(l->sl);
    ida_free(l->e);
    ida_free(l->r);
    ida_free(l);
}

/* --- writes --- */

int ida_entlog_append(struct ida_entlog *l,
                      ida_index truncate_from,
                      ida_index commit,
                      const struct ida_entry *entries,
                      size_t count)
{
    ida_index last = last_index(l);
    if (truncate_from != 0 &&
        (truncate_from <= l->prev_index || truncate_from > last + 1 ||
         truncate_from <= l->commit)) {
        return IDA_EINVAL;
    }
    ida_index end = truncate_from != 0 ? truncate_from - 1 : last;
    ida_term last_term = end > l->prev_index    ? ent_at(l, end)->term
                         : end == l->prev_index ? l->prev_term
                                                : 0;
    size_t bytes = HDR_BYTES;
    for (size_t i = 0; i < count; i++) {
        const struct ida_entry *x = &entries[i];
        if (x->index != end + 1 + i || x->term == 0 || x->term < last_term ||
            !type_ok(x->type) || x->len > IDA_STORAGE_ENTRY_BYTES_MAX ||
            (x->len > 0 && x->data == NULL)) {
            return IDA_EINVAL;
        }
        last_term = x->term;
        bytes += ENTRY_HDR + x->len;
    }
    if (commit < l->commit || commit > end + count || count > UINT32_MAX) {
        return IDA_EINVAL;
    }
    if (bytes > IDA_SEGLOG_RECORD_MAX(IDA_SEGLOG_SEGMENT_MAX)) {
        return IDA_ETOOBIG;
    }
    uint8_t *buf = ida_malloc(bytes);
    if (buf == NULL) {
        return IDA_ENOMEM;
    }
    memset(buf, 0, HDR_BYTES);
    buf[0] = VERSION;
    ida__put_le64(buf + 8, truncate_from);
    ida__put_le64(buf + 16, commit);
    ida__put_le64(buf + 24, count > 0 ? end + 1 : 0);
    ida__put_le32(buf + 32, (uint32_t)count);
    size_t at = HDR_BYTES;
    for (size_t i = 0; i < count; i++) {
        const struct ida_entry *x = &entries[i];
        memset(buf + at, 0, ENTRY_HDR);
        ida__put_le64(buf + at, x->term);
        buf[at + 8] = (uint8_t)x->type;
        ida__put_le32(buf + at + 12, (uint32_t)x->len);
        if (x->len > 0) {
            memcpy(buf + at + ENTRY_HDR, x->data, x->len);
        }
        at += ENTRY_HDR + x->len;
    }
    /* The index gets room first: once the record is written, it must
     * take it. */
    if (ent_room(l, count) != 0 || rec_room(l) != 0) {
        ida_free(buf);
        return IDA_ENOMEM;
    }
    struct iovec v = {buf, bytes};
    uint64_t lsn;
    struct ida_seglog_pos pos;
    int rv = ida_seglog_append(l->sl, &v, 1, &lsn, &pos);
    ida_free(buf);
    if (rv != 0) {
        return rv;
    }
    if (truncate_from != 0) {
        cut_from(l, truncate_from);
    }
    uint64_t recno = l->rbase + l->rn;
    at = HDR_BYTES;
    for (size_t i = 0; i < count; i++) {
        struct ent x = {.term = entries[i].term,
                        .rec = recno,
                        .off = (uint32_t)(at + ENTRY_HDR),
                        .len = (uint32_t)entries[i].len,
                        .type = (uint8_t)entries[i].type};
        l->e[l->start + l->n++] = x; /* room made above */
        at += ENTRY_HDR + entries[i].len;
    }
    l->r[l->rn++] = (struct rec){pos, lsn};
    l->commit = commit;
    return 0;
}

int ida_entlog_sync(struct ida_entlog *l)
{
    return ida_seglog_sync(l->sl);
}

int ida_entlog_prepare(struct ida_entlog *l, size_t max_bytes)
{
    return ida_seglog_prepare(l->sl, max_bytes);
}

int ida_entlog_compact(struct ida_entlog *l, ida_index upto, ida_term upto_term)
{
    if (upto < l->prev_index) {
        return IDA_EINVAL;
    }
    ida_index last = last_index(l);
    bool keep = upto <= last &&
                (upto == l->prev_index ? l->prev_term == upto_term
                                       : ent_at(l, upto)->term == upto_term);
    if (!keep) {
        /* Figure 13, step 7: the log does not match the snapshot (or ends
         * before it) and goes whole. Its records stay in the segments
         * kept: a reset is recorded, durable before this returns, so that
         * a restart never replays them after the snapshot. */
        uint8_t buf[HDR_BYTES] = {VERSION, FLAG_RESET};
        ida__put_le64(buf + 8, upto);
        ida__put_le64(buf + 16, l->commit > upto ? l->commit : upto);
        ida__put_le64(buf + 24, upto_term);
        struct iovec v = {buf, sizeof(buf)};
        uint64_t lsn;
        struct ida_seglog_pos pos;
        int rv = rec_room(l);
        if (rv == 0) {
            rv = ida_seglog_append(l->sl, &v, 1, &lsn, &pos);
        }
        if (rv == 0) {
            /* Numbered as a replay numbers it (no entry points into it). */
            l->r[l->rn++] = (struct rec){pos, lsn};
            rv = ida_seglog_sync(l->sl);
        }
        if (rv != 0) {
            return rv;
        }
        l->start += l->n;
        l->n = 0;
    } else {
        size_t drop = (size_t)(upto - l->prev_index);
        l->start += drop;
        l->n -= drop;
    }
    l->prev_index = upto;
    l->prev_term = upto_term;
    if (l->commit < upto) {
        l->commit = upto;
    }
    /* Records older than the first entry kept are no longer needed (with
     * none kept, all but the segment appends go to). */
    uint64_t need = l->n > 0 ? l->e[l->start].rec : l->rbase + l->rn;
    size_t gone = (size_t)(need - l->rbase);
    uint64_t lsn = gone < l->rn ? l->r[gone].lsn : ida_seglog_next_lsn(l->sl);
    memmove(l->r, l->r + gone, (l->rn - gone) * sizeof(*l->r));
    l->rn -= gone;
    l->rbase = need;
    return ida_seglog_release(l->sl, lsn);
}

/* --- reads --- */

void ida_entlog_bounds(const struct ida_entlog *l,
                       ida_index *prev_index,
                       ida_term *prev_term,
                       ida_index *last)
{
    *prev_index = l->prev_index;
    *prev_term = l->prev_term;
    *last = last_index(l);
}

ida_index ida_entlog_commit(const struct ida_entlog *l)
{
    return l->commit;
}

uint64_t ida_entlog_synced_lsn(const struct ida_entlog *l)
{
    return ida_seglog_synced_lsn(l->sl);
}

int ida_entlog_term_at(const struct ida_entlog *l,
                       ida_index index,
                       ida_term *out)
{
    if (index == l->prev_index) {
        *out = l->prev_term;
        return 0;
    }
    if (index < l->prev_index || index > last_index(l)) {
        return IDA_ENOTFOUND;
    }
    *out = ent_at(l, index)->term;
    return 0;
}

int ida_entlog_entries(struct ida_entlog *l,
                       ida_index lo,
                       ida_index hi,
                       size_t max_bytes,
                       struct ida_entry **out,
                       size_t *count)
{
    if (lo == 0 || lo >= hi) {
        return IDA_EINVAL;
    }
    if (lo <= l->prev_index || hi > last_index(l) + 1) {
        return IDA_ENOTFOUND;
    }
    size_t n = 0, data = 0;
    for (ida_index i = lo; i < hi; i++) {
        size_t len = ent_at(l, i)->len;
        if (n > 0 && max_bytes > 0 && data + len > max_bytes) {
            break; /* the first always goes; no more past the limit */
        }
        n++;
        data += len;
    }
    struct ida_entry *es = ida_malloc(n * sizeof(*es) + data + 1);
    if (es == NULL) {
        return IDA_ENOMEM;
    }
    uint8_t *dst = (uint8_t *)(es + n);
    uint8_t *rec = NULL;
    size_t rec_len = 0;
    uint64_t rec_no = UINT64_MAX;
    int rv = 0;
    for (size_t k = 0; rv == 0 && k < n; k++) {
        const struct ent *x = ent_at(l, lo + k);
        if (x->rec != rec_no) {
            ida_free(rec);
            rec = NULL;
            const struct rec *r = &l->r[x->rec - l->rbase];
            rv = ida_seglog_read(l->sl, r->pos, r->lsn, &rec, &rec_len);
            rec_no = x->rec;
            if (rv == IDA_ENOTFOUND) {
                rv = IDA_ECORRUPT; /* the index says it is there */
            }
        }
        if (rv == 0 && (size_t)x->off + x->len > rec_len) {
            rv = IDA_ECORRUPT;
        }
        if (rv == 0) {
            memcpy(dst, rec + x->off, x->len);
            es[k] = (struct ida_entry){.term = x->term,
                                       .index = lo + k,
                                       .type = (enum ida_entry_type)x->type,
                                       .data = dst,
                                       .len = x->len};
            dst += x->len;
        }
    }
    ida_free(rec);
    if (rv != 0) {
        ida_free(es);
        return rv;
    }
    *out = es;
    *count = n;
    return 0;
}
