/*
 * burst.c: one burst of simultaneous hellos against one node (see
 * bench/burst.h).
 *
 * The node's plumbing (child process, setup over REST, /proc readings) is
 * bench/node.h's and bench/restc.h's, through a bench_t of its own; only
 * its node fields, its loop and its failure channel (run_fail) are used.
 *
 * Invariants: whatever happens after the node starts, every client that
 * was created is closed with cvg_client_close and its close has completed
 * (or the loop is abandoned after CLOSE_WAIT_MS with a message), the loop is
 * closed, the node is stopped and its directory removed.
 */
#include "bench/burst.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "bench/node.h"
#include "bench/promtext.h"
#include "bench/restc.h"
#include "bench/run.h"
#include "converger/client.h"
#include "common/util.h"
#include "stats/rank.h"

#define WATCH_MS      100          /* deadline, node and signal checks */
#define PROGRESS_MS   5000         /* progress line to stderr */
#define CLOSE_WAIT_MS 20000        /* for every client's close to complete */
#define METRICS_BYTES (256 * 1024) /* GET /metrics answer */

typedef struct burst_s burst_t;

typedef struct {
  burst_t *bu;
  cvg_client_t *c;
  uint64_t welcome_ns; /* first welcome, ns from bu->t0; 0: none yet */
} bclient_t;

struct burst_s {
  bench_t *b;
  bclient_t *cl;
  size_t n, created, welcomed, closed, failed_clients;
  uint64_t t0, deadline_ns, last_progress_ns;
  uint64_t timeout_ns; /* a welcome later than this after t0 does not count */
  int timed_out, closing;
  uv_timer_t watch;
};

/* ---- the node's /metrics ----------------------------------------------------- */

/* The observations of histogram `name` (series matching `labels`) between
 * the two scrapes: their count, their mean, and the bucket of the largest
 * one, (lo, hi] (its nearest rank at p = 1); hi = 0 when there is none,
 * INFINITY above the last bound. */
static void hist_delta(const char *before, const char *after, const char *name, const char *labels,
                       double *count, double *mean, double *lo, double *hi) {
  promtext_hist_t d, hb;
  promtext_hist(after, name, labels, &d);
  promtext_hist(before, name, labels, &hb);
  promtext_hist_add(&d, &hb, -1);
  *count = d.count;
  *mean = d.count > 0 ? d.sum / d.count : 0;
  *lo = *hi = 0;
  size_t k = rank_bucket(d.cum, d.n, 1.0);
  if (k < d.n) {
    *hi = d.le[k];
    *lo = k > 0 ? d.le[k - 1] : 0;
  }
}

/* after - before of the samples `name` matching `labels`. */
static double value_delta(const char *before, const char *after, const char *name,
                          const char *labels) {
  return promtext_value(after, name, labels) - promtext_value(before, name, labels);
}

/* GET /metrics into a malloc'ed string; NULL after run_fail. */
static char *metrics_get(bench_t *b) {
  char *text = malloc(METRICS_BYTES);
  if (!text) {
    run_fail(b, "out of memory");
    return NULL;
  }
  if (restc_expect(b, "GET", "/metrics", NULL, NULL, 200, text, METRICS_BYTES) != 0) {
    free(text);
    return NULL;
  }
  return text;
}

static void metrics_delta(const char *before, const char *after, burst_result_t *r) {
  hist_delta(before, after, "converger_pool_wait_ms", NULL, &r->pool_jobs, &r->pool_wait_mean_ms,
             &r->pool_wait_peak_lo, &r->pool_wait_peak_ms);
  const char *ok = "result=\"ok\"", *over = "result=\"overloaded\"";
  hist_delta(before, after, "converger_protocol_admission_wait_ms", ok, &r->adm_ok,
             &r->adm_wait_mean_ms, &r->adm_wait_peak_lo, &r->adm_wait_peak_ms);
  r->adm_overloaded =
      value_delta(before, after, "converger_protocol_admission_wait_ms_count", over);
  const char *hs = "converger_handshakes_total";
  r->pool_dropped = value_delta(before, after, "converger_pool_dropped_total", NULL);
  r->hs_ok = value_delta(before, after, hs, ok);
  r->hs_overloaded = value_delta(before, after, hs, over);
  r->hs_unavailable = value_delta(before, after, hs, "result=\"unavailable\"");
  hist_delta(before, after, "converger_tls_handshake_ms", NULL, &r->tls_ok, &r->tls_mean_ms,
             &r->tls_peak_lo, &r->tls_peak_ms);
  r->tls_failed = value_delta(before, after, "converger_tls_handshakes_total", "result=\"failed\"");
}

/* The node's start-up line from node.log, from its "pool" settings on. */
static void node_line(bench_t *b, char *out, size_t len) {
  out[0] = '\0';
  char path[sizeof b->dir + 16], line[1024];
  snprintf(path, sizeof path, "%s/node.log", b->dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "admission");
    if (!p) continue;
    const char *from = strstr(line, "pool ");
    snprintf(out, len, "%s", from && from < p ? from : p);
    out[strcspn(out, "\r\n")] = '\0';
    break;
  }
  fclose(f);
}

