/* libidalloc: the client library of idalloc.
 *
 * Link lib/libidalloc.a (or -lidalloc with lib/libidalloc.so) and include
 * this header. One client object talks to one cluster.
 *
 * THREADING: a client object is safe to use from many threads at once
 * (calls are pipelined on one connection per node and matched by request
 * id). A struct idalloc_call is used by one call at a time; the library
 * keeps no per-thread state. Each client object runs one I/O thread of its
 * own, started by idalloc_client_new(): it owns the connections, reads
 * every answer, runs the retries and deadlines of every call, and runs the
 * completion callbacks of the asynchronous calls (below, "asynchronous
 * calls"). A blocking call is an asynchronous one and a wait on a condition
 * variable. (A call submitted while the I/O thread sleeps is written to its
 * socket by the submitting thread, to spare a wake-up; nothing else runs
 * there.)
 *
 * ERRORS: every call returns 0 or an IDA_E* code (idalloc_errors.h) and, when
 * given a struct idalloc_call, leaves a one-line detail in call->errmsg.
 * idalloc_errclass() tells a definite "no" (IDA_ERR_CLASS_DEFINITE, USAGE:
 * nothing happened) from "outcome unknown" (IDA_ERR_CLASS_UNKNOWN: the
 * operation may or may not have taken effect). Every call may also return
 * IDA_EINVAL (bad arguments, nothing sent), IDA_ENOMEM, IDA_EUNAVAIL (no
 * node reachable or none accepted it: nothing was carried out),
 * IDA_ETIMEDOUT (no answer before the call deadline: outcome unknown) and
 * IDA_EPROTO (a node answered something malformed).
 *
 * EXACTLY ONCE (the Raft dissertation's client sessions, 6.3): a client
 * object registers a session with the cluster before its first write (a
 * logged command) and numbers its writes. The cluster keeps the answer of
 * every write the client has not acknowledged yet, with what it was for;
 * a repeated request gets its first answer and never acts twice. The library
 * retries a write against other nodes with the same request id until the
 * call deadline. A write that still ends with an unknown outcome can be
 * repeated later with the same request id through its struct idalloc_call
 * (below), from any thread, or from another process with the id's text form;
 * the library keeps its answer wanted (below the acknowledgement floor it
 * sends) until the call is repeated to a definite answer or released.
 * A session idle for an hour of the cluster's log time expires; repeating a
 * call of an expired session ends with IDA_ESESSION (outcome unknown for
 * good: settle it by reading, e.g. idalloc_lookup()).
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

/* The API this header describes. Bumped on every incompatible change;
 * compare with idalloc_api_version() to detect a mismatched library. */
#define IDALLOC_API_VERSION 2

#if defined(__GNUC__) || defined(__clang__)
#define IDALLOC_MUST_CHECK __attribute__((warn_unused_result))
#else
#define IDALLOC_MUST_CHECK
#endif

#define IDALLOC_ERRMSG_MAX 512

/* The largest block idalloc_reserve() takes: 2^24 ids (the cluster's limit,
 * IDA_RESERVE_COUNT_MAX of fsm/fsm.h; src/node checks they agree). */
#define IDALLOC_RESERVE_COUNT_MAX (UINT64_C(1) << 24)

/* Writes whose answer a client object keeps wanted at once: calls in flight
 * plus calls that ended unknown and were not released. A write past it gets
 * IDA_ELIMIT at once, nothing sent. */
#define IDALLOC_OUTSTANDING_MAX 4096
/* Calls in flight on one client object at once, blocking and asynchronous,
 * reads included. A call past it gets IDA_ELIMIT at once, nothing sent. */
#define IDALLOC_IN_FLIGHT_MAX 4096
/* The cluster keeps every answer of a client from its oldest wanted one on
 * (at most 65536, IDA_SESSION_RESULTS_MAX of fsm/fsm.h). A call left unknown
 * therefore pins the answers of the writes after it: once this many writes
 * followed it, a new write gets IDA_ELIMIT at once (nothing sent) until the
 * old call is repeated or released. */
