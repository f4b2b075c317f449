/* The client threads of a chaos run (tests/chaos/run.h) and what is learnt
 * from the cluster after it: the outcomes still unknown, a replay of
 * acknowledged requests, the final holdings. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idalloc.h"
#include "tests/chaos/run.h"

#define CLIENTS_MAX 32

/* --- repeats ------------------------------------------------------------- */

/* Repeat @o with the request id of @call (UNKNOWN), from any client object:
 * the request id names the session. Returns the call's code and fills @got
 * with the answer. */
static int replay_with(struct idalloc_client *cl,
                       const struct hop *o,
                       struct hop *got,
                       struct idalloc_call *call)
{
    *got = *o;
    switch (o->kind) {
        case H_ALLOC:
            return idalloc_alloc(cl, "b", o->tag, &got->id, NULL, call);
        case H_FREE:
            return idalloc_free(cl, "b", o->id, o->tag, NULL, call);
        case H_RESERVE:
            return idalloc_reserve(cl, "s", o->count, &got->first, call);
        case H_PREFIX:
            return idalloc_prefix(cl, "p", o->tag, got->prefix, &got->plen,
                                  NULL, call);
        default:
            return IDA_EINVAL;
    }
}

/* The same with a call made from @o's recorded request id. */
static int replay(struct idalloc_client *cl,
                  const struct hop *o,
                  struct hop *got)
{
    struct idalloc_call call;
    idalloc_call_init(&call);
    memcpy(call.client_id, o->cid, sizeof(call.client_id));
    call.seq = o->seq;
    call.state = IDALLOC_CALL_UNKNOWN;
    return replay_with(cl, o, got, &call);
}

/* --- the client threads -----------------------------------------------------
 */

/* A worker repeats a call whose outcome is unknown, as a real client does:
 * at once, then every 256 writes (and at once when the library refuses a
 * write with IDA_ELIMIT) while it is kept here. The library pins the answer
 * of an unknown call until it is repeated to an answer or released, and
 * after 60,000 more writes refuses new ones (README, Known limitations):
 * left for resolve() at the end, one unknown call early in a run made
 * every later write of its worker fail at once. A call still unknown after
 * PENDING_WRITES_MAX writes, or pushed out of a full list, is released and
 * left to resolve(). */
#define PENDING_MAX        32
#define PENDING_WRITES_MAX 20000

struct pending
{
    size_t idx;     /* in the history */
    uint64_t since; /* the worker's write count when it was kept */
    struct hop op;
    struct idalloc_call call;
};

struct worker
{
    struct run *x;
    int thread;
    uint64_t rng;
    struct idalloc_client *cl;
    struct
    {
        char tag[HOP_TAG_MAX];
        uint64_t id;
    } held[512];
    int n_held;
    unsigned next_tag;
    uint64_t writes;
    struct pending pend[PENDING_MAX];
    int n_pend;
    unsigned settled; /* unknown outcomes learnt by a repeat in the run */
};

enum settled { S_SETTLED, S_LATER, S_LOST };

/* Repeat the unknown @op with its own call (@call): settled (in effect,
 * with its answer, completed now; or not in effect), still unknown, or lost
 * (the cluster no longer keeps the answer: resolve() settles it by reads). */
static enum settled settle(struct worker *w,
                           struct hop *op,
                           struct idalloc_call *call)
{
    struct hop got;
    int rv = replay_with(w->cl, op, &got, call);
    if (rv == 0) {
        got.resolved = R_EFFECT;
        got.done_ms = chaos_now(w->x);
        *op = got;
        if (op->kind == H_ALLOC && w->n_held < 512) {
            snprintf(w->held[w->n_held].tag, HOP_TAG_MAX, "%s", op->tag);
            w->held[w->n_held++].id = op->id;
        }
        w->settled++;
        return S_SETTLED;
    }
    if (idalloc_errclass(rv) == IDA_ERR_CLASS_DEFINITE) {
        op->resolved = R_NO_EFFECT;
        w->settled++;
        return S_SETTLED;
    }
    return call->state == IDALLOC_CALL_LOST ? S_LOST : S_LATER;
}

static void pending_drop(struct worker *w, int k, bool release)
{
    if (release) {
        idalloc_call_release(w->cl, &w->pend[k].call);
    }
    w->pend[k] = w->pend[--w->n_pend];
}

static void pending_retry(struct worker *w)
{
    for (int k = w->n_pend - 1; k >= 0; k--) {
        struct pending *p = &w->pend[k];
        enum settled st = settle(w, &p->op, &p->call);
        if (st == S_SETTLED) {
            history_set(&w->x->h, p->idx, &p->op);
        }
        if (st != S_LATER) {
            pending_drop(w, k, false);
        } else if (w->writes - p->since > PENDING_WRITES_MAX) {
            pending_drop(w, k, true);
        }
    }
}

static void pending_keep(struct worker *w,
                         size_t idx,
                         const struct hop *op,
                         const struct idalloc_call *call)
{
    if (w->n_pend == PENDING_MAX) {
        int oldest = 0;
        for (int k = 1; k < w->n_pend; k++) {
            oldest = w->pend[k].since < w->pend[oldest].since ? k : oldest;
        }
        pending_drop(w, oldest, true);
    }
    w->pend[w->n_pend++] = (struct pending){
        .idx = idx, .since = w->writes, .op = *op, .call = *call};
}

