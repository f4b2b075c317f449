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
 * directory. The cluster file's other nodes, started with new directories,
 * hear a node with a membership and join it as new incarnations; the leader
 * adds and promotes them (auto_rejoin; `member add` and `member promote`
 * without it), each receiving the state by InstallSnapshot, in chunks.
 *
 * THE FIRST START RULE. A one-node membership would let this node lead at
 * once, alone, whatever the other nodes of the cluster file hold: the very
 * thing the first start rule (src/node/member.h: a cluster is created only
 * when every node of the file answers that it is new) exists to stop. If
 * nodes 2 and 3 still held an earlier start's directories (a cluster of
 * this name created before the import), they would elect a leader of
 * their own, re-admit node 1 and overwrite it, and whatever node 1 had
 * acknowledged alone meanwhile would be handed out again; two imported
 * nodes would each lead a cluster of their own under one name. So the
 * import leaves a marker file, IDA_NODE_SEEDED_FILE, in the directory, and
 * a node that finds it at start is SEEDED (src/node/raft_member.c): it
 * takes no part in Raft (no ticks, no messages but Hello; its Hellos say it
 * has a membership, so no other node creates a cluster either; status says
 * `seeded`) until, for NODE_SEED_QUIET_MS (src/node/member.h), every other
 * node of the cluster file answered that it is new and no node at all
 * showed it holds a membership (any Raft message counts: a running cluster
 * that names this node reaches it). Then it removes the marker (durably)
 * and leads. A node that answers with a membership of its own keeps it
 * waiting, and the log says which nodes to stop and give new directories.
 * A cluster file of this node alone opens after the quiet time.
 *
 * What this does not cover: a cluster that names this node but cannot
 * reach it during the quiet time, and nodes of the file that are down
 * (they must answer: the node waits for them).
 */
#ifndef IDA_NODE_IMPORT_H
#define IDA_NODE_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "src/node/node.h"

/* The marker of a directory seeded and not yet started with the rest of
 * its cluster (above, THE FIRST START RULE). */
#define IDA_NODE_SEEDED_FILE "SEEDED"

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
