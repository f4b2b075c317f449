/* Cluster file parser: the README example, defaults, and every kind of
 * bad line with its file:line message. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "idalloc_errors.h"
#include "src/common/config.h"

static struct ida_config cfg;
static char err[IDA_ERRMSG_MAX];

/* Every file needs a TLS setting for its peers: the tests of other keys
 * get "peer_tls off" appended (as its last line, so line numbers hold),
 * those of the TLS keys are parsed as written. */
static int parse(const char *text)
{
    if (strstr(text, "tls") != NULL) {
        return ida_config_parse(text, strlen(text), "t.conf", &cfg, err);
    }
    char buf[8192];
    int n = snprintf(buf, sizeof(buf), "%s\npeer_tls off\n", text);
    cr_assert_lt((size_t)n, sizeof(buf));
    return ida_config_parse(buf, (size_t)n, "t.conf", &cfg, err);
}

/* Parse @text, expect IDA_ECONFIG and a message starting with @prefix and
 * containing @needle. */
static void expect_error(const char *text,
                         const char *prefix,
                         const char *needle)
{
    cr_assert_eq(parse(text), IDA_ECONFIG, "accepted:\n%s", text);
    cr_assert_eq(strncmp(err, prefix, strlen(prefix)), 0,
                 "message \"%s\" should start with \"%s\"", err, prefix);
    cr_assert(strstr(err, needle) != NULL, "message \"%s\" lacks \"%s\"", err,
              needle);
    cr_assert_null(strchr(err, '\n'), "one line: %s", err);
    cr_assert_eq(cfg.node_count, 0, "nothing half-parsed is returned");
}

#define GOOD                                       \
    "cluster  local-3\n"                           \
    "node 1 127.0.0.1:7101 127.0.0.1:7201   # c\n" \
    "node 2 127.0.0.1:7102 127.0.0.1:7202\n"       \
    "node 3 127.0.0.1:7103 127.0.0.1:7203\n"

Test(config, design_example)
{
    const char *text =
        "# comment line\n"
        "cluster  local-3\n"
        "node 1 127.0.0.1:7101 127.0.0.1:7201     # node ID, peer, client\n"
        "node 2 127.0.0.1:7102 127.0.0.1:7202\n"
        "node 3 127.0.0.1:7103 127.0.0.1:7203\n"
        "data_dir data                            # node N: data_dir/nodeN\n"
        "\n"
        "election_timeout_ms 300                  # optional tunables\n"
        "heartbeat_ms 50\n";
    cr_assert_eq(parse(text), 0, "%s", err);
    cr_assert_str_eq(cfg.cluster, "local-3");
    cr_assert_eq(cfg.node_count, 3);
    cr_assert_eq(cfg.nodes[1].id, 2);
    cr_assert_str_eq(cfg.nodes[1].peer.text, "127.0.0.1:7102");
    cr_assert_str_eq(cfg.nodes[1].peer.host, "127.0.0.1");
    cr_assert_eq(cfg.nodes[1].peer.port, 7102);
    cr_assert_eq(cfg.nodes[2].client.port, 7203);
    cr_assert_str_eq(cfg.data_dir, "data");
    cr_assert_eq(cfg.election_timeout_ms, 300);
    cr_assert_eq(cfg.heartbeat_ms, 50);
    cr_assert_not_null(ida_config_node(&cfg, 3));
    cr_assert_null(ida_config_node(&cfg, 4));
}

Test(config, defaults_and_optional_keys)
{
    cr_assert_eq(parse(GOOD), 0, "%s", err);
    cr_assert_str_eq(cfg.data_dir, "data");
    cr_assert_eq(cfg.election_timeout_ms, 300);
    cr_assert_eq(cfg.heartbeat_ms, 50);
    cr_assert_eq(cfg.snapshot_interval_entries, 10000);
    cr_assert_eq(cfg.log_level, IDA_LOG_INFO);
    cr_assert_eq(parse(GOOD "snapshot_interval_entries 500\nlog_level debug\n"
                            "data_dir /tmp/x\n"),
                 0, "%s", err);
    cr_assert_eq(cfg.snapshot_interval_entries, 500);
    cr_assert_eq(cfg.log_level, IDA_LOG_DEBUG);
    cr_assert_str_eq(cfg.data_dir, "/tmp/x");
}

