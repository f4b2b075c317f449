/* The nemesis of a chaos run (tests/chaos/run.h): one fault at a time,
 * drawn from the seed, within the availability rule. Wiped nodes are
 * handed to the operator (operator.c); the rollback nemesis waits here,
 * with every other fault held back, until rule A4 stopped its node and the
 * node was re-admitted, or it caught up unnoticed. A node that ends by
 * itself otherwise is a failure. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/chaos/proxy.h"
#include "tests/chaos/run.h"

#define BIT(i) (1u << (unsigned)(i))

/* A fault to inject: its kind, the nodes it touches (@set) and what it
 * needs to be carried out. */
struct plan
{
    enum chaos_fault kind;
    int target;
    int other;   /* split: the second node of the minority side, or -1 */
    int variant; /* one-way: 0 the leader hears nobody, 1 one link */
    unsigned set;
    bool whole;
};

static void isolate(struct run *x, int node, int both_ways)
{
    for (int j = 0; j < x->c.n; j++) {
        if (j != node) {
            proxy_block(x->px, node, j, 1);
            if (both_ways) {
                proxy_block(x->px, j, node, 1);
            }
        }
    }
}

/* Under the rule, start a fault on @p->set (the check and the mark in one
 * critical section, so the operator sees it before it acts). During a
 * freeze only reserved nodes may be touched. */
static bool fault_begin(struct run *x, const struct plan *p)
{
    pthread_mutex_lock(&x->mu);
    bool ok;
    if (p->whole) {
        ok =
            x->unavail == 0 && !x->freeze && !x->op_busy && x->replace_node < 0;
    } else {
        ok = chaos_minority(x, x->unavail | p->set) &&
             (!x->freeze || (p->set & ~x->unavail) == 0);
    }
    if (ok) {
        x->faulted = p->set;
    }
    pthread_mutex_unlock(&x->mu);
    return ok;
}

static void fault_end(struct run *x)
{
    pthread_mutex_lock(&x->mu);
    x->faulted = 0;
    pthread_mutex_unlock(&x->mu);
}

/* --- nodes that end on their own ---------------------------------------- */

/* How many times node @i's log says rule A4 stopped it (raft/admission.h:
 * its peers showed that its directory went back to an older copy). */
static long a4_lines(struct run *x, int i)
{
    char out[64];
    if (tc_run(out, sizeof(out),
               "grep -c 'its state went back to an older copy' %s/node%d.log",
               x->c.dir, i + 1) > 1) {
        return -1;
    }
    return atol(out);
}

void chaos_node_ended(struct run *x, int i, int status)
{
    char how[32], line[256];
    if (WIFEXITED(status)) {
        snprintf(how, sizeof(how), "exit %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        snprintf(how, sizeof(how), "signal %d", WTERMSIG(status));
    } else {
        snprintf(how, sizeof(how), "status %#x", (unsigned)status);
    }
    tc_run(line, sizeof(line),
           "grep ' ERROR ' %s/node%d.log | tail -1 | cut -c1-160", x->c.dir,
           i + 1);
    line[strcspn(line, "\n")] = '\0';
    chaos_failure(x, "node %d ended on its own (%s): %s", i + 1, how,
                  line[0] != '\0' ? line : "no ERROR line in its log");
}

/* kill -9 node @i; one that had ended on its own before is a failure. */
static void kill9(struct run *x, int i)
{
    if (x->c.pid[i] == 0) {
        return;
    }
    int st = tc_signal(&x->c, i, SIGKILL);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
        chaos_node_ended(x, i, st);
    }
}

/* Every node but @skip that ended on its own since the last look: a
 * failure (a crash, a storage stop, rule A4 on a node whose directory never
 * went back); started again so the run goes on. */
static void check_exits(struct run *x, int skip)
{
    for (int i = 0; i < x->c.n; i++) {
        int st;
        if (i != skip && tc_reap(&x->c, i, &st)) {
            chaos_node_ended(x, i, st);
            tc_spawn(&x->c, i);
        }
    }
}

