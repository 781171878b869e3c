/*
 * metrics.c: registry behind metrics.h.
 *
 * Series live in one linked list per family; a node has a few hundred at
 * most (routes x status codes), so lookup is a short scan. Histograms use
 * fixed buckets in ms and are guarded by one mutex.
 */
#include "core/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "common/util.h"

typedef enum { M_COUNTER, M_GAUGE, M_HISTOGRAM } mtype_t;

static const double buckets[] = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000};
#define NBUCKETS (sizeof buckets / sizeof buckets[0])

typedef struct series_s {
  struct series_s *next;
  char *labels;
  double value;
  uint64_t counts[NBUCKETS + 1];
  uint64_t count;
  double sum;
} series_t;

typedef struct {
  const char *name;
  mtype_t type;
  const char *help;
  series_t *series;
} family_t;

static family_t families[] = {
    {"converger_connections", M_GAUGE, "Open WebSocket connections.", NULL},
    {"converger_handshakes_total", M_COUNTER, "WebSocket hello handshakes by result.", NULL},
    {"converger_messages_appended_total", M_COUNTER, "Messages committed to the store.", NULL},
    {"converger_messages_delivered_total", M_COUNTER,
     "msg frames queued to subscribers (live and replay).", NULL},
    {"converger_http_requests_total", M_COUNTER, "HTTP requests by route and status code.", NULL},
    {"converger_pool_wait_ms", M_HISTOGRAM, "Time a store job waited for a pool worker (ms).",
     NULL},
    {"converger_pool_jobs_in_flight", M_GAUGE, "Store jobs queued or running.", NULL},
    {"converger_subscriptions", M_GAUGE, "Live subscriptions on this node.", NULL},
    {"converger_protocol_admission_wait_ms", M_HISTOGRAM,
     "Time a hello or sync waited in the admission queue (ms), by result.", NULL},
    {"converger_admission_in_use", M_GAUGE, "Admission slots held (handshake and sync work).",
     NULL},
    {"converger_admission_waiting", M_GAUGE, "Hellos and syncs waiting for an admission slot.",
     NULL},
    {"converger_pool_dropped_total", M_COUNTER,
     "Store jobs dropped by the pool's queue-delay rule, by kind.", NULL},
    {"converger_store_timeouts_total", M_COUNTER,
     "Store jobs whose deadline (CONVERGER_STORE_TIMEOUT_MS) passed, queued or running, by kind.",
     NULL},
    {"converger_accept_refused_total", M_COUNTER,
     "WebSocket upgrades refused by the accept rate limit.", NULL},
    {"converger_upgrades_refused_total", M_COUNTER,
     "WebSocket upgrades refused with 503, by reason (max_connections: CONVERGER_MAX_CONNECTIONS "
     "reached).",
     NULL},
    {"converger_accept_errors_total", M_COUNTER,
     "accept() calls that failed, by reason (emfile, enfile, enobufs, enomem, other).", NULL},
    {"converger_fd_limit_closed_total", M_COUNTER,
     "Connections closed because the process was out of file descriptors, by kind (idle: an "
     "idle or answered HTTP connection closed to make room; pending: a new one closed "
     "unanswered).",
     NULL},
    {"converger_replay_queries_total", M_COUNTER,
     "Replay reads of the store, by kind (hello, fill).", NULL},
    {"converger_resets_total", M_COUNTER,
     "Resumes answered with reset, by reason (ahead: watermark above the head; epoch: another "
     "epoch).",
     NULL},
    {"converger_drain_state", M_GAUGE, "Drain state: 0 ready, 1 draining, 2 shedding.", NULL},
    {"converger_drain_migrated_total", M_COUNTER,
     "Connections told to move (drain or shed) that then closed by themselves.", NULL},
    {"converger_drain_closed_total", M_COUNTER,
     "Connections the drain closed, by reason (paced: 1012 after the window; shutdown: at exit).",
     NULL},
};

