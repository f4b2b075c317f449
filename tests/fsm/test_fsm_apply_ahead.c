/* fsm/apply_ahead.c: ida_fsm_apply_entries(), a run of entries applied
 * with a thread decoding ahead, against ida_fsm_apply() one at a time. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "tests/fsm/fsm_helpers.h"

#define CLIENTS 5
#define ENTRIES 700 /* several blocks of the decoder, and a part block */

/* A helper on a real thread, as the node lends one (src/node/lend.c); one
 * that never starts (REFUSE), so the caller decodes every block; or one
 * that runs the function at once on the caller's thread (INLINE): the
 * helped path, with allocations in a fixed order. */
enum helper_mode { THREAD, REFUSE, INLINE };

struct thread_helper
{
    struct ida_fsm_helper h;
    pthread_t t;
    bool running;
    enum helper_mode mode;
    int starts;
    void (*fn)(void *);
    void *arg;
};

static void *thread_main(void *p)
{
    struct thread_helper *th = p;
    th->fn(th->arg);
    return NULL;
}

static int th_start(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct thread_helper *th = ctx;
    cr_assert(!th->running, "started twice without a join");
    if (th->mode == REFUSE) {
        return -1;
    }
    th->starts++;
    if (th->mode == INLINE) {
        fn(arg);
        return 0;
    }
    th->fn = fn;
    th->arg = arg;
    cr_assert_eq(pthread_create(&th->t, NULL, thread_main, th), 0);
    th->running = true;
    return 0;
}

static void th_join(void *ctx)
{
    struct thread_helper *th = ctx;
    if (th->running) {
        pthread_join(th->t, NULL);
        th->running = false;
    }
}

static void th_init(struct thread_helper *th, enum helper_mode mode)
{
    memset(th, 0, sizeof(*th));
    th->h = (struct ida_fsm_helper){th_start, th_join, th};
    th->mode = mode;
}

/* Every answer of every entry, in order, as comparable text. */
struct transcript
{
    char *text;
    size_t len, cap;
    size_t entries;
};

static void note(struct transcript *t, const char *s)
{
    size_t n = strlen(s);
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->text = realloc(t->text, t->cap);
        cr_assert_not_null(t->text);
    }
    memcpy(t->text + t->len, s, n + 1);
    t->len += n;
}

static void record(void *ctx,
                   const struct ida_entry *e,
                   const struct ida_fsm_applied *ap)
{
    struct transcript *t = ctx;
    char line[256];
    snprintf(line, sizeof(line), "entry %llu error %d count %zu\n",
             (unsigned long long)e->index, ap->entry_error, ap->count);
    note(t, line);
    for (size_t i = 0; i < ap->count; i++) {
        const struct ida_fsm_reply *r = &ap->replies[i];
        snprintf(line, sizeof(line),
                 " seq %llu cached %d error %d id %llu count %llu flag %d "
                 "prefix %u\n",
                 (unsigned long long)r->request_seq, r->cached, r->result.error,
                 (unsigned long long)r->result.id,
                 (unsigned long long)r->result.count, r->result.flag,
                 r->result.prefix_len);
        note(t, line);
    }
    t->entries++;
}

/* Command @v of a bad tag in @b: an alloc, a free or a prefix (by @v % 3)
 * whose tag is empty, one byte too long, not UTF-8 or holds a NUL byte
 * (by @v / 3 % 4). */
static void add_bad_tag(struct fx_batch *b, uint64_t c, uint64_t s, size_t v)
{
    static const struct
    {
        const char *bytes;
        size_t len;
    } bad[] = {
        {"", 0}, {NULL, IDA_TAG_BYTES_MAX + 1}, {"\xc3\x28x", 3}, {"a\0b", 3}};
    size_t which = v / 3 % 4;
    switch (v % 3) {
        case 0:
            fx_add_alloc(b, c, s, "bnd", "placeholder");
            break;
        case 1:
            fx_add_free(b, c, s, "bnd", 1, "placeholder");
            break;
        default:
            fx_add_prefix(b, c, s, "pfx", "placeholder");
            break;
    }
    size_t i = b->n - 1;
    char *t = b->tag[i];
    size_t len = bad[which].len;
    if (bad[which].bytes == NULL) {
        memset(t, 'x', len);
    } else {
        memcpy(t, bad[which].bytes, len);
    }
    ProtobufCBinaryData tag = {len, (uint8_t *)t};
    switch (v % 3) {
        case 0:
            b->op[i].alloc.tag = tag;
            break;
        case 1:
            b->op[i].free.tag = tag;
            break;
        default:
            b->op[i].prefix.tag = tag;
            break;
    }
}

