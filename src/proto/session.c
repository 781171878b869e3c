/*
 * session.c: a protocol session over one connection (session.h): the
 * dispatch of client frames, ticks, close and free, the sending helpers,
 * revocation, channel ends and shutdown. The hello is hello.c's, a
 * subscription's delivery sub.c's, its fills fill.c's, a send send.c's
 * (session_int.h).
 *
 * Owns: the session and its subscriptions (sub_t), each embedded in the bus
 * index. Thread: loop only; store work goes to the pool as jobs that copy
 * what they need and hold a reference on the connection. When a job comes
 * back, the subscription is looked up again by conversation (it may have
 * ended meanwhile).
 *
 * Invariants per subscription:
 *  - `delivered` is the last seq sent to the client; frames go out only as
 *    delivered + 1;
 *  - in every state but SUB_LIVE (a handshake replay, a sync, a gap fill;
 *    the states and their transitions are in sub.c), live messages are
 *    kept in `pending` (sorted by seq, bounded) and sent after the fill;
 *  - at most one fill job per subscription is in flight;
 *  - replay is paced by the connection's output: a page is read and sent
 *    only while less than OUT_HIGH_WATER bytes wait to be written, so a long
 *    history never piles up in memory or trips the slow-consumer limit;
 *  - a live subscriber whose output is above OUT_HIGH_WATER goes back to
 *    filling from the store (the store is its buffer), so a client that
 *    reads slowly catches up instead of being dropped;
 *  - a watermark is never silently moved to the head: a hello or sync whose
 *    watermark is above the head, or whose epoch is not the conversation's
 *    (docs/protocol.md, "Epochs and resets"), is answered with `reset`
 *    (in its welcome entry, or its synced) and continues from the head.
 */
#include "proto/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/metrics.h"
#include "net/ws.h"
#include "proto/session_int.h"

drain_mark_t *session_drain_mark(session_t *s) { return s ? &s->drain_mark : NULL; }

/* ---- sending -------------------------------------------------------------- */

void session_send_owned(conn_t *c, char *text) {
  if (!text) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  ws_send_text(c, text, strlen(text));
  free(text);
}

void session_send_error(conn_t *c, const char *code, const char *message, const char *conv,
                        long retry_after_ms, json_t *details) {
  session_send_owned(c, frame_error(code, message, conv, retry_after_ms, details));
}

const char *session_conv_error(int status, const char **message) {
  if (status == -CV_ENOTFOUND) {
    *message = "no such conversation";
    return "not_found";
  }
  *message = "the conversation's channel is inactive";
  return "channel_inactive";
}

void session_send_conv_error(conn_t *c, int status, const char *conv, json_t *details) {
  const char *message, *code = session_conv_error(status, &message);
  session_send_error(c, code, message, conv, 0, details);
}

void session_count_handshake(sessions_t *ss, const char *result) {
  char labels[64];
  snprintf(labels, sizeof labels, "result=\"%s\"", result);
  metrics_add(ss->metrics, "converger_handshakes_total", labels, 1);
}

/* `error unavailable` with a retry hint, then close 1013 with the same hint
 * in the reason (the admission-queue decision record). Steals `details`. */
void session_refuse_unavailable(conn_t *c, const char *message, const char *conv, json_t *details) {
  long hint = config_retry_hint(c->session->ss->cfg, c->session->ss->rng);
  char reason[48];
  session_send_error(c, "unavailable", message, conv, hint, details);
  snprintf(reason, sizeof reason, "{\"retryAfterMs\":%ld}", hint);
  ws_close(c, WS_CLOSE_TRY_AGAIN_LATER, reason);
}

/* ---- subscriptions and admission ------------------------------------------ */

sub_t *session_find_sub(session_t *s, const char *conv) {
  for (sub_t *sub = s->subs; sub; sub = sub->next)
    if (strcmp(sub->conv, conv) == 0) return sub;
  return NULL;
}

sub_t *session_find_sub_gen(session_t *s, const char *conv, uint64_t gen) {
  sub_t *sub = session_find_sub(s, conv);
  return sub && sub->gen == gen ? sub : NULL;
}

int session_deactivated_since(sessions_t *ss, uint64_t gen, const char *channel) {
  return bus_channel_last_change_since(ss->bus, gen, channel) == 0;
}

