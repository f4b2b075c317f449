/* Length-prefixed frames on a byte stream.
 *
 * DESIGN: a frame is a 6-byte header followed by a payload:
 *
 *   byte 0     IDA_FRAME_MAGIC (0xA1): catches a foreign protocol at once
 *   byte 1     frame type (enum ida_frame_type)
 *   bytes 2-5  payload length, unsigned 32-bit big-endian
 *   payload    a protobuf message of the type's kind (proto/idalloc.proto)
 *
 * The decoder accepts bytes in arbitrary chunks (one byte at a time, many
 * frames at once) and checks magic, type and length against the decoder's
 * maximum *before* allocating anything, so a peer cannot make us allocate
 * more than max_payload_bytes. Nor does it allocate what a header announces:
 * the payload buffer grows (doubling) with the bytes that actually arrived,
 * so a header announcing 4 MiB followed by silence costs nothing. After a
 * frame larger than IDA_FRAME_KEEP_BYTES the buffer is freed. Decoders may
 * share a budget (struct ida_frame_budget) bounding the bytes all of them
 * hold at once. Any violation is sticky: the decoder refuses all further
 * input and the connection must be closed.
 */
#ifndef IDA_FRAME_H
#define IDA_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define IDA_WIRE_VERSION       1
#define IDA_FRAME_MAGIC        0xA1
#define IDA_FRAME_HEADER_BYTES 6
/* Hard ceiling for any decoder, whatever it is configured with. */
#define IDA_FRAME_PAYLOAD_BYTES_MAX (64u << 20)
/* A sane default for client and peer connections. */
#define IDA_FRAME_PAYLOAD_BYTES_DEFAULT (4u << 20)
/* A decoder keeps its buffer between frames up to this size; a larger one
 * is freed once its frame was delivered. */
#define IDA_FRAME_KEEP_BYTES (64u << 10)

enum ida_frame_type {
    IDA_FRAME_CLIENT_REQUEST = 1,
    IDA_FRAME_CLIENT_RESPONSE = 2,
    IDA_FRAME_PEER = 3,
};

/* Called once per complete frame. @payload is borrowed: valid only until
 * the callback returns; it is never NULL, even when @len is 0. A nonzero return
 * stops decoding and is returned by ida_frame_decoder_feed(). */
typedef int (*ida_frame_cb)(void *arg,
                            enum ida_frame_type type,
                            const uint8_t *payload,
                            uint32_t len);

/* Bytes held by the payload buffers of every decoder that shares it (one
 * thread only: no locking). A decoder whose buffer would push @used past
 * @max fails with IDA_EBUSY. */
struct ida_frame_budget
{
    size_t used;
    size_t max;
};

struct ida_frame_decoder
{
    uint32_t max_payload_bytes;
    uint8_t header[IDA_FRAME_HEADER_BYTES];
    size_t header_have;
    uint8_t type;
    uint32_t len;  /* payload length of the frame being read */
    uint32_t have; /* payload bytes read so far */
    uint8_t *buf;  /* owned; grows to the largest frame seen */
    uint32_t buf_cap;
    struct ida_frame_budget *budget; /* borrowed; NULL: none */
    int failed;                      /* sticky error code, 0 while healthy */
    char errmsg[128];
};

/* Initialise @d for payloads up to @max_payload_bytes, which must be in
 * [1, IDA_FRAME_PAYLOAD_BYTES_MAX]. Returns 0 or IDA_EINVAL. Allocates
 * nothing; ida_frame_decoder_close() releases what feeding allocated. */
int ida_frame_decoder_init(struct ida_frame_decoder *d,
                           uint32_t max_payload_bytes);
void ida_frame_decoder_close(struct ida_frame_decoder *d);

/* Charge @d's buffer to @b (borrowed until ida_frame_decoder_close(), which
 * gives back what @d holds). Call before the first feed. */
void ida_frame_decoder_set_budget(struct ida_frame_decoder *d,
                                  struct ida_frame_budget *b);

/* Feed @len bytes; calls @cb for each complete frame in order. Returns 0,
 * IDA_EPROTO (bad magic or unknown type), IDA_ETOOBIG (length over the
 * maximum), IDA_ENOMEM, IDA_EBUSY (the shared budget is spent), or the
 * callback's nonzero value. After any error
 * the decoder is failed (d->errmsg says why) and every later call returns
 * the same error without reading input. */
int ida_frame_decoder_feed(struct ida_frame_decoder *d,
                           const uint8_t *data,
                           size_t len,
                           ida_frame_cb cb,
                           void *arg);

/* True when no partial frame is buffered (a clean point to close). */
int ida_frame_decoder_idle(const struct ida_frame_decoder *d);

/* Write the header of a frame of @type with a payload of @len bytes into
 * @out. Returns 0, IDA_EINVAL for an unknown type or IDA_ETOOBIG when @len
 * exceeds IDA_FRAME_PAYLOAD_BYTES_MAX. */
int ida_frame_header_encode(uint8_t out[IDA_FRAME_HEADER_BYTES],
                            enum ida_frame_type type,
                            size_t len);

#endif /* IDA_FRAME_H */
