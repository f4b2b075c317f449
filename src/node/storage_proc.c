/* The storage processor: each raft batch becomes one durable storage step
 * (records of the entry log and one flush; an LMDB commit first when the
 * term or vote changes: storage.h, THE LOG);
 * only then do its deferred messages (votes, append acknowledgements) go
 * out and the core hears "persisted". A failed step turns the node
 * read-only for writes (storage errors are sticky). See node.h.
 *
 * Raft batches that come while others wait share a commit (MERGED): while
 * more messages wait in this processor's inbox, a batch that only goes on
 * from the one before (no snapshot, no truncation of the log) joins its
 * storage batch instead of being committed alone, up to MERGE_MAX batches
 * or MERGE_BYTES of entries; any other message, or none waiting, commits
 * them. Each batch's deferred messages and "persisted" notice still go out
 * in order, and only after the commit that made it durable. A follower
 * behind its leader (32 appends of up to 1 MiB in flight) and a busy one
 * store several appends per commit instead of two device flushes each.
 * Each joining hard state is checked against the one before it as storage
 * would check it alone (may_join()); a commit that fails fails them all,
 * as the first failure would have failed the node anyway.
 *
 * A snapshot this node took is stored in steps of SNAP_STEP_BYTES (one
 * write transaction each), one step after every message and on every ping,
 * so raft batches and their fsync never wait behind a whole large snapshot:
 * an append waits for at most one step. The chunks stay invisible until the
 * last step makes the snapshot current (ida_storage_snapshot_finish) and
 * the log it covers is compacted; until then the log still holds every
 * entry, so a crash in between loses nothing (the next start uses the older
 * snapshot and the longer log). A snapshot installed from the leader is a
 * raft batch and is durable before its acknowledgement; it first drops a
 * local snapshot still being stored (the installed one replaces it), and a
 * newer local snapshot replaces an older one still in progress.
 *
 * This node's own snapshot, encoded by a child process (bgsnap.h), is
 * stored as the fsm processor reads it from the child (IDA_NM_SNAPSHOT_ENC,
 * in order; invisible like the steps above), so the encoded state is never
 * whole in this process's memory (at 10 million allocations, 190 MB more
 * resident while it was stored) and storing overlaps encoding.
 *
 * ENCODED: its bytes ride in raft batches, ENC_RIDE_BYTES for each batch
 * in its transaction (ida_storage_batch_snapshot(); a merged commit carries
 * that much for each of its batches), and only when no batch came for
 * ENC_IDLE_US is a slice written in a transaction of its own. Before, written
 * one 1 MiB slice per commit, each slice held the storage processor 13 to 42 ms
 * under load at 10 M allocations (two fdatasyncs of its own; 100 to 256 ms for
 * some), and the batches queued behind it for the 3 to 6 s of a snapshot: every
 * append waited for a slice. Riding, a batch's commit writes up to a quarter of
 * a slice more, and a batch waits for a commit of the snapshot's only when a
 * slice goes on its own (no batch for ENC_IDLE_US, or ENC_WAIT_MAX slices
 * waiting). Only batches that commit anyway carry bytes. A batch whose commit
 * fails fails the node as before, and drops the snapshot being stored.
 *
 * Once the child finished well and every byte is in,
 * storage tells raft (SNAPSHOT_TAKEN without bytes); raft answers with the
 * membership at the index (SNAPSHOT_STORE without bytes) and the writer is
 * finished with it. A snapshot encoded in line (no child) still comes whole
 * through raft and is stored in steps.
 *
 * A snapshot arriving from the leader is stored as its chunks arrive
 * (IDA_NM_SNAPSHOT_RCV, in order; invisible like a local one's steps), so
 * that storing it overlaps the transfer and the raft processor's check;
 * the batch that installs it then finishes that writer when it holds
 * exactly the batch's bytes (size and CRC-32C) and membership, and
 * otherwise writes the snapshot whole as before. Storage has one writer:
 * a local snapshot encoded in line takes it (the leader's stream is
 * dropped) and a leader's stream does not start while one is being
 * stored; but a leader's stream takes it from a local snapshot streaming
 * in from its encoder (the leader's is newer and replaces this node's
 * state), and this node's own stream does not start while a leader's
 * arrives. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"
#include "src/node/node.h"

#define SNAP_STEP_BYTES (1u << 20)
/* MERGED (at the top): raft batches per commit, and entry bytes. */
#define MERGE_MAX   IDA_STORAGE_BATCH_SPANS_MAX
#define MERGE_BYTES (16u << 20)
/* After a snapshot of this node's is current, what it made garbage goes a
 * step at a time (one write transaction each, between raft batches): the
 * chunks of the snapshot it replaced, then the log it covers. At 10 M
 * allocations, doing both in the finishing commit held the storage
 * processor for tens of milliseconds (13 to 33 ms at 60 MB). */
#define TIDY_BYTES (4u << 20) /* of a replaced snapshot's chunks */
/* Log entries compacted per step. A step is one LMDB commit of log_prev
 * and the release of the segments it frees, whatever its size (storage.h,
 * THE LOG): steps of 1,000 entries cost a commit each when the log was in
 * LMDB and deleting its entries was the work. */
#define TIDY_ENTRIES (1u << 20)
/* Map pages unmapped per ping (every 10 ms): a round of a 1.5 GiB file
 * takes about a second. Under load the node maps pages at up to ~100 MB/s
 * (each read of the map faults in up to 16 cached pages around it); much
 * slower rounds let the resident size climb by hundreds of MB toward the
 * whole data file (storage.h, ida_storage_release_pages()). A call costs
 * what unmapping the pages it finds mapped costs, plus a walk of the page
 * tables over 16 MiB (8 entries of 2 MiB): steps of 32 MiB held the
 * storage processor 13 to 14 ms at times under load at 10 M allocations
 * (twice in 90 s, with every append behind them). */
