/* TLS with real processes: a cluster whose peers speak mutual TLS, the
 * intruders its peer port refuses (each logged once), a forged
 * AppendResponse that acknowledges a write without TLS and cannot with it,
 * the client port's `client_tls on` and `required`, and the errors of bad
 * TLS files. The intruder is a small hostile client on raw OpenSSL: it
 * presents whatever certificate it is given and trusts any server. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "idalloc.h"
#include "proto/idalloc.pb-c.h"
#include "src/common/frame.h"
#include "tests/lib/harness.h"

static struct tc c;

static void teardown(void)
{
    tc_destroy(&c);
}

/* --- the intruder ------------------------------------------------------- */

struct intruder
{
    int fd;
    SSL_CTX *ctx;
    SSL *ssl; /* NULL: plaintext */
};

/* Connect to 127.0.0.1:@port; with @tls, handshake presenting @cert/@key
 * (both NULL: no certificate). The server is not verified. Returns 0, or
 * -1 when the connection or the handshake failed. */
static int intruder_open(struct intruder *x,
                         unsigned port,
                         int tls,
                         const char *cert,
                         const char *key)
{
    memset(x, 0, sizeof(*x));
    signal(SIGPIPE, SIG_IGN); /* SSL_write on a closed connection */
    x->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(x->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        return -1;
    }
    struct timeval tv = {.tv_sec = 3};
    setsockopt(x->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (!tls) {
        return 0;
    }
    x->ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(x->ctx, SSL_VERIFY_NONE, NULL);
    if (cert != NULL) {
        cr_assert_eq(
            SSL_CTX_use_certificate_file(x->ctx, cert, SSL_FILETYPE_PEM), 1);
        cr_assert_eq(SSL_CTX_use_PrivateKey_file(x->ctx, key, SSL_FILETYPE_PEM),
                     1);
    }
    x->ssl = SSL_new(x->ctx);
    SSL_set_fd(x->ssl, x->fd);
    return SSL_connect(x->ssl) == 1 ? 0 : -1;
}

static void intruder_close(struct intruder *x)
{
    if (x->ssl != NULL) {
        SSL_free(x->ssl);
    }
    if (x->ctx != NULL) {
        SSL_CTX_free(x->ctx);
    }
    close(x->fd);
    ERR_clear_error();
}

static int intruder_write(struct intruder *x, const uint8_t *p, size_t n)
{
    if (x->ssl != NULL) {
        return SSL_write(x->ssl, p, (int)n) == (int)n ? 0 : -1;
    }
    return send(x->fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* Frame and send @m. */
static int intruder_send(struct intruder *x, Idalloc__PeerMessage *m)
{
    uint8_t buf[512];
    size_t n = idalloc__peer_message__get_packed_size(m);
    cr_assert_lt(n + IDA_FRAME_HEADER_BYTES, sizeof(buf));
    ida_frame_header_encode(buf, IDA_FRAME_PEER, n);
    idalloc__peer_message__pack(m, buf + IDA_FRAME_HEADER_BYTES);
    return intruder_write(x, buf, n + IDA_FRAME_HEADER_BYTES);
}

/* Whether the other side closed the connection within 3 s (a peer never
 * answers on an inbound link, so any end of the stream is the node
 * hanging up). */
static int intruder_refused(struct intruder *x)
{
    uint8_t b[256];
    for (;;) {
        int n = x->ssl != NULL ? SSL_read(x->ssl, b, sizeof(b))
                               : (int)recv(x->fd, b, sizeof(b), 0);
        if (n > 0) {
            continue;
        }
        if (x->ssl != NULL && n < 0 && errno == EAGAIN &&
            SSL_get_error(x->ssl, n) == SSL_ERROR_WANT_READ) {
            return 0; /* SO_RCVTIMEO: still open */
        }
        if (x->ssl == NULL && n < 0 && errno == EAGAIN) {
            return 0;
        }
        return 1;
    }
}

/* A well-formed heartbeat answer from @from to @to of cluster "test". */
static void heartbeat_answer(Idalloc__PeerMessage *m,
                             Idalloc__AppendResponse *ar,
                             unsigned from,
                             unsigned to,
                             uint64_t term)
{
    idalloc__peer_message__init(m);
    idalloc__append_response__init(ar);
    m->version = IDA_WIRE_VERSION;
    m->cluster = "test";
    m->from = from;
    m->to = to;
    m->term = term;
    ar->success = 1;
    m->msg_case = IDALLOC__PEER_MESSAGE__MSG_APPEND_RESPONSE;
    m->append_response = ar;
}

static char *read_log(int node)
{
    static char buf[1 << 20];
    char path[400];
    snprintf(path, sizeof(path), "%s/node%d.log", c.dir, node);
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f == NULL) {
        return buf; /* not started yet */
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int k = 0;
    for (const char *p = strstr(hay, needle); p != NULL;
         p = strstr(p + 1, needle)) {
        k++;
    }
    return k;
}

/* Wait up to 5 s for @needle in node @node's log. */
static int wait_log(int node, const char *needle)
{
    for (uint64_t end = tc_now_ms() + 5000; tc_now_ms() < end;) {
        if (strstr(read_log(node), needle) != NULL) {
            return 1;
        }
        tc_sleep_ms(50);
    }
    return 0;
}

static void path_in(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%.320s/%.40s", dir, name);
}

static void alloc_ok(const char *tag)
{
    struct idalloc_client *cl = tc_client(&c, 10000);
    uint64_t id;
    int rv = idalloc_alloc(cl, "p", tag, &id, NULL, tc_detail());
    cr_assert_eq(rv, 0, "alloc %s: %s (%s)", tag, idalloc_strerror(rv),
                 tc_errmsg());
    idalloc_client_free(cl);
}

static void create_pool(void)
{
    struct idalloc_client *cl = tc_client(&c, 10000);
    int rv = idalloc_pool_create(cl, "p", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                 tc_detail());
    cr_assert_eq(rv, 0, "%s", tc_errmsg());
    idalloc_client_free(cl);
}

/* --- tests --------------------------------------------------------------- */

Test(tls, cluster_with_peer_tls_serves_allocs, .fini = teardown, .timeout = 60)
{
    tc_start(&c, 3, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader");
    create_pool();
    for (int i = 0; i < 20; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "t%d", i);
        alloc_ok(tag);
    }
    for (int i = 1; i <= 3; i++) {
        cr_assert(wait_log(i, ", TLS)"), "node %d: no TLS link up:\n%s", i,
                  read_log(i));
        cr_assert_null(strstr(read_log(i), "peer_tls off"));
    }
}

/* Every kind of intruder on node 1's peer port, twice each: refused,
 * logged once with its reason, and the cluster does not notice. */
Test(tls,
     peer_port_refuses_intruders_and_logs_each_once,
     .fini = teardown,
     .timeout = 90)
{
    tc_start(&c, 3, NULL);
    int leader = tc_wait_leader(&c, 20000);
    cr_assert_geq(leader, 0);
    create_pool();
    struct idalloc_client *cl = tc_client(&c, 5000);
    struct idalloc_node_status before;
    cr_assert_eq(idalloc_node_status(cl, (size_t)leader, &before, tc_detail()),
                 0);
    char out[512], other[400];
    path_in(other, sizeof(other), c.dir, "other");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s certs create %s --nodes 3 --clients 1 2>&1",
                        tc_bin("idalloc"), other),
                 0, "%s", out);
    /* Node 9 is no member: a node that could ask to join holds such a
     * certificate. Its links are heard, but only as node 9. */
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs add %s --node 9 2>&1",
                        tc_bin("idalloc"), c.tls),
                 0, "%s", out);
    char n9crt[400], n9key[400];
    path_in(n9crt, sizeof(n9crt), c.tls, "node9.crt");
    path_in(n9key, sizeof(n9key), c.tls, "node9.key");
    char n2crt[400], n2key[400], c1crt[400], c1key[400], o2crt[400], o2key[400];
    path_in(n2crt, sizeof(n2crt), c.tls, "node2.crt");
    path_in(n2key, sizeof(n2key), c.tls, "node2.key");
    path_in(c1crt, sizeof(c1crt), c.tls, "client1.crt");
    path_in(c1key, sizeof(c1key), c.tls, "client1.key");
    path_in(o2crt, sizeof(o2crt), other, "node2.crt");
    path_in(o2key, sizeof(o2key), other, "node2.key");
    const struct
    {
        const char *name;
        int tls;
        const char *crt, *key;
        unsigned from;
        const char *logged;
    } kinds[] = {
        {"plaintext", 0, NULL, NULL, 2,
         "refused: plaintext frames on a TLS port (is peer_tls off there?)"},
        {"TLS without a certificate", 1, NULL, NULL, 2,
         "refused: TLS failure: peer did not return a certificate"},
        {"a certificate of another CA", 1, o2crt, o2key, 2,
         "refused: peer certificate refused"},
        {"a client certificate", 1, c1crt, c1key, 2,
         "refused: a client certificate on the peer port: client 1"},
        {"node 2's certificate speaking as node 3", 1, n2crt, n2key, 3,
         "message from node 3 on the link of node 2's certificate"},
        {"a non-member's certificate speaking as node 2", 1, n9crt, n9key, 2,
         "message from node 2 on the link of node 9's certificate"},
    };
    unsigned port = c.cfg.nodes[0].peer.port;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        for (int round = 0; round < 2; round++) {
            struct intruder x;
            int rv = intruder_open(&x, port, kinds[k].tls, kinds[k].crt,
                                   kinds[k].key);
            Idalloc__PeerMessage m;
            Idalloc__AppendResponse ar;
            heartbeat_answer(&m, &ar, kinds[k].from, 1, before.term);
            if (rv == 0) {
                intruder_send(&x, &m);
            }
            cr_assert(rv != 0 || intruder_refused(&x),
                      "%s: the connection stayed open", kinds[k].name);
            intruder_close(&x);
        }
        cr_assert(wait_log(1, kinds[k].logged), "%s: not logged \"%s\":\n%s",
                  kinds[k].name, kinds[k].logged, read_log(1));
        cr_assert_eq(count(read_log(1), kinds[k].logged), 1,
                     "%s: logged more than once:\n%s", kinds[k].name,
                     read_log(1));
    }
    /* The cluster did not notice: same leader and term, still serving. */
    alloc_ok("after");
    struct idalloc_node_status after;
    cr_assert_eq(idalloc_node_status(cl, (size_t)leader, &after, tc_detail()),
                 0);
    cr_assert_str_eq(after.role, "leader");
    cr_assert_eq(after.term, before.term, "term moved: %llu -> %llu",
                 (unsigned long long)before.term,
                 (unsigned long long)after.term);
    idalloc_client_free(cl);
}

