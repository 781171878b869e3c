/*
 * session_int.h: what the files of a protocol session share (internal to
 * src/proto; callers use session.h). The session is split by concern:
 *   session.c  the session: dispatch of client frames, ticks, close, free,
 *              sending helpers, revocation, channel ends, shutdown
 *   sub.c      a subscription: its state machine, live delivery, pending
 *              messages, epochs
 *   fill.c     its store jobs: fills (replay, gap fill), syncs, subscribes
 *   hello.c    the hello with its admission (acquire, release, cancel)
 *   send.c     a `send` frame and its store job
 * Loop thread only, as session.h.
 */
#ifndef CONVERGER_PROTO_SESSION_INT_H
#define CONVERGER_PROTO_SESSION_INT_H

#include <jansson.h>
#include <stdint.h>

#include "bus/bus.h"
#include "gate/admission.h"
#include "gate/auth.h"
#include "gate/drain.h"
#include "gate/limiter.h"
#include "proto/frames.h"
#include "proto/session.h"

#define PENDING_MAX    10000         /* live messages buffered per subscription during a fill */
#define PAGE_BYTES     (256 * 1024)  /* bytes of bodies in one replay page */
#define HELLO_BYTES    (1024 * 1024) /* bytes of first pages in one hello job, all subs */
#define OUT_HIGH_WATER (1024 * 1024) /* queued output above which replay pauses */

/* A subscription's state (the transition table is in sub.c's design
 * block). Every state but SUB_LIVE holds live messages in `pending`. */
typedef enum {
  SUB_LIVE = 0, /* live messages go out as they come */
  SUB_QUEUED,   /* a client's sync waits for an admission slot */
  SUB_FILLING,  /* a store job (the hello's, a sync's, a fill's) is out */
  SUB_DEFERRED, /* a fill waits for the output to drain (session_on_writable) */
  SUB_RETRY,    /* a failed fill waits for retry_at (session_tick) */
  SUB_NSTATES
} sub_state_t;

typedef struct sub_s {
  bus_sub_t bus;
  admission_waiter_t adm;              /* a sync waiting for, or holding, an admission slot */
  int64_t adm_watermark;               /* that sync's watermark */
  char adm_epoch[STORE_EPOCH_MAX + 1]; /* and its epoch ("" when not given) */
  struct fill_job_s *sync_job;         /* that sync's store job while it is in the pool */
  struct sub_s *next;
  session_t *session;
  uint64_t gen;               /* the session's number for it: a store job finds its own
                                 subscription, not a later one of the same conversation */
  unsigned announced : 1;     /* its welcome entry or `subscribed` was sent */
  unsigned after_welcome : 1; /* a subscribe that came before the welcome: QUEUED until then */
  unsigned presence : 1;      /* the channel's presence setting, as the store said */
  unsigned signals : 1;       /* the channel's signals setting, as the store said */
  unsigned present : 1;       /* counted in ss->presence (announced, channel with presence) */
  int presence_events;        /* FRAME_EVENTS_*: join and leave frames asked for */
  /* `subscribe` frames of it not answered yet, each owed one answer
   * (docs/protocol.md 4.5): the one that made it, until its `subscribed`
   * or an error, and those sent while it was not announced (made by a
   * subscribe or by the hello), answered when it is announced
   * (sub_answer_already) or ends (sub_refuse, sub_end). 0 once
   * announced. Bounded by the subscribe rate (section 4.8). */
  unsigned answers_owed;
  char *channel; /* its channel's id, heap, as the store named it when announced; NULL before */
  char epoch[STORE_EPOCH_MAX + 1]; /* the conversation's epoch, as the store last said */
  int64_t delivered;
  int reset_pending; /* the next synced says "reset": a sync or fill found the history changed */
  sub_state_t state;
  /* What the fill under way owes when it finishes (any state but LIVE): */
  int overflow;     /* `pending` overflowed and was forgotten: fill up to the head */
  int sync_pending; /* a client's sync came meanwhile: run it (sync_watermark, sync_epoch) */
  int64_t sync_watermark;
  char sync_epoch[STORE_EPOCH_MAX + 1];
  uint64_t retry_at; /* SUB_RETRY: monotonic ms at which the fill starts again */
  /* SUB_DEFERRED: the fill to start once the output has drained */
  int64_t deferred_after, deferred_upto;
  int deferred_synced;
  bus_msg_t **pending;
  size_t npending, cap;
  size_t pending_bytes; /* frame bytes held in pending */
  char conv[];          /* its conversation's id, as long as it is (sub_new) */
} sub_t;

