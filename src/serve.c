/*
 * serve.c: wiring of one node (main only wires; behaviour lives in the
 * modules). What happens from a signal to the exit is lifecycle.c's; the
 * tick timer here drives the deadlines of every module and the
 * lifecycle's way out.
 */
#include "serve.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <openssl/crypto.h>

#include "core/dburl.h"
#include "gate/auth.h"
#include "core/metrics.h"
#include "core/procstat.h"
#include "api/rest.h"
#include "bus/bus.h"
#include "bus/pgnotify.h"
#include "bus/redis.h"
#include "cluster/membership.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"
#include "gate/admission.h"
#include "gate/drain.h"
#include "lifecycle.h"
#include "net/conn.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/frames.h"
#include "proto/presence.h"
#include "proto/session.h"
#include "store/sharded.h"

/* Descriptors kept out of the open-file limit for everything but WebSocket
 * connections: 64 for the process (stdio, the loop, signals, the log, the
 * listener and its spare, the store's LISTEN connection, files the store
 * opens for a moment), 64 for plain HTTP (health checks, metrics, admin and
 * REST requests), and 2 per pool connection (SQLite: the database and its
 * WAL; PostgreSQL: one socket). docs/operations.md says the same. */
#define FD_RESERVE_BASE     128
#define FD_RESERVE_PER_POOL 2

static void check_cb(uv_check_t *h) { conn_flush_all(&((node_t *)h->data)->net); }

static void admission_timer_cb(uv_timer_t *t) {
  node_t *node = t->data;
  admission_expire(node->admission, util_mono_ms());
}

/* The admission queue asks for one timer, at its oldest waiter's deadline. */
static void admission_arm(void *ud, int64_t at_ms) {
  node_t *node = ud;
  if (uv_is_closing((uv_handle_t *)&node->admission_timer)) return;
  if (at_ms < 0) {
    uv_timer_stop(&node->admission_timer);
    return;
  }
  int64_t d = at_ms - (int64_t)util_mono_ms();
  uv_timer_start(&node->admission_timer, admission_timer_cb, d > 0 ? (uint64_t)d : 0, 0);
}

/* Once a second: the share of that second the loop was not idle (libuv
 * counts the time spent waiting for I/O, uv_metrics_idle_time). Worker
 * threads do not count: this is the figure converger roll pauses on. */
static void sample_loop(node_t *node) {
  uint64_t now = uv_hrtime(), idle = uv_metrics_idle_time(node->loop);
  uint64_t span = now - node->loop_sampled_ns;
  if (node->loop_sampled_ns && span < 900000000ull) return; /* ticks come about once a second */
  if (node->loop_sampled_ns && span > 0) {
    double busy = 1.0 - (double)(idle - node->loop_idle_ns) / (double)span;
    node->loop_utilisation = busy < 0 ? 0 : busy > 1 ? 1 : busy;
  }
  node->loop_idle_ns = idle;
  node->loop_sampled_ns = now;
}

/* A probe of the instances that are down (store_shards_probe), one job at
 * a time: an instance no client's call reaches is seen back all the same.
 * On a worker. */
static void probe_work(pool_job_t *job, store_t *db) { (void)store_shards_probe(db); }

/* The probe's job is back (loop). */
static void probe_done(pool_job_t *job) {
  node_t *node = container_of(job, node_t, shards_probe);
  node->shards_probing = 0;
}

/* Once a second: a sharded cluster's per-instance health into the
 * registry (converger_shard_up, converger_shard_errors_total), and a probe
 * when one is due. */
static void export_shards(node_t *node, uint64_t now) {
  if (!node->shards || now - node->shards_exported_ms < 1000) return;
  node->shards_exported_ms = now;
  store_shards_export(node->shards);
  if (node->pool && !node->shards_probing && node->phase < NODE_STOPPING &&
      store_shards_probe_due(node->shards)) {
    node->shards_probing = 1;
    node->shards_probe.kind = "probe";
    node->shards_probe.deadline_ms = config_store_deadline(node->cfg);
    pool_submit(node->pool, &node->shards_probe, probe_work, probe_done);
  }
}

