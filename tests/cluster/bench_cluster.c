/* make bench: the whole cluster. A 3-node cluster on this machine (fsync
 * on), driven through the client library:
 *   - durable allocs/s at 1, 16, 64, 256 requests in flight, p50/p99;
 *   - the raw fdatasync rate of the same disk, measured in the same run, as
 *     the baseline: allocs per fsync shows what group commit buys;
 *   - next() ids/s on 1 and 4 threads;
 *   - time from a leader kill to the next acknowledged write, over 20 kills.
 * BENCH_SECONDS (default 5) sets the length of each load step. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/client/bench.h"
#include "tests/lib/harness.h"

static double fdatasync_rate(const char *dir, double secs)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/fsync-probe", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return 0;
    }
    char buf[4096];
    memset(buf, 'x', sizeof(buf));
    uint64_t end = tc_now_ms() + (uint64_t)(secs * 1000), t0 = tc_now_ms();
    long n = 0;
    while (tc_now_ms() < end) {
        if (pwrite(fd, buf, sizeof(buf), (off_t)(n % 64) * 4096) < 0 ||
            fdatasync(fd) != 0) {
            break;
        }
        n++;
    }
    double rate = (double)n * 1000.0 / (double)(tc_now_ms() - t0);
    close(fd);
    unlink(path);
    return rate;
}

static void load(struct idalloc_client *c,
                 enum ida_cli_bench_op op,
                 const char *pool,
                 unsigned clients,
                 unsigned secs)
{
    struct ida_cli cli = {.cmd = IDA_CLI_BENCH,
                          .bench_op = op,
                          .pool = pool,
                          .clients = clients,
                          .duration_s = secs,
                          .count = 1};
    fflush(stdout);
    if (ida_bench_run(c, NULL, &cli) != 0) {
        printf("bench failed: %s\n", tc_errmsg());
    }
    fflush(stdout);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void leader_kills(struct tc *c, int kills)
{
    struct idalloc_client *cl = tc_client(c, 300);
    uint64_t ms[64];
    int done = 0;
    for (int k = 0; k < kills; k++) {
        int l = tc_wait_leader(c, 10000);
        if (l < 0) {
            printf("kills: no leader\n");
            break;
        }
        uint64_t t0 = tc_now_ms();
        tc_signal(c, l, SIGKILL);
        for (int i = 0;; i++) {
            char tag[48];
            uint64_t id;
            snprintf(tag, sizeof(tag), "kill-%d-%d", k, i);
            if (idalloc_alloc(cl, "kb", tag, &id, NULL, tc_detail()) == 0) {
                break;
            }
        }
        ms[done++] = tc_now_ms() - t0;
        tc_spawn(c, l);
        tc_wait_applied(c, tc_commit_index(c), 10000);
    }
    qsort(ms, (size_t)done, sizeof(ms[0]), cmp_u64);
    if (done > 0) {
        printf(
            "leader kill -> next acknowledged write over %d kills: "
            "p50_ms=%llu p99_ms=%llu max_ms=%llu (election_timeout_ms=300)\n",
            done, (unsigned long long)ms[done / 2],
            (unsigned long long)
                ms[(done * 99) / 100 < done ? (done * 99) / 100 : done - 1],
            (unsigned long long)ms[done - 1]);
    }
    idalloc_client_free(cl);
}

int main(void)
{
    const char *e = getenv("BENCH_SECONDS");
    unsigned secs = e != NULL && atoi(e) > 0 ? (unsigned)atoi(e) : 5;
    struct tc c;
    tc_start(&c, 3, NULL);
    if (tc_wait_leader(&c, 10000) < 0) {
        fprintf(stderr, "bench_cluster: no leader\n");
        tc_destroy(&c);
        return 1;
    }
    double fsyncs = fdatasync_rate(c.dir, 2.0);
    printf("baseline: fdatasync of 4 KiB on this disk: %.0f/s\n", fsyncs);
    struct idalloc_client *cl = tc_client(&c, 10000);
    unsigned levels[] = {1, 16, 64, 256};
    for (int i = 0; i < 4; i++) {
        load(cl, IDA_BENCH_ALLOC, "ab", levels[i], secs);
    }
    printf(
        "(divide ops_per_s by the fdatasync rate above: allocs per "
        "fsync-time; > 1 only thanks to group commit)\n");
    load(cl, IDA_BENCH_NEXT, "ns", 1, secs);
    load(cl, IDA_BENCH_NEXT, "ns", 4, secs);
    if (idalloc_pool_create(cl, "kb", IDALLOC_POOL_BOUNDED, 1u << 30, NULL,
                            tc_detail()) != 0) {
        printf("cannot create pool kb: %s\n", tc_errmsg());
    }
    idalloc_client_free(cl);
    leader_kills(&c, 20);
    tc_destroy(&c);
    return 0;
}
