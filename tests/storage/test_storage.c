/* storage/: round trips of every operation, validation, identity and format
 * checks, foreign and read-only directories, full map and full disk, sticky
 * failures, snapshots in chunks, compaction, concurrent readers.
 *
 * unshare(), mount() and the MS_* constants need _GNU_SOURCE: the read-only
 * and disk-full cases run in a forked child inside a private mount namespace
 * (the tests run as root, for whom chmod does not make anything read-only). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#define DATA_MAX 200

/* --- fixture --- */

static char tmp[256];
static char dir[300];
static struct ida_storage st;
static int st_open;
static struct ida_storage_opts opts;

static void setup(void)
{
    cr_assert_eq(ida_test_tmpdir(tmp, sizeof(tmp), "storage"), 0);
    snprintf(dir, sizeof(dir), "%s/data/node1", tmp);
    opts = (struct ida_storage_opts){.cluster = "test", .node_id = 1};
    st_open = 0;
}

static void teardown(void)
{
    if (st_open) {
        ida_storage_close(&st);
    }
    ida_test_rmrf(tmp);
}

/* --- helpers --- */

static void open_ok(void)
{
    int rv = ida_storage_open(&st, dir, &opts);
    cr_assert_eq(rv, 0, "open: %s (%s)", idalloc_errname(rv), st.errmsg);
    st_open = 1;
}

static void close_st(void)
{
    ida_storage_close(&st);
    st_open = 0;
}

static void reopen(void)
{
    close_st();
    open_ok();
}

/* Append entries [first, first + count) of @term in one committed batch. */
static void append(ida_index first, size_t count, ida_term term)
{
    struct ida_entry es[256];
    cr_assert_leq(count, 256);
    uint8_t *block = ida_test_make_entries(es, count, first, term, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, count), 0, "%s",
                 st.errmsg);
    int rv = ida_storage_batch_commit(&st, &b);
    ida_free(block);
    cr_assert_eq(rv, 0, "commit: %s", st.errmsg);
}

static void set_hs(ida_term term, ida_node_id vote, ida_index commit)
{
    struct ida_hard_state hs = {term, vote, commit};
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), 0, "%s",
                 st.errmsg);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0, "%s", st.errmsg);
}

static struct ida_log_state log_state(void)
{
    struct ida_log_state ls;
    cr_assert_eq(ida_storage_log_state(&st, &ls), 0);
    return ls;
}

/* Entries [lo, hi] must be there, with term @term for those >= @from_term
 * and their deterministic content. */
static void expect_entries(ida_index lo, ida_index hi, ida_term term)
{
    struct ida_entry *es;
    size_t n;
    int rv = ida_storage_entries(&st, lo, hi + 1, 0, &es, &n);
    cr_assert_eq(rv, 0, "entries [%llu, %llu]: %s", (unsigned long long)lo,
                 (unsigned long long)hi, idalloc_errname(rv));
    cr_assert_eq(n, hi - lo + 1);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(es[i].index, lo + i);
        cr_assert_eq(es[i].term, term, "entry %zu term", (size_t)(lo + i));
        cr_assert(ida_test_entry_ok(&es[i], DATA_MAX), "entry %llu content",
                  (unsigned long long)(lo + i));
    }
    ida_free(es);
}

static void expect_msg(const char *needle)
{
    cr_assert(strstr(st.errmsg, needle) != NULL, "message \"%s\" lacks \"%s\"",
              st.errmsg, needle);
    cr_assert(strncmp(st.errmsg, dir, strlen(dir)) == 0,
              "message \"%s\" must start with the directory", st.errmsg);
    cr_assert_null(strchr(st.errmsg, '\n'), "one line: %s", st.errmsg);
}

/* Put (@key, @val) into database @db (NULL: main) of the environment in
 * @path directly through LMDB (the storage must be closed). */
static void poke(const char *path,
                 const char *db,
                 const void *key,
                 size_t klen,
                 const void *val,
                 size_t vlen)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 4);
    cr_assert_eq(mdb_env_open(env, path, 0, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, db, MDB_CREATE, &dbi), 0);
    MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
    cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

/* Read (@key) of @db directly; returns its size (0 if missing) into @out. */
static size_t peek(const char *path,
                   const char *db,
                   const void *key,
                   size_t klen,
                   void *out,
                   size_t cap)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 4);
    cr_assert_eq(mdb_env_open(env, path, MDB_RDONLY, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    size_t n = 0;
    if (mdb_dbi_open(txn, db, 0, &dbi) == 0) {
        MDB_val k = {klen, (void *)key}, v;
        if (mdb_get(txn, dbi, &k, &v) == 0) {
            n = v.mv_size;
            memcpy(out, v.mv_data, n < cap ? n : cap);
        }
    }
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return n;
}

/* Number of records in @db. */
static size_t count_records(const char *path, const char *db)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_stat ms;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 4);
    cr_assert_eq(mdb_env_open(env, path, MDB_RDONLY, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
    cr_assert_eq(mdb_stat(txn, dbi, &ms), 0);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return ms.ms_entries;
}

/* --- open, identity, format --- */

TestSuite(storage, .init = setup, .fini = teardown);

Test(storage, first_open_creates_an_empty_node)
{
    open_ok();
    struct ida_log_state ls = log_state();
    cr_assert_eq(ls.first, 1);
    cr_assert_eq(ls.last, 0);
    cr_assert_eq(ls.last_term, 0);
    struct ida_hard_state hs;
    cr_assert_eq(ida_storage_hard_state(&st, &hs), 0);
    cr_assert_eq(hs.term + hs.vote + hs.commit, 0);
    ida_term t = 99;
    cr_assert_eq(ida_storage_term_at(&st, 0, &t), 0);
    cr_assert_eq(t, 0);
    cr_assert_eq(ida_storage_term_at(&st, 1, &t), IDA_ENOTFOUND);
    struct ida_snapshot_meta m;
    cr_assert_eq(ida_storage_snapshot_meta(&st, &m), IDA_ENOTFOUND);
    reopen();
    cr_assert_eq(log_state().last, 0);
}

Test(storage, bad_options_are_refused)
{
    opts.node_id = 0;
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EINVAL);
    opts.node_id = 1;
    opts.cluster = "";
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EINVAL);
    opts.cluster = "test";
    opts.map_size_bytes = 1 << 20;
    opts.map_size_max_bytes = 1 << 19;
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EINVAL);
    struct stat sb;
    cr_assert_neq(stat(dir, &sb), 0, "nothing created for bad options");
}

Test(storage, another_cluster_is_refused_and_loses_nothing)
{
    open_ok();
    append(1, 5, 1);
    close_st();
    opts.cluster = "other";
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN);
    expect_msg("belongs to cluster \"test\", not \"other\"");
    opts.cluster = "test";
    open_ok();
    expect_entries(1, 5, 1);
}

