/* fixture.c: see fixture.h. */
#include "fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util.h"
#include "core/errors.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/frames.h"
#include "proto/presence.h"
#include "proto/session_int.h"

/* ---- the node's side: what serve.c wires, without its timers ------------- */

/* GET /v1/sse?conv=A&conv=B with Authorization: Bearer TOKEN and
 * Last-Event-ID, as rest.c's handle_sse starts it once it has checked the
 * query (the refusals of the query itself are rest.c's, tested over a
 * real socket in tests/integration/test_sse.py). */
static void sse_request(conn_t *c, http_request_t *req) {
  char convs[4][STORE_ID_MAX + 1];
  const char *list[4];
  size_t n = 0;
  int64_t w;
  char ep[STORE_EPOCH_MAX + 1];
  const char *auth = req->authorization, *q = req->query ? req->query : "";
  for (const char *at = q; n < 4 && (at = strstr(at, "conv=")) != NULL; at += 5, n++) {
    snprintf(convs[n], sizeof convs[n], "%.*s", (int)strcspn(at + 5, "&"), at + 5);
    list[n] = convs[n];
  }
  int bad = n == 0 || !auth || strncmp(auth, "Bearer ", 7) != 0;
  for (size_t i = 0; i < n && !bad; i++)
    bad = !util_id_valid(convs[i]) ||
          session_sse_watermark(req->last_event_id, convs[i], &w, ep) != 0;
  if (bad) {
    http_respond_error(c, 400, "bad_request", "the fixture's stream: conv, token, Last-Event-ID",
                       0);
    return;
  }
  /* ws_start_sse frees the request: what the hello needs is copied first */
  char *token = strdup(auth + 7), *lei = req->last_event_id ? strdup(req->last_event_id) : NULL;
  int events = strstr(q, "presenceEvents=true") ? FRAME_EVENTS_USERS : FRAME_EVENTS_NONE;
  assert_non_null(token);
  if (ws_start_sse(c, 1234) == 0) session_sse_begin(c, token, NULL, list, n, lei, events);
  free(token);
  free(lei);
}

static void on_request(void *ud, conn_t *c, http_request_t *req) {
  if (strcmp(req->path, "/v1/ws") == 0) {
    ws_upgrade(c, req);
    return;
  }
  if (strcmp(req->path, "/v1/sse") == 0) {
    sse_request(c, req);
    return;
  }
  http_respond_error(c, 404, "not_found", "no such route", 0);
}
static int on_upgrade(void *ud, conn_t *c) { return session_start(&((fx_t *)ud)->sessions, c); }
static void on_text(void *ud, conn_t *c, const char *text, size_t len) {
  session_on_text(c, text, len);
}
static void on_writable(void *ud, conn_t *c) { session_on_writable(c); }
static void on_tick(void *ud, conn_t *c, uint64_t now) { session_tick(c, now); }
static void on_close(void *ud, conn_t *c) { session_on_close(c->session); }
static void on_free(void *ud, conn_t *c) {
  fx_t *fx = ud;
  for (int i = 0; i < FX_PEERS_MAX; i++)
    if (fx->peers[i] && fx->peers[i]->conn == c) fx->peers[i]->conn = NULL;
  session_free(c->session);
}
static const char *on_sse_id(void *ud, conn_t *c) {
  return c->session ? session_sse_id(c->session) : NULL;
}

static char *bus_json(void *ud, const char *conv, const store_msg_t *m) {
  return frame_msg(conv, m);
}
static char *bus_wire(void *ud, const char *json, size_t len, size_t *out_len) {
  return ws_encode_text(&((fx_t *)ud)->net, json, len, out_len);
}
static void bus_channel(void *ud, const char *channel, int active) {
  session_channel_changed(&((fx_t *)ud)->sessions, channel, active);
}

static void bus_user(void *ud, const notify_t *n) {
  sessions_t *ss = &((fx_t *)ud)->sessions;
  if (n->kind == NOTIFY_USER_DISCONNECT)
    session_disconnect_user(ss, n->user, n->code, n->reason, (long)n->retry_ms);
  else
    session_unsubscribe_user(ss, n->user, n->conv);
}

