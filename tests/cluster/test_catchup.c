/* A follower whose data directory was wiped catches up by InstallSnapshot
 * with real processes (TLS peers, fsync on): the leader sends its snapshot
 * of several MB in chunks, several in flight (src/node/raft_proc.c), the
 * follower decodes it as its chunks arrive and checks it by finishing that
 * decoding once the last came, hands that state to its fsm (no second
 * decode), the leader re-admits it (auto_rejoin), and then it
 * holds exactly the leader's state: the nodes, stopped, export their state
 * (idallocd --export-backup: snapshot plus log) and the three are the same
 * bytes at the same index. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "src/common/backup.h"
#include "tests/lib/harness.h"

/* 32,000 holdings with 120-byte tags make a snapshot of more than 4 MB:
 * more chunks of 512 KiB than the leader keeps in flight (8). */
#define THREADS    16
#define PER_THREAD 2000
#define TAG_BYTES  120

static struct tc c;
static struct idalloc_client *cl;
static char out[1 << 16];
/* A leader's snapshot child the test stopped (catch_snapshot_child()):
 * killed at teardown, which kills its parent but not it. */
static pid_t caught_child;

static void teardown(void)
{
    if (caught_child > 0) {
        kill(caught_child, SIGKILL);
        caught_child = 0;
    }
    if (cl != NULL) {
        idalloc_client_free(cl);
        cl = NULL;
    }
    tc_destroy(&c);
}

/* --- helpers -------------------------------------------------------------- */

/* Thread @arg: PER_THREAD allocs in "b", a reserve in "s" and a prefix in
 * "p" every 100th. */
static void *writer(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        char tag[TAG_BYTES + 1];
        tc_long_tag(tag, TAG_BYTES, t, i);
        uint64_t id;
        uint8_t pfx[9];
        size_t plen;
        if (idalloc_alloc(cl, "b", tag, &id, NULL, tc_detail()) != 0) {
            return (void *)1;
        }
        if (i % 100 == 0 &&
            (idalloc_reserve(cl, "s", 10, &id, tc_detail()) != 0 ||
             idalloc_prefix(cl, "p", tag, pfx, &plen, NULL, tc_detail()) !=
                 0)) {
            return (void *)1;
        }
    }
    return NULL;
}

static void write_state(int round)
{
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        pthread_create(&th[t], NULL, writer,
                       (void *)(intptr_t)(round * THREADS + t));
    }
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        cr_assert_null(r, "a write failed: %s", tc_errmsg());
    }
}

/* Whether the leader's member list has every node as a voter, none
 * waiting. */
static int membership_whole(void)
{
    struct idalloc_member_list m;
    if (idalloc_member_list(cl, &m, NULL) != 0) {
        return 0;
    }
    int voters = 0, ok = 1;
    for (size_t i = 0; i < m.n; i++) {
        voters += m.members[i].voter && !m.members[i].waiting;
        ok &= !m.members[i].waiting;
    }
    return ok && voters == c.n;
}

/* The largest number @num() reads on a line of node @i's log holding
 * @needle (@hit: where the needle is), 0 if none. */
static uint64_t log_max(int i,
                        const char *needle,
                        uint64_t (*num)(const char *line, const char *hit))
{
    char path[400], line[1024];
    snprintf(path, sizeof(path), "%s/node%d.log", c.dir, i + 1);
    FILE *f = fopen(path, "r");
    uint64_t best = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        const char *hit = strstr(line, needle);
        uint64_t x = hit != NULL ? num(line, hit) : 0;
        best = x > best ? x : best;
    }
    if (f != NULL) {
        fclose(f);
    }
    return best;
}

/* "fsm: snapshot at index N (B bytes": B. */
static uint64_t bytes_after(const char *line, const char *hit)
{
    (void)line;
    const char *b = strstr(hit, " (");
    return b != NULL ? strtoull(b + 2, NULL, 10) : 0;
}

/* The largest snapshot node @i took, in bytes. */
static size_t snapshot_bytes(int i)
{
    return (size_t)log_max(i, "fsm: snapshot at index", bytes_after);
}

/* Export the state of stopped node @i into @b. */
static void export_state(int i, struct ida_backup *b)
{
    char file[400], err[IDA_ERRMSG_MAX];
    snprintf(file, sizeof(file), "%s/node%d.ida", c.dir, i + 1);
    int rv = tc_run(out, sizeof(out),
                    "%s --config %s --node %d "
                    "--export-backup %s 2>&1",
                    tc_bin("idallocd"), c.conf, i + 1, file);
    cr_assert_eq(rv, 0, "export of node %d: %s", i + 1, out);
    cr_assert_eq(ida_backup_read(file, b, err), 0, "%s", err);
}