Test(config, on_off_switches)
{
    cr_assert_eq(parse(GOOD), 0, "%s", err);
    cr_assert_eq(cfg.auto_rejoin, 1);
    cr_assert_eq(cfg.huge_page_collapse, 1);
    cr_assert_eq(parse(GOOD "huge_page_collapse off\nauto_rejoin off\n"), 0,
                 "%s", err);
    cr_assert_eq(cfg.huge_page_collapse, 0);
    cr_assert_eq(cfg.auto_rejoin, 0);
    cr_assert_eq(parse(GOOD "huge_page_collapse on\n"), 0, "%s", err);
    cr_assert_eq(cfg.huge_page_collapse, 1);
    expect_error(GOOD "huge_page_collapse yes\n", "t.conf:5: ",
                 "bad huge_page_collapse \"yes\": expected on or off");
    expect_error(GOOD "auto_rejoin 1\n",
                 "t.conf:5: ", "bad auto_rejoin \"1\": expected on or off");
    expect_error(GOOD "huge_page_collapse\n", "t.conf:5: ",
                 "missing field: expected \"huge_page_collapse on|off\"");
    expect_error(GOOD "huge_page_collapse off\nhuge_page_collapse off\n",
                 "t.conf:6: ", "duplicate \"huge_page_collapse\" line");
}

Test(config, ipv6_and_no_trailing_newline)
{
    cr_assert_eq(parse("cluster c\nnode 7 [::1]:9000 [::1]:9001"), 0, "%s",
                 err);
    cr_assert_eq(cfg.nodes[0].id, 7);
    cr_assert_str_eq(cfg.nodes[0].peer.host, "::1");
    cr_assert_eq(cfg.nodes[0].client.port, 9001);
}

Test(config, unknown_key)
{
    expect_error(GOOD "heartbeat 50\n",
                 "t.conf:5: ", "unknown key \"heartbeat\"");
}

Test(config, duplicate_node_id)
{
    expect_error(GOOD "node 2 127.0.0.1:7104 127.0.0.1:7204\n",
                 "t.conf:5: ", "duplicate node id 2");
}

Test(config, bad_addresses)
{
    expect_error("cluster c\nnode 1 127.0.0.1 127.0.0.1:2\n",
                 "t.conf:2: ", "bad peer address \"127.0.0.1\"");
    expect_error("cluster c\nnode 1 127.0.0.1:1 127.0.0.1:70000\n",
                 "t.conf:2: ", "bad client address");
    expect_error("cluster c\nnode 1 localhost:1 127.0.0.1:2\n",
                 "t.conf:2: ", "bad peer address");
    expect_error("cluster c\nnode 1 300.0.0.1:1 127.0.0.1:2\n",
                 "t.conf:2: ", "bad peer address");
    expect_error("cluster c\nnode 1 127.0.0.1:0 127.0.0.1:2\n",
                 "t.conf:2: ", "bad peer address");
    expect_error("cluster c\nnode 1 ::1:5 127.0.0.1:2\n",
                 "t.conf:2: ", "bad peer address");
    expect_error("cluster c\nnode 1 127.0.0.1:1x 127.0.0.1:2\n",
                 "t.conf:2: ", "bad peer address");
}

Test(config, address_used_twice)
{
    expect_error(GOOD "node 4 127.0.0.1:7201 127.0.0.1:7999\n",
                 "t.conf:5: ", "already used");
    expect_error("cluster c\nnode 1 127.0.0.1:5 127.0.0.1:5\n",
                 "t.conf:2: ", "already used");
}

Test(config, missing_fields)
{
    expect_error("cluster c\nnode 1 127.0.0.1:7101\n",
                 "t.conf:2: ", "missing field");
    expect_error("cluster\nnode 1 127.0.0.1:1 127.0.0.1:2\n",
                 "t.conf:1: ", "missing field");
    expect_error(GOOD "election_timeout_ms\n", "t.conf:5: ", "missing field");
    expect_error("node 1 127.0.0.1:1 127.0.0.1:2\n",
                 "t.conf:", "missing required line \"cluster NAME\"");
    expect_error("cluster c\n# no nodes\n", "t.conf:",
                 "missing required line "
                 "\"node");
}

Test(config, too_many_fields)
{
    expect_error("cluster c d\n", "t.conf:1: ", "too many fields");
    expect_error("cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 x\n",
                 "t.conf:2: ", "too many fields");
}

