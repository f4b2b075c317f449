/* Fixed binary records of storage/ (private to the module and its tests).
 *
 * Every integer is big-endian; every record ends (or, for entries and chunks,
 * starts) with a CRC-32C (Castagnoli) so a torn, stale or foreign value is
 * detected by its checksum and its exact length, never trusted.
 *
 *   format     "IDAF" | u32 version | u32 crc                       12 bytes
 *   identity   (format 2) "IDAN" | u32 node_id | u64 incarnation
 *              | u64 created_at_ms | u16 name_len | name | u32 crc
 *   identity   (format 1) "IDAI" | u32 node_id | u16 name_len | name | u32 crc
 *   hard_state "IDAH" | u64 term | u32 vote | u64 commit | u32 crc  28 bytes
 *   log_prev   "IDAP" | u64 index | u64 term | u32 crc              24 bytes
 *   boot       "IDAB" | u64 count | u32 crc                         16 bytes
 *   log_lsn    "IDAL" | u64 lsn | u32 crc                           16 bytes
 *   untrusted  "IDAU" | u16 len | reason | u32 crc
 *   snapshot   "IDAT" | u64 id | u64 index | u64 term | u64 size
 *              | u32 data_crc | u64 chunks | u32 chunk_bytes | u32 config_len
 *              | config | u32 crc
 *   snapshot   (before chunk_bytes) "IDAS", as "IDAT" without chunk_bytes:
 *              chunks of IDA__REC_CHUNK_BYTES_V1 (read, and written only
 *              by tests)
 *   entry      u64 term | u8 type | 3 zero bytes | u32 len | u32 crc
 *              | u32 zero | data                     24-byte header + len
 *              crc covers the entry's index (the key), term, type, len, data
 *   chunk      u32 crc | data   crc covers snapshot id, chunk number, data
 *
 * and the file IDENTITY next to data.mdb (not in LMDB):
 *
 *   IDENTITY   "IDAY" | u32 format | u32 node_id | u64 incarnation
 *              | u64 created_at_ms | u16 name_len | name | u32 crc
 *
 * The format record is read first, on its own, so a future layout of the
 * other records can never be misread by this version.
 */
#ifndef IDA_STORAGE_RECORD_H
#define IDA_STORAGE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "base/types.h"

#define IDA__REC_FORMAT_BYTES      12
#define IDA__REC_HARD_STATE_BYTES  28
#define IDA__REC_LOG_PREV_BYTES    24
#define IDA__REC_BOOT_BYTES        16
#define IDA__REC_UNTRUSTED_FIXED   (4 + 2 + 4)
#define IDA__REC_REASON_MAX        400
#define IDA__REC_ENTRY_HDR_BYTES   24
#define IDA__REC_CHUNK_HDR_BYTES   4
#define IDA__REC_SNAPSHOT_FIXED    (4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 4 + 4)
#define IDA__REC_SNAPSHOT_V1_FIXED (IDA__REC_SNAPSHOT_FIXED - 4)
/* The chunk size of "IDAS" snapshot records, and the largest any may
 * have. */
#define IDA__REC_CHUNK_BYTES_V1  (64u * 1024u)
#define IDA__REC_CHUNK_BYTES_MAX (1u << 20)
#define IDA__REC_IDENTITY_FIXED  (4 + 4 + 2 + 4)
#define IDA__REC_IDENTITY2_FIXED (4 + 4 + 8 + 8 + 2 + 4)
#define IDA__REC_IDFILE_FIXED    (4 + 4 + 4 + 8 + 8 + 2 + 4)

/* CRC-32C (Castagnoli) of @data, continuing @crc (0 to start): the SSE4.2
 * crc32 instruction when the CPU has it, else the portable slicing-by-8
 * table (storage/crc32c.c). Both give the same value; thread-safe. */
uint32_t ida__crc32c(uint32_t crc, const void *data, size_t len);
/* The portable version alone (tests compare the two). */
uint32_t ida__crc32c_portable(uint32_t crc, const void *data, size_t len);
/* 1 when ida__crc32c() uses the CPU's instruction. */
int ida__crc32c_hw(void);

/* Joining CRC-32Cs of adjoining pieces without reading them again: the
 * multiplication that carries a CRC over @len zero bytes, as a table
 * (4 KiB: keep one per length, not one per piece). */
struct ida__crc32c_shift
{
    uint64_t len;
    uint32_t t[4 * 256];
};
void ida__crc32c_shift_init(struct ida__crc32c_shift *s, uint64_t len);
/* The CRC-32C of A then B from A's (@crc_a) and B's own (@crc_b, from 0),
 * B being s->len bytes. */
uint32_t ida__crc32c_join(const struct ida__crc32c_shift *s,
                          uint32_t crc_a,
                          uint32_t crc_b);

void ida__put_be64(uint8_t *p, uint64_t v);
void ida__put_be32(uint8_t *p, uint32_t v);
uint64_t ida__get_be64(const uint8_t *p);
uint32_t ida__get_be32(const uint8_t *p);

/* Encoders write exactly the sizes above; decoders return 0 or
 * IDA_ECORRUPT (wrong length, magic or checksum). */
void ida__rec_format_encode(uint8_t out[IDA__REC_FORMAT_BYTES],
                            uint32_t version);
