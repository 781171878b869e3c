/*
 * pgnotify: the cross-node half of the bus, on PostgreSQL LISTEN/NOTIFY.
 *
 * Every node keeps one LISTEN connection on its loop (libpq in
 * non-blocking mode under a uv_poll; application_name "converger listen
 * NODE_ID" in pg_stat_activity). The append transaction of any node
 * notifies (store.h, STORE_NOTIFY_CHANNEL); what the listener hears goes to
 * bus_publish, the same fan-out as the in-process bus: a message with its
 * frame, or a head hint when the frame did not fit the payload limit
 * (subscribers read it from the store). Channel state changes go to
 * bus_channel_changed. The payloads' format is store/notify.h's.
 *
 * Outages: a connection that fails, or does not answer a keepalive query
 * within PGNOTIFY_PING_TIMEOUT_MS, is closed and opened again every
 * PGNOTIFY_RETRY_MS. Notifications sent while it was down are lost, so
 * each time LISTEN is (re)established the node reads the head and channel
 * state of every conversation with a local subscriber (one pool job) and
 * publishes a head hint for each: a live subscriber that missed something
 * fills the gap from the store, one whose channel was deactivated ends.
 * While the listener is not listening, the node is not ready (/readyz).
 *
 * Thread: loop only.
 */
#ifndef CONVERGER_BUS_PGNOTIFY_H
#define CONVERGER_BUS_PGNOTIFY_H

#include <uv.h>

#include "bus/bus.h"
#include "store/pool.h"

#define PGNOTIFY_RETRY_MS        500  /* between connection attempts */
#define PGNOTIFY_PING_EVERY_MS   2000 /* keepalive query on an idle connection */
#define PGNOTIFY_PING_TIMEOUT_MS 3000 /* no answer to a query: the connection is lost */

typedef struct pgnotify_s pgnotify_t;

/* Start listening on the database at `url` (a PostgreSQL URL or keyword
 * string; copied) on `loop`: what is heard goes to `bus`; the resync after
 * an outage runs on the pool `*pool` (borrowed, read at each use: NULL once
 * the owner has closed the pool). `node_id` names the connection
 * (application_name; copied). Connecting happens in the background (not
 * ready until LISTEN is established). On success *out is the listener,
 * freed by pgnotify_close. Returns 0, -CV_EINVAL for a URL libpq cannot
 * parse, -CV_ENOMEM. */
int pgnotify_start(uv_loop_t *loop, bus_t *bus, pool_t *const *pool, const char *node_id,
                   const char *url, pgnotify_t **out);

/* 1 while LISTEN is established, else 0. */
int pgnotify_listening(const pgnotify_t *l);

/* Close the connection and free the listener once its handles are closed.
 * Call after pool_close (a resync job holds the listener). */
void pgnotify_close(pgnotify_t *l);

#endif
