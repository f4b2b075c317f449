/* Membership at the node: creating a cluster, joining one as a new
 * incarnation, re-admitting a member whose disk was replaced, and where the
 * members are (their addresses).
 *
 * DESIGN
 *
 * The Raft core's admission rule (raft/admission.h) needs a first
 * membership that binds every member's incarnation. A node whose data
 * directory is new (storage created it: no membership0 record, no log, no
 * snapshot, term 0) cannot know whether the cluster exists already: a
 * replaced disk looks exactly like a first start. So it takes no part in
 * Raft (it steps no peer message and answers clients "unavailable") and
 * sends Hello to every node of its address book (src/node/book.h: the
 * cluster file's nodes, or what `idallocd --join` learned) until one of two
 * things is known:
 *
 *  - every node of the cluster file answered that it is new too: this is
 *    the cluster's first start. The node writes the first membership (all
 *    nodes of the file as voters, each with the incarnation it announced
 *    and its file addresses) durably as membership0 and starts. Every node
 *    computes the same membership from the same answers. It takes every
 *    node: if a majority that lost their disks could create the cluster
 *    anew while the nodes holding the data are down, ids would be handed
 *    out again. A node that is not in the cluster file, or was started
 *    with --join, never takes this path: it only joins. A cluster file
 *    of one node has no one to hear from: that node takes this path only
 *    when started with --single-node (the operator says this is a first
 *    start; node_first_membership() with its own Hello alone);
 *  - a node that has a membership answered with it: either the leader
 *    (another node's membership may be stale), or any node whose membership
 *    names this node's own incarnation as a voter (then it is the first
 *    membership, made from what this node announced, by a node that
 *    finished the first start a moment earlier). The cluster exists. The
 *    node writes that membership, as received, as membership0 and starts
 *    from it. Its incarnation is not a voter in it, so the core keeps it
 *    from voting or campaigning until a committed change makes it one.
 *
 * Re-admission (leader, when auto_rejoin is on, the default): when a member
 * speaks with an incarnation the membership does not name, and a majority
 * of the voters that remain is active, the leader proposes, one change at a
 * time: remove the old incarnation; add the new one as a learner; promote
 * it once its log reached the commit index. These are the changes an
 * operator would make, each a single-server change; nothing else ever
 * admits a new incarnation. A node id that never was a member here (not in
 * the cluster file, not bound by a membership this leader saw) is never
 * added this way: only an operator's `member add ID PEER CLIENT` does.
 *
 * ADDRESSES
 *
 * Every membership (ClusterConfig) names each member with its peer and
 * client address. They flow like this:
 *
 *  - the first membership takes the cluster file's lines;
 *  - `member add ID PEER CLIENT` (or `member add ID` for a node of the
 *    cluster file, at its file addresses) puts ID into the next membership
 *    at those addresses; `member update ID PEER CLIENT` proposes the same
 *    members with ID at new addresses (a config entry the core accepts as a
 *    change of nothing it counts: ida_raft_conf_same_members()); a
 *    re-admission carries a member's addresses over, or takes those its new
 *    incarnation announces in its Hello (PeerMessage.hello.peer_addr);
 *  - the entry is replicated and committed like any membership; every node
 *    rebuilds its address book from the membership in effect in its own
 *    log (src/node/book.h) and net dials accordingly, so no node restarts;
 *  - clients are told the members' client addresses (member_addrs of
 *    NOT_LEADER and status answers).
 *
 * Who may ask for them: anyone who reaches the leader's client port, like
 * every membership command (clients are not authenticated); `member add` of
 * a node id that is not a member needs that node to have spoken to the
 * leader first (the leader binds the incarnation it announced), and when
 * it announced its addresses the command must give the same ones.
 *
 * WHY A WRONG ADDRESS CANNOT MAKE A NODE ACT AS ANOTHER
 *
 * Addresses are not part of admission; incarnations are. An address only
 * decides where a node dials to send. What a message counts for is decided
 * by who sent it: with peer TLS every inbound link shows a certificate of
 * the cluster CA naming a node (CN=idalloc-node-I), every message's `from`
 * must be that node (src/node/net.h), and an outbound link must reach a
 * certificate naming the node dialled; the Raft core then counts a vote or
 * an acknowledgement only from a member whose bound incarnation is the
 * message's (raft/admission.h, A2), and a node votes or campaigns only when
 * its own log names its incarnation as a voter (A1). So a membership that
 * names node 3 at node 5's address makes node 3's messages undeliverable
 * (the link to that address shows node 5's certificate and is refused, or
 * with peer_tls off reaches node 5, which drops messages addressed to
 * node 3): an availability fault, never a vote or acknowledgement counted
 * for the wrong member. A joining node is added as a learner bound to the
 * incarnation it announced and enters quorums only once a committed change
 * promotes it. With peer_tls off, anyone who reaches a peer port can claim
 * any node id and incarnation (every node warns at start): the cluster is
 * then only as safe as its network.
 *
 * The cluster file's node lines are otherwise only the first membership;
 * node_members_track() logs each membership in effect whose members or
 * addresses differ from them, and each one that names this node at other
 * addresses than the ones it listens on.
 */
