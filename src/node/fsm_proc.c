/* The fsm processor: applies committed entries to the allocator state
 * machine, answers the clients waiting for them, serves reads once their
 * ReadIndex is applied, and snapshots every snapshot_interval_entries.
 * See node.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc.h"
#include "idalloc_errors.h"
#include "src/client/client.h"
#include "src/node/convert.h"
#include "src/node/node.h"

/* The client library states the cluster's reserve limit to its users. */
_Static_assert(IDALLOC_RESERVE_COUNT_MAX == IDA_RESERVE_COUNT_MAX,
               "include/idalloc.h and fsm/fsm.h disagree on the reserve limit");
/* The library refuses the names and tags the cluster would. */
_Static_assert(IDA_CLIENT_POOL_NAME_MAX == IDA_POOL_NAME_MAX &&
                   IDA_CLIENT_TAG_BYTES_MAX == IDA_TAG_BYTES_MAX,
               "src/client/client.h and fsm/fsm.h disagree on name limits");

#define PENDING_BUCKETS 4096

/* A write this node proposed, waiting for its entry to apply. */
struct pending
{
    uint8_t client_id[16];
    uint64_t seq;
    uint64_t conn;
    struct pending *next;
};

struct fsm_proc
{
    struct ida_node *node;
    struct ida_fsm *fsm;
    ida_term applied_term;
    ida_index snapshot_index;
    struct pending *buckets[PENDING_BUCKETS];
    size_t n_pending;
    struct ida_nm_read **reads; /* FIFO; indexes never decrease */
    size_t n_reads, cap_reads;
    struct node_outq q;
};

static size_t bucket_of(const uint8_t *cid, uint64_t seq)
{
    uint64_t h = seq * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 16; i++) {
        h = (h ^ cid[i]) * 0x100000001b3ull;
    }
    return (size_t)(h % PENDING_BUCKETS);
}

static void add_pending(struct fsm_proc *fp, const struct ida_nm_register *r)
{
    size_t b = bucket_of(r->client_id, r->request_seq);
    for (struct pending *p = fp->buckets[b]; p != NULL; p = p->next) {
        if (p->seq == r->request_seq &&
            memcmp(p->client_id, r->client_id, 16) == 0) {
            p->conn = r->conn; /* a retry on this node: answer the latest */
            return;
        }
    }
    struct pending *p = ida_malloc(sizeof(*p));
    if (p == NULL) {
        return; /* the client will time out and retry */
    }
    memcpy(p->client_id, r->client_id, 16);
    p->seq = r->request_seq;
    p->conn = r->conn;
    p->next = fp->buckets[b];
    fp->buckets[b] = p;
    fp->n_pending++;
}

/* Remove and return the connection waiting for (@cid, @seq), or 0. */
static uint64_t take_pending(struct fsm_proc *fp,
                             const uint8_t *cid,
                             uint64_t seq)
{
    struct pending **pp = &fp->buckets[bucket_of(cid, seq)];
    for (; *pp != NULL; pp = &(*pp)->next) {
        struct pending *p = *pp;
        if (p->seq == seq && memcmp(p->client_id, cid, 16) == 0) {
            uint64_t conn = p->conn;
            *pp = p->next;
            ida_free(p);
            fp->n_pending--;
            return conn;
        }
    }
    return 0;
}

static void reply_error(struct fsm_proc *fp,
                        uint64_t conn,
                        uint64_t seq,
                        int err)
{
    ida__node_reply_error(fp->node, conn, seq, err, NULL, 0);
}

static void lose_all_pending(struct fsm_proc *fp)
{
    for (size_t b = 0; b < PENDING_BUCKETS; b++) {
        while (fp->buckets[b] != NULL) {
            struct pending *p = fp->buckets[b];
            fp->buckets[b] = p->next;
            reply_error(fp, p->conn, p->seq, IDA_ELEADERLOST);
            ida_free(p);
        }
    }
    fp->n_pending = 0;
}

