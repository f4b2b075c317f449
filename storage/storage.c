#include "storage/storage.h"

#include <dirent.h>
#include <errno.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/record.h"

#define ENV(s) ((MDB_env *)(s)->env)

/* Below this much free space a failed write is reported as a full disk. */
#define DISK_FULL_BYTES (1u << 20)

/* Keys of the meta database. */
#define KEY_FORMAT     "format"
#define KEY_IDENTITY   "identity"
#define KEY_HARD_STATE "hard_state"
#define KEY_LOG_PREV   "log_prev"
#define KEY_SNAPSHOT   "snapshot"

/* Every call must come from the process that opened the environment: an
 * LMDB environment must never be used across fork(). */
#define CHECK_PROCESS(s) IDA_ASSERT((long)getpid() == (s)->pid)

/* --- one open per process --- */

#define REGISTRY_MAX 64
static struct
{
    dev_t dev;
    ino_t ino;
    int used;
} registry[REGISTRY_MAX];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* Claim directory (@dev, @ino) for this process. 0 or IDA_EEXIST. */
static int registry_claim(dev_t dev, ino_t ino)
{
    int rv = IDA_EEXIST;
    int free_slot = -1;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < REGISTRY_MAX; i++) {
        if (registry[i].used && registry[i].dev == dev &&
            registry[i].ino == ino) {
            goto out;
        }
        if (!registry[i].used && free_slot < 0) {
            free_slot = i;
        }
    }
    if (free_slot < 0) {
        rv = IDA_ENOMEM;
        goto out;
    }
    registry[free_slot].dev = dev;
    registry[free_slot].ino = ino;
    registry[free_slot].used = 1;
    rv = 0;
out:
    pthread_mutex_unlock(&registry_lock);
    return rv;
}

static void registry_release(dev_t dev, ino_t ino)
{
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < REGISTRY_MAX; i++) {
        if (registry[i].used && registry[i].dev == dev &&
            registry[i].ino == ino) {
            registry[i].used = 0;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

/* --- errors --- */

/* Format "DIR: what" into s->errmsg and return @code. */
__attribute__((format(printf, 4, 5))) static int fail(struct ida_storage *s,
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

/* A transaction function's return value meaning "refused by a check":
 * s->refused holds the IDA code and s->errmsg the message; the transaction is
 * aborted and the storage stays healthy. Outside LMDB's and errno's ranges. */
#define RC_REFUSED (-1)

/* Our own check found a stored record with a bad checksum or size (the
 * record is named in a log line). */
#define RC_CORRUPT (-2)

/* refuse(s, dir, code, fmt, ...): fail() that also records s->refused. */
#define refuse(s, ...) ((s)->refused = fail((s), __VA_ARGS__))

/* The project code for an LMDB (or errno) return value. */
static int from_lmdb(int rc)
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

static MDB_val mkval(const void *p, size_t len)
{
    MDB_val v = {.mv_size = len, .mv_data = (void *)p};
    return v;
}

/* Every put goes through here so tests can fail the Nth one. */
static int put(struct ida_storage *s,
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

static int put_meta(struct ida_storage *s,
                    MDB_txn *txn,
                    const char *key,
                    const void *p,
                    size_t len)
{
    MDB_val k = mkval(key, strlen(key));
    MDB_val v = mkval(p, len);
    return put(s, txn, s->dbi_meta, &k, &v, 0);
}

static int get_meta(struct ida_storage *s,
                    MDB_txn *txn,
                    const char *key,
                    MDB_val *v)
{
    MDB_val k = mkval(key, strlen(key));
    return mdb_get(txn, s->dbi_meta, &k, v);
}

static void index_key(uint8_t out[8], ida_index index)
{
    ida__put_be64(out, index);
}

static void chunk_key(uint8_t out[16], uint64_t id, uint64_t chunk)
{
    ida__put_be64(out, id);
    ida__put_be64(out + 8, chunk);
}

/* Read the log_prev record. MDB rc or RC_CORRUPT. */
static int read_log_prev(struct ida_storage *s,
                         MDB_txn *txn,
                         ida_index *index,
                         ida_term *term)
{
    MDB_val v;
    int rc = get_meta(s, txn, KEY_LOG_PREV, &v);
    if (rc != 0) {
        return rc == MDB_NOTFOUND ? RC_CORRUPT : rc;
    }
    if (ida__rec_log_prev_decode(v.mv_data, v.mv_size, index, term) != 0) {
        return RC_CORRUPT;
    }
    return 0;
}

/* Term of entry @index from the log database. MDB rc or RC_CORRUPT. */
static int read_entry_term(struct ida_storage *s,
                           MDB_txn *txn,
                           ida_index index,
                           ida_term *term)
{
    uint8_t kb[8];
    index_key(kb, index);
    MDB_val k = mkval(kb, 8);
    MDB_val v;
    int rc = mdb_get(txn, s->dbi_log, &k, &v);
    if (rc != 0) {
        return rc;
    }
    struct ida_entry e;
    if (ida__rec_entry_decode(v.mv_data, v.mv_size, index, &e) != 0) {
        IDA_ERROR("storage %s: log entry %llu fails its checksum", s->dir,
                  (unsigned long long)index);
        return RC_CORRUPT;
    }
    *term = e.term;
    return 0;
}

/* The log's bounds as seen by @txn. MDB rc or RC_CORRUPT. */
static int read_log_state(struct ida_storage *s,
                          MDB_txn *txn,
                          struct ida_log_state *out)
{
    int rc = read_log_prev(s, txn, &out->prev_index, &out->prev_term);
    if (rc != 0) {
        return rc;
    }
    out->first = out->prev_index + 1;
    out->last = out->prev_index;
    out->last_term = out->prev_term;
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, s->dbi_log, &cur);
    if (rc != 0) {
        return rc;
    }
    MDB_val k, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_LAST);
    if (rc == MDB_NOTFOUND) {
        mdb_cursor_close(cur);
        return 0;
    }
    if (rc == 0 && k.mv_size != 8) {
        rc = RC_CORRUPT;
    }
    if (rc == 0) {
        struct ida_entry e;
        ida_index last = ida__get_be64(k.mv_data);
        if (ida__rec_entry_decode(v.mv_data, v.mv_size, last, &e) != 0 ||
            last <= out->prev_index) {
            rc = RC_CORRUPT;
        } else {
            out->last = last;
            out->last_term = e.term;
        }
    }
    mdb_cursor_close(cur);
    return rc;
}

/* --- read transactions (any thread) --- */

static int read_begin(struct ida_storage *s, MDB_txn **txn)
{
    CHECK_PROCESS(s);
    pthread_rwlock_rdlock(&s->resize_lock);
    int rc = mdb_txn_begin(ENV(s), NULL, MDB_RDONLY, txn);
    if (rc != 0) {
        pthread_rwlock_unlock(&s->resize_lock);
        IDA_ERROR("storage %s: cannot begin a read transaction: %s", s->dir,
                  mdb_strerror(rc));
    }
    return rc;
}

static void read_end(struct ida_storage *s, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    pthread_rwlock_unlock(&s->resize_lock);
}

/* --- write transactions (owner) --- */

typedef int (*txn_fn)(struct ida_storage *s, MDB_txn *txn, void *arg);

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
    /* LMDB may resize only with no transaction active in the process:
     * readers on other threads hold this lock shared. */
    pthread_rwlock_wrlock(&s->resize_lock);
    int rc = mdb_env_set_mapsize(ENV(s), (size_t)want);
    pthread_rwlock_unlock(&s->resize_lock);
    if (rc != 0) {
        IDA_ERROR("storage %s: cannot grow the map to %llu bytes: %s", s->dir,
                  (unsigned long long)want, mdb_strerror(rc));
        return rc;
    }
    IDA_INFO("storage %s: map grown from %llu to %llu bytes", s->dir,
             (unsigned long long)s->map_size_bytes, (unsigned long long)want);
    s->map_size_bytes = want;
    return 0;
}

/* Codes a failed transaction leaves the storage healthy with: nothing was
 * written and retrying later may succeed. */
static int is_transient(int rc)
{
    return rc == MDB_TXN_FULL || rc == MDB_BAD_VALSIZE || rc == ENOMEM;
}

/* Run @fn in one write transaction and commit it durably. On MDB_MAP_FULL
 * (from @fn or the commit) the transaction is aborted, the map grown and @fn
 * run again from scratch. Returns 0 or an IDA code with s->errmsg set;
 * commit failures make the storage sticky-failed. */
static int run_write(struct ida_storage *s,
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
            s->failed = from_lmdb(rc);
            return fail(s, s->dir, s->failed, "%s: cannot begin: %s", what,
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
        } else if (s->fault_commit_after == 0) {
            /* Injected: behave as a commit whose write or fsync failed. */
            s->fault_commit_after = -1;
            mdb_txn_abort(txn);
            rc = s->fault_code;
            committing = 1;
        } else {
            if (s->fault_commit_after > 0) {
                s->fault_commit_after--;
            }
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
                return fail(s, s->dir, IDA_EIO, "%s: cannot grow the map: %s",
                            what, mdb_strerror(grc));
            }
            return fail(s, s->dir, IDA_ENOSPC,
                        "%s: map full at its maximum of %llu bytes; nothing "
                        "of it was written",
                        what, (unsigned long long)s->map_size_max_bytes);
        }
        if (!committing && is_transient(rc)) {
            return fail(s, s->dir, from_lmdb(rc), "%s: %s; nothing written",
                        what, mdb_strerror(rc));
        }
        /* After a failed write or fsync the file's state is unknown: refuse
         * every later write rather than acknowledge what may be lost. */
        s->failed = from_lmdb(rc);
        if (s->failed == IDA_ENOTFOUND || s->failed == IDA_EFOREIGN) {
            s->failed = IDA_EIO;
        }
        /* LMDB reports a short write - what a full disk usually gives - as
         * EIO: say so when the file system is (nearly) out of space. */
        struct statvfs vfs;
        if (rc == EIO && statvfs(s->dir, &vfs) == 0 &&
            (uint64_t)vfs.f_bavail * vfs.f_frsize < DISK_FULL_BYTES) {
            s->failed = IDA_ENOSPC;
            return fail(s, s->dir, s->failed,
                        "%s failed: %s (the file system is full: %llu bytes "
                        "free); storage stopped",
                        what, rc_text(rc),
                        (unsigned long long)vfs.f_bavail * vfs.f_frsize);
        }
        return fail(s, s->dir, s->failed, "%s failed: %s; storage stopped",
                    what, rc_text(rc));
    }
}