struct hello_job_s;

/* The frames a connection's rate limits count (docs/protocol.md 4.8). */
typedef enum { RATE_SEND, RATE_SUBSCRIBE, RATE_REFRESH, RATE_SIGNAL, RATE_KINDS } rate_kind_t;

typedef struct {
  limiter_t bucket;
  double per_s;       /* its rate; 0: no limit */
  uint64_t second;    /* the monotonic second `count` is of */
  uint32_t count;     /* frames of this kind in that second, refused ones too */
  uint32_t abusive;   /* whole seconds in a row at or over rate_abuse_factor x the rate */
  uint64_t next_slot; /* monotonic ms of the next refused frame's turn (its hint) */
} rate_t;

struct session_s {
  admission_waiter_t adm;            /* the hello waiting for, or holding, an admission slot */
  struct hello_job_s *hello;         /* the hello job waiting for its slot */
  struct hello_job_s *hello_running; /* the hello job in the pool */
  conn_t *conn;
  sessions_t *ss;
  uint64_t id;
  uint64_t hello_ms; /* monotonic: the hello came (converger_hello_latency_ms) */
  /* Who it is, from its hello and its token (token.c, session_token_set):
   * the strings at their own lengths in one heap block, `ids`, which the
   * session owns and a refresh replaces. All NULL until the hello's
   * token is taken. */
  char *ids;             /* the block: client_id, user, jti, then the convs */
  const char *client_id; /* hello's clientId, or "s-<16 hex>" for this connection alone */
  const char *user;      /* the token's sub */
  const char *jti;       /* the token's jti (session_revoke_jti) */
  const char *convs;     /* the token's convs: nconvs strings, each NUL-terminated, in a row */
  uint32_t nconvs;
  unsigned hello_seen : 1;   /* its hello was accepted (the token taken): no second one */
  unsigned user_counted : 1; /* counted in ss->users under `user` */
  unsigned all_convs : 1;    /* the token's convs held "*" */
  unsigned can_read : 1;     /* the token's scope */
  unsigned can_write : 1;
  uint64_t expires_at; /* monotonic ms at which the token's exp passes (token.c) */
  rate_t
      *rate; /* [RATE_KINDS], made at the first frame a rate counts: an idle connection has none */
  sub_t *subs;
  uint64_t last_sub_gen;   /* the last sub_t.gen given */
  uint64_t retry_due;      /* the earliest retry_at of its subscriptions; 0: none */
  drain_mark_t drain_mark; /* this connection's drain state (gate/drain.h) */
};

/* ---- session.c ---- */

/* Send `text` (heap, taken; NULL: out of memory, close 1011). */
void session_send_owned(conn_t *c, char *text);
/* `error not_found` (status -CV_ENOTFOUND) or `error channel_inactive`
 * (any other: -CV_EINACTIVE) for `conv`, the answer to a hello entry, a
 * subscribe or a send whose conversation the store did not have or had
 * inactive. Steals `details`. */
void session_send_conv_error(conn_t *c, int status, const char *conv, json_t *details);
/* session_send_conv_error's code for `status`, and its message in
 * `*message` (static strings). */
const char *session_conv_error(int status, const char **message);
/* `error` frame (frames.h: frame_error; `details` stolen). */
void session_send_error(conn_t *c, const char *code, const char *message, const char *conv,
                        long retry_after_ms, json_t *details);
/* converger_handshakes_total{result}. */
void session_count_handshake(sessions_t *ss, const char *result);
/* `error unavailable` with a retry hint, then close 1013 with the same hint
 * (the admission-queue decision record). Steals `details`. */
void session_refuse_unavailable(conn_t *c, const char *message, const char *conv, json_t *details);
/* The subscription of `conv`, or NULL. */
sub_t *session_find_sub(session_t *s, const char *conv);
/* session_find_sub, and NULL unless it is the subscription numbered `gen`
 * (a store job's own). */
