/* libidalloc internals shared by the client's files (not installed). */
#ifndef IDA_CLIENT_H
#define IDA_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "idalloc.h"
#include "proto/idalloc.pb-c.h"
#include "src/common/config.h"

/* The cluster's limits on names and tags (fsm/fsm.h, IDA_POOL_NAME_MAX and
 * IDA_TAG_BYTES_MAX; src/node checks they agree): the library refuses what
 * the cluster would, before sending anything. */
#define IDA_CLIENT_POOL_NAME_MAX 64
#define IDA_CLIENT_TAG_BYTES_MAX 128

struct ida_client_conn
{
    struct ida_addr addr;
    pthread_mutex_t mu; /* guards everything below */
    int fd;             /* -1: not connected */
    int dead;           /* the reader saw EOF or an error */
    pthread_t reader;
    struct waiter *waiters;
};

struct ida_next_pool; /* next.c */

struct idalloc_client
{
    struct idalloc_options opts;
    uint8_t client_id[16];
    atomic_uint_fast64_t next_seq;
    atomic_size_t leader; /* index of the node that last answered */
    /* The nodes known: the configured addresses, then those the cluster
     * named (NOT_LEADER hints, member lists), at most IDA_CONFIG_NODES_MAX.
     * A slot is filled before nconns counts it and never changes after. */
    struct ida_client_conn conns[IDA_CONFIG_NODES_MAX];
    atomic_size_t nconns;
    pthread_mutex_t conns_mu; /* serialises adding a node */
    pthread_mutex_t mu;       /* guards the next() pool list and refill queue */
    struct ida_next_pool *next_pools;
    pthread_cond_t refill_cond; /* wakes the refiller */
    pthread_t refiller;
    int refiller_running;
    int stopping;
};

/* Send @req (client_id, version and, when 0, request_seq are filled in) to
 * the leader, following hints and retrying other nodes with the same
 * request id until the call deadline. On 0, *resp is the decoded answer
 * (free with idalloc__client_response__free_unpacked); its result may still
 * carry a definite error. Else IDA_ETIMEDOUT (the request may have taken
 * effect), IDA_EUNAVAIL (nothing
 * was sent, or only "not leader" answers came: not carried out), IDA_ETOOBIG or
 * IDA_ENOMEM. */
int ida__client_call(struct idalloc_client *c,
                     Idalloc__ClientRequest *req,
                     Idalloc__ClientResponse **resp);

/* The index of the node with client address @addr, adding it to the known
 * nodes if it is new (bounded: SIZE_MAX when the table is full or @addr is
 * not an address). */
size_t ida__client_learn(struct idalloc_client *c, const char *addr);

/* Learn every member address a response carries. */
void ida__client_learn_members(struct idalloc_client *c,
                               const Idalloc__ClientResponse *r);

/* One attempt at node @node only, no retries (status). */
int ida__client_call_node(struct idalloc_client *c,
                          size_t node,
                          Idalloc__ClientRequest *req,
                          Idalloc__ClientResponse **resp);

void ida__client_set_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
uint64_t ida__client_now_ms(void);

/* next.c: start and stop the refiller thread. */
int ida__client_next_start(struct idalloc_client *c);
void ida__client_next_stop(struct idalloc_client *c);

#endif /* IDA_CLIENT_H */
