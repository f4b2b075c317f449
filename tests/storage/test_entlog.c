/* storage/entlog.h: the Raft log's entries over a segment log, against
 * real files: batches, truncations and compactions (the snapshot kept, or
 * the log discarded for one: Raft's Figure 13) come back the same after a
 * reopen, against a model, over many random steps; bad appends change
 * nothing; records from the disk that do not make a log are refused. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/entlog.h"
#include "storage/seglog.h"
#include "tests/storage/helpers.h"

#define SEG     (64u * 1024u)
#define MAXDATA 400
#define MAXIDX  20000

static char tmp[256];
static char dir[300];

static void setup(void)
{
    cr_assert_eq(ida_test_tmpdir(tmp, sizeof(tmp), "entlog"), 0);
    snprintf(dir, sizeof(dir), "%s/log", tmp);
}

static void teardown(void)
{
    ida_test_rmrf(tmp);
}

TestSuite(entlog, .init = setup, .fini = teardown);

static struct ida_seglog_options opts(void)
{
    struct ida_seglog_options o = {.segment_bytes = SEG};
    memset(o.ident, 'e', sizeof(o.ident));
    return o;
}

static struct ida_entlog *open_at(ida_index prev, ida_term term)
{
    struct ida_seglog_options o = opts();
    struct ida_entlog *l = NULL;
    char err[512] = "";
    int rv =
        ida_entlog_open(dir, &o, prev, term, prev, term, &l, err, sizeof(err));
    cr_assert_eq(rv, 0, "open after (%llu, %llu): %s (%s)",
                 (unsigned long long)prev, (unsigned long long)term,
                 idalloc_strerror(rv), err);
    return l;
}

/* Open after (@prev, @term) with the durable snapshot at (@si, @st); keep
 * the log in *@out (NULL: close it). */
static int open_snap(ida_index prev,
                     ida_term term,
                     ida_index si,
                     ida_term st,
                     struct ida_entlog **out,
                     char *err,
                     size_t errlen)
{
    struct ida_seglog_options o = opts();
    struct ida_entlog *l = NULL;
    err[0] = '\0';
    int rv = ida_entlog_open(dir, &o, prev, term, si, st, &l, err, errlen);
    if (out != NULL) {
        *out = l;
    } else {
        ida_entlog_close(l);
    }
    return rv;
}

static int open_rv(ida_index prev, ida_term term, char *err, size_t errlen)
{
    return open_snap(prev, term, prev, term, NULL, err, errlen);
}

/* Append entries [@from, @to] of term @term (after truncating at @trunc,
 * 0: none), recording @commit. */
static int append(struct ida_entlog *l,
                  ida_index trunc,
                  ida_index commit,
                  ida_index from,
                  ida_index to,
                  ida_term term)
{
    size_t n = to >= from ? (size_t)(to - from + 1) : 0;
    struct ida_entry es[64];
    cr_assert_leq(n, 64);
    uint8_t *data =
        n > 0 ? ida_test_make_entries(es, n, from, term, MAXDATA) : NULL;
    int rv = ida_entlog_append(l, trunc, commit, es, n);
    ida_free(data);
    return rv;
}

/* Entry @i read back is entry (i, @term) with its content. */
static void check_entries(struct ida_entlog *l,
                          ida_index lo,
                          ida_index hi,
                          const ida_term *terms)
{
    ida_index i = lo;
    while (i < hi) {
        struct ida_entry *es;
        size_t n;
        int rv = ida_entlog_entries(l, i, hi, 4096, &es, &n);
        cr_assert_eq(rv, 0, "entries [%llu, %llu): %s", (unsigned long long)i,
                     (unsigned long long)hi, idalloc_strerror(rv));
        cr_assert_geq(n, 1);
        for (size_t k = 0; k < n; k++) {
            cr_assert_eq(es[k].index, i + k);
            cr_assert_eq(es[k].term, terms[i + k], "entry %llu",
                         (unsigned long long)(i + k));
            cr_assert(ida_test_entry_ok(&es[k], MAXDATA), "entry %llu's data",
                      (unsigned long long)(i + k));
        }
        i += n;
        ida_free(es);
    }
}

