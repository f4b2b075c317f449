/* Unit tests of the Raft core (raft/raft.h): configuration and input
 * validation. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(raft, .init = setup3, .fini = teardown);

/* --- configuration and input validation ---------------------------------- */

Test(raft_config, rejects_bad_configs)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    ida_raft_close(&r);
    c = base_config();
    c.id = 0;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
    c = base_config();
    c.election_ticks = 1;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
    c = base_config();
    c.voters[2] = 2;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL, "duplicate voter");
    c = base_config();
    c.max_inflight = IDA_RAFT_INFLIGHT_MAX + 1;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
    c = base_config();
    c.snapshot_max_inflight = IDA_RAFT_INFLIGHT_MAX + 1;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), IDA_EINVAL);
    c.snapshot_max_inflight = IDA_RAFT_INFLIGHT_MAX;
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    ida_raft_close(&r);
}

Test(raft_config, rejects_inconsistent_restore)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    struct ida_entry e[2] = {{.term = 1, .index = 1}, {.term = 1, .index = 3}};
    struct ida_raft_restore st = {
        .hard_state = {.term = 1}, .entries = e, .n_entries = 2};
    cr_assert_eq(ida_raft_init(&r, &c, &st), IDA_EINVAL, "index gap");
    e[1].index = 2;
    e[1].term = 2;
    cr_assert_eq(ida_raft_init(&r, &c, &st), IDA_EINVAL,
                 "entry term above the hard state term");
    st.hard_state.term = 2;
    uint8_t junk[3] = {0xff, 0xff, 0xff};
    e[1].type = IDA_ENTRY_CONFIG;
    e[1].data = junk;
    e[1].len = sizeof(junk);
    cr_assert_eq(ida_raft_init(&r, &c, &st), IDA_EINVAL, "corrupt config");
    e[1].type = IDA_ENTRY_NORMAL;
    e[1].data = NULL;
    e[1].len = 0;
    st.hard_state.vote = 2;
    st.hard_state.commit = 2;
    cr_assert_eq(ida_raft_init(&r, &c, &st), 0);
    cr_assert_eq(ida_raft_last_index(&r), 2);
    cr_assert_eq(ida_raft_term(&r), 2);
    cr_assert_eq(ida_raft_commit(&r), 2);
    ida_raft_close(&r);
}

Test(raft_config, step_rejects_misaddressed_messages)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    struct ida_raft_msg m = vote_req(2, 3, 1, 0, 0);
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "addressed to node 3");
    m = vote_req(0, 1, 1, 0, 0);
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "from node 0");
    m = vote_req(2, 1, 0, 0, 0);
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "term 0");
    m.type = 99;
    m.term = 1;
    cr_assert_eq(ida_raft_step(&r, &m), IDA_EINVAL, "unknown type");
    cr_assert_eq(ida_raft_term(&r), 0, "rejected input changes nothing");
    ida_raft_close(&r);
}

/* A node at term 5 steps an InstallSnapshot and an AppendEntries of term
 * 2 from node 2: both must be answered with term 5. */
static void stale_messages_are_answered(bool pre_vote, bool check_quorum)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    c.pre_vote = pre_vote;
    c.check_quorum = check_quorum;
    struct ida_raft_restore rs = {.hard_state = {.term = 5}};
    cr_assert_eq(ida_raft_init(&r, &c, &rs), 0);
    static const uint8_t data[4] = {1, 2, 3, 4};
    enum ida_raft_msg_type types[2] = {IDA_RAFT_MSG_INSTALL_SNAPSHOT,
                                       IDA_RAFT_MSG_APPEND_ENTRIES};
    for (int k = 0; k < 2; k++) {
        struct ida_raft_msg m;
        memset(&m, 0, sizeof(m));
        m.type = types[k];
        m.from = 2;
        m.to = 1;
        m.term = 2;
        if (k == 0) {
            m.u.install_snapshot.last_index = 48;
            m.u.install_snapshot.last_term = 2;
            m.u.install_snapshot.data = data;
            m.u.install_snapshot.len = sizeof(data);
            m.u.install_snapshot.total_size = sizeof(data);
            m.u.install_snapshot.done = true;
        }
        cr_assert_eq(ida_raft_step(&r, &m), 0);
        struct ida_raft_batch b;
        cr_assert(ida_raft_ready(&r, &b), "no answer to a stale message");
        bool answered = false;
        for (size_t i = 0; i < b.n_msgs; i++) {
            answered |= b.msgs[i].to == 2 && b.msgs[i].term == 5;
        }
        cr_assert(answered, "the stale leader must hear term 5 (type %d)",
                  (int)types[k]);
        cr_assert_eq(ida_raft_term(&r), 5, "our term does not change");
        if (b.id != 0) {
            ida_raft_persisted(&r, b.id);
        }
    }
    ida_raft_close(&r);
}

/* A node that moved to a higher term must tell a stale leader, or with
 * pre-vote and check-quorum neither side ever moves: the node's pre-votes
 * are refused (the leader is alive) and it ignores the leader's lower-term
 * messages. A node that fell behind gets only InstallSnapshot chunks, so
 * those must be answered like appends (simulator liveness seed 103056). */
Test(raft, stale_install_snapshot_is_answered_with_the_higher_term)
{
    stale_messages_are_answered(true, true);
}

/* Without either option too: the node's own campaigns reach only the
 * members its log names, which may leave the stale leader out (simulator
 * liveness seed 7722996). */
Test(raft, stale_messages_are_answered_without_pre_vote_or_check_quorum)
{
    stale_messages_are_answered(false, false);
    stale_messages_are_answered(true, false);
    stale_messages_are_answered(false, true);
}

Test(raft_config, propose_fails_fast_when_not_leader)
{
    struct ida_raft r;
    struct ida_raft_config c = base_config();
    cr_assert_eq(ida_raft_init(&r, &c, NULL), 0);
    uint8_t d = 1;
    cr_assert_eq(ida_raft_propose(&r, IDA_ENTRY_NORMAL, &d, 1, NULL, NULL),
                 IDA_ENOTLEADER);
    cr_assert_eq(ida_raft_read_index(&r, 1), IDA_ENOTLEADER);
    cr_assert_eq(ida_raft_transfer(&r, 2), IDA_ENOTLEADER);
    cr_assert_eq(ida_raft_last_index(&r), 0);
    ida_raft_close(&r);
}