static void fixture_bus_heard(void *ud, const notify_t *n) {
  session_ephemeral(&((fx_t *)ud)->sessions, n);
}

static void admission_arm(void *ud, int64_t at_ms) { ((fx_t *)ud)->admission_at = at_ms; }

static void drain_stop(void *ud, const char *why) {
  fx_t *fx = ud;
  fx->stops++;
  snprintf(fx->stop_why, sizeof fx->stop_why, "%s", why);
}
static char *drain_frame(void *ud, int64_t after_ms, const char *to, int64_t deadline_ms) {
  return frame_drain(after_ms, to, deadline_ms);
}
static drain_mark_t *drain_mark(void *ud, conn_t *c) { return session_drain_mark(c->session); }

void fx_init(fx_t *fx, const fx_options_t *opt) {
  fx_options_t o = {.slots = 2, .queue_max = 4, .queue_ms = 1000};
  if (opt) o = *opt;
  memset(fx, 0, sizeof *fx);
  fx->now = 1000000;
  util_mono_fake(&fx->now);
  strcpy(fx->dir, "/tmp/converger-fx-XXXXXX");
  assert_non_null(mkdtemp(fx->dir));
  snprintf(fx->url, sizeof fx->url, "sqlite:%s/fx.db", fx->dir);
  char db_flag[160];
  snprintf(db_flag, sizeof db_flag, "--database-url=%s", fx->url);
  char *argv[] = {db_flag, "--node-id=fx", "--listen=127.0.0.1:0"};
  assert_int_equal(config_parse(&fx->cfg, 3, argv), 0);
  free(fx->cfg.token_secret);
  free(fx->cfg.api_key);
  fx->cfg.token_secret = strdup(FX_SECRET);
  fx->cfg.api_key = strdup("fixture-api-key");
  fx->cfg.handshake_queue_ms = o.queue_ms;
  fx->cfg.handshake_queue_max = o.queue_max;
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  fx->metrics = metrics_new();
  assert_non_null(fx->metrics);
  jitter_seed(&fx->rng, 42);
  conn_handler_t h = {.on_request = on_request,
                      .on_upgrade = on_upgrade,
                      .on_text = on_text,
                      .on_writable = on_writable,
                      .on_tick = on_tick,
                      .on_close = on_close,
                      .on_free = on_free,
                      .sse_id = on_sse_id,
                      .ud = fx};
  conn_net_init(&fx->net, &fx->loop, &fx->cfg, &h, fx->metrics);
  assert_int_equal(store_open(fx->url, NULL, &fx->db), 0);
  assert_int_equal(store_migrate(fx->db), 0);
  assert_int_equal(pool_start_inline(&fx->loop, fx->url, NULL, fx->metrics, &fx->pool), 0);
  bus_handler_t bh = {.msg_json = bus_json,
                      .msg_wire = bus_wire,
                      .channel_changed = bus_channel,
                      .user_control = bus_user,
                      .ephemeral = fixture_bus_heard,
                      .ud = fx};
  fx->bus = bus_new(&fx->loop, &bh, fx->metrics);
  fx->auth = auth_new(fx->cfg.api_key, fx->cfg.token_secret);
  fx->admission_at = -1;
  fx->admission = admission_new(o.slots, (uint64_t)o.queue_ms, o.queue_max, admission_arm, fx);
  drain_env_t de = {.loop = &fx->loop,
                    .cfg = &fx->cfg,
                    .net = &fx->net,
                    .pool = &fx->pool,
                    .rng = &fx->rng,
                    .metrics = fx->metrics,
                    .stop = drain_stop,
                    .frame = drain_frame,
                    .mark = drain_mark,
                    .ud = fx};
  fx->drain = drain_new(&de);
  fx->sessions = (sessions_t){.cfg = &fx->cfg,
                              .pool = &fx->pool,
                              .bus = fx->bus,
                              .auth = fx->auth,
                              .admission = fx->admission,
                              .drain = &fx->drain,
                              .net = &fx->net,
                              .rng = &fx->rng,
                              .metrics = fx->metrics,
                              .users = users_new(),
                              .presence = presence_new(fx->cfg.presence_grace_ms)};
  assert_non_null(fx->sessions.users);
  assert_non_null(fx->sessions.presence);
  assert_non_null(fx->bus);
  assert_non_null(fx->auth);
  assert_non_null(fx->admission);
  assert_non_null(fx->drain);
}

