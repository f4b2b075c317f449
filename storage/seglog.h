/* A log of records in segment files, durable with one device flush per
 * commit: what the node's entry log (storage/entlog.h) is written in, the
 * Raft log taken out of LMDB (issue 18; docs/DESIGN.md, "Group commit and
 * flushes", says why it has this shape).
 *
 * WHY
 *
 * An LMDB commit is two device flushes (its data pages, then its meta
 * page), and a round of Raft costs several commits on the one disk the
 * nodes of a test cluster share. Overwriting bytes of a file already
 * written and calling fdatasync(2) is one flush, and the cheapest durable
 * write a disk offers: `build/bench/bench_storage` prints it beside LMDB's
 * commit ("raw fdatasync, overwrite"; 0.15 to 0.19 ms against 0.36 to 0.41
 * ms on the project's machine). Appending instead changes the file's size
 * and extents, which the file system journals: a second flush. So a
 * segment is written in full (zeros) before any record goes in, and records
 * only ever overwrite it.
 *
 * Writing LMDB "behind" such a log (MDB_NOSYNC, synced at checkpoints)
 * would not be safe: LMDB's two meta pages alternate and it reuses pages
 * the commit before last freed, so after a few unsynced commits the last
 * synced state is no longer intact on disk, and a system crash can leave a
 * meta page naming pages that were never written (LMDB's documentation of
 * MDB_NOSYNC says a system crash can corrupt the database). The log must
 * hold what it makes durable, on its own.
 *
 * FILES
 *
 * A directory of files named seg-<16 hex digits: sequence number>, each
 * segment_bytes long when made (a multiple of 4096, 64 KiB to 1 GiB; a
 * segment made with another size is read as it is):
 *
 *   header   one 4096-byte block: "IDASEGL1" | u32 version (1)
 *            | u32 header bytes (68) | u64 seq | u64 first_lsn (0: a
 *            spare, not used yet)
 *            | 32 bytes of identity (the caller's: which node's log this is)
 *            | u32 crc | zeros                    (integers little-endian)
 *   records  from offset 4096, each at a multiple of 8:
 *            u32 crc | u32 len | u64 lsn | u64 synced | len bytes | zeros
 *            to the next multiple of 8; crc (CRC-32C) covers len, lsn,
 *            synced and the bytes.
 *
 * Records have log sequence numbers (LSN) 1, 2, 3... with no gap, across
 * segments: a segment's first record is its header's first_lsn. A record's
 * `synced` is the highest LSN that was durable (its fdatasync returned)
 * when it was written. A record that does not fit in what is left of a
 * segment starts the next one. New segments are made ahead of need, a
 * piece at a time (ida_seglog_prepare()): written full of zeros under a
 * temporary name (tmp-<seq>), flushed, renamed, and the directory flushed.
 *
 * RECOVERY (ida_seglog_open())
 *
 * Segments are read (mapped), in sequence order, each record checked (its
 * CRC, its length within the segment, its LSN the next one). A record
 * that does not check ends its segment; the log goes on in the next
 * segment if that one's header checks and names the next LSN as its
 * first (a record that did not fit left zeros behind it). Otherwise the
 * log ends there, at LSN B (the first not recovered), if nothing says a
 * record at B or later was durable:
 *   - no record found after the end (in the rest of that segment, read at
 *     every multiple of 8, and in every later segment file) has `synced`
 *     >= B;
 *   - B is above the caller's floor (min_lsn: an LSN the caller knows was
 *     durable, e.g. one it recorded elsewhere).
 * Then B and what follows were never acknowledged (only a flush that
 * returned acknowledges, and it makes every LSN below it durable first):
 * the segments after the end are removed. Otherwise the log lost records
 * it had made durable (a damaged disk, files removed or rolled back):
 * open refuses with IDA_ECORRUPT, says which LSN, and changes nothing. A
 * segment file whose header does not check (one being made, or switched
 * to, when the process died) or that is a spare is such a segment after
 * the end. A header of another identity or version, or of another
 * sequence than its name, is refused (IDA_EFOREIGN, IDA_EVERSION,
 * IDA_ECORRUPT). Leftover tmp- files are removed.
 *
 * After recovery, open flushes the segments kept (a process that died may
 * have left their last records in the page cache only) and appends go on
 * in a new segment whose first_lsn is B: the bytes after the end of the
 * last one may hold records of a tail that was not durable, which must
 * never be read as records again. That segment is durable before the
 * segments after the end go, so the log never forgets its next LSN.
 * When the directory's last file is a spare the maker finished (its
 * header names no LSN, every byte after it is zero, segment_bytes long),
 * that spare is the new segment: only its header is written. Zeros are
 * what the maker leaves, and all a segment the process was switching to
 * can hold that is not a record; a spare with any other byte (records
 * written back before their segment's header was, when the machine
 * stopped) is removed as before. Removing it freed a 64 MiB file's pages
 * in line, ~50 ms of every restart.
 * Zeros are also what most of a scan for durable records reads (the rest
 * of the last segment, the spare): a run of them is read once, not at
 * every multiple of 8.
 *
 * THE MAKER
 *
 * Two jobs touch only files the appends no longer (or not yet) use, and
 * each ends with flushes of the file system: making the next segment
 * (segment_bytes of zeros, a flush, a rename, the directory flushed) and
 * removing released segments (an unlink and the directory flushed each).
 * Done in line by the node's storage processor, with every append
 * waiting behind them, they held it 10 to 168 ms (making a segment, in
 * 512 KiB steps) and 245 to 316 ms (removing one of 64 MiB) at a time
 * under load at 10 M allocations (a kept bench-scale cluster, 64 clients).
 * With o.behind, a thread of the log's own (the maker) does them, one job
 * at a time: a prepare starts one and later calls only look whether it
 * is done; a release takes the segments out of the log at once and hands
 * their files to the maker, in order. A failure to remove one is returned
 * by every release from then on, and no file is removed after it (the
 * files left stay a run, oldest first, for the next open). Released
 * segments go before a new spare is begun, whether the last spare was
 * made or not (on a full disk they are the room), and an append that
 * needs a segment the maker failed to make makes it whole in line, after
 * those removals. The spare is written 256 KiB at a time, each
 * written back before the next and a rest of 4 ms after it (none once an
 * append waits for the spare, or once the segment appends go to has less
 * than 16 MiB of room, as the 1 MiB one an open starts has): the maker never
 * puts more than a piece in the disk's queue ahead of the appends' flushes, nor
 * runs the disk at full speed beside them (which, unpaced, made their p999
 * worse). The files and the order of the steps are those of the in-line code,
 * so a crash at any point leaves what recovery already handles (a tmp- file, a
 * spare, or released segments still there, oldest first). An append that needs
 * the spare before the maker is done waits for it, as it would have made it
 * whole in line. When no thread can be started the job runs in line.
 *
 * THREADS: one thread uses a log at a time; nothing here locks. The
 * maker touches only the files of its job until its owner collects it (a
 * prepare, a release, the append that takes the spare, or close, which
 * waits for it and removes what is left to remove, unless a removal
 * failed; a spare being made it stops after the piece in hand and removes,
 * as the next open would remove a half-made one anyway; a whole one is
 * kept for the next open to go on in). */
