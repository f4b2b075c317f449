/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): membership changes. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "src/node/convert.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

/* --- membership changes (dissertation §4.1) ------------------------------- */

TestSuite(raft_conf, .init = setup3, .fini = teardown);

static bool voters_are(ida_node_id id, const ida_node_id *v, size_t n)
{
    const struct ida_raft_conf *c = ida_raft_voters(&H.r[id]);
    if (c->n != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (ida_raft_conf_slot(c, v[i]) < 0) {
            return false;
        }
    }
    return true;
}

Test(raft_conf, add_a_voter)
{
    h_close();
    h_init(4);
    H.bootstrap_n = 3; /* node 4 is new: not in the bootstrap config */
    h_start_all();
    h_tick(4, 100);
    cr_assert_eq(ida_raft_role(&H.r[4]), IDA_RAFT_FOLLOWER,
                 "a non-member never campaigns");
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v4[] = {1, 2, 3, 4};
    cr_assert_eq(h_propose_conf(1, v4, 4), 0);
    cr_assert(voters_are(1, v4, 4), "in effect when appended");
    cr_assert_eq(h_propose_conf(1, v4, 3), IDA_EBUSY, "one change at a time");
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    for (int k = 1; k <= 4; k++) {
        cr_assert(voters_are((ida_node_id)k, v4, 4), "node %d", k);
        cr_assert_eq(ida_raft_commit(&H.r[k]), 2, "node %d", k);
    }
    /* 3 of 4 are now needed: with 3 and 4 down nothing commits. */
    h_crash(3);
    h_crash(4);
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 2);
    h_close();
}

Test(raft_conf, rejects_more_than_one_change)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id two_new[] = {1, 2, 3, 4, 5};
    cr_assert_eq(h_propose_conf(1, two_new, 5), IDA_EINVAL);
    const ida_node_id swap[] = {1, 2, 4};
    cr_assert_eq(h_propose_conf(1, swap, 3), IDA_EINVAL, "add + remove");
    uint8_t junk[2] = {0xff, 0x01};
    cr_assert_eq(
        ida_raft_propose(&H.r[1], IDA_ENTRY_CONFIG, junk, 2, NULL, NULL),
        IDA_EINVAL);
    cr_assert_eq(ida_raft_last_index(&H.r[1]), 1, "nothing appended");
}

/* The same members change no quorum: such a membership is accepted as an
 * entry that carries only what the application keeps in a membership (the
 * node's addresses, src/node/book.h), one change at a time like others. */
Test(raft_conf, same_members_is_an_entry_for_the_application)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id same[] = {1, 2, 3};
    ida_index last = ida_raft_last_index(&H.r[1]);
    cr_assert_eq(h_propose_conf(1, same, 3), 0);
    cr_assert_eq(ida_raft_last_index(&H.r[1]), last + 1);
    cr_assert_eq(h_propose_conf(1, same, 3), IDA_EBUSY, "one at a time");
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    for (int k = 1; k <= 3; k++) {
        cr_assert(voters_are((ida_node_id)k, same, 3), "node %d", k);
        cr_assert_eq(ida_raft_commit(&H.r[k]), last + 1, "node %d", k);
    }
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER);
}

Test(raft_conf, config_waits_for_the_leaders_first_commit)
{
    h_start_all();
    h_tick(1, 20);
    while (ida_raft_role(&H.r[1]) != IDA_RAFT_LEADER && h_deliver_one()) {
    }
    const ida_node_id v2[] = {1, 2};
    cr_assert_eq(h_propose_conf(1, v2, 2), IDA_EBUSY);
    h_deliver_all();
    cr_assert_eq(h_propose_conf(1, v2, 2), 0);
}

Test(raft_conf, remove_a_follower)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v2[] = {1, 2};
    cr_assert_eq(h_propose_conf(1, v2, 2), 0);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 2);
    h_crash(3);
    h_propose(1, 3);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 5, "2 of 2 commit without 3");
    h_crash(2);
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 5, "1 of 2 is no majority");
}

