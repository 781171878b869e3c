/*
 * log: one line per event on stderr: text, "2026-11-29T21:40:00.123Z level
 * message", or (CONVERGER_LOG_FORMAT=json) one JSON object per line,
 * {"time", "level", "node", "event", "message"} (the event is the message's
 * "word: " prefix, or "log"), and access lines with their fields instead
 * of a message. Any thread may call; each line is written with one
 * write(2) so lines from the loop and the pool threads do not interleave.
 * No caller passes a secret (the API key, a token, a database password:
 * core/dburl.h redacts URLs); tests read the logs for them.
 *
 * Process-wide on purpose: the log's settings (the level, the format
 * with the node id a JSON line carries, and the access-log switch) are
 * the pieces of the node's configuration that are not in node_t, and the
 * node's one deliberate exception to "no mutable file-scope state" (the
 * other process-wide thing, common/util.c's fake clock, is a test's:
 * docs/architecture.md, "State"). A process writes one log, to one
 * stderr, so its settings are the process's: two nodes in one test
 * process share them, as they share stderr (their JSON lines carry the
 * node id set last). Handing a logger to every module would buy nothing
 * for that.
 */
#ifndef CONVERGER_CORE_LOG_H
#define CONVERGER_CORE_LOG_H

#include <stddef.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level_t;
typedef enum { LOG_TEXT = 0, LOG_JSON } log_format_t;

/* Lines below `level` are dropped. Default LOG_INFO; call before threads
 * start. */
void log_set_level(log_level_t level);

/* Text (default) or JSON lines, and the node id JSON lines carry (copied,
 * at most 127 bytes; NULL or "" none). Call before threads start. */
void log_set_format(log_format_t format, const char *node_id);

/* Access lines on (1) or off (0, the default): CONVERGER_ACCESS_LOG. Call
 * before threads start. */
void log_set_access(int on);
int log_access_enabled(void);

/* One access line, at level info, when access lines are on: a REST
 * request's or an upgrade's method, path (without the query string: it
 * may carry a token), status, duration from the request's first byte (ms)
 * and body bytes sent. Loop thread (any thread is safe). */
void log_access(const char *method, const char *path, int status, double duration_ms, size_t bytes);

void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

#endif
