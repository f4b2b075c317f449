/* _GNU_SOURCE for gettid() and close_range(): see tc_spawn(). */
#define _GNU_SOURCE
#include "tests/lib/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The harness also runs inside benchmarks (no Criterion): a failed check
 * prints and aborts, which a Criterion test reports as a crash. */
#define TC_CHECK(cond, ...)                                          \
    do {                                                             \
        if (!(cond)) {                                               \
            fprintf(stderr, "harness: %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                            \
            fprintf(stderr, "\n");                                   \
            abort();                                                 \
        }                                                            \
    } while (0)

uint64_t tc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void tc_sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

const char *tc_bin(const char *name)
{
    /* Per thread: the chaos nemesis spawns nodes while its operator runs
     * bin/idalloc. */
    static _Thread_local char path[4][512];
    static _Thread_local int k;
    const char *dir = getenv("IDA_BINDIR");
    char *p = path[k++ % 4];
    snprintf(p, sizeof(path[0]), "%s/%s", dir != NULL ? dir : "bin", name);
    return p;
}

/* Ports for test nodes come from below the kernel's ephemeral range
 * (/proc/sys/net/ipv4/ip_local_port_range). A port from bind(0) is an
 * ephemeral one, and between the moment a test picks it and the moment a
 * node listens on it, any outgoing connection may take it as its local
 * port: our nodes dial each other all the time, and stop 36's CI failed so
 * ("cannot listen on client address ...: address already in use" in
 * test_net). Below that range no connect() ever lands. A port is drawn at
 * random there (concurrent test runs rarely meet), checked free by binding
 * it without SO_REUSEADDR (a TIME_WAIT on it counts as taken), and never
 * handed out twice by one process. Where the range leaves no room below
 * it, the kernel's bind(0) is the fallback. */
#define TC_PORT_FLOOR 10000u

static unsigned ephemeral_low(void)
{
    unsigned lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2) {
            lo = 32768;
        }
        fclose(f);
    }
    return lo;
}

/* Whether 127.0.0.1:@port could be bound just now (0 = ask the kernel);
 * the port bound is stored in *@got. */
static int try_bind(unsigned port, unsigned *got)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    TC_CHECK(fd >= 0, "socket failed");
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    socklen_t l = sizeof(a);
    if (ok) {
        ok = getsockname(fd, (struct sockaddr *)&a, &l) == 0;
        *got = ntohs(a.sin_port);
    }
    close(fd);
    return ok;
}

