/* Joining and re-admission at the raft processor (src/node/member.h).
 * Internal: src/node/raft_proc.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/fdio.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"
#include "src/node/import.h"
#include "src/node/raft_proc.h"

/* --- membership (src/node/member.h) -------------------------------------- */

static void send_hello(struct raft_proc *rp, unsigned to, bool reply)
{
    Idalloc__PeerMessage pm;
    Idalloc__Hello h;
    uint8_t *buf = NULL;
    const struct ida_raft *r = rp->mem.joining ? NULL : &rp->raft;
    if (node_hello_make(rp->node, r, &rp->mem.book, to, reply, &pm, &h, &buf) ==
        0) {
        ida_net_send_peer(rp->node->net, to, &pm);
    }
    ida_free(buf);
}

static void start_membership0(struct raft_proc *rp,
                              struct ida_sender *s,
                              uint8_t *data,
                              size_t len);

/* --- seeded by an import (src/node/import.h) ------------------------------
 */

/* Every other node of the cluster file answered that it is new: remove the
 * marker, durably, and take part (the core's ticks start now). A marker
 * that cannot be removed keeps the node waiting: left behind, it would
 * hold it at its next start, when the others are members. */
static void seed_open(struct raft_proc *rp, uint64_t now)
{
    const struct ida_node *n = rp->node;
    char mark[sizeof(n->dir) + 16];
    snprintf(mark, sizeof(mark), "%s/%s", n->dir, IDA_NODE_SEEDED_FILE);
    if ((unlink(mark) != 0 && errno != ENOENT) || ida_fsync_dir(n->dir) != 0) {
        int err = errno;
        if (now - rp->mem.last_wait_log_ms >= 5000) {
            rp->mem.last_wait_log_ms = now;
            IDA_ERROR(
                "import: cannot remove %s: %s (the node waits; it "
                "tries again)",
                mark, strerror(err));
        }
        return;
    }
    rp->mem.seeded = false;
    IDA_INFO(
        "import: every other node of the cluster file answered that it "
        "is new: this node, seeded from a backup, now leads cluster %s "
        "and adds them as they ask",
        n->cfg.cluster);
}

/* Seeded: Hellos out, the gate checked, and every 5 s a line that says what
 * the node waits for. */
static void seed_wait(struct raft_proc *rp, uint64_t now)
{
    const struct ida_node *n = rp->node;
    if (node_seed_heard(&rp->mem, n, NULL, now)) {
        seed_open(rp, now);
        return;
    }
    if (now - rp->mem.last_wait_log_ms < 5000) {
        return;
    }
    rp->mem.last_wait_log_ms = now;
    char ids[128];
    const struct node_members *m = &rp->mem;
    if (node_seed_waiting(m, n, true, now, ids, sizeof(ids)) > 0) {
        IDA_WARN(
            "import: this node was seeded from a backup and leads only "
            "once every other node of the cluster file answers that it "
            "is new, but node(s) %s answered with a membership: stop "
            "all of them, then give each a new data directory (an "
            "earlier start of this cluster, or a second import?)",
            ids);
    } else if (m->seed_evidence_ms != 0 &&
               now < m->seed_evidence_ms + node_seed_quiet_ms(n)) {
        IDA_WARN(
            "import: this node was seeded from a backup and leads only "
            "once no node shows it holds a membership, but node %u%s "
            "spoke to it as a member of a running cluster within the last "
            "%llu ms: stop that cluster",
            (unsigned)m->seed_evidence_from,
            node_file_index(n, m->seed_evidence_from) < 0
                ? " (not in the cluster file)"
                : "",
            (unsigned long long)node_seed_quiet_ms(n));
    } else if (node_seed_waiting(m, n, false, now, ids, sizeof(ids)) > 0) {
        IDA_INFO(
            "import: this node was seeded from a backup and leads once "
            "every other node of the cluster file answers that it is "
            "new: waiting to hear from node(s) %s",
            ids);
    }
}

static void on_seed_hello(struct raft_proc *rp, const Idalloc__PeerMessage *pb)
{
    uint64_t now = ida__node_mono_ms();
    if (node_seed_heard(&rp->mem, rp->node, pb, now)) {
        seed_open(rp, now);
    }
}

/* A joining node asks often (an answer sent before the other's link to it
 * came up is lost, and the node takes no part until one arrives); a member
 * that is not admitted announces its incarnation now and then, so a leader
 * can re-admit it, and one the membership names elsewhere than it listens
 * announces where it is, so a leader can check `member update`. Every node
 * of the address book is asked (src/node/book.h). A new directory started
 * with --single-node has no one to ask: it creates the cluster at once. */
