/* libidalloc: the life of a call, on the I/O thread (src/client/client.h
 * has the design; the connections and timers are src/client/loop.c).
 *
 * Outcome: a call that ends without an answer is IDA_EUNAVAIL when the
 * request never reached a node, or reached only nodes that answered "not
 * leader" (not carried out, retrying is safe), else IDA_ETIMEDOUT (it may
 * have taken effect: retry with the same request id).
 *
 * Retries: a call has a request id fixed for its whole life. On a timeout,
 * a dead connection or an answer that does not settle it (not leader, busy,
 * leadership lost) it moves on to another node with the SAME client_id and
 * request_seq, following the NOT_LEADER hint at once when there is one,
 * else after a backoff (10 ms doubling to 200 ms), until the call deadline;
 * the cluster's session table turns a retry of a request that already took
 * effect into its first answer. Each attempt has its own timer
 * (attempt_timeout_ms, at most the call deadline).
 *
 * Sessions: a fresh write needs a registered session for its request id.
 * While none is, the writes wait in c->reg_wait and one registration (a
 * RegisterClient call of its own, c->reg) is in flight; its answer gives
 * them their seqs, its failure ends them IDA_EUNAVAIL (nothing was sent).
 * IDA_EEXPIRED ("no such session, nothing executed") for a fresh write that
 * no earlier attempt may have delivered makes the library register a new
 * session and send the write again under it; for a repeated write, or one
 * an earlier attempt may have delivered, it is IDA_ESESSION: the first
 * attempt may have acted and its answer is gone.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "src/client/client.h"

void ida__call_init(struct ida_acall *a,
                    Idalloc__ClientRequest *req,
                    int write,
                    int replay,
                    struct idalloc_call *call,
                    ida_acall_done_fn done,
                    void *arg)
{
    memset(a, 0, offsetof(struct ida_acall, frame_inline));
    a->req = req;
    a->write = write;
    a->replay = replay;
    a->call = call;
    a->done = done;
    a->arg = arg;
    a->node = SIZE_MAX;
    a->heap_at = SIZE_MAX;
    a->backoff_ms = 10;
    snprintf(a->why, sizeof(a->why), "no attempt made");
}

/* Encode a->req into a->frame. */
static int encode(struct ida_acall *a)
{
    size_t n = idalloc__client_request__get_packed_size(a->req);
    if (n > IDA_FRAME_PAYLOAD_BYTES_DEFAULT) {
        ida__call_error(a->call, "request too large (%zu bytes)", n);
        return IDA_ETOOBIG;
    }
    size_t len = IDA_FRAME_HEADER_BYTES + n;
    a->frame =
        len <= sizeof(a->frame_inline) ? a->frame_inline : ida_malloc(len);
    if (a->frame == NULL) {
        ida__call_error(a->call, "out of memory");
        return IDA_ENOMEM;
    }
    ida_frame_header_encode(a->frame, IDA_FRAME_CLIENT_REQUEST, n);
    idalloc__client_request__pack(a->req, a->frame + IDA_FRAME_HEADER_BYTES);
    a->frame_len = len;
    return 0;
}

static void drop_frame(struct ida_acall *a)
{
    if (a->frame != a->frame_inline) {
        ida_free(a->frame);
    }
    a->frame = NULL;
}

/* --- submit (any thread) ----------------------------------------------- */

/* The request id of @a: a read's fresh seq, a repeat's own, or a fresh
 * write's from the session (or a place among those waiting for it). */
static int request_id(struct idalloc_client *c, struct ida_acall *a)
{
    int rv = 0, assigned;
    pthread_mutex_lock(&c->sess_mu);
    if (!a->write) {
        memcpy(a->id, c->client_id, 16);
        a->req->request_seq = c->next_read_seq++;
        a->has_seq = 1;
    } else if (a->replay) {
        /* A repeat: the same request id, whatever session it came from. */
        int own = memcmp(a->call->client_id, c->client_id, 16) == 0;
        rv = own ? ida__outstanding_add_locked(c, a->call->seq) : 0;
        if (rv == 0) {
            a->own = own;
            a->req->ack_below = own ? ida__floor_locked(c) : 0;
            memcpy(a->id, a->call->client_id, 16);
            a->req->request_seq = a->call->seq;
            a->has_seq = 1;
        } else {
            ida__call_error(a->call, "%d calls outstanding on this client",
                            IDALLOC_OUTSTANDING_MAX);
        }
    } else {
        rv = ida__session_fresh_locked(c, a, &assigned);
    }
    pthread_mutex_unlock(&c->sess_mu);
    a->req->client_id.data = a->id;
    a->req->client_id.len = 16;
    return rv;
}

