/* Tests of the client library's libuv transport (client/client_uv.c) over
 * real loopback sockets, against a scripted server in the same loop: the
 * upgrade is checked (Sec-WebSocket-Accept, subprotocol), a 503 and a 1012
 * close give their retry hints, client frames are masked, bad server frames
 * are counted and ignored, many clients share one loop, and every handle is
 * closed at the end (uv_loop_close() == 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "converger/client.h"
#include "common/wskey.h"

typedef enum {
  S_OK,          /* 101, then the script below after the hello */
  S_BAD_ACCEPT,  /* 101 with a wrong Sec-WebSocket-Accept */
  S_NO_PROTOCOL, /* 101 without the subprotocol */
  S_503,         /* 503 with Retry-After: 2 */
  S_STALL,       /* welcome, then it stops reading */
  S_MASKED,      /* welcome, then a masked frame (clients mask, servers never do) */
} scenario_t;

typedef struct srv_s srv_t;

typedef struct {
  uv_tcp_t tcp;
  srv_t *s;
  char in[65536];
  size_t inlen;
  int upgraded;
} sconn_t;

struct srv_s {
  uv_loop_t *loop;
  uv_tcp_t listener;
  int port;
  scenario_t scenario;
  int accepted;
  int hellos;       /* hello frames received, masked and well formed */
  int unmasked;     /* client frames without a mask (must stay 0) */
  char hello[4096]; /* the last hello */
  int close_after;  /* S_OK: answer the sync with close 1012 */
  int client_close; /* code of the client's close frame, 0: none */
  char sync[4096];  /* the last sync frame */
  int sends;        /* send frames received */
  int pongs;        /* pong frames received */
};

static void on_sconn_closed(uv_handle_t *h) { free(h->data); }

static void swrite(sconn_t *c, const void *data, size_t len) {
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
  assert_true(uv_try_write((uv_stream_t *)&c->tcp, &b, 1) == (int)len);
}

static void sframe(sconn_t *c, int opcode, const char *payload, size_t len) {
  uint8_t h[4] = {(uint8_t)(0x80 | opcode)};
  size_t hl = 2;
  if (len < 126) {
    h[1] = (uint8_t)len;
  } else {
    h[1] = 126;
    h[2] = (uint8_t)(len >> 8);
    h[3] = (uint8_t)len;
    hl = 4;
  }
  swrite(c, h, hl);
  if (len) swrite(c, payload, len);
}

static void stext(sconn_t *c, const char *text) { sframe(c, 1, text, strlen(text)); }

/* The script of S_OK, once the hello is in. */
static void play(sconn_t *c) {
  stext(c, "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"scripted\",\"heartbeatMs\":25000,"
           "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":false}]}");
  stext(c, "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":1,\"id\":\"a\",\"sender\":\"u\","
           "\"ts\":\"2026-11-29T00:00:00.000Z\",\"body\":{\"x\":1}}");
  stext(c, "this is not JSON");
  sframe(c, 2, "\x01\x02", 2); /* binary: not part of the protocol */
  sframe(c, 9, "", 0);         /* a ping: the client answers */
  stext(c, "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":2,\"id\":\"b\",\"sender\":\"u\","
           "\"ts\":\"2026-11-29T00:00:00.000Z\",\"body\":[true]}");
  stext(c, "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":4,\"id\":\"d\",\"sender\":\"u\","
           "\"ts\":\"2026-11-29T00:00:00.000Z\",\"body\":0}"); /* 3 is missing: a gap */
}

