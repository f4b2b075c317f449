/* Seed a new cluster's first node from a backup file: src/node/import.h. */
/* _XOPEN_SOURCE for nftw(). */
#define _XOPEN_SOURCE 700
#include "src/node/import.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/heap.h"
#include "base/log.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "src/common/backup.h"
#include "src/common/config.h"
#include "src/node/convert.h"
#include "storage/storage.h"

/* The state's index and term in the new cluster: the first entry of its
 * first term, as if the restore had been the cluster's first write. */
#define IMPORT_INDEX 1
#define IMPORT_TERM  1

/* Snapshot bytes stored per write transaction. */
#define IMPORT_WRITE_BYTES (16u << 20)

static int fail(char *errmsg, int rv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *errmsg, int rv, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, IDA_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    return rv;
}

/* 1 when @path does not exist or is an empty directory, 0 when it holds
 * anything (or is not a directory), -1 with errno when it cannot be read. */
static int absent_or_empty(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL) {
        return errno == ENOENT ? 1 : errno == ENOTDIR ? 0 : -1;
    }
    int empty = 1;
    struct dirent *e;
    while (empty && (e = readdir(d)) != NULL) {
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    }
    closedir(d);
    return empty;
}

static int remove_one(const char *path,
                      const struct stat *sb,
                      int flag,
                      struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

/* Remove @path and everything under it (an earlier import's leftover). */
static int remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        return errno == ENOENT ? 0 : -1;
    }
    return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    int rv = fsync(fd);
    close(fd);
    return rv;
}

/* Store @snap (@len bytes) in the new node @n as the snapshot at
 * (IMPORT_INDEX, IMPORT_TERM) of a membership of @n alone, with the hard
 * state and first membership a node that created that cluster has. */
static int store_state(struct ida_node *n,
                       const uint8_t *snap,
                       size_t len,
                       char *errmsg)
{
    struct ida_storage *st = &n->storage;
    struct ida_raft_conf c = {0};
    c.n = 1;
    c.voters[0] = n->self->id;
    c.voter_inc[0] = ida_storage_incarnation(st);
    uint8_t *conf = NULL;
    size_t conf_len = 0;
    int rv = node_conf_encode_full(&n->book, &c, &conf, &conf_len);
    if (rv != 0) {
        return rv;
    }
    (void)ida_storage_reserve(st, len); /* else the map grows as it goes */
    struct ida_snapshot_writer w;
    rv = ida_storage_snapshot_begin(st, &w, IMPORT_INDEX, IMPORT_TERM, conf,
                                    conf_len);
    for (size_t off = 0; rv == 0 && off < len;) {
        size_t k =
            len - off < IMPORT_WRITE_BYTES ? len - off : IMPORT_WRITE_BYTES;
        rv = ida_storage_snapshot_write(st, &w, snap + off, k);
        off += k;
        if (rv != 0) {
            ida_storage_snapshot_abort(st, &w);
        }
    }
    if (rv == 0) {
        rv = ida_storage_snapshot_finish(st, &w);
    }
    if (rv == 0) {
        struct ida_storage_batch b;
        ida_storage_batch_init(st, &b);
        /* The term of the snapshot; the commit index is the snapshot's
         * (ida_raft_init() raises it there: storage takes none beyond
         * the log). */
        struct ida_hard_state hs = {IMPORT_TERM, 0, 0};
        rv = ida_storage_batch_set_hard_state(st, &b, &hs);
        if (rv == 0) {
            rv = ida_storage_batch_commit(st, &b);
        }
    }
    if (rv == 0) {
        rv = ida_storage_membership0_set(st, conf, conf_len);
    }
    if (rv != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%.200s: cannot store the state: %s%s%.200s", n->dir,
                 idalloc_strerror(rv), st->errmsg[0] ? ": " : "", st->errmsg);
    }
    ida_free(conf);
    return rv;
}

