/* Fuzz target: token verification (gate/auth.c). Input whose first byte is
 * 'C' is a claims set: it is signed here with the right secret (header
 * {"alg":"HS256"}), so the fuzzer reaches the claim checks behind the
 * signature. Any other input is a token as sent by a client. Either way it
 * must be refused with a reason, or accepted with every claim valid. */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gate/auth.h"
#include "common/util.h"

#define SECRET "fuzz-secret-of-at-least-32-bytes"
#define NOW    1800000000

static size_t b64url(const uint8_t *in, size_t n, char *out) {
  int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
  for (int i = 0; i < len; i++) {
    if (out[i] == '+')
      out[i] = '-';
    else if (out[i] == '/')
      out[i] = '_';
  }
  while (len > 0 && out[len - 1] == '=') len--;
  out[len] = '\0';
  return (size_t)len;
}

static char *sign_claims(const uint8_t *claims, size_t n) {
  static const char header[] = "eyJhbGciOiJIUzI1NiJ9"; /* {"alg":"HS256"} */
  char *tok = malloc(sizeof header + 2 * n + 4 + 100);
  if (!tok) return NULL;
  size_t len = strlen(header);
  memcpy(tok, header, len);
  tok[len++] = '.';
  len += b64url(claims, n, tok + len);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int maclen = 0;
  HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), (unsigned char *)tok, len, mac, &maclen);
  tok[len++] = '.';
  b64url(mac, maclen, tok + len);
  return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  static auth_t *a;
  if (!a) a = auth_new("fuzz-api-key", SECRET);
  char *token;
  if (len > 0 && data[0] == 'C') {
    token = sign_claims(data + 1, len - 1);
  } else {
    token = malloc(len + 1);
    if (token) {
      memcpy(token, data, len);
      token[len] = '\0';
    }
  }
  if (!token) return 0;
  auth_token_t t;
  const char *why = NULL;
  if (auth_verify(a, token, NOW, &t, &why) == 0) {
    if (!util_id_valid(t.sub) || t.exp_s <= NOW || !t.convs) __builtin_trap();
    auth_token_clear(&t);
  } else if (!why) {
    __builtin_trap();
  }
  free(token);
  return 0;
}
