/* Error top keeper: counting, eviction, expiry, dump/restore round trip,
 * corrupt and missing files. Files live in a fresh directory under /tmp. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idalloc_errors.h"
#include "src/node/errtop.h"
#include "src/pool/pool.h"

/* --- fixture ----------------------------------------------------------------
 */

static char dir[64];
static char path[128];
static struct ida_errtop top;

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ida-errtop-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/errtop.pb", dir);
    /* Huge dump interval: dumps happen only when a test asks. */
    cr_assert_eq(ida_errtop_init(&top, path, 3, 1000000000, 0), 0);
}

static void teardown(void)
{
    ida_errtop_close(&top);
    char tmp[160];
    unlink(path);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    unlink(tmp);
    rmdir(dir);
}

TestSuite(errtop, .init = setup, .fini = teardown);

/* --- tests ------------------------------------------------------------------
 */

Test(errtop, counts_distinct_errors)
{
    ida_errtop_add(&top, IDA_EIO, "fsync failed", 100);
    ida_errtop_add(&top, IDA_EIO, "fsync failed", 200);
    ida_errtop_add(&top, IDA_EIO, "write failed", 300);
    ida_errtop_add(&top, IDA_EBUSY, "fsync failed", 400);
    const struct ida_errtop_entry *e =
        ida_errtop_find(&top, IDA_EIO, "fsync failed");
    cr_assert_not_null(e);
    cr_assert_eq(e->count, 2);
    cr_assert_eq(e->last_seen_ms, 200);
    cr_assert_eq(ida_errtop_find(&top, IDA_EBUSY, "fsync failed")->count, 1,
                 "same text, other code: another error");
    cr_assert_null(ida_errtop_find(&top, IDA_EIO, "nope"));
    cr_assert_eq(top.n, 3);
}

Test(errtop, full_top_evicts_least_frequent_oldest)
{
    char text[32];
    for (int i = 0; i < IDA_ERRTOP_SIZE; i++) {
        snprintf(text, sizeof(text), "e%d", i);
        /* e0 three times, the others twice, except e5 once at time 10. */
        int times = i == 0 ? 3 : (i == 5 ? 1 : 2);
        for (int k = 0; k < times; k++) {
            ida_errtop_add(&top, IDA_EIO, text, i == 5 ? 10 : 1000 + i);
        }
    }
    cr_assert_eq(top.n, IDA_ERRTOP_SIZE);
    ida_errtop_add(&top, IDA_EIO, "new", 5000);
    cr_assert_eq(top.n, IDA_ERRTOP_SIZE, "bounded");
    cr_assert_null(ida_errtop_find(&top, IDA_EIO, "e5"), "least frequent goes");
    cr_assert_not_null(ida_errtop_find(&top, IDA_EIO, "new"));
    ida_errtop_add(&top, IDA_EIO, "newer", 6000);
    /* "new" (count 1, seen at 5000) is now the least frequent. */
    cr_assert_null(ida_errtop_find(&top, IDA_EIO, "new"));
    cr_assert_not_null(ida_errtop_find(&top, IDA_EIO, "e0"));
}

Test(errtop, old_errors_expire)
{
    struct ida_errtop t;
    cr_assert_eq(ida_errtop_init(&t, NULL, 1, 1000, 1000), 0);
    ida_errtop_add(&t, IDA_EIO, "old", 10000);
    ida_errtop_add(&t, IDA_EIO, "recent", 10500);
    ida_errtop_add(&t, IDA_EIO, "now", 11200);
    cr_assert_null(ida_errtop_find(&t, IDA_EIO, "old"), "seen 1.2 s ago");
    cr_assert_not_null(ida_errtop_find(&t, IDA_EIO, "recent"));
    cr_assert_eq(ida_errtop_dump(&t), IDA_EINVAL, "no path");
    ida_errtop_close(&t);
}

