#include "src/node/convert.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"

static int entries_to_pb(const struct ida_entry *e,
                         size_t n,
                         struct node_pb_peer *pb)
{
    if (n == 0) {
        return 0;
    }
    pb->entries = ida_calloc(n, sizeof(*pb->entries));
    pb->entry_ptrs = ida_calloc(n, sizeof(*pb->entry_ptrs));
    if (pb->entries == NULL || pb->entry_ptrs == NULL) {
        return IDA_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        Idalloc__LogEntry *le = &pb->entries[i];
        idalloc__log_entry__init(le);
        le->term = e[i].term;
        le->index = e[i].index;
        le->type = (Idalloc__EntryType)e[i].type;
        le->data.data = e[i].data;
        le->data.len = e[i].len;
        pb->entry_ptrs[i] = le;
    }
    pb->u.ae.entries = pb->entry_ptrs;
    pb->u.ae.n_entries = n;
    return 0;
}

int node_raft_to_pb(const struct ida_raft_msg *m, struct node_pb_peer *pb)
{
    memset(pb, 0, sizeof(*pb));
    idalloc__peer_message__init(&pb->msg);
    pb->msg.from = m->from;
    pb->msg.to = m->to;
    pb->msg.term = m->term;
    pb->msg.from_incarnation = m->from_inc;
    pb->msg.from_boot = m->from_boot;
    pb->msg.term_durable = m->term_durable;
    pb->msg.to_incarnation = m->to_inc;
    pb->msg.to_boot = m->to_boot;
    pb->msg.to_boot_alt = m->to_boot_alt;
    pb->msg.to_term = m->to_term;
    pb->msg.to_match = m->to_match;
    size_t ng =
        m->n_gossip < IDA_RAFT_NODES_MAX ? m->n_gossip : IDA_RAFT_NODES_MAX;
    for (size_t i = 0; i < ng; i++) {
        Idalloc__Heard *h = &pb->gossip[i];
        idalloc__heard__init(h);
        h->id = m->gossip[i].id;
        h->incarnation = m->gossip[i].inc;
        h->boot = m->gossip[i].boot;
        h->boot_alt = m->gossip[i].boot_alt;
        h->term = m->gossip[i].term;
        pb->gossip_ptrs[i] = h;
    }
    pb->msg.gossip = ng > 0 ? pb->gossip_ptrs : NULL;
    pb->msg.n_gossip = ng;
    switch (m->type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            idalloc__request_vote__init(&pb->u.rv);
            pb->u.rv.pre_vote = m->u.request_vote.pre_vote;
            pb->u.rv.last_log_index = m->u.request_vote.last_log_index;
            pb->u.rv.last_log_term = m->u.request_vote.last_log_term;
            pb->u.rv.transfer = m->u.request_vote.transfer;
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_REQUEST_VOTE;
            pb->msg.request_vote = &pb->u.rv;
            return 0;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
            idalloc__response_vote__init(&pb->u.rsv);
            pb->u.rsv.pre_vote = m->u.response_vote.pre_vote;
            pb->u.rsv.granted = m->u.response_vote.granted;
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_RESPONSE_VOTE;
            pb->msg.response_vote = &pb->u.rsv;
            return 0;
        case IDA_RAFT_MSG_APPEND_ENTRIES: {
            const struct ida_raft_append_entries *a = &m->u.append_entries;
            idalloc__append_entries__init(&pb->u.ae);
            pb->u.ae.prev_log_index = a->prev_log_index;
            pb->u.ae.prev_log_term = a->prev_log_term;
            pb->u.ae.commit_index = a->commit_index;
            pb->u.ae.read_ctx = a->read_ctx;
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_APPEND_ENTRIES;
            pb->msg.append_entries = &pb->u.ae;
            return entries_to_pb(a->entries, a->n_entries, pb);
        }
        case IDA_RAFT_MSG_APPEND_RESPONSE: {
            const struct ida_raft_append_response *a = &m->u.append_response;
            idalloc__append_response__init(&pb->u.ar);
            pb->u.ar.success = a->success;
            pb->u.ar.match_index = a->match_index;
            pb->u.ar.reject_index = a->reject_index;
            pb->u.ar.conflict_term = a->conflict_term;
            pb->u.ar.conflict_index = a->conflict_index;
            pb->u.ar.read_ctx = a->read_ctx;
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_APPEND_RESPONSE;
            pb->msg.append_response = &pb->u.ar;
            return 0;
        }
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT: {
            const struct ida_raft_install_snapshot *s = &m->u.install_snapshot;
            idalloc__install_snapshot__init(&pb->u.is);
            pb->u.is.last_index = s->last_index;
            pb->u.is.last_term = s->last_term;
            pb->u.is.offset = s->offset;
            pb->u.is.config.data = (uint8_t *)s->config;
            pb->u.is.config.len = s->config_len;
            pb->u.is.data.data = (uint8_t *)s->data;
            pb->u.is.data.len = s->len;
            pb->u.is.done = s->done;
            pb->u.is.total_size = s->total_size;
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_INSTALL_SNAPSHOT;
            pb->msg.install_snapshot = &pb->u.is;
            return 0;
        }
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE: {
            const struct ida_raft_snapshot_response *s =
                &m->u.snapshot_response;
            idalloc__snapshot_response__init(&pb->u.sr);
            pb->u.sr.last_index = s->last_index;
            pb->u.sr.next_offset = s->next_offset;
            pb->u.sr.done = s->done;
            pb->u.sr.success = s->success;
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_SNAPSHOT_RESPONSE;
            pb->msg.snapshot_response = &pb->u.sr;
            return 0;
        }
        case IDA_RAFT_MSG_TIMEOUT_NOW:
            idalloc__timeout_now__init(&pb->u.tn);
            pb->msg.msg_case = IDALLOC__PEER_MESSAGE__MSG_TIMEOUT_NOW;
            pb->msg.timeout_now = &pb->u.tn;
            return 0;
    }
    return IDA_EINVAL;
}

