/* Background snapshot encoding: the state machine is encoded by a forked
 * child while the fsm processor goes on applying (Redis' BGSAVE).
 *
 * DESIGN (issue 19: nothing on the critical path waits for a snapshot).
 * At 10M live allocations, encoding the state takes ~0.8 s; done on the
 * fsm processor, every client waits that long. fork() gives the child a
 * frozen copy-on-write view of the whole process at the applied index, for
 * the price of copying page tables (milliseconds: see tests/fsm/
 * bench_bgsnap.c) plus a copy of each page the parent writes while the child
 * runs. The child encodes with the same ida_fsm_snapshot() the node always
 * used and writes the bytes to a pipe: a 16-byte header ("IDABGSN1" and the
 * length, big-endian) then the snapshot. The parent reads the pipe a
 * bounded slice at a time (on the fsm processor's ping and after each
 * apply), so no step reads more than the budget: the node passes each
 * slice on to storage as it comes (ida_bgsnap_read(), storage_proc.c), so
 * the encoded state is never whole in its memory; ida_bgsnap_poll() gathers
 * the whole instead. The snapshot counts only when the child exited with
 * status 0 after exactly the announced bytes: a child that died, was
 * killed or wrote short costs nothing but a retry.
 *
 * Why a fork and not a persistent (copy-on-write) state machine: the fsm's
 * tables are plain hash tables and bitmaps tuned for apply speed and memory;
 * making them persistent is a rewrite of fsm/ and slows every apply; a fork
 * leaves fsm/ untouched and costs only while a snapshot is being taken.
 *
 * The child of a multi-threaded process: only the forking thread exists in
 * it, so it must not take a lock another thread may have held at the fork.
 * It calls only ida_fsm_snapshot() or ida_fsm_snapshot_to() (which
 * allocate: glibc's malloc is reset in the child by its own fork handlers),
 * write() or ftruncate() and mmap(), and _exit(); it never logs. It first
 * closes every descriptor but its pipe or memory file (a child that
 * outlived a killed parent must not hold the data directory's lock or the
 * node's ports) and asks to be killed when the parent dies
 * (PR_SET_PDEATHSIG).
 *
 * When fork() fails (no memory for the page tables, a process limit),
 * ida_bgsnap_start() says so and the caller encodes in line as before. */
#ifndef IDA_NODE_BGSNAP_H
#define IDA_NODE_BGSNAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/types.h"
#include "fsm/fsm.h"

#define IDA_BGSNAP_HDR_BYTES 16

/* The pipe's capacity asked for: one 1 MiB slice (fsm_proc.c). */
#define IDA_BGSNAP_PIPE_BYTES (1u << 20)

struct ida_bgsnap
{
    pid_t pid; /* 0: no job */
    int fd;    /* read end of the pipe, or the memory file (mem) */
    int mem;   /* ida_bgsnap_start_mem()'s job */
    ida_index index;
    ida_term term;
    uint64_t started_us;
    uint64_t fork_us; /* how long fork() held the caller */
    uint8_t hdr[IDA_BGSNAP_HDR_BYTES];
    size_t hdr_got;  /* all 16 in: len is the snapshot's size */
    uint8_t *buf;    /* ida_bgsnap_poll(): ida_malloc'd once the header is in */
    size_t len, got; /* size, and bytes read so far */
};

/* What one ida_bgsnap_read() gave: bytes [offset, offset + len) of a
 * snapshot of @total bytes (total is 0 until the header is in). */
struct ida_bgsnap_slice
{
    uint64_t offset, total;
    size_t len;
};

/* Fork a child that encodes @f (at @index, @term). Returns 0 (a job runs),
 * IDA_EBUSY (one already runs) or IDA_EIO (pipe or fork failed: encode in
 * line). */
int ida_bgsnap_start(struct ida_bgsnap *b,
                     const struct ida_fsm *f,
                     ida_index index,
                     ida_term term);

/* Read at most @budget bytes of the job's output. Returns 0 (still
 * running), 1 (done: *data and *len are the snapshot, the caller's, free
 * with ida_free; the job is over) or minus an IDA_E* code (the job failed
 * and is over; nothing to free; -IDA_EINVAL: no job). Never blocks. */
int ida_bgsnap_poll(struct ida_bgsnap *b,
                    size_t budget,
                    uint8_t **data,
                    size_t *len);

/* Streaming instead: read at most @cap of the job's next bytes into @dst
 * (*@out says which; len may be 0). Returns 0 (still running), 1 (done:
 * every byte was given, exactly the announced size, and the child exited
 * with status 0; the job is over) or minus an IDA_E* code (the job failed
 * and is over: bytes given before are not a snapshot; -IDA_EINVAL: no
 * job). Never blocks. Use either this or ida_bgsnap_poll() for a job. */
int ida_bgsnap_read(struct ida_bgsnap *b,
                    uint8_t *dst,
                    size_t cap,
                    struct ida_bgsnap_slice *out);

/* A job whose child writes into an anonymous memory file (memfd) instead
 * of a pipe, for a copy the caller keeps whole (a backup, backup_copy.c): the
 * child runs at its own pace, not at the pace of the parent's reads,
 * encodes straight into a shared mapping of the file (one copy of the
 * snapshot in the child, not two), and the parent maps the result instead
 * of copying it. Returns as
 * ida_bgsnap_start(). */
int ida_bgsnap_start_mem(struct ida_bgsnap *b,
                         const struct ida_fsm *f,
                         ida_index index,
                         ida_term term);

/* For a job of ida_bgsnap_start_mem(): 0 (still running), 1 (done: *data
 * is the snapshot, *len bytes, a read-only mapping the caller releases
 * with ida_bgsnap_unmap(); the job is over) or minus an IDA_E* code (the
 * child failed, or wrote another size than it announced; the job is over;
 * -IDA_EINVAL: no such job). Never blocks. */
int ida_bgsnap_poll_mem(struct ida_bgsnap *b,
                        const uint8_t **data,
                        size_t *len);

/* Release a mapping of ida_bgsnap_poll_mem() (NULL: no-op). */
void ida_bgsnap_unmap(const uint8_t *data, size_t len);

/* Stop a running job (kill, reap, free). No-op without one. */
void ida_bgsnap_cancel(struct ida_bgsnap *b);

static inline int ida_bgsnap_running(const struct ida_bgsnap *b)
{
    return b->pid != 0;
}

#endif /* IDA_NODE_BGSNAP_H */
