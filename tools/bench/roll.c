/*
 * roll.c: `converger bench roll`, the rolling-restart harness (issue 7,
 * first slice): a PostgreSQL store (scripts/pg-tmp unless --pg-url; with
 * --shards a sharded cluster instead, bench/shardset.h: N instances, the
 * shard map, --bus redis-servers), --nodes `converger serve` nodes on
 * loopback sharing it, optionally HAProxy in front of them (--lb haproxy,
 * bench/rolllb.h), --clients SDK clients in --procs forked worker
 * processes (bench/rollw.h), a paced REST sender, each node restarted in
 * turn (SIGTERM, exit, start on the same port, /readyz, --restart-gap-ms),
 * then a settle, the sender stopped, the clients' catch-up and the
 * verification: every client delivered exactly 1..head of its conversation
 * once, in order, head being the acknowledged appends of the sender.
 *
 * What it owns: the options, the nodes (one bench_t each, used for its
 * process and blocking REST calls), the workers (pid and two sockets each),
 * the sender thread (its own bench_t copies, so that its blocking calls
 * share nothing with the main thread's), HAProxy with --lb haproxy, the
 * PostgreSQL clusters and redis-servers it started (stopped at the end),
 * the aggregated records, and the files of --out (the plots: bench/rollplot.h).
 *
 * Threads: the main thread runs everything but the sender; the sender
 * thread writes only its own struct, read by the main thread after
 * pthread_join (the `stop` flag is the one shared field, atomic).
 *
 * Exit status: 0 when the run completed and verified, 1 when a phase failed
 * or an acknowledged message was missing, duplicated or out of order at a
 * subscriber, 2 on bad usage.
 */
#include "bench/bench.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/node.h"
#include "bench/pgtmp.h"
#include "bench/promtext.h"
#include "bench/restc.h"
#include "bench/rolllb.h"
#include "bench/rollplot.h"
#include "bench/rollw.h"
#include "bench/run.h"
#include "bench/shardset.h"
#include "cli/args.h"
#include "common/util.h"
#include "stats/rank.h"

#define CMD          "converger bench roll"
#define MAX_NODES    ROLLW_MAX_NODES
#define MAX_PROCS    64
#define FDS_SPARE    64
#define BUCKET_MS    100
#define LAT_BINS_MAX 60000

#ifndef CONVERGER_PG_TMP_DEFAULT
#define CONVERGER_PG_TMP_DEFAULT "scripts/pg-tmp"
#endif

typedef struct {
  long long nodes, clients, convs, procs, send_rate, drain_window_ms, drain_close_rate,
      restart_gap_ms, settle_ms, wait_ms, seed, pool_size, timeout_s, capacity;
  long long shards, bus; /* --shards, --bus: a sharded cluster; 0: one database */
  const char *pg_url, *pg_tmp, *out, *drain, *clients_mode, *backoff, *admission, *reconnect, *lb,
      *controller, *roll_args, *presence;
  cvg_backoff_strategy_t strategy;
  long long backoff_base_ms, backoff_cap_ms;
  int close_mode, legacy, admission_off, ignore_hints, reconnect_next, lb_haproxy;
  int by_roll;     /* --controller roll */
  int presence_on; /* --presence on */
} options_t;

/* The REST sender (its own thread). */
typedef struct {
  bench_t *nb[MAX_NODES]; /* private copies: port and API key */
  size_t nnodes, nconvs;
  char **convs;
  long long rate;
  uint64_t t0_ns;
  atomic_int stop;
  /* results */
  int64_t *head;  /* per conversation: highest acknowledged seq */
  uint64_t *acks; /* per conversation: acknowledged messages */
  uint64_t sent, acked, rest_503, rest_refused, rest_retries, given_up;
  uint32_t *ok_b, *refused_b; /* per 100 ms bucket */
  size_t nbuckets;
  char err[600];
} sender_t;

/* One worker process. */
typedef struct {
  pid_t pid;
  int to, from; /* bench's ends of the sockets */
  char *buf;
  size_t len, cap;
  int ready, ended, eof;
  size_t nsamples; /* 100 ms buckets it sampled ("S" lines) */
} worker_t;

/* One node's restart, in ms on the timeline's clock (after t0). Its span,
 * over which its arrivals are counted, is [sigterm_ms, to_ms). With
 * --controller roll, sigterm_ms is when the bench first saw the node
 * draining (the controller's POST /admin/drain; polled every 250 ms). */
typedef struct {
  size_t node;
  int64_t sigterm_ms, exit_ms, ready_ms;
  int64_t to_ms; /* ready_ms + --restart-gap-ms (the pause before the next SIGTERM) */
} restart_t;

typedef struct {
  options_t *o;
  bench_t *node[MAX_NODES];
  char pg_url[512], pg_dir[128];
  shardset_t sh;        /* --shards: the instances and the bus */
  char **convs, **urls; /* urls: every node's, or (--lb haproxy) the load balancer's only */
  size_t nurls;
  rolllb_t lb; /* --lb haproxy */
  char tag[40];
  char *token;
  worker_t w[MAX_PROCS];
  size_t nworkers;
  size_t sampled[MAX_PROCS]; /* each worker's nsamples, kept after workers_stop */
  size_t nworkers_seen;
  uint64_t t0_ns;
  /* records from the workers */
  int64_t *off;
  size_t noff, coff;
  uint32_t (*conn_b)[MAX_NODES]; /* per 100 ms bucket, connected per node */
  uint32_t (*arr_b)[MAX_NODES];  /* per 100 ms bucket, welcomes per node */
  size_t nb;
  uint64_t lat[LAT_BINS_MAX];      /* every delivery, 1 ms bins ("L" records) */
  uint64_t live_lat[LAT_BINS_MAX]; /* live deliveries only ("M" records) */
  unsigned long long v_ok, v_lost, v_dup, v_order, v_sdkdup, v_unav, v_runav, v_attempts, v_migr;
  /* --presence on: the observers' join and leave events, and the check of
   * presence against the clients after the roll */
  unsigned long long p_joins, p_leaves, p_checked, p_mismatched;
  char p_first_bad[256];
  size_t nbad;
  char bad[20][200];
  /* restarts */
  int64_t roll_from_ms, roll_to_ms;
  restart_t restarts[MAX_NODES];
  size_t nrestarts;
  int ctl_status;                   /* --controller roll: its wait status, -1 before it ended */
  json_t *ctl_summary;              /* its summary.json, NULL when it wrote none */
  promtext_hist_t adm, pool, hello; /* merged from the nodes' /metrics */
  int failed;
  char err[512];
} ctx_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: " CMD " [options]\n\n"
          "A rolling restart of a local cluster under SDK clients and a REST sender, with\n"
          "loss verification (issue 7; docs/benchmarks/rolling-restart/).\n\n"
          "  --nodes N              gateway nodes [3]\n"
          "  --clients N            SDK clients [10000]\n"
          "  --procs N              worker processes for the clients [2]\n"
          "  --convs N              conversations [1000]\n"
          "  --send-rate N          REST appends per second [200]\n"
          "  --drain migrate|close  migrate: drain frames, make-before-break; close: no drain\n"
          "                         frames, the paced 1012 closes begin at once [migrate]\n"
          "  --drain-window-ms N    the nodes' drain window [30000]\n"
          "  --drain-close-rate N   the nodes' paced closes per second [500]\n"
          "  --clients-mode sdk|legacy  legacy: the clients ignore drain frames [sdk]\n"
          "  --backoff S[:BASE[:CAP]]   SDK backoff strategy (decorrelated, full, equal,\n"
          "                         exponential, additive, proportional), ms [decorrelated]\n"
          "  --ignore-hints         the SDK ignores the servers' retryAfterMs / Retry-After\n"
          "                         (no backoff floor; the old harness, experiments only)\n"
          "  --reconnect random|next  random: a reconnect goes to a random other node; next:\n"
          "                         always to the next node (the old harness's flaw) [random]\n"
          "  --lb haproxy|direct    haproxy: HAProxy on a free loopback port in front of the\n"
          "                         nodes (/readyz checks, leastconn), the clients' and the\n"
          "                         sender's one URL, and the nodes' public URL (reconnectTo);\n"
          "                         direct: every client has every node's URL [direct]\n"
          "  --restart-gap-ms N     pause after a restarted node is ready [2000]\n"
          "  --settle-ms N          before the first restart and after the last [3000]\n"
          "  --wait-ms N            bound on the clients' catch-up at the end [60000]\n"
          "  --pool-size N          the nodes' CONVERGER_POOL_SIZE [20]\n"
          "  --admission on|off     off: WS_HANDSHAKE_CONCURRENCY=100000, no handshake waits\n"
          "                         in the admission queue (as bench admission) [on]\n"
          "  --seed N               the clients' random seed (0: the OS's) [0]\n"
          "  --pg-url URL           use this PostgreSQL instead of a throwaway one\n"
          "  --pg-tmp PATH          the script that starts one [%s], with --fast:\n"
          "                         fsync and synchronous_commit off, NOT durable (a roll\n"
          "                         restarts nodes, never the database)\n"
          "  --shards N             a sharded cluster instead of one database\n"
          "                         (docs/operations.md, \"Scaling out\"): N PostgreSQL\n"
          "                         instances (1..%d), each its own --fast cluster of\n"
          "                         --pg-tmp (NOT durable, as above: the roll never\n"
          "                         restarts them), the shard map written over them,\n"
          "                         instance 0 also the control database; the nodes get\n"
          "                         CONVERGER_BUS [0: one database]\n"
          "  --bus B                with --shards: B redis-servers (from PATH, free\n"
          "                         loopback ports, no persistence) as the bus (1..%d) [2]\n"
          "  --out DIR              summary.json, report.md, timeline.csv, disconnected_ms.csv,\n"
          "                         arrivals.png, connected.png, disconnected_cdf.png (and\n"
          "                         haproxy.cfg, haproxy.log with --lb haproxy) [roll-out]\n"
          "  --timeout S            bound on the whole run, seconds [1800]\n"
          "  --controller bench|roll  bench: the bench restarts each node in turn (SIGTERM,\n"
          "                         start, /readyz, --restart-gap-ms); roll: `converger roll\n"
          "                         --nodes ...` restarts them (POST /admin/drain, its pause\n"
          "                         and abort thresholds, the balance at the end) and the\n"
          "                         bench is only the supervisor that starts a node again\n"
          "                         once it exited; --restart-gap-ms becomes its --settle-s\n"
          "                         (rounded up); its output in OUT/controller.log [bench]\n"
          "  --roll-args \"ARGS\"     more arguments for converger roll, split at spaces\n"
          "                         (e.g. \"--pause-cpu 90 --balance-window-ms 5000\") []\n"
          "  --capacity N           the nodes' CONVERGER_CAPACITY_CONNECTIONS (0: unset, the\n"
          "                         controller's headroom check then reads CPU) [0]\n"
          "  --presence on|off      on: the channel has presence; the first two clients of\n"
          "                         every conversation count its join and leave events (a\n"
          "                         roll must cause no leave), and after the roll and the\n"
          "                         grace each conversation's presence must list exactly its\n"
          "                         clients [off]\n",
          CONVERGER_PG_TMP_DEFAULT, SHARDSET_MAX_INSTANCES, SHARDSET_MAX_BUS);
}

