#include "src/common/frame.h"

#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

static int type_known(uint8_t t)
{
    return t == IDA_FRAME_CLIENT_REQUEST || t == IDA_FRAME_CLIENT_RESPONSE ||
           t == IDA_FRAME_PEER;
}

int ida_frame_decoder_init(struct ida_frame_decoder *d,
                           uint32_t max_payload_bytes)
{
    IDA_ASSERT(d != NULL);
    if (max_payload_bytes == 0 ||
        max_payload_bytes > IDA_FRAME_PAYLOAD_BYTES_MAX) {
        return IDA_EINVAL;
    }
    memset(d, 0, sizeof(*d));
    d->max_payload_bytes = max_payload_bytes;
    return 0;
}

/* Free the payload buffer and give its bytes back to the budget. */
static void release_buf(struct ida_frame_decoder *d)
{
    if (d->budget != NULL) {
        IDA_ASSERT(d->budget->used >= d->buf_cap);
        d->budget->used -= d->buf_cap;
    }
    ida_free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
}

void ida_frame_decoder_close(struct ida_frame_decoder *d)
{
    release_buf(d);
}

void ida_frame_decoder_set_budget(struct ida_frame_decoder *d,
                                  struct ida_frame_budget *b)
{
    IDA_ASSERT(d->buf_cap == 0);
    d->budget = b;
}

int ida_frame_decoder_idle(const struct ida_frame_decoder *d)
{
    return d->header_have == 0;
}

static int fail(struct ida_frame_decoder *d,
                int code,
                const char *fmt,
                unsigned long v)
{
    d->failed = code;
    snprintf(d->errmsg, sizeof(d->errmsg), fmt, v);
    return code;
}

/* Validate a complete header. Nothing is allocated here: the buffer grows
 * with the bytes that arrive (grow_buf). */
static int start_payload(struct ida_frame_decoder *d)
{
    const uint8_t *h = d->header;
    if (h[0] != IDA_FRAME_MAGIC) {
        return fail(d, IDA_EPROTO, "bad frame magic 0x%02lx", h[0]);
    }
    if (!type_known(h[1])) {
        return fail(d, IDA_EPROTO, "unknown frame type %lu", h[1]);
    }
    uint32_t len = ((uint32_t)h[2] << 24) | ((uint32_t)h[3] << 16) |
                   ((uint32_t)h[4] << 8) | (uint32_t)h[5];
    if (len > d->max_payload_bytes) {
        return fail(d, IDA_ETOOBIG, "frame of %lu bytes exceeds the maximum",
                    len);
    }
    d->type = h[1];
    d->len = len;
    d->have = 0;
    return 0;
}

/* Make room for @need payload bytes of the current frame: double the
 * buffer (at least 4 KiB), never past the frame's length. */
static int grow_buf(struct ida_frame_decoder *d, uint32_t need)
{
    if (need <= d->buf_cap) {
        return 0;
    }
    uint64_t cap = d->buf_cap < 2048 ? 4096 : (uint64_t)d->buf_cap * 2;
    if (cap < need) {
        cap = need;
    }
    if (cap > d->len) {
        cap = d->len;
    }
    size_t more = (size_t)cap - d->buf_cap;
    if (d->budget != NULL && more > d->budget->max - d->budget->used) {
        return fail(d, IDA_EBUSY,
                    "buffered input of all connections at its cap (%lu "
                    "bytes)",
                    (unsigned long)d->budget->max);
    }
    uint8_t *nb = ida_realloc(d->buf, (size_t)cap);
    if (nb == NULL) {
        return fail(d, IDA_ENOMEM, "no memory for a %lu byte frame", d->len);
    }
    if (d->budget != NULL) {
        d->budget->used += more;
    }
    d->buf = nb;
    d->buf_cap = (uint32_t)cap;
    return 0;
}

int ida_frame_decoder_feed(struct ida_frame_decoder *d,
                           const uint8_t *data,
                           size_t len,
                           ida_frame_cb cb,
                           void *arg)
{
    IDA_ASSERT(d != NULL && cb != NULL);
    IDA_ASSERT(data != NULL || len == 0);
    if (d->failed != 0) {
        return d->failed;
    }
    size_t pos = 0;
    for (;;) {
        if (d->header_have < IDA_FRAME_HEADER_BYTES) {
            size_t n = IDA_FRAME_HEADER_BYTES - d->header_have;
            if (n > len - pos) {
                n = len - pos;
            }
            memcpy(d->header + d->header_have, data + pos, n);
            d->header_have += n;
            pos += n;
            /* Reject a bad magic byte as soon as it arrives. */
            if (d->header_have >= 1 && d->header[0] != IDA_FRAME_MAGIC) {
                return fail(d, IDA_EPROTO, "bad frame magic 0x%02lx",
                            d->header[0]);
            }
            if (d->header_have < IDA_FRAME_HEADER_BYTES) {
                return 0;
            }
            int rv = start_payload(d);
            if (rv != 0) {
                return rv;
            }
        }
        size_t n = d->len - d->have;
        if (n > len - pos) {
            n = len - pos;
        }
        if (n > 0) {
            int rv = grow_buf(d, d->have + (uint32_t)n);
            if (rv != 0) {
                return rv;
            }
            memcpy(d->buf + d->have, data + pos, n);
        }
        d->have += (uint32_t)n;
        pos += n;
        if (d->have < d->len) {
            return 0;
        }
        /* A whole frame: reset before the callback, which may feed again. */
        d->header_have = 0;
        /* Never hand out NULL, even for an empty payload. */
        static const uint8_t empty[1];
        const uint8_t *payload = d->buf != NULL ? d->buf : empty;
        int rv = cb(arg, (enum ida_frame_type)d->type, payload, d->len);
        if (rv != 0) {
            d->failed = rv;
            snprintf(d->errmsg, sizeof(d->errmsg), "frame handler failed");
            return rv;
        }
        /* A large buffer is not kept for the frames that follow (unless
         * the callback already started one in it). */
        if (d->buf_cap > IDA_FRAME_KEEP_BYTES && d->header_have == 0) {
            release_buf(d);
        }
        if (pos == len) {
            return 0;
        }
    }
}

int ida_frame_header_encode(uint8_t out[IDA_FRAME_HEADER_BYTES],
                            enum ida_frame_type type,
                            size_t len)
{
    if (!type_known((uint8_t)type)) {
        return IDA_EINVAL;
    }
    if (len > IDA_FRAME_PAYLOAD_BYTES_MAX) {
        return IDA_ETOOBIG;
    }
    out[0] = IDA_FRAME_MAGIC;
    out[1] = (uint8_t)type;
    out[2] = (uint8_t)(len >> 24);
    out[3] = (uint8_t)(len >> 16);
    out[4] = (uint8_t)(len >> 8);
    out[5] = (uint8_t)len;
    return 0;
}
