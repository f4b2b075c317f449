/* Membership at the node: joining, re-admission, the seen table, the
 * membership in effect against the cluster file, the address book.
 * Contract and design: src/node/member.h. */
#include "src/node/member.h"

#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "base/log.h"
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
                    const struct node_book *book,
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
    hello->peer_addr = (char *)n->self->peer.text;
    hello->client_addr = (char *)n->self->client.text;
    if (r != NULL) {
        size_t len;
        int rv = node_conf_encode_full(book, ida_raft_voters(r), buf, &len);
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

static int copy_out(const uint8_t *data, size_t len, uint8_t **out, size_t *n)
{
    *out = ida_malloc(len > 0 ? len : 1);
    if (*out == NULL) {
        return 0;
    }
    memcpy(*out, data, len);
    *n = len;
    return 1;
}

/* Note what the cluster file's node that sent the Hello @pm said: that it
 * is there, its incarnation, whether it is new. 0 when @pm says nothing. */
static int note_file_hello(struct node_members *m,
                           const struct ida_node *n,
                           const Idalloc__PeerMessage *pm,
                           uint64_t now)
{
    const Idalloc__Hello *h = pm->hello;
    if (h == NULL || pm->from_incarnation == 0) {
        return 0;
    }
    int i = node_file_index(n, pm->from);
    if (i >= 0) {
        m->heard[i] = true;
        m->inc[i] = pm->from_incarnation;
        m->fresh[i] = !h->bootstrapped;
        m->heard_ms[i] = now;
    }
    return 1;
}

int node_hello_learn(struct node_members *m,
                     const struct ida_node *n,
                     const Idalloc__PeerMessage *pm,
                     uint64_t now,
                     uint8_t **conf,
                     size_t *len)
{
    const Idalloc__Hello *h = pm->hello;
    if (!note_file_hello(m, n, pm, now)) {
        return 0;
    }
    if (h->bootstrapped) {
        /* Taken from the leader (another node's may be older than the
         * cluster's), or when it names this node's own incarnation as a
         * voter: then it is the first membership, made from what this node
         * announced. Kept as received: it carries every member's
         * addresses. */
        struct ida_raft_conf c;
        if (h->config.len == 0 ||
            node_conf_decode(h->config.data, h->config.len, &c) != 0) {
            return 0;
        }
        int s = ida_raft_conf_slot(&c, n->self->id);
        if (h->leader != pm->from &&
            (s < 0 || c.voter_inc[s] != n->incarnation)) {
            return 0;
        }
        return copy_out(h->config.data, h->config.len, conf, len);
    }
    return node_first_membership(m, n, now, conf, len);
}

int node_first_membership(const struct node_members *m,
                          const struct ida_node *n,
                          uint64_t now,
                          uint8_t **conf,
                          size_t *len)
{
    /* A first start is made by the cluster file's nodes alone, each at its
     * file line: a node outside it, or told to join, only joins. */
    if (node_file_index(n, n->self->id) < 0 || n->join) {
        return 0;
    }
    for (unsigned k = 0; k < n->cfg.node_count; k++) {
        bool self = n->cfg.nodes[k].id == n->self->id;
        if (!m->heard[k] || !m->fresh[k] ||
            (!self && now >= m->heard_ms[k] + NODE_HEARD_RECENT_MS)) {
            return 0;
        }
    }
    struct ida_raft_conf c;
    struct node_book file;
    node_conf_first(n, m->inc, &c);
    node_book_build(&file, NULL, 0, &n->cfg);
    return node_conf_encode_full(&file, &c, conf, len) == 0;
}

uint64_t node_seed_quiet_ms(const struct ida_node *n)
{
    /* A leader that names this node dials it again within the net's
     * reconnect backoff (at most 2 s, src/node/net_peer.c) and then sends a
     * heartbeat every heartbeat_ms; a candidate asks within an election
     * timeout or two. */
    uint64_t q = NODE_SEED_QUIET_MS;
    uint64_t hb = 2000 + 3 * (uint64_t)n->cfg.heartbeat_ms;
    uint64_t el = 2 * (uint64_t)n->cfg.election_timeout_ms;
    q = hb > q ? hb : q;
    return el > q ? el : q;
}

void node_seed_evidence(struct node_members *m,
                        const struct ida_node *n,
                        ida_node_id from,
                        uint64_t inc,
                        uint64_t now)
{
    m->seed_evidence_ms = now;
    m->seed_evidence_from = from;
    int i = node_file_index(n, from);
    if (i >= 0) {
        m->heard[i] = true;
        m->fresh[i] = false;
        m->inc[i] = inc;
        m->heard_ms[i] = now;
    }
}

bool node_seed_heard(struct node_members *m,
                     const struct ida_node *n,
                     const Idalloc__PeerMessage *pm,
                     uint64_t now)
{
    if (m->seed_since_ms == 0) {
        m->seed_since_ms = now;
    }
    if (pm != NULL && note_file_hello(m, n, pm, now)) {
        if (pm->hello->bootstrapped) {
            node_seed_evidence(m, n, pm->from, pm->from_incarnation, now);
        }
    }
    uint64_t quiet = node_seed_quiet_ms(n);
    /* A stamp "after" now fails closed (it never should be). */
    if (now < m->seed_since_ms + quiet ||
        (m->seed_evidence_ms != 0 && now < m->seed_evidence_ms + quiet)) {
        return false;
    }
    for (unsigned k = 0; k < n->cfg.node_count; k++) {
        if (n->cfg.nodes[k].id != n->self->id &&
            (!m->heard[k] || !m->fresh[k] ||
             now >= m->heard_ms[k] + NODE_HEARD_RECENT_MS)) {
            return false;
        }
    }
    return true;
}

bool node_heard_new_lately(const struct node_members *m,
                           const struct ida_node *n,
                           unsigned k,
                           uint64_t now)
{
    return n->cfg.nodes[k].id == n->self->id ||
           (m->heard[k] && m->fresh[k] &&
            now < m->heard_ms[k] + NODE_HEARD_RECENT_MS);
}

size_t node_seed_waiting(const struct node_members *m,
                         const struct ida_node *n,
                         bool bootstrapped,
                         uint64_t now,
                         char *out,
                         size_t cap)
{
    size_t len = 0, count = 0;
    out[0] = '\0';
    for (unsigned k = 0; k < n->cfg.node_count && len < cap; k++) {
        bool has = m->heard[k] && !m->fresh[k];
        if (n->cfg.nodes[k].id == n->self->id ||
            (bootstrapped ? !has
                          : has || node_heard_new_lately(m, n, k, now))) {
            continue;
        }
        len += (size_t)snprintf(out + len, cap - len, "%s%u",
                                count > 0 ? ", " : "", n->cfg.nodes[k].id);
        count++;
    }
    return count;
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

/* Between two re-admission steps. A step is a config entry, which the core
 * takes only once the previous one committed (IDA_EBUSY before), so this
 * only paces the attempts: each step waits for that commit, not for a
 * fixed time (at 500 ms, a wiped node's catch-up waited half a second
 * between its removal and its return as a learner). */
#define REJOIN_STEP_MS 50

int node_rejoin_step(struct node_members *m,
                     const struct ida_raft *r,
                     uint64_t now_ms,
                     struct ida_raft_conf *out)
{
    if (m->rejoin_id == 0 || ida_raft_role(r) != IDA_RAFT_LEADER ||
        now_ms - m->last_rejoin_ms < REJOIN_STEP_MS) {
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

/* --- the seen table -------------------------------------------------------
 */

const struct node_seen *node_members_seen(const struct node_members *m,
                                          ida_node_id id)
{
    for (size_t i = 0; i < m->n_seen; i++) {
        if (m->seen[i].id == id) {
            return &m->seen[i];
        }
    }
    return NULL;
}

/* The entry of @id, made (in place of the least recently heard one when
 * the table is full) if it has none. */
static struct node_seen *seen_get(struct node_members *m, ida_node_id id)
{
    struct node_seen *s = (struct node_seen *)node_members_seen(m, id);
    if (s == NULL) {
        if (m->n_seen < NODE_SEEN_MAX) {
            s = &m->seen[m->n_seen++];
        } else {
            s = &m->seen[0];
            for (size_t i = 1; i < m->n_seen; i++) {
                if (m->seen[i].used < s->used) {
                    s = &m->seen[i];
                }
            }
        }
        memset(s, 0, sizeof(*s));
        s->id = id;
    }
    s->used = ++m->seen_clock;
    return s;
}

void node_members_heard(struct node_members *m,
                        ida_node_id id,
                        uint64_t inc,
                        const Idalloc__Hello *hello)
{
    if (id == 0) {
        return;
    }
    struct node_seen *s = seen_get(m, id);
    if (inc != 0) {
        s->announced = inc;
    }
    struct ida_addr peer, client;
    if (hello == NULL || hello->peer_addr == NULL ||
        hello->client_addr == NULL ||
        ida_addr_parse(hello->peer_addr, &peer) != 0 ||
        ida_addr_parse(hello->client_addr, &client) != 0 ||
        ida_addr_unspecified(&peer) || ida_addr_unspecified(&client)) {
        return;
    }
    bool fresh = !s->has_addrs || !node_addr_same(&s->peer, &peer) ||
                 !node_addr_same(&s->client, &client);
    s->has_addrs = true;
    s->peer = peer;
    s->client = client;
    const struct node_book_entry *e = node_book_find(&m->book, id);
    if (fresh && e != NULL && e->member &&
        (!node_addr_same(&e->peer, &peer) ||
         !node_addr_same(&e->client, &client))) {
        /* A member restarted elsewhere (README, Runbook: "Move a node"). */
        IDA_INFO(
            "membership: member %u says it listens on peer %s client %s, but "
            "the membership names peer %s client %s: if it moved, run "
            "idalloc member update %u %s %s",
            id, peer.text, client.text, e->peer.text, e->client.text, id,
            peer.text, client.text);
    }
}

void node_members_bound(struct node_members *m, ida_node_id id, uint64_t inc)
{
    if (inc != 0) {
        seen_get(m, id)->last_bound = inc;
    }
}

bool node_members_untold(struct node_members *m, ida_node_id id, uint64_t inc)
{
    struct node_seen *s = seen_get(m, id);
    if (s->told == inc) {
        return false;
    }
    s->told = inc;
    return true;
}

bool node_members_may_readmit(const struct node_members *m,
                              const struct ida_node *n,
                              const struct ida_raft_conf *c,
                              ida_node_id id,
                              uint64_t inc)
{
    const struct node_seen *s = node_members_seen(m, id);
    uint64_t bound = s != NULL ? s->last_bound : 0;
    return node_conf_removed_slot(c, id) < 0 && bound != inc &&
           (node_file_index(n, id) >= 0 || bound != 0);
}

/* --- the membership in effect against the cluster file --------------------
 */

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

/* Whether every member of @c is at its cluster-file line in @b. */
static bool at_file_addresses(const struct ida_node *n,
                              const struct node_book *b,
                              const struct ida_raft_conf *c,
                              char *moved,
                              size_t cap)
{
    size_t len = 0;
    bool same = true;
    moved[0] = '\0';
    for (size_t k = 0; k < c->n + c->n_learners; k++) {
        ida_node_id id = k < c->n ? c->voters[k] : c->learners[k - c->n];
        const struct node_book_entry *e = node_book_find(b, id);
        const struct ida_config_node *f = ida_config_node(&n->cfg, id);
        if (e == NULL || !e->member ||
            (f != NULL && node_addr_same(&e->peer, &f->peer) &&
             node_addr_same(&e->client, &f->client))) {
            continue;
        }
        same = false;
        if (len + 2 * IDA_ADDR_TEXT_MAX + 40 < cap) {
            len += (size_t)snprintf(moved + len, cap - len,
                                    "%snode %u at %s %s%s", len ? ", " : "", id,
                                    e->peer.text, e->client.text,
                                    f != NULL ? "" : " (not in the file)");
        }
    }
    return same;
}

/* The membership in effect names this node at other addresses than the
 * ones it listens on: the others dial those. */
static void compare_with_self(struct node_members *m, const struct ida_node *n)
{
    const struct node_book_entry *e = node_book_find(&m->book, n->self->id);
    m->self_moved = e != NULL && e->member &&
                    (!node_addr_same(&e->peer, &n->self->peer) ||
                     !node_addr_same(&e->client, &n->self->client));
    if (!m->self_moved) {
        return;
    }
    IDA_WARN(
        "membership: the membership in effect names this node (%u) at peer "
        "%s client %s, but it listens on peer %s client %s: the others "
        "dial %s; if this node moved, run idalloc member update %u %s %s",
        n->self->id, e->peer.text, e->client.text, n->self->peer.text,
        n->self->client.text, e->peer.text, n->self->id, n->self->peer.text,
        n->self->client.text);
}

/* Log once per membership that is not exactly the cluster file's nodes as
 * voters at their file addresses (member.h). */
static void compare_with_file(struct node_members *m,
                              const struct ida_node *n,
                              const struct ida_raft_conf *c)
{
    if (m->compared && same_ids(c, &m->compared_conf) &&
        node_book_equal(&m->book, &m->compared_book)) {
        return;
    }
    m->compared = true;
    m->compared_conf = *c;
    m->compared_book = m->book;
    compare_with_self(m, n);
    char moved[512];
    bool same = c->n_learners == 0 && c->n == n->cfg.node_count;
    for (unsigned i = 0; i < n->cfg.node_count && same; i++) {
        same = ida_raft_conf_slot(c, n->cfg.nodes[i].id) >= 0;
    }
    same = at_file_addresses(n, &m->book, c, moved, sizeof(moved)) && same;
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
        "differs from the cluster file's nodes (%s)%s%s: the file's node "
        "lines are only the first membership; changes are made with idalloc "
        "member (see idalloc member list)",
        v, l, f,
        moved[0] != '\0' ? "; members not at their file addresses: " : "",
        moved);
}

void node_members_track(struct node_members *m,
                        const struct ida_node *n,
                        const struct ida_raft *r)
{
    const struct ida_raft_conf *c = ida_raft_voters(r);
    compare_with_file(m, n, c);
    for (size_t k = 0; k < c->n + c->n_learners; k++) {
        bool v = k < c->n;
        node_members_bound(m, v ? c->voters[k] : c->learners[k - c->n],
                           v ? c->voter_inc[k] : c->learner_inc[k - c->n]);
    }
    /* A learner is there to become a voter: with auto_rejoin the leader
     * promotes it once it caught up (node_rejoin_step()). */
    if (n->cfg.auto_rejoin && m->rejoin_id == 0 && c->n_learners > 0 &&
        ida_raft_role(r) == IDA_RAFT_LEADER) {
        m->rejoin_id = c->learners[0];
        m->rejoin_inc = c->learner_inc[0];
    }
}

/* --- addresses ------------------------------------------------------------
 */

int node_members_encode(const struct node_members *m,
                        const struct ida_raft_conf *c,
                        ida_node_id id,
                        const struct ida_addr *peer,
                        const struct ida_addr *client,
                        uint8_t **out,
                        size_t *len)
{
    struct node_book *b = ida_malloc(sizeof(*b));
    if (b == NULL) {
        return IDA_ENOMEM;
    }
    *b = m->book;
    for (size_t i = 0; i < c->n + c->n_learners; i++) {
        ida_node_id k = i < c->n ? c->voters[i] : c->learners[i - c->n];
        const struct node_book_entry *e = node_book_find(b, k);
        const struct node_seen *s = node_members_seen(m, k);
        if ((e == NULL || !e->member) && s != NULL && s->has_addrs) {
            /* Not a member yet (a re-admission): where it says it is. */
            node_book_set(b, k, true, &s->peer, &s->client);
        }
    }
    if (id != 0) {
        node_book_set(b, id, true, peer, client);
    }
    int rv = node_conf_encode_full(b, c, out, len);
    ida_free(b);
    return rv;
}

bool node_members_book(struct node_members *m,
                       const struct ida_node *n,
                       const uint8_t *conf,
                       size_t len,
                       const struct node_book *join)
{
    if (m->book_built && len == m->book_conf_len &&
        (len == 0 ||
         (m->book_conf != NULL && memcmp(conf, m->book_conf, len) == 0))) {
        return false;
    }
    struct node_book *b = ida_malloc(sizeof(*b));
    uint8_t *copy = len > 0 ? ida_malloc(len) : NULL;
    if (b == NULL || (len > 0 && copy == NULL)) {
        ida_free(b);
        ida_free(copy);
        return false; /* the next round tries again */
    }
    if (join != NULL && conf == NULL) {
        *b = *join;
    } else {
        node_book_build(b, conf, len, &n->cfg);
    }
    if (len > 0) {
        memcpy(copy, conf, len);
    }
    bool changed = !m->book_built || !node_book_equal(b, &m->book);
    m->book = *b;
    ida_free(b);
    ida_free(m->book_conf);
    m->book_conf = copy;
    m->book_conf_len = len;
    m->book_built = true;
    return changed;
}

void node_members_close(struct node_members *m)
{
    ida_free(m->book_conf);
    m->book_conf = NULL;
}
