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

int ida__raft_log_reserve(struct ida_raft *r, size_t extra)
{
    if (r->n_log + extra <= r->cap_log) {
        return 0;
    }
    size_t cap = r->cap_log ? r->cap_log : 64;
    while (cap < r->n_log + extra) {
        cap *= 2;
    }
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

/* Drop entries <= @upto (they are inside the snapshot). */
void ida__raft_log_compact(struct ida_raft *r, ida_index upto, ida_term term)
{
    IDA_ASSERT(upto > r->snap_index);
    ida_index keep_from = upto + 1;
    if (upto > ida__raft_last_index(r)) {
        for (size_t i = 0; i < r->n_log; i++) {
            ida_free(r->log[i].data);
        }
        r->n_log = 0;
    } else {
        size_t drop = (size_t)(upto - r->snap_index);
        for (size_t i = 0; i < drop; i++) {
            ida_free(r->log[i].data);
        }
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
