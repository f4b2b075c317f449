/* storage/: the log and the hard state: bounds, group commit (truncate,
 * append, hard state in one durable commit), compaction, entry and term
 * reads. */
#include "storage/storage.h"

#include <errno.h>
#include <lmdb.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

static void index_key(uint8_t out[8], ida_index index)
{
    ida__put_be64(out, index);
}

/* Read the log_prev record. MDB rc or RC_CORRUPT. */
static int read_log_prev(struct ida_storage *s,
                         MDB_txn *txn,
                         ida_index *index,
                         ida_term *term)
{
    MDB_val v;
    int rc = ida__storage_get_meta(s, txn, KEY_LOG_PREV, &v);
    if (rc != 0) {
        return rc == MDB_NOTFOUND ? RC_CORRUPT : rc;
    }
    if (ida__rec_log_prev_decode(v.mv_data, v.mv_size, index, term) != 0) {
        return RC_CORRUPT;
    }
    return 0;
}

/* Term of entry @index from the log database. MDB rc or RC_CORRUPT. */
static int read_entry_term(struct ida_storage *s,
                           MDB_txn *txn,
                           ida_index index,
                           ida_term *term)
{
    uint8_t kb[8];
    index_key(kb, index);
    MDB_val k = ida__storage_mkval(kb, 8);
    MDB_val v;
    int rc = mdb_get(txn, s->dbi_log, &k, &v);
    if (rc != 0) {
        return rc;
    }
    struct ida_entry e;
    if (ida__rec_entry_decode(v.mv_data, v.mv_size, index, &e) != 0) {
        IDA_ERROR("storage %s: log entry %llu fails its checksum", s->dir,
                  (unsigned long long)index);
        return RC_CORRUPT;
    }
    *term = e.term;
    return 0;
}

/* The log's bounds as seen by @txn. MDB rc or RC_CORRUPT. */
int ida__storage_read_log_state(struct ida_storage *s,
                                MDB_txn *txn,
                                struct ida_storage_log_state *out)
{
    int rc = read_log_prev(s, txn, &out->prev_index, &out->prev_term);
    if (rc != 0) {
        return rc;
    }
    out->first = out->prev_index + 1;
    out->last = out->prev_index;
    out->last_term = out->prev_term;
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, s->dbi_log, &cur);
    if (rc != 0) {
        return rc;
    }
    MDB_val k, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_LAST);
    if (rc == MDB_NOTFOUND) {
        mdb_cursor_close(cur);
        return 0;
    }
    if (rc == 0 && k.mv_size != 8) {
        rc = RC_CORRUPT;
    }
    if (rc == 0) {
        struct ida_entry e;
        ida_index last = ida__get_be64(k.mv_data);
        if (ida__rec_entry_decode(v.mv_data, v.mv_size, last, &e) != 0 ||
            last <= out->prev_index) {
            rc = RC_CORRUPT;
        } else {
            out->last = last;
            out->last_term = e.term;
        }
    }
    mdb_cursor_close(cur);
    return rc;
}

/* --- group commit --- */

void ida_storage_batch_init(struct ida_storage *s, struct ida_storage_batch *b)
{
    IDA_ASSERT(s != NULL && b != NULL);
    memset(b, 0, sizeof(*b));
    b->last = s->log.last;
    b->last_term = s->log.last_term;
}

