/* Test-only hooks into the Raft core: negative controls that break the core
 * on purpose, so the simulator (tests/sim/) and the unit tests can show that
 * their checks catch each bug. Production code never includes this header;
 * a core that ida_raft_testing_set_bugs() was not called on runs with no
 * bug. */
#ifndef IDA_RAFT_TESTING_H
#define IDA_RAFT_TESTING_H

#include <stdint.h>

#include "raft/raft.h"

/* Test-only switches that break the core on purpose (negative controls of
 * the simulator and the unit tests). */
enum ida_raft_bug {
    /* Grant votes without the "log at least as up to date" check (§5.4.1). */
    IDA_RAFT_BUG_VOTE_NO_LOG_CHECK = 1u << 0,
    /* Put acknowledgements and votes in batch.msgs (sent before persist). */
    IDA_RAFT_BUG_ACK_BEFORE_PERSIST = 1u << 1,
    /* Drop the stored vote in ida_raft_init() (forget the vote on restart). */
    IDA_RAFT_BUG_FORGET_VOTE = 1u << 2,
    /* Commit by counting replicas of entries of any term (Figure 8). */
    IDA_RAFT_BUG_COMMIT_OLD_TERM = 1u << 3,
    /* Ignore incarnations: a node with a new, empty incarnation votes and
     * counts as its old self (raft/admission.h rules A1 and A2 off). */
    IDA_RAFT_BUG_IGNORE_INCARNATION = 1u << 4,
    /* Read vote requests and answers of nodes outside the membership like
     * any other (their terms move ours). */
    IDA_RAFT_BUG_HEAR_STRANGERS = 1u << 5,
    /* Ignore what peers echo back (raft/admission.h rule A4 off): a node
     * restarted from an older copy of its directory acts as before. */
    IDA_RAFT_BUG_IGNORE_ROLLBACK = 1u << 6,
};

/* Turn on the bugs in @bugs (a mask of enum ida_raft_bug) in @r. Call it
 * right after a successful ida_raft_init(), before any other call on @r:
 * IDA_RAFT_BUG_FORGET_VOTE drops the vote that init restored. */
void ida_raft_testing_set_bugs(struct ida_raft *r, uint32_t bugs);

#endif /* IDA_RAFT_TESTING_H */