/* The API keys and the HS256 secrets that came from the data directory's
 * files, read again (a rotation without a restart): a file that cannot be
 * read, or holds a key too short, leaves the ones in use. Never logs a key. */
static int set_api_keys(auth_t *a, const char *text, size_t min_len) {
  (void)min_len; /* any non-empty key */
  return auth_set_api_keys(a, text);
}

static void reload_secret_files(node_t *node, const char *why) {
  const config_t *cfg = node->cfg;
  struct {
    int from_file;
    const char *name;
    size_t min;
    int (*set)(auth_t *, const char *, size_t);
    size_t (*count)(const auth_t *);
  } files[] = {{cfg->key_from_file, "api-key", 1, set_api_keys, auth_api_key_count},
               {cfg->secret_from_file, "token-secret", CONFIG_SECRET_MIN, auth_set_secrets,
                auth_secret_count}};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    if (!files[i].from_file) continue;
    char *text = NULL;
    int r = config_read_secret(cfg->data_dir, files[i].name, files[i].min, &text);
    if (r == 0) r = files[i].set(node->auth, text, files[i].min);
    if (text) {
      OPENSSL_cleanse(text, strlen(text));
      free(text);
    }
    if (r != 0)
      log_error("%s: %s/%s not reloaded (%s); the %zu in use stay", why, cfg->data_dir,
                files[i].name, cv_strerror(r), files[i].count(node->auth));
    else
      log_info("%s: %s/%s reloaded: %zu key(s) in use", why, cfg->data_dir, files[i].name,
               files[i].count(node->auth));
  }
}

/* "cert,key": the TLS files as a keys_stamp list. */
static uint64_t tls_stamp(const config_t *cfg) {
  char spec[2 * PATH_MAX + 2];
  snprintf(spec, sizeof spec, "%s,%s", cfg->tls_cert, cfg->tls_key);
  return keys_stamp(spec);
}

/* Load the TLS certificate and key again (conn_tls_reload), noting the
 * files' stamp first so that a change is loaded once. */
static void reload_tls(node_t *node, const char *why) {
  if (!node->cfg->tls_cert) return;
  node->tls_stamp = tls_stamp(node->cfg);
  conn_tls_reload(&node->net, why);
}

void node_reload_keys(node_t *node, const char *why) {
  if (strcmp(why, "SIGHUP") == 0) {
    reload_secret_files(node, why);
    reload_tls(node, why);
  }
  const char *spec = node->cfg->token_public_keys;
  if (!spec || !*spec) {
    if (!node->cfg->key_from_file && !node->cfg->secret_from_file)
      log_info("%s: no CONVERGER_TOKEN_PUBLIC_KEYS and no secret file to read", why);
    return;
  }
  node->keys_stamp = keys_stamp(spec);
  keys_t *keys;
  char err[512];
  const keys_t *old = auth_keys(node->auth);
  if (keys_load(spec, &keys, err, sizeof err) != 0) {
    log_error("token keys not reloaded (%s): %s; the %zu key(s) in use stay", why, err,
              old ? old->n : 0);
    metrics_add(node->metrics, "converger_token_key_reloads_total", "result=\"error\"", 1);
    return;
  }
  char kids[512] = "";
  for (size_t i = 0, n = 0; i < keys->n && n < sizeof kids; i++)
    n += (size_t)snprintf(kids + n, sizeof kids - n, "%s%s (%s)", i ? ", " : "", keys->v[i].kid,
                          keys_alg_name(keys->v[i].alg));
  log_info("token keys (re)loaded (%s): %zu key(s): %s", why, keys->n, kids);
  auth_set_keys(node->auth, keys);
  metrics_add(node->metrics, "converger_token_key_reloads_total", "result=\"ok\"", 1);
}

/* A key file changed (rotation without SIGHUP): read them again, once per
 * change. */
