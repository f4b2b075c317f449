/* Framing: split, merged, truncated, oversized and garbage input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/common/frame.h"

/* --- fixture ------------------------------------------------------------ */

#define FRAMES_MAX 64
struct got
{
    int count;
    enum ida_frame_type type[FRAMES_MAX];
    uint32_t len[FRAMES_MAX];
    uint8_t data[FRAMES_MAX][256];
    int stop_at; /* return an error on this frame number, -1: never */
};

static struct ida_frame_decoder dec;
static struct got got;

static void setup(void)
{
    cr_assert_eq(ida_frame_decoder_init(&dec, 200), 0);
    memset(&got, 0, sizeof(got));
    got.stop_at = -1;
}

static void teardown(void)
{
    ida_frame_decoder_close(&dec);
    ida_heap_fault_set(0, 0);
}

static int on_frame(void *arg,
                    enum ida_frame_type type,
                    const uint8_t *p,
                    uint32_t len)
{
    struct got *g = arg;
    cr_assert_lt(g->count, FRAMES_MAX);
    if (g->count == g->stop_at) {
        return IDA_EINTERNAL;
    }
    g->type[g->count] = type;
    g->len[g->count] = len;
    cr_assert_leq(len, sizeof(g->data[0]));
    memcpy(g->data[g->count], p, len);
    g->count++;
    return 0;
}

/* --- helpers ------------------------------------------------------------ */

/* Append one frame with payload bytes 0,1,2.. (+seed) to @buf. */
static size_t put_frame(uint8_t *buf,
                        enum ida_frame_type t,
                        uint32_t len,
                        uint8_t seed)
{
    cr_assert_eq(ida_frame_header_encode(buf, t, len), 0);
    for (uint32_t i = 0; i < len; i++) {
        buf[IDA_FRAME_HEADER_BYTES + i] = (uint8_t)(i + seed);
    }
    return IDA_FRAME_HEADER_BYTES + len;
}

static void assert_frame(int k,
                         enum ida_frame_type t,
                         uint32_t len,
                         uint8_t seed)
{
    cr_assert_eq(got.type[k], t, "frame %d type", k);
    cr_assert_eq(got.len[k], len, "frame %d len", k);
    for (uint32_t i = 0; i < len; i++) {
        cr_assert_eq(got.data[k][i], (uint8_t)(i + seed), "frame %d byte %u", k,
                     i);
    }
}

/* --- tests -------------------------------------------------------------- */

Test(frame, whole_frame_in_one_feed, .init = setup, .fini = teardown)
{
    uint8_t buf[512];
    size_t n = put_frame(buf, IDA_FRAME_CLIENT_REQUEST, 10, 7);
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n, on_frame, &got), 0);
    cr_assert_eq(got.count, 1);
    assert_frame(0, IDA_FRAME_CLIENT_REQUEST, 10, 7);
    cr_assert(ida_frame_decoder_idle(&dec));
}

Test(frame, empty_payload, .init = setup, .fini = teardown)
{
    uint8_t buf[16];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 0, 0);
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n, on_frame, &got), 0);
    cr_assert_eq(got.count, 1);
    cr_assert_eq(got.len[0], 0);
}

Test(frame, split_one_byte_at_a_time, .init = setup, .fini = teardown)
{
    uint8_t buf[1024];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 150, 1);
    n += put_frame(buf + n, IDA_FRAME_CLIENT_RESPONSE, 3, 9);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(ida_frame_decoder_feed(&dec, buf + i, 1, on_frame, &got),
                     0);
        if (i + 1 < IDA_FRAME_HEADER_BYTES + 150) {
            cr_assert_eq(got.count, 0, "no frame before its last byte");
            cr_assert_not(ida_frame_decoder_idle(&dec));
        }
    }
    cr_assert_eq(got.count, 2);
    assert_frame(0, IDA_FRAME_PEER, 150, 1);
    assert_frame(1, IDA_FRAME_CLIENT_RESPONSE, 3, 9);
}

Test(frame,
     many_frames_merged_and_split_at_every_point,
     .init = setup,
     .fini = teardown)
{
    uint8_t buf[2048];
    size_t n = 0;
    for (int k = 0; k < 8; k++) {
        n += put_frame(buf + n, IDA_FRAME_CLIENT_REQUEST, (uint32_t)(k * 13),
                       (uint8_t)k);
    }
    /* Every split point: the result must not depend on chunking. */
    for (size_t cut = 0; cut <= n; cut++) {
        ida_frame_decoder_close(&dec);
        setup();
        cr_assert_eq(ida_frame_decoder_feed(&dec, buf, cut, on_frame, &got), 0);
        cr_assert_eq(
            ida_frame_decoder_feed(&dec, buf + cut, n - cut, on_frame, &got),
            0);
        cr_assert_eq(got.count, 8, "cut at %zu", cut);
        for (int k = 0; k < 8; k++) {
            assert_frame(k, IDA_FRAME_CLIENT_REQUEST, (uint32_t)(k * 13),
                         (uint8_t)k);
        }
    }
}