static int parse_options(options_t *o, int argc, char **argv) {
  int r;
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  char **args = calloc((size_t)argc + 1, sizeof *args);
  if (!rest || !args) {
    free(rest);
    free(args);
    return -1;
  }
  int nrest = 0, nargs = 0;
  for (int i = 0; i < argc; i++) /* the one flag without a value */
    if (strcmp(argv[i], "--ignore-hints") == 0)
      o->ignore_hints = 1;
    else
      args[nargs++] = argv[i];
  static const char *const names[] = {
      "--pg-url",    "--pg-tmp",    "--out", "--drain",      "--clients-mode", "--backoff",
      "--admission", "--reconnect", "--lb",  "--controller", "--roll-args",    "--presence"};
  const char **const dest[] = {&o->pg_url,       &o->pg_tmp,     &o->out,       &o->drain,
                               &o->clients_mode, &o->backoff,    &o->admission, &o->reconnect,
                               &o->lb,           &o->controller, &o->roll_args, &o->presence};
  r = run_split_string_options(CMD, nargs, args, names, dest, CV_ARRAY_SIZE(names), rest, &nrest);
  free(args);
  if (r != 0) {
    free(rest);
    return -1;
  }
  const run_int_opt_t opts[] = {
      {"nodes", &o->nodes, 2, MAX_NODES},
      {"clients", &o->clients, 1, 1000000},
      {"procs", &o->procs, 1, MAX_PROCS},
      {"convs", &o->convs, 1, 100000},
      {"send-rate", &o->send_rate, 1, 100000},
      {"drain-window-ms", &o->drain_window_ms, 0, 3600000},
      {"drain-close-rate", &o->drain_close_rate, 1, 1000000},
      {"restart-gap-ms", &o->restart_gap_ms, 0, 3600000},
      {"settle-ms", &o->settle_ms, 0, 3600000},
      {"wait-ms", &o->wait_ms, 0, 3600000},
      {"pool-size", &o->pool_size, 1, 512},
      {"seed", &o->seed, 0, (long long)1 << 62},
      {"timeout", &o->timeout_s, 10, 86400},
      {"capacity", &o->capacity, 0, 100000000},
      {"shards", &o->shards, 1, SHARDSET_MAX_INSTANCES},
      {"bus", &o->bus, 1, SHARDSET_MAX_BUS},
  };
  r = run_parse_int_options(CMD, nrest, rest, opts, CV_ARRAY_SIZE(opts), usage);
  free(rest);
  if (r != 0) return r;
  if (strcmp(o->drain, "migrate") != 0 && strcmp(o->drain, "close") != 0) {
    fprintf(stderr, CMD ": --drain is migrate or close, not \"%s\"\n", o->drain);
    return -1;
  }
  o->close_mode = strcmp(o->drain, "close") == 0;
  if (strcmp(o->clients_mode, "sdk") != 0 && strcmp(o->clients_mode, "legacy") != 0) {
    fprintf(stderr, CMD ": --clients-mode is sdk or legacy, not \"%s\"\n", o->clients_mode);
    return -1;
  }
  o->legacy = strcmp(o->clients_mode, "legacy") == 0;
  if (strcmp(o->admission, "on") != 0 && strcmp(o->admission, "off") != 0) {
    fprintf(stderr, CMD ": --admission is on or off, not \"%s\"\n", o->admission);
    return -1;
  }
  o->admission_off = strcmp(o->admission, "off") == 0;
  if (strcmp(o->reconnect, "random") != 0 && strcmp(o->reconnect, "next") != 0) {
    fprintf(stderr, CMD ": --reconnect is random or next, not \"%s\"\n", o->reconnect);
    return -1;
  }
  o->reconnect_next = strcmp(o->reconnect, "next") == 0;
  if (strcmp(o->lb, "haproxy") != 0 && strcmp(o->lb, "direct") != 0) {
    fprintf(stderr, CMD ": --lb is haproxy or direct, not \"%s\"\n", o->lb);
    return -1;
  }
  o->lb_haproxy = strcmp(o->lb, "haproxy") == 0;
  if (strcmp(o->controller, "bench") != 0 && strcmp(o->controller, "roll") != 0) {
    fprintf(stderr, CMD ": --controller is bench or roll, not \"%s\"\n", o->controller);
    return -1;
  }
  o->by_roll = strcmp(o->controller, "roll") == 0;
  if (strcmp(o->presence, "on") != 0 && strcmp(o->presence, "off") != 0) {
    fprintf(stderr, CMD ": --presence is on or off, not \"%s\"\n", o->presence);
    return -1;
  }
  o->presence_on = strcmp(o->presence, "on") == 0;
  if (o->bus && !o->shards) {
    fprintf(stderr, CMD ": --bus needs --shards\n");
    return -1;
  }
  if (o->shards && o->pg_url) {
    fprintf(stderr, CMD ": --shards starts its own instances: no --pg-url with it\n");
    return -1;
  }
  if (o->shards && !o->bus) o->bus = 2;
  if (o->roll_args[0] && !o->by_roll) {
    fprintf(stderr, CMD ": --roll-args needs --controller roll\n");
    return -1;
  }
  char name[32] = "";
  long long base = 0, cap = 0;
  int n = sscanf(o->backoff, "%31[a-z]:%lld:%lld", name, &base, &cap);
  if (n < 1 || cvg_backoff_parse(name, &o->strategy) != 0 || base < 0 || cap < 0) {
    fprintf(stderr, CMD ": --backoff is STRATEGY[:BASE_MS[:CAP_MS]], not \"%s\"\n", o->backoff);
    return -1;
  }
  o->backoff_base_ms = base;
  o->backoff_cap_ms = cap;
  if (o->convs > o->clients) o->convs = o->clients;
  if (o->presence_on && o->clients < 2 * o->convs)
    fprintf(stderr,
            CMD ": note: fewer than two clients in some conversations: their only client is "
                "its own observer and is not told its own leave (the presence check after the "
                "roll still finds one that did not come back)\n");
  return 0;
}

/* ---- small helpers ---------------------------------------------------------------- */

static int64_t ms_since(uint64_t t0) { return (int64_t)((uv_hrtime() - t0) / 1000000u); }