sub_t *session_find_sub_gen(session_t *s, const char *conv, uint64_t gen);
/* 1 when the last change of `channel` since the bus's change `gen`
 * deactivated it (bus_channel_last_change_since). */
int session_deactivated_since(sessions_t *ss, uint64_t gen, const char *channel);
/* converger_protocol_admission_wait_ms{result}. */
void session_observe_admission(sessions_t *ss, const char *result, uint64_t waited_ms);

/* ---- sub.c: the state machine, live delivery, epochs ---- */

/* Move `sub` to `to`: a transition of the table in sub.c's design block.
 * Returns 0, or -CV_EINVAL for a move outside the table, which is refused
 * in every build: the state stays, a "BUG:" line is logged, the series
 * converger_subscription_transitions_refused_total{from,to} counts it and
 * the connection is closed with 1011 (internal error), so the client
 * resumes from its watermark. A caller that gets -CV_EINVAL does nothing
 * more for the subscription. Loop thread. (STYLE.md: a guard must hold in
 * the build users run, as SQLite's NEVER() does.) */
int sub_set_state(sub_t *sub, sub_state_t to);
/* The state's name, for logs and tests ("live", "queued", ...). */
const char *sub_state_name(sub_state_t st);

/* The bus's delivery callback of a subscription (bus_sub_t.deliver). */
void sub_deliver_cb(bus_sub_t *bs, bus_msg_t *m);
/* The fill reached `head`: synced if asked, then what waited. */
void sub_fill_finish(sub_t *sub, int64_t head, int synced);
/* A new subscription of `conv` in `s`, in the bus index (live messages
 * kept from now on), state LIVE with nothing delivered: the caller moves
 * it on at once. Linked first in s->subs. NULL on OOM. */
sub_t *sub_new(session_t *s, const char *conv);
/* Leave the session, the admission queue (a store job not started is taken
 * back) and the bus, and free. */
void sub_remove(session_t *s, sub_t *sub);
/* End `sub` and tell the client, in this order (docs/protocol.md 4.6,
 * 4.7, section 6): `error code` with its conv, then sub_remove, then
 * `unsubscribed`. The error goes out once for each subscribe of `sub`
 * still owed its answer (sub_t.answers_owed: the error is that answer),
 * and, when `told`, once for a subscription owed none: an end the client
 * did not ask for (its channel deactivated, its token narrowed). An
 * unsubscribe (the client's or an operator's) passes `told` 0 with
 * `cancelled`. The one place for this order. Loop thread. */
void sub_end(sub_t *sub, const char *code, const char *message, int told);
/* The subscription `sub` was being made for is refused (a subscribe's or
 * a hello entry's store read: not found, inactive, failed; no admission
 * slot): each subscribe of it still owed its answer gets `error code`
 * with its conv (and `retry_after_ms` when > 0), then sub_remove. A hello
 * entry's own error is the caller's. No `unsubscribed`: it never existed
 * for the client (docs/protocol.md 4.5). Loop thread. */
void sub_refuse(sub_t *sub, const char *code, const char *message, long retry_after_ms);
/* `sub` was just announced (its `subscribed`, or its welcome entry, is
 * out, and `delivered` set): each further subscribe of it still owed its
 * answer gets `subscribed` with "already": true, as one sent now would
 * (docs/protocol.md 4.5). answers_owed is 0 afterwards. Loop thread. */
void sub_answer_already(sub_t *sub);
/* The store named the subscription's channel `channel` (a hello's or a
 * subscribe's job, at the announce): a copy at its own length from now
 * on. 0 or -CV_ENOMEM (the subscription as it was). */
int sub_set_channel(sub_t *sub, const char *channel);
/* Why a resume is answered with reset (a metric label), or NULL. */
const char *sub_reset_reason(int64_t watermark, const char *epoch, const store_conv_t *info);
/* converger_resets_total{reason}. */
void sub_count_reset(sessions_t *ss, const char *reason);

/* ---- fill.c: the subscription's store jobs (fills, syncs, subscribes) ---- */

/* Read from the store after `after` up to `upto` (< 0: the head), then, if
 * `synced`, send synced; live messages wait meanwhile. */
