/* The allocator state machine: apply, pools, sessions, reads. */
#include "fsm/fsm.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/utf8.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

/* --- reasons ------------------------------------------------------------- */

static const struct
{
    int code;
    const char *text;
} reasons[] = {
#define IDA__R_ROW(name, c, t) {c, t},
    IDA__FSM_REASONS(IDA__R_ROW)
#undef IDA__R_ROW
};

void ida__fsm_result_error(struct ida_fsm_result *r,
                           enum ida__fsm_reason reason)
{
    IDA_ASSERT(reason > IDA__R_OK && reason < IDA__R_COUNT_);
    memset(r, 0, sizeof(*r));
    r->error = reasons[reason].code;
    r->error_msg = reasons[reason].text;
}

int ida__fsm_reason_find(int code, const char *text)
{
    for (int i = 0; i < IDA__R_COUNT_; i++) {
        if (reasons[i].code == code && strcmp(reasons[i].text, text) == 0) {
            return i;
        }
    }
    return -1;
}

static void result_ok(struct ida_fsm_result *r, enum ida_fsm_op op)
{
    memset(r, 0, sizeof(*r));
    r->error_msg = "";
    r->op = op;
}

/* --- validity ------------------------------------------------------------- */

static bool name_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
           c == '-';
}

/* IDA__R_OK when the @len bytes at @name are a valid pool name. */
static int check_name(const uint8_t *name, size_t len)
{
    if (len < 1 || len > IDA_POOL_NAME_MAX) {
        return IDA__R_POOL_NAME;
    }
    for (size_t i = 0; i < len; i++) {
        if (!name_char_ok((char)name[i])) {
            return IDA__R_POOL_NAME; /* a NUL byte included */
        }
    }
    return IDA__R_OK;
}

bool ida_fsm_pool_name_valid(const char *name)
{
    return name != NULL &&
           check_name((const uint8_t *)name,
                      strnlen(name, IDA_POOL_NAME_MAX + 1)) == IDA__R_OK;
}

/* IDA__R_OK when the @len bytes at @tag are a valid tag; @utf8: the rule of
 * batches of version 2 and of every read (see IDA_TAG_BYTES_MAX). */
static int check_tag(const uint8_t *tag, size_t len, bool utf8)
{
    if (len == 0) {
        return IDA__R_TAG_EMPTY;
    }
    if (len > IDA_TAG_BYTES_MAX) {
        return IDA__R_TAG_LONG;
    }
    if (memchr(tag, '\0', len) != NULL) {
        return IDA__R_TAG_NUL;
    }
    if (utf8 && !ida_utf8_valid(tag, len)) {
        return IDA__R_TAG_UTF8;
    }
    return IDA__R_OK;
}

bool ida_fsm_tag_valid(const char *tag)
{
    return tag != NULL &&
           check_tag((const uint8_t *)tag, strnlen(tag, IDA_TAG_BYTES_MAX + 1),
                     true) == IDA__R_OK;
}

static int get_checked(int reason,
                       const ProtobufCBinaryData *in,
                       char *out,
                       const char **why)
{
    if (reason != IDA__R_OK) {
        out[0] = '\0';
        *why = reasons[reason].text;
        return reasons[reason].code;
    }
    if (in->len > 0) {
        memcpy(out, in->data, in->len);
    }
    out[in->len] = '\0';
    *why = "";
    return 0;
}

int ida_fsm_pool_name_get(const ProtobufCBinaryData *in,
                          char out[IDA_POOL_NAME_MAX + 1],
                          const char **why)
{
    return get_checked(check_name(in->data, in->len), in, out, why);
}

int ida_fsm_tag_get(const ProtobufCBinaryData *in,
                    char out[IDA_TAG_BYTES_MAX + 1],
                    const char **why)
{
    return get_checked(check_tag(in->data, in->len, true), in, out, why);
}

/* --- pools ---------------------------------------------------------------- */

