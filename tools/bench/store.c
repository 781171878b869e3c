/*
 * store.c: `converger bench store`, the store's figures end to end through
 * real nodes (issue 5, "Benchmark"; docs/benchmarks/store.md), on each
 * backend of --backends:
 *   sqlite          SQLite, synchronous=full (the node's default)
 *   sqlite-normal   SQLite, synchronous=normal
 *   postgres        PostgreSQL as the server is configured: the bench's
 *                   own cluster is `scripts/pg-tmp start --fast`, fsync,
 *                   synchronous_commit and full_page_writes off, so NOT
 *                   durable (a crash of the server loses acknowledged
 *                   appends); with --pg-url, that server's settings
 *   postgres-fsync  the same cluster with fsync, synchronous_commit and
 *                   full_page_writes on (ALTER SYSTEM, only on a cluster the
 *                   bench started itself): durable
 *
 * Figures, for each backend and run:
 *   1. appends/s and per-append latency p50/p99 with N closed-loop REST
 *      senders (each N of --senders), all to one shared conversation and
 *      each to its own (--convs), counted over --duration-ms after
 *      --warmup-ms (bench/appender.h); afterwards every conversation is read
 *      back through REST and must hold seq 1..head with no gap, head being
 *      the number of 201 answers;
 *   2. delivery latency at --rate messages/s for --latency-ms: REST sends to
 *      node A, one WebSocket subscriber on node A ("same node") and, on
 *      PostgreSQL, on node B, a second node on the same database ("cross
 *      node"); latency = the subscriber's receive time - the time the POST
 *      was written, on this process's clock, matched by message id.
 *      Messages not received --wait-ms after the last write are "lost";
 *      received ones slower than --late-ms are "late".
 *
 * With --shards N the PostgreSQL figures run on a sharded cluster instead
 * (docs/benchmarks/scale-out.md, "Appends over shards"): N durable
 * clusters of scripts/pg-tmp, the shard map written into instance 0 (the
 * control database) as `converger shards init` does, one redis-server as
 * the bus, and nodes started with CONVERGER_BUS. On PostgreSQL each appends
 * cell also reports appends/s by instance and the CPU of each postmaster's
 * tree, the nodes, the bench, redis and the machine (bench/proccpu.h).
 *
 * What it owns: the options, the PostgreSQL cluster it starts (scripts/pg-tmp
 * start/stop in a temporary PG_TMP_DIR, stopped by that script by pid; with
 * --shards one per instance, and the redis-server, stopped by its pid), the
 * nodes of each backend run (bench/node.h: node A in `b`, node B in its own
 * bench_t used for its process and blocking REST calls only; every client
 * connection runs in b's loop), the results, the tables and the JSON.
 * Nodes are not pinned to CPUs: the node, PostgreSQL and the bench share
 * the machine. Each run uses new conversation ids, and on SQLite a new
 * database; the backends' order rotates from run to run.
 *
 * Main thread only. Exit status: 0 when every figure was measured and
 * verified (a cross-node phase in which not one message arrived counts as
 * "no cross-node fan-out in this build", not as a failure), 1 when a phase
 * failed, a conversation had a gap or a count mismatch, or messages were
 * lost on the same node or partly lost across nodes, 2 on bad usage.
 */
#include "bench/bench.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/appender.h"
#include "bench/node.h"
#include "bench/pgtmp.h"
#include "bench/proccpu.h"
#include "bench/restc.h"
#include "bench/run.h"
#include "bench/shardset.h"
#include "cli/args.h"
#include "common/util.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "core/shard.h"
#include "stats/rank.h"
#include "store/store.h"

#ifndef CONVERGER_PG_TMP_DEFAULT
#define CONVERGER_PG_TMP_DEFAULT "scripts/pg-tmp"
#endif

#define CMD         "converger bench store"
#define MAX_RUNS    20
#define MAX_COUNTS  8 /* values of --senders */
#define MAX_SENDERS 256
#define LIST_BUF    (4u << 20)             /* one GET .../messages answer */
#define PG_WAIT_MS  10000                  /* for a reloaded setting to show */
#define MAX_SHARDS  SHARDSET_MAX_INSTANCES /* --shards */

enum { BK_SQLITE, BK_SQLITE_NORMAL, BK_POSTGRES, BK_POSTGRES_FSYNC, BK_COUNT };
static const char *const bk_name[BK_COUNT] = {"sqlite", "sqlite-normal", "postgres",
                                              "postgres-fsync"};
enum { CONV_SHARED, CONV_OWN, CONV_SPREAD, CONV_MODES };
static const char *const conv_name[CONV_MODES] = {"shared", "own", "spread"};
enum { PATH_SAME, PATH_CROSS, PATHS };
static const char *const path_name[PATHS] = {"same node", "cross node"};

static int is_pg(int bk) { return bk == BK_POSTGRES || bk == BK_POSTGRES_FSYNC; }

typedef struct {
  long long duration_ms, warmup_ms, rate, latency_ms, wait_ms, late_ms, runs, pool, timeout_s,
      latency_conns;
  int backend[BK_COUNT];
  size_t nbackends;
  int senders[MAX_COUNTS];
  size_t nsenders;
  int mode[CONV_MODES]; /* which of shared/own/spread run */
  long long spread;     /* conversations of the spread mode */
  long long shards;     /* PostgreSQL instances of a sharded cluster; 0: one database */
  const char *pg_url, *pg_tmp, *out;
} options_t;

typedef struct {
  int have;
  uint64_t answered, verified, refused, retry_200;
  double rate, p50_ms, p99_ms;
  /* PostgreSQL only: appends/s of the window by instance (one for a single
   * database), and the CPU use over the whole phase (warm-up, window and
   * tail) in cores, -1 when unreadable: the PostgreSQL servers (all, and
   * each instance's postmaster with its children), the nodes (A + B), this
   * bench, the bus's redis-server, and the machine (every process, the
   * neighbours' too); and CPU ms per acknowledged append over the phase */
  int ninst;
  double inst_rate[MAX_SHARDS];
  double cpu_pg, cpu_inst[MAX_SHARDS], cpu_node, cpu_bench, cpu_redis, cpu_machine;
  double pg_ms_per_append, node_ms_per_append;
} tput_t;

typedef struct {
  int have;
  uint64_t sent, received, lost, late, seq_errors, refused;
  double p50_ms, p99_ms, max_ms, ack_p50_ms, ack_p99_ms, send_rate, lag_max_ms;
} lat_t;

typedef struct {
  tput_t tput[MAX_RUNS][BK_COUNT][MAX_COUNTS][CONV_MODES];
  lat_t lat[MAX_RUNS][BK_COUNT][PATHS];
  char pg_settings[BK_COUNT][640]; /* as the last run read them (each instance's) */
} results_t;

/* The run of one backend: its nodes, ids and tokens. */
typedef struct {
  const options_t *o;
  results_t *res;
  bench_t *b;  /* node A, and the loop of every client connection */
  bench_t *nb; /* node B (PostgreSQL), NULL otherwise */
  char tag[40];
  char *token_b;
  int run, bk;
  int bad; /* a verification failed or messages were lost: exit status 1 */
  char *list_buf;
  /* the PostgreSQL cluster */
  char pg_url[STORE_URL_MAX];
  char pg_dir[128]; /* PG_TMP_DIR of the cluster we started; "" when none */
  int pg_durable;   /* -1 unknown, 0 off, 1 on */
  /* --shards: the instances (instance 0 also holds the control database),
   * the map read back from it, and the bus's redis-server */
  int nshards;
  shardset_t sh;
} ctx_t;

/* ---- options -------------------------------------------------------------------- */

