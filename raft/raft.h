/* The Raft core: a pure, deterministic state machine (etcd raft style).
 *
 * DESIGN
 * The core implements Raft as in Figure 2 of the Raft paper and the Raft
 * dissertation: randomized election timeouts, pre-vote (§9.6), check-quorum
 * and leader stickiness (§6.2, §9.6), a no-op entry at the start of each
 * term (§6.4), per-follower progress in probe / replicate / snapshot mode
 * with a bound on in-flight appends, fast conflict backtracking with a term
 * hint (§5.3 "optimization"), commit by counting replicas of current-term
 * entries only (§5.4.2, Figure 8; a new commit index goes to followers
 * with the next append or heartbeat, never alone: replication.c,
 * ida__raft_committed()), leader-side parallel persist (§10.2.1),
 * snapshots with chunked InstallSnapshot (§5; a window of chunks in
 * flight, taken in order, go-back to the first one refused), ReadIndex
 * (§6.4), leadership transfer with TimeoutNow (§3.10) and single-server
 * membership changes (§4.1: a config entry takes effect when appended;
 * learners catch up before they vote, §4.2.1; raft/conf.h).
 *
 * It does no I/O, reads no clock, starts no thread and has no global state.
 * The node runtime drives it with calls:
 *   ida_raft_tick()       one logical tick (the node picks the tick length)
 *   ida_raft_step()       one message from a peer
 *   ida_raft_propose()    a new entry (leader only; fails fast otherwise)
 *   ida_raft_read_index() a linearizable read barrier (leader only)
 *   ida_raft_transfer()   hand leadership to another voter
 *   ida_raft_compact()    the application took a snapshot at applied index
 *   ida_raft_persisted()  "batch N (and all before it) is durable"
 * and collects the work to do with ida_raft_ready(): one batch
 * (struct ida_raft_batch) of hard state, entries and snapshot to persist,
 * messages to send, committed entries to apply and reads that are ready.
 * Call ida_raft_ready() after every input (or group of inputs) until it
 * returns false; proposals are batched into appends at that point.
 *
 * PERSISTENCE CONTRACT (enforced by the simulator, tests/sim/)
 *  1. Batches are persisted in the order ready() returned them. A batch's
 *     entries replace every stored entry with index >= entries[0].index
 *     (truncate, then append). Its hard state replaces the stored one; its
 *     snapshot (if any) replaces the stored snapshot and the whole stored
 *     log: the entries that follow the snapshot are in the same batch.
 *     A batch carries the hard state when the term or vote changed, or
 *     with entries or a snapshot; a commit index that moved alone waits
 *     for the next such batch (it is volatile state, Figure 2). So the
 *     stored commit may lag the one applied: a restart applies up to it
 *     and learns the rest from the leader's appends.
 *  2. batch.msgs may be sent at once, before anything of the batch is
 *     durable (this is how the leader persists in parallel with its
 *     followers: it counts itself in the quorum only after step 3).
 *  3. batch.msgs_after_persist may be sent only after the whole batch (and
 *     every earlier batch) is durable (fsynced). They are the votes, append
 *     acknowledgements and the candidate's vote requests: sending one early
 *     can lose an acknowledged entry or let a node vote twice in a term.
 *     After the batch is durable, call ida_raft_persisted(r, batch.id).
 *     After a crash, unsent msgs_after_persist are simply dropped.
 *  4. batch.committed entries are durable locally and committed; apply them
 *     in order. batch.snapshot (received from the leader), once durable,
 *     replaces the state machine's state; the core hands out no entry after
 *     it before its batch is persisted.
 *  5. The application's own snapshots: store the snapshot durably with the
 *     membership in effect at its index (ida_raft_config_at()), then
 *     ida_raft_compact(); storage may drop the entries up to its index
 *     once the snapshot is durable.
 *  6. On restart, hand ida_raft_init() exactly what storage holds: the hard
 *     state, the snapshot (meta, data, config) and the entries after it.
 *  7. Snapshot bytes kept by the application (ida_raft_compact() with NULL
 *     data, or a restore with snapshot_in_storage): the core holds only the
 *     snapshot's index, term, size and config. Its InstallSnapshot messages
 *     then carry data NULL with len > 0: before sending one, the node fills
 *     bytes [offset, offset + len) of the snapshot it stored at last_index,
 *     or drops the message if it no longer holds that snapshot (the core
 *     sends again, as for a lost message). A snapshot installed from a
 *     leader is held in memory until its batch is durable; then
 *     ida_raft_snapshot_stored() lets the core drop those bytes too.
 *
 * MEMORY
 * Everything a batch points to (entries, entry data, messages, snapshot
 * data) is owned by the core and valid only until the next call of any
 * ida_raft_* function on the same core; the node copies (or encodes) what
 * it keeps longer. Proposal data and restored entries are copied in.
 * The core allocates when its log or output arrays grow (amortized, grow
 * by doubling and kept), to copy entry data and to hold a snapshot;
 * steady-state replication reuses its arrays. The data of entries a
 * snapshot compacted is not freed at once (at 10 M allocations, 30 k
 * entries of ~100 MB held the node's raft processor 11 to 43 ms): it waits
 * for ida_raft_release(), which frees it a bounded piece at a time.
 *
 * THREADING
 * None: a core is used by one thread at a time (the node's raft processor).
 */
