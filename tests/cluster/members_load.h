/* Support of the membership tests with real processes (test_resize.c,
 * test_join.c): load threads that allocate by tag and reserve blocks while
 * the membership changes, membership changes repeated until they answer,
 * waits on the leader's member list, and the final check that every
 * acknowledged id was kept and none given twice.
 *
 * Every wait polls with a generous deadline (a loaded 2-core machine) and
 * fails the calling Criterion test when it runs out. */
#ifndef IDA_TESTS_CLUSTER_MEMBERS_LOAD_H
#define IDA_TESTS_CLUSTER_MEMBERS_LOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "idalloc.h"
#include "tests/lib/harness.h"

#define ML_TAGS_MAX   20000
#define ML_BLOCKS_MAX 20000

/* One load thread (ml_load_main): tagged allocs in pool "b" (tags
 * "w<no>-<k>"), and reserves of 10 ids in pool "s" every 4th op, until
 * *stop. */
struct ml_load
{
    int no;
    struct idalloc_client *cl;
    atomic_int *stop;
    uint64_t ids[ML_TAGS_MAX]; /* id + 1 acknowledged for tag k, 0: none */
    size_t tags;               /* tags tried */
    uint64_t first[ML_BLOCKS_MAX];
    size_t blocks;
    uint64_t acked, unknown;
};

void *ml_load_main(void *arg);

/* Create the pools the load uses: "b" (bounded, 1,000,000 ids) and "s"
 * (sequence), through @op. */
void ml_pools(struct idalloc_client *op);

/* Start load thread @no on @th, its calls through @cl (which it owns). */
void ml_load_start(struct ml_load *ld,
                   int no,
                   atomic_int *stop,
                   struct idalloc_client *cl,
                   pthread_t *th);

/* A client of the client addresses @addrs only (call timeout 5 s). */
struct idalloc_client *ml_client_of(const char *addrs);

/* The voters of the leader's member list (0 when it cannot be read). */
size_t ml_count_voters(struct idalloc_client *cl);
/* 1 if member @id is a voter, 0 if not (or not a member), -1 on error. */
int ml_is_voter(struct idalloc_client *cl, unsigned id);

/* One change, repeated while its outcome is unknown (repeating is safe: a
 * change already made answers changed = 0); asserts it succeeded. @peer
 * and @client (NULL: none) go with add and update. */
void ml_change(struct idalloc_client *cl,
               enum idalloc_member_op op,
               unsigned id,
               const char *peer,
               const char *client);

/* Until the leader has heard node @id (its member list shows it, waiting
 * or member): a node the others did not know yet is heard once its own
 * link to them is up. */
void ml_wait_heard(struct idalloc_client *cl, unsigned id);
/* Until member @id's voter flag is @voter. */
void ml_wait_voter(struct idalloc_client *cl, unsigned id, int voter);
/* Until the leader's member list names member @id at @peer and @client
 * with its link up (connected). */
void ml_wait_member_at(struct idalloc_client *cl,
                       unsigned id,
                       const char *peer,
                       const char *client);

/* Every acknowledged tag of @ld[0..n) still holds its id (read through
 * @op); no id was acknowledged to two tags; no two acknowledged blocks
 * overlap. Logs the counts (@during: acknowledged during the changes). */
void ml_check_acked(struct idalloc_client *op,
                    const struct ml_load *ld,
                    size_t n,
                    uint64_t during);

/* A loopback port the kernel just handed out that no address of @c's
 * cluster file uses, nor any of @taken[0..n). */
unsigned ml_new_port(const struct tc *c, const unsigned *taken, size_t n);

/* Whether node @node's (1-based) log holds @needle; ml_wait_log() waits
 * up to @ms for it. */
int ml_log_has(const struct tc *c, int node, const char *needle);
int ml_wait_log(const struct tc *c, int node, const char *needle, unsigned ms);

/* Run `idalloc ARGS` (ARGS from @fmt) with stdout and stderr in @out,
 * repeated while it exits 3 (no leader, or outcome unknown: repeating a
 * membership command is safe), for up to 60 s. Returns the last exit. */
int ml_cli(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