/* --- open --- */

/* mkdir -p @dir. 0 or an errno. */
static int make_dirs(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof(path)) {
        return ENAMETOOLONG;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0') {
            continue;
        }
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            return errno;
        }
        path[i] = c;
    }
    return 0;
}

/* A directory without data.mdb may hold nothing but a leftover lock.mdb:
 * anything else means it belongs to someone else. */
static int check_empty_dir(struct ida_storage *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return fail(s, dir, IDA_EIO, "cannot read the directory: %s",
                    strerror(errno));
    }
    int rv = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, "lock.mdb") == 0) {
            continue;
        }
        rv = fail(s, dir, IDA_EFOREIGN,
                  "not empty and holds no idalloc storage (found \"%s\"); "
                  "refusing to write to it",
                  de->d_name);
        break;
    }
    closedir(d);
    return rv;
}

struct open_args
{
    const struct ida_storage_opts *o;
};

/* Create the databases and the identity of a new environment. */
static int init_fresh(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct open_args *a = arg;
    int rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &s->dbi_meta);
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "log", MDB_CREATE, &s->dbi_log);
    }
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "snap", MDB_CREATE, &s->dbi_snap);
    }
    uint8_t fmt[IDA__REC_FORMAT_BYTES];
    ida__rec_format_encode(fmt, IDA_STORAGE_FORMAT_VERSION);
    if (rc == 0) {
        rc = put_meta(s, txn, KEY_FORMAT, fmt, sizeof(fmt));
    }
    uint8_t ident[IDA__REC_IDENTITY_FIXED + IDA_STORAGE_CLUSTER_MAX];
    size_t n = ida__rec_identity_encode(ident, a->o->node_id, a->o->cluster,
                                        strlen(a->o->cluster));
    if (rc == 0) {
        rc = put_meta(s, txn, KEY_IDENTITY, ident, n);
    }
    uint8_t hs[IDA__REC_HARD_STATE_BYTES];
    struct ida_hard_state zero = {0, 0, 0};
    ida__rec_hard_state_encode(hs, &zero);
    if (rc == 0) {
        rc = put_meta(s, txn, KEY_HARD_STATE, hs, sizeof(hs));
    }
    uint8_t prev[IDA__REC_LOG_PREV_BYTES];
    ida__rec_log_prev_encode(prev, 0, 0);
    if (rc == 0) {
        rc = put_meta(s, txn, KEY_LOG_PREV, prev, sizeof(prev));
    }
    return rc;
}

/* Check format and identity of an existing environment. MDB rc, or
 * RC_REFUSED with s->refused and s->errmsg set by a failed check. */
static int check_identity(struct ida_storage *s,
                          MDB_txn *txn,
                          struct open_args *a)
{
    MDB_val v;
    int rc = get_meta(s, txn, KEY_FORMAT, &v);
    uint32_t version;
    if (rc == MDB_NOTFOUND) {
        refuse(s, s->dir, IDA_EFOREIGN,
               "no format record: not idalloc storage");
        return RC_REFUSED;
    }
    if (rc != 0) {
        return rc;
    }
    if (ida__rec_format_decode(v.mv_data, v.mv_size, &version) != 0) {
        refuse(s, s->dir, IDA_ECORRUPT, "format record fails its checksum");
        return RC_REFUSED;
    }
    if (version != IDA_STORAGE_FORMAT_VERSION) {
        refuse(s, s->dir, IDA_EVERSION,
               version > IDA_STORAGE_FORMAT_VERSION
                   ? "format version %u is newer than this program's "
                     "(%u); upgrade idalloc"
                   : "unknown format version %u (this program reads %u)",
               version, IDA_STORAGE_FORMAT_VERSION);
        return RC_REFUSED;
    }
    rc = get_meta(s, txn, KEY_IDENTITY, &v);
    if (rc != 0) {
        return rc == MDB_NOTFOUND ? RC_CORRUPT : rc;
    }
    ida_node_id node;
    const char *name;
    size_t name_len;
    if (ida__rec_identity_decode(v.mv_data, v.mv_size, &node, &name,
                                 &name_len) != 0) {
        refuse(s, s->dir, IDA_ECORRUPT, "identity record fails its checksum");
        return RC_REFUSED;
    }
    if (name_len != strlen(a->o->cluster) ||
        memcmp(name, a->o->cluster, name_len) != 0) {
        refuse(s, s->dir, IDA_EFOREIGN,
               "belongs to cluster \"%.*s\", not \"%s\"", (int)name_len, name,
               a->o->cluster);
        return RC_REFUSED;
    }
    if (node != a->o->node_id) {
        refuse(s, s->dir, IDA_EFOREIGN, "belongs to node %u, not node %u",
               (unsigned)node, (unsigned)a->o->node_id);
        return RC_REFUSED;
    }
    return 0;
}