static void watch_keys(node_t *node) {
  const char *spec = node->cfg->token_public_keys;
  if (spec && *spec && keys_stamp(spec) != node->keys_stamp)
    node_reload_keys(node, "a key file changed");
  /* the TLS files likewise: cert-manager and a Secret volume replace them
   * without a signal */
  if (node->cfg->tls_cert && tls_stamp(node->cfg) != node->tls_stamp)
    reload_tls(node, "a TLS file changed");
}

static void tick_cb(uv_timer_t *t) {
  node_t *node = t->data;
  uint64_t now = util_mono_ms();
  sample_loop(node);
  export_shards(node, now);
  watch_keys(node);
  conn_tick(&node->net, now);
  listener_tick(&node->net.listener, now);
  if (node->net.admin_on) listener_tick(&node->net.admin_listener, now);
  session_flush_metrics(&node->sessions);
  session_presence_tick(&node->sessions, now);
  conn_flush_all(&node->net);
  lifecycle_tick(node, now);
}

/* The bus's handler (bus.h): frames come from proto/, channel changes go
 * to the sessions. */
static char *bus_msg_json_cb(void *ud, const char *conv, const store_msg_t *m) {
  return frame_msg(conv, m);
}

static char *bus_msg_wire_cb(void *ud, const char *json, size_t len, size_t *out_len) {
  return ws_encode_text(&((node_t *)ud)->net, json, len, out_len);
}

static void bus_channel_cb(void *ud, const char *channel, int active) {
  session_channel_changed(&((node_t *)ud)->sessions, channel, active);
}

/* Another node's POST /admin/users/... (store/notify.h). */
static void bus_user_cb(void *ud, const notify_t *n) {
  sessions_t *ss = &((node_t *)ud)->sessions;
  if (n->kind == NOTIFY_USER_DISCONNECT) {
    int k = session_disconnect_user(ss, n->user, n->code, n->reason, (long)n->retry_ms);
    log_info("%s asked: %d connection(s) of %s closed here with %d", n->origin, k, n->user,
             n->code);
  } else {
    int k = session_unsubscribe_user(ss, n->user, n->conv);
    log_info("%s asked: %d subscription(s) of %s to %s ended here", n->origin, k, n->user, n->conv);
  }
}

/* Presence and signals heard through the store (store/notify.h). */
static void bus_ephemeral_cb(void *ud, const notify_t *n) {
  session_ephemeral(&((node_t *)ud)->sessions, n);
}

/* The transport's handler (net/handler.h): HTTP requests go to the REST
 * router, WebSocket connections to their protocol sessions. */
static void net_request_cb(void *ud, conn_t *c, http_request_t *req) {
  rest_handle(&((node_t *)ud)->api, c, req);
}
static int net_upgrade_cb(void *ud, conn_t *c) {
  return session_start(&((node_t *)ud)->sessions, c);
}
static void net_text_cb(void *ud, conn_t *c, const char *text, size_t len) {
  session_on_text(c, text, len);
}
static void net_writable_cb(void *ud, conn_t *c) { session_on_writable(c); }
static void net_tick_cb(void *ud, conn_t *c, uint64_t now) { session_tick(c, now); }
static void net_close_cb(void *ud, conn_t *c) { session_on_close(c->session); }
static void net_free_cb(void *ud, conn_t *c) { session_free(c->session); }
static const char *net_sse_id_cb(void *ud, conn_t *c) {
  return c->session ? session_sse_id(c->session) : NULL;
}

/* The REST routes' way to the lifecycle (api/rest.h). */
static int api_drain_cb(void *ud, const char *why) { return node_drain(ud, why); }

/* The drain's hooks (gate/drain.h): the lifecycle's stop, proto's frame. */
static void drain_stop_cb(void *ud, const char *why) { node_stop(ud, why); }
static char *drain_frame_cb(void *ud, int64_t after_ms, const char *reconnect_to,
                            int64_t deadline_ms) {
  return frame_drain(after_ms, reconnect_to, deadline_ms);
}

