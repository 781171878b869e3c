/*
 * wskey: the RFC 6455 handshake pieces shared by the node (net/ws.c) and
 * the client library (client/client_uv.c). Pure functions, any thread.
 */
#ifndef CONVERGER_COMMON_WSKEY_H
#define CONVERGER_COMMON_WSKEY_H

/* Sec-WebSocket-Accept for `key` (RFC 6455 section 4.2.2: base64 of the
 * SHA-1 of key + GUID). `out` gets 28 characters and a NUL. */
void ws_accept_key(const char *key, char out[29]);

/* 1 when the comma-separated header value `value` contains `token`
 * (case-insensitive, RFC 7230 section 7 lists), else 0. */
int ws_has_token(const char *value, const char *token);

#endif