Test(frame,
     truncated_frame_is_held_not_delivered,
     .init = setup,
     .fini = teardown)
{
    uint8_t buf[256];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 100, 0);
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n - 1, on_frame, &got), 0);
    cr_assert_eq(got.count, 0);
    cr_assert_not(ida_frame_decoder_idle(&dec), "a partial frame is pending");
    /* A truncated header alone is also pending, never delivered. */
    ida_frame_decoder_close(&dec);
    setup();
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, 3, on_frame, &got), 0);
    cr_assert_eq(got.count, 0);
    cr_assert_not(ida_frame_decoder_idle(&dec));
}

Test(frame,
     oversized_rejected_before_allocation,
     .init = setup,
     .fini = teardown)
{
    uint8_t hdr[IDA_FRAME_HEADER_BYTES];
    cr_assert_eq(ida_frame_header_encode(hdr, IDA_FRAME_PEER, 201), 0);
    /* Make every allocation fail: rejection must not even try one. */
    ida_heap_fault_set(0, -1);
    cr_assert_eq(ida_frame_decoder_feed(&dec, hdr, sizeof(hdr), on_frame, &got),
                 IDA_ETOOBIG);
    ida_heap_fault_set(0, 0);
    cr_assert_eq(got.count, 0);
    cr_assert_null(dec.buf, "nothing allocated for a rejected frame");
    cr_assert(strstr(dec.errmsg, "201") != NULL, "errmsg: %s", dec.errmsg);
    /* Sticky: even a valid frame is refused now. */
    uint8_t buf[64];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 4, 0);
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n, on_frame, &got),
                 IDA_ETOOBIG);
    cr_assert_eq(got.count, 0);
}

Test(frame, huge_length_rejected, .init = setup, .fini = teardown)
{
    const uint8_t hdr[] = {
        IDA_FRAME_MAGIC, IDA_FRAME_PEER, 0xff, 0xff, 0xff, 0xff};
    cr_assert_eq(ida_frame_decoder_feed(&dec, hdr, sizeof(hdr), on_frame, &got),
                 IDA_ETOOBIG);
    cr_assert_null(dec.buf);
}

Test(frame, exactly_max_is_accepted, .init = setup, .fini = teardown)
{
    static uint8_t buf[512];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 200, 0);
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n, on_frame, &got), 0);
    cr_assert_eq(got.count, 1);
    assert_frame(0, IDA_FRAME_PEER, 200, 0);
}

Test(frame, garbage_is_rejected, .init = setup, .fini = teardown)
{
    const char *http = "GET / HTTP/1.1\r\n\r\n";
    cr_assert_eq(ida_frame_decoder_feed(&dec, (const uint8_t *)http,
                                        strlen(http), on_frame, &got),
                 IDA_EPROTO);
    cr_assert_eq(got.count, 0);
    cr_assert(strstr(dec.errmsg, "magic") != NULL);
}

Test(frame, unknown_type_is_rejected, .init = setup, .fini = teardown)
{
    const uint8_t hdr[] = {IDA_FRAME_MAGIC, 99, 0, 0, 0, 1, 0};
    cr_assert_eq(ida_frame_decoder_feed(&dec, hdr, sizeof(hdr), on_frame, &got),
                 IDA_EPROTO);
    cr_assert_eq(got.count, 0);
    cr_assert_null(dec.buf);
}

/* What a correct decoder must do with @buf (decoder maximum @max): the
 * frames it delivers (count, lengths, payload offsets) and its final result,
 * computed by a straightforward parse of the same bytes. */
struct expect
{
    int rv;
    int count;
    uint32_t len[FRAMES_MAX];
    size_t off[FRAMES_MAX];
};