static void fail(ctx_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(ctx_t *x, const char *fmt, ...) {
  if (x->failed) return;
  x->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->err, sizeof x->err, fmt, ap);
  va_end(ap);
  fprintf(stderr, CMD ": %s\n", x->err);
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The p-quantile (stats/rank.h) of sorted `v`; 0 when n is 0. */
static int64_t pct_i64(const int64_t *v, size_t n, double p) {
  return n ? v[rank_nearest(p, n) - 1] : 0;
}

/* ---- nodes ------------------------------------------------------------------------ */

static int node_start(ctx_t *x, size_t k) {
  options_t *o = x->o;
  bench_t *nb = x->node[k];
  char db[600], id[48], pub[96], win[64], rate[64], shut[64], pool[48],
      cap[64] = "", bus[sizeof x->sh.bus + 16] = "";
  long long shutdown = o->drain_window_ms + 2000 +
                       (o->clients * 1000 + o->drain_close_rate - 1) / o->drain_close_rate + 30000;
  snprintf(db, sizeof db, "CONVERGER_DATABASE_URL=%s", x->pg_url);
  snprintf(id, sizeof id, "CONVERGER_NODE_ID=roll-%zu", k);
  /* Behind the load balancer, a drain's reconnectTo names the load balancer
   * (every peer's public URL is its URL): the move goes to a node it
   * chooses among the ready ones. */
  snprintf(pub, sizeof pub, "CONVERGER_PUBLIC_URL=ws://127.0.0.1:%d/v1/ws",
           o->lb_haproxy ? x->lb.port : nb->port);
  snprintf(win, sizeof win, "CONVERGER_DRAIN_WINDOW_MS=%lld", o->drain_window_ms);
  snprintf(rate, sizeof rate, "CONVERGER_DRAIN_CLOSE_RATE=%lld", o->drain_close_rate);
  snprintf(shut, sizeof shut, "CONVERGER_DRAIN_SHUTDOWN_MS=%lld", shutdown);
  snprintf(pool, sizeof pool, "CONVERGER_POOL_SIZE=%lld", o->pool_size);
  if (o->capacity > 0)
    snprintf(cap, sizeof cap, "CONVERGER_CAPACITY_CONNECTIONS=%lld", o->capacity);
  /* sharded: the database URL is the control database's (instance 0) */
  snprintf(bus, sizeof bus, "CONVERGER_BUS=%s", x->sh.bus);
  const char *env[14] = {db,
                         id,
                         pub,
                         win,
                         rate,
                         shut,
                         pool,
                         "CONVERGER_HELLO_TIMEOUT_MS=10000",
                         cap[0] ? cap : "CONVERGER_CAPACITY_CONNECTIONS=0",
                         o->close_mode ? "CONVERGER_DRAIN_MIGRATE=0" : "CONVERGER_DRAIN_MIGRATE=1"};
  size_t nenv = 10;
  if (o->shards) env[nenv++] = bus;
  if (o->admission_off) env[nenv++] = "WS_HANDSHAKE_CONCURRENCY=100000";
  nb->node_cpu = -1;
  nb->timeout_s = (int)o->timeout_s;
  if (bnode_start_env(nb, env) != 0 || bnode_wait_ready(nb) != 0) {
    fail(x, "node %zu: %s", k, nb->err);
    bnode_print_log_tail(nb, 20);
    return -1;
  }
  return 0;
}

/* Add the `name` histogram of one node's /metrics, times `sign`, into `h`. */
static void scrape_hist(const char *text, const char *name, promtext_hist_t *h, double sign) {
  promtext_hist_t node;
  promtext_hist(text, name, NULL, &node);
  promtext_hist_add(h, &node, sign);
}

/* Add node k's admission wait, pool wait and hello latency (hello to
 * welcome, admission included) histograms into the run's, or
 * subtract them (`sign` -1: the counts before the restarts began, so that
 * the figures cover the restarts and what follows only). */
static void scrape(ctx_t *x, size_t k, double sign) {
  static char text[1 << 20];
  int st = restc_call(x->node[k], "GET", "/metrics", NULL, NULL, text, sizeof text);
  if (st != 200) {
    fprintf(stderr, CMD ": node %zu: GET /metrics: %d %s\n", k, st, x->node[k]->http_err);
    return;
  }
  scrape_hist(text, "converger_protocol_admission_wait_ms", &x->adm, sign);
  scrape_hist(text, "converger_pool_wait_ms", &x->pool, sign);
  scrape_hist(text, "converger_hello_latency_ms", &x->hello, sign);
}

/* The p-quantile (stats/rank.h) of a merged histogram: the upper bound of
 * its bucket (the nodes' buckets: 1, 2, 5, 10, 25, 50, 100, 250 ... ms),
 * the largest finite bound when it is beyond it; 0 when there are none. */
static double hist_pct(const promtext_hist_t *h, double p) {
  size_t k = rank_bucket(h->cum, h->n, p);
  if (k == h->n) return 0;
  if (isinf(h->le[k])) return k > 0 ? h->le[k - 1] : 0; /* beyond the last finite bucket */
  return h->le[k];
}

static int setup(ctx_t *x) {
  options_t *o = x->o;
  bench_t *b = x->node[0];
  char body[256];
  snprintf(x->tag, sizeof x->tag, "roll%d", (int)getpid());
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"name\":\"%s\",\"presence\":%s}", x->tag, x->tag,
           o->presence_on ? "true" : "false");
  if (restc_expect(b, "POST", "/v1/channels", body, NULL, 201, NULL, 0) != 0) goto err;
  x->convs = calloc((size_t)o->convs, sizeof *x->convs);
  if (!x->convs) goto err;
  for (long long i = 0; i < o->convs; i++) {
    x->convs[i] = run_str_printf("%s-c%lld", x->tag, i);
    if (!x->convs[i]) goto err;
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"channel\":\"%s\"}", x->convs[i], x->tag);
    if (restc_expect(b, "POST", "/v1/conversations", body, NULL, 201, NULL, 0) != 0) goto err;
  }
  if (!(x->token = restc_token(b, "roll"))) goto err;
  return 0;
err:
  fail(x, "setup: %s", b->err[0] ? b->err : "out of memory");
  return -1;
}

/* ---- presence (--presence on) ------------------------------------------------------ */

/* After the roll: every conversation's presence (GET .../presence) lists
 * its user ("roll", the token's sub) with exactly the clients the run put
 * in it (client i in conversation i % convs), all of them connected then:
 * no one left, no one is counted twice. */
static void check_presence(ctx_t *x) {
  const options_t *o = x->o;
  char path[256], out[8192];
  for (long long k = 0; k < o->convs; k++) {
    long long want = o->clients / o->convs + (k < o->clients % o->convs ? 1 : 0);
    snprintf(path, sizeof path, "/v1/conversations/%s/presence", x->convs[k]);
    if (restc_expect(x->node[0], "GET", path, NULL, NULL, 200, out, sizeof out) != 0) {
      fail(x, "presence of %s: %s", x->convs[k], x->node[0]->err);
      return;
    }
    json_t *j = json_loads(out, 0, NULL);
    json_t *m = json_array_get(json_object_get(j, "members"), 0);
    long long users = json_integer_value(json_object_get(j, "count"));
    long long got = json_integer_value(json_object_get(m, "clients"));
    x->p_checked++;
    if (users != 1 || got != want) {
      if (!x->p_mismatched)
        snprintf(x->p_first_bad, sizeof x->p_first_bad,
                 "conversation %s: %lld user(s), %lld client(s) present, %lld subscribed",
                 x->convs[k], users, got, want);
      x->p_mismatched++;
    }
    json_decref(j);
  }
  fprintf(stderr, "roll: presence after the roll: %llu conversation(s) checked, %llu wrong%s%s\n",
          x->p_checked, x->p_mismatched, x->p_mismatched ? ": " : "", x->p_first_bad);
}

/* ---- the sender ------------------------------------------------------------------- */

static void *sender_main(void *arg) {
  sender_t *s = arg;
  uint64_t start = uv_hrtime();
  size_t node = 0;
  for (uint64_t i = 0; !atomic_load(&s->stop) && !s->err[0]; i++) {
    uint64_t due = start + (uint64_t)((double)i * 1e9 / (double)s->rate);
    uint64_t now = uv_hrtime();
    if (due > now) run_sleep_ms((long)((due - now) / 1000000u));
    size_t conv = i % s->nconvs;
    char path[160], body[160], key[64];
    snprintf(path, sizeof path, "/v1/conversations/%s/messages", s->convs[conv]);
    snprintf(key, sizeof key, "Idempotency-Key: m%llu\r\n", (unsigned long long)i);
    snprintf(body, sizeof body, "{\"sender\":\"roll\",\"body\":{\"t\":%llu}}",
             (unsigned long long)(uv_hrtime() - s->t0_ns));
    s->sent++;
    uint64_t first = uv_hrtime();
    for (int attempt = 0;; attempt++) {
      if (attempt > 0) {
        s->rest_retries++;
        node = (node + 1) % s->nnodes; /* another node */
        run_sleep_ms(20);
      }
      char out[512];
      bench_t *nb = s->nb[node];
      int st = restc_call(nb, "POST", path, body, key, out, sizeof out);
      size_t bucket = (size_t)((uv_hrtime() - s->t0_ns) / (BUCKET_MS * 1000000u));
      if (bucket >= s->nbuckets) bucket = s->nbuckets - 1;
      if (st == 201 || st == 200) {
        json_t *v = json_loads(out, 0, NULL);
        json_int_t seq = json_integer_value(json_object_get(v, "seq"));
        json_decref(v);
        if (seq <= 0) {
          snprintf(s->err, sizeof s->err, "POST %s answered %d without a seq: %.200s", path, st,
                   out);
          break;
        }
        if (seq > s->head[conv]) s->head[conv] = seq;
        s->acks[conv]++;
        s->acked++;
        s->ok_b[bucket]++;
        break;
      }
      s->refused_b[bucket]++;
      if (st == 503)
        s->rest_503++;
      else if (st < 0)
        s->rest_refused++;
      else {
        snprintf(s->err, sizeof s->err, "POST %s answered %d: %.200s", path, st, out);
        break;
      }
      if (uv_hrtime() - first > 60 * RUN_NS) { /* not acknowledged: not counted */
        s->given_up++;
        break;
      }
    }
    node = (node + 1) % s->nnodes;
  }
  return NULL;
}

/* ---- workers ---------------------------------------------------------------------- */

static void grow_buckets(ctx_t *x, size_t n) {
  if (n <= x->nb) return;
  void *a = realloc(x->conn_b, n * sizeof *x->conn_b);
  if (a) x->conn_b = a;
  void *c = realloc(x->arr_b, n * sizeof *x->arr_b);
  if (c) x->arr_b = c;
  if (!a || !c) return;
  memset(x->conn_b + x->nb, 0, (n - x->nb) * sizeof *x->conn_b);
  memset(x->arr_b + x->nb, 0, (n - x->nb) * sizeof *x->arr_b);
  x->nb = n;
}

