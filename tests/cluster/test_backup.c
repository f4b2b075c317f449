/* Backup and restore with real processes: `idalloc snapshot save` under
 * load, `idalloc snapshot restore` into a new 3-node cluster with another
 * name: every allocation acknowledged before the save is there with its id,
 * --advance-sequences puts every sequence past what the old cluster handed
 * out, and nothing of the old cluster gets in: the same backup into the old
 * cluster, a second restore, damaged files and an old node's directory are
 * refused, changing nothing. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/client/snapshot.h"
#include "tests/lib/harness.h"

#define TAGS_MAX 100000

static struct tc a, b;
static char out[1 << 16];

static void teardown(void)
{
    tc_destroy(&a);
    tc_destroy(&b);
}

/* The load: tagged allocs and reserves on cluster a, each acknowledged one
 * recorded. */
struct load
{
    atomic_int stop;
    atomic_uint n_tags; /* tags t0 .. t(n-1) acknowledged, in order */
    uint64_t ids[TAGS_MAX];
    atomic_uint_fast64_t seq_max; /* highest sequence id acknowledged */
};

static struct load L;

static void *load_main(void *arg)
{
    (void)arg;
    struct idalloc_client *cl = tc_client(&a, 10000);
    for (unsigned i = 0; !atomic_load(&L.stop) && i < TAGS_MAX; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "t%u", i);
        uint64_t id, first;
        int rv = idalloc_alloc(cl, "b", tag, &id, NULL, tc_detail());
        if (rv != 0) {
            break; /* unknown outcome: stop counting here */
        }
        L.ids[i] = id;
        atomic_store(&L.n_tags, i + 1);
        if (idalloc_reserve(cl, "s", 10, &first, tc_detail()) == 0) {
            atomic_store(&L.seq_max, first + 9);
        }
    }
    idalloc_client_free(cl);
    return NULL;
}

static int cli(const char *cluster_addrs, const char *args)
{
    return tc_run(out, sizeof(out), "%s --cluster %s --timeout 20000 %s 2>&1",
                  tc_bin("idalloc"), cluster_addrs, args);
}

static void rename_cluster(struct tc *c, void *name)
{
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "sed -i 's/^cluster test$/cluster %s/' %s",
             (const char *)name, c->conf);
    cr_assert_eq(system(cmd), 0);
}

/* A cluster of 3 under the name @name (the harness names its clusters
 * "test"). */
static void start_named(struct tc *c, const char *name)
{
    tc_start_edited(c, 3, NULL, rename_cluster, (void *)name);
    cr_assert_geq(tc_wait_leader(c, 20000), 0, "no leader in %s", name);
}

