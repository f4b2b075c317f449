/* Snapshots: reading an idalloc.FsmState back (see snap_encode.c). */
#include "fsm/fsm.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "fsm/wire.h"
#include "idalloc_errors.h"

#define CORRUPT IDA_ECORRUPT

/* A tag from the wire: 1..IDA_TAG_BYTES_MAX bytes, no NUL. */
static bool tag_ok(const struct ida__rbuf *b)
{
    size_t n = (size_t)(b->end - b->p);
    return n >= 1 && n <= IDA_TAG_BYTES_MAX && memchr(b->p, 0, n) == NULL;
}

/* Holdings.
 *
 * A large bounded pool is most of a large state, and its restore is most
 * of a node's restart and of a new node's catch-up. Its holdings are
 * decoded in phases, each shared by two threads when the caller lends one
 * (struct ida_fsm_helper), with a join between phases:
 *
 *   DECODE  each holding's tag is copied into a slab and its id taken in
 *           the pool's chunks (in id order: sequential), and the slot word
 *           of its tag (ida__tagtab_word()) is written to a scratch array
 *           in id order, counted by table region. The scratch is the tag
 *           table's own memory, not yet a table (ida__tagtab_bulk_begin()).
 *   GROUP   the words are copied into an array grouped by region (a
 *           counting sort: the counts give each share's place in each
 *           region), then the table's memory is cleared (CLEAR);
 *   INSERT  the words go into the table region by region, each thread a
 *           half of the regions.
 *
 * Inserting in id order put each tag at a random slot of a table far
 * larger than the caches (a cache and a TLB miss per tag, at ten million);
 * by region, each probe finds its lines just written. A tag held twice is
 * still refused: both copies hash alike, so land in one region, and the
 * insert of the second meets the first.
 *
 * The holdings are cut in two shares at a chunk boundary near the middle,
 * so each thread takes ids in chunks of its own, into a slab of its own;
 * the chunks' count tree, which every take would climb to the root, is
 * summed once at the end instead (ida__bounded_recount()). A share's
 * bounds are checked as data (ids strictly increasing, within [lo, hi],
 * and as many holdings as the first pass counted in its bytes), so damaged
 * or forged bytes cannot make the shares overlap or overrun the scratch. */
#define HOLD_SPLIT_MIN 65536 /* holdings below which one thread does all */

enum phase { DECODE, GROUP, CLEAR, INSERT };

/* What the shares of one pool share. */
struct bulk
{
    struct ida__bounded *b;
    uint64_t *sorted; /* the words grouped by region */
    unsigned regions; /* of the table (ida__tagtab_regions()) */
    unsigned parts;   /* shares: each clears and inserts 1/parts of it */
    uint64_t *start;  /* [regions + 1]: where each region's words begin */
};

/* One thread's share of a bounded pool's holdings. */
struct share
{
    struct bulk *k;
    enum phase phase;
    struct ida__rbuf r;    /* the pool's fields holding the share */
    uint64_t lo, hi;       /* its ids are within [lo, hi], increasing */
    struct ida__slab slab; /* records of the share */
    uint64_t *words;       /* its words, in id order (DECODE) */
    uint64_t n;            /* how many holdings its bytes hold */
    uint64_t *count;       /* [regions]: its words in each region
                              (DECODE), then where its next one in
                              each goes (GROUP) */
    unsigned part;         /* its index (0 or 1) */
    int rv;
};

/* The id of the Holding in @r (absent: 0, protobuf's default). */
static uint64_t holding_id(struct ida__rbuf r)
{
    struct ida__field f;
    uint64_t id = 0;
    while (ida__r_field(&r, &f) == 1) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            id = f.v;
        }
    }
    return id;
}

/* Take the Holding in @r: its record into the share's slab and its id
 * into the pool; *@word is its tag's slot word. */
static int take_holding(struct share *sh,
                        struct ida__rbuf r,
                        uint64_t *next,
                        uint64_t *word)
{
    struct ida__field f;
    uint64_t id = 0;
    struct ida__rbuf tag = {NULL, NULL};
    int k;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            id = f.v;
        } else if (f.num == 2 && f.type == IDA__WT_LEN) {
            tag = f.sub;
        }
    }
    struct ida__bounded *b = sh->k->b;
    if (k < 0 || tag.p == NULL || id < *next || id > sh->hi || id >= b->size ||
        id >= IDA_BOUNDED_HELD_MAX || !tag_ok(&tag)) {
        return CORRUPT;
    }
    size_t n = (size_t)(tag.end - tag.p);
    uint8_t *rec = ida__tagrec_new(&sh->slab, (const char *)tag.p, n);
    if (rec == NULL || ida__bounded_fill(b, id, rec) != 0) {
        return IDA_ENOMEM; /* a record not taken stays in the slab */
    }
    *word = ida__tagtab_word((uint32_t)id, ida__hash(tag.p, n));
    *next = id + 1;
    return 0;
}

