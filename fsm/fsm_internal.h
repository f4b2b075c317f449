/* Internals of fsm/: shared by its .c files. Not for other modules: use
 * fsm/fsm.h.
 *
 * Memory layout of a bounded pool (the 64-bytes-per-tag target):
 *   - a tag record [len][tag bytes][NUL] (len <= 128) sits in the pool's
 *     slab, rounded up to 8 bytes (16 bytes for a 12-byte tag);
 *   - chunks of 4096 ids hold a 4096-bit bitmap and 4096 record pointers
 *     (id -> tag), allocated when the first id of the chunk is taken and
 *     freed when the last one is released;
 *   - a counting tree over chunks (an implicit binary tree of uint32
 *     counts, a counting interval tree with its leaves compressed into the
 *     chunk bitmaps) finds the lowest free id in O(log n);
 *   - the tag -> id index is an open-addressing table of 64-bit slots (32
 *     bits of hash, 32-bit id; no pointers): the key is read back through
 *     id -> tag only when the hash bits match.
 * For a 12-byte tag that is 8 (pointer) + 16 (record) + 11..23 (table at
 * load 0.35..0.7) bytes per held id; bench_fsm measures 37.6 at 10 million
 * (table at load 0.6). */
#ifndef IDA_FSM_INTERNAL_H
#define IDA_FSM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fsm/fsm.h"

/* The 8 bytes at @p as a little-endian word: one load where the machine is
 * little-endian (gcc does not merge the portable byte loop into one). */
static inline uint64_t ida__load_le64(const uint8_t *p)
{
    uint64_t w = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&w, p, 8);
#else
    for (int b = 7; b >= 0; b--) {
        w = (w << 8) | p[b];
    }
#endif
    return w;
}

/* --- error reasons: one static message per failure ----------------------- */

#define IDA__FSM_REASONS(X)                                                    \
    X(IDA__R_OK, 0, "")                                                        \
    X(IDA__R_NO_OP, IDA_EINVAL, "command has no operation")                    \
    X(IDA__R_CLIENT_ID, IDA_EINVAL, "client_id must be 16 bytes")              \
    X(IDA__R_SEQ_ZERO, IDA_EINVAL, "request_seq must be at least 1")           \
    X(IDA__R_SESSION_GONE, IDA_ESESSION,                                       \
      "request_seq is below the client's acknowledgement floor")               \
    X(IDA__R_NO_SESSION, IDA_EEXPIRED,                                         \
      "no session for this client_id (never registered or expired)")           \
    X(IDA__R_SESSION_OVERFLOW, IDA_EEXPIRED,                                   \
      "session dropped: too many refused requests")                            \
    X(IDA__R_REUSED, IDA_EREUSED,                                              \
      "request_seq was used for another operation or arguments")               \
    X(IDA__R_ACK_ABOVE, IDA_EINVAL, "ack_below is above request_seq")          \
    X(IDA__R_RESULTS_MAX, IDA_ELIMIT,                                          \
      "too many answers above the acknowledgement floor for this client")      \
    X(IDA__R_RESULTS_TOTAL, IDA_ELIMIT,                                        \
      "the cluster keeps too many answers; retry later")                       \
    X(IDA__R_SESSIONS_FULL, IDA_ELIMIT,                                        \
      "session table full and no session idle long enough to drop")            \
    X(IDA__R_POOL_NAME, IDA_EINVAL,                                            \
      "pool name must be 1-64 chars of A-Za-z0-9._:-")                         \
    X(IDA__R_NO_POOL, IDA_ENOPOOL, "no pool with this name")                   \
    X(IDA__R_POOL_EXISTS, IDA_EPOOLEXISTS,                                     \
      "a pool with this name exists with another kind or size")                \
    X(IDA__R_POOLS_MAX, IDA_EEXHAUSTED, "too many pools")                      \
    X(IDA__R_KIND_UNKNOWN, IDA_EINVAL, "unknown pool kind")                    \
    X(IDA__R_SIZE_BOUNDED, IDA_EINVAL, "bounded pool size must be at least 1") \
    X(IDA__R_SIZE_OTHER, IDA_EINVAL, "only bounded pools take a size")         \
    X(IDA__R_NOT_BOUNDED, IDA_EKIND, "operation needs a bounded pool")         \
    X(IDA__R_NOT_SEQUENCE, IDA_EKIND, "operation needs a sequence pool")       \
    X(IDA__R_NOT_PREFIX, IDA_EKIND, "operation needs a prefix pool")           \
    X(IDA__R_TAG_EMPTY, IDA_EINVAL, "tag must not be empty")                   \
    X(IDA__R_TAG_LONG, IDA_ETOOBIG, "tag longer than 128 bytes")               \
    X(IDA__R_BOUNDED_FULL, IDA_EEXHAUSTED, "no free id left in the pool")      \
    X(IDA__R_ID_RANGE, IDA_EINVAL, "id is outside the pool")                   \
    X(IDA__R_TAG_MISMATCH, IDA_ETAGMISMATCH, "id is held by another tag")      \
    X(IDA__R_COUNT_ZERO, IDA_EINVAL, "reserve count must be at least 1")       \
    X(IDA__R_COUNT_BIG, IDA_ETOOBIG, "reserve count above 2^24")               \
    X(IDA__R_SEQ_END, IDA_EEXHAUSTED,                                          \
      "sequence would pass the end of 64 bits")                                \
    X(IDA__R_PREFIX_END, IDA_EEXHAUSTED, "prefix space is exhausted")          \
    X(IDA__R_RESTORE_NOT_EMPTY, IDA_EEXIST,                                    \
      "restore needs a cluster without pools")                                 \
    X(IDA__R_RESTORE_BAD, IDA_ECORRUPT, "the backup's state does not restore") \
    X(IDA__R_RESTORE_ADVANCE, IDA_EEXHAUSTED,                                  \
      "advancing would pass the end of a sequence")                            \
    X(IDA__R_TAG_NUL, IDA_EINVAL, "tag holds a NUL byte")                      \
    X(IDA__R_TAG_UTF8, IDA_EINVAL, "tag is not valid UTF-8")

