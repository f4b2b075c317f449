/* A tiny hand-driven cluster for the core's unit tests: message delivery,
 * persistence, partitions and restarts are explicit calls, so a test can
 * build the exact scenario of a figure of the Raft paper. */
#ifndef IDA_TEST_RAFT_HARNESS_H
#define IDA_TEST_RAFT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

#include "raft/raft.h"

#define H_NODES_MAX 5

struct h_disk
{
    struct ida_hard_state hs;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap;
    size_t snap_len;
    struct ida_entry ents[512];
    size_t n;
    uint64_t boots; /* starts counted (rule A4), durable like the rest */
};

struct h_cluster
{
    int n;
    struct ida_raft r[H_NODES_MAX + 1]; /* by node id, [0] unused */
    bool up[H_NODES_MAX + 1];
    bool cut[H_NODES_MAX + 1][H_NODES_MAX + 1]; /* [from][to] */
    bool hold[H_NODES_MAX + 1]; /* do not persist (batches wait) */
    struct h_disk disk[H_NODES_MAX + 1];
    ida_index applied[H_NODES_MAX + 1]; /* last index handed to apply */
    uint64_t reads_done[H_NODES_MAX + 1][8];
    size_t n_reads_done[H_NODES_MAX + 1];
    /* Config knobs used by h_start(). */
    bool pre_vote;
    bool check_quorum;
    int bootstrap_n; /* bootstrap voters are 1..bootstrap_n (default n) */
    size_t max_msg_entries;
    size_t max_msg_bytes;           /* 0: no limit */
    unsigned max_append_burst;      /* 0: no limit */
    unsigned snapshot_max_inflight; /* InstallSnapshot chunks (8 bytes) */
    uint32_t bugs;
    /* Snapshot bytes kept by the "application" (raft.h contract 7): a
     * restart restores with snapshot_in_storage, and chunks the core sends
     * without bytes are filled from the sender's disk, or dropped
     * (counted in chunks_unfilled) when its disk holds another snapshot. */
    bool snap_in_storage;
    size_t chunks_unfilled;
    /* Incarnations: inc[id] is node id's (0: none); with bind_incs the
     * bootstrap membership binds every voter to its inc at h_init() time. */
    uint64_t inc[H_NODES_MAX + 1];
    uint64_t boot_inc[H_NODES_MAX + 1];
    bool bind_incs;
    /* Rule A4: nodes start with boot ids (count from the disk, a fresh
     * nonce); on by default, off for tests that need cfg.boot == 0. */
    bool no_boots;
    uint32_t nonce_seq;
    /* A step may answer IDA_ELOSTSTATE (counted in lost_state) only in
     * tests that put a disk back; anywhere else it fails the test. */
    bool allow_lost_state;
    /* Counters for assertions. */
    size_t appends_sent;                /* AppendEntries carrying entries */
    size_t appends_to[H_NODES_MAX + 1]; /* the same, per destination */
    size_t foreign;            /* messages dropped as another incarnation's */
    size_t lost_state;         /* steps answered IDA_ELOSTSTATE (rule A4) */
    size_t rejects;            /* AppendResponse with success=false */
    size_t snapshot_chunks;    /* InstallSnapshot delivered */
    size_t max_entries_in_msg; /* largest AppendEntries seen */
};

extern struct h_cluster H;

/* Reset H with @n nodes (not started). */
void h_init(int n);
/* Node @id's application took a snapshot at @index: @data goes to its disk
 * (copied) and the core compacts keeping only the size (contract 7). */
int h_compact_stored(ida_node_id id,
                     ida_index index,
                     const uint8_t *data,
                     size_t len);
/* Start node @id from its disk (empty for a new node). */
void h_start(ida_node_id id);
/* Start all nodes. */
void h_start_all(void);
/* Crash @id: unpersisted batches and queued messages to/from it are lost. */
void h_crash(ida_node_id id);
/* Crash @id and give it an empty disk and a new incarnation @inc, as after
 * a replaced disk; start it again with h_start(). */
void h_wipe(ida_node_id id, uint64_t inc);
/* Free everything. */
void h_close(void);
/* A deep copy of @id's durable disk into @out (free with h_disk_free). */
void h_disk_copy(ida_node_id id, struct h_disk *out);
/* Crash @id (if up) and put @copy back as its disk (deep copy): the
 * operator restored an older copy of the directory. Start it with
 * h_start(). */
void h_disk_restore(ida_node_id id, const struct h_disk *copy);
void h_disk_free(struct h_disk *d);
/* Drain @id's batches (persisting them unless held). */
void h_collect(ida_node_id id);
/* Persist the held batches of @id. */
void h_release(ida_node_id id);
/* Deliver queued messages until none is left. Returns how many. */
size_t h_deliver_all(void);
/* Deliver the oldest queued message (dropped if its link is cut or its
 * target is down). Returns false if the queue was empty. */
bool h_deliver_one(void);
/* Tick @id @k times (collecting after each). */
void h_tick(ida_node_id id, int k);
/* Make @id leader: tick it until it campaigns, then deliver. */
void h_elect(ida_node_id id);
/* Propose the voter set @voters (encoded) at @id; returns the code. */
int h_propose_conf(ida_node_id id, const ida_node_id *voters, size_t n);
/* Propose @count normal entries at @id (must be leader). */
void h_propose(ida_node_id id, int count);
/* Isolate @id from everyone (both directions) or heal everything. */
void h_isolate(ida_node_id id);
void h_heal(void);
/* Number of queued messages. */
size_t h_queued(void);
/* Drop all queued messages. */
void h_drop_all(void);
/* The @k-th queued message (0: the oldest), NULL if fewer are queued.
 * Borrowed until the queue changes. */
const struct ida_raft_msg *h_peek(size_t k);
/* Drop the @k-th queued message (lost by the network). */
void h_drop(size_t k);
/* Queue a copy of the @k-th queued message last (a duplicate). */
void h_dup(size_t k);
/* Swap the @i-th and @j-th queued messages (reordering). */
void h_swap(size_t i, size_t j);
/* Restore @id's disk to a log of the given terms (index 1..n), hard state
 * term @term, commit @commit. */
void h_set_log(ida_node_id id,
               const ida_term *terms,
               size_t n,
               ida_term term,
               ida_index commit);
/* True if @a and @b hold the same log (terms) up to their last index. */
bool h_same_log(ida_node_id a, ida_node_id b);

#endif /* IDA_TEST_RAFT_HARNESS_H */
