/* Snapshots: reading an idalloc.FsmState back (see snap_encode.c). */
#include "fsm/fsm.h"

#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "fsm/snap_hold.h"
#include "fsm/wire.h"
#include "idalloc_errors.h"

#define CORRUPT IDA_ECORRUPT

/* Where the second share starts: the first Holding at or after the one at
 * @mid (a field start) whose chunk differs from the one before it; *@cut_id
 * is that chunk's first id and *@skipped the holdings from @mid to it.
 * NULL when there is none. */
static const uint8_t *find_cut(struct ida__rbuf r,
                               const uint8_t *mid,
                               uint64_t *cut_id,
                               uint64_t *skipped)
{
    struct ida__field f;
    uint64_t chunk = UINT64_MAX;
    *skipped = 0;
    r.p = mid;
    for (const uint8_t *at = r.p; ida__r_field(&r, &f) == 1; at = r.p) {
        if (f.num != 2 || f.type != IDA__WT_LEN) {
            continue;
        }
        uint64_t c = ida__hold_id(f.sub) >> IDA__CHUNK_SHIFT;
        if (chunk != UINT64_MAX && c > chunk) {
            *cut_id = c << IDA__CHUNK_SHIFT;
            return at;
        }
        chunk = c;
        (*skipped)++;
    }
    return NULL;
}

/* The holdings of @b (prepared for ids up to @max_id), @holdings of them in
 * @r, the one at @mid being the @before_mid'th: in its tag table
 * (snap_hold.h). */
static int take_holdings(struct ida__bounded *b,
                         struct ida__rbuf r,
                         uint64_t max_id,
                         uint64_t holdings,
                         const uint8_t *mid,
                         uint64_t before_mid,
                         const struct ida_fsm_helper *helper)
{
    struct ida__hold_load L;
    int rv = ida__hold_begin(&L, b, r, holdings, max_id);
    if (rv == 0) {
        uint64_t cut_id, skipped;
        const uint8_t *cut =
            helper != NULL && holdings >= IDA__HOLD_SPLIT_MIN && mid != NULL
                ? find_cut(r, mid, &cut_id, &skipped)
                : NULL;
        if (cut != NULL) {
            ida__hold_cut(&L, cut, cut_id, before_mid + skipped);
        }
        rv = ida__hold_decode(&L, helper);
    }
    return ida__hold_end(&L, rv, helper);
}

static int dec_bounded(struct ida__pool *pool,
                       struct ida__rbuf r,
                       const struct ida_fsm_helper *helper)
{
    struct ida__field f;
    uint64_t size = 0, holdings = 0, before_mid = 0;
    struct ida__rbuf last = {NULL, NULL};
    /* The second share starts near the Holding that crosses the middle
     * byte (holdings are about the same size). */
    const uint8_t *half = r.p + (r.end - r.p) / 2, *mid = NULL;
    int k;
    struct ida__rbuf r2 = r;
    for (const uint8_t *at = r.p; (k = ida__r_field(&r, &f)) == 1; at = r.p) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            size = f.v;
        } else if (f.num == 2 && f.type == IDA__WT_LEN) {
            last = f.sub;
            if (mid == NULL && at >= half) {
                mid = at;
                before_mid = holdings;
            }
            holdings++;
        }
    }
    if (k < 0 || size == 0 || holdings > IDA_BOUNDED_HELD_MAX) {
        return CORRUPT;
    }
    struct ida__bounded *b = &pool->u.bounded;
    ida__bounded_init(b, size);
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_BOUNDED; /* now closeable */
    if (holdings == 0) {
        return 0;
    }
    /* The highest id is the last one: the chunk index is sized for it once,
     * and the tag table for every holding (instead of growing 20 times). */
    uint64_t max_id = ida__hold_id(last);
    if (max_id >= size || max_id >= IDA_BOUNDED_HELD_MAX) {
        return CORRUPT;
    }
    if (ida__bounded_prepare(b, max_id) != 0) {
        return IDA_ENOMEM;
    }
    int rv = take_holdings(b, r2, max_id, holdings, mid, before_mid, helper);
    if (rv == 0) {
        ida__bounded_recount(b);
    }
    return rv;
}

