/* Unit tests for the client SDK's reconnect backoff (client/backoff.c),
 * with seeded random sources and no clock: bounds of every strategy over 20
 * attempts, the server hint as a floor, the cap, reset on welcome; 10 000
 * clients' delays at every attempt from 1 to 30 (issue 31: no millisecond
 * holds more than 1 % of them, the decorrelated mean stays close). The
 * storm experiment drives whole clients: tests/unit/test_client_core.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backoff.h"

static int64_t ceiling(int64_t base, int64_t cap, int n) {
  return jitter_exp_ceiling(base, cap, n);
}

static void check_bounds(cvg_backoff_strategy_t s) {
  jitter_rng_t rng;
  cvg_backoff_options_t o = {.strategy = s}; /* defaults: 250 ms, 10 s, 100 ms */
  for (uint64_t seed = 1; seed <= 200; seed++) {
    jitter_seed(&rng, seed);
    cvg_backoff_t b;
    cvg_backoff_init(&b, &o, &rng);
    int64_t prev = 250;
    for (int round = 0; round < 2; round++) { /* the second round after a welcome */
      for (int n = 0; n < 20; n++) {
        int64_t c = ceiling(250, 10000, n);
        int64_t d = cvg_backoff_next(&b, 0);
        switch (s) {
        case CVG_BACKOFF_FULL:
          assert_true(d >= 0 && d < c);
          break;
        case CVG_BACKOFF_EQUAL:
          assert_true(d >= c / 2 && d <= c);
          break;
        case CVG_BACKOFF_DECORRELATED:
          assert_true(d >= 250 && d <= 10000 && d <= 3 * prev);
          break;
        case CVG_BACKOFF_EXPONENTIAL:
          assert_int_equal(d, c);
          break;
        case CVG_BACKOFF_ADDITIVE:
          assert_true(d >= c && d <= c + 100);
          break;
        case CVG_BACKOFF_PROPORTIONAL:
          assert_true(2 * d >= c && 2 * d <= 3 * c);
          break;
        }
        prev = d;
      }
      cvg_backoff_reset(&b); /* welcome */
      prev = 250;
    }
  }
}

static void test_bounds_full(void **state) { check_bounds(CVG_BACKOFF_FULL); }
static void test_bounds_equal(void **state) { check_bounds(CVG_BACKOFF_EQUAL); }
static void test_bounds_decorrelated(void **state) { check_bounds(CVG_BACKOFF_DECORRELATED); }
static void test_bounds_exponential(void **state) { check_bounds(CVG_BACKOFF_EXPONENTIAL); }
static void test_bounds_additive(void **state) { check_bounds(CVG_BACKOFF_ADDITIVE); }
static void test_bounds_proportional(void **state) { check_bounds(CVG_BACKOFF_PROPORTIONAL); }

/* ---- a population of clients (issue 31) ------------------------------------ */

#define CLIENTS     10000
#define ATTEMPTS    30
#define REF_CLIENTS 100000

/* The decorrelated jitter of AWS as it was before issue 31, min(cap,
 * random in [base, 3 * prev]): the reference for the mean. */
static int64_t old_decorrelated(jitter_rng_t *rng, int64_t prev) {
  int64_t d = jitter_range(rng, 250, (prev > 250 ? prev : 250) * 3);
  return d < 10000 ? d : 10000;
}

/* The mean delay of each attempt 1..ATTEMPTS of min(cap, ...) over
 * REF_CLIENTS clients with the defaults (250 ms, 10 s), into mean[1..]. */
static void old_means(double *mean) {
  static int64_t prev[REF_CLIENTS];
  jitter_rng_t rng;
  jitter_seed(&rng, 31);
  for (int i = 0; i < REF_CLIENTS; i++) prev[i] = 250;
  for (int a = 1; a <= ATTEMPTS; a++) {
    double sum = 0;
    for (int i = 0; i < REF_CLIENTS; i++)
      sum += (double)(prev[i] = old_decorrelated(&rng, prev[i]));
    mean[a] = sum / REF_CLIENTS;
  }
}

/* CLIENTS clients of strategy `s` with the defaults, one seeded source,
 * each backing off ATTEMPTS times in a row. At every attempt: every delay
 * within the strategy's bounds; no 1 ms bucket holding more than 1 % of
 * the clients (the cap of min(cap, ...) held 31 % at attempt 10 and 36 %
 * at attempt 30), or more than 1.5 times a uniform share where the
 * attempt's range has fewer than 150 values (equal jitter's first is 126
 * ms wide: its uniform share is 0.79 %); and for decorrelated, the mean
 * within 5 % of min(cap, ...)'s (it is 2 % below it from attempt 10 on;
 * 5 % leaves room for the sampling noise of 10 000 clients, about 0.6 %). */
