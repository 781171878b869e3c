/* Unit tests for net/httpc: the URL parser (good and bad URLs), and
 * requests against a scripted loopback server: the request bytes, answers
 * fed in chosen pieces (interim 1xx, chunked, Retry-After), and the failure
 * paths (refused, early close, bad answer, oversized body, deadline). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "net/httpc.h"

/* ---- URLs ------------------------------------------------------------------------- */

static void expect_url(const char *url, const char *host, int port, const char *prefix) {
  httpc_url_t u;
  char err[256] = "";
  int r = httpc_parse_url(url, &u, err, sizeof err);
  if (r != 0) fail_msg("\"%s\" refused: %s", url, err);
  assert_string_equal(u.host, host);
  assert_int_equal(u.port, port);
  assert_string_equal(u.prefix, prefix);
  assert_int_equal(u.tls, strncasecmp(url, "https", 5) == 0);
}

static void test_url_good(void **state) {
  expect_url("http://127.0.0.1:8080", "127.0.0.1", 8080, "");
  expect_url("http://127.0.0.1:8080/", "127.0.0.1", 8080, "");
  expect_url("http://localhost:1", "localhost", 1, "");
  expect_url("http://node-1.example.com:65535/api/", "node-1.example.com", 65535, "/api");
  expect_url("HTTP://Example.COM:80/a/b//", "Example.COM", 80, "/a/b");
  expect_url("http://example.com", "example.com", 80, "");
  expect_url("http://example.com/gw", "example.com", 80, "/gw");
  expect_url("http://[::1]:9000", "::1", 9000, "");
  expect_url("http://[2001:db8::7]:8080/converger", "2001:db8::7", 8080, "/converger");
  expect_url("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1", 80, "");
  expect_url("http://h:0080/%7Euser/x:y@z", "h", 80, "/%7Euser/x:y@z");
  expect_url("https://example.com", "example.com", 443, "");
  expect_url("HTTPS://[::1]:8443/gw/", "::1", 8443, "/gw");
}

/* Refused with -EINVAL and a message containing `want` (NULL: any). */
static void expect_bad(const char *url, const char *want) {
  httpc_url_t u;
  char err[256] = "";
  int r = httpc_parse_url(url, &u, err, sizeof err);
  if (r != -EINVAL) fail_msg("\"%s\": want -EINVAL, got %d", url ? url : "(null)", r);
  assert_true(err[0] != '\0');
  assert_null(strchr(err, '\n'));
  if (want && !strstr(err, want)) fail_msg("\"%s\": message \"%s\" lacks \"%s\"", url, err, want);
}

static void test_url_bad(void **state) {
  expect_bad(NULL, "empty");
  expect_bad("", "empty");
  expect_bad("httpss://example.com:443", "scheme");
  expect_bad("https://user@example.com", "user info");
  expect_bad("ws://127.0.0.1:8080/v1/ws", "scheme");
  expect_bad("ftp://h:21", "scheme");
  expect_bad("127.0.0.1:8080", "http://");
  expect_bad("http:/h:80", "http://");
  expect_bad("http://", "no host");
  expect_bad("http://:8080", "no host");
  expect_bad("http:///path", "no host");
  expect_bad("http://h:", "empty port");
  expect_bad("http://h:0", "port");
  expect_bad("http://h:65536", "port");
  expect_bad("http://h:99999999999999999999", "port");
  expect_bad("http://h:-1", "port");
  expect_bad("http://h:80x", "port");
  expect_bad("http://user:pw@h:80", "user info");
  expect_bad("http://h:80?x=1", "query");
  expect_bad("http://h:80/p?x=1", "query");
  expect_bad("http://h:80#frag", "fragment");
  expect_bad("http://h:80/p#frag", "fragment");
  expect_bad("http://::1:80", "brackets");
  expect_bad("http://[::1:80", "IPv6");
  expect_bad("http://[]:80", "IPv6");
  expect_bad("http://[zz::1]:80", "IPv6");
  expect_bad("http://[::1]x:80", "after the host");
  expect_bad("http://h_1 :80", "space");
  expect_bad("http://h:80/a b", "space");
  expect_bad("http://h:80/a\r\nX: y", "control");
  expect_bad("http://h\xc3\xa9:80", "non-ASCII");
  expect_bad("http://h!:80", "host");
  expect_bad("http://h:80/a\"b", "path");
  char long_host[300];
  memset(long_host, 'a', sizeof long_host);
  memcpy(long_host, "http://", 7);
  long_host[sizeof long_host - 1] = '\0';
  expect_bad(long_host, "too long");
}

/* ---- a scripted loopback server ---------------------------------------------------- */

typedef struct {
  int lfd, port;
  const char *pieces[8]; /* written in order, a few ms apart, after the request */
  int no_answer_ms;      /* instead: hold the connection silent this long */
  char req[8192];        /* the request as received */
  size_t req_len;
  pthread_t th;
} srv_t;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Read one request: the header block, then Content-Length bytes. */
static void srv_read_request(srv_t *s, int fd) {
  for (;;) {
    ssize_t k = recv(fd, s->req + s->req_len, sizeof s->req - 1 - s->req_len, 0);
    if (k <= 0) return;
    s->req_len += (size_t)k;
    s->req[s->req_len] = '\0';
    char *end = strstr(s->req, "\r\n\r\n");
    if (!end) continue;
    const char *cl = strstr(s->req, "Content-Length: ");
    size_t want = cl ? strtoul(cl + 16, NULL, 10) : 0;
    if (s->req_len >= (size_t)(end + 4 - s->req) + want) return;
  }
}

