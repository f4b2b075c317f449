/* Membership commands of operators: member list, member add / remove /
 * promote, leader transfer. Contract: src/node/member.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "raft/admission.h"
#include "src/node/convert.h"
#include "src/node/member.h"
#include "src/node/net.h"
#include "src/node/node.h"

enum { OP_NONE = 0, OP_CHANGE = 1, OP_TRANSFER = 2 };

void node_members_heard(struct node_members *m,
                        const struct ida_node *n,
                        ida_node_id id,
                        uint64_t inc)
{
    int i = node_file_index(n, id);
    if (i >= 0 && inc != 0) {
        m->announced[i] = inc;
    }
}

static bool same_ids(const struct ida_raft_conf *a,
                     const struct ida_raft_conf *b)
{
    if (a->n != b->n || a->n_learners != b->n_learners) {
        return false;
    }
    for (size_t i = 0; i < a->n; i++) {
        if (ida_raft_conf_slot(b, a->voters[i]) < 0) {
            return false;
        }
    }
    for (size_t i = 0; i < a->n_learners; i++) {
        if (ida_raft_conf_learner_slot(b, a->learners[i]) < 0) {
            return false;
        }
    }
    return true;
}

static void ids_text(char *buf, size_t cap, const ida_node_id *ids, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && len + 12 < cap; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%u", i ? ", " : "",
                                ids[i]);
    }
    if (n == 0) {
        snprintf(buf, cap, "none");
    }
}

/* Log once per membership that is not exactly the cluster file's nodes
 * as voters (member.h). */
static void compare_with_file(struct node_members *m,
                              const struct ida_node *n,
                              const struct ida_raft_conf *c)
{
    if (m->compared && same_ids(c, &m->compared_conf)) {
        return;
    }
    m->compared = true;
    m->compared_conf = *c;
    bool same = c->n_learners == 0 && c->n == n->cfg.node_count;
    for (unsigned i = 0; i < n->cfg.node_count && same; i++) {
        same = ida_raft_conf_slot(c, n->cfg.nodes[i].id) >= 0;
    }
    if (same) {
        return;
    }
    char v[96], l[96], f[96];
    ida_node_id file_ids[IDA_CONFIG_NODES_MAX];
    for (unsigned i = 0; i < n->cfg.node_count; i++) {
        file_ids[i] = n->cfg.nodes[i].id;
    }
    ids_text(v, sizeof(v), c->voters, c->n);
    ids_text(l, sizeof(l), c->learners, c->n_learners);
    ids_text(f, sizeof(f), file_ids, n->cfg.node_count);
    IDA_INFO(
        "membership: the membership in effect (voters %s; learners %s) "
        "differs from the cluster file's nodes (%s): the file's node lines "
        "are only the first membership; changes are made with idalloc "
        "member (see idalloc member list)",
        v, l, f);
}

void node_members_track(struct node_members *m,
                        const struct ida_node *n,
                        const struct ida_raft *r)
{
    const struct ida_raft_conf *c = ida_raft_voters(r);
    compare_with_file(m, n, c);
    for (size_t k = 0; k < c->n + c->n_learners; k++) {
        bool v = k < c->n;
        ida_node_id id = v ? c->voters[k] : c->learners[k - c->n];
        uint64_t inc = v ? c->voter_inc[k] : c->learner_inc[k - c->n];
        int i = node_file_index(n, id);
        if (i >= 0 && inc != 0) {
            m->last_bound[i] = inc;
        }
    }
    /* A learner is there to become a voter: with auto_rejoin the leader
     * promotes it once it caught up (node_rejoin_step()). */
    if (n->cfg.auto_rejoin && m->rejoin_id == 0 && c->n_learners > 0 &&
        ida_raft_role(r) == IDA_RAFT_LEADER) {
        m->rejoin_id = c->learners[0];
        m->rejoin_inc = c->learner_inc[0];
    }
}

bool node_members_may_readmit(const struct node_members *m,
                              const struct ida_node *n,
                              const struct ida_raft_conf *c,
                              ida_node_id id,
                              uint64_t inc)
{
    int i = node_file_index(n, id);
    return i >= 0 && m->last_bound[i] != inc &&
           node_conf_removed_slot(c, id) < 0;
}

/* --- answers --------------------------------------------------------------
 */

