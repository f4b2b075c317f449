#include "storage/record.h"

#include <string.h>

#include "base/assert.h"
#include "idalloc_errors.h"

/* Spelled out, not loops: the compiler makes one load or store of each
 * (and a byte swap), where it kept the loops byte by byte
 * (storage/internal.h, ida__le64()). */
void ida__put_be64(uint8_t *p, uint64_t v)
{
    p[0] = (uint8_t)(v >> 56);
    p[1] = (uint8_t)(v >> 48);
    p[2] = (uint8_t)(v >> 40);
    p[3] = (uint8_t)(v >> 32);
    p[4] = (uint8_t)(v >> 24);
    p[5] = (uint8_t)(v >> 16);
    p[6] = (uint8_t)(v >> 8);
    p[7] = (uint8_t)v;
}

void ida__put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

uint64_t ida__get_be64(const uint8_t *p)
{
    return (uint64_t)p[0] << 56 | (uint64_t)p[1] << 48 | (uint64_t)p[2] << 40 |
           (uint64_t)p[3] << 32 | (uint64_t)p[4] << 24 | (uint64_t)p[5] << 16 |
           (uint64_t)p[6] << 8 | (uint64_t)p[7];
}

uint32_t ida__get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           (uint32_t)p[3];
}

/* Seal a record: the last 4 bytes get the CRC of everything before them. */
static void seal(uint8_t *p, size_t len)
{
    ida__put_be32(p + len - 4, ida__crc32c(0, p, len - 4));
}

/* Check magic and trailing CRC of a sealed record. */
static int check_sealed(const uint8_t *p, size_t len, const char magic[4])
{
    if (len < 8 || memcmp(p, magic, 4) != 0) {
        return IDA_ECORRUPT;
    }
    if (ida__get_be32(p + len - 4) != ida__crc32c(0, p, len - 4)) {
        return IDA_ECORRUPT;
    }
    return 0;
}

void ida__rec_format_encode(uint8_t out[IDA__REC_FORMAT_BYTES],
                            uint32_t version)
{
    memcpy(out, "IDAF", 4);
    ida__put_be32(out + 4, version);
    seal(out, IDA__REC_FORMAT_BYTES);
}

int ida__rec_format_decode(const uint8_t *p, size_t len, uint32_t *version)
{
    if (len != IDA__REC_FORMAT_BYTES || check_sealed(p, len, "IDAF") != 0) {
        return IDA_ECORRUPT;
    }
    *version = ida__get_be32(p + 4);
    return 0;
}

size_t ida__rec_identity_encode(uint8_t *out,
                                ida_node_id node_id,
                                const char *name,
                                size_t name_len)
{
    IDA_ASSERT(name_len <= UINT16_MAX);
    memcpy(out, "IDAI", 4);
    ida__put_be32(out + 4, node_id);
    out[8] = (uint8_t)(name_len >> 8);
    out[9] = (uint8_t)name_len;
    memcpy(out + 10, name, name_len);
    size_t len = IDA__REC_IDENTITY_FIXED + name_len;
    seal(out, len);
    return len;
}

int ida__rec_identity_decode(const uint8_t *p,
                             size_t len,
                             ida_node_id *node_id,
                             const char **name,
                             size_t *name_len)
{
    if (len < IDA__REC_IDENTITY_FIXED || check_sealed(p, len, "IDAI") != 0) {
        return IDA_ECORRUPT;
    }
    size_t n = ((size_t)p[8] << 8) | p[9];
    if (len != IDA__REC_IDENTITY_FIXED + n) {
        return IDA_ECORRUPT;
    }
    *node_id = ida__get_be32(p + 4);
    *name = (const char *)p + 10;
    *name_len = n;
    return 0;
}

size_t ida__rec_identity2_encode(uint8_t *out,
                                 const struct ida__rec_identity *r)
{
    IDA_ASSERT(r->name_len <= UINT16_MAX);
    memcpy(out, "IDAN", 4);
    ida__put_be32(out + 4, r->node_id);
    ida__put_be64(out + 8, r->incarnation);
    ida__put_be64(out + 16, r->created_at_ms);
    out[24] = (uint8_t)(r->name_len >> 8);
    out[25] = (uint8_t)r->name_len;
    memcpy(out + 26, r->name, r->name_len);
    size_t len = IDA__REC_IDENTITY2_FIXED + r->name_len;
    seal(out, len);
    return len;
}