static drain_mark_t *drain_mark_cb(void *ud, conn_t *c) { return session_drain_mark(c->session); }

/* What this node's membership row says (cluster/membership.h). */
static void membership_row(void *ud, membership_row_t *out) {
  node_t *node = ud;
  out->draining = node->phase >= NODE_DRAINING;
  out->connections = node->net.nws;
  out->waiters = admission_waiting(node->admission);
  out->capacity = node->cfg->capacity_connections;
  /* a cluster's presence: rows of nodes gone this long go (store.h) */
  out->presence_max_age_ms =
      node->sessions.shared ? MEMBERSHIP_MAX_AGE_MS + node->cfg->presence_grace_ms : 0;
}

/* The heartbeat works again after failing (cluster/membership.h). */
static void membership_recovered(void *ud) { session_presence_rewrite(&((node_t *)ud)->sessions); }

static uint64_t tick_interval(const config_t *cfg) {
  int m = cfg->hello_timeout_ms;
  if (cfg->heartbeat_ms < m) m = cfg->heartbeat_ms;
  if (cfg->header_timeout_ms < m) m = cfg->header_timeout_ms;
  m /= 4;
  if (m < 10) m = 10;
  if (m > 1000) m = 1000;
  return (uint64_t)m;
}

/* node->max_connections: CONVERGER_MAX_CONNECTIONS, or (0) the open-file
 * limit minus the reserve, so that upgrades are refused with a 503 while
 * descriptors remain for health checks and the store. */
static void set_max_connections(node_t *node) {
  const config_t *cfg = node->cfg;
  struct rlimit rl;
  long limit = INT_MAX;
  uint64_t was, now;
  if (util_raise_nofile(&was, &now)) /* LimitNOFILE=, --ulimit, the runtime's stay the ceiling */
    log_info("connections: raised the open-file limit from %llu to %llu (the hard limit%s)",
             (unsigned long long)was, (unsigned long long)now,
             getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != now ? ", capped" : "");
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < INT_MAX)
    limit = (long)rl.rlim_cur;
  long reserve = FD_RESERVE_BASE + FD_RESERVE_PER_POOL * (long)cfg->pool_size;
  long budget = limit - reserve;
  if (cfg->max_connections > 0) {
    node->max_connections = cfg->max_connections;
    log_info("connections: at most %d WebSocket connection(s) (CONVERGER_MAX_CONNECTIONS); "
             "open-file limit %ld",
             node->max_connections, limit);
    if (cfg->max_connections > budget)
      log_warn("CONVERGER_MAX_CONNECTIONS %d is above the open-file limit %ld minus the %ld "
               "descriptors kept for the pool, the store, LISTEN and health checks "
               "(128 + 2 per pool connection): at the limit, health checks may go unanswered; "
               "raise the limit (ulimit -n, LimitNOFILE=) or lower the setting",
               cfg->max_connections, limit, reserve);
    return;
  }
  node->max_connections = budget > 1 ? (int)budget : 1;
  log_info("connections: at most %d WebSocket connection(s): the open-file limit %ld minus %ld "
           "descriptors kept for the pool, the store, LISTEN and health checks "
           "(128 + 2 per pool connection; CONVERGER_MAX_CONNECTIONS sets it)",
           node->max_connections, limit, reserve);
  if (budget < 1)
    log_warn("the open-file limit %ld leaves no room for WebSocket connections beside the %ld "
             "descriptors kept for the rest; raise it (ulimit -n, LimitNOFILE=)",
             limit, reserve);
}

/* ---- a start that failed ------------------------------------------------------ */

/* The handles on a loop, for telling node_open's own from the caller's. */
typedef struct {
  const uv_handle_t **h;
  size_t n, cap;
  int oom;
} handle_set_t;

