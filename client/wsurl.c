/*
 * wsurl.c: see wsurl.h.
 */
#include "wsurl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/urlauth.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

int wsurl_parse(const char *u, wsurl_t *out, char *err, size_t errlen) {
  int tls;
  size_t scheme = urlauth_ws_scheme(u, &tls);
  if (!scheme) {
    set_err(err, errlen, "URL '%s': must start with ws:// or wss://", u ? u : "(null)");
    return 0;
  }
  const char *h = u + scheme, *end = h + strcspn(h, "/?#");
  if (strlen(u) > 1024) {
    set_err(err, errlen, "URL is longer than 1024 bytes");
    return 0;
  }
  urlauth_t a;
  char why[1200];
  if (urlauth_parse(u, h, (size_t)(end - h), &a, why, sizeof why) != 0) {
    set_err(err, errlen, "bad URL: %s", why);
    return 0;
  }
  if (out) {
    snprintf(out->host, sizeof out->host, "%s", a.host);
    snprintf(out->port, sizeof out->port, "%d", a.port ? a.port : tls ? 443 : 80);
    snprintf(out->path, sizeof out->path, "%s", *end == '/' ? end : "/v1/ws");
    out->tls = tls;
  }
  return 1;
}

int wsurl_tls(const char *u) {
  int tls;
  urlauth_ws_scheme(u, &tls);
  return tls;
}
