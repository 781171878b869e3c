/*
 * baseline.c: `converger bench baseline`, the three baseline figures of one
 * node (docs/benchmarks/baseline.md):
 *   1. resident memory per idle WebSocket connection at --conns N, each with
 *      one subscription (watermark null), spread over RUN_CONVS
 *      conversations;
 *   2. handshakes per second, hello -> welcome + synced, on connections
 *      already upgraded: one round with a one-message replay read from the
 *      store (watermark head-1), one round with watermark null;
 *   3. deliveries per second to --subs S subscribers of one conversation
 *      while --messages M bodies of 100 bytes are appended over REST.
 *
 * What it owns: the options, the bench_t of the run and the order of
 * things. The child `converger serve` (this executable) on a free loopback
 * port with a fresh temporary data directory, pinned to --node-cpu, its log
 * in that directory, is bench/node.h's; the bench itself is pinned to
 * --client-cpu. Setup talks REST over blocking sockets (bench/restc.h; no
 * loop running); the phases run every client connection (bench/wsclient.h,
 * and the REST appenders of phase 3, pipelined over --rest-conns keep-alive
 * connections, every request written at once) in one libuv loop on this
 * thread, driven by bench/run.h.
 *
 * Invariants: every phase has a deadline (--timeout) and fails with a
 * message instead of waiting; whatever happens, the client sockets are
 * closed (with RST, so no TIME_WAIT piles up), the node is stopped (SIGTERM,
 * SIGKILL after 10 s) and reaped, and the temporary directory is removed.
 */
#include "bench/bench.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "bench/node.h"
#include "bench/restc.h"
#include "bench/run.h"
#include "bench/wsclient.h"
#include "common/jitter.h"
#include "common/util.h"
#include "stats/rank.h"

#define BODY_BYTES 100  /* JSON body of each message appended in phase 3 */
#define SETTLE_MS  2000 /* idle time before the second RSS reading */
#define FDS_SPARE  256  /* descriptors besides the connections */

typedef struct {
  double bytes_per_conn;
  long rss_before_kb, rss_after_kb;
  double kernel_bytes_per_conn; /* the kernel's, per socket (kmem_read; have_kernel) */
  int have_kernel;
  double hs_rate[2]; /* [0]: one-message replay, [1]: watermark null */
  double deliveries;
  int have_memory, have_hs[2], have_deliveries;
} results_t;

/* ---- options ----------------------------------------------------------------- */

static void usage(FILE *out) {
  fprintf(out, "usage: converger bench baseline [options]\n\n"
               "Starts a node (this executable, `converger serve`) on a free loopback port\n"
               "with a temporary data directory and measures, over 127.0.0.1 only:\n"
               "  1. resident memory per idle WebSocket connection (one subscription each);\n"
               "  2. handshakes per second, hello -> welcome + synced, with a one-message\n"
               "     replay read from the store, then with watermark null;\n"
               "  3. deliveries per second to the subscribers of one conversation while\n"
               "     messages with 100-byte bodies are appended over REST.\n"
               "Results go to stdout (with a Markdown table row), progress to stderr.\n\n"
               "  --conns N        idle connections for the memory figure [10000]\n"
               "  --handshakes N   hellos per handshake round [5000]\n"
               "  --subs N         subscribers of the fan-out conversation [5000]\n"
               "  --messages N     messages appended in the delivery phase [200]\n"
               "  --rest-conns N   keep-alive connections carrying the appends [16]\n"
               "  --node-cpu N     CPU the node is pinned to, -1: not pinned [first CPU]\n"
               "  --client-cpu N   CPU the bench is pinned to, -1: not pinned\n"
               "                   [second CPU; not pinned on a one-CPU machine]\n"
               "  --timeout S      limit of each phase in seconds [60]\n"
               "  --help           this text\n");
}

