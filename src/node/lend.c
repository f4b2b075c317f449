/* A thread lent to the state machine's restore (lend.h). */
#include "src/node/lend.h"

#include <string.h>

static void *lend_main(void *arg)
{
    struct ida__lend *l = arg;
    l->fn(l->arg);
    return NULL;
}

static int lend_start(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct ida__lend *l = ctx;
    if (l->running) {
        return -1;
    }
    l->fn = fn;
    l->arg = arg;
    if (pthread_create(&l->thread, NULL, lend_main, l) != 0) {
        return -1; /* the restore does the work itself */
    }
    l->running = true;
    return 0;
}

static void lend_join(void *ctx)
{
    struct ida__lend *l = ctx;
    if (l->running) {
        pthread_join(l->thread, NULL);
        l->running = false;
    }
}

void ida__lend_init(struct ida__lend *l)
{
    memset(l, 0, sizeof(*l));
    l->helper.start = lend_start;
    l->helper.join = lend_join;
    l->helper.ctx = l;
}

int ida__restore_lent(struct ida_fsm *f, const uint8_t *data, size_t len)
{
    struct ida__lend l;
    ida__lend_init(&l);
    return ida_fsm_restore_with(f, data, len, &l.helper);
}
