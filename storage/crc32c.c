/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78).
 *
 * Every record, log entry and snapshot chunk is checksummed, so this sits on
 * the write path of every acknowledged alloc (a profile of the leader showed
 * 4.5% of its time in the old byte-wise table). Two versions, one answer:
 *   - x86-64 with SSE4.2: the crc32 instruction, 8 bytes per step (picked at
 *     load time with __builtin_cpu_supports; the function is compiled for
 *     SSE4.2 by a target attribute, so the rest of the build stays generic);
 *   - everywhere else: slicing-by-8 (eight 256-entry tables, 8 bytes per
 *     step, no instruction needed). ARMv8's crc32c instructions would be the
 *     same shape; not done because no ARM machine was at hand to test it.
 * The tables are built by a constructor at load time, before any thread can
 * call in, so no call ever races on them. */
#include <stdint.h>
#include <string.h>

#include "base/assert.h"
#include "storage/record.h"

static uint32_t crc_tables[8][256];
static int crc_ready;
static int crc_use_hw;

uint32_t ida__crc32c_portable(uint32_t crc, const void *data, size_t len)
{
    IDA_ASSERT(crc_ready);
    const uint8_t *p = data;
    crc = ~crc;
    while (len >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                             (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_tables[7][lo & 0xff] ^ crc_tables[6][(lo >> 8) & 0xff] ^
              crc_tables[5][(lo >> 16) & 0xff] ^ crc_tables[4][lo >> 24] ^
              crc_tables[3][p[4]] ^ crc_tables[2][p[5]] ^ crc_tables[1][p[6]] ^
              crc_tables[0][p[7]];
        p += 8;
        len -= 8;
    }
    while (len-- > 0) {
        crc = crc_tables[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc,
                                                               const void *data,
                                                               size_t len)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    while (len-- > 0) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
    }
    return ~(uint32_t)c;
}
#define HAVE_HW 1
#endif

uint32_t ida__crc32c(uint32_t crc, const void *data, size_t len)
{
#ifdef HAVE_HW
    if (crc_use_hw) {
        return crc32c_sse42(crc, data, len);
    }
#endif
    return ida__crc32c_portable(crc, data, len);
}

int ida__crc32c_hw(void)
{
    return crc_use_hw;
}

__attribute__((constructor)) static void crc_init_at_load(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_tables[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            uint32_t prev = crc_tables[t - 1][i];
            crc_tables[t][i] = crc_tables[0][prev & 0xff] ^ (prev >> 8);
        }
    }
    crc_ready = 1;
#ifdef HAVE_HW
    __builtin_cpu_init();
    crc_use_hw = __builtin_cpu_supports("sse4.2");
#endif
}