int ida__rec_identity2_decode(const uint8_t *p,
                              size_t len,
                              struct ida__rec_identity *r)
{
    if (len < IDA__REC_IDENTITY2_FIXED || check_sealed(p, len, "IDAN") != 0) {
        return IDA_ECORRUPT;
    }
    size_t n = ((size_t)p[24] << 8) | p[25];
    if (len != IDA__REC_IDENTITY2_FIXED + n) {
        return IDA_ECORRUPT;
    }
    r->format = 0;
    r->node_id = ida__get_be32(p + 4);
    r->incarnation = ida__get_be64(p + 8);
    r->created_at_ms = ida__get_be64(p + 16);
    r->name = (const char *)p + 26;
    r->name_len = n;
    return 0;
}

size_t ida__rec_idfile_encode(uint8_t *out, const struct ida__rec_identity *r)
{
    IDA_ASSERT(r->name_len <= UINT16_MAX);
    memcpy(out, "IDAY", 4);
    ida__put_be32(out + 4, r->format);
    ida__put_be32(out + 8, r->node_id);
    ida__put_be64(out + 12, r->incarnation);
    ida__put_be64(out + 20, r->created_at_ms);
    out[28] = (uint8_t)(r->name_len >> 8);
    out[29] = (uint8_t)r->name_len;
    memcpy(out + 30, r->name, r->name_len);
    size_t len = IDA__REC_IDFILE_FIXED + r->name_len;
    seal(out, len);
    return len;
}

int ida__rec_idfile_decode(const uint8_t *p,
                           size_t len,
                           struct ida__rec_identity *r)
{
    if (len < IDA__REC_IDFILE_FIXED || check_sealed(p, len, "IDAY") != 0) {
        return IDA_ECORRUPT;
    }
    size_t n = ((size_t)p[28] << 8) | p[29];
    if (len != IDA__REC_IDFILE_FIXED + n) {
        return IDA_ECORRUPT;
    }
    r->format = ida__get_be32(p + 4);
    r->node_id = ida__get_be32(p + 8);
    r->incarnation = ida__get_be64(p + 12);
    r->created_at_ms = ida__get_be64(p + 20);
    r->name = (const char *)p + 30;
    r->name_len = n;
    return 0;
}

void ida__rec_hard_state_encode(uint8_t out[IDA__REC_HARD_STATE_BYTES],
                                const struct ida_hard_state *hs)
{
    memcpy(out, "IDAH", 4);
    ida__put_be64(out + 4, hs->term);
    ida__put_be32(out + 12, hs->vote);
    ida__put_be64(out + 16, hs->commit);
    seal(out, IDA__REC_HARD_STATE_BYTES);
}

int ida__rec_hard_state_decode(const uint8_t *p,
                               size_t len,
                               struct ida_hard_state *hs)
{
    if (len != IDA__REC_HARD_STATE_BYTES || check_sealed(p, len, "IDAH") != 0) {
        return IDA_ECORRUPT;
    }
    hs->term = ida__get_be64(p + 4);
    hs->vote = ida__get_be32(p + 12);
    hs->commit = ida__get_be64(p + 16);
    return 0;
}

void ida__rec_log_prev_encode(uint8_t out[IDA__REC_LOG_PREV_BYTES],
                              ida_index index,
                              ida_term term)
{
    memcpy(out, "IDAP", 4);
    ida__put_be64(out + 4, index);
    ida__put_be64(out + 12, term);
    seal(out, IDA__REC_LOG_PREV_BYTES);
}

int ida__rec_log_prev_decode(const uint8_t *p,
                             size_t len,
                             ida_index *index,
                             ida_term *term)
{
    if (len != IDA__REC_LOG_PREV_BYTES || check_sealed(p, len, "IDAP") != 0) {
        return IDA_ECORRUPT;
    }
    *index = ida__get_be64(p + 4);
    *term = ida__get_be64(p + 12);
    return 0;
}

