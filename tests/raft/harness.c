/* The unit-test cluster. Contract: tests/raft/harness.h.
 *
 * The harness allocates with libc malloc, not ida_malloc: tests arm
 * ida_heap_fault_set() to fail the core's allocations, not the harness's. */
#include "tests/raft/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "idalloc_errors.h"
#include "raft/testing.h"
#include "src/node/convert.h"

struct h_cluster H;

struct pkt
{
    struct ida_raft_msg m;
    struct ida_entry *ents;
    uint8_t *blob;
    uint8_t *conf; /* InstallSnapshot config bytes */
};

#define QUEUE_MAX 4096
static struct pkt queue[QUEUE_MAX];
static size_t q_head, q_len;

struct held
{
    ida_node_id node;
    uint64_t id;
    struct ida_hard_state hs;
    bool has_hs;
    struct pkt msgs[32];
    size_t n_msgs;
    struct ida_entry ents[64];
    size_t n_ents;
    bool has_snap;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap;
    size_t snap_len;
};

#define HELD_MAX 64
static struct held held[HELD_MAX];
static size_t n_held;

static uint8_t *dup_bytes(const uint8_t *p, size_t len)
{
    if (len == 0) {
        return NULL;
    }
    uint8_t *d = malloc(len);
    IDA_ASSERT(d != NULL);
    memcpy(d, p, len);
    return d;
}

static void pkt_copy(struct pkt *p, const struct ida_raft_msg *m)
{
    memset(p, 0, sizeof(*p));
    p->m = *m;
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
        m->u.append_entries.n_entries > 0) {
        size_t n = m->u.append_entries.n_entries;
        p->ents = calloc(n, sizeof(*p->ents));
        IDA_ASSERT(p->ents != NULL);
        for (size_t i = 0; i < n; i++) {
            p->ents[i] = m->u.append_entries.entries[i];
            p->ents[i].data = dup_bytes(m->u.append_entries.entries[i].data,
                                        m->u.append_entries.entries[i].len);
        }
        p->m.u.append_entries.entries = p->ents;
    }
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
        p->blob =
            dup_bytes(m->u.install_snapshot.data, m->u.install_snapshot.len);
        p->m.u.install_snapshot.data = p->blob;
        p->conf = dup_bytes(m->u.install_snapshot.config,
                            m->u.install_snapshot.config_len);
        p->m.u.install_snapshot.config = p->conf;
    }
}

static void pkt_free(struct pkt *p)
{
    if (p->ents != NULL) {
        for (size_t i = 0; i < p->m.u.append_entries.n_entries; i++) {
            free(p->ents[i].data);
        }
    }
    free(p->ents);
    free(p->blob);
    free(p->conf);
    p->conf = NULL;
    memset(p, 0, sizeof(*p));
}

static void enqueue(const struct ida_raft_msg *m)
{
    if (H.cut[m->from][m->to] || !H.up[m->from]) {
        return;
    }
    struct ida_raft_msg filled;
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        m->u.install_snapshot.data == NULL && m->u.install_snapshot.len > 0) {
        /* The node fills it from what it stored (contract 7). */
        const struct h_disk *d = &H.disk[m->from];
        const struct ida_raft_install_snapshot *is = &m->u.install_snapshot;
        if (d->snap_index != is->last_index || d->snap_term != is->last_term ||
            d->snap_len != is->total_size ||
            is->offset + is->len > d->snap_len) {
            H.chunks_unfilled++;
            return;
        }
        filled = *m;
        filled.u.install_snapshot.data = d->snap + is->offset;
        m = &filled;
    }
    IDA_ASSERT(q_len < QUEUE_MAX);
    struct pkt *p = &queue[(q_head + q_len) % QUEUE_MAX];
    pkt_copy(p, m);
    q_len++;
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
        m->u.append_entries.n_entries > 0) {
        H.appends_sent++;
        if (m->to <= H_NODES_MAX) {
            H.appends_to[m->to]++;
        }
        if (m->u.append_entries.n_entries > H.max_entries_in_msg) {
            H.max_entries_in_msg = m->u.append_entries.n_entries;
        }
    }
}

static void disk_clear(struct h_disk *d, size_t from)
{
    for (size_t i = from; i < d->n; i++) {
        free(d->ents[i].data);
    }
    if (from < d->n) {
        d->n = from;
    }
}

static void disk_write(struct h_disk *d, struct held *w)
{
    if (w->has_hs) {
        d->hs = w->hs;
    }
    if (w->has_snap) {
        free(d->snap);
        d->snap = w->snap;
        w->snap = NULL;
        d->snap_len = w->snap_len;
        d->snap_index = w->snap_index;
        d->snap_term = w->snap_term;
        disk_clear(d, 0);
    }
    if (w->n_ents > 0) {
        ida_index first = w->ents[0].index;
        IDA_ASSERT(first <= d->snap_index + d->n + 1);
        IDA_ASSERT(first > d->snap_index);
        disk_clear(d, (size_t)(first - d->snap_index - 1));
        for (size_t i = 0; i < w->n_ents; i++) {
            IDA_ASSERT(d->n < 512);
            d->ents[d->n++] = w->ents[i];
            w->ents[i].data = NULL;
        }
    }
}

