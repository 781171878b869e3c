/*
 * rank: the one percentile rule of the tools (bench and sim).
 *
 * Nearest rank. The p-quantile (0 <= p <= 1) of n samples is the smallest
 * sample with at least a fraction p of the samples at or below it: in
 * ascending order, the sample of rank k = ceil(p * n), with k at least 1
 * (so p = 0 gives the smallest sample and p = 1 the largest). The
 * p-quantile of a histogram is the upper bound of the first bucket whose
 * cumulative count reaches that rank, n being the histogram's total count.
 * No interpolation: every figure is a sample or a bucket bound that was
 * observed. Every percentile the tools print comes from rank_nearest,
 * directly or through rank_bin and rank_bucket.
 *
 * Pure functions of their arguments; any thread.
 */
#ifndef CONVERGER_TOOLS_STATS_RANK_H
#define CONVERGER_TOOLS_STATS_RANK_H

#include <stddef.h>
#include <stdint.h>

/* The rank, 1..n, of the p-quantile of `n` samples: ceil(p * n) clamped to
 * [1, n] (p outside [0, 1] is clamped too). 0 when n is 0. The sample is
 * sorted[rank_nearest(p, n) - 1] of the samples in ascending order. */
size_t rank_nearest(double p, size_t n);

/* The index of the bin holding the p-quantile of a histogram given as
 * `nbins` per-bin counts (`bins[i]` observations in bin i, bins in
 * ascending order of their bounds); the caller turns the index into the
 * bin's upper bound. `nbins` when the histogram is empty. */
size_t rank_bin(const uint64_t *bins, size_t nbins, double p);

/* The index of the bucket holding the p-quantile of a histogram given as
 * `n` cumulative counts in ascending order of their upper bounds, the last
 * being the total (Prometheus' le buckets, +Inf last); counts are rounded
 * to whole observations. `n` when there is no bucket or the total is not
 * above 0. */
size_t rank_bucket(const double *cum, size_t n, double p);

#endif
