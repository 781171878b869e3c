/*
 * ws.c: wslay glue in the manner of h2o's lib/websocket.c: wslay callbacks
 * only move bytes between wslay and the connection's buffers and say
 * WOULDBLOCK when the input is used up; the connection decides when to read
 * and write.
 *
 * Memory: a wslay event context costs about 8.8 KB (its frame input buffer
 * and state), more than everything else an idle connection holds. So the
 * context exists only while it has work: it is created when bytes arrive or
 * a control frame must go out, and released again when it is idle, which we
 * know by accounting: every byte fed to it belongs to a completed frame
 * (frame start/end callbacks give each frame's size), no fragmented message
 * is open, nothing waits to be written and no close was sent or received.
 * Idle connections then hold no wslay state at all.
 */
#include "net/ws.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <wslay/wslay.h>

#include "core/metrics.h"
#include "core/log.h"
#include "common/util.h"

struct ws_s {
  wslay_event_context_ptr ctx; /* NULL while idle */
  conn_t *conn;
  const char *rbuf; /* input being fed */
  size_t rlen;
  uint64_t fed;       /* bytes handed to ctx since it was created */
  uint64_t framed;    /* bytes of the frames ctx has completed */
  uint64_t cur_frame; /* size of the frame being received */
  int frag_open;      /* a fragmented data message is incomplete */
  int close_sent;
  int close_code; /* the first close: ours (ws_close) or the peer's; 0: none yet */
  /* Server-Sent Events (ws_start_sse): the same message connection, its
   * frames written as events instead of WebSocket frames */
  int sse;
  int sse_started;         /* the 200 and its headers went out (at the welcome) */
  long sse_retry_ms;       /* the first event's retry: field */
  uint64_t sse_started_ns; /* the request's first byte, for its access line */
};

static int key_valid(const char *key) {
  unsigned char raw[32];
  size_t n = strlen(key);
  if (n != 24) return 0;
  if (EVP_DecodeBlock(raw, (const unsigned char *)key, (int)n) != 18) return 0;
  return key[22] == '=' && key[23] == '=';
}

int ws_check_upgrade(const http_request_t *req, const char **why) {
  if (req->method != 1 /* HTTP_GET */) {
    *why = "WebSocket upgrade must use GET";
    return 405;
  }
  if (req->http_major < 1 || (req->http_major == 1 && req->http_minor < 1)) {
    /* RFC 6455 section 4.1: the opening handshake is HTTP/1.1 or later. */
    *why = "WebSocket upgrade needs HTTP/1.1 or later (RFC 6455 section 4.1)";
    return 400;
  }
  if (!req->upgrade || !ws_has_token(req->upgrade, "websocket")) {
    *why = "missing Upgrade: websocket";
    return 400;
  }
  if (!req->connection || !ws_has_token(req->connection, "upgrade")) {
    *why = "missing Connection: Upgrade";
    return 400;
  }
  if (!req->ws_key || !key_valid(req->ws_key)) {
    *why = "missing or invalid Sec-WebSocket-Key";
    return 400;
  }
  if (!req->ws_version || strcmp(req->ws_version, "13") != 0) {
    *why = "unsupported Sec-WebSocket-Version (want 13)";
    return 400;
  }
  if (req->ws_protocol && !ws_has_token(req->ws_protocol, WS_SUBPROTOCOL)) {
    *why = "subprotocol converger.v1 not offered";
    return 400;
  }
  return 0;
}

/* ---- incoming: per-connection wslay event context ---------------------- */

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                       void *user) {
  ws_t *ws = user;
  if (ws->rlen == 0) {
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
  }
  size_t n = len < ws->rlen ? len : ws->rlen;
  memcpy(buf, ws->rbuf, n);
  ws->rbuf += n;
  ws->rlen -= n;
  ws->fed += n;
  return (ssize_t)n;
}

static void frame_start_cb(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_start_arg *arg, void *user) {
  ws_t *ws = user;
  uint64_t len = arg->payload_length;
  /* Client frames are masked (RFC 6455 section 5.3): 2 + extended length + 4. */
  ws->cur_frame = 2 + (len < 126 ? 0 : len < 65536 ? 2 : 8) + 4 + len;
  if (arg->opcode == WSLAY_TEXT_FRAME || arg->opcode == WSLAY_BINARY_FRAME)
    ws->frag_open = !arg->fin;
  else if (arg->opcode == WSLAY_CONTINUATION_FRAME && arg->fin)
    ws->frag_open = 0;
}

