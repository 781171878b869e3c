/*
 * urlauth: the one parser of a URL's authority, host[:port], shared by the
 * node's HTTP client (net/httpc.c: http:// and https://) and the client
 * library (client/wsurl.c: ws:// and wss://), so both accept and refuse
 * the same hosts and ports. RFC 3986 section 3.2, without user
 * information; and the test of a WebSocket URL's scheme (ws or wss) that
 * both use. Pure functions, any thread.
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

/* The scheme of a WebSocket URL (RFC 6455 section 3), read in any case
 * (RFC 3986 section 3.1: "WSS://" is "wss://"). Returns the length of the
 * "ws://" (5) or "wss://" (6) prefix that `url` starts with, *tls (may be
 * NULL) set to 1 for wss (TLS) and 0 for ws; or 0 for anything else
 * (another scheme such as https://, no scheme, NULL), *tls then 0. Only
 * the prefix is read: the authority after it is urlauth_parse's. The one
 * wss test of the node and the client library (client/wsurl.c,
 * gate/drain.c, the configuration's public URL), so that all agree which
 * URL is TLS: the scheme never goes down (docs/protocol.md 5.6 and 8).
 * Pure function, any thread. */
size_t urlauth_ws_scheme(const char *url, int *tls);

#endif
