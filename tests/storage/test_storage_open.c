/* storage/: open, identity and format checks, foreign directories, use
 * after fork, stale readers, corrupt records. */
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
    expect_msg("format version 7 is newer than this program's (4)");
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

/* Put entries [@first, @first + @count) of @term into the "log" database
 * of the closed storage, as format 3 and before kept them. */
static void put_old_entries(ida_index first, size_t count, ida_term term)
{
    struct ida_entry es[64];
    cr_assert_leq(count, 64);
    uint8_t *block = ida_test_make_entries(es, count, first, term, DATA_MAX);
    for (size_t i = 0; i < count; i++) {
        uint8_t key[8], val[IDA__REC_ENTRY_HDR_BYTES + DATA_MAX + 1];
        ida__put_be64(key, es[i].index);
        ida__rec_entry_header(val, &es[i]);
        memcpy(val + IDA__REC_ENTRY_HDR_BYTES, es[i].data, es[i].len);
        poke(dir, "log", key, 8, val, IDA__REC_ENTRY_HDR_BYTES + es[i].len);
    }
    ida_free(block);
}

static uint32_t format_of(const char *d)
{
    uint8_t back[64];
    cr_assert_eq(peek(d, "meta", "format", 6, back, sizeof(back)),
                 IDA__REC_FORMAT_BYTES);
    uint32_t version;
    cr_assert_eq(ida__rec_format_decode(back, IDA__REC_FORMAT_BYTES, &version),
                 0);
    return version;
}

/* A directory of format 3 or 2 (the log in LMDB's "log" database) opens
 * with its state: the entries move into log/ once, the database goes, and
 * the directory is format 4 (a format-3 program then refuses it as
 * newer). A log/ left by a move that did not finish is made again. */
Test(storage, old_formats_move_their_log_out_of_lmdb)
{
    for (uint32_t old = 2; old <= 3; old++) {
        teardown();
        setup();
        open_ok();
        set_hs(3, 2, 0);
        uint64_t incarnation = st.identity.incarnation;
        close_st();
        put_old_entries(1, 40, 2);
        put_old_entries(41, 20, 3);
        struct ida_hard_state hs = {3, 2, 45};
        uint8_t rec[IDA__REC_HARD_STATE_BYTES];
        ida__rec_hard_state_encode(rec, &hs);
        poke(dir, "meta", "hard_state", 10, rec, sizeof(rec));
        uint8_t fmt[IDA__REC_FORMAT_BYTES];
        ida__rec_format_encode(fmt, old);
        poke(dir, "meta", "format", 6, fmt, sizeof(fmt));
        /* The log/ of the format-4 start above: to the open, a move that
         * did not finish. */
        open_ok();
        cr_assert_eq(st.identity.upgraded_from, old);
        cr_assert_eq(st.identity.incarnation, incarnation, "the same one");
        expect_entries(1, 40, 2);
        expect_entries(41, 60, 3);
        struct ida_hard_state now;
        cr_assert_eq(ida_storage_hard_state(&st, &now), 0);
        cr_assert(now.term == 3 && now.vote == 2 && now.commit == 45,
                  "%llu %u %llu", (unsigned long long)now.term, now.vote,
                  (unsigned long long)now.commit);
        append(61, 5, 3);
        close_st();
        cr_assert_eq(format_of(dir), IDA_STORAGE_FORMAT_VERSION);
        uint8_t key[8], back[64];
        ida__put_be64(key, 1);
        cr_assert_eq(peek(dir, "log", key, 8, back, sizeof(back)), 0,
                     "the \"log\" database is gone");
        open_ok();
        cr_assert_eq(st.identity.upgraded_from, 0, "once");
        expect_entries(1, 40, 2);
        expect_entries(41, 65, 3);
        cr_assert_eq(log_state().last, 65);
    }
}

/* What a move would remove must be a log's: anything else in log/ is
 * refused, and the directory stays as it was. */
Test(storage, a_move_never_removes_what_is_not_a_log)
{
    open_ok();
    close_st();
    put_old_entries(1, 5, 1);
    uint8_t fmt[IDA__REC_FORMAT_BYTES];
    ida__rec_format_encode(fmt, 3);
    poke(dir, "meta", "format", 6, fmt, sizeof(fmt));
    char file[600];
    snprintf(file, sizeof(file), "%s/%s/notes.txt", dir, IDA_STORAGE_LOG_DIR);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_EFOREIGN);
    expect_msg("holds \"notes.txt\", not a log segment; refusing to remove");
    cr_assert_eq(access(file, F_OK), 0, "kept");
    cr_assert_eq(format_of(dir), 3);
    cr_assert_eq(unlink(file), 0);
    open_ok();
    expect_entries(1, 5, 1);
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