Test(config, bad_numbers)
{
    expect_error("cluster c\nnode 0 127.0.0.1:1 127.0.0.1:2\n",
                 "t.conf:2: ", "bad node id");
    expect_error("cluster c\nnode -1 127.0.0.1:1 127.0.0.1:2\n",
                 "t.conf:2: ", "bad node id");
    expect_error(GOOD "heartbeat_ms 5x\n", "t.conf:5: ", "bad value");
    expect_error(GOOD "election_timeout_ms 99999999999999999999999\n",
                 "t.conf:5: ", "bad value");
    expect_error(GOOD "election_timeout_ms 5\n", "t.conf:5: ", "bad value");
    expect_error(GOOD "heartbeat_ms 400\n",
                 "t.conf:5: ", "must be less than election_timeout_ms");
    expect_error(GOOD "log_level loud\n", "t.conf:5: ", "bad log_level");
}

Test(config, duplicate_single_keys)
{
    expect_error(GOOD "cluster other\n", "t.conf:5: ", "duplicate \"cluster\"");
    expect_error(GOOD "data_dir a\ndata_dir b\n",
                 "t.conf:6: ", "duplicate \"data_dir\" line (first on line 5)");
}

Test(config, bad_cluster_name)
{
    expect_error("cluster a/b\n", "t.conf:1: ", "bad cluster name");
}

Test(config, long_line_and_nul)
{
    char text[3000];
    memset(text, 'x', sizeof(text));
    text[sizeof(text) - 1] = '\0';
    expect_error(text, "t.conf:1: ", "line longer");
    static const char nul[] = "cluster c\nno\0de\n";
    cr_assert_eq(ida_config_parse(nul, sizeof(nul) - 1, "t.conf", &cfg, err),
                 IDA_ECONFIG);
    cr_assert(strstr(err, "t.conf:2: ") != NULL, "%s", err);
}

Test(config, too_many_nodes)
{
    char text[4096] = "cluster c\n";
    for (int i = 1; i <= IDA_CONFIG_NODES_MAX + 1; i++) {
        char line[128];
        snprintf(line, sizeof(line), "node %d 127.0.0.1:%d 127.0.0.1:%d\n", i,
                 1000 + i, 2000 + i);
        strcat(text, line);
    }
    expect_error(text, "t.conf:18: ", "too many nodes");
}

Test(config, load_file_and_missing_file)
{
    char path[] = "/tmp/ida-config-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, GOOD "bogus 1\npeer_tls off\n",
                       strlen(GOOD "bogus 1\npeer_tls off\n")),
                 (ssize_t)strlen(GOOD "bogus 1\npeer_tls off\n"));
    close(fd);
    cr_assert_eq(ida_config_load(path, &cfg, err), IDA_ECONFIG);
    char want[128];
    snprintf(want, sizeof(want), "%s:5: unknown key \"bogus\"", path);
    cr_assert_str_eq(err, want);
    unlink(path);
    cr_assert_eq(ida_config_load(path, &cfg, err), IDA_EIO);
    cr_assert(strstr(err, path) != NULL && strstr(err, "cannot open") != NULL,
              "%s", err);
}

Test(config, shipped_cluster_files_parse)
{
    /* The example `make install` ships too: a newcomer edits only its
     * names and addresses. */
    const char *files[] = {"cluster-configs/local-3.conf",
                           "cluster-configs/local-5.conf",
                           "dist/cluster.conf.example"};
    unsigned want[] = {3, 5, 3};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ida_config_load(files[i], &cfg, err), 0, "%s", err);
        cr_assert_eq(cfg.node_count, want[i]);
    }
}

Test(config, metrics_address_on_a_node_line)
{
    cr_assert_eq(parse("cluster c\n"
                       "node 1 127.0.0.1:1 127.0.0.1:2 metrics=127.0.0.1:3\n"
                       "node 2 127.0.0.1:4 127.0.0.1:5\n"),
                 0, "%s", err);
    cr_assert(cfg.nodes[0].has_metrics);
    cr_assert_str_eq(cfg.nodes[0].metrics.text, "127.0.0.1:3");
    cr_assert_eq(cfg.nodes[0].metrics.port, 3);
    cr_assert(!cfg.nodes[1].has_metrics, "off when absent");
    expect_error("cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 127.0.0.1:3\n",
                 "t.conf:2: ", "[metrics=ADDR]");
    expect_error("cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 metrics=x:3\n",
                 "t.conf:2: ", "bad metrics address \"x:3\"");
    expect_error(
        "cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 metrics=0.0.0.0:3\n",
        "t.conf:2: ", "metrics address 0.0.0.0:3 means any address");
    expect_error("cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 metrics=[::]:3\n",
                 "t.conf:2: ", "means any address");
    expect_error(
        "cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 metrics=127.0.0.1:2\n",
        "t.conf:2: ", "metrics address 127.0.0.1:2 is already used");
    expect_error(
        "cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 metrics=127.0.0.1:3\n"
        "node 2 127.0.0.1:4 127.0.0.1:3\n",
        "t.conf:3: ", "already used");
    expect_error(
        "cluster c\nnode 1 127.0.0.1:1 127.0.0.1:2 metrics=127.0.0.1:3 x\n",
        "t.conf:2: ", "too many fields");
}