Test(errtop, long_texts_are_cut)
{
    char big[1000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ida_errtop_add(&top, IDA_EIO, big, 1);
    ida_errtop_add(&top, IDA_EIO, big, 2);
    cr_assert_eq(top.n, 1);
    cr_assert_eq(strlen(top.e[0].text), IDA_ERRTOP_TEXT_MAX);
    cr_assert_eq(top.e[0].count, 2);
}

Test(errtop, dump_and_restore_round_trip)
{
    ida_errtop_add(&top, IDA_EIO, "fsync failed", 100);
    ida_errtop_add(&top, IDA_EIO, "fsync failed", 200);
    ida_errtop_add(&top, IDA_ENOSPC, "disk full", 300);
    cr_assert(top.dirty);
    cr_assert_eq(ida_errtop_dump(&top), 0);
    cr_assert_not(top.dirty);

    struct ida_errtop back;
    cr_assert_eq(ida_errtop_init(&back, path, 3, 1000000000, 0), 0);
    cr_assert_eq(ida_errtop_restore(&back), 0);
    cr_assert_eq(back.n, 2);
    const struct ida_errtop_entry *e =
        ida_errtop_find(&back, IDA_EIO, "fsync failed");
    cr_assert_not_null(e);
    cr_assert_eq(e->count, 2);
    cr_assert_eq(e->last_seen_ms, 200);
    ida_errtop_close(&back);

    struct ida_errtop_entry out[4];
    size_t n = 0;
    cr_assert_eq(ida_errtop_read_file(path, out, 4, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(out[0].text, "fsync failed", "most frequent first");
    cr_assert_eq(out[1].code, IDA_ENOSPC);
}

Test(errtop, missing_file_restores_empty)
{
    ida_errtop_add(&top, IDA_EIO, "x", 1);
    cr_assert_eq(ida_errtop_restore(&top), 0);
    cr_assert_eq(top.n, 0);
    struct ida_errtop_entry out[1];
    size_t n;
    cr_assert_eq(ida_errtop_read_file(path, out, 1, &n), IDA_EIO);
}

Test(errtop, corrupt_file_is_refused_and_changes_nothing)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("\xff\xff\xff garbage", f);
    fclose(f);
    ida_errtop_add(&top, IDA_EIO, "kept", 1);
    cr_assert_eq(ida_errtop_restore(&top), IDA_ECORRUPT);
    cr_assert_eq(top.n, 1, "unchanged after a failed restore");
    cr_assert_not_null(ida_errtop_find(&top, IDA_EIO, "kept"));
}

Test(errtop, dump_into_missing_directory_fails_cleanly)
{
    struct ida_errtop t;
    cr_assert_eq(
        ida_errtop_init(&t, "/nonexistent-dir/x/errtop.pb", 1, 1000, 0), 0);
    ida_errtop_add(&t, IDA_EIO, "x", 1);
    cr_assert_eq(ida_errtop_dump(&t), IDA_EIO);
    cr_assert(t.dirty, "still to be dumped");
    ida_errtop_close(&t);
}

Test(errtop, automatic_dump_when_interval_passed)
{
    struct ida_errtop t;
    /* Interval 0: every add is due. */
    cr_assert_eq(ida_errtop_init(&t, path, 1, 0, 0), 0);
    ida_errtop_add(&t, IDA_EIO, "auto", 1);
    cr_assert_eq(access(path, F_OK), 0, "dumped without being asked");
    cr_assert_not(t.dirty);
    ida_errtop_close(&t);
}

/* --- the pool's error sink ------------------------------------------------ */

static void failing_receive(void *state,
                            struct ida_msg *msg,
                            struct ida_sender *s)
{
    (void)state;
    ida_sender_error(s, IDA_EIO, "disk on fire");
    ida_msg_free(msg);
}
static const struct ida_proc_ops failing_ops = {failing_receive, NULL};

Test(errtop_sink, processor_errors_reach_the_workers_error_top_file)
{
    char sdir[64];
    snprintf(sdir, sizeof(sdir), "/tmp/ida-pool-XXXXXX");
    cr_assert_not_null(mkdtemp(sdir));
    struct ida_pool_config cfg = {0};
    cfg.threads = 1;
    struct ida_errtop_where where = {sdir, 2};
    ida_errtop_sink(&cfg.errors, &where);
    struct ida_pool *pool;
    cr_assert_eq(ida_pool_new(&cfg, &pool), 0);
    uint32_t id;
    struct ida_proc_config c = {"failing", &failing_ops, NULL, 0, 0};
    cr_assert_eq(ida_pool_add(pool, &c, &id), 0);
    cr_assert_eq(ida_pool_start(pool), 0);
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(ida_pool_post(pool, id, ida_msg_new(1, 0)), 0);
    }
    /* Drain on the stopping thread has no error top: wait until the worker
     * handled all 7, so all are counted. */
    struct ida_pool_stats st;
    do {
        sched_yield();
        ida_pool_get_stats(pool, &st);
    } while (st.delivered < 7);
    ida_pool_stop(pool, IDA_POOL_STOP_DRAIN); /* the worker dumps on exit */
    char spath[128];
    snprintf(spath, sizeof(spath), "%s/errtop-0.pb", sdir);
    struct ida_errtop_entry out[4];
    size_t n = 0;
    cr_assert_eq(ida_errtop_read_file(spath, out, 4, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0].code, IDA_EIO);
    cr_assert_str_eq(out[0].text, "disk on fire");
    cr_assert_eq(out[0].count, 7);
    ida_pool_close(pool);
    unlink(spath);
    rmdir(sdir);
}