#ifndef IDA_RAFT_H
#define IDA_RAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/types.h"
#include "raft/admission.h"
#include "raft/conf.h"

#define IDA_RAFT_INFLIGHT_MAX 64 /* upper bound of max_inflight */
#define IDA_RAFT_PENDING_MAX  64 /* batches handed out, not yet persisted */
/* Terms at or above this are refused in peer messages (so term + 1, the
 * pre-vote term included, never overflows) and never reached. */
#define IDA_RAFT_TERM_MAX (UINT64_MAX - 2)
/* Indexes (and snapshot offsets) above this in a peer message are refused:
 * no log gets there, and index + 1 or index + n never wraps. */
#define IDA_RAFT_INDEX_MAX (UINT64_MAX >> 2)
/* Default of ida_raft_config.snapshot_bytes_max (when 0): 1 GiB. */
#define IDA_RAFT_SNAPSHOT_BYTES_DEFAULT ((size_t)1 << 30)

enum ida_raft_role {
    IDA_RAFT_FOLLOWER = 0,
    IDA_RAFT_PRE_CANDIDATE = 1,
    IDA_RAFT_CANDIDATE = 2,
    IDA_RAFT_LEADER = 3,
};

/* Message types (the node maps them to its wire format). */
enum ida_raft_msg_type {
    IDA_RAFT_MSG_REQUEST_VOTE = 1,
    IDA_RAFT_MSG_RESPONSE_VOTE = 2,
    IDA_RAFT_MSG_APPEND_ENTRIES = 3,
    IDA_RAFT_MSG_APPEND_RESPONSE = 4,
    IDA_RAFT_MSG_INSTALL_SNAPSHOT = 5,
    IDA_RAFT_MSG_SNAPSHOT_RESPONSE = 6,
    IDA_RAFT_MSG_TIMEOUT_NOW = 7,
};

struct ida_raft_request_vote
{
    bool pre_vote;
    ida_index last_log_index;
    ida_term last_log_term;
    bool transfer;
};

struct ida_raft_response_vote
{
    bool pre_vote;
    bool granted;
};

struct ida_raft_append_entries
{
    ida_index prev_log_index;
    ida_term prev_log_term;
    const struct ida_entry *entries; /* borrowed (see MEMORY) */
    size_t n_entries;
    ida_index commit_index;
    uint64_t read_ctx;
};

struct ida_raft_append_response
{
    bool success;
    ida_index match_index;
    ida_index reject_index;
    ida_term conflict_term;
    ida_index conflict_index;
    uint64_t read_ctx;
};

struct ida_raft_install_snapshot
{
    ida_index last_index;
    ida_term last_term;
    /* The encoded membership (see cfg.conf_decode) in effect at
     * last_index; empty: the bootstrap voters. Borrowed (see
     * MEMORY). */
    const uint8_t *config;
    size_t config_len;
    uint64_t offset;
    const uint8_t *data; /* borrowed (see MEMORY) */
    size_t len;
    bool done;
    uint64_t total_size;
};

struct ida_raft_snapshot_response
{
    ida_index last_index;
    uint64_t next_offset;
    bool done;
    bool success;
};

