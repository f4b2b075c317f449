/* Admission: a node that lost its state never acts as its old self.
 *
 * THE PROBLEM
 * Raft assumes a node keeps what it fsynced. A node whose disk was replaced
 * (or emptied) restarts with no log and no vote. If it then votes, or its
 * acknowledgements count, as the member it used to be, an entry that only it
 * and one other node held can be lost: with 3 nodes, the leader and node B
 * acknowledge entry e; the leader dies; B comes back empty; B votes for node
 * C, which never had e; C becomes leader without e, and an id acknowledged
 * in e is handed out again.
 *
 * THE RULE
 * Every data directory has an incarnation: a random 64-bit id minted when
 * storage creates the directory (storage/storage.h), never 0. Memberships
 * name members by (node id, incarnation); an incarnation of 0 in a
 * membership means "not bound yet" and matches any (only memberships
 * written before incarnations existed have it). Every peer message carries
 * its sender's incarnation (ida_raft_msg.from_inc). Then:
 *
 *  A1. A node is *admitted* when the membership in effect in its own log
 *      lists it as a voter with its own incarnation (ida_raft_admitted()).
 *      Only an admitted node campaigns (pre-vote or vote) or grants a vote,
 *      pre-votes included.
 *  A2. At an admitted node, an answer (vote, append or snapshot response)
 *      from a member whose bound incarnation differs from the message's
 *      from_inc is dropped before it is looked at (ida_raft_step() returns
 *      IDA_EFOREIGN): it changes no term and counts toward no commit and no
 *      vote tally. Requests (vote requests, appends, snapshots, TimeoutNow)
 *      are looked at as usual: they only carry the sender's own claims, which
 *      Raft checks anyway, and a new incarnation sends none until a
 *      membership admits it (A1). A node whose membership is stale must hear
 *      them: the re-admitted member may be the only candidate that can win.
 *      (A node that is not admitted counts nothing, so it reads every
 *      message.)
 *  A3. A new incarnation becomes a member only by membership changes made by
 *      a leader: remove the old incarnation, add the new one as a learner,
 *      let it catch up, promote it. Each is a single-server change
 *      (ida_raft_conf_one_change(): changing a voter's bound incarnation
 *      counts as a removal plus an addition, so it cannot be done in one
 *      step).
 *
 * WHY IT IS SAFE
 * Raft's safety rests on quorum intersection over durable state: any two
 * quorums of a configuration share a node that remembers what it promised
 * (its vote in a term, the entries it acknowledged). A node with a new
 * incarnation has promised nothing under that incarnation, so it must not
 * stand in for the old one in any quorum. By A2 nothing it sends counts for
 * the old member; by A1 it casts no vote and starts no election, because no
 * membership in its log names its incarnation as a voter: the log it may
 * receive from the leader names the old incarnation until a change names
 * the new one. By A3 the new incarnation enters quorums only through
 * ordinary single-server changes, each safe by the dissertation's argument
 * (§4.1), and only after it caught up: from then on it is a new member with
 * its own durable promises. Removing the old incarnation first shrinks the
 * voters (3 -> 2 needs both survivors, never fewer); when more than a
 * minority of the current voters is gone, no leader can commit the
 * changes, and the cluster stays unavailable rather than wrong.
 *
 * What this does not catch: a node that restarts from an older copy of its
 * own directory keeps its incarnation. Storage refuses the local damage it
 * can see (an emptied or replaced database, a torn meta page), but a
 * whole-directory copy is self-consistent: together with the loss of the
 * nodes that saw its later state it can lose an acknowledged entry, and no
 * rule local to one node can tell it from an ordinary restart. A leader
 * could notice a follower whose log ends below what it acknowledged, but a
 * reordered old rejection looks the same without per-message sequence
 * numbers; that detection is not done yet.
 *
 * Bootstrap: the first configuration binds every member's incarnation (the
 * node learns them from its peers before it writes it; src/node), so a
 * cluster never runs on unbound incarnations once it is created.
 */
#ifndef IDA_RAFT_ADMISSION_H
#define IDA_RAFT_ADMISSION_H

#include <stdbool.h>
#include <stdint.h>

#include "raft/conf.h"

struct ida_raft;

/* Rule A1: @r's own membership lists it as a voter with its incarnation (or
 * an unbound one). */
bool ida_raft_admitted(const struct ida_raft *r);

/* Whether a message from @id claiming incarnation @inc may be looked at
 * under membership @c (rule A2): true for non-members, for members whose
 * incarnation is unbound (0) and for an exact match. */
bool ida_raft_conf_inc_ok(const struct ida_raft_conf *c,
                          ida_node_id id,
                          uint64_t inc);

/* The bound incarnation of member @id in @c, 0 if unbound or not a member. */
uint64_t ida_raft_conf_inc(const struct ida_raft_conf *c, ida_node_id id);

#endif /* IDA_RAFT_ADMISSION_H */
