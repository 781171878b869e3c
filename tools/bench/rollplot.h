/*
 * rollplot: the PNG plots of one `converger bench roll` run (bench/roll.c),
 * drawn by gnuplot (plot/gnuplot.h) from the files the run wrote into its
 * --out directory, so that they can be drawn again from the directory alone;
 * `converger bench compare` reads the same files to overlay runs:
 *
 *   timeline.csv         t_ms, conn_K..., arrivals_K..., connected, ...
 *                        (100 ms buckets; columns found by name)
 *   summary.json         `restarts`: node, sigterm_ms, ready_ms, to_ms
 *   disconnected_ms.csv  header `disconnected_ms`, one sample a line
 *
 * roll_plot_cdf_clause writes gnuplot text that names its data file by the
 * directory given, as given (relative to gnuplot's working directory, which
 * roll_plot leaves as the caller's), single-quoted for gnuplot.
 *
 * roll_plot: main thread (gnuplot_run); the others: any thread. All block
 * on file reads.
 * Errors: -1 with a one-line reason in `err` (`errlen` bytes, always
 * NUL-terminated when errlen > 0).
 */
#ifndef CONVERGER_TOOLS_BENCH_ROLLPLOT_H
#define CONVERGER_TOOLS_BENCH_ROLLPLOT_H

#include <stddef.h>

#define ROLL_PLOT_MAX_NODES 64 /* arrivals_K columns read from timeline.csv */

/* Read the header of DIR/timeline.csv: *nodes (the arrivals_0..K columns,
 * at most ROLL_PLOT_MAX_NODES) and the 1-based column numbers of each
 * arrivals_K (arr_col) and of `connected` (*conn_col). Returns 0, or -1
 * when the file is unreadable or lacks those columns. */
int roll_timeline_columns(const char *dir, int *nodes, int arr_col[ROLL_PLOT_MAX_NODES],
                          int *conn_col, char *err, size_t errlen);

/* Draw into `out_dir` (a roll run's --out): arrivals.png (welcomes per
 * second on each node, summed from the 100 ms buckets, with each restart
 * shaded from its SIGTERM to ready and its span's end dashed),
 * connected.png (connected clients over time) and disconnected_cdf.png (the
 * CDF of disconnected time per drop; with no drop, or only 0 ms drops, a
 * plot that says so). Returns 0, or -1 when a file is missing or
 * unreadable or gnuplot failed (the plots drawn before stay). */
int roll_plot(const char *out_dir, char *err, size_t errlen);

/* Append one run's CDF of disconnected time (ms on x, fraction of drops on
 * y) as one plot element titled `label` (NULL: "disconnected"): a step
 * line, or one point at (0, 1) when every drop was 0 ms; or "" when
 * the run has no drop (then nothing is appended and 0 returned; *ndrops is
 * 0). *ndrops (may be NULL) receives the number of samples. Same returns. */
int roll_plot_cdf_clause(const char *dir, const char *label, char *buf, size_t len, size_t *ndrops,
                         char *err, size_t errlen);

#endif
