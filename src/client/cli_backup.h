/* idalloc snapshot save|restore (README, "Backup and restore"). Part of
 * bin/idalloc only. */
#ifndef IDA_CLI_BACKUP_H
#define IDA_CLI_BACKUP_H

#include "src/client/cli.h"

/* Run `snapshot save` or `snapshot restore` as @cli says; results on stdout,
 * one-line errors on stderr. Returns the process exit code. */
int ida_cli_snapshot_run(struct idalloc_client *c,
                         const struct ida_cli *cli,
                         struct idalloc_call *call);

#endif /* IDA_CLI_BACKUP_H */
