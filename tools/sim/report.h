/*
 * sim/report: what a `converger sim` run writes: the summary (stdout and
 * summary.json), timeline.csv (one row per simulated second) and sim.png
 * (gnuplot, tools/plot/gnuplot.h).
 *
 * summary.json holds only simulated figures and the parameters, never wall
 * time, so that the same seed and flags give a byte-identical file.
 *
 * Main thread; reads a finished sim_t.
 */
#ifndef CONVERGER_TOOLS_SIM_REPORT_H
#define CONVERGER_TOOLS_SIM_REPORT_H

#include <jansson.h>
#include <stdio.h>

#include "sim/model.h"

/* The summary of a finished run as a new JSON object (snake_case keys; the
 * caller owns it), NULL when out of memory. Keys: steady_attempts_per_min,
 * peak_attempts_per_min (attempts in SIM_RATE_WINDOW_S seconds, per
 * minute), storm_ratio, peak_attempts_per_min_60s (the busiest 60 s),
 * storm_ratio_60s, unavoidable_attempts_per_min (the clients of the batch
 * that displaced the most, spread over the drain window or close pacing,
 * at least over the rate window, plus churn), peak_to_unavoidable,
 * peak_node_cpu (1.0 = 100 %; above is work the node could not do),
 * nodes_collapsed, collapses, client_minutes_disconnected and
 * sessions_degraded_share (the restart's outages),
 * churn_client_minutes_disconnected and churn_sessions_degraded_share
 * (churn's), degraded_s, reconnect99_s (per batch: from its start until
 * its nodes are empty and at most 1 % of the clients it displaced are
 * without a connection; null: never), restart_completed_s (null: not
 * completed), batches_started, restart_aborted, paused_s, alarm_s,
 * displaced_clients, attempts_per_displaced_client (null when nobody was
 * displaced), attempts, refusals,
 * peak_arrivals_per_node (max and mean over nodes of each node's busiest
 * second; per_node lists them for up to 16 nodes, null above), disconnected_ms (p50, p95, p99, max
 * of the restart's outages), params. */
json_t *report_summary(const sim_t *s);

/* Print the summary `sum` (from report_summary) as a table to `out`. */
void report_print(const json_t *sum, FILE *out);

/* Write summary.json (`sum`), timeline.csv and sim.png into directory
 * `dir` (created if missing). Returns 0, or -1 with a one-line reason in
 * `err` (`errlen` bytes); a failed plot is a warning on stderr, not an
 * error (gnuplot may be missing). */
int report_write(const sim_t *s, const json_t *sum, const char *dir, char *err, size_t errlen);

#endif
