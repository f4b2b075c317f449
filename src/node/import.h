/* Seeding a new cluster from a backup file of any size: `idallocd
 * --import-backup FILE [--advance-sequences N]` writes a new data
 * directory for one node that holds the backup's pools, as a one-node
 * cluster; the other nodes of the cluster file then join it (README,
 * Runbook, "Forced recovery").
 *
 * DESIGN
 *
 * `idalloc snapshot restore` sends the backup as one write, so it goes
 * through the log like any other, on every node at once. But a log entry is
 * one frame (4 MiB): a backup of more than about 150,000 holdings could
 * not be restored at all, and the forced recovery after a lost majority
 * failed exactly where it matters, at scale (10 M allocations make a
 * 180 MB backup). The import takes the other road. It builds the state a
 * restore would (ida_fsm_import(): the backup's pools, sequences advanced,
 * no sessions) and stores it as the snapshot at index 1, term 1, of a
 * membership of this node alone, bound to the incarnation of its new
 * directory. Started, the node leads that one-node cluster at once. The
 * cluster file's other nodes, started with new directories, hear a node
 * with a membership and join it as new incarnations; the leader adds and
 * promotes them (auto_rejoin; `member add` and `member promote` without
 * it), each receiving the state by InstallSnapshot, in chunks. No second
 * copy of the backup is ever loaded, so no two nodes can start from
 * different ones.
 *
 * What the restore checks, the import checks: the file (magic, CRC,
 * format), the state (everything ida_fsm_restore() checks), a cluster name
 * other than the backup's (a restore makes a new cluster), sequences that
 * the advance would carry past 2^64. And the directory: only a node
 * directory that does not exist yet (or is empty) is written, so the import
 * never overwrites a node's state.
 *
 * A crash cannot leave half an import where a node would start: the
 * directory is built under DATA/.import-nodeID, then renamed to DATA/nodeID
 * in one step (and the data directory fsynced). A leftover staging
 * directory is removed by the next import.
 */
#ifndef IDA_NODE_IMPORT_H
#define IDA_NODE_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "src/node/node.h"

struct ida_node_import_info
{
    char from_cluster[65]; /* the backup's cluster */
    uint64_t from_index;   /* the backup's index and term */
    uint64_t from_term;
    size_t pools;       /* pools in the state */
    size_t state_bytes; /* size of the snapshot stored */
    char dir[4200];     /* the node's new data directory */
};

/* Import the backup file @file into a new data directory for node
 * @o->node_id of the cluster file @o->config_path, sequence pools moved
 * @advance on. Returns 0 with @info filled, or an error with one line in
 * @errmsg (IDA_ERRMSG_MAX):
 *   IDA_ECONFIG    bad cluster file or node
 *   IDA_EINVAL     the backup was taken from a cluster of this file's name
 *   IDA_EEXIST     the node's data directory exists and is not empty
 *   IDA_EFOREIGN, IDA_EVERSION, IDA_ECORRUPT
 *                  not a backup, a newer format, damaged (file or state)
 *   IDA_EEXHAUSTED a sequence pool would pass the end of 64 bits
 *   IDA_EIO, IDA_ENOMEM, or the storage's codes.
 * On error nothing is left where a node would start. */
int ida_node_import(const struct ida_node_opts *o,
                    const char *file,
                    uint64_t advance,
                    struct ida_node_import_info *info,
                    char *errmsg);

#endif /* IDA_NODE_IMPORT_H */