/* Undo request_id() for a call that was not submitted. A repeat's seq
 * stays wanted: its call struct stays UNKNOWN. */
static void undo_request_id(struct idalloc_client *c, struct ida_acall *a)
{
    if (a->write && !a->replay && a->has_seq) {
        ida__outstanding_del(c, a->id, a->req->request_seq);
        a->call->seq = 0;
    }
    if (a->reserved) {
        pthread_mutex_lock(&c->sess_mu);
        c->n_unseq--;
        pthread_mutex_unlock(&c->sess_mu);
        a->reserved = 0;
    }
}

static void live_link(struct idalloc_client *c, struct ida_acall *a);
static void start_attempt_at(struct idalloc_client *c,
                             struct ida_acall *a,
                             uint64_t now);

/* Append @a to the list @head..@tail (the caller holds its lock). */
static void queue_append(struct ida_acall **head,
                         struct ida_acall **tail,
                         struct ida_acall *a)
{
    a->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = a;
    } else {
        *head = a;
    }
    *tail = a;
}

/* From a thread other than the I/O thread: when the I/O thread sleeps in
 * poll() (lp_mu free) and @a's connection is ready, send @a now from this
 * thread, waking the I/O thread only if @a's timer is due before its
 * poll() returns. Returns 1 when @a is on its way (never completed here:
 * its deadline is ahead), 0 when it must be queued. */
static int submit_inline(struct idalloc_client *c, struct ida_acall *a)
{
    if (!a->has_seq || pthread_mutex_trylock(&c->lp_mu) != 0) {
        return 0;
    }
    size_t t = a->node != SIZE_MAX
                   ? a->node
                   : atomic_load(&c->leader) % atomic_load(&c->nconns);
    uint64_t now = ida__client_now_ms();
    if (c->loop_closing || now >= a->deadline_ms || !ida__loop_ready(c, t)) {
        pthread_mutex_unlock(&c->lp_mu);
        return 0;
    }
    live_link(c, a);
    a->target = t;
    start_attempt_at(c, a, now); /* on the bucket, its frame queued */
    int wake = ida__loop_flush(c, t) != 0 || a->due_ms < c->poll_until;
    pthread_mutex_unlock(&c->lp_mu);
    if (wake) {
        ida__loop_wake(c);
    }
    return 1;
}

int ida__call_submit(struct idalloc_client *c, struct ida_acall *a)
{
    a->c = c;
    a->req->version = IDA_WIRE_VERSION;
    a->deadline_ms = ida__client_now_ms() + c->opts.call_timeout_ms;
    if (atomic_fetch_add(&c->n_calls, 1) >= IDALLOC_IN_FLIGHT_MAX) {
        atomic_fetch_sub(&c->n_calls, 1);
        ida__call_error(a->call, "%d calls in flight on this client",
                        IDALLOC_IN_FLIGHT_MAX);
        return IDA_ELIMIT;
    }
    int rv = request_id(c, a);
    if (rv == 0 && a->has_seq) {
        rv = encode(a);
    }
    if (rv == 0) {
        if (ida__client_on_loop(c)) {
            /* From a callback: the loop takes it before it sleeps. */
            if (c->loop_closing) {
                rv = IDA_EUNAVAIL;
            } else {
                queue_append(&c->lq_head, &c->lq_tail, a);
            }
        } else if (submit_inline(c, a)) {
            return 0;
        } else {
            pthread_mutex_lock(&c->q_mu);
            if (c->closing) {
                rv = IDA_EUNAVAIL;
            } else {
                queue_append(&c->q_head, &c->q_tail, a);
            }
            pthread_mutex_unlock(&c->q_mu);
            if (rv == 0) {
                ida__loop_wake(c);
            }
        }
        if (rv == IDA_EUNAVAIL) {
            ida__call_error(a->call,
                            "the client is being freed; nothing was sent");
        }
    }
    if (rv != 0) {
        drop_frame(a);
        undo_request_id(c, a);
        atomic_fetch_sub(&c->n_calls, 1);
    }
    return rv;
}

