/* The fsm processor: applies committed entries to the allocator state
 * machine, answers the clients waiting for them, serves reads once their
 * ReadIndex is applied, and snapshots when src/node/snap_policy.h says
 * (amortized: the log since the last snapshot at least as large as it, and
 * at least snapshot_interval_entries entries plus a per-node random extra).
 * See node.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/collapse.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc.h"
#include "idalloc_errors.h"
#include "src/client/client.h"
#include "src/node/backup_copy.h"
#include "src/node/bgsnap.h"
#include "src/node/convert.h"
#include "src/node/lend.h"
#include "src/node/node.h"
#include "src/node/snap_policy.h"

/* The client library states the cluster's reserve limit to its users. */
_Static_assert(IDALLOC_RESERVE_COUNT_MAX == IDA_RESERVE_COUNT_MAX,
               "include/idalloc.h and fsm/fsm.h disagree on the reserve limit");
/* The library refuses the names and tags the cluster would. */
_Static_assert(IDA_CLIENT_POOL_NAME_MAX == IDA_POOL_NAME_MAX &&
                   IDA_CLIENT_TAG_BYTES_MAX == IDA_TAG_BYTES_MAX,
               "src/client/client.h and fsm/fsm.h disagree on name limits");

#define PENDING_BUCKETS 4096
/* Bytes of a background snapshot read per step of the fsm processor. */
#define BGSNAP_STEP_BYTES (1u << 20)
/* Slices of it on their way to storage at most (node.h, enc_slices). */
#define IDA_ENC_SLICES_MAX 4

/* A run of entries applied at once that the log tells of (a restart's
 * replay, a catch-up's; under load a step applies tens). */
#define REPLAY_LOGGED_ENTRIES 1000

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
    struct ida_snap_policy snap;
    struct ida_bgsnap bg; /* a snapshot being encoded by a child process */
    int bg_failed;        /* the last child failed: the next one in line */
    /* Its bytes on their way to storage, sent a BGSNAP_STEP_BYTES slice at
     * a time (one write transaction each). */
    uint8_t *enc_buf;
    size_t enc_len;
    uint64_t enc_off; /* offset of enc_buf[0] in the snapshot */
    struct pending *buckets[PENDING_BUCKETS];
    size_t n_pending;
    struct ida_nm_read **reads; /* FIFO; indexes never decrease */
    size_t n_reads, cap_reads;
    /* The copies of the state backups read (SnapshotRead). */
    struct ida__backups backups;
    /* A restart's snapshot, rebuilt before anything else (node.h). */
    struct ida__rebuild *rebuild; /* the state being rebuilt at start */
    size_t rebuild_len;
    uint64_t pools_published_us; /* metrics: the last pool table */
    int pools_dirty;             /* applied since it was published */
    /* Decodes the next entries while a long run of them (a restart's
     * replay, a catch-up) is applied (ida_fsm_apply_entries()). */
    struct ida__lend lend;
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
    if (rd->req->op_case == IDALLOC__CLIENT_REQUEST__OP_SNAPSHOT_READ) {
        ida__backups_read(&fp->backups, fp->fsm, fp->applied_term, rd);
        return;
    }
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

/* A snapshot of the state at @index, @len bytes, was taken. */
static void snapshot_noted(struct fsm_proc *fp,
                           ida_index index,
                           size_t len,
                           uint64_t took_us,
                           const char *how)
{
    ida_metrics_snapshot(fp->node->metrics, len, took_us);
    fp->snapshot_index = index;
    fp->snap.last_bytes = len;
    ida_snap_policy_encoded(&fp->snap, took_us / 1000);
    IDA_INFO("fsm: snapshot at index %llu (%zu bytes, %s, %.1f ms)",
             (unsigned long long)index, len, how, (double)took_us / 1000.0);
}

/* Hand a snapshot encoded in line to raft (which adds the membership at the
 * index and passes it on to storage). Takes @data. */