Test(backup,
     saved_under_load_restored_into_a_new_cluster,
     .fini = teardown,
     .timeout = 300)
{
    start_named(&a, "test");
    cr_assert_eq(cli(a.addrs, "pool create b --kind bounded --size 1000000"), 0,
                 "%s", out);
    cr_assert_eq(cli(a.addrs, "pool create s --kind sequence"), 0, "%s", out);
    cr_assert_eq(cli(a.addrs, "pool create p --kind prefix"), 0, "%s", out);
    cr_assert_eq(cli(a.addrs, "prefix p --tag before"), 0, "%s", out);

    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, load_main, NULL), 0);
    while (atomic_load(&L.n_tags) < 200) {
        tc_sleep_ms(20);
    }
    /* Everything acknowledged before the save starts must be in it. */
    unsigned acked_before = atomic_load(&L.n_tags);
    uint64_t seq_before = atomic_load(&L.seq_max);
    char file[400];
    snprintf(file, sizeof(file), "%s/backup.ida", a.dir);
    char args[2048];
    snprintf(args, sizeof(args), "snapshot save %s", file);
    cr_assert_eq(cli(a.addrs, args), 0, "%s", out);
    cr_assert(strstr(out, "saved ") != NULL && strstr(out, "cluster=test"),
              "%s", out);
    while (atomic_load(&L.n_tags) < acked_before + 100) {
        tc_sleep_ms(20); /* the load goes on after the backup */
    }
    atomic_store(&L.stop, 1);
    pthread_join(t, NULL);
    unsigned acked = atomic_load(&L.n_tags);
    uint64_t seq_max = atomic_load(&L.seq_max);
    cr_assert_gt(seq_max, seq_before);

    /* The old cluster refuses its own backup: a restore makes a new one. */
    snprintf(args, sizeof(args), "snapshot restore %s", file);
    cr_assert_eq(cli(a.addrs, args), 2, "%s", out);
    cr_assert(strstr(out, "taken from this cluster") != NULL, "%s", out);

    start_named(&b, "test-restored");
    /* Damaged and foreign files: one line, nothing sent. */
    char bad[400];
    snprintf(bad, sizeof(bad), "%s/bad.ida", a.dir);
    snprintf(args, sizeof(args),
             "cp %s %s && printf 'X' | dd of=%s bs=1 seek=40 conv=notrunc "
             "2>/dev/null",
             file, bad, bad);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof(args), "snapshot restore %s", bad);
    cr_assert_eq(cli(b.addrs, args), 2, "%s", out);
    cr_assert(strstr(out, "checksum mismatch") != NULL, "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    snprintf(args, sizeof(args), "snapshot restore %s", a.conf);
    cr_assert_eq(cli(b.addrs, args), 2, "%s", out);
    cr_assert(strstr(out, "not an idalloc backup file") != NULL, "%s", out);
    cr_assert_eq(cli(b.addrs, "list b"), 1, "no pool yet: %s", out);

    /* The restore, with sequences moved well past the load's reserves. */
    snprintf(args, sizeof(args),
             "snapshot restore %s --advance-sequences 10000000", file);
    cr_assert_eq(cli(b.addrs, args), 0, "%s", out);
    cr_assert(strstr(out, "restored 3 pool(s) of cluster test") != NULL, "%s",
              out);

    struct idalloc_client *cl = tc_client(&b, 20000);
    for (unsigned i = 0; i < acked_before; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "t%u", i);
        uint64_t id;
        cr_assert_eq(idalloc_lookup(cl, "b", tag, &id, tc_detail()), 0,
                     "%s lost: %s", tag, tc_errmsg());
        cr_assert_eq(id, L.ids[i], "%s: %llu, was %llu", tag,
                     (unsigned long long)id, (unsigned long long)L.ids[i]);
    }
    /* The backup is one state at one index: the holdings are exactly tags
     * t0 .. t(k-1) for some k between what was acknowledged before the save
     * and what was at its end, each with the id it had. */
    size_t total = 0;
    int more = 1, has_after = 0;
    uint64_t after = 0;
    while (more) {
        struct idalloc_holding *h;
        size_t n;
        cr_assert_eq(idalloc_list(cl, "b", has_after, after, 0, &h, &n, &more,
                                  tc_detail()),
                     0);
        for (size_t i = 0; i < n; i++) {
            unsigned k = (unsigned)strtoul(h[i].tag + 1, NULL, 10);
            cr_assert(k < acked, "%s", h[i].tag);
            cr_assert_eq(h[i].id, L.ids[k], "%s", h[i].tag);
        }
        total += n;
        if (n > 0) {
            after = h[n - 1].id;
            has_after = 1;
        } else {
            more = 0;
        }
        idalloc_holdings_free(h, n);
    }
    cr_assert_geq(total, acked_before);
    cr_assert_lt(total, acked);
    uint64_t first;
    cr_assert_eq(idalloc_reserve(cl, "s", 1, &first, tc_detail()), 0);
    cr_assert_gt(first, seq_max,
                 "reserve gave %llu, the old cluster handed "
                 "out up to %llu",
                 (unsigned long long)first, (unsigned long long)seq_max);
    cr_assert_gt(first, 10000000);
    uint8_t px[9];
    size_t plen;
    int existed = 0;
    cr_assert_eq(
        idalloc_prefix(cl, "p", "before", px, &plen, &existed, tc_detail()), 0);
    cr_assert(existed, "the prefix of \"before\" was restored");
    idalloc_client_free(cl);
    cr_assert_lt(acked_before, acked);

    /* A second restore is refused: the cluster has pools now. */
    snprintf(args, sizeof(args), "snapshot restore %s", file);
    cr_assert_eq(cli(b.addrs, args), 1, "%s", out);
    cr_assert(strstr(out, "restore needs a cluster without pools") != NULL,
              "%s", out);

    /* A node of the old cluster cannot run in the new one: its directory
     * belongs to cluster "test". */
    tc_signal(&a, 0, SIGKILL);
    char conf[400];
    snprintf(conf, sizeof(conf), "%s/old-node.conf", b.dir);
    snprintf(args, sizeof(args),
             "sed 's#^data_dir .*#data_dir %s/data#' %s > %s", a.dir, b.conf,
             conf);
    cr_assert_eq(system(args), 0);
    int rv = tc_run(out, sizeof(out), "%s --config %s --node 1 2>&1",
                    tc_bin("idallocd"), conf);
    cr_assert_eq(rv, 1, "exit %d: %s", rv, out);
    cr_assert(strstr(out, "cluster") != NULL, "%s", out);
}