#define RELEASE_STEP_BYTES (16u << 20)
/* ... and only while the process's file-backed resident pages (the map's,
 * plus ~10 MiB of code) exceed this. Unmapping pages the next write maps
 * again cost about 3% of allocs/s on a small cluster (vs-etcd at 64 and
 * 256 clients, two runs each, within the noise but both ways); below the
 * mark there is no memory worth it, above it a round runs and stops. */
#define RELEASE_ABOVE_BYTES (32u << 20)
/* A step runs at most this often, on a ping or after a message: a storage
 * processor kept busy by messages (a snapshot streaming in, appends under
 * load) gets few pings, and its map pages climbed by hundreds of MB while
 * a snapshot was stored (10 M allocations: RssFile 30 -> 216 MiB over the
 * 4 s of a stream, 531 MiB at its compaction). */
#define RELEASE_EVERY_US 10000
/* This node's own snapshot rides in raft batches (ENCODED below): at most
 * this many of its bytes go in one batch's transaction ... */
#define ENC_RIDE_BYTES (256u << 10)
/* ... and when no batch came for this long, a slice is written in a
 * transaction of its own (nothing waits behind it then). */
#define ENC_IDLE_US 20000
/* The entry log's next segment is made ahead on a thread of its own
 * (storage/seglog.h, THE MAKER; prepare_step() starts it and looks whether
 * it is done); where no thread can be started, this much at a time ... */
#define PREPARE_STEP_BYTES (512u << 10)
/* ... and not for this long after a failure. */
#define PREPARE_REST_US 1000000
/* Slices taken in and not yet written at most (the fsm sends at most
 * IDA_ENC_SLICES_MAX at a time; past this the oldest is written at once). */
#define ENC_WAIT_MAX 8u

/* Bytes of this process's resident file-backed (and shared) pages, from
 * /proc/self/statm; 0 when it cannot be read. */
static uint64_t resident_shared_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0, shared = 0;
    int n = f != NULL ? fscanf(f, "%lu %lu %lu", &size, &resident, &shared) : 0;
    if (f != NULL) {
        fclose(f);
    }
    return n == 3 ? (uint64_t)shared * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

struct storage_proc
{
    struct ida_node *node;
    int failed;
    struct node_outq q;
    /* The local snapshot being stored, if any. */
    struct ida_msg *job_msg; /* IDA_NM_SNAPSHOT_STORE, owned */
    struct ida_snapshot_writer job_w;
    size_t job_off;
    uint64_t job_t0;      /* when it began (ida__node_mono_us), for metrics */
    uint64_t released_us; /* the last look at the resident map pages */
    uint64_t prepare_us;  /* no segment made ahead before this (a failure) */
    ida_index compact_to; /* the log up to here goes in steps (0: none) */
    /* A leader's snapshot stored as it arrives. */
    struct
    {
        int active;
        ida_index index;
        ida_term term;
        uint64_t total, next;
        uint64_t last_us;             /* when its last chunk was written */
        struct ida_snapshot_writer w; /* holds its membership */
    } rcv;
    /* This node's own snapshot stored as it is encoded. */
    struct
    {
        int active;
        int complete; /* all in; raft was told, its membership awaited */
        ida_index index;
        ida_term term;
        uint64_t total, next; /* next: bytes written */
        uint64_t queued;      /* bytes taken in: written or waiting */
        int ended;            /* its last slice was taken in */
        uint64_t t0;
        struct ida_snapshot_writer w;
        /* Slices waiting to be written, oldest first (IDA_NM_SNAPSHOT_ENC,
         * owned), and the bytes of the oldest written. */
        struct ida_msg *wait[ENC_WAIT_MAX];
        unsigned wait_head, wait_count;
        size_t head_off;
        size_t riding; /* bytes of the oldest in the batch being stored */
    } enc;
    uint64_t persist_us; /* when the last raft batch was stored */
    /* Raft batches recorded in one storage batch, not yet committed
     * (MERGED): their IDA_NM_PERSIST messages, owned, oldest first. */
    struct
    {
        struct ida_msg *msg[MERGE_MAX];
        size_t n;
        struct ida_storage_batch b;
        uint64_t bytes;   /* of their entries */
        size_t riders;    /* those writing the log: snapshot bytes ride */
        uint64_t prep_us; /* the first's snapshot install, if any */
        const char *what;
    } mg;
};

/* Free a slice of this node's snapshot: one fewer on its way (node.h). */
static void enc_msg_free(struct storage_proc *sp, struct ida_msg *msg)
{
    node_msg_free(msg);
    atomic_fetch_sub(&sp->node->enc_slices, 1);
}

static struct ida_msg *enc_oldest(const struct storage_proc *sp)
{
    return sp->enc.wait_count > 0 ? sp->enc.wait[sp->enc.wait_head] : NULL;
}

static void enc_pop(struct storage_proc *sp)
{
    enc_msg_free(sp, sp->enc.wait[sp->enc.wait_head]);
    sp->enc.wait_head = (sp->enc.wait_head + 1) % ENC_WAIT_MAX;
    sp->enc.wait_count--;
    sp->enc.head_off = 0;
}

static void enc_drop(struct storage_proc *sp)
{
    while (sp->enc.wait_count > 0) {
        enc_pop(sp);
    }
    sp->enc.riding = 0;
    if (sp->enc.active) {
        ida_storage_snapshot_abort(&sp->node->storage, &sp->enc.w);
        sp->enc.active = 0;
    }
}

static void rcv_drop(struct storage_proc *sp)
{
    if (sp->rcv.active) {
        ida_storage_snapshot_abort(&sp->node->storage, &sp->rcv.w);
        sp->rcv.active = 0;
    }
}

