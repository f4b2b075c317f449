/* Logging: one line per event, to stderr.
 *
 * Line format (one write(2) per line, so lines from threads never mix):
 *   2026-11-21T09:52:31.123Z INFO node=1 raft: became leader term=3
 * The node id is process-wide (set once at start; 0 prints as "-").
 * With ida_log_set_json(1) each line is one JSON object with the same
 * fields instead (the message escaped as a JSON string; bytes that are not
 * UTF-8 become U+FFFD):
 *   {"ts":"2026-11-21T09:52:31.123Z","level":"INFO","node":1,
 *    "msg":"raft: became leader term=3"}
 * Messages below the level are dropped cheaply. Thread-safe. */
#ifndef IDA_LOG_H
#define IDA_LOG_H

enum ida_log_level {
    IDA_LOG_DEBUG = 0,
    IDA_LOG_INFO = 1,
    IDA_LOG_WARN = 2,
    IDA_LOG_ERROR = 3,
};

void ida_log_set_node(unsigned node_id);
void ida_log_set_level(enum ida_log_level level);
enum ida_log_level ida_log_get_level(void);
/* Parse "debug", "info", "warn" or "error". Returns 0 or IDA_EINVAL. */
int ida_log_level_parse(const char *s, enum ida_log_level *out);
/* 1: one JSON object per line; 0: the text line (default). */
void ida_log_set_json(int on);
/* Redirect output to @fd (default 2). For tests. */
void ida_log_set_fd(int fd);

void ida_log(enum ida_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define IDA_DEBUG(...) ida_log(IDA_LOG_DEBUG, __VA_ARGS__)
#define IDA_INFO(...)  ida_log(IDA_LOG_INFO, __VA_ARGS__)
#define IDA_WARN(...)  ida_log(IDA_LOG_WARN, __VA_ARGS__)
#define IDA_ERROR(...) ida_log(IDA_LOG_ERROR, __VA_ARGS__)

#endif /* IDA_LOG_H */
