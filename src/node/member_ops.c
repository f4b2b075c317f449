/* Membership commands of operators: member list, member add / remove /
 * promote / update, leader transfer. Contract: src/node/member.h. */
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

static bool peer_connected(struct ida_node *n, ida_node_id id)
{
    return n->net != NULL && ida_net_peer_up(n->net, id);
}

/* Where node @id is: the membership's addresses for a member, else where
 * it said it listens, else its cluster-file line; NULL if unknown. */
static void where(const struct node_members *m,
                  const struct ida_node *n,
                  ida_node_id id,
                  const struct ida_addr **peer,
                  const struct ida_addr **client)
{
    const struct node_book_entry *e = node_book_find(&m->book, id);
    const struct node_seen *s = node_members_seen(m, id);
    const struct ida_config_node *f = ida_config_node(&n->cfg, id);
    *peer = *client = NULL;
    if (e != NULL && e->member) {
        *peer = &e->peer;
        *client = &e->client;
    } else if (s != NULL && s->has_addrs) {
        *peer = &s->peer;
        *client = &s->client;
    } else if (f != NULL) {
        *peer = &f->peer;
        *client = &f->client;
    }
}

static void fill_info(const struct node_members *m,
                      struct ida_node *n,
                      const struct ida_raft *r,
                      ida_node_id id,
                      uint64_t inc,
                      bool voter,
                      bool waiting,
                      Idalloc__MemberInfo *mi)
{
    const struct ida_addr *peer, *client;
    where(m, n, id, &peer, &client);
    idalloc__member_info__init(mi);
    mi->id = id;
    mi->incarnation = inc;
    mi->peer_addr = peer != NULL ? (char *)peer->text : "";
    mi->client_addr = client != NULL ? (char *)client->text : "";
    mi->voter = voter;
    mi->waiting = waiting;
    if (id == n->self->id) {
        mi->match_index = ida_raft_last_index(r);
        mi->connected = true;
    } else {
        const struct ida_raft_progress *pr = ida_raft_progress_of(r, id);
        mi->match_index = pr != NULL ? pr->match : 0;
        mi->connected = peer_connected(n, id);
    }
}

