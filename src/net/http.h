/*
 * http: HTTP/1.1 server side of a connection, on llhttp.
 *
 * Keep-alive and pipelining: requests are handled one at a time; the parser
 * pauses after each complete request and the rest of the input waits until
 * that request has been answered, so answers go out in request order.
 * Limits: header block (request line + headers) <= HTTP_MAX_HEADER_BYTES
 * (else 431), body <= HTTP_MAX_BODY_BYTES (else 413), headers complete
 * within cfg->header_timeout_ms and the body within HTTP_BODY_TIMEOUT_FACTOR
 * times that (else the connection is closed); an idle keep-alive connection
 * is closed after cfg->header_timeout_ms.
 * Loop thread only.
 */
#ifndef CONVERGER_NET_HTTP_H
#define CONVERGER_NET_HTTP_H

#include <jansson.h>
#include <stddef.h>

#include "net/conn.h"

#define HTTP_MAX_HEADER_BYTES    (16 * 1024)
#define HTTP_MAX_BODY_BYTES      (1024 * 1024)
#define HTTP_BODY_TIMEOUT_FACTOR 3 /* a body must arrive within 3 x the header timeout */

typedef struct http_request_s {
  int method; /* llhttp_method_t */
  const char *method_name;
  char *path;        /* the raw path, without the query string */
  char *query;       /* raw query string without '?', or NULL */
  const char *route; /* route label for metrics, set by the router */
  char *authorization, *upgrade, *connection, *ws_key, *ws_version, *ws_protocol, *idempotency_key,
      *expect, *last_event_id; /* last_event_id: Server-Sent Events (docs/protocol.md 12) */
  char *forwarded_proto;       /* X-Forwarded-Proto: the client's scheme, as a proxy says */
  char *body;                  /* NUL-terminated */
  size_t body_len;
  int keep_alive;
  int http_major, http_minor; /* the request line's HTTP version */
  uint64_t started_ns;        /* uv_hrtime() at the request's first byte (the access log) */
} http_request_t;

/* Allocate the HTTP state of a new connection. NULL on OOM. */
http_t *http_new(conn_t *c);
void http_free(http_t *h);

/* Parse `len` bytes read from the socket. Complete requests are passed to
 * rest_handle(); bytes after an upgrade go to ws_feed(). */
void http_feed(conn_t *c, const char *data, size_t len);

/* The access log's line for the current request of `c` (core/log.h,
 * CONVERGER_ACCESS_LOG): `status` and `bytes` of body sent. Nothing when
 * access lines are off or `c` has no request. Loop thread. */
void http_access(conn_t *c, int status, size_t bytes);

/* The request being answered, or NULL. */
http_request_t *http_current(conn_t *c);

/* Answer the current request: status line, Content-Type and
 * Content-Length, `extra_headers` (each line ending in "\r\n", may be
 * NULL), then the body. Counts converger_http_requests_total. Then parsing
 * of pipelined input resumes (or the connection closes when keep-alive is
 * off). */
void http_respond(conn_t *c, int status, const char *content_type, const char *body, size_t len,
                  const char *extra_headers);

/* http_respond with a JSON body; takes the reference to `body`. */
void http_respond_json(conn_t *c, int status, json_t *body, const char *extra_headers);

/* {"error":{"code","message"}} with `status`. retry_after_ms > 0 adds
 * Retry-After (seconds, rounded up) and "retryAfterMs" to the body. */
void http_respond_error(conn_t *c, int status, const char *code, const char *message,
                        long retry_after_ms);

/* Answer an error and close the connection (malformed input). Can be used
 * when no request is current. */
void http_fail(conn_t *c, int status, const char *code, const char *message);

/* Called by the tick: closes the connection when headers are overdue. */
void http_check_deadline(conn_t *c, uint64_t now);

/* Reason phrase of a status code. */
const char *http_reason(int status);

#endif