#define IDALLOC_SPAN_MAX 60000

/* The library's version, IDALLOC_VERSION of the build ("0.2.0"); static. */
const char *idalloc_version(void);
/* IDALLOC_API_VERSION of the library as built. */
unsigned idalloc_api_version(void);

enum idalloc_pool_kind {
    IDALLOC_POOL_SEQUENCE = 1,
    IDALLOC_POOL_BOUNDED = 2,
    IDALLOC_POOL_PREFIX = 3,
};

/* Options of a client. Always start from idalloc_options_init(), which sets
 * struct_size: the library reads only the fields that a struct of that size
 * holds, so a program built against an older header keeps working when
 * fields are appended. */
struct idalloc_options
{
    size_t struct_size; /* sizeof(struct idalloc_options) of the caller */
    /* Where the cluster is: a comma-separated list of client addresses
     * ("127.0.0.1:7201,127.0.0.1:7202"), or a cluster file whose `node`
     * lines give them. Exactly one must be set. One reachable member is
     * enough: the client learns the others from the cluster. Read during
     * idalloc_client_new() only (not kept). */
    const char *addresses;
    const char *config_path;
    /* One attempt against one node; on expiry the call moves on to another
     * node with the same request id (an earlier attempt's answer that
     * comes later still ends the call). Default 1000. */
    unsigned attempt_timeout_ms;
    /* The whole call, retries included: no call takes longer. Default 5000. */
    unsigned call_timeout_ms;
    /* idalloc_next(): block size bounds; the size adapts to the rate of use
     * between them. Defaults 16 and 65536. */
    uint64_t next_block_min;
    uint64_t next_block_max;
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
 * file); the session is registered by the first write. @o is read during
 * the call only. On 0, *@out is the new client, released with
 * idalloc_client_free(). Returns 0, IDA_EINVAL or IDA_ECONFIG (bad options
 * or file: a one-line message in @errmsg, IDALLOC_ERRMSG_MAX bytes, may be
 * NULL), IDA_EIO (no randomness for the session id) or IDA_ENOMEM; on error
 * nothing is allocated. */
IDALLOC_MUST_CHECK int idalloc_client_new(const struct idalloc_options *o,
                                          struct idalloc_client **out,
                                          char *errmsg);

/* Close connections, stop the I/O thread, free. No blocking call on @c may
 * be in progress, and no call may start later from another thread.
 * Asynchronous calls still in flight are completed before it returns,
 * their callbacks run on the I/O thread (see "asynchronous calls"); a
 * callback that submits again then gets IDA_EUNAVAIL. Must not be called
 * from a completion callback of @c (it would wait for its own thread).
 * Ids left in idalloc_next() blocks are never handed out (they are
 * skipped, not reused). NULL is ignored. */
void idalloc_client_free(struct idalloc_client *c);

/* --- calls: request ids, replays, error detail ---------------------------
 *
 * struct idalloc_call is the caller's handle on one call: its request id
 * (the session's client id and a sequence number), its state and its error
 * detail. Every operation takes one (may be NULL: no detail, and an unknown
 * outcome cannot be repeated). The caller owns it; it must stay valid for
 * the duration of the call and must not be used by two calls at once. It is
 * plain data: copy it, or persist its text form (idalloc_call_format()).
 *
 *   state NEW      fresh: the next call with it gets a new request id.
 *                  A call that was not carried out (IDA_EUNAVAIL, or
 *                  refused before sending) leaves it NEW.
 *   state DONE     the call ended with an answer (0 or a definite error).
 *                  A DONE or LOST call struct used again starts a fresh
 *                  call (a new request id).
 *   state UNKNOWN  the call ended with an unknown outcome (IDA_ETIMEDOUT,
 *                  IDA_ELEADERLOST, ...). Calling the SAME operation with
 *                  the SAME arguments and this call struct repeats the
 *                  request with its request id: the cluster answers with the
 *                  first answer if it acted, or acts now if it never did, so
 *                  it acts exactly once. Another operation or other
 *                  arguments under the same id get IDA_EREUSED (definite,
 *                  nothing done). The client object keeps the id's answer
 *                  wanted until a repeat ends DONE or idalloc_call_release().
 *   state LOST     the outcome can no longer be learned: the session expired
 *                  (IDA_ESESSION). Settle it by reading.
 *   state IN_FLIGHT
 *                  an asynchronous call (and a blocking one, which is built
 *                  on it) owns the struct: set when it is submitted,
 *                  replaced by one of the states above before its callback
 *                  runs. A struct in this state given to any call:
 *                  IDA_EINVAL, nothing done.
 *
 * The asynchronous calls take the same struct: the error, the detail and
 * the request id come back in it, and an UNKNOWN one is repeated the same
 * way. */
