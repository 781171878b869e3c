/*
 * sim/params: the parameters of one `converger sim` run, the built-in
 * scenarios, and how a scenario FILE and the command line set them.
 *
 * One table (params.c) names every parameter once, with its unit, range and
 * help line; the same names are the flags (--name VALUE) and the keys of a
 * scenario FILE (a JSON object, read with jansson). Order of precedence:
 * the `fixed` defaults, then the scenario (a preset or a FILE), then flags.
 *
 * Main thread only; nothing here allocates past the call.
 */
#ifndef CONVERGER_TOOLS_SIM_PARAMS_H
#define CONVERGER_TOOLS_SIM_PARAMS_H

#include <stdint.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#include "converger/client.h"

typedef enum { SIM_LB_RANDOM = 0, SIM_LB_HASH, SIM_LB_LEASTCONN } sim_lb_t;
typedef enum { SIM_ACCEPT_REFUSE = 0, SIM_ACCEPT_QUEUE } sim_accept_t;
typedef enum { SIM_DRAIN_CLOSE = 0, SIM_DRAIN_MIGRATE } sim_drain_t;
typedef enum { SIM_TO_LEAST = 0, SIM_TO_TWO, SIM_TO_SPREAD } sim_reconnect_to_t;

typedef struct {
  /* fleet */
  int64_t nodes, clients;
  int64_t headroom;          /* capacity = clients per node / (1 - headroom) */
  int64_t handshake_rate;    /* handshakes/s a node does at 100 % CPU, no other load */
  int64_t refuse_cost;       /* CPU of a refused attempt, % of a handshake */
  int64_t collapse_s;        /* seconds at 100 % CPU before a node drops clients */
  int64_t collapse_share;    /* share of its clients a collapsing node drops */
  int64_t churn_per_million; /* steady reconnects per minute per million clients */
  /* load balancer and accept policy */
  int lb;                 /* sim_lb_t */
  int64_t hash_vnodes;    /* points per node on the consistent-hash ring */
  int admission;          /* sim_accept_t */
  int64_t refuse_wait_ms; /* refuse: longest start delay an attempt is taken with */
  int64_t admission_cpu;  /* queue: handshakes only while CPU is below this */
  int64_t queue_ms;       /* queue: longest wait before a refusal */
  int64_t queue_max;      /* queue: most waiters per node */
  /* clients */
  int backoff; /* cvg_backoff_strategy_t */
  int64_t base_ms, cap_ms, jitter_ms;
  int hints; /* refusals and drain closes carry retryAfterMs */
  int64_t hint_min_ms, hint_max_ms;
  int64_t degraded_ms; /* an outage longer than this degrades a session */
  /* restart */
  int64_t batch, batch_interval_s, settle_s, start_s, restart_s;
  int drain;                  /* sim_drain_t */
  int64_t drain_window_s;     /* migrate: moves spread over this window */
  int reconnect_to;           /* sim_reconnect_to_t: the move's target */
  int64_t close_rate;         /* closes per second per node (0: all at once) */
  int64_t pause_cpu;          /* 0: off; no batch starts while a survivor is above */
  int64_t abort_cpu, abort_s; /* 0: off; abort when a survivor stays above */
  int abort_alarm;            /* abort when the connections-drop alarm fires */
  /* run */
  int64_t duration_s, seed;
} sim_params_t;

/* Set `p` to the built-in scenario `name` ("postmortem", "fixed",
 * "bench"): 0, or -1 for an unknown name. */
int sim_params_preset(sim_params_t *p, const char *name);

/* Parse argv (the arguments after "sim") into `p`: --scenario NAME|FILE
 * first, then every other flag over it. `*out_dir` gets --out (pointing
 * into argv; default "sim-out"). Returns 0, 1 after --help (usage printed
 * to stdout), or 2 after printing one line on stderr naming the bad flag,
 * value, file or key. */
int sim_params_parse(sim_params_t *p, const char **out_dir, int argc, char **argv);

/* Set parameters from the JSON object in file `path` (keys as the flags
 * without "--"; numbers for numbers, strings for names). Returns 0, or -1
 * with a one-line reason in `err` (`errlen` bytes). */
int sim_params_load_file(sim_params_t *p, const char *path, char *err, size_t errlen);

/* Check the parameters against each other (e.g. batch <= nodes, hint_min <=
 * hint_max): 0, or -1 with a reason in `err`. */
int sim_params_check(const sim_params_t *p, char *err, size_t errlen);

/* `p` as a new JSON object, keys as the flags (for summary.json, so that a
 * run says what it ran). The caller owns the reference; NULL when out of
 * memory. */
json_t *sim_params_to_json(const sim_params_t *p);

/* The usage text, every flag with its default (the `fixed` scenario's) and
 * unit. */
void sim_params_usage(FILE *out);

#endif
