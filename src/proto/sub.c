/*
 * sub.c: one subscription of a session (session_int.h): its state
 * machine (the table below), live delivery, the messages kept while a
 * fill runs, what a finished fill owes, and the epochs. Its store jobs,
 * the fills (the rest of a hello's replay, a gap fill), a client's sync
 * and a `subscribe` on a live connection (protocol 1.1: one admitted store
 * job like a sync's, that also reads the conversation, then `subscribed`),
 * are fill.c's; the events of the table they raise are their results. The
 * design block of session.c states the invariants.
 *
 * (new) is a subscription made by sub_new: in the bus index, LIVE with
 * nothing delivered, moved on at once. A store job carries its
 * subscription's number (sub_t.gen) and its result is dropped when that
 * subscription has ended, also when a new one of the same conversation
 * took its place.
 *
 * A subscription's states (sub_state_t) and what moves it. "Finish" is
 * sub_fill_finish: synced if the fill was asked for one, then what the
 * fill owes, in this order: a sync that came meanwhile (sync_pending) runs
 * as from LIVE; after an overflow, a fill up to the head; messages kept
 * that are not next go after a fill up to them; the rest goes out, LIVE.
 * A fill starts in DEFERRED instead of FILLING while the output holds more
 * than OUT_HIGH_WATER bytes, except a sync's first job (it holds a slot).
 *
 *   state     event                                 action                        next
 *   (new)     hello                                 subscribe; wait for its slot  QUEUED
 *   QUEUED    the hello's slot granted              the hello's job               FILLING
 *   (new)     subscribe, slot granted               subscribe; its job            FILLING
 *   (new)     subscribe, queued or before welcome   subscribe; wait for a slot    QUEUED
 *   (new)     subscribe, queue full                 unavailable (conv, hint)      (freed)
 *   LIVE      message delivered + 1                 send it                       LIVE
 *   LIVE      message delivered + 1, output high    fill to the head              DEFERRED
 *   LIVE      message past a gap, or a head hint    keep it; fill up to it        FILLING
 *   LIVE      message at or below delivered         drop it                       LIVE
 *   LIVE      sync, slot granted                    the sync's job                FILLING
 *   LIVE      sync, queued                          wait for a slot               QUEUED
 *   LIVE      sync, queue full                      replay_unavailable; finish    LIVE
 *   QUEUED    slot granted                          the sync's job                FILLING
 *   QUEUED    slot refused (queue timeout)          replay_unavailable; finish    LIVE, ...
 *   QUEUED    a subscribe's slot refused            unavailable (conv, hint)      (freed)
 *   FILLING   a subscribe's job done                subscribed; replay; as above  FILLING, LIVE
 *   FILLING   a subscribe's job: not found, inactive, failed   error (conv)       (freed)
 *   FILLING   job done, target reached              finish                        LIVE, ...
 *   FILLING   job done, a page short of target      the next page                 FILLING
 *   FILLING   job done, output high                 the same page again           DEFERRED
 *   FILLING   job done, history reset               synced with reset; finish     LIVE, ...
 *   FILLING   job done, its epoch moved meanwhile   read again in the new epoch   FILLING
 *   FILLING   job failed, dropped or timed out      replay_unavailable (hint)     RETRY
 *   DEFERRED  output drained (on_writable)          start the fill                FILLING
 *   RETRY     tick at retry_at                      fill to the head              FILLING
 *   not LIVE  message                               keep it in `pending`          same
 *   not LIVE  `pending` full                        forget it; overflow = 1       same
 *   not LIVE  sync                                  keep the lowest: sync_pending same
 *   any       connection closes                     leave the queue; cancel job   (freed)
 *   any       unsubscribe, refresh narrows scope    leave; cancel a job not run   (freed)
 *
 * Every subscribe gets one answer (sub_t.answers_owed counts those owed,
 * docs/protocol.md 4.5). A subscribe of a subscription that is announced
 * is answered at once (`subscribed` "already"). One of a subscription not
 * announced yet (made by a subscribe or by the hello; QUEUED, FILLING or
 * waiting for the welcome) changes no state: it is owed its answer, given
 * when the subscription's is, in the order sent: `subscribed` "already"
 * after its `subscribed` or welcome entry (sub_answer_already), the error
 * that refuses it (sub_refuse), or, when an unsubscribe ends it first,
 * `error cancelled` before the `unsubscribed` (sub_end).
 *
 * ("LIVE, ..." is finish's: LIVE, or QUEUED/FILLING/DEFERRED for what the
 * fill owed. A fill started from LIVE or RETRY may begin DEFERRED.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/metrics.h"
#include "net/ws.h"
#include "proto/session_int.h"

/* ---- subscriptions --------------------------------------------------------- */

