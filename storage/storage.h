/* Storage: everything a node must not forget: one LMDB environment and
 * the Raft log's entries in segment files beside it.
 *
 * DESIGN
 *
 * One directory per node (data_dir/nodeN) holding data.mdb (LMDB), the
 * file IDENTITY and the directory log/ (the entry log, below). The
 * environment holds two named databases:
 *
 *   meta  "format"     format version of the directory (4)
 *         "identity"   cluster name, node id, incarnation id and creation
 *                      time (unix ms), written on first start
 *         "hard_state" term, vote, and a commit index known durable
 *                      (struct ida_hard_state; the log holds the latest)
 *         "log_prev"   index and term of the entry just before the first one
 *                      kept (both 0 until the log is first compacted)
 *         "log_lsn"    an LSN of the entry log known durable (below)
 *         "snapshot"   the latest durable snapshot's meta (absent: none)
 *         "boot", "untrusted", "membership0" (below)
 *   snap  key: snapshot id and chunk number, 8 + 8 bytes big-endian;
 *         value: CRC-32C + at most the snapshot's chunk size of state bytes
 *                (IDA_STORAGE_CHUNK_BYTES; 64 KiB in snapshots of before
 *                format 3)
 *
 * Every record is a fixed binary layout with explicit big-endian integers and
 * a CRC-32C (storage/record.h): the records are tiny, so a hand-written
 * layout is simpler to check than protobuf and a torn or foreign value is
 * caught by its checksum and exact length.
 *
 * THE LOG
 *
 * The entries live in log/, an entry log (storage/entlog.h) over a
 * segment log (storage/seglog.h): each batch is one record (or a few, of
 * about 1 MiB each) and one fdatasync of a file already written full, one
 * device flush, against an LMDB commit's two (docs/DESIGN.md, "Group
 * commit and flushes"). A record carries the batch's truncation, entries
 * and commit index; the open log is indexed in memory (32 bytes an entry),
 * so terms are answered without a read and entries read back with one.
 * Segments are IDA_STORAGE_SEGMENT_BYTES_DEFAULT (65 MiB) each, written
 * full of zeros before use (the next ahead: ida_storage_log_prepare());
 * an open starts appends in a new one of 1 MiB.
 *
 * The term and vote stay in LMDB: a batch that changes them commits there
 * first, then writes its entries (a restart never finds entries of a term
 * it does not hold). So a batch is one flush, or one LMDB commit and one
 * flush at an election, or when it carries snapshot bytes. Compaction
 * records the new log_prev in LMDB, then releases the segments it no
 * longer needs; a compaction that drops the whole log (Raft's Figure 13)
 * writes its reset into the log first, and an open that finds a reset
 * beyond LMDB's log_prev, naming the durable snapshot, takes it. Every
 * LMDB commit of a batch and every open record the log's durable LSN
 * ("log_lsn"): an open that recovers less of the log (segments removed
 * or put back older) refuses the directory (IDA_ECORRUPT), and a log/
 * missing where one was made is IDA_ELOSTSTATE.
 *
 * Format 3 and before kept the entries in a third database, "log" (key:
 * index, 8 bytes big-endian; value: a 24-byte header and the data). Open
 * moves them into a new log/ once, durably, then drops "log" and writes
 * format 4 in one commit; a move cut short leaves format 3 and is done
 * again (a log/ of format 3 is the unfinished move's and is removed).
 *
 * Group commit: a batch (truncate a suffix, append entries, set the hard
 * state) is recorded in a caller-owned struct ida_storage_batch and then
 * executed by ida_storage_batch_commit(): its entries and commit index as
 * records of the entry log and one flush, its term and vote (when they
 * change) and snapshot bytes as ONE LMDB write transaction with ONE durable
 * commit (LMDB's default: the data pages and the meta page are both
 * fdatasync'ed before mdb_txn_commit() returns). The environment is opened
 * without MDB_NOSYNC, MDB_NOMETASYNC or MDB_WRITEMAP. The only flag used is
 * MDB_NOTLS, which ties a read transaction's reader slot to the transaction
 * instead of the thread: our read transactions never outlive one call, and
 * the node's worker threads may come and go, so slots are released at once.
 * It does not touch durability.
 *
 * Because a batch is only executed at commit time, an LMDB commit that hits
 * MDB_MAP_FULL is aborted (nothing written), the map is doubled (up to
 * map_size_max_bytes) and the whole batch is replayed. At the maximum the
 * commit fails with IDA_ENOSPC and nothing of the batch is stored; this is not
 * sticky (compaction frees pages). Any other failure of a commit (I/O error,
 * disk full while writing, failed fsync) makes the storage sticky-failed:
 * every later write answers the same code, because after a failed fsync the
 * state of the file is unknown and must not be acknowledged. The node must
 * stop acknowledging writes and restart.
 *
 * A failed write or flush of the entry log is sticky the same way.
 *
 * IDENTITY AND DAMAGE
 *
 * A directory is created with a random 64-bit nonzero incarnation id
 * (getrandom(2)). Besides the identity record inside LMDB, the same identity
 * is kept in the small file IDENTITY next to data.mdb (format, cluster, node
 * id, incarnation, creation time, CRC-32C; storage/record.h). It is written
 * once, atomically (temporary file, fsync, rename, fsync of the directory),
 * right after the first commit of a new environment, and never rewritten.
 * It lets open tell a database that lost its state from a new directory:
 *
 *   IDENTITY  data.mdb                        open
 *   absent    absent, 0 bytes or no commit    creates a new incarnation
 *   absent    format 1 identity               upgrades in place: mints an
 *                                             incarnation for it (the genuine
 *                                             old state), writes format 3,
 *                                             then IDENTITY
 *   absent    format 2 identity               writes IDENTITY from it (a
 *                                             first start killed before)
 *   either    format 2 (the identity checked  writes format 3 (nothing else
 *             as for format 3)                changes; a format-2 program
 *                                             then refuses it as newer)
 *   either    format 1 to 3                   then moves the log into log/
 *                                             and writes format 4 (THE LOG)
 *   present   absent, 0 bytes, no identity,   IDA_ELOSTSTATE: the node must
 *             or another incarnation, node    not rejoin as its old self;
 *             or cluster                      nothing is written
 *   either    format 4 and log/ missing       IDA_ELOSTSTATE, unless nothing
 *             (absent IDENTITY: with a        was ever logged (a first start
 *             log_lsn recorded)               killed before log/ was made)
 *   foreign or damaged                        IDA_EFOREIGN / IDA_ECORRUPT
 *
 * IDENTITY is written after the first commit, not before the environment is
 * created, so that a first start killed at any point leaves a directory the
 * next open completes rather than refuses. A directory that lost IDENTITY
 * and data.mdb together looks new and is created again as a new
 * incarnation.
 *
 * Before LMDB maps data.mdb, open reads its two meta pages with read(2):
 * the file must be whole pages, at least two, both meta pages must carry
 * LMDB's magic, data version, page header and page size, the newer one
 * (which LMDB opens) must name root pages inside the file, and both hold
 * consecutive transaction ids (LMDB writes transaction N to meta page N % 2 and
 * opens the one with the higher id, so a damaged older page could silently roll
 * back the last commit). Anything else is IDA_ECORRUPT with one line. The last
 * page a meta page names may lie past the end of the file: LMDB never writes a
 * page that the transaction which allocated it also freed, and a healthy file,
 * committed and closed cleanly, ends short of such a page now and then (this
 * check once refused it as truncated: tests/storage/test_storage_identity.c).
 * For such a file, open walks with plain reads every B-tree the newer meta
 * page reaches (storage/pages.c) and refuses it only when a page in use
 * lies past the end (LMDB would stop the process with SIGBUS reading it)
 * or a page is not what its parent says.
 *
 * Not detectable here: a copy of the whole directory taken earlier and put
 * back (a rollback) is self-consistent, IDENTITY included. Storage counts
 * every start in a "boot" record (ida_storage_boot()) so that the peers,
 * which remember what the node told them, can tell it that it went back
 * (raft/admission.h, rule A4); the node then marks the directory untrusted
 * (ida_storage_mark_untrusted()) and every later open refuses it.
 *
 * THREADING
 *
 * One thread at a time owns the storage: the thread that opened it, then the
 * one storage-processor thread it is handed to. Only the owner calls the
 * functions below, never two at once. Every transaction, read or write, lives
 * inside one call, so the owner may move between threads between calls, and
 * the map can grow inside a write (LMDB resizes only with no transaction
 * active in the process).
 *
 * No transaction is ever held across a call, so none is held across network
 * I/O. The environment must not cross fork(): every call asserts it runs in
 * the process that opened it. A directory may be open only once per process
 * (LMDB's locks are per process; a second open is refused).
 */
