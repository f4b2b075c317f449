#include "src/node/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/collapse.h"
#include "base/heap.h"
#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"

#define BUCKETS 16
static const double bucket_s[BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};

struct histo
{
    atomic_uint_fast64_t le[BUCKETS]; /* not cumulative; summed in render */
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t sum_us;
};

#define OUTCOMES   6 /* enum ida_err_class, then not_leader */
#define INFLIGHT   16384
#define PROBES     8
#define STALE_US   (60ull * 1000000)
#define HEALTHY_US (3ull * 1000000)

struct inflight
{
    uint64_t conn, seq, t0_us; /* t0_us 0: free */
    int op;
};

struct ida_metrics
{
    unsigned node_id;
    struct MHD_Daemon *httpd;
    atomic_uint_fast64_t requests[IDA_MOP_COUNT_][OUTCOMES];
    struct histo latency[IDA_MOP_COUNT_];
    pthread_mutex_t mu; /* the in-flight table and the pool text */
    struct inflight fl[INFLIGHT];
    char *pools;
    size_t pools_len;
    atomic_uint_fast64_t sessions;
    /* raft */
    atomic_uint_fast64_t term, commit, applied, log_first, log_last;
    atomic_uint leader;
    atomic_int role; /* index in role_names */
    atomic_uint_fast64_t raft_seen_us;
    atomic_uint_fast64_t leader_changes, proposals_failed;
    /* storage */
    struct histo fsync;
    atomic_uint_fast64_t bytes_written;
    atomic_uint_fast64_t raft_batches; /* made durable */
    /* snapshots */
    struct histo snap_duration, snap_store, snap_install;
    /* processors' calls */
    struct histo steps[IDA_MPROC_COUNT_];
    atomic_uint_fast64_t longest_step_us[IDA_MPROC_COUNT_];
    atomic_uint_fast64_t snapshots, snapshot_bytes;
    struct ida_net *net;
};

static const char *const op_names[IDA_MOP_COUNT_] = {
    "other",   "pool_create", "alloc",  "free",   "lookup",        "list",
    "reserve", "prefix",      "status", "member", "snapshot_read", "restore"};
static const char *const outcome_names[OUTCOMES] = {
    "ok", "definite", "bad_request", "unknown", "internal", "not_leader"};
/* "seeded": imported, waiting for the other nodes (src/node/import.h),
 * as `idalloc status` says. */
static const char *const role_names[] = {"follower", "pre-candidate",
                                         "candidate", "leader", "seeded"};
#define ROLES (sizeof(role_names) / sizeof(role_names[0]))

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void observe(struct histo *h, uint64_t us)
{
    double s = (double)us / 1e6;
    for (int i = 0; i < BUCKETS; i++) {
        if (s <= bucket_s[i]) {
            atomic_fetch_add(&h->le[i], 1);
            break;
        }
    }
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_us, us);
}

