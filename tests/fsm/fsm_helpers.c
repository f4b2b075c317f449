/* Test support for fsm/ (linked into every binary of tests/fsm/). */
#include "tests/fsm/fsm_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/collapse.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"

/* Support code is linked into the benchmark too, which has no Criterion:
 * a failed check prints and aborts (a crash fails the Criterion test). */
#define FX_CHECK(cond)                                                       \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            abort();                                                         \
        }                                                                    \
    } while (0)

void fx_client_id(uint64_t client, uint8_t out[IDA_CLIENT_ID_BYTES])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(client >> (8 * i));
        out[8 + i] = (uint8_t)(0xA0 + i);
    }
}

void fx_batch_init(struct fx_batch *b, uint64_t timestamp_ms)
{
    b->timestamp_ms = timestamp_ms;
    b->version = 0;
    b->n = 0;
}

bool fx_auto_ack = true;

static Idalloc__Command *add(struct fx_batch *b, uint64_t client, uint64_t seq)
{
    FX_CHECK(b->n < FX_BATCH_MAX);
    size_t i = b->n++;
    Idalloc__Command *c = &b->cmd[i];
    idalloc__command__init(c);
    fx_client_id(client, b->cid[i]);
    c->client_id.data = b->cid[i];
    c->client_id.len = IDA_CLIENT_ID_BYTES;
    c->request_seq = seq;
    c->ack_below = fx_auto_ack ? seq : 0;
    b->ptr[i] = c;
    return c;
}

/* A copy of @s as the bytes of a command field (pool names and tags are
 * proto `bytes`). */
static ProtobufCBinaryData keep(char (*dst)[FX_STR_MAX],
                                size_t i,
                                const char *s)
{
    FX_CHECK(strlen(s) < FX_STR_MAX);
    strcpy(dst[i], s);
    return (ProtobufCBinaryData){strlen(s), (uint8_t *)dst[i]};
}

void fx_add_create(struct fx_batch *b,
                   uint64_t client,
                   uint64_t seq,
                   const char *name,
                   Idalloc__PoolKind kind,
                   uint64_t size)
{
    Idalloc__Command *c = add(b, client, seq);
    size_t i = b->n - 1;
    idalloc__pool_create__init(&b->op[i].create);
    b->op[i].create.name = keep(b->pool, i, name);
    b->op[i].create.kind = kind;
    b->op[i].create.size = size;
    c->op_case = IDALLOC__COMMAND__OP_POOL_CREATE;
    c->pool_create = &b->op[i].create;
}

void fx_add_alloc(struct fx_batch *b,
                  uint64_t client,
                  uint64_t seq,
                  const char *pool,
                  const char *tag)
{
    Idalloc__Command *c = add(b, client, seq);
    size_t i = b->n - 1;
    idalloc__alloc__init(&b->op[i].alloc);
    b->op[i].alloc.pool = keep(b->pool, i, pool);
    b->op[i].alloc.tag = keep(b->tag, i, tag);
    c->op_case = IDALLOC__COMMAND__OP_ALLOC;
    c->alloc = &b->op[i].alloc;
}

void fx_add_free(struct fx_batch *b,
                 uint64_t client,
                 uint64_t seq,
                 const char *pool,
                 uint64_t id,
                 const char *tag)
{
    Idalloc__Command *c = add(b, client, seq);
    size_t i = b->n - 1;
    idalloc__free__init(&b->op[i].free);
    b->op[i].free.pool = keep(b->pool, i, pool);
    b->op[i].free.tag = keep(b->tag, i, tag);
    b->op[i].free.id = id;
    c->op_case = IDALLOC__COMMAND__OP_FREE;
    c->free = &b->op[i].free;
}

void fx_add_reserve(struct fx_batch *b,
                    uint64_t client,
                    uint64_t seq,
                    const char *pool,
                    uint64_t count)
{
    Idalloc__Command *c = add(b, client, seq);
    size_t i = b->n - 1;
    idalloc__reserve__init(&b->op[i].reserve);
    b->op[i].reserve.pool = keep(b->pool, i, pool);
    b->op[i].reserve.count = count;
    c->op_case = IDALLOC__COMMAND__OP_RESERVE;
    c->reserve = &b->op[i].reserve;
}

void fx_add_prefix(struct fx_batch *b,
                   uint64_t client,
                   uint64_t seq,
                   const char *pool,
                   const char *tag)
{
    Idalloc__Command *c = add(b, client, seq);
    size_t i = b->n - 1;
    idalloc__prefix_alloc__init(&b->op[i].prefix);
    b->op[i].prefix.pool = keep(b->pool, i, pool);
    b->op[i].prefix.tag = keep(b->tag, i, tag);
    c->op_case = IDALLOC__COMMAND__OP_PREFIX_ALLOC;
    c->prefix_alloc = &b->op[i].prefix;
}

