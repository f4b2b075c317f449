#include "tests/chaos/chaos.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idalloc.h"
#include "tests/chaos/proxy.h"
#include "tests/chaos/run.h"
#include "tests/lib/harness.h"

#define POOL_SIZE (1u << 20)

static const char *const fault_names[F_KINDS] = {
    "kill",  "kill-leader", "pause",       "pause-leader", "isolate-leader",
    "split", "one-way",     "restart-all", "wipe",         "rollback"};

const char *chaos_fault_name(enum chaos_fault f)
{
    return fault_names[f];
}

unsigned chaos_faults_total(const struct chaos_report *r)
{
    unsigned n = 0;
    for (int i = 0; i < F_KINDS; i++) {
        n += r->faults[i];
    }
    return n;
}

/* --- what the files of a run share (tests/chaos/run.h) -------------------- */

uint64_t chaos_rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

uint64_t chaos_now(struct run *x)
{
    return tc_now_ms() - x->t0;
}

void chaos_nap(struct run *x, uint64_t *rng, unsigned lo, unsigned hi)
{
    uint64_t end = tc_now_ms() + lo + chaos_rnd(rng) % (hi - lo + 1);
    while (tc_now_ms() < end && !x->stop) {
        tc_sleep_ms(20);
    }
}

bool chaos_minority(const struct run *x, unsigned set)
{
    int k = 0;
    for (int i = 0; i < x->c.n; i++) {
        k += (set >> i) & 1u;
    }
    return 2 * k < x->c.n;
}

void chaos_trace(struct run *x, const char *fmt, ...)
{
    static int on = -1;
    if (on < 0) {
        on = getenv("IDA_CHAOS_TRACE") != NULL;
    }
    if (!on) {
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    for (char *p = line; *p != '\0'; p++) {
        *p = *p == '\n' ? '|' : *p; /* one line per event */
    }
    fprintf(stderr, "chaos: %7.2f s: %s\n", (double)chaos_now(x) / 1000.0,
            line);
}

void chaos_failure(struct run *x, const char *fmt, ...)
{
    pthread_mutex_lock(&x->mu);
    unsigned k = x->r->failures++;
    if (k < 4) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->r->failure[k], sizeof(x->r->failure[k]), fmt, ap);
        va_end(ap);
        fprintf(stderr, "chaos: %s\n", x->r->failure[k]);
    }
    pthread_mutex_unlock(&x->mu);
}

int chaos_status(struct run *x, int i, struct idalloc_node_status *s)
{
    struct idalloc_client *cl = tc_client(&x->c, 300);
    int rv = idalloc_node_status(cl, (size_t)i, s, NULL);
    idalloc_client_free(cl);
    return rv;
}

int chaos_find_leader(struct run *x)
{
    struct idalloc_client *cl = tc_client(&x->c, 200);
    int best = -1;
    uint64_t term = 0;
    for (int i = 0; i < x->c.n; i++) {
        struct idalloc_node_status s;
        if (x->c.pid[i] != 0 &&
            idalloc_node_status(cl, (size_t)i, &s, NULL) == 0 &&
            strcmp(s.role, "leader") == 0 && s.term >= term) {
            best = i;
            term = s.term;
        }
    }
    idalloc_client_free(cl);
    return best;
}

int chaos_members(struct run *x, struct idalloc_member_list *l, unsigned ms)
{
    struct idalloc_client *cl = tc_client(&x->c, ms);
    int rv = idalloc_member_list(cl, l, NULL);
    idalloc_client_free(cl);
    return rv;
}

const struct idalloc_member *chaos_member(const struct idalloc_member_list *l,
                                          unsigned id,
                                          int waiting)
{
    for (size_t i = 0; i < l->n; i++) {
        if (l->members[i].id == id && l->members[i].waiting == waiting) {
            return &l->members[i];
        }
    }
    return NULL;
}

bool chaos_membership_whole(struct run *x, unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (chaos_members(x, &l, 1000) == 0) {
            bool whole = l.n == (size_t)x->c.n;
            for (unsigned id = 1; whole && id <= (unsigned)x->c.n; id++) {
                const struct idalloc_member *m = chaos_member(&l, id, 0);
                whole = m != NULL && m->voter;
            }
            if (whole) {
                return true;
            }
        }
        tc_sleep_ms(200);
    }
    return false;
}

