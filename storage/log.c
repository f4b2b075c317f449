/* storage/: the log and the hard state: bounds, group commit (truncate,
 * append, hard state: the entries in the entry log, one flush; the term and
 * vote in LMDB when they change), compaction, entry and term reads. See
 * storage.h, "THE LOG". */
#include "storage/storage.h"

#include <errno.h>
#include <lmdb.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/entlog.h"
#include "storage/internal.h"
#include "storage/record.h"

/* A batch's entries go in records of about this size (one larger entry
 * alone): a record is read whole to read one of its entries back. */
#define RECORD_TARGET_BYTES (1u << 20)
/* An entry record's bytes beyond its data (entlog.h: the record header
 * and the entry's). */
#define RECORD_OVERHEAD (40u + 16u)

/* --- group commit --- */

void ida_storage_batch_init(struct ida_storage *s, struct ida_storage_batch *b)
{
    IDA_ASSERT(s != NULL && b != NULL);
    memset(b, 0, sizeof(*b));
    b->last = s->log.last;
    b->last_term = s->log.last_term;
}

/* The largest entry data a record of this storage's segments holds. */
static size_t entry_bytes_max(const struct ida_storage *s)
{
    size_t m = IDA_SEGLOG_RECORD_MAX(s->log_segment_bytes) - RECORD_OVERHEAD;
    return m < IDA_STORAGE_ENTRY_BYTES_MAX ? m : IDA_STORAGE_ENTRY_BYTES_MAX;
}

int ida_storage_batch_truncate(struct ida_storage *s,
                               struct ida_storage_batch *b,
                               ida_index from)
{
    IDA_ASSERT(s != NULL && b != NULL);
    if (b->has_truncate || b->span_count > 0) {
        return ida__storage_fail(s, s->dir, IDA_EINVAL,
                                 "truncate must come first in a batch, once");
    }
    if (from < s->log.first || from > s->log.last + 1) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "truncate from %llu outside the log [%llu, %llu]",
            (unsigned long long)from, (unsigned long long)s->log.first,
            (unsigned long long)s->log.last + 1);
    }
    if (from <= s->hard_state.commit) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "truncate from %llu would remove committed entries "
            "(commit %llu)",
            (unsigned long long)from, (unsigned long long)s->hard_state.commit);
    }
    ida_term term;
    int rv = ida_storage_term_at(s, from - 1, &term);
    if (rv != 0) {
        return ida__storage_fail(s, s->dir, rv,
                                 "truncate: cannot read the term of %llu",
                                 (unsigned long long)(from - 1));
    }
    b->has_truncate = 1;
    b->truncate_from = from;
    b->last = from - 1;
    b->last_term = term;
    return 0;
}

int ida_storage_batch_append(struct ida_storage *s,
                             struct ida_storage_batch *b,
                             const struct ida_entry *entries,
                             size_t count)
{
    IDA_ASSERT(s != NULL && b != NULL);
    if (count == 0) {
        return 0;
    }
    if (entries == NULL) {
        return ida__storage_fail(s, s->dir, IDA_EINVAL, "append: no entries");
    }
    if (b->span_count == IDA_STORAGE_BATCH_SPANS_MAX) {
        return ida__storage_fail(s, s->dir, IDA_ETOOBIG,
                                 "append: more than %d appends",
                                 IDA_STORAGE_BATCH_SPANS_MAX);
    }
    ida_index last = b->last;
    ida_term last_term = b->last_term;
    for (size_t i = 0; i < count; i++) {
        const struct ida_entry *e = &entries[i];
        if (e->index != last + 1) {
            return ida__storage_fail(
                s, s->dir, IDA_EINVAL,
                "append: entry index %llu does not follow %llu",
                (unsigned long long)e->index, (unsigned long long)last);
        }
        if (e->term == 0 || e->term < last_term) {
            return ida__storage_fail(
                s, s->dir, IDA_EINVAL,
                "append: entry %llu has term %llu below %llu",
                (unsigned long long)e->index, (unsigned long long)e->term,
                (unsigned long long)last_term);
        }
        if ((unsigned)e->type > IDA_ENTRY_CONFIG) {
            return ida__storage_fail(
                s, s->dir, IDA_EINVAL, "append: entry %llu type %d",
                (unsigned long long)e->index, (int)e->type);
        }
        if (e->len > 0 && e->data == NULL) {
            return ida__storage_fail(s, s->dir, IDA_EINVAL,
                                     "append: entry %llu has %zu bytes of data",
                                     (unsigned long long)e->index, e->len);
        }
        if (e->len > entry_bytes_max(s)) {
            return ida__storage_fail(
                s, s->dir, IDA_ETOOBIG,
                "append: entry %llu has %zu bytes of data, more than a "
                "log segment holds (%zu)",
                (unsigned long long)e->index, e->len, entry_bytes_max(s));
        }
        last = e->index;
        last_term = e->term;
    }
    b->spans[b->span_count].entries = entries;
    b->spans[b->span_count].count = count;
    b->span_count++;
    b->last = last;
    b->last_term = last_term;
    return 0;
}