/* Owner-side term lookup outside any write transaction. */
static int owner_term_at(struct ida_storage *s, ida_index index, ida_term *out)
{
    if (index == s->log.prev_index) {
        *out = s->log.prev_term;
        return 0;
    }
    return ida_storage_term_at(s, index, out);
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
    int rv = owner_term_at(s, from - 1, &term);
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
        if (e->len > IDA_STORAGE_ENTRY_BYTES_MAX ||
            (e->len > 0 && e->data == NULL)) {
            return ida__storage_fail(s, s->dir, IDA_EINVAL,
                                     "append: entry %llu has %zu bytes of data",
                                     (unsigned long long)e->index, e->len);
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

/* Delete log entries with index >= @from (walking back from the end). */
static int delete_suffix(struct ida_storage *s, MDB_txn *txn, ida_index from)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->dbi_log, &cur);
    if (rc != 0) {
        return rc;
    }
    MDB_val k, v;
    while ((rc = mdb_cursor_get(cur, &k, &v, MDB_LAST)) == 0) {
        if (k.mv_size != 8) {
            rc = RC_CORRUPT;
            break;
        }
        if (ida__get_be64(k.mv_data) < from) {
            break;
        }
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            break;
        }
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Store one entry: header and data written straight into LMDB's page. */
static int put_entry(struct ida_storage *s,
                     MDB_txn *txn,
                     const struct ida_entry *e)
{
    uint8_t kb[8];
    index_key(kb, e->index);
    MDB_val k = ida__storage_mkval(kb, 8);
    MDB_val v = ida__storage_mkval(NULL, IDA__REC_ENTRY_HDR_BYTES + e->len);
    /* Keys only grow within a batch (after its truncation): MDB_APPEND. */
    int rc =
        ida__storage_put(s, txn, s->dbi_log, &k, &v, MDB_RESERVE | MDB_APPEND);
    if (rc != 0) {
        return rc;
    }
    uint8_t *p = v.mv_data;
    ida__rec_entry_header(p, e);
    if (e->len > 0) {
        memcpy(p + IDA__REC_ENTRY_HDR_BYTES, e->data, e->len);
    }
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
};

static int batch_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct batch_args *a = arg;
    struct ida_storage_batch *b = a->b;
    int rc = 0;
    if (b->has_truncate) {
        rc = delete_suffix(s, txn, b->truncate_from);
    }
    for (size_t i = 0; rc == 0 && i < b->span_count; i++) {
        for (size_t j = 0; rc == 0 && j < b->spans[i].count; j++) {
            rc = put_entry(s, txn, &b->spans[i].entries[j]);
        }
    }
    if (rc == 0 && b->has_hard_state) {
        uint8_t hs[IDA__REC_HARD_STATE_BYTES];
        ida__rec_hard_state_encode(hs, &b->hard_state);
        rc = ida__storage_put_meta(s, txn, KEY_HARD_STATE, hs, sizeof(hs));
    }
    if (rc == 0 && b->snap_w != NULL) {
        rc = ida__snapshot_step_txn(s, txn, &a->snap);
    }
    return rc;
}

int ida_storage_batch_commit(struct ida_storage *s, struct ida_storage_batch *b)
{
    IDA_ASSERT(s != NULL && b != NULL);
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    const struct ida_hard_state *hs = &b->hard_state;
    int same_hs = !b->has_hard_state || (hs->term == s->hard_state.term &&
                                         hs->vote == s->hard_state.vote &&
                                         hs->commit == s->hard_state.commit);
    struct batch_args a = {.b = b};
    if (b->snap_w != NULL) {
        ida__snapshot_step_plan(b->snap_w, b->snap_data, b->snap_len, &a.snap);
    }
    if (!b->has_truncate && b->span_count == 0 && same_hs && !a.snap.fills) {
        if (b->snap_w != NULL) {
            ida__snapshot_step_done(&a.snap); /* into the writer's buffer */
        }
        return 0; /* nothing would change: no transaction, no fsync */
    }
    if (b->has_hard_state && b->hard_state.commit > b->last) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "hard state: commit %llu beyond the last entry %llu",
            (unsigned long long)b->hard_state.commit,
            (unsigned long long)b->last);
    }
    int rv = ida__storage_run_write(s, "batch commit", batch_txn, &a);
    if (rv != 0) {
        return rv;
    }
    if (b->snap_w != NULL) {
        ida__snapshot_step_done(&a.snap);
    }
    s->log.last = b->last;
    s->log.last_term = b->last_term;
    if (b->has_hard_state) {
        s->hard_state = b->hard_state;
    }
    IDA_ASSERT(s->log.last >= s->log.prev_index);
    IDA_ASSERT(s->hard_state.commit <= s->log.last ||
               s->hard_state.commit <= s->snapshot_index);
    return 0;
}

/* --- compaction --- */

