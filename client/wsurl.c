/*
 * wsurl.c: see wsurl.h.
 */
#include "wsurl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

int wsurl_parse(const char *u, wsurl_t *out, char *err, size_t errlen) {
  int tls = u && strncmp(u, "wss://", 6) == 0;
  if (!u || (!tls && strncmp(u, "ws://", 5) != 0)) {
    set_err(err, errlen, "URL '%s': must start with ws:// or wss://", u ? u : "(null)");
    return 0;
  }
  const char *h = u + (tls ? 6 : 5), *end = h + strcspn(h, "/?#"), *port = NULL;
  if (strlen(u) > 1024) {
    set_err(err, errlen, "URL is longer than 1024 bytes");
    return 0;
  }
  if (memchr(h, '@', (size_t)(end - h))) {
    set_err(err, errlen, "URL '%s': user information is not supported", u);
    return 0;
  }
  size_t hl;
  if (*h == '[') { /* an IPv6 literal */
    const char *rb = memchr(h, ']', (size_t)(end - h));
    if (!rb || rb == h + 1 || (rb + 1 < end && rb[1] != ':')) {
      set_err(err, errlen, "URL '%s': bad IPv6 literal (want [addr]:port)", u);
      return 0;
    }
    hl = (size_t)(rb - h - 1);
    if (rb + 1 < end) port = rb + 2;
  } else {
    const char *colon = memchr(h, ':', (size_t)(end - h));
    hl = (size_t)((colon ? colon : end) - h);
    if (colon) port = colon + 1;
  }
  if (hl == 0 || hl > 255) {
    set_err(err, errlen, "URL '%s': no host, or a host longer than 255 bytes", u);
    return 0;
  }
  long v = tls ? 443 : 80;
  if (port) {
    v = 0;
    const char *p = port;
    for (; p < end && *p >= '0' && *p <= '9' && v <= 65535; p++) v = v * 10 + (*p - '0');
    if (p != end || p == port || v < 1 || v > 65535) {
      set_err(err, errlen, "URL '%s': the port must be 1-65535", u);
      return 0;
    }
  }
  if (out) {
    snprintf(out->host, sizeof out->host, "%.*s", (int)hl, *h == '[' ? h + 1 : h);
    snprintf(out->port, sizeof out->port, "%ld", v);
    snprintf(out->path, sizeof out->path, "%s", *end == '/' ? end : "/v1/ws");
    out->tls = tls;
  }
  return 1;
}
