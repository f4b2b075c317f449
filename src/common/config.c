#include "src/common/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/heap.h"
#include "idalloc_errors.h"

#define FIELDS_MAX            8
#define CONFIG_FILE_BYTES_MAX (1u << 20)

struct parser
{
    const char *name;
    unsigned line;
    char *errmsg;
    /* Line where each single-valued key was first seen, 0 if not yet. */
    unsigned seen_cluster, seen_data_dir, seen_election, seen_heartbeat;
    unsigned seen_snapshot, seen_log_level, seen_rejoin, seen_collapse;
    unsigned seen_tls_dir, seen_peer_tls, seen_client_tls;
    unsigned seen_limit[8]; /* limit_keys[], by position */
};

/* The client port's limits: plain numbers with a range. */
struct limit_key
{
    const char *key;
    size_t offset; /* of the uint64_t in struct ida_config */
    uint64_t min, max;
};

static const struct limit_key limit_keys[] = {
    {"client_connections_max",
     offsetof(struct ida_config, client_connections_max), 1, 1000000},
    {"client_connections_reserve",
     offsetof(struct ida_config, client_connections_reserve), 0, 1024},
    {"client_idle_timeout_ms",
     offsetof(struct ida_config, client_idle_timeout_ms), 100, 86400000},
    {"client_frame_timeout_ms",
     offsetof(struct ida_config, client_frame_timeout_ms), 10, 3600000},
    {"client_queue_bytes_max",
     offsetof(struct ida_config, client_queue_bytes_max), 65536, 1ull << 30},
    {"client_output_bytes_max",
     offsetof(struct ida_config, client_output_bytes_max), 65536, 1ull << 40},
    {"client_input_bytes_max",
     offsetof(struct ida_config, client_input_bytes_max), 4u << 20, 1ull << 40},
};

static int perr(struct parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int perr(struct parser *p, const char *fmt, ...)
{
    int n = snprintf(p->errmsg, IDA_ERRMSG_MAX, "%s:%u: ", p->name, p->line);
    if (n < 0 || n >= IDA_ERRMSG_MAX - 1) {
        return IDA_ECONFIG; /* a file name that fills the message */
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->errmsg + n, IDA_ERRMSG_MAX - (size_t)n, fmt, ap);
    va_end(ap);
    return IDA_ECONFIG;
}

int ida_addr_parse(const char *s, struct ida_addr *out)
{
    memset(out, 0, sizeof(*out));
    size_t len = strlen(s);
    if (len == 0 || len >= IDA_ADDR_TEXT_MAX) {
        return IDA_EINVAL;
    }
    const char *colon = strrchr(s, ':');
    if (colon == NULL) {
        return IDA_EINVAL;
    }
    const char *host = s;
    size_t host_len = (size_t)(colon - s);
    if (s[0] == '[') {
        if (host_len < 2 || s[host_len - 1] != ']') {
            return IDA_EINVAL;
        }
        host = s + 1;
        host_len -= 2;
    }
    if (host_len == 0 || host_len >= sizeof(out->host)) {
        return IDA_EINVAL;
    }
    memcpy(out->host, host, host_len);
    out->host[host_len] = '\0';
    const char *port = colon + 1;
    if (*port == '\0' || strlen(port) > 5) {
        return IDA_EINVAL;
    }
    unsigned long pv = 0;
    for (const char *c = port; *c != '\0'; c++) {
        if (!isdigit((unsigned char)*c)) {
            return IDA_EINVAL;
        }
        pv = pv * 10 + (unsigned long)(*c - '0');
    }
    if (pv == 0 || pv > 65535) {
        return IDA_EINVAL;
    }
    unsigned char buf[16];
    if (s[0] == '[' && inet_pton(AF_INET6, out->host, buf) == 1) {
        out->family = AF_INET6;
    } else if (s[0] != '[' && inet_pton(AF_INET, out->host, buf) == 1) {
        out->family = AF_INET;
    } else {
        return IDA_EINVAL;
    }
    out->port = (uint16_t)pv;
    memcpy(out->text, s, len + 1);
    return 0;
}

/* Parse a decimal number in [min, max]. */
static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (*s == '\0' || strlen(s) > 20) {
        return IDA_EINVAL;
    }
    uint64_t v = 0;
    for (const char *c = s; *c != '\0'; c++) {
        if (!isdigit((unsigned char)*c)) {
            return IDA_EINVAL;
        }
        uint64_t d = (uint64_t)(*c - '0');
        if (v > (UINT64_MAX - d) / 10) {
            return IDA_EINVAL;
        }
        v = v * 10 + d;
    }
    if (v < min || v > max) {
        return IDA_EINVAL;
    }
    *out = v;
    return 0;
}