static void reply_err(struct ida_node *n,
                      uint64_t conn,
                      uint64_t seq,
                      int err,
                      ida_node_id leader,
                      const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));

static void reply_err(struct ida_node *n,
                      uint64_t conn,
                      uint64_t seq,
                      int err,
                      ida_node_id leader,
                      const char *fmt,
                      ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    ida__node_reply_error(n, conn, seq, err, why, leader);
}

static void reply_change(struct ida_node *n,
                         uint64_t conn,
                         uint64_t seq,
                         bool changed,
                         ida_index index,
                         uint64_t inc)
{
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    Idalloc__MemberChangeResult mc = IDALLOC__MEMBER_CHANGE_RESULT__INIT;
    mc.changed = changed;
    mc.index = index;
    mc.incarnation = inc;
    res.result_case = IDALLOC__COMMAND_RESULT__RESULT_MEMBER_CHANGE;
    res.member_change = &mc;
    ida__node_reply_result(n, conn, seq, &res, n->self->id);
}

static void reply_transfer(struct ida_node *n,
                           uint64_t conn,
                           uint64_t seq,
                           ida_node_id leader)
{
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    Idalloc__LeaderTransferResult lt = IDALLOC__LEADER_TRANSFER_RESULT__INIT;
    lt.leader_id = leader;
    res.result_case = IDALLOC__COMMAND_RESULT__RESULT_LEADER_TRANSFER;
    res.leader_transfer = &lt;
    ida__node_reply_result(n, conn, seq, &res, n->self->id);
}

/* --- list -----------------------------------------------------------------
 */

#define LIST_MAX (2 * IDA_RAFT_NODES_MAX + IDA_CONFIG_NODES_MAX)

static void fill_info(const struct ida_node *n,
                      const struct ida_raft *r,
                      const int *peer_up,
                      ida_node_id id,
                      uint64_t inc,
                      bool voter,
                      bool waiting,
                      Idalloc__MemberInfo *mi)
{
    idalloc__member_info__init(mi);
    const struct ida_config_node *f = ida_config_node(&n->cfg, id);
    mi->id = id;
    mi->incarnation = inc;
    mi->peer_addr = f != NULL ? (char *)f->peer.text : "";
    mi->client_addr = f != NULL ? (char *)f->client.text : "";
    mi->voter = voter;
    mi->waiting = waiting;
    if (id == n->self->id) {
        mi->match_index = ida_raft_last_index(r);
        mi->connected = true;
    } else {
        const struct ida_raft_progress *pr = ida_raft_progress_of(r, id);
        mi->match_index = pr != NULL ? pr->match : 0;
        mi->connected = id <= IDA_CONFIG_NODES_MAX && peer_up[id];
    }
}

static void reply_list(const struct node_members *m,
                       struct ida_node *n,
                       const struct ida_raft *r,
                       const int *peer_up,
                       uint64_t conn,
                       uint64_t seq)
{
    Idalloc__MemberInfo mi[LIST_MAX], *mp[LIST_MAX];
    size_t k = 0;
    const struct ida_raft_conf *c = ida_raft_voters(r);
    for (size_t i = 0; i < c->n + c->n_learners && k < LIST_MAX; i++, k++) {
        bool v = i < c->n;
        fill_info(n, r, peer_up, v ? c->voters[i] : c->learners[i - c->n],
                  v ? c->voter_inc[i] : c->learner_inc[i - c->n], v, false,
                  &mi[k]);
        mp[k] = &mi[k];
    }
    for (unsigned i = 0; i < n->cfg.node_count && k < LIST_MAX; i++) {
        ida_node_id id = n->cfg.nodes[i].id;
        bool member = ida_raft_conf_slot(c, id) >= 0 ||
                      ida_raft_conf_learner_slot(c, id) >= 0;
        uint64_t bound = ida_raft_conf_inc(c, id);
        uint64_t inc = m->announced[i];
        if (id == n->self->id || inc == 0 ||
            (member && (bound == 0 || bound == inc))) {
            continue;
        }
        fill_info(n, r, peer_up, id, inc, false, true, &mi[k]);
        mp[k] = &mi[k];
        k++;
    }
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    Idalloc__MemberListResult ml = IDALLOC__MEMBER_LIST_RESULT__INIT;
    ml.members = mp;
    ml.n_members = k;
    ml.leader_id = ida_raft_leader(r);
    ml.commit_index = ida_raft_commit(r);
    res.result_case = IDALLOC__COMMAND_RESULT__RESULT_MEMBER_LIST;
    res.member_list = &ml;
    ida__node_reply_result(n, conn, seq, &res, n->self->id);
}

