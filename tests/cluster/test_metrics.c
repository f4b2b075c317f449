/* GET /metrics and /healthz of real idallocd processes (metrics= on their
 * node lines): the exposition is well formed (checked by the parser below,
 * Prometheus text format 0.0.4), names every series README lists, and the
 * values move with the work done; /healthz is 200 while a leader is known
 * and 503 once the node is cut from a majority. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <ctype.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/collapse.h"
#include "tests/lib/harness.h"

static struct tc c;
static unsigned mport[3];
static char body[1 << 20];

static void teardown(void)
{
    tc_destroy(&c);
}

/* metrics=127.0.0.1:PORT on every node line, never one of the file's own
 * ports. */
static void add_metrics(struct tc *t, void *arg)
{
    (void)arg;
    char cmd[2048];
    for (int i = 0; i < 3; i++) {
        mport[i] = tc_free_port();
        for (int j = 0; j < 3; j++) {
            if (mport[i] == t->cfg.nodes[j].peer.port ||
                mport[i] == t->cfg.nodes[j].client.port ||
                (j < i && mport[i] == mport[j])) {
                mport[i] = tc_free_port();
                j = -1;
            }
        }
        snprintf(cmd, sizeof(cmd),
                 "sed -i 's/^node %d .*/& metrics=127.0.0.1:%u/' %s", i + 1,
                 mport[i], t->conf);
        cr_assert_eq(system(cmd), 0);
    }
}

/* Three nodes, each with metrics=127.0.0.1:PORT on its line. */
static void setup(void)
{
    /* Snapshots every 5 entries, so the snapshot series move too. */
    tc_start_edited(&c, 3, "snapshot_interval_entries 5\n", add_metrics, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader elected");
}

/* The same, with no huge-page collapser (huge_page_collapse off). */
static void setup_no_collapser(void)
{
    tc_start_edited(&c, 3,
                    "snapshot_interval_entries 5\nhuge_page_collapse off\n",
                    add_metrics, NULL);
    cr_assert_geq(tc_wait_leader(&c, 20000), 0, "no leader elected");
}

/* GET @path from node @i's metrics port: the status code, the body in
 * body[]. */
static int get(int i, const char *method, const char *path)
{
    int status = tc_http(mport[i], method, path, body, sizeof(body));
    cr_assert_neq(status, -1, "node %d's metrics port did not answer", i + 1);
    return status;
}

/* --- an exposition parser ------------------------------------------------ */

static int name_ok(const char *s, size_t n)
{
    if (n == 0 ||
        !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':')) {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':')) {
            return 0;
        }
    }
    return 1;
}

#define FAMILIES_MAX 128

/* Check every line of @text against the text format: NULL when well
 * formed (*samples: how many samples), else what is wrong with which line
 * (a static buffer). */
