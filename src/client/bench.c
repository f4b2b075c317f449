/* idalloc bench: C requests in flight, each a closed loop (an answer, then
 * the next request), and the latency of every request.
 *
 * By default the loops are asynchronous calls (the way wrk drives HTTP):
 * the C request slots are spread over T client objects (--threads), each
 * with its own I/O thread; a slot's completion callback records its
 * latency and submits the slot's next request, so the bench's C requests
 * run on T threads (the I/O threads) and the main thread only prints
 * progress. --blocking runs C threads sharing one client object, each
 * making one blocking call at a time (and --op next always does: next() is
 * served from locally held blocks, not one network call per id).
 * Latencies are merged and sorted for the percentiles; only acknowledged
 * answers count as ok. */
#include "src/client/bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "src/client/cli_json.h"

struct worker
{
    struct idalloc_client *c;
    const struct ida_cli *cli;
    unsigned index;
    atomic_int *stop;
    atomic_uint_fast64_t ok, errors, unknown, ids;
    atomic_int last_err; /* the last failure's code, 0 if none */
    uint32_t *lat_us;
    size_t nlat, cap;
    int oom;
};

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void record(struct worker *w, uint64_t us)
{
    if (w->nlat == w->cap) {
        size_t cap = w->cap == 0 ? 4096 : w->cap * 2;
        uint32_t *p = ida_realloc(w->lat_us, cap * sizeof(*p));
        if (p == NULL) {
            w->oom = 1;
            return;
        }
        w->lat_us = p;
        w->cap = cap;
    }
    w->lat_us[w->nlat++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

/* One operation; returns its error code and how many ids it got. */
static int one_op(struct worker *w, uint64_t i, uint64_t *ids)
{
    char tag[64];
    uint64_t v;
    uint8_t prefix[9];
    size_t plen;
    *ids = 1;
    switch (w->cli->bench_op) {
        case IDA_BENCH_ALLOC:
            snprintf(tag, sizeof(tag), "bench-%ld-%u-%llu", (long)getpid(),
                     w->index, (unsigned long long)i);
            return idalloc_alloc(w->c, w->cli->pool, tag, &v, NULL, NULL);
        case IDA_BENCH_RESERVE:
            *ids = w->cli->count;
            return idalloc_reserve(w->c, w->cli->pool, w->cli->count, &v, NULL);
        case IDA_BENCH_NEXT:
            return idalloc_next(w->c, w->cli->pool, &v, NULL);
        case IDA_BENCH_PREFIX:
            snprintf(tag, sizeof(tag), "bench-%ld-%u-%llu", (long)getpid(),
                     w->index, (unsigned long long)i);
            return idalloc_prefix(w->c, w->cli->pool, tag, prefix, &plen, NULL,
                                  NULL);
    }
    return IDA_EINVAL;
}

/* Count one answer: ok, a definite error, or an unknown outcome. */
static void count(struct worker *w, int rv, uint64_t ids)
{
    if (rv == 0) {
        atomic_fetch_add(&w->ok, 1);
        atomic_fetch_add(&w->ids, ids);
    } else if (idalloc_errclass(rv) == IDA_ERR_CLASS_DEFINITE ||
               idalloc_errclass(rv) == IDA_ERR_CLASS_USAGE) {
        atomic_fetch_add(&w->errors, 1);
        atomic_store(&w->last_err, rv);
    } else {
        atomic_fetch_add(&w->unknown, 1);
        atomic_store(&w->last_err, rv);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (uint64_t i = 0; !atomic_load(w->stop); i++) {
        uint64_t t0 = now_us(), ids;
        int rv = one_op(w, i, &ids);
        record(w, now_us() - t0);
        count(w, rv, ids);
    }
    return NULL;
}

/* --- asynchronous closed loops ---------------------------------------- */

/* One request slot: its next request's number and submit time. */
struct group;
struct slot
{
    struct worker *w; /* its client object's tallies */
    struct group *g;
    unsigned index; /* unique in the run (tags) */
    uint64_t i;
    uint64_t t0;
};

/* The slots of one client object: w->lat_us is written by its I/O thread
 * only (in callbacks), read after every slot stopped (active 0 under
 * mu). */
struct group
{
    struct worker w;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned active; /* slots with a request in flight */
    int submit_err;  /* a submit that failed at once (its slot stops) */
    char submit_msg[IDALLOC_ERRMSG_MAX];
};

static void slot_done(struct idalloc_client *c,
                      struct idalloc_call *call,
                      const struct idalloc_result *res,
                      void *arg);

/* Submit @s's next request: 0, or the error (nothing submitted). */
static int slot_submit(struct slot *s)
{
    struct worker *w = s->w;
    struct idalloc_call call;
    char tag[64];
    int rv = IDA_EINVAL;
    idalloc_call_init(&call);
    s->t0 = now_us();
    switch (w->cli->bench_op) {
        case IDA_BENCH_ALLOC:
        case IDA_BENCH_PREFIX:
            snprintf(tag, sizeof(tag), "bench-%ld-%u-%llu", (long)getpid(),
                     s->index, (unsigned long long)s->i);
            rv = w->cli->bench_op == IDA_BENCH_ALLOC
                     ? idalloc_alloc_async(w->c, w->cli->pool, tag, NULL,
                                           slot_done, s)
                     : idalloc_prefix_async(w->c, w->cli->pool, tag, NULL,
                                            slot_done, s);
            break;
        case IDA_BENCH_RESERVE:
            rv = idalloc_reserve_async(w->c, w->cli->pool, w->cli->count, NULL,
                                       slot_done, s);
            break;
        case IDA_BENCH_NEXT:
            break; /* runs on threads */
    }
    return rv;
}

/* @s stops (the run ended, or its submit failed with @rv). */
static void slot_stop(struct group *g, int rv)
{
    pthread_mutex_lock(&g->mu);
    if (rv != 0) {
        g->submit_err = rv;
    }
    if (--g->active == 0) {
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

static void slot_done(struct idalloc_client *c,
                      struct idalloc_call *call,
                      const struct idalloc_result *res,
                      void *arg)
{
    (void)c, (void)call;
    struct slot *s = arg;
    struct worker *w = s->w;
    record(w, now_us() - s->t0);
    count(w, res->error,
          w->cli->bench_op == IDA_BENCH_RESERVE ? w->cli->count : 1);
    s->i++;
    int rv = 0;
    if (!atomic_load(w->stop)) {
        rv = slot_submit(s);
        if (rv == 0) {
            return;
        }
        count(w, rv, 0);
    }
    slot_stop(s->g, rv);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

double ida_bench_quantile_ms(const uint32_t *sorted_us, size_t n, double q)
{
    if (n == 0) {
        return 0.0;
    }
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return sorted_us[k < n ? k : n - 1] / 1000.0;
}

static const char *const kind_names[] = {"", "sequence", "bounded", "prefix"};
static const char *const op_names[] = {"", "alloc", "reserve", "next",
                                       "prefix"};

/* Create the pool, or check that the one there fits --op: one operation of
 * the run's kind, so a wrong kind is refused before the run starts. */
static int ensure_pool(struct idalloc_client *c, const struct ida_cli *cli)
{
    enum idalloc_pool_kind kind =
        cli->bench_op == IDA_BENCH_ALLOC    ? IDALLOC_POOL_BOUNDED
        : cli->bench_op == IDA_BENCH_PREFIX ? IDALLOC_POOL_PREFIX
                                            : IDALLOC_POOL_SEQUENCE;
    uint64_t size = kind == IDALLOC_POOL_BOUNDED ? (1ull << 40) : 0;
    int rv = idalloc_pool_create(c, cli->pool, kind, size, NULL, NULL);
    if (rv != IDA_EPOOLEXISTS) {
        if (rv != 0) {
            fprintf(stderr, "idalloc: bench: cannot create pool %s: %s\n",
                    cli->pool, idalloc_strerror(rv));
        }
        return rv;
    }
    struct worker probe = {.c = c, .cli = cli, .index = UINT32_MAX};
    uint64_t ids;
    rv = one_op(&probe, 0, &ids);
    if (rv == IDA_EKIND) {
        fprintf(stderr,
                "idalloc: bench: pool %s is not a %s pool, which --op %s "
                "needs; give another --pool name (bench creates it)\n",
                cli->pool, kind_names[kind], op_names[cli->bench_op]);
        return rv;
    }
    fprintf(stderr,
            "bench: pool %s exists (a %s pool, perhaps of another size); "
            "using it as it is\n",
            cli->pool, kind_names[kind]);
    return 0;
}

struct totals
{
    uint64_t ok, errors, unknown, ids;
};

static struct totals sum(struct worker *const *w, unsigned n)
{
    struct totals t = {0};
    for (unsigned i = 0; i < n; i++) {
        t.ok += atomic_load(&w[i]->ok);
        t.errors += atomic_load(&w[i]->errors);
        t.unknown += atomic_load(&w[i]->unknown);
        t.ids += atomic_load(&w[i]->ids);
    }
    return t;
}

static void report(const struct ida_cli *cli,
                   struct totals t,
                   double secs,
                   const uint32_t *lat,
                   size_t n)
{
    static const char *const ops[] = {"", "alloc", "reserve", "next", "prefix"};
    double p50 = ida_bench_quantile_ms(lat, n, 0.50);
    double p99 = ida_bench_quantile_ms(lat, n, 0.99);
    double p999 = ida_bench_quantile_ms(lat, n, 0.999);
    double max = ida_bench_quantile_ms(lat, n, 1.0);
    if (cli->json) {
        ida_cli_json_bench(ops[cli->bench_op], cli->clients, t.ok, t.errors,
                           t.unknown, (double)t.ok / secs, (double)t.ids / secs,
                           p50, p99, p999, max);
        return;
    }
    printf(
        "op=%s clients=%u ok=%llu errors=%llu unknown=%llu "
        "ops_per_s=%.1f ids_per_s=%.1f p50_ms=%.3f p99_ms=%.3f "
        "p999_ms=%.3f max_ms=%.3f\n",
        ops[cli->bench_op], cli->clients, (unsigned long long)t.ok,
        (unsigned long long)t.errors, (unsigned long long)t.unknown,
        (double)t.ok / secs, (double)t.ids / secs, p50, p99, p999, max);
}

/* A progress line on stderr each second for the run's duration. */
static void progress(const struct ida_cli *cli,
                     struct worker *const *w,
                     unsigned n,
                     uint64_t t0)
{
    for (unsigned s = 1; s <= cli->duration_s; s++) {
        sleep(1);
        struct totals x = sum(w, n);
        fprintf(stderr,
                "bench: %us ok=%llu errors=%llu unknown=%llu "
                "ops/s=%.0f\n",
                s, (unsigned long long)x.ok, (unsigned long long)x.errors,
                (unsigned long long)x.unknown,
                (double)x.ok * 1e6 / (double)(now_us() - t0));
    }
}

/* The summary of a finished run (every request answered): the merged
 * latencies' percentiles and the tallies. Frees the latency samples. */
static int summarize(const struct ida_cli *cli,
                     struct worker *const *w,
                     unsigned n,
                     double secs)
{
    size_t total = 0;
    for (unsigned i = 0; i < n; i++) {
        total += w[i]->nlat;
    }
    uint32_t *all = ida_malloc((total > 0 ? total : 1) * sizeof(*all));
    int oom = all == NULL;
    size_t at = 0;
    for (unsigned i = 0; i < n; i++) {
        if (all != NULL && w[i]->nlat > 0) {
            memcpy(all + at, w[i]->lat_us, w[i]->nlat * sizeof(*all));
            at += w[i]->nlat;
        }
        oom |= w[i]->oom;
        ida_free(w[i]->lat_us);
        w[i]->lat_us = NULL;
    }
    if (all == NULL) {
        return IDA_ENOMEM;
    }
    if (oom) {
        fprintf(stderr,
                "bench: some latency samples were dropped (out of memory)\n");
    }
    qsort(all, total, sizeof(*all), cmp_u32);
    struct totals x = sum(w, n);
    report(cli, x, secs, all, total);
    ida_free(all);
    if (x.ok > 0) {
        return 0;
    }
    int last = 0;
    for (unsigned i = 0; i < n; i++) {
        last = atomic_load(&w[i]->last_err) != 0 ? atomic_load(&w[i]->last_err)
                                                 : last;
    }
    int rv = last != 0 ? last : IDA_ETIMEDOUT;
    fprintf(stderr,
            "idalloc: bench: no request succeeded (last error: %s); check "
            "the pool and `idalloc status`\n",
            idalloc_strerror(rv));
    return rv;
}

/* --blocking (and --op next): C threads, one blocking call at a time. */
static int run_threads(struct idalloc_client *c, const struct ida_cli *cli)
{
    atomic_int stop = 0;
    struct worker *w = ida_calloc(cli->clients, sizeof(*w));
    struct worker **wp = ida_calloc(cli->clients, sizeof(*wp));
    pthread_t *t = ida_calloc(cli->clients, sizeof(*t));
    if (w == NULL || wp == NULL || t == NULL) {
        ida_free(w);
        ida_free(wp);
        ida_free(t);
        return IDA_ENOMEM;
    }
    int rv = 0;
    unsigned started = 0;
    uint64_t t0 = now_us();
    for (; started < cli->clients; started++) {
        w[started] = (struct worker){
            .c = c, .cli = cli, .index = started, .stop = &stop};
        wp[started] = &w[started];
        if (pthread_create(&t[started], NULL, worker_main, &w[started]) != 0) {
            rv = IDA_ENOMEM;
            break;
        }
    }
    if (rv == 0) {
        progress(cli, wp, started, t0);
    }
    atomic_store(&stop, 1);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(t[i], NULL);
    }
    double secs = (double)(now_us() - t0) / 1e6;
    if (rv == 0) {
        rv = summarize(cli, wp, started, secs);
    } else {
        for (unsigned i = 0; i < started; i++) {
            ida_free(w[i].lat_us);
        }
    }
    ida_free(w);
    ida_free(wp);
    ida_free(t);
    return rv;
}

/* The default: C asynchronous closed loops on bench_threads client
 * objects (@c and bench_threads - 1 more made from @o). */
static int run_async(struct idalloc_client *c,
                     const struct idalloc_options *o,
                     const struct ida_cli *cli)
{
    unsigned nt = cli->bench_threads > 0 ? cli->bench_threads : 1;
    atomic_int stop = 0;
    struct group *g = ida_calloc(nt, sizeof(*g));
    struct worker **wp = ida_calloc(nt, sizeof(*wp));
    struct slot *slots = ida_calloc(cli->clients, sizeof(*slots));
    if (g == NULL || wp == NULL || slots == NULL) {
        ida_free(g);
        ida_free(wp);
        ida_free(slots);
        return IDA_ENOMEM;
    }
    int rv = 0;
    unsigned made = 0;
    for (; made < nt; made++) {
        struct idalloc_client *k = c;
        char err[IDALLOC_ERRMSG_MAX];
        if (made > 0 && (rv = idalloc_client_new(o, &k, err)) != 0) {
            fprintf(stderr, "idalloc: bench: client object %u: %s\n", made,
                    err);
            break;
        }
        g[made].w =
            (struct worker){.c = k, .cli = cli, .index = made, .stop = &stop};
        pthread_mutex_init(&g[made].mu, NULL);
        pthread_cond_init(&g[made].cv, NULL);
        wp[made] = &g[made].w;
    }
    uint64_t t0 = now_us();
    if (rv == 0) {
        /* Slot i runs on client object i % nt; every slot counts as active
         * before the first submit, whose answer may come at once. */
        for (unsigned i = 0; i < cli->clients; i++) {
            struct group *gi = &g[i % nt];
            slots[i] = (struct slot){.w = &gi->w, .g = gi, .index = i};
            gi->active++;
        }
        for (unsigned i = 0; i < cli->clients; i++) {
            int srv = slot_submit(&slots[i]);
            if (srv != 0) {
                count(slots[i].w, srv, 0);
                slot_stop(slots[i].g, srv);
            }
        }
        progress(cli, wp, nt, t0);
    }
    atomic_store(&stop, 1);
    int submit_err = 0;
    for (unsigned i = 0; i < made; i++) {
        pthread_mutex_lock(&g[i].mu);
        while (g[i].active > 0) {
            pthread_cond_wait(&g[i].cv, &g[i].mu);
        }
        submit_err = g[i].submit_err != 0 ? g[i].submit_err : submit_err;
        pthread_mutex_unlock(&g[i].mu);
    }
    double secs = (double)(now_us() - t0) / 1e6;
    if (submit_err != 0) {
        fprintf(stderr,
                "bench: some request slots stopped: a submit failed (%s)\n",
                idalloc_strerror(submit_err));
    }
    if (rv == 0) {
        rv = summarize(cli, wp, nt, secs);
    }
    for (unsigned i = 0; i < made; i++) {
        if (i > 0) {
            idalloc_client_free(g[i].w.c);
        }
        ida_free(g[i].w.lat_us);
        pthread_mutex_destroy(&g[i].mu);
        pthread_cond_destroy(&g[i].cv);
    }
    ida_free(g);
    ida_free(wp);
    ida_free(slots);
    return rv;
}

int ida_bench_run(struct idalloc_client *c,
                  const struct idalloc_options *o,
                  const struct ida_cli *cli)
{
    int rv = ensure_pool(c, cli);
    if (rv != 0) {
        return rv;
    }
    if (cli->bench_blocking || cli->bench_op == IDA_BENCH_NEXT) {
        return run_threads(c, cli);
    }
    return run_async(c, o, cli);
}
