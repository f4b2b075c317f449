#include "src/client/snapshot.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/heap.h"
#include "src/client/client.h"

/* One chunk: 0 with *r holding a SnapshotChunk (caller frees), or the
 * error. */
static int chunk(struct idalloc_client *c,
                 uint64_t index,
                 uint64_t offset,
                 struct idalloc_call *call,
                 Idalloc__ClientResponse **r)
{
    Idalloc__ClientRequest req = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__SnapshotRead op = IDALLOC__SNAPSHOT_READ__INIT;
    op.index = index;
    op.offset = offset;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_SNAPSHOT_READ;
    req.snapshot_read = &op;
    int rv = ida__client_call(c, &req, 0, call, r);
    if (rv != 0) {
        return rv;
    }
    Idalloc__CommandResult *res = (*r)->result;
    if (res->error != 0) {
        rv = (int)res->error;
        ida__call_error(
            call, "%s",
            res->error_msg[0] != '\0' ? res->error_msg : idalloc_strerror(rv));
    } else if (res->result_case !=
               IDALLOC__COMMAND_RESULT__RESULT_SNAPSHOT_CHUNK) {
        rv = IDA_EPROTO;
        ida__call_error(call, "the server answered with another result kind");
    }
    if (rv != 0) {
        idalloc__client_response__free_unpacked(*r, NULL);
    }
    return rv;
}

static int read_once(struct idalloc_client *c,
                     struct ida_backup *out,
                     struct idalloc_call *call)
{
    uint8_t *buf = NULL;
    uint64_t index = 0, total = 0, off = 0;
    int rv;
    do {
        Idalloc__ClientResponse *r;
        rv = chunk(c, index, off, call, &r);
        if (rv != 0) {
            break;
        }
        const Idalloc__SnapshotChunk *ch = r->result->snapshot_chunk;
        if (off == 0) {
            /* The first chunk says what the whole copy is. */
            if (ch->index == 0 || ch->total_size == 0 ||
                ch->total_size > IDA_BACKUP_FILE_BYTES_MAX ||
                ch->cluster[0] == '\0' ||
                strlen(ch->cluster) > IDA_BACKUP_CLUSTER_MAX) {
                rv = IDA_EPROTO;
            } else if ((buf = ida_malloc((size_t)ch->total_size)) == NULL) {
                rv = IDA_ENOMEM;
            } else {
                index = ch->index;
                total = ch->total_size;
                out->index = ch->index;
                out->term = ch->term;
                snprintf(out->cluster, sizeof(out->cluster), "%s", ch->cluster);
            }
        } else if (ch->index != index || ch->total_size != total) {
            rv = IDA_EPROTO;
        }
        if (rv == 0 && (ch->offset != off || ch->data.len == 0 ||
                        ch->data.len > total - off)) {
            rv = IDA_EPROTO;
        }
        if (rv == 0) {
            memcpy(buf + off, ch->data.data, ch->data.len);
            off += ch->data.len;
        } else if (rv == IDA_EPROTO) {
            ida__call_error(call, "a backup chunk does not fit the copy");
        }
        idalloc__client_response__free_unpacked(r, NULL);
    } while (rv == 0 && off < total);
    if (rv != 0) {
        ida_free(buf);
        return rv;
    }
    out->state = buf;
    out->state_len = (size_t)total;
    return 0;
}

int ida_client_snapshot_read(struct idalloc_client *c,
                             struct ida_backup *out,
                             struct idalloc_call *call)
{
    memset(out, 0, sizeof(*out));
    int rv = IDA_ENOTFOUND;
    /* ENOTFOUND: the copy is gone (replaced by newer ones, unread for too
     * long, a leader change): start over. */
    for (int attempt = 0; attempt < 3 && rv == IDA_ENOTFOUND; attempt++) {
        rv = read_once(c, out, call);
    }
    if (rv == IDA_ENOTFOUND) {
        /* Transient (a leader change, newer copies): say so. */
        ida__call_error(call,
                        "the leader's copy of the state was replaced three "
                        "times during the backup: try again");
        rv = IDA_EBUSY;
    }
    if (rv == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        out->version = IDA_BACKUP_VERSION;
        out->created_unix_ms =
            (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    }
    return rv;
}

int ida_client_restore(struct idalloc_client *c,
                       const struct ida_backup *b,
                       uint64_t advance,
                       uint32_t *pools,
                       struct idalloc_call *call)
{
    Idalloc__ClientRequest req = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__Restore op = IDALLOC__RESTORE__INIT;
    op.state.data = b->state;
    op.state.len = b->state_len;
    op.from_cluster = (char *)b->cluster;
    op.from_index = b->index;
    op.advance_sequences = advance;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_RESTORE;
    req.restore = &op;
    /* A write: a fresh call, or a repeat of one whose outcome is unknown
     * (the same request id). */
    if (call->state != IDALLOC_CALL_UNKNOWN) {
        call->seq = 0;
        call->state = IDALLOC_CALL_NEW;
    }
    int replay = call->state == IDALLOC_CALL_UNKNOWN;
    call->errmsg[0] = '\0';
    Idalloc__ClientResponse *r;
    int rv = ida__client_call(c, &req, 1, call, &r);
    if (rv != 0) {
        return ida__client_finish(c, call, rv, 1, replay);
    }
    Idalloc__CommandResult *res = r->result;
    if (res->error != 0) {
        rv = (int)res->error;
        ida__call_error(
            call, "%s",
            res->error_msg[0] != '\0' ? res->error_msg : idalloc_strerror(rv));
    } else if (res->result_case != IDALLOC__COMMAND_RESULT__RESULT_RESTORE) {
        rv = IDA_EPROTO;
        ida__call_error(call, "the server answered with another result kind");
    } else {
        *pools = res->restore->pools;
    }
    idalloc__client_response__free_unpacked(r, NULL);
    return ida__client_finish(c, call, rv, 1, replay);
}