/* --- the end of a call --------------------------------------------------- */

static void live_unlink(struct idalloc_client *c, struct ida_acall *a)
{
    if (a->live_prev != NULL) {
        a->live_prev->live_next = a->live_next;
    } else if (c->live == a) {
        c->live = a->live_next;
    }
    if (a->live_next != NULL) {
        a->live_next->live_prev = a->live_prev;
    }
    a->live_next = a->live_prev = NULL;
}

/* End @a with @rv (and @r on 0); its detail is in a->call already. */
static void complete(struct idalloc_client *c,
                     struct ida_acall *a,
                     int rv,
                     Idalloc__ClientResponse *r)
{
    IDA_ASSERT(a->phase != IDA_AC_DONE);
    ida__timer_clear(c, a);
    ida__alist_del(a);
    live_unlink(c, a);
    a->phase = IDA_AC_DONE;
    if (a->reserved) {
        pthread_mutex_lock(&c->sess_mu);
        c->n_unseq--;
        pthread_mutex_unlock(&c->sess_mu);
        a->reserved = 0;
    }
    drop_frame(a);
    if (!a->internal) {
        atomic_fetch_sub(&c->n_calls, 1);
    }
    a->done(a, rv, r); /* @a may be gone now */
}

/* The deadline passed: the outcome from what the attempts did. */
static void out_of_time(struct idalloc_client *c, struct ida_acall *a)
{
    if (a->maybe_sent) {
        ida__call_error(a->call,
                        "no answer within %u ms (last: %s); outcome unknown",
                        c->opts.call_timeout_ms, a->why);
        complete(c, a, IDA_ETIMEDOUT, NULL);
        return;
    }
    ida__call_error(
        a->call,
        a->any_sent ? "no node accepted it within %u ms, it was not carried "
                      "out (last: %s); retrying is safe"
                    : "nothing was sent: no node reachable within %u ms (last "
                      "tried %s); retrying is safe",
        c->opts.call_timeout_ms, a->why);
    complete(c, a, IDA_EUNAVAIL, NULL);
}

/* --- attempts ----------------------------------------------------------- */

static void start_attempt_at(struct idalloc_client *c,
                             struct ida_acall *a,
                             uint64_t now)
{
    if (now >= a->deadline_ms) {
        out_of_time(c, a);
        return;
    }
    uint64_t due = a->deadline_ms;
    if (a->node == SIZE_MAX && now + c->opts.attempt_timeout_ms < due) {
        due = now + c->opts.attempt_timeout_ms;
    }
    a->earlier_sent = a->maybe_sent;
    ida__timer_set(c, a, due);
    ida__loop_send(c, a);
}

static void start_attempt(struct idalloc_client *c, struct ida_acall *a)
{
    start_attempt_at(c, a, ida__client_now_ms());
}

/* Wait before the next attempt (the deadline may come first). */
static void backoff(struct idalloc_client *c, struct ida_acall *a)
{
    uint64_t now = ida__client_now_ms();
    if (now >= a->deadline_ms) {
        out_of_time(c, a);
        return;
    }
    uint64_t left = a->deadline_ms - now;
    a->phase = IDA_AC_BACKOFF;
    ida__timer_set(c, a, now + (a->backoff_ms < left ? a->backoff_ms : left));
    a->backoff_ms = a->backoff_ms * 2 > 200 ? 200 : a->backoff_ms * 2;
}

static size_t next_node(struct idalloc_client *c, size_t i)
{
    return (i + 1) % atomic_load(&c->nconns);
}