/* --- setup and healing
 * ---------------------------------------------------------- */

/* The connect() shim (tests/chaos/shim/connect_shim.c, mk/chaos.mk):
 * $IDA_CHAOS_SHIM, else lib/ida_chaos_shim.so of the build this program is
 * part of ($(BUILD)/prog/chaos or $(BUILD)/tests/chaos/test_chaos). */
static bool shim_path(char *out, size_t cap)
{
    const char *e = getenv("IDA_CHAOS_SHIM");
    if (e != NULL) {
        snprintf(out, cap, "%s", e);
        return access(out, R_OK) == 0;
    }
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        return false;
    }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    static const char *const up[] = {"..", "../.."};
    for (int k = 0; k < 2; k++) {
        snprintf(out, cap, "%s/%s/lib/ida_chaos_shim.so", exe, up[k]);
        if (access(out, R_OK) == 0) {
            return true;
        }
    }
    return false;
}

/* Every node dials its peers at their real addresses (the one cluster file,
 * the membership); the preloaded shim sends node i's connections to node j
 * to the proxy of link i -> j. IDA_CHAOS_NO_SHIM=1 leaves the shim out:
 * the links then go around the proxy, and the run must fail (the negative
 * control of check_links()). */
static int route_through_proxy(struct run *x)
{
    struct tc *c = &x->c;
    char shim[600];
    if (!shim_path(shim, sizeof(shim))) {
        fprintf(stderr,
                "chaos: the connect() shim lib/ida_chaos_shim.so is not "
                "built (make; or set IDA_CHAOS_SHIM)\n");
        return -1;
    }
    const char *asan = getenv("ASAN_OPTIONS");
    for (int i = 0; i < c->n; i++) {
        char map[256] = "";
        size_t len = 0;
        for (int j = 0; j < c->n; j++) {
            if (j != i) {
                len += (size_t)snprintf(
                    map + len, sizeof(map) - len, "%s%u=%u", len > 0 ? "," : "",
                    c->cfg.nodes[j].peer.port, proxy_port(x->px, i, j));
            }
        }
        /* An ASan node refuses a preloaded library ahead of its runtime
         * unless told otherwise. */
        snprintf(c->node_env[i], sizeof(c->node_env[i]),
                 "%s%s IDA_CHAOS_CONNECT=%s "
                 "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
                 getenv("IDA_CHAOS_NO_SHIM") != NULL ? "" : "LD_PRELOAD=",
                 getenv("IDA_CHAOS_NO_SHIM") != NULL ? "" : shim, map,
                 asan != NULL ? asan : "", asan != NULL ? ":" : "");
    }
    return 0;
}

/* The last lines of each node's log, on stderr: why a cluster did not come
 * up (its directory is removed at the end). */
static void print_log_tails(const struct tc *c)
{
    for (int i = 0; i < c->n; i++) {
        char path[400], line[512], last[8][512];
        int n = 0;
        snprintf(path, sizeof(path), "%s/node%d.log", c->dir, i + 1);
        FILE *f = fopen(path, "r");
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            snprintf(last[n++ % 8], sizeof(last[0]), "%s", line);
        }
        if (f != NULL) {
            fclose(f);
        }
        fprintf(stderr, "chaos: node %d's log ends:\n", i + 1);
        for (int k = n > 8 ? n - 8 : 0; k < n; k++) {
            fprintf(stderr, "  %s", last[k % 8]);
        }
    }
}

