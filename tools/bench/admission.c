/*
 * admission.c: `converger bench admission`, the two figures of the
 * admission queue (issue 4, "Benchmark"; docs/benchmarks/admission.md):
 *   1. the queue's throughput on one core: acquire + release pairs per
 *      second through gate/admission.h directly, on a fake clock, in two
 *      patterns: (a) a free slot every time (acquire is GRANTED, release
 *      finds no waiter), (b) contended: one slot and 64 waiters cycling, so
 *      every release hands the slot to the oldest waiter through its
 *      callback and every acquire queues;
 *   2. a burst of --clients simultaneous hellos against one node (pool
 *      --pool, SQLite) with admission on (the node's defaults) and off
 *      (WS_HANDSHAKE_CONCURRENCY=100000), --runs times each, the two modes
 *      alternating with the order swapped every run (bench/burst.h does one
 *      burst).
 *
 * What it owns: the options, the order of things, the medians and the
 * tables. The process is pinned to the second allowed CPU for both parts
 * (part 1 runs alone, before any node exists); the node of each burst is
 * pinned to the first. On a one-CPU machine the node is not pinned.
 *
 * Main thread only. Results go to stdout, progress to stderr. Exit status:
 * 0 when every part ran (whatever the figures), 1 when one failed, 2 on bad
 * usage.
 */
#include "bench/bench.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench/burst.h"
#include "bench/run.h"
#include "common/util.h"
#include "gate/admission.h"

#define QUEUE_MIN_RUNS   5   /* runs of each queue pattern, at least */
#define QUEUE_WAITERS    64  /* waiting in the contended pattern at any time */
#define QUEUE_TARGET_MPS 10  /* millions of pairs per second (issue 4) */
#define FDS_SPARE        256 /* descriptors besides the clients' */

typedef struct {
  long long clients, pool, ops, runs, timeout_s;
  long long port; /* --port: the node's; 0, a free one */
  int tls;        /* --transport wss */
} options_t;

/* ---- options -------------------------------------------------------------------- */

static void usage(FILE *out) {
  fprintf(out, "usage: converger bench admission [options]\n\n"
               "Measures the handshake admission queue (src/gate/admission.h):\n"
               "  1. acquire + release pairs per second through the queue on one CPU, with a\n"
               "     free slot each time and contended (1 slot, 64 waiters cycling);\n"
               "  2. a burst of N simultaneous hellos (libconverger-client, one loop, each\n"
               "     subscribed with watermark 0) against one node it starts (`converger\n"
               "     serve` on 127.0.0.1, a free port or --port, SQLite, pinned to the first CPU; the\n"
               "     bench on the second), with admission on (node defaults) and off\n"
               "     (WS_HANDSHAKE_CONCURRENCY=100000), alternating, medians over the runs.\n"
               "Results go to stdout (ending with Markdown tables), progress to stderr.\n\n"
               "  --clients N   simultaneous clients of each burst [10000]\n"
               "  --pool N      the node's CONVERGER_POOL_SIZE [20]\n"
               "  --ops N       acquire + release pairs of each queue run [20000000]\n"
               "  --runs N      bursts in each mode [3]; each queue pattern runs\n"
               "                max(N, 5) times\n"
               "  --timeout S   a burst ends after S seconds even if clients are left\n"
               "                unwelcomed (they count as not welcomed) [60]\n"
               "  --port N      the node's port on 127.0.0.1, the same for every burst (each\n"
               "                node is stopped before the next starts); 0: a free port the\n"
               "                bench picks before each burst [0]\n"
               "  --transport T ws, or wss: each node serves TLS (CONVERGER_TLS_CERT, a\n"
               "                certificate the bench makes) and every client verifies it;\n"
               "                the TLS handshakes are in the first-welcome times [ws]\n"
               "  --help        this text\n");
}

/* Returns 0, 1 after --help, or -1 after printing why (exit status 2). */
static int parse_options(options_t *o, int argc, char **argv) {
  static const char *cmd = "converger bench admission";
  const char *transport = "ws";
  static const char *const names[] = {"--transport"};
  const char **const dest[] = {&transport};
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  if (!rest) return -1;
  if (run_split_string_options(cmd, argc, argv, names, dest, 1, rest, &nrest) != 0) {
    free(rest);
    return -1;
  }
  const run_int_opt_t opts[] = {
      {"clients", &o->clients, 1, 1000000},   {"pool", &o->pool, 1, 512},
      {"ops", &o->ops, 1000, 100000000000LL}, {"runs", &o->runs, 1, 100},
      {"timeout", &o->timeout_s, 1, 86400},   {"port", &o->port, 0, 65535},
  };
  int r = run_parse_int_options(cmd, nrest, rest, opts, CV_ARRAY_SIZE(opts), usage);
  free(rest);
  if (r != 0) return r;
  if (strcmp(transport, "ws") != 0 && strcmp(transport, "wss") != 0) {
    fprintf(stderr, "%s: invalid --transport \"%s\": want ws or wss\n", cmd, transport);
    return -1;
  }
  o->tls = strcmp(transport, "wss") == 0;
  return 0;
}