static void frame_end_cb(wslay_event_context_ptr ctx, void *user) {
  ws_t *ws = user;
  ws->framed += ws->cur_frame;
  ws->cur_frame = 0;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                       void *user) {
  ws_t *ws = user;
  if (conn_write(ws->conn, data, len) != 0) {
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  return (ssize_t)len;
}

static void on_msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                      void *user) {
  ws_t *ws = user;
  conn_t *c = ws->conn;
  if (ws->close_sent || c->closing) return;
  switch (arg->opcode) {
  case WSLAY_TEXT_FRAME:
    c->net->handler.on_text(c->net->handler.ud, c, (const char *)arg->msg, arg->msg_length);
    break;
  case WSLAY_BINARY_FRAME:
    ws_close(c, WS_CLOSE_UNSUPPORTED_DATA, "binary frames are not supported");
    break;
  default: /* ping (answered by wslay), pong, close */
    break;
  }
}

static const struct wslay_event_callbacks event_callbacks = {
    recv_cb, send_cb, NULL, frame_start_cb, NULL, frame_end_cb, on_msg_cb,
};

/* Create the wslay context on demand. 0 or -1 (connection closed). */
static int ensure_ctx(ws_t *ws) {
  if (ws->ctx) return 0;
  if (wslay_event_context_server_init(&ws->ctx, &event_callbacks, ws) != 0) {
    ws->ctx = NULL;
    conn_close(ws->conn);
    return -1;
  }
  wslay_event_config_set_max_recv_msg_length(ws->ctx,
                                             (uint64_t)ws->conn->net->cfg->max_message_bytes);
  ws->fed = ws->framed = ws->cur_frame = 0;
  ws->frag_open = 0;
  return 0;
}

/* Release the context when it holds nothing: see the design note above. */
static void maybe_release(ws_t *ws) {
  if (!ws->ctx || ws->close_sent || ws->conn->closing) return;
  if (ws->fed != ws->framed || ws->frag_open || wslay_event_want_write(ws->ctx) ||
      wslay_event_get_close_received(ws->ctx))
    return;
  wslay_event_context_free(ws->ctx);
  ws->ctx = NULL;
}

/* Whether the client of `c` spoke TLS (docs/protocol.md 5.6): the first
 * entry of the upgrade's X-Forwarded-Proto when it has one (a proxy's word
 * on the client's side of it: "https" or "wss"; anything else is
 * plaintext), else TLS on this node's own listener. A client that sets the
 * header itself only chooses the scheme of its own reconnectTo. */
static int client_tls(const conn_t *c) {
  const http_request_t *req = c->http ? http_current((conn_t *)c) : NULL;
  const char *v = req ? req->forwarded_proto : NULL;
  if (!v) return c->tls != NULL;
  v += strspn(v, " \t");
  size_t n = strcspn(v, ", \t");
  return (n == 5 && strncasecmp(v, "https", 5) == 0) || (n == 3 && strncasecmp(v, "wss", 3) == 0);
}

/* `c` leaves HTTP for good: `ws` is its message state, counted in nws,
 * given its session by the handler; a hello due within `hello_ms` (0:
 * none). 0, or -1 (closed). */
static int message_mode(conn_t *c, ws_t *ws, uint64_t hello_ms) {
  c->client_tls = client_tls(c);
  http_free(c->http);
  c->http = NULL;
  c->ws = ws;
  c->mode = CONN_WS;
  uint64_t now = util_mono_ms();
  c->deadline_ms = hello_ms ? now + hello_ms : 0;
  c->next_ping_ms = now + (uint64_t)c->net->cfg->heartbeat_ms;
  c->net->nws++;
  metrics_set(c->net->metrics, "converger_connections", NULL, c->net->nws);
  if (c->net->handler.on_upgrade(c->net->handler.ud, c) != 0) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return -1;
  }
  return 0;
}

int ws_upgrade(conn_t *c, const http_request_t *req) {
  char accept[29];
  char head[512];
  ws_accept_key(req->ws_key, accept);
  int n =
      snprintf(head, sizeof head,
               "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n%s\r\n",
               accept, req->ws_protocol ? "Sec-WebSocket-Protocol: " WS_SUBPROTOCOL "\r\n" : "");
  ws_t *ws = calloc(1, sizeof *ws);
  if (!ws) {
    conn_close(c);
    return -1;
  }
  ws->conn = c;
  metrics_add(c->net->metrics, "converger_http_requests_total", "route=\"/v1/ws\",code=\"101\"", 1);
  http_access(c, 101, 0);
  if (conn_write(c, head, (size_t)n) != 0) {
    free(ws);
    return -1;
  }
  c->ws_frames = 1;
  return message_mode(c, ws, (uint64_t)c->net->cfg->hello_timeout_ms);
}

