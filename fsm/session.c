/* Client sessions: lookup by client_id, LRU order, kept results. */
#include "fsm/fsm.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

/* --- sessions ------------------------------------------------------------- */

const uint8_t *ida__session_key(const void *ctx, uint32_t ref, size_t *len)
{
    const struct ida_fsm *f = ctx;
    IDA_ASSERT(ref < f->sess_ref_cap && f->sess_refs[ref] != NULL);
    *len = IDA_CLIENT_ID_BYTES;
    return f->sess_refs[ref]->client_id;
}

struct ida__session *ida__session_find(const struct ida_fsm *f,
                                       const uint8_t *client_id)
{
    uint32_t ref =
        ida__tagtab_find(&f->sessions, client_id, IDA_CLIENT_ID_BYTES);
    return ref == IDA__REF_NONE ? NULL : f->sess_refs[ref];
}

static void lru_unlink(struct ida_fsm *f, struct ida__session *s)
{
    if (s->prev != NULL) {
        s->prev->next = s->next;
    } else {
        f->lru_head = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    } else {
        f->lru_tail = s->prev;
    }
    s->prev = s->next = NULL;
}

static void lru_append(struct ida_fsm *f, struct ida__session *s)
{
    s->prev = f->lru_tail;
    s->next = NULL;
    if (f->lru_tail != NULL) {
        f->lru_tail->next = s;
    } else {
        f->lru_head = s;
    }
    f->lru_tail = s;
}

void ida__session_touch(struct ida_fsm *f, struct ida__session *s)
{
    s->rank = ++f->session_clock;
    s->last_active_ms = f->now_ms;
    lru_unlink(f, s);
    lru_append(f, s);
}

/* Room for one more session ref: 0 or IDA_ENOMEM. */
static int session_ref_reserve(struct ida_fsm *f)
{
    if (f->sess_free_count > 0 || f->session_count < f->sess_ref_cap) {
        return 0;
    }
    uint32_t ncap = f->sess_ref_cap == 0 ? 64 : f->sess_ref_cap * 2;
    struct ida__session **nr = ida_realloc(f->sess_refs, ncap * sizeof(*nr));
    if (nr == NULL) {
        return IDA_ENOMEM;
    }
    f->sess_refs = nr;
    uint32_t *nf = ida_realloc(f->sess_free, ncap * sizeof(*nf));
    if (nf == NULL) {
        return IDA_ENOMEM; /* refs grew alone: harmless */
    }
    f->sess_free = nf;
    /* New refs are free, pushed so the lowest is used first. */
    for (uint32_t r = ncap; r > f->sess_ref_cap; r--) {
        f->sess_refs[r - 1] = NULL;
        f->sess_free[f->sess_free_count++] = r - 1;
    }
    f->sess_ref_cap = ncap;
    return 0;
}

struct ida__session *ida__session_add(struct ida_fsm *f,
                                      const uint8_t *client_id)
{
    IDA_ASSERT(f->session_count < IDA_SESSIONS_MAX);
    if (session_ref_reserve(f) != 0 || ida__tagtab_reserve(&f->sessions) != 0) {
        return NULL;
    }
    struct ida__session *s = ida_calloc(1, sizeof(*s));
    if (s == NULL) {
        return NULL;
    }
    memcpy(s->client_id, client_id, IDA_CLIENT_ID_BYTES);
    IDA_ASSERT(f->sess_free_count > 0);
    s->ref = f->sess_free[--f->sess_free_count];
    f->sess_refs[s->ref] = s;
    ida__tagtab_insert(&f->sessions, s->ref);
    f->session_count++;
    lru_append(f, s);
    return s;
}

void ida__session_drop(struct ida_fsm *f, struct ida__session *s)
{
    ida__tagtab_remove(&f->sessions, s->ref);
    f->sess_refs[s->ref] = NULL;
    f->sess_free[f->sess_free_count++] = s->ref;
    lru_unlink(f, s);
    f->session_count--;
    ida_free(s);
}

/* Drop sessions idle for IDA_SESSION_TTL_MS of now_ms. The LRU list is in
 * rank order and last_active_ms never decreases along it. */
void ida__sessions_expire(struct ida_fsm *f)
{
    while (f->lru_head != NULL &&
           f->now_ms - f->lru_head->last_active_ms >= IDA_SESSION_TTL_MS) {
        ida__session_drop(f, f->lru_head);
    }
}

const struct ida__cached *ida__session_lookup(const struct ida__session *s,
                                              uint64_t seq)
{
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->results[i].seq == seq) {
            return &s->results[i];
        }
    }
    return NULL;
}

/* Keep @r for @seq (absent). When full, the lowest seq of the kept ones
 * and @seq is dropped and remembered in evicted_below. Results are kept in
 * no particular order (snapshots sort them): no shifting on the hot path. */
void ida__session_keep(struct ida__session *s,
                       uint64_t seq,
                       const struct ida_fsm_result *r)
{
    uint32_t slot = s->n;
    if (s->n == IDA_SESSION_RESULTS_MAX) {
        slot = 0;
        for (uint32_t i = 1; i < s->n; i++) {
            if (s->results[i].seq < s->results[slot].seq) {
                slot = i;
            }
        }
        uint64_t lowest = s->results[slot].seq;
        if (seq < lowest) {
            /* Older than everything kept: dropped at once. */
            if (seq > s->evicted_below) {
                s->evicted_below = seq;
            }
            return;
        }
        if (lowest > s->evicted_below) {
            s->evicted_below = lowest;
        }
    } else {
        s->n++;
    }
    s->results[slot].seq = seq;
    s->results[slot].result = *r;
}
