/* Fuzz peer messages from their bytes into the Raft core: decode a
 * PeerMessage (as net does, with its envelope checks), convert it
 * (node_pb_to_raft(), src/node/convert.c) and step a real core with it,
 * among ticks, proposals and persistence, as the raft processor does.
 *
 * Input: records of [op u8][length u16][bytes]. op % 8: 0-2 a peer
 * message (1 and 2 with the envelope forced valid: this node, a peer, the
 * cluster, version 1, so the fuzzer spends its time on the bodies); 3
 * ticks; 4 a proposal; 5 hold the next batches unpersisted / 6 persist
 * them; 7 compact at the applied index.
 *
 * Checked after each input, besides the core's own invariants (asserted
 * inside it after every call, raft/invariants.c): step answers only the
 * documented codes; term, commit and applied index never go back; the vote
 * of a term never changes; an entry once handed out as committed keeps its
 * term at its index for as long as the core has it; committed entries
 * come out in order, without gaps, never past the commit index; every
 * message out is from this node, to another, of a term no higher than the
 * core's (but for pre-vote); and it converts to protobuf and back
 * unchanged. */
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "src/common/frame.h"
#include "src/node/convert.h"
#include "tests/fuzz/fuzz.h"

#define SELF       1
#define KEEP_TERMS 4096
#define CLUSTER    "fuzz"

static struct
{
    ida_term committed_term[KEEP_TERMS]; /* by index, 0: not seen */
    ida_index applied;
    ida_index snap; /* the last snapshot a batch carried */
    ida_term term;
    ida_node_id vote;
    ida_index commit;
    uint64_t held[IDA_RAFT_PENDING_MAX];
    size_t n_held;
    bool hold;
} S;

/* The node's check: a snapshot must restore into a state machine. */
static int snapshot_check(void *arg,
                          ida_index index,
                          ida_term term,
                          const uint8_t *data,
                          size_t len)
{
    (void)arg;
    (void)index;
    (void)term;
    struct ida_fsm *f;
    FUZZ_CHECK(ida_fsm_new(&f) == 0);
    int rv = ida_fsm_restore(f, data, len);
    ida_fsm_free(f);
    return rv;
}

static void check_roundtrip(const struct ida_raft_msg *m)
{
    struct node_pb_peer pb;
    FUZZ_CHECK(node_raft_to_pb(m, &pb) == 0);
    pb.msg.version = IDA_WIRE_VERSION;
    pb.msg.cluster = CLUSTER;
    size_t len = idalloc__peer_message__get_packed_size(&pb.msg);
    uint8_t *buf = ida_malloc(len + 1);
    FUZZ_CHECK(buf != NULL);
    idalloc__peer_message__pack(&pb.msg, buf);
    node_pb_peer_release(&pb);
    Idalloc__PeerMessage *back = idalloc__peer_message__unpack(NULL, len, buf);
    FUZZ_CHECK(back != NULL);
    struct ida_raft_msg m2;
    struct ida_entry *ents = NULL;
    FUZZ_CHECK(node_pb_to_raft(back, &m2, &ents) == 0);
    FUZZ_CHECK(m2.type == m->type && m2.from == m->from && m2.to == m->to &&
               m2.term == m->term && m2.from_inc == m->from_inc);
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES) {
        const struct ida_raft_append_entries *x = &m->u.append_entries,
                                             *y = &m2.u.append_entries;
        FUZZ_CHECK(x->prev_log_index == y->prev_log_index &&
                   x->prev_log_term == y->prev_log_term &&
                   x->commit_index == y->commit_index &&
                   x->read_ctx == y->read_ctx && x->n_entries == y->n_entries);
        for (size_t i = 0; i < x->n_entries; i++) {
            FUZZ_CHECK(x->entries[i].index == y->entries[i].index &&
                       x->entries[i].term == y->entries[i].term &&
                       x->entries[i].type == y->entries[i].type &&
                       x->entries[i].len == y->entries[i].len);
            FUZZ_CHECK(x->entries[i].len == 0 ||
                       memcmp(x->entries[i].data, y->entries[i].data,
                              x->entries[i].len) == 0);
        }
    }
    ida_free(ents);
    idalloc__peer_message__free_unpacked(back, NULL);
    ida_free(buf);
}

static void check_msgs(const struct ida_raft *r,
                       const struct ida_raft_msg *m,
                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(m[i].from == SELF && m[i].to != SELF && m[i].to != 0);
        if (getenv("FUZZ_PEER_DEBUG") != NULL) {
            fprintf(stderr, "msg type %d term %llu core term %llu role %d\n",
                    m[i].type, (unsigned long long)m[i].term,
                    (unsigned long long)ida_raft_term(r), ida_raft_role(r));
        }
        /* +1: a pre-vote request; a pre-vote answer carries the term of
         * the request it grants (§9.6, as etcd), whatever ours is. */
        FUZZ_CHECK(m[i].term <= ida_raft_term(r) + 1 ||
                   (m[i].type == IDA_RAFT_MSG_RESPONSE_VOTE &&
                    m[i].u.response_vote.pre_vote));
        check_roundtrip(&m[i]);
    }
}

