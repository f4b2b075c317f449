/* storage/: the log of format 3 and before, kept in LMDB's "log"
 * database (key: index, 8 bytes big-endian; value: a 24-byte header and
 * the data, record.h). Read at open, to move it into the entry log
 * (storage/logdir.c); nothing writes it any more. */
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
    if (!s->lmdb_log) {
        return 0; /* format 4: the entries are in the entry log */
    }
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

int ida__storage_lmdb_entries(struct ida_storage *s,
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