static int run_decode(struct share *sh)
{
    struct ida__field f;
    const struct ida__tagtab *t = &sh->k->b->tab;
    uint64_t next = sh->lo, i = 0;
    int k;
    while ((k = ida__r_field(&sh->r, &f)) == 1) {
        if (f.num == 2 && f.type == IDA__WT_LEN) {
            if (i == sh->n) {
                return CORRUPT; /* more than the first pass counted */
            }
            int rv = take_holding(sh, f.sub, &next, &sh->words[i]);
            if (rv != 0) {
                return rv;
            }
            sh->count[ida__tagtab_region(t, sh->words[i])]++;
            i++;
        }
    }
    return k < 0 || i != sh->n ? CORRUPT : 0;
}

/* Insert the words of the share's regions, the slots of the next region
 * loading into the cache while those of one are written. */
static int run_insert(struct share *sh)
{
    struct bulk *k = sh->k;
    struct ida__tagtab *t = &k->b->tab;
    uint64_t span = t->cap / k->regions;
    unsigned per = k->regions / k->parts;
    for (unsigned g = per * sh->part; g < per * (sh->part + 1); g++) {
        uint64_t next = (uint64_t)(g + 1) * span;
        if (next < t->cap) {
            ida__tagtab_prefetch_range(t, next, next + span);
        }
        for (uint64_t i = k->start[g]; i < k->start[g + 1]; i++) {
            if (!ida__tagtab_insert_word_shared(t, k->sorted[i])) {
                return CORRUPT; /* a tag held twice */
            }
        }
    }
    return 0;
}

/* One phase of a share (a thread's whole work until the next join). */
static void run_share(void *arg)
{
    struct share *sh = arg;
    struct bulk *k = sh->k;
    switch (sh->phase) {
        case DECODE:
            sh->rv = run_decode(sh);
            break;
        case GROUP: {
            const struct ida__tagtab *t = &k->b->tab;
            for (uint64_t i = 0; i < sh->n; i++) {
                uint64_t w = sh->words[i];
                k->sorted[sh->count[ida__tagtab_region(t, w)]++] = w;
            }
            break;
        }
        case CLEAR: {
            uint64_t per = k->b->tab.cap / k->parts;
            ida__tagtab_bulk_clear(&k->b->tab, per * sh->part,
                                   per * (sh->part + 1));
            break;
        }
        case INSERT:
            sh->rv = run_insert(sh);
            break;
    }
}

/* Run @phase of the @shares shares, the second on the lent thread when
 * there is one; the first error of the shares, or 0. */
static int run_phase(struct share *sh,
                     int shares,
                     enum phase phase,
                     const struct ida_fsm_helper *helper)
{
    for (int i = 0; i < shares; i++) {
        sh[i].phase = phase;
    }
    bool helped = shares == 2 && helper != NULL &&
                  helper->start(helper->ctx, run_share, &sh[1]) == 0;
    run_share(&sh[0]);
    if (helped) {
        helper->join(helper->ctx);
    } else if (shares == 2) {
        run_share(&sh[1]);
    }
    return sh[0].rv != 0 ? sh[0].rv : shares == 2 ? sh[1].rv : 0;
}

/* Where the second share starts: the first Holding at or after the one at
 * @mid (a field start) whose chunk differs from the one before it; *@cut_id
 * is that chunk's first id and *@skipped the holdings from @mid to it.
 * NULL when there is none. */
static const uint8_t *find_cut(struct ida__rbuf r,
                               const uint8_t *mid,
                               uint64_t *cut_id,
                               uint64_t *skipped)
{
    struct ida__field f;
    uint64_t chunk = UINT64_MAX;
    *skipped = 0;
    r.p = mid;
    for (const uint8_t *at = r.p; ida__r_field(&r, &f) == 1; at = r.p) {
        if (f.num != 2 || f.type != IDA__WT_LEN) {
            continue;
        }
        uint64_t c = holding_id(f.sub) >> IDA__CHUNK_SHIFT;
        if (chunk != UINT64_MAX && c > chunk) {
            *cut_id = c << IDA__CHUNK_SHIFT;
            return at;
        }
        chunk = c;
        (*skipped)++;
    }
    return NULL;
}

