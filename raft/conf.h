/* Cluster membership as the Raft core sees it: the set of voters.
 *
 * ENTRY_CONFIG entries and snapshot configs carry an encoded
 * idalloc.ClusterConfig (proto/idalloc.proto); the core reads the members
 * whose `voter` flag is set. Addresses are the node's business: the core
 * passes the bytes through unchanged. */
#ifndef IDA_RAFT_CONF_H
#define IDA_RAFT_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "ida/types.h"

#define IDA_RAFT_NODES_MAX 9 /* voters in one cluster */

struct ida_raft_conf
{
    ida_node_id voters[IDA_RAFT_NODES_MAX];
    size_t n;
};

/* Decode an encoded idalloc.ClusterConfig into @out (voters only, in the
 * encoded order). Returns 0, IDA_EPROTO (malformed, id 0, duplicate ids,
 * no voter or more than IDA_RAFT_NODES_MAX voters), IDA_ENOMEM. */
int ida_raft_conf_decode(const uint8_t *data,
                         size_t len,
                         struct ida_raft_conf *out);

/* Encode @c as an idalloc.ClusterConfig of voters without addresses into
 * @buf (capacity @cap); *@len gets the size. For tests and tools; the node
 * encodes its own configs with addresses. Returns 0 or IDA_ETOOBIG. */
int ida_raft_conf_encode(const struct ida_raft_conf *c,
                         uint8_t *buf,
                         size_t cap,
                         size_t *len);

/* The slot of voter @id in @c, -1 if @id is not a voter. */
int ida_raft_conf_slot(const struct ida_raft_conf *c, ida_node_id id);

/* Nonzero if @b differs from @a by exactly one added or one removed voter
 * (dissertation §4.1: single-server changes). */
int ida_raft_conf_one_change(const struct ida_raft_conf *a,
                             const struct ida_raft_conf *b);

#endif /* IDA_RAFT_CONF_H */
