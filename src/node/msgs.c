#include "src/node/msgs.h"

#include <string.h>

#include "base/heap.h"
#include "base/log.h"
#include "fsm/fsm.h"
#include "idalloc_errors.h"

struct ida_msg *node_msg_new(enum node_msg_type type, void *payload)
{
    struct ida_msg *m = ida_msg_new((uint32_t)type, sizeof(payload));
    if (m != NULL) {
        memcpy(m->data, &payload, sizeof(payload));
    }
    return m;
}

void *node_msg_payload(const struct ida_msg *m)
{
    void *p;
    memcpy(&p, m->data, sizeof(p));
    return p;
}

struct ida_entry *node_entries_copy(const struct ida_entry *e, size_t n)
{
    size_t bytes = n * sizeof(*e);
    for (size_t i = 0; i < n; i++) {
        bytes += e[i].len;
    }
    struct ida_entry *out = ida_malloc(bytes > 0 ? bytes : 1);
    if (out == NULL) {
        return NULL;
    }
    uint8_t *data = (uint8_t *)(out + n);
    for (size_t i = 0; i < n; i++) {
        out[i] = e[i];
        out[i].data = e[i].len > 0 ? data : NULL;
        if (e[i].len > 0) {
            memcpy(data, e[i].data, e[i].len);
            data += e[i].len;
        }
    }
    return out;
}

struct ida_raft_msg *node_raft_msgs_copy(const struct ida_raft_msg *m, size_t n)
{
    struct ida_raft_msg *out = ida_calloc(n > 0 ? n : 1, sizeof(*out));
    if (out == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = m[i];
        if (m[i].type == IDA_RAFT_MSG_APPEND_ENTRIES) {
            out[i].u.append_entries.entries = NULL;
            const struct ida_raft_append_entries *ae = &m[i].u.append_entries;
            if (ae->n_entries > 0) {
                out[i].u.append_entries.entries =
                    node_entries_copy(ae->entries, ae->n_entries);
                if (out[i].u.append_entries.entries == NULL) {
                    out[i].u.append_entries.n_entries = 0;
                    node_raft_msgs_free(out, i + 1);
                    return NULL;
                }
            }
        } else if (m[i].type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
            const struct ida_raft_install_snapshot *is =
                &m[i].u.install_snapshot;
            uint8_t *d = ida_malloc(is->len > 0 ? is->len : 1);
            if (d == NULL) {
                out[i].type = IDA_RAFT_MSG_TIMEOUT_NOW; /* nothing to free */
                node_raft_msgs_free(out, i + 1);
                return NULL;
            }
            memcpy(d, is->data, is->len);
            out[i].u.install_snapshot.data = d;
        }
    }
    return out;
}

void node_raft_msgs_free(struct ida_raft_msg *m, size_t n)
{
    if (m == NULL) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].type == IDA_RAFT_MSG_APPEND_ENTRIES) {
            ida_free((void *)m[i].u.append_entries.entries);
        } else if (m[i].type == IDA_RAFT_MSG_INSTALL_SNAPSHOT) {
            ida_free((void *)m[i].u.install_snapshot.data);
        }
    }
    ida_free(m);
}

void ida_nm_apply_free(struct ida_nm_apply *a)
{
    if (a == NULL) {
        return;
    }
    ida_fsm_free(a->fsm);
    ida_free(a->snap_data);
    ida_free(a->entries);
    ida_free(a);
}

void ida_nm_persist_free(struct ida_nm_persist *p)
{
    if (p == NULL) {
        return;
    }
    ida_free(p->entries);
    ida_free(p->snap_data);
    ida_free(p->snap_conf);
    node_raft_msgs_free(p->after, p->n_after);
    ida_nm_apply_free(p->apply_after);
    ida_free(p);
}