static bool is_window_start(uint64_t s)
{
    if (s < 256) {
        return s % 64 == 0;
    }
    if (s < 65792) {
        return (s - 256) % 1024 == 0;
    }
    return (s - 65792) % 8192 == 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Add one window_reserved value (@v) to @p: 0 or CORRUPT. */
static int put_reserved(struct ida__prefix *p,
                        uint64_t v,
                        bool *any,
                        uint64_t *last)
{
    uint64_t w = ida__prefix_window(p->start);
    if (v < p->start || v - p->start >= w || (*any && v <= *last)) {
        return CORRUPT;
    }
    uint64_t off = v - p->start;
    p->reserved[off / 64] |= UINT64_C(1) << (off % 64);
    *any = true;
    *last = v;
    return 0;
}

static int dec_tagprefix(struct ida__prefix *p,
                         struct ida__rbuf r,
                         const uint8_t **last_tag)
{
    struct ida__field f;
    struct ida__rbuf tag = {NULL, NULL}, pre = {NULL, NULL};
    int k;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_LEN) {
            tag = f.sub;
        } else if (f.num == 2 && f.type == IDA__WT_LEN) {
            pre = f.sub;
        }
    }
    uint64_t v;
    if (k < 0 || tag.p == NULL || pre.p == NULL ||
        ida__prefix_decode(pre.p, (size_t)(pre.end - pre.p), &v) != 0 ||
        v >= p->start + ida__prefix_window(p->start) ||
        p->n >= IDA_PREFIX_TAGS_MAX) {
        return CORRUPT;
    }
    if (!ida__hold_tag_ok(&tag)) {
        return CORRUPT;
    }
    uint8_t *rec = ida__tagrec_new(&p->slab, (const char *)tag.p,
                                   (size_t)(tag.end - tag.p));
    if (rec == NULL) {
        return IDA_ENOMEM;
    }
    if (*last_tag != NULL &&
        strcmp(ida__tagrec_str(*last_tag), ida__tagrec_str(rec)) >= 0) {
        ida__tagrec_free(&p->slab, rec);
        return CORRUPT; /* tags sorted and unique */
    }
    if (ida__prefix_put(p, rec, v) != 0) {
        ida__tagrec_free(&p->slab, rec);
        return IDA_ENOMEM;
    }
    *last_tag = rec;
    return 0;
}

/* The values of @p are unique (no prefix handed out twice). */
static int check_unique_values(const struct ida__prefix *p)
{
    if (p->n < 2) {
        return 0;
    }
    uint64_t *v = ida_malloc((size_t)p->n * sizeof(*v));
    if (v == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(v, p->values, (size_t)p->n * sizeof(*v));
    qsort(v, p->n, sizeof(*v), cmp_u64);
    int rv = 0;
    for (uint32_t i = 1; i < p->n; i++) {
        if (v[i] == v[i - 1]) {
            rv = CORRUPT;
            break;
        }
    }
    ida_free(v);
    return rv;
}

static int dec_prefix(struct ida__pool *pool, struct ida__rbuf r)
{
    struct ida__prefix *p = &pool->u.prefix;
    ida__prefix_init(p);
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_PREFIX;
    struct ida__field f;
    int k;
    struct ida__rbuf r2 = r;
    uint64_t count = 0;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            p->start = f.v;
        } else if (f.num == 2 && f.type == IDA__WT_VARINT) {
            count = f.v;
        }
    }
    if (k < 0 || !is_window_start(p->start) ||
        p->start > UINT64_MAX - ida__prefix_window(p->start) ||
        count * 2 > ida__prefix_window(p->start)) {
        return CORRUPT;
    }
    bool any = false;
    uint64_t last = 0;
    const uint8_t *last_tag = NULL;
    while ((k = ida__r_field(&r2, &f)) == 1) {
        int rv = 0;
        if (f.num == 3 && f.type == IDA__WT_VARINT) {
            rv = put_reserved(p, f.v, &any, &last); /* unpacked form */
        } else if (f.num == 3 && f.type == IDA__WT_LEN) {
            uint64_t v;
            while (rv == 0 && f.sub.p != f.sub.end) {
                rv = ida__r_varint(&f.sub, &v) != 0
                         ? CORRUPT
                         : put_reserved(p, v, &any, &last);
            }
        } else if (f.num == 4 && f.type == IDA__WT_LEN) {
            rv = dec_tagprefix(p, f.sub, &last_tag);
        }
        if (rv != 0) {
            return rv;
        }
    }
    if (k < 0) {
        return CORRUPT;
    }
    uint64_t bits = 0;
    for (unsigned i = 0; i < IDA__WINDOW_MAX / 64; i++) {
        bits += (uint64_t)__builtin_popcountll(p->reserved[i]);
    }
    if (bits != count) {
        return CORRUPT;
    }
    p->count = count;
    return check_unique_values(p);
}

