/* The copies of the state a backup reads (backup_copy.h). */
#include "src/node/backup_copy.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/collapse.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/node.h"

void ida__backups_init(struct ida__backups *b, struct ida_node *n)
{
    memset(b, 0, sizeof(*b));
    b->node = n;
}

static void copy_drop(struct ida__backup_copy *c)
{
    if (c->mapped) {
        ida_bgsnap_unmap(c->data, c->len);
    } else {
        ida_free((void *)(uintptr_t)c->data);
    }
    memset(c, 0, sizeof(*c));
}

static bool same_call(const struct ida__backup_call *a,
                      const struct ida__backup_call *x)
{
    return a->seq == x->seq && memcmp(a->cid, x->cid, 16) == 0;
}

static void reply_error(struct ida__backups *b,
                        uint64_t conn,
                        uint64_t seq,
                        int err,
                        const char *why)
{
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    res.error = (uint32_t)err;
    res.error_msg = (char *)(why != NULL ? why : idalloc_strerror(err));
    ida__node_reply_result(b->node, conn, seq, &res, 0);
}

/* Answer (@conn, @seq) with @c's chunk at @off (within it). */
static void send_chunk(struct ida__backups *b,
                       struct ida__backup_copy *c,
                       uint64_t conn,
                       uint64_t seq,
                       size_t off)
{
    size_t n = c->len - off;
    n = n > IDA_BACKUP_CHUNK_BYTES ? IDA_BACKUP_CHUNK_BYTES : n;
    Idalloc__SnapshotChunk ch = IDALLOC__SNAPSHOT_CHUNK__INIT;
    ch.index = c->index;
    ch.term = c->term;
    ch.cluster = (char *)b->node->cfg.cluster;
    ch.total_size = c->len;
    ch.offset = off;
    ch.data.data = (uint8_t *)(uintptr_t)(c->data + off);
    ch.data.len = n;
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    res.result_case = IDALLOC__COMMAND_RESULT__RESULT_SNAPSHOT_CHUNK;
    res.snapshot_chunk = &ch;
    ida__node_reply_result(b->node, conn, seq, &res, 0);
    c->read_ms = ida__node_mono_ms();
}

/* Answer @call's first chunk from @c, remembering that it did (@known: it
 * did already). */
static void answer_first(struct ida__backups *b,
                         struct ida__backup_copy *c,
                         const struct ida__backup_call *call,
                         uint64_t conn,
                         bool known)
{
    if (!known) {
        c->answered[c->n_answered++ % IDA_BACKUP_CALLS_MAX] = *call;
    }
    send_chunk(b, c, conn, call->seq, 0);
}

/* The copy that answered @call, if kept. */
static struct ida__backup_copy *copy_of_call(
    struct ida__backups *b,
    const struct ida__backup_call *call)
{
    for (size_t i = 0; i < IDA_BACKUP_COPIES; i++) {
        struct ida__backup_copy *c = &b->copies[i];
        size_t n = c->n_answered < IDA_BACKUP_CALLS_MAX ? c->n_answered
                                                        : IDA_BACKUP_CALLS_MAX;
        for (size_t k = 0; c->data != NULL && k < n; k++) {
            if (same_call(&c->answered[k], call)) {
                return c;
            }
        }
    }
    return NULL;
}

static struct ida__backup_copy *copy_at(struct ida__backups *b, ida_index index)
{
    for (size_t i = 0; i < IDA_BACKUP_COPIES; i++) {
        if (b->copies[i].data != NULL && b->copies[i].index == index) {
            return &b->copies[i];
        }
    }
    return NULL;
}

/* A copy is made: it becomes the newest (copies[0]), in place of an empty
 * slot or of the copy read least recently. Then every call waiting for at
 * most its index is answered. */
