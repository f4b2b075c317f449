/* Declarations shared by the raft/ .c files of the Raft core; not part of
 * the public API (raft/raft.h) and not installed. Each function is
 * documented where it is defined. All take a core that ida_raft_init()
 * set up. */
#ifndef IDA_RAFT_INTERNAL_H
#define IDA_RAFT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "raft/raft.h"

/* raft/log.c */
ida_index ida__raft_last_index(const struct ida_raft *r);
ida_term ida__raft_term_at(const struct ida_raft *r, ida_index i);
ida_term ida__raft_last_term(const struct ida_raft *r);
struct ida_entry *ida__raft_entry_at(const struct ida_raft *r, ida_index i);
int ida__raft_log_reserve(struct ida_raft *r, size_t extra);
int ida__raft_copy_data(const uint8_t *data, size_t len, uint8_t **out);
void ida__raft_log_push(struct ida_raft *r,
                        ida_term term,
                        enum ida_entry_type type,
                        uint8_t *data,
                        size_t len);
void ida__raft_log_truncate(struct ida_raft *r, ida_index from);
void ida__raft_log_compact(struct ida_raft *r, ida_index upto, ida_term term);
/* Drop every entry of the log (a snapshot replaces it), their data to the
 * garbage ida_raft_release() frees. */
void ida__raft_log_drop_all(struct ida_raft *r);

/* raft/ready.c */
void ida__raft_send_now(struct ida_raft *r, struct ida_raft_msg *m);
void ida__raft_send_after_persist(struct ida_raft *r, struct ida_raft_msg *m);
void ida__raft_msg_init(struct ida_raft_msg *m,
                        enum ida_raft_msg_type type,
                        ida_node_id to,
                        ida_term term);
void ida__raft_begin(struct ida_raft *r);

/* raft/membership.c */
int ida__raft_conf_decode(const struct ida_raft_config *cfg,
                          const uint8_t *data,
                          size_t len,
                          struct ida_raft_conf *out);
int ida__raft_voter_slot(const struct ida_raft *r, ida_node_id id);
size_t ida__raft_n_members(const struct ida_raft *r);
ida_node_id ida__raft_member_id(const struct ida_raft *r, size_t i);
int ida__raft_member_slot(const struct ida_raft_conf *c, ida_node_id id);
size_t ida__raft_quorum(const struct ida_raft *r);
void ida__raft_conf_apply(struct ida_raft *r,
                          const struct ida_raft_conf *c,
                          ida_index index);
int ida__raft_conf_refresh(struct ida_raft *r);
bool ida__raft_promotable(const struct ida_raft *r);
void ida__raft_step_down_if_removed(struct ida_raft *r);

/* raft/election.c */
void ida__raft_randomize_timeout(struct ida_raft *r);
void ida__raft_become_follower(struct ida_raft *r,
                               ida_term term,
                               ida_node_id lead);
void ida__raft_campaign(struct ida_raft *r, bool pre, bool transfer);
void ida__raft_send_timeout_now(struct ida_raft *r, ida_node_id to);
void ida__raft_handle_request_vote(struct ida_raft *r,
                                   const struct ida_raft_msg *m);
void ida__raft_handle_vote_response(struct ida_raft *r,
                                    const struct ida_raft_msg *m);
bool ida__raft_quorum_active(struct ida_raft *r);

/* raft/replication.c */
struct ida_raft_progress *ida__raft_progress_of(struct ida_raft *r,
                                                ida_node_id id);
void ida__raft_become_probe(struct ida_raft_progress *pr);
void ida__raft_send_append(struct ida_raft *r,
                           struct ida_raft_progress *pr,
                           bool allow_empty);
void ida__raft_send_heartbeat(struct ida_raft *r, struct ida_raft_progress *pr);
void ida__raft_broadcast_append(struct ida_raft *r, bool allow_empty);
void ida__raft_tick_heartbeat_peer(struct ida_raft *r,
                                   struct ida_raft_progress *pr);
bool ida__raft_maybe_commit(struct ida_raft *r);
/* The commit index moved: what followers get now (replication.c). */
void ida__raft_committed(struct ida_raft *r);
int ida__raft_handle_append_response(struct ida_raft *r,
                                     const struct ida_raft_msg *m);
int ida__raft_handle_append(struct ida_raft *r, const struct ida_raft_msg *m);

/* raft/snapshot.c */
void ida__raft_send_snapshot_chunk(struct ida_raft *r,
                                   struct ida_raft_progress *pr);
void ida__raft_start_snapshot(struct ida_raft *r, struct ida_raft_progress *pr);
void ida__raft_tick_snapshot(struct ida_raft *r, struct ida_raft_progress *pr);
int ida__raft_handle_snapshot_response(struct ida_raft *r,
                                       const struct ida_raft_msg *m);
int ida__raft_handle_install_snapshot(struct ida_raft *r,
                                      const struct ida_raft_msg *m);

/* raft/rollback.c (rule A4 of raft/admission.h) */
/* IDA_ELOSTSTATE when @m shows that this node's own state went back (and
 * from then on, for every message), else 0. */
int ida__raft_check_rollback(struct ida_raft *r, const struct ida_raft_msg *m);
/* Remember the boot id and durable term a member sent. */
void ida__raft_record_seen(struct ida_raft *r, const struct ida_raft_msg *m);
/* Fill a leader heartbeat's gossip: what this node heard from each voter. */
void ida__raft_fill_gossip(struct ida_raft *r, struct ida_raft_msg *m);
/* Fill @m's from_boot, term_durable (@durable: sent after persist) and
 * what this node heard from its recipient. */
void ida__raft_fill_echo(struct ida_raft *r,
                         struct ida_raft_msg *m,
                         bool durable);

/* raft/read.c */
void ida__raft_check_reads(struct ida_raft *r);

/* raft/invariants.c */
/* Assert the core's own invariants (crash if one is broken). */
void ida__raft_check_invariants(const struct ida_raft *r);

#endif /* IDA_RAFT_INTERNAL_H */
