/* make bench-scale: the cluster with a large state beside the same run's
 * empty cluster (mk/scale.mk; README, "Make targets").
 *
 *   build/prog/scale [--allocs N] [--seq-blocks N] [--prefixes N]
 *                    [--seconds S] [--repeat N] [--soak S]
 *
 * A 3-node cluster from the harness (tests/lib/harness.h: fsync on, peers
 * speaking mutual TLS), driven through the public client API. Two phases
 * measure the same figures:
 *
 *   empty  right after the cluster came up;
 *   full   after N live tagged allocations in a bounded pool, N sequence
 *          blocks (reserve) and N prefixes were written through the cluster
 *          as fast as 128 threads on two client objects go.
 *
 * The figures of a phase: allocs/s and p50/p99/p999 latency of 64 threads
 * allocating on one client object for S seconds; leader changes (the
 * leader's term before and after; pre-vote means a term moves only with an
 * election); unknown outcomes (calls whose struct idalloc_call ended
 * UNKNOWN: each is repeated with its request id until it has an answer, so
 * the state stays exact); the restart time of a follower killed with
 * SIGKILL (until its status shows an applied index at the leader's commit
 * of before the kill); the catch-up of a follower whose data directory was
 * removed (auto_rejoin re-admits it; the snapshot it installed, its size
 * from the leader's log line for that index, over the time from its start
 * until it applied the leader's commit); the leader's VmRSS per live
 * allocation. With --soak S, the same load then runs S more seconds on
 * the full cluster, its state growing: leader changes, unknown outcomes
 * and the leader's VmRSS per live allocation, sampled every 10 s (the
 * largest is reported). The end prints each figure beside the empty one, with
 * the targets of the state-at-scale work, and what the node logs say about the
 * snapshots taken meanwhile. Every figure is a measurement of this run on
 * this machine: a busy machine shows in the empty figures as much as in the
 * full ones, which is why each is given beside the other.
 *
 * Every node serves /metrics (metrics= on its line): over each load window
 * the calls of each processor (raft, storage, fsm) that held it longer
 * than 10 ms are counted on all three nodes
 * (idalloc_processor_step_duration_seconds): issue 19 allows housekeeping
 * 10 ms. This virtual machine itself pauses a thread 15 to 45 ms now and
 * then, which the empty phase's count shows. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "tests/lib/harness.h"

#define LOAD_THREADS  64
#define FILL_THREADS  128
#define FILL_CLIENTS  2
#define RESERVE_COUNT 64

#define REPEAT_MAX 16 /* restarts and catch-ups per phase, at most */

/* The node's processors, as /metrics labels them. */
#define PROCS 3
static const char *const proc_name[PROCS] = {"raft", "storage", "fsm"};

struct phase
{
    double allocs_per_s, p50_ms, p99_ms, p999_ms, max_ms;
    uint64_t ok, errors, unknown;
    uint64_t term_changes;  /* over the load window */
    double restart_ms;      /* -1: did not come back */
    double catchup_s;       /* -1: did not catch up */
    uint64_t snap_bytes;    /* the snapshot the wiped node installed */
    uint64_t snap_index;    /* 0: it installed none */
    uint64_t rss_kb;        /* the leader's VmRSS */
    uint64_t live;          /* live allocations at the measurement */
    uint64_t terms_overall; /* term movement over the whole phase */
    double start_to_install_s, learner_to_install_s; /* -1: unknown */
    /* Of a catch-up, from the logs: the check of the snapshot after its
     * last chunk came, and the replay of the log after it (installed to
     * caught up), with the entries it applied; -1: unknown. */
    double check_s, lag_s, replay_s;
    uint64_t replayed;
    uint64_t anon_kb, file_kb; /* RssAnon, RssFile */
    /* Sampled every SAMPLE_S during the load window: the largest leader
     * VmRSS per live allocation, and the VmRSS and live count then. */
    double rss_per_live_max;
    uint64_t rss_at_max_kb, live_at_max;
    /* Calls that held a processor longer than 10 ms, and 25 ms, on all
     * nodes over the load window (/metrics); -1: a node did not answer. */
    double over10[PROCS], over25[PROCS];
    /* Over the --repeat restarts and catch-ups (the fields above hold the
     * medians): the worst restart, how many were under 2 s; each catch-up's
     * rates (MB/s of the snapshot it installed; 0: none installed). */
    int runs;
    double restart_worst_ms;
    int restarts_under_2s;
    double rate[REPEAT_MAX], learner_rate[REPEAT_MAX];
};

static struct tc c;
static unsigned mport[3];    /* each node's metrics port */
static uint64_t live_allocs; /* tags the cluster acknowledged */

/* --- status --------------------------------------------------------------- */

static int node_status(int i, struct idalloc_node_status *s)
{
    struct idalloc_client *cl = tc_client(&c, 300);
    int rv = idalloc_node_status(cl, (size_t)i, s, NULL);
    idalloc_client_free(cl);
    return rv;
}

/* The leader's term and index (-1 when no leader answers). */
static int leader_term(uint64_t *term)
{
    int l = tc_wait_leader(&c, 15000);
    struct idalloc_node_status s;
    if (l < 0 || node_status(l, &s) != 0) {
        return -1;
    }
    *term = s.term;
    return l;
}

static uint64_t vmrss_kb(pid_t pid, uint64_t *anon, uint64_t *file)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    uint64_t kb = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned long long v;
        if (sscanf(line, "VmRSS: %llu kB", &v) == 1) {
            kb = v;
        }
        if (anon != NULL && sscanf(line, "RssAnon: %llu kB", &v) == 1) {
            *anon = v;
        }
        if (file != NULL && sscanf(line, "RssFile: %llu kB", &v) == 1) {
            *file = v;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb;
}