static void copy_made(struct ida__backups *b,
                      const uint8_t *data,
                      size_t len,
                      int mapped,
                      ida_index index,
                      ida_term term,
                      const char *how)
{
    /* A backup still reading the other copy is not cut off. */
    size_t v = 0;
    for (size_t i = 0; i < IDA_BACKUP_COPIES; i++) {
        if (b->copies[i].data == NULL) {
            v = i;
            break;
        }
        if (b->copies[i].read_ms < b->copies[v].read_ms) {
            v = i;
        }
    }
    copy_drop(&b->copies[v]);
    memmove(&b->copies[1], &b->copies[0], v * sizeof(b->copies[0]));
    struct ida__backup_copy *c = &b->copies[0];
    *c = (struct ida__backup_copy){.data = data,
                                   .len = len,
                                   .mapped = mapped,
                                   .index = index,
                                   .term = term,
                                   .read_ms = ida__node_mono_ms()};
    IDA_INFO("fsm: backup copy of the state at index %llu (%zu bytes, %s)",
             (unsigned long long)index, len, how);
    size_t k = 0;
    for (size_t i = 0; i < b->n_waiting; i++) {
        struct ida__backup_waiter *w = &b->waiting[i];
        if (w->need <= index) {
            answer_first(b, c, &w->call, w->conn, false);
        } else {
            b->waiting[k++] = *w;
        }
    }
    b->n_waiting = k;
}

/* A copy encoded in line, for the calls waiting (each is answered, with
 * the copy or with the lack of memory). */
static void copy_in_line(struct ida__backups *b,
                         const struct ida_fsm *f,
                         ida_term term)
{
    uint8_t *data;
    size_t len;
    if (ida_fsm_snapshot(f, &data, &len) != 0) {
        for (size_t i = 0; i < b->n_waiting; i++) {
            reply_error(b, b->waiting[i].conn, b->waiting[i].call.seq,
                        IDA_EBUSY, "no memory for a copy of the state");
        }
        b->n_waiting = 0;
        return;
    }
    copy_made(b, data, len, 0, ida_fsm_applied_index(f), term, "in line");
}

/* Make a copy for the calls waiting: a child if one can run (the applied
 * index covers every waiting call's ReadIndex), else in line. A fork()
 * would wait for a collapse under way (base/collapse.h, FORK): then the
 * next poll forks instead. */
static void start_copy(struct ida__backups *b,
                       const struct ida_fsm *f,
                       ida_term term)
{
    if (ida_bgsnap_running(&b->child) || !ida_collapse_pause()) {
        return;
    }
    int rv = ida_bgsnap_start_mem(&b->child, f, ida_fsm_applied_index(f), term);
    ida_collapse_resume();
    if (rv != 0) {
        copy_in_line(b, f, term);
    }
}

static void serve_first(struct ida__backups *b,
                        const struct ida_fsm *f,
                        ida_term term,
                        const struct ida_nm_read *rd)
{
    struct ida__backup_call call = {.seq = rd->req->request_seq};
    if (rd->req->client_id.len == 16) {
        memcpy(call.cid, rd->req->client_id.data, 16);
    }
    for (size_t i = 0; i < b->n_waiting; i++) {
        if (same_call(&b->waiting[i].call, &call)) {
            b->waiting[i].conn = rd->conn; /* its latest attempt */
            return;
        }
    }
    struct ida__backup_copy *c = copy_of_call(b, &call);
    bool known = c != NULL;
    if (c == NULL && b->copies[0].data != NULL &&
        b->copies[0].index >= rd->index) {
        c = &b->copies[0]; /* made after this call's ReadIndex */
    }
    if (c != NULL) {
        answer_first(b, c, &call, rd->conn, known);
        return;
    }
    if (b->n_waiting == IDA_BACKUP_CALLS_MAX) {
        reply_error(b, rd->conn, call.seq, IDA_EBUSY,
                    "too many backups at once: try again");
        return;
    }
    b->waiting[b->n_waiting++] =
        (struct ida__backup_waiter){call, rd->conn, rd->index};
    start_copy(b, f, term);
}