/* "MAGC" | u64 | u32 crc: the boot and log_lsn records. */
static void u64_encode(uint8_t out[IDA__REC_BOOT_BYTES],
                       const char magic[4],
                       uint64_t v)
{
    memcpy(out, magic, 4);
    ida__put_be64(out + 4, v);
    seal(out, IDA__REC_BOOT_BYTES);
}

static int u64_decode(const uint8_t *p,
                      size_t len,
                      const char magic[4],
                      uint64_t *v)
{
    if (len != IDA__REC_BOOT_BYTES || check_sealed(p, len, magic) != 0) {
        return IDA_ECORRUPT;
    }
    *v = ida__get_be64(p + 4);
    return 0;
}

void ida__rec_boot_encode(uint8_t out[IDA__REC_BOOT_BYTES], uint64_t count)
{
    u64_encode(out, "IDAB", count);
}

int ida__rec_boot_decode(const uint8_t *p, size_t len, uint64_t *count)
{
    return u64_decode(p, len, "IDAB", count);
}

void ida__rec_log_lsn_encode(uint8_t out[IDA__REC_BOOT_BYTES], uint64_t lsn)
{
    u64_encode(out, "IDAL", lsn);
}

int ida__rec_log_lsn_decode(const uint8_t *p, size_t len, uint64_t *lsn)
{
    return u64_decode(p, len, "IDAL", lsn);
}

size_t ida__rec_untrusted_encode(uint8_t *out, const char *reason, size_t len)
{
    IDA_ASSERT(len <= IDA__REC_REASON_MAX);
    memcpy(out, "IDAU", 4);
    out[4] = (uint8_t)(len >> 8);
    out[5] = (uint8_t)len;
    memcpy(out + 6, reason, len);
    size_t n = IDA__REC_UNTRUSTED_FIXED + len;
    seal(out, n);
    return n;
}

int ida__rec_untrusted_decode(const uint8_t *p,
                              size_t len,
                              const char **reason,
                              size_t *reason_len)
{
    if (len < IDA__REC_UNTRUSTED_FIXED || check_sealed(p, len, "IDAU") != 0) {
        return IDA_ECORRUPT;
    }
    size_t n = ((size_t)p[4] << 8) | p[5];
    if (n > IDA__REC_REASON_MAX || len != IDA__REC_UNTRUSTED_FIXED + n) {
        return IDA_ECORRUPT;
    }
    *reason = (const char *)p + 6;
    *reason_len = n;
    return 0;
}

size_t ida__rec_snapshot_encode(uint8_t *out, const struct ida__rec_snapshot *r)
{
    int v1 = r->chunk_bytes == IDA__REC_CHUNK_BYTES_V1;
    memcpy(out, v1 ? "IDAS" : "IDAT", 4);
    ida__put_be64(out + 4, r->id);
    ida__put_be64(out + 12, r->index);
    ida__put_be64(out + 20, r->term);
    ida__put_be64(out + 28, r->size);
    ida__put_be32(out + 36, r->data_crc);
    ida__put_be64(out + 40, r->chunks);
    size_t at = 48;
    if (!v1) {
        ida__put_be32(out + at, r->chunk_bytes);
        at += 4;
    }
    ida__put_be32(out + at, r->config_len);
    if (r->config_len > 0) {
        memcpy(out + at + 4, r->config, r->config_len);
    }
    size_t len = (v1 ? IDA__REC_SNAPSHOT_V1_FIXED : IDA__REC_SNAPSHOT_FIXED) +
                 r->config_len;
    seal(out, len);
    return len;
}