static enum hop_out outcome(int rv)
{
    if (rv == 0) {
        return O_OK;
    }
    enum ida_err_class k = idalloc_errclass(rv);
    return k == IDA_ERR_CLASS_UNKNOWN || k == IDA_ERR_CLASS_INTERNAL ? O_UNKNOWN
                                                                     : O_FAIL;
}

static void one_op(struct worker *w)
{
    struct run *x = w->x;
    struct hop o = {.thread = w->thread};
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t r = chaos_rnd(&w->rng) % 100;
    int rv;
    o.inv_ms = chaos_now(x);
    if (r < 35 || (r < 50 && w->n_held == 0)) {
        o.kind = H_ALLOC;
        snprintf(o.tag, sizeof(o.tag), "w%d-a%u", w->thread, w->next_tag++);
        rv = idalloc_alloc(w->cl, "b", o.tag, &o.id, NULL, &call);
        if (rv == 0 && w->n_held < 512) {
            snprintf(w->held[w->n_held].tag, HOP_TAG_MAX, "%s", o.tag);
            w->held[w->n_held++].id = o.id;
        }
    } else if (r < 50) {
        o.kind = H_FREE;
        int k = (int)(chaos_rnd(&w->rng) % (uint64_t)w->n_held);
        snprintf(o.tag, sizeof(o.tag), "%s", w->held[k].tag);
        o.id = w->held[k].id;
        w->held[k] = w->held[--w->n_held]; /* never freed twice */
        rv = idalloc_free(w->cl, "b", o.id, o.tag, NULL, &call);
    } else if (r < 65) {
        o.kind = H_RESERVE;
        o.count = 1 + chaos_rnd(&w->rng) % 100;
        rv = idalloc_reserve(w->cl, "s", o.count, &o.first, &call);
    } else if (r < 85) {
        o.kind = H_NEXT;
        rv = idalloc_next(w->cl, "s", &o.id, NULL);
        /* No id reached the caller on failure: nothing to check. */
        o.out = rv == 0 ? O_OK : O_FAIL;
    } else {
        o.kind = H_PREFIX;
        unsigned k = w->next_tag > 0 && chaos_rnd(&w->rng) % 5 == 0
                         ? (unsigned)(chaos_rnd(&w->rng) % w->next_tag)
                         : w->next_tag++;
        snprintf(o.tag, sizeof(o.tag), "w%d-p%u", w->thread, k);
        rv = idalloc_prefix(w->cl, "p", o.tag, o.prefix, &o.plen, NULL, &call);
    }
    o.done_ms = chaos_now(x);
    memcpy(o.cid, call.client_id, sizeof(o.cid));
    o.seq = o.kind == H_NEXT ? 0 : call.seq;
    o.err = rv;
    if (o.kind != H_NEXT) {
        o.out = outcome(rv);
        w->writes++;
    }
    enum settled st = S_LATER;
    for (int k = 0; k < 2 && o.out == O_UNKNOWN && st == S_LATER && !x->stop;
         k++) {
        st = settle(w, &o, &call);
    }
    size_t idx = history_add(&x->h, &o);
    if (o.out == O_UNKNOWN && st == S_LATER) {
        pending_keep(w, idx, &o, &call);
    }
    if (w->n_pend > 0 && (rv == IDA_ELIMIT || w->writes % 256 == 0)) {
        pending_retry(w);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    while (!w->x->stop) {
        one_op(w);
    }
    return NULL;
}

static struct worker workers[CLIENTS_MAX];
static pthread_t threads[CLIENTS_MAX];
static unsigned n_workers;

void chaos_clients_start(struct run *x)
{
    n_workers = x->o->clients < CLIENTS_MAX ? x->o->clients : CLIENTS_MAX;
    for (unsigned i = 0; i < n_workers; i++) {
        struct worker *w = &workers[i];
        memset(w, 0, sizeof(*w));
        w->x = x;
        w->thread = (int)i;
        w->rng = x->o->seed * 1000003u + i + 1;
        w->cl = tc_client(&x->c, 1500);
        pthread_create(&threads[i], NULL, worker_main, w);
    }
}

void chaos_clients_join(struct run *x)
{
    for (unsigned i = 0; i < n_workers; i++) {
        pthread_join(threads[i], NULL);
        idalloc_client_free(workers[i].cl);
        x->r->settled_in_run += workers[i].settled;
    }
}

/* --- after the run: resolve, replay, read the final state ------------- */

/* Settle an unknown op whose answer the cluster no longer keeps, by reads
 * (tags are never reused, so "held" tells what happened). */
static void settle_by_tag(struct idalloc_client *admin, struct hop *o)
{
    uint64_t id;
    int rv;
    switch (o->kind) {
        case H_ALLOC:
            rv = idalloc_lookup(admin, "b", o->tag, &id, NULL);
            if (rv == 0) {
                o->resolved = R_EFFECT;
                o->id = id;
            } else if (rv == IDA_ENOTFOUND) {
                o->resolved = R_NO_EFFECT;
            }
            break;
        case H_FREE:
            rv = idalloc_lookup(admin, "b", o->tag, &id, NULL);
            o->resolved = rv == IDA_ENOTFOUND ? R_EFFECT
                          : rv == 0           ? R_NO_EFFECT
                                              : R_NONE;
            break;
        case H_PREFIX: /* idempotent per tag: ask again */
            if (idalloc_prefix(admin, "p", o->tag, o->prefix, &o->plen, NULL,
                               NULL) == 0) {
                o->resolved = R_EFFECT;
            }
            break;
        default:
            break; /* a reserve's block cannot be learnt: left unresolved */
    }
}

void chaos_resolve(struct run *x)
{
    struct idalloc_client *admin = tc_client(&x->c, 5000);
    for (size_t i = 0; i < x->h.n; i++) {
        struct hop *o = &x->h.v[i];
        if (o->out != O_UNKNOWN || o->resolved != R_NONE) {
            continue; /* known, or learnt by its worker's repeat */
        }
        struct hop got;
        int rv = replay(admin, o, &got);
        if (rv == 0) {
            got.resolved = R_EFFECT;
            got.done_ms = chaos_now(x); /* certainly in effect from now on */
            *o = got;
        } else if (rv == IDA_ESESSION) {
            settle_by_tag(admin, o);
            o->done_ms = chaos_now(x);
        } else if (idalloc_errclass(rv) == IDA_ERR_CLASS_DEFINITE) {
            o->resolved = R_NO_EFFECT;
        }
    }
    idalloc_client_free(admin);
}

static int same_answer(const struct hop *a, const struct hop *b)
{
    switch (a->kind) {
        case H_ALLOC:
            return a->id == b->id;
        case H_RESERVE:
            return a->first == b->first;
        case H_PREFIX:
            return a->plen == b->plen &&
                   memcmp(a->prefix, b->prefix, a->plen) == 0;
        default:
            return 1;
    }
}

/* Replay each thread's last acknowledged requests: the first answer must
 * come back (or "no longer kept"). */
void chaos_replay_acked(struct run *x)
{
    for (unsigned t = 0; t < x->o->clients; t++) {
        int left = 8;
        struct idalloc_client *cl = tc_client(&x->c, 5000);
        for (size_t i = x->h.n; i-- > 0 && left > 0;) {
            struct hop *o = &x->h.v[i];
            if (o->thread != (int)t || o->out != O_OK || o->kind == H_NEXT ||
                o->kind == H_FREE) {
                continue;
            }
            struct hop got;
            int rv = replay(cl, o, &got);
            if (rv == 0) {
                o->replay = same_answer(o, &got) ? P_SAME : P_DIFFERENT;
            }
            left--;
        }
        idalloc_client_free(cl);
    }
}

/* One read of every holding of "b" into the history's final state; 0 or
 * the error of the page that failed. */
static int read_final_once(struct run *x, struct idalloc_client *cl)
{
    int has_after = 0, more = 1;
    uint64_t after = 0;
    x->h.n_final = 0;
    while (more) {
        struct idalloc_holding *hs;
        size_t n;
        struct idalloc_call call;
        idalloc_call_init(&call);
        int rv =
            idalloc_list(cl, "b", has_after, after, 0, &hs, &n, &more, &call);
        if (rv != 0) {
            fprintf(stderr, "chaos: cannot read the final state: %s\n",
                    call.errmsg);
            x->h.final_known = 0;
            return rv;
        }
        for (size_t i = 0; i < n; i++) {
            history_add_final(&x->h, hs[i].tag, hs[i].id);
        }
        x->h.final_known = 1;
        if (n == 0) {
            more = 0;
        } else {
            after = hs[n - 1].id;
            has_after = 1;
        }
        idalloc_holdings_free(hs, n);
    }
    return 0;
}

/* The final holdings, read again from the start after a failed page (a
 * leader change right after healing), up to 5 times. */
void chaos_read_final(struct run *x)
{
    struct idalloc_client *cl = tc_client(&x->c, 5000);
    for (int tries = 0; tries < 5 && read_final_once(x, cl) != 0; tries++) {
        tc_sleep_ms(1000);
    }
    idalloc_client_free(cl);
}

/* No client operation of a run should get a definite "no": the pools do
 * not run out, tags are new, frees are of held ids. A flood of them (the
 * library's IDA_ELIMIT, refused at once in a loop) means the clients did
 * no real work. */
void chaos_definite_failures(struct run *x)
{
    size_t n = 0;
    int first = 0;
    for (size_t i = 0; i < x->h.n; i++) {
        int e = x->h.v[i].err;
        if (e != 0 && idalloc_errclass(e) == IDA_ERR_CLASS_DEFINITE) {
            first = n++ == 0 ? e : first;
        }
    }
    x->r->definite = n;
    if (n > 0) {
        chaos_failure(x,
                      "%zu client operation(s) got a definite error, the "
                      "first %d (%s)",
                      n, first, idalloc_strerror(first));
    }
}
