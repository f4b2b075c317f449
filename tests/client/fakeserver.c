#include "tests/client/fakeserver.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"
#include "src/common/frame.h"

struct reader_ctx
{
    struct fake_server *s;
    int fd;
};

static void send_response(int fd, Idalloc__ClientResponse *r)
{
    uint8_t buf[4096];
    size_t n = idalloc__client_response__get_packed_size(r);
    if (n + IDA_FRAME_HEADER_BYTES > sizeof(buf)) {
        abort(); /* the fake's own answers are tiny */
    }
    ida_frame_header_encode(buf, IDA_FRAME_CLIENT_RESPONSE, n);
    idalloc__client_response__pack(r, buf + IDA_FRAME_HEADER_BYTES);
    ssize_t w = send(fd, buf, n + IDA_FRAME_HEADER_BYTES, MSG_NOSIGNAL);
    (void)w; /* the client may be gone */
}

/* Fill @res for @q the way a healthy leader would. Holds s->mu. */
static void answer(struct fake_server *s,
                   const Idalloc__ClientRequest *q,
                   Idalloc__CommandResult *res,
                   Idalloc__AllocResult *ar,
                   Idalloc__ReserveResult *rr)
{
    switch (q->op_case) {
        case IDALLOC__CLIENT_REQUEST__OP_ALLOC:
            ar->id = 1000 + q->request_seq; /* lets the client check matching */
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_ALLOC;
            res->alloc = ar;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_RESERVE:
            rr->first = s->next_block;
            rr->count = q->reserve->count;
            s->next_block += q->reserve->count;
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
            res->reserve = rr;
            break;
        default:
            res->error = IDA_EINVAL;
            break;
    }
}

static int on_frame(void *arg,
                    enum ida_frame_type type,
                    const uint8_t *p,
                    uint32_t len)
{
    struct reader_ctx *ctx = arg;
    struct fake_server *s = ctx->s;
    Idalloc__ClientRequest *q =
        type == IDA_FRAME_CLIENT_REQUEST
            ? idalloc__client_request__unpack(NULL, len, p)
            : NULL;
    if (q == NULL || q->version != IDA_WIRE_VERSION || q->client_id.len != 16) {
        pthread_mutex_lock(&s->mu);
        s->violations++;
        pthread_mutex_unlock(&s->mu);
        if (q != NULL) {
            idalloc__client_request__free_unpacked(q, NULL);
        }
        return 1;
    }
    Idalloc__ClientResponse r = IDALLOC__CLIENT_RESPONSE__INIT;
    Idalloc__CommandResult res = IDALLOC__COMMAND_RESULT__INIT;
    Idalloc__AllocResult ar = IDALLOC__ALLOC_RESULT__INIT;
    Idalloc__ReserveResult rr = IDALLOC__RESERVE_RESULT__INIT;
    r.version = IDA_WIRE_VERSION;
    r.request_seq = q->request_seq;
    r.result = &res;
    Idalloc__RegisterResult reg = IDALLOC__REGISTER_RESULT__INIT;
    pthread_mutex_lock(&s->mu);
    enum fake_mode mode = s->mode;
    if (q->op_case == IDALLOC__CLIENT_REQUEST__OP_REGISTER_CLIENT) {
        s->registers++;
        memcpy(s->registered, q->client_id.data, 16);
        reg.created = 1;
        res.result_case = IDALLOC__COMMAND_RESULT__RESULT_REGISTER_CLIENT;
        res.register_client = &reg;
        mode = FAKE_ANSWER;
    } else {
        if (s->nseen < FAKE_SEEN_MAX) {
            s->seen_seq[s->nseen] = q->request_seq;
            s->seen_ack[s->nseen] = q->ack_below;
            memcpy(s->seen_client[s->nseen], q->client_id.data, 16);
            s->nseen++;
        }
        if (s->expire_next > 0 && mode == FAKE_ANSWER) {
            s->expire_next--;
            res.error = IDA_EEXPIRED;
        } else if (mode == FAKE_ANSWER) {
            answer(s, q, &res, &ar, &rr);
        }
    }
    pthread_mutex_unlock(&s->mu);
    int rv = 0;
    if (mode == FAKE_ANSWER) {
        send_response(ctx->fd, &r);
    } else if (mode == FAKE_NOT_LEADER) {
        res.error = IDA_ENOTLEADER;
        r.leader_addr = s->hint_addr;
        send_response(ctx->fd, &r);
    } else if (mode == FAKE_ERROR) {
        res.error = s->error;
        res.error_msg = "scripted failure";
        send_response(ctx->fd, &r);
    } else if (mode == FAKE_GARBAGE) {
        ssize_t w = send(ctx->fd, "HTTP/1.1 400\r\n", 14, MSG_NOSIGNAL);
        (void)w;
        rv = 1;
    }
    idalloc__client_request__free_unpacked(q, NULL);
    return rv;
}

static void *reader_main(void *arg)
{
    struct reader_ctx *ctx = arg;
    struct ida_frame_decoder dec;
    ida_frame_decoder_init(&dec, IDA_FRAME_PAYLOAD_BYTES_DEFAULT);
    uint8_t buf[4096];
    for (;;) {
        ssize_t n = read(ctx->fd, buf, sizeof(buf));
        if (n <= 0 ||
            ida_frame_decoder_feed(&dec, buf, (size_t)n, on_frame, ctx) != 0) {
            break;
        }
    }
    shutdown(ctx->fd, SHUT_RDWR);
    ida_frame_decoder_close(&dec);
    free(ctx);
    return NULL;
}

static void *acceptor_main(void *arg)
{
    struct fake_server *s = arg;
    for (;;) {
        int fd = accept(s->listen_fd, NULL, NULL);
        if (fd < 0) {
            return NULL; /* listen socket shut down: stop */
        }
        pthread_mutex_lock(&s->mu);
        if (s->nconns == FAKE_CONNS_MAX) {
            s->violations++; /* a client that reconnects without end */
            pthread_mutex_unlock(&s->mu);
            close(fd);
            continue;
        }
        struct reader_ctx *ctx = malloc(sizeof(*ctx));
        ctx->s = s;
        ctx->fd = fd;
        s->conns[s->nconns] = fd;
        pthread_create(&s->readers[s->nconns], NULL, reader_main, ctx);
        s->nconns++;
        pthread_mutex_unlock(&s->mu);
    }
}

void fake_start(struct fake_server *s, enum fake_mode mode)
{
    memset(s, 0, sizeof(*s));
    s->mode = mode;
    pthread_mutex_init(&s->mu, NULL);
    s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(s->listen_fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(s->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(s->listen_fd, 64), 0);
    socklen_t al = sizeof(a);
    getsockname(s->listen_fd, (struct sockaddr *)&a, &al);
    snprintf(s->addr, sizeof(s->addr), "127.0.0.1:%u", ntohs(a.sin_port));
    pthread_create(&s->acceptor, NULL, acceptor_main, s);
}

void fake_stop(struct fake_server *s)
{
    shutdown(s->listen_fd, SHUT_RDWR);
    pthread_join(s->acceptor, NULL);
    close(s->listen_fd);
    pthread_mutex_lock(&s->mu);
    int n = s->nconns;
    for (int i = 0; i < n; i++) {
        shutdown(s->conns[i], SHUT_RDWR);
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        pthread_join(s->readers[i], NULL);
        close(s->conns[i]);
    }
    pthread_mutex_destroy(&s->mu);
}

int fake_seen(struct fake_server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->nseen;
    pthread_mutex_unlock(&s->mu);
    return n;
}
