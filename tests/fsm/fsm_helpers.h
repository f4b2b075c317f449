/* Test support for fsm/: building and applying CommandBatch entries. */
#ifndef IDA_TEST_FSM_HELPERS_H
#define IDA_TEST_FSM_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsm/fsm.h"

#define FX_BATCH_MAX 256
#define FX_STR_MAX   (IDA_TAG_BYTES_MAX + 64)

/* One batch under construction; all memory inside (no allocation). */
struct fx_batch
{
    uint64_t timestamp_ms;
    uint32_t version; /* CommandBatch.version; 0: IDA_BATCH_VERSION */
    size_t n;
    Idalloc__Command cmd[FX_BATCH_MAX];
    Idalloc__Command *ptr[FX_BATCH_MAX];
    union {
        Idalloc__PoolCreate create;
        Idalloc__Alloc alloc;
        Idalloc__Free free;
        Idalloc__Reserve reserve;
        Idalloc__PrefixAlloc prefix;
        Idalloc__RegisterClient reg;
    } op[FX_BATCH_MAX];
    uint8_t cid[FX_BATCH_MAX][IDA_CLIENT_ID_BYTES];
    char pool[FX_BATCH_MAX][FX_STR_MAX];
    char tag[FX_BATCH_MAX][FX_STR_MAX];
};

/* When true (the default), every command built carries ack_below = its own
 * seq: the client wants no older answer kept, as a client that waits for
 * each answer would say. Tests of the session rules set it false (no floor
 * is sent) or set ack_below themselves. */
extern bool fx_auto_ack;

/* Client @client's 16-byte id (deterministic). */
void fx_client_id(uint64_t client, uint8_t out[IDA_CLIENT_ID_BYTES]);

void fx_batch_init(struct fx_batch *b, uint64_t timestamp_ms);
void fx_add_create(struct fx_batch *b,
                   uint64_t client,
                   uint64_t seq,
                   const char *name,
                   Idalloc__PoolKind kind,
                   uint64_t size);
void fx_add_alloc(struct fx_batch *b,
                  uint64_t client,
                  uint64_t seq,
                  const char *pool,
                  const char *tag);
void fx_add_free(struct fx_batch *b,
                 uint64_t client,
                 uint64_t seq,
                 const char *pool,
                 uint64_t id,
                 const char *tag);
void fx_add_reserve(struct fx_batch *b,
                    uint64_t client,
                    uint64_t seq,
                    const char *pool,
                    uint64_t count);
void fx_add_prefix(struct fx_batch *b,
                   uint64_t client,
                   uint64_t seq,
                   const char *pool,
                   const char *tag);

/* RegisterClient for @client (its answer is not kept: any seq). */
void fx_add_register(struct fx_batch *b, uint64_t client, uint64_t seq);
/* Register @client in its own batch; asserts it succeeded. */
void fx_register(struct ida_fsm *f, uint64_t client, uint64_t timestamp_ms);

/* The fingerprint the state machine keeps for command @i of @b. */
uint64_t fx_fingerprint(const struct fx_batch *b, size_t i);

/* Encode @b (malloc'd buffer, free with free()). */
uint8_t *fx_batch_pack(const struct fx_batch *b, size_t *len);

/* Apply @b as the next entry of @f; asserts that apply returns 0. */
void fx_apply(struct ida_fsm *f,
              const struct fx_batch *b,
              struct ida_fsm_applied *out);

/* One command in its own batch; returns a copy of its result. */
struct ida_fsm_result fx_one(struct ida_fsm *f, const struct fx_batch *b);

/* Snapshot of @f (malloc'd via ida_malloc; release with ida_free). */
uint8_t *fx_snapshot(const struct ida_fsm *f, size_t *len);

/* Field by field (structs have padding): true when equal. */
bool fx_result_eq(const struct ida_fsm_result *a,
                  const struct ida_fsm_result *b);

/* Pack @m (checksum field ignored) as a snapshot with a valid checksum, the
 * way a foreign but correct writer would. malloc'd; free with free(). */
uint8_t *fx_forge(const Idalloc__FsmState *m, size_t *len);

/* The benches' line on what the huge-page collapser did (base/collapse.h),
 * @tail (may be "") before its newline. */
void fx_print_collapser(const char *tail);

#endif
