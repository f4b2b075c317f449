#include "src/common/backup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fdio.h"
#include "base/heap.h"
#include "proto/idalloc.pb-c.h"

#define MAGIC_BYTES 8
#define HEAD_BYTES  (MAGIC_BYTES + 4)
#define CRC_BYTES   4

static int fail(char *errmsg, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *errmsg, int code, const char *fmt, ...)
{
    if (errmsg != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errmsg, IDA_ERRMSG_MAX, fmt, ap);
        va_end(ap);
    }
    return code;
}

uint32_t ida_backup_crc32c(uint32_t crc, const void *data, size_t len)
{
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        /* Idempotent: two threads filling it write the same values. */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) {
                c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            }
            table[i] = c;
        }
        ready = 1;
    }
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           p[3];
}

int ida_backup_encode(const struct ida_backup *b, uint8_t **out, size_t *len)
{
    Idalloc__Backup m = IDALLOC__BACKUP__INIT;
    m.version = b->version;
    m.cluster = (char *)b->cluster;
    m.index = b->index;
    m.term = b->term;
    m.created_unix_ms = b->created_unix_ms;
    m.state.data = b->state;
    m.state.len = b->state_len;
    size_t n = idalloc__backup__get_packed_size(&m);
    if (n > UINT32_MAX - HEAD_BYTES - CRC_BYTES) {
        return IDA_ETOOBIG;
    }
    uint8_t *p = ida_malloc(HEAD_BYTES + n + CRC_BYTES);
    if (p == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(p, IDA_BACKUP_MAGIC, MAGIC_BYTES);
    put_be32(p + MAGIC_BYTES, (uint32_t)n);
    idalloc__backup__pack(&m, p + HEAD_BYTES);
    put_be32(p + HEAD_BYTES + n, ida_backup_crc32c(0, p, HEAD_BYTES + n));
    *out = p;
    *len = HEAD_BYTES + n + CRC_BYTES;
    return 0;
}

int ida_backup_decode(const uint8_t *data,
                      size_t len,
                      struct ida_backup *out,
                      char *errmsg)
{
    memset(out, 0, sizeof(*out));
    if (len < MAGIC_BYTES || memcmp(data, IDA_BACKUP_MAGIC, 6) != 0) {
        return fail(errmsg, IDA_EFOREIGN, "not an idalloc backup file");
    }
    if (memcmp(data, IDA_BACKUP_MAGIC, MAGIC_BYTES) != 0) {
        return fail(errmsg, IDA_EVERSION,
                    "a backup of another format (%.8s; this build reads %s)",
                    (const char *)data, IDA_BACKUP_MAGIC);
    }
    if (len < HEAD_BYTES + CRC_BYTES) {
        return fail(errmsg, IDA_ECORRUPT, "truncated (%zu bytes)", len);
    }
    size_t n = get_be32(data + MAGIC_BYTES);
    if (n != len - HEAD_BYTES - CRC_BYTES) {
        return fail(errmsg, IDA_ECORRUPT,
                    "truncated or extended: %zu bytes, the header says %zu",
                    len, n + HEAD_BYTES + CRC_BYTES);
    }
    uint32_t want = get_be32(data + HEAD_BYTES + n);
    if (ida_backup_crc32c(0, data, HEAD_BYTES + n) != want) {
        return fail(errmsg, IDA_ECORRUPT, "checksum mismatch: damaged");
    }
    Idalloc__Backup *m = idalloc__backup__unpack(NULL, n, data + HEAD_BYTES);
    if (m == NULL) {
        return fail(errmsg, IDA_ECORRUPT, "the backup record does not decode");
    }
    int rv = 0;
    if (m->version != IDA_BACKUP_VERSION) {
        rv = fail(errmsg, IDA_EVERSION,
                  "backup version %u (this build reads %u)", m->version,
                  IDA_BACKUP_VERSION);
    } else if (m->cluster[0] == '\0' ||
               strlen(m->cluster) > IDA_BACKUP_CLUSTER_MAX) {
        rv = fail(errmsg, IDA_ECORRUPT, "bad cluster name in the backup");
    } else if (m->state.len == 0 || m->index == 0) {
        rv = fail(errmsg, IDA_ECORRUPT, "the backup holds no state");
    } else if ((out->state = ida_malloc(m->state.len)) == NULL) {
        rv = fail(errmsg, IDA_ENOMEM, "out of memory");
    }
    if (rv == 0) {
        out->version = m->version;
        snprintf(out->cluster, sizeof(out->cluster), "%s", m->cluster);
        out->index = m->index;
        out->term = m->term;
        out->created_unix_ms = m->created_unix_ms;
        memcpy(out->state, m->state.data, m->state.len);
        out->state_len = m->state.len;
    }
    idalloc__backup__free_unpacked(m, NULL);
    return rv;
}

int ida_backup_read(const char *path, struct ida_backup *out, char *errmsg)
{
    memset(out, 0, sizeof(*out));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return fail(errmsg, IDA_EIO, "%s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size > IDA_BACKUP_FILE_BYTES_MAX) {
        close(fd);
        return fail(errmsg, IDA_EFOREIGN,
                    "%s: not a regular file of at most 4 GiB", path);
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = ida_malloc(len > 0 ? len : 1);
    if (buf == NULL) {
        close(fd);
        return fail(errmsg, IDA_ENOMEM, "%s: out of memory", path);
    }
    int short_read = ida_read_all(fd, buf, len) != 0;
    close(fd);
    char why[IDA_ERRMSG_MAX];
    int rv = short_read ? fail(why, IDA_EIO, "short read")
                        : ida_backup_decode(buf, len, out, why);
    ida_free(buf);
    return rv != 0 ? fail(errmsg, rv, "%s: %s", path, why) : 0;
}

/* The file is written and flushed this much at a time. Flushed at once, a
 * backup of 200 MB kept the disk busy with one long flush, and the fsyncs
 * of the nodes on the same disk queued behind it (a file system that
 * orders data before its journal, ext4's default, can even make their
 * journal commits wait for it): at ten million allocations a 1-client
 * alloc's worst latency during `snapshot save` was 62 to 114 ms, against
 * 10 ms without a backup; in 8 MiB steps 27 to 42 ms (1 and 2 MiB steps
 * measured no better: what is left is not this flush). */
#define BACKUP_SYNC_STEP_BYTES ((size_t)8 << 20)

int ida_backup_write(const char *path, const struct ida_backup *b, char *errmsg)
{
    if (b->cluster[0] == '\0' || b->state == NULL || b->state_len == 0) {
        return fail(errmsg, IDA_EINVAL, "nothing to write");
    }
    uint8_t *data;
    size_t len;
    int rv = ida_backup_encode(b, &data, &len);
    if (rv != 0) {
        return fail(errmsg, rv, "%s: %s", path, idalloc_strerror(rv));
    }
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path,
                         (long)getpid()) >= sizeof(tmp)) {
        ida_free(data);
        return fail(errmsg, IDA_EINVAL, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rv = fail(errmsg, IDA_EIO, "%s: %s", tmp, strerror(errno));
        ida_free(data);
        return rv;
    }
    const char *step = NULL;
    for (size_t off = 0; off < len && step == NULL;
         off += BACKUP_SYNC_STEP_BYTES) {
        size_t n = len - off < BACKUP_SYNC_STEP_BYTES ? len - off
                                                      : BACKUP_SYNC_STEP_BYTES;
        if (ida_write_all(fd, data + off, n) != 0) {
            step = "write";
        } else if (off + n < len && fdatasync(fd) != 0) {
            step = "fdatasync"; /* (the last step: the fsync below) */
        }
    }
    if (step == NULL && fsync(fd) != 0) {
        step = "fsync";
    }
    int err = errno;
    if (close(fd) != 0 && step == NULL) {
        step = "close";
        err = errno;
    }
    if (step == NULL && rename(tmp, path) != 0) {
        step = "rename";
        err = errno;
    }
    ida_free(data);
    if (step != NULL) {
        unlink(tmp);
        return fail(errmsg, IDA_EIO, "%s: %s failed: %s", path, step,
                    strerror(err));
    }
    /* The rename is durable once the directory is. */
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) {
        snprintf(dir, sizeof(dir), ".");
    } else if (slash == dir) {
        dir[1] = '\0';
    } else {
        *slash = '\0';
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        err = errno;
        if (dfd >= 0) {
            close(dfd);
        }
        return fail(errmsg, IDA_EIO, "%s: fsync of its directory failed: %s",
                    path, strerror(err));
    }
    close(dfd);
    return 0;
}

void ida_backup_free(struct ida_backup *b)
{
    ida_free(b->state);
    memset(b, 0, sizeof(*b));
}