enum ida__fsm_reason {
#define IDA__R_ENUM(name, code, text) name,
    IDA__FSM_REASONS(IDA__R_ENUM)
#undef IDA__R_ENUM
        IDA__R_COUNT_
};

/* Make @r an error result for @reason. */
void ida__fsm_result_error(struct ida_fsm_result *r,
                           enum ida__fsm_reason reason);
/* The reason whose code and text are these, or -1. */
int ida__fsm_reason_find(int code, const char *text);

/* --- tag table: key -> 32-bit ref, keys read back through a callback ----- */

/* The key of @ref: @*len bytes at the returned pointer. */
typedef const uint8_t *(*ida__key_of_fn)(const void *ctx,
                                         uint32_t ref,
                                         size_t *len);

/* A table grows by doubling, but not all at once: a table of millions of
 * keys took 0.4 to 1.1 s to rehash into one twice its size, and the fsm
 * processor, every client behind it, waited that long. Growing allocates
 * the new table and keeps the old one (@old) beside it; each reserve and
 * remove after moves a few of the old table's probe runs into the new one
 * (tagtab.c says why whole runs), until the old is empty and freed. A key
 * is in exactly one of the two; finds look in both. */
struct ida__tagtab
{
    uint64_t *slots; /* hash high 32 bits << 32 | ref + 1; 0 = empty */
    uint64_t cap;    /* power of two, or 0 */
    uint64_t used;   /* keys in both tables */
    uint64_t *old;   /* the table being emptied into @slots, or NULL */
    uint64_t old_cap;
    uint64_t old_used;  /* keys still in @old */
    uint64_t old_from;  /* the empty slot of @old its moving began at */
    uint64_t old_moved; /* slots from there moved or passed (of @old_cap);
                           the next is empty between steps */
    uint64_t old_freed; /* @old's memory up to this slot is given back */
    ida__key_of_fn key_of;
    const void *ctx;
};

#define IDA__REF_NONE UINT32_MAX

