/*
 * drain: move a node's clients elsewhere without a gap and without a storm
 * (the drain lesson; the reconnect-storm post-mortem's action items
 * "drain-not-disconnect" and jittered, server-paced reconnects).
 *
 * Drain (SIGTERM, POST /admin/drain): the node stops being ready (/readyz
 * 503, upgrades 503 + Retry-After, membership row "draining"; REST keeps
 * working). Every WebSocket connection gets one `drain` frame: afterMs
 * uniform in [0, window), deadlineMs = window, and reconnectTo, a ready
 * peer drawn in proportion to this node's share of how far the peer is
 * below the level the fleet will reach once every draining node is empty
 * (connections + admission waiters; gate/spread.h), so that a restarted,
 * empty node gets most of the moves; two random choices once that share
 * is used up. A connection is offered peers of its own scheme only (a
 * client that reached the node over TLS, conn_t.client_tls, a peer whose
 * public URL is wss://; any other, a ws:// one; docs/protocol.md 5.6):
 * reconnectTo is null when no ready peer has its scheme.
 * With no ready peer (a single node, or every peer draining,
 * as the last successful read of the nodes says) no frame is sent: it
 * would send the clients back here. The connections are closed with 1012
 * and a jittered retry hint at once, paced, and the node stops as soon as
 * none is left (at once with none); the window does not apply.
 * Clients that move close with 1000 (make-before-break). A Server-Sent
 * Events stream gets no frame when the drain begins: it keeps streaming
 * until its own moment, drawn from [0, window) as afterMs is, and then
 * gets the drain event (afterMs a short jittered retry,
 * SSE_DRAIN_RETRY_*_MS, written as retry:; reconnectTo null, since an
 * EventSource reconnects to its own URL; deadlineMs 0) and ends, counted
 * as migrated. deadlineMs is the
 * window plus DRAIN_GRACE_MS, the time a client that drew an afterMs near
 * the end needs to open its new connection and be welcomed before the old
 * one may go. After that deadline (and after the overtime while moves
 * are still coming in: DRAIN_PROGRESS_MS, DRAIN_OVERTIME_MS), the
 * connections still open are closed with 1012 at close_rate per second,
 * paced
 * evenly, each with a jittered {"retryAfterMs": n}. With drain_migrate 0
 * (CONVERGER_DRAIN_MIGRATE=0, for experiments) no frame is sent and the
 * paced closes begin at once. The node stops (closing
 * what is left with 1001, finishing pool jobs, exit 0) when no WebSocket
 * connection is left, or at shutdown_ms after the drain began.
 *
 * Shed (POST /admin/shed): the same frames to a random `fraction` of the
 * connections of a node that stays ready, over its own window; those that
 * have not moved by its end are closed at the paced rate.
 *
 * Metrics: converger_drain_state (0 ready, 1 draining, 2 shedding),
 * converger_drain_migrated_total (connections told to move that closed
 * before the server closed them), converger_drain_closed_total{reason}
 * ("paced": 1012 after the window, "shutdown": 1001 at the end).
 *
 * Thread: loop only.
 */
#ifndef CONVERGER_GATE_DRAIN_H
#define CONVERGER_GATE_DRAIN_H

#include <stdint.h>

#include <uv.h>

#include "cluster/membership.h"
#include "common/jitter.h"
#include "core/config.h"
#include "net/conn.h"
#include "store/pool.h"

#define DRAIN_GRACE_MS 2000 /* past the window: a migration's connect, hello, welcome */
/* Past the deadline, the 1012s wait while clients are still moving: one
 * told closed by itself within the last DRAIN_PROGRESS_MS, for at most
 * DRAIN_OVERTIME_MS (and, in a drain, only while the paced closes of
 * those left still fit before drain_shutdown_ms). */
#define DRAIN_PROGRESS_MS 500
#define DRAIN_OVERTIME_MS 8000

/* A Server-Sent Events stream's drain event: its retry: (and afterMs),
 * drawn uniformly from [MIN, MAX] ms. Short, because the spread over the
 * window is already made by each stream's moment (drawn as a WebSocket's
 * afterMs), so that the reader is away for about this long, not for its
 * moment. Jittered all the same, because the moments are kept by the
 * timer: the streams whose moments fall in one tick (20 ms; all of them
 * with a window of 0, or after a stalled loop) end together, and a fixed
 * retry would bring their readers back in the same millisecond. 400 ms of
 * jitter makes that a flat arrival over 400 ms for at most 0.5 s of a
 * reader's gap (the goal: at most 1 s across a drain). */
