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
static atomic_int log_json;

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

void ida_log_set_json(int on)
{
    atomic_store(&log_json, on != 0);
}

/* Length of the valid UTF-8 sequence at @p (@n bytes left), 0 if none. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len = p[0] < 0x80                             ? 1
                 : (p[0] & 0xe0) == 0xc0 && p[0] >= 0xc2 ? 2
                 : (p[0] & 0xf0) == 0xe0                 ? 3
                 : (p[0] & 0xf8) == 0xf0 && p[0] <= 0xf4 ? 4
                                                         : 0;
    if (len == 0 || len > n) {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
    }
    /* Overlong 3- and 4-byte forms, surrogates, above U+10FFFF. */
    if ((len == 3 && p[0] == 0xe0 && p[1] < 0xa0) ||
        (len == 3 && p[0] == 0xed && p[1] >= 0xa0) ||
        (len == 4 && p[0] == 0xf0 && p[1] < 0x90) ||
        (len == 4 && p[0] == 0xf4 && p[1] >= 0x90)) {
        return 0;
    }
    return len;
}

/* @msg (@len bytes) as the inside of a JSON string into @out (@cap bytes,
 * at least 7); returns the bytes written, stopping before @cap. */
static size_t json_escape(const char *msg, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)msg;
    for (size_t i = 0; i < len && o + 7 <= cap;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
            i++;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
            i++;
        } else {
            size_t k = utf8_len(p + i, len - i);
            if (k == 0) {
                memcpy(out + o, "\\ufffd", 6);
                o += 6;
                i++;
            } else {
                memcpy(out + o, p + i, k);
                o += k;
                i += k;
            }
        }
    }
    return o;
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
    va_list ap;
    va_start(ap, fmt);
    if (atomic_load_explicit(&log_json, memory_order_relaxed)) {
        char msg[1024];
        int m = vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        size_t mlen = m < 0                     ? 0
                      : (size_t)m < sizeof(msg) ? (size_t)m
                                                : sizeof(msg) - 1;
        char head[96];
        memcpy(head, line, n);
        head[n] = '\0';
        char json[8192];
        size_t j = (size_t)snprintf(
            json, sizeof(json),
            "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"node\":%u,\"msg\":\"",
            head, ts.tv_nsec / 1000000, level_names[lvl], node);
        j += json_escape(msg, mlen, json + j, sizeof(json) - j - 3);
        json[j++] = '"';
        json[j++] = '}';
        json[j++] = '\n';
        ssize_t w = write(atomic_load(&log_fd), json, j);
        (void)w;
        return;
    }
    n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %s node=%s ",
                          ts.tv_nsec / 1000000, level_names[lvl], node_buf);
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
