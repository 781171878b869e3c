/*
 * sdk_swarm.c: N libconverger-client clients of one conversation (or of
 * several, one each) on one libuv loop, driven by a test over stdin/stdout
 * (tests/integration/test_drain_pg.py, test_sharded_chaos.py). Built by
 * CMake, never installed; it uses the public header and the shared client
 * library only, as an application does.
 *
 * Every client gets the same URL list (--url, one node only when a drain's
 * reconnectTo is what should take the clients elsewhere), the same token
 * and one subscription with watermark 0: client i to the (i mod K)-th of
 * the K --conv given. The whole history is replayed first, so a client
 * must deliver 1, 2, 3, ... with nothing left out whatever the
 * conversation held when it started.
 *
 * Per client it checks what on_message delivers: the conversation, and a
 * seq that is exactly the previous one + 1 (anything else counts as a gap,
 * or as a duplicate when at or below the previous one). The message id of
 * every seq of every conversation is kept once for all clients; a client
 * delivering another id for the same seq counts as a mismatch.
 *
 * Offline time: cvg_stats_t.offline_ms counts from cvg_client_start, so it
 * includes the first connect. The swarm reads it when a client is welcomed
 * the first time and reports offline_ms minus that: the time without a
 * welcomed connection after the first welcome (0 for a client that moved
 * make-before-break).
 *
 * Protocol (lines):
 *   out "ready N"     every client has been welcomed once
 *   in  "head H"      (one --conv) wait until every client delivered seq H
 *                     (at most --head-timeout s), then
 *   in  "head CONV H" (any number of --conv) the head of CONV: once every
 *                     conversation has one, wait as "head H" does until
 *                     every client delivered its conversation's head, then
 *   out {...}         one JSON line of results (see print_result), after
 *                     which every client is closed and the program exits:
 *                     0 when it got there, 1 on a timeout (the JSON line is
 *                     still printed, with "ok": false) or any failure.
 * stdin ending before every head is known is a failure. Progress and anomalies
 * (a client losing its connection, an error frame) go to stderr.
 */
#include <converger/client.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#define MAX_URLS       16
#define MAX_CONVS      1024
#define LINE_MAX_BYTES 256
#define CLOSE_WAIT_MS  15000
#define FDS_PER_CLIENT 2 /* the welcomed connection and a migration's */
#define FDS_SPARE      64

typedef struct {
  const char *id;
  int64_t head; /* its "head" line's H; -1 before it */
  char **ids;   /* ids[seq]: the message id of seq (first delivery seen) */
  int64_t ids_cap;
} sconv_t;

typedef struct {
  int idx;
  sconv_t *conv; /* its subscription's */
  cvg_client_t *c;
  int64_t last;        /* last seq delivered (0: none) */
  uint64_t delivered;  /* on_message calls */
  uint64_t gaps, dups; /* deliveries that were not last + 1 */
  uint64_t wrong_conv, id_mismatch;
  uint64_t error_frames; /* on_error calls */
  uint64_t losses; /* left CONNECTED/MIGRATING for CONNECTING/WAITING after the first welcome */
  int64_t migrate_start; /* loop time its last drain migration began opening; -1: none */
  int64_t migrate_ms;    /* longest migration, from opening to the new welcome */
  int welcomed;          /* welcomed at least once */
  int failed;            /* reached CVG_STATE_FAILED */
  int closed;            /* its close completed */
  int64_t offline_base;  /* offline_ms at the first welcome (the first connect) */
  cvg_state_t state;
  char first_node[64];
  char last_error[64];
  cvg_stats_t final; /* taken before closing */
} sclient_t;

static struct {
  const char *urls[MAX_URLS];
  size_t nurls;
  sconv_t convs[MAX_CONVS];
  size_t nconvs;
  const char *token;
  long clients, ready_timeout_s, head_timeout_s;
  int verbose;
} opt = {.clients = 500, .ready_timeout_s = 30, .head_timeout_s = 30};