/* --- reads ------------------------------------------------------------------
 */

static void serve_read(struct fsm_proc *fp, struct ida_nm_read *rd)
{
    const Idalloc__ClientRequest *q = rd->req;
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    Idalloc__LookupResult lr = IDALLOC__LOOKUP_RESULT__INIT;
    Idalloc__ListResult li = IDALLOC__LIST_RESULT__INIT;
    struct ida_fsm_holding h[IDA_LIST_LIMIT_MAX];
    Idalloc__Holding hp[IDA_LIST_LIMIT_MAX];
    Idalloc__Holding *hpp[IDA_LIST_LIMIT_MAX];
    int rv;
    char pool[IDA_POOL_NAME_MAX + 1], tag[IDA_TAG_BYTES_MAX + 1];
    const char *why = NULL;
    if (q->op_case == IDALLOC__CLIENT_REQUEST__OP_LOOKUP) {
        rv = ida_fsm_pool_name_get(&q->lookup->pool, pool, &why);
        rv = rv != 0 ? rv : ida_fsm_tag_get(&q->lookup->tag, tag, &why);
        rv = rv != 0 ? rv : ida_fsm_lookup(fp->fsm, pool, tag, &lr.id);
        res.result_case = IDALLOC__COMMAND_RESULT__RESULT_LOOKUP;
        res.lookup = &lr;
    } else {
        size_t count = 0;
        bool more = false;
        rv = ida_fsm_pool_name_get(&q->list->pool, pool, &why);
        rv = rv != 0 ? rv
                     : ida_fsm_list(fp->fsm, pool, q->list->has_after,
                                    q->list->after_id, q->list->limit, h,
                                    &count, &more);
        for (size_t i = 0; rv == 0 && i < count; i++) {
            idalloc__holding__init(&hp[i]);
            hp[i].id = h[i].id;
            hp[i].tag = (char *)h[i].tag;
            hpp[i] = &hp[i];
        }
        li.holdings = hpp;
        li.n_holdings = rv == 0 ? count : 0;
        li.more = more;
        res.result_case = IDALLOC__COMMAND_RESULT__RESULT_LIST;
        res.list = &li;
    }
    if (rv != 0) {
        res.result_case = IDALLOC__COMMAND_RESULT__RESULT__NOT_SET;
        res.error = (uint32_t)rv;
        /* Like the writes' answers, say what kind the read needs. */
        res.error_msg =
            (char *)(why != NULL && why[0] != '\0' ? why
                     : rv == IDA_EKIND ? "operation needs a bounded pool"
                                       : idalloc_strerror(rv));
    }
    if (ida_log_get_level() == IDA_LOG_DEBUG) {
        char name[IDA_NODE_REQ_NAME_MAX];
        ida__node_req_name(q->client_id.data, q->client_id.len, q->request_seq,
                           name);
        IDA_DEBUG("req %s: read served at index %llu, answered %s", name,
                  (unsigned long long)rd->index,
                  rv != 0 ? idalloc_errname(rv) : "ok");
    }
    ida__node_reply_result(fp->node, rd->conn, q->request_seq, &res, 0);
}

static void free_read(struct ida_nm_read *rd)
{
    idalloc__client_request__free_unpacked(rd->req, NULL);
    ida_free(rd);
}

static void serve_ready_reads(struct fsm_proc *fp)
{
    ida_index applied = ida_fsm_applied_index(fp->fsm);
    size_t k = 0;
    while (k < fp->n_reads && fp->reads[k]->index <= applied) {
        serve_read(fp, fp->reads[k]);
        free_read(fp->reads[k]);
        k++;
    }
    if (k > 0) {
        memmove(fp->reads, fp->reads + k,
                (fp->n_reads - k) * sizeof(*fp->reads));
        fp->n_reads -= k;
    }
}

