#include "tests/chaos/chaos.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idalloc.h"
#include "tests/chaos/proxy.h"
#include "tests/chaos/run.h"
#include "tests/lib/harness.h"

#define POOL_SIZE   (1u << 20)
#define CLIENTS_MAX 32

static const char *const fault_names[F_KINDS] = {
    "kill",  "kill-leader", "pause",       "pause-leader", "isolate-leader",
    "split", "one-way",     "restart-all", "wipe",         "rollback"};

const char *chaos_fault_name(enum chaos_fault f)
{
    return fault_names[f];
}

unsigned chaos_faults_total(const struct chaos_report *r)
{
    unsigned n = 0;
    for (int i = 0; i < F_KINDS; i++) {
        n += r->faults[i];
    }
    return n;
}

/* --- what the files of a run share (tests/chaos/run.h) -------------------- */

uint64_t chaos_rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

uint64_t chaos_now(struct run *x)
{
    return tc_now_ms() - x->t0;
}

void chaos_nap(struct run *x, uint64_t *rng, unsigned lo, unsigned hi)
{
    uint64_t end = tc_now_ms() + lo + chaos_rnd(rng) % (hi - lo + 1);
    while (tc_now_ms() < end && !x->stop) {
        tc_sleep_ms(20);
    }
}

bool chaos_minority(const struct run *x, unsigned set)
{
    int k = 0;
    for (int i = 0; i < x->c.n; i++) {
        k += (set >> i) & 1u;
    }
    return 2 * k < x->c.n;
}

void chaos_trace(struct run *x, const char *fmt, ...)
{
    static int on = -1;
    if (on < 0) {
        on = getenv("IDA_CHAOS_TRACE") != NULL;
    }
    if (!on) {
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    for (char *p = line; *p != '\0'; p++) {
        *p = *p == '\n' ? '|' : *p; /* one line per event */
    }
    fprintf(stderr, "chaos: %7.2f s: %s\n", (double)chaos_now(x) / 1000.0,
            line);
}

void chaos_failure(struct run *x, const char *fmt, ...)
{
    pthread_mutex_lock(&x->mu);
    unsigned k = x->r->failures++;
    if (k < 4) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->r->failure[k], sizeof(x->r->failure[k]), fmt, ap);
        va_end(ap);
        fprintf(stderr, "chaos: %s\n", x->r->failure[k]);
    }
    pthread_mutex_unlock(&x->mu);
}

int chaos_status(struct run *x, int i, struct idalloc_node_status *s)
{
    struct idalloc_client *cl = tc_client(&x->c, 300);
    int rv = idalloc_node_status(cl, (size_t)i, s, NULL);
    idalloc_client_free(cl);
    return rv;
}

int chaos_find_leader(struct run *x)
{
    struct idalloc_client *cl = tc_client(&x->c, 200);
    int best = -1;
    uint64_t term = 0;
    for (int i = 0; i < x->c.n; i++) {
        struct idalloc_node_status s;
        if (x->c.pid[i] != 0 &&
            idalloc_node_status(cl, (size_t)i, &s, NULL) == 0 &&
            strcmp(s.role, "leader") == 0 && s.term >= term) {
            best = i;
            term = s.term;
        }
    }
    idalloc_client_free(cl);
    return best;
}

int chaos_members(struct run *x, struct idalloc_member_list *l, unsigned ms)
{
    struct idalloc_client *cl = tc_client(&x->c, ms);
    int rv = idalloc_member_list(cl, l, NULL);
    idalloc_client_free(cl);
    return rv;
}

const struct idalloc_member *chaos_member(const struct idalloc_member_list *l,
                                          unsigned id,
                                          int waiting)
{
    for (size_t i = 0; i < l->n; i++) {
        if (l->members[i].id == id && l->members[i].waiting == waiting) {
            return &l->members[i];
        }
    }
    return NULL;
}

bool chaos_membership_whole(struct run *x, unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (chaos_members(x, &l, 1000) == 0) {
            bool whole = l.n == (size_t)x->c.n;
            for (unsigned id = 1; whole && id <= (unsigned)x->c.n; id++) {
                const struct idalloc_member *m = chaos_member(&l, id, 0);
                whole = m != NULL && m->voter;
            }
            if (whole) {
                return true;
            }
        }
        tc_sleep_ms(200);
    }
    return false;
}

