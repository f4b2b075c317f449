/* Test-only hooks into the Raft core. Contract: raft/testing.h. */
#include "raft/testing.h"

#include "base/assert.h"

void ida_raft_testing_set_bugs(struct ida_raft *r, uint32_t bugs)
{
    IDA_ASSERT(r != NULL);
    IDA_ASSERT(r->next_batch_id == 1); /* nothing handed out since init */
    r->bugs = bugs;
    if (bugs & IDA_RAFT_BUG_FORGET_VOTE) {
        /* As if storage had lost the vote: init then hands out no vote
         * either, so no hard state is rewritten because of it. */
        r->vote = 0;
        r->hs_out.vote = 0;
    }
}
