/*
 * metrics.c: registry behind metrics.h.
 *
 * The families are one constant table; a registry holds, for each family,
 * one linked list of series. A node has a few hundred at most (routes x
 * status codes), so lookup is a short scan. Histograms use fixed buckets
 * in ms and are guarded by the registry's mutex (hist_mu), which render
 * takes too; counters and gauges are the loop thread's alone.
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
} family_t;

static const family_t families[] = {
    {"converger_connections", M_GAUGE, "Open WebSocket connections."},
    {"converger_handshakes_total", M_COUNTER, "WebSocket hello handshakes by result."},
    {"converger_messages_appended_total", M_COUNTER, "Messages committed to the store."},
    {"converger_messages_delivered_total", M_COUNTER,
     "msg frames queued to subscribers (live and replay)."},
    {"converger_http_requests_total", M_COUNTER, "HTTP requests by route and status code."},
    {"converger_pool_wait_ms", M_HISTOGRAM, "Time a store job waited for a pool worker (ms)."},
    {"converger_shard_store_ms", M_HISTOGRAM,
     "Sharded cluster: time of one store call on a PostgreSQL instance, by db_instance (its index "
     "in the shard map) (ms)."},
    {"converger_shard_errors_total", M_COUNTER,
     "Sharded cluster: store calls that failed for their PostgreSQL instance (refused, broken, "
     "hung), by db_instance."},
    {"converger_shard_up", M_GAUGE,
     "Sharded cluster: 1 while a PostgreSQL instance answers, 0 from its failure until a call "
     "succeeds again (meanwhile its calls fail at once), by db_instance."},
    {"converger_bus_bytes_in_total", M_COUNTER,
     "Bytes received from other nodes' fan-out as they came over the socket: a sharded "
     "cluster's RESP pushes by bus_instance, or PostgreSQL's NotificationResponses "
     "(bus_instance=\"listen\")."},
    {"converger_bus_messages_in_total", M_COUNTER,
     "Pub/sub messages (sharded cluster, by bus_instance) or notifications "
     "(bus_instance=\"listen\") received."},
    {"converger_bus_bytes_out_total", M_COUNTER,
     "Sharded cluster: bytes of messages published to the bus, by bus_instance."},
    {"converger_bus_subscriptions", M_GAUGE,
     "Sharded cluster: conversation channels this node holds subscribed on a bus instance, by "
     "bus_instance."},
    {"converger_bus_up", M_GAUGE,
     "Sharded cluster: 1 while this node's connections to a bus instance work, by bus_instance."},
    {"converger_bus_head_polls_total", M_COUNTER,
     "Sharded cluster: conversations whose head was read from the store instead of heard on the "
     "bus, by reason (subscribed: a new bus subscription; down: its bus instance is down; idle: "
     "the periodic check)."},
    {"converger_pool_jobs_in_flight", M_GAUGE, "Store jobs queued or running."},
    {"converger_subscriptions", M_GAUGE, "Live subscriptions on this node."},
    {"converger_subscriptions_refused_total", M_COUNTER,
     "subscribe frames refused by the node before any store work, by reason "
     "(too_many_subscriptions: the connection holds CONVERGER_MAX_SUBS; forbidden: the token does "
     "not cover the conversation). A hello over CONVERGER_MAX_SUBS is a bad_request handshake."},
    {"converger_protocol_admission_wait_ms", M_HISTOGRAM,
     "Time a hello or sync waited in the admission queue (ms), by result."},
    {"converger_admission_in_use", M_GAUGE, "Admission slots held (handshake and sync work)."},
    {"converger_admission_waiting", M_GAUGE, "Hellos and syncs waiting for an admission slot."},
    {"converger_pool_dropped_total", M_COUNTER,
     "Store jobs dropped by the pool's queue-delay rule, by kind."},
    {"converger_store_batch_jobs", M_HISTOGRAM,
     "Appends committed together by one store transaction (group commit, CONVERGER_APPEND_BATCH)."},
    {"converger_store_timeouts_total", M_COUNTER,
     "Store jobs whose deadline (CONVERGER_STORE_TIMEOUT_MS) passed, queued or running, by kind."},
    {"converger_accept_refused_total", M_COUNTER,
     "WebSocket upgrades refused by the accept rate limit."},
    {"converger_upgrades_refused_total", M_COUNTER,
     "WebSocket upgrades refused with 503, by reason (max_connections: CONVERGER_MAX_CONNECTIONS "
     "reached)."},
    {"converger_accept_errors_total", M_COUNTER,
     "accept() calls that failed, by reason (emfile, enfile, enobufs, enomem, other)."},
    {"converger_fd_limit_closed_total", M_COUNTER,
     "Connections closed because the process was out of file descriptors, by kind (idle: an "
     "idle or answered HTTP connection closed to make room; pending: a new one closed "
     "unanswered)."},
    {"converger_replay_queries_total", M_COUNTER,
     "Replay reads of the store, by kind (hello, fill)."},
    {"converger_rate_limited_total", M_COUNTER,
     "Frames refused with rate_limited, by kind (send, subscribe: subscribe, unsubscribe, sync and "
     "presence; refresh; signal; rest: REST appends and signals, HTTP 429)."},
    {"converger_rate_limit_closes_total", M_COUNTER,
     "Connections closed 1008 rate_limited for sustained abuse of a rate, by kind."},
    {"converger_token_refreshes_total", M_COUNTER,
     "refresh frames, by result (ok; forbidden: another user's token; unauthorized: a bad token, "
     "then close 1008)."},
    {"converger_token_key_reloads_total", M_COUNTER,
     "Reloads of CONVERGER_TOKEN_PUBLIC_KEYS (SIGHUP or a changed file), by result (ok; error: "
     "the keys in use stay)."},
    {"converger_user_disconnects_total", M_COUNTER,
     "Connections closed by POST /admin/users/{user}/disconnect, here or announced by another "
     "node."},
    {"converger_token_expired_total", M_COUNTER,
     "Connections closed 1008 token_expired: the token's exp plus CONVERGER_TOKEN_LEEWAY_MS "
     "passed without a refresh."},
    {"converger_presence_entries", M_GAUGE,
     "Presence entries held on this node (clients and users of conversations with presence; "
     "proto/presence.h)."},
    {"converger_presence_events_total", M_COUNTER,
     "Presence changes told to this node's subscribers, by kind (join, leave)."},
    {"converger_presence_frames_total", M_COUNTER,
     "join and leave frames sent (one change to many subscribers)."},
    {"converger_signals_total", M_COUNTER,
     "signal frames and REST signals accepted on this node, by result (ok; failed: the store did "
     "not take it, error unavailable)."},
    {"converger_signal_frames_total", M_COUNTER,
     "signal frames delivered to this node's subscribers."},
    {"converger_resets_total", M_COUNTER,
     "Resumes answered with reset, by reason (ahead: watermark above the head; epoch: another "
     "epoch)."},
    {"converger_subscription_transitions_refused_total", M_COUNTER,
     "Subscription state moves outside the state table, refused (a bug: the connection was "
     "closed 1011 and the log has a BUG line)."},
    {"converger_drain_state", M_GAUGE, "Drain state: 0 ready, 1 draining, 2 shedding."},
    {"converger_drain_migrated_total", M_COUNTER,
     "Connections told to move (drain or shed) that then closed by themselves."},
    {"converger_drain_closed_total", M_COUNTER,
     "Connections the drain closed, by reason (paced: 1012 after the window; shutdown: at exit)."},
    {"converger_drain_progress", M_GAUGE,
     "The current drain or shed (else the last), by kind: told (sent a drain frame), moved "
     "(left by themselves), closed (with 1012), remaining (WebSocket connections still open "
     "while draining)."},
    {"converger_ws_closes_total", M_COUNTER,
     "WebSocket connections ended, by their first close code (1006: no close frame; other: "
     "a code outside 1000-1015)."},
    {"converger_delivery_latency_ms", M_HISTOGRAM,
     "From a message's commit to its frames queued for the subscribers' sockets (ms), by path "
     "(local: the in-process bus; notify: through PostgreSQL's NOTIFY)."},
    {"converger_append_latency_ms", M_HISTOGRAM,
     "From a REST append's request to its commit (ms)."},
    {"converger_hello_latency_ms", M_HISTOGRAM,
     "From a hello to its welcome (ms), admission wait included."},
    {"converger_tls_handshakes_total", M_COUNTER,
     "TLS handshakes on the client listener, by result (ok, failed, abandoned: the connection "
     "ended first, plain_http: an HTTP request sent to the TLS port)."},
    {"converger_tls_handshake_ms", M_HISTOGRAM,
     "From a TLS connection's first bytes to its completed handshake (ms)."},
    {"converger_tls_reloads_total", M_COUNTER,
     "Loads of CONVERGER_TLS_CERT and CONVERGER_TLS_KEY (at start, on SIGHUP and when a file "
     "changes), by result."},
    {"converger_loop_utilisation", M_GAUGE,
     "Share of the last second the event loop was busy (1 - idle time; libuv's "
     "uv_metrics_idle_time)."},
    {"converger_ready", M_GAUGE, "1 when /readyz answers 200, else 0."},
    {"converger_bus_listening", M_GAUGE,
     "1 when the node hears every commit (SQLite, or PostgreSQL's LISTEN up), else 0."},
    {"converger_capacity_connections", M_GAUGE,
     "Connections the node is sized for (CONVERGER_CAPACITY_CONNECTIONS); 0: not set."},
    {"converger_admission_queue_ms", M_GAUGE,
     "The longest admission wait (WS_HANDSHAKE_QUEUE_MS), for alerts on the wait."},
    {"converger_build_info", M_GAUGE, "Always 1; the labels name the build."},
    {"process_cpu_seconds_total", M_COUNTER, "Total user and system CPU time spent in seconds."},
    {"process_resident_memory_bytes", M_GAUGE, "Resident memory size in bytes."},
    {"process_open_fds", M_GAUGE, "Number of open file descriptors."},
    {"process_max_fds", M_GAUGE, "Maximum number of open file descriptors."},
    {"process_start_time_seconds", M_GAUGE,
     "Start time of the process since unix epoch in seconds."},
};
#define NFAMILIES CV_ARRAY_SIZE(families)

struct metrics_s {
  series_t *series[NFAMILIES]; /* families[i]'s series, newest first */
  pthread_mutex_t hist_mu;     /* the histograms' series; render */
};