static void collect_cb(uv_handle_t *h, void *arg) {
  handle_set_t *set = arg;
  if (set->n == set->cap) {
    size_t cap = set->cap ? 2 * set->cap : 16;
    const uv_handle_t **grown = realloc(set->h, cap * sizeof *grown);
    if (!grown) {
      set->oom = 1;
      return;
    }
    set->h = grown;
    set->cap = cap;
  }
  set->h[set->n++] = h;
}

static int set_has(const handle_set_t *set, const uv_handle_t *h) {
  for (size_t i = 0; i < set->n; i++)
    if (set->h[i] == h) return 1;
  return 0;
}

/* Whether a handle of `made` (node_open's) is still on the loop. */
static void made_left_cb(uv_handle_t *h, void *arg) {
  void **a = arg;
  if (set_has(a[0], h)) *(int *)a[1] = 1;
}

/* Undo a node_open that failed at any step: close what it made, and only
 * that (serve.h: the caller's handles on the same loop stay as they
 * were), then turn the loop until those handles are closed and freed and
 * the node's requests (a LISTEN connection under way) have returned.
 * `before`: the loop's handles when node_open began; `reqs_before` its
 * active requests then. Frees `node`. */
static void node_open_undo(node_t *node, const handle_set_t *before, unsigned reqs_before) {
  uv_loop_t *loop = node->loop;
  handle_set_t made = {0};
  uv_walk(loop, collect_cb, &made);
  size_t keep = 0; /* the handles made since node_open began */
  for (size_t i = 0; i < made.n; i++)
    if (!set_has(before, made.h[i])) made.h[keep++] = made.h[i];
  made.n = keep;
  conn_stop_listening(&node->net); /* listeners, when conn_listen got that far */
  if (node->pool) pool_close(node->pool);
  if (node->pgnotify) pgnotify_close(node->pgnotify);
  if (node->rbus) redis_bus_close(node->rbus);
  if (node->drain) drain_close(node->drain);
  if (node->bus) bus_close(node->bus);
  if (!uv_is_closing((uv_handle_t *)&node->admission_timer))
    uv_close((uv_handle_t *)&node->admission_timer, NULL);
  for (;;) {
    int left = 0;
    void *arg[2] = {&made, &left};
    uv_walk(loop, made_left_cb, arg);
    if (!left && loop->active_reqs.count <= reqs_before) break;
    uv_run(loop, left ? UV_RUN_NOWAIT : UV_RUN_ONCE);
  }
  free(made.h);
  node_free(node);
}

void node_store_opened(node_t *node) {
  const config_t *cfg = node->cfg;
  if (node->store_open) return;
  node->store_open = 1;
  pool_set_queue_rule(node->pool, cfg->pool_queue_target_ms, cfg->pool_queue_interval_ms);
  /* Group commit (store/pool.h): one batch at a time. SQLite's writer
   * lock admits one transaction anyway; on PostgreSQL one lane gathered
   * the largest groups and measured fastest (docs/benchmarks/store.md:
   * 5 200 appends/s against 5 000 with 2 lanes and 3 400 with 8). */
  pool_set_batch(node->pool, cfg->append_batch, 1);
  if (cfg->test_store_delay_ms > 0) {
    log_warn("test-only store delay of %d ms per store job is on", cfg->test_store_delay_ms);
    pool_set_test_delay(node->pool, cfg->test_store_delay_ms);
  }
  rest_start_revocation_refresh(&node->api);
  node->membership.recovered = membership_recovered;
  membership_start(&node->membership, node->loop, &node->pool, node->cfg, membership_row, node);
  if (node->sessions.shared) session_presence_restore(&node->sessions);
  lifecycle_ready(node);
}

