/* The node's network layer on real loopback sockets: peer messages both
 * ways, reconnect after a restart, client requests and replies, and bad
 * input (garbage, oversized frames, foreign cluster) closing only the
 * offending connection. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* nanosleep-based, as usleep is not POSIX 2008. */
static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000,
                          .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

#include "base/log.h"
#include "idalloc_errors.h"
#include "src/common/frame.h"
#include "src/node/net.h"
#include "tests/lib/harness.h"

/* --- fixture: up to 3 nets, each recording what it receives ----------------
 */

#define GOT_MAX 1024
struct inbox
{
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ida_net *net;
    int npeer, nclient, ups, downs;
    uint64_t peer_term[GOT_MAX];
    unsigned peer_from[GOT_MAX];
    uint64_t client_seq[GOT_MAX];
    uint64_t client_conn[GOT_MAX];
    int echo; /* answer each client request with its seq * 10 */
};

static struct ida_config cfg;
static struct inbox box[3];
static struct ida_net *nets[3];

static void on_client(void *arg, uint64_t conn, Idalloc__ClientRequest *req)
{
    struct inbox *b = arg;
    pthread_mutex_lock(&b->mu);
    if (b->nclient < GOT_MAX) {
        b->client_seq[b->nclient] = req->request_seq;
        b->client_conn[b->nclient] = conn;
        b->nclient++;
    }
    pthread_cond_broadcast(&b->cv);
    int echo = b->echo;
    pthread_mutex_unlock(&b->mu);
    if (echo) {
        Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
        Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
        Idalloc__ReserveResult rr = IDALLOC__RESERVE_RESULT__INIT;
        rr.first = req->request_seq * 10;
        rr.count = 1;
        res.result_case = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
        res.reserve = &rr;
        r.request_seq = req->request_seq;
        r.result = &res;
        int rr_rv = ida_net_reply(b->net, conn, &r);
        if (rr_rv != 0) {
            fprintf(stderr, "reply failed: %d\n", rr_rv);
        }
    }
    idalloc__client_request__free_unpacked(req, NULL);
}

static void on_peer(void *arg, Idalloc__PeerMessage *m)
{
    struct inbox *b = arg;
    pthread_mutex_lock(&b->mu);
    if (b->npeer < GOT_MAX) {
        b->peer_term[b->npeer] = m->term;
        b->peer_from[b->npeer] = m->from;
        b->npeer++;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    idalloc__peer_message__free_unpacked(m, NULL);
}

static void on_state(void *arg, unsigned node, int up)
{
    struct inbox *b = arg;
    (void)node;
    pthread_mutex_lock(&b->mu);
    if (up) {
        b->ups++;
    } else {
        b->downs++;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void make_config(int nodes, const char *cluster)
{
    char text[1024];
    int off =
        snprintf(text, sizeof(text), "cluster %s\npeer_tls off\n", cluster);
    for (int i = 1; i <= nodes; i++) {
        off += snprintf(text + off, sizeof(text) - (size_t)off,
                        "node %d 127.0.0.1:%u 127.0.0.1:%u\n", i,
                        tc_free_port(), tc_free_port());
    }
    char err[IDA_ERRMSG_MAX];
    cr_assert_eq(ida_config_parse(text, strlen(text), "t", &cfg, err), 0, "%s",
                 err);
}

/* Start node @i + 1 of cluster file @c (borrowed until it stops). */
static void start_net_of(int i, const struct ida_config *c)
{
    struct ida_net_config nc = {.cluster = c,
                                .self_id = (unsigned)i + 1,
                                .max_frame_bytes = 1024,
                                .reconnect_min_ms = 10,
                                .reconnect_max_ms = 50};
    struct ida_net_handler h = {on_client, on_peer, on_state, &box[i]};
    char err[IDA_ERRMSG_MAX];
    cr_assert_eq(ida_net_start(&nc, &h, &nets[i], err), 0, "%s", err);
    box[i].net = nets[i];
}

static void start_net(int i)
{
    start_net_of(i, &cfg);
}

/* @c with a node @id (new, or moved) at fresh loopback ports. */
static void add_node(struct ida_config *c, unsigned id)
{
    const struct ida_config_node *old = ida_config_node(c, id);
    struct ida_config_node *n = old != NULL ? (struct ida_config_node *)old
                                            : &c->nodes[c->node_count++];
    *n = c->nodes[0];
    n->id = id;
    n->peer.port = (uint16_t)tc_free_port();
    n->client.port = (uint16_t)tc_free_port();
    snprintf(n->peer.text, sizeof(n->peer.text), "127.0.0.1:%u", n->peer.port);
    snprintf(n->client.text, sizeof(n->client.text), "127.0.0.1:%u",
             n->client.port);
}

static void boxes_init(void)
{
    for (int i = 0; i < 3; i++) {
        memset(&box[i], 0, sizeof(box[i]));
        pthread_mutex_init(&box[i].mu, NULL);
        pthread_cond_init(&box[i].cv, NULL);
    }
}

static void setup(void)
{
    ida_log_set_level(IDA_LOG_ERROR);
    make_config(2, "test");
    boxes_init();
    start_net(0);
    start_net(1);
}

static void teardown(void)
{
    for (int i = 0; i < 3; i++) {
        if (nets[i] != NULL) {
            ida_net_stop(nets[i]);
            nets[i] = NULL;
        }
    }
}

/* Wait (at most 5 s) until *counter reaches @want. */
static int wait_for(struct inbox *b, int *counter, int want)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&b->mu);
    while (*counter < want) {
        if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) != 0) {
            break;
        }
    }
    int got = *counter;
    pthread_mutex_unlock(&b->mu);
    return got >= want;
}