/* A 3-node cluster with the config lines @extra, a client and the bounded
 * pool "b"; returns the leader. */
static int start_with_pool(const char *extra)
{
    tc_start(&c, 3, extra);
    int l = tc_wait_leader(&c, 20000);
    cr_assert_geq(l, 0, "no leader");
    cl = tc_client(&c, 30000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL, tc_detail()),
                 0, "%s", tc_errmsg());
    return l;
}

/* A 3-node cluster holding pools "b", "s" and "p" whose leader (returned)
 * took a snapshot of more than eight chunks. */
static int start_with_big_snapshot(void)
{
    int l = start_with_pool("snapshot_interval_entries 100\n");
    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    cr_assert_eq(
        idalloc_pool_create(cl, "p", IDALLOC_POOL_PREFIX, 0, NULL, tc_detail()),
        0);
    write_state(0);
    /* The leader snapshots once the log since its last snapshot is as
     * large as that one (src/node/snap_policy.h): write until it took one
     * of more than eight chunks. */
    for (int round = 1; snapshot_bytes(l) < (8u << 19) + 1; round++) {
        /* A due snapshot pauses, and waits while a follower encodes one
         * (src/node/snap_policy.h, TURNS): give it time before writing
         * more. */
        for (uint64_t end = tc_now_ms() + 15000;
             snapshot_bytes(l) < (8u << 19) + 1 && tc_now_ms() < end;) {
            tc_sleep_ms(200);
        }
        if (snapshot_bytes(l) >= (8u << 19) + 1) {
            break;
        }
        cr_assert_lt(round, 6, "the leader took no snapshot over 4 MiB");
        write_state(round);
    }
    return l;
}

/* Node @f's disk is replaced: it is killed, its data directory goes (and
 * its log, kept as node<f>.log.old). */
static void wipe(int f)
{
    tc_signal(&c, f, SIGKILL);
    cr_assert_eq(
        tc_run(out, sizeof(out), "rm -rf %s/data/node%d", c.dir, f + 1), 0);
    cr_assert_eq(tc_run(out, sizeof(out), "mv %s/node%d.log %s/node%d.log.old",
                        c.dir, f + 1, c.dir, f + 1),
                 0);
}

/* ... and it comes back empty. */
static void wipe_and_start(int f)
{
    wipe(f);
    tc_spawn(&c, f);
}

/* Wait until node @f, wiped, was re-admitted and every node applied the
 * commit index. */
static void wait_readmitted(int f)
{
    for (uint64_t end = tc_now_ms() + 120000;
         tc_now_ms() < end && !membership_whole();) {
        tc_sleep_ms(100);
    }
    cr_assert(membership_whole(), "node %d was not re-admitted", f + 1);
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 60000),
              "not every node applied the commit index");
}

/* Wait until every node applied the commit index, stop the nodes
 * (followers of leader @l first: the leader appends nothing alone) and
 * check that each one's state, exported from its directory, is the same,
 * at the same index, and larger than @min. A write is acknowledged once a
 * majority has it: without the wait, a follower stopped first may not yet
 * have the last ones. */
static void assert_same_state(int l, size_t min)
{
    cr_assert(tc_wait_applied(&c, tc_commit_index(&c), 30000),
              "not every node applied the commit index");
    idalloc_client_free(cl);
    cl = NULL;
    int order[3] = {(l + 1) % 3, (l + 2) % 3, l};
    for (int k = 0; k < 3; k++) {
        int st = tc_signal(&c, order[k], SIGTERM);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "node %d did not stop cleanly", order[k] + 1);
    }
    struct ida_backup b[3];
    for (int i = 0; i < 3; i++) {
        export_state(i, &b[i]);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(b[i].index, b[l].index,
                     "node %d at index %llu, the "
                     "leader at %llu",
                     i + 1, (unsigned long long)b[i].index,
                     (unsigned long long)b[l].index);
        cr_assert(b[i].state_len == b[l].state_len &&
                      memcmp(b[i].state, b[l].state, b[l].state_len) == 0,
                  "node %d's state differs from the leader's", i + 1);
    }
    cr_assert_gt(b[l].state_len, min);
    for (int i = 0; i < 3; i++) {
        ida_backup_free(&b[i]);
    }
}