Test(config, client_port_limits)
{
    cr_assert_eq(parse(GOOD), 0, "%s", err);
    cr_assert_eq(cfg.client_connections_max, 4096);
    cr_assert_eq(cfg.client_connections_reserve, 16);
    cr_assert_eq(cfg.client_idle_timeout_ms, 300000);
    cr_assert_eq(cfg.client_frame_timeout_ms, 10000);
    cr_assert_eq(cfg.client_queue_bytes_max, 16u << 20);
    cr_assert_eq(cfg.client_output_bytes_max, 64u << 20);
    cr_assert_eq(cfg.client_input_bytes_max, 64u << 20);
    cr_assert_eq(parse(GOOD "client_connections_max 100\n"
                            "client_connections_reserve 0\n"
                            "client_idle_timeout_ms 2000\n"
                            "client_frame_timeout_ms 500\n"
                            "client_queue_bytes_max 65536\n"
                            "client_output_bytes_max 1048576\n"
                            "client_input_bytes_max 8388608\n"),
                 0, "%s", err);
    cr_assert_eq(cfg.client_connections_max, 100);
    cr_assert_eq(cfg.client_connections_reserve, 0);
    cr_assert_eq(cfg.client_idle_timeout_ms, 2000);
    cr_assert_eq(cfg.client_frame_timeout_ms, 500);
    cr_assert_eq(cfg.client_queue_bytes_max, 65536);
    cr_assert_eq(cfg.client_output_bytes_max, 1048576);
    cr_assert_eq(cfg.client_input_bytes_max, 8388608);
    expect_error(GOOD "client_connections_max 0\n",
                 "t.conf:5: ", "expected a number in [1, 1000000]");
    expect_error(GOOD "client_connections_reserve 2000\n",
                 "t.conf:5: ", "bad value");
    expect_error(GOOD "client_frame_timeout_ms 1\n", "t.conf:5: ", "bad value");
    expect_error(GOOD "client_input_bytes_max 1000\n",
                 "t.conf:5: ", "bad value");
    expect_error(GOOD
                 "client_idle_timeout_ms 1000\nclient_idle_timeout_ms "
                 "2000\n",
                 "t.conf:6: ", "duplicate \"client_idle_timeout_ms\"");
    expect_error(GOOD
                 "client_output_bytes_max 100000\n"
                 "client_queue_bytes_max 200000\n",
                 "t.conf:6: ", "must not exceed client_output_bytes_max");
}

Test(config, tls_setting_is_required_and_names_both)
{
    cr_assert_eq(ida_config_parse(GOOD, strlen(GOOD), "t.conf", &cfg, err),
                 IDA_ECONFIG);
    cr_assert(strstr(err, "t.conf: ") == err, "%s", err);
    cr_assert(strstr(err, "\"tls_dir DIR\"") != NULL, "%s", err);
    cr_assert(strstr(err, "\"peer_tls off\"") != NULL, "%s", err);
    cr_assert_eq(cfg.node_count, 0, "nothing half-parsed is returned");
}

Test(config, tls_dir_is_relative_to_the_cluster_file)
{
    const char *text = GOOD "tls_dir certs\n";
    cr_assert_eq(
        ida_config_parse(text, strlen(text), "/etc/ida/c.conf", &cfg, err), 0,
        "%s", err);
    cr_assert_str_eq(cfg.tls_dir, "/etc/ida/certs");
    cr_assert_eq(cfg.peer_tls, 1, "tls_dir alone turns peer TLS on");
    cr_assert_eq(cfg.client_tls, IDA_CLIENT_TLS_OFF,
                 "client_tls off by default");
    cr_assert_eq(parse(GOOD "tls_dir certs\n"), 0, "%s", err);
    cr_assert_str_eq(cfg.tls_dir, "certs", "a file in the working directory");
    cr_assert_eq(parse(GOOD "tls_dir /abs/certs\nclient_tls required\n"), 0,
                 "%s", err);
    cr_assert_str_eq(cfg.tls_dir, "/abs/certs");
    cr_assert_eq(cfg.client_tls, IDA_CLIENT_TLS_REQUIRED);
    cr_assert_eq(parse(GOOD "peer_tls off\n"), 0, "%s", err);
    cr_assert_eq(cfg.peer_tls, 0);
    cr_assert_eq(parse(GOOD "tls_dir d\npeer_tls off\nclient_tls on\n"), 0,
                 "%s", err);
    cr_assert_eq(cfg.peer_tls, 0);
    cr_assert_eq(cfg.client_tls, IDA_CLIENT_TLS_ON);
}

