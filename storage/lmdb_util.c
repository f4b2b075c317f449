/* storage/: error codes and messages, small LMDB helpers, read and write
 * transactions, and map growth, shared by the other storage files. */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED) */
#include "storage/storage.h"

#include <errno.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

/* --- errors --- */

/* Format "DIR: what" into s->errmsg and return @code. */
__attribute__((format(printf, 4, 5))) int ida__storage_fail(
    struct ida_storage *s,
    const char *dir,
    int code,
    const char *fmt,
    ...)
{
    int n = snprintf(s->errmsg, sizeof(s->errmsg), "%s: ", dir);
    if (n < 0 || (size_t)n >= sizeof(s->errmsg)) {
        return code; /* the directory name alone fills the message */
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errmsg + n, sizeof(s->errmsg) - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

/* The project code for an LMDB (or errno) return value. */
int ida__storage_from_lmdb(int rc)
{
    switch (rc) {
        case 0:
            return 0;
        case MDB_MAP_FULL:
        case ENOSPC:
        case EDQUOT:
            return IDA_ENOSPC;
        case ENOMEM:
            return IDA_ENOMEM;
        case MDB_TXN_FULL:
        case MDB_BAD_VALSIZE:
            return IDA_ETOOBIG;
        case RC_CORRUPT:
        case MDB_CORRUPTED:
        case MDB_PAGE_NOTFOUND:
            return IDA_ECORRUPT;
        case MDB_INVALID:
        case MDB_INCOMPATIBLE:
            return IDA_EFOREIGN;
        case MDB_VERSION_MISMATCH:
            return IDA_EVERSION;
        case MDB_NOTFOUND:
            return IDA_ENOTFOUND;
        default:
            return IDA_EIO;
    }
}

/* LMDB's message for @rc, or ours for RC_CORRUPT. */
static const char *rc_text(int rc)
{
    if (rc == RC_CORRUPT) {
        return "a stored record fails its checksum or has a wrong size";
    }
    return mdb_strerror(rc);
}

/* --- small LMDB helpers --- */

MDB_val ida__storage_mkval(const void *p, size_t len)
{
    MDB_val v = {.mv_size = len, .mv_data = (void *)p};
    return v;
}

/* Every put goes through here so tests can fail the Nth one. */
int ida__storage_put(struct ida_storage *s,
                     MDB_txn *txn,
                     MDB_dbi dbi,
                     MDB_val *k,
                     MDB_val *v,
                     unsigned flags)
{
    if (s->fault_put_after == 0) {
        s->fault_put_after = -1;
        return s->fault_code;
    }
    if (s->fault_put_after > 0) {
        s->fault_put_after--;
    }
    return mdb_put(txn, dbi, k, v, flags);
}

int ida__storage_put_meta(struct ida_storage *s,
                          MDB_txn *txn,
                          const char *key,
                          const void *p,
                          size_t len)
{
    MDB_val k = ida__storage_mkval(key, strlen(key));
    MDB_val v = ida__storage_mkval(p, len);
    return ida__storage_put(s, txn, s->dbi_meta, &k, &v, 0);
}

int ida__storage_get_meta(struct ida_storage *s,
                          MDB_txn *txn,
                          const char *key,
                          MDB_val *v)
{
    MDB_val k = ida__storage_mkval(key, strlen(key));
    return mdb_get(txn, s->dbi_meta, &k, v);
}

void ida__storage_chunk_key(uint8_t out[16], uint64_t id, uint64_t chunk)
{
    ida__put_be64(out, id);
    ida__put_be64(out + 8, chunk);
}

/* --- read transactions --- */

int ida__storage_read_begin(struct ida_storage *s, MDB_txn **txn)
{
    CHECK_PROCESS(s);
    int rc = mdb_txn_begin(ENV(s), NULL, MDB_RDONLY, txn);
    if (rc != 0) {
        IDA_ERROR("storage %s: cannot begin a read transaction: %s", s->dir,
                  mdb_strerror(rc));
    }
    return rc;
}

void ida__storage_read_end(struct ida_storage *s, MDB_txn *txn)
{
    (void)s;
    mdb_txn_abort(txn);
}

/* --- write transactions (owner) --- */

/* Double the map, up to the maximum. 0, or nonzero when it cannot grow. */
static int grow_map(struct ida_storage *s)
{
    if (s->map_size_bytes >= s->map_size_max_bytes) {
        return -1;
    }
    uint64_t want = s->map_size_bytes * 2;
    if (want > s->map_size_max_bytes || want < s->map_size_bytes) {
        want = s->map_size_max_bytes;
    }
    /* LMDB may resize only with no transaction active in the process: the
     * caller has just ended its write, and reads never outlive a call. */
    int rc = mdb_env_set_mapsize(ENV(s), (size_t)want);
    if (rc != 0) {
        IDA_ERROR("storage %s: cannot grow the map to %llu bytes: %s", s->dir,
                  (unsigned long long)want, mdb_strerror(rc));
        return rc;
    }
    s->map_base = NULL; /* moved, perhaps (ida_storage_release_pages) */
    s->map_base_size = 0;
    IDA_INFO("storage %s: map grown from %llu to %llu bytes", s->dir,
             (unsigned long long)s->map_size_bytes, (unsigned long long)want);
    s->map_size_bytes = want;
    return 0;
}

/* The map's size and the bytes of the file's pages in use (up to the last
 * page the last commit used). 0, or nonzero when LMDB cannot say. */
static int map_use(struct ida_storage *s, uint64_t *mapsize, uint64_t *used)
{
    MDB_envinfo info;
    MDB_stat st;
    if (mdb_env_info(ENV(s), &info) != 0 || mdb_env_stat(ENV(s), &st) != 0) {
        return -1;
    }
    *mapsize = info.me_mapsize;
    *used = ((uint64_t)info.me_last_pgno + 1) * st.ms_psize;
    return 0;
}

int ida_storage_reserve(struct ida_storage *s, uint64_t bytes)
{
    IDA_ASSERT(s != NULL);
    CHECK_PROCESS(s);
    uint64_t mapsize, used;
    if (map_use(s, &mapsize, &used) != 0) {
        return IDA_EIO;
    }
    /* Chunk overhead and the B-tree's own pages: an eighth, and 4 MiB. */
    uint64_t need = used + bytes + bytes / 8 + (UINT64_C(4) << 20);
    while (s->map_size_bytes < need) {
        if (grow_map(s) != 0) {
            return IDA_ENOSPC;
        }
    }
    return 0;
}

/* Where LMDB mapped data.mdb: LMDB does not say (its envinfo gives an
 * address only for MDB_FIXEDMAP), so the mapping of the file (device and
 * inode) of exactly @size bytes is looked up in /proc/self/maps. NULL if
 * there is no such mapping. */
static char *map_address(struct ida_storage *s, uint64_t size)
{
    int fd = -1;
    struct stat sb;
    if (mdb_env_get_fd(ENV(s), &fd) != 0 || fstat(fd, &sb) != 0) {
        return NULL;
    }
    FILE *f = fopen("/proc/self/maps", "r");
    char *line = NULL;
    size_t cap = 0;
    char *addr = NULL;
    while (f != NULL && addr == NULL && getline(&line, &cap, f) > 0) {
        unsigned long lo, hi, ino;
        unsigned maj, min;
        if (sscanf(line, "%lx-%lx %*s %*s %x:%x %lu", &lo, &hi, &maj, &min,
                   &ino) == 5 &&
            ino == (unsigned long)sb.st_ino && maj == major(sb.st_dev) &&
            min == minor(sb.st_dev) && hi - lo == size) {
            addr = (char *)(uintptr_t)lo;
        }
    }
    free(line);
    if (f != NULL) {
        fclose(f);
    }
    return addr;
}

void ida_storage_release_pages(struct ida_storage *s, size_t bytes)
{
    IDA_ASSERT(s != NULL);
    CHECK_PROCESS(s);
    uint64_t mapsize, end;
    if (map_use(s, &mapsize, &end) != 0) {
        return;
    }
    /* LMDB maps again only when the map is resized (mdb_env_set_mapsize(),
     * called by grow_map() and at open in this process, which is the only
     * one with the file open): a stale address could point at other
     * memory, so it is looked up again whenever the size differs (once per
     * size: a lookup that found nothing is not repeated every call). */
    if (s->map_base_size != mapsize) {
        s->map_base = map_address(s, mapsize);
        s->map_base_size = mapsize;
    }
    if (s->map_base == NULL) {
        return;
    }
    char *base = s->map_base;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (end > mapsize) {
        end = mapsize;
    }
    if (s->release_at >= end) {
        s->release_at = 0; /* a new round */
    }
    uint64_t len = end - s->release_at;
    len = len < bytes ? len : bytes;
    len -= len % page;
    if (len == 0) {
        s->release_at = 0;
        return;
    }
    char *at = base + s->release_at;
    (void)madvise(at, (size_t)len, MADV_DONTNEED); /* a hint: never fatal */
    s->release_at += len;
}

/* Codes a failed transaction leaves the storage healthy with: nothing was
 * written and retrying later may succeed. */
int ida__storage_fault_commit(struct ida_storage *s)
{
    if (s->fault_commit_after == 0) {
        s->fault_commit_after = -1;
        return s->fault_code;
    }
    if (s->fault_commit_after > 0) {
        s->fault_commit_after--;
    }
    return 0;
}

int ida__storage_stop(struct ida_storage *s, const char *what, int rc)
{
    /* After a failed write or fsync the file's state is unknown: refuse
     * every later write rather than acknowledge what may be lost. */
    s->failed = ida__storage_from_lmdb(rc);
    if (s->failed == IDA_ENOTFOUND || s->failed == IDA_EFOREIGN ||
        s->failed == 0) {
        s->failed = IDA_EIO;
    }
    /* LMDB reports a short write - what a full disk usually gives - as
     * EIO: say so when the file system is (nearly) out of space. */
    struct statvfs vfs;
    if ((rc == EIO || rc == ENOSPC) && statvfs(s->dir, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < DISK_FULL_BYTES) {
        s->failed = IDA_ENOSPC;
        return ida__storage_fail(
            s, s->dir, s->failed,
            "%s failed: %s (the file system is full: %llu bytes "
            "free); storage stopped",
            what, rc_text(rc), (unsigned long long)vfs.f_bavail * vfs.f_frsize);
    }
    return ida__storage_fail(s, s->dir, s->failed,
                             "%s failed: %s; storage stopped", what,
                             rc_text(rc));
}

static int is_transient(int rc)
{
    return rc == MDB_TXN_FULL || rc == MDB_BAD_VALSIZE || rc == ENOMEM;
}

/* Run @fn in one write transaction and commit it durably. On MDB_MAP_FULL
 * (from @fn or the commit) the transaction is aborted, the map grown and @fn
 * run again from scratch. Returns 0 or an IDA code with s->errmsg set;
 * commit failures make the storage sticky-failed. */
int ida__storage_run_write(struct ida_storage *s,
                           const char *what,
                           txn_fn fn,
                           void *arg)
{
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    for (;;) {
        MDB_txn *txn;
        int rc = mdb_txn_begin(ENV(s), NULL, 0, &txn);
        if (rc != 0) {
            s->failed = ida__storage_from_lmdb(rc);
            return ida__storage_fail(s, s->dir, s->failed,
                                     "%s: cannot begin: %s", what,
                                     mdb_strerror(rc));
        }
        int committing = 0;
        s->refused = 0;
        rc = fn(s, txn, arg);
        if (rc == RC_REFUSED) {
            mdb_txn_abort(txn);
            IDA_ASSERT(s->refused != 0);
            return s->refused;
        }
        if (rc != 0) {
            mdb_txn_abort(txn);
        } else if ((rc = ida__storage_fault_commit(s)) != 0) {
            /* Injected: behave as a commit whose write or fsync failed. */
            mdb_txn_abort(txn);
            committing = 1;
        } else {
            rc = mdb_txn_commit(txn);
            committing = 1;
        }
        if (rc == 0) {
            return 0;
        }
        if (rc == MDB_MAP_FULL) {
            int grc = grow_map(s);
            if (grc == 0) {
                continue;
            }
            if (grc > 0 || grc < -1) {
                s->failed = IDA_EIO;
                return ida__storage_fail(s, s->dir, IDA_EIO,
                                         "%s: cannot grow the map: %s", what,
                                         mdb_strerror(grc));
            }
            return ida__storage_fail(
                s, s->dir, IDA_ENOSPC,
                "%s: map full at its maximum of %llu bytes; nothing "
                "of it was written",
                what, (unsigned long long)s->map_size_max_bytes);
        }
        if (!committing && is_transient(rc)) {
            return ida__storage_fail(s, s->dir, ida__storage_from_lmdb(rc),
                                     "%s: %s; nothing written", what,
                                     mdb_strerror(rc));
        }
        return ida__storage_stop(s, what, rc);
    }
}