/* Takes nothing: @c's bytes are copied into the writer. */
static void on_snapshot_rcv(struct storage_proc *sp,
                            const struct ida_nm_snap_rcv *c)
{
    struct ida_storage *st = &sp->node->storage;
    if (c->offset == 0) {
        rcv_drop(sp);
        enc_drop(sp); /* the leader's is newer: this node installs it */
        if (sp->failed || sp->job_msg != NULL) {
            return; /* the local snapshot has the writer */
        }
        if (ida_storage_snapshot_begin(st, &sp->rcv.w, c->index, c->term,
                                       c->conf, c->conf_len) != 0) {
            return; /* written whole when it is installed */
        }
        sp->rcv.active = 1;
        sp->rcv.index = c->index;
        sp->rcv.term = c->term;
        sp->rcv.total = c->total;
        sp->rcv.next = 0;
    }
    if (!sp->rcv.active || c->index != sp->rcv.index ||
        c->term != sp->rcv.term || c->offset != sp->rcv.next ||
        c->len > sp->rcv.total - sp->rcv.next) {
        rcv_drop(sp);
        return;
    }
    /* Room for what arrived, not for the size the leader announces. */
    (void)ida_storage_reserve(st, c->len);
    if (ida_storage_snapshot_write(st, &sp->rcv.w, c->data, c->len) != 0) {
        rcv_drop(sp); /* a sticky error shows in the next batch */
        return;
    }
    sp->rcv.next += c->len;
    sp->rcv.last_us = ida__node_mono_us();
}

/* Whether the stream holds exactly the snapshot of @p. */
static int rcv_holds(const struct storage_proc *sp,
                     const struct ida_nm_persist *p)
{
    return sp->rcv.active && sp->rcv.next == sp->rcv.total &&
           ida_storage_snapshot_writer_holds(
               &sp->rcv.w, p->snap_index, p->snap_term, p->snap_conf,
               p->snap_conf_len, p->snap_data, p->snap_len);
}

static void job_drop(struct storage_proc *sp)
{
    if (sp->job_msg != NULL) {
        ida_storage_snapshot_abort(&sp->node->storage, &sp->job_w);
        node_msg_free(sp->job_msg);
        sp->job_msg = NULL;
    }
}

static void report_failure(struct storage_proc *sp,
                           struct ida_sender *s,
                           int code,
                           const char *what)
{
    struct ida_storage *st = &sp->node->storage;
    if (!sp->failed) {
        IDA_ERROR("storage: %s failed: %s (%s)", what, idalloc_strerror(code),
                  st->errmsg);
    }
    sp->failed = 1;
    ida_sender_error(s, code, st->errmsg[0] != '\0' ? st->errmsg : what);
    struct ida_nm_storage_failed *f = ida_calloc(1, sizeof(*f));
    if (f == NULL) {
        return;
    }
    f->code = code;
    snprintf(f->msg, sizeof(f->msg), "%.60s: %.180s", what,
             st->errmsg[0] != '\0' ? st->errmsg : idalloc_strerror(code));
    node_post(&sp->q, s, sp->node->p_raft, IDA_NM_STORAGE_FAILED, f);
}

/* Write a whole snapshot durably (the one it replaces goes in tidy steps,
 * as after one of this node's own). */
static int write_snapshot(struct storage_proc *sp,
                          ida_index index,
                          ida_term term,
                          const uint8_t *data,
                          size_t len,
                          const uint8_t *conf,
                          size_t conf_len)
{
    struct ida_node *n = sp->node;
    struct ida_snapshot_writer w;
    (void)ida_storage_reserve(&n->storage, len); /* else it grows as it goes */
    int rv = ida_storage_snapshot_begin(&n->storage, &w, index, term, conf,
                                        conf_len);
    if (rv != 0) {
        return rv;
    }
    rv = ida_storage_snapshot_write(&n->storage, &w, data, len);
    if (rv != 0) {
        ida_storage_snapshot_abort(&n->storage, &w);
        return rv;
    }
    return ida_storage_snapshot_finish_lazy(&n->storage, &w);
}

static void enc_wrote(struct storage_proc *sp, struct ida_sender *s, size_t k);

/* Put the next bytes of this node's snapshot in batch @b (ENCODED, at the
 * top): ENC_RIDE_BYTES for each of the @riders raft batches it holds that
 * write the log (as many as had they been committed one by one), within
 * the oldest slice. Bytes that cannot ride wait: a failure here drops the
 * snapshot (the log stays until the next one), never the batch. */
static void enc_ride(struct storage_proc *sp,
                     struct ida_storage_batch *b,
                     size_t riders)
{
    struct ida_msg *m = enc_oldest(sp);
    sp->enc.riding = 0;
    if (m == NULL) {
        return;
    }
    const struct ida_nm_snap_enc *c = node_msg_payload(m);
    size_t k = c->len - sp->enc.head_off;
    if (k > ENC_RIDE_BYTES * riders) {
        k = ENC_RIDE_BYTES * riders;
    }
    if (k == 0) {
        return;
    }
    struct ida_storage *st = &sp->node->storage;
    int rv = ida_storage_batch_snapshot(st, b, &sp->enc.w,
                                        c->data + sp->enc.head_off, k);
    if (rv != 0) {
        IDA_WARN("storage: the snapshot at index %llu is dropped: %s",
                 (unsigned long long)sp->enc.index, st->errmsg);
        enc_drop(sp);
        return;
    }
    sp->enc.riding = k;
}

/* Record raft batch @p in storage batch @b (started here); a snapshot it
 * carries is stored first, in steps of its own. *@ride: the batch writes
 * the log (snapshot bytes may ride with it). */
