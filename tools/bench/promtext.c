/*
 * promtext.c: samples, label filters and histograms of the Prometheus
 * text format (see bench/promtext.h).
 */
#include "bench/promtext.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One sample line: the name, the text between the braces (empty when
 * none) and the value. */
typedef struct {
  const char *name, *labels;
  size_t name_len, labels_len;
  double value;
} sample_t;

/* The end of the quoted label value that starts after `q` (the opening
 * quote), at its closing quote; NULL when the line ends first. */
static const char *value_end(const char *q, const char *eol) {
  for (const char *p = q + 1; p < eol; p++) {
    if (*p == '\\' && p + 1 < eol)
      p++;
    else if (*p == '"')
      return p;
  }
  return NULL;
}

/* Parse the line [line, eol) into `s`: 1 for a sample, 0 for anything
 * else (a comment, a blank or malformed line). */
static int parse_line(const char *line, const char *eol, sample_t *s) {
  while (line < eol && (*line == ' ' || *line == '\t')) line++;
  if (line == eol || *line == '#') return 0;
  const char *p = line;
  while (p < eol && *p != '{' && *p != ' ' && *p != '\t') p++;
  s->name = line;
  s->name_len = (size_t)(p - line);
  s->labels = p;
  s->labels_len = 0;
  if (p < eol && *p == '{') {
    const char *q = p + 1;
    s->labels = q;
    while (q < eol && *q != '}') {
      if (*q == '"') {
        q = value_end(q, eol);
        if (!q) return 0;
      }
      q++;
    }
    if (q >= eol) return 0;
    s->labels_len = (size_t)(q - s->labels);
    p = q + 1;
  }
  if (s->name_len == 0 || p >= eol || (*p != ' ' && *p != '\t')) return 0;
  char *end;
  s->value = strtod(p, &end);
  return end != p;
}

/* Call `fn` for every sample of `text` named `name`. */
static void each_sample(const char *text, const char *name, void (*fn)(const sample_t *, void *),
                        void *ud) {
  size_t nl = strlen(name);
  for (const char *line = text; line && *line;) {
    const char *eol = strchr(line, '\n');
    if (!eol) eol = line + strlen(line);
    sample_t s;
    if (parse_line(line, eol, &s) && s.name_len == nl && memcmp(s.name, name, nl) == 0) fn(&s, ud);
    line = *eol ? eol + 1 : NULL;
  }
}

/* The pair `key="value"` of the labels text [p, end) that starts at p:
 * sets the key's and the whole pair's spans, returns the position after
 * the pair (and its comma), or NULL when malformed. */
static const char *next_pair(const char *p, const char *end, const char **key, size_t *key_len,
                             const char **pair, size_t *pair_len) {
  while (p < end && (*p == ' ' || *p == ',')) p++;
  if (p >= end) return NULL;
  const char *eq = memchr(p, '=', (size_t)(end - p));
  if (!eq || eq + 1 >= end || eq[1] != '"') return NULL;
  const char *close = value_end(eq + 1, end);
  if (!close) return NULL;
  *key = *pair = p;
  *key_len = (size_t)(eq - p);
  *pair_len = (size_t)(close + 1 - p);
  return close + 1;
}

/* 1 when the sample's labels hold the pair [pair, pair + len). */
static int has_pair(const sample_t *s, const char *pair, size_t len) {
  const char *p = s->labels, *end = s->labels + s->labels_len, *k, *sp;
  size_t kl, sl;
  while ((p = next_pair(p, end, &k, &kl, &sp, &sl)))
    if (sl == len && memcmp(sp, pair, len) == 0) return 1;
  return 0;
}

/* 1 when the sample has every pair of the filter `labels`. */
static int matches(const sample_t *s, const char *labels) {
  if (!labels) return 1;
  const char *p = labels, *end = labels + strlen(labels), *k, *pair;
  size_t kl, pl;
  while ((p = next_pair(p, end, &k, &kl, &pair, &pl)))
    if (!has_pair(s, pair, pl)) return 0;
  return 1;
}

typedef struct {
  const char *labels;
  double total;
  promtext_hist_t *h;
} acc_t;

static void add_value(const sample_t *s, void *ud) {
  acc_t *a = ud;
  if (matches(s, a->labels)) a->total += s->value;
}

double promtext_value(const char *text, const char *name, const char *labels) {
  acc_t a = {.labels = labels};
  each_sample(text, name, add_value, &a);
  return a.total;
}

/* Add `count` to the bucket of bound `le`, inserting it in order. */
static void bucket_add(promtext_hist_t *h, double le, double count) {
  size_t i = 0;
  while (i < h->n && h->le[i] < le) i++;
  if (i == h->n || h->le[i] != le) {
    if (h->n == PROMTEXT_BUCKETS_MAX) return;
    memmove(h->le + i + 1, h->le + i, (h->n - i) * sizeof *h->le);
    memmove(h->cum + i + 1, h->cum + i, (h->n - i) * sizeof *h->cum);
    h->le[i] = le;
    h->cum[i] = 0;
    h->n++;
  }
  h->cum[i] += count;
}

static void add_bucket(const sample_t *s, void *ud) {
  acc_t *a = ud;
  if (!matches(s, a->labels)) return;
  const char *p = s->labels, *end = s->labels + s->labels_len, *k, *pair;
  size_t kl, pl;
  while ((p = next_pair(p, end, &k, &kl, &pair, &pl))) {
    if (kl != 2 || memcmp(k, "le", 2) != 0) continue;
    const char *v = k + 4; /* after le=" */
    double le = strncmp(v, "+Inf\"", 5) == 0 ? INFINITY : strtod(v, NULL);
    bucket_add(a->h, le, s->value);
    return;
  }
}

void promtext_hist(const char *text, const char *name, const char *labels, promtext_hist_t *h) {
  memset(h, 0, sizeof *h);
  size_t nl = strlen(name);
  char *series = malloc(nl + sizeof "_bucket");
  if (!series) return;
  acc_t a = {.labels = labels, .h = h};
  memcpy(series, name, nl);
  memcpy(series + nl, "_bucket", sizeof "_bucket");
  each_sample(text, series, add_bucket, &a);
  memcpy(series + nl, "_sum", sizeof "_sum");
  h->sum = promtext_value(text, series, labels);
  memcpy(series + nl, "_count", sizeof "_count");
  h->count = promtext_value(text, series, labels);
  free(series);
}

/* The cumulative count of `h` at bound `le`: that of its largest bound at
 * or below le (0 when none), since a cumulative count only changes at a
 * bound. */
static double cum_at(const promtext_hist_t *h, double le) {
  double c = 0;
  for (size_t i = 0; i < h->n && h->le[i] <= le; i++) c = h->cum[i];
  return c;
}

void promtext_hist_add(promtext_hist_t *dst, const promtext_hist_t *src, double sign) {
  promtext_hist_t a = *dst;
  for (size_t i = 0; i < src->n; i++) bucket_add(dst, src->le[i], 0); /* the union of bounds */
  for (size_t i = 0; i < dst->n; i++)
    dst->cum[i] = cum_at(&a, dst->le[i]) + sign * cum_at(src, dst->le[i]);
  dst->sum += sign * src->sum;
  dst->count += sign * src->count;
}