static void snapshot_taken(struct fsm_proc *fp,
                           struct ida_sender *s,
                           ida_index index,
                           ida_term term,
                           uint8_t *data,
                           size_t len,
                           uint64_t took_us)
{
    struct ida_node *n = fp->node;
    struct ida_nm_snapshot *sn = ida_malloc(sizeof(*sn));
    if (sn == NULL) {
        ida_free(data);
        return;
    }
    *sn = (struct ida_nm_snapshot){index, term, data, len, NULL, 0};
    node_post(&fp->q, s, n->p_raft, IDA_NM_SNAPSHOT_TAKEN, sn);
    snapshot_noted(fp, index, len, took_us, "in line");
}

/* Forget the stream in progress (its slice, its offset). */
static void enc_reset(struct fsm_proc *fp)
{
    ida_free(fp->enc_buf);
    fp->enc_buf = NULL;
    fp->enc_len = 0;
    fp->enc_off = 0;
}

/* Send the slice gathered so far to storage (@end: see ida_nm_snap_enc).
 * Without memory for the message the stream is broken: storage drops it
 * at the next slice, or when the next one starts. */
static void enc_send(struct fsm_proc *fp,
                     struct ida_sender *s,
                     ida_index index,
                     ida_term term,
                     uint64_t total,
                     int end)
{
    struct ida_node *n = fp->node;
    struct ida_nm_snap_enc *e = ida_malloc(sizeof(*e));
    if (e == NULL) {
        enc_reset(fp);
        return;
    }
    *e = (struct ida_nm_snap_enc){index,       term,        total, fp->enc_off,
                                  fp->enc_buf, fp->enc_len, end};
    fp->enc_buf = NULL;
    fp->enc_off += fp->enc_len;
    fp->enc_len = 0;
    atomic_fetch_add(&n->enc_slices, 1);
    if (node_post(&fp->q, s, n->p_storage, IDA_NM_SNAPSHOT_ENC, e) != 0) {
        atomic_fetch_sub(&n->enc_slices, 1); /* freed, never to arrive */
    }
}

/* Stop the background snapshot, if any (storage drops what it got of it
 * when the next one starts or a snapshot is installed). */
static void bg_cancel(struct fsm_proc *fp)
{
    ida_bgsnap_cancel(&fp->bg);
    enc_reset(fp);
}

/* Pass on what the background encoder wrote since the last look: storage
 * stores it as it comes (IDA_NM_SNAPSHOT_ENC), so the encoded state is never
 * whole in this process. */
static void poll_bgsnap(struct fsm_proc *fp, struct ida_sender *s)
{
    if (!ida_bgsnap_running(&fp->bg) ||
        atomic_load(&fp->node->enc_slices) >= IDA_ENC_SLICES_MAX) {
        return; /* (the child waits on its pipe meanwhile) */
    }
    if (fp->enc_buf == NULL) {
        fp->enc_buf = ida_malloc(BGSNAP_STEP_BYTES);
        if (fp->enc_buf == NULL) {
            return; /* the child waits on its pipe meanwhile */
        }
    }
    ida_index index = fp->bg.index;
    ida_term term = fp->bg.term;
    uint64_t t0 = fp->bg.started_us;
    uint64_t fork_us = fp->bg.fork_us;
    struct ida_bgsnap_slice sl;
    int rv = ida_bgsnap_read(&fp->bg, fp->enc_buf + fp->enc_len,
                             BGSNAP_STEP_BYTES - fp->enc_len, &sl);
    if (rv < 0) {
        /* Storage drops what came (end -1): no snapshot from it. */
        fp->enc_len = 0;
        enc_send(fp, s, index, term, sl.total, -1);
        enc_reset(fp);
        IDA_WARN(
            "fsm: the snapshot child for index %llu failed (%s); the "
            "next one is taken in line",
            (unsigned long long)index, idalloc_strerror(-rv));
        fp->bg_failed = 1;
        return;
    }
    fp->enc_len += sl.len;
    if (rv == 0 && fp->enc_len < BGSNAP_STEP_BYTES) {
        return; /* a slice is sent when full or at the end */
    }
    enc_send(fp, s, index, term, sl.total, rv == 1);
    if (rv == 1) {
        enc_reset(fp);
        char how[80];
        snprintf(how, sizeof(how),
                 "encoded by a child process, whose fork() held this "
                 "processor %.1f ms",
                 (double)fork_us / 1000.0);
        snapshot_noted(fp, index, sl.total, ida__node_mono_us() - t0, how);
    }
}

