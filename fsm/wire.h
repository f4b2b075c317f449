/* The protobuf wire format, written and read by hand for snapshots
 * (fsm/snap_encode.c, fsm/snap_decode.c). Internal to fsm/. */
#ifndef IDA_FSM_WIRE_H
#define IDA_FSM_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum { IDA__WT_VARINT = 0, IDA__WT_I64 = 1, IDA__WT_LEN = 2, IDA__WT_I32 = 5 };

struct ida__wbuf
{
    uint8_t *p; /* NULL: counting only */
    size_t len;
};

typedef void (*ida__enc_fn)(struct ida__wbuf *w, const void *arg);

void ida__w_varint(struct ida__wbuf *w, uint64_t v);
void ida__w_key(struct ida__wbuf *w, uint32_t field, int type);
/* proto3: a zero scalar is not written. */
void ida__w_u64(struct ida__wbuf *w, uint32_t field, uint64_t v);
/* proto3 fixed64 (little-endian); zero is not written. */
void ida__w_fixed64(struct ida__wbuf *w, uint32_t field, uint64_t v);
void ida__w_bytes(struct ida__wbuf *w,
                  uint32_t field,
                  const void *data,
                  size_t len);
/* A present sub-message is written even when empty. */
void ida__w_msg(struct ida__wbuf *w,
                uint32_t field,
                ida__enc_fn fn,
                const void *arg);
/* A sub-message whose size is known already. */
void ida__w_msg_sized(struct ida__wbuf *w,
                      uint32_t field,
                      ida__enc_fn fn,
                      const void *arg,
                      size_t size);

struct ida__rbuf
{
    const uint8_t *p, *end;
};

/* One field: its number, wire type, and for IDA__WT_VARINT the value, for
 * IDA__WT_LEN the sub-buffer. Fixed-width fields are skipped (none are used).
 */
struct ida__field
{
    uint32_t num;
    int type;
    uint64_t v;
    struct ida__rbuf sub;
};

int ida__r_varint(struct ida__rbuf *r, uint64_t *v);
/* 1: a field read, 0: end of buffer, -1: malformed. */
int ida__r_field(struct ida__rbuf *r, struct ida__field *f);

/* The checksum trailer of a snapshot: field 7, fixed64. */
#define IDA__CHECKSUM_KEY   ((7u << 3) | IDA__WT_I64)
#define IDA__CHECKSUM_BYTES 9

#endif /* IDA_FSM_WIRE_H */
