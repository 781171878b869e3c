#include "gate/auth.h"

#include <errno.h>
#include <jwt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "common/util.h"

typedef struct rev_s {
  struct rev_s *next;
  char jti[];
} rev_t;

#define REV_BUCKETS 1024

struct auth_s {
  char *api_key;
  unsigned char *secret;
  size_t secret_len;
  rev_t *revoked[REV_BUCKETS];
};

void auth_free(auth_t *a);

auth_t *auth_new(const char *api_key, const char *secret) {
  auth_t *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->api_key = strdup(api_key);
  a->secret = (unsigned char *)strdup(secret);
  a->secret_len = strlen(secret);
  if (!a->api_key || !a->secret) {
    auth_free(a);
    return NULL;
  }
  return a;
}

static void clear_revoked(auth_t *a) {
  for (size_t i = 0; i < REV_BUCKETS; i++) {
    rev_t *r = a->revoked[i];
    while (r) {
      rev_t *n = r->next;
      free(r);
      r = n;
    }
    a->revoked[i] = NULL;
  }
}

void auth_free(auth_t *a) {
  if (!a) return;
  clear_revoked(a);
  free(a->api_key);
  free(a->secret);
  free(a);
}

int auth_check_api_key(const auth_t *a, const char *authorization) {
  if (!authorization || strncmp(authorization, "Bearer ", 7) != 0) return -CV_EUNAUTHORIZED;
  const char *k = authorization + 7;
  size_t n = strlen(k), m = strlen(a->api_key);
  if (n != m || CRYPTO_memcmp(k, a->api_key, n) != 0) return -CV_EUNAUTHORIZED;
  return 0;
}

int auth_sign(const auth_t *a, const char *sub, json_t *convs, int64_t now_s, int64_t ttl_s,
              char **token, char jti[37], int64_t *exp_s) {
  jwt_t *jwt = NULL;
  int r = -CV_EINVAL;
  char *convs_json = json_dumps(convs, JSON_COMPACT);
  util_uuid(jti);
  *exp_s = now_s + ttl_s;
  if (!convs_json || jwt_new(&jwt) != 0) goto out;
  char grants[64 + 4096];
  if (jwt_add_grant(jwt, "sub", sub) || jwt_add_grant(jwt, "jti", jti) ||
      jwt_add_grant_int(jwt, "iat", (long)now_s) || jwt_add_grant_int(jwt, "exp", (long)*exp_s))
    goto out;
  /* convs is an array: add it through the JSON form of the grants. */
  if (strlen(convs_json) > 4000) goto out;
  snprintf(grants, sizeof grants, "{\"convs\":%s}", convs_json);
  if (jwt_add_grants_json(jwt, grants) != 0) goto out;
  if (jwt_set_alg(jwt, JWT_ALG_HS256, a->secret, (int)a->secret_len) != 0) goto out;
  *token = jwt_encode_str(jwt);
  r = *token ? 0 : -CV_ENOMEM;
out:
  free(convs_json);
  jwt_free(jwt);
  return r;
}

static const char b64url_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* The JSON object in the base64url (unpadded) segment seg[0..n), or NULL
 * when it is not one. The caller owns the reference. */
static json_t *segment_object(const char *seg, size_t n) {
  if (n == 0 || n % 4 == 1 || n > 8192) return NULL;
  char b64[8192 + 4];
  for (size_t i = 0; i < n; i++) {
    if (!seg[i] || !strchr(b64url_alphabet, seg[i])) return NULL;
    b64[i] = seg[i] == '-' ? '+' : seg[i] == '_' ? '/' : seg[i];
  }
  size_t len = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0); /* the decoded bytes, without padding */
  while (n % 4) b64[n++] = '=';
  unsigned char raw[8192 / 4 * 3 + 3];
  if (EVP_DecodeBlock(raw, (unsigned char *)b64, (int)n) < (int)len) return NULL;
  json_t *j = json_loadb((const char *)raw, len, 0, NULL);
  if (!json_is_object(j)) {
    json_decref(j);
    return NULL;
  }
  return j;
}

typedef enum { TOKEN_NOT_JWT, TOKEN_BAD_ALG, TOKEN_HS256 } token_shape_t;

/* What `token` is before any signature is checked: not a JWT at all (not
 * three base64url segments joined by dots, the first two JSON objects; the
 * third, the signature, may be empty), a JWT whose header's alg is not exactly HS256,
 * or an HS256 JWT. */
static token_shape_t token_shape(const char *token) {
  const char *d1 = strchr(token, '.');
  const char *d2 = d1 ? strchr(d1 + 1, '.') : NULL;
  if (!d2 || strspn(d2 + 1, b64url_alphabet) != strlen(d2 + 1)) return TOKEN_NOT_JWT;
  json_t *h = segment_object(token, (size_t)(d1 - token));
  json_t *p = segment_object(d1 + 1, (size_t)(d2 - d1 - 1));
  token_shape_t shape = TOKEN_NOT_JWT;
  if (h && p) {
    const char *alg = json_string_value(json_object_get(h, "alg"));
    shape = alg && strcmp(alg, "HS256") == 0 ? TOKEN_HS256 : TOKEN_BAD_ALG;
  }
  json_decref(h);
  json_decref(p);
  return shape;
}

