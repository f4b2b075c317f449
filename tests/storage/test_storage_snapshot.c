/* storage/: snapshots in chunks, the snapshot writer, compaction, two
 * storages in one process. */
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <signal.h>
#include <stdint.h>
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

/* --- snapshots and compaction --- */

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
    struct ida_storage_log_state ls = log_state();
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
    struct ida_storage_log_state ls = log_state();
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
    struct ida_storage_log_state ls = log_state();
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
    struct ida_storage_log_state ls;
    cr_assert_eq(ida_storage_log_state(&two, &ls), 0);
    cr_assert_eq(ls.last, 0, "separate environments");
    ida_storage_close(&two);
}

/* --- the map: room made before a large write, pages given back --- */

/* kB of this process's resident file-backed pages (/proc/self/status). */
static long rss_file_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "RssFile: %ld kB", &kb) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb;
}

Test(storage, reserve_grows_the_map_once_before_a_large_snapshot)
{
    opts.map_size_bytes = 1 << 20;
    opts.map_size_max_bytes = 256 << 20;
    open_ok();
    size_t size = 24u << 20;
    cr_assert_eq(ida_storage_reserve(&st, size), 0);
    uint64_t map = ida_storage_map_size(&st);
    cr_assert_geq(map, size + size / 8, "room for the snapshot");
    save_snapshot(10, 2, size);
    cr_assert_eq(ida_storage_map_size(&st), map, "no growth while writing");
    expect_snapshot(10, 2, size);
    cr_assert_eq(ida_storage_reserve(&st, UINT64_C(1) << 40), IDA_ENOSPC,
                 "beyond map_size_max_bytes");
}

Test(storage, released_pages_leave_the_resident_size_not_the_data)
{
    open_ok();
    size_t size = 32u << 20;
    save_snapshot(10, 2, size);
    expect_snapshot(10, 2, size); /* reads every chunk through the map */
    long before = rss_file_kb();
    cr_assert_gt(before, 30 * 1024, "the read mapped the snapshot's pages");
    for (int i = 0; i < 64; i++) {
        ida_storage_release_pages(&st, 4u << 20); /* wraps past the end */
    }
    long after = rss_file_kb();
    cr_assert_lt(after, before - 28 * 1024, "RssFile %ld kB -> %ld kB", before,
                 after);
    expect_snapshot(10, 2, size); /* the same bytes, mapped again */
    /* The map grows (LMDB maps it again, perhaps elsewhere): released
     * from where it is now. */
    uint64_t map = ida_storage_map_size(&st);
    cr_assert_eq(ida_storage_reserve(&st, map * 2), 0);
    cr_assert_gt(ida_storage_map_size(&st), map);
    expect_snapshot(10, 2, size);
    before = rss_file_kb();
    cr_assert_gt(before, 30 * 1024);
    for (int i = 0; i < 64; i++) {
        ida_storage_release_pages(&st, 4u << 20);
    }
    after = rss_file_kb();
    cr_assert_lt(after, before - 28 * 1024, "after growth: %ld kB -> %ld kB",
                 before, after);
    expect_snapshot(10, 2, size);
    append(1, 10, 2);
    ida_storage_release_pages(&st, SIZE_MAX);
    reopen();
    expect_snapshot(10, 2, size);
}

/* A snapshot written as it arrived is installed only if the writer holds
 * exactly the bytes the installing batch carries. */