static void held_free(struct held *w)
{
    for (size_t i = 0; i < w->n_msgs; i++) {
        pkt_free(&w->msgs[i]);
    }
    for (size_t i = 0; i < w->n_ents; i++) {
        free(w->ents[i].data);
    }
    free(w->snap);
    memset(w, 0, sizeof(*w));
}

static void persist(struct held *w)
{
    disk_write(&H.disk[w->node], w);
    for (size_t i = 0; i < w->n_msgs; i++) {
        enqueue(&w->msgs[i].m);
    }
    ida_raft_persisted(&H.r[w->node], w->id);
    held_free(w);
}

void h_init(int n)
{
    h_close();
    memset(&H, 0, sizeof(H));
    H.n = n;
    H.pre_vote = true;
    H.check_quorum = true;
    H.max_msg_entries = 64;
}

int h_compact_stored(ida_node_id id,
                     ida_index index,
                     const uint8_t *data,
                     size_t len)
{
    const uint8_t *conf;
    size_t clen;
    int rv = ida_raft_config_at(&H.r[id], index, &conf, &clen);
    if (rv != 0) {
        return rv;
    }
    struct h_disk *d = &H.disk[id];
    /* The disk's log starts after its snapshot. */
    size_t drop = (size_t)(index - d->snap_index);
    drop = drop < d->n ? drop : d->n;
    for (size_t i = 0; i < drop; i++) {
        free(d->ents[i].data);
    }
    memmove(d->ents, d->ents + drop, (d->n - drop) * sizeof(d->ents[0]));
    d->n -= drop;
    free(d->snap);
    d->snap = dup_bytes(data, len);
    d->snap_len = len;
    d->snap_index = index;
    d->snap_term = ida_raft_term_at(&H.r[id], index);
    return ida_raft_compact(&H.r[id], index, NULL, len);
}

void h_start(ida_node_id id)
{
    struct ida_raft_config cfg = {
        .id = id,
        .n_voters = (size_t)H.n,
        .election_ticks = 10,
        .heartbeat_ticks = 1,
        .seed = id * 7919,
        .pre_vote = H.pre_vote,
        .check_quorum = H.check_quorum,
        .max_inflight = 4,
        .max_msg_entries = H.max_msg_entries,
        .max_msg_bytes = H.max_msg_bytes,
        .max_append_burst = H.max_append_burst,
        .snapshot_chunk_bytes = 8,
        .snapshot_max_inflight = H.snapshot_max_inflight,
        .conf_decode = node_conf_decode,
    };
    cfg.n_voters = (size_t)(H.bootstrap_n ? H.bootstrap_n : H.n);
    for (size_t k = 0; k < cfg.n_voters; k++) {
        cfg.voters[k] = (ida_node_id)(k + 1);
        cfg.voter_inc[k] = H.bind_incs ? H.boot_inc[k + 1] : 0;
    }
    cfg.incarnation = H.inc[id];
    struct h_disk *d = &H.disk[id];
    if (!H.no_boots) {
        d->boots++; /* counted durably before the node sends anything */
        cfg.boot = d->boots << 32 | (++H.nonce_seq * 2654435761u | 1u);
    }
    struct ida_raft_restore st = {
        .hard_state = d->hs,
        .snapshot_index = d->snap_index,
        .snapshot_term = d->snap_term,
        .snapshot_data = H.snap_in_storage ? NULL : d->snap,
        .snapshot_in_storage = H.snap_in_storage && d->snap_index > 0,
        .snapshot_len = d->snap_len,
        .entries = d->ents,
        .n_entries = d->n,
    };
    int rv = ida_raft_init(&H.r[id], &cfg, &st);
    IDA_ASSERT(rv == 0);
    ida_raft_testing_set_bugs(&H.r[id], H.bugs);
    H.up[id] = true;
    H.applied[id] = d->snap_index;
}

void h_start_all(void)
{
    for (int k = 1; k <= H.n; k++) {
        h_start((ida_node_id)k);
    }
}

void h_crash(ida_node_id id)
{
    size_t k = 0;
    for (size_t i = 0; i < n_held; i++) {
        if (held[i].node == id) {
            held_free(&held[i]);
        } else {
            held[k++] = held[i];
        }
    }
    n_held = k;
    ida_raft_close(&H.r[id]);
    H.up[id] = false;
    H.hold[id] = false;
}

