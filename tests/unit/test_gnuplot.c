/* Unit tests for plot/gnuplot: a PNG is drawn from CSV data in the given
 * directory (whose name has a space and a quote), gnuplot's own error
 * reaches the caller, and the script builders quote paths and refuse to
 * overflow. */
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
  snprintf(dir, sizeof dir, "/tmp/cvg gnu'plot-XXXXXX");
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
  static const char *const files[] = {"data.csv", "out.png", "abs.png", "x.png"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  return rmdir(dir);
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

static void test_absolute_quoted_path(void **state) {
  char script[1024] = "set terminal pngcairo size 300,200\nset output ";
  char err[256];
  assert_int_equal(gnuplot_append_path(script, sizeof script, dir, "abs.png"), 0);
  assert_int_equal(gnuplot_appendf(script, sizeof script, "\nset datafile separator ','\nplot "),
                   0);
  assert_int_equal(gnuplot_append_path(script, sizeof script, dir, "data.csv"), 0);
  assert_int_equal(gnuplot_appendf(script, sizeof script, " using 1:2 skip 1 with lines\n"), 0);
  assert_non_null(strstr(script, "gnu''plot-")); /* the quote doubled */
  assert_int_equal(gnuplot_run(NULL, script, err, sizeof err), 0);
  char path[128];
  snprintf(path, sizeof path, "%s/abs.png", dir);
  assert_int_equal(access(path, R_OK), 0);
}

static void test_append_refuses_to_overflow(void **state) {
  char buf[16] = "plot ";
  assert_int_equal(gnuplot_appendf(buf, sizeof buf, "%s", "1234567890"), 0); /* 15 bytes */
  assert_int_equal(gnuplot_appendf(buf, sizeof buf, "x"), -1);
  assert_int_equal(strlen(buf), 15);
  char small[8] = "";
  assert_int_equal(gnuplot_append_path(small, sizeof small, "/tmp", "a.csv"), -1);
}

static void test_script_error_is_reported(void **state) {
  char err[256];
  int r =
      gnuplot_run(dir, "set terminal pngcairo\nset output 'x.png'\nplot 'missing.csv' using 1:2\n",
                  err, sizeof err);
  assert_int_equal(r, -1);
  assert_non_null(strstr(err, "gnuplot exited 1: "));
  assert_non_null(strstr(err, "No data in plot")); /* the error, not the warning before it */
}

static void test_bad_dir_is_reported(void **state) {
  char err[256];
  assert_int_equal(gnuplot_run("/nonexistent/cvg", "print 1\n", err, sizeof err), -1);
  assert_non_null(strstr(err, "cannot enter /nonexistent/cvg"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_draws_png_in_dir),
      cmocka_unit_test(test_absolute_quoted_path),
      cmocka_unit_test(test_append_refuses_to_overflow),
      cmocka_unit_test(test_script_error_is_reported),
      cmocka_unit_test(test_bad_dir_is_reported),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
