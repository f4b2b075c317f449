#include "base/assert.h"

#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

_Noreturn void ida__assert_fail(const char *expr,
                                const char *file,
                                int line,
                                const char *func)
{
    fprintf(stderr, "assertion failed: %s (%s:%d in %s)\n", expr, file, line,
            func);
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    abort();
}
