/* storage/: open and close, one open per directory and process, identity and
 * format checks (with storage/identity.c), the upgrade from format 1, and
 * collection of unfinished snapshot chunks at open. */
#include "storage/storage.h"

#include <dirent.h>
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/entlog.h"
#include "storage/internal.h"
#include "storage/record.h"

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

/* A directory without data.mdb may hold nothing but a leftover lock.mdb or
 * IDENTITY.tmp (of a first start killed while writing it): anything else
 * means it belongs to someone else. */
static int check_empty_dir(struct ida_storage *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return ida__storage_fail(
            s, dir, IDA_EIO, "cannot read the directory: %s", strerror(errno));
    }
    int rv = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, "lock.mdb") == 0 ||
            strcmp(de->d_name, IDA_STORAGE_IDENTITY_TMP) == 0) {
            continue;
        }
        rv = ida__storage_fail(
            s, dir, IDA_EFOREIGN,
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
    int have_idfile;             /* IDENTITY was there and matches @o */
    struct ida__rec_identity id; /* its contents */
    uint32_t format;             /* the format found (IDA_STORAGE_FORMAT_
                                    VERSION for a new environment) */
    uint64_t minted;             /* a new incarnation, when no IDENTITY */
    uint64_t minted_ms;
    uint8_t idbuf[IDA__REC_IDFILE_FIXED + IDA_STORAGE_CLUSTER_MAX + 1];
};

/* Refuse with IDA_ELOSTSTATE: IDENTITY says who lived here, but the
 * database (@what) does not hold that node's state. */
static int lost_state(struct ida_storage *s,
                      const char *dir,
                      const struct open_args *a,
                      const char *what)
{
    return ida__storage_fail(
        s, dir, IDA_ELOSTSTATE,
        "data directory initialized as node %u incarnation %016llx of "
        "cluster \"%.*s\" but its database %s: the node must not rejoin as "
        "its old self; remove the directory to rejoin as a new incarnation "
        "(see README, Runbook)",
        (unsigned)a->id.node_id, (unsigned long long)a->id.incarnation,
        (int)a->id.name_len, a->id.name, what);
}

/* Record who the open directory is. */
static void set_identity(struct ida_storage *s,
                         const struct ida_storage_opts *o,
                         uint64_t incarnation,
                         uint64_t created_at_ms)
{
    snprintf(s->identity.cluster, sizeof(s->identity.cluster), "%s",
             o->cluster);
    s->identity.node_id = o->node_id;
    s->identity.incarnation = incarnation;
    s->identity.created_at_ms = created_at_ms;
}

/* Put the format record of @version. */
static int put_format(struct ida_storage *s, MDB_txn *txn, uint32_t version)
{
    uint8_t fmt[IDA__REC_FORMAT_BYTES];
    ida__rec_format_encode(fmt, version);
    return ida__storage_put_meta(s, txn, KEY_FORMAT, fmt, sizeof(fmt));
}

/* Put the format record (@version) and the identity record of format 2
 * and later (new incarnation @a->minted). */
static int put_identity(struct ida_storage *s,
                        MDB_txn *txn,
                        const struct open_args *a,
                        uint32_t version)
{
    int rc = put_format(s, txn, version);
    struct ida__rec_identity r = {
        .node_id = a->o->node_id,
        .incarnation = a->minted,
        .created_at_ms = a->minted_ms,
        .name = a->o->cluster,
        .name_len = strlen(a->o->cluster),
    };
    uint8_t ident[IDA__REC_IDENTITY2_FIXED + IDA_STORAGE_CLUSTER_MAX];
    size_t n = ida__rec_identity2_encode(ident, &r);
    if (rc == 0) {
        rc = ida__storage_put_meta(s, txn, KEY_IDENTITY, ident, n);
    }
    if (rc == 0) {
        set_identity(s, a->o, a->minted, a->minted_ms);
    }
    return rc;
}

