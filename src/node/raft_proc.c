/* The raft processor: owns the Raft core; turns client writes into log
 * entries (group commit), reads into ReadIndex rounds, and every batch of
 * the core into work for net, storage and fsm. See node.h. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/common/frame.h"
#include "src/node/convert.h"
#include "src/node/lend.h"
#include "src/node/member.h"
#include "src/node/node.h"
#include "src/node/raft_proc.h"
#include "src/node/snap_stream.h"

/* Close the open batch at this many commands or bytes even while a storage
 * step is in flight or the last entry is not committed (GATE). */
#define OPEN_COMMANDS_MAX 4096
#define OPEN_BYTES_MAX    (1u << 20)
/* InstallSnapshot to a follower that fell behind: chunks of this size, this
 * many in flight (raft.h, snapshot_max_inflight), so the leader's encoding
 * and TLS overlap the follower's decoding instead of waiting for each
 * answer. 4 MiB in flight per follower, well within what net queues to a
 * peer (peer_queue_bytes_max, 64 MiB); a chunk and its message fit a
 * frame (IDA_FRAME_PAYLOAD_BYTES_DEFAULT, 4 MiB). */
#define SNAPSHOT_CHUNK_BYTES     (512u * 1024)
#define SNAPSHOT_CHUNKS_INFLIGHT 8
_Static_assert(SNAPSHOT_CHUNK_BYTES + 64 * 1024 <=
                   IDA_FRAME_PAYLOAD_BYTES_DEFAULT,
               "a snapshot chunk must fit a peer frame");
/* An append carries at most this many entries, and this many bytes of
 * them (raft.h, max_msg_entries and max_msg_bytes; see
 * ida__raft_proc_new()). With up to 64 bytes of framing per entry it fits
 * a peer frame. */
#define APPEND_ENTRIES_MAX 1024
#define APPEND_BYTES_MAX   (1u << 20)
_Static_assert(APPEND_BYTES_MAX + APPEND_ENTRIES_MAX * 64 <=
                   IDA_FRAME_PAYLOAD_BYTES_DEFAULT,
               "an append of many entries must fit a peer frame");
/* Appends sent to one follower per call of the core's send path (raft.h,
 * max_append_burst): a follower far behind (a new node after its
 * snapshot) is sent this many MiB per acknowledgement (twice that when
 * the acknowledgement also commits), each encoded by this processor; the
 * window of 32 fills as it acknowledges them (a bound of 1 would not
 * grow it). */
#define APPEND_BURST 2

/* A heap copy of @len bytes at @d (at least one byte allocated), NULL
 * when out of memory. */
uint8_t *ida__rp_bytes_copy(const uint8_t *d, size_t len)
{
    uint8_t *c = ida_malloc(len > 0 ? len : 1);
    if (c != NULL && len > 0) {
        memcpy(c, d, len);
    }
    return c;
}

uint64_t ida__node_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t ida__node_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

uint64_t ida__node_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

unsigned ida__raft_proc_tick_ms(const struct ida_node *n)
{
    unsigned t = n->cfg.heartbeat_ms / 2;
    if (t > IDA_NODE_TICK_MS_MAX) {
        t = IDA_NODE_TICK_MS_MAX;
    }
    return t > 0 ? t : 1;
}

/* --- replies
 * ------------------------------------------------------------------ */

/* @unregistered: a RegisterClient answered IDA_ENOTLEADER (it registered
 * nothing; ida__node_reply_refusal()). */
static void reply_refusal(struct raft_proc *rp,
                          uint64_t conn,
                          uint64_t seq,
                          int err,
                          const char *why,
                          int unregistered)
{
    ida__node_reply_refusal(rp->node, conn, seq, err, why,
                            err == IDA_ENOTLEADER ? rp->leader : 0,
                            unregistered);
}

static void reply_error(struct raft_proc *rp,
                        uint64_t conn,
                        uint64_t seq,
                        int err,
                        const char *why)
{
    reply_refusal(rp, conn, seq, err, why, 0);
}

/* An InstallSnapshot chunk of a snapshot whose bytes are in storage (raft.h
 * contract 7): the storage processor reads them and sends it. Lost when out
 * of memory, like any message (the core sends again). */
static void send_chunk_from_storage(struct raft_proc *rp,
                                    struct ida_sender *s,
                                    const struct ida_raft_msg *m)
{
    const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
    struct ida_nm_snap_chunk *c = ida_calloc(1, sizeof(*c));
    if (c == NULL) {
        return;
    }
    c->m = *m;
    if (is->config_len > 0) {
        c->conf = ida__rp_bytes_copy(is->config, is->config_len);
        if (c->conf == NULL) {
            ida_free(c);
            return;
        }
    }
    c->m.u.install_snapshot.config = c->conf;
    node_post(&rp->q, s, rp->node->p_storage, IDA_NM_SNAPSHOT_CHUNK, c);
}

static void send_peer(struct raft_proc *rp,
                      struct ida_sender *s,
                      const struct ida_raft_msg *m)
{
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        m->u.install_snapshot.data == NULL && m->u.install_snapshot.len > 0) {
        send_chunk_from_storage(rp, s, m);
        return;
    }
    ida__node_send_raft(rp->node, m);
}

/* --- leadership
 * ---------------------------------------------------------------- */

static void fail_reads(struct raft_proc *rp, int err)
{
    for (size_t i = 0; i < rp->n_reads; i++) {
        reply_error(rp, rp->reads[i].conn, rp->reads[i].req->request_seq, err,
                    NULL);
        idalloc__client_request__free_unpacked(rp->reads[i].req, NULL);
    }
    rp->n_reads = 0;
}

