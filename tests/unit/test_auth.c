/* Unit tests for gate/auth: tokens (good, expired, bad signature, alg none,
 * other algorithms, missing claims), API key, revocation cache; (1.1)
 * RS256 and ES256 tokens verified with public keys made here with OpenSSL
 * (the kid choosing the key, the key pinning the algorithm, an unknown,
 * bad or missing kid, a public key tried as an HMAC secret) and the iss
 * and aud checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

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

/* ---- public keys (1.1) ------------------------------------------------------ */

/* A JWT signed with `key` (RS256: PKCS #1 v1.5 with SHA-256; ES256: the
 * raw r || s of ECDSA P-256 with SHA-256, RFC 7518 section 3.4), with the
 * header and claims given; `key` NULL leaves the signature empty. Heap. */
static char *forge_pk(const char *header, const char *claims, EVP_PKEY *key) {
  static char h[1024], c[2048], sig[1024];
  b64url((const unsigned char *)header, strlen(header), h);
  b64url((const unsigned char *)claims, strlen(claims), c);
  size_t n = strlen(h) + strlen(c) + 2;
  char *signing = malloc(n);
  assert_non_null(signing);
  snprintf(signing, n, "%s.%s", h, c);
  sig[0] = '\0';
  if (key) {
    unsigned char der[1024], raw[64];
    size_t len = sizeof der;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    assert_int_equal(EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, key), 1);
    assert_int_equal(EVP_DigestSign(md, der, &len, (const unsigned char *)signing, strlen(signing)),
                     1);
    EVP_MD_CTX_free(md);
    if (EVP_PKEY_get_base_id(key) == EVP_PKEY_EC) {
      const unsigned char *p = der;
      ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)len);
      assert_non_null(es);
      assert_int_equal(BN_bn2binpad(ECDSA_SIG_get0_r(es), raw, 32), 32);
      assert_int_equal(BN_bn2binpad(ECDSA_SIG_get0_s(es), raw + 32, 32), 32);
      ECDSA_SIG_free(es);
      b64url(raw, sizeof raw, sig);
    } else {
      b64url(der, len, sig);
    }
  }
  char *tok = malloc(n + strlen(sig) + 2);
  assert_non_null(tok);
  sprintf(tok, "%s.%s", signing, sig);
  free(signing);
  return tok;
}

/* The SubjectPublicKeyInfo PEM of `key`. Heap. */
static char *public_pem(EVP_PKEY *key) {
  BIO *b = BIO_new(BIO_s_mem());
  assert_non_null(b);
  assert_int_equal(PEM_write_bio_PUBKEY(b, key), 1);
  char *data;
  long n = BIO_get_mem_data(b, &data);
  char *pem = malloc((size_t)n + 1);
  assert_non_null(pem);
  memcpy(pem, data, (size_t)n);
  pem[n] = '\0';
  BIO_free(b);
  return pem;
}

/* A key set as keys_load makes it: each key's kid, its pinned algorithm
 * and its public PEM. */
static keys_t *key_set(size_t n, const char *const kids[], EVP_PKEY *const keys[]) {
  keys_t *k = calloc(1, sizeof *k);
  assert_non_null(k);
  k->v = calloc(n, sizeof *k->v);
  assert_non_null(k->v);
  k->n = n;
  for (size_t i = 0; i < n; i++) {
    snprintf(k->v[i].kid, sizeof k->v[i].kid, "%s", kids[i]);
    k->v[i].alg = EVP_PKEY_get_base_id(keys[i]) == EVP_PKEY_EC ? KEY_ES256 : KEY_RS256;
    k->v[i].pem = public_pem(keys[i]);
    k->v[i].pem_len = strlen(k->v[i].pem);
  }
  return k;
}

/* `claims` for sub "pk-user" expiring at `exp`, with `extra` (",..." or ""). */
static void pk_claims(char *out, size_t cap, int64_t exp, const char *extra) {
  snprintf(out, cap, "{\"sub\":\"pk-user\",\"convs\":[\"c1\"],\"exp\":%lld,\"jti\":\"pk-1\"%s}",
           (long long)exp, extra);
}

/* auth_verify's answer for `token`: 0 (the sub checked and the token
 * cleared) or the refusal, whose reason must be `want_why`. */
static void expect_verify(const auth_t *x, const char *token, const char *want_why) {
  auth_token_t t;
  const char *why = NULL;
  int r = auth_verify(x, token, NOW, &t, &why);
  if (!want_why) {
    if (r != 0) fail_msg("refused: %s", why ? why : "(no reason)");
    assert_string_equal(t.sub, "pk-user");
    assert_true(auth_token_allows(&t, "c1"));
    auth_token_clear(&t);
    return;
  }
  assert_int_equal(r, -CV_EUNAUTHORIZED);
  assert_non_null(why);
  assert_string_equal(why, want_why);
}

static EVP_PKEY *rsa1, *rsa2, *ec1, *ec2;