/* --- clients -------------------------------------------------------------- */

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

static int replay_with(struct idalloc_client *cl,
                       const struct hop *o,
                       struct hop *got,
                       struct idalloc_call *call);

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

/* --- setup and healing
 * ---------------------------------------------------------- */

/* The connect() shim (tests/chaos/shim/connect_shim.c, mk/chaos.mk):
 * $IDA_CHAOS_SHIM, else lib/ida_chaos_shim.so of the build this program is
 * part of ($(BUILD)/prog/chaos or $(BUILD)/tests/chaos/test_chaos). */
static bool shim_path(char *out, size_t cap)
{
    const char *e = getenv("IDA_CHAOS_SHIM");
    if (e != NULL) {
        snprintf(out, cap, "%s", e);
        return access(out, R_OK) == 0;
    }
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        return false;
    }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    static const char *const up[] = {"..", "../.."};
    for (int k = 0; k < 2; k++) {
        snprintf(out, cap, "%s/%s/lib/ida_chaos_shim.so", exe, up[k]);
        if (access(out, R_OK) == 0) {
            return true;
        }
    }
    return false;
}

/* Every node dials its peers at their real addresses (the one cluster file,
 * the membership); the preloaded shim sends node i's connections to node j
 * to the proxy of link i -> j. IDA_CHAOS_NO_SHIM=1 leaves the shim out:
 * the links then go around the proxy, and the run must fail (the negative
 * control of check_links()). */
static int route_through_proxy(struct run *x)
{
    struct tc *c = &x->c;
    char shim[600];
    if (!shim_path(shim, sizeof(shim))) {
        fprintf(stderr,
                "chaos: the connect() shim lib/ida_chaos_shim.so is not "
                "built (make; or set IDA_CHAOS_SHIM)\n");
        return -1;
    }
    const char *asan = getenv("ASAN_OPTIONS");
    for (int i = 0; i < c->n; i++) {
        char map[256] = "";
        size_t len = 0;
        for (int j = 0; j < c->n; j++) {
            if (j != i) {
                len += (size_t)snprintf(
                    map + len, sizeof(map) - len, "%s%u=%u", len > 0 ? "," : "",
                    c->cfg.nodes[j].peer.port, proxy_port(x->px, i, j));
            }
        }
        /* An ASan node refuses a preloaded library ahead of its runtime
         * unless told otherwise. */
        snprintf(c->node_env[i], sizeof(c->node_env[i]),
                 "%s%s IDA_CHAOS_CONNECT=%s "
                 "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
                 getenv("IDA_CHAOS_NO_SHIM") != NULL ? "" : "LD_PRELOAD=",
                 getenv("IDA_CHAOS_NO_SHIM") != NULL ? "" : shim, map,
                 asan != NULL ? asan : "", asan != NULL ? ":" : "");
    }
    return 0;
}

static int setup(struct run *x)
{
    /* One cluster file, for the nodes and for bin/idalloc (--config). */
    tc_setup(&x->c, x->o->nodes,
             x->o->manual_rejoin
                 ? "snapshot_interval_entries 500\nauto_rejoin off\n"
                 : "snapshot_interval_entries 500\n");
    uint16_t ports[PROXY_NODES_MAX];
    for (int i = 0; i < x->c.n; i++) {
        ports[i] = x->c.cfg.nodes[i].peer.port;
    }
    x->px = proxy_start(x->c.n, ports);
    if (route_through_proxy(x) != 0) {
        return -1;
    }
    for (int i = 0; i < x->c.n; i++) {
        tc_spawn(&x->c, i);
    }
    if (tc_wait_leader(&x->c, 15000) < 0) {
        return -1;
    }
    struct idalloc_client *cl = tc_client(&x->c, 10000);
    int rv = idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, POOL_SIZE, NULL,
                                 NULL);
    rv = rv != 0 ? rv
                 : idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                       NULL);
    rv = rv != 0
             ? rv
             : idalloc_pool_create(cl, "p", IDALLOC_POOL_PREFIX, 0, NULL, NULL);
    idalloc_client_free(cl);
    return rv == 0 ? 0 : -1;
}