#ifndef IDA_STORAGE_H
#define IDA_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/types.h"

/* The on-disk format this code writes (and reads, with 1 to 3, moving
 * their log out of LMDB). Format 3 is format 2 with snapshot records that
 * name their chunk size (record.h): a program that reads format 2 would
 * take one for damage. Format 4 keeps the log in log/ (THE LOG). */
#define IDA_STORAGE_FORMAT_VERSION 4
/* The entry log's directory, inside the storage directory. */
#define IDA_STORAGE_LOG_DIR "log"
/* The entry log's segments: the largest entry (IDA_STORAGE_ENTRY_BYTES_MAX)
 * and its record's headers fit one. */
#define IDA_STORAGE_SEGMENT_BYTES_DEFAULT ((64u << 20) + (1u << 20))
/* The file holding the directory's identity, and its temporary name. */
#define IDA_STORAGE_IDENTITY_FILE "IDENTITY"
#define IDA_STORAGE_IDENTITY_TMP  "IDENTITY.tmp"
/* Snapshot state bytes are stored in values of at most this size: small
 * enough for LMDB to keep them in its leaf pages (with 4 KiB pages a value
 * of up to ~2,010 bytes next to a 16-byte key, two to a page). Larger
 * values take runs of consecutive pages, and once the file's free space is
 * fragmented (a replaced snapshot's pages among log pages) LMDB searches
 * and rewrites its whole free list for each run: at 10 M allocations a
 * commit that wrote 256 KiB in 64 KiB values (the size before, still read:
 * record.h, "IDAS") took 12.4 ms against 1.2 ms in these. */
