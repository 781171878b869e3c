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

#include "bus/bus.h"
#include "common/jitter.h"
#include "core/config.h"
#include "core/metrics.h"
#include "gate/admission.h"
#include "gate/auth.h"
#include "gate/drain.h"
#include "gate/users.h"
#include "net/conn.h"
#include "store/pool.h"

/* What a node's sessions work with (borrowed from the node, which fills
 * it before it listens and outlives every session) and their counters. */
typedef struct sessions_s {
  const config_t *cfg;
  pool_t *const *pool; /* the node's pool pointer: NULL once closed */
  bus_t *bus;          /* subscriptions and fan-out */
  auth_t *auth;        /* tokens and the revocation cache */
  admission_t *admission;
  drain_t *const *drain;        /* the node's drain pointer: NULL once closed */
  net_t *net;                   /* every connection (revocation, shutdown) */
  jitter_rng_t *rng;            /* retry hints */
  metrics_t *metrics;           /* the node's registry (core/metrics.h) */
  users_t *users;               /* connections per user (CONVERGER_MAX_CONNS_PER_USER) */
  struct presence_s *presence;  /* who is present (proto/presence.h) */
  int shared;                   /* a cluster store (PostgreSQL): presence and signals go
                                   through it and come back through the bus */
  uint64_t next_session;        /* the last session id given */
  uint64_t delivered_unflushed; /* deliveries not yet in their metric */
} sessions_t;

/* Attach a new session of `ss` to an upgraded connection. 0 or
 * -CV_ENOMEM. */
int session_start(sessions_t *ss, conn_t *c);

/* The drain state of the session's connection (gate/drain.h); NULL for no
 * session. */
drain_mark_t *session_drain_mark(session_t *s);

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
void session_flush_metrics(sessions_t *ss);

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
void session_revoke_jti(sessions_t *ss, const char *jti);

/* The bus says `channel` was activated or deactivated (bus.h,
 * channel_changed): live subscribers of a deactivated channel get `error
 * channel_inactive` and their subscription ends; handshakes in flight
 * check the bus's record of changes. */
void session_channel_changed(sessions_t *ss, const char *channel, int active);

/* POST /admin/users/{user}/disconnect (here, or announced by another
 * node): close every connection of `user` (the token's sub) on this node
 * with `code`; the close reason is `reason` (at most 80 bytes), or with
 * retry_after_ms > 0 the JSON {"retryAfterMs": n, "reason": reason} that
 * clients read as a hint (docs/protocol.md, section 7). Returns how many. */
int session_disconnect_user(sessions_t *ss, const char *user, int code, const char *reason,
                            long retry_after_ms);

/* POST /admin/users/{user}/unsubscribe: end `user`'s subscriptions of
 * `conv` on this node, each told with `unsubscribed` (after `error
 * cancelled` with its conv for one whose subscribe was not answered yet:
 * docs/protocol.md 4.6). Returns how many. */
int session_unsubscribe_user(sessions_t *ss, const char *user, const char *conv);

/* Presence and signals heard from the bus (store/notify.h:
 * NOTIFY_PRESENCE_JOIN, NOTIFY_PRESENCE_LEAVE, NOTIFY_SIGNAL): told to
 * this node's subscribers of the conversation. Loop thread. */
void session_ephemeral(sessions_t *ss, const notify_t *n);

/* A signal for `conv` (docs/protocol.md 4.10) from `sender` at wall ms
 * `ts_ms`, `body` its JSON text: one `signal` frame to every announced
 * subscription of `conv` on this node. Returns how many. Loop thread. */
int session_signal_deliver(sessions_t *ss, const char *conv, const char *sender, int64_t ts_ms,
                           const char *body);

/* Clients whose presence grace ended by `now` (monotonic ms) leave: told
 * to subscribers on one node; in a cluster, their rows are deleted (the
 * leave comes back through the bus). Every tick. */
void session_presence_tick(sessions_t *ss, uint64_t now);

/* In a cluster, at start: this node's presence rows from before (a
 * restart with the same node id) go into their grace, so a client that
 * reconnects in time never leaves and one that does not leaves then. */
void session_presence_restore(sessions_t *ss);

/* In a cluster, after this node's heartbeat failed and works again:
 * other nodes may have swept its presence rows as a gone node's; every
 * client of its table is written again (each a join if it was swept). */
void session_presence_rewrite(sessions_t *ss);

/* A page of the users present in `conv` after `after` ("" or NULL: the
 * first), at most `limit`, as frame_presence's JSON (heap; NULL on OOM):
 * from this node's table on one node (`rows` unused), or in a cluster
 * from `rows`, store_presence_list's answer for limit + 1 with its
 * `count`. Only the first max_presence users are listed. Loop thread. */
char *session_presence_page(sessions_t *ss, const char *conv, const char *after, int limit,
                            int members, const store_member_t *rows, size_t nrows, int64_t count);

/* Server-Sent Events (docs/protocol.md 12, proto/sse.c). */

/* The watermark and epoch of `conv` in a Last-Event-ID (NULL or "", or
 * entries joined by ',', each "CONV SEQ EPOCH" as session_sse_id writes
 * them or "CONV SEQ"; one space apart, SEQ decimal digits within int64_t,
 * CONV and EPOCH ids, each CONV once), or FRAME_WATERMARK_NONE and ""
 * when it names none. 0; -1 when the id is not of that form, a
 * conversation named twice included (the caller answers 400; a browser's
 * EventSource sends back only ids this node wrote, which name each
 * conversation once); -CV_ENOMEM when out of memory. On an error
 * *watermark and epoch are NONE and "". Any thread. */
int session_sse_watermark(const char *last_event_id, const char *conv, int64_t *watermark,
                          char epoch[STORE_EPOCH_MAX + 1]);

/* The event id of stream `s` now: every announced subscription's
 * watermark (the last seq sent, or where the stream starts) and epoch,
 * "CONV SEQ EPOCH" entries joined by ',' in no particular order, as
 * session_sse_watermark reads them; "" while no subscription is announced
 * (before the welcome). A stream's msg, welcome, synced, drain and close
 * events carry it (docs/protocol.md 12), so that the last id a client saw
 * resumes every subscription where the stream was. A buffer of the
 * thread's, valid until the next call; NULL when out of memory. Loop
 * thread. */
const char *session_sse_id(session_t *s);

/* The hello of a stream `c` (after ws_start_sse gave it its session):
 * `token`, `client_id` (NULL: the stream's own), the `n` conversations
 * (ids, checked by the caller, n <= max_subs) with their watermarks from
 * `last_event_id` (checked with session_sse_watermark), every one with
 * `presence_events` (FRAME_EVENTS_*). From here as a WebSocket hello: the
 * answer is the welcome (the stream begins) or a refusal. 0 or
 * -CV_ENOMEM (closed). */
int session_sse_begin(conn_t *c, const char *token, const char *client_id, const char *const *convs,
                      size_t n, const char *last_event_id, int presence_events);

/* Close every session with `code` and `reason` (shutdown). */
void session_close_all(sessions_t *ss, int code, const char *reason);

#endif
