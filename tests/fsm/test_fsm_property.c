/* fsm/ property tests: long random command sequences over every pool kind
 * against a plain reference model (bitmaps and arrays), with retries (exact
 * and with other arguments), acknowledgement floors that rise at random,
 * commands of unregistered clients, malformed commands, and
 * snapshot/restore at random points. The session model: every answer at or
 * above a client's floor is kept and returned to an exact retry; a retry
 * with other arguments gets IDA_EREUSED; one below the floor IDA_ESESSION;
 * nothing is executed twice. Four seeds of
 * 260,000 commands: 1,040,000 commands in all. The failing test's name is
 * its seed (plus IDA_FSM_PROPERTY_SEED when set). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "tests/fsm/fsm_helpers.h"

/* --- the reference model ---------------------------------------------------
 */

#define CLIENTS  40
#define NBOUNDED 6
#define NSEQ     2
#define NPREFIX  2
#define TAGS_BIG 10000 /* tag universe of the big bounded pool */
#define TAGS     600   /* of the other bounded and prefix pools */
#define PTAGS    20000 /* of a prefix pool */
#define RECENT   64
#define LAG      300 /* a client's floor trails its next seq by up to this */

struct mbounded
{
    char name[16];
    uint64_t size;
    int ntags;
    int32_t *tag_id;  /* tag -> id, -1: none */
    int32_t *id_tag;  /* id -> tag, -1: free; ids < ntags (lowest first) */
    uint64_t *bitmap; /* taken ids */
};

struct mprefix
{
    char name[16];
    uint8_t (*pre)[IDA_PREFIX_BYTES_MAX + 1]; /* tag -> [len][prefix] */
    uint64_t *seen;                           /* values handed out */
    uint64_t seen_bits;
    uint64_t count;
};

struct mseq
{
    char name[16];
    uint64_t next;
};

/* What one command of a batch was, to check its reply. */
struct desc
{
    int kind; /* 0 alloc, 1 free, 2 reserve, 3 prefix, 4 malformed,
                 5 reserve of an unregistered client */
    int pool;
    int tag;
    uint64_t id;
    uint64_t count;
    uint64_t client;
    uint64_t seq;
    bool retry;
    /* A retry's expectation, decided when it is built (the batch's
     * commands apply in order): its kept answer, IDA_EREUSED (other
     * arguments) or IDA_ESESSION (below the floor). */
    int expect;
    struct ida_fsm_result first;
};

struct kept
{
    uint64_t seq;
    struct ida_fsm_result r;
    struct desc d; /* what was sent, to send it again */
};

struct mclient
{
    uint64_t next_seq;
    uint64_t floor;   /* ack_below sent; answers below it are gone */
    uint64_t applied; /* seqs below this were in earlier batches */
    int n;
    struct kept k[LAG + RECENT + FX_BATCH_MAX];
};

static struct
{
    uint64_t rng;
    struct mbounded b[NBOUNDED];
    struct mprefix p[NPREFIX];
    struct mseq s[NSEQ];
    struct mclient c[CLIENTS + 1];
    uint64_t now;
    uint64_t snapshots;
    uint64_t retries, esession, reused, unregistered, exhausted, mismatches,
        commands;
} M;

static struct ida_fsm *f;
static struct fx_batch batch;
static struct desc descs[FX_BATCH_MAX];

