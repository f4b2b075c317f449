/* Unit tests of the Raft core (raft/raft.h), driven through the harness
 * (tests/raft/harness.h): snapshots. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/raft/harness.h"
#include "tests/raft/helpers.h"

TestSuite(raft, .init = setup3, .fini = teardown);

/* --- snapshots -------------------------------------------------------------
 */

Test(raft, lagging_follower_gets_a_chunked_snapshot)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    h_propose(1, 30);
    h_deliver_all();
    cr_assert_eq(ida_raft_commit(&H.r[1]), 31);
    const uint8_t snap[] = "state machine at index 20 (27 bytes)";
    size_t waiting = ida_raft_release(&H.r[1], 0);
    cr_assert_eq(ida_raft_compact(&H.r[1], 20, snap, sizeof(snap)), 0);
    cr_assert_null(ida_raft_entry(&H.r[1], 20));
    /* The data of the 20 entries compacted (the first, the leader's empty
     * entry, has none) waits to be freed a piece at a time (MEMORY). */
    cr_assert_eq(ida_raft_release(&H.r[1], 0), waiting + 19);
    cr_assert_eq(ida_raft_release(&H.r[1], 5), waiting + 14);
    cr_assert_eq(ida_raft_release(&H.r[1], SIZE_MAX), 0);
    cr_assert_eq(ida_raft_term_at(&H.r[1], 20), 1);
    cr_assert_eq(ida_raft_compact(&H.r[1], 40, snap, 1), IDA_EINVAL,
                 "not applied yet");
    cr_assert_eq(ida_raft_compact(&H.r[1], 10, snap, 1), IDA_EINVAL,
                 "before the snapshot");
    h_heal();
    for (int i = 0; i < 20; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_geq(H.snapshot_chunks, sizeof(snap) / 8, "chunked (8 bytes)");
    cr_assert_eq(H.disk[3].snap_index, 20);
    cr_assert_eq(H.disk[3].snap_len, sizeof(snap));
    cr_assert_eq(memcmp(H.disk[3].snap, snap, sizeof(snap)), 0);
    cr_assert_eq(ida_raft_commit(&H.r[3]), 31);
    cr_assert_eq(H.applied[3], 31, "snapshot, then entries 21..31");
    cr_assert_eq(ida_raft_last_index(&H.r[3]), 31);
    /* And it survives a restart from its disk. */
    h_crash(3);
    h_start(3);
    cr_assert_eq(ida_raft_last_index(&H.r[3]), 31);
    cr_assert_eq(ida_raft_term_at(&H.r[3], 20), 1);
}

/* --- the application's check of a received snapshot ---------------------- */

static ida_index checked_index; /* what the last check was told */
static ida_term checked_term;
static size_t checked_len;

static int refuse_all(void *arg,
                      ida_index index,
                      ida_term term,
                      const uint8_t *data,
                      size_t len)
{
    (void)data;
    checked_index = index;
    checked_term = term;
    checked_len = len;
    (*(int *)arg)++;
    return IDA_ECORRUPT;
}

static int accept_all(void *arg,
                      ida_index index,
                      ida_term term,
                      const uint8_t *data,
                      size_t len)
{
    (void)data;
    checked_index = index;
    checked_term = term;
    checked_len = len;
    (*(int *)arg)++;
    return 0;
}

/* @n one-byte entries of @term from index @first into @ents. */
static void entries(struct ida_entry *ents,
                    int n,
                    ida_index first,
                    ida_term term)
{
    static const uint8_t d[1] = {7};
    for (int i = 0; i < n; i++) {
        ents[i] = (struct ida_entry){.term = term,
                                     .index = first + (ida_index)i,
                                     .type = IDA_ENTRY_NORMAL,
                                     .data = (uint8_t *)d,
                                     .len = 1};
    }
}

/* A message of @type from @from at @term to node 2, the rest zero. */
static struct ida_raft_msg msg_to_2(enum ida_raft_msg_type type,
                                    ida_node_id from,
                                    ida_term term)
{
    struct ida_raft_msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.from = from;
    m.to = 2;
    m.term = term;
    return m;
}

/* A chunk of the snapshot at @index (term 2) from leader @from at @term:
 * 22 bytes of junk, the whole snapshot in one chunk. */
