/* storage/: what open checks before LMDB maps anything: the IDENTITY file
 * (read, and written once), the incarnation id, and a plain-read check of
 * data.mdb's two meta pages. See storage/storage.h ("IDENTITY AND DAMAGE"). */
#include "storage/storage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

/* --- incarnation --- */

int ida__storage_random(uint8_t *buf, size_t len)
{
    ssize_t n = getrandom(buf, len, GRND_NONBLOCK);
    if (n == (ssize_t)len) {
        return 0;
    }
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    size_t got = 0;
    while (got < len) {
        n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;
            close(fd);
            return err;
        }
        got += (size_t)n;
    }
    close(fd);
    return 0;
}

int ida__storage_mint(struct ida_storage *s,
                      const char *dir,
                      uint64_t *incarnation,
                      uint64_t *now_ms)
{
    uint64_t v = 0;
    while (v == 0) {
        uint8_t b[8];
        int err = ida__storage_random(b, sizeof(b));
        if (err != 0) {
            return ida__storage_fail(s, dir, IDA_EIO,
                                     "cannot draw an incarnation id: %s",
                                     strerror(err));
        }
        v = ida__get_be64(b);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    *incarnation = v;
    *now_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    return 0;
}

/* --- the IDENTITY file --- */

static void join(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

int ida__storage_idfile_read(struct ida_storage *s,
                             const char *dir,
                             uint8_t *buf,
                             size_t cap,
                             struct ida__rec_identity *out,
                             int *present)
{
    char path[4096 + 32];
    join(path, sizeof(path), dir, IDA_STORAGE_IDENTITY_FILE);
    *present = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            return 0;
        }
        return ida__storage_fail(s, dir, IDA_EIO, "cannot read %s: %s",
                                 IDA_STORAGE_IDENTITY_FILE, strerror(errno));
    }
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int err = errno;
            close(fd);
            return ida__storage_fail(s, dir, IDA_EIO, "cannot read %s: %s",
                                     IDA_STORAGE_IDENTITY_FILE, strerror(err));
        }
        if (n == 0 || got + (size_t)n == cap) {
            got += (size_t)n;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    *present = 1;
    if (got == cap || ida__rec_idfile_decode(buf, got, out) != 0 ||
        out->format == 0) {
        return ida__storage_fail(
            s, dir, IDA_ECORRUPT,
            "%s is damaged (%zu bytes that fail their length or checksum "
            "check); refusing to open: restore it or remove the directory "
            "to rejoin as a new incarnation (see README, Runbook)",
            IDA_STORAGE_IDENTITY_FILE, got);
    }
    return 0;
}

int ida__storage_idfile_write(struct ida_storage *s,
                              const char *dir,
                              const struct ida__rec_identity *r)
{
    uint8_t buf[IDA__REC_IDFILE_FIXED + IDA_STORAGE_CLUSTER_MAX];
    IDA_ASSERT(r->name_len <= IDA_STORAGE_CLUSTER_MAX);
    size_t len = ida__rec_idfile_encode(buf, r);
    char tmp_path[4096 + 32], path[4096 + 32];
    join(tmp_path, sizeof(tmp_path), dir, IDA_STORAGE_IDENTITY_TMP);
    join(path, sizeof(path), dir, IDA_STORAGE_IDENTITY_FILE);
    const char *step = "create";
    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : 0;
    size_t done = 0;
    while (err == 0 && done < len) {
        step = "write";
        ssize_t n = write(fd, buf + done, len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        done += (size_t)n;
    }
    if (err == 0 && fsync(fd) != 0) {
        step = "fsync";
        err = errno;
    }
    if (fd >= 0 && close(fd) != 0 && err == 0) {
        step = "close";
        err = errno;
    }
    if (err == 0 && rename(tmp_path, path) != 0) {
        step = "rename";
        err = errno;
    }
    if (err == 0) {
        step = "fsync the directory after writing";
        int dfd = open(dir, O_RDONLY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) != 0) {
            err = errno;
        }
        if (dfd >= 0) {
            close(dfd);
        }
    }
    if (err != 0) {
        unlink(tmp_path);
        return ida__storage_fail(s, dir, err == ENOSPC ? IDA_ENOSPC : IDA_EIO,
                                 "cannot %s %s: %s", step,
                                 IDA_STORAGE_IDENTITY_FILE, strerror(err));
    }
    return 0;
}

/* --- data.mdb, checked with read(2) before LMDB maps it --- */

/* LMDB 0.9's on-disk meta page (mdb.c: MDB_page header, then MDB_meta), as
 * liblmdb 0.9.24 writes it on x86-64 (native byte order, 8-byte size_t and
 * pgno_t; verified with xxd on files LMDB created). Offsets from the start
 * of the page: */
