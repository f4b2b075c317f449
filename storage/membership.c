/* The first membership: the encoded configuration a node uses before its
 * log or snapshot holds one (storage/storage.h, "membership0").
 * Record: "IDAM" | u32 len | len bytes | u32 crc over all before it. */
#include "storage/storage.h"

#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

#define KEY       "membership0"
#define MAGIC     "IDAM"
#define HEADER    8
#define TRAILER   4
#define MAX_BYTES (64u * 1024u)

struct put_arg
{
    const uint8_t *data;
    size_t len;
};

static int put_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    const struct put_arg *a = arg;
    size_t n = HEADER + a->len + TRAILER;
    uint8_t *rec = ida_malloc(n);
    if (rec == NULL) {
        return IDA_ENOMEM;
    }
    memcpy(rec, MAGIC, 4);
    ida__put_be32(rec + 4, (uint32_t)a->len);
    memcpy(rec + HEADER, a->data, a->len);
    ida__put_be32(rec + HEADER + a->len, ida__crc32c(0, rec, HEADER + a->len));
    int rv = ida__storage_put_meta(s, txn, KEY, rec, n);
    ida_free(rec);
    return rv;
}

int ida_storage_membership0_set(struct ida_storage *s,
                                const uint8_t *data,
                                size_t len)
{
    if (data == NULL || len == 0 || len > MAX_BYTES) {
        return IDA_EINVAL;
    }
    struct put_arg a = {data, len};
    return ida__storage_run_write(s, "storing the first membership", put_txn,
                                  &a);
}

int ida_storage_membership0(struct ida_storage *s, uint8_t **out, size_t *len)
{
    MDB_txn *txn;
    int rv = ida__storage_read_begin(s, &txn);
    if (rv != 0) {
        return rv;
    }
    MDB_val v;
    int rc = ida__storage_get_meta(s, txn, KEY, &v);
    if (rc == MDB_NOTFOUND) {
        ida__storage_read_end(s, txn);
        return IDA_ENOTFOUND;
    }
    const uint8_t *p = v.mv_data;
    rv = IDA_ECORRUPT;
    if (rc == 0 && v.mv_size >= HEADER + TRAILER && memcmp(p, MAGIC, 4) == 0) {
        size_t n = ida__get_be32(p + 4);
        if (n == v.mv_size - HEADER - TRAILER && n > 0 &&
            ida__get_be32(p + HEADER + n) == ida__crc32c(0, p, HEADER + n)) {
            *out = ida_malloc(n);
            rv = *out == NULL ? IDA_ENOMEM : 0;
            if (rv == 0) {
                memcpy(*out, p + HEADER, n);
                *len = n;
            }
        }
    }
    ida__storage_read_end(s, txn);
    return rv;
}
