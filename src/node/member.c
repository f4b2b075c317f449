/* Membership at the node. Contract and design: src/node/member.h. */
#include "src/node/member.h"

#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"
#include "src/node/node.h"

int node_file_index(const struct ida_node *n, unsigned id)
{
    const struct ida_config_node *f = ida_config_node(&n->cfg, id);
    return f != NULL ? (int)(f - n->cfg.nodes) : -1;
}

void node_conf_first(const struct ida_node *n,
                     const uint64_t *inc,
                     struct ida_raft_conf *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned i = 0; i < n->cfg.node_count && i < IDA_RAFT_NODES_MAX; i++) {
        out->voters[out->n] = n->cfg.nodes[i].id;
        out->voter_inc[out->n++] = inc[i];
    }
}

int node_hello_make(const struct ida_node *n,
                    const struct ida_raft *r,
                    unsigned to,
                    bool reply,
                    Idalloc__PeerMessage *pm,
                    Idalloc__Hello *hello,
                    uint8_t **buf)
{
    idalloc__peer_message__init(pm);
    idalloc__hello__init(hello);
    *buf = NULL;
    pm->cluster = (char *)n->cfg.cluster;
    pm->from = n->self->id;
    pm->to = to;
    pm->from_incarnation = n->incarnation;
    pm->msg_case = IDALLOC__PEER_MESSAGE__MSG_HELLO;
    pm->hello = hello;
    hello->reply = reply;
    if (r != NULL) {
        size_t len;
        int rv = node_conf_encode_full(&n->cfg, ida_raft_voters(r), buf, &len);
        if (rv != 0) {
            return rv;
        }
        hello->bootstrapped = true;
        hello->config.data = *buf;
        hello->config.len = len;
        hello->leader = ida_raft_leader(r);
    }
    return 0;
}

int node_hello_learn(struct node_members *m,
                     const struct ida_node *n,
                     const Idalloc__PeerMessage *pm,
                     struct ida_raft_conf *out)
{
    const Idalloc__Hello *h = pm->hello;
    int i = node_file_index(n, pm->from);
    if (h == NULL || i < 0 || pm->from_incarnation == 0) {
        return 0;
    }
    m->heard[i] = true;
    m->inc[i] = pm->from_incarnation;
    m->fresh[i] = !h->bootstrapped;
    if (h->bootstrapped) {
        /* Taken from the leader (another node's may be older than the
         * cluster's), or when it names this node's own incarnation: then it
         * is the first membership, made from what this node announced. */
        if (h->config.len == 0 ||
            node_conf_decode(h->config.data, h->config.len, out) != 0) {
            return 0;
        }
        uint64_t mine = n->incarnation;
        int s = ida_raft_conf_slot(out, n->self->id);
        return h->leader == pm->from || (s >= 0 && out->voter_inc[s] == mine);
    }
    for (unsigned k = 0; k < n->cfg.node_count; k++) {
        if (!m->heard[k] || !m->fresh[k]) {
            return 0;
        }
    }
    node_conf_first(n, m->inc, out);
    return 1;
}

/* Whether the voters of @c other than @id that are active (this leader, or
 * heard from lately) make a majority of those voters. */
static bool others_have_quorum(const struct ida_raft *r,
                               const struct ida_raft_conf *c,
                               ida_node_id id)
{
    size_t others = 0, active = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->voters[i] == id) {
            continue;
        }
        others++;
        const struct ida_raft_progress *pr =
            ida_raft_progress_of(r, c->voters[i]);
        if (c->voters[i] == r->cfg.id ||
            (pr != NULL &&
             (pr->recent_active || pr->match + 64 >= ida_raft_commit(r)))) {
            active++;
        }
    }
    return others > 0 && active >= others / 2 + 1;
}

static void drop_slot(ida_node_id *ids, uint64_t *incs, size_t *n, int s)
{
    for (size_t i = (size_t)s; i + 1 < *n; i++) {
        ids[i] = ids[i + 1];
        incs[i] = incs[i + 1];
    }
    (*n)--;
}

int node_rejoin_step(struct node_members *m,
                     const struct ida_raft *r,
                     uint64_t now_ms,
                     struct ida_raft_conf *out)
{
    if (m->rejoin_id == 0 || ida_raft_role(r) != IDA_RAFT_LEADER ||
        now_ms - m->last_rejoin_ms < 500) {
        return 0;
    }
    ida_node_id id = m->rejoin_id;
    uint64_t inc = m->rejoin_inc;
    *out = *ida_raft_voters(r);
    int vs = ida_raft_conf_slot(out, id);
    int ls = ida_raft_conf_learner_slot(out, id);
    if (vs >= 0 && out->voter_inc[vs] == inc) {
        m->rejoin_id = 0; /* done */
        return 0;
    }
    if (!others_have_quorum(r, out, id)) {
        return 0; /* stay unavailable rather than shrink below a quorum */
    }
    m->last_rejoin_ms = now_ms;
    if (vs >= 0) {
        drop_slot(out->voters, out->voter_inc, &out->n, vs);
    } else if (ls >= 0 && out->learner_inc[ls] != inc) {
        drop_slot(out->learners, out->learner_inc, &out->n_learners, ls);
    } else if (ls < 0) {
        if (out->n_learners >= IDA_RAFT_NODES_MAX) {
            return 0;
        }
        out->learners[out->n_learners] = id;
        out->learner_inc[out->n_learners++] = inc;
    } else {
        const struct ida_raft_progress *pr = ida_raft_progress_of(r, id);
        if (pr == NULL || pr->match < ida_raft_commit(r) ||
            out->n >= IDA_RAFT_NODES_MAX) {
            return 0; /* still catching up */
        }
        drop_slot(out->learners, out->learner_inc, &out->n_learners, ls);
        out->voters[out->n] = id;
        out->voter_inc[out->n++] = inc;
    }
    return 1;
}