uint64_t ida__hash(const uint8_t *key, size_t len);
/* A hash whose values are kept in snapshots: never changes (tagtab.c). */
uint64_t ida__hash_stable(const uint8_t *key, size_t len);
void ida__tagtab_init(struct ida__tagtab *t,
                      ida__key_of_fn key_of,
                      const void *ctx);
void ida__tagtab_close(struct ida__tagtab *t);
/* The ref whose key is @key, or IDA__REF_NONE. */
uint32_t ida__tagtab_find(const struct ida__tagtab *t,
                          const uint8_t *key,
                          size_t len);
/* The same, given @hash == ida__hash(@key, @len) (worked out ahead: struct
 * ida__cmd_pre). */
uint32_t ida__tagtab_find_hashed(const struct ida__tagtab *t,
                                 const uint8_t *key,
                                 size_t len,
                                 uint64_t hash);
/* Make room for one more ref (0 or IDA_ENOMEM; nothing changes on error).
 * Also moves a bounded part of a growing table's old keys (no more than
 * IDA__TAGTAB_STEP slots and the rest of the probe run it ends in). */
int ida__tagtab_reserve(struct ida__tagtab *t);
/* Make room for @n more refs at once (restore knows the count). A growth
 * still moving keys when @n more would not fit finishes at once. */
int ida__tagtab_reserve_n(struct ida__tagtab *t, uint64_t n);
/* True while an old table is being emptied into the new (tests). */
static inline bool ida__tagtab_growing(const struct ida__tagtab *t)
{
    return t->old != NULL;
}
#define IDA__TAGTAB_STEP 16
/* Insert @ref (its key must be readable already and absent). Requires a
 * successful ida__tagtab_reserve() since the last insert. */
void ida__tagtab_insert(struct ida__tagtab *t, uint32_t ref);
/* The same, given @hash == ida__hash() of @ref's key. */
void ida__tagtab_insert_hashed(struct ida__tagtab *t,
                               uint32_t ref,
                               uint64_t hash);
/* Bulk loading, for a restore (tagtab.c explains why). The caller:
 *   1. takes the table's memory as scratch, room for @n keys
 *      (ida__tagtab_bulk_begin(), on an empty table: NULL when out of memory);
 *   2. makes each key's slot word (ida__tagtab_word()) and groups the words
 *      by ida__tagtab_region(), in region order, outside that memory;
 *   3. clears the table (ida__tagtab_bulk_clear(), in ranges, which threads
 *      may share out) once it no longer reads the scratch;
 *   4. inserts the words in region order (ida__tagtab_insert_word_shared(),
 *      a range of regions per thread).
 * The words' keys must be readable by every thread before step 4. The
 * inserts are not counted (ida__bounded_recount() sets t->used). */
#define IDA__TAGTAB_REGIONS_LOG2 12
#define IDA__TAGTAB_REGIONS      (1u << IDA__TAGTAB_REGIONS_LOG2)
uint64_t *ida__tagtab_bulk_begin(struct ida__tagtab *t, uint64_t n);
/* The slot word of @ref, whose key hashes (ida__hash) to @hash. */
uint64_t ida__tagtab_word(uint32_t ref, uint64_t hash);
/* A stored 32-bit hash spread over 64 bits (multiplicative): a table of
 * 2^b slots takes its top b bits as the home, so tables of any size use
 * all of it. */
static inline uint64_t ida__tagtab_spread(uint32_t h32)
{
    return (uint64_t)h32 * UINT64_C(0x9e3779b97f4a7c15);
}
/* Home slot of a stored 32-bit hash in a table of @cap slots (a power of
 * two). */
static inline uint64_t ida__tagtab_home_in(uint64_t cap, uint32_t h32)
{
    return ida__tagtab_spread(h32) >> (64 - __builtin_ctzll(cap));
}
/* Home slot of a stored 32-bit hash in @t's table (cap > 0). */
static inline uint64_t ida__tagtab_home(const struct ida__tagtab *t,
                                        uint32_t h32)
{
    return ida__tagtab_home_in(t->cap, h32);
}
/* Log2 of how many regions the table has: IDA__TAGTAB_REGIONS, or one
 * per slot in a smaller table (cap > 0). */
