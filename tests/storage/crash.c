/* Crash rounds: see crash.h. */
#include "tests/storage/crash.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#define CLUSTER         "crash"
#define DATA_MAX        200 /* entry data 0..200 bytes, ~100 on average */
#define BATCH_MAX       16
#define ROUND_BATCH_MAX 400 /* a child that is never killed stops here */
#define KILL_REPORTS    24  /* kill after 0..KILL_REPORTS-1 reports */
#define KILL_DELAY_US   3000

#define SNAPSHOT_MAX   (200 * 1024) /* snapshot state 0..200 KiB */
#define SNAPSHOT_PIECE 10000        /* written in pieces of this size */
/* As the node does (storage_proc.c, tidy_step()): the snapshot is finished
 * without deleting the one it replaces, whose chunks then go at most
 * TIDY_CHUNKS chunks' bytes at a time, and the log it covers COMPACT_STEP
 * entries at a time; a crash may stop it after any of those commits. */
#define TIDY_CHUNKS  32
#define COMPACT_STEP 5

/* The log, hard state and snapshot as they must be. terms[i] is the term of
 * entry i (kept below prev_index too, for the model's own use). */
struct model
{
    ida_term *terms;
    size_t cap;
    ida_index last;
    ida_index prev_index; /* compacted up to here */
    ida_term prev_term;
    struct ida_hard_state hs;
    ida_index snap_index; /* 0: no snapshot */
    ida_term snap_term;
    size_t snap_size;
};

/* One step: a batch, or (snapshot set) a snapshot of the committed state
 * followed by a compaction. */
struct plan
{
    ida_index truncate_from; /* 0: none */
    ida_index first;
    size_t count;
    ida_term term;
    struct ida_hard_state hs;
    int snapshot;
    ida_index snap_index;
    ida_term snap_term;
    size_t snap_size;
    ida_index compact_to;
};

static int model_reserve(struct model *m, ida_index last)
{
    if (last + 1 <= m->cap) {
        return 0;
    }
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < last + 1) {
        cap *= 2;
    }
    ida_term *t = ida_realloc(m->terms, cap * sizeof(*t));
    if (t == NULL) {
        return -1;
    }
    m->terms = t;
    m->cap = cap;
    return 0;
}

static int model_copy(struct model *dst, const struct model *src)
{
    *dst = *src;
    dst->terms = ida_malloc(src->cap * sizeof(ida_term) + 1);
    if (dst->terms == NULL) {
        return -1;
    }
    memcpy(dst->terms, src->terms, src->cap * sizeof(ida_term));
    return 0;
}

/* Draw the next step from @rng for model @m (deterministic). */
static void plan_next(uint64_t *rng, const struct model *m, struct plan *p)
{
    memset(p, 0, sizeof(*p));
    if (m->hs.commit > m->snap_index && ida_test_rand(rng) % 12 == 0) {
        p->snapshot = 1;
        p->snap_index = m->hs.commit;
        p->snap_term = m->terms[m->hs.commit];
        p->snap_size = (size_t)(ida_test_rand(rng) % SNAPSHOT_MAX);
        /* Keep a few entries behind the snapshot, as a leader would. */
        ida_index keep = ida_test_rand(rng) % 8;
        p->compact_to = p->snap_index > m->prev_index + keep
                            ? p->snap_index - keep
                            : m->prev_index;
        return;
    }
    p->hs = m->hs;
    if (p->hs.term == 0 || ida_test_rand(rng) % 10 == 0) {
        p->hs.term++;
        p->hs.vote = (ida_node_id)(1 + ida_test_rand(rng) % 3);
    }
    ida_index last = m->last;
    if (last > m->hs.commit && ida_test_rand(rng) % 8 == 0) {
        /* A conflicting suffix above the commit index. */
        p->truncate_from =
            m->hs.commit + 1 + ida_test_rand(rng) % (last - m->hs.commit);
        last = p->truncate_from - 1;
        if (p->hs.term == m->hs.term) {
            p->hs.term++; /* a new leader overwrote it: a newer term */
            p->hs.vote = (ida_node_id)(1 + ida_test_rand(rng) % 3);
        }
    }
    p->first = last + 1;
    p->count = 1 + ida_test_rand(rng) % BATCH_MAX;
    p->term = p->hs.term;
    ida_index new_last = last + p->count;
    p->hs.commit =
        m->hs.commit + ida_test_rand(rng) % (new_last - m->hs.commit + 1);
}

