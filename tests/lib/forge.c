#define _GNU_SOURCE
#include "tests/lib/forge.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "src/common/frame.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

long forge_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return -1;
    }
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    return (long)rl.rlim_cur;
}

static int to_sin(const char *addr, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host)) {
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

int forge_connect(const char *addr)
{
    struct sockaddr_in sa;
    if (to_sin(addr, &sa) != 0) {
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int forge_open_many(const char *addr, int n, int *fds, unsigned ms)
{
    struct sockaddr_in sa;
    if (to_sin(addr, &sa) != 0) {
        return 0;
    }
    struct pollfd *p = calloc((size_t)n, sizeof(*p));
    int started = 0;
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            break;
        }
        int rv = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
        if (rv != 0 && errno != EINPROGRESS) {
            close(fd);
            continue;
        }
        p[started].fd = fd;
        p[started].events = POLLOUT;
        started++;
    }
    /* Wait for every connect to finish. */
    int pending = started;
    for (uint64_t end = now_ms() + ms; pending > 0 && now_ms() < end;) {
        if (poll(p, (nfds_t)started, 100) <= 0) {
            continue;
        }
        for (int i = 0; i < started; i++) {
            if (p[i].events != 0 && p[i].revents != 0) {
                p[i].events = 0;
                pending--;
            }
        }
    }
    int ok = 0;
    for (int i = 0; i < started; i++) {
        int err = 0;
        socklen_t el = sizeof(err);
        if (p[i].events == 0 &&
            getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 &&
            err == 0) {
            int fl = fcntl(p[i].fd, F_GETFL);
            fcntl(p[i].fd, F_SETFL, fl & ~O_NONBLOCK);
            fds[ok++] = p[i].fd;
        } else {
            close(p[i].fd);
        }
    }
    free(p);
    return ok;
}

void forge_header(uint8_t out[6], uint8_t type, uint32_t len)
{
    out[0] = 0xA1;
    out[1] = type;
    out[2] = (uint8_t)(len >> 24);
    out[3] = (uint8_t)(len >> 16);
    out[4] = (uint8_t)(len >> 8);
    out[5] = (uint8_t)len;
}

int forge_send(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int forge_wait_closed(int *fds, int n, unsigned ms)
{
    struct pollfd *p = calloc((size_t)n, sizeof(*p));
    int closed = 0;
    static char sink[65536];
    for (uint64_t end = now_ms() + ms;;) {
        int open = 0;
        for (int i = 0; i < n; i++) {
            p[i].fd = fds[i]; /* negative fds are ignored by poll */
            p[i].events = POLLIN;
            p[i].revents = 0;
            open += fds[i] >= 0;
        }
        if (open == 0 || now_ms() >= end) {
            break;
        }
        if (poll(p, (nfds_t)n, 100) <= 0) {
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || p[i].revents == 0) {
                continue;
            }
            ssize_t r = recv(fds[i], sink, sizeof(sink), MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                close(fds[i]);
                fds[i] = -1;
                closed++;
            }
        }
    }
    free(p);
    return closed;
}

int forge_wait_hangup(int *fds, int n, unsigned ms)
{
    struct pollfd *p = calloc((size_t)n, sizeof(*p));
    int closed = 0;
    for (uint64_t end = now_ms() + ms;;) {
        int open = 0;
        for (int i = 0; i < n; i++) {
            p[i].fd = fds[i];
            p[i].events = POLLRDHUP;
            p[i].revents = 0;
            open += fds[i] >= 0;
        }
        if (open == 0 || now_ms() >= end) {
            break;
        }
        if (poll(p, (nfds_t)n, 100) <= 0) {
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (fds[i] >= 0 &&
                (p[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
                close(fds[i]);
                fds[i] = -1;
                closed++;
            }
        }
    }
    free(p);
    return closed;
}

static uint8_t *frame_of(uint8_t type, size_t plen, size_t *len)
{
    uint8_t *b = malloc(IDA_FRAME_HEADER_BYTES + plen + 1);
    forge_header(b, type, (uint32_t)plen);
    *len = IDA_FRAME_HEADER_BYTES + plen;
    return b;
}

uint8_t *forge_peer_frame(Idalloc__PeerMessage *m,
                          const char *cluster,
                          unsigned from,
                          unsigned to,
                          uint64_t term,
                          uint64_t from_inc,
                          size_t *len)
{
    m->version = IDA_WIRE_VERSION;
    m->cluster = (char *)cluster;
    m->from = from;
    m->to = to;
    m->term = term;
    m->from_incarnation = from_inc;
    size_t plen = idalloc__peer_message__get_packed_size(m);
    uint8_t *b = frame_of(IDA_FRAME_PEER, plen, len);
    idalloc__peer_message__pack(m, b + IDA_FRAME_HEADER_BYTES);
    return b;
}

uint8_t *forge_client_frame(Idalloc__ClientRequest *r, size_t *len)
{
    r->version = IDA_WIRE_VERSION;
    size_t plen = idalloc__client_request__get_packed_size(r);
    uint8_t *b = frame_of(IDA_FRAME_CLIENT_REQUEST, plen, len);
    idalloc__client_request__pack(r, b + IDA_FRAME_HEADER_BYTES);
    return b;
}

long forge_proc_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    long v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
            v = strtol(line + fl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

int forge_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (d == NULL) {
        return -1;
    }
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

int forge_alive(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    int alive = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "State:", 6) == 0) {
            alive = strchr(line, 'Z') == NULL && strchr(line, 'X') == NULL;
            break;
        }
    }
    fclose(f);
    return alive;
}

int forge_log_count(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    int n = 0;
    char line[4096];
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, needle) != NULL;
    }
    fclose(f);
    return n;
}

int forge_proc_start(struct forge_proc *p,
                     const char *mode,
                     const char *addr,
                     int count,
                     unsigned len)
{
    memset(p, 0, sizeof(*p));
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        return -1;
    }
    const char *build = getenv("IDA_BUILD");
    char bin[512], n[32], l[32];
    snprintf(bin, sizeof(bin), "%s/prog/forge",
             build != NULL ? build : "build");
    snprintf(n, sizeof(n), "%d", count);
    snprintf(l, sizeof(l), "%u", len);
    pid_t pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(bin, bin, mode, addr, n, strcmp(mode, "header") == 0 ? l : NULL,
              (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->pid = pid;
    p->in_fd = in[1];
    FILE *f = fdopen(out[0], "r");
    char line[128] = "";
    if (f == NULL || fgets(line, sizeof(line), f) == NULL ||
        sscanf(line, "forge: %d open", &p->opened) != 1) {
        if (f != NULL) {
            fclose(f);
        }
        forge_proc_stop(p);
        return -1;
    }
    fclose(f);
    return 0;
}

void forge_proc_stop(struct forge_proc *p)
{
    if (p->pid <= 0) {
        return;
    }
    close(p->in_fd);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}