struct alloc_job
{
    struct idalloc_client *cl;
    int rv;
    int done;
};

static void *alloc_thread(void *arg)
{
    struct alloc_job *j = arg;
    uint64_t id;
    j->rv = idalloc_alloc(j->cl, "p", "forged", &id, NULL, tc_detail());
    __atomic_store_n(&j->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* The attack of a forged AppendResponse: follower a is frozen, follower b
 * is down, so the leader holds an alloc's entry alone; the intruder tells
 * the leader that a has it. Returns whether the leader acknowledged the
 * alloc. @tls: the intruder holds every certificate of the cluster but
 * a's (it speaks with b's and with a certificate naming a of another CA). */
static int forged_ack_acknowledges(int tls)
{
    tc_start(&c, 3, tls ? NULL : "peer_tls off\n");
    int l = tc_wait_leader(&c, 20000);
    cr_assert_geq(l, 0);
    create_pool();
    int a = (l + 1) % 3, b = (l + 2) % 3;
    struct idalloc_client *cl = tc_client(&c, 5000);
    struct idalloc_member_list *ml = malloc(sizeof(*ml));
    cr_assert_eq(idalloc_member_list(cl, ml, tc_detail()), 0, "%s",
                 tc_errmsg());
    uint64_t inc_a = 0;
    for (size_t i = 0; i < ml->n; i++) {
        if (ml->members[i].id == (unsigned)a + 1) {
            inc_a = ml->members[i].incarnation;
        }
    }
    free(ml);
    cr_assert_neq(inc_a, 0);
    kill(c.pid[a], SIGSTOP);
    tc_signal(&c, b, SIGKILL);
    /* A client of the leader alone (the others cannot answer). */
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = c.cfg.nodes[l].client.text;
    o.call_timeout_ms = 3000;
    o.attempt_timeout_ms = 3000;
    struct alloc_job job = {.rv = -1};
    char err[IDALLOC_ERRMSG_MAX];
    cr_assert_eq(idalloc_client_new(&o, &job.cl, err), 0, "%s", err);
    pthread_t t;
    pthread_create(&t, NULL, alloc_thread, &job);
    char n_b_crt[400], n_b_key[400], o_a_crt[400], o_a_key[400], other[400],
        name[32], out[512];
    path_in(other, sizeof(other), c.dir, "other");
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs create %s --nodes 3 2>&1",
                        tc_bin("idalloc"), other),
                 0, "%s", out);
    snprintf(name, sizeof(name), "node%d.crt", b + 1);
    path_in(n_b_crt, sizeof(n_b_crt), c.tls, name);
    snprintf(name, sizeof(name), "node%d.key", b + 1);
    path_in(n_b_key, sizeof(n_b_key), c.tls, name);
    snprintf(name, sizeof(name), "node%d.crt", a + 1);
    path_in(o_a_crt, sizeof(o_a_crt), other, name);
    snprintf(name, sizeof(name), "node%d.key", a + 1);
    path_in(o_a_key, sizeof(o_a_key), other, name);
    unsigned port = c.cfg.nodes[l].peer.port;
    struct idalloc_client *st = tc_client(&c, 300);
    struct intruder x;
    int open = 0, tries = 0;
    while (!__atomic_load_n(&job.done, __ATOMIC_SEQ_CST)) {
        struct idalloc_node_status s;
        if (idalloc_node_status(st, (size_t)l, &s, tc_detail()) != 0) {
            tc_sleep_ms(20);
            continue;
        }
        if (!open) {
            const char *crt = tries % 2 == 0 ? n_b_crt : o_a_crt;
            const char *key = tries % 2 == 0 ? n_b_key : o_a_key;
            tries++;
            open = intruder_open(&x, port, tls, tls ? crt : NULL,
                                 tls ? key : NULL) == 0;
            if (!open) {
                intruder_close(&x);
                continue;
            }
        }
        /* "a has everything the leader has." */
        Idalloc__PeerMessage m;
        Idalloc__AppendResponse ar;
        heartbeat_answer(&m, &ar, (unsigned)a + 1, (unsigned)l + 1, s.term);
        m.from_incarnation = inc_a;
        ar.match_index = s.log_last_index;
        if (intruder_send(&x, &m) != 0) {
            intruder_close(&x);
            open = 0;
        }
        tc_sleep_ms(20);
    }
    pthread_join(t, NULL);
    if (open) {
        intruder_close(&x);
    }
    idalloc_client_free(st);
    idalloc_client_free(job.cl);
    idalloc_client_free(cl);
    kill(c.pid[a], SIGCONT);
    return job.rv == 0;
}

