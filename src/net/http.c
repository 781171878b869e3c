/*
 * http.c: llhttp glue for one connection.
 *
 * States: idle (between requests), parsing (a request has begun), busy (a
 * complete request was handed to rest_handle and is not answered yet).
 * The parser pauses in on_message_complete; http_feed then dispatches the
 * request outside llhttp's callbacks, and either continues with the next
 * pipelined request (answered synchronously) or keeps the rest of the input
 * in `pending` and stops reading until the answer is written.
 */
#include "net/http.h"

#include <llhttp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/metrics.h"
#include "core/log.h"
#include "common/util.h"
#include "net/ws.h"

typedef struct {
  char *p;
  size_t len;
} str_t;

struct http_s {
  llhttp_t parser;
  conn_t *conn;
  http_request_t req;
  str_t url, field, value, body;
  int value_open;      /* a header value is being collected */
  unsigned seen;       /* single-valued headers of this request seen so far (bit per row) */
  size_t header_bytes; /* request line + header block so far */
  int fail_status;     /* set by a callback that returned an error */
  const char *fail_code;
  const char *fail_message;
  int busy;        /* request dispatched, not answered */
  int in_dispatch; /* inside rest_handle, called from http_feed */
  char *pending;   /* input received while busy */
  size_t pending_len;
};

static int str_append(str_t *s, const char *at, size_t len) {
  char *p = realloc(s->p, s->len + len + 1);
  if (!p) return -1;
  memcpy(p + s->len, at, len);
  s->len += len;
  p[s->len] = '\0';
  s->p = p;
  return 0;
}

static void str_reset(str_t *s) {
  free(s->p);
  s->p = NULL;
  s->len = 0;
}

static void req_reset(http_request_t *r) {
  free(r->path);
  free(r->query);
  free(r->authorization);
  free(r->upgrade);
  free(r->connection);
  free(r->ws_key);
  free(r->ws_version);
  free(r->ws_protocol);
  free(r->idempotency_key);
  free(r->last_event_id);
  free(r->forwarded_proto);
  free(r->expect);
  free(r->body);
  memset(r, 0, sizeof *r);
}

static http_t *from_parser(llhttp_t *p) { return container_of(p, http_t, parser); }

static int fail(http_t *h, int status, const char *code, const char *message) {
  h->fail_status = status;
  h->fail_code = code;
  h->fail_message = message;
  return -1;
}

static int count_header(http_t *h, size_t len) {
  h->header_bytes += len;
  if (h->header_bytes > HTTP_MAX_HEADER_BYTES)
    return fail(h, 431, "header_too_large", "request header block is larger than 16 KiB");
  return 0;
}

static int on_message_begin(llhttp_t *p) {
  http_t *h = from_parser(p);
  req_reset(&h->req);
  h->req.started_ns = uv_hrtime();
  str_reset(&h->url);
  str_reset(&h->body);
  h->header_bytes = 0;
  h->seen = 0;
  conn_set_reclaimable(h->conn, 0); /* a request is owed an answer */
  if (h->conn->deadline_ms == 0)
    h->conn->deadline_ms = util_mono_ms() + (uint64_t)h->conn->net->cfg->header_timeout_ms;
  return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len) {
  http_t *h = from_parser(p);
  if (count_header(h, len) != 0) return -1;
  return str_append(&h->url, at, len);
}

/* RFC 9110 section 5.6.2: a field name is a token. llhttp's non-strict
 * build lets spaces into it ("Host : x" gives the name "Host "), which RFC
 * 9112 section 5.1 says a server must answer with 400. */
static int is_token(const char *s, size_t len) {
  static const char extra[] = "!#$%&'*+-.^_`|~";
  if (len == 0) return 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
          (ch && strchr(extra, ch))))
      return 0;
  }
  return 1;
}

/* Keep the headers the node reads. A header marked single may appear once:
 * two Authorization or Host lines, or two handshake nonces, make the request
 * ambiguous (RFC 9110 section 5.3; RFC 9112 section 3.2; RFC 6455 section
 * 11.3.1), so the request is refused rather than one of them picked. */
