/* Prefix pools: FoundationDB's high contention allocator, made
 * deterministic.
 *
 * In FoundationDB many clients race: each picks a random candidate in the
 * current window so that concurrent transactions rarely conflict, and the
 * window advances when half full, so a random probe succeeds at least half
 * the time. Here commands are already serialized by the log, so there is no
 * race to avoid; the algorithm is kept as specified (same windows, same
 * prefixes, same density) and its randomness comes from a PRNG seeded by
 * the caller from the log index and the command's position, identical on
 * every replica. */
#include "fsm/fsm_internal.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

/* FoundationDB's window sizes: start < 255 -> 64, start < 65535 -> 1024,
 * else 8192. */
uint64_t ida__prefix_window(uint64_t start)
{
    if (start < 255) {
        return 64;
    }
    if (start < 65535) {
        return 1024;
    }
    return 8192;
}

size_t ida__prefix_encode(uint64_t v, uint8_t out[IDA_PREFIX_BYTES_MAX])
{
    size_t n = 1;
    while (n < 8 && (v >> (8 * n)) != 0) {
        n++;
    }
    out[0] = (uint8_t)n;
    for (size_t i = 0; i < n; i++) {
        out[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    }
    return n + 1;
}

int ida__prefix_decode(const uint8_t *p, size_t len, uint64_t *v)
{
    if (len < 2 || p[0] != len - 1 || p[0] > 8) {
        return -1;
    }
    if (len > 2 && p[1] == 0) {
        return -1; /* not minimal */
    }
    uint64_t x = 0;
    for (size_t i = 1; i < len; i++) {
        x = (x << 8) | p[i];
    }
    *v = x;
    return 0;
}

static const uint8_t *prefix_key(const void *ctx, uint32_t ref, size_t *len)
{
    const struct ida__prefix *p = ctx;
    IDA_ASSERT(ref < p->n);
    *len = ida__tagrec_len(p->tags[ref]);
    return p->tags[ref] + 1;
}

void ida__prefix_init(struct ida__prefix *p)
{
    memset(p, 0, sizeof(*p));
    ida__tagtab_init(&p->tab, prefix_key, p);
}

void ida__prefix_close(struct ida__prefix *p)
{
    ida__slab_close(&p->slab);
    ida_free(p->tags);
    ida_free(p->values);
    ida__tagtab_close(&p->tab);
    memset(p, 0, sizeof(*p));
}

/* Room for one more record: 0 or IDA_ENOMEM (nothing changes). */
static int grow(struct ida__prefix *p)
{
    if (p->n < p->cap) {
        return 0;
    }
    uint32_t ncap = p->cap == 0 ? 16 : p->cap * 2;
    if (p->cap > UINT32_MAX / 2) {
        ncap = UINT32_MAX;
    }
    uint64_t *nv = ida_realloc(p->values, (size_t)ncap * sizeof(*nv));
    if (nv == NULL) {
        return IDA_ENOMEM;
    }
    p->values = nv;
    uint8_t **nt = ida_realloc(p->tags, (size_t)ncap * sizeof(*nt));
    if (nt == NULL) {
        return IDA_ENOMEM; /* values grew alone: harmless */
    }
    p->tags = nt;
    p->cap = ncap;
    return 0;
}

static void append(struct ida__prefix *p, uint8_t *rec, uint64_t value)
{
    IDA_ASSERT(p->n < p->cap);
    p->values[p->n] = value;
    p->tags[p->n] = rec;
    p->n++;
    ida__tagtab_insert(&p->tab, p->n - 1);
}

/* splitmix64: a small, well-mixed generator; only determinism matters. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

int ida__prefix_alloc(struct ida__prefix *p,
                      const char *tag,
                      size_t len,
                      uint64_t seed,
                      uint64_t *value,
                      bool *existed)
{
    uint32_t ref = ida__tagtab_find(&p->tab, (const uint8_t *)tag, len);
    if (ref != IDA__REF_NONE) {
        *value = p->values[ref];
        *existed = true;
        return IDA__R_OK;
    }
    uint64_t start = p->start;
    uint64_t window = ida__prefix_window(start);
    bool advance = p->count * 2 >= window;
    if (advance) {
        start += window;
        window = ida__prefix_window(start);
    }
    /* The last window must end at or before UINT64_MAX. */
    if (start > UINT64_MAX - window || p->n >= IDA_PREFIX_TAGS_MAX) {
        return IDA__R_PREFIX_END;
    }
    if (grow(p) != 0 || ida__tagtab_reserve(&p->tab) != 0) {
        return -IDA_ENOMEM;
    }
    uint8_t *rec = ida__tagrec_new(&p->slab, tag, len);
    if (rec == NULL) {
        return -IDA_ENOMEM;
    }
    if (advance) {
        /* Seed: "clear_previous_window": old reservations are dropped; the
         * window only moves forward, so they can never be chosen again. */
        p->start = start;
        p->count = 0;
        memset(p->reserved, 0, sizeof(p->reserved));
    }
    /* Fewer than half the window is taken, so each probe succeeds with
     * probability > 1/2; the loop ends (deterministically) quickly. */
    uint64_t off;
    for (;;) {
        off = next_random(&seed) % window;
        if (!((p->reserved[off / 64] >> (off % 64)) & 1)) {
            break;
        }
    }
    p->reserved[off / 64] |= UINT64_C(1) << (off % 64);
    p->count++;
    IDA_ASSERT(p->count * 2 <= window);
    append(p, rec, start + off);
    *value = start + off;
    *existed = false;
    return IDA__R_OK;
}

int ida__prefix_put(struct ida__prefix *p, uint8_t *rec, uint64_t value)
{
    if (grow(p) != 0 || ida__tagtab_reserve(&p->tab) != 0) {
        return -IDA_ENOMEM;
    }
    append(p, rec, value);
    return 0;
}
