#include "base/utf8.h"

#include <stdint.h>

bool ida_utf8_valid(const void *p, size_t len)
{
    const uint8_t *s = p;
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            n = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            if (c == 0xE0) {
                lo = 0xA0; /* overlong below U+0800 */
            } else if (c == 0xED) {
                hi = 0x9F; /* surrogates */
            }
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            if (c == 0xF0) {
                lo = 0x90; /* overlong below U+10000 */
            } else if (c == 0xF4) {
                hi = 0x8F; /* above U+10FFFF */
            }
        } else {
            return false; /* continuation byte, C0, C1 or F5..FF */
        }
        if (len - i < n || s[i + 1] < lo || s[i + 1] > hi) {
            return false;
        }
        for (size_t k = 2; k < n; k++) {
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) {
                return false;
            }
        }
        i += n;
    }
    return true;
}
