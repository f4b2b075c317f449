/* _GNU_SOURCE for accept4() and pipe2() (close-on-exec sockets). */
#define _GNU_SOURCE
#include "tests/chaos/proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LINKS_MAX (PROXY_NODES_MAX * PROXY_NODES_MAX)
#define PAIRS_MAX 256

struct pair
{
    int link; /* -1: free slot */
    int a, b; /* a: the dialling node's side, b: towards the real port */
};

struct proxy
{
    int n;
    uint16_t peer_port[PROXY_NODES_MAX];
    int listen_fd[LINKS_MAX];
    uint16_t port[LINKS_MAX];
    pthread_mutex_t mu;
    int blocked[LINKS_MAX];     /* guarded by mu */
    unsigned opened[LINKS_MAX]; /* guarded by mu */
    int stop;                   /* guarded by mu */
    int wake[2];                /* self-pipe: the control side pokes poll() */
    struct pair pairs[PAIRS_MAX];
    pthread_t thread;
};

static int link_of(int from, int to)
{
    return from * PROXY_NODES_MAX + to;
}

static int listen_any(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 16)) {
        close(fd);
        return -1;
    }
    socklen_t l = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Connect with a 200 ms limit: a node that stopped accepting must not
 * freeze the proxy (and with it every link). */
static int dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rv = connect(fd, (struct sockaddr *)&a, sizeof(a));
    if (rv != 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof(err);
        if (poll(&p, 1, 200) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) {
            rv = 0;
        }
    }
    if (rv != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* CHAOS_PROXY_LOG=1: one line per link event on stderr. */
static void plog(const char *what, int link, int a, int b)
{
    static int on = -1;
    if (on < 0) {
        on = getenv("CHAOS_PROXY_LOG") != NULL;
    }
    if (on) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        fprintf(stderr, "proxy: %ld.%03ld %s link %d->%d fds %d %d\n",
                (long)ts.tv_sec % 1000, ts.tv_nsec / 1000000, what,
                link / PROXY_NODES_MAX + 1, link % PROXY_NODES_MAX + 1, a, b);
    }
}

static void nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void close_pair(struct pair *pr)
{
    plog("close", pr->link, pr->a, pr->b);
    close(pr->a);
    close(pr->b);
    pr->link = -1;
}

static int is_blocked(struct proxy *p, int link)
{
    pthread_mutex_lock(&p->mu);
    int b = p->blocked[link];
    pthread_mutex_unlock(&p->mu);
    return b;
}

static void accept_on(struct proxy *p, int link)
{
    /* Close-on-exec everywhere: a node forked by the test must not keep a
     * copy of a proxy socket, or closing it here would not close it. */
    int fd = accept4(p->listen_fd[link], NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        return;
    }
    int to = link % PROXY_NODES_MAX;
    int up = is_blocked(p, link) ? -1 : dial(p->peer_port[to]);
    if (up < 0) {
        plog("refuse", link, fd, -1);
        close(fd); /* blocked, or the node is down */
        return;
    }
    plog("open", link, fd, up);
    pthread_mutex_lock(&p->mu);
    p->opened[link]++;
    pthread_mutex_unlock(&p->mu);
    nonblocking(fd);
    nonblocking(up);
    for (int k = 0; k < PAIRS_MAX; k++) {
        if (p->pairs[k].link < 0) {
            p->pairs[k] = (struct pair){link, fd, up};
            return;
        }
    }
    close(fd);
    close(up);
}

/* Move what is readable on @from to @to; -1 when the pair is done. The
 * sockets are non-blocking: a receiver that does not read (a paused node)
 * breaks its pair instead of stalling every other link. */
static int pump(int from, int to)
{
    char buf[65536];
    ssize_t n = read(from, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return 0;
    }
    if (n <= 0) {
        return -1;
    }
    for (ssize_t off = 0; off < n;) {
        /* send(), not write(): a node killed meanwhile must not raise
         * SIGPIPE in the test process (make test's chaos round died of it). */
        ssize_t w = send(to, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return -1; /* full or gone: like a broken connection */
        }
        off += w;
    }
    return 0;
}