static struct expect reference_parse(const uint8_t *buf, size_t n, uint32_t max)
{
    struct expect e = {0};
    size_t at = 0;
    while (n - at >= IDA_FRAME_HEADER_BYTES) {
        const uint8_t *h = buf + at;
        if (h[0] != IDA_FRAME_MAGIC || h[1] < IDA_FRAME_CLIENT_REQUEST ||
            h[1] > IDA_FRAME_PEER) {
            e.rv = IDA_EPROTO;
            return e;
        }
        uint32_t len = (uint32_t)h[2] << 24 | (uint32_t)h[3] << 16 |
                       (uint32_t)h[4] << 8 | h[5];
        if (len > max) {
            e.rv = IDA_ETOOBIG;
            return e;
        }
        if (n - at - IDA_FRAME_HEADER_BYTES < len) {
            return e; /* waits for the rest */
        }
        e.len[e.count] = len;
        e.off[e.count] = at + IDA_FRAME_HEADER_BYTES;
        e.count++;
        at += IDA_FRAME_HEADER_BYTES + len;
    }
    /* A partial header: a bad magic byte is refused at once, the type when
     * the header is whole. */
    if (n > at && buf[at] != IDA_FRAME_MAGIC) {
        e.rv = IDA_EPROTO;
    }
    return e;
}

Test(frame,
     random_garbage_matches_a_reference_parse,
     .init = setup,
     .fini = teardown)
{
    /* Random bytes (seeded), often shaped like headers with small lengths:
     * the decoder (maximum 20 bytes, so lengths past it are common) must
     * deliver exactly the frames a plain parse finds, byte for byte, and
     * fail exactly where the parse fails. */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int frames_seen = 0, errors_seen = 0;
    for (int round = 0; round < 5000; round++) {
        ida_frame_decoder_close(&dec);
        cr_assert_eq(ida_frame_decoder_init(&dec, 20), 0);
        memset(&got, 0, sizeof(got));
        got.stop_at = -1;
        uint8_t buf[64];
        for (size_t i = 0; i < sizeof(buf); i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        /* Shape valid headers most of the time so frames get delivered. */
        for (size_t at = 0; round % 4 != 0 && at + 6 <= sizeof(buf);) {
            uint32_t len = buf[at + 5] % 24; /* sometimes over 20 */
            buf[at] = IDA_FRAME_MAGIC;
            buf[at + 1] = (uint8_t)(1 + buf[at + 1] % (round % 8 == 1 ? 4 : 3));
            buf[at + 2] = buf[at + 3] = buf[at + 4] = 0;
            buf[at + 5] = (uint8_t)len;
            at += 6 + len;
        }
        struct expect e = reference_parse(buf, sizeof(buf), 20);
        int rv = ida_frame_decoder_feed(&dec, buf, sizeof(buf), on_frame, &got);
        cr_assert_eq(rv, e.rv, "round %d", round);
        cr_assert_eq(got.count, e.count, "round %d", round);
        for (int k = 0; k < got.count; k++) {
            cr_assert_eq(got.len[k], e.len[k], "round %d frame %d", round, k);
            cr_assert_eq(got.type[k], buf[e.off[k] - 5]);
            cr_assert_arr_eq(got.data[k], buf + e.off[k], e.len[k]);
        }
        frames_seen += got.count;
        errors_seen += rv != 0;
    }
    /* The generator reached both outcomes often. */
    cr_assert_gt(frames_seen, 1000);
    cr_assert_gt(errors_seen, 500);
}

Test(frame, callback_error_stops_and_sticks, .init = setup, .fini = teardown)
{
    uint8_t buf[256];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 5, 0);
    n += put_frame(buf + n, IDA_FRAME_PEER, 5, 1);
    n += put_frame(buf + n, IDA_FRAME_PEER, 5, 2);
    got.stop_at = 1;
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n, on_frame, &got),
                 IDA_EINTERNAL);
    cr_assert_eq(got.count, 1, "frames after the failing one not delivered");
}

Test(frame, out_of_memory_is_an_error, .init = setup, .fini = teardown)
{
    uint8_t buf[64];
    size_t n = put_frame(buf, IDA_FRAME_PEER, 20, 0);
    ida_heap_fault_set(0, 1);
    cr_assert_eq(ida_frame_decoder_feed(&dec, buf, n, on_frame, &got),
                 IDA_ENOMEM);
    cr_assert_eq(got.count, 0);
}

Test(frame, bad_init_and_encode_arguments)
{
    struct ida_frame_decoder d;
    cr_assert_eq(ida_frame_decoder_init(&d, 0), IDA_EINVAL);
    cr_assert_eq(ida_frame_decoder_init(&d, IDA_FRAME_PAYLOAD_BYTES_MAX + 1),
                 IDA_EINVAL);
    uint8_t hdr[IDA_FRAME_HEADER_BYTES];
    cr_assert_eq(ida_frame_header_encode(hdr, (enum ida_frame_type)7, 1),
                 IDA_EINVAL);
    cr_assert_eq(
        ida_frame_header_encode(hdr, IDA_FRAME_PEER,
                                (size_t)IDA_FRAME_PAYLOAD_BYTES_MAX + 1),
        IDA_ETOOBIG);
    cr_assert_eq(ida_frame_header_encode(hdr, IDA_FRAME_PEER, 0x01020304), 0);
    cr_assert_eq(hdr[0], IDA_FRAME_MAGIC);
    cr_assert_eq(hdr[2], 1);
    cr_assert_eq(hdr[5], 4);
}