static inline unsigned ida__tagtab_regions_log2(const struct ida__tagtab *t)
{
    unsigned bits = (unsigned)__builtin_ctzll(t->cap);
    return bits < IDA__TAGTAB_REGIONS_LOG2 ? bits : IDA__TAGTAB_REGIONS_LOG2;
}
static inline unsigned ida__tagtab_regions(const struct ida__tagtab *t)
{
    return 1u << ida__tagtab_regions_log2(t);
}
/* The region of the table (< ida__tagtab_regions()) @word's home lies in;
 * regions follow the slots' order, each cap / regions slots. */
static inline unsigned ida__tagtab_region(const struct ida__tagtab *t,
                                          uint64_t word)
{
    unsigned bits = (unsigned)__builtin_ctzll(t->cap);
    return (unsigned)(ida__tagtab_home(t, (uint32_t)(word >> 32)) >>
                      (bits - ida__tagtab_regions_log2(t)));
}
/* ida__tagtab_region() of @word in any table of IDA__TAGTAB_REGIONS slots
 * or more: then the regions are IDA__TAGTAB_REGIONS, and a word's is the
 * top bits of the product its home takes more bits of, whatever the size.
 * The decoding of a snapshot still arriving groups words by it before the
 * table's size is known. */
static inline unsigned ida__tagtab_region_full(uint64_t word)
{
    return (unsigned)(ida__tagtab_spread((uint32_t)(word >> 32)) >>
                      (64 - IDA__TAGTAB_REGIONS_LOG2));
}
/* Start loading slots [@lo, @hi) into the cache, for writing. */
static inline void ida__tagtab_prefetch_range(const struct ida__tagtab *t,
                                              uint64_t lo,
                                              uint64_t hi)
{
    for (uint64_t i = lo; i < hi; i += 8) { /* 8 slots a cache line */
        __builtin_prefetch(&t->slots[i], 1);
    }
}
/* Zero slots [@lo, @hi). */
void ida__tagtab_bulk_clear(struct ida__tagtab *t, uint64_t lo, uint64_t hi);
/* Insert @word unless an equal key is present already: true when inserted,
 * false when the key was there (nothing changes). The table must have room
 * (ida__tagtab_bulk_begin() sized it; a full table would probe forever).
 * Safe while other threads call it on the same table, provided nothing else
 * touches the table meanwhile and every word's key was made readable to
 * every thread before (restore's threads wrote them before a join): an
 * empty slot is claimed with a compare-and-swap, so two equal keys inserted
 * at once still meet (one claims the slot, the other finds it claimed and
 * compares). */
bool ida__tagtab_insert_word_shared(struct ida__tagtab *t, uint64_t word);
/* Start loading the home slot of @hash into the cache: apply hashes the
 * tags of a batch of commands first, so the table's cache misses of the
 * batch overlap instead of following one another (fsm.c). */
void ida__tagtab_prefetch(const struct ida__tagtab *t, uint64_t hash);
/* Remove @ref (must be present; its key must still be readable). Moves a
 * growing table's old keys as ida__tagtab_reserve() does. */
void ida__tagtab_remove(struct ida__tagtab *t, uint32_t ref);
/* The same, given @hash == ida__hash() of @ref's key. */
void ida__tagtab_remove_hashed(struct ida__tagtab *t,
                               uint32_t ref,
                               uint64_t hash);

/* --- tag records ---------------------------------------------------------- */

/* Tag records [len][bytes][NUL] live in a per-pool slab: size classes of 8
 * bytes, bump allocation from 256 KiB blocks, freed records on a free list
 * per class. A 12-byte tag costs 16 bytes instead of malloc's 32-byte chunk.
 * Freed records are reused by records of the same class; blocks go back to
 * the system when the pool is closed. */
#define IDA__SLAB_CLASSES ((IDA_TAG_BYTES_MAX + 2 + 7) / 8 + 1)