static uint64_t rnd(void)
{
    uint64_t z = (M.rng += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

/* Tag @i: mostly short, every 97th at the maximum length. */
static const char *tag_name(int i)
{
    static char buf[IDA_TAG_BYTES_MAX + 1];
    int n = snprintf(buf, sizeof(buf), "tag-%d", i);
    if (i % 97 == 0) {
        memset(buf + n, 'x', (size_t)(IDA_TAG_BYTES_MAX - n));
        buf[IDA_TAG_BYTES_MAX] = '\0';
    }
    return buf;
}

static bool bit_get(const uint64_t *m, uint64_t i)
{
    return (m[i / 64] >> (i % 64)) & 1;
}

static void bit_put(uint64_t *m, uint64_t i, bool v)
{
    if (v) {
        m[i / 64] |= UINT64_C(1) << (i % 64);
    } else {
        m[i / 64] &= ~(UINT64_C(1) << (i % 64));
    }
}

static void model_init(uint64_t seed)
{
    memset(&M, 0, sizeof(M));
    M.rng = seed;
    M.now = 1000;
    static const uint64_t sizes[NBOUNDED] = {
        1, 7, 64, 300, TAGS_BIG - 500, UINT64_C(1) << 40};
    for (int i = 0; i < NBOUNDED; i++) {
        struct mbounded *b = &M.b[i];
        snprintf(b->name, sizeof(b->name), "bnd%d", i);
        b->size = sizes[i];
        b->ntags = i == 4 ? TAGS_BIG : TAGS;
        b->tag_id = malloc(sizeof(int32_t) * (size_t)b->ntags);
        b->id_tag = malloc(sizeof(int32_t) * (size_t)b->ntags);
        b->bitmap = calloc((size_t)b->ntags / 64 + 1, sizeof(uint64_t));
        memset(b->tag_id, 0xff, sizeof(int32_t) * (size_t)b->ntags);
        memset(b->id_tag, 0xff, sizeof(int32_t) * (size_t)b->ntags);
    }
    for (int i = 0; i < NPREFIX; i++) {
        struct mprefix *p = &M.p[i];
        snprintf(p->name, sizeof(p->name), "pfx%d", i);
        p->pre = calloc(PTAGS, sizeof(*p->pre));
        p->seen_bits = UINT64_C(1) << 20;
        p->seen = calloc(p->seen_bits / 64, sizeof(uint64_t));
    }
    for (int i = 0; i < NSEQ; i++) {
        snprintf(M.s[i].name, sizeof(M.s[i].name), "seq%d", i);
        M.s[i].next = 1;
    }
    for (int i = 0; i <= CLIENTS; i++) {
        M.c[i].next_seq = 1;
    }
}

static void model_free(void)
{
    for (int i = 0; i < NBOUNDED; i++) {
        free(M.b[i].tag_id);
        free(M.b[i].id_tag);
        free(M.b[i].bitmap);
    }
    for (int i = 0; i < NPREFIX; i++) {
        free(M.p[i].pre);
        free(M.p[i].seen);
    }
}

/* The lowest free id by a plain scan of the bitmap. */
static uint64_t model_lowest(const struct mbounded *b)
{
    uint64_t words = (uint64_t)b->ntags / 64 + 1;
    for (uint64_t w = 0; w < words; w++) {
        if (b->bitmap[w] != UINT64_MAX) {
            return w * 64 + (uint64_t)__builtin_ctzll(~b->bitmap[w]);
        }
    }
    return words * 64;
}

/* --- session model
 * ------------------------------------------------------------ */

static const struct kept *client_kept(const struct mclient *c, uint64_t seq)
{
    for (int i = 0; i < c->n; i++) {
        if (c->k[i].seq == seq) {
            return &c->k[i];
        }
    }
    return NULL;
}

static void client_keep(struct mclient *c,
                        const struct desc *d,
                        const struct ida_fsm_result *r)
{
    if (d->seq < c->floor) {
        return; /* a later command of the batch raised the floor past it */
    }
    cr_assert_lt(c->n, (int)(sizeof(c->k) / sizeof(c->k[0])));
    c->k[c->n].seq = d->seq;
    c->k[c->n].r = *r;
    c->k[c->n].d = *d;
    c->n++;
}

/* Raise @c's floor to @floor: its answers below are gone. */
static void client_ack(struct mclient *c, uint64_t floor)
{
    if (floor <= c->floor) {
        return;
    }
    c->floor = floor;
    int w = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->k[i].seq >= floor) {
            c->k[w++] = c->k[i];
        }
    }
    c->n = w;
}

/* --- building a batch
 * ---------------------------------------------------------- */