#define IDA_STORAGE_CHUNK_BYTES 2000u
/* Largest entry data accepted (the peer frame maximum). */
#define IDA_STORAGE_ENTRY_BYTES_MAX (64u << 20)
/* Append calls one batch may hold. */
#define IDA_STORAGE_BATCH_SPANS_MAX 16
/* Largest opaque cluster configuration in a snapshot meta. */
#define IDA_STORAGE_CONFIG_BYTES_MAX (1u << 20)
#define IDA_STORAGE_ERRMSG_MAX       512
#define IDA_STORAGE_CLUSTER_MAX      64

#define IDA_STORAGE_MAP_SIZE_DEFAULT     (64ull << 20)
#define IDA_STORAGE_MAP_SIZE_MAX_DEFAULT (64ull << 30)

struct ida_storage_opts
{
    const char *cluster;         /* 1..IDA_STORAGE_CLUSTER_MAX bytes */
    ida_node_id node_id;         /* nonzero */
    uint64_t map_size_bytes;     /* initial map; 0: default (64 MiB) */
    uint64_t map_size_max_bytes; /* growth limit; 0: default (64 GiB) */
    size_t log_segment_bytes;    /* entry log segments: a multiple of 4096
                                    from 64 KiB to 1 GiB; 0: default
                                    (IDA_STORAGE_SEGMENT_BYTES_DEFAULT).
                                    Entries above about this size are
                                    refused (IDA_ETOOBIG) */
};

/* Bounds of the log. The log holds entries [first, last]; it is empty when
 * last == prev_index (then first == last + 1). prev_index/prev_term name the
 * entry just before first (compacted into a snapshot), 0/0 before any
 * compaction; last_term is the term of the last entry, or prev_term. */
struct ida_storage_log_state
{
    ida_index first;
    ida_index last;
    ida_term last_term;
    ida_index prev_index;
    ida_term prev_term;
};

/* A durable snapshot. @id names this snapshot's chunks (a new snapshot gets a
 * new id), so a chunked read (ida_storage_snapshot_read()) can tell when the
 * snapshot it was reading has been replaced. */
