/* Fuzz client request handling from the bytes of a request to the state it
 * changes: decode a ClientRequest (as net does), check it at the door
 * (node_request_check(), as raft does), turn writes into log commands
 * (node_request_to_command()), group them into batches, apply them to a
 * real state machine and a replica, and serve reads from it.
 *
 * Input: records of [flags u8][length u16][ClientRequest bytes]. flags bit
 * 0 closes the batch after the request, bit 1 sends it around the door
 * (a forged log entry: the state machine must refuse bad names itself),
 * bits 2-4 move the batch clock forward.
 *
 * Checked after every batch: both replicas answer byte for byte the same;
 * nothing the door refuses reaches the log, and what it lets through is
 * never refused by the state machine for its name or tag; a successful
 * alloc hands out an id no other tag holds and that lookup finds; reserved
 * blocks of a pool never overlap; no prefix handed out is a prefix of
 * another of its pool; no tag that holds something has a NUL byte. At the
 * end the snapshot of each replica restores to the same bytes and both
 * replicas' snapshots are equal. */
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzzsupport.h"

#define BATCH_MAX   64
#define POOLS_MAX   16
#define PREFIX_KEEP 256

struct model
{
    char seq_pool[POOLS_MAX][IDA_POOL_NAME_MAX + 1];
    uint64_t seq_end[POOLS_MAX];
    size_t n_seq;
    char pfx_pool[POOLS_MAX][IDA_POOL_NAME_MAX + 1];
    uint8_t pfx[POOLS_MAX][PREFIX_KEEP][IDA_PREFIX_BYTES_MAX];
    uint8_t pfx_len[POOLS_MAX][PREFIX_KEEP];
    size_t n_pfx[POOLS_MAX];
    size_t n_pfx_pools;
};

static struct model M;

static size_t slot(char (*names)[IDA_POOL_NAME_MAX + 1],
                   size_t *n,
                   const ProtobufCBinaryData *name)
{
    char s[IDA_POOL_NAME_MAX + 1];
    const char *why;
    FUZZ_CHECK(ida_fsm_pool_name_get(name, s, &why) == 0);
    for (size_t i = 0; i < *n; i++) {
        if (strcmp(names[i], s) == 0) {
            return i;
        }
    }
    if (*n == POOLS_MAX) {
        return POOLS_MAX;
    }
    strcpy(names[*n], s);
    return (*n)++;
}

static int is_prefix(const uint8_t *a,
                     size_t alen,
                     const uint8_t *b,
                     size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    return memcmp(a, b, n) == 0;
}

/* Every holding of bounded pool @pool: ids increase, each tag is valid and
 * lookup finds its id (one tag, one id). */
static void check_bounded(const struct ida_fsm *f, const char *pool)
{
    static struct ida_fsm_holding h[IDA_LIST_LIMIT_MAX];
    bool has_after = false, more = true;
    uint64_t after = 0;
    for (int pages = 0; more && pages < 8; pages++) {
        size_t n;
        if (ida_fsm_list(f, pool, has_after, after, 0, h, &n, &more) != 0) {
            return;
        }
        for (size_t i = 0; i < n; i++) {
            FUZZ_CHECK(!has_after || h[i].id > after);
            FUZZ_CHECK(ida_fsm_tag_valid(h[i].tag));
            uint64_t id;
            FUZZ_CHECK(ida_fsm_lookup(f, pool, h[i].tag, &id) == 0);
            FUZZ_CHECK(id == h[i].id);
            after = h[i].id;
            has_after = true;
        }
        if (n == 0) {
            break;
        }
    }
}