/* Returns 0, 1 after --help, or -1 after printing why (exit status 2). */
static int parse_options(bench_t *b, int argc, char **argv, const cpu_set_t *allowed) {
  long long conns = b->conns, handshakes = b->handshakes, subs = b->subs, messages = b->messages,
            rest_conns = b->rest_conns, node_cpu = b->node_cpu, client_cpu = b->client_cpu,
            timeout_s = b->timeout_s;
  const run_int_opt_t opts[] = {
      {"conns", &conns, 1, 1000000},
      {"handshakes", &handshakes, 1, 1000000},
      {"subs", &subs, 1, 1000000},
      {"messages", &messages, 1, 1000000},
      {"rest-conns", &rest_conns, 1, 1000},
      {"node-cpu", &node_cpu, -1, CPU_SETSIZE - 1},
      {"client-cpu", &client_cpu, -1, CPU_SETSIZE - 1},
      {"timeout", &timeout_s, 1, 86400},
  };
  int r = run_parse_int_options("converger bench baseline", argc, argv, opts, CV_ARRAY_SIZE(opts),
                                usage);
  if (r != 0) return r;
  b->conns = (int)conns;
  b->handshakes = (int)handshakes;
  b->subs = (int)subs;
  b->messages = (int)messages;
  b->rest_conns = (int)rest_conns;
  b->node_cpu = (int)node_cpu;
  b->client_cpu = (int)client_cpu;
  b->timeout_s = (int)timeout_s;
  int cpus[2] = {b->node_cpu, b->client_cpu};
  for (int i = 0; i < 2; i++)
    if (cpus[i] >= 0 && !CPU_ISSET(cpus[i], allowed)) {
      fprintf(stderr, "converger bench baseline: CPU %d is not available to this process\n",
              cpus[i]);
      return -1;
    }
  return 0;
}

/* ---- the kernel's memory ------------------------------------------------------ */

/* The machine's kernel memory that sockets take: /proc/meminfo's Slab
 * (kB: socket, inode, dentry and TCP structures live there) and
 * /proc/net/sockstat's TCP buffer pages ("TCP: ... mem N"). -1 where
 * unreadable. System-wide: on loopback both ends of every connection
 * are counted, and so is whatever else the machine does meanwhile. */
typedef struct {
  long slab_kb, tcp_pages, tcp_inuse;
} kmem_t;

static kmem_t kmem_read(void) {
  kmem_t k = {-1, -1, -1};
  char line[256];
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "Slab: %ld kB", &k.slab_kb) == 1) break;
    fclose(f);
  }
  f = fopen("/proc/net/sockstat", "r");
  if (f) {
    while (fgets(line, sizeof line, f)) {
      long inuse, orphan, tw, alloc, mem;
      if (sscanf(line, "TCP: inuse %ld orphan %ld tw %ld alloc %ld mem %ld", &inuse, &orphan, &tw,
                 &alloc, &mem) == 5) {
        k.tcp_inuse = inuse;
        k.tcp_pages = mem;
      }
    }
    fclose(f);
  }
  return k;
}

/* ---- the three phases ---------------------------------------------------------- */

