/* The address book: where each node is, for net (which peers to dial) and
 * for clients (which client addresses to name).
 *
 * DESIGN
 *
 * A membership names every member with its addresses (ClusterConfig's
 * Member.peer_addr and client_addr), so the addresses of the nodes are
 * replicated and committed like the membership itself. The book of a node
 * is built from two sources, in this order:
 *
 *  1. the membership in effect in its own log (the latest config entry,
 *     else the snapshot's, else the first membership it stored): every
 *     member, voter or learner, at the addresses the membership gives it
 *     (a member written without addresses takes its cluster-file line's);
 *  2. the cluster file: every node of the file that is not a member and
 *     whose peer address no member uses (a node being created, re-admitted
 *     or removed still needs Hello answers, src/node/member.h).
 *
 * The raft processor rebuilds the book whenever the encoded membership in
 * effect changes (a config entry appended or truncated, a snapshot
 * installed) and hands it to net (ida_net_set_peers(): new nodes are
 * dialled, links to nodes no longer in the book are closed, a node whose
 * address changed is dialled at the new one) and to the node's answers
 * (ClientResponse.member_addrs, the NOT_LEADER hint). So a node added or
 * moved by a committed change is reached by every node without a restart,
 * and a membership entry that is later truncated takes its addresses with
 * it.
 *
 * Addresses decide only where a node dials. Who is at the other end is
 * decided by the link (with peer TLS its certificate must name the node
 * dialled) and what it may do by the membership's incarnations
 * (raft/admission.h); member.h says why a wrong address cannot make a node
 * act as another.
 *
 * Pure data: no I/O, no threads; the caller owns every struct. */
#ifndef IDA_NODE_BOOK_H
#define IDA_NODE_BOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "raft/conf.h"
#include "src/common/config.h"

/* The cluster file's nodes, and the members of a membership (voters and
 * learners), all distinct. */
#define NODE_BOOK_MAX (IDA_CONFIG_NODES_MAX + 2 * IDA_RAFT_NODES_MAX)

struct node_book_entry
{
    ida_node_id id;
    bool member; /* named by the membership (else a cluster-file node) */
    struct ida_addr peer, client;
};

struct node_book
{
    struct node_book_entry e[NODE_BOOK_MAX];
    size_t n;
};

/* Whether @a and @b are the same address (family, IP and port; "::1" and
 * "0::1" are the same). */
bool node_addr_same(const struct ida_addr *a, const struct ida_addr *b);

/* Build @b from the encoded membership @conf (@len bytes; NULL: none, the
 * cluster file's nodes alone) and the cluster file @file, as DESIGN says.
 * A member whose addresses do not parse and who has no file line is left
 * out (it cannot be dialled). Returns 0, or IDA_EPROTO when @conf does not
 * decode (@b then holds the file's nodes alone). */
int node_book_build(struct node_book *b,
                    const uint8_t *conf,
                    size_t len,
                    const struct ida_config *file);

/* Add to @b every node of the cluster file @file that @b does not name and
 * whose peer address no entry of @b uses (not as a member). */
void node_book_add_file(struct node_book *b, const struct ida_config *file);

/* The entry of node @id, NULL if it is not in @b. */
const struct node_book_entry *node_book_find(const struct node_book *b,
                                             ida_node_id id);

/* Put node @id at @peer and @client in @b (replacing its entry, or adding
 * one), as a member when @member. Returns 0 or IDA_ELIMIT (@b is full). */
int node_book_set(struct node_book *b,
                  ida_node_id id,
                  bool member,
                  const struct ida_addr *peer,
                  const struct ida_addr *client);

/* The id of a member of @b other than @except that uses @a as its peer or
 * client address, 0 if none. */
ida_node_id node_book_addr_user(const struct node_book *b,
                                const struct ida_addr *a,
                                ida_node_id except);

/* Whether @a and @b hold the same entries in the same order. */
bool node_book_equal(const struct node_book *a, const struct node_book *b);

#endif /* IDA_NODE_BOOK_H */
