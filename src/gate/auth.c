#include "gate/auth.h"

#include <errno.h>
#include <jwt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/config.h"
#include "core/errors.h"

typedef struct rev_s {
  struct rev_s *next;
  char jti[];
} rev_t;

#define REV_BUCKETS 1024

#define AUTH_KEYS_MAX CONFIG_KEYS_MAX /* API keys, or token secrets, in use at once */

typedef struct {
  char *v[AUTH_KEYS_MAX]; /* v[0]: the one the node signs with (secrets) */
  size_t n;
} keylist_t;

struct auth_s {
  keylist_t api_keys;
  keylist_t secrets;
  keys_t *keys;            /* RS256 / ES256 public keys; NULL: none */
  char *issuer, *audience; /* required iss / aud; NULL: not checked */
  rev_t *revoked[REV_BUCKETS];
};

void auth_free(auth_t *a);

static void keylist_free(keylist_t *l) {
  for (size_t i = 0; i < l->n; i++) {
    OPENSSL_cleanse(l->v[i], strlen(l->v[i]));
    free(l->v[i]);
  }
  l->n = 0;
}

/* `text`'s keys, separated by commas or line ends (blanks around them
 * dropped) into `out`. -CV_EINVAL when there is none or more than
 * AUTH_KEYS_MAX, or one shorter than `min_len`; -CV_ENOMEM. */
static int keylist_parse(const char *text, size_t min_len, keylist_t *out) {
  keylist_t l = {.n = 0};
  const char *key;
  size_t len;
  for (const char *p = text ? text : ""; config_key_next(&p, &key, &len);) {
    if (l.n == AUTH_KEYS_MAX || len < min_len) {
      keylist_free(&l);
      return -CV_EINVAL;
    }
    if (!(l.v[l.n] = strndup(key, len))) {
      keylist_free(&l);
      return -CV_ENOMEM;
    }
    l.n++;
  }
  if (l.n == 0) return -CV_EINVAL;
  *out = l;
  return 0;
}

auth_t *auth_new(const char *api_key, const char *secret) {
  auth_t *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  if (keylist_parse(api_key, 1, &a->api_keys) != 0 || keylist_parse(secret, 1, &a->secrets) != 0) {
    auth_free(a);
    return NULL;
  }
  return a;
}

int auth_set_api_keys(auth_t *a, const char *keys) {
  keylist_t l;
  int r = keylist_parse(keys, 1, &l);
  if (r != 0) return r;
  keylist_free(&a->api_keys);
  a->api_keys = l;
  return 0;
}

int auth_set_secrets(auth_t *a, const char *secrets, size_t min_len) {
  keylist_t l;
  int r = keylist_parse(secrets, min_len, &l);
  if (r != 0) return r;
  keylist_free(&a->secrets);
  a->secrets = l;
  return 0;
}

size_t auth_api_key_count(const auth_t *a) { return a->api_keys.n; }

size_t auth_secret_count(const auth_t *a) { return a->secrets.n; }

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
  keys_free(a->keys);
  free(a->issuer);
  free(a->audience);
  keylist_free(&a->api_keys);
  keylist_free(&a->secrets);
  free(a);
}

void auth_set_keys(auth_t *a, keys_t *keys) {
  keys_free(a->keys);
  a->keys = keys;
}

const keys_t *auth_keys(const auth_t *a) { return a->keys; }

int auth_set_claims(auth_t *a, const char *issuer, const char *audience) {
  char *i = issuer && *issuer ? strdup(issuer) : NULL;
  char *u = audience && *audience ? strdup(audience) : NULL;
  if ((issuer && *issuer && !i) || (audience && *audience && !u)) {
    free(i);
    free(u);
    return -CV_ENOMEM;
  }
  free(a->issuer);
  free(a->audience);
  a->issuer = i;
  a->audience = u;
  return 0;
}

int auth_check_api_key(const auth_t *a, const char *authorization) {
  if (!authorization || strncmp(authorization, "Bearer ", 7) != 0) return -CV_EUNAUTHORIZED;
  const char *k = authorization + 7;
  size_t n = strlen(k);
  int ok = 0;
  for (size_t i = 0; i < a->api_keys.n; i++) { /* every one compared: no early exit */
    const char *key = a->api_keys.v[i];
    ok |= strlen(key) == n && CRYPTO_memcmp(k, key, n) == 0;
  }
  return ok ? 0 : -CV_EUNAUTHORIZED;
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
  /* the node's own tokens pass its own iss / aud checks */
  if ((a->issuer && jwt_add_grant(jwt, "iss", a->issuer)) ||
      (a->audience && jwt_add_grant(jwt, "aud", a->audience)))
    goto out;
  /* convs is an array: add it through the JSON form of the grants. */
  if (strlen(convs_json) > 4000) goto out;
  snprintf(grants, sizeof grants, "{\"convs\":%s}", convs_json);
  if (jwt_add_grants_json(jwt, grants) != 0) goto out;
  /* signed with the first secret; the others still verify (a rotation) */
  const char *secret = a->secrets.v[0];
  if (jwt_set_alg(jwt, JWT_ALG_HS256, (const unsigned char *)secret, (int)strlen(secret)) != 0)
    goto out;
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
  unsigned char raw[8192 / 4 * 3 + 3];
  if (n == 0 || n > 8192) return NULL;
  long len = keys_b64url_decode(seg, n, raw, sizeof raw);
  json_t *j = len > 0 ? json_loadb((const char *)raw, (size_t)len, 0, NULL) : NULL;
  if (!json_is_object(j)) {
    json_decref(j);
    return NULL;
  }
  return j;
}

