/*
 * gnuplot: draw PNG plots by running Debian's gnuplot (package gnuplot-nox,
 * installed by scripts/setup) on a script. The benchmarks and the simulator
 * write their data as CSV and describe each plot as a gnuplot script; this
 * module only runs the program, so no plotting code of our own exists.
 *
 * gnuplot_run: main thread only (it ignores SIGPIPE process-wide while it
 * writes the script); it blocks until gnuplot exits. The append helpers:
 * any thread.
 */
#ifndef CONVERGER_TOOLS_PLOT_GNUPLOT_H
#define CONVERGER_TOOLS_PLOT_GNUPLOT_H

#include <stddef.h>

/* Run `gnuplot` with `script` (NUL-terminated gnuplot commands; paths in
 * it are relative to `dir`, or absolute) as its standard input, with `dir`
 * (NULL: the current directory) as its working directory. The script
 * chooses its own terminal and output, e.g. `set terminal pngcairo size
 * 1000,500` and `set output "arrivals.png"`.
 *
 * Returns 0 when gnuplot exited 0. Otherwise -1, with a one-line reason in
 * `err` (`errlen` bytes, always NUL-terminated): gnuplot not installed (run
 * scripts/setup), killed, or its exit status with the last line it wrote to
 * standard error (its error comes after its warnings). The caller decides
 * whether a missing plot fails its run. */
int gnuplot_run(const char *dir, const char *script, char *err, size_t errlen);

/* printf onto the end of the NUL-terminated script in `buf` (`len` bytes in
 * all). Returns 0, or -1 when the result does not fit (then `buf` holds a
 * truncated script that the caller must not run). */
int gnuplot_appendf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Append 'DIR/FILE' as a gnuplot string (single-quoted, a ' inside
 * doubled). Same returns as gnuplot_appendf. */
int gnuplot_append_path(char *buf, size_t len, const char *dir, const char *file);

#endif