/* ---- medians -------------------------------------------------------------------- */

/* The median of `n` values (sorted in place); INFINITY sorts last. */
/* The median of histogram bucket bounds: for an even `n` the upper of the
 * two middle values, so that the answer is a bucket bound. */
static double median_bound(double *v, size_t n) {
  qsort(v, n, sizeof *v, run_cmp_double);
  return v[n / 2];
}

/* ---- part 1: the queue on one core ------------------------------------------------ */

static admission_waiter_t *q_holder; /* the waiter the last hand-off went to */
static uint64_t q_handoffs, q_arms;

static void q_granted(admission_waiter_t *w, int status, uint64_t waited_ms) {
  if (status == 0) q_holder = w;
  q_handoffs++;
}

static void q_arm(void *ud, int64_t at_ms) { q_arms++; }

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One run of `ops` pairs; returns pairs per second, or -1 after printing
 * what went wrong (an outcome the pattern does not expect). The clock
 * (ms) advances every 1024 pairs, so the oldest waiter's deadline moves and
 * the `arm` hook is called now and then, as in the node. */
static double queue_run(int contended, uint64_t ops) {
  admission_t *a = admission_new(1, 10000, QUEUE_WAITERS, q_arm, NULL);
  admission_waiter_t w[QUEUE_WAITERS + 1];
  memset(w, 0, sizeof w);
  if (!a) {
    fprintf(stderr, "converger bench admission: out of memory\n");
    return -1;
  }
  int bad = 0;
  q_handoffs = 0;
  double t0, t1;
  if (!contended) {
    t0 = seconds_now();
    for (uint64_t i = 0; i < ops; i++) {
      uint64_t now = i >> 10;
      bad |= admission_acquire(a, &w[0], now, q_granted) != ADMISSION_GRANTED;
      admission_release(a, &w[0], now);
    }
    t1 = seconds_now();
  } else {
    /* w[0] holds the slot; w[1..64] wait in order. */
    bad |= admission_acquire(a, &w[0], 0, q_granted) != ADMISSION_GRANTED;
    q_holder = &w[0];
    for (int k = 1; k <= QUEUE_WAITERS; k++)
      bad |= admission_acquire(a, &w[k], 0, q_granted) != ADMISSION_QUEUED;
    t0 = seconds_now();
    for (uint64_t i = 0; i < ops; i++) {
      uint64_t now = i >> 10;
      admission_waiter_t *h = q_holder;
      admission_release(a, h, now); /* the oldest waiter's callback makes it q_holder */
      bad |= admission_acquire(a, h, now, q_granted) != ADMISSION_QUEUED;
    }
    t1 = seconds_now();
    bad |= q_handoffs != ops;
    /* FIFO: after `ops` hand-offs in a ring of 65, the holder is w[ops % 65]. */
    bad |= q_holder != &w[ops % (QUEUE_WAITERS + 1)];
    while (admission_in_use(a) > 0) admission_release(a, q_holder, ops >> 10);
  }
  bad |= admission_in_use(a) != 0 || admission_waiting(a) != 0;
  admission_free(a);
  if (bad) {
    fprintf(stderr, "converger bench admission: the queue answered outside the %s pattern\n",
            contended ? "contended" : "free-slot");
    return -1;
  }
  return (double)ops / (t1 - t0);
}