metrics_t *metrics_new(void) {
  metrics_t *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  if (pthread_mutex_init(&m->hist_mu, NULL) != 0) {
    free(m);
    return NULL;
  }
  return m;
}

void metrics_free(metrics_t *m) {
  if (!m) return;
  metrics_reset(m);
  pthread_mutex_destroy(&m->hist_mu);
  free(m);
}

/* The index of family `name` in families[], or -1 (logged). */
static int family(const char *name) {
  for (size_t i = 0; i < NFAMILIES; i++)
    if (strcmp(families[i].name, name) == 0) return (int)i;
  log_error("metrics: unknown family %s", name);
  return -1;
}

static series_t *series(metrics_t *m, int f, const char *labels) {
  if (!labels) labels = "";
  for (series_t *s = m->series[f]; s; s = s->next)
    if (strcmp(s->labels, labels) == 0) return s;
  series_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->labels = strdup(labels);
  if (!s->labels) {
    free(s);
    return NULL;
  }
  s->next = m->series[f];
  m->series[f] = s;
  return s;
}

void metrics_add(metrics_t *m, const char *name, const char *labels, uint64_t n) {
  if (!m) return;
  int f = family(name);
  series_t *s = f >= 0 ? series(m, f, labels) : NULL;
  if (s) s->value += (double)n;
}