static int persist_prepare(struct storage_proc *sp,
                           const struct ida_nm_persist *p,
                           struct ida_storage_batch *b,
                           int *ride,
                           const char **what)
{
    struct ida_storage *st = &sp->node->storage;
    int rv;
    int truncate_after_snapshot = 0;
    *ride = 0;
    if (p->has_snapshot) {
        *what = "installing a snapshot";
        job_drop(sp);
        enc_drop(sp);
        uint64_t t0 = ida__node_mono_us();
        if (rcv_holds(sp, p)) {
            sp->rcv.active = 0; /* finish releases the writer either way */
            rv = ida_storage_snapshot_finish_lazy(st, &sp->rcv.w);
            uint64_t t1 = ida__node_mono_us();
            IDA_INFO(
                "storage: snapshot at index %llu (%zu bytes) stored as "
                "it arrived (its last chunk was written %.1f ms before the "
                "batch that installs it came; finishing took %.1f ms)",
                (unsigned long long)p->snap_index, p->snap_len,
                (double)(t0 - sp->rcv.last_us) / 1000.0,
                (double)(t1 - t0) / 1000.0);
        } else {
            rcv_drop(sp); /* storage has one writer */
            rv = write_snapshot(sp, p->snap_index, p->snap_term, p->snap_data,
                                p->snap_len, p->snap_conf, p->snap_conf_len);
        }

        if (rv == 0) {
            rv = ida_storage_compact(st, p->snap_index);
        }
        if (rv != 0) {
            return rv;
        }
        /* The snapshot replaces the whole stored log (raft.h contract 1). */
        struct ida_storage_log_state ls;
        rv = ida_storage_log_state(st, &ls);
        if (rv != 0) {
            return rv;
        }
        truncate_after_snapshot = ls.last > p->snap_index;
    }
    *what = "persisting a raft batch";
    ida_storage_batch_init(st, b);
    rv = 0;
    if (p->n_entries > 0 || truncate_after_snapshot) {
        struct ida_storage_log_state ls;
        rv = ida_storage_log_state(st, &ls);
        ida_index from =
            p->n_entries > 0 ? p->entries[0].index : p->snap_index + 1;
        if (rv == 0 && from <= ls.last) {
            rv = ida_storage_batch_truncate(st, b, from);
        }
    }
    if (rv == 0 && p->n_entries > 0) {
        rv = ida_storage_batch_append(st, b, p->entries, p->n_entries);
    }
    if (rv == 0 && p->has_hard_state) {
        rv = ida_storage_batch_set_hard_state(st, b, &p->hard_state);
    }
    *ride = p->n_entries > 0 || p->has_hard_state || truncate_after_snapshot;
    return rv;
}

/* Whether raft batch @p may join the storage batch being merged: no
 * snapshot, its entries go on from the batch's last (no truncation), and
 * room for it. Joining cannot then fail but for what storage refuses of
 * the batch's own fields (then it is committed alone, and fails there). */
static int may_join(const struct storage_proc *sp,
                    const struct ida_nm_persist *p)
{
    const struct ida_storage_batch *b = &sp->mg.b;
    if (sp->mg.n == 0 || sp->mg.n == MERGE_MAX || p->has_snapshot ||
        sp->failed) {
        return 0;
    }
    ida_index last = b->last;
    if (p->n_entries > 0) {
        if (p->entries[0].index != b->last + 1 ||
            b->span_count == IDA_STORAGE_BATCH_SPANS_MAX) {
            return 0;
        }
        last = p->entries[p->n_entries - 1].index;
    }
    if (p->has_hard_state) {
        /* Storage checks a hard state against the durable one and the
         * batch's log at its commit: each batch's is checked here against
         * the one recorded before it and its own log, as it would be had
         * it been committed alone (else it goes alone, and fails there). */
        const struct ida_hard_state *h = &p->hard_state;
        const struct ida_hard_state *was = &b->hard_state;
        if (h->commit > last ||
            (b->has_hard_state &&
             (h->term < was->term || h->commit < was->commit ||
              (h->term == was->term && was->vote != 0 &&
               h->vote != was->vote)))) {
            return 0;
        }
    }
    return 1;
}

static void entry_bytes(const struct ida_nm_persist *p, uint64_t *bytes)
{
    for (size_t i = 0; i < p->n_entries; i++) {
        *bytes += p->entries[i].len;
    }
}

static void send_after(struct storage_proc *sp, const struct ida_nm_persist *p)
{
    for (size_t i = 0; i < p->n_after; i++) {
        ida__node_send_raft(sp->node, &p->after[i]);
    }
}

static void persist_msg_free(struct ida_msg *msg)
{
    ida_nm_persist_free(node_msg_payload(msg));
    ida_msg_free(msg);
}

/* Commit the raft batches recorded (MERGED), then, in order, what each was
 * waiting for: its deferred messages, its "persisted" notice, its apply
 * step. On failure none of that happens: the node stops taking writes. */
