/* Decoding a snapshot while it arrives (fsm.h, struct ida_fsm_ahead).
 *
 * The walk follows the FsmState's top-level fields as their bytes come,
 * and decodes ahead each Pool laid out exactly as snap_encode.c writes a
 * bounded one: its name, its kind, then its BoundedState to the Pool's end,
 * which holds its size and then nothing but holdings. The holdings are
 * taken with the restore's own DECODE (snap_hold.h), a piece at a time,
 * into arrays sized once they all came, as the restore sizes them.
 *
 * A pool so decoded is what the restore's dec_bounded() makes of the same
 * bytes before its GROUP phase (after it, from IDA__HOLD_SPLIT_MIN
 * holdings on: snap_hold.h): the same size, the same records, the same
 * words in id order with the same total in each region (split between
 * the shares elsewhere, which GROUP does not see), its chunks indexed up
 * to the same last id. Anything else (another layout, a field the restore would
 * read differently, a decoding error, memory short) drops the pool or stops the
 * walk: the restore decodes those bytes itself. So nothing here decides a
 * verdict.
 *
 * Each step also hashes the bytes that came, in order, as the checksum
 * does (ida__sum_words()): the restore compares the snapshot's checksum
 * field with that sum instead of hashing the whole snapshot once more
 * after its last byte came. The sum is of the bytes the steps got; that
 * they are the bytes the restore gets is ida_fsm_restore_ahead()'s
 * contract (a node's stream compares its copy with the core's bytes
 * before it restores, src/node/snap_stream.c), so it decides as the
 * restore's own sum would.
 *
 * Hostile bytes: every length is checked against the enclosing message's
 * before it is followed, and DECODE checks each holding as the restore
 * does. */
#include "fsm/fsm.h"

#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "fsm/snap_hold.h"
#include "fsm/wire.h"
#include "idalloc_errors.h"

enum walk { WALK, POOL, DONE };

struct ahead_pool
{
    size_t at, end; /* the Pool message's bytes */
    size_t b_at;    /* its BoundedState's */
    size_t pos;     /* where its DECODE goes on (the bytes may move) */
    struct ida__pool *pool;
    struct ida__hold_load load; /* once begun */
    bool begun;
    struct ahead_pool *next;
};

struct ida_fsm_ahead
{
    size_t len;  /* the snapshot's bytes, checksum included */
    size_t body; /* those the FsmState's fields take */
    size_t top;  /* where the next top-level field starts */
    enum walk state;
    struct ahead_pool *cur;   /* POOL: being decoded */
    struct ahead_pool *pools; /* decoded, in order */
    struct ahead_pool **tail; /* where the next one goes */
    uint64_t holdings;        /* in them */
    uint64_t taken;           /* in those a restore took */
    uint64_t sum;             /* of the first summed bytes (ida__sum_*) */
    size_t summed;            /* a multiple of 8, up to body */
    bool sum_done;            /* sum is the whole body's checksum */
};

int ida_fsm_ahead_new(size_t len, struct ida_fsm_ahead **out)
{
    struct ida_fsm_ahead *a = ida_calloc(1, sizeof(*a));
    if (a == NULL) {
        return IDA_ENOMEM;
    }
    a->len = len;
    a->body = len >= IDA__CHECKSUM_BYTES ? len - IDA__CHECKSUM_BYTES : 0;
    a->state = len >= IDA__CHECKSUM_BYTES ? WALK : DONE;
    a->tail = &a->pools;
    a->sum = ida__sum_begin(a->body);
    *out = a;
    return 0;
}

uint64_t ida_fsm_ahead_holdings(const struct ida_fsm_ahead *a)
{
    return a->holdings;
}

uint64_t ida_fsm_ahead_taken(const struct ida_fsm_ahead *a)
{
    return a->taken;
}

static void drop(struct ahead_pool *ap)
{
    if (ap->begun) {
        ida__hold_end(&ap->load, IDA_ECORRUPT, NULL);
    }
    if (ap->pool != NULL) {
        ida__pool_free(ap->pool);
    }
    ida_free(ap);
}

void ida_fsm_ahead_free(struct ida_fsm_ahead *a)
{
    if (a == NULL) {
        return;
    }
    if (a->cur != NULL) {
        drop(a->cur);
    }
    while (a->pools != NULL) {
        struct ahead_pool *ap = a->pools;
        a->pools = ap->next;
        drop(ap);
    }
    ida_free(a);
}