void metrics_set(metrics_t *m, const char *name, const char *labels, double value) {
  if (!m) return;
  int f = family(name);
  series_t *s = f >= 0 ? series(m, f, labels) : NULL;
  if (s) s->value = value;
}

void metrics_observe(metrics_t *m, const char *name, double v) {
  metrics_observe_labels(m, name, NULL, v);
}

void metrics_observe_labels(metrics_t *m, const char *name, const char *labels, double v) {
  if (!m) return;
  int f = family(name);
  if (f < 0) return;
  pthread_mutex_lock(&m->hist_mu);
  series_t *s = series(m, f, labels);
  if (s) {
    size_t i = 0;
    while (i < NBUCKETS && v > buckets[i]) i++;
    s->counts[i]++;
    s->count++;
    s->sum += v;
  }
  pthread_mutex_unlock(&m->hist_mu);
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

char *metrics_render(metrics_t *m, size_t *len) {
  sbuf_t b = {malloc(4096), 0, 4096};
  if (!b.p) return NULL;
  static const char *const tnames[] = {"counter", "gauge", "histogram"};
  pthread_mutex_lock(&m->hist_mu);
  for (size_t i = 0; i < NFAMILIES; i++) {
    const family_t *f = &families[i];
    series_t *first = m->series[i];
    put(&b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, tnames[f->type]);
    if (f->type == M_HISTOGRAM) {
      series_t empty = {.labels = ""};
      for (series_t *s = first ? first : &empty; s; s = s->next) {
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
    if (!first) put(&b, "%s 0\n", f->name);
    for (series_t *s = first; s; s = s->next) {
      if (s->labels[0])
        put(&b, "%s{%s} %.17g\n", f->name, s->labels, s->value);
      else
        put(&b, "%s %.17g\n", f->name, s->value);
    }
  }
  pthread_mutex_unlock(&m->hist_mu);
  *len = b.len;
  return b.p;
}

void metrics_reset(metrics_t *m) {
  for (size_t i = 0; i < NFAMILIES; i++) {
    series_t *s = m->series[i];
    while (s) {
      series_t *n = s->next;
      free(s->labels);
      free(s);
      s = n;
    }
    m->series[i] = NULL;
  }
}
