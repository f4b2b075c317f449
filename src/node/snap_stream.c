/* A leader's snapshot decoded while its chunks arrive (snap_stream.h).
 *
 * The raft processor (the feeder) hands each chunk over as a copy of its
 * own, in a list; the stream's thread appends the chunks to its buffer,
 * which grows with what arrived (as the core's does: never to a size a
 * message only announces), and steps the decoding ahead over them. The
 * feeder thus never waits for the thread, nor for a buffer growing under
 * it. A stream dropped while it runs (another snapshot, another leader)
 * is left to its thread to free; only a node stopping joins it. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include "src/node/snap_stream.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "base/heap.h"
#include "base/log.h"
#include "src/node/lend.h"

/* A chunk fed and not yet in the thread's buffer. */
struct piece
{
    struct piece *next;
    size_t len;
    uint8_t data[];
};

struct ida__snap_stream
{
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Under mu. */
    struct piece *head, **tail; /* fed, not yet taken by the thread */
    bool all;                   /* every byte fed: decode them, then end */
    bool detached;              /* dropped: the thread frees it all */
    bool ended;                 /* the thread left its loop */
    atomic_bool stop;           /* give up (set under mu) */
    /* The feeder's. */
    ida_index index;
    ida_term term;
    size_t total;
    size_t fed;
    /* The thread's, until it is joined. */
    uint8_t *buf;
    size_t len, cap;
    struct ida_fsm_ahead *ahead;
};

static void free_pieces(struct piece *p)
{
    while (p != NULL) {
        struct piece *next = p->next;
        ida_free(p);
        p = next;
    }
}

static void stream_free(struct ida__snap_stream *st)
{
    free_pieces(st->head);
    ida_fsm_ahead_free(st->ahead);
    ida_free(st->buf);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    ida_free(st);
}

/* Append @p to the thread's buffer: false when memory is short (the
 * decoding ahead stops there; the check restores the bytes whole). */
static bool append(struct ida__snap_stream *st, const struct piece *p)
{
    if (p->len > st->cap - st->len) {
        size_t cap = st->cap > 0 ? st->cap : 1u << 20;
        while (cap - st->len < p->len && cap < st->total) {
            cap = cap > st->total / 2 ? st->total : 2 * cap;
        }
        if (cap - st->len < p->len) {
            return false; /* more than the total: never fed */
        }
        uint8_t *b = ida_realloc(st->buf, cap);
        if (b == NULL) {
            return false;
        }
        ida_heap_hint_huge(b, cap);
        st->buf = b;
        st->cap = cap;
    }
    memcpy(st->buf + st->len, p->data, p->len);
    st->len += p->len;
    return true;
}

static void *stream_main(void *arg)
{
    struct ida__snap_stream *st = arg;
    /* Spare cycles only while chunks come: the node's processors first
     * (the check raises it back once the last chunk came). */
    struct sched_param sp = {.sched_priority = 0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    bool ok = true;
    for (;;) {
        pthread_mutex_lock(&st->mu);
        while (!atomic_load(&st->stop) && st->head == NULL && !st->all) {
            pthread_cond_wait(&st->cv, &st->mu);
        }
        struct piece *list = st->head;
        st->head = NULL;
        st->tail = &st->head;
        bool all = st->all;
        pthread_mutex_unlock(&st->mu);
        struct piece *p = list;
        for (; ok && p != NULL && !atomic_load(&st->stop); p = p->next) {
            ok = append(st, p);
            if (ok) {
                ida_fsm_ahead_step(st->ahead, st->buf, st->len);
            }
        }
        free_pieces(list);
        if (atomic_load(&st->stop) || (all && (p == NULL || !ok))) {
            break;
        }
    }
    pthread_mutex_lock(&st->mu);
    bool detached = st->detached;
    st->ended = true;
    pthread_mutex_unlock(&st->mu);
    if (detached) {
        stream_free(st);
    }
    return NULL;
}

/* Hand @len bytes at @data to the thread (@all: they are the last). */
static void feed(struct ida__snap_stream *st,
                 const uint8_t *data,
                 size_t len,
                 bool all)
{
    struct piece *p = len > 0 ? ida_malloc(sizeof(*p) + len) : NULL;
    if (p != NULL) {
        p->next = NULL;
        p->len = len;
        memcpy(p->data, data, len);
    }
    pthread_mutex_lock(&st->mu);
    if (len > 0 && p == NULL) {
        atomic_store(&st->stop, true); /* a gap: nothing more to decode */
    } else if (p != NULL) {
        *st->tail = p;
        st->tail = &p->next;
    }
    st->all = st->all || all;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    st->fed += len;
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
    st->tail = &st->head;
    atomic_init(&st->stop, false);
    st->index = index;
    st->term = term;
    st->total = total;
    if (ida_fsm_ahead_new(total, &st->ahead) != 0) {
        stream_free(st);
        return NULL;
    }
    feed(st, data, len, false);
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
    feed(st, data, len, false);
}

void ida__snap_stream_drop(struct ida__snap_stream *st)
{
    if (st == NULL) {
        return;
    }
    pthread_mutex_lock(&st->mu);
    atomic_store(&st->stop, true);
    bool ended = st->ended;
    st->detached = !ended;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    if (ended) {
        pthread_join(st->thread, NULL);
        stream_free(st);
    } else {
        pthread_detach(st->thread); /* it frees the stream as it ends */
    }
}

void ida__snap_stream_stop(struct ida__snap_stream *st)
{
    if (st == NULL) {
        return;
    }
    pthread_mutex_lock(&st->mu);
    atomic_store(&st->stop, true);
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
    if (len != st->total || st->fed > len) {
        ida__snap_stream_drop(st); /* not these bytes (callers check) */
        return ida_fsm_restore_with(f, data, len, &l.helper);
    }
    /* The last chunks are in the core's bytes (the check comes as the last
     * one is taken): the thread decodes them too, now at the priority of
     * any thread, then ends. */
    feed(st, data + st->fed, len - st->fed, true);
    struct sched_param sp = {.sched_priority = 0};
    (void)pthread_setschedparam(st->thread, SCHED_OTHER, &sp);
    pthread_join(st->thread, NULL);
    int rv;
    if (st->len == len && memcmp(st->buf, data, len) == 0) {
        ida_free(st->buf); /* before the restore allocates its state */
        st->buf = NULL;
        rv = ida_fsm_restore_ahead(f, data, len, &l.helper, st->ahead);
        *ahead = ida_fsm_ahead_taken(st->ahead);
    } else {
        IDA_WARN(
            "raft: the snapshot decoded as it arrived is not the one "
            "checked (or memory was short); restoring the checked "
            "bytes whole");
        rv = ida_fsm_restore_with(f, data, len, &l.helper);
    }
    stream_free(st);
    return rv;
}