/* Every write this node accepted has an unknown outcome now: the fsm answers
 * them IDA_ELEADERLOST (a retry with the same id finds the truth). */
static void lose_writes(struct raft_proc *rp, struct ida_sender *s)
{
    for (size_t i = 0; i < rp->n_open; i++) {
        idalloc__client_request__free_unpacked(rp->open[i], NULL);
    }
    rp->n_open = 0;
    rp->open_bytes = 0;
    rp->open_gate = 0;
    uint8_t *flag = ida_malloc(1);
    if (flag != NULL) {
        node_post(&rp->q, s, rp->node->p_fsm, IDA_NM_LEADERSHIP_LOST, flag);
    }
}

/* Learn the core's role, leader and term. A batch carries them, but a
 * change alone (a check-quorum step-down at the same term) produces no
 * batch, so ida__rp_drive() also asks the core directly after every round. */
static void note_soft_state(struct raft_proc *rp,
                            struct ida_sender *s,
                            enum ida_raft_role role,
                            ida_node_id leader,
                            ida_term term)
{
    if (role == rp->role && leader == rp->leader && term == rp->term) {
        return;
    }
    int was_leader = rp->role == IDA_RAFT_LEADER;
    if (role != rp->role &&
        (role == IDA_RAFT_CANDIDATE || role == IDA_RAFT_PRE_CANDIDATE)) {
        IDA_DEBUG("raft: election started: %s term=%llu (was %s, leader=%u)",
                  ida_raft_role_name(role), (unsigned long long)term,
                  ida_raft_role_name(rp->role), rp->leader);
    }
    if (role == IDA_RAFT_LEADER && !was_leader) {
        IDA_INFO("raft: became leader term=%llu", (unsigned long long)term);
    } else if (leader != rp->leader || term != rp->term) {
        IDA_INFO("raft: %s term=%llu leader=%u", ida_raft_role_name(role),
                 (unsigned long long)term, leader);
    }
    if (was_leader && role != IDA_RAFT_LEADER) {
        IDA_INFO("raft: lost leadership term=%llu", (unsigned long long)term);
        fail_reads(rp, IDA_ELEADERLOST);
        lose_writes(rp, s);
    }
    rp->role = role;
    rp->leader = leader;
    rp->term = term;
}

/* --- batches
 * ---------------------------------------------------------------------- */

/* The fsm's part of a batch: its snapshot to install (if any), then its
 * committed entries. The snapshot goes as the state machine that
 * ida__rp_snapshot_check() restored from it when that one is of the same index
 * and term (ownership moves into the message), else as its bytes. */
static struct ida_nm_apply *make_apply(struct raft_proc *rp,
                                       const struct ida_raft_batch *b)
{
    struct ida_nm_apply *a = ida_calloc(1, sizeof(*a));
    if (a == NULL) {
        return NULL;
    }
    if (b->has_snapshot) {
        a->has_snapshot = 1;
        a->snap_index = b->snapshot.index;
        a->snap_term = b->snapshot.term;
        a->snap_len = b->snapshot.len;
        if (rp->checked != NULL && rp->checked_index == b->snapshot.index &&
            rp->checked_term == b->snapshot.term) {
            a->fsm = rp->checked;
            rp->checked = NULL;
        } else {
            a->snap_data =
                ida__rp_bytes_copy(b->snapshot.data, b->snapshot.len);
            if (a->snap_data == NULL) {
                ida_free(a);
                return NULL;
            }
        }
    }
    if (b->n_committed > 0) {
        a->entries = node_entries_copy(b->committed, b->n_committed);
        if (a->entries == NULL) {
            ida_nm_apply_free(a);
            return NULL;
        }
        a->n_entries = b->n_committed;
    }
    return a;
}

static struct ida_nm_persist *make_persist(struct raft_proc *rp,
                                           const struct ida_raft_batch *b)
{
    struct ida_nm_persist *p = ida_calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    p->batch_id = b->id;
    p->has_hard_state = b->has_hard_state;
    p->hard_state = b->hard_state;
    if (b->n_entries > 0) {
        p->entries = node_entries_copy(b->entries, b->n_entries);
        p->n_entries = b->n_entries;
    }
    if (b->has_snapshot) {
        p->has_snapshot = 1;
        p->snap_index = b->snapshot.index;
        p->snap_term = b->snapshot.term;
        p->snap_len = b->snapshot.len;
        /* The core's bytes, taken rather than copied: at 10 M allocations
         * a copy was 182 MB allocated and written on this processor while
         * the node caught up (and storage holds them already when they
         * came as a stream: it only checks their size and CRC). */
        p->snap_data = ida_raft_snapshot_take(&rp->raft, b->snapshot.index);
        if (p->snap_data == NULL) {
            p->snap_data =
                ida__rp_bytes_copy(b->snapshot.data, b->snapshot.len);
        }
        if (b->snapshot.config_len > 0) {
            p->snap_conf =
                ida__rp_bytes_copy(b->snapshot.config, b->snapshot.config_len);
            if (p->snap_conf == NULL) {
                ida_nm_persist_free(p);
                return NULL;
            }
            p->snap_conf_len = b->snapshot.config_len;
        }
    }
    if (b->n_msgs_after_persist > 0) {
        p->after =
            node_raft_msgs_copy(b->msgs_after_persist, b->n_msgs_after_persist);
        p->n_after = b->n_msgs_after_persist;
    }
    if ((b->n_entries > 0 && p->entries == NULL) ||
        (b->has_snapshot && p->snap_data == NULL) ||
        (b->n_msgs_after_persist > 0 && p->after == NULL)) {
        p->n_after = p->after == NULL ? 0 : p->n_after;
        ida_nm_persist_free(p);
        return NULL;
    }
    return p;
}

