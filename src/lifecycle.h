/*
 * lifecycle: a node's phases, from start to exit, in one place.
 *
 *   starting --lifecycle_ready--> ready --node_drain--> draining
 *      (starting lasts while a PostgreSQL store is unreachable at start:
 *      lifecycle_store_wait retries it with backoff)
 *      (SIGTERM, POST /admin/drain; drain/shed are gate/drain.c's policy)
 *   ready or draining --node_stop--> stopping
 *      (SIGINT; SIGTERM with CONVERGER_DRAIN_SHUTDOWN_MS=0; the drain done
 *      or out of time)
 *   stopping --lifecycle_tick--> stopped (connections gone and the pool
 *      joined) --lifecycle_tick--> the loop ends
 *
 * node->phase (node.h) is the only lifecycle state; /readyz, /admin/status
 * and the membership row derive their words from it (node_phase_name).
 * lifecycle.c reads from top to bottom what happens from the signal to the
 * exit. Loop thread only.
 */
#ifndef CONVERGER_LIFECYCLE_H
#define CONVERGER_LIFECYCLE_H

#include <stdint.h>

#include "node.h"

/* Install SIGTERM and SIGINT on node->loop (node->sigterm, node->sigint):
 * SIGTERM drains (or stops at once when drain_shutdown_ms is 0), a second
 * one is ignored; SIGINT stops at once, a second one exits with 130. */
void lifecycle_signals_start(node_t *node);

/* starting -> ready: everything is wired and the listener is open. */
void lifecycle_ready(node_t *node);

/* Whether a failure `err` of opening the store at `url` may pass by
 * itself, so that the node keeps trying: on PostgreSQL any error but
 * -CV_EINVAL (a URL libpq cannot parse, a database not in UTF8: the
 * configuration) and -CV_ENOMEM; on SQLite none (an unopenable path is the
 * configuration's, and the file is local: no outage to wait out). */
int lifecycle_store_retryable(const char *url, int err);

/* The store could not be opened at start (`err`, retryable): stay in
 * starting, answering /livez 200 and /readyz 503 with the reason, and try
 * again in the background (pool_prepare on libuv's thread pool, so the
 * loop keeps answering) after a backoff with equal jitter, from
 * STORE_RETRY_BASE_MS doubling up to STORE_RETRY_CAP_MS, each attempt
 * logged once. When it opens: node_store_opened (-> ready). A
 * non-retryable error on a later attempt stops the node with exit status
 * 1. After node_stop, no attempt starts and one in flight is discarded. */
#define STORE_RETRY_BASE_MS 250
#define STORE_RETRY_CAP_MS  5000
void lifecycle_store_wait(node_t *node, int err);

/* Called on every tick: in stopping, once no connection and no pool job
 * is left (or the stop deadline passed) the pool is joined (stopped); in
 * stopped, once the last close callback ran, the bus, the drain and the
 * node's handles are closed so that uv_run returns. */
void lifecycle_tick(node_t *node, uint64_t now_ms);

#endif