/* Parse client frames in c->in: each must be masked. */
static void client_frames(sconn_t *c) {
  for (;;) {
    if (c->inlen < 2) return;
    uint8_t *p = (uint8_t *)c->in;
    int masked = p[1] & 0x80;
    size_t len = p[1] & 0x7f, off = 2;
    if (len == 126) {
      if (c->inlen < 4) return;
      len = (size_t)p[2] << 8 | p[3];
      off = 4;
    }
    assert_true(len < 65536);
    if (!masked) c->s->unmasked++;
    size_t need = off + (masked ? 4 : 0) + len;
    if (c->inlen < need) return;
    uint8_t *key = p + off, *data = p + off + (masked ? 4 : 0);
    char text[4096];
    size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
    for (size_t i = 0; i < n; i++) text[i] = (char)(masked ? data[i] ^ key[i % 4] : data[i]);
    text[n] = '\0';
    int opcode = p[0] & 0x0f;
    if (opcode == 10) c->s->pongs++;
    if (opcode == 8) c->s->client_close = n >= 2 ? (uint8_t)text[0] << 8 | (uint8_t)text[1] : 1005;
    if (opcode == 1 && strstr(text, "\"type\":\"sync\"")) {
      snprintf(c->s->sync, sizeof c->s->sync, "%s", text);
      if (c->s->close_after) { /* a restart: close 1012 with a hint */
        const char reason[] = "\x03\xf4{\"retryAfterMs\":1500}";
        sframe(c, 8, reason, sizeof reason - 1);
      }
    }
    if (opcode == 1 && strstr(text, "\"type\":\"send\"")) c->s->sends++;
    if (opcode == 1 && strstr(text, "\"type\":\"hello\"")) {
      c->s->hellos++;
      snprintf(c->s->hello, sizeof c->s->hello, "%s", text);
      if (c->s->scenario == S_OK) {
        play(c);
      } else {
        stext(c, "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"subs\":[]}");
        if (c->s->scenario == S_STALL) uv_read_stop((uv_stream_t *)&c->tcp);
        if (c->s->scenario == S_MASKED) {
          const uint8_t masked[] = {0x81, 0x82, 1, 2, 3, 4, 'h' ^ 1, 'i' ^ 2};
          swrite(c, masked, sizeof masked);
        }
      }
    }
    memmove(c->in, c->in + need, c->inlen - need);
    c->inlen -= need;
  }
}

static void upgrade(sconn_t *c) {
  char *end = strstr(c->in, "\r\n\r\n");
  if (!end) return;
  size_t used = (size_t)(end + 4 - c->in);
  char key[64] = "";
  const char *k = strstr(c->in, "Sec-WebSocket-Key: ");
  assert_non_null(k);
  sscanf(k + 19, "%63[^\r]", key);
  assert_non_null(strstr(c->in, "GET /v1/ws HTTP/1.1\r\n"));
  assert_non_null(strstr(c->in, "Sec-WebSocket-Protocol: converger.v1\r\n"));
  char accept[29], resp[512];
  ws_accept_key(key, accept);
  switch (c->s->scenario) {
  case S_503:
    snprintf(resp, sizeof resp,
             "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Type: "
             "application/json\r\nContent-Length: 2\r\n\r\n{}");
    break;
  case S_BAD_ACCEPT:
    accept[3] ^= 1;
    /* fall through */
  case S_OK:
  case S_STALL:
  case S_MASKED:
  case S_NO_PROTOCOL:
    snprintf(resp, sizeof resp,
             "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Accept: %s\r\n%s\r\n",
             accept,
             c->s->scenario == S_NO_PROTOCOL ? "" : "Sec-WebSocket-Protocol: converger.v1\r\n");
    break;
  }
  swrite(c, resp, strlen(resp));
  c->upgraded = 1;
  memmove(c->in, c->in + used, c->inlen - used);
  c->inlen -= used;
}

static void salloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  sconn_t *c = h->data;
  *buf = uv_buf_init(c->in + c->inlen, (unsigned)(sizeof c->in - 1 - c->inlen));
}

static void sread(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  sconn_t *c = st->data;
  if (n < 0) {
    uv_close((uv_handle_t *)&c->tcp, on_sconn_closed);
    return;
  }
  c->inlen += (size_t)n;
  c->in[c->inlen] = '\0';
  if (!c->upgraded) upgrade(c);
  if (c->upgraded) client_frames(c);
}

static void on_conn(uv_stream_t *l, int status) {
  srv_t *s = l->data;
  assert_int_equal(status, 0);
  sconn_t *c = calloc(1, sizeof *c);
  c->s = s;
  uv_tcp_init(s->loop, &c->tcp);
  c->tcp.data = c;
  assert_int_equal(uv_accept(l, (uv_stream_t *)&c->tcp), 0);
  s->accepted++;
  uv_read_start((uv_stream_t *)&c->tcp, salloc, sread);
}