#define PG_PGNO      0   /* u64 mp_pgno: 0 and 1 for the meta pages */
#define PG_FLAGS     10  /* u16 mp_flags; P_META 0x08 */
#define M_MAGIC      16  /* u32 mm_magic, MDB_MAGIC */
#define M_VERSION    20  /* u32 mm_version, MDB_DATA_VERSION */
#define M_PSIZE      40  /* u32 mm_dbs[FREE_DBI].md_pad = mm_psize */
#define M_FREE_ROOT  80  /* u64 mm_dbs[FREE_DBI].md_root */
#define M_MAIN_ROOT  128 /* u64 mm_dbs[MAIN_DBI].md_root */
#define M_LAST_PG    136 /* u64 mm_last_pg */
#define M_TXNID      144 /* u64 mm_txnid */
#define META_BYTES   152
#define P_META       0x08
#define MDB_MAGIC_LE 0xBEEFC0DEu
#define MDB_DATA_V   1u
#define PSIZE_MIN    512u
#define PSIZE_MAX    65536u
#define PSIZE_PROBE  4096u /* where meta 1 sits when meta 0 is unreadable */

int ida__storage_read_at(int fd, uint8_t *buf, size_t len, off_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, buf + got, len - got, off + (off_t)got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return -errno;
        }
        if (n == 0) {
            return 0;
        }
        got += (size_t)n;
    }
    return 1;
}

#define DAMAGED(...) ida__storage_fail(s, dir, IDA_ECORRUPT, __VA_ARGS__)

/* Check one meta page (@i: 0 or 1) of a file of @pages pages; its roots
 * only when it is the @newer one, which LMDB opens. The older one's roots
 * may lie past its last page on a healthy file: when LMDB fails to write a
 * meta page it writes the page back with the old last page and txnid but
 * the new roots (mdb.c, mdb_env_write_meta()), and LMDB never reads them. */
static int check_meta(struct ida_storage *s,
                      const char *dir,
                      const uint8_t *m,
                      int i,
                      int newer,
                      uint32_t psize,
                      uint64_t pages)
{
    if (ida__le32(m + M_MAGIC) != MDB_MAGIC_LE) {
        return DAMAGED(
            "data.mdb meta page %d has a bad magic number" DAMAGE_TAIL, i);
    }
    if (ida__le32(m + M_VERSION) != MDB_DATA_V) {
        return DAMAGED(
            "data.mdb meta page %d has LMDB data version %u, not "
            "%u" DAMAGE_TAIL,
            i, ida__le32(m + M_VERSION), MDB_DATA_V);
    }
    if (ida__le64(m + PG_PGNO) != (uint64_t)i ||
        (ida__le16(m + PG_FLAGS) & P_META) == 0) {
        return DAMAGED(
            "data.mdb meta page %d has a bad page header" DAMAGE_TAIL, i);
    }
    if (ida__le32(m + M_PSIZE) != psize) {
        return DAMAGED(
            "data.mdb meta page %d has page size %u, meta page 0 "
            "%u" DAMAGE_TAIL,
            i, ida__le32(m + M_PSIZE), psize);
    }
    /* The last page LMDB allocated may lie past the end of the file: a
     * page allocated and freed by the same transaction (P_LOOSE) is never
     * written (mdb.c, mdb_page_flush(): "Don't flush this page yet"), and
     * one at the end of the allocated range leaves the file short of it.
     * A cleanly committed file showed so in 18 of 3,000 random
     * transactions, and a node stopped cleanly was refused as "truncated"
     * (test_catchup). Such a page is free, never read. So only the roots,
     * which are read, must be in the file. */
    uint64_t last = ida__le64(m + M_LAST_PG);
    if (last < 1) {
        return DAMAGED(
            "data.mdb meta page %d names no page past the "
            "meta pages" DAMAGE_TAIL,
            i);
    }
    const int offs[2] = {M_FREE_ROOT, M_MAIN_ROOT};
    for (int k = 0; newer && k < 2; k++) {
        uint64_t root = ida__le64(m + offs[k]);
        if (root != P_INVALID_PG && (root < 2 || root > last)) {
            return DAMAGED(
                "data.mdb meta page %d names root page %llu, "
                "outside pages 2..%llu" DAMAGE_TAIL,
                i, (unsigned long long)root, (unsigned long long)last);
        }
        if (root != P_INVALID_PG && root >= pages) {
            return DAMAGED(
                "data.mdb meta page %d names root page %llu but the file "
                "has %llu pages (truncated?)" DAMAGE_TAIL,
                i, (unsigned long long)root, (unsigned long long)pages);
        }
    }
    return 0;
}

