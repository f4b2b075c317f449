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

/* The readers below, whole; the inline ones take the common one-byte case
 * themselves (a snapshot holds tens of millions of fields) and call these
 * for the rest. */
int ida__r_varint_any(struct ida__rbuf *r, uint64_t *v);
int ida__r_field_any(struct ida__rbuf *r, struct ida__field *f);

static inline int ida__r_varint(struct ida__rbuf *r, uint64_t *v)
{
    if (r->p != r->end && *r->p < 0x80) {
        *v = *r->p++;
        return 0;
    }
    return ida__r_varint_any(r, v);
}

/* 1: a field read, 0: end of buffer, -1: malformed. */
static inline int ida__r_field(struct ida__rbuf *r, struct ida__field *f)
{
    /* A one-byte key of field 1..15, then a one-byte value or length. */
    if (r->end - r->p >= 2 && r->p[0] >= 8 && r->p[0] < 0x80 &&
        r->p[1] < 0x80) {
        uint8_t key = r->p[0], b = r->p[1];
        if ((key & 7) == IDA__WT_VARINT) {
            f->num = key >> 3;
            f->type = IDA__WT_VARINT;
            f->v = b;
            r->p += 2;
            return 1;
        }
        if ((key & 7) == IDA__WT_LEN && b <= r->end - r->p - 2) {
            f->num = key >> 3;
            f->type = IDA__WT_LEN;
            f->sub.p = r->p + 2;
            f->sub.end = r->p + 2 + b;
            r->p += 2 + b;
            return 1;
        }
    }
    return ida__r_field_any(r, f);
}

/* The checksum trailer of a snapshot: field 7, fixed64. */
#define IDA__CHECKSUM_KEY   ((7u << 3) | IDA__WT_I64)
#define IDA__CHECKSUM_BYTES 9

#endif /* IDA_FSM_WIRE_H */