void ida__call_attempt_failed(struct idalloc_client *c,
                              struct ida_acall *a,
                              int sent,
                              int rv,
                              const char *why)
{
    ida__timer_clear(c, a);
    ida__alist_del(a);
    const struct ida_client_conn *k = &c->conns[a->target];
    a->maybe_sent |= sent;
    a->any_sent |= sent;
    if (sent) {
        snprintf(a->why, sizeof(a->why), "%s: %s", k->addr.text,
                 idalloc_strerror(rv));
    } else {
        snprintf(a->why, sizeof(a->why), "%s",
                 why != NULL ? why : "cannot connect");
    }
    if (a->node != SIZE_MAX) { /* one attempt only */
        ida__call_error(a->call, "%s", a->why);
        complete(c, a, sent ? rv : IDA_EUNAVAIL, NULL);
        return;
    }
    a->target = next_node(c, a->target);
    backoff(c, a);
}

/* Answers that do not settle a request: try elsewhere with the same id. */
static int retryable(uint32_t err)
{
    return err == IDA_ENOTLEADER || err == IDA_EBUSY || err == IDA_ESTOPPED ||
           err == IDA_ELEADERLOST || err == IDA_EUNAVAIL;
}

static void wait_session(struct idalloc_client *c, struct ida_acall *a);

/* IDA_EEXPIRED for a write: the cluster does not know its session. */
static void expired(struct idalloc_client *c, struct ida_acall *a)
{
    if (a->replay) {
        ida__call_error(a->call,
                        "the session of this call expired: outcome "
                        "unknown for good");
        complete(c, a, IDA_ESESSION, NULL);
        return;
    }
    ida__outstanding_del(c, a->id, a->req->request_seq);
    a->own = 0;
    if (a->earlier_sent || a->round > 0) {
        /* An earlier attempt may have acted before the session went. */
        ida__call_error(a->call,
                        "the session expired during the call: outcome "
                        "unknown");
        complete(c, a, IDA_ESESSION, NULL);
        return;
    }
    /* Definitely not executed: a new session, and the call again. */
    a->call->seq = 0;
    a->has_seq = 0;
    a->req->ack_below = 0;
    drop_frame(a);
    int assigned = 0;
    pthread_mutex_lock(&c->sess_mu);
    int rv = ida__session_renew_locked(c, a->id);
    if (rv == 0) {
        rv = ida__session_fresh_locked(c, a, &assigned);
    } else {
        ida__call_error(a->call, "cannot read /dev/urandom");
    }
    pthread_mutex_unlock(&c->sess_mu);
    a->round++;
    a->maybe_sent = a->any_sent = 0;
    if (rv == 0 && assigned) {
        rv = encode(a);
    }
    if (rv != 0) {
        complete(c, a, rv, NULL);
    } else if (!assigned) {
        wait_session(c, a);
    } else {
        start_attempt(c, a);
    }
}

void ida__call_answered(struct idalloc_client *c,
                        struct ida_acall *a,
                        Idalloc__ClientResponse *r)
{
    ida__timer_clear(c, a);
    const struct ida_client_conn *k = &c->conns[a->target];
    /* Sent and not answered "not leader" (which means not carried out): it
     * may have taken effect. */
    a->maybe_sent |= !(r->result != NULL && r->result->error == IDA_ENOTLEADER);
    a->any_sent = 1;
    ida__client_learn_members(c, r);
    if (a->node != SIZE_MAX) {
        complete(c, a, 0, r);
        return;
    }
    if (r->result != NULL && retryable(r->result->error)) {
        /* Follow the hint wherever it points, even to a node we were not
         * given: the cluster knows its members. */
        size_t hint = r->leader_addr[0] != '\0'
                          ? ida__client_learn(c, r->leader_addr)
                          : SIZE_MAX;
        snprintf(a->why, sizeof(a->why), "%s: %s", k->addr.text,
                 idalloc_strerror((int)r->result->error));
        idalloc__client_response__free_unpacked(r, NULL);
        if (hint != SIZE_MAX && hint != a->target) {
            a->target = hint; /* follow the hint at once */
            start_attempt(c, a);
            return;
        }
        a->target = next_node(c, a->target);
        backoff(c, a);
        return;
    }
    if (r->result == NULL) {
        idalloc__client_response__free_unpacked(r, NULL);
        snprintf(a->why, sizeof(a->why), "%s: response without a result",
                 k->addr.text);
        a->target = next_node(c, a->target);
        backoff(c, a);
        return;
    }
    atomic_store(&c->leader, a->target);
    if (a->write && r->result->error == IDA_EEXPIRED) {
        idalloc__client_response__free_unpacked(r, NULL);
        expired(c, a);
        return;
    }
    complete(c, a, 0, r);
}

