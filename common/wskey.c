#include "common/wskey.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char ws_guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

void ws_accept_key(const char *key, char out[29]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  char buf[256];
  int n = snprintf(buf, sizeof buf, "%s%s", key, ws_guid);
  if (n < 0 || (size_t)n >= sizeof buf) n = 0;
  EVP_Digest(buf, (size_t)n, md, &mdlen, EVP_sha1(), NULL);
  EVP_EncodeBlock((unsigned char *)out, md, (int)mdlen);
  out[28] = '\0';
}

int ws_has_token(const char *value, const char *token) {
  size_t tl = strlen(token);
  const char *p = value;
  while (p && *p) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    const char *end = p;
    while (*end && *end != ',') end++;
    const char *e = end;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if ((size_t)(e - p) == tl && strncasecmp(p, token, tl) == 0) return 1;
    p = end;
  }
  return 0;
}
