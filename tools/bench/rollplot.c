/*
 * rollplot: see rollplot.h. Every plot is a gnuplot script built here as
 * text and run by gnuplot_run; no data is transformed in C beyond finding
 * columns by name and counting the disconnected samples.
 */
#include "bench/rollplot.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/run.h"
#include "plot/gnuplot.h"

#define SCRIPT_BYTES 16384
#define TERMINAL     "set terminal pngcairo size 1100,500 font 'sans,10'\n"

int roll_timeline_columns(const char *dir, int *nodes, int arr_col[ROLL_PLOT_MAX_NODES],
                          int *conn_col, char *err, size_t errlen) {
  char path[4096], line[4096];
  snprintf(path, sizeof path, "%s/timeline.csv", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    run_set_err(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  if (!ok) {
    run_set_err(err, errlen, "%s: no header", path);
    return -1;
  }
  line[strcspn(line, "\r\n")] = '\0';
  *nodes = 0;
  *conn_col = 0;
  int col = 0;
  for (char *save = NULL, *tok = strtok_r(line, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    col++;
    int k;
    char tail;
    if (sscanf(tok, "arrivals_%d%c", &k, &tail) == 1 && k == *nodes && k < ROLL_PLOT_MAX_NODES)
      arr_col[(*nodes)++] = col;
    else if (strcmp(tok, "connected") == 0)
      *conn_col = col;
  }
  if (*nodes == 0 || *conn_col == 0) {
    run_set_err(err, errlen, "%s: no arrivals_0 or connected column", path);
    return -1;
  }
  return 0;
}

/* One run's arrivals per second per node as gnuplot plot elements,
 * comma-separated, titled "roll-K", x in seconds from the run's t=0,
 * appended to `buf`; `arr` holds the nodes' arrivals columns
 * (roll_timeline_columns). */
static int roll_plot_arrivals_clause(const char *dir, int nodes, const int *arr, char *buf,
                                     size_t len, char *err, size_t errlen) {
  for (int k = 0; k < nodes; k++) {
    /* floor(t / 1 s) groups ten 100 ms buckets; `smooth frequency` sums them */
    if ((k > 0 && gnuplot_appendf(buf, len, ", ") != 0) ||
        gnuplot_append_path(buf, len, dir, "timeline.csv") ||
        gnuplot_appendf(buf, len,
                        " using (floor($1/1000)):(column(%d)) smooth frequency with steps lw 1.5 "
                        "title 'roll-%d'",
                        arr[k], k) != 0) {
      run_set_err(err, errlen, "plot script too long");
      return -1;
    }
  }
  return 0;
}

/* Count the samples of DIR/disconnected_ms.csv and find the largest. */
static int read_disconnected(const char *dir, size_t *n, long long *max, char *err, size_t errlen) {
  char path[4096], line[64];
  snprintf(path, sizeof path, "%s/disconnected_ms.csv", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    run_set_err(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  *n = 0;
  *max = 0;
  while (fgets(line, sizeof line, f)) {
    char *end;
    long long v = strtoll(line, &end, 10);
    if (end == line) continue; /* the header */
    (*n)++;
    if (v > *max) *max = v;
  }
  fclose(f);
  return 0;
}

int roll_plot_cdf_clause(const char *dir, const char *label, char *buf, size_t len, size_t *ndrops,
                         char *err, size_t errlen) {
  size_t n;
  long long max;
  if (read_disconnected(dir, &n, &max, err, errlen) != 0) return -1;
  if (ndrops) *ndrops = n;
  if (n == 0) return 0;
  /* each sample adds 1/n; `smooth cumulative` sorts by x and sums. When
   * every sample is 0 the CDF is one point at (0, 1), which a step line
   * would not show. */
  if (gnuplot_append_path(buf, len, dir, "disconnected_ms.csv") != 0 ||
      gnuplot_appendf(buf, len, " using 1:(1.0/%zu) smooth cumulative with %s title '%s'", n,
                      max == 0 ? "points pt 7 ps 1.5" : "steps lw 1.5",
                      label ? label : "disconnected") != 0) {
    run_set_err(err, errlen, "plot script too long");
    return -1;
  }
  return 0;
}

/* `set object` / `set arrow` commands marking one run's restarts
 * (summary.json) on a time axis in seconds: a shaded rectangle from SIGTERM
 * to ready, a dashed line at the span's end. */
static int roll_plot_restart_marks(const char *dir, char *buf, size_t len, char *err,
                                   size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) {
    run_set_err(err, errlen, "%s: %s", path, je.text);
    return -1;
  }
  json_t *ra = json_object_get(j, "restarts");
  size_t i;
  json_t *r;
  int rc = 0;
  json_array_foreach(ra, i, r) {
    double from = (double)json_integer_value(json_object_get(r, "sigterm_ms")) / 1000;
    double ready = (double)json_integer_value(json_object_get(r, "ready_ms")) / 1000;
    double to = (double)json_integer_value(json_object_get(r, "to_ms")) / 1000;
    long long node = (long long)json_integer_value(json_object_get(r, "node"));
    if (gnuplot_appendf(
            buf, len,
            "set object rect from %.3f, graph 0 to %.3f, graph 1 behind "
            "fillcolor rgb '#e8e8e8' fillstyle solid noborder\n"
            "set arrow from %.3f, graph 0 to %.3f, graph 1 nohead dashtype 2 lc rgb '#999999'\n"
            "set label 'roll-%lld' at %.3f, graph 0.97 offset 0.3,0 font ',8'\n",
            from, ready, to, to, node, from) != 0) {
      run_set_err(err, errlen, "plot script too long");
      rc = -1;
      break;
    }
  }
  json_decref(j);
  return rc;
}

/* The script's head: terminal, output DIR/PNG, CSV input, titles. */
static int head(char *s, size_t len, const char *dir, const char *png, const char *title,
                const char *xlabel, const char *ylabel) {
  s[0] = '\0';
  if (gnuplot_appendf(s, len, TERMINAL "set output ") != 0 ||
      gnuplot_append_path(s, len, dir, png) != 0 ||
      gnuplot_appendf(
          s, len,
          "\nset datafile separator ','\nset title '%s'\nset xlabel '%s'\nset ylabel '%s'\n"
          "set grid\nset key outside right top\n",
          title, xlabel, ylabel) != 0)
    return -1;
  return 0;
}

static int run(const char *script, const char *png, char *err, size_t errlen) {
  char e[400];
  if (gnuplot_run(NULL, script, e, sizeof e) == 0) return 0;
  run_set_err(err, errlen, "%s: %s", png, e);
  return -1;
}

int roll_plot(const char *out_dir, char *err, size_t errlen) {
  char *s = malloc(SCRIPT_BYTES);
  if (!s) {
    run_set_err(err, errlen, "out of memory");
    return -1;
  }
  int rc = -1, nodes, arr[ROLL_PLOT_MAX_NODES], conn;
  if (roll_timeline_columns(out_dir, &nodes, arr, &conn, err, errlen) != 0) goto out;

  /* arrivals per second per node, restarts marked */
  if (head(s, SCRIPT_BYTES, out_dir, "arrivals.png",
           "Arrivals (welcomes) per second on each node; shaded: SIGTERM to ready, dashed: "
           "end of the restart span",
           "time (s)", "welcomes per second") != 0 ||
      roll_plot_restart_marks(out_dir, s, SCRIPT_BYTES, err, errlen) != 0 ||
      gnuplot_appendf(s, SCRIPT_BYTES, "plot ") != 0 ||
      roll_plot_arrivals_clause(out_dir, nodes, arr, s, SCRIPT_BYTES, err, errlen) != 0 ||
      gnuplot_appendf(s, SCRIPT_BYTES, "\n") != 0 || run(s, "arrivals.png", err, errlen) != 0)
    goto out;

  /* connected clients */
  if (head(s, SCRIPT_BYTES, out_dir, "connected.png",
           "Connected (welcomed) clients, all nodes, 100 ms samples", "time (s)", "clients") != 0 ||
      roll_plot_restart_marks(out_dir, s, SCRIPT_BYTES, err, errlen) != 0 ||
      gnuplot_appendf(s, SCRIPT_BYTES, "plot ") != 0 ||
      gnuplot_append_path(s, SCRIPT_BYTES, out_dir, "timeline.csv") != 0 ||
      gnuplot_appendf(s, SCRIPT_BYTES,
                      " using ($1/1000):(column(%d)) with lines lw 1.5 title 'connected'\n",
                      conn) != 0 ||
      run(s, "connected.png", err, errlen) != 0)
    goto out;

  /* CDF of disconnected time */
  size_t n;
  long long max;
  if (read_disconnected(out_dir, &n, &max, err, errlen) != 0) goto out;
  if (head(s, SCRIPT_BYTES, out_dir, "disconnected_cdf.png",
           "CDF of disconnected time per drop (make-before-break moves are 0 ms)",
           "disconnected (ms)", "fraction of drops") != 0 ||
      gnuplot_appendf(s, SCRIPT_BYTES, "set yrange [0:1.05]\n") != 0)
    goto toolong;
  if (n == 0) {
    if (gnuplot_appendf(
            s, SCRIPT_BYTES,
            "set xrange [0:1000]\nset label 'no drop: no client lost its connection' at "
            "graph 0.3, graph 0.5\nplot 1/0 notitle\n") != 0)
      goto toolong;
  } else {
    if (max == 0 && gnuplot_appendf(s, SCRIPT_BYTES,
                                    "set xrange [-10:1000]\nset label 'all %zu drops were 0 ms "
                                    "(make-before-break)' at graph 0.3, graph 0.5\n",
                                    n) != 0)
      goto toolong;
    if (gnuplot_appendf(s, SCRIPT_BYTES, "plot ") != 0) goto toolong;
    if (roll_plot_cdf_clause(out_dir, "disconnected", s, SCRIPT_BYTES, NULL, err, errlen) != 0)
      goto out;
    if (gnuplot_appendf(s, SCRIPT_BYTES, "\n") != 0) goto toolong;
  }
  if (run(s, "disconnected_cdf.png", err, errlen) != 0) goto out;
  rc = 0;
  goto out;
toolong:
  run_set_err(err, errlen, "plot script too long");
out:
  free(s);
  return rc;
}