/* The log compacted in steps after a snapshot: where the step after
 * @upto ends (COMPACT_STEP entries on, at most @to). */
static ida_index compact_next(ida_index upto, ida_index to)
{
    return to - upto > COMPACT_STEP ? upto + COMPACT_STEP : to;
}

/* Apply step @p to @m. A snapshot step has durable stages: 1 the snapshot
 * is finished, 2 the log is compacted too, and between them the log
 * compacted up to @upto (stage 3; one of compact_next()'s). A batch has
 * stage 2 (all of it), and stage 0 when it changes the term or vote: those
 * are durable (in LMDB) before its entries and commit (in the log). */
static int model_apply_stage(struct model *m,
                             const struct plan *p,
                             int stage,
                             ida_index upto)
{
    if (p->snapshot) {
        m->snap_index = p->snap_index;
        m->snap_term = p->snap_term;
        m->snap_size = p->snap_size;
        upto = stage == 2 ? p->compact_to : stage == 3 ? upto : 0;
        if (upto > m->prev_index) {
            m->prev_index = upto;
            m->prev_term = m->terms[upto];
        }
        return 0;
    }
    if (stage == 0) {
        m->hs.term = p->hs.term;
        m->hs.vote = p->hs.vote;
        return 0;
    }
    ida_index new_last = p->first + p->count - 1;
    if (model_reserve(m, new_last) != 0) {
        return -1;
    }
    for (ida_index i = p->first; i <= new_last; i++) {
        m->terms[i] = p->term;
    }
    m->last = new_last;
    m->hs = p->hs;
    return 0;
}

static int model_apply(struct model *m, const struct plan *p)
{
    return model_apply_stage(m, p, 2, 0);
}

static void snapshot_fill(uint8_t *buf, size_t len, const struct plan *p)
{
    ida_test_fill(buf, len, p->snap_index, p->snap_term + 1000);
}

/* Child side of a snapshot step (@prev: compacted up to here before).
 * 0 or an IDA code. */
static int child_snapshot(struct ida_storage *s,
                          const struct plan *p,
                          ida_index prev)
{
    static const uint8_t config[] = {1, 2, 3};
    uint8_t *state = ida_malloc(p->snap_size + 1);
    if (state == NULL) {
        return IDA_ENOMEM;
    }
    snapshot_fill(state, p->snap_size, p);
    struct ida_snapshot_writer w;
    int rv = ida_storage_snapshot_begin(s, &w, p->snap_index, p->snap_term,
                                        config, sizeof(config));
    for (size_t off = 0; rv == 0 && off < p->snap_size; off += SNAPSHOT_PIECE) {
        size_t n = p->snap_size - off < SNAPSHOT_PIECE ? p->snap_size - off
                                                       : SNAPSHOT_PIECE;
        if ((off / SNAPSHOT_PIECE) % 2 == 0) {
            rv = ida_storage_snapshot_write(s, &w, state + off, n);
        } else {
            /* As a node stores its own: the bytes ride in a batch
             * (storage_proc.c, ENCODED), here one that adds nothing. */
            struct ida_storage_batch b;
            ida_storage_batch_init(s, &b);
            rv = ida_storage_batch_snapshot(s, &b, &w, state + off, n);
            if (rv == 0) {
                rv = ida_storage_batch_commit(s, &b);
            }
        }
        if (rv != 0) {
            ida_storage_snapshot_abort(s, &w);
        }
    }
    if (rv == 0) {
        rv = ida_storage_snapshot_finish_lazy(s, &w);
    }
    for (int more = 1; rv == 0 && more;) {
        rv = ida_storage_snapshot_tidy(s, TIDY_CHUNKS * IDA_STORAGE_CHUNK_BYTES,
                                       &more);
    }
    for (ida_index upto = prev; rv == 0 && upto < p->compact_to;) {
        upto = compact_next(upto, p->compact_to);
        rv = ida_storage_compact(s, upto);
    }
    ida_free(state);
    return rv;
}

