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
 *      Only an admitted node campaigns (pre-vote or vote). Only an admitted
 *      node, or a learner listed with its own incarnation, grants a vote,
 *      pre-votes included. The learner because it may have been promoted
 *      without knowing it yet (the promotion is in the leader's log, not in
 *      its own), and the other voters may need its vote to elect the
 *      leader that would tell it: with voters {A, B, C}, C re-admitted and
 *      promoted (the promotion in A's and B's logs), then C down before it
 *      reached C's log and the leader A gone, B can win only with C's vote
 *      (the simulator found it: liveness seed 109893 with appends capped
 *      at 100 bytes). etcd's raft lets learners vote for the same reason.
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
 * A learner listed with its own incarnation was added under that
 * incarnation by a leader's change (the node makes the A3 steps one at a
 * time, each committed before the next is proposed: the core refuses a
 * change while the previous one is uncommitted); what it acknowledged and
 * voted since is durable under its incarnation (a vote is persisted before
 * it is sent). Its vote counts only where a membership lists it as a
 * voter, bound to its incarnation or unbound (A2 drops it where another
 * incarnation is bound). A candidate whose membership still lists the old
 * incarnation lacks the committed removal the learner's log holds, and by
 * Log Matching and Leader Completeness such a log is less up to date than
 * the learner's, so the learner refuses it. A learner restored from an
 * older copy of its directory is rule A4's case, as a voter's is: its
 * window is wider now (from its addition, not its promotion).
 *
 * ROLLED-BACK STATE (rule A4)
 * A node restarted from an older copy of its own directory keeps its
 * incarnation: storage refuses the local damage it can see (an emptied or
 * replaced database, a torn meta page), but a whole-directory copy is
 * self-consistent, and its owner would vote and acknowledge from state it
 * already promised beyond. What the node promised, though, its peers heard.
 * So every message echoes back to its recipient what the sender heard from
 * it, and the recipient compares that with its own durable state:
 *
 *  A4. Storage counts every start of a directory durably before the node
 *      sends anything (ida_storage_boot(): count in the high 32 bits, a
 *      random nonce in the low 32), and every message carries the sender's
 *      boot id, and whether its term is durable (votes and acks go out
 *      after their hard state is fsynced; a leader's term was fsynced when
 *      it campaigned). Every node remembers, per member incarnation, the
 *      latest boot id and the highest durable term it heard, and puts them
 *      into each message to that member (to_inc, to_boot, to_term); a
 *      leader adds the index the member acknowledged in its term
 *      (to_match). Leader heartbeats also carry what the leader heard
 *      from every voter (gossip), which each member merges into its own
 *      memory, so the facts outlive the leader. A node told about its own
 *      incarnation (echoed, or in gossip)
 *        - a boot id with a higher count than its own, or the same count
 *          and another nonce (two starts cannot share a count unless the
 *          directory went back),
 *        - a durable term above its current term (terms never go back),
 *        - or, by the leader of its term, an acknowledged index beyond its
 *          last (an acknowledged entry is durable, and only a leader of a
 *          higher term can truncate it)
 *      has lost state it promised: ida_raft_step() returns IDA_ELOSTSTATE,
 *      and from then on the core steps nothing, sends nothing, votes and
 *      campaigns no more (ida_raft_rolled_back()). The node marks its
 *      directory untrusted and stops; removed, it can rejoin as a new
 *      incarnation (A3).
 *      Evidence counts only from members of the membership in effect.
 *      Each fact is true whoever relays it: it is what the node itself
 *      said, so gossip cannot make an honest node believe it went back.
 *
 * Each fact echoed back is one this node made durable before anyone heard
 * it, so an honest restart never meets a contradiction: A4 has no false
 * alarms, only misses. A copy taken before the node's last restart is
 * caught by any member that heard the later start (directly or by gossip),
 * and a copy older than a term the node made durable by any member that
 * heard that term. It misses a copy taken during the node's last life when
 * no peer that heard the lost part is left to say so: the copy's term was
 * not passed since, and the leader that counted its acknowledgements is
 * gone (a new leader starts with no progress). Together with that leader's
 * loss a rolled-back node is a lost majority of a 3-node cluster, the case
 * in which no protocol can know what was acknowledged: an operator must
 * never restore a node from a copy of its directory (README, Runbook).
 *
 * Bootstrap: the first configuration binds every member's incarnation (the
 * node learns them from its peers before it writes it; src/node), so a
 * cluster never runs on unbound incarnations once it is created.
 */
#ifndef IDA_RAFT_ADMISSION_H
#define IDA_RAFT_ADMISSION_H

#include <stdbool.h>
#include <stdint.h>

#include "base/types.h"
#include "raft/conf.h"

struct ida_raft;

/* Rule A4: what this node last heard from member @id's incarnation @inc. */
#define IDA_RAFT_SEEN_MAX (2 * IDA_RAFT_NODES_MAX)
struct ida_raft_seen
{
    ida_node_id id; /* 0: free slot */
    uint64_t inc;
    uint64_t boot;     /* the latest boot id heard (highest count) */
    uint64_t boot_alt; /* another start with boot's count, if one spoke */
    uint64_t term;     /* the highest durable term heard */
};

/* Rule A4: how this node learned that its state went back. */
enum ida_raft_rollback_kind {
    IDA_RAFT_ROLLBACK_NONE = 0,
    IDA_RAFT_ROLLBACK_BOOT = 1,  /* a peer heard a later start of ours */
    IDA_RAFT_ROLLBACK_TERM = 2,  /* a peer heard a higher durable term */
    IDA_RAFT_ROLLBACK_MATCH = 3, /* our leader saw us acknowledge more */
};
struct ida_raft_rollback
{
    enum ida_raft_rollback_kind kind;
    ida_node_id by; /* the peer that told us */
    uint64_t told;  /* what it heard: boot id, term or index */
    uint64_t have;  /* what we hold: our boot id, term or last index */
};

/* Rule A4: boot id @a is a later start than @b of the same directory, or
 * another start with the same count (then one of them came from a copy). */
bool ida_raft_boot_later(uint64_t a, uint64_t b);

/* Rule A4: true once a peer showed that @r's own state went back; @out (if
 * not NULL) says how. Sticky for the life of the core. */
bool ida_raft_rolled_back(const struct ida_raft *r,
                          struct ida_raft_rollback *out);

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
