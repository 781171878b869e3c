/*
 * test_urlauth: the authority parser shared by the node's HTTP client and
 * the client library (common/urlauth.h), directly and through
 * httpc_parse_url, so that both keep accepting and refusing the same
 * hosts and ports.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "common/urlauth.h"
#include "net/httpc.h"
#include "wsurl.h" /* the client library's, internal */

static int parse(const char *auth, urlauth_t *out, char *err, size_t errlen) {
  return urlauth_parse(auth, auth, strlen(auth), out, err, errlen);
}

static void test_good(void **state) {
  (void)state;
  struct {
    const char *auth, *host;
    int port;
  } good[] = {
      {"example.com", "example.com", 0},
      {"a-b_c.example:8080", "a-b_c.example", 8080},
      {"127.0.0.1:1", "127.0.0.1", 1},
      {"h:65535", "h", 65535},
      {"[::1]", "::1", 0},
      {"[fe80::1]:9090", "fe80::1", 9090},
      {"[2001:db8::7]:443", "2001:db8::7", 443},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    urlauth_t a;
    char err[256] = "";
    if (parse(good[i].auth, &a, err, sizeof err) != 0)
      fail_msg("\"%s\": refused: %s", good[i].auth, err);
    assert_string_equal(a.host, good[i].host);
    assert_int_equal(a.port, good[i].port);

    /* httpc_parse_url sees the same authority, with its default port */
    char url[300];
    snprintf(url, sizeof url, "http://%s/p", good[i].auth);
    httpc_url_t u;
    assert_int_equal(httpc_parse_url(url, &u, err, sizeof err), 0);
    assert_string_equal(u.host, good[i].host);
    assert_int_equal(u.port, good[i].port ? good[i].port : 80);

    /* and the client library's wsurl_parse, with its default ports */
    for (int tls = 0; tls <= 1; tls++) {
      snprintf(url, sizeof url, "%s://%s/v1/ws", tls ? "wss" : "ws", good[i].auth);
      wsurl_t w;
      if (!wsurl_parse(url, &w, err, sizeof err)) fail_msg("\"%s\": refused: %s", url, err);
      assert_string_equal(w.host, good[i].host);
      char port[8];
      snprintf(port, sizeof port, "%d", good[i].port ? good[i].port : tls ? 443 : 80);
      assert_string_equal(w.port, port);
      assert_int_equal(w.tls, tls);
    }
  }
}

static void test_bad(void **state) {
  (void)state;
  char long_host[300];
  memset(long_host, 'a', sizeof long_host - 1);
  long_host[sizeof long_host - 1] = '\0';
  struct {
    const char *auth, *why;
  } bad[] = {
      {"", "no host"},
      {":80", "no host"},
      {"user@h", "user info"},
      {"u:p@h:80", "user info"},
      {"h:", "empty port"},
      {"h:0", "want 1..65535"},
      {"h:65536", "want 1..65535"},
      {"h:99999999999999999999", "want 1..65535"},
      {"h:-1", "want 1..65535"},
      {"h:80x", "want 1..65535"},
      {"::1:80", "brackets"},
      {"[::1:80", "unterminated IPv6"},
      {"[]:80", "bad IPv6"},
      {"[zz::1]:80", "bad IPv6"},
      {"[::1]x:80", "after the host"},
      {"h!:80", "bad character '!'"},
      {long_host, "too long"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    urlauth_t a;
    char err[512] = "";
    if (parse(bad[i].auth, &a, err, sizeof err) != -EINVAL)
      fail_msg("\"%.40s\": accepted", bad[i].auth);
    if (!strstr(err, bad[i].why))
      fail_msg("\"%.40s\": reason \"%s\" lacks \"%s\"", bad[i].auth, err, bad[i].why);
    assert_int_equal(parse(bad[i].auth, &a, NULL, 0), -EINVAL); /* no reason wanted */

    /* both callers refuse it too, with the same reason */
    char url[400];
    httpc_url_t u;
    snprintf(url, sizeof url, "http://%s/p", bad[i].auth);
    assert_int_equal(httpc_parse_url(url, &u, err, sizeof err), -EINVAL);
    if (!strstr(err, bad[i].why)) fail_msg("httpc \"%.40s\": \"%s\"", url, err);
    snprintf(url, sizeof url, "ws://%s/v1/ws", bad[i].auth);
    assert_false(wsurl_parse(url, NULL, err, sizeof err));
    if (!strstr(err, bad[i].why)) fail_msg("wsurl \"%.40s\": \"%s\"", url, err);
  }
}

/* The scheme of a WebSocket URL, in any case (RFC 3986 section 3.1): the
 * one wss test of the node (gate/drain.c, the configuration) and the
 * client library (wsurl.c), which agree with it. */
static void test_ws_scheme(void **state) {
  (void)state;
  struct {
    const char *url;
    size_t len; /* of the ws:// or wss:// prefix; 0: not a WebSocket URL */
    int tls;
    const char *port; /* wsurl_parse's; NULL: it refuses the URL */
  } cases[] = {
      {"wss://h/v1/ws", 6, 1, "443"},
      {"WSS://h/v1/ws", 6, 1, "443"},
      {"Wss://h/v1/ws", 6, 1, "443"},
      {"wSs://h:8443/v1/ws", 6, 1, "8443"},
      {"ws://h/v1/ws", 5, 0, "80"},
      {"WS://h/v1/ws", 5, 0, "80"},
      {"wS://[::1]/v1/ws", 5, 0, "80"},
      {"wss://", 6, 1, NULL}, /* the prefix only: the authority is urlauth_parse's */
      {"https://h/v1/ws", 0, 0, NULL},
      {"HTTPS://h/v1/ws", 0, 0, NULL},
      {"http://h/v1/ws", 0, 0, NULL},
      {"wss:/h/v1/ws", 0, 0, NULL},
      {"wss:h", 0, 0, NULL},
      {"wsss://h", 0, 0, NULL},
      {" wss://h", 0, 0, NULL},
      {"/v1/ws", 0, 0, NULL},
      {"h/v1/ws", 0, 0, NULL},
      {"wss", 0, 0, NULL},
      {"", 0, 0, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *u = cases[i].url;
    int tls = -1;
    size_t n = urlauth_ws_scheme(u, &tls);
    if (n != cases[i].len || tls != cases[i].tls)
      fail_msg("\"%s\": %zu tls %d, want %zu tls %d", u, n, tls, cases[i].len, cases[i].tls);
    assert_int_equal(urlauth_ws_scheme(u, NULL), cases[i].len);
    /* the client library reads it the same way */
    assert_int_equal(wsurl_tls(u), cases[i].tls);
    wsurl_t w;
    char err[256] = "";
    int ok = wsurl_parse(u, &w, err, sizeof err);
    if (ok != (cases[i].port != NULL)) fail_msg("wsurl \"%s\": %d (%s)", u, ok, err);
    if (ok) {
      assert_int_equal(w.tls, cases[i].tls);
      assert_string_equal(w.port, cases[i].port);
    } else if (!cases[i].len) {
      assert_non_null(strstr(err, "must start with ws:// or wss://"));
    }
  }
  int tls = -1;
  assert_int_equal(urlauth_ws_scheme(NULL, &tls), 0);
  assert_int_equal(tls, 0);
  assert_int_equal(wsurl_tls(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good),
      cmocka_unit_test(test_bad),
      cmocka_unit_test(test_ws_scheme),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