static void draw(struct run *x,
                 uint64_t *rng,
                 int r,
                 int leader,
                 int target,
                 struct plan *p)
{
    int n = x->c.n;
    memset(p, 0, sizeof(*p));
    p->other = -1;
    if (r < 50) { /* kill -9, the leader most of the time */
        bool lead = leader >= 0 && chaos_rnd(rng) % 100 < 70;
        p->kind = lead ? F_KILL_LEADER : F_KILL;
        p->target = lead ? leader : target;
    } else if (r < 68) { /* pause longer than an election timeout */
        bool lead = leader >= 0 && chaos_rnd(rng) % 2 == 0;
        p->kind = lead ? F_PAUSE_LEADER : F_PAUSE;
        p->target = lead ? leader : target;
    } else if (r < 95) { /* partitions */
        int kind = (int)(chaos_rnd(rng) % 3);
        if (kind == 0 && leader >= 0) {
            p->kind = F_ISOLATE_LEADER;
            p->target = leader;
        } else if (kind == 1 || leader < 0) {
            /* Minority / majority: with 5 nodes two go together. */
            p->kind = F_SPLIT;
            p->target = target;
            p->other = n == 5 ? (target + 1) % n : -1;
        } else {
            /* One-way loss: the leader can send but hears nobody (it is
             * as good as gone), or one link dies in one direction (its
             * sender counts as gone: the others stay fully connected). */
            p->kind = F_ONE_WAY;
            p->variant = (int)(chaos_rnd(rng) % 2);
            p->target = p->variant == 0 ? leader : target;
        }
    } else { /* every node at once */
        p->kind = F_RESTART_ALL;
        p->whole = true;
        p->set = (1u << (unsigned)n) - 1;
        return;
    }
    p->set = BIT(p->target) | (p->other >= 0 ? BIT(p->other) : 0);
}

/* The drawn fault would break the rule: the same kind of trouble for a
 * node that is unavailable anyway (kill, pause or cut it off). */
static bool move_to_unavailable(struct run *x, uint64_t *rng, struct plan *p)
{
    pthread_mutex_lock(&x->mu);
    unsigned u = x->unavail;
    pthread_mutex_unlock(&x->mu);
    int cand[TC_NODES_MAX], k = 0;
    for (int i = 0; i < x->c.n; i++) {
        if (u & BIT(i)) {
            cand[k++] = i;
        }
    }
    if (k == 0) {
        return false;
    }
    static const enum chaos_fault kinds[3] = {F_KILL, F_PAUSE, F_SPLIT};
    memset(p, 0, sizeof(*p));
    p->kind = kinds[chaos_rnd(rng) % 3];
    p->target = cand[chaos_rnd(rng) % (uint64_t)k];
    p->other = -1;
    p->set = BIT(p->target);
    return true;
}

