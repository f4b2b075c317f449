/* Bounded pools: lowest free id of [0, size) with tags.
 *
 * The lowest free id comes from a counting interval tree: a binary tree over
 * [0, N) with the count of taken ids in each inner node, searched by
 * descending into the left child while it is not full. Here the bottom 12
 * levels of that tree are a 4096-bit bitmap per chunk (cheaper than counts
 * for single ids), and the levels above are an implicit array tree of
 * counts over chunks. Only the chunks up to the highest held id are
 * indexed, and only non-empty chunks are allocated, so memory follows the
 * allocations, not the size. Everything is in one replica's memory, so no
 * write order has to survive a crash: a command applies atomically
 * (validate and allocate first, then mutate). */
#include "fsm/fsm_internal.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

static const uint8_t *bounded_key(const void *ctx, uint32_t ref, size_t *len)
{
    const uint8_t *rec = ida__bounded_tag(ctx, ref);
    *len = ida__tagrec_len(rec);
    return rec + 1;
}

void ida__bounded_init(struct ida__bounded *b, uint64_t size)
{
    memset(b, 0, sizeof(*b));
    b->size = size;
    ida__tagtab_init(&b->tab, bounded_key, b);
}

void ida__bounded_close(struct ida__bounded *b)
{
    for (uint64_t c = 0; c < b->leaves; c++) {
        ida_free(b->chunks[c]); /* records go with the slab */
    }
    ida__slab_close(&b->slab);
    ida_free(b->chunks);
    ida_free(b->tree);
    ida__tagtab_close(&b->tab);
    memset(b, 0, sizeof(*b));
}

const uint8_t *ida__bounded_tag(const struct ida__bounded *b, uint64_t id)
{
    uint64_t c = id >> IDA__CHUNK_SHIFT;
    IDA_ASSERT(c < b->leaves && b->chunks[c] != NULL);
    const uint8_t *rec = b->chunks[c]->tags[id & (IDA__CHUNK_IDS - 1)];
    IDA_ASSERT(rec != NULL);
    return rec;
}

static bool is_held(const struct ida__bounded *b, uint64_t id)
{
    uint64_t c = id >> IDA__CHUNK_SHIFT;
    if (c >= b->leaves || b->chunks[c] == NULL) {
        return false;
    }
    unsigned bit = (unsigned)(id & (IDA__CHUNK_IDS - 1));
    return (b->chunks[c]->bits[bit / 64] >> (bit % 64)) & 1;
}

uint64_t ida__bounded_lowest_free(const struct ida__bounded *b)
{
    if (b->leaves == 0) {
        return 0;
    }
    uint64_t span = b->leaves * IDA__CHUNK_IDS;
    if (b->tree[1] == span) {
        return span; /* every indexed chunk is full */
    }
    uint64_t node = 1;
    while (node < b->leaves) {
        span /= 2;
        node = b->tree[2 * node] < span ? 2 * node : 2 * node + 1;
    }
    uint64_t c = node - b->leaves;
    const struct ida__chunk *ch = b->chunks[c];
    if (ch == NULL) {
        return c * IDA__CHUNK_IDS;
    }
    IDA_ASSERT(ch->full_words != UINT64_MAX);
    unsigned w = (unsigned)__builtin_ctzll(~ch->full_words);
    unsigned bit = (unsigned)__builtin_ctzll(~ch->bits[w]);
    return c * IDA__CHUNK_IDS + w * 64 + bit;
}

/* Make chunk @c indexed and allocated. 0 or IDA_ENOMEM; on error the
 * logical state is unchanged (an empty chunk may stay allocated). */