static void usage(FILE *out) {
  fprintf(out,
          "usage: " CMD " [options]\n\n"
          "Measures the store end to end through real nodes (`converger serve`, this\n"
          "executable, on free 127.0.0.1 ports) on each backend:\n"
          "  1. appends/s and per-append latency p50/p99 with N concurrent REST senders\n"
          "     (closed loop, one POST .../messages in flight each), all to one shared\n"
          "     conversation, each to its own, and spread over --spread conversations\n"
          "     (each sender going round its share); then every conversation is read back\n"
          "     through REST and must be gapless, seq 1..head, head = the 201 answers;\n"
          "  2. delivery latency at --rate messages/s: REST sends to node A, one\n"
          "     WebSocket subscriber on node A (same node) and, on PostgreSQL, on node B,\n"
          "     a second node on the same database (cross node).\n"
          "Backends: sqlite (synchronous=full, the default), sqlite-normal\n"
          "(synchronous=normal), postgres (the server's settings; the bench's own\n"
          "cluster is scripts/pg-tmp --fast: fsync, synchronous_commit and\n"
          "full_page_writes off, NOT durable), postgres-fsync (the three turned on,\n"
          "durable; only on a cluster the bench starts). Each run prints the settings.\n"
          "Results go to stdout, ending with Markdown tables of the medians; progress\n"
          "to stderr.\n\n"
          "  --backends LIST     of sqlite,sqlite-normal,postgres,postgres-fsync\n"
          "                      [sqlite,sqlite-normal,postgres,postgres-fsync]\n"
          "  --senders LIST      concurrent senders, each value 1..%d [1,8,32]\n"
          "  --convs LIST        of shared,own,spread [shared,own]; own is skipped for 1\n"
          "                      sender\n"
          "  --spread N          conversations of the spread mode [1000]\n"
          "  --duration-ms N     measured window of each appends cell [3000]\n"
          "  --warmup-ms N       sending before the window opens [500]\n"
          "  --rate N            messages/s of the latency phase [1000]\n"
          "  --latency-ms N      length of the latency phase; 0: no latency phase [3000]\n"
          "  --latency-conns N   REST connections carrying its sends [32]\n"
          "  --wait-ms N         wait for missing deliveries after the last send [3000]\n"
          "  --late-ms N         a delivery slower than this is late [1000]\n"
          "  --runs N            runs of everything, medians reported (1..%d) [3]\n"
          "  --pool N            the nodes' CONVERGER_POOL_SIZE [20]\n"
          "  --pg-url URL        use this PostgreSQL database instead of starting one\n"
          "                      (the bench adds its own rows with fresh ids; it never\n"
          "                      deletes anything)\n"
          "  --pg-tmp PATH       the script that starts one [%s]\n"
          "  --shards N          a sharded cluster instead of one database: N PostgreSQL\n"
          "                      instances (1..%d, each its own cluster from --pg-tmp,\n"
          "                      durable: fsync, synchronous_commit and full_page_writes\n"
          "                      on; instance 0 also holds the control database), the\n"
          "                      shard map written over them, one redis-server (from\n"
          "                      PATH, no persistence) as the nodes' bus; backends:\n"
          "                      postgres-fsync only (its default then). Also reports\n"
          "                      appends/s per instance\n"
          "  --out FILE          also write every run and the medians as JSON\n"
          "  --timeout S         limit of each phase in seconds [60]\n"
          "  --help              this text\n",
          MAX_SENDERS, MAX_RUNS, CONVERGER_PG_TMP_DEFAULT, MAX_SHARDS);
}

/* Split a comma list into `words`; returns the count or -1 (too many). */
static int split_list(const char *text, char words[][24], int max) {
  int n = 0;
  const char *p = text;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 0 || len >= 24 || n == max) return -1;
    memcpy(words[n], p, len);
    words[n++][len] = '\0';
    if (!comma) break;
    p = comma + 1;
    if (!*p) return -1;
  }
  return n;
}

static int parse_lists(options_t *o, const char *backends, const char *senders, const char *convs) {
  char w[MAX_COUNTS * 2][24];
  int n = split_list(backends, w, BK_COUNT);
  if (n <= 0) {
    fprintf(stderr, CMD ": invalid --backends \"%s\"\n", backends);
    return -1;
  }
  o->nbackends = 0;
  for (int i = 0; i < n; i++) {
    int k = 0;
    while (k < BK_COUNT && strcmp(w[i], bk_name[k]) != 0) k++;
    if (k == BK_COUNT) {
      fprintf(stderr,
              CMD ": unknown backend \"%s\" in --backends (sqlite, sqlite-normal, postgres, "
                  "postgres-fsync)\n",
              w[i]);
      return -1;
    }
    for (size_t j = 0; j < o->nbackends; j++)
      if (o->backend[j] == k) {
        fprintf(stderr, CMD ": backend \"%s\" twice in --backends\n", w[i]);
        return -1;
      }
    o->backend[o->nbackends++] = k;
  }
  n = split_list(senders, w, MAX_COUNTS);
  if (n <= 0) {
    fprintf(stderr, CMD ": invalid --senders \"%s\": up to %d counts, comma-separated\n", senders,
            MAX_COUNTS);
    return -1;
  }
  o->nsenders = (size_t)n;
  for (int i = 0; i < n; i++) {
    long long v;
    if (cli_parse_ll(w[i], 1, MAX_SENDERS, &v) != 0) {
      fprintf(stderr, CMD ": invalid sender count \"%s\" in --senders: want 1..%d\n", w[i],
              MAX_SENDERS);
      return -1;
    }
    o->senders[i] = (int)v;
  }
  n = split_list(convs, w, CONV_MODES);
  if (n <= 0) {
    fprintf(stderr, CMD ": invalid --convs \"%s\" (shared, own, spread)\n", convs);
    return -1;
  }
  memset(o->mode, 0, sizeof o->mode);
  for (int i = 0; i < n; i++) {
    int k = 0;
    while (k < CONV_MODES && strcmp(w[i], conv_name[k]) != 0) k++;
    if (k == CONV_MODES) {
      fprintf(stderr, CMD ": unknown value \"%s\" in --convs (shared, own, spread)\n", w[i]);
      return -1;
    }
    o->mode[k] = 1;
  }
  return 0;
}

/* Returns 0, 1 after --help, or -1 after printing why (exit status 2). */
static int parse_options(options_t *o, int argc, char **argv) {
  const char *backends = NULL, *senders = "1,8,32", *convs = "shared,own";
  /* The string options first; the rest goes to run_parse_int_options. */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!rest) return -1;
  int nrest = 0;
  static const char *const names[] = {"--backends", "--senders", "--convs",
                                      "--pg-url",   "--pg-tmp",  "--out"};
  const char **const dest[] = {&backends, &senders, &convs, &o->pg_url, &o->pg_tmp, &o->out};
  if (run_split_string_options(CMD, argc, argv, names, dest, CV_ARRAY_SIZE(names), rest, &nrest) !=
      0) {
    free(rest);
    return -1;
  }
  const run_int_opt_t opts[] = {
      {"duration-ms", &o->duration_ms, 100, 3600000},
      {"warmup-ms", &o->warmup_ms, 0, 600000},
      {"rate", &o->rate, 1, 100000},
      {"latency-ms", &o->latency_ms, 0, 600000},
      {"latency-conns", &o->latency_conns, 1, MAX_SENDERS},
      {"wait-ms", &o->wait_ms, 0, 600000},
      {"late-ms", &o->late_ms, 1, 600000},
      {"runs", &o->runs, 1, MAX_RUNS},
      {"pool", &o->pool, 1, 512},
      {"spread", &o->spread, 1, 100000},
      {"shards", &o->shards, 1, MAX_SHARDS},
      {"timeout", &o->timeout_s, 1, 86400},
  };
  int r = run_parse_int_options(CMD, nrest, rest, opts, CV_ARRAY_SIZE(opts), usage);
  free(rest);
  if (r != 0) return r;
  if (o->latency_ms > 0 && o->latency_ms < 10) {
    fprintf(stderr, CMD ": --latency-ms is 0 (no latency phase) or 10..600000\n");
    return -1;
  }
  if (!backends)
    backends = o->shards ? "postgres-fsync" : "sqlite,sqlite-normal,postgres,postgres-fsync";
  if (o->shards) {
    if (strcmp(backends, "postgres-fsync") != 0) {
      fprintf(stderr, CMD ": --shards measures durable PostgreSQL only: --backends postgres-fsync "
                          "(or leave --backends out)\n");
      return -1;
    }
    if (o->pg_url) {
      fprintf(stderr, CMD ": --shards starts its own instances: drop --pg-url\n");
      return -1;
    }
  }
  if (parse_lists(o, backends, senders, convs) != 0) return -1;
  if (o->rate * o->latency_ms / 1000 > 10000000) {
    fprintf(stderr, CMD ": --rate x --latency-ms is over 10 million messages\n");
    return -1;
  }
  for (size_t i = 0; i < o->nbackends; i++)
    if (o->backend[i] == BK_POSTGRES_FSYNC && o->pg_url) {
      fprintf(stderr, CMD ": postgres-fsync changes the server's settings, so it runs only on a "
                          "cluster the bench starts itself: drop --pg-url or postgres-fsync\n");
      return -1;
    }
  if (o->pg_url && !dburl_backend(o->pg_url)) {
    fprintf(stderr, CMD ": --pg-url \"%s\" is not a PostgreSQL URL (postgres://...)\n", o->pg_url);
    return -1;
  }
  return 0;
}

