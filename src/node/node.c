/* idallocd: assembling a node from its parts (see node.h). */
#include "src/node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"
#include "src/node/import.h"
#include "src/node/lend.h"
#include "src/node/net_tls.h"
#include "src/node/snap_policy.h"

/* The cluster as an encoded ClusterConfig (stored in snapshot metas). */
static int encode_cluster(struct ida_node *n)
{
    Idalloc__Member m[IDA_CONFIG_NODES_MAX], *mp[IDA_CONFIG_NODES_MAX];
    Idalloc__ClusterConfig cc = IDALLOC__CLUSTER_CONFIG__INIT;
    for (unsigned i = 0; i < n->cfg.node_count; i++) {
        idalloc__member__init(&m[i]);
        m[i].id = n->cfg.nodes[i].id;
        m[i].peer_addr = n->cfg.nodes[i].peer.text;
        m[i].client_addr = n->cfg.nodes[i].client.text;
        m[i].voter = 1;
        mp[i] = &m[i];
    }
    cc.members = mp;
    cc.n_members = n->cfg.node_count;
    n->config_pb_len = idalloc__cluster_config__get_packed_size(&cc);
    n->config_pb = ida_malloc(n->config_pb_len > 0 ? n->config_pb_len : 1);
    if (n->config_pb == NULL) {
        return IDA_ENOMEM;
    }
    idalloc__cluster_config__pack(&cc, n->config_pb);
    return 0;
}

/* mkdir -p @dir (its last component included). 0 or an errno. */
static int make_dirs(const char *dir)
{
    char path[IDA_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s", dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                return errno;
            }
            *p = c;
            if (c == '\0') {
                return 0;
            }
        }
    }
}

/* The pid holding a flock on the file @fd refers to, from /proc/locks
 * (Linux); 0 if not found. */
static long flock_holder(int fd)
{
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 ? fopen("/proc/locks", "r") : NULL;
    long found = 0;
    char line[256];
    while (f != NULL && found == 0 && fgets(line, sizeof(line), f) != NULL) {
        long pid;
        unsigned maj, min;
        unsigned long ino;
        /* "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF" */
        if (sscanf(line, "%*d: FLOCK %*s %*s %ld %x:%x:%lu", &pid, &maj, &min,
                   &ino) == 4 &&
            maj == major(st.st_dev) && min == minor(st.st_dev) &&
            ino == (unsigned long)st.st_ino) {
            found = pid;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return found;
}

/* Take an exclusive flock on the data directory itself before anything
 * reads it: two processes on one LMDB environment and one Raft log would
 * each take the other's writes for their own. The fd stays open (and
 * locked) for the life of the process; the kernel drops the lock when it
 * dies, kill -9 included, so nothing stale ever blocks a restart. The
 * directory itself is locked, not a LOCK file in it: storage refuses a new
 * directory holding anything but its own files. */
static int lock_dir(struct ida_node *n, char *errmsg)
{
    int err = make_dirs(n->dir);
    if (err != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "cannot create data directory %.300s: %s", n->dir,
                 strerror(err));
        return IDA_EIO;
    }
    int fd = open(n->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "cannot open data directory %.300s: %s", n->dir,
                 strerror(errno));
        return IDA_EIO;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        long pid = e == EWOULDBLOCK ? flock_holder(fd) : 0;
        close(fd);
        if (e != EWOULDBLOCK) {
            snprintf(errmsg, IDA_ERRMSG_MAX, "cannot lock %.300s: %s", n->dir,
                     strerror(e));
        } else if (pid > 0) {
            snprintf(errmsg, IDA_ERRMSG_MAX,
                     "data directory %.300s is in use by another idallocd "
                     "(pid %ld); stop it first, or give this node another "
                     "directory (--data)",
                     n->dir, pid);
        } else {
            snprintf(errmsg, IDA_ERRMSG_MAX,
                     "data directory %.300s is in use by another idallocd; "
                     "stop it first, or give this node another directory "
                     "(--data)",
                     n->dir);
        }
        return IDA_EIO;
    }
    n->lock_fd = fd;
    return 0;
}

/* Rebuild the Raft core from storage, and load the snapshot the fsm
 * processor rebuilds the state machine from (*@snap_out, *@snap_index;
 * NULL without a snapshot) while the core and the links start. */