#ifndef IDA_NODE_MEMBER_H
#define IDA_NODE_MEMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/idalloc.pb-c.h"
#include "raft/raft.h"
#include "src/common/config.h"
#include "src/node/book.h"

struct ida_node;

/* What this node heard of one node id (any node that sent a peer message,
 * member or not). */
struct node_seen
{
    ida_node_id id;
    uint64_t announced;  /* the incarnation it last spoke with, 0: none */
    uint64_t last_bound; /* the one a membership in effect here bound it to */
    bool has_addrs;      /* its Hello named where it listens: */
    struct ida_addr peer, client;
    uint64_t used; /* when last heard (a counter), for eviction */
    uint64_t told; /* the incarnation the "not a member" line named */
};

/* Node ids remembered at once: the least recently heard gives way. */
#define NODE_SEEN_MAX 48

struct node_members
{
    bool joining; /* new directory: waiting to learn the cluster */
    /* Seeded by an import: waiting for every other node of the cluster
     * file to answer that it is new (src/node/import.h). */
    bool seeded;
    /* What the other nodes of the cluster file said (joining, seeded), and
     * when (seeded). */
    bool heard[IDA_CONFIG_NODES_MAX];
    uint64_t heard_ms[IDA_CONFIG_NODES_MAX];
    /* Seeded: when it started waiting, and the last sign from any node
     * that it holds a membership (src/node/member.c, node_seed_heard()). */
    uint64_t seed_since_ms;
    uint64_t seed_evidence_ms;
    ida_node_id seed_evidence_from;
    bool fresh[IDA_CONFIG_NODES_MAX];
    uint64_t inc[IDA_CONFIG_NODES_MAX];
    uint64_t last_hello_ms;
    bool m0_pending;           /* membership0 is being written */
    uint64_t m0_failures;      /* writes of it that failed (logged) */
    uint64_t m0_fail_log_ms;   /* the last line about them */
    uint64_t last_wait_log_ms; /* joining: the last "waiting" log line */
    /* Re-admission target (leader). */
    ida_node_id rejoin_id;
    uint64_t rejoin_inc;
    uint64_t last_rejoin_ms;
    /* Foreign incarnations already logged (one line each). */
    ida_node_id warned_id;
    uint64_t warned_inc;
    /* Every node id heard from (node_members_heard()). */
    struct node_seen seen[NODE_SEEN_MAX];
    size_t n_seen;
    uint64_t seen_clock;
    /* The address book (src/node/book.h) and the encoded membership it was
     * built from (a copy; NULL: the cluster file's nodes alone). */
    struct node_book book;
    uint8_t *book_conf;
    size_t book_conf_len;
    bool book_built;
    /* The members and addresses last compared with the cluster file and
     * with this node's own addresses (one log line per membership that
     * differs). */
    bool compared;
    struct ida_raft_conf compared_conf;
    struct node_book compared_book;
    /* The membership names this node elsewhere than it listens: it
     * announces where it is (Hello), so `member update` can be checked. */
    bool self_moved;
    /* The one membership change or transfer a client waits for. */
    struct
    {
        int kind; /* 0: none; 1: change; 2: transfer */
        uint64_t conn, seq;
        ida_index index;
        ida_term term;
        uint64_t inc;
        ida_node_id to;
        uint64_t started_ms;
    } op;
};