static uv_loop_t *loop;
static sclient_t *cl;
static long nwelcomed, nclosed, nreached;
static int ready_printed, finishing, exit_code;
static int heads_known; /* every conversation's head is known */
static size_t nheads;   /* conversations whose head is known */
static uv_pipe_t in_pipe;
static uv_tty_t in_tty;
static uv_stream_t *in_stream;
static char line[LINE_MAX_BYTES];
static size_t line_len;
static uv_timer_t deadline_timer, finish_timer, close_timer;
static char fail_reason[256];

static void usage(FILE *out) {
  fprintf(out,
          "usage: sdk_swarm --url WS_URL [--url WS_URL ...] --conv ID [--conv ID ...]\n"
          "                 --token JWT [options]\n\n"
          "Runs N libconverger-client clients on one libuv loop, client i subscribed to\n"
          "the (i mod K)-th of the K conversations given, each with the URL list, the\n"
          "token, and watermark 0 (the whole history is replayed). It checks that every\n"
          "client delivers seq 1, 2, 3, ... of its conversation once each,\n"
          "and measures each client's time without a welcomed connection after its\n"
          "first welcome (cvg_stats_t.offline_ms minus the first connect).\n\n"
          "stdout/stdin protocol (lines):\n"
          "  prints \"ready N\" once every client has been welcomed;\n"
          "  reads  \"head H\" (one conversation) or \"head ID H\" for each of them:\n"
          "         waits until every client delivered its conversation's head, then\n"
          "         prints one JSON line of results, closes the clients and exits.\n"
          "Exit status: 0 done, 1 a failure or a timeout (the JSON line says which),\n"
          "2 bad usage.\n\n"
          "  --url URL          a ws:// URL of a node (repeatable, up to %d)\n"
          "  --conv ID          a conversation (repeatable, up to %d)\n"
          "  --token JWT        the token of every client (its convs must cover every ID)\n"
          "  --clients N        clients [500]\n"
          "  --ready-timeout S  at most S seconds until every client is welcomed [30]\n"
          "  --head-timeout S   at most S seconds from \"head H\" until every client has\n"
          "                     delivered H [30]\n"
          "  --verbose          every state change of every client to stderr\n"
          "  --help             this text\n",
          MAX_URLS, MAX_CONVS);
}

static int parse_long(const char *name, const char *v, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || errno || *end || end == v || x < lo || x > hi) {
    fprintf(stderr, "sdk_swarm: --%s wants an integer in [%ld, %ld]\n", name, lo, hi);
    return -1;
  }
  *out = x;
  return 0;
}

/* 0, 1 after --help, -1 on bad usage (message printed). */
static int parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 1;
    }
    if (strcmp(a, "--verbose") == 0) {
      opt.verbose = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "sdk_swarm: %s: unknown option or missing value (--help)\n", a);
      return -1;
    }
    i++;
    if (strcmp(a, "--url") == 0) {
      if (opt.nurls == MAX_URLS) {
        fprintf(stderr, "sdk_swarm: at most %d --url\n", MAX_URLS);
        return -1;
      }
      opt.urls[opt.nurls++] = v;
    } else if (strcmp(a, "--conv") == 0) {
      if (opt.nconvs == MAX_CONVS) {
        fprintf(stderr, "sdk_swarm: at most %d --conv\n", MAX_CONVS);
        return -1;
      }
      for (size_t k = 0; k < opt.nconvs; k++)
        if (strcmp(opt.convs[k].id, v) == 0) {
          fprintf(stderr, "sdk_swarm: --conv %s given twice\n", v);
          return -1;
        }
      opt.convs[opt.nconvs++] = (sconv_t){.id = v, .head = -1};
    } else if (strcmp(a, "--token") == 0) {
      opt.token = v;
    } else if (strcmp(a, "--clients") == 0) {
      if (parse_long("clients", v, 1, 100000, &opt.clients)) return -1;
    } else if (strcmp(a, "--ready-timeout") == 0) {
      if (parse_long("ready-timeout", v, 1, 3600, &opt.ready_timeout_s)) return -1;
    } else if (strcmp(a, "--head-timeout") == 0) {
      if (parse_long("head-timeout", v, 1, 3600, &opt.head_timeout_s)) return -1;
    } else {
      fprintf(stderr, "sdk_swarm: %s: unknown option (--help)\n", a);
      return -1;
    }
  }
  if (opt.nurls == 0 || opt.nconvs == 0 || !opt.token) {
    fprintf(stderr, "sdk_swarm: --url, --conv and --token are required (--help)\n");
    return -1;
  }
  return 0;
}