/* One peer message: from, to, term and one of the bodies above. */
struct ida_raft_msg
{
    enum ida_raft_msg_type type;
    ida_node_id from;
    ida_node_id to;
    ida_term term;
    uint64_t from_inc; /* the sender's incarnation (raft/admission.h) */
    /* Rule A4 of raft/admission.h (set by the core when it sends): */
    uint64_t from_boot;   /* the sender's boot id (ida_raft_config.boot) */
    bool term_durable;    /* @term is in the sender's durable hard state */
    uint64_t to_inc;      /* the recipient's incarnation the fields below
                             speak of (0: the sender heard nothing from it) */
    uint64_t to_boot;     /* the latest boot id the sender heard from it */
    uint64_t to_boot_alt; /* another start with to_boot's count it heard */
    ida_term to_term;     /* the highest durable term the sender heard */
    ida_index to_match;   /* leader: the index it acknowledged this term */
    /* Leader heartbeats: what the leader heard from each voter, so every
     * member can echo it even after the leader is gone. */
    size_t n_gossip;
    struct ida_raft_seen gossip[IDA_RAFT_NODES_MAX];
    union {
        struct ida_raft_request_vote request_vote;
        struct ida_raft_response_vote response_vote;
        struct ida_raft_append_entries append_entries;
        struct ida_raft_append_response append_response;
        struct ida_raft_install_snapshot install_snapshot;
        struct ida_raft_snapshot_response snapshot_response;
    } u;
    /* Internal to the core (which log range a queued append carries). */
    ida_index ents_first_;
    ida_term ents_last_term_;
};

struct ida_raft_config
{
    ida_node_id id; /* this node, != 0 */
    /* Bootstrap voters: the membership until the log or a snapshot holds a
     * config (a node that joins later may leave itself out). */
    ida_node_id voters[IDA_RAFT_NODES_MAX];
    uint64_t voter_inc[IDA_RAFT_NODES_MAX]; /* their incarnations, 0: unbound */
    size_t n_voters;                        /* 1..IDA_RAFT_NODES_MAX */
    /* This node's incarnation (raft/admission.h): sent in every message;
     * the node votes and campaigns only while its membership names it. */
    uint64_t incarnation;
    /* This start's boot id (rule A4 of raft/admission.h; the node's is
     * ida_storage_boot()): sent in every message. 0: no rollback checks
     * of this node's own state (tests that do not model restarts). */
    uint64_t boot;
    unsigned election_ticks;  /* >= 2 * heartbeat_ticks */
    unsigned heartbeat_ticks; /* >= 1 */
    uint64_t seed;            /* election timeout PRNG */
    bool pre_vote;            /* run a pre-vote round */
    bool check_quorum;        /* step down without quorum */
    unsigned max_inflight;    /* 1..IDA_RAFT_INFLIGHT_MAX */
    /* Appends with entries sent to one follower per call of the send
     * path in replicate mode; more go with the next call, up to
     * max_inflight in flight. A step may call it more than once (an
     * acknowledgement that also commits: twice). Each acknowledgement
     * frees what it acknowledges and calls again, so with 2 or more the
     * window fills from acknowledgements alone; with 1 an acknowledgement
     * of one append sends one, and the window grows only by other calls
     * (heartbeat answers, commits). Bounds the work of one call when a
     * follower is far behind. 0: no bound. */
    unsigned max_append_burst;
    size_t max_msg_entries; /* entries per append, >= 1 */
    /* Entry bytes per append: entries are added while their data stays
     * within it (at least one entry goes, whatever its size), so an append
     * fits the transport's largest message. 0: no limit. */
    size_t max_msg_bytes;
    size_t snapshot_chunk_bytes; /* InstallSnapshot chunk, >= 1 */
    /* InstallSnapshot chunks sent to a follower before the first of them
     * is answered, 0..IDA_RAFT_INFLIGHT_MAX; 0 and 1: one at a time. A
     * follower takes chunks in order only and answers each with the bytes
     * it holds; the leader goes back to that point, one chunk at a time,
     * when one is refused or nothing is taken over a heartbeat interval. */
    unsigned snapshot_max_inflight;
    /* Largest snapshot accepted from a leader (InstallSnapshot total_size);
     * 0: IDA_RAFT_SNAPSHOT_BYTES_DEFAULT (1 GiB). The receive buffer grows
     * with the chunks that arrived, never to a size only announced. */
    size_t snapshot_bytes_max;
    /* Decode the membership carried by an IDA_ENTRY_CONFIG entry or a
     * snapshot config (the application's bytes; the core only passes them
     * through) into @out. Returns 0, IDA_EPROTO for bytes that do not
     * decode, IDA_ENOMEM. Must be deterministic. Required; the node's is
     * node_conf_decode() (src/node/convert.h). */
    int (*conf_decode)(const uint8_t *data,
                       size_t len,
                       struct ida_raft_conf *out);
    /* Check the state bytes @data (@len bytes, borrowed for the call) of
     * the snapshot at @index, whose last entry has @term, received from a
     * leader, once all of it arrived and before the core gives up its log
     * for it: nonzero refuses it (the core keeps its log and state, answers
     * the leader "not installed, start again from byte 0", and
     * ida_raft_step() returns IDA_EPROTO). On 0 the core installs exactly
     * these bytes: a later batch hands them out (has_snapshot) with the same
     * @index and @term, unless a newer snapshot replaced them first, so what
     * the check built from them may be kept for that batch. NULL: no check.
     * The node's restores the bytes into a scratch state machine, on a
     * thread of its own (IDA_RAFT_CHECK_PENDING, below), and hands that to
     * its fsm processor with the install (src/node/raft_snap.c).
     *
     * IDA_RAFT_CHECK_PENDING instead: the check goes on outside this call (a
     * thread of the application's), the bytes staying valid and unchanged until
     * the application gives its verdict with ida_raft_snapshot_checked(). The
     * core meanwhile runs as before (answers heartbeats, votes, ticks),
     * answers the sender's chunks of that snapshot "all of it held, not
     * installed yet" (so it stops resending them), and refuses a chunk of
     * any other snapshot, or of that one in another term (the sender
     * starts over later). */
    int (*snapshot_check)(void *arg,
                          ida_index index,
                          ida_term term,
                          const uint8_t *data,
                          size_t len);
    void *snapshot_check_arg;
};

