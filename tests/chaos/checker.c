#include "tests/chaos/checker.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"?",       "alloc", "free",
                                         "reserve", "next",  "prefix"};
static const char *const out_names[] = {"?", "ok", "fail", "unknown"};

const char *hop_kind_name(enum hop_kind k)
{
    return (unsigned)k < 6 ? kind_names[k] : "?";
}

void history_init(struct history *h, uint64_t pool_size)
{
    memset(h, 0, sizeof(*h));
    pthread_mutex_init(&h->mu, NULL);
    h->pool_size = pool_size;
}

void history_free(struct history *h)
{
    free(h->v);
    free(h->final);
    pthread_mutex_destroy(&h->mu);
}

size_t history_add(struct history *h, const struct hop *op)
{
    pthread_mutex_lock(&h->mu);
    if (h->n == h->cap) {
        h->cap = h->cap == 0 ? 4096 : h->cap * 2;
        h->v = realloc(h->v, h->cap * sizeof(*h->v));
        if (h->v == NULL) {
            abort();
        }
    }
    size_t i = h->n++;
    h->v[i] = *op;
    pthread_mutex_unlock(&h->mu);
    return i;
}

void history_set(struct history *h, size_t i, const struct hop *op)
{
    pthread_mutex_lock(&h->mu);
    h->v[i] = *op;
    pthread_mutex_unlock(&h->mu);
}

void history_add_final(struct history *h, const char *tag, uint64_t id)
{
    if (h->n_final == h->cap_final) {
        h->cap_final = h->cap_final == 0 ? 1024 : h->cap_final * 2;
        h->final = realloc(h->final, h->cap_final * sizeof(*h->final));
        if (h->final == NULL) {
            abort();
        }
    }
    struct holding *x = &h->final[h->n_final++];
    snprintf(x->tag, sizeof(x->tag), "%s", tag);
    x->id = id;
    h->final_known = 1;
}

/* --- file format -----------------------------------------------------------
 *   pool_size N
 *   op K thread T cid HEX32 seq S inv MS done MS out O err E tag T id I
 *      first F count C prefix HEX resolved R replay P
 *   final TAG ID
 *   final_known 0|1
 * Tags contain no spaces (the clients make them). */

static void hex(FILE *f, const uint8_t *b, size_t n)
{
    if (n == 0) {
        fputc('-', f);
    }
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%02x", b[i]);
    }
}

static size_t unhex(const char *s, uint8_t *b, size_t cap)
{
    size_t n = 0;
    if (strcmp(s, "-") == 0) {
        return 0;
    }
    while (s[0] != '\0' && s[1] != '\0' && n < cap) {
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1) {
            break;
        }
        b[n++] = (uint8_t)v;
        s += 2;
    }
    return n;
}

int history_write(const struct history *h, FILE *f)
{
    fprintf(f, "pool_size %" PRIu64 "\n", h->pool_size);
    for (size_t i = 0; i < h->n; i++) {
        const struct hop *o = &h->v[i];
        fprintf(f, "op %s thread %d cid ", hop_kind_name(o->kind), o->thread);
        hex(f, o->cid, 16);
        fprintf(f,
                " seq %" PRIu64 " inv %" PRIu64 " done %" PRIu64
                " out %s err %d tag %s id %" PRIu64 " first %" PRIu64
                " count %" PRIu64 " prefix ",
                o->seq, o->inv_ms, o->done_ms, out_names[o->out], o->err,
                o->tag[0] != '\0' ? o->tag : "-", o->id, o->first, o->count);
        hex(f, o->prefix, o->plen);
        fprintf(f, " resolved %d replay %d\n", (int)o->resolved,
                (int)o->replay);
    }
    fprintf(f, "final_known %d\n", h->final_known);
    for (size_t i = 0; i < h->n_final; i++) {
        fprintf(f, "final %s %" PRIu64 "\n", h->final[i].tag, h->final[i].id);
    }
    return ferror(f) ? -1 : 0;
}

static int lookup_name(const char *const *names, int n, const char *s)
{
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i], s) == 0) {
            return i;
        }
    }
    return 0;
}