/* Debug trace of an election as this node takes part in it: the votes it
 * asks for, grants and refuses (the core decides; we only watch its
 * messages), and the answers it gets. */
static void trace_vote(const struct ida_raft_msg *m, int incoming)
{
    if (ida_log_get_level() != IDA_LOG_DEBUG) {
        return;
    }
    if (m->type == IDA_RAFT_MSG_REQUEST_VOTE) {
        const struct ida_raft_request_vote *v = &m->u.request_vote;
        IDA_DEBUG(
            "raft: %s %svote request %s node %u term=%llu "
            "last_log=%llu/%llu",
            incoming ? "got" : "sent", v->pre_vote ? "pre-" : "",
            incoming ? "from" : "to", incoming ? m->from : m->to,
            (unsigned long long)m->term, (unsigned long long)v->last_log_index,
            (unsigned long long)v->last_log_term);
    } else if (m->type == IDA_RAFT_MSG_RESPONSE_VOTE) {
        const struct ida_raft_response_vote *v = &m->u.response_vote;
        if (incoming) {
            IDA_DEBUG("raft: node %u %s our %svote request term=%llu", m->from,
                      v->granted ? "granted" : "refused",
                      v->pre_vote ? "pre-" : "", (unsigned long long)m->term);
        } else {
            IDA_DEBUG("raft: %s %svote to node %u term=%llu",
                      v->granted ? "granted" : "refused",
                      v->pre_vote ? "pre-" : "", m->to,
                      (unsigned long long)m->term);
        }
    }
}

/* Hand one batch of the core to net, storage and fsm. */
static void handle_batch(struct raft_proc *rp,
                         struct ida_sender *s,
                         const struct ida_raft_batch *b)
{
    struct ida_node *n = rp->node;
    note_soft_state(rp, s, b->role, b->leader, b->term);
    for (size_t i = 0; i < b->n_msgs; i++) {
        trace_vote(&b->msgs[i], 0);
        send_peer(rp, s, &b->msgs[i]);
    }
    for (size_t i = 0; i < b->n_msgs_after_persist; i++) {
        trace_vote(&b->msgs_after_persist[i], 0); /* sent once durable */
    }
    if (b->n_committed > 0) {
        IDA_DEBUG("raft: entries %llu..%llu committed",
                  (unsigned long long)b->committed[0].index,
                  (unsigned long long)b->committed[b->n_committed - 1].index);
    }
    if (b->has_snapshot) {
        rp->route_until = b->id;
        rp->route_snap = b->snapshot.index;
    }
    /* After a snapshot batch, the fsm must restore it (once durable)
     * before it applies anything else: route its part through storage. */
    int route = rp->route_until != 0;
    int fsm_part = b->n_committed > 0 || b->has_snapshot;
    if (b->id != 0 || (route && fsm_part)) {
        struct ida_nm_persist *p = make_persist(rp, b);
        if (p != NULL && route && fsm_part) {
            p->apply_after = make_apply(rp, b);
            if (p->apply_after == NULL) {
                ida_nm_persist_free(p);
                p = NULL;
            }
        }
        /* Without this step the core would wait forever. */
        IDA_OOM_CHECK(p != NULL, "raft: building a storage step");
        if (b->id != 0) {
            rp->persist_inflight++;
        }
        int rv = node_post(&rp->q, s, n->p_storage, IDA_NM_PERSIST, p);
        IDA_OOM_CHECK(rv == 0, "raft: posting a storage step");
    }
    if (b->has_snapshot) {
        /* Checked for an older snapshot (this batch installs another, or
         * came from a local compaction): no one will take it. */
        ida_fsm_free(rp->checked);
        rp->checked = NULL;
    }
    if (!route && b->n_committed > 0) {
        struct ida_nm_apply *a = make_apply(rp, b);
        /* The fsm must see every committed entry. */
        IDA_OOM_CHECK(a != NULL, "raft: building an apply step");
        int rv = node_post(&rp->q, s, n->p_fsm, IDA_NM_APPLY, a);
        IDA_OOM_CHECK(rv == 0, "raft: posting an apply step");
    }
    for (size_t i = 0; i < b->n_reads; i++) {
        for (size_t k = 0; k < rp->n_reads; k++) {
            if (rp->reads[k].ctx != b->reads[i].ctx) {
                continue;
            }
            struct ida_nm_read *rd = ida_malloc(sizeof(*rd));
            IDA_OOM_CHECK(rd != NULL, "raft: a read step");
            rd->conn = rp->reads[k].conn;
            rd->index = b->reads[i].index;
            rd->req = rp->reads[k].req;
            rp->reads[k] = rp->reads[--rp->n_reads];
            int rv = node_post(&rp->q, s, n->p_fsm, IDA_NM_READ, rd);
            IDA_OOM_CHECK(rv == 0, "raft: posting a read step");
            break;
        }
    }
}

/* Compacted entries freed per step of this processor (ida__rp_drive()). */
#define RELEASE_PER_STEP 256

/* Whether this node leads a follower that is catching up (snap_policy.h,
 * CATCH-UP). */
int ida__rp_follower_catching_up(struct raft_proc *rp)
{
    int behind = 0;
    if (ida_raft_role(&rp->raft) == IDA_RAFT_LEADER) {
        const struct ida_raft_conf *c = ida_raft_voters(&rp->raft);
        ida_index commit = ida_raft_commit(&rp->raft);
        uint64_t now = ida__node_mono_ms();
        for (size_t i = 0; i < c->n + c->n_learners && !behind; i++) {
            ida_node_id id = i < c->n ? c->voters[i] : c->learners[i - c->n];
            const struct ida_raft_progress *p =
                ida_raft_progress_of(&rp->raft, id);
            behind = id != rp->node->self->id && p != NULL &&
                     ida_snap_follower_behind(&rp->snap_peers, id,
                                              p->state == IDA_RAFT_SNAPSHOT,
                                              p->match, commit, now);
        }
    }
    return behind;
}

