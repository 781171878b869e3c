/* Unit tests of the token public keys (src/gate/keys.c): a JWKS with RSA
 * and P-256 keys made here with OpenSSL, keys it must skip (another use, a
 * symmetric key, an alg its type does not sign, no kid), a PEM file whose
 * name is its kid, the errors that refuse a whole set (a missing or broken
 * file, a kid twice, nothing usable), keys_find without a kid, a stamp that
 * changes with the file, and base64url decoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "gate/keys.h"

static char dir[64];

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static void write_file(const char *name, const char *text) {
  char p[128];
  path_of(p, sizeof p, name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

/* base64url without padding of `n` bytes. */
static void b64u(const unsigned char *in, size_t n, char *out) {
  unsigned char tmp[1024];
  int len = EVP_EncodeBlock(tmp, in, (int)n);
  int k = 0;
  for (int i = 0; i < len; i++) {
    char c = (char)tmp[i];
    if (c == '=') break;
    out[k++] = c == '+' ? '-' : c == '/' ? '_' : c;
  }
  out[k] = '\0';
}

static void bn_b64u(EVP_PKEY *pkey, const char *param, char *out, int pad_to) {
  BIGNUM *bn = NULL;
  assert_int_equal(EVP_PKEY_get_bn_param(pkey, param, &bn), 1);
  unsigned char buf[600];
  int n = pad_to ? BN_bn2binpad(bn, buf, pad_to) : BN_bn2bin(bn, buf);
  b64u(buf, (size_t)n, out);
  BN_free(bn);
}

/* A JWKS entry for an RSA key, and one for a P-256 key. */
static void jwk_rsa(EVP_PKEY *k, const char *kid, const char *extra, char *out, size_t cap) {
  char n[700], e[16];
  bn_b64u(k, OSSL_PKEY_PARAM_RSA_N, n, 0);
  bn_b64u(k, OSSL_PKEY_PARAM_RSA_E, e, 0);
  snprintf(out, cap, "{\"kty\":\"RSA\",\"kid\":\"%s\",\"n\":\"%s\",\"e\":\"%s\"%s}", kid, n, e,
           extra);
}

static void jwk_ec(EVP_PKEY *k, const char *kid, char *out, size_t cap) {
  char x[64], y[64];
  bn_b64u(k, OSSL_PKEY_PARAM_EC_PUB_X, x, 32);
  bn_b64u(k, OSSL_PKEY_PARAM_EC_PUB_Y, y, 32);
  snprintf(out, cap, "{\"kty\":\"EC\",\"crv\":\"P-256\",\"kid\":\"%s\",\"x\":\"%s\",\"y\":\"%s\"}",
           kid, x, y);
}

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/converger-keys-XXXXXX");
  const char *tmp = getenv("TMPDIR");
  if (tmp && strlen(tmp) < 40) snprintf(dir, sizeof dir, "%s/converger-keys-XXXXXX", tmp);
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_jwks_and_pem(void **state) {
  EVP_PKEY *rsa = EVP_RSA_gen(2048), *ec = EVP_EC_gen("P-256"), *ec2 = EVP_EC_gen("P-256");
  assert_non_null(rsa);
  assert_non_null(ec);
  assert_non_null(ec2);
  static char r1[2048], r_enc[2048], r_alg[2048], e1[512], jwks[8192];
  jwk_rsa(rsa, "r1", ",\"alg\":\"RS256\",\"use\":\"sig\"", r1, sizeof r1);
  jwk_rsa(rsa, "r-enc", ",\"use\":\"enc\"", r_enc, sizeof r_enc);
  jwk_rsa(rsa, "r-es", ",\"alg\":\"ES256\"", r_alg, sizeof r_alg);
  jwk_ec(ec, "e1", e1, sizeof e1);
  snprintf(jwks, sizeof jwks,
           "{\"keys\":[%s,%s,%s,%s,{\"kty\":\"oct\",\"kid\":\"sym\",\"k\":\"c2VjcmV0\"},"
           "{\"kty\":\"EC\",\"crv\":\"P-256\"}]}",
           r1, r_enc, r_alg, e1);
  write_file("set.json", jwks);
  char pem_path[128], json_path[128], spec[300], err[512];
  path_of(pem_path, sizeof pem_path, "backend-2026.12.pem");
  FILE *f = fopen(pem_path, "w");
  assert_non_null(f);
  assert_int_equal(PEM_write_PUBKEY(f, ec2), 1);
  fclose(f);
  path_of(json_path, sizeof json_path, "set.json");
  snprintf(spec, sizeof spec, "%s,%s", json_path, pem_path);

  keys_t *k = NULL;
  assert_int_equal(keys_load(spec, &k, err, sizeof err), 0);
  assert_int_equal(k->n, 3); /* r1, e1, and the PEM's; the rest skipped */
  const token_key_t *a = keys_find(k, "r1"), *b = keys_find(k, "e1"),
                    *c = keys_find(k, "backend-2026.12");
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_int_equal(a->alg, KEY_RS256);
  assert_int_equal(b->alg, KEY_ES256);
  assert_int_equal(c->alg, KEY_ES256);
  assert_non_null(strstr(a->pem, "-----BEGIN PUBLIC KEY-----"));
  assert_null(keys_find(k, "r-enc"));
  assert_null(keys_find(k, "r-es"));
  assert_null(keys_find(k, "sym"));
  assert_null(keys_find(k, NULL)); /* three keys: a token must name one */
  assert_string_equal(keys_alg_name(KEY_ES256), "ES256");
  uint64_t stamp = keys_stamp(spec);
  assert_int_equal(stamp, k->stamp);
  keys_free(k);

  /* one key: the kid may be left out */
  assert_int_equal(keys_load(pem_path, &k, err, sizeof err), 0);
  assert_ptr_equal(keys_find(k, NULL), &k->v[0]);
  keys_free(k);

  /* a rewrite changes the stamp */
  /* (the size changes; mtime has ns resolution too) */
  write_file("set.json", "{\"keys\": []}");
  assert_int_not_equal(keys_stamp(spec), stamp);
  EVP_PKEY_free(rsa);
  EVP_PKEY_free(ec);
  EVP_PKEY_free(ec2);
}

