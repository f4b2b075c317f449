/* fsm/ snapshots: determinism, round trips, protobuf conformance, and
 * rejection of truncated, damaged and inconsistent snapshots. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "fsm/fsm_internal.h"
#include "fsm/snap_hold.h"
#include "fsm/wire.h"
#include "idalloc_errors.h"
#include "src/node/lend.h"
#include "tests/fsm/fsm_helpers.h"

/* --- fixture ------------------------------------------------------------- */

static struct ida_fsm *f;
static struct fx_batch b;

static void setup(void)
{
    cr_assert_eq(ida_fsm_new(&f), 0);
}

static void teardown(void)
{
    ida_fsm_free(f);
}

TestSuite(snap, .init = setup, .fini = teardown);

#define SEQ IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE
#define BND IDALLOC__POOL_KIND__POOL_KIND_BOUNDED
#define PFX IDALLOC__POOL_KIND__POOL_KIND_PREFIX

/* --- helpers -------------------------------------------------------------- */

/* A state with every kind of pool, holes, sessions with kept results and
 * errors; @round varies it. */
static void populate(struct ida_fsm *g, int round)
{
    struct ida_fsm_applied out;
    bool ack = fx_auto_ack;
    fx_auto_ack = false; /* keep every answer: sessions with many results */
    fx_batch_init(&b, 5000 + (uint64_t)round);
    for (uint64_t c = 1; c <= 8; c++) {
        fx_add_register(&b, c, 1);
    }
    fx_add_register(&b, 99, 1);
    fx_apply(g, &b, &out);
    fx_batch_init(&b, 5000 + (uint64_t)round);
    fx_add_create(&b, 1, 1, "zeta-seq", SEQ, 0);
    fx_add_create(&b, 1, 2, "alpha-bnd", BND, 5000);
    fx_add_create(&b, 1, 3, "mid.prefix", PFX, 0);
    fx_apply(g, &b, &out);
    uint64_t s = 10;
    for (int k = 0; k < 12; k++) {
        fx_batch_init(&b, 6000 + (uint64_t)k * 1000);
        for (int i = 0; i < 200; i++) {
            char tag[32];
            uint64_t client = 2 + (uint64_t)((i + k) % 7);
            snprintf(tag, sizeof(tag), "t-%d-%d", k, i);
            switch (i % 5) {
                case 0:
                case 1:
                    fx_add_alloc(&b, client, ++s, "alpha-bnd", tag);
                    break;
                case 2:
                    fx_add_free(&b, client, ++s, "alpha-bnd",
                                (uint64_t)(i * 3 + k), "nobody");
                    break;
                case 3:
                    fx_add_prefix(&b, client, ++s, "mid.prefix", tag);
                    break;
                default:
                    fx_add_reserve(&b, client, ++s, "zeta-seq",
                                   (uint64_t)i + 1);
                    break;
            }
        }
        fx_apply(g, &b, &out);
        /* Free a few so the bounded pool has holes. */
        fx_batch_init(&b, 6000 + (uint64_t)k * 1000);
        for (int i = 0; i < 10; i++) {
            char tag[32];
            snprintf(tag, sizeof(tag), "t-%d-%d", k, i * 5);
            uint64_t id;
            if (ida_fsm_lookup(g, "alpha-bnd", tag, &id) == 0) {
                fx_add_free(&b, 99, ++s, "alpha-bnd", id, tag);
            }
        }
        fx_apply(g, &b, &out);
    }
    /* One client acknowledged part of its answers (a floor in the
     * snapshot). */
    fx_batch_init(&b, 20000);
    fx_add_reserve(&b, 3, ++s, "zeta-seq", 1);
    b.cmd[0].ack_below = s - 500;
    fx_apply(g, &b, &out);
    fx_auto_ack = ack;
}

static void assert_same_bytes(const struct ida_fsm *x, const struct ida_fsm *y)
{
    size_t l1, l2;
    uint8_t *s1 = fx_snapshot(x, &l1), *s2 = fx_snapshot(y, &l2);
    cr_assert_eq(l1, l2);
    cr_assert_eq(memcmp(s1, s2, l1), 0);
    ida_free(s1);
    ida_free(s2);
}

/* --- tests -----------------------------------------------------------------
 */

Test(snap, same_log_same_bytes_and_round_trip)
{
    struct ida_fsm *g, *h;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_new(&h), 0);
    populate(f, 0);
    populate(g, 0);
    assert_same_bytes(f, g);
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    cr_assert_gt(len, 1000);
    cr_assert_eq(ida_fsm_restore(h, snap, len), 0);
    assert_same_bytes(f, h);
    cr_assert_eq(ida_fsm_applied_index(h), ida_fsm_applied_index(f));
    /* The restored one behaves the same from here on. */
    populate(f, 1);
    populate(h, 1);
    assert_same_bytes(f, h);
    ida_free(snap);
    ida_fsm_free(g);
    ida_fsm_free(h);
}

Test(snap, bytes_are_what_protobuf_c_packs)
{
    populate(f, 0);
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    Idalloc__FsmState *m = idalloc__fsm_state__unpack(NULL, len, snap);
    cr_assert_not_null(m);
    cr_assert_eq(m->version, IDA_FSM_STATE_VERSION);
    cr_assert_eq(m->n_pools, 3);
    cr_assert_str_eq(m->pools[0]->name, "alpha-bnd", "pools by name");
    cr_assert_str_eq(m->pools[2]->name, "zeta-seq");
    cr_assert_gt(m->pools[0]->bounded->n_holdings, 100);
    cr_assert_gt(m->n_sessions, 5);
    for (size_t i = 1; i < m->pools[0]->bounded->n_holdings; i++) {
        cr_assert_lt(m->pools[0]->bounded->holdings[i - 1]->id,
                     m->pools[0]->bounded->holdings[i]->id);
    }
    uint8_t *again = malloc(len);
    cr_assert_eq(idalloc__fsm_state__get_packed_size(m), len);
    cr_assert_eq(idalloc__fsm_state__pack(m, again), len);
    cr_assert_eq(memcmp(again, snap, len), 0, "canonical protobuf bytes");
    free(again);
    idalloc__fsm_state__free_unpacked(m, NULL);
    ida_free(snap);
}

Test(snap, empty_state_round_trips)
{
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_restore(g, snap, len), 0);
    assert_same_bytes(f, g);
    ida_free(snap);
    ida_fsm_free(g);
}

/* ida_fsm_replace(): the target takes the other state machine's whole
 * state at its own address (the node's fsm processor keeps its pointer),
 * keeps the replies of its last apply, and behaves like the source from
 * there on (its tables point back at the right owner). */
Test(snap, replace_takes_the_whole_state_in_place)
{
    struct ida_fsm *g, *h;
    cr_assert_eq(ida_fsm_new(&g), 0);
    cr_assert_eq(ida_fsm_new(&h), 0);
    populate(f, 0);
    populate(g, 0);
    populate(g, 1);
    size_t glen;
    uint8_t *gsnap = fx_snapshot(g, &glen);
    ida_index gindex = ida_fsm_applied_index(g);
    cr_assert_eq(ida_fsm_restore(h, gsnap, glen), 0);
    /* The replies of f's last apply, read after the replace. */
    fx_batch_init(&b, 30000);
    fx_add_reserve(&b, 5, 100000, "zeta-seq", 3);
    struct ida_fsm_applied ap;
    fx_apply(f, &b, &ap);
    cr_assert_eq(ap.count, 1);
    struct ida_fsm_reply first = ap.replies[0];
    struct ida_fsm *self = f;
    ida_fsm_replace(f, g); /* g is gone */
    cr_assert_eq(f, self);
    cr_assert_eq(ida_fsm_applied_index(f), gindex);
    cr_assert_eq(memcmp(&ap.replies[0], &first, sizeof(first)), 0,
                 "the last apply's replies moved or changed");
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    cr_assert(len == glen && memcmp(snap, gsnap, len) == 0,
              "not the source's state");
    populate(f, 2);
    populate(h, 2);
    assert_same_bytes(f, h);
    ida_free(snap);
    ida_free(gsnap);
    ida_fsm_free(h);
}

