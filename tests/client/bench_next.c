/* make bench: idalloc_next() alone, against the scripted server (a reserve
 * costs one loopback round trip, so what is measured is the library's own
 * path). Prints ids/s on 1, 2 and 4 threads for the default block sizes and
 * for blocks of up to 2^20 ids, beside a baseline measured in the same run:
 * a mutex-guarded counter on the same threads, which is what every call
 * cost before the per-thread runs (one client-wide mutex per id).
 * BENCH_SECONDS (default 2) sets the length of each step. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idalloc.h"
#include "tests/client/fakeserver.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct worker
{
    struct idalloc_client *c; /* NULL: the mutex baseline */
    double secs;
    uint64_t n, errors, sink;
};

static pthread_mutex_t base_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t base_counter;
static atomic_int go;

/* The counts are kept in locals and stored once: the workers' structs sit
 * side by side in one array, and counting in them made the threads write
 * one cache line (the 2- and 4-thread figures then measured that). */
static void *run(void *arg)
{
    struct worker *w = arg;
    while (!atomic_load(&go)) {
    }
    uint64_t n = 0, errors = 0, sink = 0;
    double end = now_s() + w->secs;
    while (now_s() < end) {
        for (int i = 0; i < 4096; i++) {
            uint64_t id;
            if (w->c == NULL) {
                pthread_mutex_lock(&base_mu);
                id = base_counter++;
                pthread_mutex_unlock(&base_mu);
            } else if (idalloc_next(w->c, "seq", &id, NULL) != 0) {
                errors++;
                continue;
            }
            sink += id;
            n++;
        }
    }
    w->n = n;
    w->errors = errors;
    w->sink = sink;
    return NULL;
}

static double measure(struct idalloc_client *c, int threads, double secs)
{
    struct worker w[8];
    pthread_t t[8];
    atomic_store(&go, 0);
    for (int i = 0; i < threads; i++) {
        w[i] = (struct worker){.c = c, .secs = secs};
        pthread_create(&t[i], NULL, run, &w[i]);
    }
    double t0 = now_s();
    atomic_store(&go, 1);
    uint64_t n = 0, errors = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        n += w[i].n;
        errors += w[i].errors;
    }
    double el = now_s() - t0;
    if (errors > 0) {
        printf("  (%llu errors)\n", (unsigned long long)errors);
    }
    return (double)n / el;
}

static struct idalloc_client *client(struct fake_server *s, uint64_t max)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = s->addr;
    if (max > 0) {
        o.next_block_max = max;
    }
    struct idalloc_client *c = NULL;
    char err[IDALLOC_ERRMSG_MAX];
    if (idalloc_client_new(&o, &c, err) != 0) {
        fprintf(stderr, "bench_next: %s\n", err);
        exit(1);
    }
    return c;
}

int main(void)
{
    const char *e = getenv("BENCH_SECONDS");
    double secs = e != NULL && atof(e) > 0 ? atof(e) : 2.0;
    struct fake_server s;
    fake_start(&s, FAKE_ANSWER);
    uint64_t maxes[2] = {0, 1u << 20};
    for (int m = 0; m < 2; m++) {
        struct idalloc_client *c = client(&s, maxes[m]);
        uint64_t warm;
        for (int i = 0; i < 1000000; i++) {
            if (idalloc_next(c, "seq", &warm, NULL) != 0) { /* grow the block */
                fprintf(stderr, "bench_next: next failed\n");
                exit(1);
            }
        }
        for (int threads = 1; threads <= 4; threads *= 2) {
            double base = measure(NULL, threads, secs);
            double got = measure(c, threads, secs);
            printf(
                "next() %s blocks, %d thread(s): %.1fM ids/s; "
                "baseline mutex counter %.1fM/s; ratio %.2f\n",
                maxes[m] == 0 ? "default" : "2^20-id", threads, got / 1e6,
                base / 1e6, got / base);
            fflush(stdout);
        }
        idalloc_client_free(c);
    }
    fake_stop(&s);
    return 0;
}
