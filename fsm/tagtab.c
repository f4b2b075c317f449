/* Open-addressing table of 32-bit refs keyed by bytes read back through a
 * callback (linear probing, backward-shift deletion: no tombstones).
 *
 * A slot is 64 bits: the high 32 bits of the key's hash and ref + 1. The
 * stored hash picks the home slot, so growing and deleting never read keys
 * back (each read is a cache miss or three at 10 million entries), and a
 * probe only reads a key back when the 32 hash bits match. */
#include "fsm/fsm_internal.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

/* One word of the key into the running hash. */
static inline uint64_t hash_word(uint64_t h, uint64_t w)
{
    w *= UINT64_C(0x9e3779b97f4a7c15);
    w ^= w >> 32;
    return (h ^ w) * UINT64_C(0xff51afd7ed558ccd);
}

/* The tables' hash: eight bytes at a time, then a final mix so linear
 * probing sees well-spread low bits. In memory only (a table's layout never
 * shows in answers or snapshots), so it may change between versions; it is
 * not ida__hash_stable(), whose values are kept in snapshots. Byte-wise
 * FNV-1a cost restore a third of its hashing time at 10M tags. */
uint64_t ida__hash(const uint8_t *key, size_t len)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325) ^ (uint64_t)len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        h = hash_word(h, ida__load_le64(key + i));
    }
    if (i < len) {
        uint8_t tail[8] = {0};
        memcpy(tail, key + i, len - i);
        h = hash_word(h, ida__load_le64(tail));
    }
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

/* FNV-1a and a final mix. Its values are kept in snapshots (the sessions'
 * fingerprints, fsm/session.c): it must never change. */
uint64_t ida__hash_stable(const uint8_t *key, size_t len)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < len; i++) {
        h ^= key[i];
        h *= UINT64_C(0x100000001b3);
    }
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

void ida__tagtab_init(struct ida__tagtab *t,
                      ida__key_of_fn key_of,
                      const void *ctx)
{
    memset(t, 0, sizeof(*t));
    t->key_of = key_of;
    t->ctx = ctx;
}

void ida__tagtab_close(struct ida__tagtab *t)
{
    ida_free(t->slots);
    t->slots = NULL;
    t->cap = 0;
    t->used = 0;
}

#define SLOT_REF(s)         ((uint32_t)(s)-1)
#define SLOT_H32(s)         ((uint32_t)((s) >> 32))
#define MAKE_SLOT(h32, ref) (((uint64_t)(h32) << 32) | ((uint64_t)(ref) + 1))

static uint64_t home(const struct ida__tagtab *t, uint32_t h32)
{
    return ida__tagtab_home(t, h32);
}

static uint32_t h32_of(const struct ida__tagtab *t, uint32_t ref)
{
    size_t len;
    const uint8_t *k = t->key_of(t->ctx, ref, &len);
    return (uint32_t)(ida__hash(k, len) >> 32);
}

/* Probe for @key, whose hash has high bits @h32 (cap > 0): its ref, or
 * IDA__REF_NONE with @*end the empty slot that ended the probe. */
static uint32_t probe(const struct ida__tagtab *t,
                      const uint8_t *key,
                      size_t len,
                      uint32_t h32,
                      uint64_t *end)
{
    uint64_t mask = t->cap - 1;
    uint64_t i = home(t, h32);
    for (; t->slots[i] != 0; i = (i + 1) & mask) {
        uint64_t s = t->slots[i];
        if (SLOT_H32(s) != h32) {
            continue;
        }
        size_t klen;
        const uint8_t *k = t->key_of(t->ctx, SLOT_REF(s), &klen);
        if (klen == len && memcmp(k, key, len) == 0) {
            return SLOT_REF(s);
        }
    }
    *end = i;
    return IDA__REF_NONE;
}

uint32_t ida__tagtab_find(const struct ida__tagtab *t,
                          const uint8_t *key,
                          size_t len)
{
    return ida__tagtab_find_hashed(t, key, len, ida__hash(key, len));
}

uint32_t ida__tagtab_find_hashed(const struct ida__tagtab *t,
                                 const uint8_t *key,
                                 size_t len,
                                 uint64_t hash)
{
    if (t->cap == 0) {
        return IDA__REF_NONE;
    }
    uint64_t end;
    return probe(t, key, len, (uint32_t)(hash >> 32), &end);
}

static void place(struct ida__tagtab *t, uint64_t slot)
{
    uint64_t mask = t->cap - 1;
    uint64_t i = home(t, SLOT_H32(slot));
    while (t->slots[i] != 0) {
        i = (i + 1) & mask;
    }
    t->slots[i] = slot;
}

/* Slots for @keys keys at a load of at most 0.7 (so probes stay short):
 * the least power of two from @cap0 up, in *@cap; NULL when out of memory.
 * Not zeroed. */
