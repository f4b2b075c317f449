/* Whether two decoded CommandBatch messages are the same, field by field,
 * as the state machine reads them (fsm/batch.c's hand reader against
 * protobuf-c): used by tests/fsm/test_fsm_batch.c and
 * tests/fuzz/fuzz_batch.c. Header-only so the fuzz harness needs no test
 * library. */
#ifndef IDA_TEST_BATCH_EQ_H
#define IDA_TEST_BATCH_EQ_H

#include <stdbool.h>
#include <string.h>

#include "proto/idalloc.pb-c.h"

/* Same length, same bytes, and NULL data exactly when empty on both. */
static inline bool be_bytes(ProtobufCBinaryData a, ProtobufCBinaryData b)
{
    return a.len == b.len && (a.data == NULL) == (b.data == NULL) &&
           (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

static inline bool be_base(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    return a->descriptor == b->descriptor &&
           a->n_unknown_fields == b->n_unknown_fields;
}

static inline bool be_command(const Idalloc__Command *a,
                              const Idalloc__Command *b)
{
    if (!be_base(&a->base, &b->base) || !be_bytes(a->client_id, b->client_id) ||
        a->request_seq != b->request_seq || a->ack_below != b->ack_below ||
        a->op_case != b->op_case) {
        return false;
    }
    switch (a->op_case) {
        case IDALLOC__COMMAND__OP__NOT_SET:
            return true;
        case IDALLOC__COMMAND__OP_ALLOC:
            return be_base(&a->alloc->base, &b->alloc->base) &&
                   be_bytes(a->alloc->pool, b->alloc->pool) &&
                   be_bytes(a->alloc->tag, b->alloc->tag);
        case IDALLOC__COMMAND__OP_FREE:
            return be_base(&a->free->base, &b->free->base) &&
                   be_bytes(a->free->pool, b->free->pool) &&
                   a->free->id == b->free->id &&
                   be_bytes(a->free->tag, b->free->tag);
        case IDALLOC__COMMAND__OP_RESERVE:
            return be_base(&a->reserve->base, &b->reserve->base) &&
                   be_bytes(a->reserve->pool, b->reserve->pool) &&
                   a->reserve->count == b->reserve->count;
        case IDALLOC__COMMAND__OP_PREFIX_ALLOC:
            return be_base(&a->prefix_alloc->base, &b->prefix_alloc->base) &&
                   be_bytes(a->prefix_alloc->pool, b->prefix_alloc->pool) &&
                   be_bytes(a->prefix_alloc->tag, b->prefix_alloc->tag);
        case IDALLOC__COMMAND__OP_REGISTER_CLIENT:
            return be_base(&a->register_client->base,
                           &b->register_client->base);
        default:
            return false; /* the hand reader never builds the others */
    }
}

static inline bool be_batch(const Idalloc__CommandBatch *a,
                            const Idalloc__CommandBatch *b)
{
    if (!be_base(&a->base, &b->base) || a->version != b->version ||
        a->timestamp_ms != b->timestamp_ms || a->n_commands != b->n_commands ||
        (a->commands == NULL) != (b->commands == NULL)) {
        return false;
    }
    for (size_t i = 0; i < a->n_commands; i++) {
        if (!be_command(a->commands[i], b->commands[i])) {
            return false;
        }
    }
    return true;
}

#endif /* IDA_TEST_BATCH_EQ_H */
