/*
 * burst: one burst of simultaneous hellos against one node, part 2 of
 * `converger bench admission` (tools/bench/admission.c,
 * docs/benchmarks/admission.md).
 *
 * burst_run starts a node (bench/node.h) with admission on (the node's
 * defaults: WS_HANDSHAKE_CONCURRENCY 0, half the pool) or off
 * (WS_HANDSHAKE_CONCURRENCY=100000, so every hello goes straight to the
 * pool), creates the setup of bench/restc.h (100 conversations with 2
 * messages each, a token), then creates N libconverger-client clients in
 * one libuv loop on this thread, client i subscribed to conversation i % 100
 * with watermark 0 (so every hello replays the 2 messages), and starts them
 * all in the same loop turn. The clients reconnect as the library does
 * (decorrelated jitter from 250 ms, cap 10 s, the server's retryAfterMs as
 * a floor). The burst ends when every client has been welcomed once, or
 * after the timeout; then the bench reads the clients' counters and the
 * node's GET /metrics, closes every client (cvg_client_close), stops the
 * node and removes its directory.
 *
 * What it owns: everything it starts; nothing outlives burst_run.
 * Main thread only; the caller pins the process (this code sets no
 * affinity of its own except the node's, cfg->node_cpu).
 */
#ifndef CONVERGER_TOOLS_BENCH_BURST_H
#define CONVERGER_TOOLS_BENCH_BURST_H

#include <stddef.h>
#include <stdint.h>

#define BURST_ADMISSION_OFF 100000 /* WS_HANDSHAKE_CONCURRENCY of "admission off" */

/* What one burst is run with. */
typedef struct {
  int clients;      /* simultaneous clients, >= 1 */
  int pool;         /* CONVERGER_POOL_SIZE of the node */
  int node_cpu;     /* CPU the node is pinned to; -1: not pinned */
  int timeout_s;    /* the burst ends after this many seconds at most */
  int admission_on; /* 1: node defaults; 0: WS_HANDSHAKE_CONCURRENCY=100000 */
  int tls;          /* 1: the node serves TLS and the clients connect with wss:// */
  int port;         /* the node's 127.0.0.1 port; 0: a free one the bench picks */
} burst_config_t;

/* The figures of one burst. Times are in ms from the moment the first
 * client was started. A figure the burst did not reach (a percentile of
 * first welcomes falling on a client never welcomed) is INFINITY. Metrics
 * are the node's GET /metrics after the burst minus before it. */
typedef struct {
  size_t clients;
  size_t welcomed;               /* clients welcomed at least once within the timeout */
  size_t refused;                /* clients with at least one `unavailable` answer */
  uint64_t unavailable;          /* `unavailable` answers, all clients (cvg_stats_t.unavailable) */
  uint64_t attempts;             /* connections opened, all clients (cvg_stats_t.attempts) */
  double start_ms;               /* how long starting every client took (the loop turn) */
  double p50_ms, p95_ms, max_ms; /* start -> first welcome, over all clients */
  double node_cpu_s;             /* the node's CPU time from the start to the end of the burst */
  char cpu_text[192];            /* bench/node.h's CPU summary of that interval */
  char node_line[160];           /* the node's start-up line: pool and admission settings */
  int port;                      /* the node's 127.0.0.1 port */

  /* from /metrics */
  double pool_jobs;              /* converger_pool_wait_ms_count */
  double pool_wait_mean_ms;      /* converger_pool_wait_ms sum / count */
  double pool_wait_peak_ms;      /* upper bound of the highest non-empty bucket; 0: no job;
                                    INFINITY: above the last bucket (10 000 ms) */
  double pool_wait_peak_lo;      /* lower bound of that bucket */
  double pool_dropped;           /* converger_pool_dropped_total, all kinds */
  double adm_ok, adm_overloaded; /* converger_protocol_admission_wait_ms counts by result */
  double adm_wait_mean_ms;       /* of result="ok" */
  double adm_wait_peak_ms;       /* of result="ok": as pool_wait_peak_ms */
  double adm_wait_peak_lo;
  double adm_over_mean_ms; /* of result="overloaded": 0 when every refusal found the queue full
                              (queue_max waiting), >= WS_HANDSHAKE_QUEUE_MS when they expired */
  double hs_ok, hs_overloaded, hs_unavailable; /* converger_handshakes_total by result */
  double tls_ok, tls_failed, tls_mean_ms;      /* converger_tls_handshake(s) by result, mean */
  double rss_per_client; /* the node's RSS growth over the burst / clients welcomed (bytes),
                            every client still connected; 0: unreadable */
  double tls_peak_ms, tls_peak_lo; /* the highest non-empty bucket, as pool_wait_peak_ms */
} burst_result_t;

/* Run one burst as described above and fill `out`. Progress goes to
 * stderr. Returns 0 when the burst ran (whether or not every client was
 * welcomed in time), or -1 with a one-line reason in `err` (`errlen`
 * bytes) when it could not: the node did not start or exited, setup
 * failed, a client could not be created, a token was refused, or a signal
 * arrived (run_interrupted). The node is stopped and its directory removed
 * in every case. */
int burst_run(const burst_config_t *cfg, burst_result_t *out, char *err, size_t errlen);

#endif
