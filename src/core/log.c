#include "core/log.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The process's settings: process-wide on purpose (log.h). */
static log_level_t min_level = LOG_INFO;
static log_format_t format = LOG_TEXT;
static char node[128];
static int access_on;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(log_level_t level) { min_level = level; }

void log_set_format(log_format_t f, const char *node_id) {
  format = f;
  snprintf(node, sizeof node, "%s", node_id ? node_id : "");
}

void log_set_access(int on) { access_on = on; }

int log_access_enabled(void) { return access_on; }

/* "2026-11-29T21:40:00.123Z" into out (at least 25 bytes). */
static void now_iso(char *out, size_t len) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(out, len, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, len - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
}

static void emit(const char *line, size_t len) {
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}

/* `in` with every byte that is not part of valid UTF-8 replaced by '?',
 * into out[len] (cut at a character's end): JSON strings must be UTF-8,
 * and a request line may hold anything. */
static const char *utf8_clean(const char *in, char *out, size_t len) {
  size_t o = 0;
  const unsigned char *p = (const unsigned char *)in;
  while (*p && o + 5 < len) {
    int n = *p < 0x80                           ? 1
            : (*p & 0xE0) == 0xC0 && *p >= 0xC2 ? 2
            : (*p & 0xF0) == 0xE0               ? 3
            : (*p & 0xF8) == 0xF0 && *p <= 0xF4 ? 4
                                                : 0;
    for (int i = 1; i < n; i++)
      if ((p[i] & 0xC0) != 0x80) n = 0;
    if (n == 0) {
      out[o++] = '?';
      p++;
      continue;
    }
    memcpy(out + o, p, (size_t)n);
    o += (size_t)n;
    p += n;
  }
  out[o] = '\0';
  return out;
}

/* The JSON line of `obj` (stolen), with time, level and node added. */
static void emit_json(log_level_t level, json_t *obj) {
  char t[32];
  now_iso(t, sizeof t);
  if (!obj) return;
  json_object_set_new(obj, "time", json_string(t));
  json_object_set_new(obj, "level", json_string(level_names[level]));
  if (node[0]) json_object_set_new(obj, "node", json_string(node));
  char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII |
                                   JSON_REAL_PRECISION(6));
  json_decref(obj);
  if (!text) return;
  size_t n = strlen(text);
  text[n] = '\n'; /* over the NUL: written by length */
  emit(text, n + 1);
  free(text);
}

/* A message's event: its "word: " prefix (lower-case letters, digits,
 * ' ', '_', '-', '.', at most 32), else "log". */
static void event_of(const char *msg, char *out, size_t len) {
  const char *colon = strstr(msg, ": ");
  size_t n = colon ? (size_t)(colon - msg) : 0;
  int ok = n > 0 && n <= 32 && n < len;
  for (size_t i = 0; ok && i < n; i++)
    ok = (msg[i] >= 'a' && msg[i] <= 'z') || (msg[i] >= '0' && msg[i] <= '9') ||
         strchr(" _-.", msg[i]) != NULL;
  if (!ok) {
    snprintf(out, len, "log");
    return;
  }
  memcpy(out, msg, n);
  out[n] = '\0';
}

void log_write(log_level_t level, const char *fmt, ...) {
  char line[2048];
  if (level < min_level) return;
  va_list ap;
  if (format == LOG_JSON) {
    va_start(ap, fmt);
    int m = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    char event[40], clean[sizeof line + 8];
    event_of(line, event, sizeof event);
    emit_json(level, json_pack("{s:s, s:s}", "event", event, "message",
                               utf8_clean(line, clean, sizeof clean)));
    return;
  }
  char t[32];
  now_iso(t, sizeof t);
  int n = snprintf(line, sizeof line, "%s %-5s ", t, level_names[level]);
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  emit(line, len);
}

void log_access(const char *method, const char *path, int status, double duration_ms,
                size_t bytes) {
  if (!access_on || LOG_INFO < min_level) return;
  if (format == LOG_JSON) {
    char m[32], pth[1024];
    emit_json(LOG_INFO, json_pack("{s:s, s:s, s:s, s:i, s:f, s:I}", "event", "access", "method",
                                  utf8_clean(method ? method : "-", m, sizeof m), "path",
                                  utf8_clean(path ? path : "-", pth, sizeof pth), "status", status,
                                  "durationMs", duration_ms, "bytes", (json_int_t)bytes));
    return;
  }
  log_write(LOG_INFO, "access: %s %s %d %.3fms %zuB", method ? method : "-", path ? path : "-",
            status, duration_ms, bytes);
}
