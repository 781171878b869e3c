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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good),
      cmocka_unit_test(test_bad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