static int chunk_of(struct ida_raft *r,
                    ida_node_id from,
                    ida_index index,
                    ida_term term)
{
    static const uint8_t junk[22] = "22 bytes of junk here";
    struct ida_raft_msg m = msg_to_2(IDA_RAFT_MSG_INSTALL_SNAPSHOT, from, term);
    m.u.install_snapshot.last_index = index;
    m.u.install_snapshot.last_term = 2;
    m.u.install_snapshot.data = junk;
    m.u.install_snapshot.len = sizeof(junk);
    m.u.install_snapshot.total_size = sizeof(junk);
    m.u.install_snapshot.done = true;
    return ida_raft_step(r, &m);
}

/* Node 2 holds entries 1..3 of term 1; leader 1 sends a whole snapshot at
 * index 10 in one chunk. Returns what step() said. */
static int offer_snapshot(
    struct ida_raft *r,
    int (*check)(void *, ida_index, ida_term, const uint8_t *, size_t),
    int *calls)
{
    struct ida_raft_config cfg = base_config();
    cfg.id = 2;
    cfg.snapshot_check = check;
    cfg.snapshot_check_arg = calls;
    struct ida_entry ents[3];
    entries(ents, 3, 1, 1);
    struct ida_raft_restore st = {
        .hard_state = {.term = 1}, .entries = ents, .n_entries = 3};
    cr_assert_eq(ida_raft_init(r, &cfg, &st), 0);
    return chunk_of(r, 1, 10, 2);
}

Test(snapshot_check, a_refused_snapshot_gives_up_nothing)
{
    struct ida_raft r;
    int calls = 0;
    cr_assert_eq(offer_snapshot(&r, refuse_all, &calls), IDA_EPROTO);
    cr_assert_eq(calls, 1);
    cr_assert_eq(ida_raft_last_index(&r), 3, "the log was given up");
    cr_assert_not_null(ida_raft_entry(&r, 1));
    struct ida_raft_batch b;
    int answers = 0;
    while (ida_raft_ready(&r, &b)) {
        cr_assert_not(b.has_snapshot, "a refused snapshot went to storage");
        for (size_t i = 0; i < b.n_msgs + b.n_msgs_after_persist; i++) {
            const struct ida_raft_msg *m =
                i < b.n_msgs ? &b.msgs[i] : &b.msgs_after_persist[i - b.n_msgs];
            if (m->type == IDA_RAFT_MSG_SNAPSHOT_RESPONSE) {
                /* "not installed, start again from byte 0", at once */
                cr_assert_lt(i, b.n_msgs, "the refusal waits for storage");
                cr_assert_not(m->u.snapshot_response.done);
                cr_assert_eq(m->u.snapshot_response.next_offset, 0);
                answers++;
            }
        }
        if (b.id != 0) {
            ida_raft_persisted(&r, b.id);
        }
    }
    cr_assert_eq(answers, 1, "the leader was told %d times", answers);
    ida_raft_close(&r);
}

Test(snapshot_check, control_an_accepted_snapshot_is_installed)
{
    struct ida_raft r;
    int calls = 0;
    cr_assert_eq(offer_snapshot(&r, accept_all, &calls), 0);
    cr_assert_eq(calls, 1);
    cr_assert_eq(ida_raft_last_index(&r), 10);
    /* The batch hands out what was checked, under the index and term the
     * check was told (raft.h, snapshot_check). */
    cr_assert_eq(checked_index, 10);
    cr_assert_eq(checked_term, 2);
    struct ida_raft_batch b;
    int snapshots = 0;
    while (ida_raft_ready(&r, &b)) {
        if (b.has_snapshot) {
            snapshots++;
            cr_assert_eq(b.snapshot.index, checked_index);
            cr_assert_eq(b.snapshot.term, checked_term);
            cr_assert_eq(b.snapshot.len, checked_len);
        }
        if (b.id != 0) {
            ida_raft_persisted(&r, b.id);
        }
    }
    cr_assert_eq(snapshots, 1);
    ida_raft_close(&r);
}

/* The node takes the bytes of an installed snapshot from the core instead
 * of copying them (ida_raft_snapshot_take()): only once the batch handing
 * them out went, only for that index, once; the core then holds no bytes
 * and frees none (ASan and valgrind would see a double free or a leak). */
