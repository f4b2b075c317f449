/* libidalloc internals shared by the client's files (not installed).
 *
 * DESIGN: every call, blocking or asynchronous, is a struct ida_acall run
 * by the client's one I/O thread (loop.c): it owns the connections (one per
 * node, non-blocking sockets, TLS through src/common/tls.h), the timers of
 * the calls, and the state machine of each call (call.c): session, request
 * id, attempts, hints, retries, deadline. A call is submitted from any
 * thread (ida__call_submit()) and ends with its done hook, run once on the
 * I/O thread. The public asynchronous calls (ops.c) make their hook run the
 * caller's callback; the blocking calls wait for theirs on a condition
 * variable (ida__client_call() and the blocking forms of ops.c).
 *
 * THREADING and LOCKS:
 *   sess_mu   the session (client id, seqs, the outstanding seqs); taken by
 *             submitters, the I/O thread and idalloc_call_release().
 *   q_mu      the submission queue and `closing`: any thread pushes, the
 *             I/O thread takes the whole queue at once, then wakes by a
 *             pipe (one byte per batch: wake_pending coalesces).
 *   conns_mu  adding a node to conns[] (a slot is filled, then published
 *             by nconns, and its address never changes after).
 *   mu        idalloc_next()'s pools (next.c).
 *   lp_mu     everything else: the connections, the calls in flight, the
 *             timers, the registration. The I/O thread holds it at all
 *             times but while it sleeps in poll(); then a submitting thread
 *             that gets it (trylock, never waiting) sends its call at once
 *             when the call's connection is ready (ida__call_submit()): a
 *             blocking call at 1 in flight costs no wake-up of the I/O
 *             thread on its way out, only on the answer's way back.
 * Order: lp_mu (the I/O thread's: others only try it), mu, sess_mu, q_mu.
 * The I/O thread runs done hooks (and so callbacks) holding only lp_mu.
 */
#ifndef IDA_CLIENT_H
#define IDA_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "idalloc.h"
#include "proto/idalloc.pb-c.h"
#include "src/client/testing.h"
#include "src/common/config.h"
#include "src/common/frame.h"
#include "src/common/tls.h"

/* The cluster's limits on names and tags (fsm/fsm.h, IDA_POOL_NAME_MAX and
 * IDA_TAG_BYTES_MAX; src/node checks they agree): the library refuses what
 * the cluster would, before sending anything. */
#define IDA_CLIENT_POOL_NAME_MAX 64
#define IDA_CLIENT_TAG_BYTES_MAX 128

/* Whether @pool (a C string) is a pool name the cluster takes: 1 to
 * IDA_CLIENT_POOL_NAME_MAX characters of A-Za-z0-9._:- (ops.c). */
int ida__client_pool_name_ok(const char *pool);

/* Calls sent on one connection and waiting for their answer, by seq. */
#define IDA_CONN_BUCKETS 512

struct ida_acall;

/* A list of calls (each is on at most one: a connection's pending list or
 * bucket, or the writes waiting for the session). */
struct ida_alist
{
    struct ida_acall *head, *tail;
};

enum ida_conn_state {
    IDA_CONN_IDLE = 0,   /* no socket */
    IDA_CONN_CONNECTING, /* non-blocking connect under way */
    IDA_CONN_HANDSHAKE,  /* TLS handshake under way */
    IDA_CONN_READY,
    IDA_CONN_FAILED, /* to be closed by the loop's next sweep (why says why) */
};

struct ida_client_conn
{
    struct ida_addr addr; /* set before the slot is published, then fixed */
    /* The I/O thread's alone: */
    enum ida_conn_state state;
    int fd;
    uint64_t connect_due_ms; /* CONNECTING, HANDSHAKE: give up then */
    char why[200];           /* why the last connection failed */
    struct ida_tls *tls;
    struct ida_frame_decoder dec;
    uint8_t *out; /* bytes to send: out[out_off, out_len) */
    size_t out_off, out_len, out_cap;
    int dec_live;             /* dec initialised (a socket is open) */
    struct ida_alist pending; /* waiting to be sent */
    struct ida_alist bucket[IDA_CONN_BUCKETS]; /* sent, by seq */
};