/* The negative control: without TLS the forgery is well-formed enough to
 * make the leader acknowledge a write only it holds. */
Test(tls,
     forged_append_response_acknowledges_a_write_without_tls,
     .fini = teardown,
     .timeout = 90)
{
    cr_assert(forged_ack_acknowledges(0),
              "the forgery did not work on plaintext peers: the TLS test "
              "below would prove nothing");
}

Test(tls,
     forged_append_response_needs_that_nodes_key,
     .fini = teardown,
     .timeout = 90)
{
    cr_assert_not(forged_ack_acknowledges(1),
                  "the leader acknowledged a write on a forged answer");
    int seen = 0;
    for (int i = 1; i <= 3; i++) {
        const char *log = read_log(i);
        seen |= strstr(log, "on the link of node") != NULL &&
                strstr(log, "peer certificate refused") != NULL;
    }
    cr_assert(seen, "the leader did not log both refusals");
}

/* --- the client port ------------------------------------------------------ */

static int client_alloc(const char *ca, const char *crt, const char *key)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = c.addrs;
    o.call_timeout_ms = 1500;
    o.attempt_timeout_ms = 500;
    o.tls_ca_file = ca;
    o.tls_cert_file = crt;
    o.tls_key_file = key;
    struct idalloc_client *cl;
    char err[IDALLOC_ERRMSG_MAX];
    int rv = idalloc_client_new(&o, &cl, err);
    cr_assert_eq(rv, 0, "%s", err);
    uint64_t id;
    rv = idalloc_alloc(cl, "p", "x", &id, NULL, tc_detail());
    idalloc_client_free(cl);
    return rv;
}

