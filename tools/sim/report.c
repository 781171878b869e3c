/*
 * sim/report.c: summary, timeline.csv and sim.png (see report.h).
 */
#include "sim/report.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "plot/gnuplot.h"

/* Attempts in the SIM_RATE_WINDOW_S seconds ending with second `t`, per
 * minute. */
static double attempts_per_min(const sim_t *s, int t) {
  int64_t sum = 0;
  for (int i = t; i >= 0 && i > t - SIM_RATE_WINDOW_S; i--) sum += s->sec[i].attempts;
  return (double)sum * 60.0 / SIM_RATE_WINDOW_S;
}

/* The most attempts in any 60 consecutive seconds (the whole run if
 * shorter). */
static int64_t peak_attempts_60s(const sim_t *s) {
  int64_t sum = 0, best = 0;
  for (int t = 0; t < s->nsec; t++) {
    sum += s->sec[t].attempts;
    if (t >= 60) sum -= s->sec[t - 60].attempts;
    if (sum > best) best = sum;
  }
  return best;
}

static json_t *seconds_or_null(int64_t v) { return v >= 0 ? json_integer(v) : json_null(); }

json_t *report_summary(const sim_t *s) {
  const sim_params_t *p = &s->p;
  double steady = (double)p->clients * (double)p->churn_per_million / 1e6;
  double peak = 0, peak_cpu = 0;
  int64_t degraded_s = 0;
  for (int t = 0; t < s->nsec; t++) {
    double a = attempts_per_min(s, t);
    if (a > peak) peak = a;
    if (s->sec[t].max_cpu > peak_cpu) peak_cpu = s->sec[t].max_cpu;
    if ((double)(s->sec[t].disconnected + s->sec[t].on_hot) > 0.01 * (double)p->clients)
      degraded_s++;
  }
  /* What the restart makes unavoidable: the clients of the batch that
   * displaced the most, once each, spread over the drain window (migrate)
   * or the close pacing, and never over less than the rate window. */
  double per_node = (double)p->clients / (double)p->nodes, spread_s;
  if (p->drain == SIM_DRAIN_MIGRATE)
    spread_s = (double)p->drain_window_s;
  else
    spread_s = p->close_rate > 0 ? per_node / (double)p->close_rate : 0;
  if (spread_s < SIM_RATE_WINDOW_S) spread_s = SIM_RATE_WINDOW_S;
  double unavoidable = (double)s->max_batch_displaced / spread_s * 60.0 + steady;
  double peak60 = (double)peak_attempts_60s(s);

  json_t *r99 = json_array();
  for (int b = 0; r99 && b < s->next_batch; b++)
    json_array_append_new(r99, seconds_or_null(s->reconnect99_s[b]));
  int64_t peak_max = 0;
  double peak_sum = 0;
  json_t *per_node_peaks = p->nodes <= 16 ? json_array() : NULL; /* a small fleet's, each */
  for (int64_t k = 0; k < p->nodes; k++) {
    int64_t w = s->n[k].peak_welcomes;
    if (w > peak_max) peak_max = w;
    peak_sum += (double)w;
    if (per_node_peaks) json_array_append_new(per_node_peaks, json_integer(w));
  }
  int64_t done = s->restart_done && s->next_batch == s->nbatches
                     ? (int64_t)(s->restart_done - s->first_start) / SIM_TICKS_PER_S
                     : -1;
  int64_t non_churn = s->attempts - s->churn_attempts;
  json_t *per_displaced =
      s->displaced ? json_real((double)non_churn / (double)s->displaced) : json_null();
  /* the balance at the end: the busiest node's connections over the mean
   * of the nodes up (a restarted node comes back empty) */
  int64_t conns_max = 0, conns_sum = 0, up = 0;
  for (int64_t k = 0; k < p->nodes; k++)
    if (s->n[k].up) {
      conns_sum += s->n[k].conns;
      if (s->n[k].conns > conns_max) conns_max = s->n[k].conns;
      up++;
    }
  double end_spread = conns_sum > 0 ? (double)conns_max * (double)up / (double)conns_sum : 0;
  json_t *j = json_pack(
      "{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:o, s:o, s:I,"
      " s:I, s:b, s:I, s:o, s:I, s:o, s:I, s:I, s:I, s:{s:I, s:f, s:o}, s:{s:I, s:I, s:I, s:I, "
      "s:I},"
      " s:o}",
      "steady_attempts_per_min", steady, "peak_attempts_per_min", peak, "storm_ratio",
      steady > 0 ? peak / steady : 0.0, "peak_attempts_per_min_60s", peak60, "storm_ratio_60s",
      steady > 0 ? peak60 / steady : 0.0, "unavoidable_attempts_per_min", unavoidable,
      "peak_to_unavoidable", peak / unavoidable, "peak_node_cpu", peak_cpu, "nodes_collapsed",
      (json_int_t)s->nodes_collapsed, "collapses", (json_int_t)s->collapses,
      "client_minutes_disconnected", s->disconnected_client_s / 60.0, "sessions_degraded_share",
      (double)s->degraded_sessions / (double)p->clients, "churn_client_minutes_disconnected",
      s->churn_disconnected_client_s / 60.0, "churn_sessions_degraded_share",
      (double)s->churn_degraded_sessions / (double)p->clients, "degraded_s", (json_int_t)degraded_s,
      "reconnect99_s", r99 ? r99 : json_null(), "restart_completed_s", seconds_or_null(done),
      "batches_started", (json_int_t)s->next_batch, "batches", (json_int_t)s->nbatches,
      "restart_aborted", s->aborted, "paused_s", (json_int_t)s->paused_s, "alarm_s",
      seconds_or_null(s->alarm_s), "displaced_clients", (json_int_t)s->displaced,
      "attempts_per_displaced_client", per_displaced, "attempts", (json_int_t)s->attempts,
      "churn_attempts", (json_int_t)s->churn_attempts, "refusals", (json_int_t)s->refusals,
      "peak_arrivals_per_node", "max", (json_int_t)peak_max, "mean", peak_sum / (double)p->nodes,
      "per_node", per_node_peaks ? per_node_peaks : json_null(), "disconnected_ms", "outages",
      (json_int_t)s->nhist, "p50", (json_int_t)sim_outage_percentile(s, 0.50), "p95",
      (json_int_t)sim_outage_percentile(s, 0.95), "p99", (json_int_t)sim_outage_percentile(s, 0.99),
      "max", (json_int_t)sim_outage_percentile(s, 1.0), "params", sim_params_to_json(p));
  if (j) json_object_set_new(j, "end_spread", json_real(end_spread));
  return j;
}