void ida__rp_hello_all(struct raft_proc *rp, struct ida_sender *s, uint64_t now)
{
    uint64_t every = rp->mem.joining || rp->mem.seeded ? 50 : 1000;
    if (now - rp->mem.last_hello_ms < every) {
        return;
    }
    rp->mem.last_hello_ms = now;
    const struct ida_node *n = rp->node;
    uint8_t *conf;
    size_t conf_len;
    if (rp->mem.joining && !rp->mem.m0_pending && n->single_node &&
        node_first_membership(&rp->mem, n, now, &conf, &conf_len)) {
        start_membership0(rp, s, conf, conf_len); /* no one else to hear */
        return;
    }
    const struct node_book *b = &rp->mem.book;
    for (size_t i = 0; i < b->n; i++) {
        if (b->e[i].id != n->self->id) {
            send_hello(rp, b->e[i].id, false);
        }
    }
    if (rp->mem.seeded) {
        seed_wait(rp, now);
        return;
    }
    if (!rp->mem.joining || now - rp->mem.last_wait_log_ms < 5000) {
        return;
    }
    rp->mem.last_wait_log_ms = now;
    if (node_file_index(n, n->self->id) < 0 || n->join) {
        IDA_INFO(
            "membership: new data directory: waiting to be added to cluster "
            "%s (a new node: run idalloc member add %u %s %s; a member whose "
            "disk was replaced: the leader re-admits it with auto_rejoin on)",
            n->cfg.cluster, n->self->id, n->self->peer.text,
            n->self->client.text);
        return;
    }
    char missing[128] = "";
    size_t len = 0;
    for (unsigned i = 0; i < n->cfg.node_count; i++) {
        /* Not heard, or heard new too long ago to count. */
        bool stale = rp->mem.heard[i] && rp->mem.fresh[i] &&
                     !node_heard_new_lately(&rp->mem, n, i, now);
        if ((!rp->mem.heard[i] || stale) && len + 8 < sizeof(missing)) {
            len +=
                (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u",
                                 len > 0 ? ", " : "", n->cfg.nodes[i].id);
        }
    }
    if (len == 0 && n->cfg.node_count == 1 && !n->single_node) {
        IDA_INFO(
            "membership: new data directory and a cluster file of this "
            "node alone: waiting (start it with --single-node to create "
            "a one-node cluster, or with --join to join a running one)");
    } else if (len > 0) {
        IDA_INFO(
            "membership: new data directory: waiting to hear from "
            "node(s) %s (the first start of a cluster needs every node "
            "of the cluster file; a replaced disk needs the leader)",
            missing);
    }
}

/* Member @id spoke with incarnation @inc: if the membership names another
 * one (or no longer names @id), it came back with a new data directory. */
void ida__rp_note_incarnation(struct raft_proc *rp, unsigned id, uint64_t inc)
{
    const struct ida_raft_conf *c = ida_raft_voters(&rp->raft);
    bool member = ida_raft_conf_has(c, id);
    uint64_t bound = ida_raft_conf_inc(c, id);
    if (inc == 0 || (member && (bound == 0 || bound == inc))) {
        return;
    }
    if (!member && rp->mem.rejoin_id != id &&
        !node_members_may_readmit(&rp->mem, rp->node, c, id, inc)) {
        /* Removed by an operator, or a node id that never was a member:
         * only an operator adds it (member.h). Said once per incarnation. */
        const struct node_seen *s = node_members_seen(&rp->mem, id);
        if (s != NULL && node_members_untold(&rp->mem, id, inc)) {
            IDA_INFO(
                "membership: node %u (incarnation %016llx%s%s%s%s) is not a "
                "member; an operator adds it with: idalloc member add "
                "%u%s%s%s%s",
                id, (unsigned long long)inc, s->has_addrs ? ", peer " : "",
                s->has_addrs ? s->peer.text : "",
                s->has_addrs ? ", client " : "",
                s->has_addrs ? s->client.text : "", id, s->has_addrs ? " " : "",
                s->has_addrs ? s->peer.text : "", s->has_addrs ? " " : "",
                s->has_addrs ? s->client.text : "");
        }
        return;
    }
    if (rp->mem.warned_id != id || rp->mem.warned_inc != inc) {
        rp->mem.warned_id = id;
        rp->mem.warned_inc = inc;
        IDA_WARN(
            "membership: node %u speaks as incarnation %016llx, not as "
            "the member the cluster knows (%016llx): its data directory "
            "was replaced. It may not vote or count until it is "
            "re-admitted%s",
            id, (unsigned long long)inc, (unsigned long long)bound,
            rp->node->cfg.auto_rejoin
                ? " (auto_rejoin on: the leader does it)"
                : " (auto_rejoin off: see README, Runbook)");
    }
    if (rp->node->cfg.auto_rejoin && rp->role == IDA_RAFT_LEADER) {
        rp->mem.rejoin_id = id;
        rp->mem.rejoin_inc = inc;
    }
}

