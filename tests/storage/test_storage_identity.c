/* storage/: the incarnation id, the IDENTITY file, lost state (an emptied,
 * deleted or replaced data.mdb), the upgrade from format 1, and the checks
 * of data.mdb before LMDB maps it (truncated or damaged files): its meta
 * pages, and the walk of its trees when it ends short of its last page. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#include "tests/storage/fixture.h"

TestSuite(identity, .init = setup, .fini = teardown);

/* --- helpers --- */

static void path_in(char *out, size_t cap, const char *d, const char *name)
{
    snprintf(out, cap, "%s/%s", d, name);
}

static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

/* A hash of every file's name, size and content in @d except lock.mdb
 * (LMDB's reader table, which any open of the environment touches). */
static uint64_t hash_dir(const char *d)
{
    DIR *dp = opendir(d);
    cr_assert_not_null(dp);
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, "lock.mdb") == 0) {
            continue;
        }
        char p[600];
        path_in(p, sizeof(p), d, de->d_name);
        uint64_t h =
            fnv(14695981039346656037ull, de->d_name, strlen(de->d_name));
        FILE *f = fopen(p, "rb");
        cr_assert_not_null(f, "%s", p);
        uint8_t buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
            h = fnv(h, buf, n);
        }
        fclose(f);
        sum += h; /* order independent */
    }
    closedir(dp);
    return sum;
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    FILE *out = fopen(to, "wb");
    cr_assert(in != NULL && out != NULL, "%s -> %s", from, to);
    uint8_t buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
        cr_assert_eq(fwrite(buf, 1, n, out), n);
    }
    fclose(in);
    cr_assert_eq(fclose(out), 0);
}

static off_t file_size(const char *p)
{
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0, "%s", p);
    return sb.st_size;
}

static void data_path(char *out, size_t cap)
{
    path_in(out, cap, dir, "data.mdb");
}

/* Open @d with @o in a forked child; returns the code it reported (-1 when
 * it died without reporting, e.g. by SIGBUS) and its message in @msg. */
static int open_in_child(const char *d,
                         const struct ida_storage_opts *o,
                         char *msg,
                         size_t cap)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        struct ida_storage s;
        int rv = ida_storage_open(&s, d, o);
        unsigned char c = (unsigned char)rv;
        if (write(fds[1], &c, 1) != 1 ||
            write(fds[1], s.errmsg, strlen(s.errmsg)) < 0) {
            _exit(1);
        }
        close(fds[1]);
        raise(SIGKILL); /* see child_finish() in fixture.h */
        _exit(1);
    }
    close(fds[1]);
    unsigned char c;
    ssize_t n = read(fds[0], &c, 1);
    size_t got = 0;
    if (n == 1) {
        ssize_t m;
        while (got + 1 < cap &&
               (m = read(fds[0], msg + got, cap - 1 - got)) > 0) {
            got += (size_t)m;
        }
    }
    msg[got] = '\0';
    close(fds[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "the child must end by its own SIGKILL, not by signal %d",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return n == 1 ? c : -1;
}

/* A node with some history: entries, a hard state, a snapshot. */
static uint64_t make_node(void)
{
    open_ok();
    append(1, 50, 1);
    set_hs(2, 1, 40);
    uint64_t inc = ida_storage_incarnation(&st);
    close_st();
    return inc;
}

static void expect_lost(const char *what, uint64_t inc)
{
    expect_msg(what);
    char want[128];
    snprintf(want, sizeof(want),
             "initialized as node 1 incarnation %016llx of cluster \"test\"",
             (unsigned long long)inc);
    expect_msg(want);
    expect_msg(
        "must not rejoin as its old self; remove the directory to "
        "rejoin as a new incarnation");
}

/* --- incarnation --- */

Test(identity, a_new_directory_mints_a_nonzero_incarnation_kept_on_reopen)
{
    open_ok();
    uint64_t inc = ida_storage_incarnation(&st);
    cr_assert_neq(inc, 0);
    cr_assert_eq(st.identity.incarnation, inc);
    cr_assert_eq(st.identity.created, 1);
    cr_assert_eq(st.identity.upgraded_from, 0);
    cr_assert_eq(st.identity.node_id, 1);
    cr_assert_str_eq(st.identity.cluster, "test");
    cr_assert_gt(st.identity.created_at_ms, 1600000000000ull, "unix ms");
    uint64_t created = st.identity.created_at_ms;
    char p[600];
    path_in(p, sizeof(p), dir, IDA_STORAGE_IDENTITY_FILE);
    cr_assert_eq(file_size(p), IDA__REC_IDFILE_FIXED + 4, "IDENTITY written");
    path_in(p, sizeof(p), dir, IDA_STORAGE_IDENTITY_TMP);
    cr_assert_neq(access(p, F_OK), 0, "no temporary file left");
    append(1, 3, 1);
    reopen();
    cr_assert_eq(ida_storage_incarnation(&st), inc);
    cr_assert_eq(st.identity.created_at_ms, created);
    cr_assert_eq(st.identity.created, 0);
    expect_entries(1, 3, 1);

    /* Another directory: another incarnation. */
    close_st();
    char dir2[400];
    snprintf(dir2, sizeof(dir2), "%s/data/node1b", tmp);
    struct ida_storage s2;
    cr_assert_eq(ida_storage_open(&s2, dir2, &opts), 0, "%s", s2.errmsg);
    cr_assert_neq(ida_storage_incarnation(&s2), 0);
    cr_assert_neq(ida_storage_incarnation(&s2), inc);
    ida_storage_close(&s2);
}

Test(identity, identity_file_lost_after_the_first_commit_is_rewritten)
{
    /* A first start killed between its first commit and writing IDENTITY. */
    uint64_t inc = make_node();
    char p[600];
    path_in(p, sizeof(p), dir, IDA_STORAGE_IDENTITY_FILE);
    cr_assert_eq(unlink(p), 0);
    open_ok();
    cr_assert_eq(ida_storage_incarnation(&st), inc);
    cr_assert_eq(access(p, F_OK), 0, "IDENTITY written again");
    expect_entries(1, 50, 1);
}

/* --- lost state --- */

Test(identity, an_emptied_data_mdb_is_refused_and_nothing_changes)
{
    uint64_t inc = make_node();
    char p[600];
    data_path(p, sizeof(p));
    cr_assert_eq(truncate(p, 0), 0);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE, "%s",
                 st.errmsg);
    expect_lost("its database (data.mdb) is empty", inc);
    cr_assert_eq(hash_dir(dir), before, "nothing written");
    cr_assert_eq(file_size(p), 0);
    cr_assert_eq(idalloc_errclass(IDA_ELOSTSTATE), IDA_ERR_CLASS_INTERNAL);
    cr_assert_str_eq(idalloc_strerror(IDA_ELOSTSTATE),
                     "data directory lost its state");
}

