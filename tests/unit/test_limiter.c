/* Unit tests for the accept limiter's token bucket (src/gate/limiter.c) on
 * a fake clock: a full bucket allows a burst, then the rate holds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gate/limiter.h"

static void test_burst_then_rate(void **state) {
  limiter_t l;
  limiter_init(&l, 100, 100, 1000); /* 100 a second, a second's worth at once */
  int ok = 0;
  for (int i = 0; i < 150; i++) ok += limiter_take(&l, 1000);
  assert_int_equal(ok, 100);
  assert_int_equal(limiter_take(&l, 1009), 0); /* 0.9 of a token */
  assert_int_equal(limiter_take(&l, 1010), 1);
  ok = 0; /* one more second at the rate: 100 */
  for (uint64_t t = 1011; t <= 2010; t++) ok += limiter_take(&l, t) + limiter_take(&l, t);
  assert_true(ok >= 99 && ok <= 100);
  /* a long pause refills no more than the burst */
  ok = 0;
  for (int i = 0; i < 500; i++) ok += limiter_take(&l, 100000);
  assert_int_equal(ok, 100);
}

static void test_small_rate(void **state) {
  limiter_t l;
  limiter_init(&l, 0.5, 1, 0); /* one every two seconds */
  assert_int_equal(limiter_take(&l, 0), 1);
  assert_int_equal(limiter_take(&l, 1999), 0);
  assert_int_equal(limiter_take(&l, 2000), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_burst_then_rate),
      cmocka_unit_test(test_small_rate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
