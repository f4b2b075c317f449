/* idallocd: one node of an idalloc cluster.
 *
 * DESIGN (docs/DESIGN.md, "One node"): four parts, each owning its state.
 *   net      libuv on its own thread (src/node/net.h): peers and clients.
 *   raft     processor: the Raft core, group commit of client commands into
 *            log entries, ReadIndex, leadership bookkeeping, status.
 *   storage  processor: each Raft batch becomes one durable storage step; then
 *            the messages that had to wait for it go out.
 *   fsm      processor: applies committed entries, answers the clients
 *            whose writes they carry, serves confirmed reads, snapshots
 *            when src/node/snap_policy.h says so.
 * The three processors run on the message-passing pool (src/pool), one
 * worker thread each, so a storage fsync never stalls raft or fsm.
 *
 * Group commit: while a raft batch is being persisted, or the entry of
 * the last one is not yet committed, client commands accumulate in an open
 * CommandBatch; it is proposed as one log entry once both are done (or the
 * batch is full, or at the next ping): raft_proc.c, GATE.
 * The leader sends AppendEntries before its own fsync (parallel persist).
 *
 * Durability: an answer to a write leaves only after the fsm applied its
 * entry, which the Raft core hands out only once it is committed, i.e.
 * fsynced on a majority (the core counts the leader only once its own
 * storage step completed).
 */
#ifndef IDA_NODE_H
#define IDA_NODE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fsm/fsm.h"
#include "raft/raft.h"
#include "src/common/config.h"
#include "src/node/book.h"
#include "src/node/errtop.h"
#include "src/node/metrics.h"
#include "src/node/msgs.h"
#include "src/node/net.h"
#include "src/pool/pool.h"
#include "storage/storage.h"

#define IDA_NODE_TICK_MS_MAX 10

struct ida_node_opts
{
    const char *config_path;
    unsigned node_id;
    const char *data_dir; /* NULL: the cluster file's data_dir */
    /* This node's addresses (--peer, --client, both or neither; --metrics):
     * over its line of the cluster file, and required when the file has
     * none. NULL: the file's. */
    const char *peer_addr;
    const char *client_addr;
    const char *metrics_addr;
    /* --join: client addresses of running members, comma-separated; NULL:
     * none (ida_node_join()). */
    const char *join;
    /* --single-node: this node alone may create the cluster (a cluster
     * file of this one node, a new data directory). */
    int single_node;
    /* --export-backup: write the stopped node's state to this backup file
     * instead of running (src/node/export.h); NULL: run. */
    const char *export_backup;
    /* --import-backup: write a new data directory seeded from this backup
     * file instead of running (src/node/import.h), every sequence pool
     * moved --advance-sequences ids on; NULL: run. */
    const char *import_backup;
    uint64_t advance_sequences;
    /* --log-level (over the cluster file's log_level) and --log-format:
     * applied by idallocd's main, not by ida_node_open(). */
    int has_log_level;
    enum ida_log_level log_level;
    int log_json;
};

struct raft_proc;
struct storage_proc;
struct fsm_proc;