Test(identity, a_deleted_data_mdb_is_refused_and_not_recreated)
{
    uint64_t inc = make_node();
    char p[600], lock[600];
    data_path(p, sizeof(p));
    path_in(lock, sizeof(lock), dir, "lock.mdb");
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(access(lock, F_OK), 0, "lock.mdb stays");
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE, "%s",
                 st.errmsg);
    expect_lost("its database (data.mdb) is missing", inc);
    cr_assert_neq(access(p, F_OK), 0, "data.mdb not recreated");
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

/* Put @from's data.mdb in place of the fixture node's. */
static void replace_data_with(const char *from)
{
    char src[600], dst[600];
    path_in(src, sizeof(src), from, "data.mdb");
    data_path(dst, sizeof(dst));
    copy_file(src, dst);
}

Test(identity, another_nodes_data_mdb_of_the_same_cluster_is_refused)
{
    uint64_t inc = make_node();
    char other[400];
    snprintf(other, sizeof(other), "%s/data/node2", tmp);
    struct ida_storage s2;
    struct ida_storage_opts o2 = opts;
    o2.node_id = 2;
    cr_assert_eq(ida_storage_open(&s2, other, &o2), 0, "%s", s2.errmsg);
    uint64_t inc2 = ida_storage_incarnation(&s2);
    ida_storage_close(&s2);
    replace_data_with(other);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE, "%s",
                 st.errmsg);
    char what[160];
    snprintf(what, sizeof(what),
             "its database was replaced (it holds node 2 incarnation %016llx "
             "of cluster \"test\")",
             (unsigned long long)inc2);
    expect_lost(what, inc);
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

Test(identity, an_earlier_incarnation_of_the_same_node_is_refused)
{
    /* Node 1's directory re-created (a new incarnation), then the data.mdb
     * of the old one put back. */
    char old[400];
    snprintf(old, sizeof(old), "%s/data/old1", tmp);
    struct ida_storage s2;
    cr_assert_eq(ida_storage_open(&s2, old, &opts), 0, "%s", s2.errmsg);
    uint64_t old_inc = ida_storage_incarnation(&s2);
    ida_storage_close(&s2);
    uint64_t inc = make_node();
    replace_data_with(old);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE, "%s",
                 st.errmsg);
    char what[160];
    snprintf(what, sizeof(what), "holds node 1 incarnation %016llx",
             (unsigned long long)old_inc);
    expect_lost(what, inc);
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

Test(identity, a_data_mdb_replaced_by_a_new_empty_environment_is_refused)
{
    uint64_t inc = make_node();
    char p[600], lock[600];
    data_path(p, sizeof(p));
    path_in(lock, sizeof(lock), dir, "lock.mdb");
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(unlink(lock), 0);
    MDB_env *env; /* what LMDB leaves after creating an environment */
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_open(env, dir, 0, 0644), 0);
    mdb_env_close(env);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE, "%s",
                 st.errmsg);
    expect_lost("its database is empty", inc);
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

/* --- the IDENTITY file itself --- */

Test(identity, a_damaged_identity_file_is_refused)
{
    make_node();
    char p[600];
    path_in(p, sizeof(p), dir, IDA_STORAGE_IDENTITY_FILE);
    int fd = open(p, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, 13), 1);
    b ^= 0x10; /* a bit of the incarnation */
    cr_assert_eq(pwrite(fd, &b, 1, 13), 1);
    close(fd);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT, "%s",
                 st.errmsg);
    expect_msg("IDENTITY is damaged");
    cr_assert_eq(hash_dir(dir), before, "nothing written");

    cr_assert_eq(truncate(p, 10), 0);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT, "%s",
                 st.errmsg);
    expect_msg("IDENTITY is damaged (10 bytes");
}

Test(identity, another_nodes_identity_file_is_refused)
{
    make_node();
    char other[400], src[600], dst[600];
    snprintf(other, sizeof(other), "%s/data/node2", tmp);
    struct ida_storage s2;
    struct ida_storage_opts o2 = opts;
    o2.node_id = 2;
    cr_assert_eq(ida_storage_open(&s2, other, &o2), 0, "%s", s2.errmsg);
    ida_storage_close(&s2);
    path_in(src, sizeof(src), other, IDA_STORAGE_IDENTITY_FILE);
    path_in(dst, sizeof(dst), dir, IDA_STORAGE_IDENTITY_FILE);
    copy_file(src, dst);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN, "%s",
                 st.errmsg);
    expect_msg("belongs to node 2, not node 1 (IDENTITY)");
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

/* --- upgrade from format 1 --- */

/* Create a format-1 directory as the format-1 code did: format 1, the
 * format-1 identity record, a hard state, log_prev, empty log and snap. */