/* Child: run batches, report each after its commit returned. Never returns. */
static _Noreturn void child_run(const char *dir,
                                uint64_t rng,
                                struct model *m,
                                int fd)
{
    struct ida_storage s;
    struct ida_storage_opts o = {.cluster = CLUSTER, .node_id = 1};
    if (ida_storage_open(&s, dir, &o) != 0) {
        fprintf(stderr, "crash child: %s\n", s.errmsg);
        _exit(3);
    }
    struct ida_entry entries[BATCH_MAX];
    for (int b = 0; b < ROUND_BATCH_MAX; b++) {
        struct plan p;
        plan_next(&rng, m, &p);
        if (p.snapshot) {
            if (child_snapshot(&s, &p, m->prev_index) != 0 ||
                model_apply(m, &p) != 0) {
                fprintf(stderr, "crash child: snapshot %d: %s\n", b, s.errmsg);
                _exit(4);
            }
            char c = 's';
            if (write(fd, &c, 1) != 1) {
                _exit(5);
            }
            continue;
        }
        uint8_t *block =
            ida_test_make_entries(entries, p.count, p.first, p.term, DATA_MAX);
        struct ida_storage_batch batch;
        ida_storage_batch_init(&s, &batch);
        int rv = 0;
        if (p.truncate_from != 0) {
            rv = ida_storage_batch_truncate(&s, &batch, p.truncate_from);
        }
        if (rv == 0) {
            rv = ida_storage_batch_set_hard_state(&s, &batch, &p.hs);
        }
        if (rv == 0) {
            rv = ida_storage_batch_append(&s, &batch, entries, p.count);
        }
        if (rv == 0) {
            rv = ida_storage_batch_commit(&s, &batch);
        }
        ida_free(block);
        if (rv != 0 || block == NULL || model_apply(m, &p) != 0) {
            fprintf(stderr, "crash child: batch %d: %s\n", b, s.errmsg);
            _exit(4);
        }
        char c = 'c';
        if (write(fd, &c, 1) != 1) {
            _exit(5);
        }
    }
    ida_storage_close(&s);
    _exit(0);
}

/* Does the storage hold model @m's snapshot, bytes included? 1 yes, 0 no,
 * -1 error (@err). */
static int snapshot_matches(struct ida_storage *s,
                            const struct model *m,
                            char *err,
                            size_t errcap)
{
    struct ida_snapshot_meta meta;
    uint8_t *data;
    int rv = ida_storage_snapshot_load(s, &meta, &data);
    if (m->snap_index == 0) {
        if (rv == 0) {
            ida_free(data);
            ida_snapshot_meta_release(&meta);
        }
        return rv == IDA_ENOTFOUND ? 1 : 0;
    }
    if (rv == IDA_ENOTFOUND) {
        return 0;
    }
    if (rv != 0) {
        snprintf(err, errcap, "loading the snapshot: %s", idalloc_strerror(rv));
        return -1;
    }
    int ok = meta.index == m->snap_index && meta.term == m->snap_term &&
             meta.data_size == m->snap_size && meta.config_len == 3;
    if (ok) {
        struct plan p = {.snap_index = m->snap_index,
                         .snap_term = m->snap_term};
        uint8_t *want = ida_malloc(m->snap_size + 1);
        snapshot_fill(want, m->snap_size, &p);
        ok = want != NULL &&
             (m->snap_size == 0 || memcmp(want, data, m->snap_size) == 0);
        ida_free(want);
    }
    ida_free(data);
    ida_snapshot_meta_release(&meta);
    return ok;
}

/* Does the storage hold exactly model @m (bounds, hard state, and entries
 * from @from on)? 1 yes, 0 no, -1 error (@err). */
