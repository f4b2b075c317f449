/* Status answers of the raft processor. Internal: src/node/raft_proc.h. */
#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"
#include "src/node/raft_proc.h"

static const char *progress_state(enum ida_raft_progress_state s)
{
    return s == IDA_RAFT_REPLICATE  ? "replicate"
           : s == IDA_RAFT_SNAPSHOT ? "snapshot"
                                    : "probe";
}

/* Merge the pool workers' error top dumps, most frequent first. */
static size_t read_top_errors(struct raft_proc *rp,
                              struct ida_errtop_entry *out,
                              size_t max)
{
    size_t n = 0;
    for (uint32_t t = 0; t < ida_pool_threads(rp->node->pool); t++) {
        char path[IDA_PATH_MAX + 64];
        struct ida_errtop_entry e[8];
        size_t k = 0;
        snprintf(path, sizeof(path), "%s/errtop-%u.pb", rp->node->dir, t);
        if (ida_errtop_read_file(path, e, 8, &k) != 0) {
            continue;
        }
        for (size_t i = 0; i < k && n < max; i++) {
            out[n++] = e[i];
        }
    }
    ida_errtop_sort(out, n);
    return n;
}

const char *ida__rp_role_name(const struct raft_proc *rp)
{
    return rp->mem.seeded ? "seeded"
                          : ida_raft_role_name(ida_raft_role(&rp->raft));
}

void ida__rp_reply_status(struct raft_proc *rp, uint64_t conn, uint64_t seq)
{
    struct ida_node *n = rp->node;
    struct ida_raft *r = &rp->raft;
    Idalloc__ClientResponse resp = IDALLOC__CLIENT_RESPONSE__INIT;
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    Idalloc__NodeStatus st = IDALLOC__NODE_STATUS__INIT;
    Idalloc__PeerProgress pp[IDA_RAFT_NODES_MAX], *ppp[IDA_RAFT_NODES_MAX];
    Idalloc__ErrorCount ec[8], *ecp[8];
    struct ida_errtop_entry top[8];
    st.node_id = n->self->id;
    st.peer_addr = (char *)n->self->peer.text;
    st.client_addr = (char *)n->self->client.text;
    st.role = (char *)ida__rp_role_name(rp);
    st.term = ida_raft_term(r);
    st.leader_id = ida_raft_leader(r);
    st.commit_index = ida_raft_commit(r);
    st.applied_index = rp->applied;
    st.log_first_index = r->snap_index + 1;
    st.log_last_index = ida_raft_last_index(r);
    st.snapshot_index = rp->snapshot_index;
    st.snapshot_term = r->snap_term;
    size_t np = 0;
    /* The voters in effect (not those the core started with: the
     * membership changes). */
    const struct ida_raft_conf *c = ida_raft_voters(r);
    for (size_t i = 0; i < c->n && np < IDA_RAFT_NODES_MAX; i++) {
        const struct ida_raft_progress *p =
            ida_raft_progress_of(r, c->voters[i]);
        if (p == NULL || p->id == n->self->id) {
            continue;
        }
        idalloc__peer_progress__init(&pp[np]);
        pp[np].node_id = p->id;
        pp[np].match_index = p->match;
        pp[np].next_index = p->next;
        pp[np].state = (char *)progress_state(p->state);
        pp[np].connected = ida_net_peer_up(n->net, p->id);
        ppp[np] = &pp[np];
        np++;
    }
    st.peers = ppp;
    st.n_peers = np;
    size_t ne = read_top_errors(rp, top, 8);
    for (size_t i = 0; i < ne; i++) {
        idalloc__error_count__init(&ec[i]);
        ec[i].code = top[i].code;
        ec[i].text = top[i].text;
        ec[i].count = top[i].count;
        ec[i].last_seen_unix_ms = top[i].last_seen_ms;
        ecp[i] = &ec[i];
    }
    st.top_errors = ecp;
    st.n_top_errors = ne;
    res.result_case = IDALLOC__COMMAND_RESULT__RESULT_STATUS;
    res.status = &st;
    resp.request_seq = seq;
    resp.result = &res;
    resp.leader_id = ida_raft_leader(r);
    char bufs[NODE_BOOK_MAX][IDA_ADDR_TEXT_MAX], *members[NODE_BOOK_MAX];
    resp.member_addrs = members;
    resp.n_member_addrs = ida__node_member_addrs(n, bufs, members);
    ida_metrics_request_end(n->metrics, conn, seq, 0);
    ida_net_reply(n->net, conn, &resp);
}

/* --- sending
 * ------------------------------------------------------------------ */
