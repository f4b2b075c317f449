/* Holdings: the bulk load of a bounded pool's holdings from snapshot bytes,
 * shared by the restore (snap_decode.c) and the decoding of a snapshot
 * while it arrives (snap_ahead.c). Internal to fsm/.
 *
 * A large bounded pool is most of a large state, and its restore is most
 * of a node's restart and of a new node's catch-up. Its holdings are
 * decoded in phases, each shared by two threads when the caller lends one
 * (struct ida_fsm_helper), with a join between phases:
 *
 *   DECODE  each holding's tag is copied into a slab and its id taken in
 *           the pool's chunks (in id order: sequential), and the slot word
 *           of its tag (ida__tagtab_word()) is written to a scratch array
 *           in id order, counted by table region. The scratch is the tag
 *           table's own memory, not yet a table (ida__tagtab_bulk_begin()).
 *   GROUP   the words are copied into an array grouped by region (a
 *           counting sort: the counts give each share's place in each
 *           region), then the table's memory is cleared (CLEAR);
 *   INSERT  the words go into the table region by region, each thread a
 *           half of the regions.
 *
 * Inserting in id order put each tag at a random slot of a table far
 * larger than the caches (a cache and a TLB miss per tag, at ten million);
 * by region, each probe finds its lines just written. A tag held twice is
 * still refused: both copies hash alike, so land in one region, and the
 * insert of the second meets the first.
 *
 * The restore cuts the holdings in two shares at a chunk boundary near the
 * middle, so each thread takes ids in chunks of its own, into a slab of its
 * own; the chunks' count tree, which every take would climb to the root,
 * is summed once at the end instead (ida__bounded_recount()). A share's
 * bounds are checked as data (ids strictly increasing, within [lo, hi],
 * and as many holdings as the caller counted or was told), so damaged or
 * forged bytes cannot make the shares overlap or overrun the scratch.
 *
 * The decoding of a snapshot still arriving (snap_ahead.c) does not know
 * how many holdings will come, nor the last id, before they all came. Its
 * one share runs DECODE a piece at a time as bytes arrive
 * (ida__hold_decode_upto()), the chunks' index growing as ids come, its
 * words into arrays of its own that grow with the holdings that came (not
 * with what the bytes announce):
 *   - below IDA__HOLD_SPLIT_MIN holdings, one array in id order. Once all
 *     came, ida__hold_settle() sizes the table for the holdings taken, as
 *     the restore would, and copies the words into its scratch, counted by
 *     region, for the phases after (GROUP, CLEAR, INSERT) as above;
 *   - from IDA__HOLD_SPLIT_MIN holdings on, GROUP is done as they come, a
 *     batch at a time: each IDA__HOLD_BATCH words are grouped by region
 *     (a counting sort, by ida__tagtab_region_full(): a table for so many
 *     holdings has IDA__TAGTAB_REGIONS regions, whatever its size) onto the
 *     end of one array, and the batch's region starts kept. Once all came,
 *     ida__hold_settle() groups the last batch and sizes the table; CLEAR
 *     and INSERT follow, as two shares (the halves of the regions), INSERT
 *     taking each region's words batch after batch: in id order, the order
 *     the restore's GROUP gives them. At ten million holdings (bench_fsm
 *     --restore of bench-scale's 182 MB state, 10 runs each) the restore
 *     after the last byte went from a mean of 0.318 s to 0.202 s, and the
 *     decoding as the bytes come (which now sums the checksum too,
 *     snap_ahead.c) from 0.733 s to 0.714 s. Writing each word to one of
 *     4096 arrays as it came instead cost a TLB miss per word (4096 pages
 *     written at once): in a kept-cluster catch-up the stream fell 100 MB
 *     behind the bytes. A batch is grouped within 2 MiB. */
#ifndef IDA_FSM_SNAP_HOLD_H
#define IDA_FSM_SNAP_HOLD_H

#include <stdbool.h>
#include <stdint.h>

#include "fsm/fsm.h"
#include "fsm/fsm_internal.h"
#include "fsm/wire.h"

/* Holdings below which one thread does all. */
#define IDA__HOLD_SPLIT_MIN 65536
/* Words grouped at a time while a snapshot arrives (2 MiB of them): the
 * default of ida__hold_batch, which tests lower (to IDA__HOLD_SPLIT_MIN at
 * the least: a pool's first batch is never smaller) to group many. */
#define IDA__HOLD_BATCH (1u << 18)
extern uint64_t ida__hold_batch;

enum ida__hold_phase {
    IDA__HOLD_DECODE,
    IDA__HOLD_GROUP,
    IDA__HOLD_CLEAR,
    IDA__HOLD_INSERT
};

