/* The allocator state machine: pools, sessions, snapshots.
 *
 * DESIGN
 *
 * struct ida_fsm is what the cluster replicates. It is pure and
 * deterministic: no clock, no randomness, no I/O, no threads, no global
 * state. The same committed log gives the same state and the same answers
 * on every replica. It is driven by exactly three kinds of call:
 *
 *   ida_fsm_apply()      one committed log entry (index, type, data);
 *                        answers one result per command of the entry
 *   ida_fsm_lookup/list  reads of committed state (the node calls them after
 *                        a ReadIndex round confirmed the applied index)
 *   ida_fsm_snapshot/restore
 *
 * Pools (by name, at most IDA_POOLS_MAX):
 *   sequence  reserve(n) -> [first, first + n); first block starts at 1 so
 *             0 is never handed out; n in [1, IDA_RESERVE_COUNT_MAX]; a block
 *             that would pass UINT64_MAX is IDA_EEXHAUSTED.
 *   bounded   ids of [0, size), size in [1, UINT64_MAX]. alloc(tag) gives
 *             the lowest free id; a tag that holds an id gets it back
 *             (existed). Lowest-free-first means every held id is below the
 *             number of ids held at once, so ids are stored in 32 bits and a
 *             pool holds at most IDA_BOUNDED_HELD_MAX ids at a time (beyond
 *             that IDA_EEXHAUSTED, whatever the size). Sparse: memory grows
 *             with the highest held id, never with size.
 *   prefix    FoundationDB's high contention allocator:
 *             window start and count, candidates reserved in the window,
 *             windows of 64 / 1024 / 8192 (start < 255 / < 65535 / beyond),
 *             the window advances when half full and the old window's
 *             reservations are dropped. The "random" candidate comes from a
 *             PRNG seeded with (log index, command position in the entry),
 *             so every replica picks the same one. Output: one length byte,
 *             then the minimal big-endian bytes of the candidate (0 is one
 *             byte 0x00). Equal lengths with different bytes and different
 *             length bytes both rule out one prefix being a prefix of
 *             another. alloc(tag) is idempotent per tag.
 *
 * Sessions (Raft dissertation 6.3). Every command carries (client_id,
 * request_seq, ack_below).
 *   - A session exists only once registered: a logged RegisterClient
 *     command. Any other command of a client_id without a session (never
 *     registered, expired, dropped) is never executed: it gets IDA_EEXPIRED,
 *     a definite answer, and changes nothing. Registering an existing
 *     session refreshes it; its answer is not kept.
 *   - ack_below is the client's acknowledgement floor: it no longer needs
 *     the answers of its request_seqs below it. The floor only rises; the
 *     answers below it are dropped and a later command at or below the
 *     highest dropped seq (evicted_below) gets IDA_ESESSION without acting
 *     (the client said it would never ask). ack_below > request_seq is
 *     IDA_EINVAL.
 *   - Every other answer is kept (reply.cached on a replay, nothing acts),
 *     together with a fingerprint of what it was for (operation, pool, tag,
 *     id, count, kind, size: ida__fsm_fingerprint). A replay whose
 *     fingerprint differs gets IDA_EREUSED and changes nothing.
 *   - Bounds: IDA_SESSION_RESULTS_MAX answers above the floor per client and
 *     IDA_RESULTS_TOTAL_MAX in all. A command past either is refused with
 *     IDA_ELIMIT, and that refusal is kept like an answer (so a duplicate of
 *     it never acts later), up to IDA_SESSION_REFUSED_MAX refusals per
 *     client; past that the session is dropped (its later commands get
 *     IDA_EEXPIRED: never executed). A client that keeps its floor current
 *     and settles its unknown calls within IDA_SESSION_RESULTS_MAX writes
 *     (the library refuses a write past IDALLOC_SPAN_MAX, below it) never
 *     meets these bounds.
 *   - Expiry by log time only: "now" is the largest CommandBatch.timestamp_ms
 *     applied so far (the leader's clock; it never goes back here). Before
 *     the commands of a batch run, a session idle for IDA_SESSION_TTL_MS is
 *     dropped.
 *   - No client can evict another's session by registering many: with
 *     IDA_SESSIONS_MAX sessions, a registration drops the least recently
 *     used session only if it was idle for IDA_SESSION_EVICT_IDLE_MS;
 *     otherwise the registration is refused with IDA_ELIMIT. A client with
 *     calls in flight uses its session every few seconds (every attempt
 *     touches it, replays included), far below that idle time. The node
 *     also bounds registrations per connection (src/node/net_conn.c).
 * Session memory grows with use: results are a sorted array that doubles.
 *
 * Entries: ENTRY_NORMAL data is an encoded idalloc.CommandBatch; NOOP and
 * CONFIG entries only advance the applied index. A NORMAL entry whose data
 * does not decode, has an unknown version, or exceeds IDA_BATCH_COMMANDS_MAX
 * commands is a bug or corruption (only the leader writes batches): it is
 * applied as a no-op (applied index advances, nothing else changes, no
 * results) and reported in ida_fsm_applied.entry_error, so every replica,
 * seeing the same bytes, makes the same choice. A single malformed command
 * gets IDA_EINVAL as its result: no op (kept in its session like any
 * answer), or a client_id that is not 16 bytes or request_seq 0 (no
 * session to keep it in).
 *
 * Not thread-safe: one owner (the node's FSM processor) calls everything.
 */