Test(entlog, batches_and_a_truncation_come_back_after_a_reopen)
{
    struct ida_entlog *l = open_at(0, 0);
    cr_assert_eq(append(l, 0, 0, 1, 10, 1), 0);
    cr_assert_eq(append(l, 0, 5, 11, 20, 1), 0);
    cr_assert_eq(ida_entlog_sync(l), 0);
    /* A conflicting suffix from 15, above the commit. */
    cr_assert_eq(append(l, 15, 5, 15, 17, 2), 0);
    cr_assert_eq(ida_entlog_sync(l), 0);
    ida_entlog_close(l);
    l = open_at(0, 0);
    ida_index prev, last;
    ida_term pt;
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert_eq(prev, 0);
    cr_assert_eq(last, 17);
    cr_assert_eq(ida_entlog_commit(l), 5);
    ida_term terms[18];
    for (int i = 1; i <= 17; i++) {
        terms[i] = i < 15 ? 1 : 2;
        ida_term t;
        cr_assert_eq(ida_entlog_term_at(l, (ida_index)i, &t), 0);
        cr_assert_eq(t, terms[i]);
    }
    ida_term t;
    cr_assert_eq(ida_entlog_term_at(l, 18, &t), IDA_ENOTFOUND);
    check_entries(l, 1, 18, terms);
    ida_entlog_close(l);
}

Test(entlog, bad_appends_change_nothing)
{
    struct ida_entlog *l = open_at(0, 0);
    cr_assert_eq(append(l, 0, 3, 1, 5, 2), 0);
    cr_assert_eq(append(l, 0, 3, 7, 8, 2), IDA_EINVAL, "a gap");
    cr_assert_eq(append(l, 0, 3, 6, 6, 1), IDA_EINVAL, "a term going down");
    cr_assert_eq(append(l, 0, 3, 6, 6, 0), IDA_EINVAL, "term 0");
    cr_assert_eq(append(l, 0, 2, 6, 6, 2), IDA_EINVAL, "commit going down");
    cr_assert_eq(append(l, 0, 7, 6, 6, 2), IDA_EINVAL, "commit past the end");
    cr_assert_eq(append(l, 3, 3, 3, 3, 2), IDA_EINVAL, "truncating commits");
    cr_assert_eq(append(l, 7, 3, 7, 7, 2), IDA_EINVAL, "truncating past");
    struct ida_entry e = {.term = 2, .index = 6, .type = 9};
    cr_assert_eq(ida_entlog_append(l, 0, 3, &e, 1), IDA_EINVAL, "type 9");
    ida_index prev, last;
    ida_term pt;
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert_eq(last, 5);
    cr_assert_eq(ida_entlog_commit(l), 3);
    cr_assert_eq(append(l, 0, 6, 6, 6, 2), 0, "the log takes the next one");
    cr_assert_eq(ida_entlog_sync(l), 0);
    ida_entlog_close(l);
    l = open_at(0, 0);
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert_eq(last, 6);
    ida_entlog_close(l);
}

/* Compaction behind a snapshot that matches the log keeps what follows;
 * one that does not (a leader's snapshot installed) discards the log, and
 * the entries appended after it are all a restart sees. */