unsigned tc_free_port(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint8_t given[65536 / 8];
    static unsigned span, left;
    static uint64_t rng;
    pthread_mutex_lock(&mu);
    if (rng == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rng = (((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
               (uint64_t)ts.tv_sec) |
              1;
        unsigned lo = ephemeral_low();
        span = lo > TC_PORT_FLOOR + 1000 ? lo - TC_PORT_FLOOR : 0;
        left = span;
    }
    unsigned port = 0;
    for (int tries = 0; port == 0; tries++) {
        unsigned p = 0;
        if (span > 0 && left > 0 && tries < 10000) {
            rng ^= rng << 13; /* xorshift64 */
            rng ^= rng >> 7;
            rng ^= rng << 17;
            p = TC_PORT_FLOOR + (unsigned)(rng % span);
        }
        unsigned got = 0;
        if ((given[p / 8] & (1u << (p % 8))) == 0 && try_bind(p, &got) &&
            (given[got / 8] & (1u << (got % 8))) == 0) {
            port = got;
        }
        TC_CHECK(tries < 20000, "no free loopback port found");
    }
    given[port / 8] |= (uint8_t)(1u << (port % 8));
    if (port >= TC_PORT_FLOOR && port < TC_PORT_FLOOR + span && left > 0) {
        left--;
    }
    pthread_mutex_unlock(&mu);
    return port;
}

void tc_spawn(struct tc *c, int i)
{
    TC_CHECK(c->pid[i] == 0, "node %d already running", i + 1);
    char log[400], id[16];
    snprintf(log, sizeof(log), "%s/node%d.log", c->dir, i + 1);
    snprintf(id, sizeof(id), "%d", i + 1);
    const char *bin = tc_bin("idallocd");
    int main_thread = getpid() == gettid();
    pid_t pid = fork();
    TC_CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
        /* Die with the test: no node outlives a crashed test. The signal
         * comes when the forking *thread* ends, so only children of the
         * main thread can use it (the chaos nemesis restarts nodes from a
         * thread of its own; tc_destroy() stops those). */
        if (main_thread) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
        }
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        dup2(fd, 1);
        /* Nothing of the test's (sockets, pipes) leaks into the node: an
         * inherited copy keeps a connection open after the test closed it. */
        close_range(3, ~0u, 0);
        if (c->nofile != 0) {
            struct rlimit rl = {.rlim_cur = c->nofile < 1024 ? c->nofile : 1024,
                                .rlim_max = c->nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        const char *conf =
            c->node_conf[i][0] != '\0' ? c->node_conf[i] : c->conf;
        char *argv[32] = {(char *)bin, "--config", (char *)conf, "--node", id};
        int argc = 5;
        static char extra[sizeof(c->node_args[0])];
        snprintf(extra, sizeof(extra), "%s", c->node_args[i]);
        for (char *t = strtok(extra, " "); t != NULL && argc < 31;
             t = strtok(NULL, " ")) {
            argv[argc++] = t;
        }
        argv[argc] = NULL;
        /* The environment: the test's, each variable of node_env[i] over
         * the test's of that name (static arrays: no malloc after fork). */
        static char env[sizeof(c->node_env[0])];
        static char *envp[1024];
        char *set[64];
        int nset = 0, ne = 0;
        snprintf(env, sizeof(env), "%s", c->node_env[i]);
        for (char *t = strtok(env, " "); t != NULL && nset < 64;
             t = strtok(NULL, " ")) {
            set[nset++] = t;
        }
        for (char **e = environ; *e != NULL && ne < 1023 - nset; e++) {
            int over = 0;
            for (int k = 0; k < nset && !over; k++) {
                size_t l = strcspn(set[k], "=");
                over = strncmp(*e, set[k], l) == 0 && (*e)[l] == '=';
            }
            if (!over) {
                envp[ne++] = *e;
            }
        }
        for (int k = 0; k < nset; k++) {
            envp[ne++] = set[k];
        }
        envp[ne] = NULL;
        execve(bin, argv, envp);
        _exit(127);
    }
    c->pid[i] = pid;
}

void tc_setup(struct tc *c, int n, const char *extra)
{
    memset(c, 0, sizeof(*c));
    c->n = n;
    snprintf(c->dir, sizeof(c->dir), "/tmp/ida-cluster-XXXXXX");
    TC_CHECK(mkdtemp(c->dir) != NULL, "mkdtemp failed");
    snprintf(c->conf, sizeof(c->conf), "%s/cluster.conf", c->dir);
    FILE *f = fopen(c->conf, "w");
    TC_CHECK(f != NULL, "cannot write %s", c->conf);
    fprintf(f, "cluster test\ndata_dir %s/data\n", c->dir);
    /* Peers speak mutual TLS, as `make run` does: a CA and certificates of
     * this test alone (a few ms of key generation). */
    snprintf(c->tls, sizeof(c->tls), "%s/tls", c->dir);
    char out[512];
    int rc = tc_run(out, sizeof(out),
                    "%s certs create %s --nodes %d "
                    "--clients 2 2>&1",
                    tc_bin("idalloc"), c->tls, n);
    TC_CHECK(rc == 0, "certs create failed: %s", out);
    if (extra == NULL || strstr(extra, "tls_dir") == NULL) {
        fprintf(f, "tls_dir tls\n");
    }
    fprintf(f, "election_timeout_ms 300\nheartbeat_ms 50\n");
    /* tc_free_port() never hands out a port twice: every address of the
     * file is distinct. */
    unsigned used[2 * TC_NODES_MAX];
    for (int i = 0; i < 2 * n; i++) {
        used[i] = tc_free_port();
    }
    for (int i = 0; i < n; i++) {
        unsigned cp = used[2 * i];
        fprintf(f, "node %d 127.0.0.1:%u 127.0.0.1:%u\n", i + 1,
                used[2 * i + 1], cp);
        char a[32];
        snprintf(a, sizeof(a), "%s127.0.0.1:%u", i > 0 ? "," : "", cp);
        strcat(c->addrs, a);
    }
    if (extra != NULL) {
        fputs(extra, f);
    }
    fclose(f);
    char err[IDA_ERRMSG_MAX];
    TC_CHECK(ida_config_load(c->conf, &c->cfg, err) == 0, "%s", err);
}

/* Whether the file @path holds @needle. */
static int log_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        found = strstr(line, needle) != NULL;
    }
    fclose(f);
    return found;
}