/* Send peer messages until one arrives (the connection may still be coming
 * up; dropped messages are expected then). */
static void send_until_received(int from, int to, uint64_t term)
{
    int before = box[to].npeer;
    for (int i = 0; i < 500 && box[to].npeer == before; i++) {
        Idalloc__PeerMessage m = IDALLOC__PEER_MESSAGE__INIT;
        Idalloc__TimeoutNow tn = IDALLOC__TIMEOUT_NOW__INIT;
        m.term = term;
        m.msg_case = IDALLOC__PEER_MESSAGE__MSG_TIMEOUT_NOW;
        m.timeout_now = &tn;
        cr_assert_eq(ida_net_send_peer(nets[from], (unsigned)to + 1, &m), 0);
        sleep_us(10000);
    }
    cr_assert(wait_for(&box[to], &box[to].npeer, before + 1),
              "no peer message %d -> %d", from + 1, to + 1);
}

/* --- raw client helpers
 * ------------------------------------------------------- */

static int raw_connect(int node)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(cfg.nodes[node].client.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void raw_send_request(int fd, uint64_t seq)
{
    Idalloc__ClientRequest q = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__Status st = IDALLOC__STATUS__INIT;
    uint8_t cid[16] = {1};
    q.version = IDA_WIRE_VERSION;
    q.client_id.data = cid;
    q.client_id.len = 16;
    q.request_seq = seq;
    q.op_case = IDALLOC__CLIENT_REQUEST__OP_STATUS;
    q.status = &st;
    uint8_t buf[256];
    size_t n = idalloc__client_request__get_packed_size(&q);
    ida_frame_header_encode(buf, IDA_FRAME_CLIENT_REQUEST, n);
    idalloc__client_request__pack(&q, buf + IDA_FRAME_HEADER_BYTES);
    cr_assert_eq(write(fd, buf, n + IDA_FRAME_HEADER_BYTES),
                 (ssize_t)(n + IDA_FRAME_HEADER_BYTES));
}

/* @count status requests, seqs first.., in one write. */
static void raw_send_many(int fd, uint64_t first, int count)
{
    static uint8_t buf[GOT_MAX * 64];
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        Idalloc__ClientRequest q = IDALLOC__CLIENT_REQUEST__INIT;
        Idalloc__Status st = IDALLOC__STATUS__INIT;
        uint8_t cid[16] = {1};
        q.version = IDA_WIRE_VERSION;
        q.client_id.data = cid;
        q.client_id.len = 16;
        q.request_seq = first + (uint64_t)i;
        q.op_case = IDALLOC__CLIENT_REQUEST__OP_STATUS;
        q.status = &st;
        size_t n = idalloc__client_request__get_packed_size(&q);
        cr_assert_leq(off + IDA_FRAME_HEADER_BYTES + n, sizeof(buf));
        ida_frame_header_encode(buf + off, IDA_FRAME_CLIENT_REQUEST, n);
        idalloc__client_request__pack(&q, buf + off + IDA_FRAME_HEADER_BYTES);
        off += IDA_FRAME_HEADER_BYTES + n;
    }
    cr_assert_eq(send(fd, buf, off, MSG_NOSIGNAL), (ssize_t)off);
}

