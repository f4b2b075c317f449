/* Shared helpers of the storage tests (support code linked into every
 * binary of tests/storage). nftw() needs X/Open extensions. */
#define _XOPEN_SOURCE 700
#include "tests/storage/helpers.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/heap.h"

int ida_test_tmpdir(char *out, size_t cap, const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0') {
        base = "/tmp";
    }
    int n = snprintf(out, cap, "%s/ida-%s-XXXXXX", base, tag);
    if (n < 0 || (size_t)n >= cap) {
        return -1;
    }
    return mkdtemp(out) != NULL ? 0 : -1;
}

static int rm_one(const char *path,
                  const struct stat *st,
                  int flag,
                  struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int ida_test_rmrf(const char *path)
{
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

uint64_t ida_test_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ida_test_fill(uint8_t *buf, size_t len, ida_index index, ida_term term)
{
    uint64_t st = index * 1000003u + term;
    for (size_t i = 0; i < len; i++) {
        buf[i] = (uint8_t)ida_test_rand(&st);
    }
}

size_t ida_test_len(ida_index index, ida_term term, size_t max_len)
{
    uint64_t st = index ^ (term << 40) ^ 0x5bd1e995u;
    return max_len == 0 ? 0 : (size_t)(ida_test_rand(&st) % (max_len + 1));
}

int ida_test_entry_ok(const struct ida_entry *e, size_t max_len)
{
    size_t len = ida_test_len(e->index, e->term, max_len);
    if (e->len != len || e->type != (enum ida_entry_type)(e->index % 3)) {
        return 0;
    }
    uint8_t *want = ida_malloc(len + 1);
    if (want == NULL) {
        return 0;
    }
    ida_test_fill(want, len, e->index, e->term);
    int ok = len == 0 || memcmp(want, e->data, len) == 0;
    ida_free(want);
    return ok;
}

uint8_t *ida_test_make_entries(struct ida_entry *out,
                               size_t count,
                               ida_index first,
                               ida_term term,
                               size_t max_len)
{
    size_t total = 1;
    for (size_t i = 0; i < count; i++) {
        total += ida_test_len(first + i, term, max_len);
    }
    uint8_t *block = ida_malloc(total);
    if (block == NULL) {
        return NULL;
    }
    size_t off = 0;
    for (size_t i = 0; i < count; i++) {
        struct ida_entry *e = &out[i];
        e->index = first + i;
        e->term = term;
        e->type = (enum ida_entry_type)(e->index % 3);
        e->len = ida_test_len(e->index, term, max_len);
        e->data = block + off;
        ida_test_fill(e->data, e->len, e->index, term);
        off += e->len;
    }
    return block;
}