static int setup(struct run *x)
{
    for (int attempt = 0;; attempt++) {
        /* One cluster file, for the nodes and for bin/idalloc (--config). */
        tc_setup(&x->c, x->o->nodes,
                 x->o->manual_rejoin
                     ? "snapshot_interval_entries 500\nauto_rejoin off\n"
                     : "snapshot_interval_entries 500\n");
        uint16_t ports[PROXY_NODES_MAX];
        for (int i = 0; i < x->c.n; i++) {
            ports[i] = x->c.cfg.nodes[i].peer.port;
        }
        x->px = proxy_start(x->c.n, ports);
        if (route_through_proxy(x) != 0) {
            return -1;
        }
        /* The file's ports were free when chosen, but a connection started
         * meanwhile may take one as its own local port: start again with
         * other ports, as tc_start() does. */
        if (!tc_spawn_all(&x->c) || attempt == 3) {
            break;
        }
        fprintf(stderr,
                "chaos: a node could not listen on its port; "
                "starting again on other ports\n");
        tc_destroy(&x->c);
        proxy_stop(x->px);
        x->px = NULL;
    }
    if (tc_wait_leader(&x->c, 15000) < 0) {
        fprintf(stderr, "chaos: no leader within 15 s\n");
        print_log_tails(&x->c);
        return -1;
    }
    struct idalloc_client *cl = tc_client(&x->c, 10000);
    int rv = idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, POOL_SIZE, NULL,
                                 NULL);
    rv = rv != 0 ? rv
                 : idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                       NULL);
    rv = rv != 0
             ? rv
             : idalloc_pool_create(cl, "p", IDALLOC_POOL_PREFIX, 0, NULL, NULL);
    idalloc_client_free(cl);
    if (rv != 0) {
        fprintf(stderr, "chaos: creating the pools failed: %s\n",
                idalloc_strerror(rv));
        print_log_tails(&x->c);
    }
    return rv == 0 ? 0 : -1;
}

/* The state letter of process @pid (R, S, T, Z...) or '?'. */
static char proc_state(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return '?';
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' ? p[2] : '?';
}

/* Nodes that ended by themselves since the nemesis last looked: failures
 * (heal() starts them again). */
static void ended_on_their_own(struct run *x)
{
    for (int i = 0; i < x->c.n; i++) {
        int st;
        if (tc_reap(&x->c, i, &st)) {
            chaos_node_ended(x, i, st);
        }
    }
}

static int heal(struct run *x)
{
    proxy_heal(x->px);
    for (int i = 0; i < x->c.n; i++) {
        if (x->c.pid[i] != 0) {
            kill(x->c.pid[i], SIGCONT);
        } else {
            tc_spawn(&x->c, i);
        }
    }
    if (tc_wait_leader(&x->c, 30000) >= 0) {
        return 0;
    }
    for (int i = 0; i < x->c.n; i++) {
        fprintf(stderr, "chaos: node %d pid %d state %c\n", i + 1,
                (int)x->c.pid[i], proc_state(x->c.pid[i]));
    }
    return -1;
}

/* --- figures
 * ------------------------------------------------------------------------ */

