/*
 * restc.c: the blocking REST calls of setup and checks, and the pipelined
 * append connections of the delivery phase (see bench/restc.h).
 */
#include "bench/restc.h"

#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/run.h"
#include "common/util.h"
#include "net/httpc.h"

#define RESTC_TIMEOUT_MS 10000 /* connect + send + receive of one blocking call */

/* ---- blocking calls (setup and checks; no loop running) --------------------------- */

/* One request through net/httpc on a fresh connection, bounded by 10 s in
 * all. Returns the HTTP status with the body in `out` (truncated to
 * out_cap - 1 bytes), or -1 with the reason in b->http_err. */
int restc_call(bench_t *b, const char *method, const char *path, const char *body,
               const char *extra_headers, char *out, size_t out_cap) {
  out[0] = '\0';
  char *headers = run_str_printf("Authorization: Bearer %s\r\n%s", b->api_key,
                                 extra_headers ? extra_headers : "");
  if (!headers) {
    snprintf(b->http_err, sizeof b->http_err, "out of memory");
    return -1;
  }
  httpc_request_t req = {.host = "127.0.0.1",
                         .port = b->port,
                         .method = method,
                         .path = path,
                         .headers = headers,
                         .body = body,
                         .timeout_ms = RESTC_TIMEOUT_MS,
                         .interrupted = &run_interrupted,
                         .tls = b->tls,
                         .tls_ca_file = b->tls ? b->tls_cert : NULL};
  httpc_response_t resp;
  int st = httpc_request(&req, &resp, b->http_err, sizeof b->http_err);
  free(headers);
  if (st < 0) return -1;
  size_t n = resp.body_len < out_cap - 1 ? resp.body_len : out_cap - 1;
  memcpy(out, resp.body, n);
  out[n] = '\0';
  httpc_response_free(&resp);
  return st;
}

/* A call that must answer `want`; otherwise fails the bench. */
int restc_expect(bench_t *b, const char *method, const char *path, const char *body,
                 const char *extra, int want, char *out, size_t cap) {
  char local[512];
  if (!out) {
    out = local;
    cap = sizeof local;
  }
  int st = restc_call(b, method, path, body, extra, out, cap);
  if (st == want) return 0;
  if (st < 0)
    run_fail(b, "%s %s: %s", method, path, b->http_err);
  else
    run_fail(b, "%s %s answered %d (want %d): %.300s", method, path, st, want, out);
  return -1;
}

/* One channel, RUN_CONVS conversations with RUN_SETUP_HEAD messages each, the
 * fan-out conversation (empty), and a token covering every conversation. */
int restc_setup(bench_t *b) {
  char path[96], body[256], extra[96], name[32];
  if (restc_expect(b, "POST", "/v1/channels", "{\"id\":\"bench\",\"name\":\"bench\"}", NULL, 201,
                   NULL, 0) != 0)
    return -1;
  for (int i = -1; i < RUN_CONVS; i++) {
    run_conv_name(i, name);
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"channel\":\"bench\"}", name);
    if (restc_expect(b, "POST", "/v1/conversations", body, NULL, 201, NULL, 0) != 0) return -1;
  }
  for (int i = 0; i < RUN_CONVS; i++)
    for (int k = 1; k <= RUN_SETUP_HEAD; k++) {
      run_conv_name(i, name);
      snprintf(path, sizeof path, "/v1/conversations/%s/messages", name);
      snprintf(extra, sizeof extra, "Idempotency-Key: setup-%d-%d\r\n", i, k);
      snprintf(body, sizeof body, "{\"sender\":\"bench\",\"body\":{\"text\":\"setup %d\"}}", k);
      if (restc_expect(b, "POST", path, body, extra, 201, NULL, 0) != 0) return -1;
    }
  return (b->token = restc_token(b, "bench")) ? 0 : -1;
}

char *restc_token(bench_t *b, const char *sub) {
  char body[256], out[2048];
  snprintf(body, sizeof body, "{\"sub\":\"%s\",\"convs\":[\"*\"],\"ttlSeconds\":86400}", sub);
  if (restc_expect(b, "POST", "/v1/tokens", body, NULL, 201, out, sizeof out) != 0) return NULL;
  json_t *v = json_loads(out, 0, NULL);
  const char *t = json_string_value(json_object_get(v, "token"));
  char *token = t ? strdup(t) : NULL;
  json_decref(v);
  if (!token) run_fail(b, "POST /v1/tokens: no token in %.200s", out);
  return token;
}

/* ---- keep-alive connections ------------------------------------------------------ */