static int keep_header(http_t *h) {
  http_request_t *r = &h->req;
  static const struct {
    const char *name;
    size_t offset; /* of the char * in http_request_t; SIZE_MAX: not kept */
    int single;
    const char *duplicate;
  } wanted[] = {
      {"authorization", offsetof(http_request_t, authorization), 1,
       "duplicate Authorization header"},
      {"host", SIZE_MAX, 1, "duplicate Host header"},
      {"upgrade", offsetof(http_request_t, upgrade), 0, NULL},
      {"connection", offsetof(http_request_t, connection), 0, NULL},
      {"sec-websocket-key", offsetof(http_request_t, ws_key), 1,
       "duplicate Sec-WebSocket-Key header"},
      {"sec-websocket-version", offsetof(http_request_t, ws_version), 1,
       "duplicate Sec-WebSocket-Version header"},
      {"sec-websocket-protocol", offsetof(http_request_t, ws_protocol), 0, NULL},
      {"idempotency-key", offsetof(http_request_t, idempotency_key), 1,
       "duplicate Idempotency-Key header"},
      {"expect", offsetof(http_request_t, expect), 0, NULL},
      {"last-event-id", offsetof(http_request_t, last_event_id), 1,
       "duplicate Last-Event-ID header"},
      {"x-forwarded-proto", offsetof(http_request_t, forwarded_proto), 0, NULL},
  };
  for (size_t i = 0; i < CV_ARRAY_SIZE(wanted); i++) {
    if (!h->field.p || strcasecmp(h->field.p, wanted[i].name) != 0) continue;
    if (wanted[i].single) {
      if (h->seen & (1u << i)) return fail(h, 400, "bad_request", wanted[i].duplicate);
      h->seen |= 1u << i;
    }
    if (wanted[i].offset == SIZE_MAX) return 0;
    char **slot = (char **)((char *)r + wanted[i].offset);
    const char *v = h->value.p ? h->value.p : "";
    if (*slot && slot == &r->ws_protocol) {
      /* repeated Sec-WebSocket-Protocol headers form one list */
      size_t n = strlen(*slot) + strlen(v) + 3;
      char *joined = malloc(n);
      if (joined) {
        snprintf(joined, n, "%s, %s", *slot, v);
        free(*slot);
        *slot = joined;
      }
    } else {
      free(*slot);
      *slot = strdup(v);
    }
    return 0;
  }
  return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len) {
  http_t *h = from_parser(p);
  if (count_header(h, len) != 0) return -1;
  return str_append(&h->field, at, len);
}

static int on_header_field_complete(llhttp_t *p) {
  http_t *h = from_parser(p);
  if (!is_token(h->field.p, h->field.len))
    return fail(h, 400, "bad_request",
                "invalid header field name (RFC 9112 section 5.1: no whitespace before the colon)");
  return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len) {
  http_t *h = from_parser(p);
  if (count_header(h, len) != 0) return -1;
  h->value_open = 1;
  return str_append(&h->value, at, len);
}

static int on_header_value_complete(llhttp_t *p) {
  http_t *h = from_parser(p);
  int r = keep_header(h);
  str_reset(&h->field);
  str_reset(&h->value);
  h->value_open = 0;
  return r;
}

static int on_headers_complete(llhttp_t *p) {
  http_t *h = from_parser(p);
  /* The body gets its own deadline, so a stalled upload is cut off too. */
  h->conn->deadline_ms =
      util_mono_ms() + HTTP_BODY_TIMEOUT_FACTOR * (uint64_t)h->conn->net->cfg->header_timeout_ms;
  if (p->content_length > HTTP_MAX_BODY_BYTES && !(p->flags & F_CHUNKED))
    return fail(h, 413, "too_large", "request body is larger than 1 MiB");
  if (h->req.expect) {
    /* RFC 9110 section 10.1.1: 100-continue is the only expectation; an
     * HTTP/1.0 client gets no interim answer. */
    if (strcasecmp(h->req.expect, "100-continue") != 0)
      return fail(h, 417, "bad_request", "unsupported Expect header (only 100-continue)");
    if (p->http_major == 1 && p->http_minor >= 1 &&
        (p->content_length > 0 || (p->flags & F_CHUNKED)))
      conn_write(h->conn, "HTTP/1.1 100 Continue\r\n\r\n", 25);
  }
  return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len) {
  http_t *h = from_parser(p);
  if (h->body.len + len > HTTP_MAX_BODY_BYTES)
    return fail(h, 413, "too_large", "request body is larger than 1 MiB");
  return str_append(&h->body, at, len);
}

