/* Holdings: the bulk load of a bounded pool's holdings (snap_hold.h). */
#include "fsm/snap_hold.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

#define CORRUPT IDA_ECORRUPT

uint64_t ida__hold_batch = IDA__HOLD_BATCH;

uint64_t ida__hold_id(struct ida__rbuf r)
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

/* The Holding in @r as the encoder writes it: the id (field 1, a varint of
 * at most 9 bytes), then the tag (field 2, a length below 128), nothing
 * else. 1 with *@id and *@tag set; 0 for any other layout, which the
 * general loop of take_holding() then reads. For a layout taken here that
 * loop would give the same id and tag (protobuf's rules leave no other
 * reading), so this only saves the general reader's work: at 10 M holdings
 * the id, a varint of 3 or 4 bytes, sent every holding through the out of
 * line ida__r_field_any() and its fields through memory. */
static inline int holding_plain(struct ida__rbuf r,
                                uint64_t *id,
                                struct ida__rbuf *tag)
{
    const uint8_t *p = r.p, *end = r.end;
    if (end - p < 4 || p[0] != ((1u << 3) | IDA__WT_VARINT)) {
        return 0;
    }
    p++;
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
        if (p == end || shift > 56) {
            return 0;
        }
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            break;
        }
    }
    if (end - p < 2 || p[0] != ((2u << 3) | IDA__WT_LEN) || p[1] >= 0x80 ||
        p[1] != end - p - 2) {
        return 0;
    }
    *id = v;
    tag->p = p + 2;
    tag->end = end;
    return 1;
}

/* Take the Holding in @r: its record into the share's slab and its id
 * into the pool; *@word is its tag's slot word. */
static int take_holding(struct ida__hold_share *sh,
                        struct ida__rbuf r,
                        uint64_t *word)
{
    uint64_t id = 0;
    struct ida__rbuf tag = {NULL, NULL};
    int k = 0;
    if (!holding_plain(r, &id, &tag)) {
        struct ida__field f;
        while ((k = ida__r_field(&r, &f)) == 1) {
            if (f.num == 1 && f.type == IDA__WT_VARINT) {
                id = f.v;
            } else if (f.num == 2 && f.type == IDA__WT_LEN) {
                tag = f.sub;
            }
        }
    }
    struct ida__bounded *b = sh->k->b;
    if (k < 0 || tag.p == NULL || id < sh->next || id > sh->hi ||
        id >= b->size || id >= IDA_BOUNDED_HELD_MAX ||
        !ida__hold_tag_ok(&tag)) {
        return CORRUPT;
    }
    /* Streamed, the index grows as ids come (the restore prepared it for
     * the last id at once: the same index in the end). */
    if (sh->streamed && id >> IDA__CHUNK_SHIFT >= b->leaves &&
        ida__bounded_prepare(b, id) != 0) {
        return IDA_ENOMEM;
    }
    size_t n = (size_t)(tag.end - tag.p);
    uint8_t *rec = ida__tagrec_new(&sh->slab, (const char *)tag.p, n);
    if (rec == NULL || ida__bounded_fill(b, id, rec) != 0) {
        return IDA_ENOMEM; /* a record not taken stays in the slab */
    }
    *word = ida__tagtab_word((uint32_t)id, ida__hash(tag.p, n));
    sh->next = id + 1;
    return 0;
}

/* The streamed share's own words array, twice as long (at first room for
 * 64 Ki words): it grows with the holdings that came, not with what the
 * bytes announce. 0 or IDA_ENOMEM. */
static int grow_words(struct ida__hold_share *sh)
{
    uint64_t n = sh->n > 0 ? 2 * sh->n : 65536;
    uint64_t *w = ida_realloc(sh->words, n * sizeof(*w));
    if (w == NULL) {
        return IDA_ENOMEM;
    }
    sh->words = w;
    sh->n = n;
    return 0;
}

/* Room for @n more words in k->grouped and a batch more in k->batches.
 * 0 or IDA_ENOMEM. */
static int batch_room(struct ida__hold_bulk *k, uint64_t n)
{
    const size_t row = IDA__TAGTAB_REGIONS + 1;
    if (k->grouped_n + n > k->grouped_cap) {
        /* Twice as long, or as long as needed: a pool grouped once, as
         * it settles, takes 8 bytes a holding. */
        uint64_t cap = 2 * k->grouped_cap;
        if (cap < k->grouped_n + n) {
            cap = k->grouped_n + n;
        }
        uint64_t *g = ida_realloc(k->grouped, cap * sizeof(*g));
        if (g == NULL) {
            return IDA_ENOMEM;
        }
        ida_heap_hint_huge(g, cap * sizeof(*g));
        k->grouped = g;
        k->grouped_cap = cap;
    }
    if (k->batches_n == k->batches_cap) {
        uint64_t cap = k->batches_cap > 0 ? 2 * k->batches_cap : 1;
        uint64_t *b = ida_realloc(k->batches, cap * row * sizeof(*b));
        if (b == NULL) {
            return IDA_ENOMEM;
        }
        k->batches = b;
        k->batches_cap = cap;
    }
    if (k->cursor == NULL) {
        k->cursor = ida_malloc(IDA__TAGTAB_REGIONS * sizeof(*k->cursor));
        if (k->cursor == NULL) {
            return IDA_ENOMEM;
        }
    }
    return 0;
}