Test(tls,
     client_tls_required_serves_only_cluster_certificates,
     .fini = teardown,
     .timeout = 90)
{
    tc_start(&c, 3, "client_tls required\n");
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader (TLS clients)");
    create_pool();
    char ca[400], crt[400], key[400], out[1024];
    path_in(ca, sizeof(ca), c.tls, "ca.crt");
    path_in(crt, sizeof(crt), c.tls, "client2.crt");
    path_in(key, sizeof(key), c.tls, "client2.key");
    cr_assert_eq(client_alloc(ca, crt, key), 0, "%s", tc_errmsg());
    cr_assert_neq(client_alloc(NULL, NULL, NULL), 0, "a plain client served");
    cr_assert_neq(client_alloc(ca, NULL, NULL), 0,
                  "a TLS client without a certificate served");
    /* A client certificate of another CA (raw OpenSSL: our library refuses
     * to load a certificate its CA does not sign). */
    char other[400], ocrt[400], okey[400];
    path_in(other, sizeof(other), c.dir, "other");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s certs create %s --nodes 1 --clients 1 2>&1",
                        tc_bin("idalloc"), other),
                 0, "%s", out);
    path_in(ocrt, sizeof(ocrt), other, "client1.crt");
    path_in(okey, sizeof(okey), other, "client1.key");
    struct intruder x;
    if (intruder_open(&x, c.cfg.nodes[0].client.port, 1, ocrt, okey) == 0) {
        uint8_t hdr[IDA_FRAME_HEADER_BYTES];
        ida_frame_header_encode(hdr, IDA_FRAME_CLIENT_REQUEST, 0);
        intruder_write(&x, hdr, sizeof(hdr));
        cr_assert(intruder_refused(&x),
                  "a foreign client certificate kept "
                  "its connection");
    }
    intruder_close(&x);
    cr_assert(wait_log(1,
                       "client connection from 127.0.0.1 refused: "
                       "plaintext frames on a TLS port (client_tls "
                       "required)"),
              "%s", read_log(1));
    cr_assert(wait_log(1,
                       "client connection from 127.0.0.1 refused: peer "
                       "certificate refused"),
              "%s", read_log(1));
    /* The CLI, as the README shows it. */
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --tls-dir %s --tls-client client1 "
                        "alloc p --tag cli 2>&1",
                        tc_bin("idalloc"), c.addrs, c.tls),
                 0, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "IDALLOC_TLS_DIR=%s IDALLOC_TLS_CLIENT=client2 %s "
                        "--cluster %s lookup p --tag cli 2>&1",
                        c.tls, tc_bin("idalloc"), c.addrs),
                 0, "%s", out);
    cr_assert_neq(tc_run(out, sizeof(out),
                         "%s --cluster %s --timeout 1000 alloc p --tag plain "
                         "2>&1",
                         tc_bin("idalloc"), c.addrs),
                  0, "the plain CLI was served: %s", out);
}