/* The state letter of process @pid (R, S, T, Z...) or '?'. */
static char proc_state(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return '?';
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' ? p[2] : '?';
}

/* Nodes that ended by themselves since the nemesis last looked: failures
 * (heal() starts them again). */
static void ended_on_their_own(struct run *x)
{
    for (int i = 0; i < x->c.n; i++) {
        int st;
        if (tc_reap(&x->c, i, &st)) {
            chaos_node_ended(x, i, st);
        }
    }
}

static int heal(struct run *x)
{
    proxy_heal(x->px);
    for (int i = 0; i < x->c.n; i++) {
        if (x->c.pid[i] != 0) {
            kill(x->c.pid[i], SIGCONT);
        } else {
            tc_spawn(&x->c, i);
        }
    }
    if (tc_wait_leader(&x->c, 30000) >= 0) {
        return 0;
    }
    for (int i = 0; i < x->c.n; i++) {
        fprintf(stderr, "chaos: node %d pid %d state %c\n", i + 1,
                (int)x->c.pid[i], proc_state(x->c.pid[i]));
    }
    return -1;
}

/* --- after the run: resolve, replay, read the final state
 * ---------------------- */

/* Repeat @o with its own request id, from any client object: the request
 * id names the session. Returns the call's code and fills @got with the
 * answer. */
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

static void resolve(struct run *x)
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
static void replay_acked(struct run *x)
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