static void carry_out(struct run *x, uint64_t *rng, const struct plan *p)
{
    int n = x->c.n;
    struct chaos_report *rep = x->r;
    rep->faults[p->kind]++;
    if (p->kind == F_RESTART_ALL) {
        chaos_trace(x, "nemesis: restart-all");
    } else {
        chaos_trace(
            x, "nemesis: %s node %d%s", chaos_fault_name(p->kind),
            p->target + 1,
            p->kind == F_ONE_WAY && p->variant == 0 ? " (hears nobody)" : "");
    }
    switch (p->kind) {
        case F_KILL:
        case F_KILL_LEADER:
            if (p->kind == F_KILL_LEADER) {
                pthread_mutex_lock(&x->mu);
                if (x->n_leader_kills < 4096) {
                    x->leader_kills[x->n_leader_kills++] = chaos_now(x);
                }
                pthread_mutex_unlock(&x->mu);
            }
            kill9(x, p->target);
            chaos_nap(x, rng, 200, 1500);
            tc_spawn(&x->c, p->target);
            break;
        case F_PAUSE:
        case F_PAUSE_LEADER: {
            pid_t pid = x->c.pid[p->target];
            if (pid <= 0) {
                break; /* kill(0) would stop the whole process group */
            }
            kill(pid, SIGSTOP);
            chaos_nap(x, rng, 500, 1500);
            kill(pid, SIGCONT);
            break;
        }
        case F_ISOLATE_LEADER:
        case F_SPLIT:
        case F_ONE_WAY:
            if (p->kind == F_ISOLATE_LEADER) {
                isolate(x, p->target, 1);
            } else if (p->kind == F_SPLIT) {
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < n; j++) {
                        int si = i == p->target || i == p->other;
                        int sj = j == p->target || j == p->other;
                        if (i != j && si != sj) {
                            proxy_block(x->px, i, j, 1);
                        }
                    }
                }
            } else if (p->variant == 0) {
                for (int j = 0; j < n; j++) {
                    if (j != p->target) {
                        proxy_block(x->px, j, p->target, 1);
                    }
                }
            } else {
                proxy_block(x->px, p->target, (p->target + 1) % n, 1);
            }
            chaos_nap(x, rng, 800, 2500);
            proxy_heal(x->px);
            break;
        case F_RESTART_ALL:
            for (int i = 0; i < n; i++) {
                kill9(x, i);
            }
            for (int i = 0; i < n; i++) {
                tc_spawn(&x->c, i);
            }
            break;
        default:
            break;
    }
}

/* --- wipe ----------------------------------------------------------------- */

/* Delete a follower's data directory and restart it empty, as after a
 * replaced disk. It stays reserved until the operator saw it re-admitted
 * (by the leader, or by the Runbook's steps with manual_rejoin). One at a
 * time: two lost disks of three are a lost majority, which no system
 * survives without losing data. */
static bool wipe(struct run *x, int leader, int target)
{
    if (leader < 0 || target == leader || x->c.pid[target] == 0) {
        return false;
    }
    struct idalloc_member_list l;
    if (chaos_members(x, &l, 1000) != 0) {
        return false;
    }
    const struct idalloc_member *m = chaos_member(&l, (unsigned)target + 1, 0);
    if (m == NULL || !m->voter ||
        chaos_member(&l, (unsigned)target + 1, 1) != NULL) {
        return false; /* not a settled voter */
    }
    pthread_mutex_lock(&x->mu);
    bool ok = x->replace_node < 0 && x->rollback_node != target && !x->freeze &&
              (x->unavail & BIT(target)) == 0 &&
              chaos_minority(x, x->unavail | BIT(target));
    if (ok) {
        x->unavail |= BIT(target);
    }
    pthread_mutex_unlock(&x->mu);
    if (!ok) {
        return false;
    }
    kill9(x, target);
    char out[64];
    tc_run(out, sizeof(out), "rm -rf %s/data/node%d", x->c.dir, target + 1);
    tc_spawn(&x->c, target);
    chaos_trace(x, "nemesis: wipe node %d (incarnation %016llx)", target + 1,
                (unsigned long long)m->incarnation);
    pthread_mutex_lock(&x->mu);
    x->replace_node = target;
    x->replace_old_inc = m->incarnation;
    pthread_mutex_unlock(&x->mu);
    return true;
}

/* --- rollback ------------------------------------------------------------- */

static char rb_copy[400];
static uint64_t rb_copied_ms, rb_wait_ms;

/* Copy a follower's data directory while it is paused (LMDB's files are
 * then as after a kill -9: consistent). The node goes on; the copy is
 * restored later by rollback_restore(). */