static void make_v1_dir(const char *d)
{
    char sub[400];
    snprintf(sub, sizeof(sub), "%s/data", tmp);
    mkdir(sub, 0755);
    cr_assert_eq(mkdir(d, 0755), 0);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi meta, log, snap;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 4);
    cr_assert_eq(mdb_env_open(env, d, MDB_NOTLS, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", MDB_CREATE, &meta), 0);
    cr_assert_eq(mdb_dbi_open(txn, "log", MDB_CREATE, &log), 0);
    cr_assert_eq(mdb_dbi_open(txn, "snap", MDB_CREATE, &snap), 0);
    uint8_t fmt[IDA__REC_FORMAT_BYTES], id[IDA__REC_IDENTITY_FIXED + 8];
    uint8_t hs[IDA__REC_HARD_STATE_BYTES], prev[IDA__REC_LOG_PREV_BYTES];
    ida__rec_format_encode(fmt, 1);
    size_t idn = ida__rec_identity_encode(id, 1, "test", 4);
    struct ida_hard_state h = {3, 1, 0};
    ida__rec_hard_state_encode(hs, &h);
    ida__rec_log_prev_encode(prev, 0, 0);
    struct
    {
        const char *k;
        void *v;
        size_t n;
    } recs[] = {{"format", fmt, sizeof(fmt)},
                {"identity", id, idn},
                {"hard_state", hs, sizeof(hs)},
                {"log_prev", prev, sizeof(prev)}};
    for (size_t i = 0; i < 4; i++) {
        MDB_val k = {strlen(recs[i].k), (void *)recs[i].k};
        MDB_val v = {recs[i].n, recs[i].v};
        cr_assert_eq(mdb_put(txn, meta, &k, &v, 0), 0);
    }
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

Test(identity, a_format_1_directory_is_upgraded_with_an_incarnation)
{
    make_v1_dir(dir);
    open_ok();
    uint64_t inc = ida_storage_incarnation(&st);
    cr_assert_neq(inc, 0);
    cr_assert_eq(st.identity.upgraded_from, 1);
    cr_assert_eq(st.identity.created, 0);
    struct ida_hard_state hs;
    cr_assert_eq(ida_storage_hard_state(&st, &hs), 0);
    cr_assert_eq(hs.term, 3, "the old state is kept");
    cr_assert_eq(hs.vote, 1);
    append(1, 5, 3);
    close_st();

    uint8_t back[128];
    uint32_t version;
    size_t n = peek(dir, "meta", "format", 6, back, sizeof(back));
    cr_assert_eq(ida__rec_format_decode(back, n, &version), 0);
    cr_assert_eq(version, IDA_STORAGE_FORMAT_VERSION, "straight to the latest");
    n = peek(dir, "meta", "identity", 8, back, sizeof(back));
    struct ida__rec_identity r;
    cr_assert_eq(ida__rec_identity2_decode(back, n, &r), 0);
    cr_assert_eq(r.incarnation, inc);
    cr_assert_eq(r.node_id, 1);

    char p[600];
    path_in(p, sizeof(p), dir, IDA_STORAGE_IDENTITY_FILE);
    cr_assert_eq(access(p, F_OK), 0, "IDENTITY written by the upgrade");
    open_ok();
    cr_assert_eq(ida_storage_incarnation(&st), inc);
    cr_assert_eq(st.identity.upgraded_from, 0);
    expect_entries(1, 5, 3);
}

Test(identity, a_format_1_database_under_an_identity_file_is_refused)
{
    uint64_t inc = make_node();
    char v1[400];
    snprintf(v1, sizeof(v1), "%s/data/v1", tmp);
    make_v1_dir(v1);
    replace_data_with(v1);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE, "%s",
                 st.errmsg);
    expect_lost("was replaced by a format-1 database", inc);
}

/* --- a damaged data.mdb --- */

/* The page size LMDB recorded (meta page 0's mm_psize, at byte 40). */
static uint32_t page_size(const char *p)
{
    int fd = open(p, O_RDONLY);
    uint8_t b[4];
    cr_assert_eq(pread(fd, b, 4, 40), 4);
    close(fd);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
           (uint32_t)b[3] << 24;
}

static uint64_t get_le64(int fd, off_t off)
{
    uint8_t b[8];
    cr_assert_eq(pread(fd, b, 8, off), 8);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | b[i];
    }
    return v;
}

static void put_le64(int fd, off_t off, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
    cr_assert_eq(pwrite(fd, b, 8, off), 8);
}

/* Offset in data.mdb (open as @fd, pages of @psize bytes) of the newer
 * meta page (@newer) or the older one: LMDB opens the higher txnid. */
static off_t meta_offset(int fd, uint32_t psize, int newer)
{
    uint64_t t0 = get_le64(fd, 144), t1 = get_le64(fd, (off_t)psize + 144);
    return (t0 < t1) == (newer != 0) ? (off_t)psize : 0;
}

static void expect_corrupt_in_child(off_t size, const char *what)
{
    char p[600], msg[IDA_STORAGE_ERRMSG_MAX + 1];
    data_path(p, sizeof(p));
    cr_assert_eq(truncate(p, size), 0);
    uint64_t before = hash_dir(dir);
    int rv = open_in_child(dir, &opts, msg, sizeof(msg));
    cr_assert_eq(rv, IDA_ECORRUPT, "size %lld: %s (%s)", (long long)size,
                 rv < 0 ? "no answer" : idalloc_errname(rv), msg);
    cr_assert(strstr(msg, what) != NULL, "\"%s\" lacks \"%s\"", msg, what);
    cr_assert(strstr(msg, "data.mdb") != NULL, "%s", msg);
    cr_assert_null(strchr(msg, '\n'));
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

Test(identity, a_truncated_data_mdb_is_corrupt_not_a_signal)
{
    open_ok();
    save_snapshot(1, 1, 200 * 1024); /* pages of chunks */
    close_st();
    char p[600];
    data_path(p, sizeof(p));
    off_t size = file_size(p);
    uint32_t psize = page_size(p);
    cr_assert_gt(size, 20 * (off_t)psize, "a file of many pages");
    off_t half = size / 2 / psize * psize;
    expect_corrupt_in_child(half, "(truncated?)");
    expect_corrupt_in_child(half - 100, "not a whole number");
    expect_corrupt_in_child(psize, "not a whole number (at least 2)");
    expect_corrupt_in_child(100, "shorter than one LMDB meta page");
}

/* One random transaction of puts and deletes in database "scratch" of
 * @env: values up to 300 bytes, and one in @big_every of 9,000 (an overflow
 * run of three pages). */
static void scratch_txn(MDB_env *env, unsigned *seed, int big_every)
{
    MDB_txn *t;
    MDB_dbi d;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &t), 0);
    cr_assert_eq(mdb_dbi_open(t, "scratch", MDB_CREATE, &d), 0);
    char k[16];
    static char v[9000];
    memset(v, 'x', sizeof(v));
    int n = rand_r(seed) % 300, base = rand_r(seed) % 100000;
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "%08d", base + i);
        size_t len = rand_r(seed) % big_every == 0
                         ? sizeof(v)
                         : (size_t)(rand_r(seed) % 300);
        MDB_val kk = {8, k}, vv = {len, v};
        cr_assert_eq(mdb_put(t, d, &kk, &vv, 0), 0);
    }
    int m = rand_r(seed) % 300, gone = rand_r(seed) % 100000;
    for (int i = 0; i < m; i++) {
        snprintf(k, sizeof(k), "%08d", gone + i);
        MDB_val kk = {8, k};
        (void)mdb_del(t, d, &kk, NULL);
    }
    if (rand_r(seed) % 2) {
        for (int i = 0; i < n; i++) {
            snprintf(k, sizeof(k), "%08d", base + i);
            MDB_val kk = {8, k};
            (void)mdb_del(t, d, &kk, NULL);
        }
    }
    cr_assert_eq(mdb_txn_commit(t), 0);
}