/* Index of the first pool whose name is >= @name. */
static size_t pool_lower_bound(const struct ida_fsm *f, const char *name)
{
    size_t lo = 0, hi = f->pool_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(f->pools[mid]->name, name) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

struct ida__pool *ida__fsm_pool_find(const struct ida_fsm *f, const char *name)
{
    size_t i = pool_lower_bound(f, name);
    if (i < f->pool_count && strcmp(f->pools[i]->name, name) == 0) {
        return f->pools[i];
    }
    return NULL;
}

int ida__fsm_pool_insert(struct ida_fsm *f, struct ida__pool *p)
{
    if (f->pool_count == f->pool_cap) {
        size_t ncap = f->pool_cap == 0 ? 8 : f->pool_cap * 2;
        struct ida__pool **np = ida_realloc(f->pools, ncap * sizeof(*np));
        if (np == NULL) {
            return IDA_ENOMEM;
        }
        f->pools = np;
        f->pool_cap = ncap;
    }
    size_t i = pool_lower_bound(f, p->name);
    IDA_ASSERT(i == f->pool_count || strcmp(f->pools[i]->name, p->name) > 0);
    memmove(&f->pools[i + 1], &f->pools[i],
            (f->pool_count - i) * sizeof(*f->pools));
    f->pools[i] = p;
    f->pool_count++;
    return 0;
}

void ida__pool_free(struct ida__pool *p)
{
    if (p == NULL) {
        return;
    }
    if (p->kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED) {
        ida__bounded_close(&p->u.bounded);
    } else if (p->kind == IDALLOC__POOL_KIND__POOL_KIND_PREFIX) {
        ida__prefix_close(&p->u.prefix);
    }
    ida_free(p);
}

/* --- lifetime ------------------------------------------------------------- */

int ida_fsm_new(struct ida_fsm **out)
{
    struct ida_fsm *f = ida_calloc(1, sizeof(*f));
    if (f == NULL) {
        return IDA_ENOMEM;
    }
    ida__tagtab_init(&f->sessions, ida__session_key, f);
    *out = f;
    return 0;
}

void ida_fsm_free(struct ida_fsm *f)
{
    if (f == NULL) {
        return;
    }
    for (size_t i = 0; i < f->pool_count; i++) {
        ida__pool_free(f->pools[i]);
    }
    ida_free(f->pools);
    while (f->lru_head != NULL) {
        struct ida__session *s = f->lru_head;
        f->lru_head = s->next;
        ida_free(s->base);
        ida_free(s);
    }
    ida_free(f->sess_refs);
    ida_free(f->sess_free);
    ida__tagtab_close(&f->sessions);
    ida_free(f->replies);
    ida_free(f->pre);
    ida__arena_release(&f->arena);
    ida_free(f);
}

void ida_fsm_replace(struct ida_fsm *dst, struct ida_fsm *src)
{
    IDA_ASSERT(dst != NULL);
    IDA_ASSERT(src != NULL);
    IDA_ASSERT(dst != src);
    /* Swap the contents, then free @src, which holds the old state. The
     * tables point back at their owner (ctx), so re-aim the sessions table
     * of both. Each keeps its own reply buffer: the replies of the last
     * apply stay where ida_fsm_applied said they were. The scratch of
     * worked-out commands (pre, pre_cap) moves with the state: nothing
     * points into it between applies. */
    struct ida_fsm old = *dst;
    struct ida_fsm_reply *replies = src->replies;
    size_t replies_cap = src->replies_cap;
    *dst = *src;
    dst->sessions.ctx = dst;
    dst->replies = old.replies;
    dst->replies_cap = old.replies_cap;
    *src = old;
    src->sessions.ctx = src;
    src->replies = replies;
    src->replies_cap = replies_cap;
    ida_fsm_free(src);
}

ida_index ida_fsm_applied_index(const struct ida_fsm *f)
{
    return f->applied_index;
}

uint64_t ida_fsm_now_ms(const struct ida_fsm *f)
{
    return f->now_ms;
}

size_t ida_fsm_pool_count(const struct ida_fsm *f)
{
    return f->pool_count;
}

size_t ida_fsm_session_count(const struct ida_fsm *f)
{
    return f->session_count;
}

void ida_fsm_pool_info(const struct ida_fsm *f,
                       size_t i,
                       struct ida_fsm_pool_info *out)
{
    IDA_ASSERT(i < f->pool_count);
    const struct ida__pool *p = f->pools[i];
    memset(out, 0, sizeof(*out));
    out->name = p->name;
    out->kind = p->kind;
    switch (p->kind) {
        case IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE:
            out->used = p->u.seq_next;
            break;
        case IDALLOC__POOL_KIND__POOL_KIND_BOUNDED:
            out->size = p->u.bounded.size;
            out->used = p->u.bounded.held;
            break;
        default:
            out->used = p->u.prefix.n;
            break;
    }
}

uint64_t ida_fsm_results_count(const struct ida_fsm *f)
{
    return f->results_total;
}

/* --- operations ----------------------------------------------------------- */

/* The pool named @name of @kind, or a reason. */
static int pool_of(struct ida_fsm *f,
                   const char *name,
                   Idalloc__PoolKind kind,
                   struct ida__pool **out)
{
    if (!ida_fsm_pool_name_valid(name)) {
        return IDA__R_POOL_NAME;
    }
    struct ida__pool *p = ida__fsm_pool_find(f, name);
    if (p == NULL) {
        return IDA__R_NO_POOL;
    }
    if (p->kind != kind) {
        switch (kind) {
            case IDALLOC__POOL_KIND__POOL_KIND_BOUNDED:
                return IDA__R_NOT_BOUNDED;
            case IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE:
                return IDA__R_NOT_SEQUENCE;
            default:
                return IDA__R_NOT_PREFIX;
        }
    }
    *out = p;
    return IDA__R_OK;
}

/* The name of a command (bytes) as a C string in @out, or a reason. */
static int name_of(const ProtobufCBinaryData *in,
                   char out[IDA_POOL_NAME_MAX + 1])
{
    int rv = check_name(in->data, in->len);
    if (rv == IDA__R_OK) {
        memcpy(out, in->data, in->len);
        out[in->len] = '\0';
    }
    return rv;
}

/* The pool a command names (bytes), of @kind, or a reason. The pool
 * named last is compared first (its name is valid: every pool's is). */
static int pool_of_cmd(struct ida_fsm *f,
                       const ProtobufCBinaryData *name,
                       Idalloc__PoolKind kind,
                       struct ida__pool **out)
{
    struct ida__pool *last = f->last_pool;
    if (last != NULL && name->len == f->last_pool_len &&
        memcmp(name->data, last->name, name->len) == 0 && last->kind == kind) {
        *out = last;
        return IDA__R_OK;
    }
    char s[IDA_POOL_NAME_MAX + 1];
    int rv = name_of(name, s);
    rv = rv != IDA__R_OK ? rv : pool_of(f, s, kind, out);
    if (rv == IDA__R_OK) {
        f->last_pool = *out;
        f->last_pool_len = name->len;
    }
    return rv;
}

static int op_pool_create(struct ida_fsm *f,
                          const Idalloc__PoolCreate *m,
                          struct ida_fsm_result *r)
{
    char name[IDA_POOL_NAME_MAX + 1];
    if (name_of(&m->name, name) != IDA__R_OK) {
        return IDA__R_POOL_NAME;
    }
    if (m->kind != IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE &&
        m->kind != IDALLOC__POOL_KIND__POOL_KIND_BOUNDED &&
        m->kind != IDALLOC__POOL_KIND__POOL_KIND_PREFIX) {
        return IDA__R_KIND_UNKNOWN;
    }
    if (m->kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED && m->size == 0) {
        return IDA__R_SIZE_BOUNDED;
    }
    if (m->kind != IDALLOC__POOL_KIND__POOL_KIND_BOUNDED && m->size != 0) {
        return IDA__R_SIZE_OTHER;
    }
    struct ida__pool *old = ida__fsm_pool_find(f, name);
    if (old != NULL) {
        bool same = old->kind == m->kind &&
                    (old->kind != IDALLOC__POOL_KIND__POOL_KIND_BOUNDED ||
                     old->u.bounded.size == m->size);
        if (!same) {
            return IDA__R_POOL_EXISTS;
        }
        result_ok(r, IDA_FSM_OP_POOL_CREATE);
        r->flag = false;
        return IDA__R_OK;
    }
    if (f->pool_count >= IDA_POOLS_MAX) {
        return IDA__R_POOLS_MAX;
    }
    struct ida__pool *p = ida_calloc(1, sizeof(*p));
    if (p == NULL) {
        return -IDA_ENOMEM;
    }
    strcpy(p->name, name);
    p->kind = m->kind;
    if (p->kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED) {
        ida__bounded_init(&p->u.bounded, m->size);
    } else if (p->kind == IDALLOC__POOL_KIND__POOL_KIND_PREFIX) {
        ida__prefix_init(&p->u.prefix);
    } else {
        p->u.seq_next = 1;
    }
    if (ida__fsm_pool_insert(f, p) != 0) {
        ida_free(p); /* still empty: nothing else to release */
        return -IDA_ENOMEM;
    }
    result_ok(r, IDA_FSM_OP_POOL_CREATE);
    r->flag = true;
    return IDA__R_OK;
}

static int op_alloc(struct ida_fsm *f,
                    const Idalloc__Alloc *m,
                    const struct ida__cmd_pre *pre,
                    struct ida_fsm_result *r)
{
    struct ida__pool *p;
    size_t len = m->tag.len;
    int rv =
        pool_of_cmd(f, &m->pool, IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, &p);
    if (rv == IDA__R_OK) {
        rv = pre->tag_check;
    }
    if (rv != IDA__R_OK) {
        return rv;
    }
    uint64_t id;
    bool existed;
    rv = ida__bounded_alloc(&p->u.bounded, (const char *)m->tag.data, len,
                            pre->tag_hash, &id, &existed);
    if (rv == IDA__R_OK) {
        result_ok(r, IDA_FSM_OP_ALLOC);
        r->id = id;
        r->flag = existed;
    }
    return rv;
}

static int op_free(struct ida_fsm *f,
                   const Idalloc__Free *m,
                   const struct ida__cmd_pre *pre,
                   struct ida_fsm_result *r)
{
    struct ida__pool *p;
    size_t len = m->tag.len;
    int rv =
        pool_of_cmd(f, &m->pool, IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, &p);
    if (rv == IDA__R_OK) {
        rv = pre->tag_check;
    }
    if (rv != IDA__R_OK) {
        return rv;
    }
    bool freed;
    rv = ida__bounded_free(&p->u.bounded, m->id, (const char *)m->tag.data, len,
                           pre->tag_hash, &freed);
    if (rv == IDA__R_OK) {
        result_ok(r, IDA_FSM_OP_FREE);
        r->flag = freed;
    }
    return rv;
}

static int op_reserve(struct ida_fsm *f,
                      const Idalloc__Reserve *m,
                      struct ida_fsm_result *r)
{
    struct ida__pool *p;
    int rv =
        pool_of_cmd(f, &m->pool, IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE, &p);
    if (rv != IDA__R_OK) {
        return rv;
    }
    if (m->count == 0) {
        return IDA__R_COUNT_ZERO;
    }
    if (m->count > IDA_RESERVE_COUNT_MAX) {
        return IDA__R_COUNT_BIG;
    }
    /* [first, first + count) must end at or before UINT64_MAX. */
    if (p->u.seq_next > UINT64_MAX - m->count) {
        return IDA__R_SEQ_END;
    }
    result_ok(r, IDA_FSM_OP_RESERVE);
    r->id = p->u.seq_next;
    r->count = m->count;
    p->u.seq_next += m->count;
    IDA_ASSERT(p->u.seq_next > r->id); /* blocks never overlap */
    return IDA__R_OK;
}

static int op_prefix(struct ida_fsm *f,
                     const Idalloc__PrefixAlloc *m,
                     uint64_t seed,
                     bool utf8,
                     struct ida_fsm_result *r)
{
    struct ida__pool *p;
    size_t len = m->tag.len;
    int rv = pool_of_cmd(f, &m->pool, IDALLOC__POOL_KIND__POOL_KIND_PREFIX, &p);
    if (rv == IDA__R_OK) {
        rv = check_tag(m->tag.data, len, utf8);
    }
    if (rv != IDA__R_OK) {
        return rv;
    }
    uint64_t v;
    bool existed;
    rv = ida__prefix_alloc(&p->u.prefix, (const char *)m->tag.data, len, seed,
                           &v, &existed);
    if (rv == IDA__R_OK) {
        result_ok(r, IDA_FSM_OP_PREFIX_ALLOC);
        r->prefix_len = (uint8_t)ida__prefix_encode(v, r->prefix);
        r->flag = existed;
    }
    return rv;
}

/* Load the pools of a backup (an FsmState, @len bytes at @state) into
 * @f, which has none. Only the pools come over: the backup's sessions
 * belong to clients of the old cluster, and the applied index, clock and
 * sessions stay @f's. Decoded and checked in full (ida_fsm_restore) before
 * anything here changes; then every sequence pool moves @advance on.
 * IDA__R_OK, a refusal's reason, or -IDA_ENOMEM. */
static int load_pools(struct ida_fsm *f,
                      const uint8_t *state,
                      size_t len,
                      uint64_t advance)
{
    if (f->pool_count > 0) {
        return IDA__R_RESTORE_NOT_EMPTY;
    }
    struct ida_fsm *n;
    if (ida_fsm_new(&n) != 0) {
        return -IDA_ENOMEM;
    }
    int rv = ida_fsm_restore(n, state, len);
    if (rv == IDA_ENOMEM) {
        ida_fsm_free(n);
        return -IDA_ENOMEM;
    }
    if (rv != 0) {
        ida_fsm_free(n);
        return IDA__R_RESTORE_BAD;
    }
    for (size_t i = 0; i < n->pool_count; i++) {
        const struct ida__pool *p = n->pools[i];
        if (p->kind == IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE &&
            p->u.seq_next > UINT64_MAX - advance) {
            ida_fsm_free(n);
            return IDA__R_RESTORE_ADVANCE;
        }
    }
    for (size_t i = 0; i < n->pool_count; i++) {
        struct ida__pool *p = n->pools[i];
        if (p->kind == IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE) {
            p->u.seq_next += advance;
        }
    }
    /* Swap the (empty) pool tables: @f takes the backup's. */
    struct ida__pool **pools = f->pools;
    size_t cap = f->pool_cap;
    f->pools = n->pools;
    f->pool_count = n->pool_count;
    f->pool_cap = n->pool_cap;
    n->pools = pools;
    n->pool_count = 0;
    n->pool_cap = cap;
    ida_fsm_free(n);
    return IDA__R_OK;
}

/* The Restore command (`idalloc snapshot restore`): load_pools(). */
static int op_restore(struct ida_fsm *f,
                      const Idalloc__Restore *m,
                      struct ida_fsm_result *r)
{
    int rv = load_pools(f, m->state.data, m->state.len, m->advance_sequences);
    if (rv != IDA__R_OK) {
        return rv;
    }
    result_ok(r, IDA_FSM_OP_RESTORE);
    r->id = m->from_index;
    r->count = f->pool_count;
    return IDA__R_OK;
}

int ida_fsm_import(struct ida_fsm *f,
                   const uint8_t *state,
                   size_t len,
                   uint64_t advance,
                   ida_index index)
{
    IDA_ASSERT(f != NULL);
    if (index == 0 || f->applied_index != 0 || f->session_count != 0 ||
        (state == NULL && len > 0)) {
        return IDA_EINVAL;
    }
    int rv = load_pools(f, state, len, advance);
    if (rv == -IDA_ENOMEM) {
        return IDA_ENOMEM;
    }
    if (rv != IDA__R_OK) {
        return rv == IDA__R_RESTORE_NOT_EMPTY ? IDA_EINVAL
               : rv == IDA__R_RESTORE_BAD     ? IDA_ECORRUPT
                                              : IDA_EEXHAUSTED;
    }
    f->applied_index = index;
    return 0;
}

/* The PRNG seed of command @pos of entry @index. */
static uint64_t seed_of(ida_index index, size_t pos)
{
    uint64_t z = index * UINT64_C(0x9e3779b97f4a7c15) ^
                 ((uint64_t)pos + 1) * UINT64_C(0xc2b2ae3d27d4eb4f);
    z ^= z >> 29;
    return z;
}

/* Run @c's operation: IDA__R_OK with @r filled, a reason, or -IDA_ENOMEM. */
static int execute(struct ida_fsm *f,
                   const Idalloc__Command *c,
                   const struct ida__cmd_pre *pre,
                   uint64_t seed,
                   bool utf8,
                   struct ida_fsm_result *r)
{
    switch (c->op_case) {
        case IDALLOC__COMMAND__OP_POOL_CREATE:
            return op_pool_create(f, c->pool_create, r);
        case IDALLOC__COMMAND__OP_ALLOC:
            return op_alloc(f, c->alloc, pre, r);
        case IDALLOC__COMMAND__OP_FREE:
            return op_free(f, c->free, pre, r);
        case IDALLOC__COMMAND__OP_RESERVE:
            return op_reserve(f, c->reserve, r);
        case IDALLOC__COMMAND__OP_PREFIX_ALLOC:
            return op_prefix(f, c->prefix_alloc, seed, utf8, r);
        case IDALLOC__COMMAND__OP_RESTORE:
            return op_restore(f, c->restore, r);
        default:
            return IDA__R_NO_OP;
    }
}

/* RegisterClient: create or refresh the session of @client_id. 0 or
 * IDA_ENOMEM (nothing changed). */
static int register_client(struct ida_fsm *f,
                           const uint8_t *client_id,
                           struct ida_fsm_reply *reply)
{
    struct ida__session *s = ida__session_find(f, client_id);
    bool created = s == NULL;
    if (s == NULL) {
        if (f->session_count >= IDA_SESSIONS_MAX) {
            /* Only a session idle for long may make room: a client with
             * calls in flight is never dropped for another's registration
             * (fsm.h, "Sessions"). */
            struct ida__session *old = f->lru_head;
            if (f->now_ms - old->last_active_ms < IDA_SESSION_EVICT_IDLE_MS) {
                ida__fsm_result_error(&reply->result, IDA__R_SESSIONS_FULL);
                return 0;
            }
            ida__session_drop(f, old);
        }
        s = ida__session_add(f, client_id);
        if (s == NULL) {
            return IDA_ENOMEM;
        }
    }
    ida__session_touch(f, s);
    result_ok(&reply->result, IDA_FSM_OP_REGISTER);
    reply->result.flag = created;
    return 0;
}

/* Apply one command with its session rules (fsm.h, "Sessions"). 0 or
 * IDA_ENOMEM (nothing of this command applied). */
static int apply_command(struct ida_fsm *f,
                         const Idalloc__Command *c,
                         const struct ida__cmd_pre *pre,
                         uint64_t seed,
                         bool utf8,
                         struct ida_fsm_reply *reply)
{
    memset(reply, 0, sizeof(*reply));
    reply->request_seq = c->request_seq;
    if (c->client_id.len != IDA_CLIENT_ID_BYTES) {
        ida__fsm_result_error(&reply->result, IDA__R_CLIENT_ID);
        return 0;
    }
    memcpy(reply->client_id, c->client_id.data, IDA_CLIENT_ID_BYTES);
    if (c->request_seq == 0) {
        ida__fsm_result_error(&reply->result, IDA__R_SEQ_ZERO);
        return 0;
    }
    if (c->op_case == IDALLOC__COMMAND__OP_REGISTER_CLIENT) {
        return register_client(f, c->client_id.data, reply);
    }
    struct ida__session *s =
        ida__session_find_hashed(f, c->client_id.data, pre->client_hash);
    if (s == NULL) {
        /* Never executed: the client cannot know whether an earlier copy
         * ran before its session went, so only a definite "not now". */
        ida__fsm_result_error(&reply->result, IDA__R_NO_SESSION);
        return 0;
    }
    if (c->ack_below > c->request_seq) {
        ida__fsm_result_error(&reply->result, IDA__R_ACK_ABOVE);
        return 0;
    }
    uint64_t fp = pre->fp;
    const struct ida__cached *k = ida__session_lookup(s, c->request_seq);
    if (k == NULL && c->request_seq > s->evicted_below &&
        ida__session_room(s) == 0 &&
        s->n < IDA_SESSION_RESULTS_MAX + IDA_SESSION_REFUSED_MAX &&
        ida__session_reserve(s) != 0) {
        /* Room first, so an ENOMEM leaves the command undone rather than
         * done but unrecorded. */
        return IDA_ENOMEM;
    }
    ida__session_ack(f, s, c->ack_below);
    ida__session_touch(f, s);
    if (k != NULL) {
        k = ida__session_lookup(s, c->request_seq); /* the ack moved it */
        if (k->fingerprint != fp) {
            ida__fsm_result_error(&reply->result, IDA__R_REUSED);
        } else {
            reply->result = k->result;
            reply->cached = true;
        }
        return 0;
    }
    if (c->request_seq <= s->evicted_below) {
        ida__fsm_result_error(&reply->result, IDA__R_SESSION_GONE);
        return 0;
    }
    if (ida__session_answers(s) >= IDA_SESSION_RESULTS_MAX ||
        f->results_total >= IDA_RESULTS_TOTAL_MAX) {
        if (s->n_refused >= IDA_SESSION_REFUSED_MAX) {
            ida__session_drop(f, s);
            ida__fsm_result_error(&reply->result, IDA__R_SESSION_OVERFLOW);
            return 0;
        }
        ida__fsm_result_error(&reply->result,
                              ida__session_answers(s) >= IDA_SESSION_RESULTS_MAX
                                  ? IDA__R_RESULTS_MAX
                                  : IDA__R_RESULTS_TOTAL);
        ida__session_keep(f, s, c->request_seq, fp, &reply->result);
        return 0;
    }
    int rv = execute(f, c, pre, seed, utf8, &reply->result);
    if (rv < 0) {
        return -rv;
    }
    if (rv != IDA__R_OK) {
        ida__fsm_result_error(&reply->result, rv);
    }
    ida__session_keep(f, s, c->request_seq, fp, &reply->result);
    return 0;
}

/* Room for @n items of @size bytes in the array *@p, which has room for
 * *@cap: grown when short (doubling from 64; *@p and *@cap updated). 0, or
 * IDA_ENOMEM with both unchanged. */
static int reserve_items(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap) {
        return 0;
    }
    size_t ncap = *cap == 0 ? 64 : *cap;
    while (ncap < n) {
        ncap *= 2;
    }
    void *np = ida_realloc(*p, ncap * size);
    if (np == NULL) {
        return IDA_ENOMEM;
    }
    *p = np;
    *cap = ncap;
    return 0;
}