/* Add the command @d describes to the batch. */
static void emit(const struct desc *d, uint64_t ack)
{
    switch (d->kind) {
        case 0:
            fx_add_alloc(&batch, d->client, d->seq, M.b[d->pool].name,
                         tag_name(d->tag));
            break;
        case 1:
            fx_add_free(&batch, d->client, d->seq, M.b[d->pool].name, d->id,
                        tag_name(d->tag));
            break;
        case 2:
        case 5:
            fx_add_reserve(&batch, d->client, d->seq, M.s[d->pool].name,
                           d->count);
            break;
        case 3:
            fx_add_prefix(&batch, d->client, d->seq, M.p[d->pool].name,
                          tag_name(d->tag));
            break;
        default:
            fx_add_reserve(&batch, d->client, d->seq, M.s[1].name, 1);
            batch.cmd[batch.n - 1].op_case = IDALLOC__COMMAND__OP__NOT_SET;
            break;
    }
    batch.cmd[batch.n - 1].ack_below = ack;
}

/* A retry of one of @c's requests of an earlier batch. */
static void add_retry(struct desc *d, struct mclient *c)
{
    uint64_t back = 1 + below(LAG + 40);
    uint64_t seq = c->applied > back ? c->applied - back : 1;
    const struct kept *k = client_kept(c, seq);
    if (k == NULL) {
        /* Below the floor (every answer at or above it is kept). */
        cr_assert_lt(seq, c->floor);
        d->kind = 2;
        d->pool = 0;
        d->count = 1;
        d->expect = IDA_ESESSION;
    } else {
        uint64_t client = d->client;
        *d = k->d;
        d->client = client;
        d->first = k->r;
        d->expect = 0;
        if (below(8) == 0 && d->kind != 4) {
            /* The same request id with other arguments. */
            d->expect = IDA_EREUSED;
            if (d->kind == 2) {
                d->count++;
            } else if (d->kind == 1) {
                d->id++;
            } else {
                d->tag = d->tag + 1;
            }
        }
    }
    d->seq = seq;
    d->retry = true;
    emit(d, 0);
}

static void add_command(struct desc *d)
{
    memset(d, 0, sizeof(*d));
    d->client = 1 + below(CLIENTS);
    struct mclient *c = &M.c[d->client];
    uint64_t roll = below(1000);
    if (roll < 40 && c->applied > 1) {
        add_retry(d, c);
        return;
    }
    if (roll < 45) {
        /* A client that never registered: never executed. */
        d->kind = 5;
        d->client = CLIENTS + 1 + below(1000);
        d->seq = 1 + below(100);
        d->pool = 1;
        d->count = 1 + below(5);
        emit(d, 0);
        return;
    }
    d->seq = c->next_seq++;
    uint64_t ack = c->floor;
    if (below(4) == 0) {
        uint64_t lag = below(LAG);
        ack = d->seq > lag ? d->seq - lag : 1;
        client_ack(c, ack);
    }
    if (roll < 55) {
        d->kind = 4;
        emit(d, ack);
        return;
    }
    uint64_t k = below(10);
    if (k < 4) {
        d->kind = 0;
        d->pool = (int)below(NBOUNDED);
        d->tag = (int)below((uint64_t)M.b[d->pool].ntags);
    } else if (k < 7) {
        d->kind = 1;
        d->pool = (int)below(NBOUNDED);
        const struct mbounded *b = &M.b[d->pool];
        d->tag = (int)below((uint64_t)b->ntags);
        uint64_t how = below(10);
        if (how < 6 && b->tag_id[d->tag] >= 0) {
            d->id = (uint64_t)b->tag_id[d->tag]; /* its own id */
        } else if (how < 9) {
            d->id = below((uint64_t)b->ntags + 10);
        } else {
            d->id = b->size + below(3); /* outside the pool */
        }
    } else if (k < 8) {
        d->kind = 2;
        d->pool = (int)below(NSEQ);
        uint64_t how = below(100);
        d->count = how == 0   ? 0
                   : how == 1 ? IDA_RESERVE_COUNT_MAX + 1
                   : how == 2 ? IDA_RESERVE_COUNT_MAX
                              : 1 + below(1000);
    } else {
        d->kind = 3;
        d->pool = (int)below(NPREFIX);
        d->tag = (int)below(PTAGS);
    }
    emit(d, ack);
}

/* --- checking a reply
 * ------------------------------------------------------------ */

