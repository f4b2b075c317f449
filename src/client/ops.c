/* libidalloc: the pool operations, asynchronous and blocking (pool create,
 * alloc, free, lookup, reserve, prefix). Each builds its request in a
 * struct aop holding copies of its arguments, hands it to the I/O thread
 * (ida__call_submit(), src/client/call.c) and turns the answer into a
 * struct idalloc_result for the callback. The blocking form is the same
 * with the struct aop on the caller's stack and a callback that wakes the
 * caller: one code path. The other calls (list, status, membership) are
 * src/client/admin.c. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "base/utf8.h"
#include "src/client/client.h"

struct aop
{
    struct ida_acall a;
    Idalloc__ClientRequest req;
    union {
        Idalloc__Alloc alloc;
        Idalloc__Free free;
        Idalloc__Lookup lookup;
        Idalloc__Reserve reserve;
        Idalloc__PrefixAlloc prefix;
        Idalloc__PoolCreate create;
    } op;
    char pool[IDA_CLIENT_POOL_NAME_MAX + 1];
    char tag[IDA_CLIENT_TAG_BYTES_MAX + 1];
    int write;
    int keep;   /* the caller holds the call struct */
    int replay; /* a write repeating the call's request id */
    int heap;   /* allocated by the submit: freed after the callback */
    enum idalloc_call_state prev; /* a read gives the state back */
    struct idalloc_call *call;    /* the caller's, or local */
    idalloc_done_cb cb;
    void *arg;
    struct idalloc_call local;
};

/* --- arguments -------------------------------------------------------- */

static int bad_args(struct idalloc_call *call, int rv, const char *what)
{
    if (call != NULL) {
        ida__call_error(call, "%s", what);
        call->error = rv;
    }
    return rv;
}

/* A call struct another call holds: refused without touching it. */
static int in_flight(const struct idalloc_call *call)
{
    return call != NULL && call->state == IDALLOC_CALL_IN_FLIGHT;
}

/* The tag half of check_names(). */
static int check_tag(struct idalloc_call *call, const char *op, const char *tag)
{
    size_t n = strlen(tag);
    if (n == 0) {
        ida__call_error(call, "%s: tag must not be empty", op);
        return IDA_EINVAL;
    }
    if (n > IDA_CLIENT_TAG_BYTES_MAX) {
        ida__call_error(call, "%s: tag of %zu bytes, at most %d", op, n,
                        IDA_CLIENT_TAG_BYTES_MAX);
        return IDA_ETOOBIG;
    }
    if (!ida_utf8_valid(tag, n)) {
        ida__call_error(call, "%s: tag is not valid UTF-8", op);
        return IDA_EINVAL;
    }
    return 0;
}

/* Refuse a pool name (and tag, unless NULL) the cluster would refuse, with
 * the rule in the error detail: nothing is sent. On 0 both are copied
 * into @o. */
int ida__client_pool_name_ok(const char *pool)
{
    size_t n = strlen(pool);
    int ok = n >= 1 && n <= IDA_CLIENT_POOL_NAME_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        char ch = pool[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == ':' ||
             ch == '-';
    }
    return ok;
}

static int check_names(struct aop *o,
                       struct idalloc_call *call,
                       const char *op,
                       const char *pool,
                       const char *tag)
{
    int rv = 0;
    size_t n = strlen(pool);
    int ok = ida__client_pool_name_ok(pool);
    if (!ok) {
        ida__call_error(
            call, "%s: pool name must be 1-%d characters of A-Za-z0-9._:-", op,
            IDA_CLIENT_POOL_NAME_MAX);
        rv = IDA_EINVAL;
    } else if (tag != NULL) {
        rv = check_tag(call, op, tag);
    }
    if (rv != 0) {
        if (call != NULL) {
            call->error = rv;
        }
        return rv;
    }
    memcpy(o->pool, pool, n + 1);
    if (tag != NULL) {
        memcpy(o->tag, tag, strlen(tag) + 1);
    }
    return 0;
}

/* A C string as the bytes of a request field (proto `bytes`). */
static ProtobufCBinaryData bin(const char *s)
{
    return (ProtobufCBinaryData){strlen(s), (uint8_t *)s};
}

/* --- the answer ------------------------------------------------------- */