static void check_state(const struct ida_raft *r)
{
    FUZZ_CHECK(ida_raft_term(r) >= S.term);
    FUZZ_CHECK(ida_raft_commit(r) >= S.commit);
    if (ida_raft_term(r) == S.term && S.vote != 0) {
        FUZZ_CHECK(r->vote == S.vote); /* one vote per term */
    }
    S.term = ida_raft_term(r);
    S.vote = r->vote;
    S.commit = ida_raft_commit(r);
    FUZZ_CHECK(S.commit <= ida_raft_last_index(r) || S.commit <= r->snap_index);
    for (ida_index i = 1; i <= S.applied && i < KEEP_TERMS; i++) {
        ida_term t = ida_raft_term_at(r, i);
        FUZZ_CHECK(t == 0 || t == S.committed_term[i]);
    }
}

static void drain(struct ida_raft *r)
{
    struct ida_raft_batch b;
    while (ida_raft_ready(r, &b)) {
        check_msgs(r, b.msgs, b.n_msgs);
        check_msgs(r, b.msgs_after_persist, b.n_msgs_after_persist);
        for (size_t i = 0; i < b.n_committed; i++) {
            const struct ida_entry *e = &b.committed[i];
            FUZZ_CHECK(e->index == S.applied + 1 || (b.has_snapshot && i == 0));
            FUZZ_CHECK(e->index <= ida_raft_commit(r));
            S.applied = e->index;
            if (e->index < KEEP_TERMS) {
                S.committed_term[e->index] = e->term;
            }
        }
        if (b.has_snapshot) {
            /* One received (the commit index moves to it) or a local
             * compaction at the applied index: never past the commit
             * index, never behind the last one. */
            FUZZ_CHECK(b.snapshot.index <= ida_raft_commit(r));
            FUZZ_CHECK(b.snapshot.index >= S.snap);
            S.snap = b.snapshot.index;
        }
        if (b.id != 0) {
            if (S.hold && S.n_held < IDA_RAFT_PENDING_MAX) {
                S.held[S.n_held++] = b.id;
            } else {
                ida_raft_persisted(r, b.id);
            }
        }
    }
    check_state(r);
}

static void step(struct ida_raft *r, const uint8_t *p, size_t len, int force)
{
    Idalloc__PeerMessage *pb = idalloc__peer_message__unpack(NULL, len, p);
    if (pb == NULL) {
        return;
    }
    if (force) {
        pb->version = IDA_WIRE_VERSION;
        pb->to = SELF;
        pb->from = 2 + (pb->from & 1);
    }
    /* net's envelope checks (src/node/net_conn.c, on_peer_frame). */
    if (pb->version == IDA_WIRE_VERSION && pb->to == SELF &&
        (pb->from == 2 || pb->from == 3) &&
        pb->msg_case != IDALLOC__PEER_MESSAGE__MSG_HELLO) {
        struct ida_raft_msg m;
        struct ida_entry *ents = NULL;
        int rv = node_pb_to_raft(pb, &m, &ents);
        FUZZ_CHECK(rv == 0 || rv == IDA_EPROTO);
        if (rv == 0) {
            rv = ida_raft_step(r, &m);
            FUZZ_CHECK(rv == 0 || rv == IDA_EINVAL || rv == IDA_EPROTO ||
                       rv == IDA_EFOREIGN);
        }
        ida_free(ents);
    }
    idalloc__peer_message__free_unpacked(pb, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    memset(&S, 0, sizeof(S));
    struct ida_raft_config cfg = {
        .id = SELF,
        .voters = {1, 2, 3},
        .n_voters = 3,
        .incarnation = 0,
        .election_ticks = 10,
        .heartbeat_ticks = 1,
        .seed = 7,
        .pre_vote = true,
        .check_quorum = true,
        .max_inflight = 4,
        .max_msg_entries = 8,
        .snapshot_chunk_bytes = 64,
        .snapshot_max_inflight = 4,
        .snapshot_bytes_max = 1u << 16,
        .conf_decode = node_conf_decode,
        .snapshot_check = snapshot_check,
    };
    static struct ida_raft r;
    FUZZ_CHECK(ida_raft_init(&r, &cfg, NULL) == 0);
    struct fuzz_in in = {data, size};
    while (in.n > 0) {
        uint8_t op = fuzz_u8(&in);
        size_t len;
        const uint8_t *p = fuzz_bytes(&in, fuzz_u16(&in), &len);
        ida_index idx;
        ida_term t;
        switch (op % 8) {
            case 0:
            case 1:
            case 2:
                step(&r, p, len, op % 8 != 0);
                break;
            case 3:
                for (size_t k = 0; k < 1 + (len % 16); k++) {
                    ida_raft_tick(&r);
                }
                break;
            case 4:
                (void)ida_raft_propose(&r, IDA_ENTRY_NORMAL, p, len, &idx, &t);
                break;
            case 5:
                S.hold = true;
                break;
            case 6:
                S.hold = false;
                for (size_t k = 0; k < S.n_held; k++) {
                    ida_raft_persisted(&r, S.held[k]);
                }
                S.n_held = 0;
                break;
            default:
                if (S.applied > r.snap_index) {
                    FUZZ_CHECK(ida_raft_compact(&r, S.applied, p, len) == 0);
                }
                break;
        }
        drain(&r);
    }
    ida_raft_close(&r);
    return 0;
}