/* --- tests ---------------------------------------------------------------- */

Test(catchup,
     wiped_follower_catches_up_by_snapshot_and_holds_the_leaders_state,
     .fini = teardown,
     .timeout = 300)
{
    int l = start_with_big_snapshot();
    int f = (l + 1) % 3;
    wipe_and_start(f);
    /* Writes go on while it catches up: entries after the snapshot. */
    write_state(100);
    wait_readmitted(f);
    struct idalloc_node_status s;
    cr_assert_eq(idalloc_node_status(cl, (size_t)f, &s, tc_detail()), 0);
    cr_assert_gt(s.snapshot_index, 0, "node %d has no snapshot", f + 1);
    cr_assert_geq(tc_log_count(&c, f, "received from the leader and checked"),
                  1, "node %d installed no snapshot from the leader", f + 1);
    cr_assert_geq(tc_log_count(&c, f, "the state checked when it arrived"), 1,
                  "node %d decoded the snapshot a second time", f + 1);
    cr_assert_eq(tc_log_count(&c, f, "restored from its bytes"), 0);
    cr_assert_eq(tc_log_count(&c, f, "refused a snapshot"), 0);
    /* Its holdings were decoded as its chunks came, and the check took
     * them so (snap_stream.h). */
    cr_assert_geq(
        tc_log_count(&c, f, "holdings taken as decoded while it arrived"), 1);
    cr_assert_eq(
        tc_log_count(&c, f, "(0 holdings taken as decoded while it arrived"), 0,
        "node %d decoded nothing of the snapshot as it arrived", f + 1);
    cr_assert_eq(tc_log_count(&c, f, "is not the one checked"), 0);
    cr_assert_geq(tc_log_count(&c, f, "stored as it arrived"), 1,
                  "node %d stored the snapshot only once it was checked",
                  f + 1);

    assert_same_state(l, 8u << 19);
}