/* The index of node @id in the cluster file (n->cfg.nodes), -1 if absent. */
int node_file_index(const struct ida_node *n, unsigned id);

/* The first membership of a new cluster: every node of the cluster file, a
 * voter with incarnation @inc[i] (i: the node's index in the file). */
void node_conf_first(const struct ida_node *n,
                     const uint64_t *inc,
                     struct ida_raft_conf *out);

/* A Hello for node @to: @reply, our state from @r (NULL while joining)
 * with the members' addresses from @book, and this node's own addresses.
 * The message points into @hello, @buf (owned by the caller, freed with
 * ida_free) and the node. Returns 0 or IDA_ENOMEM. */
int node_hello_make(const struct ida_node *n,
                    const struct ida_raft *r,
                    const struct node_book *book,
                    unsigned to,
                    bool reply,
                    Idalloc__PeerMessage *pm,
                    Idalloc__Hello *hello,
                    uint8_t **buf);

/* Seeded (src/node/import.h). The gate opens (node_seed_heard() true) only
 * when, for node_seed_quiet_ms() (at least NODE_SEED_QUIET_MS): the node
 * has been up, no node (in the
 * cluster file or not) has shown it holds a membership (a Hello that says
 * so, or any Raft message: node_seed_evidence()), and every other node of
 * the cluster file has answered, within that time, that it is new. A
 * cluster that still runs with this node as a member reaches it within
 * that time (heartbeats, votes, re-admission), so an old leader cannot
 * take over the node just after it opens. */
#define NODE_SEED_QUIET_MS 3000

/* How recent a node's "my directory is new" must be to count toward a
 * first start (node_first_membership()). */
#define NODE_HEARD_RECENT_MS 3000

/* The quiet time of the gate above: NODE_SEED_QUIET_MS, or longer where
 * the cluster file's heartbeat or election timeout would let a running
 * cluster stay silent longer. */
uint64_t node_seed_quiet_ms(const struct ida_node *n);

/* Whether the cluster file's node @k (index) is this node, or said within
 * NODE_HEARD_RECENT_MS of @now that its directory is new. */
bool node_heard_new_lately(const struct node_members *m,
                           const struct ida_node *n,
                           unsigned k,
                           uint64_t now);

/* Seeded: node @from (incarnation @inc) showed it holds a membership at
 * @now (any peer message but Hello reached this node from it). */
void node_seed_evidence(struct node_members *m,
                        const struct ida_node *n,
                        ida_node_id from,
                        uint64_t inc,
                        uint64_t now);

/* Seeded: take in the Hello @pm (NULL: none) at @now, and whether the gate
 * opens (above). */
bool node_seed_heard(struct node_members *m,
                     const struct ida_node *n,
                     const Idalloc__PeerMessage *pm,
                     uint64_t now);

/* Seeded: the other nodes of the cluster file not heard saying they are
 * new lately (@bootstrapped false) or that answered with a membership
 * (true), as "2, 3" in @out (@cap bytes); returns how many. */
size_t node_seed_waiting(const struct node_members *m,
                         const struct ida_node *n,
                         bool bootstrapped,
                         uint64_t now,
                         char *out,
                         size_t cap);

/* Joining: take in the Hello @pm. Returns 1 with the first membership in
 * *@conf (ida_malloc'd, *@len bytes: write it as membership0, then start
 * from it), 0 to wait (or when out of memory: the next Hello tries
 * again). */