static uint64_t *new_slots(uint64_t keys, uint64_t cap0, uint64_t *cap)
{
    uint64_t c = cap0;
    while (keys * 10 > c * 7) {
        c *= 2;
    }
    *cap = c;
    return c <= SIZE_MAX / sizeof(uint64_t)
               ? ida_malloc_huge(c * sizeof(uint64_t))
               : NULL;
}

int ida__tagtab_reserve(struct ida__tagtab *t)
{
    return ida__tagtab_reserve_n(t, 1);
}

int ida__tagtab_reserve_n(struct ida__tagtab *t, uint64_t n)
{
    if ((t->used + n) * 10 <= t->cap * 7) {
        return 0;
    }
    /* Zeroed by writing, not by calloc's fresh pages: probes read a slot
     * before an insert writes it, and a page first read is mapped to the
     * zero page and faulted again when written, which in a process with
     * other threads running costs a TLB shootdown (an IPI to every CPU).
     * That was a tenth of a restart's rebuild at ten million tags. */
    uint64_t ncap;
    uint64_t *ns = new_slots(t->used + n, t->cap == 0 ? 16 : t->cap * 2, &ncap);
    if (ns == NULL) {
        return IDA_ENOMEM;
    }
    memset(ns, 0, ncap * sizeof(*ns));
    uint64_t *old = t->slots;
    uint64_t ocap = t->cap;
    t->slots = ns;
    t->cap = ncap;
    for (uint64_t i = 0; i < ocap; i++) {
        if (old[i] != 0) {
            place(t, old[i]);
        }
    }
    ida_free(old);
    return 0;
}

void ida__tagtab_insert(struct ida__tagtab *t, uint32_t ref)
{
    IDA_ASSERT(ref != IDA__REF_NONE);
    IDA_ASSERT((t->used + 1) * 10 <= t->cap * 7);
    place(t, MAKE_SLOT(h32_of(t, ref), ref));
    t->used++;
}

void ida__tagtab_insert_hashed(struct ida__tagtab *t,
                               uint32_t ref,
                               uint64_t hash)
{
    IDA_ASSERT(ref != IDA__REF_NONE);
    IDA_ASSERT((t->used + 1) * 10 <= t->cap * 7);
    place(t, MAKE_SLOT((uint32_t)(hash >> 32), ref));
    t->used++;
}

void ida__tagtab_prefetch(const struct ida__tagtab *t, uint64_t hash)
{
    if (t->cap > 0) {
        __builtin_prefetch(&t->slots[home(t, (uint32_t)(hash >> 32))], 1);
    }
}

/* --- bulk loading (restore) ---------------------------------------------
 *
 * Inserted one by one in id order, ten million keys land at random slots of
 * a table far larger than the caches: each insert is a cache miss and a TLB
 * miss. Bulk loading sorts the keys' slot words by the region of the table
 * their home slot lies in (IDA__TAGTAB_REGIONS equal regions, a counting
 * sort the caller does with ida__tagtab_region()) and inserts them region by
 * region: each probe then reads lines the inserts before it just wrote. The
 * order of inserts changes where a key sits in its probe run, not whether it
 * is found (linear probing finds a key anywhere between its home and the
 * next empty slot). */

uint64_t ida__tagtab_word(uint32_t ref, uint64_t hash)
{
    IDA_ASSERT(ref != IDA__REF_NONE);
    return MAKE_SLOT((uint32_t)(hash >> 32), ref);
}

uint64_t *ida__tagtab_bulk_begin(struct ida__tagtab *t, uint64_t n)
{
    IDA_ASSERT(t->cap == 0 && t->used == 0);
    uint64_t cap;
    uint64_t *ns = new_slots(n, 16, &cap);
    if (ns == NULL) {
        return NULL;
    }
    t->slots = ns;
    t->cap = cap;
    return ns;
}

void ida__tagtab_bulk_clear(struct ida__tagtab *t, uint64_t lo, uint64_t hi)
{
    IDA_ASSERT(lo <= hi && hi <= t->cap);
    memset(t->slots + lo, 0, (size_t)(hi - lo) * sizeof(*t->slots));
}