/* ---- results ---------------------------------------------------------------------- */

static void take_stats(void) {
  for (long i = 0; i < opt.clients; i++)
    if (cl[i].c) cvg_client_stats(cl[i].c, &cl[i].final);
}

static int64_t offline_after_welcome(const sclient_t *s) {
  return s->welcomed ? s->final.offline_ms - s->offline_base : -1;
}

/* One JSON line on stdout:
 *   ok, error                 done, or why not (a timeout, bad input)
 *   clients, welcomed, head   N, clients welcomed at least once, H of the one
 *                             conversation (-1: none yet, or several --conv)
 *   min_last, max_last        lowest and highest last seq delivered
 *   reached_head              clients that delivered H
 *   gap_clients, dup_clients  clients that delivered a seq other than last + 1
 *                             (beyond it / at or below it): must be 0
 *   id_mismatches, wrong_conv deliveries with another id for a seq than another
 *                             client saw, or of another conversation
 *   failed_clients, error_frames, lost_clients (left a welcomed connection for
 *                             no welcomed one: the SDK's CONNECTING/WAITING)
 *   offline_ms_max, _sum, offline_nonzero_clients: offline_ms after the first
 *                             welcome (see the top of the file)
 *   migrations_min/_max, migrate_ms_max (longest drain migration, from
 *                             opening the new connection to its welcome)
 *   sdk_duplicates, sdk_gaps, sdk_unavailable, sdk_bad_frames, welcomes: sums of
 *                             cvg_stats_t
 *   final_nodes               {node id: clients whose welcomed connection is there}
 *   ids                       the message id of seq 1 .. max_last (of the first
 *                             --conv)
 *   convs                     per conversation: [{conv, head, clients, reached_head,
 *                             min_last, max_last, ids (of seq 1 .. max_last)}]
 *   per_client                [{i, conv, last, offline_ms, first_connect_ms, migrations,
 *                             welcomes, attempts, gaps, dups, sdk_duplicates, losses,
 *                             first_node, node, state, errors, last_error,
 *                             migrate_ms}] */
static json_t *ids_json(const sconv_t *cv, int64_t upto) {
  json_t *a = json_array();
  for (int64_t q = 1; a && q <= upto; q++)
    json_array_append_new(a, q < cv->ids_cap && cv->ids[q] ? json_string(cv->ids[q]) : json_null());
  return a;
}

static json_t *convs_json(void) {
  json_t *a = json_array();
  for (size_t k = 0; a && k < opt.nconvs; k++) {
    sconv_t *cv = &opt.convs[k];
    int64_t lo = INT64_MAX, hi = 0;
    long n = 0, reached = 0;
    for (long i = 0; i < opt.clients; i++) {
      if (cl[i].conv != cv) continue;
      n++;
      if (cl[i].last < lo) lo = cl[i].last;
      if (cl[i].last > hi) hi = cl[i].last;
      reached += cv->head >= 0 && cl[i].last >= cv->head;
    }
    json_array_append_new(a,
                          json_pack("{s:s, s:I, s:i, s:i, s:I, s:I, s:o}", "conv", cv->id, "head",
                                    (json_int_t)cv->head, "clients", (int)n, "reached_head",
                                    (int)reached, "min_last", (json_int_t)(n ? lo : 0), "max_last",
                                    (json_int_t)hi, "ids", ids_json(cv, hi)));
  }
  return a;
}