static int on_message_complete(llhttp_t *p) {
  http_t *h = from_parser(p);
  http_request_t *r = &h->req;
  h->conn->deadline_ms = 0;
  r->method = p->method;
  r->method_name = llhttp_method_name((llhttp_method_t)p->method);
  r->http_major = p->http_major;
  r->http_minor = p->http_minor;
  r->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
  const char *url = h->url.p ? h->url.p : "/";
  const char *q = strchr(url, '?');
  r->path = q ? strndup(url, (size_t)(q - url)) : strdup(url);
  r->query = q ? strdup(q + 1) : NULL;
  r->body = h->body.p ? h->body.p : strdup("");
  r->body_len = h->body.len;
  h->body.p = NULL;
  if (!r->path || !r->body || (q && !r->query)) return fail(h, 503, "unavailable", "out of memory");
  h->body.len = 0;
  return HPE_PAUSED;
}

/* Every parser's callbacks; the rest are NULL, as llhttp_settings_init
 * leaves them. Constant: no parser writes to its settings. */
static const llhttp_settings_t settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

http_t *http_new(conn_t *c) {
  http_t *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  llhttp_init(&h->parser, HTTP_REQUEST, &settings);
  h->conn = c;
  return h;
}

void http_free(http_t *h) {
  if (!h) return;
  req_reset(&h->req);
  str_reset(&h->url);
  str_reset(&h->field);
  str_reset(&h->value);
  str_reset(&h->body);
  free(h->pending);
  free(h);
}

http_request_t *http_current(conn_t *c) { return c->http && c->http->busy ? &c->http->req : NULL; }

static void process(conn_t *c, const char *data, size_t len);

/* Hand the complete request to the router, outside llhttp's callbacks. */
static void dispatch(conn_t *c) {
  http_t *h = c->http;
  h->busy = 1;
  h->in_dispatch = 1;
  h->req.route = "unmatched";
  c->net->handler.on_request(c->net->handler.ud, c, &h->req);
  if (c->http == h) h->in_dispatch = 0;
}

static void process(conn_t *c, const char *data, size_t len) {
  http_t *h = c->http;
  while (len > 0) {
    llhttp_errno_t err = llhttp_execute(&h->parser, data, len);
    if (err == HPE_OK) return;
    if (err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE) {
      const char *pos = llhttp_get_error_pos(&h->parser);
      size_t used = pos ? (size_t)(pos - data) : len;
      if (used > len) used = len;
      data += used;
      len -= used;
      llhttp_resume(&h->parser);
      int upgrade = h->parser.upgrade;
      dispatch(c);
      if (c->closing) return;
      if (c->mode == CONN_WS) {
        if (len) ws_feed(c, data, len);
        return;
      }
      if (upgrade && !h->busy) return; /* answered, closing after the write */
      if (h->busy) {
        char *p = malloc(len ? len : 1);
        if (!p) {
          conn_close(c);
          return;
        }
        memcpy(p, data, len);
        free(h->pending);
        h->pending = p;
        h->pending_len = len;
        conn_pause_reading(c);
        return;
      }
      continue;
    }
    if (h->fail_status) {
      http_fail(c, h->fail_status, h->fail_code, h->fail_message);
    } else {
      char msg[160];
      snprintf(msg, sizeof msg, "malformed HTTP request: %s", llhttp_get_error_reason(&h->parser));
      http_fail(c, 400, "bad_request", msg);
    }
    return;
  }
}

void http_feed(conn_t *c, const char *data, size_t len) {
  http_t *h = c->http;
  if (h->busy) { /* reading is paused; keep what arrived anyway */
    char *p = realloc(h->pending, h->pending_len + len);
    if (!p) {
      conn_close(c);
      return;
    }
    memcpy(p + h->pending_len, data, len);
    h->pending = p;
    h->pending_len += len;
    return;
  }
  process(c, data, len);
}

const char *http_reason(int status) {
  switch (status) {
  case 101:
    return "Switching Protocols";
  case 200:
    return "OK";
  case 201:
    return "Created";
  case 202:
    return "Accepted";
  case 204:
    return "No Content";
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 403:
    return "Forbidden";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 408:
    return "Request Timeout";
  case 409:
    return "Conflict";
  case 413:
    return "Content Too Large";
  case 426:
    return "Upgrade Required";
  case 429:
    return "Too Many Requests";
  case 417:
    return "Expectation Failed";
  case 431:
    return "Request Header Fields Too Large";
  case 500:
    return "Internal Server Error";
  case 503:
    return "Service Unavailable";
  default:
    return "Unknown";
  }
}

void http_access(conn_t *c, int status, size_t bytes) {
  if (!log_access_enabled() || !c->http) return;
  const http_request_t *r = &c->http->req;
  double ms = r->started_ns ? (double)(uv_hrtime() - r->started_ns) / 1e6 : 0;
  log_access(r->method_name, r->path, status, ms, bytes);
}

