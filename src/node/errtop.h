/* Error top keeper: the most frequent distinct errors of one thread, with
 * counts and last-seen times, dumped to a file that `idalloc status
 * --verbose` shows.
 *
 * DESIGN
 *
 * One keeper per worker thread (not thread-safe; ida_errtop_sink() gives each
 * pool worker its own, file "<dir>/errtop-<thread>.pb"). An error is keyed by
 * (code, text). At most IDA_ERRTOP_SIZE distinct errors are kept: when a new
 * one arrives and the table is full, the least frequent one goes (ties: the
 * one seen longest ago); errors not seen for keep_ms are removed. A linear
 * scan of a fixed array: with 32 entries a scan is cheaper than keeping
 * ordered sets and allocates nothing.
 *
 * Dump (idalloc.ErrorTopDump, proto/idalloc.proto): encode, write to
 * "<path>.tmp", fsync, rename over <path>, fsync the directory, so a reader
 * (idalloc status) sees the old or the new file, never a torn one. The keeper
 * dumps when an error was added and dump_interval_ms passed since the last
 * dump (a waiting timer), or when asked. Last-seen stamps are unix ms from
 * a low-overhead periodic clock on CLOCK_REALTIME (src/pool/timer.h).
 */
#ifndef IDA_NODE_ERRTOP_H
#define IDA_NODE_ERRTOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/pool/timer.h"

#define IDA_ERRTOP_SIZE     32
#define IDA_ERRTOP_TEXT_MAX 200 /* longer texts are cut */

struct ida_errtop_entry
{
    uint32_t code;
    char text[IDA_ERRTOP_TEXT_MAX + 1];
    uint64_t count;
    uint64_t last_seen_ms; /* unix ms */
};

struct ida_errtop
{
    char *path; /* owned; NULL: never dumped */
    uint32_t node_id;
    int64_t keep_ms;
    bool dirty; /* added since the last dump */
    size_t n;
    struct ida_errtop_entry e[IDA_ERRTOP_SIZE];
    struct ida_wtimer dump_timer;
    struct ida_pclock clock;
};

/* Initialise @t. @path (copied; NULL for an in-memory top) is where dumps go;
 * @dump_interval_ms the least time between automatic dumps; @keep_ms how long
 * an error not seen again is kept (0: forever). Returns 0 or IDA_ENOMEM. */
int ida_errtop_init(struct ida_errtop *t,
                    const char *path,
                    uint32_t node_id,
                    int64_t dump_interval_ms,
                    int64_t keep_ms);
void ida_errtop_close(struct ida_errtop *t);

/* Count one occurrence of (@code, @text) seen at @now_ms (0: now from the
 * keeper's clock). Never fails; may evict (see DESIGN). Then dumps if due
 * (a failed automatic dump is ignored: it is retried on the next add). */
void ida_errtop_add(struct ida_errtop *t,
                    int code,
                    const char *text,
                    uint64_t now_ms);

/* Dump now if errors were added since the last dump and dump_interval_ms
 * has passed (a failed dump is retried on a later call). The owner calls
 * it regularly: without it, errors added within an interval of the last
 * dump would wait for the next add, or for the end of the process. */
void ida_errtop_tick(struct ida_errtop *t);

/* The entry for (@code, @text), or NULL. Borrowed until the next add. */
const struct ida_errtop_entry *ida_errtop_find(const struct ida_errtop *t,
                                               int code,
                                               const char *text);

/* Write the top to its path now. Returns 0, IDA_EINVAL (no path), IDA_EIO
 * (the previous file, if any, is intact), IDA_ENOMEM. */
int ida_errtop_dump(struct ida_errtop *t);

/* Sort @n entries most frequent first (stable for equal counts). */
void ida_errtop_sort(struct ida_errtop_entry *e, size_t n);

/* Replace the top with the content of its path. A missing file gives an
 * empty top and 0. Returns 0, IDA_EINVAL (no path), IDA_EIO, IDA_ECORRUPT
 * (undecodable), IDA_ENOMEM; on error @t is unchanged. */
int ida_errtop_restore(struct ida_errtop *t);

/* Read a dump file into @out (up to @max entries, most frequent first);
 * @count_out gets the number read. For `idalloc status`. Returns 0, IDA_EIO
 * (includes a missing file), IDA_ECORRUPT, IDA_ENOMEM. */
int ida_errtop_read_file(const char *path,
                         struct ida_errtop_entry *out,
                         size_t max,
                         size_t *count_out);

/* The pool's error sink for a node: worker I keeps its top in
 * "DIR/errtop-I.pb" (restored at start, dumped when due and as the worker
 * exits). @where is borrowed for the pool's life. */
struct ida_errtop_where
{
    const char *dir;
    uint32_t node_id;
};
struct ida_pool_error_sink;
void ida_errtop_sink(struct ida_pool_error_sink *out,
                     const struct ida_errtop_where *where);

#endif /* IDA_NODE_ERRTOP_H */
