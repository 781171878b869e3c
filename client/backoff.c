#include "backoff.h"

#include <string.h>

static const char *const names[] = {
    [CVG_BACKOFF_DECORRELATED] = "decorrelated",
    [CVG_BACKOFF_FULL] = "full",
    [CVG_BACKOFF_EQUAL] = "equal",
    [CVG_BACKOFF_EXPONENTIAL] = "exponential",
    [CVG_BACKOFF_ADDITIVE] = "additive",
    [CVG_BACKOFF_PROPORTIONAL] = "proportional",
};

void cvg_backoff_init(cvg_backoff_t *b, const cvg_backoff_options_t *opt, jitter_rng_t *rng) {
  memset(b, 0, sizeof *b);
  if (opt) b->opt = *opt;
  if (b->opt.base_ms <= 0) b->opt.base_ms = 250;
  if (b->opt.cap_ms <= 0) b->opt.cap_ms = 10000;
  if (b->opt.cap_ms < b->opt.base_ms) b->opt.cap_ms = b->opt.base_ms;
  if (b->opt.jitter_ms <= 0) b->opt.jitter_ms = 100;
  b->rng = rng;
  b->prev_ms = b->opt.base_ms;
}

int64_t cvg_backoff_next(cvg_backoff_t *b, int64_t hint_ms) {
  const cvg_backoff_options_t *o = &b->opt;
  int n = b->attempt < 62 ? b->attempt : 62;
  int64_t c = jitter_exp_ceiling(o->base_ms, o->cap_ms, n);
  int64_t d;
  switch (o->strategy) {
  case CVG_BACKOFF_FULL:
    d = jitter_full(b->rng, o->base_ms, o->cap_ms, n);
    break;
  case CVG_BACKOFF_EQUAL:
    d = jitter_equal(b->rng, o->base_ms, o->cap_ms, n);
    break;
  case CVG_BACKOFF_EXPONENTIAL:
    d = c;
    break;
  case CVG_BACKOFF_ADDITIVE:
    d = c + jitter_range(b->rng, 0, o->jitter_ms);
    break;
  case CVG_BACKOFF_PROPORTIONAL:
    d = c / 2 + jitter_range(b->rng, 0, c); /* c * [0.5, 1.5] */
    break;
  case CVG_BACKOFF_DECORRELATED:
  default:
    d = jitter_decorrelated(b->rng, o->base_ms, o->cap_ms, b->prev_ms);
    break;
  }
  b->prev_ms = d > o->base_ms ? d : o->base_ms;
  b->attempt++;
  return hint_ms > d ? hint_ms : d;
}

void cvg_backoff_reset(cvg_backoff_t *b) {
  b->attempt = 0;
  b->prev_ms = b->opt.base_ms;
}

int cvg_backoff_parse(const char *name, cvg_backoff_strategy_t *out) {
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (name && strcmp(name, names[i]) == 0) {
      *out = (cvg_backoff_strategy_t)i;
      return 0;
    }
  return CVG_EINVAL;
}

const char *cvg_backoff_name(cvg_backoff_strategy_t s) {
  return (size_t)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}
