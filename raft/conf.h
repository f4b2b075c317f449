/* Cluster membership as the Raft core sees it: voters and learners.
 *
 * Members listed as voters vote and count in quorums; learners
 * (non-voting members, dissertation §4.2.1) receive the log, so a new
 * server can catch up before it becomes a voter. The core never sees how a
 * membership is encoded: ENTRY_CONFIG entries and snapshot configs carry
 * the application's bytes, which the core passes through unchanged and
 * decodes only through ida_raft_config.conf_decode (the node's decoder is
 * node_conf_decode() in src/node/convert.h). */
#ifndef IDA_RAFT_CONF_H
#define IDA_RAFT_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/types.h"

#define IDA_RAFT_NODES_MAX 9 /* voters in one cluster */

struct ida_raft_conf
{
    ida_node_id voters[IDA_RAFT_NODES_MAX];
    size_t n;
    ida_node_id learners[IDA_RAFT_NODES_MAX];
    size_t n_learners;
    /* Each member's incarnation (raft/admission.h), 0: not bound. */
    uint64_t voter_inc[IDA_RAFT_NODES_MAX];
    uint64_t learner_inc[IDA_RAFT_NODES_MAX];
    /* Nodes an operator removed, with the incarnation each had: the
     * application's record, carried with the membership so that it is as
     * durable and replicated as the membership itself (the node does not
     * re-admit them on its own: src/node/member.h). The core copies it and
     * never looks at it. */
    ida_node_id removed[IDA_RAFT_NODES_MAX];
    uint64_t removed_inc[IDA_RAFT_NODES_MAX];
    size_t n_removed;
};

/* 0 if @c is a valid membership: 1..IDA_RAFT_NODES_MAX voters, at most
 * IDA_RAFT_NODES_MAX learners, no id 0, no id listed twice; else
 * IDA_EPROTO. */
int ida_raft_conf_check(const struct ida_raft_conf *c);

/* The slot of voter @id in @c, -1 if @id is not a voter. */
int ida_raft_conf_slot(const struct ida_raft_conf *c, ida_node_id id);

/* The slot of learner @id in @c, -1 if @id is not a learner. */
int ida_raft_conf_learner_slot(const struct ida_raft_conf *c, ida_node_id id);

/* Whether @id is a member of @c: a voter or a learner. */
bool ida_raft_conf_has(const struct ida_raft_conf *c, ida_node_id id);

/* Nonzero if @b is a single-server change of @a (dissertation §4.1): the
 * voter sets differ by exactly one added or removed voter, or the voters
 * are the same and only the learners (or unbound incarnations becoming
 * bound) changed. A voter is identified by (id, incarnation): a voter
 * whose bound incarnation changes counts as one removed and one added. */
int ida_raft_conf_one_change(const struct ida_raft_conf *a,
                             const struct ida_raft_conf *b);

/* Nonzero if @a and @b have the same voters and learners, each with the
 * same incarnation (what else the application encodes in a membership,
 * such as addresses, may differ). */
int ida_raft_conf_same_members(const struct ida_raft_conf *a,
                               const struct ida_raft_conf *b);

#endif /* IDA_RAFT_CONF_H */