void h_wipe(ida_node_id id, uint64_t inc)
{
    if (H.up[id]) {
        h_crash(id);
    }
    struct h_disk *d = &H.disk[id];
    for (size_t i = 0; i < d->n; i++) {
        free(d->ents[i].data);
    }
    free(d->snap);
    memset(d, 0, sizeof(*d));
    H.inc[id] = inc;
}

static void disk_dup(struct h_disk *out, const struct h_disk *d)
{
    *out = *d;
    out->snap = dup_bytes(d->snap, d->snap_len);
    for (size_t i = 0; i < d->n; i++) {
        out->ents[i].data = dup_bytes(d->ents[i].data, d->ents[i].len);
    }
}

void h_disk_free(struct h_disk *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->ents[i].data);
    }
    free(d->snap);
    memset(d, 0, sizeof(*d));
}

void h_disk_copy(ida_node_id id, struct h_disk *out)
{
    disk_dup(out, &H.disk[id]);
}

void h_disk_restore(ida_node_id id, const struct h_disk *copy)
{
    if (H.up[id]) {
        h_crash(id);
    }
    h_disk_free(&H.disk[id]);
    disk_dup(&H.disk[id], copy);
}

void h_close(void)
{
    h_drop_all();
    for (size_t i = 0; i < n_held; i++) {
        held_free(&held[i]);
    }
    n_held = 0;
    for (int k = 1; k <= H.n; k++) {
        if (H.up[k]) {
            ida_raft_close(&H.r[k]);
            H.up[k] = false;
        }
        disk_clear(&H.disk[k], 0);
        free(H.disk[k].snap);
        H.disk[k].snap = NULL;
    }
}

void h_collect(ida_node_id id)
{
    struct ida_raft_batch b;
    while (H.up[id] && ida_raft_ready(&H.r[id], &b)) {
        for (size_t i = 0; i < b.n_msgs; i++) {
            enqueue(&b.msgs[i]);
        }
        for (size_t i = 0; i < b.n_committed; i++) {
            IDA_ASSERT(b.committed[i].index == H.applied[id] + 1);
            H.applied[id] = b.committed[i].index;
        }
        for (size_t i = 0; i < b.n_reads && H.n_reads_done[id] < 8; i++) {
            H.reads_done[id][H.n_reads_done[id]++] = b.reads[i].ctx;
        }
        if (b.id == 0) {
            continue;
        }
        IDA_ASSERT(n_held < HELD_MAX);
        struct held *w = &held[n_held];
        memset(w, 0, sizeof(*w));
        w->node = id;
        w->id = b.id;
        w->has_hs = b.has_hard_state;
        w->hs = b.hard_state;
        if (b.has_snapshot) {
            w->has_snap = true;
            w->snap_index = b.snapshot.index;
            w->snap_term = b.snapshot.term;
            w->snap = dup_bytes(b.snapshot.data, b.snapshot.len);
            w->snap_len = b.snapshot.len;
            H.applied[id] = b.snapshot.index;
        }
        IDA_ASSERT(b.n_entries <= 64);
        for (size_t i = 0; i < b.n_entries; i++) {
            w->ents[i] = b.entries[i];
            w->ents[i].data = dup_bytes(b.entries[i].data, b.entries[i].len);
        }
        w->n_ents = b.n_entries;
        IDA_ASSERT(b.n_msgs_after_persist <= 32);
        for (size_t i = 0; i < b.n_msgs_after_persist; i++) {
            pkt_copy(&w->msgs[i], &b.msgs_after_persist[i]);
        }
        w->n_msgs = b.n_msgs_after_persist;
        if (H.hold[id]) {
            n_held++;
        } else {
            persist(w);
        }
    }
}

void h_release(ida_node_id id)
{
    H.hold[id] = false;
    size_t k = 0;
    for (size_t i = 0; i < n_held; i++) {
        if (held[i].node == id) {
            persist(&held[i]);
        } else {
            held[k++] = held[i];
        }
    }
    n_held = k;
    h_collect(id);
}

bool h_deliver_one(void)
{
    if (q_len == 0) {
        return false;
    }
    struct pkt p = queue[q_head];
    q_head = (q_head + 1) % QUEUE_MAX;
    q_len--;
    ida_node_id to = p.m.to;
    if (H.up[to] && !H.cut[p.m.from][to]) {
        if (p.m.type == IDA_RAFT_MSG_APPEND_RESPONSE &&
            !p.m.u.append_response.success &&
            p.m.u.append_response.reject_index != 0) {
            H.rejects++;
        }
        if (p.m.type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
            H.snapshot_chunks++;
        }
        int rv = ida_raft_step(&H.r[to], &p.m);
        if (!(rv == 0 || rv == IDA_ENOMEM || rv == IDA_EFOREIGN ||
              (rv == IDA_ELOSTSTATE && H.allow_lost_state))) {
            fprintf(stderr, "step %u->%u type %d: %s\n", p.m.from, to, p.m.type,
                    idalloc_errname(rv));
        }
        IDA_ASSERT(rv == 0 || rv == IDA_ENOMEM || rv == IDA_EFOREIGN ||
                   (rv == IDA_ELOSTSTATE && H.allow_lost_state));
        H.foreign += rv == IDA_EFOREIGN;
        H.lost_state += rv == IDA_ELOSTSTATE;
        h_collect(to);
    }
    pkt_free(&p);
    return true;
}