/* --- load: 64 threads allocating ------------------------------------------
 */

struct worker
{
    struct idalloc_client *cl;
    unsigned index;
    const char *run;
    atomic_int *stop;
    atomic_uint_fast64_t *acked; /* every worker's ok so far, for samples */
    uint64_t ok, errors, unknown;
    uint32_t *lat_us;
    size_t n, cap;
};

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* An alloc that ends with an answer: an unknown outcome is counted, then
 * repeated with the same request id (the cluster acts once). Returns the
 * final code; *unknown counts the unknown outcomes on the way. */
static int alloc_settled(struct idalloc_client *cl,
                         const char *pool,
                         const char *tag,
                         uint64_t *unknown)
{
    struct idalloc_call call;
    idalloc_call_init(&call);
    uint64_t id;
    for (int tries = 0;; tries++) {
        int rv = idalloc_alloc(cl, pool, tag, &id, NULL, &call);
        if (call.state != IDALLOC_CALL_UNKNOWN) {
            return rv;
        }
        (*unknown)++;
        if (tries == 20) {
            int r = idalloc_call_release(cl, &call);
            (void)r;
            return rv;
        }
    }
}

static void *load_main(void *arg)
{
    struct worker *w = arg;
    for (uint64_t i = 0; !atomic_load(w->stop); i++) {
        char tag[64];
        snprintf(tag, sizeof(tag), "%s-%u-%llu", w->run, w->index,
                 (unsigned long long)i);
        uint64_t t0 = now_us();
        int rv = alloc_settled(w->cl, "load", tag, &w->unknown);
        uint64_t us = now_us() - t0;
        if (w->n == w->cap) {
            w->cap = w->cap == 0 ? 65536 : w->cap * 2;
            w->lat_us = realloc(w->lat_us, w->cap * sizeof(*w->lat_us));
            if (w->lat_us == NULL) {
                fprintf(stderr, "scale: out of memory\n");
                exit(1);
            }
        }
        w->lat_us[w->n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
        if (rv == 0) {
            w->ok++;
            atomic_fetch_add_explicit(w->acked, 1, memory_order_relaxed);
        } else {
            w->errors++;
        }
    }
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double quantile_ms(const uint32_t *v, size_t n, double q)
{
    if (n == 0) {
        return 0;
    }
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1] / 1000.0;
}

#define SAMPLE_S 10 /* between two samples of the leader's VmRSS */

/* The leader's VmRSS per live allocation now (printed, with its RssAnon
 * and RssFile: the LMDB map's pages the node read, its snapshots' among
 * them), kept in @ph if the largest so far. @acked: the window's
 * acknowledged allocations so far; @at_s: seconds into the window. */
static void sample_rss(struct phase *ph, uint64_t acked, double at_s)
{
    int l = tc_wait_leader(&c, 1000);
    uint64_t live = live_allocs + acked, anon = 0, file = 0;
    uint64_t kb = l >= 0 ? vmrss_kb(c.pid[l], &anon, &file) : 0;
    double per = live > 0 ? (double)kb * 1024.0 / (double)live : 0;
    printf(
        "    at %.0f s: %llu live, leader VmRSS %.1f MiB (anon %.1f, file "
        "%.1f): %.1f B per live allocation\n",
        at_s, (unsigned long long)live, (double)kb / 1024.0,
        (double)anon / 1024.0, (double)file / 1024.0, per);
    if (per > ph->rss_per_live_max) {
        ph->rss_per_live_max = per;
        ph->rss_at_max_kb = kb;
        ph->live_at_max = live;
    }
}

/* Put metrics=127.0.0.1:PORT on every node's line (tc_start_edited()). */
static void add_metrics(struct tc *t, void *arg)
{
    (void)arg;
    for (int i = 0; i < t->n; i++) {
        mport[i] = tc_add_metrics(t, i);
    }
}

/* Node @i's calls of each processor so far: all of them, and those over
 * 10 ms and 25 ms (the histogram's buckets). 0, or -1 when it did not
 * answer. */
static int proc_calls(int i, double over10[PROCS], double over25[PROCS])
{
    static char body[1 << 18];
    if (tc_http(mport[i], "GET", "/metrics", body, sizeof(body)) != 200) {
        return -1;
    }
    for (int p = 0; p < PROCS; p++) {
        char name[160];
        snprintf(name, sizeof(name),
                 "idalloc_processor_step_duration_seconds_count{processor="
                 "\"%s\"}",
                 proc_name[p]);
        double all = tc_metric(body, name);
        snprintf(name, sizeof(name),
                 "idalloc_processor_step_duration_seconds_bucket{processor="
                 "\"%s\",le=\"0.01\"}",
                 proc_name[p]);
        double le10 = tc_metric(body, name);
        snprintf(name, sizeof(name),
                 "idalloc_processor_step_duration_seconds_bucket{processor="
                 "\"%s\",le=\"0.025\"}",
                 proc_name[p]);
        double le25 = tc_metric(body, name);
        if (all < 0 || le10 < 0 || le25 < 0) {
            return -1;
        }
        over10[p] = all - le10;
        over25[p] = all - le25;
    }
    return 0;
}

/* Every node's counts (proc_calls()) into @o10 and @o25. */
static int all_calls(double o10[3][PROCS], double o25[3][PROCS])
{
    int rv = 0;
    for (int i = 0; i < c.n; i++) {
        rv |= proc_calls(i, o10[i], o25[i]);
    }
    return rv;
}

static void load(struct phase *ph, const char *run, unsigned secs)
{
    double b10[3][PROCS], b25[3][PROCS], e10[3][PROCS], e25[3][PROCS];
    int calls_ok = all_calls(b10, b25) == 0;
    struct idalloc_client *cl = tc_client(&c, 10000);
    struct worker w[LOAD_THREADS];
    pthread_t t[LOAD_THREADS];
    atomic_int stop = 0;
    atomic_uint_fast64_t acked = 0;
    uint64_t term0 = 0, term1 = 0;
    leader_term(&term0);
    uint64_t t0 = now_us();
    for (unsigned i = 0; i < LOAD_THREADS; i++) {
        w[i] = (struct worker){
            .cl = cl, .index = i, .run = run, .stop = &stop, .acked = &acked};
        pthread_create(&t[i], NULL, load_main, &w[i]);
    }
    for (unsigned left = secs; left > 0;) {
        unsigned s = left < SAMPLE_S ? left : SAMPLE_S;
        sleep(s);
        left -= s;
        sample_rss(ph, atomic_load(&acked), (double)(now_us() - t0) / 1e6);
    }
    atomic_store(&stop, 1);
    size_t n = 0;
    for (unsigned i = 0; i < LOAD_THREADS; i++) {
        pthread_join(t[i], NULL);
        n += w[i].n;
    }
    calls_ok = calls_ok && all_calls(e10, e25) == 0;
    for (int p = 0; p < PROCS; p++) {
        ph->over10[p] = ph->over25[p] = calls_ok ? 0 : -1;
        for (int i = 0; calls_ok && i < c.n; i++) {
            ph->over10[p] += e10[i][p] - b10[i][p];
            ph->over25[p] += e25[i][p] - b25[i][p];
        }
    }
    double s = (double)(now_us() - t0) / 1e6;
    uint32_t *all = malloc((n + 1) * sizeof(*all));
    size_t at = 0;
    for (unsigned i = 0; i < LOAD_THREADS; i++) {
        memcpy(all + at, w[i].lat_us, w[i].n * sizeof(*all));
        at += w[i].n;
        free(w[i].lat_us);
        ph->ok += w[i].ok;
        ph->errors += w[i].errors;
        ph->unknown += w[i].unknown;
    }
    qsort(all, n, sizeof(*all), cmp_u32);
    ph->allocs_per_s = (double)ph->ok / s;
    ph->p50_ms = quantile_ms(all, n, 0.5);
    ph->p99_ms = quantile_ms(all, n, 0.99);
    ph->p999_ms = quantile_ms(all, n, 0.999);
    /* The slowest call: a stall that happens once per window (a table
     * growing, a snapshot) is below the p999. */
    ph->max_ms = n > 0 ? all[n - 1] / 1000.0 : 0;
    free(all);
    live_allocs += ph->ok;
    leader_term(&term1);
    ph->term_changes = term1 - term0;
    idalloc_client_free(cl);
    printf(
        "  load %s: %u threads, %.1f s: ok=%llu errors=%llu unknown=%llu "
        "allocs/s=%.0f p50=%.2f ms p99=%.2f ms p999=%.2f ms max=%.2f ms, "
        "term %llu -> %llu\n",
        run, LOAD_THREADS, s, (unsigned long long)ph->ok,
        (unsigned long long)ph->errors, (unsigned long long)ph->unknown,
        ph->allocs_per_s, ph->p50_ms, ph->p99_ms, ph->p999_ms, ph->max_ms,
        (unsigned long long)term0, (unsigned long long)term1);
    printf(
        "  calls over 10 ms (over 25 ms), all nodes: raft %.0f (%.0f), "
        "storage %.0f (%.0f), fsm %.0f (%.0f)%s\n",
        ph->over10[0], ph->over25[0], ph->over10[1], ph->over25[1],
        ph->over10[2], ph->over25[2],
        calls_ok ? "" : " (a node's /metrics did not answer)");
    fflush(stdout);
}

/* --- fill ----------------------------------------------------------------- */

struct fill
{
    struct idalloc_client *cl[FILL_CLIENTS];
    uint64_t allocs, seqs, prefixes;
    atomic_uint_fast64_t next, done, errors, unknown, allocs_ok;
    atomic_int failed_code;
};

static void *fill_main(void *arg)
{
    struct fill *f = ((void **)arg)[0];
    struct idalloc_client *cl = ((void **)arg)[1];
    uint64_t total = f->allocs + f->seqs + f->prefixes, unknown = 0;
    for (;;) {
        uint64_t i = atomic_fetch_add(&f->next, 1);
        if (i >= total) {
            break;
        }
        char tag[48];
        snprintf(tag, sizeof(tag), "s%llu", (unsigned long long)i);
        int rv;
        if (i < f->allocs) {
            rv = alloc_settled(cl, "scale", tag, &unknown);
        } else {
            struct idalloc_call call;
            idalloc_call_init(&call);
            for (int tries = 0; tries < 20; tries++) {
                uint64_t first;
                uint8_t p[9];
                size_t plen;
                rv =
                    i < f->allocs + f->seqs
                        ? idalloc_reserve(cl, "seq", RESERVE_COUNT, &first,
                                          &call)
                        : idalloc_prefix(cl, "pfx", tag, p, &plen, NULL, &call);
                if (call.state != IDALLOC_CALL_UNKNOWN) {
                    break;
                }
                unknown++;
            }
            if (call.state == IDALLOC_CALL_UNKNOWN) {
                int r = idalloc_call_release(cl, &call);
                (void)r;
            }
        }
        if (rv == 0) {
            atomic_fetch_add(&f->done, 1);
            if (i < f->allocs) {
                atomic_fetch_add(&f->allocs_ok, 1);
            }
        } else {
            atomic_fetch_add(&f->errors, 1);
            atomic_store(&f->failed_code, rv);
        }
    }
    atomic_fetch_add(&f->unknown, unknown);
    return NULL;
}

static int create_pool(const char *name, enum idalloc_pool_kind k, uint64_t n)
{
    struct idalloc_client *cl = tc_client(&c, 10000);
    int rv = idalloc_pool_create(cl, name, k, n, NULL, tc_detail());
    if (rv != 0 && rv != IDA_EPOOLEXISTS) {
        fprintf(stderr, "scale: pool %s: %s\n", name, tc_errmsg());
    }
    idalloc_client_free(cl);
    return rv == IDA_EPOOLEXISTS ? 0 : rv;
}

static uint64_t fill(uint64_t allocs, uint64_t seqs, uint64_t prefixes)
{
    struct fill f = {.allocs = allocs, .seqs = seqs, .prefixes = prefixes};
    uint64_t term0 = 0, term1 = 0;
    leader_term(&term0);
    for (int i = 0; i < FILL_CLIENTS; i++) {
        f.cl[i] = tc_client(&c, 10000);
    }
    pthread_t t[FILL_THREADS];
    void *args[FILL_THREADS][2];
    uint64_t t0 = tc_now_ms(), total = allocs + seqs + prefixes;
    for (int i = 0; i < FILL_THREADS; i++) {
        args[i][0] = &f;
        args[i][1] = f.cl[i % FILL_CLIENTS];
        pthread_create(&t[i], NULL, fill_main, args[i]);
    }
    uint64_t last = 0, last_ms = t0;
    while (atomic_load(&f.done) + atomic_load(&f.errors) < total) {
        tc_sleep_ms(200);
        if (tc_now_ms() - last_ms >= 10000) {
            uint64_t d = atomic_load(&f.done);
            printf(
                "  fill: %llu of %llu written, %.0f/s\n", (unsigned long long)d,
                (unsigned long long)total,
                (double)(d - last) * 1000.0 / (double)(tc_now_ms() - last_ms));
            fflush(stdout);
            last = d;
            last_ms = tc_now_ms();
        }
    }
    for (int i = 0; i < FILL_THREADS; i++) {
        pthread_join(t[i], NULL);
    }
    double s = (double)(tc_now_ms() - t0) / 1000.0;
    for (int i = 0; i < FILL_CLIENTS; i++) {
        idalloc_client_free(f.cl[i]);
    }
    leader_term(&term1);
    printf(
        "  fill: %llu writes (%llu allocs, %llu reserves of %d, %llu "
        "prefixes) in %.1f s = %.0f writes/s; errors=%llu%s%s unknown=%llu, "
        "term %llu -> %llu\n",
        (unsigned long long)atomic_load(&f.done), (unsigned long long)allocs,
        (unsigned long long)seqs, RESERVE_COUNT, (unsigned long long)prefixes,
        s, (double)atomic_load(&f.done) / s,
        (unsigned long long)atomic_load(&f.errors),
        atomic_load(&f.errors) > 0 ? " last: " : "",
        atomic_load(&f.errors) > 0
            ? idalloc_errname(atomic_load(&f.failed_code))
            : "",
        (unsigned long long)atomic_load(&f.unknown), (unsigned long long)term0,
        (unsigned long long)term1);
    fflush(stdout);
    /* Every allocation answered ok is live (an unknown outcome was repeated
     * until answered). */
    return atomic_load(&f.allocs_ok);
}

/* --- restart and catch-up -------------------------------------------------
 */

static int follower_of(int leader)
{
    return (leader + 1) % c.n;
}

/* Wait until node @i answers status with an applied index >= @index; ms
 * since @t0, or -1 after @limit_ms. */
static double wait_caught_up(int i, uint64_t index, uint64_t t0, unsigned lim)
{
    struct idalloc_client *cl = tc_client(&c, 200);
    double ms = -1;
    while (tc_now_ms() - t0 < lim) {
        struct idalloc_node_status s;
        if (idalloc_node_status(cl, (size_t)i, &s, NULL) == 0 &&
            s.applied_index >= index) {
            ms = (double)(tc_now_ms() - t0);
            break;
        }
        tc_sleep_ms(5);
    }
    idalloc_client_free(cl);
    return ms;
}

static double restart(int *which)
{
    int l = tc_wait_leader(&c, 15000);
    if (l < 0) {
        return -1;
    }
    int f = follower_of(l);
    *which = f + 1;
    uint64_t commit = tc_commit_index(&c);
    tc_wait_applied(&c, commit, 30000);
    tc_signal(&c, f, SIGKILL);
    uint64_t t0 = tc_now_ms();
    tc_spawn(&c, f);
    return wait_caught_up(f, commit, t0, 120000);
}

/* The last number after @key on a line of @path holding @needle. */
static uint64_t log_find(const char *path,
                         const char *needle,
                         const char *fmt,
                         uint64_t *second)
{
    FILE *fp = fopen(path, "r");
    char line[1024];
    uint64_t v = 0;
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        const char *p = strstr(line, needle);
        unsigned long long a, b = 0;
        if (p != NULL && sscanf(p, fmt, &a, &b) >= 1) {
            v = a;
            if (second != NULL) {
                *second = b;
            }
        }
    }
    if (fp != NULL) {
        fclose(fp);
    }
    return v;
}

