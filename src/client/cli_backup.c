#include "src/client/cli_backup.h"

#include <stdio.h>
#include <string.h>

#include "src/client/snapshot.h"

static int report(const char *what, int rv, const struct idalloc_call *call)
{
    const char *detail = call->errmsg;
    fprintf(stderr, "idalloc: %s: %s%s%s%s\n", what, idalloc_strerror(rv),
            detail[0] != '\0' ? " (" : "", detail,
            detail[0] != '\0' ? ")" : "");
    return idalloc_exit_code(rv);
}

static int save(struct idalloc_client *c,
                const char *file,
                struct idalloc_call *call)
{
    struct ida_backup b;
    int rv = ida_client_snapshot_read(c, &b, call);
    if (rv != 0) {
        return report("snapshot save", rv, call);
    }
    char err[IDA_ERRMSG_MAX];
    rv = ida_backup_write(file, &b, err);
    if (rv != 0) {
        fprintf(stderr, "idalloc: snapshot save: %s\n", err);
        ida_backup_free(&b);
        return 1;
    }
    printf("saved %s index=%llu term=%llu cluster=%s bytes=%zu\n", file,
           (unsigned long long)b.index, (unsigned long long)b.term, b.cluster,
           b.state_len);
    ida_backup_free(&b);
    return 0;
}

static int restore(struct idalloc_client *c,
                   const struct ida_cli *cli,
                   struct idalloc_call *call)
{
    struct ida_backup b;
    char err[IDA_ERRMSG_MAX];
    int rv = ida_backup_read(cli->file, &b, err);
    if (rv != 0) {
        fprintf(stderr, "idalloc: snapshot restore: %s; nothing was sent\n",
                err);
        return 2;
    }
    uint32_t pools = 0;
    rv = ida_client_restore(c, &b, cli->advance, &pools, call);
    if (rv != 0) {
        size_t state_len = b.state_len;
        ida_backup_free(&b);
        char id[IDALLOC_CALL_ID_TEXT_MAX];
        if (call->state == IDALLOC_CALL_UNKNOWN &&
            idalloc_call_format(call, id) == 0) {
            fprintf(stderr,
                    "idalloc: snapshot restore: request id %s: repeat the "
                    "same command with --request-id %s to learn its outcome "
                    "(exactly once)\n",
                    id, id);
        }
        int code = report("snapshot restore", rv, call);
        if (rv == IDA_ETOOBIG) {
            fprintf(stderr,
                    "idalloc: snapshot restore: the backup's state (%zu "
                    "bytes) is more than the cluster takes in one request: "
                    "seed a new cluster with it by idallocd --import-backup "
                    "instead (README, \"Backup and restore\")\n",
                    state_len);
        }
        return code;
    }
    printf(
        "restored %u pool(s) of cluster %s at index %llu; sequence pools "
        "advanced by %llu; bounded and prefix pools restored to index "
        "%llu\n",
        pools, b.cluster, (unsigned long long)b.index,
        (unsigned long long)cli->advance, (unsigned long long)b.index);
    if (cli->advance == 0) {
        fprintf(stderr,
                "idalloc: snapshot restore: warning: sequence ids reserved "
                "after index %llu can be handed out again; see README, "
                "\"Backup and restore\" (--advance-sequences)\n",
                (unsigned long long)b.index);
    }
    ida_backup_free(&b);
    return 0;
}

int ida_cli_snapshot_run(struct idalloc_client *c,
                         const struct ida_cli *cli,
                         struct idalloc_call *call)
{
    return cli->cmd == IDA_CLI_SNAPSHOT_SAVE ? save(c, cli->file, call)
                                             : restore(c, cli, call);
}