static void merged_commit(struct storage_proc *sp, struct ida_sender *s)
{
    if (sp->mg.n == 0) {
        return;
    }
    struct ida_node *n = sp->node;
    uint64_t t0 = ida__node_mono_us();
    int rv = sp->failed ? IDA_ESTOPPED : 0;
    if (rv == 0) {
        if (sp->mg.riders > 0) {
            /* never a commit of its own for them */
            enc_ride(sp, &sp->mg.b, sp->mg.riders);
        }
        rv = ida_storage_batch_commit(&n->storage, &sp->mg.b);
    }
    size_t count = sp->mg.n;
    sp->mg.n = 0;
    if (rv != 0) {
        /* Nothing that depends on these batches may happen: no deferred
         * messages, no "persisted". The node stops accepting writes. */
        report_failure(sp, s, rv, sp->mg.what);
        enc_drop(sp); /* its writer must go if bytes rode (storage.h) */
        for (size_t i = 0; i < count; i++) {
            persist_msg_free(sp->mg.msg[i]);
        }
        return;
    }
    ida_metrics_fsync(n->metrics, ida__node_mono_us() - t0 + sp->mg.prep_us,
                      sp->mg.bytes, count);
    sp->persist_us = ida__node_mono_us();
    if (sp->enc.riding > 0) {
        size_t k = sp->enc.riding;
        sp->enc.riding = 0;
        enc_wrote(sp, s, k);
    }
    for (size_t i = 0; i < count; i++) {
        struct ida_nm_persist *p = node_msg_payload(sp->mg.msg[i]);
        send_after(sp, p);
        if (p->batch_id != 0) {
            /* The core waits for this answer forever. */
            struct ida_nm_persisted *done = ida_malloc(sizeof(*done));
            IDA_OOM_CHECK(done != NULL, "storage: a persisted notice");
            done->batch_id = p->batch_id;
            rv = node_post(&sp->q, s, n->p_raft, IDA_NM_PERSISTED, done);
            IDA_OOM_CHECK(rv == 0, "storage: posting a persisted notice");
        }
        if (p->apply_after != NULL) {
            struct ida_nm_apply *a = p->apply_after;
            p->apply_after = NULL;
            rv = node_post(&sp->q, s, n->p_fsm, IDA_NM_APPLY, a);
            /* The fsm must see every committed entry. */
            IDA_OOM_CHECK(rv == 0, "storage: posting an apply step");
        }
        persist_msg_free(sp->mg.msg[i]);
    }
}

/* Record raft batch @p (may_join() said it may) in the storage batch
 * being merged. On failure the batch is as it was and @p goes alone. */
static int join(struct storage_proc *sp, const struct ida_nm_persist *p)
{
    struct ida_storage *st = &sp->node->storage;
    struct ida_storage_batch before = sp->mg.b;
    int rv = 0;
    if (p->n_entries > 0) {
        rv = ida_storage_batch_append(st, &sp->mg.b, p->entries, p->n_entries);
    }
    if (rv == 0 && p->has_hard_state) {
        rv = ida_storage_batch_set_hard_state(st, &sp->mg.b, &p->hard_state);
    }
    if (rv != 0) {
        sp->mg.b = before;
        return rv;
    }
    sp->mg.riders += p->n_entries > 0 || p->has_hard_state;
    return 0;
}

/* A raft batch (@msg, IDA_NM_PERSIST, taken): recorded with the ones
 * before it when it may join them, else after committing them; committed
 * once no message waits (MERGED, at the top). */
static void on_persist(struct storage_proc *sp,
                       struct ida_sender *s,
                       struct ida_msg *msg)
{
    struct ida_nm_persist *p = node_msg_payload(msg);
    if (!may_join(sp, p) || join(sp, p) != 0) {
        merged_commit(sp, s);
        const char *what = "persisting a raft batch";
        int ride = 0;
        uint64_t t0 = ida__node_mono_us();
        int rv = sp->failed ? IDA_ESTOPPED
                            : persist_prepare(sp, p, &sp->mg.b, &ride, &what);
        sp->mg.prep_us = ida__node_mono_us() - t0;
        if (rv != 0) {
            report_failure(sp, s, rv, what);
            enc_drop(sp);
            persist_msg_free(msg);
            return;
        }
        sp->mg.what = what;
        sp->mg.riders = (size_t)ride;
        sp->mg.bytes = 0;
    }
    entry_bytes(p, &sp->mg.bytes);
    sp->mg.msg[sp->mg.n++] = msg;
    if (p->has_snapshot || !ida_sender_more(s) || sp->mg.n == MERGE_MAX ||
        sp->mg.bytes >= MERGE_BYTES) {
        merged_commit(sp, s);
    }
}

/* The log up to @index (covered by a durable snapshot) goes in steps. */
static void compact_later(struct storage_proc *sp, ida_index index)
{
    if (index > sp->compact_to) {
        sp->compact_to = index;
    }
}

/* One step of deleting what a finished snapshot made garbage. Nothing here
 * is needed for safety: a crash leaves the rest to the next start (open
 * collects stray chunks; restore compacts the log its snapshot covers). */
static void tidy_step(struct storage_proc *sp, struct ida_sender *s)
{
    struct ida_storage *st = &sp->node->storage;
    if (sp->failed || (st->replaced_id == 0 && sp->compact_to == 0)) {
        return;
    }
    int more, rv;
    if (st->replaced_id != 0) {
        rv = ida_storage_snapshot_tidy(st, TIDY_BYTES, &more);
    } else {
        struct ida_storage_log_state ls;
        rv = ida_storage_log_state(st, &ls);
        ida_index upto = sp->compact_to;
        if (upto > st->snapshot_index) {
            upto = st->snapshot_index; /* never beyond what storage holds */
        }
        if (upto > ls.last) {
            upto = ls.last;
        }
        if (rv == 0 && upto >= ls.first) {
            if (upto - ls.first >= TIDY_ENTRIES) {
                upto = ls.first + TIDY_ENTRIES - 1;
            }
            rv = ida_storage_compact(st, upto);
        }
        if (rv == 0 && (upto >= sp->compact_to || upto < ls.first)) {
            sp->compact_to = 0;
        }
    }
    if (rv != 0) {
        report_failure(sp, s, rv, "compacting after a snapshot");
    }
}

/* This node's snapshot at (@index, @term) of @len bytes is durable (the log
 * it covers goes in steps): tell raft. */
