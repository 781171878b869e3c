/*
 * presence.c: `converger bench presence`, what presence and signals cost
 * (issue 18; docs/benchmarks/presence/):
 *
 *   1. memory: the heap a node's presence table (proto/presence.h) holds
 *      for --clients clients in --convs conversations, each client its own
 *      user, and again with --per-user clients per user, measured with
 *      mallinfo2 before and after (the ids are the lengths real ones have:
 *      a UUID client id, a 12-byte user, a 20-byte conversation); and the
 *      table's add, remove and grace-expiry times per client;
 *   2. signals next to appends, on PostgreSQL (a throwaway cluster of
 *      scripts/pg-tmp unless --pg-url) through one node: --senders
 *      closed-loop REST senders each to a conversation of its own, POST
 *      .../messages (one append transaction with its NOTIFY each) against
 *      POST .../signals (one NOTIFY outside any transaction), alternating
 *      round by round (--rounds), so both see the same machine; per kind
 *      the median of the rounds' rates and of their per-request p50 and
 *      p99.
 *
 * Output: a line per measurement and a summary; --out FILE writes the
 * figures as JSON. Exit status: 0 when everything was measured, 1 when a
 * phase failed, 2 on bad usage. Main thread only.
 */
#include "bench/bench.h"

#include <jansson.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/appender.h"
#include "bench/node.h"
#include "bench/pgtmp.h"
#include "bench/restc.h"
#include "bench/run.h"
#include "cli/args.h"
#include "common/util.h"
#include "core/dburl.h"
#include "proto/presence.h"
#include "stats/rank.h"

#define CMD        "converger bench presence"
#define MAX_ROUNDS 21

#ifndef CONVERGER_PG_TMP_DEFAULT
#define CONVERGER_PG_TMP_DEFAULT "scripts/pg-tmp"
#endif

typedef struct {
  long long clients, convs, per_user, senders, rounds, warmup_ms, duration_ms, pool, timeout_s;
  const char *pg_url, *pg_tmp, *out;
} options_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: " CMD " [options]\n\n"
          "What presence and signals cost: the presence table's memory per entry and its\n"
          "add/remove/expire times, and REST signals against REST appends on PostgreSQL\n"
          "through one node, side by side (docs/benchmarks/presence/).\n\n"
          "  --clients N      clients in the presence table [100000]\n"
          "  --convs N        conversations they are spread over [1000]\n"
          "  --per-user N     clients per user in the second measurement [10]\n"
          "  --senders N      closed-loop REST senders, a conversation each [8]\n"
          "  --rounds N       rounds of appends then signals (odd: a median) [5]\n"
          "  --warmup-ms N    before each round's window [500]\n"
          "  --duration-ms N  each round's window [2000]\n"
          "  --pool N         the node's CONVERGER_POOL_SIZE [20]\n"
          "  --pg-url URL     use this PostgreSQL instead of a throwaway one\n"
          "  --pg-tmp PATH    the script that starts one [%s]; with --fast:\n"
          "                   fsync, synchronous_commit off, NOT durable\n"
          "  --out FILE       the figures as JSON\n"
          "  --timeout S      bound on each phase, seconds [120]\n",
          CONVERGER_PG_TMP_DEFAULT);
}

/* ---- 1. memory and times of the table -------------------------------------------- */

