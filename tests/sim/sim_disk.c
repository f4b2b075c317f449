/* The simulated disk: a durable image plus written-but-unsynced
 * batches. */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/sim/sim_internal.h"

void sim__disk_free_entries_from(struct disk *d, size_t k)
{
    for (size_t i = k; i < d->n; i++) {
        ida_free(d->ents[i].data);
    }
    if (k < d->n) {
        d->n = k;
    }
}

static ida_index disk_last(const struct disk *d)
{
    return d->snap_index + d->n;
}

ida_term sim__disk_term_at(const struct disk *d, ida_index i)
{
    if (i == d->snap_index) {
        return d->snap_term;
    }
    if (i < d->snap_index || i > disk_last(d)) {
        return 0;
    }
    return d->ents[i - d->snap_index - 1].term;
}

void sim__write_free(struct write *w)
{
    ida_free(w->snap);
    ida_free(w->snap_conf);
    for (size_t i = 0; i < w->n_ents; i++) {
        ida_free(w->ents[i].data);
    }
    ida_free(w->ents);
    for (size_t i = 0; i < w->n_msgs; i++) {
        sim__packet_free(&w->msgs[i]);
    }
    ida_free(w->msgs);
    memset(w, 0, sizeof(*w));
}

/* Store the first @n entries of @w (taking their data): they replace the
 * log from the first one's index on. */
static void apply_ents(struct sim *s,
                       struct node *nd,
                       struct write *w,
                       size_t n)
{
    struct disk *d = &nd->disk;
    if (n == 0) {
        return;
    }
    ida_index first = w->ents[0].index;
    if (first > disk_last(d) + 1) {
        sim__violation(s,
                       "node %u: batch entries from %" PRIu64
                       " leave a gap after stored index %" PRIu64,
                       nd->id, first, disk_last(d));
    }
    if (first > d->snap_index) {
        sim__disk_free_entries_from(d, (size_t)(first - d->snap_index - 1));
    }
    d->ents = sim__grow(s, d->ents, &d->cap, d->n + n, sizeof(*d->ents));
    for (size_t i = 0; i < n && d->ents != NULL; i++) {
        if (w->ents[i].index <= d->snap_index) {
            continue; /* inside the stored snapshot */
        }
        d->ents[d->n++] = w->ents[i];
        w->ents[i].data = NULL;
    }
}

/* Make @w durable: rule 1 of the persistence contract. Takes ownership of
 * the write's data. */
void sim__disk_apply(struct sim *s, struct node *nd, struct write *w)
{
    struct disk *d = &nd->disk;
    if (w->has_hs) {
        d->hs = w->hs;
    }
    if (w->has_snap) {
        ida_free(d->snap);
        d->snap = w->snap;
        w->snap = NULL;
        d->snap_len = w->snap_len;
        d->snap_index = w->snap_index;
        d->snap_term = w->snap_term;
        ida_free(d->snap_conf);
        d->snap_conf = w->snap_conf;
        d->snap_conf_len = w->snap_conf_len;
        w->snap_conf = NULL;
        sim__disk_free_entries_from(d, 0);
    }
    apply_ents(s, nd, w, w->n_ents);
}

/* A crash in the middle of @w, as storage writes a batch (storage.h, THE
 * LOG): its term and vote are durable first (LMDB), then its entries in
 * records, so a prefix of @n_ents of them may be; its commit index is
 * not. A write holding a snapshot is not cut (it goes whole or not at
 * all here). */
void sim__disk_apply_part(struct sim *s,
                          struct node *nd,
                          struct write *w,
                          size_t n_ents)
{
    struct disk *d = &nd->disk;
    if (w->has_snap) {
        return;
    }
    if (w->has_hs) {
        d->hs.term = w->hs.term;
        d->hs.vote = w->hs.vote;
    }
    apply_ents(s, nd, w, n_ents < w->n_ents ? n_ents : w->n_ents);
}

void sim__disk_free(struct disk *d)
{
    sim__disk_free_entries_from(d, 0);
    ida_free(d->ents);
    ida_free(d->snap);
    ida_free(d->snap_conf);
    memset(d, 0, sizeof(*d));
}

/* A deep copy of @src into @dst (which holds nothing). */
bool sim__disk_copy(struct disk *dst, const struct disk *src)
{
    memset(dst, 0, sizeof(*dst));
    dst->hs = src->hs;
    dst->boots = src->boots;
    dst->snap_index = src->snap_index;
    dst->snap_term = src->snap_term;
    if (src->snap_len > 0) {
        dst->snap = ida_malloc(src->snap_len);
        if (dst->snap == NULL) {
            return false;
        }
        memcpy(dst->snap, src->snap, src->snap_len);
        dst->snap_len = src->snap_len;
    }
    if (src->snap_conf_len > 0) {
        dst->snap_conf = ida_malloc(src->snap_conf_len);
        if (dst->snap_conf == NULL) {
            return false;
        }
        memcpy(dst->snap_conf, src->snap_conf, src->snap_conf_len);
        dst->snap_conf_len = src->snap_conf_len;
    }
    if (src->n > 0) {
        dst->ents = ida_calloc(src->n, sizeof(*dst->ents));
        if (dst->ents == NULL) {
            return false;
        }
        dst->cap = src->n;
        for (size_t i = 0; i < src->n; i++) {
            dst->ents[i] = src->ents[i];
            dst->ents[i].data = NULL;
            dst->n = i + 1;
            if (src->ents[i].len > 0) {
                dst->ents[i].data = ida_malloc(src->ents[i].len);
                if (dst->ents[i].data == NULL) {
                    return false;
                }
                memcpy(dst->ents[i].data, src->ents[i].data, src->ents[i].len);
            }
        }
    }
    return true;
}