/* ---- the clients ------------------------------------------------------------- */

static void on_state(void *ud, cvg_state_t state, const char *detail) {
  bclient_t *x = ud;
  burst_t *bu = x->bu;
  if ((state == CVG_STATE_CONNECTED || state == CVG_STATE_MIGRATING) && !x->welcome_ns) {
    uint64_t d = run_now_ns() - bu->t0;
    x->welcome_ns = d > 0 ? d : 1;
    if (++bu->welcomed == bu->n && !bu->closing) uv_stop(&bu->b->loop);
  } else if (state == CVG_STATE_FAILED) {
    bu->failed_clients++;
    run_fail(bu->b, "client %zu stopped for good: %s", (size_t)(x - bu->cl), detail);
  }
}

static void on_closed(void *ud) {
  bclient_t *x = ud;
  burst_t *bu = x->bu;
  if (++bu->closed == bu->created) uv_stop(&bu->b->loop);
}

static void watch_cb(uv_timer_t *t) {
  burst_t *bu = t->data;
  bench_t *b = bu->b;
  uint64_t now = run_now_ns();
  char why[96];
  if (bu->closing) { /* only the bound on the closes: they are not measured */
    if (now >= bu->deadline_ns) uv_stop(&b->loop);
    return;
  }
  if (run_interrupted) {
    run_fail(b, "interrupted by signal %d", (int)run_interrupted);
    return;
  }
  if (bnode_gone(b)) {
    run_fail(b, "the node exited (%s)", bnode_status_text(b->node_status, why, sizeof why));
    return;
  }
  if (now >= bu->deadline_ns) {
    bu->timed_out = 1;
    uv_stop(&b->loop);
    return;
  }
  if (now - bu->last_progress_ns >= (uint64_t)PROGRESS_MS * 1000000u) {
    bu->last_progress_ns = now;
    uint64_t attempts = 0, unavailable = 0;
    for (size_t i = 0; i < bu->n; i++) {
      cvg_stats_t s;
      cvg_client_stats(bu->cl[i].c, &s);
      attempts += s.attempts;
      unavailable += s.unavailable;
    }
    fprintf(stderr, "  ... %.0f s: %zu/%zu welcomed, %llu attempts, %llu unavailable answers\n",
            (double)(now - bu->t0) / RUN_NS, bu->welcomed, bu->n, (unsigned long long)attempts,
            (unsigned long long)unavailable);
  }
}

/* The p-quantile (stats/rank.h) of the sorted first welcomes, in ms;
 * INFINITY when it falls on a client never welcomed. */
static double rank_ms(const uint64_t *sorted, size_t n, double p) {
  uint64_t v = sorted[rank_nearest(p, n) - 1];
  return v == UINT64_MAX ? INFINITY : (double)v / 1e6;
}

static void collect(burst_t *bu, burst_result_t *r) {
  uint64_t *w = malloc(bu->n * sizeof *w);
  for (size_t i = 0; i < bu->n; i++) {
    cvg_stats_t s;
    cvg_client_stats(bu->cl[i].c, &s);
    r->attempts += s.attempts;
    r->unavailable += s.unavailable;
    if (s.unavailable > 0) r->refused++;
    /* The watch timer notices the deadline a loop turn late at worst: a
     * welcome read after it does not count. */
    uint64_t t = bu->cl[i].welcome_ns;
    if (t && t <= bu->timeout_ns)
      r->welcomed++;
    else
      t = UINT64_MAX;
    if (w) w[i] = t;
  }
  r->p50_ms = r->p95_ms = r->max_ms = INFINITY;
  if (w) {
    qsort(w, bu->n, sizeof *w, run_cmp_u64);
    r->p50_ms = rank_ms(w, bu->n, 0.50);
    r->p95_ms = rank_ms(w, bu->n, 0.95);
    r->max_ms = rank_ms(w, bu->n, 1.0);
    free(w);
  }
}

/* Close every client that was created and let the closes complete. */
static void close_all(burst_t *bu) {
  bench_t *b = bu->b;
  bu->closing = 1;
  bu->deadline_ns = run_now_ns() + (uint64_t)CLOSE_WAIT_MS * 1000000u;
  for (size_t i = 0; i < bu->created; i++) cvg_client_close(bu->cl[i].c, on_closed, &bu->cl[i]);
  if (bu->closed < bu->created) uv_run(&b->loop, UV_RUN_DEFAULT);
  if (bu->closed < bu->created)
    fprintf(stderr, "converger bench admission: %zu of %zu clients still closing after %d s\n",
            bu->created - bu->closed, bu->created, CLOSE_WAIT_MS / 1000);
}

