/* The FSM processor protocol of seed 004 2.15 over committed entries. */
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"

int ida_fsm_proc_init(struct ida_fsm_proc *p,
                      struct ida_fsm *fsm,
                      size_t capacity)
{
    memset(p, 0, sizeof(*p));
    if (fsm == NULL || capacity == 0) {
        return IDA_EINVAL;
    }
    p->ring = ida_calloc(capacity, sizeof(*p->ring));
    if (p->ring == NULL) {
        return IDA_ENOMEM;
    }
    p->fsm = fsm;
    p->capacity = capacity;
    return 0;
}

void ida_fsm_proc_close(struct ida_fsm_proc *p)
{
    for (size_t i = 0; i < p->count; i++) {
        ida_free(p->ring[(p->head + i) % p->capacity].data);
    }
    ida_free(p->ring);
    memset(p, 0, sizeof(*p));
}

/* The index the next added entry must have. */
static ida_index next_index(const struct ida_fsm_proc *p)
{
    if (p->count == 0) {
        return ida_fsm_applied_index(p->fsm) + 1;
    }
    return p->ring[(p->head + p->count - 1) % p->capacity].index + 1;
}

int ida_fsm_proc_add_updates(struct ida_fsm_proc *p,
                             const struct ida_entry *entries,
                             size_t n)
{
    if (n > p->capacity - p->count) {
        return IDA_EBUSY;
    }
    ida_index want = next_index(p);
    for (size_t i = 0; i < n; i++) {
        if (entries[i].index != want + i) {
            return IDA_EINVAL;
        }
    }
    /* Copy everything first so a failure queues nothing. */
    size_t done = 0;
    for (; done < n; done++) {
        struct ida_entry *e =
            &p->ring[(p->head + p->count + done) % p->capacity];
        *e = entries[done];
        e->data = ida_malloc(entries[done].len + 1);
        if (e->data == NULL) {
            break;
        }
        if (entries[done].len > 0) {
            memcpy(e->data, entries[done].data, entries[done].len);
        }
    }
    if (done < n) {
        for (size_t i = 0; i < done; i++) {
            struct ida_entry *e =
                &p->ring[(p->head + p->count + i) % p->capacity];
            ida_free(e->data);
            e->data = NULL;
        }
        return IDA_ENOMEM;
    }
    p->count += n; /* Commit: all of them are committed already */
    return 0;
}

size_t ida_fsm_proc_upcoming(const struct ida_fsm_proc *p, ida_index *first)
{
    *first = p->count == 0 ? 0 : p->ring[p->head].index;
    return p->count;
}

int ida_fsm_proc_comeup(struct ida_fsm_proc *p, struct ida_fsm_applied *out)
{
    if (p->count == 0) {
        return IDA_ENOTFOUND;
    }
    struct ida_entry *e = &p->ring[p->head];
    int rv = ida_fsm_apply(p->fsm, e->index, e->type, e->data, e->len, out);
    if (rv != 0) {
        return rv;
    }
    /* Cleanup: the entry is applied, its copy is no longer needed. */
    ida_free(e->data);
    memset(e, 0, sizeof(*e));
    p->head = (p->head + 1) % p->capacity;
    p->count--;
    return 0;
}