/* What snapshot_check returns for "checking outside this call" (not an
 * IDA_E* code: those are positive). */
#define IDA_RAFT_CHECK_PENDING (-1)
/* What ida_raft_snapshot_checked() returns when it installed nothing
 * because the core moved on meanwhile. */
#define IDA_RAFT_CHECK_STALE (-2)

/* What storage holds, handed to ida_raft_init() on (re)start. */
struct ida_raft_restore
{
    struct ida_hard_state hard_state;
    ida_index snapshot_index; /* 0: no snapshot */
    ida_term snapshot_term;
    const uint8_t *snapshot_data; /* copied */
    /* Or, instead of snapshot_data, bytes from ida_malloc() the core takes
     * without copying when ida_raft_init() succeeds (a restart's snapshot
     * can be hundreds of MB); on failure they stay the caller's. */
    uint8_t *snapshot_take;
    /* Or neither: the bytes stay in the application's storage (contract
     * 7); only their length is given. */
    bool snapshot_in_storage;
    size_t snapshot_len;
    const uint8_t *snapshot_config; /* encoded membership; copied */
    size_t snapshot_config_len;     /* 0: the bootstrap voters */
    const struct ida_entry
        *entries; /* snapshot_index+1.. consecutive; copied */
    size_t n_entries;
};

struct ida_raft_snapshot
{
    ida_index index;
    ida_term term;
    const uint8_t *data; /* borrowed (see MEMORY) */
    size_t len;
    const uint8_t *config; /* encoded membership at index, borrowed */
    size_t config_len;     /* 0: the bootstrap voters */
};

struct ida_raft_read
{
    uint64_t ctx;    /* the caller's ida_raft_read_index() context */
    ida_index index; /* serve the read once applied >= index */
};

/* Per-peer replication progress (leader). */
enum ida_raft_progress_state {
    IDA_RAFT_PROBE = 0,
    IDA_RAFT_REPLICATE = 1,
    IDA_RAFT_SNAPSHOT = 2,
};

struct ida_raft_progress
{
    ida_node_id id;
    ida_index match;
    ida_index next;
    enum ida_raft_progress_state state;
    bool probe_sent;    /* probe: one append in flight, wait */
    bool recent_active; /* heard from since the last quorum check */
    bool acked;         /* replicate, snapshot: moved since last heartbeat */
    uint64_t read_ack;  /* highest read_ctx acknowledged this term */
    ida_index inflight[IDA_RAFT_INFLIGHT_MAX]; /* last index per append */
    unsigned inflight_head;
    unsigned inflight_count;
    /* Snapshot mode: chunks [snap_acked, snap_offset) are in flight, at
     * most cfg.snapshot_max_inflight of them (one while snap_probe). */
    ida_index snap_index; /* the snapshot being sent */
    uint64_t snap_offset; /* next byte offset to send */
    uint64_t snap_acked;  /* bytes the follower said it holds, in order */
    bool snap_probe;      /* one chunk at a time until one is taken */
    bool snap_done_sent;  /* the last chunk went out since the last rewind */
};

