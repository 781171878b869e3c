/* Unit tests for gate/auth: tokens (good, expired, bad signature, alg none,
 * other algorithms, missing claims), API key, revocation cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "gate/auth.h"
#include "core/errors.h"

#define SECRET "unit-test-secret-of-at-least-32-bytes"
#define NOW    1800000000LL

static void b64url(const unsigned char *in, size_t n, char *out) {
  int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
  for (int i = 0; i < len; i++) {
    if (out[i] == '+')
      out[i] = '-';
    else if (out[i] == '/')
      out[i] = '_';
  }
  while (len > 0 && out[len - 1] == '=') len--;
  out[len] = '\0';
}

/* Build a JWT by hand so tests can forge what libjwt would refuse to make. */
static char *forge(const char *header, const char *claims, const EVP_MD *md, const char *secret) {
  char h[512], c[1024], sig[256];
  b64url((const unsigned char *)header, strlen(header), h);
  b64url((const unsigned char *)claims, strlen(claims), c);
  size_t n = strlen(h) + strlen(c) + 2;
  char *signing = malloc(n);
  snprintf(signing, n, "%s.%s", h, c);
  sig[0] = '\0';
  if (md) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int maclen;
    HMAC(md, secret, (int)strlen(secret), (unsigned char *)signing, strlen(signing), mac, &maclen);
    b64url(mac, maclen, sig);
  }
  char *tok = malloc(n + strlen(sig) + 2);
  sprintf(tok, "%s.%s", signing, sig);
  free(signing);
  return tok;
}

static auth_t *a;

static int setup(void **state) {
  a = auth_new("the-api-key", SECRET);
  return a ? 0 : -1;
}

static int teardown(void **state) {
  auth_free(a);
  return 0;
}

static void test_sign_then_verify(void **state) {
  json_t *convs = json_pack("[s, s]", "room1", "room2");
  char *tok, jti[37];
  int64_t exp;
  assert_int_equal(auth_sign(a, "alice", convs, NOW, 60, &tok, jti, &exp), 0);
  assert_int_equal(exp, NOW + 60);
  auth_token_t t;
  const char *why = NULL;
  assert_int_equal(auth_verify(a, tok, NOW + 59, &t, &why), 0);
  assert_string_equal(t.sub, "alice");
  assert_string_equal(t.jti, jti);
  assert_true(auth_token_allows(&t, "room1"));
  assert_true(auth_token_allows(&t, "room2"));
  assert_false(auth_token_allows(&t, "room3"));
  assert_true(t.can_read && t.can_write);
  auth_token_clear(&t);
  /* Expired: exp is the first second it is no longer valid. */
  assert_int_equal(auth_verify(a, tok, NOW + 60, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token expired");
  free(tok);
  json_decref(convs);
}

static void test_wildcard_and_scope(void **state) {
  char claims[256];
  snprintf(claims, sizeof claims,
           "{\"sub\":\"u1\",\"convs\":[\"*\"],\"exp\":%lld,\"jti\":\"j1\",\"scope\":[\"read\"]}",
           NOW + 100);
  char *tok = forge("{\"alg\":\"HS256\",\"typ\":\"JWT\"}", claims, EVP_sha256(), SECRET);
  auth_token_t t;
  const char *why;
  assert_int_equal(auth_verify(a, tok, NOW, &t, &why), 0);
  assert_true(auth_token_allows(&t, "anything"));
  assert_true(t.can_read);
  assert_false(t.can_write);
  auth_token_clear(&t);
  free(tok);
}

static void test_bad_signature(void **state) {
  char claims[128];
  snprintf(claims, sizeof claims, "{\"sub\":\"u\",\"convs\":[\"c\"],\"exp\":%lld}", NOW + 100);
  char *tok =
      forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), "another-secret-of-at-least-32-bytes");
  auth_token_t t;
  const char *why;
  assert_int_equal(auth_verify(a, tok, NOW, &t, &why), -CV_EUNAUTHORIZED);
  free(tok);
  /* A flipped byte in the payload of a good token. */
  json_t *convs = json_pack("[s]", "c");
  char *good, jti[37];
  int64_t exp;
  assert_int_equal(auth_sign(a, "u", convs, NOW, 60, &good, jti, &exp), 0);
  char *dot = strchr(good, '.');
  dot[3] = dot[3] == 'A' ? 'B' : 'A';
  assert_int_equal(auth_verify(a, good, NOW, &t, &why), -CV_EUNAUTHORIZED);
  free(good);
  json_decref(convs);
}

