/* Cluster membership as the Raft core sees it: voters and learners.
 *
 * ENTRY_CONFIG entries and snapshot configs carry an encoded
 * idalloc.ClusterConfig (proto/idalloc.proto): members with `voter` set
 * vote and count in quorums; the others are learners (non-voting members,
 * dissertation §4.2.1) that receive the log, so a new server can catch up
 * before it becomes a voter. Addresses are the node's business: the core
 * passes the bytes through unchanged. */
#ifndef IDA_RAFT_CONF_H
#define IDA_RAFT_CONF_H

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
};

/* Decode an encoded idalloc.ClusterConfig into @out (in the encoded order).
 * Returns 0, IDA_EPROTO (malformed, id 0, duplicate ids, no voter, more
 * than IDA_RAFT_NODES_MAX voters or learners). */
int ida_raft_conf_decode(const uint8_t *data,
                         size_t len,
                         struct ida_raft_conf *out);

/* Encode @c as an idalloc.ClusterConfig without addresses into
 * @buf (capacity @cap); *@len gets the size. For tests and tools; the node
 * encodes its own configs with addresses. Returns 0 or IDA_ETOOBIG. */
int ida_raft_conf_encode(const struct ida_raft_conf *c,
                         uint8_t *buf,
                         size_t cap,
                         size_t *len);

/* The slot of voter @id in @c, -1 if @id is not a voter. */
int ida_raft_conf_slot(const struct ida_raft_conf *c, ida_node_id id);

/* The slot of learner @id in @c, -1 if @id is not a learner. */
int ida_raft_conf_learner_slot(const struct ida_raft_conf *c, ida_node_id id);

/* Nonzero if @b is a single-server change of @a (dissertation §4.1): the
 * voter sets differ by exactly one added or removed voter, or the voters
 * are the same and only the learners changed. */
int ida_raft_conf_one_change(const struct ida_raft_conf *a,
                             const struct ida_raft_conf *b);

#endif /* IDA_RAFT_CONF_H */