static void expect_bounded(const struct desc *d, const struct ida_fsm_result *r)
{
    struct mbounded *b = &M.b[d->pool];
    if (d->kind == 0) {
        int32_t have = b->tag_id[d->tag];
        if (have >= 0) {
            cr_assert_eq(r->error, 0);
            cr_assert(r->flag);
            cr_assert_eq(r->id, (uint64_t)have);
            return;
        }
        uint64_t low = model_lowest(b);
        if (low >= b->size) {
            cr_assert_eq(r->error, IDA_EEXHAUSTED);
            M.exhausted++;
            return;
        }
        cr_assert_eq(r->error, 0, "alloc: %s", r->error_msg);
        cr_assert_not(r->flag);
        cr_assert_eq(r->id, low, "lowest free");
        b->tag_id[d->tag] = (int32_t)low;
        b->id_tag[low] = d->tag;
        bit_put(b->bitmap, low, true);
        return;
    }
    if (d->id >= b->size) {
        cr_assert_eq(r->error, IDA_EINVAL);
        return;
    }
    bool held = d->id < (uint64_t)b->ntags && bit_get(b->bitmap, d->id);
    if (!held) {
        cr_assert_eq(r->error, 0);
        cr_assert_not(r->flag);
        return;
    }
    if (b->id_tag[d->id] != d->tag) {
        cr_assert_eq(r->error, IDA_ETAGMISMATCH);
        M.mismatches++;
        return;
    }
    cr_assert_eq(r->error, 0);
    cr_assert(r->flag);
    b->tag_id[d->tag] = -1;
    b->id_tag[d->id] = -1;
    bit_put(b->bitmap, d->id, false);
}

static void expect_reserve(const struct desc *d, const struct ida_fsm_result *r)
{
    struct mseq *s = &M.s[d->pool];
    if (d->count == 0) {
        cr_assert_eq(r->error, IDA_EINVAL);
    } else if (d->count > IDA_RESERVE_COUNT_MAX) {
        cr_assert_eq(r->error, IDA_ETOOBIG);
    } else {
        cr_assert_eq(r->error, 0);
        cr_assert_eq(r->id, s->next);
        cr_assert_eq(r->count, d->count);
        s->next += d->count;
    }
}

static void expect_prefix(const struct desc *d, const struct ida_fsm_result *r)
{
    struct mprefix *p = &M.p[d->pool];
    uint8_t *mine = p->pre[d->tag];
    cr_assert_eq(r->error, 0);
    if (mine[0] != 0) {
        cr_assert(r->flag);
        cr_assert_eq(r->prefix_len, mine[0]);
        cr_assert_eq(memcmp(r->prefix, mine + 1, mine[0]), 0);
        return;
    }
    cr_assert_not(r->flag);
    cr_assert_eq(r->prefix[0] + 1, r->prefix_len, "length byte");
    cr_assert(r->prefix_len == 2 || r->prefix[1] != 0, "minimal bytes");
    uint64_t v = 0;
    for (int i = 1; i < r->prefix_len; i++) {
        v = (v << 8) | r->prefix[i];
    }
    cr_assert_lt(v, p->seen_bits);
    cr_assert_not(bit_get(p->seen, v), "prefix %llu handed out twice",
                  (unsigned long long)v);
    bit_put(p->seen, v, true);
    mine[0] = r->prefix_len;
    memcpy(mine + 1, r->prefix, r->prefix_len);
    p->count++;
}

static void check_reply(const struct desc *d, const struct ida_fsm_reply *rp)
{
    /* Unregistered clients (kind 5) have ids past the model's table. */
    struct mclient *c = d->client <= CLIENTS ? &M.c[d->client] : NULL;
    const struct ida_fsm_result *r = &rp->result;
    M.commands++;
    cr_assert_eq(rp->request_seq, d->seq);
    if (d->retry) {
        if (d->expect == 0) {
            cr_assert(rp->cached);
            cr_assert(fx_result_eq(r, &d->first), "retry got another answer");
            M.retries++;
        } else {
            cr_assert_not(rp->cached);
            cr_assert_eq(r->error, d->expect, "retry: want %d got %d (%s)",
                         d->expect, r->error, r->error_msg);
            M.esession += d->expect == IDA_ESESSION;
            M.reused += d->expect == IDA_EREUSED;
        }
        return;
    }
    cr_assert_not(rp->cached);
    if (d->kind == 5) {
        cr_assert_eq(r->error, IDA_EEXPIRED);
        M.unregistered++;
        return;
    }
    switch (d->kind) {
        case 0:
        case 1:
            expect_bounded(d, r);
            break;
        case 2:
            expect_reserve(d, r);
            break;
        case 3:
            expect_prefix(d, r);
            break;
        default:
            cr_assert_eq(r->error, IDA_EINVAL);
            break;
    }
    client_keep(c, d, r);
}

