/*
 * session: protocol v1 over one WebSocket connection (docs/protocol.md).
 *
 * Owns the connection's subscriptions. Each subscription is in the bus
 * index from the moment its hello is accepted, before the head is read, so
 * nothing committed during the handshake is missed: live messages that
 * arrive while a replay or gap fill runs are buffered and delivered after
 * it, without gap or duplicate. Delivery rule: a message goes out when its
 * seq is the subscription's last delivered seq + 1; a lower seq is skipped;
 * a higher one triggers a gap fill from the store.
 * Loop thread only.
 */
#ifndef CONVERGER_PROTO_SESSION_H
#define CONVERGER_PROTO_SESSION_H

#include <stddef.h>

#include "net/conn.h"
#include "node.h"

/* Attach a new session to an upgraded connection. 0 or -CV_ENOMEM. */
int session_start(conn_t *c);

/* One complete text message from the client. */
void session_on_text(conn_t *c, const char *text, size_t len);

/* Per-tick checks (hello timeout, heartbeat). `now` is monotonic ms. */
void session_tick(conn_t *c, uint64_t now);

/* The connection's queued output fell below the low-water mark: resume
 * replay pages that were paused (conn.c calls this). */
void session_on_writable(conn_t *c);

/* Add the deliveries counted since the last call to
 * converger_messages_delivered_total (once per tick: the hot path counts in
 * a plain integer). */
void session_flush_metrics(node_t *node);

/* The connection is ending (its close frame is queued, or its socket is
 * closing): a hello or sync waiting for an admission slot leaves the queue,
 * and a held slot whose store job has not started is given back with the
 * job; a slot whose job runs is given back when the job returns. Idempotent.
 * ws_close and conn_close call it. */
void session_on_close(session_t *s);

/* The connection is going away: leave the bus index and free. */
void session_free(session_t *s);

/* Close, with `error unauthorized` then 1008, every session whose token has
 * this jti (token revocation), or, when jti is NULL, whose jti is in the
 * node's revocation cache (one pass over the connections). */
void session_revoke_jti(node_t *node, const char *jti);

/* The bus says `channel` was activated or deactivated (bus.h,
 * channel_changed): live subscribers of a deactivated channel get `error
 * channel_inactive` and their subscription ends; handshakes in flight
 * check the bus's record of changes. */
void session_channel_changed(node_t *node, const char *channel, int active);

/* Close every session with `code` and `reason` (shutdown). */
void session_close_all(node_t *node, int code, const char *reason);

#endif
