/* idallocd --join: learning a running cluster from its client port.
 * Contract: ida_node_join() in src/node/node.h; what joining means:
 * src/node/member.h. */
#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "base/log.h"
#include "idalloc.h"
#include "idalloc_errors.h"
#include "src/node/node.h"

/* A client of @addrs speaking TLS as this node when the client port wants
 * it (client_tls on or required: a node certificate is a certificate of
 * the cluster CA, which `required` admits). */
static int join_client(const struct ida_node *n,
                       const char *addrs,
                       struct idalloc_client **out,
                       char *errmsg)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = addrs;
    o.attempt_timeout_ms = 1000;
    o.call_timeout_ms = 3000;
    char ca[IDA_PATH_MAX + 16], crt[IDA_PATH_MAX + 32], key[IDA_PATH_MAX + 32];
    if (n->cfg.client_tls != IDA_CLIENT_TLS_OFF) {
        snprintf(ca, sizeof(ca), "%s/ca.crt", n->cfg.tls_dir);
        snprintf(crt, sizeof(crt), "%s/node%u.crt", n->cfg.tls_dir,
                 n->self->id);
        snprintf(key, sizeof(key), "%s/node%u.key", n->cfg.tls_dir,
                 n->self->id);
        o.tls_ca_file = ca;
        o.tls_cert_file = crt;
        o.tls_key_file = key;
    }
    char cerr[IDALLOC_ERRMSG_MAX] = "";
    int rv = idalloc_client_new(&o, out, cerr);
    if (rv != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "--join %.200s: %.280s", addrs,
                 cerr[0] != '\0' ? cerr : idalloc_strerror(rv));
        return rv == IDA_ECONFIG ? IDA_EINVAL : rv;
    }
    return 0;
}

/* The members of @l (not the waiting nodes) into @b, then the cluster
 * file's other nodes; refuses a member at one of this node's addresses. */
static int take_members(struct ida_node *n,
                        const struct idalloc_member_list *l,
                        struct node_book *b,
                        char *errmsg)
{
    memset(b, 0, sizeof(*b));
    for (size_t i = 0; i < l->n; i++) {
        const struct idalloc_member *m = &l->members[i];
        struct ida_addr peer, client;
        if (m->waiting || ida_addr_parse(m->peer_addr, &peer) != 0 ||
            ida_addr_parse(m->client_addr, &client) != 0) {
            continue;
        }
        if (m->id == n->self->id) {
            /* This id is a member already: a replaced disk. The leader
             * re-admits the new incarnation (auto_rejoin) or the operator
             * does (README, Runbook). */
            IDA_INFO(
                "join: node %u is a member (incarnation %016llx, peer %s "
                "client %s); this data directory is a new incarnation",
                m->id, (unsigned long long)m->incarnation, m->peer_addr,
                m->client_addr);
        } else {
            const struct ida_addr *mine[2] = {&n->self->peer, &n->self->client};
            for (int j = 0; j < 2; j++) {
                if (node_addr_same(mine[j], &peer) ||
                    node_addr_same(mine[j], &client)) {
                    snprintf(errmsg, IDA_ERRMSG_MAX,
                             "--join: this node's address %s is member "
                             "%u's; give this node addresses of its own",
                             mine[j]->text, m->id);
                    return IDA_EINVAL;
                }
            }
        }
        node_book_set(b, m->id, true, &peer, &client);
    }
    node_book_add_file(b, &n->cfg);
    return 0;
}

int ida_node_join(struct ida_node *n, const char *addrs, char *errmsg)
{
    struct idalloc_client *c;
    int rv = join_client(n, addrs, &c, errmsg);
    if (rv != 0) {
        return rv;
    }
    struct idalloc_member_list *l = ida_malloc(sizeof(*l));
    struct node_book *b = ida_malloc(sizeof(*b));
    struct idalloc_call call;
    idalloc_call_init(&call);
    rv = l == NULL || b == NULL ? IDA_ENOMEM : idalloc_member_list(c, l, &call);
    idalloc_client_free(c);
    if (rv != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "--join %.200s: no member list from the cluster: %s%s%.200s",
                 addrs, idalloc_strerror(rv), call.errmsg[0] ? ": " : "",
                 call.errmsg);
    } else {
        rv = take_members(n, l, b, errmsg);
    }
    if (rv == 0) {
        n->join_book = *b;
        n->has_join_book = 1;
        size_t members = 0;
        for (size_t i = 0; i < b->n; i++) {
            members += b->e[i].member;
        }
        IDA_INFO(
            "join: cluster %s answered through %s: leader node %u, %zu "
            "members; waiting to be added (idalloc member add %u %s %s)",
            n->cfg.cluster, addrs, l->leader_id, members, n->self->id,
            n->self->peer.text, n->self->client.text);
    }
    ida_free(l);
    ida_free(b);
    return rv;
}