#ifndef IDA_FSM_H
#define IDA_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/types.h"
#include "proto/idalloc.pb-c.h"

/* --- limits (the client library checks the same ones) ------------------ */

/* Pool names: 1..IDA_POOL_NAME_MAX bytes of [A-Za-z0-9._:-]. */
#define IDA_POOL_NAME_MAX 64
/* Tags: 1..IDA_TAG_BYTES_MAX bytes of UTF-8 (base/utf8.h), no NUL byte.
 * Batches of version 1 (written before the UTF-8 rule) are applied as they
 * were: any bytes but NUL. */
#define IDA_TAG_BYTES_MAX 128
/* reserve(n): n in [1, IDA_RESERVE_COUNT_MAX]. */
#define IDA_RESERVE_COUNT_MAX (UINT64_C(1) << 24)
/* list: a limit of 0 means IDA_LIST_LIMIT_DEFAULT; larger than
 * IDA_LIST_LIMIT_MAX is clamped to it. */
#define IDA_LIST_LIMIT_DEFAULT 100
#define IDA_LIST_LIMIT_MAX     1000
#define IDA_POOLS_MAX          4096
/* A bounded pool holds at most this many ids at once (ids fit 32 bits). */
#define IDA_BOUNDED_HELD_MAX UINT64_C(0xFFFFFFFE)
/* A prefix pool hands out at most this many prefixes. */
#define IDA_PREFIX_TAGS_MAX UINT64_C(0xFFFFFFFE)
/* A prefix: length byte + up to 8 value bytes. */
#define IDA_PREFIX_BYTES_MAX 9
#define IDA_CLIENT_ID_BYTES  16
#define IDA_SESSIONS_MAX     65536
/* Answers kept per client above its acknowledgement floor. A call whose
 * outcome stays unknown pins every later answer of its client until it is
 * repeated or released, so this is large. */
#define IDA_SESSION_RESULTS_MAX 65536
/* IDA_ELIMIT refusals kept per client before its session is dropped. */
#define IDA_SESSION_REFUSED_MAX 64
/* Answers kept in all sessions together (64 bytes each: 256 MiB). */
#define IDA_RESULTS_TOTAL_MAX (UINT64_C(1) << 22)
#define IDA_SESSION_TTL_MS    (UINT64_C(60) * 60 * 1000)
/* With the table full, a registration may drop a session idle this long. */
#define IDA_SESSION_EVICT_IDLE_MS (UINT64_C(10) * 60 * 1000)
/* Commands in one CommandBatch. */
#define IDA_BATCH_COMMANDS_MAX 65536
/* FsmState.version understood here, and the CommandBatch.version a leader
 * writes. Version 2 added the UTF-8 rule for tags; batches of version 1
 * are still applied (IDA_BATCH_VERSION_MIN), with the rules they were
 * written under, so a log replayed by a newer build gives the same state. */
#define IDA_FSM_STATE_VERSION 1
#define IDA_BATCH_VERSION     2
#define IDA_BATCH_VERSION_MIN 1

/* --- results ------------------------------------------------------------ */

