/* Client sessions: lookup by client_id, LRU order, kept results, the
 * acknowledgement floor and request fingerprints (fsm/fsm.h, "Sessions"). */
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
    return ida__session_find_hashed(f, client_id,
                                    ida__hash(client_id, IDA_CLIENT_ID_BYTES));
}

struct ida__session *ida__session_find_hashed(const struct ida_fsm *f,
                                              const uint8_t *client_id,
                                              uint64_t hash)
{
    uint32_t ref = ida__tagtab_find_hashed(&f->sessions, client_id,
                                           IDA_CLIENT_ID_BYTES, hash);
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
    f->results_total -= ida__session_answers(s);
    ida_free(s->base);
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

/* Index of the first result whose seq is >= @seq. */
static uint32_t result_lower_bound(const struct ida__session *s, uint64_t seq)
{
    uint32_t lo = 0, hi = s->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->results[mid].seq < seq) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

const struct ida__cached *ida__session_lookup(const struct ida__session *s,
                                              uint64_t seq)
{
    uint32_t i = result_lower_bound(s, seq);
    return i < s->n && s->results[i].seq == seq ? &s->results[i] : NULL;
}

/* Move the results down to the start of their memory. */
static void compact(struct ida__session *s)
{
    memmove(s->base, s->results, s->n * sizeof(*s->results));
    s->results = s->base;
}

/* Room at the end: the results moved down to the start of their memory
 * while they fill at most half of it (each move of n results is then paid
 * for by at least n keeps since the last), else twice the memory. */
int ida__session_reserve(struct ida__session *s)
{
    if (ida__session_room(s) > 0) {
        return 0;
    }
    uint32_t max = IDA_SESSION_RESULTS_MAX + IDA_SESSION_REFUSED_MAX;
    if (s->results != s->base && (s->n <= s->cap / 2 || s->cap == max)) {
        compact(s);
        return 0;
    }
    uint32_t ncap = s->cap == 0 ? 4 : s->cap * 2;
    if (ncap > max) {
        ncap = max;
    }
    IDA_ASSERT(ncap > s->n); /* the callers check the bounds first */
    struct ida__cached *nb = ida_malloc(ncap * sizeof(*nb));
    if (nb == NULL) {
        return IDA_ENOMEM;
    }
    if (s->n > 0) {
        memcpy(nb, s->results, s->n * sizeof(*nb));
    }
    ida_free(s->base);
    s->results = s->base = nb;
    s->cap = ncap;
    return 0;
}

/* Clients number their requests upwards, so the new seq is nearly always
 * the largest: the memmove is empty on the hot path. With both bounds full
 * apply_command() reserves nothing, and the command's floor made the room:
 * at the start of the memory, taken here (it cannot fail). */
void ida__session_keep(struct ida_fsm *f,
                       struct ida__session *s,
                       uint64_t seq,
                       uint64_t fingerprint,
                       const struct ida_fsm_result *r)
{
    if (ida__session_room(s) == 0 && s->results != s->base) {
        compact(s);
    }
    IDA_ASSERT(ida__session_room(s) > 0 && seq > s->evicted_below);
    uint32_t i = result_lower_bound(s, seq);
    IDA_ASSERT(i == s->n || s->results[i].seq != seq);
    memmove(&s->results[i + 1], &s->results[i],
            (s->n - i) * sizeof(*s->results));
    s->results[i].seq = seq;
    s->results[i].fingerprint = fingerprint;
    s->results[i].result = *r;
    s->n++;
    if (r->error == IDA_ELIMIT) {
        s->n_refused++;
    } else {
        f->results_total++;
    }
}

void ida__session_ack(struct ida_fsm *f,
                      struct ida__session *s,
                      uint64_t ack_below)
{
    if (ack_below == 0 || ack_below - 1 <= s->evicted_below) {
        return;
    }
    uint32_t k = result_lower_bound(s, ack_below);
    for (uint32_t i = 0; i < k; i++) {
        if (s->results[i].result.error == IDA_ELIMIT) {
            s->n_refused--;
        } else {
            f->results_total--;
        }
    }
    if (k > 0) {
        s->results += k;
        s->n -= k;
    }
    s->evicted_below = ack_below - 1;
}

/* --- fingerprints ----------------------------------------------------------
 */

static uint64_t mix(uint64_t h, uint64_t v)
{
    uint8_t b[16];
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(h >> (8 * i));
        b[8 + i] = (uint8_t)(v >> (8 * i));
    }
    return ida__hash_stable(b, sizeof(b));
}

/* A name or tag (bytes on the wire since they may hold any byte; the
 * hash of the same bytes as when they were strings, so fingerprints in
 * older snapshots still match). */
static uint64_t mix_str(uint64_t h, ProtobufCBinaryData b)
{
    static const uint8_t none = 0;
    return mix(h, ida__hash_stable(b.data != NULL ? b.data : &none, b.len));
}

#define FP_SEED UINT64_C(0x6964616c6c6f6331)

/* mix(FP_SEED, op): written out for the operations of every batch (a
 * fingerprint is a tenth of applying one, each mix a serial chain of 16
 * multiplies); test_fsm_sessions checks each against mix(). */
uint64_t ida__fsm_fingerprint_start(int op)
{
    switch (op) {
        case IDALLOC__COMMAND__OP_ALLOC:
            return UINT64_C(0x91ea694ea095ccf9);
        case IDALLOC__COMMAND__OP_FREE:
            return UINT64_C(0xaed20de52fc2aae9);
        case IDALLOC__COMMAND__OP_RESERVE:
            return UINT64_C(0xe681c24da691dd86);
        case IDALLOC__COMMAND__OP_PREFIX_ALLOC:
            return UINT64_C(0x3124d3c59909c28b);
        default:
            return mix(FP_SEED, (uint64_t)op);
    }
}

/* 64 bits: two different commands under one (client_id, request_seq)
 * collide with probability 2^-64, and only a client's own commands can. */
uint64_t ida__fsm_fingerprint(const Idalloc__Command *c)
{
    uint64_t h = ida__fsm_fingerprint_start((int)c->op_case);
    switch (c->op_case) {
        case IDALLOC__COMMAND__OP_POOL_CREATE:
            h = mix_str(h, c->pool_create->name);
            h = mix(h, (uint64_t)c->pool_create->kind);
            return mix(h, c->pool_create->size);
        case IDALLOC__COMMAND__OP_ALLOC:
            h = mix_str(h, c->alloc->pool);
            return mix_str(h, c->alloc->tag);
        case IDALLOC__COMMAND__OP_FREE:
            h = mix_str(h, c->free->pool);
            h = mix(h, c->free->id);
            return mix_str(h, c->free->tag);
        case IDALLOC__COMMAND__OP_RESERVE:
            h = mix_str(h, c->reserve->pool);
            return mix(h, c->reserve->count);
        case IDALLOC__COMMAND__OP_PREFIX_ALLOC:
            h = mix_str(h, c->prefix_alloc->pool);
            return mix_str(h, c->prefix_alloc->tag);
        case IDALLOC__COMMAND__OP_RESTORE:
            h = mix(h, ida__hash_stable(c->restore->state.data,
                                        c->restore->state.len));
            h = mix(h,
                    ida__hash_stable((const uint8_t *)c->restore->from_cluster,
                                     strlen(c->restore->from_cluster)));
            h = mix(h, c->restore->from_index);
            return mix(h, c->restore->advance_sequences);
        default:
            return h;
    }
}