Test(storage, another_node_is_refused_and_loses_nothing)
{
    open_ok();
    append(1, 5, 1);
    close_st();
    opts.node_id = 2;
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN);
    expect_msg("belongs to node 1, not node 2");
    opts.node_id = 1;
    open_ok();
    expect_entries(1, 5, 1);
}

Test(storage, newer_or_unknown_format_is_refused_and_never_overwritten)
{
    open_ok();
    append(1, 3, 1);
    close_st();
    uint8_t rec[IDA__REC_FORMAT_BYTES];
    ida__rec_format_encode(rec, 7);
    poke(dir, "meta", "format", 6, rec, sizeof(rec));
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EVERSION);
    expect_msg("format version 7 is newer than this program's (1)");
    uint8_t back[64];
    cr_assert_eq(peek(dir, "meta", "format", 6, back, sizeof(back)),
                 sizeof(rec));
    cr_assert_eq(memcmp(back, rec, sizeof(rec)), 0, "format record kept");

    ida__rec_format_encode(rec, 0);
    poke(dir, "meta", "format", 6, rec, sizeof(rec));
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EVERSION);
    expect_msg("unknown format version 0");

    rec[5] ^= 1; /* the checksum no longer matches */
    poke(dir, "meta", "format", 6, rec, sizeof(rec));
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT);
    expect_msg("format record fails its checksum");

    ida__rec_format_encode(rec, IDA_STORAGE_FORMAT_VERSION);
    poke(dir, "meta", "format", 6, rec, sizeof(rec));
    open_ok();
    expect_entries(1, 3, 1);
}

Test(storage, non_empty_foreign_directory_is_never_written)
{
    cr_assert_eq(mkdir(tmp, 0755) == 0 || errno == EEXIST, 1);
    char sub[400], file[450];
    snprintf(sub, sizeof(sub), "%s/data", tmp);
    mkdir(sub, 0755);
    mkdir(dir, 0755);
    snprintf(file, sizeof(file), "%s/notes.txt", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fputs("mine\n", f);
    fclose(f);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN);
    expect_msg("not empty and holds no idalloc storage (found \"notes.txt\")");
    char path[450];
    snprintf(path, sizeof(path), "%s/data.mdb", dir);
    cr_assert_neq(access(path, F_OK), 0, "no data.mdb was created");

    /* A data.mdb that is not LMDB at all. */
    f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 2000; i++) {
        fputs("not an lmdb file ", f);
    }
    fclose(f);
    remove(file);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN);
    expect_msg("data.mdb is not an LMDB environment");
    f = fopen(path, "r");
    char head[17] = "";
    cr_assert_eq(fread(head, 1, 16, f), 16);
    fclose(f);
    cr_assert_str_eq(head, "not an lmdb file", "left untouched");
}

Test(storage, lmdb_of_another_program_is_refused)
{
    ida_test_rmrf(tmp);
    char sub[400];
    snprintf(sub, sizeof(sub), "%s/data", tmp);
    mkdir(tmp, 0755);
    mkdir(sub, 0755);
    mkdir(dir, 0755);
    poke(dir, NULL, "hello", 5, "world", 5);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN);
    expect_msg("holds an LMDB database that is not idalloc storage");
    char back[8];
    cr_assert_eq(peek(dir, NULL, "hello", 5, back, sizeof(back)), 5);
    cr_assert_eq(count_records(dir, NULL), 1, "nothing added");
}

Test(storage, a_directory_opens_once_per_process)
{
    open_ok();
    struct ida_storage second;
    cr_assert_eq(ida_storage_open(&second, dir, &opts), IDA_EEXIST);
    cr_assert(strstr(second.errmsg, "already open in this process") != NULL);
    close_st();
    open_ok();
}

Test(storage, open_fails_cleanly_on_every_allocation_failure)
{
    int failures = 0;
    for (int n = 0; n < 100; n++) {
        ida_heap_fault_set(n, 1);
        int rv = ida_storage_open(&st, dir, &opts);
        ida_heap_fault_set(0, 0);
        if (rv == 0) {
            st_open = 1;
            break;
        }
        cr_assert_eq(rv, IDA_ENOMEM, "allocation %d: %s", n, st.errmsg);
        failures++;
    }
    cr_assert(st_open, "open never succeeded");
    cr_assert_gt(failures, 0, "the walk must hit at least one allocation");
}

/* --- log and hard state --- */

Test(storage, append_read_and_reopen_round_trip)
{
    open_ok();
    append(1, 10, 1);
    append(11, 5, 2);
    set_hs(2, 3, 12);
    expect_entries(1, 10, 1);
    expect_entries(11, 15, 2);
    struct ida_log_state ls = log_state();
    cr_assert_eq(ls.first, 1);
    cr_assert_eq(ls.last, 15);
    cr_assert_eq(ls.last_term, 2);
    ida_term t;
    cr_assert_eq(ida_storage_term_at(&st, 10, &t), 0);
    cr_assert_eq(t, 1);
    cr_assert_eq(ida_storage_term_at(&st, 11, &t), 0);
    cr_assert_eq(t, 2);
    cr_assert_eq(ida_storage_term_at(&st, 16, &t), IDA_ENOTFOUND);
    reopen();
    expect_entries(1, 10, 1);
    expect_entries(11, 15, 2);
    struct ida_hard_state hs;
    cr_assert_eq(ida_storage_hard_state(&st, &hs), 0);
    cr_assert_eq(hs.term, 2);
    cr_assert_eq(hs.vote, 3);
    cr_assert_eq(hs.commit, 12);
}

Test(storage, entries_respect_max_bytes_and_bounds)
{
    open_ok();
    append(1, 50, 1);
    struct ida_entry *es;
    size_t n;
    cr_assert_eq(ida_storage_entries(&st, 1, 51, 300, &es, &n), 0);
    size_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += es[i].len;
    }
    cr_assert_geq(n, 1);
    cr_assert(n == 1 || sum <= 300, "%zu entries, %zu bytes", n, sum);
    cr_assert_lt(n, 50);
    ida_free(es);
    cr_assert_eq(ida_storage_entries(&st, 7, 8, 1, &es, &n), 0);
    cr_assert_eq(n, 1, "at least one entry, whatever the limit");
    cr_assert_eq(es[0].index, 7);
    ida_free(es);
    cr_assert_eq(ida_storage_entries(&st, 0, 3, 0, &es, &n), IDA_EINVAL);
    cr_assert_eq(ida_storage_entries(&st, 5, 5, 0, &es, &n), IDA_EINVAL);
    cr_assert_eq(ida_storage_entries(&st, 45, 52, 0, &es, &n), IDA_ENOTFOUND);
    cr_assert_null(es);
    cr_assert_eq(ida_storage_entries(&st, 51, 52, 0, &es, &n), IDA_ENOTFOUND);
    ida_heap_fault_set(0, 1);
    cr_assert_eq(ida_storage_entries(&st, 1, 5, 0, &es, &n), IDA_ENOMEM);
    ida_heap_fault_set(0, 0);
}

