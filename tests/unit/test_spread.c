/* Unit tests for reconnectTo by water-filling (src/gate/spread.c): equal
 * loads give an even spread; the fleet case of the simulator (30 empty
 * peers among 450, 30 drainers) sends nearly every move to the empties;
 * a spent budget falls back to two random choices that still balance; the
 * same seed gives the same picks; one peer; bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/jitter.h"
#include "gate/spread.h"

static void test_equal_loads_even(void **state) {
  enum { N = 20, C = 20000 };
  int64_t load[N];
  for (int i = 0; i < N; i++) load[i] = 1000;
  spread_t s;
  jitter_rng_t rng;
  jitter_seed(&rng, 42);
  /* 10 drainers of C each: every peer's deficit is 10 * C / N. */
  assert_int_equal(spread_init(&s, load, N, C, 10 * C), 0);
  assert_int_equal(s.deficits, N);
  assert_int_equal(spread_budget_left(&s), C);
  int64_t got[N] = {0};
  for (int i = 0; i < C; i++) {
    size_t k = spread_pick(&s, &rng);
    assert_true(k < N);
    got[k]++;
  }
  /* chi-square against uniform, 19 degrees of freedom: well below 50 */
  double e = (double)C / N, chi = 0;
  for (int i = 0; i < N; i++) chi += ((double)got[i] - e) * ((double)got[i] - e) / e;
  assert_true(chi < 50);
  spread_free(&s);
}

static void test_fleet_empties_get_the_moves(void **state) {
  /* 480 nodes: 30 draining (L each), 30 just restarted (empty), 420 at L
   * plus a little of the last batches' creep. */
  enum { PEERS = 450, EMPTY = 30, L = 27000 };
  int64_t *load = malloc(PEERS * sizeof *load);
  assert_non_null(load);
  for (int i = 0; i < PEERS; i++) load[i] = i < EMPTY ? 0 : L + (i % 7) * 100;
  spread_t s;
  jitter_rng_t rng;
  jitter_seed(&rng, 7);
  assert_int_equal(spread_init(&s, load, PEERS, L, 30 * (int64_t)L), 0);
  assert_true(s.deficits >= EMPTY);
  int64_t empties = 0;
  for (int i = 0; i < L; i++) empties += spread_pick(&s, &rng) < EMPTY;
  assert_true(empties * 100 >= 95 * (int64_t)L);
  spread_free(&s);
  free(load);
}

static void test_spent_budget_falls_back_and_balances(void **state) {
  enum { N = 8 };
  int64_t load[N] = {0, 10, 20, 30, 40, 50, 60, 70};
  spread_t s;
  jitter_rng_t rng;
  jitter_seed(&rng, 3);
  /* C = 40 of D = 400: the budget is a tenth of the deficits, ~40 picks. */
  assert_int_equal(spread_init(&s, load, N, 40, 400), 0);
  int64_t before = spread_budget_left(&s);
  assert_true(before >= 39 && before <= 40);
  /* a pick takes a whole client, or what is left of a peer's budget */
  for (int i = 0; i < 40; i++) assert_true(spread_pick(&s, &rng) < N);
  assert_true(spread_budget_left(&s) < N);
  for (int i = 0; i < N; i++) assert_true(spread_pick(&s, &rng) < N);
  assert_int_equal(spread_budget_left(&s), 0);
  /* 2 000 more picks by two choices: the counted loads end near level */
  for (int i = 0; i < 2000; i++) assert_true(spread_pick(&s, &rng) < N);
  int64_t lo = s.load[0], hi = s.load[0];
  for (int i = 1; i < N; i++) {
    if (s.load[i] < lo) lo = s.load[i];
    if (s.load[i] > hi) hi = s.load[i];
  }
  assert_true(hi - lo <= 10);
  spread_free(&s);
  /* no budget at all (C = 0): picks are still valid */
  assert_int_equal(spread_init(&s, load, N, 0, 0), 0);
  assert_int_equal(spread_budget_left(&s), 0);
  for (int i = 0; i < 100; i++) assert_true(spread_pick(&s, &rng) < N);
  spread_free(&s);
}

static void test_same_seed_same_picks(void **state) {
  enum { N = 37 };
  int64_t load[N];
  for (int i = 0; i < N; i++) load[i] = (i * 7919) % 101;
  size_t a[500], b[500];
  for (int run = 0; run < 2; run++) {
    spread_t s;
    jitter_rng_t rng;
    jitter_seed(&rng, 99);
    assert_int_equal(spread_init(&s, load, N, 300, 900), 0);
    for (int i = 0; i < 500; i++) (run ? b : a)[i] = spread_pick(&s, &rng);
    spread_free(&s);
  }
  assert_memory_equal(a, b, sizeof a);
}

static void test_one_peer_and_bad_arguments(void **state) {
  int64_t load[1] = {5};
  spread_t s;
  jitter_rng_t rng;
  jitter_seed(&rng, 1);
  assert_int_equal(spread_init(&s, load, 1, 10, 10), 0);
  for (int i = 0; i < 30; i++) assert_int_equal(spread_pick(&s, &rng), 0);
  assert_int_equal(s.load[0], 35);
  spread_free(&s);
  assert_int_equal(spread_init(&s, NULL, 0, 10, 10), 0); /* no peers: nothing to pick */
  spread_free(&s);
  assert_int_equal(spread_init(&s, load, 1, -1, 10), -1);
  spread_free(&s);
  int64_t neg[2] = {1, -1};
  assert_int_equal(spread_init(&s, neg, 2, 1, 1), -1);
  spread_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equal_loads_even),
      cmocka_unit_test(test_fleet_empties_get_the_moves),
      cmocka_unit_test(test_spent_budget_falls_back_and_balances),
      cmocka_unit_test(test_same_seed_same_picks),
      cmocka_unit_test(test_one_peer_and_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