/* What a token's header says before any signature is checked. */
typedef struct {
  int jwt;       /* three base64url segments joined by dots, the first two
                    JSON objects (the third, the signature, may be empty) */
  char alg[16];  /* its "alg" ("" when missing or too long) */
  char kid[129]; /* its "kid" ("" when missing) */
  int kid_bad;   /* a kid that is not a string of at most 128 bytes */
} token_head_t;

static void token_head(const char *token, token_head_t *th) {
  memset(th, 0, sizeof *th);
  const char *d1 = strchr(token, '.');
  const char *d2 = d1 ? strchr(d1 + 1, '.') : NULL;
  if (!d2 || strspn(d2 + 1, b64url_alphabet) != strlen(d2 + 1)) return;
  json_t *h = segment_object(token, (size_t)(d1 - token));
  json_t *p = segment_object(d1 + 1, (size_t)(d2 - d1 - 1));
  if (h && p) {
    th->jwt = 1;
    const char *alg = json_string_value(json_object_get(h, "alg"));
    if (alg && strlen(alg) < sizeof th->alg) strcpy(th->alg, alg);
    json_t *kid = json_object_get(h, "kid");
    if (kid && (!json_is_string(kid) || strlen(json_string_value(kid)) >= sizeof th->kid))
      th->kid_bad = 1;
    else if (kid)
      strcpy(th->kid, json_string_value(kid));
  }
  json_decref(h);
  json_decref(p);
}

/* 1 when the token's "aud" (a string, or an array of strings) names `want`. */
static int audience_has(jwt_t *jwt, const char *want) {
  const char *one = jwt_get_grant(jwt, "aud");
  if (one) return strcmp(one, want) == 0;
  char *many = jwt_get_grants_json(jwt, "aud");
  json_t *arr = many ? json_loads(many, JSON_DECODE_ANY, NULL) : NULL;
  free(many);
  int found = 0;
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) {
    if (json_is_string(v) && strcmp(json_string_value(v), want) == 0) found = 1;
  }
  json_decref(arr);
  return found;
}

int auth_verify(const auth_t *a, const char *token, int64_t now_s, auth_token_t *out,
                const char **why) {
  jwt_t *jwt = NULL;
  memset(out, 0, sizeof *out);
  if (strlen(token) > 8192) {
    *why = "token too long";
    return -CV_EUNAUTHORIZED;
  }
  token_head_t th;
  token_head(token, &th);
  if (!th.jwt) {
    *why = "token is not a valid JWT";
    return -CV_EUNAUTHORIZED;
  }
  /* The key is chosen by the header, and its algorithm is pinned: HS256
   * with the node's secret only, RS256 and ES256 with a public key of that
   * algorithm only (RFC 8725, section 3.1), so that no public key is ever
   * used as an HMAC secret and "none" is never accepted. */
  const unsigned char *key = (const unsigned char *)a->secrets.v[0];
  size_t key_len = strlen(a->secrets.v[0]);
  jwt_alg_t want = JWT_ALG_HS256;
  if (strcmp(th.alg, "RS256") == 0 || strcmp(th.alg, "ES256") == 0) {
    const token_key_t *k = th.kid_bad ? NULL : keys_find(a->keys, th.kid[0] ? th.kid : NULL);
    if (!a->keys) {
      *why = "token alg must be HS256 (no public keys are configured)";
      return -CV_EUNAUTHORIZED;
    }
    if (!k) {
      *why = th.kid[0] || th.kid_bad ? "unknown token kid" : "token has no kid";
      return -CV_EUNAUTHORIZED;
    }
    if (strcmp(keys_alg_name(k->alg), th.alg) != 0) {
      *why = "token alg does not match its key";
      return -CV_EUNAUTHORIZED;
    }
    key = (const unsigned char *)k->pem;
    key_len = k->pem_len;
    want = k->alg == KEY_ES256 ? JWT_ALG_ES256 : JWT_ALG_RS256;
  } else if (strcmp(th.alg, "HS256") != 0) {
    *why = a->keys ? "token alg must be HS256, RS256 or ES256" : "token alg must be HS256";
    return -CV_EUNAUTHORIZED;
  }
  int decoded = jwt_decode(&jwt, token, key, (int)key_len) == 0 && jwt;
  /* HS256: the older secrets of a rotation verify too */
  for (size_t i = 1; !decoded && want == JWT_ALG_HS256 && i < a->secrets.n; i++) {
    jwt_free(jwt);
    jwt = NULL;
    decoded = jwt_decode(&jwt, token, (const unsigned char *)a->secrets.v[i],
                         (int)strlen(a->secrets.v[i])) == 0 &&
              jwt;
  }
  if (!decoded || jwt_get_alg(jwt) != want) {
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
  if (a->issuer && (!jwt_get_grant(jwt, "iss") || strcmp(jwt_get_grant(jwt, "iss"), a->issuer))) {
    *why = "token iss is not CONVERGER_TOKEN_ISSUER";
    goto out;
  }
  if (a->audience && !audience_has(jwt, a->audience)) {
    *why = "token aud does not name CONVERGER_TOKEN_AUDIENCE";
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
