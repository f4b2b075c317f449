/* Rule A4 of raft/admission.h: peers echo back what a node told them, so a
 * node whose directory went back to an older copy learns it from them. */
#include <string.h>

#include "base/assert.h"
#include "idalloc_errors.h"
#include "raft/internal.h"
#include "raft/raft.h"
#include "raft/testing.h"

#define BOOT_COUNT(b) ((b) >> 32)

bool ida_raft_boot_later(uint64_t a, uint64_t b)
{
    return BOOT_COUNT(a) > BOOT_COUNT(b) ||
           (BOOT_COUNT(a) == BOOT_COUNT(b) && a != b);
}

bool ida_raft_rolled_back(const struct ida_raft *r,
                          struct ida_raft_rollback *out)
{
    if (out != NULL) {
        *out = r->rollback;
    }
    return r->rollback.kind != IDA_RAFT_ROLLBACK_NONE;
}

static struct ida_raft_seen *seen_of(struct ida_raft *r, ida_node_id id)
{
    for (size_t i = 0; i < IDA_RAFT_SEEN_MAX; i++) {
        if (r->seen[i].id == id) {
            return &r->seen[i];
        }
    }
    return NULL;
}

/* A slot for @id: its own, a free one, else one of a node that is no
 * longer a member (the table holds twice the members a config can have). */
static struct ida_raft_seen *seen_slot(struct ida_raft *r, ida_node_id id)
{
    struct ida_raft_seen *e = seen_of(r, id);
    for (size_t i = 0; e == NULL && i < IDA_RAFT_SEEN_MAX; i++) {
        if (r->seen[i].id == 0 ||
            ida__raft_member_slot(&r->conf, r->seen[i].id) < 0) {
            e = &r->seen[i];
            memset(e, 0, sizeof(*e));
        }
    }
    return e;
}

static int found(struct ida_raft *r,
                 const struct ida_raft_msg *m,
                 enum ida_raft_rollback_kind kind,
                 uint64_t told,
                 uint64_t have)
{
    r->rollback.kind = kind;
    r->rollback.by = m->from;
    r->rollback.told = told;
    r->rollback.have = have;
    if (r->role != IDA_RAFT_FOLLOWER) {
        /* Whatever this node leads or asks for rests on state it lost. */
        ida__raft_become_follower(r, r->term, 0);
    }
    return IDA_ELOSTSTATE;
}

/* What @m says @inc (ours?) told somebody: a later start, a higher term. */
static int check_heard(struct ida_raft *r,
                       const struct ida_raft_msg *m,
                       uint64_t inc,
                       uint64_t boot,
                       uint64_t boot_alt,
                       ida_term term)
{
    if (inc != r->cfg.incarnation) {
        return 0;
    }
    if (boot != 0 && ida_raft_boot_later(boot, r->cfg.boot)) {
        return found(r, m, IDA_RAFT_ROLLBACK_BOOT, boot, r->cfg.boot);
    }
    if (boot_alt != 0 && ida_raft_boot_later(boot_alt, r->cfg.boot)) {
        return found(r, m, IDA_RAFT_ROLLBACK_BOOT, boot_alt, r->cfg.boot);
    }
    if (term > r->term) {
        return found(r, m, IDA_RAFT_ROLLBACK_TERM, term, r->term);
    }
    return 0;
}

int ida__raft_check_rollback(struct ida_raft *r, const struct ida_raft_msg *m)
{
    if (r->rollback.kind != IDA_RAFT_ROLLBACK_NONE) {
        return IDA_ELOSTSTATE;
    }
    if (r->cfg.boot == 0 || (r->bugs & IDA_RAFT_BUG_IGNORE_ROLLBACK) ||
        ida__raft_member_slot(&r->conf, m->from) < 0) {
        return 0;
    }
    int rv = 0;
    if (m->to_inc != 0) {
        rv = check_heard(r, m, m->to_inc, m->to_boot, m->to_boot_alt,
                         m->to_term);
    }
    size_t n =
        m->n_gossip < IDA_RAFT_NODES_MAX ? m->n_gossip : IDA_RAFT_NODES_MAX;
    for (size_t i = 0; rv == 0 && i < n; i++) {
        const struct ida_raft_seen *g = &m->gossip[i];
        if (g->id == r->cfg.id && g->inc != 0) {
            rv = check_heard(r, m, g->inc, g->boot, g->boot_alt, g->term);
        }
    }
    if (rv != 0 || m->to_inc != r->cfg.incarnation) {
        return rv;
    }
    /* Only the leader of our term (or of a later one, which we are about to
     * follow) knows what we acknowledged to it; a stale leader's progress
     * of us may be from before a newer leader truncated our log. */
    bool from_leader = m->type == IDA_RAFT_MSG_APPEND_ENTRIES ||
                       m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT;
    if (from_leader && m->term >= r->term &&
        m->to_match > ida__raft_last_index(r)) {
        return found(r, m, IDA_RAFT_ROLLBACK_MATCH, m->to_match,
                     ida__raft_last_index(r));
    }
    return 0;
}