static void reply_list(const struct node_members *m,
                       struct ida_node *n,
                       const struct ida_raft *r,
                       uint64_t conn,
                       uint64_t seq)
{
    Idalloc__MemberInfo mi[LIST_MAX], *mp[LIST_MAX];
    size_t k = 0;
    const struct ida_raft_conf *c = ida_raft_voters(r);
    for (size_t i = 0; i < c->n + c->n_learners && k < LIST_MAX; i++, k++) {
        bool v = i < c->n;
        fill_info(m, n, r, v ? c->voters[i] : c->learners[i - c->n],
                  v ? c->voter_inc[i] : c->learner_inc[i - c->n], v, false,
                  &mi[k]);
        mp[k] = &mi[k];
    }
    /* Waiting: nodes that spoke with an incarnation the membership does
     * not name (a replaced disk, a removed node, a node asking to join). */
    for (size_t i = 0; i < m->n_seen && k < LIST_MAX; i++) {
        const struct node_seen *s = &m->seen[i];
        bool member = ida_raft_conf_has(c, s->id);
        uint64_t bound = ida_raft_conf_inc(c, s->id);
        if (s->id == n->self->id || s->announced == 0 ||
            (member && (bound == 0 || bound == s->announced))) {
            continue;
        }
        fill_info(m, n, r, s->id, s->announced, false, true, &mi[k]);
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
static ida_node_id caught_up_voter(struct ida_node *n, const struct ida_raft *r)
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
        int up = peer_connected(n, id);
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
    return op == IDALLOC__MEMBER_CHANGE__OP__REMOVE   ? "remove"
           : op == IDALLOC__MEMBER_CHANGE__OP__ADD    ? "add"
           : op == IDALLOC__MEMBER_CHANGE__OP__UPDATE ? "update"
                                                      : "promote";
}

/* Propose @c, with node @id (0: none) at @peer and @client, and wait for
 * its commit. */
static void propose(struct node_members *m,
                    struct ida_node *n,
                    struct ida_raft *r,
                    uint64_t conn,
                    uint64_t seq,
                    const char *what,
                    ida_node_id id,
                    uint64_t inc,
                    const struct ida_raft_conf *c,
                    const struct ida_addr *peer,
                    const struct ida_addr *client)
{
    uint8_t *buf;
    size_t len;
    if (node_members_encode(m, c, peer != NULL ? id : 0, peer, client, &buf,
                            &len) != 0) {
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
        "membership: operator: member %s %u (incarnation %016llx%s%s%s%s) "
        "proposed at index %llu: %zu voters, %zu learners",
        what, id, (unsigned long long)inc, peer != NULL ? ", peer " : "",
        peer != NULL ? peer->text : "", peer != NULL ? ", client " : "",
        peer != NULL ? client->text : "", (unsigned long long)index, c->n,
        c->n_learners);
    m->op.kind = OP_CHANGE;
    m->op.conn = conn;
    m->op.seq = seq;
    m->op.index = index;
    m->op.term = term;
    m->op.inc = inc;
    m->op.started_ms = ida__node_mono_ms();
}

/* The addresses of a change: @mc's, parsed into @peer and @client (1),
 * none given (0), or refused with the answer sent (-1). Only addresses a
 * node can be dialled at, the two distinct, no other member's. */
static int change_addrs(const struct node_members *m,
                        struct ida_node *n,
                        uint64_t conn,
                        uint64_t seq,
                        const char *what,
                        const Idalloc__MemberChange *mc,
                        struct ida_addr *peer,
                        struct ida_addr *client)
{
    const char *p = mc->peer_addr != NULL ? mc->peer_addr : "";
    const char *c = mc->client_addr != NULL ? mc->client_addr : "";
    if (p[0] == '\0' && c[0] == '\0') {
        return 0;
    }
    const char *bad = ida_addr_parse(p, peer) != 0     ? p
                      : ida_addr_parse(c, client) != 0 ? c
                                                       : NULL;
    if (bad != NULL) {
        reply_err(n, conn, seq, IDA_EINVAL, 0,
                  "member %s %u: bad address \"%.64s\": expected IPv4:PORT or "
                  "[IPv6]:PORT, a peer and a client address",
                  what, mc->id, bad);
        return -1;
    }
    const struct ida_addr *any = ida_addr_unspecified(peer)     ? peer
                                 : ida_addr_unspecified(client) ? client
                                                                : NULL;
    if (any != NULL) {
        reply_err(n, conn, seq, IDA_EINVAL, 0,
                  "member %s %u: %s is not an address other nodes can dial; "
                  "give the node's own IP",
                  what, mc->id, any->text);
        return -1;
    }
    if (node_addr_same(peer, client)) {
        reply_err(n, conn, seq, IDA_EINVAL, 0,
                  "member %s %u: the peer and the client address are the "
                  "same (%s)",
                  what, mc->id, peer->text);
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        const struct ida_addr *a = i == 0 ? peer : client;
        ida_node_id user = node_book_addr_user(&m->book, a, mc->id);
        if (user != 0) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member %s %u: address %s is used by member %u", what,
                      mc->id, a->text, user);
            return -1;
        }
    }
    return 1;
}