static void check_population(cvg_backoff_strategy_t s) {
  static cvg_backoff_t b[CLIENTS];
  static int bucket[10001];
  static double old[ATTEMPTS + 1];
  jitter_rng_t rng;
  jitter_seed(&rng, 2025);
  cvg_backoff_options_t o = {.strategy = s};
  for (int i = 0; i < CLIENTS; i++) cvg_backoff_init(&b[i], &o, &rng);
  if (s == CVG_BACKOFF_DECORRELATED) old_means(old);
  for (int a = 1; a <= ATTEMPTS; a++) {
    int64_t c = ceiling(250, 10000, a - 1), lo, hi;
    switch (s) {
    case CVG_BACKOFF_FULL:
      lo = 0, hi = c - 1;
      break;
    case CVG_BACKOFF_EQUAL:
      lo = c / 2, hi = c;
      break;
    default:
      lo = 250, hi = 10000;
      break;
    }
    memset(bucket, 0, sizeof bucket);
    double sum = 0;
    for (int i = 0; i < CLIENTS; i++) {
      int64_t prev = b[i].prev_ms, d = cvg_backoff_next(&b[i], 0);
      if (d < lo || d > hi || (s == CVG_BACKOFF_DECORRELATED && d > 3 * prev))
        fail_msg("attempt %d: %lld ms outside [%lld, %lld]", a, (long long)d, (long long)lo,
                 (long long)hi);
      bucket[d]++;
      sum += (double)d;
    }
    int64_t span = hi - lo + 1;
    int limit = span >= 150 ? CLIENTS / 100 : (int)(CLIENTS * 3 / (2 * span));
    int most = 0;
    int64_t at = 0;
    for (int64_t k = lo; k <= hi; k++)
      if (bucket[k] > most) most = bucket[k], at = k;
    if (most > limit)
      fail_msg("attempt %d: %d of %d clients (%.2f %%) at %lld ms", a, most, CLIENTS,
               100.0 * most / CLIENTS, (long long)at);
    double mean = sum / CLIENTS;
    if (s == CVG_BACKOFF_DECORRELATED && (mean < old[a] * 0.95 || mean > old[a] * 1.05))
      fail_msg("attempt %d: mean %.1f ms, min(cap, ...)'s %.1f ms", a, mean, old[a]);
  }
}

static void test_population_decorrelated(void **state) {
  check_population(CVG_BACKOFF_DECORRELATED);
}
static void test_population_full(void **state) { check_population(CVG_BACKOFF_FULL); }
static void test_population_equal(void **state) { check_population(CVG_BACKOFF_EQUAL); }

static void test_hint_is_a_floor_and_cap_holds(void **state) {
  jitter_rng_t rng;
  jitter_seed(&rng, 7);
  cvg_backoff_t b;
  cvg_backoff_options_t o = {.strategy = CVG_BACKOFF_FULL, .base_ms = 100, .cap_ms = 2000};
  cvg_backoff_init(&b, &o, &rng);
  for (int i = 0; i < 50; i++) {
    int64_t d = cvg_backoff_next(&b, 4500);
    assert_true(d >= 4500); /* max(hint, backoff): never sooner than the server asked */
  }
  for (int i = 0; i < 50; i++) assert_true(cvg_backoff_next(&b, 0) < 2000); /* the cap */
  cvg_backoff_options_t e = {.strategy = CVG_BACKOFF_EXPONENTIAL, .base_ms = 100, .cap_ms = 2000};
  cvg_backoff_init(&b, &e, &rng);
  assert_int_equal(cvg_backoff_next(&b, 50), 100); /* a smaller hint changes nothing */
  for (int i = 0; i < 100; i++) cvg_backoff_next(&b, 0);
  assert_int_equal(cvg_backoff_next(&b, 0), 2000); /* no overflow past many attempts */
  assert_int_equal(cvg_backoff_next(&b, 9000), 9000);
}

static void test_names(void **state) {
  cvg_backoff_strategy_t s;
  const char *all[] = {"full", "equal", "decorrelated", "exponential", "additive", "proportional"};
  for (size_t i = 0; i < 6; i++) {
    assert_int_equal(cvg_backoff_parse(all[i], &s), 0);
    assert_string_equal(cvg_backoff_name(s), all[i]);
  }
  assert_int_equal(cvg_backoff_parse("linear", &s), CVG_EINVAL);
  assert_int_equal(cvg_backoff_parse(NULL, &s), CVG_EINVAL);
  cvg_backoff_t b;
  jitter_rng_t rng;
  cvg_backoff_init(&b, NULL, &rng);
  assert_int_equal(b.opt.strategy, CVG_BACKOFF_DECORRELATED);
  assert_int_equal(b.opt.base_ms, 250);
  assert_int_equal(b.opt.cap_ms, 10000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bounds_full),
      cmocka_unit_test(test_bounds_equal),
      cmocka_unit_test(test_bounds_decorrelated),
      cmocka_unit_test(test_bounds_exponential),
      cmocka_unit_test(test_bounds_additive),
      cmocka_unit_test(test_bounds_proportional),
      cmocka_unit_test(test_population_decorrelated),
      cmocka_unit_test(test_population_full),
      cmocka_unit_test(test_population_equal),
      cmocka_unit_test(test_hint_is_a_floor_and_cap_holds),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