enum idalloc_call_state {
    IDALLOC_CALL_NEW = 0,
    IDALLOC_CALL_DONE = 1,
    IDALLOC_CALL_UNKNOWN = 2,
    IDALLOC_CALL_LOST = 3,
    IDALLOC_CALL_IN_FLIGHT = 4,
};

struct idalloc_call
{
    size_t struct_size; /* sizeof(struct idalloc_call), set by _init */
    enum idalloc_call_state state;
    uint8_t client_id[16]; /* the session the request belongs to */
    uint64_t seq;          /* its sequence number; 0 while NEW */
    int error;             /* the last result returned with this call */
    char errmsg[IDALLOC_ERRMSG_MAX]; /* its one-line detail, "" on success */
};

/* Make @t a NEW call. */
void idalloc_call_init(struct idalloc_call *t);

/* Give up on an UNKNOWN call: @c stops keeping its answer wanted, so the
 * cluster may drop it (a later repeat then ends IDA_ESESSION). @t becomes
 * LOST. Returns 0, or IDA_EINVAL when @t is not UNKNOWN. Thread-safe. */
int idalloc_call_release(struct idalloc_client *c, struct idalloc_call *t);

/* The text form of @t's request id, "32 hex digits:decimal seq", into
 * @buf (IDALLOC_CALL_ID_TEXT_MAX bytes). Returns 0, or IDA_EINVAL when @t
 * has no request id yet (NEW). */
#define IDALLOC_CALL_ID_TEXT_MAX 54
int idalloc_call_format(const struct idalloc_call *t, char *buf);

/* Make @t an UNKNOWN call with the request id @text (as formatted above),
 * e.g. to repeat in this process a call made by another. Returns 0 or
 * IDA_EINVAL (@t unchanged). */
IDALLOC_MUST_CHECK int idalloc_call_parse(const char *text,
                                          struct idalloc_call *t);

/* --- operations ----------------------------------------------------------
 *
 * Each takes the client (@c, not NULL), its arguments (borrowed for the call)
 * and @call (may be NULL; see above). Writes (pool create, alloc, free,
 * reserve, prefix) may also return IDA_ESESSION (a repeated call whose
 * answer is gone: outcome unknown for good), IDA_EREUSED (a repeated call
 * with another operation or arguments) and IDA_ELIMIT (too many calls
 * outstanding on this client, or a cluster limit: nothing done). Out
 * parameters are written only on 0. */

/* Create pool @name of @kind (@size: ids [0, size) for bounded pools, 0
 * otherwise). *created is 0 when an identical pool already existed (may be
 * NULL). IDA_EPOOLEXISTS: a pool with that name and other parameters
 * exists; IDA_EINVAL: bad name, kind or size; IDA_EEXHAUSTED: too many
 * pools. */
IDALLOC_MUST_CHECK int idalloc_pool_create(struct idalloc_client *c,
                                           const char *name,
                                           enum idalloc_pool_kind kind,
                                           uint64_t size,
                                           int *created,
                                           struct idalloc_call *call);

/* Bounded pool: the lowest free id for @tag, or the id @tag already holds
 * (*existed = 1, may be NULL). IDA_EEXHAUSTED when the pool is full,
 * IDA_ENOPOOL, IDA_EKIND (not a bounded pool), IDA_EINVAL or IDA_ETOOBIG
 * (bad tag). */