static int phase_memory(bench_t *b, results_t *res) {
  size_t n = (size_t)b->conns;
  fprintf(stderr, "memory: opening %zu connections, one subscription each (watermark null)\n", n);
  long before = bnode_status_kb(b->pid, "VmRSS");
  if (before < 0) {
    run_fail(b, "cannot read VmRSS of the node (pid %d)", (int)b->pid);
    return -1;
  }
  kmem_t k0 = kmem_read();
  b->phase = "memory: connecting";
  if (wsc_set_begin(b, n, 1, 0, -1) != 0) return -1;
  b->want_open = b->want_synced = n;
  uint64_t t0 = run_now_ns();
  wsc_open_more(b);
  if (run_phase(b, "memory: connecting") != 0) return -1;
  double open_s = (double)(b->done_ns - t0) / RUN_NS;
  b->hold_until_ns = run_now_ns() + (uint64_t)SETTLE_MS * 1000000u;
  if (run_phase(b, "memory: settling") != 0) return -1;
  long ws = 0, http = 0, subs = 0;
  if (bnode_counts(b, &ws, &http, &subs) != 0) return -1;
  long after = bnode_status_kb(b->pid, "VmRSS");
  kmem_t k1 = kmem_read();
  if (ws != (long)n || subs != (long)n) {
    run_fail(b, "memory: the node counts %ld connections and %ld subscriptions, want %zu", ws, subs,
             n);
    return -1;
  }
  res->rss_before_kb = before;
  res->rss_after_kb = after;
  res->bytes_per_conn = (double)(after - before) * 1024.0 / (double)n;
  res->have_memory = 1;
  double miss = res->bytes_per_conn - 4096;
  char verdict[64];
  if (miss <= 0)
    snprintf(verdict, sizeof verdict, "met");
  else
    snprintf(verdict, sizeof verdict, "MISSED by %.0f bytes, %.0f%%", miss, miss / 4096 * 100);
  printf("memory: %zu idle connections (welcomed and synced in %.2f s): node VmRSS %.1f MiB -> "
         "%.1f MiB: %.0f bytes per connection (target <= 4096: %s)\n",
         n, open_s, before / 1024.0, after / 1024.0, res->bytes_per_conn, verdict);
  if (k0.slab_kb >= 0 && k1.slab_kb >= 0 && k0.tcp_pages >= 0 && k1.tcp_pages >= 0) {
    /* both ends of every connection are on this machine: the node's end
     * is about half (its socket holds the same structures as the client's) */
    res->kernel_bytes_per_conn = ((double)(k1.slab_kb - k0.slab_kb) * 1024.0 +
                                  (double)(k1.tcp_pages - k0.tcp_pages) * 4096.0) /
                                 (2.0 * (double)n);
    res->have_kernel = 1;
    printf("memory: kernel: Slab %+.1f MiB, TCP buffer pages %+ld, TCP sockets in use %ld -> %ld: "
           "about %.0f bytes per socket (one end; both ends are on this machine), so about %.0f "
           "bytes per connection with the node's RSS\n",
           (double)(k1.slab_kb - k0.slab_kb) / 1024.0, k1.tcp_pages - k0.tcp_pages, k0.tcp_inuse,
           k1.tcp_inuse, res->kernel_bytes_per_conn,
           res->kernel_bytes_per_conn + res->bytes_per_conn);
  }
  fflush(stdout);
  wsc_set_end(b);
  return bnode_wait_idle(b);
}

/* One round of K hellos on upgraded connections; watermark -1 is null. */
static int phase_handshakes(bench_t *b, int64_t watermark, results_t *res) {
  size_t k = (size_t)b->handshakes;
  int round = watermark < 0;
  const char *what = round ? "watermark null" : "one-message replay";
  fprintf(stderr, "handshakes (%s): upgrading %zu connections\n", what, k);
  b->phase = "handshakes: upgrading";
  if (wsc_set_begin(b, k, 0, 0, watermark) != 0) return -1;
  b->want_open = k;
  wsc_open_more(b);
  if (run_phase(b, "handshakes: upgrading") != 0) return -1;
  if (!(b->lat = calloc(k, sizeof *b->lat))) {
    run_fail(b, "out of memory");
    return -1;
  }
  b->want_synced = k;
  b->want_msgs = watermark < 0 ? 0 : (uint64_t)k * (uint64_t)(RUN_SETUP_HEAD - watermark);
  b->phase = "handshakes: sending hello";
  bnode_cpu_snap_t c0, c1;
  bnode_cpu_snap(b, &c0);
  uint64_t t0 = run_now_ns();
  for (size_t i = 0; i < k && !b->failed; i++) wsc_send_hello(&b->ws[i]);
  uint64_t sent_ns = run_now_ns();
  if (run_phase(b, "handshakes: waiting for welcome and synced") != 0) return -1;
  bnode_cpu_snap(b, &c1);
  if (b->msgs != b->want_msgs || b->seq_errors) {
    run_fail(b, "handshakes: %llu replayed messages (want %llu), %llu out of order",
             (unsigned long long)b->msgs, (unsigned long long)b->want_msgs,
             (unsigned long long)b->seq_errors);
    return -1;
  }
  double s = (double)(b->done_ns - t0) / RUN_NS;
  qsort(b->lat, b->nlat, sizeof *b->lat, run_cmp_u64);
  double p50 = (double)b->lat[rank_nearest(0.50, b->nlat) - 1] / 1e6;
  double p99 = (double)b->lat[rank_nearest(0.99, b->nlat) - 1] / 1e6;
  char cpu[160];
  double node_s = bnode_cpu_text(&c0, &c1, cpu, sizeof cpu);
  res->hs_rate[round] = (double)k / s;
  res->have_hs[round] = 1;
  printf("handshakes (%s): %zu hello -> welcome%s + synced in %.3f s (hellos written in %.0f ms): "
         "%.0f/s",
         what, k, round ? "" : " + 1 replayed msg", s, (double)(sent_ns - t0) / 1e6,
         res->hs_rate[round]);
  if (!round) printf(" (target >= 10000: %s)", res->hs_rate[round] >= 10000 ? "met" : "MISSED");
  printf("; latency p50 %.0f ms, p99 %.0f ms; %s, %.0f us node CPU per handshake\n", p50, p99, cpu,
         node_s * 1e6 / (double)k);
  fflush(stdout);
  wsc_set_end(b);
  return bnode_wait_idle(b);
}