/* Part 1: prints one line per pattern; returns 0 or -1. */
static int part_queue(const options_t *o, int cpu, double med[2]) {
  int runs = o->runs > QUEUE_MIN_RUNS ? (int)o->runs : QUEUE_MIN_RUNS;
  static const char *what[2] = {
      "free slot (acquire GRANTED, release with no waiter)",
      "contended (1 slot, 64 waiters: release hands off through the callback, acquire queues)"};
  char where[32];
  snprintf(where, sizeof where, cpu >= 0 ? "CPU %d" : "no CPU pinning", cpu);
  for (int p = 0; p < 2; p++) {
    fprintf(stderr, "queue: %s, %d runs of %lld pairs\n", what[p], runs, o->ops);
    if (queue_run(p, (uint64_t)o->ops) < 0) return -1; /* warm-up, not counted */
    double *r = calloc((size_t)runs, sizeof *r);
    if (!r) return -1;
    for (int i = 0; i < runs; i++)
      if ((r[i] = queue_run(p, (uint64_t)o->ops)) < 0) {
        free(r);
        return -1;
      }
    printf("queue %s: %s, %d runs of %lld pairs on %s: runs", p ? "(b)" : "(a)", what[p], runs,
           o->ops, where);
    for (int i = 0; i < runs; i++) printf(" %.1f", r[i] / 1e6);
    med[p] = run_median(r, (size_t)runs);
    printf(" M/s; median %.1f M pairs/s (min %.1f, max %.1f), %.1f ns per pair (target >= %d "
           "M/s: %s)\n",
           med[p] / 1e6, r[0] / 1e6, r[runs - 1] / 1e6, 1e9 / med[p], QUEUE_TARGET_MPS,
           med[p] >= QUEUE_TARGET_MPS * 1e6 ? "met" : "MISSED");
    fflush(stdout);
    free(r);
  }
  return 0;
}

/* ---- part 2: bursts, admission on and off ----------------------------------------- */

static void fmt_ms(double ms, char out[32]) {
  if (isinf(ms))
    snprintf(out, 32, "not reached");
  else
    snprintf(out, 32, "%.0f ms", ms);
}

static void fmt_bucket(double lo, double hi, char out[32]) {
  if (hi == 0)
    snprintf(out, 32, "no job");
  else if (isinf(hi))
    snprintf(out, 32, "> %g ms", lo);
  else
    snprintf(out, 32, "%g-%g ms", lo, hi);
}

static void print_run(int run, int on, const burst_result_t *r) {
  char p50[32], p95[32], mx[32], pool[32], adm[32];
  fmt_ms(r->p50_ms, p50);
  fmt_ms(r->p95_ms, p95);
  fmt_ms(r->max_ms, mx);
  fmt_bucket(r->pool_wait_peak_lo, r->pool_wait_peak_ms, pool);
  fmt_bucket(r->adm_wait_peak_lo, r->adm_wait_peak_ms, adm);
  char over[64] = "", tls[160] = "";
  if (r->tls_ok > 0 || r->tls_failed > 0) {
    char peak[32];
    fmt_bucket(r->tls_peak_lo, r->tls_peak_ms, peak);
    snprintf(tls, sizeof tls,
             "; TLS handshakes ok %.0f (mean %.1f ms, peak bucket %s), failed %.0f", r->tls_ok,
             r->tls_mean_ms, peak, r->tls_failed);
  }
  if (r->adm_overloaded > 0)
    snprintf(over, sizeof over, " (mean wait %.0f ms%s)", r->adm_over_mean_ms,
             r->adm_over_mean_ms < 1 ? ": the queue was full" : "");
  printf("burst run %d, admission %s (node 127.0.0.1:%d: %s): %zu/%zu welcomed (all started in %.0f ms); "
         "%zu clients refused at least once, %llu unavailable answers, %llu attempts; first "
         "welcome p50 %s, p95 %s, max %s; pool: %.0f jobs, wait mean %.1f ms, peak bucket %s, "
         "%.0f dropped; admission waits: %.0f ok (mean %.1f ms, peak bucket %s), %.0f "
         "overloaded%s; handshakes ok %.0f, overloaded "
         "%.0f, unavailable %.0f%s; %s\n",
         run, on ? "on" : "off", r->port, r->node_line[0] ? r->node_line : "?", r->welcomed, r->clients,
         r->start_ms, r->refused, (unsigned long long)r->unavailable,
         (unsigned long long)r->attempts, p50, p95, mx, r->pool_jobs, r->pool_wait_mean_ms, pool,
         r->pool_dropped, r->adm_ok, r->adm_wait_mean_ms, adm, r->adm_overloaded, over, r->hs_ok,
         r->hs_overloaded, r->hs_unavailable, tls, r->cpu_text);
  fflush(stdout);
}

/* The medians of one mode over its runs, field by field. */
typedef struct {
  double welcomed, refused, unavailable, attempts, p50, p95, max, pool_peak, pool_peak_lo,
      pool_mean, dropped, adm_ok, adm_over, adm_mean, adm_peak, adm_peak_lo, node_cpu, tls_mean,
      rss;
} medians_t;