struct ida_metrics *ida_metrics_new(unsigned node_id)
{
    struct ida_metrics *m = ida_calloc(1, sizeof(*m));
    if (m == NULL) {
        return NULL;
    }
    m->node_id = node_id;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

enum ida_metrics_op ida_metrics_op_of(int op)
{
    switch (op) {
        case IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE:
            return IDA_MOP_POOL_CREATE;
        case IDALLOC__CLIENT_REQUEST__OP_ALLOC:
            return IDA_MOP_ALLOC;
        case IDALLOC__CLIENT_REQUEST__OP_FREE:
            return IDA_MOP_FREE;
        case IDALLOC__CLIENT_REQUEST__OP_LOOKUP:
            return IDA_MOP_LOOKUP;
        case IDALLOC__CLIENT_REQUEST__OP_LIST:
            return IDA_MOP_LIST;
        case IDALLOC__CLIENT_REQUEST__OP_RESERVE:
            return IDA_MOP_RESERVE;
        case IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC:
            return IDA_MOP_PREFIX;
        case IDALLOC__CLIENT_REQUEST__OP_STATUS:
            return IDA_MOP_STATUS;
        case IDALLOC__CLIENT_REQUEST__OP_MEMBER_LIST:
        case IDALLOC__CLIENT_REQUEST__OP_MEMBER_CHANGE:
        case IDALLOC__CLIENT_REQUEST__OP_LEADER_TRANSFER:
            return IDA_MOP_MEMBER;
        case IDALLOC__CLIENT_REQUEST__OP_SNAPSHOT_READ:
            return IDA_MOP_SNAPSHOT_READ;
        case IDALLOC__CLIENT_REQUEST__OP_RESTORE:
            return IDA_MOP_RESTORE;
        default:
            return IDA_MOP_OTHER;
    }
}

/* --- hooks ---------------------------------------------------------------- */

static size_t slot_of(uint64_t conn, uint64_t seq)
{
    uint64_t h = (conn * 0x9e3779b97f4a7c15ull) ^ (seq * 0xc2b2ae3d27d4eb4full);
    return (size_t)((h ^ (h >> 31)) % INFLIGHT);
}

void ida_metrics_request_begin(struct ida_metrics *m,
                               uint64_t conn,
                               uint64_t seq,
                               enum ida_metrics_op op)
{
    if (m == NULL) {
        return;
    }
    uint64_t t = now_us();
    size_t s = slot_of(conn, seq);
    pthread_mutex_lock(&m->mu);
    for (int k = 0; k < PROBES; k++) {
        struct inflight *f = &m->fl[(s + (size_t)k) % INFLIGHT];
        if (f->t0_us == 0 || t - f->t0_us > STALE_US ||
            (f->conn == conn && f->seq == seq)) {
            *f = (struct inflight){conn, seq, t, (int)op};
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void ida_metrics_request_end(struct ida_metrics *m,
                             uint64_t conn,
                             uint64_t seq,
                             int err)
{
    if (m == NULL) {
        return;
    }
    int op = IDA_MOP_OTHER;
    uint64_t t0 = 0;
    size_t s = slot_of(conn, seq);
    pthread_mutex_lock(&m->mu);
    for (int k = 0; k < PROBES; k++) {
        struct inflight *f = &m->fl[(s + (size_t)k) % INFLIGHT];
        if (f->t0_us != 0 && f->conn == conn && f->seq == seq) {
            op = f->op;
            t0 = f->t0_us;
            f->t0_us = 0;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    unsigned c = (unsigned)idalloc_errclass(err);
    c = err == IDA_ENOTLEADER ? OUTCOMES - 1
        : c < OUTCOMES - 1    ? c
                              : IDA_ERR_CLASS_INTERNAL;
    atomic_fetch_add(&m->requests[op][c], 1);
    if (t0 != 0) {
        observe(&m->latency[op], now_us() - t0);
    }
}

void ida_metrics_raft(struct ida_metrics *m,
                      uint64_t term,
                      const char *role,
                      unsigned leader,
                      uint64_t commit,
                      uint64_t log_first,
                      uint64_t log_last)
{
    if (m == NULL) {
        return;
    }
    atomic_store(&m->term, term);
    for (size_t i = 0; i < ROLES; i++) {
        if (strcmp(role, role_names[i]) == 0) {
            atomic_store(&m->role, (int)i);
        }
    }
    unsigned was = atomic_exchange(&m->leader, leader);
    if (leader != 0 && leader != was) {
        /* A leader seen: the first one, another one, or the same one again
         * after an interregnum (a new term): etcd's leader_changes_seen. */
        atomic_fetch_add(&m->leader_changes, 1);
    }
    atomic_store(&m->commit, commit);
    atomic_store(&m->log_first, log_first);
    atomic_store(&m->log_last, log_last);
    atomic_store(&m->raft_seen_us, now_us());
}

void ida_metrics_applied(struct ida_metrics *m, uint64_t index)
{
    if (m != NULL) {
        atomic_store(&m->applied, index);
    }
}

void ida_metrics_proposal_failed(struct ida_metrics *m)
{
    if (m != NULL) {
        atomic_fetch_add(&m->proposals_failed, 1);
    }
}

void ida_metrics_fsync(struct ida_metrics *m,
                       uint64_t micros,
                       uint64_t bytes,
                       uint64_t batches)
{
    if (m != NULL) {
        observe(&m->fsync, micros);
        atomic_fetch_add(&m->bytes_written, bytes);
        atomic_fetch_add(&m->raft_batches, batches);
    }
}

void ida_metrics_snapshot(struct ida_metrics *m,
                          uint64_t bytes,
                          uint64_t micros)
{
    if (m != NULL) {
        observe(&m->snap_duration, micros);
        atomic_fetch_add(&m->snapshots, 1);
        atomic_store(&m->snapshot_bytes, bytes);
    }
}

void ida_metrics_snapshot_stored(struct ida_metrics *m, uint64_t micros)
{
    if (m != NULL) {
        observe(&m->snap_store, micros);
    }
}

void ida_metrics_snapshot_installed(struct ida_metrics *m, uint64_t micros)
{
    if (m != NULL) {
        observe(&m->snap_install, micros);
    }
}

const char *ida_metrics_proc_name(enum ida_metrics_proc proc)
{
    static const char *const names[IDA_MPROC_COUNT_] = {"raft", "storage",
                                                        "fsm"};
    return (unsigned)proc < IDA_MPROC_COUNT_ ? names[proc] : "?";
}

void ida_metrics_step(struct ida_metrics *m,
                      enum ida_metrics_proc proc,
                      uint64_t micros)
{
    if (m == NULL || (unsigned)proc >= IDA_MPROC_COUNT_) {
        return;
    }
    observe(&m->steps[proc], micros);
    uint64_t was = atomic_load(&m->longest_step_us[proc]);
    while (micros > was && !atomic_compare_exchange_weak(
                               &m->longest_step_us[proc], &was, micros)) {
    }
}

void ida_metrics_set_net(struct ida_metrics *m, struct ida_net *net)
{
    m->net = net;
}

void ida_metrics_pools(struct ida_metrics *m,
                       const char *text,
                       size_t len,
                       uint64_t sessions)
{
    if (m == NULL) {
        return;
    }
    atomic_store(&m->sessions, sessions);
    char *copy = ida_malloc(len + 1);
    if (copy == NULL) {
        return; /* the previous table stays: a scrape shows it */
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    pthread_mutex_lock(&m->mu);
    char *old = m->pools;
    m->pools = copy;
    m->pools_len = len;
    pthread_mutex_unlock(&m->mu);
    ida_free(old);
}

int ida_metrics_healthy(struct ida_metrics *m)
{
    uint64_t seen = atomic_load(&m->raft_seen_us);
    return atomic_load(&m->leader) != 0 && seen != 0 &&
           now_us() - seen < HEALTHY_US;
}

/* --- exposition ------------------------------------------------------------
 */

struct out
{
    char *p;
    size_t len, cap;
    int oom;
};

static void put(struct out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !o->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = (o->cap + (size_t)n + 1) * 2;
        char *p = ida_realloc(o->p, cap);
        if (p == NULL) {
            o->oom = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
}

static void head(struct out *o,
                 const char *name,
                 const char *type,
                 const char *help)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histo(struct out *o,
                  const char *name,
                  const char *labels,
                  const struct histo *h)
{
    uint64_t cum = 0;
    const char *sep = labels[0] != '\0' ? "," : "";
    for (int i = 0; i < BUCKETS; i++) {
        cum += atomic_load(&h->le[i]);
        put(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
            bucket_s[i], (unsigned long long)cum);
    }
    uint64_t count = atomic_load(&h->count);
    put(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
        (unsigned long long)count);
    const char *l = labels[0] != '\0' ? "{" : "";
    const char *r = labels[0] != '\0' ? "}" : "";
    put(o, "%s_sum%s%s%s %.6f\n", name, l, labels, r,
        (double)atomic_load(&h->sum_us) / 1e6);
    put(o, "%s_count%s%s%s %llu\n", name, l, labels, r,
        (unsigned long long)count);
}

static void gauge(struct out *o, const char *name, const char *help, double v)
{
    head(o, name, "gauge", help);
    put(o, "%s %.17g\n", name, v);
}

static void counter(struct out *o,
                    const char *name,
                    const char *help,
                    uint64_t v)
{
    head(o, name, "counter", help);
    put(o, "%s %llu\n", name, (unsigned long long)v);
}

/* The huge-page collapser's work (base/collapse.h): one per process. */
static void huge_pages(struct out *o)
{
    struct ida_collapse_stats cs = ida_collapse_stats();
    gauge(o, "idalloc_huge_page_collapser_running",
          "1 while the thread that collapses written memory into huge pages "
          "runs (huge_page_collapse on, and the kernel can), else 0.",
          ida_collapse_running() ? 1 : 0);
    head(o, "idalloc_huge_page_pieces_total", "counter",
         "2 MiB pieces the collapser took, by what it found: collapsed, "
         "huge already, or left alone (pages not in memory, or the kernel "
         "refused).");
    static const char *const res[] = {"collapsed", "already", "skipped"};
    const uint64_t v[] = {cs.collapsed, cs.already, cs.skipped};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        put(o, "idalloc_huge_page_pieces_total{result=\"%s\"} %llu\n", res[i],
            (unsigned long long)v[i]);
    }
    gauge(o, "idalloc_huge_page_pieces_waiting",
          "2 MiB pieces queued for the collapser and not taken yet.",
          (double)cs.waiting);
    counter(o, "idalloc_huge_page_ranges_dropped_total",
            "Written ranges only hinted to khugepaged: the collapser's queue "
            "was full.",
            cs.dropped);
    counter(o, "idalloc_huge_page_sweeps_total",
            "Sweeps of the process's memory by the collapser.", cs.sweeps);
}

char *ida_metrics_render(struct ida_metrics *m, size_t *len)
{
    struct out o = {0};
    o.cap = 16384;
    o.p = ida_malloc(o.cap);
    if (o.p == NULL) {
        return NULL;
    }
    head(&o, "idalloc_node_info", "gauge", "This node's id (always 1).");
    put(&o, "idalloc_node_info{node=\"%u\"} 1\n", m->node_id);
    head(&o, "idalloc_requests_total", "counter",
         "Client requests answered, by operation and outcome (ok, definite "
         "no, bad_request, unknown outcome, internal error).");
    for (int op = 0; op < IDA_MOP_COUNT_; op++) {
        for (int c = 0; c < OUTCOMES; c++) {
            uint64_t v = atomic_load(&m->requests[op][c]);
            if (v > 0 || (c == 0 && op != IDA_MOP_OTHER)) {
                put(&o,
                    "idalloc_requests_total{op=\"%s\",outcome=\"%s\"} %llu\n",
                    op_names[op], outcome_names[c], (unsigned long long)v);
            }
        }
    }
    head(&o, "idalloc_request_duration_seconds", "histogram",
         "From the raft processor's receipt of a request to its answer.");
    for (int op = 1; op < IDA_MOP_COUNT_; op++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "op=\"%s\"", op_names[op]);
        histo(&o, "idalloc_request_duration_seconds", labels, &m->latency[op]);
    }
    gauge(&o, "idalloc_raft_term", "Current Raft term.",
          (double)atomic_load(&m->term));
    head(&o, "idalloc_raft_role", "gauge", "1 for this node's Raft role.");
    int role = atomic_load(&m->role);
    for (size_t i = 0; i < ROLES; i++) {
        put(&o, "idalloc_raft_role{role=\"%s\"} %d\n", role_names[i],
            (int)i == role);
    }
    gauge(&o, "idalloc_raft_leader_id",
          "The leader this node follows (0: none).",
          (double)atomic_load(&m->leader));
    gauge(&o, "idalloc_raft_commit_index", "Highest index known committed.",
          (double)atomic_load(&m->commit));
    gauge(&o, "idalloc_raft_applied_index",
          "Highest index applied to the state machine.",
          (double)atomic_load(&m->applied));
    uint64_t first = atomic_load(&m->log_first),
             last = atomic_load(&m->log_last);
    gauge(&o, "idalloc_raft_log_entries", "Log entries held (not compacted).",
          last >= first && last > 0 ? (double)(last - first + 1) : 0);
    counter(&o, "idalloc_raft_leader_changes_total",
            "Leaders this node has seen (the first, another, or the same one "
            "in a new term).",
            atomic_load(&m->leader_changes));
    counter(&o, "idalloc_raft_proposals_failed_total",
            "Batches of client commands the Raft core refused to propose.",
            atomic_load(&m->proposals_failed));
    head(&o, "idalloc_storage_fsync_duration_seconds", "histogram",
         "Duration of one durable storage step (one LMDB commit, fsync "
         "included).");
    histo(&o, "idalloc_storage_fsync_duration_seconds", "", &m->fsync);
    counter(&o, "idalloc_storage_written_bytes_total",
            "Log entry bytes made durable.", atomic_load(&m->bytes_written));
    counter(&o, "idalloc_storage_raft_batches_total",
            "Raft batches made durable (those queued behind one another "
            "share a storage step).",
            atomic_load(&m->raft_batches));
    counter(&o, "idalloc_snapshots_total", "Snapshots the state machine took.",
            atomic_load(&m->snapshots));
    gauge(&o, "idalloc_snapshot_size_bytes", "Size of the last snapshot.",
          (double)atomic_load(&m->snapshot_bytes));
    head(&o, "idalloc_snapshot_duration_seconds", "histogram",
         "Time to encode a snapshot of the state machine.");
    histo(&o, "idalloc_snapshot_duration_seconds", "", &m->snap_duration);
    head(&o, "idalloc_snapshot_store_duration_seconds", "histogram",
         "Time to make a snapshot durable and compact the log.");
    histo(&o, "idalloc_snapshot_store_duration_seconds", "", &m->snap_store);
    head(&o, "idalloc_snapshot_install_duration_seconds", "histogram",
         "Time to restore a snapshot received from the leader.");
    histo(&o, "idalloc_snapshot_install_duration_seconds", "",
          &m->snap_install);
    head(&o, "idalloc_processor_step_duration_seconds", "histogram",
         "Duration of one call of a processor (a message received, or its "
         "periodic ping): the time it held that processor.");
    for (int i = 0; i < IDA_MPROC_COUNT_; i++) {
        char labels[32];
        snprintf(labels, sizeof(labels), "processor=\"%s\"",
                 ida_metrics_proc_name((enum ida_metrics_proc)i));
        histo(&o, "idalloc_processor_step_duration_seconds", labels,
              &m->steps[i]);
    }
    head(&o, "idalloc_processor_longest_step_seconds", "gauge",
         "The longest call of a processor since the node started.");
    for (int i = 0; i < IDA_MPROC_COUNT_; i++) {
        put(&o,
            "idalloc_processor_longest_step_seconds{processor=\"%s\"} "
            "%.6f\n",
            ida_metrics_proc_name((enum ida_metrics_proc)i),
            (double)atomic_load(&m->longest_step_us[i]) / 1e6);
    }
    huge_pages(&o);
    if (m->net != NULL) {
        struct ida_net_stats st;
        ida_net_get_stats(m->net, &st);
        gauge(&o, "idalloc_client_connections", "Client connections open.",
              (double)st.clients_open);
        counter(&o, "idalloc_client_connections_closed_by_limits_total",
                "Client connections refused at the limit, evicted, timed out "
                "or closed over a buffer cap (src/node/net.h).",
                st.clients_closed_by_limits);
        counter(&o, "idalloc_client_requests_received_total",
                "Client requests decoded.", st.client_requests);
        counter(&o, "idalloc_client_requests_rejected_total",
                "Client frames refused (oversized, undecodable).",
                st.client_rejected);
        counter(&o, "idalloc_peer_messages_sent_total", "Peer messages sent.",
                st.peer_sent);
        counter(&o, "idalloc_peer_messages_dropped_total",
                "Peer messages dropped (queue full, no connection).",
                st.peer_dropped);
        counter(&o, "idalloc_peer_messages_received_total",
                "Peer messages received.", st.peer_received);
        counter(&o, "idalloc_peer_messages_rejected_total",
                "Peer messages refused (another cluster, undecodable).",
                st.peer_rejected);
    }
    gauge(&o, "idalloc_sessions", "Client sessions the state machine holds.",
          (double)atomic_load(&m->sessions));
    pthread_mutex_lock(&m->mu);
    if (m->pools != NULL) {
        put(&o, "%s", m->pools);
    }
    pthread_mutex_unlock(&m->mu);
    if (o.oom) {
        ida_free(o.p);
        return NULL;
    }
    *len = o.len;
    return o.p;
}

/* --- HTTP ------------------------------------------------------------------
 */

static enum MHD_Result answer(struct MHD_Connection *c,
                              unsigned status,
                              const char *type,
                              const char *body,
                              size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rv = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rv;
}

static enum MHD_Result on_request(void *cls,
                                  struct MHD_Connection *c,
                                  const char *url,
                                  const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    (void)upload_data;
    (void)con_cls;
    struct ida_metrics *m = cls;
    if (strcmp(method, "GET") != 0 || *upload_data_size != 0) {
        const char *t = "only GET\n";
        return answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", t,
                      strlen(t));
    }
    if (strcmp(url, "/healthz") == 0) {
        int ok = ida_metrics_healthy(m);
        const char *t =
            ok ? "ok: a leader is known\n" : "unavailable: no leader known\n";
        return answer(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                      "text/plain", t, strlen(t));
    }
    if (strcmp(url, "/metrics") == 0) {
        size_t len;
        char *text = ida_metrics_render(m, &len);
        if (text == NULL) {
            const char *t = "out of memory\n";
            return answer(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", t,
                          strlen(t));
        }
        enum MHD_Result rv =
            answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                   text, len);
        ida_free(text);
        return rv;
    }
    const char *t = "not found: GET /metrics or /healthz\n";
    return answer(c, MHD_HTTP_NOT_FOUND, "text/plain", t, strlen(t));
}

int ida_metrics_start(struct ida_metrics *m,
                      const struct ida_addr *addr,
                      char *errmsg)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (addr->family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(addr->port);
        inet_pton(AF_INET6, addr->host, &a->sin6_addr);
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons(addr->port);
        inet_pton(AF_INET, addr->host, &a->sin_addr);
    }
    m->httpd = MHD_start_daemon(
        flags, addr->port, NULL, NULL, on_request, m, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)8,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (m->httpd == NULL) {
        snprintf(errmsg, IDA_ERRMSG_MAX,
                 "cannot serve metrics on %s (address in use or not "
                 "local?); fix metrics= on this node's line",
                 addr->text);
        return IDA_EIO;
    }
    return 0;
}

void ida_metrics_stop(struct ida_metrics *m)
{
    if (m != NULL && m->httpd != NULL) {
        MHD_stop_daemon(m->httpd);
        m->httpd = NULL;
    }
}

void ida_metrics_free(struct ida_metrics *m)
{
    if (m == NULL) {
        return;
    }
    ida_metrics_stop(m);
    pthread_mutex_destroy(&m->mu);
    ida_free(m->pools);
    ida_free(m);
}
