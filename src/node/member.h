/* Membership at the node: creating a cluster, joining one as a new
 * incarnation, and re-admitting a member whose disk was replaced.
 *
 * DESIGN
 *
 * The Raft core's admission rule (raft/admission.h) needs a first
 * membership that binds every member's incarnation. A node whose data
 * directory is new (storage created it: no membership0 record, no log, no
 * snapshot, term 0) cannot know whether the cluster exists already: a
 * replaced disk looks exactly like a first start. So it takes no part in
 * Raft (it steps no peer message and answers clients "unavailable") and
 * sends Hello to every node of the cluster file until one of two things is
 * known:
 *
 *  - every node of the cluster file answered that it is new too: this is
 *    the cluster's first start. The node writes the first membership (all
 *    nodes of the file as voters, each with the incarnation it announced)
 *    durably as membership0 and starts. Every node computes the same
 *    membership from the same answers. It takes every node: if a majority
 *    that lost their disks could create the cluster anew while the nodes
 *    holding the data are down, ids would be handed out again;
 *  - a node that has a membership answered with it: either the leader
 *    (another node's membership may be stale), or any node whose membership
 *    names this node's own incarnation (then it is the first membership,
 *    made from what this node announced, by a node that finished the first
 *    start a moment earlier). The cluster exists. The node writes that
 * membership as membership0 and starts from it. Its incarnation is not in it,
 * so the core keeps it from voting or campaigning until the leader re-admits
 * it.
 *
 * Re-admission (leader, when auto_rejoin is on, the default): when a member
 * speaks with an incarnation the membership does not name, and a majority
 * of the voters that remain is active, the leader proposes, one change at a
 * time: remove the old incarnation; add the new one as a learner; promote
 * it once its log reached the commit index. These are the changes an
 * operator would make, each a single-server change; nothing else ever
 * admits a new incarnation.
 *
 * Addresses of members come from the cluster file: a node with a new id or
 * address needs its line in the file of every node (README, Runbook: a
 * longer file and a rolling restart, then member add). The file's node
 * lines are otherwise only the first membership; node_members_track() logs
 * each membership in effect that differs from them.
 */
#ifndef IDA_NODE_MEMBER_H
#define IDA_NODE_MEMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/idalloc.pb-c.h"
#include "raft/raft.h"
#include "src/common/config.h"

struct ida_node;

struct node_members
{
    bool joining; /* new directory: waiting to learn the cluster */
    /* What the other nodes of the cluster file said (joining). */
    bool heard[IDA_CONFIG_NODES_MAX];
    bool fresh[IDA_CONFIG_NODES_MAX];
    uint64_t inc[IDA_CONFIG_NODES_MAX];
    uint64_t last_hello_ms;
    bool m0_pending;           /* membership0 is being written */
    uint64_t last_wait_log_ms; /* joining: the last "waiting" log line */
    /* Re-admission target (leader). */
    ida_node_id rejoin_id;
    uint64_t rejoin_inc;
    uint64_t last_rejoin_ms;
    /* Foreign incarnations already logged (one line each). */
    ida_node_id warned_id;
    uint64_t warned_inc;
    /* Operator commands (src/node/member_ops.c). By index in the cluster
     * file: the incarnation each node last spoke with (any peer message),
     * and the last one a membership in effect here bound it to. */
    uint64_t announced[IDA_CONFIG_NODES_MAX];
    uint64_t last_bound[IDA_CONFIG_NODES_MAX];
    /* The member ids last compared with the cluster file (one log line
     * per membership that differs from it). */
    bool compared;
    struct ida_raft_conf compared_conf;
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

/* A Hello for node @to: @reply, our state from @r (NULL while joining). The
 * message points into @hello and @buf (owned by the caller, freed with
 * ida_free). Returns 0 or IDA_ENOMEM. */
int node_hello_make(const struct ida_node *n,
                    const struct ida_raft *r,
                    unsigned to,
                    bool reply,
                    Idalloc__PeerMessage *pm,
                    Idalloc__Hello *hello,
                    uint8_t **buf);

/* Joining: take in the Hello @pm. Returns 1 with @out set when the first
 * membership is known (write it as membership0, then start from it), 0 to
 * wait. */
int node_hello_learn(struct node_members *m,
                     const struct ida_node *n,
                     const Idalloc__PeerMessage *pm,
                     struct ida_raft_conf *out);

/* Leader: one step of re-admission, if one is due. Returns a membership to
 * propose in @out (1) or 0. */
int node_rejoin_step(struct node_members *m,
                     const struct ida_raft *r,
                     uint64_t now_ms,
                     struct ida_raft_conf *out);

/* --- operator commands (src/node/member_ops.c) ---------------------------
 *
 * MemberList, MemberChange and LeaderTransfer client requests, served by
 * the leader (raft_proc answers NOT_LEADER elsewhere).
 *
 *  - list: every member of the membership in effect (incarnation, cluster
 *    file addresses, voter or learner, the leader's match index, connected),
 *    then every cluster-file node that is not a member but spoke with an
 *    incarnation (waiting: a new data directory, or a removed node).
 *  - remove ID: the membership without ID. Refused (IDA_EREFUSED) for the
 *    last voter. ID being this leader: leadership is handed to a caught-up
 *    voter first and the request is answered IDA_ENOTLEADER (retryable: the
 *    library retries it at the new leader, which removes ID).
 *  - add ID: a cluster-file node that is not a member becomes a learner
 *    bound to the incarnation it last spoke with (IDA_EREFUSED if none was
 *    heard). With auto_rejoin on, the leader promotes it once caught up.
 *  - promote ID: a learner whose match index reached the commit index
 *    becomes a voter (IDA_EREFUSED with the reason otherwise).
 *  - transfer [to]: ida_raft_transfer() to @to or a caught-up voter.
 *
 * A change is answered when its entry committed (changed = true), or at
 * once when the membership is already so (changed = false: a retry of a
 * change that committed). IDA_EBUSY (retryable) while another change or
 * transfer is under way; IDA_ELEADERLOST when leadership is lost before
 * the entry committed (outcome unknown; a retry finds out). A transfer is
 * answered when this node is no longer leader (and knows the new one), or
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

/* Every peer message: node @id spoke with incarnation @inc. */
void node_members_heard(struct node_members *m,
                        const struct ida_node *n,
                        ida_node_id id,
                        uint64_t inc);

/* Each round: track the membership in effect; with auto_rejoin, pick a
 * learner to promote. Each membership in effect whose members are not
 * exactly the cluster file's nodes is logged once (INFO, "membership in
 * effect ... differs from the cluster file"): the file's node lines are
 * only the first membership, the membership lives in the log. */
void node_members_track(struct node_members *m,
                        const struct ida_node *n,
                        const struct ida_raft *r);

/* Whether @id is a cluster-file node that an operator did not remove
 * (note_incarnation may re-admit it on its own): not in the removed record
 * of the membership in effect @c, nor bound to @inc by a membership seen
 * here since this process started. */
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
                          const int *peer_up,
                          uint64_t conn,
                          const Idalloc__ClientRequest *req);

/* Answer the waiting change or transfer once its outcome is known. */
void node_members_settle(struct node_members *m,
                         struct ida_node *n,
                         const struct ida_raft *r);

#endif /* IDA_NODE_MEMBER_H */
