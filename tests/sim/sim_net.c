/* The simulated network: packets that own copies of the messages,
 * per-link delay, loss, duplication and partitions. */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/raft.h"
#include "tests/sim/sim_internal.h"

void sim__packet_free(struct packet *p)
{
    if (p->ents != NULL) {
        for (size_t i = 0; i < p->m.u.append_entries.n_entries; i++) {
            ida_free(p->ents[i].data);
        }
    }
    ida_free(p->ents);
    ida_free(p->blob);
    ida_free(p->conf);
    p->conf = NULL;
    p->ents = NULL;
    p->blob = NULL;
}

/* Deep copy of @m (entries and snapshot data). */
bool sim__packet_copy(struct packet *p, const struct ida_raft_msg *m)
{
    memset(p, 0, sizeof(*p));
    p->m = *m;
    if (m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
        m->u.append_entries.n_entries > 0) {
        size_t n = m->u.append_entries.n_entries;
        p->ents = ida_calloc(n, sizeof(*p->ents));
        if (p->ents == NULL) {
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            p->ents[i] = m->u.append_entries.entries[i];
            p->ents[i].data = NULL;
            if (p->ents[i].len > 0) {
                p->ents[i].data = ida_malloc(p->ents[i].len);
                if (p->ents[i].data == NULL) {
                    p->m.u.append_entries.n_entries = i;
                    sim__packet_free(p);
                    return false;
                }
                memcpy(p->ents[i].data, m->u.append_entries.entries[i].data,
                       p->ents[i].len);
            }
        }
        p->m.u.append_entries.entries = p->ents;
    }
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        m->u.install_snapshot.len > 0) {
        p->blob = ida_malloc(m->u.install_snapshot.len);
        if (p->blob == NULL) {
            return false;
        }
        memcpy(p->blob, m->u.install_snapshot.data, m->u.install_snapshot.len);
        p->m.u.install_snapshot.data = p->blob;
    }
    if (m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT &&
        m->u.install_snapshot.config_len > 0) {
        p->conf = ida_malloc(m->u.install_snapshot.config_len);
        if (p->conf == NULL) {
            return false;
        }
        memcpy(p->conf, m->u.install_snapshot.config,
               m->u.install_snapshot.config_len);
        p->m.u.install_snapshot.config = p->conf;
    }
    return true;
}

int sim__node_slot(const struct sim *s, ida_node_id id)
{
    IDA_ASSERT(id >= 1 && (int)id <= s->n);
    return (int)id - 1;
}

/* A readable one-line description of @m for the trace. */
const char *sim__msg_desc(const struct ida_raft_msg *m, char *buf, size_t n)
{
    int k =
        snprintf(buf, n, "%u->%u term %" PRIu64 " ", m->from, m->to, m->term);
    if (k < 0 || (size_t)k >= n) {
        return buf;
    }
    char *p = buf + k;
    size_t left = n - (size_t)k;
    switch (m->type) {
        case IDA_RAFT_MSG_REQUEST_VOTE:
            snprintf(p, left, "%sRequestVote last %" PRIu64 "/%" PRIu64 "%s",
                     m->u.request_vote.pre_vote ? "Pre" : "",
                     m->u.request_vote.last_log_index,
                     m->u.request_vote.last_log_term,
                     m->u.request_vote.transfer ? " transfer" : "");
            break;
        case IDA_RAFT_MSG_RESPONSE_VOTE:
            snprintf(p, left, "%sResponseVote %s",
                     m->u.response_vote.pre_vote ? "Pre" : "",
                     m->u.response_vote.granted ? "granted" : "rejected");
            break;
        case IDA_RAFT_MSG_APPEND_ENTRIES:
            snprintf(p, left,
                     "AppendEntries prev %" PRIu64 "/%" PRIu64
                     " n=%zu commit "
                     "%" PRIu64,
                     m->u.append_entries.prev_log_index,
                     m->u.append_entries.prev_log_term,
                     m->u.append_entries.n_entries,
                     m->u.append_entries.commit_index);
            break;
        case IDA_RAFT_MSG_APPEND_RESPONSE:
            if (m->u.append_response.success) {
                snprintf(p, left, "AppendResponse ok match %" PRIu64,
                         m->u.append_response.match_index);
            } else {
                snprintf(p, left,
                         "AppendResponse reject %" PRIu64 " hint %" PRIu64
                         "/%" PRIu64,
                         m->u.append_response.reject_index,
                         m->u.append_response.conflict_index,
                         m->u.append_response.conflict_term);
            }
            break;
        case IDA_RAFT_MSG_INSTALL_SNAPSHOT:
            snprintf(p, left,
                     "InstallSnapshot %" PRIu64 "/%" PRIu64 " offset %" PRIu64
                     " len %zu%s",
                     m->u.install_snapshot.last_index,
                     m->u.install_snapshot.last_term,
                     m->u.install_snapshot.offset, m->u.install_snapshot.len,
                     m->u.install_snapshot.done ? " done" : "");
            break;
        case IDA_RAFT_MSG_SNAPSHOT_RESPONSE:
            snprintf(p, left,
                     "SnapshotResponse %" PRIu64 " next %" PRIu64 "%s%s",
                     m->u.snapshot_response.last_index,
                     m->u.snapshot_response.next_offset,
                     m->u.snapshot_response.success ? "" : " refused",
                     m->u.snapshot_response.done ? " done" : "");
            break;
        case IDA_RAFT_MSG_TIMEOUT_NOW:
            snprintf(p, left, "TimeoutNow");
            break;
    }
    return buf;
}

/* Put a packet on the wire: loss, duplication, delay (reordering). */
void sim__net_send(struct sim *s, struct packet *p)
{
    if (p->m.to < 1 || (int)p->m.to > s->n) {
        /* An answer to a garbage message's sender (opts.garbage): nobody
         * is there. */
        sim__packet_free(p);
        return;
    }
    int from = sim__node_slot(s, p->m.from), to = sim__node_slot(s, p->m.to);
    if (s->blocked[from][to] || sim__chance(&s->rng, s->loss_pct)) {
        sim__hash_in(s, 1, p->m.from, p->m.to, p->m.type);
        if (s->o.trace != NULL) {
            char d[160];
            sim__tracef(s, "drop    %s", sim__msg_desc(&p->m, d, sizeof(d)));
        }
        sim__packet_free(p);
        return;
    }
    int copies = sim__chance(&s->rng, s->dup_pct) ? 2 : 1;
    for (int c = 0; c < copies; c++) {
        struct packet q = *p;
        if (c == 1) {
            struct ida_raft_msg m = p->m;
            if (!sim__packet_copy(&q, &m)) {
                s->oom = true;
                return;
            }
        }
        q.at = s->now + 1 + sim__below(&s->rng, s->delay_max_ms);
        q.seq = s->pkt_seq++;
        s->net =
            sim__grow(s, s->net, &s->cap_net, s->n_net + 1, sizeof(*s->net));
        if (s->net == NULL) {
            sim__packet_free(&q);
            return;
        }
        s->net[s->n_net++] = q;
    }
}