static void after_io(conn_t *c) {
  ws_t *ws = c->ws;
  if (c->closing) return;
  if (wslay_event_want_write(ws->ctx) && wslay_event_send(ws->ctx) != 0) {
    conn_close(c);
    return;
  }
  if (!ws->close_code && wslay_event_get_close_received(ws->ctx))
    ws->close_code = wslay_event_get_status_code_received(ws->ctx);
  if (wslay_event_get_close_sent(ws->ctx)) {
    ws->close_sent = 1;
    c->ws_frames = 0;
    conn_shutdown(c);
  }
}

void ws_feed(conn_t *c, const char *data, size_t len) {
  ws_t *ws = c->ws;
  if (ws->close_sent) return; /* draining input until the peer closes */
  if (ws->sse) return;        /* a stream's client says nothing after its request */
  if (ensure_ctx(ws) != 0) return;
  ws->rbuf = data;
  ws->rlen = len;
  int r = wslay_event_recv(ws->ctx);
  ws->rbuf = NULL;
  ws->rlen = 0;
  if (c->closing) return;
  if (r == WSLAY_ERR_CALLBACK_FAILURE) {
    /* wslay's frame parser refused a frame header (RFC 6455 sections 5.2
     * and 5.5: a control frame over 125 bytes or fragmented, a 64-bit
     * length with its top bit set, a length not in its shortest form).
     * wslay_event_recv then queues a close frame without a status code and
     * reports a callback failure, though ours never fail (recv_cb only says
     * WOULDBLOCK). Drop that context, and its empty close frame, and answer
     * 1002 as wslay does for the protocol errors it finds after the header. */
    log_debug("ws: malformed frame header; closing with 1002");
    wslay_event_context_free(ws->ctx);
    ws->ctx = NULL;
    ws_close(c, WS_CLOSE_PROTOCOL_ERROR, "malformed frame header");
    return;
  }
  if (r != 0) {
    log_debug("ws: receive failed (%d); closing", r);
    conn_close(c);
    return;
  }
  after_io(c);
  maybe_release(ws);
}

/* ---- outgoing: one frame encoder per net ---------------------------------- */

/* net->encoder: every frame the node sends is encoded here, then copied
 * (conn_write, or the heap copy ws_encode_text returns), so one buffer
 * serves the whole loop. */
struct ws_encoder_s {
  wslay_frame_context_ptr frame; /* NULL until used, and after a failed encode */
  char *buf;                     /* the last frame encoded */
  size_t len, cap;
};

static ssize_t enc_send_cb(const uint8_t *data, size_t len, int flags, void *user) {
  ws_encoder_t *e = user;
  if (e->len + len > e->cap) {
    size_t cap = (e->len + len) * 2;
    char *p = realloc(e->buf, cap);
    if (!p) return WSLAY_ERR_NOMEM;
    e->buf = p;
    e->cap = cap;
  }
  memcpy(e->buf + e->len, data, len);
  e->len += len;
  return (ssize_t)len;
}

static ssize_t enc_recv_cb(uint8_t *buf, size_t len, int flags, void *user) {
  return WSLAY_ERR_WANT_READ;
}

/* Encode one text frame into net->encoder's buffer: the encoder, or NULL
 * when out of memory. */
static ws_encoder_t *encode(net_t *net, const char *text, size_t len) {
  static const struct wslay_frame_callbacks cbs = {enc_send_cb, enc_recv_cb, NULL};
  if (!net->encoder && !(net->encoder = calloc(1, sizeof *net->encoder))) return NULL;
  ws_encoder_t *e = net->encoder;
  if (!e->frame && wslay_frame_context_init(&e->frame, &cbs, e) != 0) {
    e->frame = NULL;
    return NULL;
  }
  e->len = 0;
  struct wslay_frame_iocb iocb = {.fin = 1,
                                  .opcode = WSLAY_TEXT_FRAME,
                                  .payload_length = len,
                                  .mask = 0,
                                  .data = (const uint8_t *)text,
                                  .data_length = len};
  ssize_t r = wslay_frame_send(e->frame, &iocb);
  if (r < 0 || (size_t)r != len) {
    /* The frame context is in an unknown state now; start over next time. */
    wslay_frame_context_free(e->frame);
    e->frame = NULL;
    return NULL;
  }
  return e;
}

