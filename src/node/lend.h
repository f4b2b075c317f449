/* A thread lent to the state machine's restore and to its runs of entries
 * (struct ida_fsm_helper): the fsm core starts no threads itself, so the
 * node lends it one for the duration of a restore, or of a replay (the
 * fsm processor's, ida_fsm_apply_entries()), on a process that has a
 * second core to give.
 *
 *     struct ida__lend l;
 *     ida__lend_init(&l);
 *     rv = ida_fsm_restore_with(f, data, len, &l.helper);
 *
 * One function at a time: start, then join, then start again. */
#ifndef IDA_NODE_LEND_H
#define IDA_NODE_LEND_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsm/fsm.h"

struct ida__lend
{
    struct ida_fsm_helper helper;
    pthread_t thread;
    bool running;
    void (*fn)(void *arg);
    void *arg;
};

void ida__lend_init(struct ida__lend *l);

/* ida_fsm_restore() with a thread lent for its duration. */
int ida__restore_lent(struct ida_fsm *f, const uint8_t *data, size_t len);
/* The same, taking the pools @ahead decoded (ida_fsm_restore_ahead()). */
int ida__restore_lent_ahead(struct ida_fsm *f,
                            const uint8_t *data,
                            size_t len,
                            struct ida_fsm_ahead *ahead);

/* A state machine rebuilt from snapshot bytes on a thread of its own (and
 * one lent to it): a restarting node starts it as soon as the snapshot is
 * read, and reads its log, opens its ports and hears from the leader
 * meanwhile; the fsm processor waits for it before its first step. */
struct ida__rebuild;

/* Start rebuilding from @data (@len bytes, taken: freed once decoded).
 * NULL when out of memory (then @data was freed). Without a thread the
 * work is done at ida__rebuild_finish(). */
struct ida__rebuild *ida__rebuild_start(uint8_t *data, size_t len);

/* Wait for @r and free it: 0 with *@out the rebuilt state machine (the
 * caller's) and *@took_us how long the rebuild took, or the restore's
 * error (nothing to free). */
int ida__rebuild_finish(struct ida__rebuild *r,
                        struct ida_fsm **out,
                        uint64_t *took_us);

/* Wait for @r and drop what it built (NULL is ignored). */
void ida__rebuild_drop(struct ida__rebuild *r);

#endif /* IDA_NODE_LEND_H */