struct ida__slab
{
    uint8_t *free[IDA__SLAB_CLASSES]; /* free lists (next pointer inside) */
    uint8_t *blocks;                  /* list: first 8 bytes = next */
    uint8_t *cur;                     /* bump area of the newest block */
    size_t left;
    size_t nblocks;
    uint8_t *cur_block; /* the block @cur is in, and its size */
    size_t cur_size;
    bool bulk; /* a restore's: its blocks are filled at once (tagtab.c) */
};

void ida__slab_close(struct ida__slab *s);
/* Give @dst the blocks (and records) of @src, which is left empty. @src has
 * never freed a record. */
void ida__slab_merge(struct ida__slab *dst, struct ida__slab *src);
/* A record for @tag (@len in [1, IDA_TAG_BYTES_MAX]); NULL on ENOMEM. */
uint8_t *ida__tagrec_new(struct ida__slab *s, const char *tag, size_t len);
void ida__tagrec_free(struct ida__slab *s, uint8_t *rec);
static inline size_t ida__tagrec_len(const uint8_t *rec)
{
    return rec[0];
}
static inline const char *ida__tagrec_str(const uint8_t *rec)
{
    return (const char *)rec + 1;
}

/* --- bounded pool --------------------------------------------------------- */

#define IDA__CHUNK_SHIFT 12
#define IDA__CHUNK_IDS   (1u << IDA__CHUNK_SHIFT)
#define IDA__CHUNK_WORDS (IDA__CHUNK_IDS / 64)

struct ida__chunk
{
    uint64_t full_words; /* bit w: bits[w] == all ones */
    uint64_t bits[IDA__CHUNK_WORDS];
    uint8_t *tags[IDA__CHUNK_IDS]; /* records, NULL where free */
};

struct ida__bounded
{
    uint64_t size;
    uint64_t held;
    struct ida__chunk **chunks; /* leaves; NULL = empty chunk */
    uint64_t leaves;            /* power of two or 0: chunks[] length */
    uint32_t *tree;             /* counts; tree[1] root, leaf i at leaves+i */
    struct ida__tagtab tab;     /* tag -> id */
    struct ida__slab slab;      /* tag records */
};

void ida__bounded_init(struct ida__bounded *b, uint64_t size);
void ida__bounded_close(struct ida__bounded *b);
/* alloc/free/lookup as in fsm.h, @hash being ida__hash(@tag, @len). Return
 * an enum ida__fsm_reason (IDA__R_OK) or -IDA_ENOMEM. Nothing changes unless
 * IDA__R_OK is returned. */
int ida__bounded_alloc(struct ida__bounded *b,
                       const char *tag,
                       size_t len,
                       uint64_t hash,
                       uint64_t *id,
                       bool *existed);
int ida__bounded_free(struct ida__bounded *b,
                      uint64_t id,
                      const char *tag,
                      size_t len,
                      uint64_t hash,
                      bool *freed);
/* The id of @tag or IDA__REF_NONE. */
uint32_t ida__bounded_find(const struct ida__bounded *b,
                           const char *tag,
                           size_t len);
/* The first held id >= @from, or UINT64_MAX when none. */
uint64_t ida__bounded_next_held(const struct ida__bounded *b, uint64_t from);
/* The record of held id @id (must be held). */
const uint8_t *ida__bounded_tag(const struct ida__bounded *b, uint64_t id);
/* Restore's bulk path (snap_decode.c). ida__bounded_prepare() indexes the
 * chunks up to the one of @id (< size; the highest to come) and allocates
 * that one: 0 or IDA_ENOMEM. ida__bounded_fill() then marks free id @id
 * held by @rec, allocating its chunk (0 or IDA_ENOMEM), without the count
 * tree or the held count: threads may fill ids of distinct chunks at once.
 * ida__bounded_recount() then sums the tree, the held count and the tag
 * table's count from the chunks (every held id's tag inserted). */
int ida__bounded_prepare(struct ida__bounded *b, uint64_t id);
int ida__bounded_fill(struct ida__bounded *b, uint64_t id, uint8_t *rec);
void ida__bounded_recount(struct ida__bounded *b);
/* The lowest free id (may be >= size). */
uint64_t ida__bounded_lowest_free(const struct ida__bounded *b);

