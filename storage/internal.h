/* Declarations shared by the .c files of storage/ (not part of its API;
 * see storage/storage.h for the design). */
#ifndef IDA_STORAGE_INTERNAL_H
#define IDA_STORAGE_INTERNAL_H

#include <lmdb.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/types.h"
#include "storage/storage.h"

#define ENV(s) ((MDB_env *)(s)->env)

/* Below this much free space a failed write is reported as a full disk. */
#define DISK_FULL_BYTES (1u << 20)

/* Keys of the meta database. */
#define KEY_FORMAT     "format"
#define KEY_IDENTITY   "identity"
#define KEY_HARD_STATE "hard_state"
#define KEY_LOG_PREV   "log_prev"
#define KEY_SNAPSHOT   "snapshot"
#define KEY_BOOT       "boot"
#define KEY_UNTRUSTED  "untrusted"
#define KEY_LOG_LSN    "log_lsn"

/* Every call must come from the process that opened the environment: an
 * LMDB environment must never be used across fork(). */
#define CHECK_PROCESS(s) IDA_ASSERT((long)getpid() == (s)->pid)

/* A transaction function's return value meaning "refused by a check":
 * s->refused holds the IDA code and s->errmsg the message; the transaction is
 * aborted and the storage stays healthy. Outside LMDB's and errno's ranges. */
#define RC_REFUSED (-1)

/* Our own check found a stored record with a bad checksum or size (the
 * record is named in a log line). */
#define RC_CORRUPT (-2)

/* refuse(s, dir, code, fmt, ...): ida__storage_fail() that also records
 * s->refused. */
#define refuse(s, ...) ((s)->refused = ida__storage_fail((s), __VA_ARGS__))

typedef int (*txn_fn)(struct ida_storage *s, MDB_txn *txn, void *arg);

/* --- errors (storage/lmdb_util.c) --- */

/* Format "DIR: what" into s->errmsg and return @code. */
__attribute__((format(printf, 4, 5))) int ida__storage_fail(
    struct ida_storage *s,
    const char *dir,
    int code,
    const char *fmt,
    ...);

/* The project code for an LMDB (or errno) return value. */
int ida__storage_from_lmdb(int rc);

/* The injected commit failure (ida__storage_fault_set()) when this
 * commit (an LMDB commit, or a flush of the log) is the one: its code,
 * else 0. */
int ida__storage_fault_commit(struct ida_storage *s);

/* A write failed as a commit fails (@rc: an LMDB rc or an errno): make the
 * storage sticky-failed and say so ("@what failed: ...; storage
 * stopped"). Returns the sticky code. */
int ida__storage_stop(struct ida_storage *s, const char *what, int rc);

/* --- one open per directory and process (storage/registry.c) --- */

/* Claim directory (@dev, @ino) for this process: 0, IDA_EEXIST (open
 * already) or IDA_ENOMEM (too many open). */
int ida__storage_registry_claim(dev_t dev, ino_t ino);
void ida__storage_registry_release(dev_t dev, ino_t ino);

/* --- small LMDB helpers (storage/lmdb_util.c) --- */

MDB_val ida__storage_mkval(const void *p, size_t len);

/* Every put goes through here so tests can fail the Nth one. */
int ida__storage_put(struct ida_storage *s,
                     MDB_txn *txn,
                     MDB_dbi dbi,
                     MDB_val *k,
                     MDB_val *v,
                     unsigned flags);

int ida__storage_put_meta(struct ida_storage *s,
                          MDB_txn *txn,
                          const char *key,
                          const void *p,
                          size_t len);

int ida__storage_get_meta(struct ida_storage *s,
                          MDB_txn *txn,
                          const char *key,
                          MDB_val *v);

void ida__storage_chunk_key(uint8_t out[16], uint64_t id, uint64_t chunk);

/* --- transactions (storage/lmdb_util.c) --- */

int ida__storage_read_begin(struct ida_storage *s, MDB_txn **txn);
void ida__storage_read_end(struct ida_storage *s, MDB_txn *txn);

