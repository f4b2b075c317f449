/* storage/: snapshots: chunked writing, and reading the meta, a byte range or
 * the whole state back with every chunk checked (and the whole state's
 * checksum too, joined from its chunks'). */
#include "storage/storage.h"

#include <errno.h>
#include <lmdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

/* --- snapshots: reads --- */

/* The current snapshot record. MDB_NOTFOUND when there is none. */
static int read_snapshot_rec(struct ida_storage *s,
                             MDB_txn *txn,
                             struct ida__rec_snapshot *r)
{
    MDB_val v;
    int rc = ida__storage_get_meta(s, txn, KEY_SNAPSHOT, &v);
    if (rc != 0) {
        return rc;
    }
    if (ida__rec_snapshot_decode(v.mv_data, v.mv_size, r) != 0) {
        IDA_ERROR("storage %s: snapshot meta fails its checksum", s->dir);
        return RC_CORRUPT;
    }
    return 0;
}

/* Fetch chunk @c of snapshot @r with cursor @cur: positioned on it by
 * key, or (@next) by a step from chunk @c - 1; its length checked. @data
 * and @len point into LMDB; *@crc is its stored checksum (over its id,
 * number and data), for chunk_ok(). */
static int read_chunk(struct ida_storage *s,
                      MDB_cursor *cur,
                      int next,
                      const struct ida__rec_snapshot *r,
                      uint64_t c,
                      const uint8_t **data,
                      size_t *len,
                      uint32_t *crc)
{
    uint8_t kb[16];
    ida__storage_chunk_key(kb, r->id, c);
    MDB_val k = ida__storage_mkval(kb, 16), v;
    int rc = mdb_cursor_get(cur, &k, &v, next ? MDB_NEXT : MDB_SET_KEY);
    if (rc == 0 && next &&
        (k.mv_size != 16 || memcmp(k.mv_data, kb, 16) != 0)) {
        rc = MDB_NOTFOUND; /* the next record is not this chunk */
    }
    if (rc != 0) {
        if (rc == MDB_NOTFOUND) {
            IDA_ERROR("storage %s: snapshot %llu chunk %llu is missing", s->dir,
                      (unsigned long long)r->id, (unsigned long long)c);
            return RC_CORRUPT;
        }
        return rc;
    }
    uint64_t want = r->chunk_bytes;
    if (c == r->chunks - 1) {
        want = r->size - (r->chunks - 1) * (uint64_t)r->chunk_bytes;
    }
    const uint8_t *p = v.mv_data;
    if (v.mv_size != IDA__REC_CHUNK_HDR_BYTES + want) {
        IDA_ERROR(
            "storage %s: snapshot %llu chunk %llu has %zu bytes, not "
            "%llu",
            s->dir, (unsigned long long)r->id, (unsigned long long)c,
            v.mv_size - (v.mv_size >= IDA__REC_CHUNK_HDR_BYTES
                             ? IDA__REC_CHUNK_HDR_BYTES
                             : 0),
            (unsigned long long)want);
        return RC_CORRUPT;
    }
    *crc = ida__get_be32(p);
    *data = p + IDA__REC_CHUNK_HDR_BYTES;
    *len = (size_t)want;
    return 0;
}

/* Fill @out from @r, copying the configuration. */
static int meta_from_rec(const struct ida__rec_snapshot *r,
                         struct ida_snapshot_meta *out)
{
    memset(out, 0, sizeof(*out));
    out->config = ida_malloc(r->config_len > 0 ? r->config_len : 1);
    if (out->config == NULL) {
        return ENOMEM;
    }
    if (r->config_len > 0) {
        memcpy(out->config, r->config, r->config_len);
    }
    out->config_len = r->config_len;
    out->id = r->id;
    out->index = r->index;
    out->term = r->term;
    out->data_size = r->size;
    out->data_crc32c = r->data_crc;
    return 0;
}

void ida_snapshot_meta_release(struct ida_snapshot_meta *m)
{
    ida_free(m->config);
    m->config = NULL;
    m->config_len = 0;
}

