/* Fuzz the walk of data.mdb's trees (storage/pages.c): what open reads, with
 * plain reads, from a file that ends short of its last page, before LMDB
 * maps it.
 *
 * Input: byte 0 picks the page size (512 << (b & 3)), bytes 1-8 and 9-16
 * are the free list's and the main database's roots (little-endian; all
 * ones: none), the rest is the file, whole pages of it (the seeds, written
 * by tests/fuzz/pages_seeds.py, hold a small tree: a main database naming
 * database "log", a branch, leaves, a value's overflow pages, a free list).
 * Checked: the walk answers 0 or IDA_ECORRUPT with one line naming the
 * directory; it answers the same again; and a file it accepts stays
 * accepted with a page appended (pages past the end are only ever a reason
 * to refuse). */
#define _GNU_SOURCE /* memfd_create() */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "idalloc_errors.h"
#include "storage/internal.h"
#include "tests/fuzz/fuzz.h"

static int fd = -1;

static int walk(const uint8_t *file,
                size_t len,
                uint32_t psize,
                uint64_t pages,
                uint64_t free_root,
                uint64_t main_root,
                char *msg,
                size_t cap)
{
    FUZZ_CHECK(ftruncate(fd, 0) == 0);
    FUZZ_CHECK(pwrite(fd, file, len, 0) == (ssize_t)len);
    FUZZ_CHECK(ftruncate(fd, (off_t)(pages * psize)) == 0);
    struct ida_storage s;
    memset(&s, 0, sizeof(s));
    int rv = ida__storage_check_pages(&s, "dir", fd, psize, pages, free_root,
                                      main_root);
    FUZZ_CHECK(rv == 0 || rv == IDA_ECORRUPT);
    if (rv != 0) {
        FUZZ_CHECK(strncmp(s.errmsg, "dir: data.mdb", 13) == 0);
        FUZZ_CHECK(strchr(s.errmsg, '\n') == NULL);
    }
    snprintf(msg, cap, "%s", s.errmsg);
    return rv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 17 || size > 17 + 64 * 4096) {
        return 0;
    }
    if (fd < 0) {
        fd = memfd_create("fuzz_pages", 0);
        FUZZ_CHECK(fd >= 0);
    }
    uint32_t psize = 512u << (data[0] & 3);
    uint64_t free_root = ida__le64(data + 1);
    uint64_t main_root = ida__le64(data + 9);
    const uint8_t *file = data + 17;
    uint64_t pages = (size - 17) / psize;
    size_t len = (size_t)(pages * psize);
    char a[IDA_STORAGE_ERRMSG_MAX + 1], b[IDA_STORAGE_ERRMSG_MAX + 1];
    int rv = walk(file, len, psize, pages, free_root, main_root, a, sizeof(a));
    FUZZ_CHECK(walk(file, len, psize, pages, free_root, main_root, b,
                    sizeof(b)) == rv);
    FUZZ_CHECK(strcmp(a, b) == 0);
    if (rv == 0) {
        FUZZ_CHECK(walk(file, len, psize, pages + 1, free_root, main_root, b,
                        sizeof(b)) == 0);
    }
    return 0;
}