Test(entlog, compaction_keeps_what_follows_and_a_snapshot_installed_resets)
{
    struct ida_entlog *l = open_at(0, 0);
    ida_term terms[400] = {0};
    for (ida_index i = 1; i <= 300; i += 10) {
        cr_assert_eq(append(l, 0, i - 1, i, i + 9, 1), 0);
    }
    for (int i = 1; i <= 300; i++) {
        terms[i] = 1;
    }
    cr_assert_eq(ida_entlog_sync(l), 0);
    cr_assert_eq(ida_entlog_compact(l, 250, 1), 0);
    ida_entlog_close(l);
    char err[512];
    cr_assert_eq(open_rv(250, 2, err, sizeof(err)), IDA_ECORRUPT,
                 "entry 250 is of term 1 and entries follow");
    cr_assert(strstr(err, "entry 250 of term 1") != NULL, "%s", err);
    l = open_at(250, 1);
    ida_index prev, last;
    ida_term pt;
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert_eq(prev, 250);
    cr_assert_eq(last, 300);
    struct ida_entry *es;
    size_t n;
    cr_assert_eq(ida_entlog_entries(l, 250, 260, 0, &es, &n), IDA_ENOTFOUND);
    check_entries(l, 251, 301, terms);
    /* A leader's snapshot at 350, term 3: the log (up to 300) goes. */
    cr_assert_eq(ida_entlog_compact(l, 350, 3), 0);
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert(prev == 350 && pt == 3 && last == 350);
    cr_assert_eq(append(l, 0, 350, 351, 360, 3), 0);
    for (int i = 351; i <= 360; i++) {
        terms[i] = 3;
    }
    cr_assert_eq(ida_entlog_sync(l), 0);
    ida_entlog_close(l);
    cr_assert_eq(open_rv(300, 1, err, sizeof(err)), IDA_ECORRUPT,
                 "the snapshot at 350 was lost");
    cr_assert(strstr(err, "reset to a snapshot at 350") != NULL, "%s", err);
    /* The reset is durable but the caller kept the old prev (it records
     * the new one after the reset): with the snapshot at 350 it holds,
     * the log begins there; with another term at 350, refused. */
    cr_assert_eq(open_snap(300, 1, 350, 2, NULL, err, sizeof(err)),
                 IDA_ECORRUPT, "not the snapshot that was installed");
    cr_assert(strstr(err, "(term 3)") != NULL, "%s", err);
    cr_assert_eq(open_snap(300, 1, 350, 3, &l, err, sizeof(err)), 0, "%s", err);
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert(prev == 350 && pt == 3 && last == 360, "%llu %llu %llu",
              (unsigned long long)prev, (unsigned long long)pt,
              (unsigned long long)last);
    check_entries(l, 351, 361, terms);
    ida_entlog_close(l);
    l = open_at(350, 3);
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert_eq(last, 360);
    check_entries(l, 351, 361, terms);
    ida_entlog_close(l);
}

/* Records that check by their CRC but make no log: refused, changing
 * nothing. */
Test(entlog, records_that_make_no_log_are_refused)
{
    struct
    {
        const char *why;
        const char *says; /* NULL: "log record 1" */
        uint8_t rec[80];
        size_t len;
    } bad[6];
    memset(bad, 0, sizeof(bad));
    for (int i = 0; i < 6; i++) {
        uint8_t *r = bad[i].rec;
        r[0] = 1;  /* version */
        r[24] = 1; /* first index 1 */
        r[32] = 1; /* one entry */
        r[40] = 1; /* of term 1 */
        bad[i].len = 40 + 16;
    }
    bad[0].why = "a version unknown";
    bad[0].rec[0] = 7;
    bad[1].why = "term 0";
    bad[1].rec[40] = 0;
    bad[2].why = "type 9";
    bad[2].rec[48] = 9;
    bad[3].why = "a length past the record";
    bad[3].rec[52] = 5;
    bad[4].why = "not continuing the log (first index 3)";
    bad[4].says = "entries 1 to 2 are missing";
    bad[4].rec[24] = 3;
    bad[5].why = "an entry cut short";
    bad[5].len = 50;
    for (int i = 0; i < 6; i++) {
        ida_test_rmrf(dir);
        struct ida_seglog_options o = opts();
        struct ida_seglog *s = NULL;
        cr_assert_eq(ida_seglog_open(dir, &o, NULL, NULL, &s, NULL, 0), 0);
        struct iovec v = {bad[i].rec, bad[i].len};
        cr_assert_eq(ida_seglog_append(s, &v, 1, NULL, NULL), 0);
        cr_assert_eq(ida_seglog_sync(s), 0);
        ida_seglog_close(s);
        char err[512];
        cr_assert_eq(open_rv(0, 0, err, sizeof(err)), IDA_ECORRUPT, "%s",
                     bad[i].why);
        const char *says = bad[i].says ? bad[i].says : "log record 1";
        cr_assert(strstr(err, says) != NULL, "%s: %s", bad[i].why, err);
        cr_assert_eq(open_rv(0, 0, err, sizeof(err)), IDA_ECORRUPT,
                     "%s: refused again (nothing changed)", bad[i].why);
    }
}