/* Create and start the clients, run the burst, collect the figures. */
static int burst_clients(burst_t *bu, const burst_config_t *cfg, burst_result_t *r) {
  bench_t *b = bu->b;
  char url[64], err[256];
  snprintf(url, sizeof url, "%s://127.0.0.1:%d/v1/ws", cfg->tls ? "wss" : "ws", b->port);
  const char *urls[1] = {url};
  char convs[RUN_CONVS][32];
  for (int i = 0; i < RUN_CONVS; i++) run_conv_name(i, convs[i]);
  for (size_t i = 0; i < bu->n; i++) {
    cvg_sub_t sub = {.conv = convs[i % RUN_CONVS], .watermark = 0};
    cvg_options_t o;
    cvg_options_init(&o);
    o.urls = urls;
    o.nurls = 1;
    o.token = b->token;
    o.subs = &sub;
    o.nsubs = 1;
    o.client_name = "bench-admission";
    o.tls_ca_file = cfg->tls ? b->tls_cert : NULL;
    o.cb.on_state = on_state;
    o.userdata = &bu->cl[i];
    bu->cl[i].bu = bu;
    int rc = cvg_client_new(&b->loop, &o, &bu->cl[i].c, err, sizeof err);
    if (rc != 0) {
      run_fail(b, "cvg_client_new (client %zu): %s", i, err);
      return -1;
    }
    bu->created++;
  }
  char *before = metrics_get(b);
  if (!before) return -1;
  bnode_cpu_snap_t c0, c1;
  bnode_cpu_snap(b, &c0);
  long rss0 = bnode_status_kb(b->pid, "VmRSS");
  bu->t0 = bu->last_progress_ns = run_now_ns();
  bu->timeout_ns = (uint64_t)cfg->timeout_s * (uint64_t)RUN_NS;
  bu->deadline_ns = bu->t0 + bu->timeout_ns;
  for (size_t i = 0; i < bu->n; i++)
    if (cvg_client_start(bu->cl[i].c) != 0) {
      run_fail(b, "cvg_client_start (client %zu) failed", i);
      free(before);
      return -1;
    }
  r->start_ms = (double)(run_now_ns() - bu->t0) / 1e6;
  uv_timer_start(&bu->watch, watch_cb, WATCH_MS, WATCH_MS);
  if (bu->welcomed < bu->n && !b->failed) uv_run(&b->loop, UV_RUN_DEFAULT);
  bnode_cpu_snap(b, &c1);
  if (b->failed) {
    free(before);
    return -1;
  }
  r->node_cpu_s = bnode_cpu_text(&c0, &c1, r->cpu_text, sizeof r->cpu_text);
  collect(bu, r);
  long rss1 = bnode_status_kb(b->pid, "VmRSS");
  r->rss_per_client = rss0 > 0 && rss1 > 0 && r->welcomed > 0
                          ? (double)(rss1 - rss0) * 1024.0 / (double)r->welcomed
                          : 0;
  char *after = metrics_get(b);
  if (after) metrics_delta(before, after, r);
  free(before);
  free(after);
  return after ? 0 : -1;
}

int burst_run(const burst_config_t *cfg, burst_result_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->clients = (size_t)cfg->clients;
  bench_t *b = calloc(1, sizeof *b);
  burst_t bu = {.b = b, .n = (size_t)cfg->clients};
  bu.cl = calloc(bu.n, sizeof *bu.cl);
  if (!b || !bu.cl) {
    snprintf(err, errlen, "out of memory");
    free(b);
    free(bu.cl);
    return -1;
  }
  b->node_cpu = cfg->node_cpu;
  b->client_cpu = -1;
  b->timeout_s = cfg->timeout_s;
  b->phase = "burst";
  b->tls = cfg->tls;
  b->port = cfg->port; /* 0: bnode_start picks a free one */
  b->keep_port = cfg->port > 0;
  char pool[48], conc[48];
  snprintf(pool, sizeof pool, "CONVERGER_POOL_SIZE=%d", cfg->pool);
  snprintf(conc, sizeof conc, "WS_HANDSHAKE_CONCURRENCY=%d",
           cfg->admission_on ? 0 : BURST_ADMISSION_OFF);
  const char *env[] = {pool, conc, NULL};
  int status = -1;
  if (bnode_start_env(b, env) != 0 || bnode_wait_ready(b) != 0 || restc_setup(b) != 0) goto out;
  node_line(b, out->node_line, sizeof out->node_line);
  out->port = b->port;
  if (uv_loop_init(&b->loop) != 0) {
    run_fail(b, "uv_loop_init failed");
    goto out;
  }
  b->loop_ready = 1;
  uv_timer_init(&b->loop, &bu.watch);
  bu.watch.data = &bu;
  status = burst_clients(&bu, cfg, out);
  close_all(&bu);
  uv_close((uv_handle_t *)&bu.watch, NULL);
  for (int i = 0; i < 8 && uv_loop_alive(&b->loop); i++) uv_run(&b->loop, UV_RUN_NOWAIT);
  if (uv_loop_close(&b->loop) != 0)
    fprintf(stderr, "converger bench admission: the loop closed with open handles\n");
out:
  if (b->failed) {
    snprintf(err, errlen, "%s", b->err);
    bnode_print_log_tail(b, 20);
    status = -1;
  }
  bnode_stop(b);
  bnode_remove_dir(b);
  free(b->token);
  free(b);
  free(bu.cl);
  return status;
}