/* The backup @b as the new node's state, stored under @staging. */
static int build(const struct ida_node_opts *o,
                 const char *staging,
                 const struct ida_backup *b,
                 uint64_t advance,
                 struct ida_node_import_info *info,
                 char *errmsg)
{
    struct ida_fsm *f = NULL;
    uint8_t *snap = NULL;
    size_t snap_len = 0;
    int rv = ida_fsm_new(&f);
    if (rv == 0) {
        rv = ida_fsm_import(f, b->state, b->state_len, advance, IMPORT_INDEX);
        if (rv == IDA_ECORRUPT) {
            snprintf(errmsg, IDA_ERRMSG_MAX,
                     "%s: the backup's state does not restore",
                     o->import_backup);
        } else if (rv == IDA_EEXHAUSTED) {
            snprintf(errmsg, IDA_ERRMSG_MAX,
                     "--advance-sequences %llu would carry a sequence pool "
                     "past the end of 64 bits",
                     (unsigned long long)advance);
        }
    }
    if (rv == 0) {
        info->pools = ida_fsm_pool_count(f);
        rv = ida_fsm_snapshot(f, &snap, &snap_len);
    }
    ida_fsm_free(f); /* the snapshot holds it all: memory for the store */
    if (rv == 0) {
        info->state_bytes = snap_len;
        struct ida_node_opts so = *o;
        so.data_dir = staging;
        static struct ida_node n; /* large: not on the stack */
        rv = ida_node_open(&n, &so, errmsg);
        if (rv == 0) {
            rv = ida_node_is_new(&n)
                     ? store_state(&n, snap, snap_len, errmsg)
                     : fail(errmsg, IDA_EEXIST,
                            "%s: not a new directory (does another import "
                            "write it?)",
                            n.dir);
            ida_node_close(&n);
        }
    }
    ida_free(snap);
    return rv;
}

int ida_node_import(const struct ida_node_opts *o,
                    const char *file,
                    uint64_t advance,
                    struct ida_node_import_info *info,
                    char *errmsg)
{
    memset(info, 0, sizeof(*info));
    errmsg[0] = '\0';
    static struct ida_config cfg; /* large: not on the stack */
    if (ida_config_load(o->config_path, &cfg, errmsg) != 0) {
        return IDA_ECONFIG;
    }
    const char *data = o->data_dir != NULL ? o->data_dir : cfg.data_dir;
    char final[IDA_PATH_MAX + 32], staging[IDA_PATH_MAX + 32],
        staged[2 * IDA_PATH_MAX + 64];
    if (strlen(data) >= IDA_PATH_MAX) {
        return fail(errmsg, IDA_ECONFIG, "data directory path too long");
    }
    snprintf(final, sizeof(final), "%s/node%u", data, o->node_id);
    snprintf(staging, sizeof(staging), "%s/.import-node%u", data, o->node_id);
    snprintf(staged, sizeof(staged), "%s/node%u", staging, o->node_id);
    snprintf(info->dir, sizeof(info->dir), "%s", final);
    int empty = absent_or_empty(final);
    if (empty <= 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%.300s %s: the import writes only a new node directory (a "
                 "node that holds state is never overwritten; remove the "
                 "directory first if it is to go)",
                 final,
                 empty < 0 ? "cannot be read" : "exists and is not empty");
        return empty < 0 ? IDA_EIO : IDA_EEXIST;
    }
    struct ida_backup b;
    int rv = ida_backup_read(file, &b, errmsg);
    if (rv != 0) {
        return rv;
    }
    snprintf(info->from_cluster, sizeof(info->from_cluster), "%s", b.cluster);
    info->from_index = b.index;
    info->from_term = b.term;
    if (strcmp(b.cluster, cfg.cluster) == 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%s was taken from cluster %s, the name in %s: an import "
                 "makes a new cluster (give its cluster file another "
                 "`cluster` name)",
                 file, b.cluster, o->config_path);
        ida_backup_free(&b);
        return IDA_EINVAL;
    }
    if (mkdir(data, 0700) != 0 && errno != EEXIST) {
        rv = fail(errmsg, IDA_EIO, "%s: cannot create the data directory: %s",
                  data, strerror(errno));
    } else if (remove_tree(staging) != 0) {
        rv = fail(errmsg, IDA_EIO,
                  "%s: cannot remove an earlier import's "
                  "staging directory: %s",
                  staging, strerror(errno));
    } else if (mkdir(staging, 0700) != 0) {
        rv = fail(errmsg, IDA_EIO, "%s: cannot create it: %s", staging,
                  strerror(errno));
    }
    if (rv == 0) {
        rv = build(o, staging, &b, advance, info, errmsg);
    }
    ida_backup_free(&b);
    /* Into place in one step: rename() replaces an empty directory. */
    if (rv == 0 && (rename(staged, final) != 0 || fsync_dir(data) != 0)) {
        rv = fail(errmsg, IDA_EIO,
                  "%s: cannot move the new node directory "
                  "into place: %s",
                  final, strerror(errno));
    }
    if (remove_tree(staging) != 0 && rv == 0) {
        IDA_WARN("import: %s: could not remove it: %s", staging,
                 strerror(errno));
    }
    if (rv != 0 && errmsg[0] == '\0') {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s", idalloc_strerror(rv));
    }
    return rv;
}
