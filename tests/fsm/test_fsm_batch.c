/* fsm/batch.c: the hand reader of log entries against protobuf-c.
 *
 * Batches as leaders write them (every op, every field, values of every
 * width) must be claimed by the hand reader and decode to what protobuf-c
 * builds. Mutated batches (bytes flipped, cut, inserted, ranges repeated)
 * are either not claimed (protobuf-c then decides) or decode to exactly
 * what protobuf-c builds from them, which must accept them. The fuzz
 * harness tests/fuzz/fuzz_batch.c checks the same on its own inputs. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"
#include "tests/lib/batch_eq.h"

static struct ida_fsm *f;

static void setup(void)
{
    cr_assert_eq(ida_fsm_new(&f), 0);
}

static void teardown(void)
{
    ida_fsm_free(f);
}

TestSuite(batch, .init = setup, .fini = teardown);

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A value of a random width: 0, small, one of each varint length. */
static uint64_t rnd_value(void)
{
    switch (rnd() % 4) {
        case 0:
            return 0;
        case 1:
            return rnd() % 200;
        default:
            return rnd() >> (rnd() % 64);
    }
}

#define MAXC 40
#define BUFB 300

/* Storage for one generated batch. */
struct gen
{
    Idalloc__CommandBatch b;
    Idalloc__Command cmd[MAXC], *ptr[MAXC];
    Idalloc__Alloc al[MAXC];
    Idalloc__Free fr[MAXC];
    Idalloc__Reserve rs[MAXC];
    Idalloc__PrefixAlloc pa[MAXC];
    Idalloc__RegisterClient rc[MAXC];
    Idalloc__PoolCreate pc[MAXC];
    uint8_t bytes[MAXC][3][BUFB];
};

/* Random bytes of a random length (0, short, or over 127: a two-byte
 * length prefix). */
static ProtobufCBinaryData rnd_bytes(uint8_t *buf)
{
    size_t n = rnd() % 3 == 0   ? 0
               : rnd() % 4 == 0 ? 128 + rnd() % 170
                                : 1 + rnd() % 20;
    for (size_t i = 0; i < n; i++) {
        buf[i] = (uint8_t)rnd();
    }
    return (ProtobufCBinaryData){n, n > 0 ? buf : NULL};
}

/* @with_rare: pool creations too (not the hand reader's). */
static void gen_batch(struct gen *g, bool with_rare)
{
    idalloc__command_batch__init(&g->b);
    g->b.version = (uint32_t)(rnd() % 3 == 0 ? rnd() : rnd() % 4);
    g->b.timestamp_ms = rnd_value();
    size_t n = rnd() % 5 == 0 ? 0 : 1 + rnd() % MAXC;
    for (size_t i = 0; i < n; i++) {
        Idalloc__Command *c = &g->cmd[i];
        idalloc__command__init(c);
        c->client_id = rnd() % 8 == 0
                           ? rnd_bytes(g->bytes[i][0])
                           : (ProtobufCBinaryData){16, g->bytes[i][0]};
        for (int k = 0; k < 16; k++) {
            g->bytes[i][0][k] = (uint8_t)rnd();
        }
        c->request_seq = rnd_value();
        c->ack_below = rnd_value();
        switch (rnd() % (with_rare ? 8 : 7)) {
            case 0:
                break; /* no op */
            case 1:
            case 2:
                idalloc__alloc__init(&g->al[i]);
                g->al[i].pool = rnd_bytes(g->bytes[i][1]);
                g->al[i].tag = rnd_bytes(g->bytes[i][2]);
                c->op_case = IDALLOC__COMMAND__OP_ALLOC;
                c->alloc = &g->al[i];
                break;
            case 3:
                idalloc__free__init(&g->fr[i]);
                g->fr[i].pool = rnd_bytes(g->bytes[i][1]);
                g->fr[i].id = rnd_value();
                g->fr[i].tag = rnd_bytes(g->bytes[i][2]);
                c->op_case = IDALLOC__COMMAND__OP_FREE;
                c->free = &g->fr[i];
                break;
            case 4:
                idalloc__reserve__init(&g->rs[i]);
                g->rs[i].pool = rnd_bytes(g->bytes[i][1]);
                g->rs[i].count = rnd_value();
                c->op_case = IDALLOC__COMMAND__OP_RESERVE;
                c->reserve = &g->rs[i];
                break;
            case 5:
                idalloc__prefix_alloc__init(&g->pa[i]);
                g->pa[i].pool = rnd_bytes(g->bytes[i][1]);
                g->pa[i].tag = rnd_bytes(g->bytes[i][2]);
                c->op_case = IDALLOC__COMMAND__OP_PREFIX_ALLOC;
                c->prefix_alloc = &g->pa[i];
                break;
            case 6:
                idalloc__register_client__init(&g->rc[i]);
                c->op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
                c->register_client = &g->rc[i];
                break;
            default:
                idalloc__pool_create__init(&g->pc[i]);
                g->pc[i].name = rnd_bytes(g->bytes[i][1]);
                g->pc[i].kind = (Idalloc__PoolKind)(rnd() % 4);
                g->pc[i].size = rnd_value();
                c->op_case = IDALLOC__COMMAND__OP_POOL_CREATE;
                c->pool_create = &g->pc[i];
                break;
        }
        g->ptr[i] = c;
    }
    g->b.n_commands = n;
    g->b.commands = n > 0 ? g->ptr : NULL;
}