int ida_storage_snapshot_meta(struct ida_storage *s,
                              struct ida_snapshot_meta *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    memset(out, 0, sizeof(*out));
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc != 0) {
        return ida__storage_from_lmdb(rc);
    }
    struct ida__rec_snapshot r;
    rc = read_snapshot_rec(s, txn, &r);
    if (rc == 0) {
        rc = meta_from_rec(&r, out);
    }
    ida__storage_read_end(s, txn);
    return ida__storage_from_lmdb(rc);
}

/* Whether @bytes (@len) of chunk @c of @r match its stored checksum @crc. */
static int chunk_ok(struct ida_storage *s,
                    const struct ida__rec_snapshot *r,
                    uint64_t c,
                    const uint8_t *bytes,
                    size_t len,
                    uint32_t crc)
{
    if (crc != ida__rec_chunk_crc(r->id, c, bytes, len)) {
        IDA_ERROR("storage %s: snapshot %llu chunk %llu fails its checksum",
                  s->dir, (unsigned long long)r->id, (unsigned long long)c);
        return RC_CORRUPT;
    }
    return 0;
}

/* The state's checksum from its chunks': a chunk's covers its id and
 * number, then its data, so its data's own is the chunk's xor the header's
 * carried over the data (ida__crc32c_join()), and the state's joins those
 * in turn. One table for the chunks' size, one for the last chunk's. */
struct state_crc
{
    struct ida__crc32c_shift full, last;
    uint32_t crc; /* of the state's bytes so far */
};

static void state_crc_init(struct state_crc *sc,
                           const struct ida__rec_snapshot *r)
{
    ida__crc32c_shift_init(&sc->full, r->chunk_bytes);
    ida__crc32c_shift_init(
        &sc->last, r->size - (r->chunks - 1) * (uint64_t)r->chunk_bytes);
    sc->crc = 0;
}

/* Add chunk @c (@len bytes, its checksum @chunk_crc, checked). */
static void state_crc_add(struct state_crc *sc,
                          const struct ida__rec_snapshot *r,
                          uint64_t c,
                          size_t len,
                          uint32_t chunk_crc)
{
    const struct ida__crc32c_shift *t =
        len == sc->full.len ? &sc->full : &sc->last;
    IDA_ASSERT(t->len == len); /* only whole chunks */
    uint32_t head = ida__rec_chunk_crc(r->id, c, NULL, 0);
    sc->crc = ida__crc32c_join(t, head ^ sc->crc, chunk_crc);
}

/* Copy bytes [@offset, @offset + @len) of snapshot @r (clipped at its end)
 * into @buf, each chunk checked; *n gets the count. A chunk copied whole
 * is checked in the copy, just written and in the cache (a state read back
 * at start is read from the map once, by the copy), a part of one in LMDB
 * before it is copied. With @sc (a whole state from offset 0), the chunks'
 * checksums are joined into the state's too, instead of a pass of its
 * own over the bytes. */
static int copy_range(struct ida_storage *s,
                      MDB_txn *txn,
                      const struct ida__rec_snapshot *r,
                      uint64_t offset,
                      uint8_t *buf,
                      size_t len,
                      size_t *n,
                      struct state_crc *sc)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->dbi_snap, &cur);
    if (rc != 0) {
        return rc;
    }
    size_t done = 0;
    while (done < len && offset < r->size) {
        uint64_t c = offset / r->chunk_bytes;
        size_t in = (size_t)(offset % r->chunk_bytes);
        const uint8_t *data;
        size_t clen;
        uint32_t ccrc;
        rc = read_chunk(s, cur, done > 0, r, c, &data, &clen, &ccrc);
        if (rc != 0) {
            break;
        }
        size_t take = clen - in;
        if (take > len - done) {
            take = len - done;
        }
        bool whole = in == 0 && take == clen;
        rc = whole ? 0 : chunk_ok(s, r, c, data, clen, ccrc);
        if (rc != 0) {
            break;
        }
        memcpy(buf + done, data + in, take);
        rc = whole ? chunk_ok(s, r, c, buf + done, clen, ccrc) : 0;
        if (rc != 0) {
            break;
        }
        if (sc != NULL) {
            state_crc_add(sc, r, c, take, ccrc);
        }
        done += take;
        offset += take;
    }
    mdb_cursor_close(cur);
    *n = done;
    return rc;
}

