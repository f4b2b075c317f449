/* Open-addressing table of 32-bit refs keyed by bytes read back through a
 * callback (linear probing, backward-shift deletion: no tombstones).
 *
 * A slot is 64 bits: the high 32 bits of the key's hash and ref + 1. The
 * stored hash picks the home slot, so growing and deleting never read keys
 * back (each read is a cache miss or three at 10 million entries), and a
 * probe only reads a key back when the 32 hash bits match.
 *
 * Growing doubles the table a step at a time ("growing" below): at 5.9 and
 * 11.7 million keys a doubling done at once held the fsm processor 0.4 to
 * 1.1 s. Its cost now is at most IDA__TAGTAB_STEP slots and a probe run
 * per reserve or remove, and a find that misses the new table probes the
 * old one too while it lasts (one sixteenth of the inserts between two
 * doublings). */
#include "fsm/fsm_internal.h"

#include <string.h>

#include "base/assert.h"
#include "base/collapse.h"
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
    ida_free(t->old);
    t->slots = NULL;
    t->old = NULL;
    t->cap = 0;
    t->old_cap = 0;
    t->used = 0;
    t->old_used = 0;
}

#define SLOT_REF(s)         ((uint32_t)(s)-1)
#define SLOT_H32(s)         ((uint32_t)((s) >> 32))
#define MAKE_SLOT(h32, ref) (((uint64_t)(h32) << 32) | ((uint64_t)(ref) + 1))

static uint32_t h32_of(const struct ida__tagtab *t, uint32_t ref)
{
    size_t len;
    const uint8_t *k = t->key_of(t->ctx, ref, &len);
    return (uint32_t)(ida__hash(k, len) >> 32);
}

/* Probe @slots (@cap of them, cap > 0) for @key, whose hash has high bits
 * @h32: its ref, or IDA__REF_NONE. */
static uint32_t probe(const struct ida__tagtab *t,
                      const uint64_t *slots,
                      uint64_t cap,
                      const uint8_t *key,
                      size_t len,
                      uint32_t h32)
{
    uint64_t mask = cap - 1;
    for (uint64_t i = ida__tagtab_home_in(cap, h32); slots[i] != 0;
         i = (i + 1) & mask) {
        uint64_t s = slots[i];
        if (SLOT_H32(s) != h32) {
            continue;
        }
        size_t klen;
        const uint8_t *k = t->key_of(t->ctx, SLOT_REF(s), &klen);
        if (klen == len && memcmp(k, key, len) == 0) {
            return SLOT_REF(s);
        }
    }
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
    uint32_t h32 = (uint32_t)(hash >> 32);
    uint32_t ref = probe(t, t->slots, t->cap, key, len, h32);
    if (ref == IDA__REF_NONE && t->old != NULL) {
        ref = probe(t, t->old, t->old_cap, key, len, h32);
    }
    return ref;
}

static void place(uint64_t *slots, uint64_t cap, uint64_t slot)
{
    uint64_t mask = cap - 1;
    uint64_t i = ida__tagtab_home_in(cap, SLOT_H32(slot));
    while (slots[i] != 0) {
        i = (i + 1) & mask;
    }
    slots[i] = slot;
}

/* --- growing -------------------------------------------------------------
 *
 * The old table is emptied in the order of its slots from an empty one, a
 * step at a time: at least @budget slots, and on to the next empty slot.
 * Between steps every probe run (the keys between two empty slots) is
 * whole in one table. A key sits between its home and the next empty slot,
 * so a run moved whole leaves no key of the old table behind an emptied
 * slot its probe would stop at, and the runs not moved yet are found in
 * the old table as before. Removes in the old table shift keys back within
 * their run; nothing is inserted there. The new table is twice the old
 * one's size and the growth began at a load of 0.7, so it takes 0.7 of the
 * old size more inserts to need growing again: the old, at IDA__TAGTAB_STEP
 * slots a reserve, is empty after a sixteenth of that. */

/* The old table's memory goes back to the system RELEASE_SLOTS slots (64
 * KiB) at a time once they are all moved or passed, so all zero: a probe
 * there reads zero, as it did before. Up to its end; the slots before the
 * slot it started from (usually a handful) go with its free(). */
