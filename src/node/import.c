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
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fdio.h"
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

/* 1 when @path can become a new node directory (absent, or an empty
 * directory), 0 when it cannot (it holds anything; a symlink or a file),
 * -1 with errno when it cannot be read. */
static int new_node_dir(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && !S_ISDIR(st.st_mode)
               ? 0 /* a symlink or a file: not a new directory */
               : absent_or_empty(path);
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
    return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
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

/* The marker IDA_NODE_SEEDED_FILE in @dir, durably. */
static int write_marker(const char *dir,
                        const struct ida_backup *b,
                        char *errmsg)
{
    char path[IDA_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%.*s/%s", IDA_PATH_MAX, dir,
             IDA_NODE_SEEDED_FILE);
    FILE *f = fopen(path, "w");
    int err = f == NULL ? errno : 0;
    if (f != NULL) {
        fprintf(f,
                "seeded from a backup of cluster %s at index %llu: this "
                "node leads once every other node of the cluster file "
                "answered that it is new (src/node/import.h)\n",
                b->cluster, (unsigned long long)b->index);
        if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
            err = errno;
        }
        if (fclose(f) != 0 && err == 0) {
            err = errno;
        }
    }
    if (err == 0 && ida_fsync_dir(dir) != 0) {
        err = errno;
    }
    if (err != 0) {
        return fail(errmsg, IDA_EIO, "%s: cannot write it: %s", path,
                    strerror(err));
    }
    return 0;
}

/* The state a new cluster gets from backup @b: *@snap (ida_malloc'd,
 * *@len bytes), the snapshot of ida_fsm_import()'s state machine. */
static int make_state(const char *file,
                      const struct ida_backup *b,
                      uint64_t advance,
                      struct ida_node_import_info *info,
                      uint8_t **snap,
                      size_t *len,
                      char *errmsg)
{
    struct ida_fsm *f = NULL;
    int rv = ida_fsm_new(&f);
    if (rv == 0) {
        rv = ida_fsm_import(f, b->state, b->state_len, advance, IMPORT_INDEX);
        if (rv == IDA_ECORRUPT) {
            fail(errmsg, rv, "%s: the backup's state does not restore", file);
        } else if (rv == IDA_EEXHAUSTED) {
            fail(errmsg, rv,
                 "--advance-sequences %llu would carry a sequence pool "
                 "past the end of 64 bits",
                 (unsigned long long)advance);
        }
    }
    if (rv == 0) {
        info->pools = ida_fsm_pool_count(f);
        rv = ida_fsm_snapshot(f, snap, len);
        info->state_bytes = rv == 0 ? *len : 0;
    }
    ida_fsm_free(f); /* the snapshot holds it all: memory for the store */
    return rv;
}

/* Node @o->node_id's new directory under @staging, holding @snap. */
static int store(const struct ida_node_opts *o,
                 const char *staging,
                 const struct ida_backup *b,
                 const uint8_t *snap,
                 size_t len,
                 char *errmsg)
{
    struct ida_node_opts so = *o;
    so.data_dir = staging;
    static struct ida_node n; /* large: not on the stack */
    int rv = ida_node_open(&n, &so, errmsg);
    if (rv != 0) {
        return rv;
    }
    if (o->has_log_level) {
        ida_log_set_level(o->log_level); /* over the cluster file's */
    }
    rv = ida_node_is_new(&n)
             ? store_state(&n, snap, len, errmsg)
             : fail(errmsg, IDA_EEXIST, "%s: not a new directory", n.dir);
    if (rv == 0) {
        rv = write_marker(n.dir, b, errmsg);
    }
    ida_node_close(&n);
    return rv;
}

/* Hold @path (created if need be) locked until the import ends: one
 * import of a node at a time. -1 when another holds it. The import that
 * holds it removes it before it lets go (ida_node_import()), so a lock
 * taken on a file no longer at @path is worth nothing: checked after the
 * lock, and the file at @path tried again. */