static void worker_line(ctx_t *x, worker_t *w, char *line) {
  long long a, b;
  if (strcmp(line, "ready") == 0)
    w->ready = 1;
  else if (strcmp(line, "E") == 0)
    w->ended = 1;
  else if (line[0] == 'A' && sscanf(line, "A %lld %lld", &a, &b) == 2) {
    if (a < 0 || b < 0 || b >= MAX_NODES) return;
    grow_buckets(x, (size_t)(a / BUCKET_MS) + 1);
    if ((size_t)(a / BUCKET_MS) < x->nb) x->arr_b[a / BUCKET_MS][b]++;
  } else if (line[0] == 'O' && sscanf(line, "O %lld", &a) == 1) {
    if (x->noff == x->coff) {
      size_t c = x->coff ? x->coff * 2 : 4096;
      int64_t *p = realloc(x->off, c * sizeof *p);
      if (!p) return;
      x->off = p;
      x->coff = c;
    }
    x->off[x->noff++] = a;
  } else if (line[0] == 'S') {
    char *p = line + 1;
    long long bucket = strtoll(p, &p, 10);
    if (bucket < 0) return;
    if ((size_t)bucket + 1 > w->nsamples) w->nsamples = (size_t)bucket + 1;
    grow_buckets(x, (size_t)bucket + 1);
    if ((size_t)bucket >= x->nb) return;
    for (long long k = 0; k < x->o->nodes; k++)
      x->conn_b[bucket][k] += (uint32_t)strtoul(p, &p, 10);
  } else if (line[0] == 'L' && sscanf(line, "L %lld %lld", &a, &b) == 2) {
    if (a >= 0 && a < LAT_BINS_MAX) x->lat[a] += (uint64_t)b;
  } else if (line[0] == 'M' && sscanf(line, "M %lld %lld", &a, &b) == 2) {
    if (a >= 0 && a < LAT_BINS_MAX) x->live_lat[a] += (uint64_t)b;
  } else if (line[0] == 'X') {
    unsigned long long ci, conv, dup, order;
    long long last, head;
    if (sscanf(line, "X %llu %llu %lld %lld %llu %llu", &ci, &conv, &last, &head, &dup, &order) ==
            6 &&
        x->nbad < 20) {
      snprintf(x->bad[x->nbad], sizeof x->bad[0],
               "client %llu (conversation %s): delivered 1..%lld of head %lld%s%s", ci,
               conv < (unsigned long long)x->o->convs ? x->convs[conv] : "?", last, head,
               dup ? ", duplicates" : "", order ? ", out of order" : "");
      if (last < head)
        snprintf(x->bad[x->nbad] + strlen(x->bad[x->nbad]),
                 sizeof x->bad[0] - strlen(x->bad[x->nbad]), "; missing seqs %lld..%lld", last + 1,
                 head);
    }
    x->nbad++;
  } else if (line[0] == 'P' && sscanf(line, "P %lld %lld", &a, &b) == 2) {
    x->p_joins += (unsigned long long)a;
    x->p_leaves += (unsigned long long)b;
  } else if (line[0] == 'V') {
    unsigned long long v[9];
    if (sscanf(line, "V %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
               &v[4], &v[5], &v[6], &v[7], &v[8]) == 9) {
      x->v_ok += v[0];
      x->v_lost += v[1];
      x->v_dup += v[2];
      x->v_order += v[3];
      x->v_sdkdup += v[4];
      x->v_unav += v[5];
      x->v_runav += v[6];
      x->v_attempts += v[7];
      x->v_migr += v[8];
    }
  }
}

/* Read what the workers wrote, for at most `ms`. */
static void pump(ctx_t *x, int ms) {
  struct pollfd pf[MAX_PROCS];
  for (size_t i = 0; i < x->nworkers; i++)
    pf[i] = (struct pollfd){.fd = x->w[i].eof ? -1 : x->w[i].from, .events = POLLIN};
  if (poll(pf, x->nworkers, ms) <= 0) return;
  for (size_t i = 0; i < x->nworkers; i++) {
    worker_t *w = &x->w[i];
    if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (w->cap - w->len < 65536) {
      size_t c = w->cap ? w->cap * 2 : 1 << 17;
      char *p = realloc(w->buf, c);
      if (!p) continue;
      w->buf = p;
      w->cap = c;
    }
    ssize_t n = read(w->from, w->buf + w->len, w->cap - w->len - 1);
    if (n <= 0) {
      if (n == 0 || (errno != EINTR && errno != EAGAIN)) w->eof = 1;
      continue;
    }
    w->len += (size_t)n;
    w->buf[w->len] = '\0';
    char *p = w->buf, *nl;
    while ((nl = strchr(p, '\n')) != NULL) {
      *nl = '\0';
      worker_line(x, w, p);
      p = nl + 1;
    }
    w->len -= (size_t)(p - w->buf);
    memmove(w->buf, p, w->len);
  }
}

static int workers_start(ctx_t *x) {
  options_t *o = x->o;
  size_t per = (size_t)((o->clients + o->procs - 1) / o->procs);
  size_t first = 0;
  for (long long i = 0; i < o->procs && first < (size_t)o->clients; i++) {
    size_t n = (size_t)o->clients - first < per ? (size_t)o->clients - first : per;
    int in[2], out[2]; /* in: bench -> worker; out: worker -> bench */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) != 0) {
      fail(x, "socketpair: %s", strerror(errno));
      return -1;
    }
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      signal(SIGINT, SIG_IGN); /* the bench stops the workers */
      signal(SIGTERM, SIG_DFL);
      signal(SIGHUP, SIG_DFL);
      close(in[0]);
      close(out[0]);
      for (size_t j = 0; j < x->nworkers; j++) {
        close(x->w[j].to);
        close(x->w[j].from);
      }
      rollw_options_t wo = {.fd_in = in[1],
                            .fd_out = out[1],
                            .first = first,
                            .nclients = n,
                            .nconvs = (size_t)o->convs,
                            .convs = (const char *const *)x->convs,
                            .urls = (const char *const *)x->urls,
                            .nurls = x->nurls,
                            .nnodes = (size_t)o->nodes,
                            .token = x->token,
                            .backoff = o->strategy,
                            .backoff_base_ms = o->backoff_base_ms,
                            .backoff_cap_ms = o->backoff_cap_ms,
                            .migrate_on_drain = !o->legacy,
                            .reconnect =
                                o->reconnect_next ? CVG_RECONNECT_NEXT : CVG_RECONNECT_RANDOM,
                            .ignore_hints = o->ignore_hints,
                            .seed = (uint64_t)o->seed,
                            .t0_ns = x->t0_ns,
                            .wait_ms = o->wait_ms,
                            .start_per_100ms = 100,
                            .presence = o->presence_on};
      rollw_main(&wo);
    }
    close(in[1]);
    close(out[1]);
    if (pid < 0) {
      close(in[0]);
      close(out[0]);
      fail(x, "fork: %s", strerror(errno));
      return -1;
    }
    x->w[x->nworkers++] = (worker_t){.pid = pid, .to = in[0], .from = out[0]};
    first += n;
  }
  return 0;
}

static void workers_stop(ctx_t *x) {
  x->nworkers_seen = x->nworkers;
  for (size_t i = 0; i < x->nworkers; i++) {
    worker_t *w = &x->w[i];
    x->sampled[i] = w->nsamples;
    if (w->pid > 0) {
      if (!w->ended) kill(w->pid, SIGKILL);
      int st;
      while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR) {
      }
      w->pid = 0;
    }
    close(w->to);
    close(w->from);
    free(w->buf);
  }
  x->nworkers = 0;
}

/* ---- the run ---------------------------------------------------------------------- */

static int wait_all(ctx_t *x, int ready, int64_t bound_ms, const char *what) {
  uint64_t t = uv_hrtime();
  int64_t last_print = 0;
  for (;;) {
    size_t n = 0;
    for (size_t i = 0; i < x->nworkers; i++) n += ready ? x->w[i].ready : x->w[i].ended;
    if (n == x->nworkers) return 0;
    for (size_t i = 0; i < x->nworkers; i++)
      if (x->w[i].eof && !(ready ? x->w[i].ready : x->w[i].ended)) {
        fail(x, "worker %zu ended before %s", i, what);
        return -1;
      }
    if (run_interrupted) {
      fail(x, "interrupted by signal %d", (int)run_interrupted);
      return -1;
    }
    int64_t el = ms_since(t);
    if (el > bound_ms) {
      fail(x, "%zu of %zu workers reached \"%s\" within %lld ms", n, x->nworkers, what,
           (long long)bound_ms);
      return -1;
    }
    if (el - last_print >= 5000) {
      last_print = el;
      fprintf(stderr, "roll: waiting for %s: %zu/%zu workers\n", what, n, x->nworkers);
    }
    pump(x, 100);
  }
}

static int sleep_pumping(ctx_t *x, int64_t ms) {
  uint64_t t = uv_hrtime();
  while (ms_since(t) < ms) {
    if (run_interrupted) {
      fail(x, "interrupted by signal %d", (int)run_interrupted);
      return -1;
    }
    pump(x, 50);
  }
  return 0;
}

static int restart_node(ctx_t *x, size_t k) {
  bench_t *nb = x->node[k];
  int64_t t_term = ms_since(x->t0_ns);
  scrape(x, k, 1);
  fprintf(stderr, "roll: node %zu: SIGTERM at %.1f s\n", k, (double)t_term / 1000);
  kill(nb->pid, SIGTERM);
  long long bound = x->o->drain_window_ms + 2000 +
                    (x->o->clients * 1000 + x->o->drain_close_rate - 1) / x->o->drain_close_rate +
                    60000;
  while (!bnode_gone(nb)) {
    if (run_interrupted || ms_since(x->t0_ns) - t_term > bound) {
      fail(x, "node %zu did not exit within %lld ms of SIGTERM", k, bound);
      return -1;
    }
    pump(x, 20);
  }
  char why[96];
  if (!WIFEXITED(nb->node_status) || WEXITSTATUS(nb->node_status) != 0) {
    bnode_print_log_tail(nb, 20);
    fail(x, "node %zu ended with %s after SIGTERM", k,
         bnode_status_text(nb->node_status, why, sizeof why));
    return -1;
  }
  int64_t t_exit = ms_since(x->t0_ns);
  bnode_remove_dir(nb);
  if (node_start(x, k) != 0) return -1;
  int64_t t_ready = ms_since(x->t0_ns);
  x->restarts[x->nrestarts++] = (restart_t){.node = k,
                                            .sigterm_ms = t_term,
                                            .exit_ms = t_exit,
                                            .ready_ms = t_ready,
                                            .to_ms = t_ready + x->o->restart_gap_ms};
  fprintf(stderr, "roll: node %zu: exited after %.1f s, ready again after %.1f s\n", k,
          (double)(t_exit - t_term) / 1000, (double)(t_ready - t_term) / 1000);
  return sleep_pumping(x, x->o->restart_gap_ms);
}

/* ---- --controller roll ------------------------------------------------------------ */

/* The node's "state" from GET /admin/status, into `state` ("" when it does
 * not answer: stopped, or between two processes). */
static void node_state(bench_t *nb, char *state, size_t cap) {
  char body[2048];
  state[0] = '\0';
  if (restc_call(nb, "GET", "/admin/status", NULL, NULL, body, sizeof body) != 200) return;
  json_t *v = json_loads(body, 0, NULL);
  const char *st = json_string_value(json_object_get(v, "state"));
  if (st) snprintf(state, cap, "%s", st);
  json_decref(v);
}

