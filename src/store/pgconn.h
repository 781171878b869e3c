/*
 * pgconn: how converger opens a libpq connection, shared by the store's
 * workers (postgres.c, blocking) and the bus's LISTEN connection
 * (bus/pgnotify.c, whose loop connects through libuv's thread pool).
 *
 * Thread: any; nothing here keeps state.
 */
#ifndef CONVERGER_STORE_PGCONN_H
#define CONVERGER_STORE_PGCONN_H

#include <libpq-fe.h>
#include <stddef.h>

#define PGCONN_CONNECT_TIMEOUT_MS 1000 /* unless the URL sets connect_timeout */

/* Connect to `url` (a postgres:// URL or a libpq keyword string),
 * blocking for at most `timeout_ms` once addresses are known (libpq
 * resolves host names first, which no deadline bounds: call this off the
 * loop). converger's defaults go before the URL's own keywords, so it may
 * override them: TCP keepalives (idle 10 s, interval 5 s, count 3),
 * tcp_user_timeout 10 s, the application name `app` (shown in
 * pg_stat_activity); after them client_encoding UTF8 (the store speaks
 * UTF-8 whatever the URL says). Returns the connection (the caller
 * PQfinishes it), or NULL with the reason in `why` (`cap` bytes, one
 * line). Any thread. */
PGconn *pgconn_connect(const char *url, const char *app, int timeout_ms, char *why, size_t cap);

/* The URL's connect_timeout in ms (1..3600 s), or PGCONN_CONNECT_TIMEOUT_MS
 * when it has none or a value libpq would read as "wait for ever" (0 or
 * less). Returns 0, -CV_EINVAL when libpq cannot parse `url` or its port
 * or sslmode is not one libpq takes (libpq itself says so only when it
 * connects, like an outage; logged, with the password redacted: a
 * configuration error, lifecycle.h), or -CV_ENOMEM. */
int pgconn_timeout_ms(const char *url, int *timeout_ms);

/* libpq's multi-line message `msg` (NULL allowed) as one line in `buf`
 * (`cap` bytes, always terminated): newlines and tabs become single
 * spaces. Returns `buf`. */
const char *pgconn_one_line(const char *msg, char *buf, size_t cap);

/* A libpq notice processor (PQsetNoticeProcessor) that logs the server's
 * notices and warnings (a FATAL goodbye on an idle connection among them)
 * at debug level, on one line, instead of libpq's default of stderr. */
void pgconn_notice(void *arg, const char *msg);

#endif
