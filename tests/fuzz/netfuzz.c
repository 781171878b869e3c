/*
 * netfuzz.c: the network fuzz harness (netfuzz.h): a socketpair, the real
 * net/ layers on one end, the fuzz input written into the other, and a fake
 * handler standing in for the REST router and the protocol session.
 */
#include "netfuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "core/config.h"
#include "core/log.h"
#include "common/util.h"
#include "net/conn.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/frames.h"
#include "proto/session.h"

#define MAX_ROUNDS  100000 /* loop turns for one input: more is a hang */
#define IDLE_ROUNDS 3      /* turns with nothing moving: the connection is quiet */

/* What the fake handler keeps for a WebSocket, in c->session: the
 * transport only stores the pointer and hands it back to on_free. */
typedef struct {
  int pinged;     /* on_tick sent its one ping */
  int64_t seq;    /* last seq given to a send; a stream's watermark */
  unsigned texts; /* text messages received */
} fake_session_t;

#define SSE_CONV "support-42" /* the conversation of a fake stream */

static uv_loop_t loop;
static uv_check_t flush_check;
static net_t net;
static config_t cfg;
static uint64_t now_ms = 1000000; /* the fake monotonic clock */
static int ready;
static int echo; /* NETFUZZ_ECHO set: copy the answers to stderr */

/* The request answered on a later turn (a REST answer after its pool
 * job); its connection is held with conn_ref meanwhile. */
static conn_t *deferred;

static fake_session_t *session_of(conn_t *c) { return (fake_session_t *)(void *)c->session; }

/* ---- the fake handler: HTTP ------------------------------------------------ */

static void allow(conn_t *c, const char *methods) {
  char extra[64];
  snprintf(extra, sizeof extra, "Allow: %s\r\n", methods);
  http_respond_json(c, 405,
                    json_pack("{s:{s:s, s:s}}", "error", "code", "method_not_allowed", "message",
                              "method not allowed on this path"),
                    extra);
}

/* /v1/conversations/ID/messages: 1 and the id in `conv`, else 0. */
static int messages_path(const char *path, char conv[STORE_ID_MAX + 1]) {
  static const char head[] = "/v1/conversations/", tail[] = "/messages";
  size_t n = strlen(path);
  if (n <= sizeof head - 1 + sizeof tail - 1 || strncmp(path, head, sizeof head - 1) != 0 ||
      strcmp(path + n - (sizeof tail - 1), tail) != 0)
    return 0;
  size_t id_len = n - (sizeof head - 1) - (sizeof tail - 1);
  if (id_len > STORE_ID_MAX) return 0;
  memcpy(conv, path + sizeof head - 1, id_len);
  conv[id_len] = '\0';
  return util_id_valid(conv);
}

static void send_owned(conn_t *c, char *text) {
  if (text) ws_send_text(c, text, strlen(text));
  free(text);
}

/* A stream's id: its one conversation at the fake watermark. */
static const char *sse_id(void *ud, conn_t *c) {
  static char id[64];
  fake_session_t *s = session_of(c);
  if (!s) return NULL;
  snprintf(id, sizeof id, "%s %lld 9c4e01af", SSE_CONV, (long long)s->seq);
  return id;
}

/* GET /v1/sse, as rest.c's handle_sse and the session answer it: the
 * Last-Event-ID checked, then a stream of one conversation. */
static void sse_request(conn_t *c, http_request_t *req) {
  int64_t watermark;
  char epoch[STORE_EPOCH_MAX + 1];
  if (session_sse_watermark(req->last_event_id, SSE_CONV, &watermark, epoch) != 0)
    return http_respond_error(c, 400, "bad_request", "bad Last-Event-ID", 0);
  int drain = req->query && strstr(req->query, "drain") != NULL,
      closing = req->query && strstr(req->query, "close") != NULL;
  if (ws_start_sse(c, 1500) != 0) return;
  fake_session_t *s = session_of(c);
  /* null: live at a head of 7; one below the largest seq, for the next */
  s->seq = watermark < 0 ? 7 : watermark < INT64_MAX ? watermark : INT64_MAX - 1;
  json_t *welcome = json_pack("{s:s, s:s}", "type", "welcome", "session", "fuzz");
  send_owned(c, frame_dump(welcome));
  json_decref(welcome);
  char sender[] = "bot", body[] = "{\"text\":\n\"two data: lines\"}"; /* as it was sent */
  store_msg_t m = {.seq = s->seq + 1, .id = "m-1", .sender = sender, .body = body, .ts_ms = 1};
  char *msg = frame_msg(SSE_CONV, &m);
  s->seq++;
  if (msg) ws_send_msg(c, NULL, 0, msg, strlen(msg), sse_id(NULL, c));
  free(msg);
  send_owned(c, frame_synced(SSE_CONV, s->seq, epoch, 0));
  send_owned(c, frame_signal(SSE_CONV, "bot", 1, "{\"typing\":true}"));
  ws_ping(c);
  if (drain) send_owned(c, frame_drain(250, NULL, 5000));
  if (closing) ws_close(c, WS_CLOSE_SERVICE_RESTART, "{\"retryAfterMs\":1200}");
}