static uint8_t *pack(const Idalloc__CommandBatch *b, size_t *len)
{
    *len = idalloc__command_batch__get_packed_size(b);
    uint8_t *buf = malloc(*len + 1);
    cr_assert_not_null(buf);
    idalloc__command_batch__pack(b, buf);
    return buf;
}

/* Decode @data both ways: 1 if the hand reader claimed it (and then it is
 * what protobuf-c built), 0 if not. Either way ida__batch_unpack() gives
 * what protobuf-c gives. */
static int compare(const uint8_t *data, size_t len)
{
    Idalloc__CommandBatch *pb = idalloc__command_batch__unpack(NULL, len, data);
    Idalloc__CommandBatch *mine = NULL;
    ida__arena_reset(&f->arena);
    int rv = ida__batch_decode_simple(&f->arena, data, len, &mine);
    cr_assert(rv == 0 || rv == 1, "rv %d", rv);
    if (rv == 0) {
        cr_assert_not_null(pb, "claimed %zu bytes protobuf-c refuses", len);
        cr_assert(be_batch(mine, pb), "claimed %zu bytes, decoded otherwise",
                  len);
    }
    ida__arena_reset(&f->arena);
    Idalloc__CommandBatch *u = ida__batch_unpack(&f->arena, data, len);
    cr_assert_eq(u == NULL, pb == NULL);
    if (u != NULL && rv == 0) {
        cr_assert(be_batch(u, pb));
    }
    if (pb != NULL) {
        idalloc__command_batch__free_unpacked(pb, NULL);
    }
    return rv == 0;
}

Test(batch, leader_batches_take_the_hand_reader)
{
    static struct gen g;
    for (int round = 0; round < 2000; round++) {
        gen_batch(&g, false);
        size_t len;
        uint8_t *buf = pack(&g.b, &len);
        cr_assert_eq(compare(buf, len), 1, "round %d not claimed", round);
        free(buf);
    }
}

Test(batch, pool_creation_goes_to_protobuf_c)
{
    static struct gen g;
    int claimed = 0, rounds = 0;
    for (int round = 0; round < 2000; round++) {
        gen_batch(&g, true);
        bool rare = false;
        for (size_t i = 0; i < g.b.n_commands; i++) {
            rare |= g.cmd[i].op_case == IDALLOC__COMMAND__OP_POOL_CREATE;
        }
        size_t len;
        uint8_t *buf = pack(&g.b, &len);
        int c = compare(buf, len);
        if (rare) {
            cr_assert_eq(c, 0, "a pool creation claimed");
            rounds++;
        }
        claimed += c;
        free(buf);
    }
    cr_assert_gt(rounds, 100);
    cr_assert_gt(claimed, 100);
}