/* Delete every snapshot chunk whose id is not @keep (unfinished or replaced
 * snapshots of a crashed run); remember the highest id seen. */
static int collect_chunks(struct ida_storage *s,
                          MDB_txn *txn,
                          uint64_t keep,
                          uint64_t *max_id)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->dbi_snap, &cur);
    if (rc != 0) {
        return rc;
    }
    uint64_t dropped = 0;
    uint8_t kb[16];
    chunk_key(kb, 0, 0);
    for (;;) {
        MDB_val k = mkval(kb, 16), v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc != 0) {
            break;
        }
        if (k.mv_size != 16) {
            rc = RC_CORRUPT;
            break;
        }
        uint64_t id = ida__get_be64(k.mv_data);
        if (id > *max_id) {
            *max_id = id;
        }
        if (id == keep) {
            chunk_key(kb, id + 1, 0); /* skip past the kept snapshot */
            if (id == UINT64_MAX) {
                break;
            }
            continue;
        }
        uint64_t chunk = ida__get_be64((const uint8_t *)k.mv_data + 8);
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            break;
        }
        dropped++;
        chunk_key(kb, id, chunk);
    }
    mdb_cursor_close(cur);
    if (dropped > 0) {
        IDA_INFO("storage %s: dropped %llu chunks of unfinished snapshots",
                 s->dir, (unsigned long long)dropped);
    }
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Load the owner's cache from an existing environment. */
static int load_state(struct ida_storage *s, MDB_txn *txn)
{
    MDB_val v;
    int rc = get_meta(s, txn, KEY_HARD_STATE, &v);
    if (rc != 0) {
        return rc == MDB_NOTFOUND ? RC_CORRUPT : rc;
    }
    if (ida__rec_hard_state_decode(v.mv_data, v.mv_size, &s->hard_state) != 0) {
        return RC_CORRUPT;
    }
    rc = read_log_state(s, txn, &s->log);
    if (rc != 0) {
        return rc;
    }
    s->has_snapshot = 0;
    rc = get_meta(s, txn, KEY_SNAPSHOT, &v);
    if (rc == 0) {
        struct ida__rec_snapshot r;
        if (ida__rec_snapshot_decode(v.mv_data, v.mv_size, &r) != 0) {
            return RC_CORRUPT;
        }
        s->has_snapshot = 1;
        s->snapshot_id = r.id;
        s->snapshot_index = r.index;
        s->snapshot_term = r.term;
    } else if (rc != MDB_NOTFOUND) {
        return rc;
    }
    uint64_t max_id = s->has_snapshot ? s->snapshot_id : 0;
    rc = collect_chunks(s, txn, s->has_snapshot ? s->snapshot_id : 0, &max_id);
    s->next_snapshot_id = max_id + 1;
    return rc;
}

static int open_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct open_args *a = arg;
    MDB_dbi main_dbi;
    int rc = mdb_dbi_open(txn, NULL, 0, &main_dbi);
    if (rc != 0) {
        return rc;
    }
    MDB_stat st;
    rc = mdb_stat(txn, main_dbi, &st);
    if (rc != 0) {
        return rc;
    }
    if (st.ms_entries == 0) {
        /* Empty environment: a new directory, or a first start that died
         * before its initialising commit. Nothing here to overwrite. */
        rc = init_fresh(s, txn, a);
        if (rc == 0) {
            rc = load_state(s, txn);
        }
        return rc;
    }
    rc = mdb_dbi_open(txn, "meta", 0, &s->dbi_meta);
    if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE) {
        refuse(s, s->dir, IDA_EFOREIGN,
               "holds an LMDB database that is not idalloc storage");
        return RC_REFUSED;
    }
    if (rc != 0) {
        return rc;
    }
    rc = check_identity(s, txn, a);
    if (rc != 0) {
        return rc;
    }
    rc = mdb_dbi_open(txn, "log", 0, &s->dbi_log);
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "snap", 0, &s->dbi_snap);
    }
    if (rc == MDB_NOTFOUND) {
        return RC_CORRUPT;
    }
    if (rc == 0) {
        rc = load_state(s, txn);
    }
    return rc;
}

static int check_opts(struct ida_storage *s,
                      const char *dir,
                      const struct ida_storage_opts *o)
{
    if (dir == NULL || dir[0] == '\0' || o == NULL) {
        return fail(s, dir ? dir : "(null)", IDA_EINVAL, "no directory");
    }
    size_t n = o->cluster ? strlen(o->cluster) : 0;
    if (n == 0 || n > IDA_STORAGE_CLUSTER_MAX) {
        return fail(s, dir, IDA_EINVAL, "cluster name must be 1-%d bytes",
                    IDA_STORAGE_CLUSTER_MAX);
    }
    if (o->node_id == 0) {
        return fail(s, dir, IDA_EINVAL, "node id must be nonzero");
    }
    uint64_t map =
        o->map_size_bytes ? o->map_size_bytes : IDA_STORAGE_MAP_SIZE_DEFAULT;
    uint64_t max = o->map_size_max_bytes ? o->map_size_max_bytes
                                         : IDA_STORAGE_MAP_SIZE_MAX_DEFAULT;
    if (map > max || map < 64 * 1024 || max > SIZE_MAX) {
        return fail(s, dir, IDA_EINVAL,
                    "map size %llu must be >= 64 KiB and <= its maximum %llu",
                    (unsigned long long)map, (unsigned long long)max);
    }
    s->map_size_bytes = map;
    s->map_size_max_bytes = max;
    return 0;
}

/* Create the environment handle and open it. An existing environment
 * opens with the map size it last had (LMDB adopts the size recorded in the
 * file when none is set), so a grown map stays grown across restarts. */
