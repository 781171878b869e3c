/*
 * lifecycle.c: what happens to a node from its start to its exit, read top
 * to bottom (lifecycle.h has the phases).
 *
 * 1. serve.c wires the modules, opens the listener and calls
 *    lifecycle_ready: starting -> ready.
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
#include <stdlib.h>

#include "api/rest.h"
#include "bus/bus.h"
#include "bus/pgnotify.h"
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
  rest_stop(&node->api);
  membership_stop(&node->membership); /* one last beat says "draining" (when the pool is idle) */
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
    pool_close(node->pool); /* waits for the workers; runs the last done callbacks */
    node->pool = NULL;
    node->phase = NODE_STOPPED;
    return;
  }
  if (node->phase != NODE_STOPPED || node->net.nconns > 0) return; /* close callbacks to run */
  if (uv_is_closing((uv_handle_t *)&node->tick)) return;
  if (node->pgnotify) pgnotify_close(node->pgnotify); /* after pool_close: see its header */
  node->pgnotify = NULL;
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
  log_info("stopped");
}