static void on_read(struct fsm_proc *fp, struct ida_nm_read *rd)
{
    if (rd->index <= ida_fsm_applied_index(fp->fsm) && fp->n_reads == 0) {
        serve_read(fp, rd);
        free_read(rd);
        return;
    }
    if (fp->n_reads == fp->cap_reads) {
        size_t cap = fp->cap_reads == 0 ? 64 : fp->cap_reads * 2;
        struct ida_nm_read **v = ida_realloc(fp->reads, cap * sizeof(*v));
        if (v == NULL) {
            reply_error(fp, rd->conn, rd->req->request_seq, IDA_EBUSY);
            free_read(rd);
            return;
        }
        fp->reads = v;
        fp->cap_reads = cap;
    }
    fp->reads[fp->n_reads++] = rd;
}

/* --- apply ------------------------------------------------------------------
 */

static void maybe_snapshot(struct fsm_proc *fp, struct ida_sender *s)
{
    struct ida_node *n = fp->node;
    ida_index applied = ida_fsm_applied_index(fp->fsm);
    if (applied - fp->snapshot_index < n->cfg.snapshot_interval_entries) {
        return;
    }
    uint8_t *data;
    size_t len;
    if (ida_fsm_snapshot(fp->fsm, &data, &len) != 0) {
        IDA_WARN("fsm: no memory for a snapshot at %llu; will retry",
                 (unsigned long long)applied);
        return;
    }
    /* One buffer: raft compacts with it, then hands it on to storage. */
    struct ida_nm_snapshot *sn = ida_malloc(sizeof(*sn));
    if (sn == NULL) {
        ida_free(data);
        return;
    }
    *sn =
        (struct ida_nm_snapshot){applied, fp->applied_term, data, len, NULL, 0};
    node_post(&fp->q, s, n->p_raft, IDA_NM_SNAPSHOT_TAKEN, sn);
    fp->snapshot_index = applied;
    IDA_INFO("fsm: snapshot at index %llu (%zu bytes)",
             (unsigned long long)applied, len);
}

static void answer(struct fsm_proc *fp,
                   struct ida_sender *s,
                   const struct ida_fsm_applied *ap)
{
    for (size_t i = 0; i < ap->count; i++) {
        const struct ida_fsm_reply *r = &ap->replies[i];
        uint64_t conn = take_pending(fp, r->client_id, r->request_seq);
        if (conn == 0) {
            continue; /* another node's client, or nobody waits any more */
        }
        if (r->result.error != 0) {
            /* What clients were refused shows in `status --verbose`. */
            ida_sender_error(s, r->result.error,
                             r->result.error_msg[0] != '\0'
                                 ? r->result.error_msg
                                 : idalloc_strerror(r->result.error));
        }
        if (ida_log_get_level() == IDA_LOG_DEBUG) {
            char name[IDA_NODE_REQ_NAME_MAX];
            ida__node_req_name(r->client_id, sizeof(r->client_id),
                               r->request_seq, name);
            IDA_DEBUG(
                "req %s: applied at entry %llu, answered %s%s", name,
                (unsigned long long)ap->index,
                r->result.error != 0 ? idalloc_errname(r->result.error) : "ok",
                r->cached ? " (a retry: its first answer)" : "");
        }
        struct ida_fsm_result_pb pb;
        ida_fsm_result_to_pb(&r->result, &pb);
        ida__node_reply_result(fp->node, conn, r->request_seq, &pb.msg, 0);
    }
}

