/*
 * log: one line per event on stderr, "2026-11-29T21:40:00.123Z level message".
 * Any thread may call; each line is written with one write(2) so lines from
 * the loop and the pool threads do not interleave.
 *
 * Process-wide on purpose: the level (log_set_level) is the one piece of
 * the node's configuration that is not in node_t, and the node's one
 * deliberate exception to "no mutable file-scope state" (the other
 * process-wide thing, common/util.c's fake clock, is a test's:
 * docs/architecture.md, "State"). A process writes one log, to one
 * stderr, so its level is the process's: two nodes in one test process
 * share it, as they share stderr. Handing a logger to every module would
 * buy nothing for that.
 */
#ifndef CONVERGER_CORE_LOG_H
#define CONVERGER_CORE_LOG_H

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level_t;

/* Lines below `level` are dropped. Default LOG_INFO; call before threads
 * start. */
void log_set_level(log_level_t level);

void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

#endif
