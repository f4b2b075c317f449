/* storage/: the boot record (how many times the directory was opened) and
 * the untrusted mark. See ida_storage_boot() and raft/admission.h, rule A4. */
#include <stdio.h>
#include <string.h>

#include "idalloc_errors.h"
#include "storage/internal.h"
#include "storage/record.h"

int ida__storage_boot_step(struct ida_storage *s, MDB_txn *txn)
{
    MDB_val v;
    int rc = ida__storage_get_meta(s, txn, KEY_UNTRUSTED, &v);
    if (rc == 0) {
        const char *why;
        size_t n;
        if (ida__rec_untrusted_decode(v.mv_data, v.mv_size, &why, &n) != 0) {
            return RC_CORRUPT;
        }
        refuse(s, s->dir, IDA_ELOSTSTATE,
               "data directory of node %u incarnation %016llx is marked "
               "untrusted: %.*s; remove the directory to rejoin as a new "
               "incarnation (see README, Runbook)",
               (unsigned)s->identity.node_id,
               (unsigned long long)s->identity.incarnation, (int)n, why);
        return RC_REFUSED;
    }
    if (rc != MDB_NOTFOUND) {
        return rc;
    }
    uint64_t count = 0;
    rc = ida__storage_get_meta(s, txn, KEY_BOOT, &v);
    if (rc == 0) {
        if (ida__rec_boot_decode(v.mv_data, v.mv_size, &count) != 0) {
            return RC_CORRUPT;
        }
    } else if (rc != MDB_NOTFOUND) {
        return rc; /* absent: a directory made before boots were counted */
    }
    if (count >= UINT32_MAX) {
        refuse(s, s->dir, IDA_ECORRUPT, "the boot count %llu is at its maximum",
               (unsigned long long)count);
        return RC_REFUSED;
    }
    count++;
    uint32_t nonce = 0;
    while (nonce == 0) {
        uint8_t b[4];
        int err = ida__storage_random(b, sizeof(b));
        if (err != 0) {
            refuse(s, s->dir, IDA_EIO, "cannot draw a boot nonce: %s",
                   strerror(err));
            return RC_REFUSED;
        }
        nonce = ida__get_be32(b);
    }
    uint8_t rec[IDA__REC_BOOT_BYTES];
    ida__rec_boot_encode(rec, count);
    rc = ida__storage_put_meta(s, txn, KEY_BOOT, rec, sizeof(rec));
    if (rc == 0) {
        s->boot = count << 32 | nonce;
    }
    return rc;
}

uint64_t ida_storage_boot(const struct ida_storage *s)
{
    return s->boot;
}

struct mark_args
{
    const char *reason;
    size_t len;
};

static int mark_txn(struct ida_storage *s, MDB_txn *txn, void *arg)
{
    const struct mark_args *a = arg;
    uint8_t rec[IDA__REC_UNTRUSTED_FIXED + IDA__REC_REASON_MAX];
    size_t n = ida__rec_untrusted_encode(rec, a->reason, a->len);
    return ida__storage_put_meta(s, txn, KEY_UNTRUSTED, rec, n);
}

int ida_storage_mark_untrusted(struct ida_storage *s, const char *reason)
{
    IDA_ASSERT(s != NULL && s->env != NULL && reason != NULL);
    CHECK_PROCESS(s);
    struct mark_args a = {reason, strlen(reason)};
    if (a.len > IDA__REC_REASON_MAX) {
        a.len = IDA__REC_REASON_MAX;
    }
    return ida__storage_run_write(s, "mark untrusted", mark_txn, &a);
}