static int restore(struct ida_node *n,
                   ida_term *applied_term,
                   ida_index *snap_index,
                   struct ida__rebuild **rebuild_out,
                   char *errmsg)
{
    struct ida_storage *st = &n->storage;
    struct ida_raft_restore rr = {0};
    struct ida_snapshot_meta meta = {0};
    uint8_t *snap = NULL;
    struct ida__rebuild *rebuild = NULL;
    struct ida_entry *entries = NULL;
    uint64_t t0 = ida__node_mono_us(), t_load = t0;
    char why[128] = ""; /* a failure's detail storage does not hold */
    int rv = ida_storage_hard_state(st, &rr.hard_state);
    if (rv == 0) {
        rv = ida_storage_snapshot_load(st, &meta, &snap);
        t_load = ida__node_mono_us();
        if (rv == 0) {
            rr.snapshot_index = meta.index;
            rr.snapshot_term = meta.term;
            /* The core keeps only the size: chunks for followers are read
             * back from storage (raft.h contract 7). */
            rr.snapshot_in_storage = true;
            rr.snapshot_len = meta.data_size;
            n->snapshot_bytes0 = meta.data_size;
            rr.snapshot_config = meta.config;
            rr.snapshot_config_len = meta.config_len;
            /* A crash may have left log entries the snapshot covers. */
            rv = snap == NULL ? IDA_ECORRUPT /* no state: not ours */
                              : ida_storage_compact(st, meta.index);
            if (rv == 0) {
                /* The state is rebuilt from here on, beside the rest. */
                rebuild = ida__rebuild_start(snap, meta.data_size);
                snap = NULL;
                rv = rebuild == NULL ? IDA_ENOMEM : 0;
            }
        } else if (rv == IDA_ENOTFOUND) {
            rv = 0;
        }
    }
    *applied_term = meta.term;
    struct ida_storage_log_state ls;
    if (rv == 0) {
        rv = ida_storage_log_state(st, &ls);
    }
    ida_index lo = rr.snapshot_index + 1;
    if (rv == 0 && ls.first > lo) {
        lo = ls.first;
    }
    if (rv == 0 && ls.last >= lo) {
        size_t count;
        rv = ida_storage_entries(st, lo, ls.last + 1, 0, &entries, &count);
        rr.entries = entries;
        rr.n_entries = count;
    }
    if (rv == 0) {
        n->incarnation = ida_storage_incarnation(st);
        n->boot = ida_storage_boot(st);
        rv = ida_storage_membership0(st, &n->membership0, &n->membership0_len);
        if (rv == IDA_ENOTFOUND) {
            rv = 0;
            n->fresh = rr.hard_state.term == 0 && rr.snapshot_index == 0 &&
                       rr.n_entries == 0;
        }
    }
    if (rv == 0) {
        /* A directory an import seeded, not yet started with the rest of
         * its cluster (src/node/import.h, THE FIRST START RULE). */
        char mark[sizeof(n->dir) + 16];
        snprintf(mark, sizeof(mark), "%s/%s", n->dir, IDA_NODE_SEEDED_FILE);
        struct stat mst;
        if (stat(mark, &mst) == 0) {
            n->seeded = !n->fresh;
        } else if (errno != ENOENT) {
            /* Unknown is not "not seeded": the gate fails closed. */
            snprintf(why, sizeof(why), "%s %s: %s", IDA_NODE_SEEDED_FILE,
                     "cannot be read", strerror(errno));
            rv = IDA_EIO;
        }
        if (rv == 0) {
            rv = ida__raft_proc_new(n, &rr, &n->raft);
        }
    }
    if (rv != 0) {
        const char *detail = why[0] != '\0' ? why : st->errmsg;
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%.200s: cannot restore the node: "
                 "%s%s%.200s",
                 n->dir, idalloc_strerror(rv), detail[0] ? ": " : "", detail);
    } else {
        uint64_t t1 = ida__node_mono_us();
        IDA_INFO(
            "node: restored term=%llu vote=%u snapshot=%llu log=%llu..%llu "
            "in %llu ms (snapshot of %zu bytes read in %llu ms, log read in "
            "%llu ms; the state is rebuilt meanwhile)",
            (unsigned long long)rr.hard_state.term, rr.hard_state.vote,
            (unsigned long long)rr.snapshot_index, (unsigned long long)lo,
            (unsigned long long)ls.last, (unsigned long long)(t1 - t0) / 1000,
            rr.snapshot_len, (unsigned long long)(t_load - t0) / 1000,
            (unsigned long long)(t1 - t_load) / 1000);
        *snap_index = rr.snapshot_index;
        *rebuild_out = rebuild; /* the fsm processor's */
        rebuild = NULL;
    }
    ida__rebuild_drop(rebuild);
    ida_free(entries);
    ida_free(snap);
    ida_snapshot_meta_release(&meta);
    return rv;
}

