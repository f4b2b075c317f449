/* libidalloc: the client library of idalloc.
 *
 * Link lib/libidalloc.a (or -lidalloc with lib/libidalloc.so) and include
 * this header. One client object talks to one cluster; it is safe to use
 * from many threads at once (calls are pipelined on one connection per node
 * and matched by request sequence number).
 *
 * Every call returns 0 or an IDA_E* code (idalloc_errors.h). Use
 * idalloc_errclass() to tell a definite "no" (IDA_ERR_CLASS_DEFINITE:
 * nothing happened) from "outcome unknown" (IDA_ERR_CLASS_UNKNOWN: the
 * operation may or may not have taken effect). The library already retried
 * an unknown outcome against other nodes with the SAME (client_id,
 * request_seq) until the call deadline, so a retry can never allocate twice.
 */
#ifndef IDALLOC_H
#define IDALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "idalloc_errors.h"
#include "idalloc_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IDALLOC_ERRMSG_MAX 512

/* The largest block idalloc_reserve() takes: 2^24 ids (the cluster's limit,
 * IDA_RESERVE_COUNT_MAX of fsm/fsm.h; src/node checks they agree). */
#define IDALLOC_RESERVE_COUNT_MAX (UINT64_C(1) << 24)

/* The library's version, IDALLOC_VERSION of the build ("0.2.0"). */
const char *idalloc_version(void);

enum idalloc_pool_kind {
    IDALLOC_POOL_SEQUENCE = 1,
    IDALLOC_POOL_BOUNDED = 2,
    IDALLOC_POOL_PREFIX = 3,
};

struct idalloc_options
{
    /* Where the cluster is: a comma-separated list of client addresses
     * ("127.0.0.1:7201,127.0.0.1:7202"), or a cluster file whose `node`
     * lines give them. Exactly one must be set. One reachable member is
     * enough: the client learns the others from the cluster. */
    const char *addresses;
    const char *config_path;
    /* One attempt against one node; on expiry the call moves on to another
     * node with the same request id. Default 1000. */
    unsigned attempt_timeout_ms;
    /* The whole call, retries included: no call takes longer. Default 5000. */
    unsigned call_timeout_ms;
    /* idalloc_next(): block size bounds; the size adapts to the rate of use
     * between them. Defaults 16 and 65536. */
    uint64_t next_block_min;
    uint64_t next_block_max;
    /* 16 bytes to use as this client's id, or NULL for a random one. Give
     * the id of an earlier client object (idalloc_client_id()) to retry
     * its requests from a new object or process. */
    const uint8_t *client_id;
    /* TLS to the nodes' client port (README, "TLS"; a node with
     * `client_tls on` or `required`): PEM files of the cluster's CA, and of
     * this client's certificate and key (both or neither; `client_tls
     * required` needs them). The node must show a node certificate of that
     * CA. NULL tls_ca_file (the default): plaintext. */
    const char *tls_ca_file;
    const char *tls_cert_file;
    const char *tls_key_file;
};

/* Fill @o with the defaults (addresses and config_path NULL). */
void idalloc_options_init(struct idalloc_options *o);

struct idalloc_client;

/* Create a client. Connects lazily (no I/O here besides reading a cluster
 * file). Returns 0, IDA_EINVAL or IDA_ECONFIG (bad options or file: a
 * one-line message in @errmsg, IDALLOC_ERRMSG_MAX bytes, may be NULL),
 * IDA_EIO or IDA_ENOMEM. */
int idalloc_client_new(const struct idalloc_options *o,
                       struct idalloc_client **out,
                       char *errmsg);

/* Close connections, stop background work, free. Ids left in idalloc_next()
 * blocks are never handed out (they are skipped, not reused). */
void idalloc_client_free(struct idalloc_client *c);

/* The last error's one-line detail for the calling thread ("" if none). */
const char *idalloc_last_error(void);

/* The 16-byte id of @c (random unless set in the options). */
void idalloc_client_id(const struct idalloc_client *c, uint8_t out[16]);

/* Request ids. Each call gets a fresh request_seq, kept for all its
 * retries. After a call, idalloc_last_request_seq() gives the seq it used
 * (per thread). To repeat a call whose outcome was unknown with the SAME
 * request id, so that it cannot act twice, call idalloc_retry_with(seq) and
 * then the same operation with the same arguments on a client with the same
 * client id: that next call on this thread uses @seq. The cluster answers a
 * repeated request with its first answer (while it keeps it: see the
 * server's session rules). */