/* The transitions of the table above: allowed[from] has bit `to`. */
#define TO(st) (1u << (st))
static const unsigned allowed[SUB_NSTATES] = {
    [SUB_LIVE] = TO(SUB_LIVE) | TO(SUB_QUEUED) | TO(SUB_FILLING) | TO(SUB_DEFERRED),
    [SUB_QUEUED] = TO(SUB_FILLING) | TO(SUB_LIVE),
    [SUB_FILLING] = TO(SUB_LIVE) | TO(SUB_FILLING) | TO(SUB_DEFERRED) | TO(SUB_RETRY),
    [SUB_DEFERRED] = TO(SUB_FILLING),
    [SUB_RETRY] = TO(SUB_FILLING) | TO(SUB_DEFERRED),
};

const char *sub_state_name(sub_state_t st) {
  static const char *const names[SUB_NSTATES] = {"live", "queued", "filling", "deferred", "retry"};
  return (unsigned)st < SUB_NSTATES ? names[st] : "?";
}

int sub_set_state(sub_t *sub, sub_state_t to) {
  if ((unsigned)sub->state < SUB_NSTATES && (unsigned)to < SUB_NSTATES &&
      (allowed[sub->state] & TO(to)))
    return sub->state = to, 0;
  /* A move outside the table is a bug of ours. Every build refuses it
   * (an assert would vanish under NDEBUG, the build users run): the state
   * stays, the line says BUG (tests fail on it: harness.py, fixture.c),
   * the metric counts it, and the connection ends with 1011 so that the
   * client resumes from its watermark on a fresh session instead of
   * living on in a state nothing was written for. */
  session_t *s = sub->session;
  log_error("BUG: session %llu: %s: no transition from %s to %s; refused, closing the connection",
            (unsigned long long)s->id, sub->conv, sub_state_name(sub->state), sub_state_name(to));
  char labels[64];
  snprintf(labels, sizeof labels, "from=\"%s\",to=\"%s\"", sub_state_name(sub->state),
           sub_state_name(to));
  metrics_add(s->ss->metrics, "converger_subscription_transitions_refused_total", labels, 1);
  if (s->conn && !s->conn->closing) ws_close(s->conn, WS_CLOSE_INTERNAL_ERROR, "internal error");
  return -CV_EINVAL;
}

static void clear_pending(sub_t *sub) {
  for (size_t i = 0; i < sub->npending; i++) bus_msg_unref(sub->pending[i]);
  sub->npending = 0;
  sub->pending_bytes = 0;
}

sub_t *sub_new(session_t *s, const char *conv) {
  size_t len = strlen(conv);
  sub_t *sub = calloc(1, sizeof *sub + len + 1);
  if (!sub) return NULL;
  sub->session = s;
  sub->gen = ++s->last_sub_gen;
  memcpy(sub->conv, conv, len + 1);
  sub->bus.conv = sub->conv;
  sub->bus.deliver = sub_deliver_cb;
  sub->next = s->subs;
  s->subs = sub;
  bus_subscribe(s->ss->bus, &sub->bus);
  return sub;
}

void sub_remove(session_t *s, sub_t *sub) {
  for (sub_t **p = &s->subs; *p; p = &(*p)->next)
    if (*p == sub) {
      *p = sub->next;
      break;
    }
  /* A sync's or subscribe's job not started yet is taken back (its done
   * finds no subscription of its number) and its slot given back; one
   * that runs takes the slot with it, given back when it returns, so that
   * admitted jobs in the pool never outnumber the slots. */
  sub_cancel_sync_job(sub);
  admission_release(s->ss->admission, &sub->adm, util_mono_ms());
  session_presence_off(sub);
  bus_unsubscribe(s->ss->bus, &sub->bus);
  clear_pending(sub);
  free(sub->pending);
  free(sub->channel);
  free(sub);
}

