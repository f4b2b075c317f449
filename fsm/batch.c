/* Decoding a log entry's CommandBatch: a hand-written reader for the
 * batches leaders write, protobuf-c for everything else.
 *
 * Every entry is decoded by every replica when it is applied, and again by
 * a restarted node replaying its log and a new node catching up: at 10 M
 * allocations a restart replays up to ~2 M commands. protobuf-c's generic
 * unpack (descriptor lookups, two passes, one allocation per field) was
 * ~37% of applying a bounded alloc (bench_fsm).
 *
 * The contract is that of idalloc__command_batch__unpack() with the fsm's
 * arena as allocator, exactly: the same bytes give the same batch, or the
 * same refusal (replicas of different versions must not part on a
 * malformed entry). The reader keeps that by claiming only the simple case
 * and handing every other input, untouched, to protobuf-c:
 *
 * - keys of the fields we know, one or two bytes, with their own wire
 *   type; each non-repeated field at most once and at most one
 *   op per command (protobuf-c's "last one wins" and message merging are
 *   never needed);
 * - ops alloc, free, reserve, prefix_alloc and register_client (pool
 *   creation and restore are rare and go to protobuf-c);
 * - varints of at most 10 bytes whose value fits (uint32 fields: at most 5
 *   bytes and <= UINT32_MAX), lengths of at most 4 bytes that fit in what
 *   is left.
 *
 * Anything else (unknown fields, a duplicate, a truncated field) is not
 * judged here: protobuf-c decides. What the reader builds is what
 * protobuf-c builds: each message initialized by its INIT, an empty bytes
 * field is {0, NULL}, a non-empty one a copy in the arena, an empty
 * repeated field {0, NULL}. tests/fsm/test_fsm_batch.c and the fuzz
 * harness tests/fuzz/fuzz_batch.c compare the two on mutated batches. */
#include <string.h>

#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

/* Not the simple case: protobuf-c decides. */
#define NOT_SIMPLE 1

struct rd
{
    const uint8_t *p, *end;
};

/* A varint of at most 10 bytes whose value fits in 64 bits. */
static int rd_varint(struct rd *r, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (r->p == r->end) {
            return NOT_SIMPLE;
        }
        uint8_t b = *r->p++;
        if (i == 9 && b > 1) {
            return NOT_SIMPLE;
        }
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *v = x;
            return 0;
        }
    }
    return NOT_SIMPLE;
}

/* A uint32 field: at most 5 bytes, the value within 32 bits. */
static int rd_u32(struct rd *r, uint32_t *v)
{
    const uint8_t *start = r->p;
    uint64_t x;
    if (rd_varint(r, &x) != 0 || r->p - start > 5 || x > UINT32_MAX) {
        return NOT_SIMPLE;
    }
    *v = (uint32_t)x;
    return 0;
}

/* A length prefix (at most 4 bytes) and the bytes it covers. */
static int rd_len(struct rd *r, struct rd *sub)
{
    uint64_t n = 0;
    for (unsigned i = 0;; i++) {
        if (i == 4 || r->p == r->end) {
            return NOT_SIMPLE;
        }
        uint8_t b = *r->p++;
        n |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80) {
            break;
        }
    }
    if (n > (uint64_t)(r->end - r->p)) {
        return NOT_SIMPLE;
    }
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 0;
}

/* Copy of @s in the arena as protobuf-c makes it: -IDA_ENOMEM or 0. */
static int bytes_of(struct ida__arena *ar,
                    const struct rd *s,
                    ProtobufCBinaryData *out)
{
    size_t n = (size_t)(s->end - s->p);
    out->len = n;
    out->data = NULL;
    if (n > 0) {
        out->data = ida__arena_alloc(ar, n);
        if (out->data == NULL) {
            return -IDA_ENOMEM;
        }
        memcpy(out->data, s->p, n);
    }
    return 0;
}

/* Field keys (number << 3 | wire type) of one byte. */
#define KEY(num, wt) (uint8_t)(((num) << 3) | (wt))
enum { VARINT = 0, LEN = 2 };

/* An op's message: fields 1..3 of bytes or varints, each at most once. In
 * @kinds, the wire type of field i at kinds[i - 1], -1 for none; out_b and
 * out_v hold each field's destination (NULL where that kind is not). */