/* The path of the first segment file of log/ (by name: by sequence). */
static void first_segment(char *out, size_t cap)
{
    char logdir[500];
    snprintf(logdir, sizeof(logdir), "%s/%s", dir, IDA_STORAGE_LOG_DIR);
    DIR *d = opendir(logdir);
    cr_assert_not_null(d);
    char best[256] = "";
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "seg-", 4) == 0 &&
            (best[0] == '\0' || strcmp(de->d_name, best) < 0)) {
            snprintf(best, sizeof(best), "%s", de->d_name);
        }
    }
    closedir(d);
    cr_assert_neq(best[0], '\0', "a segment");
    snprintf(out, cap, "%s/%s", logdir, best);
}

/* Flip a bit in the last byte of record @k (from 0) of segment @path
 * (records from offset 4096, each a 24-byte header with its length at 4,
 * the bytes, zeros to a multiple of 8: storage/seglog.h). */
static void flip_record(const char *path, int k)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0, "%s", path);
    off_t off = 4096;
    uint8_t h[24];
    for (int i = 0;; i++) {
        cr_assert_eq(pread(fd, h, sizeof(h), off), (ssize_t)sizeof(h));
        uint32_t len = (uint32_t)h[4] | (uint32_t)h[5] << 8 |
                       (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
        cr_assert_gt(len, 0, "record %d is there", i);
        if (i == k) {
            uint8_t b;
            off_t at = off + 24 + len - 1;
            cr_assert_eq(pread(fd, &b, 1, at), 1);
            b ^= 0x40;
            cr_assert_eq(pwrite(fd, &b, 1, at), 1);
            break;
        }
        off += (off_t)((24 + len + 7) / 8 * 8);
    }
    cr_assert_eq(close(fd), 0);
}

/* A hash of the names and contents of the files in log/. */
static uint64_t hash_log(void)
{
    char logdir[500], p[800];
    snprintf(logdir, sizeof(logdir), "%s/%s", dir, IDA_STORAGE_LOG_DIR);
    DIR *d = opendir(logdir);
    cr_assert_not_null(d);
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') {
            continue;
        }
        uint64_t h = 14695981039346656037ull;
        for (const char *c = de->d_name; *c; c++) {
            h = (h ^ (uint8_t)*c) * 1099511628211ull;
        }
        snprintf(p, sizeof(p), "%s/%s", logdir, de->d_name);
        FILE *f = fopen(p, "rb");
        cr_assert_not_null(f, "%s", p);
        int c;
        while ((c = fgetc(f)) != EOF) {
            h = (h ^ (uint8_t)c) * 1099511628211ull;
        }
        fclose(f);
        sum += h; /* order independent */
    }
    closedir(d);
    return sum;
}

/* A record of the log that no longer checks: read back under an open
 * storage, its entries are refused; at open, with records after it that
 * were durable, the directory is refused as damaged and its log left as
 * it is (data.mdb has counted the start: ida_storage_boot()). */
Test(storage, a_corrupt_entry_is_reported_not_returned)
{
    open_ok();
    for (ida_index i = 1; i <= 10; i += 2) {
        append(i, 2, 1); /* a record each */
    }
    char seg[700];
    first_segment(seg, sizeof(seg));
    flip_record(seg, 1); /* entries 3 and 4 */
    struct ida_entry *es;
    size_t cnt;
    cr_assert_eq(ida_storage_entries(&st, 1, 11, 0, &es, &cnt), IDA_ECORRUPT);
    cr_assert_eq(ida_storage_entries(&st, 1, 3, 0, &es, &cnt), 0);
    cr_assert_eq(cnt, 2);
    ida_free(es);
    cr_assert_eq(ida_storage_entries(&st, 5, 11, 0, &es, &cnt), 0);
    ida_free(es);
    close_st();
    uint64_t before = hash_log();
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT);
    expect_msg("log: ");
    expect_msg("refusing to open it");
    cr_assert_eq(hash_log(), before, "nothing written to the log");
}

/* A log/ gone, or put back older, where the directory says it had one. */
Test(storage, a_lost_or_rolled_back_log_is_refused)
{
    open_ok();
    append(1, 10, 1);
    close_st();
    char logdir[400], saved[400], cmd[1400];
    snprintf(logdir, sizeof(logdir), "%s/%s", dir, IDA_STORAGE_LOG_DIR);
    snprintf(saved, sizeof(saved), "%s/saved-log", tmp);
    snprintf(cmd, sizeof(cmd), "cp -a '%s' '%s'", logdir, saved);
    cr_assert_eq(system(cmd), 0);
    open_ok();
    append(11, 10, 1);
    close_st();
    /* Put back the copy: it lacks records LMDB recorded durable. */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", logdir, saved,
             logdir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ECORRUPT);
    expect_msg("log: ");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", logdir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE);
    expect_msg("has lost its log");
}
