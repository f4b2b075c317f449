/* Shared by the libFuzzer harnesses of tests/fuzz/ (built by mk/fuzz.mk
 * with clang -fsanitize=fuzzer,address,undefined, never by the default
 * build). Each fuzz_NAME.c defines LLVMFuzzerTestOneInput() and checks the
 * module's invariants with FUZZ_CHECK, which aborts (a crash libFuzzer
 * records) with the broken condition: a harness finds wrong answers, not
 * only memory errors. */
#ifndef IDA_TEST_FUZZ_H
#define IDA_TEST_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                               \
    do {                                                               \
        if (!(cond)) {                                                 \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, \
                    __LINE__, #cond);                                  \
            abort();                                                   \
        }                                                              \
    } while (0)

/* A cursor over the fuzzer's bytes: reads past the end give zeros. */
struct fuzz_in
{
    const uint8_t *p;
    size_t n;
};

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
    if (in->n == 0) {
        return 0;
    }
    in->n--;
    return *in->p++;
}

static inline uint16_t fuzz_u16(struct fuzz_in *in)
{
    uint16_t hi = fuzz_u8(in);
    return (uint16_t)(hi << 8 | fuzz_u8(in));
}

/* The next @want bytes (fewer at the end); *@len says how many. */
static inline const uint8_t *fuzz_bytes(struct fuzz_in *in,
                                        size_t want,
                                        size_t *len)
{
    const uint8_t *p = in->p;
    *len = want < in->n ? want : in->n;
    in->p += *len;
    in->n -= *len;
    return p;
}

#endif /* IDA_TEST_FUZZ_H */
