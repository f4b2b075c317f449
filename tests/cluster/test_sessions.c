/* Sessions against a live 3-node cluster, as an attacker would try them:
 * 65,537 writes from random client ids (no registration) over one raw
 * connection, a registration flood on one connection, then a repeat of a
 * reserve and a late retry of a free by their request ids. Nothing may
 * act twice (fsm/fsm.h, "Sessions"). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "proto/idalloc.pb-c.h"
#include "src/common/frame.h"
#include "src/node/net.h"
#include "tests/lib/harness.h"

static struct tc c;

static void teardown(void)
{
    tc_destroy(&c);
}

static int connect_to(const struct ida_addr *a)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(a->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Append the frame of @q to @buf at *@len. */
static void put_frame(uint8_t *buf,
                      size_t cap,
                      size_t *len,
                      const Idalloc__ClientRequest *q)
{
    size_t n = idalloc__client_request__get_packed_size(q);
    cr_assert_leq(*len + IDA_FRAME_HEADER_BYTES + n, cap);
    ida_frame_header_encode(buf + *len, IDA_FRAME_CLIENT_REQUEST, (uint32_t)n);
    idalloc__client_request__pack(q, buf + *len + IDA_FRAME_HEADER_BYTES);
    *len += IDA_FRAME_HEADER_BYTES + n;
}

/* Append a RegisterClient frame of client @cid (16 bytes), request @seq. */
static void put_register(uint8_t *buf,
                         size_t cap,
                         size_t *len,
                         const uint8_t *cid,
                         uint64_t seq)
{
    Idalloc__ClientRequest q = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__RegisterClient r = IDALLOC__REGISTER_CLIENT__INIT;
    q.version = IDA_WIRE_VERSION;
    q.client_id.data = (uint8_t *)cid;
    q.client_id.len = 16;
    q.request_seq = seq;
    q.op_case = IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT;
    q.register_client = &r;
    put_frame(buf, cap, len, &q);
}

static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        cr_assert_gt(w, 0, "write to the leader failed");
        p += w;
        n -= (size_t)w;
    }
}

/* Read one response frame from @fd; NULL at EOF. */
static Idalloc__ClientResponse *read_response(int fd)
{
    uint8_t hdr[IDA_FRAME_HEADER_BYTES];
    size_t got = 0;
    while (got < sizeof(hdr)) {
        ssize_t r = read(fd, hdr + got, sizeof(hdr) - got);
        if (r <= 0) {
            return NULL;
        }
        got += (size_t)r;
    }
    uint32_t n = (uint32_t)hdr[2] << 24 | (uint32_t)hdr[3] << 16 |
                 (uint32_t)hdr[4] << 8 | hdr[5];
    cr_assert_eq(hdr[1], IDA_FRAME_CLIENT_RESPONSE);
    cr_assert_lt(n, 1u << 20);
    uint8_t *p = malloc(n + 1);
    got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        cr_assert_gt(r, 0, "connection closed mid-frame");
        got += (size_t)r;
    }
    Idalloc__ClientResponse *resp =
        idalloc__client_response__unpack(NULL, n, p);
    free(p);
    cr_assert_not_null(resp);
    return resp;
}

#define ATTACK_WRITES (65536 + 1)
#define CHUNK         512