/* Publish it for the fsm's wait before a snapshot's fork. */
static void catchup_publish(struct raft_proc *rp)
{
    atomic_store(&rp->node->follower_behind, ida__rp_follower_catching_up(rp));
}

void ida__rp_drive(struct raft_proc *rp, struct ida_sender *s)
{
    struct ida_raft_batch b;
    while (ida_raft_ready(&rp->raft, &b)) {
        handle_batch(rp, s, &b);
    }
    note_soft_state(rp, s, ida_raft_role(&rp->raft), ida_raft_leader(&rp->raft),
                    ida_raft_term(&rp->raft));
    /* What a snapshot compacted, a piece at a time (raft.h, MEMORY): some
     * 50 us a call at most. */
    (void)ida_raft_release(&rp->raft, RELEASE_PER_STEP);
    ida_metrics_raft(rp->node->metrics, rp->term, ida__rp_role_name(rp),
                     rp->leader, ida_raft_commit(&rp->raft),
                     rp->raft.snap_index + 1, ida_raft_last_index(&rp->raft));
}

/* --- group commit
 * -----------------------------------------------------------------
 * GATE. Writes that come in while the last batch is on its way wait in
 * the open batch and go together into the next entry: the fewer and
 * bigger the entries, the fewer the messages, records and wake-ups per
 * write on every node (two cores shared by three nodes and their clients
 * are CPU-bound). The open batch goes once no storage step is in flight
 * and the entry of the last one is committed (it is also what a single
 * client waits for, so it never waits here), or once it is full; a tick
 * sends it regardless of the commit (a leader that cannot commit answers
 * its writes as before: unknown, once it loses its leadership). */
static bool open_may_go(const struct raft_proc *rp)
{
    return rp->persist_inflight == 0 &&
           ida_raft_commit(&rp->raft) >= rp->open_gate;
}

static void flush_open(struct raft_proc *rp, struct ida_sender *s)
{
    if (rp->n_open == 0) {
        return;
    }
    Idalloc__CommandBatch batch = IDALLOC__COMMAND_BATCH__INIT;
    Idalloc__Command *cmds = ida_calloc(rp->n_open, sizeof(*cmds));
    Idalloc__Command **ptrs = ida_calloc(rp->n_open, sizeof(*ptrs));
    uint8_t *buf = NULL;
    int rv = cmds == NULL || ptrs == NULL ? IDA_ENOMEM : 0;
    for (size_t i = 0; rv == 0 && i < rp->n_open; i++) {
        const Idalloc__ClientRequest *q = rp->open[i];
        Idalloc__Command *c = &cmds[i];
        idalloc__command__init(c);
        node_request_to_command(q, c);
        ptrs[i] = c;
    }
    size_t len = 0;
    if (rv == 0) {
        batch.version = IDA_BATCH_VERSION;
        batch.timestamp_ms = ida__node_wall_ms();
        batch.commands = ptrs;
        batch.n_commands = rp->n_open;
        len = idalloc__command_batch__get_packed_size(&batch);
        buf = ida_malloc(len > 0 ? len : 1);
        rv = buf == NULL ? IDA_ENOMEM : 0;
    }
    if (rv == 0) {
        idalloc__command_batch__pack(&batch, buf);
        ida_index idx;
        ida_term term;
        rv = ida_raft_propose(&rp->raft, IDA_ENTRY_NORMAL, buf, len, &idx,
                              &term);
        rp->open_gate = rv == 0 ? idx : rp->open_gate;
        for (size_t i = 0;
             rv == 0 && ida_log_get_level() == IDA_LOG_DEBUG && i < rp->n_open;
             i++) {
            char name[IDA_NODE_REQ_NAME_MAX];
            ida__node_req_name(rp->open[i]->client_id.data,
                               rp->open[i]->client_id.len,
                               rp->open[i]->request_seq, name);
            IDA_DEBUG("req %s: proposed in entry %llu term=%llu (%zu commands)",
                      name, (unsigned long long)idx, (unsigned long long)term,
                      rp->n_open);
        }
    }
    if (rv != 0) {
        /* Not proposed: the fsm answers the registered writes. */
        IDA_WARN("raft: proposal of %zu commands failed: %s", rp->n_open,
                 idalloc_strerror(rv));
        ida_metrics_proposal_failed(rp->node->metrics);
        ida_sender_error(s, rv,
                         "a proposal failed (writes answered as "
                         "unknown)");
        lose_writes(rp, s);
    }
    for (size_t i = 0; i < rp->n_open; i++) {
        idalloc__client_request__free_unpacked(rp->open[i], NULL);
    }
    rp->n_open = 0;
    rp->open_bytes = 0;
    ida_free(buf);
    ida_free(cmds);
    ida_free(ptrs);
    ida__rp_drive(rp, s);
}

/* --- client requests
 * -------------------------------------------------------------- */

static int is_write(Idalloc__ClientRequest__OpCase op)
{
    return op == IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE ||
           op == IDALLOC__CLIENT_REQUEST__OP_ALLOC ||
           op == IDALLOC__CLIENT_REQUEST__OP_FREE ||
           op == IDALLOC__CLIENT_REQUEST__OP_RESERVE ||
           op == IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC ||
           op == IDALLOC__CLIENT_REQUEST__OP_RESTORE ||
           op == IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT;
}