int node_open(uv_loop_t *loop, config_t *cfg, int key_from_file, node_t **out) {
  int r;
  *out = NULL;
  /* What is on the caller's loop already: a failed start closes only
   * the rest (node_open_undo). */
  handle_set_t before = {0};
  uv_walk(loop, collect_cb, &before);
  unsigned reqs_before = loop->active_reqs.count;
  node_t *node = before.oom ? NULL : calloc(1, sizeof *node);
  if (!node) {
    free(before.h);
    log_error("cannot start the node: out of memory");
    return 1;
  }
  node->loop = loop;
  /* idle time for converger_loop_utilisation; before the loop first runs */
  uv_loop_configure(node->loop, UV_METRICS_IDLE_TIME);
  node->cfg = cfg;
  node->metrics = metrics_new(); /* NULL (out of memory): the node does not start */
  conn_handler_t net_handler = {.on_request = net_request_cb,
                                .on_upgrade = net_upgrade_cb,
                                .on_text = net_text_cb,
                                .on_writable = net_writable_cb,
                                .on_tick = net_tick_cb,
                                .on_close = net_close_cb,
                                .on_free = net_free_cb,
                                .sse_id = net_sse_id_cb,
                                .ud = node};
  conn_net_init(&node->net, node->loop, cfg, &net_handler, node->metrics);
  jitter_seed_random(&node->rng);
  node->auth = auth_new(cfg->api_key, cfg->token_secret);
  if (!node->auth) log_error("cannot set up the API keys and token secrets: out of memory");
  node->users = users_new();
  node->presence = presence_new(cfg->presence_grace_ms);
  bus_handler_t bus_handler = {.msg_json = bus_msg_json_cb,
                               .msg_wire = bus_msg_wire_cb,
                               .channel_changed = bus_channel_cb,
                               .user_control = bus_user_cb,
                               .ephemeral = bus_ephemeral_cb,
                               .ud = node};
  node->bus = bus_new(node->loop, &bus_handler, node->metrics);
  store_options_t opt = {
      .sync = strcmp(cfg->sqlite_sync, "off") == 0      ? STORE_SYNC_OFF
              : strcmp(cfg->sqlite_sync, "normal") == 0 ? STORE_SYNC_NORMAL
                                                        : STORE_SYNC_FULL,
      .busy_timeout_ms = 5000,
  };

  /* On PostgreSQL, every node hears every commit (bus/pgnotify.h); in a
   * sharded cluster, only the nodes that serve its conversation, through
   * the Redis bus (bus/redis.h), which redis_bus_start installs below. */
  const char *backend = dburl_backend(cfg->database_url);
  int shared_store = backend && strcmp(backend, "postgres") == 0;
  int sharded = shared_store && cfg->bus != NULL;
  if (sharded) {
    /* an instance that hangs holds at most half the workers */
    node->shards = store_shards_new(cfg->pool_size > 1 ? cfg->pool_size / 2 : 1, node->metrics);
    opt.shards = node->shards;
    opt.announce = bus_announce;
    opt.announce_ud = node->bus;
    bus_set_shards(node->bus, node->shards);
  } else if (shared_store) {
    opt.notify = 1;
    bus_set_remote(node->bus);
  }
  node->store_opt = opt;
  char db_shown[512]; /* the URL without its password, for logs */
  dburl_redact(cfg->database_url, db_shown, sizeof db_shown);
  uv_timer_init(node->loop, &node->admission_timer);
  node->admission_timer.data = node;
  int slots = admission_default_slots(cfg->handshake_concurrency, cfg->pool_size);
  node->admission = admission_new(slots, (uint64_t)cfg->handshake_queue_ms,
                                  cfg->handshake_queue_max, admission_arm, node);
  drain_env_t drain_env = {.loop = node->loop,
                           .cfg = cfg,
                           .net = &node->net,
                           .pool = &node->pool,
                           .rng = &node->rng,
                           .membership = &node->membership,
                           .metrics = node->metrics,
                           .stop = drain_stop_cb,
                           .frame = drain_frame_cb,
                           .mark = drain_mark_cb,
                           .ud = node};
  node->drain = drain_new(&drain_env);
  node->sessions = (sessions_t){.cfg = cfg,
                                .pool = &node->pool,
                                .bus = node->bus,
                                .auth = node->auth,
                                .admission = node->admission,
                                .drain = &node->drain,
                                .net = &node->net,
                                .rng = &node->rng,
                                .metrics = node->metrics,
                                .users = node->users,
                                .presence = node->presence,
                                .shared = shared_store};
  procstat_t start; /* the start time /admin/status reports (a restart changes it) */
  procstat_read(&start);
  node->api = (api_t){.loop = node->loop,
                      .cfg = cfg,
                      .pool = &node->pool,
                      .bus = node->bus,
                      .auth = node->auth,
                      .admission = node->admission,
                      .drain = &node->drain,
                      .pgnotify = &node->pgnotify,
                      .shards = node->shards,
                      .rbus = &node->rbus,
                      .loop_utilisation = &node->loop_utilisation,
                      .started_at = start.start_time_s,
                      .sessions = &node->sessions,
                      .net = &node->net,
                      .accept = &node->accept,
                      .rng = &node->rng,
                      .metrics = node->metrics,
                      .max_connections = &node->max_connections,
                      .phase = &node->phase,
                      .store_wait = &node->store_wait,
                      .drain_begin = api_drain_cb,
                      .ud = node};
  if (!node->metrics || !node->auth || !node->users || !node->presence || !node->bus ||
      !node->admission || !node->drain || (sharded && !node->shards))
    goto fail;
  if (auth_set_claims(node->auth, cfg->token_issuer, cfg->token_audience) != 0) goto fail;
  if (cfg->token_public_keys && *cfg->token_public_keys) {
    keys_t *keys;
    char err[512];
    node->keys_stamp = keys_stamp(cfg->token_public_keys);
    if (keys_load(cfg->token_public_keys, &keys, err, sizeof err) != 0) {
      log_error("CONVERGER_TOKEN_PUBLIC_KEYS: %s", err);
      goto fail;
    }
    log_info("token keys: %zu public key(s) for RS256 / ES256 tokens", keys->n);
    auth_set_keys(node->auth, keys);
  }
  /* The first attempt, here (nothing listens yet). A PostgreSQL server not
   * up yet is waited for (lifecycle_store_wait); anything else exits 1: a
   * URL libpq cannot parse (store/pgconn.h logs why), a database not in
   * UTF8, any SQLite error (lifecycle_store_retryable). */
  node->store_opt.shared = &node->store_shared; /* an outage is logged once */
  pool_t *prepared = NULL;
  int store_err =
      pool_prepare(cfg->database_url, &node->store_opt, cfg->pool_size, node->metrics, &prepared);
  if (store_err == 0 && (store_err = pool_launch(prepared, node->loop)) == 0) node->pool = prepared;
  if (store_err != 0 && !lifecycle_store_retryable(cfg->database_url, store_err)) {
    log_error("cannot start the store (%s): %s", db_shown, cv_strerror(store_err));
    goto fail;
  }
  if (sharded && (r = redis_bus_start(node->loop, node->bus, &node->pool, cfg->node_id, cfg->bus,
                                      cfg->bus_check_ms, node->metrics, &node->rbus)) != 0) {
    log_error("cannot start the bus (%s): %s", cfg->bus, cv_strerror(r));
    goto fail;
  }
  if (shared_store && !sharded &&
      (r = pgnotify_start(node->loop, node->bus, &node->pool, cfg->node_id, cfg->database_url,
                          &node->pgnotify)) != 0) {
    log_error("cannot listen on the store (%s): %s", db_shown, cv_strerror(r));
    goto fail;
  }
  if (cfg->rest_rate > 0)
    limiter_init(&node->api.rest_appends, cfg->rest_rate,
                 cfg->rest_rate_burst > 0 ? cfg->rest_rate_burst : 2.0 * cfg->rest_rate,
                 util_mono_ms());
  if (cfg->accept_rate > 0) /* a second's worth of upgrades may come at once */
    limiter_init(&node->accept, cfg->accept_rate, cfg->accept_rate, util_mono_ms());
  set_max_connections(node);
  if (cfg->tls_cert) node->tls_stamp = tls_stamp(cfg); /* conn_listen loads them */
  if (conn_listen(&node->net) != 0 || config_listening(cfg) != 0) goto fail;
  uv_check_init(node->loop, &node->flush_check);
  node->flush_check.data = node;
  uv_check_start(&node->flush_check, check_cb);
  uv_timer_init(node->loop, &node->tick);
  node->tick.data = node;
  uint64_t iv = tick_interval(cfg);
  uv_timer_start(&node->tick, tick_cb, iv, iv);
  lifecycle_signals_start(node);
  if (store_err == 0)
    node_store_opened(node);
  else /* down for now: listen, not ready, and retry (lifecycle.c) */
    lifecycle_store_wait(node, store_err);
  const char *s = cfg->tls_cert ? "s" : "";
  log_info("converger %s node %s listening on http%s://%s (WebSocket ws%s://%s/v1/ws), store %s, "
           "pool %d, admission %d slot(s), queue %d for %d ms, public URL %s",
           CONVERGER_VERSION, cfg->node_id, s, cfg->listen, s, cfg->listen, db_shown,
           cfg->pool_size, slots, cfg->handshake_queue_max, cfg->handshake_queue_ms,
           cfg->public_url);
  if (cfg->admin_host)
    log_info("admin: /metrics, /admin/*, /livez and /readyz on http://%s (the client port keeps "
             "/readyz)",
             cfg->admin_listen);
  /* Where the key is, never the key: logs are read by more people and
   * kept longer than a 0600 file. */
  if (key_from_file)
    log_info("API key in %s/api-key (not logged; CONVERGER_API_KEY sets one)", cfg->data_dir);
  free(before.h);
  *out = node;
  return 0;
fail:
  node_open_undo(node, &before, reqs_before);
  free(before.h);
  return 1;
}