static int reserve_replies(struct ida_fsm *f, size_t n)
{
    void *r = f->replies;
    int rv = reserve_items(&r, &f->replies_cap, n, sizeof(*f->replies));
    f->replies = r;
    return rv;
}

static int reserve_pre(struct ida_fsm *f, size_t n)
{
    void *p = f->pre;
    int rv = reserve_items(&p, &f->pre_cap, n, sizeof(*f->pre));
    f->pre = p;
    return rv;
}

/* A batch's allocs and frees have the tag table slot each will probe
 * prefetched this many commands ahead of the one applied. With millions of
 * tags the table is far larger than the cache and every probe is a miss;
 * this way the misses of a batch overlap instead of following one another
 * (a restart's or a new node's replay of the log is apply-bound). */
#define PREFETCH_AHEAD 8

/* The tag of command @c when it is an alloc or a free (NULL otherwise), and
 * its pool's name in *@pool. */
static const ProtobufCBinaryData *tag_of(const Idalloc__Command *c,
                                         const ProtobufCBinaryData **pool)
{
    if (c->op_case == IDALLOC__COMMAND__OP_ALLOC && c->alloc != NULL) {
        *pool = &c->alloc->pool;
        return &c->alloc->tag;
    }
    if (c->op_case == IDALLOC__COMMAND__OP_FREE && c->free != NULL) {
        *pool = &c->free->pool;
        return &c->free->tag;
    }
    return NULL;
}

