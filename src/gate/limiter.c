#include "gate/limiter.h"

void limiter_init(limiter_t *l, double per_second, double burst, uint64_t now_ms) {
  l->rate = per_second / 1000.0;
  l->burst = burst >= 1 ? burst : 1;
  l->tokens = l->burst;
  l->last_ms = now_ms;
}

int limiter_take(limiter_t *l, uint64_t now_ms) {
  if (now_ms > l->last_ms) {
    l->tokens += (double)(now_ms - l->last_ms) * l->rate;
    if (l->tokens > l->burst) l->tokens = l->burst;
    l->last_ms = now_ms;
  }
  if (l->tokens < 1) return 0;
  l->tokens -= 1;
  return 1;
}

long limiter_wait_ms(const limiter_t *l, uint64_t now_ms) {
  double tokens = l->tokens;
  if (now_ms > l->last_ms) tokens += (double)(now_ms - l->last_ms) * l->rate;
  if (tokens >= 1) return 0;
  long ms = (long)((1 - tokens) / l->rate + 0.999);
  return ms > 0 ? ms : 1;
}