int ida__rec_snapshot_decode(const uint8_t *p,
                             size_t len,
                             struct ida__rec_snapshot *r)
{
    int v1 = len >= 4 && memcmp(p, "IDAS", 4) == 0;
    size_t fixed = v1 ? IDA__REC_SNAPSHOT_V1_FIXED : IDA__REC_SNAPSHOT_FIXED;
    if (len < fixed || check_sealed(p, len, v1 ? "IDAS" : "IDAT") != 0) {
        return IDA_ECORRUPT;
    }
    size_t at = 48;
    uint32_t chunk_bytes = IDA__REC_CHUNK_BYTES_V1;
    if (!v1) {
        chunk_bytes = ida__get_be32(p + at);
        at += 4;
    }
    uint32_t config_len = ida__get_be32(p + at);
    if (len != fixed + (size_t)config_len) {
        return IDA_ECORRUPT;
    }
    r->id = ida__get_be64(p + 4);
    r->index = ida__get_be64(p + 12);
    r->term = ida__get_be64(p + 20);
    r->size = ida__get_be64(p + 28);
    r->data_crc = ida__get_be32(p + 36);
    r->chunks = ida__get_be64(p + 40);
    r->chunk_bytes = chunk_bytes;
    r->config_len = config_len;
    r->config = p + at + 4;
    if (chunk_bytes == 0 || chunk_bytes > IDA__REC_CHUNK_BYTES_MAX ||
        (!v1 && chunk_bytes == IDA__REC_CHUNK_BYTES_V1) || /* one encoding */
        r->chunks != r->size / chunk_bytes + (r->size % chunk_bytes != 0)) {
        return IDA_ECORRUPT;
    }
    return 0;
}

/* CRC of an entry: its index, the first 16 header bytes and the data. */
static uint32_t entry_crc(ida_index index,
                          const uint8_t *hdr,
                          const uint8_t *data,
                          size_t len)
{
    uint8_t key[8];
    ida__put_be64(key, index);
    uint32_t crc = ida__crc32c(0, key, 8);
    crc = ida__crc32c(crc, hdr, 16);
    return ida__crc32c(crc, data, len);
}

void ida__rec_entry_header(uint8_t out[IDA__REC_ENTRY_HDR_BYTES],
                           const struct ida_entry *e)
{
    IDA_ASSERT(e->len <= UINT32_MAX);
    memset(out, 0, IDA__REC_ENTRY_HDR_BYTES);
    ida__put_be64(out, e->term);
    out[8] = (uint8_t)e->type;
    ida__put_be32(out + 12, (uint32_t)e->len);
    ida__put_be32(out + 16, entry_crc(e->index, out, e->data, e->len));
}

int ida__rec_entry_decode(const uint8_t *p,
                          size_t len,
                          ida_index index,
                          struct ida_entry *e)
{
    int rv = ida__rec_entry_peek(p, len, index, e);
    return rv != 0 ? rv : ida__rec_entry_check(p, e->data, index);
}

int ida__rec_entry_check(const uint8_t *p, const uint8_t *data, ida_index index)
{
    uint32_t data_len = ida__get_be32(p + 12);
    return ida__get_be32(p + 16) == entry_crc(index, p, data, data_len)
               ? 0
               : IDA_ECORRUPT;
}

int ida__rec_entry_peek(const uint8_t *p,
                        size_t len,
                        ida_index index,
                        struct ida_entry *e)
{
    if (len < IDA__REC_ENTRY_HDR_BYTES) {
        return IDA_ECORRUPT;
    }
    uint32_t data_len = ida__get_be32(p + 12);
    if (len != IDA__REC_ENTRY_HDR_BYTES + (size_t)data_len) {
        return IDA_ECORRUPT;
    }
    const uint8_t *data = p + IDA__REC_ENTRY_HDR_BYTES;
    /* Bytes 9-11 and 20-23 are written as zeros; 20-23 are outside the CRC,
     * so a damaged byte there is only caught here. */
    static const uint8_t zero[4];
    if (memcmp(p + 9, zero, 3) != 0 || memcmp(p + 20, zero, 4) != 0) {
        return IDA_ECORRUPT;
    }
    if (p[8] > IDA_ENTRY_CONFIG) {
        return IDA_ECORRUPT;
    }
    e->term = ida__get_be64(p);
    e->index = index;
    e->type = (enum ida_entry_type)p[8];
    e->data = (uint8_t *)data;
    e->len = data_len;
    return 0;
}

uint32_t ida__rec_chunk_crc(uint64_t id,
                            uint64_t chunk,
                            const uint8_t *data,
                            size_t len)
{
    uint8_t key[16];
    ida__put_be64(key, id);
    ida__put_be64(key + 8, chunk);
    return ida__crc32c(ida__crc32c(0, key, 16), data, len);
}
