/*
 * tls: TLS on the client listener (CONVERGER_TLS_CERT and CONVERGER_TLS_KEY)
 * through OpenSSL over memory BIOs, so that libuv keeps owning the socket.
 *
 * A tls_ctx_t holds one certificate and key loaded from their files; the
 * net keeps the current one and a connection keeps the one it was accepted
 * with (SSL_new takes a reference), so a reload on SIGHUP reaches new
 * connections only and never breaks an open one. A tls_t is one
 * connection's state: ciphertext read from the socket goes in with
 * tls_push, plaintext comes out of tls_read; plaintext to send goes in with
 * tls_seal and ciphertext for the socket comes out of tls_take.
 *
 * Protocol versions: TLS 1.2 and 1.3 (SSL_CTX_set_min_proto_version; the
 * RFC 8996 deprecation of 1.0 and 1.1). No client certificate is asked for.
 * Idle connections drop their record buffers (SSL_MODE_RELEASE_BUFFERS), and
 * a memory BIO that grew past 16 KiB is replaced by an empty one once
 * drained (a memory BIO's buffer never shrinks); an
 * open TLS connection still holds OpenSSL's state, about 17 KB more than a
 * plain one, and a handshake costs the node about 0.8 ms of CPU more than
 * a plain upgrade (docs/benchmarks/tls.md).
 *
 * Loop thread only; nothing here blocks.
 */
#ifndef CONVERGER_NET_TLS_H
#define CONVERGER_NET_TLS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ssl_ctx_st tls_ctx_t; /* OpenSSL's SSL_CTX */

/* Plaintext sealed at a time (conn.c's flush takes the records after each
 * piece), and the buffer a BIO may keep once drained: a memory BIO's
 * buffer never shrinks, so a replay or a large read would otherwise leave
 * a connection holding its largest flush for good. One TLS record's
 * plaintext. */
#define TLS_CHUNK 16384
typedef struct tls_s tls_t;

/* Load the PEM certificate chain at `cert_path` and the PEM private key at
 * `key_path` into a new server context, checking that they belong
 * together. Returns the context (free it with tls_ctx_free), or NULL with
 * a message naming the file and OpenSSL's reason in err[errlen]. */
tls_ctx_t *tls_ctx_load(const char *cert_path, const char *key_path, char *err, size_t errlen);

/* Drop the caller's reference to `ctx`; connections made from it keep
 * theirs. NULL is allowed. */
void tls_ctx_free(tls_ctx_t *ctx);

/* The certificate's subject and expiry ("CN=..., expires 2027-01-02"),
 * for the log line that says which certificate is served. */
void tls_ctx_describe(tls_ctx_t *ctx, char *out, size_t len);

/* A new server-side connection state on `ctx`, or NULL when out of memory. */
tls_t *tls_new(tls_ctx_t *ctx);

/* Free `t`. NULL is allowed. */
void tls_free(tls_t *t);

/* Hand `len` bytes read from the socket to TLS (copied; the read BIO gives
 * back a buffer grown past TLS_CHUNK once tls_read has drained it).
 * Returns 0, or -1 when out of memory. */
int tls_push(tls_t *t, const void *data, size_t len);

/* Results of tls_read. */
#define TLS_AGAIN  0  /* no plaintext until more ciphertext arrives */
#define TLS_CLOSED -1 /* the peer sent close_notify */
#define TLS_FAILED -2 /* a bad handshake or record: an alert may be waiting in tls_take */

/* Run the handshake as far as the ciphertext pushed allows, then decrypt
 * into buf[cap]. Returns the plaintext bytes (> 0), TLS_AGAIN, TLS_CLOSED or
 * TLS_FAILED; after TLS_FAILED, tls_error says why. */
long tls_read(tls_t *t, void *buf, size_t cap);

/* The handshake has completed. */
int tls_established(const tls_t *t);

/* Why the last tls_read failed (OpenSSL's reason), for the debug log. */
const char *tls_error(const tls_t *t);

/* Encrypt `len` bytes of plaintext into records waiting for tls_take
 * (callers seal at most 16 KiB before taking, so the write BIO stays
 * small). Returns 0, or -1 when TLS refuses (no handshake yet, or failed). */
int tls_seal(tls_t *t, const void *data, size_t len);

/* Queue close_notify (only after a handshake). */
void tls_close_notify(tls_t *t);

/* Ciphertext bytes waiting for the socket. */
size_t tls_pending(const tls_t *t);

/* Move up to `cap` waiting ciphertext bytes into buf; returns how many. */
size_t tls_take(tls_t *t, void *buf, size_t cap);

#endif