static int is_member_op(Idalloc__ClientRequest__OpCase op)
{
    return op == IDALLOC__CLIENT_REQUEST__OP_MEMBER_LIST ||
           op == IDALLOC__CLIENT_REQUEST__OP_MEMBER_CHANGE ||
           op == IDALLOC__CLIENT_REQUEST__OP_LEADER_TRANSFER;
}

static void ask_read(struct raft_proc *rp, struct pending_read *pr)
{
    int rv = ida_raft_read_index(&rp->raft, pr->ctx);
    pr->asked = rv == 0;
    /* IDA_EBUSY: no entry of this term committed yet; asked again on the
     * next tick. Other errors are answered there too (not leader). */
}

static void add_read(struct raft_proc *rp,
                     uint64_t conn,
                     Idalloc__ClientRequest *req)
{
    if (rp->n_reads == rp->cap_reads) {
        size_t cap = rp->cap_reads == 0 ? 64 : rp->cap_reads * 2;
        struct pending_read *v = ida_realloc(rp->reads, cap * sizeof(*v));
        if (v == NULL) {
            reply_error(rp, conn, req->request_seq, IDA_EBUSY, NULL);
            idalloc__client_request__free_unpacked(req, NULL);
            return;
        }
        rp->reads = v;
        rp->cap_reads = cap;
    }
    struct pending_read *pr = &rp->reads[rp->n_reads++];
    *pr =
        (struct pending_read){.ctx = ++rp->next_ctx, .conn = conn, .req = req};
    ask_read(rp, pr);
}

static int add_write(struct raft_proc *rp,
                     struct ida_sender *s,
                     uint64_t conn,
                     Idalloc__ClientRequest *req)
{
    if (rp->n_open == rp->cap_open) {
        size_t cap = rp->cap_open == 0 ? 256 : rp->cap_open * 2;
        Idalloc__ClientRequest **v = ida_realloc(rp->open, cap * sizeof(*v));
        if (v == NULL) {
            return IDA_EBUSY;
        }
        rp->open = v;
        rp->cap_open = cap;
    }
    struct ida_nm_register *reg = ida_malloc(sizeof(*reg));
    if (reg == NULL) {
        return IDA_EBUSY;
    }
    memcpy(reg->client_id, req->client_id.data, 16);
    reg->request_seq = req->request_seq;
    reg->conn = conn;
    if (node_post(&rp->q, s, rp->node->p_fsm, IDA_NM_REGISTER, reg) != 0) {
        return IDA_EBUSY; /* nobody would answer it: the client retries */
    }
    rp->open[rp->n_open++] = req;
    rp->open_bytes += idalloc__client_request__get_packed_size(req);
    return 0;
}

static void on_client(struct raft_proc *rp,
                      struct ida_sender *s,
                      struct ida_nm_client *c)
{
    Idalloc__ClientRequest *req = c->req;
    uint64_t seq = req->request_seq;
    ida_metrics_request_begin(rp->node->metrics, c->conn, seq,
                              ida_metrics_op_of(req->op_case));
    int err = 0;
    const char *why = NULL;
    char name[IDA_NODE_REQ_NAME_MAX] = "";
    if (ida_log_get_level() == IDA_LOG_DEBUG) {
        ida__node_req_name(req->client_id.data, req->client_id.len, seq, name);
        IDA_DEBUG("req %s: received (%s) on connection %llu", name,
                  is_write(req->op_case) ? "write" : "read/status",
                  (unsigned long long)c->conn);
    }
    if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_STATUS) {
        ida__rp_reply_status(rp, c->conn, seq);
    } else if (req->op_case == IDALLOC__CLIENT_REQUEST__OP__NOT_SET) {
        err = IDA_EINVAL;
        why = "request has no operation";
    } else if ((err = node_request_check(req, &why)) != 0) {
        /* Refused at the door: never in the log, never read. */
    } else if (rp->role != IDA_RAFT_LEADER) {
        err = IDA_ENOTLEADER;
    } else if (req->client_id.len != IDA_CLIENT_ID_BYTES) {
        err = IDA_EINVAL;
        why = "client_id must be 16 bytes";
    } else if (is_member_op(req->op_case)) {
        node_members_request(&rp->mem, rp->node, &rp->raft, c->conn, req);
    } else if (!is_write(req->op_case)) {
        add_read(rp, c->conn, req);
        req = NULL;
    } else if (rp->storage_failed) {
        err = IDA_ESTOPPED;
        why = "this node cannot persist; try another node";
    } else if (req->op_case == IDALLOC__CLIENT_REQUEST__OP_RESTORE &&
               strcmp(req->restore->from_cluster, rp->node->cfg.cluster) == 0) {
        /* A restore makes a new cluster: a backup of this very cluster
         * would bring back ids it may have handed out since. */
        err = IDA_EINVAL;
        why =
            "this backup was taken from this cluster; restore it into a "
            "new cluster with another name";
    } else if ((err = add_write(rp, s, c->conn, req)) == 0) {
        req = NULL;
        if (open_may_go(rp) || rp->n_open >= OPEN_COMMANDS_MAX ||
            rp->open_bytes >= OPEN_BYTES_MAX) {
            flush_open(rp, s);
        }
    }
    if (err != 0) {
        IDA_DEBUG("req %s: answered %s%s%s", name, idalloc_errname(err),
                  err == IDA_ENOTLEADER ? ", leader=" : "",
                  err == IDA_ENOTLEADER
                      ? (rp->leader != 0 ? "known" : "unknown")
                      : "");
        reply_refusal(
            rp, c->conn, seq, err, why,
            err == IDA_ENOTLEADER && req != NULL &&
                req->op_case == IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT);
    }
    if (req != NULL) {
        idalloc__client_request__free_unpacked(req, NULL);
    }
    ida_free(c);
    ida__rp_drive(rp, s); /* a ReadIndex round's heartbeats go out now */
}