static int parse_op(const char *line, struct hop *o)
{
    char kind[16], cid[40], out[16], tag[HOP_TAG_MAX], prefix[32];
    int resolved, replay;
    memset(o, 0, sizeof(*o));
    int n = sscanf(line,
                   "op %15s thread %d cid %39s seq %" SCNu64 " inv %" SCNu64
                   " done %" SCNu64 " out %15s err %d tag %47s id %" SCNu64
                   " first %" SCNu64 " count %" SCNu64
                   " prefix %31s resolved %d replay %d",
                   kind, &o->thread, cid, &o->seq, &o->inv_ms, &o->done_ms, out,
                   &o->err, tag, &o->id, &o->first, &o->count, prefix,
                   &resolved, &replay);
    if (n != 15) {
        return -1;
    }
    o->kind = (enum hop_kind)lookup_name(kind_names, 6, kind);
    o->out = (enum hop_out)lookup_name(out_names, 4, out);
    if (o->kind == 0 || o->out == 0 || unhex(cid, o->cid, 16) != 16) {
        return -1;
    }
    snprintf(o->tag, sizeof(o->tag), "%s", strcmp(tag, "-") == 0 ? "" : tag);
    o->plen = unhex(prefix, o->prefix, sizeof(o->prefix));
    o->resolved = (enum hop_resolved)resolved;
    o->replay = (enum hop_replay)replay;
    return 0;
}

int history_read(struct history *h, FILE *f)
{
    char line[1024];
    int no = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        no++;
        char tag[HOP_TAG_MAX];
        uint64_t v;
        int k;
        struct hop o;
        if (sscanf(line, "pool_size %" SCNu64, &v) == 1) {
            h->pool_size = v;
        } else if (sscanf(line, "final_known %d", &k) == 1) {
            h->final_known = k;
        } else if (sscanf(line, "final %47s %" SCNu64, tag, &v) == 2) {
            history_add_final(h, tag, v);
        } else if (parse_op(line, &o) == 0) {
            history_add(h, &o);
        } else {
            fprintf(stderr, "history: line %d: not understood: %s", no, line);
            return -1;
        }
    }
    return 0;
}

/* --- checks ------------------------------------------------------------------
 */

static void violation(struct check_report *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void violation(struct check_report *r, const char *fmt, ...)
{
    if (r->violations < CHECK_EXAMPLES_MAX) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->examples[r->violations], sizeof(r->examples[0]), fmt, ap);
        va_end(ap);
    }
    r->violations++;
}

/* Every op, sorted by tag: the checks look up "the ops of this tag". */
static const struct hop **by_tag;
static size_t n_by_tag;

static int cmp_tag(const void *a, const void *b)
{
    const struct hop *x = *(const struct hop *const *)a;
    const struct hop *y = *(const struct hop *const *)b;
    return strcmp(x->tag, y->tag);
}

static void index_tags(const struct history *h)
{
    by_tag = calloc(h->n + 1, sizeof(*by_tag));
    n_by_tag = 0;
    for (size_t i = 0; i < h->n; i++) {
        if (h->v[i].tag[0] != '\0') {
            by_tag[n_by_tag++] = &h->v[i];
        }
    }
    qsort(by_tag, n_by_tag, sizeof(*by_tag), cmp_tag);
}

/* The index range [*lo, *hi) of the ops of @tag. */
static void tag_range(const char *tag, size_t *lo, size_t *hi)
{
    size_t a = 0, b = n_by_tag;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (strcmp(by_tag[m]->tag, tag) < 0) {
            a = m + 1;
        } else {
            b = m;
        }
    }
    *lo = a;
    while (a < n_by_tag && strcmp(by_tag[a]->tag, tag) == 0) {
        a++;
    }
    *hi = a;
}

/* Did @o take effect, with its result fields known? */
static int effective(const struct hop *o)
{
    return o->out == O_OK || (o->out == O_UNKNOWN && o->resolved == R_EFFECT);
}

/* Could @o have taken effect (a free whose outcome is not "no")? */
static int maybe_effective(const struct hop *o)
{
    return o->out == O_OK ||
           (o->out == O_UNKNOWN && o->resolved != R_NO_EFFECT);
}

struct hold
{
    uint64_t id;
    uint64_t from, to; /* certainly held in [from, to) */
    const char *tag;
};

static int cmp_hold(const void *a, const void *b)
{
    const struct hold *x = a, *y = b;
    if (x->id != y->id) {
        return x->id < y->id ? -1 : 1;
    }
    return x->from < y->from ? -1 : x->from > y->from;
}

/* The earliest invocation of a free of (@tag, @id) that may have taken
 * effect, or UINT64_MAX. */