Test(storage, invalid_appends_are_refused_and_change_nothing)
{
    open_ok();
    append(1, 5, 2);
    struct ida_entry es[3];
    uint8_t *block = ida_test_make_entries(es, 3, 6, 2, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    es[1].index = 8; /* a gap */
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), IDA_EINVAL);
    cr_assert(strstr(st.errmsg, "does not follow") != NULL, "%s", st.errmsg);
    es[1].index = 7;
    es[0].term = 1; /* below the last term */
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), IDA_EINVAL);
    es[0].term = 2;
    es[2].term = 0;
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), IDA_EINVAL);
    es[2].term = 2;
    es[2].type = (enum ida_entry_type)7;
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), IDA_EINVAL);
    es[2].type = IDA_ENTRY_NORMAL;
    size_t len = es[2].len;
    es[2].len = (size_t)IDA_STORAGE_ENTRY_BYTES_MAX + 1;
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), IDA_EINVAL);
    es[2].len = len;
    es[2].type = (enum ida_entry_type)(es[2].index % 3);
    cr_assert_eq(b.span_count, 0, "refused appends record nothing");
    /* The same batch still takes the valid entries. */
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), 0, "%s", st.errmsg);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0);
    ida_free(block);
    expect_entries(1, 8, 2);
}

Test(storage, hard_state_rules_are_enforced)
{
    open_ok();
    append(1, 5, 3);
    set_hs(3, 2, 4);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    struct ida_hard_state hs = {2, 2, 4};
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), IDA_EINVAL);
    hs = (struct ida_hard_state){3, 1, 4}; /* another vote, same term */
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), IDA_EINVAL);
    hs = (struct ida_hard_state){3, 2, 3}; /* commit going back */
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), IDA_EINVAL);
    cr_assert_eq(b.has_hard_state, 0);
    hs = (struct ida_hard_state){4, 0, 6}; /* commit beyond the log */
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), IDA_EINVAL);
    struct ida_hard_state now;
    cr_assert_eq(ida_storage_hard_state(&st, &now), 0);
    cr_assert_eq(now.term, 3);
    cr_assert_eq(now.vote, 2);
    cr_assert_eq(now.commit, 4);
    set_hs(4, 1, 5); /* a new term may vote again */
    /* An unchanged hard state alone needs no commit: prove it with a
     * commit fault that must not fire. */
    ida__storage_fault_set(&st, -1, 0, EIO);
    set_hs(4, 1, 5);
    cr_assert_eq(ida_storage_failed(&st), 0);
    ida__storage_fault_set(&st, -1, -1, 0);
}

Test(storage, truncate_then_append_in_one_batch)
{
    open_ok();
    append(1, 10, 1);
    set_hs(1, 1, 4);
    struct ida_entry es[3];
    uint8_t *block = ida_test_make_entries(es, 3, 6, 2, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_truncate(&st, &b, 4), IDA_EINVAL,
                 "committed entries stay");
    cr_assert_eq(ida_storage_batch_truncate(&st, &b, 12), IDA_EINVAL);
    cr_assert_eq(ida_storage_batch_truncate(&st, &b, 6), 0, "%s", st.errmsg);
    cr_assert_eq(ida_storage_batch_truncate(&st, &b, 7), IDA_EINVAL,
                 "once per batch");
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), 0, "%s", st.errmsg);
    struct ida_hard_state hs = {2, 0, 6};
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0, "%s", st.errmsg);
    ida_free(block);
    struct ida_log_state ls = log_state();
    cr_assert_eq(ls.last, 8);
    cr_assert_eq(ls.last_term, 2);
    expect_entries(1, 5, 1);
    expect_entries(6, 8, 2);
    reopen();
    expect_entries(1, 5, 1);
    expect_entries(6, 8, 2);
    struct ida_entry *out;
    size_t n;
    cr_assert_eq(ida_storage_entries(&st, 9, 11, 0, &out, &n), IDA_ENOTFOUND,
                 "the old suffix is gone");
    /* Truncating to an empty suffix, then appending elsewhere: refused. */
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_truncate(&st, &b, 9), 0);
    block = ida_test_make_entries(es, 1, 8, 3, DATA_MAX);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 1), IDA_EINVAL);
    ida_free(block);
}

Test(storage, a_failing_put_leaves_nothing_of_the_batch)
{
    open_ok();
    append(1, 4, 1);
    set_hs(1, 1, 2);
    struct ida_entry es[6];
    uint8_t *block = ida_test_make_entries(es, 6, 4, 2, DATA_MAX);
    int failures = 0;
    for (int n = 0;; n++) {
        struct ida_storage_batch b;
        ida_storage_batch_init(&st, &b);
        struct ida_hard_state hs = {2, 3, 6};
        cr_assert_eq(ida_storage_batch_truncate(&st, &b, 4), 0);
        cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), 0);
        cr_assert_eq(ida_storage_batch_append(&st, &b, es + 3, 3), 0);
        cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), 0);
        /* ENOMEM from a put: a transient failure, nothing is written. */
        ida__storage_fault_set(&st, n, -1, ENOMEM);
        int rv = ida_storage_batch_commit(&st, &b);
        ida__storage_fault_set(&st, -1, -1, 0);
        if (rv == 0) {
            break;
        }
        failures++;
        cr_assert_eq(rv, IDA_ENOMEM, "put %d: %s", n, st.errmsg);
        cr_assert_eq(ida_storage_failed(&st), 0, "not sticky");
        struct ida_log_state ls = log_state();
        cr_assert_eq(ls.last, 4, "put %d: nothing of the batch", n);
        expect_entries(1, 4, 1);
        struct ida_hard_state now;
        cr_assert_eq(ida_storage_hard_state(&st, &now), 0);
        cr_assert_eq(now.term, 1);
    }
    cr_assert_eq(failures, 7, "6 entries and the hard state: 7 puts");
    ida_free(block);
    expect_entries(1, 3, 1);
    expect_entries(4, 9, 2);
}