/* ---- statistics ----------------------------------------------------------------- */

/* The p-quantile (stats/rank.h) of sorted `v` (n > 0), ns in, ms out. */
static double pct_ms(const uint64_t *v, size_t n, double p) {
  return (double)v[rank_nearest(p, n) - 1] / 1e6;
}

/* ---- PostgreSQL: scripts/pg-tmp and the durability settings -------------------- */

static int pg_start(ctx_t *x) {
  if (access(x->o->pg_tmp, X_OK) != 0) {
    fprintf(stderr,
            CMD ": cannot run %s (%s); give --pg-tmp PATH or --pg-url URL, or leave postgres "
                "out of --backends\n",
            x->o->pg_tmp, strerror(errno));
    return -1;
  }
  /* fast: `postgres` measures the non-durable settings, `postgres-fsync`
   * turns them on (pg_set_durable) and back off */
  return pgtmp_start(CMD, x->o->pg_tmp, 1, x->pg_dir, sizeof x->pg_dir, x->pg_url,
                     sizeof x->pg_url);
}

static void pg_stop(ctx_t *x) { pgtmp_stop(CMD, x->o->pg_tmp, x->pg_dir); }

static PGconn *pg_connect(const char *url, char *err, size_t cap) {
  const char *const keys[] = {"dbname", "connect_timeout", NULL};
  const char *const vals[] = {url, "5", NULL};
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  if (PQstatus(c) != CONNECTION_OK) {
    snprintf(err, cap, "%s", c ? PQerrorMessage(c) : "out of memory");
    char *nl = strchr(err, '\n');
    if (nl) *nl = '\0';
    PQfinish(c);
    return NULL;
  }
  return c;
}

/* "fsync=on synchronous_commit=on full_page_writes=on" into out. */
static int pg_settings(PGconn *c, char *out, size_t cap) {
  static const char *const names[] = {"fsync", "synchronous_commit", "full_page_writes"};
  size_t len = 0;
  out[0] = '\0';
  for (size_t i = 0; i < CV_ARRAY_SIZE(names); i++) {
    char sql[64];
    snprintf(sql, sizeof sql, "SHOW %s", names[i]);
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    if (ok)
      len += (size_t)snprintf(out + len, cap - len, "%s%s=%s", i ? " " : "", names[i],
                              PQgetvalue(r, 0, 0));
    PQclear(r);
    if (!ok || len >= cap) return -1;
  }
  return 0;
}

/* Turn the durability settings on (durable) or back to the cluster's own
 * (postgresql.conf), and wait until a new session sees them. Only on the
 * cluster we started. Returns 0 or -1 (b->err set). */
static int pg_set_durable(ctx_t *x, int durable) {
  bench_t *b = x->b;
  char err[256], now[128];
  if (x->pg_durable == durable) return 0;
  PGconn *c = pg_connect(x->pg_url, err, sizeof err);
  if (!c) {
    run_fail(b, "postgres: cannot connect to %s: %s", x->pg_url, err);
    return -1;
  }
  static const char *const on[] = {
      "ALTER SYSTEM SET fsync = on", "ALTER SYSTEM SET synchronous_commit = on",
      "ALTER SYSTEM SET full_page_writes = on", "SELECT pg_reload_conf()"};
  static const char *const off[] = {
      "ALTER SYSTEM RESET fsync", "ALTER SYSTEM RESET synchronous_commit",
      "ALTER SYSTEM RESET full_page_writes", "SELECT pg_reload_conf()"};
  for (size_t i = 0; i < 4; i++) {
    PGresult *r = PQexec(c, durable ? on[i] : off[i]);
    ExecStatusType s = PQresultStatus(r);
    PQclear(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
      run_fail(b, "postgres: %s: %s", durable ? on[i] : off[i], PQerrorMessage(c));
      PQfinish(c);
      return -1;
    }
  }
  PQfinish(c);
  /* The reload is asynchronous: poll from fresh sessions. */
  const char *want = durable ? "fsync=on synchronous_commit=on" : "fsync=off";
  uint64_t until = run_now_ns() + (uint64_t)PG_WAIT_MS * 1000000u;
  for (;;) {
    c = pg_connect(x->pg_url, err, sizeof err);
    int r = c ? pg_settings(c, now, sizeof now) : -1;
    PQfinish(c);
    if (r == 0 && strncmp(now, want, strlen(want)) == 0) break;
    if (run_now_ns() >= until || run_interrupted) {
      run_fail(b, "postgres: the settings did not become \"%s\" within %d s (now: %s)", want,
               PG_WAIT_MS / 1000, r == 0 ? now : err);
      return -1;
    }
    run_sleep_ms(50);
  }
  x->pg_durable = durable;
  return 0;
}

/* ---- --shards: the instances, the shard map, the bus ------------------------------ */

/* Start --shards durable instances and the bus (bench/shardset.h). 0 or -1. */
static int shards_start(ctx_t *x) {
  if (shardset_start(&x->sh, CMD, x->o->pg_tmp, (int)x->o->shards, 1, 0) != 0) return -1;
  x->nshards = x->sh.ninst;
  snprintf(x->pg_url, sizeof x->pg_url, "%s", x->sh.url[0]);
  x->pg_durable = 1;
  return 0;
}

static void shards_stop(ctx_t *x) { shardset_stop(&x->sh, CMD, x->o->pg_tmp); }

/* The instance of conversation `id` (0 on one database). */
static int inst_of(const ctx_t *x, const char *id) {
  return x->nshards ? shardset_instance_of(&x->sh, id) : 0;
}

/* The postmaster of instance i, or -1 (--pg-url: not ours to read). */
static pid_t inst_pid(const ctx_t *x, int i) {
  const char *dir = x->nshards ? x->sh.dir[i] : i == 0 ? x->pg_dir : "";
  char path[256];
  if (!dir[0]) return -1;
  snprintf(path, sizeof path, "%s/data/postmaster.pid", dir);
  return proccpu_pid_file(path);
}

/* ---- nodes and setup ------------------------------------------------------------ */