int tc_port_taken(const struct tc *c)
{
    for (int i = 0; i < c->n; i++) {
        char log[400];
        snprintf(log, sizeof(log), "%s/node%d.log", c->dir, i + 1);
        if (log_has(log, "cannot listen on") ||
            log_has(log, "cannot serve metrics on")) {
            return 1;
        }
    }
    return 0;
}

int tc_spawn_all(struct tc *c)
{
    for (int i = 0; i < c->n; i++) {
        tc_spawn(c, i);
    }
    for (uint64_t end = tc_now_ms() + 5000; tc_now_ms() < end;) {
        int settled = 0;
        for (int i = 0; i < c->n; i++) {
            char log[400];
            snprintf(log, sizeof(log), "%s/node%d.log", c->dir, i + 1);
            /* Ended? Asked without reaping: the test may want its status. */
            siginfo_t si;
            memset(&si, 0, sizeof(si));
            settled += log_has(log, "node: started") ||
                       (waitid(P_PID, (id_t)c->pid[i], &si,
                               WEXITED | WNOHANG | WNOWAIT) == 0 &&
                        si.si_pid != 0);
        }
        if (settled == c->n) {
            break;
        }
        tc_sleep_ms(20);
    }
    return tc_port_taken(c);
}

void tc_start_edited(struct tc *c,
                     int n,
                     const char *extra,
                     void (*edit)(struct tc *c, void *arg),
                     void *arg)
{
    for (int attempt = 0;; attempt++) {
        tc_setup(c, n, extra);
        if (edit != NULL) {
            edit(c, arg);
        }
        if (!tc_spawn_all(c) || attempt == 3) {
            return;
        }
        tc_destroy(c);
    }
}

void tc_start(struct tc *c, int n, const char *extra)
{
    tc_start_edited(c, n, extra, NULL, NULL);
}

char tc_proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold anything */
    return p != NULL && p[1] == ' ' ? p[2] : 0;
}

int tc_signal(struct tc *c, int i, int sig)
{
    if (c->pid[i] == 0) {
        return 0;
    }
    kill(c->pid[i], sig);
    if (sig != SIGKILL && sig != SIGTERM && sig != SIGINT) {
        return 0;
    }
    int status = 0;
    waitpid(c->pid[i], &status, 0);
    c->pid[i] = 0;
    return status;
}

int tc_reap(struct tc *c, int i, int *status)
{
    int st = 0;
    if (c->pid[i] == 0 || waitpid(c->pid[i], &st, WNOHANG) != c->pid[i]) {
        return 0;
    }
    c->pid[i] = 0;
    if (status != NULL) {
        *status = st;
    }
    return 1;
}

void tc_destroy(struct tc *c)
{
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] != 0) {
            kill(c->pid[i], SIGCONT);
            tc_signal(c, i, SIGKILL);
        }
    }
    if (c->dir[0] != '\0' && getenv("IDA_KEEP_TEST_DIRS") == NULL) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", c->dir);
        int rv = system(cmd);
        (void)rv;
    }
}

struct idalloc_client *tc_client(struct tc *c, unsigned call_ms)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = c->addrs;
    o.call_timeout_ms = call_ms;
    char ca[400], crt[400], key[400];
    if (c->cfg.client_tls != IDA_CLIENT_TLS_OFF) {
        snprintf(ca, sizeof(ca), "%s/ca.crt", c->tls);
        snprintf(crt, sizeof(crt), "%s/client1.crt", c->tls);
        snprintf(key, sizeof(key), "%s/client1.key", c->tls);
        o.tls_ca_file = ca;
        o.tls_cert_file = crt;
        o.tls_key_file = key;
    }
    o.attempt_timeout_ms = call_ms < 500 ? call_ms : 500;
    struct idalloc_client *cl;
    char err[IDALLOC_ERRMSG_MAX];
    TC_CHECK(idalloc_client_new(&o, &cl, err) == 0, "%s", err);
    return cl;
}