/* A log that goes through every way an entry is applied: allocations of
 * new and held tags, frees, reserves, prefixes; retries of a command
 * (the kept answer), a seq reused for another command (refused by the
 * fingerprint); NOOP and CONFIG entries, bytes that do not decode, a
 * batch of an unknown version, an empty batch. */
static struct ida_entry *make_log(size_t n, ida_index first)
{
    static struct fx_batch b;
    struct ida_entry *log = calloc(n, sizeof(*log));
    cr_assert_not_null(log);
    uint64_t seq[CLIENTS + 1] = {0};
    /* Each client's last command, to send again. */
    struct
    {
        int kind;
        char tag[32];
        uint64_t arg;
    } last[CLIENTS + 1];
    memset(last, 0, sizeof(last));
    for (size_t i = 0; i < n; i++) {
        struct ida_entry *e = &log[i];
        e->index = first + i;
        e->term = 1 + i / 300;
        e->type = IDA_ENTRY_NORMAL;
        if (i % 97 == 13) {
            e->type = i % 2 ? IDA_ENTRY_NOOP : IDA_ENTRY_CONFIG;
            continue;
        }
        if (i == 400) {
            /* More commands than a batch may hold (each an empty message):
             * applied as a no-op, ETOOBIG. */
            size_t cmds = IDA_BATCH_COMMANDS_MAX + 1;
            e->data = malloc(2 + 2 * cmds);
            e->data[0] = 0x08; /* field 1, the version */
            e->data[1] = IDA_BATCH_VERSION;
            for (size_t k = 1; k <= cmds; k++) {
                e->data[2 * k] = 0x1a; /* field 3, length-delimited */
                e->data[2 * k + 1] = 0;
            }
            e->len = 2 + 2 * cmds;
            continue;
        }
        if (i % 89 == 7) {
            static const uint8_t junk[] = {0x1a, 0x7f, 0x01};
            e->data = malloc(sizeof(junk));
            memcpy(e->data, junk, sizeof(junk));
            e->len = sizeof(junk);
            continue;
        }
        fx_batch_init(&b, 1000 + i);
        if (i % 101 == 50) {
            b.version = 99;
        }
        size_t cmds = i % 151 == 3 ? 0 : 1 + i % 40;
        for (size_t k = 0; k < cmds; k++) {
            uint64_t c = 1 + (i + k) % CLIENTS;
            if ((i + k) % 47 == 5) {
                /* A tag no client library sends: refused where applied,
                 * whether its check was made ahead or not. */
                add_bad_tag(&b, c, ++seq[c], (i + k) / 47);
                last[c].tag[0] = '\0';
                continue;
            }
            int kind = (int)((i + k) % 7);
            if (kind == 6 && seq[c] > 0 && i % 2 == 0) {
                /* The same seq for another command: refused. */
                fx_add_alloc(&b, c, seq[c], "bnd", "other");
                continue;
            }
            uint64_t s = kind == 6 && seq[c] > 0 ? seq[c] : ++seq[c];
            if (kind == 6 && s == seq[c] && last[c].tag[0] != '\0') {
                kind = last[c].kind; /* a retry: the kept answer */
            } else {
                snprintf(last[c].tag, sizeof(last[c].tag), "t%zu",
                         (i * 7 + k * 13) % 900);
                last[c].arg = (i + k) % 500;
                last[c].kind = kind = kind == 6 ? 0 : kind;
            }
            const char *tag = last[c].tag;
            switch (kind) {
                case 3:
                    fx_add_free(&b, c, s, "bnd", last[c].arg, tag);
                    break;
                case 4:
                    fx_add_reserve(&b, c, s, "seq", 1 + last[c].arg % 9);
                    break;
                case 5:
                    fx_add_prefix(&b, c, s, "pfx", tag);
                    break;
                default:
                    fx_add_alloc(&b, c, s, "bnd", tag);
                    break;
            }
        }
        e->data = fx_batch_pack(&b, &e->len);
    }
    return log;
}

