/* Translation between the Raft core's message structs and proto
 * PeerMessage, between client requests and log commands, between the core's
 * membership (struct ida_raft_conf) and idalloc.ClusterConfig. State machine
 * results become replies through ida_fsm_result_to_pb() (fsm/fsm.h). */
#ifndef IDA_NODE_CONVERT_H
#define IDA_NODE_CONVERT_H

#include "fsm/fsm.h"
#include "proto/idalloc.pb-c.h"
#include "raft/raft.h"
#include "src/common/config.h"
#include "src/node/book.h"

/* Scratch space for one PeerMessage built from a raft message; it points
 * into @m (borrowed) and into itself. */
struct node_pb_peer
{
    Idalloc__PeerMessage msg;
    union {
        Idalloc__RequestVote rv;
        Idalloc__ResponseVote rsv;
        Idalloc__AppendEntries ae;
        Idalloc__AppendResponse ar;
        Idalloc__InstallSnapshot is;
        Idalloc__SnapshotResponse sr;
        Idalloc__TimeoutNow tn;
    } u;
    Idalloc__LogEntry *entries;     /* ida_malloc'd */
    Idalloc__LogEntry **entry_ptrs; /* ida_malloc'd */
    Idalloc__Heard gossip[IDA_RAFT_NODES_MAX];
    Idalloc__Heard *gossip_ptrs[IDA_RAFT_NODES_MAX];
};

/* Fill @pb from @m. Returns 0 or IDA_ENOMEM. Release with
 * node_pb_peer_release(). */
int node_raft_to_pb(const struct ida_raft_msg *m, struct node_pb_peer *pb);
void node_pb_peer_release(struct node_pb_peer *pb);

/* Fill @m from @pb. Entries go into *@entries (ida_malloc'd, caller frees;
 * their data points into @pb, so @pb must outlive @m). Returns 0,
 * IDA_EPROTO (no or unknown message, bad entry type), IDA_ENOMEM. */
int node_pb_to_raft(const Idalloc__PeerMessage *pb,
                    struct ida_raft_msg *m,
                    struct ida_entry **entries);

/* Decode an encoded idalloc.ClusterConfig into @out (in the encoded order):
 * members with `voter` set are voters, the others learners; `removed`
 * gives out->removed (an id there must not be a member nor repeat);
 * addresses are the node's business (src/node/book.h) and are skipped. The node
 * hands this to the core as ida_raft_config.conf_decode. Returns 0, IDA_EPROTO
 * (malformed, id 0, duplicate ids, no voter, more than IDA_RAFT_NODES_MAX
 * voters or learners); on error @out is unchanged. */
int node_conf_decode(const uint8_t *data,
                     size_t len,
                     struct ida_raft_conf *out);

/* The slot of @id among the nodes an operator removed (c->removed), -1 if
 * it is not there. */
int node_conf_removed_slot(const struct ida_raft_conf *c, ida_node_id id);

/* Encode @c as an idalloc.ClusterConfig without addresses into
 * @buf (capacity @cap); *@len gets the size. For tests and tools; the node
 * encodes its own configs with addresses. Returns 0 or IDA_ETOOBIG. */
int node_conf_encode(const struct ida_raft_conf *c,
                     uint8_t *buf,
                     size_t cap,
                     size_t *len);

/* Encode @c as an idalloc.ClusterConfig with each member's addresses from
 * @book (a member @book does not name gets none) into a new buffer (*@out,
 * ida_malloc'd): the form of the node's config entries, membership0 and
 * Hello. Returns 0 or IDA_ENOMEM. */
int node_conf_encode_full(const struct node_book *book,
                          const struct ida_raft_conf *c,
                          uint8_t **out,
                          size_t *len);

/* Check the pool name and tag of client request @req with the state
 * machine's rules (ida_fsm_pool_name_get(), ida_fsm_tag_get()) before it
 * reaches the log or a read. Returns 0 (also for operations without a name),
 * or IDA_EINVAL / IDA_ETOOBIG with *@why a static message saying which
 * rule ("tag holds a NUL byte"); *@why is left alone on success. */
int node_request_check(const Idalloc__ClientRequest *req, const char **why);

/* Make @c the log command of write request @q (pool create, alloc, free,
 * reserve or prefix alloc): @c points into @q, which must outlive it. */
void node_request_to_command(const Idalloc__ClientRequest *q,
                             Idalloc__Command *c);

#endif /* IDA_NODE_CONVERT_H */
