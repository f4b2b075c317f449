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

#include "ida/heap.h"
#include "idalloc_errors.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#define CLUSTER         "crash"
#define DATA_MAX        200 /* entry data 0..200 bytes, ~100 on average */
#define BATCH_MAX       16
#define ROUND_BATCH_MAX 400 /* a child that is never killed stops here */
#define KILL_REPORTS    24  /* kill after 0..KILL_REPORTS-1 reports */
#define KILL_DELAY_US   3000

/* The log and hard state as they must be. terms[i] is the term of entry i. */
struct model
{
    ida_term *terms;
    size_t cap;
    ida_index last;
    struct ida_hard_state hs;
};

struct plan
{
    ida_index truncate_from; /* 0: none */
    ida_index first;
    size_t count;
    ida_term term;
    struct ida_hard_state hs;
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

/* Draw the next batch from @rng for model @m (deterministic). */
static void plan_next(uint64_t *rng, const struct model *m, struct plan *p)
{
    memset(p, 0, sizeof(*p));
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

static int model_apply(struct model *m, const struct plan *p)
{
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

/* Does the storage hold exactly model @m (bounds, hard state, and entries
 * from @from on)? 1 yes, 0 no, -1 error (@err). */
static int matches(struct ida_storage *s,
                   const struct model *m,
                   ida_index from,
                   unsigned long *checked,
                   char *err,
                   size_t errcap)
{
    struct ida_log_state ls;
    struct ida_hard_state hs;
    if (ida_storage_log_state(s, &ls) != 0 ||
        ida_storage_hard_state(s, &hs) != 0) {
        snprintf(err, errcap, "cannot read log state or hard state");
        return -1;
    }
    if (ls.last != m->last || ls.first != 1 || hs.term != m->hs.term ||
        hs.vote != m->hs.vote || hs.commit != m->hs.commit) {
        return 0;
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
    /* Mirror the child: the model after each report, plus one ahead. */
    unsigned long reported = 0;
    char c;
    while (reported < kill_after && read(fds[0], &c, 1) == 1) {
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
        if (model_apply(m, &p) != 0) {
            snprintf(err, errcap, "out of memory");
            return -1;
        }
    }
    st->batches_reported += reported;
    struct model next;
    if (model_copy(&next, m) != 0) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    plan_next(&rng, m, &p);
    int rv = model_apply(&next, &p);
    struct ida_storage s;
    struct ida_storage_opts o = {.cluster = CLUSTER, .node_id = 1};
    if (rv == 0 && ida_storage_open(&s, dir, &o) != 0) {
        snprintf(err, errcap, "reopen: %s", s.errmsg);
        rv = -1;
    } else if (rv == 0) {
        int a = matches(&s, m, from, &st->entries_checked, err, errcap);
        int b =
            a == 0 && reported < ROUND_BATCH_MAX
                ? matches(&s, &next, from, &st->entries_checked, err, errcap)
                : 0;
        ida_storage_close(&s);
        if (a < 0 || b < 0) {
            rv = -1;
        } else if (a == 0 && b == 0) {
            snprintf(err, errcap,
                     "after %lu reported batches the storage is neither the "
                     "state after them nor after the one in flight "
                     "(model last %llu term %llu commit %llu)",
                     reported, (unsigned long long)m->last,
                     (unsigned long long)m->hs.term,
                     (unsigned long long)m->hs.commit);
            rv = -1;
        } else if (b == 1) {
            st->in_flight_found++;
            ida_term *t = m->terms;
            *m = next; /* the next round continues from what is on disk */
            next.terms = t;
        }
    }
    ida_free(next.terms);
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