/* What the shares of one pool share. */
struct ida__hold_bulk
{
    struct ida__bounded *b;
    uint64_t *scratch; /* the table's memory, words in id order (DECODE) */
    uint64_t *sorted;  /* the words grouped by region */
    unsigned regions;  /* of the table (ida__tagtab_regions()) */
    unsigned parts;    /* shares: each clears and inserts 1/parts of it */
    uint64_t *start;   /* [regions + 1]: where each region's words begin;
                          then each share's counts ([regions] each) */
    /* Streamed, from IDA__HOLD_SPLIT_MIN holdings on, instead of sorted
     * and start: */
    uint64_t *grouped; /* each batch's words grouped by region, batch
                          after batch */
    uint64_t grouped_n, grouped_cap;
    uint64_t *batches; /* [batches_n][IDA__TAGTAB_REGIONS + 1]: where each
                          region's words of a batch begin in grouped */
    uint64_t batches_n, batches_cap;
    uint64_t *cursor; /* [IDA__TAGTAB_REGIONS]: a batch's next place */
    uint64_t flushed; /* words grouped so far */
};

/* One thread's share of a bounded pool's holdings. */
struct ida__hold_share
{
    struct ida__hold_bulk *k;
    enum ida__hold_phase phase;
    struct ida__rbuf r;    /* the pool's fields holding the share; r.p
                              moves on as DECODE takes them */
    uint64_t lo, hi;       /* its ids are within [lo, hi], increasing */
    uint64_t next;         /* the lowest id its next holding may have */
    struct ida__slab slab; /* records of the share */
    uint64_t *words;       /* its words, in id order (DECODE) */
    uint64_t n;            /* how many holdings its bytes hold */
    uint64_t taken;        /* of which DECODE took so far */
    uint64_t *count;       /* [regions]: its words in each region
                              (DECODE), then where its next one in
                              each goes (GROUP) */
    unsigned part;         /* its index (0 or 1) */
    bool streamed;         /* decoding ahead: count is NULL during DECODE,
                              the chunks' index grows, and a field other
                              than a holding is refused */
    int rv;
};

struct ida__hold_load
{
    struct ida__hold_bulk k;
    struct ida__hold_share sh[2];
    int shares;
    uint64_t holdings;
    bool own; /* streamed: sh[0].words is an array of its own (until
                 ida__hold_settle()), sh[0].n its room */
};

/* A tag from the wire: 1..IDA_TAG_BYTES_MAX bytes, no NUL. */
static inline bool ida__hold_tag_ok(const struct ida__rbuf *b)
{
    size_t n = (size_t)(b->end - b->p);
    return n >= 1 && n <= IDA_TAG_BYTES_MAX && memchr(b->p, 0, n) == NULL;
}

/* The id of the Holding in @r (absent: 0, protobuf's default). */
uint64_t ida__hold_id(struct ida__rbuf r);

/* Set @L up for @holdings (>= 1) holdings of @b, whose chunks
 * ida__bounded_prepare() indexed up to @max_id: one share of ids [0,
 * max_id] over the fields @r. 0 or IDA_ENOMEM; ida__hold_end() follows
 * either way. @L must not move afterwards (the shares point into it). */
int ida__hold_begin(struct ida__hold_load *L,
                    struct ida__bounded *b,
                    struct ida__rbuf r,
                    uint64_t holdings,
                    uint64_t max_id);

/* Cut the one share in two at @cut (a field start within it): the first
 * @n0 holdings with ids below @cut_id, the rest from @cut_id on. */
void ida__hold_cut(struct ida__hold_load *L,
                   const uint8_t *cut,
                   uint64_t cut_id,
                   uint64_t n0);

/* DECODE of every share, the second on @helper's thread (NULL: none). The
 * first error of the shares, or 0. */
int ida__hold_decode(struct ida__hold_load *L,
                     const struct ida_fsm_helper *helper);

/* For the decoding ahead: one share over the BoundedState fields @r after
 * its size (@b initialized with it): any number of holdings, any ids
 * below the size. Returns 0 (it allocates nothing yet); ida__hold_end()
 * follows. */
int ida__hold_begin_streamed(struct ida__hold_load *L,
                             struct ida__bounded *b,
                             struct ida__rbuf r);

/* DECODE of the streamed share's holdings that lie whole before @avail
 * (the bytes after it may not have arrived): 1 when all its bytes are
 * taken, 0 when more are needed, or an error (IDA_ECORRUPT, IDA_ENOMEM).
 * May be called again with a larger @avail after a 0. */
int ida__hold_decode_upto(struct ida__hold_load *L, const uint8_t *avail);

/* After ida__hold_decode_upto() returned 1: the table for the holdings
 * taken (at least one). Below IDA__HOLD_SPLIT_MIN, with the arrays for
 * GROUP and their words in the table's scratch as one share, counted by
 * region; from it on, the last batch grouped, and two shares for CLEAR and
 * INSERT (the scratch takes nothing). 0 or IDA_ENOMEM. */
int ida__hold_settle(struct ida__hold_load *L);

/* After DECODE (@rv its verdict): GROUP (unless grouped as they came),
 * CLEAR and INSERT; on error the scratch's words are cleared (the table
 * is only freed after). The
 * shares' records go to the pool's slab either way, and what
 * ida__hold_begin() allocated is freed. Returns the verdict. */
int ida__hold_end(struct ida__hold_load *L,
                  int rv,
                  const struct ida_fsm_helper *helper);

#endif /* IDA_FSM_SNAP_HOLD_H */
