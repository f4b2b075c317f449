/* Cluster membership encoding. Contract: raft/conf.h. */
#include "raft/conf.h"

#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"

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

int ida_raft_conf_slot(const struct ida_raft_conf *c, ida_node_id id)
{
    for (size_t i = 0; i < c->n; i++) {
        if (c->voters[i] == id) {
            return (int)i;
        }
    }
    return -1;
}

int ida_raft_conf_learner_slot(const struct ida_raft_conf *c, ida_node_id id)
{
    for (size_t i = 0; i < c->n_learners; i++) {
        if (c->learners[i] == id) {
            return (int)i;
        }
    }
    return -1;
}

int ida_raft_conf_decode(const uint8_t *data,
                         size_t len,
                         struct ida_raft_conf *out)
{
    Idalloc__ClusterConfig *cc =
        idalloc__cluster_config__unpack(&pb_allocator, len, data);
    if (cc == NULL) {
        /* protobuf-c does not tell malformed input from a failed
         * allocation; input is the likely cause. */
        return IDA_EPROTO;
    }
    struct ida_raft_conf c = {.n = 0};
    int rv = 0;
    for (size_t i = 0; i < cc->n_members && rv == 0; i++) {
        const Idalloc__Member *m = cc->members[i];
        if (m->id == 0 || ida_raft_conf_slot(&c, m->id) >= 0 ||
            ida_raft_conf_learner_slot(&c, m->id) >= 0) {
            rv = IDA_EPROTO;
        } else if (m->voter && c.n < IDA_RAFT_NODES_MAX) {
            c.voters[c.n++] = m->id;
        } else if (!m->voter && c.n_learners < IDA_RAFT_NODES_MAX) {
            c.learners[c.n_learners++] = m->id;
        } else {
            rv = IDA_EPROTO;
        }
    }
    idalloc__cluster_config__free_unpacked(cc, &pb_allocator);
    if (rv == 0 && c.n == 0) {
        rv = IDA_EPROTO;
    }
    if (rv == 0) {
        *out = c;
    }
    return rv;
}

int ida_raft_conf_encode(const struct ida_raft_conf *c,
                         uint8_t *buf,
                         size_t cap,
                         size_t *len)
{
    Idalloc__Member ms[2 * IDA_RAFT_NODES_MAX];
    Idalloc__Member *mp[2 * IDA_RAFT_NODES_MAX];
    Idalloc__ClusterConfig cc = IDALLOC__CLUSTER_CONFIG__INIT;
    size_t k = 0;
    for (size_t i = 0; i < c->n && i < IDA_RAFT_NODES_MAX; i++, k++) {
        idalloc__member__init(&ms[k]);
        ms[k].id = c->voters[i];
        ms[k].voter = 1;
        mp[k] = &ms[k];
    }
    for (size_t i = 0; i < c->n_learners && i < IDA_RAFT_NODES_MAX; i++, k++) {
        idalloc__member__init(&ms[k]);
        ms[k].id = c->learners[i];
        ms[k].voter = 0;
        mp[k] = &ms[k];
    }
    cc.n_members = k;
    cc.members = mp;
    size_t need = idalloc__cluster_config__get_packed_size(&cc);
    if (need > cap) {
        return IDA_ETOOBIG;
    }
    *len = idalloc__cluster_config__pack(&cc, buf);
    return 0;
}

int ida_raft_conf_one_change(const struct ida_raft_conf *a,
                             const struct ida_raft_conf *b)
{
    size_t only_a = 0, only_b = 0;
    for (size_t i = 0; i < a->n; i++) {
        only_a += ida_raft_conf_slot(b, a->voters[i]) < 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        only_b += ida_raft_conf_slot(a, b->voters[i]) < 0;
    }
    if (only_a + only_b == 1) {
        return 1;
    }
    if (only_a + only_b > 1) {
        return 0;
    }
    /* Same voters: a change only if the learners differ. */
    if (a->n_learners != b->n_learners) {
        return 1;
    }
    for (size_t i = 0; i < b->n_learners; i++) {
        if (ida_raft_conf_learner_slot(a, b->learners[i]) < 0) {
            return 1;
        }
    }
    return 0;
}