void ida__fsm_pre(const Idalloc__Command *c,
                  uint32_t version,
                  struct ida__cmd_pre *out)
{
    memset(out, 0, sizeof(*out));
    out->fp = ida__fsm_fingerprint(c);
    if (c->client_id.len == IDA_CLIENT_ID_BYTES) {
        out->client_hash = ida__hash(c->client_id.data, IDA_CLIENT_ID_BYTES);
    }
    const ProtobufCBinaryData *pool;
    const ProtobufCBinaryData *tag = tag_of(c, &pool);
    if (tag != NULL) {
        out->tag_check = check_tag(tag->data, tag->len, version >= 2);
        if (out->tag_check == IDA__R_OK) {
            out->tag_hash = ida__hash(tag->data, tag->len);
        }
    }
}

/* Prefetch the slot command @c (an alloc or a free in a bounded pool, its
 * tag's hash in @pre) will probe. Reads only, and only now: the pool is
 * looked up afresh each time, since a command applied meanwhile may
 * replace the pools. */
static void prefetch_tag(struct ida_fsm *f,
                         const Idalloc__Command *c,
                         const struct ida__cmd_pre *pre)
{
    const ProtobufCBinaryData *pool;
    struct ida__pool *p;
    if (tag_of(c, &pool) != NULL && pre->tag_check == IDA__R_OK &&
        pool_of_cmd(f, pool, IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, &p) ==
            IDA__R_OK) {
        ida__tagtab_prefetch(&p->u.bounded.tab, pre->tag_hash);
    }
}

