/* Limits of the node's accepted connections: who gets a slot, who is
 * evicted, who timed out, and one log line a second saying what was closed.
 *
 * DESIGN: pure bookkeeping on a clock the caller passes in milliseconds (no
 * libuv, no sockets), so tests drive it with exact times; src/node/net_conn.c
 * owns the sockets, embeds a struct ida_netlim_entry in each accepted
 * connection and closes what this module names.
 *
 * Classes: CLIENT (ordinary client connections, at most client_max),
 * RESERVE (client connections accepted past client_max, at most
 * reserve_max, that may only ask for status, so an operator's `idalloc
 * status` still gets through when every ordinary slot is busy) and PEER
 * (connections other nodes dialled to our peer port, at most peer_max).
 * Each class is a list in order of last activity (a whole frame received
 * or a reply sent): the head is the least recently active.
 *
 * Admission (ida_netlim_admit): a new client connection takes a free CLIENT
 * slot; else the least recently active CLIENT connection is evicted if it
 * has been idle (no request awaiting its reply) for at least evict_idle_ms;
 * else it takes a RESERVE slot, or evicts an idle RESERVE connection; else
 * it is refused (the caller accepts and closes it at once, so it does not
 * sit in the kernel's backlog). A flood of idle connections thus cycles
 * through the slots without holding out a client that is active, and a new
 * peer connection evicts an idle one (real links carry heartbeats every
 * heartbeat_ms; a silent link is simply redialled).
 *
 * Timeouts (ida_netlim_expired): a frame must be whole within
 * frame_timeout_ms of the read that started it (peer_frame_timeout_ms for
 * peers); a client connection with no activity for idle_timeout_ms is
 * closed (peers have no idle timeout: a follower may never send to another
 * follower). Both lists are ordered by the time they test, so a check costs
 * O(1) per expired connection.
 */
#ifndef IDA_NETLIM_H
#define IDA_NETLIM_H

#include <stddef.h>
#include <stdint.h>

enum ida_netlim_class {
    IDA_NETLIM_CLIENT,
    IDA_NETLIM_RESERVE,
    IDA_NETLIM_PEER,
    IDA_NETLIM_CLASSES
};

/* Why a connection was closed (counted for the summary line). */
enum ida_netlim_reason {
    IDA_NETLIM_REFUSED,       /* at accept: every slot held by an active one */
    IDA_NETLIM_EVICTED,       /* made room for a new connection */
    IDA_NETLIM_IDLE,          /* no activity for idle_timeout_ms */
    IDA_NETLIM_FRAME_TIMEOUT, /* a frame not whole within the timeout */
    IDA_NETLIM_QUEUE,    /* its queued output reached the per-connection cap */
    IDA_NETLIM_OUTPUT,   /* output to all clients at its cap */
    IDA_NETLIM_INPUT,    /* buffered input of all clients at its cap */
    IDA_NETLIM_PROTOCOL, /* garbage, oversized or undecodable frame */
    IDA_NETLIM_RESERVE_ONLY, /* a reserve connection asked for more than status
                              */
    IDA_NETLIM_REASONS
};

struct ida_netlim_entry
{
    struct ida_netlim_entry *prev, *next;   /* its class, by last activity */
    struct ida_netlim_entry *pprev, *pnext; /* its class's partial frames */
    uint64_t last_active_ms;
    uint64_t frame_start_ms;
    enum ida_netlim_class cls;
    int linked;       /* in a class list */
    int in_partial;   /* in a partial-frame list */
    unsigned pending; /* requests handed on and not answered yet */
};

struct ida_netlim_config
{
    uint64_t client_max;  /* ordinary client connections, >= 1 */
    uint64_t reserve_max; /* status-only client connections past it */
    uint64_t peer_max;    /* accepted peer connections, >= 1 */
    uint64_t idle_timeout_ms;
    uint64_t frame_timeout_ms;
    uint64_t peer_frame_timeout_ms;
    uint64_t evict_idle_ms; /* idle at least this long to be evicted */
    uint64_t summary_ms;    /* at most one summary line per this */
};

struct ida_netlim_list
{
    struct ida_netlim_entry *head, *tail;
    size_t count;
};

struct ida_netlim
{
    struct ida_netlim_config cfg;
    struct ida_netlim_list lru[IDA_NETLIM_CLASSES];
    struct ida_netlim_list partial[IDA_NETLIM_CLASSES];
    uint64_t closed[IDA_NETLIM_REASONS];       /* since the last summary */
    uint64_t closed_total[IDA_NETLIM_REASONS]; /* since init */
    uint64_t last_summary_ms;
};

void ida_netlim_init(struct ida_netlim *l,
                     const struct ida_netlim_config *cfg,
                     uint64_t now_ms);

/* Where a new connection dialled to the client port (@cls CLIENT) or the
 * peer port (@cls PEER) goes: CLIENT, RESERVE or PEER, or -1 to refuse it
 * (counted as REFUSED). When *victim is set, that connection was unlinked
 * and counted as EVICTED: the caller closes it. */
int ida_netlim_admit(struct ida_netlim *l,
                     enum ida_netlim_class cls,
                     uint64_t now_ms,
                     struct ida_netlim_entry **victim);

/* Link @e (zeroed by the caller) into class @cls, active now. */
void ida_netlim_add(struct ida_netlim *l,
                    struct ida_netlim_entry *e,
                    enum ida_netlim_class cls,
                    uint64_t now_ms);

/* Unlink @e (a no-op when it is not linked). */
void ida_netlim_remove(struct ida_netlim *l, struct ida_netlim_entry *e);

/* @e was active now (a reply went out): it moves to the tail. */
void ida_netlim_touch(struct ida_netlim *l,
                      struct ida_netlim_entry *e,
                      uint64_t now_ms);

/* After a read: @frames whole frames arrived (activity), and @busy says
 * whether part of a frame is now buffered (its timeout starts now when a
 * new frame began). */
void ida_netlim_input(struct ida_netlim *l,
                      struct ida_netlim_entry *e,
                      int busy,
                      unsigned frames,
                      uint64_t now_ms);

/* The next connection past a timeout at @now_ms, unlinked and counted (its
 * reason in *reason), or NULL. Call until NULL, closing each. */
struct ida_netlim_entry *ida_netlim_expired(struct ida_netlim *l,
                                            uint64_t now_ms,
                                            enum ida_netlim_reason *reason);

/* Count a close for @reason (the summary line). */
void ida_netlim_count(struct ida_netlim *l, enum ida_netlim_reason reason);

/* When connections were closed since the last summary and summary_ms has
 * passed, write one line into @buf ("closed 1000 connection(s) in the last
 * 1.0 s: 1000 frame timeout") and return 1; else 0. */
int ida_netlim_summary(struct ida_netlim *l,
                       uint64_t now_ms,
                       char *buf,
                       size_t cap);

/* The name of a reason, as in the summary line. */
const char *ida_netlim_reason_name(enum ida_netlim_reason r);

/* Descriptors: raise the soft RLIMIT_NOFILE to the hard limit and return
 * the soft limit now in effect (0 if it cannot be read). */
uint64_t ida_netlim_raise_nofile(void);

/* Fit @client_max + @reserve_max client connections into @nofile
 * descriptors of which @fd_reserve are kept for everything else (peers,
 * data files, logs, listeners). Shrinks the two (reserve first kept, at
 * most half of what is left) and returns 1 when it had to; client_max
 * stays at least 1. */
int ida_netlim_clamp(uint64_t nofile,
                     uint64_t fd_reserve,
                     uint64_t *client_max,
                     uint64_t *reserve_max);

#endif /* IDA_NETLIM_H */