Test(sessions_live,
     attack_does_not_make_a_replay_act_twice,
     .fini = teardown,
     .timeout = 300)
{
    tc_start(&c, 3, NULL);
    int leader = tc_wait_leader(&c, 10000);
    cr_assert_geq(leader, 0);
    struct idalloc_client *admin = tc_client(&c, 10000);
    cr_assert_eq(idalloc_pool_create(admin, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_pool_create(admin, "u", IDALLOC_POOL_BOUNDED, 10, NULL,
                                     tc_detail()),
                 0);
    /* The honest clients: one reserves [1,100] and sends nothing after
     * (its answer stays kept); user:42 takes id 0, another client frees
     * it, user:42 takes id 0 again. */
    struct idalloc_client *a = tc_client(&c, 10000);
    struct idalloc_call reserve_call, free_call;
    idalloc_call_init(&reserve_call);
    idalloc_call_init(&free_call);
    uint64_t first, id;
    int freed = 0;
    cr_assert_eq(idalloc_reserve(a, "s", 100, &first, &reserve_call), 0);
    cr_assert_eq(first, 1);
    cr_assert_eq(idalloc_alloc(admin, "u", "user:42", &id, NULL, tc_detail()),
                 0);
    cr_assert_eq(id, 0);
    struct idalloc_client *b = tc_client(&c, 10000);
    cr_assert_eq(idalloc_free(b, "u", 0, "user:42", &freed, &free_call), 0);
    cr_assert(freed);
    cr_assert_eq(idalloc_alloc(admin, "u", "user:42", &id, NULL, tc_detail()),
                 0);
    cr_assert_eq(id, 0);

    /* 65,537 reserves from random client ids, pipelined on one raw
     * connection to the leader: every one is answered IDA_EEXPIRED. */
    leader = tc_wait_leader(&c, 10000);
    int fd = connect_to(&c.cfg.nodes[leader].client);
    static uint8_t buf[CHUNK * 128];
    uint64_t rng = 0x243f6a8885a308d3;
    int expired = 0;
    for (int done = 0; done < ATTACK_WRITES;) {
        int n = ATTACK_WRITES - done < CHUNK ? ATTACK_WRITES - done : CHUNK;
        size_t len = 0;
        for (int i = 0; i < n; i++) {
            uint8_t cid[16];
            for (int k = 0; k < 16; k++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                cid[k] = (uint8_t)(rng >> 56);
            }
            Idalloc__ClientRequest q = IDALLOC__CLIENT_REQUEST__INIT;
            Idalloc__Reserve r = IDALLOC__RESERVE__INIT;
            q.version = IDA_WIRE_VERSION;
            q.client_id.data = cid;
            q.client_id.len = 16;
            q.request_seq = (uint64_t)(done + i) + 1;
            r.pool = (ProtobufCBinaryData){1, (uint8_t *)"s"};
            r.count = 100;
            q.op_case = IDALLOC__CLIENT_REQUEST__OP_RESERVE;
            q.reserve = &r;
            put_frame(buf, sizeof(buf), &len, &q);
        }
        write_all(fd, buf, len);
        for (int i = 0; i < n; i++) {
            Idalloc__ClientResponse *resp = read_response(fd);
            cr_assert_not_null(resp, "the leader closed the connection");
            expired += resp->result->error == IDA_EEXPIRED;
            idalloc__client_response__free_unpacked(resp, NULL);
        }
        done += n;
    }
    close(fd);
    cr_assert_eq(expired, ATTACK_WRITES, "a write without a session acted");

    /* A registration flood on one connection: 16 are taken, the others
     * are answered IDA_ELIMIT. */
    fd = connect_to(&c.cfg.nodes[leader].client);
    size_t len = 0;
    for (int i = 0; i < IDA_NET_REGISTERS_PER_CONN_MAX + 4; i++) {
        uint8_t cid[16];
        memset(cid, 0x5a, sizeof(cid));
        cid[0] = (uint8_t)i;
        put_register(buf, sizeof(buf), &len, cid, (uint64_t)i + 1);
    }
    write_all(fd, buf, len);
    int registered = 0, limited = 0;
    for (int i = 0; i < IDA_NET_REGISTERS_PER_CONN_MAX + 4; i++) {
        Idalloc__ClientResponse *resp = read_response(fd);
        cr_assert_not_null(resp);
        registered += resp->result->error == 0;
        limited += resp->result->error == IDA_ELIMIT;
        idalloc__client_response__free_unpacked(resp, NULL);
    }
    close(fd);
    cr_assert_eq(limited, 4);
    cr_assert_eq(registered, IDA_NET_REGISTERS_PER_CONN_MAX);

    /* The repeat of the reserve gets [1,100] again, the late free retry
     * gets its first answer and frees nothing: user:42 keeps id 0. */
    reserve_call.state = IDALLOC_CALL_UNKNOWN;
    free_call.state = IDALLOC_CALL_UNKNOWN;
    uint64_t again = 0;
    cr_assert_eq(idalloc_reserve(admin, "s", 100, &again, &reserve_call), 0,
                 "%s", reserve_call.errmsg);
    cr_assert_eq(again, 1, "the reserve acted twice");
    freed = 0;
    cr_assert_eq(idalloc_free(admin, "u", 0, "user:42", &freed, &free_call), 0,
                 "%s", free_call.errmsg);
    cr_assert(freed, "the first answer (freed) came back");
    cr_assert_eq(idalloc_lookup(admin, "u", "user:42", &id, tc_detail()), 0,
                 "user:42 lost its id: the late free acted");
    cr_assert_eq(id, 0);
    cr_assert_eq(idalloc_reserve(admin, "s", 1, &again, tc_detail()), 0);
    cr_assert_eq(again, 101, "one block [1,100] only");
    idalloc_client_free(a);
    idalloc_client_free(b);
    idalloc_client_free(admin);
}

/* A follower answers every RegisterClient IDA_ENOTLEADER and registers
 * nothing, so those do not count toward the connection's limit: a client
 * repeating its registration through an election (one at a time on one
 * connection, as the library does) is told "not leader" every time, never
 * IDA_ELIMIT after the 16th. */
Test(sessions_live,
     not_leader_registrations_do_not_count,
     .fini = teardown,
     .timeout = 60)
{
    tc_start(&c, 3, NULL);
    int leader = tc_wait_leader(&c, 10000);
    cr_assert_geq(leader, 0);
    int fd = connect_to(&c.cfg.nodes[(leader + 1) % 3].client);
    for (int i = 0; i < 2 * IDA_NET_REGISTERS_PER_CONN_MAX + 4; i++) {
        uint8_t cid[16], buf[256];
        size_t len = 0;
        memset(cid, 0x3c, sizeof(cid));
        put_register(buf, sizeof(buf), &len, cid, (uint64_t)i + 1);
        write_all(fd, buf, len);
        Idalloc__ClientResponse *resp = read_response(fd);
        cr_assert_not_null(resp, "the follower closed the connection");
        cr_assert_eq(resp->result->error, IDA_ENOTLEADER,
                     "registration %d answered %u: %s", i + 1,
                     resp->result->error, resp->result->error_msg);
        idalloc__client_response__free_unpacked(resp, NULL);
    }
    close(fd);
}