int ida_storage_snapshot_read(struct ida_storage *s,
                              uint64_t id,
                              uint64_t offset,
                              uint8_t *buf,
                              size_t len,
                              size_t *n)
{
    IDA_ASSERT(s != NULL && n != NULL && (buf != NULL || len == 0));
    *n = 0;
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc != 0) {
        return ida__storage_from_lmdb(rc);
    }
    struct ida__rec_snapshot r;
    int rv = 0;
    rc = read_snapshot_rec(s, txn, &r);
    if (rc == 0 && r.id != id) {
        rc = MDB_NOTFOUND; /* replaced by a newer snapshot */
    }
    if (rc == 0 && offset > r.size) {
        rv = IDA_EINVAL;
    } else if (rc == 0) {
        rc = copy_range(s, txn, &r, offset, buf, len, n, NULL);
    }
    ida__storage_read_end(s, txn);
    return rv != 0 ? rv : ida__storage_from_lmdb(rc);
}

int ida_storage_snapshot_load(struct ida_storage *s,
                              struct ida_snapshot_meta *out,
                              uint8_t **data)
{
    IDA_ASSERT(s != NULL && out != NULL && data != NULL);
    memset(out, 0, sizeof(*out));
    *data = NULL;
    MDB_txn *txn;
    int rc = ida__storage_read_begin(s, &txn);
    if (rc != 0) {
        return ida__storage_from_lmdb(rc);
    }
    struct ida__rec_snapshot r;
    uint8_t *buf = NULL;
    rc = read_snapshot_rec(s, txn, &r);
    if (rc == 0 && r.size > SIZE_MAX) {
        rc = ENOMEM;
    }
    if (rc == 0 && r.size > 0) {
        buf = ida_malloc_huge((size_t)r.size);
        rc = buf == NULL ? ENOMEM : 0;
    }
    size_t n = 0;
    struct state_crc sc = {.crc = 0};
    if (rc == 0 && r.size > 0) {
        state_crc_init(&sc, &r);
        rc = copy_range(s, txn, &r, 0, buf, (size_t)r.size, &n, &sc);
    }
    if (rc == 0 && (n != r.size || sc.crc != r.data_crc)) {
        /* Chunks that each pass their own checksum but are not the state
         * that was stored. */
        IDA_ERROR("storage %s: snapshot %llu state fails its checksum", s->dir,
                  (unsigned long long)r.id);
        rc = RC_CORRUPT;
    }
    if (rc == 0) {
        rc = meta_from_rec(&r, out);
    }
    ida__storage_read_end(s, txn);
    if (rc != 0) {
        ida_free(buf);
        return ida__storage_from_lmdb(rc);
    }
    *data = buf;
    return 0;
}

/* --- snapshots: writing --- */

int ida_storage_snapshot_begin(struct ida_storage *s,
                               struct ida_snapshot_writer *w,
                               ida_index index,
                               ida_term term,
                               const uint8_t *config,
                               size_t config_len)
{
    IDA_ASSERT(s != NULL && w != NULL);
    CHECK_PROCESS(s);
    memset(w, 0, sizeof(*w));
    if (s->failed != 0) {
        return s->failed;
    }
    if (s->writer_active) {
        return ida__storage_fail(s, s->dir, IDA_EBUSY,
                                 "a snapshot is already being written");
    }
    if (index == 0 || term == 0 || (config == NULL && config_len > 0)) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "snapshot at index %llu term %llu: both must be nonzero",
            (unsigned long long)index, (unsigned long long)term);
    }
    if (s->has_snapshot && index < s->snapshot_index) {
        return ida__storage_fail(
            s, s->dir, IDA_EINVAL,
            "snapshot at %llu is older than the current one at %llu",
            (unsigned long long)index, (unsigned long long)s->snapshot_index);
    }
    if (config_len > IDA_STORAGE_CONFIG_BYTES_MAX) {
        return ida__storage_fail(s, s->dir, IDA_ETOOBIG,
                                 "snapshot config of %zu bytes", config_len);
    }
    w->buf = ida_malloc(IDA_STORAGE_CHUNK_BYTES);
    w->config = ida_malloc(config_len > 0 ? config_len : 1);
    if (w->buf == NULL || w->config == NULL) {
        ida_free(w->buf);
        ida_free(w->config);
        memset(w, 0, sizeof(*w));
        return ida__storage_fail(s, s->dir, IDA_ENOMEM,
                                 "snapshot: out of memory");
    }
    if (config_len > 0) {
        memcpy(w->config, config, config_len);
    }
    w->config_len = config_len;
    w->id = s->next_snapshot_id++;
    w->index = index;
    w->term = term;
    s->writer_active = 1;
    return 0;
}