static size_t count_subs(const session_t *s) {
  size_t n = 0;
  for (const sub_t *sub = s->subs; sub; sub = sub->next) n++;
  return n;
}

/* A subscribe (v1.1, docs/protocol.md 4.5): the token must cover the
 * conversation; a second one for the same conversation is answered from
 * where the subscription is, without a replay: at once when it is
 * announced, else when it is (sub_answer_already), or with the error that
 * ends it (sub_refuse, sub_end), each subscribe its own answer in the
 * order sent; the connection holds at most max_subs. */
static void handle_subscribe(session_t *s, const frame_client_t *f) {
  conn_t *c = s->conn;
  if (!session_may_read(s, f->conv)) {
    metrics_add(s->ss->metrics, "converger_subscriptions_refused_total", "reason=\"forbidden\"", 1);
    session_send_error(c, "forbidden", "the token does not cover this conversation", f->conv, 0,
                       NULL);
    return;
  }
  sub_t *sub = session_find_sub(s, f->conv);
  if (sub) {
    sub->presence_events = f->presence_events; /* a second subscribe may change them */
    sub->answers_owed++; /* this one's answer: now when announced, else with the first's */
    if (sub->announced) sub_answer_already(sub);
    return;
  }
  if (count_subs(s) >= (size_t)s->ss->cfg->max_subs) {
    char why[96];
    snprintf(why, sizeof why, "this connection already has %d subscriptions", s->ss->cfg->max_subs);
    metrics_add(s->ss->metrics, "converger_subscriptions_refused_total",
                "reason=\"too_many_subscriptions\"", 1);
    session_send_error(c, "too_many_subscriptions", why, f->conv, 0, NULL);
    return;
  }
  sub_subscribe(s, f->conv, f->watermark, f->epoch, f->presence_events);
}

/* An unsubscribe: nothing of the conversation follows `unsubscribed` (its
 * kept messages are dropped, a store job's result is ignored). Answered
 * also when there was no subscription. A subscribe still under way is
 * answered first with `error cancelled` (sub_end; docs/protocol.md 4.6):
 * the `subscribed` it would have had needs the store read the unsubscribe
 * cancels. */
static void unsubscribe_sub(session_t *s, sub_t *sub, const char *conv) {
  if (sub)
    sub_end(sub, "cancelled",
            "an unsubscribe of this conversation came before the subscribe was answered", 0);
  else
    session_send_owned(s->conn, frame_unsubscribed(conv));
}

static void handle_unsubscribe(session_t *s, const frame_client_t *f) {
  unsubscribe_sub(s, session_find_sub(s, f->conv), f->conv);
}

void session_observe_admission(sessions_t *ss, const char *result, uint64_t waited_ms) {
  char labels[32];
  snprintf(labels, sizeof labels, "result=\"%s\"", result);
  metrics_observe_labels(ss->metrics, "converger_protocol_admission_wait_ms", labels,
                         (double)waited_ms);
}

/* ---- dispatch --------------------------------------------------------------- */

int session_start(sessions_t *ss, conn_t *c) {
  session_t *s = calloc(1, sizeof *s);
  if (!s) return -CV_ENOMEM;
  s->conn = c;
  s->ss = ss;
  s->id = ++ss->next_session;
  c->session = s;
  return 0;
}

/* ---- rate limits ------------------------------------------------------------ */

static const char *const rate_names[RATE_KINDS] = {"send", "subscribe", "refresh", "signal"};

#define RATE_HINT_MAX_MS 60000 /* the longest retryAfterMs of a rate_limited */

/* The bucket a frame takes from, or -1 for none (hello, ping). */
static int rate_kind(frame_type_t t) {
  switch (t) {
  case FRAME_SEND:
    return RATE_SEND;
  case FRAME_SUBSCRIBE:
  case FRAME_UNSUBSCRIBE:
  case FRAME_SYNC:
  case FRAME_PRESENCE:
    return RATE_SUBSCRIBE;
  case FRAME_REFRESH:
    return RATE_REFRESH;
  case FRAME_SIGNAL:
    return RATE_SIGNAL;
  default:
    return -1;
  }
}

/* The session's buckets, made full at its first frame that a rate counts
 * (a bucket made at the hello would be as full by then: it fills up to its
 * burst). NULL when out of memory. */
