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
#include "fsm/wire.h"
#include "idalloc_errors.h"

/* --- encoders ------------------------------------------------------------- */

struct holding_arg
{
    uint64_t id;
    const uint8_t *rec;
};

static void enc_holding(struct ida__wbuf *w, const void *arg)
{
    const struct holding_arg *h = arg;
    ida__w_u64(w, 1, h->id);
    ida__w_bytes(w, 2, h->rec + 1, ida__tagrec_len(h->rec));
}

static void enc_bounded(struct ida__wbuf *w, const void *arg)
{
    const struct ida__bounded *b = arg;
    ida__w_u64(w, 1, b->size);
    for (uint64_t id = ida__bounded_next_held(b, 0); id != UINT64_MAX;
         id = ida__bounded_next_held(b, id + 1)) {
        struct holding_arg h = {id, ida__bounded_tag(b, id)};
        ida__w_msg(w, 2, enc_holding, &h);
    }
}

static void enc_seq(struct ida__wbuf *w, const void *arg)
{
    ida__w_u64(w, 1, *(const uint64_t *)arg);
}

struct tagprefix_arg
{
    const uint8_t *rec;
    uint64_t value;
};

static void enc_tagprefix(struct ida__wbuf *w, const void *arg)
{
    const struct tagprefix_arg *t = arg;
    uint8_t enc[IDA_PREFIX_BYTES_MAX];
    size_t n = ida__prefix_encode(t->value, enc);
    ida__w_bytes(w, 1, t->rec + 1, ida__tagrec_len(t->rec));
    ida__w_bytes(w, 2, enc, n);
}

