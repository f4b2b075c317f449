/* Fixture and helpers of the Criterion storage tests (tests/storage/test_*.c).
 *
 * A header of static functions, not a support .c: every support .c of
 * tests/storage is also linked into the crash program and the benchmark,
 * which do not link Criterion. Each test binary gets its own copy of the
 * fixture (each test runs in its own process anyway). */
#ifndef IDA_TESTS_STORAGE_FIXTURE_H
#define IDA_TESTS_STORAGE_FIXTURE_H

#include <criterion/criterion.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static inline void setup(void)
{
    cr_assert_eq(ida_test_tmpdir(tmp, sizeof(tmp), "storage"), 0);
    snprintf(dir, sizeof(dir), "%s/data/node1", tmp);
    opts = (struct ida_storage_opts){.cluster = "test", .node_id = 1};
    st_open = 0;
}

static inline void teardown(void)
{
    if (st_open) {
        ida_storage_close(&st);
    }
    ida_test_rmrf(tmp);
}

/* --- helpers --- */

static inline void open_ok(void)
{
    int rv = ida_storage_open(&st, dir, &opts);
    cr_assert_eq(rv, 0, "open: %s (%s)", idalloc_errname(rv), st.errmsg);
    st_open = 1;
}

static inline void close_st(void)
{
    ida_storage_close(&st);
    st_open = 0;
}

static inline void reopen(void)
{
    close_st();
    open_ok();
}

/* Append entries [first, first + count) of @term in one committed batch. */
static inline void append(ida_index first, size_t count, ida_term term)
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

static inline void set_hs(ida_term term, ida_node_id vote, ida_index commit)
{
    struct ida_hard_state hs = {term, vote, commit};
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), 0, "%s",
                 st.errmsg);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0, "%s", st.errmsg);
}

static inline struct ida_storage_log_state log_state(void)
{
    struct ida_storage_log_state ls;
    cr_assert_eq(ida_storage_log_state(&st, &ls), 0);
    return ls;
}

/* Entries [lo, hi] must be there, with term @term for those >= @from_term
 * and their deterministic content. */
static inline void expect_entries(ida_index lo, ida_index hi, ida_term term)
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

static inline void expect_msg(const char *needle)
{
    cr_assert(strstr(st.errmsg, needle) != NULL, "message \"%s\" lacks \"%s\"",
              st.errmsg, needle);
    cr_assert(strncmp(st.errmsg, dir, strlen(dir)) == 0,
              "message \"%s\" must start with the directory", st.errmsg);
    cr_assert_null(strchr(st.errmsg, '\n'), "one line: %s", st.errmsg);
}

/* Put (@key, @val) into database @db (NULL: main) of the environment in
 * @path directly through LMDB (the storage must be closed). */
static inline void poke(const char *path,
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
static inline size_t peek(const char *path,
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
static inline size_t count_records(const char *path, const char *db)
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

/* --- snapshots and compaction --- */

static inline uint8_t *make_state(size_t size)
{
    uint8_t *p = malloc(size + 1);
    ida_test_fill(p, size, size, 77);
    return p;
}

/* Write a snapshot of @size bytes in uneven pieces. */
static inline void save_snapshot(ida_index index, ida_term term, size_t size)
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

static inline void expect_snapshot(ida_index index, ida_term term, size_t size)
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

/* End a forked child: send @result (one byte) to the parent, then die by
 * SIGKILL. Dying by signal keeps the child's exit out of valgrind's leak
 * report, which would otherwise flag allocations Criterion made before the
 * fork; a memory error in the child still shows on stderr (and aborts it
 * under ASan, so no result arrives and the test fails). */
static inline _Noreturn void child_finish(int fd, int result)
{
    unsigned char c = (unsigned char)result;
    if (write(fd, &c, 1) != 1) {
        _exit(1);
    }
    raise(SIGKILL);
    _exit(1);
}

/* The result a child sent before dying; -1 when it sent none. */
static inline int child_result(pid_t pid, int fd)
{
    unsigned char c;
    ssize_t n = read(fd, &c, 1);
    close(fd);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return n == 1 ? c : -1;
}

#endif /* IDA_TESTS_STORAGE_FIXTURE_H */