/* Bytes of node @i's data.mdb (0 while it has none). */
static off_t data_bytes(int i)
{
    char path[400];
    struct stat st;
    snprintf(path, sizeof(path), "%s/data/node%d/data.mdb", c.dir, i + 1);
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* While slowed, node duty_node runs DUTY_RUN_MS of every DUTY_PERIOD_MS: a
 * follower slow to take a snapshot, yet heard from by its leader (a
 * follower silent for 3 s is no longer waited for: snap_policy.h). It
 * answers only once it stored what it received, so when its data.mdb did
 * not grow for DUTY_STUCK_MS (a slow build, ASan, or a loaded machine: a
 * slice too short to store a chunk), it runs DUTY_LONG_RUN_MS instead. */
#define DUTY_RUN_MS      10
#define DUTY_LONG_RUN_MS 150
#define DUTY_STUCK_MS    1000
#define DUTY_PERIOD_MS   500
static atomic_int duty_on;
static int duty_node;
static pthread_t duty_thread;

static void *duty(void *arg)
{
    (void)arg;
    off_t seen = data_bytes(duty_node);
    uint64_t grew_ms = tc_now_ms();
    while (atomic_load(&duty_on)) {
        off_t now = data_bytes(duty_node);
        if (now != seen) {
            seen = now;
            grew_ms = tc_now_ms();
        }
        unsigned run = tc_now_ms() - grew_ms >= DUTY_STUCK_MS ? DUTY_LONG_RUN_MS
                                                              : DUTY_RUN_MS;
        tc_signal(&c, duty_node, SIGSTOP);
        tc_sleep_ms(DUTY_PERIOD_MS - run);
        tc_signal(&c, duty_node, SIGCONT);
        tc_sleep_ms(run);
    }
    tc_signal(&c, duty_node, SIGCONT);
    return NULL;
}

static void slow_down(int f)
{
    duty_node = f;
    atomic_store(&duty_on, 1);
    cr_assert_eq(pthread_create(&duty_thread, NULL, duty, NULL), 0);
}

/* It runs freely again. */
static void slow_down_end(void)
{
    atomic_store(&duty_on, 0);
    pthread_join(duty_thread, NULL);
}

/* Wait until node @f, wiped and started, stored a first chunk (512 KiB) of
 * the snapshot it receives; returns the size of its data.mdb before. */
static off_t wait_first_chunk(int f)
{
    off_t empty = 0;
    for (uint64_t end = tc_now_ms() + 5000;
         tc_now_ms() < end && (empty = data_bytes(f)) == 0;) {
        tc_sleep_ms(1);
    }
    for (uint64_t end = tc_now_ms() + 60000;
         tc_now_ms() < end && data_bytes(f) < empty + (512 << 10);) {
        tc_sleep_ms(1);
    }
    return empty;
}

/* Node @f is still receiving its snapshot. */
static void assert_in_transfer(int f)
{
    cr_assert_eq(tc_log_count(&c, f, "installed snapshot at index"), 0,
                 "node %d installed its snapshot before it was slowed down",
                 f + 1);
}

/* Node @f, wiped and started, slowed down once it stored a first chunk
 * of the snapshot it receives; returns the size of its data.mdb before. */
static off_t slow_down_in_transfer(int f)
{
    off_t empty = wait_first_chunk(f);
    slow_down(f);
    assert_in_transfer(f);
    return empty;
}

/* The leader dies while a wiped follower receives its snapshot. The
 * follower is slowed down once it stored a first chunk and paused once it
 * stored 1 MiB of the snapshot (its chunks are stored as they arrive),
 * so it is paused mid-transfer; the leader is killed and restarted, and the
 * follower resumes holding part of a snapshot of a leader that is gone:
 * the next leader's snapshot must replace it, and the cluster ends with
 * one state on all three nodes. */
Test(catchup,
     leader_dies_while_a_wiped_follower_receives_its_snapshot,
     .fini = teardown,
     .timeout = 300)
{
    int l = start_with_big_snapshot();
    int f = (l + 1) % 3;
    wipe_and_start(f);
    off_t empty = slow_down_in_transfer(f);
    for (uint64_t end = tc_now_ms() + 60000;
         tc_now_ms() < end && data_bytes(f) < empty + (1 << 20);) {
        tc_sleep_ms(10);
    }
    slow_down_end();
    tc_signal(&c, f, SIGSTOP);
    cr_assert_geq(data_bytes(f), empty + (1 << 20),
                  "node %d stored nothing of a snapshot", f + 1);
    cr_assert_eq(tc_log_count(&c, f, "stored as it arrived"), 0,
                 "node %d had its whole snapshot before it was paused: the "
                 "leader would die after the transfer, not during it",
                 f + 1);
    tc_signal(&c, l, SIGKILL);
    tc_spawn(&c, l);
    tc_signal(&c, f, SIGCONT);
    int nl = tc_wait_leader(&c, 30000);
    cr_assert_geq(nl, 0, "no leader after the kill");
    write_state(100);
    wait_readmitted(f);
    cr_assert_geq(tc_log_count(&c, f, "received from the leader and checked"),
                  1, "node %d installed no snapshot from the leader", f + 1);
    cr_assert_eq(tc_log_count(&c, f, "refused a snapshot"), 0);
    assert_same_state(tc_wait_leader(&c, 10000), 8u << 19);
}

/* The N of the first "at index N" on @line. */
static uint64_t at_index(const char *line, const char *hit)
{
    (void)hit;
    const char *b = strstr(line, "at index ");
    return b != NULL ? strtoull(b + 9, NULL, 10) : 0;
}

/* A child process of node @i (a snapshot's encoder: src/node/bgsnap.h),
 * 0 if none. fork() is called by one of its threads, whose children
 * /proc lists. */
static pid_t child_of(int i)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)c.pid[i]);
    DIR *d = opendir(dir);
    if (d == NULL) {
        return 0;
    }
    int pid = 0;
    struct dirent *e;
    while (pid == 0 && (e = readdir(d)) != NULL) {
        char file[400];
        snprintf(file, sizeof(file), "%s/%s/children", dir, e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(file, "r") : NULL;
        if (f != NULL) {
            if (fscanf(f, "%d", &pid) != 1) {
                pid = 0;
            }
            fclose(f);
        }
    }
    closedir(d);
    return (pid_t)pid;
}

/* Writers that go on until told to stop (catch_snapshot_child()). */
static atomic_int writes_stop, writes_failed;

static void *writes_loop(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int k = 1; !atomic_load(&writes_stop); k++) {
        if (writer((void *)(intptr_t)(t + k * 1000)) != NULL) {
            atomic_store(&writes_failed, 1);
            return NULL;
        }
    }
    return NULL;
}

/* Writes go on until node @l forks a child to encode its next snapshot,
 * which is stopped (SIGSTOP) before it is done: that snapshot reaches the
 * node only once the test lets the child go on (caught_child). The parent
 * takes a snapshot as done only at its child's EOF (src/node/bgsnap.c),
 * so a child caught alive, whatever it wrote, holds it back; one caught
 * exiting shows as a zombie and the next one is waited for. */