static int env_open(struct ida_storage *s, const char *dir, int fresh)
{
    MDB_env *env;
    int rc = mdb_env_create(&env);
    if (rc != 0) {
        return fail(s, dir, from_lmdb(rc), "cannot create an environment: %s",
                    mdb_strerror(rc));
    }
    mdb_env_set_maxdbs(env, 4);
    if (fresh) {
        rc = mdb_env_set_mapsize(env, (size_t)s->map_size_bytes);
    }
    if (rc == 0) {
        rc = mdb_env_open(env, dir, MDB_NOTLS, 0644);
    }
    MDB_envinfo info;
    if (rc == 0) {
        rc = mdb_env_info(env, &info);
    }
    if (rc == 0 && info.me_mapsize < s->map_size_bytes) {
        rc = mdb_env_set_mapsize(env, (size_t)s->map_size_bytes);
        info.me_mapsize = s->map_size_bytes;
    }
    if (rc != 0) {
        mdb_env_close(env);
        int code = from_lmdb(rc);
        if (code == IDA_EFOREIGN) {
            return fail(s, dir, code,
                        "data.mdb is not an LMDB environment (%s); refusing "
                        "to touch it",
                        mdb_strerror(rc));
        }
        return fail(s, dir, code == IDA_ENOTFOUND ? IDA_EIO : code,
                    "cannot open the LMDB environment: %s", mdb_strerror(rc));
    }
    s->env = env;
    s->map_size_bytes = info.me_mapsize;
    if (s->map_size_max_bytes < s->map_size_bytes) {
        s->map_size_max_bytes = s->map_size_bytes;
    }
    int dead = 0;
    if (mdb_reader_check(env, &dead) == 0 && dead > 0) {
        IDA_INFO("storage %s: cleared %d stale reader slots", dir, dead);
    }
    return 0;
}

int ida_storage_open(struct ida_storage *s,
                     const char *dir,
                     const struct ida_storage_opts *o)
{
    IDA_ASSERT(s != NULL);
    memset(s, 0, sizeof(*s));
    s->fault_put_after = -1;
    s->fault_commit_after = -1;
    s->pid = (long)getpid();
    int rv = check_opts(s, dir, o);
    if (rv != 0) {
        return rv;
    }
    int erc = make_dirs(dir);
    struct stat st;
    if (erc == 0 && stat(dir, &st) != 0) {
        erc = errno;
    }
    if (erc == 0 && !S_ISDIR(st.st_mode)) {
        erc = ENOTDIR;
    }
    if (erc != 0) {
        return fail(s, dir, erc == ENOSPC ? IDA_ENOSPC : IDA_EIO,
                    "cannot create the directory: %s", strerror(erc));
    }
    rv = registry_claim(st.st_dev, st.st_ino);
    if (rv != 0) {
        return fail(s, dir, rv,
                    rv == IDA_EEXIST ? "already open in this process"
                                     : "too many storages open in this "
                                       "process");
    }
    s->dir_dev = (uint64_t)st.st_dev;
    s->dir_ino = (uint64_t)st.st_ino;
    struct open_args a = {.o = o};
    char path[4096 + 16];
    snprintf(path, sizeof(path), "%s/data.mdb", dir);
    int fresh = access(path, F_OK) != 0;
    if (fresh) {
        rv = check_empty_dir(s, dir);
        if (rv != 0) {
            goto err_after_claim;
        }
    }
    s->dir = ida_strndup(dir, strlen(dir));
    if (s->dir == NULL) {
        rv = fail(s, dir, IDA_ENOMEM, "out of memory");
        goto err_after_claim;
    }
    if (pthread_rwlock_init(&s->resize_lock, NULL) != 0) {
        rv = fail(s, dir, IDA_ENOMEM, "cannot create a lock");
        goto err_after_dir;
    }
    rv = env_open(s, dir, fresh);
    if (rv != 0) {
        goto err_after_lock;
    }
    rv = run_write(s, "open", open_txn, &a);
    if (rv != 0) {
        goto err_after_env;
    }
    IDA_ASSERT(s->log.first == s->log.prev_index + 1);
    IDA_ASSERT(s->log.last >= s->log.prev_index);
    return 0;

err_after_env:
    mdb_env_close(ENV(s));
    s->env = NULL;
err_after_lock:
    pthread_rwlock_destroy(&s->resize_lock);
err_after_dir:
    ida_free(s->dir);
    s->dir = NULL;
err_after_claim:
    registry_release(st.st_dev, st.st_ino);
    s->failed = rv;
    return rv;
}

void ida_storage_close(struct ida_storage *s)
{
    IDA_ASSERT(s != NULL && s->env != NULL);
    CHECK_PROCESS(s);
    IDA_ASSERT(!s->writer_active);
    mdb_env_close(ENV(s));
    s->env = NULL;
    registry_release((dev_t)s->dir_dev, (ino_t)s->dir_ino);
    pthread_rwlock_destroy(&s->resize_lock);
    ida_free(s->dir);
    s->dir = NULL;
}

int ida_storage_failed(const struct ida_storage *s)
{
    return s->failed;
}

uint64_t ida_storage_map_size(const struct ida_storage *s)
{
    return s->map_size_bytes;
}

void ida__storage_fault_set(struct ida_storage *s,
                            int put_after,
                            int commit_after,
                            int code)
{
    s->fault_put_after = put_after;
    s->fault_commit_after = commit_after;
    s->fault_code = code;
}

/* --- group commit --- */

void ida_storage_batch_init(struct ida_storage *s, struct ida_storage_batch *b)
{
    IDA_ASSERT(s != NULL && b != NULL);
    memset(b, 0, sizeof(*b));
    b->last = s->log.last;
    b->last_term = s->log.last_term;
}

/* Owner-side term lookup outside any write transaction. */
static int owner_term_at(struct ida_storage *s, ida_index index, ida_term *out)
{
    if (index == s->log.prev_index) {
        *out = s->log.prev_term;
        return 0;
    }
    return ida_storage_term_at(s, index, out);
}

int ida_storage_batch_truncate(struct ida_storage *s,
                               struct ida_storage_batch *b,
                               ida_index from)
{
    IDA_ASSERT(s != NULL && b != NULL);
    if (b->has_truncate || b->span_count > 0) {
        return fail(s, s->dir, IDA_EINVAL,
                    "truncate must come first in a batch, once");
    }
    if (from < s->log.first || from > s->log.last + 1) {
        return fail(s, s->dir, IDA_EINVAL,
                    "truncate from %llu outside the log [%llu, %llu]",
                    (unsigned long long)from, (unsigned long long)s->log.first,
                    (unsigned long long)s->log.last + 1);
    }
    if (from <= s->hard_state.commit) {
        return fail(s, s->dir, IDA_EINVAL,
                    "truncate from %llu would remove committed entries "
                    "(commit %llu)",
                    (unsigned long long)from,
                    (unsigned long long)s->hard_state.commit);
    }
    ida_term term;
    int rv = owner_term_at(s, from - 1, &term);
    if (rv != 0) {
        return fail(s, s->dir, rv, "truncate: cannot read the term of %llu",
                    (unsigned long long)(from - 1));
    }
    b->has_truncate = 1;
    b->truncate_from = from;
    b->last = from - 1;
    b->last_term = term;
    return 0;
}

