#include "src/client/cli_json.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/heap.h"

/* A document under construction: every setter below tolerates a NULL value
 * (jansson's answer to out of memory or invalid UTF-8) by marking the
 * document broken, so callers build without checking each step. */
struct doc
{
    json_t *root;
    int broken;
};

static void put(struct doc *d, json_t *obj, const char *key, json_t *v)
{
    if (obj == NULL || v == NULL || json_object_set_new(obj, key, v) != 0) {
        d->broken = 1;
    }
}

static void append(struct doc *d, json_t *arr, json_t *v)
{
    if (arr == NULL || v == NULL || json_array_append_new(arr, v) != 0) {
        d->broken = 1;
    }
}

/* Integers above 2^63-1 as decimal strings (cli_json.h). */
static json_t *u64(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX) {
        return json_integer((json_int_t)v);
    }
    char buf[24];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    return json_string(buf);
}

static json_t *hex_bytes(const uint8_t *p, size_t n)
{
    char *s = ida_malloc(2 * n + 1);
    if (s == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(s + 2 * i, 3, "%02x", p[i]);
    }
    s[2 * n] = '\0';
    json_t *v = json_string(s);
    ida_free(s);
    return v;
}

/* Print and free the document; returns @code, or 1 if it could not be
 * built or written (the reason on stderr). */
static int emit(struct doc *d, int code)
{
    int rv = code;
    if (d->broken || d->root == NULL) {
        fprintf(stderr, "idalloc: out of memory building the JSON output\n");
        rv = 1;
    } else if (json_dumpf(d->root, stdout, JSON_COMPACT) != 0 ||
               putchar('\n') == EOF) {
        fprintf(stderr, "idalloc: cannot write the JSON output\n");
        rv = 1;
    }
    json_decref(d->root);
    return rv;
}

/* The call of this run (its request id and error detail). */
static struct idalloc_call *jcall;

/* The error document, and the plain output's line on stderr. */
static int error_doc(const char *what, int rv)
{
    const char *detail = jcall->errmsg;
    fprintf(stderr, "idalloc: %s: %s%s%s%s\n", what, idalloc_strerror(rv),
            detail[0] != '\0' ? " (" : "", detail,
            detail[0] != '\0' ? ")" : "");
    struct doc d = {json_object(), 0};
    json_t *e = json_object();
    put(&d, e, "code", json_string(idalloc_errname(rv)));
    put(&d, e, "message", json_string(idalloc_strerror(rv)));
    /* The detail may quote server bytes: dropped if not UTF-8. */
    json_t *det = json_string(detail);
    put(&d, e, "detail", det != NULL ? det : json_string(""));
    char id[IDALLOC_CALL_ID_TEXT_MAX];
    if (jcall->state == IDALLOC_CALL_UNKNOWN &&
        idalloc_call_format(jcall, id) == 0) {
        /* Repeat the command with --request-id to learn the outcome. */
        put(&d, e, "request_id", json_string(id));
        fprintf(stderr,
                "idalloc: %s: request id %s: repeat the same command with "
                "--request-id %s to learn its outcome (exactly once)\n",
                what, id, id);
    }
    put(&d, d.root, "error", e);
    return emit(&d, idalloc_exit_code(rv));
}

static int tag_ok(const char *cmd, const char *tag)
{
    json_t *v = json_string(tag);
    if (v == NULL) {
        fprintf(stderr,
                "idalloc: %s: the tag is not valid UTF-8; the cluster keeps "
                "UTF-8 tags only\n",
                cmd);
        return 0;
    }
    json_decref(v);
    return 1;
}

static int cmd_list(struct idalloc_client *c, const char *pool)
{
    struct doc d = {json_object(), 0};
    json_t *arr = json_array();
    int has_after = 0, more = 1;
    uint64_t after = 0;
    while (more) {
        struct idalloc_holding *h;
        size_t n;
        int rv =
            idalloc_list(c, pool, has_after, after, 0, &h, &n, &more, jcall);
        if (rv != 0) {
            json_decref(d.root);
            json_decref(arr);
            return error_doc("list", rv);
        }
        for (size_t i = 0; i < n; i++) {
            json_t *o = json_object();
            put(&d, o, "id", u64(h[i].id));
            json_t *t = json_string(h[i].tag);
            if (t != NULL) {
                put(&d, o, "tag", t);
            } else {
                put(&d, o, "tag_hex",
                    hex_bytes((const uint8_t *)h[i].tag, strlen(h[i].tag)));
            }
            append(&d, arr, o);
        }
        if (n > 0) {
            after = h[n - 1].id;
            has_after = 1;
        } else {
            more = 0; /* an empty page ends the walk whatever it says */
        }
        idalloc_holdings_free(h, n);
    }
    put(&d, d.root, "pool", json_string(pool));
    put(&d, d.root, "holdings", arr);
    return emit(&d, 0);
}