/* Every truncation and every single-byte change is refused, and the
 * target keeps its previous state. */
Test(snap, truncated_or_damaged_snapshots_are_refused)
{
    fx_register(f, 1, 1); /* else every command is refused: no session */
    fx_register(f, 2, 1);
    fx_batch_init(&b, 1);
    fx_add_create(&b, 1, 1, "b", BND, 100);
    fx_add_alloc(&b, 1, 2, "b", "one");
    fx_add_create(&b, 1, 3, "x", PFX, 0);
    fx_add_prefix(&b, 2, 1, "x", "two");
    fx_add_create(&b, 1, 4, "s", SEQ, 0);
    fx_add_reserve(&b, 2, 2, "s", 9);
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    for (size_t i = 0; i < out.count; i++) {
        cr_assert_eq(out.replies[i].result.error, 0, "command %zu", i);
    }
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);

    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    populate(g, 3);
    size_t glen;
    uint8_t *gsnap = fx_snapshot(g, &glen);
    uint8_t *bad = malloc(len);
    for (size_t cut = 0; cut < len; cut++) {
        int rv = ida_fsm_restore(g, snap, cut);
        cr_assert(rv == IDA_ECORRUPT || rv == IDA_EVERSION, "cut at %zu: %d",
                  cut, rv);
    }
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(bad, snap, len);
            bad[i] ^= (uint8_t)(1u << bit);
            int rv = ida_fsm_restore(g, bad, len);
            cr_assert(rv == IDA_ECORRUPT || rv == IDA_EVERSION,
                      "flip byte %zu bit %d: %d", i, bit, rv);
        }
    }
    size_t glen2;
    uint8_t *gsnap2 = fx_snapshot(g, &glen2);
    cr_assert_eq(glen, glen2);
    cr_assert_eq(memcmp(gsnap, gsnap2, glen), 0, "never half-loaded");
    cr_assert_eq(ida_fsm_restore(g, snap, len), 0, "the intact one loads");
    free(bad);
    ida_free(snap);
    ida_free(gsnap);
    ida_free(gsnap2);
    ida_fsm_free(g);
}

/* --- well-formed but inconsistent states (valid checksum) ------------------
 */

static Idalloc__FsmState st;
static Idalloc__PoolState ps[2], *pps[2];
static Idalloc__BoundedState bs;
static Idalloc__Holding hs[3], *phs[3];
static Idalloc__PrefixState xs;
static Idalloc__TagPrefix tp[2], *ptp[2];
static uint64_t reserved[2];
static uint8_t pre[2][3];

/* A valid state: bounded "a" holding 1:"x", 4:"y"; prefix "b" with two
 * tags in window [0, 64). */
static void forge_base(void)
{
    idalloc__fsm_state__init(&st);
    st.version = IDA_FSM_STATE_VERSION;
    for (int i = 0; i < 2; i++) {
        idalloc__pool_state__init(&ps[i]);
        pps[i] = &ps[i];
    }
    st.n_pools = 2;
    st.pools = pps;
    ps[0].name = "a";
    ps[0].kind = BND;
    idalloc__bounded_state__init(&bs);
    bs.size = 10;
    for (int i = 0; i < 3; i++) {
        idalloc__holding__init(&hs[i]);
        phs[i] = &hs[i];
    }
    hs[0].id = 1;
    hs[0].tag = "x";
    hs[1].id = 4;
    hs[1].tag = "y";
    bs.n_holdings = 2;
    bs.holdings = phs;
    ps[0].bounded = &bs;
    ps[1].name = "b";
    ps[1].kind = PFX;
    idalloc__prefix_state__init(&xs);
    xs.window_start = 0;
    xs.window_count = 2;
    reserved[0] = 5;
    reserved[1] = 40;
    xs.n_window_reserved = 2;
    xs.window_reserved = reserved;
    for (int i = 0; i < 2; i++) {
        idalloc__tag_prefix__init(&tp[i]);
        ptp[i] = &tp[i];
    }
    pre[0][0] = 1;
    pre[0][1] = 5;
    pre[1][0] = 1;
    pre[1][1] = 40;
    tp[0].tag = "p";
    tp[0].prefix.data = pre[0];
    tp[0].prefix.len = 2;
    tp[1].tag = "q";
    tp[1].prefix.data = pre[1];
    tp[1].prefix.len = 2;
    xs.n_tags = 2;
    xs.tags = ptp;
    ps[1].prefix = &xs;
}

static int forge_restore(void)
{
    size_t len;
    uint8_t *buf = fx_forge(&st, &len);
    int rv = ida_fsm_restore(f, buf, len);
    free(buf);
    return rv;
}

Test(snap, forged_valid_state_loads)
{
    forge_base();
    cr_assert_eq(forge_restore(), 0);
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "a", "y", &id), 0);
    cr_assert_eq(id, 4);
    /* The next alloc gets the lowest free id, 0; then 2. */
    fx_register(f, 1, 1); /* the forged state has no session */
    fx_batch_init(&b, 1);
    fx_add_alloc(&b, 1, 1, "a", "n1");
    fx_add_alloc(&b, 1, 2, "a", "n2");
    fx_add_prefix(&b, 1, 3, "b", "q");
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    cr_assert_eq(out.replies[0].result.id, 0);
    cr_assert_eq(out.replies[1].result.id, 2);
    cr_assert(out.replies[2].result.flag, "q existed");
    cr_assert_eq(out.replies[2].result.prefix[1], 40);
}

/* Holdings of every width: ids of 0 (no id field at all: proto3 leaves
 * the default out), 1 to 5 varint bytes, and tags of 1, 127 and 128 bytes
 * (a two-byte length). The restore reads a holding of the encoder's
 * common layout in line and any other through its general loop
 * (fsm/snap_hold.c, holding_plain()): both must give these back. */
Test(snap, holdings_of_every_width_load)
{
    static const uint64_t ids[] = {
        0,     1,       127,     128,     300,       16383,
        16384, 2097151, 2097152, 4000000, 268435456, UINT64_C(4294967293)};
    enum { N = sizeof(ids) / sizeof(ids[0]) };
    static char tags[N][IDA_TAG_BYTES_MAX + 1];
    static Idalloc__Holding h[N], *ph[N];
    forge_base();
    for (size_t i = 0; i < N; i++) {
        size_t len = i % 3 == 0 ? 1 + i / 3 : i % 3 == 1 ? 127 : 128;
        memset(tags[i], 'a' + (int)i, len);
        tags[i][0] = (char)('A' + i); /* distinct also at length 1 */
        tags[i][len] = '\0';
        idalloc__holding__init(&h[i]);
        h[i].id = ids[i];
        h[i].tag = tags[i];
        ph[i] = &h[i];
    }
    bs.size = UINT64_C(4294967294);
    bs.n_holdings = N;
    bs.holdings = ph;
    cr_assert_eq(forge_restore(), 0);
    for (size_t i = 0; i < N; i++) {
        uint64_t id;
        cr_assert_eq(ida_fsm_lookup(f, "a", tags[i], &id), 0, "holding %zu", i);
        cr_assert_eq(id, ids[i], "holding %zu: id %llu, not %llu", i,
                     (unsigned long long)id, (unsigned long long)ids[i]);
    }
}