#define SSE_DRAIN_RETRY_MIN_MS 100
#define SSE_DRAIN_RETRY_MAX_MS 500

typedef struct drain_s drain_t;

/* A connection's drain state. Its session keeps it (the drain reaches it
 * through drain_env_t.mark), not the connection. */
typedef struct {
  unsigned welcomed : 1; /* its session sent `welcome`: it may be told to move */
  unsigned told : 1;     /* it was sent a drain frame */
  unsigned counted : 1;  /* counted as migrated */
  uint32_t batch;        /* the drain or shed it was chosen for; 0: none */
  uint32_t sse_slot;     /* a stream waiting for its moment: its place in the drain's heap of
                            moments, plus 1; 0: none (drain.c, "streams' moments") */
} drain_mark_t;

/* What a drain works with, all borrowed from its owner (the node), which
 * outlives it. */
typedef struct {
  uv_loop_t *loop;
  const config_t *cfg;      /* drain_window_ms, drain_close_rate, drain_migrate, drain_shutdown_ms,
                               node_id, the retry-hint range */
  net_t *net;               /* the connections to move (net/conn.h) */
  pool_t *const *pool;      /* the owner's pool pointer: the peers are read on it */
  jitter_rng_t *rng;        /* afterMs, retry hints, the shed's choice */
  membership_t *membership; /* beaten at once when the drain begins; NULL: none (tests) */
  metrics_t *metrics;       /* the drain's counters and state gauge (core/metrics.h) */
  /* How the drain ends the node: close everything left and exit
   * (lifecycle.h, node_stop). `why` is for the log. */
  void (*stop)(void *ud, const char *why);
  /* The drain frame (docs/protocol.md 5.6) as JSON text: heap, NULL when
   * out of memory; `reconnect_to` NULL for null. Frames are proto's. */
  char *(*frame)(void *ud, int64_t after_ms, const char *reconnect_to, int64_t deadline_ms);
  /* The drain state of WebSocket connection `c`, or NULL when it has none
   * (its session never began). */
  drain_mark_t *(*mark)(void *ud, conn_t *c);
  void *ud;
} drain_env_t;

/* A drain controller working with `env` (copied). NULL when out of
 * memory. */
drain_t *drain_new(const drain_env_t *env);

/* Close the timer; the struct is freed in its close callback (releasing
 * the connections still queued for a paced close). */
void drain_close(drain_t *d);

/* Begin the drain. `why` is logged ("SIGTERM", "POST /admin/drain").
 * Returns 0, or -CV_EEXISTS when a drain has already begun. */
int drain_start(drain_t *d, const char *why);

/* Shed `fraction` (0 < f <= 1) of the WebSocket connections over
 * `window_ms` (>= 0). On success sets *chosen and *total (the connections
 * told to move, and those there were) and returns 0; -CV_EBUSY while
 * draining or while another shed runs. */
int drain_shed(drain_t *d, double fraction, int64_t window_ms, int *chosen, int *total);

/* `c` has just been welcomed: if it belongs to a drain or shed whose
 * frames went out before, tell it now, with what is left of the window. */
void drain_welcomed(drain_t *d, conn_t *c);

/* `c` is closing: one that was told to move and that left by itself (its
 * close frame, or its connection ending, first: not ws_close) counts as
 * migrated; a stream waiting for its moment leaves the drain's heap of
 * moments, so that the drain keeps nothing of it. Every close path calls
 * it (the session's on_close); idempotent. */
void drain_conn_closing(drain_t *d, conn_t *c);

/* What the drain's timer does, at util_mono_ms(): the frames once the
 * peers' read is late, the windows' ends, the paced closes, the stop. The
 * timer calls it (every pacing period while closes are queued, else every
 * 20 ms); a test on a fake clock calls it after moving the clock. Calling
 * it again at the same time changes nothing. Loop thread. */
void drain_tick(drain_t *d);

/* For tests (tests/unit/fixture.c calls it after every loop turn): 0 when
 * the streams' heap of moments holds its invariants (each entry due no
 * later than its children; each entry's mark names its place), -1 with a
 * log line saying which does not. O(streams waiting). Loop thread. */
int drain_check(const drain_t *d);

/* How far the drain (once begun), else the current or last shed, has got:
 * connections told to move, those that left by themselves, those closed
 * with 1012; and while draining, the WebSocket connections still open. */
typedef struct {
  int told, moved, closed;
  int remaining;
} drain_progress_t;
void drain_progress(const drain_t *d, drain_progress_t *out);

/* 0 ready, 1 draining, 2 shedding (converger_drain_state). */
int drain_state(const drain_t *d);

#endif
