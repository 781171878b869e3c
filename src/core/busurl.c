/*
 * busurl.c: the parser of busurl.h.
 */
#include "core/busurl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One "redis://HOST:PORT" of `len` bytes. */
static int parse_one(const char *u, size_t len, busurl_t *out) {
  const char *pre = "redis://";
  if (len <= strlen(pre) || strncmp(u, pre, strlen(pre)) != 0) return -1;
  u += strlen(pre);
  len -= strlen(pre);
  if (len > 0 && u[len - 1] == '/') len--;
  const char *colon = NULL;
  for (size_t i = 0; i < len; i++)
    if (u[i] == ':') colon = u + i;
  if (!colon || colon == u || (size_t)(colon - u) > BUSURL_HOST_MAX) return -1;
  size_t hl = (size_t)(colon - u), dl = len - hl - 1;
  if (dl == 0 || dl > 5) return -1;
  long port = 0;
  for (size_t i = 0; i < dl; i++) {
    if (colon[1 + i] < '0' || colon[1 + i] > '9') return -1;
    port = port * 10 + (colon[1 + i] - '0');
  }
  if (port < 1 || port > 65535) return -1;
  for (size_t i = 0; i < hl; i++)
    if (strchr("/@?#[] ,", u[i]) || (unsigned char)u[i] < 0x21) return -1;
  memcpy(out->host, u, hl);
  out->host[hl] = '\0';
  out->port = (int)port;
  return 0;
}

int busurl_parse(const char *urls, busurl_t out[BUSURL_MAX], int *n, char *why, size_t cap) {
  int k = 0;
  const char *p = urls;
  while (p && *p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    busurl_t one;
    if (k == BUSURL_MAX) {
      snprintf(why, cap, "more than %d bus instances", BUSURL_MAX);
      return -1;
    }
    if (parse_one(p, len, &one) != 0) {
      snprintf(why, cap, "\"%.*s\" is not redis://HOST:PORT", (int)(len > 200 ? 200 : len), p);
      return -1;
    }
    if (out) out[k] = one;
    k++;
    p = end ? end + 1 : NULL;
  }
  if (k == 0) {
    snprintf(why, cap, "no bus instance (want redis://HOST:PORT, comma-separated)");
    return -1;
  }
  if (n) *n = k;
  return 0;
}