/* Group the streamed share's words not grouped yet (the first ones of
 * its array) by region onto the end of k->grouped, as a batch (a counting
 * sort); its array then takes the next ones from its start. 0 or
 * IDA_ENOMEM (nothing changed). */
static int group_batch(struct ida__hold_share *sh)
{
    struct ida__hold_bulk *k = sh->k;
    uint64_t n = sh->taken - k->flushed;
    if (batch_room(k, n) != 0) {
        return IDA_ENOMEM;
    }
    uint64_t *start = k->batches + k->batches_n * (IDA__TAGTAB_REGIONS + 1);
    uint64_t *c = k->cursor;
    memset(c, 0, IDA__TAGTAB_REGIONS * sizeof(*c));
    for (uint64_t i = 0; i < n; i++) {
        c[ida__tagtab_region_full(sh->words[i])]++;
    }
    uint64_t at = k->grouped_n;
    for (unsigned g = 0; g < IDA__TAGTAB_REGIONS; g++) {
        start[g] = at;
        at += c[g];
        c[g] = start[g];
    }
    start[IDA__TAGTAB_REGIONS] = at;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w = sh->words[i];
        k->grouped[c[ida__tagtab_region_full(w)]++] = w;
    }
    k->grouped_n = at;
    k->batches_n++;
    k->flushed = sh->taken;
    return 0;
}

/* Keep the streamed share's word @w of its next holding: in its array,
 * which doubles from 65536 words until it has room for ida__hold_batch
 * words or more, then is grouped as a batch each time it is full. */
static int keep_streamed(struct ida__hold_share *sh, uint64_t w)
{
    uint64_t at = sh->taken - sh->k->flushed;
    if (at == sh->n) {
        IDA_ASSERT(ida__hold_batch >= IDA__HOLD_SPLIT_MIN);
        int rv = sh->n < ida__hold_batch ? grow_words(sh) : group_batch(sh);
        if (rv != 0) {
            return rv;
        }
        at = sh->taken - sh->k->flushed;
    }
    sh->words[at] = w;
    return 0;
}

/* DECODE of @sh's fields before @avail (its end at the most). 1: all its
 * fields taken, 0: a field lies across @avail, or an error. */
static int decode_upto(struct ida__hold_share *sh, const uint8_t *avail)
{
    const struct ida__tagtab *t = &sh->k->b->tab;
    if (avail < sh->r.p) {
        return 0; /* nothing of it came yet */
    }
    bool cut_short = avail < sh->r.end;
    struct ida__rbuf v = {sh->r.p, cut_short ? avail : sh->r.end};
    struct ida__field f;
    for (;;) {
        const uint8_t *at = v.p;
        int k = ida__r_field(&v, &f);
        if (k == 0) {
            break;
        }
        if (k < 0) {
            if (!cut_short) {
                return CORRUPT;
            }
            v.p = at; /* whole once more bytes came */
            break;
        }
        if (f.num != 2 || f.type != IDA__WT_LEN) {
            if (sh->streamed) {
                return CORRUPT;
            }
            continue;
        }
        if (!sh->streamed && sh->taken == sh->n) {
            return CORRUPT; /* more than counted */
        }
        uint64_t w;
        int rv = take_holding(sh, f.sub, &w);
        if (rv == 0 && sh->streamed) {
            rv = keep_streamed(sh, w);
        } else if (rv == 0) {
            sh->words[sh->taken] = w;
            sh->count[ida__tagtab_region(t, w)]++;
        }
        if (rv != 0) {
            return rv;
        }
        sh->taken++;
    }
    sh->r.p = v.p;
    if (sh->r.p != sh->r.end) {
        return 0;
    }
    return sh->taken == sh->n || sh->streamed ? 1 : CORRUPT;
}

/* Insert the words of the share's regions, the slots of the next region
 * loading into the cache while those of one are written. */