/* The out values of @r for @o's operation into @res: 0 or the error. */
static int decode(struct aop *o,
                  const Idalloc__CommandResult *res,
                  struct idalloc_result *out)
{
    struct idalloc_call *call = o->call;
    if (res->error != 0) {
        int rv = (int)res->error;
        ida__call_error(
            call, "%s",
            res->error_msg[0] != '\0' ? res->error_msg : idalloc_strerror(rv));
        return rv;
    }
    Idalloc__CommandResult__ResultCase want;
    switch (o->req.op_case) {
        case IDALLOC__CLIENT_REQUEST__OP_ALLOC:
            want = IDALLOC__COMMAND_RESULT__RESULT_ALLOC;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_FREE:
            want = IDALLOC__COMMAND_RESULT__RESULT_FREE;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_LOOKUP:
            want = IDALLOC__COMMAND_RESULT__RESULT_LOOKUP;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_RESERVE:
            want = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC:
            want = IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC;
            break;
        default:
            want = IDALLOC__COMMAND_RESULT__RESULT_POOL_CREATE;
            break;
    }
    if (res->result_case != want) {
        ida__call_error(call, "the server answered with another result kind");
        return IDA_EPROTO;
    }
    switch (want) {
        case IDALLOC__COMMAND_RESULT__RESULT_ALLOC:
            out->id = res->alloc->id;
            out->existed = res->alloc->existed;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_FREE:
            out->freed = res->free->freed;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_LOOKUP:
            out->id = res->lookup->id;
            return 0;
        case IDALLOC__COMMAND_RESULT__RESULT_RESERVE: {
            const Idalloc__ReserveResult *rr = res->reserve;
            uint64_t count = o->op.reserve.count;
            if (rr->count != count) {
                ida__call_error(call, "reserve: asked %llu ids, got %llu",
                                (unsigned long long)count,
                                (unsigned long long)rr->count);
                return IDA_EPROTO;
            }
            if (rr->first > UINT64_MAX - count) {
                /* A block must not wrap around the id space: the caller
                 * (and next()'s bookkeeping) counts on first + count. */
                ida__call_error(call,
                                "reserve: the cluster answered a block "
                                "[%llu, +%llu) past the largest id",
                                (unsigned long long)rr->first,
                                (unsigned long long)count);
                return IDA_EPROTO;
            }
            out->id = rr->first;
            out->count = count;
            return 0;
        }
        case IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC: {
            const ProtobufCBinaryData *p = &res->prefix_alloc->prefix;
            if (p->len == 0 || p->len > 9) {
                ida__call_error(call, "prefix of %zu bytes", p->len);
                return IDA_EPROTO;
            }
            memcpy(out->prefix, p->data, p->len);
            out->prefix_len = p->len;
            out->existed = res->prefix_alloc->existed;
            return 0;
        }
        default:
            out->created = res->pool_create->created;
            return 0;
    }
}

/* The end of an operation, on the I/O thread. */
static void aop_done(struct ida_acall *a, int rv, Idalloc__ClientResponse *r)
{
    struct aop *o = a->arg;
    struct idalloc_client *c = a->c;
    struct idalloc_result res;
    memset(&res, 0, sizeof(res));
    if (rv == 0) {
        rv = decode(o, r->result, &res);
        idalloc__client_response__free_unpacked(r, NULL);
    }
    if (o->write) {
        rv = ida__client_finish(c, o->call, rv, o->keep, o->replay);
    } else {
        o->call->error = rv; /* a read has no request id to keep */
        o->call->state = o->prev;
    }
    if (rv != 0) {
        memset(&res, 0, sizeof(res));
    }
    res.error = rv;
    int heap = o->heap;
    o->cb(c, o->call, &res, o->arg);
    if (heap) {
        ida_free(o);
    }
}

/* Submit @o (its request built): 0, or the error with nothing submitted
 * and the call struct's state as it was (a fresh write: NEW). */