int ida_storage_batch_append(struct ida_storage *s,
                             struct ida_storage_batch *b,
                             const struct ida_entry *entries,
                             size_t count)
{
    IDA_ASSERT(s != NULL && b != NULL);
    if (count == 0) {
        return 0;
    }
    if (entries == NULL) {
        return fail(s, s->dir, IDA_EINVAL, "append: no entries");
    }
    if (b->span_count == IDA_STORAGE_BATCH_SPANS_MAX) {
        return fail(s, s->dir, IDA_ETOOBIG, "append: more than %d appends",
                    IDA_STORAGE_BATCH_SPANS_MAX);
    }
    ida_index last = b->last;
    ida_term last_term = b->last_term;
    for (size_t i = 0; i < count; i++) {
        const struct ida_entry *e = &entries[i];
        if (e->index != last + 1) {
            return fail(s, s->dir, IDA_EINVAL,
                        "append: entry index %llu does not follow %llu",
                        (unsigned long long)e->index, (unsigned long long)last);
        }
        if (e->term == 0 || e->term < last_term) {
            return fail(s, s->dir, IDA_EINVAL,
                        "append: entry %llu has term %llu below %llu",
                        (unsigned long long)e->index,
                        (unsigned long long)e->term,
                        (unsigned long long)last_term);
        }
        if ((unsigned)e->type > IDA_ENTRY_CONFIG) {
            return fail(s, s->dir, IDA_EINVAL, "append: entry %llu type %d",
                        (unsigned long long)e->index, (int)e->type);
        }
        if (e->len > IDA_STORAGE_ENTRY_BYTES_MAX ||
            (e->len > 0 && e->data == NULL)) {
            return fail(s, s->dir, IDA_EINVAL,
                        "append: entry %llu has %zu bytes of data",
                        (unsigned long long)e->index, e->len);
        }
        last = e->index;
        last_term = e->term;
    }
    b->spans[b->span_count].entries = entries;
    b->spans[b->span_count].count = count;
    b->span_count++;
    b->last = last;
    b->last_term = last_term;
    return 0;
}

int ida_storage_batch_set_hard_state(struct ida_storage *s,
                                     struct ida_storage_batch *b,
                                     const struct ida_hard_state *hs)
{
    IDA_ASSERT(s != NULL && b != NULL && hs != NULL);
    const struct ida_hard_state *cur = &s->hard_state;
    if (hs->term < cur->term) {
        return fail(s, s->dir, IDA_EINVAL, "hard state: term %llu below %llu",
                    (unsigned long long)hs->term,
                    (unsigned long long)cur->term);
    }
    if (hs->term == cur->term && cur->vote != 0 && hs->vote != cur->vote) {
        return fail(s, s->dir, IDA_EINVAL,
                    "hard state: vote for %u changed to %u within term %llu",
                    (unsigned)cur->vote, (unsigned)hs->vote,
                    (unsigned long long)hs->term);
    }
    if (hs->commit < cur->commit) {
        return fail(s, s->dir, IDA_EINVAL, "hard state: commit %llu below %llu",
                    (unsigned long long)hs->commit,
                    (unsigned long long)cur->commit);
    }
    b->has_hard_state = 1;
    b->hard_state = *hs;
    return 0;
}

/* Delete log entries with index >= @from (walking back from the end). */
static int delete_suffix(struct ida_storage *s, MDB_txn *txn, ida_index from)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->dbi_log, &cur);
    if (rc != 0) {
        return rc;
    }
    MDB_val k, v;
    while ((rc = mdb_cursor_get(cur, &k, &v, MDB_LAST)) == 0) {
        if (k.mv_size != 8) {
            rc = RC_CORRUPT;
            break;
        }
        if (ida__get_be64(k.mv_data) < from) {
            break;
        }
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            break;
        }
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Store one entry: header and data written straight into LMDB's page. */
static int put_entry(struct ida_storage *s,
                     MDB_txn *txn,
                     const struct ida_entry *e)
{
    uint8_t kb[8];
    index_key(kb, e->index);
    MDB_val k = mkval(kb, 8);
    MDB_val v = mkval(NULL, IDA__REC_ENTRY_HDR_BYTES + e->len);
    /* Keys only grow within a batch (after its truncation): MDB_APPEND. */
    int rc = put(s, txn, s->dbi_log, &k, &v, MDB_RESERVE | MDB_APPEND);
    if (rc != 0) {
        return rc;
    }
    uint8_t *p = v.mv_data;
    ida__rec_entry_header(p, e);
    if (e->len > 0) {
        memcpy(p + IDA__REC_ENTRY_HDR_BYTES, e->data, e->len);
    }
    return 0;
}

static int batch_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct ida_storage_batch *b = arg;
    int rc = 0;
    if (b->has_truncate) {
        rc = delete_suffix(s, txn, b->truncate_from);
    }
    for (size_t i = 0; rc == 0 && i < b->span_count; i++) {
        for (size_t j = 0; rc == 0 && j < b->spans[i].count; j++) {
            rc = put_entry(s, txn, &b->spans[i].entries[j]);
        }
    }
    if (rc == 0 && b->has_hard_state) {
        uint8_t hs[IDA__REC_HARD_STATE_BYTES];
        ida__rec_hard_state_encode(hs, &b->hard_state);
        rc = put_meta(s, txn, KEY_HARD_STATE, hs, sizeof(hs));
    }
    return rc;
}

int ida_storage_batch_commit(struct ida_storage *s, struct ida_storage_batch *b)
{
    IDA_ASSERT(s != NULL && b != NULL);
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    const struct ida_hard_state *hs = &b->hard_state;
    int same_hs = !b->has_hard_state || (hs->term == s->hard_state.term &&
                                         hs->vote == s->hard_state.vote &&
                                         hs->commit == s->hard_state.commit);
    if (!b->has_truncate && b->span_count == 0 && same_hs) {
        return 0; /* nothing would change: no transaction, no fsync */
    }
    if (b->has_hard_state && b->hard_state.commit > b->last) {
        return fail(s, s->dir, IDA_EINVAL,
                    "hard state: commit %llu beyond the last entry %llu",
                    (unsigned long long)b->hard_state.commit,
                    (unsigned long long)b->last);
    }
    int rv = run_write(s, "batch commit", batch_txn, b);
    if (rv != 0) {
        return rv;
    }
    s->log.last = b->last;
    s->log.last_term = b->last_term;
    if (b->has_hard_state) {
        s->hard_state = b->hard_state;
    }
    IDA_ASSERT(s->log.last >= s->log.prev_index);
    IDA_ASSERT(s->hard_state.commit <= s->log.last ||
               s->hard_state.commit <= s->snapshot_index);
    return 0;
}

/* --- compaction --- */

struct compact_args
{
    ida_index upto;       /* delete entries <= upto */
    ida_index prev_index; /* the new log_prev */
    ida_term prev_term;
    int discard_all; /* drop the whole log */
};

static int compact_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct compact_args *a = arg;
    int rc;
    if (a->discard_all) {
        rc = mdb_drop(txn, s->dbi_log, 0);
    } else {
        MDB_cursor *cur;
        rc = mdb_cursor_open(txn, s->dbi_log, &cur);
        MDB_val k, v;
        while (rc == 0 && (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST)) == 0) {
            if (k.mv_size != 8) {
                rc = RC_CORRUPT;
                break;
            }
            if (ida__get_be64(k.mv_data) > a->upto) {
                break;
            }
            rc = mdb_cursor_del(cur, 0);
        }
        if (rc == MDB_NOTFOUND) {
            rc = 0;
        }
        mdb_cursor_close(cur);
    }
    if (rc == 0) {
        uint8_t prev[IDA__REC_LOG_PREV_BYTES];
        ida__rec_log_prev_encode(prev, a->prev_index, a->prev_term);
        rc = put_meta(s, txn, KEY_LOG_PREV, prev, sizeof(prev));
    }
    return rc;
}

