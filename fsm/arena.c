/* The decode arena: bump allocation for one entry's protobuf-c unpacking. */
#include "fsm/fsm.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

/* --- decode arena ------------------------------------------------------- */

#define ARENA_BLOCK_BYTES (64u * 1024)

void *ida__arena_alloc(void *data, size_t size)
{
    struct ida__arena *ar = data;
    size = (size + 15) & ~(size_t)15;
    struct ida__arena_block *a = ar->head;
    if (a == NULL || a->cap - a->used < size) {
        size_t cap = size > ARENA_BLOCK_BYTES ? size : ARENA_BLOCK_BYTES;
        if (a != NULL && a->cap > cap) {
            cap = a->cap;
        }
        struct ida__arena_block *n = ida_malloc(sizeof(*n) + cap);
        if (n == NULL) {
            ar->failed = true;
            return NULL;
        }
        n->next = a;
        n->cap = cap;
        n->used = 0;
        ar->head = a = n;
    }
    void *p = a->data + a->used;
    a->used += size;
    return p;
}

void ida__arena_free(void *data, void *ptr)
{
    (void)data; /* everything goes at once in ida__arena_reset() */
    (void)ptr;
}

void ida__arena_release(struct ida__arena *a)
{
    while (a->head != NULL) {
        struct ida__arena_block *next = a->head->next;
        ida_free(a->head);
        a->head = next;
    }
}

/* Empty the arena; several blocks become one of their total size, so the
 * next entry of the same size needs no allocation. */
void ida__arena_reset(struct ida__arena *a)
{
    a->failed = false;
    if (a->head == NULL) {
        return;
    }
    if (a->head->next == NULL) {
        a->head->used = 0;
        return;
    }
    size_t total = 0;
    for (struct ida__arena_block *b = a->head; b != NULL; b = b->next) {
        total += b->cap;
    }
    ida__arena_release(a);
    struct ida__arena_block *n = ida_malloc(sizeof(*n) + total);
    if (n != NULL) { /* else the next entry allocates again */
        n->next = NULL;
        n->cap = total;
        n->used = 0;
        a->head = n;
    }
}
