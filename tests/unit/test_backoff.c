/* Unit tests for the client SDK's reconnect backoff (client/backoff.c),
 * with seeded random sources and no clock: bounds of every strategy over 20
 * attempts, the server hint as a floor, the cap, reset on welcome. The
 * storm experiment drives whole clients: tests/unit/test_client_core.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
      cmocka_unit_test(test_hint_is_a_floor_and_cap_holds),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
