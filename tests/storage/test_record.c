/* storage/record.c: CRC-32C and the fixed binary records. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "base/types.h"
#include "idalloc_errors.h"
#include "storage/record.h"

Test(storage_record, crc32c_known_answer)
{
    /* RFC 3720 test vector: CRC-32C of "123456789" is 0xE3069283. */
    cr_assert_eq(ida__crc32c(0, "123456789", 9), 0xE3069283u);
    /* Incremental equals one-shot. */
    cr_assert_eq(ida__crc32c(ida__crc32c(0, "1234", 4), "56789", 5),
                 0xE3069283u);
}

/* The CPU's crc32 instruction and the portable slicing-by-8 tables agree on
 * every length and alignment (the byte-at-a-time head and tail of both, and
 * the 8-byte steps), and on continuing a checksum. */
Test(storage_record, crc32c_hardware_and_portable_agree)
{
    cr_assert_eq(ida__crc32c_portable(0, "123456789", 9), 0xE3069283u);
    static uint8_t buf[4096 + 16];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof(buf); i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    for (size_t off = 0; off < 16; off++) {
        for (size_t len = 0; len < 300; len += 1 + len / 8) {
            uint32_t a = ida__crc32c(0, buf + off, len);
            uint32_t b = ida__crc32c_portable(0, buf + off, len);
            cr_assert_eq(a, b, "off %zu len %zu: %08x vs %08x", off, len, a, b);
            cr_assert_eq(ida__crc32c(a, buf + off + len, 4096 - len),
                         ida__crc32c_portable(b, buf + off + len, 4096 - len));
        }
    }
    cr_log_info("crc32c: %s", ida__crc32c_hw() ? "sse4.2" : "portable");
}

/* Long buffers take three runs side by side and join them (of 8,192 bytes,
 * then of 256): every way a length splits into long runs, short runs and
 * a tail, at every alignment, gives the slicing-by-8 answer, and so does a
 * single flipped bit in any run. */
Test(storage_record, crc32c_of_long_buffers_agrees_in_every_run)
{
    static uint8_t buf[3 * 3 * 8192 + 3 * 256 + 64];
    uint32_t x = 777;
    for (size_t i = 0; i < sizeof(buf); i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    const size_t lens[] = {767,
                           768,
                           769,
                           3 * 256 + 15,
                           24575,
                           24576,
                           24577,
                           24576 + 768,
                           24576 + 777,
                           2 * 24576,
                           2 * 24576 + 3 * 256 + 9,
                           3 * 24576 + 3 * 256 + 40};
    for (size_t off = 0; off < 9; off++) {
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            size_t len = lens[i];
            cr_assert_leq(off + len, sizeof(buf));
            uint32_t a = ida__crc32c(0, buf + off, len);
            uint32_t b = ida__crc32c_portable(0, buf + off, len);
            cr_assert_eq(a, b, "off %zu len %zu: %08x vs %08x", off, len, a, b);
            cr_assert_eq(ida__crc32c(a, buf, 100),
                         ida__crc32c_portable(b, buf, 100));
        }
    }
    /* A bit flipped in each run, long and short: a join that dropped or
     * misplaced a run would miss it. */
    const size_t total = 3 * 8192 + 3 * 256;
    const size_t flips[] = {5,     8190,  8192 + 77, 2 * 8192 + 4000,
                            24576, 24700, 24832 + 3, 25343};
    for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
        size_t at = flips[i];
        uint32_t before = ida__crc32c(0, buf, total);
        buf[at] ^= 0x10;
        uint32_t after = ida__crc32c(0, buf, total);
        cr_assert_eq(after, ida__crc32c_portable(0, buf, total));
        cr_assert_neq(after, before, "a bit flipped at %zu went unseen", at);
        buf[at] ^= 0x10;
    }
    if (!ida__crc32c_hw()) {
        cr_log_warn("crc32c: no SSE4.2 here; the runs were not exercised");
    }
}

/* The CRC of A then B joined from A's and B's own, for lengths of B of
 * none, a byte, odd sizes and a snapshot chunk's, against reading A then B
 * in one pass. */
