/* Fuzz the cluster-file parser (src/common/config.h).
 *
 * Checked: the result is 0 or IDA_ECONFIG; an error names the file and
 * leaves the output zeroed; a parsed file satisfies every rule of the
 * header (a named cluster, 1 to IDA_CONFIG_NODES_MAX nodes with distinct
 * ids and addresses that parse again to themselves, heartbeat below the
 * election timeout, a data_dir, no 0.0.0.0 or ::), and parsing is
 * deterministic. */
#include <arpa/inet.h>
#include <string.h>

#include "idalloc_errors.h"
#include "src/common/config.h"
#include "tests/fuzz/fuzz.h"

static void check_addr(const struct ida_addr *a)
{
    struct ida_addr again;
    FUZZ_CHECK(ida_addr_parse(a->text, &again) == 0);
    FUZZ_CHECK(strcmp(again.text, a->text) == 0);
    FUZZ_CHECK(strcmp(again.host, a->host) == 0);
    FUZZ_CHECK(again.port == a->port && again.family == a->family);
    FUZZ_CHECK(a->port != 0);
    /* Never "any address": other nodes dial these. */
    unsigned char b[16] = {0}, zero[16] = {0};
    FUZZ_CHECK(inet_pton(a->family, a->host, b) == 1);
    FUZZ_CHECK(memcmp(b, zero, a->family == AF_INET ? 4 : 16) != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct ida_config c, c2, zero;
    char err[IDA_ERRMSG_MAX], err2[IDA_ERRMSG_MAX];
    int rv = ida_config_parse((const char *)data, size, "fuzz.conf", &c, err);
    int rv2 =
        ida_config_parse((const char *)data, size, "fuzz.conf", &c2, err2);
    FUZZ_CHECK(rv == rv2);
    FUZZ_CHECK(memcmp(&c, &c2, sizeof(c)) == 0);
    if (rv != 0) {
        FUZZ_CHECK(rv == IDA_ECONFIG);
        FUZZ_CHECK(strncmp(err, "fuzz.conf:", 10) == 0);
        FUZZ_CHECK(strcmp(err, err2) == 0);
        FUZZ_CHECK(memcmp(&c, &zero, sizeof(c)) == 0);
        return 0;
    }
    FUZZ_CHECK(c.cluster[0] != '\0');
    FUZZ_CHECK(c.node_count >= 1 && c.node_count <= IDA_CONFIG_NODES_MAX);
    FUZZ_CHECK(c.heartbeat_ms >= 1 && c.heartbeat_ms < c.election_timeout_ms);
    FUZZ_CHECK(c.election_timeout_ms >= 10 && c.election_timeout_ms <= 600000);
    FUZZ_CHECK(c.snapshot_interval_entries >= 1 &&
               c.snapshot_interval_entries <= 1000000000);
    FUZZ_CHECK(c.data_dir[0] != '\0');
    FUZZ_CHECK(strlen(c.data_dir) < IDA_PATH_MAX - 32);
    FUZZ_CHECK(c.auto_rejoin == 0 || c.auto_rejoin == 1);
    for (unsigned i = 0; i < c.node_count; i++) {
        const struct ida_config_node *n = &c.nodes[i];
        FUZZ_CHECK(n->id >= 1 && n->id <= 65535);
        FUZZ_CHECK(ida_config_node(&c, n->id) == n);
        check_addr(&n->peer);
        check_addr(&n->client);
        FUZZ_CHECK(strcmp(n->peer.text, n->client.text) != 0);
        for (unsigned j = 0; j < i; j++) {
            const struct ida_config_node *m = &c.nodes[j];
            FUZZ_CHECK(strcmp(n->peer.text, m->peer.text) != 0);
            FUZZ_CHECK(strcmp(n->peer.text, m->client.text) != 0);
            FUZZ_CHECK(strcmp(n->client.text, m->peer.text) != 0);
            FUZZ_CHECK(strcmp(n->client.text, m->client.text) != 0);
        }
    }
    return 0;
}
