/* The protobuf wire format, written and read by hand for snapshots. */
#include "fsm/wire.h"

#include <string.h>

#include "base/assert.h"

/* --- writer --------------------------------------------------------------- */

static void w_raw(struct ida__wbuf *w, const void *src, size_t n)
{
    if (w->p != NULL) {
        memcpy(w->p + w->len, src, n);
    }
    w->len += n;
}

void ida__w_varint(struct ida__wbuf *w, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    while (v >= 0x80) {
        b[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b[n++] = (uint8_t)v;
    w_raw(w, b, n);
}

void ida__w_key(struct ida__wbuf *w, uint32_t field, int type)
{
    ida__w_varint(w, ((uint64_t)field << 3) | (uint64_t)type);
}

/* proto3: a zero scalar is not written. */
void ida__w_u64(struct ida__wbuf *w, uint32_t field, uint64_t v)
{
    if (v != 0) {
        ida__w_key(w, field, IDA__WT_VARINT);
        ida__w_varint(w, v);
    }
}

void ida__w_fixed64(struct ida__wbuf *w, uint32_t field, uint64_t v)
{
    if (v == 0) {
        return;
    }
    ida__w_key(w, field, IDA__WT_I64);
    if (w->p != NULL) {
        for (int b = 0; b < 8; b++) {
            w->p[w->len + (size_t)b] = (uint8_t)(v >> (8 * b));
        }
    }
    w->len += 8;
}

void ida__w_bytes(struct ida__wbuf *w,
                  uint32_t field,
                  const void *data,
                  size_t len)
{
    if (len != 0) {
        ida__w_key(w, field, IDA__WT_LEN);
        ida__w_varint(w, len);
        w_raw(w, data, len);
    }
}

/* A present sub-message is written even when empty. */
void ida__w_msg(struct ida__wbuf *w,
                uint32_t field,
                ida__enc_fn fn,
                const void *arg)
{
    struct ida__wbuf count = {NULL, 0};
    fn(&count, arg);
    ida__w_key(w, field, IDA__WT_LEN);
    ida__w_varint(w, count.len);
    if (w->p == NULL) {
        w->len += count.len; /* counting: no need to run @fn again */
        return;
    }
    size_t before = w->len;
    fn(w, arg);
    IDA_ASSERT(w->len - before == count.len);
}

/* A sub-message whose size is known already. */
void ida__w_msg_sized(struct ida__wbuf *w,
                      uint32_t field,
                      ida__enc_fn fn,
                      const void *arg,
                      size_t size)
{
    ida__w_key(w, field, IDA__WT_LEN);
    ida__w_varint(w, size);
    if (w->p == NULL) {
        w->len += size;
        return;
    }
    size_t before = w->len;
    fn(w, arg);
    IDA_ASSERT(w->len - before == size);
}

/* --- reader --------------------------------------------------------------- */

int ida__r_varint_any(struct ida__rbuf *r, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (r->p == r->end) {
            return -1;
        }
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

int ida__r_field_any(struct ida__rbuf *r, struct ida__field *f)
{
    if (r->p == r->end) {
        return 0;
    }
    uint64_t key;
    if (ida__r_varint_any(r, &key) != 0 || (key >> 3) == 0 ||
        (key >> 3) > UINT32_MAX) {
        return -1;
    }
    f->num = (uint32_t)(key >> 3);
    f->type = (int)(key & 7);
    switch (f->type) {
        case IDA__WT_VARINT:
            return ida__r_varint(r, &f->v) == 0 ? 1 : -1;
        case IDA__WT_I64:
        case IDA__WT_I32: {
            size_t n = f->type == IDA__WT_I64 ? 8 : 4;
            if ((size_t)(r->end - r->p) < n) {
                return -1;
            }
            r->p += n;
            return 1;
        }
        case IDA__WT_LEN: {
            uint64_t n;
            if (ida__r_varint(r, &n) != 0 || n > (uint64_t)(r->end - r->p)) {
                return -1;
            }
            f->sub.p = r->p;
            f->sub.end = r->p + n;
            r->p += n;
            return 1;
        }
        default:
            return -1;
    }
}