char *ws_encode_text(net_t *net, const char *text, size_t text_len, size_t *len) {
  ws_encoder_t *e = encode(net, text, text_len);
  if (!e) return NULL;
  char *out = malloc(e->len);
  if (!out) return NULL;
  memcpy(out, e->buf, e->len);
  *len = e->len;
  return out;
}

/* ---- Server-Sent Events ---------------------------------------------------- */

int ws_start_sse(conn_t *c, long retry_ms) {
  ws_t *ws = calloc(1, sizeof *ws);
  if (!ws) {
    conn_close(c);
    return -1;
  }
  ws->conn = c;
  ws->sse = 1;
  ws->sse_retry_ms = retry_ms;
  http_request_t *req = http_current(c);
  ws->sse_started_ns = req ? req->started_ns : uv_hrtime();
  /* A stream's client sends nothing, so no heartbeat answer tells that it
   * is gone; the kernel does, once the pings it is sent go unacknowledged
   * for two heartbeats (as long as a WebSocket's heartbeat timeout). */
  uv_os_fd_t fd;
  unsigned int user_timeout = 2u * (unsigned int)c->net->cfg->heartbeat_ms;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
  return message_mode(c, ws, 0); /* the hello is the request itself */
}

int ws_is_sse(const conn_t *c) { return c->ws && c->ws->sse; }

static void sse_count(conn_t *c, int status) {
  char labels[64];
  snprintf(labels, sizeof labels, "route=\"/v1/sse\",code=\"%d\"", status);
  metrics_add(c->net->metrics, "converger_http_requests_total", labels, 1);
  /* the answer comes after the request has gone (at the welcome, or the
   * hello's refusal): the stream's own start time */
  log_access("GET", "/v1/sse", status, (double)(uv_hrtime() - c->ws->sse_started_ns) / 1e6, 0);
}

/* Nothing more goes out: the stream (or the answer) ends once flushed. */
static void sse_end(conn_t *c) {
  ws_t *ws = c->ws;
  if (ws->close_sent) return;
  ws->close_sent = 1;
  c->closed_by_us = 1;
  c->net->handler.on_close(c->net->handler.ud, c);
  conn_shutdown(c);
}

/* The HTTP status for a refusal before the stream began, by its error
 * code (docs/protocol.md 12). */
static int sse_status(const char *code) {
  static const struct {
    const char *code;
    int status;
  } map[] = {{"unauthorized", 401}, {"token_expired", 401},    {"forbidden", 403},
             {"not_found", 404},    {"channel_inactive", 409}, {"too_many_connections", 429},
             {"rate_limited", 429}, {"unavailable", 503},      {"internal_error", 500}};
  for (size_t i = 0; code && i < sizeof map / sizeof map[0]; i++)
    if (strcmp(map[i].code, code) == 0) return map[i].status;
  return 400;
}

/* Before the stream began: the refusal as an HTTP answer with a JSON body
 * ({"error": the error frame's fields}), Retry-After when it has a hint,
 * and the end. */
static void sse_refuse(conn_t *c, int status, json_t *error) {
  json_t *hint = json_object_get(error, "retryAfterMs");
  char extra[64] = "";
  if (json_is_integer(hint))
    snprintf(extra, sizeof extra, "Retry-After: %lld\r\n",
             (long long)(json_integer_value(hint) + 999) / 1000);
  json_t *body = json_pack("{s:O}", "error", error);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  char head[512];
  size_t len = text ? strlen(text) : 0;
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "Cache-Control: no-store\r\n%sConnection: close\r\n\r\n",
                   status, http_reason(status), len, extra);
  sse_count(c, status);
  if (conn_write(c, head, (size_t)n) == 0 && text) conn_write(c, text, len);
  free(text);
  sse_end(c);
}

/* `data` as data: lines (one per line of it). */
static void sse_data(conn_t *c, const char *data, size_t len) {
  while (!c->closing) {
    const char *nl = memchr(data, '\n', len);
    size_t n = nl ? (size_t)(nl - data) : len;
    conn_write(c, "data: ", 6);
    conn_write(c, data, n);
    conn_write(c, "\n", 1);
    if (!nl) break;
    data += n + 1;
    len -= n + 1;
  }
}