static double num(const json_t *o, const char *key) {
  return json_number_value(json_object_get(o, key));
}

void report_print(const json_t *sum, FILE *out) {
  const json_t *dm = json_object_get(sum, "disconnected_ms");
  const json_t *pa = json_object_get(sum, "peak_arrivals_per_node");
  const json_t *done = json_object_get(sum, "restart_completed_s");
  const json_t *alarm = json_object_get(sum, "alarm_s");
  fprintf(out, "| figure | value |\n| --- | ---: |\n");
  fprintf(out, "| steady attempts/min | %.0f |\n", num(sum, "steady_attempts_per_min"));
  fprintf(out, "| peak attempts/min (%d s window x %d) | %.0f (%.1fx steady) |\n",
          SIM_RATE_WINDOW_S, 60 / SIM_RATE_WINDOW_S, num(sum, "peak_attempts_per_min"),
          num(sum, "storm_ratio"));
  fprintf(out, "| peak attempts in a 60 s window | %.0f (%.1fx steady) |\n",
          num(sum, "peak_attempts_per_min_60s"), num(sum, "storm_ratio_60s"));
  fprintf(out, "| unavoidable attempts/min | %.0f (peak %.2fx) |\n",
          num(sum, "unavoidable_attempts_per_min"), num(sum, "peak_to_unavoidable"));
  fprintf(out, "| peak node CPU | %.0f %% |\n", 100 * num(sum, "peak_node_cpu"));
  fprintf(out, "| nodes collapsed (collapses) | %.0f (%.0f) |\n", num(sum, "nodes_collapsed"),
          num(sum, "collapses"));
  fprintf(out, "| client-minutes without a connection | %.0f |\n",
          num(sum, "client_minutes_disconnected"));
  fprintf(out, "| sessions degraded | %.1f %% |\n", 100 * num(sum, "sessions_degraded_share"));
  fprintf(out,
          "| churn (not counted above): client-minutes out, sessions degraded | %.0f, %.1f %% |\n",
          num(sum, "churn_client_minutes_disconnected"),
          100 * num(sum, "churn_sessions_degraded_share"));
  fprintf(out, "| seconds degraded (> 1 %% of clients out or on a node at 100 %%) | %.0f |\n",
          num(sum, "degraded_s"));
  fprintf(out, "| time to 99 %% of a batch's displaced clients reconnected, per batch | ");
  size_t i;
  json_t *v;
  json_array_foreach(json_object_get(sum, "reconnect99_s"), i, v) {
    if (json_is_null(v))
      fprintf(out, "%snever", i ? " / " : "");
    else
      fprintf(out, "%s%lld", i ? " / " : "", (long long)json_integer_value(v));
  }
  fprintf(out, " s |\n");
  if (json_is_null(done))
    fprintf(out, "| restart completed | no: %.0f of %.0f batches started%s |\n",
            num(sum, "batches_started"), num(sum, "batches"),
            json_is_true(json_object_get(sum, "restart_aborted")) ? ", aborted" : "");
  else
    fprintf(out, "| restart completed | %.0f s |\n", json_number_value(done));
  fprintf(out, "| paused | %.0f s |\n", num(sum, "paused_s"));
  if (json_is_null(alarm))
    fprintf(out, "| connections-drop alarm | never |\n");
  else
    fprintf(out, "| connections-drop alarm | at %.0f s |\n", json_number_value(alarm));
  fprintf(out, "| displaced clients | %.0f |\n", num(sum, "displaced_clients"));
  if (json_is_null(json_object_get(sum, "attempts_per_displaced_client")))
    fprintf(out, "| attempts per displaced client | - |\n");
  else
    fprintf(out, "| attempts per displaced client | %.2f |\n",
            num(sum, "attempts_per_displaced_client"));
  fprintf(out, "| peak arrivals/s per node, max / mean | %.0f / %.1f |\n", num(pa, "max"),
          num(pa, "mean"));
  fprintf(out, "| disconnected p50 / p95 / p99 / max | %.0f / %.0f / %.0f / %.0f ms |\n",
          num(dm, "p50"), num(dm, "p95"), num(dm, "p99"), num(dm, "max"));
}