/* --- the processor
 * ------------------------------------------------------------- */

/* Rule A4 of raft/admission.h: a peer showed that this node's state went
 * back to an older copy of its directory. The core takes no part any more;
 * storage marks the directory untrusted and the node stops. */
static void on_rolled_back(struct raft_proc *rp, struct ida_sender *s)
{
    struct ida_raft_rollback rb;
    if (rp->rolled_back || !ida_raft_rolled_back(&rp->raft, &rb)) {
        return;
    }
    rp->rolled_back = true;
    static const char *const what[] = {"", "a later start (boot id)",
                                       "a higher durable term",
                                       "an acknowledged log index"};
    struct ida_nm_untrusted *u = ida_calloc(1, sizeof(*u));
    char why[sizeof(((struct ida_nm_untrusted *)0)->why)];
    snprintf(why, sizeof(why),
             "its state went back to an older copy: node %u heard %s %llu "
             "from this incarnation, which holds %llu",
             (unsigned)rb.by, what[rb.kind], (unsigned long long)rb.told,
             (unsigned long long)rb.have);
    IDA_ERROR(
        "raft: data directory %s: %s; this node takes no part any "
        "more",
        rp->node->dir, why);
    ida_sender_error(s, IDA_ELOSTSTATE, "state went back to an older copy");
    if (u == NULL) {
        rp->node->exit_status = 1;
        kill(getpid(), SIGTERM); /* nothing marked: the log line says why */
        return;
    }
    snprintf(u->why, sizeof(u->why), "%s", why);
    node_post(&rp->q, s, rp->node->p_storage, IDA_NM_UNTRUSTED, u);
}

/* Publish what peers said of their snapshots, as of @now (ms). */
static void snap_peers_publish(struct raft_proc *rp, uint64_t now)
{
    atomic_store(&rp->node->peers_snap_relay,
                 ida_snap_peers_relay_word(&rp->snap_peers, now));
    atomic_store(&rp->node->peers_snap_any,
                 ida_snap_peers_busy(&rp->snap_peers, now, 0));
}

static void on_peer(struct raft_proc *rp,
                    struct ida_sender *s,
                    Idalloc__PeerMessage *pb)
{
    struct ida_raft_msg m;
    struct ida_entry *entries = NULL;
    node_members_heard(
        &rp->mem, pb->from, pb->from_incarnation,
        pb->msg_case == IDALLOC__PEER_MESSAGE__MSG_HELLO ? pb->hello : NULL);
    if (pb->msg_case == IDALLOC__PEER_MESSAGE__MSG_HELLO) {
        ida__rp_on_hello(rp, s, pb);
    } else if (rp->mem.seeded) {
        /* Takes no part until the cluster it was seeded with may start,
         * and a node that speaks Raft to it holds a membership (import.h). */
        node_seed_evidence(&rp->mem, rp->node, pb->from, pb->from_incarnation,
                           ida__node_mono_ms());
    } else if (rp->mem.joining) {
        /* Takes no part until it knows the cluster (member.h). */
    } else if (node_pb_to_raft(pb, &m, &entries) == 0) {
        trace_vote(&m, 1);
        struct rcv_mark before;
        before.len = ida_raft_receiving(&rp->raft, &before.index, &before.term);
        before.snap = ida_raft_snapshot_index(&rp->raft);
        int rv = ida_raft_step(&rp->raft, &m);
        if (rv == 0 && m.type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
            ida__rp_stream_chunk(rp, s, &m.u.install_snapshot, &before);
        }
        const struct ida_raft_conf *cf = ida_raft_voters(&rp->raft);
        if (rv == 0 && m.term == ida_raft_term(&rp->raft) &&
            ida_raft_conf_has(cf, pb->from)) {
            /* Only a member's message at our term that the core took
             * counts, a relay only on an append of the leader we follow
             * (snap_policy.h, TURNS). */
            uint64_t now = ida__node_mono_ms();
            ida_snap_peers_heard(&rp->snap_peers, pb->from, pb->snapshotting,
                                 m.type == IDA_RAFT_MSG_APPEND_ENTRIES &&
                                     pb->from == ida_raft_leader(&rp->raft) &&
                                     pb->peer_snapshotting,
                                 now);
            snap_peers_publish(rp, now);
        }
        if (rv == IDA_EFOREIGN) {
            ida__rp_note_incarnation(rp, pb->from, pb->from_incarnation);
        }
        if (rv == IDA_ELOSTSTATE) {
            on_rolled_back(rp, s);
        }
        if (rv == IDA_EPROTO) {
            IDA_ERROR("raft: peer %u broke the protocol (message ignored)",
                      pb->from);
            ida_sender_error(s, rv, "peer message broke the Raft protocol");
        } else if (rv == IDA_EINVAL) {
            /* Counted in the error top (status --verbose), not logged per
             * message: a flood of them must not flood the log. */
            ida_sender_error(s, rv, "peer message failed a field check");
        }
    }
    ida_free(entries);
    idalloc__peer_message__free_unpacked(pb, NULL);
    ida__rp_drive(rp, s);
    if (open_may_go(rp)) {
        flush_open(rp, s); /* an acknowledgement committed the last */
    }
}

static void on_persisted(struct raft_proc *rp,
                         struct ida_sender *s,
                         const struct ida_nm_persisted *p)
{
    ida_raft_persisted(&rp->raft, p->batch_id);
    IDA_ASSERT(rp->persist_inflight > 0);
    rp->persist_inflight--;
    if (rp->route_until != 0 && p->batch_id >= rp->route_until) {
        rp->route_until = 0;
        /* The installed snapshot is durable: storage has its bytes. */
        ida_raft_snapshot_stored(&rp->raft, rp->route_snap);
    }
    ida__rp_drive(rp, s);
    if (open_may_go(rp)) {
        flush_open(rp, s); /* group commit: what came in meanwhile */
    }
}