static void *srv_main(void *arg) {
  srv_t *s = arg;
  int fd = accept(s->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  srv_read_request(s, fd);
  if (s->no_answer_ms) sleep_ms(s->no_answer_ms);
  for (int i = 0; i < 8 && s->pieces[i]; i++) {
    if (i) sleep_ms(5);
    send(fd, s->pieces[i], strlen(s->pieces[i]), MSG_NOSIGNAL);
  }
  close(fd);
  return NULL;
}

static void srv_start(srv_t *s) {
  s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(s->lfd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(s->lfd, 4), 0);
  socklen_t len = sizeof a;
  assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &len), 0);
  s->port = ntohs(a.sin_port);
  assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
}

static void srv_join(srv_t *s) {
  pthread_join(s->th, NULL);
  close(s->lfd);
}

static httpc_request_t post_to(int port) {
  return (httpc_request_t){.host = "127.0.0.1",
                           .port = port,
                           .method = "POST",
                           .path = "/v1/conversations/c1/messages",
                           .headers = "Authorization: Bearer k\r\nIdempotency-Key: m-1\r\n",
                           .body = "{\"sender\":\"u\",\"body\":1}",
                           .timeout_ms = 5000};
}

static void test_request_bytes_and_503(void **state) {
  srv_t s = {.pieces = {"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        "Retry-",
                        "After:  2 \r\nContent-Length: 17\r\n\r\n{\"error\":", "{\"x\":1}}"}};
  srv_start(&s);
  httpc_request_t req = post_to(s.port);
  httpc_response_t resp;
  char err[160];
  int st = httpc_request(&req, &resp, err, sizeof err);
  srv_join(&s);
  if (st < 0) fail_msg("%s", err);
  assert_int_equal(st, 503);
  assert_int_equal(resp.status, 503);
  assert_int_equal(resp.retry_after_s, 2);
  assert_string_equal(resp.body, "{\"error\":{\"x\":1}}");
  assert_int_equal(resp.body_len, 17);
  char want[512];
  snprintf(want, sizeof want,
           "POST /v1/conversations/c1/messages HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
           "Authorization: Bearer k\r\nIdempotency-Key: m-1\r\n"
           "Content-Type: application/json\r\nContent-Length: 23\r\nConnection: close\r\n\r\n"
           "{\"sender\":\"u\",\"body\":1}",
           s.port);
  assert_string_equal(s.req, want);
  httpc_response_free(&resp);
  assert_null(resp.body);
}

static void test_interim_and_chunked_answer(void **state) {
  srv_t s = {
      .pieces = {"HTTP/1.1 100 Continue\r\nRetry-After: 7\r\n\r\n", "HTTP/1.1 201 Created\r\n",
                 "Transfer-Encoding: chunked\r\nRetry-After: Fri, 31 Dec 1999 23:59:59 GMT\r\n"
                 "\r\n5\r\n{\"seq",
                 "\r\nd\r\n\":1,\"id\":\"a\"}\r\n0\r\n\r\n"}};
  srv_start(&s);
  httpc_request_t req = post_to(s.port);
  req.method = "GET";
  req.body = NULL;
  req.headers = NULL;
  httpc_response_t resp;
  char err[160];
  int st = httpc_request(&req, &resp, err, sizeof err);
  srv_join(&s);
  if (st < 0) fail_msg("%s", err);
  assert_int_equal(st, 201);
  assert_int_equal(resp.retry_after_s, -1); /* a date, and the 100's header does not count */
  assert_string_equal(resp.body, "{\"seq\":1,\"id\":\"a\"}");
  assert_non_null(strstr(s.req, "Content-Length: 0\r\n"));
  assert_null(strstr(s.req, "Content-Type"));
  httpc_response_free(&resp);
}

static void test_body_until_close_and_empty_body(void **state) {
  srv_t s = {.pieces = {"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of ", "it"}};
  srv_start(&s);
  httpc_request_t req = post_to(s.port);
  httpc_response_t resp;
  char err[160];
  int st = httpc_request(&req, &resp, err, sizeof err);
  srv_join(&s);
  if (st < 0) fail_msg("%s", err);
  assert_int_equal(st, 200);
  assert_string_equal(resp.body, "all of it");
  httpc_response_free(&resp);

  srv_t s2 = {.pieces = {"HTTP/1.1 204 No Content\r\n\r\n"}};
  srv_start(&s2);
  req = post_to(s2.port);
  st = httpc_request(&req, &resp, err, sizeof err);
  srv_join(&s2);
  assert_int_equal(st, 204);
  assert_non_null(resp.body); /* never NULL after success */
  assert_string_equal(resp.body, "");
  assert_int_equal(resp.body_len, 0);
  httpc_response_free(&resp);
}

