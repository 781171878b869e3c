/*
 * promtext: the bench's reader of a node's GET /metrics, the Prometheus
 * text format (version 0.0.4) that core/metrics.c writes.
 *
 * A sample line is `name value` or `name{k="v",...} value`, optionally
 * followed by a timestamp, which is ignored; lines starting with '#'
 * (HELP, TYPE, comments) and blank lines are skipped. Label values are
 * compared as they are written, escapes (\" \\ \n) included.
 *
 * A label filter is label pairs in the same text form, comma-separated,
 * e.g. `result="ok"` or `kind="hello",result="ok"`; a sample matches when
 * it has every pair of the filter, whatever its other labels. NULL or ""
 * matches every sample. Where several series match, their values are
 * added (the node's series of one name summed over the labels not asked
 * for).
 *
 * Pure functions of the text they are given; any thread. The text is
 * NUL-terminated and only read.
 */
#ifndef CONVERGER_TOOLS_BENCH_PROMTEXT_H
#define CONVERGER_TOOLS_BENCH_PROMTEXT_H

#include <stddef.h>

#define PROMTEXT_BUCKETS_MAX 64 /* bucket bounds kept per histogram; more are dropped */

/* A histogram read from /metrics: its buckets in ascending order of `le`
 * (INFINITY for +Inf, last), each with its cumulative count, and its _sum
 * and _count. Counts are doubles, as the text gives them, so that
 * differences (after - before) stay exact. */
typedef struct {
  double le[PROMTEXT_BUCKETS_MAX];
  double cum[PROMTEXT_BUCKETS_MAX];
  size_t n;
  double sum, count;
} promtext_hist_t;

/* The sum of the values of the samples named exactly `name` that match
 * `labels` (see above) in `text`; 0 when none does. */
double promtext_value(const char *text, const char *name, const char *labels);

/* Read histogram `name` from `text`: the samples `name`_bucket (by their
 * le label), `name`_sum and `name`_count that match `labels` (the le label
 * need not be in it), each summed over the matching series. `h` is
 * cleared first; a histogram that is not in the text reads as empty. */
void promtext_hist(const char *text, const char *name, const char *labels, promtext_hist_t *h);

/* dst += sign * src, bucket by bucket, over the bounds of both: where one
 * of them lacks a bound, its cumulative count there is that of its next
 * lower bound (0 below its first). sign is 1 or -1: a merge of nodes, or
 * after - before. Bounds beyond PROMTEXT_BUCKETS_MAX are dropped. */
void promtext_hist_add(promtext_hist_t *dst, const promtext_hist_t *src, double sign);

#endif