/* Fill: FILL_THREADS threads, each @per tagged allocs with 120-byte tags. */
enum { FILL_THREADS = 8 };
struct filler
{
    int t;
    int per;
    int failed;
};

static void *fill_main(void *arg)
{
    struct filler *f = arg;
    struct idalloc_client *cl = tc_client(&a, 20000);
    for (int i = 0; i < f->per && !f->failed; i++) {
        char tag[128];
        snprintf(tag, sizeof(tag), "%0110d-%03d-%05d", 0, f->t, i);
        uint64_t id;
        f->failed = idalloc_alloc(cl, "big", tag, &id, NULL, tc_detail()) != 0;
    }
    idalloc_client_free(cl);
    return NULL;
}

/* A backup through the C API with a @attempt_ms attempt timeout. */
struct saver
{
    unsigned attempt_ms;
    int rv;
    size_t len;
    char err[IDALLOC_ERRMSG_MAX];
};

static void *save_main(void *arg)
{
    struct saver *sv = arg;
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = a.addrs;
    o.attempt_timeout_ms = sv->attempt_ms;
    o.call_timeout_ms = 60000;
    struct idalloc_client *cl;
    sv->rv = idalloc_client_new(&o, &cl, sv->err);
    if (sv->rv != 0) {
        return NULL;
    }
    struct idalloc_call call;
    idalloc_call_init(&call);
    struct ida_backup bk;
    sv->rv = ida_client_snapshot_read(cl, &bk, &call);
    snprintf(sv->err, sizeof(sv->err), "%s", call.errmsg);
    if (sv->rv == 0) {
        sv->len = bk.state_len;
        ida_backup_free(&bk);
    }
    idalloc_client_free(cl);
    return NULL;
}

/* Cluster a with the bounded pool "big" holding FILL_THREADS x @per
 * allocations of 120-byte tags. */
static void start_filled(int per)
{
    start_named(&a, "test");
    cr_assert_eq(cli(a.addrs, "pool create big --kind bounded --size 1000000"),
                 0, "%s", out);
    struct filler f[FILL_THREADS];
    pthread_t t[FILL_THREADS];
    for (int i = 0; i < FILL_THREADS; i++) {
        f[i] = (struct filler){i, per, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, fill_main, &f[i]), 0);
    }
    for (int i = 0; i < FILL_THREADS; i++) {
        pthread_join(t[i], NULL);
        cr_assert(!f[i].failed, "thread %d: an alloc failed", i);
    }
}

static unsigned long copies_made(void)
{
    char log[8192];
    tc_run(log, sizeof(log), "cat %s/node*.log | grep -c 'backup copy'", a.dir);
    return strtoul(log, NULL, 10);
}

