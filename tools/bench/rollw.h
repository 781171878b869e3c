/*
 * rollw: one client worker process of `converger bench roll` (bench/roll.c).
 *
 * A worker is a forked child of the bench. It runs `nclients` SDK clients
 * (libconverger-client, cvg_client_*) on one libuv loop, client i of the
 * whole run subscribed from watermark 0 to conversation i % nconvs and given
 * every node URL (direct mode: the SDK picks) or the one URL of a load
 * balancer (--lb haproxy). It talks to the bench over
 * two sockets (`fd_in` from the bench, `fd_out` to it, blocking), in text
 * lines:
 *
 *   worker -> bench  "ready"            every client of the worker has been
 *                                        welcomed once
 *   bench -> worker  "heads H0 H1 ..."  the acknowledged head of every
 *                                        conversation; the worker waits (at
 *                                        most wait_ms) until each client has
 *                                        delivered its head, closes its
 *                                        clients and writes its records:
 *   worker -> bench  "A T NODE"          a welcome (arrival) at T ms after t0
 *                                        on node index NODE
 *                    "O MS"              one drop's disconnected time (close
 *                                        -> next welcome; a make-before-break
 *                                        migration is "O 0")
 *                    "S B N0 N1 ..."     connected clients per node in the
 *                                        100 ms bucket B
 *                    "L MS COUNT"        delivery latency histogram (1 ms
 *                                        bins: the sender's POST start ->
 *                                        on_message), every delivery
 *                    "M MS COUNT"        the same for live deliveries only:
 *                                        messages sent after the client's
 *                                        current connection was welcomed
 *                                        (replays after a reconnect left out)
 *                    "X CLIENT CONV LAST HEAD DUP ORDER"  a client that did
 *                                        not deliver exactly 1..HEAD once in
 *                                        order
 *                    "P JOINS LEAVES"     the join and leave events client 0
 *                                        saw (with `presence`, by its worker)
 *                    "V OK LOST DUP ORDER SDKDUP UNAVAIL REPLAYUNAVAIL
 *                       ATTEMPTS MIGRATIONS"  the totals
 *                    "E"                 the end
 *
 * Times are ms on uv_hrtime's clock (CLOCK_MONOTONIC, shared by every
 * process) after t0_ns. Node index k is the node whose welcome says
 * `node` "roll-k".
 */
#ifndef CONVERGER_TOOLS_BENCH_ROLLW_H
#define CONVERGER_TOOLS_BENCH_ROLLW_H

#include <stddef.h>
#include <stdint.h>

#include <converger/client.h>

#define ROLLW_MAX_NODES 16

/* What a worker runs; every pointer is borrowed and must stay valid (the
 * worker is a fork: it has its own copy). */
typedef struct {
  int fd_in, fd_out;      /* the sockets from and to the bench */
  size_t first, nclients; /* clients first .. first + nclients - 1 of the run */
  size_t nconvs;
  const char *const *convs; /* conversation ids */
  const char *const *urls;  /* ws:// URL of every node, or the load balancer's one */
  size_t nurls;
  size_t nnodes; /* nodes (indices of "roll-K" in welcomes; columns of "S" lines) */
  const char *token;
  cvg_backoff_strategy_t backoff;
  int64_t backoff_base_ms, backoff_cap_ms; /* 0: the SDK's defaults */
  int migrate_on_drain;                    /* 0: legacy clients (ignore `drain`) */
  cvg_reconnect_t reconnect;               /* the SDK's reconnect policy */
  int ignore_hints;                        /* 1: the SDK ignores retryAfterMs */
  uint64_t seed;                           /* 0: the OS's randomness */
  uint64_t t0_ns;
  int64_t wait_ms;         /* bound on the catch-up after "heads" */
  int64_t start_per_100ms; /* clients started per 100 ms */
  int presence; /* the first two clients of each conversation watch its joins and leaves */
} rollw_options_t;

/* Run the worker until its records are written; never returns: exits the
 * process with 0, or 1 when the loop or the socket failed. Call in the
 * forked child only. */
void rollw_main(const rollw_options_t *o) __attribute__((noreturn));

#endif
