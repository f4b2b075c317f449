/* The allocator state machine (fsm/) in the simulator: client requests
 * encoded as CommandBatch entries, result and snapshot hashes (see the
 * allocator section of tests/sim/sim_internal.h). */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"
#include "raft/raft.h"
#include "tests/sim/sim_internal.h"

static const char *const pool_names[3] = {"b", "s", "p"};

void sim__client_id(int client, uint8_t out[IDA_CLIENT_ID_BYTES])
{
    memset(out, 0, IDA_CLIENT_ID_BYTES);
    memcpy(out, "sim-client", 10);
    out[IDA_CLIENT_ID_BYTES - 1] = (uint8_t)(client + 1);
}

void sim__tag_name(char *buf, size_t n, int client, int tag)
{
    snprintf(buf, n, "c%d-t%d", client, tag);
}

/* A name or tag as a request's bytes field. */
static ProtobufCBinaryData sim_bin(const char *str)
{
    return (ProtobufCBinaryData){strlen(str), (uint8_t *)str};
}

/* One command (client @client, @seq) in a batch of its own, stamped with
 * the virtual clock (the session clock of fsm/). Returns an ida_malloc'd
 * buffer, or NULL (out of memory: s->oom is set). */
uint8_t *sim__cmd_encode(struct sim *s,
                         int client,
                         uint64_t seq,
                         const struct sim_req *r,
                         size_t *len)
{
    uint8_t cid[IDA_CLIENT_ID_BYTES];
    char tag[32];
    sim__client_id(client, cid);
    sim__tag_name(tag, sizeof(tag), client, r->tag);
    Idalloc__Command cmd;
    idalloc__command__init(&cmd);
    cmd.client_id.data = cid;
    cmd.client_id.len = sizeof(cid);
    cmd.request_seq = seq;
    /* One request at a time per client: it wants no answer below this one
     * (fsm.h, "Sessions"), so the session keeps one answer, and snapshots
     * stay the size of the allocator's state. */
    cmd.ack_below = seq;
    Idalloc__PoolCreate create;
    Idalloc__Alloc alloc;
    Idalloc__Free fr;
    Idalloc__Reserve reserve;
    Idalloc__PrefixAlloc prefix;
    switch (r->op) {
        case SIM_OP_CREATE_BOUNDED:
        case SIM_OP_CREATE_SEQUENCE:
        case SIM_OP_CREATE_PREFIX:
            idalloc__pool_create__init(&create);
            create.name = sim_bin(pool_names[r->op - SIM_OP_CREATE_BOUNDED]);
            create.kind = r->op == SIM_OP_CREATE_BOUNDED
                              ? IDALLOC__POOL_KIND__POOL_KIND_BOUNDED
                          : r->op == SIM_OP_CREATE_SEQUENCE
                              ? IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE
                              : IDALLOC__POOL_KIND__POOL_KIND_PREFIX;
            create.size = r->op == SIM_OP_CREATE_BOUNDED ? BOUNDED_SIZE : 0;
            cmd.op_case = IDALLOC__COMMAND__OP_POOL_CREATE;
            cmd.pool_create = &create;
            break;
        case SIM_OP_ALLOC:
            idalloc__alloc__init(&alloc);
            alloc.pool = sim_bin(pool_names[0]);
            alloc.tag = sim_bin(tag);
            cmd.op_case = IDALLOC__COMMAND__OP_ALLOC;
            cmd.alloc = &alloc;
            break;
        case SIM_OP_FREE:
            idalloc__free__init(&fr);
            fr.pool = sim_bin(pool_names[0]);
            fr.tag = sim_bin(tag);
            fr.id = r->id;
            cmd.op_case = IDALLOC__COMMAND__OP_FREE;
            cmd.free = &fr;
            break;
        case SIM_OP_RESERVE:
            idalloc__reserve__init(&reserve);
            reserve.pool = sim_bin(pool_names[1]);
            reserve.count = r->count;
            cmd.op_case = IDALLOC__COMMAND__OP_RESERVE;
            cmd.reserve = &reserve;
            break;
        case SIM_OP_PREFIX:
            idalloc__prefix_alloc__init(&prefix);
            prefix.pool = sim_bin(pool_names[2]);
            prefix.tag = sim_bin(tag);
            cmd.op_case = IDALLOC__COMMAND__OP_PREFIX_ALLOC;
            cmd.prefix_alloc = &prefix;
            break;
        case SIM_OP_LOOKUP:
            IDA_ASSERT(!"a lookup is a read, not a command");
    }
    /* Every write goes with a RegisterClient of its client in the same
     * batch (fsm.h, "Sessions": a write without a session never runs).
     * It creates the session once and refreshes it after; sessions are
     * never dropped in a simulated run (no hour of idleness, no full
     * table), so this stands for the library's register-once. Its seq,
     * UINT64_MAX, is never a proposal's, so its answer is not taken for
     * the write's. */
    Idalloc__Command reg;
    Idalloc__RegisterClient rc;
    idalloc__command__init(&reg);
    idalloc__register_client__init(&rc);
    reg.client_id = cmd.client_id;
    reg.request_seq = UINT64_MAX;
    reg.op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
    reg.register_client = &rc;
    Idalloc__Command *cmds[2] = {&reg, &cmd};
    Idalloc__CommandBatch b;
    idalloc__command_batch__init(&b);
    b.version = IDA_BATCH_VERSION;
    b.timestamp_ms = s->now;
    b.n_commands = 2;
    b.commands = cmds;
    *len = idalloc__command_batch__get_packed_size(&b);
    uint8_t *buf = ida_malloc(*len ? *len : 1);
    if (buf == NULL) {
        s->oom = true;
        return NULL;
    }
    IDA_ASSERT(idalloc__command_batch__pack(&b, buf) == *len);
    return buf;
}

uint64_t sim__bytes_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 0x100000001B3ULL;
    }
    return h;
}

/* Field by field (the struct has padding); never 0, so 0 can mean "no
 * answer yet". */
uint64_t sim__result_hash(const struct ida_fsm_result *r)
{
    uint64_t v[6] = {
        (uint64_t)r->error, (uint64_t)r->op,
        (uint64_t)r->flag,  r->id,
        r->count,           sim__bytes_hash(r->prefix, r->prefix_len)};
    uint64_t h = sim__bytes_hash((const uint8_t *)v, sizeof(v));
    return h ? h : 1;
}

/* The hash of @f's snapshot bytes (canonical: equal states, equal bytes).
 * False when out of memory (s->oom is set). */
bool sim__fsm_snapshot_hash(struct sim *s,
                            const struct ida_fsm *f,
                            uint64_t *hash)
{
    uint8_t *data;
    size_t len;
    if (ida_fsm_snapshot(f, &data, &len) != 0) {
        s->oom = true;
        return false;
    }
    *hash = sim__bytes_hash(data, len);
    ida_free(data);
    return true;
}