/* An attempt's answer that came after the attempt's timer had moved the
 * call on is as good as the next attempt's: every attempt of a fresh call
 * carries the same request id, and the cluster answers a request id once
 * (a write) or after a ReadIndex taken after it was sent (a read), so any
 * answer that settles the call is one the call may end with. Dropping it made a
 * call whose answers always take longer than attempt_timeout_ms (a 1 MiB backup
 * chunk on a slow link) repeat until its deadline. Only answers that
 * settle count: "not leader", "busy" and the like, and a write's
 * "expired", are about the attempt and the call goes on as it is. */
int ida__call_late_answer(struct idalloc_client *c,
                          size_t k_index,
                          Idalloc__ClientResponse *r)
{
    const Idalloc__CommandResult *res = r->result;
    if (res == NULL || retryable(res->error) || res->error == IDA_EEXPIRED) {
        return 0;
    }
    struct ida_acall *a = c->live;
    while (a != NULL && (a->internal || !a->has_seq ||
                         a->req->request_seq != r->request_seq)) {
        a = a->live_next; /* a registration's seq is any seq: not matched */
    }
    /* A one-attempt call ends with its attempt. A repeat (a call struct
     * given again after an unknown outcome) shares its seq with the call
     * it repeats, whose attempts may still be answered: with other
     * arguments it must get IDA_EREUSED, not the earlier call's answer. A
     * fresh call's seq is its own (no other call of this client had it). */
    if (a == NULL || a->node != SIZE_MAX || a->replay ||
        (a->phase != IDA_AC_SENT && a->phase != IDA_AC_BACKOFF &&
         a->phase != IDA_AC_CONNECT)) {
        return 0;
    }
    ida__alist_del(a);
    a->target = k_index;
    ida__call_answered(c, a, r);
    return 1;
}

/* --- the session's registration ----------------------------------------- */

struct reg
{
    struct ida_acall a;
    Idalloc__ClientRequest req;
    Idalloc__RegisterClient op;
    struct idalloc_call call;
};

static void start_attempt_fresh(struct idalloc_client *c, struct ida_acall *a)
{
    a->target = a->node != SIZE_MAX
                    ? a->node
                    : atomic_load(&c->leader) % atomic_load(&c->nconns);
    start_attempt(c, a);
}

static void reg_done(struct ida_acall *a, int rv, Idalloc__ClientResponse *r)
{
    struct reg *g = a->arg;
    struct idalloc_client *c = a->c;
    c->reg = NULL;
    char msg[IDALLOC_ERRMSG_MAX];
    int err = rv;
    if (rv == 0) {
        const Idalloc__CommandResult *res = r->result;
        if (res->error != 0) {
            err = (int)res->error;
            snprintf(msg, sizeof(msg), "registering a session: %s",
                     res->error_msg[0] != '\0' ? res->error_msg
                                               : idalloc_strerror(err));
        } else if (res->result_case !=
                   IDALLOC__COMMAND_RESULT__RESULT_REGISTER_CLIENT) {
            err = IDA_EPROTO;
            snprintf(msg, sizeof(msg), "registering a session: wrong answer");
        }
        idalloc__client_response__free_unpacked(r, NULL);
    } else if (rv == IDA_ETIMEDOUT || rv == IDA_ECLOSED) {
        /* The registration may have happened; the writes were not sent. */
        err = IDA_EUNAVAIL;
        snprintf(msg, sizeof(msg),
                 "could not register a session within %u ms; the call was "
                 "not sent",
                 c->opts.call_timeout_ms);
    } else {
        snprintf(msg, sizeof(msg), "registering a session: %.400s",
                 g->call.errmsg);
    }
    if (c->loop_closing) {
        err = IDA_EUNAVAIL;
        snprintf(msg, sizeof(msg),
                 "the client was freed before the call was sent; nothing "
                 "was done");
    }
    if (err == 0) {
        pthread_mutex_lock(&c->sess_mu);
        if (memcmp(g->a.id, c->client_id, 16) == 0) {
            c->registered = 1;
        }
        pthread_mutex_unlock(&c->sess_mu);
    }
    ida_free(g);
    struct ida_alist waiting = c->reg_wait;
    c->reg_wait.head = c->reg_wait.tail = NULL;
    for (struct ida_acall *w = waiting.head; w != NULL; w = w->next) {
        w->list = &waiting;
    }
    struct ida_acall *w;
    while ((w = ida__alist_pop(&waiting)) != NULL) {
        ida__timer_clear(c, w);
        if (err != 0) {
            ida__call_error(w->call, "%s", msg);
            complete(c, w, err, NULL);
        } else {
            wait_session(c, w);
        }
    }
}