static int on_begin(llhttp_t *p) {
  ((restc_t *)p->data)->blen = 0;
  return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len) {
  restc_t *r = p->data;
  size_t room = sizeof r->body - 1 - r->blen;
  if (len > room) len = room;
  memcpy(r->body + r->blen, at, len);
  r->blen += len;
  r->body[r->blen] = '\0';
  return 0;
}

static int on_complete(llhttp_t *p) {
  restc_t *r = p->data;
  r->body[r->blen] = '\0';
  r->on_answer(r, llhttp_get_status_code(p));
  return 0;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  restc_t *r = container_of((uv_tcp_t *)h, restc_t, tcp);
  buf->base = r->b->read_buf;
  buf->len = sizeof r->b->read_buf;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  restc_t *r = container_of((uv_tcp_t *)s, restc_t, tcp);
  bench_t *b = r->b;
  if (nread == 0) return;
  if (nread < 0) {
    uv_read_stop(s);
    if (!b->closing)
      run_fail(b, "%s: REST connection %zu: %s", b->phase, r->index,
               nread == UV_EOF ? "closed by the node" : uv_strerror((int)nread));
    return;
  }
  llhttp_errno_t e = llhttp_execute(&r->parser, buf->base, (size_t)nread);
  if (e != HPE_OK)
    run_fail(b, "%s: bad REST answer: %s", b->phase, llhttp_get_error_reason(&r->parser));
}

static void connect_cb(uv_connect_t *req, int status) {
  restc_t *r = container_of(req, restc_t, creq);
  bench_t *b = r->b;
  if (status == UV_ECANCELED || b->closing) return;
  int e = status < 0 ? status : uv_read_start((uv_stream_t *)&r->tcp, alloc_cb, read_cb);
  if (e != 0) {
    run_fail(b, "%s: REST connection %zu: %s", b->phase, r->index, uv_strerror(e));
    return;
  }
  r->on_connected(r);
}

int restc_open(bench_t *b, restc_t *r, size_t index, restc_connected_cb on_connected,
               restc_answer_cb on_answer) {
  static llhttp_settings_t settings;
  static int settings_ready;
  if (!settings_ready) {
    llhttp_settings_init(&settings);
    settings.on_message_begin = on_begin;
    settings.on_body = on_body;
    settings.on_message_complete = on_complete;
    settings_ready = 1;
  }
  r->b = b;
  r->index = index;
  r->on_connected = on_connected;
  r->on_answer = on_answer;
  r->blen = 0;
  r->body[0] = '\0';
  llhttp_init(&r->parser, HTTP_RESPONSE, &settings);
  r->parser.data = r;
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", b->port, &addr);
  int e = uv_tcp_init(&b->loop, &r->tcp);
  if (e == 0) {
    r->handle = 1;
    b->handles++;
    uv_tcp_nodelay(&r->tcp, 1);
    e = uv_tcp_connect(&r->creq, &r->tcp, (const struct sockaddr *)&addr, connect_cb);
  }
  if (e != 0) {
    run_fail(b, "REST connection: %s", uv_strerror(e));
    return -1;
  }
  return 0;
}

static void close_cb(uv_handle_t *h) {
  restc_t *r = container_of((uv_tcp_t *)h, restc_t, tcp);
  r->b->handles--;
}

int restc_close(restc_t *r) {
  if (!r->handle) return 0;
  r->handle = 0;
  if (uv_tcp_close_reset(&r->tcp, close_cb) != 0) uv_close((uv_handle_t *)&r->tcp, close_cb);
  return 1;
}

/* ---- the appenders of baseline's delivery phase ------------------------------------ */

static void delivery_connected(restc_t *r) {
  r->b->rest_connected++;
  run_maybe_done(r->b);
}

static void delivery_answer(restc_t *r, int status) {
  bench_t *b = r->b;
  if (status != 201) {
    run_fail(b, "%s: an append answered %d: %s", b->phase, status, r->body);
    return;
  }
  if (++b->rest_answers == b->want_rest_answers) b->rest_done_ns = run_now_ns();
  run_maybe_done(b);
}

int restc_begin(bench_t *b) {
  if (!(b->rest = calloc((size_t)b->rest_conns, sizeof *b->rest))) {
    run_fail(b, "out of memory");
    return -1;
  }
  for (int i = 0; i < b->rest_conns; i++)
    if (restc_open(b, &b->rest[i], (size_t)i, delivery_connected, delivery_answer) != 0) return -1;
  return 0;
}

void restc_end(bench_t *b) {
  b->closing = 1;
  size_t left = b->handles;
  for (int i = 0; b->rest && i < b->rest_conns; i++) left -= (size_t)restc_close(&b->rest[i]);
  run_drain_closes(b, left);
  free(b->rest);
  b->rest = NULL;
  b->closing = 0;
}