static void catch_snapshot_child(int l)
{
    pthread_t th[THREADS];
    atomic_store(&writes_stop, 0);
    atomic_store(&writes_failed, 0);
    for (int t = 0; t < THREADS; t++) {
        pthread_create(&th[t], NULL, writes_loop, (void *)(intptr_t)(300 + t));
    }
    const char *taken = "fsm: snapshot at index";
    for (uint64_t end = tc_now_ms() + 60000;
         caught_child == 0 && tc_now_ms() < end;) {
        pid_t p = child_of(l);
        if (p == 0) {
            tc_sleep_ms(1);
            continue;
        }
        /* A child alive now has not been logged: that comes after its
         * EOF and exit. */
        int before = tc_log_count(&c, l, taken);
        kill(p, SIGSTOP);
        char st = 0;
        for (uint64_t until = tc_now_ms() + 1000;
             (st = tc_proc_state(p)) != 'T' && st != 'Z' && st != 0 &&
             tc_now_ms() < until;) {
            tc_sleep_ms(1);
        }
        if (st != 'T') {
            tc_sleep_ms(10); /* exited: its parent reaps it */
            continue;
        }
        /* Stopped: its snapshot must not be done a while later. */
        tc_sleep_ms(300);
        if (tc_log_count(&c, l, taken) == before && tc_proc_state(p) == 'T') {
            caught_child = p;
        } else {
            kill(p, SIGCONT);
        }
    }
    atomic_store(&writes_stop, 1);
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
    }
    cr_assert_eq(atomic_load(&writes_failed), 0, "a write failed: %s",
                 tc_errmsg());
    cr_assert_neq(caught_child, 0,
                  "node %d was never caught encoding a snapshot", l + 1);
}

/* The leader's next snapshot is done encoding while a wiped follower still
 * receives the one stored (snap_policy.h, HOLD): the new one waits to
 * replace it until the follower caught up, so the transfer under way is
 * not started over with the new one (nor a second one sent for the log
 * the new one would have compacted), and the follower installs exactly
 * one snapshot, an older one than the one held.
 *
 * The moment is made, not waited for: the leader's snapshot child is
 * stopped while it encodes, the follower is wiped and started, and it is
 * stopped in turn once it stored a first chunk; only then the child goes
 * on. The leader heard from the follower last a few ms before, and holds
 * the snapshot if its child is done within the 3 s a follower counts as
 * heard from (IDA_SNAP_HEARD_MS); the follower then runs freely. (Its
 * first version slowed the follower down by SIGSTOP all along and wrote
 * until the leader's next snapshot fell due: on a loaded machine the
 * follower was done first, or went 3 s unheard, and the leader rightly did
 * not hold; two clean-clone CI runs failed so.) */
Test(catchup,
     a_snapshot_taken_during_a_transfer_waits_for_the_follower,
     .fini = teardown,
     .timeout = 300)
{
    int l = start_with_big_snapshot();
    int f = (l + 1) % 3;
    wipe(f);
    catch_snapshot_child(l);
    tc_spawn(&c, f);
    (void)wait_first_chunk(f);
    tc_signal(&c, f, SIGSTOP);
    assert_in_transfer(f);
    kill(caught_child, SIGCONT);
    caught_child = 0;
    const char *held = "waits to replace the one stored";
    for (uint64_t end = tc_now_ms() + 2000;
         tc_log_count(&c, l, held) == 0 && tc_now_ms() < end;) {
        tc_sleep_ms(5);
    }
    tc_signal(&c, f, SIGCONT);
    cr_assert_geq(tc_log_count(&c, l, held), 1,
                  "the leader's snapshot did not wait for node %d", f + 1);
    uint64_t h = log_max(l, held, at_index);
    wait_readmitted(f);
    cr_assert_eq(tc_log_count(&c, f, "installed snapshot at index"), 1,
                 "node %d was sent a second snapshot", f + 1);
    uint64_t got = log_max(f, "installed snapshot at index", at_index);
    cr_assert(got > 0 && got < h,
              "node %d installed the snapshot at %llu, the leader held %llu",
              f + 1, (unsigned long long)got, (unsigned long long)h);
    cr_assert_geq(tc_log_count(&c, l, "catching up (no follower catching up)"),
                  1, "the snapshot held did not go once node %d caught up",
                  f + 1);
    assert_same_state(l, 8u << 19);
}

