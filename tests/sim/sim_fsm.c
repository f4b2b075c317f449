/* The simulator's test state machine (see struct fsm in
 * tests/sim/sim_internal.h). */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/sim/sim_internal.h"

void sim__cmd_encode(uint8_t out[12], uint32_t client, uint64_t seq)
{
    memcpy(out, &client, 4);
    memcpy(out + 4, &seq, 8);
}

/* Returns the id handed out, or 0: the session already moved past @seq. */
uint64_t sim__fsm_apply(struct fsm *f, const struct ida_entry *e)
{
    IDA_ASSERT(e->index == f->applied + 1);
    f->applied = e->index;
    if (e->type != IDA_ENTRY_NORMAL || e->len != 12) {
        return 0;
    }
    uint32_t c;
    uint64_t seq;
    memcpy(&c, e->data, 4);
    memcpy(&seq, e->data + 4, 8);
    IDA_ASSERT(c < CLIENTS);
    if (seq < f->last_seq[c]) {
        return 0;
    }
    if (seq == f->last_seq[c]) {
        return f->last_result[c];
    }
    f->counter++;
    f->last_seq[c] = seq;
    f->last_result[c] = f->counter;
    return f->counter;
}