static MDB_env *plain_env(void)
{
    MDB_env *env;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 16), 0);
    cr_assert_eq(mdb_env_set_mapsize(env, 1u << 30), 0);
    cr_assert_eq(mdb_env_open(env, dir, MDB_NOTLS, 0644), 0);
    return env;
}

/* Does @env's last page lie past the end of data.mdb? */
static int ends_short(MDB_env *env)
{
    char p[600];
    data_path(p, sizeof(p));
    MDB_envinfo in;
    MDB_stat ms;
    cr_assert_eq(mdb_env_info(env, &in), 0);
    cr_assert_eq(mdb_env_stat(env, &ms), 0);
    return (off_t)(in.me_last_pgno + 1) * (off_t)ms.ms_psize > file_size(p);
}

/* scratch_txn() at least @min_rounds times, until @env's file ends short
 * of its last page. */
static void scratch_until_short(MDB_env *env,
                                unsigned *seed,
                                int big_every,
                                int min_rounds)
{
    int rounds = 0;
    do {
        scratch_txn(env, seed, big_every);
        rounds++;
    } while ((rounds < min_rounds || !ends_short(env)) && rounds < 40000);
    cr_assert(ends_short(env), "LMDB never left its last page past the end");
}

/* LMDB does not write a page allocated and freed by one transaction
 * (P_LOOSE), so the last page a meta page names may lie past the end of a
 * file committed cleanly: random puts and deletes, in a sub-database of
 * their own, until LMDB leaves a file so (a node stopped cleanly was
 * refused as truncated once, in test_catchup). Such a file opens, with
 * what it held, each of 8 times: open then walks the file's trees
 * (storage/pages.c) and must find every page they use. */
Test(identity, a_last_page_past_the_end_of_the_file_is_not_truncation)
{
    open_ok();
    append(1, 50, 2);
    close_st();
    MDB_env *env = plain_env();
    unsigned seed = 1;
    int found = 0;
    for (int round = 0; round < 40000 && found < 8; round++) {
        scratch_txn(env, &seed, 50);
        if (ends_short(env)) {
            found++;
            mdb_env_close(env);
            char msg[IDA_STORAGE_ERRMSG_MAX + 1];
            int rv = open_in_child(dir, &opts, msg, sizeof(msg));
            cr_assert_eq(rv, 0, "short file %d, round %d: %s (%s)", found,
                         round, rv < 0 ? "no answer" : idalloc_errname(rv),
                         msg);
            env = plain_env();
        }
    }
    mdb_env_close(env);
    cr_assert_eq(found, 8,
                 "LMDB left its last page past the end of the "
                 "file only %d times",
                 found);
    open_ok();
    expect_entries(1, 50, 2);
}

/* A data.mdb that ends short of its last page (so that open walks its
 * trees), with a scratch database; returns the main database's root. */
static uint64_t short_file_with_scratch(uint32_t *psize)
{
    open_ok();
    append(1, 50, 2);
    close_st();
    MDB_env *env = plain_env();
    unsigned seed = 3;
    scratch_until_short(env, &seed, 50, 1);
    mdb_env_close(env);
    char p[600];
    data_path(p, sizeof(p));
    *psize = page_size(p);
    int fd = open(p, O_RDONLY);
    uint64_t root = get_le64(fd, meta_offset(fd, *psize, 1) + 128);
    close(fd);
    return root;
}

/* Offset in data.mdb of the record of database "scratch" in the main
 * database's root page @root (a leaf: four records). */
static off_t scratch_record(int fd, uint64_t root, uint32_t psize)
{
    uint8_t page[65536];
    cr_assert_eq(pread(fd, page, psize, (off_t)(root * psize)), psize);
    cr_assert_eq(page[10] & 0x02, 0x02, "the main root is a leaf");
    for (uint32_t at = 16; at + 7 + 48 <= psize; at++) {
        if (memcmp(page + at, "scratch", 7) == 0) {
            return (off_t)(root * psize) + at + 7;
        }
    }
    cr_assert_fail("no record of database \"scratch\" in page %llu",
                   (unsigned long long)root);
    return 0;
}

/* The walk reads what the file says: a tree that loops back on itself or a
 * page with another page's number is refused with one line, and open does
 * not hang or crash. */