Test(tls,
     client_tls_on_serves_plain_and_tls_clients,
     .fini = teardown,
     .timeout = 60)
{
    tc_start(&c, 3, "client_tls on\n");
    cr_assert_geq(tc_wait_leader(&c, 20000), 0);
    create_pool();
    char ca[400], crt[400], key[400];
    path_in(ca, sizeof(ca), c.tls, "ca.crt");
    path_in(crt, sizeof(crt), c.tls, "client1.crt");
    path_in(key, sizeof(key), c.tls, "client1.key");
    cr_assert_eq(client_alloc(NULL, NULL, NULL), 0, "plain: %s", tc_errmsg());
    cr_assert_eq(client_alloc(ca, NULL, NULL), 0, "TLS, no certificate: %s",
                 tc_errmsg());
    cr_assert_eq(client_alloc(ca, crt, key), 0, "TLS as client1: %s",
                 tc_errmsg());
}

Test(tls,
     client_refuses_a_server_of_another_ca,
     .fini = teardown,
     .timeout = 60)
{
    tc_start(&c, 3, "client_tls on\n");
    cr_assert_geq(tc_wait_leader(&c, 20000), 0);
    char other[400], ca[400], out[512];
    path_in(other, sizeof(other), c.dir, "other");
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs create %s --nodes 1 2>&1",
                        tc_bin("idalloc"), other),
                 0, "%s", out);
    path_in(ca, sizeof(ca), other, "ca.crt");
    int rv = client_alloc(ca, NULL, NULL);
    cr_assert_eq(rv, IDA_EUNAVAIL, "%s", idalloc_strerror(rv));
}

