/* idalloc bench: drive load through the client library and report. */
#ifndef IDA_BENCH_H
#define IDA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "src/client/cli.h"

/* Run the benchmark described by @cli on @c: progress on stderr each
 * second, the summary line (or JSON) on stdout. Returns 0 when the run
 * finished (whatever its error counts), else an IDA_E* code. */
int ida_bench_run(struct idalloc_client *c, const struct ida_cli *cli);

/* The @q quantile (0..1) of @n sorted latencies in microseconds, in ms. */
double ida_bench_quantile_ms(const uint32_t *sorted_us, size_t n, double q);

#endif /* IDA_BENCH_H */