static void on_storage_failed(struct raft_proc *rp,
                              struct ida_sender *s,
                              const struct ida_nm_storage_failed *f)
{
    if (!rp->storage_failed) {
        IDA_ERROR("raft: storage failed (%s): refusing writes", f->msg);
        ida_sender_error(s, f->code, f->msg);
    }
    rp->storage_failed = 1;
    if (rp->role == IDA_RAFT_LEADER) {
        /* Hand leadership to the most up-to-date peer. */
        ida_node_id best = 0;
        ida_index best_match = 0;
        const struct ida_raft_conf *c = ida_raft_voters(&rp->raft);
        for (size_t i = 0; i < c->n; i++) {
            const struct ida_raft_progress *p =
                ida_raft_progress_of(&rp->raft, c->voters[i]);
            if (p != NULL && p->id != rp->node->self->id &&
                p->match >= best_match) {
                best = p->id;
                best_match = p->match;
            }
        }
        if (best != 0) {
            ida_raft_transfer(&rp->raft, best);
        }
    }
    ida__rp_drive(rp, s);
}

static void raft_receive(void *state, struct ida_msg *msg, struct ida_sender *s)
{
    struct raft_proc *rp = state;
    void *p = node_msg_payload(msg);
    node_outq_flush(&rp->q, s);
    switch ((enum node_msg_type)msg->type) {
        case IDA_NM_CLIENT:
            on_client(rp, s, p);
            break;
        case IDA_NM_PEER:
            on_peer(rp, s, p);
            break;
        case IDA_NM_PERSISTED:
            on_persisted(rp, s, p);
            ida_free(p);
            break;
        case IDA_NM_APPLIED: {
            const struct ida_nm_applied *a = p;
            rp->applied = a->index;
            rp->snapshot_index = a->snapshot_index;
            ida_free(p);
            break;
        }
        case IDA_NM_SNAPSHOT_TAKEN:
            ida__rp_snapshot_taken(rp, s, msg);
            ida__rp_drive(rp, s);
            return;
        case IDA_NM_SNAPSHOT_STORED: {
            /* Durable: the log it covers goes from memory, and its bytes
             * stay in storage only (raft.h contract 7). IDA_EINVAL: the
             * core has a newer snapshot meanwhile (installed from the
             * leader). */
            const struct ida_nm_snapshot *sn = p;
            int rv = ida_raft_compact(&rp->raft, sn->index, NULL, sn->len);
            if (rv != 0 && rv != IDA_EINVAL) {
                IDA_WARN("raft: compaction at %llu failed: %s",
                         (unsigned long long)sn->index, idalloc_strerror(rv));
            }
            node_msg_free(msg);
            ida__rp_drive(rp, s);
            return;
        }
        case IDA_NM_STORAGE_FAILED:
            on_storage_failed(rp, s, p);
            ida_free(p);
            break;
        case IDA_NM_MEMBERSHIP0_DONE:
            ida__rp_on_membership0_done(rp, p);
            node_msg_free(msg);
            ida__rp_drive(rp, s);
            return;
        default:
            node_msg_free(msg);
            return;
    }
    ida_msg_free(msg);
}

/* Ticks (raft_proc.h, ida__raft_ticks_due()): the ones this processor ran
 * too late to see, by half an election timeout or more, are forgotten. It
 * was busy (a long step of its own) or not run (an overloaded machine, a
 * paused process); caught up, a leader would judge check-quorum, and a
 * follower its election timeout, before reading the answers and
 * heartbeats waiting in its inbox (the pool runs a processor's ping
 * before its messages), and step down or campaign on a healthy cluster.
 * Smaller delays are caught up as before, so heartbeats keep their pace
 * when pings merely run a little late under load. Raft's safety does not
 * depend on ticks (reads use ReadIndex), only how soon a dead leader is
 * replaced, and a process that ran late learns of any newer term from its
 * inbox. */
#define LATE_WARN_EVERY_MS 10000

uint64_t ida__raft_ticks_due(uint64_t *last,
                             uint64_t now,
                             unsigned tick_ms,
                             unsigned drop_ms,
                             uint64_t *late_ms)
{
    *late_ms = 0;
    if (*last == 0 || now < *last) {
        *last = now; /* the first look */
        return 0;
    }
    uint64_t due = (now - *last) / tick_ms;
    if (due >= 1 && now - *last - tick_ms >= drop_ms) {
        *late_ms = now - *last - tick_ms;
        *last = now;
        return 1;
    }
    *last += due * tick_ms;
    return due;
}

static void tick_due(struct raft_proc *rp, uint64_t now)
{
    uint64_t late;
    unsigned drop_ms = rp->node->cfg.election_timeout_ms / 2;
    if (rp->mem.seeded) {
        rp->last_tick_ms = now; /* no campaign yet (src/node/import.h) */
        return;
    }
    uint64_t n = ida__raft_ticks_due(&rp->last_tick_ms, now, rp->tick_ms,
                                     drop_ms > 0 ? drop_ms : 1, &late);
    if (late > 0) {
        rp->late_ms_total += late;
        if (now - rp->late_warned_ms >= LATE_WARN_EVERY_MS) {
            rp->late_warned_ms = now;
            IDA_WARN(
                "raft: ticks ran %llu ms late (one is due every %u ms; "
                "%llu ms late in all since start): this processor was busy "
                "(a long step) or not run (an overloaded machine, a paused "
                "process); the lost "
                "time does not count toward elections",
                (unsigned long long)late, rp->tick_ms,
                (unsigned long long)rp->late_ms_total);
        }
    }
    for (uint64_t i = 0; i < n; i++) {
        ida_raft_tick(&rp->raft);
    }
}