/* snap_ahead.c, for the restore: the bounded pool decoded ahead from the
 * Pool message at bytes [@at, @end) of the snapshot, its BoundedState at
 * @b_at, if @a has one: finished as the restore would (the phases after
 * DECODE, with @helper, then the count tree) and handed over (its name
 * unset), *@rv the verdict. NULL when none was decoded there. */
struct ida__pool *ida__ahead_take(struct ida_fsm_ahead *a,
                                  size_t at,
                                  size_t end,
                                  size_t b_at,
                                  const struct ida_fsm_helper *helper,
                                  int *rv);
/* snap_ahead.c, for the restore: true with *@sum the checksum of the
 * snapshot's bytes before its checksum field (ida__snapshot_checksum())
 * when @a (may be NULL), made for @len bytes, was stepped over all of
 * them; else false (the restore computes it). */
bool ida__ahead_sum(const struct ida_fsm_ahead *a, size_t len, uint64_t *sum);

/* --- prefix pool ---------------------------------------------------------- */

#define IDA__WINDOW_MAX 8192

struct ida__prefix
{
    uint64_t start;                          /* window start */
    uint64_t count;                          /* reserved in window */
    uint64_t reserved[IDA__WINDOW_MAX / 64]; /* bit: start + i taken */
    uint64_t *values;                        /* ref -> candidate */
    uint8_t **tags;                          /* ref -> record */
    uint32_t n, cap;
    struct ida__tagtab tab; /* tag -> ref */
    struct ida__slab slab;  /* tag records */
};

uint64_t ida__prefix_window(uint64_t start);
/* Encode @v: length byte then minimal big-endian bytes. Returns length. */
size_t ida__prefix_encode(uint64_t v, uint8_t out[IDA_PREFIX_BYTES_MAX]);
/* Decode a canonical encoding of exactly @len bytes: 0 or -1. */
int ida__prefix_decode(const uint8_t *p, size_t len, uint64_t *v);

void ida__prefix_init(struct ida__prefix *p);
void ida__prefix_close(struct ida__prefix *p);
/* Allocate for @tag with PRNG seed @seed. Reason or -IDA_ENOMEM. */
int ida__prefix_alloc(struct ida__prefix *p,
                      const char *tag,
                      size_t len,
                      uint64_t seed,
                      uint64_t *value,
                      bool *existed);
/* Append a (record, value) during restore: 0 or -IDA_ENOMEM. */
int ida__prefix_put(struct ida__prefix *p, uint8_t *rec, uint64_t value);

/* --- pools and sessions --------------------------------------------------- */

struct ida__pool
{
    char name[IDA_POOL_NAME_MAX + 1];
    Idalloc__PoolKind kind;
    union {
        uint64_t seq_next; /* sequence: the next first */
        struct ida__bounded bounded;
        struct ida__prefix prefix;
    } u;
};

struct ida__cached
{
    uint64_t seq;
    uint64_t fingerprint; /* ida__fsm_fingerprint() of the command */
    struct ida_fsm_result result;
};

struct ida__session
{
    uint8_t client_id[IDA_CLIENT_ID_BYTES];
    uint64_t last_active_ms;
    uint64_t rank;          /* session clock at last use */
    uint64_t evicted_below; /* highest request_seq dropped from results */
    struct ida__session *prev, *next; /* LRU list, oldest first */
    uint32_t ref;                     /* index in ida_fsm.sess_refs */
    uint32_t n;                       /* results[0..n), sorted by seq */
    uint32_t n_refused;               /* of which IDA_ELIMIT refusals */
    /* The results live in base[0..cap), from results on: an ack drops
     * those below it by moving results up, not by moving the rest down
     * (a client with many calls in flight acks on every command; moving
     * them all each time was a sixth of a replay's time). Room is made at
     * the end when it runs out (ida__session_reserve()). */
    struct ida__cached *results;
    struct ida__cached *base; /* the allocation, NULL when none */
    uint32_t cap;
};

