/* The copies of the state a backup reads (`idalloc snapshot save`): the
 * SnapshotRead requests the fsm processor serves (fsm_proc.c), on the
 * leader, once their ReadIndex is applied.
 *
 * DESIGN (issue 19: no processor blocked by housekeeping).
 * A backup's first chunk (offset 0 of index 0) asks for a copy of the whole
 * state holding every write acknowledged before the call began; later
 * chunks name the copy by its index. A copy is encoded by a forked child
 * into a memory file (bgsnap.h, ida_bgsnap_start_mem()) and mapped, not
 * encoded in line: at ten million allocations encoding takes about a
 * second, which on the fsm processor would hold every client of the node.
 * The first chunk is answered once the child is done (ida__backups_poll(),
 * on the processor's pings and applies).
 *
 * Calls wait for copies, not copies for calls:
 * - a call waits for the child running (or the next one) and is answered
 *   by the first copy whose index is at or past its ReadIndex; a child is
 *   never cancelled for another call (two backups at once would otherwise
 *   cancel each other for ever);
 * - the client repeats a call that had no answer within its attempt
 *   timeout (1 s by default), with the same client id and seq: a repeat
 *   takes the place of its earlier attempt among the waiting, or is
 *   answered from the copy that answered it (a copy that takes longer
 *   than the attempt timeout would never be answered if each repeat
 *   started over). A copy made after the call's first attempt holds every
 *   write acknowledged before the call began: linearizable;
 * - a copy is answered from until nobody read it for BACKUP_KEEP_MS; two
 *   are kept (a newer one does not cut off a backup still reading the
 *   older). A chunk of a copy no longer kept is refused IDA_ENOTFOUND
 *   (not retried as such by the client library: the backup starts over).
 * Losing the leadership answers the waiting IDA_ELEADERLOST (their repeat
 * goes to the new leader) and drops the copies. Without a child (fork
 * failed, or the child failed) the copy is encoded in line.
 *
 * The node's periodic snapshot waits while a backup's child runs (two
 * children at once double the memory their encodings take), but no longer
 * than its wait's cap (src/node/snap_policy.h, TURNS: 1 to 60 s), so a
 * stream of backups cannot put it off for good; a backup does
 * not wait for a snapshot's child (its caller is waiting, for seconds at
 * ten million allocations). A child still running after
 * IDA_BACKUP_CHILD_MAX_MS is killed and the copy made in line (never seen:
 * the encoding takes about a second per ten million allocations). */
#ifndef IDA_NODE_BACKUP_COPY_H
#define IDA_NODE_BACKUP_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "fsm/fsm.h"
#include "src/node/bgsnap.h"
#include "src/node/msgs.h"

#define IDA_BACKUP_CALLS_MAX    16 /* calls waiting, and answered per copy */
#define IDA_BACKUP_COPIES       2
#define IDA_BACKUP_CHUNK_BYTES  (1u << 20)
#define IDA_BACKUP_KEEP_MS      30000
#define IDA_BACKUP_CHILD_MAX_MS 120000

struct ida_node;

struct ida__backup_call
{
    uint8_t cid[16];
    uint64_t seq; /* the request's seq: the answer goes out under it */
};

struct ida__backup_copy
{
    const uint8_t *data; /* NULL: no copy */
    size_t len;
    int mapped; /* bgsnap's mapping, not ida_malloc'd */
    ida_index index;
    ida_term term;
    uint64_t read_ms; /* made, or a chunk of it sent */
    struct ida__backup_call answered[IDA_BACKUP_CALLS_MAX]; /* a ring */
    size_t n_answered;
};

struct ida__backup_waiter
{
    struct ida__backup_call call;
    uint64_t conn;  /* its latest attempt */
    ida_index need; /* its ReadIndex */
};

struct ida__backups
{
    struct ida_node *node;
    struct ida__backup_copy copies[IDA_BACKUP_COPIES]; /* [0] the newest */
    struct ida_bgsnap child;
    struct ida__backup_waiter waiting[IDA_BACKUP_CALLS_MAX];
    size_t n_waiting;
};

void ida__backups_init(struct ida__backups *b, struct ida_node *n);

/* Serve the SnapshotRead @rd (its index applied in @f, at @term). */
void ida__backups_read(struct ida__backups *b,
                       const struct ida_fsm *f,
                       ida_term term,
                       const struct ida_nm_read *rd);

/* Look at the child; answer the waiting with a finished copy; drop copies
 * unread for IDA_BACKUP_KEEP_MS. Never blocks. */
void ida__backups_poll(struct ida__backups *b,
                       const struct ida_fsm *f,
                       ida_term term);

/* This node is no longer leader. */
void ida__backups_leadership_lost(struct ida__backups *b);

/* Whether a child is encoding a copy (the periodic snapshot waits). */
int ida__backups_busy(const struct ida__backups *b);

void ida__backups_close(struct ida__backups *b);

#endif /* IDA_NODE_BACKUP_COPY_H */
