/* Fuzz the state machine's snapshot restore (fsm/snap_decode.c).
 *
 * Input: byte 0 says whether to make the checksum right (bit 0) so the
 * decoder behind it is reached; the rest is an FsmState. The bytes are
 * restored over a state machine that holds pools and sessions. Checked:
 * the result is 0, IDA_ECORRUPT or IDA_EVERSION; a refused snapshot leaves
 * the state byte for byte as it was; an accepted one is a state whose own
 * snapshot restores to the same bytes, that goes on applying commands, and
 * whose answers to them are the same on a second copy (determinism). The
 * same bytes decoded ahead in pieces (fsm/snap_ahead.c) and then restored
 * get the same verdict and the same state. */
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "fsm/wire.h"
#include "idalloc_errors.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzzsupport.h"

/* Some commands to apply after a restore, against the pools it may hold. */
static size_t more_commands(uint8_t **out)
{
    static uint8_t cid[IDA_CLIENT_ID_BYTES] = {9};
    static const char *const pools[] = {"b", "s", "p", "a"};
    Idalloc__Command cmd[12], *ptr[12];
    Idalloc__Alloc al[4];
    Idalloc__Reserve rs[4];
    Idalloc__PrefixAlloc pa[4];
    for (int i = 0; i < 4; i++) {
        ProtobufCBinaryData pool = {strlen(pools[i]), (uint8_t *)pools[i]};
        ProtobufCBinaryData tag = {4, (uint8_t *)"zz-x"};
        idalloc__alloc__init(&al[i]);
        al[i].pool = pool;
        al[i].tag = tag;
        idalloc__reserve__init(&rs[i]);
        rs[i].pool = pool;
        rs[i].count = 7;
        idalloc__prefix_alloc__init(&pa[i]);
        pa[i].pool = pool;
        pa[i].tag = tag;
        for (int k = 0; k < 3; k++) {
            Idalloc__Command *c = &cmd[3 * i + k];
            idalloc__command__init(c);
            c->client_id.data = cid;
            c->client_id.len = sizeof(cid);
            c->request_seq = (uint64_t)(3 * i + k + 1);
            c->op_case = k == 0   ? IDALLOC__COMMAND__OP_ALLOC
                         : k == 1 ? IDALLOC__COMMAND__OP_RESERVE
                                  : IDALLOC__COMMAND__OP_PREFIX_ALLOC;
            c->alloc = &al[i];
            if (k == 1) {
                c->reserve = &rs[i];
            } else if (k == 2) {
                c->prefix_alloc = &pa[i];
            }
            ptr[3 * i + k] = c;
        }
    }
    return fz_batch_pack(ptr, 12, UINT64_C(1) << 40, out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 20)) {
        return 0;
    }
    int fix = data[0] & 1;
    const uint8_t *snap = data + 1;
    size_t len = size - 1;
    uint8_t *buf = ida_malloc(len + IDA__CHECKSUM_BYTES);
    FUZZ_CHECK(buf != NULL);
    memcpy(buf, snap, len);
    if (fix) {
        /* Replace a trailing checksum field, or add one. */
        if (len >= IDA__CHECKSUM_BYTES &&
            buf[len - IDA__CHECKSUM_BYTES] == IDA__CHECKSUM_KEY) {
            len -= IDA__CHECKSUM_BYTES;
        }
        uint64_t sum = ida__snapshot_checksum(buf, len);
        buf[len++] = IDA__CHECKSUM_KEY;
        for (int b = 0; b < 8; b++) {
            buf[len++] = (uint8_t)(sum >> (8 * b));
        }
    }

    /* The populated state is built once; each input starts from a copy. */
    static uint8_t *before;
    static size_t before_len;
    if (before == NULL) {
        struct ida_fsm *p;
        FUZZ_CHECK(ida_fsm_new(&p) == 0);
        fz_fsm_populate(p);
        FUZZ_CHECK(ida_fsm_snapshot(p, &before, &before_len) == 0);
        ida_fsm_free(p);
    }
    struct ida_fsm *f;
    FUZZ_CHECK(ida_fsm_new(&f) == 0);
    FUZZ_CHECK(ida_fsm_restore(f, before, before_len) == 0);

    int rv = ida_fsm_restore(f, buf, len);
    /* The same bytes decoded ahead as if they arrived in pieces (a node
     * receiving a leader's snapshot, fsm/snap_ahead.c), then restored with
     * what was decoded: the same verdict, and accepted, the same state. */
    struct ida_fsm_ahead *ahead;
    FUZZ_CHECK(ida_fsm_ahead_new(len, &ahead) == 0);
    size_t piece = 1 + (size_t)(data[0] >> 1) * 97;
    for (size_t at = 0; at < len;) {
        at += piece < len - at ? piece : len - at;
        ida_fsm_ahead_step(ahead, buf, at);
    }
    struct ida_fsm *h;
    FUZZ_CHECK(ida_fsm_new(&h) == 0);
    FUZZ_CHECK(ida_fsm_restore(h, before, before_len) == 0);
    FUZZ_CHECK(ida_fsm_restore_ahead(h, buf, len, NULL, ahead) == rv);
    ida_fsm_ahead_free(ahead);
    {
        uint8_t *s1, *s2;
        size_t l1, l2;
        FUZZ_CHECK(ida_fsm_snapshot(f, &s1, &l1) == 0);
        FUZZ_CHECK(ida_fsm_snapshot(h, &s2, &l2) == 0);
        FUZZ_CHECK(l1 == l2 && memcmp(s1, s2, l1) == 0);
        ida_free(s1);
        ida_free(s2);
    }
    ida_fsm_free(h);
    if (rv != 0) {
        FUZZ_CHECK(rv == IDA_ECORRUPT || rv == IDA_EVERSION);
        uint8_t *after;
        size_t after_len;
        FUZZ_CHECK(ida_fsm_snapshot(f, &after, &after_len) == 0);
        FUZZ_CHECK(after_len == before_len &&
                   memcmp(after, before, before_len) == 0);
        ida_free(after);
    } else {
        fz_fsm_check(f);
        /* A second copy from the same bytes answers the same. */
        struct ida_fsm *g;
        FUZZ_CHECK(ida_fsm_new(&g) == 0);
        FUZZ_CHECK(ida_fsm_restore(g, buf, len) == 0);
        uint8_t *cmds;
        size_t clen = more_commands(&cmds);
        struct ida_fsm_applied a, b;
        if (ida_fsm_applied_index(f) < UINT64_MAX) {
            fz_apply(f, cmds, clen, &a);
            fz_apply(g, cmds, clen, &b);
            FUZZ_CHECK(a.count == b.count && a.entry_error == b.entry_error);
            for (size_t i = 0; i < a.count; i++) {
                FUZZ_CHECK(a.replies[i].result.error ==
                           b.replies[i].result.error);
                FUZZ_CHECK(a.replies[i].result.id == b.replies[i].result.id);
                FUZZ_CHECK(a.replies[i].cached == b.replies[i].cached);
            }
            fz_fsm_check(f);
        }
        ida_free(cmds);
        ida_fsm_free(g);
    }
    ida_free(buf);
    ida_fsm_free(f);
    return 0;
}
