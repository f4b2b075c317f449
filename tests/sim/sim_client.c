/* Simulated clients: proposals, retries, ReadIndex reads and the
 * checks on their answers. */
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

void sim__client_answer(struct sim *s,
                        int ci,
                        uint64_t seq,
                        const struct ida_fsm_result *res)
{
    struct client *c = &s->clients[ci];
    uint64_t h = sim__result_hash(res);
    sim__hash_in(s, 2, (uint64_t)ci, seq, h);
    size_t cap = c->cap_answers;
    c->answers =
        sim__grow(s, c->answers, &cap, (size_t)seq + 1, sizeof(uint64_t));
    c->cap_answers = cap;
    if (c->answers == NULL) {
        return;
    }
    if (c->answers[seq] != 0) {
        if (c->answers[seq] != h) {
            sim__violation(
                s, "client %d seq %" PRIu64 " answered twice, differently (%s)",
                ci, seq, idalloc_errname(res->error));
        }
        return;
    }
    if (!c->busy || c->is_read || c->seq != seq) {
        return; /* a late answer to an abandoned request: keep nothing */
    }
    c->answers[seq] = h;
    sim__alloc_acked(s, ci, seq, &c->req, res);
    c->busy = false;
    c->next_at = s->now + sim__below(&s->rng, 30);
    if (c->sent_at >= s->healed_at) {
        c->done_after_heal = true;
    }
    s->res->acked++;
    sim__tracef(s, "client %d seq %" PRIu64 " acked: %s id %" PRIu64, ci, seq,
                res->error ? idalloc_errname(res->error) : "ok", res->id);
}

void sim__client_retry(struct sim *s, int ci, ida_node_id hint)
{
    struct client *c = &s->clients[ci];
    if (!c->busy) {
        return;
    }
    c->target = hint ? sim__node_slot(s, hint)
                     : (int)sim__below(&s->rng, (uint64_t)s->n);
    c->next_at = s->now + 5 + sim__below(&s->rng, 20);
}

void sim__client_read_answer(struct sim *s,
                             int ci,
                             uint64_t ctx,
                             int rv,
                             uint64_t id)
{
    struct client *c = &s->clients[ci];
    if (!c->busy || !c->is_read || c->seq != ctx) {
        return;
    }
    sim__hash_in(s, 3, (uint64_t)ci, ctx, (uint64_t)rv * 1000003 + id);
    sim__alloc_read(s, ci, ctx, &c->req, rv, id);
    c->busy = false;
    c->next_at = s->now + sim__below(&s->rng, 30);
    if (c->sent_at >= s->healed_at) {
        c->done_after_heal = true;
    }
    s->res->reads++;
}

static void client_send(struct sim *s, int ci)
{
    struct client *c = &s->clients[ci];
    if (!c->busy) {
        sim__alloc_next_req(s, ci, &c->req);
        c->busy = true;
        c->seq++;
        c->is_read = c->req.op == SIM_OP_LOOKUP;
        c->sent_at = s->now;
    }
    c->timeout_at = s->now + CLIENT_TIMEOUT_MS;
    c->next_at = NEVER;
    struct node *nd = &s->nodes[c->target];
    sim__hash_in(s, 9, (uint64_t)ci, c->seq, (uint64_t)c->target);
    if (!nd->up) {
        sim__tracef(s, "client %d seq %" PRIu64 " -> node %u: down", ci, c->seq,
                    nd->id);
        /* Connection refused: try another node soon. */
        c->target = (int)sim__below(&s->rng, (uint64_t)s->n);
        c->next_at = s->now + 20 + sim__below(&s->rng, 20);
        return;
    }
    int rv;
    if (c->is_read) {
        uint64_t ctx = ((uint64_t)ci << CTX_SHIFT) | c->seq;
        rv = nd->n_reads < 16 ? ida_raft_read_index(&nd->raft, ctx) : IDA_EBUSY;
        if (rv == 0) {
            nd->reads[nd->n_reads++] = (struct pread){ci, ctx, 0};
        }
    } else {
        size_t len = 0;
        uint8_t *cmd = sim__cmd_encode(s, ci, c->seq, &c->req, &len);
        if (cmd == NULL) {
            return;
        }
        ida_index index;
        ida_term term;
        rv = nd->n_props < 64 ? ida_raft_propose(&nd->raft, IDA_ENTRY_NORMAL,
                                                 cmd, len, &index, &term)
                              : IDA_EBUSY;
        ida_free(cmd);
        if (rv == 0) {
            nd->props[nd->n_props++] =
                (struct proposal){ci, c->seq, index, term};
        }
    }
    sim__tracef(s, "client %d %s seq %" PRIu64 " -> node %u: %s", ci,
                c->is_read ? "read" : "write", c->seq, nd->id,
                rv ? idalloc_errname(rv) : "ok");
    if (rv == IDA_ENOTLEADER) {
        sim__client_retry(s, ci, ida_raft_leader(&nd->raft));
    } else if (rv == IDA_EBUSY) {
        c->next_at = s->now + 20;
    } else if (rv != 0) {
        s->oom = true;
    }
    sim__drain(s, nd);
    sim__serve_reads(s, nd);
}

void sim__client_tick(struct sim *s, int ci)
{
    struct client *c = &s->clients[ci];
    if (c->busy && s->now >= c->timeout_at) {
        /* Timed out: the outcome is unknown, retry with the same seq. */
        c->target = (int)sim__below(&s->rng, (uint64_t)s->n);
        client_send(s, ci);
        return;
    }
    if (s->now >= c->next_at) {
        client_send(s, ci);
    }
}