struct op_shape
{
    int kinds[3];
    ProtobufCBinaryData *out_b[3];
    uint64_t *out_v[3];
};

static int rd_op(struct ida__arena *ar, struct rd *r, const struct op_shape *sh)
{
    unsigned seen = 0;
    while (r->p != r->end) {
        uint8_t key = *r->p++;
        unsigned num = key >> 3;
        if (key >= 0x80 || num < 1 || num > 3 ||
            sh->kinds[num - 1] != (key & 7) || (seen & (1u << num))) {
            return NOT_SIMPLE;
        }
        seen |= 1u << num;
        int rv;
        if ((key & 7) == LEN) {
            struct rd s;
            rv = rd_len(r, &s);
            if (rv == 0) {
                rv = bytes_of(ar, &s, sh->out_b[num - 1]);
            }
        } else {
            rv = rd_varint(r, sh->out_v[num - 1]);
        }
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

/* The op message @s of field @num into @c. */
static int op_of(struct ida__arena *ar,
                 unsigned num,
                 struct rd *s,
                 Idalloc__Command *c)
{
    struct op_shape sh = {{-1, -1, -1}, {NULL, NULL, NULL}, {NULL, NULL, NULL}};
    switch (num) {
        case 11: {
            Idalloc__Alloc *a = ida__arena_alloc(ar, sizeof(*a));
            if (a == NULL) {
                return -IDA_ENOMEM;
            }
            idalloc__alloc__init(a);
            sh = (struct op_shape){
                {LEN, LEN, -1}, {&a->pool, &a->tag, NULL}, {NULL, NULL, NULL}};
            c->op_case = IDALLOC__COMMAND__OP_ALLOC;
            c->alloc = a;
            break;
        }
        case 12: {
            Idalloc__Free *fr = ida__arena_alloc(ar, sizeof(*fr));
            if (fr == NULL) {
                return -IDA_ENOMEM;
            }
            idalloc__free__init(fr);
            sh = (struct op_shape){{LEN, VARINT, LEN},
                                   {&fr->pool, NULL, &fr->tag},
                                   {NULL, &fr->id, NULL}};
            c->op_case = IDALLOC__COMMAND__OP_FREE;
            c->free = fr;
            break;
        }
        case 15: {
            Idalloc__Reserve *rs = ida__arena_alloc(ar, sizeof(*rs));
            if (rs == NULL) {
                return -IDA_ENOMEM;
            }
            idalloc__reserve__init(rs);
            sh = (struct op_shape){{LEN, VARINT, -1},
                                   {&rs->pool, NULL, NULL},
                                   {NULL, &rs->count, NULL}};
            c->op_case = IDALLOC__COMMAND__OP_RESERVE;
            c->reserve = rs;
            break;
        }
        case 16: {
            Idalloc__PrefixAlloc *pa = ida__arena_alloc(ar, sizeof(*pa));
            if (pa == NULL) {
                return -IDA_ENOMEM;
            }
            idalloc__prefix_alloc__init(pa);
            sh = (struct op_shape){{LEN, LEN, -1},
                                   {&pa->pool, &pa->tag, NULL},
                                   {NULL, NULL, NULL}};
            c->op_case = IDALLOC__COMMAND__OP_PREFIX_ALLOC;
            c->prefix_alloc = pa;
            break;
        }
        default: { /* 21: RegisterClient has no fields */
            Idalloc__RegisterClient *rc = ida__arena_alloc(ar, sizeof(*rc));
            if (rc == NULL) {
                return -IDA_ENOMEM;
            }
            idalloc__register_client__init(rc);
            c->op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
            c->register_client = rc;
            break;
        }
    }
    return rd_op(ar, s, &sh);
}

/* A key of one byte, or two (fields 16..2047): 0 or NOT_SIMPLE. */
static int rd_key(struct rd *r, unsigned *num, unsigned *wt)
{
    if (r->p == r->end) {
        return NOT_SIMPLE;
    }
    unsigned k = *r->p++;
    if (k >= 0x80) {
        if (r->p == r->end || *r->p >= 0x80) {
            return NOT_SIMPLE;
        }
        k = (k & 0x7f) | (unsigned)*r->p++ << 7;
    }
    *num = k >> 3;
    *wt = k & 7;
    return 0;
}

static int rd_command(struct ida__arena *ar, struct rd *r, Idalloc__Command *c)
{
    unsigned seen = 0; /* bit 1..3: fields 1..3; bit 4: an op */
    idalloc__command__init(c);
    while (r->p != r->end) {
        unsigned num, wt, bit;
        struct rd s;
        if (rd_key(r, &num, &wt) != 0) {
            return NOT_SIMPLE;
        }
        if (num >= 1 && num <= 3 && wt == (num == 1 ? LEN : VARINT)) {
            bit = num;
        } else if (wt == LEN && (num == 11 || num == 12 || num == 15 ||
                                 num == 16 || num == 21)) {
            bit = 4;
        } else {
            return NOT_SIMPLE;
        }
        /* A field twice is protobuf-c's to judge, before anything of the
         * second is read (or allocated). */
        if (seen & (1u << bit)) {
            return NOT_SIMPLE;
        }
        seen |= 1u << bit;
        int rv;
        switch (bit) {
            case 1:
                rv = rd_len(r, &s);
                if (rv == 0) {
                    rv = bytes_of(ar, &s, &c->client_id);
                }
                break;
            case 2:
                rv = rd_varint(r, &c->request_seq);
                break;
            case 3:
                rv = rd_varint(r, &c->ack_below);
                break;
            default:
                rv = rd_len(r, &s);
                if (rv == 0) {
                    rv = op_of(ar, num, &s, c);
                }
                break;
        }
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

int ida__batch_decode_simple(struct ida__arena *ar,
                             const uint8_t *data,
                             size_t len,
                             Idalloc__CommandBatch **out)
{
    if (len == 0) { /* (data may be NULL) */
        data = (const uint8_t *)"";
    }
    /* Pass 1: the batch's own fields, and how many commands. */
    struct rd r = {data, data + len};
    unsigned seen = 0;
    size_t n = 0;
    uint32_t version = 0;
    uint64_t ts = 0;
    while (r.p != r.end) {
        uint8_t key = *r.p++;
        struct rd s;
        int rv;
        if (key == KEY(3, LEN)) {
            rv = rd_len(&r, &s);
            n++;
        } else if (key == KEY(1, VARINT) && !(seen & 2)) {
            seen |= 2;
            rv = rd_u32(&r, &version);
        } else if (key == KEY(2, VARINT) && !(seen & 4)) {
            seen |= 4;
            rv = rd_varint(&r, &ts);
        } else {
            return NOT_SIMPLE;
        }
        if (rv != 0) {
            return rv;
        }
    }
    Idalloc__CommandBatch *b = ida__arena_alloc(ar, sizeof(*b));
    Idalloc__Command **ptrs = NULL, *cmds = NULL;
    if (n > 0) {
        ptrs = ida__arena_alloc(ar, n * sizeof(*ptrs));
        cmds = ida__arena_alloc(ar, n * sizeof(*cmds));
    }
    if (b == NULL || (n > 0 && (ptrs == NULL || cmds == NULL))) {
        return -IDA_ENOMEM;
    }
    idalloc__command_batch__init(b);
    b->version = version;
    b->timestamp_ms = ts;
    b->n_commands = n;
    b->commands = ptrs;
    /* Pass 2: the commands (their framing was checked by pass 1). */
    r.p = data;
    size_t i = 0;
    while (r.p != r.end) {
        uint8_t key = *r.p++;
        struct rd s;
        if (key != KEY(3, LEN)) {
            uint64_t skip;
            (void)rd_varint(&r, &skip);
            continue;
        }
        (void)rd_len(&r, &s);
        ptrs[i] = &cmds[i];
        int rv = rd_command(ar, &s, &cmds[i]);
        if (rv != 0) {
            return rv;
        }
        i++;
    }
    *out = b;
    return 0;
}

Idalloc__CommandBatch *ida__batch_unpack(struct ida__arena *ar,
                                         const uint8_t *data,
                                         size_t len)
{
    Idalloc__CommandBatch *b = NULL;
    int rv = ida__batch_decode_simple(ar, data, len, &b);
    if (rv == 0) {
        return b;
    }
    if (rv < 0) {
        return NULL; /* ar->failed says why */
    }
    ProtobufCAllocator alloc = {ida__arena_alloc, ida__arena_free, ar};
    return idalloc__command_batch__unpack(&alloc, len, data);
}
