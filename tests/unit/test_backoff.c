/* Unit tests for the client SDK's reconnect backoff (client/backoff.c),
 * with seeded random sources and no clock: bounds of every strategy over 20
 * attempts, the server hint as a floor, the cap, reset on welcome, and the
 * storm experiment of the reconnect-storm post-mortem: 10 000 clients
 * dropped at one instant and refused ten times in a row. */
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
  assert_int_equal(cvg_backoff_parse("linear", &s), -1);
  assert_int_equal(cvg_backoff_parse(NULL, &s), -1);
  cvg_backoff_t b;
  jitter_rng_t rng;
  cvg_backoff_init(&b, NULL, &rng);
  assert_int_equal(b.opt.strategy, CVG_BACKOFF_DECORRELATED);
  assert_int_equal(b.opt.base_ms, 250);
  assert_int_equal(b.opt.cap_ms, 10000);
}

/* ---- the storm ------------------------------------------------------------- */

#define CLIENTS  10000
#define REFUSALS 10

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Every client is dropped at t = 0 and each of its attempts is refused
 * (no hint). Attempts 4 to 10 of all clients are pooled; the result is the
 * largest number of them inside any 100 ms window, as a share of the
 * clients. */
static double busiest_100ms(const cvg_backoff_options_t *o) {
  int64_t *t = malloc(sizeof(int64_t) * CLIENTS * (REFUSALS - 3));
  size_t n = 0;
  for (int c = 0; c < CLIENTS; c++) {
    jitter_rng_t rng;
    jitter_seed(&rng, 1000003u * (uint64_t)c + 17);
    cvg_backoff_t b;
    cvg_backoff_init(&b, o, &rng);
    int64_t at = 0;
    for (int attempt = 1; attempt <= REFUSALS; attempt++) {
      at += cvg_backoff_next(&b, 0);
      if (attempt >= 4) t[n++] = at;
    }
  }
  qsort(t, n, sizeof *t, cmp64);
  size_t best = 0;
  for (size_t lo = 0, hi = 0; hi < n; hi++) {
    while (t[hi] - t[lo] >= 100) lo++;
    if (hi - lo + 1 > best) best = hi - lo + 1;
  }
  free(t);
  return (double)best / CLIENTS;
}

static void test_storm_jitter_spreads_and_exponential_synchronises(void **state) {
  const cvg_backoff_options_t spread[] = {
      {.strategy = CVG_BACKOFF_FULL},
      {.strategy = CVG_BACKOFF_EQUAL},
      {.strategy = CVG_BACKOFF_DECORRELATED},
  };
  /* The post-mortem's clients: base 250 ms, cap 30 s, 0-100 ms jitter. */
  const cvg_backoff_options_t waves[] = {
      {.strategy = CVG_BACKOFF_EXPONENTIAL, .base_ms = 250, .cap_ms = 30000},
      {.strategy = CVG_BACKOFF_ADDITIVE, .base_ms = 250, .cap_ms = 30000, .jitter_ms = 100},
  };
  for (size_t i = 0; i < 3; i++) {
    double share = busiest_100ms(&spread[i]);
    printf("  %-12s busiest 100 ms holds %5.1f%% of the clients\n",
           cvg_backoff_name(spread[i].strategy), 100 * share);
    assert_true(share <= 0.15);
  }
  for (size_t i = 0; i < 2; i++) {
    double share = busiest_100ms(&waves[i]);
    printf("  %-12s busiest 100 ms holds %5.1f%% of the clients\n",
           cvg_backoff_name(waves[i].strategy), 100 * share);
    assert_true(share > 0.50);
  }
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
      cmocka_unit_test(test_storm_jitter_spreads_and_exponential_synchronises),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