/* Start `nb` for backend x->bk as node `name` and wait until it is ready. */
static int node_up(ctx_t *x, bench_t *nb, const char *name) {
  char sync[64], db[STORE_URL_MAX + 32], pool[48], id[64], bus[SHARDSET_MAX_BUS * 32 + 16];
  const char *env[6] = {NULL};
  size_t k = 0;
  snprintf(pool, sizeof pool, "CONVERGER_POOL_SIZE=%lld", x->o->pool);
  snprintf(id, sizeof id, "CONVERGER_NODE_ID=bench-store-%s", name);
  env[k++] = pool;
  env[k++] = id;
  if (is_pg(x->bk)) {
    snprintf(db, sizeof db, "CONVERGER_DATABASE_URL=%s", x->pg_url);
    env[k++] = db;
    if (x->nshards) { /* the control database (instance 0) and the bus: a sharded node */
      snprintf(bus, sizeof bus, "CONVERGER_BUS=%s", x->sh.bus);
      env[k++] = bus;
    }
  } else {
    snprintf(sync, sizeof sync, "CONVERGER_SQLITE_SYNC=%s",
             x->bk == BK_SQLITE_NORMAL ? "normal" : "full");
    env[k++] = sync;
  }
  nb->node_cpu = -1; /* the node, PostgreSQL and the bench share the machine */
  nb->timeout_s = (int)x->o->timeout_s;
  if (bnode_start_env(nb, env) != 0 || bnode_wait_ready(nb) != 0) {
    if (nb != x->b) run_fail(x->b, "node %s: %s", name, nb->err);
    return -1;
  }
  return 0;
}

/* One token covering every conversation, minted by node `nb` (its secret). */
static char *mint_token(bench_t *b, bench_t *nb) {
  char *token = restc_token(nb, "bench");
  if (!token && nb != b) run_fail(b, "node B: %s", nb->err);
  return token;
}

static int conv_create(ctx_t *x, const char *id) {
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"channel\":\"%s\"}", id, x->tag);
  return restc_expect(x->b, "POST", "/v1/conversations", body, NULL, 201, NULL, 0);
}

/* Read `conv` back through REST, page by page: seq must run 1..head with
 * no gap and head must be `want`. Returns 0, or -1 (b->err set, x->bad). */
static int verify_conv(ctx_t *x, const char *conv, uint64_t want) {
  bench_t *b = x->b;
  char path[256];
  int64_t after = 0, head = -1;
  for (;;) {
    snprintf(path, sizeof path, "/v1/conversations/%s/messages?after=%lld&limit=%d", conv,
             (long long)after, STORE_REPLAY_PAGE_MAX);
    if (restc_expect(b, "GET", path, NULL, NULL, 200, x->list_buf, LIST_BUF) != 0) return -1;
    json_error_t je;
    json_t *v = json_loads(x->list_buf, 0, &je);
    json_t *msgs = json_object_get(v, "messages");
    json_t *h = json_object_get(v, "head");
    if (!json_is_array(msgs) || !json_is_integer(h)) {
      json_decref(v);
      run_fail(b, "GET %s: not a page of messages (%s)", path, v ? "fields missing" : je.text);
      return -1;
    }
    head = json_integer_value(h);
    size_t n = json_array_size(msgs);
    for (size_t i = 0; i < n; i++) {
      int64_t seq = json_integer_value(json_object_get(json_array_get(msgs, i), "seq"));
      if (seq != after + 1) {
        json_decref(v);
        x->bad = 1;
        run_fail(b, "conversation %s: seq %lld follows %lld: a gap", conv, (long long)seq,
                 (long long)after);
        return -1;
      }
      after = seq;
    }
    json_decref(v);
    if (n == 0 || after >= head) break;
  }
  if (after != head || (uint64_t)head != want) {
    x->bad = 1;
    run_fail(b,
             "conversation %s: read back seq 1..%lld, head %lld, but %llu appends were answered "
             "201",
             conv, (long long)after, (long long)head, (unsigned long long)want);
    return -1;
  }
  return 0;
}

/* ---- the two figures ------------------------------------------------------------ */

/* The processes whose CPU an appends cell reads: the PostgreSQL instances
 * (each a tree: postmaster and backends), then node A, node B, this bench
 * and the redis-server (each alone). Returns how many. */
enum { CPU_NODE_A, CPU_NODE_B, CPU_BENCH, CPU_REDIS, CPU_OTHERS };
static int cpu_roots(const ctx_t *x, int ninst, pid_t *roots, int *tree) {
  for (int i = 0; i < ninst; i++) {
    roots[i] = inst_pid(x, i);
    tree[i] = 1;
  }
  roots[ninst + CPU_NODE_A] = x->b->pid;
  roots[ninst + CPU_NODE_B] = x->nb ? x->nb->pid : -1;
  roots[ninst + CPU_BENCH] = getpid();
  roots[ninst + CPU_REDIS] = x->sh.redis_pid[0] > 0 ? x->sh.redis_pid[0] : -1;
  for (int k = 0; k < CPU_OTHERS; k++) tree[ninst + k] = 0;
  return ninst + CPU_OTHERS;
}

/* Sum of the cores of readings [from, from + n), or -1 when one of those
 * that exist is unreadable; a root that is not there (-1 pid) counts 0. */
static double cores_sum(const proccpu_snap_t *a, const proccpu_snap_t *z, const pid_t *roots,
                        int from, int n) {
  double sum = 0;
  for (int i = from; i < from + n; i++) {
    if (roots[i] <= 0) continue;
    double c = proccpu_cores(a, z, i);
    if (c < 0) return -1;
    sum += c;
  }
  return sum;
}