#ifndef IDA_STORAGE_SEGLOG_H
#define IDA_STORAGE_SEGLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define IDA_SEGLOG_IDENT_BYTES      32
#define IDA_SEGLOG_HEADER_BYTES     4096
#define IDA_SEGLOG_RECORD_HDR_BYTES 24
/* The smallest segment (tests); the node would use tens of MiB. */
#define IDA_SEGLOG_SEGMENT_MIN (64u * 1024u)
#define IDA_SEGLOG_SEGMENT_MAX (1u << 30)

struct ida_seglog;

struct ida_seglog_options
{
    size_t segment_bytes; /* a multiple of 4096, from IDA_SEGLOG_SEGMENT_MIN
                            to IDA_SEGLOG_SEGMENT_MAX */
    uint8_t ident[IDA_SEGLOG_IDENT_BYTES]; /* written into each header and
                                              required of each read */
    uint64_t min_lsn;          /* records up to this LSN were durable (0: none
                                  known): recovering fewer is IDA_ECORRUPT */
    size_t open_segment_bytes; /* the segment an open makes for appends (0:
                                  segment_bytes): a multiple of 4096 from
                                  IDA_SEGLOG_SEGMENT_MIN to segment_bytes.
                                  Smaller, an open writes less; a record
                                  that does not fit goes on in the next,
                                  made with segment_bytes */
    bool behind; /* ida_seglog_prepare() makes the next segment on a thread
                    of its own (THE MAKER below) */
};

/* Where a record is, for reading it again. */
struct ida_seglog_pos
{
    uint64_t seq; /* its segment */
    uint64_t off; /* its header's offset in it */
};

/* Called by open for each record recovered, in LSN order: @data (@len
 * bytes) is valid during the call; then once more with @lsn 0 (and no
 * data) when the last was. A nonzero return stops the open, which
 * returns it having changed nothing. */
typedef int (*ida_seglog_record_fn)(void *ctx,
                                    uint64_t lsn,
                                    const uint8_t *data,
                                    size_t len,
                                    struct ida_seglog_pos pos);