static bool rollback_copy(struct run *x, uint64_t *rng, int leader)
{
    if (leader < 0) {
        return false;
    }
    int n = x->c.n;
    int target = (leader + 1 + (int)(chaos_rnd(rng) % (uint64_t)(n - 1))) % n;
    if (x->c.pid[target] <= 0) {
        return false;
    }
    struct plan p = {.kind = F_PAUSE, .target = target, .other = -1};
    p.set = BIT(target);
    pthread_mutex_lock(&x->mu);
    bool ok = x->rollback_node < 0 && x->replace_node != target &&
              (x->unavail & BIT(target)) == 0;
    if (ok) {
        x->rollback_node = target; /* the operator leaves it alone */
    }
    pthread_mutex_unlock(&x->mu);
    if (!ok) {
        return false;
    }
    if (!fault_begin(x, &p)) {
        pthread_mutex_lock(&x->mu);
        x->rollback_node = -1;
        pthread_mutex_unlock(&x->mu);
        return false;
    }
    snprintf(rb_copy, sizeof(rb_copy), "%s/rollback-copy", x->c.dir);
    char out[256];
    kill(x->c.pid[target], SIGSTOP);
    int rc =
        tc_run(out, sizeof(out), "rm -rf %s && cp -a %s/data/node%d %s 2>&1",
               rb_copy, x->c.dir, target + 1, rb_copy);
    kill(x->c.pid[target], SIGCONT);
    fault_end(x);
    if (rc != 0) {
        chaos_failure(x, "rollback: copying node %d's directory: %s",
                      target + 1, out);
        pthread_mutex_lock(&x->mu);
        x->rollback_node = -1;
        pthread_mutex_unlock(&x->mu);
        return false;
    }
    x->r->rb.copies++;
    chaos_trace(x, "nemesis: rollback: node %d's directory copied", target + 1);
    rb_copied_ms = tc_now_ms();
    rb_wait_ms = 3000 + chaos_rnd(rng) % 9000;
    return true;
}

/* How many times node @i logged its start ("node: restored ..."); with
 * @last, the last such line's last log index (or snapshot index). */
static long restored_lines(struct run *x, int i, uint64_t *last)
{
    char out[512];
    if (tc_run(out, sizeof(out), "grep -c 'node: restored' %s/node%d.log",
               x->c.dir, i + 1) > 1) {
        return -1;
    }
    long k = atol(out);
    if (last != NULL && k > 0) {
        tc_run(out, sizeof(out),
               "grep 'node: restored' %s/node%d.log | tail -1", x->c.dir,
               i + 1);
        unsigned long long snap = 0, lo = 0, hi = 0;
        const char *p = strstr(out, "snapshot=");
        if (p == NULL ||
            sscanf(p, "snapshot=%llu log=%llu..%llu", &snap, &lo, &hi) != 3) {
            return -1;
        }
        *last = hi > snap ? hi : snap;
    }
    return k;
}

static void rollback_forget(struct run *x)
{
    char out[64];
    tc_run(out, sizeof(out), "rm -rf %s", rb_copy);
    pthread_mutex_lock(&x->mu);
    x->rollback_node = -1;
    pthread_mutex_unlock(&x->mu);
}

/* Rule A4 stopped node @t: the Runbook's remedy, "delete the directory and
 * start the node; it rejoins as a new incarnation", re-admitted by the
 * leader or by hand (--manual-rejoin) through the operator. Waits for it
 * (the node stays reserved and the freeze on until then). */
static void rollback_remedy(struct run *x, int t, uint64_t inc)
{
    char out[64];
    tc_run(out, sizeof(out), "rm -rf %s/data/node%d", x->c.dir, t + 1);
    tc_spawn(&x->c, t);
    pthread_mutex_lock(&x->mu);
    x->replace_node = t;
    x->replace_old_inc = inc;
    pthread_mutex_unlock(&x->mu);
    for (uint64_t end = tc_now_ms() + 150000; tc_now_ms() < end;) {
        pthread_mutex_lock(&x->mu);
        bool done = x->replace_node < 0;
        pthread_mutex_unlock(&x->mu);
        if (done) {
            return;
        }
        tc_sleep_ms(100);
    }
    chaos_failure(x, "rollback: node %d not re-admitted after rule A4", t + 1);
}

/* After a restore: either rule A4 stops node @t (its log says so, exit 1),
 * then the remedy; or it catches up unnoticed: its term reached @term0, it
 * applied what the leader had committed at the kill (@commit0) and it is a
 * voter with no waiting line. @a4 is how many A4 lines its log had before
 * the restore; @inc its incarnation. */