/* `converger roll` restarts the nodes; the bench supervises them (as
 * systemd's Restart=always or a Deployment's controller would): a node
 * that exited with status 0 starts again on its port, and one that ended
 * any other way fails the run. Returns 0 when the controller exited with
 * status 0 having restarted every node once, or -1 (x failed). */
static int roll_by_controller(ctx_t *x) {
  const options_t *o = x->o;
  size_t n = (size_t)o->nodes;
  char nodes[MAX_NODES * 32] = "", settle[24], out_dir[PATH_MAX], log_path[PATH_MAX];
  size_t len = 0;
  for (size_t k = 0; k < n; k++)
    len += (size_t)snprintf(nodes + len, sizeof nodes - len, "%shttp://127.0.0.1:%d", k ? "," : "",
                            x->node[k]->port);
  snprintf(settle, sizeof settle, "%lld", (o->restart_gap_ms + 999) / 1000);
  snprintf(out_dir, sizeof out_dir, "%s/controller", o->out);
  snprintf(log_path, sizeof log_path, "%s/controller.log", o->out);
  if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
    fail(x, "cannot create %s: %s", o->out, strerror(errno));
    return -1;
  }
  char *args_copy = strdup(o->roll_args);
  char *argv[64] = {x->node[0]->exe,      (char *)"roll", (char *)"--nodes", nodes,
                    (char *)"--settle-s", settle,         (char *)"--out",   out_dir};
  size_t argc = 8;
  for (char *save = NULL, *t = args_copy ? strtok_r(args_copy, " ", &save) : NULL; t;
       t = strtok_r(NULL, " ", &save)) {
    if (argc + 1 >= CV_ARRAY_SIZE(argv)) {
      free(args_copy);
      fail(x, "--roll-args: more than %zu arguments", CV_ARRAY_SIZE(argv) - 9);
      return -1;
    }
    argv[argc++] = t;
  }
  argv[argc] = NULL;
  /* the API key through the environment, not the command line (ps) */
  extern char **environ;
  size_t nenv = 0;
  while (environ[nenv]) nenv++;
  char **env = calloc(nenv + 2, sizeof *env);
  char *key = run_str_printf("CONVERGER_API_KEY=%s", x->node[0]->api_key);
  int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  pid_t pid = -1;
  if (env && key && log_fd >= 0) {
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
      if (strncmp(environ[i], "CONVERGER_API_KEY=", 18) != 0) env[k++] = environ[i];
    env[k++] = key;
    run_spawn_opts_t so = {.env = env,
                           .out_fd = log_fd,
                           .err_fd = log_fd,
                           .death_sig = SIGKILL,
                           .own_group = 1,
                           .cpu = -1};
    pid = run_spawn(argv, &so);
  }
  int spawn_errno = errno;
  if (log_fd >= 0) close(log_fd);
  free(env);
  free(key);
  free(args_copy);
  if (pid < 0) {
    fail(x, "cannot start converger roll (%s): %s", log_path, strerror(spawn_errno));
    return -1;
  }
  fprintf(stderr, "roll: converger roll (pid %d) restarts the nodes; its output: %s\n", (int)pid,
          log_path);

  int64_t drain_at[MAX_NODES], last_poll = -1000;
  for (size_t k = 0; k < n; k++) drain_at[k] = -1;
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    int64_t now = ms_since(x->t0_ns);
    if (run_interrupted || now > o->timeout_s * 1000) {
      int killed = 0;
      status = run_stop_child(pid, 10000, &killed);
      fail(x, run_interrupted ? "interrupted by signal %d" : "the run passed --timeout (%d)",
           run_interrupted ? (int)run_interrupted : (int)o->timeout_s);
      break;
    }
    if (now - last_poll >= 250) {
      last_poll = now;
      for (size_t k = 0; k < n; k++) {
        if (drain_at[k] >= 0 || bnode_gone(x->node[k])) continue;
        char st[32];
        node_state(x->node[k], st, sizeof st);
        if (strcmp(st, "draining") == 0 || strcmp(st, "stopping") == 0) {
          drain_at[k] = now;
          scrape(x, k, 1);
          fprintf(stderr, "roll: node %zu: draining at %.1f s\n", k, (double)now / 1000);
        }
      }
    }
    for (size_t k = 0; k < n && !x->failed; k++) {
      bench_t *nb = x->node[k];
      if (!bnode_gone(nb)) continue;
      char why[96];
      if (!WIFEXITED(nb->node_status) || WEXITSTATUS(nb->node_status) != 0) {
        bnode_print_log_tail(nb, 20);
        fail(x, "node %zu ended with %s", k, bnode_status_text(nb->node_status, why, sizeof why));
        break;
      }
      int64_t t_exit = ms_since(x->t0_ns), t_from = drain_at[k] >= 0 ? drain_at[k] : t_exit;
      if (drain_at[k] < 0) scrape(x, k, 1); /* not seen draining: its figures are gone */
      bnode_remove_dir(nb);
      if (node_start(x, k) != 0) break;
      int64_t t_ready = ms_since(x->t0_ns);
      if (x->nrestarts < MAX_NODES)
        x->restarts[x->nrestarts++] = (restart_t){.node = k,
                                                  .sigterm_ms = t_from,
                                                  .exit_ms = t_exit,
                                                  .ready_ms = t_ready,
                                                  .to_ms = t_ready + o->restart_gap_ms};
      fprintf(stderr, "roll: node %zu: exited after %.1f s, started again, ready after %.1f s\n", k,
              (double)(t_exit - t_from) / 1000, (double)(t_ready - t_from) / 1000);
      drain_at[k] = -1;
    }
    if (x->failed) {
      int killed = 0;
      status = run_stop_child(pid, 10000, &killed);
      break;
    }
    pump(x, 50);
  }
  x->ctl_status = status;
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/summary.json", out_dir);
  x->ctl_summary = json_load_file(path, 0, NULL);
  if (x->failed) return -1;
  char why[96];
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail(x, "converger roll ended with %s (its output: %s)",
         bnode_status_text(status, why, sizeof why), log_path);
    return -1;
  }
  if (x->nrestarts != n) {
    fail(x, "converger roll restarted %zu of %zu nodes", x->nrestarts, n);
    return -1;
  }
  fprintf(stderr, "roll: converger roll done\n");
  return 0;
}

/* ---- figures ---------------------------------------------------------------------- */

/* The p-quantile (stats/rank.h) of a 1 ms histogram (the bin's upper
 * bound), -1 when empty. */
static double lat_pct(const uint64_t *lat, double p) {
  size_t i = rank_bin(lat, LAT_BINS_MAX, p);
  return i == LAT_BINS_MAX ? -1 : (double)i + 1;
}

/* Welcomes on node `k` over [from_ms, to_ms) (whole 100 ms buckets): the
 * busiest second, counted in 1 s windows from from_ms, in *peak; returns
 * the total and the span's length in seconds in *secs. */
static uint64_t arrivals_over(const ctx_t *x, size_t k, int64_t from_ms, int64_t to_ms,
                              uint64_t *peak, double *secs) {
  size_t b0 = (size_t)(from_ms / BUCKET_MS), b1 = (size_t)((to_ms + BUCKET_MS - 1) / BUCKET_MS);
  uint64_t total = 0, sec = 0;
  *peak = 0;
  for (size_t b = b0; b < b1; b++) {
    uint64_t c = b < x->nb ? x->arr_b[b][k] : 0;
    total += c;
    sec += c;
    if ((b - b0) % (1000 / BUCKET_MS) == 1000 / BUCKET_MS - 1 || b + 1 == b1) {
      if (sec > *peak) *peak = sec;
      sec = 0;
    }
  }
  *secs = b1 > b0 ? (double)(b1 - b0) * BUCKET_MS / 1000.0 : 0;
  return total;
}

/* summary.json's `restarts` and `arrivals_per_s`: per restart, each node's
 * arrivals over the restart's span; per node, the busiest second of any
 * span and the mean over all spans, with the node's own SIGTERM -> ready. */
static void arrivals_json(const ctx_t *x, json_t *j) {
  size_t nodes = (size_t)x->o->nodes;
  uint64_t peak[MAX_NODES] = {0}, total[MAX_NODES] = {0};
  double secs = 0;
  int64_t restart_ms[MAX_NODES] = {0};
  json_t *ra = json_array();
  for (size_t i = 0; i < x->nrestarts; i++) {
    const restart_t *r = &x->restarts[i];
    json_t *per = json_object();
    double sp = 0;
    for (size_t k = 0; k < nodes; k++) {
      uint64_t pk;
      uint64_t n = arrivals_over(x, k, r->sigterm_ms, r->to_ms, &pk, &sp);
      char name[32];
      snprintf(name, sizeof name, "roll-%zu", k);
      json_object_set_new(
          per, name,
          json_pack("{s:I, s:f}", "peak", (json_int_t)pk, "mean", sp > 0 ? (double)n / sp : 0.0));
      if (pk > peak[k]) peak[k] = pk;
      total[k] += n;
    }
    secs += sp;
    restart_ms[r->node] = r->ready_ms - r->sigterm_ms;
    json_array_append_new(ra,
                          json_pack("{s:I, s:I, s:I, s:I, s:I, s:o}", "node", (json_int_t)r->node,
                                    "sigterm_ms", (json_int_t)r->sigterm_ms, "exit_ms",
                                    (json_int_t)r->exit_ms, "ready_ms", (json_int_t)r->ready_ms,
                                    "to_ms", (json_int_t)r->to_ms, "arrivals_per_s", per));
  }
  json_t *arr = json_object();
  for (size_t k = 0; k < nodes; k++) {
    char name[32];
    snprintf(name, sizeof name, "roll-%zu", k);
    json_object_set_new(arr, name,
                        json_pack("{s:I, s:f, s:I}", "peak", (json_int_t)peak[k], "mean",
                                  secs > 0 ? (double)total[k] / secs : 0.0, "restart_ms",
                                  (json_int_t)restart_ms[k]));
  }
  json_object_set_new(j, "restarts", ra);
  json_object_set_new(j, "arrivals_per_s", arr);
}