static int prepare_chunk(struct ida__bounded *b, uint64_t c)
{
    if (c >= b->leaves) {
        uint64_t n = b->leaves == 0 ? 1 : b->leaves;
        while (n <= c) {
            n *= 2;
        }
        struct ida__chunk **nc = ida_calloc(n, sizeof(*nc));
        uint32_t *nt = ida_calloc(2 * n, sizeof(*nt));
        if (nc == NULL || nt == NULL) {
            ida_free(nc);
            ida_free(nt);
            return IDA_ENOMEM;
        }
        if (b->leaves > 0) {
            memcpy(nc, b->chunks, b->leaves * sizeof(*nc));
            for (uint64_t i = 0; i < b->leaves; i++) {
                nt[n + i] = b->tree[b->leaves + i];
            }
        }
        for (uint64_t i = n - 1; i >= 1; i--) {
            nt[i] = nt[2 * i] + nt[2 * i + 1];
        }
        ida_free(b->chunks);
        ida_free(b->tree);
        b->chunks = nc;
        b->tree = nt;
        b->leaves = n;
    }
    if (b->chunks[c] == NULL) {
        /* Zeroed by writing, as a tag table is (tagtab.c): mark() reads a
         * word before writing it. */
        b->chunks[c] = ida_malloc(sizeof(struct ida__chunk));
        if (b->chunks[c] == NULL) {
            return IDA_ENOMEM;
        }
        memset(b->chunks[c], 0, sizeof(struct ida__chunk));
    }
    return 0;
}

static void tree_add(struct ida__bounded *b, uint64_t c, int delta)
{
    for (uint64_t n = b->leaves + c; n >= 1; n /= 2) {
        b->tree[n] = (uint32_t)((int64_t)b->tree[n] + delta);
    }
}

/* Mark @id held by @rec in its chunk @ch (the bits and the record; not
 * the count tree). */
static void mark(struct ida__chunk *ch, uint64_t id, uint8_t *rec)
{
    unsigned bit = (unsigned)(id & (IDA__CHUNK_IDS - 1));
    IDA_ASSERT(ch->tags[bit] == NULL);
    ch->bits[bit / 64] |= UINT64_C(1) << (bit % 64);
    if (ch->bits[bit / 64] == UINT64_MAX) {
        ch->full_words |= UINT64_C(1) << (bit / 64);
    }
    ch->tags[bit] = rec;
}

/* Take @id (free, chunk prepared) for @rec; the caller indexes its tag. */
static void take(struct ida__bounded *b, uint64_t id, uint8_t *rec)
{
    uint64_t c = id >> IDA__CHUNK_SHIFT;
    mark(b->chunks[c], id, rec);
    tree_add(b, c, 1);
    b->held++;
    IDA_ASSERT(b->tree[1] == b->held);
}

uint32_t ida__bounded_find(const struct ida__bounded *b,
                           const char *tag,
                           size_t len)
{
    return ida__tagtab_find(&b->tab, (const uint8_t *)tag, len);
}

int ida__bounded_alloc(struct ida__bounded *b,
                       const char *tag,
                       size_t len,
                       uint64_t hash,
                       uint64_t *id,
                       bool *existed)
{
    uint32_t ref =
        ida__tagtab_find_hashed(&b->tab, (const uint8_t *)tag, len, hash);
    if (ref != IDA__REF_NONE) {
        *id = ref;
        *existed = true;
        return IDA__R_OK;
    }
    uint64_t cand = ida__bounded_lowest_free(b);
    if (cand >= b->size || b->held >= IDA_BOUNDED_HELD_MAX) {
        return IDA__R_BOUNDED_FULL;
    }
    /* Lowest-free-first: the candidate is at most the number held. */
    IDA_ASSERT(cand <= b->held);
    if (prepare_chunk(b, cand >> IDA__CHUNK_SHIFT) != 0 ||
        ida__tagtab_reserve(&b->tab) != 0) {
        return -IDA_ENOMEM;
    }
    uint8_t *rec = ida__tagrec_new(&b->slab, tag, len);
    if (rec == NULL) {
        return -IDA_ENOMEM;
    }
    take(b, cand, rec);
    ida__tagtab_insert_hashed(&b->tab, (uint32_t)cand, hash);
    *id = cand;
    *existed = false;
    return IDA__R_OK;
}

