/*
 * `converger bench compare --preset adr|gw05`: runs a preset set of `bench
 * roll` scenarios one after the other, each as a child process of this
 * executable with its own throwaway PostgreSQL and --out subdirectory, then
 * prints one side-by-side table of their summary.json figures and writes
 * compare.md with plots that overlay the scenarios (issue 7).
 *
 * Presets:
 *   adr   the admission-queue decision record's harness before its change
 *         (admission off, reconnect to the next node, retry hints ignored,
 *         backoff to 10 s drawn from [b/2, 3b/2], 1012 closes at 500/s),
 *         after it (admission on, a random other node, hints as a floor,
 *         equal jitter capped at 5 s, the same closes), and converger's
 *         default (drain frames, make-before-break migration over the
 *         window).
 *   gw05  the drain lesson's experiment: every client told to move at once
 *         (window 0) against full jitter over the window.
 *
 * Every option that is not compare's own goes to every scenario after the
 * preset's options; options a preset varies are refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/rollplot.h"
#include "bench/run.h"
#include "cli/args.h"
#include "common/util.h"
#include "plot/gnuplot.h"

#define CMD           "converger bench compare"
#define MAX_SCENARIOS 4
#define MAX_ARGS      16
#define MAX_FWD       64
#define DEFAULT_W     "30000"

/* status[] of a scenario besides roll's exit status */
#define STATUS_NOT_RUN (-2) /* interrupted before it, or --plot-only without a summary */
#define STATUS_KILLED  (-1) /* killed by a signal, or fork/exec failed */

typedef struct {
  const char *name;           /* subdirectory and column name */
  const char *title;          /* one line for the table's legend and the plots */
  const char *args[MAX_ARGS]; /* roll options; "@W" is the window option's value */
} scenario_t;

typedef struct {
  const char *name;
  const char *what;        /* one paragraph for compare.md */
  const char *varied[10];  /* roll options the scenarios set, refused from the user */
  const char *refused[4];  /* roll options that would break the preset's shapes */
  const char *refused_why; /* ... and why */
  scenario_t sc[MAX_SCENARIOS];
  size_t nsc;
} preset_t;

static const preset_t presets[] = {
    {"adr",
     "The admission-queue decision record's 10 000-socket rolling restart (docs/background.md), "
     "in three shapes. "
     "**before**: the harness it describes before its change (admission off, every dropped "
     "client reconnects to the next node, `retryAfterMs` ignored, backoff growing to 10 s drawn "
     "from [b/2, 3b/2], 1012 closes at 500/s with no drain frames). **after**: its change "
     "(admission on, a random other node, hints as a floor, equal jitter capped at 5 s, the same "
     "closes). **converger**: this project's default (drain frames with `afterMs` over the "
     "window, make-before-break migration, decorrelated jitter).",
     {"--drain", "--drain-close-rate", "--admission", "--reconnect", "--ignore-hints", "--backoff",
      NULL},
     {"--clients-mode", "--lb", NULL},
     "converger's scenario needs SDK clients that follow drain frames, and behind one load "
     "balancer URL the shapes' --reconnect next and random are the same",
     {{"before",
       "decision record, before: admission off, next node, hints ignored, proportional to 10 s",
       {"--drain", "close", "--drain-close-rate", "500", "--admission", "off", "--reconnect",
        "next", "--ignore-hints", "--backoff", "proportional:250:10000", NULL}},
      {"after",
       "decision record, after: admission on, random node, hints a floor, equal jitter to 5 s",
       {"--drain", "close", "--drain-close-rate", "500", "--admission", "on", "--reconnect",
        "random", "--backoff", "equal:250:5000", NULL}},
      {"converger",
       "converger default: drain frames over the window, make-before-break, decorrelated",
       {"--drain", "migrate", "--drain-window-ms", "@W", "--admission", "on", "--reconnect",
        "random", "--backoff", "decorrelated:250:10000", NULL}}},
     3},
    {"gw05",
     "The drain lesson's experiment (docs/background.md): a drain that tells every client to "
     "reconnect at once "
     "(**at-once**: `afterMs` 0 for all) against one that spreads the moves with full jitter "
     "over the window (**jitter**: `afterMs` uniform in the window). Both migrate "
     "make-before-break; only the window differs.",
     {"--drain", NULL},
     {"--clients-mode", NULL},
     "both scenarios need SDK clients that follow drain frames",
     {{"at-once",
       "no jitter: every client told to move at once (window 0)",
       {"--drain", "migrate", "--drain-window-ms", "0", NULL}},
      {"jitter",
       "full jitter: moves uniform over the window",
       {"--drain", "migrate", "--drain-window-ms", "@W", NULL}}},
     2},
};