int ida_storage_compact(struct ida_storage *s, ida_index upto)
{
    IDA_ASSERT(s != NULL);
    CHECK_PROCESS(s);
    if (s->failed != 0) {
        return s->failed;
    }
    if (!s->has_snapshot || upto > s->snapshot_index) {
        return fail(
            s, s->dir, IDA_EINVAL,
            "compact up to %llu: not covered by a durable snapshot "
            "(snapshot index %llu)",
            (unsigned long long)upto,
            (unsigned long long)(s->has_snapshot ? s->snapshot_index : 0));
    }
    if (upto < s->log.first) {
        return 0;
    }
    struct compact_args a = {.upto = upto};
    if (upto <= s->log.last) {
        ida_term term;
        int rv = owner_term_at(s, upto, &term);
        if (rv != 0) {
            return fail(s, s->dir, rv, "compact: cannot read the term of %llu",
                        (unsigned long long)upto);
        }
        a.prev_index = upto;
        a.prev_term = term;
        /* Figure 13, step 7: keep the suffix only if the log agrees with
         * the snapshot at its last index. */
        if (upto == s->snapshot_index && term != s->snapshot_term) {
            a.discard_all = 1;
            a.prev_term = s->snapshot_term;
        }
    } else if (upto == s->snapshot_index) {
        a.discard_all = 1;
        a.prev_index = s->snapshot_index;
        a.prev_term = s->snapshot_term;
    } else {
        return fail(s, s->dir, IDA_EINVAL,
                    "compact up to %llu: beyond the last entry %llu and not "
                    "the snapshot index",
                    (unsigned long long)upto, (unsigned long long)s->log.last);
    }
    int rv = run_write(s, "compact", compact_txn, &a);
    if (rv != 0) {
        return rv;
    }
    s->log.prev_index = a.prev_index;
    s->log.prev_term = a.prev_term;
    s->log.first = a.prev_index + 1;
    if (a.discard_all || s->log.last <= a.prev_index) {
        s->log.last = a.prev_index;
        s->log.last_term = a.prev_term;
    }
    IDA_ASSERT(s->log.first == s->log.prev_index + 1);
    return 0;
}

/* --- reads --- */

int ida_storage_log_state(struct ida_storage *s, struct ida_log_state *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc == 0) {
        rc = read_log_state(s, txn, out);
        read_end(s, txn);
    }
    return from_lmdb(rc);
}

int ida_storage_hard_state(struct ida_storage *s, struct ida_hard_state *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0) {
        return from_lmdb(rc);
    }
    MDB_val v;
    rc = get_meta(s, txn, KEY_HARD_STATE, &v);
    if (rc == 0 && ida__rec_hard_state_decode(v.mv_data, v.mv_size, out) != 0) {
        IDA_ERROR("storage %s: hard state fails its checksum", s->dir);
        rc = RC_CORRUPT;
    }
    read_end(s, txn);
    return rc == MDB_NOTFOUND ? IDA_ECORRUPT : from_lmdb(rc);
}

int ida_storage_term_at(struct ida_storage *s, ida_index index, ida_term *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0) {
        return from_lmdb(rc);
    }
    ida_index prev_index;
    ida_term prev_term;
    rc = read_log_prev(s, txn, &prev_index, &prev_term);
    if (rc == 0) {
        if (index == prev_index) {
            *out = prev_term;
        } else if (index < prev_index) {
            rc = MDB_NOTFOUND;
        } else {
            rc = read_entry_term(s, txn, index, out);
        }
    }
    read_end(s, txn);
    return from_lmdb(rc);
}

/* Walk entries [lo, hi) from @cur; with @out NULL only count them and sum
 * their data (respecting @max_bytes), else copy them into @out and @data. */
static int walk_entries(struct ida_storage *s,
                        MDB_cursor *cur,
                        ida_index lo,
                        ida_index hi,
                        size_t max_bytes,
                        size_t *count,
                        size_t *bytes,
                        struct ida_entry *out,
                        uint8_t *data)
{
    uint8_t kb[8];
    index_key(kb, lo);
    MDB_val k = mkval(kb, 8), v;
    int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY);
    size_t n = 0, sum = 0;
    for (ida_index i = lo; i < hi; i++) {
        if (i > lo) {
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
        if (rc != 0) {
            return rc;
        }
        if (k.mv_size != 8 || ida__get_be64(k.mv_data) != i) {
            return MDB_NOTFOUND; /* a hole: the range is not all there */
        }
        struct ida_entry e;
        if (ida__rec_entry_decode(v.mv_data, v.mv_size, i, &e) != 0) {
            IDA_ERROR("storage %s: log entry %llu fails its checksum", s->dir,
                      (unsigned long long)i);
            return RC_CORRUPT;
        }
        if (out == NULL && n > 0 && max_bytes > 0 && sum + e.len > max_bytes) {
            break;
        }
        if (out != NULL) {
            if (n == *count) {
                break;
            }
            out[n] = e;
            out[n].data = data + sum;
            if (e.len > 0) {
                memcpy(data + sum, e.data, e.len);
            }
        }
        sum += e.len;
        n++;
    }
    *count = n;
    *bytes = sum;
    return 0;
}

int ida_storage_entries(struct ida_storage *s,
                        ida_index lo,
                        ida_index hi,
                        size_t max_bytes,
                        struct ida_entry **out,
                        size_t *count)
{
    IDA_ASSERT(s != NULL && out != NULL && count != NULL);
    *out = NULL;
    *count = 0;
    if (lo == 0 || lo >= hi) {
        return IDA_EINVAL;
    }
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0) {
        return from_lmdb(rc);
    }
    MDB_cursor *cur = NULL;
    struct ida_entry *block = NULL;
    ida_index prev_index;
    ida_term prev_term;
    rc = read_log_prev(s, txn, &prev_index, &prev_term);
    if (rc == 0 && lo <= prev_index) {
        rc = MDB_NOTFOUND; /* compacted */
    }
    if (rc == 0) {
        rc = mdb_cursor_open(txn, s->dbi_log, &cur);
    }
    size_t n = 0, bytes = 0;
    if (rc == 0) {
        rc = walk_entries(s, cur, lo, hi, max_bytes, &n, &bytes, NULL, NULL);
    }
    if (rc == 0) {
        IDA_ASSERT(n >= 1);
        block = ida_malloc(n * sizeof(*block) + bytes);
        rc = block == NULL ? ENOMEM : 0;
    }
    if (rc == 0) {
        size_t n2 = n, bytes2 = 0;
        rc = walk_entries(s, cur, lo, hi, 0, &n2, &bytes2, block,
                          (uint8_t *)(block + n));
        IDA_ASSERT(rc != 0 || (n2 == n && bytes2 == bytes));
    }
    if (cur != NULL) {
        mdb_cursor_close(cur);
    }
    read_end(s, txn);
    if (rc != 0) {
        ida_free(block);
        return from_lmdb(rc);
    }
    *out = block;
    *count = n;
    return 0;
}

/* --- snapshots: reads --- */

