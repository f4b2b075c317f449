/* Fixture and helpers shared by the tests/raft/test_*.c files. Contract:
 * tests/raft/helpers.h. */
#include "tests/raft/helpers.h"

#include <criterion/criterion.h>
#include <string.h>

#include "raft/raft.h"
#include "src/node/convert.h"
#include "tests/raft/harness.h"

/* --- fixture -------------------------------------------------------------- */

void setup3(void)
{
    h_init(3);
}

void setup3_bound(void)
{
    h_init(3);
    H.bind_incs = true;
    for (int k = 1; k <= 3; k++) {
        H.inc[k] = H.boot_inc[k] = 11u * (uint64_t)k;
    }
}

void teardown(void)
{
    h_close();
}

/* --- helpers -------------------------------------------------------------- */

struct ida_raft_config base_config(void)
{
    struct ida_raft_config c = {
        .id = 1,
        .voters = {1, 2, 3},
        .n_voters = 3,
        .election_ticks = 10,
        .heartbeat_ticks = 1,
        .max_inflight = 4,
        .max_msg_entries = 8,
        .snapshot_chunk_bytes = 8,
        .conf_decode = node_conf_decode,
    };
    return c;
}

struct ida_raft_msg vote_req(ida_node_id from,
                             ida_node_id to,
                             ida_term term,
                             ida_index last_index,
                             ida_term last_term)
{
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = IDA_RAFT_MSG_REQUEST_VOTE;
    m.from = from;
    m.to = to;
    m.term = term;
    m.u.request_vote.last_log_index = last_index;
    m.u.request_vote.last_log_term = last_term;
    return m;
}

/* The single message of @type in @b (msgs or msgs_after_persist). */
const struct ida_raft_msg *find_msg(const struct ida_raft_batch *b,
                                    enum ida_raft_msg_type type,
                                    bool after_persist)
{
    const struct ida_raft_msg *ms =
        after_persist ? b->msgs_after_persist : b->msgs;
    size_t n = after_persist ? b->n_msgs_after_persist : b->n_msgs;
    for (size_t i = 0; i < n; i++) {
        if (ms[i].type == type) {
            return &ms[i];
        }
    }
    return NULL;
}

ida_node_id the_leader(void)
{
    ida_node_id found = 0;
    for (int k = 1; k <= H.n; k++) {
        if (H.up[k] && ida_raft_role(&H.r[k]) == IDA_RAFT_LEADER) {
            cr_assert_eq(found, 0, "two leaders: %u and %d", found, k);
            found = (ida_node_id)k;
        }
    }
    return found;
}
