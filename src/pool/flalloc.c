#include "src/pool/flalloc.h"

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ida/assert.h"
#include "ida/heap.h"

#define ALIGN 16

/* FrontControl. 48 bytes, so data starts 16-byte aligned. */
struct ida__flblock
{
    size_t size;               /* data bytes, a multiple of ALIGN */
    size_t offset;             /* of this front from the segment's first */
    size_t segment_size;       /* bytes of blocks in the segment */
    struct ida__flblock *next; /* free list links (valid when free) */
    struct ida__flblock *prev;
    uint32_t owned; /* 1: free (owned by the allocator) */
    uint32_t magic;
};

/* BackControl: 16 bytes to keep the next front aligned. */
struct back
{
    struct ida__flblock *front;
    size_t pad;
};

struct ida__flsegment
{
    struct ida__flsegment *next;
    size_t pad;
};

#define MAGIC    0x1da5f1a1u
#define OVERHEAD (sizeof(struct ida__flblock) + sizeof(struct back))

_Static_assert(sizeof(struct ida__flblock) % ALIGN == 0, "front aligned");
_Static_assert(sizeof(struct back) % ALIGN == 0, "back aligned");
_Static_assert(sizeof(struct ida__flsegment) % ALIGN == 0, "segment aligned");

static unsigned level_of(size_t size)
{
    IDA_ASSERT(size > 0);
    unsigned l = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
    return l < IDA_FLALLOC_LEVELS ? l : IDA_FLALLOC_LEVELS - 1;
}

static void *data_of(struct ida__flblock *b)
{
    return (char *)b + sizeof(*b);
}

static struct back *back_of(struct ida__flblock *b)
{
    return (struct back *)((char *)data_of(b) + b->size);
}

static size_t total_of(const struct ida__flblock *b)
{
    return b->size + OVERHEAD;
}

static void attach(struct ida_flalloc *a, struct ida__flblock *b)
{
    unsigned l = level_of(b->size);
    b->owned = 1;
    b->prev = NULL;
    b->next = a->lists[l];
    if (b->next != NULL) {
        b->next->prev = b;
    }
    a->lists[l] = b;
}

static void detach(struct ida_flalloc *a, struct ida__flblock *b)
{
    IDA_ASSERT(b->owned);
    if (b->prev != NULL) {
        b->prev->next = b->next;
    } else {
        a->lists[level_of(b->size)] = b->next;
    }
    if (b->next != NULL) {
        b->next->prev = b->prev;
    }
    b->next = b->prev = NULL;
}

/* Write a block's controls. */
static struct ida__flblock *make_block(void *at,
                                       size_t size,
                                       size_t offset,
                                       size_t segment_size)
{
    struct ida__flblock *b = at;
    b->size = size;
    b->offset = offset;
    b->segment_size = segment_size;
    b->next = b->prev = NULL;
    b->owned = 1;
    b->magic = MAGIC;
    back_of(b)->front = b;
    return b;
}

int ida_flalloc_init(struct ida_flalloc *a)
{
    IDA_ASSERT(a != NULL);
    memset(a, 0, sizeof(*a));
    return 0;
}

void ida_flalloc_close(struct ida_flalloc *a)
{
    struct ida__flsegment *s = a->segments;
    while (s != NULL) {
        struct ida__flsegment *next = s->next;
        ida_free(s);
        s = next;
    }
    memset(a, 0, sizeof(*a));
}

static struct ida__flblock *new_segment(struct ida_flalloc *a, size_t need)
{
    size_t bytes = IDA_FLALLOC_SEGMENT_BYTES;
    if (need + OVERHEAD > bytes) {
        bytes = need + OVERHEAD;
    }
    struct ida__flsegment *s = ida_malloc(sizeof(*s) + bytes);
    if (s == NULL) {
        return NULL;
    }
    s->next = a->segments;
    a->segments = s;
    a->segment_count++;
    return make_block((char *)s + sizeof(*s), bytes - OVERHEAD, 0, bytes);
}

/* A free block of at least @need data bytes, detached; NULL if none. */
static struct ida__flblock *find(struct ida_flalloc *a, size_t need)
{
    unsigned l = level_of(need);
    /* Same level: sizes in [2^l, 2^(l+1)), so check each (first fit). */
    for (struct ida__flblock *b = a->lists[l]; b != NULL; b = b->next) {
        if (b->size >= need) {
            detach(a, b);
            return b;
        }
    }
    for (unsigned k = l + 1; k < IDA_FLALLOC_LEVELS; k++) {
        struct ida__flblock *b = a->lists[k];
        if (b != NULL && b->size >= need) {
            detach(a, b);
            return b;
        }
    }
    return NULL;
}

void *ida_flalloc_alloc(struct ida_flalloc *a, size_t size)
{
    IDA_ASSERT(a != NULL);
    if (size == 0 || size > SIZE_MAX / 2) {
        return NULL;
    }
    size_t need = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    struct ida__flblock *b = find(a, need);
    if (b == NULL) {
        b = new_segment(a, need);
        if (b == NULL) {
            return NULL;
        }
    }
    /* Split off the rest if it can hold a block of its own. */
    if (b->size >= need + OVERHEAD + ALIGN) {
        size_t rest = b->size - need - OVERHEAD;
        b->size = need;
        back_of(b)->front = b;
        struct ida__flblock *r =
            make_block((char *)b + total_of(b), rest, b->offset + total_of(b),
                       b->segment_size);
        attach(a, r);
    }
    b->owned = 0;
    IDA_ASSERT(b->size >= need);
    return data_of(b);
}

void ida_flalloc_free(struct ida_flalloc *a, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    struct ida__flblock *b =
        (struct ida__flblock *)((char *)ptr - sizeof(struct ida__flblock));
    IDA_ASSERT(b->magic == MAGIC);
    IDA_ASSERT(!b->owned); /* double free */
    b->owned = 1;
    if (b->offset > 0) {
        struct back *pb = (struct back *)((char *)b - sizeof(struct back));
        struct ida__flblock *prev = pb->front;
        IDA_ASSERT(prev->magic == MAGIC);
        if (prev->owned) {
            detach(a, prev);
            prev->size += total_of(b);
            back_of(prev)->front = prev;
            b = prev;
        }
    }
    if (b->offset + total_of(b) < b->segment_size) {
        struct ida__flblock *next =
            (struct ida__flblock *)((char *)b + total_of(b));
        IDA_ASSERT(next->magic == MAGIC);
        if (next->owned) {
            detach(a, next);
            b->size += total_of(next);
            back_of(b)->front = b;
        }
    }
    attach(a, b);
}

size_t ida_flalloc_free_blocks(const struct ida_flalloc *a, size_t *whole_out)
{
    size_t n = 0, whole = 0;
    for (unsigned l = 0; l < IDA_FLALLOC_LEVELS; l++) {
        for (struct ida__flblock *b = a->lists[l]; b != NULL; b = b->next) {
            IDA_ASSERT(b->magic == MAGIC);
            IDA_ASSERT(b->owned);
            IDA_ASSERT(level_of(b->size) == l);
            IDA_ASSERT(back_of(b)->front == b);
            if (b->offset == 0 && total_of(b) == b->segment_size) {
                whole++;
            }
            n++;
        }
    }
    if (whole_out != NULL) {
        *whole_out = whole;
    }
    return n;
}