/* A batch record as entlog.h lays it out: truncation, commit, entries
 * [@first, @first + @count) of @term with one byte of data each. */
static size_t batch_rec(uint8_t *out,
                        ida_index trunc,
                        ida_index first,
                        uint32_t count,
                        ida_term term)
{
    memset(out, 0, 40 + (size_t)count * 17);
    out[0] = 1;
    for (int i = 0; i < 8; i++) {
        out[8 + i] = (uint8_t)(trunc >> (8 * i));
        out[24 + i] = (uint8_t)(first >> (8 * i));
    }
    out[32] = (uint8_t)count;
    size_t at = 40;
    for (uint32_t k = 0; k < count; k++) {
        out[at] = (uint8_t)term;
        out[at + 12] = 1; /* one byte */
        out[at + 16] = (uint8_t)k;
        at += 17;
    }
    return at;
}

/* Replay @n records of @spec (trunc, first, count, term each) after
 * (5, 1): 0 with *@last, or the error with @err. */
static int replay(const ida_index (*spec)[4],
                  size_t n,
                  ida_index *last,
                  char *err,
                  size_t errlen)
{
    uint8_t buf[8][400];
    const uint8_t *recs[8];
    size_t lens[8];
    for (size_t i = 0; i < n; i++) {
        lens[i] = batch_rec(buf[i], spec[i][0], spec[i][1],
                            (uint32_t)spec[i][2], spec[i][3]);
        recs[i] = buf[i];
    }
    struct ida_entlog *l = NULL;
    err[0] = '\0';
    int rv = ida__entlog_replay(5, 1, 5, 1, recs, lens, n, &l, err, errlen);
    if (rv == 0) {
        ida_index prev;
        ida_term pt;
        ida_entlog_bounds(l, &prev, &pt, last);
        ida_entlog_close(l);
    }
    return rv;
}

/* The segments kept after a compaction may begin with records a later
 * truncation replaced, whose log began in a segment released (the crash
 * test found it, stop 50: a record of entries 73580.. before the one that
 * truncated at 73576, prev 73575). Their entries are stale until a
 * truncation at or below prev + 1 ends them; without one the beginning
 * of the log is missing. */