static void on_request(void *ud, conn_t *c, http_request_t *req) {
  const char *path = req->path;
  char conv[STORE_ID_MAX + 1];
  if (strcmp(path, "/v1/ws") == 0) { /* as rest_handle answers it */
    req->route = "/v1/ws";
    const char *why;
    int status = ws_check_upgrade(req, &why);
    if (status == 405) {
      allow(c, "GET");
    } else if (status) {
      req->keep_alive = 0;
      http_respond_json(c, status,
                        json_pack("{s:{s:s, s:s}}", "error", "code", "bad_request", "message", why),
                        "Sec-WebSocket-Version: 13\r\n");
    } else {
      ws_upgrade(c, req);
    }
    return;
  }
  if (strcmp(path, "/v1/sse") == 0) {
    req->route = "/v1/sse";
    if (req->method != 1 /* HTTP_GET */) return allow(c, "GET");
    return sse_request(c, req);
  }
  if (strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0 ||
      strcmp(path, "/livez") == 0) {
    req->route = "/healthz";
    if (req->method != 1 /* HTTP_GET */) return allow(c, "GET");
    return http_respond_json(c, 200, json_pack("{s:s}", "status", "ok"), NULL);
  }
  if (messages_path(path, conv)) {
    req->route = "/v1/conversations/{id}/messages";
    if (req->method != 3 /* HTTP_POST */) return allow(c, "POST");
    json_error_t err;
    json_t *body = json_loadb(req->body, req->body_len, 0, &err);
    if (!body) return http_respond_error(c, 400, "bad_request", err.text, 0);
    json_decref(body);
    if (deferred) /* never: one request at a time (net/http.h) */
      abort();
    conn_ref(c); /* answered on a later turn, as after a pool job */
    deferred = c;
    return;
  }
  http_respond_error(c, 404, "not_found", "no such route", 0);
}

/* The deferred answer, outside any callback of the connection. */
static int answer_deferred(void) {
  conn_t *c = deferred;
  if (!c) return 0;
  deferred = NULL;
  if (conn_unref(c) && http_current(c))
    http_respond_json(c, 201, json_pack("{s:i}", "seq", 1), NULL);
  return 1;
}

/* ---- the fake handler: WebSocket ------------------------------------------- */

static int on_upgrade(void *ud, conn_t *c) {
  fake_session_t *s = calloc(1, sizeof *s);
  if (!s) return -1;
  c->session = (session_t *)(void *)s;
  return 0;
}

static void on_text(void *ud, conn_t *c, const char *text, size_t len) {
  fake_session_t *s = session_of(c);
  frame_client_t f;
  char why[200];
  s->texts++;
  if (frame_decode(text, len, 100, &f, why, sizeof why) != 0) {
    send_owned(c, frame_error("bad_request", why, NULL, 0, NULL));
    return;
  }
  switch (f.type) {
  case FRAME_HELLO:
    if (strcmp(f.token, "close") == 0) {
      ws_close(c, WS_CLOSE_POLICY_VIOLATION, "token revoked");
      break;
    }
    json_t *welcome = json_pack("{s:s, s:s}", "type", "welcome", "session", "fuzz");
    send_owned(c, frame_dump(welcome));
    json_decref(welcome);
    for (size_t i = 0; i < f.nsubs; i++)
      send_owned(c, frame_synced(f.subs[i].conv, 0, f.subs[i].epoch, 0));
    break;
  case FRAME_SYNC:
    send_owned(c, frame_synced(f.conv, f.watermark < 0 ? 0 : f.watermark, f.epoch, 1));
    break;
  case FRAME_SEND: { /* encoded once and queued as bytes, as the bus does */
    char *sent = frame_sent(f.conv, f.id, ++s->seq);
    size_t wire_len;
    char *wire = sent ? ws_encode_text(c->net, sent, strlen(sent), &wire_len) : NULL;
    if (wire) ws_send_frame(c, wire, wire_len);
    free(wire);
    free(sent);
    break;
  }
  case FRAME_PING:
    send_owned(c, frame_pong());
    break;
  case FRAME_SUBSCRIBE:
    send_owned(c, frame_subscribed(f.conv, 0, "fuzz", 0, 0, 0));
    break;
  case FRAME_UNSUBSCRIBE:
    send_owned(c, frame_unsubscribed(f.conv));
    break;
  case FRAME_REFRESH:
    send_owned(c, frame_refreshed(60000));
    break;
  case FRAME_PRESENCE:
    send_owned(c, frame_presence(f.conv, NULL, 0, 0, f.members, NULL, 0));
    break;
  case FRAME_SIGNAL: {
    char *body = frame_dump(f.body);
    if (body) send_owned(c, frame_signal(f.conv, "fuzz", 0, body));
    free(body);
    break;
  }
  }
  frame_client_clear(&f);
}