/* One address of this node's (--peer, --client, --metrics) into @a. */
static int self_addr(const char *text,
                     const char *what,
                     struct ida_addr *a,
                     char *errmsg)
{
    if (ida_addr_parse(text, a) != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "bad --%s \"%.100s\": expected IPv4:PORT or [IPv6]:PORT", what,
                 text);
        return IDA_ECONFIG;
    }
    if (ida_addr_unspecified(a)) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "--%s %s is not an address other nodes can dial; give this "
                 "node's own IP",
                 what, a->text);
        return IDA_ECONFIG;
    }
    return 0;
}

/* Where this node listens: its line of the cluster file, or --peer and
 * --client (required without a line), and --metrics. Its addresses may be
 * no other node's of the file. */
static int find_self(struct ida_node *n,
                     const struct ida_node_opts *o,
                     char *errmsg)
{
    const struct ida_config_node *f = ida_config_node(&n->cfg, o->node_id);
    if (f == NULL && (o->peer_addr == NULL || o->client_addr == NULL)) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%s: no node %u in cluster %s: give its addresses with "
                 "--peer and --client (a new node joins a running cluster "
                 "with --join, see --help)",
                 o->config_path, o->node_id, n->cfg.cluster);
        return IDA_ECONFIG;
    }
    struct ida_config_node *s = &n->self_node;
    if (f != NULL) {
        *s = *f;
    } else {
        memset(s, 0, sizeof(*s));
        s->id = o->node_id;
    }
    int rv = 0;
    if (o->peer_addr != NULL && o->client_addr != NULL) {
        rv = self_addr(o->peer_addr, "peer", &s->peer, errmsg);
        rv = rv != 0 ? rv
                     : self_addr(o->client_addr, "client", &s->client, errmsg);
    }
    if (rv == 0 && o->metrics_addr != NULL) {
        rv = self_addr(o->metrics_addr, "metrics", &s->metrics, errmsg);
        s->has_metrics = rv == 0;
    }
    if (rv == 0 && node_addr_same(&s->peer, &s->client)) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "the peer and the client address are the same (%s)",
                 s->peer.text);
        rv = IDA_ECONFIG;
    }
    if (rv == 0 && s->has_metrics &&
        (node_addr_same(&s->metrics, &s->peer) ||
         node_addr_same(&s->metrics, &s->client))) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "the metrics address %s is also this node's %s address",
                 s->metrics.text,
                 node_addr_same(&s->metrics, &s->peer) ? "peer" : "client");
        rv = IDA_ECONFIG;
    }
    /* No address of this node's (metrics included) is one of another
     * node's in the file: found here, before the data directory is
     * opened, not when a listener fails to bind after it. */
    const struct ida_addr *mine[3] = {&s->peer, &s->client, &s->metrics};
    int n_mine = s->has_metrics ? 3 : 2;
    for (unsigned i = 0; rv == 0 && i < n->cfg.node_count; i++) {
        const struct ida_config_node *k = &n->cfg.nodes[i];
        const struct ida_addr *theirs[3] = {&k->peer, &k->client, &k->metrics};
        int n_theirs = k->has_metrics ? 3 : 2;
        for (int j = 0; rv == 0 && k->id != s->id && j < n_mine; j++) {
            for (int t = 0; rv == 0 && t < n_theirs; t++) {
                if (node_addr_same(mine[j], theirs[t])) {
                    snprintf(errmsg, IDA_ERRMSG_MAX,
                             "%s: address %s is node %u's in the cluster "
                             "file",
                             o->config_path, mine[j]->text, k->id);
                    rv = IDA_ECONFIG;
                }
            }
        }
    }
    n->self = s;
    return rv;
}

