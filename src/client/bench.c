/* idalloc bench: C threads share one client object, so C requests are in
 * flight at once, pipelined on one connection per node. Each thread records
 * the latency of every call; percentiles come from the merged, sorted
 * samples. Only acknowledged answers count as ok. */
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

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (uint64_t i = 0; !atomic_load(w->stop); i++) {
        uint64_t t0 = now_us(), ids;
        int rv = one_op(w, i, &ids);
        record(w, now_us() - t0);
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
    return NULL;
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

static struct totals sum(struct worker *w, unsigned n)
{
    struct totals t = {0};
    for (unsigned i = 0; i < n; i++) {
        t.ok += atomic_load(&w[i].ok);
        t.errors += atomic_load(&w[i].errors);
        t.unknown += atomic_load(&w[i].unknown);
        t.ids += atomic_load(&w[i].ids);
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
    if (cli->json) {
        ida_cli_json_bench(ops[cli->bench_op], cli->clients, t.ok, t.errors,
                           t.unknown, (double)t.ok / secs, (double)t.ids / secs,
                           p50, p99, p999);
        return;
    }
    printf(
        "op=%s clients=%u ok=%llu errors=%llu unknown=%llu "
        "ops_per_s=%.1f ids_per_s=%.1f p50_ms=%.3f p99_ms=%.3f "
        "p999_ms=%.3f\n",
        ops[cli->bench_op], cli->clients, (unsigned long long)t.ok,
        (unsigned long long)t.errors, (unsigned long long)t.unknown,
        (double)t.ok / secs, (double)t.ids / secs, p50, p99, p999);
}

int ida_bench_run(struct idalloc_client *c, const struct ida_cli *cli)
{
    int rv = ensure_pool(c, cli);
    if (rv != 0) {
        return rv;
    }
    atomic_int stop = 0;
    struct worker *w = ida_calloc(cli->clients, sizeof(*w));
    pthread_t *t = ida_calloc(cli->clients, sizeof(*t));
    if (w == NULL || t == NULL) {
        ida_free(w);
        ida_free(t);
        return IDA_ENOMEM;
    }
    unsigned started = 0;
    uint64_t t0 = now_us();
    for (; started < cli->clients; started++) {
        w[started] = (struct worker){
            .c = c, .cli = cli, .index = started, .stop = &stop};
        if (pthread_create(&t[started], NULL, worker_main, &w[started]) != 0) {
            rv = IDA_ENOMEM;
            break;
        }
    }
    for (unsigned s = 1; rv == 0 && s <= cli->duration_s; s++) {
        sleep(1);
        struct totals x = sum(w, started);
        fprintf(stderr,
                "bench: %us ok=%llu errors=%llu unknown=%llu "
                "ops/s=%.0f\n",
                s, (unsigned long long)x.ok, (unsigned long long)x.errors,
                (unsigned long long)x.unknown,
                (double)x.ok * 1e6 / (double)(now_us() - t0));
    }
    atomic_store(&stop, 1);
    size_t n = 0;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(t[i], NULL);
        n += w[i].nlat;
    }
    double secs = (double)(now_us() - t0) / 1e6;
    uint32_t *all = ida_malloc((n > 0 ? n : 1) * sizeof(*all));
    int oom = all == NULL;
    for (unsigned i = 0, at = 0; i < started; i++) {
        if (all != NULL && w[i].nlat > 0) {
            memcpy(all + at, w[i].lat_us, w[i].nlat * sizeof(*all));
            at += (unsigned)w[i].nlat;
        }
        oom |= w[i].oom;
        ida_free(w[i].lat_us);
    }
    if (rv == 0 && all != NULL) {
        if (oom) {
            fprintf(stderr,
                    "bench: some latency samples were dropped (out "
                    "of memory)\n");
        }
        qsort(all, n, sizeof(*all), cmp_u32);
        struct totals x = sum(w, started);
        report(cli, x, secs, all, n);
        if (x.ok == 0) {
            int last = 0;
            for (unsigned i = 0; i < started; i++) {
                last = atomic_load(&w[i].last_err) != 0
                           ? atomic_load(&w[i].last_err)
                           : last;
            }
            rv = last != 0 ? last : IDA_ETIMEDOUT;
            fprintf(stderr,
                    "idalloc: bench: no request succeeded (last error: %s); "
                    "check the pool and `idalloc status`\n",
                    idalloc_strerror(rv));
        }
    }
    ida_free(all);
    ida_free(w);
    ida_free(t);
    return rv != 0 ? rv : all == NULL ? IDA_ENOMEM : 0;
}
