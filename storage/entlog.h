/* The Raft log's entries over a segment log (storage/seglog.h): the layer
 * that keeps storage's log out of LMDB, one device flush per batch
 * (storage/storage.h; docs/DESIGN.md, "Group commit and flushes").
 *
 * RECORDS
 *
 * Each batch is one seglog record, so a batch is stored whole or not at
 * all (integers little-endian):
 *
 *   u8 version (1) | u8 zero[7] | u64 truncate_from (0: none)
 *   | u64 commit | u64 first_index | u32 count | u32 zero
 *   | count x (u64 term | u8 type | u8 zero[3] | u32 len | len bytes)
 *
 * truncate_from removes the entries from that index on before the batch's
 * entries go on (a conflicting suffix); commit is the commit index the
 * writer knew (the highest one of the records recovered is where a node
 * restarting may apply to before its leader tells it more); the entries
 * continue the log: first_index is its last index + 1 after the
 * truncation. The term and vote stay in LMDB: they change at elections
 * only, so a batch that carries them costs an LMDB commit too, but the
 * batches of a round do not.
 *
 * Recovery replays the records in order into an index held in memory (an
 * entry's term, type, length and where its bytes are: 32 bytes an entry),
 * from which terms are answered without a read and entries read back with
 * one read of their record. Bytes from the disk are checked as a hostile
 * peer's would be: a record that checks by its CRC but does not make a
 * log (entries not continuing it, terms going down or 0, unknown types,
 * lengths beyond the record or IDA_STORAGE_ENTRY_BYTES_MAX, a truncation
 * at or below the snapshot's index or above the log) is IDA_ECORRUPT.
 *
 * Compaction drops the entries a snapshot covers from the index and
 * releases the segments whose records are all older than the first record
 * still needed. The segments kept may begin with entries the snapshot
 * covers: open skips them (prev_index, from the snapshot the caller holds).
 *
 * THREADS: one thread uses a log at a time. */
#ifndef IDA_STORAGE_ENTLOG_H
#define IDA_STORAGE_ENTLOG_H

#include <stddef.h>

#include "base/types.h"
#include "storage/seglog.h"

struct ida_entlog;

/* Open the log in @dir (storage/seglog.h, with @o) whose entries continue
 * a snapshot at (@prev_index, @prev_term) (0, 0: none). A reset recorded
 * beyond @prev_index (a compaction whose reset is durable but whose new
 * prev the caller had not yet recorded) is taken if it names the durable
 * snapshot at (@snap_index, @snap_term) or an older index: prev then moves
 * to it (ida_entlog_bounds() says where the log begins). Returns 0 with
 * *@out, or an open error of seglog, IDA_ECORRUPT (records that do not
 * make a log after the snapshot: @err says which), IDA_ENOMEM. */
int ida_entlog_open(const char *dir,
                    const struct ida_seglog_options *o,
                    ida_index prev_index,
                    ida_term prev_term,
                    ida_index snap_index,
                    ida_term snap_term,
                    struct ida_entlog **out,
                    char *err,
                    size_t errlen);
void ida_entlog_close(struct ida_entlog *l);

/* One batch: remove the entries from @truncate_from on (0: none; else in
 * [first, last + 1] and above the highest commit recorded), then append
 * @count entries continuing the log (indexes from its last + 1, terms
 * nonzero and not below its last term, known types, data up to
 * IDA_STORAGE_ENTRY_BYTES_MAX), recording @commit (not below the highest
 * recorded, not beyond the batch's last index). Not durable until
 * ida_entlog_sync() returns 0. Returns 0, IDA_EINVAL (nothing written),
 * IDA_ETOOBIG (larger than a record may be), IDA_ENOMEM, or a sticky
 * write error of seglog. */
int ida_entlog_append(struct ida_entlog *l,
                      ida_index truncate_from,
                      ida_index commit,
                      const struct ida_entry *entries,
                      size_t count);

/* Make every batch appended durable (ida_seglog_sync()). */
int ida_entlog_sync(struct ida_entlog *l);

/* Make the next segment ahead (ida_seglog_prepare()). */
int ida_entlog_prepare(struct ida_entlog *l, size_t max_bytes);

/* The log's bounds: entries [prev_index + 1, last] (none when last ==
 * prev_index), and the highest commit recorded. */
void ida_entlog_bounds(const struct ida_entlog *l,
                       ida_index *prev_index,
                       ida_term *prev_term,
                       ida_index *last);
ida_index ida_entlog_commit(const struct ida_entlog *l);

/* The highest LSN of the segment log that is durable (0: none). */
uint64_t ida_entlog_synced_lsn(const struct ida_entlog *l);

/* The term of entry @index; prev_term for prev_index. Returns 0 or
 * IDA_ENOTFOUND (compacted or beyond the last). */
int ida_entlog_term_at(const struct ida_entlog *l,
                       ida_index index,
                       ida_term *out);

/* Entries [@lo, @hi), as ida_storage_entries(): at least one, and no
 * more once their data would add up to more than @max_bytes (0: no
 * limit); *@out one
 * ida_malloc'd block of the array and the data. Returns 0, IDA_EINVAL,
 * IDA_ENOTFOUND, IDA_ECORRUPT, IDA_ENOMEM or IDA_EIO. */
int ida_entlog_entries(struct ida_entlog *l,
                       ida_index lo,
                       ida_index hi,
                       size_t max_bytes,
                       struct ida_entry **out,
                       size_t *count);

/* A snapshot at (@upto, @upto_term) is durable: drop the entries up to
 * @upto (all of them, when the log holds no entry @upto of that term:
 * Raft's Figure 13, step 7) and release the segments no entry kept needs.
 * Returns 0, IDA_EINVAL (@upto below prev_index) or IDA_EIO. */
int ida_entlog_compact(struct ida_entlog *l,
                       ida_index upto,
                       ida_term upto_term);

/* Tests and fuzzing: what an open makes of the @n records @recs (@lens
 * bytes each) after (@prev_index, @prev_term), the snapshot at
 * (@snap_index, @snap_term), without files: 0 with *@out (bounds, commit
 * and terms answer; entries cannot be read), or open's error. */
int ida__entlog_replay(ida_index prev_index,
                       ida_term prev_term,
                       ida_index snap_index,
                       ida_term snap_term,
                       const uint8_t *const *recs,
                       const size_t *lens,
                       size_t n,
                       struct ida_entlog **out,
                       char *err,
                       size_t errlen);

#endif /* IDA_STORAGE_ENTLOG_H */