struct ida_snapshot_meta
{
    uint64_t id;
    ida_index index;
    ida_term term;
    uint8_t *config; /* opaque (an encoded idalloc.ClusterConfig) */
    size_t config_len;
    uint64_t data_size;
    uint32_t data_crc32c;
};

/* A group-commit batch: filled by the owner with the calls below, executed
 * by ida_storage_batch_commit(). Caller-allocated; contents private. Entry
 * arrays passed to ida_storage_batch_append() are borrowed until the commit
 * (or ida_storage_batch_init()) returns. */
struct ida_storage_batch
{
    int has_truncate;
    ida_index truncate_from;
    struct
    {
        const struct ida_entry *entries;
        size_t count;
    } spans[IDA_STORAGE_BATCH_SPANS_MAX];
    size_t span_count;
    int has_hard_state;
    struct ida_hard_state hard_state;
    /* Snapshot bytes stored with the batch (ida_storage_batch_snapshot()). */
    struct ida_snapshot_writer *snap_w;
    const uint8_t *snap_data;
    size_t snap_len;
    /* The log as it will be once the batch is executed. */
    ida_index last;
    ida_term last_term;
};

/* Writes a snapshot's state in chunks (owner only). Private fields. */
struct ida_snapshot_writer
{
    uint64_t id;
    ida_index index;
    ida_term term;
    uint8_t *config;
    size_t config_len;
    uint8_t *buf; /* IDA_STORAGE_CHUNK_BYTES: the chunk being filled */
    size_t buf_len;
    uint64_t chunk_count; /* chunks stored so far */
    uint64_t size;        /* bytes written so far */
    uint32_t crc;         /* CRC-32C of those bytes */
};

/* Who a storage directory is (filled by ida_storage_open()). */
struct ida_storage_identity
{
    char cluster[IDA_STORAGE_CLUSTER_MAX + 1];
    ida_node_id node_id;
    uint64_t incarnation;   /* random, nonzero, fixed at creation */
    uint64_t created_at_ms; /* unix ms of creation (of the upgrade from
                               format 1 for an upgraded directory) */
    int created;            /* this open created the directory */
    uint32_t upgraded_from; /* 0, or the format this open upgraded from
                               (the caller logs it) */
};

struct ida_entlog;

struct ida_storage
{
    struct ida_storage_identity identity;
    void *env;               /* MDB_env */
    struct ida_entlog *elog; /* the entries (log/) */
    int lmdb_log;            /* the "log" database holds them (format < 4,
                                during open only) */
    size_t log_segment_bytes;
    uint64_t log_lsn; /* the entry log's LSN LMDB last recorded */
    unsigned dbi_meta, dbi_log, dbi_snap;
    char *dir;
    uint64_t dir_dev, dir_ino; /* identify the directory for the registry */
    long pid;                  /* the process that opened it */
    uint64_t map_size_bytes;
    uint64_t map_size_max_bytes;
    uint64_t release_at;    /* ida_storage_release_pages()'s cursor */
    char *map_base;         /* where data.mdb is mapped (NULL: unknown), */
    uint64_t map_base_size; /* for a map of this size */
    /* Owner's cache of what is durable; readers use read transactions. */
    struct ida_storage_log_state log;
    struct ida_hard_state hard_state;
    int has_snapshot;
    uint64_t snapshot_id;
    ida_index snapshot_index;
    ida_term snapshot_term;
    uint64_t snapshot_size; /* its state's bytes */
    uint64_t next_snapshot_id;
    uint64_t replaced_id; /* chunks left for ida_storage_snapshot_tidy() */
    int writer_active;
    uint64_t boot; /* this start's boot id (ida_storage_boot()) */
    int failed;    /* sticky error code, 0 while healthy */
    int refused;   /* code of a check that refused the current write */
    /* Fault injection for tests (ida__storage_fault_set). */
    int fault_put_after;
    int fault_commit_after;
    int fault_code;
    char errmsg[IDA_STORAGE_ERRMSG_MAX];
};

/* --- open and close (owner) --- */