static int dec_seq(struct ida__pool *pool, struct ida__rbuf r)
{
    struct ida__field f;
    int k;
    uint64_t next = 0;
    while ((k = ida__r_field(&r, &f)) == 1) {
        if (f.num == 1 && f.type == IDA__WT_VARINT) {
            next = f.v;
        }
    }
    if (k < 0 || next == 0) {
        return CORRUPT;
    }
    pool->kind = IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE;
    pool->u.seq_next = next;
    return 0;
}

/* A Pool message (@r, within the snapshot at @base). A bounded pool that
 * @ahead (may be NULL) decoded ahead from these bytes is taken from it. */
static int dec_pool(struct ida_fsm *f,
                    struct ida__rbuf r,
                    const struct ida_fsm_helper *helper,
                    const uint8_t *base,
                    struct ida_fsm_ahead *ahead)
{
    struct ida__field fl;
    struct ida__rbuf name = {NULL, NULL}, sub[6] = {{NULL, NULL}};
    uint64_t kind = 0;
    int k;
    struct ida__rbuf all = r;
    while ((k = ida__r_field(&r, &fl)) == 1) {
        if (fl.num == 1 && fl.type == IDA__WT_LEN) {
            name = fl.sub;
        } else if (fl.num == 2 && fl.type == IDA__WT_VARINT) {
            kind = fl.v;
        } else if (fl.num >= 3 && fl.num <= 5 && fl.type == IDA__WT_LEN) {
            sub[fl.num] = fl.sub;
        }
    }
    size_t nlen = (size_t)(name.end - name.p);
    if (k < 0 || name.p == NULL || nlen > IDA_POOL_NAME_MAX ||
        memchr(name.p, 0, nlen) != NULL ||
        kind < IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE ||
        kind > IDALLOC__POOL_KIND__POOL_KIND_PREFIX) {
        return CORRUPT;
    }
    /* Exactly the sub-message of its kind (field 3 + kind - 1). */
    for (uint32_t i = 3; i <= 5; i++) {
        if ((sub[i].p != NULL) != (i == 3 + kind - 1)) {
            return CORRUPT;
        }
    }
    char pname[IDA_POOL_NAME_MAX + 1] = {0};
    memcpy(pname, name.p, nlen);
    if (!ida_fsm_pool_name_valid(pname) ||
        (f->pool_count > 0 &&
         strcmp(f->pools[f->pool_count - 1]->name, pname) >= 0)) {
        return CORRUPT;
    }
    int rv = 0;
    struct ida__pool *p =
        ahead != NULL && kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED
            ? ida__ahead_take(ahead, (size_t)(all.p - base),
                              (size_t)(all.end - base),
                              (size_t)(sub[4].p - base), helper, &rv)
            : NULL;
    if (p == NULL) {
        p = ida_calloc(1, sizeof(*p));
        if (p == NULL) {
            return IDA_ENOMEM;
        }
        if (kind == IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE) {
            rv = dec_seq(p, sub[3]);
        } else if (kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED) {
            rv = dec_bounded(p, sub[4], helper);
        } else {
            rv = dec_prefix(p, sub[5]);
        }
    }
    memcpy(p->name, pname, sizeof(pname));
    if (rv != 0) {
        goto err_after_pool;
    }
    if (f->pool_count >= IDA_POOLS_MAX) {
        rv = CORRUPT;
        goto err_after_pool;
    }
    rv = ida__fsm_pool_insert(f, p);
    if (rv != 0) {
        goto err_after_pool;
    }
    return 0;

err_after_pool:
    ida__pool_free(p); /* kind is set only once its state is closeable */
    return rv;
}