/* The snapshot due now, unless a peer's or a backup's goes first. */
static void take_snapshot(struct fsm_proc *fp,
                          struct ida_sender *s,
                          ida_index applied)
{
    /* A peer's child encodes, or a backup's here: theirs first (two
     * children here double the memory their encodings take), after a
     * random pause, but not past the cap (snap_policy.h, TURNS): a stream
     * of backups cannot put a snapshot off for good, at the price of two
     * children at once after the cap. A leader waits the same way for a
     * follower catching up (CATCH-UP): the snapshot would drop log it
     * needs. */
    uint64_t waited_ms;
    if (ida_snap_policy_wait(&fp->snap,
                             atomic_load(&fp->node->peers_snap_any) ||
                                 ida__backups_busy(&fp->backups) ||
                                 atomic_load(&fp->node->follower_behind),
                             ida__node_mono_ms(), &waited_ms)) {
        return;
    }
    if (waited_ms > 0) {
        IDA_INFO(
            "fsm: the snapshot due at index %llu waited %.1f s for a "
            "peer's, a backup's or a follower catching up (at most %.1f s)",
            (unsigned long long)applied, (double)waited_ms / 1000.0,
            (double)ida_snap_policy_wait_cap_ms(&fp->snap) / 1000.0);
    }
    /* The log since now counts toward the next one; the size of the last
     * stays until this one's is known. */
    ida_snap_policy_taken(&fp->snap, fp->snap.last_bytes);
    enc_reset(fp); /* a new stream starts at offset 0 */
    if (!fp->bg_failed &&
        ida_bgsnap_start(&fp->bg, fp->fsm, applied, fp->applied_term) == 0) {
        return;
    }
    fp->bg_failed = 0; /* try the child again next time */
    uint8_t *data;
    size_t len;
    uint64_t t0 = ida__node_mono_us();
    if (ida_fsm_snapshot(fp->fsm, &data, &len) != 0) {
        IDA_WARN("fsm: no memory for a snapshot at %llu; will retry",
                 (unsigned long long)applied);
        return;
    }
    snapshot_taken(fp, s, applied, fp->applied_term, data, len,
                   ida__node_mono_us() - t0);
}

static void maybe_snapshot(struct fsm_proc *fp, struct ida_sender *s)
{
    ida_index applied = ida_fsm_applied_index(fp->fsm);
    if (ida_bgsnap_running(&fp->bg) || !ida_snap_policy_due(&fp->snap)) {
        return;
    }
    /* A fork() would wait for a collapse under way: the next batch forks
     * instead (base/collapse.h, FORK). */
    if (!ida_collapse_pause()) {
        return;
    }
    take_snapshot(fp, s, applied);
    ida_collapse_resume();
}

