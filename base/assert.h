/* IDA_ASSERT: invariants crash, input does not (docs/STYLE.md, "Assertions").
 *
 * IDA_ASSERT stays on in release builds. On failure it prints the
 * expression, file, line and a backtrace to stderr and aborts. Use it only
 * for programmer errors; input from clients, peers, disk and config gets an
 * error code. Dependency-free: usable from the pure cores. */
#ifndef IDA_ASSERT_H
#define IDA_ASSERT_H

_Noreturn void ida__assert_fail(const char *expr,
                                const char *file,
                                int line,
                                const char *func);

#define IDA_ASSERT(expr) \
    ((expr) ? (void)0 : ida__assert_fail(#expr, __FILE__, __LINE__, __func__))

#define IDA_UNREACHABLE() \
    ida__assert_fail("unreachable", __FILE__, __LINE__, __func__)

#endif /* IDA_ASSERT_H */