static int start_registration(struct idalloc_client *c)
{
    struct reg *g = ida_malloc(sizeof(*g));
    if (g == NULL) {
        return IDA_ENOMEM;
    }
    idalloc__client_request__init(&g->req);
    idalloc__register_client__init(&g->op);
    g->req.op_case = IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT;
    g->req.register_client = &g->op;
    g->req.version = IDA_WIRE_VERSION;
    idalloc_call_init(&g->call);
    ida__call_init(&g->a, &g->req, 0, 0, &g->call, reg_done, g);
    g->a.c = c;
    g->a.internal = 1;
    g->a.deadline_ms = ida__client_now_ms() + c->opts.call_timeout_ms;
    pthread_mutex_lock(&c->sess_mu);
    memcpy(g->a.id, c->client_id, 16);
    pthread_mutex_unlock(&c->sess_mu);
    g->req.client_id.data = g->a.id;
    g->req.client_id.len = 16;
    g->req.request_seq = 1; /* registrations are not kept: any seq */
    g->a.has_seq = 1;
    int rv = encode(&g->a);
    if (rv != 0) {
        ida_free(g);
        return rv;
    }
    c->reg = &g->a;
    ida__call_intake(c, &g->a);
    return 0;
}

/* A fresh write without a request id: give it one if the session is
 * registered, else wait for the registration (starting it if needed). */
static void wait_session(struct idalloc_client *c, struct ida_acall *a)
{
    if (c->loop_closing) {
        ida__call_error(a->call,
                        "the client was freed before the call was sent; "
                        "nothing was done");
        complete(c, a, IDA_EUNAVAIL, NULL);
        return;
    }
    int rv = 0, assigned = 0;
    pthread_mutex_lock(&c->sess_mu);
    if (c->registered) {
        rv = ida__session_assign_locked(c, a);
        assigned = rv == 0;
    }
    pthread_mutex_unlock(&c->sess_mu);
    if (assigned) {
        rv = encode(a);
    }
    if (rv != 0) {
        complete(c, a, rv, NULL);
        return;
    }
    if (assigned) {
        start_attempt_fresh(c, a);
        return;
    }
    a->phase = IDA_AC_SESSION;
    ida__alist_push(&c->reg_wait, a);
    ida__timer_set(c, a, a->deadline_ms);
    if (c->reg == NULL && (rv = start_registration(c)) != 0) {
        ida__call_error(a->call, "registering a session: out of memory");
        complete(c, a, rv, NULL);
    }
}

/* --- the I/O thread's entry points ------------------------------------- */

static void live_link(struct idalloc_client *c, struct ida_acall *a)
{
    a->live_prev = NULL;
    a->live_next = c->live;
    if (c->live != NULL) {
        c->live->live_prev = a;
    }
    c->live = a;
}

void ida__call_intake(struct idalloc_client *c, struct ida_acall *a)
{
    live_link(c, a);
    if (c->loop_closing) {
        ida__call_error(a->call,
                        "the client was freed before the call was sent; "
                        "nothing was done");
        complete(c, a, IDA_EUNAVAIL, NULL);
        return;
    }
    if (!a->has_seq) {
        wait_session(c, a);
        return;
    }
    start_attempt_fresh(c, a);
}