#define RELEASE_SLOTS 8192

static void release_moved(struct ida__tagtab *t)
{
    uint64_t done = t->old_from + t->old_moved;
    if (done > t->old_cap) {
        done = t->old_cap;
    }
    while (t->old_freed + RELEASE_SLOTS <= done) {
        ida_heap_release_zeroed(t->old + t->old_freed,
                                RELEASE_SLOTS * sizeof(uint64_t));
        t->old_freed += RELEASE_SLOTS;
    }
}

static void move_old(struct ida__tagtab *t, uint64_t budget)
{
    uint64_t mask = t->old_cap - 1;
    while (t->old_used > 0 && t->old_moved < t->old_cap) {
        uint64_t at = (t->old_from + t->old_moved) & mask;
        uint64_t s = t->old[at];
        if (s == 0 && budget == 0) {
            release_moved(t);
            return;
        }
        if (s != 0) {
            place(t->slots, t->cap, s);
            t->old[at] = 0;
            t->old_used--;
        }
        budget -= budget > 0;
        t->old_moved++;
    }
    IDA_ASSERT(t->old_used == 0);
    ida_free(t->old);
    t->old = NULL;
    t->old_cap = 0;
    /* Every page of the new table is in now: it goes onto huge pages in
     * the background (see ida__tagtab_reserve_n(); base/collapse.h). */
    ida_heap_settle_huge(t->slots, t->cap * sizeof(uint64_t));
}

/* Slots for @keys keys at a load of at most 0.7 (so probes stay short):
 * the least power of two from @cap0 up. */
static uint64_t cap_for(uint64_t keys, uint64_t cap0)
{
    uint64_t c = cap0;
    while (keys * 10 > c * 7) {
        c *= 2;
    }
    return c;
}

/* A table of cap_for(@keys, @cap0) slots, its size in *@cap; NULL when out
 * of memory. Not zeroed. */
static uint64_t *new_slots(uint64_t keys, uint64_t cap0, uint64_t *cap)
{
    uint64_t c = cap_for(keys, cap0);
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
    if (t->old != NULL) {
        move_old(t, IDA__TAGTAB_STEP);
    }
    if ((t->used + n) * 10 <= t->cap * 7) {
        return 0;
    }
    if (t->old != NULL) {
        move_old(t, UINT64_MAX); /* a third table is not worth having */
    }
    uint64_t ncap = cap_for(t->used + n, t->cap == 0 ? 16 : t->cap * 2);
    /* Zeroed by the system: pages of a large allocation come zeroed and
     * are faulted in as the moves and inserts reach them. A memset of the
     * whole new table was itself a stall of tens of milliseconds at tens
     * of millions of slots. Not on huge pages while it fills: a fault of a
     * 4 KiB page costs microseconds, one of a huge page (2 MiB zeroed, and
     * memory compacted to find it) up to 11 ms on a virtual machine, and
     * the first moves reach hundreds of them one after another. */
    uint64_t *ns = ncap <= SIZE_MAX / sizeof(uint64_t)
                       ? ida_calloc(ncap, sizeof(uint64_t))
                       : NULL;
    if (ns == NULL) {
        return IDA_ENOMEM;
    }
    if (t->used == 0) {
        ida_free(t->slots);
        t->slots = ns;
        t->cap = ncap;
        return 0;
    }
    uint64_t e = 0; /* an empty slot to start from: at a load of 0.7, near */
    while (t->slots[e] != 0) {
        e++;
    }
    t->old = t->slots;
    t->old_cap = t->cap;
    t->old_used = t->used;
    t->old_from = e;
    t->old_moved = 0;
    t->old_freed = (e + RELEASE_SLOTS - 1) / RELEASE_SLOTS * RELEASE_SLOTS;
    t->slots = ns;
    t->cap = ncap;
    return 0;
}

void ida__tagtab_insert(struct ida__tagtab *t, uint32_t ref)
{
    IDA_ASSERT(ref != IDA__REF_NONE);
    ida__tagtab_insert_hashed(t, ref, (uint64_t)h32_of(t, ref) << 32);
}

