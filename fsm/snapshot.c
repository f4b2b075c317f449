/* Snapshots: the state as an idalloc.FsmState (proto/idalloc.proto).
 *
 * DESIGN: the bulk of a snapshot is holdings (10 million is a normal
 * state), so the outer messages are written and read here directly in the
 * protobuf wire format instead of through protobuf-c's generated structs,
 * which would need one allocated struct per holding on both sides (several
 * hundred MB for 10 million). The bytes are exactly what protobuf-c packs
 * for the same message (proto3: zero scalars and empty strings omitted,
 * present sub-messages always written, repeated uint64 packed); the tests
 * check that by unpacking with protobuf-c and packing again. The small
 * CommandResult of a kept session answer goes through protobuf-c.
 *
 * Writing is two passes: a counting pass sizes the buffer, the second
 * fills it; a nested message is counted before its length is written.
 * Reading validates everything into a fresh ida_fsm and only then swaps it
 * in, so a bad snapshot never leaves a half-loaded state.
 *
 * Truncation at a field boundary still parses as protobuf (a shorter list
 * of pools is a valid message), so the last field is always checksum
 * (field 7, fixed64): a hash of all bytes before it. A reader requires it
 * to be the final 9 bytes and to match. Fields are written in number order,
 * so protobuf-c packing the decoded message gives the same bytes. */
#include "fsm/fsm.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

/* --- writer --------------------------------------------------------------- */

struct wbuf
{
    uint8_t *p; /* NULL: counting only */
    size_t len;
};

static void w_raw(struct wbuf *w, const void *src, size_t n)
{
    if (w->p != NULL) {
        memcpy(w->p + w->len, src, n);
    }
    w->len += n;
}

