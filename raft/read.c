/* ReadIndex (§6.4): linearizable read barriers on the leader. Internal
 * helpers: raft/internal.h. */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"

void ida__raft_check_reads(struct ida_raft *r)
{
    size_t done = 0;
    while (done < r->n_reads_pending) {
        uint64_t seq = r->reads_pending[done].seq;
        size_t acks = 0;
        for (size_t i = 0; i < r->conf.n; i++) {
            if (r->conf.voters[i] == r->cfg.id || r->prs[i].read_ack >= seq) {
                acks++;
            }
        }
        if (acks < ida__raft_quorum(r)) {
            break;
        }
        struct ida_raft_read rd = {.ctx = r->reads_pending[done].ctx,
                                   .index = r->reads_pending[done].index};
        if (r->n_reads_ready == r->cap_reads_ready) {
            size_t c = r->cap_reads_ready ? r->cap_reads_ready * 2 : 16;
            struct ida_raft_read *a =
                ida_realloc(r->reads_ready, c * sizeof(*a));
            if (a == NULL) {
                break; /* retried at the next acknowledgement */
            }
            r->reads_ready = a;
            r->cap_reads_ready = c;
        }
        r->reads_ready[r->n_reads_ready++] = rd;
        done++;
    }
    if (done > 0) {
        memmove(r->reads_pending, r->reads_pending + done,
                (r->n_reads_pending - done) * sizeof(*r->reads_pending));
        r->n_reads_pending -= done;
    }
}

int ida_raft_read_index(struct ida_raft *r, uint64_t ctx)
{
    IDA_ASSERT(r != NULL);
    ida__raft_begin(r);
    if (r->role != IDA_RAFT_LEADER) {
        return IDA_ENOTLEADER;
    }
    /* §6.4 step 1: the leader must know the latest commit index, which it
     * does once an entry of its own term committed. */
    if (ida__raft_term_at(r, r->commit) != r->term) {
        return IDA_EBUSY;
    }
    if (r->n_reads_pending == r->cap_reads_pending) {
        size_t c = r->cap_reads_pending ? r->cap_reads_pending * 2 : 16;
        void *a = ida_realloc(r->reads_pending, c * sizeof(*r->reads_pending));
        if (a == NULL) {
            return IDA_ENOMEM;
        }
        r->reads_pending = a;
        r->cap_reads_pending = c;
    }
    r->read_seq++;
    r->reads_pending[r->n_reads_pending].ctx = ctx;
    r->reads_pending[r->n_reads_pending].seq = r->read_seq;
    r->reads_pending[r->n_reads_pending].index = r->commit;
    r->n_reads_pending++;
    /* §6.4 steps 2-3: confirm leadership with a round of heartbeats. */
    for (size_t i = 0; i < r->conf.n; i++) {
        ida__raft_send_heartbeat(r, &r->prs[i]);
    }
    ida__raft_check_reads(r); /* a single voter is its own quorum */
    ida__raft_check_invariants(r);
    return 0;
}