static int cell_appends(ctx_t *x, size_t si, int mode) {
  bench_t *b = x->b;
  int n = x->o->senders[si];
  size_t nconvs = mode == CONV_SHARED ? 1 : mode == CONV_OWN ? (size_t)n : (size_t)x->o->spread;
  char(*ids)[96] = calloc(nconvs, sizeof *ids);
  const char **convs = calloc(nconvs, sizeof *convs);
  appender_tput_t t = {0};
  int r = -1;
  if (!ids || !convs) {
    run_fail(b, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < nconvs; i++) {
    if (mode == CONV_SHARED)
      snprintf(ids[i], sizeof ids[i], "%s-n%d-shared", x->tag, n);
    else
      snprintf(ids[i], sizeof ids[i], "%s-n%d-%s%zu", x->tag, n, conv_name[mode], i);
    convs[i] = ids[i];
    if (conv_create(x, ids[i]) != 0) goto out;
  }
  int ninst = is_pg(x->bk) ? (x->nshards ? x->nshards : 1) : 0;
  pid_t roots[PROCCPU_TREES_MAX];
  int tree[PROCCPU_TREES_MAX];
  int nroots = cpu_roots(x, ninst, roots, tree);
  proccpu_snap_t cpu0, cpu1;
  proccpu_snap(roots, tree, nroots, &cpu0);
  if (appender_throughput(b, (size_t)n, convs, nconvs, (uint64_t)x->o->warmup_ms,
                          (uint64_t)x->o->duration_ms, &t) != 0)
    goto out;
  proccpu_snap(roots, tree, nroots, &cpu1);
  uint64_t verified = 0;
  for (size_t i = 0; i < nconvs; i++) {
    if (verify_conv(x, ids[i], t.acks[i]) != 0) goto out;
    verified += t.acks[i];
  }
  tput_t *c = &x->res->tput[x->run][x->bk][si][mode];
  c->have = 1;
  c->answered = t.answered;
  c->verified = verified;
  c->refused = t.refused;
  c->retry_200 = t.retry_200;
  c->rate = (double)t.answered / t.window_s;
  qsort(t.lat_ns, t.nlat, sizeof *t.lat_ns, run_cmp_u64);
  c->p50_ms = t.nlat ? pct_ms(t.lat_ns, t.nlat, 0.50) : 0;
  c->p99_ms = t.nlat ? pct_ms(t.lat_ns, t.nlat, 0.99) : 0;
  c->ninst = ninst;
  uint64_t phase_acks = 0;
  for (size_t i = 0; i < nconvs; i++) {
    phase_acks += t.acks[i];
    if (ninst) c->inst_rate[inst_of(x, ids[i])] += (double)t.win[i] / t.window_s;
  }
  double wall = proccpu_wall_s(&cpu0, &cpu1);
  c->cpu_pg = ninst ? cores_sum(&cpu0, &cpu1, roots, 0, ninst) : -1;
  for (int i = 0; i < ninst; i++) c->cpu_inst[i] = proccpu_cores(&cpu0, &cpu1, i);
  c->cpu_node = cores_sum(&cpu0, &cpu1, roots, ninst + CPU_NODE_A, 2);
  c->cpu_bench = proccpu_cores(&cpu0, &cpu1, ninst + CPU_BENCH);
  c->cpu_redis = x->sh.redis_pid[0] > 0 ? proccpu_cores(&cpu0, &cpu1, ninst + CPU_REDIS) : 0;
  c->cpu_machine = proccpu_machine_cores(&cpu0, &cpu1);
  c->pg_ms_per_append =
      c->cpu_pg >= 0 && phase_acks ? c->cpu_pg * wall * 1000.0 / (double)phase_acks : -1;
  c->node_ms_per_append =
      c->cpu_node >= 0 && phase_acks ? c->cpu_node * wall * 1000.0 / (double)phase_acks : -1;
  printf("run %d, %s: %d sender%s, %s: %.0f appends/s (%llu in %.3f s), per append p50 %.2f ms, "
         "p99 %.2f ms; %llu appends read back gapless in %zu conversation%s",
         x->run + 1, bk_name[x->bk], n, n == 1 ? "" : "s",
         mode == CONV_SHARED ? "one shared conversation"
         : mode == CONV_OWN  ? "a conversation each"
                             : "spread over conversations",
         c->rate, (unsigned long long)t.answered, t.window_s, c->p50_ms, c->p99_ms,
         (unsigned long long)verified, nconvs, nconvs == 1 ? "" : "s");
  if (t.refused)
    printf("; %llu answers 503 (store overloaded; retried at once with the same key, %llu of "
           "them acknowledged by a 200)",
           (unsigned long long)t.refused, (unsigned long long)t.retry_200);
  printf("\n");
  if (ninst) {
    printf("run %d, %s: %d sender%s, %s: per instance", x->run + 1, bk_name[x->bk], n,
           n == 1 ? "" : "s", conv_name[mode]);
    for (int i = 0; i < ninst; i++) printf("%s %d: %.0f/s", i ? "," : "", i, c->inst_rate[i]);
    printf("; CPU over the %.2f s phase, in cores of %ld: PostgreSQL %.2f (", wall,
           sysconf(_SC_NPROCESSORS_ONLN), c->cpu_pg);
    for (int i = 0; i < ninst; i++) printf("%s%.2f", i ? " + " : "", c->cpu_inst[i]);
    printf("), nodes %.2f, bench %.2f, redis %.2f, machine busy %.2f; per append: PostgreSQL "
           "%.3f ms, node %.3f ms of CPU\n",
           c->cpu_node, c->cpu_bench, c->cpu_redis, c->cpu_machine, c->pg_ms_per_append,
           c->node_ms_per_append);
  }
  fflush(stdout);
  r = 0;
out:
  appender_tput_free(&t);
  free(ids);
  free(convs);
  return r;
}

static int cell_latency(ctx_t *x, int path) {
  bench_t *b = x->b;
  const options_t *o = x->o;
  char conv[64];
  snprintf(conv, sizeof conv, "%s-lat-%s", x->tag, path == PATH_SAME ? "same" : "cross");
  if (conv_create(x, conv) != 0) return -1;
  appender_paced_t p = {0};
  int sub_port = path == PATH_SAME ? b->port : x->nb->port;
  const char *token = path == PATH_SAME ? b->token : x->token_b;
  int r = appender_paced(b, (size_t)o->latency_conns, conv, sub_port, token, o->rate, o->latency_ms,
                         o->wait_ms, &p);
  if (r != 0) goto out;
  r = -1;
  if (verify_conv(x, conv, p.n) != 0) goto out;
  lat_t *c = &x->res->lat[x->run][x->bk][path];
  uint64_t *lat = calloc(p.n, sizeof *lat), *ack = calloc(p.n, sizeof *ack);
  if (!lat || !ack) {
    free(lat);
    free(ack);
    run_fail(b, "out of memory");
    goto out;
  }
  size_t nl = 0;
  uint64_t lag = 0;
  for (size_t i = 0; i < p.n; i++) {
    if (p.recv_ns[i]) lat[nl++] = p.recv_ns[i] - p.write_ns[i];
    ack[i] = p.ack_ns[i] - p.write_ns[i];
    if (p.write_ns[i] - p.sched_ns[i] > lag) lag = p.write_ns[i] - p.sched_ns[i];
  }
  qsort(lat, nl, sizeof *lat, run_cmp_u64);
  qsort(ack, p.n, sizeof *ack, run_cmp_u64);
  c->have = 1;
  c->sent = p.n;
  c->received = nl;
  c->lost = p.n - nl;
  c->seq_errors = p.seq_errors;
  c->refused = p.refused;
  for (size_t i = 0; i < nl; i++)
    if (lat[i] > (uint64_t)o->late_ms * 1000000u) c->late++;
  c->p50_ms = nl ? pct_ms(lat, nl, 0.50) : 0;
  c->p99_ms = nl ? pct_ms(lat, nl, 0.99) : 0;
  c->max_ms = nl ? (double)lat[nl - 1] / 1e6 : 0;
  c->ack_p50_ms = pct_ms(ack, p.n, 0.50);
  c->ack_p99_ms = pct_ms(ack, p.n, 0.99);
  c->lag_max_ms = (double)lag / 1e6;
  c->send_rate =
      p.n > 1 ? (double)(p.n - 1) * 1e9 / (double)(p.write_ns[p.n - 1] - p.write_ns[0]) : 0;
  free(lat);
  free(ack);
  printf("run %d, %s, %s: %llu messages sent at %.0f/s (writes at most %.1f ms behind schedule); "
         "received %llu, lost %llu (waited %lld ms after the last send), late %llu (> %lld ms)",
         x->run + 1, bk_name[x->bk], path_name[path], (unsigned long long)c->sent, c->send_rate,
         c->lag_max_ms, (unsigned long long)c->received, (unsigned long long)c->lost, o->wait_ms,
         (unsigned long long)c->late, o->late_ms);
  if (nl)
    printf("; latency p50 %.2f ms, p99 %.2f ms, max %.2f ms", c->p50_ms, c->p99_ms, c->max_ms);
  printf("; POST answered p50 %.2f ms, p99 %.2f ms", c->ack_p50_ms, c->ack_p99_ms);
  if (p.refused) printf("; %llu answers 503 (retried at once)", (unsigned long long)p.refused);
  if (p.dup || p.seq_errors)
    printf("; %llu duplicates, %llu seqs out of order", (unsigned long long)p.dup,
           (unsigned long long)p.seq_errors);
  printf("\n");
  if (path == PATH_CROSS && nl == 0)
    printf("run %d, %s, cross node: not one message reached node B's subscriber: this build does "
           "not fan messages out across nodes\n",
           x->run + 1, bk_name[x->bk]);
  fflush(stdout);
  if ((path == PATH_SAME && (c->lost || c->seq_errors)) || (path == PATH_CROSS && nl && c->lost))
    x->bad = 1;
  r = 0;
out:
  appender_paced_free(&p);
  return r;
}

/* Everything of one backend in one run: nodes up, figures, nodes down. */
static int backend_run(ctx_t *x) {
  bench_t *b = x->b;
  const options_t *o = x->o;
  int r = -1;
  char hex[7];
  if (util_random_hex(hex, 3) != 0) {
    run_fail(b, "cannot draw random ids");
    return -1;
  }
  snprintf(x->tag, sizeof x->tag, "bs%d-%s-%s", x->run + 1, bk_name[x->bk], hex);
  if (is_pg(x->bk)) {
    if (x->pg_dir[0] && pg_set_durable(x, x->bk == BK_POSTGRES_FSYNC) != 0) return -1;
    char *text = x->res->pg_settings[x->bk];
    size_t cap = sizeof x->res->pg_settings[x->bk], len = 0;
    text[0] = '\0';
    for (int i = 0; i < (x->nshards ? x->nshards : 1) && len < cap; i++) {
      char err[256], one[128];
      PGconn *c = pg_connect(x->nshards ? x->sh.url[i] : x->pg_url, err, sizeof err);
      if (!c || pg_settings(c, one, sizeof one) != 0)
        snprintf(one, sizeof one, "unknown (%.100s)", c ? PQerrorMessage(c) : err);
      PQfinish(c);
      if (x->nshards)
        len += (size_t)snprintf(text + len, cap - len, "%sinstance %d: %s", i ? "; " : "", i, one);
      else
        len += (size_t)snprintf(text + len, cap - len, "%s", one);
    }
  }
  fprintf(stderr, "run %d, %s: starting node A%s\n", x->run + 1, bk_name[x->bk],
          is_pg(x->bk) ? " and node B" : "");
  if (node_up(x, b, "a") != 0) goto out;
  if (is_pg(x->bk)) {
    if (!(x->nb = calloc(1, sizeof *x->nb))) {
      run_fail(b, "out of memory");
      goto out;
    }
    if (node_up(x, x->nb, "b") != 0) goto out;
  }
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"name\":\"bench store\"}", x->tag);
  if (restc_expect(b, "POST", "/v1/channels", body, NULL, 201, NULL, 0) != 0) goto out;
  if (!(b->token = mint_token(b, b))) goto out;
  if (x->nb && !(x->token_b = mint_token(b, x->nb))) goto out;
  if (is_pg(x->bk))
    printf("run %d, %s: PostgreSQL %s%s\n", x->run + 1, bk_name[x->bk],
           x->nshards ? "sharded, " : "", x->res->pg_settings[x->bk]);
  for (size_t si = 0; si < o->nsenders; si++)
    for (int m = 0; m < CONV_MODES; m++) {
      if (!o->mode[m] || (m == CONV_OWN && o->senders[si] == 1)) continue;
      if (cell_appends(x, si, m) != 0) goto out;
    }
  if (o->latency_ms > 0 && cell_latency(x, PATH_SAME) != 0) goto out;
  if (o->latency_ms > 0 && x->nb && cell_latency(x, PATH_CROSS) != 0) goto out;
  r = 0;
out:
  if (x->nb) {
    if (x->nb->failed && !b->failed) run_fail(b, "node B: %s", x->nb->err);
    if (b->failed) bnode_print_log_tail(x->nb, 10);
    bnode_stop(x->nb);
    bnode_remove_dir(x->nb);
    free(x->nb);
    x->nb = NULL;
  }
  if (b->failed) bnode_print_log_tail(b, 20);
  bnode_stop(b);
  bnode_remove_dir(b);
  free(b->token);
  b->token = NULL;
  free(x->token_b);
  x->token_b = NULL;
  return r;
}