/* `error code` with sub's conv `n` times: one for each subscribe owed. */
static void send_errors(sub_t *sub, unsigned n, const char *code, const char *message,
                        long retry_after_ms) {
  for (unsigned i = 0; i < n; i++)
    session_send_error(sub->session->conn, code, message, sub->conv, retry_after_ms, NULL);
}

void sub_end(sub_t *sub, const char *code, const char *message, int told) {
  session_t *s = sub->session;
  char *ended = frame_unsubscribed(sub->conv); /* made now: sub->conv goes with sub */
  unsigned n = sub->answers_owed;
  if (told && n == 0) n = 1; /* the notice of an end the client did not ask for */
  send_errors(sub, n, code, message, 0);
  sub_remove(s, sub);
  session_send_owned(s->conn, ended);
}

void sub_refuse(sub_t *sub, const char *code, const char *message, long retry_after_ms) {
  send_errors(sub, sub->answers_owed, code, message, retry_after_ms);
  sub_remove(sub->session, sub);
}

void sub_answer_already(sub_t *sub) {
  for (; sub->answers_owed > 0; sub->answers_owed--)
    session_send_owned(sub->session->conn, frame_subscribed(sub->conv, sub->delivered, sub->epoch,
                                                            sub->presence, 0, 1));
}

int sub_set_channel(sub_t *sub, const char *channel) {
  char *copy = strdup(channel);
  if (!copy) return -CV_ENOMEM;
  free(sub->channel);
  sub->channel = copy;
  return 0;
}

/* Keep `m` for later, in seq order; duplicates are dropped. */
static void pending_add(sub_t *sub, bus_msg_t *m) {
  if (sub->overflow) return;
  if (sub->npending == PENDING_MAX || sub->pending_bytes + m->frame_len > OUT_HIGH_WATER) {
    /* Too far behind: forget the buffer and re-read from the store later. */
    clear_pending(sub);
    sub->overflow = 1;
    return;
  }
  if (sub->npending == sub->cap) {
    size_t cap = sub->cap ? sub->cap * 2 : 8;
    bus_msg_t **p = realloc(sub->pending, cap * sizeof *p);
    if (!p) {
      sub->overflow = 1;
      clear_pending(sub);
      return;
    }
    sub->pending = p;
    sub->cap = cap;
  }
  size_t i = sub->npending;
  while (i > 0 && sub->pending[i - 1]->seq > m->seq) i--;
  if (i > 0 && sub->pending[i - 1]->seq == m->seq) return;
  memmove(&sub->pending[i + 1], &sub->pending[i], (sub->npending - i) * sizeof *sub->pending);
  sub->pending[i] = m;
  bus_msg_ref(m);
  sub->npending++;
  sub->pending_bytes += m->frame_len;
}

/* conn_release_cb of a message's frame queued by reference. */
static void msg_release(void *m) { bus_msg_unref(m); }

static void send_live(sub_t *sub, bus_msg_t *m) {
  conn_t *c = sub->session->conn;
  sub->delivered = m->seq;
  /* One frame in memory for every WebSocket subscriber: each connection
   * queues a reference, and the WebSocket state is not read on the way
   * (ws_takes_frames). A stream's event id says every subscription's
   * watermark, this one's included (proto/sse.c). */
  if (ws_takes_frames(c)) {
    bus_msg_ref(m);
    conn_write_shared(c, m->frame, m->frame_len, msg_release, m);
  } else {
    ws_send_msg(c, m->frame, m->frame_len, m->json, m->json ? strlen(m->json) : 0,
                ws_is_sse(c) ? session_sse_id(sub->session) : NULL);
  }
  sub->session->ss->delivered_unflushed++;
}

/* Why a resume is answered with reset (metric label), or NULL: its
 * watermark is above the head, or it names another epoch than the
 * conversation's. A watermark of NONE (start at the head) never resets. */
const char *sub_reset_reason(int64_t watermark, const char *epoch, const store_conv_t *info) {
  if (watermark < 0) return NULL;
  if (epoch[0] && strcmp(epoch, info->epoch) != 0) return "epoch";
  return watermark > info->head ? "ahead" : NULL;
}

