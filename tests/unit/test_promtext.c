/* Unit tests for tools/bench/promtext: samples by name and label filter
 * (exact names, exact pairs, sums over series, comments, escapes,
 * timestamps), histograms with their +Inf bucket, merges and differences,
 * and their nearest rank (stats/rank.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "bench/promtext.h"
#include "stats/rank.h"

static const char text[] =
    "# HELP converger_handshakes_total WebSocket handshakes by result\n"
    "# TYPE converger_handshakes_total counter\n"
    "converger_handshakes_total{result=\"ok\"} 12\n"
    "converger_handshakes_total{result=\"overloaded\"} 3\n"
    "converger_handshakes_total{result=\"ok2\"} 100\n"
    "converger_handshakes_total_extra{result=\"ok\"} 1000\n"
    "# converger_handshakes_total{result=\"ok\"} 5000 (a comment, not a sample)\n"
    "\n"
    "converger_pool_dropped_total{kind=\"hello\"} 2\n"
    "converger_pool_dropped_total{kind=\"send\"} 5 1700000000000\n"
    "converger_up 1\n"
    "converger_odd{path=\"a\\\"b,c\",result=\"ok\"} 7\n"
    "# TYPE converger_wait_ms histogram\n"
    "converger_wait_ms_bucket{result=\"ok\",le=\"1\"} 4\n"
    "converger_wait_ms_bucket{result=\"ok\",le=\"10\"} 8\n"
    "converger_wait_ms_bucket{result=\"ok\",le=\"100\"} 9\n"
    "converger_wait_ms_bucket{result=\"ok\",le=\"+Inf\"} 10\n"
    "converger_wait_ms_sum{result=\"ok\"} 250.5\n"
    "converger_wait_ms_count{result=\"ok\"} 10\n"
    "converger_wait_ms_bucket{result=\"overloaded\",le=\"1\"} 0\n"
    "converger_wait_ms_bucket{result=\"overloaded\",le=\"10\"} 0\n"
    "converger_wait_ms_bucket{result=\"overloaded\",le=\"100\"} 2\n"
    "converger_wait_ms_bucket{result=\"overloaded\",le=\"+Inf\"} 2\n"
    "converger_wait_ms_sum{result=\"overloaded\"} 150\n"
    "converger_wait_ms_count{result=\"overloaded\"} 2";

static void test_values(void **state) {
  /* the exact name: not its longer relatives, not the commented-out line */
  assert_true(promtext_value(text, "converger_handshakes_total", "result=\"ok\"") == 12);
  assert_true(promtext_value(text, "converger_handshakes_total", "result=\"overloaded\"") == 3);
  /* no filter, or an empty one: summed over the series */
  assert_true(promtext_value(text, "converger_handshakes_total", NULL) == 115);
  assert_true(promtext_value(text, "converger_handshakes_total", "") == 115);
  /* a trailing timestamp is not the value */
  assert_true(promtext_value(text, "converger_pool_dropped_total", NULL) == 7);
  assert_true(promtext_value(text, "converger_pool_dropped_total", "kind=\"send\"") == 5);
  /* no labels at all; a filter it cannot match */
  assert_true(promtext_value(text, "converger_up", NULL) == 1);
  assert_true(promtext_value(text, "converger_up", "result=\"ok\"") == 0);
  assert_true(promtext_value(text, "converger_absent", NULL) == 0);
  assert_true(promtext_value(text, "converger_handshakes", NULL) == 0);
  /* an escaped quote and a comma inside a value; several pairs in a filter */
  assert_true(promtext_value(text, "converger_odd", "result=\"ok\"") == 7);
  assert_true(promtext_value(text, "converger_odd", "path=\"a\\\"b,c\",result=\"ok\"") == 7);
  assert_true(promtext_value(text, "converger_odd", "path=\"a\"") == 0);
  assert_true(promtext_value(text, "converger_wait_ms_count", NULL) == 12);
  /* a last line with no newline */
  assert_true(promtext_value(text, "converger_wait_ms_count", "result=\"overloaded\"") == 2);
}

static void test_hist(void **state) {
  promtext_hist_t h;
  promtext_hist(text, "converger_wait_ms", "result=\"ok\"", &h);
  assert_int_equal(h.n, 4);
  assert_true(h.le[0] == 1 && h.le[1] == 10 && h.le[2] == 100 && isinf(h.le[3]));
  assert_true(h.cum[0] == 4 && h.cum[1] == 8 && h.cum[2] == 9 && h.cum[3] == 10);
  assert_true(h.sum == 250.5 && h.count == 10);
  /* nearest rank on the buckets: 5 of 10 at or below 10 ms, the 10th above 100 */
  assert_true(h.le[rank_bucket(h.cum, h.n, 0.5)] == 10);
  assert_true(h.le[rank_bucket(h.cum, h.n, 0.9)] == 100);
  assert_true(isinf(h.le[rank_bucket(h.cum, h.n, 1.0)]));

  /* every series summed */
  promtext_hist(text, "converger_wait_ms", NULL, &h);
  assert_int_equal(h.n, 4);
  assert_true(h.cum[0] == 4 && h.cum[2] == 11 && h.cum[3] == 12 && h.count == 12);

  /* absent: empty, and no rank */
  promtext_hist(text, "converger_none", NULL, &h);
  assert_int_equal(h.n, 0);
  assert_int_equal(rank_bucket(h.cum, h.n, 0.5), 0);
}

static void test_hist_add(void **state) {
  static const char before[] = "x_bucket{le=\"5\"} 1\nx_bucket{le=\"+Inf\"} 1\n"
                               "x_sum 3\nx_count 1\n";
  static const char after[] = "x_bucket{le=\"1\"} 0\nx_bucket{le=\"5\"} 1\n"
                              "x_bucket{le=\"25\"} 4\nx_bucket{le=\"+Inf\"} 4\n"
                              "x_sum 63\nx_count 4\n";
  promtext_hist_t d, b;
  promtext_hist(after, "x", NULL, &d);
  promtext_hist(before, "x", NULL, &b);
  promtext_hist_add(&d, &b, -1);
  /* after - before: 3 observations, all in (5, 25]; before's count at
   * le 25, a bound it lacks, is its count at 5 */
  assert_int_equal(d.n, 4);
  assert_true(d.le[0] == 1 && d.le[1] == 5 && d.le[2] == 25 && isinf(d.le[3]));
  assert_true(d.cum[0] == 0 && d.cum[1] == 0 && d.cum[2] == 3 && d.cum[3] == 3);
  assert_true(d.count == 3 && d.sum == 60);
  assert_int_equal(rank_bucket(d.cum, d.n, 1.0), 2);
  assert_int_equal(rank_bucket(d.cum, d.n, 0.0), 2);

  /* a merge into an empty histogram puts a bound it lacks in order */
  promtext_hist_t m = {0};
  promtext_hist_add(&m, &b, 1);
  promtext_hist_add(&m, &d, 1);
  assert_int_equal(m.n, 4);
  assert_true(m.le[0] == 1 && m.le[1] == 5 && m.le[2] == 25 && isinf(m.le[3]));
  assert_true(m.cum[0] == 0 && m.cum[1] == 1 && m.cum[2] == 4 && m.cum[3] == 4);
  assert_true(m.count == 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values),
      cmocka_unit_test(test_hist),
      cmocka_unit_test(test_hist_add),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
