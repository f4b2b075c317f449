/* The raft processor's state and the functions its files share; internal
 * to src/node (the processor's entry points are in src/node/node.h).
 * raft_proc.c: batches, client requests, peer messages, ticks;
 * raft_snap.c: snapshots received from a leader (decoded as they come,
 * then checked) and this node's own taken (made current, or held);
 * raft_member.c: joining and re-admission (src/node/member.h);
 * raft_status.c: status answers. */
#ifndef IDA_NODE_RAFT_PROC_H
#define IDA_NODE_RAFT_PROC_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/idalloc.pb-c.h"
#include "raft/raft.h"
#include "src/node/member.h"
#include "src/node/msgs.h"
#include "src/node/node.h"
#include "src/node/snap_policy.h"

struct pending_read
{
    uint64_t ctx;
    uint64_t conn;
    Idalloc__ClientRequest *req; /* owned */
    int asked;                   /* read_index accepted it */
};

struct raft_proc
{
    struct ida_node *node;
    struct ida_raft raft;
    unsigned tick_ms;
    uint64_t last_tick_ms;
    /* Ticks this processor ran too late to see (raft_ping()). */
    uint64_t late_ms_total, late_warned_ms;
    /* The open batch: requests whose ops go into the next entry. */
    Idalloc__ClientRequest **open;
    size_t n_open, cap_open, open_bytes;
    unsigned persist_inflight;
    /* The last entry the open batch went into (0: none since the last
     * loss of writes): the next batch waits for its commit (GATE). */
    ida_index open_gate;
    /* Reads waiting for their ReadIndex round. */
    struct pending_read *reads;
    size_t n_reads, cap_reads;
    uint64_t next_ctx;
    /* Route committed entries through storage until this batch is durable
     * (after a snapshot batch: the restore must precede them). */
    uint64_t route_until;
    ida_index route_snap; /* the snapshot that batch installs */
    /* What we know of the others. */
    ida_index applied, snapshot_index;
    enum ida_raft_role role;
    ida_node_id leader;
    ida_term term;
    int storage_failed;
    bool rolled_back; /* rule A4: the node is stopping (raft/admission.h) */
    struct node_members mem;     /* joining, re-admission (src/node/member.h) */
    bool book_pushed;            /* net has mem.book (ida__rp_book_refresh()) */
    struct ida_raft_config base; /* what the core was started with */
    /* The state machine ida__rp_snapshot_check() restored from the last
     * snapshot it accepted, with that snapshot's index and term; owned. The
     * batch that installs the snapshot hands it to the fsm processor, which
     * swaps it in: the bytes are decoded once. NULL: none waiting. */
    struct ida_fsm *checked;
    ida_index checked_index;
    ida_term checked_term;
    /* The check running on a thread of its own (ida__rp_snapshot_check());
     * NULL: none. Its verdict goes to the core on the processor's next ping. */
    struct snap_checker *checking;
    /* The leader's snapshot arriving, decoded as its chunks come
     * (snap_stream.h); NULL: none. ida__rp_snapshot_check() hands it to the
     * check of that snapshot. */
    struct ida__snap_stream *stream;
    /* What peers said of their snapshots (snap_policy.h, TURNS); published
     * in node->peers_snap_* on every message and ping. */
    struct ida_snap_peers snap_peers;
    /* This node's snapshot done encoding, held back from replacing the
     * stored one while a follower catches up (snap_policy.h, HOLD): its
     * SNAPSHOT_TAKEN message, owned, and since when; NULL: none. */
    struct ida_msg *held;
    uint64_t held_since_ms;
    struct node_outq q;
};

/* raft_proc.c */
/* A heap copy of @len bytes at @d (at least one byte allocated), NULL
 * when out of memory. */
uint8_t *ida__rp_bytes_copy(const uint8_t *d, size_t len);
/* Whether this node leads a follower that is catching up (snap_policy.h,
 * CATCH-UP). */
int ida__rp_follower_catching_up(struct raft_proc *rp);
/* Hand every batch the core has ready to net, storage and fsm. */
void ida__rp_drive(struct raft_proc *rp, struct ida_sender *s);

/* raft_snap.c */
/* Where the core's receipt of a leader's snapshot stood. */
struct rcv_mark
{
    ida_index index;
    ida_term term;
    uint64_t len;
    ida_index snap; /* the core's snapshot index */
};
/* After the core took a message @is (an InstallSnapshot chunk), @before
 * being where its receipt stood: feed the stream that decodes it, and
 * storage, which stores it as it arrives. */
void ida__rp_stream_chunk(struct raft_proc *rp,
                          struct ida_sender *s,
                          const struct ida_raft_install_snapshot *is,
                          const struct rcv_mark *before);
/* The core's snapshot_check (raft.h): restore the bytes into a scratch
 * state machine, on a thread of its own (IDA_RAFT_CHECK_PENDING). */
int ida__rp_snapshot_check(void *arg,
                           ida_index index,
                           ida_term term,
                           const uint8_t *data,
                           size_t len);
/* Join the checking thread, if any, and take its verdict (@wait: even if
 * it is not done yet). Returns whether there was one to take. */
bool ida__rp_check_take(struct raft_proc *rp, bool wait, int *rv);
/* On a ping: the stream's progress, and a finished check's verdict to the
 * core. */
void ida__rp_check_poll(struct raft_proc *rp, struct ida_sender *s);
/* This node's snapshot is encoded: make it current, or hold it while a
 * follower catches up. Takes @msg. */
void ida__rp_snapshot_taken(struct raft_proc *rp,
                            struct ida_sender *s,
                            struct ida_msg *msg);
/* On a ping: the snapshot held goes once nobody catches up, this node no
 * longer leads, or the hold reached its cap. */
void ida__rp_held_step(struct raft_proc *rp, struct ida_sender *s);

/* raft_status.c */
/* The role a node says it has (status, metrics): the core's, or "seeded"
 * while an import's seed waits for the other nodes (src/node/import.h). */
const char *ida__rp_role_name(const struct raft_proc *rp);
void ida__rp_reply_status(struct raft_proc *rp, uint64_t conn, uint64_t seq);

/* raft_member.c */
void ida__rp_hello_all(struct raft_proc *rp,
                       struct ida_sender *s,
                       uint64_t now);
void ida__rp_note_incarnation(struct raft_proc *rp, unsigned id, uint64_t inc);
void ida__rp_on_hello(struct raft_proc *rp,
                      struct ida_sender *s,
                      const Idalloc__PeerMessage *pb);
void ida__rp_on_membership0_done(struct raft_proc *rp,
                                 struct ida_nm_membership0 *m);
void ida__rp_rejoin_step(struct raft_proc *rp, uint64_t now);
/* How many raft ticks to run at @now (ms), one being due every @tick_ms
 * after *@last: all that are due, or only one when the first of them is
 * late by @drop_ms or more (the rest are forgotten; how late in
 * *@late_ms, else 0). *@last moves on; 0 (and a first look) starts it at
 * @now with no tick. Pure (raft_proc.c explains why ticks are dropped). */
uint64_t ida__raft_ticks_due(uint64_t *last,
                             uint64_t now,
                             unsigned tick_ms,
                             unsigned drop_ms,
                             uint64_t *late_ms);
int ida__rp_first_voters(struct raft_proc *rp, struct ida_raft_config *rc);
/* Rebuild the address book if the membership in effect changed, and hand
 * it to net and to the node's answers (src/node/book.h). */
void ida__rp_book_refresh(struct raft_proc *rp);

#endif /* IDA_NODE_RAFT_PROC_H */