static void medians(const burst_result_t *r, int n, medians_t *m) {
  double v[100];
#define MEDF(field, expr, f)                                                                       \
  do {                                                                                             \
    for (int i = 0; i < n; i++) v[i] = (double)(expr);                                             \
    m->field = f(v, (size_t)n);                                                                    \
  } while (0)
#define MED(field, expr) MEDF(field, expr, run_median)
  MED(welcomed, r[i].welcomed);
  MED(refused, r[i].refused);
  MED(unavailable, r[i].unavailable);
  MED(attempts, r[i].attempts);
  MED(p50, r[i].p50_ms);
  MED(p95, r[i].p95_ms);
  MED(max, r[i].max_ms);
  MEDF(pool_peak, r[i].pool_wait_peak_ms, median_bound);
  MEDF(pool_peak_lo, r[i].pool_wait_peak_lo, median_bound);
  MED(pool_mean, r[i].pool_wait_mean_ms);
  MED(dropped, r[i].pool_dropped);
  MED(adm_ok, r[i].adm_ok);
  MED(adm_over, r[i].adm_overloaded);
  MED(adm_mean, r[i].adm_wait_mean_ms);
  MEDF(adm_peak, r[i].adm_wait_peak_ms, median_bound);
  MEDF(adm_peak_lo, r[i].adm_wait_peak_lo, median_bound);
  MED(node_cpu, r[i].node_cpu_s);
  MED(tls_mean, r[i].tls_mean_ms);
  MED(rss, r[i].rss_per_client);
#undef MED
#undef MEDF
}

static void ratio(double on, double off, char out[32]) {
  if (isinf(on) || isinf(off) || off == 0)
    snprintf(out, 32, "-");
  else
    snprintf(out, 32, on / off >= 0.1 ? "%.2f" : "%.2g", on / off);
}

static void print_table(const options_t *o, const medians_t *on, const medians_t *off, int runs) {
  char a[32], b[32], q[32];
  printf("\nmedians of %d runs per mode, %lld clients (%s), pool %lld:\n\n"
         "| | admission on | admission off | on / off |\n| --- | ---: | ---: | ---: |\n",
         runs, o->clients, o->tls ? "wss://, TLS verified" : "ws://", o->pool);
#define ROW(label, fa, fb, fmt)                                                                    \
  do {                                                                                             \
    snprintf(a, sizeof a, fmt, fa);                                                                \
    snprintf(b, sizeof b, fmt, fb);                                                                \
    ratio(fa, fb, q);                                                                              \
    printf("| %s | %s | %s | %s |\n", label, a, b, q);                                             \
  } while (0)
  char label[64];
  snprintf(label, sizeof label, "welcomed within %lld s", o->timeout_s);
  ROW(label, on->welcomed, off->welcomed, "%.0f");
  ROW("clients refused at least once", on->refused, off->refused, "%.0f");
  ROW("unavailable answers", on->unavailable, off->unavailable, "%.0f");
  ROW("attempts (connections opened)", on->attempts, off->attempts, "%.0f");
  const char *names[3] = {"first welcome p50", "first welcome p95", "first welcome max"};
  double vo[3] = {on->p50, on->p95, on->max}, vf[3] = {off->p50, off->p95, off->max};
  for (int i = 0; i < 3; i++) {
    fmt_ms(vo[i], a);
    fmt_ms(vf[i], b);
    ratio(vo[i], vf[i], q);
    printf("| %s | %s | %s | %s |\n", names[i], a, b, q);
  }
  fmt_bucket(on->pool_peak_lo, on->pool_peak, a);
  fmt_bucket(off->pool_peak_lo, off->pool_peak, b);
  ratio(on->pool_peak, off->pool_peak, q);
  printf("| pool wait peak (highest non-empty bucket) | %s | %s | %s |\n", a, b, q);
  ROW("pool wait mean (ms)", on->pool_mean, off->pool_mean, "%.1f");
  ROW("pool jobs dropped", on->dropped, off->dropped, "%.0f");
  ROW("admission waits ok", on->adm_ok, off->adm_ok, "%.0f");
  ROW("admission waits overloaded", on->adm_over, off->adm_over, "%.0f");
  ROW("admission wait mean, ok (ms)", on->adm_mean, off->adm_mean, "%.1f");
  fmt_bucket(on->adm_peak_lo, on->adm_peak, a);
  fmt_bucket(off->adm_peak_lo, off->adm_peak, b);
  printf("| admission wait peak, ok | %s | %s | - |\n", a, b);
  ROW("node CPU during the burst (s)", on->node_cpu, off->node_cpu, "%.2f");
  ROW("node RSS growth per connected client (bytes)", on->rss, off->rss, "%.0f");
  if (o->tls) ROW("TLS handshake mean (ms)", on->tls_mean, off->tls_mean, "%.1f");
#undef ROW
  fflush(stdout);
}