/* --- sessions ------------------------------------------------------------- */

/* Convert a kept CommandResult back; CORRUPT if it is not one this state
 * machine could have produced. */
static int dec_result(const Idalloc__CommandResult *m, struct ida_fsm_result *r)
{
    memset(r, 0, sizeof(*r));
    int reason = ida__fsm_reason_find((int)m->error, m->error_msg);
    if (reason < 0) {
        return CORRUPT;
    }
    if (m->error != 0) {
        if (m->result_case != IDALLOC__COMMAND_RESULT__RESULT__NOT_SET) {
            return CORRUPT;
        }
        ida__fsm_result_error(r, reason);
        return 0;
    }
    r->error_msg = "";
    switch (m->result_case) {
        case IDALLOC__COMMAND_RESULT__RESULT_POOL_CREATE:
            r->op = IDA_FSM_OP_POOL_CREATE;
            r->flag = m->pool_create->created;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_ALLOC:
            r->op = IDA_FSM_OP_ALLOC;
            r->id = m->alloc->id;
            r->flag = m->alloc->existed;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_FREE:
            r->op = IDA_FSM_OP_FREE;
            r->flag = m->free->freed;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_RESERVE:
            r->op = IDA_FSM_OP_RESERVE;
            r->id = m->reserve->first;
            r->count = m->reserve->count;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC: {
            uint64_t v;
            const ProtobufCBinaryData *b = &m->prefix_alloc->prefix;
            if (ida__prefix_decode(b->data, b->len, &v) != 0) {
                return CORRUPT;
            }
            r->op = IDA_FSM_OP_PREFIX_ALLOC;
            memcpy(r->prefix, b->data, b->len);
            r->prefix_len = (uint8_t)b->len;
            r->flag = m->prefix_alloc->existed;
            return 0;
        }
        case IDALLOC__COMMAND_RESULT__RESULT_RESTORE:
            if (m->restore->pools > IDA_POOLS_MAX) {
                return CORRUPT;
            }
            r->op = IDA_FSM_OP_RESTORE;
            r->id = m->restore->from_index;
            r->count = m->restore->pools;
            return 0;
        default:
            return CORRUPT;
    }
}

static int dec_session_fields(struct ida_fsm *f,
                              const Idalloc__Session *m,
                              const uint8_t *last_id)
{
    if (m->client_id.len != IDA_CLIENT_ID_BYTES ||
        m->n_results > IDA_SESSION_RESULTS_MAX + IDA_SESSION_REFUSED_MAX ||
        m->lru_rank == 0 || m->lru_rank > f->session_clock ||
        m->last_active_ms > f->now_ms || f->session_count >= IDA_SESSIONS_MAX ||
        (last_id != NULL &&
         memcmp(last_id, m->client_id.data, IDA_CLIENT_ID_BYTES) >= 0)) {
        return CORRUPT;
    }
    for (size_t i = 0; i < m->n_results; i++) {
        const Idalloc__SessionResult *sr = m->results[i];
        if (sr->result == NULL || sr->request_seq == 0 ||
            sr->request_seq <= m->evicted_below ||
            (i > 0 && sr->request_seq <= m->results[i - 1]->request_seq)) {
            return CORRUPT;
        }
    }
    return 0;
}

