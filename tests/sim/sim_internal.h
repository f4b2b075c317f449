/* Declarations shared by the simulator's files (tests/sim/sim*.c): its
 * constants, state and the helpers one part calls in another. Not for the
 * tests: they use tests/sim/sim.h. */
#ifndef IDA_SIM_INTERNAL_H
#define IDA_SIM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/types.h"
#include "fsm/fsm.h"
#include "raft/raft.h"
#include "tests/sim/sim.h"

#define NODES_MAX         8 /* slots: 5 + replacements */
#define CLIENTS           4
#define TICK_MS           10
#define ELECTION_TICKS    10
#define HEARTBEAT_TICKS   2
#define CLIENT_TIMEOUT_MS 400
#define LIVENESS_BOUND_MS 3000
#define SNAPSHOT_EVERY    24 /* applied entries between app snapshots */
#define NEVER             UINT64_MAX

/* --- the allocator ---------------------------------------------------------
 * Every node runs the real allocator state machine (fsm/). A client request
 * is one command in a CommandBatch of its own (one log entry); each client
 * has TAGS tags of its own ("c<client>-t<k>") in one bounded pool of
 * BOUNDED_SIZE ids, so its lookups have exact expected answers, and shares a
 * sequence pool and a prefix pool with the others. tests/sim/sim_alloc.c
 * keeps the model of what was acknowledged and checks every answer. */
#define TAGS         5
#define BOUNDED_SIZE 16 /* fewer ids than tags: exhaustion and reuse happen */
#define RESERVE_MAX  8

enum sim_op {
    SIM_OP_CREATE_BOUNDED = 0,
    SIM_OP_CREATE_SEQUENCE,
    SIM_OP_CREATE_PREFIX,
    SIM_OP_ALLOC,
    SIM_OP_FREE,
    SIM_OP_RESERVE,
    SIM_OP_PREFIX,
    SIM_OP_LOOKUP, /* a ReadIndex read */
};

struct sim_req
{
    enum sim_op op;
    int tag;        /* ALLOC, FREE, PREFIX, LOOKUP */
    uint64_t id;    /* FREE */
    uint64_t count; /* RESERVE */
};

/* What the clients were told, as the checks of sim_alloc.c need it. */
struct sim_model
{
    uint64_t held[CLIENTS][TAGS]; /* id + 1 the tag holds, 0: none */
    uint32_t owner[BOUNDED_SIZE]; /* client * TAGS + tag + 1, 0: free */
    uint8_t pfx[CLIENTS][TAGS][IDA_PREFIX_BYTES_MAX];
    uint8_t pfx_len[CLIENTS][TAGS]; /* 0: no prefix acknowledged yet */
    bool created[3];                /* pool creates answered "created" */
};

struct packet
{
    uint64_t at;
    uint64_t seq;
    struct ida_raft_msg m; /* entries / data point into the copies below */
    struct ida_entry *ents;
    uint8_t *blob;
    uint8_t *conf; /* InstallSnapshot config bytes */
};

struct write
{
    uint64_t id;
    bool has_hs;
    struct ida_hard_state hs;
    bool has_snap;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap;
    size_t snap_len;
    uint8_t *snap_conf;
    size_t snap_conf_len;
    struct ida_entry *ents;
    size_t n_ents;
    struct packet *msgs; /* after-persist messages, not yet scheduled */
    size_t n_msgs;
};

struct disk
{
    struct ida_hard_state hs;
    ida_index snap_index;
    ida_term snap_term;
    uint8_t *snap;
    size_t snap_len;
    uint8_t *snap_conf; /* the snapshot's encoded config, NULL: bootstrap */
    size_t snap_conf_len;
    struct ida_entry *ents;
    size_t n, cap;
    uint64_t boots; /* starts counted (raft/admission.h rule A4) */
};

struct proposal
{
    int client;
    uint64_t seq;
    ida_index index;
    ida_term term;
};

struct pread
{
    int client;
    uint64_t ctx;
    ida_index index; /* 0 until the core confirmed it */
};