static int run_insert(struct ida__hold_share *sh)
{
    struct ida__hold_bulk *k = sh->k;
    struct ida__tagtab *t = &k->b->tab;
    uint64_t span = t->cap / k->regions;
    unsigned per = k->regions / k->parts;
    /* The words, and where each region's begin: batch after batch when
     * grouped as they came (streamed), else the one array GROUP made. */
    bool streamed = k->grouped != NULL;
    const uint64_t *w = streamed ? k->grouped : k->sorted;
    const uint64_t *starts = streamed ? k->batches : k->start;
    uint64_t batches = streamed ? k->batches_n : 1;
    for (unsigned g = per * sh->part; g < per * (sh->part + 1); g++) {
        uint64_t next = (uint64_t)(g + 1) * span;
        if (next < t->cap) {
            ida__tagtab_prefetch_range(t, next, next + span);
        }
        for (uint64_t j = 0; j < batches; j++) {
            const uint64_t *s = starts + j * (IDA__TAGTAB_REGIONS + 1);
            for (uint64_t i = s[g]; i < s[g + 1]; i++) {
                if (!ida__tagtab_insert_word_shared(t, w[i])) {
                    return CORRUPT; /* a tag held twice */
                }
            }
        }
    }
    return 0;
}

/* One phase of a share (a thread's whole work until the next join). */
static void run_share(void *arg)
{
    struct ida__hold_share *sh = arg;
    struct ida__hold_bulk *k = sh->k;
    switch (sh->phase) {
        case IDA__HOLD_DECODE: {
            int rv = decode_upto(sh, sh->r.end);
            sh->rv = rv == 1 ? 0 : rv;
            break;
        }
        case IDA__HOLD_GROUP: {
            const struct ida__tagtab *t = &k->b->tab;
            for (uint64_t i = 0; i < sh->n; i++) {
                uint64_t w = sh->words[i];
                k->sorted[sh->count[ida__tagtab_region(t, w)]++] = w;
            }
            break;
        }
        case IDA__HOLD_CLEAR: {
            uint64_t per = k->b->tab.cap / k->parts;
            ida__tagtab_bulk_clear(&k->b->tab, per * sh->part,
                                   per * (sh->part + 1));
            break;
        }
        case IDA__HOLD_INSERT:
            sh->rv = run_insert(sh);
            break;
    }
}

/* Run @phase of the shares, the second on the lent thread when there is
 * one; the first error of the shares, or 0. */
static int run_phase(struct ida__hold_load *L,
                     enum ida__hold_phase phase,
                     const struct ida_fsm_helper *helper)
{
    struct ida__hold_share *sh = L->sh;
    for (int i = 0; i < L->shares; i++) {
        sh[i].phase = phase;
        sh[i].rv = 0;
    }
    bool helped = L->shares == 2 && helper != NULL &&
                  helper->start(helper->ctx, run_share, &sh[1]) == 0;
    run_share(&sh[0]);
    if (helped) {
        helper->join(helper->ctx);
    } else if (L->shares == 2) {
        run_share(&sh[1]);
    }
    return sh[0].rv != 0 ? sh[0].rv : L->shares == 2 ? sh[1].rv : 0;
}

/* The table's scratch and the arrays for @L->holdings holdings. */
static int bulk_alloc(struct ida__hold_load *L)
{
    struct ida__hold_bulk *k = &L->k;
    k->scratch = ida__tagtab_bulk_begin(&k->b->tab, L->holdings);
    /* As many regions as the table has, up to IDA__TAGTAB_REGIONS: a small
     * pool's counts are small. */
    k->regions = k->scratch != NULL ? ida__tagtab_regions(&k->b->tab) : 1;
    /* start, then each share's counts. */
    k->start = ida_calloc(3 * (size_t)k->regions + 1, sizeof(*k->start));
    k->sorted = ida_malloc_huge(L->holdings * sizeof(*k->sorted));
    if (k->scratch == NULL || k->start == NULL || k->sorted == NULL) {
        return IDA_ENOMEM;
    }
    L->sh[0].count = k->start + k->regions + 1;
    L->sh[1].count = k->start + 2 * (size_t)k->regions + 1;
    return 0;
}

int ida__hold_begin(struct ida__hold_load *L,
                    struct ida__bounded *b,
                    struct ida__rbuf r,
                    uint64_t holdings,
                    uint64_t max_id)
{
    memset(L, 0, sizeof(*L));
    L->k.b = b;
    L->holdings = holdings;
    L->shares = 1;
    L->sh[0] = (struct ida__hold_share){
        .k = &L->k, .r = r, .hi = max_id, .slab.bulk = true};
    L->sh[1] =
        (struct ida__hold_share){.k = &L->k, .part = 1, .slab.bulk = true};
    int rv = bulk_alloc(L);
    L->sh[0].words = L->k.scratch;
    L->sh[0].n = holdings;
    return rv;
}

int ida__hold_begin_streamed(struct ida__hold_load *L,
                             struct ida__bounded *b,
                             struct ida__rbuf r)
{
    memset(L, 0, sizeof(*L));
    L->k.b = b;
    L->shares = 1;
    L->sh[0] = (struct ida__hold_share){.k = &L->k,
                                        .r = r,
                                        .hi = UINT64_MAX,
                                        .streamed = true,
                                        .slab.bulk = true};
    L->sh[1] =
        (struct ida__hold_share){.k = &L->k, .part = 1, .slab.bulk = true};
    L->own = true;
    return 0;
}