static void print_result(int ok, const char *error) {
  take_stats();
  json_t *nodes = json_object(), *per = json_array();
  int64_t max_last0 = 0; /* the first conversation's, for "ids" */
  int64_t min_last = INT64_MAX, max_last = 0, off_max = 0, off_sum = 0, mig_ms_max = 0;
  uint64_t mig_min = UINT64_MAX, mig_max = 0;
  long gap_clients = 0, dup_clients = 0, failed = 0, off_nonzero = 0, reached = 0, lost = 0;
  uint64_t id_mismatch = 0, wrong_conv = 0, error_frames = 0, sdk_dups = 0, sdk_gaps = 0,
           unavailable = 0, bad_frames = 0, welcomes = 0;
  for (long i = 0; i < opt.clients; i++) {
    sclient_t *s = &cl[i];
    const cvg_stats_t *st = &s->final;
    int64_t off = offline_after_welcome(s);
    if (s->last < min_last) min_last = s->last;
    if (s->last > max_last) max_last = s->last;
    if (s->conv->head >= 0 && s->last >= s->conv->head) reached++;
    if (s->conv == &opt.convs[0] && s->last > max_last0) max_last0 = s->last;
    if (off > off_max) off_max = off;
    if (off > 0) {
      off_sum += off;
      off_nonzero++;
    }
    if (s->migrate_ms > mig_ms_max) mig_ms_max = s->migrate_ms;
    if (st->migrations < mig_min) mig_min = st->migrations;
    if (st->migrations > mig_max) mig_max = st->migrations;
    gap_clients += s->gaps > 0;
    dup_clients += s->dups > 0;
    failed += s->failed;
    lost += s->losses > 0;
    id_mismatch += s->id_mismatch;
    wrong_conv += s->wrong_conv;
    error_frames += s->error_frames;
    sdk_dups += st->duplicates;
    sdk_gaps += st->gaps;
    unavailable += st->unavailable;
    bad_frames += st->bad_frames;
    welcomes += st->welcomes;
    const char *node = st->node[0] ? st->node : "";
    json_t *cnt = json_object_get(nodes, node);
    json_object_set_new(nodes, node, json_integer(cnt ? json_integer_value(cnt) + 1 : 1));
    json_array_append_new(
        per,
        json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:s, "
                  "s:I, s:s, s:I}",
                  "i", (int)i, "conv", s->conv->id, "last", (json_int_t)s->last, "offline_ms",
                  (json_int_t)off, "first_connect_ms", (json_int_t)s->offline_base, "migrations",
                  (json_int_t)st->migrations, "welcomes", (json_int_t)st->welcomes, "attempts",
                  (json_int_t)st->attempts, "gaps", (json_int_t)s->gaps, "dups",
                  (json_int_t)s->dups, "sdk_duplicates", (json_int_t)st->duplicates, "losses",
                  (json_int_t)s->losses, "first_node", s->first_node, "node", node, "state",
                  cvg_state_name(st->state), "errors", (json_int_t)s->error_frames, "last_error",
                  s->last_error, "migrate_ms", (json_int_t)s->migrate_ms));
  }
  json_t *r = json_pack(
      "{s:b, s:s?, s:i, s:I, s:i, s:I, s:I, s:i, s:i, s:i, s:I, s:I, s:i, s:I, s:i, s:I, s:I, "
      "s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}",
      "ok", ok, "error", error, "clients", (int)opt.clients, "head",
      (json_int_t)(opt.nconvs == 1 ? opt.convs[0].head : -1), "welcomed", (int)nwelcomed,
      "min_last", (json_int_t)(opt.clients ? min_last : 0), "max_last", (json_int_t)max_last,
      "reached_head", (int)reached, "gap_clients", (int)gap_clients, "dup_clients",
      (int)dup_clients, "id_mismatches", (json_int_t)id_mismatch, "wrong_conv",
      (json_int_t)wrong_conv, "failed_clients", (int)failed, "error_frames",
      (json_int_t)error_frames, "lost_clients", (int)lost, "offline_ms_max", (json_int_t)off_max,
      "offline_ms_sum", (json_int_t)off_sum, "offline_nonzero_clients", (json_int_t)off_nonzero,
      "migrations_min", (json_int_t)(opt.clients ? mig_min : 0), "migrations_max",
      (json_int_t)mig_max, "sdk_duplicates", (json_int_t)sdk_dups, "sdk_gaps", (json_int_t)sdk_gaps,
      "final_nodes", nodes, "ids", ids_json(&opt.convs[0], max_last0), "per_client", per);
  if (!r) {
    fprintf(stderr, "sdk_swarm: cannot build the result (out of memory)\n");
    exit_code = 1;
    return;
  }
  json_object_set_new(r, "sdk_unavailable", json_integer((json_int_t)unavailable));
  json_object_set_new(r, "sdk_bad_frames", json_integer((json_int_t)bad_frames));
  json_object_set_new(r, "welcomes", json_integer((json_int_t)welcomes));
  json_object_set_new(r, "migrate_ms_max", json_integer((json_int_t)mig_ms_max));
  json_object_set_new(r, "convs", convs_json());
  char *text = json_dumps(r, JSON_COMPACT);
  json_decref(r);
  if (!text) {
    fprintf(stderr, "sdk_swarm: cannot print the result (out of memory)\n");
    exit_code = 1;
    return;
  }
  printf("%s\n", text);
  fflush(stdout);
  free(text);
}