/* summary.json's `topology`: the store and the bus the nodes ran on. */
static json_t *topology_json(const ctx_t *x) {
  const options_t *o = x->o;
  if (o->shards)
    return json_pack(
        "{s:s, s:I, s:I, s:s, s:s}", "store", "sharded", "instances", (json_int_t)o->shards,
        "bus_instances", (json_int_t)o->bus, "postgres",
        "pg-tmp --fast, one cluster per instance; instance 0 also the control database", "bus",
        "redis-server, no persistence");
  return json_pack("{s:s, s:I, s:I, s:s, s:s}", "store", "one database", "instances", 1,
                   "bus_instances", 0, "postgres", o->pg_url ? "--pg-url" : "pg-tmp --fast", "bus",
                   "LISTEN/NOTIFY");
}

/* report.md: the command, the status, the plots, the restarts, the
 * latencies, then every figure as summary.json has it. */
/* summary.json's figure j[key][field], as written by write_outputs. */
static double jnum(json_t *j, const char *key, const char *field) {
  return json_number_value(json_object_get(json_object_get(j, key), field));
}

static void write_report(const ctx_t *x, json_t *j, const char *summary_text, int argc, char **argv,
                         int status, const char *plot_err) {
  const options_t *o = x->o;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/report.md", o->out);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, CMD ": cannot write %s: %s\n", path, strerror(errno));
    return;
  }
  fprintf(f, "# converger bench roll\n\nCommand:\n\n```\nconverger bench roll");
  for (int i = 0; i < argc; i++) fprintf(f, " %s", argv[i]);
  fprintf(f, "\n```\n\nStatus: %s%s%s\n\n", status == 0 ? "ok" : "FAILED", x->failed ? ": " : "",
          x->failed ? x->err : "");
  fprintf(f,
          "Options: drain %s (window %lld ms, %lld closes/s), clients %s, backoff %s%s, "
          "reconnect %s, load balancer %s, admission %s, pool %lld.\n\n",
          o->drain, o->drain_window_ms, o->drain_close_rate, o->clients_mode, o->backoff,
          o->ignore_hints ? " with the servers' retry hints ignored" : " (retry hints a floor)",
          o->reconnect,
          o->lb_haproxy ? "HAProxy (haproxy.cfg; the nodes' public URL, so a "
                          "drain's reconnectTo names it too)"
                        : "none (every client has every node's URL)",
          o->admission, o->pool_size);
  if (o->shards)
    fprintf(f,
            "Topology: sharded, %lld nodes, %lld PostgreSQL instances (%d logical shards; "
            "instance 0 also holds the control database), %lld redis-server bus instances "
            "(no persistence). Each instance is a throwaway `pg-tmp --fast` cluster, not "
            "durable: the roll restarts nodes, never a database.\n\n",
            o->nodes, o->shards, SHARD_COUNT, o->bus);
  else
    fprintf(f,
            "Topology: one database, %lld nodes on one PostgreSQL (%s), fan-out over its "
            "LISTEN/NOTIFY.\n\n",
            o->nodes, o->pg_url ? "--pg-url" : "a throwaway `pg-tmp --fast` cluster, not durable");
  fprintf(f,
          "Messages: %lld acknowledged, %lld lost, %lld delivered twice, %lld seen twice on "
          "the wire (dropped by the SDK), %lld of %lld clients verified.\n\n",
          (long long)json_integer_value(json_object_get(j, "acked")), (long long)x->v_lost,
          (long long)x->v_dup, (long long)x->v_sdkdup, (long long)x->v_ok, o->clients);
  if (plot_err && plot_err[0])
    fprintf(f, "Plots: not drawn (%s).\n\n", plot_err);
  else
    fprintf(f, "![arrivals per second per node](arrivals.png)\n\n"
               "![connected clients](connected.png)\n\n"
               "![CDF of disconnected time](disconnected_cdf.png)\n\n");
  size_t nodes = (size_t)o->nodes;
  const char *from = o->by_roll ? "drain" : "SIGTERM";
  if (o->by_roll) {
    json_t *c = x->ctl_summary;
    char why[96];
    fprintf(f,
            "Controller: `converger roll` (its output: controller.log, its summary: "
            "controller/summary.json), %s. Batches %lld, pauses %lld (%.0f s paused), fewest "
            "connections it saw %lld, balance spread (max / mean) %.2f before and %.2f after "
            "%lld shed moves. The bench only started each node again once it exited.\n\n",
            x->ctl_status < 0 ? "did not end" : bnode_status_text(x->ctl_status, why, sizeof why),
            (long long)json_array_size(json_object_get(c, "batch_s")),
            (long long)json_integer_value(json_object_get(c, "pauses")),
            json_number_value(json_object_get(c, "paused_s")),
            (long long)json_integer_value(json_object_get(c, "fewest_connections")),
            json_number_value(json_object_get(c, "spread_before")),
            json_number_value(json_object_get(c, "spread_after")),
            (long long)json_integer_value(json_object_get(c, "sheds")));
  }
  fprintf(f,
          "Restarts (ms on the timeline's clock; arrivals per second over the span from the "
          "%s to the end of the pause after ready, peak / mean):\n\n"
          "| node | %s at | %s -> exit | %s -> ready |",
          from, from, from, from);
  for (size_t k = 0; k < nodes; k++) fprintf(f, " arrivals roll-%zu |", k);
  fprintf(f, "\n| ---: | ---: | ---: | ---: |");
  for (size_t k = 0; k < nodes; k++) fprintf(f, " ---: |");
  fputc('\n', f);
  json_t *ra = json_object_get(j, "restarts");
  for (size_t i = 0; i < x->nrestarts; i++) {
    const restart_t *r = &x->restarts[i];
    json_t *per = json_object_get(json_array_get(ra, i), "arrivals_per_s");
    fprintf(f, "| roll-%zu | %lld | %lld | %lld |", r->node, (long long)r->sigterm_ms,
            (long long)(r->exit_ms - r->sigterm_ms), (long long)(r->ready_ms - r->sigterm_ms));
    for (size_t k = 0; k < nodes; k++) {
      char name[32];
      snprintf(name, sizeof name, "roll-%zu", k);
      json_t *a = json_object_get(per, name);
      fprintf(f, " %lld / %.1f |", (long long)json_integer_value(json_object_get(a, "peak")),
              json_real_value(json_object_get(a, "mean")));
    }
    fputc('\n', f);
  }
  fprintf(f, "\n`arrivals_per_s` per node: the busiest second of any restart span, and the "
             "mean over all the restart spans.\n\n");
  fprintf(f,
          "Delivery latency (the sender's POST start to on_message, 1 ms bins): live "
          "deliveries (sent after the client's current connection was welcomed) p50 %.0f / "
          "p99 %.0f ms; all deliveries, replays after a reconnect included, p50 %.0f / p99 "
          "%.0f ms.\n\n",
          jnum(j, "live_latency_ms", "p50"), jnum(j, "live_latency_ms", "p99"),
          jnum(j, "delivery_latency_ms", "p50"), jnum(j, "delivery_latency_ms", "p99"));
  fprintf(f,
          "Disconnected time per drop (%zu drops, make-before-break moves are 0; %lld with "
          "time offline): p50 %.0f / p95 %.0f / p99 %.0f / max %.0f ms (every sample: "
          "disconnected_ms.csv).\n\n",
          x->noff, (long long)jnum(j, "disconnected_ms", "offline"),
          jnum(j, "disconnected_ms", "p50"), jnum(j, "disconnected_ms", "p95"),
          jnum(j, "disconnected_ms", "p99"), jnum(j, "disconnected_ms", "max"));
  fprintf(f,
          "Hello to welcome on the nodes, admission wait included, from the restarts on "
          "(their histogram's bucket bounds): p50 %.0f / p95 %.0f / max %.0f ms; admission "
          "wait p95 %.0f / max %.0f ms. A drain's move that is not welcomed by its deadline "
          "(the window plus 2 s) is a drop with time offline.\n\n",
          jnum(j, "hello_latency_ms", "p50"), jnum(j, "hello_latency_ms", "p95"),
          jnum(j, "hello_latency_ms", "max"), jnum(j, "admission_wait_ms", "p95"),
          jnum(j, "admission_wait_ms", "max"));
  fprintf(f, "Figures (summary.json):\n\n```json\n%s\n```\n", summary_text ? summary_text : "{}");
  if (x->nbad) {
    fprintf(f, "\nSubscribers that failed the verification (%zu; the first %zu):\n\n", x->nbad,
            x->nbad < 20 ? x->nbad : (size_t)20);
    for (size_t i = 0; i < x->nbad && i < 20; i++) fprintf(f, "- %s\n", x->bad[i]);
  }
  if (fclose(f) != 0) fprintf(stderr, CMD ": cannot write %s\n", path);
}

static void write_timeline(const ctx_t *x, const sender_t *s) {
  const options_t *o = x->o;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/timeline.csv", o->out);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, CMD ": cannot write %s: %s\n", path, strerror(errno));
    return;
  }
  fprintf(f, "t_ms");
  for (long long k = 0; k < o->nodes; k++) fprintf(f, ",conn_%lld", k);
  for (long long k = 0; k < o->nodes; k++) fprintf(f, ",arrivals_%lld", k);
  fprintf(f, ",connected,sends_ok,sends_refused\n");
  /* up to the last bucket every worker sampled (the first to finish its
   * catch-up stops sampling first) */
  size_t rows = x->nb;
  for (size_t i = 0; i < x->nworkers_seen; i++)
    if (x->sampled[i] < rows) rows = x->sampled[i];
  for (size_t b = 0; b < rows; b++) {
    fprintf(f, "%zu", b * BUCKET_MS);
    uint64_t total = 0;
    for (long long k = 0; k < o->nodes; k++) {
      fprintf(f, ",%u", x->conn_b[b][k]);
      total += x->conn_b[b][k];
    }
    for (long long k = 0; k < o->nodes; k++) fprintf(f, ",%u", x->arr_b[b][k]);
    fprintf(f, ",%llu,%u,%u\n", (unsigned long long)total, b < s->nbuckets ? s->ok_b[b] : 0,
            b < s->nbuckets ? s->refused_b[b] : 0);
  }
  if (fclose(f) != 0) fprintf(stderr, CMD ": cannot write %s\n", path);
}

