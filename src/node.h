/*
 * node: the state of one running gateway node, shared by the modules of the
 * loop thread (net, proto, bus, api). Everything here belongs to the loop
 * thread except `pool`, whose jobs run on worker threads.
 */
#ifndef CONVERGER_NODE_H
#define CONVERGER_NODE_H

#include <stdint.h>
#include <uv.h>

#include "cluster/membership.h"
#include "core/config.h"
#include "core/metrics.h"
#include "core/phase.h"
#include "common/jitter.h"
#include "common/util.h"
#include "gate/limiter.h"
#include "gate/users.h"
#include "net/conn.h"
#include "api/rest.h"
#include "proto/session.h"

#include "store/pool.h"

typedef struct conn_s conn_t;
typedef struct bus_s bus_t;
typedef struct auth_s auth_t;
typedef struct admission_s admission_t;
typedef struct pgnotify_s pgnotify_t;
typedef struct redis_bus_s redis_bus_t;
typedef struct drain_s drain_t;

typedef struct node_s {
  uv_loop_t *loop;
  config_t *cfg;
  metrics_t *metrics; /* this node's registry (core/metrics.h); every module borrows it */
  pool_t *pool;
  bus_t *bus;
  pgnotify_t *pgnotify; /* PostgreSQL: the LISTEN connection (bus/pgnotify.h); else NULL */
  /* A sharded cluster (CONVERGER_BUS): the Redis bus (bus/redis.h) and
   * what the store's routers share (store/sharded.h); else NULL. */
  redis_bus_t *rbus;
  store_shards_t *shards;
  pool_job_t shards_probe; /* serve.c: a probe of the instances that are down */
  int shards_probing;      /* it is in the pool */
  uint64_t shards_exported_ms; /* monotonic: store_shards_export last ran (serve.c) */
  auth_t *auth;
  users_t *users;              /* connections per user (gate/users.h) */
  struct presence_s *presence; /* who is present (proto/presence.h) */
  admission_t *admission;      /* hello and sync store work (gate/admission.h) */
  limiter_t accept;            /* WebSocket upgrades, when cfg->accept_rate > 0 */
  jitter_rng_t rng;

  net_t net;                           /* the transport: listener, connections (net/conn.h) */
  uv_check_t flush_check;              /* writes queued in one loop turn go out together */
  uv_timer_t tick;                     /* deadlines: header, hello, heartbeat, shutdown */
  uv_signal_t sigterm, sigint, sighup; /* SIGHUP: re-read the token keys */
  uint64_t keys_stamp;                 /* keys_stamp of the key files last read (serve.c) */
  uint64_t tls_stamp; /* keys_stamp of CONVERGER_TLS_CERT and _KEY when last loaded (serve.c) */
  uv_timer_t admission_timer; /* the oldest admission waiter's deadline */
  membership_t membership;    /* this node's heartbeat (cluster/membership.h) */
  drain_t *drain;             /* drain and shed (gate/drain.h) */

  sessions_t sessions; /* what the protocol sessions work with (proto/session.h) */
  api_t api;           /* what the REST routes work with (api/rest.h) */
  int max_connections; /* WebSocket connections allowed (serve.c); more: 503 */

  node_phase_t phase; /* the one lifecycle state (lifecycle.h) */
  /* The store not open yet (lifecycle.c, "1. start"): a PostgreSQL node
   * whose database was unreachable at start retries it with backoff,
   * answering /livez but not /readyz; pool stays NULL until it opens. */
  store_wait_t store_wait;
  store_options_t store_opt;   /* the pool's options, for the retries */
  store_shared_t store_shared; /* store_opt.shared: an outage logged once (store/pool.h) */
  uv_timer_t store_retry;      /* the next attempt */
  uv_work_t store_work;        /* an attempt (pool_prepare) on libuv's thread pool */
  pool_t *store_prepared;      /* what that attempt opened */
  int store_err;               /* and its result */
  int store_working;           /* an attempt is on the thread pool */
  int store_open;              /* node_store_opened ran: membership and refresh started */
  int exit_status;             /* serve_main's status once the loop ends (0, or 1) */
  /* The loop's utilisation over the last second (serve.c, from libuv's
   * uv_metrics_idle_time): /admin/status, converger_loop_utilisation. */
  double loop_utilisation;
  uint64_t loop_idle_ns, loop_sampled_ns; /* the last sample's idle total and time */
  uint64_t stop_deadline_ms;              /* monotonic: force exit after this */
} node_t;

/* lifecycle.c: ready -> draining, the drain policy (gate/drain.h) started;
 * `why` for the log ("SIGTERM", "POST /admin/drain"). 0, or -CV_EEXISTS
 * when the node already drains or stops. Loop thread. */
int node_drain(node_t *node, const char *why);

/* serve.c: read CONVERGER_TOKEN_PUBLIC_KEYS again (SIGHUP, or a file
 * changed: `why` for the log), and on SIGHUP the data directory's api-key
 * and token-secret files when the keys came from them (a rotation: every
 * key a file lists is accepted, tokens signed with the first secret); on
 * an error the keys in use stay. Loop thread. */
void node_reload_keys(node_t *node, const char *why);

/* serve.c: the store is open (node->pool set): start what needs it (the
 * pool's settings, the revocation refresh, the membership heartbeat,
 * presence) and go ready (lifecycle_ready). Once. Loop thread. */
void node_store_opened(node_t *node);

/* lifecycle.c: -> stopping: the listener closes, WebSocket connections get
 * 1001, HTTP answers in flight finish, then the pool is joined and the
 * loop ends (lifecycle_tick). Idempotent. Loop thread. */
void node_stop(node_t *node, const char *why);

#endif