/* Run @fn in one write transaction and commit it durably. On MDB_MAP_FULL
 * (from @fn or the commit) the transaction is aborted, the map grown and @fn
 * run again from scratch. Returns 0 or an IDA code with s->errmsg set;
 * commit failures make the storage sticky-failed. */
int ida__storage_run_write(struct ida_storage *s,
                           const char *what,
                           txn_fn fn,
                           void *arg);

/* --- a snapshot write as part of a transaction (storage/snapshot.c) --- */

/* @len bytes of @data for writer @w: @k of them complete its buffer, which
 * then (@fills) makes a chunk, and @full whole chunks follow. */
struct ida__snapshot_step
{
    struct ida_snapshot_writer *w;
    const uint8_t *data;
    size_t len, k, full;
    int fills;
};

/* Plan the step without changing @w: its transaction may be replayed (map
 * growth) or fail, and the writer advances only after the commit. */
void ida__snapshot_step_plan(struct ida_snapshot_writer *w,
                             const uint8_t *data,
                             size_t len,
                             struct ida__snapshot_step *st);

/* Put the chunks the step fills in @txn (none when it does not fill the
 * buffer). */
int ida__snapshot_step_txn(struct ida_storage *s,
                           MDB_txn *txn,
                           const struct ida__snapshot_step *st);

/* The step's transaction committed: advance its writer. */
void ida__snapshot_step_done(const struct ida__snapshot_step *st);

/* --- identity and damage checks before LMDB opens (storage/identity.c) --- */

struct ida__rec_identity;

/* Fill @buf from the kernel's random source: getrandom(2) without blocking,
 * else /dev/urandom. 0 or an errno. */
int ida__storage_random(uint8_t *buf, size_t len);

/* A fresh random nonzero incarnation id and the current unix time in ms.
 * 0 or IDA_EIO with s->errmsg set. */
int ida__storage_mint(struct ida_storage *s,
                      const char *dir,
                      uint64_t *incarnation,
                      uint64_t *now_ms);

/* Read @dir/IDENTITY into @out (its name points into @buf, @cap bytes).
 * *present is 0 when there is no such file. 0, IDA_ECORRUPT (bad length or
 * checksum) or IDA_EIO, with s->errmsg set. */
int ida__storage_idfile_read(struct ida_storage *s,
                             const char *dir,
                             uint8_t *buf,
                             size_t cap,
                             struct ida__rec_identity *out,
                             int *present);

/* Write @dir/IDENTITY atomically and durably (temporary file, fsync,
 * rename, fsync of the directory). 0, IDA_EIO or IDA_ENOSPC. */
int ida__storage_idfile_write(struct ida_storage *s,
                              const char *dir,
                              const struct ida__rec_identity *r);

enum ida__data_state {
    IDA__DATA_ABSENT,
    IDA__DATA_EMPTY, /* 0 bytes */
    IDA__DATA_PRESENT,
};

/* Check @dir/data.mdb with plain reads before LMDB maps it: whole pages,
 * at least two, both meta pages sound and consistent, the newer one's
 * roots inside the file, consecutive txnids; when the newer meta page
 * names pages past the end of the file, ida__storage_check_pages(). The
 * caller must own the directory (node.c's lock): the walk is not an LMDB
 * reader, and a writer could reuse pages under it. 0 (with *state) or
 * IDA_ECORRUPT, IDA_EFOREIGN (not LMDB at all), IDA_EIO, with s->errmsg. */
int ida__storage_check_data(struct ida_storage *s,
                            const char *dir,
                            enum ida__data_state *state);

/* Little-endian integers, read from bytes and written to them: LMDB's
 * pages, and the segment log's records (seglog.h, entlog.h). */
