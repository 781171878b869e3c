/* Unit tests for plot/gnuplot: a PNG is drawn from CSV data in the given
 * directory, and gnuplot's own error reaches the caller. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "plot/gnuplot.h"

static char dir[64];

static int make_dir(void **state) {
  snprintf(dir, sizeof dir, "/tmp/cvg-gnuplot-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/data.csv", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "t,n\n0,1\n1,4\n2,9\n");
  fclose(f);
  return 0;
}

static int remove_dir(void **state) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_draws_png_in_dir(void **state) {
  char err[256];
  int r = gnuplot_run(dir,
                      "set terminal pngcairo size 400,300\n"
                      "set output 'out.png'\n"
                      "set datafile separator ','\n"
                      "plot 'data.csv' using 1:2 skip 1 with lines title 'n'\n",
                      err, sizeof err);
  assert_int_equal(r, 0);
  assert_string_equal(err, "");
  char path[128];
  snprintf(path, sizeof path, "%s/out.png", dir);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char magic[8];
  assert_int_equal(fread(magic, 1, 8, f), 8);
  fclose(f);
  static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  assert_memory_equal(magic, png, 8);
}

static void test_script_error_is_reported(void **state) {
  char err[256];
  int r = gnuplot_run(dir, "set terminal pngcairo\nset output 'x.png'\nplot 'missing.csv' using 1:2\n",
                      err, sizeof err);
  assert_int_equal(r, -1);
  assert_non_null(strstr(err, "gnuplot exited 1"));
  assert_true(strlen(err) > strlen("gnuplot exited 1: "));
}

static void test_bad_dir_is_reported(void **state) {
  char err[256];
  assert_int_equal(gnuplot_run("/nonexistent/cvg", "print 1\n", err, sizeof err), -1);
  assert_non_null(strstr(err, "cannot enter /nonexistent/cvg"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_draws_png_in_dir),
      cmocka_unit_test(test_script_error_is_reported),
      cmocka_unit_test(test_bad_dir_is_reported),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
