/* Support code shared by the harnesses of tests/fuzz/ (linked into each of
 * them by mk/fuzz.mk): building log entries for a real state machine and
 * checking what it answers. */
#ifndef IDA_TEST_FUZZSUPPORT_H
#define IDA_TEST_FUZZSUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "fsm/fsm.h"

/* Encode @n commands as a CommandBatch of version IDA_BATCH_VERSION into a
 * new buffer (*@out, ida_malloc'd); returns its length. */
size_t fz_batch_pack(Idalloc__Command **cmds,
                     size_t n,
                     uint64_t timestamp_ms,
                     uint8_t **out);

/* Apply the entry after @f's applied index; the fuzzed code must never make
 * this fail (out of memory aside, which the harnesses do not inject). */
void fz_apply(struct ida_fsm *f,
              const uint8_t *data,
              size_t len,
              struct ida_fsm_applied *out);

/* Give @f a little of everything: a bounded pool "b" (size 100) with
 * holdings, a sequence pool "s" with a block taken, a prefix pool "p" with
 * prefixes, and sessions of two clients. */
void fz_fsm_populate(struct ida_fsm *f);

/* Check what the state machine promises about @f after any input: the
 * snapshot restores into a fresh state machine whose snapshot is the same
 * bytes, and every holding listed can be looked up by its tag. */
void fz_fsm_check(const struct ida_fsm *f);

#endif /* IDA_TEST_FUZZSUPPORT_H */
