/* A thread lent to the state machine's restore (lend.h). */
#include "src/node/lend.h"

#include <string.h>

#include "base/heap.h"
#include "src/node/node.h"

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
    return ida__restore_lent_ahead(f, data, len, NULL);
}

int ida__restore_lent_ahead(struct ida_fsm *f,
                            const uint8_t *data,
                            size_t len,
                            struct ida_fsm_ahead *ahead)
{
    struct ida__lend l;
    ida__lend_init(&l);
    return ida_fsm_restore_ahead(f, data, len, &l.helper, ahead);
}

struct ida__rebuild
{
    pthread_t thread;
    bool started;
    uint8_t *data;
    size_t len;
    struct ida_fsm *fsm;
    int rv;
    uint64_t took_us;
};

static void *rebuild_main(void *arg)
{
    struct ida__rebuild *r = arg;
    uint64_t t0 = ida__node_mono_us();
    r->rv = ida_fsm_new(&r->fsm);
    if (r->rv == 0) {
        r->rv = ida__restore_lent(r->fsm, r->data, r->len);
    }
    ida_free(r->data);
    r->data = NULL;
    r->took_us = ida__node_mono_us() - t0;
    return NULL;
}

struct ida__rebuild *ida__rebuild_start(uint8_t *data, size_t len)
{
    struct ida__rebuild *r = ida_calloc(1, sizeof(*r));
    if (r == NULL) {
        ida_free(data);
        return NULL;
    }
    r->data = data;
    r->len = len;
    r->started = pthread_create(&r->thread, NULL, rebuild_main, r) == 0;
    return r;
}

int ida__rebuild_finish(struct ida__rebuild *r,
                        struct ida_fsm **out,
                        uint64_t *took_us)
{
    if (r->started) {
        pthread_join(r->thread, NULL);
    } else {
        rebuild_main(r);
    }
    int rv = r->rv;
    *out = NULL;
    if (rv == 0) {
        *out = r->fsm;
    } else {
        ida_fsm_free(r->fsm);
    }
    *took_us = r->took_us;
    ida_free(r);
    return rv;
}

void ida__rebuild_drop(struct ida__rebuild *r)
{
    struct ida_fsm *f;
    uint64_t us;
    if (r != NULL && ida__rebuild_finish(r, &f, &us) == 0) {
        ida_fsm_free(f);
    }
}