/* --- changes --------------------------------------------------------------
 */

/* The voter other than this leader that is caught up (match at the commit
 * index), connected ones first, highest match first; 0 if none. */
static ida_node_id caught_up_voter(const struct ida_node *n,
                                   const struct ida_raft *r,
                                   const int *peer_up)
{
    const struct ida_raft_conf *c = ida_raft_voters(r);
    ida_node_id best = 0;
    ida_index best_match = 0;
    int best_up = -1;
    for (size_t i = 0; i < c->n; i++) {
        ida_node_id id = c->voters[i];
        const struct ida_raft_progress *pr = ida_raft_progress_of(r, id);
        if (id == n->self->id || pr == NULL || pr->match < ida_raft_commit(r)) {
            continue;
        }
        int up = id <= IDA_CONFIG_NODES_MAX && peer_up[id];
        if (up > best_up || (up == best_up && pr->match > best_match)) {
            best = id;
            best_match = pr->match;
            best_up = up;
        }
    }
    return best;
}

static void drop(ida_node_id *ids, uint64_t *incs, size_t *cnt, int s)
{
    for (size_t i = (size_t)s; i + 1 < *cnt; i++) {
        ids[i] = ids[i + 1];
        incs[i] = incs[i + 1];
    }
    (*cnt)--;
}

static const char *op_name(Idalloc__MemberChange__Op op)
{
    return op == IDALLOC__MEMBER_CHANGE__OP__REMOVE ? "remove"
           : op == IDALLOC__MEMBER_CHANGE__OP__ADD  ? "add"
                                                    : "promote";
}

/* Propose @c and wait for its commit. */
static void propose(struct node_members *m,
                    struct ida_node *n,
                    struct ida_raft *r,
                    uint64_t conn,
                    uint64_t seq,
                    const char *what,
                    ida_node_id id,
                    uint64_t inc,
                    const struct ida_raft_conf *c)
{
    uint8_t *buf;
    size_t len;
    if (node_conf_encode_full(&n->cfg, c, &buf, &len) != 0) {
        reply_err(n, conn, seq, IDA_EBUSY, 0, "out of memory; retry");
        return;
    }
    ida_index index = 0;
    ida_term term = 0;
    int rv = ida_raft_propose(r, IDA_ENTRY_CONFIG, buf, len, &index, &term);
    ida_free(buf);
    if (rv == IDA_EBUSY) {
        reply_err(n, conn, seq, IDA_EBUSY, 0,
                  "member %s %u: another membership change, a leadership "
                  "transfer or this leader's first entry has not committed "
                  "yet; retry",
                  what, id);
        return;
    }
    if (rv != 0) {
        reply_err(n, conn, seq,
                  rv == IDA_ENOTLEADER ? IDA_ENOTLEADER : IDA_EREFUSED,
                  ida_raft_leader(r), "member %s %u: %s", what, id,
                  idalloc_strerror(rv));
        return;
    }
    IDA_INFO(
        "membership: operator: member %s %u (incarnation %016llx) proposed "
        "at index %llu: %zu voters, %zu learners",
        what, id, (unsigned long long)inc, (unsigned long long)index, c->n,
        c->n_learners);
    m->op.kind = OP_CHANGE;
    m->op.conn = conn;
    m->op.seq = seq;
    m->op.index = index;
    m->op.term = term;
    m->op.inc = inc;
    m->op.started_ms = ida__node_mono_ms();
}