static int phase_deliveries(bench_t *b, results_t *res) {
  size_t s = (size_t)b->subs, m = (size_t)b->messages;
  fprintf(stderr, "deliveries: subscribing %zu connections to one conversation\n", s);
  b->phase = "deliveries: subscribing";
  if (wsc_set_begin(b, s, 1, 1, -1) != 0) return -1;
  b->want_open = b->want_synced = s;
  wsc_open_more(b);
  if (run_phase(b, "deliveries: subscribing") != 0) return -1;
  size_t nrest = (size_t)b->rest_conns;
  b->want_rest_connected = nrest;
  b->phase = "deliveries: connecting REST";
  if (restc_begin(b) != 0 || run_phase(b, "deliveries: connecting REST") != 0) return -1;

  /* Every request written at once, message i on connection i % nrest. The
   * body {"text":"xx...x"} is BODY_BYTES long. */
  char text[BODY_BYTES - 11 + 1];
  memset(text, 'x', sizeof text - 1);
  text[sizeof text - 1] = '\0';
  char body[256];
  int blen = snprintf(body, sizeof body, "{\"sender\":\"bench\",\"body\":{\"text\":\"%s\"}}", text);
  size_t per = (m + nrest - 1) / nrest, cap = per * 512 + 1;
  char *reqs = malloc(nrest * cap); /* one slice of `cap` bytes per connection */
  size_t *lens = calloc(nrest, sizeof *lens);
  if (!reqs || !lens) {
    run_fail(b, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < m; i++) {
    size_t r = i % nrest;
    lens[r] += (size_t)snprintf(reqs + r * cap + lens[r], cap - lens[r],
                                "POST /v1/conversations/bench-fanout/messages HTTP/1.1\r\n"
                                "Host: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
                                "Content-Type: application/json\r\nIdempotency-Key: bench-%zu\r\n"
                                "Content-Length: %d\r\n\r\n%s",
                                b->port, b->api_key, i, blen, body);
  }
  b->want_msgs = (uint64_t)s * m;
  b->want_rest_answers = m;
  b->phase = "deliveries: appending";
  bnode_cpu_snap_t c0, c1;
  bnode_cpu_snap(b, &c0);
  uint64_t t0 = run_now_ns();
  for (size_t i = 0; i < nrest && !b->failed; i++)
    if (lens[i]) run_send(b, (uv_stream_t *)&b->rest[i].tcp, reqs + i * cap, lens[i]);
  if (run_phase(b, "deliveries: appending and delivering") != 0) goto out;
  bnode_cpu_snap(b, &c1);
  if (b->seq_errors) {
    run_fail(b, "deliveries: %llu messages out of order", (unsigned long long)b->seq_errors);
    goto out;
  }
  double secs = (double)(b->msgs_done_ns - t0) / RUN_NS;
  char cpu[160];
  double node_s = bnode_cpu_text(&c0, &c1, cpu, sizeof cpu);
  res->deliveries = (double)b->want_msgs / secs;
  res->have_deliveries = 1;
  printf("deliveries: %zu subscribers x %zu messages (%d-byte bodies) = %llu in %.3f s: %.0f/s "
         "(target >= 500000: %s); appends answered in %.0f ms over %d pipelined connections; %s, "
         "%.2f us node CPU per delivery\n",
         s, m, BODY_BYTES, (unsigned long long)b->want_msgs, secs, res->deliveries,
         res->deliveries >= 500000 ? "met" : "MISSED", (double)(b->rest_done_ns - t0) / 1e6,
         b->rest_conns, cpu, node_s * 1e6 / (double)b->want_msgs);
  fflush(stdout);
out:
  free(reqs);
  free(lens);
  restc_end(b);
  wsc_set_end(b);
  return b->failed ? -1 : 0;
}

/* ---- main ---------------------------------------------------------------------- */

static void cpu_name(int cpu, char out[32]) {
  if (cpu >= 0)
    snprintf(out, 32, "CPU %d", cpu);
  else
    snprintf(out, 32, "no CPU pinning");
}

static void cell(int have, double v, char out[32]) {
  if (have)
    snprintf(out, 32, "%.0f", v);
  else
    snprintf(out, 32, "-");
}

static void print_table(bench_t *b, const results_t *r) {
  char c[4][32];
  cell(r->have_memory, r->bytes_per_conn, c[0]);
  cell(r->have_hs[0], r->hs_rate[0], c[1]);
  cell(r->have_hs[1], r->hs_rate[1], c[2]);
  cell(r->have_deliveries, r->deliveries, c[3]);
  printf("\n| conns | bytes/conn | handshakes | hs/s (1-msg replay) | hs/s (null) | subs x msgs | "
         "deliveries/s |\n| ---: | ---: | ---: | ---: | ---: | --- | ---: |\n"
         "| %d | %s | %d | %s | %s | %d x %d | %s |\n",
         b->conns, c[0], b->handshakes, c[1], c[2], b->subs, b->messages, c[3]);
  fflush(stdout);
}

int bench_baseline_main(int argc, char **argv) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    fprintf(stderr, "converger bench baseline: sched_getaffinity: %s\n", strerror(errno));
    return 1;
  }
  bench_t *b = calloc(1, sizeof *b);
  if (!b) return 1;
  int cpus[2] = {-1, -1}, ncpu = 0;
  for (int i = 0; i < CPU_SETSIZE && ncpu < 2; i++)
    if (CPU_ISSET(i, &allowed)) cpus[ncpu++] = i;
  b->conns = 10000;
  b->handshakes = 5000;
  b->subs = 5000;
  b->messages = 200;
  b->rest_conns = 16;
  b->node_cpu = cpus[0];
  b->client_cpu = cpus[1];
  b->timeout_s = 60;
  b->phase = "setup";
  int r = parse_options(b, argc, argv, &allowed);
  if (r != 0) {
    free(b);
    return r > 0 ? 0 : 2;
  }

  /* Descriptors: the child inherits the raised limit. */
  unsigned long long nofile = run_raise_nofile();
  long need = b->conns;
  if (b->handshakes > need) need = b->handshakes;
  if (b->subs > need) need = b->subs;
  if ((unsigned long long)(need + FDS_SPARE) > nofile) {
    fprintf(stderr,
            "converger bench baseline: %ld connections need %ld descriptors per process; "
            "RLIMIT_NOFILE allows %llu\n",
            need, need + FDS_SPARE, nofile);
    free(b);
    return 2;
  }

  run_signals_t signals;
  run_signals_catch(&signals);
  run_interrupted = 0;
  jitter_seed_random(&b->rng);

  results_t res = {0};
  int status = 1;
  if (bnode_start(b) != 0) goto out;
  if (b->client_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(b->client_cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
      run_fail(b, "cannot pin the bench to CPU %d: %s", b->client_cpu, strerror(errno));
      goto out;
    }
  }
  char node_cpu[32], client_cpu[32];
  cpu_name(b->node_cpu, node_cpu);
  cpu_name(b->client_cpu, client_cpu);
  printf("converger bench baseline: node pid %d (%s serve) on 127.0.0.1:%d, %s; bench on %s; "
         "RLIMIT_NOFILE %llu\n",
         (int)b->pid, b->exe, b->port, node_cpu, client_cpu, nofile);
  fflush(stdout);
  if (uv_loop_init(&b->loop) != 0) {
    run_fail(b, "uv_loop_init failed");
    goto out;
  }
  b->loop_ready = 1;
  uv_timer_init(&b->loop, &b->watch);
  uint64_t t0 = run_now_ns();
  if (bnode_wait_ready(b) != 0 || restc_setup(b) != 0) goto out;
  fprintf(stderr,
          "setup: node ready, %d conversations with %d messages each, token minted (%.1f s)\n",
          RUN_CONVS, RUN_SETUP_HEAD, (double)(run_now_ns() - t0) / RUN_NS);
  if (phase_memory(b, &res) != 0) goto out;
  if (phase_handshakes(b, RUN_SETUP_HEAD - 1, &res) != 0) goto out;
  if (phase_handshakes(b, -1, &res) != 0) goto out;
  if (phase_deliveries(b, &res) != 0) goto out;
  status = 0;