IDALLOC_MUST_CHECK int idalloc_alloc(struct idalloc_client *c,
                                     const char *pool,
                                     const char *tag,
                                     uint64_t *id,
                                     int *existed,
                                     struct idalloc_call *call);

/* Bounded pool: free @id held by @tag. *freed is 0 when it was already free
 * (may be NULL). IDA_ETAGMISMATCH: another tag holds it; IDA_ENOPOOL,
 * IDA_EKIND, IDA_EINVAL (id outside the pool, bad tag). */
IDALLOC_MUST_CHECK int idalloc_free(struct idalloc_client *c,
                                    const char *pool,
                                    uint64_t id,
                                    const char *tag,
                                    int *freed,
                                    struct idalloc_call *call);

/* Bounded pool: the id @tag holds; IDA_ENOTFOUND if none, IDA_ENOPOOL,
 * IDA_EKIND. Linearizable. A read: @call carries only the error detail. */
IDALLOC_MUST_CHECK int idalloc_lookup(struct idalloc_client *c,
                                      const char *pool,
                                      const char *tag,
                                      uint64_t *id,
                                      struct idalloc_call *call);

struct idalloc_holding
{
    uint64_t id;
    char *tag;
};

/* Bounded pool: holdings in id order, starting after @after_id (or from 0
 * when @has_after is 0), at most @limit (0: server default). *out is an
 * array of *count holdings owned by the caller, released with
 * idalloc_holdings_free(); *more is 1 when another page follows (may be
 * NULL). IDA_ENOPOOL, IDA_EKIND. Linearizable; @call as for lookup. */
IDALLOC_MUST_CHECK int idalloc_list(struct idalloc_client *c,
                                    const char *pool,
                                    int has_after,
                                    uint64_t after_id,
                                    uint32_t limit,
                                    struct idalloc_holding **out,
                                    size_t *count,
                                    int *more,
                                    struct idalloc_call *call);
/* Release what idalloc_list() returned. NULL is ignored. */
void idalloc_holdings_free(struct idalloc_holding *h, size_t count);

/* Sequence pool: reserve @count ids [*first, *first + @count). @count must
 * be in [1, IDALLOC_RESERVE_COUNT_MAX] (else IDA_EINVAL, nothing sent).
 * IDA_EEXHAUSTED (past 2^64), IDA_ENOPOOL, IDA_EKIND. Repeating an UNKNOWN
 * @call returns the block of the first execution. */
IDALLOC_MUST_CHECK int idalloc_reserve(struct idalloc_client *c,
                                       const char *pool,
                                       uint64_t count,
                                       uint64_t *first,
                                       struct idalloc_call *call);

/* Sequence pool: one id, handed out locally from a reserved block. Blocks
 * are refilled in the background with exactly one refill in flight per
 * pool, started before the block runs dry, so callers almost never wait.
 * Errors are those of the refill (reserve), or IDA_ETIMEDOUT when no block
 * came within the call timeout; @call carries only the error detail (a
 * block whose refill ended unknown is skipped, never handed out). */
IDALLOC_MUST_CHECK int idalloc_next(struct idalloc_client *c,
                                    const char *pool,
                                    uint64_t *id,
                                    struct idalloc_call *call);

/* Prefix pool: the prefix for @tag (a new one, or the one it already holds:
 * *existed = 1, may be NULL). @out receives *len bytes (at most 9).
 * IDA_EEXHAUSTED, IDA_ENOPOOL, IDA_EKIND, IDA_EINVAL, IDA_ETOOBIG. */
IDALLOC_MUST_CHECK int idalloc_prefix(struct idalloc_client *c,
                                      const char *pool,
                                      const char *tag,
                                      uint8_t out[9],
                                      size_t *len,
                                      int *existed,
                                      struct idalloc_call *call);

