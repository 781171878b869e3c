/*
 * lifecycle: a node's phases, from start to exit, in one place.
 *
 *   starting --lifecycle_ready--> ready --node_drain--> draining
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

/* Called on every tick: in stopping, once no connection and no pool job
 * is left (or the stop deadline passed) the pool is joined (stopped); in
 * stopped, once the last close callback ran, the bus, the drain and the
 * node's handles are closed so that uv_run returns. */
void lifecycle_tick(node_t *node, uint64_t now_ms);

#endif
