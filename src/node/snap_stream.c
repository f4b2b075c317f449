/* A leader's snapshot decoded while its chunks arrive (snap_stream.h).
 *
 * The bytes go into one buffer whose addresses never change: the whole
 * size is reserved as address space only (PROT_NONE: no memory, nothing
 * charged against the commit limit) and made writable RW_STEP at a time as
 * bytes arrive, so memory follows what arrived, never a size a message
 * only announces (as the core's own buffer). The raft processor (the
 * feeder) copies each chunk in and publishes how far the bytes go; the
 * thread decodes up to there, STEP_BYTES at a time. A stream dropped while
 * its thread runs (another snapshot, another leader) is freed by that
 * thread, so the raft processor never waits for it; a node stopping joins
 * it. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "src/node/snap_stream.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "base/log.h"
#include "src/node/lend.h"

/* The thread decodes at most this much between looks at the stop flag. */
#define STEP_BYTES (1u << 20)
/* The buffer is made writable this much at a time. */
#define RW_STEP (16u << 20)

struct ida__snap_stream
{
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Under mu. */
    size_t avail;     /* bytes in buf */
    bool detached;    /* dropped: the thread frees it all */
    bool ended;       /* the thread left its loop */
    atomic_bool stop; /* give up (set under mu) */
    /* The feeder's. */
    ida_index index;
    ida_term term;
    size_t total;
    size_t fed;  /* == avail, without the lock */
    size_t rw;   /* bytes of buf made writable */
    bool broken; /* memory short: nothing more is fed */
    /* Read by the thread below avail. */
    uint8_t *buf;                /* total bytes of address space */
    struct ida_fsm_ahead *ahead; /* the thread's until it ends */
};

static void stream_free(struct ida__snap_stream *st)
{
    ida_fsm_ahead_free(st->ahead);
    if (st->buf != NULL) {
        munmap(st->buf, st->total);
    }
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    ida_free(st);
}

