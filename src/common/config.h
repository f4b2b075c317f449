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
 *                                     a node snapshots every N applied entries
 *   log_level LEVEL                   optional; debug|info|warn|error;
 *                                     default info
 *   auto_rejoin on|off                optional; default on: a leader
 *                                     re-admits a member that came back
 *                                     with a new, empty data directory
 *                                     (src/node/member.h)
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

#endif /* IDA_CONFIG_H */