Test(config, bad_tls_lines)
{
    expect_error(GOOD "peer_tls on\n",
                 "t.conf:5: ", "peer_tls on needs a \"tls_dir DIR\" line");
    expect_error(GOOD "peer_tls off\nclient_tls on\n", "t.conf:6: ",
                 "client_tls on or required needs a \"tls_dir DIR\"");
    expect_error(GOOD "peer_tls maybe\n", "t.conf:5: ", "bad peer_tls");
    expect_error(GOOD "tls_dir d\nclient_tls always\n", "t.conf:6: ",
                 "bad client_tls \"always\": expected off, on or required");
    expect_error(GOOD "tls_dir d\ntls_dir e\n",
                 "t.conf:6: ", "duplicate \"tls_dir\"");
    expect_error(GOOD "tls_dir\n", "t.conf:5: ", "missing field");
}

/* 0.0.0.0 and :: mean "any address": a node could bind them, but the
 * cluster file's addresses are the ones other nodes and clients dial. */
Test(config, unspecified_addresses_are_refused)
{
    expect_error("cluster c\nnode 1 0.0.0.0:7101 127.0.0.1:7201\n",
                 "t.conf:2: ",
                 "peer address 0.0.0.0:7101 is not an address other nodes "
                 "can dial");
    expect_error("cluster c\nnode 1 127.0.0.1:7101 0.0.0.0:7201\n",
                 "t.conf:2: ", "client address 0.0.0.0:7201 is not an address");
    expect_error("cluster c\nnode 1 [::]:7101 [::1]:7201\n", "t.conf:2: ",
                 "peer address [::]:7101 is not an address other nodes can "
                 "dial (:: means any address)");
    expect_error("cluster c\nnode 1 [::1]:7101 [0:0::0]:7201\n",
                 "t.conf:2: ", "client address [0:0::0]:7201");
    expect_error("cluster c\nnode 1 [::ffff:0.0.0.0]:7101 [::1]:7201\n",
                 "t.conf:2: ", "is not an address other nodes can dial");
    cr_assert_eq(parse("cluster c\nnode 1 0.0.0.1:7101 [::2]:7201\n"), 0, "%s",
                 err);
}

/* A `#` starts a comment only at the start of a line or after a space or
 * tab: inside a field it is part of it (data_dir a#b was silently "a"). */
Test(config, hash_inside_a_field_is_not_a_comment)
{
    cr_assert_eq(parse(GOOD "data_dir /srv/idalloc#2\n"), 0, "%s", err);
    cr_assert_str_eq(cfg.data_dir, "/srv/idalloc#2");
    cr_assert_eq(parse(GOOD "data_dir d # a comment\n#data_dir x\n"), 0, "%s",
                 err);
    cr_assert_str_eq(cfg.data_dir, "d");
    cr_assert_eq(parse(GOOD "data_dir d\t#tab, then a comment\n"), 0, "%s",
                 err);
    cr_assert_str_eq(cfg.data_dir, "d");
    expect_error(GOOD "heartbeat_ms 5#0\n",
                 "t.conf:5: ", "bad value \"5#0\" for heartbeat_ms");
    expect_error("cluster c#1\nnode 1 127.0.0.1:1 127.0.0.1:2\n",
                 "t.conf:1: ", "bad cluster name \"c#1\"");
}

/* A file name longer than the message buffer (a long --config path) used
 * to make the message's size negative and overflow the buffer. */
Test(config, very_long_file_name)
{
    static char name[3 * IDA_ERRMSG_MAX];
    memset(name, 'd', sizeof(name) - 1);
    const char *text = "cluster c\nbogus 1\n";
    cr_assert_eq(ida_config_parse(text, strlen(text), name, &cfg, err),
                 IDA_ECONFIG);
    cr_assert_lt(strlen(err), IDA_ERRMSG_MAX);
    cr_assert_eq(strncmp(err, "ddd", 3), 0);
}
