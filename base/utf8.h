/* UTF-8 validity, as strict decoders of protobuf `string` fields (and RFC
 * 3629) define it: no overlong forms, no UTF-16 surrogates (U+D800 to
 * U+DFFF), nothing above U+10FFFF. Pure; no allocation. */
#ifndef IDA_BASE_UTF8_H
#define IDA_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* True when the @len bytes at @p are valid UTF-8 (NUL, U+0000, is valid:
 * callers that refuse it check for it themselves). */
bool ida_utf8_valid(const void *p, size_t len);

#endif /* IDA_BASE_UTF8_H */
