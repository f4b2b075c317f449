/* Scalar types and records shared by the Raft core, storage and the node.
 *
 * Dependency-free, so the pure cores may include it. This header is the
 * contract between raft/ (which produces entries and hard state to persist)
 * and storage/ (which persists them): fields are only ever added.
 */
#ifndef IDA_TYPES_H
#define IDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t ida_term;
typedef uint64_t ida_index;
typedef uint32_t ida_node_id; /* 0 means "none" (no vote, no leader) */

/* Values match proto EntryType. */
enum ida_entry_type {
    IDA_ENTRY_NORMAL = 0, /* data: an encoded idalloc.CommandBatch */
    IDA_ENTRY_NOOP = 1,   /* data: empty; appended by each new leader */
    IDA_ENTRY_CONFIG = 2, /* data: an encoded idalloc.ClusterConfig */
};

/* One log entry. Who owns @data is stated by each function that takes or
 * returns entries. */
struct ida_entry
{
    ida_term term;
    ida_index index;
    enum ida_entry_type type;
    uint8_t *data;
    size_t len;
};

/* What Raft must not forget across a crash (Figure 2: currentTerm,
 * votedFor). @commit is optional to persist (it can be relearnt) and is kept
 * only so a restarted node can apply known-committed entries early. */
struct ida_hard_state
{
    ida_term term;
    ida_node_id vote;
    ida_index commit;
};

#endif /* IDA_TYPES_H */
