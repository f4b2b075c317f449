/* The raft processor's snapshots (src/node/raft_proc.h): a leader's
 * snapshot received (decoded as its chunks come, snap_stream.h, then
 * checked by a restore on a thread of its own before the core gives up its
 * log for it) and this node's own snapshot taken (made current, or held
 * while a follower catches up: snap_policy.h, HOLD). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/node.h"
#include "src/node/raft_proc.h"
#include "src/node/snap_stream.h"

/* --- a leader's snapshot received
 * ------------------------------------------------- */

/* A chunk of a leader's snapshot the core took, but not one marked done
 * (the check starts with that one, and takes the stream): the first
 * starts a stream that decodes the snapshot as it arrives (snap_stream.h),
 * each next one feeds it; a chunk it did not expect drops it. */
static void stream_take(struct raft_proc *rp,
                        const struct ida_raft_install_snapshot *is)
{
    if (is->offset == 0 &&
        ida__snap_stream_at(rp->stream, is->last_index, is->last_term,
                            is->total_size, is->len)) {
        return; /* its first chunk again, and the stream holds just that */
    }
    if (is->offset == 0) {
        ida__snap_stream_drop(rp->stream);
        rp->stream = ida__snap_stream_start(is->last_index, is->last_term,
                                            is->total_size, is->data, is->len);
    } else if (ida__snap_stream_at(rp->stream, is->last_index, is->last_term,
                                   is->total_size, is->offset)) {
        ida__snap_stream_feed(rp->stream, is->data, is->len);
    } else {
        ida__snap_stream_drop(rp->stream);
        rp->stream = NULL;
    }
}

/* A stream of a snapshot the core no longer receives (it took another's
 * first chunk, installed one, or forgot it) is stopped. */
static void stream_poll(struct raft_proc *rp)
{
    ida_index index;
    ida_term term;
    size_t len = ida_raft_receiving(&rp->raft, &index, &term);
    if (rp->stream != NULL &&
        (len == 0 || !ida__snap_stream_of(rp->stream, index, term) ||
         ida__snap_stream_fed(rp->stream) != len)) {
        ida__snap_stream_drop(rp->stream);
        rp->stream = NULL;
    }
}

/* A chunk of a leader's snapshot the core just took (in order: at the
 * offset it held, or the first of a snapshot) goes to storage too, which
 * stores it while the rest arrives and the state is checked; the batch
 * that installs the snapshot then only finishes it (storage_proc.c). A
 * chunk lost here (out of memory) only means storage writes the whole
 * snapshot with that batch, as it would without this. */
void ida__rp_stream_chunk(struct raft_proc *rp,
                          struct ida_sender *s,
                          const struct ida_raft_install_snapshot *is,
                          const struct rcv_mark *before)
{
    struct rcv_mark after;
    after.len = ida_raft_receiving(&rp->raft, &after.index, &after.term);
    int same = before->index == is->last_index && before->term == is->last_term;
    int in_order = is->offset == 0 || (same && before->len == is->offset);
    int taken = after.index == is->last_index && after.term == is->last_term &&
                after.len == is->offset + is->len;
    /* Installed by this chunk (not a repeat of one installed before). */
    int installed = is->done && before->snap != is->last_index &&
                    ida_raft_snapshot_index(&rp->raft) == is->last_index;
    if (!in_order || !(taken || installed) || is->len == 0) {
        return;
    }
    if (taken && !is->done) {
        stream_take(rp, is);
    }
    struct ida_nm_snap_rcv *c = ida_calloc(1, sizeof(*c));
    if (c == NULL) {
        return;
    }
    *c = (struct ida_nm_snap_rcv){.index = is->last_index,
                                  .term = is->last_term,
                                  .total = is->total_size,
                                  .offset = is->offset,
                                  .len = is->len};
    c->data = ida__rp_bytes_copy(is->data, is->len);
    if (is->offset == 0 && is->config_len > 0) {
        c->conf = ida__rp_bytes_copy(is->config, is->config_len);
        c->conf_len = c->conf != NULL ? is->config_len : 0;
    }
    if (c->data == NULL ||
        (is->config_len > 0 && is->offset == 0 && c->conf == NULL)) {
        ida_free(c->data);
        ida_free(c->conf);
        ida_free(c);
        return;
    }
    node_post(&rp->q, s, rp->node->p_storage, IDA_NM_SNAPSHOT_RCV, c);
}

/* A snapshot from a leader is restored into a scratch state machine before
 * the core gives up its log for it: bytes that do not restore (damaged or
 * forged), or hold the state of another index than the one they are sent
 * as (the log after them would be applied to the wrong state), are refused
 * and the node keeps running on what it had. The scratch state machine of
 * an accepted snapshot is kept (rp->checked) and goes to the fsm processor
 * with the batch that installs the snapshot (make_apply(), raft_proc.c):
 * decoding a
 * large state takes seconds, and this way it is done once.
 *
 * The restore runs on a thread of its own (and one lent to it), not on this
 * processor: at ten million allocations it takes about a second, during
 * which the node would neither tick nor answer its leader's heartbeats (a
 * voter catching up could even call an election when it is done). The core
 * is told IDA_RAFT_CHECK_PENDING and keeps the bytes unchanged meanwhile
 * (raft.h, snapshot_check); ida__rp_check_poll(), on each ping (every tick),
 * hands the verdict to the core once the thread is done. A node stopping waits
 * for a check under way (ida__raft_proc_free()): the restore cannot be
 * cut short, and it reads bytes the core frees. Without a thread (none could
 * be started) the check runs here, as before. */