/* @pre: the commands worked out ahead, or NULL to work them out first. */
static int apply_batch(struct ida_fsm *f,
                       ida_index index,
                       const Idalloc__CommandBatch *b,
                       const struct ida__cmd_pre *pre,
                       struct ida_fsm_applied *out)
{
    int rv = reserve_replies(f, b->n_commands);
    if (rv == 0 && pre == NULL) {
        rv = reserve_pre(f, b->n_commands);
        for (size_t i = 0; rv == 0 && i < b->n_commands; i++) {
            ida__fsm_pre(b->commands[i], b->version, &f->pre[i]);
        }
        pre = f->pre;
    }
    if (rv != 0) {
        return rv;
    }
    if (b->timestamp_ms > f->now_ms) {
        f->now_ms = b->timestamp_ms; /* "now" never goes back */
    }
    ida__sessions_expire(f);
    for (size_t i = 0; i < b->n_commands && i < PREFETCH_AHEAD; i++) {
        prefetch_tag(f, b->commands[i], &pre[i]);
    }
    for (size_t i = 0; i < b->n_commands; i++) {
        if (i + PREFETCH_AHEAD < b->n_commands) {
            prefetch_tag(f, b->commands[i + PREFETCH_AHEAD],
                         &pre[i + PREFETCH_AHEAD]);
        }
        rv = apply_command(f, b->commands[i], &pre[i], seed_of(index, i),
                           b->version >= 2, &f->replies[i]);
        if (rv != 0) {
            return rv;
        }
    }
    out->count = b->n_commands;
    out->replies = f->replies;
    return 0;
}