static int dec_session(struct ida_fsm *f,
                       struct ida__rbuf r,
                       const uint8_t **last_id)
{
    Idalloc__Session *m =
        idalloc__session__unpack(NULL, (size_t)(r.end - r.p), r.p);
    if (m == NULL) {
        return CORRUPT;
    }
    int rv = dec_session_fields(f, m, *last_id);
    struct ida__cached *res = rv == 0 && m->n_results > 0
                                  ? ida_malloc(m->n_results * sizeof(*res))
                                  : NULL;
    if (rv == 0 && m->n_results > 0 && res == NULL) {
        rv = IDA_ENOMEM;
    }
    uint32_t refused = 0;
    for (size_t i = 0; rv == 0 && i < m->n_results; i++) {
        res[i].seq = m->results[i]->request_seq;
        res[i].fingerprint = m->results[i]->fingerprint;
        rv = dec_result(m->results[i]->result, &res[i].result);
        refused += rv == 0 && res[i].result.error == IDA_ELIMIT;
    }
    uint32_t answers = (uint32_t)m->n_results - refused;
    if (rv == 0 && (refused > IDA_SESSION_REFUSED_MAX ||
                    answers > IDA_SESSION_RESULTS_MAX ||
                    f->results_total + answers > IDA_RESULTS_TOTAL_MAX ||
                    ida__session_find(f, m->client_id.data) != NULL)) {
        rv = CORRUPT;
    }
    if (rv == 0) {
        struct ida__session *s = ida__session_add(f, m->client_id.data);
        if (s == NULL) {
            rv = IDA_ENOMEM;
        } else {
            s->last_active_ms = m->last_active_ms;
            s->rank = m->lru_rank;
            s->evicted_below = m->evicted_below;
            s->n = s->cap = (uint32_t)m->n_results;
            s->n_refused = refused;
            s->results = s->base = res;
            res = NULL;
            f->results_total += answers;
            *last_id = s->client_id;
        }
    }
    ida_free(res);
    idalloc__session__free_unpacked(m, NULL);
    return rv;
}