static void answer(struct fsm_proc *fp,
                   struct ida_sender *s,
                   const struct ida_fsm_applied *ap)
{
    /* A follower's, and a replay's: nobody to look up (each lookup hashes
     * the client id, a tenth of applying an alloc). */
    for (size_t i = 0; i < ap->count && fp->n_pending > 0; i++) {
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

/* Install the snapshot of @a (durable by now): swap in the state machine
 * the raft processor's check restored from it (taken from @a), or restore
 * its bytes when the check kept none. */
static void install_snapshot(struct fsm_proc *fp, struct ida_nm_apply *a)
{
    /* The installed state replaces the one a child may be encoding. */
    bg_cancel(fp);
    uint64_t t0 = ida__node_mono_us();
    int rv = 0;
    const char *how = "the state checked when it arrived";
    if (a->fsm != NULL) {
        /* ida__rp_snapshot_check() (raft_snap.c) refuses a state of another
         * index. */
        IDA_ASSERT(ida_fsm_applied_index(a->fsm) == a->snap_index);
        ida_fsm_replace(fp->fsm, a->fsm);
        a->fsm = NULL;
    } else {
        how = "restored from its bytes";
        rv = ida__restore_lent(fp->fsm, a->snap_data, a->snap_len);
    }
    uint64_t took_us = ida__node_mono_us() - t0;
    ida_metrics_snapshot_installed(fp->node->metrics, took_us);
    if (rv != 0) {
        IDA_ERROR("fsm: cannot restore the snapshot at %llu: %s; exiting",
                  (unsigned long long)a->snap_index, idalloc_strerror(rv));
        exit(1); /* a restart rebuilds from durable storage */
    }
    fp->applied_term = a->snap_term;
    fp->snapshot_index = a->snap_index;
    ida_snap_policy_taken(&fp->snap, a->snap_len);
    ida_collapse_sweep_soon(); /* before the next fork (base/collapse.h) */
    IDA_INFO("fsm: installed snapshot at index %llu (%zu bytes, %s, %.1f ms)",
             (unsigned long long)a->snap_index, a->snap_len, how,
             (double)took_us / 1000.0);
}

/* The restart's rebuild, once, before the first message or ping. */
static void finish_restore(struct fsm_proc *fp)
{
    if (fp->rebuild == NULL) {
        return;
    }
    uint64_t t0 = ida__node_mono_us(), took_us;
    /* Start-up, not housekeeping: the node serves nothing before. */
    fp->node->timed[IDA_MPROC_FSM].what = "the restart's rebuild of the state";
    struct ida_fsm *f;
    int rv = ida__rebuild_finish(fp->rebuild, &f, &took_us);
    fp->rebuild = NULL;
    if (rv == 0 && ida_fsm_applied_index(f) != fp->snapshot_index) {
        rv = IDA_ECORRUPT; /* a state of another index than storage says */
        ida_fsm_free(f);
    }
    if (rv != 0) {
        IDA_ERROR(
            "fsm: cannot rebuild the state from the snapshot at %llu in "
            "%s: %s; exiting",
            (unsigned long long)fp->snapshot_index, fp->node->dir,
            idalloc_strerror(rv));
        exit(1); /* nothing was answered from it */
    }
    ida_fsm_replace(fp->fsm, f);
    ida_collapse_sweep_soon(); /* before the next fork (base/collapse.h) */
    IDA_INFO(
        "fsm: state rebuilt from the snapshot at index %llu (%zu bytes) "
        "in %llu ms (the processor waited %llu ms for it)",
        (unsigned long long)fp->snapshot_index, fp->rebuild_len,
        (unsigned long long)took_us / 1000,
        (unsigned long long)(ida__node_mono_us() - t0) / 1000);
}

struct applying
{
    struct fsm_proc *fp;
    struct ida_sender *s;
};

/* After each entry of apply_entries(). */
static void entry_applied(void *ctx,
                          const struct ida_entry *e,
                          const struct ida_fsm_applied *ap)
{
    struct applying *a = ctx;
    struct fsm_proc *fp = a->fp;
    if (ap->entry_error != 0) {
        ida_sender_error(a->s, ap->entry_error,
                         "a malformed log entry was applied as a no-op");
        IDA_ERROR("fsm: entry %llu is malformed (%s); applied as a no-op",
                  (unsigned long long)e->index,
                  idalloc_strerror(ap->entry_error));
    }
    fp->applied_term = e->term;
    ida_snap_policy_applied(&fp->snap, e->len);
    answer(fp, a->s, ap);
}

static void apply_entries(struct fsm_proc *fp,
                          struct ida_sender *s,
                          struct ida_nm_apply *a)
{
    if (a->has_snapshot) {
        install_snapshot(fp, a);
    }
    /* Those a snapshot restored meanwhile covers are skipped. */
    size_t from = 0;
    while (from < a->n_entries &&
           a->entries[from].index <= ida_fsm_applied_index(fp->fsm)) {
        from++;
    }
    if (from == a->n_entries) {
        return; /* (a->entries may be NULL) */
    }
    struct applying ctx = {fp, s};
    size_t done;
    uint64_t t0 = ida__node_mono_us();
    int rv =
        ida_fsm_apply_entries(fp->fsm, a->entries + from, a->n_entries - from,
                              &fp->lend.helper, entry_applied, &ctx, &done);
    if (done >= REPLAY_LOGGED_ENTRIES) {
        IDA_INFO("fsm: applied entries %llu..%llu in %llu ms",
                 (unsigned long long)a->entries[from].index,
                 (unsigned long long)a->entries[from + done - 1].index,
                 (unsigned long long)(ida__node_mono_us() - t0) / 1000);
    }
    IDA_OOM_CHECK(rv != IDA_ENOMEM, "fsm: applying a committed entry");
    if (rv != 0) {
        /* The state may no longer match the other replicas': stop; a
         * restart rebuilds it from the snapshot and the log. */
        IDA_ERROR("fsm: applying entry %llu failed: %s; exiting",
                  (unsigned long long)a->entries[from + done].index,
                  idalloc_strerror(rv));
        exit(1);
    }
}

/* The pool table of /metrics, at most once a second (it walks every pool). */
static void publish_pools(struct fsm_proc *fp)
{
    uint64_t now = ida__node_mono_us();
    if (fp->node->metrics == NULL || !fp->pools_dirty ||
        now - fp->pools_published_us < 1000000) {
        return;
    }
    fp->pools_published_us = now;
    fp->pools_dirty = 0;
    size_t n = ida_fsm_pool_count(fp->fsm);
    size_t cap = 512 + n * 512, len = 0;
    char *buf = ida_malloc(cap);
    if (buf == NULL) {
        return;
    }
    static const char *const kinds[] = {"", "sequence", "bounded", "prefix"};
    /* One series per row: which pool kinds it has (bit 1 << kind) and
     * which value (used, size, or 1 with the kind as a label). */
    enum {
        SEQ = 1u << IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE,
        BND = 1u << IDALLOC__POOL_KIND__POOL_KIND_BOUNDED,
        PFX = 1u << IDALLOC__POOL_KIND__POOL_KIND_PREFIX
    };
    enum { V_INFO, V_USED, V_SIZE };
    static const struct
    {
        const char *name, *help;
        unsigned kinds;
        int value;
    } series[] = {
        {"idalloc_pool_info", "A pool and its kind (always 1).",
         SEQ | BND | PFX, V_INFO},
        {"idalloc_pool_held_ids",
         "Ids held in a bounded pool, tags held in a prefix pool.", BND | PFX,
         V_USED},
        {"idalloc_pool_size_ids", "Size of a bounded pool.", BND, V_SIZE},
        {"idalloc_sequence_next", "The next id a sequence pool hands out.", SEQ,
         V_USED},
    };
    for (size_t k = 0; k < sizeof(series) / sizeof(series[0]); k++) {
        len += (size_t)snprintf(buf + len, cap - len,
                                "# HELP %s %s\n# TYPE %s gauge\n",
                                series[k].name, series[k].help, series[k].name);
        for (size_t i = 0; i < n; i++) {
            struct ida_fsm_pool_info pi;
            ida_fsm_pool_info(fp->fsm, i, &pi);
            if ((series[k].kinds & (1u << pi.kind)) == 0) {
                continue;
            }
            if (series[k].value == V_INFO) {
                len += (size_t)snprintf(
                    buf + len, cap - len, "%s{pool=\"%s\",kind=\"%s\"} 1\n",
                    series[k].name, pi.name, kinds[pi.kind]);
            } else {
                len += (size_t)snprintf(
                    buf + len, cap - len, "%s{pool=\"%s\"} %llu\n",
                    series[k].name, pi.name,
                    (unsigned long long)(series[k].value == V_SIZE ? pi.size
                                                                   : pi.used));
            }
        }
    }
    ida_metrics_pools(fp->node->metrics, buf, len,
                      ida_fsm_session_count(fp->fsm));
    ida_free(buf);
}

/* Tell peers whether a child of this node encodes (snap_policy.h, TURNS). */
static void publish_child(struct fsm_proc *fp)
{
    atomic_store(&fp->node->snap_child, ida_bgsnap_running(&fp->bg) ||
                                            ida__backups_busy(&fp->backups));
}

static void on_apply(struct fsm_proc *fp,
                     struct ida_sender *s,
                     struct ida_nm_apply *a)
{
    apply_entries(fp, s, a);
    ida_metrics_applied(fp->node->metrics, ida_fsm_applied_index(fp->fsm));
    fp->pools_dirty = 1;
    publish_pools(fp);
    serve_ready_reads(fp);
    poll_bgsnap(fp, s);
    ida__backups_poll(&fp->backups, fp->fsm, fp->applied_term);
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
    finish_restore(fp);
    node_outq_flush(&fp->q, s);
    switch ((enum node_msg_type)msg->type) {
        case IDA_NM_APPLY:
            on_apply(fp, s, p);
            break;
        case IDA_NM_READ:
            on_read(fp, p); /* (a backup's read may start a child) */
            ida_msg_free(msg);
            publish_child(fp);
            return;
        case IDA_NM_REGISTER:
            add_pending(fp, p);
            break;
        case IDA_NM_LEADERSHIP_LOST:
            lose_all_pending(fp);
            ida__backups_leadership_lost(&fp->backups);
            break;
        default:
            break;
    }
    node_msg_free(msg);
    publish_child(fp);
}

static void fsm_ping(void *state, struct ida_sender *s)
{
    struct fsm_proc *fp = state;
    finish_restore(fp);
    node_outq_flush(&fp->q, s);
    publish_pools(fp);
    poll_bgsnap(fp, s);
    ida__backups_poll(&fp->backups, fp->fsm, fp->applied_term);
    maybe_snapshot(fp, s); /* (one that waited for a peer's, at idle) */
    publish_child(fp);
}

const struct ida_proc_ops ida__fsm_proc_ops = {fsm_receive, fsm_ping};

int ida__fsm_proc_new(struct ida_node *n,
                      struct ida_fsm *fsm,
                      ida_term applied_term,
                      ida_index snap_index,
                      struct ida__rebuild *rebuild,
                      size_t snap_len,
                      struct fsm_proc **out)
{
    struct fsm_proc *fp = ida_calloc(1, sizeof(*fp));
    if (fp == NULL) {
        ida__rebuild_drop(rebuild);
        return IDA_ENOMEM;
    }
    fp->node = n;
    ida__lend_init(&fp->lend);
    ida__backups_init(&fp->backups, n);
    fp->fsm = fsm;
    fp->applied_term = applied_term;
    fp->rebuild = rebuild;
    fp->rebuild_len = snap_len;
    fp->snapshot_index =
        rebuild != NULL ? snap_index : ida_fsm_applied_index(fsm);
    ida_snap_policy_init(
        &fp->snap, n->cfg.snapshot_interval_entries,
        (uint64_t)n->self->id * 0x9e3779b97f4a7c15ull ^ n->incarnation);
    fp->snap.last_bytes = n->snapshot_bytes0;
    *out = fp;
    return 0;
}

void ida__fsm_proc_free(struct fsm_proc *fp)
{
    if (fp == NULL) {
        return;
    }
    bg_cancel(fp);
    ida__backups_close(&fp->backups);
    ida__rebuild_drop(fp->rebuild);
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