void node_pb_peer_release(struct node_pb_peer *pb)
{
    ida_free(pb->entries);
    ida_free(pb->entry_ptrs);
    pb->entries = NULL;
    pb->entry_ptrs = NULL;
}

static int entries_from_pb(const Idalloc__AppendEntries *ae,
                           struct ida_raft_msg *m,
                           struct ida_entry **out)
{
    *out = NULL;
    if (ae->n_entries == 0) {
        return 0;
    }
    struct ida_entry *e = ida_calloc(ae->n_entries, sizeof(*e));
    if (e == NULL) {
        return IDA_ENOMEM;
    }
    for (size_t i = 0; i < ae->n_entries; i++) {
        const Idalloc__LogEntry *le = ae->entries[i];
        if (le->type != IDALLOC__ENTRY_TYPE__ENTRY_NORMAL &&
            le->type != IDALLOC__ENTRY_TYPE__ENTRY_NOOP &&
            le->type != IDALLOC__ENTRY_TYPE__ENTRY_CONFIG) {
            ida_free(e);
            return IDA_EPROTO;
        }
        e[i].term = le->term;
        e[i].index = le->index;
        e[i].type = (enum ida_entry_type)le->type;
        e[i].data = le->data.data;
        e[i].len = le->data.len;
    }
    m->u.append_entries.entries = e;
    m->u.append_entries.n_entries = ae->n_entries;
    *out = e;
    return 0;
}

