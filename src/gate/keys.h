/*
 * keys: the public keys that verify tokens minted by the application's
 * backend (RS256, ES256), from CONVERGER_TOKEN_PUBLIC_KEYS (docs/protocol.md,
 * section 11.1).
 *
 * The setting is a comma-separated list of files. A file whose name ends in
 * ".json" is a JWKS (RFC 7517, section 5: {"keys": [...]}); its RSA keys
 * (kty "RSA", n, e) verify RS256 and its P-256 keys (kty "EC", crv "P-256",
 * x, y) ES256, each named by its "kid"; a key with "use" other than "sig",
 * or an "alg" that is not its type's, is skipped with a warning. Any other
 * file is one PEM public key ("-----BEGIN PUBLIC KEY-----"), RSA or P-256,
 * whose kid is the file's name without its directory and extension
 * ("keys/2026-12.pem" is "2026-12"). Every key's algorithm is pinned by
 * its type (RFC 8725, section 3.1): a token is verified only with a key of
 * the algorithm its header names.
 *
 * keys_stamp tells a caller when a file changed (size, mtime, inode), so
 * that keys can be rotated without a restart. Each key is kept as PEM text
 * for libjwt. Any thread; a keys_t is immutable once loaded.
 */
#ifndef CONVERGER_GATE_KEYS_H
#define CONVERGER_GATE_KEYS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KEY_RS256, KEY_ES256 } key_alg_t;

typedef struct {
  char kid[129];
  key_alg_t alg;
  char *pem; /* SubjectPublicKeyInfo, PEM, NUL-terminated */
  size_t pem_len;
} token_key_t;

typedef struct keys_s {
  token_key_t *v;
  size_t n;
  uint64_t stamp; /* keys_stamp of the files when they were read */
} keys_t;

/* Read every file of `spec` (see above). Returns 0 with *out set (free
 * with keys_free), or -1 with the reason in `err` (errlen bytes): a file
 * that cannot be read or parsed, two keys with one kid, or no usable key.
 * Skipped JWKS keys are reported through log_warn. */
int keys_load(const char *spec, keys_t **out, char *err, size_t errlen);

void keys_free(keys_t *k);

/* The key named `kid`; with kid NULL, the only key when there is exactly
 * one. NULL when none matches. */
const token_key_t *keys_find(const keys_t *k, const char *kid);

/* A hash of the size, mtime and inode of every file of `spec` (a missing
 * file counts too), to notice a change. */
uint64_t keys_stamp(const char *spec);

/* "RS256" or "ES256". */
const char *keys_alg_name(key_alg_t alg);

/* Decode unpadded base64url `in` (n bytes) into `out` (cap bytes).
 * Returns the decoded length, or -1 when it is not base64url or does not
 * fit. */
long keys_b64url_decode(const char *in, size_t n, unsigned char *out, size_t cap);

#endif
