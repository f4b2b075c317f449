#include "base/fdio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "idalloc_errors.h"

int ida_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return IDA_EIO;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int ida_read_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            if (r == 0) {
                errno = 0;
            }
            return IDA_EIO;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int ida_fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return IDA_EIO;
    }
    int rv = fsync(fd) == 0 ? 0 : IDA_EIO;
    int err = errno;
    close(fd);
    errno = err;
    return rv;
}