Test(entlog, stale_records_at_the_start_are_ended_by_a_truncation)
{
    char err[512];
    ida_index last = 0;
    const ida_index ok[][4] = {{0, 8, 3, 1}, {6, 6, 2, 2}};
    cr_assert_eq(replay(ok, 2, &last, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(last, 7);
    const ida_index cut_then_ok[][4] = {
        {0, 8, 3, 1}, {9, 9, 1, 2}, {0, 10, 1, 2}, {6, 6, 1, 3}};
    cr_assert_eq(replay(cut_then_ok, 4, &last, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(last, 6);
    const ida_index trunc_first[][4] = {{8, 8, 1, 1}, {6, 6, 3, 2}};
    cr_assert_eq(replay(trunc_first, 2, &last, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(last, 8);
    const ida_index never[][4] = {{0, 8, 3, 1}, {0, 11, 2, 1}};
    cr_assert_eq(replay(never, 2, &last, err, sizeof(err)), IDA_ECORRUPT);
    cr_assert(strstr(err, "entries 6 to 7 are missing") != NULL, "%s", err);
    const ida_index inside[][4] = {{0, 8, 3, 1}, {7, 7, 1, 2}};
    cr_assert_eq(replay(inside, 2, &last, err, sizeof(err)), IDA_ECORRUPT);
    cr_assert(strstr(err, "truncates at 7") != NULL, "%s", err);
    const ida_index trunc_alone[][4] = {{8, 8, 1, 1}};
    cr_assert_eq(replay(trunc_alone, 1, &last, err, sizeof(err)), IDA_ECORRUPT);
}

/* The model: the log's terms by index after the snapshot (prev). */
struct model
{
    ida_index prev, last, commit;
    ida_term prev_term;
    ida_term terms[MAXIDX];
};

static void check_model(struct ida_entlog *l, const struct model *m)
{
    ida_index prev, last;
    ida_term pt;
    ida_entlog_bounds(l, &prev, &pt, &last);
    cr_assert_eq(prev, m->prev);
    cr_assert_eq(pt, m->prev_term);
    cr_assert_eq(last, m->last);
    for (ida_index i = m->prev + 1; i <= m->last; i++) {
        ida_term t;
        cr_assert_eq(ida_entlog_term_at(l, i, &t), 0);
        cr_assert_eq(t, m->terms[i], "term of %llu", (unsigned long long)i);
    }
    if (m->last > m->prev) {
        check_entries(l, m->prev + 1, m->last + 1, m->terms);
    }
}

/* Random batches, truncations, compactions and installs, with reopens,
 * against the model: what a reopen finds is what the model holds. */
Test(entlog, random_steps_match_a_model, .timeout = 60)
{
    static struct model m;
    memset(&m, 0, sizeof(m));
    uint64_t seed = 777;
    ida_term term = 1;
    struct ida_entlog *l = open_at(0, 0);
    int reopens = 0, resets = 0, truncs = 0, compacts = 0;
    for (int step = 0; step < 1500 && m.last < MAXIDX - 100; step++) {
        uint64_t r = ida_test_rand(&seed) % 100;
        if (r < 70) {
            ida_index trunc = 0;
            ida_index floor = m.commit > m.prev ? m.commit : m.prev;
            if (ida_test_rand(&seed) % 5 == 0 && m.last > floor) {
                trunc = floor + 1 + ida_test_rand(&seed) % (m.last - floor);
                term++;
                truncs++;
            }
            if (ida_test_rand(&seed) % 10 == 0) {
                term++;
            }
            ida_index end = trunc != 0 ? trunc - 1 : m.last;
            size_t n = (size_t)(ida_test_rand(&seed) % 8);
            ida_index last = end + n;
            ida_index commit = m.commit;
            if (last > commit && ida_test_rand(&seed) % 2 == 0) {
                commit += ida_test_rand(&seed) % (last - commit + 1);
            }
            cr_assert_eq(append(l, trunc, commit, end + 1, last, term), 0,
                         "step %d", step);
            for (ida_index i = end + 1; i <= last; i++) {
                m.terms[i] = term;
            }
            m.last = last;
            m.commit = commit;
        } else if (r < 80 && m.commit > m.prev) {
            ida_index upto =
                m.prev + 1 + ida_test_rand(&seed) % (m.commit - m.prev);
            cr_assert_eq(ida_entlog_compact(l, upto, m.terms[upto]), 0);
            m.prev_term = m.terms[upto];
            m.prev = upto;
            compacts++;
        } else if (r < 83) {
            /* A leader's snapshot past the log, or of another term. */
            term++;
            ida_index upto = m.last + ida_test_rand(&seed) % 20;
            if (upto <= m.prev) {
                upto = m.prev + 1;
            }
            cr_assert_eq(ida_entlog_compact(l, upto, term), 0);
            m.prev = upto;
            m.prev_term = term;
            m.last = upto;
            if (m.commit < upto) {
                m.commit = upto;
            }
            resets++;
        } else if (r < 90) {
            cr_assert_eq(ida_entlog_sync(l), 0);
            ida_entlog_close(l);
            l = open_at(m.prev, m.prev_term);
            reopens++;
            check_model(l, &m);
        } else {
            cr_assert_eq(ida_entlog_sync(l), 0);
        }
    }
    cr_assert_eq(ida_entlog_sync(l), 0);
    ida_entlog_close(l);
    l = open_at(m.prev, m.prev_term);
    check_model(l, &m);
    ida_entlog_close(l);
    cr_assert(reopens > 20 && resets > 5 && truncs > 20 && compacts > 20,
              "every kind of step ran: %d reopens, %d resets, %d truncations, "
              "%d compactions",
              reopens, resets, truncs, compacts);
}