/* --- certificates and configuration ------------------------------------ */

/* `idalloc certs add DIR OPT` (OPT names node @id) succeeds, and openssl
 * verifies nodeID.crt against DIR's CA. */
static void add_node_cert(const char *d, const char *opt, unsigned id)
{
    char out[2048];
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs add %s %s 2>&1",
                        tc_bin("idalloc"), d, opt),
                 0, "%s", out);
    cr_assert_eq(
        tc_run(out, sizeof(out),
               "openssl verify -CAfile %s/ca.crt %s/node%u.crt 2>&1", d, d, id),
        0, "%s", out);
}

Test(tls, certs_create_writes_what_openssl_verifies, .fini = teardown)
{
    tc_setup(&c, 1, NULL);
    char d[400], out[2048];
    path_in(d, sizeof(d), c.dir, "certs");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s certs create %s --nodes 3 --clients 2 2>&1",
                        tc_bin("idalloc"), d),
                 0, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "cd %s && openssl verify -CAfile ca.crt node1.crt "
                        "node2.crt node3.crt client1.crt client2.crt 2>&1",
                        d),
                 0, "%s", out);
    cr_assert_eq(count(out, ": OK"), 5, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "openssl x509 -in %s/node3.crt -noout -subject "
                        "-ext subjectAltName,extendedKeyUsage 2>&1",
                        d),
                 0, "%s", out);
    cr_assert(strstr(out, "CN = idalloc-node-3") != NULL, "%s", out);
    cr_assert(strstr(out, "DNS:idalloc-node-3") != NULL, "%s", out);
    cr_assert(strstr(out, "TLS Web Server Authentication") != NULL, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "openssl x509 -in %s/client2.crt -noout -subject "
                        "-ext extendedKeyUsage 2>&1",
                        d),
                 0, "%s", out);
    cr_assert(strstr(out, "CN = idalloc-client-2") != NULL, "%s", out);
    cr_assert_null(strstr(out, "Server"), "a client cannot serve: %s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "openssl pkey -in %s/node1.key -noout -text 2>&1", d),
                 0, "%s", out);
    cr_assert(strstr(out, "prime256v1") != NULL, "%s", out);
    const char *keys[] = {"ca.key", "node1.key", "node3.key", "client2.key"};
    for (size_t i = 0; i < 4; i++) {
        char p[500];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", d, keys[i]);
        cr_assert_eq(stat(p, &st), 0, "%s", p);
        cr_assert_eq(st.st_mode & 0777, 0600, "%s: mode %o", p,
                     st.st_mode & 0777);
    }
    /* Nothing is overwritten without --force, and nothing changes. */
    char before[2048], after[2048];
    tc_run(before, sizeof(before), "cat %s/ca.crt", d);
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs create %s --nodes 3 2>&1",
                        tc_bin("idalloc"), d),
                 1, "%s", out);
    cr_assert(strstr(out, "ca.crt exists: refusing to overwrite") != NULL, "%s",
              out);
    cr_assert(strstr(out, "--force") != NULL, "%s", out);
    tc_run(after, sizeof(after), "cat %s/ca.crt", d);
    cr_assert_str_eq(before, after);
    /* certs add: one more node of the same CA. */
    add_node_cert(d, "--node 4", 4);
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs add %s --node 4 2>&1",
                        tc_bin("idalloc"), d),
                 1, "%s", out);
    cr_assert_eq(
        tc_run(out, sizeof(out), "%s certs create %s --nodes 2 --force 2>&1",
               tc_bin("idalloc"), d),
        0, "%s", out);
    tc_run(after, sizeof(after), "cat %s/ca.crt", d);
    cr_assert_str_neq(before, after, "--force made a new CA");
}