static int cmd_next(struct idalloc_client *c, const struct ida_cli *cli)
{
    uint64_t first;
    int rv = idalloc_reserve(c, cli->pool, cli->count, &first, jcall);
    if (rv != 0) {
        return error_doc("next", rv);
    }
    struct doc d = {json_object(), 0};
    json_t *ids = json_array();
    for (uint64_t id = first; id < first + cli->count && !d.broken; id++) {
        if (cli->hex) {
            char buf[IDALLOC_HEX_ID_LEN + 1];
            idalloc_format_hex(id, buf);
            append(&d, ids, json_string(buf));
        } else {
            append(&d, ids, u64(id));
        }
    }
    put(&d, d.root, "pool", json_string(cli->pool));
    put(&d, d.root, "first", u64(first));
    put(&d, d.root, "last", u64(first + cli->count - 1));
    put(&d, d.root, "count", u64(cli->count));
    put(&d, d.root, "ids", ids);
    return emit(&d, 0);
}

static json_t *node_doc(struct doc *d,
                        const struct idalloc_node_status *s,
                        int verbose)
{
    json_t *o = json_object();
    put(d, o, "node", json_integer(s->node_id));
    put(d, o, "address", json_string(s->address));
    put(d, o, "role", json_string(s->role));
    put(d, o, "term", u64(s->term));
    put(d, o, "commit", u64(s->commit_index));
    put(d, o, "applied", u64(s->applied_index));
    put(d, o, "leader", json_integer(s->leader_id));
    put(d, o, "log_first", u64(s->log_first_index));
    put(d, o, "log_last", u64(s->log_last_index));
    put(d, o, "snapshot", u64(s->snapshot_index));
    if (!verbose) {
        return o;
    }
    json_t *peers = json_array();
    for (size_t k = 0; k < s->n_peers; k++) {
        json_t *p = json_object();
        put(d, p, "node", json_integer(s->peers[k].node_id));
        put(d, p, "match", u64(s->peers[k].match_index));
        put(d, p, "next", u64(s->peers[k].next_index));
        put(d, p, "state", json_string(s->peers[k].state));
        put(d, p, "connected", json_boolean(s->peers[k].connected));
        append(d, peers, p);
    }
    put(d, o, "peers", peers);
    json_t *errs = json_array();
    for (size_t k = 0; k < s->n_errors; k++) {
        json_t *e = json_object();
        put(d, e, "code", json_string(idalloc_errname(s->errors[k].code)));
        put(d, e, "count", u64(s->errors[k].count));
        put(d, e, "last_seen_unix_ms", u64(s->errors[k].last_seen_unix_ms));
        json_t *t = json_string(s->errors[k].text);
        put(d, e, "text", t != NULL ? t : json_string(""));
        append(d, errs, e);
    }
    put(d, o, "errors", errs);
    return o;
}

/* The exit codes of the plain status (idalloc status --help). */
static int cmd_status(struct idalloc_client *c, int verbose)
{
    struct doc d = {json_object(), 0};
    json_t *nodes = json_array();
    int answered = 0, missing = 0, last = 0;
    unsigned leader = 0;
    for (size_t i = 0; i < idalloc_node_count(c); i++) {
        struct idalloc_node_status s;
        int rv = idalloc_node_status(c, i, &s, jcall);
        if (rv != 0) {
            json_t *o = json_object();
            put(&d, o, "address", json_string(s.address));
            put(&d, o, "error",
                json_string(rv == IDA_EUNAVAIL || rv == IDA_ECLOSED
                                ? "unreachable"
                                : idalloc_strerror(rv)));
            put(&d, o, "code", json_string(idalloc_errname(rv)));
            append(&d, nodes, o);
            last = rv;
            missing++;
            continue;
        }
        answered++;
        if (strcmp(s.role, "leader") == 0) {
            leader = s.node_id;
        }
        append(&d, nodes, node_doc(&d, &s, verbose));
    }
    put(&d, d.root, "nodes", nodes);
    put(&d, d.root, "leader", leader != 0 ? json_integer(leader) : json_null());
    put(&d, d.root, "answered", json_integer(answered));
    put(&d, d.root, "missing", json_integer(missing));
    int code =
        answered == 0
            ? (idalloc_exit_code(last) == 3 ? 3 : idalloc_exit_code(last))
        : leader == 0 ? 3
        : missing > 0 ? 1
                      : 0;
    return emit(&d, code);
}

