/* Messages between the node's processors (net, raft, storage, fsm).
 *
 * Every message is an ida_msg whose payload is one pointer to a heap struct
 * of the type's kind; ownership of that struct moves with the message (the
 * receiver frees it with node_msg_free()). Flow:
 *
 *   net --CLIENT, PEER--> raft
 *   raft --PERSIST--> storage --PERSISTED--> raft
 *   raft --APPLY, READ, REGISTER, LEADERSHIP_LOST--> fsm
 *   storage --APPLY (after a snapshot it installed)--> fsm
 *   fsm --APPLIED, SNAPSHOT_TAKEN--> raft --SNAPSHOT_STORE--> storage
 *       --SNAPSHOT_STORED--> raft (raft adds the membership at the index
 *       and hands the buffer on; once storage made it durable, raft
 *       compacts its log and keeps only the snapshot's size: raft.h
 *       contract 7)
 *   fsm --SNAPSHOT_ENC--> storage (this node's snapshot as the child
 *       encoding it writes it, stored as it comes; once all is in,
 *       storage --SNAPSHOT_TAKEN (no bytes)--> raft --SNAPSHOT_STORE (no
 *       bytes, the membership)--> storage, which makes it current; the
 *       encoded snapshot is never whole in this process's memory)
 *   raft --SNAPSHOT_CHUNK--> storage (an InstallSnapshot chunk to fill
 *       from the stored snapshot and send to the peer)
 *   raft --SNAPSHOT_RCV--> storage (a chunk of the leader's snapshot the
 *       core took: stored as it arrives, installed by the PERSIST that
 *       carries the whole snapshot)
 *   storage --STORAGE_FAILED--> raft
 *
 * Replies to clients and messages to peers go straight to net (thread-safe).
 */
#ifndef IDA_NODE_MSGS_H
#define IDA_NODE_MSGS_H

#include <stdint.h>

#include "base/types.h"
#include "proto/idalloc.pb-c.h"
#include "raft/raft.h"
#include "src/pool/pool.h"

enum node_msg_type {
    IDA_NM_CLIENT = 1,
    IDA_NM_PEER,
    IDA_NM_PERSIST,
    IDA_NM_PERSISTED,
    IDA_NM_APPLY,
    IDA_NM_READ,
    IDA_NM_REGISTER,
    IDA_NM_LEADERSHIP_LOST,
    IDA_NM_APPLIED,
    IDA_NM_SNAPSHOT_TAKEN,
    IDA_NM_SNAPSHOT_STORE,
    IDA_NM_STORAGE_FAILED,
    IDA_NM_MEMBERSHIP0,      /* raft -> storage: write the first membership */
    IDA_NM_MEMBERSHIP0_DONE, /* storage -> raft: written (or why not) */
    IDA_NM_UNTRUSTED,        /* raft -> storage: mark the directory, stop */
    IDA_NM_SNAPSHOT_STORED,  /* storage -> raft: durable (ida_nm_snapshot,
                                no data) */
    IDA_NM_SNAPSHOT_CHUNK,   /* raft -> storage: fill and send */
    IDA_NM_SNAPSHOT_RCV,     /* raft -> storage: store as it arrives */
    IDA_NM_SNAPSHOT_ENC,     /* fsm -> storage: store as it is encoded */
};

struct ida_nm_client
{
    uint64_t conn;
    Idalloc__ClientRequest *req; /* owned */
};

/* One raft batch to make durable, then what to do after. */
struct ida_nm_persist
{
    uint64_t batch_id;
    int has_hard_state;
    struct ida_hard_state hard_state;
    struct ida_entry *entries; /* deep copies */
    size_t n_entries;
    int has_snapshot;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap_data;
    size_t snap_len;
    uint8_t *snap_conf; /* its membership (encoded), NULL: bootstrap */
    size_t snap_conf_len;
    struct ida_raft_msg *after; /* msgs_after_persist, deep copies */
    size_t n_after;
    struct ida_nm_apply *apply_after; /* committed entries to forward to fsm
                                     once durable (snapshot batches), or NULL */
};

struct ida_nm_persisted
{
    uint64_t batch_id;
};

struct ida_fsm; /* fsm/fsm.h */

/* Committed entries (deep copies) for the fsm, optionally preceded by a
 * snapshot to install: either the state machine the raft processor's check
 * restored from it (@fsm, swapped in with ida_fsm_replace()), or, when the
 * check kept none for this index and term, its bytes to restore. */
struct ida_nm_apply
{
    int has_snapshot;
    ida_index snap_index;
    ida_term snap_term;
    struct ida_fsm *fsm; /* owned; its applied index is snap_index */
    uint8_t *snap_data;  /* NULL when @fsm is set */
    size_t snap_len;     /* the snapshot's size in bytes, either way */
    struct ida_entry *entries;
    size_t n_entries;
};

