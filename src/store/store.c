/*
 * store.c: the store_* functions of store.h, dispatching to a backend.
 *
 * store_open reads the URL's form (store_backend_name) and calls that
 * backend's open; the store it returns carries its ops table (backend.h),
 * and every other store_* function checks its arguments here, once for all
 * backends, then calls through the table. Nothing here touches a database;
 * the frees of returned messages and strings live here too because they do
 * not depend on the backend.
 *
 * Thread: whichever thread owns the store (store.h); no state of its own.
 */
#include "store/store.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/util.h"
#include "store/backend.h"

#define BUSY_TIMEOUT_DEFAULT_MS 5000

static int has_prefix(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* libpq's keyword/value form: "keyword = value ..." (the first keyword is
 * enough to tell it from a URL; libpq itself checks the rest). */
static int is_keyword_string(const char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
  size_t n = 0;
  while ((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || s[n] == '_') n++;
  if (n == 0) return 0;
  s += n;
  while (*s == ' ' || *s == '\t') s++;
  return *s == '=';
}

const char *store_backend_name(const char *url) {
  if (url == NULL) return NULL;
  if (has_prefix(url, "sqlite:")) return url[7] != '\0' ? "sqlite" : NULL;
  if (has_prefix(url, "postgres://") || has_prefix(url, "postgresql://") || is_keyword_string(url))
    return "postgres";
  return NULL;
}

/* ---- redaction ------------------------------------------------------- */

typedef struct {
  char *p;
  size_t cap, len;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n) {
  while (n-- > 0 && b->len + 1 < b->cap) b->p[b->len++] = *s++;
  b->p[b->len] = '\0';
}

static void put_str(sbuf_t *b, const char *s) { put(b, s, strlen(s)); }

/* 1 when the key of `n` bytes at `k`, percent-decoded, names a secret
 * libpq reads (password, sslpassword). */
static int hexval(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

static int secret_key(const char *k, size_t n) {
  char key[32];
  size_t len = 0;
  for (size_t i = 0; i < n && len + 1 < sizeof key; i++) {
    int hi = i + 2 < n ? hexval(k[i + 1]) : -1, lo = i + 2 < n ? hexval(k[i + 2]) : -1;
    if (k[i] == '%' && hi >= 0 && lo >= 0) {
      key[len++] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      key[len++] = k[i];
    }
  }
  key[len] = '\0';
  return strcmp(key, "password") == 0 || strcmp(key, "sslpassword") == 0;
}

/* URL form: scheme://[user[:password]@]host.../db?param=value&... (any
 * scheme: a URL we refuse is echoed back in the error). As in libpq, the
 * user information ends at the last '@' before the first '/', so a '?' or
 * '#' in a password stays in the part that is hidden. */
static void redact_url(sbuf_t *b, const char *url) {
  const char *auth = strstr(url, "://") + 3;
  size_t alen = strcspn(auth, "/");
  const char *at = memrchr(auth, '@', alen);
  const char *colon = at != NULL ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
  const char *rest = at != NULL ? at + 1 : auth;
  if (colon != NULL) {
    put(b, url, (size_t)(colon + 1 - url));
    put_str(b, "***@");
  } else {
    put(b, url, (size_t)(rest - url));
  }
  const char *q = strchr(rest, '?');
  if (q == NULL) {
    put_str(b, rest);
    return;
  }
  put(b, rest, (size_t)(q + 1 - rest));
  for (const char *p = q + 1; *p != '\0';) {
    size_t n = strcspn(p, "&");
    size_t klen = strcspn(p, "=&");
    if (p[klen] == '=' && secret_key(p, klen)) {
      put(b, p, klen + 1);
      put_str(b, "***");
    } else {
      put(b, p, n);
    }
    p += n;
    if (*p == '&') put(b, p++, 1);
  }
}

/* Keyword form: keyword = value, value bare or '...' with \' and \\. */
static void redact_keywords(sbuf_t *b, const char *s) {
  while (*s != '\0') {
    size_t n = strspn(s, " \t\r\n");
    put(b, s, n);
    s += n;
    n = strcspn(s, " \t\r\n=");
    int secret = secret_key(s, n);
    put(b, s, n);
    s += n;
    n = strspn(s, " \t\r\n");
    put(b, s, n);
    s += n;
    if (*s != '=') continue; /* malformed: libpq will say so */
    put(b, s++, 1);
    n = strspn(s, " \t\r\n");
    put(b, s, n);
    s += n;
    const char *v = s;
    if (*s == '\'') {
      for (s++; *s != '\0' && *s != '\''; s++)
        if (*s == '\\' && s[1] != '\0') s++;
      if (*s == '\'') s++;
    } else {
      s += strcspn(s, " \t\r\n");
    }
    if (secret)
      put_str(b, "***");
    else
      put(b, v, (size_t)(s - v));
  }
}

void store_url_redact(const char *url, char *out, size_t cap) {
  if (out == NULL || cap == 0) return;
  sbuf_t b = {.p = out, .cap = cap};
  out[0] = '\0';
  if (url == NULL) return;
  if (strstr(url, "://") != NULL) /* also a URL we refuse: it is echoed back */
    redact_url(&b, url);
  else if (is_keyword_string(url))
    redact_keywords(&b, url);
  else
    put_str(&b, url);
}

/* ---- dispatch ---------------------------------------------------------- */

int store_open(const char *url, const store_options_t *opt, store_t **out) {
  if (out != NULL) *out = NULL;
  const char *name = store_backend_name(url);
  if (name == NULL || out == NULL) return -CV_EINVAL;
  store_options_t o = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 0};
  if (opt != NULL) o = *opt;
  if ((int)o.sync < STORE_SYNC_OFF || (int)o.sync > STORE_SYNC_FULL || o.busy_timeout_ms < 0)
    return -CV_EINVAL;
  if (o.busy_timeout_ms == 0) o.busy_timeout_ms = BUSY_TIMEOUT_DEFAULT_MS;
  const store_ops_t *ops = strcmp(name, "sqlite") == 0 ? &store_sqlite_ops : &store_postgres_ops;
  return ops->open(url, &o, out);
}

void store_close(store_t *s) {
  if (s != NULL) s->ops->close(s);
}

int store_migrate(store_t *s) { return s != NULL ? s->ops->migrate(s) : -CV_EINVAL; }

int store_schema_version(store_t *s) { return s != NULL ? s->ops->schema_version(s) : -CV_EINVAL; }

int store_read_begin(store_t *s) { return s != NULL ? s->ops->read_begin(s) : -CV_EINVAL; }

void store_read_end(store_t *s) {
  if (s != NULL) s->ops->read_end(s);
}

int store_ping(store_t *s) { return s != NULL ? s->ops->ping(s) : -CV_EINVAL; }

void store_set_deadline(store_t *s, uint64_t deadline_ms) {
  if (s == NULL) return;
  s->deadline_ms = deadline_ms;
  s->deadline_hit = 0;
  if (s->ops->set_deadline != NULL) s->ops->set_deadline(s, deadline_ms);
}

int store_deadline_hit(const store_t *s) { return s != NULL && s->deadline_hit; }

int store_channel_create(store_t *s, const char *id, const char *name, int presence,
                         store_channel_t *out) {
  if (s == NULL || !util_id_valid(id) || name == NULL ||
      strnlen(name, STORE_NAME_MAX + 1) > STORE_NAME_MAX)
    return -CV_EINVAL;
  return s->ops->channel_create(s, id, name, presence != 0, out);
}

int store_channel_get(store_t *s, const char *id, store_channel_t *out) {
  if (s == NULL || !util_id_valid(id)) return -CV_EINVAL;
  return s->ops->channel_get(s, id, out);
}

int store_channel_set_active(store_t *s, const char *id, int active, store_channel_t *out) {
  if (s == NULL || !util_id_valid(id)) return -CV_EINVAL;
  return s->ops->channel_set_active(s, id, active != 0, out);
}

int store_conv_create(store_t *s, const char *id, const char *channel, store_conv_t *out) {
  if (s == NULL || !util_id_valid(id) || !util_id_valid(channel)) return -CV_EINVAL;
  return s->ops->conv_create(s, id, channel, out);
}

int store_conv_get(store_t *s, const char *id, store_conv_t *out) {
  if (s == NULL || !util_id_valid(id)) return -CV_EINVAL;
  return s->ops->conv_get(s, id, out);
}

int store_append(store_t *s, const char *conv, const char *id, const char *sender, const char *body,
                 int64_t ts_ms, store_msg_t *out, int *created) {
  if (out != NULL) memset(out, 0, sizeof *out);
  if (created != NULL) *created = 0;
  if (s == NULL || !util_id_valid(conv) || !util_id_valid(id) || sender == NULL || body == NULL ||
      out == NULL || created == NULL)
    return -CV_EINVAL;
  return s->ops->append(s, conv, id, sender, body, ts_ms, out, created);
}

int store_replay(store_t *s, const char *conv, int64_t after, int64_t upto, int limit,
                 size_t max_bytes, store_msg_t **msgs, size_t *n) {
  if (msgs != NULL) *msgs = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || !util_id_valid(conv) || msgs == NULL || n == NULL) return -CV_EINVAL;
  if (limit < 1) limit = 1;
  if (limit > STORE_REPLAY_PAGE_MAX) limit = STORE_REPLAY_PAGE_MAX;
  if (upto < 0) upto = INT64_MAX;
  return s->ops->replay(s, conv, after, upto, limit, max_bytes, msgs, n);
}

