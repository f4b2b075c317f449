/* bin/idallocd: run one node of an idalloc cluster.
 *
 *   idallocd --config FILE --node ID [--data DIR] [--peer ADDR --client ADDR]
 *            [--join ADDR,...]
 *
 * Config errors and a foreign data directory stop it with one line on
 * stderr (exit 2 for usage and config, 1 for storage) before anything is
 * bound. With --join and a new data directory it first asks the running
 * cluster for its membership (ida_node_join()), every second until a
 * member answers. SIGINT/SIGTERM stop it cleanly (exit 0). */
#define _GNU_SOURCE /* sigtimedwait() */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/collapse.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "idalloc_version.h"
#include "src/node/args.h"
#include "src/node/export.h"
#include "src/node/import.h"
#include "src/node/node.h"

/* --export-backup: the forced recovery's first step (src/node/export.h). */
static int export_backup(const struct ida_node_opts *o)
{
    char err[IDA_ERRMSG_MAX] = "";
    struct ida_node_export_info x;
    if (o->has_log_level) {
        ida_log_set_level(o->log_level);
    }
    int rv = ida_node_export(o, o->export_backup, &x, err);
    if (rv != 0) {
        fprintf(stderr, "idallocd: %s\n", err);
        return rv == IDA_ECONFIG || rv == IDA_EINVAL ? 2 : 1;
    }
    printf(
        "exported node %u to %s: index=%llu term=%llu (this node's commit "
        "index %llu, snapshot %llu) pools=%zu bytes=%zu\n",
        o->node_id, o->export_backup, (unsigned long long)x.index,
        (unsigned long long)x.term, (unsigned long long)x.commit,
        (unsigned long long)x.snapshot, x.pools, x.state_bytes);
    return 0;
}

/* --import-backup: seed a new cluster's first node (src/node/import.h). */
static int import_backup(const struct ida_node_opts *o)
{
    char err[IDA_ERRMSG_MAX] = "";
    static struct ida_node_import_info x; /* large: not on the stack */
    if (o->has_log_level) {
        ida_log_set_level(o->log_level);
    }
    int rv =
        ida_node_import(o, o->import_backup, o->advance_sequences, &x, err);
    if (rv != 0) {
        fprintf(stderr, "idallocd: %s\n", err);
        /* Bad input (usage, file, backup) is 2; the directory or the
         * machine (I/O, memory) 1. */
        return rv == IDA_ECONFIG || rv == IDA_EINVAL || rv == IDA_EFOREIGN ||
                       rv == IDA_EVERSION || rv == IDA_ECORRUPT ||
                       rv == IDA_EEXHAUSTED
                   ? 2
                   : 1;
    }
    printf(
        "imported %s into %s: %zu pool(s) of cluster %s at its index %llu "
        "(term %llu), sequence pools advanced by %llu, %zu bytes; start "
        "node %u, then the cluster file's other nodes with new data "
        "directories: they join it (README, \"Backup and restore\")\n",
        o->import_backup, x.dir, x.pools, x.from_cluster,
        (unsigned long long)x.from_index, (unsigned long long)x.from_term,
        (unsigned long long)o->advance_sequences, x.state_bytes, o->node_id);
    if (o->advance_sequences == 0) {
        fprintf(stderr,
                "idallocd: warning: sequence pools were not advanced: ids the "
                "old cluster reserved after the backup can be handed out "
                "again (--advance-sequences N)\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct ida_node_opts o;
    char err[IDA_ERRMSG_MAX] = "";
    switch (ida_node_args_parse(argc, argv, &o, err)) {
        case IDA_NODE_ARGS_HELP:
            fputs(ida_node_usage, stdout);
            return 0;
        case IDA_NODE_ARGS_VERSION:
            printf("idallocd %s\n", IDALLOC_VERSION);
            return 0;
        case IDA_NODE_ARGS_BAD:
            fprintf(stderr, "idallocd: %s\n", err);
            return 2;
        case IDA_NODE_ARGS_RUN:
            break;
    }
    ida_log_set_json(o.log_json);
    if (o.export_backup != NULL) {
        return export_backup(&o);
    }
    if (o.import_backup != NULL) {
        return import_backup(&o);
    }
    /* Every thread inherits this mask; only main takes the signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    static struct ida_node node;
    int rv = ida_node_open(&node, &o, err);
    if (rv != 0) {
        fprintf(stderr, "idallocd: %s\n", err);
        return rv == IDA_ECONFIG || rv == IDA_EINVAL ? 2 : 1;
    }
    if (o.has_log_level) {
        ida_log_set_level(o.log_level); /* over the cluster file's */
    }
    if (o.join != NULL && !ida_node_is_new(&node)) {
        IDA_INFO(
            "join: the data directory holds this node's state: --join is "
            "not needed (ignored)");
    } else if (o.join != NULL) {
        /* Until a member answers; a signal meanwhile stops the node. */
        uint64_t tries = 0;
        while ((rv = ida_node_join(&node, o.join, err)) != 0) {
            if (rv == IDA_EINVAL) {
                fprintf(stderr, "idallocd: %s\n", err);
                ida_node_close(&node);
                return 1;
            }
            if (tries++ % 10 == 0) {
                IDA_WARN("%s; retrying every second", err);
            }
            struct timespec second = {.tv_sec = 1};
            if (sigtimedwait(&set, NULL, &second) > 0) {
                ida_node_close(&node);
                return 0;
            }
        }
    }
    /* Tables and slabs once written, and the rest of the memory once it
     * settles, go onto huge pages soon rather than when khugepaged gets to
     * them (base/collapse.h), unless the cluster file says not to. */
    if (!node.cfg.huge_page_collapse) {
        IDA_INFO(
            "memory: huge_page_collapse off: large tables wait for "
            "khugepaged (a snapshot child's fork() copies more page tables "
            "meanwhile)");
    } else if (ida_collapse_start(true) != 0) {
        IDA_INFO(
            "memory: this system cannot collapse written memory into huge "
            "pages (madvise MADV_COLLAPSE, Linux 6.1); large tables wait "
            "for khugepaged");
    }
    rv = ida_node_start(&node, err);
    if (rv != 0) {
        fprintf(stderr, "idallocd: %s\n", err);
        ida_collapse_stop();
        return 1;
    }
    int sig = 0;
    sigwait(&set, &sig);
    IDA_INFO("node: signal %d: stopping", sig);
    ida_node_close(&node);
    ida_collapse_stop();
    IDA_INFO("node: stopped");
    return node.exit_status;
}
