/* src/node/bgsnap: a forked child encodes the state machine while the
 * parent goes on; what it hands back is byte for byte the in-line
 * snapshot of the state at the fork, and a child that dies costs nothing. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/node/bgsnap.h"
#include "tests/fsm/fsm_helpers.h"

static struct fx_batch b;
static uint64_t seq;

static void add_tags(struct ida_fsm *f, int from, int n)
{
    struct ida_fsm_applied out;
    for (int i = from; i < from + n;) {
        fx_batch_init(&b, 1000);
        for (int k = 0; k < 32 && i < from + n; k++, i++) {
            char tag[64];
            snprintf(tag, sizeof(tag), "user-%d", i);
            fx_add_alloc(&b, 1, ++seq, "p", tag);
        }
        fx_apply(f, &b, &out);
    }
}

static struct ida_fsm *filled(int n)
{
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    fx_register(f, 1, 1000); /* the session the commands below use */
    fx_batch_init(&b, 1000);
    fx_add_create(&b, 1, ++seq, "p", IDALLOC__POOL_KIND__POOL_KIND_BOUNDED,
                  1u << 22);
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    add_tags(f, 0, n);
    return f;
}

static int wait_done(struct ida_bgsnap *bg, uint8_t **data, size_t *len)
{
    for (int i = 0; i < 100000; i++) {
        int rv = ida_bgsnap_poll(bg, 1 << 16, data, len);
        if (rv != 0) {
            return rv;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return 0;
}

Test(bgsnap, child_output_is_the_state_at_the_fork)
{
    struct ida_fsm *f = filled(20000);
    size_t want_len;
    uint8_t *want = fx_snapshot(f, &want_len);
    ida_index at = ida_fsm_applied_index(f);
    struct ida_bgsnap bg = {0};
    cr_assert_eq(ida_bgsnap_start(&bg, f, at, 7), 0);
    cr_assert_eq(ida_bgsnap_start(&bg, f, at, 7), IDA_EBUSY);
    /* The parent changes its state while the child encodes. */
    add_tags(f, 20000, 5000);
    uint8_t *got;
    size_t got_len;
    cr_assert_eq(wait_done(&bg, &got, &got_len), 1);
    cr_assert_not(ida_bgsnap_running(&bg));
    cr_assert_eq(got_len, want_len);
    cr_assert_eq(memcmp(got, want, want_len), 0,
                 "the child's snapshot is not the state at the fork");
    /* And it restores. */
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_restore(g, got, got_len), 0);
    cr_assert_eq(ida_fsm_applied_index(g), at);
    ida_fsm_free(g);
    ida_free(got);
    ida_free(want);
    ida_fsm_free(f);
}

Test(bgsnap, a_killed_child_is_a_failure_not_a_snapshot)
{
    struct ida_fsm *f = filled(200000);
    struct ida_bgsnap bg = {0};
    cr_assert_eq(ida_bgsnap_start(&bg, f, 1, 1), 0);
    kill(bg.pid, SIGKILL);
    uint8_t *got = NULL;
    size_t len = 0;
    int rv = wait_done(&bg, &got, &len);
    cr_assert_lt(rv, 0, "a killed child gave a snapshot (%d)", rv);
    cr_assert_null(got);
    cr_assert_not(ida_bgsnap_running(&bg));
    /* Cancel mid-run reaps the child; a new job can start. */
    cr_assert_eq(ida_bgsnap_start(&bg, f, 1, 1), 0);
    ida_bgsnap_cancel(&bg);
    cr_assert_not(ida_bgsnap_running(&bg));
    cr_assert_eq(ida_bgsnap_start(&bg, f, 1, 1), 0);
    cr_assert_eq(wait_done(&bg, &got, &len), 1);
    ida_free(got);
    ida_fsm_free(f);
}

/* Streamed (ida_bgsnap_read): slices in order, with no gap, that make the
 * same bytes; done only once the child exited after all of them. */
Test(bgsnap, streamed_slices_are_the_snapshot_in_order)
{
    struct ida_fsm *f = filled(20000);
    size_t want_len;
    uint8_t *want = fx_snapshot(f, &want_len);
    cr_assert_gt(want_len, 20000 * 8, "the tags are in the state");
    struct ida_bgsnap bg = {0};
    cr_assert_eq(ida_bgsnap_start(&bg, f, ida_fsm_applied_index(f), 7), 0);
    add_tags(f, 20000, 5000);
    uint8_t *got = ida_malloc(want_len);
    uint8_t slice[3000];
    uint64_t next = 0;
    int rv = 0, slices = 0;
    for (int i = 0; i < 100000 && rv == 0; i++) {
        struct ida_bgsnap_slice sl;
        rv = ida_bgsnap_read(&bg, slice, sizeof(slice), &sl);
        cr_assert_geq(rv, 0);
        if (sl.len == 0) {
            if (rv == 0) {
                nanosleep(&(struct timespec){0, 100000}, NULL);
            }
            continue;
        }
        cr_assert_eq(sl.offset, next, "a gap or an overlap");
        cr_assert_eq(sl.total, want_len);
        cr_assert_leq(sl.offset + sl.len, want_len);
        memcpy(got + sl.offset, slice, sl.len);
        next += sl.len;
        slices++;
    }
    cr_assert_eq(rv, 1);
    cr_assert_eq(next, want_len);
    cr_assert_gt(slices, 1);
    cr_assert_eq(memcmp(got, want, want_len), 0);
    cr_assert_not(ida_bgsnap_running(&bg));
    /* A killed child ends the stream with a failure. */
    cr_assert_eq(ida_bgsnap_start(&bg, f, 1, 1), 0);
    kill(bg.pid, SIGKILL);
    for (int i = 0; i < 100000 && rv >= 0 && ida_bgsnap_running(&bg); i++) {
        struct ida_bgsnap_slice sl;
        rv = ida_bgsnap_read(&bg, slice, sizeof(slice), &sl);
        if (rv == 0) {
            nanosleep(&(struct timespec){0, 100000}, NULL);
        }
    }
    cr_assert_lt(rv, 0, "a killed child ended a stream with %d", rv);
    ida_free(got);
    ida_free(want);
    ida_fsm_free(f);
}

static int wait_mem(struct ida_bgsnap *bg, const uint8_t **data, size_t *len)
{
    for (int i = 0; i < 100000; i++) {
        int rv = ida_bgsnap_poll_mem(bg, data, len);
        if (rv != 0) {
            return rv;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return 0;
}

/* Into a memory file (a backup's copy): the same bytes, mapped; a killed
 * child is a failure; a pipe job is not polled as one. */
Test(bgsnap, memory_file_output_is_the_state_at_the_fork)
{
    struct ida_fsm *f = filled(20000);
    size_t want_len;
    uint8_t *want = fx_snapshot(f, &want_len);
    ida_index at = ida_fsm_applied_index(f);
    struct ida_bgsnap bg = {0};
    cr_assert_eq(ida_bgsnap_start_mem(&bg, f, at, 7), 0);
    cr_assert_eq(ida_bgsnap_start_mem(&bg, f, at, 7), IDA_EBUSY);
    add_tags(f, 20000, 5000);
    const uint8_t *got = NULL;
    size_t got_len = 0;
    cr_assert_eq(wait_mem(&bg, &got, &got_len), 1);
    cr_assert_not(ida_bgsnap_running(&bg));
    cr_assert_eq(got_len, want_len);
    cr_assert_eq(memcmp(got, want, want_len), 0,
                 "the child's copy is not the state at the fork");
    ida_bgsnap_unmap(got, got_len);
    ida_free(want);
    ida_fsm_free(f);

    /* Large enough that the child is still encoding when it is killed. */
    f = filled(200000);
    cr_assert_eq(ida_bgsnap_start_mem(&bg, f, at, 7), 0);
    kill(bg.pid, SIGKILL);
    got = NULL;
    cr_assert_lt(wait_mem(&bg, &got, &got_len), 0);
    cr_assert_null(got);
    cr_assert_not(ida_bgsnap_running(&bg));

    cr_assert_eq(ida_bgsnap_start(&bg, f, at, 7), 0);
    cr_assert_eq(ida_bgsnap_poll_mem(&bg, &got, &got_len), -IDA_EINVAL);
    ida_bgsnap_cancel(&bg);
    ida_fsm_free(f);
}