/* The holdings of @b (prepared for ids up to @max_id), @holdings of them in
 * @r, the one at @mid being the @before_mid'th: in its tag table. */
static int take_holdings(struct ida__bounded *b,
                         struct ida__rbuf r,
                         uint64_t max_id,
                         uint64_t holdings,
                         const uint8_t *mid,
                         uint64_t before_mid,
                         const struct ida_fsm_helper *helper)
{
    uint64_t *scratch = ida__tagtab_bulk_begin(&b->tab, holdings);
    /* As many regions as the table has, up to IDA__TAGTAB_REGIONS: a small
     * pool's counts are small. */
    unsigned regions = scratch != NULL ? ida__tagtab_regions(&b->tab) : 1;
    struct bulk k = {.b = b, .regions = regions};
    struct share sh[2];
    memset(sh, 0, sizeof(sh));
    /* start, then each share's counts. */
    uint64_t *counts = ida_calloc(3 * (size_t)regions + 1, sizeof(*counts));
    k.sorted = ida_malloc_huge(holdings * sizeof(*k.sorted));
    int rv =
        scratch == NULL || counts == NULL || k.sorted == NULL ? IDA_ENOMEM : 0;
    int shares = 1;
    if (rv == 0) {
        k.start = counts;
        sh[0] = (struct share){.k = &k,
                               .r = r,
                               .hi = max_id,
                               .words = scratch,
                               .n = holdings,
                               .count = counts + regions + 1};
        uint64_t cut_id, skipped;
        const uint8_t *cut =
            helper != NULL && holdings >= HOLD_SPLIT_MIN && mid != NULL
                ? find_cut(r, mid, &cut_id, &skipped)
                : NULL;
        if (cut != NULL) {
            shares = 2;
            uint64_t n0 = before_mid + skipped;
            sh[1] = sh[0];
            sh[0].r.end = cut;
            sh[0].hi = cut_id - 1 < max_id ? cut_id - 1 : max_id;
            sh[0].n = n0;
            sh[1].r.p = cut;
            sh[1].lo = cut_id;
            sh[1].words = scratch + n0;
            sh[1].n = holdings - n0;
            sh[1].count = counts + 2 * (size_t)regions + 1;
            sh[1].part = 1;
        }
        rv = run_phase(sh, shares, DECODE, helper);
    }
    if (rv == 0) {
        /* Each region's words: the first share's, then the second's. */
        uint64_t at = 0;
        for (unsigned g = 0; g < regions; g++) {
            k.start[g] = at;
            for (int i = 0; i < shares; i++) {
                uint64_t c = sh[i].count[g];
                sh[i].count[g] = at;
                at += c;
            }
        }
        k.start[regions] = at; /* == holdings: each share took its n */
        k.parts = (unsigned)shares;
        run_phase(sh, shares, GROUP, helper);
        run_phase(sh, shares, CLEAR, helper);
        rv = run_phase(sh, shares, INSERT, helper);
    } else if (scratch != NULL) {
        /* Never left holding words (only the first @holdings slots took
         * any): whatever frees the pool sees a table. */
        ida__tagtab_bulk_clear(&b->tab, 0, holdings);
    }
    for (int i = 0; i < shares; i++) {
        ida__slab_merge(&b->slab, &sh[i].slab);
    }
    ida_free(k.sorted);
    ida_free(counts);
    return rv;
}

