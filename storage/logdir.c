/* storage/: the entry log's side of open: the directory log/ next to
 * data.mdb, made for a new directory, filled from the "log" database of a
 * directory of format 3 or before (once), checked against what LMDB says
 * of it, and the owner's cache of the log and the commit set from it. See
 * storage.h, "THE LOG". */
#include "storage/storage.h"

#include <dirent.h>
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/fdio.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "storage/entlog.h"
#include "storage/internal.h"
#include "storage/record.h"

/* The segment an open starts appends in (seglog.h, open_segment_bytes). */
#define OPEN_SEGMENT_BYTES (1u << 20)
/* Entries moved from LMDB per record. */
#define MOVE_BYTES (1u << 20)

int ida__storage_put_log_lsn(struct ida_storage *s, MDB_txn *txn, uint64_t lsn)
{
    uint8_t rec[IDA__REC_BOOT_BYTES];
    ida__rec_log_lsn_encode(rec, lsn);
    return ida__storage_put_meta(s, txn, KEY_LOG_LSN, rec, sizeof(rec));
}

static int lsn_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    (void)arg;
    return ida__storage_put_log_lsn(s, txn, ida_entlog_synced_lsn(s->elog));
}

void ida__storage_log_close(struct ida_storage *s)
{
    if (s->elog == NULL) {
        return;
    }
    /* A clean stop records how far the log is durable. */
    uint64_t lsn = ida_entlog_synced_lsn(s->elog);
    if (s->failed == 0 && lsn > s->log_lsn &&
        ida__storage_run_write(s, "close", lsn_txn, NULL) == 0) {
        s->log_lsn = lsn;
    }
    ida_entlog_close(s->elog);
    s->elog = NULL;
}

/* What the segments' headers name as theirs: this directory's node and
 * incarnation, and the start of the cluster's name. */
static void log_ident(const struct ida_storage *s, uint8_t out[32])
{
    memset(out, 0, 32);
    memcpy(out, "IDAL", 4);
    ida__put_be32(out + 4, s->identity.node_id);
    ida__put_be64(out + 8, s->identity.incarnation);
    size_t n = strlen(s->identity.cluster);
    memcpy(out + 16, s->identity.cluster, n < 16 ? n : 16);
}

/* Remove @path, the log of a move that did not finish (its LMDB commit
 * never came): it holds segments and their temporary files only, or it
 * is not ours to remove. */
static int remove_unfinished(struct ida_storage *s, const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL) {
        return ida__storage_fail(s, s->dir, IDA_EIO, "cannot read %s: %s", path,
                                 strerror(errno));
    }
    int rv = 0;
    struct dirent *de;
    char file[4096];
    while (rv == 0 && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
            continue;
        }
        if (strncmp(de->d_name, "seg-", 4) != 0 &&
            strncmp(de->d_name, "tmp-", 4) != 0) {
            rv = ida__storage_fail(s, s->dir, IDA_EFOREIGN,
                                   "%s holds \"%s\", not a log segment; "
                                   "refusing to remove it",
                                   path, de->d_name);
            break;
        }
        int k = snprintf(file, sizeof(file), "%s/%s", path, de->d_name);
        if (k < 0 || (size_t)k >= sizeof(file) || unlink(file) != 0) {
            rv = ida__storage_fail(s, s->dir, IDA_EIO, "cannot remove %s/%s",
                                   path, de->d_name);
        }
    }
    closedir(d);
    if (rv == 0 && (rmdir(path) != 0 || ida_fsync_dir(s->dir) != 0)) {
        rv = ida__storage_fail(s, s->dir, IDA_EIO, "cannot remove %s: %s", path,
                               strerror(errno));
    }
    return rv;
}

/* Copy the "log" database's entries into the new entry log, with the
 * commit, and make them durable. */
static int move_entries(struct ida_storage *s)
{
    ida_index next = s->log.first;
    int rv = 0;
    while (rv == 0 && next <= s->log.last) {
        struct ida_entry *es = NULL;
        size_t n = 0;
        rv = ida__storage_lmdb_entries(s, next, s->log.last + 1, MOVE_BYTES,
                                       &es, &n);
        if (rv != 0) {
            return ida__storage_fail(
                s, s->dir, rv,
                "cannot read entries from %llu of the log to move: %s",
                (unsigned long long)next, idalloc_strerror(rv));
        }
        ida_index last = es[n - 1].index;
        rv = ida_entlog_append(
            s->elog, 0,
            ida__storage_record_commit(s, s->hard_state.commit, last), es, n);
        ida_free(es);
        next = last + 1;
    }
    if (rv == 0) {
        rv = ida_entlog_sync(s->elog);
    }
    if (rv != 0) {
        return ida__storage_fail(s, s->dir, rv,
                                 "cannot move the log into %s/: %s",
                                 IDA_STORAGE_LOG_DIR, idalloc_strerror(rv));
    }
    return 0;
}

struct finish_args
{
    int moved;        /* drop the "log" database, write format 4 */
    int prev_changed; /* record s->log's prev */
};

static int finish_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    const struct finish_args *a = arg;
    int rc = ida__storage_put_log_lsn(s, txn, ida_entlog_synced_lsn(s->elog));
    if (rc == 0 && a->prev_changed) {
        uint8_t prev[IDA__REC_LOG_PREV_BYTES];
        ida__rec_log_prev_encode(prev, s->log.prev_index, s->log.prev_term);
        rc = ida__storage_put_meta(s, txn, KEY_LOG_PREV, prev, sizeof(prev));
    }
    if (rc == 0 && a->moved) {
        rc = mdb_drop(txn, s->dbi_log, 1);
    }
    if (rc == 0 && a->moved) {
        uint8_t fmt[IDA__REC_FORMAT_BYTES];
        ida__rec_format_encode(fmt, IDA_STORAGE_FORMAT_VERSION);
        rc = ida__storage_put_meta(s, txn, KEY_FORMAT, fmt, sizeof(fmt));
    }
    return rc;
}

