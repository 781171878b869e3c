/*
 * restc.c: the blocking REST calls of setup and checks, and the pipelined
 * append connections of the delivery phase (see bench/restc.h).
 */
#include "bench/restc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench/run.h"
#include "core/util.h"

/* ---- blocking HTTP client (setup and checks; no loop running) --------------------- */

typedef struct {
  int done;
  char *body;
  size_t len, cap;
} sync_resp_t;

static int sync_on_body(llhttp_t *p, const char *at, size_t len) {
  sync_resp_t *r = p->data;
  size_t room = r->cap > r->len + 1 ? r->cap - r->len - 1 : 0;
  size_t n = len < room ? len : room;
  memcpy(r->body + r->len, at, n);
  r->len += n;
  r->body[r->len] = '\0';
  return 0;
}

static int sync_on_complete(llhttp_t *p) {
  ((sync_resp_t *)p->data)->done = 1;
  return HPE_PAUSED;
}

/* One request on a fresh connection (Connection: close), bounded by 10 s.
 * Returns the HTTP status with the body in `out` (truncated to out_cap - 1
 * bytes), or -1 with the reason in b->http_err. */
int restc_call(bench_t *b, const char *method, const char *path, const char *body,
               const char *extra_headers, char *out, size_t out_cap) {
  static llhttp_settings_t settings;
  static int settings_ready;
  if (!settings_ready) {
    llhttp_settings_init(&settings);
    settings.on_body = sync_on_body;
    settings.on_message_complete = sync_on_complete;
    settings_ready = 1;
  }
  out[0] = '\0';
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(b->http_err, sizeof b->http_err, "socket: %s", strerror(errno));
    return -1;
  }
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)b->port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t blen = body ? strlen(body) : 0;
  char *req = NULL;
  int status = -1;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    snprintf(b->http_err, sizeof b->http_err, "connect: %s", strerror(errno));
    goto out;
  }
  req = run_str_printf("%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
                       "Content-Type: application/json\r\n%sContent-Length: %zu\r\n"
                       "Connection: close\r\n\r\n%s",
                       method, path, b->port, b->api_key, extra_headers ? extra_headers : "", blen,
                       body ? body : "");
  if (!req) {
    snprintf(b->http_err, sizeof b->http_err, "out of memory");
    goto out;
  }
  for (size_t off = 0, len = strlen(req); off < len;) {
    ssize_t k = send(fd, req + off, len - off, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR && !run_interrupted) continue;
    if (k <= 0) {
      snprintf(b->http_err, sizeof b->http_err, "send: %s", strerror(errno));
      goto out;
    }
    off += (size_t)k;
  }
  llhttp_t parser;
  llhttp_init(&parser, HTTP_RESPONSE, &settings);
  sync_resp_t resp = {0, out, 0, out_cap};
  parser.data = &resp;
  char buf[16384];
  while (!resp.done) {
    ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k < 0 && errno == EINTR && !run_interrupted) continue;
    if (k < 0) {
      snprintf(b->http_err, sizeof b->http_err, "recv: %s",
               errno == EAGAIN ? "no answer within 10 s" : strerror(errno));
      goto out;
    }
    if (k == 0) {
      snprintf(b->http_err, sizeof b->http_err, "the node closed the connection early");
      goto out;
    }
    llhttp_errno_t e = llhttp_execute(&parser, buf, (size_t)k);
    if (e != HPE_OK && e != HPE_PAUSED) {
      snprintf(b->http_err, sizeof b->http_err, "bad HTTP answer: %s",
               llhttp_get_error_reason(&parser));
      goto out;
    }
  }
  status = llhttp_get_status_code(&parser);
out:
  free(req);
  close(fd);
  return status;
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
  char path[96], body[256], extra[96], name[32], out[2048];
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
  if (restc_expect(b, "POST", "/v1/tokens",
                   "{\"sub\":\"bench\",\"convs\":[\"*\"],\"ttlSeconds\":86400}", NULL, 201, out,
                   sizeof out) != 0)
    return -1;
  json_t *v = json_loads(out, 0, NULL);
  const char *token = json_string_value(json_object_get(v, "token"));
  if (token) b->token = strdup(token);
  json_decref(v);
  if (!b->token) {
    run_fail(b, "POST /v1/tokens: no token in %.200s", out);
    return -1;
  }
  return 0;
}

/* ---- REST connections of the delivery phase -------------------------------------- */

