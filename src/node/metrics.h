/* Metrics: Prometheus text at GET /metrics and GET /healthz, on the address
 * of `metrics=HOST:PORT` on this node's line of the cluster file (off when
 * absent). README, "Metrics", lists every series.
 *
 * DESIGN
 *
 * The processors record what happens through the small hooks below: each
 * one only updates atomics (or, for the pool table and the in-flight
 * requests, takes a short mutex), so a hook costs little and never waits on
 * I/O. Connection and message counts are net's own (ida_net_get_stats()),
 * read at each scrape. The
 * HTTP side is libmicrohttpd running its own thread
 * (MHD_USE_INTERNAL_POLLING_THREAD), not polled from the libuv loop: a scrape
 * then reads the atomics and never touches the loop, a processor or its
 * state, and a slow or stuck scraper cannot delay peers or clients. The
 * server keeps at most 8 connections with a 10 s timeout and answers only
 * GET /metrics and GET /healthz.
 *
 * Request latency is measured from the raft processor's receipt of a
 * request (ida_metrics_request_begin) to the reply handed to net
 * (ida_metrics_request_end), keyed by (connection, request seq) in a
 * bounded table; requests beyond it are counted without a latency.
 *
 * THREADING: every function is thread-safe. @m may be NULL in every hook
 * (then nothing is recorded).
 */
#ifndef IDA_NODE_METRICS_H
#define IDA_NODE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "src/common/config.h"
#include "src/node/net.h"

struct ida_metrics;

/* The operations requests are counted by. */
enum ida_metrics_op {
    IDA_MOP_OTHER = 0,
    IDA_MOP_POOL_CREATE,
    IDA_MOP_ALLOC,
    IDA_MOP_FREE,
    IDA_MOP_LOOKUP,
    IDA_MOP_LIST,
    IDA_MOP_RESERVE,
    IDA_MOP_PREFIX,
    IDA_MOP_STATUS,
    IDA_MOP_MEMBER,
    IDA_MOP_SNAPSHOT_READ,
    IDA_MOP_RESTORE,
    IDA_MOP_COUNT_
};

/* The node's processors, whose calls are timed (ida_metrics_step()). */
enum ida_metrics_proc {
    IDA_MPROC_RAFT = 0,
    IDA_MPROC_STORAGE,
    IDA_MPROC_FSM,
    IDA_MPROC_COUNT_
};

/* A processor's name, as its metrics label it: "raft", "storage", "fsm". */
const char *ida_metrics_proc_name(enum ida_metrics_proc proc);

/* The metrics op of a ClientRequest's op_case. */
enum ida_metrics_op ida_metrics_op_of(int op_case);

/* A metrics recorder (no server yet). Returns NULL when out of memory. */
struct ida_metrics *ida_metrics_new(unsigned node_id);

/* Serve /metrics and /healthz on @addr. Returns 0, or IDA_EIO with a line
 * in @errmsg (IDA_ERRMSG_MAX) naming the address. */
int ida_metrics_start(struct ida_metrics *m,
                      const struct ida_addr *addr,
                      char *errmsg);

/* Stop serving (if started): no scrape runs after this returns. */
void ida_metrics_stop(struct ida_metrics *m);

/* Stop serving (if started) and free. */
void ida_metrics_free(struct ida_metrics *m);

/* --- hooks --------------------------------------------------------------- */

void ida_metrics_request_begin(struct ida_metrics *m,
                               uint64_t conn,
                               uint64_t seq,
                               enum ida_metrics_op op);
/* @err: 0 or the IDA_E* code answered. */
void ida_metrics_request_end(struct ida_metrics *m,
                             uint64_t conn,
                             uint64_t seq,
                             int err);

/* The raft processor's view, published after each step. @leader: 0 when
 * none is known; @role as ida_raft_role_name(). */
void ida_metrics_raft(struct ida_metrics *m,
                      uint64_t term,
                      const char *role,
                      unsigned leader,
                      uint64_t commit,
                      uint64_t log_first,
                      uint64_t log_last);
void ida_metrics_applied(struct ida_metrics *m, uint64_t index);
void ida_metrics_proposal_failed(struct ida_metrics *m);
/* One durable storage step: its duration, the entry bytes it wrote and
 * the raft batches it made durable (several share a step when they queue
 * behind one another: storage_proc.c, MERGED). */
void ida_metrics_fsync(struct ida_metrics *m,
                       uint64_t micros,
                       uint64_t bytes,
                       uint64_t batches);
/* A snapshot taken by the fsm: its size and how long encoding took. */
void ida_metrics_snapshot(struct ida_metrics *m,
                          uint64_t bytes,
                          uint64_t micros);
/* A snapshot made durable by storage (chunks written, log compacted). */
void ida_metrics_snapshot_stored(struct ida_metrics *m, uint64_t micros);
/* A snapshot received from the leader, restored into the fsm. */
void ida_metrics_snapshot_installed(struct ida_metrics *m, uint64_t micros);
/* One call of processor @proc (a message received, or its periodic ping)
 * took @micros: what held the processor, and everything queued behind. */
void ida_metrics_step(struct ida_metrics *m,
                      enum ida_metrics_proc proc,
                      uint64_t micros);
/* Where connection and message counts come from (ida_net_get_stats()),
 * read at each scrape; NULL: none. Set before ida_metrics_start(), and
 * stop serving (ida_metrics_stop()) before @net goes away. */
void ida_metrics_set_net(struct ida_metrics *m, struct ida_net *net);
/* The fsm's pools and sessions as exposition lines (copied). */
void ida_metrics_pools(struct ida_metrics *m,
                       const char *text,
                       size_t len,
                       uint64_t sessions);

/* The exposition text of @m (ida_malloc'd, NUL-terminated; *len its
 * length), or NULL when out of memory. What GET /metrics answers. */
char *ida_metrics_render(struct ida_metrics *m, size_t *len);

/* 1 while the node knows a leader (what GET /healthz answers 200 for). */
int ida_metrics_healthy(struct ida_metrics *m);

#endif /* IDA_NODE_METRICS_H */