static void check_reply(const struct ida_fsm *f,
                        const Idalloc__Command *c,
                        const struct ida_fsm_reply *r,
                        bool door)
{
    const struct ida_fsm_result *res = &r->result;
    if (door && res->error != 0 && !r->cached) {
        /* The door and the state machine agree on names and tags (a cached
         * answer may be another command's: a reused request id). */
        FUZZ_CHECK(strcmp(res->error_msg, "tag holds a NUL byte") != 0);
        FUZZ_CHECK(strcmp(res->error_msg, "tag is not valid UTF-8") != 0);
        FUZZ_CHECK(strcmp(res->error_msg, "tag must not be empty") != 0);
        FUZZ_CHECK(strcmp(res->error_msg, "tag longer than 128 bytes") != 0);
        FUZZ_CHECK(strncmp(res->error_msg, "pool name must be", 17) != 0);
    }
    if (res->error != 0 || r->cached) {
        return;
    }
    char pool[IDA_POOL_NAME_MAX + 1];
    const char *why;
    switch (c->op_case) {
        case IDALLOC__COMMAND__OP_ALLOC: {
            FUZZ_CHECK(memchr(c->alloc->tag.data, 0, c->alloc->tag.len) ==
                       NULL);
            FUZZ_CHECK(ida_fsm_pool_name_get(&c->alloc->pool, pool, &why) == 0);
            check_bounded(f, pool);
            break;
        }
        case IDALLOC__COMMAND__OP_RESERVE: {
            size_t i = slot(M.seq_pool, &M.n_seq, &c->reserve->pool);
            FUZZ_CHECK(res->count == c->reserve->count && res->count >= 1);
            FUZZ_CHECK(res->id + res->count > res->id); /* no wrap */
            if (i < POOLS_MAX) {
                FUZZ_CHECK(res->id >= M.seq_end[i]); /* no overlap */
                M.seq_end[i] = res->id + res->count;
            }
            break;
        }
        case IDALLOC__COMMAND__OP_PREFIX_ALLOC: {
            FUZZ_CHECK(res->prefix_len >= 1 &&
                       res->prefix_len <= IDA_PREFIX_BYTES_MAX);
            FUZZ_CHECK(memchr(c->prefix_alloc->tag.data, 0,
                              c->prefix_alloc->tag.len) == NULL);
            if (res->flag) {
                break; /* the tag's old prefix */
            }
            size_t i = slot(M.pfx_pool, &M.n_pfx_pools, &c->prefix_alloc->pool);
            if (i == POOLS_MAX) {
                break;
            }
            for (size_t k = 0; k < M.n_pfx[i]; k++) {
                FUZZ_CHECK(!is_prefix(M.pfx[i][k], M.pfx_len[i][k], res->prefix,
                                      res->prefix_len));
            }
            if (M.n_pfx[i] < PREFIX_KEEP) {
                memcpy(M.pfx[i][M.n_pfx[i]], res->prefix, res->prefix_len);
                M.pfx_len[i][M.n_pfx[i]++] = res->prefix_len;
            }
            break;
        }
        default:
            break;
    }
}

struct pending_batch
{
    Idalloc__ClientRequest *req[BATCH_MAX];
    Idalloc__Command cmd[BATCH_MAX];
    Idalloc__Command *ptr[BATCH_MAX];
    bool door[BATCH_MAX];
    size_t n;
    uint64_t now;
};

static void flush(struct ida_fsm *a, struct ida_fsm *b, struct pending_batch *p)
{
    if (p->n == 0) {
        return;
    }
    uint8_t *buf;
    size_t len = fz_batch_pack(p->ptr, p->n, p->now, &buf);
    struct ida_fsm_applied ra, rb;
    fz_apply(a, buf, len, &ra);
    fz_apply(b, buf, len, &rb);
    FUZZ_CHECK(ra.entry_error == 0 && rb.entry_error == 0);
    FUZZ_CHECK(ra.count == p->n && rb.count == p->n);
    for (size_t i = 0; i < p->n; i++) {
        const struct ida_fsm_reply *x = &ra.replies[i], *y = &rb.replies[i];
        FUZZ_CHECK(x->request_seq == y->request_seq && x->cached == y->cached);
        FUZZ_CHECK(x->result.error == y->result.error);
        FUZZ_CHECK(strcmp(x->result.error_msg, y->result.error_msg) == 0);
        FUZZ_CHECK(x->result.id == y->result.id &&
                   x->result.count == y->result.count &&
                   x->result.flag == y->result.flag &&
                   x->result.prefix_len == y->result.prefix_len);
        FUZZ_CHECK(x->result.error != 0 || x->result.op != IDA_FSM_OP_NONE);
        check_reply(a, p->ptr[i], x, p->door[i]);
    }
    ida_free(buf);
    for (size_t i = 0; i < p->n; i++) {
        if (p->req[i] != NULL) { /* NULL: a registration of the harness */
            idalloc__client_request__free_unpacked(p->req[i], NULL);
        }
    }
    p->n = 0;
}

static bool is_write(Idalloc__ClientRequest__OpCase op)
{
    return op == IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE ||
           op == IDALLOC__CLIENT_REQUEST__OP_ALLOC ||
           op == IDALLOC__CLIENT_REQUEST__OP_FREE ||
           op == IDALLOC__CLIENT_REQUEST__OP_RESERVE ||
           op == IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC ||
           op == IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT ||
           op == IDALLOC__CLIENT_REQUEST__OP_RESTORE;
}

