/*
 * auth: the API key for REST/admin, client tokens (JWT, libjwt) and the
 * node's revocation cache.
 *
 * Token verification happens in memory. The header chooses the key and the
 * key pins the algorithm (RFC 8725, section 3.1): HS256 with the node's
 * secret, RS256 or ES256 with the public key its `kid` names
 * (gate/keys.h, CONVERGER_TOKEN_PUBLIC_KEYS); "none" and every other
 * algorithm are refused before libjwt checks the signature. `exp` and `jti`
 * are required, `iss` and `aud` when configured, and the jti must not be in
 * the revocation cache (auth_is_revoked). Loop thread: auth_verify and the
 * node's auth_sign read the keys, API keys and secrets that auth_set_*
 * replace (another process, such as `converger token`, may sign with its
 * own auth_t).
 */
#ifndef CONVERGER_GATE_AUTH_H
#define CONVERGER_GATE_AUTH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gate/keys.h"
#include "store/store.h"

typedef struct auth_s auth_t;

typedef struct {
  char sub[STORE_ID_MAX + 1];
  char jti[STORE_ID_MAX + 1];
  int64_t exp_s; /* Unix seconds */
  int all_convs; /* convs was ["*"] */
  json_t *convs; /* owned array of strings; auth_token_clear releases it */
  int can_read;
  int can_write;
} auth_token_t;

/* New auth state with copies of `api_key` and `secret`, each one key or
 * several separated by commas or line ends (a rotation: every API key is
 * accepted; tokens are signed with the first secret and verified with
 * any). NULL on OOM or when either holds no key. */
auth_t *auth_new(const char *api_key, const char *secret);

/* Replace the API keys, or the HS256 secrets (each at least `min_len`
 * bytes), with those of `text` (the forms of auth_new), for a rotation
 * without a restart (SIGHUP re-reads the data directory's files). 0, or
 * -CV_EINVAL (none, more than 8, one too short: the old ones stay) or
 * -CV_ENOMEM. Loop thread. */
int auth_set_api_keys(auth_t *a, const char *text);
int auth_set_secrets(auth_t *a, const char *text, size_t min_len);
size_t auth_api_key_count(const auth_t *a);
size_t auth_secret_count(const auth_t *a);
void auth_free(auth_t *a);

/* 0 when `authorization` is "Bearer <api key>" for one of the API keys
 * (constant-time compares, every key compared), else -CV_EUNAUTHORIZED.
 * NULL means the header was missing. */
int auth_check_api_key(const auth_t *a, const char *authorization);

/* Use `keys` (taken; NULL: none) for RS256 / ES256 tokens from now on; the
 * previous keys are freed. Loop thread. */
void auth_set_keys(auth_t *a, keys_t *keys);
/* The keys in use (NULL: none). */
const keys_t *auth_keys(const auth_t *a);
/* Require `issuer` as every token's iss and `audience` among its aud
 * (NULL or "": not checked); auth_sign adds them to the node's tokens.
 * 0 or -CV_ENOMEM. */
int auth_set_claims(auth_t *a, const char *issuer, const char *audience);

/* Sign a token for `sub` with `convs` (borrowed array of ids or ["*"]),
 * expiring ttl_s seconds after now_s. On success *token is a heap string
 * (caller frees), `jti` gets a new random id. */
int auth_sign(const auth_t *a, const char *sub, json_t *convs, int64_t now_s, int64_t ttl_s,
              char **token, char jti[37], int64_t *exp_s);

/* Verify `token` at now_s. Returns 0 and fills `out` (clear with
 * auth_token_clear), or -CV_EUNAUTHORIZED with *why set to a static
 * message: "token is not a valid JWT" when it is not three base64url
 * segments whose first two are JSON objects, "token alg must be HS256"
 * (with public keys: "HS256, RS256 or ES256") for a JWT with another or no
 * alg, "unknown token kid", "token has no kid" (several keys),
 * "token alg does not match its key", then the signature's and the
 * claims' reasons. Does not look at the revocation cache. Loop thread. */
int auth_verify(const auth_t *a, const char *token, int64_t now_s, auth_token_t *out,
                const char **why);
void auth_token_clear(auth_token_t *t);

/* 1 when the token covers conversation `conv`. */
int auth_token_allows(const auth_token_t *t, const char *conv);

/* Revocation cache (loop thread). */
int auth_is_revoked(const auth_t *a, const char *jti);
void auth_add_revoked(auth_t *a, const char *jti);
/* Replace the cache with `jtis` (borrowed). */
void auth_set_revoked(auth_t *a, char **jtis, size_t n);

#endif
