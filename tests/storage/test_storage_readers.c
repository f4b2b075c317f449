/* storage/: readers on other threads while the owner writes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#include "tests/storage/fixture.h"

TestSuite(storage, .init = setup, .fini = teardown);

/* --- concurrent readers --- */

/* Readers run until told to stop AND have completed at least one read. */
static atomic_int readers_stop;

static void *reader_main(void *arg)
{
    (void)arg;
    long reads = 0;
    while (!atomic_load(&readers_stop) || reads == 0) {
        struct ida_storage_log_state ls;
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