Test(identity, a_loop_or_a_misnumbered_page_in_the_trees_is_corrupt)
{
    uint32_t psize;
    uint64_t root = short_file_with_scratch(&psize);
    char p[600], keep[600];
    data_path(p, sizeof(p));
    snprintf(keep, sizeof(keep), "%s/whole.mdb", tmp);
    copy_file(p, keep);

    /* The scratch database's root is the main root itself. */
    int fd = open(p, O_RDWR);
    put_le64(fd, scratch_record(fd, root, psize) + 40, root);
    close(fd);
    uint64_t before = hash_dir(dir);
    char msg[IDA_STORAGE_ERRMSG_MAX + 1];
    int rv = open_in_child(dir, &opts, msg, sizeof(msg));
    cr_assert_eq(rv, IDA_ECORRUPT, "%s (%s)",
                 rv < 0 ? "no answer" : idalloc_errname(rv), msg);
    cr_assert(strstr(msg, "(a loop?)") != NULL, "%s", msg);
    cr_assert_null(strchr(msg, '\n'));
    cr_assert_eq(hash_dir(dir), before, "nothing written");

    /* The main root page carries another number. */
    copy_file(keep, p);
    fd = open(p, O_RDWR);
    put_le64(fd, (off_t)(root * psize), root + 1);
    close(fd);
    rv = open_in_child(dir, &opts, msg, sizeof(msg));
    cr_assert_eq(rv, IDA_ECORRUPT, "%s (%s)",
                 rv < 0 ? "no answer" : idalloc_errname(rv), msg);
    cr_assert(strstr(msg, "carries another page's number") != NULL, "%s", msg);
    cr_assert(strstr(msg, "in the main database") != NULL, "%s", msg);

    copy_file(keep, p);
    open_ok();
    expect_entries(1, 50, 2);
}

/* The pipe lmdb_reads_all()'s child reports on. */
static int reads_all_fd = -1;

/* The child's SIGBUS: report "died reading past the end" and end as the
 * other children do (dying of the signal would make valgrind log it). */
static void reads_all_sigbus(int sig)
{
    (void)sig;
    unsigned char c = 0;
    if (write(reads_all_fd, &c, 1) != 1) {
        _exit(1);
    }
    raise(SIGKILL);
}

/* In a child, read through LMDB itself every page data.mdb's trees use:
 * every record of the free list, the main database and each named
 * database, every byte of every value. 1 when it read them all, 0 when
 * LMDB got SIGBUS reading a page past the end of the file. */