static int setup_keys(void **state) {
  rsa1 = EVP_RSA_gen(2048);
  rsa2 = EVP_RSA_gen(2048);
  ec1 = EVP_EC_gen("P-256");
  ec2 = EVP_EC_gen("P-256");
  return rsa1 && rsa2 && ec1 && ec2 ? 0 : -1;
}

static int teardown_keys(void **state) {
  EVP_PKEY_free(rsa1);
  EVP_PKEY_free(rsa2);
  EVP_PKEY_free(ec1);
  EVP_PKEY_free(ec2);
  return 0;
}

/* Keys r1, r2 (RSA) and e1 (P-256): the kid picks the key, whose type
 * pins the algorithm; a token signed by another key than its kid's, an
 * algorithm its key does not sign, an unknown or ill-typed kid, no kid
 * among several keys, alg none, RS384, a public key used as an HS256
 * secret and an expired token are refused, each with its reason; HS256
 * with the node's secret still verifies. */
static void test_public_keys_kid_and_alg(void **state) {
  auth_t *x = auth_new("the-api-key", SECRET);
  assert_non_null(x);
  const char *const kids[] = {"r1", "r2", "e1"};
  EVP_PKEY *const keys[] = {rsa1, rsa2, ec1};
  auth_set_keys(x, key_set(3, kids, keys));
  assert_int_equal(auth_keys(x)->n, 3);
  char claims[256];
  pk_claims(claims, sizeof claims, NOW + 600, "");
  const struct {
    const char *header;
    EVP_PKEY *signer;
    const char *why; /* NULL: verified */
  } cases[] = {
      {"{\"alg\":\"RS256\",\"kid\":\"r1\",\"typ\":\"JWT\"}", rsa1, NULL},
      {"{\"alg\":\"RS256\",\"kid\":\"r2\"}", rsa2, NULL},
      {"{\"alg\":\"ES256\",\"kid\":\"e1\"}", ec1, NULL},
      /* the kid chooses the key: another key's signature does not verify */
      {"{\"alg\":\"RS256\",\"kid\":\"r1\"}", rsa2, "bad token signature"},
      {"{\"alg\":\"RS256\",\"kid\":\"r2\"}", rsa1, "bad token signature"},
      {"{\"alg\":\"ES256\",\"kid\":\"e1\"}", ec2, "bad token signature"},
      {"{\"alg\":\"RS256\",\"kid\":\"r1\"}", NULL, "bad token signature"},
      /* the key pins the algorithm */
      {"{\"alg\":\"ES256\",\"kid\":\"r1\"}", ec1, "token alg does not match its key"},
      {"{\"alg\":\"RS256\",\"kid\":\"e1\"}", rsa1, "token alg does not match its key"},
      {"{\"alg\":\"ES256\",\"kid\":\"r1\"}", rsa1, "token alg does not match its key"},
      /* kids that name no key */
      {"{\"alg\":\"RS256\",\"kid\":\"r3\"}", rsa1, "unknown token kid"},
      {"{\"alg\":\"RS256\",\"kid\":\"R1\"}", rsa1, "unknown token kid"},
      {"{\"alg\":\"RS256\",\"kid\":7}", rsa1, "unknown token kid"},
      {"{\"alg\":\"ES256\",\"kid\":null}", ec1, "unknown token kid"},
      {"{\"alg\":\"RS256\"}", rsa1, "token has no kid"}, /* three keys: which? */
      /* algorithms no key signs */
      {"{\"alg\":\"none\",\"kid\":\"r1\"}", NULL, "token alg must be HS256, RS256 or ES256"},
      {"{\"alg\":\"RS384\",\"kid\":\"r1\"}", rsa1, "token alg must be HS256, RS256 or ES256"},
      {"{\"alg\":\"PS256\",\"kid\":\"r1\"}", rsa1, "token alg must be HS256, RS256 or ES256"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *tok = forge_pk(cases[i].header, claims, cases[i].signer);
    expect_verify(x, tok, cases[i].why);
    free(tok);
  }
  /* a public key's PEM as an HS256 secret (the algorithm confusion of RFC
   * 8725, section 2.1): HS256 is the node's secret's alone */
  char *confused =
      forge("{\"alg\":\"HS256\",\"kid\":\"r1\"}", claims, EVP_sha256(), auth_keys(x)->v[0].pem);
  expect_verify(x, confused, "bad token signature");
  free(confused);
  char *hs = forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), SECRET);
  expect_verify(x, hs, NULL);
  free(hs);
  /* the claims are checked as for HS256 */
  char expired_claims[256];
  pk_claims(expired_claims, sizeof expired_claims, NOW, "");
  char *expired = forge_pk("{\"alg\":\"ES256\",\"kid\":\"e1\"}", expired_claims, ec1);
  expect_verify(x, expired, "token expired");
  free(expired);
  char no_jti[128];
  snprintf(no_jti, sizeof no_jti, "{\"sub\":\"pk-user\",\"convs\":[\"c1\"],\"exp\":%lld}",
           NOW + 600);
  char *tok = forge_pk("{\"alg\":\"RS256\",\"kid\":\"r1\"}", no_jti, rsa1);
  expect_verify(x, tok, "token jti must be a string of 1 to 128 bytes");
  free(tok);

  /* one key: a token without a kid is for it */
  const char *const one_kid[] = {"only"};
  EVP_PKEY *const one_key[] = {ec1};
  auth_set_keys(x, key_set(1, one_kid, one_key)); /* replaces (and frees) the three */
  tok = forge_pk("{\"alg\":\"ES256\"}", claims, ec1);
  expect_verify(x, tok, NULL);
  free(tok);
  tok = forge_pk("{\"alg\":\"RS256\"}", claims, rsa1);
  expect_verify(x, tok, "token alg does not match its key");
  free(tok);
  tok = forge_pk("{\"alg\":\"ES256\",\"kid\":\"e1\"}", claims, ec1); /* its kid is "only" now */
  expect_verify(x, tok, "unknown token kid");
  free(tok);

  /* no public keys: RS256 and ES256 are refused before any key is looked for */
  auth_set_keys(x, NULL);
  assert_null(auth_keys(x));
  tok = forge_pk("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims, rsa1);
  expect_verify(x, tok, "token alg must be HS256 (no public keys are configured)");
  free(tok);
  auth_free(x);
}