/* The current snapshot record. MDB_NOTFOUND when there is none. */
static int read_snapshot_rec(struct ida_storage *s,
                             MDB_txn *txn,
                             struct ida__rec_snapshot *r)
{
    MDB_val v;
    int rc = get_meta(s, txn, KEY_SNAPSHOT, &v);
    if (rc != 0) {
        return rc;
    }
    if (ida__rec_snapshot_decode(v.mv_data, v.mv_size, r) != 0) {
        IDA_ERROR("storage %s: snapshot meta fails its checksum", s->dir);
        return RC_CORRUPT;
    }
    return 0;
}

/* Fetch and check chunk @c of snapshot @r; @data and @len point into LMDB. */
static int read_chunk(struct ida_storage *s,
                      MDB_txn *txn,
                      const struct ida__rec_snapshot *r,
                      uint64_t c,
                      const uint8_t **data,
                      size_t *len)
{
    uint8_t kb[16];
    chunk_key(kb, r->id, c);
    MDB_val k = mkval(kb, 16), v;
    int rc = mdb_get(txn, s->dbi_snap, &k, &v);
    if (rc != 0) {
        if (rc == MDB_NOTFOUND) {
            IDA_ERROR("storage %s: snapshot %llu chunk %llu is missing", s->dir,
                      (unsigned long long)r->id, (unsigned long long)c);
            return RC_CORRUPT;
        }
        return rc;
    }
    uint64_t want = IDA_STORAGE_CHUNK_BYTES;
    if (c == r->chunks - 1) {
        want = r->size - (r->chunks - 1) * (uint64_t)IDA_STORAGE_CHUNK_BYTES;
    }
    const uint8_t *p = v.mv_data;
    if (v.mv_size != IDA__REC_CHUNK_HDR_BYTES + want ||
        ida__get_be32(p) !=
            ida__rec_chunk_crc(r->id, c, p + IDA__REC_CHUNK_HDR_BYTES, want)) {
        IDA_ERROR("storage %s: snapshot %llu chunk %llu fails its checksum",
                  s->dir, (unsigned long long)r->id, (unsigned long long)c);
        return RC_CORRUPT;
    }
    *data = p + IDA__REC_CHUNK_HDR_BYTES;
    *len = (size_t)want;
    return 0;
}

/* Fill @out from @r, copying the configuration. */
static int meta_from_rec(const struct ida__rec_snapshot *r,
                         struct ida_snapshot_meta *out)
{
    memset(out, 0, sizeof(*out));
    out->config = ida_malloc(r->config_len > 0 ? r->config_len : 1);
    if (out->config == NULL) {
        return ENOMEM;
    }
    if (r->config_len > 0) {
        memcpy(out->config, r->config, r->config_len);
    }
    out->config_len = r->config_len;
    out->id = r->id;
    out->index = r->index;
    out->term = r->term;
    out->data_size = r->size;
    out->data_crc32c = r->data_crc;
    return 0;
}

void ida_snapshot_meta_release(struct ida_snapshot_meta *m)
{
    ida_free(m->config);
    m->config = NULL;
    m->config_len = 0;
}

int ida_storage_snapshot_meta(struct ida_storage *s,
                              struct ida_snapshot_meta *out)
{
    IDA_ASSERT(s != NULL && out != NULL);
    memset(out, 0, sizeof(*out));
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0) {
        return from_lmdb(rc);
    }
    struct ida__rec_snapshot r;
    rc = read_snapshot_rec(s, txn, &r);
    if (rc == 0) {
        rc = meta_from_rec(&r, out);
    }
    read_end(s, txn);
    return from_lmdb(rc);
}

/* Copy bytes [@offset, @offset + @len) of snapshot @r (clipped at its end)
 * into @buf; *n gets the count. */
static int copy_range(struct ida_storage *s,
                      MDB_txn *txn,
                      const struct ida__rec_snapshot *r,
                      uint64_t offset,
                      uint8_t *buf,
                      size_t len,
                      size_t *n)
{
    size_t done = 0;
    while (done < len && offset < r->size) {
        uint64_t c = offset / IDA_STORAGE_CHUNK_BYTES;
        size_t in = (size_t)(offset % IDA_STORAGE_CHUNK_BYTES);
        const uint8_t *data;
        size_t clen;
        int rc = read_chunk(s, txn, r, c, &data, &clen);
        if (rc != 0) {
            return rc;
        }
        size_t take = clen - in;
        if (take > len - done) {
            take = len - done;
        }
        memcpy(buf + done, data + in, take);
        done += take;
        offset += take;
    }
    *n = done;
    return 0;
}

int ida_storage_snapshot_read(struct ida_storage *s,
                              uint64_t id,
                              uint64_t offset,
                              uint8_t *buf,
                              size_t len,
                              size_t *n)
{
    IDA_ASSERT(s != NULL && n != NULL && (buf != NULL || len == 0));
    *n = 0;
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0) {
        return from_lmdb(rc);
    }
    struct ida__rec_snapshot r;
    int rv = 0;
    rc = read_snapshot_rec(s, txn, &r);
    if (rc == 0 && r.id != id) {
        rc = MDB_NOTFOUND; /* replaced by a newer snapshot */
    }
    if (rc == 0 && offset > r.size) {
        rv = IDA_EINVAL;
    } else if (rc == 0) {
        rc = copy_range(s, txn, &r, offset, buf, len, n);
    }
    read_end(s, txn);
    return rv != 0 ? rv : from_lmdb(rc);
}

int ida_storage_snapshot_load(struct ida_storage *s,
                              struct ida_snapshot_meta *out,
                              uint8_t **data)
{
    IDA_ASSERT(s != NULL && out != NULL && data != NULL);
    memset(out, 0, sizeof(*out));
    *data = NULL;
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0) {
        return from_lmdb(rc);
    }
    struct ida__rec_snapshot r;
    uint8_t *buf = NULL;
    rc = read_snapshot_rec(s, txn, &r);
    if (rc == 0 && r.size > SIZE_MAX) {
        rc = ENOMEM;
    }
    if (rc == 0 && r.size > 0) {
        buf = ida_malloc((size_t)r.size);
        rc = buf == NULL ? ENOMEM : 0;
    }
    size_t n = 0;
    if (rc == 0) {
        rc = copy_range(s, txn, &r, 0, buf, (size_t)r.size, &n);
    }
    if (rc == 0 && (n != r.size || ida__crc32c(0, buf, n) != r.data_crc)) {
        IDA_ERROR("storage %s: snapshot %llu state fails its checksum", s->dir,
                  (unsigned long long)r.id);
        rc = RC_CORRUPT;
    }
    if (rc == 0) {
        rc = meta_from_rec(&r, out);
    }
    read_end(s, txn);
    if (rc != 0) {
        ida_free(buf);
        return from_lmdb(rc);
    }
    *data = buf;
    return 0;
}

/* --- snapshots: writing --- */