/* disconnected_ms.csv: every drop's disconnected time, ascending (x->off
 * is sorted). */
static void write_disconnected(const ctx_t *x) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/disconnected_ms.csv", x->o->out);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, CMD ": cannot write %s: %s\n", path, strerror(errno));
    return;
  }
  fprintf(f, "disconnected_ms\n");
  for (size_t i = 0; i < x->noff; i++) fprintf(f, "%lld\n", (long long)x->off[i]);
  if (fclose(f) != 0) fprintf(stderr, CMD ": cannot write %s\n", path);
}

static void write_outputs(ctx_t *x, const sender_t *s, int argc, char **argv, int status) {
  options_t *o = x->o;
  mkdir(o->out, 0755);
  if (x->noff) qsort(x->off, x->noff, sizeof *x->off, cmp_i64);
  json_t *j = json_object();
  json_object_set_new(j, "status", json_string(status == 0 ? "ok" : "failed"));
  if (x->failed) json_object_set_new(j, "error", json_string(x->err));
  json_object_set_new(j, "nodes", json_integer(o->nodes));
  json_object_set_new(j, "topology", topology_json(x));
  json_object_set_new(j, "clients", json_integer(o->clients));
  json_object_set_new(j, "convs", json_integer(o->convs));
  json_object_set_new(j, "drain", json_string(o->drain));
  json_object_set_new(j, "drain_window_ms", json_integer(o->drain_window_ms));
  json_object_set_new(j, "drain_close_rate", json_integer(o->drain_close_rate));
  json_object_set_new(j, "clients_mode", json_string(o->clients_mode));
  json_object_set_new(j, "backoff", json_string(o->backoff));
  json_object_set_new(j, "ignore_hints", json_boolean(o->ignore_hints));
  json_object_set_new(j, "reconnect", json_string(o->reconnect));
  json_object_set_new(j, "lb", json_string(o->lb));
  json_object_set_new(j, "admission", json_string(o->admission));
  json_object_set_new(j, "pool_size", json_integer(o->pool_size));
  json_object_set_new(j, "restart_gap_ms", json_integer(o->restart_gap_ms));
  json_object_set_new(j, "acked", json_integer((json_int_t)s->acked));
  json_object_set_new(j, "lost", json_integer((json_int_t)x->v_lost));
  json_object_set_new(j, "dup_delivered", json_integer((json_int_t)x->v_dup));
  json_object_set_new(j, "out_of_order", json_integer((json_int_t)x->v_order));
  json_object_set_new(j, "clients_verified", json_integer((json_int_t)x->v_ok));
  json_object_set_new(j, "dup_on_wire", json_integer((json_int_t)x->v_sdkdup));
  size_t offline = 0; /* drops with time offline (x->off is sorted: the tail) */
  while (offline < x->noff && x->off[x->noff - 1 - offline] > 0) offline++;
  json_object_set_new(j, "disconnected_ms",
                      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "drops", (json_int_t)x->noff,
                                "offline", (json_int_t)offline, "p50",
                                (json_int_t)pct_i64(x->off, x->noff, 0.50), "p95",
                                (json_int_t)pct_i64(x->off, x->noff, 0.95), "p99",
                                (json_int_t)pct_i64(x->off, x->noff, 0.99), "max",
                                (json_int_t)(x->noff ? x->off[x->noff - 1] : 0)));
  /* the balance at the end: each node's connections in the last whole
   * 100 ms bucket, and the busiest over the mean (a restarted node comes
   * back empty; nothing moves clients back to it) */
  json_t *end_nodes = json_array();
  double end_sum = 0, end_max = 0;
  if (x->nb >= 2)
    for (long long k = 0; k < o->nodes; k++) {
      uint32_t c = x->conn_b[x->nb - 2][k];
      json_array_append_new(end_nodes, json_integer(c));
      end_sum += c;
      if (c > end_max) end_max = c;
    }
  json_object_set_new(j, "end_connections_per_node", end_nodes);
  json_object_set_new(j, "end_spread",
                      json_real(end_sum > 0 ? end_max * (double)o->nodes / end_sum : 0));
  json_object_set_new(j, "controller", json_string(o->controller));
  if (o->by_roll) {
    json_object_set_new(j, "controller_exit",
                        json_integer(x->ctl_status >= 0 && WIFEXITED(x->ctl_status)
                                         ? WEXITSTATUS(x->ctl_status)
                                         : -1));
    json_object_set_new(j, "controller_summary",
                        x->ctl_summary ? json_incref(x->ctl_summary) : json_null());
  }
  json_object_set_new(
      j, "presence",
      o->presence_on ? json_pack("{s:I, s:I, s:I, s:I}", "joins", (json_int_t)x->p_joins, "leaves",
                                 (json_int_t)x->p_leaves, "convs_checked", (json_int_t)x->p_checked,
                                 "convs_mismatched", (json_int_t)x->p_mismatched)
                     : json_null());
  json_object_set_new(j, "roll_from_ms", json_integer(x->roll_from_ms));
  json_object_set_new(j, "roll_to_ms", json_integer(x->roll_to_ms));
  arrivals_json(x, j);
  json_object_set_new(j, "rest_sent", json_integer((json_int_t)s->sent));
  json_object_set_new(j, "rest_503", json_integer((json_int_t)s->rest_503));
  json_object_set_new(j, "rest_refused", json_integer((json_int_t)s->rest_refused));
  json_object_set_new(j, "rest_retries", json_integer((json_int_t)s->rest_retries));
  json_object_set_new(j, "rest_given_up", json_integer((json_int_t)s->given_up));
  json_object_set_new(j, "unavailable", json_integer((json_int_t)x->v_unav));
  json_object_set_new(j, "replay_unavailable", json_integer((json_int_t)x->v_runav));
  json_object_set_new(j, "attempts", json_integer((json_int_t)x->v_attempts));
  json_object_set_new(j, "migrations", json_integer((json_int_t)x->v_migr));
  json_object_set_new(
      j, "admission_wait_ms",
      json_pack("{s:f, s:f}", "p95", hist_pct(&x->adm, 0.95), "max", hist_pct(&x->adm, 1.0)));
  json_object_set_new(j, "pool_wait_peak_ms", json_real(hist_pct(&x->pool, 1.0)));
  json_object_set_new(j, "hello_latency_ms",
                      json_pack("{s:f, s:f, s:f}", "p50", hist_pct(&x->hello, 0.50), "p95",
                                hist_pct(&x->hello, 0.95), "max", hist_pct(&x->hello, 1.0)));
  json_object_set_new(j, "live_latency_ms",
                      json_pack("{s:f, s:f}", "p50", lat_pct(x->live_lat, 0.50), "p99",
                                lat_pct(x->live_lat, 0.99)));
  json_object_set_new(
      j, "delivery_latency_ms",
      json_pack("{s:f, s:f}", "p50", lat_pct(x->lat, 0.50), "p99", lat_pct(x->lat, 0.99)));
  json_t *cmd = json_array();
  json_array_append_new(cmd, json_string("converger bench roll"));
  for (int i = 0; i < argc; i++) json_array_append_new(cmd, json_string(argv[i]));
  json_object_set_new(j, "command", cmd);

  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/summary.json", o->out);
  char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  FILE *sj = text ? fopen(path, "w") : NULL;
  int written = sj && fprintf(sj, "%s\n", text) >= 0;
  if (sj && fclose(sj) != 0) written = 0;
  if (!written) fprintf(stderr, CMD ": cannot write %s\n", path);
  if (text) printf("%s\n", text);
  write_timeline(x, s);
  write_disconnected(x);
  /* The plots read the three files just written. A missing plot does not
   * fail the run: its verdict is about the messages. */
  char plot_err[300] = "";
  if (roll_plot(o->out, plot_err, sizeof plot_err) != 0)
    fprintf(stderr, CMD ": plots: %s\n", plot_err);
  write_report(x, j, text, argc, argv, status, plot_err);
  free(text);
  json_decref(j);
}

/* ---- main ------------------------------------------------------------------------- */