static void test_alg_none_and_others_refused(void **state) {
  char claims[128];
  snprintf(claims, sizeof claims, "{\"sub\":\"u\",\"convs\":[\"c\"],\"exp\":%lld}", NOW + 100);
  auth_token_t t;
  const char *why;
  char *none = forge("{\"alg\":\"none\"}", claims, NULL, SECRET);
  assert_int_equal(auth_verify(a, none, NOW, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token alg must be HS256");
  free(none);
  char *none_signed = forge("{\"alg\":\"none\"}", claims, EVP_sha256(), SECRET);
  assert_int_equal(auth_verify(a, none_signed, NOW, &t, &why), -CV_EUNAUTHORIZED);
  free(none_signed);
  char *hs384 = forge("{\"alg\":\"HS384\"}", claims, EVP_sha384(), SECRET);
  assert_int_equal(auth_verify(a, hs384, NOW, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token alg must be HS256");
  free(hs384);
  char *hs512 = forge("{\"alg\":\"HS512\"}", claims, EVP_sha512(), SECRET);
  assert_int_equal(auth_verify(a, hs512, NOW, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token alg must be HS256");
  free(hs512);
  char *no_alg = forge("{\"typ\":\"JWT\"}", claims, EVP_sha256(), SECRET);
  assert_int_equal(auth_verify(a, no_alg, NOW, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token alg must be HS256");
  free(no_alg);
}

/* Text that is not a JWT at all is told apart from a JWT with the wrong alg. */
static void test_not_a_jwt(void **state) {
  char claims[128];
  snprintf(claims, sizeof claims, "{\"sub\":\"u\",\"convs\":[\"c\"],\"exp\":%lld}", NOW + 100);
  auth_token_t t;
  const char *why;
  char *good = forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), SECRET);
  char *header_not_object = forge("\"HS256\"", claims, EVP_sha256(), SECRET);
  char *claims_not_json = forge("{\"alg\":\"HS256\"}", "not json", EVP_sha256(), SECRET);
  char *claims_not_object = forge("{\"alg\":\"HS256\"}", "[1]", EVP_sha256(), SECRET);
  char four_parts[1024], bad_char[1024], bad_sig_char[1024];
  snprintf(four_parts, sizeof four_parts, "%s.e30", good);
  snprintf(bad_sig_char, sizeof bad_sig_char, "%s*", good);
  snprintf(bad_char, sizeof bad_char, "%s", good);
  bad_char[3] = '+'; /* base64, not base64url */
  const char *not_jwts[] = {
      "abc",      "",       "not-a-token",     "a.b.c",         "not.a.jwt",       "abc.def.ghi",
      "..",       ".e30.",  "e30..",           "e30.e30", /* two parts */
      four_parts, bad_char, header_not_object, claims_not_json, claims_not_object, bad_sig_char,
  };
  for (size_t i = 0; i < sizeof not_jwts / sizeof not_jwts[0]; i++) {
    why = NULL;
    assert_int_equal(auth_verify(a, not_jwts[i], NOW, &t, &why), -CV_EUNAUTHORIZED);
    if (!why || strcmp(why, "token is not a valid JWT") != 0)
      fail_msg("\"%s\": %s", not_jwts[i], why ? why : "(no reason)");
  }
  /* {} as the header: a JWT, without an alg */
  assert_int_equal(auth_verify(a, "e30.e30.", NOW, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token alg must be HS256");
  assert_int_equal(auth_verify(a, good, NOW, &t, &why), -CV_EUNAUTHORIZED); /* no jti */
  assert_string_equal(why, "token jti must be a string of 1 to 128 bytes");
  free(good);
  free(header_not_object);
  free(claims_not_json);
  free(claims_not_object);
}

static void test_missing_claims(void **state) {
  auth_token_t t;
  const char *why;
  char *no_exp =
      forge("{\"alg\":\"HS256\"}", "{\"sub\":\"u\",\"convs\":[\"c\"]}", EVP_sha256(), SECRET);
  assert_int_equal(auth_verify(a, no_exp, NOW, &t, &why), -CV_EUNAUTHORIZED);
  assert_string_equal(why, "token has no exp");
  free(no_exp);
  char claims[128];
  snprintf(claims, sizeof claims, "{\"sub\":\"u\",\"exp\":%lld}", NOW + 100);
  char *no_convs = forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), SECRET);
  assert_int_equal(auth_verify(a, no_convs, NOW, &t, &why), -CV_EUNAUTHORIZED);
  free(no_convs);
  snprintf(claims, sizeof claims, "{\"sub\":\"bad sub\",\"convs\":[\"c\"],\"exp\":%lld}",
           NOW + 100);
  char *bad_sub = forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), SECRET);
  assert_int_equal(auth_verify(a, bad_sub, NOW, &t, &why), -CV_EUNAUTHORIZED);
  free(bad_sub);
  /* jti is required: a token without one could never be revoked */
  const char *bad_jti[] = {"", ",\"jti\":\"\"", ",\"jti\":7"};
  for (size_t i = 0; i < sizeof bad_jti / sizeof bad_jti[0]; i++) {
    snprintf(claims, sizeof claims, "{\"sub\":\"u\",\"convs\":[\"c\"],\"exp\":%lld%s}", NOW + 100,
             bad_jti[i]);
    char *tok = forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), SECRET);
    assert_int_equal(auth_verify(a, tok, NOW, &t, &why), -CV_EUNAUTHORIZED);
    assert_string_equal(why, "token jti must be a string of 1 to 128 bytes");
    free(tok);
  }
}

static void test_api_key(void **state) {
  assert_int_equal(auth_check_api_key(a, "Bearer the-api-key"), 0);
  assert_int_equal(auth_check_api_key(a, "Bearer the-api-kex"), -CV_EUNAUTHORIZED);
  assert_int_equal(auth_check_api_key(a, "Bearer the-api-key2"), -CV_EUNAUTHORIZED);
  assert_int_equal(auth_check_api_key(a, "the-api-key"), -CV_EUNAUTHORIZED);
  assert_int_equal(auth_check_api_key(a, NULL), -CV_EUNAUTHORIZED);
}

static void test_revocation_cache(void **state) {
  assert_false(auth_is_revoked(a, "j1"));
  auth_add_revoked(a, "j1");
  auth_add_revoked(a, "j1");
  assert_true(auth_is_revoked(a, "j1"));
  char *list[] = {"j2", "j3"};
  auth_set_revoked(a, list, 2);
  assert_false(auth_is_revoked(a, "j1"));
  assert_true(auth_is_revoked(a, "j2"));
  assert_true(auth_is_revoked(a, "j3"));
  assert_false(auth_is_revoked(a, ""));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sign_then_verify), cmocka_unit_test(test_wildcard_and_scope),
      cmocka_unit_test(test_bad_signature),    cmocka_unit_test(test_alg_none_and_others_refused),
      cmocka_unit_test(test_missing_claims),   cmocka_unit_test(test_api_key),
      cmocka_unit_test(test_revocation_cache), cmocka_unit_test(test_not_a_jwt),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