/* Create the databases and the identity of a new environment. */
static int init_fresh(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    struct open_args *a = arg;
    int rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &s->dbi_meta);
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "snap", MDB_CREATE, &s->dbi_snap);
    }
    if (rc == 0) {
        rc = put_identity(s, txn, a, IDA_STORAGE_FORMAT_VERSION);
    }
    a->format = IDA_STORAGE_FORMAT_VERSION; /* its log: storage/logdir.c */
    uint8_t hs[IDA__REC_HARD_STATE_BYTES];
    struct ida_hard_state zero = {0, 0, 0};
    ida__rec_hard_state_encode(hs, &zero);
    if (rc == 0) {
        rc = ida__storage_put_meta(s, txn, KEY_HARD_STATE, hs, sizeof(hs));
    }
    uint8_t prev[IDA__REC_LOG_PREV_BYTES];
    ida__rec_log_prev_encode(prev, 0, 0);
    if (rc == 0) {
        rc = ida__storage_put_meta(s, txn, KEY_LOG_PREV, prev, sizeof(prev));
    }
    if (rc == 0) {
        s->identity.created = 1;
    }
    return rc;
}

/* A format-1 identity record: same cluster and node, or refused. With an
 * IDENTITY file (always format 2) a format-1 database is not the one it
 * describes. Otherwise upgrade in place: the directory is the genuine old
 * state, so it gets a new incarnation now. */