/* Reply to the recorded requests [from, to) of box 0 from this thread, as
 * fast as ida_net_reply() goes: many land in one wake-up of the loop. */
static void reply_recorded(int from, int to)
{
    for (int i = from; i < to; i++) {
        Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
        Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
        Idalloc__ReserveResult rr = IDALLOC__RESERVE_RESULT__INIT;
        rr.first = box[0].client_seq[i] * 10;
        rr.count = 1;
        res.result_case = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
        res.reserve = &rr;
        r.request_seq = box[0].client_seq[i];
        r.result = &res;
        cr_assert_eq(ida_net_reply(nets[0], box[0].client_conn[i], &r), 0);
    }
}

/* Wait (at most 5 s) until the net's published stats show @replies replies
 * and no reply bytes queued (the sweep publishes them). */
static int output_released(int node, uint64_t replies)
{
    struct ida_net_stats st = {0};
    for (int i = 0; i < 500; i++) {
        ida_net_get_stats(nets[node], &st);
        if (st.client_replies == replies && st.client_output_bytes == 0) {
            return 1;
        }
        sleep_us(10000);
    }
    cr_log_error("replies %llu (want %llu), output bytes %llu",
                 (unsigned long long)st.client_replies,
                 (unsigned long long)replies,
                 (unsigned long long)st.client_output_bytes);
    return 0;
}

/* Read one response frame; returns NULL on EOF. */
static Idalloc__ClientResponse *raw_read_response(int fd)
{
    uint8_t hdr[IDA_FRAME_HEADER_BYTES], body[2048];
    if (recv(fd, hdr, sizeof(hdr), MSG_WAITALL) != (ssize_t)sizeof(hdr)) {
        return NULL;
    }
    cr_assert_eq(hdr[0], IDA_FRAME_MAGIC);
    cr_assert_eq(hdr[1], IDA_FRAME_CLIENT_RESPONSE);
    uint32_t len = ((uint32_t)hdr[4] << 8) | hdr[5];
    cr_assert_lt(len, sizeof(body));
    cr_assert_eq(recv(fd, body, len, MSG_WAITALL), (ssize_t)len);
    return idalloc__client_response__unpack(NULL, len, body);
}

/* True when the server closed @fd (EOF within 5 s). */
static int closed_by_server(int fd)
{
    char c;
    for (;;) {
        ssize_t r = recv(fd, &c, 1, 0);
        if (r == 0) {
            return 1;
        }
        if (r < 0) {
            return 0;
        }
    }
}

/* --- tests ------------------------------------------------------------------
 */

Test(net, peers_talk_both_ways, .init = setup, .fini = teardown)
{
    send_until_received(0, 1, 7);
    send_until_received(1, 0, 9);
    cr_assert_eq(box[1].peer_from[box[1].npeer - 1], 1);
    cr_assert_eq(box[1].peer_term[box[1].npeer - 1], 7);
    cr_assert_eq(box[0].peer_from[box[0].npeer - 1], 2);
    cr_assert(ida_net_peer_up(nets[0], 2));
    cr_assert_eq(
        ida_net_send_peer(nets[0], 1,
                          &(Idalloc__PeerMessage)IDALLOC__PEER_MESSAGE__INIT),
        IDA_EINVAL, "sending to oneself is refused");
    cr_assert_eq(
        ida_net_send_peer(nets[0], 9,
                          &(Idalloc__PeerMessage)IDALLOC__PEER_MESSAGE__INIT),
        IDA_EINVAL, "unknown peer");
}