/* A linearizable read, to serve once applied >= index. */
struct ida_nm_read
{
    uint64_t conn;
    ida_index index;
    Idalloc__ClientRequest *req; /* owned */
};

/* A write waiting for its entry to apply. */
struct ida_nm_register
{
    uint8_t client_id[16];
    uint64_t request_seq;
    uint64_t conn;
};

struct ida_nm_applied
{
    ida_index index;
    ida_index snapshot_index;
};

struct ida_nm_snapshot
{
    ida_index index;
    ida_term term;
    uint8_t *data;
    size_t len;
    uint8_t *conf; /* the membership at index (encoded), NULL: bootstrap */
    size_t conf_len;
};

/* IDA_NM_SNAPSHOT_CHUNK: an InstallSnapshot message of the core whose
 * bytes are in storage (data NULL, len > 0); @conf is its own copy of the
 * message's config. */
struct ida_nm_snap_chunk
{
    struct ida_raft_msg m;
    uint8_t *conf;
};

/* IDA_NM_SNAPSHOT_RCV: bytes [offset, offset + len) of the snapshot at
 * (index, term) of total bytes the leader is sending; the first chunk
 * (offset 0) carries its membership (@conf, NULL: bootstrap). */
struct ida_nm_snap_rcv
{
    ida_index index;
    ida_term term;
    uint64_t total, offset;
    uint8_t *data;
    size_t len;
    uint8_t *conf;
    size_t conf_len;
};

/* IDA_NM_SNAPSHOT_ENC: bytes [offset, offset + len) of this node's own
 * snapshot at (index, term), @total bytes, as the child encoding it wrote
 * them (in order). @end: 0 more follow; 1 the child finished and exited
 * well after exactly @total bytes (this is the last; len may be 0); -1 it
 * failed (what came is no snapshot). */
struct ida_nm_snap_enc
{
    ida_index index;
    ida_term term;
    uint64_t total, offset;
    uint8_t *data;
    size_t len;
    int end;
};

/* IDA_NM_MEMBERSHIP0 and IDA_NM_MEMBERSHIP0_DONE. */
struct ida_nm_membership0
{
    int rv; /* in the answer: 0 or why it was not written */
    uint8_t *data;
    size_t len;
};

/* IDA_NM_UNTRUSTED: why the directory is not to be trusted. */
struct ida_nm_untrusted
{
    char why[400];
};

struct ida_nm_storage_failed
{
    int code;
    char msg[256];
};

/* A message of @type carrying @payload (ownership moves in); NULL when out
 * of memory (then @payload is still the caller's). */
struct ida_msg *node_msg_new(enum node_msg_type type, void *payload);
/* The payload pointer of @m. */
void *node_msg_payload(const struct ida_msg *m);
/* Free @m and its payload, whatever its type. */
void node_msg_free(struct ida_msg *m);

void ida_nm_persist_free(struct ida_nm_persist *p);
void ida_nm_apply_free(struct ida_nm_apply *a);

/* Deep copies (one allocation each); NULL when out of memory. */
struct ida_entry *node_entries_copy(const struct ida_entry *e, size_t n);
struct ida_raft_msg *node_raft_msgs_copy(const struct ida_raft_msg *m,
                                         size_t n);
void node_raft_msgs_free(struct ida_raft_msg *m, size_t n);

/* Ordered sends from a processor with back-pressure: a message that finds
 * its target's inbox full waits here, and so does everything sent after it
 * (to any target), so messages never overtake each other. */
struct node_outq
{
    struct
    {
        uint32_t to;
        struct ida_msg *msg;
    } * v;
    size_t head, n, cap;
};

/* Wrap @payload in a message of @type and send it to @to through @q
 * (ownership moves in). Returns 0, or IDA_ENOMEM with the payload freed and
 * a log line: callers that cannot afford the loss end the process with
 * IDA_OOM_CHECK (base/heap.h). */
int node_post(struct node_outq *q,
              struct ida_sender *s,
              uint32_t to,
              enum node_msg_type type,
              void *payload);

/* Send @m to @to through @q (ownership moves in; on out-of-memory or a
 * stopping pool the message is freed and dropped, with a log line). */
void node_send(struct node_outq *q,
               struct ida_sender *s,
               uint32_t to,
               struct ida_msg *m);
/* Retry what waits in @q; call at the start of every receive/ping. */
void node_outq_flush(struct node_outq *q, struct ida_sender *s);
void node_outq_close(struct node_outq *q);
#endif /* IDA_NODE_MSGS_H */