/* --- big entries ---------------------------------------------------------- */

#define BIG_IN_FLIGHT 1000
#define BIG_ROUNDS    40

static atomic_int big_done, big_failed;

static void big_cb(struct idalloc_client *client,
                   struct idalloc_call *call,
                   const struct idalloc_result *res,
                   void *arg)
{
    (void)client;
    (void)call;
    (void)arg;
    if (res->error != 0) {
        atomic_fetch_add(&big_failed, 1);
    }
    atomic_fetch_add(&big_done, 1);
}

/* A follower that missed more than a peer frame's worth of entries catches
 * up by log replication alone. 1,000 allocations in flight with 120-byte
 * tags make entries of tens of KB (the leader batches what arrives while
 * a storage step is in flight); 40,000 of them, about 7 MB of log, are
 * written while a follower is down, and this cluster never snapshots. An
 * append is capped in bytes (src/node/raft_proc.c, APPEND_BYTES_MAX):
 * with only 256 entries to an append, one of them was larger than a peer
 * frame (4 MiB), net refused to send it, and the follower never caught
 * up without a snapshot. */
Test(catchup,
     a_follower_catches_up_on_big_entries,
     .fini = teardown,
     .timeout = 180)
{
    int l = start_with_pool("snapshot_interval_entries 1000000000\n");
    int f = (l + 1) % 3;
    tc_signal(&c, f, SIGKILL);
    for (int r = 0; r < BIG_ROUNDS; r++) {
        atomic_store(&big_done, 0);
        for (int i = 0; i < BIG_IN_FLIGHT; i++) {
            char tag[TAG_BYTES + 1];
            tc_long_tag(tag, TAG_BYTES, 1000 + r, i);
            cr_assert_eq(idalloc_alloc_async(cl, "b", tag, NULL, big_cb, NULL),
                         0, "submit %d of round %d", i, r);
        }
        for (uint64_t end = tc_now_ms() + 60000;
             atomic_load(&big_done) < BIG_IN_FLIGHT && tc_now_ms() < end;) {
            tc_sleep_ms(2);
        }
        cr_assert_eq(atomic_load(&big_done), BIG_IN_FLIGHT, "round %d", r);
    }
    cr_assert_eq(atomic_load(&big_failed), 0, "allocations failed");
    uint64_t commit = tc_commit_index(&c);
    tc_spawn(&c, f);
    cr_assert(tc_wait_applied(&c, commit, 30000),
              "node %d did not catch up by log replication", f + 1);
    cr_assert_eq(tc_log_count(&c, f, "received from the leader and checked"), 0,
                 "node %d was sent a snapshot", f + 1);
}

/* --- a pool grouped as it arrives ----------------------------------------- */

/* From 65,536 holdings on, a bounded pool's tags arrive grouped by table
 * region (fsm/snap_hold.h), and the restore after the last chunk only
 * inserts them. The test puts GROUP_HELD holdings in "b" (GROUP_TAKEN
 * allocated, then every GROUP_HOLE_EVERY-th freed), lets a wiped follower
 * take them by snapshot, makes it the leader and asks it for every tag,
 * then for GROUP_NEW new ones: with ids handed out lowest first, the new
 * tags must get exactly the lowest freed ids. An exported state is
 * decoded again from what the node stored, for a caught-up node the
 * leader's bytes: only questions put to the node itself test the table it
 * built as the snapshot arrived. */
#define GROUP_TAKEN      72000
#define GROUP_HOLE_EVERY 36
#define GROUP_HELD       (GROUP_TAKEN - GROUP_TAKEN / GROUP_HOLE_EVERY)
#define GROUP_NEW        1000
#define GROUP_IN_FLIGHT  1000
_Static_assert(GROUP_HELD > 65536, "the pool must be grouped as it arrives");
_Static_assert(GROUP_NEW < GROUP_TAKEN / GROUP_HOLE_EVERY,
               "the new tags must fit in the holes");

struct group_op
{
    int i;            /* tag number */
    uint64_t id;      /* the answer */
    int err;          /* its error */
    atomic_int *done; /* incremented when answered */
};

static void group_cb(struct idalloc_client *client,
                     struct idalloc_call *call,
                     const struct idalloc_result *res,
                     void *arg)
{
    (void)client;
    (void)call;
    struct group_op *op = arg;
    op->err = res->error;
    op->id = res->id;
    atomic_fetch_add(op->done, 1);
}