/* One batch of work. Valid until the next ida_raft_* call (see MEMORY). */
struct ida_raft_batch
{
    uint64_t id;       /* pass to ida_raft_persisted() */
    bool must_persist; /* hard state, entries or snapshot to write */
    bool has_hard_state;
    struct ida_hard_state hard_state;
    bool has_snapshot;
    struct ida_raft_snapshot snapshot;
    const struct ida_entry *entries; /* to persist; truncate from [0].index */
    size_t n_entries;
    const struct ida_raft_msg *msgs; /* send now */
    size_t n_msgs;
    const struct ida_raft_msg *msgs_after_persist; /* send once durable */
    size_t n_msgs_after_persist;
    const struct ida_entry *committed; /* apply in order */
    size_t n_committed;
    const struct ida_raft_read *reads; /* reads whose index is confirmed */
    size_t n_reads;
    /* Soft state now. When role leaves LEADER, every pending proposal and
     * read of this node has an unknown outcome: answer IDA_ELEADERLOST. */
    enum ida_raft_role role;
    ida_node_id leader;
    ida_term term;
};

/* The core. Fields are private to raft/ (read-only for tests). */
struct ida_raft
{
    struct ida_raft_config cfg;
    uint32_t bugs; /* enum ida_raft_bug (raft/testing.h), 0 in production */
    uint64_t rng;
    /* Persistent state (Figure 2), as seen by the core. */
    ida_term term;
    ida_node_id vote;
    /* Log: snapshot, then entries [snap_index+1, snap_index+n_log]. */
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap_data;
    size_t snap_len;
    uint8_t *snap_conf; /* encoded config at snap_index, NULL: bootstrap */
    size_t snap_conf_len;
    bool snap_unsent; /* snapshot to hand out in the next batch */
    /* Membership in effect: the latest config entry in the log (it takes
     * effect when appended, §4.1), else the snapshot's, else bootstrap.
     * prs[i], votes[i] and voted[i] belong to conf.voters[i];
     * prs[conf.n + j] to conf.learners[j]. */
    struct ida_raft_conf conf;
    ida_index conf_index; /* index of that config entry, 0: none in log */
    struct ida_entry *log;
    size_t n_log;
    size_t cap_log;
    /* Data of compacted entries, freed by ida_raft_release() (MEMORY). */
    void **garbage;
    size_t n_garbage, cap_garbage;
    /* Volatile state. */
    enum ida_raft_role role;
    ida_node_id leader;
    ida_index commit;
    ida_index applied; /* handed out in batch.committed */
    ida_index stable;  /* durable locally and equal to our log */
    ida_index unsent;  /* first index not yet handed out to persist */
    unsigned election_elapsed;
    unsigned heartbeat_elapsed;
    unsigned randomized_timeout;
    bool votes[IDA_RAFT_NODES_MAX];
    bool voted[IDA_RAFT_NODES_MAX];
    struct ida_raft_progress prs[2 * IDA_RAFT_NODES_MAX];
    bool broadcast; /* leader: new entries to send */
    /* Hard state last handed out. */
    struct ida_hard_state hs_out;
    /* Batches handed out, not yet persisted (ring). */
    uint64_t next_batch_id;
    struct
    {
        uint64_t id;
        ida_index last; /* clamped on truncation */
        bool has_snapshot;
        ida_index snap_index;
    } pending[IDA_RAFT_PENDING_MAX];
    unsigned pending_head;
    unsigned pending_count;
    /* Output queues. */
    struct ida_raft_msg *msgs;
    size_t n_msgs, cap_msgs;
    struct ida_raft_msg *msgs_ap;
    size_t n_msgs_ap, cap_msgs_ap;
    /* ReadIndex (leader). */
    uint64_t read_seq;
    struct
    {
        uint64_t ctx;
        uint64_t seq;
        ida_index index;
    } * reads_pending;
    size_t n_reads_pending, cap_reads_pending;
    struct ida_raft_read *reads_ready;
    size_t n_reads_ready, cap_reads_ready;
    size_t n_reads_out; /* handed out in the last batch */
    bool msgs_handed;   /* msgs / msgs_ap were handed out by ready() */
    bool ap_handed;
    /* Leadership transfer (leader). */
    ida_node_id transferee;
    unsigned transfer_elapsed;
    /* Snapshot being received (follower). */
    uint8_t *rcv_data;
    size_t rcv_len, rcv_cap;
    ida_index rcv_index;
    ida_term rcv_term;
    uint8_t *rcv_conf;
    size_t rcv_conf_len;
    uint64_t rcv_total; /* total_size announced at offset 0 */
    /* The whole snapshot arrived and its check runs outside the core
     * (snapshot_check returned IDA_RAFT_CHECK_PENDING): rcv_data is the
     * checker's, unchanged, until ida_raft_snapshot_checked(). From whom, at
     * which of our terms. */
    bool rcv_checking;
    ida_node_id rcv_from;
    ida_term rcv_check_term;
    /* Peer messages refused by ida_raft_step() (IDA_EINVAL, IDA_EPROTO). */
    uint64_t dropped;
    /* Rule A4 (raft/admission.h): what each member said of itself, and
     * whether a peer showed that this node's own state went back. */
    struct ida_raft_seen seen[IDA_RAFT_SEEN_MAX];
    struct ida_raft_rollback rollback;
};

