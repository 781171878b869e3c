/*
 * rest: the HTTP routes of a node: REST API v1, health, metrics, admin, the
 * WebSocket endpoint and the demo page (docs/protocol.md). Loop thread;
 * store work runs as pool jobs.
 */
#ifndef CONVERGER_API_REST_H
#define CONVERGER_API_REST_H

#include "net/conn.h"
#include "node.h"
#include "net/http.h"

/* Answer `req` on `c` (now, or later from a pool job). Called by http.c
 * once per complete request; exactly one response follows. */
void rest_handle(conn_t *c, http_request_t *req);

/* Start the periodic revocation refresh (every revocation_refresh_ms). */
void rest_start_revocation_refresh(node_t *node);

/* Stop the refresh timer (shutdown). */
void rest_stop(node_t *node);

#endif