static void w_varint(struct wbuf *w, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    while (v >= 0x80) {
        b[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b[n++] = (uint8_t)v;
    w_raw(w, b, n);
}

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static void w_key(struct wbuf *w, uint32_t field, int type)
{
    w_varint(w, ((uint64_t)field << 3) | (uint64_t)type);
}

/* proto3: a zero scalar is not written. */
static void w_u64(struct wbuf *w, uint32_t field, uint64_t v)
{
    if (v != 0) {
        w_key(w, field, WT_VARINT);
        w_varint(w, v);
    }
}

static void w_bytes(struct wbuf *w,
                    uint32_t field,
                    const void *data,
                    size_t len)
{
    if (len != 0) {
        w_key(w, field, WT_LEN);
        w_varint(w, len);
        w_raw(w, data, len);
    }
}

typedef void (*enc_fn)(struct wbuf *w, const void *arg);

/* A present sub-message is written even when empty. */
static void w_msg(struct wbuf *w, uint32_t field, enc_fn fn, const void *arg)
{
    struct wbuf count = {NULL, 0};
    fn(&count, arg);
    w_key(w, field, WT_LEN);
    w_varint(w, count.len);
    if (w->p == NULL) {
        w->len += count.len; /* counting: no need to run @fn again */
        return;
    }
    size_t before = w->len;
    fn(w, arg);
    IDA_ASSERT(w->len - before == count.len);
}

/* A sub-message whose size is known already. */
static void w_msg_sized(struct wbuf *w,
                        uint32_t field,
                        enc_fn fn,
                        const void *arg,
                        size_t size)
{
    w_key(w, field, WT_LEN);
    w_varint(w, size);
    if (w->p == NULL) {
        w->len += size;
        return;
    }
    size_t before = w->len;
    fn(w, arg);
    IDA_ASSERT(w->len - before == size);
}

/* --- encoders
 * ----------------------------------------------------------------- */

struct holding_arg
{
    uint64_t id;
    const uint8_t *rec;
};

static void enc_holding(struct wbuf *w, const void *arg)
{
    const struct holding_arg *h = arg;
    w_u64(w, 1, h->id);
    w_bytes(w, 2, h->rec + 1, ida__tagrec_len(h->rec));
}

static void enc_bounded(struct wbuf *w, const void *arg)
{
    const struct ida__bounded *b = arg;
    w_u64(w, 1, b->size);
    for (uint64_t id = ida__bounded_next_held(b, 0); id != UINT64_MAX;
         id = ida__bounded_next_held(b, id + 1)) {
        struct holding_arg h = {id, ida__bounded_tag(b, id)};
        w_msg(w, 2, enc_holding, &h);
    }
}

static void enc_seq(struct wbuf *w, const void *arg)
{
    w_u64(w, 1, *(const uint64_t *)arg);
}

struct tagprefix_arg
{
    const uint8_t *rec;
    uint64_t value;
};

static void enc_tagprefix(struct wbuf *w, const void *arg)
{
    const struct tagprefix_arg *t = arg;
    uint8_t enc[IDA_PREFIX_BYTES_MAX];
    size_t n = ida__prefix_encode(t->value, enc);
    w_bytes(w, 1, t->rec + 1, ida__tagrec_len(t->rec));
    w_bytes(w, 2, enc, n);
}

static void enc_reserved(struct wbuf *w, const void *arg)
{
    const struct ida__prefix *p = arg;
    for (uint64_t i = 0; i < IDA__WINDOW_MAX; i++) {
        if ((p->reserved[i / 64] >> (i % 64)) & 1) {
            w_varint(w, p->start + i);
        }
    }
}

/* A prefix record in snapshot order: by tag bytes (a tag never contains
 * NUL, so the stored NUL-terminated strings compare right with strcmp). */
struct tag_order
{
    const char *tag;
    uint32_t ref;
};

static int cmp_tag_order(const void *a, const void *b)
{
    return strcmp(((const struct tag_order *)a)->tag,
                  ((const struct tag_order *)b)->tag);
}

struct prefix_arg
{
    const struct ida__prefix *p;
    const struct tag_order *order; /* refs sorted by tag */
};

static void enc_prefix(struct wbuf *w, const void *arg)
{
    const struct prefix_arg *a = arg;
    const struct ida__prefix *p = a->p;
    w_u64(w, 1, p->start);
    w_u64(w, 2, p->count);
    if (p->count > 0) {
        w_msg(w, 3, enc_reserved, p); /* packed repeated uint64 */
    }
    for (uint32_t i = 0; i < p->n; i++) {
        uint32_t ref = a->order[i].ref;
        struct tagprefix_arg t = {p->tags[ref], p->values[ref]};
        w_msg(w, 4, enc_tagprefix, &t);
    }
}

struct pool_arg
{
    const struct ida__pool *pool;
    const struct tag_order *order; /* prefix pools only */
    size_t inner_size; /* size of the kind's sub-message, counted once */
};

/* The kind's sub-message of @a: field number, encoder and its argument. */
static void pool_inner(const struct pool_arg *a,
                       struct prefix_arg *pa,
                       uint32_t *field,
                       enc_fn *fn,
                       const void **arg)
{
    const struct ida__pool *p = a->pool;
    switch (p->kind) {
        case IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE:
            *field = 3;
            *fn = enc_seq;
            *arg = &p->u.seq_next;
            break;
        case IDALLOC__POOL_KIND__POOL_KIND_BOUNDED:
            *field = 4;
            *fn = enc_bounded;
            *arg = &p->u.bounded;
            break;
        default:
            pa->p = &p->u.prefix;
            pa->order = a->order;
            *field = 5;
            *fn = enc_prefix;
            *arg = pa;
            break;
    }
}

/* Count the kind's sub-message of @a (one pass over its holdings). */
static size_t pool_inner_size(const struct pool_arg *a)
{
    struct prefix_arg pa;
    uint32_t field;
    enc_fn fn;
    const void *arg;
    pool_inner(a, &pa, &field, &fn, &arg);
    struct wbuf count = {NULL, 0};
    fn(&count, arg);
    return count.len;
}

static void enc_pool(struct wbuf *w, const void *arg)
{
    const struct pool_arg *a = arg;
    const struct ida__pool *p = a->pool;
    w_bytes(w, 1, p->name, strlen(p->name));
    w_u64(w, 2, (uint64_t)p->kind);
    struct prefix_arg pa;
    uint32_t field;
    enc_fn fn;
    const void *inner;
    pool_inner(a, &pa, &field, &fn, &inner);
    w_msg_sized(w, field, fn, inner, a->inner_size);
}

struct result_arg
{
    uint64_t seq;
    const struct ida_fsm_result *r;
};

static void enc_result(struct wbuf *w, const void *arg)
{
    const struct result_arg *a = arg;
    struct ida_fsm_result_pb pb;
    ida_fsm_result_to_pb(a->r, &pb);
    w_u64(w, 1, a->seq);
    size_t n = idalloc__command_result__get_packed_size(&pb.msg);
    w_key(w, 2, WT_LEN);
    w_varint(w, n);
    if (w->p != NULL) {
        size_t got = idalloc__command_result__pack(&pb.msg, w->p + w->len);
        IDA_ASSERT(got == n);
    }
    w->len += n;
}

static void enc_session(struct wbuf *w, const void *arg)
{
    const struct ida__session *s = arg;
    w_bytes(w, 1, s->client_id, IDA_CLIENT_ID_BYTES);
    w_u64(w, 2, s->last_active_ms);
    /* Kept results are unordered in memory; written by request_seq. */
    uint32_t order[IDA_SESSION_RESULTS_MAX];
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t j = i;
        while (j > 0 && s->results[order[j - 1]].seq > s->results[i].seq) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        const struct ida__cached *k = &s->results[order[i]];
        struct result_arg a = {k->seq, &k->result};
        w_msg(w, 3, enc_result, &a);
    }
    w_u64(w, 4, s->rank);
    w_u64(w, 5, s->evicted_below);
}

static int cmp_session(const void *a, const void *b)
{
    const struct ida__session *x = *(struct ida__session *const *)a;
    const struct ida__session *y = *(struct ida__session *const *)b;
    return memcmp(x->client_id, y->client_id, IDA_CLIENT_ID_BYTES);
}

struct state_arg
{
    const struct ida_fsm *f;
    const size_t *inner_sizes;            /* per pool */
    struct tag_order *const *orders;      /* per pool, prefix pools only */
    struct ida__session *const *sessions; /* by client_id */
};

static void enc_state(struct wbuf *w, const void *arg)
{
    const struct state_arg *a = arg;
    const struct ida_fsm *f = a->f;
    w_u64(w, 1, IDA_FSM_STATE_VERSION);
    for (size_t i = 0; i < f->pool_count; i++) {
        struct pool_arg pa = {f->pools[i], a->orders[i], a->inner_sizes[i]};
        w_msg(w, 2, enc_pool, &pa);
    }
    for (size_t i = 0; i < f->session_count; i++) {
        w_msg(w, 3, enc_session, a->sessions[i]);
    }
    w_u64(w, 4, f->now_ms);
    w_u64(w, 5, f->applied_index);
    w_u64(w, 6, f->session_clock);
}

/* A 64-bit hash of @len bytes, the same on every platform (the words are
 * assembled little-endian). Not cryptographic: it catches damage, not
 * malice; the storage layer's crc32c guards the file as well. */
uint64_t ida__snapshot_checksum(const uint8_t *p, size_t len)
{
    uint64_t h = UINT64_C(0x6a09e667f3bcc909) ^ (uint64_t)len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = 0;
        for (int b = 7; b >= 0; b--) {
            w = (w << 8) | p[i + (size_t)b];
        }
        h = (h ^ w) * UINT64_C(0x9e3779b97f4a7c15);
        h ^= h >> 29;
    }
    for (; i < len; i++) {
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    }
    h ^= h >> 32;
    h *= UINT64_C(0xd6e8feb86659fd93);
    h ^= h >> 32;
    return h;
}