/* The phases of a call on the I/O thread (call.c). */
enum ida_acall_phase {
    IDA_AC_QUEUED = 0, /* submitted, not yet taken by the I/O thread */
    IDA_AC_SESSION,    /* a fresh write waiting for its session */
    IDA_AC_CONNECT,    /* waiting for its connection (pending list) */
    IDA_AC_SENT,       /* on the wire, waiting for the answer (bucket) */
    IDA_AC_BACKOFF,    /* between attempts */
    IDA_AC_DONE,
};

struct ida_acall;
/* The end of a call, on the I/O thread, exactly once: @rv as
 * ida__client_call() documents, @r the answer on 0 (ownership moves to the
 * hook, which frees it). The core never touches @a after the hook. */
typedef void (*ida_acall_done_fn)(struct ida_acall *a,
                                  int rv,
                                  Idalloc__ClientResponse *r);

struct ida_acall
{
    /* Set by the submitter (ida__call_init() then the fields it names). */
    Idalloc__ClientRequest *req; /* borrowed until the hook */
    struct idalloc_call *call;   /* never NULL: detail and request id */
    int write;                   /* a session write (numbered, kept) */
    int replay;                  /* a write repeating call's request id */
    size_t node;                 /* SIZE_MAX: the leader, with retries;
                                  * else one attempt at this node */
    ida_acall_done_fn done;
    void *arg;
    /* The core's. */
    struct idalloc_client *c;
    enum ida_acall_phase phase;
    int has_seq;    /* the request id is set in req (else: wait a session) */
    int own;        /* its seq is in c->outstanding */
    int reserved;   /* holds one of c->n_unseq (a fresh write, no seq yet) */
    uint8_t id[16]; /* the client id req points to */
    uint8_t *frame; /* the encoded request: small ones in frame_inline */
    size_t frame_len;
    uint64_t deadline_ms;
    size_t target; /* node of the current or next attempt */
    uint64_t backoff_ms;
    int maybe_sent, any_sent, earlier_sent, round;
    char why[256]; /* the last attempt's failure */
    int internal;  /* the session's registration: not in n_calls */
    /* Links: the submission queue (next only), or the struct ida_alist it
     * is on (list, next, prev); every live call (live_next, live_prev);
     * the timer heap. */
    struct ida_alist *list;
    struct ida_acall *next, *prev;
    struct ida_acall *live_next, *live_prev;
    size_t heap_at; /* SIZE_MAX: no timer */
    uint64_t due_ms;
    uint8_t frame_inline[192]; /* last: ida__call_init() zeroes the rest */
};

struct ida_next_pool; /* next.c */

struct idalloc_client
{
    struct idalloc_options opts;
    struct ida_tls_ctx *tls; /* NULL: plaintext */
    /* The session (sess_mu guards it): its client id, whether the cluster
     * registered it, the next request seq, and the seqs whose answers are
     * still wanted (calls in flight, and unknown ones not released); the
     * lowest of those is the acknowledgement floor sent on every write.
     * n_unseq counts fresh writes waiting for the session (their seq is
     * given once it is registered): they count against the outstanding
     * bound already. */
    pthread_mutex_t sess_mu;
    uint8_t client_id[16];
    int registered;
    uint64_t next_seq;
    uint64_t next_read_seq; /* reads: only matched to their answers */
    uint64_t *outstanding;  /* unsorted; IDALLOC_OUTSTANDING_MAX slots */
    size_t n_outstanding;
    size_t n_unseq;
    atomic_size_t n_calls; /* calls submitted and not yet done */
    atomic_size_t leader;  /* index of the node that last answered */
    /* The nodes known: the configured addresses, then those the cluster
     * named (NOT_LEADER hints, member lists), at most IDA_CONFIG_NODES_MAX.
     * A slot is filled before nconns counts it and its address never
     * changes after. */
    struct ida_client_conn conns[IDA_CONFIG_NODES_MAX];
    atomic_size_t nconns;
    pthread_mutex_t conns_mu; /* serialises adding a node */
    /* Submission (q_mu): calls handed to the I/O thread, and free()'s
     * request to stop. wake_fd[1] wakes the loop; wake_pending is 1 while
     * a wake byte is unread, so a batch of submits writes one byte. */
    pthread_mutex_t q_mu;
    struct ida_acall *q_head, *q_tail;
    int closing;
    int wake_fd[2];
    atomic_int wake_pending;
    pthread_t loop;
    int loop_running;
    /* Under lp_mu (the I/O thread's but while it polls): calls the I/O
     * thread submitted itself (from hooks and callbacks: no wake), every
     * live call, the timer heap, the registration in flight and the writes
     * waiting for it, whether it saw `closing`, and when its poll() will
     * return at the latest (a call sent by another thread with an earlier
     * timer wakes it). */
    pthread_mutex_t lp_mu;
    uint64_t poll_until;
    struct ida_acall *lq_head, *lq_tail;
    struct ida_acall *live;
    struct ida_acall **heap;
    size_t heap_len, heap_cap;
    struct ida_acall *reg;
    struct ida_alist reg_wait;
    int loop_closing;
    /* idalloc_next() (next.c, under mu). */
    pthread_mutex_t mu;
    struct ida_next_pool *next_pools;
    uint64_t next_gen; /* unique per client object (next.c's thread caches) */
};

