/* Unit tests for tools/stats/rank: the nearest rank of samples (n = 1,
 * the median of an even n, p = 0 and p = 1, p outside [0, 1]) and of
 * histograms, per-bin and cumulative (Prometheus buckets with +Inf), empty
 * ones included. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "stats/rank.h"

static void test_nearest_samples(void **state) {
  assert_int_equal(rank_nearest(0.5, 0), 0);
  /* n = 1: every p is the one sample */
  assert_int_equal(rank_nearest(0.0, 1), 1);
  assert_int_equal(rank_nearest(0.5, 1), 1);
  assert_int_equal(rank_nearest(0.99, 1), 1);
  assert_int_equal(rank_nearest(1.0, 1), 1);
  /* even n: the median is the lower middle sample, no mean of the two */
  assert_int_equal(rank_nearest(0.5, 2), 1);
  assert_int_equal(rank_nearest(0.5, 4), 2);
  assert_int_equal(rank_nearest(0.5, 5000), 2500);
  assert_int_equal(rank_nearest(0.5, 5), 3);
  /* p = 1 is the largest, p = 0 the smallest */
  assert_int_equal(rank_nearest(1.0, 7), 7);
  assert_int_equal(rank_nearest(0.0, 7), 1);
  /* p99: 99 of 100 at or below it; of 101, the 100th */
  assert_int_equal(rank_nearest(0.99, 100), 99);
  assert_int_equal(rank_nearest(0.99, 101), 100);
  assert_int_equal(rank_nearest(0.99, 3000), 2970);
  assert_int_equal(rank_nearest(0.95, 20), 19);
  /* outside [0, 1], and NaN, clamped */
  assert_int_equal(rank_nearest(-0.5, 10), 1);
  assert_int_equal(rank_nearest(1.5, 10), 10);
  assert_int_equal(rank_nearest(NAN, 10), 1);

  /* the rule on values: sorted[rank - 1] */
  const int v[4] = {10, 20, 30, 40};
  assert_int_equal(v[rank_nearest(0.5, 4) - 1], 20);
  assert_int_equal(v[rank_nearest(0.51, 4) - 1], 30);
  assert_int_equal(v[rank_nearest(0.75, 4) - 1], 30);
  assert_int_equal(v[rank_nearest(0.99, 4) - 1], 40);
}

static void test_bins(void **state) {
  const uint64_t empty[3] = {0, 0, 0};
  assert_int_equal(rank_bin(empty, 3, 0.5), 3);
  assert_int_equal(rank_bin(empty, 0, 0.5), 0);
  /* one observation in bin 2 */
  const uint64_t one[4] = {0, 0, 1, 0};
  assert_int_equal(rank_bin(one, 4, 0.0), 2);
  assert_int_equal(rank_bin(one, 4, 0.5), 2);
  assert_int_equal(rank_bin(one, 4, 1.0), 2);
  /* 2 + 2 observations: the median is the bin of the 2nd, the first bin */
  const uint64_t even[3] = {2, 0, 2};
  assert_int_equal(rank_bin(even, 3, 0.5), 0);
  assert_int_equal(rank_bin(even, 3, 0.51), 2);
  assert_int_equal(rank_bin(even, 3, 1.0), 2);
  /* 100 observations: 98 in bin 0, 1 in bin 5, 1 in bin 9 */
  uint64_t tail[10] = {98, 0, 0, 0, 0, 1, 0, 0, 0, 1};
  assert_int_equal(rank_bin(tail, 10, 0.98), 0);
  assert_int_equal(rank_bin(tail, 10, 0.99), 5);
  assert_int_equal(rank_bin(tail, 10, 1.0), 9);
}

static void test_buckets(void **state) {
  /* le 1, 2, 5, +Inf; cumulative */
  const double none[4] = {0, 0, 0, 0};
  assert_int_equal(rank_bucket(none, 4, 0.5), 4);
  assert_int_equal(rank_bucket(none, 0, 0.5), 0);
  /* 10 observations: 4 <= 1, 4 in (1, 2], 1 in (2, 5], 1 above 5 */
  const double cum[4] = {4, 8, 9, 10};
  assert_int_equal(rank_bucket(cum, 4, 0.4), 0);
  assert_int_equal(rank_bucket(cum, 4, 0.5), 1);
  assert_int_equal(rank_bucket(cum, 4, 0.9), 2);
  assert_int_equal(rank_bucket(cum, 4, 0.95), 3); /* +Inf: above the last bound */
  assert_int_equal(rank_bucket(cum, 4, 1.0), 3);
  /* the largest observation's bucket, with empty buckets above it */
  const double low[4] = {0, 3, 3, 3};
  assert_int_equal(rank_bucket(low, 4, 1.0), 1);
  assert_int_equal(rank_bucket(low, 4, 0.0), 1);
  /* counts read as doubles and differenced: rounded to whole ones */
  const double diff[2] = {2.0000000001, 3.9999999999};
  assert_int_equal(rank_bucket(diff, 2, 0.5), 0);
  assert_int_equal(rank_bucket(diff, 2, 0.75), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nearest_samples),
      cmocka_unit_test(test_bins),
      cmocka_unit_test(test_buckets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