/* Free a payload of @type, whatever it points to. */
static void payload_free(uint32_t type, void *p)
{
    switch ((enum node_msg_type)type) {
        case IDA_NM_CLIENT:
            if (p != NULL) {
                idalloc__client_request__free_unpacked(
                    ((struct ida_nm_client *)p)->req, NULL);
            }
            ida_free(p);
            break;
        case IDA_NM_READ:
            if (p != NULL) {
                idalloc__client_request__free_unpacked(
                    ((struct ida_nm_read *)p)->req, NULL);
            }
            ida_free(p);
            break;
        case IDA_NM_PEER:
            idalloc__peer_message__free_unpacked(p, NULL);
            break;
        case IDA_NM_PERSIST:
            ida_nm_persist_free(p);
            break;
        case IDA_NM_APPLY:
            ida_nm_apply_free(p);
            break;
        case IDA_NM_MEMBERSHIP0:
        case IDA_NM_MEMBERSHIP0_DONE:
            if (p != NULL) {
                ida_free(((struct ida_nm_membership0 *)p)->data);
            }
            ida_free(p);
            break;
        case IDA_NM_SNAPSHOT_CHUNK:
            if (p != NULL) {
                ida_free(((struct ida_nm_snap_chunk *)p)->conf);
            }
            ida_free(p);
            break;
        case IDA_NM_SNAPSHOT_RCV:
            if (p != NULL) {
                ida_free(((struct ida_nm_snap_rcv *)p)->data);
                ida_free(((struct ida_nm_snap_rcv *)p)->conf);
            }
            ida_free(p);
            break;
        case IDA_NM_SNAPSHOT_ENC:
            if (p != NULL) {
                ida_free(((struct ida_nm_snap_enc *)p)->data);
            }
            ida_free(p);
            break;
        case IDA_NM_SNAPSHOT_TAKEN:
        case IDA_NM_SNAPSHOT_STORE:
        case IDA_NM_SNAPSHOT_STORED:
            if (p != NULL) {
                ida_free(((struct ida_nm_snapshot *)p)->data);
                ida_free(((struct ida_nm_snapshot *)p)->conf);
            }
            ida_free(p);
            break;
        default:
            ida_free(p);
            break;
    }
}

void node_msg_free(struct ida_msg *m)
{
    if (m == NULL) {
        return;
    }
    payload_free(m->type, node_msg_payload(m));
    ida_msg_free(m);
}

/* A send that can never succeed: free the message. While the node stops
 * (IDA_ESTOPPED) that is expected and not worth a warning. */
static void drop(struct ida_msg *m, int rv)
{
    if (rv == IDA_ESTOPPED) {
        IDA_DEBUG("node: stopping: internal message dropped");
    } else {
        IDA_WARN("node: dropping an internal message: %s",
                 idalloc_strerror(rv));
    }
    node_msg_free(m);
}

void node_outq_flush(struct node_outq *q, struct ida_sender *s)
{
    while (q->n > 0) {
        int rv = ida_send(s, q->v[q->head].to, q->v[q->head].msg);
        if (rv == IDA_EBUSY) {
            return; /* still full: try again on the next call */
        }
        if (rv != 0) {
            drop(q->v[q->head].msg, rv);
        }
        q->head = (q->head + 1) % q->cap;
        q->n--;
    }
}

void node_send(struct node_outq *q,
               struct ida_sender *s,
               uint32_t to,
               struct ida_msg *m)
{
    node_outq_flush(q, s);
    if (q->n == 0) {
        int rv = ida_send(s, to, m);
        if (rv == 0) {
            return;
        }
        if (rv != IDA_EBUSY) {
            drop(m, rv);
            return;
        }
    }
    if (q->n == q->cap) {
        size_t cap = q->cap == 0 ? 64 : q->cap * 2;
        void *v = ida_malloc(cap * sizeof(*q->v));
        if (v == NULL) {
            IDA_ERROR("node: out of memory queueing an internal message");
            node_msg_free(m);
            return;
        }
        for (size_t i = 0; i < q->n; i++) {
            memcpy((char *)v + i * sizeof(*q->v), &q->v[(q->head + i) % q->cap],
                   sizeof(*q->v));
        }
        ida_free(q->v);
        q->v = v;
        q->cap = cap;
        q->head = 0;
    }
    size_t tail = (q->head + q->n) % q->cap;
    q->v[tail].to = to;
    q->v[tail].msg = m;
    q->n++;
}

int node_post(struct node_outq *q,
              struct ida_sender *s,
              uint32_t to,
              enum node_msg_type type,
              void *payload)
{
    struct ida_msg *m = node_msg_new(type, payload);
    if (m == NULL) {
        IDA_ERROR("node: out of memory for an internal message");
        payload_free(type, payload);
        return IDA_ENOMEM;
    }
    node_send(q, s, to, m);
    return 0;
}

void node_outq_close(struct node_outq *q)
{
    for (size_t i = 0; i < q->n; i++) {
        node_msg_free(q->v[(q->head + i) % q->cap].msg);
    }
    ida_free(q->v);
    memset(q, 0, sizeof(*q));
}