int ida_node_open(struct ida_node *n,
                  const struct ida_node_opts *o,
                  char *errmsg)
{
    memset(n, 0, sizeof(*n));
    n->lock_fd = -1;
    pthread_mutex_init(&n->book_mu, NULL);
    n->book_mu_init = 1;
    int rv = ida_config_load(o->config_path, &n->cfg, errmsg);
    if (rv != 0) {
        return IDA_ECONFIG; /* unreadable or bad: a usage problem either way */
    }
    rv = find_self(n, o, errmsg);
    if (rv != 0) {
        return rv;
    }
    n->join = o->join != NULL;
    n->single_node = o->single_node;
    if (n->single_node &&
        (n->cfg.node_count != 1 || n->cfg.nodes[0].id != o->node_id)) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "%s: --single-node needs a cluster file whose only node "
                 "line is node %u's (it has %u)",
                 o->config_path, o->node_id, n->cfg.node_count);
        return IDA_ECONFIG;
    }
    node_book_build(&n->book, NULL, 0, &n->cfg);
    if (n->cfg.node_count > IDA_RAFT_NODES_MAX) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s: at most %d nodes per cluster",
                 o->config_path, IDA_RAFT_NODES_MAX);
        return IDA_ECONFIG;
    }
    /* The TLS files are checked before the data directory is touched: a
     * missing or wrong key changes nothing. The net loads them again. */
    struct ida_net_tls tls;
    rv = ida_net_tls_open(&n->cfg, o->node_id, &tls, errmsg);
    if (rv != 0) {
        return rv;
    }
    ida_net_tls_close(&tls);
    ida_log_set_node(o->node_id);
    ida_log_set_level(n->cfg.log_level);
    const char *data = o->data_dir != NULL ? o->data_dir : n->cfg.data_dir;
    if (strlen(data) >= IDA_PATH_MAX) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "data directory path too long");
        return IDA_ECONFIG;
    }
    snprintf(n->dir, sizeof(n->dir), "%.*s/node%u", IDA_PATH_MAX - 1, data,
             o->node_id);
    rv = lock_dir(n, errmsg);
    if (rv != 0) {
        return rv;
    }
    struct ida_storage_opts so = {.cluster = n->cfg.cluster,
                                  .node_id = o->node_id};
    rv = ida_storage_open(&n->storage, n->dir, &so);
    if (rv != 0) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s", n->storage.errmsg);
        ida_node_close(n); /* releases the lock */
        return rv;
    }
    n->storage_open = 1;
    const struct ida_storage_identity *id = &n->storage.identity;
    if (id->upgraded_from == 1) {
        IDA_WARN(
            "storage %s: upgraded from format %u to %u; minted "
            "incarnation %016llx for it",
            n->dir, (unsigned)id->upgraded_from,
            (unsigned)IDA_STORAGE_FORMAT_VERSION,
            (unsigned long long)id->incarnation);
    } else if (id->upgraded_from != 0) {
        IDA_WARN(
            "storage %s: upgraded from format %u to %u (an idalloc older "
            "than this one no longer opens it)",
            n->dir, (unsigned)id->upgraded_from,
            (unsigned)IDA_STORAGE_FORMAT_VERSION);
    }
    IDA_INFO("storage %s: node %u incarnation %016llx%s", n->dir,
             (unsigned)id->node_id, (unsigned long long)id->incarnation,
             id->created ? " (new data directory)" : "");
    struct ida_fsm *fsm = NULL;
    ida_term applied_term = 0;
    ida_index snap_index = 0;
    struct ida__rebuild *rebuild = NULL;
    rv = encode_cluster(n);
    if (rv == 0) {
        rv = ida_fsm_new(&fsm);
    }
    if (rv == 0) {
        rv = restore(n, &applied_term, &snap_index, &rebuild, errmsg);
    }
    if (rv == 0) {
        rv = ida__storage_proc_new(n, &n->sp);
    }
    if (rv == 0) {
        rv = ida__fsm_proc_new(n, fsm, applied_term, snap_index, rebuild,
                               n->snapshot_bytes0, &n->fp);
        rebuild = NULL;             /* taken either way */
        fsm = rv == 0 ? NULL : fsm; /* owned by the processor now */
    }
    ida__rebuild_drop(rebuild);
    ida_fsm_free(fsm);
    if (rv != 0) {
        if (errmsg[0] == '\0') {
            snprintf(errmsg, IDA_ERRMSG_MAX, "%s", idalloc_strerror(rv));
        }
        ida_node_close(n);
    }
    return rv;
}