/* ---- the end ---------------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) { (void)h; }

static void on_client_closed(void *ud) {
  sclient_t *s = ud;
  s->closed = 1;
  s->c = NULL;
  if (++nclosed == opt.clients && uv_is_active((uv_handle_t *)&close_timer)) {
    uv_timer_stop(&close_timer);
    uv_close((uv_handle_t *)&close_timer, on_handle_closed);
  }
}

static void on_close_timeout(uv_timer_t *t) {
  (void)t;
  fprintf(stderr, "sdk_swarm: %ld of %ld clients did not finish closing within %d ms\n",
          opt.clients - nclosed, opt.clients, CLOSE_WAIT_MS);
  fflush(stderr);
  _exit(1);
}

/* Print the result (when the head was asked for or `error` says why not),
 * close every client and every handle; the loop then ends. */
static void finish(int ok, const char *error) {
  if (finishing) return;
  finishing = 1;
  if (!ok) {
    exit_code = 1;
    fprintf(stderr, "sdk_swarm: %s\n", error);
    snprintf(fail_reason, sizeof fail_reason, "%s", error);
  }
  print_result(ok, ok ? NULL : fail_reason);
  uv_timer_stop(&deadline_timer);
  if (in_stream && !uv_is_closing((uv_handle_t *)in_stream)) {
    uv_read_stop(in_stream);
    uv_close((uv_handle_t *)in_stream, on_handle_closed);
  }
  uv_timer_start(&close_timer, on_close_timeout, CLOSE_WAIT_MS, 0);
  long to_close = 0;
  for (long i = 0; i < opt.clients; i++)
    if (cl[i].c) to_close++;
  nclosed = opt.clients - to_close;
  if (to_close == 0) {
    uv_timer_stop(&close_timer);
    uv_close((uv_handle_t *)&close_timer, on_handle_closed);
  }
  for (long i = 0; i < opt.clients; i++)
    if (cl[i].c) cvg_client_close(cl[i].c, on_client_closed, &cl[i]);
}

static int finish_ok;
static char finish_msg[256];

static void on_finish_timer(uv_timer_t *t) {
  uv_close((uv_handle_t *)t, on_handle_closed);
  finish(finish_ok, finish_msg);
}

/* finish() from outside the clients' callbacks: on the next loop turn. */
static void finish_later(int ok, const char *fmt, ...) {
  if (finishing || uv_is_active((uv_handle_t *)&finish_timer)) return;
  finish_ok = ok;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(finish_msg, sizeof finish_msg, fmt, ap);
  va_end(ap);
  uv_timer_start(&finish_timer, on_finish_timer, 0, 0);
}

static void on_deadline(uv_timer_t *t) {
  (void)t;
  if (!heads_known)
    finish(0, ready_printed ? "stdin said nothing in time"
                            : "not every client was welcomed within --ready-timeout");
  else {
    char why[200];
    snprintf(why, sizeof why, "%ld of %ld clients delivered their head within --head-timeout",
             nreached, opt.clients);
    finish(0, why);
  }
}

/* ---- client callbacks ------------------------------------------------------------- */