static void change(struct node_members *m,
                   struct ida_node *n,
                   struct ida_raft *r,
                   const int *peer_up,
                   uint64_t conn,
                   uint64_t seq,
                   const Idalloc__MemberChange *mc)
{
    const char *what = op_name(mc->op);
    ida_node_id id = mc->id;
    int fi = node_file_index(n, id);
    if (mc->op == IDALLOC__MEMBER_CHANGE__OP__OP_UNSPECIFIED || id == 0) {
        reply_err(n, conn, seq, IDA_EINVAL, 0,
                  "member change: an operation and a node id are needed");
        return;
    }
    if (fi < 0) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member %s %u: node %u is not in the cluster file (new "
                  "node ids are not supported yet)",
                  what, id, id);
        return;
    }
    struct ida_raft_conf c = *ida_raft_voters(r);
    int vs = ida_raft_conf_slot(&c, id);
    int ls = ida_raft_conf_learner_slot(&c, id);
    uint64_t bound = ida_raft_conf_inc(&c, id);
    uint64_t heard = m->announced[fi];
    if (mc->op == IDALLOC__MEMBER_CHANGE__OP__REMOVE) {
        if (vs < 0 && ls < 0) {
            reply_change(n, conn, seq, false, 0, 0);
            return;
        }
        if (vs >= 0 && c.n == 1) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member remove %u: it is the last voter", id);
            return;
        }
        if (id == n->self->id) {
            ida_node_id to = caught_up_voter(n, r, peer_up);
            int rv = to != 0 ? ida_raft_transfer(r, to) : IDA_EBUSY;
            if (rv != 0) {
                reply_err(n, conn, seq, IDA_EBUSY, 0,
                          "member remove %u: this node leads and no other "
                          "voter is caught up to take over yet; retry",
                          id);
                return;
            }
            IDA_INFO(
                "membership: operator: member remove %u: this node leads: "
                "handing leadership to node %u first",
                id, to);
            reply_err(n, conn, seq, IDA_ENOTLEADER, to,
                      "member remove %u: node %u leads; leadership is being "
                      "handed to node %u, which removes it (retried there)",
                      id, id, to);
            return;
        }
        if (m->rejoin_id == id) {
            m->rejoin_id = 0; /* the operator decides now */
        }
        if (vs >= 0) {
            drop(c.voters, c.voter_inc, &c.n, vs);
        } else {
            drop(c.learners, c.learner_inc, &c.n_learners, ls);
        }
        /* Recorded with the membership (member.h): no leader re-admits it
         * on its own, now or after a restart. The oldest record gives way
         * when the record is full. */
        if (c.n_removed == IDA_RAFT_NODES_MAX) {
            drop(c.removed, c.removed_inc, &c.n_removed, 0);
        }
        c.removed[c.n_removed] = id;
        c.removed_inc[c.n_removed++] = bound;
        propose(m, n, r, conn, seq, what, id, bound, &c);
        return;
    }
    if (mc->op == IDALLOC__MEMBER_CHANGE__OP__ADD) {
        if (vs >= 0 || ls >= 0) {
            if (bound == 0 || heard == 0 || bound == heard) {
                reply_change(n, conn, seq, false, 0, bound);
            } else {
                reply_err(n, conn, seq, IDA_EREFUSED, 0,
                          "member add %u: it is a member as incarnation "
                          "%016llx but speaks as %016llx (its data "
                          "directory was replaced): member remove %u first",
                          id, (unsigned long long)bound,
                          (unsigned long long)heard, id);
            }
            return;
        }
        if (heard == 0) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member add %u: node %u has not been heard from, so "
                      "its incarnation is unknown: start it, then retry",
                      id, id);
            return;
        }
        if (c.n_learners >= IDA_RAFT_NODES_MAX) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member add %u: too many learners", id);
            return;
        }
        c.learners[c.n_learners] = id;
        c.learner_inc[c.n_learners++] = heard;
        int rs = node_conf_removed_slot(&c, id);
        if (rs >= 0) {
            drop(c.removed, c.removed_inc, &c.n_removed, rs);
        }
        propose(m, n, r, conn, seq, what, id, heard, &c);
        return;
    }
    /* promote */
    if (vs >= 0) {
        reply_change(n, conn, seq, false, 0, bound);
        return;
    }
    if (ls < 0) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member promote %u: node %u is not a learner (member add "
                  "%u first)",
                  id, id, id);
        return;
    }
    const struct ida_raft_progress *pr = ida_raft_progress_of(r, id);
    if (pr == NULL || pr->match < ida_raft_commit(r)) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member promote %u: not caught up (match index %llu, "
                  "commit index %llu); retry once it is (idalloc member "
                  "list)",
                  id, (unsigned long long)(pr != NULL ? pr->match : 0),
                  (unsigned long long)ida_raft_commit(r));
        return;
    }
    if (c.n >= IDA_RAFT_NODES_MAX) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member promote %u: too many voters", id);
        return;
    }
    uint64_t inc = c.learner_inc[ls];
    drop(c.learners, c.learner_inc, &c.n_learners, ls);
    c.voters[c.n] = id;
    c.voter_inc[c.n++] = inc;
    propose(m, n, r, conn, seq, what, id, inc, &c);
}

