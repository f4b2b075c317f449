/* Fuzz the decoders of storage's records (storage/record.h): what storage
 * reads back from disk before it trusts any of it.
 *
 * Input: byte 0 picks the record kind and (bit 7) whether to make the
 * record's CRC right, so the checks behind the CRC are reached; bytes 1-8
 * are the log index for entries; the rest is the stored value. Checked: a
 * decoder answers 0 or IDA_ECORRUPT; whatever it accepts encodes back to
 * exactly the bytes it read (no field is ignored or misread) and stays
 * inside them. */
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "tests/fuzz/fuzz.h"

enum {
    K_FORMAT,
    K_IDENTITY,
    K_IDENTITY2,
    K_IDFILE,
    K_HARD_STATE,
    K_LOG_PREV,
    K_SNAPSHOT,
    K_ENTRY,
    K_BOOT,
    K_UNTRUSTED,
    K_LOG_LSN,
    K_COUNT
};

static void same(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    FUZZ_CHECK(alen == blen);
    FUZZ_CHECK(memcmp(a, b, alen) == 0);
}

static void fix_crc(int kind, uint8_t *p, size_t len, ida_index index)
{
    if (kind == K_ENTRY) {
        if (len >= IDA__REC_ENTRY_HDR_BYTES) {
            /* The CRC covers the index, the header without it, the data. */
            uint8_t key[8];
            ida__put_be64(key, index);
            uint32_t crc = ida__crc32c(0, key, 8);
            crc = ida__crc32c(crc, p, 16);
            crc = ida__crc32c(crc, p + IDA__REC_ENTRY_HDR_BYTES,
                              len - IDA__REC_ENTRY_HDR_BYTES);
            ida__put_be32(p + 16, crc);
        }
    } else if (len >= 4) {
        ida__put_be32(p + len - 4, ida__crc32c(0, p, len - 4));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9 || size > 70000) {
        return 0;
    }
    int kind = (data[0] & 0x7f) % K_COUNT;
    ida_index index = ida__get_be64(data + 1);
    size_t len = size - 9;
    uint8_t *p = ida_malloc(len + 1);
    uint8_t *out = ida_malloc(len + 64);
    FUZZ_CHECK(p != NULL && out != NULL);
    memcpy(p, data + 9, len);
    if (data[0] & 0x80) {
        fix_crc(kind, p, len, index);
    }
    int rv = 0;
    switch (kind) {
        case K_FORMAT: {
            uint32_t v;
            rv = ida__rec_format_decode(p, len, &v);
            if (rv == 0) {
                ida__rec_format_encode(out, v);
                same(out, IDA__REC_FORMAT_BYTES, p, len);
            }
            break;
        }
        case K_IDENTITY: {
            ida_node_id id;
            const char *name;
            size_t nlen;
            rv = ida__rec_identity_decode(p, len, &id, &name, &nlen);
            if (rv == 0) {
                FUZZ_CHECK((const uint8_t *)name >= p &&
                           (const uint8_t *)name + nlen <= p + len);
                same(out, ida__rec_identity_encode(out, id, name, nlen), p,
                     len);
            }
            break;
        }
        case K_IDENTITY2:
        case K_IDFILE: {
            struct ida__rec_identity r;
            rv = kind == K_IDFILE ? ida__rec_idfile_decode(p, len, &r)
                                  : ida__rec_identity2_decode(p, len, &r);
            if (rv == 0) {
                FUZZ_CHECK((const uint8_t *)r.name >= p &&
                           (const uint8_t *)r.name + r.name_len <= p + len);
                size_t n = kind == K_IDFILE
                               ? ida__rec_idfile_encode(out, &r)
                               : ida__rec_identity2_encode(out, &r);
                same(out, n, p, len);
            }
            break;
        }
        case K_HARD_STATE: {
            struct ida_hard_state hs;
            rv = ida__rec_hard_state_decode(p, len, &hs);
            if (rv == 0) {
                ida__rec_hard_state_encode(out, &hs);
                same(out, IDA__REC_HARD_STATE_BYTES, p, len);
            }
            break;
        }
        case K_LOG_PREV: {
            ida_index i;
            ida_term t;
            rv = ida__rec_log_prev_decode(p, len, &i, &t);
            if (rv == 0) {
                ida__rec_log_prev_encode(out, i, t);
                same(out, IDA__REC_LOG_PREV_BYTES, p, len);
            }
            break;
        }
        case K_BOOT: {
            uint64_t n;
            rv = ida__rec_boot_decode(p, len, &n);
            if (rv == 0) {
                ida__rec_boot_encode(out, n);
                same(out, IDA__REC_BOOT_BYTES, p, len);
            }
            break;
        }
        case K_LOG_LSN: {
            uint64_t n;
            rv = ida__rec_log_lsn_decode(p, len, &n);
            if (rv == 0) {
                ida__rec_log_lsn_encode(out, n);
                same(out, IDA__REC_BOOT_BYTES, p, len);
            }
            break;
        }
        case K_UNTRUSTED: {
            const char *why;
            size_t wl;
            rv = ida__rec_untrusted_decode(p, len, &why, &wl);
            if (rv == 0) {
                FUZZ_CHECK(wl <= IDA__REC_REASON_MAX);
                FUZZ_CHECK(why >= (const char *)p &&
                           why + wl <= (const char *)p + len);
                size_t n = ida__rec_untrusted_encode(out, why, wl);
                same(out, n, p, len);
            }
            break;
        }
        case K_SNAPSHOT: {
            struct ida__rec_snapshot r;
            rv = ida__rec_snapshot_decode(p, len, &r);
            if (rv == 0) {
                FUZZ_CHECK(
                    r.config_len == 0 ||
                    (r.config >= p && r.config + r.config_len <= p + len));
                same(out, ida__rec_snapshot_encode(out, &r), p, len);
            }
            break;
        }
        case K_ENTRY: {
            struct ida_entry e;
            rv = ida__rec_entry_decode(p, len, index, &e);
            if (rv == 0) {
                FUZZ_CHECK(e.index == index);
                FUZZ_CHECK(e.type == IDA_ENTRY_NORMAL ||
                           e.type == IDA_ENTRY_NOOP ||
                           e.type == IDA_ENTRY_CONFIG);
                FUZZ_CHECK(e.len == len - IDA__REC_ENTRY_HDR_BYTES);
                FUZZ_CHECK(e.len == 0 ||
                           e.data == p + IDA__REC_ENTRY_HDR_BYTES);
                ida__rec_entry_header(out, &e);
                same(out, IDA__REC_ENTRY_HDR_BYTES, p,
                     IDA__REC_ENTRY_HDR_BYTES);
            }
            break;
        }
    }
    FUZZ_CHECK(rv == 0 || rv == IDA_ECORRUPT);
    ida_free(p);
    ida_free(out);
    return 0;
}
