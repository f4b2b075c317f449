/* The address book. Contract: src/node/book.h. */
#include "src/node/book.h"

#include <arpa/inet.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"

bool node_addr_same(const struct ida_addr *a, const struct ida_addr *b)
{
    unsigned char x[16], y[16];
    if (a->family != b->family || a->port != b->port || a->family == 0) {
        return false;
    }
    if (inet_pton(a->family, a->host, x) != 1 ||
        inet_pton(b->family, b->host, y) != 1) {
        return strcmp(a->host, b->host) == 0;
    }
    return memcmp(x, y, a->family == AF_INET ? 4 : 16) == 0;
}

const struct node_book_entry *node_book_find(const struct node_book *b,
                                             ida_node_id id)
{
    for (size_t i = 0; i < b->n; i++) {
        if (b->e[i].id == id) {
            return &b->e[i];
        }
    }
    return NULL;
}

int node_book_set(struct node_book *b,
                  ida_node_id id,
                  bool member,
                  const struct ida_addr *peer,
                  const struct ida_addr *client)
{
    struct node_book_entry *e = (struct node_book_entry *)node_book_find(b, id);
    if (e == NULL) {
        if (b->n == NODE_BOOK_MAX) {
            return IDA_ELIMIT;
        }
        e = &b->e[b->n++];
    }
    e->id = id;
    e->member = member;
    e->peer = *peer;
    e->client = *client;
    return 0;
}

ida_node_id node_book_addr_user(const struct node_book *b,
                                const struct ida_addr *a,
                                ida_node_id except)
{
    for (size_t i = 0; i < b->n; i++) {
        const struct node_book_entry *e = &b->e[i];
        if (e->member && e->id != except &&
            (node_addr_same(&e->peer, a) || node_addr_same(&e->client, a))) {
            return e->id;
        }
    }
    return 0;
}

bool node_book_equal(const struct node_book *a, const struct node_book *b)
{
    if (a->n != b->n) {
        return false;
    }
    for (size_t i = 0; i < a->n; i++) {
        const struct node_book_entry *x = &a->e[i], *y = &b->e[i];
        if (x->id != y->id || x->member != y->member ||
            strcmp(x->peer.text, y->peer.text) != 0 ||
            strcmp(x->client.text, y->client.text) != 0) {
            return false;
        }
    }
    return true;
}

static void *pb_alloc(void *data, size_t size)
{
    (void)data;
    return ida_malloc(size);
}

static void pb_free(void *data, void *p)
{
    (void)data;
    ida_free(p);
}

static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* The members of the encoded membership @conf with their addresses (or
 * their file lines'). */
static int add_members(struct node_book *b,
                       const uint8_t *conf,
                       size_t len,
                       const struct ida_config *file)
{
    Idalloc__ClusterConfig *cc =
        idalloc__cluster_config__unpack(&pb_allocator, len, conf);
    if (cc == NULL) {
        return IDA_EPROTO;
    }
    for (size_t i = 0; i < cc->n_members && b->n < NODE_BOOK_MAX; i++) {
        const Idalloc__Member *m = cc->members[i];
        const struct ida_config_node *f = ida_config_node(file, m->id);
        struct ida_addr peer, client;
        if (m->id == 0 || node_book_find(b, m->id) != NULL) {
            continue; /* the core refuses such a membership anyway */
        }
        if (ida_addr_parse(m->peer_addr, &peer) != 0 ||
            ida_addr_parse(m->client_addr, &client) != 0) {
            if (f == NULL) {
                continue; /* nowhere to dial */
            }
            peer = f->peer;
            client = f->client;
        }
        node_book_set(b, m->id, true, &peer, &client);
    }
    idalloc__cluster_config__free_unpacked(cc, &pb_allocator);
    return 0;
}

int node_book_build(struct node_book *b,
                    const uint8_t *conf,
                    size_t len,
                    const struct ida_config *file)
{
    memset(b, 0, sizeof(*b));
    int rv = conf != NULL ? add_members(b, conf, len, file) : 0;
    if (rv != 0) {
        b->n = 0;
    }
    node_book_add_file(b, file);
    return rv;
}

void node_book_add_file(struct node_book *b, const struct ida_config *file)
{
    size_t before = b->n;
    for (unsigned i = 0; i < file->node_count && b->n < NODE_BOOK_MAX; i++) {
        const struct ida_config_node *f = &file->nodes[i];
        bool taken = false;
        for (size_t k = 0; k < before && !taken; k++) {
            taken =
                b->e[k].id == f->id || node_addr_same(&b->e[k].peer, &f->peer);
        }
        if (!taken) {
            node_book_set(b, f->id, false, &f->peer, &f->client);
        }
    }
}
