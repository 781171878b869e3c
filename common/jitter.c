#include "common/jitter.h"

#include <openssl/rand.h>
#include <string.h>

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void jitter_seed(jitter_rng_t *rng, uint64_t seed) {
  for (int i = 0; i < 4; i++) rng->s[i] = splitmix(&seed);
}

void jitter_seed_random(jitter_rng_t *rng) {
  uint64_t seed;
  if (RAND_bytes((unsigned char *)&seed, sizeof seed) != 1) seed = (uint64_t)(uintptr_t)rng;
  jitter_seed(rng, seed);
}

uint64_t jitter_next(jitter_rng_t *rng) {
  uint64_t *s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

int64_t jitter_range(jitter_rng_t *rng, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  uint64_t span = (uint64_t)(hi - lo) + 1;
  /* Lemire-style rejection to avoid modulo bias. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t r;
  do r = jitter_next(rng);
  while (r >= limit);
  return lo + (int64_t)(r % span);
}

int64_t jitter_exp_ceiling(int64_t base_ms, int64_t cap_ms, int attempt) {
  int64_t d = base_ms;
  for (int i = 0; i < attempt && d < cap_ms; i++) d *= 2;
  return d < cap_ms ? d : cap_ms;
}

int64_t jitter_full(jitter_rng_t *rng, int64_t base_ms, int64_t cap_ms, int attempt) {
  int64_t c = jitter_exp_ceiling(base_ms, cap_ms, attempt);
  return c > 0 ? jitter_range(rng, 0, c - 1) : 0;
}

int64_t jitter_equal(jitter_rng_t *rng, int64_t base_ms, int64_t cap_ms, int attempt) {
  int64_t c = jitter_exp_ceiling(base_ms, cap_ms, attempt);
  return c / 2 + jitter_range(rng, 0, c - c / 2);
}

int64_t jitter_decorrelated(jitter_rng_t *rng, int64_t base_ms, int64_t cap_ms, int64_t prev_ms) {
  if (cap_ms <= base_ms) return cap_ms;
  if (prev_ms < base_ms) prev_ms = base_ms;
  int64_t d = jitter_range(rng, base_ms, prev_ms * 3);
  if (d <= cap_ms) return d;
  /* Not min(cap, d): that puts every draw above the cap, about two thirds
   * of them once the previous delay nears the cap, on one millisecond. */
  return jitter_range(rng, cap_ms - (cap_ms - base_ms) / JITTER_CAP_BAND_DIV, cap_ms);
}

int64_t jitter_retry_hint(jitter_rng_t *rng, int64_t min_ms, int64_t max_ms) {
  return jitter_range(rng, min_ms, max_ms);
}