void ida__node_send_raft(struct ida_node *n, const struct ida_raft_msg *m)
{
    struct node_pb_peer pb;
    if (node_raft_to_pb(m, &pb) != 0) {
        node_pb_peer_release(&pb);
        return;
    }
    /* Snapshot turns (snap_policy.h): first-hand news only is passed on. */
    pb.msg.snapshotting = atomic_load(&n->snap_child);
    pb.msg.peer_snapshotting =
        m->type == IDA_RAFT_MSG_APPEND_ENTRIES &&
        ida_snap_relay_to(atomic_load(&n->peers_snap_relay), m->to);
    if (ida_net_send_peer(n->net, m->to, &pb.msg) == IDA_ETOOBIG) {
        /* Raft sends it again, and the same way: say so (at most every
         * 10 s; the appends are capped to fit: raft_proc.c). */
        uint64_t now = ida__node_mono_ms(),
                 last = atomic_load(&n->toobig_said_ms);
        if (now - last >= 10000 &&
            atomic_compare_exchange_strong(&n->toobig_said_ms, &last, now)) {
            IDA_ERROR(
                "net: a raft message to node %u is larger than a peer "
                "frame and was not sent",
                (unsigned)m->to);
        }
    }
    node_pb_peer_release(&pb);
}

void ida__node_reply_result(struct ida_node *n,
                            uint64_t conn,
                            uint64_t seq,
                            Idalloc__CommandResult *res,
                            ida_node_id leader)
{
    Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
    r.request_seq = seq;
    r.result = res;
    r.leader_id = leader;
    ida_metrics_request_end(n->metrics, conn, seq, (int)res->error);
    ida_net_reply(n->net, conn, &r);
}

void ida__node_reply_error(struct ida_node *n,
                           uint64_t conn,
                           uint64_t seq,
                           int err,
                           const char *why,
                           ida_node_id leader)
{
    ida__node_reply_refusal(n, conn, seq, err, why, leader, 0);
}

void ida__node_reply_refusal(struct ida_node *n,
                             uint64_t conn,
                             uint64_t seq,
                             int err,
                             const char *why,
                             ida_node_id leader,
                             int unregistered)
{
    Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    char bufs[NODE_BOOK_MAX][IDA_ADDR_TEXT_MAX], *members[NODE_BOOK_MAX];
    if (err == IDA_ENOTLEADER) {
        r.member_addrs = members;
        r.n_member_addrs = ida__node_member_addrs(n, bufs, members);
    }
    res.error = (uint32_t)err;
    res.error_msg = (char *)(why != NULL ? why : idalloc_strerror(err));
    r.request_seq = seq;
    r.result = &res;
    char leader_addr[IDA_ADDR_TEXT_MAX] = "";
    if (leader != 0) {
        pthread_mutex_lock(&n->book_mu);
        const struct node_book_entry *l = node_book_find(&n->book, leader);
        if (l != NULL) {
            memcpy(leader_addr, l->client.text, sizeof(leader_addr));
        }
        pthread_mutex_unlock(&n->book_mu);
        r.leader_id = leader;
        r.leader_addr = leader_addr;
    }
    ida_metrics_request_end(n->metrics, conn, seq, err);
    if (unregistered) {
        ida_net_reply_uncounted(n->net, conn, &r);
    } else {
        ida_net_reply(n->net, conn, &r);
    }
}

void ida__node_req_name(const uint8_t *client_id,
                        size_t len,
                        uint64_t seq,
                        char out[IDA_NODE_REQ_NAME_MAX])
{
    char hex[9] = "????????";
    for (size_t i = 0; i < 4 && i < len; i++) {
        snprintf(hex + 2 * i, 3, "%02x", client_id[i]);
    }
    hex[8] = '\0';
    snprintf(out, IDA_NODE_REQ_NAME_MAX, "%s/%llu", hex,
             (unsigned long long)seq);
}

void ida__node_book_publish(struct ida_node *n, const struct node_book *b)
{
    pthread_mutex_lock(&n->book_mu);
    n->book = *b;
    pthread_mutex_unlock(&n->book_mu);
}