struct ida_node
{
    struct ida_config cfg;
    const struct ida_config_node *self; /* &self_node */
    struct ida_config_node self_node;   /* id and where this node listens */
    /* Started with --join: never a first start (src/node/member.h); the
     * members ida_node_join() learned, the address book while joining. */
    int join;
    /* Started with --single-node: a new data directory creates the
     * cluster of this node alone, without hearing anyone. */
    int single_node;
    struct node_book join_book;
    int has_join_book;
    /* The raft processor's address book as other threads read it
     * (ida__node_book_publish()). */
    pthread_mutex_t book_mu;
    int book_mu_init;
    struct node_book book;
    char dir[IDA_PATH_MAX + 16]; /* data_dir/nodeN */
    struct ida_storage storage;
    int storage_open;
    struct ida_pool *pool;
    uint32_t p_raft, p_storage, p_fsm;
    /* Each processor as the pool runs it: its calls timed (node.c,
     * add_procs()). Only that processor's thread touches its entry. */
    struct ida__timed_proc
    {
        struct ida_node *node;
        const struct ida_proc_ops *ops;
        void *state;
        enum ida_metrics_proc which;
        uint64_t slow_logged_ms; /* the last "held ... ms" line */
        uint64_t slow_since;     /* calls over the mark since that line */
        /* Set by the processor during a call that is not what its
         * message or ping says (a restart's rebuild, waited for in the
         * fsm's first call): the line names this instead; cleared after
         * each call. */
        const char *what;
    } timed[IDA_MPROC_COUNT_];
    struct ida_net *net;
    struct raft_proc *raft;
    struct storage_proc *sp;
    struct fsm_proc *fp;
    uint8_t *config_pb; /* the cluster as an encoded ClusterConfig */
    size_t config_pb_len;
    struct ida_errtop_where errtop_where; /* for the pool's error sink */
    int lock_fd; /* the data directory, flock'ed while the node lives; -1 */
    uint64_t incarnation; /* this data directory's (storage) */
    uint64_t boot;        /* this start's boot id (ida_storage_boot()) */
    /* The exit status idallocd returns once stopped: 0, or 1 when the node
     * stopped itself (its state went back: raft/admission.h, rule A4). */
    volatile int exit_status;
    uint8_t *membership0; /* the first membership (storage), or NULL */
    size_t membership0_len;
    int fresh; /* a new directory: no membership, log, snapshot or vote */
    /* Seeded by --import-backup and not yet started with the rest of its
     * cluster: takes no part until every other node of the cluster file
     * answered that it is new (src/node/import.h). */
    int seeded;
    size_t snapshot_bytes0; /* size of the snapshot restored at start */
    /* Slices of this node's snapshot sent by the fsm processor and not yet
     * written by storage (IDA_NM_SNAPSHOT_ENC): the fsm reads no more of
     * the child's pipe while IDA_ENC_SLICES_MAX are on their way, so the
     * encoded state is never gathered in memory, whatever storage's pace. */
    atomic_uint enc_slices;
    /* When a raft message larger than a peer frame was last logged
     * (ida__node_send_raft(); raft and storage both send). */
    _Atomic uint64_t toobig_said_ms;
    /* Snapshot turns (src/node/snap_policy.h, TURNS): whether this node's
     * fsm processor has a child encoding (a snapshot or a backup's copy);
     * which peers' have, as the raft processor last heard first-hand (what
     * a leader passes on: ida_snap_peers_relay_word()); and whether any
     * peer's has, first-hand or relayed (what makes a snapshot wait).
     * Every peer message carries them (ida__node_send_raft()). */
    atomic_bool snap_child, peers_snap_any;
    _Atomic uint64_t peers_snap_relay;
    /* This node leads and a follower is catching up: a snapshot now would
     * drop log it needs (snap_policy.h, CATCH-UP). The raft processor
     * refreshes it every tick. */
    atomic_bool follower_behind;
    struct ida_metrics *metrics; /* src/node/metrics.h; from start to close */
};

/* Load the cluster file, lock the data directory (flock on the directory:
 * a second idallocd for the same directory fails with one line, before it
 * reads or writes anything else), open storage (refusing a foreign directory)
 * and rebuild the Raft core and the state machine from it. Binds nothing.
 * Returns 0 or an error with a one-line message in @errmsg
 * (IDA_ERRMSG_MAX). On error nothing needs to be closed. */
int ida_node_open(struct ida_node *n,
                  const struct ida_node_opts *o,
                  char *errmsg);

/* --join: ask the running members at @addrs (client addresses, comma-
 * separated) for the membership, once, through the client library: the
 * leader's member list, with every member's addresses. Its members become
 * the address book while the node joins (src/node/member.h); nothing is
 * written. Returns 0, IDA_EINVAL (a bad address in @addrs, or this node's
 * address is another member's: the message says which), or the client's
 * error (IDA_EUNAVAIL, IDA_ETIMEDOUT...; retry later), with a one-line
 * message in @errmsg (IDA_ERRMSG_MAX). Call it between ida_node_open()
 * and ida_node_start(), only for a node whose data directory is new
 * (ida_node_is_new()). */
int ida_node_join(struct ida_node *n, const char *addrs, char *errmsg);

/* Whether the node's data directory is new: no membership, log, snapshot
 * or vote (it learns the cluster before it takes part). */
