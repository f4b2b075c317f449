/* A fault proxy for the links between nodes. Each directed link i -> j has
 * a listener on 127.0.0.1; node i dials node j there (the chaos run's
 * connect() shim, tests/chaos/shim/connect_shim.c, sends it there when it
 * dials node j's real peer port), and the proxy forwards to node j's real
 * peer port. Blocking a link closes its
 * connections and refuses new ones until it is unblocked: to the nodes it
 * looks like a network that lost every packet on that link. Blocking i -> j
 * but not j -> i is one-way loss. */
#ifndef IDA_CHAOS_PROXY_H
#define IDA_CHAOS_PROXY_H

#include <pthread.h>
#include <stdint.h>

#define PROXY_NODES_MAX 5

struct proxy;

/* Start proxies for @n nodes whose real peer ports are @peer_port[0..n).
 * The listen port of link i -> j is proxy_port(p, i, j). */
struct proxy *proxy_start(int n, const uint16_t *peer_port);
uint16_t proxy_port(const struct proxy *p, int from, int to);
/* Block or unblock link @from -> @to (thread-safe). */
void proxy_block(struct proxy *p, int from, int to, int blocked);
/* Unblock every link. */
void proxy_heal(struct proxy *p);
/* Connections link @from -> @to carried so far (thread-safe). */
unsigned proxy_opened(struct proxy *p, int from, int to);
void proxy_stop(struct proxy *p);

#endif