static int valid_cluster_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > IDA_CLUSTER_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-') {
            return 0;
        }
    }
    return 1;
}

/* Check a key that may appear once; remember where it was seen. */
static int once(struct parser *p, unsigned *seen, const char *key)
{
    if (*seen != 0) {
        return perr(p, "duplicate \"%s\" line (first on line %u)", key, *seen);
    }
    *seen = p->line;
    return 0;
}

static int want_fields(struct parser *p, int nf, int want, const char *usage)
{
    if (nf < want) {
        return perr(p, "missing field: expected \"%s\"", usage);
    }
    if (nf > want) {
        return perr(p, "too many fields: expected \"%s\"", usage);
    }
    return 0;
}

static int addr_taken(const struct ida_config *c,
                      const struct ida_addr *a,
                      unsigned *by)
{
    for (unsigned i = 0; i < c->node_count; i++) {
        if (strcmp(c->nodes[i].peer.text, a->text) == 0 ||
            strcmp(c->nodes[i].client.text, a->text) == 0 ||
            (c->nodes[i].has_metrics &&
             strcmp(c->nodes[i].metrics.text, a->text) == 0)) {
            *by = c->nodes[i].id;
            return 1;
        }
    }
    return 0;
}

/* The cluster file's addresses are also the ones peers and clients dial. */
int ida_addr_unspecified(const struct ida_addr *a)
{
    unsigned char b[16];
    if (a->family == AF_INET) {
        return inet_pton(AF_INET, a->host, b) == 1 &&
               memcmp(b, "\0\0\0\0", 4) == 0;
    }
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0,    0,
                                             0, 0, 0, 0, 0xff, 0xff};
    return inet_pton(AF_INET6, a->host, b) == 1 &&
           (memcmp(b, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16) == 0 ||
            (memcmp(b, mapped, 12) == 0 && memcmp(b + 12, "\0\0\0\0", 4) == 0));
}