Test(raft_conf, removed_leader_steps_down_after_commit)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v23[] = {2, 3};
    H.cut[2][1] = H.cut[3][1] = true; /* acks do not come back yet */
    cr_assert_eq(h_propose_conf(1, v23, 2), 0);
    h_deliver_all();
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER,
                 "leads until the entry commits");
    h_heal();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_FOLLOWER);
    ida_node_id l = 0;
    for (int i = 0; i < 100 && l == 0; i++) {
        h_tick(2, 1);
        h_tick(3, 1);
        h_deliver_all();
        l = the_leader();
    }
    cr_assert(l == 2 || l == 3, "2 and 3 elect a leader without 1: %u", l);
    h_tick(1, 100);
    h_deliver_all();
    cr_assert_neq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER);
}

Test(raft_conf, truncated_config_entry_is_undone)
{
    h_start_all();
    uint8_t buf[64];
    size_t len;
    struct ida_raft_conf c = {.voters = {1, 2}, .n = 2};
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    struct ida_entry e = {.term = 1,
                          .index = 1,
                          .type = IDA_ENTRY_CONFIG,
                          .data = buf,
                          .len = len};
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_APPEND_ENTRIES;
    m.from = 1;
    m.to = 2;
    m.term = 1;
    m.u.append_entries.entries = &e;
    m.u.append_entries.n_entries = 1;
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    const ida_node_id v12[] = {1, 2}, v123[] = {1, 2, 3};
    cr_assert(voters_are(2, v12, 2), "in effect when appended");
    /* A leader of term 2 overwrites index 1: the config is undone. Node 3
     * is not in {1, 2}: node 2 hears it once it stopped hearing from 1
     * (ida_raft_step(): non-members wait out the lease). */
    h_tick(2, 10);
    struct ida_entry e2 = {.term = 2, .index = 1, .type = IDA_ENTRY_NOOP};
    m.from = 3;
    m.term = 2;
    m.u.append_entries.entries = &e2;
    cr_assert_eq(ida_raft_step(&H.r[2], &m), 0);
    cr_assert(voters_are(2, v123, 3));
}

Test(raft_conf, config_survives_compaction_and_restart)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    const ida_node_id v2[] = {1, 2};
    cr_assert_eq(h_propose_conf(1, v2, 2), 0);
    h_propose(1, 2);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[2]), 4);
    cr_assert_eq(ida_raft_compact(&H.r[2], 3, (const uint8_t *)"s", 1), 0);
    /* The harness disk keeps no compaction; rebuild node 2 from a disk
     * holding the snapshot and its config, as storage would. */
    struct ida_raft_batch b;
    ida_raft_ready(&H.r[2], &b);
    struct ida_raft_restore st = {
        .hard_state = H.disk[2].hs,
        .snapshot_index = 3,
        .snapshot_term = ida_raft_term_at(&H.r[2], 3),
        .snapshot_data = (const uint8_t *)"s",
        .snapshot_len = 1,
        .snapshot_config = H.r[2].snap_conf,
        .snapshot_config_len = H.r[2].snap_conf_len,
        .entries = ida_raft_entry(&H.r[2], 4),
        .n_entries = 1,
    };
    cr_assert_gt(st.snapshot_config_len, 0, "the snapshot keeps the config");
    struct ida_raft fresh;
    struct ida_raft_config cfg = H.r[2].cfg;
    cr_assert_eq(ida_raft_init(&fresh, &cfg, &st), 0);
    const struct ida_raft_conf *c = ida_raft_voters(&fresh);
    cr_assert_eq(c->n, 2);
    cr_assert_geq(ida_raft_conf_slot(c, 1), 0);
    cr_assert_geq(ida_raft_conf_slot(c, 2), 0);
    ida_raft_close(&fresh);
}