int tc_wait_leader(struct tc *c, unsigned ms)
{
    struct idalloc_client *cl = tc_client(c, 300);
    int leader = -1;
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end && leader < 0;) {
        unsigned agreed = 0, running = 0, lid = 0;
        for (int i = 0; i < c->n; i++) {
            if (c->pid[i] == 0) {
                continue;
            }
            running++;
            struct idalloc_node_status s;
            if (idalloc_node_status(cl, (size_t)i, &s, NULL) != 0) {
                continue;
            }
            if (strcmp(s.role, "leader") == 0) {
                lid = s.node_id;
            }
            if (s.leader_id != 0 && (lid == 0 || s.leader_id == lid)) {
                lid = s.leader_id;
                agreed++;
            }
        }
        if (lid != 0 && agreed == running && c->pid[lid - 1] != 0) {
            leader = (int)lid - 1;
        } else {
            tc_sleep_ms(50);
        }
    }
    idalloc_client_free(cl);
    return leader;
}

uint64_t tc_commit_index(struct tc *c)
{
    struct idalloc_client *cl = tc_client(c, 300);
    uint64_t best = 0;
    for (int i = 0; i < c->n; i++) {
        struct idalloc_node_status s;
        if (c->pid[i] != 0 &&
            idalloc_node_status(cl, (size_t)i, &s, NULL) == 0 &&
            s.commit_index > best) {
            best = s.commit_index;
        }
    }
    idalloc_client_free(cl);
    return best;
}

int tc_wait_applied(struct tc *c, uint64_t index, unsigned ms)
{
    struct idalloc_client *cl = tc_client(c, 300);
    int ok = 0;
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end && !ok;) {
        ok = 1;
        for (int i = 0; i < c->n; i++) {
            struct idalloc_node_status s;
            if (c->pid[i] != 0 &&
                (idalloc_node_status(cl, (size_t)i, &s, NULL) != 0 ||
                 s.applied_index < index)) {
                ok = 0;
            }
        }
        if (!ok) {
            tc_sleep_ms(50);
        }
    }
    idalloc_client_free(cl);
    return ok;
}

int tc_log_count(const struct tc *c, int i, const char *needle)
{
    char path[400], line[1024];
    snprintf(path, sizeof(path), "%s/node%d.log", c->dir, i + 1);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, needle) != NULL;
    }
    if (f != NULL) {
        fclose(f);
    }
    return n;
}

int tc_run(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    /* "e": the pipe's end stays out of what other threads start
     * meanwhile. */
    FILE *p = popen(cmd, "re");
    TC_CHECK(p != NULL, "popen failed");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    /* Read the rest too: a command whose output is longer than @cap would
     * otherwise die of SIGPIPE when its next write finds the pipe closed
     * (idallocd --help, over 4 KiB, was written in two). */
    char rest[4096];
    while (fread(rest, 1, sizeof(rest), p) > 0) {
    }
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static _Thread_local struct idalloc_call detail;

struct idalloc_call *tc_detail(void)
{
    idalloc_call_init(&detail);
    return &detail;
}

const char *tc_errmsg(void)
{
    return detail.errmsg;
}

void tc_long_tag(char *tag, size_t bytes, int t, int i)
{
    int n = snprintf(tag, bytes + 1, "t%d-%d-", t, i);
    if (n >= 0 && (size_t)n < bytes) {
        memset(tag + n, 'x', bytes - (size_t)n);
    }
    tag[bytes] = '\0';
}

unsigned tc_add_metrics(struct tc *c, int i)
{
    unsigned port = tc_free_port();
    char out[256];
    TC_CHECK(tc_run(out, sizeof(out),
                    "sed -i 's/^node %d .*/& metrics=127.0.0.1:%u/' %s", i + 1,
                    port, c->conf) == 0,
             "adding metrics= to node %d's line", i + 1);
    return port;
}

int tc_http(unsigned port,
            const char *method,
            const char *path,
            char *body,
            size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: x\r\n\r\n",
                     method, path);
    if (n < 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t room = cap + 4096; /* the body and a head */
    char *raw = malloc(room);
    TC_CHECK(raw != NULL, "out of memory");
    size_t len = 0;
    ssize_t r;
    while (len < room - 1 && (r = read(fd, raw + len, room - 1 - len)) > 0) {
        len += (size_t)r;
    }
    close(fd);
    raw[len] = '\0';
    int status = 0;
    const char *b = strstr(raw, "\r\n\r\n");
    if (sscanf(raw, "HTTP/1.%*d %d", &status) != 1 || b == NULL) {
        status = -1;
    } else {
        snprintf(body, cap, "%s", b + 4);
    }
    free(raw);
    return status;
}

double tc_metric(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    return -1;
}