/* A read, served as the fsm processor does. */
static void serve_read(const struct ida_fsm *f, const Idalloc__ClientRequest *q)
{
    static struct ida_fsm_holding h[IDA_LIST_LIMIT_MAX];
    char pool[IDA_POOL_NAME_MAX + 1], tag[IDA_TAG_BYTES_MAX + 1];
    const char *why;
    uint64_t id;
    if (q->op_case == IDALLOC__CLIENT_REQUEST__OP_LOOKUP) {
        if (ida_fsm_pool_name_get(&q->lookup->pool, pool, &why) == 0 &&
            ida_fsm_tag_get(&q->lookup->tag, tag, &why) == 0) {
            int rv = ida_fsm_lookup(f, pool, tag, &id);
            FUZZ_CHECK(rv == 0 || rv == IDA_ENOPOOL || rv == IDA_EKIND ||
                       rv == IDA_ENOTFOUND);
        }
    } else if (q->op_case == IDALLOC__CLIENT_REQUEST__OP_LIST) {
        if (ida_fsm_pool_name_get(&q->list->pool, pool, &why) == 0) {
            size_t n;
            bool more;
            int rv =
                ida_fsm_list(f, pool, q->list->has_after, q->list->after_id,
                             q->list->limit, h, &n, &more);
            FUZZ_CHECK(rv != 0 || n <= IDA_LIST_LIMIT_MAX);
            for (size_t i = 0; rv == 0 && i < n; i++) {
                FUZZ_CHECK(!q->list->has_after || h[i].id > q->list->after_id);
                FUZZ_CHECK(i == 0 || h[i].id > h[i - 1].id);
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ida_fsm *a, *b;
    FUZZ_CHECK(ida_fsm_new(&a) == 0 && ida_fsm_new(&b) == 0);
    memset(&M, 0, sizeof(M));
    static struct pending_batch p;
    p.n = 0;
    p.now = 1000;
    struct fuzz_in in = {data, size};
    while (in.n > 0) {
        uint8_t flags = fuzz_u8(&in);
        size_t len;
        const uint8_t *msg = fuzz_bytes(&in, fuzz_u16(&in), &len);
        p.now += (uint64_t)((flags >> 2) & 7) * 600000; /* up to 70 min */
        Idalloc__ClientRequest *req =
            idalloc__client_request__unpack(NULL, len, msg);
        if (req == NULL) {
            continue;
        }
        const char *why = NULL;
        int door = node_request_check(req, &why);
        FUZZ_CHECK(door == 0 || door == IDA_EINVAL || door == IDA_ETOOBIG);
        FUZZ_CHECK(door == 0 || (why != NULL && why[0] != '\0'));
        bool forged = (flags & 2) != 0;
        if (!is_write(req->op_case) || (door != 0 && !forged)) {
            if (door == 0) {
                serve_read(a, req);
            }
            idalloc__client_request__free_unpacked(req, NULL);
            continue;
        }
        if (!(flags & 0x20) && p.n + 2 <= BATCH_MAX &&
            req->client_id.len == IDA_CLIENT_ID_BYTES) {
            /* Register the session first (as the library does before its
             * first write), unless the input says not to: writes of
             * unknown sessions are then refused, as they must be. */
            static Idalloc__RegisterClient rc = IDALLOC__REGISTER_CLIENT__INIT;
            idalloc__command__init(&p.cmd[p.n]);
            p.cmd[p.n].client_id = req->client_id;
            p.cmd[p.n].request_seq = 1;
            p.cmd[p.n].op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
            p.cmd[p.n].register_client = &rc;
            p.ptr[p.n] = &p.cmd[p.n];
            p.req[p.n] = NULL;
            p.door[p.n] = true;
            p.n++;
        }
        idalloc__command__init(&p.cmd[p.n]);
        node_request_to_command(req, &p.cmd[p.n]);
        p.ptr[p.n] = &p.cmd[p.n];
        p.req[p.n] = req;
        p.door[p.n] = door == 0;
        p.n++;
        if ((flags & 1) || p.n == BATCH_MAX) {
            flush(a, b, &p);
        }
    }
    flush(a, b, &p);
    fz_fsm_check(a);
    uint8_t *sa, *sb;
    size_t la, lb;
    FUZZ_CHECK(ida_fsm_snapshot(a, &sa, &la) == 0);
    FUZZ_CHECK(ida_fsm_snapshot(b, &sb, &lb) == 0);
    FUZZ_CHECK(la == lb && memcmp(sa, sb, la) == 0);
    ida_free(sa);
    ida_free(sb);
    ida_fsm_free(a);
    ida_fsm_free(b);
    return 0;
}