static const char *exposition_error(const char *text, int *samples)
{
    static char why[512];
    char fam[FAMILIES_MAX][96], type[FAMILIES_MAX][16];
    int nfam = 0;
    *samples = 0;
    char *save, *copy = strdup(text);
    const char *err = NULL;
#define BAD(what)                                             \
    do {                                                      \
        snprintf(why, sizeof(why), "%s: %.300s", what, line); \
        err = why;                                            \
        goto out;                                             \
    } while (0)
    for (char *line = strtok_r(copy, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# HELP ", 7) == 0) {
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char n[96], t[16];
            if (sscanf(line, "# TYPE %95s %15s", n, t) != 2 ||
                !name_ok(n, strlen(n))) {
                BAD("bad TYPE line");
            }
            if (strcmp(t, "counter") != 0 && strcmp(t, "gauge") != 0 &&
                strcmp(t, "histogram") != 0) {
                BAD("unknown type");
            }
            for (int k = 0; k < nfam; k++) {
                if (strcmp(fam[k], n) == 0) {
                    BAD("TYPE twice");
                }
            }
            if (nfam == FAMILIES_MAX) {
                BAD("too many families for this parser");
            }
            strcpy(fam[nfam], n);
            strcpy(type[nfam++], t);
            continue;
        }
        if (line[0] == '#') {
            BAD("unknown comment");
        }
        /* name{label="value",...} value */
        size_t nl = strcspn(line, "{ ");
        if (!name_ok(line, nl)) {
            BAD("bad metric name");
        }
        char *p = line + nl;
        if (*p == '{') {
            p++;
            while (*p != '}') {
                size_t ln = strcspn(p, "=");
                if (!name_ok(p, ln) || p[ln] != '=' || p[ln + 1] != '"') {
                    BAD("bad label");
                }
                p += ln + 2;
                while (*p != '"') {
                    if (*p == '\0' || (*p == '\\' && p[1] == '\0')) {
                        BAD("unterminated label value");
                    }
                    p += *p == '\\' ? 2 : 1;
                }
                p++;
                if (*p == ',') {
                    p++;
                }
                if (*p != '}' && !isalpha((unsigned char)*p) && *p != '_') {
                    BAD("bad label list");
                }
            }
            p++;
        }
        if (*p != ' ') {
            BAD("no space before the value");
        }
        char *end;
        strtod(p + 1, &end);
        if (end == p + 1 || *end != '\0') {
            BAD("bad value");
        }
        /* The sample belongs to a family declared above it. */
        int found = 0;
        for (int k = 0; k < nfam && !found; k++) {
            size_t fl = strlen(fam[k]);
            if (strncmp(line, fam[k], fl) != 0) {
                continue;
            }
            const char *rest = line + fl;
            found = rest == line + nl || (strcmp(type[k], "histogram") == 0 &&
                                          (strncmp(rest, "_bucket{", 8) == 0 ||
                                           strncmp(rest, "_sum", 4) == 0 ||
                                           strncmp(rest, "_count", 6) == 0));
        }
        if (!found) {
            BAD("sample without a TYPE above it");
        }
        (*samples)++;
    }
#undef BAD
out:
    free(copy);
    return err;
}

static int check_exposition(void)
{
    int samples;
    const char *err = exposition_error(body, &samples);
    cr_assert_null(err, "%s", err);
    return samples;
}

/* Negative control: the parser refuses what the format does not allow. */
Test(metrics, the_exposition_parser_catches_bad_text)
{
    int n;
    const char *good =
        "# HELP a_total x\n# TYPE a_total counter\n"
        "a_total{op=\"x\",k=\"a\\\"b\"} 3\n"
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\n"
        "h_sum 0.5\nh_count 1\n";
    cr_assert_null(exposition_error(good, &n), "%s",
                   exposition_error(good, &n));
    cr_assert_eq(n, 4);
    static const char *const bad[] = {
        "a_total 1\n",                             /* no TYPE */
        "# TYPE a counter\n# TYPE a gauge\na 1\n", /* TYPE twice */
        "# TYPE a summaryish\na 1\n",              /* unknown type */
        "# TYPE a gauge\n9a 1\n",                  /* bad name */
        "# TYPE a gauge\na{op=\"x} 1\n",           /* unterminated */
        "# TYPE a gauge\na{op=x} 1\n",             /* unquoted */
        "# TYPE a gauge\na 1x\n",                  /* bad value */
        "# TYPE a gauge\na\t1\n",                  /* no space */
        "# TYPE a gauge\n# whatever\na 1\n",       /* comment */
        "# TYPE a gauge\na_bucket{le=\"1\"} 1\n",  /* not a histo */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_not_null(exposition_error(bad[i], &n), "accepted: %s",
                           bad[i]);
    }
}

/* The value of the sample whose line starts with @prefix (name and labels
 * as written), or -1. */
static double value_of(const char *prefix)
{
    return tc_metric(body, prefix);
}

