/* The operator of a chaos run (tests/chaos/run.h): every few seconds a
 * membership change (a node removed, added back and promoted) or a leader
 * transfer, and the replacement of each wiped node: by hand with
 * manual_rejoin, exactly as the README Runbook says (member remove, member
 * add, member promote until "promoted"), else by watching the leader
 * re-admit it. Every command is bin/idalloc run as an operator would, with
 * --config of the cluster file; the faults go on meanwhile, within the
 * availability rule. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tests/chaos/run.h"

#define BIT(i)  (1u << (unsigned)(i))
#define STEP_MS 60000 /* a step that takes longer is a failure */

/* Run `bin/idalloc --config FILE ARGS`, its stdout and stderr into @out;
 * returns the exit status. */
static int cli(struct run *x, char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int cli(struct run *x, char *out, size_t cap, const char *fmt, ...)
{
    char args[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    int rc = tc_run(out, cap, "%s --config %s --timeout 10000 %s 2>&1",
                    tc_bin("idalloc"), x->c.conf, args);
    struct chaos_members *m = &x->r->m;
    m->commands++;
    m->exits[rc == 0 ? 0 : rc == 1 ? 1 : rc == 3 ? 2 : 3]++;
    size_t len = strlen(out);
    while (len > 0 && out[len - 1] == '\n') {
        out[--len] = '\0';
    }
    chaos_trace(x, "operator: idalloc %s: exit %d: %.200s", args, rc, out);
    return rc;
}

/* `member OP ID` until it answers exit 0 (counted in @count, and in
 * m.already when it answers that the membership already was so); false if
 * it did not within STEP_MS. Exit 1 (refused: another change under way, a node
 * not heard from, a learner still catching up) and 3 (outcome unknown: the
 * Runbook says repeating is safe) are repeated. */
static bool change(struct run *x, const char *op, int id, unsigned *count)
{
    char out[1024] = "";
    int rc = -1;
    for (uint64_t end = tc_now_ms() + STEP_MS; tc_now_ms() < end;) {
        rc = cli(x, out, sizeof(out), "member %s %d", op, id);
        if (rc == 0) {
            (*count)++;
            x->r->m.already += strstr(out, "already") != NULL ||
                               strstr(out, "not a member") != NULL;
            return true;
        }
        if (rc != 1 && rc != 3) {
            break; /* usage: a bug of this harness */
        }
        tc_sleep_ms(300);
    }
    chaos_failure(x, "member %s %d: exit %d: %.120s", op, id, rc, out);
    return false;
}

/* Wait until node @id (1-based) is a voter with no waiting line and, if
 * @inc is not 0, incarnation @inc (@not_inc: any but that one). */
static bool wait_voter(struct run *x,
                       unsigned id,
                       uint64_t inc,
                       uint64_t not_inc,
                       unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (chaos_members(x, &l, 1000) == 0) {
            const struct idalloc_member *m = chaos_member(&l, id, 0);
            if (m != NULL && m->voter && chaos_member(&l, id, 1) == NULL &&
                (inc == 0 || m->incarnation == inc) &&
                (not_inc == 0 || m->incarnation != not_inc)) {
                return true;
            }
        }
        tc_sleep_ms(150);
    }
    return false;
}

static void op_end(struct run *x, int i)
{
    pthread_mutex_lock(&x->mu);
    x->op_busy = false;
    if (i >= 0) {
        x->unavail &= ~BIT(i);
    }
    pthread_mutex_unlock(&x->mu);
}

/* Start a voluntary action, reserving node @i (-1: none) under the rule:
 * not during a freeze or a pending replacement, not the node whose older
 * copy the rollback nemesis keeps. Waits up to 5 s for room. */
static bool op_begin(struct run *x, int i)
{
    for (uint64_t end = tc_now_ms() + 5000; !x->stop && tc_now_ms() < end;) {
        pthread_mutex_lock(&x->mu);
        unsigned b = i >= 0 ? BIT(i) : 0;
        bool ok = !x->freeze && x->replace_node < 0 &&
                  (i < 0 || x->rollback_node != i) && (x->unavail & b) == 0 &&
                  chaos_minority(x, x->unavail | x->faulted | b);
        if (ok) {
            x->op_busy = true;
            x->unavail |= b;
        }
        pthread_mutex_unlock(&x->mu);
        if (ok) {
            return true;
        }
        tc_sleep_ms(50);
    }
    x->r->m.postponed++;
    return false;
}

/* Take node @i (0-based, the leader too) out of the membership, leave it
 * out a moment, add it back and promote it. */
static void member_cycle(struct run *x, uint64_t *rng, int i)
{
    if (!op_begin(x, i)) {
        return;
    }
    struct chaos_members *m = &x->r->m;
    int id = i + 1;
    if (!change(x, "remove", id, &m->removes)) {
        goto out;
    }
    tc_sleep_ms(300 + (unsigned)(chaos_rnd(rng) % 2200));
    /* With auto_rejoin on the leader may promote it first: "already a
     * voter" is as good. */
    if (!change(x, "add", id, &m->adds) ||
        !change(x, "promote", id, &m->promotes)) {
        goto out;
    }
    if (!wait_voter(x, (unsigned)id, 0, 0, 30000)) {
        chaos_failure(x, "node %d promoted but not listed as a voter", id);
        goto out;
    }
    m->cycles++;
out:
    op_end(x, i);
}

static void transfer(struct run *x, uint64_t *rng)
{
    if (!op_begin(x, -1)) {
        return;
    }
    char out[512];
    int to = (int)(chaos_rnd(rng) % (uint64_t)(x->c.n + 1)); /* 0: any */
    int rc = to == 0 ? cli(x, out, sizeof(out), "leader transfer")
                     : cli(x, out, sizeof(out), "leader transfer --to %d", to);
    /* Exit 1 (the target did not take over: paused, cut off, behind, or
     * already the leader) and 3 are outcomes, not failures. */
    if (rc == 0) {
        x->r->m.transfers++;
    } else {
        x->r->m.transfers_failed++;
    }
    op_end(x, -1);
}

/* The incarnation of node @id's waiting line in `member list`'s output, or
 * 0. */
static uint64_t waiting_inc(const char *out, int id)
{
    char needle[48];
    snprintf(needle, sizeof(needle), "id=%d role=waiting incarnation=", id);
    for (const char *p = out; (p = strstr(p, needle)) != NULL; p++) {
        if (p == out || p[-1] == '\n') {
            uint64_t inc = 0;
            if (sscanf(p + strlen(needle), "%" SCNx64, &inc) == 1) {
                return inc;
            }
        }
    }
    return 0;
}

/* The README Runbook, "A node's disk died", auto_rejoin off: the node is
 * listed as waiting; member remove, member add, member promote until
 * "promoted". */
static bool replace_by_hand(struct run *x, int i, uint64_t old_inc)
{
    int id = i + 1;
    char out[4096] = "";
    uint64_t inc = 0;
    for (uint64_t end = tc_now_ms() + STEP_MS; inc == 0;) {
        if (cli(x, out, sizeof(out), "member list") == 0) {
            inc = waiting_inc(out, id);
        }
        if (inc == 0) {
            if (tc_now_ms() >= end) {
                chaos_failure(x, "node %d never listed as waiting: %.120s", id,
                              out);
                return false;
            }
            tc_sleep_ms(200);
        }
    }
    struct chaos_members *m = &x->r->m;
    if (!change(x, "remove", id, &m->removes) ||
        !change(x, "add", id, &m->adds) ||
        !change(x, "promote", id, &m->promotes)) {
        return false;
    }
    if (!wait_voter(x, (unsigned)id, inc, old_inc, 30000)) {
        chaos_failure(x, "node %d: replaced but not a voter as %016" PRIx64, id,
                      inc);
        return false;
    }
    m->replacements++;
    return true;
}

/* A wiped node (or one rule A4 stopped, its directory deleted): replaced by
 * hand, or
 * re-admitted by the leader (auto_rejoin on); then it is available again. */
static void replace(struct run *x, int i, uint64_t old_inc)
{
    pthread_mutex_lock(&x->mu);
    x->op_busy = true;
    pthread_mutex_unlock(&x->mu);
    if (x->o->manual_rejoin) {
        replace_by_hand(x, i, old_inc);
    } else if (wait_voter(x, (unsigned)i + 1, 0, old_inc, 90000)) {
        x->r->m.readmissions++;
    } else {
        chaos_failure(x, "wiped node %d not re-admitted within 90 s", i + 1);
    }
    pthread_mutex_lock(&x->mu);
    x->replace_node = -1;
    pthread_mutex_unlock(&x->mu);
    op_end(x, i);
}

void *chaos_operator_main(void *arg)
{
    struct run *x = arg;
    uint64_t rng = x->o->seed * 0xbf58476d1ce4e5b9ull + 3;
    uint64_t next = tc_now_ms() + 2000 + chaos_rnd(&rng) % 3000;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        int rn = x->replace_node;
        uint64_t inc = x->replace_old_inc;
        pthread_mutex_unlock(&x->mu);
        if (rn >= 0) {
            replace(x, rn, inc);
            continue;
        }
        /* After the stop, what the nemesis handed over last is done. */
        if (x->stop && x->nemesis_done) {
            break;
        }
        if (!x->stop && !x->o->no_members && tc_now_ms() >= next) {
            if (chaos_rnd(&rng) % 100 < 35) {
                transfer(x, &rng);
            } else {
                member_cycle(x, &rng,
                             (int)(chaos_rnd(&rng) % (uint64_t)x->c.n));
            }
            next = tc_now_ms() + 2000 + chaos_rnd(&rng) % 4000;
        }
        tc_sleep_ms(50);
    }
    return NULL;
}