/* Open (creating on first start) the storage in directory @dir. A missing
 * @dir is created (with its parents). A new environment is created only in
 * an empty directory; it records @o->cluster, @o->node_id and
 * IDA_STORAGE_FORMAT_VERSION durably before returning. An existing one must
 * carry the same cluster and node id and a known format. Stale reader slots
 * of dead processes are cleared (mdb_reader_check). @o is copied.
 *
 * A new directory gets a fresh incarnation id and the IDENTITY file; a
 * format-1 directory is upgraded (see IDENTITY AND DAMAGE above). On success
 * s->identity says who the directory is and whether this open created or
 * upgraded it.
 *
 * Returns 0 or, with a one-line message naming @dir and the problem in
 * s->errmsg (the only field valid after a failure; nothing to release):
 *   IDA_EINVAL   bad options
 *   IDA_ELOSTSTATE IDENTITY says this node was created here but data.mdb is
 *                missing, empty or replaced (nothing is written)
 *   IDA_EFOREIGN another cluster or node id, a non-empty directory that
 *                holds no idalloc storage, a data.mdb that is not LMDB, or
 *                an LMDB environment of another program (nothing is
 *                written to any of them)
 *   IDA_EVERSION a newer or unknown format version
 *   IDA_ECORRUPT an identity or meta record or the IDENTITY file that
 *                fails its checksum, or a truncated or damaged data.mdb
 *                (checked before it is mapped; nothing is written)
 *   IDA_EEXIST   @dir is already open in this process
 *   IDA_EIO      the directory or environment cannot be created or opened
 *                (read-only file system, permissions...), with the
 *                system's or LMDB's message
 *   IDA_ENOSPC   no space to create it
 *   IDA_ENOMEM */
int ida_storage_open(struct ida_storage *s,
                     const char *dir,
                     const struct ida_storage_opts *o);

/* Close @s (owner; no snapshot writer may be active). Everything committed
 * is already durable. */
void ida_storage_close(struct ida_storage *s);

/* The sticky error code (0 while healthy); s->errmsg says why. */
int ida_storage_failed(const struct ida_storage *s);

/* The incarnation id of the open directory (nonzero). */
uint64_t ida_storage_incarnation(const struct ida_storage *s);

/* This start's boot id (nonzero): the number of times the directory was
 * opened, this open included, in the high 32 bits, and a random nonzero
 * nonce in the low 32. Open counts the start durably before it returns, so
 * a node never sends anything under a boot id its directory does not hold.
 * Two starts of one directory never get the same count unless the
 * directory was put back to an older copy (raft/admission.h, rule A4). */
uint64_t ida_storage_boot(const struct ida_storage *s);

/* Mark the directory untrusted, durably: the node found that its state
 * went back to an older copy (raft/admission.h, rule A4). Every later open
 * refuses it with IDA_ELOSTSTATE, quoting @reason (cut at 400 bytes), until
 * the operator removes the directory. 0 or the commit's error code. */
int ida_storage_mark_untrusted(struct ida_storage *s, const char *reason);

/* Current map size in bytes (owner). */
uint64_t ida_storage_map_size(const struct ida_storage *s);

/* Grow the map now, if needed, so that about @bytes more fit beside what
 * the file holds: a snapshot about to be written. Without it a large write
 * fails at each doubling and starts over from scratch. 0, or the growth's
 * error (the write then grows as it goes). Owner, between calls. */
int ida_storage_reserve(struct ida_storage *s, uint64_t bytes);

/* Unmap from this process up to @bytes of the map's pages, from where the
 * last call stopped, wrapping at the end of the file's used pages. The
 * pages stay in the kernel's page cache: a later read maps them again (a
 * minor fault). What goes is their count in the process's resident size,
 * which would otherwise grow toward the whole file as writes, log
 * compactions and snapshot reads touch it. Owner, between calls (no
 * pointer into the map is held then). */
void ida_storage_release_pages(struct ida_storage *s, size_t bytes);

/* --- group commit (owner) --- */

/* Start an empty batch against the durable state of @s. */
void ida_storage_batch_init(struct ida_storage *s, struct ida_storage_batch *b);

/* Remove entries with index >= @from (a conflicting suffix). Must come before
 * any append of the batch, at most once. @from must be in
 * [first, last + 1] and above the durable commit index. Returns 0 or
 * IDA_EINVAL (batch unchanged). */