/* One mutation of @buf (capacity @cap) in place; the new length. */
static size_t mutate(uint8_t *buf, size_t len, size_t cap)
{
    size_t at = len > 0 ? rnd() % len : 0;
    switch (rnd() % 6) {
        case 0: /* flip bits */
            if (len > 0) {
                buf[at] ^= (uint8_t)(1u << (rnd() % 8));
            }
            return len;
        case 1: /* a random byte */
            if (len > 0) {
                buf[at] = (uint8_t)rnd();
            }
            return len;
        case 2: /* cut */
            return at;
        case 3: /* insert a byte */
            if (len + 1 <= cap) {
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = (uint8_t)rnd();
                return len + 1;
            }
            return len;
        case 4: { /* repeat a range (fields twice) */
            size_t n = len - at < 40 ? len - at : 40;
            if (len + n <= cap) {
                memmove(buf + at + n, buf + at, len - at);
                return len + n;
            }
            return len;
        }
        default: /* delete a byte */
            if (len > 0) {
                memmove(buf + at, buf + at + 1, len - at - 1);
                return len - 1;
            }
            return len;
    }
}

Test(batch, mutated_batches_decode_as_protobuf_c_does)
{
    static struct gen g;
    int claimed = 0, refused = 0, total = 0;
    for (int round = 0; round < 3000; round++) {
        gen_batch(&g, rnd() % 4 == 0);
        size_t len;
        uint8_t *orig = pack(&g.b, &len);
        size_t cap = len + 256;
        uint8_t *buf = malloc(cap);
        cr_assert_not_null(buf);
        for (int m = 0; m < 8; m++) {
            memcpy(buf, orig, len);
            size_t n = len;
            for (int k = 0, times = 1 + (int)(rnd() % 3); k < times; k++) {
                n = mutate(buf, n, cap);
            }
            Idalloc__CommandBatch *pb =
                idalloc__command_batch__unpack(NULL, n, buf);
            refused += pb == NULL;
            if (pb != NULL) {
                idalloc__command_batch__free_unpacked(pb, NULL);
            }
            claimed += compare(buf, n);
            total++;
        }
        free(buf);
        free(orig);
    }
    /* Both sides are exercised: claimed mutants, and mutants protobuf-c
     * refuses (none of which may be claimed: compare() checks). */
    cr_assert_gt(claimed, total / 10, "%d of %d", claimed, total);
    cr_assert_gt(refused, total / 10, "%d of %d", refused, total);
}

/* Two encoded commands concatenated are one command to protobuf-c, the
 * two merged (scalars: the last wins; the same op: the two merged; two ops:
 * the last). The hand reader must leave every such overlap to protobuf-c,
 * and decode the rest as it does. */
Test(batch, merged_commands_decode_as_protobuf_c_does)
{
    static struct gen g;
    int claimed = 0, total = 0;
    for (int round = 0; round < 3000; round++) {
        do {
            gen_batch(&g, rnd() % 4 == 0);
        } while (g.b.n_commands < 2);
        /* Mostly the second brings only an op, the first sometimes none:
         * overlaps of one kind at a time. */
        if (rnd() % 4 != 0) {
            g.cmd[1].client_id = (ProtobufCBinaryData){0, NULL};
            g.cmd[1].request_seq = g.cmd[1].ack_below = 0;
        }
        if (rnd() % 3 == 0) {
            g.cmd[0].op_case = IDALLOC__COMMAND__OP__NOT_SET;
        }
        size_t la = idalloc__command__get_packed_size(g.ptr[0]);
        size_t lb = idalloc__command__get_packed_size(g.ptr[1]);
        if (la + lb > 127) {
            continue; /* one-byte length prefix below */
        }
        uint8_t buf[2 + 254];
        buf[0] = 0x1a; /* field 3, LEN */
        buf[1] = (uint8_t)(la + lb);
        idalloc__command__pack(g.ptr[0], buf + 2);
        idalloc__command__pack(g.ptr[1], buf + 2 + la);
        claimed += compare(buf, 2 + la + lb);
        total++;
    }
    cr_assert_gt(total, 500);
    cr_assert_gt(claimed, total / 10, "%d of %d", claimed, total);
}