enum group_kind { GROUP_ALLOC, GROUP_FREE, GROUP_LOOKUP };

/* Tag of holding @i. */
static void group_tag(char *tag, size_t cap, int i)
{
    snprintf(tag, cap, "grouped-%07d", i);
}

/* @kind in @pool for ops[0..n), at most GROUP_IN_FLIGHT in flight; waits
 * for every answer. */
static void group_run(enum group_kind kind,
                      const char *pool,
                      struct group_op *ops,
                      int n)
{
    atomic_int done;
    for (int at = 0; at < n; at += GROUP_IN_FLIGHT) {
        int k = n - at < GROUP_IN_FLIGHT ? n - at : GROUP_IN_FLIGHT;
        atomic_store(&done, 0);
        for (int j = 0; j < k; j++) {
            struct group_op *op = &ops[at + j];
            char tag[32];
            group_tag(tag, sizeof(tag), op->i);
            op->done = &done;
            int rv =
                kind == GROUP_ALLOC
                    ? idalloc_alloc_async(cl, pool, tag, NULL, group_cb, op)
                : kind == GROUP_FREE
                    ? idalloc_free_async(cl, pool, op->id, tag, NULL, group_cb,
                                         op)
                    : idalloc_lookup_async(cl, pool, tag, NULL, group_cb, op);
            cr_assert_eq(rv, 0, "submit of tag %d", op->i);
        }
        for (uint64_t end = tc_now_ms() + 60000;
             atomic_load(&done) < k && tc_now_ms() < end;) {
            tc_sleep_ms(1);
        }
        cr_assert_eq(atomic_load(&done), k, "answers at %d", at);
    }
}

/* "fsm: snapshot at index N": N. */
static uint64_t index_after(const char *line, const char *hit)
{
    (void)line;
    return strtoull(hit + strlen("fsm: snapshot at index "), NULL, 10);
}

/* The highest index of a snapshot node @i took, 0 if none. */
static uint64_t snapshot_index(int i)
{
    return log_max(i, "fsm: snapshot at index ", index_after);
}

/* "(N holdings taken as decoded": N. */
static uint64_t holdings_before(const char *line, const char *hit)
{
    const char *p = hit;
    while (p > line && p[-1] != '(') {
        p--;
    }
    return strtoull(p, NULL, 10);
}

/* The holdings node @i said it decoded as its snapshot arrived (the most
 * of its lines). */
