/* Support of the membership tests: tests/cluster/members_load.h. */
#include "tests/cluster/members_load.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idalloc_errors.h"
#include "tests/lib/harness.h"

void *ml_load_main(void *arg)
{
    struct ml_load *l = arg;
    char tag[32];
    size_t k = 0;
    for (uint64_t op = 0; !atomic_load(l->stop) && k < ML_TAGS_MAX; op++) {
        if (op % 4 == 3 && l->blocks < ML_BLOCKS_MAX) {
            uint64_t first;
            int rv = idalloc_reserve(l->cl, "s", 10, &first, tc_detail());
            if (rv == 0) {
                l->first[l->blocks++] = first;
                l->acked++;
            } else {
                l->unknown++;
            }
            continue;
        }
        snprintf(tag, sizeof(tag), "w%d-%zu", l->no, k);
        uint64_t id;
        int rv = idalloc_alloc(l->cl, "b", tag, &id, NULL, tc_detail());
        if (rv == 0) {
            l->ids[k] = id + 1;
            l->acked++;
            k++; /* an unknown outcome asks again for the same tag */
        } else {
            l->unknown++;
            tc_sleep_ms(20);
        }
    }
    l->tags = k;
    return NULL;
}

struct idalloc_client *ml_client_of(const char *addrs)
{
    struct idalloc_options o;
    idalloc_options_init(&o);
    o.addresses = addrs;
    o.call_timeout_ms = 5000;
    o.attempt_timeout_ms = 500;
    struct idalloc_client *cl;
    char err[IDALLOC_ERRMSG_MAX];
    cr_assert_eq(idalloc_client_new(&o, &cl, err), 0, "%s", err);
    return cl;
}

size_t ml_count_voters(struct idalloc_client *cl)
{
    struct idalloc_member_list l;
    if (idalloc_member_list(cl, &l, tc_detail()) != 0) {
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < l.n; i++) {
        k += l.members[i].voter && !l.members[i].waiting;
    }
    return k;
}

int ml_is_voter(struct idalloc_client *cl, unsigned id)
{
    struct idalloc_member_list l;
    if (idalloc_member_list(cl, &l, tc_detail()) != 0) {
        return -1;
    }
    for (size_t i = 0; i < l.n; i++) {
        if (l.members[i].id == id && !l.members[i].waiting) {
            return l.members[i].voter;
        }
    }
    return 0;
}

void ml_change(struct idalloc_client *cl,
               enum idalloc_member_op op,
               unsigned id,
               const char *peer,
               const char *client)
{
    int rv = -1;
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        rv = peer != NULL
                 ? idalloc_member_change_addrs(cl, op, id, peer, client, NULL,
                                               tc_detail())
                 : idalloc_member_change(cl, op, id, NULL, tc_detail());
        if (rv == 0 || idalloc_errclass(rv) == IDA_ERR_CLASS_DEFINITE) {
            break;
        }
        tc_sleep_ms(200);
    }
    cr_assert_eq(rv, 0, "member change %d of node %u: %s", op, id, tc_errmsg());
}

void ml_wait_heard(struct idalloc_client *cl, unsigned id)
{
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (idalloc_member_list(cl, &l, tc_detail()) == 0) {
            for (size_t i = 0; i < l.n; i++) {
                if (l.members[i].id == id) {
                    return;
                }
            }
        }
        tc_sleep_ms(200);
    }
    cr_assert_fail("node %u never heard from", id);
}

void ml_wait_voter(struct idalloc_client *cl, unsigned id, int voter)
{
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        if (ml_is_voter(cl, id) == voter) {
            return;
        }
        tc_sleep_ms(200);
    }
    cr_assert_fail("node %u: voter is not %d after 60 s", id, voter);
}