static rate_t *rates(session_t *s) {
  if (s->rate) return s->rate;
  const config_t *cfg = s->ss->cfg;
  const int set[RATE_KINDS][2] = {
      [RATE_SEND] = {cfg->rate_send, cfg->rate_send_burst},
      [RATE_SUBSCRIBE] = {cfg->rate_subscribe, cfg->rate_subscribe_burst},
      [RATE_REFRESH] = {cfg->rate_refresh, cfg->rate_refresh_burst},
      [RATE_SIGNAL] = {cfg->rate_signal, cfg->rate_signal_burst}};
  rate_t *r = calloc(RATE_KINDS, sizeof *r);
  if (!r) return NULL;
  uint64_t now = util_mono_ms();
  for (int k = 0; k < RATE_KINDS; k++) {
    r[k].per_s = set[k][0];
    if (set[k][0] > 0) limiter_init(&r[k].bucket, set[k][0], set[k][1], now);
  }
  return s->rate = r;
}

/* 1 when the frame may go on. Otherwise it was answered with `error
 * rate_limited` and a retryAfterMs (the connection stays), or, when the
 * client has sent at least rate_abuse_factor times the rate in every
 * second for rate_abuse_ms, the connection is closed with 1008
 * rate_limited. Returns 0 then. */
static int rate_allows(session_t *s, const frame_client_t *f) {
  int k = rate_kind(f->type);
  if (k < 0) return 1;
  rate_t *all = rates(s);
  if (!all) {
    ws_close(s->conn, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return 0;
  }
  if (all[k].per_s <= 0) return 1;
  const config_t *cfg = s->ss->cfg;
  rate_t *r = &all[k];
  uint64_t now = util_mono_ms(), sec = now / 1000;
  double abuse = cfg->rate_abuse_factor * r->per_s;
  if (sec != r->second) {
    r->abusive = sec == r->second + 1 && abuse > 0 && r->count >= abuse ? r->abusive + 1 : 0;
    r->second = sec;
    r->count = 0;
  }
  r->count++;
  if (limiter_take(&r->bucket, now)) return 1;
  char labels[32];
  snprintf(labels, sizeof labels, "kind=\"%s\"", rate_names[k]);
  metrics_add(s->ss->metrics, "converger_rate_limited_total", labels, 1);
  if (abuse > 0 && r->count >= abuse &&
      (uint64_t)r->abusive * 1000 >= (uint64_t)cfg->rate_abuse_ms) {
    metrics_add(s->ss->metrics, "converger_rate_limit_closes_total", labels, 1);
    session_send_error(s->conn, "rate_limited", "far over the rate limits for too long", NULL, 0,
                       NULL);
    ws_close(s->conn, WS_CLOSE_POLICY_VIOLATION, "rate_limited");
    return 0;
  }
  /* The hint is this frame's turn: refused frames of a burst are given
   * the next free slots of the rate, one after the other (as GCRA
   * schedules cells), so a client that waits for its hints retries them
   * at the rate and finds a token each time, instead of retrying them all
   * at once when the first token is back. At most RATE_HINT_MAX_MS. */
  uint64_t slot = now + (uint64_t)limiter_wait_ms(&r->bucket, now);
  if (r->next_slot > slot) slot = r->next_slot;
  if (slot - now > RATE_HINT_MAX_MS) slot = now + RATE_HINT_MAX_MS;
  r->next_slot = slot + (uint64_t)(1000.0 / r->per_s + 0.5);
  char message[96];
  snprintf(message, sizeof message, "more than %.0f %s frames a second", r->per_s, rate_names[k]);
  json_t *details = json_pack("{s:s}", "frame", rate_names[k]);
  if (details && f->type == FRAME_SEND) json_object_set_new(details, "id", json_string(f->id));
  session_send_error(s->conn, "rate_limited", message, f->conv, (long)(slot - now), details);
  return 0;
}

void session_on_text(conn_t *c, const char *text, size_t len) {
  session_t *s = c->session;
  frame_client_t f;
  char why[200];
  if (!s) return;
  if (frame_decode(text, len, s->ss->cfg->max_subs, &f, why, sizeof why) != 0) {
    /* A frame about one conversation whose `conv` was valid names it
     * (docs/protocol.md 4.5: every refusal of a subscribe carries conv). */
    session_send_error(c, "bad_request", why, f.bad_conv[0] ? f.bad_conv : NULL, 0, NULL);
    if (!s->hello_seen) {
      session_count_handshake(s->ss, "bad_request");
      /* An invalid hello may be corrected within the hello timeout; any
       * other first frame is a policy violation. */
      if (!f.known_type || f.type != FRAME_HELLO)
        ws_close(c, WS_CLOSE_POLICY_VIOLATION, "the first frame must be hello");
    }
    return;
  }
  if (!s->hello_seen && f.type != FRAME_HELLO) {
    session_count_handshake(s->ss, "bad_request");
    session_send_error(c, "bad_request", "the first frame must be hello", NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "the first frame must be hello");
    frame_client_clear(&f);
    return;
  }
  if (!rate_allows(s, &f)) {
    frame_client_clear(&f);
    return;
  }
  switch (f.type) {
  case FRAME_HELLO:
    if (s->hello_seen)
      session_send_error(c, "bad_request", "hello was already received on this connection", NULL, 0,
                         NULL);
    else
      session_handle_hello(s, &f);
    break;
  case FRAME_SYNC: {
    sub_t *sub = session_find_sub(s, f.conv);
    if (!sub) {
      session_send_error(c, "bad_request",
                         "sync for a conversation this connection is not subscribed to", f.conv, 0,
                         NULL);
    } else if (sub->state != SUB_LIVE) {
      if (!sub->sync_pending || f.watermark < sub->sync_watermark) {
        sub->sync_watermark = f.watermark;
        strcpy(sub->sync_epoch, f.epoch);
      }
      sub->sync_pending = 1;
    } else {
      sub_sync(sub, f.watermark, f.epoch);
    }
    break;
  }
  case FRAME_SEND:
    session_handle_send(s, &f);
    break;
  case FRAME_PING:
    session_send_owned(c, frame_pong());
    break;
  case FRAME_SUBSCRIBE:
    handle_subscribe(s, &f);
    break;
  case FRAME_UNSUBSCRIBE:
    handle_unsubscribe(s, &f);
    break;
  case FRAME_REFRESH:
    session_handle_refresh(s, &f);
    break;
  case FRAME_PRESENCE:
    session_handle_presence(s, &f);
    break;
  case FRAME_SIGNAL:
    session_handle_signal(s, &f);
    break;
  }
  frame_client_clear(&f);
}

void session_tick(conn_t *c, uint64_t now) {
  session_t *s = c->session;
  if (!s || c->closing) return; /* no session: its start failed, the close is under way */
  sessions_t *ss = s->ss;
  if (!s->hello_seen && c->deadline_ms && now >= c->deadline_ms) {
    session_count_handshake(ss, "timeout");
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "no hello in time");
    return;
  }
  if (session_check_expiry(s, now)) return;
  /* a stream's client sends nothing: a dead one shows as a failed write */
  if (!ws_is_sse(c) && now - c->last_rx_ms > 2 * (uint64_t)ss->cfg->heartbeat_ms) {
    ws_close(c, WS_CLOSE_GOING_AWAY, "heartbeat timeout");
    return;
  }
  if (now >= c->next_ping_ms) {
    ws_ping(c);
    c->next_ping_ms = now + (uint64_t)ss->cfg->heartbeat_ms;
  }
  if (!s->retry_due || now < s->retry_due) return; /* the usual tick: no failed fill is due */
  s->retry_due = 0;
  for (sub_t *sub = s->subs; sub; sub = sub->next) {
    if (sub->state == SUB_RETRY && now >= sub->retry_at)
      sub_fill_start(sub, sub->delivered, -1, 0); /* up to the head, then what waited */
    /* not due yet, or failed again at once: the next one to wait for */
    if (sub->state == SUB_RETRY && (!s->retry_due || sub->retry_at < s->retry_due))
      s->retry_due = sub->retry_at;
  }
}

