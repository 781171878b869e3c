/*
 * tlsclient.c: a verifying TLS client set-up (tlsclient.h).
 */
#include "common/tlsclient.h"

#include <arpa/inet.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

SSL_CTX *tlsclient_ctx(const char *ca_file, const char *ca_dir) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) return NULL;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  int ok = ca_file || ca_dir ? SSL_CTX_load_verify_locations(ctx, ca_file, ca_dir) == 1
                             : SSL_CTX_set_default_verify_paths(ctx) == 1;
  if (!ok) {
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

int tlsclient_expect_host(SSL *ssl, const char *host) {
  unsigned char ip[16];
  if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1)
    return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1;
  return SSL_set_tlsext_host_name(ssl, host) == 1 && SSL_set1_host(ssl, host) == 1;
}