size_t h_deliver_all(void)
{
    size_t count = 0;
    while (h_deliver_one()) {
        IDA_ASSERT(count < 100000);
        count++;
    }
    return count;
}

void h_tick(ida_node_id id, int k)
{
    for (int i = 0; i < k; i++) {
        ida_raft_tick(&H.r[id]);
        h_collect(id);
    }
}

void h_elect(ida_node_id id)
{
    for (int i = 0; i < 100; i++) {
        if (ida_raft_role(&H.r[id]) != IDA_RAFT_FOLLOWER) {
            break;
        }
        h_tick(id, 1);
    }
    h_deliver_all();
}

void h_propose(ida_node_id id, int count)
{
    for (int i = 0; i < count; i++) {
        uint8_t d[4] = {(uint8_t)i, 1, 2, 3};
        int rv = ida_raft_propose(&H.r[id], IDA_ENTRY_NORMAL, d, sizeof(d),
                                  NULL, NULL);
        IDA_ASSERT(rv == 0);
    }
    h_collect(id);
}

int h_propose_conf(ida_node_id id, const ida_node_id *voters, size_t n)
{
    struct ida_raft_conf c = {.n = n};
    memcpy(c.voters, voters, n * sizeof(*voters));
    uint8_t buf[256];
    size_t len;
    IDA_ASSERT(node_conf_encode(&c, buf, sizeof(buf), &len) == 0);
    int rv = ida_raft_propose(&H.r[id], IDA_ENTRY_CONFIG, buf, len, NULL, NULL);
    h_collect(id);
    return rv;
}

void h_isolate(ida_node_id id)
{
    for (int k = 1; k <= H.n; k++) {
        H.cut[id][k] = H.cut[k][id] = true;
    }
}

void h_heal(void)
{
    memset(H.cut, 0, sizeof(H.cut));
}

size_t h_queued(void)
{
    return q_len;
}

void h_drop_all(void)
{
    while (q_len > 0) {
        pkt_free(&queue[q_head]);
        q_head = (q_head + 1) % QUEUE_MAX;
        q_len--;
    }
}

const struct ida_raft_msg *h_peek(size_t k)
{
    return k < q_len ? &queue[(q_head + k) % QUEUE_MAX].m : NULL;
}

void h_drop(size_t k)
{
    IDA_ASSERT(k < q_len);
    pkt_free(&queue[(q_head + k) % QUEUE_MAX]);
    for (size_t i = k; i + 1 < q_len; i++) {
        queue[(q_head + i) % QUEUE_MAX] = queue[(q_head + i + 1) % QUEUE_MAX];
    }
    q_len--;
}

void h_dup(size_t k)
{
    IDA_ASSERT(k < q_len && q_len < QUEUE_MAX);
    struct pkt *p = &queue[(q_head + q_len) % QUEUE_MAX];
    pkt_copy(p, &queue[(q_head + k) % QUEUE_MAX].m);
    q_len++;
}

void h_swap(size_t i, size_t j)
{
    IDA_ASSERT(i < q_len && j < q_len);
    struct pkt t = queue[(q_head + i) % QUEUE_MAX];
    queue[(q_head + i) % QUEUE_MAX] = queue[(q_head + j) % QUEUE_MAX];
    queue[(q_head + j) % QUEUE_MAX] = t;
}

void h_set_log(ida_node_id id,
               const ida_term *terms,
               size_t n,
               ida_term term,
               ida_index commit)
{
    struct h_disk *d = &H.disk[id];
    disk_clear(d, 0);
    for (size_t i = 0; i < n; i++) {
        d->ents[i] = (struct ida_entry){
            .term = terms[i], .index = i + 1, .type = IDA_ENTRY_NORMAL};
    }
    d->n = n;
    d->hs.term = term;
    d->hs.vote = 0;
    d->hs.commit = commit;
}

bool h_same_log(ida_node_id a, ida_node_id b)
{
    ida_index la = ida_raft_last_index(&H.r[a]);
    if (la != ida_raft_last_index(&H.r[b])) {
        return false;
    }
    for (ida_index i = 1; i <= la; i++) {
        if (ida_raft_term_at(&H.r[a], i) != ida_raft_term_at(&H.r[b], i)) {
            return false;
        }
    }
    return true;
}