static int lock_file(const char *path)
{
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            return -1;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            close(fd);
            return -1;
        }
        struct stat held, now;
        if (fstat(fd, &held) == 0 && stat(path, &now) == 0 &&
            held.st_dev == now.st_dev && held.st_ino == now.st_ino) {
            return fd;
        }
        close(fd); /* removed (or replaced) by the import that held it */
    }
    errno = EAGAIN;
    return -1;
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
    if (ida_config_node(&cfg, o->node_id) == NULL) {
        return fail(errmsg, IDA_ECONFIG,
                    "%s has no line for node %u: an import seeds a node of "
                    "the cluster file",
                    o->config_path, o->node_id);
    }
    const char *data = o->data_dir != NULL ? o->data_dir : cfg.data_dir;
    char final[IDA_PATH_MAX + 32], staging[IDA_PATH_MAX + 32],
        staged[2 * IDA_PATH_MAX + 64], lock[IDA_PATH_MAX + 32];
    /* The longest path the node opens: staging/nodeID/... */
    if (strlen(data) + 2 * sizeof("/.import-node65535") >= IDA_PATH_MAX) {
        return fail(errmsg, IDA_ECONFIG, "data directory path too long");
    }
    snprintf(final, sizeof(final), "%s/node%u", data, o->node_id);
    snprintf(staging, sizeof(staging), "%s/.import-node%u", data, o->node_id);
    snprintf(staged, sizeof(staged), "%s/node%u", staging, o->node_id);
    snprintf(lock, sizeof(lock), "%s/.import-node%u.lock", data, o->node_id);
    snprintf(info->dir, sizeof(info->dir), "%s", final);
    int empty = new_node_dir(final);
    if (empty <= 0) {
        return fail(errmsg, empty < 0 ? IDA_EIO : IDA_EEXIST,
                    "%.300s %s: the import writes only a new node directory "
                    "(a node that holds state is never overwritten; remove "
                    "it first if it is to go)",
                    final,
                    empty < 0 ? "cannot be read" : "exists and is not empty");
    }
    struct ida_backup b;
    int rv = ida_backup_read(file, &b, errmsg);
    if (rv != 0) {
        return rv;
    }
    snprintf(info->from_cluster, sizeof(info->from_cluster), "%s", b.cluster);
    info->from_index = b.index;
    info->from_term = b.term;
    uint8_t *snap = NULL;
    size_t len = 0;
    if (strcmp(b.cluster, cfg.cluster) == 0) {
        rv = fail(errmsg, IDA_EINVAL,
                  "%s was taken from cluster %s, the name in %s: an import "
                  "makes a new cluster (give its cluster file another "
                  "`cluster` name)",
                  file, b.cluster, o->config_path);
    } else {
        rv = make_state(file, &b, advance, info, &snap, &len, errmsg);
    }
    /* Nothing is written before the state is known good. */
    int lfd = -1;
    if (rv == 0 && mkdir(data, 0755) != 0 && errno != EEXIST) {
        rv = fail(errmsg, IDA_EIO, "%s: cannot create the data directory: %s",
                  data, strerror(errno));
    } else if (rv == 0 && (lfd = lock_file(lock)) < 0) {
        rv = fail(errmsg, IDA_EIO,
                  "%s: cannot lock it (another import of node %u runs?): %s",
                  lock, o->node_id, strerror(errno));
    } else if (rv == 0 && (empty = new_node_dir(final)) <= 0) {
        /* Another import finished while this one read the backup. */
        rv = fail(errmsg, empty < 0 ? IDA_EIO : IDA_EEXIST,
                  "%.300s %s: the import writes only a new node directory "
                  "(another import of node %u finished meanwhile?)",
                  final,
                  empty < 0 ? "cannot be read" : "exists and is not empty",
                  o->node_id);
    } else if (rv == 0 && remove_tree(staging) != 0) {
        rv = fail(errmsg, IDA_EIO,
                  "%s: cannot remove an earlier import's staging directory: "
                  "%s",
                  staging, strerror(errno));
    } else if (rv == 0 && mkdir(staging, 0700) != 0) {
        rv = fail(errmsg, IDA_EIO, "%s: cannot create it: %s", staging,
                  strerror(errno));
    }
    if (rv == 0) {
        rv = store(o, staging, &b, snap, len, errmsg);
        /* Into place in one step: rename() replaces an empty directory. */
        if (rv == 0 && rename(staged, final) != 0) {
            rv = fail(errmsg, IDA_EIO,
                      "%s: cannot move the new node directory into place: %s",
                      final, strerror(errno));
        } else if (rv == 0 && ida_fsync_dir(data) != 0) {
            rv = fail(errmsg, IDA_EIO,
                      "%s is in place, but the fsync of %s failed: %s (a crash "
                      "now may undo the import; run it again if so)",
                      final, data, strerror(errno));
        }
        if (remove_tree(staging) != 0 && rv == 0) {
            IDA_WARN("import: %s: could not remove it: %s", staging,
                     strerror(errno));
        }
    }
    if (lfd >= 0) {
        /* Removed while still held: an import that locks the removed file
         * after this one lets go sees it is no longer at its path and
         * tries the one there (lock_file()). */
        if (unlink(lock) != 0) {
            IDA_WARN("import: %s: could not remove it: %s", lock,
                     strerror(errno));
        }
        close(lfd);
    }
    ida_free(snap);
    ida_backup_free(&b);
    if (rv != 0 && errmsg[0] == '\0') {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s", idalloc_strerror(rv));
    }
    return rv;
}
