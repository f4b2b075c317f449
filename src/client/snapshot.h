/* Backup and restore through the client (libidalloc internals, not
 * installed; used by `idalloc snapshot`). README, "Backup and restore". */
#ifndef IDA_CLIENT_SNAPSHOT_H
#define IDA_CLIENT_SNAPSHOT_H

#include <stdint.h>

#include "idalloc.h"
#include "src/common/backup.h"

/* Read the whole state from the leader: a copy taken at its applied index
 * after a ReadIndex round (so it holds every write acknowledged before the
 * call), in chunks. *out gets the state, its index, term and the cluster's
 * name (free with ida_backup_free()). A copy gone in the middle (a leader
 * change, newer copies replaced it) starts the backup again (up to 3
 * times). Returns 0 or an error
 * as for reads (IDA_EPROTO for an inconsistent answer); the detail is in
 * @call (not NULL). */
int ida_client_snapshot_read(struct idalloc_client *c,
                             struct ida_backup *out,
                             struct idalloc_call *call);

/* Load @b's pools into the cluster (which must have none and another name
 * than b->cluster), every sequence pool moved @advance on. *pools gets the
 * number of pools restored. Returns 0 or an error as for writes:
 * IDA_EEXIST (the cluster has pools), IDA_EINVAL (the backup is of this
 * cluster), IDA_ECORRUPT (the state does not restore), IDA_EEXHAUSTED
 * (@advance passes the end of a sequence), IDA_ETOOBIG (larger than a
 * request frame). Nothing changed on a definite error. A write of @call's
 * session (not NULL): an unknown outcome leaves @call UNKNOWN, and calling
 * again with it repeats the same request (exactly once). */
int ida_client_restore(struct idalloc_client *c,
                       const struct ida_backup *b,
                       uint64_t advance,
                       uint32_t *pools,
                       struct idalloc_call *call);

#endif /* IDA_CLIENT_SNAPSHOT_H */