int bench_roll_main(int argc, char **argv) {
  options_t o = {.nodes = 3,
                 .clients = 10000,
                 .procs = 2,
                 .convs = 1000,
                 .send_rate = 200,
                 .drain_window_ms = 30000,
                 .drain_close_rate = 500,
                 .restart_gap_ms = 2000,
                 .settle_ms = 3000,
                 .wait_ms = 60000,
                 .pool_size = 20,
                 .timeout_s = 1800,
                 .pg_tmp = CONVERGER_PG_TMP_DEFAULT,
                 .out = "roll-out",
                 .drain = "migrate",
                 .clients_mode = "sdk",
                 .backoff = "decorrelated",
                 .admission = "on",
                 .reconnect = "random",
                 .lb = "direct",
                 .controller = "bench",
                 .presence = "off",
                 .roll_args = ""};
  int r = parse_options(&o, argc, argv);
  if (r != 0) return r > 0 ? 0 : 2;

  unsigned long long nofile = run_raise_nofile();
  long long per = (o.clients + o.procs - 1) / o.procs;
  if ((unsigned long long)(per * 2 + FDS_SPARE) > nofile) { /* a migration holds two sockets */
    fprintf(stderr,
            CMD ": %lld clients per process need %lld descriptors; RLIMIT_NOFILE allows %llu: "
                "raise --procs\n",
            per, per * 2 + FDS_SPARE, nofile);
    return 2;
  }

  static ctx_t x;
  memset(&x, 0, sizeof x);
  x.o = &o;
  x.ctl_status = -1;
  sender_t s = {.nnodes = (size_t)o.nodes, .nconvs = (size_t)o.convs, .rate = o.send_rate};
  int status = 1;
  run_signals_t signals;
  run_signals_catch(&signals);
  run_interrupted = 0;

  for (long long k = 0; k < o.nodes; k++) {
    if (!(x.node[k] = calloc(1, sizeof *x.node[k]))) {
      fail(&x, "out of memory");
      goto out;
    }
    x.node[k]->port = bnode_free_port();
    x.node[k]->keep_port = 1;
    x.node[k]->keep_keys = k > 0;
  }
  x.urls = calloc((size_t)o.nodes, sizeof *x.urls);
  if (!x.urls) goto out;
  if (o.lb_haproxy) {
    char why[300];
    if (rolllb_init(&x.lb, why, sizeof why) != 0) {
      fail(&x, "%s", why);
      goto out;
    }
    x.urls[0] = run_str_printf("ws://127.0.0.1:%d/v1/ws", x.lb.port);
    x.nurls = 1;
  } else {
    for (long long k = 0; k < o.nodes; k++)
      x.urls[k] = run_str_printf("ws://127.0.0.1:%d/v1/ws", x.node[k]->port);
    x.nurls = (size_t)o.nodes;
  }

  if (o.pg_url) snprintf(x.pg_url, sizeof x.pg_url, "%s", o.pg_url);
  /* fast (not durable): a roll restarts nodes, never the database, and the
   * published figures ran so (docs/benchmarks/rolling-restart/); the same
   * for each instance of a sharded cluster */
  else if (o.shards) {
    if (shardset_start(&x.sh, CMD, o.pg_tmp, (int)o.shards, (int)o.bus, 1) != 0) {
      fail(&x, "no sharded cluster");
      goto out;
    }
    snprintf(x.pg_url, sizeof x.pg_url, "%s", x.sh.url[0]);
    fprintf(stderr,
            "roll: sharded cluster: %lld PostgreSQL instances (instance 0 also the control "
            "database), bus %s\n",
            o.shards, x.sh.bus);
  } else if (pgtmp_start(CMD, o.pg_tmp, 1, x.pg_dir, sizeof x.pg_dir, x.pg_url, sizeof x.pg_url) !=
             0) {
    fail(&x, "no PostgreSQL");
    goto out;
  }
  for (long long k = 0; k < o.nodes; k++) {
    if (k > 0) {
      memcpy(x.node[k]->api_key, x.node[0]->api_key, sizeof x.node[0]->api_key);
      memcpy(x.node[k]->secret, x.node[0]->secret, sizeof x.node[0]->secret);
    }
    if (node_start(&x, (size_t)k) != 0) goto out;
    x.node[k]->keep_keys = 1;
  }
  if (o.lb_haproxy) {
    int ports[MAX_NODES];
    char why[600];
    for (long long k = 0; k < o.nodes; k++) ports[k] = x.node[k]->port;
    if (mkdir(o.out, 0755) != 0 && errno != EEXIST) {
      fail(&x, "cannot create %s: %s", o.out, strerror(errno));
      goto out;
    }
    if (rolllb_start(&x.lb, o.out, ports, (size_t)o.nodes, why, sizeof why) != 0) {
      fail(&x, "--lb haproxy: %s", why);
      goto out;
    }
    fprintf(stderr, "roll: HAProxy (pid %d) on port %d in front of the nodes (%s/haproxy.cfg)\n",
            (int)x.lb.pid, x.lb.port, o.out);
  }
  fprintf(stderr, "roll: %lld nodes ready (ports %d..), creating %lld conversations\n", o.nodes,
          x.node[0]->port, o.convs);
  if (setup(&x) != 0) goto out;

  x.t0_ns = uv_hrtime();
  if (workers_start(&x) != 0) goto out;
  fprintf(stderr, "roll: %lld clients in %zu workers connecting\n", o.clients, x.nworkers);
  if (wait_all(&x, 1, 120000 + o.clients * 10, "ready") != 0) goto out;
  fprintf(stderr, "roll: every client welcomed after %.1f s\n", (double)ms_since(x.t0_ns) / 1000);

  /* the sender */
  s.t0_ns = x.t0_ns;
  s.convs = x.convs;
  s.nbuckets = (size_t)o.timeout_s * (1000 / BUCKET_MS) + 1;
  s.head = calloc((size_t)o.convs, sizeof *s.head);
  s.acks = calloc((size_t)o.convs, sizeof *s.acks);
  s.ok_b = calloc(s.nbuckets, sizeof *s.ok_b);
  s.refused_b = calloc(s.nbuckets, sizeof *s.refused_b);
  for (long long k = 0; k < o.nodes; k++) {
    s.nb[k] = calloc(1, sizeof *s.nb[k]);
    if (!s.nb[k]) break;
    s.nb[k]->port = x.node[k]->port;
    memcpy(s.nb[k]->api_key, x.node[k]->api_key, sizeof s.nb[k]->api_key);
  }
  if (!s.head || !s.acks || !s.ok_b || !s.refused_b || !s.nb[o.nodes - 1]) {
    fail(&x, "out of memory");
    goto out;
  }
  if (o.lb_haproxy) { /* every append and its retries through the load balancer */
    s.nnodes = 1;
    s.nb[0]->port = x.lb.port;
  }
  pthread_t sender;
  if (pthread_create(&sender, NULL, sender_main, &s) != 0) {
    fail(&x, "cannot start the sender thread");
    goto out;
  }
  if (sleep_pumping(&x, o.settle_ms) == 0) {
    x.roll_from_ms = ms_since(x.t0_ns);
    for (long long k = 0; k < o.nodes; k++) scrape(&x, (size_t)k, -1);
    if (o.by_roll)
      roll_by_controller(&x);
    else
      for (long long k = 0; k < o.nodes && !x.failed; k++) restart_node(&x, (size_t)k);
    if (!x.failed) sleep_pumping(&x, o.settle_ms);
    x.roll_to_ms = ms_since(x.t0_ns);
    /* past the nodes' presence grace (CONVERGER_PRESENCE_GRACE_MS, 5 s by
     * default) and a beat: a client that did not come back has left */
    if (!x.failed && o.presence_on && sleep_pumping(&x, 6500) == 0) check_presence(&x);
  }
  atomic_store(&s.stop, 1);
  pthread_join(sender, NULL);
  if (s.err[0]) fail(&x, "sender: %s", s.err);
  if (x.failed) goto out;
  for (long long c = 0; c < o.convs; c++)
    if ((uint64_t)s.head[c] != s.acks[c]) {
      fail(&x, "conversation %s: %llu acknowledged appends but head %lld", x.convs[c],
           (unsigned long long)s.acks[c], (long long)s.head[c]);
      goto out;
    }
  fprintf(stderr,
          "roll: sender stopped: %llu acknowledged of %llu sent; waiting for the catch-up\n",
          (unsigned long long)s.acked, (unsigned long long)s.sent);

  /* the heads to every worker; they catch up, verify and report */
  size_t cap = (size_t)o.convs * 21 + 16, len = 0;
  char *line = malloc(cap);
  if (!line) goto out;
  len += (size_t)snprintf(line, cap, "heads");
  for (long long c = 0; c < o.convs; c++)
    len += (size_t)snprintf(line + len, cap - len, " %lld", (long long)s.head[c]);
  line[len++] = '\n';
  for (size_t i = 0; i < x.nworkers; i++)
    if (write_all(x.w[i].to, line, len) != 0) fail(&x, "cannot write to worker %zu", i);
  free(line);
  if (x.failed || wait_all(&x, 0, o.wait_ms + 60000, "verified") != 0) goto out;
  for (long long k = 0; k < o.nodes; k++) scrape(&x, (size_t)k, 1);
  status = x.v_lost || x.v_dup || x.v_order || x.nbad ? 1 : 0;
  if (o.presence_on) {
    fprintf(stderr,
            "roll: presence events seen by the observers (two per conversation): %llu join(s), "
            "%llu leave(s)\n",
            x.p_joins, x.p_leaves);
    if (x.p_leaves || x.p_mismatched) {
      fprintf(stderr,
              CMD ": presence flapped: %llu leave(s) during the run, %llu conversation(s) "
                  "listed wrong after it\n",
              x.p_leaves, x.p_mismatched);
      status = 1;
    }
  }
  if (x.nbad) {
    fprintf(stderr, CMD ": %zu subscribers failed the verification (%llu messages missing):\n",
            x.nbad, x.v_lost);
    for (size_t i = 0; i < x.nbad && i < 20; i++) fprintf(stderr, "  %s\n", x.bad[i]);
  }

out:
  workers_stop(&x);
  rolllb_stop(&x.lb);
  for (long long k = 0; k < o.nodes; k++) {
    if (!x.node[k]) continue;
    if (x.failed) bnode_print_log_tail(x.node[k], 10);
    bnode_stop(x.node[k]);
    bnode_remove_dir(x.node[k]);
  }
  if (x.failed) status = 1;
  write_outputs(&x, &s, argc, argv, status);
  pgtmp_stop(CMD, o.pg_tmp, x.pg_dir);
  shardset_stop(&x.sh, CMD, o.pg_tmp);
  run_signals_restore(&signals);
  for (long long k = 0; k < o.nodes; k++) {
    free(x.node[k]);
    free(s.nb[k]);
    if (x.urls) free(x.urls[k]);
  }
  for (long long c = 0; x.convs && c < o.convs; c++) free(x.convs[c]);
  free(x.convs);
  free(x.urls);
  free(x.token);
  free(x.off);
  free(x.conn_b);
  free(x.arr_b);
  free(s.head);
  free(s.acks);
  free(s.ok_b);
  free(s.refused_b);
  json_decref(x.ctl_summary);
  return status;
}