void fx_free(fx_t *fx) {
  for (conn_t *c = fx->net.conns; c; c = c->next) conn_close(c);
  fx_run(fx);
  drain_close(fx->drain);
  fx->drain = NULL;
  pool_t *pool = fx->pool;
  fx->pool = NULL;
  pool_close(pool);
  bus_close(fx->bus);
  while (uv_run(&fx->loop, UV_RUN_NOWAIT)) {
  }
  assert_int_equal(fx->net.nconns, 0);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  admission_free(fx->admission);
  auth_free(fx->auth);
  users_free(fx->sessions.users);
  presence_free(fx->sessions.presence);
  store_close(fx->db);
  config_free(&fx->cfg);
  conn_net_free(&fx->net);
  /* A subscription moved outside its table is a bug wherever a test met
   * it (sub_set_state refused it and logged "BUG:"): fail that test. */
  size_t len = 0;
  char *text = metrics_render(fx->metrics, &len);
  assert_non_null(text);
  if (strstr(text, "\nconverger_subscription_transitions_refused_total{"))
    fail_msg("a subscription moved outside its table (the BUG line above)");
  free(text);
  metrics_free(fx->metrics);
  util_mono_fake(NULL);
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf %s", fx->dir);
  assert_int_equal(system(cmd), 0);
}

void fx_run(fx_t *fx) {
  for (int i = 0; i < 4; i++) {
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    conn_flush_all(&fx->net);
    if (fx->drain) assert_int_equal(drain_check(fx->drain), 0);
  }
}

int fx_step(fx_t *fx) {
  int ran = fx->pool ? pool_step(fx->pool) : 0;
  fx_run(fx);
  return ran;
}

int fx_drain_pool(fx_t *fx) {
  int n = 0;
  while (fx_step(fx)) n++;
  return n;
}

void fx_advance(fx_t *fx, uint64_t ms) {
  fx->now += ms;
  if (fx->admission_at >= 0 && (int64_t)fx->now >= fx->admission_at) {
    fx->admission_at = -1;
    admission_expire(fx->admission, fx->now); /* may arm it again */
  }
  conn_tick(&fx->net, fx->now);
  if (fx->drain) drain_tick(fx->drain);
  fx_run(fx);
}

/* ---- the store -------------------------------------------------------------- */

void fx_conv(fx_t *fx, const char *ch, const char *conv, int n) {
  int r = store_channel_create(fx->db, ch, ch, 0, NULL);
  assert_true(r == 0 || r == -CV_EEXISTS);
  assert_int_equal(store_conv_create(fx->db, conv, ch, NULL), 0);
  for (int i = 1; i <= n; i++) fx_append(fx, conv, i);
}

int64_t fx_append(fx_t *fx, const char *conv, int i) {
  char id[64], body[64];
  snprintf(id, sizeof id, "m-%d", i);
  snprintf(body, sizeof body, "{\"i\":%d}", i);
  store_msg_t m;
  int created = 0;
  assert_int_equal(bus_append(fx->bus, fx->db, conv, id, "fx", body, util_now_ms(), &m, &created),
                   0);
  assert_true(created);
  int64_t seq = m.seq;
  store_msg_clear(&m);
  fx_run(fx);
  return seq;
}

char *fx_token_ttl(fx_t *fx, const char *sub, const char *conv, int64_t ttl_s) {
  json_t *convs = json_pack("[s]", conv);
  char *token = NULL, jti[37];
  int64_t exp;
  assert_int_equal(auth_sign(fx->auth, sub, convs, util_now_ms() / 1000, ttl_s, &token, jti, &exp),
                   0);
  json_decref(convs);
  return token;
}