/* --- call.c: the calls ---------------------------------------------------- */

/* Make @a a call of @req on @c, to run with retries (node SIZE_MAX), with
 * @call (not NULL) for its detail and request id: @write for a session
 * write, @replay when it repeats @call's request id (call->state UNKNOWN),
 * @done with @arg at its end. */
void ida__call_init(struct ida_acall *a,
                    Idalloc__ClientRequest *req,
                    int write,
                    int replay,
                    struct idalloc_call *call,
                    ida_acall_done_fn done,
                    void *arg);

/* Hand @a to the I/O thread (from any thread). version, client_id,
 * request_seq and ack_below of the request are filled in: for a write from
 * the session (registered first if needed) or from @call (a repeat), for a
 * read with a fresh seq. Returns 0 (the hook will run exactly once, later)
 * or, nothing submitted and the hook never run: IDA_ELIMIT (in-flight or
 * outstanding bounds), IDA_ETOOBIG, IDA_ENOMEM, IDA_EUNAVAIL (the client
 * is being freed), with the detail in a->call. @a must stay valid until
 * the hook. */
int ida__call_submit(struct idalloc_client *c, struct ida_acall *a);

/* Blocking: send @req to the leader, following hints and retrying other
 * nodes with the same request id until the call deadline (an asynchronous
 * call and a wait). On 0, *resp is the decoded answer (free with
 * idalloc__client_response__free_unpacked) and its result is not a
 * session answer (IDA_EEXPIRED is handled here); it may still carry a
 * definite error. Else IDA_ETIMEDOUT or IDA_ECLOSED (the request may have
 * taken effect), IDA_EUNAVAIL (nothing was sent, or only "not leader"
 * answers came: not carried out), IDA_ESESSION, IDA_ELIMIT, IDA_ETOOBIG,
 * IDA_EINVAL (from a completion callback) or IDA_ENOMEM, with the detail
 * in @call. @call (not NULL) gets its request id; a write repeats it when
 * call->state is UNKNOWN; ida__client_finish() settles it once the caller
 * checked the answer. */
int ida__client_call(struct idalloc_client *c,
                     Idalloc__ClientRequest *req,
                     int write,
                     struct idalloc_call *call,
                     Idalloc__ClientResponse **resp);

/* One attempt at node @node only, no retries (status): 0 with *resp, or
 * IDA_EUNAVAIL (no connection), IDA_ETIMEDOUT, IDA_ECLOSED, IDA_EINVAL
 * (from a completion callback), IDA_ENOMEM. */
int ida__client_call_node(struct idalloc_client *c,
                          size_t node,
                          Idalloc__ClientRequest *req,
                          Idalloc__ClientResponse **resp);

/* The I/O thread: the call state machine's entry points (call.c), called
 * by loop.c. */
void ida__call_intake(struct idalloc_client *c, struct ida_acall *a);
void ida__call_timer_fired(struct idalloc_client *c, struct ida_acall *a);
/* An answer for @a, which loop.c took off its connection's bucket. */
void ida__call_answered(struct idalloc_client *c,
                        struct ida_acall *a,
                        Idalloc__ClientResponse *r);
/* An answer on connection @k_index that matched no call sent there: the
 * answer to an earlier attempt of a call that has moved on. It settles
 * that call when it would have settled it in time (takes @r and returns
 * 1); else returns 0 and the caller drops it. */
int ida__call_late_answer(struct idalloc_client *c,
                          size_t k_index,
                          Idalloc__ClientResponse *r);
