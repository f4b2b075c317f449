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
 * Addresses of members come from the cluster file (membership changes to
 * new addresses or new ids are not supported yet).
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
    bool m0_pending; /* membership0 is being written */
    /* Re-admission target (leader). */
    ida_node_id rejoin_id;
    uint64_t rejoin_inc;
    uint64_t last_rejoin_ms;
    /* Foreign incarnations already logged (one line each). */
    ida_node_id warned_id;
    uint64_t warned_inc;
};

/* Encode @c as an idalloc.ClusterConfig with the cluster file's addresses
 * into a new buffer (*@out, ida_malloc'd). Returns 0 or IDA_ENOMEM. */
int node_conf_encode_full(const struct ida_node *n,
                          const struct ida_raft_conf *c,
                          uint8_t **out,
                          size_t *len);

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

#endif /* IDA_NODE_MEMBER_H */
