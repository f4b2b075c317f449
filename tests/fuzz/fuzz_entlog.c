/* Fuzz the entry log's replay (storage/entlog.h): the records an open
 * reads back from log/ are hostile until checked, as a peer's bytes are.
 * No files: ida__entlog_replay() takes the records as the open's segment
 * log would hand them over.
 *
 * Input: byte 0 the prev index (0..15), byte 1 its term (0..3), byte 2
 * how far beyond it the snapshot lies (0..3) and byte 3 that snapshot's
 * term; then records, each a u16 length (little-endian) and its bytes.
 * Checked: the replay answers 0 or IDA_ECORRUPT (never crashes, never
 * reads out of bounds); a log it accepts begins at prev or at the
 * snapshot, has nondecreasing terms from prev's, none 0, a term for every
 * index in its bounds and none outside. */
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/entlog.h"
#include "tests/fuzz/fuzz.h"

#define RECORDS_MAX 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4 || size > 65536) {
        return 0;
    }
    ida_index prev = data[0] % 16;
    ida_term prev_term = prev == 0 ? 0 : 1 + data[1] % 3;
    ida_index snap = prev + data[2] % 4;
    ida_term snap_term = snap == prev ? prev_term : 1 + data[3] % 4;
    const uint8_t *recs[RECORDS_MAX];
    size_t lens[RECORDS_MAX], n = 0;
    size_t at = 4;
    while (n < RECORDS_MAX && size - at >= 2) {
        size_t len = (size_t)data[at] | (size_t)data[at + 1] << 8;
        at += 2;
        if (len > size - at) {
            len = size - at;
        }
        recs[n] = data + at;
        lens[n] = len;
        n++;
        at += len;
    }
    struct ida_entlog *l = NULL;
    char err[256];
    int rv = ida__entlog_replay(prev, prev_term, snap, snap_term, recs, lens, n,
                                &l, err, sizeof(err));
    FUZZ_CHECK(rv == 0 || rv == IDA_ECORRUPT || rv == IDA_ENOMEM);
    if (rv != 0) {
        FUZZ_CHECK(rv == IDA_ENOMEM || err[0] != '\0');
        return 0;
    }
    ida_index p, last;
    ida_term pt;
    ida_entlog_bounds(l, &p, &pt, &last);
    FUZZ_CHECK((p == prev && pt == prev_term) ||
               (p > prev && p <= snap && (p < snap || pt == snap_term)));
    FUZZ_CHECK(last >= p);
    ida_term t, before = pt;
    FUZZ_CHECK(ida_entlog_term_at(l, p, &t) == 0 && t == pt);
    for (ida_index i = p + 1; i <= last; i++) {
        FUZZ_CHECK(ida_entlog_term_at(l, i, &t) == 0);
        FUZZ_CHECK(t != 0 && t >= before);
        before = t;
    }
    FUZZ_CHECK(ida_entlog_term_at(l, last + 1, &t) == IDA_ENOTFOUND);
    if (p > 0) {
        FUZZ_CHECK(ida_entlog_term_at(l, p - 1, &t) == IDA_ENOTFOUND);
    }
    ida_entlog_close(l);
    return 0;
}