/* Initialize @r from @cfg and what storage holds (@restore may be NULL for a
 * fresh node). Returns 0, IDA_EINVAL for a bad @cfg or inconsistent
 * @restore (entries not consecutive after the snapshot, vote for a
 * non-member), IDA_ENOMEM; on error nothing needs to be closed. */
int ida_raft_init(struct ida_raft *r,
                  const struct ida_raft_config *cfg,
                  const struct ida_raft_restore *restore);

/* Release everything @r owns. */
void ida_raft_close(struct ida_raft *r);

/* Advance logical time by one tick: elections, heartbeats, check-quorum. */
void ida_raft_tick(struct ida_raft *r);

/* Feed one message. @m and what it points to are borrowed for the call
 * (entry data is copied). The core trusts no field of @m: every index, term
 * and length is checked against what this node knows before it is used.
 * Returns:
 *  0            also for stale or ignored messages; among the ignored: while
 *               this node hears from a leader (check_quorum lease, §9.6) a
 *               message with a higher term from an id that is not a member of
 *               its membership (so a non-member cannot move its term; once
 *               the lease runs out it can, as a new leader this node's lagging
 *               log does not name yet must, dissertation §4.1); and a
 *               TimeoutNow from anyone but the leader this node follows in
 *               its current term (one with a higher term does not move the
 *               term either: a genuine one never has it);
 *  IDA_EINVAL   a message not addressed to this node, from itself or node 0,
 *               or with fields inconsistent in themselves: term 0 or
 *               > IDA_RAFT_TERM_MAX, an index > IDA_RAFT_INDEX_MAX, entries
 *               that do not follow prev_log_index or whose terms decrease or
 *               exceed the message term, a last_log_term / prev_log_term /
 *               snapshot last_term above the message term, an InstallSnapshot
 *               chunk with offset + len > total_size, total_size >
 *               cfg.snapshot_bytes_max or done without offset + len ==
 *               total_size;
 *  IDA_EFOREIGN a message from another incarnation of a member (dropped
 *               unread: raft/admission.h);
 *  (0)          a vote request or an answer from a node outside the
 *               membership (voters and learners) is ignored before its term
 *               is read and counted in ida_raft_dropped();
 *  IDA_EPROTO   a message that contradicts what this node knows: an
 *               AppendResponse whose match / reject / conflict index is past
 *               the leader's last index (or the conflict index past the
 *               reject index), whose read_ctx was never sent; a snapshot
 *               response offset past the snapshot; a second leader in a
 *               term; a chunk of a snapshot whose total_size changed; a
 *               leader contradicting a committed entry (the simulator counts
 *               every IDA_EPROTO / IDA_EINVAL as a safety violation);
 *  IDA_ENOMEM   the message is then treated as lost; a valid prefix of its
 *               entries may have been appended, which is safe since nothing
 *               was acknowledged.
 * On IDA_EINVAL and IDA_EPROTO the message was dropped and counted
 * (ida_raft_dropped()); except for a leader contradicting a committed entry
 * (found after the term was adopted) it changed nothing. No field of a
 * message can make the core assert. */