static void srv_start(srv_t *s, uv_loop_t *loop, scenario_t sc) {
  memset(s, 0, sizeof *s);
  s->loop = loop;
  s->scenario = sc;
  uv_tcp_init(loop, &s->listener);
  s->listener.data = s;
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  assert_int_equal(uv_tcp_bind(&s->listener, (struct sockaddr *)&a, 0), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&s->listener, 512, on_conn), 0);
  struct sockaddr_in got;
  int len = sizeof got;
  uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &len);
  s->port = ntohs(got.sin_port);
}

/* What is left open at the end are the server's connections. */
static void close_walk(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) uv_close(h, on_sconn_closed);
}

/* ---- the client side ---------------------------------------------------------------- */

typedef struct {
  uv_loop_t *loop;
  srv_t *srv;
  cvg_client_t *client;
  int64_t seqs[16];
  char bodies[16][64];
  int nmsg;
  char waiting_detail[512];
  int waits;
  int welcomed;
  int closed;
  int64_t sent_seq;
} app_t;

static void on_message(void *ud, const cvg_message_t *m) {
  app_t *a = ud;
  a->seqs[a->nmsg] = m->seq;
  snprintf(a->bodies[a->nmsg], sizeof a->bodies[0], "%s", m->body);
  a->nmsg++;
}

static void on_state(void *ud, cvg_state_t s, const char *detail) {

  app_t *a = ud;
  if (s == CVG_STATE_WAITING) {
    a->waits++;
    snprintf(a->waiting_detail, sizeof a->waiting_detail, "%s", detail);
  }
  if (s == CVG_STATE_CONNECTED) a->welcomed++;
}

static void on_closed(void *ud) { ((app_t *)ud)->closed = 1; }

static void make_client(app_t *a, uv_loop_t *loop, srv_t *srv) {
  memset(a, 0, sizeof *a);
  a->loop = loop;
  a->srv = srv;
  char url[64];
  snprintf(url, sizeof url, "ws://127.0.0.1:%d", srv->port); /* the path defaults to /v1/ws */
  const char *urls[] = {url};
  cvg_sub_t sub = {"c1", CVG_WATERMARK_NONE};
  cvg_options_t o;
  cvg_options_init(&o);
  o.urls = urls;
  o.nurls = 1;
  o.token = "tok";
  o.subs = &sub;
  o.nsubs = 1;
  o.seed = 7;
  o.cb.on_message = on_message;
  o.cb.on_state = on_state;
  o.userdata = a;
  char err[200];
  assert_int_equal(cvg_client_new(loop, &o, &a->client, err, sizeof err), 0);
  assert_int_equal(cvg_client_start(a->client), 0);
  assert_int_equal(cvg_client_start(a->client), CVG_ESTATE);
}

/* Run the loop until `done(a)` or 10 s. */
static void run_until(uv_loop_t *loop, int (*done)(app_t *), app_t *a) {
  uint64_t deadline = uv_now(loop) + 10000;
  while (!done(a) && uv_now(loop) < deadline) uv_run(loop, UV_RUN_ONCE);
  assert_true(done(a));
}

static int is_waiting(app_t *a) { return a->waits > 0; }

static int is_closed(app_t *a) { return a->closed; }

/* Close the client and the server, run until everything is closed. */
static void finish(uv_loop_t *loop, app_t *a, srv_t *s) {
  cvg_client_close(a->client, on_closed, a);
  run_until(loop, is_closed, a);
  uv_close((uv_handle_t *)&s->listener, NULL);
  uv_walk(loop, close_walk, s);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(loop), 0);
}

static int got_sync(app_t *a) { return a->srv->sync[0] != '\0'; }

static int got_send(app_t *a) { return a->srv->sends > 0; }

static int close_echoed(app_t *a) { return a->srv->client_close != 0; }

static long next_delay(app_t *a) {
  const char *p = strstr(a->waiting_detail, "next attempt in ");
  assert_non_null(p);
  return strtol(p + 16, NULL, 10);
}