static int check_identity_v1(struct ida_storage *s,
                             MDB_txn *txn,
                             struct open_args *a,
                             const MDB_val *v)
{
    ida_node_id node;
    const char *name;
    size_t name_len;
    if (ida__rec_identity_decode(v->mv_data, v->mv_size, &node, &name,
                                 &name_len) != 0) {
        refuse(s, s->dir, IDA_ECORRUPT, "identity record fails its checksum");
        return RC_REFUSED;
    }
    if (a->have_idfile) {
        s->refused =
            lost_state(s, s->dir, a, "was replaced by a format-1 database");
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
    /* Format 3 for now: its log moves out of LMDB after this commit
     * (storage/logdir.c), which then writes format 4. */
    int rc = put_identity(s, txn, a, 3);
    if (rc == 0) {
        s->identity.upgraded_from = 1;
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
    int rc = ida__storage_get_meta(s, txn, KEY_FORMAT, &v);
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
    if (version > IDA_STORAGE_FORMAT_VERSION || version == 0) {
        refuse(s, s->dir, IDA_EVERSION,
               version > IDA_STORAGE_FORMAT_VERSION
                   ? "format version %u is newer than this program's "
                     "(%u); upgrade idalloc"
                   : "unknown format version %u (this program reads %u)",
               version, IDA_STORAGE_FORMAT_VERSION);
        return RC_REFUSED;
    }
    rc = ida__storage_get_meta(s, txn, KEY_IDENTITY, &v);
    if (rc == MDB_NOTFOUND && a->have_idfile) {
        s->refused = lost_state(s, s->dir, a, "holds no identity record");
        return RC_REFUSED;
    }
    if (rc != 0) {
        return rc == MDB_NOTFOUND ? RC_CORRUPT : rc;
    }
    a->format = version;
    if (version == 1) {
        return check_identity_v1(s, txn, a, &v);
    }
    struct ida__rec_identity r;
    if (ida__rec_identity2_decode(v.mv_data, v.mv_size, &r) != 0) {
        refuse(s, s->dir, IDA_ECORRUPT, "identity record fails its checksum");
        return RC_REFUSED;
    }
    if (a->have_idfile &&
        (r.incarnation != a->id.incarnation || r.node_id != a->id.node_id ||
         r.name_len != a->id.name_len ||
         memcmp(r.name, a->id.name, r.name_len) != 0)) {
        char what[160];
        snprintf(what, sizeof(what),
                 "was replaced (it holds node %u incarnation %016llx of "
                 "cluster \"%.*s\")",
                 (unsigned)r.node_id, (unsigned long long)r.incarnation,
                 (int)r.name_len, r.name);
        s->refused = lost_state(s, s->dir, a, what);
        return RC_REFUSED;
    }
    if (r.name_len != strlen(a->o->cluster) ||
        memcmp(r.name, a->o->cluster, r.name_len) != 0) {
        refuse(s, s->dir, IDA_EFOREIGN,
               "belongs to cluster \"%.*s\", not \"%s\"", (int)r.name_len,
               r.name, a->o->cluster);
        return RC_REFUSED;
    }
    if (r.node_id != a->o->node_id) {
        refuse(s, s->dir, IDA_EFOREIGN, "belongs to node %u, not node %u",
               (unsigned)r.node_id, (unsigned)a->o->node_id);
        return RC_REFUSED;
    }
    if (r.incarnation == 0) {
        refuse(s, s->dir, IDA_ECORRUPT, "identity record has incarnation 0");
        return RC_REFUSED;
    }
    if (version == 2) {
        /* Snapshots written from now on name their chunk size (format 3):
         * a format-2 program must refuse the directory as newer, not take
         * such a snapshot for damage. */
        rc = put_format(s, txn, 3);
        if (rc != 0) {
            return rc;
        }
        s->identity.upgraded_from = 2;
    }
    set_identity(s, a->o, r.incarnation, r.created_at_ms);
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
    ida__storage_chunk_key(kb, 0, 0);
    for (;;) {
        MDB_val k = ida__storage_mkval(kb, 16), v;
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
            ida__storage_chunk_key(kb, id + 1,
                                   0); /* skip past the kept snapshot */
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
        ida__storage_chunk_key(kb, id, chunk);
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
    int rc = ida__storage_get_meta(s, txn, KEY_HARD_STATE, &v);
    if (rc != 0) {
        return rc == MDB_NOTFOUND ? RC_CORRUPT : rc;
    }
    if (ida__rec_hard_state_decode(v.mv_data, v.mv_size, &s->hard_state) != 0) {
        return RC_CORRUPT;
    }
    s->log_lsn = 0;
    rc = ida__storage_get_meta(s, txn, KEY_LOG_LSN, &v);
    if (rc == 0 &&
        ida__rec_log_lsn_decode(v.mv_data, v.mv_size, &s->log_lsn) != 0) {
        return RC_CORRUPT;
    }
    if (rc != 0 && rc != MDB_NOTFOUND) {
        return rc;
    }
    rc = ida__storage_read_log_state(s, txn, &s->log);
    if (rc != 0) {
        return rc;
    }
    s->has_snapshot = 0;
    rc = ida__storage_get_meta(s, txn, KEY_SNAPSHOT, &v);
    if (rc == 0) {
        struct ida__rec_snapshot r;
        if (ida__rec_snapshot_decode(v.mv_data, v.mv_size, &r) != 0) {
            return RC_CORRUPT;
        }
        s->has_snapshot = 1;
        s->snapshot_id = r.id;
        s->snapshot_index = r.index;
        s->snapshot_term = r.term;
        s->snapshot_size = r.size;
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
         * before its initialising commit. Nothing here to overwrite. But
         * with an IDENTITY file the node's state was here and is gone. */
        if (a->have_idfile) {
            s->refused = lost_state(s, s->dir, a, "is empty");
            return RC_REFUSED;
        }
        rc = init_fresh(s, txn, a);
        if (rc == 0) {
            rc = load_state(s, txn);
        }
        if (rc == 0) {
            rc = ida__storage_boot_step(s, txn);
        }
        return rc;
    }
    rc = mdb_dbi_open(txn, "meta", 0, &s->dbi_meta);
    if ((rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE) && a->have_idfile) {
        s->refused = lost_state(s, s->dir, a,
                                "was replaced by one that is not idalloc "
                                "storage");
        return RC_REFUSED;
    }
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
    /* Before format 4 the log is in LMDB, until it moves. */
    s->lmdb_log = a->format < IDA_STORAGE_FORMAT_VERSION;
    if (s->lmdb_log) {
        rc = mdb_dbi_open(txn, "log", 0, &s->dbi_log);
    }
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "snap", 0, &s->dbi_snap);
    }
    if (rc == MDB_NOTFOUND) {
        return RC_CORRUPT;
    }
    if (rc == 0) {
        rc = load_state(s, txn);
    }
    if (rc == 0) {
        rc = ida__storage_boot_step(s, txn);
    }
    return rc;
}

/* Read IDENTITY (if any) into @a; it must describe @a->o's node. */
static int check_before_env(struct ida_storage *s,
                            const char *dir,
                            struct open_args *a)
{
    int rv = ida__storage_idfile_read(s, dir, a->idbuf, sizeof(a->idbuf),
                                      &a->id, &a->have_idfile);
    if (rv != 0 || !a->have_idfile) {
        return rv;
    }
    if (a->id.format > IDA_STORAGE_FORMAT_VERSION) {
        return ida__storage_fail(s, dir, IDA_EVERSION,
                                 "%s has format version %u, newer than this "
                                 "program's (%u); upgrade idalloc",
                                 IDA_STORAGE_IDENTITY_FILE, a->id.format,
                                 IDA_STORAGE_FORMAT_VERSION);
    }
    if (a->id.name_len != strlen(a->o->cluster) ||
        memcmp(a->id.name, a->o->cluster, a->id.name_len) != 0) {
        return ida__storage_fail(
            s, dir, IDA_EFOREIGN,
            "belongs to cluster \"%.*s\", not \"%s\" (%s); refusing to "
            "touch it",
            (int)a->id.name_len, a->id.name, a->o->cluster,
            IDA_STORAGE_IDENTITY_FILE);
    }
    if (a->id.node_id != a->o->node_id) {
        return ida__storage_fail(s, dir, IDA_EFOREIGN,
                                 "belongs to node %u, not node %u (%s); "
                                 "refusing to touch it",
                                 (unsigned)a->id.node_id,
                                 (unsigned)a->o->node_id,
                                 IDA_STORAGE_IDENTITY_FILE);
    }
    if (a->id.incarnation == 0) {
        return ida__storage_fail(s, dir, IDA_ECORRUPT, "%s has incarnation 0",
                                 IDA_STORAGE_IDENTITY_FILE);
    }
    return 0;
}

static int check_opts(struct ida_storage *s,
                      const char *dir,
                      const struct ida_storage_opts *o)
{
    if (dir == NULL || dir[0] == '\0' || o == NULL) {
        return ida__storage_fail(s, dir ? dir : "(null)", IDA_EINVAL,
                                 "no directory");
    }
    size_t n = o->cluster ? strlen(o->cluster) : 0;
    if (n == 0 || n > IDA_STORAGE_CLUSTER_MAX) {
        return ida__storage_fail(s, dir, IDA_EINVAL,
                                 "cluster name must be 1-%d bytes",
                                 IDA_STORAGE_CLUSTER_MAX);
    }
    if (o->node_id == 0) {
        return ida__storage_fail(s, dir, IDA_EINVAL, "node id must be nonzero");
    }
    uint64_t map =
        o->map_size_bytes ? o->map_size_bytes : IDA_STORAGE_MAP_SIZE_DEFAULT;
    uint64_t max = o->map_size_max_bytes ? o->map_size_max_bytes
                                         : IDA_STORAGE_MAP_SIZE_MAX_DEFAULT;
    if (map > max || map < 64 * 1024 || max > SIZE_MAX) {
        return ida__storage_fail(
            s, dir, IDA_EINVAL,
            "map size %llu must be >= 64 KiB and <= its maximum %llu",
            (unsigned long long)map, (unsigned long long)max);
    }
    s->map_size_bytes = map;
    s->map_size_max_bytes = max;
    size_t seg = o->log_segment_bytes ? o->log_segment_bytes
                                      : IDA_STORAGE_SEGMENT_BYTES_DEFAULT;
    if (seg % 4096 != 0 || seg < IDA_SEGLOG_SEGMENT_MIN ||
        seg > IDA_SEGLOG_SEGMENT_MAX) {
        return ida__storage_fail(s, dir, IDA_EINVAL,
                                 "log segment size %zu must be a multiple of "
                                 "4096 from 64 KiB to 1 GiB",
                                 seg);
    }
    s->log_segment_bytes = seg;
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
        return ida__storage_fail(s, dir, ida__storage_from_lmdb(rc),
                                 "cannot create an environment: %s",
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
        int code = ida__storage_from_lmdb(rc);
        if (code == IDA_EFOREIGN) {
            return ida__storage_fail(
                s, dir, code,
                "data.mdb is not an LMDB environment (%s); refusing "
                "to touch it",
                mdb_strerror(rc));
        }
        return ida__storage_fail(s, dir, code == IDA_ENOTFOUND ? IDA_EIO : code,
                                 "cannot open the LMDB environment: %s",
                                 mdb_strerror(rc));
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
        return ida__storage_fail(s, dir, erc == ENOSPC ? IDA_ENOSPC : IDA_EIO,
                                 "cannot create the directory: %s",
                                 strerror(erc));
    }
    rv = ida__storage_registry_claim(st.st_dev, st.st_ino);
    if (rv != 0) {
        return ida__storage_fail(s, dir, rv,
                                 rv == IDA_EEXIST
                                     ? "already open in this process"
                                     : "too many storages open in this "
                                       "process");
    }
    s->dir_dev = (uint64_t)st.st_dev;
    s->dir_ino = (uint64_t)st.st_ino;
    struct open_args a = {.o = o};
    rv = check_before_env(s, dir, &a);
    if (rv != 0) {
        goto err_after_claim;
    }
    enum ida__data_state data;
    rv = ida__storage_check_data(s, dir, &data);
    if (rv != 0) {
        goto err_after_claim;
    }
    if (a.have_idfile && data != IDA__DATA_PRESENT) {
        rv = lost_state(s, dir, &a,
                        data == IDA__DATA_ABSENT ? "(data.mdb) is missing"
                                                 : "(data.mdb) is empty");
        goto err_after_claim;
    }
    int fresh = data != IDA__DATA_PRESENT;
    if (data == IDA__DATA_ABSENT) {
        rv = check_empty_dir(s, dir);
        if (rv != 0) {
            goto err_after_claim;
        }
    }
    if (!a.have_idfile) {
        rv = ida__storage_mint(s, dir, &a.minted, &a.minted_ms);
        if (rv != 0) {
            goto err_after_claim;
        }
    }
    s->dir = ida_strndup(dir, strlen(dir));
    if (s->dir == NULL) {
        rv = ida__storage_fail(s, dir, IDA_ENOMEM, "out of memory");
        goto err_after_claim;
    }
    rv = env_open(s, dir, fresh);
    if (rv != 0) {
        goto err_after_dir;
    }
    rv = ida__storage_run_write(s, "open", open_txn, &a);
    if (rv == 0) {
        rv = ida__storage_log_open(s, dir, a.format, a.have_idfile);
    }
    if (rv != 0) {
        goto err_after_env;
    }
    if (!a.have_idfile) {
        /* After the commit that holds the identity: see storage.h. */
        struct ida__rec_identity r = {
            .format = IDA_STORAGE_FORMAT_VERSION,
            .node_id = s->identity.node_id,
            .incarnation = s->identity.incarnation,
            .created_at_ms = s->identity.created_at_ms,
            .name = s->identity.cluster,
            .name_len = strlen(s->identity.cluster),
        };
        rv = ida__storage_idfile_write(s, dir, &r);
        if (rv != 0) {
            goto err_after_env;
        }
    }
    IDA_ASSERT(s->log.first == s->log.prev_index + 1);
    IDA_ASSERT(s->log.last >= s->log.prev_index);
    return 0;

err_after_env:
    ida_entlog_close(s->elog);
    s->elog = NULL;
    mdb_env_close(ENV(s));
    s->env = NULL;
err_after_dir:
    ida_free(s->dir);
    s->dir = NULL;
err_after_claim:
    ida__storage_registry_release(st.st_dev, st.st_ino);
    s->failed = rv;
    return rv;
}

void ida_storage_close(struct ida_storage *s)
{
    IDA_ASSERT(s != NULL && s->env != NULL);
    CHECK_PROCESS(s);
    IDA_ASSERT(!s->writer_active);
    ida__storage_log_close(s);
    mdb_env_close(ENV(s));
    s->env = NULL;
    ida__storage_registry_release((dev_t)s->dir_dev, (ino_t)s->dir_ino);
    ida_free(s->dir);
    s->dir = NULL;
}

uint64_t ida_storage_incarnation(const struct ida_storage *s)
{
    return s->identity.incarnation;
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