enum ida_fsm_op {
    IDA_FSM_OP_NONE = 0, /* the command had no op (then error != 0) */
    IDA_FSM_OP_POOL_CREATE,
    IDA_FSM_OP_ALLOC,
    IDA_FSM_OP_FREE,
    IDA_FSM_OP_RESERVE,
    IDA_FSM_OP_PREFIX_ALLOC,
    IDA_FSM_OP_RESTORE,  /* id: the backup's index; count: pools restored */
    IDA_FSM_OP_REGISTER, /* flag = created; never kept in a session */
};

/* The answer to one command. Fields beyond error/error_msg are meaningful
 * only when error == 0, for the op named:
 *   POOL_CREATE  flag = created (false: an identical pool existed)
 *   ALLOC        id, flag = existed
 *   FREE         flag = freed (false: the id was already free)
 *   RESERVE      id = first, count
 *   PREFIX_ALLOC prefix[0..prefix_len), flag = existed
 *   REGISTER     flag = created (false: the session existed) */
struct ida_fsm_result
{
    int error;             /* 0 or an IDA_E* code */
    const char *error_msg; /* static text; "" when error == 0 */
    enum ida_fsm_op op;
    bool flag;
    uint8_t prefix_len;
    uint8_t prefix[IDA_PREFIX_BYTES_MAX];
    uint64_t id;
    uint64_t count;
};

/* One command's answer, for the client that sent it. */
struct ida_fsm_reply
{
    uint8_t client_id[IDA_CLIENT_ID_BYTES]; /* zeros if the id was bad */
    uint64_t request_seq;
    bool cached; /* a retry: this is the kept first answer */
    struct ida_fsm_result result;
};

/* What ida_fsm_apply() did with one entry. */
struct ida_fsm_applied
{
    ida_index index;
    /* 0, or why a NORMAL entry was applied as a no-op: IDA_EPROTO (does not
     * decode), IDA_EVERSION (unknown batch version), IDA_ETOOBIG (more than
     * IDA_BATCH_COMMANDS_MAX commands). The node should log it loudly. */
    int entry_error;
    size_t count; /* replies, one per command in batch order */
    const struct ida_fsm_reply *replies; /* borrowed: valid until the next
                                            call that changes the fsm */
};

/* Holdings returned by ida_fsm_list(). */
struct ida_fsm_holding
{
    uint64_t id;
    const char *tag; /* NUL-terminated, borrowed like replies */
};

struct ida_fsm;

/* --- lifetime ------------------------------------------------------------ */

/* A new, empty state machine (applied index 0). Returns 0 or IDA_ENOMEM. */
int ida_fsm_new(struct ida_fsm **out);
/* Release @f and everything it holds. NULL is ignored. */
void ida_fsm_free(struct ida_fsm *f);
/* Give @dst the whole state of @src (pools, sessions, applied index,
 * clocks) and release its old state together with @src: ownership of @src
 * moves in, the pointer is invalid afterwards. @dst itself (its address)
 * stays valid, and so do the replies of its last ida_fsm_apply(). Nothing
 * is copied or checked: a state that ida_fsm_restore() built in a scratch
 * state machine is swapped in at the cost of freeing the old one. @dst and
 * @src must differ. Cannot fail. */
void ida_fsm_replace(struct ida_fsm *dst, struct ida_fsm *src);

/* --- apply ----------------------------------------------------------------
 *
 * Apply the committed entry @index of @type with @data (@len bytes,
 * borrowed for the call). @index must be ida_fsm_applied_index() + 1.
 * Fills @out (see struct ida_fsm_applied).
 * Returns:
 *   0            applied; the applied index is now @index
 *   IDA_EINVAL   @index is not the next one, or @type is unknown; nothing
 *                changed (a bug in the caller)
 *   IDA_ENOMEM   out of memory part-way: the commands before the failing one
 *                are applied, the failing one is not and the applied index
 *                did not move. The state no longer matches the other
 *                replicas': the node must stop using @f and rebuild it from
 *                a snapshot and the log. (No memory to decode the entry is
 *                also IDA_ENOMEM, never mistaken for a malformed entry.)
 * Decoding uses an arena owned by @f that grows to the largest entry seen
 * and is reused, so steady-state decoding allocates nothing. */