static size_t heap_used(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

typedef struct {
  double bytes_per_client; /* heap / clients */
  size_t entries;          /* clients + users */
  double bytes_per_entry;
  double add_ns, remove_ns, expire_ns; /* per client */
} mem_t;

static void count_leave(void *ud, const char *conv, const char *user, const char *client,
                        int last) {
  (void)conv;
  (void)user;
  (void)client;
  (void)last;
  (*(size_t *)ud)++;
}

/* Fill a table with `clients` clients over `convs` conversations,
 * `per_user` clients of a conversation per user; measure; empty it
 * through the grace. The ids are made before, so neither the heap figure
 * nor the times count them. 0 or -1 (out of memory, or the table did not
 * empty). */
static int measure_table(long long clients, long long convs, long long per_user, mem_t *m) {
  enum { CONV = 40, USER = 32, CLIENT = 40 };
  char *ids = malloc((size_t)clients * (CONV + USER + CLIENT));
  if (!ids) return -1;
  for (long long i = 0; i < clients; i++) {
    char *id = ids + (size_t)i * (CONV + USER + CLIENT);
    long long j = i / convs; /* the client's place in its conversation */
    snprintf(id, CONV, "conversation-%07lld", i % convs);
    snprintf(id + CONV, USER, "user-%07lld", j / per_user);
    snprintf(id + CONV + USER, CLIENT, "%08llx-0000-4000-8000-%012llx",
             (unsigned long long)i & 0xffffffffu,
             ((unsigned long long)i * 2654435761ull) & 0xffffffffffffull);
  }
#define ID(i, k) (ids + (size_t)(i) * (CONV + USER + CLIENT) + (k))
  malloc_trim(0);
  size_t before = heap_used();
  presence_t *p = presence_new(1000);
  int ok = p != NULL;
  uint64_t t0 = uv_hrtime();
  for (long long i = 0; ok && i < clients; i++)
    ok = presence_add(p, ID(i, 0), ID(i, CONV), ID(i, CONV + USER), 1) >= 0;
  uint64_t t1 = uv_hrtime();
  size_t after = heap_used();
  if (ok) {
    m->entries = presence_entries(p);
    m->bytes_per_client = (double)(after - before) / (double)clients;
    m->bytes_per_entry = (double)(after - before) / (double)m->entries;
    for (long long i = 0; i < clients; i++)
      presence_remove(p, ID(i, 0), ID(i, CONV), ID(i, CONV + USER), 0);
  }
  uint64_t t2 = uv_hrtime();
  size_t left = 0;
  if (ok) presence_expire(p, 1000, count_leave, &left);
  uint64_t t3 = uv_hrtime();
#undef ID
  m->add_ns = (double)(t1 - t0) / (double)clients;
  m->remove_ns = (double)(t2 - t1) / (double)clients;
  m->expire_ns = (double)(t3 - t2) / (double)clients;
  ok = ok && left == (size_t)clients && presence_entries(p) == 0;
  presence_free(p);
  free(ids);
  return ok ? 0 : -1;
}

/* ---- 2. signals next to appends ------------------------------------------------- */

typedef struct {
  double rate[MAX_ROUNDS], p50[MAX_ROUNDS], p99[MAX_ROUNDS];
  int n;
} kind_t;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
  double s[MAX_ROUNDS];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n ? s[(n - 1) / 2] : 0;
}

static double pct_ms(const uint64_t *v, size_t n, double p) {
  return n ? (double)v[rank_nearest(p, n) - 1] / 1e6 : 0;
}

/* One round of `what` ("messages" or "signals"). */
static int round_of(bench_t *b, const options_t *o, const char *what, const char *const *convs,
                    kind_t *k) {
  appender_tput_t t = {0};
  appender_route(what);
  int r = appender_throughput(b, (size_t)o->senders, convs, (size_t)o->senders,
                              (uint64_t)o->warmup_ms, (uint64_t)o->duration_ms, &t);
  if (r == 0) {
    qsort(t.lat_ns, t.nlat, sizeof *t.lat_ns, run_cmp_u64);
    k->rate[k->n] = (double)t.answered / t.window_s;
    k->p50[k->n] = pct_ms(t.lat_ns, t.nlat, 0.50);
    k->p99[k->n] = pct_ms(t.lat_ns, t.nlat, 0.99);
    printf("round %d, %s: %.0f/s (%llu in %.3f s), per request p50 %.2f ms, p99 %.2f ms%s\n",
           k->n + 1, strcmp(what, "signals") == 0 ? "signals" : "appends", k->rate[k->n],
           (unsigned long long)t.answered, t.window_s, k->p50[k->n], k->p99[k->n],
           t.refused ? " (some 503s, retried)" : "");
    fflush(stdout);
    k->n++;
  }
  appender_tput_free(&t);
  appender_route("messages");
  return r;
}