struct compact_args
{
    ida_index upto;       /* delete entries <= upto */
    ida_index prev_index; /* the new log_prev */
    ida_term prev_term;
    int discard_all; /* drop the whole log */
};

static int compact_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct compact_args *a = arg;
    int rc;
    if (a->discard_all) {
        rc = mdb_drop(txn, s->dbi_log, 0);
    } else {
        MDB_cursor *cur;
        rc = mdb_cursor_open(txn, s->dbi_log, &cur);
        MDB_val k, v;
        while (rc == 0 && (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST)) == 0) {
            if (k.mv_size != 8) {
                rc = RC_CORRUPT;
                break;
            }
            if (ida__get_be64(k.mv_data) > a->upto) {
                break;
            }
            rc = mdb_cursor_del(cur, 0);
        }
        if (rc == MDB_NOTFOUND) {
            rc = 0;
        }
        mdb_cursor_close(cur);
    }
    if (rc == 0) {
        uint8_t prev[IDA__REC_LOG_PREV_BYTES];
        ida__rec_log_prev_encode(prev, a->prev_index, a->prev_term);
        rc = ida__storage_put_meta(s, txn, KEY_LOG_PREV, prev, sizeof(prev));
    }
    return rc;
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
    struct compact_args a = {.upto = upto};
    if (upto <= s->log.last) {
        ida_term term;
        int rv = owner_term_at(s, upto, &term);
        if (rv != 0) {
            return ida__storage_fail(s, s->dir, rv,
                                     "compact: cannot read the term of %llu",
                                     (unsigned long long)upto);
        }
        a.prev_index = upto;
        a.prev_term = term;
        /* Figure 13, step 7: keep the suffix only if the log agrees with
         * the snapshot at its last index. */
        if (upto == s->snapshot_index && term != s->snapshot_term) {
            a.discard_all = 1;
            a.prev_term = s->snapshot_term;
        }
    } else if (upto == s->snapshot_index) {
        a.discard_all = 1;
        a.prev_index = s->snapshot_index;
        a.prev_term = s->snapshot_term;
    } else {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "compact up to %llu: beyond the last entry %llu and not "
            "the snapshot index",
            (unsigned long long)upto, (unsigned long long)s->log.last);
    }
    int rv = ida__storage_run_write(s, "compact", compact_txn, &a);
    if (rv != 0) {
        return rv;
    }
    s->log.prev_index = a.prev_index;
    s->log.prev_term = a.prev_term;
    s->log.first = a.prev_index + 1;
    if (a.discard_all || s->log.last <= a.prev_index) {
        s->log.last = a.prev_index;
        s->log.last_term = a.prev_term;
    }
    IDA_ASSERT(s->log.first == s->log.prev_index + 1);
    return 0;
}

/* --- reads --- */

int ida_storage_log_state(struct ida_storage *s,
                          struct ida_storage_log_state *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc == 0) {
        rc = ida__storage_read_log_state(s, txn, out);
        ida__storage_read_end(s, txn);
    }
    return ida__storage_from_lmdb(rc);
}

int ida_storage_hard_state(struct ida_storage *s, struct ida_hard_state *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc != 0) {
        return ida__storage_from_lmdb(rc);
    }
    MDB_val v;
    rc = ida__storage_get_meta(s, txn, KEY_HARD_STATE, &v);
    if (rc == 0 && ida__rec_hard_state_decode(v.mv_data, v.mv_size, out) != 0) {
        IDA_ERROR("storage %s: hard state fails its checksum", s->dir);
        rc = RC_CORRUPT;
    }
    ida__storage_read_end(s, txn);
    return rc == MDB_NOTFOUND ? IDA_ECORRUPT : ida__storage_from_lmdb(rc);
}

int ida_storage_term_at(struct ida_storage *s, ida_index index, ida_term *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc != 0) {
        return ida__storage_from_lmdb(rc);
    }
    ida_index prev_index;
    ida_term prev_term;
    rc = read_log_prev(s, txn, &prev_index, &prev_term);
    if (rc == 0) {
        if (index == prev_index) {
            *out = prev_term;
        } else if (index < prev_index) {
            rc = MDB_NOTFOUND;
        } else {
            rc = read_entry_term(s, txn, index, out);
        }
    }
    ida__storage_read_end(s, txn);
    return ida__storage_from_lmdb(rc);
}