static void on_state(void *ud, cvg_state_t state, const char *detail) {
  sclient_t *s = ud;
  cvg_state_t prev = s->state;
  s->state = state;
  if (opt.verbose) fprintf(stderr, "client %d: %s: %s\n", s->idx, cvg_state_name(state), detail);
  if (state == CVG_STATE_FAILED) {
    s->failed = 1;
    fprintf(stderr, "sdk_swarm: client %d failed: %s\n", s->idx, detail);
    return;
  }
  if (state == CVG_STATE_CONNECTED && !s->welcomed) {
    cvg_stats_t st;
    cvg_client_stats(s->c, &st);
    s->welcomed = 1;
    s->offline_base = st.offline_ms;
    snprintf(s->first_node, sizeof s->first_node, "%s", st.node);
    if (++nwelcomed == opt.clients && !ready_printed) {
      ready_printed = 1;
      uv_timer_stop(&deadline_timer);
      printf("ready %ld\n", opt.clients);
      fflush(stdout);
    }
    return;
  }
  if (!s->welcomed || finishing) return;
  if (state == CVG_STATE_MIGRATING) s->migrate_start = (int64_t)uv_now(loop);
  if (state == CVG_STATE_CONNECTED && prev == CVG_STATE_MIGRATING && s->migrate_start >= 0 &&
      strncmp(detail, "migrated to", 11) == 0 &&
      (int64_t)uv_now(loop) - s->migrate_start > s->migrate_ms)
    s->migrate_ms = (int64_t)uv_now(loop) - s->migrate_start;
  if ((state == CVG_STATE_CONNECTING || state == CVG_STATE_WAITING) &&
      (prev == CVG_STATE_CONNECTED || prev == CVG_STATE_MIGRATING)) {
    s->losses++;
    fprintf(stderr, "sdk_swarm: client %d lost its welcomed connection (%s -> %s): %s\n", s->idx,
            cvg_state_name(prev), cvg_state_name(state), detail);
  } else if (state == CVG_STATE_CONNECTED && prev == CVG_STATE_CONNECTING && s->losses) {
    fprintf(stderr, "sdk_swarm: client %d welcomed again: %s\n", s->idx, detail);
  } else if (state == CVG_STATE_CONNECTED && prev == CVG_STATE_MIGRATING &&
             strncmp(detail, "migrated to", 11) != 0) {
    fprintf(stderr, "sdk_swarm: client %d: %s\n", s->idx, detail);
  }
}

static void on_error(void *ud, const char *code, const char *message, const char *conv) {
  sclient_t *s = ud;
  s->error_frames++;
  snprintf(s->last_error, sizeof s->last_error, "%s", code);
  fprintf(stderr, "sdk_swarm: client %d: error %s (%s)%s%s\n", s->idx, code, message,
          conv ? " conv " : "", conv ? conv : "");
}

static int remember_id(sconv_t *cv, int64_t seq, const char *id) {
  if (seq >= cv->ids_cap) {
    int64_t cap = cv->ids_cap ? cv->ids_cap : 1024;
    while (cap <= seq) cap *= 2;
    char **n = realloc(cv->ids, (size_t)cap * sizeof *n);
    if (!n) return -1;
    memset(n + cv->ids_cap, 0, (size_t)(cap - cv->ids_cap) * sizeof *n);
    cv->ids = n;
    cv->ids_cap = cap;
  }
  if (!cv->ids[seq]) {
    cv->ids[seq] = strdup(id);
    return cv->ids[seq] ? 0 : -1;
  }
  return strcmp(cv->ids[seq], id) == 0 ? 0 : 1;
}

static void on_message(void *ud, const cvg_message_t *m) {
  sclient_t *s = ud;
  s->delivered++;
  if (strcmp(m->conv, s->conv->id) != 0) {
    s->wrong_conv++;
    return;
  }
  int64_t prev = s->last;
  if (m->seq != prev + 1) {
    if (m->seq <= prev)
      s->dups++;
    else
      s->gaps++;
    fprintf(stderr, "sdk_swarm: client %d delivered seq %lld after %lld\n", s->idx,
            (long long)m->seq, (long long)prev);
  }
  if (m->seq > s->last) s->last = m->seq;
  int r = remember_id(s->conv, m->seq, m->id);
  if (r < 0) {
    finish_later(0, "out of memory");
    return;
  }
  if (r > 0) {
    s->id_mismatch++;
    fprintf(stderr, "sdk_swarm: client %d: seq %lld has id %s, another client had %s\n", s->idx,
            (long long)m->seq, m->id, s->conv->ids[m->seq]);
  }
  if (heads_known && prev < s->conv->head && s->last >= s->conv->head && ++nreached == opt.clients)
    finish_later(1, "");
}

