/*
 * httpc: a small blocking HTTP/1.1 client, for command-line tools and the
 * bench's setup calls (never for the node's loop: it blocks the caller).
 *
 * One request per fresh connection (Connection: close): resolve the host
 * with getaddrinfo (names, IPv4 and IPv6 literals), connect, write the
 * request, read the answer with llhttp (HTTP_RESPONSE), close. Every step
 * runs under one total deadline (timeout_ms): connect + send + receive
 * (+ the TLS handshake). https through OpenSSL: TLS 1.2 or later, the
 * certificate chain and the host name verified (the request's CA file or
 * directory, else the system's, which OpenSSL's SSL_CERT_FILE and
 * SSL_CERT_DIR variables can point elsewhere). No redirects, no keep-alive,
 * no proxies.
 *
 * Errors: one channel. httpc_request returns the HTTP status (100..999), or
 * a negative errno with a one-line reason in the caller's error buffer;
 * httpc_retryable() says which of those mean "the node is unreachable or
 * went away" (worth retrying with the same idempotency key).
 *
 * Threads: no shared state; any thread may call, several at once.
 */
#ifndef CONVERGER_NET_HTTPC_H
#define CONVERGER_NET_HTTPC_H

#include <signal.h>
#include <stddef.h>

#define HTTPC_MAX_BODY_BYTES   (1024 * 1024) /* default bound of an answer's body */
#define HTTPC_HOST_MAX         253           /* longest DNS name */
#define HTTPC_PREFIX_MAX       512           /* longest path prefix of a URL */
#define HTTPC_DEFAULT_PORT     80
#define HTTPC_DEFAULT_TLS_PORT 443

/* One request. Pointers are borrowed for the duration of the call only. */
typedef struct {
  const char *host;    /* DNS name or IPv4/IPv6 literal, IPv6 without brackets */
  int port;            /* 1..65535 */
  const char *method;  /* "GET", "POST", ... (token characters only) */
  const char *path;    /* origin-form, starts with '/', no spaces or controls */
  const char *headers; /* NULL, or "Name: value\r\n" lines (each ending in CRLF) */
  const char *body;    /* NULL: none; else sent with Content-Type: application/json */
  int timeout_ms;      /* total deadline of connect + send + receive; > 0 */
  size_t max_body;     /* largest answer body accepted; 0: HTTPC_MAX_BODY_BYTES */
  /* NULL, or a flag set by the caller's signal handler: a system call
   * interrupted (EINTR) while *interrupted != 0 ends the request with
   * -EINTR; otherwise interrupted calls are restarted. */
  volatile sig_atomic_t *interrupted;
  int tls;                 /* 1: https (httpc_url_t.tls) */
  const char *tls_ca_file; /* NULL, or PEM CA certificates trusted instead of the system's */
  const char *tls_ca_dir;  /* NULL, or a hashed directory of them (c_rehash) */
} httpc_request_t;

/* The answer. */
typedef struct {
  int status;         /* HTTP status code */
  char *body;         /* malloc'ed, NUL-terminated (never NULL after success); caller frees */
  size_t body_len;    /* bytes in body, without the NUL */
  long retry_after_s; /* Retry-After in seconds (delta-seconds form), -1 when absent or a date */
} httpc_response_t;

/* Send `req` and read the whole answer into `resp`.
 *
 * Returns the HTTP status (also in resp->status) with resp->body allocated
 * (the caller frees it, with httpc_response_free or free()). On failure
 * returns a negative errno, writes a one-line reason (no trailing newline)
 * into err[err_len] and leaves resp->body NULL:
 *   -EINVAL       bad request fields (no host, port out of range, CR/LF in
 *                 method or path, timeout_ms <= 0)
 *   -ENOENT       the host name does not resolve (-EAGAIN: temporary
 *                 resolver failure)
 *   -ECONNREFUSED nothing listens there (or another connect() errno)
 *   -EPROTO       TLS failed: the certificate does not verify (the reason
 *                 says why: "TLS: certificate verify failed: ... for HOST"),
 *                 or the server does not speak TLS 1.2 or later
 *   -ETIMEDOUT    the deadline passed (connect, send or receive)
 *   -ECONNRESET   the peer reset the connection
 *   -EPIPE        the peer closed the connection before a complete answer
 *   -EPROTO       the answer is not valid HTTP/1.x
 *   -EMSGSIZE     the answer's body is larger than max_body
 *   -EINTR        interrupted (see httpc_request_t.interrupted)
 *   -ENOMEM       out of memory
 * resp is always initialised (status 0 and retry_after_s -1 on failure).
 * Interim 1xx answers are skipped. Blocks for at most about timeout_ms
 * (getaddrinfo itself is not bounded by it). Any thread; SIGPIPE is never
 * raised (MSG_NOSIGNAL). */
int httpc_request(const httpc_request_t *req, httpc_response_t *resp, char *err, size_t err_len);

/* Free resp->body and set it to NULL. resp may be NULL. */
void httpc_response_free(httpc_response_t *resp);

/* 1 when the error `e` returned by httpc_request means that the server was
 * unreachable or went away (refused, reset, closed early, timeout, network
 * or host unreachable, temporary resolver failure): the request may be
 * retried, with the same idempotency key. 0 otherwise (a bad URL or answer,
 * out of memory, interrupted). */
int httpc_retryable(int e);

/* A parsed "http[s]://host[:port][/prefix]" URL. */
typedef struct {
  int tls;                           /* 1: https */
  char host[HTTPC_HOST_MAX + 1];     /* without the brackets of an IPv6 literal */
  int port;                          /* 1..65535; 80 (443 for https) when absent */
  char prefix[HTTPC_PREFIX_MAX + 1]; /* "" or "/a/b": path to prepend, no trailing '/' */
} httpc_url_t;

/* Parse `url`: scheme http or https (any case), a host (a DNS name, a dotted IPv4
 * address or a bracketed IPv6 literal "[::1]"), an optional port and an
 * optional path prefix (trailing slashes dropped). Rejects anything else,
 * with a one-line reason in err[err_len]: other schemes, user info,
 * query strings, fragments, empty or malformed hosts, ports outside
 * 1..65535, spaces or control characters. Returns 0 and fills `out`, or
 * -EINVAL (`out` then undefined). Any thread. */
int httpc_parse_url(const char *url, httpc_url_t *out, char *err, size_t err_len);

#endif
