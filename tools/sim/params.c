/*
 * sim/params.c: the parameter table, the built-in scenarios, flags and
 * scenario files (see params.h).
 *
 * Where a default comes from: the reconnect-storm post-mortem gives the
 * fleet (480 nodes, 13 000 000 clients, 30-node batches every 90 s, 20 %
 * headroom, additive backoff 250 ms / 30 s / 0-100 ms, steady 80 000
 * reconnects per minute) and its action items (decorrelated jitter, hints,
 * pause at 75 %, 35 % headroom, drain-not-disconnect); the admission-queue
 * decision record gives the queue (10 s, 10 000 waiters) and the hints
 * (uniform 1-6 s); the drain lesson gives the jittered drain window. The
 * rest (handshake rate, refusal cost, collapse time) are assumptions,
 * listed in docs/benchmarks/sim.md.
 */
#include "sim/params.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "bench/run.h"

typedef enum { KIND_INT, KIND_ENUM } kind_t;

typedef struct {
  const char *name; /* flag without "--", and the scenario FILE's key */
  kind_t kind;
  size_t offset; /* of an int64_t (KIND_INT) or an int (KIND_ENUM) */
  long long min, max;
  const char *const *names; /* KIND_ENUM: value i is names[i], NULL-terminated */
  const char *unit, *help;
} param_t;

static const char *const lb_names[] = {"random", "hash", "leastconn", NULL};
static const char *const accept_names[] = {"refuse", "queue", NULL};
static const char *const drain_names[] = {"close", "migrate", NULL};
static const char *const to_names[] = {"least", "two", "spread", NULL};
static const char *const onoff_names[] = {"off", "on", NULL};
/* In the order of cvg_backoff_strategy_t (converger/client.h). */
static const char *const backoff_names[] = {"decorrelated", "full",         "equal", "exponential",
                                            "additive",     "proportional", NULL};