static void stored(struct storage_proc *sp,
                   struct ida_sender *s,
                   ida_index index,
                   ida_term term,
                   size_t len,
                   uint64_t t0,
                   uint64_t t_last,
                   const char *how)
{
    uint64_t now = ida__node_mono_us();
    ida_metrics_snapshot_stored(sp->node->metrics, now - t0);
    IDA_INFO(
        "storage: snapshot at index %llu term %llu (%zu bytes%s; the "
        "finishing step took %.1f ms); the log it covers goes in steps",
        (unsigned long long)index, (unsigned long long)term, len, how,
        (double)(now - t_last) / 1000.0);
    /* Raft now compacts its log and keeps only the size: the bytes are
     * read back from here when a follower needs them. Not to be lost: the
     * core's snapshot (whose chunks are read from here) is gone from
     * storage now. */
    struct ida_nm_snapshot *done = ida_calloc(1, sizeof(*done));
    IDA_OOM_CHECK(done != NULL, "storage: a snapshot-stored notice");
    *done = (struct ida_nm_snapshot){.index = index, .term = term, .len = len};
    int rv =
        node_post(&sp->q, s, sp->node->p_raft, IDA_NM_SNAPSHOT_STORED, done);
    IDA_OOM_CHECK(rv == 0, "storage: posting a snapshot-stored notice");
}

/* Store the next step of the local snapshot in progress. */
static void job_step(struct storage_proc *sp, struct ida_sender *s)
{
    if (sp->job_msg == NULL) {
        return;
    }
    struct ida_storage *st = &sp->node->storage;
    const struct ida_nm_snapshot *sn = node_msg_payload(sp->job_msg);
    size_t k = sn->len - sp->job_off;
    if (k > SNAP_STEP_BYTES) {
        k = SNAP_STEP_BYTES;
    }
    int rv =
        ida_storage_snapshot_write(st, &sp->job_w, sn->data + sp->job_off, k);
    if (rv != 0) {
        job_drop(sp);
        report_failure(sp, s, rv, "storing a snapshot");
        return;
    }
    sp->job_off += k;
    if (sp->job_off < sn->len) {
        return;
    }
    uint64_t t_last = ida__node_mono_us();
    rv = ida_storage_snapshot_finish_lazy(st, &sp->job_w); /* releases it */
    if (rv != 0) {
        node_msg_free(sp->job_msg);
        sp->job_msg = NULL;
        report_failure(sp, s, rv, "storing a snapshot");
        return;
    }
    compact_later(sp, sn->index);
    stored(sp, s, sn->index, sn->term, sn->len, sp->job_t0, t_last, "");
    node_msg_free(sp->job_msg);
    sp->job_msg = NULL;
}

/* Whether a snapshot of this node's at @index is newer than the one stored
 * and any of its own being stored (and storage works). */
static int newest_local(const struct storage_proc *sp, ida_index index)
{
    const struct ida_nm_snapshot *job =
        sp->job_msg != NULL ? node_msg_payload(sp->job_msg) : NULL;
    return !sp->failed && index > sp->node->storage.snapshot_index &&
           (job == NULL || index > job->index) &&
           (!sp->enc.active || index > sp->enc.index);
}

/* Every byte of this node's snapshot is written: raft looks up the
 * membership at its index and sends it back in a SNAPSHOT_STORE without
 * bytes (on_snapshot_store()). */
static void enc_complete(struct storage_proc *sp, struct ida_sender *s)
{
    if (sp->enc.next != sp->enc.total) {
        enc_drop(sp);
        return;
    }
    sp->enc.complete = 1;
    struct ida_nm_snapshot *sn = ida_calloc(1, sizeof(*sn));
    if (sn != NULL) {
        *sn = (struct ida_nm_snapshot){
            .index = sp->enc.index, .term = sp->enc.term, .len = sp->enc.total};
    }
    if (sn == NULL || node_post(&sp->q, s, sp->node->p_raft,
                                IDA_NM_SNAPSHOT_TAKEN, sn) != 0) {
        enc_drop(sp); /* (node_post freed @sn) the log stays */
    }
}

/* @k more bytes of the oldest waiting slice are stored: let go of the
 * slices now whole on disk, and finish after the last. */
static void enc_wrote(struct storage_proc *sp, struct ida_sender *s, size_t k)
{
    sp->enc.head_off += k;
    sp->enc.next += k;
    struct ida_msg *m;
    while ((m = enc_oldest(sp)) != NULL) {
        const struct ida_nm_snap_enc *c = node_msg_payload(m);
        if (sp->enc.head_off < c->len) {
            return;
        }
        int end = c->end;
        enc_pop(sp);
        if (end) {
            enc_complete(sp, s);
            return;
        }
    }
}

/* Write what is left of the oldest waiting slice in a transaction of its
 * own. */
static void enc_write_oldest(struct storage_proc *sp, struct ida_sender *s)
{
    const struct ida_nm_snap_enc *c = node_msg_payload(enc_oldest(sp));
    size_t k = c->len - sp->enc.head_off;
    int rv = ida_storage_snapshot_write(&sp->node->storage, &sp->enc.w,
                                        c->data + sp->enc.head_off, k);
    if (rv != 0) {
        enc_drop(sp);
        report_failure(sp, s, rv, "storing a snapshot");
        return;
    }
    enc_wrote(sp, s, k);
}

/* When no raft batch came for ENC_IDLE_US, nothing waits behind a slice:
 * write one on its own. */
static void enc_idle_step(struct storage_proc *sp, struct ida_sender *s)
{
    if (!sp->failed && enc_oldest(sp) != NULL &&
        ida__node_mono_us() - sp->persist_us >= ENC_IDLE_US) {
        enc_write_oldest(sp, s);
    }
}

/* A slice of this node's snapshot as its encoder wrote it (see the top):
 * checked and taken in; its bytes ride in the next raft batches
 * (enc_ride()). Takes @msg. */