Test(storage, writer_holds_exactly_its_bytes)
{
    open_ok();
    size_t size = 2 * IDA_STORAGE_CHUNK_BYTES + 77;
    uint8_t *state = make_state(size);
    struct ida_snapshot_writer w;
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20}; /* as saved */
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w, 5, 1, config, sizeof(config)), 0);
    cr_assert_eq(ida_storage_snapshot_write(&st, &w, state, 1000), 0);
    cr_assert_not(ida_storage_snapshot_writer_holds(
                      &w, 5, 1, config, sizeof(config), state, size),
                  "only part of it");
    cr_assert_eq(ida_storage_snapshot_write(&st, &w, state + 1000, size - 1000),
                 0);
    cr_assert(ida_storage_snapshot_writer_holds(&w, 5, 1, config,
                                                sizeof(config), state, size));
    state[size / 2] ^= 1;
    cr_assert_not(ida_storage_snapshot_writer_holds(
                      &w, 5, 1, config, sizeof(config), state, size),
                  "one bit differs");
    state[size / 2] ^= 1;
    cr_assert_not(ida_storage_snapshot_writer_holds(
        &w, 5, 1, config, sizeof(config), state, size - 1));
    cr_assert_eq(ida_storage_snapshot_finish(&st, &w), 0);
    free(state);
    expect_snapshot(5, 1, size);
}

/* A snapshot streamed before its membership was known: the membership set
 * last is the one stored with it, and survives a reopen. */
Test(storage, membership_set_after_the_bytes_is_stored)
{
    open_ok();
    size_t size = IDA_STORAGE_CHUNK_BYTES + 5;
    uint8_t *state = make_state(size);
    struct ida_snapshot_writer w;
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 6, 2, NULL, 0), 0);
    cr_assert_eq(ida_storage_snapshot_write(&st, &w, state, size), 0);
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20};
    uint8_t big[IDA_STORAGE_CONFIG_BYTES_MAX + 1] = {0};
    cr_assert_eq(ida_storage_snapshot_set_config(&w, big, sizeof(big)),
                 IDA_ETOOBIG);
    cr_assert_eq(ida_storage_snapshot_set_config(&w, config, sizeof(config)),
                 0);
    cr_assert(ida_storage_snapshot_writer_holds(&w, 6, 2, config,
                                                sizeof(config), state, size));
    cr_assert_eq(ida_storage_snapshot_finish(&st, &w), 0);
    reopen();
    struct ida_snapshot_meta m;
    cr_assert_eq(ida_storage_snapshot_meta(&st, &m), 0);
    cr_assert_eq(m.index, 6);
    cr_assert_eq(m.config_len, sizeof(config));
    cr_assert_eq(memcmp(m.config, config, sizeof(config)), 0);
    ida_snapshot_meta_release(&m);
    expect_snapshot(6, 2, size);
    free(state);
}

/* A lazy finish leaves the replaced snapshot's chunks for tidy steps; a
 * second lazy finish before they are gone deletes its own predecessor in
 * its commit; what a crash leaves is collected at the next open. */
Test(storage, lazy_finish_leaves_the_replaced_chunks_to_tidy)
{
    open_ok();
    size_t size = 5 * IDA_STORAGE_CHUNK_BYTES;
    uint8_t *state = make_state(size);
    struct ida_snapshot_writer w;
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20}; /* as saved */
    int more = 1;
    size_t two = 2 * (IDA_STORAGE_CHUNK_BYTES + 4); /* a chunk: CRC, bytes */
    cr_assert_eq(ida_storage_snapshot_tidy(&st, two, &more), 0);
    cr_assert_not(more, "nothing to tidy");
    for (ida_index i = 1; i <= 3; i++) {
        cr_assert_eq(
            ida_storage_snapshot_begin(&st, &w, i, 1, config, sizeof(config)),
            0);
        cr_assert_eq(ida_storage_snapshot_write(&st, &w, state, size), 0);
        cr_assert_eq(ida_storage_snapshot_finish_lazy(&st, &w), 0);
    }
    close_st();
    /* 2's commit left 1 to tidy; 3's deleted 2 (1 still waiting): 1 and
     * 3 remain. */
    cr_assert_eq(count_records(dir, "snap"), 10);
    open_ok(); /* collects 1's */
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 5);
    open_ok();
    expect_snapshot(3, 1, size);
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w, 4, 1, config, sizeof(config)), 0);
    uint8_t *small = make_state(100);
    cr_assert_eq(ida_storage_snapshot_write(&st, &w, small, 100), 0);
    free(small);
    cr_assert_eq(ida_storage_snapshot_finish_lazy(&st, &w), 0);
    int steps = 0;
    do {
        cr_assert_eq(ida_storage_snapshot_tidy(&st, two, &more), 0);
        steps++;
    } while (more);
    cr_assert_eq(steps, 3, "5 chunks, 2 at a time");
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 1);
    open_ok();
    expect_snapshot(4, 1, 100);
    free(state);
}