static void usage(FILE *out) {
  fprintf(out,
          "usage: " CMD " --preset adr|gw05 [options] [bench roll options]\n\n"
          "Runs a preset set of `converger bench roll` scenarios one after the other and\n"
          "prints their figures side by side (issue 7; docs/benchmarks/rolling-restart/).\n\n"
          "  --preset adr|gw05      adr: the admission-queue decision record's harness before\n"
          "                         and after its change, and converger's default (migrate);\n"
          "                         gw05: the drain lesson's drain with every client told to\n"
          "                         move at once against full jitter over the window (both\n"
          "                         documents: docs/background.md)\n"
          "  --drain-window-ms N    the window of the migrating scenarios [" DEFAULT_W "]\n"
          "  --out DIR              compare.md, the plots, one subdirectory per scenario\n"
          "                         [compare-PRESET]\n"
          "  --plot-only            run nothing: redraw the plots and compare.md from the\n"
          "                         scenarios' outputs already in --out\n\n"
          "Every other option goes to each `bench roll` run (see converger bench roll\n"
          "--help), e.g. --clients, --nodes, --procs, --convs, --send-rate, --seed, --lb,\n"
          "--pg-url (not --lb with adr). The options a preset varies between its\n"
          "scenarios, and those that would break its shapes, are refused.\n"
          "Exit status: 0 when every scenario verified, 1 when one failed (see its\n"
          "report.md), 2 on bad usage, 130 when interrupted.\n");
}

static const preset_t *preset_find(const char *name) {
  for (size_t i = 0; i < CV_ARRAY_SIZE(presets); i++)
    if (strcmp(presets[i].name, name) == 0) return &presets[i];
  return NULL;
}

/* Whether argument `a` is option `name` ("--name" or "--name=..."). */
static int is_option(const char *a, const char *name) {
  size_t n = strlen(name);
  return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

/* Run one scenario: this executable's `bench roll` with the preset's
 * options, the forwarded ones and --out DIR/NAME. A stop signal caught by
 * run_signals_catch is passed on as SIGTERM (roll then stops its nodes and
 * PostgreSQL); the child is also sent SIGTERM if this process dies. Returns
 * its exit status, or -1 when it could not be started or was killed. */
static int run_scenario(const scenario_t *sc, const char *window, char **fwd, int nfwd,
                        const char *dir) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    fprintf(stderr, CMD ": cannot find this executable: %s\n", strerror(errno));
    return -1;
  }
  exe[n] = '\0';
  const char *argv[4 + MAX_ARGS + MAX_FWD + 3];
  int a = 0;
  argv[a++] = exe;
  argv[a++] = "bench";
  argv[a++] = "roll";
  for (size_t i = 0; sc->args[i]; i++)
    argv[a++] = strcmp(sc->args[i], "@W") == 0 ? window : sc->args[i];
  for (int i = 0; i < nfwd; i++) argv[a++] = fwd[i];
  argv[a++] = "--out";
  argv[a++] = dir;
  argv[a] = NULL;
  fprintf(stderr, CMD ": scenario %s:", sc->name);
  for (int i = 1; i < a; i++) fprintf(stderr, " %s", argv[i]);
  fprintf(stderr, "\n");
  /* roll prints its summary.json on stdout (to /dev/null here: compare's
   * stdout is the table); it stops its nodes and PostgreSQL on SIGTERM,
   * which it also gets if compare dies */
  run_spawn_opts_t so = {.out_fd = -1, .err_fd = -1, .death_sig = SIGTERM, .cpu = -1};
  pid_t pid = run_spawn((char *const *)argv, &so);
  if (pid < 0) {
    fprintf(stderr, CMD ": fork: %s\n", strerror(errno));
    return -1;
  }
  int st, forwarded = 0;
  for (;;) {
    if (run_interrupted && !forwarded) {
      kill(pid, SIGTERM);
      forwarded = 1;
    }
    if (waitpid(pid, &st, 0) == pid) break;
    if (errno != EINTR) {
      fprintf(stderr, CMD ": waitpid: %s\n", strerror(errno));
      return -1;
    }
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  fprintf(stderr, CMD ": scenario %s was killed by signal %d\n", sc->name, WTERMSIG(st));
  return -1;
}