#define EXPECT_CORRUPT(what)                                             \
    do {                                                                 \
        forge_base();                                                    \
        what;                                                            \
        cr_assert_eq(forge_restore(), IDA_ECORRUPT, "accepted: " #what); \
    } while (0)

Test(snap, inconsistent_states_are_refused)
{
    EXPECT_CORRUPT(hs[1].id = 1);            /* ids not increasing */
    EXPECT_CORRUPT(hs[1].id = 10);           /* id >= size */
    EXPECT_CORRUPT(hs[1].tag = "x");         /* one tag, two ids */
    EXPECT_CORRUPT(hs[1].tag = "");          /* empty tag */
    EXPECT_CORRUPT(bs.size = 0);             /* bad size */
    EXPECT_CORRUPT(ps[0].name = "c");        /* pools not by name */
    EXPECT_CORRUPT(ps[0].name = "b");        /* duplicate pool */
    EXPECT_CORRUPT(ps[0].name = "bad name"); /* invalid name */
    EXPECT_CORRUPT(ps[0].kind = SEQ);        /* kind vs sub-message */
    static Idalloc__SequenceState seq_state;
    idalloc__sequence_state__init(&seq_state);
    seq_state.next = 5;
    EXPECT_CORRUPT(ps[0].sequence = &seq_state); /* two sub-messages */
    EXPECT_CORRUPT(xs.window_count = 3);         /* count != reserved */
    EXPECT_CORRUPT(reserved[1] = 64);            /* outside the window */
    EXPECT_CORRUPT(xs.window_start = 10);        /* not a window start */
    EXPECT_CORRUPT(pre[1][1] = 5);               /* a prefix twice */
    EXPECT_CORRUPT(pre[1][0] = 2);               /* bad encoding */
    EXPECT_CORRUPT(tp[1].prefix.len = 1);        /* bad encoding */
    EXPECT_CORRUPT(tp[1].tag = "a");             /* tags not sorted */
    forge_base();
    st.version = 2;
    cr_assert_eq(forge_restore(), IDA_EVERSION);
}

static uint8_t cid[2][IDA_CLIENT_ID_BYTES];
static Idalloc__Session ss[2], *pss[2];
static Idalloc__SessionResult sr[2], *psr[2];
static Idalloc__CommandResult cres[2];
static Idalloc__ReserveResult rr;

/* forge_base() plus two valid sessions: client 1 with a kept reserve
 * (seq 1) and a kept error (seq 2), client 2 with none. */
static void forge_sessions(void)
{
    forge_base();
    fx_client_id(1, cid[0]);
    fx_client_id(2, cid[1]);
    idalloc__reserve_result__init(&rr);
    rr.first = 1;
    rr.count = 2;
    for (int i = 0; i < 2; i++) {
        idalloc__session__init(&ss[i]);
        pss[i] = &ss[i];
        ss[i].client_id.data = cid[i];
        ss[i].client_id.len = IDA_CLIENT_ID_BYTES;
        ss[i].last_active_ms = 10;
        ss[i].lru_rank = (uint64_t)i + 1;
        idalloc__session_result__init(&sr[i]);
        psr[i] = &sr[i];
        idalloc__command_result__init(&cres[i]);
        sr[i].result = &cres[i];
        sr[i].request_seq = (uint64_t)i + 1;
    }
    cres[0].result_case = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
    cres[0].reserve = &rr;
    cres[1].error = IDA_ENOPOOL;
    cres[1].error_msg = "no pool with this name";
    static struct fx_batch fb;
    fx_batch_init(&fb, 10);
    fx_add_reserve(&fb, 1, 1, "s", 7);
    sr[0].fingerprint = fx_fingerprint(&fb, 0);
    ss[0].n_results = 2;
    ss[0].results = psr;
    st.n_sessions = 2;
    st.sessions = pss;
    st.last_timestamp_ms = 10;
    st.session_clock = 2;
}

Test(snap, inconsistent_sessions_are_refused)
{
#define SESS_CASE(expect, what)                                  \
    do {                                                         \
        forge_sessions();                                        \
        what;                                                    \
        cr_assert_eq(forge_restore(), (expect), "case: " #what); \
    } while (0)

    SESS_CASE(0, (void)0);
    cr_assert_eq(ida_fsm_session_count(f), 2);
    SESS_CASE(IDA_ECORRUPT, ss[1].client_id.data = cid[0]); /* order */
    SESS_CASE(IDA_ECORRUPT, ss[1].lru_rank = 1);            /* same rank */
    SESS_CASE(IDA_ECORRUPT, ss[1].lru_rank = 3);            /* > clock */
    SESS_CASE(IDA_ECORRUPT, ss[1].last_active_ms = 11);     /* > now */
    SESS_CASE(IDA_ECORRUPT, ss[0].client_id.len = 15);
    SESS_CASE(IDA_ECORRUPT, sr[1].request_seq = 1);         /* seq order */
    SESS_CASE(IDA_ECORRUPT, ss[0].evicted_below = 1);       /* kept <= */
    SESS_CASE(IDA_ECORRUPT, cres[1].error_msg = "made up"); /* unknown */
    SESS_CASE(IDA_ECORRUPT, cres[1].error = IDA_EINVAL);    /* code/text */
    SESS_CASE(IDA_ECORRUPT,
              cres[0].result_case = IDALLOC__COMMAND_RESULT__RESULT__NOT_SET);
    /* A kept answer survives the forge and is returned for a retry. */
    SESS_CASE(0, (void)0);
    fx_batch_init(&b, 10);
    fx_add_reserve(&b, 1, 1, "s", 7);
    struct ida_fsm_applied out;
    fx_apply(f, &b, &out);
    cr_assert(out.replies[0].cached);
    cr_assert_eq(out.replies[0].result.id, 1);
    cr_assert_eq(out.replies[0].result.count, 2);
    /* The fingerprint came with it: other arguments are another request. */
    fx_batch_init(&b, 10);
    fx_add_reserve(&b, 1, 1, "s", 8);
    fx_apply(f, &b, &out);
    cr_assert_eq(out.replies[0].result.error, IDA_EREUSED);
}

/* --- out of memory
 * ------------------------------------------------------------ */

/* Fail the Nth allocation of snapshot and of restore for N = 0, 1, ...
 * until the call succeeds: each failure is IDA_ENOMEM and the restore
 * target keeps its previous state exactly. */
Test(snap, enomem_on_every_snapshot_and_restore_path)
{
    populate(f, 0);
    size_t len;
    uint8_t *snap = fx_snapshot(f, &len);
    int n;
    for (n = 0;; n++) {
        uint8_t *data = NULL;
        size_t l;
        ida_heap_fault_set(n, 1);
        int rv = ida_fsm_snapshot(f, &data, &l);
        ida_heap_fault_set(0, 0);
        if (rv == 0) {
            cr_assert_eq(l, len);
            cr_assert_eq(memcmp(data, snap, len), 0);
            ida_free(data);
            break;
        }
        cr_assert_eq(rv, IDA_ENOMEM);
        cr_assert_null(data);
    }
    cr_assert_gt(n, 0);

    struct ida_fsm *g;
    cr_assert_eq(ida_fsm_new(&g), 0);
    fx_register(g, 1, 1);
    fx_batch_init(&b, 1);
    fx_add_create(&b, 1, 1, "other", SEQ, 0);
    struct ida_fsm_applied out;
    fx_apply(g, &b, &out);
    cr_assert_eq(out.replies[0].result.error, 0);
    size_t glen;
    uint8_t *gsnap = fx_snapshot(g, &glen);
    for (n = 0;; n++) {
        ida_heap_fault_set(n, 1);
        int rv = ida_fsm_restore(g, snap, len);
        ida_heap_fault_set(0, 0);
        if (rv == 0) {
            break;
        }
        cr_assert_eq(rv, IDA_ENOMEM, "allocation %d: %d", n, rv);
        size_t l;
        uint8_t *now = fx_snapshot(g, &l);
        cr_assert_eq(l, glen);
        cr_assert_eq(memcmp(now, gsnap, glen), 0, "allocation %d", n);
        ida_free(now);
    }
    cr_assert_gt(n, 10, "restore allocates per pool, table and session");
    assert_same_bytes(f, g);
    ida_free(gsnap);
    ida_free(snap);
    ida_fsm_free(g);
}

/* Restore inserts tags region by region (fsm/snap_decode.c): a tag held
 * twice is refused wherever the two fall, side by side, apart, at the
 * start or the end; and the state it refuses leaves the target as it was. */
Test(snap, tag_held_twice_refused_wherever_it_falls)
{
    enum { N = 53 };
    static Idalloc__Holding many[N], *pmany[N];
    static char tags[N][8];
    for (int i = 0; i < N; i++) {
        idalloc__holding__init(&many[i]);
        pmany[i] = &many[i];
    }
    const int pairs[][2] = {{0, 1},     {0, 15},       {0, 16},  {15, 16},
                            {3, 40},    {16, 31},      {31, 32}, {47, 48},
                            {0, N - 1}, {N - 2, N - 1}};
    for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
        forge_base();
        bs.size = 1000;
        for (int i = 0; i < N; i++) {
            many[i].id = (uint64_t)(3 * i + 1);
            snprintf(tags[i], sizeof(tags[i]), "t%d", i);
            many[i].tag = tags[i];
        }
        bs.n_holdings = N;
        bs.holdings = pmany;
        cr_assert_eq(forge_restore(), 0, "the distinct tags load");
        uint64_t id;
        cr_assert_eq(ida_fsm_lookup(f, "a", "t52", &id), 0);
        cr_assert_eq(id, 3 * 52 + 1);
        size_t len0;
        uint8_t *before = fx_snapshot(f, &len0);
        many[pairs[p][1]].tag = tags[pairs[p][0]];
        cr_assert_eq(forge_restore(), IDA_ECORRUPT, "holdings %d and %d",
                     pairs[p][0], pairs[p][1]);
        size_t len1;
        uint8_t *after = fx_snapshot(f, &len1);
        cr_assert(len0 == len1 && memcmp(before, after, len0) == 0,
                  "a refused state changes nothing");
        ida_free(before);
        ida_free(after);
    }
}

/* --- two threads (ida_fsm_restore_with) ------------------------------------
 * A bounded pool of at least 65,536 holdings is decoded in two shares cut at
 * a chunk boundary near the middle, the second on a lent thread. */

enum { BIG = 100000 };
/* Holdings forge_big() has room for: three of the smallest batches the
 * grouping takes (IDA__HOLD_SPLIT_MIN words) and one more. */
enum { BIG_ROOM = 3 * IDA__HOLD_SPLIT_MIN + 1 };
/* On the heap: TSan builds put Criterion's arena where a large .bss would
 * be. Allocated once per test process, left to its exit. */
static Idalloc__Holding *big, **pbig;
static char (*bigtag)[12];

/* Counts the threads asked for; @refuse: lends none (the restore then
 * decodes both shares itself). */
struct counted
{
    struct ida_fsm_helper h;
    struct ida__lend l;
    int starts;
    bool refuse;
};

static int counted_start(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct counted *c = ctx;
    c->starts++;
    return c->refuse ? -1 : c->l.helper.start(c->l.helper.ctx, fn, arg);
}

static void counted_join(void *ctx)
{
    struct counted *c = ctx;
    c->l.helper.join(c->l.helper.ctx);
}

static void counted_init(struct counted *c, bool refuse)
{
    memset(c, 0, sizeof(*c));
    ida__lend_init(&c->l);
    c->h = (struct ida_fsm_helper){counted_start, counted_join, c};
    c->refuse = refuse;
}

/* forge_base() with pool "a" holding @n ids 3i+1 tagged "t<i>". */
static void forge_big_n(int n)
{
    forge_base();
    if (big == NULL) {
        big = calloc(BIG_ROOM, sizeof(*big));
        pbig = calloc(BIG_ROOM, sizeof(*pbig));
        bigtag = calloc(BIG_ROOM, sizeof(*bigtag));
        cr_assert(big != NULL && pbig != NULL && bigtag != NULL);
    }
    cr_assert_leq(n, BIG_ROOM);
    bs.size = 3 * (uint64_t)n + 10;
    for (int i = 0; i < n; i++) {
        idalloc__holding__init(&big[i]);
        pbig[i] = &big[i];
        big[i].id = (uint64_t)(3 * i + 1);
        snprintf(bigtag[i], sizeof(bigtag[i]), "t%d", i);
        big[i].tag = bigtag[i];
    }
    bs.n_holdings = (size_t)n;
    bs.holdings = pbig;
}

/* forge_base() with pool "a" holding BIG ids 3i+1 tagged "t<i>". */
static void forge_big(void)
{
    forge_big_n(BIG);
}

/* @g restored forge_big()'s state: every tag is found (a word lost on
 * the way to the table shows nowhere else: the snapshot is written from
 * the ids), and the lowest free ids come next (the count tree summed at
 * the end is right). */
static void assert_big_holds(struct ida_fsm *g)
{
    uint64_t id;
    for (int i = 0; i < BIG; i++) {
        cr_assert_eq(ida_fsm_lookup(g, "a", bigtag[i], &id), 0);
        cr_assert_eq(id, (uint64_t)(3 * i + 1));
    }
    fx_register(g, 1, 1);
    fx_batch_init(&b, 1);
    fx_add_alloc(&b, 1, 1, "a", "n1");
    fx_add_alloc(&b, 1, 2, "a", "n2");
    fx_add_alloc(&b, 1, 3, "a", "t0");
    struct ida_fsm_applied out;
    fx_apply(g, &b, &out);
    cr_assert_eq(out.replies[0].result.id, 0);
    cr_assert_eq(out.replies[1].result.id, 2);
    cr_assert(out.replies[2].result.flag, "t0 existed");
    cr_assert_eq(out.replies[2].result.id, 1);
}

static int forge_restore_with(struct counted *c)
{
    size_t len;
    uint8_t *buf = fx_forge(&st, &len);
    int rv = ida_fsm_restore_with(f, buf, len, &c->h);
    free(buf);
    return rv;
}

Test(snap, two_threads_restore_what_one_does)
{
    forge_big();
    size_t len;
    uint8_t *forged = fx_forge(&st, &len);
    for (int refuse = 0; refuse < 2; refuse++) {
        struct ida_fsm *g;
        cr_assert_eq(ida_fsm_new(&g), 0);
        struct counted c;
        counted_init(&c, refuse);
        cr_assert_eq(ida_fsm_restore_with(g, forged, len, &c.h), 0);
        cr_assert_eq(c.starts, 5,
                     "the thread asked for the checksum, then for the "
                     "second share of each phase (decode, group, clear, "
                     "insert)");
        size_t l;
        uint8_t *again = fx_snapshot(g, &l);
        cr_assert(l == len && memcmp(again, forged, len) == 0,
                  "the restored state gives back the same bytes");
        ida_free(again);
        assert_big_holds(g);
        ida_fsm_free(g);
    }
    /* A small pool is decoded by one thread. */
    forge_base();
    struct counted c;
    counted_init(&c, false);
    cr_assert_eq(forge_restore_with(&c), 0);
    cr_assert_eq(c.starts, 1, "the checksum only");
    free(forged);
}

/* forge_base() restored into the target (its snapshot returned, *@len
 * bytes, ida_free'd by the caller), then forge_big() forged: what the
 * two-thread tests restore over it, and what it must stay after a refusal. */
static uint8_t *base_then_big(size_t *len)
{
    forge_base();
    cr_assert_eq(forge_restore(), 0);
    uint8_t *before = fx_snapshot(f, len);
    forge_big();
    return before;
}

/* The checksum runs on the lent thread while decoding starts: bytes that
 * decode well but do not match their checksum are refused all the same,
 * and change nothing, whether the thread is lent or refused. */
Test(snap, two_threads_check_the_checksum)
{
    size_t len0;
    uint8_t *before = base_then_big(&len0);
    size_t len;
    uint8_t *forged = fx_forge(&st, &len);
    /* A tag of the second half changed to another unused one: every field
     * still decodes. */
    char t[32], u[32];
    snprintf(t, sizeof(t), "%s", bigtag[BIG - 5]);
    snprintf(u, sizeof(u), "u%s", t + 1);
    size_t tl = strlen(t), at = 0;
    for (size_t i = 1; i + tl <= len && at == 0; i++) {
        if (forged[i - 1] == tl && memcmp(forged + i, t, tl) == 0) {
            at = i;
        }
    }
    cr_assert_gt(at, len / 2);
    forged[at] = 'u';
    for (int refuse = 0; refuse < 2; refuse++) {
        struct counted c;
        counted_init(&c, refuse);
        cr_assert_eq(ida_fsm_restore_with(f, forged, len, &c.h), IDA_ECORRUPT);
        size_t len1;
        uint8_t *after = fx_snapshot(f, &len1);
        cr_assert(len0 == len1 && memcmp(before, after, len0) == 0);
        ida_free(after);
    }
    /* With the checksum made right, the same bytes are a valid state. */
    uint64_t sum = ida__snapshot_checksum(forged, len - IDA__CHECKSUM_BYTES);
    for (int k = 0; k < 8; k++) {
        forged[len - 8 + (size_t)k] = (uint8_t)(sum >> (8 * k));
    }
    struct counted c;
    counted_init(&c, false);
    cr_assert_eq(ida_fsm_restore_with(f, forged, len, &c.h), 0);
    uint64_t id;
    cr_assert_eq(ida_fsm_lookup(f, "a", t, &id), IDA_ENOTFOUND);
    cr_assert_eq(ida_fsm_lookup(f, "a", u, &id), 0);
    cr_assert_eq(id, (uint64_t)(3 * (BIG - 5) + 1));
    free(forged);
    ida_free(before);
}

/* Bytes of @v as a varint. */
static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    for (; v >= 0x80; v >>= 7) {
        n++;
    }
    return n;
}

