/*
 * backoff: the reconnect delay policies of the client SDK (issue 3).
 *
 * One cvg_backoff_t per client. cvg_backoff_next() gives the delay before
 * the next connection attempt; cvg_backoff_reset() is called on `welcome`.
 * A server retry hint (retryAfterMs of an `error` frame, or of a 1012/1013
 * close reason) is a floor: the delay is max(hint, backoff).
 *
 * Strategies (n = attempts since the last welcome, c = min(cap, base * 2^n)):
 *   full          random in [0, c)                     (AWS "full jitter")
 *   equal         c/2 + random in [0, c/2]             (AWS "equal jitter")
 *   decorrelated  random in [base, 3 * prev], and a draw above the cap
 *                 drawn again in [cap - (cap - base) / 20, cap] (AWS's, with
 *                 the cap spread: issue 31; the reconnect-storm post-mortem's
 *                 first action item; jitter_decorrelated); the default
 *   exponential   c, no jitter                         (for experiments)
 *   additive      c + random in [0, jitter]            (the policy in the
 *                 reconnect-storm post-mortem: 250 ms, 30 s, 0-100 ms)
 *   proportional  c * random factor in [0.5, 1.5]      (the old load harness
 *                 of the admission-queue decision record)
 * Defaults: decorrelated, base 250 ms, cap 10 s (the admission-queue
 * decision record lowered the SDK cap from 30 s to 10 s).
 *
 * Not thread-safe: a client and its random source belong to one thread.
 */
#ifndef CONVERGER_CLIENT_BACKOFF_H
#define CONVERGER_CLIENT_BACKOFF_H

#include <stdint.h>

#include "converger/client.h"
#include "common/jitter.h"

typedef struct {
  cvg_backoff_strategy_t strategy;
  int64_t base_ms;   /* first ceiling; 0 = 250 */
  int64_t cap_ms;    /* largest backoff; 0 = 10 000 */
  int64_t jitter_ms; /* additive only: random part in [0, jitter]; 0 = 100 */
} cvg_backoff_options_t;

typedef struct {
  cvg_backoff_options_t opt;
  jitter_rng_t *rng; /* borrowed; outlives the backoff */
  int attempt;       /* attempts since the last reset */
  int64_t prev_ms;   /* previous backoff (decorrelated) */
} cvg_backoff_t;

/* Initialise with `opt` (NULL: defaults) and a random source the caller
 * owns and seeds (seed it for reproducible experiments and tests). */
void cvg_backoff_init(cvg_backoff_t *b, const cvg_backoff_options_t *opt, jitter_rng_t *rng);

/* Delay in ms before the next attempt, and count the attempt. `hint_ms`
 * (<= 0: none) is the server's retryAfterMs, a floor. */
int64_t cvg_backoff_next(cvg_backoff_t *b, int64_t hint_ms);

/* A welcome: the next delay starts again from the first attempt. */
void cvg_backoff_reset(cvg_backoff_t *b);

/* cvg_backoff_parse and cvg_backoff_name are declared in converger/client.h. */

#endif