/* --- snapshot bytes carried by log batches (ida_storage_batch_snapshot) --- */

/* Append entries [first, first + count) of term 1 with @len bytes of @w's
 * snapshot from @data in one batch; returns the commit's result. */
static int append_with_snapshot(ida_index first,
                                size_t count,
                                struct ida_snapshot_writer *w,
                                const uint8_t *data,
                                size_t len)
{
    struct ida_entry es[16];
    cr_assert_leq(count, 16);
    uint8_t *block = ida_test_make_entries(es, count, first, 1, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    if (count > 0) {
        cr_assert_eq(ida_storage_batch_append(&st, &b, es, count), 0);
    }
    cr_assert_eq(ida_storage_batch_snapshot(&st, &b, w, data, len), 0, "%s",
                 st.errmsg);
    int rv = ida_storage_batch_commit(&st, &b);
    ida_free(block);
    return rv;
}

/* A snapshot stored in pieces that ride in log batches is the same as one
 * written on its own: every byte, every entry, and pieces that only fill
 * the writer's buffer cost no commit. */
Test(storage, snapshot_bytes_ride_in_log_batches)
{
    open_ok();
    size_t size = 3 * IDA_STORAGE_CHUNK_BYTES + 777;
    uint8_t *state = make_state(size);
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20};
    struct ida_snapshot_writer w;
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w, 3, 1, config, sizeof(config)), 0);
    size_t off = 0, piece = 700;
    ida_index next = 1;
    while (off < size) {
        size_t n = size - off < piece ? size - off : piece;
        cr_assert_eq(append_with_snapshot(next, 4, &w, state + off, n), 0, "%s",
                     st.errmsg);
        off += n;
        next += 4;
        piece = piece * 3 + 17; /* below, across and past a chunk */
        cr_assert(ida_storage_snapshot_writer_holds(&w, 3, 1, config,
                                                    sizeof(config), state, off),
                  "the writer advanced by each batch (%zu bytes)", off);
    }
    cr_assert(ida_storage_snapshot_writer_holds(&w, 3, 1, config,
                                                sizeof(config), state, size));
    /* Bytes that do not fill the buffer, in a batch that changes nothing
     * else: no transaction (a commit fault that must not fire). */
    struct ida_snapshot_writer w2;
    cr_assert_eq(ida_storage_snapshot_finish(&st, &w), 0, "%s", st.errmsg);
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w2, 5, 1, config, sizeof(config)), 0);
    ida__storage_fault_set(&st, -1, 0, EIO);
    cr_assert_eq(append_with_snapshot(next, 0, &w2, state, 100), 0);
    cr_assert_eq(ida_storage_failed(&st), 0, "no commit was made");
    ida__storage_fault_set(&st, -1, -1, 0);
    cr_assert_eq(append_with_snapshot(next, 0, &w2, state + 100, size - 100), 0,
                 "%s", st.errmsg);
    cr_assert(ida_storage_snapshot_writer_holds(&w2, 5, 1, config,
                                                sizeof(config), state, size));
    ida_storage_snapshot_abort(&st, &w2);
    free(state);
    reopen();
    expect_snapshot(3, 1, size);
    expect_entries(1, next - 1, 1);
}

/* A batch that fails at any put stores neither its entries nor its
 * snapshot bytes, and the writer is where it was: the same batch tried again
 * stores both. A failed commit (sticky) leaves nothing of either on disk. */
