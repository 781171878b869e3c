/*
 * pgconn.c: connection defaults shared by postgres.c and bus/pgnotify.c.
 * See pgconn.h.
 */
#include "store/pgconn.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dburl.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"
#include "store/store.h"

static PGconn *start(const char *url, const char *app) {
  /* Before dbname: defaults the URL may override. After it: ours. */
  static const char *const kw[] = {
      "fallback_application_name",
      "keepalives",
      "keepalives_idle",
      "keepalives_interval",
      "keepalives_count",
      "tcp_user_timeout",
      "dbname",
      "client_encoding",
      NULL,
  };
  const char *val[] = {app, "1", "10", "5", "3", "10000", url, "UTF8", NULL};
  return PQconnectStartParams(kw, val, 1);
}

PGconn *pgconn_connect(const char *url, const char *app, int timeout_ms, char *why, size_t cap) {
  PGconn *c = start(url, app);
  if (c == NULL) {
    snprintf(why, cap, "out of memory");
    return NULL;
  }
  /* Not called PQconnectPoll yet: as if it had said "writing". (libpq's
   * blocking connect has a 2 s floor and counts it per address: a server
   * that accepts TCP but never answers would hold the caller far longer.) */
  PostgresPollingStatusType st = PGRES_POLLING_WRITING;
  uint64_t deadline = util_mono_ms() + (uint64_t)timeout_ms;
  int timed_out = 0;
  while (PQstatus(c) != CONNECTION_BAD && st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
    uint64_t now = util_mono_ms();
    if (now >= deadline) {
      timed_out = 1;
      break;
    }
    /* PQsocket may change between calls (one address after another). */
    struct pollfd p = {.fd = PQsocket(c), .events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT};
    int r = poll(&p, 1, (int)(deadline - now));
    if (r < 0 && errno != EINTR) break;
    if (r > 0) st = PQconnectPoll(c);
  }
  if (st == PGRES_POLLING_OK && PQstatus(c) == CONNECTION_OK) return c;
  if (timed_out)
    snprintf(why, cap, "no answer within %d ms", timeout_ms);
  else
    pgconn_one_line(PQerrorMessage(c), why, cap);
  PQfinish(c);
  return NULL;
}

/* libpq checks these only when it connects, where a mistake looks like an
 * outage: "5432", "5432,5433", "" (the default). */
static int ports_ok(const char *v) {
  for (const char *p = v;;) {
    char *end;
    long n = *p == ',' || *p == '\0' ? 5432 : strtol(p, &end, 10);
    if (*p != ',' && *p != '\0') {
      if (end == p || (*end != ',' && *end != '\0')) return 0;
      p = end;
    }
    if (n < 1 || n > 65535) return 0;
    if (*p == '\0') return 1;
    p++; /* the comma */
  }
}

static int sslmode_ok(const char *v) {
  static const char *const modes[] = {"disable", "allow",     "prefer",
                                      "require", "verify-ca", "verify-full"};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    if (strcmp(v, modes[i]) == 0) return 1;
  return 0;
}

int pgconn_timeout_ms(const char *url, int *timeout_ms) {
  char *msg = NULL, line[512], red[512];
  PQconninfoOption *info = PQconninfoParse(url, &msg);
  if (info == NULL) {
    dburl_redact(url, red, sizeof red);
    if (msg == NULL) return -CV_ENOMEM;
    log_error("store: %s: %s", red, pgconn_one_line(msg, line, sizeof line));
    PQfreemem(msg);
    return -CV_EINVAL;
  }
  *timeout_ms = PGCONN_CONNECT_TIMEOUT_MS;
  const char *bad = NULL;
  for (const PQconninfoOption *o = info; o->keyword != NULL; o++)
    if (o->val != NULL && strcmp(o->keyword, "port") == 0 && !ports_ok(o->val))
      bad = "port: want a number from 1 to 65535 (a list for a list of hosts)";
    else if (o->val != NULL && strcmp(o->keyword, "sslmode") == 0 && !sslmode_ok(o->val))
      bad = "sslmode: want disable, allow, prefer, require, verify-ca or verify-full";
  if (bad) {
    dburl_redact(url, red, sizeof red);
    log_error("store: %s: %s", red, bad);
    PQconninfoFree(info);
    return -CV_EINVAL;
  }
  for (const PQconninfoOption *o = info; o->keyword != NULL; o++) {
    if (strcmp(o->keyword, "connect_timeout") != 0 || o->val == NULL) continue;
    char *end = NULL;
    long v = strtol(o->val, &end, 10);
    /* libpq reads 0 or less as "wait forever": that is what we avoid. */
    if (end != o->val && *end == '\0' && v > 0 && v <= 3600) *timeout_ms = (int)v * 1000;
  }
  PQconninfoFree(info);
  return 0;
}

const char *pgconn_one_line(const char *msg, char *buf, size_t cap) {
  size_t n = 0;
  for (const char *p = msg != NULL ? msg : ""; *p != '\0' && n + 1 < cap; p++) {
    char c = (*p == '\n' || *p == '\t' || *p == '\r') ? ' ' : *p;
    if (c == ' ' && (n == 0 || buf[n - 1] == ' ')) continue;
    buf[n++] = c;
  }
  while (n > 0 && buf[n - 1] == ' ') n--;
  buf[n] = '\0';
  return buf;
}

void pgconn_notice(void *arg, const char *msg) {
  char line[512];
  (void)arg;
  log_debug("store: postgres: %s", pgconn_one_line(msg, line, sizeof line));
}