static void transfer(struct node_members *m,
                     struct ida_node *n,
                     struct ida_raft *r,
                     const int *peer_up,
                     uint64_t conn,
                     uint64_t seq,
                     ida_node_id to)
{
    if (to == n->self->id) {
        reply_transfer(n, conn, seq, to);
        return;
    }
    if (to == 0) {
        to = caught_up_voter(n, r, peer_up);
        if (to == 0) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "leader transfer: no other voter is caught up");
            return;
        }
    }
    int rv = ida_raft_transfer(r, to);
    if (rv == IDA_EBUSY) {
        reply_err(n, conn, seq, IDA_EBUSY, 0,
                  "leader transfer: a transfer is already running; retry");
        return;
    }
    if (rv != 0) {
        reply_err(
            n, conn, seq, rv == IDA_ENOTLEADER ? IDA_ENOTLEADER : IDA_EREFUSED,
            0, "leader transfer to %u: %s", to,
            rv == IDA_EINVAL ? "not another voter" : idalloc_strerror(rv));
        return;
    }
    IDA_INFO("membership: operator: leader transfer to node %u", to);
    m->op.kind = OP_TRANSFER;
    m->op.conn = conn;
    m->op.seq = seq;
    m->op.to = to;
    m->op.term = ida_raft_term(r);
    m->op.started_ms = ida__node_mono_ms();
}

void node_members_request(struct node_members *m,
                          struct ida_node *n,
                          struct ida_raft *r,
                          const int *peer_up,
                          uint64_t conn,
                          const Idalloc__ClientRequest *req)
{
    uint64_t seq = req->request_seq;
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_MEMBER_LIST) {
        reply_list(m, n, r, peer_up, conn, seq);
        return;
    }
    if (m->op.kind != OP_NONE) {
        reply_err(n, conn, seq, IDA_EBUSY, 0,
                  "another membership change or leader transfer is under "
                  "way; retry");
        return;
    }
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_MEMBER_CHANGE) {
        change(m, n, r, peer_up, conn, seq, req->member_change);
    } else {
        transfer(m, n, r, peer_up, conn, seq, req->leader_transfer->to);
    }
}

void node_members_settle(struct node_members *m,
                         struct ida_node *n,
                         const struct ida_raft *r)
{
    bool leader = ida_raft_role(r) == IDA_RAFT_LEADER;
    uint64_t now = ida__node_mono_ms();
    if (m->op.kind == OP_CHANGE) {
        if (!leader || ida_raft_term(r) != m->op.term) {
            reply_err(n, m->op.conn, m->op.seq, IDA_ELEADERLOST, 0,
                      "leadership was lost before the membership change at "
                      "index %llu committed; outcome unknown (a retry finds "
                      "out)",
                      (unsigned long long)m->op.index);
            m->op.kind = OP_NONE;
        } else if (ida_raft_commit(r) >= m->op.index) {
            reply_change(n, m->op.conn, m->op.seq, true, m->op.index,
                         m->op.inc);
            m->op.kind = OP_NONE;
        }
    } else if (m->op.kind == OP_TRANSFER) {
        uint64_t limit = 3 * (uint64_t)n->cfg.election_timeout_ms;
        if (!leader &&
            (ida_raft_leader(r) != 0 || now - m->op.started_ms > limit)) {
            reply_transfer(n, m->op.conn, m->op.seq, ida_raft_leader(r));
            m->op.kind = OP_NONE;
        } else if (leader && now - m->op.started_ms > limit) {
            reply_err(n, m->op.conn, m->op.seq, IDA_EREFUSED, 0,
                      "leader transfer to node %u did not complete (is it "
                      "reachable and caught up?); node %u still leads",
                      m->op.to, n->self->id);
            m->op.kind = OP_NONE;
        }
    }
}
