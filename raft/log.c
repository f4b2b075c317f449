/* The in-memory log: entries after the snapshot, term lookups, append,
 * truncate and compact. Internal to the core: raft/internal.h. */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"

ida_index ida__raft_last_index(const struct ida_raft *r)
{
    return r->snap_index + r->n_log;
}

ida_term ida__raft_term_at(const struct ida_raft *r, ida_index i)
{
    if (i == r->snap_index) {
        return r->snap_term;
    }
    if (i < r->snap_index || i > ida__raft_last_index(r)) {
        return 0;
    }
    return r->log[i - r->snap_index - 1].term;
}

ida_term ida__raft_last_term(const struct ida_raft *r)
{
    return ida__raft_term_at(r, ida__raft_last_index(r));
}

struct ida_entry *ida__raft_entry_at(const struct ida_raft *r, ida_index i)
{
    IDA_ASSERT(i > r->snap_index);
    IDA_ASSERT(i <= ida__raft_last_index(r));
    return &r->log[i - r->snap_index - 1];
}

/* An array's capacity for @need elements: @cap doubled as often as needed,
 * from @first when it is 0. */
static size_t doubled(size_t cap, size_t first, size_t need)
{
    cap = cap > 0 ? cap : first;
    while (cap < need) {
        cap *= 2;
    }
    return cap;
}

int ida__raft_log_reserve(struct ida_raft *r, size_t extra)
{
    if (r->n_log + extra <= r->cap_log) {
        return 0;
    }
    size_t cap = doubled(r->cap_log, 64, r->n_log + extra);
    struct ida_entry *log = ida_realloc(r->log, cap * sizeof(*log));
    if (log == NULL) {
        return IDA_ENOMEM;
    }
    r->log = log;
    r->cap_log = cap;
    return 0;
}

int ida__raft_copy_data(const uint8_t *data, size_t len, uint8_t **out)
{
    *out = NULL;
    if (len == 0) {
        return 0;
    }
    *out = ida_malloc(len);
    if (*out == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(*out, data, len);
    return 0;
}

/* Append one entry whose data is already owned by the core; capacity must
 * have been reserved. */
void ida__raft_log_push(struct ida_raft *r,
                        ida_term term,
                        enum ida_entry_type type,
                        uint8_t *data,
                        size_t len)
{
    IDA_ASSERT(r->n_log < r->cap_log);
    IDA_ASSERT(term >= ida__raft_last_term(r));
    struct ida_entry *e = &r->log[r->n_log++];
    e->term = term;
    e->index = ida__raft_last_index(r);
    e->type = type;
    e->data = data;
    e->len = len;
}

/* Drop entries >= @from from memory. Everything that referred to them as
 * "durable" or "handed out" is pulled back. */
void ida__raft_log_truncate(struct ida_raft *r, ida_index from)
{
    IDA_ASSERT(from > r->snap_index);
    IDA_ASSERT(from > r->commit);
    for (ida_index i = from; i <= ida__raft_last_index(r); i++) {
        ida_free(ida__raft_entry_at(r, i)->data);
    }
    r->n_log = from - r->snap_index - 1;
    if (r->unsent > from) {
        r->unsent = from;
    }
    if (r->stable >= from) {
        r->stable = from - 1;
    }
    for (unsigned k = 0; k < r->pending_count; k++) {
        unsigned p = (r->pending_head + k) % IDA_RAFT_PENDING_MAX;
        if (r->pending[p].last >= from) {
            r->pending[p].last = from - 1;
        }
    }
}

/* The data of @n entries from @e, dropped: to the garbage that
 * ida_raft_release() frees, or freed now when it cannot grow. */
static void drop_data(struct ida_raft *r, const struct ida_entry *e, size_t n)
{
    if (r->n_garbage + n > r->cap_garbage) {
        size_t cap = doubled(r->cap_garbage, 1024, r->n_garbage + n);
        void **g = ida_realloc(r->garbage, cap * sizeof(*g));
        if (g == NULL) {
            for (size_t i = 0; i < n; i++) {
                ida_free(e[i].data);
            }
            return;
        }
        r->garbage = g;
        r->cap_garbage = cap;
    }
    for (size_t i = 0; i < n; i++) {
        if (e[i].data != NULL) {
            r->garbage[r->n_garbage++] = e[i].data;
        }
    }
}

size_t ida_raft_release(struct ida_raft *r, size_t max)
{
    IDA_ASSERT(r != NULL);
    while (max > 0 && r->n_garbage > 0) {
        ida_free(r->garbage[--r->n_garbage]);
        max--;
    }
    if (r->n_garbage == 0 && r->cap_garbage > 4096) {
        ida_free(r->garbage); /* a large array only while it is needed */
        r->garbage = NULL;
        r->cap_garbage = 0;
    }
    return r->n_garbage;
}

void ida__raft_log_drop_all(struct ida_raft *r)
{
    drop_data(r, r->log, r->n_log);
    r->n_log = 0;
}

/* Drop entries <= @upto (they are inside the snapshot). */
void ida__raft_log_compact(struct ida_raft *r, ida_index upto, ida_term term)
{
    IDA_ASSERT(upto > r->snap_index);
    ida_index keep_from = upto + 1;
    if (upto > ida__raft_last_index(r)) {
        ida__raft_log_drop_all(r);
    } else {
        size_t drop = (size_t)(upto - r->snap_index);
        drop_data(r, r->log, drop);
        if (drop < r->n_log) {
            memmove(r->log, r->log + drop, (r->n_log - drop) * sizeof(*r->log));
        }
        r->n_log -= drop;
    }
    r->snap_index = upto;
    r->snap_term = term;
    if (r->unsent < keep_from) {
        r->unsent = keep_from;
    }
}