void node_free(node_t *node) {
  if (!node) return;
  auth_free(node->auth);
  users_free(node->users); /* every session is gone */
  presence_free(node->presence);
  if (node->admission) {
    /* Every connection is gone: a slot still counted is a leak (tests
     * look for "BUG:" in node logs). */
    if (admission_in_use(node->admission) || admission_waiting(node->admission))
      log_error("BUG: admission slots leaked at exit: %d in use, %d waiting",
                admission_in_use(node->admission), admission_waiting(node->admission));
    admission_free(node->admission);
  }
  conn_net_free(&node->net);
  store_shards_free(node->shards); /* the pool's routers are closed */
  metrics_free(node->metrics);     /* the pool's workers are joined: no one records now */
  free(node);
}

int serve_main(int argc, char **argv) {
  config_t cfg;
  int r = config_parse(&cfg, argc, argv);
  if (r == 1) {
    config_free(&cfg);
    return 0;
  }
  if (r != 0) {
    config_free(&cfg);
    return 2;
  }
  log_set_level(strcmp(cfg.log_level, "debug") == 0   ? LOG_DEBUG
                : strcmp(cfg.log_level, "warn") == 0  ? LOG_WARN
                : strcmp(cfg.log_level, "error") == 0 ? LOG_ERROR
                                                      : LOG_INFO);
  log_set_format(strcmp(cfg.log_format, "json") == 0 ? LOG_JSON : LOG_TEXT, cfg.node_id);
  log_set_access(cfg.access_log);
  signal(SIGPIPE, SIG_IGN);
  int key_from_file = 0;
  if (config_load_secrets(&cfg, 1, &key_from_file) != 0) {
    config_free(&cfg);
    return 1;
  }
  node_t *node;
  uv_loop_t *loop = uv_default_loop();
  int status = node_open(loop, &cfg, key_from_file, &node);
  if (status == 0) {
    uv_run(loop, UV_RUN_DEFAULT); /* until lifecycle_tick ends it */
    status = node->exit_status;   /* 1: the store's configuration, found later */
  }
  node_free(node);
  if (uv_loop_close(loop) != 0) log_warn("loop closed with open handles");
  config_free(&cfg);
  return status;
}