Test(storage, failed_commit_is_sticky_and_loses_only_the_failed_batch)
{
    open_ok();
    append(1, 5, 1);
    ida__storage_fault_set(&st, -1, 0, EIO);
    struct ida_entry es[2];
    uint8_t *block = ida_test_make_entries(es, 2, 6, 1, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 2), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), IDA_EIO);
    expect_msg("batch commit failed: Input/output error; storage stopped");
    cr_assert_eq(ida_storage_failed(&st), IDA_EIO);
    /* Every later write is refused, even one that would succeed. */
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 2), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), IDA_EIO);
    struct ida_snapshot_writer w;
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 3, 1, NULL, 0), IDA_EIO);
    cr_assert_eq(ida_storage_compact(&st, 1), IDA_EIO);
    /* Reads still answer from what is durable. */
    cr_assert_eq(log_state().last, 5);
    reopen();
    cr_assert_eq(ida_storage_failed(&st), 0);
    cr_assert_eq(log_state().last, 5);
    expect_entries(1, 5, 1);
    append(6, 2, 1);
    ida_free(block);
}

Test(storage, map_grows_when_full)
{
    opts.map_size_bytes = 128 * 1024;
    opts.map_size_max_bytes = 8 << 20;
    open_ok();
    cr_assert_eq(ida_storage_map_size(&st), 128 * 1024);
    for (ida_index i = 1; i <= 4000; i += 200) {
        append(i, 200, 1);
    }
    cr_assert_gt(ida_storage_map_size(&st), 128 * 1024, "the map grew");
    expect_entries(1, 4000, 1);
    uint64_t grown = ida_storage_map_size(&st);
    reopen();
    cr_assert_geq(ida_storage_map_size(&st), grown,
                  "reopen keeps the grown map");
    expect_entries(1, 4000, 1);
}

Test(storage, injected_map_full_grows_and_replays_the_batch)
{
    opts.map_size_bytes = 256 * 1024;
    open_ok();
    ida__storage_fault_set(&st, 2, -1, MDB_MAP_FULL);
    append(1, 5, 1);
    cr_assert_eq(ida_storage_map_size(&st), 512 * 1024);
    expect_entries(1, 5, 1);
}

Test(storage, full_map_at_its_maximum_fails_cleanly)
{
    opts.map_size_bytes = 128 * 1024;
    opts.map_size_max_bytes = 512 * 1024;
    open_ok();
    struct ida_entry es[100];
    ida_index next = 1;
    int rv = 0;
    struct ida_log_state before;
    while (rv == 0) {
        before = log_state();
        uint8_t *block = ida_test_make_entries(es, 100, next, 1, DATA_MAX);
        struct ida_storage_batch b;
        ida_storage_batch_init(&st, &b);
        cr_assert_eq(ida_storage_batch_append(&st, &b, es, 100), 0);
        rv = ida_storage_batch_commit(&st, &b);
        ida_free(block);
        if (rv == 0) {
            next += 100;
        }
        cr_assert_lt(next, 100000, "the map never filled");
    }
    cr_assert_eq(rv, IDA_ENOSPC);
    expect_msg("map full at its maximum of 524288 bytes");
    cr_assert_eq(ida_storage_map_size(&st), 512 * 1024);
    cr_assert_eq(ida_storage_failed(&st), 0, "a full map is not sticky");
    struct ida_log_state after = log_state();
    cr_assert_eq(after.last, before.last, "nothing half-written");
    cr_assert_eq(after.last, next - 1);
    expect_entries(1, next - 1, 1);
    reopen();
    expect_entries(1, next - 1, 1);
}

/* --- read-only directory and full disk (private mount namespace) --- */

/* End a forked child: send @result (one byte) to the parent, then die by
 * SIGKILL. Dying by signal keeps the child's exit out of valgrind's leak
 * report, which would otherwise flag allocations Criterion made before the
 * fork; a memory error in the child still shows on stderr (and aborts it
 * under ASan, so no result arrives and the test fails). */
static _Noreturn void child_finish(int fd, int result)
{
    unsigned char c = (unsigned char)result;
    if (write(fd, &c, 1) != 1) {
        _exit(1);
    }
    raise(SIGKILL);
    _exit(1);
}

/* The result a child sent before dying; -1 when it sent none. */
static int child_result(pid_t pid, int fd)
{
    unsigned char c;
    ssize_t n = read(fd, &c, 1);
    close(fd);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return n == 1 ? c : -1;
}

/* Run @fn in a forked child inside a private mount namespace; returns its
 * result: 0 pass, 77 cannot unshare, else failure with a message on the
 * child's stderr. */
static int in_namespace(int (*fn)(void))
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        if (unshare(CLONE_NEWNS) != 0 ||
            mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0) {
            fprintf(stderr, "unshare/mount: %s\n", strerror(errno));
            child_finish(fds[1], 77);
        }
        child_finish(fds[1], fn());
    }
    close(fds[1]);
    return child_result(pid, fds[0]);
}

#define CHILD_CHECK(cond, ...)                      \
    do {                                            \
        if (!(cond)) {                              \
            fprintf(stderr, "child: " __VA_ARGS__); \
            fprintf(stderr, "\n");                  \
            return 1;                               \
        }                                           \
    } while (0)

static int read_only_child(void)
{
    /* Bind the node directory onto itself, then make the bind read-only. */
    CHILD_CHECK(mount(dir, dir, "none", MS_BIND, NULL) == 0, "bind: %s",
                strerror(errno));
    CHILD_CHECK(
        mount("none", dir, "none", MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) == 0,
        "remount ro: %s", strerror(errno));
    struct ida_storage s;
    int rv = ida_storage_open(&s, dir, &opts);
    CHILD_CHECK(rv == IDA_EIO, "open on a read-only mount gave %s: %s",
                idalloc_errname(rv), s.errmsg);
    CHILD_CHECK(strstr(s.errmsg, "Read-only file system") != NULL &&
                    strncmp(s.errmsg, dir, strlen(dir)) == 0,
                "message: %s", s.errmsg);
    /* A new node directory under a read-only parent cannot be created. */
    char sub[400];
    snprintf(sub, sizeof(sub), "%s/nested", dir);
    rv = ida_storage_open(&s, sub, &opts);
    CHILD_CHECK(rv == IDA_EIO && strstr(s.errmsg, "Read-only") != NULL,
                "nested open gave %s: %s", idalloc_errname(rv), s.errmsg);
    return 0;
}

Test(storage, read_only_directory_gives_a_clear_error_and_loses_nothing)
{
    open_ok();
    append(1, 20, 1);
    set_hs(1, 1, 20);
    close_st(); /* the environment must not cross fork */
    int rv = in_namespace(read_only_child);
    if (rv == 77) {
        cr_skip_test("cannot create a private mount namespace here");
    }
    cr_assert_eq(rv, 0, "read-only child failed (see its stderr)");
    open_ok();
    expect_entries(1, 20, 1);
    struct ida_hard_state hs;
    cr_assert_eq(ida_storage_hard_state(&st, &hs), 0);
    cr_assert_eq(hs.commit, 20);
}