Test(snapshot_check, the_installed_bytes_can_be_taken_once)
{
    struct ida_raft r;
    int calls = 0;
    cr_assert_eq(offer_snapshot(&r, accept_all, &calls), 0);
    cr_assert_null(ida_raft_snapshot_take(&r, 10), "taken before handed out");
    struct ida_raft_batch b;
    int taken = 0;
    while (ida_raft_ready(&r, &b)) {
        if (b.has_snapshot) {
            cr_assert_null(ida_raft_snapshot_take(&r, 9));
            uint8_t *d = ida_raft_snapshot_take(&r, 10);
            cr_assert_not_null(d);
            cr_assert(d == b.snapshot.data);
            cr_assert_eq(b.snapshot.len, 22);
            cr_assert_eq(memcmp(d, "22 bytes of junk here", 22), 0);
            cr_assert_null(ida_raft_snapshot_take(&r, 10), "taken twice");
            ida_free(d);
            taken++;
        }
        if (b.id != 0) {
            ida_raft_persisted(&r, b.id);
        }
    }
    cr_assert_eq(taken, 1);
    ida_raft_snapshot_stored(&r, 10); /* nothing left to drop */
    cr_assert_eq(ida_raft_last_index(&r), 10);
    ida_raft_close(&r);
}

/* A repeated last chunk of a snapshot installed a moment ago (not durable
 * yet) is answered "done" only once the install is durable: a crash before
 * that must not leave the leader believing the follower holds it. */
Test(snapshot_check, done_for_what_is_only_in_memory_waits_for_persist)
{
    struct ida_raft r;
    int calls = 0;
    cr_assert_eq(offer_snapshot(&r, accept_all, &calls), 0);
    /* The same last chunk again, before anything was persisted. */
    cr_assert_eq(chunk_of(&r, 1, 10, 2), 0);
    struct ida_raft_batch b;
    size_t early = 0, late = 0;
    while (ida_raft_ready(&r, &b)) {
        for (size_t i = 0; i < b.n_msgs; i++) {
            early += b.msgs[i].type == IDA_RAFT_MSG_SNAPSHOT_RESPONSE &&
                     b.msgs[i].u.snapshot_response.done;
        }
        for (size_t i = 0; i < b.n_msgs_after_persist; i++) {
            late += b.msgs_after_persist[i].type ==
                        IDA_RAFT_MSG_SNAPSHOT_RESPONSE &&
                    b.msgs_after_persist[i].u.snapshot_response.done;
        }
        if (b.id != 0) {
            ida_raft_persisted(&r, b.id);
        }
    }
    cr_assert_eq(early, 0, "\"done\" sent before the snapshot was durable");
    cr_assert_eq(late, 2, "both chunks answered once durable");
    ida_raft_close(&r);
}

/* --- a check that goes on outside the core (IDA_RAFT_CHECK_PENDING) ------ */

static const uint8_t *pending_data; /* what the pending check was given */

static int check_later(void *arg,
                       ida_index index,
                       ida_term term,
                       const uint8_t *data,
                       size_t len)
{
    checked_index = index;
    checked_term = term;
    checked_len = len;
    pending_data = data;
    (*(int *)arg)++;
    return IDA_RAFT_CHECK_PENDING;
}

/* AppendEntries from leader @from at @term to node 2: @ents after its
 * entry 3 (term 1), commit 3. */
static int append_after_3(struct ida_raft *r,
                          ida_node_id from,
                          ida_term term,
                          const struct ida_entry *ents,
                          size_t n)
{
    struct ida_raft_msg m = msg_to_2(IDA_RAFT_MSG_APPEND_ENTRIES, from, term);
    m.u.append_entries.prev_log_index = 3;
    m.u.append_entries.prev_log_term = 1;
    m.u.append_entries.entries = ents;
    m.u.append_entries.n_entries = n;
    m.u.append_entries.commit_index = 3;
    return ida_raft_step(r, &m);
}

/* Drain the core's batches (persisted at once): snapshots handed out, and
 * the last snapshot response sent (*@resp, its count in *@n_resp). */