/* A field's key, then its value (a varint) or its length (bytes), from
 * @v, which is cut short of the field's message when @cut: 1 read, 0 it
 * lies across the cut, -1 not a field this walk follows. @v is left
 * after what was read. */
static int head(struct ida__rbuf *v,
                bool cut,
                uint32_t *num,
                uint64_t *x,
                int *type)
{
    const uint8_t *at = v->p;
    uint64_t key;
    if (v->p == v->end) {
        return cut ? 0 : -1;
    }
    if (ida__r_varint(v, &key) != 0 || ida__r_varint(v, x) != 0) {
        v->p = at;
        return cut ? 0 : -1;
    }
    *num = (uint32_t)(key >> 3);
    *type = (int)(key & 7);
    if (key >> 3 == 0 || key >> 3 > UINT32_MAX ||
        (*type != IDA__WT_VARINT && *type != IDA__WT_LEN)) {
        return -1;
    }
    return 1;
}

/* The next field of @v must be field @want of wire type @type (a varint
 * when IDA__WT_VARINT, else bytes whose length it gives): 1 and *@x, 0
 * (more bytes needed), or -1. */
static int expect(struct ida__rbuf *v,
                  bool cut,
                  uint32_t want,
                  int type,
                  uint64_t *x)
{
    uint32_t num;
    int t;
    const uint8_t *at = v->p;
    int h = head(v, cut, &num, x, &t);
    if (h == 1 && (num != want || t != type)) {
        v->p = at;
        return -1;
    }
    return h;
}

/* Read the Pool's head and its BoundedState's, once all of it is in the
 * first @avail bytes, and set the pool up: 1 set up, 0 more bytes needed,
 * -1 not taken ahead. */
static int pool_begin(struct ahead_pool *ap, const uint8_t *data, size_t avail)
{
    if (avail <= ap->at) {
        return 0;
    }
    bool cut = avail < ap->end;
    struct ida__rbuf v = {data + ap->at, data + (cut ? avail : ap->end)};
    uint64_t x;
    int h = expect(&v, cut, 1, IDA__WT_LEN, &x); /* the name */
    if (h != 1) {
        return h;
    }
    if (x == 0 || x > IDA_POOL_NAME_MAX) {
        return -1;
    }
    if (x > (uint64_t)(v.end - v.p)) {
        return cut ? 0 : -1;
    }
    v.p += x;
    if ((h = expect(&v, cut, 2, IDA__WT_VARINT, &x)) != 1) { /* kind */
        return h;
    }
    if (x != IDALLOC__POOL_KIND__POOL_KIND_BOUNDED) {
        return -1;
    }
    if ((h = expect(&v, cut, 4, IDA__WT_LEN, &x)) != 1) {
        return h;
    }
    size_t b_at = (size_t)(v.p - data);
    if (x != ap->end - b_at) {
        return -1; /* the BoundedState is not the Pool's last field */
    }
    uint64_t size;
    if ((h = expect(&v, cut, 1, IDA__WT_VARINT, &size)) != 1) {
        return h;
    }
    if (size == 0) {
        return -1;
    }
    struct ida__pool *p = ida_calloc(1, sizeof(*p));
    if (p == NULL) {
        return -1;
    }
    ap->pool = p;
    struct ida__bounded *b = &p->u.bounded;
    ida__bounded_init(b, size);
    p->kind = IDALLOC__POOL_KIND__POOL_KIND_BOUNDED; /* now closeable */
    ap->begun = true;
    ap->b_at = b_at;
    ap->pos = (size_t)(v.p - data);
    struct ida__rbuf r = {v.p, data + ap->end};
    return ida__hold_begin_streamed(&ap->load, b, r) == 0 ? 1 : -1;
}

/* Decode what of the pool the first @avail bytes hold: 1 all of it, 0
 * more bytes needed, -1 not taken ahead. */