/* member add ID [PEER CLIENT] (member.h). */
static void change_add(struct node_members *m,
                       struct ida_node *n,
                       struct ida_raft *r,
                       uint64_t conn,
                       uint64_t seq,
                       const Idalloc__MemberChange *mc,
                       int has_addrs,
                       struct ida_addr *peer,
                       struct ida_addr *client)
{
    ida_node_id id = mc->id;
    struct ida_raft_conf c = *ida_raft_voters(r);
    int vs = ida_raft_conf_slot(&c, id);
    int ls = ida_raft_conf_learner_slot(&c, id);
    uint64_t bound = ida_raft_conf_inc(&c, id);
    const struct node_seen *s = node_members_seen(m, id);
    uint64_t heard = s != NULL ? s->announced : 0;
    if (vs >= 0 || ls >= 0) {
        const struct node_book_entry *e = node_book_find(&m->book, id);
        if (has_addrs && e != NULL &&
            (!node_addr_same(&e->peer, peer) ||
             !node_addr_same(&e->client, client))) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member add %u: it is a member at peer %s client %s; "
                      "to move it: idalloc member update %u %s %s",
                      id, e->peer.text, e->client.text, id, peer->text,
                      client->text);
        } else if (bound == 0 || heard == 0 || bound == heard) {
            reply_change(n, conn, seq, false, 0, bound);
        } else {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member add %u: it is a member as incarnation "
                      "%016llx but speaks as %016llx (its data "
                      "directory was replaced): member remove %u first",
                      id, (unsigned long long)bound, (unsigned long long)heard,
                      id);
        }
        return;
    }
    if (!has_addrs) {
        const struct ida_config_node *f = ida_config_node(&n->cfg, id);
        if (f == NULL) {
            reply_err(n, conn, seq, IDA_EREFUSED, 0,
                      "member add %u: node %u is not in the cluster file: "
                      "give its addresses (idalloc member add %u PEER_ADDR "
                      "CLIENT_ADDR)%s%s%s%s",
                      id, id, id,
                      s != NULL && s->has_addrs ? "; it says it "
                                                  "listens on "
                                                : "",
                      s != NULL && s->has_addrs ? s->peer.text : "",
                      s != NULL && s->has_addrs ? " " : "",
                      s != NULL && s->has_addrs ? s->client.text : "");
            return;
        }
        *peer = f->peer;
        *client = f->client;
        for (int i = 0; i < 2; i++) {
            const struct ida_addr *a = i == 0 ? peer : client;
            ida_node_id user = node_book_addr_user(&m->book, a, id);
            if (user != 0) {
                reply_err(n, conn, seq, IDA_EREFUSED, 0,
                          "member add %u: its cluster-file address %s is "
                          "used by member %u: give its addresses",
                          id, a->text, user);
                return;
            }
        }
    }
    if (heard == 0) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member add %u: node %u has not been heard from, so "
                  "its incarnation is unknown: start it, then retry",
                  id, id);
        return;
    }
    if (s->has_addrs && (!node_addr_same(&s->peer, peer) ||
                         !node_addr_same(&s->client, client))) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member add %u: node %u says it listens on peer %s client "
                  "%s, not on peer %s client %s",
                  id, id, s->peer.text, s->client.text, peer->text,
                  client->text);
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
    propose(m, n, r, conn, seq, "add", id, heard, &c, peer, client);
}

/* member update ID PEER CLIENT (member.h). */
static void change_update(struct node_members *m,
                          struct ida_node *n,
                          struct ida_raft *r,
                          uint64_t conn,
                          uint64_t seq,
                          ida_node_id id,
                          const struct ida_addr *peer,
                          const struct ida_addr *client)
{
    const struct ida_raft_conf *c = ida_raft_voters(r);
    const struct node_book_entry *e = node_book_find(&m->book, id);
    if ((ida_raft_conf_slot(c, id) < 0 &&
         ida_raft_conf_learner_slot(c, id) < 0) ||
        e == NULL || !e->member) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member update %u: node %u is not a member (member add "
                  "%u %s %s adds it)",
                  id, id, id, peer->text, client->text);
        return;
    }
    if (node_addr_same(&e->peer, peer) && node_addr_same(&e->client, client)) {
        reply_change(n, conn, seq, false, 0, ida_raft_conf_inc(c, id));
        return;
    }
    /* Where the node says it listens, when it said so: a typo must not
     * send every node to an address where nobody is. */
    const struct node_seen *s = node_members_seen(m, id);
    const struct ida_addr *at_peer = id == n->self->id ? &n->self->peer
                                     : s != NULL && s->has_addrs ? &s->peer
                                                                 : NULL;
    const struct ida_addr *at_client = id == n->self->id ? &n->self->client
                                       : at_peer != NULL ? &s->client
                                                         : NULL;
    if (at_peer != NULL && (!node_addr_same(at_peer, peer) ||
                            !node_addr_same(at_client, client))) {
        reply_err(n, conn, seq, IDA_EREFUSED, 0,
                  "member update %u: node %u says it listens on peer %s "
                  "client %s, not on peer %s client %s",
                  id, id, at_peer->text, at_client->text, peer->text,
                  client->text);
        return;
    }
    propose(m, n, r, conn, seq, "update", id, ida_raft_conf_inc(c, id), c, peer,
            client);
}