Test(storage_record, crc32c_of_two_pieces_joins_from_their_own)
{
    static uint8_t buf[70000];
    uint32_t x = 4242;
    for (size_t i = 0; i < sizeof(buf); i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    const size_t a_lens[] = {0, 1, 16, 999};
    const size_t b_lens[] = {0, 1, 7, 2000, 2001, 65536};
    for (size_t i = 0; i < sizeof(a_lens) / sizeof(a_lens[0]); i++) {
        for (size_t j = 0; j < sizeof(b_lens) / sizeof(b_lens[0]); j++) {
            size_t na = a_lens[i], nb = b_lens[j];
            struct ida__crc32c_shift sh;
            ida__crc32c_shift_init(&sh, nb);
            uint32_t a = ida__crc32c(0, buf, na);
            uint32_t b = ida__crc32c(0, buf + na, nb);
            cr_assert_eq(ida__crc32c_join(&sh, a, b),
                         ida__crc32c_portable(0, buf, na + nb), "%zu + %zu", na,
                         nb);
        }
    }
}

Test(storage_record, every_record_rejects_a_flipped_bit_and_a_wrong_length)
{
    uint8_t buf[128];
    struct ida_hard_state hs = {7, 3, 99}, out;
    ida__rec_hard_state_encode(buf, &hs);
    cr_assert_eq(
        ida__rec_hard_state_decode(buf, IDA__REC_HARD_STATE_BYTES, &out), 0);
    cr_assert_eq(out.term, 7);
    cr_assert_eq(out.vote, 3);
    cr_assert_eq(out.commit, 99);
    for (size_t bit = 0; bit < IDA__REC_HARD_STATE_BYTES * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert_eq(
            ida__rec_hard_state_decode(buf, IDA__REC_HARD_STATE_BYTES, &out),
            IDA_ECORRUPT, "bit %zu", bit);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    cr_assert_eq(
        ida__rec_hard_state_decode(buf, IDA__REC_HARD_STATE_BYTES - 1, &out),
        IDA_ECORRUPT);
    ida_index pi;
    ida_term pt;
    ida__rec_log_prev_encode(buf, 5, 6);
    cr_assert_eq(
        ida__rec_log_prev_decode(buf, IDA__REC_LOG_PREV_BYTES, &pi, &pt), 0);
    cr_assert_eq(pi, 5);
    cr_assert_eq(pt, 6);
    buf[7] ^= 1;
    cr_assert_eq(
        ida__rec_log_prev_decode(buf, IDA__REC_LOG_PREV_BYTES, &pi, &pt),
        IDA_ECORRUPT);
    size_t n = ida__rec_identity_encode(buf, 9, "abc", 3);
    ida_node_id node;
    const char *name;
    size_t name_len;
    cr_assert_eq(ida__rec_identity_decode(buf, n, &node, &name, &name_len), 0);
    cr_assert_eq(node, 9);
    cr_assert_eq(name_len, 3);
    cr_assert_eq(memcmp(name, "abc", 3), 0);
    cr_assert_eq(ida__rec_identity_decode(buf, n + 1, &node, &name, &name_len),
                 IDA_ECORRUPT);
    /* An entry checksum covers its index: a value moved to another key
     * fails. */
    struct ida_entry e = {.term = 3,
                          .index = 42,
                          .type = IDA_ENTRY_NOOP,
                          .data = (uint8_t *)"hello",
                          .len = 5};
    ida__rec_entry_header(buf, &e);
    memcpy(buf + IDA__REC_ENTRY_HDR_BYTES, "hello", 5);
    struct ida_entry d;
    cr_assert_eq(
        ida__rec_entry_decode(buf, IDA__REC_ENTRY_HDR_BYTES + 5, 42, &d), 0);
    cr_assert_eq(d.term, 3);
    cr_assert_eq(d.type, IDA_ENTRY_NOOP);
    cr_assert_eq(d.len, 5);
    cr_assert_eq(
        ida__rec_entry_decode(buf, IDA__REC_ENTRY_HDR_BYTES + 5, 43, &d),
        IDA_ECORRUPT);
    cr_assert_eq(
        ida__rec_entry_decode(buf, IDA__REC_ENTRY_HDR_BYTES + 4, 42, &d),
        IDA_ECORRUPT);
}

/* Found by tests/fuzz/fuzz_storage.c: bytes 20-23 of an entry header (zero
 * when written) are not covered by its CRC, and were not checked: a damaged
 * byte there went unnoticed. Every reserved byte must be zero. */
Test(storage_record, entry_reserved_bytes_must_be_zero)
{
    struct ida_entry e = {.term = 6,
                          .index = 101,
                          .type = IDA_ENTRY_NORMAL,
                          .data = (uint8_t *)"hello",
                          .len = 5};
    uint8_t buf[IDA__REC_ENTRY_HDR_BYTES + 5];
    ida__rec_entry_header(buf, &e);
    memcpy(buf + IDA__REC_ENTRY_HDR_BYTES, "hello", 5);
    struct ida_entry d;
    cr_assert_eq(ida__rec_entry_decode(buf, sizeof(buf), 101, &d), 0);
    for (size_t at = 20; at < 24; at++) {
        buf[at] = 0x06;
        cr_assert_eq(ida__rec_entry_decode(buf, sizeof(buf), 101, &d),
                     IDA_ECORRUPT, "byte %zu", at);
        buf[at] = 0;
    }
    cr_assert_eq(ida__rec_entry_decode(buf, sizeof(buf), 101, &d), 0);
}

/* A snapshot record names its chunk size ("IDAT"); one of 64 KiB chunks is
 * written as before it did ("IDAS"), and each has one encoding. A chunk
 * size or count that cannot be is refused. */
Test(storage_record, snapshot_records_of_both_chunk_sizes)
{
    uint8_t buf[128], out[128];
    const uint8_t config[] = {1, 2, 3};
    struct ida__rec_snapshot r = {.id = 4,
                                  .index = 100,
                                  .term = 3,
                                  .size = 4001,
                                  .data_crc = 77,
                                  .chunks = 3,
                                  .chunk_bytes = 2000,
                                  .config = config,
                                  .config_len = 3},
                             d;
    size_t n = ida__rec_snapshot_encode(buf, &r);
    cr_assert_eq(n, IDA__REC_SNAPSHOT_FIXED + 3);
    cr_assert_eq(memcmp(buf, "IDAT", 4), 0);
    cr_assert_eq(ida__rec_snapshot_decode(buf, n, &d), 0);
    cr_assert_eq(d.chunk_bytes, 2000);
    cr_assert_eq(d.chunks, 3);
    cr_assert_eq(d.size, 4001);
    cr_assert_eq(memcmp(d.config, config, 3), 0);
    for (size_t bit = 0; bit < n * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert_eq(ida__rec_snapshot_decode(buf, n, &d), IDA_ECORRUPT,
                     "bit %zu", bit);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    /* 64 KiB chunks: "IDAS", four bytes shorter. */
    r.chunk_bytes = IDA__REC_CHUNK_BYTES_V1;
    r.chunks = 1;
    size_t n1 = ida__rec_snapshot_encode(buf, &r);
    cr_assert_eq(n1, IDA__REC_SNAPSHOT_V1_FIXED + 3);
    cr_assert_eq(memcmp(buf, "IDAS", 4), 0);
    cr_assert_eq(ida__rec_snapshot_decode(buf, n1, &d), 0);
    cr_assert_eq(d.chunk_bytes, IDA__REC_CHUNK_BYTES_V1);
    cr_assert_eq(memcmp(d.config, config, 3), 0);
    cr_assert_eq(ida__rec_snapshot_encode(out, &d), n1);
    cr_assert_eq(memcmp(out, buf, n1), 0, "the same bytes again");
    /* Sealed but impossible: each is refused. */
    struct
    {
        uint32_t chunk_bytes;
        uint64_t size, chunks;
        int v1_as_idat;
    } bad[] = {
        {0, 10, 1, 0},                            /* no chunk size */
        {IDA__REC_CHUNK_BYTES_MAX + 1, 10, 1, 0}, /* too large */
        {2000, 4001, 2, 0},                       /* one chunk too few */
        {2000, 4000, 3, 0},                       /* one too many */
        {2000, 0, 1, 0},                          /* a chunk of nothing */
        {IDA__REC_CHUNK_BYTES_V1, 10, 1, 1},      /* 64 KiB as "IDAT" */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r.chunk_bytes = bad[i].chunk_bytes;
        r.size = bad[i].size;
        r.chunks = bad[i].chunks;
        n = ida__rec_snapshot_encode(buf, &r);
        if (bad[i].v1_as_idat) {
            /* Re-encode by hand as "IDAT" with the chunk size inside. */
            memmove(buf + 52, buf + 48, n - 48);
            memcpy(buf, "IDAT", 4);
            ida__put_be32(buf + 48, IDA__REC_CHUNK_BYTES_V1);
            n += 4;
            ida__put_be32(buf + n - 4, ida__crc32c(0, buf, n - 4));
        }
        cr_assert_eq(ida__rec_snapshot_decode(buf, n, &d), IDA_ECORRUPT,
                     "case %zu", i);
    }
    r.size = 0;
    r.chunks = 0;
    r.chunk_bytes = 2000;
    n = ida__rec_snapshot_encode(buf, &r);
    cr_assert_eq(ida__rec_snapshot_decode(buf, n, &d), 0, "empty, no chunk");
}
