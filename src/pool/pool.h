/* The message-passing pool: processors run by worker threads.
 *
 * DESIGN
 *
 * A processor is a state pointer plus receive(msg) and an optional ping(),
 * with an inbox (an ida_rqueue, bounded: capacity rounded up to a power of
 * two). Processors talk only by sending messages to each other's ids; a
 * message's memory moves with it.
 *
 * Exclusivity: every processor has a mutex . A worker
 * thread runs a processor only while it holds that mutex, and holds it from
 * the moment the processor is assigned to it until it switches to another
 * assignment. So a processor is run by at most one thread at a time, and its
 * state needs no locks; what a processor wrote is visible to the next thread
 * that runs it (the mutex hand-over is the happens-before edge).
 *
 * Sharding with shadow paging: there are two assignments
 * (processor -> thread), "first" and "second"; one atomic word holds which one
 * is current plus how many threads have promised not to update statistics.
 * Each worker, every reshard_interval, makes that promise once; when all
 * threads have promised, worker 0 reads the
 * statistics (nobody writes them now), writes the new assignment into the
 * spare slot and flips the word with one CAS. Each worker notices the flip on
 * its next loop, releases the locks of its old processors and takes the locks
 * of its new ones; a worker that wants a processor another worker still runs
 * under the old assignment waits for that worker to switch (no deadlock: a
 * worker only ever waits for workers that are still on the old assignment,
 * and those release without waiting). No second flip can happen before every
 * worker has switched, because a worker promises only on the current
 * assignment. Messages are never touched by a switch: they stay in the inbox,
 * which belongs to the processor, not to a thread, so none is lost.
 *
 * Resharding policy (greedy): a processor's weight is the time spent in
 * its ping and receive calls since the last switch (measured with the
 * low-overhead start-finish timers of timer.h); an edge's weight is the time
 * the receiver spent on messages from that sender. Each thread in turn takes
 * the heaviest processor if it alone exceeds the average load, then keeps
 * adding, among the processors that still fit under the average (plus an
 * eighth: measured loads are never exactly equal, and without the slack
 * two chatty processors whose sum came out a hair over the average were
 * split up, in the 4-processor ring of bench_pool), the one with
 * the most edge time to the processors it already has. Two rules
 * needed for correctness: processors that fit nowhere go to the
 * least-loaded thread (dropping them would leave processors unrun), and with
 * no measured work at all the assignment is kept (rather than piling
 * everything on thread 0).
 * ida_pool_plan() exposes the algorithm as a pure function.
 *
 * Idle threads: a worker whose processors' inboxes are all empty announces
 * that it sleeps and waits on its condition variable for at most
 * idle_wait_us; a sender that pushes into an inbox of that worker's processor
 * and sees the announcement signals it. The announcement and the emptiness
 * check are sequentially consistent, so a wake-up is not lost; the bounded
 * wait covers the short window while a processor moves between threads.
 * With spin_us, a worker first polls its inboxes for that long (a pause
 * instruction between looks, sched_yield() every 64 looks), so a message
 * that follows soon costs no wake-up at all.
 *
 * Blocking processors: a receive() may block (the storage processor waits in
 * fsync for milliseconds). The pool tolerates it: the other workers keep
 * running their own processors; only the processors assigned to the same
 * worker wait, and (with resharding on) the next reshard moves them away from
 * a worker whose processor is heavy: its blocked time counts as its load, so
 * the greedy plan gives it a thread of its own once it exceeds the average.
 * A resharding is delayed until the blocked worker returns and makes its
 * promise. A custom plan (ida_pool_config.plan) can pin such a processor.
 *
 * Back-pressure inside callbacks: never wait in a callback for a full inbox
 * to drain (IDA_EBUSY). The target may be assigned to the same worker, which
 * cannot run it while the callback waits: a deadlock. Keep the message and
 * retry on a later receive() or ping(), or answer "busy" upstream.
 *
 * Periodic calls: a processor with ping_interval_us > 0 gets ping() about
 * every ping_interval_us (checked on every loop of its worker, so late by at
 * most idle_wait_us plus the time its worker spends on other processors).
 *
 * Threads outside the pool (a libuv loop) send with ida_pool_post(). To hand
 * messages back to such a thread, register an external target: sends to it go
 * into its bounded inbox and then call its notify callback (e.g. a function
 * that calls uv_async_send()); that thread drains the inbox with
 * ida_pool_external_pop().
 *
 * Stop: ida_pool_stop() asks the workers to stop, wakes and joins them (a
 * worker finishes the receive() it is in; a processor blocked for good would
 * block the stop). Then, with IDA_POOL_STOP_DRAIN, it delivers the messages
 * still queued for processors on the calling thread (receive() is still
 * called exclusively and may send; ping() is not called), until every inbox
 * is empty or drain_max messages were delivered. Whatever is still queued for
 * processors after that, or at once with IDA_POOL_STOP_DROP, is freed with
 * ida_msg_free() and counted in ida_pool_stats.dropped. Messages waiting in
 * external inboxes stay for their consumer until ida_pool_close(), which
 * frees them (also counted as dropped). A post that races with the start of
 * a stop may still be accepted; it is then delivered by the drain or dropped.
 *
 * Threads: ida_pool_new/add/start/stop/close from one controlling thread;
 * ida_pool_post() and ida_pool_external_pop() from any thread between start
 * and stop; ida_send() and ida_sender_error() only inside callbacks.
 */