/* ---- medians, tables, JSON ------------------------------------------------------ */

/* The medians over the runs of one appends cell, and the 503s over all of
 * them; returns the number of runs that have it. */
static int tput_median(const ctx_t *x, int bk, size_t si, int m, tput_t *out) {
  double rate[MAX_RUNS], p50[MAX_RUNS], p99[MAX_RUNS];
  /* the PostgreSQL figures: each its own median */
  enum { F_PG, F_NODE, F_BENCH, F_REDIS, F_MACHINE, F_PGMS, F_NODEMS, F_COUNT };
  double f[F_COUNT + 2 * MAX_SHARDS][MAX_RUNS];
  size_t n = 0;
  memset(out, 0, sizeof *out);
  for (int r = 0; r < x->o->runs; r++) {
    const tput_t *c = &x->res->tput[r][bk][si][m];
    if (!c->have) continue;
    out->ninst = c->ninst;
    const double v[F_COUNT] = {
        c->cpu_pg,      c->cpu_node,         c->cpu_bench,         c->cpu_redis,
        c->cpu_machine, c->pg_ms_per_append, c->node_ms_per_append};
    for (int k = 0; k < F_COUNT; k++) f[k][n] = v[k];
    for (int i = 0; i < c->ninst; i++) {
      f[F_COUNT + i][n] = c->inst_rate[i];
      f[F_COUNT + MAX_SHARDS + i][n] = c->cpu_inst[i];
    }
    rate[n] = c->rate;
    p50[n] = c->p50_ms;
    p99[n++] = c->p99_ms;
    out->refused += c->refused;
  }
  if (!n) return 0;
  out->have = 1;
  out->rate = run_median(rate, n);
  out->p50_ms = run_median(p50, n);
  out->p99_ms = run_median(p99, n);
  double *const dst[F_COUNT] = {
      &out->cpu_pg,      &out->cpu_node,         &out->cpu_bench,         &out->cpu_redis,
      &out->cpu_machine, &out->pg_ms_per_append, &out->node_ms_per_append};
  for (int k = 0; k < F_COUNT; k++) *dst[k] = run_median(f[k], n);
  for (int i = 0; i < out->ninst; i++) {
    out->inst_rate[i] = run_median(f[F_COUNT + i], n);
    out->cpu_inst[i] = run_median(f[F_COUNT + MAX_SHARDS + i], n);
  }
  return (int)n;
}

/* Medians of the latencies over the runs that received something; totals
 * of the counts over every run. */
static int lat_median(const ctx_t *x, int bk, int path, lat_t *out) {
  double p50[MAX_RUNS], p99[MAX_RUNS], mx[MAX_RUNS], a50[MAX_RUNS], a99[MAX_RUNS], rate[MAX_RUNS];
  size_t n = 0, nrecv = 0;
  memset(out, 0, sizeof *out);
  for (int r = 0; r < x->o->runs; r++) {
    const lat_t *c = &x->res->lat[r][bk][path];
    if (!c->have) continue;
    out->sent += c->sent;
    out->received += c->received;
    out->lost += c->lost;
    out->late += c->late;
    out->refused += c->refused;
    a50[n] = c->ack_p50_ms;
    a99[n] = c->ack_p99_ms;
    rate[n++] = c->send_rate;
    if (c->received) {
      p50[nrecv] = c->p50_ms;
      p99[nrecv] = c->p99_ms;
      mx[nrecv++] = c->max_ms;
    }
  }
  if (!n) return 0;
  out->have = 1;
  out->ack_p50_ms = run_median(a50, n);
  out->ack_p99_ms = run_median(a99, n);
  out->send_rate = run_median(rate, n);
  if (nrecv) {
    out->p50_ms = run_median(p50, nrecv);
    out->p99_ms = run_median(p99, nrecv);
    out->max_ms = run_median(mx, nrecv);
  }
  return (int)n;
}