static int rest_on_begin(llhttp_t *p) {
  ((restc_t *)p->data)->blen = 0;
  return 0;
}

static int rest_on_body(llhttp_t *p, const char *at, size_t len) {
  restc_t *r = p->data;
  size_t room = sizeof r->body - 1 - r->blen;
  size_t n = len < room ? len : room;
  memcpy(r->body + r->blen, at, n);
  r->blen += n;
  r->body[r->blen] = '\0';
  return 0;
}

static int rest_on_complete(llhttp_t *p) {
  restc_t *r = p->data;
  bench_t *b = r->b;
  int st = llhttp_get_status_code(p);
  if (st != 201) {
    r->body[r->blen] = '\0';
    run_fail(b, "%s: an append answered %d: %s", b->phase, st, r->body);
    return 0;
  }
  if (++b->rest_answers == b->want_rest_answers) b->rest_done_ns = run_now_ns();
  run_maybe_done(b);
  return 0;
}

static void rest_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  restc_t *r = container_of((uv_tcp_t *)h, restc_t, tcp);
  buf->base = r->b->read_buf;
  buf->len = sizeof r->b->read_buf;
}

static void rest_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  restc_t *r = container_of((uv_tcp_t *)s, restc_t, tcp);
  bench_t *b = r->b;
  if (nread == 0) return;
  if (nread < 0) {
    uv_read_stop(s);
    if (!b->closing)
      run_fail(b, "%s: REST connection: %s", b->phase,
               nread == UV_EOF ? "closed by the node" : uv_strerror((int)nread));
    return;
  }
  llhttp_errno_t e = llhttp_execute(&r->parser, buf->base, (size_t)nread);
  if (e != HPE_OK)
    run_fail(b, "%s: bad REST answer: %s", b->phase, llhttp_get_error_reason(&r->parser));
}

static void rest_connect_cb(uv_connect_t *req, int status) {
  restc_t *r = container_of(req, restc_t, creq);
  bench_t *b = r->b;
  if (status == UV_ECANCELED || b->closing) return;
  int e = status < 0 ? status : uv_read_start((uv_stream_t *)&r->tcp, rest_alloc_cb, rest_read_cb);
  if (e != 0) {
    run_fail(b, "%s: REST connection: %s", b->phase, uv_strerror(e));
    return;
  }
  b->rest_connected++;
  run_maybe_done(b);
}

int restc_begin(bench_t *b) {
  static llhttp_settings_t settings;
  static int settings_ready;
  if (!settings_ready) {
    llhttp_settings_init(&settings);
    settings.on_message_begin = rest_on_begin;
    settings.on_body = rest_on_body;
    settings.on_message_complete = rest_on_complete;
    settings_ready = 1;
  }
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", b->port, &addr);
  if (!(b->rest = calloc((size_t)b->rest_conns, sizeof *b->rest))) {
    run_fail(b, "out of memory");
    return -1;
  }
  for (int i = 0; i < b->rest_conns; i++) {
    restc_t *r = &b->rest[i];
    r->b = b;
    llhttp_init(&r->parser, HTTP_RESPONSE, &settings);
    r->parser.data = r;
    int e = uv_tcp_init(&b->loop, &r->tcp);
    if (e == 0) {
      r->handle = 1;
      b->handles++;
      e = uv_tcp_connect(&r->creq, &r->tcp, (const struct sockaddr *)&addr, rest_connect_cb);
    }
    if (e != 0) {
      run_fail(b, "REST connection: %s", uv_strerror(e));
      return -1;
    }
    uv_tcp_nodelay(&r->tcp, 1);
  }
  return 0;
}

static void rest_close_cb(uv_handle_t *h) {
  restc_t *r = container_of((uv_tcp_t *)h, restc_t, tcp);
  r->b->handles--;
}

void restc_end(bench_t *b) {
  b->closing = 1;
  size_t left = b->handles;
  for (int i = 0; b->rest && i < b->rest_conns; i++) {
    restc_t *r = &b->rest[i];
    if (!r->handle) continue;
    r->handle = 0;
    left--;
    if (uv_tcp_close_reset(&r->tcp, rest_close_cb) != 0)
      uv_close((uv_handle_t *)&r->tcp, rest_close_cb);
  }
  run_drain_closes(b, left);
  free(b->rest);
  b->rest = NULL;
  b->closing = 0;
}
