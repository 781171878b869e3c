/*
 * membership: this node's row in the cluster's membership table (the store's
 * `nodes` table, shared by every node on one database).
 *
 * Every MEMBERSHIP_BEAT_MS the node upserts its row (store_node_beat) with
 * its id, CONVERGER_PUBLIC_URL, state ("ready", or "draining" once it is
 * stopping), WebSocket connections and admission waiters, stamped with the
 * wall clock when the worker writes it. A node whose row is older than
 * MEMBERSHIP_MAX_AGE_MS is gone: GET /admin/cluster lists the others.
 *
 * Thread: loop thread; the writes run as pool jobs (kind "membership",
 * never dropped by the queue-delay rule, at most one in flight: a beat that
 * comes while the previous one still runs is skipped, not queued). Each
 * beat holds a pool worker for one store call: with a slow store the beat
 * and the revocation refresh can each keep a worker busy.
 */
#ifndef CONVERGER_CLUSTER_MEMBERSHIP_H
#define CONVERGER_CLUSTER_MEMBERSHIP_H

#include <stdint.h>
#include <uv.h>

#include "core/config.h"
#include "store/pool.h"

#define MEMBERSHIP_BEAT_MS 1000
/* Gone after three missed beats. A row written at t is still live at
 * t + 3000 (three beats have been missed only once the fourth is due), and
 * the 500 ms slack absorbs a beat that waited in the pool queue or a slow
 * write, and small wall-clock differences between nodes, so a live node
 * under load does not flicker out of the list. A SIGKILLed node drops out
 * 3.5 to 4.5 s after its last beat. */
#define MEMBERSHIP_MAX_AGE_MS (3 * MEMBERSHIP_BEAT_MS + 500)

/* What this node's row says now: filled by the owner's callback. */
typedef struct {
  int draining;        /* 1: "draining" (draining or stopping), 0: "ready" */
  int64_t connections; /* WebSocket connections */
  int64_t waiters;     /* admission waiters */
  int64_t capacity;    /* connections it is sized for; 0: not set */
  /* > 0: after the beat, the same job deletes the presence rows of nodes
   * whose row is older than this (store_presence_sweep): a SIGKILLed
   * node's clients leave after MEMBERSHIP_MAX_AGE_MS plus the grace. */
  int64_t presence_max_age_ms;
} membership_row_t;
typedef void (*membership_row_cb)(void *ud, membership_row_t *out);

typedef struct membership_s {
  uv_timer_t timer;
  pool_t *const *pool; /* the owner's pool pointer (NULL once closed) */
  const config_t *cfg; /* node_id, public_url */
  membership_row_cb row;
  void *ud;
  int in_flight;     /* a beat job was submitted and its done has not run */
  int again;         /* membership_beat_now during a beat: one more when it is done */
  int failing;       /* the last beat failed (logged once per run of failures) */
  uint64_t ok_since; /* monotonic ms since when beats have not failed (the sweep waits) */
  /* Optional, set before membership_start: a beat succeeded after a run
   * of failures (other nodes may have swept this node's presence rows).
   * Loop thread. */
  void (*recovered)(void *ud);
} membership_t;

/* Init the timer on `loop` and beat now, then every MEMBERSHIP_BEAT_MS,
 * on the pool `*pool` (borrowed, read at each beat), with the id and URL
 * of `cfg` (borrowed) and what `row(ud, ...)` says. After pool_start. */
void membership_start(membership_t *m, uv_loop_t *loop, pool_t *const *pool, const config_t *cfg,
                      membership_row_cb row, void *ud);

/* Shutdown (node_stop, lifecycle.c): stop and close the timer. When no pool job is in
 * flight, one last beat says "draining", so other nodes stop sending
 * clients here before the row ages out; with work in flight (a slow or
 * unreachable store) it is skipped, because anything submitted now delays
 * the exit by a whole store call. No beat is submitted afterwards. */
void membership_stop(membership_t *m);

/* Beat now (unless a beat is in flight) instead of at the next period: the
 * state changed (a drain began) and peers should know at once. */
void membership_beat_now(membership_t *m);

#endif