int ida__bounded_prepare(struct ida__bounded *b, uint64_t id)
{
    IDA_ASSERT(id < b->size);
    return prepare_chunk(b, id >> IDA__CHUNK_SHIFT);
}

int ida__bounded_fill(struct ida__bounded *b, uint64_t id, uint8_t *rec)
{
    uint64_t c = id >> IDA__CHUNK_SHIFT;
    /* Indexed by ida__bounded_prepare(): this only allocates the chunk. */
    IDA_ASSERT(id < b->size && c < b->leaves);
    if (prepare_chunk(b, c) != 0) {
        return IDA_ENOMEM;
    }
    mark(b->chunks[c], id, rec);
    return 0;
}

void ida__bounded_recount(struct ida__bounded *b)
{
    for (uint64_t c = 0; c < b->leaves; c++) {
        uint32_t n = 0;
        const struct ida__chunk *ch = b->chunks[c];
        for (unsigned w = 0; ch != NULL && w < IDA__CHUNK_WORDS; w++) {
            n += (uint32_t)__builtin_popcountll(ch->bits[w]);
        }
        b->tree[b->leaves + c] = n;
    }
    for (uint64_t i = b->leaves - 1; i >= 1; i--) {
        b->tree[i] = b->tree[2 * i] + b->tree[2 * i + 1];
    }
    b->held = b->leaves > 0 ? b->tree[1] : 0;
    b->tab.used = b->held; /* one tag per held id */
}

int ida__bounded_free(struct ida__bounded *b,
                      uint64_t id,
                      const char *tag,
                      size_t len,
                      uint64_t hash,
                      bool *freed)
{
    if (id >= b->size) {
        return IDA__R_ID_RANGE;
    }
    if (!is_held(b, id)) {
        *freed = false; /* idempotent: a repeated free finds it free */
        return IDA__R_OK;
    }
    const uint8_t *rec = ida__bounded_tag(b, id);
    if (ida__tagrec_len(rec) != len || memcmp(rec + 1, tag, len) != 0) {
        return IDA__R_TAG_MISMATCH;
    }
    /* Remove from the index while the key is still readable. */
    ida__tagtab_remove_hashed(&b->tab, (uint32_t)id, hash);
    uint64_t c = id >> IDA__CHUNK_SHIFT;
    struct ida__chunk *ch = b->chunks[c];
    unsigned bit = (unsigned)(id & (IDA__CHUNK_IDS - 1));
    ch->bits[bit / 64] &= ~(UINT64_C(1) << (bit % 64));
    ch->full_words &= ~(UINT64_C(1) << (bit / 64));
    ida__tagrec_free(&b->slab, ch->tags[bit]);
    ch->tags[bit] = NULL;
    tree_add(b, c, -1);
    b->held--;
    if (b->tree[b->leaves + c] == 0) {
        ida_free(ch); /* memory follows the allocations */
        b->chunks[c] = NULL;
    }
    IDA_ASSERT(!is_held(b, id));
    *freed = true;
    return IDA__R_OK;
}

uint64_t ida__bounded_next_held(const struct ida__bounded *b, uint64_t from)
{
    for (uint64_t c = from >> IDA__CHUNK_SHIFT; c < b->leaves; c++) {
        const struct ida__chunk *ch = b->chunks[c];
        if (ch == NULL) {
            continue;
        }
        unsigned first = 0;
        if (c == from >> IDA__CHUNK_SHIFT) {
            first = (unsigned)(from & (IDA__CHUNK_IDS - 1));
        }
        for (unsigned w = first / 64; w < IDA__CHUNK_WORDS; w++) {
            uint64_t word = ch->bits[w];
            if (w == first / 64) {
                word &= UINT64_MAX << (first % 64);
            }
            if (word != 0) {
                return c * IDA__CHUNK_IDS + w * 64 +
                       (unsigned)__builtin_ctzll(word);
            }
        }
    }
    return UINT64_MAX;
}