static void writer_release(struct ida_storage *s, struct ida_snapshot_writer *w)
{
    ida_free(w->buf);
    ida_free(w->config);
    memset(w, 0, sizeof(*w));
    s->writer_active = 0;
}

/* Store chunk @c of snapshot @id: @a (@alen bytes) then @b (@blen), written
 * straight into LMDB's page, the CRC taken over the bytes there. */
static int put_chunk(struct ida_storage *s,
                     MDB_txn *txn,
                     uint64_t id,
                     uint64_t c,
                     const uint8_t *a,
                     size_t alen,
                     const uint8_t *b,
                     size_t blen)
{
    uint8_t kb[16];
    ida__storage_chunk_key(kb, id, c);
    MDB_val k = ida__storage_mkval(kb, 16);
    size_t vlen = IDA__REC_CHUNK_HDR_BYTES + alen + blen;
    MDB_val v = ida__storage_mkval(NULL, vlen);
    /* A writer's id is the largest (open collects older writers' chunks),
     * so its chunks go at the end: MDB_APPEND fills each leaf page instead
     * of splitting it in two halves. Should another be last, a plain put. */
    int rc =
        ida__storage_put(s, txn, s->dbi_snap, &k, &v, MDB_RESERVE | MDB_APPEND);
    if (rc == MDB_KEYEXIST) {
        v = ida__storage_mkval(NULL, vlen);
        rc = ida__storage_put(s, txn, s->dbi_snap, &k, &v, MDB_RESERVE);
    }
    if (rc != 0) {
        return rc;
    }
    uint8_t *p = v.mv_data;
    if (alen > 0) {
        memcpy(p + IDA__REC_CHUNK_HDR_BYTES, a, alen);
    }
    if (blen > 0) {
        memcpy(p + IDA__REC_CHUNK_HDR_BYTES + alen, b, blen);
    }
    ida__put_be32(p, ida__rec_chunk_crc(id, c, p + IDA__REC_CHUNK_HDR_BYTES,
                                        alen + blen));
    return 0;
}

/* A write of @len bytes of @data to @w, planned without changing @w: the
 * transaction may run more than once (a full map grows and it is replayed)
 * and may fail, so the writer advances only after its commit. */
void ida__snapshot_step_plan(struct ida_snapshot_writer *w,
                             const uint8_t *data,
                             size_t len,
                             struct ida__snapshot_step *st)
{
    size_t k = IDA_STORAGE_CHUNK_BYTES - w->buf_len;
    if (k > len) {
        k = len;
    }
    *st = (struct ida__snapshot_step){
        .w = w,
        .data = data,
        .len = len,
        .k = k,
        .fills = w->buf_len + k == IDA_STORAGE_CHUNK_BYTES,
        .full = w->buf_len + k == IDA_STORAGE_CHUNK_BYTES
                    ? (len - k) / IDA_STORAGE_CHUNK_BYTES
                    : 0,
    };
}

/* Store the chunks @st fills: the writer's buffer completed by the first
 * bytes, then whole chunks straight from the data. */
int ida__snapshot_step_txn(struct ida_storage *s,
                           MDB_txn *txn,
                           const struct ida__snapshot_step *st)
{
    if (!st->fills) {
        return 0; /* all absorbed by the buffer, after the commit */
    }
    const struct ida_snapshot_writer *w = st->w;
    uint64_t c = w->chunk_count;
    int rc = put_chunk(s, txn, w->id, c++, w->buf, w->buf_len, st->data, st->k);
    for (size_t i = 0; rc == 0 && i < st->full; i++) {
        rc = put_chunk(s, txn, w->id, c++,
                       st->data + st->k + i * IDA_STORAGE_CHUNK_BYTES,
                       IDA_STORAGE_CHUNK_BYTES, NULL, 0);
    }
    return rc;
}