static void test_wrong_accept_fails_the_attempt(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_BAD_ACCEPT);
  app_t a;
  make_client(&a, &loop, &s);
  run_until(&loop, is_waiting, &a);
  assert_non_null(strstr(a.waiting_detail, "wrong Sec-WebSocket-Accept"));
  assert_int_equal(s.hellos, 0);
  assert_int_equal(a.welcomed, 0);
  finish(&loop, &a, &s);
}

static void test_missing_subprotocol_fails_the_attempt(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_NO_PROTOCOL);
  app_t a;
  make_client(&a, &loop, &s);
  run_until(&loop, is_waiting, &a);
  assert_non_null(strstr(a.waiting_detail, "subprotocol"));
  finish(&loop, &a, &s);
}

static void test_503_gives_retry_after_as_hint(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_503);
  app_t a;
  make_client(&a, &loop, &s);
  run_until(&loop, is_waiting, &a);
  assert_true(next_delay(&a) >= 2000);
  cvg_stats_t st;
  cvg_client_stats(a.client, &st);
  assert_int_equal(st.unavailable, 1);
  assert_int_equal(st.attempts, 1);
  finish(&loop, &a, &s);
}

static void test_scripted_session(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_OK);
  s.close_after = 1;
  app_t a;
  make_client(&a, &loop, &s);
  run_until(&loop, is_waiting, &a); /* after the 1012 close */
  assert_int_equal(s.hellos, 1);
  assert_int_equal(s.unmasked, 0);
  char want[256];
  snprintf(want, sizeof want,
           "{\"type\":\"hello\",\"token\":\"tok\",\"subs\":[{\"conv\":\"c1\",\"watermark\":null}],"
           "\"clientId\":\"%s\"}",
           cvg_client_id(a.client));
  assert_string_equal(s.hello, want);
  assert_int_equal(a.welcomed, 1);
  assert_int_equal(a.nmsg, 2);
  assert_int_equal(a.seqs[0], 1);
  assert_string_equal(a.bodies[0], "{\"x\":1}");
  assert_string_equal(a.bodies[1], "[true]");
  /* the gap was answered at once with a sync from the watermark */
  run_until(&loop, got_sync, &a);
  assert_string_equal(s.sync, "{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":2}");
  assert_true(next_delay(&a) >= 1500);
  assert_non_null(strstr(a.waiting_detail, "1012"));
  run_until(&loop, close_echoed, &a);
  assert_int_equal(s.client_close, 1012); /* the close is answered with its own code */
  assert_int_equal(s.pongs, 1);           /* and the ping with a pong, before it */
  cvg_stats_t st;
  cvg_client_stats(a.client, &st);
  assert_int_equal(st.bad_frames, 1);
  assert_int_equal(cvg_client_watermark(a.client, "c1"), 2);
  assert_string_equal(st.node, "");
  finish(&loop, &a, &s);
}

static void on_sent(void *ud, const char *conv, const char *id, int64_t seq, const char *error) {
  app_t *a = ud;
  a->sent_seq = error ? -1 : seq;
}

static void test_close_completes_pending_sends(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_OK);
  app_t a;
  make_client(&a, &loop, &s);
  assert_int_equal(cvg_send(a.client, "c1", "id-1", "{\"a\":1}", on_sent, &a), 0);
  assert_int_equal(cvg_send(a.client, "c1", NULL, "not json", on_sent, &a), CVG_EINVAL);
  uint64_t deadline = uv_now(&loop) + 10000;
  while (a.nmsg < 2 && uv_now(&loop) < deadline) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(a.nmsg, 2);
  /* the send made before the welcome went out after it */
  run_until(&loop, got_send, &a);
  assert_int_equal(s.sends, 1);
  /* the scripted server never answers `sent`: closing completes the send */
  cvg_client_close(a.client, on_closed, &a);
  assert_int_equal(a.sent_seq, -1);
  assert_int_equal(cvg_send(a.client, "c1", NULL, "1", on_sent, &a), CVG_ESTATE);
  run_until(&loop, is_closed, &a);
  uv_close((uv_handle_t *)&s.listener, NULL);
  uv_walk(&loop, close_walk, &s);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

#define MANY 200