static void print_tables(const ctx_t *x) {
  const options_t *o = x->o;
  tput_t med;
  printf("\nappends/s, median of the runs (per-append latency p50 / p99, ms; 503 answers over "
         "all runs, if any); closed-loop REST senders, %lld ms windows after %lld ms of warm-up, "
         "pool %lld\n\n| senders | conversations |",
         o->duration_ms, o->warmup_ms, o->pool);
  for (size_t i = 0; i < o->nbackends; i++) printf(" %s |", bk_name[o->backend[i]]);
  printf("\n| ---: | --- |");
  for (size_t i = 0; i < o->nbackends; i++) printf(" ---: |");
  printf("\n");
  for (size_t si = 0; si < o->nsenders; si++)
    for (int m = 0; m < CONV_MODES; m++) {
      if (!o->mode[m] || (m == CONV_OWN && o->senders[si] == 1)) continue;
      printf("| %d | %s |", o->senders[si], conv_name[m]);
      for (size_t i = 0; i < o->nbackends; i++) {
        if (tput_median(x, o->backend[i], si, m, &med) && med.refused)
          printf(" %.0f (%.2f / %.2f; %llu x 503) |", med.rate, med.p50_ms, med.p99_ms,
                 (unsigned long long)med.refused);
        else if (med.have)
          printf(" %.0f (%.2f / %.2f) |", med.rate, med.p50_ms, med.p99_ms);
        else
          printf(" - |");
      }
      printf("\n");
    }
  if (o->nbackends > 1) {
    int base = o->backend[0];
    printf("\nappends/s against %s (ratio of the medians)\n\n| senders | conversations |",
           bk_name[base]);
    for (size_t i = 1; i < o->nbackends; i++)
      printf(" %s / %s |", bk_name[o->backend[i]], bk_name[base]);
    printf("\n| ---: | --- |");
    for (size_t i = 1; i < o->nbackends; i++) printf(" ---: |");
    printf("\n");
    for (size_t si = 0; si < o->nsenders; si++)
      for (int m = 0; m < CONV_MODES; m++) {
        if (!o->mode[m] || (m == CONV_OWN && o->senders[si] == 1)) continue;
        tput_t b0;
        printf("| %d | %s |", o->senders[si], conv_name[m]);
        int have0 = tput_median(x, base, si, m, &b0);
        for (size_t i = 1; i < o->nbackends; i++) {
          if (have0 && b0.rate > 0 && tput_median(x, o->backend[i], si, m, &med))
            printf(" %.2f |", med.rate / b0.rate);
          else
            printf(" - |");
        }
        printf("\n");
      }
  }
  int any_pg = 0;
  for (size_t i = 0; i < o->nbackends; i++) any_pg |= is_pg(o->backend[i]);
  if (any_pg) {
    printf(
        "\nPostgreSQL: appends/s per instance and CPU use in cores of %ld over each appends "
        "phase (warm-up, window, tail), medians of the runs; %s\n\n| senders | conversations "
        "| backend | appends/s | per instance | PostgreSQL cores (per instance) | nodes | bench | "
        "redis | machine busy | CPU ms per append: PostgreSQL / node |\n| ---: | --- | --- | "
        "---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
        sysconf(_SC_NPROCESSORS_ONLN),
        x->nshards ? "sharded: instance 0 also holds the control database"
                   : "one database (instance 0)");
    for (size_t i = 0; i < o->nbackends; i++) {
      int bk = o->backend[i];
      if (!is_pg(bk)) continue;
      for (size_t si = 0; si < o->nsenders; si++)
        for (int m = 0; m < CONV_MODES; m++) {
          if (!o->mode[m] || (m == CONV_OWN && o->senders[si] == 1)) continue;
          if (!tput_median(x, bk, si, m, &med)) continue;
          printf("| %d | %s | %s%s | %.0f |", o->senders[si], conv_name[m], bk_name[bk],
                 x->nshards ? ", sharded" : "", med.rate);
          for (int k = 0; k < med.ninst; k++) printf("%s%.0f", k ? " / " : " ", med.inst_rate[k]);
          printf(" | %.2f (", med.cpu_pg);
          for (int k = 0; k < med.ninst; k++) printf("%s%.2f", k ? " / " : "", med.cpu_inst[k]);
          printf(") | %.2f | %.2f | %.2f | %.2f | %.3f / %.3f |\n", med.cpu_node, med.cpu_bench,
                 med.cpu_redis, med.cpu_machine, med.pg_ms_per_append, med.node_ms_per_append);
        }
    }
  }
  if (o->latency_ms == 0) {
    fflush(stdout);
    return;
  }
  printf("\ndelivery latency at %lld messages/s for %lld ms (POST written -> subscriber read), "
         "median of the runs; counts are totals over the runs\n\n"
         "| backend | subscriber | sent/s | received / sent | lost | late (> %lld ms) | p50 ms | "
         "p99 ms | max ms | POST answered p50 / p99 ms |\n| --- | --- | ---: | ---: | ---: | ---: "
         "| ---: | ---: | ---: | ---: |\n",
         o->rate, o->latency_ms, o->late_ms);
  for (size_t i = 0; i < o->nbackends; i++) {
    int bk = o->backend[i];
    for (int path = 0; path < PATHS; path++) {
      lat_t l;
      if (path == PATH_CROSS && !is_pg(bk)) {
        printf("| %s | cross node | - | - | - | - | - | - | - | - (one node per SQLite file) |\n",
               bk_name[bk]);
        continue;
      }
      if (!lat_median(x, bk, path, &l)) continue;
      if (!l.received)
        printf("| %s | %s | %.0f | 0 / %llu | %llu | - | none delivered | - | - | %.2f / %.2f |\n",
               bk_name[bk], path_name[path], l.send_rate, (unsigned long long)l.sent,
               (unsigned long long)l.lost, l.ack_p50_ms, l.ack_p99_ms);
      else
        printf(
            "| %s | %s | %.0f | %llu / %llu | %llu | %llu | %.2f | %.2f | %.2f | %.2f / %.2f |\n",
            bk_name[bk], path_name[path], l.send_rate, (unsigned long long)l.received,
            (unsigned long long)l.sent, (unsigned long long)l.lost, (unsigned long long)l.late,
            l.p50_ms, l.p99_ms, l.max_ms, l.ack_p50_ms, l.ack_p99_ms);
    }
  }
  fflush(stdout);
}

/* The PostgreSQL figures of an appends cell into `j` (nothing on SQLite). */
static void tput_pg_json(json_t *j, const tput_t *c) {
  if (!c->ninst) return;
  json_t *rates = json_array(), *cores = json_array();
  for (int i = 0; i < c->ninst; i++) {
    json_array_append_new(rates, json_real(c->inst_rate[i]));
    json_array_append_new(cores, json_real(c->cpu_inst[i]));
  }
  json_object_set_new(j, "appendsPerSecondByInstance", rates);
  json_object_set_new(j, "cpuCores",
                      json_pack("{s:f, s:o, s:f, s:f, s:f, s:f}", "postgres", c->cpu_pg,
                                "postgresByInstance", cores, "nodes", c->cpu_node, "bench",
                                c->cpu_bench, "redis", c->cpu_redis, "machineBusy",
                                c->cpu_machine));
  json_object_set_new(
      j, "cpuMsPerAppend",
      json_pack("{s:f, s:f}", "postgres", c->pg_ms_per_append, "node", c->node_ms_per_append));
}

static json_t *tput_json(const tput_t *c) {
  json_t *j = json_pack("{s:f, s:f, s:f, s:I, s:I, s:I, s:I}", "appendsPerSecond", c->rate, "p50Ms",
                        c->p50_ms, "p99Ms", c->p99_ms, "answeredInWindow", (json_int_t)c->answered,
                        "verified", (json_int_t)c->verified, "refused503", (json_int_t)c->refused,
                        "acknowledgedByRetry200", (json_int_t)c->retry_200);
  tput_pg_json(j, c);
  return j;
}

static json_t *lat_json(const lat_t *c) {
  return json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "sent",
                   (json_int_t)c->sent, "received", (json_int_t)c->received, "lost",
                   (json_int_t)c->lost, "late", (json_int_t)c->late, "refused503",
                   (json_int_t)c->refused, "p50Ms", c->p50_ms, "p99Ms", c->p99_ms, "maxMs",
                   c->max_ms, "postP50Ms", c->ack_p50_ms, "postP99Ms", c->ack_p99_ms, "sendRate",
                   c->send_rate, "writeLagMaxMs", c->lag_max_ms);
}

