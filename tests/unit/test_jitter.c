/* Unit tests for common/jitter: ranges, determinism, hint spread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/jitter.h"

#define N 20000

static void test_same_seed_same_sequence(void **state) {
  jitter_rng_t a, b;
  jitter_seed(&a, 42);
  jitter_seed(&b, 42);
  for (int i = 0; i < 1000; i++) assert_int_equal(jitter_next(&a), jitter_next(&b));
  jitter_seed(&b, 43);
  int differ = 0;
  for (int i = 0; i < 10; i++) differ += jitter_next(&a) != jitter_next(&b);
  assert_true(differ > 0);
}

static void test_range_bounds_and_coverage(void **state) {
  jitter_rng_t r;
  jitter_seed(&r, 1);
  int seen[11] = {0};
  for (int i = 0; i < N; i++) {
    int64_t v = jitter_range(&r, 10, 20);
    assert_true(v >= 10 && v <= 20);
    seen[v - 10]++;
  }
  for (int i = 0; i <= 10; i++) assert_true(seen[i] > N / 11 / 2); /* roughly uniform */
  assert_int_equal(jitter_range(&r, 5, 5), 5);
  assert_int_equal(jitter_range(&r, 7, 3), 7);
}

static void test_full_jitter(void **state) {
  jitter_rng_t r;
  jitter_seed(&r, 2);
  for (int attempt = 0; attempt < 12; attempt++) {
    int64_t ceiling = jitter_exp_ceiling(250, 10000, attempt);
    assert_int_equal(ceiling, attempt < 6 ? 250LL << attempt : 10000);
    int64_t max = 0;
    for (int i = 0; i < 2000; i++) {
      int64_t d = jitter_full(&r, 250, 10000, attempt);
      assert_true(d >= 0 && d < ceiling);
      if (d > max) max = d;
    }
    assert_true(max > ceiling / 2); /* uses the whole range */
  }
}

static void test_equal_jitter(void **state) {
  jitter_rng_t r;
  jitter_seed(&r, 3);
  for (int attempt = 0; attempt < 10; attempt++) {
    int64_t c = jitter_exp_ceiling(250, 10000, attempt);
    for (int i = 0; i < 2000; i++) {
      int64_t d = jitter_equal(&r, 250, 10000, attempt);
      assert_true(d >= c / 2 && d <= c);
    }
  }
}

static void test_decorrelated_jitter(void **state) {
  jitter_rng_t r;
  jitter_seed(&r, 4);
  int64_t prev = 250;
  int hit_cap = 0, in_band = 0;
  for (int i = 0; i < N; i++) {
    int64_t d = jitter_decorrelated(&r, 250, 10000, prev);
    assert_true(d >= 250 && d <= 10000);
    assert_true(d <= prev * 3);
    hit_cap += d == 10000;
    in_band += d >= 10000 - 9750 / JITTER_CAP_BAND_DIV;
    prev = d;
  }
  /* Draws above the cap are spread over the band below it (issue 31),
   * not all on the cap: a third of the draws reach the band. */
  assert_true(in_band > N / 4);
  assert_true(hit_cap < N / 100);
  assert_int_equal(jitter_decorrelated(&r, 500, 500, 500), 500); /* cap == base */
  assert_int_equal(jitter_decorrelated(&r, 500, 400, 500), 400); /* cap < base: the cap */
}

/* A burst of refusals must not all carry one retry hint (the reconnect-storm
 * post-mortem: synchronised retries). */
static void test_retry_hints_spread(void **state) {
  jitter_rng_t r;
  jitter_seed(&r, 5);
  int buckets[5] = {0};
  int64_t first = jitter_retry_hint(&r, 1000, 6000);
  int all_same = 1;
  for (int i = 0; i < N; i++) {
    int64_t h = jitter_retry_hint(&r, 1000, 6000);
    assert_true(h >= 1000 && h <= 6000);
    if (h != first) all_same = 0;
    buckets[(h - 1000) * 5 / 5001]++;
  }
  assert_false(all_same);
  for (int i = 0; i < 5; i++) assert_true(buckets[i] > N / 5 * 8 / 10);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_seed_same_sequence),
      cmocka_unit_test(test_range_bounds_and_coverage),
      cmocka_unit_test(test_full_jitter),
      cmocka_unit_test(test_equal_jitter),
      cmocka_unit_test(test_decorrelated_jitter),
      cmocka_unit_test(test_retry_hints_spread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
