/* storage/: log and hard state: round trips, validation, truncation, failed
 * puts and commits, map growth. */
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
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

/* --- log and hard state --- */

Test(storage, append_read_and_reopen_round_trip)
{
    open_ok();
    append(1, 10, 1);
    append(11, 5, 2);
    set_hs(2, 3, 12);
    expect_entries(1, 10, 1);
    expect_entries(11, 15, 2);
    struct ida_storage_log_state ls = log_state();
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
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), IDA_ETOOBIG);
    expect_msg("more than a log segment holds");
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
    struct ida_storage_log_state ls = log_state();
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
        /* ENOMEM from a put (of the term and vote, which go first): a
         * transient failure, nothing is written. */
        ida__storage_fault_set(&st, n, -1, ENOMEM);
        int rv = ida_storage_batch_commit(&st, &b);
        ida__storage_fault_set(&st, -1, -1, 0);
        if (rv == 0) {
            break;
        }
        failures++;
        cr_assert_eq(rv, IDA_ENOMEM, "put %d: %s", n, st.errmsg);
        cr_assert_eq(ida_storage_failed(&st), 0, "not sticky");
        struct ida_storage_log_state ls = log_state();
        cr_assert_eq(ls.last, 4, "put %d: nothing of the batch", n);
        expect_entries(1, 4, 1);
        struct ida_hard_state now;
        cr_assert_eq(ida_storage_hard_state(&st, &now), 0);
        cr_assert_eq(now.term, 1);
    }
    cr_assert_eq(failures, 2,
                 "the hard state and the log's LSN: 2 puts (the entries go "
                 "to the log)");
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

/* The LMDB part of a batch (a new term and vote) that fills the map: the
 * map grows and the transaction runs again; the entries follow. */
Test(storage, injected_map_full_grows_and_replays_the_batch)
{
    opts.map_size_bytes = 256 * 1024;
    open_ok();
    append(1, 5, 1);
    ida__storage_fault_set(&st, 1, -1, MDB_MAP_FULL); /* the second put */
    struct ida_entry es[3];
    uint8_t *block = ida_test_make_entries(es, 3, 6, 2, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 3), 0);
    struct ida_hard_state hs = {2, 1, 7};
    cr_assert_eq(ida_storage_batch_set_hard_state(&st, &b, &hs), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0, "%s", st.errmsg);
    ida_free(block);
    cr_assert_eq(ida_storage_map_size(&st), 512 * 1024);
    reopen();
    expect_entries(1, 5, 1);
    expect_entries(6, 8, 2);
    struct ida_hard_state now;
    cr_assert_eq(ida_storage_hard_state(&st, &now), 0);
    cr_assert(now.term == 2 && now.vote == 1 && now.commit == 7);
}

/* LMDB full at its maximum (snapshot bytes riding in a batch): the batch
 * fails whole, not stickily, and the log takes the next one. */
Test(storage, full_map_at_its_maximum_fails_cleanly)
{
    opts.map_size_bytes = 128 * 1024;
    opts.map_size_max_bytes = 512 * 1024;
    open_ok();
    append(1, 5, 1);
    set_hs(1, 1, 5);
    size_t size = 1 << 20;
    uint8_t *state = make_state(size);
    struct ida_snapshot_writer w;
    cr_assert_eq(ida_storage_snapshot_begin(&st, &w, 5, 1, NULL, 0), 0);
    struct ida_entry es[2];
    uint8_t *block = ida_test_make_entries(es, 2, 6, 1, DATA_MAX);
    struct ida_storage_batch b;
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 2), 0);
    cr_assert_eq(ida_storage_batch_snapshot(&st, &b, &w, state, size), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), IDA_ENOSPC);
    expect_msg("map full at its maximum of 524288 bytes");
    cr_assert_eq(ida_storage_failed(&st), 0, "a full map is not sticky");
    cr_assert_eq(log_state().last, 5, "nothing of the batch");
    ida_storage_snapshot_abort(&st, &w);
    ida_storage_batch_init(&st, &b);
    cr_assert_eq(ida_storage_batch_append(&st, &b, es, 2), 0);
    cr_assert_eq(ida_storage_batch_commit(&st, &b), 0, "%s", st.errmsg);
    ida_free(block);
    free(state);
    reopen();
    expect_entries(1, 7, 1);
}