static inline uint64_t ida__le64(const uint8_t *p)
{
    /* Spelled out, not a loop: the compiler makes one load of it (and one
     * store of ida__put_le64()), where the loop it kept byte by byte cost
     * a reopened log most of its scan for durable records (seglog_open.c,
     * durable_after()). */
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
           (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 |
           (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static inline uint32_t ida__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline uint16_t ida__le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline void ida__put_le64(uint8_t *p, uint64_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
    p[4] = (uint8_t)(v >> 32);
    p[5] = (uint8_t)(v >> 40);
    p[6] = (uint8_t)(v >> 48);
    p[7] = (uint8_t)(v >> 56);
}

static inline void ida__put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* LMDB's "no page" (P_INVALID): the root of an empty tree. */
#define P_INVALID_PG UINT64_MAX

/* pread exactly @len bytes at @off. 1 read, 0 short (end of file), or
 * -errno (storage/identity.c). */
int ida__storage_read_at(int fd, uint8_t *buf, size_t len, off_t off);

/* The end of every message that refuses a damaged data.mdb. */
#define DAMAGE_TAIL                                                     \
    "; refusing to open it (the node must be restored from its peers: " \
    "remove the directory, see README, Runbook)"

/* --- data.mdb's trees (storage/pages.c) --- */

/* Walk, with pread(2) on @fd, every B-tree of data.mdb reached from the
 * free list's root @free_root and the main database's @main_root
 * (P_INVALID: none), named databases included, and check that every
 * branch, leaf and overflow page they use lies within the file's @pages
 * pages of @psize bytes. Free pages are not read and may be missing. 0, or
 * IDA_ECORRUPT (a page in use is missing: "(truncated?)"; or a page is not
 * what its parent says), IDA_EIO, IDA_ENOMEM, with s->errmsg. */
int ida__storage_check_pages(struct ida_storage *s,
                             const char *dir,
                             int fd,
                             uint32_t psize,
                             uint64_t pages,
                             uint64_t free_root,
                             uint64_t main_root);

/* --- boots (storage/boot.c) --- */

/* Inside open's write transaction, once the identity is known: refuse a
 * directory marked untrusted (IDA_ELOSTSTATE, RC_REFUSED), else count this
 * start in the boot record and set s->boot. MDB rc, RC_CORRUPT or
 * RC_REFUSED. */
int ida__storage_boot_step(struct ida_storage *s, MDB_txn *txn);

/* --- the log of format 3 and before, in LMDB (storage/lmdb_log.c) --- */

/* The log's bounds as seen by @txn: log_prev, and the last entry of the
 * "log" database while the directory has one (s->lmdb_log). MDB rc or
 * RC_CORRUPT. */
int ida__storage_read_log_state(struct ida_storage *s,
                                MDB_txn *txn,
                                struct ida_storage_log_state *out);

/* Entries [@lo, @hi) of the "log" database, as ida_storage_entries()
 * answers them. Only to move them to the entry log (storage/logdir.c). */
int ida__storage_lmdb_entries(struct ida_storage *s,
                              ida_index lo,
                              ida_index hi,
                              size_t max_bytes,
                              struct ida_entry **out,
                              size_t *count);

/* --- the entry log (storage/logdir.c) --- */

/* After open's transaction: open the entry log in @dir/log (creating it
 * in a new directory, or moving the "log" database of a directory of
 * format @format < 4 into it), and set s->log and the hard state's commit
 * from it; one more LMDB commit records the log's durable LSN (and the
 * move). 0, or a code with s->errmsg: IDA_ELOSTSTATE (the log is missing
 * where the directory says it had one), IDA_ECORRUPT, IDA_EFOREIGN,
 * IDA_EVERSION, IDA_EIO, IDA_ENOSPC, IDA_ENOMEM. */
int ida__storage_log_open(struct ida_storage *s,
                          const char *dir,
                          uint32_t format,
                          int have_idfile);

/* Close the entry log, recording in LMDB how far it is durable first
 * (unless the storage failed). */
void ida__storage_log_close(struct ida_storage *s);

/* The commit index a record of the entry log ending at entry @last
 * carries: @commit, but not beyond the record's entries, and never below
 * what the log recorded (a compaction records its index there)
 * (storage/log.c). */
ida_index ida__storage_record_commit(const struct ida_storage *s,
                                     ida_index commit,
                                     ida_index last);

/* The LSN record: put @lsn (inside a write transaction). */
int ida__storage_put_log_lsn(struct ida_storage *s, MDB_txn *txn, uint64_t lsn);

#endif /* IDA_STORAGE_INTERNAL_H */