static int aop_submit(struct idalloc_client *c,
                      struct aop *o,
                      int write,
                      struct idalloc_call *call,
                      idalloc_done_cb cb,
                      void *arg)
{
    o->keep = call != NULL;
    if (call == NULL) {
        idalloc_call_init(&o->local);
        call = &o->local;
    }
    o->call = call;
    o->write = write;
    o->cb = cb;
    o->arg = arg;
    o->prev = call->state;
    o->replay = write && call->state == IDALLOC_CALL_UNKNOWN && call->seq != 0;
    if (write && !o->replay) {
        call->seq = 0; /* a fresh call */
        o->prev = IDALLOC_CALL_NEW;
    }
    call->errmsg[0] = '\0';
    ida__call_init(&o->a, &o->req, write, o->replay, call, aop_done, o);
    call->state = IDALLOC_CALL_IN_FLIGHT;
    int rv = ida__call_submit(c, &o->a);
    if (rv != 0) {
        call->state = o->prev;
        call->error = rv;
    }
    return rv;
}

/* A new struct aop for an asynchronous call (request fields zeroed). */
static struct aop *aop_new(struct idalloc_call *call, int *rv)
{
    struct aop *o = ida_malloc(sizeof(*o));
    if (o == NULL) {
        *rv = bad_args(call, IDA_ENOMEM, "out of memory");
        return NULL;
    }
    memset(o, 0, offsetof(struct aop, local));
    idalloc__client_request__init(&o->req);
    o->heap = 1;
    return o;
}

/* --- blocking: the same, and a wait ------------------------------------ */

struct waiter
{
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    struct idalloc_result res;
};