size_t ida__node_member_addrs(struct ida_node *n,
                              char (*bufs)[IDA_ADDR_TEXT_MAX],
                              char **out)
{
    size_t k = 0, members = 0;
    pthread_mutex_lock(&n->book_mu);
    for (size_t i = 0; i < n->book.n; i++) {
        members += n->book.e[i].member;
    }
    /* Without a membership (a directory older than incarnations runs on the
     * cluster file's nodes): every node of the book. */
    for (size_t i = 0; i < n->book.n && k < NODE_BOOK_MAX; i++) {
        if (n->book.e[i].member || members == 0) {
            memcpy(bufs[k], n->book.e[i].client.text, IDA_ADDR_TEXT_MAX);
            out[k] = bufs[k];
            k++;
        }
    }
    pthread_mutex_unlock(&n->book_mu);
    return k;
}

int ida_node_is_new(const struct ida_node *n)
{
    return n->fresh;
}

/* --- net callbacks (on the net thread) -------------------------------------
 */

static void net_client_request(void *arg,
                               uint64_t conn,
                               Idalloc__ClientRequest *req)
{
    struct ida_node *n = arg;
    struct ida_nm_client *c = ida_malloc(sizeof(*c));
    struct ida_msg *m = c != NULL ? node_msg_new(IDA_NM_CLIENT, c) : NULL;
    int rv = m == NULL ? IDA_ENOMEM : 0;
    if (m != NULL) {
        c->conn = conn;
        c->req = req;
        rv = ida_pool_post(n->pool, n->p_raft, m);
    }
    if (rv == 0) {
        return;
    }
    /* Overloaded or stopping: answer at once, nothing was done. */
    ida__node_reply_error(n, conn, req->request_seq,
                          rv == IDA_ESTOPPED ? IDA_ESTOPPED : IDA_EBUSY, NULL,
                          0);
    if (m != NULL) {
        node_msg_free(m); /* frees c and req */
    } else {
        ida_free(c);
        idalloc__client_request__free_unpacked(req, NULL);
    }
}

static void net_peer_message(void *arg, Idalloc__PeerMessage *pm)
{
    struct ida_node *n = arg;
    struct ida_msg *m = node_msg_new(IDA_NM_PEER, pm);
    if (m == NULL) {
        idalloc__peer_message__free_unpacked(pm, NULL);
        return;
    }
    if (ida_pool_post(n->pool, n->p_raft, m) != 0) {
        node_msg_free(m); /* dropped: Raft retransmits */
    }
}

/* --- start and stop ----------------------------------------------------------
 */

/* A call that holds a processor longer than this is logged (at most a line
 * per processor every SLOW_LOG_MS) besides its metric: issue 19 allows
 * housekeeping 10 ms. */
#define SLOW_STEP_US 10000
#define SLOW_LOG_MS  10000

/* What a call of a processor was, for the log line of a slow one. */
static const char *call_name(int type)
{
    switch ((enum node_msg_type)type) {
        case IDA_NM_CLIENT:
            return "a client request";
        case IDA_NM_PEER:
            return "a peer message";
        case IDA_NM_PERSIST:
            return "a batch to make durable";
        case IDA_NM_PERSISTED:
            return "a batch made durable";
        case IDA_NM_APPLY:
            return "entries to apply";
        case IDA_NM_READ:
            return "a read";
        case IDA_NM_REGISTER:
            return "a request to answer";
        case IDA_NM_LEADERSHIP_LOST:
            return "leadership lost";
        case IDA_NM_APPLIED:
            return "entries applied";
        case IDA_NM_SNAPSHOT_TAKEN:
            return "a snapshot taken";
        case IDA_NM_SNAPSHOT_STORE:
            return "a snapshot to store";
        case IDA_NM_STORAGE_FAILED:
            return "storage failed";
        case IDA_NM_MEMBERSHIP0:
            return "the first membership";
        case IDA_NM_MEMBERSHIP0_DONE:
            return "the first membership written";
        case IDA_NM_UNTRUSTED:
            return "the directory untrusted";
        case IDA_NM_SNAPSHOT_STORED:
            return "a snapshot stored";
        case IDA_NM_SNAPSHOT_CHUNK:
            return "a snapshot chunk to send";
        case IDA_NM_SNAPSHOT_RCV:
            return "a snapshot chunk received";
        case IDA_NM_SNAPSHOT_ENC:
            return "encoded snapshot bytes";
    }
    return type < 0 ? "its periodic work" : "a message";
}