Test(storage, a_failed_batch_stores_neither_its_entries_nor_its_snapshot_bytes)
{
    open_ok();
    append(1, 5, 1);
    size_t size = 2 * IDA_STORAGE_CHUNK_BYTES + 99;
    uint8_t *state = make_state(size);
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20};
    struct ida_snapshot_writer w;
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w, 5, 1, config, sizeof(config)), 0);
    /* 100 bytes wait in the buffer; the batch then fills two chunks and
     * leaves 99 bytes in it. */
    cr_assert_eq(ida_storage_snapshot_write(&st, &w, state, 100), 0);
    int failures = 0;
    for (int n = 0;; n++) {
        ida__storage_fault_set(&st, n, -1, ENOMEM); /* transient */
        int rv = append_with_snapshot(6, 3, &w, state + 100, size - 100);
        ida__storage_fault_set(&st, -1, -1, 0);
        if (rv == 0) {
            break;
        }
        failures++;
        cr_assert_eq(rv, IDA_ENOMEM, "put %d: %s", n, st.errmsg);
        cr_assert_eq(log_state().last, 5, "no entry of the failed batch");
        cr_assert(ida_storage_snapshot_writer_holds(&w, 5, 1, config,
                                                    sizeof(config), state, 100),
                  "the writer did not advance (put %d)", n);
    }
    cr_assert_eq(failures, 2,
                 "two chunks (the entries go to the log, after): %d", failures);
    cr_assert_eq(log_state().last, 8);
    cr_assert(ida_storage_snapshot_writer_holds(&w, 5, 1, config,
                                                sizeof(config), state, size));
    cr_assert_eq(ida_storage_snapshot_finish(&st, &w), 0, "%s", st.errmsg);
    reopen();
    expect_snapshot(5, 1, size);
    expect_entries(6, 8, 1);

    /* A failed commit: sticky, and nothing of the batch on disk. */
    close_st();
    size_t chunks = count_records(dir, "snap");
    open_ok();
    struct ida_snapshot_writer w2;
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w2, 8, 1, config, sizeof(config)), 0);
    ida__storage_fault_set(&st, -1, 0, EIO);
    cr_assert_eq(append_with_snapshot(9, 2, &w2, state, size), IDA_EIO);
    ida_storage_snapshot_abort(&st, &w2);
    close_st();
    cr_assert_eq(count_records(dir, "snap"), chunks, "no chunk of it");
    open_ok();
    cr_assert_eq(log_state().last, 8, "no entry of it");
    expect_snapshot(5, 1, size);
    free(state);
}

Test(storage, snapshot_bytes_once_per_batch_and_only_with_a_writer)
{
    open_ok();
    uint8_t state[10] = {0};
    struct ida_snapshot_writer w, none = {0};
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_snapshot(&st, &b, &none, state, 10),
                 IDA_EINVAL, "no writer is active");
    expect_msg("without a writer");
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 1, 1, NULL, 0), 0);
    cr_assert_eq(ida_storage_batch_snapshot(&st, &b, &w, state, 10), 0);
    cr_assert_eq(ida_storage_batch_snapshot(&st, &b, &w, state, 10),
                 IDA_EINVAL);
    expect_msg("twice in one batch");
    cr_assert_eq(ida_storage_failed(&st), 0, "not sticky");
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0);
    cr_assert(ida_storage_snapshot_writer_holds(&w, 1, 1, NULL, 0, state, 10),
              "the first call's bytes, once");
    ida_storage_snapshot_abort(&st, &w);
}

/* --- snapshots stored before chunk_bytes (record.h, "IDAS") --- */

/* Rewrite the current snapshot in @path (storage closed) as a version
 * before chunk_bytes wrote it: IDA__REC_CHUNK_BYTES_V1 chunks, "IDAS";
 * with the byte at @flip (< size) changed under chunk checksums made right
 * for it, so only the checksum of the whole state can tell. */