void sub_fill_start(sub_t *sub, int64_t after, int64_t upto, int synced);
/* Send replayed messages above `delivered`, in order. */
void sub_send_replay(sub_t *sub, const store_msg_t *msgs, size_t n);
/* A client's sync from `watermark` in `epoch` (""): through admission. */
void sub_sync(sub_t *sub, int64_t watermark, const char *epoch);
/* The subscription ends (sub_remove): its sync's or subscribe's job, if
 * it has not started, is taken back from the pool; one that runs keeps
 * the admission slot the subscription held, and gives it back when it
 * returns. */
void sub_cancel_sync_job(sub_t *sub);
/* A `subscribe` the session has checked (token, duplicates, the count):
 * through admission, then one store job (conversation, head, first page),
 * then `subscribed`, the replay and `synced` (docs/protocol.md 4.5). */
void sub_subscribe(session_t *s, const char *conv, int64_t watermark, const char *epoch,
                   int presence_events);
/* The welcome is out: the subscribes that came before it ask for their
 * admission slots now. */
void sub_after_welcome(session_t *s);
/* The connection closes: a sync waiting for a slot leaves the queue
 * (sub_leave); a sync whose store job has not started takes it back and
 * gives its slot back (sub_cancel). session_on_close calls every leave
 * before any cancel. */
void sub_leave(sub_t *sub, uint64_t now);
void sub_cancel(sub_t *sub, uint64_t now);

/* ---- token.c ---- */

/* Take the verified token `t` as the session's, with `client_id` (may
 * point into the block it replaces): its strings and scope are copied into
 * a new `ids` block, which replaces the old one, and its exp goes onto the
 * monotonic clock. `t` is cleared (auth_token_clear) either way. 0, or
 * -CV_ENOMEM with the session as it was. */
int session_token_set(session_t *s, auth_token_t *t, const char *client_id);
/* 1 when the session's token lets it read (subscribe to, sync) `conv`,
 * or write to it (send, signal): its scope has it and its convs cover
 * it, as auth_token_allows. */
int session_may_read(const session_t *s, const char *conv);
int session_may_write(const session_t *s, const char *conv);
/* ms until the session's token expires (<= 0: past), leeway not counted. */
int64_t session_token_expires_in(const session_t *s, uint64_t now);
/* A refresh frame (docs/protocol.md 4.7). */
void session_handle_refresh(session_t *s, frame_client_t *f);
/* The tick's check: past exp + token_leeway_ms, `error token_expired`
 * and close 1008 "token_expired". Returns 1 when it closed. */
int session_check_expiry(session_t *s, uint64_t now);

/* ---- ephemeral.c: presence and signals (docs/protocol.md 4.9, 4.10) ---- */

/* `sub` is announced: when its channel has presence, its client is
 * present from now on (on one node, a join is told at once). */
void session_presence_on(sub_t *sub);
/* `sub` ends (sub_remove): its client's connection count goes down, and
 * at 0 its grace begins. */
void session_presence_off(sub_t *sub);
/* Worker thread, in the hello's or a subscribe's store job (its one
 * checkout): in a cluster, the client's row says it is present through
 * this node. 1 when written and the client joined (it had no row on any
 * node), 0 when written, -1 when not (logged; the subscription goes on).
 * The job's done then calls session_presence_orphan. */
int session_presence_store_join(sessions_t *ss, store_t *db, const char *conv, const char *client,
                                const char *user);
/* A job wrote the client's row (`joined`: its answer was a join): unless
 * the client is present here already, it is in its grace from now on, so
 * that its row goes when no subscription of it is announced in time (one
 * that ended meanwhile). A client made anew whose row was there already
 * had its grace end while the job ran: its row is written again, in case
 * that grace's leave deletes it. */
void session_presence_orphan(sessions_t *ss, const char *conv, const char *user, const char *client,
                             int joined);
/* A presence frame, a signal frame. */
void session_handle_presence(session_t *s, frame_client_t *f);
void session_handle_signal(session_t *s, frame_client_t *f);

/* ---- hello.c, send.c ---- */

/* A hello frame (the first frame of the connection). */
void session_handle_hello(session_t *s, frame_client_t *f);
/* A send frame. */
void session_handle_send(session_t *s, frame_client_t *f);
/* The connection closes: the hello's waiter leaves the queue (leave); a
 * hello job not started is taken back and its slot given back (cancel). */
void session_hello_leave(session_t *s, uint64_t now);
void session_hello_cancel(session_t *s, uint64_t now);

#endif