static int is_write(const struct hop *o)
{
    return o->kind != H_NEXT;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void figures(struct run *x, uint64_t end_ms)
{
    uint64_t *acks = calloc(x->h.n + 1, sizeof(*acks));
    size_t n = 0;
    for (size_t i = 0; i < x->h.n; i++) {
        if (x->h.v[i].out == O_OK && is_write(&x->h.v[i])) {
            acks[n++] = x->h.v[i].done_ms;
        }
    }
    qsort(acks, n, sizeof(*acks), cmp_u64);
    uint64_t prev = 0, longest = 0;
    for (size_t i = 0; i < n && acks[i] <= end_ms; i++) {
        longest = acks[i] - prev > longest ? acks[i] - prev : longest;
        prev = acks[i];
    }
    x->r->longest_unavailable_ms = longest;
    uint64_t d[4096];
    unsigned k = 0;
    for (unsigned i = 0; i < x->n_leader_kills; i++) {
        uint64_t t = x->leader_kills[i];
        for (size_t j = 0; j < n; j++) {
            if (acks[j] > t) {
                d[k++] = acks[j] - t;
                break;
            }
        }
    }
    qsort(d, k, sizeof(d[0]), cmp_u64);
    x->r->kill_samples = k;
    if (k > 0) {
        x->r->kill_to_write_p50_ms = d[k / 2];
        x->r->kill_to_write_p99_ms =
            d[(k * 99) / 100 < k ? (k * 99) / 100 : k - 1];
    }
    free(acks);
}

/* The socket inodes process @pid holds, into @v (up to @cap); how many. */
static size_t socket_inodes(pid_t pid, unsigned long *v, size_t cap)
{
    char dir[64], path[320], got[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    while (d != NULL && n < cap && (e = readdir(d)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, got, sizeof(got) - 1);
        if (k > 0) {
            got[k] = '\0';
            n += sscanf(got, "socket:[%lu]", &v[n]) == 1;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/* The links went through the proxy, or its faults cut nothing: every link
 * i -> j carried a connection through it, and no node holds a connection
 * of its own to another node's real peer port (/proc/net/tcp, owners by
 * their descriptors). Looked at with every node up after the run. */
static void check_links(struct run *x)
{
    struct tc *c = &x->c;
    for (int i = 0; i < c->n; i++) {
        for (int j = 0; j < c->n; j++) {
            if (i != j && proxy_opened(x->px, i, j) == 0) {
                chaos_failure(x,
                              "link %d -> %d never went through the fault "
                              "proxy",
                              i + 1, j + 1);
            }
        }
    }
    static unsigned long mine[TC_NODES_MAX][4096];
    size_t n_mine[TC_NODES_MAX] = {0};
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] != 0) {
            n_mine[i] = socket_inodes(c->pid[i], mine[i], 4096);
        }
    }
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned rp, st;
        unsigned long ino;
        if (sscanf(line,
                   " %*d: %*x:%*x %*x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
                   &rp, &st, &ino) != 3 ||
            st != 1 /* ESTABLISHED */) {
            continue;
        }
        for (int j = 0; j < c->n; j++) {
            if (rp != c->cfg.nodes[j].peer.port) {
                continue;
            }
            for (int i = 0; i < c->n; i++) {
                for (size_t k = 0; k < n_mine[i]; k++) {
                    if (mine[i][k] == ino && i != j) {
                        chaos_failure(x,
                                      "node %d is connected to node %d's "
                                      "peer port %u around the fault proxy",
                                      i + 1, j + 1, rp);
                    }
                }
            }
        }
    }
    if (f != NULL) {
        fclose(f);
    }
}

long chaos_run(const struct chaos_opts *o, struct chaos_report *r)
{
    static struct run x; /* big; one run at a time */
    memset(&x, 0, sizeof(x));
    memset(r, 0, sizeof(*r));
    x.o = o;
    x.r = r;
    x.replace_node = -1;
    x.rollback_node = -1;
    pthread_mutex_init(&x.mu, NULL);
    history_init(&x.h, POOL_SIZE);
    long result = -1;
    if (setup(&x) != 0) {
        fprintf(stderr, "chaos: the cluster did not come up\n");
        r->setup_failed = 1;
        goto out;
    }
    x.t0 = tc_now_ms();
    pthread_t nt, ot;
    chaos_clients_start(&x);
    pthread_create(&nt, NULL, chaos_nemesis_main, &x);
    pthread_create(&ot, NULL, chaos_operator_main, &x);
    tc_sleep_ms(o->duration_s * 1000);
    x.stop = 1;
    /* The nemesis ends its fault (a rollback being caught up included),
     * then the operator ends its action and what the nemesis handed it. */
    pthread_join(nt, NULL);
    chaos_clients_join(&x);
    uint64_t end = chaos_now(&x);
    pthread_join(ot, NULL);
    ended_on_their_own(&x);
    if (heal(&x) != 0) {
        fprintf(stderr, "chaos: no leader after healing\n");
        r->setup_failed = 1;
        goto out;
    }
    r->membership_whole = chaos_membership_whole(&x, 60000);
    if (!r->membership_whole) {
        chaos_failure(&x,
                      "the membership is not every node as a voter "
                      "60 s after healing");
    }
    char out[64];
    if (o->manual_rejoin &&
        tc_run(out, sizeof(out),
               "cat %s/node*.log | grep -c 'membership: re-admitting'",
               x.c.dir) == 0) {
        /* The replacements must have been the operator's. */
        chaos_failure(&x,
                      "auto_rejoin off, yet %ld automatic re-admission "
                      "step(s) in the nodes' logs",
                      atol(out));
    }
    chaos_resolve(&x);
    chaos_replay_acked(&x);
    chaos_read_final(&x);
    if (!x.h.final_known) {
        /* Without it the checks of the final state do not run. */
        chaos_failure(&x,
                      "the final holdings could not be read after "
                      "healing (see the line above)");
    }
    ended_on_their_own(&x);
    figures(&x, end);
    result = (long)history_check(&x.h, &r->check);
    chaos_definite_failures(&x);
    check_links(&x);
    if (o->history_path != NULL) {
        FILE *f = fopen(o->history_path, "w");
        if (f != NULL) {
            history_write(&x.h, f);
            fclose(f);
        }
    }
out:
    if (x.px != NULL) {
        proxy_heal(x.px);
    }
    tc_destroy(&x.c);
    if (x.px != NULL) {
        proxy_stop(x.px);
    }
    history_free(&x.h);
    pthread_mutex_destroy(&x.mu);
    return result;
}

void chaos_report_print(const struct chaos_opts *o,
                        const struct chaos_report *r)
{
    printf("chaos: %u s, %d nodes, seed %llu, %u clients\n", o->duration_s,
           o->nodes, (unsigned long long)o->seed, o->clients);
    printf("faults: %u total:", chaos_faults_total(r));
    for (int i = 0; i < F_KINDS; i++) {
        printf(" %s=%u", fault_names[i], r->faults[i]);
    }
    printf("\n");
    printf(
        "availability rule (never more than a minority unavailable): %u "
        "fault(s) moved onto an unavailable node, %u skipped\n",
        r->moved, r->skipped);
    const struct chaos_members *m = &r->m;
    printf(
        "operator (bin/idalloc, auto_rejoin %s): %u remove/add/promote "
        "cycle(s), %u manual replacement(s), %u re-admission(s) by the "
        "leader, %u leader transfer(s) (+%u not completed), %u action(s) "
        "postponed; steps done remove=%u add=%u promote=%u (%u answered "
        "already so); %u command(s), exit 0/1/3/other %u/%u/%u/%u\n",
        o->manual_rejoin ? "off" : "on", m->cycles, m->replacements,
        m->readmissions, m->transfers, m->transfers_failed, m->postponed,
        m->removes, m->adds, m->promotes, m->already, m->commands, m->exits[0],
        m->exits[1], m->exits[2], m->exits[3]);
    if (o->rollback) {
        printf(
            "rollbacks: %u cop(ies), %u restored (%u with a log ending below "
            "the leader's commit index at the kill, by %llu entries on "
            "average, %llu at most): %u stopped by rule A4 and re-admitted "
            "as a new incarnation, %u caught up unnoticed; %u cop(ies) "
            "never restored\n",
            r->rb.copies, r->rb.restored, r->rb.rewound,
            (unsigned long long)(r->rb.rewound > 0
                                     ? r->rb.rewound_sum / r->rb.rewound
                                     : 0),
            (unsigned long long)r->rb.rewound_max, r->rb.detected,
            r->rb.caught_up, r->rb.dropped);
    }
    printf("membership after healing: %s\n",
           r->membership_whole ? "every node a voter" : "NOT WHOLE");
    printf(
        "client operations with a definite error: %zu; unknown outcomes "
        "learnt by the client's own repeat during the run: %u\n",
        r->definite, r->settled_in_run);
    printf("liveness failures: %u\n", r->failures);
    for (unsigned i = 0; i < r->failures && i < 4; i++) {
        printf("  failure: %s\n", r->failure[i]);
    }
    check_report_print(&r->check, stdout);
    printf("longest write unavailability: %llu ms\n",
           (unsigned long long)r->longest_unavailable_ms);
    printf(
        "leader kill -> next acknowledged write: p50=%llu ms p99=%llu ms "
        "(%u kills)\n",
        (unsigned long long)r->kill_to_write_p50_ms,
        (unsigned long long)r->kill_to_write_p99_ms, r->kill_samples);
}