/* ---- stdin ------------------------------------------------------------------------ */

/* "head H" (one conversation) or "head CONV H": 0, or -1 on a bad line
 * (finish_later called). */
static int take_head(const char *l) {
  long long h;
  char extra, id[LINE_MAX_BYTES];
  sconv_t *cv = NULL;
  if (opt.nconvs == 1 && sscanf(l, "head %lld %c", &h, &extra) == 1 && h >= 0) {
    cv = &opt.convs[0];
  } else if (sscanf(l, "head %255s %lld %c", id, &h, &extra) == 2 && h >= 0) {
    for (size_t k = 0; k < opt.nconvs && !cv; k++)
      if (strcmp(opt.convs[k].id, id) == 0) cv = &opt.convs[k];
    if (!cv) {
      finish_later(0, "a \"head\" line for a conversation not given with --conv");
      return -1;
    }
  } else {
    finish_later(0, "unknown input line");
    return -1;
  }
  if (cv->head >= 0) {
    finish_later(0, "a second \"head\" line for %s", cv->id);
    return -1;
  }
  cv->head = h;
  nheads++;
  return 0;
}

static void on_line(const char *l) {
  if (strncmp(l, "head ", 5) == 0) {
    if (heads_known) {
      finish_later(0, "a \"head\" line after every head was known");
      return;
    }
    if (take_head(l) != 0 || nheads < opt.nconvs) return;
    heads_known = 1;
    nreached = 0;
    for (long i = 0; i < opt.clients; i++) nreached += cl[i].last >= cl[i].conv->head;
    fprintf(stderr, "sdk_swarm: heads of %zu conversation(s): %ld of %ld clients there already\n",
            opt.nconvs, nreached, opt.clients);
    if (nreached == opt.clients) {
      finish_later(1, "");
      return;
    }
    uv_timer_start(&deadline_timer, on_deadline, (uint64_t)opt.head_timeout_s * 1000, 0);
    return;
  }
  if (l[0] == '\0') return;
  finish_later(0, "unknown input line");
}

static void on_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf) {
  static char b[4096];
  (void)h;
  (void)size;
  *buf = uv_buf_init(b, sizeof b);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  (void)st;
  if (n < 0) {
    if (!finishing && !heads_known)
      finish_later(0, n == UV_EOF ? "stdin ended before a \"head\" line" : "reading stdin failed");
    if (!finishing && !uv_is_closing((uv_handle_t *)in_stream)) uv_read_stop(in_stream);
    return;
  }
  for (ssize_t i = 0; i < n; i++) {
    char ch = buf->base[i];
    if (ch == '\n') {
      line[line_len] = '\0';
      if (line_len && line[line_len - 1] == '\r') line[line_len - 1] = '\0';
      on_line(line);
      line_len = 0;
    } else if (line_len + 1 < sizeof line) {
      line[line_len++] = ch;
    } else {
      finish_later(0, "an input line is too long");
      return;
    }
  }
}

static int open_stdin(void) {
  int rc;
  switch (uv_guess_handle(0)) {
  case UV_NAMED_PIPE:
    if ((rc = uv_pipe_init(loop, &in_pipe, 0)) || (rc = uv_pipe_open(&in_pipe, 0))) break;
    in_stream = (uv_stream_t *)&in_pipe;
    break;
  case UV_TTY:
    if ((rc = uv_tty_init(loop, &in_tty, 0, 1))) break;
    in_stream = (uv_stream_t *)&in_tty;
    break;
  default:
    fprintf(stderr, "sdk_swarm: stdin must be a pipe or a terminal\n");
    return -1;
  }
  if (!in_stream || (rc = uv_read_start(in_stream, on_alloc, on_read))) {
    fprintf(stderr, "sdk_swarm: stdin: %s\n", uv_strerror(rc));
    return -1;
  }
  return 0;
}