struct snap_checker
{
    pthread_t thread;
    const uint8_t *data; /* the core's rcv_data, unchanged until the verdict */
    size_t len;
    struct ida__snap_stream *stream; /* these bytes decoded as they came */
    uint64_t ahead;                  /* holdings taken as decoded ahead */
    ida_index index;
    ida_term term;
    struct ida_fsm *fsm; /* restored (rv 0) */
    ida_index held;      /* the index the bytes hold */
    int rv;
    uint64_t took_us;
    uint64_t done_us; /* when it was done (ida__node_mono_us()) */
    struct ida__snap_stream_times times;
    atomic_int done;
};

static void check_run(struct snap_checker *c)
{
    uint64_t t0 = ida__node_mono_us();
    c->rv = ida_fsm_new(&c->fsm);
    if (c->rv == 0) {
        c->rv = ida__snap_stream_restore(c->stream, c->fsm, c->data, c->len,
                                         &c->ahead, &c->times);
    } else {
        ida__snap_stream_drop(c->stream);
    }
    c->stream = NULL;
    c->held = c->rv == 0 ? ida_fsm_applied_index(c->fsm) : 0;
    if (c->rv == 0 && c->held != c->index) {
        c->rv = IDA_ECORRUPT;
    }
    if (c->rv != 0) {
        ida_fsm_free(c->fsm);
        c->fsm = NULL;
    }
    c->done_us = ida__node_mono_us();
    c->took_us = c->done_us - t0;
    atomic_store(&c->done, 1);
}

static void *check_main(void *arg)
{
    check_run(arg);
    return NULL;
}

/* The verdict of @c (done), logged and kept: the restored state machine
 * becomes rp->checked. Returns the verdict; frees @c. */
static int check_finish(struct raft_proc *rp, struct snap_checker *c)
{
    int rv = c->rv;
    if (rv == IDA_ECORRUPT && c->held != 0) {
        IDA_WARN(
            "raft: refused a snapshot at index %llu from the leader: it "
            "holds the state at index %llu; keeping the log and state this "
            "node has",
            (unsigned long long)c->index, (unsigned long long)c->held);
    } else if (rv != 0) {
        IDA_WARN(
            "raft: refused a snapshot of %zu bytes from the leader: %s; "
            "keeping the log and state this node has",
            c->len, idalloc_strerror(rv));
    } else {
        /* One not handed out yet is older: this one replaces it. */
        ida_fsm_free(rp->checked);
        rp->checked = c->fsm;
        rp->checked_index = c->index;
        rp->checked_term = c->term;
        IDA_INFO(
            "raft: snapshot at index %llu term %llu (%zu bytes) received "
            "from the leader and checked in %.1f ms after its last chunk "
            "(%llu holdings taken as decoded while it arrived; %.1f ms "
            "decoding its last bytes, %.1f ms comparing, %.1f ms "
            "restoring), taken %.1f ms after",
            (unsigned long long)c->index, (unsigned long long)c->term, c->len,
            (double)c->took_us / 1000.0, (unsigned long long)c->ahead,
            (double)c->times.lag_us / 1000.0, (double)c->times.cmp_us / 1000.0,
            (double)c->times.restore_us / 1000.0,
            (double)(ida__node_mono_us() - c->done_us) / 1000.0);
    }
    ida_free(c);
    return rv;
}

int ida__rp_snapshot_check(void *arg,
                           ida_index index,
                           ida_term term,
                           const uint8_t *data,
                           size_t len)
{
    struct raft_proc *rp = arg;
    struct snap_checker *c = ida_calloc(1, sizeof(*c));
    if (c == NULL) {
        return IDA_ENOMEM; /* refused: the leader sends it again */
    }
    *c = (struct snap_checker){
        .data = data, .len = len, .index = index, .term = term};
    /* The stream of this snapshot goes with the check (which restores
     * the bytes whole if the stream's differ). */
    if (ida__snap_stream_of(rp->stream, index, term)) {
        c->stream = rp->stream;
    } else {
        ida__snap_stream_drop(rp->stream);
    }
    rp->stream = NULL;
    if (rp->checking == NULL &&
        pthread_create(&c->thread, NULL, check_main, c) == 0) {
        rp->checking = c;
        return IDA_RAFT_CHECK_PENDING;
    }
    check_run(c);
    return check_finish(rp, c);
}

/* Join the checking thread, if any, and take its verdict (@wait: even if
 * it is not done yet). Returns whether there was one to take. */