static int lmdb_reads_all(void)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        reads_all_fd = fds[1];
        struct sigaction sa = {.sa_handler = reads_all_sigbus};
        if (sigaction(SIGBUS, &sa, NULL) != 0) {
            _exit(5);
        }
        MDB_env *env;
        MDB_txn *t;
        MDB_dbi main_dbi;
        if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 16) != 0 ||
            mdb_env_open(env, dir, MDB_RDONLY | MDB_NOTLS, 0644) != 0 ||
            mdb_txn_begin(env, NULL, MDB_RDONLY, &t) != 0 ||
            mdb_dbi_open(t, NULL, 0, &main_dbi) != 0) {
            _exit(2);
        }
        MDB_dbi dbis[18] = {0 /* LMDB's free list */, main_dbi};
        int ndbi = 2;
        volatile uint8_t sum = 0;
        for (int i = 0; i < ndbi; i++) {
            MDB_cursor *c;
            MDB_val k, v;
            if (mdb_cursor_open(t, dbis[i], &c) != 0) {
                _exit(3);
            }
            while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0) {
                for (size_t b = 0; b < v.mv_size; b++) {
                    sum += ((const uint8_t *)v.mv_data)[b];
                }
                char name[64];
                if (i == 1 && ndbi < 18 && k.mv_size < sizeof(name)) {
                    memcpy(name, k.mv_data, k.mv_size);
                    name[k.mv_size] = '\0';
                    if (mdb_dbi_open(t, name, 0, &dbis[ndbi]) == 0) {
                        ndbi++;
                    }
                }
            }
            mdb_cursor_close(c);
        }
        if (ndbi != 5) { /* free list, main, meta, snap, scratch */
            _exit(4);
        }
        unsigned char c = 1;
        if (write(fds[1], &c, 1) != 1) {
            _exit(1);
        }
        raise(SIGKILL); /* see child_finish() in fixture.h */
        _exit(1);
    }
    close(fds[1]);
    unsigned char c;
    ssize_t n = read(fds[0], &c, 1);
    close(fds[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(n == 1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "LMDB's reader ended without a report, by %s %d",
              WIFSIGNALED(status) ? "signal" : "exit code",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    return c;
}

/* What cutting data.mdb at pages [lo, hi] gave. */
struct cuts
{
    int opened, refused, above_roots, by_value, in_free_list;
};

/* The higher of the newer meta page's two roots in data.mdb at @p. */
static uint64_t roots_top(const char *p, uint32_t psize)
{
    int fd = open(p, O_RDONLY);
    off_t newer = meta_offset(fd, psize, 1);
    uint64_t r_free = get_le64(fd, newer + 80);
    uint64_t r_main = get_le64(fd, newer + 128);
    close(fd);
    return r_free == UINT64_MAX || r_main > r_free ? r_main : r_free;
}

/* Cut a copy of @keep (a data.mdb of @psize-byte pages) at each page in
 * [@lo, @hi] in turn: open must refuse it, as "(truncated?)", exactly when
 * LMDB itself reads past its end, and open it otherwise. */
static void cut_at_each(const char *keep,
                        uint32_t psize,
                        uint64_t lo,
                        uint64_t hi,
                        struct cuts *c)
{
    char p[600];
    data_path(p, sizeof(p));
    uint64_t top = roots_top(keep, psize);
    for (uint64_t cut = hi; cut >= lo; cut--) {
        copy_file(keep, p);
        cr_assert_eq(truncate(p, (off_t)(cut * psize)), 0);
        int whole = lmdb_reads_all();
        char msg[IDA_STORAGE_ERRMSG_MAX + 1];
        int rv = open_in_child(dir, &opts, msg, sizeof(msg));
        if (whole) {
            cr_assert_eq(rv, 0,
                         "cut at page %llu: LMDB reads it all, but open says "
                         "%s (%s)",
                         (unsigned long long)cut,
                         rv < 0 ? "no answer" : idalloc_errname(rv), msg);
            c->opened++;
            continue;
        }
        cr_assert_eq(rv, IDA_ECORRUPT,
                     "cut at page %llu: LMDB reads past the end, but open "
                     "says %s (%s)",
                     (unsigned long long)cut,
                     rv < 0 ? "no answer (a signal?)" : idalloc_errname(rv),
                     msg);
        cr_assert(strstr(msg, "(truncated?)") != NULL, "%s", msg);
        cr_assert_null(strchr(msg, '\n'));
        c->refused++;
        c->above_roots += cut > top;
        c->by_value += strstr(msg, "uses value pages") != NULL;
        c->in_free_list += cut > top && strstr(msg, "free list") != NULL;
    }
    copy_file(keep, p);
}

/* A file cut at a page is refused exactly when LMDB itself would read past
 * its end (and die of SIGBUS), and opens otherwise: cuts above both roots
 * included, which only the walk of the trees sees. The file holds a node's
 * databases (entries, a snapshot) and a scratch database of random
 * transactions, with values of overflow pages, and ends short of its last
 * page; each kind of page the walk checks comes to lie above both roots:
 *   1. tree pages and a value's overflow pages, after a last value of ten
 *      pages (no free run is that long, so it goes to the end);
 *   2. the free list's own pages, after a transaction frees two thirds of
 *      the scratch database (its list of freed pages takes overflow pages,
 *      written last). */
Test(identity,
     a_file_cut_at_a_page_is_refused_exactly_when_a_page_in_use_is_lost)
{
    open_ok();
    for (int i = 0; i < 8; i++) {
        append(1 + (ida_index)i * 100, 100, 1);
    }
    save_snapshot(300, 1, 300000);
    close_st();
    MDB_env *env = plain_env();
    unsigned seed = 7;
    scratch_until_short(env, &seed, 20, 100);
    MDB_txn *t;
    MDB_dbi d;
    static char big[40000];
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &t), 0);
    cr_assert_eq(mdb_dbi_open(t, "scratch", 0, &d), 0);
    MDB_val kk = {8, "big-one!"}, vv = {sizeof(big), big};
    cr_assert_eq(mdb_put(t, d, &kk, &vv, 0), 0);
    cr_assert_eq(mdb_txn_commit(t), 0);
    mdb_env_close(env);

    char p[600], keep[600];
    data_path(p, sizeof(p));
    snprintf(keep, sizeof(keep), "%s/whole.mdb", tmp);
    copy_file(p, keep);
    uint32_t psize = page_size(p);
    uint64_t pages = (uint64_t)file_size(p) / psize;
    uint64_t top = roots_top(keep, psize);
    cr_assert_gt(pages, top + 60, "the roots lie low in the file");
    struct cuts one = {0};
    cut_at_each(keep, psize, pages - 60, pages, &one);
    cut_at_each(keep, psize, top - 10, top + 10, &one);
    cr_assert_gt(one.opened, 0);
    cr_assert_gt(one.above_roots, 0,
                 "no cut above both roots (%llu) lost a "
                 "page in use",
                 (unsigned long long)top);
    cr_assert_gt(one.refused, one.above_roots, "and some below them");
    cr_assert_gt(one.by_value, 0, "no cut lost only a value's pages");

    env = plain_env();
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &t), 0);
    cr_assert_eq(mdb_dbi_open(t, "scratch", 0, &d), 0);
    MDB_cursor *c;
    cr_assert_eq(mdb_cursor_open(t, d, &c), 0);
    for (int i = 0; mdb_cursor_get(c, &kk, &vv, MDB_NEXT) == 0; i++) {
        if (i % 3 != 0 && memcmp(kk.mv_data, "big-one!", 8) != 0) {
            cr_assert_eq(mdb_cursor_del(c, 0), 0);
        }
    }
    mdb_cursor_close(c);
    cr_assert_eq(mdb_txn_commit(t), 0);
    mdb_env_close(env);
    copy_file(p, keep);
    pages = (uint64_t)file_size(p) / psize;
    struct cuts two = {0};
    cut_at_each(keep, psize, pages - 20, pages, &two);
    cr_assert_gt(two.in_free_list, 0,
                 "no cut above both roots lost only "
                 "pages of the free list");

    open_ok();
    expect_entries(1, 800, 1);
}

/* A database of duplicates (MDB_DUPSORT | MDB_DUPFIXED), as a hostile or
 * foreign file may hold: keys with thousands of 8-byte values, each a
 * tree of its own whose leaves hold keys only (P_LEAF2), and keys with a
 * few, kept in a sub-page of their node. With the newer meta page naming
 * one page more than the file has (as LMDB itself leaves a file now and
 * then), open walks every tree: the file opens (nothing is followed out
 * of a P_LEAF2 page or a sub-page), and a P_LEAF2 page that carries
 * another page's number is found in the tree of duplicates it belongs to
 * (the walk follows each one, F_SUBDATA in a database's leaf). */