int ida_raft_step(struct ida_raft *r, const struct ida_raft_msg *m);

/* Append a new entry (leader only); @data is copied. On success *@index and
 * *@term say where it sits: it is committed if an applied entry at @index
 * has @term, and lost if that entry has another term.
 * IDA_ENTRY_CONFIG (membership change, dissertation §4.1): @data is an
 * encoded membership (decoded by cfg.conf_decode) whose voters differ from the
 * current ones by exactly one added or removed voter (or only the learners
 * change, or nothing the core sees: the members are the same and only what
 * else the application encodes differs); it takes effect at once (when
 * appended), one change at a time. A
 * leader removed by it keeps leading until the entry commits, then steps down.
 * To replace a server: add the new one as a learner (voter = false), promote it
 * once it caught up (ida_raft_progress_of() match reaches the commit index),
 * then remove the old one. Returns 0, IDA_ENOTLEADER (not leader; batch.leader
 * names the leader if known), IDA_EBUSY (a leadership transfer is under way; or
 * for a config: the previous config change or this leader's first entry has not
 * committed yet), IDA_EINVAL (bad type, or a config that does not decode or
 * is not a single-server change), IDA_ENOMEM. On error nothing changed. */
int ida_raft_propose(struct ida_raft *r,
                     enum ida_entry_type type,
                     const uint8_t *data,
                     size_t len,
                     ida_index *index,
                     ida_term *term);

/* Ask for a linearizable read barrier (§6.4 ReadIndex). When a quorum
 * confirmed this leader, a later batch lists {@ctx, index}: serve the read
 * once the state machine applied index. Returns 0, IDA_ENOTLEADER,
 * IDA_EBUSY (this leader has not committed an entry of its term yet: retry
 * shortly), IDA_ENOMEM. */
int ida_raft_read_index(struct ida_raft *r, uint64_t ctx);

/* Transfer leadership to voter @to (§3.10): stop accepting proposals, bring
 * @to up to date, then send it TimeoutNow. Aborted after an election
 * timeout. Returns 0, IDA_ENOTLEADER, IDA_EINVAL (@to is not another
 * voter), IDA_EBUSY (a transfer is already running). */
int ida_raft_transfer(struct ida_raft *r, ida_node_id to);

/* The application took a snapshot of its state at @index (<= applied
 * index); @data (copied) is sent to followers that fell behind, or, when
 * @data is NULL and @len > 0, the application keeps the @len bytes and
 * fills them into the InstallSnapshot messages (contract 7). The log up to
 * @index is dropped from memory; storage may drop it once it stored the
 * snapshot. Returns 0, IDA_EINVAL (@index not applied or not after the
 * current snapshot), IDA_ENOMEM. */
int ida_raft_compact(struct ida_raft *r,
                     ida_index index,
                     const uint8_t *data,
                     size_t len);

/* The verdict of a snapshot check that said IDA_RAFT_CHECK_PENDING (the
 * config's snapshot_check) for the snapshot at @index, @term: 0 accepts it,
 * nonzero refuses it. Accepted, the core installs those bytes as if the
 * check had said 0 at once, and tells the sender; refused, it forgets them
 * and tells the sender to start again from byte 0 (as a refusal at once
 * does). But only while nothing changed that would make the install wrong
 * or useless: if the core's term moved on, it is no longer a follower, it
 * already holds the index (committed by other means) or it was told its
 * state went back (rule A4), it forgets the bytes and does nothing else
 * (IDA_RAFT_CHECK_STALE); the leader of the day sends its snapshot again.
 * Returns 0 (installed), IDA_EPROTO for a refusal, IDA_RAFT_CHECK_STALE,
 * or IDA_EINVAL when no check of that snapshot was pending (a late or
 * repeated verdict: ignored). */
int ida_raft_snapshot_checked(struct ida_raft *r,
                              ida_index index,
                              ida_term term,
                              int verdict);

/* Free the data of at most @max entries that compactions dropped (MEMORY):
 * call it often (the node: after every step, with a small @max). Returns
 * how many wait still. */
size_t ida_raft_release(struct ida_raft *r, size_t max);