int ida_fsm_apply(struct ida_fsm *f,
                  ida_index index,
                  enum ida_entry_type type,
                  const uint8_t *data,
                  size_t len,
                  struct ida_fsm_applied *out);

/* Called with each entry ida_fsm_apply_entries() applied and what it did
 * (@ap's replies valid until the callback returns). */
typedef void (*ida_fsm_applied_fn)(void *ctx,
                                   const struct ida_entry *e,
                                   const struct ida_fsm_applied *ap);

struct ida_fsm_helper; /* below, with restore, which lends one too */

/* ida_fsm_apply() of the @n consecutive entries @e in order, calling @fn
 * after each (it must not change @e: the helper may be reading it). A run
 * of more than 128 entries is applied a block at a time (128 entries, then
 * twice as many each block up to 1024, or fewer holding 4 MiB), with
 * @helper's thread (NULL: none) decoding the
 * next block's batches and working out their commands (fingerprints, the
 * hashes of client ids and tags, the tags' checks) while the
 * caller applies one: a restarted node's replay of its log, or a new
 * node's after a snapshot (hundreds of thousands of commands at 10 M
 * allocations), is about two fifths decoding. The caller decodes the
 * first block, and any block the helper did not start for. Two blocks'
 * decoded entries are allocated for the call (beside @f's own arena).
 * Stops at the first entry ida_fsm_apply() would not apply, returning its
 * error (and *@done the entries applied before it; the helper is joined
 * first); 0 with *@done = @n otherwise. The same state and answers as
 * ida_fsm_apply() one entry at a time, whichever thread decoded. */
int ida_fsm_apply_entries(struct ida_fsm *f,
                          const struct ida_entry *e,
                          size_t n,
                          const struct ida_fsm_helper *helper,
                          ida_fsm_applied_fn fn,
                          void *ctx,
                          size_t *done);

ida_index ida_fsm_applied_index(const struct ida_fsm *f);
/* The newest CommandBatch timestamp applied (session clock "now"). */
uint64_t ida_fsm_now_ms(const struct ida_fsm *f);
/* Number of pools / live sessions / answers kept in all sessions (for
 * status and tests). */
size_t ida_fsm_pool_count(const struct ida_fsm *f);
size_t ida_fsm_session_count(const struct ida_fsm *f);
uint64_t ida_fsm_results_count(const struct ida_fsm *f);

/* What pool @i (0 <= @i < ida_fsm_pool_count(), in name order) is and how
 * much of it is used (metrics). */
struct ida_fsm_pool_info
{
    const char *name; /* borrowed until the next change of @f */
    Idalloc__PoolKind kind;
    uint64_t size; /* bounded: ids are [0, size) */
    uint64_t used; /* bounded: ids held; prefix: tags held; sequence: the
                      next id a reserve hands out */
};
void ida_fsm_pool_info(const struct ida_fsm *f,
                       size_t i,
                       struct ida_fsm_pool_info *out);

/* --- reads of committed state ---------------------------------------------
 *
 * The id @tag holds in bounded pool @pool. Returns 0, IDA_EINVAL (bad name
 * or tag), IDA_ENOPOOL, IDA_EKIND (not a bounded pool) or IDA_ENOTFOUND. */
int ida_fsm_lookup(const struct ida_fsm *f,
                   const char *pool,
                   const char *tag,
                   uint64_t *id);

/* Holdings of bounded pool @pool in id order: the first ids greater than
 * @after_id (or from 0 when !@has_after), at most @limit of them (0 means
 * IDA_LIST_LIMIT_DEFAULT, clamped to IDA_LIST_LIMIT_MAX). @out must have
 * room for IDA_LIST_LIMIT_MAX. *@more says whether holdings follow the last
 * one returned. Returns 0, IDA_EINVAL, IDA_ENOPOOL or IDA_EKIND. */
int ida_fsm_list(const struct ida_fsm *f,
                 const char *pool,
                 bool has_after,
                 uint64_t after_id,
                 uint32_t limit,
                 struct ida_fsm_holding *out,
                 size_t *count,
                 bool *more);

/* Validity checks of a C string (a tag must also be UTF-8). */
bool ida_fsm_pool_name_valid(const char *name);
bool ida_fsm_tag_valid(const char *tag);

