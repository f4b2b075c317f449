/* Shared helpers of the storage tests, the crash helper and the benchmark. */
#ifndef IDA_TESTS_STORAGE_HELPERS_H
#define IDA_TESTS_STORAGE_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "base/types.h"
#include "storage/storage.h"

/* Create a fresh temporary directory under $TMPDIR (default /tmp) into @out
 * (at least 256 bytes). Returns 0 or -1. */
int ida_test_tmpdir(char *out, size_t cap, const char *tag);

/* rm -rf @path. Returns 0 or -1. */
int ida_test_rmrf(const char *path);

/* Deterministic entry content: @len bytes derived from (index, term). */
void ida_test_fill(uint8_t *buf, size_t len, ida_index index, ida_term term);

/* Length of the data of entry (index, term): 0..@max_len, deterministic. */
size_t ida_test_len(ida_index index, ida_term term, size_t max_len);

/* True when @e carries exactly the deterministic content for its index and
 * term with length ida_test_len(index, term, max_len). */
int ida_test_entry_ok(const struct ida_entry *e, size_t max_len);

/* Build @count entries from @first with term @term into @out, with data
 * from ida_test_fill in one ida_malloc'd block returned (free it after). */
uint8_t *ida_test_make_entries(struct ida_entry *out,
                               size_t count,
                               ida_index first,
                               ida_term term,
                               size_t max_len);

/* splitmix64 step. */
uint64_t ida_test_rand(uint64_t *state);

#endif
