/* libidalloc: the calls that are not pool operations: list, node status,
 * membership, leader transfer, and id formatting. Each is a blocking call
 * (ida__client_call(), src/client/call.c). */
#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "src/client/client.h"

/* Run @req (a read, or a membership change: neither is a session write)
 * and check its answer: 0 with *out set to the response (caller frees), or
 * the error with its detail in @call (may be NULL); a result of another
 * kind than @want is IDA_EPROTO. The state of @call is left as it was. */
static int run(struct idalloc_client *c,
               Idalloc__ClientRequest *req,
               Idalloc__CommandResult__ResultCase want,
               struct idalloc_call *call,
               Idalloc__ClientResponse **out)
{
    struct idalloc_call local;
    if (call == NULL) {
        idalloc_call_init(&local);
        call = &local;
    }
    if (call->state == IDALLOC_CALL_IN_FLIGHT) {
        return IDA_EINVAL; /* another call holds it */
    }
    call->errmsg[0] = '\0';
    Idalloc__ClientResponse *r = NULL;
    int rv = ida__client_call(c, req, 0, call, &r);
    if (rv == 0) {
        Idalloc__CommandResult *res = r->result;
        if (res->error != 0) {
            rv = (int)res->error;
            ida__call_error(call, "%s",
                            res->error_msg[0] != '\0' ? res->error_msg
                                                      : idalloc_strerror(rv));
        } else if (res->result_case != want) {
            rv = IDA_EPROTO;
            ida__call_error(call,
                            "the server answered with another result kind");
        }
        if (rv != 0) {
            idalloc__client_response__free_unpacked(r, NULL);
        }
    }
    call->error = rv;
    if (rv == 0) {
        *out = r;
    }
    return rv;
}

static int bad_args(struct idalloc_call *call, const char *what)
{
    ida__call_error(call, "%s", what);
    if (call != NULL) {
        call->error = IDA_EINVAL;
    }
    return IDA_EINVAL;
}

/* A pool name as the cluster takes it (ops.c refuses bad ones with the
 * rule; here the cluster's answer names it). */
static int check_pool(struct idalloc_call *call, const char *pool)
{
    int ok = ida__client_pool_name_ok(pool);
    if (ok) {
        return 0;
    }
    ida__call_error(call,
                    "list: pool name must be 1-%d characters of A-Za-z0-9._:-",
                    IDA_CLIENT_POOL_NAME_MAX);
    if (call != NULL) {
        call->error = IDA_EINVAL;
    }
    return IDA_EINVAL;
}

#define REQUEST(var) Idalloc__ClientRequest var = IDALLOC__CLIENT_REQUEST__INIT

/* A C string as the bytes of a request field (proto `bytes`). */
static ProtobufCBinaryData bin(const char *s)
{
    return (ProtobufCBinaryData){strlen(s), (uint8_t *)s};
}

void idalloc_holdings_free(struct idalloc_holding *h, size_t count)
{
    for (size_t i = 0; h != NULL && i < count; i++) {
        ida_free(h[i].tag);
    }
    ida_free(h);
}

static int copy_holdings(const Idalloc__ListResult *l,
                         struct idalloc_holding **out,
                         size_t *count)
{
    struct idalloc_holding *h =
        ida_calloc(l->n_holdings > 0 ? l->n_holdings : 1, sizeof(*h));
    if (h == NULL) {
        return IDA_ENOMEM;
    }
    for (size_t i = 0; i < l->n_holdings; i++) {
        h[i].id = l->holdings[i]->id;
        h[i].tag =
            ida_strndup(l->holdings[i]->tag, strlen(l->holdings[i]->tag));
        if (h[i].tag == NULL) {
            idalloc_holdings_free(h, i);
            return IDA_ENOMEM;
        }
    }
    *out = h;
    *count = l->n_holdings;
    return 0;
}

