/*
 * tls.c: the server side of TLS over memory BIOs (tls.h).
 */
#include "net/tls.h"

#include <openssl/bio.h>
#include <openssl/buffer.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tls_s {
  SSL *ssl;
  BIO *rbio; /* ciphertext from the socket; owned by ssl */
  BIO *wbio; /* ciphertext for the socket; owned by ssl */
  char error[160];
};

/* OpenSSL's reason for the last failure on this thread, or `fallback`. */
static void last_error(char *out, size_t len, const char *fallback) {
  unsigned long e = ERR_peek_last_error();
  if (e)
    ERR_error_string_n(e, out, len);
  else
    snprintf(out, len, "%s", fallback);
  ERR_clear_error();
}

/* No passphrase prompt: OpenSSL's default asks on the terminal, which would
 * block the loop on a reload. An encrypted key fails to load instead. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) { return -1; }

tls_ctx_t *tls_ctx_load(const char *cert_path, const char *key_path, char *err, size_t errlen) {
  char why[256];
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) {
    last_error(why, sizeof why, "out of memory");
    snprintf(err, errlen, "TLS context: %s", why);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  /* memory BIOs take everything: SSL_write never writes part of a buffer */
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
  const char *file = cert_path;
  int ok = SSL_CTX_use_certificate_chain_file(ctx, cert_path) == 1;
  if (ok) {
    file = key_path;
    ok = SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) == 1;
  }
  int mismatch = !ok && file == key_path &&
                 ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
  if (mismatch || (ok && SSL_CTX_check_private_key(ctx) != 1)) {
    snprintf(err, errlen, "%s is not the private key of the certificate in %s", key_path,
             cert_path);
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
  }
  if (!ok && file == key_path && ERR_GET_REASON(ERR_peek_last_error()) == PEM_R_BAD_PASSWORD_READ) {
    snprintf(err, errlen,
             "%s is an encrypted key: give the key without a passphrase "
             "(openssl pkey -in KEY -out KEY.plain), readable by the node's user only",
             key_path);
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
  }
  if (!ok) {
    last_error(why, sizeof why, "unreadable");
    snprintf(err, errlen, "%s: %s", file, why);
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

void tls_ctx_free(tls_ctx_t *ctx) {
  if (ctx) SSL_CTX_free(ctx);
}

void tls_ctx_describe(tls_ctx_t *ctx, char *out, size_t len) {
  X509 *x = SSL_CTX_get0_certificate(ctx);
  if (!x) {
    snprintf(out, len, "no certificate");
    return;
  }
  char subject[256];
  X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof subject);
  struct tm tm;
  char expires[32] = "?";
  if (ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) == 1)
    strftime(expires, sizeof expires, "%Y-%m-%d %H:%M UTC", &tm);
  char serial[80] = "?";
  BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
  char *hex = bn ? BN_bn2hex(bn) : NULL;
  if (hex) snprintf(serial, sizeof serial, "%s", hex);
  OPENSSL_free(hex);
  BN_free(bn);
  snprintf(out, len, "%s, serial %s, expires %s", subject, serial, expires);
}

tls_t *tls_new(tls_ctx_t *ctx) {
  tls_t *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ssl = SSL_new(ctx);
  t->rbio = BIO_new(BIO_s_mem());
  t->wbio = BIO_new(BIO_s_mem());
  if (!t->ssl || !t->rbio || !t->wbio) {
    BIO_free(t->rbio);
    BIO_free(t->wbio);
    if (t->ssl) SSL_free(t->ssl);
    free(t);
    ERR_clear_error();
    return NULL;
  }
  SSL_set_bio(t->ssl, t->rbio, t->wbio);
  SSL_set_accept_state(t->ssl);
  return t;
}

void tls_free(tls_t *t) {
  if (!t) return;
  SSL_free(t->ssl);
  free(t);
}

/* The buffer capacity of a memory BIO. */
static size_t bio_capacity(BIO *b) {
  BUF_MEM *bm = NULL;
  BIO_get_mem_ptr(b, &bm);
  return bm ? bm->max : 0;
}

/* `*b` is empty: when its buffer grew past TLS_CHUNK, give it back by
 * putting a new BIO in its place (SSL_set0_rbio / _wbio free the old). */
static void shrink(tls_t *t, int read_side) {
  BIO **b = read_side ? &t->rbio : &t->wbio;
  if (BIO_ctrl_pending(*b) != 0 || bio_capacity(*b) <= TLS_CHUNK) return;
  BIO *fresh = BIO_new(BIO_s_mem());
  if (!fresh) return; /* keep the big one */
  if (read_side)
    SSL_set0_rbio(t->ssl, fresh);
  else
    SSL_set0_wbio(t->ssl, fresh);
  *b = fresh;
}

int tls_push(tls_t *t, const void *data, size_t len) {
  while (len > 0) {
    int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
    int n = BIO_write(t->rbio, data, chunk); /* grows as needed: all, or out of memory */
    if (n <= 0) {
      ERR_clear_error();
      snprintf(t->error, sizeof t->error, "out of memory");
      return -1;
    }
    data = (const char *)data + n;
    len -= (size_t)n;
  }
  return 0;
}

long tls_read(tls_t *t, void *buf, size_t cap) {
  int n = SSL_read(t->ssl, buf, cap > (1u << 30) ? 1 << 30 : (int)cap);
  if (n > 0) return n;
  int e = SSL_get_error(t->ssl, n);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    ERR_clear_error();
    shrink(t, 1);
    return TLS_AGAIN;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return TLS_CLOSED;
  last_error(t->error, sizeof t->error, "TLS failed");
  return TLS_FAILED;
}

int tls_established(const tls_t *t) { return SSL_is_init_finished(t->ssl); }

const char *tls_error(const tls_t *t) { return t->error; }

int tls_seal(tls_t *t, const void *data, size_t len) {
  while (len > 0) {
    int chunk = len > TLS_CHUNK ? TLS_CHUNK : (int)len;
    int n = SSL_write(t->ssl, data, chunk);
    if (n <= 0) {
      last_error(t->error, sizeof t->error, "TLS write refused");
      return -1;
    }
    data = (const char *)data + n;
    len -= (size_t)n;
  }
  return 0;
}

void tls_close_notify(tls_t *t) {
  if (SSL_is_init_finished(t->ssl)) SSL_shutdown(t->ssl);
  ERR_clear_error();
}

size_t tls_pending(const tls_t *t) { return BIO_ctrl_pending(t->wbio); }

size_t tls_take(tls_t *t, void *buf, size_t cap) {
  int n = BIO_read(t->wbio, buf, cap > (1u << 30) ? 1 << 30 : (int)cap);
  shrink(t, 0);
  return n > 0 ? (size_t)n : 0;
}