int node_pb_to_raft(const Idalloc__PeerMessage *pb,
                    struct ida_raft_msg *m,
                    struct ida_entry **entries)
{
    memset(m, 0, sizeof(*m));
    *entries = NULL;
    m->from = pb->from;
    m->to = pb->to;
    m->term = pb->term;
    m->from_inc = pb->from_incarnation;
    m->from_boot = pb->from_boot;
    m->term_durable = pb->term_durable;
    m->to_inc = pb->to_incarnation;
    m->to_boot = pb->to_boot;
    m->to_boot_alt = pb->to_boot_alt;
    m->to_term = pb->to_term;
    m->to_match = pb->to_match;
    if (pb->n_gossip > IDA_RAFT_NODES_MAX) {
        return IDA_EPROTO;
    }
    for (size_t i = 0; i < pb->n_gossip; i++) {
        const Idalloc__Heard *h = pb->gossip[i];
        m->gossip[i] = (struct ida_raft_seen){.id = h->id,
                                              .inc = h->incarnation,
                                              .boot = h->boot,
                                              .boot_alt = h->boot_alt,
                                              .term = h->term};
    }
    m->n_gossip = pb->n_gossip;
    switch (pb->msg_case) {
        case IDALLOC__PEER_MESSAGE__MSG_REQUEST_VOTE:
            m->type = IDA_RAFT_MSG_REQUEST_VOTE;
            m->u.request_vote.pre_vote = pb->request_vote->pre_vote;
            m->u.request_vote.last_log_index = pb->request_vote->last_log_index;
            m->u.request_vote.last_log_term = pb->request_vote->last_log_term;
            m->u.request_vote.transfer = pb->request_vote->transfer;
            return 0;
        case IDALLOC__PEER_MESSAGE__MSG_RESPONSE_VOTE:
            m->type = IDA_RAFT_MSG_RESPONSE_VOTE;
            m->u.response_vote.pre_vote = pb->response_vote->pre_vote;
            m->u.response_vote.granted = pb->response_vote->granted;
            return 0;
        case IDALLOC__PEER_MESSAGE__MSG_APPEND_ENTRIES:
            m->type = IDA_RAFT_MSG_APPEND_ENTRIES;
            m->u.append_entries.prev_log_index =
                pb->append_entries->prev_log_index;
            m->u.append_entries.prev_log_term =
                pb->append_entries->prev_log_term;
            m->u.append_entries.commit_index = pb->append_entries->commit_index;
            m->u.append_entries.read_ctx = pb->append_entries->read_ctx;
            return entries_from_pb(pb->append_entries, m, entries);
        case IDALLOC__PEER_MESSAGE__MSG_APPEND_RESPONSE: {
            const Idalloc__AppendResponse *a = pb->append_response;
            m->type = IDA_RAFT_MSG_APPEND_RESPONSE;
            m->u.append_response.success = a->success;
            m->u.append_response.match_index = a->match_index;
            m->u.append_response.reject_index = a->reject_index;
            m->u.append_response.conflict_term = a->conflict_term;
            m->u.append_response.conflict_index = a->conflict_index;
            m->u.append_response.read_ctx = a->read_ctx;
            return 0;
        }
        case IDALLOC__PEER_MESSAGE__MSG_INSTALL_SNAPSHOT: {
            const Idalloc__InstallSnapshot *s = pb->install_snapshot;
            m->type = IDA_RAFT_MSG_INSTALL_SNAPSHOT;
            m->u.install_snapshot.last_index = s->last_index;
            m->u.install_snapshot.last_term = s->last_term;
            m->u.install_snapshot.offset = s->offset;
            m->u.install_snapshot.config = s->config.data;
            m->u.install_snapshot.config_len = s->config.len;
            m->u.install_snapshot.data = s->data.data;
            m->u.install_snapshot.len = s->data.len;
            m->u.install_snapshot.done = s->done;
            m->u.install_snapshot.total_size = s->total_size;
            return 0;
        }
        case IDALLOC__PEER_MESSAGE__MSG_SNAPSHOT_RESPONSE: {
            const Idalloc__SnapshotResponse *s = pb->snapshot_response;
            m->type = IDA_RAFT_MSG_SNAPSHOT_RESPONSE;
            m->u.snapshot_response.last_index = s->last_index;
            m->u.snapshot_response.next_offset = s->next_offset;
            m->u.snapshot_response.done = s->done;
            m->u.snapshot_response.success = s->success;
            return 0;
        }
        case IDALLOC__PEER_MESSAGE__MSG_TIMEOUT_NOW:
            m->type = IDA_RAFT_MSG_TIMEOUT_NOW;
            return 0;
        default:
            return IDA_EPROTO;
    }
}

/* --- cluster configs ----------------------------------------------------- */