static void rewrite_as_v1_flipped(const char *path, size_t size, long flip)
{
    uint8_t rec[512];
    size_t rlen = peek(path, "meta", "snapshot", 8, rec, sizeof(rec));
    cr_assert_gt(rlen, 0);
    struct ida__rec_snapshot r;
    cr_assert_eq(ida__rec_snapshot_decode(rec, rlen, &r), 0);
    cr_assert_eq(r.chunk_bytes, IDA_STORAGE_CHUNK_BYTES, "written as now");
    uint8_t config[64];
    cr_assert_leq(r.config_len, sizeof(config));
    memcpy(config, r.config, r.config_len);
    r.config = config;
    uint8_t *state = make_state(size);
    if (flip >= 0) {
        state[flip] ^= 0x20;
    }
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi snap, meta;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 4);
    cr_assert_eq(mdb_env_set_mapsize(env, 64u << 20), 0);
    cr_assert_eq(mdb_env_open(env, path, 0, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "snap", 0, &snap), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    cr_assert_eq(mdb_drop(txn, snap, 0), 0);
    r.chunk_bytes = IDA__REC_CHUNK_BYTES_V1;
    r.chunks = (size + r.chunk_bytes - 1) / r.chunk_bytes;
    for (uint64_t c = 0; c < r.chunks; c++) {
        size_t off = (size_t)c * r.chunk_bytes;
        size_t n = size - off < r.chunk_bytes ? size - off : r.chunk_bytes;
        uint8_t kb[16], *v = malloc(4 + n);
        ida__put_be64(kb, r.id);
        ida__put_be64(kb + 8, c);
        ida__put_be32(v, ida__rec_chunk_crc(r.id, c, state + off, n));
        memcpy(v + 4, state + off, n);
        MDB_val k = {16, kb}, d = {4 + n, v};
        cr_assert_eq(mdb_put(txn, snap, &k, &d, 0), 0);
        free(v);
    }
    rlen = ida__rec_snapshot_encode(rec, &r);
    cr_assert_eq(memcmp(rec, "IDAS", 4), 0);
    MDB_val k = {8, "snapshot"}, d = {rlen, rec};
    cr_assert_eq(mdb_put(txn, meta, &k, &d, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    free(state);
}

static void rewrite_as_v1(const char *path, size_t size)
{
    rewrite_as_v1_flipped(path, size, -1);
}

#define V1_SNAPSHOT_BYTES (3 * IDA__REC_CHUNK_BYTES_V1 + 4321)

/* A state whose chunks each pass their own checksum but which together
 * are not the state stored (a byte changed with its chunk's checksum made
 * right, in the first, a middle and the last chunk) is refused whole at
 * load: the state's checksum, folded in as the chunks are copied, tells. */
Test(storage, a_state_failing_its_whole_checksum_is_refused_at_load)
{
    const long flips[] = {0, 2 * IDA__REC_CHUNK_BYTES_V1 + 5,
                          V1_SNAPSHOT_BYTES - 1};
    for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
        opts.map_size_bytes = 64u << 20;
        open_ok();
        save_snapshot(10 + i, 2, V1_SNAPSHOT_BYTES);
        close_st();
        rewrite_as_v1_flipped(dir, V1_SNAPSHOT_BYTES, flips[i]);
        open_ok();
        struct ida_snapshot_meta m;
        uint8_t *data = NULL;
        cr_assert_eq(ida_storage_snapshot_load(&st, &m, &data), IDA_ECORRUPT,
                     "byte %ld changed", flips[i]);
        cr_assert_null(data);
        close_st();
    }
}

/* Save a snapshot of @size bytes (index 10, term 2), flip bit @mask of
 * byte @at of chunk @c's stored value (its 4-byte checksum, then its data)
 * behind storage's back, and open again; the snapshot's id. */
static uint64_t save_and_damage_chunk(size_t size,
                                      uint64_t c,
                                      size_t at,
                                      uint8_t mask)
{
    opts.map_size_bytes = 64u << 20;
    open_ok();
    save_snapshot(10, 2, size);
    close_st();
    uint8_t rec[512];
    size_t rlen = peek(dir, "meta", "snapshot", 8, rec, sizeof(rec));
    struct ida__rec_snapshot r;
    cr_assert_eq(ida__rec_snapshot_decode(rec, rlen, &r), 0);
    uint8_t kb[16], val[IDA_STORAGE_CHUNK_BYTES + 64];
    ida__put_be64(kb, r.id);
    ida__put_be64(kb + 8, c);
    size_t n = peek(dir, "snap", kb, 16, val, sizeof(val));
    cr_assert_gt(n, at);
    val[at] ^= mask;
    poke(dir, "snap", kb, 16, val, n);
    open_ok();
    return r.id;
}

static void expect_load_refused(void)
{
    struct ida_snapshot_meta m;
    uint8_t *data = NULL;
    cr_assert_eq(ida_storage_snapshot_load(&st, &m, &data), IDA_ECORRUPT);
    cr_assert_null(data);
}

/* A chunk whose stored bytes no longer match its own checksum: a load
 * refuses the state, and a read of that chunk for a follower refuses it,
 * while the chunks around it still read. */
Test(storage, a_damaged_chunk_is_refused_at_load_and_when_read)
{
    const size_t size = 3 * IDA_STORAGE_CHUNK_BYTES + 123;
    uint64_t id =
        save_and_damage_chunk(size, 1, IDA__REC_CHUNK_HDR_BYTES + 17, 0x04);
    expect_load_refused();
    uint8_t *buf = malloc(IDA_STORAGE_CHUNK_BYTES);
    size_t got;
    cr_assert_eq(ida_storage_snapshot_read(&st, id, IDA_STORAGE_CHUNK_BYTES,
                                           buf, IDA_STORAGE_CHUNK_BYTES, &got),
                 IDA_ECORRUPT);
    uint8_t *want = make_state(size);
    for (uint64_t c = 0; c < 4; c += 1 + (c == 0)) { /* 0, 2, the short 3 */
        cr_assert_eq(
            ida_storage_snapshot_read(&st, id, c * IDA_STORAGE_CHUNK_BYTES, buf,
                                      IDA_STORAGE_CHUNK_BYTES, &got),
            0, "chunk %llu", (unsigned long long)c);
        cr_assert_eq(memcmp(buf, want + c * IDA_STORAGE_CHUNK_BYTES, got), 0);
    }
    free(want);
    free(buf);
    close_st();
}

/* A chunk whose data is whole but whose own checksum was damaged (the
 * short last one): refused at load as at a read (a node that loaded it
 * would fail every send of it to a follower). */
Test(storage, a_chunk_with_a_damaged_checksum_is_refused_at_load)
{
    save_and_damage_chunk(2 * IDA_STORAGE_CHUNK_BYTES + 9, 2, 1, 0x01);
    expect_load_refused();
    close_st();
}

/* Open a directory whose current snapshot (index 10, term 2,
 * V1_SNAPSHOT_BYTES) an older version stored in four 64 KiB chunks. */
static void open_with_v1_snapshot(void)
{
    opts.map_size_bytes = 64u << 20;
    open_ok();
    save_snapshot(10, 2, V1_SNAPSHOT_BYTES);
    close_st();
    rewrite_as_v1(dir, V1_SNAPSHOT_BYTES);
    cr_assert_eq(count_records(dir, "snap"), 4);
    open_ok();
}

/* A directory whose snapshot an older version stored in 64 KiB chunks is
 * read as it was (restart, reads at any offset for a follower), and the
 * next snapshot replaces it in the chunks of now. */
Test(storage, a_snapshot_in_64_kib_chunks_of_before_is_read)
{
    size_t size = V1_SNAPSHOT_BYTES;
    open_with_v1_snapshot();
    expect_snapshot(10, 2, size);
    struct ida_snapshot_meta m;
    cr_assert_eq(ida_storage_snapshot_meta(&st, &m), 0);
    uint8_t *want = make_state(size);
    uint8_t buf[3000];
    uint64_t offs[] = {0, IDA__REC_CHUNK_BYTES_V1 - 1000,
                       2 * IDA__REC_CHUNK_BYTES_V1 + 17, size - 100};
    for (size_t i = 0; i < 4; i++) {
        size_t n;
        cr_assert_eq(
            ida_storage_snapshot_read(&st, m.id, offs[i], buf, sizeof(buf), &n),
            0);
        cr_assert_eq(
            n, size - offs[i] < sizeof(buf) ? size - offs[i] : sizeof(buf));
        cr_assert_eq(memcmp(buf, want + offs[i], n), 0, "offset %llu",
                     (unsigned long long)offs[i]);
    }
    ida_snapshot_meta_release(&m);
    free(want);
    size_t size2 = 5 * IDA_STORAGE_CHUNK_BYTES + 1;
    save_snapshot(20, 2, size2);
    expect_snapshot(20, 2, size2);
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 6, "only the new one's chunks");
    open_ok();
}