int ida__hold_settle(struct ida__hold_load *L)
{
    struct ida__hold_share *a = &L->sh[0];
    struct ida__hold_bulk *k = &L->k;
    L->holdings = a->taken;
    if (L->holdings >= IDA__HOLD_SPLIT_MIN) {
        /* Grouped as they came but the last batch; then only the table,
         * which at IDA__HOLD_SPLIT_MIN holdings or more has every region. */
        if (group_batch(a) != 0) {
            return IDA_ENOMEM;
        }
        ida_free(a->words);
        a->words = NULL;
        L->own = false;
        k->scratch = ida__tagtab_bulk_begin(&k->b->tab, L->holdings);
        if (k->scratch == NULL) {
            return IDA_ENOMEM;
        }
        k->regions = ida__tagtab_regions(&k->b->tab);
        IDA_ASSERT(k->regions == IDA__TAGTAB_REGIONS);
        L->shares = 2;
        return 0;
    }
    int rv = bulk_alloc(L);
    if (rv != 0) {
        return rv;
    }
    /* Fewer than IDA__HOLD_SPLIT_MIN: one share. */
    uint64_t n = L->holdings;
    const struct ida__tagtab *t = &L->k.b->tab;
    uint64_t *to = L->k.scratch, *own = a->words;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w = own[i];
        to[i] = w;
        a->count[ida__tagtab_region(t, w)]++;
    }
    ida_free(own);
    L->own = false;
    a->words = to;
    a->n = n;
    L->shares = 1;
    return 0;
}

void ida__hold_cut(struct ida__hold_load *L,
                   const uint8_t *cut,
                   uint64_t cut_id,
                   uint64_t n0)
{
    struct ida__hold_share *a = &L->sh[0], *b = &L->sh[1];
    b->r = (struct ida__rbuf){cut, a->r.end};
    b->lo = b->next = cut_id;
    b->hi = a->hi;
    b->words = a->words + n0;
    b->n = L->holdings - n0;
    a->r.end = cut;
    a->hi = cut_id - 1 < a->hi ? cut_id - 1 : a->hi;
    a->n = n0;
    L->shares = 2;
}

int ida__hold_decode(struct ida__hold_load *L,
                     const struct ida_fsm_helper *helper)
{
    return run_phase(L, IDA__HOLD_DECODE, helper);
}

int ida__hold_decode_upto(struct ida__hold_load *L, const uint8_t *avail)
{
    return decode_upto(&L->sh[0], avail);
}

int ida__hold_end(struct ida__hold_load *L,
                  int rv,
                  const struct ida_fsm_helper *helper)
{
    struct ida__hold_bulk *k = &L->k;
    struct ida__hold_share *sh = L->sh;
    if (rv == 0 && k->grouped != NULL) {
        k->parts = (unsigned)L->shares; /* grouped as they came */
        run_phase(L, IDA__HOLD_CLEAR, helper);
        rv = run_phase(L, IDA__HOLD_INSERT, helper);
    } else if (rv == 0) {
        /* Each region's words: the first share's, then the second's. */
        uint64_t at = 0;
        for (unsigned g = 0; g < k->regions; g++) {
            k->start[g] = at;
            for (int i = 0; i < L->shares; i++) {
                uint64_t c = sh[i].count[g];
                sh[i].count[g] = at;
                at += c;
            }
        }
        k->start[k->regions] = at; /* == holdings: each share took its n */
        k->parts = (unsigned)L->shares;
        run_phase(L, IDA__HOLD_GROUP, helper);
        run_phase(L, IDA__HOLD_CLEAR, helper);
        rv = run_phase(L, IDA__HOLD_INSERT, helper);
    } else if (k->scratch != NULL && k->grouped == NULL) {
        /* Never left holding words (only the first @holdings slots took
         * any). Grouped as they came, the scratch took none, and the
         * table is only freed (ida__tagtab_close()): at ten million
         * holdings, clearing it would fault in 128 MiB for nothing. */
        ida__tagtab_bulk_clear(&k->b->tab, 0, L->holdings);
    }
    ida_free(k->grouped);
    ida_free(k->batches);
    ida_free(k->cursor);
    k->grouped = k->batches = k->cursor = NULL;
    for (int i = 0; i < 2; i++) {
        ida__slab_merge(&k->b->slab, &sh[i].slab);
    }
    ida_free(k->sorted);
    ida_free(k->start);
    if (L->own) {
        ida_free(sh[0].words);
        sh[0].words = NULL;
        L->own = false;
    }
    k->sorted = k->start = k->scratch = NULL;
    return rv;
}
