/* Export a stopped node's state as a backup file: src/node/export.h. */
#include "src/node/export.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/heap.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "src/common/backup.h"
#include "src/common/config.h"
#include "src/node/lend.h"
#include "storage/storage.h"

#define EXPORT_READ_BYTES (8u << 20) /* log read per step */

/* The node's directory must hold a node's state before anything opens it
 * (opening a missing one would create an empty node). */
static int check_dir(const struct ida_node_opts *o, char *errmsg)
{
    struct ida_config cfg;
    if (ida_config_load(o->config_path, &cfg, errmsg) != 0) {
        return IDA_ECONFIG;
    }
    const char *data = o->data_dir != NULL ? o->data_dir : cfg.data_dir;
    char path[IDA_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%.*s/node%u/data.mdb", IDA_PATH_MAX - 1, data,
             o->node_id);
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%.300s/node%u holds no node state (no data.mdb): nothing "
                 "to export",
                 data, o->node_id);
        return IDA_ENOTFOUND;
    }
    return 0;
}

/* Apply every entry of the log after the snapshot to @f. */
static int apply_log(struct ida_storage *st,
                     struct ida_fsm *f,
                     ida_term *last_term,
                     char *errmsg)
{
    struct ida_storage_log_state ls;
    int rv = ida_storage_log_state(st, &ls);
    if (rv != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s", st->errmsg);
        return rv;
    }
    ida_index next = ida_fsm_applied_index(f) + 1;
    if (next < ls.first && next <= ls.last) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%s: the log starts at %llu, after the snapshot's %llu",
                 st->dir, (unsigned long long)ls.first,
                 (unsigned long long)next - 1);
        return IDA_ECORRUPT;
    }
    while (next <= ls.last) {
        struct ida_entry *es;
        size_t n;
        rv = ida_storage_entries(st, next, ls.last + 1, EXPORT_READ_BYTES, &es,
                                 &n);
        if (rv != 0) {
            snprintf(errmsg, IDA_ERRMSG_MAX, "%s", st->errmsg);
            return rv;
        }
        for (size_t i = 0; i < n && rv == 0; i++) {
            struct ida_fsm_applied ap;
            rv = ida_fsm_apply(f, es[i].index, es[i].type, es[i].data,
                               es[i].len, &ap);
            *last_term = es[i].term;
            if (rv != 0) {
                snprintf(errmsg, IDA_ERRMSG_MAX,
                         "%s: entry %llu does not apply: %s", st->dir,
                         (unsigned long long)es[i].index, idalloc_strerror(rv));
                rv = rv == IDA_ENOMEM ? rv : IDA_ECORRUPT;
            }
        }
        next += n;
        ida_free(es);
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

static int export_state(struct ida_node *n,
                        const char *file,
                        struct ida_node_export_info *info,
                        char *errmsg)
{
    struct ida_storage *st = &n->storage;
    struct ida_fsm *f = NULL;
    struct ida_snapshot_meta meta = {0};
    uint8_t *snap = NULL;
    struct ida_hard_state hs;
    ida_term term = 0;
    int rv = ida_storage_hard_state(st, &hs);
    if (rv == 0) {
        rv = ida_fsm_new(&f);
    }
    if (rv == 0) {
        rv = ida_storage_snapshot_load(st, &meta, &snap);
        if (rv == 0) {
            info->snapshot = meta.index;
            term = meta.term;
            rv = ida__restore_lent(f, snap, meta.data_size);
            if (rv != 0) {
                snprintf(errmsg, IDA_ERRMSG_MAX,
                         "%s: its snapshot at %llu does not restore: %s",
                         st->dir, (unsigned long long)meta.index,
                         idalloc_strerror(rv));
            }
        } else if (rv == IDA_ENOTFOUND) {
            rv = 0;
        } else {
            snprintf(errmsg, IDA_ERRMSG_MAX, "%s", st->errmsg);
        }
    }
    if (rv == 0) {
        rv = apply_log(st, f, &term, errmsg);
    }
    struct ida_backup b = {.version = IDA_BACKUP_VERSION};
    if (rv == 0 && ida_fsm_applied_index(f) == 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s holds no entry: nothing to export",
                 st->dir);
        rv = IDA_ENOTFOUND;
    }
    if (rv == 0) {
        rv = ida_fsm_snapshot(f, &b.state, &b.state_len);
    }
    if (rv == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(b.cluster, sizeof(b.cluster), "%s", n->cfg.cluster);
        b.index = ida_fsm_applied_index(f);
        b.term = term;
        b.created_unix_ms =
            (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
        rv = ida_backup_write(file, &b, errmsg);
    }
    if (rv == 0) {
        info->index = b.index;
        info->term = b.term;
        info->commit = hs.commit;
        info->pools = ida_fsm_pool_count(f);
        info->state_bytes = b.state_len;
    }
    ida_free(b.state);
    ida_free(snap);
    ida_snapshot_meta_release(&meta);
    ida_fsm_free(f);
    return rv;
}

int ida_node_export(const struct ida_node_opts *o,
                    const char *file,
                    struct ida_node_export_info *info,
                    char *errmsg)
{
    memset(info, 0, sizeof(*info));
    errmsg[0] = '\0';
    int rv = check_dir(o, errmsg);
    if (rv != 0) {
        return rv;
    }
    static struct ida_node n; /* large: not on the stack */
    rv = ida_node_open(&n, o, errmsg);
    if (rv != 0) {
        return rv;
    }
    rv = export_state(&n, file, info, errmsg);
    if (rv != 0 && errmsg[0] == '\0') {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s", idalloc_strerror(rv));
    }
    ida_node_close(&n);
    return rv;
}
