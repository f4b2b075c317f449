/* Backup files: what `idalloc snapshot save` writes and `idalloc snapshot
 * restore` reads (README, "Backup and restore").
 *
 * FORMAT
 *
 *   "IDABAK01"                 8 bytes: what the file is and its format
 *   length                     4 bytes big-endian: bytes of the message
 *   Backup message             proto/idalloc.proto: version, cluster name,
 *                              index and term the state is at, creation
 *                              time, the FsmState bytes
 *   CRC-32C                    4 bytes big-endian, of everything before it
 *
 * The FsmState carries its own checksum too (fsm/fsm.h), checked by the
 * nodes when they restore it. A file is written atomically: a temporary file
 * next to it, fsync, rename, fsync of the directory, so a crash leaves the
 * old file or the new one, never half of one.
 */
#ifndef IDA_COMMON_BACKUP_H
#define IDA_COMMON_BACKUP_H

#include <stddef.h>
#include <stdint.h>

#include "idalloc_errors.h"
#include "src/common/config.h" /* IDA_ERRMSG_MAX */

#define IDA_BACKUP_MAGIC          "IDABAK01"
#define IDA_BACKUP_VERSION        1
#define IDA_BACKUP_CLUSTER_MAX    64
#define IDA_BACKUP_FILE_BYTES_MAX (1ull << 32) /* 4 GiB */

struct ida_backup
{
    uint32_t version;
    char cluster[IDA_BACKUP_CLUSTER_MAX + 1];
    uint64_t index;
    uint64_t term;
    uint64_t created_unix_ms;
    uint8_t *state; /* owned (ida_malloc) */
    size_t state_len;
};

/* CRC-32C (Castagnoli) of @len bytes, continuing @crc (0 to start). */
uint32_t ida_backup_crc32c(uint32_t crc, const void *data, size_t len);

/* Write @b to @path atomically (above). Returns 0, IDA_EINVAL (empty state
 * or cluster), IDA_ENOMEM or IDA_EIO with a line naming the file in @errmsg
 * (IDA_ERRMSG_MAX bytes); on error @path is untouched and the temporary file
 * removed. */
int ida_backup_write(const char *path,
                     const struct ida_backup *b,
                     char *errmsg);

/* Read and check the backup at @path into @out (free with
 * ida_backup_free()). Returns 0, IDA_EIO (cannot read), IDA_EFOREIGN (not
 * a backup file), IDA_EVERSION (a newer format), IDA_ECORRUPT (damaged:
 * truncated, checksum, does not decode, empty fields) or IDA_ENOMEM, with
 * one line in @errmsg; on error @out holds nothing. */
int ida_backup_read(const char *path, struct ida_backup *out, char *errmsg);

/* Encode/decode the file bytes (the two above without the file). */
int ida_backup_encode(const struct ida_backup *b, uint8_t **out, size_t *len);
int ida_backup_decode(const uint8_t *data,
                      size_t len,
                      struct ida_backup *out,
                      char *errmsg);

void ida_backup_free(struct ida_backup *b);

#endif /* IDA_COMMON_BACKUP_H */