static void on_snapshot_enc(struct storage_proc *sp,
                            struct ida_sender *s,
                            struct ida_msg *msg)
{
    struct ida_storage *st = &sp->node->storage;
    const struct ida_nm_snap_enc *c = node_msg_payload(msg);
    if (sp->failed) {
        enc_msg_free(sp, msg); /* nothing more is stored */
        enc_drop(sp);
        return;
    }
    if (c->offset == 0 && c->end >= 0) {
        /* A new one: it takes the writer from an older one of its own;
         * a leader's snapshot arriving keeps it (this node installs that
         * one, which replaces its own). */
        if (!newest_local(sp, c->index) || sp->rcv.active) {
            enc_msg_free(sp, msg);
            return;
        }
        job_drop(sp);
        enc_drop(sp);
        (void)ida_storage_reserve(st, c->total); /* else it grows as it goes */
        if (ida_storage_snapshot_begin(st, &sp->enc.w, c->index, c->term, NULL,
                                       0) != 0) {
            enc_msg_free(sp, msg);
            return; /* the log stays until the next one */
        }
        sp->enc.active = 1;
        sp->enc.complete = 0;
        sp->enc.ended = 0;
        sp->enc.index = c->index;
        sp->enc.term = c->term;
        sp->enc.total = c->total;
        sp->enc.next = 0;
        sp->enc.queued = 0;
        sp->enc.t0 = ida__node_mono_us();
    }
    if (!sp->enc.active || sp->enc.complete || sp->enc.ended ||
        c->index != sp->enc.index || c->term != sp->enc.term) {
        enc_msg_free(sp, msg);
        return; /* of one dropped or replaced */
    }
    if (c->end < 0 || c->offset != sp->enc.queued ||
        c->total != sp->enc.total || c->len > sp->enc.total - sp->enc.queued ||
        (c->end != 0 && sp->enc.queued + c->len != sp->enc.total)) {
        enc_msg_free(sp, msg);
        enc_drop(sp);
        return;
    }
    if (sp->enc.wait_count == ENC_WAIT_MAX) {
        enc_write_oldest(sp, s); /* (not expected: see ENC_WAIT_MAX) */
        if (!sp->enc.active) {
            enc_msg_free(sp, msg);
            return;
        }
    }
    sp->enc.wait[(sp->enc.wait_head + sp->enc.wait_count) % ENC_WAIT_MAX] = msg;
    sp->enc.wait_count++;
    sp->enc.queued += c->len;
    sp->enc.ended = c->end != 0;
    enc_wrote(sp, s, 0); /* an empty last slice ends it at once */
}

/* The membership for the snapshot stored as it was encoded: make it
 * current. */
static void enc_finish(struct storage_proc *sp,
                       struct ida_sender *s,
                       const struct ida_nm_snapshot *sn)
{
    struct ida_storage *st = &sp->node->storage;
    if (sp->failed || !sp->enc.active || !sp->enc.complete ||
        sn->index != sp->enc.index || sn->term != sp->enc.term ||
        sn->len != sp->enc.total) {
        return; /* dropped or replaced meanwhile */
    }
    if (ida_storage_snapshot_set_config(&sp->enc.w, sn->conf, sn->conf_len) !=
        0) {
        enc_drop(sp);
        return;
    }
    sp->enc.active = 0; /* finish releases the writer either way */
    uint64_t t_last = ida__node_mono_us();
    int rv = ida_storage_snapshot_finish_lazy(st, &sp->enc.w);
    if (rv != 0) {
        report_failure(sp, s, rv, "storing a snapshot");
        return;
    }
    compact_later(sp, sn->index);
    stored(sp, s, sn->index, sn->term, sn->len, sp->enc.t0, t_last,
           ", stored as it was encoded");
}

/* Fill an InstallSnapshot chunk from the stored snapshot and send it. A
 * snapshot replaced meanwhile (or a failed read) drops it: the leader's core
 * sends again, as for a lost message. */
static void on_snapshot_chunk(struct storage_proc *sp,
                              const struct ida_nm_snap_chunk *c)
{
    struct ida_storage *st = &sp->node->storage;
    struct ida_raft_msg m = c->m;
    struct ida_raft_install_snapshot *is = &m.u.install_snapshot;
    if (sp->failed || !st->has_snapshot ||
        st->snapshot_index != is->last_index ||
        st->snapshot_term != is->last_term ||
        st->snapshot_size != is->total_size || is->offset > is->total_size ||
        is->len > is->total_size - is->offset) {
        return;
    }
    uint8_t *buf = ida_malloc(is->len);
    size_t got = 0;
    int rv = buf == NULL
                 ? IDA_ENOMEM
                 : ida_storage_snapshot_read(st, st->snapshot_id, is->offset,
                                             buf, is->len, &got);
    if (rv == 0 && got == is->len) {
        is->data = buf;
        ida__node_send_raft(sp->node, &m);
    } else if (rv != 0 && rv != IDA_ENOMEM) {
        IDA_WARN(
            "storage: cannot read snapshot %llu bytes %llu+%zu for node "
            "%u: %s",
            (unsigned long long)is->last_index, (unsigned long long)is->offset,
            is->len, m.to, idalloc_strerror(rv));
    }
    ida_free(buf);
}

/* Takes @msg. */
static void on_snapshot_store(struct storage_proc *sp,
                              struct ida_sender *s,
                              struct ida_msg *msg)
{
    struct ida_storage *st = &sp->node->storage;
    const struct ida_nm_snapshot *sn = node_msg_payload(msg);
    if (sn->data == NULL) {
        enc_finish(sp, s, sn);
        node_msg_free(msg);
        return;
    }
    if (!newest_local(sp, sn->index)) {
        node_msg_free(msg);
        return;
    }
    job_drop(sp); /* an older one still in progress */
    enc_drop(sp);
    rcv_drop(sp);                           /* storage has one writer */
    (void)ida_storage_reserve(st, sn->len); /* else it grows as it goes */
    int rv = ida_storage_snapshot_begin(st, &sp->job_w, sn->index, sn->term,
                                        sn->conf, sn->conf_len);
    if (rv != 0) {
        node_msg_free(msg);
        report_failure(sp, s, rv, "storing a snapshot");
        return;
    }
    sp->job_msg = msg;
    sp->job_off = 0;
    sp->job_t0 = ida__node_mono_us();
    job_step(sp, s);
}