static int part_bursts(const options_t *o, int node_cpu) {
  int runs = (int)o->runs;
  burst_result_t *res[2]; /* [1]: on, [0]: off */
  res[0] = calloc((size_t)runs, sizeof *res[0]);
  res[1] = calloc((size_t)runs, sizeof *res[1]);
  int status = -1;
  if (!res[0] || !res[1]) goto out;
  for (int run = 0; run < runs; run++)
    for (int k = 0; k < 2; k++) {
      int on = (run % 2 == 0) == (k == 0); /* on, off; off, on; ... */
      burst_config_t cfg = {.clients = (int)o->clients,
                            .pool = (int)o->pool,
                            .node_cpu = node_cpu,
                            .timeout_s = (int)o->timeout_s,
                            .admission_on = on,
                            .tls = o->tls,
                            .port = (int)o->port};
      char err[512];
      if (run_interrupted) { /* start no node that would only be stopped again */
        fprintf(stderr, "converger bench admission: FAILED: interrupted by signal %d\n",
                (int)run_interrupted);
        goto out;
      }
      fprintf(stderr, "burst run %d/%d, admission %s: %lld clients\n", run + 1, runs,
              on ? "on" : "off", o->clients);
      if (burst_run(&cfg, &res[on][run], err, sizeof err) != 0) {
        fprintf(stderr, "converger bench admission: FAILED: burst run %d, admission %s: %s\n",
                run + 1, on ? "on" : "off", err);
        goto out;
      }
      print_run(run + 1, on, &res[on][run]);
    }
  medians_t m_on, m_off;
  medians(res[1], runs, &m_on);
  medians(res[0], runs, &m_off);
  print_table(o, &m_on, &m_off, runs);
  status = 0;
out:
  free(res[0]);
  free(res[1]);
  return status;
}

/* ---- main ------------------------------------------------------------------------ */

int bench_admission_main(int argc, char **argv) {
  options_t o = {.clients = 10000, .pool = 20, .ops = 20000000, .runs = 3, .timeout_s = 60};
  int r = parse_options(&o, argc, argv);
  if (r != 0) return r > 0 ? 0 : 2;

  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    fprintf(stderr, "converger bench admission: sched_getaffinity: %s\n", strerror(errno));
    return 1;
  }
  int cpus[2] = {-1, -1}, ncpu = 0;
  for (int i = 0; i < CPU_SETSIZE && ncpu < 2; i++)
    if (CPU_ISSET(i, &allowed)) cpus[ncpu++] = i;
  int node_cpu = ncpu >= 2 ? cpus[0] : -1, bench_cpu = ncpu >= 2 ? cpus[1] : cpus[0];

  /* Descriptors: the child inherits the raised limit. A client closing
   * one connection while it opens the next holds two for a moment. */
  unsigned long long nofile = run_raise_nofile();
  if ((unsigned long long)(o.clients + FDS_SPARE) > nofile) {
    fprintf(stderr,
            "converger bench admission: %lld clients need %lld descriptors per process; "
            "RLIMIT_NOFILE allows %llu\n",
            o.clients, o.clients + FDS_SPARE, nofile);
    return 2;
  }

  run_signals_t signals;
  run_signals_catch(&signals);
  run_interrupted = 0;

  int status = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(bench_cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    fprintf(stderr, "converger bench admission: cannot pin the bench to CPU %d: %s\n", bench_cpu,
            strerror(errno));
    goto out;
  }
  char node_where[32];
  snprintf(node_where, sizeof node_where, node_cpu >= 0 ? "CPU %d" : "no CPU pinning", node_cpu);
  printf("converger bench admission: bench on CPU %d, each node on %s; RLIMIT_NOFILE %llu\n",
         bench_cpu, node_where, nofile);
  fflush(stdout);
  double q[2];
  if (part_queue(&o, bench_cpu, q) != 0) goto out;
  if (run_interrupted) {
    fprintf(stderr, "converger bench admission: FAILED: interrupted by signal %d\n",
            (int)run_interrupted);
    goto out;
  }
  if (part_bursts(&o, node_cpu) != 0) goto out;
  printf("\n| pattern | median M pairs/s | ns per pair |\n| --- | ---: | ---: |\n"
         "| (a) free slot | %.1f | %.1f |\n| (b) contended, 64 waiters | %.1f | %.1f |\n",
         q[0] / 1e6, 1e9 / q[0], q[1] / 1e6, 1e9 / q[1]);
  fflush(stdout);
  status = 0;
out:
  run_signals_restore(&signals);
  return status;
}
