/* Support code of the fuzz harnesses: tests/fuzz/fuzzsupport.h. */
#include "tests/fuzz/fuzzsupport.h"

#include <string.h>

#include "base/heap.h"
#include "tests/fuzz/fuzz.h"

size_t fz_batch_pack(Idalloc__Command **cmds,
                     size_t n,
                     uint64_t timestamp_ms,
                     uint8_t **out)
{
    Idalloc__CommandBatch b = IDALLOC__COMMAND_BATCH__INIT;
    b.version = IDA_BATCH_VERSION;
    b.timestamp_ms = timestamp_ms;
    b.commands = cmds;
    b.n_commands = n;
    size_t len = idalloc__command_batch__get_packed_size(&b);
    *out = ida_malloc(len + 1);
    FUZZ_CHECK(*out != NULL);
    idalloc__command_batch__pack(&b, *out);
    return len;
}

void fz_apply(struct ida_fsm *f,
              const uint8_t *data,
              size_t len,
              struct ida_fsm_applied *out)
{
    ida_index next = ida_fsm_applied_index(f) + 1;
    FUZZ_CHECK(ida_fsm_apply(f, next, IDA_ENTRY_NORMAL, data, len, out) == 0);
    FUZZ_CHECK(ida_fsm_applied_index(f) == next);
}

static void set_bytes(ProtobufCBinaryData *b, const char *s)
{
    b->data = (uint8_t *)s;
    b->len = strlen(s);
}

void fz_fsm_populate(struct ida_fsm *f)
{
    static const char *const tags[] = {"alice", "bob", "carol",
                                       "\xc3\xa9t\xc3\xa9"};
    enum { N = 14 };
    Idalloc__Command cmd[N], *ptr[N];
    Idalloc__RegisterClient reg;
    idalloc__register_client__init(&reg);
    Idalloc__PoolCreate pc[3];
    Idalloc__Alloc al[4];
    Idalloc__Reserve rs;
    Idalloc__PrefixAlloc pa[2];
    uint8_t cid[2][IDA_CLIENT_ID_BYTES];
    memset(cid, 0, sizeof(cid));
    cid[0][15] = 1;
    cid[1][15] = 2;
    size_t n = 0;
    /* Both clients register first: a write without a session never runs
     * (fsm/fsm.h, "Sessions"). */
    for (int i = 0; i < 2; i++, n++) {
        idalloc__command__init(&cmd[n]);
        cmd[n].op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
        cmd[n].register_client = &reg;
    }
    static const char *const names[] = {"b", "s", "p"};
    static const Idalloc__PoolKind kinds[] = {
        IDALLOC__POOL_KIND__POOL_KIND_BOUNDED,
        IDALLOC__POOL_KIND__POOL_KIND_SEQUENCE,
        IDALLOC__POOL_KIND__POOL_KIND_PREFIX};
    for (int i = 0; i < 3; i++, n++) {
        idalloc__command__init(&cmd[n]);
        idalloc__pool_create__init(&pc[i]);
        set_bytes(&pc[i].name, names[i]);
        pc[i].kind = kinds[i];
        pc[i].size = i == 0 ? 100 : 0;
        cmd[n].op_case = IDALLOC__COMMAND__OP_POOL_CREATE;
        cmd[n].pool_create = &pc[i];
    }
    for (int i = 0; i < 4; i++, n++) {
        idalloc__command__init(&cmd[n]);
        idalloc__alloc__init(&al[i]);
        set_bytes(&al[i].pool, "b");
        set_bytes(&al[i].tag, tags[i]);
        cmd[n].op_case = IDALLOC__COMMAND__OP_ALLOC;
        cmd[n].alloc = &al[i];
    }
    idalloc__command__init(&cmd[n]);
    idalloc__reserve__init(&rs);
    set_bytes(&rs.pool, "s");
    rs.count = 1000;
    cmd[n].op_case = IDALLOC__COMMAND__OP_RESERVE;
    cmd[n++].reserve = &rs;
    for (int i = 0; i < 2; i++, n++) {
        idalloc__command__init(&cmd[n]);
        idalloc__prefix_alloc__init(&pa[i]);
        set_bytes(&pa[i].pool, "p");
        set_bytes(&pa[i].tag, tags[i]);
        cmd[n].op_case = IDALLOC__COMMAND__OP_PREFIX_ALLOC;
        cmd[n].prefix_alloc = &pa[i];
    }
    for (size_t i = 0; i < n; i++) {
        cmd[i].client_id.data = cid[i % 2];
        cmd[i].client_id.len = IDA_CLIENT_ID_BYTES;
        cmd[i].request_seq = 1 + i;
        ptr[i] = &cmd[i];
    }
    uint8_t *buf;
    size_t len = fz_batch_pack(ptr, n, 1000, &buf);
    struct ida_fsm_applied a;
    fz_apply(f, buf, len, &a);
    FUZZ_CHECK(a.entry_error == 0 && a.count == n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(a.replies[i].result.error == 0);
    }
    ida_free(buf);
}

void fz_fsm_check(const struct ida_fsm *f)
{
    uint8_t *s1, *s2;
    size_t l1, l2;
    FUZZ_CHECK(ida_fsm_snapshot(f, &s1, &l1) == 0);
    struct ida_fsm *g;
    FUZZ_CHECK(ida_fsm_new(&g) == 0);
    FUZZ_CHECK(ida_fsm_restore(g, s1, l1) == 0);
    FUZZ_CHECK(ida_fsm_snapshot(g, &s2, &l2) == 0);
    FUZZ_CHECK(l1 == l2 && memcmp(s1, s2, l1) == 0);
    FUZZ_CHECK(ida_fsm_applied_index(g) == ida_fsm_applied_index(f));
    FUZZ_CHECK(ida_fsm_pool_count(g) == ida_fsm_pool_count(f));
    FUZZ_CHECK(ida_fsm_session_count(g) == ida_fsm_session_count(f));
    FUZZ_CHECK(ida_fsm_session_count(f) <= IDA_SESSIONS_MAX);
    ida_free(s1);
    ida_free(s2);
    ida_fsm_free(g);
}