static uint64_t first_free(const char *tag, uint64_t id)
{
    uint64_t t = UINT64_MAX;
    size_t lo, hi;
    tag_range(tag, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        const struct hop *o = by_tag[i];
        if (o->kind == H_FREE && o->id == id && maybe_effective(o) &&
            o->inv_ms < t) {
            t = o->inv_ms;
        }
    }
    return t;
}

static void check_bounded(const struct history *h, struct check_report *r)
{
    struct hold *v = calloc(h->n + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < h->n; i++) {
        const struct hop *o = &h->v[i];
        if (o->kind != H_ALLOC || !effective(o)) {
            continue;
        }
        if (o->id >= h->pool_size) {
            violation(r, "alloc %s got id %" PRIu64 " outside [0, %" PRIu64 ")",
                      o->tag, o->id, h->pool_size);
        }
        v[n++] =
            (struct hold){o->id, o->done_ms, first_free(o->tag, o->id), o->tag};
    }
    qsort(v, n, sizeof(*v), cmp_hold);
    /* Within one id, holds sorted by start: each must end before the next
     * one of another tag starts. */
    for (size_t i = 0; i < n; i++) {
        for (size_t k = i + 1; k < n && v[k].id == v[i].id; k++) {
            if (strcmp(v[k].tag, v[i].tag) != 0 && v[k].from < v[i].to &&
                v[i].from < v[k].to) {
                violation(r,
                          "id %" PRIu64
                          " held by %s and %s at once "
                          "(from %" PRIu64 " and %" PRIu64 " ms)",
                          v[i].id, v[i].tag, v[k].tag, v[i].from, v[k].from);
            }
        }
    }
    free(v);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_holding(const void *a, const void *b)
{
    return strcmp(((const struct holding *)a)->tag,
                  ((const struct holding *)b)->tag);
}

/* Needs h->final sorted by tag (check_final sorts it). */
static const struct holding *final_of(const struct history *h, const char *tag)
{
    struct holding key;
    snprintf(key.tag, sizeof(key.tag), "%s", tag);
    return bsearch(&key, h->final, h->n_final, sizeof(*h->final), cmp_holding);
}

static void check_final(struct history *h, struct check_report *r)
{
    if (!h->final_known) {
        return;
    }
    qsort(h->final, h->n_final, sizeof(*h->final), cmp_holding);
    for (size_t i = 0; i < h->n; i++) {
        const struct hop *o = &h->v[i];
        if (o->kind != H_ALLOC || o->out != O_OK) {
            continue;
        }
        const struct holding *f = final_of(h, o->tag);
        if (first_free(o->tag, o->id) != UINT64_MAX) {
            continue; /* a free of it was attempted */
        }
        if (f == NULL) {
            violation(r, "acknowledged alloc %s -> %" PRIu64 " is lost", o->tag,
                      o->id);
        } else if (f->id != o->id) {
            violation(r, "alloc %s was answered %" PRIu64 " but holds %" PRIu64,
                      o->tag, o->id, f->id);
        }
    }
    for (size_t i = 0; i < h->n_final; i++) {
        const struct holding *f = &h->final[i];
        int known = 0;
        size_t lo, hi;
        tag_range(f->tag, &lo, &hi);
        for (size_t k = lo; k < hi && !known; k++) {
            /* An alloc that returned this id, or one whose outcome is
             * still unknown (not one learnt to have had no effect, nor one
             * learnt to have returned another id). */
            const struct hop *o = by_tag[k];
            known = o->kind == H_ALLOC &&
                    ((o->out == O_UNKNOWN && o->resolved == R_NONE) ||
                     (effective(o) && o->id == f->id));
        }
        if (!known) {
            violation(r, "%s holds %" PRIu64 " but no alloc returned it",
                      f->tag, f->id);
        }
    }
    /* Final holdings by id: no id twice. */
    uint64_t *ids = calloc(h->n_final + 1, sizeof(*ids));
    for (size_t i = 0; i < h->n_final; i++) {
        ids[i] = h->final[i].id;
    }
    qsort(ids, h->n_final, sizeof(*ids), cmp_u64);
    for (size_t i = 1; i < h->n_final; i++) {
        if (ids[i] == ids[i - 1]) {
            violation(r, "final state: id %" PRIu64 " held twice", ids[i]);
        }
    }
    free(ids);
}

struct range
{
    uint64_t first, end;
    const struct hop *op;
};

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

static void check_sequences(const struct history *h, struct check_report *r)
{
    struct range *v = calloc(h->n + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < h->n; i++) {
        const struct hop *o = &h->v[i];
        if (o->kind == H_RESERVE && effective(o)) {
            v[n++] = (struct range){o->first, o->first + o->count, o};
        } else if (o->kind == H_NEXT && o->out == O_OK) {
            v[n++] = (struct range){o->id, o->id + 1, o};
        }
    }
    qsort(v, n, sizeof(*v), cmp_range);
    for (size_t i = 1; i < n; i++) {
        if (v[i].first < v[i - 1].end) {
            violation(r,
                      "%s [%" PRIu64 ", %" PRIu64 ") overlaps %s [%" PRIu64
                      ", %" PRIu64 ")",
                      hop_kind_name(v[i].op->kind), v[i].first, v[i].end,
                      hop_kind_name(v[i - 1].op->kind), v[i - 1].first,
                      v[i - 1].end);
        }
    }
    free(v);
}

static int cmp_prefix_op(const void *a, const void *b)
{
    const struct hop *x = *(const struct hop *const *)a;
    const struct hop *y = *(const struct hop *const *)b;
    size_t m = x->plen < y->plen ? x->plen : y->plen;
    int c = memcmp(x->prefix, y->prefix, m);
    return c != 0 ? c : (x->plen > y->plen) - (x->plen < y->plen);
}

static void check_prefixes(const struct history *h, struct check_report *r)
{
    const struct hop **v = calloc(h->n + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < h->n; i++) {
        if (h->v[i].kind == H_PREFIX && effective(&h->v[i])) {
            v[n++] = &h->v[i];
        }
    }
    qsort(v, n, sizeof(*v), cmp_prefix_op);
    /* Sorted, a prefix sits just before the strings it starts. */
    for (size_t i = 1; i < n; i++) {
        const struct hop *a = v[i - 1], *b = v[i];
        int starts =
            a->plen <= b->plen && memcmp(a->prefix, b->prefix, a->plen) == 0;
        if (starts && strcmp(a->tag, b->tag) != 0) {
            violation(r, "prefix of %s %s that of %s", a->tag,
                      a->plen == b->plen ? "equals" : "starts", b->tag);
        }
    }
    free(v);
    /* One tag, one prefix: compare each with the tag's first one. */
    const struct hop *first = NULL;
    for (size_t i = 0; i < n_by_tag; i++) {
        const struct hop *b = by_tag[i];
        if (first != NULL && strcmp(first->tag, b->tag) != 0) {
            first = NULL;
        }
        if (b->kind != H_PREFIX || !effective(b)) {
            continue;
        }
        if (first == NULL) {
            first = b;
        } else if (first->plen != b->plen ||
                   memcmp(first->prefix, b->prefix, b->plen) != 0) {
            violation(r, "tag %s got two different prefixes", b->tag);
        }
    }
}

size_t history_check(struct history *h, struct check_report *r)
{
    memset(r, 0, sizeof(*r));
    for (size_t i = 0; i < h->n; i++) {
        const struct hop *o = &h->v[i];
        r->ops[o->kind][o->out]++;
        if (o->out == O_UNKNOWN && o->resolved == R_NONE) {
            r->unresolved++;
        }
        if (o->replay == P_SAME) {
            r->replays_same++;
        } else if (o->replay == P_DIFFERENT) {
            violation(r,
                      "a replay of %s %s (seq %" PRIu64
                      ") did not return "
                      "its first answer",
                      hop_kind_name(o->kind), o->tag, o->seq);
        }
    }
    index_tags(h);
    check_bounded(h, r);
    check_final(h, r);
    check_sequences(h, r);
    check_prefixes(h, r);
    free(by_tag);
    by_tag = NULL;
    return r->violations;
}

void check_report_print(const struct check_report *r, FILE *f)
{
    fprintf(f, "operations (ok/fail/unknown):");
    for (int k = H_ALLOC; k <= H_PREFIX; k++) {
        fprintf(f, " %s=%zu/%zu/%zu", hop_kind_name((enum hop_kind)k),
                r->ops[k][O_OK], r->ops[k][O_FAIL], r->ops[k][O_UNKNOWN]);
    }
    fprintf(f,
            "\nunknown outcomes left unresolved: %zu; replays that "
            "returned their first answer: %zu\nviolations: %zu\n",
            r->unresolved, r->replays_same, r->violations);
    for (size_t i = 0; i < r->violations && i < CHECK_EXAMPLES_MAX; i++) {
        fprintf(f, "  violation: %s\n", r->examples[i]);
    }
}
