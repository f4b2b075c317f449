#include "tests/client/fakeserver.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "idalloc.h"
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

/* The kept answer of (@client, @seq), or NULL. Holds s->mu. */
static struct fake_kept *kept_find(struct fake_server *s,
                                   const uint8_t *client,
                                   uint64_t seq)
{
    for (int i = s->nkept - 1; i >= 0; i--) {
        if (s->kept[i].seq == seq &&
            memcmp(s->kept[i].client, client, 16) == 0) {
            return &s->kept[i];
        }
    }
    return NULL;
}

uint64_t fake_kept_value(struct fake_server *s,
                         const uint8_t *client,
                         uint64_t seq)
{
    pthread_mutex_lock(&s->mu);
    struct fake_kept *k = kept_find(s, client, seq);
    uint64_t v = k != NULL ? k->value : UINT64_MAX;
    pthread_mutex_unlock(&s->mu);
    return v;
}

/* With keep: the value @q gets, acting only the first time. Holds s->mu. */
static uint64_t act_once(struct fake_server *s,
                         const Idalloc__ClientRequest *q,
                         uint64_t fresh)
{
    struct fake_kept *k = kept_find(s, q->client_id.data, q->request_seq);
    if (k != NULL) {
        return k->value;
    }
    if (s->nkept == FAKE_KEPT_MAX) {
        abort(); /* a test that outgrew the fake */
    }
    k = &s->kept[s->nkept++];
    memcpy(k->client, q->client_id.data, 16);
    k->seq = q->request_seq;
    k->value = fresh;
    if (q->op_case == IDALLOC__CLIENT_REQUEST__OP_ALLOC) {
        s->next_alloc++;
    } else {
        s->next_block += q->reserve->count;
    }
    return k->value;
}

struct answers
{
    Idalloc__AllocResult ar;
    Idalloc__ReserveResult rr;
    Idalloc__FreeResult fr;
    Idalloc__LookupResult lr;
    Idalloc__PrefixResult pr;
    Idalloc__PoolCreateResult pc;
    uint8_t prefix[3];
};

/* Fill @res for @q the way a healthy leader would. Holds s->mu. */
static void answer(struct fake_server *s,
                   const Idalloc__ClientRequest *q,
                   Idalloc__CommandResult *res,
                   struct answers *a)
{
    switch (q->op_case) {
        case IDALLOC__CLIENT_REQUEST__OP_ALLOC:
            /* 1000 + request_seq lets the client check matching; with keep,
             * ids in the order the fake acts. */
            a->ar.id = s->keep ? act_once(s, q, 5000 + s->next_alloc)
                               : 1000 + q->request_seq;
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_ALLOC;
            res->alloc = &a->ar;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_RESERVE:
            if (s->keep) {
                a->rr.first = act_once(s, q, s->next_block);
            } else {
                a->rr.first = s->next_block;
                s->next_block += q->reserve->count;
            }
            a->rr.count = q->reserve->count;
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_RESERVE;
            res->reserve = &a->rr;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_FREE:
            a->fr.freed = q->free->id % 2; /* odd ids were held */
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_FREE;
            res->free = &a->fr;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_LOOKUP:
            a->lr.id = q->lookup->tag.len; /* the tag's length */
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_LOOKUP;
            res->lookup = &a->lr;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_PREFIX_ALLOC:
            a->prefix[0] = 0xab;
            a->prefix[1] = (uint8_t)q->prefix_alloc->tag.len;
            a->prefix[2] = 0x01;
            a->pr.prefix.data = a->prefix;
            a->pr.prefix.len = 3;
            a->pr.existed = 1;
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC;
            res->prefix_alloc = &a->pr;
            break;
        case IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE:
            a->pc.created =
                q->pool_create->kind == IDALLOC__POOL_KIND__POOL_KIND_BOUNDED;
            res->result_case = IDALLOC__COMMAND_RESULT__RESULT_POOL_CREATE;
            res->pool_create = &a->pc;
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
    struct answers ans;
    idalloc__alloc_result__init(&ans.ar);
    idalloc__reserve_result__init(&ans.rr);
    idalloc__free_result__init(&ans.fr);
    idalloc__lookup_result__init(&ans.lr);
    idalloc__prefix_result__init(&ans.pr);
    idalloc__pool_create_result__init(&ans.pc);
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
        } else if (mode == FAKE_ANSWER || mode == FAKE_LATE) {
            answer(s, q, &res, &ans);
        } else if (mode == FAKE_ACT_SILENT) {
            answer(s, q, &res, &ans); /* acts (and keeps), then is silent */
        }
    }
    unsigned late_ms = s->late_ms;
    pthread_mutex_unlock(&s->mu);
    int rv = 0;
    if (mode == FAKE_ANSWER) {
        send_response(ctx->fd, &r);
    } else if (mode == FAKE_LATE) {
        struct timespec d = {late_ms / 1000, (long)(late_ms % 1000) * 1000000};
        nanosleep(&d, NULL);
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

uint64_t fake_seen_seq(struct fake_server *s, int i)
{
    pthread_mutex_lock(&s->mu);
    uint64_t seq = s->seen_seq[i];
    pthread_mutex_unlock(&s->mu);
    return seq;
}

void fake_set_mode(struct fake_server *s, enum fake_mode m)
{
    pthread_mutex_lock(&s->mu);
    s->mode = m;
    pthread_mutex_unlock(&s->mu);
}

/* --- the fixture of the client tests ---------------------------------- */

struct fake_server fx_srv[3];
int fx_nsrv;
struct idalloc_client *fx_cli;

void fx_start(int n, enum fake_mode m0, enum fake_mode m1, enum fake_mode m2)
{
    enum fake_mode modes[3] = {m0, m1, m2};
    fx_nsrv = n;
    for (int i = 0; i < n; i++) {
        fake_start(&fx_srv[i], modes[i]);
    }
}

struct idalloc_client *fx_new_client(const char *addrs,
                                     unsigned attempt_ms,
                                     unsigned call_ms)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = addrs;
    o.attempt_timeout_ms = attempt_ms;
    o.call_timeout_ms = call_ms;
    char err[IDALLOC_ERRMSG_MAX];
    struct idalloc_client *c = NULL;
    cr_assert_eq(idalloc_client_new(&o, &c, err), 0, "%s", err);
    return c;
}

void fx_connect(unsigned attempt_ms, unsigned call_ms)
{
    char addrs[256] = "";
    for (int i = 0; i < fx_nsrv; i++) {
        strcat(addrs, i > 0 ? "," : "");
        strcat(addrs, fx_srv[i].addr);
    }
    fx_cli = fx_new_client(addrs, attempt_ms, call_ms);
}

void fx_teardown(void)
{
    idalloc_client_free(fx_cli);
    fx_cli = NULL;
    for (int i = 0; i < fx_nsrv; i++) {
        fake_stop(&fx_srv[i]);
        cr_assert_eq(fx_srv[i].violations, 0, "server %d saw bad requests", i);
    }
}

uint64_t fx_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}