bool ida__tagtab_insert_word_shared(struct ida__tagtab *t, uint64_t word)
{
    IDA_ASSERT(word != 0 && t->cap > 0);
    uint32_t h32 = SLOT_H32(word);
    uint64_t mask = t->cap - 1;
    /* Ends: ida__tagtab_bulk_begin() sized the table for every insert of
     * every thread. */
    for (uint64_t i = home(t, h32);; i = (i + 1) & mask) {
        uint64_t s = __atomic_load_n(&t->slots[i], __ATOMIC_RELAXED);
        if (s == 0 &&
            __atomic_compare_exchange_n(&t->slots[i], &s, word, false,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return true;
        }
        /* Full (or claimed just now by another thread: @s is its word). */
        if (SLOT_H32(s) == h32) {
            size_t klen, len;
            const uint8_t *k = t->key_of(t->ctx, SLOT_REF(s), &klen);
            const uint8_t *key = t->key_of(t->ctx, SLOT_REF(word), &len);
            if (klen == len && memcmp(k, key, len) == 0) {
                return false;
            }
        }
    }
}

void ida__tagtab_remove(struct ida__tagtab *t, uint32_t ref)
{
    ida__tagtab_remove_hashed(t, ref, (uint64_t)h32_of(t, ref) << 32);
}

void ida__tagtab_remove_hashed(struct ida__tagtab *t,
                               uint32_t ref,
                               uint64_t hash)
{
    IDA_ASSERT(t->used > 0);
    uint64_t mask = t->cap - 1;
    uint64_t want = MAKE_SLOT((uint32_t)(hash >> 32), ref);
    uint64_t i = home(t, SLOT_H32(want));
    while (t->slots[i] != want) {
        IDA_ASSERT(t->slots[i] != 0); /* @ref must be present */
        i = (i + 1) & mask;
    }
    /* Backward shift: pull later members of the probe run into the hole
     * when the hole lies between their home and their slot. */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & mask; t->slots[j] != 0; j = (j + 1) & mask) {
        uint64_t h = home(t, SLOT_H32(t->slots[j]));
        if (((j - h) & mask) >= ((j - hole) & mask)) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole] = 0;
    t->used--;
}

/* Blocks of 256 KiB while a pool is small; past 16 of them (a few hundred
 * thousand tags), blocks of 4 MiB backed by huge pages: a restore of
 * millions of tags faults memory in 2 MiB at a time instead of 4 KiB. */
#define SLAB_BLOCK_BYTES     (256u * 1024)
#define SLAB_BIG_BLOCK_BYTES (4u * 1024 * 1024)
#define SLAB_SMALL_BLOCKS    16

static size_t class_of(size_t len)
{
    return (len + 2 + 7) / 8; /* [len][bytes][NUL] rounded up to 8 */
}

uint8_t *ida__tagrec_new(struct ida__slab *s, const char *tag, size_t len)
{
    IDA_ASSERT(len >= 1 && len <= IDA_TAG_BYTES_MAX);
    size_t c = class_of(len);
    IDA_ASSERT(c < IDA__SLAB_CLASSES);
    uint8_t *rec = s->free[c];
    if (rec != NULL) {
        memcpy(&s->free[c], rec, sizeof(uint8_t *));
    } else {
        size_t bytes = c * 8;
        if (s->left < bytes) {
            size_t size = s->nblocks < SLAB_SMALL_BLOCKS ? SLAB_BLOCK_BYTES
                                                         : SLAB_BIG_BLOCK_BYTES;
            uint8_t *blk = ida_malloc_huge(size);
            if (blk == NULL) {
                return NULL;
            }
            memcpy(blk, &s->blocks, sizeof(uint8_t *));
            s->blocks = blk;
            s->cur = blk + 8;
            s->left = size - 8;
            s->nblocks++;
        }
        rec = s->cur;
        s->cur += bytes;
        s->left -= bytes;
    }
    rec[0] = (uint8_t)len;
    memcpy(rec + 1, tag, len);
    rec[len + 1] = 0;
    return rec;
}

void ida__tagrec_free(struct ida__slab *s, uint8_t *rec)
{
    if (rec == NULL) {
        return;
    }
    size_t c = class_of(rec[0]);
    memcpy(rec, &s->free[c], sizeof(uint8_t *));
    s->free[c] = rec;
}

void ida__slab_merge(struct ida__slab *dst, struct ida__slab *src)
{
    for (size_t c = 0; c < IDA__SLAB_CLASSES; c++) {
        IDA_ASSERT(src->free[c] == NULL);
    }
    /* Append @dst's list to the end of @src's, then take the whole. */
    if (src->blocks != NULL) {
        uint8_t *last = src->blocks, *next;
        for (memcpy(&next, last, sizeof(next)); next != NULL;
             memcpy(&next, last, sizeof(next))) {
            last = next;
        }
        memcpy(last, &dst->blocks, sizeof(uint8_t *));
        dst->blocks = src->blocks;
    }
    /* Keep bumping in whichever block has more room left. */
    if (src->left > dst->left) {
        dst->cur = src->cur;
        dst->left = src->left;
    }
    dst->nblocks += src->nblocks;
    memset(src, 0, sizeof(*src));
}

void ida__slab_close(struct ida__slab *s)
{
    while (s->blocks != NULL) {
        uint8_t *next;
        memcpy(&next, s->blocks, sizeof(next));
        ida_free(s->blocks);
        s->blocks = next;
    }
    memset(s, 0, sizeof(*s));
}