/* The id: line of an event: `id`, or where the stream is now (the
 * handler's sse_id) when `id` is NULL. None while the stream is nowhere
 * yet: an empty id: would make an EventSource forget the one it has. */
static void sse_id_line(conn_t *c, const char *id) {
  if (!id) id = c->net->handler.sse_id(c->net->handler.ud, c);
  if (!id || !id[0]) return;
  conn_write(c, "id: ", 4);
  conn_write(c, id, strlen(id));
  conn_write(c, "\n", 1);
}

/* One frame's JSON as an event named by its type, with `id` (NULL:
 * none). The welcome starts the stream; an error or a close before it is
 * answered as an HTTP refusal; a drain event carries its afterMs as the
 * retry: field and ends the stream, so the browser's EventSource
 * reconnects after that delay (the drain sends it at the stream's own
 * jittered moment with a short afterMs: gate/drain.h). The welcome,
 * synced and drain events carry the stream's id (sse_id_line) when given
 * none: a stream that had no msg yet is somewhere all the same, and its
 * reconnect must resume there, not at the head (docs/protocol.md 12). */
static void sse_frame(conn_t *c, const char *json, size_t len, const char *id) {
  ws_t *ws = c->ws;
  json_t *f = json_loadb(json, len, 0, NULL);
  const char *type = json_string_value(json_object_get(f, "type"));
  if (!type) {
    json_decref(f);
    return;
  }
  if (!ws->sse_started) {
    if (strcmp(type, "welcome") != 0) {
      if (strcmp(type, "error") == 0) {
        const char *code = json_string_value(json_object_get(f, "code"));
        json_object_del(f, "type");
        sse_refuse(c, sse_status(code), f);
      }
      json_decref(f);
      return;
    }
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Cache-Control: no-store\r\nX-Accel-Buffering: no\r\n"
                     "Connection: keep-alive\r\n\r\nretry: %ld\n\n",
                     ws->sse_retry_ms);
    sse_count(c, 200);
    ws->sse_started = 1;
    if (conn_write(c, head, (size_t)n) != 0) {
      json_decref(f);
      return;
    }
  }
  char line[96];
  int drain = strcmp(type, "drain") == 0;
  snprintf(line, sizeof line, "event: %.40s\n", type);
  conn_write(c, line, strlen(line));
  if (id || drain || strcmp(type, "welcome") == 0 || strcmp(type, "synced") == 0)
    sse_id_line(c, id);
  if (drain) {
    json_t *after = json_object_get(f, "afterMs");
    snprintf(line, sizeof line, "retry: %lld\n",
             json_is_integer(after) ? (long long)json_integer_value(after) : 0LL);
    conn_write(c, line, strlen(line));
  }
  sse_data(c, json, len);
  conn_write(c, "\n", 1);
  json_decref(f);
  if (drain && !c->closing) sse_end(c);
}

void ws_send_msg(conn_t *c, const char *frame, size_t frame_len, const char *json, size_t json_len,
                 const char *sse_id) {
  if (c->closing || !c->ws || c->ws->close_sent) return;
  if (c->ws->sse)
    sse_frame(c, json, json_len, sse_id);
  else if (frame)
    conn_write(c, frame, frame_len);
  else
    ws_send_text(c, json, json_len);
}

void ws_send_text(conn_t *c, const char *text, size_t len) {
  if (c->closing || !c->ws || c->ws->close_sent) return;
  if (c->ws->sse) {
    sse_frame(c, text, len, NULL);
    return;
  }
  ws_encoder_t *e = encode(c->net, text, len);
  if (!e) {
    conn_close(c);
    return;
  }
  conn_write(c, e->buf, e->len);
}

void ws_send_frame(conn_t *c, const char *frame, size_t len) {
  if (c->closing || !c->ws || c->ws->close_sent) return;
  conn_write(c, frame, len);
}

/* A close on a stream: before it began, a refusal (the codes' HTTP
 * statuses); after, a `close` event with the stream's id, the code, the
 * reason and, when the reason carries a hint, the retry: field; then the
 * end. */