void ida__backups_read(struct ida__backups *b,
                       const struct ida_fsm *f,
                       ida_term term,
                       const struct ida_nm_read *rd)
{
    const Idalloc__SnapshotRead *q = rd->req->snapshot_read;
    if (q->offset == 0 && q->index == 0) {
        serve_first(b, f, term, rd);
        return;
    }
    struct ida__backup_copy *c = copy_at(b, q->index);
    if (c != NULL && q->offset >= c->len) {
        reply_error(b, rd->conn, rd->req->request_seq, IDA_EINVAL,
                    "offset past the end of the backup copy");
        return;
    }
    if (c == NULL) {
        char why[200];
        snprintf(why, sizeof(why),
                 "the backup copy at index %llu is gone (replaced, unread "
                 "for %u s, or a leader change): start again",
                 (unsigned long long)q->index, IDA_BACKUP_KEEP_MS / 1000);
        reply_error(b, rd->conn, rd->req->request_seq, IDA_ENOTFOUND, why);
        return;
    }
    send_chunk(b, c, rd->conn, rd->req->request_seq, (size_t)q->offset);
}

void ida__backups_poll(struct ida__backups *b,
                       const struct ida_fsm *f,
                       ida_term term)
{
    uint64_t now = ida__node_mono_ms();
    for (size_t i = 0; i < IDA_BACKUP_COPIES; i++) {
        if (b->copies[i].data != NULL &&
            now - b->copies[i].read_ms > IDA_BACKUP_KEEP_MS) {
            copy_drop(&b->copies[i]);
        }
    }
    if (!ida_bgsnap_running(&b->child)) {
        if (b->n_waiting > 0) {
            start_copy(b, f, term); /* put off for a collapse */
        }
        return;
    }
    ida_index index = b->child.index;
    ida_term at_term = b->child.term;
    uint64_t t0 = b->child.started_us;
    const uint8_t *data;
    size_t len;
    int rv = ida_bgsnap_poll_mem(&b->child, &data, &len);
    if (rv == 0 &&
        ida__node_mono_us() - t0 > (uint64_t)IDA_BACKUP_CHILD_MAX_MS * 1000) {
        ida_bgsnap_cancel(&b->child); /* hung: in line below */
        rv = -IDA_ETIMEDOUT;
    }
    if (rv == 0) {
        return;
    }
    if (rv < 0) {
        if (rv == -IDA_ETIMEDOUT) {
            IDA_WARN(
                "fsm: the child copying the state for a backup ran for %u "
                "s and was killed; copying in line",
                IDA_BACKUP_CHILD_MAX_MS / 1000);
        } else {
            IDA_WARN(
                "fsm: the child copying the state for a backup failed (%s); "
                "copying in line",
                idalloc_strerror(-rv));
        }
        copy_in_line(b, f, term);
    } else {
        char how[64];
        snprintf(how, sizeof(how), "encoded by a child process in %.1f ms",
                 (double)(ida__node_mono_us() - t0) / 1000.0);
        copy_made(b, data, len, 1, index, at_term, how);
    }
    if (b->n_waiting > 0) {
        start_copy(b, f, term); /* for calls whose ReadIndex came later */
    }
}

void ida__backups_leadership_lost(struct ida__backups *b)
{
    ida_bgsnap_cancel(&b->child);
    for (size_t i = 0; i < b->n_waiting; i++) {
        reply_error(b, b->waiting[i].conn, b->waiting[i].call.seq,
                    IDA_ELEADERLOST, NULL);
    }
    b->n_waiting = 0;
    for (size_t i = 0; i < IDA_BACKUP_COPIES; i++) {
        copy_drop(&b->copies[i]);
    }
}

int ida__backups_busy(const struct ida__backups *b)
{
    return ida_bgsnap_running(&b->child);
}

void ida__backups_close(struct ida__backups *b)
{
    ida_bgsnap_cancel(&b->child);
    for (size_t i = 0; i < IDA_BACKUP_COPIES; i++) {
        copy_drop(&b->copies[i]);
    }
    b->n_waiting = 0;
}