void session_on_writable(conn_t *c) {
  session_t *s = c->session;
  if (!s || c->closing) return;
  for (sub_t *sub = s->subs; sub; sub = sub->next) {
    if (sub->state != SUB_DEFERRED) continue;
    if (conn_pending_bytes(c) > OUT_HIGH_WATER) return;
    sub_fill_start(sub, sub->deferred_after, sub->deferred_upto, sub->deferred_synced);
  }
}

void session_flush_metrics(sessions_t *ss) {
  if (ss->delivered_unflushed) {
    metrics_add(ss->metrics, "converger_messages_delivered_total", NULL, ss->delivered_unflushed);
    ss->delivered_unflushed = 0;
  }
}

void session_on_close(session_t *s) {
  if (!s) return;
  sessions_t *ss = s->ss;
  uint64_t now = util_mono_ms();
  if (*ss->drain) drain_conn_closing(*ss->drain, s->conn);
  /* Waiters leave the queue first, every one of them: a slot given back
   * below must not go to a waiter of this same connection. */
  session_hello_leave(s, now);
  for (sub_t *sub = s->subs; sub; sub = sub->next) sub_leave(sub, now);
  /* A holder whose job has not started takes it back and frees its slot
   * now; one whose job runs frees it when the job returns (its done
   * callback), so that jobs in the pool never outnumber the slots. */
  session_hello_cancel(s, now);
  for (sub_t *sub = s->subs; sub; sub = sub->next) sub_cancel(sub, now);
}