/* --- whole-state checks
 * ------------------------------------------------------------ */

/* Every bounded pool: lookup of every tag and a full listing agree. */
static void check_reads(void)
{
    static struct ida_fsm_holding h[IDA_LIST_LIMIT_MAX];
    for (int i = 0; i < NBOUNDED; i++) {
        const struct mbounded *b = &M.b[i];
        for (int t = 0; t < b->ntags; t += 7) {
            uint64_t id;
            int rv = ida_fsm_lookup(f, b->name, tag_name(t), &id);
            if (b->tag_id[t] < 0) {
                cr_assert_eq(rv, IDA_ENOTFOUND);
            } else {
                cr_assert_eq(rv, 0);
                cr_assert_eq(id, (uint64_t)b->tag_id[t]);
            }
        }
        bool more = true, has_after = false;
        uint64_t after = 0, expect = 0;
        while (more) {
            size_t n;
            cr_assert_eq(ida_fsm_list(f, b->name, has_after, after,
                                      IDA_LIST_LIMIT_MAX, h, &n, &more),
                         0);
            for (size_t k = 0; k < n; k++) {
                while (expect < (uint64_t)b->ntags &&
                       !bit_get(b->bitmap, expect)) {
                    expect++;
                }
                cr_assert_eq(h[k].id, expect);
                cr_assert_str_eq(h[k].tag, tag_name(b->id_tag[expect]));
                expect++;
            }
            if (n > 0) {
                has_after = true;
                after = h[n - 1].id;
            }
        }
        while (expect < (uint64_t)b->ntags && !bit_get(b->bitmap, expect)) {
            expect++;
        }
        cr_assert_eq(expect, (uint64_t)b->ntags, "list missed holdings");
    }
}

/* Snapshot, restore into a fresh state machine, compare bytes, continue
 * with the restored one. */
static void snapshot_restore(void)
{
    size_t len, len2;
    uint8_t *snap = fx_snapshot(f, &len);
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_restore(g, snap, len), 0);
    uint8_t *again = fx_snapshot(g, &len2);
    cr_assert_eq(len, len2);
    cr_assert_eq(memcmp(snap, again, len), 0, "restore(snapshot(s)) != s");
    ida_free(snap);
    ida_free(again);
    ida_fsm_free(f);
    f = g;
    M.snapshots++;
}

static int cmp_pre(const void *a, const void *b)
{
    return memcmp(a, b, IDA_PREFIX_BYTES_MAX + 1);
}

/* No prefix of a pool is a prefix of another (sorted neighbours). */
static void check_prefix_free(void)
{
    for (int i = 0; i < NPREFIX; i++) {
        uint8_t(*v)[IDA_PREFIX_BYTES_MAX + 1] = calloc(PTAGS, sizeof(*v));
        size_t n = 0;
        for (int t = 0; t < PTAGS; t++) {
            if (M.p[i].pre[t][0] != 0) {
                memcpy(v[n++], M.p[i].pre[t] + 1, M.p[i].pre[t][0]);
            }
        }
        cr_assert_eq(n, M.p[i].count);
        qsort(v, n, sizeof(*v), cmp_pre);
        for (size_t k = 1; k < n; k++) {
            size_t l = (size_t)v[k - 1][0] + 1;
            cr_assert_neq(memcmp(v[k - 1], v[k], l), 0,
                          "a prefix is a prefix of another");
        }
        free(v);
    }
}

/* --- the run
 * ---------------------------------------------------------------------------
 */