/* snapshot_take: the core keeps the caller's bytes (no copy) when init
 * succeeds and leaves them to the caller when it fails; both at once is
 * refused. ASan and valgrind (make asan, make valgrind) see a double free
 * or a leak if either side gets it wrong. */
Test(raft_conf, restart_snapshot_taken_without_copy)
{
    h_start_all();
    struct ida_raft_config cfg = H.r[1].cfg;
    struct ida_raft_restore st = {
        .hard_state = {.term = 2, .vote = 0, .commit = 3},
        .snapshot_index = 3,
        .snapshot_term = 2,
        .snapshot_len = 5,
    };
    st.snapshot_take = ida_malloc(5);
    memcpy(st.snapshot_take, "state", 5);
    struct ida_raft r;
    cr_assert_eq(ida_raft_init(&r, &cfg, &st), 0);
    cr_assert_eq(r.snap_data, st.snapshot_take, "kept, not copied");
    cr_assert_eq(r.snap_len, 5);
    ida_raft_close(&r); /* frees it */

    /* A failing init (an entry from a term past the hard state's) leaves
     * the bytes with the caller. */
    uint8_t *mine = ida_malloc(5);
    memcpy(mine, "state", 5);
    struct ida_entry e = {.index = 4, .term = 9, .type = IDA_ENTRY_NORMAL};
    st.snapshot_take = mine;
    st.entries = &e;
    st.n_entries = 1;
    cr_assert_eq(ida_raft_init(&r, &cfg, &st), IDA_EINVAL);
    cr_assert_eq(memcmp(mine, "state", 5), 0, "still the caller's");
    st.n_entries = 0;
    st.snapshot_data = (const uint8_t *)"state";
    cr_assert_eq(ida_raft_init(&r, &cfg, &st), IDA_EINVAL, "both given");
    ida_free(mine);
}

Test(raft_conf, learner_catches_up_without_voting_then_is_promoted)
{
    h_close();
    h_init(4);
    H.bootstrap_n = 3;
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_propose(1, 5);
    h_deliver_all();
    /* Add node 4 as a learner: same voters, one more learner. */
    struct ida_raft_conf c = {
        .voters = {1, 2, 3}, .n = 3, .learners = {4}, .n_learners = 1};
    uint8_t buf[128];
    size_t len;
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(
        ida_raft_propose(&H.r[1], IDA_ENTRY_CONFIG, buf, len, NULL, NULL), 0);
    h_collect(1);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_last_index(&H.r[4]), ida_raft_last_index(&H.r[1]),
                 "the learner received the log");
    cr_assert_eq(ida_raft_voters(&H.r[1])->n, 3, "but does not vote");
    h_tick(4, 100);
    cr_assert_eq(ida_raft_role(&H.r[4]), IDA_RAFT_FOLLOWER,
                 "a learner never campaigns");
    cr_assert_eq(ida_raft_transfer(&H.r[1], 4), IDA_EINVAL,
                 "nor takes leadership");
    /* With 2 and 3 down, leader + learner are no majority of 3 voters. */
    h_crash(2);
    h_crash(3);
    ida_index commit = ida_raft_commit(&H.r[1]);
    h_propose(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), commit);
    /* Promote it: 4 voters, and 1 + 4 make no majority of 4 either, but
     * with node 2 back the entry commits. */
    h_start(2);
    h_tick(1, 1);
    h_deliver_all();
    c.voters[3] = 4;
    c.n = 4;
    c.n_learners = 0;
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(
        ida_raft_propose(&H.r[1], IDA_ENTRY_CONFIG, buf, len, NULL, NULL), 0);
    h_collect(1);
    h_deliver_all();
    h_tick(1, 1);
    h_deliver_all();
    cr_assert_eq(ida_raft_voters(&H.r[4])->n, 4);
    cr_assert_eq(ida_raft_commit(&H.r[1]), ida_raft_last_index(&H.r[1]),
                 "1, 2 and 4 are a majority of 4");
    h_close();
}
