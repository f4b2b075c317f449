#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idalloc_errors.h"

static atomic_uint log_node;
static atomic_int log_level = IDA_LOG_INFO;
static atomic_int log_fd = 2;

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void ida_log_set_node(unsigned node_id)
{
    atomic_store(&log_node, node_id);
}

void ida_log_set_level(enum ida_log_level level)
{
    atomic_store(&log_level, (int)level);
}

enum ida_log_level ida_log_get_level(void)
{
    return (enum ida_log_level)atomic_load(&log_level);
}

void ida_log_set_fd(int fd)
{
    atomic_store(&log_fd, fd);
}

int ida_log_level_parse(const char *s, enum ida_log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum ida_log_level)i;
            return 0;
        }
    }
    return IDA_EINVAL;
}

void ida_log(enum ida_log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load_explicit(&log_level, memory_order_relaxed)) {
        return;
    }
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    unsigned node = atomic_load(&log_node);
    char node_buf[16] = "-";
    if (node != 0) {
        snprintf(node_buf, sizeof(node_buf), "%u", node);
    }
    int lvl = level >= IDA_LOG_DEBUG && level <= IDA_LOG_ERROR ? level : 3;
    n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %s node=%s ",
                          ts.tv_nsec / 1000000, level_names[lvl], node_buf);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (m < 0) {
        m = 0;
    }
    n += (size_t)m;
    if (n > sizeof(line) - 2) {
        n = sizeof(line) - 2; /* truncated: keep the newline */
    }
    /* One line, one event: flatten embedded newlines. */
    for (size_t i = 0; i < n; i++) {
        if (line[i] == '\n') {
            line[i] = ' ';
        }
    }
    line[n++] = '\n';
    ssize_t w = write(atomic_load(&log_fd), line, n);
    (void)w; /* nowhere left to report a failed log write */
}