bool ida__rp_check_take(struct raft_proc *rp, bool wait, int *rv)
{
    struct snap_checker *c = rp->checking;
    if (c == NULL || (!wait && !atomic_load(&c->done))) {
        return false;
    }
    pthread_join(c->thread, NULL);
    rp->checking = NULL;
    *rv = check_finish(rp, c);
    return true;
}

void ida__rp_check_poll(struct raft_proc *rp, struct ida_sender *s)
{
    stream_poll(rp);
    ida_index index = rp->checking != NULL ? rp->checking->index : 0;
    ida_term term = rp->checking != NULL ? rp->checking->term : 0;
    int rv;
    if (!ida__rp_check_take(rp, false, &rv)) {
        return;
    }
    if (ida_raft_snapshot_checked(&rp->raft, index, term, rv) ==
            IDA_RAFT_CHECK_STALE &&
        rv == 0) {
        /* Not installed (the term moved on meanwhile, or the index is held
         * already): the state restored is of no use, and large. */
        IDA_INFO(
            "raft: the snapshot at index %llu was checked after the term "
            "moved on; not installed (the leader sends its own)",
            (unsigned long long)index);
        ida_fsm_free(rp->checked);
        rp->checked = NULL;
    }
    ida__rp_drive(rp, s);
}

/* --- this node's snapshot taken
 * ------------------------------------------------------ */

/* Storage keeps the membership in effect at the snapshot's index with it
 * (raft.h persistence contract 5): send @msg (a SNAPSHOT_TAKEN: from the
 * fsm with the bytes, encoded in line, or from storage without them,
 * stored as the child encoded it) back as the SNAPSHOT_STORE that makes
 * it current. Not after the core's own snapshot: nothing to do. Takes
 * @msg. */
static void snapshot_store(struct raft_proc *rp,
                           struct ida_sender *s,
                           struct ida_msg *msg)
{
    struct ida_nm_snapshot *sn = node_msg_payload(msg);
    const uint8_t *conf;
    size_t clen;
    int rv = ida_raft_config_at(&rp->raft, sn->index, &conf, &clen);
    if (rv == 0 && clen > 0) {
        sn->conf = ida__rp_bytes_copy(conf, clen);
        rv = sn->conf == NULL ? IDA_ENOMEM : 0;
        if (rv == 0) {
            sn->conf_len = clen;
        }
    }
    if (rv != 0) {
        node_msg_free(msg); /* the log stays until the next one */
        return;
    }
    msg->type = IDA_NM_SNAPSHOT_STORE;
    node_send(&rp->q, s, rp->node->p_storage, msg);
}

/* This node's snapshot is encoded (and, from a child, stored but not yet
 * current): make it current, or hold it while a follower catches up
 * (snap_policy.h, HOLD). A newer one replaces one held (storage dropped
 * the older one's writer for it) and inherits its start: the cap counts
 * from the first, so snapshots falling due faster than the cap cannot
 * keep the log from being compacted for good. Takes @msg. */
void ida__rp_snapshot_taken(struct raft_proc *rp,
                            struct ida_sender *s,
                            struct ida_msg *msg)
{
    uint64_t now = ida__node_mono_ms();
    uint64_t since = rp->held != NULL ? rp->held_since_ms : now;
    node_msg_free(rp->held);
    rp->held = NULL;
    if (!ida_snap_hold(ida_raft_role(&rp->raft) == IDA_RAFT_LEADER,
                       ida__rp_follower_catching_up(rp), since, now)) {
        snapshot_store(rp, s, msg);
        return;
    }
    const struct ida_nm_snapshot *sn = node_msg_payload(msg);
    IDA_INFO(
        "raft: the snapshot at index %llu waits to replace the one "
        "stored while a follower catches up (at most %.0f s more)",
        (unsigned long long)sn->index,
        (double)(IDA_SNAP_HOLD_MS - (now - since)) / 1000.0);
    rp->held = msg;
    rp->held_since_ms = since;
}

/* On a ping: the snapshot held goes once nobody catches up, this node no
 * longer leads, or the hold reached its cap. */
void ida__rp_held_step(struct raft_proc *rp, struct ida_sender *s)
{
    if (rp->held == NULL) {
        return;
    }
    uint64_t now = ida__node_mono_ms();
    int leader = ida_raft_role(&rp->raft) == IDA_RAFT_LEADER;
    int behind = leader && ida__rp_follower_catching_up(rp);
    if (ida_snap_hold(leader, behind, rp->held_since_ms, now)) {
        return;
    }
    const struct ida_nm_snapshot *sn = node_msg_payload(rp->held);
    IDA_INFO(
        "raft: the snapshot at index %llu waited %.1f s for a follower "
        "catching up (%s); it replaces the one stored",
        (unsigned long long)sn->index,
        (double)(now - rp->held_since_ms) / 1000.0,
        !leader  ? "no longer leader"
        : behind ? "at the cap"
                 : "no follower catching up");
    struct ida_msg *msg = rp->held;
    rp->held = NULL;
    snapshot_store(rp, s, msg);
}
