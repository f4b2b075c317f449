/* The cluster file (README.md, "Cluster file").
 *
 * One setting per line; a `#` at the start of a line or after a space or
 * tab starts a comment (a `#` inside a field is part of it: `data_dir
 * /srv/a#1`); blank lines are ignored; fields are separated by spaces or
 * tabs. Keys:
 *
 *   cluster NAME                      required, once; [A-Za-z0-9._-],
 *                                     1-64 chars
 *   node ID PEER_ADDR CLIENT_ADDR     required, 1 to IDA_CONFIG_NODES_MAX
 *                                     lines; ID in [1, 65535]; addresses
 *                                     are IPv4:PORT or [IPv6]:PORT,
 *                                     numeric only, and not 0.0.0.0 or
 *                                     :: (other nodes and clients dial
 *                                     them)
 *   data_dir PATH                     optional, once; default "data"; node N
 *                                     keeps its files in PATH/nodeN; a
 *                                     relative PATH is relative to the
 *                                     working directory of the process
 *   election_timeout_ms N             optional; default 300; [10, 600000]
 *   heartbeat_ms N                    optional; default 50; must be less
 *                                     than election_timeout_ms
 *   snapshot_interval_entries N       optional; default 10000; [1, 10^9]:
 *                                     the floor of the snapshot rule (see
 *                                     src/node/snap_policy.h)
 *   log_level LEVEL                   optional; debug|info|warn|error;
 *                                     default info
 *   huge_page_collapse on|off         optional; default on: a thread
 *                                     collapses large written memory into
 *                                     huge pages (base/collapse.h); off:
 *                                     khugepaged does it, when it gets to
 *                                     it
 *   auto_rejoin on|off                optional; default on: a leader
 *                                     re-admits a member that came back
 *                                     with a new, empty data directory
 *                                     (src/node/member.h)
 *   tls_dir DIR                       DIR holds ca.crt, nodeI.crt and
 *                                     nodeI.key (src/common/tls.h); a
 *                                     relative DIR is relative to the
 *                                     directory of the cluster file; turns
 *                                     mutual TLS on for peers
 *   peer_tls on|off                   on (the default with tls_dir) needs
 *                                     tls_dir; off: plaintext peers. A file
 *                                     with neither tls_dir nor peer_tls is
 *                                     refused, naming both
 *   client_tls off|on|required        default off; on: the client port takes
 *                                     TLS and plain clients; required: only
 *                                     TLS clients with a certificate of the
 *                                     CA. on and required need tls_dir
 *
 * Limits of the client port (src/node/net.h says how each is enforced):
 *
 *   client_connections_max N          default 4096; [1, 1000000]; clamped
 *                                     at start to what RLIMIT_NOFILE
 *                                     leaves after the node's own reserve
 *   client_connections_reserve N      default 16; [0, 1024]: connections
 *                                     past client_connections_max that may
 *                                     only ask for status
 *   client_idle_timeout_ms N          default 300000; [100, 86400000]
 *   client_frame_timeout_ms N         default 10000; [10, 3600000]: a
 *                                     frame must be whole this long after
 *                                     its first byte
 *   client_queue_bytes_max N          default 16 MiB; [65536, 2^30]: output
 *                                     queued to one connection
 *   client_output_bytes_max N         default 64 MiB; [65536, 2^40]: output
 *                                     queued to all client connections; at
 *                                     least client_queue_bytes_max
 *   client_input_bytes_max N          default 64 MiB; [4 MiB, 2^40]: partial
 *                                     frames buffered from all client
 *                                     connections
 *
 * Every error names the file and line: `local-3.conf:7: unknown key
 * "heartbeat"`. Parsing validates everything before returning; on error
 * *out is left zeroed.
 */
#ifndef IDA_CONFIG_H
#define IDA_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define IDA_CONFIG_NODES_MAX 16
#define IDA_CLUSTER_NAME_MAX 64
#define IDA_ADDR_TEXT_MAX    64
#define IDA_PATH_MAX         1024
#define IDA_CONFIG_LINE_MAX  1024
#define IDA_ERRMSG_MAX       512

struct ida_addr
{
    char host[48]; /* numeric IPv4 or IPv6, no brackets */
    uint16_t port;
    int family;                   /* AF_INET or AF_INET6 */
    char text[IDA_ADDR_TEXT_MAX]; /* as written: "127.0.0.1:7101" */
};

struct ida_config_node
{
    unsigned id;
    struct ida_addr peer;
    struct ida_addr client;
    /* metrics=HOST:PORT on the node line: Prometheus /metrics and /healthz
     * (src/node/metrics.h); off when absent. */
    int has_metrics;
    struct ida_addr metrics;
};

enum ida_client_tls {
    IDA_CLIENT_TLS_OFF = 0,
    IDA_CLIENT_TLS_ON,
    IDA_CLIENT_TLS_REQUIRED,
};

struct ida_config
{
    char cluster[IDA_CLUSTER_NAME_MAX + 1];
    struct ida_config_node nodes[IDA_CONFIG_NODES_MAX];
    unsigned node_count;
    char data_dir[IDA_PATH_MAX];
    unsigned election_timeout_ms;
    unsigned heartbeat_ms;
    uint64_t snapshot_interval_entries;
    enum ida_log_level log_level;
    int auto_rejoin; /* re-admit a member's new incarnation (default 1) */
    int huge_page_collapse; /* run the collapser (default 1) */
    /* Client port limits (above). */
    uint64_t client_connections_max;
    uint64_t client_connections_reserve;
    uint64_t client_idle_timeout_ms;
    uint64_t client_frame_timeout_ms;
    uint64_t client_queue_bytes_max;
    uint64_t client_output_bytes_max;
    uint64_t client_input_bytes_max;
    char tls_dir[IDA_PATH_MAX]; /* resolved; "" without a tls_dir line */
    int peer_tls;               /* 1: mutual TLS between peers */
    enum ida_client_tls client_tls;
};

/* Parse @text (@len bytes; need not be NUL-terminated) read from a file
 * called @name (used in messages). Returns 0 or IDA_ECONFIG with a one-line
 * "name:line: what" message in @errmsg (IDA_ERRMSG_MAX bytes). */
int ida_config_parse(const char *text,
                     size_t len,
                     const char *name,
                     struct ida_config *out,
                     char *errmsg);

/* Read and parse the file at @path. Returns 0, IDA_ECONFIG (bad content) or
 * IDA_EIO (cannot read: the message names the path and the reason). */
int ida_config_load(const char *path, struct ida_config *out, char *errmsg);

/* The node with @id, or NULL. */
const struct ida_config_node *ida_config_node(const struct ida_config *c,
                                              unsigned id);

/* Parse "1.2.3.4:5" or "[::1]:5". Returns 0 or IDA_EINVAL. */
int ida_addr_parse(const char *s, struct ida_addr *out);

/* Whether @a is 0.0.0.0, :: or ::ffff:0.0.0.0 ("any address": fine to
 * bind, but not an address other nodes and clients can dial). */
int ida_addr_unspecified(const struct ida_addr *a);

#endif /* IDA_CONFIG_H */
