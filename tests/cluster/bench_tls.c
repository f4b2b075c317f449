/* make bench: the cost of TLS. Three 3-node clusters on this machine (fsync
 * on), one after the other, in the same run: peers in plaintext (the
 * baseline), peers in mutual TLS (the default), and peers in TLS with a
 * client port that requires TLS client certificates. Each runs durable
 * allocs at 16 and 256 requests in flight; the variants alternate, each
 * round starting with the next one, so that a change in the machine's load
 * hits all three alike. Prints each step's line of `idalloc bench`,
 * then per variant the median allocs/s and its ratio to the plaintext
 * baseline. BENCH_SECONDS (default 5) sets each step, BENCH_ROUNDS
 * (default 3) the rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/client/bench.h"
#include "tests/lib/harness.h"

#define VARIANTS   3
#define LEVELS     2
#define ROUNDS_MAX 9

static const char *const variant_name[VARIANTS] = {
    "peers plaintext (baseline)", "peers TLS", "peers TLS + client TLS"};
static const char *const variant_extra[VARIANTS] = {"peer_tls off\n", NULL,
                                                    "client_tls required\n"};
static const unsigned levels[LEVELS] = {16, 256};

/* One `idalloc bench` step; its ops_per_s (0 on failure). The JSON line
 * is captured from stdout and printed. */
static double step(struct idalloc_client *c, unsigned clients, unsigned secs)
{
    struct ida_cli cli = {.cmd = IDA_CLI_BENCH,
                          .bench_op = IDA_BENCH_ALLOC,
                          .pool = "tb",
                          .clients = clients,
                          .duration_s = secs,
                          .count = 1,
                          .json = 1};
    char path[] = "/tmp/ida-bench-tls-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        return 0;
    }
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    int rv = ida_bench_run(c, NULL, &cli);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    char buf[2048] = "";
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    fputs(buf, stdout);
    const char *p = strstr(buf, "\"ops_per_s\":");
    return rv == 0 && p != NULL ? atof(p + strlen("\"ops_per_s\":")) : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    const char *e = getenv("BENCH_SECONDS");
    unsigned secs = e != NULL && atoi(e) > 0 ? (unsigned)atoi(e) : 5;
    e = getenv("BENCH_ROUNDS");
    int rounds = e != NULL && atoi(e) > 0 ? atoi(e) : 3;
    rounds = rounds > ROUNDS_MAX ? ROUNDS_MAX : rounds;
    double ops[VARIANTS][LEVELS][ROUNDS_MAX];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < VARIANTS; i++) {
            /* Each round starts with another variant: none is always
             * the first cluster after a pause. */
            int v = (r + i) % VARIANTS;
            struct tc c;
            tc_start(&c, 3, variant_extra[v]);
            if (tc_wait_leader(&c, 20000) < 0) {
                fprintf(stderr, "bench_tls: no leader (%s)\n", variant_name[v]);
                tc_destroy(&c);
                return 1;
            }
            /* tc_client()'s TLS files, with `idalloc bench`'s timeouts (an
             * attempt of 1 s: the harness's 500 ms retries under load, and
             * a retry whose answer the session table no longer keeps ends
             * "unknown"). */
            struct idalloc_client *cl = tc_client(&c, 10000);
            idalloc_client_free(cl);
            struct idalloc_options o;
            idalloc_options_init(&o);
            char ca[400], crt[400], key[400], err[IDALLOC_ERRMSG_MAX];
            o.addresses = c.addrs;
            o.call_timeout_ms = 10000;
            if (v == 2) {
                snprintf(ca, sizeof(ca), "%.350s/ca.crt", c.tls);
                snprintf(crt, sizeof(crt), "%.350s/client1.crt", c.tls);
                snprintf(key, sizeof(key), "%.350s/client1.key", c.tls);
                o.tls_ca_file = ca;
                o.tls_cert_file = crt;
                o.tls_key_file = key;
            }
            if (idalloc_client_new(&o, &cl, err) != 0) {
                fprintf(stderr, "bench_tls: %s\n", err);
                tc_destroy(&c);
                return 1;
            }
            for (int l = 0; l < LEVELS; l++) {
                printf("round %d, %s, %u in flight: ", r + 1, variant_name[v],
                       levels[l]);
                ops[v][l][r] = step(cl, levels[l], secs);
            }
            idalloc_client_free(cl);
            tc_destroy(&c);
        }
    }
    printf("durable allocs/s, median of %d rounds of %u s:\n", rounds, secs);
    for (int l = 0; l < LEVELS; l++) {
        double base = 0;
        for (int v = 0; v < VARIANTS; v++) {
            qsort(ops[v][l], (size_t)rounds, sizeof(double), cmp_double);
            double med = ops[v][l][rounds / 2];
            if (v == 0) {
                base = med;
            }
            printf("  %3u in flight  %-28s %9.0f/s  %.2fx of plaintext\n",
                   levels[l], variant_name[v], med,
                   base > 0 ? med / base : 0.0);
        }
    }
    return 0;
}