int ida_storage_batch_set_hard_state(struct ida_storage *s,
                                     struct ida_storage_batch *b,
                                     const struct ida_hard_state *hs)
{
    IDA_ASSERT(s != NULL && b != NULL && hs != NULL);
    const struct ida_hard_state *cur = &s->hard_state;
    if (hs->term < cur->term) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL, "hard state: term %llu below %llu",
            (unsigned long long)hs->term, (unsigned long long)cur->term);
    }
    if (hs->term == cur->term && cur->vote != 0 && hs->vote != cur->vote) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "hard state: vote for %u changed to %u within term %llu",
            (unsigned)cur->vote, (unsigned)hs->vote,
            (unsigned long long)hs->term);
    }
    if (hs->commit < cur->commit) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL, "hard state: commit %llu below %llu",
            (unsigned long long)hs->commit, (unsigned long long)cur->commit);
    }
    b->has_hard_state = 1;
    b->hard_state = *hs;
    return 0;
}

int ida_storage_batch_snapshot(struct ida_storage *s,
                               struct ida_storage_batch *b,
                               struct ida_snapshot_writer *w,
                               const uint8_t *data,
                               size_t len)
{
    IDA_ASSERT(s != NULL && b != NULL && w != NULL);
    IDA_ASSERT(data != NULL || len == 0);
    if (b->snap_w != NULL || !s->writer_active || w->buf == NULL) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL, "batch: snapshot bytes %s",
            b->snap_w != NULL ? "twice in one batch" : "without a writer");
    }
    b->snap_w = w;
    b->snap_data = data;
    b->snap_len = len;
    return 0;
}

struct batch_args
{
    struct ida_storage_batch *b;
    struct ida__snapshot_step snap;
    int put_hs; /* the term or the vote changes */
};

/* The batch's part in LMDB: the term and vote (with the commit already
 * durable: the entries it covers are), the log's durable LSN, and the
 * snapshot bytes the batch carries. */
static int batch_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct batch_args *a = arg;
    struct ida_storage_batch *b = a->b;
    int rc = 0;
    if (a->put_hs) {
        struct ida_hard_state hs = b->hard_state;
        hs.commit = s->hard_state.commit;
        uint8_t rec[IDA__REC_HARD_STATE_BYTES];
        ida__rec_hard_state_encode(rec, &hs);
        rc = ida__storage_put_meta(s, txn, KEY_HARD_STATE, rec, sizeof(rec));
        if (rc == 0) {
            rc = ida__storage_put_log_lsn(s, txn,
                                          ida_entlog_synced_lsn(s->elog));
        }
    }
    if (rc == 0 && b->snap_w != NULL) {
        rc = ida__snapshot_step_txn(s, txn, &a->snap);
    }
    return rc;
}

/* An error of the entry log as ida__storage_stop() takes it. */
static int errno_of(int code)
{
    switch (code) {
        case IDA_ENOSPC:
            return ENOSPC;
        case IDA_ENOMEM:
            return ENOMEM;
        case IDA_ECORRUPT:
            return RC_CORRUPT;
        default:
            return EIO;
    }
}

ida_index ida__storage_record_commit(const struct ida_storage *s,
                                     ida_index commit,
                                     ida_index last)
{
    ida_index c = commit < last ? commit : last;
    ida_index logged = ida_entlog_commit(s->elog);
    return c > logged ? c : logged;
}

/* The batch's part in the entry log: its truncation, entries and commit
 * in records of about RECORD_TARGET_BYTES, then one flush. Any failure
 * stops the storage (the records before it may be on disk). */
