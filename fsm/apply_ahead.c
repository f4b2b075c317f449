/* Applying a run of committed entries with a lent thread decoding ahead
 * (fsm.h, ida_fsm_apply_entries()).
 *
 * DESIGN. Applying an entry is decoding its CommandBatch (fsm/batch.c),
 * working out what each command's bytes alone decide (struct ida__cmd_pre:
 * the fingerprint its session keeps, the hashes of its client id and tag
 * that the tables' lookups use, the tag's check), then the commands
 * themselves. The first two read only the entry's bytes, so they can run
 * on another thread; the third must run in log order on the state.
 * At 10 M allocations a restarted node replays up to ~40 k entries of its
 * log (~1 M commands, ~0.5 s on one core) while its second core idles:
 * decoding and hashing are about two fifths of that (perf of a restart:
 * the hand reader, the varints and the fingerprints' FNV chains).
 *
 * The entries go in blocks of BLOCK_ENTRIES (fewer when they hold more than
 * BLOCK_BYTES: a restore command carries a whole state, so decoded blocks
 * are bounded by bytes too, not only by count). While the caller applies
 * one block, the lent thread decodes the next into an arena of its own:
 * two blocks, swapped after each join. The helper's start and join are the
 * only synchronization (struct ida_fsm_helper), so a block is never read
 * and written at once; a thread is started per block. In a restarting node
 * of 10 M allocations, a start took 0.7 ms on average from the request to
 * the block's first decoded entry (a new thread in a process of gigabytes,
 * its other threads faulting memory in): with blocks of 128 entries that
 * was 0.14 s of a 0.7 s replay of 24 k entries. So blocks grow: the first
 * holds BLOCK_ENTRIES_FIRST entries (decoded by the caller alone, so the
 * helper starts early), each next one twice as many, up to BLOCK_ENTRIES:
 * a long replay starts a thread per 1024 entries (~0.01 s in all at 24 k),
 * a short run still has the helper from its 129th entry on.
 *
 * Same answers: the decoded batch is the one ida_fsm_apply() would build
 * (ida__batch_unpack() is pure, whatever arena it fills), and what
 * ida__fsm_pre() works out is a pure function of the command and its
 * batch's version. An entry the lent thread
 * could not decode for want of memory is decoded again by the caller
 * through ida_fsm_apply(), so memory short on one thread still never
 * makes an entry look malformed. */
#include "fsm/fsm.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

/* Entries per block: the first, and at most (the lent thread is started
 * once per block). */
#define BLOCK_ENTRIES_FIRST 128
#define BLOCK_ENTRIES       1024
/* A block ends after the entry that brings its bytes to this (decoded, a
 * batch takes about twice its encoded size). */
#define BLOCK_BYTES (4u << 20)

/* One entry decoded ahead. */
struct ahead
{
    const Idalloc__CommandBatch *b; /* NULL: not NORMAL, malformed, or
                                       to redo */
    const struct ida__cmd_pre *pre; /* per command; NULL: not computed */
    bool redo; /* no memory to decode it here: the caller decodes it */
};

struct block
{
    const struct ida_entry *e;
    size_t n;
    struct ida__arena arena; /* everything decoded for the block */
    struct ahead d[BLOCK_ENTRIES];
};

static void decode_block(void *arg)
{
    struct block *k = arg;
    ida__arena_reset(&k->arena);
    for (size_t i = 0; i < k->n; i++) {
        const struct ida_entry *e = &k->e[i];
        struct ahead *d = &k->d[i];
        memset(d, 0, sizeof(*d));
        if (e->type != IDA_ENTRY_NORMAL) {
            continue;
        }
        k->arena.failed = false;
        const Idalloc__CommandBatch *b =
            ida__batch_unpack(&k->arena, e->data, e->len);
        d->b = b;
        if (b == NULL) {
            d->redo = k->arena.failed;
            continue;
        }
        if (b->n_commands == 0 || b->n_commands > IDA_BATCH_COMMANDS_MAX) {
            continue; /* nothing to hash, or refused whole */
        }
        struct ida__cmd_pre *pre =
            ida__arena_alloc(&k->arena, b->n_commands * sizeof(*pre));
        if (pre == NULL) {
            continue; /* the caller works them out as it applies */
        }
        for (size_t c = 0; c < b->n_commands; c++) {
            ida__fsm_pre(b->commands[c], b->version, &pre[c]);
        }
        d->pre = pre;
    }
}

/* Apply the @n entries @e in order, as decoded in @d, or decoding each
 * (@d NULL, or an entry to redo). */
static int apply_run(struct ida_fsm *f,
                     const struct ida_entry *e,
                     size_t n,
                     const struct ahead *d,
                     ida_fsm_applied_fn fn,
                     void *ctx,
                     size_t *done)
{
    for (size_t i = 0; i < n; i++, e++) {
        struct ida_fsm_applied ap;
        int rv = d == NULL || d[i].redo
                     ? ida_fsm_apply(f, e->index, e->type, e->data, e->len, &ap)
                     : ida__fsm_apply_decoded(f, e->index, e->type, d[i].b,
                                              false, d[i].pre, &ap);
        if (rv != 0) {
            return rv;
        }
        fn(ctx, e, &ap);
        (*done)++;
    }
    return 0;
}

/* @k over the first of the @n entries @e: at most @most of them, and
 * BLOCK_BYTES. */
static void block_set(struct block *k,
                      const struct ida_entry *e,
                      size_t n,
                      size_t most)
{
    size_t i = 0, bytes = 0;
    while (i < n && i < most && bytes < BLOCK_BYTES) {
        bytes += e[i++].len;
    }
    k->e = e;
    k->n = i;
}

int ida_fsm_apply_entries(struct ida_fsm *f,
                          const struct ida_entry *e,
                          size_t n,
                          const struct ida_fsm_helper *helper,
                          ida_fsm_applied_fn fn,
                          void *ctx,
                          size_t *done)
{
    IDA_ASSERT(f != NULL && fn != NULL && done != NULL);
    IDA_ASSERT(e != NULL || n == 0);
    *done = 0;
    struct block *k[2] = {NULL, NULL};
    if (helper != NULL && n > BLOCK_ENTRIES_FIRST) {
        k[0] = ida_calloc(1, sizeof(*k[0]));
        k[1] = ida_calloc(1, sizeof(*k[1]));
    }
    int rv = 0;
    if (k[0] == NULL || k[1] == NULL) {
        /* One thread, or no memory for the blocks: one at a time. */
        rv = apply_run(f, e, n, NULL, fn, ctx, done);
    } else {
        size_t most = BLOCK_ENTRIES_FIRST;
        block_set(k[0], e, n, most);
        decode_block(k[0]);
        for (size_t at = 0; at < n && rv == 0;) {
            size_t next = at + k[0]->n;
            bool helped = false;
            if (next < n) {
                most = most < BLOCK_ENTRIES ? 2 * most : BLOCK_ENTRIES;
                block_set(k[1], e + next, n - next, most);
                helped = helper->start(helper->ctx, decode_block, k[1]) == 0;
            }
            rv = apply_run(f, k[0]->e, k[0]->n, k[0]->d, fn, ctx, done);
            if (helped) {
                helper->join(helper->ctx);
            } else if (next < n && rv == 0) {
                decode_block(k[1]);
            }
            struct block *t = k[0];
            k[0] = k[1];
            k[1] = t;
            at = next;
        }
    }
    for (int i = 0; i < 2; i++) {
        if (k[i] != NULL) {
            ida__arena_release(&k[i]->arena);
            ida_free(k[i]);
        }
    }
    return rv;
}