uint8_t *fx_batch_pack(const struct fx_batch *b, size_t *len)
{
    Idalloc__CommandBatch m;
    idalloc__command_batch__init(&m);
    m.version = b->version != 0 ? b->version : IDA_BATCH_VERSION;
    m.timestamp_ms = b->timestamp_ms;
    m.n_commands = b->n;
    m.commands = (Idalloc__Command **)b->ptr;
    *len = idalloc__command_batch__get_packed_size(&m);
    uint8_t *buf = malloc(*len + 1);
    FX_CHECK(buf != NULL);
    FX_CHECK(idalloc__command_batch__pack(&m, buf) == *len);
    return buf;
}

void fx_apply(struct ida_fsm *f,
              const struct fx_batch *b,
              struct ida_fsm_applied *out)
{
    size_t len;
    uint8_t *buf = fx_batch_pack(b, &len);
    ida_index next = ida_fsm_applied_index(f) + 1;
    int rv = ida_fsm_apply(f, next, IDA_ENTRY_NORMAL, buf, len, out);
    free(buf);
    FX_CHECK(rv == 0);
    FX_CHECK(out->entry_error == 0);
    FX_CHECK(out->count == b->n);
    FX_CHECK(ida_fsm_applied_index(f) == next);
}

void fx_add_register(struct fx_batch *b, uint64_t client, uint64_t seq)
{
    Idalloc__Command *c = add(b, client, seq);
    size_t i = b->n - 1;
    idalloc__register_client__init(&b->op[i].reg);
    c->op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
    c->register_client = &b->op[i].reg;
}

uint64_t fx_fingerprint(const struct fx_batch *b, size_t i)
{
    FX_CHECK(i < b->n);
    return ida__fsm_fingerprint(&b->cmd[i]);
}

void fx_register(struct ida_fsm *f, uint64_t client, uint64_t timestamp_ms)
{
    static struct fx_batch b;
    fx_batch_init(&b, timestamp_ms);
    fx_add_register(&b, client, 1);
    struct ida_fsm_result r = fx_one(f, &b);
    FX_CHECK(r.error == 0 && r.op == IDA_FSM_OP_REGISTER);
}

struct ida_fsm_result fx_one(struct ida_fsm *f, const struct fx_batch *b)
{
    struct ida_fsm_applied out;
    FX_CHECK(b->n == 1);
    fx_apply(f, b, &out);
    return out.replies[0].result;
}

uint8_t *fx_snapshot(const struct ida_fsm *f, size_t *len)
{
    uint8_t *data = NULL;
    FX_CHECK(ida_fsm_snapshot(f, &data, len) == 0);
    FX_CHECK(data != NULL);
    return data;
}

uint8_t *fx_forge(const Idalloc__FsmState *m, size_t *len)
{
    Idalloc__FsmState c = *m;
    c.checksum = 0; /* proto3: a zero fixed64 is not written */
    size_t n = idalloc__fsm_state__get_packed_size(&c);
    uint8_t *buf = malloc(n + 9);
    FX_CHECK(buf != NULL);
    FX_CHECK(idalloc__fsm_state__pack(&c, buf) == n);
    uint64_t sum = ida__snapshot_checksum(buf, n);
    buf[n] = (7 << 3) | 1;
    for (int i = 0; i < 8; i++) {
        buf[n + 1 + (size_t)i] = (uint8_t)(sum >> (8 * i));
    }
    *len = n + 9;
    return buf;
}

bool fx_result_eq(const struct ida_fsm_result *a,
                  const struct ida_fsm_result *b)
{
    return a->error == b->error && strcmp(a->error_msg, b->error_msg) == 0 &&
           a->op == b->op && a->flag == b->flag &&
           a->prefix_len == b->prefix_len &&
           memcmp(a->prefix, b->prefix, a->prefix_len) == 0 && a->id == b->id &&
           a->count == b->count;
}

void fx_print_collapser(const char *tail)
{
    struct ida_collapse_stats cs = ida_collapse_stats();
    printf(
        "collapser: %llu blocks given, %llu sweeps, %llu MiB collapsed, "
        "%llu MiB huge already, %llu MiB left alone, %llu MiB waiting%s\n",
        (unsigned long long)cs.queued, (unsigned long long)cs.sweeps,
        (unsigned long long)cs.collapsed * 2,
        (unsigned long long)cs.already * 2, (unsigned long long)cs.skipped * 2,
        (unsigned long long)cs.waiting * 2, tail);
}
