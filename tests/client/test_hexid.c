/* Increasing hex identifiers: fixed groups, order preserved, round trip. */
#include <criterion/criterion.h>
#include <string.h>

#include "idalloc.h"

Test(hexid, format_examples)
{
    char buf[IDALLOC_HEX_ID_LEN + 1];
    idalloc_format_hex(1, buf);
    cr_assert_str_eq(buf, "0000-0000-0000-0001");
    idalloc_format_hex(0xabcdef0123456789ull, buf);
    cr_assert_str_eq(buf, "abcd-ef01-2345-6789");
    idalloc_format_hex(UINT64_MAX, buf);
    cr_assert_str_eq(buf, "ffff-ffff-ffff-ffff");
}

Test(hexid, lexicographic_order_is_numeric_order)
{
    uint64_t x = 0x2545F4914F6CDD1Dull;
    char a[IDALLOC_HEX_ID_LEN + 1], b[IDALLOC_HEX_ID_LEN + 1];
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t u = x >> (i % 64), v = u + 1 + (x % 1000);
        if (v < u) {
            continue;
        }
        idalloc_format_hex(u, a);
        idalloc_format_hex(v, b);
        cr_assert_lt(strcmp(a, b), 0, "%s !< %s", a, b);
        uint64_t back;
        cr_assert_eq(idalloc_parse_hex(a, &back), 0);
        cr_assert_eq(back, u);
    }
}

Test(hexid, parse_rejects_bad_input)
{
    uint64_t v;
    cr_assert_eq(idalloc_parse_hex("0000-0000-0000-000", &v), IDA_EINVAL);
    cr_assert_eq(idalloc_parse_hex("0000-0000-0000-000g", &v), IDA_EINVAL);
    cr_assert_eq(idalloc_parse_hex("0000+0000-0000-0001", &v), IDA_EINVAL);
    cr_assert_eq(idalloc_parse_hex("0000-0000-0000-0001x", &v), IDA_EINVAL);
    cr_assert_eq(idalloc_parse_hex("ABCD-0000-0000-0001", &v), IDA_EINVAL);
    cr_assert_eq(idalloc_parse_hex(NULL, &v), IDA_EINVAL);
}