/* A failure: the errno, a message containing `want`, no body left. */
static void expect_failure(srv_t *s, httpc_request_t *req, int want_e, const char *want) {
  if (s) srv_start(s);
  if (s) req->port = s->port;
  httpc_response_t resp;
  char err[160] = "";
  int st = httpc_request(req, &resp, err, sizeof err);
  if (s) srv_join(s);
  if (st != want_e) fail_msg("want %d, got %d (%s)", want_e, st, err);
  if (!strstr(err, want)) fail_msg("message \"%s\" lacks \"%s\"", err, want);
  assert_null(resp.body);
  assert_int_equal(resp.status, 0);
}

static void test_failures(void **state) {
  httpc_request_t req = post_to(0);
  srv_t early = {.pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"}};
  expect_failure(&early, &req, -EPIPE, "closed the connection");
  assert_true(httpc_retryable(-EPIPE));

  srv_t nothing = {.pieces = {NULL}};
  expect_failure(&nothing, &req, -EPIPE, "closed the connection");

  srv_t garbage = {.pieces = {"SSH-2.0-OpenSSH_9.2\r\n"}};
  expect_failure(&garbage, &req, -EPROTO, "bad HTTP answer");
  assert_false(httpc_retryable(-EPROTO));

  srv_t big = {.pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n0123456789", "0123456789"}};
  req.max_body = 10;
  expect_failure(&big, &req, -EMSGSIZE, "larger than 10 bytes");
  req.max_body = 0;

  srv_t silent = {.no_answer_ms = 600};
  req.timeout_ms = 150;
  uint64_t t0 = util_mono_ms();
  expect_failure(&silent, &req, -ETIMEDOUT, "within 150 ms");
  uint64_t took = util_mono_ms() - t0;
  assert_true(took >= 150 && took < 2000);
  assert_true(httpc_retryable(-ETIMEDOUT));
  req.timeout_ms = 5000;

  /* nothing listening: bind a port, then close it */
  srv_t gone = {0};
  gone.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(gone.lfd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(gone.lfd, (struct sockaddr *)&a, &len);
  close(gone.lfd);
  req.port = ntohs(a.sin_port);
  expect_failure(NULL, &req, -ECONNREFUSED, "Connection refused");
  assert_true(httpc_retryable(-ECONNREFUSED));
}

static void test_bad_request_fields(void **state) {
  httpc_request_t req = post_to(80);
  req.path = "/a b";
  expect_failure(NULL, &req, -EINVAL, "path");
  req = post_to(80);
  req.path = "no-slash";
  expect_failure(NULL, &req, -EINVAL, "path");
  req = post_to(80);
  req.method = "GET\r\nX:";
  expect_failure(NULL, &req, -EINVAL, "method");
  req = post_to(80);
  req.headers = "X-A: 1";
  expect_failure(NULL, &req, -EINVAL, "headers");
  req.headers = "X-A: 1\r\n\r\nGET / HTTP/1.1\r\n";
  expect_failure(NULL, &req, -EINVAL, "headers");
  req.headers = "X-A: 1\nX-B: 2\r\n";
  expect_failure(NULL, &req, -EINVAL, "headers");
  req = post_to(0);
  expect_failure(NULL, &req, -EINVAL, "port");
  req = post_to(80);
  req.timeout_ms = 0;
  expect_failure(NULL, &req, -EINVAL, "timeout");
  req = post_to(80);
  req.host = "";
  expect_failure(NULL, &req, -EINVAL, "host");
  assert_false(httpc_retryable(-EINVAL));
}

/* An IPv6 literal reaches a server on ::1 (a machine without IPv6 on its
 * loopback fails this test: Debian 12 has it by default). */
static void test_ipv6_literal(void **state) {
  int lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (lfd >= 0) close(lfd);
    fail_msg("no IPv6 loopback (::1) to listen on: this test needs one");
  }
  assert_int_equal(listen(lfd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(lfd, (struct sockaddr *)&a, &len);
  srv_t s = {.lfd = lfd,
             .port = ntohs(a.sin6_port),
             .pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}};
  assert_int_equal(pthread_create(&s.th, NULL, srv_main, &s), 0);
  httpc_request_t req = post_to(s.port);
  req.host = "::1";
  httpc_response_t resp;
  char err[160];
  int st = httpc_request(&req, &resp, err, sizeof err);
  srv_join(&s);
  if (st < 0) fail_msg("%s", err);
  assert_int_equal(st, 200);
  assert_string_equal(resp.body, "ok");
  char host[64];
  snprintf(host, sizeof host, "Host: [::1]:%d\r\n", s.port);
  assert_non_null(strstr(s.req, host));
  httpc_response_free(&resp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_url_good),
      cmocka_unit_test(test_url_bad),
      cmocka_unit_test(test_request_bytes_and_503),
      cmocka_unit_test(test_interim_and_chunked_answer),
      cmocka_unit_test(test_body_until_close_and_empty_body),
      cmocka_unit_test(test_failures),
      cmocka_unit_test(test_bad_request_fields),
      cmocka_unit_test(test_ipv6_literal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