static void wake_caller(struct idalloc_client *c,
                        struct idalloc_call *call,
                        const struct idalloc_result *res,
                        void *arg)
{
    (void)c, (void)call;
    struct waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->res = *res;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Run @o (on the caller's stack) and wait: its result in *res. */
static int aop_wait(struct idalloc_client *c,
                    struct aop *o,
                    int write,
                    struct idalloc_call *call,
                    struct idalloc_result *res)
{
    if (ida__client_on_loop(c)) {
        return bad_args(call, IDA_EINVAL,
                        "a blocking call from a completion callback would "
                        "wait for its own thread");
    }
    struct waiter w = {.done = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    o->heap = 0;
    int rv = aop_submit(c, o, write, call, wake_caller, &w);
    if (rv == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.done) {
            pthread_cond_wait(&w.cv, &w.mu);
        }
        pthread_mutex_unlock(&w.mu);
        *res = w.res;
        rv = res->error;
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return rv;
}

/* A struct aop on the stack of a blocking call. */
#define STACK_AOP(o)                            \
    struct aop o;                               \
    memset(&o, 0, offsetof(struct aop, local)); \
    idalloc__client_request__init(&o.req)

/* --- the operations --------------------------------------------------- */

static int build_pool_create(struct aop *o,
                             const char *name,
                             enum idalloc_pool_kind kind,
                             uint64_t size,
                             struct idalloc_call *call)
{
    if (name == NULL || kind < IDALLOC_POOL_SEQUENCE ||
        kind > IDALLOC_POOL_PREFIX) {
        return bad_args(call, IDA_EINVAL,
                        "pool create: a name and a known kind are needed");
    }
    int rv = check_names(o, call, "pool create", name, NULL);
    if (rv == 0) {
        idalloc__pool_create__init(&o->op.create);
        o->op.create.name = bin(o->pool);
        o->op.create.kind = (Idalloc__PoolKind)kind;
        o->op.create.size = size;
        o->req.op_case = IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE;
        o->req.pool_create = &o->op.create;
    }
    return rv;
}

static int build_alloc(struct aop *o,
                       const char *pool,
                       const char *tag,
                       struct idalloc_call *call)
{
    if (pool == NULL || tag == NULL) {
        return bad_args(call, IDA_EINVAL, "alloc: pool and tag are needed");
    }
    int rv = check_names(o, call, "alloc", pool, tag);
    if (rv == 0) {
        idalloc__alloc__init(&o->op.alloc);
        o->op.alloc.pool = bin(o->pool);
        o->op.alloc.tag = bin(o->tag);
        o->req.op_case = IDALLOC__CLIENT_REQUEST__OP_ALLOC;
        o->req.alloc = &o->op.alloc;
    }
    return rv;
}

static int build_free(struct aop *o,
                      const char *pool,
                      uint64_t id,
                      const char *tag,
                      struct idalloc_call *call)
{
    if (pool == NULL || tag == NULL) {
        return bad_args(call, IDA_EINVAL, "free: pool and tag are needed");
    }
    int rv = check_names(o, call, "free", pool, tag);
    if (rv == 0) {
        idalloc__free__init(&o->op.free);
        o->op.free.pool = bin(o->pool);
        o->op.free.id = id;
        o->op.free.tag = bin(o->tag);
        o->req.op_case = IDALLOC__CLIENT_REQUEST__OP_FREE;
        o->req.free = &o->op.free;
    }
    return rv;
}

static int build_lookup(struct aop *o,
                        const char *pool,
                        const char *tag,
                        struct idalloc_call *call)
{
    if (pool == NULL || tag == NULL) {
        return bad_args(call, IDA_EINVAL, "lookup: pool and tag are needed");
    }
    int rv = check_names(o, call, "lookup", pool, tag);
    if (rv == 0) {
        idalloc__lookup__init(&o->op.lookup);
        o->op.lookup.pool = bin(o->pool);
        o->op.lookup.tag = bin(o->tag);
        o->req.op_case = IDALLOC__CLIENT_REQUEST__OP_LOOKUP;
        o->req.lookup = &o->op.lookup;
    }
    return rv;
}

static int build_reserve(struct aop *o,
                         const char *pool,
                         uint64_t count,
                         struct idalloc_call *call)
{
    if (pool == NULL || count == 0) {
        return bad_args(call, IDA_EINVAL,
                        "reserve: a pool and a count > 0 are needed");
    }
    if (count > IDALLOC_RESERVE_COUNT_MAX) {
        char why[128];
        snprintf(why, sizeof(why),
                 "reserve: %llu ids asked, at most %llu per reserve",
                 (unsigned long long)count,
                 (unsigned long long)IDALLOC_RESERVE_COUNT_MAX);
        return bad_args(call, IDA_EINVAL, why);
    }
    int rv = check_names(o, call, "reserve", pool, NULL);
    if (rv == 0) {
        idalloc__reserve__init(&o->op.reserve);
        o->op.reserve.pool = bin(o->pool);
        o->op.reserve.count = count;
        o->req.op_case = IDALLOC__CLIENT_REQUEST__OP_RESERVE;
        o->req.reserve = &o->op.reserve;
    }
    return rv;
}

static int build_prefix(struct aop *o,
                        const char *pool,
                        const char *tag,
                        struct idalloc_call *call)
{
    if (pool == NULL || tag == NULL) {
        return bad_args(call, IDA_EINVAL, "prefix: pool and tag are needed");
    }
    int rv = check_names(o, call, "prefix", pool, tag);
    if (rv == 0) {
        idalloc__prefix_alloc__init(&o->op.prefix);
        o->op.prefix.pool = bin(o->pool);
        o->op.prefix.tag = bin(o->tag);
        o->req.op_case = IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC;
        o->req.prefix_alloc = &o->op.prefix;
    }
    return rv;
}

/* The asynchronous forms: check, build in a heap struct aop, submit. */
#define ASYNC_BODY(write, build_call)                  \
    if (in_flight(call)) {                             \
        return IDA_EINVAL;                             \
    }                                                  \
    if (c == NULL || cb == NULL) {                     \
        return bad_args(call, IDA_EINVAL,              \
                        "a client and a callback are " \
                        "needed");                     \
    }                                                  \
    int rv;                                            \
    struct aop *o = aop_new(call, &rv);                \
    if (o == NULL) {                                   \
        return rv;                                     \
    }                                                  \
    rv = build_call;                                   \
    if (rv == 0) {                                     \
        rv = aop_submit(c, o, write, call, cb, arg);   \
    }                                                  \
    if (rv != 0) {                                     \
        ida_free(o);                                   \
    }                                                  \
    return rv

int idalloc_pool_create_async(struct idalloc_client *c,
                              const char *name,
                              enum idalloc_pool_kind kind,
                              uint64_t size,
                              struct idalloc_call *call,
                              idalloc_done_cb cb,
                              void *arg)
{
    ASYNC_BODY(1, build_pool_create(o, name, kind, size, call));
}

int idalloc_alloc_async(struct idalloc_client *c,
                        const char *pool,
                        const char *tag,
                        struct idalloc_call *call,
                        idalloc_done_cb cb,
                        void *arg)
{
    ASYNC_BODY(1, build_alloc(o, pool, tag, call));
}

int idalloc_free_async(struct idalloc_client *c,
                       const char *pool,
                       uint64_t id,
                       const char *tag,
                       struct idalloc_call *call,
                       idalloc_done_cb cb,
                       void *arg)
{
    ASYNC_BODY(1, build_free(o, pool, id, tag, call));
}

int idalloc_lookup_async(struct idalloc_client *c,
                         const char *pool,
                         const char *tag,
                         struct idalloc_call *call,
                         idalloc_done_cb cb,
                         void *arg)
{
    ASYNC_BODY(0, build_lookup(o, pool, tag, call));
}

int idalloc_reserve_async(struct idalloc_client *c,
                          const char *pool,
                          uint64_t count,
                          struct idalloc_call *call,
                          idalloc_done_cb cb,
                          void *arg)
{
    ASYNC_BODY(1, build_reserve(o, pool, count, call));
}

int idalloc_prefix_async(struct idalloc_client *c,
                         const char *pool,
                         const char *tag,
                         struct idalloc_call *call,
                         idalloc_done_cb cb,
                         void *arg)
{
    ASYNC_BODY(1, build_prefix(o, pool, tag, call));
}

/* The blocking forms: check, build on the stack, submit and wait. */
#define BLOCKING_BODY(write, build_call)         \
    if (in_flight(call)) {                       \
        return IDA_EINVAL;                       \
    }                                            \
    STACK_AOP(o);                                \
    struct idalloc_result res;                   \
    int rv = build_call;                         \
    if (rv == 0) {                               \
        rv = aop_wait(c, &o, write, call, &res); \
    }

int idalloc_pool_create(struct idalloc_client *c,
                        const char *name,
                        enum idalloc_pool_kind kind,
                        uint64_t size,
                        int *created,
                        struct idalloc_call *call)
{
    BLOCKING_BODY(1, build_pool_create(&o, name, kind, size, call));
    if (rv == 0 && created != NULL) {
        *created = res.created;
    }
    return rv;
}

int idalloc_alloc(struct idalloc_client *c,
                  const char *pool,
                  const char *tag,
                  uint64_t *id,
                  int *existed,
                  struct idalloc_call *call)
{
    if (id == NULL && !in_flight(call)) {
        return bad_args(call, IDA_EINVAL, "alloc: pool, tag and id are needed");
    }
    BLOCKING_BODY(1, build_alloc(&o, pool, tag, call));
    if (rv == 0) {
        *id = res.id;
        if (existed != NULL) {
            *existed = res.existed;
        }
    }
    return rv;
}

int idalloc_free(struct idalloc_client *c,
                 const char *pool,
                 uint64_t id,
                 const char *tag,
                 int *freed,
                 struct idalloc_call *call)
{
    BLOCKING_BODY(1, build_free(&o, pool, id, tag, call));
    if (rv == 0 && freed != NULL) {
        *freed = res.freed;
    }
    return rv;
}

int idalloc_lookup(struct idalloc_client *c,
                   const char *pool,
                   const char *tag,
                   uint64_t *id,
                   struct idalloc_call *call)
{
    if (id == NULL && !in_flight(call)) {
        return bad_args(call, IDA_EINVAL,
                        "lookup: pool, tag and id are needed");
    }
    BLOCKING_BODY(0, build_lookup(&o, pool, tag, call));
    if (rv == 0) {
        *id = res.id;
    }
    return rv;
}

int idalloc_reserve(struct idalloc_client *c,
                    const char *pool,
                    uint64_t count,
                    uint64_t *first,
                    struct idalloc_call *call)
{
    if (first == NULL && !in_flight(call)) {
        return bad_args(call, IDA_EINVAL,
                        "reserve: a pool and a count > 0 are needed");
    }
    BLOCKING_BODY(1, build_reserve(&o, pool, count, call));
    if (rv == 0) {
        *first = res.id;
    }
    return rv;
}

int idalloc_prefix(struct idalloc_client *c,
                   const char *pool,
                   const char *tag,
                   uint8_t out[9],
                   size_t *len,
                   int *existed,
                   struct idalloc_call *call)
{
    if ((out == NULL || len == NULL) && !in_flight(call)) {
        return bad_args(call, IDA_EINVAL,
                        "prefix: pool, tag, out and len are needed");
    }
    BLOCKING_BODY(1, build_prefix(&o, pool, tag, call));
    if (rv == 0) {
        memcpy(out, res.prefix, res.prefix_len);
        *len = res.prefix_len;
        if (existed != NULL) {
            *existed = res.existed;
        }
    }
    return rv;
}