int idalloc_list(struct idalloc_client *c,
                 const char *pool,
                 int has_after,
                 uint64_t after_id,
                 uint32_t limit,
                 struct idalloc_holding **out,
                 size_t *count,
                 int *more,
                 struct idalloc_call *call)
{
    if (pool == NULL || out == NULL || count == NULL) {
        return bad_args(call, "list: pool, out and count are needed");
    }
    int bad = check_pool(call, pool);
    if (bad != 0) {
        return bad;
    }
    REQUEST(req);
    Idalloc__List op = IDALLOC__LIST__INIT;
    op.pool = bin(pool);
    op.has_after = has_after != 0;
    op.after_id = after_id;
    op.limit = limit;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_LIST;
    req.list = &op;
    Idalloc__ClientResponse *r;
    int rv = run(c, &req, IDALLOC__COMMAND_RESULT__RESULT_LIST, call, &r);
    if (rv == 0) {
        rv = copy_holdings(r->result->list, out, count);
        if (more != NULL) {
            *more = r->result->list->more;
        }
        idalloc__client_response__free_unpacked(r, NULL);
    }
    return rv;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

int idalloc_node_status(struct idalloc_client *c,
                        size_t i,
                        struct idalloc_node_status *out,
                        struct idalloc_call *call)
{
    if (i >= c->nconns || out == NULL) {
        return bad_args(call, "status: no such node");
    }
    memset(out, 0, sizeof(*out));
    copy_str(out->address, sizeof(out->address), c->conns[i].addr.text);
    REQUEST(req);
    Idalloc__Status op = IDALLOC__STATUS__INIT;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_STATUS;
    req.status = &op;
    Idalloc__ClientResponse *r;
    int rv = ida__client_call_node(c, i, &req, &r);
    if (rv != 0) {
        ida__call_error(call, "%s: %s", c->conns[i].addr.text,
                        idalloc_strerror(rv));
        return rv;
    }
    ida__client_learn_members(c, r); /* status lists every member */
    const Idalloc__CommandResult *res = r->result;
    if (res == NULL || res->error != 0 ||
        res->result_case != IDALLOC__COMMAND_RESULT__RESULT_STATUS) {
        rv = res != NULL && res->error != 0 ? (int)res->error : IDA_EPROTO;
    } else {
        const Idalloc__NodeStatus *s = res->status;
        out->node_id = s->node_id;
        copy_str(out->role, sizeof(out->role), s->role);
        out->term = s->term;
        out->leader_id = s->leader_id;
        out->commit_index = s->commit_index;
        out->applied_index = s->applied_index;
        out->log_first_index = s->log_first_index;
        out->log_last_index = s->log_last_index;
        out->snapshot_index = s->snapshot_index;
        out->snapshot_term = s->snapshot_term;
        for (size_t k = 0;
             k < s->n_peers && out->n_peers < IDALLOC_STATUS_PEERS_MAX; k++) {
            const Idalloc__PeerProgress *pp = s->peers[k];
            size_t j = out->n_peers++;
            out->peers[j].node_id = pp->node_id;
            out->peers[j].match_index = pp->match_index;
            out->peers[j].next_index = pp->next_index;
            copy_str(out->peers[j].state, sizeof(out->peers[j].state),
                     pp->state);
            out->peers[j].connected = pp->connected;
        }
        for (size_t k = 0;
             k < s->n_top_errors && out->n_errors < IDALLOC_STATUS_ERRORS_MAX;
             k++) {
            const Idalloc__ErrorCount *e = s->top_errors[k];
            size_t j = out->n_errors++;
            out->errors[j].code = (int)e->code;
            copy_str(out->errors[j].text, sizeof(out->errors[j].text), e->text);
            out->errors[j].count = e->count;
            out->errors[j].last_seen_unix_ms = e->last_seen_unix_ms;
        }
    }
    idalloc__client_response__free_unpacked(r, NULL);
    return rv;
}

int idalloc_member_list(struct idalloc_client *c,
                        struct idalloc_member_list *out,
                        struct idalloc_call *call)
{
    if (out == NULL) {
        return bad_args(call, "member list: out is needed");
    }
    memset(out, 0, sizeof(*out));
    REQUEST(req);
    Idalloc__MemberList op = IDALLOC__MEMBER_LIST__INIT;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_MEMBER_LIST;
    req.member_list = &op;
    Idalloc__ClientResponse *r;
    int rv =
        run(c, &req, IDALLOC__COMMAND_RESULT__RESULT_MEMBER_LIST, call, &r);
    if (rv != 0) {
        return rv;
    }
    const Idalloc__MemberListResult *ml = r->result->member_list;
    out->leader_id = ml->leader_id;
    out->commit_index = ml->commit_index;
    for (size_t k = 0; k < ml->n_members && out->n < IDALLOC_MEMBERS_MAX; k++) {
        const Idalloc__MemberInfo *mi = ml->members[k];
        struct idalloc_member *m = &out->members[out->n++];
        m->id = mi->id;
        m->incarnation = mi->incarnation;
        copy_str(m->peer_addr, sizeof(m->peer_addr), mi->peer_addr);
        copy_str(m->client_addr, sizeof(m->client_addr), mi->client_addr);
        m->voter = mi->voter;
        m->waiting = mi->waiting;
        m->match_index = mi->match_index;
        m->connected = mi->connected;
    }
    idalloc__client_response__free_unpacked(r, NULL);
    return 0;
}

/* A member change with addresses (NULL: none). */
static int member_change(struct idalloc_client *c,
                         enum idalloc_member_op op,
                         unsigned id,
                         const char *peer_addr,
                         const char *client_addr,
                         int *changed,
                         struct idalloc_call *call)
{
    REQUEST(req);
    Idalloc__MemberChange mc = IDALLOC__MEMBER_CHANGE__INIT;
    mc.op = (Idalloc__MemberChange__Op)op;
    mc.id = id;
    if (peer_addr != NULL) {
        mc.peer_addr = (char *)peer_addr;
        mc.client_addr = (char *)client_addr;
    }
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_MEMBER_CHANGE;
    req.member_change = &mc;
    Idalloc__ClientResponse *r;
    int rv =
        run(c, &req, IDALLOC__COMMAND_RESULT__RESULT_MEMBER_CHANGE, call, &r);
    if (rv == 0) {
        if (changed != NULL) {
            *changed = r->result->member_change->changed;
        }
        idalloc__client_response__free_unpacked(r, NULL);
    }
    return rv;
}

int idalloc_member_change(struct idalloc_client *c,
                          enum idalloc_member_op op,
                          unsigned id,
                          int *changed,
                          struct idalloc_call *call)
{
    if (op < IDALLOC_MEMBER_REMOVE || op > IDALLOC_MEMBER_PROMOTE || id == 0) {
        return bad_args(call,
                        "member change: a known operation and a node id "
                        "are needed (member update needs addresses)");
    }
    return member_change(c, op, id, NULL, NULL, changed, call);
}

/* An address a node can be dialled at, into @a. */
static int dial_addr(const char *s, struct ida_addr *a)
{
    return s != NULL && ida_addr_parse(s, a) == 0 && !ida_addr_unspecified(a)
               ? 0
               : IDA_EINVAL;
}

int idalloc_member_change_addrs(struct idalloc_client *c,
                                enum idalloc_member_op op,
                                unsigned id,
                                const char *peer_addr,
                                const char *client_addr,
                                int *changed,
                                struct idalloc_call *call)
{
    struct ida_addr peer, client;
    if ((op != IDALLOC_MEMBER_ADD && op != IDALLOC_MEMBER_UPDATE) || id == 0) {
        return bad_args(call,
                        "member change with addresses: add or update, and "
                        "a node id");
    }
    char why[160];
    if (dial_addr(peer_addr, &peer) != 0 ||
        dial_addr(client_addr, &client) != 0) {
        const char *bad =
            dial_addr(peer_addr, &peer) != 0 ? peer_addr : client_addr;
        snprintf(why, sizeof(why),
                 "bad address \"%.64s\": expected IPv4:PORT or [IPv6]:PORT "
                 "that other nodes can dial (not 0.0.0.0 or ::)",
                 bad != NULL ? bad : "");
        return bad_args(call, why);
    }
    if (strcmp(peer.host, client.host) == 0 && peer.port == client.port) {
        snprintf(why, sizeof(why),
                 "the peer and the client address are the same (%s)",
                 peer.text);
        return bad_args(call, why);
    }
    return member_change(c, op, id, peer_addr, client_addr, changed, call);
}

int idalloc_leader_transfer(struct idalloc_client *c,
                            unsigned to,
                            unsigned *leader,
                            struct idalloc_call *call)
{
    REQUEST(req);
    Idalloc__LeaderTransfer lt = IDALLOC__LEADER_TRANSFER__INIT;
    lt.to = to;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_LEADER_TRANSFER;
    req.leader_transfer = &lt;
    Idalloc__ClientResponse *r;
    int rv =
        run(c, &req, IDALLOC__COMMAND_RESULT__RESULT_LEADER_TRANSFER, call, &r);
    if (rv == 0) {
        if (leader != NULL) {
            *leader = r->result->leader_transfer->leader_id;
        }
        idalloc__client_response__free_unpacked(r, NULL);
    }
    return rv;
}

void idalloc_format_hex(uint64_t id, char *buf)
{
    static const char digits[] = "0123456789abcdef";
    int pos = 0;
    for (int group = 3; group >= 0; group--) {
        for (int d = 3; d >= 0; d--) {
            buf[pos++] = digits[(id >> (group * 16 + d * 4)) & 0xf];
        }
        if (group > 0) {
            buf[pos++] = '-';
        }
    }
    buf[pos] = '\0';
}

int idalloc_parse_hex(const char *s, uint64_t *id)
{
    if (s == NULL || strlen(s) != IDALLOC_HEX_ID_LEN) {
        return IDA_EINVAL;
    }
    uint64_t v = 0;
    for (int i = 0; i < IDALLOC_HEX_ID_LEN; i++) {
        char ch = s[i];
        if (i % 5 == 4) {
            if (ch != '-') {
                return IDA_EINVAL;
            }
            continue;
        }
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                         : -1;
        if (d < 0) {
            return IDA_EINVAL;
        }
        v = (v << 4) | (uint64_t)d;
    }
    *id = v;
    return 0;
}
