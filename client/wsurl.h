/*
 * wsurl: the one parser of the client library's node URLs,
 * ws://host[:port][/path] and wss://... (TLS; IPv6 literals in brackets;
 * the scheme in any case, common/urlauth.h's urlauth_ws_scheme). The core
 * uses it to refuse bad URLs when a client is created; the transport uses
 * it to connect. Pure functions, any thread. Internal: not exported.
 */
#ifndef CONVERGER_CLIENT_WSURL_H
#define CONVERGER_CLIENT_WSURL_H

#include <stddef.h>

typedef struct {
  char host[256];  /* without the brackets of an IPv6 literal (urlauth_t's) */
  char port[8];    /* decimal; "80" (ws) or "443" (wss) when absent */
  int tls;         /* wss:// */
  char path[1025]; /* from the first '/', or "/v1/ws" when absent */
} wsurl_t;

/* Parse `url` into `out` (may be NULL: check only). Returns 1, or 0 with a
 * one-line reason in `err` (may be NULL): not ws:// or wss://, longer than
 * 1024 bytes, or an authority common/urlauth.h refuses (user information,
 * a bad IPv6 literal, no host or a bad one, a port outside 1-65535). */
int wsurl_parse(const char *url, wsurl_t *out, char *err, size_t errlen);

/* 1 when `url` is a wss:// URL, the scheme in any case (TLS:
 * urlauth_ws_scheme), 0 otherwise (ws://, anything else, NULL). No other
 * check: wsurl_parse says whether it is a URL at all. The core's downgrade
 * rule (docs/protocol.md 5.6 and 8: a client on wss never moves to ws)
 * compares two of these. */
int wsurl_tls(const char *url);

#endif
