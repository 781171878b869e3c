/*
 * rest: the HTTP routes of a node: REST API v1, health, metrics, admin, the
 * WebSocket endpoint and the demo page (docs/protocol.md). Loop thread;
 * store work runs as pool jobs.
 */
#ifndef CONVERGER_API_REST_H
#define CONVERGER_API_REST_H

#include <uv.h>

#include "bus/bus.h"
#include "bus/pgnotify.h"
#include "bus/redis.h"
#include "common/jitter.h"
#include "core/config.h"
#include "core/metrics.h"
#include "core/phase.h"
#include "gate/admission.h"
#include "gate/auth.h"
#include "gate/drain.h"
#include "gate/limiter.h"
#include "net/conn.h"
#include "net/http.h"
#include "proto/session.h"
#include "store/pool.h"
#include "store/sharded.h"

/* A store not open yet (lifecycle.c: a PostgreSQL node whose database was
 * unreachable at start keeps trying with backoff): what /readyz says
 * about it. Written by the loop thread only. */
typedef struct {
  int waiting;   /* 1 until the store opens */
  int attempts;  /* attempts made so far */
  char why[160]; /* the last attempt's error */
} store_wait_t;

/* What the routes work with, borrowed from the node (which fills it before
 * it listens and outlives every request), and the revocation refresh's own
 * state. References (`*const *`) are read at each use: the node sets them
 * to NULL as it closes them. */
typedef struct api_s {
  uv_loop_t *loop;
  config_t *cfg;
  pool_t *const *pool;
  bus_t *bus;
  auth_t *auth;
  admission_t *admission;
  drain_t *const *drain;
  pgnotify_t *const *pgnotify; /* NULL target: no shared store */
  /* A sharded cluster (CONVERGER_BUS): what the store's routers share,
   * for /admin/status's "shards" (NULL: not sharded), and the Redis bus
   * (NULL target: not sharded, or closed). */
  store_shards_t *shards;
  redis_bus_t *const *rbus;
  sessions_t *sessions;
  net_t *net;
  limiter_t *accept;          /* upgrades per second, when cfg->accept_rate > 0 */
  limiter_t rest_appends;     /* REST appends per second, when cfg->rest_rate > 0 (serve.c) */
  jitter_rng_t *rng;          /* retry hints */
  metrics_t *metrics;         /* the node's registry: counted here, rendered at /metrics */
  const int *max_connections; /* WebSocket connections allowed; more: 503 */
  const node_phase_t *phase;  /* the lifecycle's phase (core/phase.h) */
  /* The store while it is not open (*pool NULL): every route but /livez,
   * /readyz, /metrics and /admin/status answers 503 then. */
  const store_wait_t *store_wait;
  const double *loop_utilisation; /* the loop's busy share of the last second (serve.c) */
  double started_at;              /* the process's start, s since the epoch (read once) */
  /* The lifecycle's drain (lifecycle.h, node_drain): 0, or -CV_EEXISTS. */
  int (*drain_begin)(void *ud, const char *why);
  void *ud;
  uv_timer_t revocation_timer; /* the revocation refresh */
  int revocation_running;      /* its store job is in the pool */
} api_t;

/* Answer `req` on `c` (now, or later from a pool job). Called through the
 * transport's handler once per complete request; exactly one response
 * follows. */
void rest_handle(api_t *api, conn_t *c, http_request_t *req);

/* Start the periodic revocation refresh (every revocation_refresh_ms). */
void rest_start_revocation_refresh(api_t *api);

/* Stop the refresh timer (shutdown). */
void rest_stop(api_t *api);

#endif