/* Write @data (@len bytes, ida_malloc'd; ownership moves here) as the
 * first membership. */
static void start_membership0(struct raft_proc *rp,
                              struct ida_sender *s,
                              uint8_t *data,
                              size_t len)
{
    struct ida_nm_membership0 *m = ida_calloc(1, sizeof(*m));
    if (m == NULL) {
        ida_free(data);
        return; /* the next Hello answer tries again */
    }
    m->data = data;
    m->len = len;
    rp->mem.m0_pending = true;
    if (node_post(&rp->q, s, rp->node->p_storage, IDA_NM_MEMBERSHIP0, m) != 0) {
        rp->mem.m0_pending = false;
    }
}

void ida__rp_on_membership0_done(struct raft_proc *rp,
                                 struct ida_nm_membership0 *m)
{
    rp->mem.m0_pending = false;
    struct ida_raft_conf c;
    if (m->rv != 0 || node_conf_decode(m->data, m->len, &c) != 0) {
        /* Tried again at the next Hello (every 50 ms): one line at the
         * first failure, then one every 5 s with the count. */
        uint64_t now = ida__node_mono_ms();
        rp->mem.m0_failures++;
        if (rp->mem.m0_failures == 1 || now - rp->mem.m0_fail_log_ms >= 5000) {
            rp->mem.m0_fail_log_ms = now;
            IDA_ERROR(
                "membership: the first membership was not stored: %s "
                "(%llu tries failed so far; trying again as the "
                "others answer)",
                idalloc_strerror(m->rv != 0 ? m->rv : IDA_EPROTO),
                (unsigned long long)rp->mem.m0_failures);
        }
        return;
    }
    struct ida_raft_config rc = rp->base;
    rc.n_voters = c.n;
    memcpy(rc.voters, c.voters, sizeof(rc.voters));
    memcpy(rc.voter_inc, c.voter_inc, sizeof(rc.voter_inc));
    /* Nothing was stepped while joining: the core starts afresh. */
    ida_raft_close(&rp->raft);
    int rv = ida_raft_init(&rp->raft, &rc, NULL);
    IDA_OOM_CHECK(rv != IDA_ENOMEM, "raft: starting the core");
    IDA_ASSERT(rv == 0);
    rp->base = rc;
    rp->mem.joining = false;
    /* The membership in effect until the log holds one: the address book
     * is built from it (ida__rp_book_refresh()). */
    ida_free(rp->node->membership0);
    rp->node->membership0 = m->data;
    rp->node->membership0_len = m->len;
    m->data = NULL;
    bool admitted = ida_raft_admitted(&rp->raft);
    IDA_INFO("membership: %s (%zu voters); this node is incarnation %016llx%s",
             admitted ? "created the cluster" : "joined the cluster", c.n,
             (unsigned long long)rp->node->incarnation,
             admitted ? "" : ", not admitted yet: waiting for the leader");
}

void ida__rp_on_hello(struct raft_proc *rp,
                      struct ida_sender *s,
                      const Idalloc__PeerMessage *pb)
{
    if (!pb->hello->reply) {
        send_hello(rp, pb->from, true);
    }
    if (rp->mem.joining) {
        uint8_t *conf;
        size_t len;
        if (!rp->mem.m0_pending &&
            node_hello_learn(&rp->mem, rp->node, pb, ida__node_mono_ms(), &conf,
                             &len)) {
            start_membership0(rp, s, conf, len);
        }
        return;
    }
    if (rp->mem.seeded) {
        on_seed_hello(rp, pb);
        return; /* re-admits no one before it takes part */
    }
    ida__rp_note_incarnation(rp, pb->from, pb->from_incarnation);
}