static int disk_full_child(void)
{
    CHILD_CHECK(mount("tmpfs", tmp, "tmpfs", 0, "size=320k") == 0, "tmpfs: %s",
                strerror(errno));
    struct ida_storage s;
    CHILD_CHECK(ida_storage_open(&s, dir, &opts) == 0, "open: %s", s.errmsg);
    struct ida_entry es[50];
    ida_index next = 1;
    int rv = 0;
    while (rv == 0 && next < 100000) {
        uint8_t *block = ida_test_make_entries(es, 50, next, 1, DATA_MAX);
        struct ida_storage_batch b;
        ida_storage_batch_init(&s, &b);
        CHILD_CHECK(ida_storage_batch_append(&s, &b, es, 50) == 0, "append");
        rv = ida_storage_batch_commit(&s, &b);
        ida_free(block);
        if (rv == 0) {
            next += 50;
        }
    }
    CHILD_CHECK(rv == IDA_ENOSPC, "a full disk gave %s: %s",
                idalloc_errname(rv), s.errmsg);
    CHILD_CHECK((strstr(s.errmsg, "No space left on device") != NULL ||
                 strstr(s.errmsg, "the file system is full") != NULL) &&
                    strstr(s.errmsg, "storage stopped") != NULL,
                "message: %s", s.errmsg);
    CHILD_CHECK(ida_storage_failed(&s) == IDA_ENOSPC, "sticky");
    ida_storage_close(&s);
    /* Everything acknowledged is there after a reopen. */
    CHILD_CHECK(ida_storage_open(&s, dir, &opts) == 0, "reopen: %s", s.errmsg);
    struct ida_log_state ls;
    CHILD_CHECK(ida_storage_log_state(&s, &ls) == 0 && ls.last == next - 1,
                "last %llu, acknowledged %llu", (unsigned long long)ls.last,
                (unsigned long long)(next - 1));
    for (ida_index i = 1; i < next; i += 50) {
        struct ida_entry *out;
        size_t n;
        CHILD_CHECK(
            ida_storage_entries(&s, i, i + 50, 0, &out, &n) == 0 && n == 50,
            "entries from %llu", (unsigned long long)i);
        for (size_t j = 0; j < n; j++) {
            CHILD_CHECK(ida_test_entry_ok(&out[j], DATA_MAX), "content");
        }
        ida_free(out);
    }
    ida_storage_close(&s);
    fprintf(stderr, "disk full after %llu entries\n",
            (unsigned long long)(next - 1));
    return 0;
}

Test(storage, full_disk_stops_writes_and_keeps_what_was_acknowledged)
{
    int rv = in_namespace(disk_full_child);
    if (rv == 77) {
        cr_skip_test("cannot create a private mount namespace here");
    }
    cr_assert_eq(rv, 0, "disk-full child failed (see its stderr)");
}

/* --- fork --- */

Test(storage, using_the_environment_after_fork_aborts)
{
    open_ok();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 2); /* keep the expected backtrace out of the log */
        struct ida_log_state ls;
        ida_storage_log_state(&st, &ls);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
              "the child must abort");
}

/* mdb_reader_list callback: count the lines naming @ctx's pid. */
static int count_pid_lines(const char *msg, void *ctx)
{
    char pid[32];
    snprintf(pid, sizeof(pid), " %d ", *(int *)ctx);
    if (strstr(msg, pid) != NULL) {
        (*(int *)((char *)ctx + sizeof(int)))++;
    }
    return 0;
}

Test(storage, stale_reader_of_a_dead_process_is_cleared_at_open)
{
    open_ok();
    append(1, 3, 1);
    close_st();
    /* Child A keeps the environment open, so the lock file is not reset
     * when the next process opens it; child B dies holding a read
     * transaction, leaving its reader slot behind. */
    int hold[2], done[2];
    cr_assert_eq(pipe(hold), 0);
    cr_assert_eq(pipe(done), 0);
    fflush(NULL);
    pid_t a = fork();
    cr_assert_geq(a, 0);
    if (a == 0) {
        close(hold[1]);
        close(done[0]);
        struct ida_storage s;
        int ok = ida_storage_open(&s, dir, &opts) == 0;
        unsigned char c = (unsigned char)ok;
        if (write(done[1], &c, 1) != 1 || read(hold[0], &c, 1) < 0) {
            raise(SIGKILL);
        }
        raise(SIGKILL); /* still holding the environment */
    }
    close(hold[0]);
    close(done[1]);
    unsigned char c = 0;
    cr_assert_eq(read(done[0], &c, 1), 1);
    cr_assert_eq(c, 1, "child A opened the storage");
    pid_t b = fork();
    cr_assert_geq(b, 0);
    if (b == 0) {
        MDB_env *env;
        MDB_txn *txn;
        mdb_env_create(&env);
        mdb_env_set_maxdbs(env, 4);
        if (mdb_env_open(env, dir, MDB_NOTLS, 0644) == 0 &&
            mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0) {
            raise(SIGKILL); /* dies inside the read transaction */
        }
        _exit(1);
    }
    int status;
    cr_assert_eq(waitpid(b, &status, 0), b);
    cr_assert(WIFSIGNALED(status), "child B died holding its reader slot");
    open_ok();
    int ctx[2] = {(int)b, 0};
    mdb_reader_list((MDB_env *)st.env, count_pid_lines, ctx);
    cr_assert_eq(ctx[1], 0, "the dead reader's slot is gone");
    close(hold[1]); /* let A go */
    close(done[0]);
    cr_assert_eq(waitpid(a, &status, 0), a);
    expect_entries(1, 3, 1);
}

/* --- corruption --- */

Test(storage, a_corrupt_entry_is_reported_not_returned)
{
    open_ok();
    append(1, 10, 1);
    close_st();
    uint8_t key[8], val[512];
    ida__put_be64(key, 4);
    size_t n = peek(dir, "log", key, 8, val, sizeof(val));
    cr_assert_gt(n, IDA__REC_ENTRY_HDR_BYTES);
    val[n - 1] ^= 0x40; /* one flipped bit in the data */
    poke(dir, "log", key, 8, val, n);
    open_ok();
    struct ida_entry *es;
    size_t cnt;
    cr_assert_eq(ida_storage_entries(&st, 1, 11, 0, &es, &cnt), IDA_ECORRUPT);
    cr_assert_eq(ida_storage_entries(&st, 1, 4, 0, &es, &cnt), 0);
    ida_free(es);
    ida_term t;
    cr_assert_eq(ida_storage_term_at(&st, 4, &t), IDA_ECORRUPT);
    /* A corrupt last entry is found at open. */
    close_st();
    ida__put_be64(key, 10);
    n = peek(dir, "log", key, 8, val, sizeof(val));
    val[2] ^= 1;
    poke(dir, "log", key, 8, val, n);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT);
    expect_msg("fails its checksum");
}

