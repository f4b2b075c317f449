/* Forced recovery after a lost majority: export what one node's data
 * directory holds as a backup file (src/common/backup.h), with the node
 * stopped, so that a new cluster can be seeded from it (idalloc snapshot
 * restore --advance-sequences N; README, Runbook).
 *
 * DESIGN
 *
 * A cluster that lost a majority of its voters cannot elect a leader, so
 * `idalloc snapshot save` (which asks the leader) cannot run. What is left
 * is the survivors' data directories. The export rebuilds the state machine
 * from one of them: its snapshot, then every entry of its log after it,
 * committed or not as far as this node knows. Applying the entries beyond
 * the node's own commit index is deliberate: the node learns the commit
 * index after the fact, so entries past it may well have been committed and
 * acknowledged; an entry that was not only consumes ids (its allocations
 * take ids nobody was told about, its frees release ids whose holders asked
 * for exactly that). Applying fewer would hand out again ids that clients
 * were told they hold.
 *
 * What no export can give back: entries that only the lost nodes held.
 * Their allocations may be handed out again by the new cluster; the
 * restore's --advance-sequences covers sequence pools, bounded and prefix
 * pools restart from what this node held. The operator picks the survivor
 * with the longest log (the summary line says its last index and term).
 *
 * The directory is locked like a running node's (a running idallocd on it
 * is refused) and must hold a node's state (a missing or new directory is
 * refused before anything is created). The export writes nothing into the
 * directory but the start count of storage (storage/storage.h).
 */
#ifndef IDA_NODE_EXPORT_H
#define IDA_NODE_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "src/node/node.h"

struct ida_node_export_info
{
    uint64_t index;     /* the state's applied index */
    uint64_t term;      /* the term of that entry */
    uint64_t commit;    /* the commit index this node had stored */
    uint64_t snapshot;  /* the index of its snapshot (0: none) */
    size_t pools;       /* pools in the state */
    size_t state_bytes; /* size of the state written */
};

/* Export node @o->node_id's data directory into the backup file @file
 * (written atomically). Returns 0 with @info filled, or an error with one
 * line in @errmsg (IDA_ERRMSG_MAX): IDA_ECONFIG (bad cluster file or node),
 * IDA_ENOTFOUND (no data directory with state), IDA_EIO (in use by a
 * running node, cannot read or write), the storage's codes for a damaged
 * or untrusted directory, IDA_ECORRUPT (a log entry or the snapshot does
 * not apply), IDA_ENOMEM. */
int ida_node_export(const struct ida_node_opts *o,
                    const char *file,
                    struct ida_node_export_info *info,
                    char *errmsg);

#endif /* IDA_NODE_EXPORT_H */