/* The application's storage holds the snapshot at @index durably (the
 * batch that installed it from a leader was persisted): the core drops its
 * bytes and keeps only the size (contract 7). No-op unless @index is the
 * core's snapshot and its batch went out. */
void ida_raft_snapshot_stored(struct ida_raft *r, ida_index index);

/* The bytes of the snapshot at @index that a batch handed out (installed
 * from a leader), taken from the core so the node need not copy them: the
 * caller owns them (ida_free), and the core keeps only the size, as after
 * ida_raft_snapshot_stored() (a chunk this node sends of that snapshot
 * carries data NULL, for the node to fill from storage, or to drop while
 * storage does not hold it yet). NULL, and nothing taken, unless @index is
 * the core's snapshot, its batch went out and the core still holds the
 * bytes. Unlike the other calls it leaves the batch being handled valid
 * (MEMORY): it may be called while a batch is handled. */
uint8_t *ida_raft_snapshot_take(struct ida_raft *r, ida_index index);

/* Collect the work to do into @b. Returns true if @b holds any work. The
 * batch stays valid until the next ida_raft_* call (see MEMORY). At most
 * IDA_RAFT_PENDING_MAX batches may await ida_raft_persisted(); beyond that
 * new entries stay queued until an older batch is persisted. */
bool ida_raft_ready(struct ida_raft *r, struct ida_raft_batch *b);

/* Batch @id and every batch before it is durable and its
 * msgs_after_persist may go out. Call it for every batch with id != 0 (a
 * batch with only msgs_after_persist and nothing to write still waits for
 * the earlier batches). Unknown or repeated ids are ignored. */
void ida_raft_persisted(struct ida_raft *r, uint64_t id);

/* Accessors. */
enum ida_raft_role ida_raft_role(const struct ida_raft *r);
ida_node_id ida_raft_leader(const struct ida_raft *r);
ida_term ida_raft_term(const struct ida_raft *r);
ida_index ida_raft_commit(const struct ida_raft *r);
ida_index ida_raft_last_index(const struct ida_raft *r);
/* The index of the snapshot the core holds (0: none). */
ida_index ida_raft_snapshot_index(const struct ida_raft *r);
/* A snapshot being received from the leader: bytes taken so far (in
 * order, from offset 0), and its index and term; 0 when none. */
uint64_t ida_raft_receiving(const struct ida_raft *r,
                            ida_index *index,
                            ida_term *term);
/* Peer messages ida_raft_step() refused (IDA_EINVAL or IDA_EPROTO), and
 * vote requests and answers of nodes outside the membership it ignored. */
uint64_t ida_raft_dropped(const struct ida_raft *r);
/* The encoded membership in effect at the snapshot index (the
 * one ida_raft_compact() or an installed snapshot recorded); *@len 0 and
 * NULL: the bootstrap voters. Storage keeps it with the snapshot and hands
 * it back in ida_raft_restore. Borrowed (see MEMORY). */
const uint8_t *ida_raft_snapshot_config(const struct ida_raft *r, size_t *len);
/* The encoded membership in effect at @index into *@conf and *@len, for a
 * snapshot about to be stored at @index (contract 5): the last config
 * entry at or before @index, else the current snapshot's (NULL and 0: the
 * bootstrap voters). Borrowed (see MEMORY). Returns 0, or IDA_EINVAL when
 * @index is not in (snapshot index, applied index], where
 * ida_raft_compact() would refuse it too. */
int ida_raft_config_at(const struct ida_raft *r,
                       ida_index index,
                       const uint8_t **conf,
                       size_t *len);
/* The leader's replication progress of member @id (voter or learner), NULL
 * if this node is not leader or @id is not a member. For status output
 * and to decide when a learner caught up. Borrowed. */
const struct ida_raft_progress *ida_raft_progress_of(const struct ida_raft *r,
                                                     ida_node_id id);
/* The voters in effect. */
const struct ida_raft_conf *ida_raft_voters(const struct ida_raft *r);
/* The term of the entry at @index, 0 if not in the log (or compacted,
 * except the snapshot's last entry). */
ida_term ida_raft_term_at(const struct ida_raft *r, ida_index index);
/* The entry at @index, NULL if not in memory. Borrowed (see MEMORY). */
const struct ida_entry *ida_raft_entry(const struct ida_raft *r,
                                       ida_index index);
const char *ida_raft_role_name(enum ida_raft_role role);

#endif /* IDA_RAFT_H */