#define CHECKSUM_KEY   ((7u << 3) | WT_I64)
#define CHECKSUM_BYTES 9

int ida_fsm_snapshot(const struct ida_fsm *f, uint8_t **data, size_t *len)
{
    int rv = IDA_ENOMEM;
    struct tag_order **orders = ida_calloc(f->pool_count + 1, sizeof(*orders));
    struct ida__session **sess =
        ida_malloc((f->session_count + 1) * sizeof(*sess));
    size_t *inner = ida_calloc(f->pool_count + 1, sizeof(*inner));
    if (orders == NULL || sess == NULL || inner == NULL) {
        goto err_after_arrays;
    }
    for (size_t i = 0; i < f->pool_count; i++) {
        if (f->pools[i]->kind != IDALLOC__POOL_KIND__POOL_KIND_PREFIX) {
            continue;
        }
        const struct ida__prefix *p = &f->pools[i]->u.prefix;
        orders[i] = ida_malloc(((size_t)p->n + 1) * sizeof(**orders));
        if (orders[i] == NULL) {
            goto err_after_arrays;
        }
        for (uint32_t r = 0; r < p->n; r++) {
            orders[i][r].tag = ida__tagrec_str(p->tags[r]);
            orders[i][r].ref = r;
        }
        qsort(orders[i], p->n, sizeof(**orders), cmp_tag_order);
    }
    size_t n = 0;
    for (struct ida__session *s = f->lru_head; s != NULL; s = s->next) {
        sess[n++] = s;
    }
    IDA_ASSERT(n == f->session_count);
    qsort(sess, n, sizeof(*sess), cmp_session);

    for (size_t i = 0; i < f->pool_count; i++) {
        struct pool_arg pa = {f->pools[i], orders[i], 0};
        inner[i] = pool_inner_size(&pa);
    }
    struct state_arg a = {f, inner, orders, sess};
    struct wbuf w = {NULL, 0};
    enc_state(&w, &a);
    size_t total = w.len + CHECKSUM_BYTES;
    w.p = ida_malloc(total);
    if (w.p == NULL) {
        goto err_after_arrays;
    }
    w.len = 0;
    enc_state(&w, &a);
    uint64_t sum = ida__snapshot_checksum(w.p, w.len);
    w.p[w.len++] = CHECKSUM_KEY;
    for (int b = 0; b < 8; b++) {
        w.p[w.len++] = (uint8_t)(sum >> (8 * b));
    }
    IDA_ASSERT(w.len == total);
    *data = w.p;
    *len = total;
    rv = 0;

err_after_arrays:
    if (orders != NULL) {
        for (size_t i = 0; i < f->pool_count; i++) {
            ida_free(orders[i]);
        }
    }
    ida_free(orders);
    ida_free(sess);
    ida_free(inner);
    return rv;
}