/* Node 1 gave up on node 2 for a long backoff (20 s) while node 2 was
 * down; node 2 comes up and speaks first on its own link: node 1 dials it
 * at once instead of waiting the backoff out (a wiped node catching up
 * hears from the leader only on the leader's link). */
static void setup_slow_first(void)
{
    ida_log_set_level(IDA_LOG_ERROR);
    make_config(2, "test");
    boxes_init();
    struct ida_net_config nc = {.cluster = &cfg,
                                .self_id = 1,
                                .max_frame_bytes = 1024,
                                .reconnect_min_ms = 20000,
                                .reconnect_max_ms = 20000};
    struct ida_net_handler h = {on_client, on_peer, on_state, &box[0]};
    char err[IDA_ERRMSG_MAX];
    cr_assert_eq(ida_net_start(&nc, &h, &nets[0], err), 0, "%s", err);
    box[0].net = nets[0];
}

Test(net,
     a_peer_that_speaks_first_is_dialled_at_once,
     .init = setup_slow_first,
     .fini = teardown)
{
    sleep_us(300000); /* node 1's first dial failed: 20 s to the next */
    cr_assert_not(ida_net_peer_up(nets[0], 2));
    start_net(1);
    send_until_received(1, 0, 3);
    for (int i = 0; i < 200 && !ida_net_peer_up(nets[0], 2); i++) {
        sleep_us(10000);
    }
    cr_assert(ida_net_peer_up(nets[0], 2), "node 1 waited for its backoff");
    send_until_received(0, 1, 4);
}

Test(net, peer_reconnects_after_restart, .init = setup, .fini = teardown)
{
    send_until_received(0, 1, 1);
    ida_net_stop(nets[1]);
    nets[1] = NULL;
    cr_assert(wait_for(&box[0], &box[0].downs, 1), "peer down not noticed");
    /* Messages to a dead peer are dropped, never block. */
    for (int i = 0; i < 100; i++) {
        Idalloc__PeerMessage m = IDALLOC__PEER_MESSAGE__INIT;
        cr_assert_eq(ida_net_send_peer(nets[0], 2, &m), 0);
    }
    box[1].npeer = 0;
    start_net(1);
    send_until_received(0, 1, 2);
    cr_assert_geq(box[0].ups, 2, "came up twice");
    struct ida_net_stats st;
    ida_net_get_stats(nets[0], &st);
    cr_assert_geq(st.peer_dropped, 100);
}

Test(net,
     client_requests_and_pipelined_replies,
     .init = setup,
     .fini = teardown)
{
    box[0].echo = 1;
    int fd = raw_connect(0);
    for (uint64_t s = 1; s <= 50; s++) {
        raw_send_request(fd, s);
    }
    for (uint64_t s = 1; s <= 50; s++) {
        Idalloc__ClientResponse *r = raw_read_response(fd);
        cr_assert_not_null(r);
        cr_assert_eq(r->request_seq, s, "replies in order on one connection");
        cr_assert_eq(r->result->reserve->first, s * 10);
        idalloc__client_response__free_unpacked(r, NULL);
    }
    close(fd);
    cr_assert_eq(box[0].nclient, 50);
}

Test(net,
     reply_to_closed_connection_is_dropped,
     .init = setup,
     .fini = teardown)
{
    int fd = raw_connect(0);
    raw_send_request(fd, 1);
    cr_assert(wait_for(&box[0], &box[0].nclient, 1));
    close(fd);
    sleep_us(50000);
    Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
    cr_assert_eq(ida_net_reply(nets[0], box[0].client_conn[0], &r), 0);
    cr_assert_eq(ida_net_reply(nets[0], 999999, &r), 0,
                 "an unknown connection id is not an error for the caller");
    /* Still serving. */
    box[0].echo = 1;
    int fd2 = raw_connect(0);
    raw_send_request(fd2, 5);
    Idalloc__ClientResponse *got = raw_read_response(fd2);
    cr_assert_not_null(got);
    idalloc__client_response__free_unpacked(got, NULL);
    close(fd2);
}

