/* Fuzz the decoding of log entries (fsm/batch.c): the hand reader against
 * protobuf-c, which must agree on every input.
 *
 * Input: the bytes of an ENTRY_NORMAL entry. Checked: when the hand reader
 * claims the bytes, protobuf-c accepts them too and builds the same batch,
 * field by field (tests/lib/batch_eq.h); ida__batch_unpack() refuses
 * exactly what protobuf-c refuses; and applying the entry to a state
 * machine holding pools and sessions succeeds (a malformed entry is an
 * entry_error, never a failure). */
#include <stdbool.h>

#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzzsupport.h"
#include "tests/lib/batch_eq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ida_fsm *f;
    FUZZ_CHECK(ida_fsm_new(&f) == 0);
    Idalloc__CommandBatch *pb =
        idalloc__command_batch__unpack(NULL, size, data);
    Idalloc__CommandBatch *mine = NULL;
    int rv = ida__batch_decode_simple(&f->arena, data, size, &mine);
    FUZZ_CHECK(rv == 0 || rv == 1);
    if (rv == 0) {
        FUZZ_CHECK(pb != NULL);
        FUZZ_CHECK(be_batch(mine, pb));
    }
    ida__arena_reset(&f->arena);
    Idalloc__CommandBatch *u = ida__batch_unpack(&f->arena, data, size);
    bool refused = u == NULL;
    FUZZ_CHECK(refused == (pb == NULL));
    if (pb != NULL) {
        idalloc__command_batch__free_unpacked(pb, NULL);
    }
    ida_fsm_free(f);

    FUZZ_CHECK(ida_fsm_new(&f) == 0);
    fz_fsm_populate(f);
    struct ida_fsm_applied a;
    fz_apply(f, data, size, &a);
    FUZZ_CHECK((a.entry_error == IDA_EPROTO) == refused);
    ida_fsm_free(f);
    return 0;
}