/* Rule A4 (raft/admission.h): the node's state went back. Mark the
 * directory so that no later start trusts it, then stop the node: SIGTERM to
 * ourselves, which idallocd's main thread takes like an operator's, and exit
 * status 1. */
static void on_untrusted(struct storage_proc *sp,
                         const struct ida_nm_untrusted *u)
{
    struct ida_node *n = sp->node;
    int rv = ida_storage_mark_untrusted(&n->storage, u->why);
    if (rv != 0) {
        IDA_ERROR(
            "storage: cannot mark %s untrusted: %s; remove it before "
            "starting this node again",
            n->dir, n->storage.errmsg);
    } else {
        IDA_ERROR(
            "storage: marked %s untrusted: this node stops and will "
            "not start from it again; remove the directory to rejoin "
            "as a new incarnation (README, Runbook)",
            n->dir);
    }
    n->exit_status = 1;
    kill(getpid(), SIGTERM);
}

/* Start making the entry log's next segment ahead, or look whether it is
 * made, between batches (none waits merged): without it the batch that
 * fills a segment writes the next one whole (65 MiB) and waits for it. In
 * line, its steps held this processor 10 to 168 ms under load at 10 M
 * allocations; now a thread makes it. After a failure (a full disk) it
 * rests PREPARE_REST_US: the append that needs it tries again. */
static void prepare_step(struct storage_proc *sp)
{
    uint64_t now = ida__node_mono_us();
    if (sp->failed || sp->mg.n > 0 || now < sp->prepare_us) {
        return;
    }
    int rv = ida_storage_log_prepare(&sp->node->storage, PREPARE_STEP_BYTES);
    if (rv != 0 && rv != IDA_EBUSY) {
        sp->prepare_us = now + PREPARE_REST_US;
    }
}

/* One step of releasing map pages from the resident size, when due. */
static void release_step(struct storage_proc *sp)
{
    uint64_t now = ida__node_mono_us();
    if (sp->failed || now - sp->released_us < RELEASE_EVERY_US) {
        return;
    }
    sp->released_us = now;
    if (resident_shared_bytes() > RELEASE_ABOVE_BYTES) {
        ida_storage_release_pages(&sp->node->storage, RELEASE_STEP_BYTES);
    }
}

static void storage_receive(void *state,
                            struct ida_msg *msg,
                            struct ida_sender *s)
{
    struct storage_proc *sp = state;
    node_outq_flush(&sp->q, s);
    if (msg->type != IDA_NM_PERSIST) {
        merged_commit(sp, s); /* whatever comes next sees them durable */
    }
    if (msg->type == IDA_NM_PERSIST) {
        on_persist(sp, s, msg);
        if (sp->mg.n > 0) {
            return; /* more are coming: the steps below wait for them */
        }
    } else if (msg->type == IDA_NM_SNAPSHOT_STORE) {
        on_snapshot_store(sp, s, msg);
        return; /* its first step is done */
    } else if (msg->type == IDA_NM_SNAPSHOT_ENC) {
        on_snapshot_enc(sp, s, msg);
    } else if (msg->type == IDA_NM_SNAPSHOT_RCV) {
        on_snapshot_rcv(sp, node_msg_payload(msg));
        node_msg_free(msg);
    } else if (msg->type == IDA_NM_SNAPSHOT_CHUNK) {
        on_snapshot_chunk(sp, node_msg_payload(msg));
        node_msg_free(msg);
    } else if (msg->type == IDA_NM_UNTRUSTED) {
        on_untrusted(sp, node_msg_payload(msg));
        node_msg_free(msg);
    } else if (msg->type == IDA_NM_MEMBERSHIP0) {
        struct ida_nm_membership0 *m = node_msg_payload(msg);
        m->rv =
            ida_storage_membership0_set(&sp->node->storage, m->data, m->len);
        msg->type = IDA_NM_MEMBERSHIP0_DONE;
        node_send(&sp->q, s, sp->node->p_raft, msg);
    } else {
        node_msg_free(msg);
    }
    job_step(sp, s);
    enc_idle_step(sp, s);
    tidy_step(sp, s);
    prepare_step(sp);
    release_step(sp);
}

static void storage_ping(void *state, struct ida_sender *s)
{
    struct storage_proc *sp = state;
    node_outq_flush(&sp->q, s);
    merged_commit(sp, s);
    job_step(sp, s);
    enc_idle_step(sp, s);
    tidy_step(sp, s);
    prepare_step(sp);
    release_step(sp);
}

const struct ida_proc_ops ida__storage_proc_ops = {storage_receive,
                                                   storage_ping};

int ida__storage_proc_new(struct ida_node *n, struct storage_proc **out)
{
    struct storage_proc *sp = ida_calloc(1, sizeof(*sp));
    if (sp == NULL) {
        return IDA_ENOMEM;
    }
    sp->node = n;
    *out = sp;
    return 0;
}

void ida__storage_proc_free(struct storage_proc *sp)
{
    if (sp != NULL) {
        for (size_t i = 0; i < sp->mg.n; i++) {
            persist_msg_free(sp->mg.msg[i]); /* never acknowledged */
        }
        job_drop(sp);
        enc_drop(sp);
        rcv_drop(sp);
        node_outq_close(&sp->q);
        ida_free(sp);
    }
}