/* ---- reading the scenarios' outputs ------------------------------------------------ */

static double num(json_t *j, const char *path) {
  char key[64];
  const char *p = path;
  while (j && *p) {
    const char *dot = strchr(p, '.');
    size_t n = dot ? (size_t)(dot - p) : strlen(p);
    snprintf(key, sizeof key, "%.*s", (int)n, p);
    j = json_object_get(j, key);
    p += n + (dot ? 1 : 0);
  }
  return json_is_number(j) ? json_number_value(j) : NAN;
}

/* The per-node figure `field` of arrivals_per_s, joined with " / ". */
static void per_node(json_t *s, const char *field, char *out, size_t outlen) {
  json_t *arr = json_object_get(s, "arrivals_per_s");
  const char *k;
  json_t *v;
  size_t len = 0;
  out[0] = '\0';
  json_object_foreach(arr, k, v) {
    double x = num(v, field);
    len +=
        (size_t)snprintf(out + len, len < outlen ? outlen - len : 0, "%s%.0f", len ? " / " : "", x);
    if (len >= outlen) break;
  }
  if (!out[0]) snprintf(out, outlen, "-");
}

/* Seconds from SIGTERM to ready again, per restart, joined with " / ". */
static void restart_times(json_t *s, char *out, size_t outlen) {
  json_t *rs = json_object_get(s, "restarts");
  size_t i, len = 0;
  json_t *r;
  out[0] = '\0';
  json_array_foreach(rs, i, r) {
    double t = num(r, "ready_ms") - num(r, "sigterm_ms");
    len += (size_t)snprintf(out + len, len < outlen ? outlen - len : 0, "%s%.1f", len ? " / " : "",
                            t / 1000.0);
    if (len >= outlen) break;
  }
  if (!out[0]) snprintf(out, outlen, "-");
}

/* Sum the timeline's 100 ms buckets into seconds from the first SIGTERM:
 * writes OUT/NAME.1s.csv (t_s, fleet arrivals/s, the busiest node's
 * arrivals/s, fewest connected in the second). Returns 0, or -1 with the
 * reason in err. */
