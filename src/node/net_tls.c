#include "src/node/net_tls.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"

int ida_net_tls_open(const struct ida_config *cfg,
                     unsigned self_id,
                     struct ida_net_tls *out,
                     char *errmsg)
{
    memset(out, 0, sizeof(*out));
    if (!cfg->peer_tls && cfg->client_tls == IDA_CLIENT_TLS_OFF) {
        return 0;
    }
    char ca[IDA_PATH_MAX + 16], crt[IDA_PATH_MAX + 32], key[IDA_PATH_MAX + 32];
    snprintf(ca, sizeof(ca), "%s/ca.crt", cfg->tls_dir);
    snprintf(crt, sizeof(crt), "%s/node%u.crt", cfg->tls_dir, self_id);
    snprintf(key, sizeof(key), "%s/node%u.key", cfg->tls_dir, self_id);
    int rv = ida_tls_ctx_new(IDA_TLS_SERVER_MUTUAL, ca, crt, key, &out->peer_in,
                             errmsg);
    if (rv == 0) {
        struct ida_tls_identity id = ida_tls_ctx_identity(out->peer_in);
        char who[48];
        if (id.kind != IDA_TLS_NODE || id.id != self_id) {
            snprintf(errmsg, IDA_ERRMSG_MAX,
                     "certificate %.300s names %s, not node %u (its subject "
                     "must be CN=idalloc-node-%u)",
                     crt, ida_tls_identity_text(id, who, sizeof(who)), self_id,
                     self_id);
            rv = IDA_ECONFIG;
        }
    }
    if (rv == 0 && cfg->peer_tls) {
        rv = ida_tls_ctx_new(IDA_TLS_CLIENT, ca, crt, key, &out->peer_out,
                             errmsg);
    }
    if (rv == 0 && cfg->client_tls != IDA_CLIENT_TLS_OFF) {
        rv = ida_tls_ctx_new(cfg->client_tls == IDA_CLIENT_TLS_REQUIRED
                                 ? IDA_TLS_SERVER_MUTUAL
                                 : IDA_TLS_SERVER_CERT_OPTIONAL,
                             ca, crt, key, &out->client, errmsg);
    }
    if (rv == 0 && !cfg->peer_tls) {
        /* Loaded only to check the node's own certificate. */
        ida_tls_ctx_free(out->peer_in);
        out->peer_in = NULL;
    }
    if (rv != 0) {
        ida_net_tls_close(out);
    }
    return rv;
}

void ida_net_tls_close(struct ida_net_tls *t)
{
    ida_tls_ctx_free(t->peer_in);
    ida_tls_ctx_free(t->peer_out);
    ida_tls_ctx_free(t->client);
    memset(t, 0, sizeof(*t));
}

struct tls_write
{
    uv_write_t req;
    size_t len;
    uint8_t data[];
};

static void tls_write_cb(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows up as a read error/EOF too */
    ida_free(req->data);
}

int ida_net_tls_flush(struct ida_tls *s, uv_stream_t *stream)
{
    size_t n = ida_tls_out_pending(s);
    if (n == 0) {
        return 0;
    }
    struct tls_write *w = ida_malloc(sizeof(*w) + n);
    if (w == NULL) {
        return IDA_ENOMEM;
    }
    w->len = ida_tls_out_take(s, w->data, n);
    w->req.data = w;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
    if (uv_is_closing((uv_handle_t *)stream) ||
        uv_write(&w->req, stream, &b, 1, tls_write_cb) != 0) {
        ida_free(w);
        return IDA_ECLOSED;
    }
    return 0;
}

void ida_net_remote_host(uv_tcp_t *tcp, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    snprintf(buf, cap, "?");
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0) {
        return;
    }
    if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, buf, cap);
    } else if (ss.ss_family == AF_INET) {
        uv_ip4_name((struct sockaddr_in *)&ss, buf, cap);
    }
}

void ida_net_refusal_log(struct ida_net_refusals *r,
                         uint64_t now_ms,
                         const char *text)
{
    struct ida_net_refusal_slot *s = NULL, *oldest = &r->slot[0];
    for (int i = 0; i < IDA_NET_REFUSAL_SLOTS; i++) {
        if (strncmp(r->slot[i].key, text, sizeof(r->slot[i].key) - 1) == 0 &&
            r->slot[i].key[0] != '\0') {
            s = &r->slot[i];
            break;
        }
        if (r->slot[i].last_ms < oldest->last_ms) {
            oldest = &r->slot[i];
        }
    }
    if (s != NULL && now_ms - s->last_ms < IDA_NET_REFUSAL_LOG_MS) {
        s->repeats++;
        return;
    }
    if (s == NULL) {
        s = oldest;
        snprintf(s->key, sizeof(s->key), "%s", text);
        s->repeats = 0;
    }
    if (s->repeats > 0) {
        IDA_WARN("net: %s (and %llu more like it since the last such line)",
                 text, (unsigned long long)s->repeats);
    } else {
        IDA_WARN("net: %s", text);
    }
    s->last_ms = now_ms;
    s->repeats = 0;
}
