/* Crash durability with real processes (shared by test_storage_crash.c and
 * the `storage_crash` helper behind `make chaos-storage`).
 *
 * Each round forks a child that opens the storage in @dir, runs a seeded
 * sequence of steps - batches (appends, occasional conflicting-suffix
 * truncations, term and vote changes, commit index advances) and, now and
 * then, a snapshot of the committed prefix (0-200 KiB written in pieces,
 * every other one carried by a batch of its own)
 * followed by a compaction - and writes one byte to a pipe after each step
 * returns. The parent mirrors the same sequence in an
 * in-memory model, kill -9s the child after a random number of reports plus
 * a random delay, then opens the storage itself and requires the log and hard
 * state to equal the model after exactly the reported steps, or after the one
 * in flight (a batch as a whole; a snapshot step finished, or finished and
 * compacted): every
 * reported step present and intact, no torn entry, a clean prefix. The next
 * round continues from what was found. Every 20th round and the last one
 * check the whole log; the others check the bounds, the hard state and the
 * entries from the commit index the round started with (below it nothing
 * may change), so long runs stay linear. */
#ifndef IDA_TESTS_STORAGE_CRASH_H
#define IDA_TESTS_STORAGE_CRASH_H

#include <stddef.h>
#include <stdint.h>

struct ida_crash_stats
{
    unsigned rounds;
    unsigned long batches_reported; /* steps: batches and snapshot steps */
    unsigned long snapshots_reported;
    unsigned in_flight_found; /* rounds where the unreported batch was found */
    unsigned killed_before_first_report;
    unsigned child_finished; /* the child ran out of batches before the kill */
    unsigned long entries_checked;
};

/* Run @rounds rounds in @dir (created if missing) from @seed. Returns 0, or
 * -1 with a one-line reason in @err (@errcap bytes). */
int ida_crash_run(const char *dir,
                  unsigned rounds,
                  uint64_t seed,
                  struct ida_crash_stats *stats,
                  char *err,
                  size_t errcap);

#endif
