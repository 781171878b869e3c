/*
 * tlsclient: the client side of TLS as the node's tools (net/httpc.c) and
 * the client library (client/client_uv.c) both set it up: TLS 1.2 or later
 * (RFC 8996), the peer's chain verified, and its name checked against the
 * host the caller asked for (RFC 6125), with SNI for a name. Any thread;
 * no state of its own.
 */
#ifndef CONVERGER_COMMON_TLSCLIENT_H
#define CONVERGER_COMMON_TLSCLIENT_H

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

/* A client context: TLS 1.2 or later, SSL_VERIFY_PEER, trusting the PEM
 * file `ca_file` and/or the hashed directory `ca_dir` (both may be NULL:
 * then the system's CAs, which OpenSSL's SSL_CERT_FILE and SSL_CERT_DIR
 * can point elsewhere). Returns the context (the caller frees it with
 * SSL_CTX_free), or NULL when out of memory or the CAs cannot be read;
 * OpenSSL's error queue says why, and is left for the caller to read. */
SSL_CTX *tlsclient_ctx(const char *ca_file, const char *ca_dir);

/* Expect `host` on `ssl`: an IPv4 or IPv6 literal is checked against the
 * certificate's IP addresses, a name against its DNS names and sent as SNI.
 * Returns 1, or 0 when OpenSSL refused the name (out of memory, or not a
 * valid name). */
int tlsclient_expect_host(SSL *ssl, const char *host);

#endif
