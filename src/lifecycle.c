/*
 * lifecycle.c: what happens to a node from its start to its exit, read top
 * to bottom (lifecycle.h has the phases).
 *
 * 1. serve.c wires the modules, opens the store and the listener and
 *    calls lifecycle_ready: starting -> ready. A PostgreSQL store that
 *    cannot be reached at start is no reason to exit: the node listens,
 *    answers /livez, keeps /readyz at 503 and retries the store with
 *    jittered backoff (lifecycle_store_wait) until it opens; then ready.
 *    Only a configuration error exits.
 * 2. SIGTERM, or POST /admin/drain, calls node_drain: ready -> draining.
 *    The drain policy (gate/drain.c) tells every WebSocket connection to
 *    move, closes the stragglers at its paced rate, and calls node_stop
 *    when none is left or at drain_shutdown_ms.
 * 3. node_stop (also SIGINT, and SIGTERM with drain_shutdown_ms 0):
 *    -> stopping. The listener closes, the revocation refresh and the
 *    membership heartbeat stop (one last beat says "draining"), every
 *    WebSocket connection gets 1001, idle HTTP connections close, and
 *    HTTP answers in flight finish.
 * 4. lifecycle_tick, every 20 ms from then on: once no connection and no
 *    pool job is left, or STOP_GRACE_MS after node_stop, what remains is
 *    closed and the pool joined (its last done callbacks run):
 *    -> stopped.
 * 5. lifecycle_tick again, once the last connection's close callback ran:
 *    the LISTEN connection, the drain, the bus and the node's own handles
 *    close, and uv_run returns in serve.c, which frees the rest and exits
 *    0.
 */
#include "lifecycle.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/rest.h"
#include "bus/bus.h"
#include "core/dburl.h"
#include "bus/pgnotify.h"
#include "bus/redis.h"
#include "cluster/membership.h"
#include "common/util.h"
#include "core/errors.h"
#include "core/log.h"
#include "gate/drain.h"
#include "net/conn.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/session.h"

#define STOP_GRACE_MS    10000 /* longest wait for in-flight work at shutdown */
#define STOPPING_TICK_MS 20    /* the tick while stopping: finish promptly */

static void signal_cb(uv_signal_t *sig, int signum);

/* ---- 1. start ------------------------------------------------------------ */

void lifecycle_signals_start(node_t *node) {
  uv_signal_init(node->loop, &node->sigterm);
  uv_signal_init(node->loop, &node->sigint);
  uv_signal_init(node->loop, &node->sighup);
  node->sigterm.data = node->sigint.data = node->sighup.data = node;
  uv_signal_start(&node->sigterm, signal_cb, SIGTERM);
  uv_signal_start(&node->sigint, signal_cb, SIGINT);
  uv_signal_start(&node->sighup, signal_cb, SIGHUP);
}

void lifecycle_ready(node_t *node) {
  if (node->phase == NODE_STARTING) node->phase = NODE_READY;
}

/* ---- 1b. a store not open at start ----------------------------------------- */

int lifecycle_store_retryable(const char *url, int err) {
  const char *backend = dburl_backend(url);
  if (!backend || strcmp(backend, "postgres") != 0) return 0;
  return err != -CV_EINVAL && err != -CV_ENOMEM;
}

static void store_attempt_cb(uv_timer_t *t);

/* The next attempt after `err`, at a jittered delay: equal jitter
 * (common/jitter.h), so that nodes restarted together do not knock at
 * once, and at most STORE_RETRY_CAP_MS apart. */
static void store_schedule(node_t *node, int err) {
  store_wait_t *w = &node->store_wait;
  snprintf(w->why, sizeof w->why, "cannot open the store: %s", cv_strerror(err));
  int64_t d = jitter_equal(&node->rng, STORE_RETRY_BASE_MS, STORE_RETRY_CAP_MS,
                           w->attempts > 1 ? w->attempts - 1 : 0);
  char shown[512];
  dburl_redact(node->cfg->database_url, shown, sizeof shown);
  log_warn("store: attempt %d to open %s failed (%s); not ready, next attempt in %lld ms",
           w->attempts, shown, cv_strerror(err), (long long)d);
  uv_timer_start(&node->store_retry, store_attempt_cb, (uint64_t)d, 0);
}

static void store_work_cb(uv_work_t *req) {
  node_t *node = req->data;
  node->store_err = pool_prepare(node->cfg->database_url, &node->store_opt, node->cfg->pool_size,
                                 node->metrics, &node->store_prepared);
}

static void store_after_cb(uv_work_t *req, int status) {
  node_t *node = req->data;
  pool_t *prepared = node->store_prepared;
  int err = status == 0 ? node->store_err : -CV_ECANCELED;
  node->store_prepared = NULL;
  node->store_working = 0;
  if (node->phase >= NODE_STOPPING) { /* too late: the node is on its way out */
    pool_discard(prepared);
    return;
  }
  if (err == 0 && (err = pool_launch(prepared, node->loop)) == 0) {
    node->pool = prepared;
    node->store_wait.waiting = 0;
    uv_close((uv_handle_t *)&node->store_retry, NULL); /* no more attempts */
    log_info("store: open after %d attempt(s)", node->store_wait.attempts);
    node_store_opened(node);
    return;
  }
  if (err != -CV_ECANCELED && !lifecycle_store_retryable(node->cfg->database_url, err)) {
    log_error("store: cannot be opened (%s): a configuration error; exiting", cv_strerror(err));
    node->exit_status = 1;
    node_stop(node, "the store's configuration");
    return;
  }
  store_schedule(node, err);
}