static void free_log(struct ida_entry *log, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(log[i].data);
    }
    free(log);
}

static struct ida_fsm *base_state(void)
{
    struct ida_fsm *f;
    cr_assert_eq(ida_fsm_new(&f), 0);
    for (uint64_t c = 1; c <= CLIENTS; c++) {
        fx_register(f, c, 500);
    }
    /* The pools' creator: a client of its own (the log's are 1..CLIENTS),
     * registered like them, or every command of the log would find no
     * pool. */
    fx_register(f, 9, 500);
    static struct fx_batch b;
    fx_batch_init(&b, 500);
    fx_add_create(&b, 9, 1, "bnd", IDALLOC__POOL_KIND__POOL_KIND_BOUNDED, 600);
    fx_add_create(&b, 9, 2, "seq", IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE, 0);
    fx_add_create(&b, 9, 3, "pfx", IDALLOC__POOL_KIND__POOL_KIND_PREFIX, 0);
    struct ida_fsm_applied ap;
    fx_apply(f, &b, &ap);
    cr_assert_eq(ap.count, 3);
    for (size_t i = 0; i < ap.count; i++) {
        cr_assert_eq(ap.replies[i].result.error, 0, "pool %zu not created", i);
    }
    return f;
}

/* make_log() for the entries after base_state()'s. */
static struct ida_entry *make_log_after_base(void)
{
    struct ida_fsm *probe = base_state();
    ida_index first = ida_fsm_applied_index(probe) + 1;
    ida_fsm_free(probe);
    return make_log(ENTRIES, first);
}

/* The reference: ida_fsm_apply() of each entry. */
static uint8_t *apply_one_by_one(const struct ida_entry *log,
                                 size_t n,
                                 struct transcript *t,
                                 size_t *snap_len)
{
    struct ida_fsm *f = base_state();
    for (size_t i = 0; i < n; i++) {
        struct ida_fsm_applied ap;
        cr_assert_eq(ida_fsm_apply(f, log[i].index, log[i].type, log[i].data,
                                   log[i].len, &ap),
                     0, "entry %zu", i);
        record(t, &log[i], &ap);
    }
    uint8_t *snap = fx_snapshot(f, snap_len);
    ida_fsm_free(f);
    return snap;
}

/* Whether @f snapshots to the @len bytes @want. */
static bool same_state(const struct ida_fsm *f, const uint8_t *want, size_t len)
{
    size_t n;
    uint8_t *snap = fx_snapshot(f, &n);
    bool same = n == len && memcmp(snap, want, len) == 0;
    ida_free(snap);
    return same;
}

/* The same log through ida_fsm_apply_entries(), with a thread decoding
 * ahead, with a helper that never starts, and with none: the same answers
 * to every command and the same state, byte for byte. */
Test(apply_ahead, the_same_answers_and_state_as_one_entry_at_a_time)
{
    struct ida_entry *log = make_log_after_base();
    struct transcript want = {0};
    size_t want_len;
    uint8_t *want_snap = apply_one_by_one(log, ENTRIES, &want, &want_len);
    cr_assert(strstr(want.text, "cached 1") != NULL, "no retry was answered");
    char reused[32];
    snprintf(reused, sizeof(reused), "error %d ", IDA_EREUSED);
    cr_assert(strstr(want.text, reused) != NULL, "no reused seq");
    char toobig[48];
    snprintf(toobig, sizeof(toobig), "error %d count 0", IDA_ETOOBIG);
    cr_assert(strstr(want.text, toobig) != NULL, "no oversized batch");
    /* Most commands acted (the pools exist). */
    size_t acted = 0;
    for (const char *p = want.text; (p = strstr(p, " error 0 id ")) != NULL;
         p++) {
        acted++;
    }
    cr_assert_gt(acted, 5000, "%zu commands acted", acted);
    /* Bad tags were refused, each kind of them. */
    char bad[48];
    snprintf(bad, sizeof(bad), "cached 0 error %d ", IDA_EINVAL);
    cr_assert(strstr(want.text, bad) != NULL, "no tag refused as invalid");
    snprintf(bad, sizeof(bad), "cached 0 error %d ", IDA_ETOOBIG);
    cr_assert(strstr(want.text, bad) != NULL, "no tag refused as too long");
    for (int mode = 0; mode < 3; mode++) {
        struct thread_helper th;
        th_init(&th, mode == 1 ? REFUSE : THREAD);
        struct ida_fsm *f = base_state();
        struct transcript got = {0};
        size_t done = 99;
        cr_assert_eq(
            ida_fsm_apply_entries(f, log, ENTRIES, mode == 2 ? NULL : &th.h,
                                  record, &got, &done),
            0);
        cr_assert_eq(done, ENTRIES);
        cr_assert_eq(got.entries, ENTRIES);
        cr_assert(!th.running, "the helper was joined");
        if (mode == 0) {
            /* Three blocks (128, 256 and 316 entries, far below 4 MiB
             * each), the first decoded by the caller. */
            cr_assert_eq(th.starts, 2, "started %d times", th.starts);
        }
        cr_assert_str_eq(got.text, want.text, "mode %d", mode);
        cr_assert(same_state(f, want_snap, want_len), "mode %d", mode);
        free(got.text);
        ida_fsm_free(f);
    }
    ida_free(want_snap);
    free(want.text);
    free_log(log, ENTRIES);
}