static void test_refusals(void **state) {
  char p[128], spec[300], err[512];
  keys_t *k = NULL;
  path_of(p, sizeof p, "missing.pem");
  assert_int_equal(keys_load(p, &k, err, sizeof err), -1);
  assert_non_null(strstr(err, "cannot open"));
  write_file("broken.json", "{not json");
  path_of(p, sizeof p, "broken.json");
  assert_int_equal(keys_load(p, &k, err, sizeof err), -1);
  assert_non_null(strstr(err, "not a JWKS"));
  write_file("empty.json", "{\"keys\": [{\"kty\": \"oct\", \"kid\": \"s\"}]}");
  path_of(p, sizeof p, "empty.json");
  assert_int_equal(keys_load(p, &k, err, sizeof err), -1);
  assert_non_null(strstr(err, "no usable public key"));
  write_file("bad.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n");
  path_of(p, sizeof p, "bad.pem");
  assert_int_equal(keys_load(p, &k, err, sizeof err), -1);
  assert_non_null(strstr(err, "not a PEM public key"));
  EVP_PKEY *ec = EVP_EC_gen("P-256");
  char e1[512], jwks[1200], a[128], b[128];
  jwk_ec(ec, "same", e1, sizeof e1);
  snprintf(jwks, sizeof jwks, "{\"keys\":[%s]}", e1);
  write_file("a.json", jwks);
  write_file("b.json", jwks);
  path_of(a, sizeof a, "a.json");
  path_of(b, sizeof b, "b.json");
  snprintf(spec, sizeof spec, "%s,%s", a, b);
  assert_int_equal(keys_load(spec, &k, err, sizeof err), -1);
  assert_non_null(strstr(err, "a second key with kid same"));
  EVP_PKEY_free(ec);
}

static void test_b64url(void **state) {
  unsigned char out[16];
  assert_int_equal(keys_b64url_decode("QUJD", 4, out, sizeof out), 3);
  assert_memory_equal(out, "ABC", 3);
  assert_int_equal(keys_b64url_decode("QUI", 3, out, sizeof out), 2); /* unpadded */
  assert_int_equal(keys_b64url_decode("-_8", 3, out, sizeof out), 2);
  assert_int_equal(out[0], 0xfb);
  assert_int_equal(out[1], 0xff);
  assert_int_equal(keys_b64url_decode("QUJD+A", 6, out, sizeof out), -1); /* '+' is not base64url */
  assert_int_equal(keys_b64url_decode("Q", 1, out, sizeof out), -1);
  assert_int_equal(keys_b64url_decode("QUJDREVGR0hJSktMTU5PUFFS", 24, out, 4), -1); /* too long */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jwks_and_pem),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_b64url),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