static void *stream_main(void *arg)
{
    struct ida__snap_stream *st = arg;
    size_t seen = 0;
    while (seen < st->total) {
        pthread_mutex_lock(&st->mu);
        while (!atomic_load(&st->stop) && st->avail == seen) {
            pthread_cond_wait(&st->cv, &st->mu);
        }
        size_t avail = st->avail;
        pthread_mutex_unlock(&st->mu);
        if (atomic_load(&st->stop)) {
            break;
        }
        seen = avail - seen > STEP_BYTES ? seen + STEP_BYTES : avail;
        ida_fsm_ahead_step(st->ahead, st->buf, seen);
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

/* Copy @len bytes at @data in after what arrived, and tell the thread. */
void ida__snap_stream_feed(struct ida__snap_stream *st,
                           const uint8_t *data,
                           size_t len)
{
    if (len > st->total - st->fed) {
        len = st->total - st->fed; /* callers check; never past the end */
    }
    if (st->broken || len == 0) {
        return;
    }
    if (st->fed + len > st->rw) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t want = st->fed + len + RW_STEP;
        want = want < st->total ? (want + page - 1) / page * page : st->total;
        if (mprotect(st->buf + st->rw, want - st->rw, PROT_READ | PROT_WRITE) !=
            0) {
            st->broken = true; /* the thread stops where the bytes stop */
            return;
        }
        st->rw = want;
    }
    memcpy(st->buf + st->fed, data, len);
    st->fed += len;
    pthread_mutex_lock(&st->mu);
    st->avail = st->fed;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

struct ida__snap_stream *ida__snap_stream_start(ida_index index,
                                                ida_term term,
                                                size_t total,
                                                const uint8_t *data,
                                                size_t len)
{
    if (len > total || total == 0) {
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
    atomic_init(&st->stop, false);
    st->index = index;
    st->term = term;
    st->total = total;
    void *b = mmap(NULL, total, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    st->buf = b != MAP_FAILED ? b : NULL;
    if (st->buf == NULL || ida_fsm_ahead_new(total, &st->ahead) != 0) {
        stream_free(st);
        return NULL;
    }
    ida_heap_hint_huge(st->buf, total);
    ida__snap_stream_feed(st, data, len);
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
    return ida__snap_stream_of(st, index, term) && st->total == total &&
           st->fed == offset;
}

bool ida__snap_stream_of(const struct ida__snap_stream *st,
                         ida_index index,
                         ida_term term)
{
    return st != NULL && st->index == index && st->term == term;
}

size_t ida__snap_stream_fed(const struct ida__snap_stream *st)
{
    return st != NULL ? st->fed : 0;
}

/* Tell the thread to stop: true when it has ended already (then the caller
 * joins and frees), else it frees the stream itself if @detach. */
static bool tell_stop(struct ida__snap_stream *st, bool detach)
{
    pthread_mutex_lock(&st->mu);
    atomic_store(&st->stop, true);
    bool ended = st->ended;
    st->detached = detach && !ended;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return ended;
}

void ida__snap_stream_drop(struct ida__snap_stream *st)
{
    if (st == NULL) {
        return;
    }
    /* Read before the thread is told: once told (and not ended), it may
     * free @st at any moment. Reading st->thread after tell_stop() was a
     * use after free: pthread_detach() of a freed stream's bytes crashed a
     * node whose leader changed while a snapshot arrived (test_catchup,
     * leader_dies_while_a_wiped_follower_receives_its_snapshot). */
    pthread_t t = st->thread;
    if (tell_stop(st, true)) {
        pthread_join(t, NULL);
        stream_free(st);
    } else {
        pthread_detach(t); /* it frees the stream as it ends */
    }
}

void ida__snap_stream_stop(struct ida__snap_stream *st)
{
    if (st == NULL) {
        return;
    }
    (void)tell_stop(st, false);
    pthread_join(st->thread, NULL);
    stream_free(st);
}

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int ida__snap_stream_restore(struct ida__snap_stream *st,
                             struct ida_fsm *f,
                             const uint8_t *data,
                             size_t len,
                             uint64_t *ahead,
                             struct ida__snap_stream_times *t)
{
    *ahead = 0;
    *t = (struct ida__snap_stream_times){0, 0, 0};
    uint64_t t0 = mono_us();
    int rv;
    /* No stream, or one not of these bytes (callers check): the plain
     * restore. */
    if (st == NULL || len != st->total || st->fed > len) {
        ida__snap_stream_drop(st);
        rv = ida__restore_lent(f, data, len);
        t->restore_us = mono_us() - t0;
        return rv;
    }
    /* The last chunks are in the core's bytes (the check comes as the last
     * one is taken): the thread decodes them too, then ends. */
    ida__snap_stream_feed(st, data + st->fed, len - st->fed);
    if (st->broken) {
        (void)tell_stop(st, false);
    }
    pthread_join(st->thread, NULL);
    uint64_t t1 = mono_us();
    t->lag_us = t1 - t0;
    /* Not redundant: what was decoded ahead, and the checksum summed as
     * the bytes came, are of this copy; this makes them the checked
     * bytes' (ida_fsm_restore_ahead()'s contract). */
    bool same = !st->broken && memcmp(st->buf, data, len) == 0;
    uint64_t t2 = mono_us();
    t->cmp_us = t2 - t1;
    if (same) {
        munmap(st->buf, st->total); /* before the restore allocates */
        st->buf = NULL;
        rv = ida__restore_lent_ahead(f, data, len, st->ahead);
        *ahead = ida_fsm_ahead_taken(st->ahead);
    } else {
        IDA_WARN(
            "raft: the snapshot decoded as it arrived is not the one "
            "checked (or memory was short); restoring the checked "
            "bytes whole");
        rv = ida__restore_lent(f, data, len);
    }
    t->restore_us = mono_us() - t2;
    stream_free(st);
    return rv;
}