/* Tidying a replaced snapshot is bounded by bytes, so the 64 KiB chunks of
 * one an older version stored go one per commit under a budget of four of
 * today's chunks, not four of theirs at a time. */
Test(storage, replaced_chunks_of_before_are_tidied_by_bytes)
{
    open_with_v1_snapshot();
    const uint8_t config[] = {0x0a, 0x03, 0x08, 0x01, 0x20};
    uint8_t *small = make_state(100);
    struct ida_snapshot_writer w;
    cr_assert_eq(
        ida_storage_snapshot_begin(&st, &w, 20, 2, config, sizeof(config)), 0);
    cr_assert_eq(ida_storage_snapshot_write(&st, &w, small, 100), 0);
    cr_assert_eq(ida_storage_snapshot_finish_lazy(&st, &w), 0);
    free(small);
    int more, steps = 0;
    do {
        cr_assert_eq(
            ida_storage_snapshot_tidy(&st, 4 * IDA_STORAGE_CHUNK_BYTES, &more),
            0);
        steps++;
    } while (more);
    cr_assert_eq(steps, 4, "one 64 KiB chunk per commit (%d)", steps);
    close_st();
    cr_assert_eq(count_records(dir, "snap"), 1, "only the new one's chunk");
    open_ok();
    expect_snapshot(20, 2, 100);
}

/* A snapshot record whose chunk count does not fit its size and chunk
 * size is refused at open, not read past its chunks. */
Test(storage, a_snapshot_record_with_a_wrong_chunk_count_is_refused)
{
    open_ok();
    save_snapshot(10, 2, 3 * IDA_STORAGE_CHUNK_BYTES + 5);
    close_st();
    uint8_t rec[512];
    size_t rlen = peek(dir, "meta", "snapshot", 8, rec, sizeof(rec));
    struct ida__rec_snapshot r;
    cr_assert_eq(ida__rec_snapshot_decode(rec, rlen, &r), 0);
    uint8_t config[64];
    memcpy(config, r.config, r.config_len);
    r.config = config;
    r.chunks = 3; /* four are needed */
    uint8_t bad[512];
    size_t blen = ida__rec_snapshot_encode(bad, &r);
    cr_assert_eq(ida__rec_snapshot_decode(bad, blen, &r), IDA_ECORRUPT);
    poke(dir, "meta", "snapshot", 8, bad, blen);
    int rv = ida_storage_open(&st, dir, &opts);
    cr_assert_eq(rv, IDA_ECORRUPT, "refused: %s", idalloc_errname(rv));
}