/* certs takes its values after an `=` too, like the other commands, and
 * runs only as the first word (it reads no cluster): global options before
 * it get a message saying so, not "unknown command". */
Test(tls, certs_options_with_an_equals_sign, .fini = teardown)
{
    tc_setup(&c, 1, NULL);
    char d[400], out[2048], p[500];
    struct stat st;
    path_in(d, sizeof(d), c.dir, "certs");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s certs create %s --nodes=2 --clients=1 2>&1",
                        tc_bin("idalloc"), d),
                 0, "%s", out);
    snprintf(p, sizeof(p), "%s/client1.crt", d);
    cr_assert_eq(stat(p, &st), 0, "%s", p);
    snprintf(p, sizeof(p), "%s/node3.crt", d);
    cr_assert_neq(stat(p, &st), 0, "--nodes=2 made only two: %s", p);
    add_node_cert(d, "--node=5", 5);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s certs create %s --nodes=1 --force=yes 2>&1",
                        tc_bin("idalloc"), d),
                 2, "%s", out);
    cr_assert(strstr(out, "--force takes no value") != NULL, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out), "%s certs create %s --nodes= 2>&1",
                        tc_bin("idalloc"), d),
                 2, "%s", out);
    cr_assert(strstr(out, "bad --nodes \"\"") != NULL, "%s", out);
    char d2[400];
    path_in(d2, sizeof(d2), c.dir, "certs2");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --timeout 100 certs create %s --nodes 1 2>&1",
                        tc_bin("idalloc"), d2),
                 2, "%s", out);
    cr_assert(strstr(out, "certs takes no global options") != NULL, "%s", out);
    cr_assert_neq(stat(d2, &st), 0, "nothing was written: %s", d2);
}

/* Start node 1 of c.conf as it is now; its exit status and output. */
static int start_node1(char *out, size_t cap)
{
    return tc_run(out, cap, "timeout 10 %s --config %s --node 1 2>&1",
                  tc_bin("idallocd"), c.conf);
}