char *fx_token(fx_t *fx, const char *sub, const char *conv) {
  return fx_token_ttl(fx, sub, conv, 3600);
}

/* ---- the client's side ------------------------------------------------------ */

/* Read what the node wrote so far into p->in. */
static void pull(fx_peer_t *p) {
  for (;;) {
    if (p->in_len == sizeof p->in) fail_msg("the peer's buffer is full");
    ssize_t n = read(p->fd, p->in + p->in_len, sizeof p->in - p->in_len);
    if (n > 0) {
      p->in_len += (size_t)n;
      continue;
    }
    if (n == 0 && !p->closed) { /* EOF */
      p->closed = 1;
      if (!p->close_code) p->close_code = 1006;
    }
    return;
  }
}

/* Write all of `data` to the node; while the socket is full, the node
 * (same thread) is given loop turns to read it. */
static void write_all(fx_peer_t *p, const void *data, size_t len) {
  const char *b = data;
  while (len > 0) {
    ssize_t n = write(p->fd, b, len);
    if (n < 0 && errno == EAGAIN) {
      fx_run(p->fx);
      pull(p); /* and what it answers meanwhile is kept */
      continue;
    }
    assert_true(n > 0);
    b += n;
    len -= (size_t)n;
  }
}

/* One masked client frame (RFC 6455 section 5.2). */
static void send_frame(fx_peer_t *p, int opcode, const void *payload, size_t len) {
  static const unsigned char mask[4] = {0x37, 0xfa, 0x21, 0x3d};
  unsigned char *f = malloc(len + 14);
  size_t h = 0;
  f[h++] = (unsigned char)(0x80 | opcode);
  if (len < 126) {
    f[h++] = (unsigned char)(0x80 | len);
  } else if (len < 65536) {
    f[h++] = 0x80 | 126;
    f[h++] = (unsigned char)(len >> 8);
    f[h++] = (unsigned char)len;
  } else {
    f[h++] = 0x80 | 127;
    for (int i = 7; i >= 0; i--) f[h++] = (unsigned char)((uint64_t)len >> (8 * i));
  }
  memcpy(f + h, mask, 4);
  h += 4;
  for (size_t i = 0; i < len; i++) f[h + i] = ((const unsigned char *)payload)[i] ^ mask[i % 4];
  write_all(p, f, h + len);
  free(f);
}

fx_peer_t *fx_connect_raw(fx_t *fx, const char *request) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  fx_peer_t *p = calloc(1, sizeof *p);
  p->fx = fx;
  p->fd = sv[0];
  fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) | O_NONBLOCK);
  p->conn = conn_adopt(&fx->net, sv[1]);
  assert_non_null(p->conn);
  int slot = 0;
  while (slot < FX_PEERS_MAX && fx->peers[slot]) slot++;
  assert_true(slot < FX_PEERS_MAX);
  fx->peers[slot] = p;
  write_all(p, request, strlen(request));
  fx_run(fx);
  return p;
}

char *fx_take(fx_peer_t *p) {
  fx_run(p->fx);
  pull(p);
  char *out = malloc(p->in_len + 1);
  assert_non_null(out);
  memcpy(out, p->in, p->in_len);
  out[p->in_len] = '\0';
  p->in_len = 0;
  return out;
}

fx_peer_t *fx_connect(fx_t *fx) { return fx_connect_with(fx, ""); }

fx_peer_t *fx_connect_with(fx_t *fx, const char *headers) {
  char req[1024];
  snprintf(req, sizeof req,
           "GET /v1/ws HTTP/1.1\r\nHost: fixture\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           "Sec-WebSocket-Version: 13\r\n%s\r\n",
           headers);
  fx_peer_t *p = fx_connect_raw(fx, req);
  pull(p);
  char *end = memmem(p->in, p->in_len, "\r\n\r\n", 4);
  assert_non_null(end);
  assert_memory_equal(p->in, "HTTP/1.1 101", 12);
  size_t head = (size_t)(end + 4 - p->in);
  memmove(p->in, p->in + head, p->in_len - head);
  p->in_len -= head;
  assert_int_equal(p->conn->mode, CONN_WS);
  return p;
}

