/*
 * dburl.c: the forms of CONVERGER_DATABASE_URL (see dburl.h). Pure
 * functions, any thread; no state.
 */
#include "core/dburl.h"

#include <stdint.h>
#include <string.h>

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

const char *dburl_backend(const char *url) {
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

void dburl_redact(const char *url, char *out, size_t cap) {
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

