/* base/utf8.c: strict UTF-8, as proto3 `string` decoders require. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/utf8.h"

static bool ok(const char *s)
{
    return ida_utf8_valid(s, strlen(s));
}

Test(utf8, valid_forms_at_every_length)
{
    cr_assert(ok(""));
    cr_assert(ok("plain ascii ~"));
    cr_assert(ok("\xc2\x80"));         /* U+0080, first 2-byte */
    cr_assert(ok("\xdf\xbf"));         /* U+07FF */
    cr_assert(ok("\xe0\xa0\x80"));     /* U+0800 */
    cr_assert(ok("\xed\x9f\xbf"));     /* U+D7FF, below surrogates */
    cr_assert(ok("\xee\x80\x80"));     /* U+E000, above them */
    cr_assert(ok("\xef\xbf\xbf"));     /* U+FFFF */
    cr_assert(ok("\xf0\x90\x80\x80")); /* U+10000 */
    cr_assert(ok("\xf4\x8f\xbf\xbf")); /* U+10FFFF, the last */
    cr_assert(ok("\xc3\xa9t\xc3\xa9 \xf0\x9f\x90\x8d"));
    cr_assert(ida_utf8_valid("a\0b", 3), "U+0000 is UTF-8 (callers refuse it)");
}

Test(utf8, invalid_forms)
{
    static const char *const bad[] = {
        "\x80",             /* lone continuation */
        "\xbf",             /* lone continuation */
        "\xc0\x80",         /* overlong NUL */
        "\xc1\xbf",         /* overlong */
        "\xe0\x9f\xbf",     /* overlong 3-byte */
        "\xf0\x8f\xbf\xbf", /* overlong 4-byte */
        "\xed\xa0\x80",     /* surrogate U+D800 */
        "\xed\xbf\xbf",     /* surrogate U+DFFF */
        "\xf4\x90\x80\x80", /* U+110000 */
        "\xf5\x80\x80\x80", /* F5 never appears */
        "\xff",
        "\xc3",             /* truncated */
        "\xe2\x82",         /* truncated */
        "\xf0\x9f\x90",     /* truncated */
        "\xc3\x28",         /* bad continuation */
        "\xe2\x28\xa1",     /* bad continuation */
        "\xf0\x9f\x28\x8d", /* bad continuation */
        "ok\xff",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_not(ok(bad[i]), "accepted case %zu", i);
    }
}