/* Milliseconds of the day of the timestamp opening the first line of @path
 * holding @needle ("2026-11-23T13:55:27.991Z ..."), the last such line when
 * @last; -1 if none. */
static double log_time_ms(const char *path, const char *needle, int last)
{
    FILE *fp = fopen(path, "r");
    char line[1024];
    double t = -1;
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        unsigned h, m;
        double sec;
        if (strstr(line, needle) != NULL &&
            sscanf(line, "%*10cT%u:%u:%lfZ", &h, &m, &sec) == 3) {
            t = ((double)h * 3600 + (double)m * 60 + sec) * 1000.0;
            if (!last) {
                break;
            }
        }
    }
    if (fp != NULL) {
        fclose(fp);
    }
    return t;
}

/* The last "checked in N ms after its last chunk" of @path (raft_snap.c,
 * check_finish()): the check of a snapshot received, in ms (-1000 if none);
 * *@lag_ms the part of it spent decoding the bytes the stream had not yet
 * ("N ms decoding its last bytes"; -1000 if the line does not say). */
static double log_checked_ms(const char *path, double *lag_ms)
{
    FILE *fp = fopen(path, "r");
    char line[1024];
    double ms = -1000;
    *lag_ms = -1000;
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        const char *p = strstr(line, " checked in ");
        double v;
        if (p != NULL && strstr(p, "after its last chunk") != NULL &&
            sscanf(p, " checked in %lf", &v) == 1) {
            ms = v;
            const char *q = strstr(p, " ms decoding its last bytes");
            *lag_ms = -1000;
            while (q != NULL && q > p && q[-1] != ' ') {
                q--;
            }
            if (q != NULL && sscanf(q, "%lf", &v) == 1) {
                *lag_ms = v;
            }
        }
    }
    if (fp != NULL) {
        fclose(fp);
    }
    return ms;
}