/* --- growth with the bytes that arrive, budgets -------------------------- */

static int count_frame(void *arg,
                       enum ida_frame_type type,
                       const uint8_t *p,
                       uint32_t len)
{
    (void)type;
    (void)p;
    (void)len;
    (*(int *)arg)++;
    return 0;
}

Test(frame, announced_length_is_not_allocated_up_front)
{
    /* A header announcing the maximum followed by a few bytes: the buffer
     * follows what arrived (the old decoder allocated all 4 MiB at the
     * header). */
    struct ida_frame_decoder d;
    cr_assert_eq(ida_frame_decoder_init(&d, IDA_FRAME_PAYLOAD_BYTES_DEFAULT),
                 0);
    uint8_t hdr[IDA_FRAME_HEADER_BYTES + 10] = {0};
    ida_frame_header_encode(hdr, IDA_FRAME_CLIENT_REQUEST,
                            IDA_FRAME_PAYLOAD_BYTES_DEFAULT);
    int frames = 0;
    cr_assert_eq(ida_frame_decoder_feed(&d, hdr, IDA_FRAME_HEADER_BYTES,
                                        count_frame, &frames),
                 0);
    cr_assert_eq(d.buf_cap, 0);
    cr_assert_eq(ida_frame_decoder_feed(&d, hdr + IDA_FRAME_HEADER_BYTES, 10,
                                        count_frame, &frames),
                 0);
    cr_assert_eq(d.buf_cap, 4096);
    cr_assert_not(ida_frame_decoder_idle(&d));
    /* The rest arrives in 64 KiB pieces: the buffer doubles, never past
     * the frame, and is freed once the frame was delivered. */
    uint8_t *chunk = calloc(1, 65536);
    uint32_t left = IDA_FRAME_PAYLOAD_BYTES_DEFAULT - 10;
    while (left > 0) {
        uint32_t n = left < 65536 ? left : 65536;
        cr_assert_eq(ida_frame_decoder_feed(&d, chunk, n, count_frame, &frames),
                     0);
        cr_assert_leq(d.buf_cap, IDA_FRAME_PAYLOAD_BYTES_DEFAULT);
        left -= n;
    }
    free(chunk);
    cr_assert_eq(frames, 1);
    cr_assert_eq(d.buf_cap, 0, "a buffer over IDA_FRAME_KEEP_BYTES is freed");
    ida_frame_decoder_close(&d);
}

Test(frame, a_shared_budget_bounds_all_decoders)
{
    struct ida_frame_budget b = {.used = 0, .max = 8192};
    struct ida_frame_decoder a, c;
    cr_assert_eq(ida_frame_decoder_init(&a, 100000), 0);
    cr_assert_eq(ida_frame_decoder_init(&c, 100000), 0);
    ida_frame_decoder_set_budget(&a, &b);
    ida_frame_decoder_set_budget(&c, &b);
    static uint8_t buf[IDA_FRAME_HEADER_BYTES + 6000];
    ida_frame_header_encode(buf, IDA_FRAME_PEER, 6000);
    int frames = 0;
    /* a holds 5,000 of its 6,000 bytes. */
    cr_assert_eq(ida_frame_decoder_feed(&a, buf, IDA_FRAME_HEADER_BYTES + 5000,
                                        count_frame, &frames),
                 0);
    cr_assert_eq(b.used, a.buf_cap);
    cr_assert_geq(b.used, 5000);
    /* c cannot get 4 KiB more: it fails, sticky, and holds nothing. */
    cr_assert_eq(ida_frame_decoder_feed(&c, buf, IDA_FRAME_HEADER_BYTES + 5000,
                                        count_frame, &frames),
                 IDA_EBUSY);
    cr_assert(strstr(c.errmsg, "cap") != NULL, "%s", c.errmsg);
    cr_assert_eq(c.buf_cap, 0);
    cr_assert_eq(ida_frame_decoder_feed(&c, buf, 1, count_frame, &frames),
                 IDA_EBUSY);
    /* a finishes its frame within the budget. */
    cr_assert_eq(ida_frame_decoder_feed(&a, buf + IDA_FRAME_HEADER_BYTES + 5000,
                                        1000, count_frame, &frames),
                 0);
    cr_assert_eq(frames, 1);
    cr_assert_leq(b.used, b.max);
    /* Closing gives everything back. */
    ida_frame_decoder_close(&a);
    ida_frame_decoder_close(&c);
    cr_assert_eq(b.used, 0);
}