/* Set s->log and the commit from the open entry log. */
static int take_bounds(struct ida_storage *s, int *prev_changed)
{
    ida_index prev, last;
    ida_term prev_term;
    ida_entlog_bounds(s->elog, &prev, &prev_term, &last);
    *prev_changed = prev != s->log.prev_index;
    s->log.prev_index = prev;
    s->log.prev_term = prev_term;
    s->log.first = prev + 1;
    s->log.last = last;
    int rv = ida_entlog_term_at(s->elog, last, &s->log.last_term);
    IDA_ASSERT(rv == 0); /* the last entry, or prev */
    ida_index commit = ida_entlog_commit(s->elog);
    if (commit > s->hard_state.commit) {
        s->hard_state.commit = commit;
    }
    if (s->hard_state.commit > last &&
        (!s->has_snapshot || s->hard_state.commit > s->snapshot_index)) {
        return ida__storage_fail(
            s, s->dir, IDA_ECORRUPT,
            "the commit index %llu is beyond the log (last entry %llu) "
            "and the snapshot (%llu): the log lost entries" DAMAGE_TAIL,
            (unsigned long long)s->hard_state.commit, (unsigned long long)last,
            (unsigned long long)(s->has_snapshot ? s->snapshot_index : 0));
    }
    return 0;
}

int ida__storage_log_open(struct ida_storage *s,
                          const char *dir,
                          uint32_t format,
                          int have_idfile)
{
    char path[4096];
    int k = snprintf(path, sizeof(path), "%s/%s", dir, IDA_STORAGE_LOG_DIR);
    if (k < 0 || (size_t)k >= sizeof(path)) {
        return ida__storage_fail(s, dir, IDA_EINVAL, "path too long");
    }
    struct stat st;
    int exists = lstat(path, &st) == 0;
    if (exists && !S_ISDIR(st.st_mode)) {
        return ida__storage_fail(s, dir, IDA_EFOREIGN,
                                 "%s is not a directory; refusing to touch it",
                                 path);
    }
    int move = format < IDA_STORAGE_FORMAT_VERSION;
    IDA_ASSERT(move == s->lmdb_log);
    /* The next segment is made on a thread of its own (seglog.h, THE
     * MAKER): its writes and flushes never hold the storage processor. */
    struct ida_seglog_options o = {.segment_bytes = s->log_segment_bytes,
                                   .min_lsn = s->log_lsn,
                                   .behind = true};
    /* A start writes 1 MiB, not a whole segment (0.16 s at 65 MiB). */
    o.open_segment_bytes = s->log_segment_bytes < OPEN_SEGMENT_BYTES
                               ? s->log_segment_bytes
                               : OPEN_SEGMENT_BYTES;
    log_ident(s, o.ident);
    int rv = 0;
    if (move && exists) {
        rv = remove_unfinished(s, path);
        exists = 0;
    } else if (!exists && (have_idfile || s->log_lsn != 0)) {
        return ida__storage_fail(
            s, dir, IDA_ELOSTSTATE,
            "data directory of node %u incarnation %016llx has lost its "
            "log (%s is missing): the node must not rejoin as its old self; "
            "remove the directory to rejoin as a new incarnation (see "
            "README, Runbook)",
            (unsigned)s->identity.node_id,
            (unsigned long long)s->identity.incarnation, path);
    }
    /* Else a new directory, or a first start killed between its LMDB
     * commit and this: no entry was ever written. */
    if (rv == 0 && !exists &&
        ((mkdir(path, 0700) != 0 && errno != EEXIST) ||
         ida_fsync_dir(dir) != 0)) {
        rv = ida__storage_fail(s, dir, errno == ENOSPC ? IDA_ENOSPC : IDA_EIO,
                               "cannot create %s: %s", path, strerror(errno));
    }
    if (rv != 0) {
        return rv;
    }
    char err[IDA_STORAGE_ERRMSG_MAX - 64] = "";
    rv = ida_entlog_open(path, &o, s->log.prev_index, s->log.prev_term,
                         s->has_snapshot ? s->snapshot_index : 0,
                         s->has_snapshot ? s->snapshot_term : 0, &s->elog, err,
                         sizeof(err));
    if (rv != 0) {
        s->elog = NULL;
        return ida__storage_fail(s, dir, rv, "log: %s%s",
                                 err[0] != '\0' ? err : idalloc_strerror(rv),
                                 rv == IDA_ECORRUPT ? DAMAGE_TAIL : "");
    }
    struct finish_args a = {.moved = move};
    if (move) {
        rv = move_entries(s);
    }
    if (rv == 0) {
        rv = take_bounds(s, &a.prev_changed);
    }
    if (rv == 0) {
        rv = ida__storage_run_write(s, "open (the log)", finish_txn, &a);
    }
    if (rv != 0) {
        ida_entlog_close(s->elog);
        s->elog = NULL;
        return rv;
    }
    if (move) {
        IDA_INFO(
            "storage %s: moved the log (entries %llu to %llu) out of "
            "data.mdb into %s/ (format %u)",
            dir, (unsigned long long)s->log.first,
            (unsigned long long)s->log.last, IDA_STORAGE_LOG_DIR,
            IDA_STORAGE_FORMAT_VERSION);
        s->lmdb_log = 0;
        if (s->identity.upgraded_from == 0) {
            s->identity.upgraded_from = format;
        }
    }
    s->log_lsn = ida_entlog_synced_lsn(s->elog);
    return 0;
}