/* @a's attempt failed: @sent says whether its request went out (then @rv
 * says how: IDA_ETIMEDOUT, IDA_ECLOSED); else @why says why not. */
void ida__call_attempt_failed(struct idalloc_client *c,
                              struct ida_acall *a,
                              int sent,
                              int rv,
                              const char *why);
/* Complete every live call: free() stops the loop. */
void ida__call_close_all(struct idalloc_client *c);

/* --- loop.c: the I/O thread ---------------------------------------------- */

int ida__loop_start(struct idalloc_client *c);
/* Whether the calling thread is @c's I/O thread (a completion callback):
 * blocking calls refuse to run there. */
int ida__client_on_loop(const struct idalloc_client *c);
/* Complete every call (ida__call_close_all()), stop and join the thread,
 * close every connection. */
void ida__loop_stop(struct idalloc_client *c);
/* Wake the loop (any thread). */
void ida__loop_wake(struct idalloc_client *c);
/* Send @a (its frame) on node a->target: at once when the connection is
 * ready, else once it is (connecting it first). Sets a->phase. */
void ida__loop_send(struct idalloc_client *c, struct ida_acall *a);
/* Whether node @i's connection is ready to send on (holds lp_mu). */
int ida__loop_ready(const struct idalloc_client *c, size_t i);
/* Write what node @i's connection holds (holds lp_mu): 0, or nonzero when
 * the I/O thread must look at it (output left, or the connection failed). */
int ida__loop_flush(struct idalloc_client *c, size_t i);
/* Lists of calls. */
void ida__alist_push(struct ida_alist *l, struct ida_acall *a);
void ida__alist_del(struct ida_acall *a); /* no-op when on no list */
struct ida_acall *ida__alist_pop(struct ida_alist *l);
/* Arm @a's one timer at @due_ms (replacing any), or disarm it. */
void ida__timer_set(struct idalloc_client *c,
                    struct ida_acall *a,
                    uint64_t due);
void ida__timer_clear(struct idalloc_client *c, struct ida_acall *a);

/* --- client.c: sessions, call structs ------------------------------------ */

/* Settle @call after a write ended with @rv (returned): the request id
 * stays wanted (UNKNOWN) for an unknown outcome when @keep (the caller holds
 * the call struct), else it is released; "not carried out" (IDA_EUNAVAIL)
 * makes a fresh call NEW again, but keeps a repeat (@replay) UNKNOWN. */
int ida__client_finish(struct idalloc_client *c,
                       struct idalloc_call *call,
                       int rv,
                       int keep,
                       int replay);

/* The session half of a submit, under sess_mu (call.c calls them). */
/* A fresh write: its seq if the session is registered (0 and *assigned =
 * 1), or a place among the writes waiting for it (0 and *assigned = 0);
 * IDA_ELIMIT past the bounds (the detail in @call). */
int ida__session_fresh_locked(struct idalloc_client *c,
                              struct ida_acall *a,
                              int *assigned);
/* Give @a (holding a reservation) its seq now that the session is
 * registered: 0, or IDA_ELIMIT. */
int ida__session_assign_locked(struct idalloc_client *c, struct ida_acall *a);
/* A new session after IDA_EEXPIRED (when the session is still @id). */
int ida__session_renew_locked(struct idalloc_client *c, const uint8_t *id);
/* Holds sess_mu. */
uint64_t ida__floor_locked(const struct idalloc_client *c);
int ida__outstanding_add_locked(struct idalloc_client *c, uint64_t seq);
/* Forget @seq of session @id (if it is still the session). Takes sess_mu. */
void ida__outstanding_del(struct idalloc_client *c,
                          const uint8_t *id,
                          uint64_t seq);

/* The index of the node with client address @addr, adding it to the known
 * nodes if it is new (bounded: SIZE_MAX when the table is full or @addr is
 * not an address). */
size_t ida__client_learn(struct idalloc_client *c, const char *addr);

/* Learn every member address a response carries. */
void ida__client_learn_members(struct idalloc_client *c,
                               const Idalloc__ClientResponse *r);

/* Write the detail of an error into @call (NULL: dropped). */
void ida__call_error(struct idalloc_call *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
uint64_t ida__client_now_ms(void);

/* next.c: free idalloc_next()'s pools (after the loop stopped). */
void ida__client_next_init(struct idalloc_client *c);
void ida__client_next_free(struct idalloc_client *c);

#endif /* IDA_CLIENT_H */
