/* storage/: open, identity and format checks, foreign directories, use
 * after fork, stale readers, corrupt records. */
#include <criterion/criterion.h>
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

TestSuite(storage, .init = setup, .fini = teardown);

/* --- open, identity, format --- */

Test(storage, first_open_creates_an_empty_node)
{
    open_ok();
    struct ida_storage_log_state ls = log_state();
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
    expect_msg("format version 7 is newer than this program's (3)");
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

/* A format-2 directory (the layout of format 3, snapshots in 64 KiB
 * chunks) opens with its state, and is marked format 3 as it opens: from
 * then on it may hold snapshots a format-2 program cannot read. */
Test(storage, format_2_is_upgraded_to_3_in_place)
{
    open_ok();
    append(1, 3, 1);
    cr_assert_eq(st.identity.upgraded_from, 0);
    uint64_t incarnation = st.identity.incarnation;
    close_st();
    uint8_t rec[IDA__REC_FORMAT_BYTES];
    ida__rec_format_encode(rec, 2);
    poke(dir, "meta", "format", 6, rec, sizeof(rec));
    open_ok();
    cr_assert_eq(st.identity.upgraded_from, 2);
    cr_assert_eq(st.identity.incarnation, incarnation, "the same directory");
    expect_entries(1, 3, 1);
    close_st();
    uint8_t back[64];
    cr_assert_eq(peek(dir, "meta", "format", 6, back, sizeof(back)),
                 sizeof(rec));
    uint32_t version;
    cr_assert_eq(ida__rec_format_decode(back, sizeof(rec), &version), 0);
    cr_assert_eq(version, 3);
    open_ok();
    cr_assert_eq(st.identity.upgraded_from, 0, "once");
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
        struct ida_storage_log_state ls;
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