int ida__storage_check_data(struct ida_storage *s,
                            const char *dir,
                            enum ida__data_state *state)
{
    char path[4096 + 32];
    join(path, sizeof(path), dir, "data.mdb");
    *state = IDA__DATA_ABSENT;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            return 0;
        }
        return ida__storage_fail(s, dir, IDA_EIO, "cannot read data.mdb: %s",
                                 strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return ida__storage_fail(s, dir, IDA_EIO, "cannot stat data.mdb: %s",
                                 strerror(err));
    }
    if (st.st_size == 0) {
        close(fd);
        *state = IDA__DATA_EMPTY;
        return 0;
    }
    *state = IDA__DATA_PRESENT;
    uint64_t size = (uint64_t)st.st_size;
    uint8_t m0[META_BYTES], m1[META_BYTES];
    int rv = 0;
    int r = ida__storage_read_at(fd, m0, META_BYTES, 0);
    if (r < 0) {
        rv = ida__storage_fail(s, dir, IDA_EIO, "cannot read data.mdb: %s",
                               strerror(-r));
        goto out;
    }
    if (r == 0) {
        rv = DAMAGED(
            "data.mdb is only %llu bytes, shorter than one LMDB "
            "meta page" DAMAGE_TAIL,
            (unsigned long long)size);
        goto out;
    }
    if (ida__le32(m0 + M_MAGIC) != MDB_MAGIC_LE) {
        /* LMDB itself would call this "not an LMDB file": tell a damaged
         * first meta page (the second one is intact) from a foreign file. */
        r = ida__storage_read_at(fd, m1, META_BYTES, PSIZE_PROBE);
        if (r == 1 && ida__le32(m1 + M_MAGIC) == MDB_MAGIC_LE) {
            rv = DAMAGED(
                "data.mdb meta page 0 has a bad magic number" DAMAGE_TAIL);
        } else {
            rv = ida__storage_fail(s, dir, IDA_EFOREIGN,
                                   "data.mdb is not an LMDB environment (no "
                                   "LMDB magic number); refusing to touch it");
        }
        goto out;
    }
    uint32_t psize = ida__le32(m0 + M_PSIZE);
    if (psize < PSIZE_MIN || psize > PSIZE_MAX || (psize & (psize - 1)) != 0) {
        rv = DAMAGED(
            "data.mdb meta page 0 has an impossible page size "
            "%u" DAMAGE_TAIL,
            psize);
        goto out;
    }
    if (size < 2ull * psize || size % psize != 0) {
        rv = DAMAGED(
            "data.mdb is %llu bytes, not a whole number (at least "
            "2) of its %u-byte pages (truncated?)" DAMAGE_TAIL,
            (unsigned long long)size, psize);
        goto out;
    }
    r = ida__storage_read_at(fd, m1, META_BYTES, (off_t)psize);
    if (r != 1) {
        rv = ida__storage_fail(s, dir, IDA_EIO, "cannot read data.mdb: %s",
                               r < 0 ? strerror(-r) : "short read");
        goto out;
    }
    uint64_t pages = size / psize;
    uint64_t t0 = ida__le64(m0 + M_TXNID), t1 = ida__le64(m1 + M_TXNID);
    rv = check_meta(s, dir, m0, 0, t0 >= t1, psize, pages);
    if (rv == 0) {
        rv = check_meta(s, dir, m1, 1, t1 > t0, psize, pages);
    }
    if (rv != 0) {
        goto out;
    }
    /* Transaction N writes meta page N % 2, so the two hold consecutive
     * txnids (both 0 before the first commit). LMDB opens the meta with the
     * higher txnid: a damaged txnid in the older page would make LMDB pick
     * it and silently roll back the last commit. */
    int ok = (t0 == 0 && t1 == 0) ||
             (t0 % 2 == 0 && t1 % 2 == 1 && (t1 == t0 + 1 || t0 == t1 + 1));
    /* LMDB 0.9 never lowers its last page, so the newer meta page names
     * at least as many pages as the older one. */
    uint64_t l0 = ida__le64(m0 + M_LAST_PG), l1 = ida__le64(m1 + M_LAST_PG);
    if (ok && (t1 > t0 ? l1 < l0 : l0 < l1)) {
        rv = DAMAGED(
            "data.mdb meta page %d (transaction %llu) names fewer "
            "pages than the older one: one meta page is "
            "damaged" DAMAGE_TAIL,
            t1 > t0 ? 1 : 0, (unsigned long long)(t1 > t0 ? t1 : t0));
    }
    if (!ok) {
        rv = DAMAGED(
            "data.mdb meta pages hold transaction ids %llu and %llu, "
            "not consecutive: one meta page is damaged and LMDB "
            "could silently roll back the last commit" DAMAGE_TAIL,
            (unsigned long long)t0, (unsigned long long)t1);
    }
    /* The newer meta page, which LMDB opens, may name pages past the end
     * of the file: free pages never written, or a cut (pages.c). */
    const uint8_t *m = t1 > t0 ? m1 : m0;
    if (rv == 0 && ida__le64(m + M_LAST_PG) >= pages) {
        rv = ida__storage_check_pages(s, dir, fd, psize, pages,
                                      ida__le64(m + M_FREE_ROOT),
                                      ida__le64(m + M_MAIN_ROOT));
    }
out:
    close(fd);
    return rv;
}
