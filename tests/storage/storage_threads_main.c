/* storage_threads: the threading contract under ThreadSanitizer
 * (`make tsan-storage`; Criterion cannot start under TSan here). The owner
 * thread appends batches and replaces snapshots in a map that starts at
 * 64 KiB, so it grows many times, while two reader threads read entries and
 * snapshot chunks. Every read must be whole and correct. Exit 0 on success. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#define DATA_MAX 200

static struct ida_storage st;
static atomic_int stop;

static void fill_state(uint8_t *p, size_t size)
{
    ida_test_fill(p, size, size, 5);
}

static void *entries_reader(void *arg)
{
    (void)arg;
    long reads = 0;
    while (!atomic_load(&stop) || reads == 0) {
        struct ida_storage_log_state ls;
        if (ida_storage_log_state(&st, &ls) != 0) {
            return (void *)-1;
        }
        if (ls.last < ls.first) {
            continue;
        }
        struct ida_entry *es;
        size_t n;
        ida_index lo = ls.last > 40 ? ls.last - 40 : ls.first;
        if (lo < ls.first) {
            lo = ls.first;
        }
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

static void *snapshot_reader(void *arg)
{
    (void)arg;
    long complete = 0;
    uint8_t *buf = malloc(1 << 20);
    uint8_t *want = malloc(1 << 20);
    while (!atomic_load(&stop) || complete == 0) {
        struct ida_snapshot_meta m;
        int rv = ida_storage_snapshot_meta(&st, &m);
        if (rv == IDA_ENOTFOUND) {
            continue;
        }
        if (rv != 0) {
            return (void *)-1;
        }
        uint64_t off = 0;
        size_t n = 1;
        while (rv == 0 && n > 0) {
            rv = ida_storage_snapshot_read(&st, m.id, off, buf + off, 5000, &n);
            off += n;
        }
        size_t size = (size_t)m.data_size;
        ida_snapshot_meta_release(&m);
        if (rv == IDA_ENOTFOUND) {
            continue;
        }
        fill_state(want, size);
        if (rv != 0 || off != size || memcmp(buf, want, size) != 0) {
            return (void *)-2;
        }
        complete++;
    }
    free(buf);
    free(want);
    return (void *)complete;
}

int main(void)
{
    char tmp[256], dir[300];
    if (ida_test_tmpdir(tmp, sizeof(tmp), "threads") != 0) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(dir, sizeof(dir), "%s/node1", tmp);
    struct ida_storage_opts o = {
        .cluster = "threads", .node_id = 1, .map_size_bytes = 64 * 1024};
    if (ida_storage_open(&st, dir, &o) != 0) {
        fprintf(stderr, "%s\n", st.errmsg);
        return 1;
    }
    pthread_t th[2];
    pthread_create(&th[0], NULL, entries_reader, NULL);
    pthread_create(&th[1], NULL, snapshot_reader, NULL);
    uint8_t *state = malloc(1 << 20);
    struct ida_entry es[50];
    int rv = 0;
    for (ida_index i = 1; rv == 0 && i <= 5000; i += 50) {
        uint8_t *block = ida_test_make_entries(es, 50, i, 1, DATA_MAX);
        struct ida_storage_batch b;
        ida_storage_batch_init(&st, &b);
        rv = ida_storage_batch_append(&st, &b, es, 50);
        if (rv == 0) {
            rv = ida_storage_batch_commit(&st, &b);
        }
        ida_free(block);
        if (rv == 0 && i % 500 == 1) {
            size_t size = (size_t)(i * 97) % (1 << 20);
            fill_state(state, size);
            struct ida_snapshot_writer w;
            rv = ida_storage_snapshot_begin(&st, &w, i, 1, NULL, 0);
            if (rv == 0) {
                rv = ida_storage_snapshot_write(&st, &w, state, size);
            }
            rv = rv == 0 ? ida_storage_snapshot_finish(&st, &w) : rv;
            rv = rv == 0 && i > 100 ? ida_storage_compact(&st, i - 100) : rv;
        }
    }
    atomic_store(&stop, 1);
    long r0, r1;
    void *r;
    pthread_join(th[0], &r);
    r0 = (long)r;
    pthread_join(th[1], &r);
    r1 = (long)r;
    printf(
        "storage threads: owner %s, entry reads %ld, whole snapshot reads "
        "%ld, map %llu bytes\n",
        rv == 0 ? "ok" : st.errmsg, r0, r1,
        (unsigned long long)ida_storage_map_size(&st));
    ida_storage_close(&st);
    free(state);
    ida_test_rmrf(tmp);
    return rv == 0 && r0 > 0 && r1 > 0 ? 0 : 1;
}