void ida__tagtab_insert_hashed(struct ida__tagtab *t,
                               uint32_t ref,
                               uint64_t hash)
{
    IDA_ASSERT(ref != IDA__REF_NONE);
    IDA_ASSERT((t->used + 1) * 10 <= t->cap * 7);
    place(t->slots, t->cap, MAKE_SLOT((uint32_t)(hash >> 32), ref));
    t->used++;
}

void ida__tagtab_prefetch(const struct ida__tagtab *t, uint64_t hash)
{
    if (t->cap > 0) {
        __builtin_prefetch(
            &t->slots[ida__tagtab_home_in(t->cap, (uint32_t)(hash >> 32))], 1);
    }
    if (t->old != NULL) {
        __builtin_prefetch(
            &t->old[ida__tagtab_home_in(t->old_cap, (uint32_t)(hash >> 32))],
            0);
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
    for (uint64_t i = ida__tagtab_home_in(t->cap, h32);; i = (i + 1) & mask) {
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

/* Remove @want from @slots (@cap of them): false when it is not there. */
static bool remove_in(uint64_t *slots, uint64_t cap, uint64_t want)
{
    uint64_t mask = cap - 1;
    uint64_t i = ida__tagtab_home_in(cap, SLOT_H32(want));
    for (; slots[i] != want; i = (i + 1) & mask) {
        if (slots[i] == 0) {
            return false;
        }
    }
    /* Backward shift: pull later members of the probe run into the hole
     * when the hole lies between their home and their slot. */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & mask; slots[j] != 0; j = (j + 1) & mask) {
        uint64_t h = ida__tagtab_home_in(cap, SLOT_H32(slots[j]));
        if (((j - h) & mask) >= ((j - hole) & mask)) {
            slots[hole] = slots[j];
            hole = j;
        }
    }
    slots[hole] = 0;
    return true;
}

void ida__tagtab_remove_hashed(struct ida__tagtab *t,
                               uint32_t ref,
                               uint64_t hash)
{
    IDA_ASSERT(t->used > 0);
    uint64_t want = MAKE_SLOT((uint32_t)(hash >> 32), ref);
    if (!remove_in(t->slots, t->cap, want)) {
        bool found = t->old != NULL && remove_in(t->old, t->old_cap, want);
        IDA_ASSERT(found); /* @ref must be present */
        t->old_used--;
    }
    t->used--;
    if (t->old != NULL) {
        move_old(t, IDA__TAGTAB_STEP);
    }
}

/* Blocks of 256 KiB while a pool is small; past 16 of them (a few hundred
 * thousand tags), blocks of 4 MiB backed by huge pages. A restore's slab
 * (bulk) asks for huge pages as it takes a block: it faults memory in 2 MiB
 * at a time instead of 4 KiB. Any other slab asks once the block is full:
 * the fault of a huge page (2 MiB zeroed, memory compacted to find it) took
 * 5 to 11 ms each here, and a command would wait for it; a full block goes
 * onto huge pages in the background (base/collapse.h). Such a block of
 * 4 MiB is aligned to 2 MiB, so both its halves can: unaligned, only one
 * whole 2 MiB page fits in it, and half the slab stayed in 4 KiB pages
 * (bench_bgsnap at 10 M: 386 MiB collapsed instead of 313). A restore's
 * blocks are not aligned: aligned, a cold restore was slower (heap.h). */
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
            uint8_t *blk;
            if (s->bulk) {
                blk = ida_malloc_huge(size);
            } else if (size == SLAB_BIG_BLOCK_BYTES) {
                blk = ida_malloc_aligned(IDA_HUGE_PAGE, size);
            } else {
                blk = ida_malloc(size);
            }
            if (blk == NULL) {
                return NULL;
            }
            if (!s->bulk && s->cur_block != NULL) {
                ida_heap_settle_huge(s->cur_block, s->cur_size);
            }
            memcpy(blk, &s->blocks, sizeof(uint8_t *));
            s->blocks = blk;
            s->cur = blk + 8;
            s->left = size - 8;
            s->cur_block = blk;
            s->cur_size = size;
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
        dst->cur_block = src->cur_block;
        dst->cur_size = src->cur_size;
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
