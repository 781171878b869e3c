/*
 * rank.c: nearest rank over samples and histograms (see stats/rank.h).
 */
#include "stats/rank.h"

#include <math.h>

size_t rank_nearest(double p, size_t n) {
  if (n == 0) return 0;
  if (!(p > 0)) return 1; /* also NaN */
  if (p >= 1) return n;
  double k = ceil(p * (double)n);
  return k < 1 ? 1 : k > (double)n ? n : (size_t)k;
}

size_t rank_bin(const uint64_t *bins, size_t nbins, double p) {
  uint64_t total = 0;
  for (size_t i = 0; i < nbins; i++) total += bins[i];
  size_t k = rank_nearest(p, (size_t)total);
  uint64_t seen = 0;
  for (size_t i = 0; k > 0 && i < nbins; i++)
    if ((seen += bins[i]) >= k) return i;
  return nbins;
}

size_t rank_bucket(const double *cum, size_t n, double p) {
  double total = n ? round(cum[n - 1]) : 0;
  if (!(total > 0)) return n;
  size_t k = rank_nearest(p, (size_t)total);
  for (size_t i = 0; i < n; i++)
    if (round(cum[i]) >= (double)k) return i;
  return n;
}