void fx_peer_free(fx_peer_t *p) {
  close(p->fd);
  fx_run(p->fx);
  for (int i = 0; i < FX_PEERS_MAX; i++)
    if (p->fx->peers[i] == p) p->fx->peers[i] = NULL;
  free(p);
}

void fx_send(fx_peer_t *p, const char *json) {
  send_frame(p, 1, json, strlen(json));
  fx_run(p->fx);
}

void fx_hello(fx_peer_t *p, const char *conv, int64_t watermark) {
  char *token = fx_token(p->fx, "alice", conv);
  fx_hello_token(p, token, conv, watermark);
  free(token);
}

void fx_hello_token(fx_peer_t *p, const char *token, const char *conv, int64_t watermark) {
  json_t *sub = json_pack("{s:s}", "conv", conv);
  json_object_set_new(sub, "watermark", watermark < 0 ? json_null() : json_integer(watermark));
  json_t *hello = json_pack("{s:s, s:s, s:[o]}", "type", "hello", "token", token, "subs", sub);
  char *text = json_dumps(hello, JSON_COMPACT);
  fx_send(p, text);
  free(text);
  json_decref(hello);
}

json_t *fx_recv(fx_peer_t *p) {
  fx_run(p->fx);
  for (;;) {
    pull(p);
    const unsigned char *b = (const unsigned char *)p->in;
    if (p->in_len < 2) return NULL;
    assert_int_equal(b[1] & 0x80, 0); /* server frames are not masked */
    size_t h = 2, len = b[1] & 0x7f;
    if (len == 126) {
      if (p->in_len < 4) return NULL;
      len = (size_t)b[2] << 8 | b[3];
      h = 4;
    } else if (len == 127) {
      if (p->in_len < 10) return NULL;
      len = 0;
      for (int i = 0; i < 8; i++) len = len << 8 | b[2 + i];
      h = 10;
    }
    if (p->in_len < h + len) return NULL;
    int opcode = b[0] & 0x0f;
    assert_true(b[0] & 0x80); /* the node does not fragment */
    char *payload = malloc(len + 1);
    memcpy(payload, p->in + h, len);
    payload[len] = '\0';
    memmove(p->in, p->in + h + len, p->in_len - h - len);
    p->in_len -= h + len;
    if (opcode == 9) { /* ping: pong, and on */
      send_frame(p, 10, payload, len);
      free(payload);
      fx_run(p->fx);
      continue;
    }
    if (opcode == 8) {
      p->closed = 1;
      p->close_code =
          len >= 2 ? ((unsigned char)payload[0] << 8 | (unsigned char)payload[1]) : 1005;
      snprintf(p->close_reason, sizeof p->close_reason, "%s", len > 2 ? payload + 2 : "");
      free(payload);
      return NULL;
    }
    assert_int_equal(opcode, 1);
    json_error_t err;
    json_t *js = json_loads(payload, 0, &err);
    if (!js) fail_msg("not JSON: %s", payload);
    free(payload);
    return js;
  }
}

json_t *fx_expect(fx_peer_t *p, const char *type) {
  json_t *js = fx_recv(p);
  if (!js)
    fail_msg("expected a %s frame, got none (closed %d, code %d)", type, p->closed, p->close_code);
  const char *t = json_string_value(json_object_get(js, "type"));
  if (!t || strcmp(t, type) != 0) {
    char *text = json_dumps(js, JSON_COMPACT);
    fail_msg("expected a %s frame, got %s", type, text);
  }
  return js;
}

void fx_expect_nothing(fx_peer_t *p) {
  json_t *js = fx_recv(p);
  if (js) {
    char *text = json_dumps(js, JSON_COMPACT);
    fail_msg("expected no frame, got %s", text);
  }
}

int fx_sub_state(fx_peer_t *p, const char *conv) {
  if (!p->conn || !p->conn->session) return -1;
  sub_t *sub = session_find_sub(p->conn->session, conv);
  return sub ? (int)sub->state : -1;
}
