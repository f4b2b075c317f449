/* Whole reads and writes on a file descriptor: the loops every caller of
 * read(2)/write(2) otherwise writes again (a short count, EINTR).
 *
 * Both use only read(2) and write(2): safe in a forked child of a
 * multi-threaded process (src/node/bgsnap.c). */
#ifndef IDA_BASE_FDIO_H
#define IDA_BASE_FDIO_H

#include <stddef.h>

/* Write all @len bytes of @buf. Returns 0, or IDA_EIO (errno tells why;
 * part may have been written). */
int ida_write_all(int fd, const void *buf, size_t len);

/* Read exactly @len bytes into @buf. Returns 0, or IDA_EIO on an error or
 * an end of file before @len bytes (errno tells which: 0 at end of file). */
int ida_read_all(int fd, void *buf, size_t len);

/* fsync(2) the directory @path, so that a rename or a new file in it is
 * durable. Returns 0, or IDA_EIO (errno tells why). */
int ida_fsync_dir(const char *path);

#endif /* IDA_BASE_FDIO_H */