void ml_wait_member_at(struct idalloc_client *cl,
                       unsigned id,
                       const char *peer,
                       const char *client)
{
    char last[256] = "never listed";
    for (uint64_t end = tc_now_ms() + 60000; tc_now_ms() < end;) {
        struct idalloc_member_list l;
        if (idalloc_member_list(cl, &l, tc_detail()) == 0) {
            for (size_t i = 0; i < l.n; i++) {
                const struct idalloc_member *m = &l.members[i];
                if (m->id != id || m->waiting) {
                    continue;
                }
                snprintf(last, sizeof(last), "peer=%s client=%s connected=%d",
                         m->peer_addr, m->client_addr, m->connected);
                if (strcmp(m->peer_addr, peer) == 0 &&
                    strcmp(m->client_addr, client) == 0 &&
                    (m->connected || m->id == l.leader_id)) {
                    return;
                }
            }
        }
        tc_sleep_ms(200);
    }
    cr_assert_fail("member %u not at %s %s and connected after 60 s (%s)", id,
                   peer, client, last);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void ml_check_acked(struct idalloc_client *op,
                    const struct ml_load *ld,
                    size_t n,
                    uint64_t during)
{
    uint64_t *all = calloc(n * ML_TAGS_MAX, sizeof(uint64_t));
    uint64_t *blocks = calloc(n * ML_BLOCKS_MAX, sizeof(uint64_t));
    cr_assert(all != NULL && blocks != NULL);
    size_t n_all = 0, n_blocks = 0;
    uint64_t unknown = 0;
    char tag[32];
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < ld[i].tags; k++) {
            if (ld[i].ids[k] == 0) {
                continue;
            }
            snprintf(tag, sizeof(tag), "w%d-%zu", ld[i].no, k);
            uint64_t got = 0;
            int rv = -1;
            for (int t = 0; t < 20 && rv != 0; t++) {
                rv = idalloc_lookup(op, "b", tag, &got, tc_detail());
            }
            cr_assert_eq(rv, 0, "lookup %s: %s", tag, tc_errmsg());
            cr_assert_eq(got, ld[i].ids[k] - 1,
                         "tag %s was acknowledged id %llu, holds %llu", tag,
                         (unsigned long long)(ld[i].ids[k] - 1),
                         (unsigned long long)got);
            all[n_all++] = got;
        }
        for (size_t b = 0; b < ld[i].blocks; b++) {
            blocks[n_blocks++] = ld[i].first[b];
        }
        unknown += ld[i].unknown;
    }
    qsort(all, n_all, sizeof(uint64_t), cmp_u64);
    for (size_t k = 1; k < n_all; k++) {
        cr_assert_neq(all[k], all[k - 1], "id %llu acknowledged to two tags",
                      (unsigned long long)all[k]);
    }
    qsort(blocks, n_blocks, sizeof(uint64_t), cmp_u64);
    for (size_t k = 1; k < n_blocks; k++) {
        cr_assert_geq(
            blocks[k], blocks[k - 1] + 10, "blocks at %llu and %llu overlap",
            (unsigned long long)blocks[k - 1], (unsigned long long)blocks[k]);
    }
    cr_log_info(
        "members: %zu tags and %zu blocks acknowledged (%llu during "
        "the changes), %llu unknown outcomes retried",
        n_all, n_blocks, (unsigned long long)during,
        (unsigned long long)unknown);
    free(all);
    free(blocks);
}

unsigned ml_new_port(const struct tc *c, const unsigned *taken, size_t n)
{
    for (;;) {
        unsigned p = tc_free_port();
        int used = 0;
        for (unsigned i = 0; i < c->cfg.node_count; i++) {
            used |= c->cfg.nodes[i].peer.port == p ||
                    c->cfg.nodes[i].client.port == p;
        }
        for (size_t i = 0; i < n; i++) {
            used |= taken[i] == p;
        }
        if (!used) {
            return p;
        }
    }
}

int ml_log_has(const struct tc *c, int node, const char *needle)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/node%d.log", c->dir, node);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    static char buf[4 << 20];
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    buf[len] = '\0';
    fclose(f);
    return strstr(buf, needle) != NULL;
}

int ml_wait_log(const struct tc *c, int node, const char *needle, unsigned ms)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        if (ml_log_has(c, node, needle)) {
            return 1;
        }
        tc_sleep_ms(100);
    }
    return 0;
}

int ml_cli(char *out, size_t cap, const char *fmt, ...)
{
    char args[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    int rc = 3;
    for (uint64_t end = tc_now_ms() + 60000; rc == 3 && tc_now_ms() < end;) {
        rc = tc_run(out, cap, "%s %s 2>&1", tc_bin("idalloc"), args);
        if (rc == 3) {
            tc_sleep_ms(300);
        }
    }
    return rc;
}

void ml_pools(struct idalloc_client *op)
{
    cr_assert_eq(idalloc_pool_create(op, "b", IDALLOC_POOL_BOUNDED, 1000000,
                                     NULL, tc_detail()),
                 0, "%s", tc_errmsg());
    cr_assert_eq(idalloc_pool_create(op, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0, "%s", tc_errmsg());
}

void ml_load_start(struct ml_load *ld,
                   int no,
                   atomic_int *stop,
                   struct idalloc_client *cl,
                   pthread_t *th)
{
    memset(ld, 0, sizeof(*ld));
    ld->no = no;
    ld->stop = stop;
    ld->cl = cl;
    cr_assert_eq(pthread_create(th, NULL, ml_load_main, ld), 0);
}