static void raft_ping(void *state, struct ida_sender *s)
{
    struct raft_proc *rp = state;
    node_outq_flush(&rp->q, s);
    ida__rp_check_poll(rp, s);
    uint64_t now = ida__node_mono_ms();
    tick_due(rp, now);
    snap_peers_publish(rp, now); /* reports not renewed expire */
    ida__rp_book_refresh(rp);
    if (rp->mem.joining || rp->mem.seeded || !ida_raft_admitted(&rp->raft) ||
        rp->mem.self_moved) {
        ida__rp_hello_all(rp, s, now);
    }
    if (!rp->mem.joining) {
        node_members_track(&rp->mem, rp->node, &rp->raft);
    }
    ida__rp_rejoin_step(rp, now);
    ida__rp_drive(rp, s);
    node_members_settle(&rp->mem, rp->node, &rp->raft);
    /* Reads that could not start yet, or whose leader is gone. */
    for (size_t i = 0; i < rp->n_reads; i++) {
        if (!rp->reads[i].asked) {
            if (rp->role != IDA_RAFT_LEADER) {
                fail_reads(rp, IDA_ENOTLEADER);
                break;
            }
            ask_read(rp, &rp->reads[i]);
        }
    }
    if (rp->persist_inflight == 0) {
        flush_open(rp, s);
    }
    ida__rp_held_step(rp, s);
    ida__rp_drive(rp, s);
    catchup_publish(rp); /* a tick's news is soon enough for a snapshot */
}

const struct ida_proc_ops ida__raft_proc_ops = {raft_receive, raft_ping};

int ida__raft_proc_new(struct ida_node *n,
                       const struct ida_raft_restore *r,
                       struct raft_proc **out)
{
    struct raft_proc *rp = ida_calloc(1, sizeof(*rp));
    if (rp == NULL) {
        return IDA_ENOMEM;
    }
    rp->node = n;
    rp->tick_ms = ida__raft_proc_tick_ms(n);
    struct ida_raft_config rc = {
        .id = n->self->id,
        .election_ticks = n->cfg.election_timeout_ms / rp->tick_ms,
        .heartbeat_ticks = n->cfg.heartbeat_ms / rp->tick_ms,
        .seed = ida__node_wall_ms() ^ ((uint64_t)n->self->id << 48),
        .pre_vote = true,
        .check_quorum = true,
        .max_inflight = 32,
        /* Appends carry up to 1,024 entries or 1 MiB of them: a follower
         * that catches up (a restart, a new node after its snapshot) gets
         * fewer, larger appends, each one storage step; the byte cap keeps
         * every append inside a peer frame (IDA_FRAME_PAYLOAD_BYTES_DEFAULT,
         * 4 MiB: before it, 256 entries of over 16 KB each made an append
         * net refused, ETOOBIG, and the follower waited for a snapshot),
         * and max_inflight of them within net's queue to a peer (64 MiB). */
        .max_msg_entries = APPEND_ENTRIES_MAX,
        .max_msg_bytes = APPEND_BYTES_MAX,
        .max_append_burst = APPEND_BURST,
        .snapshot_chunk_bytes = SNAPSHOT_CHUNK_BYTES,
        .snapshot_max_inflight = SNAPSHOT_CHUNKS_INFLIGHT,
        .conf_decode = node_conf_decode,
        .snapshot_check = ida__rp_snapshot_check,
        .snapshot_check_arg = rp,
    };
    if (rc.heartbeat_ticks == 0) {
        rc.heartbeat_ticks = 1;
    }
    if (rc.election_ticks < 2 * rc.heartbeat_ticks) {
        rc.election_ticks = 2 * rc.heartbeat_ticks;
    }
    int rv = ida__rp_first_voters(rp, &rc);
    if (rv == 0) {
        rv = ida_raft_init(&rp->raft, &rc, r);
    }
    if (rv != 0) {
        ida_free(rp);
        return rv;
    }
    rp->base = rc;
    for (unsigned i = 0; i < n->cfg.node_count; i++) {
        if (n->cfg.nodes[i].id == n->self->id) {
            rp->mem.heard[i] = rp->mem.fresh[i] = true;
            rp->mem.inc[i] = n->incarnation;
        }
    }
    rp->applied = r != NULL ? r->snapshot_index : 0;
    rp->snapshot_index = rp->applied;
    rp->last_tick_ms = 0; /* set by the first ping (the pool's start) */
    rp->role = ida_raft_role(&rp->raft);
    rp->term = ida_raft_term(&rp->raft);
    *out = rp;
    return 0;
}

void ida__raft_proc_free(struct raft_proc *rp)
{
    if (rp == NULL) {
        return;
    }
    for (size_t i = 0; i < rp->n_open; i++) {
        idalloc__client_request__free_unpacked(rp->open[i], NULL);
    }
    for (size_t i = 0; i < rp->n_reads; i++) {
        idalloc__client_request__free_unpacked(rp->reads[i].req, NULL);
    }
    ida_free(rp->open);
    ida_free(rp->reads);
    int rv;
    ida__snap_stream_stop(rp->stream);
    node_msg_free(rp->held); /* the log it covers stays */
    (void)ida__rp_check_take(rp, true,
                             &rv); /* before the core frees its bytes */
    ida_fsm_free(rp->checked);     /* accepted, never installed */
    node_outq_close(&rp->q);
    node_members_close(&rp->mem);
    ida_raft_close(&rp->raft);
    ida_free(rp);
}
