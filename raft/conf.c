/* Cluster membership as the Raft core sees it. Contract: raft/conf.h. */
#include "raft/conf.h"

#include <string.h>

#include "idalloc_errors.h"

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

bool ida_raft_conf_has(const struct ida_raft_conf *c, ida_node_id id)
{
    return ida_raft_conf_slot(c, id) >= 0 ||
           ida_raft_conf_learner_slot(c, id) >= 0;
}

/* Voter @i of @a is also a voter of @b with a compatible incarnation (equal,
 * or unbound in @a). */
static int voter_kept(const struct ida_raft_conf *a,
                      size_t i,
                      const struct ida_raft_conf *b)
{
    int s = ida_raft_conf_slot(b, a->voters[i]);
    return s >= 0 &&
           (a->voter_inc[i] == 0 || a->voter_inc[i] == b->voter_inc[s]);
}

int ida_raft_conf_one_change(const struct ida_raft_conf *a,
                             const struct ida_raft_conf *b)
{
    size_t only_a = 0, only_b = 0, bound = 0;
    for (size_t i = 0; i < a->n; i++) {
        only_a += !voter_kept(a, i, b);
    }
    for (size_t i = 0; i < b->n; i++) {
        int s = ida_raft_conf_slot(a, b->voters[i]);
        if (s < 0 ||
            (a->voter_inc[s] != 0 && a->voter_inc[s] != b->voter_inc[i])) {
            only_b++;
        } else if (a->voter_inc[s] != b->voter_inc[i]) {
            bound++;
        }
    }
    if (only_a + only_b == 1) {
        return 1;
    }
    if (only_a + only_b > 1) {
        return 0;
    }
    if (bound > 0) {
        return 1;
    }
    /* Same voters: a change only if the learners differ. */
    if (a->n_learners != b->n_learners) {
        return 1;
    }
    for (size_t i = 0; i < b->n_learners; i++) {
        int s = ida_raft_conf_learner_slot(a, b->learners[i]);
        if (s < 0 || a->learner_inc[s] != b->learner_inc[i]) {
            return 1;
        }
    }
    return 0;
}

int ida_raft_conf_same_members(const struct ida_raft_conf *a,
                               const struct ida_raft_conf *b)
{
    if (a->n != b->n || a->n_learners != b->n_learners) {
        return 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        int s = ida_raft_conf_slot(a, b->voters[i]);
        if (s < 0 || a->voter_inc[s] != b->voter_inc[i]) {
            return 0;
        }
    }
    for (size_t i = 0; i < b->n_learners; i++) {
        int s = ida_raft_conf_learner_slot(a, b->learners[i]);
        if (s < 0 || a->learner_inc[s] != b->learner_inc[i]) {
            return 0;
        }
    }
    return 1;
}

int ida_raft_conf_check(const struct ida_raft_conf *c)
{
    if (c->n == 0 || c->n > IDA_RAFT_NODES_MAX ||
        c->n_learners > IDA_RAFT_NODES_MAX) {
        return IDA_EPROTO;
    }
    for (size_t i = 0; i < c->n + c->n_learners; i++) {
        ida_node_id id = i < c->n ? c->voters[i] : c->learners[i - c->n];
        if (id == 0) {
            return IDA_EPROTO;
        }
        for (size_t j = i + 1; j < c->n + c->n_learners; j++) {
            if (id == (j < c->n ? c->voters[j] : c->learners[j - c->n])) {
                return IDA_EPROTO;
            }
        }
    }
    return 0;
}