/* Hand-made inputs at the edges of what is claimed. */
Test(batch, edges)
{
    static const struct
    {
        const char *what;
        uint8_t bytes[24];
        size_t len;
        int claimed;
    } cases[] = {
        {"empty batch", {0}, 0, 1},
        {"version, 5 bytes, max", {0x08, 0xff, 0xff, 0xff, 0xff, 0x0f}, 6, 1},
        {"version over 32 bits", {0x08, 0xff, 0xff, 0xff, 0xff, 0x1f}, 6, 0},
        {"version, 6 bytes", {0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00}, 7, 0},
        {"timestamp, 10 bytes",
         {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
         11,
         1},
        {"timestamp beyond 64 bits",
         {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
         11,
         0},
        {"version twice", {0x08, 0x01, 0x08, 0x02}, 4, 0},
        {"unknown field", {0x20, 0x01}, 2, 0},
        {"command cut", {0x1a, 0x05, 0x10, 0x01}, 4, 0},
        {"empty command", {0x1a, 0x00}, 2, 1},
        {"register client (two-byte key)",
         {0x1a, 0x03, 0xaa, 0x01, 0x00},
         5,
         1},
        {"register client with a field",
         {0x1a, 0x05, 0xaa, 0x01, 0x02, 0x08, 0x01},
         7,
         0},
        {"prefix alloc (two-byte key)",
         {0x1a, 0x08, 0x82, 0x01, 0x05, 0x0a, 0x01, 'p', 0x12, 0x00},
         10,
         1},
        {"two ops", {0x1a, 0x06, 0x5a, 0x00, 0x62, 0x00}, 6, 0},
        {"alloc twice", {0x1a, 0x04, 0x5a, 0x00, 0x5a, 0x00}, 6, 0},
        {"request_seq as bytes", {0x1a, 0x02, 0x12, 0x00}, 4, 0},
        {"pool create", {0x1a, 0x02, 0x52, 0x00}, 4, 0},
        {"length of 5 bytes", {0x1a, 0x80, 0x80, 0x80, 0x80, 0x00}, 6, 0},
        {"key of two bytes for field 1", {0x1a, 0x03, 0x8a, 0x00, 0x00}, 5, 1},
        {"length of two bytes for 0", {0x1a, 0x03, 0x0a, 0x80, 0x00}, 5, 1},
        {"field 0", {0x1a, 0x02, 0x02, 0x00}, 4, 0},
    };
    cr_assert_eq(compare(NULL, 0), 1, "no bytes at all: an empty batch");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_eq(compare(cases[i].bytes, cases[i].len), cases[i].claimed,
                     "%s", cases[i].what);
    }
}

/* Out of memory in the hand reader is -IDA_ENOMEM with arena_failed set
 * (never a refusal of the entry); once memory is there it decodes. */
Test(batch, out_of_memory_is_not_a_malformed_entry)
{
    static struct gen g;
    do {
        gen_batch(&g, false);
    } while (g.b.n_commands < 20);
    /* Big enough for several arena blocks. */
    for (size_t i = 0; i < g.b.n_commands; i++) {
        g.cmd[i].op_case = IDALLOC__COMMAND__OP_ALLOC;
        g.cmd[i].alloc = &g.al[i];
        idalloc__alloc__init(&g.al[i]);
        g.al[i].tag = (ProtobufCBinaryData){BUFB, g.bytes[i][2]};
    }
    size_t len;
    uint8_t *buf = pack(&g.b, &len);
    int n;
    for (n = 0;; n++) {
        struct ida_fsm *h;
        cr_assert_eq(ida_fsm_new(&h), 0);
        Idalloc__CommandBatch *out = NULL;
        ida_heap_fault_set(n, 1);
        int rv = ida__batch_decode_simple(&h->arena, buf, len, &out);
        ida_heap_fault_set(0, 0);
        if (rv == 0) {
            ida_fsm_free(h);
            break;
        }
        cr_assert_eq(rv, -IDA_ENOMEM, "allocation %d: %d", n, rv);
        cr_assert(h->arena.failed);
        ida_fsm_free(h);
    }
    cr_assert_gt(n, 0);
    free(buf);
}