/* --- asynchronous calls ----------------------------------------------------
 *
 * Each operation above that a program issues at a high rate has an _async
 * form beside the blocking one: it checks and copies its arguments, hands
 * the call to the client's I/O thread and returns at once. The call then
 * runs exactly as the blocking one does (the same code: leader hints
 * followed, retries to other nodes with the same request id until the call
 * deadline, call_timeout_ms from the submit; an unknown outcome reported
 * UNKNOWN with its request id kept; the session registered by the first
 * write), and its result goes to a completion callback:
 *
 *     cb(c, call, res, arg)
 *
 * runs exactly once for every call submitted (a submit that returned 0),
 * never within the submitting function. res->error is what the blocking
 * form would have returned; the other fields of @res hold its out values
 * when res->error is 0. @res is valid during the callback only.
 *
 * WHY A CALLBACK (and not a completion queue behind a file descriptor): the
 * I/O thread that read an answer runs its callback at once, with no thread
 * hop, and a callback that submits the next call has it on the wire in the
 * same pass of the loop: that is how `idalloc bench` keeps C calls in
 * flight from one thread. A queue the caller polls costs a wake-up and a
 * system call more per batch, and is a few lines on top of the callback
 * where a program wants its completions on a thread of its own: in a libuv
 * program the callback copies the result into a list guarded by a mutex and
 * calls uv_async_send(); the loop's async callback drains the list (README,
 * "The client library", has the example). The reverse (a callback on top of
 * a queue) would keep the hop.
 *
 * SUBMIT: 0 means submitted. Any other return means nothing was submitted
 * or sent and @cb will not run: IDA_EINVAL or IDA_ETOOBIG (bad arguments,
 * checked here as the blocking form checks them; a call struct IN_FLIGHT),
 * IDA_ELIMIT (IDALLOC_IN_FLIGHT_MAX calls in flight on @c, or the write
 * limits IDALLOC_OUTSTANDING_MAX and IDALLOC_SPAN_MAX; definite, nothing
 * done), IDA_ENOMEM, IDA_EUNAVAIL (@c is being freed), with the detail in
 * @call when it is given (a repeat's struct stays UNKNOWN, a fresh write's
 * is NEW, a read's keeps its state).
 *
 * OWNERSHIP: the arguments (@pool, @tag, @name) are copied at submit: they
 * may be freed or reused as soon as the function returns. @call may be
 * NULL: the callback then gets a struct of the library's, valid during the
 * callback only, and an unknown outcome is given up (LOST) as a blocking
 * call without a call struct does. A caller's @call belongs to the library
 * from the submit (which sets it IN_FLIGHT) until the callback runs: do
 * not read, write or reuse it meanwhile. The callback receives it with its
 * final state (a write: DONE, UNKNOWN, LOST, or NEW for a call that was not
 * carried out; a read: the state it had), error and detail; from then on
 * it is the caller's again: keep it,
 * repeat it (an UNKNOWN call submitted again, blocking or asynchronous,
 * with the same operation and arguments, from the callback or later: the
 * exact repeat of the EXACTLY ONCE section) or release it. @arg is passed
 * through untouched.
 *
 * THREADING: the _async functions may be called from any thread, the
 * callbacks included. The callbacks of a client run on its one I/O thread,
 * one at a time, as the answers arrive (not in submit order). A callback
 * must not block: every other call of the client (answers, timeouts,
 * retries) waits for it. It must not call the blocking functions of the
 * same client (idalloc_next() and idalloc_node_status() included: they
 * return IDA_EINVAL, as they would wait for the thread they run on), nor
 * idalloc_client_free() of its client. It may submit calls, release, format
 * or parse call structs and use other client objects.
 *
 * FREE: idalloc_client_free() completes every call in flight before it
 * returns, each with its callback: a call that was never sent ends
 * IDA_EUNAVAIL (state NEW, nothing done), one that may have reached a node
 * ends IDA_ECLOSED (state UNKNOWN, its request id kept: repeat it on
 * another client object, as another process would, to learn its outcome).
 */

