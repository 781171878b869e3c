/*
 * spread.c: reconnectTo by water-filling among the concurrent drainers
 * (see spread.h for the rule and its reason).
 *
 * Owns three arrays of npeers. Invariants: total == sum of budget; tree is
 * the Fenwick tree of budget; budget[i] >= 0.
 */
#include "gate/spread.h"

#include <stdlib.h>
#include <string.h>

#define MILLI 1000 /* budget units per client */

static void tree_add(spread_t *s, size_t i, int64_t v) {
  for (size_t j = i + 1; j <= s->n; j += j & (~j + 1)) s->tree[j] += v;
}

/* The peer whose budget covers point `r` in [0, total): the smallest i
 * with budget[0] + ... + budget[i] > r. */
static size_t tree_find(const spread_t *s, int64_t r) {
  size_t pos = 0, step = 1;
  while (step * 2 <= s->n) step *= 2;
  for (; step; step /= 2)
    if (pos + step <= s->n && s->tree[pos + step] <= r) {
      pos += step;
      r -= s->tree[pos];
    }
  return pos; /* 1-based pos + 1, so 0-based pos */
}

int spread_init(spread_t *s, const int64_t *peer_load, size_t npeers, int64_t my_conns,
                int64_t draining_conns) {
  memset(s, 0, sizeof *s);
  if (my_conns < 0 || draining_conns < 0 || (npeers > 0 && !peer_load)) return -1;
  if (npeers == 0) return 0;
  s->load = malloc(npeers * sizeof *s->load);
  s->budget = calloc(npeers, sizeof *s->budget);
  s->tree = calloc(npeers + 1, sizeof *s->tree);
  if (!s->load || !s->budget || !s->tree) {
    spread_free(s);
    return -1;
  }
  s->n = npeers;
  double sum = 0;
  for (size_t i = 0; i < npeers; i++) {
    if (peer_load[i] < 0) {
      spread_free(s);
      return -1;
    }
    s->load[i] = peer_load[i];
    sum += (double)peer_load[i];
  }
  double d = (double)(draining_conns > my_conns ? draining_conns : my_conns);
  s->target = (sum + d) / (double)npeers;
  double share = d > 0 ? (double)my_conns / d : 0;
  for (size_t i = 0; i < npeers; i++) {
    double deficit = s->target - (double)s->load[i];
    if (deficit <= 0) continue;
    s->deficits++;
    s->budget[i] = (int64_t)(deficit * share * MILLI);
    s->total += s->budget[i];
    s->tree[i + 1] = s->budget[i];
  }
  for (size_t i = 1; i <= npeers; i++) { /* O(n) Fenwick build */
    size_t j = i + (i & (~i + 1));
    if (j <= npeers) s->tree[j] += s->tree[i];
  }
  return 0;
}

/* Two random choices (Mitzenmacher) over the counted loads. */
static size_t two_choices(const spread_t *s, jitter_rng_t *rng) {
  size_t i = (size_t)jitter_range(rng, 0, (int64_t)s->n - 1), j = i;
  if (s->n > 1) {
    j = (size_t)jitter_range(rng, 0, (int64_t)s->n - 2);
    if (j >= i) j++;
  }
  return s->load[j] < s->load[i] ? j : i;
}

size_t spread_pick(spread_t *s, jitter_rng_t *rng) {
  size_t k;
  if (s->total >= MILLI) {
    k = tree_find(s, jitter_range(rng, 0, s->total - 1));
    int64_t take = s->budget[k] < MILLI ? s->budget[k] : MILLI;
    s->budget[k] -= take;
    s->total -= take;
    tree_add(s, k, -take);
  } else {
    k = two_choices(s, rng);
  }
  s->load[k]++;
  return k;
}

int64_t spread_budget_left(const spread_t *s) { return s->total / MILLI; }

void spread_free(spread_t *s) {
  free(s->load);
  free(s->budget);
  free(s->tree);
  memset(s, 0, sizeof *s);
}