void ida__rp_rejoin_step(struct raft_proc *rp, uint64_t now)
{
    struct ida_raft_conf c;
    if (!rp->node->cfg.auto_rejoin ||
        !node_rejoin_step(&rp->mem, &rp->raft, now, &c)) {
        return;
    }
    uint8_t *buf;
    size_t len;
    if (node_members_encode(&rp->mem, &c, 0, NULL, NULL, &buf, &len) != 0) {
        return;
    }
    int rv =
        ida_raft_propose(&rp->raft, IDA_ENTRY_CONFIG, buf, len, NULL, NULL);
    ida_free(buf);
    if (rv == 0) {
        IDA_INFO(
            "membership: re-admitting node %u incarnation %016llx: "
            "proposed %zu voters, %zu learners",
            rp->mem.rejoin_id, (unsigned long long)rp->mem.rejoin_inc, c.n,
            c.n_learners);
    } else if (rv != IDA_EBUSY) {
        IDA_WARN("membership: re-admission step refused: %s",
                 idalloc_strerror(rv));
    }
}

/* The voters the core starts from (before its log or a snapshot holds a
 * membership): membership0; for a directory older than incarnations, the
 * cluster file's nodes unbound; for a new directory, the cluster file's
 * nodes bound to an incarnation nobody has, so the node takes no part until
 * it learned the cluster (src/node/member.h). */
int ida__rp_first_voters(struct raft_proc *rp, struct ida_raft_config *rc)
{
    struct ida_node *n = rp->node;
    rc->incarnation = n->incarnation;
    rc->boot = n->boot;
    struct ida_raft_conf c;
    rp->mem.seeded = n->seeded; /* an import's directory has membership0 */
    if (n->membership0 != NULL) {
        int rv = node_conf_decode(n->membership0, n->membership0_len, &c);
        if (rv != 0) {
            IDA_ERROR("node: the stored first membership does not decode");
            return IDA_ECORRUPT;
        }
    } else {
        uint64_t none[IDA_CONFIG_NODES_MAX];
        for (unsigned i = 0; i < IDA_CONFIG_NODES_MAX; i++) {
            none[i] = n->fresh ? UINT64_MAX : 0;
        }
        node_conf_first(n, none, &c);
        rp->mem.joining = n->fresh;
        if (!n->fresh) {
            IDA_WARN(
                "node: this data directory predates incarnations: the "
                "membership is unbound until it changes, so a member "
                "whose disk is replaced is not told apart yet");
        }
    }
    rc->n_voters = c.n;
    memcpy(rc->voters, c.voters, sizeof(rc->voters));
    memcpy(rc->voter_inc, c.voter_inc, sizeof(rc->voter_inc));
    return 0;
}

/* The encoded membership in effect at the core: its latest config entry,
 * else its snapshot's config, else the first membership stored; NULL for
 * a directory older than incarnations (the cluster file's nodes). */
static const uint8_t *conf_in_effect(const struct raft_proc *rp, size_t *len)
{
    const struct ida_raft *r = &rp->raft;
    /* conf_index is the core's own record of where its membership came
     * from (read-only here, like snap_index in status). */
    if (r->conf_index != 0) {
        const struct ida_entry *e = ida_raft_entry(r, r->conf_index);
        if (e != NULL && e->type == IDA_ENTRY_CONFIG) {
            *len = e->len;
            return e->data;
        }
    }
    const uint8_t *snap = ida_raft_snapshot_config(r, len);
    if (snap != NULL && *len > 0) {
        return snap;
    }
    *len = rp->node->membership0_len;
    return rp->node->membership0;
}

void ida__rp_book_refresh(struct raft_proc *rp)
{
    struct ida_node *n = rp->node;
    size_t len = 0;
    const uint8_t *conf = rp->mem.joining ? NULL : conf_in_effect(rp, &len);
    const struct node_book *join =
        rp->mem.joining && n->has_join_book ? &n->join_book : NULL;
    if (!node_members_book(&rp->mem, n, conf, len, join) && rp->book_pushed) {
        return;
    }
    const struct node_book *b = &rp->mem.book;
    struct ida_net_peer peers[NODE_BOOK_MAX];
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->e[i].id != n->self->id) {
            peers[k++] =
                (struct ida_net_peer){.id = b->e[i].id, .addr = b->e[i].peer};
        }
    }
    int rv = ida_net_set_peers(n->net, peers, k);
    if (rv != 0) {
        IDA_WARN("membership: the address book was not taken by net: %s",
                 idalloc_strerror(rv));
    }
    rp->book_pushed = rv == 0;
    ida__node_book_publish(n, b);
}
