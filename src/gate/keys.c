#include "gate/keys.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "core/log.h"

#define KEYS_MAX      64
#define KEY_FILE_MAX  (256 * 1024)
#define KEY_PARAM_MAX 1024 /* bytes of a decoded n, e, x or y (an RSA-8192 modulus) */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

const char *keys_alg_name(key_alg_t alg) { return alg == KEY_ES256 ? "ES256" : "RS256"; }

long keys_b64url_decode(const char *in, size_t n, unsigned char *out, size_t cap) {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  if (n % 4 == 1 || n / 4 * 3 + 3 > cap + 3 || n > 65536) return -1;
  char *b64 = malloc(n + 4);
  unsigned char *raw = malloc(n / 4 * 3 + 3);
  long len = -1;
  if (!b64 || !raw) goto out;
  for (size_t i = 0; i < n; i++) {
    if (!in[i] || !strchr(alphabet, in[i])) goto out;
    b64[i] = in[i] == '-' ? '+' : in[i] == '_' ? '/' : in[i];
  }
  size_t want = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0), m = n;
  while (m % 4) b64[m++] = '=';
  if (want > cap || EVP_DecodeBlock(raw, (unsigned char *)b64, (int)m) < (int)want) goto out;
  memcpy(out, raw, want);
  len = (long)want;
out:
  free(b64);
  free(raw);
  return len;
}

/* The PEM text of `pkey`'s public key (heap, NUL-terminated), or NULL. */
static char *pubkey_pem(EVP_PKEY *pkey, size_t *len) {
  BIO *bio = BIO_new(BIO_s_mem());
  char *pem = NULL;
  if (bio && PEM_write_bio_PUBKEY(bio, pkey) == 1) {
    char *data;
    long n = BIO_get_mem_data(bio, &data);
    if (n > 0 && (pem = malloc((size_t)n + 1))) {
      memcpy(pem, data, (size_t)n);
      pem[n] = '\0';
      *len = (size_t)n;
    }
  }
  BIO_free(bio);
  return pem;
}

/* The algorithm `pkey` is pinned to: RSA -> RS256, P-256 -> ES256; -1
 * for any other key. */
static int pkey_alg(EVP_PKEY *pkey) {
  if (EVP_PKEY_is_a(pkey, "RSA")) return KEY_RS256;
  if (EVP_PKEY_is_a(pkey, "EC")) {
    char group[64] = "";
    size_t glen = 0;
    if (EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group,
                                       &glen) == 1 &&
        (strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0))
      return KEY_ES256;
  }
  return -1;
}

/* A JWK's base64url member `name`, decoded into raw (cap bytes): its
 * length, or -1 when missing or bad. */
static long jwk_bytes(json_t *jwk, const char *name, unsigned char *raw, size_t cap) {
  const char *v = json_string_value(json_object_get(jwk, name));
  return v ? keys_b64url_decode(v, strlen(v), raw, cap) : -1;
}

/* An EVP_PKEY from one JWK (RSA or P-256), or NULL with `why` set. */
static EVP_PKEY *jwk_pkey(json_t *jwk, const char **why) {
  const char *kty = json_string_value(json_object_get(jwk, "kty"));
  unsigned char a[KEY_PARAM_MAX], b[KEY_PARAM_MAX];
  unsigned char point[65] = {0x04}; /* EC: uncompressed 04 || x || y (SEC 1, 2.3.3); the
                                       builder keeps a pointer to it until to_param */
  long na, nb;
  EVP_PKEY *pkey = NULL;
  OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
  OSSL_PARAM *params = NULL;
  BIGNUM *n = NULL, *e = NULL;
  EVP_PKEY_CTX *ctx = NULL;
  *why = "not an RSA or P-256 public key";
  if (!bld || !kty) goto out;
  if (strcmp(kty, "RSA") == 0) {
    na = jwk_bytes(jwk, "n", a, sizeof a);
    nb = jwk_bytes(jwk, "e", b, sizeof b);
    *why = "an RSA key needs base64url \"n\" and \"e\"";
    if (na <= 0 || nb <= 0) goto out;
    n = BN_bin2bn(a, (int)na, NULL);
    e = BN_bin2bn(b, (int)nb, NULL);
    if (!n || !e || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) ||
        !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e))
      goto out;
    ctx = EVP_PKEY_CTX_new_from_name(NULL, "RSA", NULL);
  } else if (strcmp(kty, "EC") == 0) {
    const char *crv = json_string_value(json_object_get(jwk, "crv"));
    *why = "an EC key must be on crv P-256";
    if (!crv || strcmp(crv, "P-256") != 0) goto out;
    na = jwk_bytes(jwk, "x", a, sizeof a);
    nb = jwk_bytes(jwk, "y", b, sizeof b);
    *why = "a P-256 key needs base64url \"x\" and \"y\" of 32 bytes";
    if (na != 32 || nb != 32) goto out;
    memcpy(point + 1, a, 32);
    memcpy(point + 33, b, 32);
    if (!OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) ||
        !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point, sizeof point))
      goto out;
    ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
  } else {
    goto out;
  }
  *why = "OpenSSL refused the key";
  params = OSSL_PARAM_BLD_to_param(bld);
  if (!ctx || !params || EVP_PKEY_fromdata_init(ctx) != 1 ||
      EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1)
    pkey = NULL;