static pthread_mutex_t hist_mu = PTHREAD_MUTEX_INITIALIZER;

static family_t *family(const char *name) {
  for (size_t i = 0; i < CV_ARRAY_SIZE(families); i++)
    if (strcmp(families[i].name, name) == 0) return &families[i];
  log_error("metrics: unknown family %s", name);
  return NULL;
}

static series_t *series(family_t *f, const char *labels) {
  if (!labels) labels = "";
  for (series_t *s = f->series; s; s = s->next)
    if (strcmp(s->labels, labels) == 0) return s;
  series_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->labels = strdup(labels);
  s->next = f->series;
  f->series = s;
  return s;
}

void metrics_add(const char *name, const char *labels, uint64_t n) {
  family_t *f = family(name);
  series_t *s = f ? series(f, labels) : NULL;
  if (s) s->value += (double)n;
}

void metrics_set(const char *name, const char *labels, double value) {
  family_t *f = family(name);
  series_t *s = f ? series(f, labels) : NULL;
  if (s) s->value = value;
}

void metrics_observe(const char *name, double v) { metrics_observe_labels(name, NULL, v); }

void metrics_observe_labels(const char *name, const char *labels, double v) {
  family_t *f = family(name);
  if (!f) return;
  pthread_mutex_lock(&hist_mu);
  series_t *s = series(f, labels);
  if (s) {
    size_t i = 0;
    while (i < NBUCKETS && v > buckets[i]) i++;
    s->counts[i]++;
    s->count++;
    s->sum += v;
  }
  pthread_mutex_unlock(&hist_mu);
}

typedef struct {
  char *p;
  size_t len, cap;
} sbuf_t;

static void put(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static void put(sbuf_t *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap * 2 + (size_t)n;
    char *p = realloc(b->p, cap);
    if (!p) return;
    b->p = p;
    b->cap = cap;
  }
}

char *metrics_render(size_t *len) {
  sbuf_t b = {malloc(4096), 0, 4096};
  if (!b.p) return NULL;
  static const char *tnames[] = {"counter", "gauge", "histogram"};
  pthread_mutex_lock(&hist_mu);
  for (size_t i = 0; i < CV_ARRAY_SIZE(families); i++) {
    family_t *f = &families[i];
    put(&b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, tnames[f->type]);
    if (f->type == M_HISTOGRAM) {
      series_t empty = {.labels = ""};
      for (series_t *s = f->series ? f->series : &empty; s; s = s->next) {
        const char *l = s->labels, *comma = l[0] ? "," : "";
        uint64_t cum = 0;
        for (size_t k = 0; k < NBUCKETS; k++) {
          cum += s->counts[k];
          put(&b, "%s_bucket{%s%sle=\"%g\"} %llu\n", f->name, l, comma, buckets[k],
              (unsigned long long)cum);
        }
        put(&b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name, l, comma,
            (unsigned long long)s->count);
        if (l[0])
          put(&b, "%s_sum{%s} %.3f\n%s_count{%s} %llu\n", f->name, l, s->sum, f->name, l,
              (unsigned long long)s->count);
        else
          put(&b, "%s_sum %.3f\n%s_count %llu\n", f->name, s->sum, f->name,
              (unsigned long long)s->count);
      }
      continue;
    }
    if (!f->series) put(&b, "%s 0\n", f->name);
    for (series_t *s = f->series; s; s = s->next) {
      if (s->labels[0])
        put(&b, "%s{%s} %.17g\n", f->name, s->labels, s->value);
      else
        put(&b, "%s %.17g\n", f->name, s->value);
    }
  }
  pthread_mutex_unlock(&hist_mu);
  *len = b.len;
  return b.p;
}

void metrics_reset(void) {
  for (size_t i = 0; i < CV_ARRAY_SIZE(families); i++) {
    series_t *s = families[i].series;
    while (s) {
      series_t *n = s->next;
      free(s->labels);
      free(s);
      s = n;
    }
    families[i].series = NULL;
  }
}