/* A pool name or tag as it arrives (proto `bytes`: @in->len bytes, not
 * NUL-terminated, a NUL byte inside possible), checked and copied into
 * @out as a C string. Returns 0, or IDA_EINVAL (bad pool name; empty tag,
 * tag holding a NUL byte or not UTF-8) or IDA_ETOOBIG (tag longer than
 * IDA_TAG_BYTES_MAX) with *@why set to a static message that says which
 * rule ("tag holds a NUL byte"); on error @out is an empty string. The node
 * checks every request with these before it reaches the log or a read. */
int ida_fsm_pool_name_get(const ProtobufCBinaryData *in,
                          char out[IDA_POOL_NAME_MAX + 1],
                          const char **why);
int ida_fsm_tag_get(const ProtobufCBinaryData *in,
                    char out[IDA_TAG_BYTES_MAX + 1],
                    const char **why);

/* --- snapshots --------------------------------------------------------------
 *
 * Encode the whole state as an idalloc.FsmState into a new buffer (*@data,
 * owned by the caller, release with ida_free()). The same state always
 * gives the same bytes: pools by name, holdings by id, prefix tags by tag
 * bytes, sessions by client_id, each session's results by request_seq.
 * The last field is always FsmState.checksum (a 64-bit hash of the bytes
 * before it), so truncation and damage are detected even where the rest
 * would still parse. Does not change @f. Returns 0 or IDA_ENOMEM. */
int ida_fsm_snapshot(const struct ida_fsm *f, uint8_t **data, size_t *len);

/* The same bytes into a buffer of the caller's: @get(@ctx, total) is
 * called once, with the encoding's size, and returns where to write it
 * (NULL: none, IDA_ENOMEM); *@len is set to that size. The caller owns the
 * buffer either way (a forked child writes its snapshot straight into a
 * shared memory file so, src/node/bgsnap.c). */
int ida_fsm_snapshot_to(const struct ida_fsm *f,
                        uint8_t *(*get)(void *ctx, size_t total),
                        void *ctx,
                        size_t *len);

/* Replace the state of @f with the FsmState in @data (@len bytes, borrowed).
 * Everything is validated (canonical order, ids within pools, tags, prefix
 * encodings, session rules) before @f is touched. Returns 0,
 * IDA_EVERSION (unknown FsmState version), IDA_ECORRUPT (does not decode or
 * breaks an invariant), or IDA_ENOMEM; on error @f is unchanged. */
int ida_fsm_restore(struct ida_fsm *f, const uint8_t *data, size_t len);

/* Seed the new state machine @f (nothing applied, no pools, no sessions)
 * with the pools of a backup's FsmState (@state, @len bytes, borrowed),
 * every sequence pool moved @advance ids on, and have it stand at @index:
 * the state `idallocd --import-backup` gives a new cluster's first node
 * (src/node/import.h). The pools come over exactly as the Restore command
 * brings them (op_restore()); sessions, clock and index stay @f's own.
 * Returns 0, IDA_EINVAL (@f not new, or @index 0), IDA_ECORRUPT (the
 * state does not restore: checksum, version, any rule of
 * ida_fsm_restore()), IDA_EEXHAUSTED (a sequence would pass the end of 64
 * bits) or IDA_ENOMEM; on error @f is unchanged. */
int ida_fsm_import(struct ida_fsm *f,
                   const uint8_t *state,
                   size_t len,
                   uint64_t advance,
                   ida_index index);

/* A second thread lent to ida_fsm_restore_with() and
 * ida_fsm_apply_entries(): the state machine starts none itself (it is
 * pure: no threads, no I/O). @start runs fn(arg) on another thread and
 * returns 0, or returns nonzero having run nothing (the caller then does
 * that work itself); @join returns once the function @start ran has
 * returned. */
struct ida_fsm_helper
{
    int (*start)(void *ctx, void (*fn)(void *arg), void *arg);
    void (*join)(void *ctx);
    void *ctx;
};