static int drain(struct ida_raft *r,
                 struct ida_raft_snapshot_response *resp,
                 int *n_resp)
{
    struct ida_raft_batch b;
    int snapshots = 0;
    *n_resp = 0;
    while (ida_raft_ready(r, &b)) {
        snapshots += b.has_snapshot;
        for (size_t i = 0; i < b.n_msgs + b.n_msgs_after_persist; i++) {
            const struct ida_raft_msg *m =
                i < b.n_msgs ? &b.msgs[i] : &b.msgs_after_persist[i - b.n_msgs];
            if (m->type == IDA_RAFT_MSG_SNAPSHOT_RESPONSE) {
                *resp = m->u.snapshot_response;
                (*n_resp)++;
            }
        }
        if (b.id != 0) {
            ida_raft_persisted(r, b.id);
        }
    }
    return snapshots;
}

/* offer_snapshot() with a check that answers later, and the batches of
 * that step drained. */
static void offer_pending(struct ida_raft *r, int *calls)
{
    cr_assert_eq(offer_snapshot(r, check_later, calls), 0);
    struct ida_raft_snapshot_response resp;
    int n;
    drain(r, &resp, &n);
}

/* Pending: the log stays, the sender hears "all held, not installed", a
 * repeat of the chunk gets the same and no second check, a chunk of
 * another snapshot is refused and leaves the bytes alone; the verdict "yes"
 * installs those bytes and answers done. */