/* Walk entries [lo, hi) from @cur; with @out NULL only count them and sum
 * their data (respecting @max_bytes), else copy them into @out and @data. */
static int walk_entries(struct ida_storage *s,
                        MDB_cursor *cur,
                        ida_index lo,
                        ida_index hi,
                        size_t max_bytes,
                        size_t *count,
                        size_t *bytes,
                        struct ida_entry *out,
                        uint8_t *data)
{
    uint8_t kb[8];
    index_key(kb, lo);
    MDB_val k = ida__storage_mkval(kb, 8), v;
    int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY);
    size_t n = 0, sum = 0;
    for (ida_index i = lo; i < hi; i++) {
        if (i > lo) {
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
        if (rc != 0) {
            return rc;
        }
        if (k.mv_size != 8 || ida__get_be64(k.mv_data) != i) {
            return MDB_NOTFOUND; /* a hole: the range is not all there */
        }
        /* The sizing pass reads headers; the copying pass checks each
         * entry's checksum in its copy, just written and in the cache (the
         * transaction shows both passes the same values). */
        struct ida_entry e;
        int bad = ida__rec_entry_peek(v.mv_data, v.mv_size, i, &e);
        if (bad == 0 && out == NULL && n > 0 && max_bytes > 0 &&
            sum + e.len > max_bytes) {
            break;
        }
        if (bad == 0 && out != NULL) {
            if (n == *count) {
                break;
            }
            out[n] = e;
            out[n].data = data + sum;
            if (e.len > 0) {
                memcpy(data + sum, e.data, e.len);
            }
            bad = ida__rec_entry_check(v.mv_data, out[n].data, i);
        }
        if (bad != 0) {
            IDA_ERROR("storage %s: log entry %llu fails its checksum", s->dir,
                      (unsigned long long)i);
            return RC_CORRUPT;
        }
        sum += e.len;
        n++;
    }
    *count = n;
    *bytes = sum;
    return 0;
}

int ida_storage_entries(struct ida_storage *s,
                        ida_index lo,
                        ida_index hi,
                        size_t max_bytes,
                        struct ida_entry **out,
                        size_t *count)
{
    IDA_ASSERT(s != NULL && out != NULL && count != NULL);
    *out = NULL;
    *count = 0;
    if (lo == 0 || lo >= hi) {
        return IDA_EINVAL;
    }
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc != 0) {
        return ida__storage_from_lmdb(rc);
    }
    MDB_cursor *cur = NULL;
    struct ida_entry *block = NULL;
    ida_index prev_index;
    ida_term prev_term;
    rc = read_log_prev(s, txn, &prev_index, &prev_term);
    if (rc == 0 && lo <= prev_index) {
        rc = MDB_NOTFOUND; /* compacted */
    }
    if (rc == 0) {
        rc = mdb_cursor_open(txn, s->dbi_log, &cur);
    }
    size_t n = 0, bytes = 0;
    if (rc == 0) {
        rc = walk_entries(s, cur, lo, hi, max_bytes, &n, &bytes, NULL, NULL);
    }
    if (rc == 0) {
        IDA_ASSERT(n >= 1);
        block = ida_malloc(n * sizeof(*block) + bytes);
        rc = block == NULL ? ENOMEM : 0;
    }
    if (rc == 0) {
        size_t n2 = n, bytes2 = 0;
        rc = walk_entries(s, cur, lo, hi, 0, &n2, &bytes2, block,
                          (uint8_t *)(block + n));
        IDA_ASSERT(rc != 0 || (n2 == n && bytes2 == bytes));
    }
    if (cur != NULL) {
        mdb_cursor_close(cur);
    }
    ida__storage_read_end(s, txn);
    if (rc != 0) {
        ida_free(block);
        return ida__storage_from_lmdb(rc);
    }
    *out = block;
    *count = n;
    return 0;
}