uint64_t idalloc_last_request_seq(void);
void idalloc_retry_with(uint64_t seq);

/* --- operations ---------------------------------------------------------- */

/* Create pool @name of @kind (@size: ids [0, size) for bounded pools,
 * ignored otherwise). *created is 0 when an identical pool already existed
 * (may be NULL). IDA_EPOOLEXISTS: a pool with that name and other
 * parameters exists. */
int idalloc_pool_create(struct idalloc_client *c,
                        const char *name,
                        enum idalloc_pool_kind kind,
                        uint64_t size,
                        int *created);

/* Bounded pool: the lowest free id for @tag, or the id @tag already holds
 * (*existed = 1, may be NULL). IDA_EEXHAUSTED when the pool is full. */
int idalloc_alloc(struct idalloc_client *c,
                  const char *pool,
                  const char *tag,
                  uint64_t *id,
                  int *existed);

/* Bounded pool: free @id held by @tag. *freed is 0 when it was already free
 * (may be NULL). IDA_ETAGMISMATCH: another tag holds it. */
int idalloc_free(struct idalloc_client *c,
                 const char *pool,
                 uint64_t id,
                 const char *tag,
                 int *freed);

/* Bounded pool: the id @tag holds; IDA_ENOTFOUND if none. Linearizable. */
int idalloc_lookup(struct idalloc_client *c,
                   const char *pool,
                   const char *tag,
                   uint64_t *id);

struct idalloc_holding
{
    uint64_t id;
    char *tag;
};

/* Bounded pool: holdings in id order, starting after @after_id (or from 0
 * when @has_after is 0), at most @limit (0: server default). *out is an
 * array of *count holdings the caller frees with idalloc_holdings_free();
 * *more is 1 when another page follows. Linearizable. */
int idalloc_list(struct idalloc_client *c,
                 const char *pool,
                 int has_after,
                 uint64_t after_id,
                 uint32_t limit,
                 struct idalloc_holding **out,
                 size_t *count,
                 int *more);
void idalloc_holdings_free(struct idalloc_holding *h, size_t count);

/* Sequence pool: reserve @count ids [*first, *first + @count). @count must
 * be in [1, IDALLOC_RESERVE_COUNT_MAX] (else IDA_EINVAL, nothing sent). */
int idalloc_reserve(struct idalloc_client *c,
                    const char *pool,
                    uint64_t count,
                    uint64_t *first);

/* Sequence pool: one id, handed out locally from a reserved block. Blocks
 * are refilled in the background with exactly one refill in flight per
 * pool, started before the block runs dry, so callers almost never wait. */
int idalloc_next(struct idalloc_client *c, const char *pool, uint64_t *id);

/* Prefix pool: the prefix for @tag (a new one, or the one it already holds:
 * *existed = 1, may be NULL). @out receives *len bytes (at most 9). */
int idalloc_prefix(struct idalloc_client *c,
                   const char *pool,
                   const char *tag,
                   uint8_t out[9],
                   size_t *len,
                   int *existed);

#define IDALLOC_STATUS_PEERS_MAX      8
#define IDALLOC_STATUS_ERRORS_MAX     8
#define IDALLOC_STATUS_ERROR_TEXT_MAX 128

struct idalloc_node_status
{
    unsigned node_id;
    char address[64]; /* the client address asked */
    char role[16];
    uint64_t term;
    unsigned leader_id;
    uint64_t commit_index;
    uint64_t applied_index;
    uint64_t log_first_index, log_last_index;
    uint64_t snapshot_index;
    uint64_t snapshot_term;
    /* The leader's view of each follower (empty on followers). */
    size_t n_peers;
    struct
    {
        unsigned node_id;
        uint64_t match_index, next_index;
        char state[16]; /* "probe", "replicate", "snapshot" */
        int connected;
    } peers[IDALLOC_STATUS_PEERS_MAX];
    /* The node's most frequent errors (from its error top files). */
    size_t n_errors;
    struct
    {
        int code;
        char text[IDALLOC_STATUS_ERROR_TEXT_MAX];
        uint64_t count;
        uint64_t last_seen_unix_ms;
    } errors[IDALLOC_STATUS_ERRORS_MAX];
};

/* Number of nodes the client knows, and the status of node number @i
 * (0-based) asked directly. The client knows the addresses of its options
 * first (in their order), then those the cluster named: a NOT_LEADER hint
 * is followed to any address, and NOT_LEADER and status answers list every
 * member's client address, so the count can grow after a call (at most
 * 16 nodes). */
