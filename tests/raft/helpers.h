/* Fixture and helpers shared by the Raft core's unit tests
 * (tests/raft/test_*.c), on top of the harness (tests/raft/harness.h).
 * setup3()/teardown() open and close a 3-node harness cluster (the .init
 * and .fini of the suites); the rest build configs and messages and look
 * things up in batches and in the harness cluster. */
#ifndef IDA_TEST_RAFT_HELPERS_H
#define IDA_TEST_RAFT_HELPERS_H

#include <stdbool.h>

#include "raft/raft.h"

void setup3(void);
/* A 3-node harness whose bootstrap membership binds incarnations 11, 22,
 * 33 to nodes 1, 2, 3 (raft/admission.h). */
void setup3_bound(void);
void teardown(void);

/* A valid config for node 1 of a 3-voter cluster. */
struct ida_raft_config base_config(void);

/* A RequestVote (not pre-vote) from @from to @to. */
struct ida_raft_msg vote_req(ida_node_id from,
                             ida_node_id to,
                             ida_term term,
                             ida_index last_index,
                             ida_term last_term);

/* The single message of @type in @b (msgs or msgs_after_persist), NULL if
 * none. Borrowed from @b. */
const struct ida_raft_msg *find_msg(const struct ida_raft_batch *b,
                                    enum ida_raft_msg_type type,
                                    bool after_persist);

/* The one leader among the running harness nodes, 0 if none; fails the test
 * if there are two. */
ida_node_id the_leader(void);

#endif /* IDA_TEST_RAFT_HELPERS_H */