/* Whether all three nodes are voters again with no one waiting. */
static int membership_whole(void)
{
    struct idalloc_client *cl = tc_client(&c, 2000);
    struct idalloc_member_list m;
    int ok = idalloc_member_list(cl, &m, NULL) == 0;
    int voters = 0;
    for (size_t i = 0; ok && i < m.n; i++) {
        voters += m.members[i].voter && !m.members[i].waiting;
        ok &= !m.members[i].waiting;
    }
    idalloc_client_free(cl);
    return ok && voters == c.n;
}

/* The restarted node's own account of its start (node.c, restore()). */
static void print_restored_line(int which)
{
    char path[400], line[1024], last[1024] = "";
    snprintf(path, sizeof(path), "%s/node%d.log", c.dir, which);
    FILE *fp = fopen(path, "r");
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        const char *p = strstr(line, "node: restored ");
        if (p != NULL) {
            snprintf(last, sizeof(last), "%s", p);
        }
    }
    if (fp != NULL) {
        fclose(fp);
    }
    if (last[0] != '\0') {
        printf("    its log: %s", last);
    }
}

static void catch_up(struct phase *ph, int *which)
{
    ph->catchup_s = -1;
    int l = tc_wait_leader(&c, 15000);
    if (l < 0) {
        return;
    }
    int f = follower_of(l);
    *which = f + 1;
    tc_signal(&c, f, SIGKILL);
    char out[256];
    tc_run(out, sizeof(out), "rm -rf %s/data/node%d", c.dir, f + 1);
    /* Its old log says nothing about the new incarnation. */
    tc_run(out, sizeof(out), "mv %s/node%d.log %s/node%d.log.old", c.dir, f + 1,
           c.dir, f + 1);
    uint64_t commit = tc_commit_index(&c);
    uint64_t t0 = tc_now_ms();
    tc_spawn(&c, f);
    double ms = wait_caught_up(f, commit, t0, 300000);
    if (ms >= 0) {
        ph->catchup_s = ms / 1000.0;
    }
    char flog[400], llog[400], needle[96];
    snprintf(flog, sizeof(flog), "%s/node%d.log", c.dir, f + 1);
    snprintf(llog, sizeof(llog), "%s/node%d.log", c.dir, l + 1);
    ph->snap_index = log_find(flog, "fsm: installed snapshot at index",
                              "fsm: installed snapshot at index %llu", NULL);
    if (ph->snap_index > 0) {
        snprintf(needle, sizeof(needle), "fsm: snapshot at index %llu ",
                 (unsigned long long)ph->snap_index);
        uint64_t bytes = 0;
        log_find(llog, needle, "fsm: snapshot at index %llu (%llu bytes",
                 &bytes);
        ph->snap_bytes = bytes;
        /* The transfer alone, from the logs' clocks: from the node's first
         * line (its start) and from the leader adding it as a learner, to
         * its "installed snapshot". */
        double inst = log_time_ms(flog, "fsm: installed snapshot", 1);
        double start = log_time_ms(flog, " INFO ", 0);
        double learner = log_time_ms(llog, "voters, 1 learners", 1);
        ph->start_to_install_s = inst >= start ? (inst - start) / 1000 : -1;
        ph->learner_to_install_s =
            learner >= 0 && inst >= learner ? (inst - learner) / 1000 : -1;
        double lag_ms;
        ph->check_s = log_checked_ms(flog, &lag_ms) / 1000;
        ph->lag_s = lag_ms / 1000;
        ph->replay_s = ph->catchup_s >= 0 && ph->start_to_install_s >= 0
                           ? ph->catchup_s - ph->start_to_install_s
                           : -1;
        ph->replayed = commit > ph->snap_index ? commit - ph->snap_index : 0;
    }
    /* Re-admitted as a voter before anything else is measured. */
    for (uint64_t end = tc_now_ms() + 60000;
         tc_now_ms() < end && !membership_whole();) {
        tc_sleep_ms(100);
    }
    if (!membership_whole()) {
        printf("  catch-up: node %d was not re-admitted as a voter\n", f + 1);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of @v[0..n) (sorted in place); -1 when n is 0. A value of -1
 * in it (a run that failed) sorts first. */
static double median(double *v, int n)
{
    if (n == 0) {
        return -1;
    }
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static unsigned repeats = 3;

static void measure(struct phase *ph, const char *name, unsigned secs)
{
    uint64_t term0 = 0, term1 = 0;
    leader_term(&term0);
    printf("phase %s\n", name);
    fflush(stdout);
    load(ph, name, secs);
    int l = tc_wait_leader(&c, 15000);
    ph->live = live_allocs;
    ph->rss_kb = l >= 0 ? vmrss_kb(c.pid[l], &ph->anon_kb, &ph->file_kb) : 0;
    int which = 0;
    int n = (int)repeats;
    double restarts[REPEAT_MAX], catchups[REPEAT_MAX], starts[REPEAT_MAX],
        learners[REPEAT_MAX], checks[REPEAT_MAX], lags[REPEAT_MAX],
        replays[REPEAT_MAX];
    int nsnap = 0;
    ph->runs = n;
    ph->restart_worst_ms = 0;
    for (int r = 0; r < n; r++) {
        restarts[r] = restart(&which);
        if (restarts[r] >= 0) {
            printf(
                "  restart %d: node %d served at the leader's commit "
                "after %.0f ms\n",
                r + 1, which, restarts[r]);
        } else {
            printf(
                "  restart %d: node %d did not serve at the leader's "
                "commit within 120 s\n",
                r + 1, which);
        }
        print_restored_line(which);
        fflush(stdout);
        if (restarts[r] > ph->restart_worst_ms) {
            ph->restart_worst_ms = restarts[r]; /* of those that served */
        }
        ph->restarts_under_2s += restarts[r] >= 0 && restarts[r] < 2000;
    }
    ph->restart_ms = median(restarts, n);
    for (int r = 0; r < n; r++) {
        struct phase one = {.start_to_install_s = -1,
                            .learner_to_install_s = -1,
                            .check_s = -1,
                            .lag_s = -1,
                            .replay_s = -1};
        catch_up(&one, &which);
        catchups[r] = one.catchup_s;
        starts[r] = one.start_to_install_s;
        learners[r] = one.learner_to_install_s;
        double mb = (double)one.snap_bytes / 1e6;
        ph->rate[r] =
            one.snap_index > 0 && one.catchup_s > 0 ? mb / one.catchup_s : 0;
        ph->learner_rate[r] = one.snap_index > 0 && one.learner_to_install_s > 0
                                  ? mb / one.learner_to_install_s
                                  : 0;
        if (one.snap_index > 0) {
            ph->snap_index = one.snap_index;
            ph->snap_bytes = one.snap_bytes;
            printf(
                "  catch-up %d: wiped node %d applied the leader's commit "
                "after %.2f s; installed snapshot at index %llu (%llu "
                "bytes): %.1f MB/s start to caught up, %.1f MB/s learner "
                "added to installed\n",
                r + 1, which, one.catchup_s, (unsigned long long)one.snap_index,
                (unsigned long long)one.snap_bytes, ph->rate[r],
                ph->learner_rate[r]);
            printf(
                "    start to installed %.2f s, of which the check after the "
                "last chunk %.2f s (%.2f s of it decoding the bytes the "
                "stream had not yet); then %llu entries replayed in %.2f s\n",
                one.start_to_install_s, one.check_s, one.lag_s,
                (unsigned long long)one.replayed, one.replay_s);
            checks[r] = one.check_s;
            lags[r] = one.lag_s;
            replays[r] = one.replay_s;
            nsnap++;
        } else {
            printf(
                "  catch-up %d: wiped node %d applied the leader's commit "
                "after %.2f s by log replication alone (no snapshot taken "
                "yet, none installed: no rate)\n",
                r + 1, which, one.catchup_s);
        }
        fflush(stdout);
    }
    ph->catchup_s = median(catchups, n);
    ph->start_to_install_s = median(starts, n);
    ph->learner_to_install_s = median(learners, n);
    ph->check_s = median(checks, nsnap);
    ph->lag_s = median(lags, nsnap);
    ph->replay_s = median(replays, nsnap);
    leader_term(&term1);
    ph->terms_overall = term1 - term0;
    fflush(stdout);
}

/* What the logs say about the snapshots of the whole run. */
static void snapshot_summary(void)
{
    for (int i = 0; i < c.n; i++) {
        char path[400], line[1024];
        snprintf(path, sizeof(path), "%s/node%d.log", c.dir, i + 1);
        FILE *fp = fopen(path, "r");
        unsigned n = 0, inl = 0;
        unsigned long long maxb = 0;
        double maxms = 0, maxfork = 0;
        while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
            const char *p = strstr(line, "fsm: snapshot at index ");
            unsigned long long idx, b;
            double ms = 0;
            if (p == NULL ||
                sscanf(p, "fsm: snapshot at index %llu (%llu bytes", &idx,
                       &b) != 2) {
                continue;
            }
            const char *q = strrchr(p, ',');
            if (q != NULL) {
                ms = atof(q + 1);
            }
            static const char FORK[] = "fork() held this processor ";
            const char *f = strstr(p, FORK);
            if (f != NULL) {
                double fms = atof(f + strlen(FORK));
                maxfork = fms > maxfork ? fms : maxfork;
            }
            n++;
            inl += strstr(p, "in line") != NULL;
            maxb = b > maxb ? b : maxb;
            maxms = ms > maxms ? ms : maxms;
        }
        if (fp != NULL) {
            fclose(fp);
        }
        printf(
            "  node %d (current log): %u snapshots (%u in line), largest %llu "
            "bytes, longest encode %.1f ms, longest fork %.1f ms (the fsm "
            "processor waits for it)\n",
            i + 1, n, inl, maxb, maxms, maxfork);
    }
}

static void row(const char *name, double e, double f, const char *unit)
{
    printf("  %-34s %14.2f %14.2f %s", name, e, f, unit);
    if (e > 0) {
        printf("  (full/empty %.2f)", f / e);
    }
    printf("\n");
}

static const char *yes(int ok)
{
    return ok ? "met" : "NOT met";
}

static uint64_t arg_u64(int argc, char **argv, const char *name, uint64_t d)
{
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], name) == 0) {
            return strtoull(argv[i + 1], NULL, 10);
        }
    }
    return d;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(
                "usage: scale [--allocs N] [--seq-blocks N] [--prefixes N] "
                "[--seconds S] [--repeat N] [--soak S]\n(defaults 300000, "
                "30000, 10000, 20, 3, 0; --repeat: restarts and catch-ups "
                "per phase, 1 to %d; --soak: seconds of load on the full "
                "cluster after its measurements, 0 for none; make "
                "bench-scale)\n",
                REPEAT_MAX);
            return 0;
        }
    }
    uint64_t allocs = arg_u64(argc, argv, "--allocs", 300000);
    uint64_t seqs = arg_u64(argc, argv, "--seq-blocks", 30000);
    uint64_t prefixes = arg_u64(argc, argv, "--prefixes", 10000);
    unsigned secs = (unsigned)arg_u64(argc, argv, "--seconds", 20);
    if (secs == 0) {
        secs = 1;
    }
    uint64_t rep = arg_u64(argc, argv, "--repeat", 3);
    if (rep < 1 || rep > REPEAT_MAX) {
        fprintf(stderr, "scale: --repeat must be 1 to %d\n", REPEAT_MAX);
        return 2;
    }
    repeats = (unsigned)rep;
    unsigned soak_s = (unsigned)arg_u64(argc, argv, "--soak", 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf(
        "bench-scale: 3 nodes (fsync on, TLS peers), %llu live allocations, "
        "%llu sequence blocks, %llu prefixes; load %u s at %d threads\n",
        (unsigned long long)allocs, (unsigned long long)seqs,
        (unsigned long long)prefixes, secs, LOAD_THREADS);
    tc_start_edited(&c, 3, NULL, add_metrics, NULL);
    if (tc_wait_leader(&c, 15000) < 0) {
        fprintf(stderr, "scale: no leader\n");
        tc_destroy(&c);
        return 1;
    }
    uint64_t pool = allocs + allocs / 4 + 1024;
    if (create_pool("load", IDALLOC_POOL_BOUNDED, UINT64_C(1) << 32) != 0 ||
        create_pool("scale", IDALLOC_POOL_BOUNDED, pool) != 0 ||
        create_pool("seq", IDALLOC_POOL_SEQUENCE, 0) != 0 ||
        create_pool("pfx", IDALLOC_POOL_PREFIX, 0) != 0) {
        tc_destroy(&c);
        return 1;
    }
    struct phase empty = {0}, full = {0};
    uint64_t rss_start = vmrss_kb(c.pid[tc_wait_leader(&c, 15000)], NULL, NULL);
    measure(&empty, "empty", secs);

    printf("fill\n");
    uint64_t t0 = tc_now_ms();
    live_allocs += fill(allocs, seqs, prefixes);
    /* Settled: every node applied all of it. */
    tc_wait_applied(&c, tc_commit_index(&c), 120000);
    printf("  settled %.1f s after the fill began\n",
           (double)(tc_now_ms() - t0) / 1000.0);
    measure(&full, "full", secs);
    struct phase soak = {0};
    if (soak_s > 0) {
        printf("soak\n");
        load(&soak, "soak", soak_s); /* its term_changes: the window's */
        printf(
            "  soak %u s: leader VmRSS per live allocation at most %.1f B "
            "(%.1f MiB at %llu live), %llu live at the end\n",
            soak_s, soak.rss_per_live_max, (double)soak.rss_at_max_kb / 1024.0,
            (unsigned long long)soak.live_at_max,
            (unsigned long long)live_allocs);
    }

    printf(
        "\nfigures (same run)                        empty           full\n");
    row("allocs/s (64 threads)", empty.allocs_per_s, full.allocs_per_s, "");
    row("p50 latency", empty.p50_ms, full.p50_ms, "ms");
    row("p99 latency", empty.p99_ms, full.p99_ms, "ms");
    row("p999 latency", empty.p999_ms, full.p999_ms, "ms");
    row("slowest call", empty.max_ms, full.max_ms, "ms");
    row("leader changes under load (terms)", (double)empty.term_changes,
        (double)full.term_changes, "");
    row("term changes, whole phase", (double)empty.terms_overall,
        (double)full.terms_overall, "");
    row("unknown outcomes under load", (double)empty.unknown,
        (double)full.unknown, "");
    row("errors under load", (double)empty.errors, (double)full.errors, "");
    for (int p = 0; p < PROCS; p++) {
        char what[64];
        snprintf(what, sizeof(what), "%s calls over 10 ms (all nodes)",
                 proc_name[p]);
        row(what, empty.over10[p], full.over10[p], "");
    }
    printf("  (restarts and catch-ups: the median of %u runs each)\n", repeats);
    row("follower restart -> serving", empty.restart_ms, full.restart_ms, "ms");
    row("  the worst restart", empty.restart_worst_ms, full.restart_worst_ms,
        "ms");
    row("wiped follower catch-up", empty.catchup_s, full.catchup_s, "s");
    row("snapshot installed", (double)empty.snap_bytes / 1e6,
        (double)full.snap_bytes / 1e6, "MB");
    double rates[REPEAT_MAX], lrates[REPEAT_MAX];
    memcpy(rates, full.rate, sizeof(rates));
    memcpy(lrates, full.learner_rate, sizeof(lrates));
    int fast = 0, lfast = 0;
    for (int r = 0; r < full.runs; r++) {
        fast += full.rate[r] > 100;
        lfast += full.learner_rate[r] > 100;
    }
    double rf = median(rates, full.runs), lf = median(lrates, full.runs);
    double rmin = full.runs > 0 ? rates[0] : 0;
    double lmin = full.runs > 0 ? lrates[0] : 0;
    memcpy(rates, empty.rate, sizeof(rates));
    double re = median(rates, empty.runs);
    row("catch-up rate (snapshot / time)", re, rf, "MB/s");
    row("  node start -> installed (logs)", empty.start_to_install_s,
        full.start_to_install_s, "s");
    row("  learner added -> installed (logs)", empty.learner_to_install_s,
        full.learner_to_install_s, "s");
    row("  rate learner added -> installed", 0, lf, "MB/s");
    row("  check after the last chunk (logs)", empty.check_s, full.check_s,
        "s");
    row("    of it, the stream catching up", empty.lag_s, full.lag_s, "s");
    row("  installed -> caught up (replay)", empty.replay_s, full.replay_s,
        "s");
    row("leader VmRSS", (double)empty.rss_kb / 1024.0,
        (double)full.rss_kb / 1024.0, "MiB");
    row("  of which RssAnon", (double)empty.anon_kb / 1024.0,
        (double)full.anon_kb / 1024.0, "MiB");
    row("  of which RssFile (LMDB map, code)", (double)empty.file_kb / 1024.0,
        (double)full.file_kb / 1024.0, "MiB");
    row("live allocations", (double)empty.live, (double)full.live, "");
    double bpa =
        full.live > 0 ? (double)full.rss_kb * 1024.0 / (double)full.live : 0;
    double marg = full.live > empty.live && full.rss_kb > empty.rss_kb
                      ? (double)(full.rss_kb - empty.rss_kb) * 1024.0 /
                            (double)(full.live - empty.live)
                      : 0;
    printf("  leader VmRSS at start %.1f MiB\n", (double)rss_start / 1024.0);
    printf(
        "  leader VmRSS per live allocation (full): %.1f B; marginal "
        "(full-empty)/(live added): %.1f B\n",
        bpa, marg);
    printf("\ntargets at this size\n");
    printf("  allocs/s >= 80%% of empty:     %s (%.0f%%)\n",
           yes(full.allocs_per_s >= 0.8 * empty.allocs_per_s),
           empty.allocs_per_s > 0
               ? 100.0 * full.allocs_per_s / empty.allocs_per_s
               : 0);
    printf("  p999 < 50 ms:                 %s (%.1f ms)\n",
           yes(full.p999_ms < 50), full.p999_ms);
    printf(
        "  restart < 2 s:                %s (%d of %d runs; median %.0f "
        "ms, worst %.0f ms)\n",
        yes(full.runs > 0 && full.restarts_under_2s == full.runs),
        full.restarts_under_2s, full.runs, full.restart_ms,
        full.restart_worst_ms);
    if (full.snap_index == 0) {
        printf(
            "  catch-up > 100 MB/s:          not measured (the wiped node "
            "caught up by the log alone: no snapshot yet)\n");
    } else {
        printf(
            "  catch-up > 100 MB/s:          %s (start to caught up: %d of %d "
            "runs, median %.1f MB/s, slowest %.1f; learner added to "
            "installed: %d of %d, median %.1f, slowest %.1f)\n",
            yes(fast == full.runs), fast, full.runs, rf, rmin, lfast, full.runs,
            lf, lmin);
    }
    printf("  0 leader changes:             %s (%llu in the full phase)\n",
           yes(full.terms_overall == 0 && full.term_changes == 0),
           (unsigned long long)full.terms_overall);
    printf("  0 unknown outcomes:           %s (%llu)\n",
           yes(full.unknown == 0 && empty.unknown == 0),
           (unsigned long long)full.unknown);
    printf("  < 64 B per live allocation:   %s (%.1f B)\n", yes(bpa < 64), bpa);
    /* Storage's calls wait for the fsync of each LMDB commit: the disk's
     * latency shows there, in the empty phase as much (the log line of a
     * slow call says what it was). */
    printf(
        "  no raft/fsm call > 10 ms:     %s (full phase, all nodes: raft %.0f, "
        "fsm %.0f; over 25 ms: %.0f and %.0f; the empty phase: %.0f and "
        "%.0f)\n",
        full.over10[0] < 0 ? "not measured"
                           : yes(full.over10[0] + full.over10[2] == 0),
        full.over10[0], full.over10[2], full.over25[0], full.over25[2],
        empty.over10[0], empty.over10[2]);
    printf(
        "  (storage calls over 10 ms, fsyncs included: full %.0f, empty "
        "%.0f)\n",
        full.over10[1], empty.over10[1]);
    if (soak_s == 0) {
        printf("  soak:                         not run (--soak S)\n");
    } else {
        printf(
            "  soak %u s, state growing:     %s (%llu leader changes, %llu "
            "unknown, %llu errors, at most %.1f B per live allocation)\n",
            soak_s,
            yes(soak.term_changes == 0 && soak.unknown == 0 &&
                soak.errors == 0 && soak.rss_per_live_max < 64),
            (unsigned long long)soak.term_changes,
            (unsigned long long)soak.unknown, (unsigned long long)soak.errors,
            soak.rss_per_live_max);
    }
    printf("\nsnapshots\n");
    snapshot_summary();
    if (getenv("IDA_KEEP_TEST_DIRS") != NULL) {
        printf("logs kept in %s\n", c.dir);
    }
    tc_destroy(&c);
    return 0;
}
