/* A forging client for the attack tests (issue 16): raw loopback sockets,
 * frames encoded by hand, many connections at once, and what a process
 * costs (/proc/PID/status). Nothing here goes through the client library:
 * an attacker does not use it. build/prog/forge (tests/attack/forge_main.c)
 * holds idle connections from a process of its own. */
#ifndef IDA_TEST_FORGE_H
#define IDA_TEST_FORGE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/idalloc.pb-c.h"

/* Raise this process's soft RLIMIT_NOFILE to the hard limit; returns it. */
long forge_raise_nofile(void);

/* A blocking TCP connection to "IPv4:PORT", or -1. */
int forge_connect(const char *addr);

/* Open up to @n connections to @addr at once (non-blocking connects, then
 * waited for up to @ms); the established ones go to @fds (blocking mode).
 * Returns how many. */
int forge_open_many(const char *addr, int n, int *fds, unsigned ms);

/* The 6-byte frame header, by hand: 0xA1, @type, @len big-endian. */
void forge_header(uint8_t out[6], uint8_t type, uint32_t len);

/* send() everything (MSG_NOSIGNAL); 0 or -1. */
int forge_send(int fd, const void *p, size_t n);

/* Wait up to @ms for every fd of @fds to be closed by the other side
 * (EOF or reset; what arrives first is read and dropped). Returns how many
 * were; each one seen closed is set to -1 in @fds after close(). */
int forge_wait_closed(int *fds, int n, unsigned ms);

/* Like forge_wait_closed() without reading anything: a connection counts
 * as closed once the other side hung up (POLLRDHUP, POLLHUP or POLLERR),
 * even with unread data still queued to us (a client that never reads). */
int forge_wait_hangup(int *fds, int n, unsigned ms);

/* A PeerMessage as a whole frame in a malloc'd buffer (*len bytes), with
 * version, cluster, from, to, term and from_incarnation filled in. */
uint8_t *forge_peer_frame(Idalloc__PeerMessage *m,
                          const char *cluster,
                          unsigned from,
                          unsigned to,
                          uint64_t term,
                          uint64_t from_inc,
                          size_t *len);

/* A ClientRequest as a whole frame (version filled in), malloc'd. */
uint8_t *forge_client_frame(Idalloc__ClientRequest *r, size_t *len);

/* A field of /proc/PID/status in kB ("VmRSS", "VmHWM", "VmSize"), -1 if
 * the process or field is missing. */
long forge_proc_kb(pid_t pid, const char *field);

/* Open descriptors of @pid, -1 if unknown. */
int forge_fd_count(pid_t pid);

/* Whether @pid (a child) still runs (waitpid WNOHANG). */
int forge_alive(pid_t pid);

/* Count lines of @path containing @needle. */
int forge_log_count(const char *path, const char *needle);

/* build/prog/forge in a process of its own ($IDA_BUILD, default build). */
struct forge_proc
{
    pid_t pid;
    int in_fd; /* its stdin: closing it ends the process */
    int opened;
};

/* Start `forge MODE ADDR COUNT [LEN]` and wait until it reports how many
 * connections it holds (p->opened). 0 or -1. */
int forge_proc_start(struct forge_proc *p,
                     const char *mode,
                     const char *addr,
                     int count,
                     unsigned len);
/* Kill it (its connections close) and reap it. */
void forge_proc_stop(struct forge_proc *p);

#endif
