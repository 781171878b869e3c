/* Unit tests for net/ws: RFC 6455 accept key, upgrade checks, frame bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "net/ws.h"

/* RFC 6455 section 1.3: the sample nonce and its accept value. */
static void test_accept_key_rfc_sample(void **state) {
  char out[29];
  ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out);
  assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

static http_request_t good_request(void) {
  http_request_t r;
  memset(&r, 0, sizeof r);
  r.method = 1; /* GET */
  r.http_major = r.http_minor = 1;
  r.upgrade = "websocket";
  r.connection = "keep-alive, Upgrade";
  r.ws_key = "dGhlIHNhbXBsZSBub25jZQ==";
  r.ws_version = "13";
  return r;
}

static void test_upgrade_checks(void **state) {
  const char *why;
  http_request_t r = good_request();
  assert_int_equal(ws_check_upgrade(&r, &why), 0);

  r.ws_protocol = "chat, converger.v1";
  assert_int_equal(ws_check_upgrade(&r, &why), 0);
  r.ws_protocol = "chat, converger.v2";
  assert_int_equal(ws_check_upgrade(&r, &why), 400);

  r = good_request();
  r.ws_key = NULL;
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r.ws_key = "short";
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r.ws_key = "dGhlIHNhbXBsZSBub25jZQ=A"; /* 24 chars, not 16 bytes */
  assert_int_equal(ws_check_upgrade(&r, &why), 400);

  r = good_request();
  r.ws_version = "8";
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r.ws_version = NULL;
  assert_int_equal(ws_check_upgrade(&r, &why), 400);

  r = good_request();
  r.upgrade = "h2c";
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r = good_request();
  r.connection = "keep-alive";
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r = good_request();
  r.method = 3; /* POST */
  assert_int_equal(ws_check_upgrade(&r, &why), 405);

  /* RFC 6455 section 4.1: HTTP/1.1 or later */
  r = good_request();
  r.http_minor = 0;
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r.http_major = 0;
  r.http_minor = 9;
  assert_int_equal(ws_check_upgrade(&r, &why), 400);
  r.http_major = 2;
  r.http_minor = 0;
  assert_int_equal(ws_check_upgrade(&r, &why), 0);
}

/* Server frames are unmasked: 0x81, then the 7-bit, 16-bit or 64-bit length. */
static void test_encode_text_frames(void **state) {
  net_t net; /* only its encoder is used */
  memset(&net, 0, sizeof net);
  size_t len;
  char *f = ws_encode_text(&net, "hello", 5, &len);
  assert_non_null(f);
  assert_int_equal(len, 7);
  assert_memory_equal(f, "\x81\x05hello", 7);
  free(f);

  char big[300];
  memset(big, 'x', sizeof big);
  f = ws_encode_text(&net, big, sizeof big, &len);
  assert_int_equal(len, 4 + sizeof big);
  assert_memory_equal(f, "\x81\x7e\x01\x2c", 4);
  assert_memory_equal(f + 4, big, sizeof big);
  free(f);

  size_t n = 70000;
  char *huge = malloc(n);
  memset(huge, 'y', n);
  f = ws_encode_text(&net, huge, n, &len);
  assert_int_equal(len, 10 + n);
  assert_memory_equal(f, "\x81\x7f\x00\x00\x00\x00\x00\x01\x11\x70", 10);
  free(f);
  free(huge);

  f = ws_encode_text(&net, "", 0, &len);
  assert_int_equal(len, 2);
  assert_memory_equal(f, "\x81\x00", 2);
  free(f);
  conn_net_free(&net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accept_key_rfc_sample),
      cmocka_unit_test(test_upgrade_checks),
      cmocka_unit_test(test_encode_text_frames),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
