/* Chaos histories and their checker.
 *
 * A history records every client operation: invocation and completion time
 * (ms, one clock for the whole run), the client id and request seq it used,
 * and its outcome: ok (with its result), fail (a definite "no") or unknown.
 * After the run, unknown operations are resolved against the healed cluster
 * (replayed with their own request ids, or settled by reads) and the
 * cluster's final holdings are recorded. The checker then needs nothing but
 * the history:
 *   - no id is held by two tags at once: a tag certainly holds its id from
 *     the alloc's completion until the invocation of a free of it;
 *   - every acknowledged alloc is still held at the end unless a free of it
 *     was attempted; nothing is held that no alloc of that tag returned;
 *   - no id is outside the pool;
 *   - sequence blocks (reserve) and next() ids never overlap;
 *   - a tag's prefix never changes; no prefix repeats or is a prefix of
 *     another;
 *   - a replayed request returns its first answer.
 * Histories are text files, one record a line (see checker.c), so the
 * checker runs on any recorded history: build/prog/chaos_check FILE. */
#ifndef IDA_CHAOS_CHECKER_H
#define IDA_CHAOS_CHECKER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum hop_kind { H_ALLOC = 1, H_FREE, H_RESERVE, H_NEXT, H_PREFIX };
enum hop_out { O_OK = 1, O_FAIL, O_UNKNOWN };
enum hop_resolved {
    R_NONE = 0,      /* not resolved (or not needed) */
    R_EFFECT = 1,    /* it took effect; the result fields are filled */
    R_NO_EFFECT = 2, /* it did not take effect */
};
enum hop_replay { P_NONE = 0, P_SAME = 1, P_DIFFERENT = 2 };

#define HOP_TAG_MAX 48

struct hop
{
    enum hop_kind kind;
    int thread;
    uint8_t cid[16];
    uint64_t seq;
    uint64_t inv_ms, done_ms;
    enum hop_out out;
    int err;
    char tag[HOP_TAG_MAX];
    uint64_t id;           /* alloc, free, next */
    uint64_t first, count; /* reserve */
    uint8_t prefix[9];
    size_t plen;
    enum hop_resolved resolved;
    enum hop_replay replay;
};

struct holding
{
    char tag[HOP_TAG_MAX];
    uint64_t id;
};

struct history
{
    pthread_mutex_t mu; /* guards appends while clients run */
    struct hop *v;
    size_t n, cap;
    uint64_t pool_size; /* the bounded pool's size */
    int final_known;
    struct holding *final;
    size_t n_final, cap_final;
};

void history_init(struct history *h, uint64_t pool_size);
void history_free(struct history *h);
/* Append a copy of @op (thread-safe); returns its index. */
size_t history_add(struct history *h, const struct hop *op);
/* Replace op @i with a copy of @op (thread-safe): an unknown outcome
 * learnt later. */
void history_set(struct history *h, size_t i, const struct hop *op);
void history_add_final(struct history *h, const char *tag, uint64_t id);
int history_write(const struct history *h, FILE *f);
/* Returns 0, or -1 with a message on stderr naming the line. */
int history_read(struct history *h, FILE *f);

#define CHECK_EXAMPLES_MAX 10

struct check_report
{
    size_t ops[6][4];    /* [kind][outcome] */
    size_t unresolved;   /* unknown ops whose effect could not be learnt */
    size_t replays_same; /* replays that returned the first answer */
    size_t violations;
    char examples[CHECK_EXAMPLES_MAX][256];
};

/* Check @h; fills @r. Returns the number of violations. */
size_t history_check(struct history *h, struct check_report *r);
void check_report_print(const struct check_report *r, FILE *f);
const char *hop_kind_name(enum hop_kind k);

#endif