/* ida_fsm_restore(), with @helper's thread computing the checksum while
 * decoding starts, then taking half of each phase of loading a large
 * bounded pool (the bulk of a large state; fsm/snap_decode.c): decoding
 * the holdings, grouping their tags by table region, clearing the table,
 * inserting them. @helper is started once for the checksum and once per
 * phase of each such pool. About twice as fast where a second core is
 * free. @helper may be NULL (then it is ida_fsm_restore()). Same result,
 * same validation, same errors: bytes whose checksum does not match are
 * refused whatever they decoded to. */
int ida_fsm_restore_with(struct ida_fsm *f,
                         const uint8_t *data,
                         size_t len,
                         const struct ida_fsm_helper *helper);

/* Decoding a snapshot while it arrives (a leader's InstallSnapshot to a
 * node that fell behind or is new; fsm/snap_ahead.c). The node checks
 * such a snapshot by restoring it, which at ten million allocations took
 * as long as the transfer, and began only once the last byte came. Most
 * of that restore is decoding the holdings of the large bounded pools,
 * which arrive in id order: an ida_fsm_ahead decodes them as the bytes
 * come, and ida_fsm_restore_ahead() then takes those pools as decoded
 * and does the rest as ida_fsm_restore_with() would.
 *
 * It never refuses anything. Bytes it cannot take ahead (not laid out as
 * this encoder writes them, damaged, or out of memory) it leaves to the
 * restore, which decides as it always does: the verdict and the state are
 * those of ida_fsm_restore_with() on the same bytes. It also sums the
 * bytes as the checksum does, so the restore needs no pass of its own over
 * them. A pool decoded ahead costs the restored pool's memory plus its
 * tags' words (8 bytes per holding, up to twice that while their array
 * doubles; grouped by table region from 65536 holdings on, 2 MiB at a
 * time) until it is taken or freed.
 * Not thread-safe: one thread at a time steps it or restores
 * with it (the stream's thread steps, the check restores once it joined
 * that thread). */
struct ida_fsm_ahead;

/* For a snapshot of @len bytes (checksum included): 0 or IDA_ENOMEM. */
int ida_fsm_ahead_new(size_t len, struct ida_fsm_ahead **out);
/* Decode ahead what the snapshot's first @avail bytes, at @data, allow.
 * Each step gets the bytes the steps before it got, and more: the buffer
 * the snapshot arrives in may move (grow) between steps, but its first
 * bytes never change. */
void ida_fsm_ahead_step(struct ida_fsm_ahead *a,
                        const uint8_t *data,
                        size_t avail);
/* Holdings decoded ahead so far, and of those the holdings in pools a
 * restore took as decoded (logs and tests). */
uint64_t ida_fsm_ahead_holdings(const struct ida_fsm_ahead *a);
uint64_t ida_fsm_ahead_taken(const struct ida_fsm_ahead *a);
/* Frees @a and what it decoded and no restore took. NULL is fine. */
void ida_fsm_ahead_free(struct ida_fsm_ahead *a);
/* ida_fsm_restore_with() of @data (@len bytes), taking the pools @a
 * decoded ahead; @a (may be NULL) must have been stepped over these very
 * bytes (their contents; they may sit elsewhere). @a is freed by the
 * caller after. */
int ida_fsm_restore_ahead(struct ida_fsm *f,
                          const uint8_t *data,
                          size_t len,
                          const struct ida_fsm_helper *helper,
                          struct ida_fsm_ahead *a);

/* --- protobuf view of a result ------------------------------------------- */

/* A CommandResult that points into this struct only (no allocation). It is
 * the form the state machine keeps answers in inside its snapshots, and the
 * form the node sends to clients: one conversion for both. */
struct ida_fsm_result_pb
{
    Idalloc__CommandResult msg;
    union {
        Idalloc__PoolCreateResult pool_create;
        Idalloc__AllocResult alloc;
        Idalloc__FreeResult free;
        Idalloc__ReserveResult reserve;
        Idalloc__PrefixResult prefix;
        Idalloc__RestoreResult restore;
        Idalloc__RegisterResult reg;
    } u;
    uint8_t prefix[IDA_PREFIX_BYTES_MAX];
};

/* Fill @pb (caller-owned, may live anywhere) from @r. pb->msg is then ready
 * to pack or to place in a ClientResponse; it is valid while @pb lives. */
void ida_fsm_result_to_pb(const struct ida_fsm_result *r,
                          struct ida_fsm_result_pb *pb);

#endif /* IDA_FSM_H */