int ida__rec_format_decode(const uint8_t *p, size_t len, uint32_t *version);

/* @out must hold IDA__REC_IDENTITY_FIXED + @name_len bytes. */
size_t ida__rec_identity_encode(uint8_t *out,
                                ida_node_id node_id,
                                const char *name,
                                size_t name_len);
/* *name points into @p (not NUL-terminated). */
int ida__rec_identity_decode(const uint8_t *p,
                             size_t len,
                             ida_node_id *node_id,
                             const char **name,
                             size_t *name_len);

/* The identity of format 2, in LMDB ("IDAN") and in the IDENTITY file
 * ("IDAY", which also carries the format). */
struct ida__rec_identity
{
    uint32_t format; /* IDENTITY file only */
    ida_node_id node_id;
    uint64_t incarnation;
    uint64_t created_at_ms;
    const char *name; /* borrowed; not NUL-terminated when decoded */
    size_t name_len;
};
/* @out must hold IDA__REC_IDENTITY2_FIXED + name_len bytes. */
size_t ida__rec_identity2_encode(uint8_t *out,
                                 const struct ida__rec_identity *r);
int ida__rec_identity2_decode(const uint8_t *p,
                              size_t len,
                              struct ida__rec_identity *r);
/* @out must hold IDA__REC_IDFILE_FIXED + name_len bytes. */
size_t ida__rec_idfile_encode(uint8_t *out, const struct ida__rec_identity *r);
int ida__rec_idfile_decode(const uint8_t *p,
                           size_t len,
                           struct ida__rec_identity *r);

void ida__rec_hard_state_encode(uint8_t out[IDA__REC_HARD_STATE_BYTES],
                                const struct ida_hard_state *hs);
int ida__rec_hard_state_decode(const uint8_t *p,
                               size_t len,
                               struct ida_hard_state *hs);

void ida__rec_log_prev_encode(uint8_t out[IDA__REC_LOG_PREV_BYTES],
                              ida_index index,
                              ida_term term);
int ida__rec_log_prev_decode(const uint8_t *p,
                             size_t len,
                             ida_index *index,
                             ida_term *term);

void ida__rec_boot_encode(uint8_t out[IDA__REC_BOOT_BYTES], uint64_t count);
int ida__rec_boot_decode(const uint8_t *p, size_t len, uint64_t *count);
/* The highest LSN of the entry log known durable (storage/logdir.c). */
void ida__rec_log_lsn_encode(uint8_t out[IDA__REC_BOOT_BYTES], uint64_t lsn);
int ida__rec_log_lsn_decode(const uint8_t *p, size_t len, uint64_t *lsn);

/* @out must hold IDA__REC_UNTRUSTED_FIXED + @len bytes, @len at most
 * IDA__REC_REASON_MAX. *reason points into @p (not NUL-terminated). */
size_t ida__rec_untrusted_encode(uint8_t *out, const char *reason, size_t len);
int ida__rec_untrusted_decode(const uint8_t *p,
                              size_t len,
                              const char **reason,
                              size_t *reason_len);

struct ida__rec_snapshot
{
    uint64_t id;
    ida_index index;
    ida_term term;
    uint64_t size;
    uint32_t data_crc;
    uint64_t chunks;
    uint32_t chunk_bytes;  /* each chunk's but the last's */
    const uint8_t *config; /* borrowed */
    uint32_t config_len;
};
/* @out must hold IDA__REC_SNAPSHOT_FIXED + config_len bytes. A record with
 * chunk_bytes IDA__REC_CHUNK_BYTES_V1 is written as "IDAS". */
size_t ida__rec_snapshot_encode(uint8_t *out,
                                const struct ida__rec_snapshot *r);
/* r->config points into @p. Refused (IDA_ECORRUPT) besides a bad checksum
 * or length: a chunk size of 0 or above IDA__REC_CHUNK_BYTES_MAX, an
 * "IDAT" of IDA__REC_CHUNK_BYTES_V1 (a record has one encoding), and a
 * chunk count that is not the size's in chunks of that size. */
int ida__rec_snapshot_decode(const uint8_t *p,
                             size_t len,
                             struct ida__rec_snapshot *r);

/* Entry: header only (data follows it in the same value). */
void ida__rec_entry_header(uint8_t out[IDA__REC_ENTRY_HDR_BYTES],
                           const struct ida_entry *e);
/* Check a stored value for entry @index; fills @e with data pointing into
 * @p. ida__rec_entry_peek() and then ida__rec_entry_check(). */
int ida__rec_entry_decode(const uint8_t *p,
                          size_t len,
                          ida_index index,
                          struct ida_entry *e);
/* Everything but the checksum: length, zero bytes, type. */
int ida__rec_entry_peek(const uint8_t *p,
                        size_t len,
                        ida_index index,
                        struct ida_entry *e);
/* The checksum of the entry whose header is at @p (peeked) and whose data
 * is at @data: in the value, or a copy of it. 0 or IDA_ECORRUPT. */
int ida__rec_entry_check(const uint8_t *p,
                         const uint8_t *data,
                         ida_index index);

uint32_t ida__rec_chunk_crc(uint64_t id,
                            uint64_t chunk,
                            const uint8_t *data,
                            size_t len);

#endif /* IDA_STORAGE_RECORD_H */
