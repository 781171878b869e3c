/*
 * jitter: a seedable random source and the backoff/jitter formulas used by
 * the node (retry hints) and, later, the SDK and the simulator.
 *
 * Formulas follow "Exponential Backoff And Jitter" (AWS Architecture Blog,
 * 2015) and the action items of the reconnect-storm post-mortem:
 *   full:         random in [0, min(cap, base * 2^n))
 *   equal:        half of min(cap, base * 2^n) plus a random half
 *   decorrelated: random in [base, 3 * previous]; a draw above the cap is
 *                 drawn again in the band [cap - (cap - base) / 20, cap]
 *                 (issue 31: the AWS min(cap, ...) put about a third of
 *                 clients on the cap's one millisecond; docs/protocol.md
 *                 section 8 states the rule for every client)
 * All durations in ms. A jitter_rng_t belongs to one thread.
 */
#ifndef CONVERGER_COMMON_JITTER_H
#define CONVERGER_COMMON_JITTER_H

#include <stdint.h>

typedef struct {
  uint64_t s[4]; /* xoshiro256** state */
} jitter_rng_t;

/* Seed deterministically (same seed, same sequence). */
void jitter_seed(jitter_rng_t *rng, uint64_t seed);

/* Seed from OpenSSL's CSPRNG (a different sequence every process). */
void jitter_seed_random(jitter_rng_t *rng);

uint64_t jitter_next(jitter_rng_t *rng);

/* Uniform integer in [lo, hi] (inclusive). hi < lo returns lo. */
int64_t jitter_range(jitter_rng_t *rng, int64_t lo, int64_t hi);

/* min(cap, base * 2^attempt) without overflow (attempt >= 0). */
int64_t jitter_exp_ceiling(int64_t base_ms, int64_t cap_ms, int attempt);

int64_t jitter_full(jitter_rng_t *rng, int64_t base_ms, int64_t cap_ms, int attempt);
int64_t jitter_equal(jitter_rng_t *rng, int64_t base_ms, int64_t cap_ms, int attempt);
/* The band below the cap that a decorrelated draw above the cap is drawn
 * again in: [cap - (cap - base) / JITTER_CAP_BAND_DIV, cap] (integer
 * division). With the SDK's defaults (250 ms, 10 s: the band is 9 513 to
 * 10 000 ms) 20 keeps the mean delay of every attempt within 2.3 % of
 * min(cap, ...)'s (2.0 to 2.2 % below it from attempt 10 on), and no
 * millisecond holds more than 0.35 % of 10 000 clients at any attempt
 * (tests/unit/test_backoff.c). A wider band spreads more and lowers the
 * mean more: 10 would cost about 5 %. */
#define JITTER_CAP_BAND_DIV 20

/* Decorrelated jitter, ms: a uniform integer in [base_ms, 3 * prev_ms];
 * one above cap_ms is replaced by a uniform integer in the band above.
 * `prev_ms` is the previous delay (use base_ms for the first attempt; a
 * smaller one counts as base_ms). The result is in [base_ms, cap_ms] and
 * at most 3 * prev_ms when cap_ms >= base_ms. */
int64_t jitter_decorrelated(jitter_rng_t *rng, int64_t base_ms, int64_t cap_ms, int64_t prev_ms);

/* A server retry hint: uniform in [min_ms, max_ms] so that a burst of
 * refusals does not come back at one instant (the admission-queue decision
 * record; the reconnect-storm post-mortem's "server-driven backoff hint"). */
int64_t jitter_retry_hint(jitter_rng_t *rng, int64_t min_ms, int64_t max_ms);

#endif