int ida_storage_snapshot_begin(struct ida_storage *s,
                               struct ida_snapshot_writer *w,
                               ida_index index,
                               ida_term term,
                               const uint8_t *config,
                               size_t config_len)
{
    IDA_ASSERT(s != NULL && w != NULL);
    CHECK_PROCESS(s);
    memset(w, 0, sizeof(*w));
    if (s->failed != 0) {
        return s->failed;
    }
    if (s->writer_active) {
        return fail(s, s->dir, IDA_EBUSY,
                    "a snapshot is already being written");
    }
    if (index == 0 || term == 0 || (config == NULL && config_len > 0)) {
        return fail(s, s->dir, IDA_EINVAL,
                    "snapshot at index %llu term %llu: both must be nonzero",
                    (unsigned long long)index, (unsigned long long)term);
    }
    if (s->has_snapshot && index < s->snapshot_index) {
        return fail(s, s->dir, IDA_EINVAL,
                    "snapshot at %llu is older than the current one at %llu",
                    (unsigned long long)index,
                    (unsigned long long)s->snapshot_index);
    }
    if (config_len > IDA_STORAGE_CONFIG_BYTES_MAX) {
        return fail(s, s->dir, IDA_ETOOBIG, "snapshot config of %zu bytes",
                    config_len);
    }
    w->buf = ida_malloc(IDA_STORAGE_CHUNK_BYTES);
    w->config = ida_malloc(config_len > 0 ? config_len : 1);
    if (w->buf == NULL || w->config == NULL) {
        ida_free(w->buf);
        ida_free(w->config);
        memset(w, 0, sizeof(*w));
        return fail(s, s->dir, IDA_ENOMEM, "snapshot: out of memory");
    }
    if (config_len > 0) {
        memcpy(w->config, config, config_len);
    }
    w->config_len = config_len;
    w->id = s->next_snapshot_id++;
    w->index = index;
    w->term = term;
    s->writer_active = 1;
    return 0;
}

static void writer_release(struct ida_storage *s, struct ida_snapshot_writer *w)
{
    ida_free(w->buf);
    ida_free(w->config);
    memset(w, 0, sizeof(*w));
    s->writer_active = 0;
}

static int put_chunk(struct ida_storage *s,
                     MDB_txn *txn,
                     uint64_t id,
                     uint64_t c,
                     const uint8_t *data,
                     size_t len)
{
    uint8_t kb[16];
    chunk_key(kb, id, c);
    MDB_val k = mkval(kb, 16);
    MDB_val v = mkval(NULL, IDA__REC_CHUNK_HDR_BYTES + len);
    int rc = put(s, txn, s->dbi_snap, &k, &v, MDB_RESERVE);
    if (rc != 0) {
        return rc;
    }
    uint8_t *p = v.mv_data;
    ida__put_be32(p, ida__rec_chunk_crc(id, c, data, len));
    memcpy(p + IDA__REC_CHUNK_HDR_BYTES, data, len);
    return 0;
}

/* Chunks to store in one transaction: the writer's full buffer, then
 * @full whole chunks straight from @data. */
struct write_args
{
    struct ida_snapshot_writer *w;
    const uint8_t *data;
    size_t full;
};

static int write_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct write_args *a = arg;
    uint64_t c = a->w->chunk_count;
    int rc = put_chunk(s, txn, a->w->id, c++, a->w->buf, a->w->buf_len);
    for (size_t i = 0; rc == 0 && i < a->full; i++) {
        rc = put_chunk(s, txn, a->w->id, c++,
                       a->data + i * IDA_STORAGE_CHUNK_BYTES,
                       IDA_STORAGE_CHUNK_BYTES);
    }
    return rc;
}

int ida_storage_snapshot_write(struct ida_storage *s,
                               struct ida_snapshot_writer *w,
                               const uint8_t *data,
                               size_t len)
{
    IDA_ASSERT(s != NULL && w != NULL && s->writer_active && w->buf != NULL);
    IDA_ASSERT(data != NULL || len == 0);
    w->crc = ida__crc32c(w->crc, data, len);
    w->size += len;
    size_t k = IDA_STORAGE_CHUNK_BYTES - w->buf_len;
    if (k > len) {
        k = len;
    }
    memcpy(w->buf + w->buf_len, data, k);
    w->buf_len += k;
    if (w->buf_len < IDA_STORAGE_CHUNK_BYTES) {
        return 0; /* all absorbed by the buffer */
    }
    struct write_args a = {
        .w = w,
        .data = data + k,
        .full = (len - k) / IDA_STORAGE_CHUNK_BYTES,
    };
    int rv = run_write(s, "snapshot write", write_txn, &a);
    if (rv != 0) {
        return rv;
    }
    w->chunk_count += 1 + a.full;
    size_t rest = len - k - a.full * IDA_STORAGE_CHUNK_BYTES;
    memcpy(w->buf, a.data + a.full * IDA_STORAGE_CHUNK_BYTES, rest);
    w->buf_len = rest;
    return 0;
}

/* Delete every chunk of snapshot @id. The cursor is re-positioned with
 * MDB_SET_RANGE after each delete: its position after deleting the last
 * record is not one MDB_GET_CURRENT can use. */
static int delete_chunks(struct ida_storage *s, MDB_txn *txn, uint64_t id)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->dbi_snap, &cur);
    if (rc != 0) {
        return rc;
    }
    uint8_t kb[16];
    chunk_key(kb, id, 0);
    for (;;) {
        MDB_val k = mkval(kb, 16), v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc != 0 || k.mv_size != 16 || ida__get_be64(k.mv_data) != id) {
            break;
        }
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            break;
        }
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static int finish_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct ida_snapshot_writer *w = arg;
    int rc = 0;
    uint64_t chunks = w->chunk_count;
    if (w->buf_len > 0) {
        rc = put_chunk(s, txn, w->id, chunks++, w->buf, w->buf_len);
    }
    if (rc == 0 && s->has_snapshot) {
        rc = delete_chunks(s, txn, s->snapshot_id);
    }
    if (rc != 0) {
        return rc;
    }
    struct ida__rec_snapshot r = {
        .id = w->id,
        .index = w->index,
        .term = w->term,
        .size = w->size,
        .data_crc = w->crc,
        .chunks = chunks,
        .config = w->config,
        .config_len = (uint32_t)w->config_len,
    };
    size_t cap = IDA__REC_SNAPSHOT_FIXED + w->config_len;
    uint8_t *rec = ida_malloc(cap);
    if (rec == NULL) {
        return ENOMEM;
    }
    size_t n = ida__rec_snapshot_encode(rec, &r);
    IDA_ASSERT(n == cap);
    rc = put_meta(s, txn, KEY_SNAPSHOT, rec, n);
    ida_free(rec);
    return rc;
}

int ida_storage_snapshot_finish(struct ida_storage *s,
                                struct ida_snapshot_writer *w)
{
    IDA_ASSERT(s != NULL && w != NULL && s->writer_active);
    int rv = run_write(s, "snapshot finish", finish_txn, w);
    if (rv != 0) {
        ida_storage_snapshot_abort(s, w);
        return rv;
    }
    s->has_snapshot = 1;
    s->snapshot_id = w->id;
    s->snapshot_index = w->index;
    s->snapshot_term = w->term;
    writer_release(s, w);
    return 0;
}

static int abort_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    return delete_chunks(s, txn, *(uint64_t *)arg);
}

void ida_storage_snapshot_abort(struct ida_storage *s,
                                struct ida_snapshot_writer *w)
{
    IDA_ASSERT(s != NULL && w != NULL && s->writer_active);
    uint64_t id = w->id;
    writer_release(s, w);
    if (s->failed == 0 && run_write(s, "snapshot abort", abort_txn, &id) != 0) {
        IDA_WARN("%s (its chunks are dropped at the next open)", s->errmsg);
    }
}