size_t idalloc_node_count(const struct idalloc_client *c);
int idalloc_node_status(struct idalloc_client *c,
                        size_t i,
                        struct idalloc_node_status *out);

/* --- membership (README, "Runbook") --------------------------------------
 *
 * Served by the leader (the library finds it). Only nodes of the cluster
 * file can be members; new node ids and new addresses are not supported. */

#define IDALLOC_MEMBERS_MAX 48

struct idalloc_member
{
    unsigned id;
    uint64_t incarnation; /* its data directory's; 0: not bound */
    char peer_addr[64];   /* from the leader's cluster file */
    char client_addr[64];
    int voter;   /* 1: voter; 0: learner (or waiting) */
    int waiting; /* 1: not a member with this incarnation: a cluster-file
                  * node that spoke with it (a replaced data directory
                  * waiting for re-admission, or a removed node) */
    uint64_t match_index; /* the leader's replication progress */
    int connected;        /* the leader has a connection to it */
};

struct idalloc_member_list
{
    unsigned leader_id;
    uint64_t commit_index;
    size_t n;
    struct idalloc_member members[IDALLOC_MEMBERS_MAX];
};

/* The membership in effect at the leader: voters, then learners, then
 * waiting nodes. Returns 0 or an error as for reads. */
int idalloc_member_list(struct idalloc_client *c,
                        struct idalloc_member_list *out);

enum idalloc_member_op {
    IDALLOC_MEMBER_REMOVE = 1,  /* voter or learner @id leaves */
    IDALLOC_MEMBER_ADD = 2,     /* cluster-file node @id joins as a learner,
                                 * bound to the incarnation it last spoke
                                 * with; promoted automatically once caught
                                 * up when the cluster file says
                                 * auto_rejoin on */
    IDALLOC_MEMBER_PROMOTE = 3, /* caught-up learner @id becomes a voter */
};

/* One single-server membership change. Returns 0 once the change
 * committed (*changed = 1), or at once when the membership already is so
 * (*changed = 0; so a retry of a change that committed succeeds); @changed
 * may be NULL. IDA_EREFUSED (definite, nothing changed): the last voter,
 * a node not in the cluster file, a node never heard from (add), a
 * learner not caught up (promote), and so on, with the reason in
 * idalloc_last_error(). Removing the leader hands leadership to a
 * caught-up voter first; the library then retries at the new leader.
 * Another change or a transfer under way (IDA_EBUSY at the leader):
 * retried until the call deadline, then IDA_ETIMEDOUT. IDA_ETIMEDOUT,
 * IDA_ELEADERLOST: outcome unknown; repeating the call is safe (a change
 * already made answers 0 with *changed = 0). */
int idalloc_member_change(struct idalloc_client *c,
                          enum idalloc_member_op op,
                          unsigned id,
                          int *changed);

/* Hand leadership to voter @to (0: any caught-up voter). Returns 0 once
 * the old leader stepped down, *leader (may be NULL) the new leader (0 if
 * not known yet); IDA_EREFUSED (definite: @to is not another voter, no
 * voter is caught up, or the transfer did not complete within three
 * election timeouts and the old leader still leads). */
int idalloc_leader_transfer(struct idalloc_client *c,
                            unsigned to,
                            unsigned *leader);

/* --- next() statistics, for tests and benchmarks ------------------------- */

struct idalloc_next_stats
{
    uint64_t handed_out;            /* ids returned by idalloc_next() */
    uint64_t refills;               /* refills started */
    uint64_t refills_max_in_flight; /* never above 1 per pool */
    uint64_t waits;                 /* calls that had to wait for a refill */
    uint64_t block_size;            /* current block size */
};
int idalloc_next_stats(struct idalloc_client *c,
                       const char *pool,
                       struct idalloc_next_stats *out);

/* --- formatting ---------------------------------------------------------- */

#define IDALLOC_HEX_ID_LEN 19 /* "0000-0000-0000-0001" */

/* Format @id as four dash-separated groups of four lowercase hex digits;
 * lexicographic order of the strings equals numeric order of the ids.
 * @buf must hold IDALLOC_HEX_ID_LEN + 1 bytes. */
void idalloc_format_hex(uint64_t id, char *buf);

/* Parse what idalloc_format_hex() wrote. Returns 0 or IDA_EINVAL. */
int idalloc_parse_hex(const char *s, uint64_t *id);

#ifdef __cplusplus
}
#endif

#endif /* IDALLOC_H */
