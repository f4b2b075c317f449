/* Fuzz the frame decoder (src/common/frame.h): any bytes, in any chunking.
 *
 * Input: byte 0 picks the decoder's maximum payload, byte 1 seeds the
 * chunking, the rest is the stream. The same stream is fed twice: in the
 * chunks the seed gives and all at once. Checked: both feedings hand out
 * the same frames (type, length, bytes) and end with the same code; every
 * frame has a known type, a length within the maximum and a non-NULL
 * payload; the buffer never grows past the maximum; an error is sticky. */
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/common/frame.h"
#include "tests/fuzz/fuzz.h"

#define FRAMES_MAX 4096

struct seen
{
    uint32_t max;
    size_t n;
    uint64_t hash[FRAMES_MAX];
};

static uint64_t fnv(const uint8_t *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    }
    return h;
}

static int on_frame(void *arg,
                    enum ida_frame_type type,
                    const uint8_t *payload,
                    uint32_t len)
{
    struct seen *s = arg;
    FUZZ_CHECK(payload != NULL);
    FUZZ_CHECK(len <= s->max);
    FUZZ_CHECK(type == IDA_FRAME_CLIENT_REQUEST ||
               type == IDA_FRAME_CLIENT_RESPONSE || type == IDA_FRAME_PEER);
    uint64_t h = fnv(payload, len, UINT64_C(0xcbf29ce484222325) ^ type);
    h = fnv((const uint8_t *)&len, sizeof(len), h);
    if (s->n < FRAMES_MAX) {
        s->hash[s->n] = h;
    }
    s->n++;
    /* A handler that fails stops the decoder for good. */
    return len > 0 && payload[0] == 0xEE ? IDA_EPROTO : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Small maximums: a header may make the decoder allocate its length
     * (up to the maximum), which would only slow the fuzzer down. */
    static const uint32_t maxes[] = {1, 7, 64, 4096, 1u << 16};
    if (size < 2) {
        return 0;
    }
    uint32_t max = maxes[data[0] % (sizeof(maxes) / sizeof(maxes[0]))];
    uint32_t rng = data[1] * 2654435761u + 1;
    const uint8_t *stream = data + 2;
    size_t len = size - 2;

    struct ida_frame_decoder whole, chunked;
    FUZZ_CHECK(ida_frame_decoder_init(&whole, max) == 0);
    FUZZ_CHECK(ida_frame_decoder_init(&chunked, max) == 0);
    static struct seen a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.max = b.max = max;

    int rv_whole = ida_frame_decoder_feed(&whole, stream, len, on_frame, &a);
    int rv_chunked = 0;
    size_t pos = 0;
    while (pos < len && rv_chunked == 0) {
        rng = rng * 1103515245u + 12345u;
        size_t n = 1 + (rng >> 16) % 13;
        if ((rng >> 8) % 4 == 0) {
            n = 0; /* an empty read is legal too */
        }
        if (n > len - pos) {
            n = len - pos;
        }
        rv_chunked =
            ida_frame_decoder_feed(&chunked, stream + pos, n, on_frame, &b);
        pos += n;
    }
    FUZZ_CHECK(rv_whole == rv_chunked);
    FUZZ_CHECK(a.n == b.n);
    for (size_t i = 0; i < a.n && i < FRAMES_MAX; i++) {
        FUZZ_CHECK(a.hash[i] == b.hash[i]);
    }
    FUZZ_CHECK(whole.buf_cap <= max && chunked.buf_cap <= max);
    if (rv_whole != 0) {
        /* Sticky: nothing more is read, the same code comes back. */
        size_t before = a.n;
        static const uint8_t good[] = {IDA_FRAME_MAGIC, 1, 0, 0, 0, 0};
        FUZZ_CHECK(ida_frame_decoder_feed(&whole, good, sizeof(good), on_frame,
                                          &a) == rv_whole);
        FUZZ_CHECK(a.n == before);
        FUZZ_CHECK(whole.errmsg[0] != '\0');
    } else {
        FUZZ_CHECK(ida_frame_decoder_idle(&whole) ==
                   ida_frame_decoder_idle(&chunked));
    }
    ida_frame_decoder_close(&whole);
    ida_frame_decoder_close(&chunked);
    return 0;
}