Test(net, garbage_closes_only_that_connection, .init = setup, .fini = teardown)
{
    box[0].echo = 1;
    int good = raw_connect(0);
    int bad = raw_connect(0);
    cr_assert_eq(write(bad, "GET / HTTP/1.1\r\n\r\n", 18), 18);
    cr_assert(closed_by_server(bad), "garbage must close the connection");
    close(bad);
    raw_send_request(good, 3);
    Idalloc__ClientResponse *r = raw_read_response(good);
    cr_assert_not_null(r,
                       "the other connection still works (requests seen: %d)",
                       box[0].nclient);
    idalloc__client_response__free_unpacked(r, NULL);
    close(good);
    struct ida_net_stats st;
    ida_net_get_stats(nets[0], &st);
    cr_assert_geq(st.client_rejected, 1);
}

Test(net, oversized_and_undecodable_frames, .init = setup, .fini = teardown)
{
    int fd = raw_connect(0);
    uint8_t hdr[IDA_FRAME_HEADER_BYTES];
    ida_frame_header_encode(hdr, IDA_FRAME_CLIENT_REQUEST, 1025);
    cr_assert_eq(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
    cr_assert(closed_by_server(fd), "oversized frame must close");
    close(fd);
    /* A well-framed payload that is not a protobuf message. */
    fd = raw_connect(0);
    uint8_t buf[IDA_FRAME_HEADER_BYTES + 4] = {0};
    ida_frame_header_encode(buf, IDA_FRAME_CLIENT_REQUEST, 4);
    memcpy(buf + IDA_FRAME_HEADER_BYTES, "\xff\xff\xff\xff", 4);
    cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
    Idalloc__ClientResponse *r = raw_read_response(fd);
    cr_assert_not_null(r, "an undecodable request gets an error answer");
    cr_assert_eq(r->result->error, IDA_EPROTO);
    idalloc__client_response__free_unpacked(r, NULL);
    cr_assert(closed_by_server(fd));
    close(fd);
    cr_assert_eq(box[0].nclient, 0, "nothing reached the handler");
}

static struct ida_config other;

Test(net, foreign_cluster_peer_is_rejected, .init = setup, .fini = teardown)
{
    /* A node of cluster "other" that knows node 1's addresses. */
    other = cfg;
    strcpy(other.cluster, "other");
    add_node(&other, 3);
    start_net_of(2, &other);
    for (int i = 0; i < 50; i++) {
        Idalloc__PeerMessage m = IDALLOC__PEER_MESSAGE__INIT;
        ida_net_send_peer(nets[2], 1, &m);
        sleep_us(5000);
    }
    struct ida_net_stats st;
    ida_net_get_stats(nets[0], &st);
    cr_assert_geq(st.peer_rejected, 1, "foreign cluster not rejected");
    cr_assert_eq(box[0].npeer, 0, "nothing foreign reached the handler");
}

/* A node that is not in the book (a node asking to join) is heard; it is
 * sent to, and dialled, only once the book names it. */
Test(net,
     a_node_outside_the_book_is_heard_then_dialled_once_added,
     .init = setup,
     .fini = teardown)
{
    other = cfg;
    add_node(&other, 3);
    start_net_of(2, &other);
    send_until_received(2, 0, 5);
    cr_assert_eq(box[0].peer_from[box[0].npeer - 1], 3);
    Idalloc__PeerMessage m = IDALLOC__PEER_MESSAGE__INIT;
    cr_assert_eq(ida_net_send_peer(nets[0], 3, &m), IDA_EINVAL,
                 "not in the book: not sent to");
    cr_assert_not(ida_net_peer_up(nets[0], 3));
    struct ida_net_peer book[2] = {{2, cfg.nodes[1].peer},
                                   {3, other.nodes[2].peer}};
    cr_assert_eq(ida_net_set_peers(nets[0], book, 2), 0);
    send_until_received(0, 2, 6);
    cr_assert(ida_net_peer_up(nets[0], 3));
    send_until_received(0, 1, 7); /* node 2 kept its link */
}

/* A node dropped from the book: its link closes, nothing more goes to it;
 * a node whose address changed is dialled at the new one. */
Test(net, the_book_drops_and_moves_peers, .init = setup, .fini = teardown)
{
    send_until_received(0, 1, 1);
    cr_assert_eq(ida_net_set_peers(nets[0], NULL, 0), 0);
    cr_assert(wait_for(&box[0], &box[0].downs, 1), "link to 2 not closed");
    Idalloc__PeerMessage m = IDALLOC__PEER_MESSAGE__INIT;
    cr_assert_eq(ida_net_send_peer(nets[0], 2, &m), IDA_EINVAL);
    cr_assert_not(ida_net_peer_up(nets[0], 2));
    /* Node 2 comes back elsewhere. */
    ida_net_stop(nets[1]);
    nets[1] = NULL;
    other = cfg;
    add_node(&other, 2);
    start_net_of(1, &other);
    struct ida_net_peer old = {2, cfg.nodes[1].peer};
    cr_assert_eq(ida_net_set_peers(nets[0], &old, 1), 0);
    sleep_us(200000); /* dialled (in vain) at the old address first */
    struct ida_net_peer moved = {2, other.nodes[1].peer};
    cr_assert_eq(ida_net_set_peers(nets[0], &moved, 1), 0);
    send_until_received(0, 1, 2);
    cr_assert(ida_net_peer_up(nets[0], 2));
    struct ida_net_peer too_many[IDA_NET_PEERS_MAX + 2];
    for (unsigned i = 0; i < IDA_NET_PEERS_MAX + 2; i++) {
        too_many[i] = (struct ida_net_peer){i + 2, cfg.nodes[1].peer};
    }
    cr_assert_eq(ida_net_set_peers(nets[0], too_many, IDA_NET_PEERS_MAX + 2),
                 IDA_ELIMIT);
    send_until_received(0, 1, 3); /* nothing changed */
}

Test(net, address_in_use_is_a_clear_error, .init = setup, .fini = teardown)
{
    struct ida_net_config nc = {.cluster = &cfg, .self_id = 1};
    struct ida_net_handler h = {on_client, on_peer, NULL, &box[2]};
    char err[IDA_ERRMSG_MAX];
    struct ida_net *dup;
    cr_assert_eq(ida_net_start(&nc, &h, &dup, err), IDA_EIO);
    cr_assert(strstr(err, cfg.nodes[0].peer.text) != NULL, "%s", err);
    nc.self_id = 42;
    cr_assert_eq(ida_net_start(&nc, &h, &dup, err), IDA_EINVAL);
}

/* --- client port limits ----------------------------------------------------
 */

static void restart_net0_with_limits(void)
{
    ida_net_stop(nets[0]);
    struct ida_net_config nc = {.cluster = &cfg,
                                .self_id = 1,
                                .max_frame_bytes = 1024,
                                .client_connections_max = 3,
                                .client_connections_reserve = 1,
                                .client_idle_timeout_ms = 1000,
                                .client_frame_timeout_ms = 200,
                                .reconnect_min_ms = 10,
                                .reconnect_max_ms = 50};
    struct ida_net_handler h = {on_client, on_peer, on_state, &box[0]};
    char err[IDA_ERRMSG_MAX];
    cr_assert_eq(ida_net_start(&nc, &h, &nets[0], err), 0, "%s", err);
    box[0].net = nets[0];
}

Test(net, idle_and_frame_timeouts, .init = setup, .fini = teardown)
{
    restart_net0_with_limits();
    box[0].echo = 1;
    int partial = raw_connect(0);
    int idle = raw_connect(0);
    int active = raw_connect(0);
    uint8_t hdr[IDA_FRAME_HEADER_BYTES];
    ida_frame_header_encode(hdr, IDA_FRAME_CLIENT_REQUEST, 100);
    cr_assert_eq(write(partial, hdr, 3), 3); /* half a header */
    /* The active one asks every 100 ms for 1.5 s: never idle. */
    for (int i = 0; i < 15; i++) {
        raw_send_request(active, (uint64_t)i + 1);
        Idalloc__ClientResponse *r = raw_read_response(active);
        cr_assert_not_null(r, "the active connection was closed");
        idalloc__client_response__free_unpacked(r, NULL);
        sleep_us(100000);
    }
    cr_assert(closed_by_server(partial), "frame timeout");
    cr_assert(closed_by_server(idle), "idle timeout");
    close(partial);
    close(idle);
    close(active);
    struct ida_net_stats st;
    for (int i = 0; i < 100; i++) { /* published by the next sweep */
        ida_net_get_stats(nets[0], &st);
        if (st.clients_closed_by_limits >= 2 && st.client_input_bytes == 0) {
            break;
        }
        sleep_us(10000);
    }
    cr_assert_geq(st.clients_closed_by_limits, 2);
    cr_assert_eq(st.client_input_bytes, 0, "buffers given back");
}

Test(net, reserve_slot_takes_only_status, .init = setup, .fini = teardown)
{
    restart_net0_with_limits();
    box[0].echo = 1;
    /* Three ordinary slots, kept active; the fourth connection lands in
     * the reserve: status is answered, anything else refused. */
    int k[3];
    for (int i = 0; i < 3; i++) {
        k[i] = raw_connect(0);
        raw_send_request(k[i], 1);
        Idalloc__ClientResponse *r = raw_read_response(k[i]);
        cr_assert_not_null(r);
        idalloc__client_response__free_unpacked(r, NULL);
    }
    int res = raw_connect(0);
    raw_send_request(res, 9); /* a status request */
    Idalloc__ClientResponse *r = raw_read_response(res);
    cr_assert_not_null(r, "status on the reserve");
    cr_assert_eq(r->request_seq, 9);
    idalloc__client_response__free_unpacked(r, NULL);
    /* Something other than status: refused with IDA_EBUSY, closed. */
    Idalloc__ClientRequest q = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__Lookup lk = IDALLOC__LOOKUP__INIT;
    lk.pool = (ProtobufCBinaryData){1, (uint8_t *)"p"};
    lk.tag = (ProtobufCBinaryData){1, (uint8_t *)"t"};
    uint8_t cid[16] = {1};
    q.version = IDA_WIRE_VERSION;
    q.client_id.data = cid;
    q.client_id.len = 16;
    q.request_seq = 10;
    q.op_case = IDALLOC__CLIENT_REQUEST__OP_LOOKUP;
    q.lookup = &lk;
    uint8_t buf[256];
    size_t n = idalloc__client_request__get_packed_size(&q);
    ida_frame_header_encode(buf, IDA_FRAME_CLIENT_REQUEST, n);
    idalloc__client_request__pack(&q, buf + IDA_FRAME_HEADER_BYTES);
    cr_assert_eq(write(res, buf, n + IDA_FRAME_HEADER_BYTES),
                 (ssize_t)(n + IDA_FRAME_HEADER_BYTES));
    r = raw_read_response(res);
    cr_assert_not_null(r);
    cr_assert_eq(r->request_seq, 10);
    cr_assert_eq(r->result->error, IDA_EBUSY);
    idalloc__client_response__free_unpacked(r, NULL);
    cr_assert(closed_by_server(res));
    close(res);
    /* A sixth, with the reserve free again: reserve. A seventh while all
     * are active (< 1 s): refused, closed at once. */
    int r6 = raw_connect(0);
    raw_send_request(r6, 11);
    r = raw_read_response(r6);
    cr_assert_not_null(r);
    idalloc__client_response__free_unpacked(r, NULL);
    for (int i = 0; i < 3; i++) { /* active again just now */
        raw_send_request(k[i], 2);
        r = raw_read_response(k[i]);
        cr_assert_not_null(r);
        idalloc__client_response__free_unpacked(r, NULL);
    }
    int r7 = raw_connect(0);
    cr_assert(closed_by_server(r7), "no slot: closed");
    close(r7);
    close(r6);
    for (int i = 0; i < 3; i++) {
        close(k[i]);
    }
}

/* Replies queued in one wake-up leave in one uv_write of several buffers
 * (more than one write past 256 frames). Echo mode replies from the read
 * callback, so the replies to the frames of one read (64 KiB, about 2000
 * of these) share a wake-up: every reply arrives whole and in
 * order, and write_cb releases the output count of each one (the limits'
 * accounting goes back to exactly 0). */
Test(net,
     coalesced_replies_arrive_in_order_and_release_their_bytes,
     .init = setup,
     .fini = teardown)
{
    const int count = 600;
    box[0].echo = 1; /* replies queued by the read callback: one wake-up */
    int fd = raw_connect(0);
    raw_send_many(fd, 1, count);
    for (int s = 1; s <= count; s++) {
        Idalloc__ClientResponse *r = raw_read_response(fd);
        cr_assert_not_null(r, "reply %d missing", s);
        cr_assert_eq(r->request_seq, (uint64_t)s, "replies in order");
        cr_assert_eq(r->result->reserve->first, (uint64_t)s * 10);
        idalloc__client_response__free_unpacked(r, NULL);
    }
    cr_assert(output_released(0, (uint64_t)count));
    cr_assert_eq(box[0].nclient, count);
    /* The connection still works after the batches, and replies sent
     * from another thread are coalesced as well. */
    box[0].echo = 0;
    raw_send_many(fd, 1000, 1);
    cr_assert(wait_for(&box[0], &box[0].nclient, count + 1));
    reply_recorded(count, count + 1);
    Idalloc__ClientResponse *r = raw_read_response(fd);
    cr_assert_not_null(r);
    cr_assert_eq(r->request_seq, 1000);
    idalloc__client_response__free_unpacked(r, NULL);
    cr_assert(output_released(0, (uint64_t)count + 1));
    close(fd);
}

/* A client that half-closes after its requests gets every reply of the
 * coalesced writes, then the close (once the last batch is written). */
Test(net,
     half_closed_client_gets_all_coalesced_replies_then_eof,
     .init = setup,
     .fini = teardown)
{
    const int count = 300;
    int fd = raw_connect(0);
    raw_send_many(fd, 1, count);
    cr_assert_eq(shutdown(fd, SHUT_WR), 0);
    cr_assert(wait_for(&box[0], &box[0].nclient, count));
    reply_recorded(0, count);
    for (int s = 1; s <= count; s++) {
        Idalloc__ClientResponse *r = raw_read_response(fd);
        cr_assert_not_null(r, "reply %d missing before the close", s);
        cr_assert_eq(r->request_seq, (uint64_t)s);
        idalloc__client_response__free_unpacked(r, NULL);
    }
    cr_assert(closed_by_server(fd), "closed once the replies were written");
    close(fd);
    cr_assert(output_released(0, (uint64_t)count));
}

/* Peer messages queued together leave in batches on a plaintext link:
 * all of them arrive, in order. */
Test(net,
     coalesced_peer_messages_arrive_in_order,
     .init = setup,
     .fini = teardown)
{
    send_until_received(0, 1, 1);
    int before = box[1].npeer;
    struct ida_net_stats st;
    ida_net_get_stats(nets[0], &st);
    uint64_t dropped = st.peer_dropped; /* while the link came up */
    const int count = 700;
    for (int i = 0; i < count; i++) {
        Idalloc__PeerMessage m = IDALLOC__PEER_MESSAGE__INIT;
        Idalloc__TimeoutNow tn = IDALLOC__TIMEOUT_NOW__INIT;
        m.term = 100 + (uint64_t)i;
        m.msg_case = IDALLOC__PEER_MESSAGE__MSG_TIMEOUT_NOW;
        m.timeout_now = &tn;
        cr_assert_eq(ida_net_send_peer(nets[0], 2, &m), 0);
    }
    cr_assert(wait_for(&box[1], &box[1].npeer, before + count),
              "%d of %d peer messages arrived", box[1].npeer - before, count);
    for (int i = 0; i < count; i++) {
        cr_assert_eq(box[1].peer_term[before + i], 100 + (uint64_t)i,
                     "peer message %d out of order", i);
    }
    ida_net_get_stats(nets[0], &st);
    cr_assert_eq(st.peer_dropped, dropped);
}