out:
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(bld);
  BN_free(n);
  BN_free(e);
  return pkey;
}

static int add_key(keys_t *k, const char *kid, EVP_PKEY *pkey, char *err, size_t errlen,
                   const char *path) {
  int alg = pkey_alg(pkey);
  if (alg < 0) {
    set_err(err, errlen, "%s: key %s is neither RSA nor P-256", path, kid);
    return -1;
  }
  if (!util_id_valid(kid)) {
    set_err(err, errlen, "%s: kid \"%.60s\" must match [A-Za-z0-9._:-]{1,128}", path, kid);
    return -1;
  }
  if (keys_find(k, kid)) {
    set_err(err, errlen, "%s: a second key with kid %s", path, kid);
    return -1;
  }
  if (k->n == KEYS_MAX) {
    set_err(err, errlen, "more than %d public keys", KEYS_MAX);
    return -1;
  }
  token_key_t *key = &k->v[k->n];
  memset(key, 0, sizeof *key);
  snprintf(key->kid, sizeof key->kid, "%s", kid);
  key->alg = (key_alg_t)alg;
  if (!(key->pem = pubkey_pem(pkey, &key->pem_len))) {
    set_err(err, errlen, "%s: cannot encode key %s", path, kid);
    return -1;
  }
  k->n++;
  return 0;
}

/* The file's bytes (heap, NUL-terminated), or NULL with err set. */
static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    set_err(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(KEY_FILE_MAX + 1);
  size_t n = buf ? fread(buf, 1, KEY_FILE_MAX + 1, f) : 0;
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad || n > KEY_FILE_MAX) {
    set_err(err, errlen, "%s: %s", path, !buf ? "out of memory" : bad ? "read error" : "too large");
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

static int load_jwks(keys_t *k, const char *path, const char *text, size_t len, char *err,
                     size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loadb(text, len, 0, &jerr);
  json_t *arr = json_object_get(root, "keys");
  if (!json_is_array(arr)) {
    set_err(err, errlen, "%s: not a JWKS (an object with a \"keys\" array)%s%s", path,
            root ? "" : ": ", root ? "" : jerr.text);
    json_decref(root);
    return -1;
  }
  size_t i;
  json_t *jwk;
  int r = 0;
  json_array_foreach(arr, i, jwk) {
    const char *kid = json_string_value(json_object_get(jwk, "kid"));
    const char *use = json_string_value(json_object_get(jwk, "use"));
    const char *alg = json_string_value(json_object_get(jwk, "alg"));
    const char *why;
    if (!kid) {
      log_warn("token keys: %s: key %zu has no kid; skipped", path, i);
      continue;
    }
    if (use && strcmp(use, "sig") != 0) {
      log_warn("token keys: %s: key %s is for \"%s\", not signatures; skipped", path, kid, use);
      continue;
    }
    EVP_PKEY *pkey = jwk_pkey(jwk, &why);
    if (!pkey) {
      log_warn("token keys: %s: key %s: %s; skipped", path, kid, why);
      continue;
    }
    int pinned = pkey_alg(pkey);
    if (alg && (pinned < 0 || strcmp(alg, keys_alg_name((key_alg_t)pinned)) != 0)) {
      log_warn("token keys: %s: key %s says alg %s, which its type does not sign; skipped", path,
               kid, alg);
      EVP_PKEY_free(pkey);
      continue;
    }
    r = add_key(k, kid, pkey, err, errlen, path);
    EVP_PKEY_free(pkey);
    if (r != 0) break;
  }
  json_decref(root);
  return r;
}

static int load_pem(keys_t *k, const char *path, const char *text, size_t len, char *err,
                    size_t errlen) {
  BIO *bio = BIO_new_mem_buf(text, (int)len);
  EVP_PKEY *pkey = bio ? PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL) : NULL;
  BIO_free(bio);
  if (!pkey) {
    set_err(err, errlen, "%s: not a PEM public key (-----BEGIN PUBLIC KEY-----)", path);
    return -1;
  }
  /* kid: the file name without its directory and extension */
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char kid[129];
  snprintf(kid, sizeof kid, "%s", base);
  char *dot = strrchr(kid, '.');
  if (dot && dot != kid) *dot = '\0';
  int r = add_key(k, kid, pkey, err, errlen, path);
  EVP_PKEY_free(pkey);
  return r;
}