/* --- reader
 * ----------------------------------------------------------------------- */

struct rbuf
{
    const uint8_t *p, *end;
};

static int r_varint(struct rbuf *r, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (r->p == r->end) {
            return -1;
        }
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* One field: its number, wire type, and for WT_VARINT the value, for WT_LEN
 * the sub-buffer. Fixed-width fields are skipped (none are used). */
struct field
{
    uint32_t num;
    int type;
    uint64_t v;
    struct rbuf sub;
};

/* 1: a field read, 0: end of buffer, -1: malformed. */
static int r_field(struct rbuf *r, struct field *f)
{
    if (r->p == r->end) {
        return 0;
    }
    uint64_t key;
    if (r_varint(r, &key) != 0 || (key >> 3) == 0 || (key >> 3) > UINT32_MAX) {
        return -1;
    }
    f->num = (uint32_t)(key >> 3);
    f->type = (int)(key & 7);
    switch (f->type) {
        case WT_VARINT:
            return r_varint(r, &f->v) == 0 ? 1 : -1;
        case WT_I64:
        case WT_I32: {
            size_t n = f->type == WT_I64 ? 8 : 4;
            if ((size_t)(r->end - r->p) < n) {
                return -1;
            }
            r->p += n;
            return 1;
        }
        case WT_LEN: {
            uint64_t n;
            if (r_varint(r, &n) != 0 || n > (uint64_t)(r->end - r->p)) {
                return -1;
            }
            f->sub.p = r->p;
            f->sub.end = r->p + n;
            r->p += n;
            return 1;
        }
        default:
            return -1;
    }
}

#define CORRUPT IDA_ECORRUPT

/* A tag from the wire: 1..IDA_TAG_BYTES_MAX bytes, no NUL. */
static bool tag_ok(const struct rbuf *b)
{
    size_t n = (size_t)(b->end - b->p);
    return n >= 1 && n <= IDA_TAG_BYTES_MAX && memchr(b->p, 0, n) == NULL;
}

static int dec_holding(struct ida__bounded *b,
                       struct rbuf r,
                       bool first,
                       uint64_t *last_id)
{
    struct field f;
    uint64_t id = 0;
    struct rbuf tag = {NULL, NULL};
    int k;
    while ((k = r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == WT_VARINT) {
            id = f.v;
        } else if (f.num == 2 && f.type == WT_LEN) {
            tag = f.sub;
        }
    }
    if (k < 0 || tag.p == NULL) {
        return CORRUPT;
    }
    if ((!first && id <= *last_id) || id >= b->size ||
        id >= IDA_BOUNDED_HELD_MAX) {
        return CORRUPT;
    }
    size_t n = (size_t)(tag.end - tag.p);
    if (!tag_ok(&tag) ||
        ida__bounded_find(b, (const char *)tag.p, n) != IDA__REF_NONE) {
        return CORRUPT; /* bad tag, or one tag with two ids */
    }
    uint8_t *rec = ida__tagrec_new(&b->slab, (const char *)tag.p, n);
    if (rec == NULL) {
        return IDA_ENOMEM;
    }
    if (ida__bounded_put(b, id, rec) != 0) {
        ida__tagrec_free(&b->slab, rec);
        return IDA_ENOMEM;
    }
    *last_id = id;
    return 0;
}

static int dec_bounded(struct ida__pool *pool, struct rbuf r)
{
    struct field f;
    uint64_t size = 0, holdings = 0;
    int k;
    struct rbuf r2 = r;
    while ((k = r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == WT_VARINT) {
            size = f.v;
        } else if (f.num == 2 && f.type == WT_LEN) {
            holdings++;
        }
    }
    if (k < 0 || size == 0 || holdings > IDA_BOUNDED_HELD_MAX) {
        return CORRUPT;
    }
    ida__bounded_init(&pool->u.bounded, size);
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_BOUNDED; /* now closeable */
    /* Size the tag index once instead of growing it 20 times. */
    if (ida__tagtab_reserve_n(&pool->u.bounded.tab, holdings) != 0) {
        return IDA_ENOMEM;
    }
    uint64_t last = 0;
    bool first = true;
    while ((k = r_field(&r2, &f)) == 1) {
        if (f.num == 2 && f.type == WT_LEN) {
            int rv = dec_holding(&pool->u.bounded, f.sub, first, &last);
            if (rv != 0) {
                return rv;
            }
            first = false;
        }
    }
    return k < 0 ? CORRUPT : 0;
}

static bool is_window_start(uint64_t s)
{
    if (s < 256) {
        return s % 64 == 0;
    }
    if (s < 65792) {
        return (s - 256) % 1024 == 0;
    }
    return (s - 65792) % 8192 == 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Add one window_reserved value (@v) to @p: 0 or CORRUPT. */
static int put_reserved(struct ida__prefix *p,
                        uint64_t v,
                        bool *any,
                        uint64_t *last)
{
    uint64_t w = ida__prefix_window(p->start);
    if (v < p->start || v - p->start >= w || (*any && v <= *last)) {
        return CORRUPT;
    }
    uint64_t off = v - p->start;
    p->reserved[off / 64] |= UINT64_C(1) << (off % 64);
    *any = true;
    *last = v;
    return 0;
}

static int dec_tagprefix(struct ida__prefix *p,
                         struct rbuf r,
                         const uint8_t **last_tag)
{
    struct field f;
    struct rbuf tag = {NULL, NULL}, pre = {NULL, NULL};
    int k;
    while ((k = r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == WT_LEN) {
            tag = f.sub;
        } else if (f.num == 2 && f.type == WT_LEN) {
            pre = f.sub;
        }
    }
    uint64_t v;
    if (k < 0 || tag.p == NULL || pre.p == NULL ||
        ida__prefix_decode(pre.p, (size_t)(pre.end - pre.p), &v) != 0 ||
        v >= p->start + ida__prefix_window(p->start) ||
        p->n >= IDA_PREFIX_TAGS_MAX) {
        return CORRUPT;
    }
    if (!tag_ok(&tag)) {
        return CORRUPT;
    }
    uint8_t *rec = ida__tagrec_new(&p->slab, (const char *)tag.p,
                                   (size_t)(tag.end - tag.p));
    if (rec == NULL) {
        return IDA_ENOMEM;
    }
    if (*last_tag != NULL &&
        strcmp(ida__tagrec_str(*last_tag), ida__tagrec_str(rec)) >= 0) {
        ida__tagrec_free(&p->slab, rec);
        return CORRUPT; /* tags sorted and unique */
    }
    if (ida__prefix_put(p, rec, v) != 0) {
        ida__tagrec_free(&p->slab, rec);
        return IDA_ENOMEM;
    }
    *last_tag = rec;
    return 0;
}

/* The values of @p are unique (no prefix handed out twice). */
static int check_unique_values(const struct ida__prefix *p)
{
    if (p->n < 2) {
        return 0;
    }
    uint64_t *v = ida_malloc((size_t)p->n * sizeof(*v));
    if (v == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(v, p->values, (size_t)p->n * sizeof(*v));
    qsort(v, p->n, sizeof(*v), cmp_u64);
    int rv = 0;
    for (uint32_t i = 1; i < p->n; i++) {
        if (v[i] == v[i - 1]) {
            rv = CORRUPT;
            break;
        }
    }
    ida_free(v);
    return rv;
}

static int dec_prefix(struct ida__pool *pool, struct rbuf r)
{
    struct ida__prefix *p = &pool->u.prefix;
    ida__prefix_init(p);
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_PREFIX;
    struct field f;
    int k;
    struct rbuf r2 = r;
    uint64_t count = 0;
    while ((k = r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == WT_VARINT) {
            p->start = f.v;
        } else if (f.num == 2 && f.type == WT_VARINT) {
            count = f.v;
        }
    }
    if (k < 0 || !is_window_start(p->start) ||
        p->start > UINT64_MAX - ida__prefix_window(p->start) ||
        count * 2 > ida__prefix_window(p->start)) {
        return CORRUPT;
    }
    bool any = false;
    uint64_t last = 0;
    const uint8_t *last_tag = NULL;
    while ((k = r_field(&r2, &f)) == 1) {
        int rv = 0;
        if (f.num == 3 && f.type == WT_VARINT) {
            rv = put_reserved(p, f.v, &any, &last); /* unpacked form */
        } else if (f.num == 3 && f.type == WT_LEN) {
            uint64_t v;
            while (rv == 0 && f.sub.p != f.sub.end) {
                rv = r_varint(&f.sub, &v) != 0
                         ? CORRUPT
                         : put_reserved(p, v, &any, &last);
            }
        } else if (f.num == 4 && f.type == WT_LEN) {
            rv = dec_tagprefix(p, f.sub, &last_tag);
        }
        if (rv != 0) {
            return rv;
        }
    }
    if (k < 0) {
        return CORRUPT;
    }
    uint64_t bits = 0;
    for (unsigned i = 0; i < IDA__WINDOW_MAX / 64; i++) {
        bits += (uint64_t)__builtin_popcountll(p->reserved[i]);
    }
    if (bits != count) {
        return CORRUPT;
    }
    p->count = count;
    return check_unique_values(p);
}

static int dec_seq(struct ida__pool *pool, struct rbuf r)
{
    struct field f;
    int k;
    uint64_t next = 0;
    while ((k = r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == WT_VARINT) {
            next = f.v;
        }
    }
    if (k < 0 || next == 0) {
        return CORRUPT;
    }
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE;
    pool->u.seq_next = next;
    return 0;
}

static int dec_pool(struct ida_fsm *f, struct rbuf r)
{
    struct field fl;
    struct rbuf name = {NULL, NULL}, sub[6] = {{NULL, NULL}};
    uint64_t kind = 0;
    int k;
    while ((k = r_field(&r, &fl)) == 1) {
        if (fl.num == 1 && fl.type == WT_LEN) {
            name = fl.sub;
        } else if (fl.num == 2 && fl.type == WT_VARINT) {
            kind = fl.v;
        } else if (fl.num >= 3 && fl.num <= 5 && fl.type == WT_LEN) {
            sub[fl.num] = fl.sub;
        }
    }
    size_t nlen = (size_t)(name.end - name.p);
    if (k < 0 || name.p == NULL || nlen > IDA_POOL_NAME_MAX ||
        memchr(name.p, 0, nlen) != NULL ||
        kind < IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE ||
        kind > IDALLOC__POOL_KIND__POOL_KIND_PREFIX) {
        return CORRUPT;
    }
    /* Exactly the sub-message of its kind (field 3 + kind - 1). */
    for (uint32_t i = 3; i <= 5; i++) {
        if ((sub[i].p != NULL) != (i == 3 + kind - 1)) {
            return CORRUPT;
        }
    }
    struct ida__pool *p = ida_calloc(1, sizeof(*p));
    if (p == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(p->name, name.p, nlen);
    int rv = CORRUPT;
    if (!ida_fsm_pool_name_valid(p->name) ||
        (f->pool_count > 0 &&
         strcmp(f->pools[f->pool_count - 1]->name, p->name) >= 0)) {
        goto err_after_pool;
    }
    if (kind == IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE) {
        rv = dec_seq(p, sub[3]);
    } else if (kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED) {
        rv = dec_bounded(p, sub[4]);
    } else {
        rv = dec_prefix(p, sub[5]);
    }
    if (rv != 0) {
        goto err_after_pool;
    }
    if (f->pool_count >= IDA_POOLS_MAX) {
        rv = CORRUPT;
        goto err_after_pool;
    }
    rv = ida__fsm_pool_insert(f, p);
    if (rv != 0) {
        goto err_after_pool;
    }
    return 0;

err_after_pool:
    ida__pool_free(p); /* kind is set only once its state is closeable */
    return rv;
}

/* --- sessions
 * ------------------------------------------------------------------------- */

/* Convert a kept CommandResult back; CORRUPT if it is not one this state
 * machine could have produced. */
static int dec_result(const Idalloc__CommandResult *m, struct ida_fsm_result *r)
{
    memset(r, 0, sizeof(*r));
    int reason = ida__fsm_reason_find((int)m->error, m->error_msg);
    if (reason < 0) {
        return CORRUPT;
    }
    if (m->error != 0) {
        if (m->result_case != IDALLOC__COMMAND_RESULT__RESULT__NOT_SET) {
            return CORRUPT;
        }
        ida__fsm_result_error(r, reason);
        return 0;
    }
    r->error_msg = "";
    switch (m->result_case) {
        case IDALLOC__COMMAND_RESULT__RESULT_POOL_CREATE:
            r->op = IDA_FSM_OP_POOL_CREATE;
            r->flag = m->pool_create->created;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_ALLOC:
            r->op = IDA_FSM_OP_ALLOC;
            r->id = m->alloc->id;
            r->flag = m->alloc->existed;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_FREE:
            r->op = IDA_FSM_OP_FREE;
            r->flag = m->free->freed;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_RESERVE:
            r->op = IDA_FSM_OP_RESERVE;
            r->id = m->reserve->first;
            r->count = m->reserve->count;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC: {
            uint64_t v;
            const ProtobufCBinaryData *b = &m->prefix_alloc->prefix;
            if (ida__prefix_decode(b->data, b->len, &v) != 0) {
                return CORRUPT;
            }
            r->op = IDA_FSM_OP_PREFIX_ALLOC;
            memcpy(r->prefix, b->data, b->len);
            r->prefix_len = (uint8_t)b->len;
            r->flag = m->prefix_alloc->existed;
            return 0;
        }
        default:
            return CORRUPT;
    }
}

static int dec_session_fields(struct ida_fsm *f,
                              const Idalloc__Session *m,
                              const uint8_t *last_id)
{
    if (m->client_id.len != IDA_CLIENT_ID_BYTES ||
        m->n_results > IDA_SESSION_RESULTS_MAX || m->lru_rank == 0 ||
        m->lru_rank > f->session_clock || m->last_active_ms > f->now_ms ||
        f->session_count >= IDA_SESSIONS_MAX ||
        (last_id != NULL &&
         memcmp(last_id, m->client_id.data, IDA_CLIENT_ID_BYTES) >= 0)) {
        return CORRUPT;
    }
    for (size_t i = 0; i < m->n_results; i++) {
        const Idalloc__SessionResult *sr = m->results[i];
        if (sr->result == NULL || sr->request_seq == 0 ||
            sr->request_seq <= m->evicted_below ||
            (i > 0 && sr->request_seq <= m->results[i - 1]->request_seq)) {
            return CORRUPT;
        }
    }
    return 0;
}

static int dec_session(struct ida_fsm *f,
                       struct rbuf r,
                       const uint8_t **last_id)
{
    Idalloc__Session *m =
        idalloc__session__unpack(NULL, (size_t)(r.end - r.p), r.p);
    if (m == NULL) {
        return CORRUPT;
    }
    int rv = dec_session_fields(f, m, *last_id);
    struct ida_fsm_result res[IDA_SESSION_RESULTS_MAX];
    for (size_t i = 0; rv == 0 && i < m->n_results; i++) {
        rv = dec_result(m->results[i]->result, &res[i]);
    }
    if (rv == 0 && ida__session_find(f, m->client_id.data) != NULL) {
        rv = CORRUPT;
    }
    if (rv == 0) {
        struct ida__session *s = ida__session_add(f, m->client_id.data);
        if (s == NULL) {
            rv = IDA_ENOMEM;
        } else {
            s->last_active_ms = m->last_active_ms;
            s->rank = m->lru_rank;
            s->evicted_below = m->evicted_below;
            s->n = (uint32_t)m->n_results;
            for (uint32_t i = 0; i < s->n; i++) {
                s->results[i].seq = m->results[i]->request_seq;
                s->results[i].result = res[i];
            }
            *last_id = s->client_id;
        }
    }
    idalloc__session__free_unpacked(m, NULL);
    return rv;
}

static int cmp_rank(const void *a, const void *b)
{
    const struct ida__session *x = *(struct ida__session *const *)a;
    const struct ida__session *y = *(struct ida__session *const *)b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Rebuild the LRU list in rank order; ranks must be unique and
 * last_active_ms must not decrease along it. */
static int relink_sessions(struct ida_fsm *f)
{
    size_t n = f->session_count;
    struct ida__session **v = ida_malloc((n + 1) * sizeof(*v));
    if (v == NULL) {
        return IDA_ENOMEM;
    }
    size_t i = 0;
    for (struct ida__session *s = f->lru_head; s != NULL; s = s->next) {
        v[i++] = s;
    }
    qsort(v, n, sizeof(*v), cmp_rank);
    int rv = 0;
    for (i = 1; i < n; i++) {
        if (v[i]->rank == v[i - 1]->rank ||
            v[i]->last_active_ms < v[i - 1]->last_active_ms) {
            rv = CORRUPT;
        }
    }
    f->lru_head = f->lru_tail = NULL;
    for (i = 0; i < n; i++) {
        v[i]->prev = v[i]->next = NULL;
        if (f->lru_tail == NULL) {
            f->lru_head = v[i];
        } else {
            f->lru_tail->next = v[i];
            v[i]->prev = f->lru_tail;
        }
        f->lru_tail = v[i];
    }
    ida_free(v);
    return rv;
}

/* --- restore
 * ------------------------------------------------------------------------ */

/* Decode @r into the empty @f. */
static int dec_state(struct ida_fsm *f, struct rbuf r)
{
    struct field fl;
    int k;
    uint64_t version = 0;
    struct rbuf r2 = r;
    /* Pass 1: scalars (sessions are checked against them). */
    while ((k = r_field(&r, &fl)) == 1) {
        if (fl.type != WT_VARINT) {
            continue;
        }
        switch (fl.num) {
            case 1:
                version = fl.v;
                break;
            case 4:
                f->now_ms = fl.v;
                break;
            case 5:
                f->applied_index = fl.v;
                break;
            case 6:
                f->session_clock = fl.v;
                break;
        }
    }
    if (k < 0) {
        return CORRUPT;
    }
    if (version != IDA_FSM_STATE_VERSION) {
        return IDA_EVERSION;
    }
    const uint8_t *last_id = NULL;
    while ((k = r_field(&r2, &fl)) == 1) {
        int rv = 0;
        if (fl.num == 2 && fl.type == WT_LEN) {
            rv = dec_pool(f, fl.sub);
        } else if (fl.num == 3 && fl.type == WT_LEN) {
            rv = dec_session(f, fl.sub, &last_id);
        }
        if (rv != 0) {
            return rv;
        }
    }
    if (k < 0) {
        return CORRUPT;
    }
    return relink_sessions(f);
}

int ida_fsm_restore(struct ida_fsm *f, const uint8_t *data, size_t len)
{
    IDA_ASSERT(f != NULL);
    if (data == NULL && len > 0) {
        return IDA_EINVAL;
    }
    struct ida_fsm *n;
    int rv = ida_fsm_new(&n);
    if (rv != 0) {
        return rv;
    }
    rv = CORRUPT;
    if (len >= CHECKSUM_BYTES && data[len - CHECKSUM_BYTES] == CHECKSUM_KEY) {
        uint64_t sum = 0;
        for (int b = 7; b >= 0; b--) {
            sum = (sum << 8) | data[len - 8 + (size_t)b];
        }
        if (sum == ida__snapshot_checksum(data, len - CHECKSUM_BYTES)) {
            struct rbuf r = {data, data + len - CHECKSUM_BYTES};
            rv = dec_state(n, r);
        }
    }
    if (rv != 0) {
        ida_fsm_free(n);
        return rv;
    }
    /* Swap: @f takes the new state, the old one is released. The tables
     * point back at their owner (ctx), so re-aim the sessions table. */
    struct ida_fsm old = *f;
    *f = *n;
    f->sessions.ctx = f;
    f->replies = old.replies;
    f->replies_cap = old.replies_cap;
    *n = old;
    n->sessions.ctx = n;
    n->replies = NULL;
    n->replies_cap = 0;
    ida_fsm_free(n);
    return 0;
}