int store_epoch_rotate(store_t *s, const char *conv, int64_t *count) {
  int64_t n = 0;
  if (count != NULL) *count = 0;
  if (s == NULL || (conv != NULL && !util_id_valid(conv))) return -CV_EINVAL;
  int err = s->ops->epoch_rotate(s, conv, &n);
  if (!err && count != NULL) *count = n;
  return err;
}

int store_revoke(store_t *s, const char *jti, int64_t exp_s) {
  if (s == NULL || jti == NULL || jti[0] == '\0') return -CV_EINVAL;
  return s->ops->revoke(s, jti, exp_s);
}

int store_revocations(store_t *s, int64_t now_s, char ***jtis, size_t *n) {
  if (jtis != NULL) *jtis = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || jtis == NULL || n == NULL) return -CV_EINVAL;
  return s->ops->revocations(s, now_s, jtis, n);
}

static int node_state_valid(const char *state) {
  return state != NULL && (strcmp(state, "ready") == 0 || strcmp(state, "draining") == 0);
}

int store_node_beat(store_t *s, const char *id, const char *public_url, const char *state,
                    int64_t connections, int64_t waiters, int64_t now_ms) {
  if (s == NULL || id == NULL || id[0] == '\0' || strnlen(id, STORE_ID_MAX + 1) > STORE_ID_MAX ||
      public_url == NULL || public_url[0] == '\0' ||
      strnlen(public_url, STORE_URL_MAX + 1) > STORE_URL_MAX || !node_state_valid(state) ||
      connections < 0 || waiters < 0)
    return -CV_EINVAL;
  return s->ops->node_beat(s, id, public_url, state, connections, waiters, now_ms);
}

int store_nodes_live(store_t *s, int64_t now_ms, int64_t max_age_ms, store_node_t **out,
                     size_t *n) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || out == NULL || n == NULL || max_age_ms < 0) return -CV_EINVAL;
  int64_t since = now_ms >= INT64_MIN + max_age_ms ? now_ms - max_age_ms : INT64_MIN;
  return s->ops->nodes_live(s, since, out, n);
}

/* ---- results ------------------------------------------------------------ */

void store_msg_clear(store_msg_t *m) {
  if (m == NULL) return;
  free(m->sender);
  free(m->body);
  memset(m, 0, sizeof *m);
}

void store_msgs_free(store_msg_t *msgs, size_t n) {
  if (msgs == NULL) return;
  for (size_t i = 0; i < n; i++) store_msg_clear(&msgs[i]);
  free(msgs);
}

void store_strings_free(char **v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

void store_nodes_free(store_node_t *v) { free(v); }

void store_copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}