/* --- snapshots and compaction --- */

static uint8_t *make_state(size_t size)
{
    uint8_t *p = malloc(size + 1);
    ida_test_fill(p, size, size, 77);
    return p;
}

/* Write a snapshot of @size bytes in uneven pieces. */
static void save_snapshot(ida_index index, ida_term term, size_t size)
{
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20};
    uint8_t *state = make_state(size);
    struct ida_snapshot_writer w;
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, index, term, config,
                                            sizeof(config)),
                 0, "%s", st.errmsg);
    size_t off = 0, piece = 1000;
    while (off < size) {
        size_t n = size - off < piece ? size - off : piece;
        cr_assert_eq(ida_storage_snapshot_write(&st, &w, state + off, n), 0,
                     "%s", st.errmsg);
        off += n;
        piece = piece * 3 + 17; /* 1000, 3017, 9068, ... past chunk sizes */
    }
    cr_assert_eq(ida_storage_snapshot_finish(&st, &w), 0, "%s", st.errmsg);
    free(state);
}

static void expect_snapshot(ida_index index, ida_term term, size_t size)
{
    struct ida_snapshot_meta m;
    uint8_t *data;
    cr_assert_eq(ida_storage_snapshot_load(&st, &m, &data), 0);
    cr_assert_eq(m.index, index);
    cr_assert_eq(m.term, term);
    cr_assert_eq(m.data_size, size);
    cr_assert_eq(m.config_len, 5);
    cr_assert_eq(m.config[4], 0x20);
    uint8_t *want = make_state(size);
    cr_assert(size == 0 || memcmp(data, want, size) == 0, "state bytes");
    free(want);
    ida_free(data);
    ida_snapshot_meta_release(&m);
}

Test(storage, snapshot_round_trip_in_chunks)
{
    open_ok();
    size_t size = 3 * IDA_STORAGE_CHUNK_BYTES + 12345;
    save_snapshot(10, 2, size);
    expect_snapshot(10, 2, size);
    struct ida_snapshot_meta m;
    cr_assert_eq(ida_storage_snapshot_meta(&st, &m), 0);
    uint64_t id = m.id;
    uint8_t *want = make_state(size);
    cr_assert_eq(m.data_crc32c, ida__crc32c(0, want, size));
    ida_snapshot_meta_release(&m);
    /* Offset reads across chunk boundaries. */
    uint8_t buf[5000];
    uint64_t offs[] = {0, IDA_STORAGE_CHUNK_BYTES - 100,
                       2 * IDA_STORAGE_CHUNK_BYTES - 1, size - 10};
    for (size_t i = 0; i < 4; i++) {
        size_t n;
        cr_assert_eq(
            ida_storage_snapshot_read(&st, id, offs[i], buf, sizeof(buf), &n),
            0);
        size_t expect =
            size - offs[i] < sizeof(buf) ? size - offs[i] : sizeof(buf);
        cr_assert_eq(n, expect);
        cr_assert_eq(memcmp(buf, want + offs[i], n), 0, "offset %llu",
                     (unsigned long long)offs[i]);
    }
    size_t n;
    cr_assert_eq(ida_storage_snapshot_read(&st, id, size, buf, 10, &n), 0);
    cr_assert_eq(n, 0, "end of the state");
    cr_assert_eq(ida_storage_snapshot_read(&st, id, size + 1, buf, 10, &n),
                 IDA_EINVAL);
    free(want);
    reopen();
    expect_snapshot(10, 2, size);
    /* A newer snapshot replaces it; readers of the old id are told. */
    save_snapshot(12, 2, 100);
    cr_assert_eq(ida_storage_snapshot_read(&st, id, 0, buf, 10, &n),
                 IDA_ENOTFOUND);
    expect_snapshot(12, 2, 100);
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 1, "old chunks deleted");
    open_ok();
    save_snapshot(13, 3, 0); /* an empty state */
    expect_snapshot(13, 3, 0);
}

Test(storage, snapshot_writer_rules)
{
    open_ok();
    struct ida_snapshot_writer w, w2;
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 0, 1, NULL, 0),
                 IDA_EINVAL);
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 5, 0, NULL, 0),
                 IDA_EINVAL);
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w, 5, 1, (const uint8_t *)"x",
                                   (size_t)IDA_STORAGE_CONFIG_BYTES_MAX + 1),
        IDA_ETOOBIG);
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 5, 1, NULL, 0), 0);
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w2, 5, 1, NULL, 0),
                 IDA_EBUSY);
    uint8_t *state = make_state(3 * IDA_STORAGE_CHUNK_BYTES);
    cr_assert_eq(
        ida_storage_snapshot_write(&st, &w, state, 3 * IDA_STORAGE_CHUNK_BYTES),
        0);
    ida_storage_snapshot_abort(&st, &w);
    free(state);
    struct ida_snapshot_meta m;
    cr_assert_eq(ida_storage_snapshot_meta(&st, &m), IDA_ENOTFOUND);
    save_snapshot(8, 1, 10);
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 7, 1, NULL, 0), IDA_EINVAL,
                 "older than the current snapshot");
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 1, "aborted chunks deleted");
}

Test(storage, unfinished_snapshot_of_a_killed_process_is_collected)
{
    open_ok();
    save_snapshot(5, 1, 1000);
    close_st();
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        struct ida_storage s;
        if (ida_storage_open(&s, dir, &opts) != 0) {
            child_finish(fds[1], 1);
        }
        struct ida_snapshot_writer w;
        uint8_t *state = make_state(4 * IDA_STORAGE_CHUNK_BYTES);
        if (ida_storage_snapshot_begin(&s, &w, 9, 1, NULL, 0) != 0 ||
            ida_storage_snapshot_write(&s, &w, state,
                                       4 * IDA_STORAGE_CHUNK_BYTES) != 0) {
            child_finish(fds[1], 2);
        }
        child_finish(fds[1], 0); /* dies before finishing: no close, no abort */
    }
    close(fds[1]);
    cr_assert_eq(child_result(pid, fds[0]), 0);
    cr_assert_eq(count_records(dir, "snap"), 5, "1 + 4 unfinished chunks");
    open_ok();
    expect_snapshot(5, 1, 1000);
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 1, "leftovers collected");
}