int bench_presence_main(int argc, char **argv) {
  options_t o = {.clients = 100000,
                 .convs = 1000,
                 .per_user = 10,
                 .senders = 8,
                 .rounds = 5,
                 .warmup_ms = 500,
                 .duration_ms = 2000,
                 .pool = 20,
                 .timeout_s = 120,
                 .pg_tmp = CONVERGER_PG_TMP_DEFAULT};
  for (int i = 0; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
  static const char *const names[] = {"--pg-url", "--pg-tmp", "--out"};
  const char **const dest[] = {&o.pg_url, &o.pg_tmp, &o.out};
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  if (!rest) return 1;
  if (run_split_string_options(CMD, argc, argv, names, dest, CV_ARRAY_SIZE(names), rest, &nrest) !=
      0) {
    free(rest);
    return 2;
  }
  const run_int_opt_t opts[] = {
      {"clients", &o.clients, 1, 10000000},         {"convs", &o.convs, 1, 1000000},
      {"per-user", &o.per_user, 1, 1000000},        {"senders", &o.senders, 1, 256},
      {"rounds", &o.rounds, 1, MAX_ROUNDS},         {"warmup-ms", &o.warmup_ms, 0, 600000},
      {"duration-ms", &o.duration_ms, 100, 600000}, {"pool", &o.pool, 1, 512},
      {"timeout", &o.timeout_s, 10, 86400},
  };
  int r = run_parse_int_options(CMD, nrest, rest, opts, CV_ARRAY_SIZE(opts), usage);
  free(rest);
  if (r != 0) return r > 0 ? 0 : 2;

  mem_t own = {0}, shared = {0};
  printf(CMD ": the presence table with %lld clients in %lld conversations\n", o.clients, o.convs);
  if (measure_table(o.clients, o.convs, 1, &own) != 0 ||
      measure_table(o.clients, o.convs, o.per_user, &shared) != 0) {
    fprintf(stderr, CMD ": the table could not be filled and emptied\n");
    return 1;
  }
  printf("a user per client: %zu entries, %.0f bytes per client (%.0f per entry); add %.0f ns, "
         "remove %.0f ns, expire %.0f ns per client\n",
         own.entries, own.bytes_per_client, own.bytes_per_entry, own.add_ns, own.remove_ns,
         own.expire_ns);
  printf("%lld clients per user: %zu entries, %.0f bytes per client (%.0f per entry); add %.0f "
         "ns, remove %.0f ns, expire %.0f ns per client\n",
         o.per_user, shared.entries, shared.bytes_per_client, shared.bytes_per_entry, shared.add_ns,
         shared.remove_ns, shared.expire_ns);
  fflush(stdout);

  bench_t *b = calloc(1, sizeof *b);
  char pg_dir[4096] = "", pg_url[STORE_URL_MAX] = "";
  char **convs = calloc((size_t)o.senders, sizeof *convs);
  kind_t appends = {0}, signals = {0};
  int status = 1, started_pg = 0;
  if (!b || !convs) goto out;
  b->timeout_s = (int)o.timeout_s;
  b->node_cpu = -1; /* the node, PostgreSQL and the bench share the machine */
  b->phase = "setup";
  run_signals_t sig;
  run_signals_catch(&sig);
  run_interrupted = 0;
  jitter_seed_random(&b->rng);
  if (uv_loop_init(&b->loop) != 0) goto out_signals;
  b->loop_ready = 1;
  uv_timer_init(&b->loop, &b->watch);
  if (o.pg_url) {
    snprintf(pg_url, sizeof pg_url, "%s", o.pg_url);
  } else if (pgtmp_start(CMD, o.pg_tmp, 1, pg_dir, sizeof pg_dir, pg_url, sizeof pg_url) != 0) {
    /* (fast, not durable, as the published figures ran:
     * docs/benchmarks/presence/; appends against signals, not crashes) */
    goto out_signals;
  } else {
    started_pg = 1;
  }
  char db[STORE_URL_MAX + 32], pool[48];
  snprintf(db, sizeof db, "CONVERGER_DATABASE_URL=%s", pg_url);
  snprintf(pool, sizeof pool, "CONVERGER_POOL_SIZE=%lld", o.pool);
  const char *env[] = {db, pool, "CONVERGER_NODE_ID=bench-presence", NULL};
  if (bnode_start_env(b, env) != 0 || bnode_wait_ready(b) != 0) goto out_signals;
  char tag[32], body[256];
  snprintf(tag, sizeof tag, "pres%d", (int)getpid());
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"name\":\"%s\",\"signals\":true}", tag, tag);
  if (restc_expect(b, "POST", "/v1/channels", body, NULL, 201, NULL, 0) != 0) goto out_signals;
  printf(CMD ": %lld senders, %lld rounds of %lld ms (after %lld ms of warm-up) of appends then "
             "signals, on PostgreSQL through one node (pool %lld)\n",
         o.senders, o.rounds, o.duration_ms, o.warmup_ms, o.pool);
  for (long long k = 0; k < o.rounds && !b->failed; k++) {
    /* new conversations each round: the appends' idempotency keys start
     * again at every call */
    for (long long i = 0; i < o.senders; i++) {
      free(convs[i]);
      if (!(convs[i] = run_str_printf("%s-r%lld-c%lld", tag, k, i))) goto out_signals;
      snprintf(body, sizeof body, "{\"id\":\"%s\",\"channel\":\"%s\"}", convs[i], tag);
      if (restc_expect(b, "POST", "/v1/conversations", body, NULL, 201, NULL, 0) != 0)
        goto out_signals;
    }
    if (round_of(b, &o, "messages", (const char *const *)convs, &appends) != 0 ||
        round_of(b, &o, "signals", (const char *const *)convs, &signals) != 0)
      goto out_signals;
  }
  double ra = median(appends.rate, appends.n), rs = median(signals.rate, signals.n);
  printf("median of %d rounds: appends %.0f/s (p50 %.2f ms, p99 %.2f ms), signals %.0f/s (p50 "
         "%.2f ms, p99 %.2f ms): signals/appends %.2fx\n",
         appends.n, ra, median(appends.p50, appends.n), median(appends.p99, appends.n), rs,
         median(signals.p50, signals.n), median(signals.p99, signals.n), ra > 0 ? rs / ra : 0);
  if (o.out) {
    json_t *j = json_pack(
        "{s:{s:I, s:I, s:I, s:{s:I, s:f, s:f, s:f, s:f, s:f}, s:{s:I, s:f, s:f, s:f, s:f, s:f}},"
        " s:{s:I, s:I, s:I, s:{s:f, s:f, s:f}, s:{s:f, s:f, s:f}, s:f}}",
        "table", "clients", (json_int_t)o.clients, "convs", (json_int_t)o.convs, "per_user",
        (json_int_t)o.per_user, "user_per_client", "entries", (json_int_t)own.entries,
        "bytes_per_client", own.bytes_per_client, "bytes_per_entry", own.bytes_per_entry, "add_ns",
        own.add_ns, "remove_ns", own.remove_ns, "expire_ns", own.expire_ns, "clients_per_user",
        "entries", (json_int_t)shared.entries, "bytes_per_client", shared.bytes_per_client,
        "bytes_per_entry", shared.bytes_per_entry, "add_ns", shared.add_ns, "remove_ns",
        shared.remove_ns, "expire_ns", shared.expire_ns, "signals_vs_appends", "senders",
        (json_int_t)o.senders, "rounds", (json_int_t)appends.n, "duration_ms",
        (json_int_t)o.duration_ms, "appends", "per_s", ra, "p50_ms", median(appends.p50, appends.n),
        "p99_ms", median(appends.p99, appends.n), "signals", "per_s", rs, "p50_ms",
        median(signals.p50, signals.n), "p99_ms", median(signals.p99, signals.n), "ratio",
        ra > 0 ? rs / ra : 0);
    if (!j || json_dump_file(j, o.out, JSON_INDENT(2)) != 0) {
      fprintf(stderr, CMD ": cannot write %s\n", o.out);
      json_decref(j);
      goto out_signals;
    }
    json_decref(j);
  }
  status = 0;
out_signals:
  if (b && b->failed) fprintf(stderr, CMD ": FAILED: %s\n", b->err);
  if (b && b->loop_ready) {
    uv_close((uv_handle_t *)&b->watch, NULL);
    for (int i = 0; i < 8 && uv_loop_alive(&b->loop); i++) uv_run(&b->loop, UV_RUN_DEFAULT);
    uv_loop_close(&b->loop);
  }
  if (b) {
    bnode_stop(b);
    bnode_remove_dir(b);
  }
  if (started_pg) pgtmp_stop(CMD, o.pg_tmp, pg_dir);
  run_signals_restore(&sig);
out:
  for (long long i = 0; convs && i < o.senders; i++) free(convs[i]);
  free(convs);
  if (b) free(b->token);
  free(b);
  return status;
}