#ifndef IDA_POOL_POOL_H
#define IDA_POOL_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/pool/queue.h"
#include "src/pool/timer.h"

/* The sender id of messages posted from outside the pool. */
#define IDA_POOL_OUTSIDE        UINT32_MAX
#define IDA_POOL_THREADS_MAX    64
#define IDA_POOL_PROCESSORS_MAX 1024

/* A message: a small header and @len bytes of payload, in one allocation.
 * Whoever holds the pointer owns it: the sender until ida_send() returns 0,
 * then the receiver, which frees it with ida_msg_free() or sends it on. */
struct ida_msg
{
    uint32_t type; /* the application's */
    uint32_t from; /* set by the pool on send: sender id or IDA_POOL_OUTSIDE */
    uint64_t len;  /* bytes in data */
    unsigned char data[];
};

/* A new message with @len zeroed payload bytes; NULL when out of memory. */
struct ida_msg *ida_msg_new(uint32_t type, size_t len);
void ida_msg_free(struct ida_msg *msg);

struct ida_pool;

/* What a processor callback gets to send with: valid only during the call. */
struct ida_sender
{
    struct ida_pool *pool;
    uint32_t self; /* the id of the processor being run */
    uint32_t thread_index;
    void *errctx; /* the running worker's error sink context, or NULL */
};

struct ida_proc_ops
{
    /* Takes ownership of @msg. Must not be NULL. */
    void (*receive)(void *state, struct ida_msg *msg, struct ida_sender *s);
    /* Periodic call (see ping_interval_us); may be NULL. */
    void (*ping)(void *state, struct ida_sender *s);
};

struct ida_proc_config
{
    const char *name;               /* for logs; borrowed for the pool's life */
    const struct ida_proc_ops *ops; /* borrowed for the pool's life */
    void *state;                    /* the processor's; never touched */
    uint32_t inbox_capacity;        /* 0: IDA_POOL_INBOX_DEFAULT */
    uint32_t ping_interval_us;      /* 0: no ping */
};

#define IDA_POOL_INBOX_DEFAULT 4096

/* Picks a new assignment; see ida_pool_plan() for the arguments. The pool
 * calls it on worker 0 while no worker updates statistics. */
typedef void (*ida_pool_plan_fn)(void *arg,
                                 uint32_t nproc,
                                 const uint64_t *proc_ns,
                                 const uint64_t *edge_ns,
                                 uint32_t nthreads,
                                 const uint32_t *old_assign,
                                 uint32_t *new_assign);

/* Where ida_sender_error() reports go. Each worker thread opens its own
 * context at start (open() returning NULL drops that worker's errors) and
 * uses it only from that thread, so a sink needs no locking. tick() runs on
 * every loop of the worker (keep it cheap); flush() runs on
 * the worker as it exits; close() when the pool is closed. Any member may be
 * NULL except add, which is required when open is set. */
struct ida_pool_error_sink
{
    void *(*open)(void *arg, uint32_t worker);
    void (*add)(void *wctx, int code, const char *text);
    void (*tick)(void *wctx); /* every loop of the worker; may be NULL */
    void (*flush)(void *wctx);
    void (*close)(void *wctx);
    void *arg;
};

struct ida_pool_config
{
    uint32_t threads;      /* 0: number of cores; capped (see init) */
    uint32_t idle_wait_us; /* 0: 1000 */
    /* Before it parks, an idle worker keeps looking at its inboxes for up
     * to spin_us, yielding the core every 64 looks (sched_yield: a busy
     * machine loses little, an idle one answers in under a microsecond
     * instead of a futex wake-up's tens). 0: park at once. */
    uint32_t spin_us;
    uint32_t reshard_interval_ms; /* 0: resharding off */
    uint64_t drain_max;           /* for IDA_POOL_STOP_DRAIN; 0: 1000000 */
    ida_pool_plan_fn plan;        /* NULL: the greedy plan below */
    void *plan_arg;
    struct ida_pool_error_sink errors; /* all NULL: errors are dropped */
};