/* Results that can still be kept after results[n - 1]. */
static inline uint32_t ida__session_room(const struct ida__session *s)
{
    return s->base == NULL ? 0
                           : s->cap - (uint32_t)(s->results - s->base) - s->n;
}

/* Answers that count against the bounds: kept, not refusals. */
static inline uint32_t ida__session_answers(const struct ida__session *s)
{
    return s->n - s->n_refused;
}

/* Bump-allocated memory for decoding one entry (protobuf-c allocator):
 * reset per entry, coalesced into one block, so steady-state decoding does
 * not call malloc at all. */
struct ida__arena_block
{
    struct ida__arena_block *next;
    size_t cap, used;
    _Alignas(16) uint8_t data[];
};

struct ida__arena
{
    struct ida__arena_block *head;
    bool failed; /* an allocation failed since the last reset */
};

/* What a command's own bytes decide, worked out before it is applied: on
 * the lent thread of ida_fsm_apply_entries() (apply_ahead.c) while the
 * entries before it are applied, or for a whole batch before its first
 * command (apply_batch()). Each is a pure function of the command and its
 * batch's version, so wherever it is computed the answers are the same; and
 * each is computed once (an alloc hashed its tag three times: for the
 * prefetch, the lookup and the insert). */
struct ida__cmd_pre
{
    uint64_t fp;          /* ida__fsm_fingerprint() */
    uint64_t client_hash; /* ida__hash() of the client id */
    uint64_t tag_hash;    /* ida__hash() of an alloc's or a free's tag */
    int tag_check;        /* that tag's check (IDA__R_OK or the reason) */
};

struct ida_fsm
{
    ida_index applied_index;
    uint64_t now_ms;
    uint64_t session_clock;

    struct ida__pool **pools; /* sorted by name */
    size_t pool_count, pool_cap;
    /* The pool the last command found by name, and its name's length: the
     * commands of a batch nearly always name one pool. A pool, once made,
     * lives as long as its state machine (a restore command replaces the
     * pools only of a state without any), so this never dangles. */
    struct ida__pool *last_pool;
    size_t last_pool_len;

    struct ida__session **sess_refs; /* ref -> session, NULL = free ref */
    uint32_t sess_ref_cap;
    uint32_t *sess_free; /* stack of free refs */
    uint32_t sess_free_count;
    size_t session_count;
    uint64_t results_total; /* answers (not refusals) kept in all sessions */
    struct ida__session *lru_head, *lru_tail;
    struct ida__tagtab sessions; /* client_id -> ref */

    struct ida_fsm_reply *replies; /* last apply's answers */
    size_t replies_cap;
    struct ida__cmd_pre *pre; /* a batch's commands worked out ahead, when
                                 its caller did not (apply_batch()) */
    size_t pre_cap;

    struct ida__arena arena; /* decode memory of the current entry */
};

/* Pools. */
struct ida__pool *ida__fsm_pool_find(const struct ida_fsm *f, const char *name);
void ida__pool_free(struct ida__pool *p);
/* Insert @p (name absent) keeping order: 0 or IDA_ENOMEM. */
int ida__fsm_pool_insert(struct ida_fsm *f, struct ida__pool *p);

/* Sessions. */
struct ida__session *ida__session_find(const struct ida_fsm *f,
                                       const uint8_t *client_id);
/* The same, given @hash == ida__hash() of the client id. */
struct ida__session *ida__session_find_hashed(const struct ida_fsm *f,
                                              const uint8_t *client_id,
                                              uint64_t hash);
/* Add a new session (absent, table not full): NULL on ENOMEM. */
struct ida__session *ida__session_add(struct ida_fsm *f,
                                      const uint8_t *client_id);
/* Put @s last in LRU order (its rank is the largest). */
void ida__session_touch(struct ida_fsm *f, struct ida__session *s);
/* Drop @s: out of the table and the LRU list, freed. */
void ida__session_drop(struct ida_fsm *f, struct ida__session *s);
/* Drop sessions idle for IDA_SESSION_TTL_MS of f->now_ms. */
void ida__sessions_expire(struct ida_fsm *f);
/* The result kept in @s for @seq, or NULL. */
const struct ida__cached *ida__session_lookup(const struct ida__session *s,
                                              uint64_t seq);