static void sse_close(conn_t *c, int code, const char *reason) {
  ws_t *ws = c->ws;
  ws->close_code = code;
  json_t *hint = NULL;
  json_t *r = reason && reason[0] == '{' ? json_loads(reason, 0, NULL) : NULL;
  if (r) hint = json_object_get(r, "retryAfterMs");
  if (!ws->sse_started) {
    int status = code == WS_CLOSE_TRY_AGAIN_LATER || code == WS_CLOSE_SERVICE_RESTART ? 503
                 : code == WS_CLOSE_POLICY_VIOLATION                                  ? 401
                                                                                      : 500;
    json_t *err = json_pack("{s:s, s:s}", "code",
                            status == 503   ? "unavailable"
                            : status == 401 ? "unauthorized"
                                            : "internal_error",
                            "message", reason && !r ? reason : "the stream cannot be served");
    if (err && json_is_integer(hint)) json_object_set(err, "retryAfterMs", hint);
    if (err)
      sse_refuse(c, status, err);
    else
      sse_end(c); /* out of memory: no body, but the end all the same */
    json_decref(err);
  } else {
    char line[64];
    if (json_is_integer(hint)) {
      snprintf(line, sizeof line, "retry: %lld\n", (long long)json_integer_value(hint));
      conn_write(c, line, strlen(line));
    }
    json_t *ev =
        json_pack("{s:s, s:i, s:s}", "type", "close", "code", code, "reason", reason ? reason : "");
    char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    if (text) {
      conn_write(c, "event: close\n", 13);
      sse_id_line(c, NULL);
      sse_data(c, text, strlen(text));
      conn_write(c, "\n", 1);
    }
    free(text);
    sse_end(c);
  }
  json_decref(r);
}

void ws_close(conn_t *c, int code, const char *reason) {
  ws_t *ws = c->ws;
  if (c->closing || !ws || ws->close_sent) return;
  if (ws->sse) {
    sse_close(c, code, reason);
    return;
  }
  c->closed_by_us = 1;
  ws->close_code = code;
  c->net->handler.on_close(c->net->handler.ud, c); /* nothing more is admitted for it */
  size_t rlen = reason ? strlen(reason) : 0;
  if (rlen > 123) rlen = 123;
  if (ensure_ctx(ws) != 0) return;
  wslay_event_queue_close(ws->ctx, (uint16_t)code, (const uint8_t *)reason, rlen);
  ws->close_sent = 1;
  c->ws_frames = 0;
  if (wslay_event_send(ws->ctx) != 0 && !c->closing) {
    conn_close(c);
    return;
  }
  conn_shutdown(c);
}

int ws_close_sent(const conn_t *c) { return c->ws && c->ws->close_sent; }

int ws_is_open(const conn_t *c) { return c->mode == CONN_WS && !c->closing && !ws_close_sent(c); }

conn_t *ws_next_open(net_t *net, conn_t *c) {
  for (c = c ? c->next : net->conns; c; c = c->next)
    if (ws_is_open(c)) return c;
  return NULL;
}

void ws_ping(conn_t *c) {
  ws_t *ws = c->ws;
  if (c->closing || !ws || ws->close_sent) return;
  if (ws->sse) { /* a comment line: keeps proxies from closing an idle stream */
    if (ws->sse_started) conn_write(c, ": ping\n\n", 8);
    return;
  }
  struct wslay_event_msg msg = {WSLAY_PING, NULL, 0};
  if (ensure_ctx(ws) != 0) return;
  if (wslay_event_queue_msg(ws->ctx, &msg) == 0) after_io(c);
  maybe_release(ws);
}

void ws_free(ws_t *ws) {
  if (!ws) return;
  /* The connection's end, by its first close code: 1006 (abnormal
   * closure, RFC 6455 section 7.1.5) when no close frame was sent or
   * received; 1005 for a peer's close without a code. */
  /* The codes of RFC 6455 section 7.4.1 by number; a peer's application
   * codes (3000-4999) as "other", so that clients cannot make series. */
  int code = ws->close_code ? ws->close_code : 1006;
  char labels[24];
  if (code >= 1000 && code <= 1015)
    snprintf(labels, sizeof labels, "code=\"%d\"", code);
  else
    snprintf(labels, sizeof labels, "code=\"other\"");
  metrics_add(ws->conn->net->metrics, "converger_ws_closes_total", labels, 1);
  if (ws->ctx) wslay_event_context_free(ws->ctx);
  free(ws);
}

void ws_encoder_free(net_t *net) {
  ws_encoder_t *e = net->encoder;
  if (!e) return;
  if (e->frame) wslay_frame_context_free(e->frame);
  free(e->buf);
  free(e);
  net->encoder = NULL;
}