/* Where restore cuts forge_big()'s holdings in two (snap_decode.c,
 * find_cut()): the holding that starts at or past the middle byte of the
 * pool's Bounded message, then the first after it in another chunk. */
static int big_cut(void)
{
    size_t total = 1 + varint_len(bs.size), at = total;
    for (int i = 0; i < BIG; i++) {
        size_t tl = strlen(big[i].tag);
        total += 2 + (big[i].id != 0 ? 1 + varint_len(big[i].id) : 0) + 2 + tl;
    }
    int mid = 0;
    for (; mid < BIG && at < total / 2; mid++) {
        size_t tl = strlen(big[mid].tag);
        at += 2 + (big[mid].id != 0 ? 1 + varint_len(big[mid].id) : 0) + 2 + tl;
    }
    int cut = mid + 1;
    while (cut < BIG && big[cut].id >> 12 == big[mid].id >> 12) {
        cut++;
    }
    cr_assert_lt(cut, BIG);
    return cut;
}

/* Damage next to the cut, across the two shares and at the ends is
 * refused as it is by one thread, and leaves the target as it was. */
Test(snap, two_threads_refuse_what_one_does)
{
    size_t len0;
    uint8_t *before = base_then_big(&len0);
    const int cut = big_cut();
    cr_assert(cut > BIG / 3 && cut < 2 * BIG / 3, "cut at %d", cut);
    for (int refuse = 0; refuse < 2; refuse++) {
        for (int damage = 0; damage < 24; damage++) {
            forge_big();
            int at = cut - 3 + damage % 6;
            if (damage < 6) {
                big[at].id = big[at - 1].id; /* not increasing */
            } else if (damage < 12) {
                big[at].tag = bigtag[at - 1]; /* twice, side by side */
            } else if (damage < 18) {
                big[at].tag = bigtag[at - 1000]; /* twice, far apart */
            } else if (damage == 18) {
                big[BIG - 1].id = 5; /* the last id is not the highest */
            } else if (damage == 19) {
                big[3].id = 3 * BIG; /* first share beyond the cut */
            } else if (damage == 20) {
                big[BIG - 1].id = bs.size; /* beyond the pool */
            } else if (damage == 21) {
                big[cut + 5].tag = ""; /* an empty tag */
            } else if (damage == 22) {
                big[0].tag = bigtag[BIG - 1]; /* first and last */
            } else {
                big[1].id = 0; /* equals the first */
                big[0].id = 0;
            }
            struct counted c;
            counted_init(&c, refuse);
            cr_assert_eq(forge_restore_with(&c), IDA_ECORRUPT,
                         "accepted damage %d (lent: %d)", damage, !refuse);
            size_t len1;
            uint8_t *after = fx_snapshot(f, &len1);
            cr_assert(len0 == len1 && memcmp(before, after, len0) == 0,
                      "a refused state changes nothing");
            ida_free(after);
        }
    }
    ida_free(before);
}