void session_free(session_t *s) {
  if (!s) return;
  session_on_close(s);
  while (s->subs) sub_remove(s, s->subs);
  if (s->user_counted) users_remove(s->ss->users, s->user);
  free(s->ids);
  free(s->rate);
  free(s);
}

void session_revoke_jti(sessions_t *ss, const char *jti) {
  for (conn_t *c = ss->net->conns; c; c = c->next) {
    session_t *s = c->session;
    if (!s || c->closing || !s->hello_seen || !s->jti[0]) continue;
    if (jti ? strcmp(s->jti, jti) != 0 : !auth_is_revoked(ss->auth, s->jti)) continue;
    session_send_error(c, "unauthorized", "token revoked", NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "token revoked");
  }
}

void session_channel_changed(sessions_t *ss, const char *channel, int active) {
  if (active) return; /* handshakes in flight keep it (bus_channel_last_change_since) */
  for (conn_t *c = ss->net->conns; c; c = c->next) {
    session_t *s = c->session;
    if (!s || c->closing) continue;
    sub_t *sub = s->subs;
    while (sub) {
      sub_t *next = sub->next;
      if (sub->channel && strcmp(sub->channel, channel) == 0) { /* NULL: not announced yet */
        sub_end(sub, "channel_inactive", "the conversation's channel was deactivated", 1);
      }
      sub = next;
    }
  }
}

/* The sessions of `user` that are past their hello, one at a time. */
#define FOR_USER(ss, user, c, s)                                                                   \
  for (conn_t *c = (ss)->net->conns; c; c = c->next)                                               \
    for (session_t *s = c->session; s; s = NULL)                                                   \
      if (!c->closing && s->hello_seen && strcmp(s->user, (user)) == 0)

int session_disconnect_user(sessions_t *ss, const char *user, int code, const char *reason,
                            long retry_after_ms) {
  char why[124];
  if (retry_after_ms > 0) {
    json_t *j = json_pack("{s:i, s:s}", "retryAfterMs", (int)retry_after_ms, "reason", reason);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    snprintf(why, sizeof why, "%s", text && strlen(text) < sizeof why ? text : reason);
    free(text);
    json_decref(j);
  } else {
    snprintf(why, sizeof why, "%s", reason);
  }
  int n = 0;
  FOR_USER(ss, user, c, s) {
    ws_close(c, code, why);
    n++;
  }
  if (n) metrics_add(ss->metrics, "converger_user_disconnects_total", NULL, (uint64_t)n);
  return n;
}

int session_unsubscribe_user(sessions_t *ss, const char *user, const char *conv) {
  int n = 0;
  FOR_USER(ss, user, c, s) {
    sub_t *sub = session_find_sub(s, conv);
    if (!sub) continue;
    unsubscribe_sub(s, sub, conv);
    n++;
  }
  return n;
}

void session_close_all(sessions_t *ss, int code, const char *reason) {
  for (conn_t *c = ws_next_open(ss->net, NULL); c; c = ws_next_open(ss->net, c))
    ws_close(c, code, reason);
}