Test(backup,
     a_state_of_several_chunks_comes_whole,
     .fini = teardown,
     .timeout = 300)
{
    enum { PER = 1250 }; /* 10,000 x ~130 bytes: > 1 MiB */
    start_filled(PER);
    char file[400], args[2048];
    snprintf(file, sizeof(file), "%s/big.ida", a.dir);
    snprintf(args, sizeof(args), "snapshot save %s", file);
    cr_assert_eq(cli(a.addrs, args), 0, "%s", out);
    const char *bytes = strstr(out, "bytes=");
    cr_assert_not_null(bytes, "%s", out);
    cr_assert_gt(strtoull(bytes + 6, NULL, 10), 1u << 20,
                 "not several chunks: %s", out);

    start_named(&b, "test-big");
    snprintf(args, sizeof(args), "snapshot restore %s", file);
    cr_assert_eq(cli(b.addrs, args), 0, "%s", out);
    /* Every holding, in id order, with its tag. */
    struct idalloc_client *cl = tc_client(&b, 20000);
    struct idalloc_client *ca = tc_client(&a, 20000);
    size_t total = 0;
    int more = 1, has_after = 0;
    uint64_t after = 0;
    while (more) {
        struct idalloc_holding *h;
        size_t n;
        cr_assert_eq(idalloc_list(cl, "big", has_after, after, 0, &h, &n, &more,
                                  tc_detail()),
                     0);
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq(h[i].id, total + i, "ids 0..N-1 in order");
            if ((total + i) % 997 == 0) {
                uint64_t id;
                cr_assert_eq(
                    idalloc_lookup(ca, "big", h[i].tag, &id, tc_detail()), 0);
                cr_assert_eq(id, h[i].id, "%s", h[i].tag);
            }
        }
        total += n;
        if (n > 0) {
            after = h[n - 1].id;
            has_after = 1;
        } else {
            more = 0;
        }
        idalloc_holdings_free(h, n);
    }
    cr_assert_eq(total, FILL_THREADS * PER);
    idalloc_client_free(cl);
    idalloc_client_free(ca);
}

/* A copy of the state that takes longer than the client's attempt timeout
 * is still answered: the client repeats the first chunk's call (same id and
 * seq) on every expiry, and each repeat must wait for the copy being made
 * (or take it, once made) instead of starting another. Here the attempt
 * timeout is 3 ms, and a copy (a child process, picked up on the fsm
 * processor's next 10 ms ping) takes longer than that: a node that starts
 * over on each repeat makes a copy per repeat, or never answers. The state
 * (4,000 allocations) fits one chunk, so the repeats are of the first. */
Test(backup,
     a_copy_slower_than_the_attempt_timeout_is_answered,
     .fini = teardown,
     .timeout = 300)
{
    start_filled(500);
    struct saver sv = {.attempt_ms = 3};
    save_main(&sv);
    cr_assert_eq(sv.rv, 0, "%s: %s", idalloc_strerror(sv.rv), sv.err);
    cr_assert_gt(sv.len, 4000u * 120, "4,000 x 120-byte tags");
    cr_assert_eq(copies_made(), 1, "each repeat made a copy of its own");
}

/* Two backups at once both finish (a node that cancelled one copy for the
 * other's had the two cancel each other until both timed out), from as few
 * copies as their ReadIndexes allow. */
Test(backup, two_backups_at_once_both_finish, .fini = teardown, .timeout = 300)
{
    start_filled(500);
    struct saver sv[2] = {{.attempt_ms = 3}, {.attempt_ms = 3}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(pthread_create(&t[i], NULL, save_main, &sv[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(sv[i].rv, 0, "backup %d: %s: %s", i,
                     idalloc_strerror(sv[i].rv), sv[i].err);
        cr_assert_gt(sv[i].len, 4000u * 120);
    }
    cr_assert_leq(copies_made(), 2);
}
