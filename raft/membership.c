/* Membership in effect: voters, learners and their progress slots
 * (dissertation §4.1). Internal to the core: raft/internal.h. */
#include "raft/raft.h"

#include <string.h>

#include "base/assert.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "raft/internal.h"
#include "raft/testing.h"

int ida__raft_voter_slot(const struct ida_raft *r, ida_node_id id)
{
    return ida_raft_conf_slot(&r->conf, id);
}

/* Members: voters, then learners; prs[] is indexed the same way. */
size_t ida__raft_n_members(const struct ida_raft *r)
{
    return r->conf.n + r->conf.n_learners;
}

ida_node_id ida__raft_member_id(const struct ida_raft *r, size_t i)
{
    return i < r->conf.n ? r->conf.voters[i] : r->conf.learners[i - r->conf.n];
}

int ida__raft_member_slot(const struct ida_raft_conf *c, ida_node_id id)
{
    int s = ida_raft_conf_slot(c, id);
    if (s >= 0) {
        return s;
    }
    s = ida_raft_conf_learner_slot(c, id);
    return s < 0 ? -1 : (int)c->n + s;
}

size_t ida__raft_quorum(const struct ida_raft *r)
{
    return r->conf.n / 2 + 1;
}

/* Decode the membership in @data through the application's decoder and
 * check it, so a faulty decoder cannot overflow the core's member arrays.
 * Returns 0, IDA_EPROTO, IDA_ENOMEM; on error @out is unspecified. */
int ida__raft_conf_decode(const struct ida_raft_config *cfg,
                          const uint8_t *data,
                          size_t len,
                          struct ida_raft_conf *out)
{
    int rv = cfg->conf_decode(data, len, out);
    return rv != 0 ? rv : ida_raft_conf_check(out);
}

/* Make @c the membership in effect (from the entry at @index, 0: from the
 * snapshot or bootstrap). Progress of voters that stay is kept. */
void ida__raft_conf_apply(struct ida_raft *r,
                          const struct ida_raft_conf *c,
                          ida_index index)
{
    struct ida_raft_progress old[2 * IDA_RAFT_NODES_MAX];
    struct ida_raft_conf old_conf = r->conf;
    memcpy(old, r->prs, sizeof(old));
    r->conf = *c;
    r->conf_index = index;
    for (size_t i = 0; i < ida__raft_n_members(r); i++) {
        int k = ida__raft_member_slot(&old_conf, ida__raft_member_id(r, i));
        if (k >= 0) {
            r->prs[i] = old[k];
            continue;
        }
        struct ida_raft_progress *pr = &r->prs[i];
        memset(pr, 0, sizeof(*pr));
        pr->id = ida__raft_member_id(r, i);
        pr->next = r->snap_index + r->n_log + 1;
        pr->state = IDA_RAFT_PROBE;
        pr->recent_active = true;
    }
    memset(r->votes, 0, sizeof(r->votes));
    memset(r->voted, 0, sizeof(r->voted));
}

static void conf_bootstrap(const struct ida_raft *r, struct ida_raft_conf *c)
{
    memset(c, 0, sizeof(*c));
    memcpy(c->voters, r->cfg.voters, sizeof(c->voters));
    memcpy(c->voter_inc, r->cfg.voter_inc, sizeof(c->voter_inc));
    c->n = r->cfg.n_voters;
}

/* Recompute the membership in effect: the latest config entry of the log,
 * else the snapshot's config, else bootstrap. Entries were validated when
 * they entered the log, so decoding fails only on allocation. */
int ida__raft_conf_refresh(struct ida_raft *r)
{
    struct ida_raft_conf c;
    for (ida_index i = r->snap_index + r->n_log; i > r->snap_index; i--) {
        const struct ida_entry *e = &r->log[i - r->snap_index - 1];
        if (e->type == IDA_ENTRY_CONFIG) {
            int rv = ida__raft_conf_decode(&r->cfg, e->data, e->len, &c);
            if (rv != 0) {
                return rv;
            }
            ida__raft_conf_apply(r, &c, i);
            return 0;
        }
    }
    if (r->snap_conf_len > 0) {
        int rv =
            ida__raft_conf_decode(&r->cfg, r->snap_conf, r->snap_conf_len, &c);
        if (rv != 0) {
            return rv;
        }
    } else {
        conf_bootstrap(r, &c);
    }
    ida__raft_conf_apply(r, &c, 0);
    return 0;
}

/* Rule A1 of raft/admission.h: only an admitted node campaigns. */
bool ida__raft_promotable(const struct ida_raft *r)
{
    return ida_raft_admitted(r);
}

bool ida_raft_admitted(const struct ida_raft *r)
{
    int s = ida__raft_voter_slot(r, r->cfg.id);
    if (s < 0) {
        return false;
    }
    if (r->bugs & IDA_RAFT_BUG_IGNORE_INCARNATION) {
        return true;
    }
    uint64_t inc = r->conf.voter_inc[s];
    return inc == 0 || inc == r->cfg.incarnation;
}

uint64_t ida_raft_conf_inc(const struct ida_raft_conf *c, ida_node_id id)
{
    int s = ida_raft_conf_slot(c, id);
    if (s >= 0) {
        return c->voter_inc[s];
    }
    s = ida_raft_conf_learner_slot(c, id);
    return s >= 0 ? c->learner_inc[s] : 0;
}

bool ida_raft_conf_inc_ok(const struct ida_raft_conf *c,
                          ida_node_id id,
                          uint64_t inc)
{
    uint64_t bound = ida_raft_conf_inc(c, id);
    return bound == 0 || bound == inc;
}

/* §4.2.2: a leader that is not part of the configuration steps down once
 * the entry that removed it has committed. */
void ida__raft_step_down_if_removed(struct ida_raft *r)
{
    if (r->role == IDA_RAFT_LEADER && ida__raft_voter_slot(r, r->cfg.id) < 0 &&
        r->commit >= r->conf_index) {
        ida__raft_become_follower(r, r->term, 0);
    }
}
