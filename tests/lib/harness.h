/* Process-level test harness: real idallocd processes on free loopback
 * ports, in a temporary directory, driven by the client library.
 * Every process a test starts is stopped by tc_destroy(). */
#ifndef IDA_TEST_HARNESS_H
#define IDA_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "idalloc.h"
#include "src/common/config.h"

#define TC_NODES_MAX 5

struct tc
{
    int n;
    char dir[256];   /* temporary directory: config, data, logs */
    char conf[320];  /* the cluster file */
    char tls[320];   /* its certificates: ca.crt, nodeI.*, client1-2.* */
    char addrs[512]; /* client addresses, comma-separated */
    pid_t pid[TC_NODES_MAX]; /* 0: not running */
    struct ida_config cfg;
    /* Per-node cluster files (""-: use conf). */
    char node_conf[TC_NODES_MAX][320];
    /* Per-node extra arguments of idallocd, separated by spaces (""-:
     * none): a node outside the cluster file gets --peer, --client and
     * --join here. */
    char node_args[TC_NODES_MAX][512];
    /* Per-node environment, NAME=VALUE entries separated by spaces (""-:
     * the test's own), each over the test's variable of that name: the
     * chaos test preloads its connect() shim into its nodes here. */
    char node_env[TC_NODES_MAX][1024];
    /* 0: nodes inherit the test's RLIMIT_NOFILE; else they start with a
     * hard limit of nofile and a soft one of min(nofile, 1024), like a
     * default login (the attack tests run nodes with few descriptors). */
    unsigned nofile;
};

/* Write a cluster of @n nodes (extra config lines in @extra, may be NULL)
 * and start every node. Peers use mutual TLS: `idalloc certs create` writes
 * a CA, n node and 2 client certificates into c->tls, and the cluster file
 * says `tls_dir tls` (unless @extra has a tls_dir line of its own; "peer_tls
 * off" in @extra runs plaintext peers). */
void tc_start(struct tc *c, int n, const char *extra);
/* tc_start() with @edit(@c, @arg) run after tc_setup() and before the
 * spawns (to change the cluster file or c->nofile; NULL: nothing). Both
 * start again from tc_setup() (at most 3 more times) when a node could not
 * bind an address: the harness picks free ports by binding and closing
 * them, so a test running at the same time may take one first. */
void tc_start_edited(struct tc *c,
                     int n,
                     const char *extra,
                     void (*edit)(struct tc *c, void *arg),
                     void *arg);
/* Spawn every node of @c, then wait (at most 5 s) until each logged that
 * it started or ended; returns tc_port_taken(). */
int tc_spawn_all(struct tc *c);
/* Whether a node of @c logged that it could not bind one of its addresses
 * (peer, client or metrics). */
int tc_port_taken(const struct tc *c);
/* The same without starting anything. */
void tc_setup(struct tc *c, int n, const char *extra);
/* Start node @i (0-based) again: idallocd --config FILE --node I+1, then
 * node_args[i]. */
void tc_spawn(struct tc *c, int i);
/* Send @sig to node @i; for SIGKILL/SIGTERM wait for it and return its exit
 * status (as from waitpid), else 0. */
int tc_signal(struct tc *c, int i, int sig);
/* The state letter /proc shows for process @pid ('T': stopped, 'Z': it
 * exited), 0 once it is gone. */
char tc_proc_state(pid_t pid);
/* Did node @i end on its own (exit, crash)? Reaps it without waiting: 1
 * with c->pid[i] = 0 and its wait status in *@status (may be NULL), else
 * 0 (running, stopped, or not started). */
int tc_reap(struct tc *c, int i, int *status);
/* Kill every node (SIGKILL) and remove the directory. */
void tc_destroy(struct tc *c);
/* A client of the cluster (call timeouts in ms); with `client_tls on` or
 * `required` in the cluster file it speaks TLS as client1. */
struct idalloc_client *tc_client(struct tc *c, unsigned call_ms);
/* Wait up to @ms for a leader all running nodes agree on; its index
 * (0-based), or -1. */
int tc_wait_leader(struct tc *c, unsigned ms);
/* Wait up to @ms until every running node applied at least @index. */
int tc_wait_applied(struct tc *c, uint64_t index, unsigned ms);
/* The highest commit index any running node reports. */
uint64_t tc_commit_index(struct tc *c);
/* Path of a built program (bin/idalloc...) honouring $IDA_BINDIR; valid
 * until the calling thread's fourth call after this one. */
const char *tc_bin(const char *name);
/* Run a shell command line, capturing stdout into @out (its first @cap - 1
 * bytes; the rest is read and dropped, so the command never dies of
 * SIGPIPE); returns the exit status. Safe from several threads at once. */
int tc_run(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* How many lines of node @i's log (of @c) hold @needle. */
int tc_log_count(const struct tc *c, int i, const char *needle);
/* A loopback TCP port that was free a moment ago, below the kernel's
 * ephemeral range (no outgoing connection can take it), never the same
 * twice in one process. Safe from several threads. */
unsigned tc_free_port(void);
/* Put metrics=127.0.0.1:PORT on node @i's line of @c's cluster file (a
 * port of tc_free_port()) and return PORT. Before the node starts. */
unsigned tc_add_metrics(struct tc *c, int i);
/* @method @path over HTTP/1.0 to 127.0.0.1:@port: the status code, the
 * body in @body (cut to @cap - 1 bytes), or -1 when nothing answered. */
int tc_http(unsigned port,
            const char *method,
            const char *path,
            char *body,
            size_t cap);
/* The value of the series @series ("name" or "name{labels}") in the
 * metrics text @body, -1 when it has no such line. */
double tc_metric(const char *body, const char *series);
/* A struct idalloc_call for one call's error detail in a test's failure
 * message: tc_detail() makes the calling thread's one NEW again and
 * returns it (pass it as the call's last argument), tc_errmsg() is its
 * detail after the call. */
struct idalloc_call *tc_detail(void);
const char *tc_errmsg(void);
uint64_t tc_now_ms(void);
void tc_sleep_ms(unsigned ms);
/* A tag of exactly @bytes bytes (plus the NUL) unique to writer @t's @i-th
 * call, "t<t>-<i>-" padded with 'x': long tags make a large state (a
 * snapshot of many chunks) from few calls. @tag holds @bytes + 1. */
void tc_long_tag(char *tag, size_t bytes, int t, int i);

#endif