out:
  if (b->failed) {
    fprintf(stderr, "converger bench baseline: FAILED: %s\n", b->err);
    bnode_print_log_tail(b, 20);
  }
  if (res.have_memory || res.have_hs[0] || res.have_deliveries) print_table(b, &res);
  if (b->loop_ready) {
    restc_end(b);
    wsc_set_end(b);
    uv_close((uv_handle_t *)&b->watch, NULL);
    for (int i = 0; i < 8 && uv_loop_alive(&b->loop); i++) uv_run(&b->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&b->loop) != 0)
      fprintf(stderr, "converger bench baseline: the loop closed with open handles\n");
  }
  bnode_stop(b);
  bnode_remove_dir(b);
  run_signals_restore(&signals);
  free(b->token);
  free(b);
  return status;
}

/* The dispatcher of every benchmark (bench/bench.h). */
int bench_main(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "baseline") == 0) return bench_baseline_main(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "admission") == 0)
    return bench_admission_main(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "store") == 0) return bench_store_main(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "roll") == 0) return bench_roll_main(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "compare") == 0) return bench_compare_main(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "presence") == 0) return bench_presence_main(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "peers") == 0) return bench_peers_main(argc - 1, argv + 1);
  FILE *out = argc >= 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0 ||
                            strcmp(argv[0], "help") == 0)
                  ? stdout
                  : stderr;
  if (argc >= 1 && out == stderr)
    fprintf(stderr, "converger bench: unknown benchmark \"%s\"\n\n", argv[0]);
  fprintf(out, "usage: converger bench <benchmark> [options]\n\n"
               "benchmarks:\n"
               "  baseline  memory per idle connection, handshakes/s, deliveries/s of one node\n"
               "            (converger bench baseline --help)\n"
               "  admission the admission queue's acquire/release throughput, and a burst of\n"
               "            simultaneous hellos with admission on and off\n"
               "            (converger bench admission --help)\n"
               "  store     appends/s with 1..N concurrent senders and delivery latency on\n"
               "            SQLite (synchronous full, normal) and PostgreSQL, same node and\n"
               "            across two nodes (converger bench store --help)\n"
               "  roll      a rolling restart of a PostgreSQL cluster under SDK clients and a\n"
               "            REST sender, with loss verification (converger bench roll --help)\n"
               "  compare   preset sets of roll scenarios side by side, with overlay plots\n"
               "            (converger bench compare --help)\n"
               "  presence  the presence table's memory per entry, and signals against\n"
               "            appends on PostgreSQL (converger bench presence --help)\n"
               "  peers     converger next to uWebSockets.js, Node ws, nats-server and\n"
               "            mosquitto, one load client (converger bench peers --help)\n");
  return out == stdout ? 0 : 2;
}