static int write_seconds(const char *out, const char *name, double roll_from_ms, char *err,
                         size_t errlen) {
  char dir[PATH_MAX + 64], path[PATH_MAX + 96];
  int nodes, arr[ROLL_PLOT_MAX_NODES], conn;
  snprintf(dir, sizeof dir, "%s/%s", out, name);
  if (roll_timeline_columns(dir, &nodes, arr, &conn, err, errlen) != 0) return -1;
  snprintf(path, sizeof path, "%s/timeline.csv", dir);
  FILE *in = fopen(path, "r");
  snprintf(path, sizeof path, "%s/%s.1s.csv", out, name);
  FILE *o = in ? fopen(path, "w") : NULL;
  if (!o) {
    run_set_err(err, errlen, "%s: %s", path, strerror(errno));
    if (in) fclose(in);
    return -1;
  }
  char line[4096];
  if (!fgets(line, sizeof line, in)) line[0] = '\0'; /* the header, read above */
  fprintf(o, "t_s,arrivals,busiest_node_arrivals,connected_min\n");
  double from = isnan(roll_from_ms) ? 0 : roll_from_ms;
  long cur = LONG_MIN;
  double total = 0, node[ROLL_PLOT_MAX_NODES] = {0}, cmin = INFINITY;
  for (;;) {
    int more = fgets(line, sizeof line, in) != NULL;
    double v[2 * ROLL_PLOT_MAX_NODES + 8];
    int nv = 0;
    if (more)
      for (char *save, *t = strtok_r(line, ",\n", &save); t && nv < (int)CV_ARRAY_SIZE(v);
           t = strtok_r(NULL, ",\n", &save))
        v[nv++] = strtod(t, NULL);
    long sec = more && nv > 0 ? (long)floor((v[0] - from) / 1000.0) : LONG_MAX;
    if (sec != cur && cur != LONG_MIN) {
      double busiest = 0;
      for (int k = 0; k < nodes; k++) busiest = node[k] > busiest ? node[k] : busiest;
      fprintf(o, "%ld,%.0f,%.0f,%.0f\n", cur, total, busiest, cmin);
      total = 0;
      memset(node, 0, sizeof node);
      cmin = INFINITY;
    }
    if (!more) break;
    cur = sec;
    for (int k = 0; k < nodes; k++)
      if (arr[k] <= nv) { /* 1-based columns */
        node[k] += v[arr[k] - 1];
        total += v[arr[k] - 1];
      }
    if (conn <= nv && v[conn - 1] < cmin) cmin = v[conn - 1];
  }
  fclose(in);
  if (fclose(o) != 0) {
    run_set_err(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* ---- the table, compare.md and the plots -------------------------------------------- */

typedef struct {
  const char *label;
  const char *fmt; /* "%.0f" etc., for one number at `path` */
  const char *path;
} row_t;

static const row_t rows[] = {
    {"acknowledged", "%.0f", "acked"},
    {"**lost**", "%.0f", "lost"},
    {"**duplicates delivered**", "%.0f", "dup_delivered"},
    {"duplicates on the wire", "%.0f", "dup_on_wire"},
    {"clients verified", "%.0f", "clients_verified"},
    {"drops (disconnected samples)", "%.0f", "disconnected_ms.drops"},
    {"disconnected p50 (ms)", "%.0f", "disconnected_ms.p50"},
    {"disconnected p95 (ms)", "%.0f", "disconnected_ms.p95"},
    {"disconnected p99 (ms)", "%.0f", "disconnected_ms.p99"},
    {"disconnected max (ms)", "%.0f", "disconnected_ms.max"},
    {"connection attempts", "%.0f", "attempts"},
    {"make-before-break migrations", "%.0f", "migrations"},
    {"REST sent", "%.0f", "rest_sent"},
    {"REST 503", "%.0f", "rest_503"},
    {"REST retries", "%.0f", "rest_retries"},
    {"`unavailable`", "%.0f", "unavailable"},
    {"`replay_unavailable`", "%.0f", "replay_unavailable"},
    {"admission wait p95 (ms, bucket bound)", "%g", "admission_wait_ms.p95"},
    {"admission wait max (ms, bucket bound)", "%g", "admission_wait_ms.max"},
    {"pool wait peak (ms, bucket bound)", "%g", "pool_wait_peak_ms"},
    {"live latency p50 (ms)", "%g", "live_latency_ms.p50"},
    {"live latency p99 (ms)", "%g", "live_latency_ms.p99"},
    {"delivery latency p99, replays included (ms)", "%g", "delivery_latency_ms.p99"},
};

/* One markdown table: a row per figure, a column per scenario. */
static void print_table(FILE *f, const preset_t *p, json_t **s) {
  fprintf(f, "| figure |");
  for (size_t i = 0; i < p->nsc; i++) fprintf(f, " %s |", p->sc[i].name);
  fprintf(f, "\n| --- |");
  for (size_t i = 0; i < p->nsc; i++) fprintf(f, " ---: |");
  fprintf(f, "\n| status |");
  for (size_t i = 0; i < p->nsc; i++) {
    json_t *st = json_object_get(s[i], "status");
    fprintf(f, " %s |", json_is_string(st) ? json_string_value(st) : "no summary");
  }
  fprintf(f, "\n");
  for (size_t r = 0; r < CV_ARRAY_SIZE(rows); r++) {
    fprintf(f, "| %s |", rows[r].label);
    for (size_t i = 0; i < p->nsc; i++) {
      double v = num(s[i], rows[r].path);
      if (isnan(v)) {
        fprintf(f, " - |");
      } else {
        fprintf(f, " ");
        fprintf(f, rows[r].fmt, v);
        fprintf(f, " |");
      }
    }
    fprintf(f, "\n");
  }
  static const struct {
    const char *label, *field;
  } nodes[] = {{"arrivals/s peak, per node", "peak"}, {"arrivals/s mean, per node", "mean"}};
  char buf[160];
  for (size_t r = 0; r < CV_ARRAY_SIZE(nodes); r++) {
    fprintf(f, "| %s |", nodes[r].label);
    for (size_t i = 0; i < p->nsc; i++) {
      per_node(s[i], nodes[r].field, buf, sizeof buf);
      fprintf(f, " %s |", buf);
    }
    fprintf(f, "\n");
  }
  fprintf(f, "| SIGTERM -> ready, per restart (s) |");
  for (size_t i = 0; i < p->nsc; i++) {
    restart_times(s[i], buf, sizeof buf);
    fprintf(f, " %s |", buf);
  }
  fprintf(f, "\n");
}

/* The overlay plots in OUT: arrivals, connected and the CDF of disconnected
 * time, one line per scenario that has a summary (s[i]). Returns 0, or -1
 * with the reason in err. */
static int plot(const char *out, const preset_t *p, json_t **s, char *err, size_t errlen) {
  /* the CDF clauses name their files by absolute path (`out` is absolute,
   * bench_compare_main), so this holds one path per scenario and more */
  size_t len = 16384 + MAX_SCENARIOS * 2 * (size_t)PATH_MAX;
  char *script = malloc(len);
  if (!script) {
    run_set_err(err, errlen, "out of memory");
    return -1;
  }
  script[0] = '\0';
  int bad = gnuplot_appendf(script, len,
                            "set terminal pngcairo size 1100,520 noenhanced\n"
                            "set datafile separator ','\nset key top right\nset grid\n");
  static const struct {
    const char *file, *title, *ylabel, *col;
  } over[] = {
      {"compare_arrivals.png", "welcomes per second on the whole fleet", "arrivals / s", "2"},
      {"compare_busiest.png", "welcomes per second on the busiest node", "arrivals / s", "3"},
      {"compare_connected.png", "clients connected (fewest in each second)", "clients", "4"},
  };
  for (size_t k = 0; k < CV_ARRAY_SIZE(over); k++) {
    /* from 2 s before the first SIGTERM: the clients' first connections
     * come earlier and would set the scale */
    bad |= gnuplot_appendf(script, len,
                           "set output '%s'\nset title '%s'\nset xlabel 's from the first "
                           "SIGTERM'\nset xrange [-2:*]\nset ylabel '%s'\nplot ",
                           over[k].file, over[k].title, over[k].ylabel);
    size_t drawn = 0;
    for (size_t i = 0; i < p->nsc; i++)
      if (s[i])
        bad |= gnuplot_appendf(script, len,
                               "%s'%s.1s.csv' using 1:%s skip 1 with steps lw 2 "
                               "title '%s'",
                               drawn++ ? ", " : "", p->sc[i].name, over[k].col, p->sc[i].name);
    bad |= gnuplot_appendf(script, len, "%s\n", drawn ? "" : "1/0 title 'no scenario ran'");
  }
  bad |= gnuplot_appendf(script, len,
                         "set output 'compare_disconnected_cdf.png'\nset title 'disconnected time "
                         "per drop (close to next welcome; a make-before-break move is 0)'\n"
                         "set xlabel 'ms'\nset ylabel 'share of drops'\nset xrange [*:*]\n"
                         "set yrange [0:1]\nset offsets graph 0.02, 0, 0, 0\n"
                         "set key bottom right\nplot ");
  size_t elements = 0;
  for (size_t i = 0; i < p->nsc && !bad; i++) {
    if (!s[i]) continue;
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/%s", out, p->sc[i].name);
    size_t before = strlen(script), drops = 0;
    if ((elements && gnuplot_appendf(script, len, ", ") != 0) ||
        roll_plot_cdf_clause(dir, p->sc[i].name, script, len, &drops, err, errlen) != 0) {
      fprintf(stderr, CMD ": %s: %s\n", dir, err);
      drops = 0;
    }
    if (drops)
      elements++;
    else
      script[before] = '\0';
  }
  bad |=
      gnuplot_appendf(script, len, "%s\n", elements ? "" : "1/0 title 'no drop in any scenario'");
  int rc = -1;
  if (bad)
    run_set_err(err, errlen, "plot script too long");
  else
    rc = gnuplot_run(out, script, err, errlen);
  free(script);
  return rc;
}

/* What became of scenario i, for compare.md. */
static const char *status_text(int st, char *buf, size_t len) {
  if (st == STATUS_NOT_RUN) return "not run";
  if (st == STATUS_KILLED) return "killed, or could not start";
  snprintf(buf, len, "exit status %d", st);
  return buf;
}

static void write_md(const char *out, const preset_t *p, json_t **s, int *status, int plot_only,
                     int argc, char **argv, const char *plot_err) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/compare.md", out);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, CMD ": cannot write %s: %s\n", path, strerror(errno));
    return;
  }
  fprintf(f, "# converger bench compare --preset %s\n\n%s\n\n%s:\n\n```\n" CMD, p->name, p->what,
          plot_only ? "Drawn from the scenarios' outputs (the runs' own commands are in "
                      "their report.md) by"
                    : "Command");
  for (int i = 0; i < argc; i++) fprintf(f, " %s", argv[i]);
  fprintf(f, "\n```\n\nScenarios (each one's exact command is in its `report.md`):\n\n");
  for (size_t i = 0; i < p->nsc; i++) {
    char buf[32];
    fprintf(f, "- **%s** (%s): %s. Options:", p->sc[i].name,
            plot_only ? "not run by this command" : status_text(status[i], buf, sizeof buf),
            p->sc[i].title);
    for (size_t a = 0; p->sc[i].args[a]; a++) fprintf(f, " `%s`", p->sc[i].args[a]);
    fprintf(f, " ([report](%s/report.md))\n", p->sc[i].name);
  }
  fprintf(f, "\n`@W` is --drain-window-ms of this command.\n\n## Figures\n\n");
  print_table(f, p, s);
  fprintf(f, "\n## Plots\n\n");
  if (plot_err)
    fprintf(f, "The plots could not be drawn: %s\n", plot_err);
  else
    fprintf(f, "Time runs from each scenario's first SIGTERM; each point sums one second.\n\n"
               "![arrivals](compare_arrivals.png)\n\n![busiest node](compare_busiest.png)\n\n"
               "![connected](compare_connected.png)\n\n"
               "![disconnected CDF](compare_disconnected_cdf.png)\n");
  fclose(f);
}

int bench_compare_main(int argc, char **argv) {
  const char *preset_name = NULL, *out = NULL, *window = DEFAULT_W;
  int plot_only = 0;
  char *fwd[MAX_FWD];
  int nfwd = 0;
  for (int i = 0; i < argc; i++) {
    const char *v;
    int missing = 0;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if ((v = cli_flag_value(argc, argv, &i, "--preset", &missing)))
      preset_name = v;
    else if (!missing && (v = cli_flag_value(argc, argv, &i, "--out", &missing)))
      out = v;
    else if (!missing && (v = cli_flag_value(argc, argv, &i, "--drain-window-ms", &missing)))
      window = v;
    else if (!missing && strcmp(argv[i], "--plot-only") == 0)
      plot_only = 1;
    else if (missing)
      return cli_usage_error("bench compare", "an option needs a value");
    else if (nfwd == MAX_FWD)
      return cli_usage_error("bench compare", "too many options");
    else
      fwd[nfwd++] = argv[i];
  }
  if (!preset_name) return cli_usage_error("bench compare", "--preset adr|gw05 is required");
  const preset_t *p = preset_find(preset_name);
  if (!p) return cli_usage_error("bench compare", "unknown --preset (want adr or gw05)");
  long long w;
  if (cli_parse_ll(window, 0, 3600000, &w) != 0)
    return cli_usage_error("bench compare", "invalid --drain-window-ms (want 0..3600000)");
  for (int i = 0; i < nfwd; i++) {
    char msg[300];
    for (size_t k = 0; p->varied[k]; k++)
      if (is_option(fwd[i], p->varied[k])) {
        snprintf(msg, sizeof msg, "%s is what the %s preset varies between its scenarios", fwd[i],
                 p->name);
        return cli_usage_error("bench compare", msg);
      }
    for (size_t k = 0; p->refused[k]; k++)
      if (is_option(fwd[i], p->refused[k])) {
        snprintf(msg, sizeof msg, "%s would break the %s preset: %s", fwd[i], p->name,
                 p->refused_why);
        return cli_usage_error("bench compare", msg);
      }
  }
  char outbuf[64];
  if (!out) {
    snprintf(outbuf, sizeof outbuf, "compare-%s", p->name);
    out = outbuf;
  }
  char outabs[PATH_MAX];
  if ((mkdir(out, 0755) != 0 && errno != EEXIST) || !realpath(out, outabs)) {
    fprintf(stderr, CMD ": cannot create %s: %s\n", out, strerror(errno));
    return 1;
  }
  out = outabs;

  run_signals_t signals;
  run_signals_catch(&signals);
  json_t *s[MAX_SCENARIOS] = {0};
  int status[MAX_SCENARIOS], result = 0;
  for (size_t i = 0; i < p->nsc; i++) status[i] = STATUS_NOT_RUN;
  for (size_t i = 0; i < p->nsc && !run_interrupted; i++) {
    static const char *const outputs[] = {"summary.json", "timeline.csv", "disconnected_ms.csv"};
    char dir[PATH_MAX + 64], path[PATH_MAX + 96];
    snprintf(dir, sizeof dir, "%s/%s", out, p->sc[i].name);
    if (!plot_only) {
      /* an earlier run's outputs in the same --out must not stand in for
       * this run's, should it die before writing them */
      for (size_t k = 0; k < CV_ARRAY_SIZE(outputs); k++) {
        snprintf(path, sizeof path, "%s/%s", dir, outputs[k]);
        unlink(path);
      }
      snprintf(path, sizeof path, "%s/%s.1s.csv", out, p->sc[i].name);
      unlink(path);
      status[i] = run_scenario(&p->sc[i], window, fwd, nfwd, dir);
      if (status[i] == 2) { /* bad roll options: the same for every scenario */
        result = 2;
        break;
      }
    }
    snprintf(path, sizeof path, "%s/summary.json", dir);
    s[i] = json_load_file(path, 0, NULL);
    if (!s[i]) fprintf(stderr, CMD ": scenario %s: no %s\n", p->sc[i].name, path);
    if (plot_only) {
      json_t *st = json_object_get(s[i], "status");
      status[i] = !s[i]                                                            ? STATUS_NOT_RUN
                  : json_is_string(st) && strcmp(json_string_value(st), "ok") == 0 ? 0
                                                                                   : 1;
    }
    if (status[i] != 0) result = 1;
    /* time 0 of the overlays: the first SIGTERM (restarts[0].sigterm_ms) */
    json_t *first = json_array_get(json_object_get(s[i], "restarts"), 0);
    char err[300];
    if (s[i] && write_seconds(out, p->sc[i].name, num(first, "sigterm_ms"), err, sizeof err) != 0)
      fprintf(stderr, CMD ": %s\n", err);
  }
  run_signals_restore(&signals);
  if (run_interrupted) result = 130;
  if (result != 2) {
    char err[300];
    int pr = plot(out, p, s, err, sizeof err);
    if (pr != 0) fprintf(stderr, CMD ": %s\n", err);
    write_md(out, p, s, status, plot_only, argc, argv, pr == 0 ? NULL : err);
    printf("converger bench compare --preset %s (%s/compare.md)\n\n", p->name, out);
    print_table(stdout, p, s);
  }
  for (size_t i = 0; i < p->nsc; i++) json_decref(s[i]);
  if (result == 130) fprintf(stderr, CMD ": interrupted\n");
  return result;
}
