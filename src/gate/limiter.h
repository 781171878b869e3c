/*
 * limiter: a token bucket. `rate` tokens per second accrue up to `burst`;
 * each event takes one, and without one it is refused. Used for the
 * optional accept limiter of WebSocket upgrades (CONVERGER_ACCEPT_RATE:
 * HTTP 503 before any WebSocket work), a connection's frames (proto/
 * session.c: error rate_limited) and REST appends (HTTP 429).
 * The clock is the caller's (monotonic ms). Loop thread only.
 */
#ifndef CONVERGER_GATE_LIMITER_H
#define CONVERGER_GATE_LIMITER_H

#include <stdint.h>

typedef struct {
  double rate;   /* tokens per ms */
  double burst;  /* most tokens held */
  double tokens; /* tokens now */
  uint64_t last_ms;
} limiter_t;

/* `per_second` tokens a second (> 0), at most `burst` (>= 1) held; the
 * bucket starts full at `now_ms`. */
void limiter_init(limiter_t *l, double per_second, double burst, uint64_t now_ms);

/* Take one token at `now_ms`: 1, or 0 when the bucket is empty. */
int limiter_take(limiter_t *l, uint64_t now_ms);

/* ms from `now_ms` until a token is there (0: one is), for a retry hint
 * after limiter_take refused; at least 1 when it refused. */
long limiter_wait_ms(const limiter_t *l, uint64_t now_ms);

#endif
