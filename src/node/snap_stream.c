/* A leader's snapshot decoded while its chunks arrive (snap_stream.h). */
#include "src/node/snap_stream.h"

#include <pthread.h>
#include <string.h>

#include "base/heap.h"
#include "base/log.h"
#include "src/node/lend.h"

/* The thread decodes at most this much between looks at the stop flag. */
#define STEP_BYTES (1u << 20)

struct ida__snap_stream
{
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *buf; /* the snapshot's bytes, [0, avail) arrived */
    size_t total;
    size_t avail; /* under mu */
    bool stop;    /* under mu */
    size_t fed;   /* the feeder's own count (== avail) */
    ida_index index;
    ida_term term;
    struct ida_fsm_ahead *ahead; /* the thread's until it is joined */
};

static void *stream_main(void *arg)
{
    struct ida__snap_stream *st = arg;
    size_t seen = 0;
    while (seen < st->total) {
        pthread_mutex_lock(&st->mu);
        while (!st->stop && st->avail == seen) {
            pthread_cond_wait(&st->cv, &st->mu);
        }
        size_t avail = st->avail;
        bool stop = st->stop;
        pthread_mutex_unlock(&st->mu);
        if (stop) {
            break;
        }
        seen = avail - seen > STEP_BYTES ? seen + STEP_BYTES : avail;
        ida_fsm_ahead_step(st->ahead, st->buf, seen);
    }
    return NULL;
}

static void stream_free(struct ida__snap_stream *st)
{
    ida_fsm_ahead_free(st->ahead);
    ida_free(st->buf);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    ida_free(st);
}

struct ida__snap_stream *ida__snap_stream_start(ida_index index,
                                                ida_term term,
                                                size_t total,
                                                const uint8_t *data,
                                                size_t len)
{
    if (len > total) {
        return NULL;
    }
    struct ida__snap_stream *st = ida_calloc(1, sizeof(*st));
    if (st == NULL) {
        return NULL;
    }
    if (pthread_mutex_init(&st->mu, NULL) != 0) {
        ida_free(st);
        return NULL;
    }
    if (pthread_cond_init(&st->cv, NULL) != 0) {
        pthread_mutex_destroy(&st->mu);
        ida_free(st);
        return NULL;
    }
    st->index = index;
    st->term = term;
    st->total = total;
    /* Mapped lazily (heap.h): pages cost memory as the bytes come. */
    st->buf = ida_malloc_huge(total);
    if (st->buf == NULL || ida_fsm_ahead_new(total, &st->ahead) != 0) {
        stream_free(st);
        return NULL;
    }
    memcpy(st->buf, data, len);
    st->avail = st->fed = len;
    if (pthread_create(&st->thread, NULL, stream_main, st) != 0) {
        stream_free(st);
        return NULL;
    }
    return st;
}

bool ida__snap_stream_at(const struct ida__snap_stream *st,
                         ida_index index,
                         ida_term term,
                         size_t total,
                         size_t offset)
{
    return st != NULL && st->index == index && st->term == term &&
           st->total == total && st->fed == offset;
}

size_t ida__snap_stream_total(const struct ida__snap_stream *st)
{
    return st != NULL ? st->total : 0;
}

size_t ida__snap_stream_fed(const struct ida__snap_stream *st)
{
    return st != NULL ? st->fed : 0;
}

void ida__snap_stream_feed(struct ida__snap_stream *st,
                           const uint8_t *data,
                           size_t len)
{
    if (len > st->total - st->fed) {
        len = st->total - st->fed; /* callers check; never past the end */
    }
    memcpy(st->buf + st->fed, data, len);
    st->fed += len;
    pthread_mutex_lock(&st->mu);
    st->avail = st->fed;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

void ida__snap_stream_stop(struct ida__snap_stream *st)
{
    if (st == NULL) {
        return;
    }
    pthread_mutex_lock(&st->mu);
    st->stop = true;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    stream_free(st);
}

int ida__snap_stream_restore(struct ida__snap_stream *st,
                             struct ida_fsm *f,
                             const uint8_t *data,
                             size_t len,
                             uint64_t *ahead)
{
    *ahead = 0;
    struct ida__lend l;
    ida__lend_init(&l);
    if (st == NULL) {
        return ida_fsm_restore_with(f, data, len, &l.helper);
    }
    if (len != st->total) {
        ida__snap_stream_stop(st); /* not these bytes (callers check) */
        return ida_fsm_restore_with(f, data, len, &l.helper);
    }
    /* The last chunks are in the core's bytes (the check comes as the last
     * one is taken): the thread decodes them too, then ends. */
    ida__snap_stream_feed(st, data + st->fed, len - st->fed);
    pthread_join(st->thread, NULL);
    int rv;
    if (memcmp(st->buf, data, len) == 0) {
        ida_free(st->buf); /* before the restore allocates its state */
        st->buf = NULL;
        rv = ida_fsm_restore_ahead(f, data, len, &l.helper, st->ahead);
        *ahead = ida_fsm_ahead_holdings(st->ahead);
    } else {
        IDA_WARN(
            "raft: the snapshot decoded as it arrived is not the one "
            "checked; restoring the checked bytes whole");
        rv = ida_fsm_restore_with(f, data, len, &l.helper);
    }
    stream_free(st);
    return rv;
}
