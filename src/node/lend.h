/* A thread lent to the state machine's restore (struct ida_fsm_helper):
 * the fsm core starts no threads itself, so the node lends it one for the
 * duration of a restore, on a process that has a second core to give.
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

#endif /* IDA_NODE_LEND_H */