static struct ida_fsm_ahead *stepped(const uint8_t *data,
                                     size_t len,
                                     size_t piece,
                                     size_t stop);

/* Restore @forged (@len bytes) over the fixture's state (whose snapshot
 * is @before, @len0 bytes) with the allocation after n failing, for
 * growing n until it succeeds: each failure is IDA_ENOMEM and leaves the
 * state as it was. @ahead: after a whole decoding ahead, taken by the
 * restore. Returns the n that succeeded. */
static int enomem_until_restored(const uint8_t *before,
                                 size_t len0,
                                 const uint8_t *forged,
                                 size_t len,
                                 bool ahead)
{
    int n;
    for (n = 0;; n += 1 + n / 8) {
        struct ida_fsm_ahead *a =
            ahead ? stepped(forged, len, 65536, len) : NULL;
        struct counted c;
        counted_init(&c, true);
        ida_heap_fault_set(n, 1);
        int rv = ida_fsm_restore_ahead(f, forged, len, &c.h, a);
        ida_heap_fault_set(0, 0);
        ida_fsm_ahead_free(a);
        if (rv == 0) {
            break;
        }
        cr_assert_eq(rv, IDA_ENOMEM, "allocation %d: %d", n, rv);
        size_t len1;
        uint8_t *after = fx_snapshot(f, &len1);
        cr_assert(len0 == len1 && memcmp(before, after, len0) == 0,
                  "allocation %d", n);
        ida_free(after);
    }
    return n;
}