/* The out values of a call, for its callback. */
struct idalloc_result
{
    int error;         /* 0 or IDA_E*: what the blocking form returns */
    uint64_t id;       /* alloc, lookup: the id; reserve: the first id */
    uint64_t count;    /* reserve: ids in the block [id, id + count) */
    int existed;       /* alloc, prefix: the tag already held it */
    int created;       /* pool create: 0 when an identical pool existed */
    int freed;         /* free: 0 when it was already free */
    size_t prefix_len; /* prefix: bytes of prefix (1 to 9) */
    uint8_t prefix[9];
};

/* A completion callback: @call is the struct given at submit (or the
 * library's when that was NULL), @res the result, @arg the submit's. */
typedef void (*idalloc_done_cb)(struct idalloc_client *c,
                                struct idalloc_call *call,
                                const struct idalloc_result *res,
                                void *arg);

/* The asynchronous forms of idalloc_alloc(), idalloc_free(),
 * idalloc_reserve(), idalloc_prefix(), idalloc_lookup() and
 * idalloc_pool_create(): the same arguments (minus the out parameters),
 * the same results in the callback's struct idalloc_result. @cb must not
 * be NULL. Returns 0 (submitted: @cb runs exactly once) or an error
 * (nothing submitted; see SUBMIT above). */
IDALLOC_MUST_CHECK int idalloc_alloc_async(struct idalloc_client *c,
                                           const char *pool,
                                           const char *tag,
                                           struct idalloc_call *call,
                                           idalloc_done_cb cb,
                                           void *arg);
IDALLOC_MUST_CHECK int idalloc_free_async(struct idalloc_client *c,
                                          const char *pool,
                                          uint64_t id,
                                          const char *tag,
                                          struct idalloc_call *call,
                                          idalloc_done_cb cb,
                                          void *arg);
IDALLOC_MUST_CHECK int idalloc_reserve_async(struct idalloc_client *c,
                                             const char *pool,
                                             uint64_t count,
                                             struct idalloc_call *call,
                                             idalloc_done_cb cb,
                                             void *arg);
IDALLOC_MUST_CHECK int idalloc_prefix_async(struct idalloc_client *c,
                                            const char *pool,
                                            const char *tag,
                                            struct idalloc_call *call,
                                            idalloc_done_cb cb,
                                            void *arg);
IDALLOC_MUST_CHECK int idalloc_lookup_async(struct idalloc_client *c,
                                            const char *pool,
                                            const char *tag,
                                            struct idalloc_call *call,
                                            idalloc_done_cb cb,
                                            void *arg);
IDALLOC_MUST_CHECK int idalloc_pool_create_async(struct idalloc_client *c,
                                                 const char *name,
                                                 enum idalloc_pool_kind kind,
                                                 uint64_t size,
                                                 struct idalloc_call *call,
                                                 idalloc_done_cb cb,
                                                 void *arg);

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
/* Status of node @i asked directly, one attempt, no retries: 0, or the
 * error of that node (IDA_EUNAVAIL, IDA_ETIMEDOUT, IDA_EPROTO...).
 * IDA_EINVAL for @i out of range. */
IDALLOC_MUST_CHECK int idalloc_node_status(struct idalloc_client *c,
                                           size_t i,
                                           struct idalloc_node_status *out,
                                           struct idalloc_call *call);

/* --- membership (README, "Runbook") --------------------------------------
 *
 * Served by the leader (the library finds it). The membership names every
 * member with its addresses: a node of any id joins at the addresses
 * `member add` gives it, and a member moves with `member update`. */

#define IDALLOC_MEMBERS_MAX 48