Test(snapshot_check, a_pending_check_installs_on_its_verdict)
{
    struct ida_raft r;
    int calls = 0;
    cr_assert_eq(offer_snapshot(&r, check_later, &calls), 0);
    cr_assert_eq(calls, 1);
    cr_assert_eq(ida_raft_last_index(&r), 3, "installed before the verdict");
    struct ida_raft_snapshot_response resp;
    int n;
    cr_assert_eq(drain(&r, &resp, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert(resp.success && !resp.done && resp.next_offset == 22,
              "not told it is all held (success %d done %d next %llu)",
              resp.success, resp.done, (unsigned long long)resp.next_offset);
    const uint8_t *bytes = pending_data;
    cr_assert_eq(chunk_of(&r, 1, 10, 2), 0); /* the leader resends it */
    cr_assert_eq(calls, 1, "checked twice");
    cr_assert_eq(drain(&r, &resp, &n), 0);
    cr_assert(n == 1 && resp.success && !resp.done && resp.next_offset == 22);
    cr_assert_eq(chunk_of(&r, 1, 12, 2), 0); /* another snapshot */
    cr_assert_eq(drain(&r, &resp, &n), 0);
    cr_assert(n == 1 && !resp.success && resp.next_offset == 0);
    cr_assert(pending_data == bytes && memcmp(bytes, "22 bytes", 8) == 0,
              "the bytes under check changed");
    cr_assert_eq(ida_raft_snapshot_checked(&r, 12, 2, 0), IDA_EINVAL,
                 "a verdict for a snapshot not under check");
    cr_assert_eq(ida_raft_last_index(&r), 3);
    cr_assert_eq(ida_raft_snapshot_checked(&r, 10, 2, 0), 0);
    cr_assert_eq(ida_raft_last_index(&r), 10);
    cr_assert_eq(ida_raft_commit(&r), 10);
    cr_assert_eq(drain(&r, &resp, &n), 1, "the install's batch");
    cr_assert(n == 1 && resp.success && resp.done && resp.next_offset == 22);
    cr_assert_eq(ida_raft_snapshot_checked(&r, 10, 2, 0), IDA_EINVAL,
                 "a second verdict");
    ida_raft_close(&r);
}

/* The verdict "no": nothing given up, the sender told to start over. */
Test(snapshot_check, a_pending_check_refused_gives_up_nothing)
{
    struct ida_raft r;
    int calls = 0;
    offer_pending(&r, &calls);
    struct ida_raft_snapshot_response resp;
    int n;
    cr_assert_eq(ida_raft_snapshot_checked(&r, 10, 2, IDA_ECORRUPT),
                 IDA_EPROTO);
    cr_assert_eq(ida_raft_last_index(&r), 3);
    cr_assert_not_null(ida_raft_entry(&r, 1));
    cr_assert_eq(drain(&r, &resp, &n), 0);
    cr_assert(n == 1 && !resp.success && !resp.done && resp.next_offset == 0);
    /* The next offer is checked again from scratch. */
    cr_assert_eq(chunk_of(&r, 1, 10, 2), 0);
    cr_assert_eq(calls, 2);
    ida_raft_close(&r);
}

/* A verdict that comes after the term moved on installs nothing (an
 * election may have made this node a candidate, or given its log entries
 * of a new leader): the bytes are forgotten, the log kept, and the next
 * offer is checked anew. */
Test(snapshot_check, a_verdict_after_the_term_moved_installs_nothing)
{
    struct ida_raft r;
    int calls = 0;
    offer_pending(&r, &calls);
    struct ida_raft_snapshot_response resp;
    int n;
    /* Leader 3 of term 3 says hello with a heartbeat. */
    cr_assert_eq(append_after_3(&r, 3, 3, NULL, 0), 0);
    cr_assert_eq(ida_raft_term(&r), 3);
    drain(&r, &resp, &n);
    cr_assert_eq(ida_raft_snapshot_checked(&r, 10, 2, 0), IDA_RAFT_CHECK_STALE);
    cr_assert_eq(ida_raft_last_index(&r), 3, "installed in another term");
    cr_assert_eq(drain(&r, &resp, &n), 0);
    cr_assert_eq(n, 0, "answered a leader of another term");
    cr_assert_eq(chunk_of(&r, 3, 10, 3), 0);
    cr_assert_eq(calls, 2, "the next offer was not checked");
    ida_raft_close(&r);
}

/* Entries the same leader appended while the check ran (acknowledged, so
 * perhaps counted toward a commit) survive the install: the log holds the
 * snapshot's last entry, so only what the snapshot covers is dropped. */
Test(snapshot_check, entries_appended_during_a_check_survive_the_install)
{
    struct ida_raft r;
    int calls = 0;
    offer_pending(&r, &calls);
    struct ida_raft_snapshot_response resp;
    int n;
    struct ida_entry ents[9];
    entries(ents, 9, 4, 2);
    cr_assert_eq(append_after_3(&r, 1, 2, ents, 9), 0);
    cr_assert_eq(ida_raft_last_index(&r), 12);
    drain(&r, &resp, &n); /* persisted and acknowledged */
    cr_assert_eq(ida_raft_snapshot_checked(&r, 10, 2, 0), 0);
    cr_assert_eq(ida_raft_snapshot_index(&r), 10);
    cr_assert_eq(ida_raft_last_index(&r), 12, "acknowledged entries lost");
    cr_assert_not_null(ida_raft_entry(&r, 11));
    cr_assert_not_null(ida_raft_entry(&r, 12));
    cr_assert_eq(drain(&r, &resp, &n), 1);
    cr_assert_eq(ida_raft_last_index(&r), 12);
    ida_raft_close(&r);
}

/* --- pipelined chunks (cfg.snapshot_max_inflight) ------------------------ */

#define SNAP_BYTES  100 /* 13 chunks of 8 bytes, the last of 4 */
#define SNAP_CHUNKS 13
static uint8_t snap_bytes[SNAP_BYTES];

/* What a delivery loop saw. */
struct flow
{
    size_t most_queued; /* InstallSnapshot chunks queued at once */
    size_t refusals;    /* chunks the follower refused */
    size_t refused_at_0;
};

static size_t queued_chunks(void)
{
    size_t n = 0;
    for (size_t k = 0; h_peek(k) != NULL; k++) {
        n += h_peek(k)->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT;
    }
    return n;
}

/* The position of the @i-th queued chunk. */
static size_t queued_chunk_at(size_t i)
{
    for (size_t k = 0; h_peek(k) != NULL; k++) {
        if (h_peek(k)->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT && i-- == 0) {
            return k;
        }
    }
    cr_assert_fail("fewer chunks queued");
    return 0;
}

static bool deliver_watching(struct flow *f)
{
    const struct ida_raft_msg *m = h_peek(0);
    if (m != NULL && m->type == IDA_RAFT_MSG_SNAPSHOT_RESPONSE &&
        !m->u.snapshot_response.success) {
        f->refusals++;
        f->refused_at_0 += m->u.snapshot_response.next_offset == 0;
    }
    bool any = h_deliver_one();
    size_t q = queued_chunks();
    f->most_queued = q > f->most_queued ? q : f->most_queued;
    return any;
}

/* Leader 1 has entries 1..31 committed; node 3 was cut off from entry 2
 * on (still cut off); snap_bytes holds a pattern of @mul and @add. */
static void lagging_third(unsigned mul, unsigned add)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_isolate(3);
    h_propose(1, 30);
    h_deliver_all();
    for (size_t i = 0; i < SNAP_BYTES; i++) {
        snap_bytes[i] = (uint8_t)(i * mul + add);
    }
}

/* Leader 1 has entries 1..31 committed and a snapshot at 20 (SNAP_BYTES);
 * node 3, cut off meanwhile, is back, and the leader's heartbeat found the
 * entries it needs compacted: its first chunk is queued. Chunks in flight
 * at most @window. */
static void lagging_follower(unsigned window)
{
    H.snapshot_max_inflight = window;
    lagging_third(7, 1);
    cr_assert_eq(ida_raft_compact(&H.r[1], 20, snap_bytes, SNAP_BYTES), 0);
    h_heal();
    const struct ida_raft_progress *pr = ida_raft_progress_of(&H.r[1], 3);
    for (int i = 0; i < 3 && pr->state != IDA_RAFT_SNAPSHOT; i++) {
        h_tick(1, 1);
    }
    cr_assert_eq(pr->state, IDA_RAFT_SNAPSHOT);
    cr_assert_eq(queued_chunks(), 1, "one chunk first: a probe");
}

/* Node 3 holds exactly the leader's snapshot and then the log after it. */
static void assert_installed(void)
{
    for (int i = 0; i < 10; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(H.disk[3].snap_index, 20);
    cr_assert_eq(H.disk[3].snap_len, SNAP_BYTES);
    cr_assert_eq(memcmp(H.disk[3].snap, snap_bytes, SNAP_BYTES), 0,
                 "bytes out of order or from two transfers");
    cr_assert_eq(ida_raft_commit(&H.r[3]), 31);
    cr_assert_eq(H.applied[3], 31);
    cr_assert(h_same_log(1, 3));
    cr_assert_eq(H.r[3].rcv_data, NULL, "bytes of a second snapshot kept");
}

Test(pipeline, control_one_chunk_at_a_time, .init = setup3, .fini = teardown)
{
    lagging_follower(1);
    struct flow f = {0};
    while (deliver_watching(&f)) {
    }
    cr_assert_eq(f.most_queued, 1);
    cr_assert_eq(f.refusals, 0);
    cr_assert_eq(H.snapshot_chunks, SNAP_CHUNKS, "each chunk once");
    assert_installed();
}

Test(pipeline,
     a_window_of_chunks_each_sent_once,
     .init = setup3,
     .fini = teardown)
{
    lagging_follower(4);
    struct flow f = {0};
    while (deliver_watching(&f)) {
    }
    cr_assert_eq(f.most_queued, 4, "the window was not kept full");
    cr_assert_eq(f.refusals, 0);
    cr_assert_eq(H.snapshot_chunks, SNAP_CHUNKS, "each chunk once");
    assert_installed();
}

/* A chunk lost in the middle of the window: the follower refuses the ones
 * after it (a gap), the leader goes back to the gap once, one chunk at a
 * time, then opens the window again. */
Test(pipeline,
     a_lost_chunk_is_resent_from_the_gap,
     .init = setup3,
     .fini = teardown)
{
    lagging_follower(4);
    struct flow f = {0};
    while (queued_chunks() < 4) {
        cr_assert(deliver_watching(&f));
    }
    h_drop(queued_chunk_at(1));
    while (deliver_watching(&f)) {
    }
    cr_assert_geq(f.refusals, 1, "the gap was not refused");
    cr_assert_leq(f.refusals, 4, "refusals multiplied: %zu", f.refusals);
    cr_assert_leq(H.snapshot_chunks, SNAP_CHUNKS + 2 * 4, "%zu chunks sent",
                  H.snapshot_chunks);
    assert_installed();
}

/* Chunks overtaking each other and a chunk delivered twice: the follower
 * takes bytes only in order, refuses the rest, and ends with the
 * snapshot's exact bytes. */
Test(pipeline,
     reordered_and_duplicated_chunks,
     .init = setup3,
     .fini = teardown)
{
    lagging_follower(4);
    struct flow f = {0};
    while (queued_chunks() < 4) {
        cr_assert(deliver_watching(&f));
    }
    h_swap(queued_chunk_at(1), queued_chunk_at(2));
    h_dup(queued_chunk_at(0));
    h_dup(queued_chunk_at(3));
    while (deliver_watching(&f)) {
    }
    cr_assert_geq(f.refusals, 2);
    assert_installed();
}

/* A follower restarted in the middle of a transfer has nothing of it: it
 * refuses the next chunk with offset 0 and the leader starts over. */
Test(pipeline,
     a_restarted_follower_gets_it_from_the_start,
     .init = setup3,
     .fini = teardown)
{
    lagging_follower(4);
    struct flow f = {0};
    while (H.snapshot_chunks < 6) {
        cr_assert(deliver_watching(&f));
    }
    cr_assert_gt(H.r[3].rcv_len, 0);
    h_crash(3);
    h_start(3);
    cr_assert_eq(H.r[3].rcv_len, 0);
    for (int i = 0; i < 5; i++) {
        h_tick(1, 1);
        while (deliver_watching(&f)) {
        }
    }
    cr_assert_geq(f.refused_at_0, 1, "the restart was not noticed");
    assert_installed();
}

/* A leader that took a newer snapshot meanwhile sends that one from byte
 * 0; answers about the older one change nothing. */
Test(pipeline,
     a_newer_snapshot_restarts_the_transfer,
     .init = setup3,
     .fini = teardown)
{
    lagging_follower(4);
    struct flow f = {0};
    while (H.snapshot_chunks < 6) {
        cr_assert(deliver_watching(&f));
    }
    for (size_t i = 0; i < SNAP_BYTES; i++) {
        snap_bytes[i] = (uint8_t)(255 - i);
    }
    cr_assert_eq(ida_raft_compact(&H.r[1], 25, snap_bytes, SNAP_BYTES), 0);
    for (int i = 0; i < 5; i++) {
        h_tick(1, 1);
        while (deliver_watching(&f)) {
        }
    }
    for (int i = 0; i < 10; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(H.disk[3].snap_index, 25);
    cr_assert_eq(H.disk[3].snap_len, SNAP_BYTES);
    cr_assert_eq(memcmp(H.disk[3].snap, snap_bytes, SNAP_BYTES), 0);
    cr_assert_eq(ida_raft_commit(&H.r[3]), 31);
    cr_assert_eq(H.r[3].rcv_data, NULL);
}

/* --- snapshot bytes kept by the application (raft.h contract 7) ---------- */

/* The core of a node that compacted with NULL data holds no bytes; its
 * chunks are filled from the node's disk and the follower gets the exact
 * snapshot, then the log after it. */
Test(in_storage,
     a_lagging_follower_gets_the_stored_bytes,
     .init = setup3,
     .fini = teardown)
{
    lagging_third(5, 3);
    cr_assert_eq(h_compact_stored(1, 40, snap_bytes, SNAP_BYTES), IDA_EINVAL,
                 "not applied yet");
    cr_assert_eq(h_compact_stored(1, 20, snap_bytes, SNAP_BYTES), 0);
    cr_assert_null(H.r[1].snap_data, "the core copied the bytes");
    cr_assert_eq(H.r[1].snap_len, SNAP_BYTES);
    h_heal();
    for (int i = 0; i < 30; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(H.chunks_unfilled, 0);
    cr_assert_geq(H.snapshot_chunks, SNAP_CHUNKS);
    cr_assert_eq(H.disk[3].snap_index, 20);
    cr_assert_eq(H.disk[3].snap_len, SNAP_BYTES);
    cr_assert_eq(memcmp(H.disk[3].snap, snap_bytes, SNAP_BYTES), 0);
    cr_assert_eq(H.applied[3], 31);
    cr_assert(h_same_log(1, 3));
}

/* A restarted leader restores with snapshot_in_storage: it holds only the
 * size and still serves the snapshot from its disk. */
Test(in_storage,
     a_restarted_node_serves_it_from_storage,
     .init = setup3,
     .fini = teardown)
{
    H.snap_in_storage = true;
    lagging_third(11, 2);
    cr_assert_eq(h_compact_stored(1, 20, snap_bytes, SNAP_BYTES), 0);
    h_crash(1);
    for (int i = 0; i < 30; i++) {
        h_tick(2, 1); /* node 2 forgets its leader */
        h_deliver_all();
    }
    h_start(1);
    cr_assert_null(H.r[1].snap_data);
    cr_assert_eq(H.r[1].snap_len, SNAP_BYTES);
    cr_assert_eq(ida_raft_term_at(&H.r[1], 20), 1);
    /* Node 1 leads again; node 3, cut off all along, is back. */
    h_heal();
    h_elect(1);
    cr_assert_eq(ida_raft_role(&H.r[1]), IDA_RAFT_LEADER);
    for (int i = 0; i < 40; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(H.disk[3].snap_index, 20);
    cr_assert_eq(memcmp(H.disk[3].snap, snap_bytes, SNAP_BYTES), 0);
    cr_assert_eq(H.applied[3], ida_raft_commit(&H.r[1]));
}

/* While the node's storage holds another snapshot than the core's (stored
 * later, or replaced), its chunks are dropped, never sent with other
 * bytes; once the core compacts to the stored one, that one goes. */
Test(in_storage,
     chunks_of_a_snapshot_no_longer_stored_are_dropped,
     .init = setup3,
     .fini = teardown)
{
    lagging_third(1, 9);
    cr_assert_eq(h_compact_stored(1, 20, snap_bytes, SNAP_BYTES), 0);
    /* The disk moves on to a snapshot at 25 the core does not know yet. */
    static uint8_t newer[SNAP_BYTES];
    memset(newer, 0xee, sizeof(newer));
    free(H.disk[1].snap);
    H.disk[1].snap = malloc(SNAP_BYTES);
    cr_assert_not_null(H.disk[1].snap);
    memcpy(H.disk[1].snap, newer, SNAP_BYTES);
    H.disk[1].snap_index = 25;
    h_heal();
    for (int i = 0; i < 5; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_gt(H.chunks_unfilled, 0);
    cr_assert_eq(H.disk[3].snap_index, 0, "nothing installed meanwhile");
    cr_assert_eq(ida_raft_compact(&H.r[1], 25, NULL, SNAP_BYTES), 0);
    for (int i = 0; i < 30; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(H.disk[3].snap_index, 25);
    cr_assert_eq(memcmp(H.disk[3].snap, newer, SNAP_BYTES), 0);
    cr_assert_eq(H.applied[3], 31);
}

/* The membership in effect at an index, before compacting there. */
Test(in_storage,
     config_at_refuses_what_compact_refuses,
     .init = setup3,
     .fini = teardown)
{
    h_start_all();
    h_elect(1);
    h_tick(1, 1);
    h_deliver_all();
    h_propose(1, 5);
    h_deliver_all();
    const uint8_t *conf;
    size_t len;
    cr_assert_eq(ida_raft_config_at(&H.r[1], 3, &conf, &len), 0);
    cr_assert_eq(len, 0, "the bootstrap voters");
    cr_assert_eq(ida_raft_config_at(&H.r[1], 99, &conf, &len), IDA_EINVAL);
    cr_assert_eq(ida_raft_compact(&H.r[1], 3, NULL, 4), 0);
    cr_assert_eq(ida_raft_config_at(&H.r[1], 3, &conf, &len), IDA_EINVAL);
    cr_assert_eq(ida_raft_config_at(&H.r[1], 0, &conf, &len), IDA_EINVAL);
}

/* A follower's core holds an installed snapshot's bytes until its batch
 * is durable; once told storage has them, it drops them (a node in that
 * state serving chunks from its disk: the simulator's odd nodes). */
Test(in_storage,
     an_installed_snapshot_is_dropped_once_stored,
     .init = setup3,
     .fini = teardown)
{
    lagging_third(3, 1);
    cr_assert_eq(ida_raft_compact(&H.r[1], 20, snap_bytes, SNAP_BYTES), 0);
    h_heal();
    for (int i = 0; i < 30; i++) {
        h_tick(1, 1);
        h_deliver_all();
    }
    cr_assert_eq(H.disk[3].snap_index, 20, "installed and persisted");
    cr_assert_not_null(H.r[3].snap_data);
    ida_raft_snapshot_stored(&H.r[3], 19); /* not its snapshot: no-op */
    cr_assert_not_null(H.r[3].snap_data);
    ida_raft_snapshot_stored(&H.r[3], 20);
    cr_assert_null(H.r[3].snap_data);
    cr_assert_eq(H.r[3].snap_len, SNAP_BYTES);
    cr_assert_eq(ida_raft_term_at(&H.r[3], 20), 1, "still its snapshot");
    ida_raft_snapshot_stored(&H.r[3], 20); /* again: nothing to drop */
    cr_assert_null(H.r[3].snap_data);
}