struct node
{
    ida_node_id id;
    bool up;
    bool dead; /* removed from the cluster for good */
    /* The data directory's incarnation (raft/admission.h), never 0, and the
     * bootstrap membership written when the directory was created: the
     * first cluster's, or the one a live peer had when the node (re)joined.
     * Both survive crashes; an emptied disk gets new ones. */
    uint64_t inc;
    struct ida_raft_conf boot;
    bool needs_boot; /* emptied: learn the membership from a peer first */
    /* An older copy of the durable image (the rollback fault). */
    struct disk old;
    bool has_old;
    /* The image a rolled-back node had before its disk went back: what it
     * acknowledged from (the commit durability check counts it). */
    struct disk rolled;
    bool has_rolled;
    /* Told by a peer that its state went back (rule A4): stopped, and
     * emptied by the operator once that can be done safely. */
    bool untrusted;
    /* The image the previous incarnation had when its disk was emptied: the
     * commit durability check judges acknowledgements of that incarnation
     * against what it held. */
    struct disk lost;
    uint64_t lost_inc;
    struct ida_raft raft;
    struct disk disk;
    struct write *writes;
    size_t n_writes, cap_writes;
    uint64_t sync_at;
    uint64_t next_tick;
    uint64_t restart_at;
    struct ida_fsm *fsm;   /* NULL while down */
    uint64_t chain;        /* hash of every result applied, in order */
    ida_index last_commit; /* this incarnation */
    enum ida_raft_role last_role;
    struct proposal props[64];
    size_t n_props;
    struct pread reads[16];
    size_t n_reads;
    /* A leader's snapshot under a check that goes on outside the core
     * (IDA_RAFT_CHECK_PENDING, on every other pair of starts): its verdict
     * is given at check_at (NEVER: none pending), as a node's checking
     * thread gives it some time later. */
    struct sim *sim;
    uint64_t check_at;
    ida_index check_index;
    ida_term check_term;
    int check_rv;
    uint64_t check_hash; /* of the bytes under check */
};

struct client
{
    uint64_t seq; /* current request */
    bool busy;
    bool is_read;
    struct sim_req req;
    uint64_t sent_at;
    uint64_t timeout_at;
    uint64_t next_at;  /* next send / resend */
    int target;        /* node index */
    uint64_t *answers; /* result hash by seq; 0: none */
    size_t cap_answers;
    bool done_after_heal;
};

struct lm_slot
{
    ida_index index;
    ida_term term;
    uint64_t hash;
    ida_term prev_term;
};

struct sim
{
    struct sim_opts o;
    struct sim_result *res;
    uint64_t rng;
    uint64_t now;
    int n;      /* node slots in use (ids 1..n) */
    int n_boot; /* the bootstrap cluster: ids 1..n_boot */
    struct node nodes[NODES_MAX];
    struct client clients[CLIENTS];
    /* network */
    struct packet *net;
    size_t n_net, cap_net;
    uint64_t pkt_seq;
    bool blocked[NODES_MAX][NODES_MAX];
    unsigned loss_pct, dup_pct, delay_max_ms;
    uint64_t next_fault;
    uint64_t garbage_at; /* next garbage message (opts.garbage), or NEVER */
    uint64_t heal_at;
    uint64_t healed_at; /* NEVER until the faults healed */
    bool faults_on;
    ida_node_id retire; /* a removed leader: dies once it stepped down */
    /* The emptied node being re-admitted (raft/admission.h A3), 0: none. At
     * most one at a time, so a majority of every membership stays able to
     * vote. */
    ida_node_id rejoin;
    uint64_t rejoin_next;
    /* The scripted lost-disk scenario (sim_fault.c): phase 1 isolated
     * follower scen_c of leader scen_l; phase 2 runs at scen_at. */
    int scen_phase;
    ida_node_id scen_l, scen_c;
    uint64_t scen_at;
    bool pre_vote; /* per seed: both settings must be safe */
    bool check_quorum;
    /* global knowledge */
    ida_term *glob_term; /* committed entries by index */
    uint64_t *glob_hash;
    uint64_t *glob_chain; /* result chain after applying index */
    uint64_t *glob_snap;  /* hash of the snapshot bytes at index, 0: none */
    size_t glob_len, glob_cap;
    size_t glob_applied;
    ida_node_id *leaders; /* by term */
    size_t cap_leaders;
    struct lm_slot *lm; /* log matching table, open addressing */
    size_t lm_cap, lm_used;
    struct sim_model model;
    uint64_t *ids_seen; /* bitmap over sequence ids handed out to clients */
    size_t ids_cap;
    bool failed;
    bool oom;
    size_t chunks_unfilled; /* InstallSnapshot chunks dropped (fill_chunk) */
};

#define CTX_SHIFT 48 /* read ctx: client << CTX_SHIFT | seq */

/* tests/sim/sim.c */
uint64_t sim__rnd(uint64_t *s);
uint64_t sim__below(uint64_t *s, uint64_t n);
bool sim__chance(uint64_t *s, unsigned percent);
void sim__hash_in(struct sim *s,
                  uint64_t a,
                  uint64_t b,
                  uint64_t c,
                  uint64_t d);