static void store_attempt_cb(uv_timer_t *t) {
  node_t *node = t->data;
  if (node->phase >= NODE_STOPPING || node->store_working) return;
  node->store_wait.attempts++;
  node->store_work.data = node;
  if (uv_queue_work(node->loop, &node->store_work, store_work_cb, store_after_cb) != 0) {
    store_schedule(node, -CV_ENOMEM);
    return;
  }
  node->store_working = 1;
}

void lifecycle_store_wait(node_t *node, int err) {
  node->store_wait.waiting = 1;
  node->store_wait.attempts = 1; /* node_open's */
  uv_timer_init(node->loop, &node->store_retry);
  node->store_retry.data = node;
  store_schedule(node, err);
}

/* ---- 2. drain ------------------------------------------------------------ */

int node_drain(node_t *node, const char *why) {
  if (node->phase >= NODE_DRAINING) return -CV_EEXISTS;
  node->phase = NODE_DRAINING;
  return drain_start(node->drain, why);
}

/* SIGTERM drains, unless CONVERGER_DRAIN_SHUTDOWN_MS is 0: then it stops at
 * once, as SIGINT does. A second SIGTERM changes nothing; a second SIGINT
 * exits at once. SIGHUP re-reads the token keys and changes no phase. */
static void signal_cb(uv_signal_t *sig, int signum) {
  node_t *node = sig->data;
  if (signum == SIGHUP) {
    node_reload_keys(node, "SIGHUP");
    return;
  }
  if (signum == SIGINT) {
    if (node->phase >= NODE_STOPPING) {
      log_warn("second SIGINT: exiting at once");
      exit(130);
    }
    node_stop(node, node->phase == NODE_DRAINING ? "SIGINT during the drain" : "SIGINT");
    return;
  }
  if (node->phase >= NODE_DRAINING) {
    log_info("SIGTERM again: already %s; ignored (SIGINT twice exits at once)",
             node_phase_name(node->phase));
    return;
  }
  if (node->cfg->drain_shutdown_ms == 0)
    node_stop(node, "SIGTERM (CONVERGER_DRAIN_SHUTDOWN_MS=0: no drain)");
  else if (!node->store_open) /* no client could connect: nothing to drain */
    node_stop(node, "SIGTERM (the store not open yet: nothing to drain)");
  else
    node_drain(node, "SIGTERM");
}

/* ---- 3. stop ------------------------------------------------------------- */

void node_stop(node_t *node, const char *why) {
  if (node->phase >= NODE_STOPPING) return;
  log_info("%s: stopping: closing %d WebSocket connection(s) with 1001, finishing %d pool job(s)",
           why, node->net.nws, pool_in_flight(node->pool));
  node->phase = NODE_STOPPING;
  node->stop_deadline_ms = util_mono_ms() + STOP_GRACE_MS;
  uv_timer_set_repeat(&node->tick, STOPPING_TICK_MS);
  uv_timer_again(&node->tick);
  conn_stop_listening(&node->net);
  if (node->store_open) { /* else they never started */
    rest_stop(&node->api);
    membership_stop(&node->membership); /* one last beat says "draining" (when the pool is idle) */
  }
  if (node->store_wait.waiting) uv_timer_stop(&node->store_retry);
  session_close_all(&node->sessions, WS_CLOSE_GOING_AWAY, "server shutting down");
  for (conn_t *c = node->net.conns; c; c = c->next)
    if (c->mode == CONN_HTTP && !http_current(c)) conn_close(c);
}

/* ---- 4. and 5. the way out ------------------------------------------------ */

void lifecycle_tick(node_t *node, uint64_t now) {
  if (node->phase == NODE_STOPPING) {
    int idle = node->net.nconns == 0 && pool_in_flight(node->pool) == 0;
    if (!idle && now < node->stop_deadline_ms) return;
    if (!idle)
      log_warn("stop deadline passed with %d connection(s) and %d pool job(s); closing",
               node->net.nconns, pool_in_flight(node->pool));
    for (conn_t *c = node->net.conns; c; c = c->next) conn_close(c);
    if (node->pool)
      pool_close(node->pool); /* waits for the workers; runs the last done callbacks */
    node->pool = NULL;
    node->phase = NODE_STOPPED;
    return;
  }
  if (node->phase != NODE_STOPPED || node->net.nconns > 0) return; /* close callbacks to run */
  if (uv_is_closing((uv_handle_t *)&node->tick)) return;
  if (node->pgnotify) pgnotify_close(node->pgnotify); /* after pool_close: see its header */
  node->pgnotify = NULL;
  if (node->rbus) redis_bus_close(node->rbus); /* after pool_close: see its header */
  node->rbus = NULL;
  drain_close(node->drain); /* after pool_close: its peers job has returned */
  node->drain = NULL;
  bus_close(node->bus);
  node->bus = NULL;
  uv_close((uv_handle_t *)&node->flush_check, NULL);
  uv_close((uv_handle_t *)&node->sigterm, NULL);
  uv_close((uv_handle_t *)&node->sigint, NULL);
  uv_close((uv_handle_t *)&node->sighup, NULL);
  uv_close((uv_handle_t *)&node->tick, NULL);
  uv_close((uv_handle_t *)&node->admission_timer, NULL);
  if (node->store_wait.waiting) uv_close((uv_handle_t *)&node->store_retry, NULL);
  log_info("stopped");
}