static int pool_step(struct ahead_pool *ap, const uint8_t *data, size_t avail)
{
    if (!ap->begun) {
        int h = pool_begin(ap, data, avail);
        if (h != 1) {
            return h;
        }
    }
    size_t upto = avail < ap->end ? avail : ap->end;
    struct ida__rbuf *r = &ap->load.sh[0].r;
    *r = (struct ida__rbuf){data + ap->pos, data + ap->end};
    int rv = ida__hold_decode_upto(&ap->load, data + upto);
    ap->pos = (size_t)(r->p - data);
    if (rv == 0) {
        return 0;
    }
    if (rv != 1 || ap->load.sh[0].taken == 0 ||
        ida__hold_settle(&ap->load) != 0) {
        return -1;
    }
    return 1;
}

/* Hash the body's bytes among the first @avail that were not yet. */
static void sum_step(struct ida_fsm_ahead *a, const uint8_t *data, size_t avail)
{
    if (a->sum_done || a->len < IDA__CHECKSUM_BYTES) {
        return;
    }
    size_t upto = avail < a->body ? avail : a->body;
    if (upto < a->summed) {
        return; /* fewer bytes than a step before (callers never do) */
    }
    size_t words = (upto - a->summed) / 8;
    a->sum = ida__sum_words(a->sum, data + a->summed, words);
    a->summed += 8 * words;
    if (avail >= a->body) {
        a->sum = ida__sum_end(a->sum, data + a->summed, a->body - a->summed);
        a->sum_done = true;
    }
}

bool ida__ahead_sum(const struct ida_fsm_ahead *a, size_t len, uint64_t *sum)
{
    if (a == NULL || !a->sum_done || a->len != len) {
        return false;
    }
    *sum = a->sum;
    return true;
}

void ida_fsm_ahead_step(struct ida_fsm_ahead *a,
                        const uint8_t *data,
                        size_t avail)
{
    if (avail > a->len) {
        avail = a->len;
    }
    sum_step(a, data, avail);
    while (a->state != DONE) {
        if (a->state == POOL) {
            struct ahead_pool *ap = a->cur;
            int r = pool_step(ap, data, avail);
            if (r == 0) {
                return;
            }
            a->cur = NULL;
            a->top = ap->end;
            a->state = WALK;
            if (r < 0) {
                drop(ap);
                continue;
            }
            a->holdings += ap->load.holdings;
            *a->tail = ap;
            a->tail = &ap->next;
            continue;
        }
        if (a->top >= a->body) {
            a->state = DONE;
            break;
        }
        if (a->top >= avail) {
            return; /* the field skipped last ends past what came */
        }
        bool cut = avail < a->body;
        struct ida__rbuf v = {data + a->top, data + (cut ? avail : a->body)};
        uint32_t num;
        int type;
        uint64_t x;
        int h = head(&v, cut, &num, &x, &type);
        if (h == 0) {
            return;
        }
        size_t after = (size_t)(v.p - data);
        if (h < 0 || (type == IDA__WT_LEN && x > a->body - after)) {
            a->state = DONE; /* the restore reads the rest itself */
            break;
        }
        if (type == IDA__WT_VARINT) {
            a->top = after;
            continue;
        }
        if (num != 2) {
            a->top = after + (size_t)x;
            continue;
        }
        struct ahead_pool *ap = ida_calloc(1, sizeof(*ap));
        if (ap == NULL) {
            a->state = DONE;
            break;
        }
        ap->at = after;
        ap->end = after + (size_t)x;
        a->cur = ap;
        a->state = POOL;
    }
}

struct ida__pool *ida__ahead_take(struct ida_fsm_ahead *a,
                                  size_t at,
                                  size_t end,
                                  size_t b_at,
                                  const struct ida_fsm_helper *helper,
                                  int *rv)
{
    struct ahead_pool **pp = &a->pools;
    while (*pp != NULL &&
           ((*pp)->at != at || (*pp)->end != end || (*pp)->b_at != b_at)) {
        pp = &(*pp)->next;
    }
    struct ahead_pool *ap = *pp;
    if (ap == NULL) {
        return NULL;
    }
    *pp = ap->next;
    if (a->tail == &ap->next) {
        a->tail = pp;
    }
    struct ida__pool *p = ap->pool;
    a->taken += ap->load.holdings;
    *rv = ida__hold_end(&ap->load, 0, helper);
    if (*rv == 0) {
        ida__bounded_recount(&p->u.bounded);
    }
    ida_free(ap);
    return p;
}