static void rollback_settle(struct run *x,
                            int t,
                            uint64_t commit0,
                            uint64_t term0,
                            long a4,
                            uint64_t inc)
{
    int good = 0;
    uint64_t t0 = tc_now_ms(), end = t0 + 90000;
    while (good < 3 && tc_now_ms() < end) {
        int st;
        if (tc_reap(&x->c, t, &st)) {
            if (WIFEXITED(st) && WEXITSTATUS(st) == 1 && a4_lines(x, t) > a4) {
                x->r->rb.detected++;
                chaos_trace(x,
                            "nemesis: rollback: rule A4 stopped node %d "
                            "after %.1f s",
                            t + 1, (double)(tc_now_ms() - t0) / 1000.0);
                rollback_remedy(x, t, inc);
                return;
            }
            chaos_node_ended(x, t, st);
            tc_spawn(&x->c, t);
        }
        struct idalloc_member_list l;
        bool in = false;
        if (chaos_members(x, &l, 1000) == 0) {
            const struct idalloc_member *m =
                chaos_member(&l, (unsigned)t + 1, 0);
            in = m != NULL && m->voter &&
                 chaos_member(&l, (unsigned)t + 1, 1) == NULL;
        }
        struct idalloc_node_status s;
        bool caught = chaos_status(x, t, &s) == 0 && s.term >= term0 &&
                      s.applied_index >= commit0;
        good = in && caught ? good + 1 : 0;
        if (good < 3) {
            tc_sleep_ms(100);
        }
    }
    if (good < 3) {
        chaos_failure(x,
                      "rollback: node %d neither stopped by rule A4 nor "
                      "caught up to index %llu term %llu within 90 s",
                      t + 1, (unsigned long long)commit0,
                      (unsigned long long)term0);
        return;
    }
    x->r->rb.caught_up++;
    chaos_trace(x, "nemesis: rollback: node %d caught up, not detected", t + 1);
}

/* Kill the node whose copy was taken, put the copy back, restart it. Only
 * when nothing else is going on and every running node follows the same
 * leader; then every other fault and operator action waits (a freeze)
 * until rule A4 stopped it and it was re-admitted, or it caught up: a
 * leader change before that could elect a log without entries it had
 * acknowledged (rule A4 cannot see a copy once the leader that counted its
 * acknowledgements is gone). */