static void create_pools(void)
{
    fx_batch_init(&batch, M.now);
    for (uint64_t c = 0; c <= CLIENTS; c++) {
        fx_add_register(&batch, c, 1);
    }
    struct ida_fsm_applied reg;
    fx_apply(f, &batch, &reg);
    for (size_t i = 0; i < reg.count; i++) {
        cr_assert_eq(reg.replies[i].result.error, 0);
    }
    fx_batch_init(&batch, M.now);
    uint64_t s = M.c[0].next_seq;
    for (int i = 0; i < NBOUNDED; i++) {
        fx_add_create(&batch, 0, s++, M.b[i].name,
                      IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, M.b[i].size);
    }
    for (int i = 0; i < NSEQ; i++) {
        fx_add_create(&batch, 0, s++, M.s[i].name,
                      IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE, 0);
    }
    for (int i = 0; i < NPREFIX; i++) {
        fx_add_create(&batch, 0, s++, M.p[i].name,
                      IDALLOC__POOL_KIND__POOL_KIND_PREFIX, 0);
    }
    M.c[0].next_seq = s;
    struct ida_fsm_applied out;
    fx_apply(f, &batch, &out);
    for (size_t i = 0; i < out.count; i++) {
        cr_assert_eq(out.replies[i].result.error, 0);
        cr_assert(out.replies[i].result.flag);
    }
}

static void run(uint64_t seed, uint64_t commands)
{
    model_init(seed);
    cr_assert_eq(ida_fsm_new(&f), 0);
    create_pools();
    while (M.commands < commands) {
        M.now += below(3);
        if (below(50) == 0) {
            struct ida_fsm_applied o;
            cr_assert_eq(ida_fsm_apply(f, ida_fsm_applied_index(f) + 1,
                                       IDA_ENTRY_NOOP, NULL, 0, &o),
                         0);
        }
        fx_batch_init(&batch, M.now);
        size_t n = 1 + below(64);
        for (size_t i = 0; i < n; i++) {
            add_command(&descs[i]);
        }
        struct ida_fsm_applied out;
        fx_apply(f, &batch, &out);
        for (size_t i = 0; i < n; i++) {
            check_reply(&descs[i], &out.replies[i]);
        }
        for (int i = 1; i <= CLIENTS; i++) {
            M.c[i].applied = M.c[i].next_seq;
        }
        if (below(300) == 0) {
            snapshot_restore();
        }
        if (below(2000) == 0) {
            check_reads();
        }
    }
    check_reads();
    snapshot_restore();
    check_prefix_free();
    /* The run exercised what it claims to. */
    cr_assert_gt(M.snapshots, 5);
    cr_assert_gt(M.retries, 100);
    cr_assert_gt(M.esession, 10);
    cr_assert_gt(M.reused, 10);
    cr_assert_gt(M.unregistered, 10);
    cr_assert_leq(ida_fsm_results_count(f), (CLIENTS + 1) * (LAG + 64 + 1),
                  "answers below the floors were dropped");
    cr_assert_gt(M.exhausted, 100);
    cr_assert_gt(M.mismatches, 100);
    cr_log_info(
        "seed %llu: %llu commands, %llu snapshots, %llu retries, "
        "%llu esession, %llu reused, %llu unregistered, %llu exhausted, "
        "%llu tag mismatches",
        (unsigned long long)seed, (unsigned long long)M.commands,
        (unsigned long long)M.snapshots, (unsigned long long)M.retries,
        (unsigned long long)M.esession, (unsigned long long)M.reused,
        (unsigned long long)M.unregistered, (unsigned long long)M.exhausted,
        (unsigned long long)M.mismatches);
    ida_fsm_free(f);
    f = NULL;
    model_free();
}

/* 260,000 commands per seed; IDA_FSM_PROPERTY_COMMANDS and
 * IDA_FSM_PROPERTY_SEED (added to each test's seed) lengthen and vary the
 * run for soak testing (make fsm-soak). */
static void run_env(uint64_t seed)
{
    const char *c = getenv("IDA_FSM_PROPERTY_COMMANDS");
    const char *s = getenv("IDA_FSM_PROPERTY_SEED");
    uint64_t commands = c != NULL ? strtoull(c, NULL, 10) : 260000;
    uint64_t base = s != NULL ? strtoull(s, NULL, 10) : 0;
    run(base + seed, commands);
}

Test(property, seed_1, .timeout = 100000)
{
    run_env(1);
}

Test(property, seed_2, .timeout = 100000)
{
    run_env(2);
}

Test(property, seed_3, .timeout = 100000)
{
    run_env(3);
}

Test(property, seed_4, .timeout = 100000)
{
    run_env(4);
}