static void count_request(conn_t *c, const char *route, int status, size_t bytes) {
  char labels[160];
  snprintf(labels, sizeof labels, "route=\"%s\",code=\"%d\"", route ? route : "unmatched", status);
  metrics_add(c->net->metrics, "converger_http_requests_total", labels, 1);
  http_access(c, status, bytes);
}

static void write_response(conn_t *c, int status, const char *content_type, const char *body,
                           size_t len, const char *extra_headers, int keep_alive) {
  char head[1024];
  int n;
  if (status == 204)
    n = snprintf(head, sizeof head, "HTTP/1.1 204 No Content\r\n%sConnection: %s\r\n\r\n",
                 extra_headers ? extra_headers : "", keep_alive ? "keep-alive" : "close");
  else
    n = snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                 "Cache-Control: no-store\r\n%sConnection: %s\r\n\r\n",
                 status, http_reason(status), content_type, len, extra_headers ? extra_headers : "",
                 keep_alive ? "keep-alive" : "close");
  if (n < 0 || (size_t)n >= sizeof head) {
    conn_close(c);
    return;
  }
  if (conn_write(c, head, (size_t)n) != 0) return;
  if (status != 204 && len) conn_write(c, body, len);
}

void http_respond(conn_t *c, int status, const char *content_type, const char *body, size_t len,
                  const char *extra_headers) {
  http_t *h = c->http;
  if (!h || !h->busy || c->closing) return;
  int keep_alive = h->req.keep_alive && !c->net->stopping;
  count_request(c, h->req.route, status, status == 204 ? 0 : len);
  write_response(c, status, content_type, body, len, extra_headers, keep_alive);
  h->busy = 0;
  req_reset(&h->req);
  if (c->closing) return;
  if (!keep_alive) {
    conn_shutdown(c);
    return;
  }
  c->deadline_ms = util_mono_ms() + (uint64_t)c->net->cfg->header_timeout_ms;
  conn_set_reclaimable(c, 1); /* idle until the next request begins */
  if (h->in_dispatch) return; /* process() continues with the next request */
  char *pending = h->pending;
  size_t pending_len = h->pending_len;
  h->pending = NULL;
  h->pending_len = 0;
  if (pending) process(c, pending, pending_len);
  free(pending);
  /* Read again unless the next request is being answered; a pipelined
   * upgrade has just made this a WebSocket, which reads too. */
  if (!c->closing && (c->mode == CONN_WS || (c->http && !c->http->busy))) conn_resume_reading(c);
}

void http_respond_json(conn_t *c, int status, json_t *body, const char *extra_headers) {
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (!text) {
    http_respond(c, 500, "application/json",
                 "{\"error\":{\"code\":\"internal\",\"message\":\"encoding failed\"}}", 57, NULL);
    return;
  }
  http_respond(c, status, "application/json", text, strlen(text), extra_headers);
  free(text);
}

static json_t *error_body(const char *code, const char *message, long retry_after_ms) {
  json_t *err = json_pack("{s:s, s:s}", "code", code, "message", message);
  if (retry_after_ms > 0) json_object_set_new(err, "retryAfterMs", json_integer(retry_after_ms));
  return json_pack("{s:o}", "error", err);
}

void http_respond_error(conn_t *c, int status, const char *code, const char *message,
                        long retry_after_ms) {
  char extra[64] = "";
  if (retry_after_ms > 0)
    snprintf(extra, sizeof extra, "Retry-After: %ld\r\n", (retry_after_ms + 999) / 1000);
  http_respond_json(c, status, error_body(code, message, retry_after_ms), extra);
}

void http_fail(conn_t *c, int status, const char *code, const char *message) {
  if (c->closing) return;
  json_t *body = error_body(code, message, 0);
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  count_request(c, c->http && c->http->req.route ? c->http->req.route : "unmatched", status,
                text ? strlen(text) : 0);
  if (text) write_response(c, status, "application/json", text, strlen(text), NULL, 0);
  free(text);
  if (c->http) c->http->busy = 0;
  conn_shutdown(c);
}

void http_check_deadline(conn_t *c, uint64_t now) {
  if (!c->deadline_ms || now < c->deadline_ms || !c->http || c->http->busy) return;
  if (conn_pending_bytes(c) > 0) { /* still writing an answer: idle time starts after */
    c->deadline_ms = now + (uint64_t)c->net->cfg->header_timeout_ms;
    return;
  }
  log_debug("http: closing connection: request not complete in time");
  c->deadline_ms = 0;
  conn_close(c);
}