static void apply_entries(struct fsm_proc *fp,
                          struct ida_sender *s,
                          const struct ida_nm_apply *a)
{
    if (a->has_snapshot) {
        int rv = ida_fsm_restore(fp->fsm, a->snap_data, a->snap_len);
        if (rv != 0) {
            IDA_ERROR("fsm: cannot restore the snapshot at %llu: %s; exiting",
                      (unsigned long long)a->snap_index, idalloc_strerror(rv));
            exit(1); /* a restart rebuilds from durable storage */
        }
        fp->applied_term = a->snap_term;
        fp->snapshot_index = a->snap_index;
        IDA_INFO("fsm: installed snapshot at index %llu",
                 (unsigned long long)a->snap_index);
    }
    for (size_t i = 0; i < a->n_entries; i++) {
        const struct ida_entry *e = &a->entries[i];
        if (e->index <= ida_fsm_applied_index(fp->fsm)) {
            continue; /* covered by a snapshot restored meanwhile */
        }
        struct ida_fsm_applied ap;
        int rv =
            ida_fsm_apply(fp->fsm, e->index, e->type, e->data, e->len, &ap);
        IDA_OOM_CHECK(rv != IDA_ENOMEM, "fsm: applying a committed entry");
        if (rv != 0) {
            /* The state may no longer match the other replicas': stop; a
             * restart rebuilds it from the snapshot and the log. */
            IDA_ERROR("fsm: applying entry %llu failed: %s; exiting",
                      (unsigned long long)e->index, idalloc_strerror(rv));
            exit(1);
        }
        if (ap.entry_error != 0) {
            ida_sender_error(s, ap.entry_error,
                             "a malformed log entry was applied as a no-op");
            IDA_ERROR("fsm: entry %llu is malformed (%s); applied as a no-op",
                      (unsigned long long)e->index,
                      idalloc_strerror(ap.entry_error));
        }
        fp->applied_term = e->term;
        answer(fp, s, &ap);
    }
}

static void on_apply(struct fsm_proc *fp,
                     struct ida_sender *s,
                     const struct ida_nm_apply *a)
{
    apply_entries(fp, s, a);
    serve_ready_reads(fp);
    maybe_snapshot(fp, s);
    struct ida_nm_applied *done = ida_malloc(sizeof(*done));
    if (done != NULL) {
        done->index = ida_fsm_applied_index(fp->fsm);
        done->snapshot_index = fp->snapshot_index;
        node_post(&fp->q, s, fp->node->p_raft, IDA_NM_APPLIED, done);
    }
}

static void fsm_receive(void *state, struct ida_msg *msg, struct ida_sender *s)
{
    struct fsm_proc *fp = state;
    void *p = node_msg_payload(msg);
    node_outq_flush(&fp->q, s);
    switch ((enum node_msg_type)msg->type) {
        case IDA_NM_APPLY:
            on_apply(fp, s, p);
            break;
        case IDA_NM_READ:
            on_read(fp, p);
            ida_msg_free(msg);
            return;
        case IDA_NM_REGISTER:
            add_pending(fp, p);
            break;
        case IDA_NM_LEADERSHIP_LOST:
            lose_all_pending(fp);
            break;
        default:
            break;
    }
    node_msg_free(msg);
}

static void fsm_ping(void *state, struct ida_sender *s)
{
    struct fsm_proc *fp = state;
    node_outq_flush(&fp->q, s);
}

const struct ida_proc_ops ida__fsm_proc_ops = {fsm_receive, fsm_ping};

int ida__fsm_proc_new(struct ida_node *n,
                      struct ida_fsm *fsm,
                      ida_term applied_term,
                      struct fsm_proc **out)
{
    struct fsm_proc *fp = ida_calloc(1, sizeof(*fp));
    if (fp == NULL) {
        return IDA_ENOMEM;
    }
    fp->node = n;
    fp->fsm = fsm;
    fp->applied_term = applied_term;
    fp->snapshot_index = ida_fsm_applied_index(fsm);
    *out = fp;
    return 0;
}

void ida__fsm_proc_free(struct fsm_proc *fp)
{
    if (fp == NULL) {
        return;
    }
    for (size_t b = 0; b < PENDING_BUCKETS; b++) {
        while (fp->buckets[b] != NULL) {
            struct pending *p = fp->buckets[b];
            fp->buckets[b] = p->next;
            ida_free(p);
        }
    }
    for (size_t i = 0; i < fp->n_reads; i++) {
        free_read(fp->reads[i]);
    }
    ida_free(fp->reads);
    node_outq_close(&fp->q);
    ida_fsm_free(fp->fsm);
    ida_free(fp);
}