int ida_storage_batch_truncate(struct ida_storage *s,
                               struct ida_storage_batch *b,
                               ida_index from);

/* Append @count entries. They must continue the log as the batch leaves it:
 * indexes consecutive from its last + 1, terms nonzero and not below the
 * last term, known types. @entries and their data are borrowed until the
 * commit returns. Returns 0, IDA_EINVAL (nothing recorded) or IDA_ETOOBIG
 * (more than IDA_STORAGE_BATCH_SPANS_MAX appends, or an entry's data
 * larger than IDA_STORAGE_ENTRY_BYTES_MAX or than a log segment holds:
 * nothing recorded). */
int ida_storage_batch_append(struct ida_storage *s,
                             struct ida_storage_batch *b,
                             const struct ida_entry *entries,
                             size_t count);

/* Set the hard state (copied). Term never decreases; within a term a vote,
 * once cast, never changes; commit never decreases. Returns 0 or IDA_EINVAL
 * (batch unchanged). The commit index is checked against the log at commit. */
int ida_storage_batch_set_hard_state(struct ida_storage *s,
                                     struct ida_storage_batch *b,
                                     const struct ida_hard_state *hs);

/* Store @len bytes of writer @w's snapshot in the batch's transaction, as
 * ida_storage_snapshot_write() would in one of its own (the chunks stay
 * invisible until the snapshot is finished): a raft batch carries a slice
 * of a snapshot, so appends and their fsync do not wait behind a commit of
 * the snapshot's (a node stores the snapshot it encoded so:
 * src/node/storage_proc.c). At most once per batch; @data is borrowed until
 * the commit returns. The writer advances only when the commit succeeds: a
 * failed commit leaves it as it was (a batch that failed without failing
 * the storage may be tried again with it). Returns 0 or IDA_EINVAL (a
 * second call, or no writer is active; batch unchanged). */
int ida_storage_batch_snapshot(struct ida_storage *s,
                               struct ida_storage_batch *b,
                               struct ida_snapshot_writer *w,
                               const uint8_t *data,
                               size_t len);

/* Execute @b as one write transaction and one durable commit. When it
 * returns 0 every part of the batch is on disk; on error none is.
 * Returns 0 or:
 *   IDA_EINVAL   the hard state's commit is beyond the batch's last index
 *   IDA_ENOSPC   the map is full at map_size_max_bytes (not sticky), or the
 *                disk is full (sticky)
 *   IDA_ETOOBIG  the batch does not fit one transaction (not sticky)
 *   IDA_ENOMEM   LMDB ran out of memory (not sticky)
 *   IDA_ECORRUPT a record read during the batch failed its check (sticky)
 *   IDA_EIO      an I/O error or failed fsync (sticky)
 *   the sticky code, once failed.
 * A batch that would change nothing (no truncate, no entries, no hard state
 * or the durable one, no snapshot bytes that fill a chunk) costs no
 * transaction and returns 0 (or the sticky
 * code). */
int ida_storage_batch_commit(struct ida_storage *s,
                             struct ida_storage_batch *b);

/* --- compaction (owner) --- */

/* Delete the entries with index <= @upto, keeping the term of @upto as
 * prev_term. Only a prefix covered by the durable snapshot may go: @upto
 * must be <= the snapshot's index. If @upto is the snapshot's index and the
 * log holds no entry there with the snapshot's term, the whole log is
 * discarded and prev becomes the snapshot's (index, term) (Raft Figure 13,
 * InstallSnapshot step 7). @upto below first is a no-op. One durable commit.
 * Returns 0, IDA_EINVAL (no snapshot, or @upto beyond it), or a commit
 * error as ida_storage_batch_commit(). */
int ida_storage_compact(struct ida_storage *s, ida_index upto);

/* Make the entry log's next segment ahead, writing at most @max_bytes of
 * it (0: all) so that no call holds the owner long: without it the append
 * that fills a segment writes the next one whole (65 MiB) before its
 * flush. Returns 0 when it is ready, IDA_EBUSY while more calls are
 * needed, IDA_EIO/IDA_ENOSPC (not sticky: the append makes it), or the
 * sticky code. Owner, between batches. */