/* ---- main ------------------------------------------------------------------------- */

static int raise_nofile(long clients) {
  struct rlimit rl;
  rlim_t want = (rlim_t)clients * FDS_PER_CLIENT + FDS_SPARE;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur >= want) return 0;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < want) {
    fprintf(stderr, "sdk_swarm: %ld clients need %llu descriptors; RLIMIT_NOFILE allows %llu\n",
            clients, (unsigned long long)want, (unsigned long long)rl.rlim_cur);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int pr = parse_args(argc, argv);
  if (pr != 0) return pr > 0 ? 0 : 2;
  signal(SIGPIPE, SIG_IGN);
  if (raise_nofile(opt.clients) != 0) return 1;
  loop = uv_default_loop();
  cl = calloc((size_t)opt.clients, sizeof *cl);
  if (!cl) {
    fprintf(stderr, "sdk_swarm: out of memory\n");
    return 1;
  }
  uv_timer_init(loop, &deadline_timer);
  uv_timer_init(loop, &finish_timer);
  uv_timer_init(loop, &close_timer);
  if (open_stdin() != 0) return 1;

  cvg_sub_t sub = {NULL, 0}; /* watermark 0: replay from seq 1 */
  cvg_options_t o;
  cvg_options_init(&o); /* migrate_on_drain = 1, decorrelated backoff */
  o.urls = opt.urls;
  o.nurls = opt.nurls;
  o.token = opt.token;
  o.subs = &sub;
  o.nsubs = 1;
  o.client_name = "sdk_swarm";
  o.cb.on_message = on_message;
  o.cb.on_state = on_state;
  o.cb.on_error = on_error;
  for (long i = 0; i < opt.clients; i++) {
    char err[256];
    cl[i].idx = (int)i;
    cl[i].conv = &opt.convs[(size_t)i % opt.nconvs];
    cl[i].migrate_start = -1;
    sub.conv = cl[i].conv->id; /* cvg_client_new copies it */
    o.userdata = &cl[i];
    int rc = cvg_client_new(loop, &o, &cl[i].c, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "sdk_swarm: client %ld: %s\n", i, err);
      return 1; /* before the loop ran: nothing to wait for */
    }
  }
  for (long i = 0; i < opt.clients; i++) {
    int rc = cvg_client_start(cl[i].c);
    if (rc != 0) {
      fprintf(stderr, "sdk_swarm: cvg_client_start: %d\n", rc);
      return 1;
    }
  }
  uv_timer_start(&deadline_timer, on_deadline, (uint64_t)opt.ready_timeout_s * 1000, 0);
  fprintf(stderr, "sdk_swarm: %ld clients started on %s%s\n", opt.clients, opt.urls[0],
          opt.nurls > 1 ? " and more" : "");

  uv_run(loop, UV_RUN_DEFAULT);
  if (!finishing) { /* cannot happen: stdin or a timer keeps the loop alive until finish() */
    fprintf(stderr, "sdk_swarm: the loop ended early\n");
    return 1;
  }
  if (!uv_is_closing((uv_handle_t *)&deadline_timer))
    uv_close((uv_handle_t *)&deadline_timer, on_handle_closed);
  if (!uv_is_closing((uv_handle_t *)&finish_timer))
    uv_close((uv_handle_t *)&finish_timer, on_handle_closed);
  if (!uv_is_closing((uv_handle_t *)&close_timer))
    uv_close((uv_handle_t *)&close_timer, on_handle_closed);
  uv_run(loop, UV_RUN_DEFAULT);
  if (uv_loop_close(loop) != 0) {
    fprintf(stderr, "sdk_swarm: handles left open on the loop\n");
    exit_code = 1;
  }
  for (size_t k = 0; k < opt.nconvs; k++) {
    for (int64_t q = 0; q < opt.convs[k].ids_cap; q++) free(opt.convs[k].ids[q]);
    free(opt.convs[k].ids);
  }
  free(cl);
  return exit_code;
}