static int matches(struct ida_storage *s,
                   const struct model *m,
                   ida_index from,
                   unsigned long *checked,
                   char *err,
                   size_t errcap)
{
    struct ida_storage_log_state ls;
    struct ida_hard_state hs;
    if (ida_storage_log_state(s, &ls) != 0 ||
        ida_storage_hard_state(s, &hs) != 0) {
        snprintf(err, errcap, "cannot read log state or hard state");
        return -1;
    }
    if (ls.last != m->last || ls.prev_index != m->prev_index ||
        ls.prev_term != m->prev_term || ls.first != m->prev_index + 1 ||
        hs.term != m->hs.term || hs.vote != m->hs.vote ||
        hs.commit != m->hs.commit) {
        return 0;
    }
    int same = snapshot_matches(s, m, err, errcap);
    if (same != 1) {
        return same;
    }
    if (from <= m->prev_index) {
        from = m->prev_index + 1;
    }
    for (ida_index lo = from; lo <= m->last;) {
        struct ida_entry *es;
        size_t n;
        int rv = ida_storage_entries(s, lo, m->last + 1, 1 << 20, &es, &n);
        if (rv != 0) {
            snprintf(err, errcap, "reading entries from %llu: %s",
                     (unsigned long long)lo, idalloc_strerror(rv));
            return -1;
        }
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++) {
            ok = es[i].index == lo + i && es[i].term == m->terms[lo + i] &&
                 ida_test_entry_ok(&es[i], DATA_MAX);
        }
        ida_free(es);
        if (!ok) {
            return 0;
        }
        *checked += n;
        lo += n;
    }
    return 1;
}

/* Read one report byte per batch until EOF; returns the count so far. */
static unsigned long drain(int fd, unsigned long have)
{
    char buf[256];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
        if (n > 0) {
            have += (unsigned long)n;
        }
    }
    return have;
}

/* One round. Entries up to the commit index the round starts with can no
 * longer change (truncation stays above it); they are checked again only
 * when @full is set, so long runs do not grow quadratically. 0 ok, -1
 * failure (@err). */