/* Open (creating the directory @dir's first segment if it holds none) and
 * recover the log in @dir, calling @fn (may be NULL) for every record.
 * Returns 0 with *@out set, or IDA_EINVAL (options), IDA_ECORRUPT,
 * IDA_EFOREIGN, IDA_EVERSION, IDA_EIO, IDA_ENOMEM, or @fn's code; @err
 * (@errlen bytes) then says why in one line. */
int ida_seglog_open(const char *dir,
                    const struct ida_seglog_options *o,
                    ida_seglog_record_fn fn,
                    void *ctx,
                    struct ida_seglog **out,
                    char *err,
                    size_t errlen);

/* Close @l (NULL is ignored). Records appended since the last sync may or
 * may not survive. */
void ida_seglog_close(struct ida_seglog *l);

/* Write one record of the @n buffers @iov (their bytes one after the
 * other, 1 to IDA_SEGLOG_RECORD_MAX(segment_bytes) in all): not durable
 * until ida_seglog_sync() returns 0. *@lsn (may be NULL) its LSN, *@pos
 * (may be NULL) where it is. Returns 0, IDA_ETOOBIG or IDA_EINVAL
 * (nothing written), or a sticky IDA_EIO/IDA_ENOSPC. */
#define IDA_SEGLOG_RECORD_MAX(seg) \
    ((seg)-IDA_SEGLOG_HEADER_BYTES - IDA_SEGLOG_RECORD_HDR_BYTES)
int ida_seglog_append(struct ida_seglog *l,
                      const struct iovec *iov,
                      int n,
                      uint64_t *lsn,
                      struct ida_seglog_pos *pos);

/* Make every record appended so far durable: one fdatasync(2) per segment
 * written since the last sync. Returns 0, or a sticky IDA_EIO: after a
 * failed flush nothing is known of what the file holds, so every later
 * call fails the same way. */
int ida_seglog_sync(struct ida_seglog *l);

/* Make the next segment ahead, at most @max_bytes of it per call (so that
 * no call holds its thread long), or with o.behind and @max_bytes > 0 on
 * the maker's thread (THE MAKER): returns 0 when one is ready (or was
 * already), IDA_EBUSY when more calls are needed (the maker still at it),
 * or IDA_EIO/IDA_ENOSPC (not sticky: the append that needs a segment
 * makes it whole). */
int ida_seglog_prepare(struct ida_seglog *l, size_t max_bytes);

/* Remove the segments whose every record has an LSN below @lsn (never the
 * one appends go to); with o.behind their files go on the maker's thread
 * (THE MAKER). Returns 0, or IDA_EIO when removing a segment file failed,
 * in this call or (o.behind) for an earlier one: from then on no segment
 * is removed (a newer one removed while an older one stays would leave a
 * hole in the run of files, which an open takes for lost records), every
 * call returns the same, and the files are left for the next open. */
int ida_seglog_release(struct ida_seglog *l, uint64_t lsn);

/* Read again the record at @pos with LSN @lsn: *@data (ida_malloc'd, the
 * caller frees) and *@len. Returns 0, IDA_ENOTFOUND (no such record
 * there: released, or not that LSN), IDA_ECORRUPT (its bytes no longer
 * check) or IDA_EIO/IDA_ENOMEM. */
int ida_seglog_read(struct ida_seglog *l,
                    struct ida_seglog_pos pos,
                    uint64_t lsn,
                    uint8_t **data,
                    size_t *len);

/* Test hook: of the calls that remove a segment file (@what 0) or write a
 * piece of the next segment (@what 1), on any thread, the next @skip
 * succeed, then @fail fail with @code (an IDA_E* code; @fail < 0: all that
 * follow), then all succeed again. Off unless a test arms it; @skip < 0
 * turns it off. */
void ida__seglog_fault_set(int what, int skip, int fail, int code);

/* The maker writes a spare in pieces of this many bytes (THE MAKER). */
#define IDA_SEGLOG_MAKER_PIECE (256u << 10)

/* Test hook: how many rests the makers of this process have taken (THE
 * MAKER: one after each piece but the last, none while hurried), and how
 * many pieces they wrote. */
void ida__seglog_maker_counts(uint64_t *rests, uint64_t *pieces);

/* The LSN the next record gets; the highest durable one (0: none). */
uint64_t ida_seglog_next_lsn(const struct ida_seglog *l);
uint64_t ida_seglog_synced_lsn(const struct ida_seglog *l);
/* How many segment files the log has (spare one included). */
size_t ida_seglog_segments(const struct ida_seglog *l);

#endif /* IDA_STORAGE_SEGLOG_H */
