/*
 * urlauth: the one parser of a URL's authority, host[:port], shared by the
 * node's HTTP client (net/httpc.c: http:// and https://) and the client
 * library (client/wsurl.c: ws:// and wss://), so both accept and refuse
 * the same hosts and ports. RFC 3986 section 3.2, without user
 * information. Pure function, any thread.
 */
#ifndef CONVERGER_COMMON_URLAUTH_H
#define CONVERGER_COMMON_URLAUTH_H

#include <stddef.h>

#define URLAUTH_HOST_MAX 253 /* longest DNS name (RFC 1035 section 2.3.4) */

typedef struct {
  char host[URLAUTH_HOST_MAX + 1]; /* without the brackets of an IPv6 literal */
  int port;                        /* 1..65535; 0 when the URL names none */
} urlauth_t;

/* Parse the authority auth[0 .. len) of the URL `url` (the whole URL, for
 * the reasons only) into `out`: a DNS name or dotted IPv4 address (letters,
 * digits, '.', '-', '_'), or an IPv6 literal in brackets ("[::1]",
 * checked with inet_pton), then an optional ":port". Refuses user
 * information (user@host), an empty host, a host over URLAUTH_HOST_MAX
 * bytes, an IPv6 address without brackets, and a port that is empty or
 * outside 1..65535. Returns 0, or -EINVAL with a one-line reason in
 * err[errlen] (err may be NULL; `out` is then undefined). */
int urlauth_parse(const char *url, const char *auth, size_t len, urlauth_t *out, char *err,
                  size_t errlen);

#endif
