/* Open-addressing table of 32-bit refs keyed by bytes read back through a
 * callback (linear probing, backward-shift deletion: no tombstones). */
#include "fsm/fsm_internal.h"

#include <string.h>

#include "ida/assert.h"
#include "ida/heap.h"
#include "idalloc_errors.h"

/* FNV-1a, then a final mix so linear probing sees well-spread low bits.
 * Deterministic on purpose: the table's layout never shows in answers or
 * snapshots, so any fixed function is fine. */
uint64_t ida__hash(const uint8_t *key, size_t len)
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

static uint64_t home_of(const struct ida__tagtab *t, uint32_t ref)
{
    size_t len;
    const uint8_t *k = t->key_of(t->ctx, ref, &len);
    return ida__hash(k, len) & (t->cap - 1);
}

uint32_t ida__tagtab_find(const struct ida__tagtab *t,
                          const uint8_t *key,
                          size_t len)
{
    if (t->cap == 0) {
        return IDA__REF_NONE;
    }
    uint64_t mask = t->cap - 1;
    for (uint64_t i = ida__hash(key, len) & mask;; i = (i + 1) & mask) {
        uint32_t s = t->slots[i];
        if (s == 0) {
            return IDA__REF_NONE;
        }
        size_t klen;
        const uint8_t *k = t->key_of(t->ctx, s - 1, &klen);
        if (klen == len && memcmp(k, key, len) == 0) {
            return s - 1;
        }
    }
}

static void place(struct ida__tagtab *t, uint32_t ref)
{
    uint64_t mask = t->cap - 1;
    uint64_t i = home_of(t, ref);
    while (t->slots[i] != 0) {
        i = (i + 1) & mask;
    }
    t->slots[i] = ref + 1;
}

int ida__tagtab_reserve(struct ida__tagtab *t)
{
    /* Keep the load at most 0.7 so probes stay short. */
    if ((t->used + 1) * 10 <= t->cap * 7) {
        return 0;
    }
    uint64_t ncap = t->cap == 0 ? 16 : t->cap * 2;
    uint32_t *ns = ida_calloc(ncap, sizeof(*ns));
    if (ns == NULL) {
        return IDA_ENOMEM;
    }
    uint32_t *old = t->slots;
    uint64_t ocap = t->cap;
    t->slots = ns;
    t->cap = ncap;
    for (uint64_t i = 0; i < ocap; i++) {
        if (old[i] != 0) {
            place(t, old[i] - 1);
        }
    }
    ida_free(old);
    return 0;
}

void ida__tagtab_insert(struct ida__tagtab *t, uint32_t ref)
{
    IDA_ASSERT(ref != IDA__REF_NONE);
    IDA_ASSERT((t->used + 1) * 10 <= t->cap * 7);
    place(t, ref);
    t->used++;
}

void ida__tagtab_remove(struct ida__tagtab *t, uint32_t ref)
{
    IDA_ASSERT(t->used > 0);
    uint64_t mask = t->cap - 1;
    uint64_t i = home_of(t, ref);
    while (t->slots[i] != ref + 1) {
        IDA_ASSERT(t->slots[i] != 0); /* @ref must be present */
        i = (i + 1) & mask;
    }
    /* Backward shift: pull later members of the probe run into the hole
     * when the hole lies between their home and their slot. */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & mask; t->slots[j] != 0; j = (j + 1) & mask) {
        uint64_t home = home_of(t, t->slots[j] - 1);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole] = 0;
    t->used--;
}

uint8_t *ida__tagrec_new(const char *tag, size_t len)
{
    IDA_ASSERT(len >= 1 && len <= IDA_TAG_BYTES_MAX);
    uint8_t *rec = ida_malloc(len + 2);
    if (rec == NULL) {
        return NULL;
    }
    rec[0] = (uint8_t)len;
    memcpy(rec + 1, tag, len);
    rec[len + 1] = 0;
    return rec;
}