/* @type: the message's, or -1 for a ping. */
static void timed_done(struct ida__timed_proc *t, uint64_t t0_us, int type)
{
    uint64_t us = ida__node_mono_us() - t0_us;
    const char *what = t->what != NULL ? t->what : call_name(type);
    t->what = NULL;
    ida_metrics_step(t->node->metrics, t->which, us);
    if (us <= SLOW_STEP_US) {
        return;
    }
    t->slow_since++;
    uint64_t now = ida__node_mono_ms();
    if (now - t->slow_logged_ms >= SLOW_LOG_MS || t->slow_logged_ms == 0) {
        IDA_INFO(
            "node: one call (%s) held the %s processor %.1f ms (%llu calls "
            "over %u ms since the last such line; "
            "idalloc_processor_step_duration_seconds)",
            what, ida_metrics_proc_name(t->which), (double)us / 1000.0,
            (unsigned long long)t->slow_since, SLOW_STEP_US / 1000);
        t->slow_logged_ms = now;
        t->slow_since = 0;
    }
}

static void timed_receive(void *state,
                          struct ida_msg *msg,
                          struct ida_sender *s)
{
    struct ida__timed_proc *t = state;
    uint64_t t0 = ida__node_mono_us();
    int type = (int)msg->type; /* (@msg is gone after the call) */
    t->ops->receive(t->state, msg, s);
    timed_done(t, t0, type);
}

static void timed_ping(void *state, struct ida_sender *s)
{
    struct ida__timed_proc *t = state;
    uint64_t t0 = ida__node_mono_us();
    t->ops->ping(t->state, s);
    timed_done(t, t0, -1);
}

/* The processors' calls, timed (struct ida__timed_proc). */
static const struct ida_proc_ops timed_ops = {timed_receive, timed_ping};

static int add_procs(struct ida_node *n)
{
    n->timed[IDA_MPROC_RAFT] = (struct ida__timed_proc){
        n, &ida__raft_proc_ops, n->raft, IDA_MPROC_RAFT, 0, 0, NULL};
    n->timed[IDA_MPROC_STORAGE] = (struct ida__timed_proc){
        n, &ida__storage_proc_ops, n->sp, IDA_MPROC_STORAGE, 0, 0, NULL};
    n->timed[IDA_MPROC_FSM] = (struct ida__timed_proc){
        n, &ida__fsm_proc_ops, n->fp, IDA_MPROC_FSM, 0, 0, NULL};
    struct ida_proc_config pc[3] = {
        {.name = "raft",
         .ops = &timed_ops,
         .state = &n->timed[IDA_MPROC_RAFT],
         .inbox_capacity = 65536,
         .ping_interval_us = ida__raft_proc_tick_ms(n) * 1000},
        {.name = "storage",
         .ops = &timed_ops,
         .state = &n->timed[IDA_MPROC_STORAGE],
         .inbox_capacity = 65536,
         .ping_interval_us = 10000},
        {.name = "fsm",
         .ops = &timed_ops,
         .state = &n->timed[IDA_MPROC_FSM],
         .inbox_capacity = 65536,
         .ping_interval_us = 10000},
    };
    uint32_t *ids[3] = {&n->p_raft, &n->p_storage, &n->p_fsm};
    for (int i = 0; i < 3; i++) {
        int rv = ida_pool_add(n->pool, &pc[i], ids[i]);
        if (rv != 0) {
            return rv;
        }
    }
    return 0;
}