Test(identity, a_database_of_duplicates_is_walked_as_lmdb_reads_it)
{
    open_ok();
    append(1, 50, 2);
    close_st();
    MDB_env *env = plain_env();
    MDB_txn *t;
    MDB_dbi d;
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &t), 0);
    cr_assert_eq(
        mdb_dbi_open(t, "dups", MDB_CREATE | MDB_DUPSORT | MDB_DUPFIXED, &d),
        0);
    for (int k = 0; k < 12; k++) {
        char key[16];
        snprintf(key, sizeof(key), "key-%02d", k);
        int many = k % 3 == 0 ? 3 : 3000; /* a sub-page, or a tree */
        for (int v = 0; v < many; v++) {
            uint64_t val = (uint64_t)k << 32 | (uint64_t)v;
            MDB_val kk = {strlen(key), key}, vv = {8, &val};
            cr_assert_eq(mdb_put(t, d, &kk, &vv, 0), 0);
        }
    }
    cr_assert_eq(mdb_txn_commit(t), 0);
    MDB_stat ds;
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &t), 0);
    cr_assert_eq(mdb_stat(t, d, &ds), 0);
    mdb_txn_abort(t);
    mdb_env_close(env);
    cr_assert_eq(ds.ms_entries, 8 * 3000 + 4 * 3, "every duplicate is in");

    char p[600], keep[600];
    data_path(p, sizeof(p));
    uint32_t psize = page_size(p);
    uint64_t pages = (uint64_t)file_size(p) / psize;
    int fd = open(p, O_RDWR);
    off_t newer = meta_offset(fd, psize, 1);
    cr_assert_eq(get_le64(fd, newer + 136), pages - 1, "its last page");
    put_le64(fd, newer + 136, pages);
    /* The P_LEAF2 pages: leaves of the trees of duplicates. */
    uint8_t *page = ida_malloc(psize);
    uint64_t leaf2 = 0;
    int n_leaf2 = 0;
    for (uint64_t i = 2; i < pages; i++) {
        cr_assert_eq(pread(fd, page, psize, (off_t)(i * psize)), psize);
        if ((page[10] & 0x22) == 0x22 &&
            get_le64(fd, (off_t)(i * psize)) == i) {
            leaf2 = leaf2 == 0 ? i : leaf2;
            n_leaf2++;
        }
    }
    ida_free(page);
    close(fd);
    cr_assert_gt(n_leaf2, 8 * 4, "the trees of duplicates' leaves (%d)",
                 n_leaf2);
    snprintf(keep, sizeof(keep), "%s/whole.mdb", tmp);
    copy_file(p, keep);
    char msg[IDA_STORAGE_ERRMSG_MAX + 1];
    int rv = open_in_child(dir, &opts, msg, sizeof(msg));
    cr_assert_eq(rv, 0, "the whole file, walked: %s (%s)",
                 rv < 0 ? "no answer" : idalloc_errname(rv), msg);
    copy_file(keep, p); /* open committed: its file ends short no more */
    fd = open(p, O_RDWR);
    put_le64(fd, (off_t)(leaf2 * psize), leaf2 + 1);
    close(fd);
    rv = open_in_child(dir, &opts, msg, sizeof(msg));
    cr_assert_eq(rv, IDA_ECORRUPT);
    cr_assert(strstr(msg, "carries another page's number") != NULL &&
                  strstr(msg, "\"key-") != NULL,
              "%s", msg);
    copy_file(keep, p);
    open_ok();
    expect_entries(1, 50, 2);
}

/* A value of ten pages' worth less 16 bytes (@extra 0) or less 15 (@extra
 * 1) put last into data.mdb, where it lies at the end of the file; the
 * newer meta page then names one page more, as LMDB itself leaves a file
 * now and then (P_LOOSE), so open walks the trees. LMDB counts a value's
 * pages as its page header and bytes rounded up (OVPAGES in mdb.c): 10
 * pages, then 11. Open must count the same: the file whole opens, and cut
 * by its last page it is refused naming the value's last page, as LMDB
 * then reads past the end. A count of bytes / page size + 1 misses the
 * cut at 11 pages; one that adds a byte refuses the whole file at 10. */
static void value_at_the_end(size_t extra)
{
    open_ok();
    append(1, 50, 2);
    close_st();
    MDB_env *env = plain_env();
    MDB_stat ms;
    cr_assert_eq(mdb_env_stat(env, &ms), 0);
    uint32_t psize = ms.ms_psize;
    size_t len = 10 * (size_t)psize - 16 + extra;
    uint64_t want = 10 + extra;
    char *big = ida_malloc(len);
    cr_assert_not_null(big);
    memset(big, 'v', len);
    MDB_txn *t;
    MDB_dbi d;
    MDB_val kk = {4, "edge"}, vv = {len, big};
    /* Small commits first, so that the pages the value's own commit
     * touches (the scratch and main leaves, the free list) can be taken
     * from pages freed before it, and only its run of pages goes at the
     * end of the file (3 were enough when this test was written). */
    for (int i = 0; i < 8; i++) {
        char pk[16];
        snprintf(pk, sizeof(pk), "pad%04d", i);
        MDB_val pkk = {7, pk}, pvv = {4, "tiny"};
        cr_assert_eq(mdb_txn_begin(env, NULL, 0, &t), 0);
        cr_assert_eq(mdb_dbi_open(t, "scratch", MDB_CREATE, &d), 0);
        cr_assert_eq(mdb_put(t, d, &pkk, &pvv, 0), 0);
        cr_assert_eq(mdb_txn_commit(t), 0);
    }
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &t), 0);
    cr_assert_eq(mdb_dbi_open(t, "scratch", MDB_CREATE, &d), 0);
    cr_assert_eq(mdb_put(t, d, &kk, &vv, 0), 0);
    cr_assert_eq(mdb_txn_commit(t), 0);
    ida_free(big);
    mdb_env_close(env);

    /* The value's first page: an overflow page (flags at byte 10, 0x04)
     * holding its bytes, whose header counts the run (mp_pages, byte 12). */
    char p[600], keep[600];
    data_path(p, sizeof(p));
    uint64_t pages = (uint64_t)file_size(p) / psize;
    int fd = open(p, O_RDWR);
    uint8_t *page = ida_malloc(psize);
    uint64_t first = 0;
    for (uint64_t i = 2; i < pages && first == 0; i++) {
        cr_assert_eq(pread(fd, page, psize, (off_t)(i * psize)), psize);
        if ((page[10] & 0x04) != 0 && page[16] == 'v' && page[17] == 'v') {
            first = i;
        }
    }
    uint32_t run = (uint32_t)page[12] | (uint32_t)page[13] << 8 |
                   (uint32_t)page[14] << 16 | (uint32_t)page[15] << 24;
    ida_free(page);
    cr_assert_gt(first, 0, "the value's overflow pages");
    cr_assert_eq(run, want, "LMDB counts %u pages", run);
    cr_assert_eq(first + want, pages,
                 "the value (pages %llu..%llu) ends the file (%llu pages)",
                 (unsigned long long)first,
                 (unsigned long long)(first + want - 1),
                 (unsigned long long)pages);
    off_t newer = meta_offset(fd, psize, 1);
    cr_assert_eq(get_le64(fd, newer + 136), pages - 1, "its last page");
    put_le64(fd, newer + 136, pages);
    close(fd);
    snprintf(keep, sizeof(keep), "%s/whole.mdb", tmp);
    copy_file(p, keep);

    struct cuts c = {0};
    cut_at_each(keep, psize, pages - 1, pages, &c);
    cr_assert_eq(c.opened, 1, "the whole file opens");
    cr_assert_eq(c.refused, 1, "the file without the value's last page");
    cr_assert_eq(c.by_value, 1);
    cr_assert_eq(truncate(p, (off_t)((pages - 1) * psize)), 0);
    char msg[IDA_STORAGE_ERRMSG_MAX + 1], up_to[64];
    cr_assert_eq(open_in_child(dir, &opts, msg, sizeof(msg)), IDA_ECORRUPT);
    snprintf(up_to, sizeof(up_to), "uses value pages up to %llu ",
             (unsigned long long)(pages - 1));
    cr_assert(strstr(msg, up_to) != NULL, "%s", msg);
}