/* CONVERGER_TOKEN_ISSUER and CONVERGER_TOKEN_AUDIENCE: with both set,
 * every token needs that iss and an aud naming the audience (a string, or
 * an array holding it), whatever its algorithm; the node's own tokens
 * carry both. */
static void test_public_keys_iss_and_aud(void **state) {
  auth_t *x = auth_new("the-api-key", SECRET);
  assert_non_null(x);
  const char *const kids[] = {"r1", "e1"};
  EVP_PKEY *const keys[] = {rsa1, ec1};
  auth_set_keys(x, key_set(2, kids, keys));
  assert_int_equal(auth_set_claims(x, "https://backend.example", "converger"), 0);
  const struct {
    const char *extra, *why;
  } cases[] = {
      {",\"iss\":\"https://backend.example\",\"aud\":\"converger\"", NULL},
      {",\"iss\":\"https://backend.example\",\"aud\":[\"billing\",\"converger\"]", NULL},
      {",\"aud\":\"converger\"", "token iss is not CONVERGER_TOKEN_ISSUER"},
      {",\"iss\":\"https://other.example\",\"aud\":\"converger\"",
       "token iss is not CONVERGER_TOKEN_ISSUER"},
      {",\"iss\":\"https://backend.example\"", "token aud does not name CONVERGER_TOKEN_AUDIENCE"},
      {",\"iss\":\"https://backend.example\",\"aud\":\"billing\"",
       "token aud does not name CONVERGER_TOKEN_AUDIENCE"},
      {",\"iss\":\"https://backend.example\",\"aud\":[\"billing\"]",
       "token aud does not name CONVERGER_TOKEN_AUDIENCE"},
      {",\"iss\":\"https://backend.example\",\"aud\":[]",
       "token aud does not name CONVERGER_TOKEN_AUDIENCE"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char claims[384];
    pk_claims(claims, sizeof claims, NOW + 600, cases[i].extra);
    char *rs = forge_pk("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims, rsa1);
    char *es = forge_pk("{\"alg\":\"ES256\",\"kid\":\"e1\"}", claims, ec1);
    char *hs = forge("{\"alg\":\"HS256\"}", claims, EVP_sha256(), SECRET);
    expect_verify(x, rs, cases[i].why);
    expect_verify(x, es, cases[i].why);
    expect_verify(x, hs, cases[i].why);
    free(rs);
    free(es);
    free(hs);
  }
  json_t *convs = json_pack("[s]", "c1");
  char *tok, jti[37];
  int64_t exp;
  assert_int_equal(auth_sign(x, "pk-user", convs, NOW, 60, &tok, jti, &exp), 0);
  expect_verify(x, tok, NULL);
  free(tok);
  json_decref(convs);
  auth_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sign_then_verify), cmocka_unit_test(test_wildcard_and_scope),
      cmocka_unit_test(test_bad_signature),    cmocka_unit_test(test_alg_none_and_others_refused),
      cmocka_unit_test(test_missing_claims),   cmocka_unit_test(test_api_key),
      cmocka_unit_test(test_revocation_cache), cmocka_unit_test(test_not_a_jwt),
  };
  const struct CMUnitTest key_tests[] = {
      cmocka_unit_test(test_public_keys_kid_and_alg),
      cmocka_unit_test(test_public_keys_iss_and_aud),
  };
  int failed = cmocka_run_group_tests(tests, setup, teardown);
  return failed + cmocka_run_group_tests(key_tests, setup_keys, teardown_keys);
}