/* The step's commit succeeded: advance its writer. */
void ida__snapshot_step_done(const struct ida__snapshot_step *st)
{
    struct ida_snapshot_writer *w = st->w;
    w->crc = ida__crc32c(w->crc, st->data, st->len);
    w->size += st->len;
    if (!st->fills) {
        memcpy(w->buf + w->buf_len, st->data, st->len);
        w->buf_len += st->len;
        return;
    }
    w->chunk_count += 1 + st->full;
    size_t used = st->k + st->full * IDA_STORAGE_CHUNK_BYTES;
    memcpy(w->buf, st->data + used, st->len - used);
    w->buf_len = st->len - used;
}

static int write_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    return ida__snapshot_step_txn(s, txn, arg);
}

int ida_storage_snapshot_write(struct ida_storage *s,
                               struct ida_snapshot_writer *w,
                               const uint8_t *data,
                               size_t len)
{
    IDA_ASSERT(s != NULL && w != NULL && s->writer_active && w->buf != NULL);
    IDA_ASSERT(data != NULL || len == 0);
    struct ida__snapshot_step st;
    ida__snapshot_step_plan(w, data, len, &st);
    if (st.fills) {
        int rv = ida__storage_run_write(s, "snapshot write", write_txn, &st);
        if (rv != 0) {
            return rv;
        }
    }
    ida__snapshot_step_done(&st);
    return 0;
}

/* Delete the chunks of snapshot @id: all of them (@max_bytes 0), or as
 * many as take at least one and at most @max_bytes of values; *@left (may
 * be NULL) says whether any remain. Bytes, not chunks, bound the commit: a
 * snapshot an older version stored has chunks 32 times as large. The cursor
 * is re-positioned with MDB_SET_RANGE after each delete: its position after
 * deleting the last record is not one MDB_GET_CURRENT can use. */
static int delete_chunks(struct ida_storage *s,
                         MDB_txn *txn,
                         uint64_t id,
                         size_t max_bytes,
                         int *left)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->dbi_snap, &cur);
    if (rc != 0) {
        return rc;
    }
    uint8_t kb[16];
    ida__storage_chunk_key(kb, id, 0);
    size_t bytes = 0;
    int more = 0;
    for (;;) {
        MDB_val k = ida__storage_mkval(kb, 16), v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc != 0 || k.mv_size != 16 || ida__get_be64(k.mv_data) != id) {
            break;
        }
        if (max_bytes > 0 && bytes > 0 && bytes + v.mv_size > max_bytes) {
            more = 1;
            break;
        }
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            break;
        }
        bytes += v.mv_size;
    }
    mdb_cursor_close(cur);
    if (left != NULL) {
        *left = more;
    }
    return rc == MDB_NOTFOUND ? 0 : rc;
}

struct finish_args
{
    struct ida_snapshot_writer *w;
    int keep_replaced; /* leave the replaced snapshot's chunks */
};

static int finish_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    const struct finish_args *a = arg;
    struct ida_snapshot_writer *w = a->w;
    int rc = 0;
    uint64_t chunks = w->chunk_count;
    if (w->buf_len > 0) {
        rc = put_chunk(s, txn, w->id, chunks++, w->buf, w->buf_len, NULL, 0);
    }
    if (rc == 0 && s->has_snapshot && !a->keep_replaced) {
        rc = delete_chunks(s, txn, s->snapshot_id, 0, NULL);
    }
    if (rc != 0) {
        return rc;
    }
    struct ida__rec_snapshot r = {
        .id = w->id,
        .index = w->index,
        .term = w->term,
        .size = w->size,
        .data_crc = w->crc,
        .chunks = chunks,
        .chunk_bytes = IDA_STORAGE_CHUNK_BYTES,
        .config = w->config,
        .config_len = (uint32_t)w->config_len,
    };
    size_t cap = IDA__REC_SNAPSHOT_FIXED + w->config_len;
    uint8_t *rec = ida_malloc(cap);
    if (rec == NULL) {
        return ENOMEM;
    }
    size_t n = ida__rec_snapshot_encode(rec, &r);
    IDA_ASSERT(n == cap);
    rc = ida__storage_put_meta(s, txn, KEY_SNAPSHOT, rec, n);
    ida_free(rec);
    return rc;
}