Test(tls,
     bad_tls_files_stop_the_node_with_a_clear_message,
     .fini = teardown,
     .timeout = 60)
{
    tc_setup(&c, 3, NULL);
    char out[1024], data[400];
    path_in(data, sizeof(data), c.dir, "data");
    const struct
    {
        const char *setup; /* shell, run in c.tls, on fresh copies */
        const char *says;
    } cases[] = {
        {"rm node1.key", "cannot read key"},
        {"rm node1.key && mkdir node1.key", "bad key"}, /* unreadable */
        {"echo junk > node1.crt", "bad certificate"},
        {"echo junk > node1.key", "bad key"},
        {"cp node2.key node1.key", "does not belong to certificate"},
        {"cp ../other/node1.crt ../other/node1.key .",
         "does not verify against the CA"},
        {"cp node3.crt node1.crt && cp node3.key node1.key",
         "names node 3, not node 1"},
        {"rm ca.crt", "cannot read CA certificate"},
    };
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s certs create %s/other --nodes 1 && cp -a %s "
                        "%s/pristine 2>&1",
                        tc_bin("idalloc"), c.dir, c.tls, c.dir),
                 0, "%s", out);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_eq(tc_run(out, sizeof(out),
                            "rm -rf %s && cp -a %s/pristine %s && cd %s && "
                            "(%s) 2>&1",
                            c.tls, c.dir, c.tls, c.tls, cases[i].setup),
                     0, "%s", out);
        int rv = start_node1(out, sizeof(out));
        cr_assert_eq(rv, 2, "case %zu: exit %d: %s", i, rv, out);
        cr_assert(strstr(out, cases[i].says) != NULL,
                  "case %zu: \"%s\" not in: %s", i, cases[i].says, out);
        cr_assert(strstr(out, c.tls) != NULL, "names the file: %s", out);
        cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s",
                     out);
        cr_assert_neq(access(data, F_OK), 0,
                      "case %zu: the data directory was touched", i);
    }
    tc_run(out, sizeof(out), "rm -rf %s && cp -a %s/pristine %s", c.tls, c.dir,
           c.tls);
    /* Neither tls_dir nor peer_tls: refused, naming both. */
    tc_run(out, sizeof(out), "sed -i '/^tls_dir/d' %s", c.conf);
    cr_assert_eq(start_node1(out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "tls_dir DIR") != NULL &&
                  strstr(out, "peer_tls off") != NULL,
              "%s", out);
    /* peer_tls off: runs, and says so at start. */
    tc_run(out, sizeof(out), "echo 'peer_tls off' >> %s", c.conf);
    tc_spawn(&c, 0);
    cr_assert(wait_log(1, "peer_tls off: peer links are plaintext"), "%s",
              read_log(1));
}

/* A TLS server on node 2's peer address that shows node 3's certificate
 * (a stolen address, not a stolen key of node 2): node 1 must not take it
 * for node 2. */
struct impostor
{
    int lfd;
    const char *crt, *key;
    int accepted;
};

static void *impostor_main(void *arg)
{
    struct impostor *im = arg;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate_file(ctx, im->crt, SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx, im->key, SSL_FILETYPE_PEM);
    for (;;) {
        int fd = accept(im->lfd, NULL, NULL);
        if (fd < 0) {
            break; /* the test closed the listener */
        }
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        if (SSL_accept(ssl) == 1) {
            __atomic_add_fetch(&im->accepted, 1, __ATOMIC_SEQ_CST);
            uint8_t b[256];
            while (SSL_read(ssl, b, sizeof(b)) > 0) {
            }
        }
        SSL_free(ssl);
        close(fd);
    }
    SSL_CTX_free(ctx);
    return NULL;
}

Test(tls,
     outbound_link_must_reach_the_node_it_dialled,
     .fini = teardown,
     .timeout = 60)
{
    signal(SIGPIPE, SIG_IGN);
    tc_setup(&c, 3, NULL);
    char crt[400], key[400];
    path_in(crt, sizeof(crt), c.tls, "node3.crt");
    path_in(key, sizeof(key), c.tls, "node3.key");
    struct impostor im = {.crt = crt, .key = key};
    im.lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(im.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(c.cfg.nodes[1].peer.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(im.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(im.lfd, 16), 0);
    pthread_t t;
    pthread_create(&t, NULL, impostor_main, &im);
    tc_spawn(&c, 0);
    cr_assert(wait_log(1, "link to node 2 (127.0.0.1:"), "%s", read_log(1));
    cr_assert(wait_log(1, "refused: its certificate names node 3"), "%s",
              read_log(1));
    tc_sleep_ms(1500); /* more attempts: backed off, logged once */
    const char *log = read_log(1);
    cr_assert_gt(__atomic_load_n(&im.accepted, __ATOMIC_SEQ_CST), 1,
                 "node 1 did not retry");
    cr_assert_eq(count(log, "its certificate names node 3"), 1, "%s", log);
    cr_assert_null(strstr(log, "net: peer 2 up"), "%s", log);
    shutdown(im.lfd, SHUT_RDWR);
    close(im.lfd);
    pthread_join(t, NULL);
}