static int parse_node(struct parser *p, struct ida_config *c, char **f, int nf)
{
    int metrics = nf == 5 && strncmp(f[4], "metrics=", 8) == 0;
    int rv = want_fields(p, metrics ? 4 : nf, 4,
                         "node ID PEER_ADDR CLIENT_ADDR [metrics=ADDR]");
    if (rv != 0) {
        return rv;
    }
    uint64_t id;
    if (parse_u64(f[1], 1, 65535, &id) != 0) {
        return perr(p, "bad node id \"%s\": expected a number in [1, 65535]",
                    f[1]);
    }
    if (ida_config_node(c, (unsigned)id) != NULL) {
        return perr(p, "duplicate node id %u", (unsigned)id);
    }
    if (c->node_count == IDA_CONFIG_NODES_MAX) {
        return perr(p, "too many nodes (at most %d)", IDA_CONFIG_NODES_MAX);
    }
    struct ida_config_node *n = &c->nodes[c->node_count];
    n->id = (unsigned)id;
    for (int i = 0; i < 2; i++) {
        struct ida_addr *a = i == 0 ? &n->peer : &n->client;
        const char *what = i == 0 ? "peer" : "client";
        if (ida_addr_parse(f[2 + i], a) != 0) {
            return perr(p,
                        "bad %s address \"%s\": expected IPv4:PORT or "
                        "[IPv6]:PORT",
                        what, f[2 + i]);
        }
        if (ida_addr_unspecified(a)) {
            return perr(p,
                        "%s address %s is not an address other nodes can "
                        "dial (%s means any address); give this node's own "
                        "IP",
                        what, a->text, a->family == AF_INET ? "0.0.0.0" : "::");
        }
        unsigned by;
        if (addr_taken(c, a, &by) ||
            (i == 1 && strcmp(n->peer.text, a->text) == 0)) {
            return perr(p, "%s address %s is already used%s", what, a->text,
                        i == 1 && strcmp(n->peer.text, a->text) == 0
                            ? " as this node's peer address"
                            : " by another node");
        }
    }
    if (metrics) {
        unsigned by;
        if (ida_addr_parse(f[4] + 8, &n->metrics) != 0) {
            return perr(p,
                        "bad metrics address \"%s\": expected "
                        "metrics=IPv4:PORT or metrics=[IPv6]:PORT",
                        f[4] + 8);
        }
        if (ida_addr_unspecified(&n->metrics)) {
            return perr(p,
                        "metrics address %s means any address: give one of "
                        "this node's (it serves /metrics without TLS or "
                        "authentication: one only your monitoring reaches)",
                        n->metrics.text);
        }
        if (addr_taken(c, &n->metrics, &by) ||
            strcmp(n->peer.text, n->metrics.text) == 0 ||
            strcmp(n->client.text, n->metrics.text) == 0) {
            return perr(p, "metrics address %s is already used",
                        n->metrics.text);
        }
        n->has_metrics = 1;
    }
    c->node_count++;
    return 0;
}

/* "KEY on|off", once: *@out 1 or 0. */
static int parse_switch_key(struct parser *p,
                            char **f,
                            int nf,
                            unsigned *seen,
                            int *out)
{
    char usage[64];
    snprintf(usage, sizeof(usage), "%s on|off", f[0]);
    int rv;
    if ((rv = once(p, seen, f[0])) != 0 ||
        (rv = want_fields(p, nf, 2, usage)) != 0) {
        return rv;
    }
    if (strcmp(f[1], "on") != 0 && strcmp(f[1], "off") != 0) {
        return perr(p, "bad %s \"%s\": expected on or off", f[0], f[1]);
    }
    *out = strcmp(f[1], "on") == 0;
    return 0;
}

static int parse_number_key(struct parser *p,
                            char **f,
                            int nf,
                            unsigned *seen,
                            uint64_t min,
                            uint64_t max,
                            uint64_t *out)
{
    int rv = once(p, seen, f[0]);
    if (rv == 0) {
        rv = want_fields(p, nf, 2, f[0]);
    }
    if (rv != 0) {
        return rv;
    }
    if (parse_u64(f[1], min, max, out) != 0) {
        return perr(p,
                    "bad value \"%s\" for %s: expected a number in "
                    "[%llu, %llu]",
                    f[1], f[0], (unsigned long long)min,
                    (unsigned long long)max);
    }
    return 0;
}

/* tls_dir DIR: relative to the directory of the cluster file (p->name). */
static int parse_tls_dir(struct parser *p, struct ida_config *c, const char *d)
{
    const char *slash = strrchr(p->name, '/');
    int base = d[0] != '/' && slash != NULL ? (int)(slash - p->name) : 0;
    if (strlen(d) + (size_t)base + 1 >= IDA_PATH_MAX - 32) {
        return perr(p, "tls_dir path is too long");
    }
    snprintf(c->tls_dir, sizeof(c->tls_dir), "%.*s%s%s", base, p->name,
             base > 0 ? "/" : "", d);
    return 0;
}

