#define _GNU_SOURCE /* F_SETPIPE_SZ, memfd_create() */
#include "src/node/bgsnap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/fdio.h"
#include "base/heap.h"
#include "idalloc_errors.h"

static const uint8_t MAGIC[8] = {'I', 'D', 'A', 'B', 'G', 'S', 'N', '1'};

/* The largest snapshot a header may announce (a corrupt or hostile length
 * must not make the parent allocate without bound). */
#define BGSNAP_BYTES_MAX ((uint64_t)64 << 30)

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* In the child: close every descriptor but @keep. */
static void close_others(int keep)
{
    int fds[1024], n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        int dfd = dirfd(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL && n < 1024) {
            int fd = atoi(e->d_name);
            if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd > 2 &&
                fd != keep && fd != dfd) {
                fds[n++] = fd;
            }
        }
        closedir(d);
        if (n < 1024) {
            for (int i = 0; i < n; i++) {
                close(fds[i]);
            }
            return;
        }
    }
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > (1 << 20)) {
        max = 1 << 20;
    }
    for (int fd = 3; fd < max; fd++) {
        if (fd != keep) {
            close(fd);
        }
    }
}

static void put_header(uint8_t hdr[IDA_BGSNAP_HDR_BYTES], size_t len)
{
    memcpy(hdr, MAGIC, 8);
    for (int i = 0; i < 8; i++) {
        hdr[8 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
    }
}

/* In the child: room for the header and @total bytes in the memory file
 * (ctx: its descriptor), mapped shared; where the snapshot goes. */
static uint8_t *mem_get(void *ctx, size_t total)
{
    int fd = *(int *)ctx;
    size_t size = IDA_BGSNAP_HDR_BYTES + total;
    if (ftruncate(fd, (off_t)size) != 0) {
        return NULL;
    }
    uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        return NULL;
    }
    put_header(m, total);
    return m + IDA_BGSNAP_HDR_BYTES;
}

/* @mem: @wfd is a memory file, written through a shared mapping (no second
 * copy of the snapshot in the child); else a pipe, written in order. */
static void child_main(const struct ida_fsm *f, int wfd, pid_t parent, int mem)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(3); /* the parent died before the line above */
    }
    close_others(wfd);
    size_t len;
    if (mem) {
        /* The mapping goes with the process; the file holds the bytes. */
        _exit(ida_fsm_snapshot_to(f, mem_get, &wfd, &len) == 0 ? 0 : 2);
    }
    uint8_t *data;
    if (ida_fsm_snapshot(f, &data, &len) != 0) {
        _exit(2);
    }
    uint8_t hdr[IDA_BGSNAP_HDR_BYTES];
    put_header(hdr, len);
    if (ida_write_all(wfd, hdr, sizeof(hdr)) != 0 ||
        ida_write_all(wfd, data, len) != 0) {
        _exit(1);
    }
    _exit(0);
}

/* Fork the child writing into @wfd (it closes every other descriptor
 * itself, close_others()); its pid, or -1. */
static pid_t spawn(const struct ida_fsm *f, int wfd, int mem)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        child_main(f, wfd, parent, mem);
    }
    return pid;
}

int ida_bgsnap_start(struct ida_bgsnap *b,
                     const struct ida_fsm *f,
                     ida_index index,
                     ida_term term)
{
    if (b->pid != 0) {
        return IDA_EBUSY;
    }
    int p[2];
    if (pipe(p) != 0) {
        return IDA_EIO;
    }
    uint64_t t0 = mono_us();
    pid_t pid = spawn(f, p[1], 0);
    uint64_t t1 = mono_us();
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return IDA_EIO;
    }
    /* A pipe holds 64 KiB by default: the child stopped at each 64 KiB
     * until the parent's next look (every 10 ms on an idle node: 6 MB/s,
     * half a minute for 180 MB; 3.2 s instead of 0.7 s for the encoding of
     * 10 M allocations on an idle machine). A slice's worth lets it run
     * ahead by one slice. Best effort: the system's pipe-max-size may be
     * lower, and the default still works. */
    (void)fcntl(p[0], F_SETPIPE_SZ, (int)IDA_BGSNAP_PIPE_BYTES);
    (void)fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    (void)fcntl(p[0], F_SETFD, FD_CLOEXEC);
    *b = (struct ida_bgsnap){.pid = pid,
                             .fd = p[0],
                             .index = index,
                             .term = term,
                             .started_us = t0,
                             .fork_us = t1 - t0};
    return 0;
}