void sub_count_reset(sessions_t *ss, const char *reason) {
  char labels[32];
  snprintf(labels, sizeof labels, "reason=\"%s\"", reason);
  metrics_add(ss->metrics, "converger_resets_total", labels, 1);
}

/* How far a fill must read before `m` can follow: up to the message
 * before it, or up to a head hint's seq itself (bus.h). */
static int64_t fill_target(const bus_msg_t *m) { return m->frame ? m->seq - 1 : m->seq; }

/* The fill reached its target: send synced if asked, then what waited. */
void sub_fill_finish(sub_t *sub, int64_t head, int synced) {
  conn_t *c = sub->session->conn;
  if (synced || sub->reset_pending)
    session_send_owned(c, frame_synced(sub->conv, head, sub->epoch, sub->reset_pending));
  sub->reset_pending = 0;
  if (sub_set_state(sub, SUB_LIVE) != 0 || c->closing) return;
  if (sub->sync_pending) { /* a sync that came during the fill: it queues like any sync */
    sub->sync_pending = 0;
    sub_sync(sub, sub->sync_watermark, sub->sync_epoch);
    return;
  }
  if (sub->overflow) {
    sub->overflow = 0;
    clear_pending(sub);
    sub_fill_start(sub, sub->delivered, -1, 0);
    return;
  }
  size_t i = 0;
  int behind = 0;
  for (; i < sub->npending; i++) {
    bus_msg_t *m = sub->pending[i];
    /* A message goes out at delivered + 1; a head hint above delivered
     * needs a fill first. */
    if (m->seq > sub->delivered + (m->frame ? 1 : 0)) break;
    if (conn_pending_bytes(c) > OUT_HIGH_WATER) {
      behind = 1;
      break;
    }
    if (m->frame && m->seq == sub->delivered + 1) send_live(sub, m);
    sub->pending_bytes -= m->frame_len;
    bus_msg_unref(m);
  }
  if (i > 0) { /* drop the prefix handled above */
    memmove(sub->pending, sub->pending + i, (sub->npending - i) * sizeof *sub->pending);
    sub->npending -= i;
  }
  if (behind) {
    /* The client is behind: the rest comes from the store, paced. */
    clear_pending(sub);
    sub_fill_start(sub, sub->delivered, -1, 0);
  } else if (sub->npending) {
    sub_fill_start(sub, sub->delivered, fill_target(sub->pending[0]), 0);
  }
}

/* A live message in another epoch than the subscription's: the store was
 * restored (or its epoch rotated) under this connection. The message
 * starts the new history here, as the client takes it (docs/protocol.md,
 * section 3.1): a watermark at or past it moves back to just before it, one
 * behind it is filled from the store, in the new epoch, up to it. */
static void epoch_changed(sub_t *sub, const bus_msg_t *m) {
  log_debug("session %llu: %s: a message in epoch %s, the subscription's was %s",
            (unsigned long long)sub->session->id, sub->conv, m->epoch, sub->epoch);
  sub_count_reset(sub->session->ss, "epoch");
  strcpy(sub->epoch, m->epoch);
  if (sub->delivered >= m->seq) sub->delivered = m->seq - 1;
}

void sub_deliver_cb(bus_sub_t *bs, bus_msg_t *m) {
  sub_t *sub = container_of(bs, sub_t, bus);
  if (sub->session->conn->closing) return;
  if (m->epoch[0] && sub->epoch[0] && strcmp(m->epoch, sub->epoch) != 0) epoch_changed(sub, m);
  if (sub->state != SUB_LIVE) {
    pending_add(sub, m);
    return;
  }
  if (m->seq <= sub->delivered) return;
  if (m->frame && m->seq == sub->delivered + 1) {
    if (conn_pending_bytes(sub->session->conn) > OUT_HIGH_WATER) {
      /* The client reads slower than the conversation moves: the store is
       * its buffer. Catch up from there, paced, instead of queueing more. */
      sub_fill_start(sub, sub->delivered, -1, 0);
      return;
    }
    send_live(sub, m);
    return;
  }
  pending_add(sub, m);
  sub_fill_start(sub, sub->delivered, fill_target(m), 0);
}