int node_hello_learn(struct node_members *m,
                     const struct ida_node *n,
                     const Idalloc__PeerMessage *pm,
                     uint64_t now,
                     uint8_t **conf,
                     size_t *len);
/* Joining: the first membership, when every node of the cluster file
 * (this one included) was heard with a new data directory, each of the
 * others within NODE_HEARD_RECENT_MS of @now, and this node is one of
 * them, not told to --join. Returns 1 with it in *@conf (as
 * node_hello_learn()), else 0. A cluster file of this node alone needs no
 * Hello: the node creates the cluster by itself. "Recent": a node heard
 * new long ago may have a membership by now (it was stopped, and seeded by
 * an import, or started again elsewhere); joining nodes say Hello every
 * 50 ms, so a first start never waits on this. */
int node_first_membership(const struct node_members *m,
                          const struct ida_node *n,
                          uint64_t now,
                          uint8_t **conf,
                          size_t *len);

/* Leader: one step of re-admission, if one is due. Returns a membership to
 * propose in @out (1) or 0. */
int node_rejoin_step(struct node_members *m,
                     const struct ida_raft *r,
                     uint64_t now_ms,
                     struct ida_raft_conf *out);

/* Encode @c as a membership entry with every member's addresses: @id (0:
 * none) at @peer and @client; the others where the address book has them,
 * else where their Hello said they listen, else at their cluster-file line.
 * *@out is ida_malloc'd. Returns 0 or IDA_ENOMEM. */
int node_members_encode(const struct node_members *m,
                        const struct ida_raft_conf *c,
                        ida_node_id id,
                        const struct ida_addr *peer,
                        const struct ida_addr *client,
                        uint8_t **out,
                        size_t *len);

/* Rebuild the address book from the encoded membership in effect @conf
 * (@len bytes; NULL: none) if it changed since the last call, or from
 * @join (the members `idallocd --join` learned; NULL: none) while joining.
 * Returns whether the book changed (the caller hands it to net and to the
 * node's answers). */
bool node_members_book(struct node_members *m,
                       const struct ida_node *n,
                       const uint8_t *conf,
                       size_t len,
                       const struct node_book *join);

/* Whether the "not a member" line for node @id speaking as @inc is still
 * to be logged (true once per incarnation; then false). */
bool node_members_untold(struct node_members *m, ida_node_id id, uint64_t inc);

/* The entry of node @id in the seen table, NULL if never heard. */
const struct node_seen *node_members_seen(const struct node_members *m,
                                          ida_node_id id);