int ida__fsm_apply_decoded(struct ida_fsm *f,
                           ida_index index,
                           enum ida_entry_type type,
                           const Idalloc__CommandBatch *b,
                           bool out_of_memory,
                           const struct ida__cmd_pre *pre,
                           struct ida_fsm_applied *out)
{
    memset(out, 0, sizeof(*out));
    out->index = index;
    if (index != f->applied_index + 1) {
        return IDA_EINVAL;
    }
    if (type != IDA_ENTRY_NORMAL && type != IDA_ENTRY_NOOP &&
        type != IDA_ENTRY_CONFIG) {
        return IDA_EINVAL;
    }
    if (type == IDA_ENTRY_NORMAL) {
        if (b == NULL && out_of_memory) {
            /* Out of memory is local, not a property of the entry: it must
             * not be mistaken for a malformed batch (replicas would part). */
            return IDA_ENOMEM;
        }
        if (b == NULL) {
            out->entry_error = IDA_EPROTO;
        } else if (b->version < IDA_BATCH_VERSION_MIN ||
                   b->version > IDA_BATCH_VERSION) {
            out->entry_error = IDA_EVERSION;
        } else if (b->n_commands > IDA_BATCH_COMMANDS_MAX) {
            out->entry_error = IDA_ETOOBIG;
        } else {
            int rv = apply_batch(f, index, b, pre, out);
            if (rv != 0) {
                memset(out, 0, sizeof(*out));
                out->index = index;
                return rv;
            }
        }
    }
    f->applied_index = index;
    return 0;
}