static bool rollback_restore(struct run *x)
{
    int t = x->rollback_node;
    pthread_mutex_lock(&x->mu);
    bool ok = !x->freeze && !x->op_busy && x->replace_node < 0 &&
              x->faulted == 0 && (x->unavail & BIT(t)) == 0 &&
              chaos_minority(x, x->unavail | BIT(t));
    if (ok) {
        x->freeze = true;
        x->unavail |= BIT(t);
    }
    pthread_mutex_unlock(&x->mu);
    if (!ok) {
        return false;
    }
    int leader = tc_wait_leader(&x->c, 300);
    struct idalloc_node_status ls;
    struct idalloc_member_list l;
    const struct idalloc_member *m = NULL;
    if (leader >= 0 && leader != t && x->c.pid[t] > 0 &&
        chaos_status(x, leader, &ls) == 0 && chaos_members(x, &l, 1000) == 0) {
        m = chaos_member(&l, (unsigned)t + 1, 0);
    }
    long a4 = a4_lines(x, t);
    if (m == NULL || !m->voter || a4 < 0) {
        pthread_mutex_lock(&x->mu);
        x->freeze = false;
        x->unavail &= ~BIT(t);
        pthread_mutex_unlock(&x->mu);
        return false;
    }
    uint64_t inc = m->incarnation;
    long starts = restored_lines(x, t, NULL);
    kill9(x, t);
    /* What the leader committed up to the kill (a later status can only
     * be higher: the node must reach at least this). */
    struct idalloc_node_status after;
    if (chaos_status(x, leader, &after) == 0 && after.term == ls.term &&
        after.commit_index > ls.commit_index) {
        ls = after;
    }
    char out[256];
    int rc = tc_run(out, sizeof(out),
                    "rm -rf %s/data/node%d && cp -a %s %s/data/node%d 2>&1",
                    x->c.dir, t + 1, rb_copy, x->c.dir, t + 1);
    tc_spawn(&x->c, t);
    /* Did the disk go back? The node's start line says where its log ends:
     * below what the cluster had committed when it was killed, whatever
     * it acknowledged of that is gone from its disk. */
    uint64_t last = 0;
    long k = -1;
    for (uint64_t end = tc_now_ms() + 10000;
         rc == 0 && tc_now_ms() < end &&
         (k = restored_lines(x, t, &last)) >= 0 && k <= starts;) {
        tc_sleep_ms(50);
    }
    if (rc == 0 && k > starts && last < ls.commit_index) {
        uint64_t d = ls.commit_index - last;
        x->r->rb.rewound++;
        x->r->rb.rewound_sum += d;
        x->r->rb.rewound_max =
            d > x->r->rb.rewound_max ? d : x->r->rb.rewound_max;
    }
    if (rc != 0) {
        chaos_failure(x, "rollback: restoring node %d: %s", t + 1, out);
    } else {
        chaos_trace(x,
                    "nemesis: rollback: node %d restarted from its copy, "
                    "its log ending at %llu (leader %d had committed %llu "
                    "in term %llu)",
                    t + 1, (unsigned long long)last, leader + 1,
                    (unsigned long long)ls.commit_index,
                    (unsigned long long)ls.term);
        x->r->faults[F_ROLLBACK]++;
        x->r->rb.restored++;
        rollback_settle(x, t, ls.commit_index, ls.term, a4, inc);
    }
    rollback_forget(x);
    pthread_mutex_lock(&x->mu);
    x->freeze = false;
    x->unavail &= ~BIT(t);
    pthread_mutex_unlock(&x->mu);
    return true;
}

/* --- the loop ------------------------------------------------------------- */

static void fault(struct run *x, uint64_t *rng)
{
    int n = x->c.n;
    check_exits(x, -1);
    int leader = chaos_find_leader(x);
    int r = (int)(chaos_rnd(rng) % 100);
    int target = (int)(chaos_rnd(rng) % (uint64_t)n);
    struct chaos_report *rep = x->r;
    if (x->o->rollback && x->rollback_node >= 0) {
        uint64_t age = tc_now_ms() - rb_copied_ms;
        if (age >= rb_wait_ms && rollback_restore(x)) {
            return;
        }
        if (age > 90000) { /* never the right moment */
            rep->rb.dropped++;
            rollback_forget(x);
        }
    }
    if (x->o->rollback && x->rollback_node < 0 && r < 10 &&
        rollback_copy(x, rng, leader)) {
        return;
    }
    if (r < 12 && wipe(x, leader, target)) {
        rep->faults[F_WIPE]++;
        chaos_nap(x, rng, 500, 1500);
        return;
    }
    struct plan p;
    draw(x, rng, r < 12 ? 12 : r, leader, target, &p);
    if (!fault_begin(x, &p)) {
        /* A third of them land on the unavailable node, the others are
         * skipped: a node being re-admitted needs moments without faults
         * to catch up (with half, a learner took 25 s to be promoted). */
        if (chaos_rnd(rng) % 3 != 0 || !move_to_unavailable(x, rng, &p) ||
            !fault_begin(x, &p)) {
            rep->skipped++;
            return;
        }
        rep->moved++;
    }
    carry_out(x, rng, &p);
    fault_end(x);
}

void *chaos_nemesis_main(void *arg)
{
    struct run *x = arg;
    uint64_t rng = x->o->seed * 0x9e3779b97f4a7c15ull + 1;
    while (!x->stop) {
        chaos_nap(x, &rng, 200, 700);
        if (!x->stop) {
            fault(x, &rng);
        }
    }
    if (x->rollback_node >= 0) {
        x->r->rb.dropped++;
        rollback_forget(x);
    }
    check_exits(x, -1);
    x->nemesis_done = 1;
    return NULL;
}