static void change(struct node_members *m,
                   struct ida_node *n,
                   struct ida_raft *r,
                   uint64_t conn,
                   uint64_t seq,
                   const Idalloc__MemberChange *mc)
{
    const char *what = op_name(mc->op);
    ida_node_id id = mc->id;
    if (mc->op == IDALLOC__MEMBER_CHANGE__OP__OP_UNSPECIFIED || id == 0 ||
        id > IDA_NET_NODE_ID_MAX) {
        reply_err(n, conn, seq, IDA_EINVAL, 0,
                  "member change: an operation and a node id (1 to %u) are "
                  "needed",
                  IDA_NET_NODE_ID_MAX);
        return;
    }
    struct ida_addr peer, client;
    int has_addrs = change_addrs(m, n, conn, seq, what, mc, &peer, &client);
    if (has_addrs < 0) {
        return;
    }
    if (has_addrs && mc->op != IDALLOC__MEMBER_CHANGE__OP__ADD &&
        mc->op != IDALLOC__MEMBER_CHANGE__OP__UPDATE) {
        reply_err(n, conn, seq, IDA_EINVAL, 0,
                  "member %s %u: takes no addresses", what, id);
        return;
    }
    if (mc->op == IDALLOC__MEMBER_CHANGE__OP__ADD) {
        change_add(m, n, r, conn, seq, mc, has_addrs, &peer, &client);
        return;
    }
    if (mc->op == IDALLOC__MEMBER_CHANGE__OP__UPDATE) {
        if (!has_addrs) {
            reply_err(n, conn, seq, IDA_EINVAL, 0,
                      "member update %u: a peer and a client address are "
                      "needed",
                      id);
            return;
        }
        change_update(m, n, r, conn, seq, id, &peer, &client);
        return;
    }
    struct ida_raft_conf c = *ida_raft_voters(r);
    int vs = ida_raft_conf_slot(&c, id);
    int ls = ida_raft_conf_learner_slot(&c, id);
    uint64_t bound = ida_raft_conf_inc(&c, id);
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
            ida_node_id to = caught_up_voter(n, r);
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
        propose(m, n, r, conn, seq, what, id, bound, &c, NULL, NULL);
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
    propose(m, n, r, conn, seq, what, id, inc, &c, NULL, NULL);
}

static void transfer(struct node_members *m,
                     struct ida_node *n,
                     struct ida_raft *r,
                     uint64_t conn,
                     uint64_t seq,
                     ida_node_id to)
{
    if (to == n->self->id) {
        reply_transfer(n, conn, seq, to);
        return;
    }
    if (to == 0) {
        to = caught_up_voter(n, r);
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
                          uint64_t conn,
                          const Idalloc__ClientRequest *req)
{
    uint64_t seq = req->request_seq;
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_MEMBER_LIST) {
        reply_list(m, n, r, conn, seq);
        return;
    }
    if (m->op.kind != OP_NONE) {
        reply_err(n, conn, seq, IDA_EBUSY, 0,
                  "another membership change or leader transfer is under "
                  "way; retry");
        return;
    }
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_MEMBER_CHANGE) {
        change(m, n, r, conn, seq, req->member_change);
    } else {
        transfer(m, n, r, conn, seq, req->leader_transfer->to);
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