static void *conf_pb_alloc(void *data, size_t size)
{
    (void)data;
    return ida_malloc(size);
}

static void conf_pb_free(void *data, void *p)
{
    (void)data;
    ida_free(p);
}

static ProtobufCAllocator conf_pb_allocator = {conf_pb_alloc, conf_pb_free,
                                               NULL};

int node_conf_removed_slot(const struct ida_raft_conf *c, ida_node_id id)
{
    for (size_t i = 0; i < c->n_removed; i++) {
        if (c->removed[i] == id) {
            return (int)i;
        }
    }
    return -1;
}

int node_conf_decode(const uint8_t *data, size_t len, struct ida_raft_conf *out)
{
    Idalloc__ClusterConfig *cc =
        idalloc__cluster_config__unpack(&conf_pb_allocator, len, data);
    if (cc == NULL) {
        /* protobuf-c does not tell malformed input from a failed
         * allocation; input is the likely cause. */
        return IDA_EPROTO;
    }
    struct ida_raft_conf c = {.n = 0};
    int rv = 0;
    for (size_t i = 0; i < cc->n_members && rv == 0; i++) {
        const Idalloc__Member *m = cc->members[i];
        if (m->id == 0 || ida_raft_conf_has(&c, m->id)) {
            rv = IDA_EPROTO;
        } else if (m->voter && c.n < IDA_RAFT_NODES_MAX) {
            c.voter_inc[c.n] = m->incarnation;
            c.voters[c.n++] = m->id;
        } else if (!m->voter && c.n_learners < IDA_RAFT_NODES_MAX) {
            c.learner_inc[c.n_learners] = m->incarnation;
            c.learners[c.n_learners++] = m->id;
        } else {
            rv = IDA_EPROTO;
        }
    }
    for (size_t i = 0; i < cc->n_removed && rv == 0; i++) {
        const Idalloc__Member *m = cc->removed[i];
        if (m->id == 0 || c.n_removed >= IDA_RAFT_NODES_MAX ||
            ida_raft_conf_has(&c, m->id) ||
            node_conf_removed_slot(&c, m->id) >= 0) {
            rv = IDA_EPROTO; /* a removed node is not a member, once */
        } else {
            c.removed_inc[c.n_removed] = m->incarnation;
            c.removed[c.n_removed++] = m->id;
        }
    }
    idalloc__cluster_config__free_unpacked(cc, &conf_pb_allocator);
    if (rv == 0 && c.n == 0) {
        rv = IDA_EPROTO;
    }
    if (rv == 0) {
        *out = c;
    }
    return rv;
}

/* The members of @c as protobuf (pointing into @ms, @mp and @book), with
 * the addresses of @book (NULL: none); the removed nodes follow the
 * members in @ms and @mp. */
static void conf_pb(const struct node_book *book,
                    const struct ida_raft_conf *c,
                    Idalloc__Member *ms,
                    Idalloc__Member **mp,
                    Idalloc__ClusterConfig *cc)
{
    idalloc__cluster_config__init(cc);
    size_t k = 0;
    for (size_t i = 0; i < c->n + c->n_learners; i++) {
        bool voter = i < c->n;
        if ((voter ? i : i - c->n) >= IDA_RAFT_NODES_MAX) {
            continue;
        }
        ida_node_id id = voter ? c->voters[i] : c->learners[i - c->n];
        const struct node_book_entry *e =
            book != NULL ? node_book_find(book, id) : NULL;
        idalloc__member__init(&ms[k]);
        ms[k].id = id;
        ms[k].incarnation = voter ? c->voter_inc[i] : c->learner_inc[i - c->n];
        ms[k].voter = voter;
        if (e != NULL) {
            ms[k].peer_addr = (char *)e->peer.text;
            ms[k].client_addr = (char *)e->client.text;
        }
        mp[k] = &ms[k];
        k++;
    }
    cc->n_members = k;
    cc->members = mp;
    size_t r = 0;
    for (size_t i = 0; i < c->n_removed && i < IDA_RAFT_NODES_MAX; i++) {
        idalloc__member__init(&ms[k + r]);
        ms[k + r].id = c->removed[i];
        ms[k + r].incarnation = c->removed_inc[i];
        mp[k + r] = &ms[k + r];
        r++;
    }
    cc->n_removed = r;
    cc->removed = r > 0 ? mp + k : NULL;
}