static int write_json(const ctx_t *x, int argc, char **argv) {
  const options_t *o = x->o;
  json_t *root = json_object(), *cmd = json_array(), *runs = json_array(), *med = json_array();
  json_array_append_new(cmd, json_string("converger"));
  json_array_append_new(cmd, json_string("bench"));
  json_array_append_new(cmd, json_string("store"));
  for (int i = 0; i < argc; i++) json_array_append_new(cmd, json_string(argv[i]));
  json_object_set_new(root, "command", cmd);
  json_object_set_new(root, "shards", json_integer(x->nshards));
  json_object_set_new(root, "options",
                      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "durationMs",
                                (json_int_t)o->duration_ms, "warmupMs", (json_int_t)o->warmup_ms,
                                "rate", (json_int_t)o->rate, "latencyMs", (json_int_t)o->latency_ms,
                                "latencyConns", (json_int_t)o->latency_conns, "waitMs",
                                (json_int_t)o->wait_ms, "lateMs", (json_int_t)o->late_ms, "runs",
                                (json_int_t)o->runs, "pool", (json_int_t)o->pool));
  for (size_t i = 0; i < o->nbackends; i++) {
    int bk = o->backend[i];
    for (size_t si = 0; si < o->nsenders; si++)
      for (int m = 0; m < CONV_MODES; m++) {
        tput_t mc;
        for (int r = 0; r < o->runs; r++) {
          const tput_t *c = &x->res->tput[r][bk][si][m];
          if (!c->have) continue;
          json_t *j = tput_json(c);
          json_object_set_new(j, "figure", json_string("appends"));
          json_object_set_new(j, "run", json_integer(r + 1));
          json_object_set_new(j, "backend", json_string(bk_name[bk]));
          json_object_set_new(j, "senders", json_integer(o->senders[si]));
          json_object_set_new(j, "conversations", json_string(conv_name[m]));
          json_array_append_new(runs, j);
        }
        int n = tput_median(x, bk, si, m, &mc);
        if (!n) continue;
        json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:i, s:f, s:f, s:f, s:I}", "figure", "appends",
                              "backend", bk_name[bk], "senders", o->senders[si], "conversations",
                              conv_name[m], "runs", n, "appendsPerSecond", mc.rate, "p50Ms",
                              mc.p50_ms, "p99Ms", mc.p99_ms, "refused503", (json_int_t)mc.refused);
        tput_pg_json(j, &mc);
        json_array_append_new(med, j);
      }
    for (int path = 0; path < PATHS; path++) {
      lat_t l;
      for (int r = 0; r < o->runs; r++) {
        const lat_t *c = &x->res->lat[r][bk][path];
        if (!c->have) continue;
        json_t *j = lat_json(c);
        json_object_set_new(j, "figure", json_string("latency"));
        json_object_set_new(j, "run", json_integer(r + 1));
        json_object_set_new(j, "backend", json_string(bk_name[bk]));
        json_object_set_new(j, "subscriber", json_string(path_name[path]));
        json_array_append_new(runs, j);
      }
      int n = lat_median(x, bk, path, &l);
      if (!n) continue;
      json_t *j = lat_json(&l);
      json_object_set_new(j, "figure", json_string("latency"));
      json_object_set_new(j, "backend", json_string(bk_name[bk]));
      json_object_set_new(j, "subscriber", json_string(path_name[path]));
      json_object_set_new(j, "runs", json_integer(n));
      json_array_append_new(med, j);
    }
    if (is_pg(bk) && x->res->pg_settings[bk][0])
      json_object_set_new(root, bk == BK_POSTGRES ? "postgresSettings" : "postgresFsyncSettings",
                          json_string(x->res->pg_settings[bk]));
  }
  json_object_set_new(root, "runs", runs);
  json_object_set_new(root, "medians", med);
  int r = json_dump_file(root, o->out, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(root);
  if (r != 0) fprintf(stderr, CMD ": cannot write %s\n", o->out);
  return r;
}

/* ---- main ----------------------------------------------------------------------- */

int bench_store_main(int argc, char **argv) {
  options_t o = {.duration_ms = 3000,
                 .warmup_ms = 500,
                 .rate = 1000,
                 .latency_ms = 3000,
                 .wait_ms = 3000,
                 .late_ms = 1000,
                 .runs = 3,
                 .pool = 20,
                 .spread = 1000,
                 .timeout_s = 60,
                 .latency_conns = 32,
                 .pg_tmp = CONVERGER_PG_TMP_DEFAULT};
  int r = parse_options(&o, argc, argv);
  if (r != 0) return r > 0 ? 0 : 2;
  int want_pg = 0;
  for (size_t i = 0; i < o.nbackends; i++) want_pg |= is_pg(o.backend[i]);

  ctx_t x = {.o = &o, .pg_durable = -1};
  x.res = calloc(1, sizeof *x.res);
  x.b = calloc(1, sizeof *x.b);
  x.list_buf = malloc(LIST_BUF);
  if (!x.res || !x.b || !x.list_buf) {
    fprintf(stderr, CMD ": out of memory\n");
    free(x.res);
    free(x.b);
    free(x.list_buf);
    return 1;
  }
  bench_t *b = x.b;
  b->timeout_s = (int)o.timeout_s;
  b->node_cpu = -1;
  b->phase = "setup";

  run_signals_t signals;
  run_signals_catch(&signals);
  run_interrupted = 0;
  jitter_seed_random(&b->rng);

  int status = 1;
  if (uv_loop_init(&b->loop) != 0) {
    run_fail(b, "uv_loop_init failed");
    goto out;
  }
  b->loop_ready = 1;
  uv_timer_init(&b->loop, &b->watch);
  if (o.shards) {
    if (shards_start(&x) != 0) goto out;
    printf(CMD
           ": PostgreSQL sharded over %d instances (throwaway clusters of scripts/pg-tmp, "
           "durable: fsync, synchronous_commit and full_page_writes on), control database on "
           "instance 0, %d logical shards; bus: redis-server on 127.0.0.1:%d (no persistence)\n",
           x.nshards, SHARD_COUNT, x.sh.redis_port[0]);
  } else if (want_pg) {
    if (o.pg_url)
      snprintf(x.pg_url, sizeof x.pg_url, "%s", o.pg_url);
    else if (pg_start(&x) != 0)
      goto out;
    char redacted[STORE_URL_MAX];
    dburl_redact(x.pg_url, redacted, sizeof redacted);
    printf(CMD ": PostgreSQL at %s%s\n", redacted,
           o.pg_url ? " (--pg-url)" : " (a throwaway cluster of scripts/pg-tmp)");
  }
  printf(CMD ": %lld run%s; appends: senders", o.runs, o.runs == 1 ? "" : "s");
  for (size_t i = 0; i < o.nsenders; i++) printf("%s%d", i ? "," : " ", o.senders[i]);
  printf(", %lld ms after %lld ms of warm-up; spread: over %lld conversations; latency: "
         "%lld/s for %lld ms over %lld connections; pool %lld; nodes not pinned to CPUs\n",
         o.duration_ms, o.warmup_ms, o.spread, o.rate, o.latency_ms, o.latency_conns, o.pool);
  fflush(stdout);
  for (int run = 0; run < o.runs && !b->failed; run++)
    for (size_t i = 0; i < o.nbackends && !b->failed; i++) {
      x.run = run;
      x.bk = o.backend[(i + (size_t)run) % o.nbackends]; /* the order rotates */
      if (backend_run(&x) != 0) goto out;
    }
  status = x.bad ? 1 : 0;
out:
  if (b->failed) fprintf(stderr, CMD ": FAILED: %s\n", b->err);
  print_tables(&x);
  if (o.out && write_json(&x, argc, argv) != 0) status = 1;
  if (x.bad && !b->failed)
    fprintf(stderr, CMD ": FAILED: messages were lost or out of order (see above)\n");
  if (b->loop_ready) {
    uv_close((uv_handle_t *)&b->watch, NULL);
    for (int i = 0; i < 8 && uv_loop_alive(&b->loop); i++) uv_run(&b->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&b->loop) != 0) fprintf(stderr, CMD ": the loop closed with open handles\n");
  }
  bnode_stop(b); /* no-ops unless a failure left them */
  bnode_remove_dir(b);
  pg_stop(&x);
  shards_stop(&x);
  run_signals_restore(&signals);
  free(b->token);
  free(b);
  free(x.res);
  free(x.list_buf);
  return status;
}