int auth_verify(const auth_t *a, const char *token, int64_t now_s, auth_token_t *out,
                const char **why) {
  jwt_t *jwt = NULL;
  memset(out, 0, sizeof *out);
  if (strlen(token) > 8192) {
    *why = "token too long";
    return -CV_EUNAUTHORIZED;
  }
  switch (token_shape(token)) {
  case TOKEN_NOT_JWT:
    *why = "token is not a valid JWT";
    return -CV_EUNAUTHORIZED;
  case TOKEN_BAD_ALG:
    *why = "token alg must be HS256";
    return -CV_EUNAUTHORIZED;
  case TOKEN_HS256:
    break;
  }
  if (jwt_decode(&jwt, token, a->secret, (int)a->secret_len) != 0 || !jwt ||
      jwt_get_alg(jwt) != JWT_ALG_HS256) {
    *why = "bad token signature";
    jwt_free(jwt);
    return -CV_EUNAUTHORIZED;
  }
  /* Read the claims from libjwt's parsed grants; only the arrays go
   * through JSON text again. */
  int r = -CV_EUNAUTHORIZED;
  errno = 0;
  long exp_v = jwt_get_grant_int(jwt, "exp"); /* integers only; else ENOENT */
  json_t *exp = errno == 0 ? json_integer(exp_v) : NULL;
  const char *sub = jwt_get_grant(jwt, "sub");
  const char *jti = jwt_get_grant(jwt, "jti");
  char *convs_s = jwt_get_grants_json(jwt, "convs");
  char *scope_s = jwt_get_grants_json(jwt, "scope");
  json_t *convs = convs_s ? json_loads(convs_s, JSON_DECODE_ANY, NULL) : NULL;
  json_t *scope = scope_s ? json_loads(scope_s, JSON_DECODE_ANY, NULL) : NULL;
  free(convs_s);
  free(scope_s);
  if (!json_is_integer(exp)) {
    *why = "token has no exp";
    goto out;
  }
  if (json_integer_value(exp) <= now_s) {
    *why = "token expired";
    goto out;
  }
  if (!util_id_valid(sub)) {
    *why = "token sub must be an id";
    goto out;
  }
  /* jti is required (docs/protocol.md, section 11): without it a token
   * could never be revoked. */
  if (!jti || !*jti || strlen(jti) > STORE_ID_MAX) {
    *why = "token jti must be a string of 1 to 128 bytes";
    goto out;
  }
  if (!json_is_array(convs)) {
    *why = "token has no convs";
    goto out;
  }
  size_t i;
  json_t *v;
  json_array_foreach(convs, i, v) {
    const char *c = json_string_value(v);
    if (!c) {
      *why = "token convs must be strings";
      goto out;
    }
    if (strcmp(c, "*") == 0) out->all_convs = 1;
  }
  out->can_read = out->can_write = 1;
  if (scope) {
    if (!json_is_array(scope)) {
      *why = "token scope must be an array";
      goto out;
    }
    out->can_read = out->can_write = 0;
    json_array_foreach(scope, i, v) {
      const char *s = json_string_value(v);
      if (s && strcmp(s, "read") == 0) out->can_read = 1;
      if (s && strcmp(s, "write") == 0) out->can_write = 1;
    }
  }
  strcpy(out->sub, sub);
  strcpy(out->jti, jti);
  out->exp_s = json_integer_value(exp);
  out->convs = json_incref(convs);
  r = 0;
out:
  json_decref(exp);
  json_decref(convs);
  json_decref(scope);
  jwt_free(jwt);
  return r;
}

void auth_token_clear(auth_token_t *t) {
  json_decref(t->convs);
  t->convs = NULL;
}

int auth_token_allows(const auth_token_t *t, const char *conv) {
  if (t->all_convs) return 1;
  size_t i;
  json_t *v;
  json_array_foreach(t->convs, i, v) {
    if (strcmp(json_string_value(v), conv) == 0) return 1;
  }
  return 0;
}

static size_t bucket(const char *s) {
  size_t h = 5381;
  while (*s) h = h * 33 + (unsigned char)*s++;
  return h % REV_BUCKETS;
}

int auth_is_revoked(const auth_t *a, const char *jti) {
  if (!jti || !*jti) return 0;
  for (rev_t *r = a->revoked[bucket(jti)]; r; r = r->next)
    if (strcmp(r->jti, jti) == 0) return 1;
  return 0;
}

void auth_add_revoked(auth_t *a, const char *jti) {
  if (auth_is_revoked(a, jti)) return;
  size_t n = strlen(jti);
  rev_t *r = malloc(sizeof *r + n + 1);
  if (!r) return;
  memcpy(r->jti, jti, n + 1);
  size_t b = bucket(jti);
  r->next = a->revoked[b];
  a->revoked[b] = r;
}

void auth_set_revoked(auth_t *a, char **jtis, size_t n) {
  clear_revoked(a);
  for (size_t i = 0; i < n; i++) auth_add_revoked(a, jtis[i]);
}