void sim__tracef(struct sim *s, const char *fmt, ...);
void sim__violation(struct sim *s, const char *fmt, ...);
void *sim__grow(struct sim *s, void *p, size_t *cap, size_t need, size_t elem);
uint64_t sim__entry_hash(const struct ida_entry *e);

/* tests/sim/sim_fsm.c */
uint8_t *sim__cmd_encode(struct sim *s,
                         int client,
                         uint64_t seq,
                         const struct sim_req *r,
                         size_t *len);
void sim__client_id(int client, uint8_t out[IDA_CLIENT_ID_BYTES]);
void sim__tag_name(char *buf, size_t n, int client, int tag);
uint64_t sim__result_hash(const struct ida_fsm_result *r);
uint64_t sim__bytes_hash(const uint8_t *p, size_t n);
bool sim__fsm_snapshot_hash(struct sim *s,
                            const struct ida_fsm *f,
                            uint64_t *hash);

/* tests/sim/sim_alloc.c */
void sim__alloc_next_req(struct sim *s, int client, struct sim_req *r);
void sim__alloc_acked(struct sim *s,
                      int client,
                      uint64_t seq,
                      const struct sim_req *r,
                      const struct ida_fsm_result *res);
void sim__alloc_read(struct sim *s,
                     int client,
                     uint64_t seq,
                     const struct sim_req *r,
                     int rv,
                     uint64_t id);
void sim__alloc_final(struct sim *s, struct node *ld);
bool sim__raft_checks(const struct sim *s);

/* tests/sim/sim_net.c */
void sim__packet_free(struct packet *p);
bool sim__packet_copy(struct packet *p, const struct ida_raft_msg *m);
int sim__node_slot(const struct sim *s, ida_node_id id);
const char *sim__msg_desc(const struct ida_raft_msg *m, char *buf, size_t n);
void sim__net_send(struct sim *s, struct packet *p);

/* tests/sim/sim_disk.c */
void sim__disk_free_entries_from(struct disk *d, size_t k);
ida_term sim__disk_term_at(const struct disk *d, ida_index i);
void sim__write_free(struct write *w);
void sim__disk_apply(struct sim *s, struct node *nd, struct write *w);
void sim__disk_apply_part(struct sim *s,
                          struct node *nd,
                          struct write *w,
                          size_t n_ents);

/* tests/sim/sim_check.c */
void sim__lm_check(struct sim *s, struct node *nd, const struct ida_entry *e);
void sim__check_leader(struct sim *s, struct node *nd);
void sim__check_commit(struct sim *s, struct node *nd);

/* tests/sim/sim_client.c */
void sim__client_answer(struct sim *s,
                        int ci,
                        uint64_t seq,
                        const struct ida_fsm_result *res);
void sim__client_retry(struct sim *s, int ci, ida_node_id hint);
void sim__client_read_answer(struct sim *s,
                             int ci,
                             uint64_t ctx,
                             int rv,
                             uint64_t id);
void sim__client_tick(struct sim *s, int ci);

/* tests/sim/sim_node.c */
void sim__serve_reads(struct sim *s, struct node *nd);
void sim__drain(struct sim *s, struct node *nd);
void sim__node_step(struct sim *s,
                    struct node *nd,
                    const struct ida_raft_msg *m);
void sim__node_sync(struct sim *s, struct node *nd);
void sim__node_checked(struct sim *s, struct node *nd);
int sim__node_start(struct sim *s, struct node *nd);
void sim__node_crash(struct sim *s, struct node *nd);
void sim__node_wipe(struct sim *s, struct node *nd);
void sim__disk_free(struct disk *d);
bool sim__disk_copy(struct disk *dst, const struct disk *src);
uint64_t sim__new_inc(struct sim *s);

/* tests/sim/sim_fault.c */
struct node *sim__find_leader(struct sim *s);
void sim__retire_removed_leader(struct sim *s);
void sim__fault(struct sim *s);
/* One garbage message from a non-member to a random live node, checked to
 * change nothing (opts.garbage). */
void sim__garbage(struct sim *s);
void sim__heal(struct sim *s);
void sim__rejoin_step(struct sim *s);
void sim__scenario_step(struct sim *s);
bool sim__boot_from_peer(struct sim *s, struct node *nd);
/* Empty the directory of a node that learned its state went back (rule A4
 * of raft/admission.h), once that is safe, as the operator would. */
void sim__untrusted_step(struct sim *s, struct node *nd);
bool sim__liveness_done(struct sim *s);
void sim__liveness_final_check(struct sim *s);

#endif /* IDA_SIM_INTERNAL_H */