void ida__call_timer_fired(struct idalloc_client *c, struct ida_acall *a)
{
    switch (a->phase) {
        case IDA_AC_SENT:
            ida__call_attempt_failed(c, a, 1, IDA_ETIMEDOUT, NULL);
            break;
        case IDA_AC_CONNECT: {
            char why[256];
            snprintf(why, sizeof(why), "%s: cannot connect",
                     c->conns[a->target].addr.text);
            ida__call_attempt_failed(c, a, 0, 0, why);
            break;
        }
        case IDA_AC_BACKOFF:
            start_attempt(c, a);
            break;
        case IDA_AC_SESSION:
            if (c->reg != NULL && !c->reg->any_sent) {
                ida__call_error(a->call,
                                "nothing was sent: no node reachable within "
                                "%u ms (last tried %s); retrying is safe",
                                c->opts.call_timeout_ms, c->reg->why);
            } else {
                ida__call_error(a->call,
                                "could not register a session within %u ms; "
                                "the call was not sent",
                                c->opts.call_timeout_ms);
            }
            complete(c, a, IDA_EUNAVAIL, NULL);
            break;
        case IDA_AC_QUEUED:
        case IDA_AC_DONE:
            IDA_ASSERT(!"a timer on a call that has none");
    }
}

void ida__call_close_all(struct idalloc_client *c)
{
    IDA_ASSERT(c->loop_closing);
    while (c->live != NULL) {
        struct ida_acall *a = c->live;
        if (a->maybe_sent || a->phase == IDA_AC_SENT) {
            ida__call_error(
                a->call,
                "the client was freed before an answer came "
                "(last: %s); outcome unknown",
                a->phase == IDA_AC_SENT ? "sent, no answer yet" : a->why);
            complete(c, a, IDA_ECLOSED, NULL);
        } else {
            ida__call_error(a->call,
                            "the client was freed before the call was sent; "
                            "nothing was done");
            complete(c, a, IDA_EUNAVAIL, NULL);
        }
    }
}

/* --- blocking calls ----------------------------------------------------- */

struct sync
{
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int rv;
    Idalloc__ClientResponse *r;
};

static void sync_done(struct ida_acall *a, int rv, Idalloc__ClientResponse *r)
{
    struct sync *s = a->arg;
    pthread_mutex_lock(&s->mu);
    s->rv = rv;
    s->r = r;
    s->done = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static int sync_run(struct idalloc_client *c,
                    struct ida_acall *a,
                    Idalloc__ClientResponse **resp)
{
    if (ida__client_on_loop(c)) {
        ida__call_error(a->call,
                        "a blocking call from a completion callback would "
                        "wait for its own thread");
        return IDA_EINVAL;
    }
    struct sync s = {.done = 0};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    a->done = sync_done;
    a->arg = &s;
    int rv = ida__call_submit(c, a);
    if (rv == 0) {
        pthread_mutex_lock(&s.mu);
        while (!s.done) {
            pthread_cond_wait(&s.cv, &s.mu);
        }
        pthread_mutex_unlock(&s.mu);
        rv = s.rv;
        if (rv == 0) {
            *resp = s.r;
        }
    }
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    return rv;
}

int ida__client_call(struct idalloc_client *c,
                     Idalloc__ClientRequest *req,
                     int write,
                     struct idalloc_call *call,
                     Idalloc__ClientResponse **resp)
{
    IDA_ASSERT(call != NULL);
    struct ida_acall a;
    int replay = write && call->state == IDALLOC_CALL_UNKNOWN && call->seq != 0;
    ida__call_init(&a, req, write, replay, call, NULL, NULL);
    return sync_run(c, &a, resp);
}

int ida__client_call_node(struct idalloc_client *c,
                          size_t node,
                          Idalloc__ClientRequest *req,
                          Idalloc__ClientResponse **resp)
{
    struct idalloc_call call;
    idalloc_call_init(&call);
    struct ida_acall a;
    ida__call_init(&a, req, 0, 0, &call, NULL, NULL);
    a.node = node;
    return sync_run(c, &a, resp);
}