int ida_storage_log_prepare(struct ida_storage *s, size_t max_bytes);

/* --- reads (owner) --- */

/* Each LMDB read runs in its own read transaction. The node reads the log at
 * start only (its Raft core keeps the log tail in memory), and the
 * snapshot at start and for each InstallSnapshot chunk it sends (the core
 * keeps only its size); the entry and term reads are kept for reading old
 * entries when the in-memory log is bounded. These never write s->errmsg: a
 * corrupt record is reported with a log line naming it, and the code says what
 * kind. The log's bounds, the hard state and terms come from the owner's
 * memory (the entry log's index); entries are read from log/. */

/* The log's bounds. Returns 0. */
int ida_storage_log_state(struct ida_storage *s,
                          struct ida_storage_log_state *out);

/* The durable hard state ({0, 0, 0} on a new node). Returns 0. */
int ida_storage_hard_state(struct ida_storage *s, struct ida_hard_state *out);

/* The term of entry @index; for index == prev_index, prev_term (0 for 0).
 * Returns 0 or IDA_ENOTFOUND (compacted or beyond the last entry). */
int ida_storage_term_at(struct ida_storage *s, ida_index index, ida_term *out);

/* Read entries [@lo, @hi) (@lo < @hi), stopping early once their data adds
 * up to more than @max_bytes (at least one entry is returned; 0: no limit).
 * On success *out is one ida_malloc'd block holding the array and all data,
 * owned by the caller (ida_free(*out)), and *count >= 1.
 * Returns 0, IDA_EINVAL (@lo >= @hi or @lo == 0), IDA_ENOTFOUND (@lo below
 * first: compacted; or @hi beyond last + 1), IDA_ECORRUPT (a record fails its
 * checksum or has the wrong size; the message names the index), IDA_ENOMEM,
 * IDA_EIO. */
int ida_storage_entries(struct ida_storage *s,
                        ida_index lo,
                        ida_index hi,
                        size_t max_bytes,
                        struct ida_entry **out,
                        size_t *count);

/* The latest durable snapshot's meta. out->config is ida_malloc'd and owned
 * by the caller (release with ida_snapshot_meta_release()). Returns 0,
 * IDA_ENOTFOUND (no snapshot yet), IDA_ECORRUPT, IDA_ENOMEM, IDA_EIO. */
int ida_storage_snapshot_meta(struct ida_storage *s,
                              struct ida_snapshot_meta *out);
void ida_snapshot_meta_release(struct ida_snapshot_meta *m);

/* Copy up to @len bytes of snapshot @id's state from byte @offset into @buf;
 * *n gets the count (0 at the end). Returns 0, IDA_ENOTFOUND (@id is no
 * longer the current snapshot), IDA_EINVAL (@offset beyond the size),
 * IDA_ECORRUPT (a chunk fails its checksum), IDA_EIO. */
int ida_storage_snapshot_read(struct ida_storage *s,
                              uint64_t id,
                              uint64_t offset,
                              uint8_t *buf,
                              size_t len,
                              size_t *n);

/* Load the whole latest snapshot: meta and state bytes, the latter checked
 * against the meta's size and CRC. *data (ida_malloc'd, may be NULL when
 * the size is 0) and out->config are owned by the caller. Returns 0,
 * IDA_ENOTFOUND, IDA_ECORRUPT, IDA_ENOMEM, IDA_EIO. */
int ida_storage_snapshot_load(struct ida_storage *s,
                              struct ida_snapshot_meta *out,
                              uint8_t **data);

/* --- snapshot writing (owner) --- */

/* Start writing a snapshot of the state at (@index, @term) with the cluster
 * configuration @config (@config_len bytes, copied). At most one writer at a
 * time. @index must not be below the current snapshot's index. Returns 0,
 * IDA_EINVAL, IDA_EBUSY (a writer is active), IDA_ETOOBIG (config too large),
 * IDA_ENOMEM, or the sticky code. */
int ida_storage_snapshot_begin(struct ida_storage *s,
                               struct ida_snapshot_writer *w,
                               ida_index index,
                               ida_term term,
                               const uint8_t *config,
                               size_t config_len);