static void enc_reserved(struct ida__wbuf *w, const void *arg)
{
    const struct ida__prefix *p = arg;
    for (uint64_t i = 0; i < IDA__WINDOW_MAX; i++) {
        if ((p->reserved[i / 64] >> (i % 64)) & 1) {
            ida__w_varint(w, p->start + i);
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

static void enc_prefix(struct ida__wbuf *w, const void *arg)
{
    const struct prefix_arg *a = arg;
    const struct ida__prefix *p = a->p;
    ida__w_u64(w, 1, p->start);
    ida__w_u64(w, 2, p->count);
    if (p->count > 0) {
        ida__w_msg(w, 3, enc_reserved, p); /* packed repeated uint64 */
    }
    for (uint32_t i = 0; i < p->n; i++) {
        uint32_t ref = a->order[i].ref;
        struct tagprefix_arg t = {p->tags[ref], p->values[ref]};
        ida__w_msg(w, 4, enc_tagprefix, &t);
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
                       ida__enc_fn *fn,
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
    ida__enc_fn fn;
    const void *arg;
    pool_inner(a, &pa, &field, &fn, &arg);
    struct ida__wbuf count = {NULL, 0};
    fn(&count, arg);
    return count.len;
}

static void enc_pool(struct ida__wbuf *w, const void *arg)
{
    const struct pool_arg *a = arg;
    const struct ida__pool *p = a->pool;
    ida__w_bytes(w, 1, p->name, strlen(p->name));
    ida__w_u64(w, 2, (uint64_t)p->kind);
    struct prefix_arg pa;
    uint32_t field;
    ida__enc_fn fn;
    const void *inner;
    pool_inner(a, &pa, &field, &fn, &inner);
    ida__w_msg_sized(w, field, fn, inner, a->inner_size);
}

/* The stored form of a kept answer is a CommandResult (dec_result() in
 * snap_decode.c is the inverse); the node sends the same form to clients. */
void ida_fsm_result_to_pb(const struct ida_fsm_result *r,
                          struct ida_fsm_result_pb *pb)
{
    memset(pb, 0, sizeof(*pb));
    idalloc__command_result__init(&pb->msg);
    pb->msg.error = (uint32_t)r->error;
    pb->msg.error_msg = (char *)(r->error_msg != NULL ? r->error_msg : "");
    if (r->error != 0) {
        return;
    }
    switch (r->op) {
        case IDA_FSM_OP_POOL_CREATE:
            idalloc__pool_create_result__init(&pb->u.pool_create);
            pb->u.pool_create.created = r->flag;
            pb->msg.result_case = IDALLOC__COMMAND_RESULT__RESULT_POOL_CREATE;
            pb->msg.pool_create = &pb->u.pool_create;
            break;
        case IDA_FSM_OP_ALLOC:
            idalloc__alloc_result__init(&pb->u.alloc);
            pb->u.alloc.id = r->id;
            pb->u.alloc.existed = r->flag;
            pb->msg.result_case = IDALLOC__COMMAND_RESULT__RESULT_ALLOC;
            pb->msg.alloc = &pb->u.alloc;
            break;
        case IDA_FSM_OP_FREE:
            idalloc__free_result__init(&pb->u.free);
            pb->u.free.freed = r->flag;
            pb->msg.result_case = IDALLOC__COMMAND_RESULT__RESULT_FREE;
            pb->msg.free = &pb->u.free;
            break;
        case IDA_FSM_OP_RESERVE:
            idalloc__reserve_result__init(&pb->u.reserve);
            pb->u.reserve.first = r->id;
            pb->u.reserve.count = r->count;
            pb->msg.result_case = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
            pb->msg.reserve = &pb->u.reserve;
            break;
        case IDA_FSM_OP_PREFIX_ALLOC:
            idalloc__prefix_result__init(&pb->u.prefix);
            memcpy(pb->prefix, r->prefix, r->prefix_len);
            pb->u.prefix.prefix.data = pb->prefix;
            pb->u.prefix.prefix.len = r->prefix_len;
            pb->u.prefix.existed = r->flag;
            pb->msg.result_case = IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC;
            pb->msg.prefix_alloc = &pb->u.prefix;
            break;
        case IDA_FSM_OP_RESTORE:
            idalloc__restore_result__init(&pb->u.restore);
            pb->u.restore.from_index = r->id;
            pb->u.restore.pools = (uint32_t)r->count;
            pb->msg.result_case = IDALLOC__COMMAND_RESULT__RESULT_RESTORE;
            pb->msg.restore = &pb->u.restore;
            break;
        case IDA_FSM_OP_REGISTER:
            idalloc__register_result__init(&pb->u.reg);
            pb->u.reg.created = r->flag;
            pb->msg.result_case =
                IDALLOC__COMMAND_RESULT__RESULT_REGISTER_CLIENT;
            pb->msg.register_client = &pb->u.reg;
            break;
        default:
            IDA_UNREACHABLE();
    }
}

struct result_arg
{
    uint64_t seq;
    uint64_t fingerprint;
    const struct ida_fsm_result *r;
};

static void enc_result(struct ida__wbuf *w, const void *arg)
{
    const struct result_arg *a = arg;
    struct ida_fsm_result_pb pb;
    ida_fsm_result_to_pb(a->r, &pb);
    ida__w_u64(w, 1, a->seq);
    size_t n = idalloc__command_result__get_packed_size(&pb.msg);
    ida__w_key(w, 2, IDA__WT_LEN);
    ida__w_varint(w, n);
    if (w->p != NULL) {
        size_t got = idalloc__command_result__pack(&pb.msg, w->p + w->len);
        IDA_ASSERT(got == n);
    }
    w->len += n;
    ida__w_fixed64(w, 3, a->fingerprint);
}

static void enc_session(struct ida__wbuf *w, const void *arg)
{
    const struct ida__session *s = arg;
    ida__w_bytes(w, 1, s->client_id, IDA_CLIENT_ID_BYTES);
    ida__w_u64(w, 2, s->last_active_ms);
    /* Kept results are sorted by request_seq in memory already. */
    for (uint32_t i = 0; i < s->n; i++) {
        const struct ida__cached *k = &s->results[i];
        struct result_arg a = {k->seq, k->fingerprint, &k->result};
        ida__w_msg(w, 3, enc_result, &a);
    }
    ida__w_u64(w, 4, s->rank);
    ida__w_u64(w, 5, s->evicted_below);
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

static void enc_state(struct ida__wbuf *w, const void *arg)
{
    const struct state_arg *a = arg;
    const struct ida_fsm *f = a->f;
    ida__w_u64(w, 1, IDA_FSM_STATE_VERSION);
    for (size_t i = 0; i < f->pool_count; i++) {
        struct pool_arg pa = {f->pools[i], a->orders[i], a->inner_sizes[i]};
        ida__w_msg(w, 2, enc_pool, &pa);
    }
    for (size_t i = 0; i < f->session_count; i++) {
        ida__w_msg(w, 3, enc_session, a->sessions[i]);
    }
    ida__w_u64(w, 4, f->now_ms);
    ida__w_u64(w, 5, f->applied_index);
    ida__w_u64(w, 6, f->session_clock);
}

/* A 64-bit hash of @len bytes, the same on every platform (the words are
 * assembled little-endian). Not cryptographic: it catches damage, not
 * malice; the storage layer's crc32c guards the file as well. */
uint64_t ida__snapshot_checksum(const uint8_t *p, size_t len)
{
    size_t words = len / 8;
    uint64_t h = ida__sum_words(ida__sum_begin(len), p, words);
    return ida__sum_end(h, p + 8 * words, len % 8);
}

uint64_t ida__sum_begin(size_t len)
{
    return UINT64_C(0x6a09e667f3bcc909) ^ (uint64_t)len;
}

uint64_t ida__sum_words(uint64_t h, const uint8_t *p, size_t words)
{
    for (size_t i = 0; i < words; i++) {
        uint64_t w = ida__load_le64(p + 8 * i);
        h = (h ^ w) * UINT64_C(0x9e3779b97f4a7c15);
        h ^= h >> 29;
    }
    return h;
}

uint64_t ida__sum_end(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    }
    h ^= h >> 32;
    h *= UINT64_C(0xd6e8feb86659fd93);
    h ^= h >> 32;
    return h;
}

static uint8_t *heap_get(void *ctx, size_t total)
{
    uint8_t **out = ctx;
    *out = ida_malloc(total);
    return *out;
}

int ida_fsm_snapshot(const struct ida_fsm *f, uint8_t **data, size_t *len)
{
    *data = NULL; /* heap_get() sets it; nothing fails after that */
    return ida_fsm_snapshot_to(f, heap_get, data, len);
}

int ida_fsm_snapshot_to(const struct ida_fsm *f,
                        uint8_t *(*get)(void *ctx, size_t total),
                        void *ctx,
                        size_t *len)
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
    struct ida__wbuf w = {NULL, 0};
    enc_state(&w, &a);
    size_t total = w.len + IDA__CHECKSUM_BYTES;
    w.p = get(ctx, total);
    if (w.p == NULL) {
        goto err_after_arrays;
    }
    w.len = 0;
    enc_state(&w, &a);
    uint64_t sum = ida__snapshot_checksum(w.p, w.len);
    w.p[w.len++] = IDA__CHECKSUM_KEY;
    for (int b = 0; b < 8; b++) {
        w.p[w.len++] = (uint8_t)(sum >> (8 * b));
    }
    IDA_ASSERT(w.len == total);
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