#define I(field, lo, hi, unit, help)                                                               \
  { #field, KIND_INT, offsetof(sim_params_t, field), lo, hi, NULL, unit, help }
#define E(field, names, help)                                                                      \
  { #field, KIND_ENUM, offsetof(sim_params_t, field), 0, 0, names, "", help }

/* Names are the struct's fields; flags spell '_' as '-' (param_flag). */
static const param_t params[] = {
    I(nodes, 1, 60000, "nodes", "gateway nodes"), /* a client keeps its node in 16 bits */
    I(clients, 1, 100000000, "clients", "clients, all connected at the start"),
    I(headroom, 1, 95, "%", "spare capacity: capacity = clients per node / (1 - headroom)"),
    I(handshake_rate, 1, 10000000, "/s", "handshakes per second of one node at 100 % CPU"),
    I(refuse_cost, 0, 1000, "% of a handshake", "CPU of a refused attempt"),
    I(collapse_s, 1, 100000, "s", "seconds at 100 % CPU before a node drops its clients"),
    I(collapse_share, 0, 100, "%", "share of its clients a collapsing node drops"),
    I(churn_per_million, 0, 100000000, "/min per 10^6 clients",
      "steady reconnects (Poisson), e.g. 80 000/min at 13 M clients"),
    E(lb, lb_names, "load balancer for reconnects: random, hash (consistent hashing), leastconn"),
    I(hash_vnodes, 1, 1000, "points", "points per node on the hash ring (fewer: more skew)"),
    E(admission, accept_names,
      "accept policy: refuse (handshake now or refuse) or queue (bounded admission queue)"),
    I(refuse_wait_ms, 1, 600000, "ms", "refuse: longest start delay an attempt is taken with"),
    I(admission_cpu, 1, 100, "%", "queue: handshakes run only while the node's CPU is below"),
    I(queue_ms, 1, 600000, "ms", "queue: longest wait in the admission queue"),
    I(queue_max, 1, 10000000, "waiters", "queue: most waiters per node"),
    E(backoff, backoff_names,
      "client backoff: decorrelated, full, equal, exponential, additive, proportional"),
    I(base_ms, 1, 600000, "ms", "backoff base"),
    I(cap_ms, 1, 3600000, "ms", "backoff cap"),
    I(jitter_ms, 1, 600000, "ms", "additive backoff's random part, [0, jitter]"),
    E(hints, onoff_names, "refusals and drain closes carry a retryAfterMs (a floor)"),
    I(hint_min_ms, 0, 600000, "ms", "smallest retryAfterMs"),
    I(hint_max_ms, 0, 600000, "ms", "largest retryAfterMs"),
    I(degraded_ms, 0, 3600000, "ms", "an outage longer than this counts the session degraded"),
    I(batch, 1, 60000, "nodes", "nodes restarted at once"),
    I(batch_interval_s, 0, 100000, "s", "from one batch's start to the next"),
    I(settle_s, 0, 100000, "s", "wait after a batch is ready again before the next"),
    I(start_s, 0, 100000, "s", "first batch starts at"),
    I(restart_s, 0, 100000, "s", "a node's downtime, from empty to ready"),
    E(drain, drain_names,
      "drain: close (1012 closes, then reconnect) or migrate (make-before-break)"),
    I(drain_window_s, 0, 100000, "s", "migrate: moves spread uniformly over this window"),
    E(reconnect_to, to_names,
      "migrate: the move's target, spread (src/gate/spread.h, what converger does), least (most "
      "spare capacity, live) or two (two random choices)"),
    I(close_rate, 0, 100000000, "/s per node", "pace of drain closes (0: all at once)"),
    I(pause_cpu, 0, 100, "%", "no batch starts while a survivor's CPU is above (0: off)"),
    I(abort_cpu, 0, 100, "%", "abort the restart when a survivor stays above (0: off)"),
    I(abort_s, 1, 100000, "s", "... for this long"),
    E(abort_alarm, onoff_names, "abort when connections drop more than 5 % in 60 s"),
    I(duration_s, 1, 86400, "s", "simulated time"),
    I(seed, 0, LLONG_MAX, "", "seed of every random draw"),
};
#define NPARAMS (sizeof params / sizeof params[0])

/* "batch_interval_s" -> "batch-interval-s" (a flag without its "--"). */
static void param_flag(const param_t *d, char *out, size_t len) {
  snprintf(out, len, "%s", d->name);
  for (char *c = out; *c; c++)
    if (*c == '_') *c = '-';
}

static int64_t *int_field(sim_params_t *p, const param_t *d) {
  return (int64_t *)((char *)p + d->offset);
}
static int *enum_field(sim_params_t *p, const param_t *d) { return (int *)((char *)p + d->offset); }

static int enum_value(const param_t *d, const char *text) {
  for (int i = 0; d->names[i]; i++)
    if (strcmp(d->names[i], text) == 0) return i;
  return -1;
}

/* The fixed fleet: the post-mortem's with every action item applied. */
static void preset_fixed(sim_params_t *p) {
  *p = (sim_params_t){
      .nodes = 480,
      .clients = 13000000,
      .headroom = 35,
      .handshake_rate = 10000,
      .refuse_cost = 30,
      .collapse_s = 60,
      .collapse_share = 100,
      .churn_per_million = 6154, /* 80 000 / 13 M */
      .lb = SIM_LB_RANDOM,
      .hash_vnodes = 16,
      .admission = SIM_ACCEPT_QUEUE,
      .refuse_wait_ms = 1000,
      .admission_cpu = 90,
      .queue_ms = 10000,
      .queue_max = 10000,
      .backoff = CVG_BACKOFF_DECORRELATED,
      .base_ms = 250,
      .cap_ms = 30000,
      .jitter_ms = 100,
      .hints = 1,
      .hint_min_ms = 1000,
      .hint_max_ms = 6000,
      .degraded_ms = 10000,
      .batch = 30,
      .batch_interval_s = 90,
      .settle_s = 0,
      .start_s = 30,
      .restart_s = 10,
      .drain = SIM_DRAIN_MIGRATE,
      .drain_window_s = 30,
      .reconnect_to = SIM_TO_SPREAD,
      .close_rate = 0,
      .pause_cpu = 75,
      .abort_cpu = 0,
      .abort_s = 30,
      .abort_alarm = 0,
      .duration_s = 1800,
      .seed = 1,
  };
}

int sim_params_preset(sim_params_t *p, const char *name) {
  preset_fixed(p);
  if (strcmp(name, "fixed") == 0) return 0;
  if (strcmp(name, "postmortem") == 0) {
    /* The post-mortem's fleet: hashed LB, no admission queue, additive
     * backoff with 0-100 ms jitter, no hints, 20 % headroom, no pause, a
     * plain restart (every client closed at once). */
    p->headroom = 20;
    p->lb = SIM_LB_HASH;
    p->admission = SIM_ACCEPT_REFUSE;
    p->backoff = CVG_BACKOFF_ADDITIVE;
    p->hints = 0;
    p->drain = SIM_DRAIN_CLOSE;
    p->pause_cpu = 0;
    return 0;
  }
  if (strcmp(name, "bench") == 0) {
    /* `converger bench roll --drain close` (docs/benchmarks/rolling-restart):
     * 3 nodes, 10 000 SDK clients (decorrelated, 250 ms, 10 s), 1012 closes
     * at 500/s carrying retryAfterMs 1-6 s, a random other node, nodes
     * restarted one at a time with 2 s between, 14 000 handshakes/s. */
    p->nodes = 3;
    p->clients = 10000;
    p->headroom = 80;
    p->handshake_rate = 14000;
    p->churn_per_million = 0;
    p->cap_ms = 10000;
    p->batch = 1;
    p->batch_interval_s = 0;
    p->settle_s = 2;
    p->start_s = 3;
    p->restart_s = 1;
    p->drain = SIM_DRAIN_CLOSE;
    p->close_rate = 500;
    p->pause_cpu = 0;
    p->duration_s = 60;
    return 0;
  }
  return -1;
}

int sim_params_load_file(sim_params_t *p, const char *path, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    if (je.line > 0)
      snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
    else
      snprintf(err, errlen, "%s", je.text);
    return -1;
  }
  if (!json_is_object(root)) {
    snprintf(err, errlen, "%s: want a JSON object of parameters", path);
    json_decref(root);
    return -1;
  }
  const char *key;
  json_t *v;
  int rc = 0;
  json_object_foreach(root, key, v) {
    const param_t *d = NULL;
    char flag[64];
    for (size_t i = 0; i < NPARAMS && !d; i++) {
      param_flag(&params[i], flag, sizeof flag);
      if (strcmp(key, params[i].name) == 0 || strcmp(key, flag) == 0) d = &params[i];
    }
    if (!d) {
      snprintf(err, errlen, "%s: unknown key \"%s\" (see converger sim --help)", path, key);
      rc = -1;
      break;
    }
    if (d->kind == KIND_INT) {
      if (!json_is_integer(v) || json_integer_value(v) < d->min || json_integer_value(v) > d->max) {
        snprintf(err, errlen, "%s: \"%s\" wants an integer in [%lld, %lld]", path, key, d->min,
                 d->max);
        rc = -1;
        break;
      }
      *int_field(p, d) = json_integer_value(v);
    } else {
      int e = json_is_string(v) ? enum_value(d, json_string_value(v)) : -1;
      if (e < 0) {
        snprintf(err, errlen, "%s: \"%s\" wants one of the names in converger sim --help", path,
                 key);
        rc = -1;
        break;
      }
      *enum_field(p, d) = e;
    }
  }
  json_decref(root);
  return rc;
}

int sim_params_check(const sim_params_t *p, char *err, size_t errlen) {
  if (p->batch > p->nodes) {
    snprintf(err, errlen, "--batch %lld is more than --nodes %lld", (long long)p->batch,
             (long long)p->nodes);
    return -1;
  }
  if (p->hint_min_ms > p->hint_max_ms) {
    snprintf(err, errlen, "--hint-min-ms is above --hint-max-ms");
    return -1;
  }
  if (p->cap_ms < p->base_ms) {
    snprintf(err, errlen, "--cap-ms is below --base-ms");
    return -1;
  }
  return 0;
}

json_t *sim_params_to_json(const sim_params_t *p) {
  json_t *o = json_object();
  for (size_t i = 0; o && i < NPARAMS; i++) {
    const param_t *d = &params[i];
    sim_params_t *q = (sim_params_t *)p; /* the accessors do not write */
    json_t *v = d->kind == KIND_INT ? json_integer(*int_field(q, d))
                                    : json_string(d->names[*enum_field(q, d)]);
    if (json_object_set_new(o, d->name, v) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

void sim_params_usage(FILE *out) {
  sim_params_t def;
  preset_fixed(&def);
  fprintf(out,
          "usage: converger sim [--scenario postmortem|fixed|bench|FILE] [options]\n"
          "       converger sim fanout [options]   each node's bus bytes in, NOTIFY to all\n"
          "                                        against interest-routed (see its --help)\n\n"
          "A discrete-event simulation (10 ms steps) of a rolling restart of a gateway\n"
          "fleet and the reconnects it causes (docs/benchmarks/sim.md). The scenario sets\n"
          "every parameter; a FILE is a JSON object with the flags below as keys (without\n"
          "\"--\"; '_' or '-'). Flags override the scenario.\n\n"
          "  --scenario NAME|FILE   postmortem, fixed (the default), bench, or a JSON file\n"
          "  --out DIR              summary.json, timeline.csv, sim.png (default sim-out)\n");
  for (size_t i = 0; i < NPARAMS; i++) {
    const param_t *d = &params[i];
    char flag[64], dflt[64];
    param_flag(d, flag, sizeof flag);
    if (d->kind == KIND_INT)
      snprintf(dflt, sizeof dflt, "%lld%s%s", (long long)*int_field(&def, d), *d->unit ? " " : "",
               d->unit);
    else
      snprintf(dflt, sizeof dflt, "%s", d->names[*enum_field(&def, d)]);
    fprintf(out, "  --%-20s %s (default %s)\n", flag, d->help, dflt);
  }
  fprintf(out, "\nFigures: reconnect99_s is per batch, from its start until its nodes are empty\n"
               "and at most 1 %% of the clients it displaced are without a connection (a\n"
               "make-before-break move never disconnects). client_minutes_disconnected and\n"
               "sessions_degraded_share count the restart's outages only; churn's are in\n"
               "churn_client_minutes_disconnected and churn_sessions_degraded_share.\n");
  fprintf(out, "\nDefaults are the fixed scenario's. Exit status: 0 after a run, 1 when the\n"
               "output cannot be written, 2 on a bad flag, value or scenario.\n");
}

/* Flags that take a name or a path, handed to run_split_string_options. */
#define MAX_STRING_FLAGS 16

int sim_params_parse(sim_params_t *p, const char **out_dir, int argc, char **argv) {
  static const char cmd[] = "converger sim";
  const char *names[MAX_STRING_FLAGS], *values[MAX_STRING_FLAGS] = {0};
  const char **dest[MAX_STRING_FLAGS];
  char flags[MAX_STRING_FLAGS][64];
  const param_t *enums[MAX_STRING_FLAGS];
  size_t ns = 0;
  names[ns] = "--scenario", dest[ns] = &values[ns], enums[ns++] = NULL;
  names[ns] = "--out", dest[ns] = &values[ns], enums[ns++] = NULL;
  long long ints[NPARAMS];
  run_int_opt_t iopts[NPARAMS];
  size_t ni = 0;
  for (size_t i = 0; i < NPARAMS; i++) {
    const param_t *d = &params[i];
    if (d->kind == KIND_ENUM) {
      snprintf(flags[ns], sizeof flags[ns], "--");
      param_flag(d, flags[ns] + 2, sizeof flags[ns] - 2);
      names[ns] = flags[ns], dest[ns] = &values[ns], enums[ns++] = d;
    } else {
      ints[ni] = LLONG_MIN; /* not given */
      iopts[ni] = (run_int_opt_t){d->name, &ints[ni], d->min, d->max};
      ni++;
    }
  }
  /* run_parse_int_options matches "--NAME": give it the dashed names. */
  char inames[NPARAMS][64];
  for (size_t i = 0, k = 0; i < NPARAMS; i++)
    if (params[i].kind == KIND_INT) {
      param_flag(&params[i], inames[k], sizeof inames[k]);
      iopts[k].name = inames[k];
      k++;
    }

  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!rest) {
    fprintf(stderr, "%s: out of memory\n", cmd);
    return 2;
  }
  int nrest = 0, rc = run_split_string_options(cmd, argc, argv, names, dest, ns, rest, &nrest);
  if (rc == 0) rc = run_parse_int_options(cmd, nrest, rest, iopts, ni, sim_params_usage);
  free(rest);
  if (rc != 0) return rc > 0 ? 1 : 2;

  const char *scenario = values[0] ? values[0] : "fixed";
  if (sim_params_preset(p, scenario) != 0) {
    char err[512];
    if (sim_params_load_file(p, scenario, err, sizeof err) != 0) {
      fprintf(stderr, "%s: scenario \"%s\" is not postmortem, fixed or bench, and as a FILE: %s\n",
              cmd, scenario, err);
      return 2;
    }
  }
  *out_dir = values[1] ? values[1] : "sim-out";
  for (size_t k = 2; k < ns; k++) {
    if (!values[k]) continue;
    int e = enum_value(enums[k], values[k]);
    if (e < 0) {
      fprintf(stderr, "%s: invalid %s \"%s\" (see --help)\n", cmd, names[k], values[k]);
      return 2;
    }
    *enum_field(p, enums[k]) = e;
  }
  for (size_t i = 0, k = 0; i < NPARAMS; i++)
    if (params[i].kind == KIND_INT) {
      if (ints[k] != LLONG_MIN) *int_field(p, &params[i]) = ints[k];
      k++;
    }
  char err[256];
  if (sim_params_check(p, err, sizeof err) != 0) {
    fprintf(stderr, "%s: %s\n", cmd, err);
    return 2;
  }
  return 0;
}