static int log_write(struct ida_storage *s,
                     const struct ida_storage_batch *b,
                     ida_index commit)
{
    int fault = ida__storage_fault_commit(s);
    if (fault != 0) {
        /* Injected: as a write that failed before any of it was made. */
        return ida__storage_stop(s, "batch commit", fault);
    }
    ida_index trunc = b->has_truncate ? b->truncate_from : 0;
    int rv = 0, wrote = 0;
    for (size_t i = 0; rv == 0 && i < b->span_count; i++) {
        const struct ida_entry *e = b->spans[i].entries;
        size_t left = b->spans[i].count;
        while (rv == 0 && left > 0) {
            size_t n = 0, bytes = 0;
            do {
                bytes += e[n].len + 16;
                n++;
            } while (n < left && bytes + e[n].len + 16 <= RECORD_TARGET_BYTES);
            rv = ida_entlog_append(
                s->elog, trunc,
                ida__storage_record_commit(s, commit, e[n - 1].index), e, n);
            trunc = 0;
            wrote = 1;
            e += n;
            left -= n;
        }
    }
    if (rv == 0 && (!wrote || commit > ida_entlog_commit(s->elog))) {
        /* A truncation or a commit alone. */
        rv = ida_entlog_append(s->elog, trunc,
                               ida__storage_record_commit(s, commit, b->last),
                               NULL, 0);
    }
    if (rv == 0) {
        rv = ida_entlog_sync(s->elog);
    }
    if (rv != 0) {
        return ida__storage_stop(s, "batch commit (the log)", errno_of(rv));
    }
    return 0;
}

int ida_storage_batch_commit(struct ida_storage *s, struct ida_storage_batch *b)
{
    IDA_ASSERT(s != NULL && b != NULL);
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    const struct ida_hard_state *hs = &b->hard_state;
    ida_index commit = b->has_hard_state ? hs->commit : s->hard_state.commit;
    struct batch_args a = {.b = b};
    a.put_hs = b->has_hard_state && (hs->term != s->hard_state.term ||
                                     hs->vote != s->hard_state.vote);
    if (b->snap_w != NULL) {
        ida__snapshot_step_plan(b->snap_w, b->snap_data, b->snap_len, &a.snap);
    }
    int to_log =
        b->has_truncate || b->span_count > 0 || commit != s->hard_state.commit;
    if (!to_log && !a.put_hs && !a.snap.fills) {
        if (b->snap_w != NULL) {
            ida__snapshot_step_done(&a.snap); /* into the writer's buffer */
        }
        return 0; /* nothing would change: no transaction, no flush */
    }
    if (commit > b->last) {
        return ida__storage_fail(s, s->dir, IDA_EINVAL,
                                 "hard state: commit %llu beyond the last "
                                 "entry %llu",
                                 (unsigned long long)commit,
                                 (unsigned long long)b->last);
    }
    /* LMDB first: a term must be durable before entries of that term are
     * (a restart never finds the log ahead of the term). */
    if (a.put_hs || a.snap.fills) {
        int rv = ida__storage_run_write(s, "batch commit", batch_txn, &a);
        if (rv != 0) {
            return rv;
        }
        if (a.put_hs) {
            s->hard_state.term = hs->term;
            s->hard_state.vote = hs->vote;
            s->log_lsn = ida_entlog_synced_lsn(s->elog);
        }
    }
    if (b->snap_w != NULL) {
        ida__snapshot_step_done(&a.snap);
    }
    if (to_log) {
        int rv = log_write(s, b, commit);
        if (rv != 0) {
            return rv;
        }
    }
    s->log.last = b->last;
    s->log.last_term = b->last_term;
    s->hard_state.commit = commit;
    IDA_ASSERT(s->log.last >= s->log.prev_index);
    IDA_ASSERT(s->hard_state.commit <= s->log.last ||
               s->hard_state.commit <= s->snapshot_index);
    return 0;
}

/* --- compaction --- */

static int compact_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    const struct ida_storage_log_state *to = arg;
    uint8_t prev[IDA__REC_LOG_PREV_BYTES];
    ida__rec_log_prev_encode(prev, to->prev_index, to->prev_term);
    return ida__storage_put_meta(s, txn, KEY_LOG_PREV, prev, sizeof(prev));
}