Test(storage, compact_then_reopen)
{
    open_ok();
    append(1, 100, 1);
    append(101, 20, 2);
    set_hs(2, 1, 90);
    cr_assert_eq(ida_storage_compact(&st, 50), IDA_EINVAL, "no snapshot yet");
    save_snapshot(80, 1, 5000);
    cr_assert_eq(ida_storage_compact(&st, 81), IDA_EINVAL, "beyond snapshot");
    cr_assert_eq(ida_storage_compact(&st, 60), 0, "%s", st.errmsg);
    struct ida_log_state ls = log_state();
    cr_assert_eq(ls.first, 61);
    cr_assert_eq(ls.prev_index, 60);
    cr_assert_eq(ls.prev_term, 1);
    cr_assert_eq(ls.last, 120);
    reopen();
    ls = log_state();
    cr_assert_eq(ls.first, 61);
    cr_assert_eq(ls.last, 120);
    ida_term t;
    cr_assert_eq(ida_storage_term_at(&st, 60, &t), 0);
    cr_assert_eq(t, 1);
    cr_assert_eq(ida_storage_term_at(&st, 59, &t), IDA_ENOTFOUND);
    struct ida_entry *es;
    size_t n;
    cr_assert_eq(ida_storage_entries(&st, 60, 62, 0, &es, &n), IDA_ENOTFOUND);
    expect_entries(61, 100, 1);
    expect_entries(101, 120, 2);
    cr_assert_eq(ida_storage_compact(&st, 40), 0, "below first: no-op");
    cr_assert_eq(ida_storage_compact(&st, 80), 0);
    cr_assert_eq(log_state().first, 81);
    /* A truncation may not reach into the compacted prefix. */
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_truncate(&st, &b, 80), IDA_EINVAL);
    append(121, 3, 2);
    reopen();
    expect_entries(81, 100, 1);
    expect_entries(101, 123, 2);
}

Test(storage, snapshot_beyond_the_log_discards_it)
{
    open_ok();
    append(1, 10, 1);
    save_snapshot(50, 3, 64); /* installed from a leader */
    cr_assert_eq(ida_storage_compact(&st, 50), 0, "%s", st.errmsg);
    struct ida_log_state ls = log_state();
    cr_assert_eq(ls.first, 51);
    cr_assert_eq(ls.last, 50);
    cr_assert_eq(ls.last_term, 3);
    append(51, 2, 3);
    reopen();
    ls = log_state();
    cr_assert_eq(ls.prev_index, 50);
    cr_assert_eq(ls.prev_term, 3);
    expect_entries(51, 52, 3);
}

Test(storage, snapshot_with_a_conflicting_term_discards_the_log)
{
    open_ok();
    append(1, 10, 1);
    save_snapshot(5, 2, 64); /* the leader's entry 5 has term 2, ours 1 */
    cr_assert_eq(ida_storage_compact(&st, 5), 0, "%s", st.errmsg);
    struct ida_log_state ls = log_state();
    cr_assert_eq(ls.prev_index, 5);
    cr_assert_eq(ls.prev_term, 2);
    cr_assert_eq(ls.last, 5, "entries 6..10 followed a conflicting entry");
}

Test(storage, snapshot_write_grows_the_map)
{
    opts.map_size_bytes = 128 * 1024;
    open_ok();
    save_snapshot(1, 1, 2 << 20);
    cr_assert_gt(ida_storage_map_size(&st), 2 << 20);
    expect_snapshot(1, 1, 2 << 20);
}

Test(storage, snapshot_and_compaction_fail_cleanly_at_every_put)
{
    open_ok();
    append(1, 30, 1);
    save_snapshot(10, 1, 100);
    size_t size = 2 * IDA_STORAGE_CHUNK_BYTES + 5;
    uint8_t *state = make_state(size);
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20};
    int failures = 0;
    for (int n = 0;; n++) {
        struct ida_snapshot_writer w;
        cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 20, 1, config, 5), 0);
        /* ENOMEM from the (n+1)-th put: transient, nothing written. */
        ida__storage_fault_set(&st, n, -1, ENOMEM);
        int rv = ida_storage_snapshot_write(&st, &w, state, size);
        if (rv == 0) {
            rv = ida_storage_snapshot_finish(&st, &w);
        } else {
            ida_storage_snapshot_abort(&st, &w);
        }
        ida__storage_fault_set(&st, -1, -1, 0);
        if (rv == 0) {
            break;
        }
        failures++;
        cr_assert_eq(rv, IDA_ENOMEM, "put %d: %s", n, st.errmsg);
        expect_snapshot(10, 1, 100); /* the old one, intact */
    }
    free(state);
    cr_assert_eq(failures, 4, "3 chunks and the meta record");
    struct ida_snapshot_meta m;
    cr_assert_eq(ida_storage_snapshot_meta(&st, &m), 0);
    cr_assert_eq(m.index, 20);
    ida_snapshot_meta_release(&m);
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 3, "no chunk of a failed try");
    open_ok();
    /* Compaction: one put (log_prev) besides the deletes. */
    ida__storage_fault_set(&st, 0, -1, ENOMEM);
    cr_assert_eq(ida_storage_compact(&st, 15), IDA_ENOMEM);
    cr_assert_eq(log_state().first, 1, "nothing compacted");
    expect_entries(1, 30, 1);
    /* A failed commit of a compaction is sticky and compacts nothing. */
    ida__storage_fault_set(&st, -1, 0, EIO);
    cr_assert_eq(ida_storage_compact(&st, 15), IDA_EIO);
    reopen();
    cr_assert_eq(log_state().first, 1);
    expect_entries(1, 30, 1);
    cr_assert_eq(ida_storage_compact(&st, 15), 0);
    cr_assert_eq(log_state().first, 16);
}

Test(storage, two_nodes_in_one_process)
{
    open_ok();
    char dir2[320];
    snprintf(dir2, sizeof(dir2), "%s/data/node2", tmp);
    struct ida_storage two;
    struct ida_storage_opts o2 = {.cluster = "test", .node_id = 2};
    cr_assert_eq(ida_storage_open(&two, dir2, &o2), 0, "%s", two.errmsg);
    append(1, 3, 1);
    struct ida_log_state ls;
    cr_assert_eq(ida_storage_log_state(&two, &ls), 0);
    cr_assert_eq(ls.last, 0, "separate environments");
    ida_storage_close(&two);
}

/* --- concurrent readers --- */

/* Readers run until told to stop AND have completed at least one read. */
static atomic_int readers_stop;