static uint64_t ahead_holdings(int i)
{
    return log_max(i, " holdings taken as decoded", holdings_before);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

Test(catchup,
     a_wiped_follower_leads_with_a_pool_grouped_as_it_arrived,
     .fini = teardown,
     .timeout = 300)
{
    int l = start_with_pool("snapshot_interval_entries 100\n");
    struct group_op *ops = calloc(GROUP_TAKEN, sizeof(*ops));
    struct group_op *holes =
        calloc(GROUP_TAKEN / GROUP_HOLE_EVERY, sizeof(*holes));
    cr_assert(ops != NULL && holes != NULL);
    for (int i = 0; i < GROUP_TAKEN; i++) {
        ops[i].i = i;
    }
    group_run(GROUP_ALLOC, "b", ops, GROUP_TAKEN);
    int n_holes = 0;
    for (int i = 0; i < GROUP_TAKEN; i++) {
        cr_assert_eq(ops[i].err, 0, "alloc of tag %d: %s", i,
                     idalloc_errname(ops[i].err));
        if (i % GROUP_HOLE_EVERY == 0) {
            holes[n_holes++] = ops[i];
        }
    }
    uint64_t hole_ids[GROUP_TAKEN / GROUP_HOLE_EVERY];
    for (int k = 0; k < n_holes; k++) {
        hole_ids[k] = holes[k].id; /* a free answers no id */
    }
    group_run(GROUP_FREE, "b", holes, n_holes);
    for (int k = 0; k < n_holes; k++) {
        cr_assert_eq(holes[k].err, 0, "free of tag %d", holes[k].i);
    }
    /* The leader snapshots once its log since the last snapshot is half
     * that one's size (src/node/snap_policy.h): write (in another pool,
     * so the holes stay the lowest free ids of "b") until a snapshot
     * covers the holdings. */
    cr_assert_eq(idalloc_pool_create(cl, "x", IDALLOC_POOL_BOUNDED, 1u << 20,
                                     NULL, tc_detail()),
                 0, "%s", tc_errmsg());
    uint64_t filled = tc_commit_index(&c);
    struct group_op more[GROUP_IN_FLIGHT];
    for (int round = 0; snapshot_index(l) < filled; round++) {
        cr_assert_lt(round, 40, "no snapshot of the leader covers the pool");
        for (uint64_t end = tc_now_ms() + 3000;
             snapshot_index(l) < filled && tc_now_ms() < end;) {
            tc_sleep_ms(100);
        }
        if (snapshot_index(l) >= filled) {
            break;
        }
        for (int j = 0; j < GROUP_IN_FLIGHT; j++) {
            more[j] = (struct group_op){.i = 10000000 + round * 10000 + j};
        }
        group_run(GROUP_ALLOC, "x", more, GROUP_IN_FLIGHT);
    }

    int f = (l + 1) % 3;
    wipe_and_start(f);
    wait_readmitted(f);
    cr_assert_geq(tc_log_count(&c, f, "received from the leader and checked"),
                  1, "node %d installed no snapshot from the leader", f + 1);
    cr_assert_geq(tc_log_count(&c, f, "the state checked when it arrived"), 1,
                  "node %d decoded the snapshot a second time", f + 1);
    cr_assert_gt(ahead_holdings(f), 65536,
                 "node %d decoded %llu holdings as they arrived", f + 1,
                 (unsigned long long)ahead_holdings(f));

    /* The caught-up node leads, and answers from the table it built. */
    unsigned got = 0;
    int rv = -1;
    for (uint64_t end = tc_now_ms() + 30000; tc_now_ms() < end && rv != 0;) {
        rv = idalloc_leader_transfer(cl, (unsigned)f + 1, &got, tc_detail());
        if (rv != 0) {
            tc_sleep_ms(500);
        }
    }
    cr_assert_eq(rv, 0, "transfer to node %d: %s", f + 1, tc_errmsg());
    int moved = got == (unsigned)f + 1;
    for (uint64_t end = tc_now_ms() + 20000; tc_now_ms() < end && !moved;) {
        moved = tc_wait_leader(&c, 2000) == f;
    }
    cr_assert(moved, "leadership did not move to node %d", f + 1);

    struct group_op *asked = calloc(GROUP_TAKEN, sizeof(*asked));
    cr_assert(asked != NULL);
    for (int i = 0; i < GROUP_TAKEN; i++) {
        asked[i].i = i;
    }
    group_run(GROUP_LOOKUP, "b", asked, GROUP_TAKEN);
    for (int i = 0; i < GROUP_TAKEN; i++) {
        if (i % GROUP_HOLE_EVERY == 0) {
            cr_assert_eq(
                asked[i].err, IDA_ENOTFOUND, "freed tag %d: %s, id %llu", i,
                idalloc_errname(asked[i].err), (unsigned long long)asked[i].id);
        } else {
            cr_assert_eq(asked[i].err, 0, "tag %d: %s", i,
                         idalloc_errname(asked[i].err));
            cr_assert_eq(asked[i].id, ops[i].id,
                         "tag %d holds %llu on node %d, %llu before", i,
                         (unsigned long long)asked[i].id, f + 1,
                         (unsigned long long)ops[i].id);
        }
    }

    /* New tags take the lowest free ids: the lowest holes. */
    qsort(hole_ids, (size_t)n_holes, sizeof(hole_ids[0]), cmp_u64);
    struct group_op fresh[GROUP_NEW];
    for (int j = 0; j < GROUP_NEW; j++) {
        fresh[j] = (struct group_op){.i = 20000000 + j};
    }
    group_run(GROUP_ALLOC, "b", fresh, GROUP_NEW);
    uint64_t fresh_ids[GROUP_NEW];
    for (int j = 0; j < GROUP_NEW; j++) {
        cr_assert_eq(fresh[j].err, 0, "new tag %d: %s", j,
                     idalloc_errname(fresh[j].err));
        fresh_ids[j] = fresh[j].id;
    }
    qsort(fresh_ids, GROUP_NEW, sizeof(fresh_ids[0]), cmp_u64);
    for (int j = 0; j < GROUP_NEW; j++) {
        cr_assert_eq(fresh_ids[j], hole_ids[j],
                     "the %d-th new id is %llu, the %d-th lowest hole %llu", j,
                     (unsigned long long)fresh_ids[j], j,
                     (unsigned long long)hole_ids[j]);
    }
    free(asked);
    free(holes);
    free(ops);
    assert_same_state(f, 65536 * 8);
}