static const char *const required[] = {
    "idalloc_requests_total",
    "idalloc_request_duration_seconds_bucket",
    "idalloc_request_duration_seconds_sum",
    "idalloc_raft_term",
    "idalloc_raft_role",
    "idalloc_raft_commit_index",
    "idalloc_raft_applied_index",
    "idalloc_raft_leader_changes_total",
    "idalloc_raft_proposals_failed_total",
    "idalloc_storage_fsync_duration_seconds_bucket",
    "idalloc_storage_written_bytes_total",
    "idalloc_storage_raft_batches_total",
    "idalloc_snapshots_total",
    "idalloc_snapshot_size_bytes",
    "idalloc_snapshot_duration_seconds_count",
    "idalloc_snapshot_store_duration_seconds_count",
    "idalloc_snapshot_install_duration_seconds_count",
    "idalloc_raft_log_entries",
    "idalloc_client_connections",
    "idalloc_sessions",
    "idalloc_pool_info",
    "idalloc_pool_held_ids",
    "idalloc_pool_size_ids",
    "idalloc_sequence_next",
    "idalloc_processor_step_duration_seconds_bucket{processor=\"raft\"",
    "idalloc_processor_step_duration_seconds_count{processor=\"storage\"}",
    "idalloc_processor_longest_step_seconds{processor=\"fsm\"}",
    "idalloc_huge_page_collapser_running",
    "idalloc_huge_page_pieces_total{result=\"collapsed\"}",
    "idalloc_huge_page_pieces_total{result=\"already\"}",
    "idalloc_huge_page_pieces_total{result=\"skipped\"}",
    "idalloc_huge_page_pieces_waiting",
    "idalloc_huge_page_ranges_dropped_total",
    "idalloc_huge_page_sweeps_total",
};

Test(metrics,
     scraped_well_formed_and_moving,
     .init = setup,
     .fini = teardown,
     .timeout = 120)
{
    int leader = tc_wait_leader(&c, 20000);
    struct idalloc_client *cl = tc_client(&c, 20000);
    cr_assert_eq(idalloc_pool_create(cl, "b", IDALLOC_POOL_BOUNDED, 1000, NULL,
                                     tc_detail()),
                 0);
    cr_assert_eq(idalloc_pool_create(cl, "s", IDALLOC_POOL_SEQUENCE, 0, NULL,
                                     tc_detail()),
                 0);
    uint64_t id, first;
    cr_assert_eq(idalloc_reserve(cl, "s", 10, &first, tc_detail()), 0);

    cr_assert_eq(get(leader, "GET", "/metrics"), 200);
    cr_assert_gt(check_exposition(), 50);
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        cr_assert_not_null(strstr(body, required[i]), "%s missing",
                           required[i]);
    }
    cr_assert_eq(value_of("idalloc_raft_role{role=\"leader\"}"), 1);
    double allocs0 = value_of(
        "idalloc_requests_total{op=\"alloc\","
        "outcome=\"ok\"}");
    double applied0 = value_of("idalloc_raft_applied_index");
    double fsyncs0 = value_of("idalloc_storage_fsync_duration_seconds_count");
    double written0 = value_of("idalloc_storage_written_bytes_total");
    double fsm_steps0 = value_of(
        "idalloc_processor_step_duration_seconds_count{processor=\"fsm\"}");
    cr_assert_geq(allocs0, 0);

    for (int i = 0; i < 25; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "t%d", i);
        cr_assert_eq(idalloc_alloc(cl, "b", tag, &id, NULL, tc_detail()), 0);
    }
    cr_assert_eq(idalloc_lookup(cl, "b", "nobody", &id, tc_detail()),
                 IDA_ENOTFOUND);
    idalloc_client_free(cl);

    /* The pool table is published at most once a second, and a snapshot
     * that falls due pauses up to a second before it starts, and waits
     * while another node encodes one, up to 10 s for a node's first
     * (src/node/snap_policy.h, TURNS): wait for both. (10 s was too short
     * once, in a `make asan` run.) */
    uint64_t end = tc_now_ms() + 30000;
    do {
        tc_sleep_ms(200);
        cr_assert_eq(get(leader, "GET", "/metrics"), 200);
    } while ((value_of("idalloc_pool_held_ids{pool=\"b\"}") != 25 ||
              value_of("idalloc_snapshots_total") < 1 ||
              value_of("idalloc_raft_log_entries") >=
                  value_of("idalloc_raft_applied_index")) &&
             tc_now_ms() < end);
    check_exposition();
    cr_assert_eq(value_of("idalloc_pool_held_ids{pool=\"b\"}"), 25);
    cr_assert_eq(value_of("idalloc_pool_size_ids{pool=\"b\"}"), 1000);
    cr_assert_eq(value_of("idalloc_sequence_next{pool=\"s\"}"), 11);
    cr_assert_eq(value_of("idalloc_pool_info{pool=\"s\",kind=\"sequence\"}"),
                 1);
    cr_assert_eq(
        value_of("idalloc_requests_total{op=\"alloc\",outcome=\"ok\"}"),
        allocs0 + 25);
    cr_assert_eq(value_of("idalloc_request_duration_seconds_count{op=\""
                          "alloc\"}"),
                 allocs0 + 25);
    cr_assert_eq(
        value_of("idalloc_requests_total{op=\"lookup\",outcome=\"definite\"}"),
        1);
    cr_assert_geq(value_of("idalloc_raft_applied_index"), applied0 + 1);
    cr_assert_gt(value_of("idalloc_storage_fsync_duration_seconds_count"),
                 fsyncs0);
    cr_assert_gt(value_of("idalloc_storage_written_bytes_total"), written0);
    /* Each step stores at least one raft batch. */
    cr_assert_geq(value_of("idalloc_storage_raft_batches_total"),
                  value_of("idalloc_storage_fsync_duration_seconds_count"));
    cr_assert_geq(value_of("idalloc_raft_leader_changes_total"), 1);
    /* Every alloc was applied by a call of the fsm processor of its own
     * (one at a time), and each call took some time. */
    cr_assert_geq(value_of("idalloc_processor_step_duration_seconds_count{"
                           "processor=\"fsm\"}"),
                  fsm_steps0 + 25);
    cr_assert_gt(value_of("idalloc_processor_step_duration_seconds_sum{"
                          "processor=\"fsm\"}"),
                 0);
    cr_assert_gt(
        value_of("idalloc_processor_longest_step_seconds{processor=\"raft\"}"),
        0);
    cr_assert_geq(value_of("idalloc_sessions"), 1);
    /* The node runs the collapser (huge_page_collapse on by default)
     * wherever this system can collapse: tried here the same way. */
    int can = ida_collapse_start(false) == 0;
    ida_collapse_stop();
    cr_assert_eq(value_of("idalloc_huge_page_collapser_running"), can,
                 "this system %s collapse", can ? "can" : "cannot");
    /* snapshot_interval_entries 5 is only the floor: after the first, a
     * snapshot waits for as many log bytes as the last one had
     * (src/node/snap_policy.h), so ~30 small entries give one or two. */
    cr_assert_geq(value_of("idalloc_snapshots_total"), 1);
    cr_assert_gt(value_of("idalloc_snapshot_size_bytes"), 0);
    cr_assert_geq(value_of("idalloc_snapshot_store_duration_seconds_count"), 1);
    /* The log is compacted: far fewer entries held than applied. */
    cr_assert_lt(value_of("idalloc_raft_log_entries"),
                 value_of("idalloc_raft_applied_index"));
    /* Histogram buckets are cumulative and end at the count. */
    cr_assert_eq(value_of("idalloc_request_duration_seconds_bucket{op=\""
                          "alloc\",le=\"+Inf\"}"),
                 allocs0 + 25);

    /* Only GET of the two paths. */
    cr_assert_eq(get(leader, "GET", "/nothing"), 404);
    cr_assert_eq(get(leader, "POST", "/metrics"), 405);
}

