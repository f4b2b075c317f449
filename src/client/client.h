/* libidalloc internals shared by the client's files (not installed). */
#ifndef IDA_CLIENT_H
#define IDA_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "idalloc.h"
#include "proto/idalloc.pb-c.h"
#include "src/client/testing.h"
#include "src/common/config.h"
#include "src/common/tls.h"

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
    /* With TLS: the session, and the lock that orders its use by the
     * writers (under mu) and the reader (never holding mu with it). */
    struct ida_tls *tls;
    pthread_mutex_t tls_mu;
    /* Coalesced writes (client.c, conn_flush()): the frames of concurrent
     * calls wait in out while one of them, the writer, sends without mu;
     * the writer takes them all in one send. wbuf is the writer's batch;
     * written is signalled when writing drops to 0 (fd and tls change only
     * then). */
    uint8_t *out, *wbuf;
    size_t out_len, out_cap, wbuf_cap;
    int writing;
    pthread_cond_t written;
};

struct ida_next_pool; /* next.c */

struct idalloc_client
{
    struct idalloc_options opts;
    struct ida_tls_ctx *tls; /* NULL: plaintext */
    /* The session (sess_mu guards it): its client id, whether the cluster
     * registered it, the next request seq, and the seqs whose answers are
     * still wanted (calls in flight, and unknown ones not released); the
     * lowest of those is the acknowledgement floor sent on every write.
     * reg_mu serialises registrations. */
    pthread_mutex_t sess_mu;
    pthread_mutex_t reg_mu;
    uint8_t client_id[16];
    int registered;
    uint64_t next_seq;
    uint64_t next_read_seq; /* reads: only matched to their answers */
    uint64_t *outstanding;  /* unsorted; IDALLOC_OUTSTANDING_MAX slots */
    size_t n_outstanding;
    atomic_size_t leader; /* index of the node that last answered */
    /* The nodes known: the configured addresses, then those the cluster
     * named (NOT_LEADER hints, member lists), at most IDA_CONFIG_NODES_MAX.
     * A slot is filled before nconns counts it and never changes after. */
    struct ida_client_conn conns[IDA_CONFIG_NODES_MAX];
    atomic_size_t nconns;
    pthread_mutex_t conns_mu; /* serialises adding a node */
    pthread_mutex_t mu;       /* guards the next() pool list and refill queue */
    struct ida_next_pool *next_pools;
    uint64_t next_gen; /* unique per client object (next.c's thread caches) */
    pthread_cond_t refill_cond; /* wakes the refiller */
    pthread_t refiller;
    int refiller_running;
    int stopping;
};

/* Send @req to the leader, following hints and retrying other nodes with
 * the same request id until the call deadline. version, client_id,
 * request_seq and ack_below are filled in: for a write (@write) from the
 * session (registered first if needed) or from @call when it is UNKNOWN
 * (a repeat), for a read with a fresh seq. On 0, *resp is the decoded
 * answer (free with idalloc__client_response__free_unpacked) and its result
 * is not a session answer (IDA_EEXPIRED is handled here); it may still
 * carry a definite error. Else IDA_ETIMEDOUT (the request may have taken
 * effect), IDA_EUNAVAIL (nothing was sent, or only "not leader" answers
 * came: not carried out), IDA_ESESSION, IDA_ELIMIT, IDA_ETOOBIG or
 * IDA_ENOMEM, with the detail in @call. @call (not NULL) gets its request
 * id and state; ida__client_finish() settles it once the caller checked the
 * answer. */
int ida__client_call(struct idalloc_client *c,
                     Idalloc__ClientRequest *req,
                     int write,
                     struct idalloc_call *call,
                     Idalloc__ClientResponse **resp);

/* Settle @call after a write ended with @rv (returned): the request id
 * stays wanted (UNKNOWN) for an unknown outcome when @keep (the caller holds
 * the call struct), else it is released; "not carried out" (IDA_EUNAVAIL)
 * makes a fresh call NEW again, but keeps a repeat (@replay) UNKNOWN. */
int ida__client_finish(struct idalloc_client *c,
                       struct idalloc_call *call,
                       int rv,
                       int keep,
                       int replay);

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

/* Write the detail of an error into @call (NULL: dropped). */
void ida__call_error(struct idalloc_call *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
uint64_t ida__client_now_ms(void);

/* next.c: start and stop the refiller thread. */
int ida__client_next_start(struct idalloc_client *c);
void ida__client_next_stop(struct idalloc_client *c);

#endif /* IDA_CLIENT_H */
