/*
 * tlscert.c: a self-signed certificate for a bench node (tlscert.h).
 */
#include "bench/tlscert.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <unistd.h>

/* Open `path` for writing with `mode`, as a stdio stream; NULL on error. */
static FILE *create(const char *path, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, "w");
  if (!f) close(fd);
  return f;
}

int tlscert_make(const char *cert_path, const char *key_path, char *err, size_t errlen) {
  int ok = 0;
  EVP_PKEY *key = EVP_EC_gen("P-256");
  X509 *x = X509_new();
  X509_EXTENSION *san = NULL;
  FILE *cf = NULL, *kf = NULL;
  unsigned char serial[8];
  if (!key || !x || RAND_bytes(serial, sizeof serial) != 1) goto out;
  serial[0] &= 0x7f; /* a positive serial */
  BIGNUM *bn = BN_bin2bn(serial, sizeof serial, NULL);
  int serial_ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
  BN_free(bn);
  if (!serial_ok || X509_set_version(x, 2) != 1 || !X509_gmtime_adj(X509_getm_notBefore(x), -60) ||
      !X509_gmtime_adj(X509_getm_notAfter(x), 86400) || X509_set_pubkey(x, key) != 1)
    goto out;
  X509_NAME *name = X509_get_subject_name(x);
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"converger bench",
                                 -1, -1, 0) != 1 ||
      X509_set_issuer_name(x, name) != 1)
    goto out;
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
  san = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  if (!san || X509_add_ext(x, san, -1) != 1 || X509_sign(x, key, EVP_sha256()) == 0) goto out;
  cf = create(cert_path, 0644);
  kf = create(key_path, 0600);
  if (!cf || !kf) {
    snprintf(err, errlen, "cannot write %s: %m", cf ? key_path : cert_path);
    goto done;
  }
  ok = PEM_write_X509(cf, x) == 1 && PEM_write_PrivateKey(kf, key, NULL, NULL, 0, NULL, NULL) == 1;
  if (fclose(cf) != 0) ok = 0;
  if (fclose(kf) != 0) ok = 0;
  cf = kf = NULL;
  if (!ok) snprintf(err, errlen, "cannot write the certificate and key to %s", cert_path);
  goto done;
out : {
  char why[160] = "out of memory";
  unsigned long e = ERR_get_error();
  if (e) ERR_error_string_n(e, why, sizeof why);
  snprintf(err, errlen, "cannot make a TLS certificate: %s", why);
}
done:
  if (cf) fclose(cf);
  if (kf) fclose(kf);
  ERR_clear_error();
  X509_EXTENSION_free(san);
  X509_free(x);
  EVP_PKEY_free(key);
  return ok ? 0 : -1;
}