static void *proxy_main(void *arg)
{
    struct proxy *p = arg;
    struct pollfd fds[1 + LINKS_MAX + 2 * PAIRS_MAX];
    int who[1 + LINKS_MAX + 2 * PAIRS_MAX];
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) {
            break;
        }
        /* Links blocked since the last round lose their connections. */
        for (int k = 0; k < PAIRS_MAX; k++) {
            if (p->pairs[k].link >= 0 && is_blocked(p, p->pairs[k].link)) {
                close_pair(&p->pairs[k]);
            }
        }
        int nf = 0;
        fds[nf] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        who[nf++] = -1;
        for (int l = 0; l < LINKS_MAX; l++) {
            if (p->listen_fd[l] >= 0) {
                fds[nf] =
                    (struct pollfd){.fd = p->listen_fd[l], .events = POLLIN};
                who[nf++] = 1000 + l;
            }
        }
        for (int k = 0; k < PAIRS_MAX; k++) {
            if (p->pairs[k].link >= 0) {
                fds[nf] =
                    (struct pollfd){.fd = p->pairs[k].a, .events = POLLIN};
                who[nf++] = 2 * k;
                fds[nf] =
                    (struct pollfd){.fd = p->pairs[k].b, .events = POLLIN};
                who[nf++] = 2 * k + 1;
            }
        }
        if (poll(fds, (nfds_t)nf, 200) < 0 && errno != EINTR) {
            break;
        }
        for (int i = 0; i < nf; i++) {
            if (fds[i].revents == 0) {
                continue;
            }
            if (who[i] == -1) {
                char c[64];
                ssize_t r = read(p->wake[0], c, sizeof(c));
                (void)r;
            } else if (who[i] >= 1000) {
                accept_on(p, who[i] - 1000);
            } else {
                struct pair *pr = &p->pairs[who[i] / 2];
                if (pr->link < 0) {
                    continue; /* closed earlier in this round */
                }
                int rv =
                    who[i] % 2 == 0 ? pump(pr->a, pr->b) : pump(pr->b, pr->a);
                if (rv != 0) {
                    close_pair(pr);
                }
            }
        }
    }
    for (int k = 0; k < PAIRS_MAX; k++) {
        if (p->pairs[k].link >= 0) {
            close_pair(&p->pairs[k]);
        }
    }
    return NULL;
}

struct proxy *proxy_start(int n, const uint16_t *peer_port)
{
    struct proxy *p = calloc(1, sizeof(*p));
    p->n = n;
    memcpy(p->peer_port, peer_port, (size_t)n * sizeof(*peer_port));
    pthread_mutex_init(&p->mu, NULL);
    for (int l = 0; l < LINKS_MAX; l++) {
        p->listen_fd[l] = -1;
    }
    for (int k = 0; k < PAIRS_MAX; k++) {
        p->pairs[k].link = -1;
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            if (i != j) {
                int l = link_of(i, j);
                p->listen_fd[l] = listen_any(&p->port[l]);
                if (p->listen_fd[l] < 0) {
                    fprintf(stderr, "proxy: cannot listen\n");
                    abort();
                }
            }
        }
    }
    if (pipe2(p->wake, O_CLOEXEC) != 0) {
        abort();
    }
    pthread_create(&p->thread, NULL, proxy_main, p);
    return p;
}

uint16_t proxy_port(const struct proxy *p, int from, int to)
{
    return p->port[link_of(from, to)];
}

static void poke(struct proxy *p)
{
    ssize_t w = write(p->wake[1], "x", 1);
    (void)w;
}

void proxy_block(struct proxy *p, int from, int to, int blocked)
{
    pthread_mutex_lock(&p->mu);
    p->blocked[link_of(from, to)] = blocked;
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

void proxy_heal(struct proxy *p)
{
    pthread_mutex_lock(&p->mu);
    memset(p->blocked, 0, sizeof(p->blocked));
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

unsigned proxy_opened(struct proxy *p, int from, int to)
{
    pthread_mutex_lock(&p->mu);
    unsigned k = p->opened[link_of(from, to)];
    pthread_mutex_unlock(&p->mu);
    return k;
}

void proxy_stop(struct proxy *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    poke(p);
    pthread_join(p->thread, NULL);
    for (int l = 0; l < LINKS_MAX; l++) {
        if (p->listen_fd[l] >= 0) {
            close(p->listen_fd[l]);
        }
    }
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