/* Room for one more result in @s: 0 or IDA_ENOMEM (nothing changed). */
int ida__session_reserve(struct ida__session *s);
/* Keep @r for @seq (absent from @s, above evicted_below) with @fingerprint.
 * Requires a successful ida__session_reserve(). */
void ida__session_keep(struct ida_fsm *f,
                       struct ida__session *s,
                       uint64_t seq,
                       uint64_t fingerprint,
                       const struct ida_fsm_result *r);
/* Raise @s's acknowledgement floor to @ack_below: drop the results below it
 * and remember the highest seq dropped. A lower floor changes nothing. */
void ida__session_ack(struct ida_fsm *f,
                      struct ida__session *s,
                      uint64_t ack_below);
/* What a command is for: a hash of its operation and arguments. */
uint64_t ida__fsm_fingerprint(const Idalloc__Command *c);
/* Its first step, the hash of the operation @op alone. */
uint64_t ida__fsm_fingerprint_start(int op);

/* The key callback for the sessions table. */
const uint8_t *ida__session_key(const void *ctx, uint32_t ref, size_t *len);

/* Decode arena (struct ida__arena above): a protobuf-c allocator whose
 * data is the struct ida__arena. */
void *ida__arena_alloc(void *data, size_t size);
void ida__arena_free(void *data, void *ptr);
/* Free all blocks. */
void ida__arena_release(struct ida__arena *a);
/* Empty the arena before decoding the next entry. */
void ida__arena_reset(struct ida__arena *a);

/* Log entries (fsm/batch.c). idalloc__command_batch__unpack() into the
 * arena @a, the simple case read by hand: the same batch or the same NULL
 * (with a->failed set when memory ran out; it stays set until a reset, or
 * until the caller clears it). Pure: any thread may decode into an arena
 * of its own. */
Idalloc__CommandBatch *ida__batch_unpack(struct ida__arena *a,
                                         const uint8_t *data,
                                         size_t len);
/* The hand reader alone: 0 with *@out (what protobuf-c would build), 1 if
 * the bytes are not the simple case (nothing judged), -IDA_ENOMEM. */
int ida__batch_decode_simple(struct ida__arena *a,
                             const uint8_t *data,
                             size_t len,
                             Idalloc__CommandBatch **out);

/* ida_fsm_apply() of an entry decoded already (into an arena of the
 * caller's: @b, or NULL with @out_of_memory when the decoding ran out of
 * memory, NULL without it when the bytes do not decode; anything for a
 * type other than NORMAL), with its commands worked out ahead (@pre, one
 * per command, ida__fsm_pre()) or NULL to work them out here. */
int ida__fsm_apply_decoded(struct ida_fsm *f,
                           ida_index index,
                           enum ida_entry_type type,
                           const Idalloc__CommandBatch *b,
                           bool out_of_memory,
                           const struct ida__cmd_pre *pre,
                           struct ida_fsm_applied *out);
/* Work out command @c of a batch of version @version (struct
 * ida__cmd_pre). */
void ida__fsm_pre(const Idalloc__Command *c,
                  uint32_t version,
                  struct ida__cmd_pre *out);

/* --- snapshots ---------------------------------------------------------- */

/* The hash stored as FsmState.checksum over the @len bytes before it. */
uint64_t ida__snapshot_checksum(const uint8_t *p, size_t len);
/* The same hash a piece at a time, for bytes that arrive in order
 * (snap_ahead.c): ida__snapshot_checksum(p, len) is
 *   ida__sum_end(ida__sum_words(ida__sum_begin(len), p, len / 8),
 *                p + len / 8 * 8, len % 8),
 * and ida__sum_words() of w1 + w2 words is ida__sum_words() of w1 words,
 * then of the w2 after them. */
uint64_t ida__sum_begin(size_t len);
uint64_t ida__sum_words(uint64_t h, const uint8_t *p, size_t words);
uint64_t ida__sum_end(uint64_t h, const uint8_t *p, size_t n);

#endif /* IDA_FSM_INTERNAL_H */
