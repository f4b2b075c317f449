/* storage/: a read-only directory and a full disk.
 *
 * unshare(), mount() and the MS_* constants need _GNU_SOURCE: the read-only
 * and disk-full cases run in a forked child inside a private mount namespace
 * (the tests run as root, for whom chmod does not make anything read-only). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <sched.h>
#include <signal.h>
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

#include "tests/storage/fixture.h"

TestSuite(storage, .init = setup, .fini = teardown);

/* --- read-only directory and full disk (private mount namespace) --- */

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
        cr_skip_test(
            "cannot create a private mount namespace here (needs "
            "CAP_SYS_ADMIN: run as root)");
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
    opts.log_segment_bytes = 64 * 1024; /* the smallest */
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
    /* An open makes a new log segment: on the full disk it may fail, and
     * says why. */
    rv = ida_storage_open(&s, dir, &opts);
    if (rv == 0) {
        ida_storage_close(&s);
    } else {
        CHILD_CHECK(rv == IDA_ENOSPC && strstr(s.errmsg, "no space") != NULL,
                    "reopen on the full disk gave %s: %s", idalloc_errname(rv),
                    s.errmsg);
    }
    /* With room again, everything acknowledged is there. */
    CHILD_CHECK(mount("tmpfs", tmp, "tmpfs", MS_REMOUNT, "size=640k") == 0,
                "remount: %s", strerror(errno));
    CHILD_CHECK(ida_storage_open(&s, dir, &opts) == 0, "reopen: %s", s.errmsg);
    struct ida_storage_log_state ls;
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
        cr_skip_test(
            "cannot create a private mount namespace here (needs "
            "CAP_SYS_ADMIN: run as root)");
    }
    cr_assert_eq(rv, 0, "disk-full child failed (see its stderr)");
}