static void reap(struct ida_bgsnap *b, int *status)
{
    int st = 0;
    while (waitpid(b->pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (status != NULL) {
        *status = st;
    }
    close(b->fd);
    ida_free(b->buf);
    *b = (struct ida_bgsnap){0};
}

void ida_bgsnap_cancel(struct ida_bgsnap *b)
{
    if (b->pid == 0) {
        return;
    }
    kill(b->pid, SIGKILL);
    reap(b, NULL);
}

/* One read of at most @n bytes from the job's pipe: how many came (0 at
 * the end), PIPE_LATER when none are there yet, or PIPE_FAILED (the job is
 * cancelled). */
#define PIPE_LATER  (-1)
#define PIPE_FAILED (-2)
static ssize_t pipe_read(struct ida_bgsnap *b, uint8_t *dst, size_t n)
{
    ssize_t r = read(b->fd, dst, n);
    if (r >= 0) {
        return r;
    }
    if (errno == EAGAIN || errno == EINTR) {
        return PIPE_LATER;
    }
    ida_bgsnap_cancel(b);
    return PIPE_FAILED;
}

static int header_in(const struct ida_bgsnap *b)
{
    return b->hdr_got == IDA_BGSNAP_HDR_BYTES;
}

/* The header's 16 bytes, read as far as they came: 0 (all in: b->len is
 * the size), 1 (not yet), minus an IDA_E* code (the job failed and is
 * over). Sets @*eof. */
static int read_header(struct ida_bgsnap *b, int *eof)
{
    if (header_in(b)) {
        return 0;
    }
    while (!header_in(b)) {
        ssize_t r = pipe_read(b, b->hdr + b->hdr_got,
                              IDA_BGSNAP_HDR_BYTES - b->hdr_got);
        if (r == PIPE_FAILED) {
            return -IDA_EIO;
        }
        if (r <= 0) {
            *eof = r == 0;
            return 1;
        }
        b->hdr_got += (size_t)r;
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) {
        n = n << 8 | b->hdr[8 + i];
    }
    if (memcmp(b->hdr, MAGIC, 8) != 0 || n > BGSNAP_BYTES_MAX || n > SIZE_MAX) {
        ida_bgsnap_cancel(b);
        return -IDA_ECORRUPT;
    }
    b->len = (size_t)n;
    return 0;
}

int ida_bgsnap_read(struct ida_bgsnap *b,
                    uint8_t *dst,
                    size_t cap,
                    struct ida_bgsnap_slice *out)
{
    *out = (struct ida_bgsnap_slice){0};
    if (b->pid == 0) {
        return -IDA_EINVAL;
    }
    int eof = 0;
    int rv = read_header(b, &eof);
    if (rv < 0) {
        return rv;
    }
    out->offset = b->got;
    out->total = b->len;
    while (rv == 0 && !eof && out->len < cap && b->got < b->len) {
        size_t want = b->len - b->got;
        want = want < cap - out->len ? want : cap - out->len;
        ssize_t r = pipe_read(b, dst + out->len, want);
        if (r == PIPE_FAILED) {
            return -IDA_EIO;
        }
        if (r == PIPE_LATER) {
            return 0;
        }
        eof = r == 0;
        out->len += (size_t)r;
        b->got += (size_t)r;
    }
    if (rv == 0 && !eof && b->got == b->len) {
        /* all announced bytes are in: wait for EOF */
        uint8_t extra;
        ssize_t r = pipe_read(b, &extra, 1);
        if (r == PIPE_FAILED) {
            return -IDA_EIO;
        }
        if (r > 0) {
            ida_bgsnap_cancel(b); /* more than announced */
            return -IDA_ECORRUPT;
        }
        eof = r == 0;
    }
    if (!eof) {
        return 0;
    }
    int complete = header_in(b) && b->got == b->len;
    int st;
    reap(b, &st);
    if (!complete || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        return -IDA_EIO;
    }
    return 1;
}

int ida_bgsnap_poll(struct ida_bgsnap *b,
                    size_t budget,
                    uint8_t **data,
                    size_t *len)
{
    struct ida_bgsnap_slice sl;
    if (b->buf == NULL) {
        int rv = ida_bgsnap_read(b, NULL, 0, &sl); /* the header */
        if (rv != 0 || !header_in(b)) {
            return rv == 1 ? -IDA_EIO : rv; /* no bytes, yet "done" */
        }
        b->buf = ida_malloc(b->len > 0 ? b->len : 1);
        if (b->buf == NULL) {
            ida_bgsnap_cancel(b);
            return -IDA_ENOMEM;
        }
    }
    uint8_t *buf = b->buf;
    size_t n = b->len;
    b->buf = NULL; /* a job that ends in this read must not free it */
    int rv = ida_bgsnap_read(b, buf + b->got, budget, &sl);
    if (rv == 0) {
        b->buf = buf;
    } else if (rv == 1) {
        *data = buf;
        *len = n;
    } else {
        ida_free(buf);
    }
    return rv;
}

int ida_bgsnap_start_mem(struct ida_bgsnap *b,
                         const struct ida_fsm *f,
                         ida_index index,
                         ida_term term)
{
    if (b->pid != 0) {
        return IDA_EBUSY;
    }
    int fd = memfd_create("idalloc-backup", MFD_CLOEXEC);
    if (fd < 0) {
        return IDA_EIO;
    }
    uint64_t t0 = mono_us();
    pid_t pid = spawn(f, fd, 1);
    uint64_t t1 = mono_us();
    if (pid < 0) {
        close(fd);
        return IDA_EIO;
    }
    *b = (struct ida_bgsnap){.pid = pid,
                             .fd = fd,
                             .mem = 1,
                             .index = index,
                             .term = term,
                             .started_us = t0,
                             .fork_us = t1 - t0};
    return 0;
}

/* The memory file of @fd, @size bytes, holding a header and the snapshot:
 * 0 and its mapping (*data after the header, *len), or an IDA_E* code. */
static int map_output(int fd, const uint8_t **data, size_t *len)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < IDA_BGSNAP_HDR_BYTES ||
        (uint64_t)st.st_size > BGSNAP_BYTES_MAX + IDA_BGSNAP_HDR_BYTES) {
        return IDA_EIO;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        return IDA_ENOMEM;
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) {
        n = n << 8 | m[8 + i];
    }
    if (memcmp(m, MAGIC, 8) != 0 || n != size - IDA_BGSNAP_HDR_BYTES) {
        munmap(m, size);
        return IDA_ECORRUPT; /* a short or overlong write */
    }
    *data = m + IDA_BGSNAP_HDR_BYTES;
    *len = (size_t)n;
    return 0;
}

int ida_bgsnap_poll_mem(struct ida_bgsnap *b, const uint8_t **data, size_t *len)
{
    if (b->pid == 0 || !b->mem) {
        return -IDA_EINVAL;
    }
    int st = 0;
    pid_t r = waitpid(b->pid, &st, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) {
        return 0;
    }
    int rv = r == b->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0
                 ? map_output(b->fd, data, len)
                 : IDA_EIO;
    /* r < 0 (not our child: nothing else reaps them, so it cannot be):
     * the job is dropped, and nothing signalled (the pid may be another
     * process's by now). */
    close(b->fd);
    *b = (struct ida_bgsnap){0};
    return rv == 0 ? 1 : -rv;
}

void ida_bgsnap_unmap(const uint8_t *data, size_t len)
{
    if (data != NULL) {
        munmap((void *)(uintptr_t)(data - IDA_BGSNAP_HDR_BYTES),
               len + IDA_BGSNAP_HDR_BYTES);
    }
}