/* Call fn for each comma-separated, non-empty item of spec. */
static int each_path(const char *spec, int (*fn)(const char *path, void *ud), void *ud) {
  const char *p = spec;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    char path[4096];
    if (n > 0 && n < sizeof path) {
      memcpy(path, p, n);
      path[n] = '\0';
      int r = fn(path, ud);
      if (r != 0) return r;
    }
    p += n + (comma ? 1 : 0);
  }
  return 0;
}

typedef struct {
  keys_t *k;
  char *err;
  size_t errlen;
} load_ctx_t;

static int load_one(const char *path, void *ud) {
  load_ctx_t *x = ud;
  size_t len = 0;
  char *text = read_file(path, &len, x->err, x->errlen);
  if (!text) return -1;
  size_t pl = strlen(path);
  int r = pl > 5 && strcmp(path + pl - 5, ".json") == 0
              ? load_jwks(x->k, path, text, len, x->err, x->errlen)
              : load_pem(x->k, path, text, len, x->err, x->errlen);
  free(text);
  return r;
}

int keys_load(const char *spec, keys_t **out, char *err, size_t errlen) {
  keys_t *k = calloc(1, sizeof *k);
  if (k) k->v = calloc(KEYS_MAX, sizeof *k->v);
  if (!k || !k->v) {
    keys_free(k);
    set_err(err, errlen, "out of memory");
    return -1;
  }
  k->stamp = keys_stamp(spec);
  load_ctx_t x = {k, err, errlen};
  if (each_path(spec, load_one, &x) != 0) {
    keys_free(k);
    return -1;
  }
  if (k->n == 0) {
    set_err(err, errlen, "no usable public key in \"%s\"", spec);
    keys_free(k);
    return -1;
  }
  *out = k;
  return 0;
}

void keys_free(keys_t *k) {
  if (!k) return;
  for (size_t i = 0; i < k->n; i++) free(k->v[i].pem);
  free(k->v);
  free(k);
}

const token_key_t *keys_find(const keys_t *k, const char *kid) {
  if (!k) return NULL;
  if (!kid) return k->n == 1 ? &k->v[0] : NULL;
  for (size_t i = 0; i < k->n; i++)
    if (strcmp(k->v[i].kid, kid) == 0) return &k->v[i];
  return NULL;
}

static int stamp_one(const char *path, void *ud) {
  uint64_t *h = ud;
  struct stat st;
  uint64_t v[4] = {0};
  if (stat(path, &st) == 0) {
    v[0] = (uint64_t)st.st_size;
    v[1] = (uint64_t)st.st_mtim.tv_sec;
    v[2] = (uint64_t)st.st_mtim.tv_nsec;
    v[3] = (uint64_t)st.st_ino;
  }
  for (int i = 0; i < 4; i++) *h = (*h ^ v[i]) * 1099511628211ull; /* FNV-1a over the words */
  return 0;
}

uint64_t keys_stamp(const char *spec) {
  uint64_t h = 14695981039346656037ull;
  each_path(spec, stamp_one, &h);
  return h;
}