/* --- operator commands (src/node/member_ops.c) ---------------------------
 *
 * MemberList, MemberChange and LeaderTransfer client requests, served by
 * the leader (raft_proc answers NOT_LEADER elsewhere).
 *
 *  - list: every member of the membership in effect (incarnation, the
 *    addresses the membership gives it, voter or learner, the leader's
 *    match index, connected), then every node that is not a member but
 *    spoke with an incarnation (waiting: a new data directory, a removed
 *    node, or a node asking to join; at the addresses it announced, else
 *    its cluster-file line's).
 *  - remove ID: the membership without ID. Refused (IDA_EREFUSED) for the
 *    last voter. ID being this leader: leadership is handed to a caught-up
 *    voter first and the request is answered IDA_ENOTLEADER (retryable: the
 *    library retries it at the new leader, which removes ID).
 *  - add ID [PEER CLIENT]: a node that is not a member becomes a learner
 *    bound to the incarnation it last spoke with (IDA_EREFUSED if none was
 *    heard), at PEER and CLIENT, or without them at its cluster-file line
 *    (IDA_EREFUSED for a node the file does not name). Refused when an
 *    address is another member's, or is not the one the node announced.
 *    ID already a member: "already a member" at the same addresses,
 *    IDA_EREFUSED at others (that is `update`). With auto_rejoin on, the
 *    leader promotes the learner once caught up.
 *  - update ID PEER CLIENT: member ID (voter or learner) is now at PEER
 *    and CLIENT: the same members, ID's addresses changed (no change at
 *    the same addresses; IDA_EREFUSED for a non-member, an address of
 *    another member, addresses other than those ID announced it listens on
 *    (a member the membership names elsewhere announces them), and for
 *    this leader, addresses other than those it listens on).
 *  - promote ID: a learner whose match index reached the commit index
 *    becomes a voter (IDA_EREFUSED with the reason otherwise).
 *  - transfer [to]: ida_raft_transfer() to @to or a caught-up voter.
 *
 * Addresses must parse as IPv4:PORT or [IPv6]:PORT, must not be 0.0.0.0
 * or ::, and the two must differ (IDA_EINVAL otherwise). A change is
 * answered when its entry committed (changed = true), or at once when the
 * membership is already so (changed = false: a retry of a change that
 * committed). IDA_EBUSY (retryable) while another change or transfer is
 * under way; IDA_ELEADERLOST when leadership is lost before the entry
 * committed (outcome unknown; a retry finds out). A transfer is answered
 * when this node is no longer leader (and knows the new one), or
 * IDA_EREFUSED when it still leads after three election timeouts.
 *
 * A node removed by an operator is recorded in the membership that removes
 * it (ida_raft_conf.removed, ClusterConfig.removed: id and incarnation),
 * and every later membership derived from the one in effect carries the
 * record along, so it is exactly as durable and replicated as the
 * membership: a leader elected later, or restarted since, still knows it.
 * note_incarnation never re-admits a node in that record, whatever
 * incarnation it speaks with (node_members_may_readmit()); only an
 * operator's `member add` takes it out of the record (in the same change
 * that adds it back as a learner). A re-admission the leader does on its
 * own (a replaced disk) is not an operator's removal and records nothing. */

/* Every peer message: node @id spoke with incarnation @inc; @hello (NULL
 * for other messages) may say where it listens. */
void node_members_heard(struct node_members *m,
                        ida_node_id id,
                        uint64_t inc,
                        const Idalloc__Hello *hello);

/* A membership in effect here binds @id to incarnation @inc (0: unbound). */
void node_members_bound(struct node_members *m, ida_node_id id, uint64_t inc);

/* Each round: track the membership in effect; with auto_rejoin, pick a
 * learner to promote. Each membership in effect whose members or their
 * addresses are not exactly the cluster file's nodes is logged once (INFO,
 * "membership in effect ... differs from the cluster file"): the file's
 * node lines are only the first membership, the membership lives in the
 * log. One that names this node at other addresses than those it listens
 * on is logged once too (WARN: the others dial those). */
void node_members_track(struct node_members *m,
                        const struct ida_node *n,
                        const struct ida_raft *r);

/* Whether note_incarnation may re-admit @id, speaking as @inc, on its own:
 * an operator did not remove it (not in the removed record of the
 * membership in effect @c), no membership seen here since this process
 * started bound it to @inc, and it is a node of the cluster file or was
 * bound to another incarnation by a membership seen here (a member whose
 * disk was replaced; a node id never seen as a member is only added by an
 * operator). */
bool node_members_may_readmit(const struct node_members *m,
                              const struct ida_node *n,
                              const struct ida_raft_conf *c,
                              ida_node_id id,
                              uint64_t inc);

/* Serve a membership request (@req: member_list, member_change or
 * leader_transfer) from connection @conn; answers now or later
 * (node_members_settle()). */
void node_members_request(struct node_members *m,
                          struct ida_node *n,
                          struct ida_raft *r,
                          uint64_t conn,
                          const Idalloc__ClientRequest *req);

/* Answer the waiting change or transfer once its outcome is known. */
void node_members_settle(struct node_members *m,
                         struct ida_node *n,
                         const struct ida_raft *r);

/* Free what @m holds (the book's membership copy). */
void node_members_close(struct node_members *m);

#endif /* IDA_NODE_MEMBER_H */