static void test_many_clients_share_one_loop(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_OK);
  app_t *apps = calloc(MANY, sizeof *apps);
  for (int i = 0; i < MANY; i++) make_client(&apps[i], &loop, &s);
  uint64_t deadline = uv_now(&loop) + 20000;
  int done = 0;
  while (done < MANY && uv_now(&loop) < deadline) {
    uv_run(&loop, UV_RUN_ONCE);
    done = 0;
    for (int i = 0; i < MANY; i++) done += apps[i].nmsg == 2;
  }
  assert_int_equal(done, MANY);
  assert_int_equal(s.hellos, MANY);
  assert_int_equal(s.unmasked, 0);
  for (int i = 0; i < MANY; i++) cvg_client_close(apps[i].client, on_closed, &apps[i]);
  deadline = uv_now(&loop) + 10000;
  while (uv_now(&loop) < deadline) {
    int closed = 0;
    for (int i = 0; i < MANY; i++) closed += apps[i].closed;
    if (closed == MANY) break;
    uv_run(&loop, UV_RUN_ONCE);
  }
  for (int i = 0; i < MANY; i++) assert_true(apps[i].closed);
  free(apps);
  uv_close((uv_handle_t *)&s.listener, NULL);
  uv_walk(&loop, close_walk, &s);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static int is_welcomed(app_t *a) { return a->welcomed > 0; }

/* A server that stops reading cannot hold cvg_client_close up: the close
 * frame waits behind megabytes of sends, and the connection is dropped
 * after a short linger. */
static void test_close_does_not_wait_for_a_stalled_server(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_STALL);
  app_t a;
  make_client(&a, &loop, &s);
  run_until(&loop, is_welcomed, &a);
  char *body = malloc(60000);
  memset(body, 'z', 60000);
  body[0] = '"';
  body[59998] = '"';
  body[59999] = '\0';
  for (int i = 0; i < 100; i++)
    assert_int_equal(cvg_send(a.client, "c1", NULL, body, NULL, NULL), 0);
  free(body);
  for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT); /* fill the socket buffers */
  uint64_t t0 = uv_now(&loop);
  cvg_client_close(a.client, on_closed, &a);
  run_until(&loop, is_closed, &a);
  uv_update_time(&loop);
  assert_true(uv_now(&loop) - t0 < 5000);
  uv_close((uv_handle_t *)&s.listener, NULL);
  uv_walk(&loop, close_walk, &s);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* A frame wslay refuses (here a masked one) ends the connection; the
 * client reconnects instead of sitting on a connection that reads nothing. */
static void test_refused_framing_ends_the_connection(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  srv_t s;
  srv_start(&s, &loop, S_MASKED);
  app_t a;
  make_client(&a, &loop, &s);
  run_until(&loop, is_waiting, &a);
  assert_int_equal(a.welcomed, 1);
  assert_non_null(strstr(a.waiting_detail, "broke the WebSocket framing"));
  finish(&loop, &a, &s);
}

static void test_new_rejects_bad_options(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  cvg_options_t o;
  cvg_options_init(&o);
  const char *urls[] = {"ftp://x"};
  cvg_sub_t sub = {"c1", 0};
  o.urls = urls;
  o.nurls = 1;
  o.token = "t";
  o.subs = &sub;
  o.nsubs = 1;
  cvg_client_t *c = (cvg_client_t *)&o;
  char err[200] = "";
  assert_int_equal(cvg_client_new(&loop, &o, &c, err, sizeof err), CVG_EINVAL);
  assert_null(c);
  assert_non_null(strstr(err, "ws://"));
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrong_accept_fails_the_attempt),
      cmocka_unit_test(test_missing_subprotocol_fails_the_attempt),
      cmocka_unit_test(test_503_gives_retry_after_as_hint),
      cmocka_unit_test(test_scripted_session),
      cmocka_unit_test(test_close_completes_pending_sends),
      cmocka_unit_test(test_many_clients_share_one_loop),
      cmocka_unit_test(test_close_does_not_wait_for_a_stalled_server),
      cmocka_unit_test(test_refused_framing_ends_the_connection),
      cmocka_unit_test(test_new_rejects_bad_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