/* An entry out of order in the middle of a run (a bug in the caller): the
 * entries before it are applied and reported, it and those after are not,
 * and its error comes back; the decoder is joined all the same. */
Test(apply_ahead, stops_at_the_first_entry_it_cannot_apply)
{
    /* In the caller's first block, on a block's first entry, later on. */
    const size_t bads[] = {5, 384, 600};
    for (size_t t = 0; t < sizeof(bads) / sizeof(bads[0]); t++) {
        struct ida_entry *log = make_log_after_base();
        ida_index first = log[0].index;
        const size_t bad = bads[t];
        log[bad].index += 5;
        struct thread_helper th;
        th_init(&th, THREAD);
        struct ida_fsm *f = base_state();
        struct transcript got = {0};
        size_t done = 0;
        cr_assert_eq(
            ida_fsm_apply_entries(f, log, ENTRIES, &th.h, record, &got, &done),
            IDA_EINVAL);
        cr_assert_eq(done, bad);
        cr_assert_eq(got.entries, bad);
        cr_assert(!th.running);
        cr_assert_eq(ida_fsm_applied_index(f), first + bad - 1);
        free(got.text);
        ida_fsm_free(f);
        free_log(log, ENTRIES);
    }
}

/* Out of memory while the decoder works ahead is not a malformed entry:
 * the caller decodes such an entry again itself, and the run applies
 * everything with the answers of one entry at a time. */
Test(apply_ahead, memory_short_for_the_decoder_changes_no_answer)
{
    struct ida_entry *log = make_log_after_base();
    struct transcript want = {0};
    size_t want_len;
    uint8_t *want_snap = apply_one_by_one(log, ENTRIES, &want, &want_len);
    /* Helpers that keep every allocation on this thread, so that the fault
     * schedule does not depend on a race: the caller decoding each block,
     * and the helped path run in place. Failures at several points of the
     * run: the blocks, the first decoded entries, later ones. */
    for (int at = 1; at < 80; at += 3) {
        struct thread_helper th;
        th_init(&th, at % 2 ? REFUSE : INLINE);
        struct ida_fsm *f = base_state();
        struct transcript got = {0};
        size_t done = 0;
        ida_heap_fault_set(at, 1);
        int rv =
            ida_fsm_apply_entries(f, log, ENTRIES, &th.h, record, &got, &done);
        ida_heap_fault_set(0, 0);
        if (rv == 0) {
            cr_assert_eq(done, ENTRIES);
            cr_assert_str_eq(got.text, want.text, "fault at %d", at);
            cr_assert(same_state(f, want_snap, want_len), "fault at %d", at);
        } else {
            /* Only the state machine's own memory may fail the run. */
            cr_assert_eq(rv, IDA_ENOMEM, "fault at %d: %d", at, rv);
            cr_assert_eq(
                strncmp(got.text != NULL ? got.text : "", want.text, got.len),
                0, "fault at %d: the entries before differ", at);
        }
        free(got.text);
        ida_fsm_free(f);
    }
    ida_free(want_snap);
    free(want.text);
    free_log(log, ENTRIES);
}