static int cmd_member_list(struct idalloc_client *c)
{
    struct idalloc_member_list *l = ida_malloc(sizeof(*l));
    if (l == NULL) {
        return error_doc("member list", IDA_ENOMEM);
    }
    int rv = idalloc_member_list(c, l, jcall);
    if (rv != 0) {
        ida_free(l);
        return error_doc("member list", rv);
    }
    struct doc d = {json_object(), 0};
    json_t *arr = json_array();
    for (size_t i = 0; i < l->n; i++) {
        const struct idalloc_member *m = &l->members[i];
        char inc[17];
        snprintf(inc, sizeof(inc), "%016llx",
                 (unsigned long long)m->incarnation);
        json_t *o = json_object();
        put(&d, o, "id", json_integer(m->id));
        put(&d, o, "role",
            json_string(m->waiting ? "waiting"
                        : m->voter ? "voter"
                                   : "learner"));
        put(&d, o, "incarnation", json_string(inc));
        put(&d, o, "match", u64(m->match_index));
        put(&d, o, "connected", json_boolean(m->connected));
        put(&d, o, "peer", json_string(m->peer_addr));
        put(&d, o, "client", json_string(m->client_addr));
        put(&d, o, "leader",
            json_boolean(m->id == l->leader_id && !m->waiting));
        append(&d, arr, o);
    }
    put(&d, d.root, "leader", json_integer(l->leader_id));
    put(&d, d.root, "commit", u64(l->commit_index));
    put(&d, d.root, "members", arr);
    ida_free(l);
    return emit(&d, 0);
}

/* alloc, lookup, prefix: one tagged answer. */
static int cmd_tagged(struct idalloc_client *c, const struct ida_cli *cli)
{
    const char *what = cli->cmd == IDA_CLI_ALLOC    ? "alloc"
                       : cli->cmd == IDA_CLI_LOOKUP ? "lookup"
                                                    : "prefix";
    if (!tag_ok(what, cli->tag)) {
        return 2;
    }
    uint64_t id = 0;
    uint8_t prefix[9];
    size_t plen = 0;
    int rv = cli->cmd == IDA_CLI_ALLOC
                 ? idalloc_alloc(c, cli->pool, cli->tag, &id, NULL, jcall)
             : cli->cmd == IDA_CLI_LOOKUP
                 ? idalloc_lookup(c, cli->pool, cli->tag, &id, jcall)
                 : idalloc_prefix(c, cli->pool, cli->tag, prefix, &plen, NULL,
                                  jcall);
    if (rv != 0) {
        return error_doc(what, rv);
    }
    struct doc d = {json_object(), 0};
    put(&d, d.root, "pool", json_string(cli->pool));
    put(&d, d.root, "tag", json_string(cli->tag));
    if (cli->cmd == IDA_CLI_PREFIX) {
        put(&d, d.root, "prefix", hex_bytes(prefix, plen));
    } else {
        put(&d, d.root, "id", u64(id));
    }
    return emit(&d, 0);
}

int ida_cli_json_run(struct idalloc_client *c,
                     const struct ida_cli *cli,
                     struct idalloc_call *call)
{
    jcall = call;
    json_set_alloc_funcs(ida_malloc, ida_free);
    uint64_t first;
    int rv;
    switch (cli->cmd) {
        case IDA_CLI_ALLOC:
        case IDA_CLI_LOOKUP:
        case IDA_CLI_PREFIX:
            return cmd_tagged(c, cli);
        case IDA_CLI_LIST:
            return cmd_list(c, cli->pool);
        case IDA_CLI_NEXT:
            return cmd_next(c, cli);
        case IDA_CLI_STATUS:
            return cmd_status(c, cli->verbose);
        case IDA_CLI_MEMBER_LIST:
            return cmd_member_list(c);
        case IDA_CLI_RESERVE: {
            rv = idalloc_reserve(c, cli->pool, cli->count, &first, jcall);
            if (rv != 0) {
                return error_doc("reserve", rv);
            }
            struct doc d = {json_object(), 0};
            put(&d, d.root, "pool", json_string(cli->pool));
            put(&d, d.root, "first", u64(first));
            put(&d, d.root, "last", u64(first + cli->count - 1));
            put(&d, d.root, "count", u64(cli->count));
            return emit(&d, 0);
        }
        default:
            break;
    }
    /* The parser accepts --json only on the commands above and bench. */
    fprintf(stderr, "idalloc: --json does not apply to this command\n");
    return 2;
}

void ida_cli_json_bench(const char *op,
                        unsigned clients,
                        uint64_t ok,
                        uint64_t errors,
                        uint64_t unknown,
                        double ops_per_s,
                        double ids_per_s,
                        double p50_ms,
                        double p99_ms,
                        double p999_ms,
                        double max_ms)
{
    json_set_alloc_funcs(ida_malloc, ida_free);
    struct doc d = {json_object(), 0};
    put(&d, d.root, "op", json_string(op));
    put(&d, d.root, "clients", json_integer(clients));
    put(&d, d.root, "ok", u64(ok));
    put(&d, d.root, "errors", u64(errors));
    put(&d, d.root, "unknown", u64(unknown));
    put(&d, d.root, "ops_per_s", json_real(ops_per_s));
    put(&d, d.root, "ids_per_s", json_real(ids_per_s));
    put(&d, d.root, "p50_ms", json_real(p50_ms));
    put(&d, d.root, "p99_ms", json_real(p99_ms));
    put(&d, d.root, "p999_ms", json_real(p999_ms));
    put(&d, d.root, "max_ms", json_real(max_ms));
    (void)emit(&d, 0);
}