enum ida_pool_stop_mode {
    IDA_POOL_STOP_DRAIN = 0,
    IDA_POOL_STOP_DROP = 1,
};

/* Allocate a pool with @cfg (copied). Returns 0, IDA_EINVAL, IDA_ENOMEM.
 * Processors are added before ida_pool_start(). */
int ida_pool_new(const struct ida_pool_config *cfg, struct ida_pool **out);

/* Add a processor; its id (dense, from 0 in order of adding, shared with
 * external targets) goes to @id_out. Only before start. Returns 0,
 * IDA_EINVAL (NULL ops/receive, bad capacity, started pool, too many),
 * IDA_ENOMEM; on error nothing was added. */
int ida_pool_add(struct ida_pool *p,
                 const struct ida_proc_config *c,
                 uint32_t *id_out);

/* Called after a message was queued for an external target, on the sending
 * thread; must be thread-safe and must not block (uv_async_send() is fine). */
typedef void (*ida_pool_notify_fn)(void *arg);

/* Add an external target (see DESIGN); @notify may be NULL (the consumer
 * polls). Same errors as ida_pool_add(). */
int ida_pool_add_external(struct ida_pool *p,
                          uint32_t inbox_capacity,
                          ida_pool_notify_fn notify,
                          void *notify_arg,
                          uint32_t *id_out);

/* Start the worker threads: min(cfg.threads or cores, number of processors,
 * IDA_POOL_THREADS_MAX), at least 1. Returns 0, IDA_EINVAL (no processors,
 * already started), IDA_ENOMEM (thread creation failed; nothing runs). */
int ida_pool_start(struct ida_pool *p);

/* Number of worker threads (valid after start). */
uint32_t ida_pool_threads(const struct ida_pool *p);

/* Send @msg to processor or external target @to from inside a callback
 * (@msg->from is set to the sender's id). Returns 0 (ownership passed),
 * IDA_EBUSY (target inbox full: back-pressure, @msg still the caller's; the
 * caller retries later, drops, or answers "busy" upstream), IDA_EINVAL (no
 * such target, @msg still the caller's). Lock-free; wakes the target's worker
 * if it sleeps, or calls an external target's notify callback. */
int ida_send(struct ida_sender *s, uint32_t to, struct ida_msg *msg);

/* Send from any thread that is not running a processor (from = OUTSIDE).
 * Same results as ida_send(); IDA_ESTOPPED once stop has begun. */
int ida_pool_post(struct ida_pool *p, uint32_t to, struct ida_msg *msg);

/* Pop the oldest message of external target @id (any thread, typically the
 * one notified); NULL if none. The caller owns the message. */
struct ida_msg *ida_pool_external_pop(struct ida_pool *p, uint32_t id);

/* Whether messages wait in the running processor's inbox: its next
 * receive() is due (a processor may then put off work to do it once for
 * all of them, as storage's group commit does). Only inside callbacks. */
bool ida_sender_more(const struct ida_sender *s);

/* Record an error in the running worker's error top (no-op without one). */
void ida_sender_error(struct ida_sender *s, int code, const char *text);

/* Stop and join the workers (see DESIGN for @mode). Idempotent; must not be
 * called from a processor callback. */
void ida_pool_stop(struct ida_pool *p, enum ida_pool_stop_mode mode);

/* Stop (drop mode) if needed, free queued messages and the pool. */
void ida_pool_close(struct ida_pool *p);

/* Counters for tests and status (approximate while running). */
struct ida_pool_stats
{
    uint64_t reshards;  /* assignments switched to */
    uint64_t delivered; /* receive() calls */
    uint64_t pings;     /* ping() calls */
    uint64_t dropped;   /* messages freed undelivered at stop/close */
};
void ida_pool_get_stats(struct ida_pool *p, struct ida_pool_stats *out);

/* The thread that currently owns processor @id per the current assignment
 * (a snapshot). */
uint32_t ida_pool_owner(struct ida_pool *p, uint32_t id);

/* The greedy plan as a pure function. @proc_ns[i]: time processor i
 * spent in its callbacks; @edge_ns[i * nproc + j]: time processor i spent
 * receiving messages from processor j; @old_assign / @new_assign: thread of
 * each processor. Every processor gets a thread < @nthreads. If all weights
 * are 0, @new_assign = @old_assign. */
void ida_pool_plan(uint32_t nproc,
                   const uint64_t *proc_ns,
                   const uint64_t *edge_ns,
                   uint32_t nthreads,
                   const uint32_t *old_assign,
                   uint32_t *new_assign);

#endif /* IDA_POOL_POOL_H */