/* Out of memory anywhere in a two-thread restore is IDA_ENOMEM and leaves
 * the target as it was (the second share decoded by the restore's own
 * thread, so the sweep is deterministic). */
Test(snap, two_threads_enomem_changes_nothing)
{
    size_t len0;
    uint8_t *before = base_then_big(&len0);
    size_t len;
    uint8_t *forged = fx_forge(&st, &len);
    int n = enomem_until_restored(before, len0, forged, len, false);
    cr_assert_gt(n, 10);
    free(forged);
    ida_free(before);
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* --- decoding ahead (struct ida_fsm_ahead) ----------------------------------
 * A snapshot decoded while it arrives, then restored with what was decoded
 * ahead: the restore's verdict and state, whatever came ahead. */

/* Step a new ahead over @data (@len bytes) as if its first @stop bytes
 * arrived @piece bytes at a time into a buffer whose bytes not yet arrived
 * are garbage: 0xa5 (a varint that never ends) for odd pieces, 0x12 (a
 * field 2 of 18 bytes, over and over) for even ones. From 4096-byte pieces
 * on, the buffer moves before each step. Returns it (the caller frees
 * it). */
static struct ida_fsm_ahead *stepped(const uint8_t *data,
                                     size_t len,
                                     size_t piece,
                                     size_t stop)
{
    struct ida_fsm_ahead *a;
    cr_assert_eq(ida_fsm_ahead_new(len, &a), 0);
    uint8_t *buf = malloc(len);
    cr_assert(buf != NULL);
    memset(buf, piece % 2 ? 0xa5 : 0x12, len);
    /* Under AddressSanitizer a read of a byte not yet arrived fails. */
    POISON(buf, len);
    for (size_t at = 0; at < stop;) {
        size_t n = piece < stop - at ? piece : stop - at;
        if (piece >= 4096 && at > 0) {
            /* The buffer moves (grows) between steps, as a node's does. */
            uint8_t *moved = malloc(len);
            cr_assert(moved != NULL);
            memset(moved, piece % 2 ? 0xa5 : 0x12, len);
            memcpy(moved, buf, at);
            POISON(moved + at, len - at);
            UNPOISON(buf, len);
            free(buf);
            buf = moved;
        }
        UNPOISON(buf + at, n);
        memcpy(buf + at, data + at, n);
        at += n;
        ida_fsm_ahead_step(a, buf, at);
    }
    UNPOISON(buf, len);
    free(buf);
    return a;
}

/* The restore of @data with @a into a fresh state machine, its thread
 * counted (@refuse: none lent); *@g the state (NULL on error). */
static int restore_ahead(const uint8_t *data,
                         size_t len,
                         struct ida_fsm_ahead *a,
                         bool refuse,
                         int *starts,
                         struct ida_fsm **g)
{
    cr_assert_eq(ida_fsm_new(g), 0);
    struct counted c;
    counted_init(&c, refuse);
    int rv = ida_fsm_restore_ahead(*g, data, len, &c.h, a);
    *starts = c.starts;
    if (rv != 0) {
        ida_fsm_free(*g);
        *g = NULL;
    }
    return rv;
}

static void assert_gives_back(const struct ida_fsm *g,
                              const uint8_t *data,
                              size_t len)
{
    size_t l;
    uint8_t *again = fx_snapshot(g, &l);
    cr_assert(l == len && memcmp(again, data, len) == 0,
              "the restored state gives back the same bytes");
    ida_free(again);
}

Test(snap, ahead_restores_what_the_restore_does)
{
    forge_big();
    size_t len;
    uint8_t *forged = fx_forge(&st, &len);
    const size_t pieces[] = {1, 2, 13, 4096, 512 * 1024, SIZE_MAX};
    for (size_t i = 0; i < 2 * sizeof(pieces) / sizeof(pieces[0]); i++) {
        /* The second time round, the words grouped in two batches as they
         * come (65536, then the rest once all came) instead of one. */
        ida__hold_batch = i < 6 ? IDA__HOLD_BATCH : IDA__HOLD_SPLIT_MIN;
        for (int refuse = 0; refuse < 2; refuse++) {
            struct ida_fsm_ahead *a = stepped(forged, len, pieces[i % 6], len);
            cr_assert_eq(ida_fsm_ahead_holdings(a), BIG,
                         "pieces of %zu: every holding decoded ahead",
                         pieces[i % 6]);
            struct ida_fsm *g;
            int starts;
            cr_assert_eq(restore_ahead(forged, len, a, refuse, &starts, &g), 0);
            cr_assert_eq(starts, 2,
                         "clear, then insert: the checksum summed and the "
                         "words grouped as the bytes came, no decode of "
                         "the pool taken");
            assert_gives_back(g, forged, len);
            assert_big_holds(g);
            ida_fsm_free(g);
            ida_fsm_ahead_free(a);
        }
    }
    ida__hold_batch = IDA__HOLD_BATCH;
    free(forged);
    /* A pool the ahead skips comes first ("0p" sorts before "a"): it waits
     * for the bytes after it before it reads on. */
    ps[1].name = "0p";
    pps[0] = &ps[1];
    pps[1] = &ps[0];
    forged = fx_forge(&st, &len);
    for (size_t piece = 1; piece <= 128; piece *= 2) {
        struct ida_fsm_ahead *a = stepped(forged, len, piece, len);
        cr_assert_eq(ida_fsm_ahead_holdings(a), BIG, "pieces of %zu", piece);
        struct ida_fsm *g;
        int starts;
        cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g), 0);
        cr_assert_eq(starts, 2);
        assert_gives_back(g, forged, len);
        ida_fsm_free(g);
        ida_fsm_ahead_free(a);
    }
    free(forged);
    forge_big(); /* as it was, for the tests after */
}

/* Around IDA__HOLD_SPLIT_MIN holdings: below it the words wait for the
 * restore's GROUP, from it on they are grouped once all came (and, with
 * batches of that size, one batch as they come first). The state each
 * time is the restore's, every tag found. */
Test(snap, ahead_at_the_split)
{
    forge_big();
    const size_t ns[] = {IDA__HOLD_SPLIT_MIN - 1, IDA__HOLD_SPLIT_MIN,
                         IDA__HOLD_SPLIT_MIN + 1, BIG};
    for (size_t i = 0; i < 8; i++) {
        size_t n = ns[i % 4];
        ida__hold_batch = i < 4 ? IDA__HOLD_BATCH : IDA__HOLD_SPLIT_MIN;
        bs.n_holdings = n;
        size_t len;
        uint8_t *forged = fx_forge(&st, &len);
        struct ida_fsm_ahead *a = stepped(forged, len, 65536, len);
        cr_assert_eq(ida_fsm_ahead_holdings(a), n);
        struct ida_fsm *g;
        int starts;
        cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g), 0);
        cr_assert_eq(starts, n < IDA__HOLD_SPLIT_MIN ? 0 : 2,
                     "%zu holdings: one thread below the split, then clear "
                     "and insert shared",
                     n);
        cr_assert_eq(ida_fsm_ahead_taken(a), n);
        assert_gives_back(g, forged, len);
        for (size_t j = 0; j < n; j++) {
            uint64_t id;
            cr_assert_eq(ida_fsm_lookup(g, "a", bigtag[j], &id), 0,
                         "%zu holdings: tag %zu", n, j);
            cr_assert_eq(id, 3 * j + 1);
        }
        ida_fsm_free(g);
        ida_fsm_ahead_free(a);
        free(forged);
    }
    ida__hold_batch = IDA__HOLD_BATCH;
    forge_big();
}