static int parse_tls_line(struct parser *p,
                          struct ida_config *c,
                          char **f,
                          int nf)
{
    const char *k = f[0];
    int rv;
    if (strcmp(k, "tls_dir") == 0) {
        if ((rv = once(p, &p->seen_tls_dir, k)) != 0 ||
            (rv = want_fields(p, nf, 2, "tls_dir DIR")) != 0) {
            return rv;
        }
        return parse_tls_dir(p, c, f[1]);
    }
    if (strcmp(k, "peer_tls") == 0) {
        if ((rv = once(p, &p->seen_peer_tls, k)) != 0 ||
            (rv = want_fields(p, nf, 2, "peer_tls on|off")) != 0) {
            return rv;
        }
        if (strcmp(f[1], "on") != 0 && strcmp(f[1], "off") != 0) {
            return perr(p, "bad peer_tls \"%s\": expected on or off", f[1]);
        }
        c->peer_tls = strcmp(f[1], "on") == 0;
        return 0;
    }
    if ((rv = once(p, &p->seen_client_tls, k)) != 0 ||
        (rv = want_fields(p, nf, 2, "client_tls off|on|required")) != 0) {
        return rv;
    }
    if (strcmp(f[1], "off") == 0) {
        c->client_tls = IDA_CLIENT_TLS_OFF;
    } else if (strcmp(f[1], "on") == 0) {
        c->client_tls = IDA_CLIENT_TLS_ON;
    } else if (strcmp(f[1], "required") == 0) {
        c->client_tls = IDA_CLIENT_TLS_REQUIRED;
    } else {
        return perr(p, "bad client_tls \"%s\": expected off, on or required",
                    f[1]);
    }
    return 0;
}

static int parse_line(struct parser *p, struct ida_config *c, char **f, int nf)
{
    uint64_t v;
    int rv;
    const char *k = f[0];
    if (strcmp(k, "node") == 0) {
        return parse_node(p, c, f, nf);
    }
    if (strcmp(k, "cluster") == 0) {
        if ((rv = once(p, &p->seen_cluster, k)) != 0 ||
            (rv = want_fields(p, nf, 2, "cluster NAME")) != 0) {
            return rv;
        }
        if (!valid_cluster_name(f[1])) {
            return perr(p,
                        "bad cluster name \"%s\": 1-%d characters of "
                        "A-Z a-z 0-9 . _ -",
                        f[1], IDA_CLUSTER_NAME_MAX);
        }
        strcpy(c->cluster, f[1]);
        return 0;
    }
    if (strcmp(k, "data_dir") == 0) {
        if ((rv = once(p, &p->seen_data_dir, k)) != 0 ||
            (rv = want_fields(p, nf, 2, "data_dir PATH")) != 0) {
            return rv;
        }
        if (strlen(f[1]) >= IDA_PATH_MAX - 32) {
            return perr(p, "data_dir path is too long");
        }
        strcpy(c->data_dir, f[1]);
        return 0;
    }
    if (strcmp(k, "log_level") == 0) {
        if ((rv = once(p, &p->seen_log_level, k)) != 0 ||
            (rv = want_fields(p, nf, 2, "log_level LEVEL")) != 0) {
            return rv;
        }
        if (ida_log_level_parse(f[1], &c->log_level) != 0) {
            return perr(p,
                        "bad log_level \"%s\": expected debug, info, "
                        "warn or error",
                        f[1]);
        }
        return 0;
    }
    if (strcmp(k, "auto_rejoin") == 0) {
        return parse_switch_key(p, f, nf, &p->seen_rejoin, &c->auto_rejoin);
    }
    if (strcmp(k, "huge_page_collapse") == 0) {
        return parse_switch_key(p, f, nf, &p->seen_collapse,
                                &c->huge_page_collapse);
    }
    if (strcmp(k, "tls_dir") == 0 || strcmp(k, "peer_tls") == 0 ||
        strcmp(k, "client_tls") == 0) {
        return parse_tls_line(p, c, f, nf);
    }
    if (strcmp(k, "election_timeout_ms") == 0) {
        rv = parse_number_key(p, f, nf, &p->seen_election, 10, 600000, &v);
        c->election_timeout_ms = (unsigned)v;
        return rv;
    }
    if (strcmp(k, "heartbeat_ms") == 0) {
        rv = parse_number_key(p, f, nf, &p->seen_heartbeat, 1, 600000, &v);
        c->heartbeat_ms = (unsigned)v;
        return rv;
    }
    for (size_t i = 0; i < sizeof(limit_keys) / sizeof(limit_keys[0]); i++) {
        const struct limit_key *lk = &limit_keys[i];
        if (strcmp(k, lk->key) == 0) {
            return parse_number_key(p, f, nf, &p->seen_limit[i], lk->min,
                                    lk->max,
                                    (uint64_t *)((char *)c + lk->offset));
        }
    }
    if (strcmp(k, "snapshot_interval_entries") == 0) {
        rv = parse_number_key(p, f, nf, &p->seen_snapshot, 1, 1000000000,
                              &c->snapshot_interval_entries);
        return rv;
    }
    return perr(p, "unknown key \"%s\"", k);
}

