/* A leader's snapshot decoded while its chunks arrive (fsm.h, struct
 * ida_fsm_ahead), on a thread of its own: the raft processor feeds it each
 * chunk the core took, in order, and the check of the whole snapshot
 * (raft_snap.c, ida__rp_snapshot_check()) then restores it with what was
 * decoded ahead. At ten million allocations, the check was a full restore of
 * about 1.3 s that began only once the last of ~175 MB came.
 *
 * The stream keeps a copy of the bytes (the core's buffer grows, and moves,
 * as chunks come): at the check it holds exactly the bytes the core
 * checks, or the check restores the core's bytes as before. A stream costs
 * the bytes that arrived (its buffer's whole size is reserved as address
 * space only, and made writable as they come), plus the pools decoded
 * ahead, until the check ends or it is dropped. */
#ifndef IDA_NODE_SNAP_STREAM_H
#define IDA_NODE_SNAP_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsm/fsm.h"
#include "raft/raft.h"

struct ida__snap_stream;

/* Start one for the snapshot (@index, @term) of @total bytes, whose first
 * @len bytes are @data. NULL when it cannot (memory, a thread): the check
 * then restores the snapshot whole, as without it. */
struct ida__snap_stream *ida__snap_stream_start(ida_index index,
                                                ida_term term,
                                                size_t total,
                                                const uint8_t *data,
                                                size_t len);

/* Whether @st is for the snapshot (@index, @term) of @total bytes and took
 * its bytes up to @offset. */
bool ida__snap_stream_at(const struct ida__snap_stream *st,
                         ida_index index,
                         ida_term term,
                         size_t total,
                         size_t offset);

/* Whether @st is for the snapshot (@index, @term); the bytes it took (0
 * for NULL). */
bool ida__snap_stream_of(const struct ida__snap_stream *st,
                         ida_index index,
                         ida_term term);
size_t ida__snap_stream_fed(const struct ida__snap_stream *st);

/* The next @len bytes (ida__snap_stream_at() said where: they fit). */
void ida__snap_stream_feed(struct ida__snap_stream *st,
                           const uint8_t *data,
                           size_t len);

/* Stop @st (NULL is ignored) without waiting: its thread frees it once it
 * looks, after the chunk it is decoding (another snapshot's first chunk,
 * another leader: the raft processor does not wait). */
void ida__snap_stream_drop(struct ida__snap_stream *st);

/* Stop @st and free it (NULL is ignored), waiting for its thread to end
 * (a node stopping: nothing is left running). */
void ida__snap_stream_stop(struct ida__snap_stream *st);

/* Where a check's time went (microseconds), for its log line: the wait
 * for the thread to decode the bytes it had not yet (the last chunks, and
 * any it fell behind by), the comparison of its copy with the bytes
 * checked, and the restore itself. */
struct ida__snap_stream_times
{
    uint64_t lag_us;
    uint64_t cmp_us;
    uint64_t restore_us;
};

/* On any thread: restore @f from the snapshot's whole bytes @data (@len),
 * which ida__snap_stream_of() matched to @st (may be NULL), with a thread
 * lent (src/node/lend.h): with what was decoded ahead when @st holds these
 * very bytes, else the plain restore. Frees @st. Returns the restore's
 * verdict; *@ahead the holdings of the pools the restore took as decoded
 * ahead (0 without); *@t where the time went (0 for a part not run). */
int ida__snap_stream_restore(struct ida__snap_stream *st,
                             struct ida_fsm *f,
                             const uint8_t *data,
                             size_t len,
                             uint64_t *ahead,
                             struct ida__snap_stream_times *t);

#endif /* IDA_NODE_SNAP_STREAM_H */