int ida_storage_compact(struct ida_storage *s, ida_index upto)
{
    IDA_ASSERT(s != NULL);
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    if (!s->has_snapshot || upto > s->snapshot_index) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "compact up to %llu: not covered by a durable snapshot "
            "(snapshot index %llu)",
            (unsigned long long)upto,
            (unsigned long long)(s->has_snapshot ? s->snapshot_index : 0));
    }
    if (upto < s->log.first) {
        return 0;
    }
    struct ida_storage_log_state to = {.prev_index = upto};
    int discard_all = 0;
    if (upto <= s->log.last) {
        int rv = ida_storage_term_at(s, upto, &to.prev_term);
        if (rv != 0) {
            return ida__storage_fail(s, s->dir, rv,
                                     "compact: cannot read the term of %llu",
                                     (unsigned long long)upto);
        }
        /* Figure 13, step 7: keep the suffix only if the log agrees with
         * the snapshot at its last index. */
        if (upto == s->snapshot_index && to.prev_term != s->snapshot_term) {
            discard_all = 1;
            to.prev_term = s->snapshot_term;
        }
    } else if (upto == s->snapshot_index) {
        discard_all = 1;
        to.prev_term = s->snapshot_term;
    } else {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "compact up to %llu: beyond the last entry %llu and not "
            "the snapshot index",
            (unsigned long long)upto, (unsigned long long)s->log.last);
    }
    /* The new prev is recorded in LMDB before the entry log lets go of
     * what it names (an open then skips the entries it covers), except
     * when the log goes whole: its reset is durable first, and an open
     * that finds it beyond LMDB's prev takes it (entlog.h). */
    int rv = 0;
    if (discard_all) {
        rv = ida_entlog_compact(s->elog, upto, to.prev_term);
        if (rv != 0) {
            return ida__storage_stop(s, "compact (the log)", errno_of(rv));
        }
    }
    rv = ida__storage_run_write(s, "compact", compact_txn, &to);
    if (rv != 0) {
        if (discard_all && s->failed == 0) {
            /* The log was reset and the cache no longer says so: nothing
             * more may be written on it (the next open takes the reset). */
            s->failed = rv;
        }
        return rv;
    }
    if (!discard_all) {
        rv = ida_entlog_compact(s->elog, upto, to.prev_term);
        if (rv != 0) {
            return ida__storage_stop(s, "compact (the log)", errno_of(rv));
        }
    }
    s->log.prev_index = to.prev_index;
    s->log.prev_term = to.prev_term;
    s->log.first = to.prev_index + 1;
    if (discard_all || s->log.last <= to.prev_index) {
        s->log.last = to.prev_index;
        s->log.last_term = to.prev_term;
    }
    IDA_ASSERT(s->log.first == s->log.prev_index + 1);
    return 0;
}

int ida_storage_log_prepare(struct ida_storage *s, size_t max_bytes)
{
    IDA_ASSERT(s != NULL);
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    return ida_entlog_prepare(s->elog, max_bytes);
}

/* --- reads --- */

int ida_storage_log_state(struct ida_storage *s,
                          struct ida_storage_log_state *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    CHECK_PROCESS(s);
    *out = s->log;
    return 0;
}

int ida_storage_hard_state(struct ida_storage *s, struct ida_hard_state *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    CHECK_PROCESS(s);
    *out = s->hard_state;
    return 0;
}

int ida_storage_term_at(struct ida_storage *s, ida_index index, ida_term *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    CHECK_PROCESS(s);
    return ida_entlog_term_at(s->elog, index, out);
}

int ida_storage_entries(struct ida_storage *s,
                        ida_index lo,
                        ida_index hi,
                        size_t max_bytes,
                        struct ida_entry **out,
                        size_t *count)
{
    IDA_ASSERT(s != NULL && out != NULL && count != NULL);
    CHECK_PROCESS(s);
    *out = NULL;
    *count = 0;
    int rv = ida_entlog_entries(s->elog, lo, hi, max_bytes, out, count);
    if (rv == IDA_ECORRUPT || rv == IDA_EIO) {
        IDA_ERROR("storage %s: log entries from %llu: %s", s->dir,
                  (unsigned long long)lo, idalloc_strerror(rv));
    }
    return rv;
}