static int dec_bounded(struct ida__pool *pool,
                       struct ida__rbuf r,
                       const struct ida_fsm_helper *helper)
{
    struct ida__field f;
    uint64_t size = 0, holdings = 0, before_mid = 0;
    struct ida__rbuf last = {NULL, NULL};
    /* The second share starts near the Holding that crosses the middle
     * byte (holdings are about the same size). */
    const uint8_t *half = r.p + (r.end - r.p) / 2, *mid = NULL;
    int k;
    struct ida__rbuf r2 = r;
    for (const uint8_t *at = r.p; (k = ida__r_field(&r, &f)) == 1; at = r.p) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            size = f.v;
        } else if (f.num == 2 && f.type == IDA__WT_LEN) {
            last = f.sub;
            if (mid == NULL && at >= half) {
                mid = at;
                before_mid = holdings;
            }
            holdings++;
        }
    }
    if (k < 0 || size == 0 || holdings > IDA_BOUNDED_HELD_MAX) {
        return CORRUPT;
    }
    struct ida__bounded *b = &pool->u.bounded;
    ida__bounded_init(b, size);
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_BOUNDED; /* now closeable */
    if (holdings == 0) {
        return 0;
    }
    /* The highest id is the last one: the chunk index is sized for it once,
     * and the tag table for every holding (instead of growing 20 times). */
    uint64_t max_id = holding_id(last);
    if (max_id >= size || max_id >= IDA_BOUNDED_HELD_MAX) {
        return CORRUPT;
    }
    if (ida__bounded_prepare(b, max_id) != 0) {
        return IDA_ENOMEM;
    }
    int rv = take_holdings(b, r2, max_id, holdings, mid, before_mid, helper);
    if (rv == 0) {
        ida__bounded_recount(b);
    }
    return rv;
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
                         struct ida__rbuf r,
                         const uint8_t **last_tag)
{
    struct ida__field f;
    struct ida__rbuf tag = {NULL, NULL}, pre = {NULL, NULL};
    int k;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_LEN) {
            tag = f.sub;
        } else if (f.num == 2 && f.type == IDA__WT_LEN) {
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

static int dec_prefix(struct ida__pool *pool, struct ida__rbuf r)
{
    struct ida__prefix *p = &pool->u.prefix;
    ida__prefix_init(p);
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_PREFIX;
    struct ida__field f;
    int k;
    struct ida__rbuf r2 = r;
    uint64_t count = 0;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            p->start = f.v;
        } else if (f.num == 2 && f.type == IDA__WT_VARINT) {
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
    while ((k = ida__r_field(&r2, &f)) == 1) {
        int rv = 0;
        if (f.num == 3 && f.type == IDA__WT_VARINT) {
            rv = put_reserved(p, f.v, &any, &last); /* unpacked form */
        } else if (f.num == 3 && f.type == IDA__WT_LEN) {
            uint64_t v;
            while (rv == 0 && f.sub.p != f.sub.end) {
                rv = ida__r_varint(&f.sub, &v) != 0
                         ? CORRUPT
                         : put_reserved(p, v, &any, &last);
            }
        } else if (f.num == 4 && f.type == IDA__WT_LEN) {
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

static int dec_seq(struct ida__pool *pool, struct ida__rbuf r)
{
    struct ida__field f;
    int k;
    uint64_t next = 0;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
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

static int dec_pool(struct ida_fsm *f,
                    struct ida__rbuf r,
                    const struct ida_fsm_helper *helper)
{
    struct ida__field fl;
    struct ida__rbuf name = {NULL, NULL}, sub[6] = {{NULL, NULL}};
    uint64_t kind = 0;
    int k;
    while ((k = ida__r_field(&r, &fl)) == 1) {
        if (fl.num == 1 && fl.type == IDA__WT_LEN) {
            name = fl.sub;
        } else if (fl.num == 2 && fl.type == IDA__WT_VARINT) {
            kind = fl.v;
        } else if (fl.num >= 3 && fl.num <= 5 && fl.type == IDA__WT_LEN) {
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
        rv = dec_bounded(p, sub[4], helper);
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

/* --- sessions ------------------------------------------------------------- */

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
        case IDALLOC__COMMAND_RESULT__RESULT_RESTORE:
            if (m->restore->pools > IDA_POOLS_MAX) {
                return CORRUPT;
            }
            r->op = IDA_FSM_OP_RESTORE;
            r->id = m->restore->from_index;
            r->count = m->restore->pools;
            return 0;
        default:
            return CORRUPT;
    }
}

static int dec_session_fields(struct ida_fsm *f,
                              const Idalloc__Session *m,
                              const uint8_t *last_id)
{
    if (m->client_id.len != IDA_CLIENT_ID_BYTES ||
        m->n_results > IDA_SESSION_RESULTS_MAX + IDA_SESSION_REFUSED_MAX ||
        m->lru_rank == 0 || m->lru_rank > f->session_clock ||
        m->last_active_ms > f->now_ms || f->session_count >= IDA_SESSIONS_MAX ||
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
                       struct ida__rbuf r,
                       const uint8_t **last_id)
{
    Idalloc__Session *m =
        idalloc__session__unpack(NULL, (size_t)(r.end - r.p), r.p);
    if (m == NULL) {
        return CORRUPT;
    }
    int rv = dec_session_fields(f, m, *last_id);
    struct ida__cached *res = rv == 0 && m->n_results > 0
                                  ? ida_malloc(m->n_results * sizeof(*res))
                                  : NULL;
    if (rv == 0 && m->n_results > 0 && res == NULL) {
        rv = IDA_ENOMEM;
    }
    uint32_t refused = 0;
    for (size_t i = 0; rv == 0 && i < m->n_results; i++) {
        res[i].seq = m->results[i]->request_seq;
        res[i].fingerprint = m->results[i]->fingerprint;
        rv = dec_result(m->results[i]->result, &res[i].result);
        refused += rv == 0 && res[i].result.error == IDA_ELIMIT;
    }
    uint32_t answers = (uint32_t)m->n_results - refused;
    if (rv == 0 && (refused > IDA_SESSION_REFUSED_MAX ||
                    answers > IDA_SESSION_RESULTS_MAX ||
                    f->results_total + answers > IDA_RESULTS_TOTAL_MAX ||
                    ida__session_find(f, m->client_id.data) != NULL)) {
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
            s->n = s->cap = (uint32_t)m->n_results;
            s->n_refused = refused;
            s->results = s->base = res;
            res = NULL;
            f->results_total += answers;
            *last_id = s->client_id;
        }
    }
    ida_free(res);
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

/* --- restore -------------------------------------------------------------- */

/* Decode @r into the empty @f. */
static int dec_state(struct ida_fsm *f,
                     struct ida__rbuf r,
                     const struct ida_fsm_helper *helper)
{
    struct ida__field fl;
    int k;
    uint64_t version = 0;
    struct ida__rbuf r2 = r;
    /* Pass 1: scalars (sessions are checked against them). */
    while ((k = ida__r_field(&r, &fl)) == 1) {
        if (fl.type != IDA__WT_VARINT) {
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
    while ((k = ida__r_field(&r2, &fl)) == 1) {
        int rv = 0;
        if (fl.num == 2 && fl.type == IDA__WT_LEN) {
            rv = dec_pool(f, fl.sub, helper);
        } else if (fl.num == 3 && fl.type == IDA__WT_LEN) {
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
    return ida_fsm_restore_with(f, data, len, NULL);
}

/* The checksum runs on the lent thread while the decoding starts (at 10 M
 * allocations it is ~90 ms of reading 180 MB, which no decoding step
 * needs): the decoder's own use of the thread first waits for it. A
 * mismatch then throws away what was decoded, so damaged bytes still
 * change nothing; the decoder checks every field anyway, as it must for
 * bytes whose checksum a forger made right. */
struct sum_job
{
    const uint8_t *p;
    size_t len;
    uint64_t sum;
};

static void sum_run(void *arg)
{
    struct sum_job *j = arg;
    j->sum = ida__snapshot_checksum(j->p, j->len);
}

/* The caller's helper, with the checksum job possibly still on it. */
struct lent
{
    const struct ida_fsm_helper *inner;
    bool busy; /* the checksum job has not been joined */
};

static void lent_wait(struct lent *l)
{
    if (l->busy) {
        l->inner->join(l->inner->ctx);
        l->busy = false;
    }
}

static int lent_start(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct lent *l = ctx;
    lent_wait(l);
    return l->inner->start(l->inner->ctx, fn, arg);
}

static void lent_join(void *ctx)
{
    struct lent *l = ctx;
    l->inner->join(l->inner->ctx);
}

int ida_fsm_restore_with(struct ida_fsm *f,
                         const uint8_t *data,
                         size_t len,
                         const struct ida_fsm_helper *helper)
{
    IDA_ASSERT(f != NULL);
    if (data == NULL && len > 0) {
        return IDA_EINVAL;
    }
    if (len < IDA__CHECKSUM_BYTES ||
        data[len - IDA__CHECKSUM_BYTES] != IDA__CHECKSUM_KEY) {
        return CORRUPT;
    }
    uint64_t sum = 0;
    for (int b = 7; b >= 0; b--) {
        sum = (sum << 8) | data[len - 8 + (size_t)b];
    }
    struct sum_job job = {data, len - IDA__CHECKSUM_BYTES, 0};
    struct lent l = {helper, false};
    struct ida_fsm_helper wrapped = {lent_start, lent_join, &l};
    l.busy = helper != NULL && helper->start(helper->ctx, sum_run, &job) == 0;
    if (!l.busy) {
        sum_run(&job); /* no thread: checked before anything is decoded */
        if (job.sum != sum) {
            return CORRUPT;
        }
    }
    struct ida_fsm *n = NULL;
    int rv = ida_fsm_new(&n);
    if (rv == 0) {
        struct ida__rbuf r = {data, data + job.len};
        rv = dec_state(n, r, helper != NULL ? &wrapped : NULL);
    }
    lent_wait(&l);
    if (job.sum != sum) {
        rv = CORRUPT; /* whatever the decoding made of the bytes */
    }
    if (rv != 0) {
        ida_fsm_free(n);
        return rv;
    }
    ida_fsm_replace(f, n); /* @f takes the new state, the old is freed */
    return 0;
}
