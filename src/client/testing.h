/* libidalloc entry points for tests and benchmarks only; never installed,
 * never needed by an application. */
#ifndef IDA_CLIENT_TESTING_H
#define IDA_CLIENT_TESTING_H

#include <stdint.h>

#include "idalloc.h"

struct idalloc_next_stats
{
    uint64_t handed_out;            /* ids returned by idalloc_next() */
    uint64_t refills;               /* refills started */
    uint64_t refills_max_in_flight; /* never above 1 per pool */
    uint64_t waits;                 /* calls that had to wait for a refill */
    uint64_t block_size;            /* current block size */
};

/* idalloc_next() bookkeeping of @pool: 0, or IDA_ENOTFOUND when next() was
 * never called for it. */
int idalloc_next_stats(struct idalloc_client *c,
                       const char *pool,
                       struct idalloc_next_stats *out);

/* The acknowledgement floor @c would send now (the lowest request seq whose
 * answer it still wants) and the number of such seqs. */
void ida__client_floor(struct idalloc_client *c,
                       uint64_t *floor,
                       size_t *outstanding);

#endif /* IDA_CLIENT_TESTING_H */