/* Split @line in place into at most FIELDS_MAX fields; drop a comment: a
 * `#` at the start of the line or after a space or tab. A `#` inside a
 * field is part of it (`data_dir /srv/a#1` is that path). */
static int split(char *line, char **f)
{
    for (char *c = line; *c != '\0'; c++) {
        if (*c == '#' && (c == line || c[-1] == ' ' || c[-1] == '\t')) {
            *c = '\0';
            break;
        }
    }
    int nf = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " \t\r", &save); t != NULL;
         t = strtok_r(NULL, " \t\r", &save)) {
        if (nf == FIELDS_MAX) {
            return FIELDS_MAX + 1;
        }
        f[nf++] = t;
    }
    return nf;
}

static void set_defaults(struct ida_config *c)
{
    memset(c, 0, sizeof(*c));
    strcpy(c->data_dir, "data");
    c->election_timeout_ms = 300;
    c->heartbeat_ms = 50;
    c->snapshot_interval_entries = 10000;
    c->log_level = IDA_LOG_INFO;
    c->auto_rejoin = 1;
    c->huge_page_collapse = 1;
    c->client_connections_max = 4096;
    c->client_connections_reserve = 16;
    c->client_idle_timeout_ms = 300000;
    c->client_frame_timeout_ms = 10000;
    c->client_queue_bytes_max = 16u << 20;
    c->client_output_bytes_max = 64u << 20;
    c->client_input_bytes_max = 64u << 20;
}

/* Checks that need the whole file. */
static int check_whole(struct parser *p, struct ida_config *c)
{
    if (p->seen_cluster == 0) {
        snprintf(p->errmsg, IDA_ERRMSG_MAX,
                 "%s:%u: missing required line \"cluster NAME\"", p->name,
                 p->line);
        return IDA_ECONFIG;
    }
    if (c->node_count == 0) {
        snprintf(p->errmsg, IDA_ERRMSG_MAX,
                 "%s:%u: missing required line \"node ID PEER_ADDR "
                 "CLIENT_ADDR\"",
                 p->name, p->line);
        return IDA_ECONFIG;
    }
    if (p->seen_tls_dir == 0 && p->seen_peer_tls == 0) {
        snprintf(p->errmsg, IDA_ERRMSG_MAX,
                 "%s: peer links need a TLS setting: add \"tls_dir DIR\" "
                 "(mutual TLS with DIR/ca.crt, DIR/nodeI.crt, DIR/nodeI.key; "
                 "`idalloc certs create DIR --nodes N` makes them) or "
                 "\"peer_tls off\" (plaintext peers, not for untrusted "
                 "networks)",
                 p->name);
        return IDA_ECONFIG;
    }
    if (p->seen_peer_tls == 0) {
        c->peer_tls = 1; /* tls_dir alone turns TLS on for peers */
    }
    if (c->peer_tls && p->seen_tls_dir == 0) {
        p->line = p->seen_peer_tls;
        return perr(p, "peer_tls on needs a \"tls_dir DIR\" line");
    }
    if (c->client_tls != IDA_CLIENT_TLS_OFF && p->seen_tls_dir == 0) {
        p->line = p->seen_client_tls;
        return perr(p,
                    "client_tls on or required needs a \"tls_dir DIR\" line");
    }
    if (c->heartbeat_ms >= c->election_timeout_ms) {
        p->line = p->seen_heartbeat > p->seen_election ? p->seen_heartbeat
                                                       : p->seen_election;
        return perr(p,
                    "heartbeat_ms (%u) must be less than "
                    "election_timeout_ms (%u)",
                    c->heartbeat_ms, c->election_timeout_ms);
    }
    if (c->client_queue_bytes_max > c->client_output_bytes_max) {
        p->line = p->seen_limit[4] > p->seen_limit[5] ? p->seen_limit[4]
                                                      : p->seen_limit[5];
        return perr(p,
                    "client_queue_bytes_max (%llu) must not exceed "
                    "client_output_bytes_max (%llu)",
                    (unsigned long long)c->client_queue_bytes_max,
                    (unsigned long long)c->client_output_bytes_max);
    }
    return 0;
}