static void on_writable(void *ud, conn_t *c) {}

static void on_tick(void *ud, conn_t *c, uint64_t now) {
  fake_session_t *s = session_of(c);
  if (s && !s->pinged && s->texts > 0) { /* one heartbeat once the client spoke */
    s->pinged = 1;
    ws_ping(c);
  }
}

static void on_close(void *ud, conn_t *c) {}

static void on_free(void *ud, conn_t *c) {
  free(c->session);
  c->session = NULL;
}

/* ---- the harness ------------------------------------------------------------- */

static void check_cb(uv_check_t *h) { conn_flush_all(&net); }

static void setup(void) {
  static const conn_handler_t handler = {.on_request = on_request,
                                         .on_upgrade = on_upgrade,
                                         .on_text = on_text,
                                         .on_writable = on_writable,
                                         .on_tick = on_tick,
                                         .on_close = on_close,
                                         .on_free = on_free,
                                         .sse_id = sse_id};
  if (ready) return;
  echo = getenv("NETFUZZ_ECHO") != NULL;
  log_set_level(echo ? LOG_DEBUG : LOG_ERROR);
  signal(SIGPIPE, SIG_IGN); /* as the node: a write to a closed peer is EPIPE */
  util_mono_fake(&now_ms);
  if (uv_loop_init(&loop) != 0) abort();
  cfg.max_message_bytes = 4096; /* below -max_len, so the 1009 close is reachable */
  cfg.heartbeat_ms = 25000;
  cfg.hello_timeout_ms = 10000;
  cfg.header_timeout_ms = 10000;
  cfg.max_subs = 100;
  conn_net_init(&net, &loop, &cfg, &handler, NULL); /* no registry: nothing recorded */
  uv_check_init(&loop, &flush_check);
  uv_check_start(&flush_check, check_cb);
  uv_unref((uv_handle_t *)&flush_check);
  ready = 1;
}

/* Read and discard what the connection wrote. Returns the bytes read. */
static size_t drain_peer(int fd) {
  char buf[65536];
  size_t total = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return total;
    if (echo) fwrite(buf, 1, (size_t)n, stderr);
    total += (size_t)n;
  }
}

/* One turn: the loop once (no waiting), the tick, the deferred answer. 1
 * when anything moved. */
static int turn(int peer) {
  now_ms++;
  uv_run(&loop, UV_RUN_NOWAIT);
  conn_tick(&net, now_ms);
  int moved = answer_deferred();
  conn_flush_all(&net);
  if (peer >= 0 && drain_peer(peer) > 0) moved = 1;
  return moved;
}

int netfuzz_run(const uint8_t *prefix, size_t prefix_len, const uint8_t *data, size_t len) {
  static const size_t cycle[] = {1, 13, 200, 3, 4096, 64, 2, 1500, 7, 512, 31, 8192};
  setup();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
  int peer = sv[1];
  if (fcntl(peer, F_SETFL, O_NONBLOCK) != 0) abort();
  conn_adopt(&net, sv[0]);

  size_t off = 0, k = 0;
  int writing = 1, idle = 0, rounds = 0;
  if (prefix_len && send(peer, prefix, prefix_len, MSG_NOSIGNAL) != (ssize_t)prefix_len)
    writing = 0; /* the connection is already gone */
  while (rounds++ < MAX_ROUNDS) {
    int moved = 0;
    if (writing && off < len) {
      size_t n = cycle[k++ % CV_ARRAY_SIZE(cycle)];
      if (n > len - off) n = len - off;
      ssize_t w = send(peer, data + off, n, MSG_NOSIGNAL);
      if (w > 0) {
        off += (size_t)w;
        moved = 1;
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        writing = 0; /* closed by the connection */
      }
    }
    if (turn(peer)) moved = 1;
    if (!writing || off == len) {
      idle = moved ? 0 : idle + 1;
      if (idle >= IDLE_ROUNDS || net.nconns == 0) break;
    }
  }
  if (rounds >= MAX_ROUNDS) {
    fprintf(stderr, "netfuzz: the connection never went quiet\n");
    abort();
  }

  /* The client goes away; the connection must close and be freed. */
  close(peer);
  for (rounds = 0; net.nconns > 0 && rounds < MAX_ROUNDS; rounds++) {
    turn(-1);
    if (rounds == 100) { /* past every deadline: the tick closes what is left */
      now_ms += 3600 * 1000;
      conn_tick(&net, now_ms);
    }
  }
  if (net.nconns > 0 || deferred) {
    fprintf(stderr, "netfuzz: the connection was never freed (%d left)\n", net.nconns);
    abort();
  }
  return 0;
}