/* Three batches and more, the last one full or of one word: grouped as
 * they came with batches of IDA__HOLD_SPLIT_MIN words, the restore takes
 * every batch of every region (ida__hold_settle() groups the last). */
Test(snap, ahead_in_three_batches)
{
    const int ns[] = {3 * IDA__HOLD_SPLIT_MIN, 3 * IDA__HOLD_SPLIT_MIN + 1};
    ida__hold_batch = IDA__HOLD_SPLIT_MIN;
    for (size_t i = 0; i < 2; i++) {
        int n = ns[i];
        forge_big_n(n);
        size_t len;
        uint8_t *forged = fx_forge(&st, &len);
        struct ida_fsm_ahead *a = stepped(forged, len, 65536, len);
        cr_assert_eq(ida_fsm_ahead_holdings(a), (size_t)n);
        struct ida_fsm *g;
        int starts;
        cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g), 0);
        cr_assert_eq(starts, 2, "%d holdings: clear and insert shared", n);
        cr_assert_eq(ida_fsm_ahead_taken(a), (size_t)n);
        assert_gives_back(g, forged, len);
        for (int j = 0; j < n; j++) {
            uint64_t id;
            cr_assert_eq(ida_fsm_lookup(g, "a", bigtag[j], &id), 0,
                         "%d holdings: tag %d", n, j);
            cr_assert_eq(id, 3 * (uint64_t)j + 1);
        }
        ida_fsm_free(g);
        ida_fsm_ahead_free(a);
        free(forged);
    }
    ida__hold_batch = IDA__HOLD_BATCH;
    forge_big();
}

/* Pools below the two-share size, every kind, sessions: the same. */
Test(snap, ahead_takes_small_pools_with_the_rest)
{
    populate(f, 3);
    size_t len;
    uint8_t *data = fx_snapshot(f, &len);
    struct ida_fsm_ahead *a = stepped(data, len, 100, len);
    cr_assert_gt(ida_fsm_ahead_holdings(a), 500);
    struct ida_fsm *g;
    int starts;
    cr_assert_eq(restore_ahead(data, len, a, false, &starts, &g), 0);
    cr_assert_eq(starts, 0, "none: the checksum summed as the bytes came");
    assert_gives_back(g, data, len);
    ida_fsm_free(g);
    ida_fsm_ahead_free(a);
    ida_free(data);
}

/* What the ahead cannot take, the restore decodes itself, and decides. */
Test(snap, ahead_leaves_the_verdict_to_the_restore)
{
    forge_big();
    size_t len;
    /* A field the restore skips after the holdings: the ahead drops the
     * pool once it meets it; the restore accepts the bytes. */
    uint8_t extra[1] = {7};
    ProtobufCMessageUnknownField u = {.tag = 9,
                                      .wire_type = PROTOBUF_C_WIRE_TYPE_VARINT,
                                      .len = 1,
                                      .data = extra};
    bs.base.n_unknown_fields = 1;
    bs.base.unknown_fields = &u;
    uint8_t *odd = fx_forge(&st, &len);
    bs.base.n_unknown_fields = 0;
    bs.base.unknown_fields = NULL;
    struct ida_fsm_ahead *a = stepped(odd, len, 65536, len);
    cr_assert_eq(ida_fsm_ahead_holdings(a), 0);
    struct ida_fsm *g;
    int starts;
    cr_assert_eq(restore_ahead(odd, len, a, false, &starts, &g), 0);
    cr_assert_eq(starts, 4,
                 "the pool decoded by the restore itself (the checksum "
                 "summed as the bytes came)");
    ida_fsm_free(g);
    ida_fsm_ahead_free(a);
    free(odd);

    /* Stopped half way (the rest never came to it): the pool under way is
     * not taken. */
    uint8_t *forged = fx_forge(&st, &len);
    a = stepped(forged, len, 4096, len / 2);
    cr_assert_eq(ida_fsm_ahead_holdings(a), 0);
    cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g), 0);
    cr_assert_eq(starts, 5, "the checksum too: not all bytes were summed");
    assert_gives_back(g, forged, len);
    ida_fsm_free(g);
    ida_fsm_ahead_free(a);

    /* Taken ahead, but the checksum does not match: refused. */
    a = stepped(forged, len, 65536, len);
    cr_assert_eq(ida_fsm_ahead_holdings(a), BIG);
    forged[len - 1] ^= 1;
    cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g),
                 IDA_ECORRUPT);
    ida_fsm_ahead_free(a);
    forged[len - 1] ^= 1;

    /* A tag changed in the bytes that came (still a valid, unique tag):
     * decoded ahead whole, but the sum of the bytes that came is not the
     * checksum they carry: refused before anything is decoded. */
    uint8_t *t = NULL;
    for (size_t i = 0; t == NULL && i + 6 <= len; i++) {
        t = memcmp(forged + i, "t77777", 6) == 0 ? forged + i : NULL;
    }
    cr_assert_not_null(t);
    *t = 'u';
    for (size_t piece = 4095; piece <= 4096; piece++) {
        a = stepped(forged, len, piece, len);
        cr_assert_eq(ida_fsm_ahead_holdings(a), BIG);
        cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g),
                     IDA_ECORRUPT, "pieces of %zu", piece);
        cr_assert_eq(starts, 0, "pieces of %zu", piece);
        ida_fsm_ahead_free(a);
    }
    free(forged);

    /* A holding out of order: refused by both, whatever came ahead. */
    big[BIG / 3].id = big[BIG / 3 - 1].id;
    forged = fx_forge(&st, &len);
    a = stepped(forged, len, 65536, len);
    cr_assert_eq(ida_fsm_ahead_holdings(a), 0);
    cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g),
                 IDA_ECORRUPT);
    ida_fsm_ahead_free(a);
    free(forged);
    forge_big(); /* for the tests after */
}

/* Memory short while decoding ahead costs only the decoding ahead; short
 * in the restore after, it refuses with the target unchanged. */