/* Append @len bytes of state. Full chunks are stored as they fill (one write
 * transaction per call that fills any); they stay invisible until
 * ida_storage_snapshot_finish(). Returns 0 or a commit error (the writer
 * must then be aborted). */
int ida_storage_snapshot_write(struct ida_storage *s,
                               struct ida_snapshot_writer *w,
                               const uint8_t *data,
                               size_t len);

/* Replace the membership @w will store with the snapshot by @config
 * (@config_len bytes, copied): a snapshot streamed before the membership at
 * its index was looked up. Returns 0, IDA_ETOOBIG or IDA_ENOMEM (then the
 * writer is as it was). */
int ida_storage_snapshot_set_config(struct ida_snapshot_writer *w,
                                    const uint8_t *config,
                                    size_t config_len);

/* Store the last chunk and make the snapshot the current one, durably, in one
 * commit that also deletes the previous snapshot's chunks. The log is not
 * touched: call ida_storage_compact() afterwards (it can only remove what a
 * durable snapshot covers). The writer is released on success and on error.
 * Returns 0 or a commit error. */
int ida_storage_snapshot_finish(struct ida_storage *s,
                                struct ida_snapshot_writer *w);

/* As ida_storage_snapshot_finish(), but the chunks of the snapshot it
 * replaces are left for ida_storage_snapshot_tidy() to delete a few at a
 * time: at 180 MB, deleting 2,800 chunks of 64 KiB in the finishing commit held
 * the owner for tens of milliseconds. A crash meanwhile leaves them to the next
 * open, which deletes the chunks of every snapshot but the current. (When
 * a replaced snapshot still awaits tidying, this one's predecessor is
 * deleted in the commit as before.) */
int ida_storage_snapshot_finish_lazy(struct ida_storage *s,
                                     struct ida_snapshot_writer *w);

/* Delete chunks of a snapshot replaced by ida_storage_snapshot_finish_lazy(),
 * in one commit: at least one, and at most @max_bytes of stored chunks
 * (bytes, not a count: chunks of snapshots older versions stored are 64 KiB,
 * now IDA_STORAGE_CHUNK_BYTES). Returns 0 with *@more set when some are
 * left, or a commit error. */
int ida_storage_snapshot_tidy(struct ida_storage *s,
                              size_t max_bytes,
                              int *more);

/* Whether writer @w holds exactly the snapshot at (@index, @term) with
 * membership @config (@config_len bytes) and state @data (@len bytes, by
 * size and CRC-32C): a snapshot stored as it arrived is the one to
 * install. */
int ida_storage_snapshot_writer_holds(const struct ida_snapshot_writer *w,
                                      ida_index index,
                                      ida_term term,
                                      const uint8_t *config,
                                      size_t config_len,
                                      const uint8_t *data,
                                      size_t len);

/* Drop an unfinished snapshot: its stored chunks are deleted (best effort;
 * leftovers are collected at the next open) and the writer released. */
void ida_storage_snapshot_abort(struct ida_storage *s,
                                struct ida_snapshot_writer *w);

/* --- test hooks --- */

/* Make the (@put_after+1)-th LMDB put and/or the (@commit_after+1)-th commit
 * from now fail with @code as if LMDB had returned it (-1: never). A failed
 * put aborts the transaction; a failed commit aborts it too (nothing is
 * written) and is treated like a real commit failure. Tests only. */
void ida__storage_fault_set(struct ida_storage *s,
                            int put_after,
                            int commit_after,
                            int code);

/* The first membership ("membership0" in meta): the encoded configuration,
 * with every member's incarnation, that the node uses until its log or a
 * snapshot holds one (raft/admission.h). Written once when the cluster is
 * created or the node joins one, durably, before the node takes part.
 * _set returns 0, IDA_EINVAL (empty or over 64 KiB) or a commit error;
 * membership0 returns 0 with *@out ida_malloc'd (the caller frees it),
 * IDA_ENOTFOUND (never written), IDA_ECORRUPT, IDA_ENOMEM, IDA_EIO. */
int ida_storage_membership0_set(struct ida_storage *s,
                                const uint8_t *data,
                                size_t len);
int ida_storage_membership0(struct ida_storage *s, uint8_t **out, size_t *len);

#endif /* IDA_STORAGE_H */