static int cmp_rank(const void *a, const void *b)
{
    const struct ida__session *x = *(struct ida__session *const *)a;
    const struct ida__session *y = *(struct ida__session *const *)b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Rebuild the LRU list in rank order; ranks must be unique and
 * last_active_ms must not decrease along it. */
static int relink_sessions(struct ida_fsm *f)
{
    size_t n = f->session_count;
    struct ida__session **v = ida_malloc((n + 1) * sizeof(*v));
    if (v == NULL) {
        return IDA_ENOMEM;
    }
    size_t i = 0;
    for (struct ida__session *s = f->lru_head; s != NULL; s = s->next) {
        v[i++] = s;
    }
    qsort(v, n, sizeof(*v), cmp_rank);
    int rv = 0;
    for (i = 1; i < n; i++) {
        if (v[i]->rank == v[i - 1]->rank ||
            v[i]->last_active_ms < v[i - 1]->last_active_ms) {
            rv = CORRUPT;
        }
    }
    f->lru_head = f->lru_tail = NULL;
    for (i = 0; i < n; i++) {
        v[i]->prev = v[i]->next = NULL;
        if (f->lru_tail == NULL) {
            f->lru_head = v[i];
        } else {
            f->lru_tail->next = v[i];
            v[i]->prev = f->lru_tail;
        }
        f->lru_tail = v[i];
    }
    ida_free(v);
    return rv;
}

/* --- restore -------------------------------------------------------------- */

/* Decode @r (the snapshot at its start, without the checksum) into the
 * empty @f, taking the pools @ahead (may be NULL) decoded. */
static int dec_state(struct ida_fsm *f,
                     struct ida__rbuf r,
                     const struct ida_fsm_helper *helper,
                     struct ida_fsm_ahead *ahead)
{
    const uint8_t *base = r.p;
    struct ida__field fl;
    int k;
    uint64_t version = 0;
    struct ida__rbuf r2 = r;
    /* Pass 1: scalars (sessions are checked against them). */
    while ((k = ida__r_field(&r, &fl)) == 1) {
        if (fl.type != IDA__WT_VARINT) {
            continue;
        }
        switch (fl.num) {
            case 1:
                version = fl.v;
                break;
            case 4:
                f->now_ms = fl.v;
                break;
            case 5:
                f->applied_index = fl.v;
                break;
            case 6:
                f->session_clock = fl.v;
                break;
        }
    }
    if (k < 0) {
        return CORRUPT;
    }
    if (version != IDA_FSM_STATE_VERSION) {
        return IDA_EVERSION;
    }
    const uint8_t *last_id = NULL;
    while ((k = ida__r_field(&r2, &fl)) == 1) {
        int rv = 0;
        if (fl.num == 2 && fl.type == IDA__WT_LEN) {
            rv = dec_pool(f, fl.sub, helper, base, ahead);
        } else if (fl.num == 3 && fl.type == IDA__WT_LEN) {
            rv = dec_session(f, fl.sub, &last_id);
        }
        if (rv != 0) {
            return rv;
        }
    }
    if (k < 0) {
        return CORRUPT;
    }
    return relink_sessions(f);
}

int ida_fsm_restore(struct ida_fsm *f, const uint8_t *data, size_t len)
{
    return ida_fsm_restore_with(f, data, len, NULL);
}

/* The checksum runs on the lent thread while the decoding starts (at 10 M
 * allocations it is ~90 ms of reading 180 MB, which no decoding step
 * needs): the decoder's own use of the thread first waits for it. A
 * mismatch then throws away what was decoded, so damaged bytes still
 * change nothing; the decoder checks every field anyway, as it must for
 * bytes whose checksum a forger made right. A snapshot decoded ahead as it
 * arrived was summed as it came (ida__ahead_sum()): its checksum is
 * compared before anything is decoded, and the thread is left to the
 * phases. */
struct sum_job
{
    const uint8_t *p;
    size_t len;
    uint64_t sum;
};

static void sum_run(void *arg)
{
    struct sum_job *j = arg;
    j->sum = ida__snapshot_checksum(j->p, j->len);
}

/* The caller's helper, with the checksum job possibly still on it. */
struct lent
{
    const struct ida_fsm_helper *inner;
    bool busy; /* the checksum job has not been joined */
};

static void lent_wait(struct lent *l)
{
    if (l->busy) {
        l->inner->join(l->inner->ctx);
        l->busy = false;
    }
}

static int lent_start(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct lent *l = ctx;
    lent_wait(l);
    return l->inner->start(l->inner->ctx, fn, arg);
}

static void lent_join(void *ctx)
{
    struct lent *l = ctx;
    l->inner->join(l->inner->ctx);
}

int ida_fsm_restore_with(struct ida_fsm *f,
                         const uint8_t *data,
                         size_t len,
                         const struct ida_fsm_helper *helper)
{
    return ida_fsm_restore_ahead(f, data, len, helper, NULL);
}

int ida_fsm_restore_ahead(struct ida_fsm *f,
                          const uint8_t *data,
                          size_t len,
                          const struct ida_fsm_helper *helper,
                          struct ida_fsm_ahead *ahead)
{
    IDA_ASSERT(f != NULL);
    if (data == NULL && len > 0) {
        return IDA_EINVAL;
    }
    if (len < IDA__CHECKSUM_BYTES ||
        data[len - IDA__CHECKSUM_BYTES] != IDA__CHECKSUM_KEY) {
        return CORRUPT;
    }
    uint64_t sum = 0;
    for (int b = 7; b >= 0; b--) {
        sum = (sum << 8) | data[len - 8 + (size_t)b];
    }
    struct sum_job job = {data, len - IDA__CHECKSUM_BYTES, 0};
    struct lent l = {helper, false};
    struct ida_fsm_helper wrapped = {lent_start, lent_join, &l};
    /* Summed as the bytes came (snap_ahead.c): checked before anything
     * is decoded, and the thread is free for the phases. */
    bool summed = ida__ahead_sum(ahead, len, &job.sum);
    if (summed && job.sum != sum) {
        return CORRUPT;
    }
    l.busy = !summed && helper != NULL &&
             helper->start(helper->ctx, sum_run, &job) == 0;
    if (!summed && !l.busy) {
        sum_run(&job); /* no thread: checked before anything is decoded */
        if (job.sum != sum) {
            return CORRUPT;
        }
    }
    struct ida_fsm *n = NULL;
    int rv = ida_fsm_new(&n);
    if (rv == 0) {
        struct ida__rbuf r = {data, data + job.len};
        rv = dec_state(n, r, helper != NULL ? &wrapped : NULL, ahead);
    }
    lent_wait(&l);
    if (job.sum != sum) {
        rv = CORRUPT; /* whatever the decoding made of the bytes */
    }
    if (rv != 0) {
        ida_fsm_free(n);
        return rv;
    }
    ida_fsm_replace(f, n); /* @f takes the new state, the old is freed */
    return 0;
}