Test(metrics,
     healthz_follows_the_leader,
     .init = setup_no_collapser,
     .fini = teardown,
     .timeout = 120)
{
    int leader = tc_wait_leader(&c, 20000);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(get(i, "GET", "/healthz"), 200, "node %d: %s", i + 1,
                     body);
    }
    /* Cut one node from both others: it loses its leader. */
    int lone = (leader + 1) % 3;
    for (int i = 0; i < 3; i++) {
        if (i != lone) {
            tc_signal(&c, i, SIGKILL);
        }
    }
    int status = 0;
    for (uint64_t end = tc_now_ms() + 20000;
         (status = get(lone, "GET", "/healthz")) == 200 && tc_now_ms() < end;) {
        tc_sleep_ms(100);
    }
    cr_assert_eq(status, 503, "%s", body);
    cr_assert_eq(get(lone, "GET", "/metrics"), 200);
    cr_assert_eq(value_of("idalloc_raft_leader_id"), 0);
    cr_assert_eq(value_of("idalloc_huge_page_collapser_running"), 0,
                 "huge_page_collapse off, yet the collapser runs");
    cr_assert_eq(value_of("idalloc_huge_page_pieces_total{result="
                          "\"collapsed\"}"),
                 0);
    cr_assert_geq(tc_log_count(&c, lone, "huge_page_collapse off"), 1);
}