int ida_fsm_apply(struct ida_fsm *f,
                  ida_index index,
                  enum ida_entry_type type,
                  const uint8_t *data,
                  size_t len,
                  struct ida_fsm_applied *out)
{
    IDA_ASSERT(f != NULL && out != NULL);
    const Idalloc__CommandBatch *b = NULL;
    if (type == IDA_ENTRY_NORMAL && index == f->applied_index + 1) {
        /* Decoded into the arena: freed all at once by the next reset. */
        ida__arena_reset(&f->arena);
        b = ida__batch_unpack(&f->arena, data, len);
    }
    return ida__fsm_apply_decoded(f, index, type, b, f->arena.failed, NULL,
                                  out);
}

/* --- reads ---------------------------------------------------------------- */

static int reason_code(int reason)
{
    return reasons[reason].code;
}

int ida_fsm_lookup(const struct ida_fsm *f,
                   const char *pool,
                   const char *tag,
                   uint64_t *id)
{
    struct ida__pool *p;
    size_t len = tag != NULL ? strnlen(tag, IDA_TAG_BYTES_MAX + 1) : 0;
    int rv = pool_of((struct ida_fsm *)f, pool,
                     IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, &p);
    if (rv == IDA__R_OK) {
        rv = check_tag((const uint8_t *)tag, len, true);
    }
    if (rv != IDA__R_OK) {
        return reason_code(rv);
    }
    uint32_t ref = ida__bounded_find(&p->u.bounded, tag, len);
    if (ref == IDA__REF_NONE) {
        return IDA_ENOTFOUND;
    }
    *id = ref;
    return 0;
}

int ida_fsm_list(const struct ida_fsm *f,
                 const char *pool,
                 bool has_after,
                 uint64_t after_id,
                 uint32_t limit,
                 struct ida_fsm_holding *out,
                 size_t *count,
                 bool *more)
{
    struct ida__pool *p;
    int rv = pool_of((struct ida_fsm *)f, pool,
                     IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, &p);
    if (rv != IDA__R_OK) {
        return reason_code(rv);
    }
    if (limit == 0) {
        limit = IDA_LIST_LIMIT_DEFAULT;
    }
    if (limit > IDA_LIST_LIMIT_MAX) {
        limit = IDA_LIST_LIMIT_MAX;
    }
    *count = 0;
    *more = false;
    if (has_after && after_id == UINT64_MAX) {
        return 0;
    }
    const struct ida__bounded *b = &p->u.bounded;
    uint64_t id = ida__bounded_next_held(b, has_after ? after_id + 1 : 0);
    while (id != UINT64_MAX) {
        if (*count == limit) {
            *more = true;
            break;
        }
        out[*count].id = id;
        out[*count].tag = ida__tagrec_str(ida__bounded_tag(b, id));
        (*count)++;
        id = ida__bounded_next_held(b, id + 1);
    }
    return 0;
}