int node_conf_encode(const struct ida_raft_conf *c,
                     uint8_t *buf,
                     size_t cap,
                     size_t *len)
{
    Idalloc__Member ms[3 * IDA_RAFT_NODES_MAX];
    Idalloc__Member *mp[3 * IDA_RAFT_NODES_MAX];
    Idalloc__ClusterConfig cc;
    conf_pb(NULL, c, ms, mp, &cc);
    size_t need = idalloc__cluster_config__get_packed_size(&cc);
    if (need > cap) {
        return IDA_ETOOBIG;
    }
    *len = idalloc__cluster_config__pack(&cc, buf);
    return 0;
}

int node_conf_encode_full(const struct node_book *book,
                          const struct ida_raft_conf *c,
                          uint8_t **out,
                          size_t *len)
{
    Idalloc__Member ms[3 * IDA_RAFT_NODES_MAX];
    Idalloc__Member *mp[3 * IDA_RAFT_NODES_MAX];
    Idalloc__ClusterConfig cc;
    conf_pb(book, c, ms, mp, &cc);
    *len = idalloc__cluster_config__get_packed_size(&cc);
    *out = ida_malloc(*len > 0 ? *len : 1);
    if (*out == NULL) {
        return IDA_ENOMEM;
    }
    idalloc__cluster_config__pack(&cc, *out);
    return 0;
}

int node_request_check(const Idalloc__ClientRequest *req, const char **why)
{
    const ProtobufCBinaryData *pool = NULL, *tag = NULL;
    switch (req->op_case) {
        case IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE:
            pool = &req->pool_create->name;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_ALLOC:
            pool = &req->alloc->pool;
            tag = &req->alloc->tag;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_FREE:
            pool = &req->free->pool;
            tag = &req->free->tag;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_LOOKUP:
            pool = &req->lookup->pool;
            tag = &req->lookup->tag;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_LIST:
            pool = &req->list->pool;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_RESERVE:
            pool = &req->reserve->pool;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC:
            pool = &req->prefix_alloc->pool;
            tag = &req->prefix_alloc->tag;
            break;
        default:
            return 0;
    }
    char name[IDA_POOL_NAME_MAX + 1], t[IDA_TAG_BYTES_MAX + 1];
    const char *w = NULL;
    int rv = ida_fsm_pool_name_get(pool, name, &w);
    if (rv == 0 && tag != NULL) {
        rv = ida_fsm_tag_get(tag, t, &w);
    }
    if (rv != 0) {
        *why = w; /* untouched on success: the caller's later errors */
    }
    return rv;
}

void node_request_to_command(const Idalloc__ClientRequest *q,
                             Idalloc__Command *c)
{
    c->client_id = q->client_id;
    c->request_seq = q->request_seq;
    c->ack_below = q->ack_below;
    switch (q->op_case) {
        case IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE:
            c->op_case = IDALLOC__COMMAND__OP_POOL_CREATE;
            c->pool_create = q->pool_create;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_ALLOC:
            c->op_case = IDALLOC__COMMAND__OP_ALLOC;
            c->alloc = q->alloc;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_FREE:
            c->op_case = IDALLOC__COMMAND__OP_FREE;
            c->free = q->free;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_RESERVE:
            c->op_case = IDALLOC__COMMAND__OP_RESERVE;
            c->reserve = q->reserve;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_RESTORE:
            c->op_case = IDALLOC__COMMAND__OP_RESTORE;
            c->restore = q->restore;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT:
            c->op_case = IDALLOC__COMMAND__OP_REGISTER_CLIENT;
            c->register_client = q->register_client;
            break;
        default:
            IDA_ASSERT(q->op_case == IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC);
            c->op_case = IDALLOC__COMMAND__OP_PREFIX_ALLOC;
            c->prefix_alloc = q->prefix_alloc;
            break;
    }
}