static void read_final(struct run *x)
{
    struct idalloc_client *cl = tc_client(&x->c, 5000);
    int has_after = 0, more = 1;
    uint64_t after = 0;
    while (more) {
        struct idalloc_holding *hs;
        size_t n;
        struct idalloc_call call;
        idalloc_call_init(&call);
        if (idalloc_list(cl, "b", has_after, after, 0, &hs, &n, &more, &call) !=
            0) {
            fprintf(stderr, "chaos: cannot read the final state: %s\n",
                    call.errmsg);
            x->h.final_known = 0;
            break;
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
    idalloc_client_free(cl);
}

/* --- figures
 * ------------------------------------------------------------------------ */

static int is_write(const struct hop *o)
{
    return o->kind != H_NEXT;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void figures(struct run *x, uint64_t end_ms)
{
    uint64_t *acks = calloc(x->h.n + 1, sizeof(*acks));
    size_t n = 0;
    for (size_t i = 0; i < x->h.n; i++) {
        if (x->h.v[i].out == O_OK && is_write(&x->h.v[i])) {
            acks[n++] = x->h.v[i].done_ms;
        }
    }
    qsort(acks, n, sizeof(*acks), cmp_u64);
    uint64_t prev = 0, longest = 0;
    for (size_t i = 0; i < n && acks[i] <= end_ms; i++) {
        longest = acks[i] - prev > longest ? acks[i] - prev : longest;
        prev = acks[i];
    }
    x->r->longest_unavailable_ms = longest;
    uint64_t d[4096];
    unsigned k = 0;
    for (unsigned i = 0; i < x->n_leader_kills; i++) {
        uint64_t t = x->leader_kills[i];
        for (size_t j = 0; j < n; j++) {
            if (acks[j] > t) {
                d[k++] = acks[j] - t;
                break;
            }
        }
    }
    qsort(d, k, sizeof(d[0]), cmp_u64);
    x->r->kill_samples = k;
    if (k > 0) {
        x->r->kill_to_write_p50_ms = d[k / 2];
        x->r->kill_to_write_p99_ms =
            d[(k * 99) / 100 < k ? (k * 99) / 100 : k - 1];
    }
    free(acks);
}

/* The socket inodes process @pid holds, into @v (up to @cap); how many. */
static size_t socket_inodes(pid_t pid, unsigned long *v, size_t cap)
{
    char dir[64], path[320], got[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    while (d != NULL && n < cap && (e = readdir(d)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, got, sizeof(got) - 1);
        if (k > 0) {
            got[k] = '\0';
            n += sscanf(got, "socket:[%lu]", &v[n]) == 1;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/* The links went through the proxy, or its faults cut nothing: every link
 * i -> j carried a connection through it, and no node holds a connection
 * of its own to another node's real peer port (/proc/net/tcp, owners by
 * their descriptors). Looked at with every node up after the run. */
static void check_links(struct run *x)
{
    struct tc *c = &x->c;
    for (int i = 0; i < c->n; i++) {
        for (int j = 0; j < c->n; j++) {
            if (i != j && proxy_opened(x->px, i, j) == 0) {
                chaos_failure(x,
                              "link %d -> %d never went through the fault "
                              "proxy",
                              i + 1, j + 1);
            }
        }
    }
    static unsigned long mine[TC_NODES_MAX][4096];
    size_t n_mine[TC_NODES_MAX] = {0};
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] != 0) {
            n_mine[i] = socket_inodes(c->pid[i], mine[i], 4096);
        }
    }
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned rp, st;
        unsigned long ino;
        if (sscanf(line,
                   " %*d: %*x:%*x %*x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
                   &rp, &st, &ino) != 3 ||
            st != 1 /* ESTABLISHED */) {
            continue;
        }
        for (int j = 0; j < c->n; j++) {
            if (rp != c->cfg.nodes[j].peer.port) {
                continue;
            }
            for (int i = 0; i < c->n; i++) {
                for (size_t k = 0; k < n_mine[i]; k++) {
                    if (mine[i][k] == ino && i != j) {
                        chaos_failure(x,
                                      "node %d is connected to node %d's "
                                      "peer port %u around the fault proxy",
                                      i + 1, j + 1, rp);
                    }
                }
            }
        }
    }
    if (f != NULL) {
        fclose(f);
    }
}

/* No client operation of a run should get a definite "no": the pools do
 * not run out, tags are new, frees are of held ids. A flood of them (the
 * library's IDA_ELIMIT, refused at once in a loop) means the clients did
 * no real work. */
static void definite_failures(struct run *x)
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

long chaos_run(const struct chaos_opts *o, struct chaos_report *r)
{
    static struct run x; /* big; one run at a time */
    memset(&x, 0, sizeof(x));
    memset(r, 0, sizeof(*r));
    x.o = o;
    x.r = r;
    x.replace_node = -1;
    x.rollback_node = -1;
    pthread_mutex_init(&x.mu, NULL);
    history_init(&x.h, POOL_SIZE);
    long result = -1;
    if (setup(&x) != 0) {
        fprintf(stderr, "chaos: the cluster did not come up\n");
        r->setup_failed = 1;
        goto out;
    }
    x.t0 = tc_now_ms();
    static struct worker w[CLIENTS_MAX];
    unsigned nw = o->clients < CLIENTS_MAX ? o->clients : CLIENTS_MAX;
    pthread_t wt[CLIENTS_MAX], nt, ot;
    for (unsigned i = 0; i < nw; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].x = &x;
        w[i].thread = (int)i;
        w[i].rng = o->seed * 1000003u + i + 1;
        w[i].cl = tc_client(&x.c, 1500);
        pthread_create(&wt[i], NULL, worker_main, &w[i]);
    }
    pthread_create(&nt, NULL, chaos_nemesis_main, &x);
    pthread_create(&ot, NULL, chaos_operator_main, &x);
    tc_sleep_ms(o->duration_s * 1000);
    x.stop = 1;
    /* The nemesis ends its fault (a rollback being caught up included),
     * then the operator ends its action and what the nemesis handed it. */
    pthread_join(nt, NULL);
    for (unsigned i = 0; i < nw; i++) {
        pthread_join(wt[i], NULL);
        idalloc_client_free(w[i].cl);
        r->settled_in_run += w[i].settled;
    }
    uint64_t end = chaos_now(&x);
    pthread_join(ot, NULL);
    ended_on_their_own(&x);
    if (heal(&x) != 0) {
        fprintf(stderr, "chaos: no leader after healing\n");
        r->setup_failed = 1;
        goto out;
    }
    r->membership_whole = chaos_membership_whole(&x, 60000);
    if (!r->membership_whole) {
        chaos_failure(&x,
                      "the membership is not every node as a voter "
                      "60 s after healing");
    }
    char out[64];
    if (o->manual_rejoin &&
        tc_run(out, sizeof(out),
               "cat %s/node*.log | grep -c 'membership: re-admitting'",
               x.c.dir) == 0) {
        /* The replacements must have been the operator's. */
        chaos_failure(&x,
                      "auto_rejoin off, yet %ld automatic re-admission "
                      "step(s) in the nodes' logs",
                      atol(out));
    }
    resolve(&x);
    replay_acked(&x);
    read_final(&x);
    ended_on_their_own(&x);
    figures(&x, end);
    result = (long)history_check(&x.h, &r->check);
    definite_failures(&x);
    check_links(&x);
    if (o->history_path != NULL) {
        FILE *f = fopen(o->history_path, "w");
        if (f != NULL) {
            history_write(&x.h, f);
            fclose(f);
        }
    }
out:
    if (x.px != NULL) {
        proxy_heal(x.px);
    }
    tc_destroy(&x.c);
    if (x.px != NULL) {
        proxy_stop(x.px);
    }
    history_free(&x.h);
    pthread_mutex_destroy(&x.mu);
    return result;
}

void chaos_report_print(const struct chaos_opts *o,
                        const struct chaos_report *r)
{
    printf("chaos: %u s, %d nodes, seed %llu, %u clients\n", o->duration_s,
           o->nodes, (unsigned long long)o->seed, o->clients);
    printf("faults: %u total:", chaos_faults_total(r));
    for (int i = 0; i < F_KINDS; i++) {
        printf(" %s=%u", fault_names[i], r->faults[i]);
    }
    printf("\n");
    printf(
        "availability rule (never more than a minority unavailable): %u "
        "fault(s) moved onto an unavailable node, %u skipped\n",
        r->moved, r->skipped);
    const struct chaos_members *m = &r->m;
    printf(
        "operator (bin/idalloc, auto_rejoin %s): %u remove/add/promote "
        "cycle(s), %u manual replacement(s), %u re-admission(s) by the "
        "leader, %u leader transfer(s) (+%u not completed), %u action(s) "
        "postponed; steps done remove=%u add=%u promote=%u (%u answered "
        "already so); %u command(s), exit 0/1/3/other %u/%u/%u/%u\n",
        o->manual_rejoin ? "off" : "on", m->cycles, m->replacements,
        m->readmissions, m->transfers, m->transfers_failed, m->postponed,
        m->removes, m->adds, m->promotes, m->already, m->commands, m->exits[0],
        m->exits[1], m->exits[2], m->exits[3]);
    if (o->rollback) {
        printf(
            "rollbacks: %u cop(ies), %u restored (%u with a log ending below "
            "the leader's commit index at the kill, by %llu entries on "
            "average, %llu at most): %u stopped by rule A4 and re-admitted "
            "as a new incarnation, %u caught up unnoticed; %u cop(ies) "
            "never restored\n",
            r->rb.copies, r->rb.restored, r->rb.rewound,
            (unsigned long long)(r->rb.rewound > 0
                                     ? r->rb.rewound_sum / r->rb.rewound
                                     : 0),
            (unsigned long long)r->rb.rewound_max, r->rb.detected,
            r->rb.caught_up, r->rb.dropped);
    }
    printf("membership after healing: %s\n",
           r->membership_whole ? "every node a voter" : "NOT WHOLE");
    printf(
        "client operations with a definite error: %zu; unknown outcomes "
        "learnt by the client's own repeat during the run: %u\n",
        r->definite, r->settled_in_run);
    printf("liveness failures: %u\n", r->failures);
    for (unsigned i = 0; i < r->failures && i < 4; i++) {
        printf("  failure: %s\n", r->failure[i]);
    }
    check_report_print(&r->check, stdout);
    printf("longest write unavailability: %llu ms\n",
           (unsigned long long)r->longest_unavailable_ms);
    printf(
        "leader kill -> next acknowledged write: p50=%llu ms p99=%llu ms "
        "(%u kills)\n",
        (unsigned long long)r->kill_to_write_p50_ms,
        (unsigned long long)r->kill_to_write_p99_ms, r->kill_samples);
}