struct idalloc_member
{
    unsigned id;
    uint64_t incarnation; /* its data directory's; 0: not bound */
    char peer_addr[64];   /* from the membership (waiting: as announced) */
    char client_addr[64];
    int voter; /* 1: voter; 0: learner (or waiting) */
    /* 1: not a member with this incarnation: a node that spoke with it (a
     * replaced data directory waiting for re-admission, a removed node, or
     * a node asking to join) */
    int waiting;
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
IDALLOC_MUST_CHECK int idalloc_member_list(struct idalloc_client *c,
                                           struct idalloc_member_list *out,
                                           struct idalloc_call *call);

enum idalloc_member_op {
    IDALLOC_MEMBER_REMOVE = 1,  /* voter or learner @id leaves */
    IDALLOC_MEMBER_ADD = 2,     /* node @id joins as a learner, bound to
                                 * the incarnation it last spoke with;
                                 * promoted automatically once caught up
                                 * when the cluster file says auto_rejoin
                                 * on. Without addresses: at its line of
                                 * the cluster file */
    IDALLOC_MEMBER_PROMOTE = 3, /* caught-up learner @id becomes a voter */
    IDALLOC_MEMBER_UPDATE = 4,  /* member @id is now at new addresses
                                 * (idalloc_member_change_addrs() only) */
};

/* One single-server membership change. Returns 0 once the change
 * committed (*changed = 1), or at once when the membership already is so
 * (*changed = 0; so a retry of a change that committed succeeds); @changed
 * may be NULL. IDA_EREFUSED (definite, nothing changed): the last voter,
 * a node not in the cluster file, a node never heard from (add), a
 * learner not caught up (promote), and so on, with the reason in
 * call->errmsg. Removing the leader hands leadership to a
 * caught-up voter first; the library then retries at the new leader.
 * Another change or a transfer under way (IDA_EBUSY at the leader):
 * retried until the call deadline, then IDA_ETIMEDOUT. IDA_ETIMEDOUT,
 * IDA_ELEADERLOST: outcome unknown; repeating the call is safe (a change
 * already made answers 0 with *changed = 0). */
IDALLOC_MUST_CHECK int idalloc_member_change(struct idalloc_client *c,
                                             enum idalloc_member_op op,
                                             unsigned id,
                                             int *changed,
                                             struct idalloc_call *call);

/* IDALLOC_MEMBER_ADD of node @id at @peer_addr and @client_addr (where it
 * listens for peers and clients: "IPv4:PORT" or "[IPv6]:PORT"), or
 * IDALLOC_MEMBER_UPDATE: member @id is now there (the others dial the new
 * peer address once the change committed). Answers as
 * idalloc_member_change(). IDA_EINVAL (nothing sent) for an address that
 * does not parse, 0.0.0.0 or ::, or the same address twice; IDA_EREFUSED
 * (definite) for an address another member uses, a member added at other
 * addresses than it has (update it instead), an update of a non-member, or
 * addresses other than those node @id says it listens on. */
IDALLOC_MUST_CHECK int idalloc_member_change_addrs(struct idalloc_client *c,
                                                   enum idalloc_member_op op,
                                                   unsigned id,
                                                   const char *peer_addr,
                                                   const char *client_addr,
                                                   int *changed,
                                                   struct idalloc_call *call);

/* Hand leadership to voter @to (0: any caught-up voter). Returns 0 once
 * the old leader stepped down, *leader (may be NULL) the new leader (0 if
 * not known yet); IDA_EREFUSED (definite: @to is not another voter, no
 * voter is caught up, or the transfer did not complete within three
 * election timeouts and the old leader still leads). */
IDALLOC_MUST_CHECK int idalloc_leader_transfer(struct idalloc_client *c,
                                               unsigned to,
                                               unsigned *leader,
                                               struct idalloc_call *call);

/* --- formatting ---------------------------------------------------------- */

#define IDALLOC_HEX_ID_LEN 19 /* "0000-0000-0000-0001" */

/* Format @id as four dash-separated groups of four lowercase hex digits;
 * lexicographic order of the strings equals numeric order of the ids.
 * @buf must hold IDALLOC_HEX_ID_LEN + 1 bytes. */
void idalloc_format_hex(uint64_t id, char *buf);

/* Parse what idalloc_format_hex() wrote. Returns 0 or IDA_EINVAL. */
IDALLOC_MUST_CHECK int idalloc_parse_hex(const char *s, uint64_t *id);

#ifdef __cplusplus
}
#endif

#endif /* IDALLOC_H */
