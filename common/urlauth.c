/*
 * urlauth.c: see urlauth.h.
 */
#include "common/urlauth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -EINVAL;
}

static int host_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

int urlauth_parse(const char *url, const char *auth, size_t len, urlauth_t *out, char *err,
                  size_t errlen) {
  const char *end = auth + len, *host = auth, *after;
  size_t hlen;
  if (memchr(auth, '@', len))
    return fail(err, errlen, "user info (user@host) is not allowed in the URL \"%s\"", url);
  if (len > 0 && auth[0] == '[') {
    const char *close = memchr(auth, ']', len);
    if (!close) return fail(err, errlen, "unterminated IPv6 address in \"%s\"", url);
    host = auth + 1;
    hlen = (size_t)(close - host);
    char v6[INET6_ADDRSTRLEN + 1];
    struct in6_addr a6;
    if (hlen == 0 || hlen >= sizeof v6) return fail(err, errlen, "bad IPv6 address in \"%s\"", url);
    memcpy(v6, host, hlen);
    v6[hlen] = '\0';
    if (inet_pton(AF_INET6, v6, &a6) != 1)
      return fail(err, errlen, "bad IPv6 address \"%s\" in \"%s\"", v6, url);
    after = close + 1;
  } else {
    const char *colon = memchr(auth, ':', len);
    if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1)))
      return fail(err, errlen, "an IPv6 address in a URL needs brackets, as in \"[::1]:8080\"");
    hlen = (size_t)((colon ? colon : end) - auth);
    after = auth + hlen;
    if (hlen == 0) return fail(err, errlen, "no host in \"%s\"", url);
    for (size_t i = 0; i < hlen; i++)
      if (!host_char(host[i]))
        return fail(err, errlen, "bad character '%c' in the host of \"%s\"", host[i], url);
  }
  if (hlen > URLAUTH_HOST_MAX)
    return fail(err, errlen, "host name too long (over %d bytes) in \"%s\"", URLAUTH_HOST_MAX, url);
  memcpy(out->host, host, hlen);
  out->host[hlen] = '\0';
  out->port = 0;
  if (after == end) return 0;
  if (*after != ':')
    return fail(err, errlen, "unexpected \"%.*s\" after the host in \"%s\"", (int)(end - after),
                after, url);
  long port = 0;
  const char *d = after + 1;
  if (d == end) return fail(err, errlen, "empty port in \"%s\"", url);
  for (; d < end && *d >= '0' && *d <= '9' && port <= 65535; d++) port = port * 10 + (*d - '0');
  if (d != end || port < 1 || port > 65535)
    return fail(err, errlen, "bad port \"%.*s\" in \"%s\": want 1..65535", (int)(end - after - 1),
                after + 1, url);
  out->port = (int)port;
  return 0;
}

size_t urlauth_ws_scheme(const char *url, int *tls) {
  size_t n = !url                                 ? 0
             : strncasecmp(url, "wss://", 6) == 0 ? 6
             : strncasecmp(url, "ws://", 5) == 0  ? 5
                                                  : 0;
  if (tls) *tls = n == 6;
  return n;
}
