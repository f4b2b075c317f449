/* Ownership of what the node's messages carry (src/node/msgs.h): a state
 * machine the raft processor checked travels with the apply step of the
 * snapshot it was restored from, inside the storage step that installs it,
 * and whatever path drops the message (a failed storage step, a stopping
 * node) frees it. The leak checks are ASan's and valgrind's (make asan,
 * make valgrind); the test makes every path run. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "src/node/msgs.h"

/* An apply step installing a snapshot at @index, carrying a state machine
 * restored from it. */
static struct ida_nm_apply *apply_with_state(ida_index index)
{
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    uint8_t *snap;
    size_t len;
    cr_assert_eq(ida_fsm_snapshot(f, &snap, &len), 0);
    cr_assert_eq(ida_fsm_restore(f, snap, len), 0);
    ida_free(snap);
    struct ida_nm_apply *a = ida_calloc(1, sizeof(*a));
    cr_assert_not_null(a);
    a->has_snapshot = 1;
    a->snap_index = index;
    a->snap_term = 1;
    a->snap_len = len;
    a->fsm = f;
    a->entries = node_entries_copy(
        &(struct ida_entry){.index = index + 1, .term = 1, .len = 0}, 1);
    a->n_entries = 1;
    return a;
}

Test(msgs, an_apply_step_frees_the_state_it_carries)
{
    ida_nm_apply_free(apply_with_state(7));
    struct ida_msg *m = node_msg_new(IDA_NM_APPLY, apply_with_state(8));
    cr_assert_not_null(m);
    node_msg_free(m);
}

/* A storage step that fails (or is dropped at shutdown) frees the apply
 * step it would have forwarded, and the state machine with it. */
Test(msgs, a_dropped_storage_step_frees_the_state_it_would_forward)
{
    struct ida_nm_persist *p = ida_calloc(1, sizeof(*p));
    cr_assert_not_null(p);
    p->batch_id = 3;
    p->has_snapshot = 1;
    p->snap_index = 9;
    p->snap_term = 1;
    p->snap_data = ida_malloc(4);
    memcpy(p->snap_data, "snap", 4);
    p->snap_len = 4;
    p->apply_after = apply_with_state(9);
    struct ida_msg *m = node_msg_new(IDA_NM_PERSIST, p);
    cr_assert_not_null(m);
    node_msg_free(m);
}
