/* idalloc bench: drive load through the client library and report. */
#ifndef IDA_BENCH_H
#define IDA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "src/client/cli.h"

/* Run the benchmark described by @cli on @c (and, with bench_threads > 1,
 * on as many more client objects made from @o, which may be NULL
 * otherwise): progress on stderr each
 * second, the summary line (or JSON) on stdout. Returns 0 when at least one
 * request succeeded; IDA_EKIND (before the run) when the pool exists with a
 * kind that does not fit the op; the last error when no request succeeded;
 * else an IDA_E* code. Errors are explained on stderr. */
int ida_bench_run(struct idalloc_client *c,
                  const struct idalloc_options *o,
                  const struct ida_cli *cli);

/* The @q quantile (0..1) of @n sorted latencies in microseconds, in ms. */
double ida_bench_quantile_ms(const uint32_t *sorted_us, size_t n, double q);

#endif /* IDA_BENCH_H */