/* Remember that member @id's incarnation @inc said @boot and @term. */
static void merge_boot(struct ida_raft_seen *e, uint64_t boot)
{
    if (boot == 0 || boot == e->boot) {
        return;
    }
    if (e->boot == 0 || BOOT_COUNT(boot) > BOOT_COUNT(e->boot)) {
        e->boot = boot;
        e->boot_alt = 0;
    } else if (BOOT_COUNT(boot) == BOOT_COUNT(e->boot) && e->boot_alt == 0) {
        /* Two starts with one count: one of them ran from a copy. Both are
         * kept and echoed, so whichever is running learns it. */
        e->boot_alt = boot;
    }
}

static void merge(struct ida_raft *r,
                  ida_node_id id,
                  uint64_t inc,
                  uint64_t boot,
                  uint64_t boot_alt,
                  ida_term term)
{
    if (id == 0 || id == r->cfg.id || ida__raft_member_slot(&r->conf, id) < 0 ||
        !ida_raft_conf_inc_ok(&r->conf, id, inc)) {
        return;
    }
    struct ida_raft_seen *e = seen_slot(r, id);
    if (e == NULL) {
        return;
    }
    if (e->id != id || e->inc != inc) {
        memset(e, 0, sizeof(*e));
        e->id = id;
        e->inc = inc;
    }
    merge_boot(e, boot);
    merge_boot(e, boot_alt);
    if (term > e->term) {
        e->term = term;
    }
}

void ida__raft_record_seen(struct ida_raft *r, const struct ida_raft_msg *m)
{
    if (ida__raft_member_slot(&r->conf, m->from) < 0) {
        return; /* a stranger's word is not taken for anyone */
    }
    /* A term is remembered only once this node is at it or past it (it
     * ignores some higher terms, e.g. vote requests within a leader's
     * lease), so what it echoes is never above the term of its own
     * messages: a receiver can refuse an echo above the message's term. */
    ida_term t = m->term_durable && m->term <= r->term ? m->term : 0;
    if (m->from_boot != 0) {
        merge(r, m->from, m->from_inc, m->from_boot, 0, t);
    }
    size_t n =
        m->n_gossip < IDA_RAFT_NODES_MAX ? m->n_gossip : IDA_RAFT_NODES_MAX;
    for (size_t i = 0; i < n; i++) {
        const struct ida_raft_seen *g = &m->gossip[i];
        if (g->inc != 0) {
            merge(r, g->id, g->inc, g->boot, g->boot_alt,
                  g->term <= r->term ? g->term : 0);
        }
    }
}

void ida__raft_fill_gossip(struct ida_raft *r, struct ida_raft_msg *m)
{
    m->n_gossip = 0;
    for (size_t i = 0; i < r->conf.n && m->n_gossip < IDA_RAFT_NODES_MAX; i++) {
        const struct ida_raft_seen *e = seen_of(r, r->conf.voters[i]);
        if (e != NULL && e->inc != 0 &&
            ida_raft_conf_inc_ok(&r->conf, e->id, e->inc)) {
            m->gossip[m->n_gossip++] = *e;
        }
    }
}

void ida__raft_fill_echo(struct ida_raft *r,
                         struct ida_raft_msg *m,
                         bool durable)
{
    m->from_boot = r->cfg.boot;
    /* A granted pre-vote answer carries the candidate's term, not ours. */
    m->term_durable =
        (durable || r->role == IDA_RAFT_LEADER) && m->term == r->term;
    const struct ida_raft_seen *e = seen_of(r, m->to);
    if (e == NULL) {
        return;
    }
    m->to_inc = e->inc;
    m->to_boot = e->boot;
    m->to_boot_alt = e->boot_alt;
    m->to_term = e->term;
    uint64_t bound = ida_raft_conf_inc(&r->conf, m->to);
    bool from_leader = m->type == IDA_RAFT_MSG_APPEND_ENTRIES ||
                       m->type == IDA_RAFT_MSG_INSTALL_SNAPSHOT;
    if (r->role == IDA_RAFT_LEADER && from_leader && bound != 0 &&
        bound == e->inc) {
        const struct ida_raft_progress *pr = ida__raft_progress_of(r, m->to);
        m->to_match = pr != NULL ? pr->match : 0;
    }
}