static int round_run(const char *dir,
                     uint64_t seed,
                     int full,
                     struct model *m,
                     struct ida_crash_stats *st,
                     char *err,
                     size_t errcap)
{
    uint64_t rng = seed;
    ida_index from = full || m->hs.commit == 0 ? 1 : m->hs.commit;
    uint64_t kill_rng = seed ^ 0xC0FFEEull;
    unsigned long kill_after = ida_test_rand(&kill_rng) % KILL_REPORTS;
    long delay_us = (long)(ida_test_rand(&kill_rng) % KILL_DELAY_US);
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(err, errcap, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errcap, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        child_run(dir, rng, m, fds[1]);
    }
    close(fds[1]);
    unsigned long reported = 0;
    char report;
    while (reported < kill_after && read(fds[0], &report, 1) == 1) {
        reported++;
    }
    struct timespec ts = {0, delay_us * 1000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    reported = drain(fds[0], reported); /* reports written before death */
    close(fds[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        snprintf(err, errcap, "child failed with exit status %d",
                 WEXITSTATUS(status));
        return -1;
    }
    if (WIFEXITED(status)) {
        st->child_finished++;
    }
    if (reported == 0) {
        st->killed_before_first_report++;
    }
    struct plan p;
    for (unsigned long b = 0; b < reported; b++) {
        plan_next(&rng, m, &p);
        st->snapshots_reported += (unsigned long)p.snapshot;
        if (model_apply(m, &p) != 0) {
            snprintf(err, errcap, "out of memory");
            return -1;
        }
    }
    st->batches_reported += reported;
    /* The step in flight may have reached the disk: as a whole for a batch
     * (or its term and vote alone, stage 0),
     * or in either of its two durable stages for a snapshot step. */
    plan_next(&rng, m, &p);
    /* Candidates: the batch; or the snapshot finished (1), the log then
     * compacted up to each step's end (3), or all of it (2). */
    ida_index steps = 0;
    for (ida_index u = m->prev_index; p.snapshot && u < p.compact_to;) {
        u = compact_next(u, p.compact_to);
        steps += u < p.compact_to;
    }
    int votes =
        !p.snapshot && (p.hs.term != m->hs.term || p.hs.vote != m->hs.vote);
    int ncand = p.snapshot ? 2 + (int)steps : 1 + votes;
    struct model *cand = ida_calloc((size_t)ncand, sizeof(*cand));
    if (cand == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    ida_index upto = m->prev_index;
    for (int c = 0; c < ncand; c++) {
        int stage = !p.snapshot      ? (c == 0 ? 2 : 0)
                    : c == 0         ? 1
                    : c == ncand - 1 ? 2
                                     : 3;
        if (stage == 3) {
            upto = compact_next(upto, p.compact_to);
        }
        if (model_copy(&cand[c], m) != 0 ||
            model_apply_stage(&cand[c], &p, stage, upto) != 0) {
            snprintf(err, errcap, "out of memory");
            return -1; /* a test process: leaks on OOM do not matter */
        }
    }
    int rv = 0;
    struct ida_storage s;
    struct ida_storage_opts o = {.cluster = CLUSTER, .node_id = 1};
    if (ida_storage_open(&s, dir, &o) != 0) {
        snprintf(err, errcap, "reopen: %s", s.errmsg);
        rv = -1;
    } else {
        int found = -2;
        struct ida_storage_log_state held;
        struct ida_hard_state held_hs;
        (void)ida_storage_log_state(&s, &held);
        (void)ida_storage_hard_state(&s, &held_hs);
        int a = matches(&s, m, from, &st->entries_checked, err, errcap);
        if (a == 1) {
            found = -1;
        }
        for (int c = 0; a == 0 && reported < ROUND_BATCH_MAX && c < ncand;
             c++) {
            int b =
                matches(&s, &cand[c], from, &st->entries_checked, err, errcap);
            if (b != 0) {
                found = b == 1 ? c : -3;
                break;
            }
        }
        ida_storage_close(&s);
        if (a < 0 || found == -3) {
            rv = -1;
        } else if (found == -2) {
            snprintf(err, errcap,
                     "after %lu reported steps the storage is neither the "
                     "state after them nor after the one in flight "
                     "(model last %llu term %llu commit %llu prev %llu "
                     "snapshot %llu; storage last %llu term %llu commit "
                     "%llu prev %llu)",
                     reported, (unsigned long long)m->last,
                     (unsigned long long)m->hs.term,
                     (unsigned long long)m->hs.commit,
                     (unsigned long long)m->prev_index,
                     (unsigned long long)m->snap_index,
                     (unsigned long long)held.last,
                     (unsigned long long)held_hs.term,
                     (unsigned long long)held_hs.commit,
                     (unsigned long long)held.prev_index);
            rv = -1;
        } else if (found >= 0) {
            st->in_flight_found++;
            ida_term *t = m->terms;
            *m = cand[found]; /* the next round continues from the disk */
            cand[found].terms = t;
        }
    }
    for (int c = 0; c < ncand; c++) {
        ida_free(cand[c].terms);
    }
    ida_free(cand);
    return rv;
}

int ida_crash_run(const char *dir,
                  unsigned rounds,
                  uint64_t seed,
                  struct ida_crash_stats *stats,
                  char *err,
                  size_t errcap)
{
    memset(stats, 0, sizeof(*stats));
    struct model m = {0};
    if (model_reserve(&m, 1024) != 0) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    int rv = 0;
    uint64_t rs = seed;
    for (unsigned r = 0; r < rounds && rv == 0; r++) {
        int full = r % 20 == 0 || r + 1 == rounds;
        rv = round_run(dir, ida_test_rand(&rs), full, &m, stats, err, errcap);
        stats->rounds++;
        if (rv != 0) {
            size_t n = strlen(err);
            snprintf(err + n, errcap - n, " (round %u of seed %llu)", r,
                     (unsigned long long)seed);
        }
    }
    ida_free(m.terms);
    return rv;
}