int ida_config_parse(const char *text,
                     size_t len,
                     const char *name,
                     struct ida_config *out,
                     char *errmsg)
{
    struct parser p = {.name = name, .errmsg = errmsg};
    struct ida_config *c = ida_malloc(sizeof(*c));
    if (c == NULL) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s: out of memory", name);
        return IDA_ENOMEM;
    }
    set_defaults(c);
    errmsg[0] = '\0';
    int rv = 0;
    size_t pos = 0;
    while (pos < len && rv == 0) {
        p.line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t ll = nl != NULL ? (size_t)(nl - (text + pos)) : len - pos;
        char line[IDA_CONFIG_LINE_MAX];
        if (ll >= sizeof(line)) {
            rv = perr(&p, "line longer than %d bytes", IDA_CONFIG_LINE_MAX - 1);
            break;
        }
        memcpy(line, text + pos, ll);
        line[ll] = '\0';
        pos += ll + (nl != NULL ? 1 : 0);
        if (memchr(line, '\0', ll) != NULL) {
            rv = perr(&p, "NUL byte in the file");
            break;
        }
        char *f[FIELDS_MAX];
        int nf = split(line, f);
        if (nf > FIELDS_MAX) {
            rv = perr(&p, "too many fields");
        } else if (nf > 0) {
            rv = parse_line(&p, c, f, nf);
        }
    }
    if (rv == 0) {
        rv = check_whole(&p, c);
    }
    if (rv == 0) {
        *out = *c;
    } else {
        memset(out, 0, sizeof(*out));
    }
    ida_free(c);
    return rv;
}

int ida_config_load(const char *path, struct ida_config *out, char *errmsg)
{
    memset(out, 0, sizeof(*out));
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s: cannot open: %s", path,
                 strerror(errno));
        return IDA_EIO;
    }
    char *buf = ida_malloc(CONFIG_FILE_BYTES_MAX + 1);
    if (buf == NULL) {
        fclose(fp);
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s: out of memory", path);
        return IDA_ENOMEM;
    }
    size_t n = fread(buf, 1, CONFIG_FILE_BYTES_MAX + 1, fp);
    int rerr = ferror(fp);
    fclose(fp);
    int rv;
    if (rerr) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s: read error", path);
        rv = IDA_EIO;
    } else if (n > CONFIG_FILE_BYTES_MAX) {
        snprintf(errmsg, IDA_ERRMSG_MAX, "%s: larger than %u bytes", path,
                 CONFIG_FILE_BYTES_MAX);
        rv = IDA_ECONFIG;
    } else {
        rv = ida_config_parse(buf, n, path, out, errmsg);
    }
    ida_free(buf);
    return rv;
}

const struct ida_config_node *ida_config_node(const struct ida_config *c,
                                              unsigned id)
{
    for (unsigned i = 0; i < c->node_count; i++) {
        if (c->nodes[i].id == id) {
            return &c->nodes[i];
        }
    }
    return NULL;
}