int ida_node_is_new(const struct ida_node *n);

/* Bind the addresses and start the threads. On error the node is closed. */
int ida_node_start(struct ida_node *n, char *errmsg);

/* Stop accepting, finish the storage step in flight, close everything. */
void ida_node_close(struct ida_node *n);

/* --- the processors (node internals) ------------------------------------- */

int ida__raft_proc_new(struct ida_node *n,
                       const struct ida_raft_restore *r,
                       struct raft_proc **out);
void ida__raft_proc_free(struct raft_proc *rp);
extern const struct ida_proc_ops ida__raft_proc_ops;
unsigned ida__raft_proc_tick_ms(const struct ida_node *n);

int ida__storage_proc_new(struct ida_node *n, struct storage_proc **out);
void ida__storage_proc_free(struct storage_proc *sp);
extern const struct ida_proc_ops ida__storage_proc_ops;

/* The fsm processor over @fsm (taken). With @rebuild (lend.h, taken
 * either way), @fsm is empty and the processor waits for the state @rebuild
 * makes of the @snap_len bytes of the snapshot at @snap_index before
 * anything else it does: a restart's log read, Raft core and links
 * proceed meanwhile. A snapshot that does not decode then ends the
 * process, as a failed install does. */
struct ida__rebuild;
int ida__fsm_proc_new(struct ida_node *n,
                      struct ida_fsm *fsm,
                      ida_term applied_term,
                      ida_index snap_index,
                      struct ida__rebuild *rebuild,
                      size_t snap_len,
                      struct fsm_proc **out);
void ida__fsm_proc_free(struct fsm_proc *fp);
extern const struct ida_proc_ops ida__fsm_proc_ops;

/* Send Raft message @m to its peer (converted; net copies it). Thread-safe
 * (goes through net); a message net cannot take is lost, as on a wire. */
void ida__node_send_raft(struct ida_node *n, const struct ida_raft_msg *m);

/* Answer client connection @conn's request @seq with @res (borrowed for
 * the call); @leader (0: none) goes in leader_id. Thread-safe. */
void ida__node_reply_result(struct ida_node *n,
                            uint64_t conn,
                            uint64_t seq,
                            Idalloc__CommandResult *res,
                            ida_node_id leader);

/* Answer client connection @conn's request @seq with error @err (@why, or
 * the code's message when NULL); @leader != 0 adds the NOT_LEADER hint (its
 * id and client address). Thread-safe (goes through net). */
void ida__node_reply_error(struct ida_node *n,
                           uint64_t conn,
                           uint64_t seq,
                           int err,
                           const char *why,
                           ida_node_id leader);
/* The same; @unregistered: the request was a RegisterClient that
 * registered nothing (this node is not leader), and no longer counts
 * toward its connection's registration limit (ida_net_reply_uncounted()). */
void ida__node_reply_refusal(struct ida_node *n,
                             uint64_t conn,
                             uint64_t seq,
                             int err,
                             const char *why,
                             ida_node_id leader,
                             int unregistered);

/* Make @b (copied) the address book the node's answers use (the member
 * addresses and leader hints below). Thread-safe. */
void ida__node_book_publish(struct ida_node *n, const struct node_book *b);

/* Copy the client address of every member of the membership in effect into
 * @bufs (NODE_BOOK_MAX slots) and point @out at them; returns how many. A
 * client that was given one address learns the others from these.
 * Thread-safe. */
size_t ida__node_member_addrs(struct ida_node *n,
                              char (*bufs)[IDA_ADDR_TEXT_MAX],
                              char **out);

/* "0a1b2c3d/1234": the first 4 bytes of a client id in hex and a request
 * seq, how debug logs name one request from receipt to answer. */
#define IDA_NODE_REQ_NAME_MAX 32
void ida__node_req_name(const uint8_t *client_id,
                        size_t len,
                        uint64_t seq,
                        char out[IDA_NODE_REQ_NAME_MAX]);

/* Milliseconds of a monotonic / wall clock. */
uint64_t ida__node_mono_ms(void);
uint64_t ida__node_mono_us(void);
uint64_t ida__node_wall_ms(void);

#endif /* IDA_NODE_H */