Test(snap, ahead_enomem_changes_nothing)
{
    size_t len0;
    uint8_t *before = base_then_big(&len0);
    size_t len;
    uint8_t *forged = fx_forge(&st, &len);
    int n;
    /* Grouped in one batch once all came, then in two (one as they come). */
    for (int twice = 0; twice < 2; twice++) {
        ida__hold_batch = twice ? IDA__HOLD_SPLIT_MIN : IDA__HOLD_BATCH;
        for (n = 0;; n += 1 + n / 4) {
            ida_heap_fault_set(n, 1);
            struct ida_fsm_ahead *a = NULL;
            int rv = ida_fsm_ahead_new(len, &a);
            if (rv == 0) {
                ida_fsm_ahead_step(a, forged, len / 3);
                ida_fsm_ahead_step(a, forged, len);
            }
            ida_heap_fault_set(0, 0);
            if (rv != 0) {
                cr_assert_eq(rv, IDA_ENOMEM);
                continue;
            }
            uint64_t held = ida_fsm_ahead_holdings(a);
            struct ida_fsm *g;
            int starts;
            cr_assert_eq(restore_ahead(forged, len, a, false, &starts, &g), 0,
                         "allocation %d", n);
            assert_gives_back(g, forged, len);
            ida_fsm_free(g);
            ida_fsm_ahead_free(a);
            if (held == BIG) {
                break;
            }
        }
        cr_assert_gt(n, 5);
    }
    ida__hold_batch = IDA__HOLD_BATCH;
    /* Short in the restore, after a whole decoding ahead. */
    n = enomem_until_restored(before, len0, forged, len, true);
    cr_assert_gt(n, 3);
    free(forged);
    ida_free(before);
}

/* Both restores of @data (@len bytes): the plain one, and the one with an
 * ahead stepped over it in @piece pieces. Same verdict, and accepted, the
 * same state. Returns the verdict. */
static int same_both_ways(const uint8_t *data, size_t len, size_t piece)
{
    struct ida_fsm *g, *h;
    cr_assert_eq(ida_fsm_new(&g), 0);
    struct counted c;
    counted_init(&c, false);
    int rv = ida_fsm_restore_with(g, data, len, &c.h);
    struct ida_fsm_ahead *a = stepped(data, len, piece, len);
    int starts;
    int rv2 = restore_ahead(data, len, a, false, &starts, &h);
    cr_assert_eq(rv2, rv, "ahead %d, plain %d", rv2, rv);
    if (rv == 0) {
        size_t l1, l2;
        uint8_t *s1 = fx_snapshot(g, &l1), *s2 = fx_snapshot(h, &l2);
        cr_assert(l1 == l2 && memcmp(s1, s2, l1) == 0);
        ida_free(s1);
        ida_free(s2);
        ida_fsm_free(h);
    }
    ida_fsm_free(g);
    ida_fsm_ahead_free(a);
    return rv;
}

/* Forged bytes the ahead takes or drops: the restore's verdict each time,
 * including refusals that come through a pool taken ahead. */
Test(snap, ahead_forged_pools_get_the_restores_verdict)
{
    forge_big();
    size_t len;
    uint8_t *bytes;
#define BOTH(expect)                                               \
    do {                                                           \
        bytes = fx_forge(&st, &len);                               \
        cr_assert_eq(same_both_ways(bytes, len, 65536), (expect)); \
        free(bytes);                                               \
    } while (0)
    /* A tag held twice: refused by the insert after the ahead took it,
     * with the words grouped in one batch or in two (the copies in
     * different batches). */
    big[BIG - 5].tag = big[10].tag;
    bytes = fx_forge(&st, &len);
    struct ida_fsm_ahead *a;
    struct ida_fsm *g;
    int starts;
    for (int twice = 0; twice < 2; twice++) {
        ida__hold_batch = twice ? IDA__HOLD_SPLIT_MIN : IDA__HOLD_BATCH;
        a = stepped(bytes, len, 65536, len);
        cr_assert_eq(ida_fsm_ahead_holdings(a), BIG);
        cr_assert_eq(restore_ahead(bytes, len, a, false, &starts, &g),
                     IDA_ECORRUPT);
        cr_assert_eq(ida_fsm_ahead_taken(a), BIG, "refused after it was taken");
        ida_fsm_ahead_free(a);
    }
    ida__hold_batch = IDA__HOLD_BATCH;
    free(bytes);
    forge_big();
    /* An id at the size, or past it; a size of 0. */
    big[BIG - 1].id = bs.size;
    BOTH(IDA_ECORRUPT);
    forge_big();
    bs.size = 0;
    BOTH(IDA_ECORRUPT);
    forge_big();
    /* A second size after the holdings: the last one counts for the
     * restore (protobuf), which the ahead does not follow. */
    uint8_t size_field[10];
    size_t sl = 0;
    for (uint64_t v = 3 * BIG + 100;; v >>= 7) {
        size_field[sl++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        if (v < 0x80) {
            break;
        }
    }
    ProtobufCMessageUnknownField u = {.tag = 1,
                                      .wire_type = PROTOBUF_C_WIRE_TYPE_VARINT,
                                      .len = sl,
                                      .data = size_field};
    bs.base.n_unknown_fields = 1;
    bs.base.unknown_fields = &u;
    BOTH(0);
    size_field[0] = 5; /* below the ids held */
    u.len = 1;
    BOTH(IDA_ECORRUPT);
    bs.base.n_unknown_fields = 0;
    bs.base.unknown_fields = NULL;
    /* Two large pools; then the second one damaged, after the first was
     * taken. */
    static Idalloc__BoundedState bs2;
    static Idalloc__PoolState ps2, *pps3[3];
    bs2 = bs;
    ps2 = ps[0];
    ps2.name = "c";
    ps2.bounded = &bs2;
    pps3[0] = &ps[0];
    pps3[1] = &ps[1];
    pps3[2] = &ps2;
    st.pools = pps3;
    st.n_pools = 3;
    bytes = fx_forge(&st, &len);
    a = stepped(bytes, len, 100000, len);
    cr_assert_eq(ida_fsm_ahead_holdings(a), 2 * BIG);
    cr_assert_eq(restore_ahead(bytes, len, a, false, &starts, &g), 0);
    cr_assert_eq(ida_fsm_ahead_taken(a), 2 * BIG);
    assert_gives_back(g, bytes, len);
    ida_fsm_free(g);
    ida_fsm_ahead_free(a);
    free(bytes);
    static Idalloc__Holding *late[BIG];
    memcpy(late, pbig, sizeof(late));
    late[BIG / 2] = late[BIG / 2 - 1];
    bs2.holdings = late;
    BOTH(IDA_ECORRUPT);
#undef BOTH
    forge_big(); /* st as the tests after expect */
}

/* Bytes changed at random (the checksum made right, so that the decoder
 * behind it sees them), then stepped in random pieces: the ahead never
 * changes the verdict or the state. */
Test(snap, ahead_random_damage_gets_the_restores_verdict)
{
    populate(f, 5);
    size_t len;
    uint8_t *good = fx_snapshot(f, &len);
    uint8_t *bytes = malloc(len);
    cr_assert(bytes != NULL);
    uint64_t x = 0x9e3779b97f4a7c15u;
    int accepted = 0, refused = 0;
    for (int round = 0; round < 300; round++) {
        memcpy(bytes, good, len);
        int flips = 1 + round % 3;
        for (int k = 0; k < flips; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t at = (size_t)(x % (len - IDA__CHECKSUM_BYTES));
            bytes[at] ^= (uint8_t)(1u << (x >> 61));
        }
        uint64_t sum = ida__snapshot_checksum(bytes, len - 9);
        for (int k = 0; k < 8; k++) {
            bytes[len - 8 + (size_t)k] = (uint8_t)(sum >> (8 * k));
        }
        size_t piece = 1 + (size_t)(x >> 40) % 5000;
        if (same_both_ways(bytes, len, piece) == 0) {
            accepted++;
        } else {
            refused++;
        }
    }
    cr_assert_gt(accepted, 10);
    cr_assert_gt(refused, 10);
    free(bytes);
    ida_free(good);
}