Test(identity, a_value_of_ten_pages_less_16_bytes_takes_ten_pages)
{
    value_at_the_end(0);
}

Test(identity, a_value_of_ten_pages_less_15_bytes_takes_eleven_pages)
{
    value_at_the_end(1);
}

/* Offset of the txnid of the meta page with the lower one (the older). */
static off_t older_txnid_offset(const char *p, uint32_t psize)
{
    int fd = open(p, O_RDONLY);
    uint8_t a[8], b[8];
    cr_assert_eq(pread(fd, a, 8, 144), 8);
    cr_assert_eq(pread(fd, b, 8, (off_t)psize + 144), 8);
    close(fd);
    uint64_t ta = 0, tb = 0;
    for (int i = 7; i >= 0; i--) {
        ta = ta << 8 | a[i];
        tb = tb << 8 | b[i];
    }
    cr_assert(ta + 1 == tb || tb + 1 == ta, "LMDB's meta txnids %llu %llu",
              (unsigned long long)ta, (unsigned long long)tb);
    return ta < tb ? 144 : (off_t)psize + 144;
}

Test(identity, a_flipped_txnid_in_the_older_meta_page_is_corrupt)
{
    make_node();
    char p[600];
    data_path(p, sizeof(p));
    uint32_t psize = page_size(p);
    off_t off = older_txnid_offset(p, psize);
    /* Without the check LMDB would open the older meta page as the newest
     * one and silently drop the last commit. */
    int fd = open(p, O_RDWR);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, off + 3), 1);
    b ^= 0x01;
    cr_assert_eq(pwrite(fd, &b, 1, off + 3), 1);
    close(fd);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT, "%s",
                 st.errmsg);
    expect_msg("data.mdb meta pages hold transaction ids");
    expect_msg("not consecutive");
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

Test(identity, a_damaged_meta_page_magic_is_corrupt)
{
    make_node();
    char p[600];
    data_path(p, sizeof(p));
    uint32_t psize = page_size(p);
    for (int page = 1; page >= 0; page--) {
        int fd = open(p, O_RDWR);
        uint8_t b;
        off_t off = (off_t)page * psize + 16;
        cr_assert_eq(pread(fd, &b, 1, off), 1);
        b ^= 0xff;
        cr_assert_eq(pwrite(fd, &b, 1, off), 1);
        close(fd);
        cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT, "%s",
                     st.errmsg);
        expect_msg(page == 1 ? "data.mdb meta page 1 has a bad magic number"
                             : "data.mdb meta page 0 has a bad magic number");
        fd = open(p, O_RDWR);
        b ^= 0xff;
        cr_assert_eq(pwrite(fd, &b, 1, off), 1);
        close(fd);
    }
    open_ok();
    expect_entries(1, 50, 1);
}

Test(identity, an_older_meta_page_passed_off_as_the_newest_is_corrupt)
{
    /* The older meta's txnid damaged into newer + 1: consecutive and of the
     * right parity, but it names fewer pages than the commit it would hide
     * (the last commit grew the file). */
    open_ok();
    append(1, 10, 1);
    append(11, 200, 1);
    close_st();
    char p[600];
    data_path(p, sizeof(p));
    uint32_t psize = page_size(p);
    int fd = open(p, O_RDWR);
    uint64_t t0 = get_le64(fd, 144), t1 = get_le64(fd, (off_t)psize + 144);
    uint64_t l0 = get_le64(fd, 136), l1 = get_le64(fd, (off_t)psize + 136);
    off_t older = t0 < t1 ? 0 : (off_t)psize;
    uint64_t newer_t = t0 < t1 ? t1 : t0;
    cr_assert_lt(t0 < t1 ? l0 : l1, t0 < t1 ? l1 : l0,
                 "the last commit grew the file");
    put_le64(fd, older + 144, newer_t + 1);
    close(fd);
    uint64_t before = hash_dir(dir);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT, "%s",
                 st.errmsg);
    expect_msg("names fewer pages than the older one");
    cr_assert_eq(hash_dir(dir), before, "nothing written");
}

/* When LMDB fails to write a meta page, it writes the page back with the
 * old last page and txnid but the new roots (mdb_env_write_meta()), and
 * never reads those roots: the older meta page's roots past its last page
 * are no reason to refuse the file. */
Test(identity, the_older_meta_pages_roots_are_not_checked)
{
    make_node();
    char p[600];
    data_path(p, sizeof(p));
    uint32_t psize = page_size(p);
    int fd = open(p, O_RDWR);
    off_t older = meta_offset(fd, psize, 0);
    uint64_t last = get_le64(fd, older + 136);
    put_le64(fd, older + 128, last + 7);
    close(fd);
    open_ok();
    expect_entries(1, 50, 1);
}