int ida_node_start(struct ida_node *n, char *errmsg)
{
    n->errtop_where = (struct ida_errtop_where){n->dir, n->self->id};
    /* One worker per processor: a storage fsync never stalls raft or fsm,
     * and no long fsm step (a backup's copy of the state, a big apply)
     * delays raft's heartbeats. Two workers (raft and fsm together) were
     * measured: 5 to 7% more allocs/s at 1 to 64 clients, none at 256
     * (three alternating rounds), but raft then waited for fsm's long steps
     * (seven ticks-late warnings of 150 to 1,700 ms per 10 M bench-scale
     * run instead of one, and a backup at 10 M, copied in line, would hold
     * a leader's heartbeats for ~0.9 s).
     * An idle worker sleeps until its next ping is due (idle_wait_us is
     * only a cap: a message wakes it).
     * spin_us stays 0: with 3 nodes and the clients on 2 cores, a worker
     * that spins takes the core a busy processor needs; measured at 10
     * and 50 us, neither won (allocs/s equal or lower at 64 and 256
     * clients, p99 higher), nor did the cheaper spin of session 35 at
     * 50 us (1-client p50 0.94 and 0.90 ms against 0.86 and 0.82). */
    struct ida_pool_config pcfg = {.threads = 3, .idle_wait_us = 100000};
    ida_errtop_sink(&pcfg.errors, &n->errtop_where);
    n->metrics = ida_metrics_new(n->self->id);
    int rv = n->metrics == NULL ? IDA_ENOMEM : 0;
    if (rv == 0) {
        rv = ida_pool_new(&pcfg, &n->pool);
    }
    if (rv == 0) {
        rv = add_procs(n);
    }
    struct ida_net_config nc = {
        .cluster = &n->cfg,
        .self_id = n->self->id,
        .self = n->self,
        .client_queue_bytes_max = (size_t)n->cfg.client_queue_bytes_max,
        .client_output_bytes_max = (size_t)n->cfg.client_output_bytes_max,
        .client_input_bytes_max = (size_t)n->cfg.client_input_bytes_max,
        .client_connections_max = (unsigned)n->cfg.client_connections_max,
        .client_connections_reserve =
            (unsigned)n->cfg.client_connections_reserve,
        .client_idle_timeout_ms = (unsigned)n->cfg.client_idle_timeout_ms,
        .client_frame_timeout_ms = (unsigned)n->cfg.client_frame_timeout_ms,
    };
    /* Whether a link is up is asked of net when needed (status, member
     * list): no peer_state callback. */
    struct ida_net_handler h = {net_client_request, net_peer_message, NULL, n};
    if (rv == 0) {
        rv = ida_net_start(&nc, &h, &n->net, errmsg);
    }
    if (rv == 0 && n->self->has_metrics) {
        ida_metrics_set_net(n->metrics, n->net);
        rv = ida_metrics_start(n->metrics, &n->self->metrics, errmsg);
    }
    if (rv == 0) {
        rv = ida_pool_start(n->pool);
    }
    if (rv != 0) {
        if (errmsg[0] == '\0') {
            snprintf(errmsg, IDA_ERRMSG_MAX, "cannot start: %s",
                     idalloc_strerror(rv));
        }
        ida_node_close(n);
        return rv;
    }
    IDA_INFO(
        "node: started, cluster %s, peers on %s, clients on %s, data in "
        "%s%s%s",
        n->cfg.cluster, n->self->peer.text, n->self->client.text, n->dir,
        n->self->has_metrics ? ", metrics on http://" : "",
        n->self->has_metrics ? n->self->metrics.text : "");
    return 0;
}

void ida_node_close(struct ida_node *n)
{
    /* Processors first (the storage step in flight completes: a receive()
     * is never interrupted), while net still exists for their sends; then
     * net; then the state they used. DRAIN: what is still queued goes
     * through receive(), which frees each payload (the pool alone would
     * free only the message around it); sends made meanwhile are refused
     * with IDA_ESTOPPED and freed by node_send(). Scrapes end first: they
     * read net's counters. */
    ida_metrics_stop(n->metrics);
    if (n->pool != NULL) {
        ida_pool_stop(n->pool, IDA_POOL_STOP_DRAIN);
    }
    if (n->net != NULL) {
        ida_net_stop(n->net);
        n->net = NULL;
    }
    if (n->pool != NULL) {
        ida_pool_close(n->pool);
        n->pool = NULL;
    }
    ida__raft_proc_free(n->raft);
    ida__storage_proc_free(n->sp);
    ida__fsm_proc_free(n->fp);
    n->raft = NULL;
    n->sp = NULL;
    n->fp = NULL;
    ida_metrics_free(n->metrics); /* nothing records any more */
    n->metrics = NULL;
    if (n->storage_open) {
        ida_storage_close(&n->storage);
        n->storage_open = 0;
    }
    ida_free(n->config_pb);
    n->config_pb = NULL;
    ida_free(n->membership0);
    n->membership0 = NULL;
    if (n->lock_fd >= 0) {
        close(n->lock_fd); /* last: the directory is ours until here */
        n->lock_fd = -1;
    }
    if (n->book_mu_init) {
        pthread_mutex_destroy(&n->book_mu);
        n->book_mu_init = 0;
    }
}