static void *reader_main(void *arg)
{
    (void)arg;
    long reads = 0;
    while (!atomic_load(&readers_stop) || reads == 0) {
        struct ida_log_state ls;
        if (ida_storage_log_state(&st, &ls) != 0) {
            return (void *)-1;
        }
        if (ls.last == 0) {
            continue;
        }
        struct ida_entry *es;
        size_t n;
        ida_index lo = ls.last > 50 ? ls.last - 50 : 1;
        if (ida_storage_entries(&st, lo, ls.last + 1, 0, &es, &n) != 0) {
            return (void *)-2;
        }
        for (size_t i = 0; i < n; i++) {
            if (!ida_test_entry_ok(&es[i], DATA_MAX)) {
                ida_free(es);
                return (void *)-3;
            }
        }
        ida_free(es);
        reads++;
    }
    return (void *)reads;
}

Test(storage, readers_on_other_threads_while_the_map_grows, .timeout = 120)
{
    opts.map_size_bytes = 64 * 1024;
    open_ok();
    pthread_t th[2];
    atomic_store(&readers_stop, 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(pthread_create(&th[i], NULL, reader_main, NULL), 0);
    }
    for (ida_index i = 1; i <= 3000; i += 100) {
        append(i, 100, 1);
    }
    atomic_store(&readers_stop, 1);
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_assert_gt((long)r, 0, "reader %d failed with %ld", i, (long)r);
    }
    cr_assert_gt(ida_storage_map_size(&st), 64 * 1024, "resized under load");
    expect_entries(1, 3000, 1);
}

static void *snapshot_reader_main(void *arg)
{
    (void)arg;
    long complete = 0;
    uint8_t *buf = malloc(4 << 20);
    while (!atomic_load(&readers_stop) || complete == 0) {
        struct ida_snapshot_meta m;
        int rv = ida_storage_snapshot_meta(&st, &m);
        if (rv == IDA_ENOTFOUND) {
            continue;
        }
        if (rv != 0) {
            free(buf);
            return (void *)-1;
        }
        uint64_t off = 0;
        size_t n = 1;
        while (rv == 0 && n > 0) {
            rv = ida_storage_snapshot_read(&st, m.id, off, buf + off, 7000, &n);
            off += n;
        }
        size_t size = (size_t)m.data_size;
        ida_snapshot_meta_release(&m);
        if (rv == IDA_ENOTFOUND) {
            continue; /* replaced while we read it: start again */
        }
        uint8_t *want = make_state(size);
        int ok = rv == 0 && off == size && memcmp(buf, want, size) == 0;
        free(want);
        if (!ok) {
            free(buf);
            return (void *)-2;
        }
        complete++;
    }
    free(buf);
    return (void *)complete;
}

Test(storage,
     snapshot_readers_on_other_threads_see_whole_snapshots,
     .timeout = 120)
{
    opts.map_size_bytes = 256 * 1024;
    open_ok();
    save_snapshot(1, 1, 100000);
    pthread_t th[2];
    atomic_store(&readers_stop, 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(pthread_create(&th[i], NULL, snapshot_reader_main, NULL),
                     0);
    }
    for (ida_index i = 2; i < 40; i++) {
        save_snapshot(i, 1, (size_t)(i * 37111) % (3 << 20));
    }
    atomic_store(&readers_stop, 1);
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_assert_gt((long)r, 0, "snapshot reader %d failed with %ld", i,
                     (long)r);
    }
}

/* --- records --- */

Test(storage_record, crc32c_known_answer)
{
    /* RFC 3720 test vector: CRC-32C of "123456789" is 0xE3069283. */
    cr_assert_eq(ida__crc32c(0, "123456789", 9), 0xE3069283u);
    /* Incremental equals one-shot. */
    cr_assert_eq(ida__crc32c(ida__crc32c(0, "1234", 4), "56789", 5),
                 0xE3069283u);
}

Test(storage_record, every_record_rejects_a_flipped_bit_and_a_wrong_length)
{
    uint8_t buf[128];
    struct ida_hard_state hs = {7, 3, 99}, out;
    ida__rec_hard_state_encode(buf, &hs);
    cr_assert_eq(
        ida__rec_hard_state_decode(buf, IDA__REC_HARD_STATE_BYTES, &out), 0);
    cr_assert_eq(out.term, 7);
    cr_assert_eq(out.vote, 3);
    cr_assert_eq(out.commit, 99);
    for (size_t bit = 0; bit < IDA__REC_HARD_STATE_BYTES * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert_eq(
            ida__rec_hard_state_decode(buf, IDA__REC_HARD_STATE_BYTES, &out),
            IDA_ECORRUPT, "bit %zu", bit);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    cr_assert_eq(
        ida__rec_hard_state_decode(buf, IDA__REC_HARD_STATE_BYTES - 1, &out),
        IDA_ECORRUPT);
    ida_index pi;
    ida_term pt;
    ida__rec_log_prev_encode(buf, 5, 6);
    cr_assert_eq(
        ida__rec_log_prev_decode(buf, IDA__REC_LOG_PREV_BYTES, &pi, &pt), 0);
    cr_assert_eq(pi, 5);
    cr_assert_eq(pt, 6);
    buf[7] ^= 1;
    cr_assert_eq(
        ida__rec_log_prev_decode(buf, IDA__REC_LOG_PREV_BYTES, &pi, &pt),
        IDA_ECORRUPT);
    size_t n = ida__rec_identity_encode(buf, 9, "abc", 3);
    ida_node_id node;
    const char *name;
    size_t name_len;
    cr_assert_eq(ida__rec_identity_decode(buf, n, &node, &name, &name_len), 0);
    cr_assert_eq(node, 9);
    cr_assert_eq(name_len, 3);
    cr_assert_eq(memcmp(name, "abc", 3), 0);
    cr_assert_eq(ida__rec_identity_decode(buf, n + 1, &node, &name, &name_len),
                 IDA_ECORRUPT);
    /* An entry checksum covers its index: a value moved to another key
     * fails. */
    struct ida_entry e = {.term = 3,
                          .index = 42,
                          .type = IDA_ENTRY_NOOP,
                          .data = (uint8_t *)"hello",
                          .len = 5};
    ida__rec_entry_header(buf, &e);
    memcpy(buf + IDA__REC_ENTRY_HDR_BYTES, "hello", 5);
    struct ida_entry d;
    cr_assert_eq(
        ida__rec_entry_decode(buf, IDA__REC_ENTRY_HDR_BYTES + 5, 42, &d), 0);
    cr_assert_eq(d.term, 3);
    cr_assert_eq(d.type, IDA_ENTRY_NOOP);
    cr_assert_eq(d.len, 5);
    cr_assert_eq(
        ida__rec_entry_decode(buf, IDA__REC_ENTRY_HDR_BYTES + 5, 43, &d),
        IDA_ECORRUPT);
    cr_assert_eq(
        ida__rec_entry_decode(buf, IDA__REC_ENTRY_HDR_BYTES + 4, 42, &d),
        IDA_ECORRUPT);
}
