/* src/node/snap_stream: a leader's snapshot decoded on a thread of its own
 * as its chunks arrive, then restored with what was decoded ahead; the real
 * thread and the real state machine. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"
#include "src/node/snap_stream.h"

/* Two shares' worth (fsm/snap_hold.h, IDA__HOLD_SPLIT_MIN). */
enum { HOLDINGS = 70000, CHUNK = 64 * 1024 };

/* A state of HOLDINGS ids 2i+1 in pool "a", tagged "t<i>" (or "u<i>" for
 * the holding @other): its snapshot bytes. */
static uint8_t *state_bytes(size_t *len, int other)
{
    Idalloc__FsmState st;
    idalloc__fsm_state__init(&st);
    st.version = IDA_FSM_STATE_VERSION;
    Idalloc__PoolState ps, *pps = &ps;
    idalloc__pool_state__init(&ps);
    ps.name = "a";
    ps.kind = IDALLOC__POOL_KIND__POOL_KIND_BOUNDED;
    Idalloc__BoundedState bs;
    idalloc__bounded_state__init(&bs);
    bs.size = 2 * HOLDINGS + 1;
    Idalloc__Holding *h = calloc(HOLDINGS, sizeof(*h));
    Idalloc__Holding **ph = calloc(HOLDINGS, sizeof(*ph));
    char(*tags)[16] = calloc(HOLDINGS, sizeof(*tags));
    cr_assert(h != NULL && ph != NULL && tags != NULL);
    for (int i = 0; i < HOLDINGS; i++) {
        idalloc__holding__init(&h[i]);
        ph[i] = &h[i];
        h[i].id = 2 * (uint64_t)i + 1;
        snprintf(tags[i], sizeof(tags[i]), "%c%d", i == other ? 'u' : 't', i);
        h[i].tag = tags[i];
    }
    bs.n_holdings = HOLDINGS;
    bs.holdings = ph;
    ps.bounded = &bs;
    st.n_pools = 1;
    st.pools = &pps;
    st.applied_index = 77;
    size_t n = idalloc__fsm_state__get_packed_size(&st);
    uint8_t *buf = malloc(n + 9);
    cr_assert(buf != NULL);
    cr_assert_eq(idalloc__fsm_state__pack(&st, buf), n);
    uint64_t sum = ida__snapshot_checksum(buf, n);
    buf[n] = (7 << 3) | 1;
    for (int i = 0; i < 8; i++) {
        buf[n + 1 + (size_t)i] = (uint8_t)(sum >> (8 * i));
    }
    *len = n + 9;
    free(h);
    free(ph);
    free(tags);
    return buf;
}

/* A stream of @data fed in CHUNK pieces up to @upto (not its last). */
static struct ida__snap_stream *fed(const uint8_t *data,
                                    size_t len,
                                    size_t upto)
{
    size_t first = CHUNK < upto ? CHUNK : upto;
    struct ida__snap_stream *st =
        ida__snap_stream_start(9, 2, len, data, first);
    cr_assert(st != NULL);
    for (size_t at = first; at < upto;) {
        size_t n = upto - at < CHUNK ? upto - at : CHUNK;
        cr_assert(ida__snap_stream_at(st, 9, 2, len, at));
        ida__snap_stream_feed(st, data + at, n);
        at += n;
    }
    return st;
}

static void assert_holds(const struct ida_fsm *f,
                         const uint8_t *data,
                         size_t len)
{
    uint8_t *again;
    size_t l;
    cr_assert_eq(ida_fsm_snapshot(f, &again, &l), 0);
    cr_assert(l == len && memcmp(again, data, len) == 0,
              "the restored state gives back the bytes restored");
    ida_free(again);
}

Test(snap_stream, chunks_in_order_are_decoded_as_they_come)
{
    size_t len;
    uint8_t *data = state_bytes(&len, -1);
    cr_assert_gt(len, 8 * CHUNK);
    struct ida__snap_stream *st = fed(data, len, len - len % CHUNK);
    cr_assert_eq(ida__snap_stream_fed(st), len - len % CHUNK);
    cr_assert(!ida__snap_stream_at(st, 9, 3, len, len - len % CHUNK));
    cr_assert(!ida__snap_stream_at(st, 8, 2, len, len - len % CHUNK));
    cr_assert(!ida__snap_stream_at(st, 9, 2, len + 1, len - len % CHUNK));
    cr_assert(!ida__snap_stream_at(st, 9, 2, len, 0));
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    uint64_t ahead = 0;
    struct ida__snap_stream_times tm;
    /* The last chunk comes with the check, from the core's bytes. */
    cr_assert_eq(ida__snap_stream_restore(st, f, data, len, &ahead, &tm), 0);
    cr_assert_eq(ahead, HOLDINGS, "every holding decoded as it came");
    cr_assert_eq(ida_fsm_applied_index(f), 77);
    assert_holds(f, data, len);
    ida_fsm_free(f);
    free(data);
}

/* The check restores the bytes it is given: a stream that took others (of
 * the same size) is not used. */
Test(snap_stream, other_bytes_are_restored_whole)
{
    size_t len, len2;
    uint8_t *data = state_bytes(&len, -1);
    uint8_t *other = state_bytes(&len2, HOLDINGS / 2);
    cr_assert_eq(len, len2);
    struct ida__snap_stream *st = fed(data, len, len / 2);
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    uint64_t ahead = 1;
    struct ida__snap_stream_times tm;
    cr_assert_eq(ida__snap_stream_restore(st, f, other, len, &ahead, &tm), 0);
    cr_assert_eq(ahead, 0);
    assert_holds(f, other, len);
    uint64_t id;
    char tag[16];
    snprintf(tag, sizeof(tag), "u%d", HOLDINGS / 2);
    cr_assert_eq(ida_fsm_lookup(f, "a", tag, &id), 0);
    cr_assert_eq(id, 2 * (uint64_t)(HOLDINGS / 2) + 1);
    ida_fsm_free(f);
    /* Damaged bytes decoded ahead are refused all the same. */
    data[len / 2] ^= 0x40;
    st = fed(data, len, len - 1);
    cr_assert_eq(ida_fsm_new(&f), 0);
    cr_assert_eq(ida__snap_stream_restore(st, f, data, len, &ahead, &tm),
                 IDA_ECORRUPT);
    ida_fsm_free(f);
    free(other);
    free(data);
}

/* Stopped at any point (the node stopping: joined) or dropped (a new
 * snapshot, another leader: its thread frees it): the thread ends and
 * everything is freed. */
Test(snap_stream, stops_anywhere)
{
    size_t len;
    uint8_t *data = state_bytes(&len, -1);
    for (size_t upto = 1; upto < len; upto += len / 7 + 1) {
        ida__snap_stream_stop(fed(data, len, upto));
        ida__snap_stream_drop(fed(data, len, upto));
    }
    ida__snap_stream_stop(NULL);
    ida__snap_stream_drop(NULL);
    /* No stream: the plain restore. */
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    uint64_t ahead = 1;
    struct ida__snap_stream_times tm = {1, 1, 0};
    cr_assert_eq(ida__snap_stream_restore(NULL, f, data, len, &ahead, &tm), 0);
    cr_assert_eq(ahead, 0);
    cr_assert(tm.lag_us == 0 && tm.cmp_us == 0, "no stream waited for");
    assert_holds(f, data, len);
    ida_fsm_free(f);
    free(data);
}
