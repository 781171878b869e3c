/*
 * serve: `converger serve`: parse settings, start the pool, the bus and the
 * listener, run the loop, and shut down on SIGTERM/SIGINT (stop accepting,
 * close every WebSocket with 1001, finish in-flight pool jobs, exit 0).
 */
#ifndef CONVERGER_SERVE_H
#define CONVERGER_SERVE_H

#include <uv.h>

#include "core/config.h"

/* Runs a node until it is stopped. argv excludes "serve". Returns the
 * process exit status: 0 after a clean stop, 1 on a start-up failure, 2 on
 * a bad setting. */
int serve_main(int argc, char **argv);

typedef struct node_s node_t;

/* Build a node from `cfg` (borrowed: it must outlive the node; its secrets
 * already loaded, config_load_secrets) on `loop`, which must hold no other
 * handles and must not have run yet, and start it: the store pool, the
 * bus, the listeners, the timers, the SIGTERM/SIGINT/SIGHUP handlers and
 * the heartbeat, then phase ready (lifecycle.h). `key_from_file`: the API
 * key came from the data directory (the start-up line says where it is).
 * Then run the loop: uv_run returns once the node has stopped (a signal,
 * POST /admin/drain, node_drain or node_stop, and lifecycle_tick). Returns
 * 0 with *out, or 1 after logging why, with everything it made closed
 * and freed (*out NULL) and nothing else: handles the caller had on
 * `loop` before the call stay open and active (the loop is turned until
 * the node's own are gone). serve_main calls it with the default loop; tests
 * call it with a loop of their own. Loop thread. */
int node_open(uv_loop_t *loop, config_t *cfg, int key_from_file, node_t **out);

/* Free a node whose loop has returned from uv_run (every handle closed),
 * or NULL. The caller then closes the loop. Loop thread. */
void node_free(node_t *node);

#endif
