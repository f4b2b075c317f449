/* idalloc --json (or -w json): the answer of status, member list, list,
 * lookup, alloc, reserve, next, prefix and bench as one JSON document on
 * stdout, built with jansson. Part of bin/idalloc only: libidalloc does not
 * link jansson.
 *
 * Every document is an object. On success it holds the command's fields
 * (README, "JSON output"); on failure it is {"error": {"code": "IDA_E...",
 * "message": "...", "detail": "..."}} and the usual one-line message still
 * goes to stderr; the exit code is the plain output's in both cases.
 *
 * Tags are JSON strings. A tag given on the command line that is not valid
 * UTF-8 is refused before anything is sent (exit 2), as the node refuses
 * them; a tag read back from the cluster (list) that is not valid UTF-8 is
 * written as "tag_hex" (its bytes in hex) instead of "tag". Counters above
 * 2^63-1 (JSON integers that jansson and most readers hold exactly stop
 * there) are written as decimal strings.
 */
#ifndef IDA_CLI_JSON_H
#define IDA_CLI_JSON_H

#include <stdint.h>

#include "src/client/cli.h"

/* Run @cli (cli->json set, one of the commands above except bench) on @c,
 * with @call (its request id, --request-id; its detail on failure), and
 * print its document. Returns the process exit code. */
int ida_cli_json_run(struct idalloc_client *c,
                     const struct ida_cli *cli,
                     struct idalloc_call *call);

/* bench's summary as a JSON object on stdout (fields as the plain line). */
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
                        double max_ms);

#endif /* IDA_CLI_JSON_H */