int ida_storage_snapshot_set_config(struct ida_snapshot_writer *w,
                                    const uint8_t *config,
                                    size_t config_len)
{
    IDA_ASSERT(w != NULL && w->buf != NULL);
    IDA_ASSERT(config != NULL || config_len == 0);
    if (config_len > IDA_STORAGE_CONFIG_BYTES_MAX) {
        return IDA_ETOOBIG;
    }
    uint8_t *c = ida_malloc(config_len > 0 ? config_len : 1);
    if (c == NULL) {
        return IDA_ENOMEM;
    }
    if (config_len > 0) {
        memcpy(c, config, config_len);
    }
    ida_free(w->config);
    w->config = c;
    w->config_len = config_len;
    return 0;
}

int ida_storage_snapshot_writer_holds(const struct ida_snapshot_writer *w,
                                      ida_index index,
                                      ida_term term,
                                      const uint8_t *config,
                                      size_t config_len,
                                      const uint8_t *data,
                                      size_t len)
{
    IDA_ASSERT(w != NULL && (data != NULL || len == 0));
    IDA_ASSERT(config != NULL || config_len == 0);
    return w->index == index && w->term == term &&
           w->config_len == config_len &&
           (config_len == 0 || memcmp(w->config, config, config_len) == 0) &&
           w->size == len && w->crc == ida__crc32c(0, data, len);
}

static int finish(struct ida_storage *s,
                  struct ida_snapshot_writer *w,
                  int lazy)
{
    IDA_ASSERT(s != NULL && w != NULL && s->writer_active);
    struct finish_args a = {.w = w,
                            .keep_replaced = lazy && s->replaced_id == 0};
    int rv = ida__storage_run_write(s, "snapshot finish", finish_txn, &a);
    if (rv != 0) {
        ida_storage_snapshot_abort(s, w);
        return rv;
    }
    if (a.keep_replaced && s->has_snapshot) {
        s->replaced_id = s->snapshot_id;
    }
    s->has_snapshot = 1;
    s->snapshot_id = w->id;
    s->snapshot_index = w->index;
    s->snapshot_term = w->term;
    s->snapshot_size = w->size;
    writer_release(s, w);
    return 0;
}

int ida_storage_snapshot_finish(struct ida_storage *s,
                                struct ida_snapshot_writer *w)
{
    return finish(s, w, 0);
}

int ida_storage_snapshot_finish_lazy(struct ida_storage *s,
                                     struct ida_snapshot_writer *w)
{
    return finish(s, w, 1);
}

struct tidy_args
{
    uint64_t id;
    size_t max_bytes;
    int more;
};

static int tidy_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct tidy_args *a = arg;
    return delete_chunks(s, txn, a->id, a->max_bytes, &a->more);
}

int ida_storage_snapshot_tidy(struct ida_storage *s,
                              size_t max_bytes,
                              int *more)
{
    IDA_ASSERT(s != NULL && more != NULL && max_bytes > 0);
    CHECK_PROCESS(s);
    *more = 0;
    if (s->failed != 0) {
        return s->failed;
    }
    if (s->replaced_id == 0) {
        return 0;
    }
    struct tidy_args a = {.id = s->replaced_id, .max_bytes = max_bytes};
    int rv = ida__storage_run_write(s, "snapshot tidy", tidy_txn, &a);
    if (rv != 0) {
        return rv;
    }
    if (!a.more) {
        s->replaced_id = 0;
    }
    *more = a.more;
    return 0;
}

static int abort_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    return delete_chunks(s, txn, *(uint64_t *)arg, 0, NULL);
}

void ida_storage_snapshot_abort(struct ida_storage *s,
                                struct ida_snapshot_writer *w)
{
    IDA_ASSERT(s != NULL && w != NULL && s->writer_active);
    uint64_t id = w->id;
    writer_release(s, w);
    if (s->failed == 0 &&
        ida__storage_run_write(s, "snapshot abort", abort_txn, &id) != 0) {
        IDA_WARN("%s (its chunks are dropped at the next open)", s->errmsg);
    }
}