static int write_timeline(const sim_t *s, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "t_s,attempts,attempts_per_min,welcomes,refusals,connected,connected_share,"
             "max_node_cpu,nodes_ready,nodes_hot,collapses,batch,paused\n");
  for (int t = 0; t < s->nsec; t++) {
    const sim_second_t *r = &s->sec[t];
    fprintf(f, "%d,%lld,%.0f,%lld,%lld,%lld,%.5f,%.3f,%d,%d,%d,%d,%d\n", t, (long long)r->attempts,
            attempts_per_min(s, t), (long long)r->welcomes, (long long)r->refusals,
            (long long)r->connected, (double)r->connected / (double)s->p.clients, r->max_cpu,
            r->nodes_ready, r->nodes_hot, r->collapses, r->batch, r->paused);
  }
  return fclose(f);
}

/* Two panels on one time axis: attempts per minute (log scale, with the
 * steady rate), then connected share and the busiest node's CPU. */
static const char plot_script[] =
    "set terminal pngcairo size 1100,700\n"
    "set output 'sim.png'\n"
    "set datafile separator ','\n"
    "set key top right\n"
    "set multiplot layout 2,1 title '%s'\n"
    "set logscale y\n"
    "set ylabel 'attempts per minute'\n"
    "set format y '%%.0e'\n"
    "plot 'timeline.csv' every ::1 using 1:($3 > 0 ? $3 : 1) with lines lw 1.5 "
    "title 'attempts/min (%d s window)', %f with lines dt 2 title 'steady'\n"
    "unset logscale y\n"
    "set format y '%%.0f'\n"
    "set xlabel 'simulated time (s)'\n"
    "set ylabel 'percent'\n"
    "set yrange [0:*]\n"
    "set offsets 0, 0, graph 0.06, 0\n" /* a connected share of 100 % clear of the border */
    "plot 'timeline.csv' every ::1 using 1:(100*$7) with lines lw 1.5 title 'connected share', "
    "'' every ::1 using 1:(100*$8) with lines title 'busiest node CPU'\n"
    "unset multiplot\n";

int report_write(const sim_t *s, const json_t *sum, const char *dir, char *err, size_t errlen) {
  char path[4096];
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  snprintf(path, sizeof path, "%s/summary.json", dir);
  if (json_dump_file(sum, path, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) != 0) {
    snprintf(err, errlen, "cannot write %s", path);
    return -1;
  }
  snprintf(path, sizeof path, "%s/timeline.csv", dir);
  if (write_timeline(s, path) != 0) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  const sim_params_t *p = &s->p;
  char title[256], script[sizeof plot_script + 512], perr[256];
  snprintf(title, sizeof title,
           "converger sim: %lld nodes, %lld clients, lb %s, drain %s, seed %lld",
           (long long)p->nodes, (long long)p->clients,
           json_string_value(json_object_get(json_object_get(sum, "params"), "lb")),
           json_string_value(json_object_get(json_object_get(sum, "params"), "drain")),
           (long long)p->seed);
  double steady = num(sum, "steady_attempts_per_min");
  snprintf(script, sizeof script, plot_script, title, SIM_RATE_WINDOW_S, steady > 0 ? steady : 1.0);
  if (gnuplot_run(dir, script, perr, sizeof perr) != 0)
    fprintf(stderr, "converger sim: no sim.png: %s\n", perr);
  return 0;
}
