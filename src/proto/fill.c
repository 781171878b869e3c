/*
 * fill.c: a subscription's store jobs (session_int.h): the fills (the
 * rest of a hello's replay, a gap fill, a fill to the head) with their
 * replay pages, a client's sync, and a `subscribe` on a live connection
 * (protocol 1.1), each through admission where sub.c's table says so. The
 * states they move a subscription through, and why, are sub.c's design
 * block; a job's result is dropped when its subscription has ended
 * (sub_t.gen).
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

/* ---- fill job: replay pages, sync, gap fill -------------------------------- */

typedef struct fill_job_s {
  pool_job_t job;
  conn_t *conn;
  sessions_t *ss; /* the connection's session may be gone when the job is done */
  char conv[STORE_ID_MAX + 1];
  uint64_t gen; /* the subscription's (sub_t.gen) */
  /* A subscribe's job (upto < 0, admitted): the worker also checks the
   * channel and reads its presence; `after` < 0 (null) becomes the head. */
  int subscribe;
  uint64_t deact_gen; /* the bus's channel changes when it was submitted */
  int presence, signals;
  /* A subscribe's job in a cluster: the client's presence row is written
   * in it (the same checkout), for this client and user. */
  char client[STORE_ID_MAX + 1], user[STORE_ID_MAX + 1];
  int row; /* its presence row: 0 not written, 1 written, 2 as a join (worker; read in done) */
  char channel[STORE_ID_MAX + 1];
  int64_t after, upto;
  int synced;
  int admitted;            /* the first job of a sync: its subscription holds an admission slot */
  admission_waiter_t held; /* that slot, when its subscription ended while the job ran */
  int replayed;            /* a replay query was made (worker thread; read in done) */
  int status;
  /* With upto < 0 the job reads the conversation: `epoch` is the epoch
   * `after` belongs to ("" unknown), and the worker sets `reset` (a
   * sub_reset_reason) and `head_epoch` from what it read. */
  char epoch[STORE_EPOCH_MAX + 1];
  char head_epoch[STORE_EPOCH_MAX + 1];
  const char *reset;
  store_msg_t *msgs;
  size_t n;
} fill_job_t;

void sub_cancel_sync_job(sub_t *sub) {
  pool_t *pool = *sub->session->ss->pool;
  fill_job_t *f = sub->sync_job;
  if (!f || (pool && pool_cancel(pool, &f->job))) return;
  if (sub->adm.state == ADMISSION_HOLDING) { /* a holder is in no list: it may move */
    f->held = sub->adm;
    sub->adm = (admission_waiter_t){0};
  }
  sub->sync_job = NULL;
}

static void fill_work(pool_job_t *job, store_t *db) {
  fill_job_t *f = container_of(job, fill_job_t, job);
  if (f->upto < 0) {
    store_conv_t info;
    if ((f->status = store_conv_get(db, f->conv, &info)) != 0) return;
    if (f->subscribe && !info.channel_active) {
      f->status = -CV_EINACTIVE;
      return;
    }
    f->upto = info.head;
    strcpy(f->head_epoch, info.epoch);
    strcpy(f->channel, info.channel);
    f->presence = info.presence;
    f->signals = info.signals;
    if (f->subscribe && info.presence && f->ss->shared)
      f->row = 1 + session_presence_store_join(f->ss, db, f->conv, f->client, f->user);
    if ((f->reset = sub_reset_reason(f->after, f->epoch, &info)) != NULL) return;
    if (f->after < 0) f->after = info.head; /* a subscribe from null: live from the head */
  }
  if (f->after >= f->upto) return;
  f->replayed = 1;
  f->status = store_replay(db, f->conv, f->after, f->upto, STORE_REPLAY_PAGE_MAX, PAGE_BYTES,
                           &f->msgs, &f->n);
}

/* Send replayed messages above `delivered` in order. */
void sub_send_replay(sub_t *sub, const store_msg_t *msgs, size_t n) {
  conn_t *c = sub->session->conn;
  for (size_t i = 0; i < n && !c->closing; i++) {
    if (msgs[i].seq <= sub->delivered) continue;
    if (msgs[i].seq != sub->delivered + 1) break; /* never: the store is gapless */
    char *json = frame_msg(sub->conv, &msgs[i]);
    if (!json) {
      ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
      return;
    }
    sub->delivered = msgs[i].seq;
    ws_send_msg(c, NULL, 0, json, strlen(json), ws_is_sse(c) ? session_sse_id(sub->session) : NULL);
    free(json);
    sub->session->ss->delivered_unflushed++;
  }
}

/* `error replay_unavailable` for the replay from `watermark`, with the
 * retry hint `hint_ms`; the subscription stays. */
static void send_replay_unavailable(sub_t *sub, const char *message, int64_t watermark,
                                    long hint_ms) {
  json_t *details = json_pack("{s:I}", "watermark", (json_int_t)watermark);
  session_send_error(sub->session->conn, "replay_unavailable", message, sub->conv, hint_ms,
                     details);
  sub->sync_pending = 0; /* the client syncs again after the hint */
}

/* A sync got no admission slot: replay_unavailable, and live delivery goes
 * on: what waited in `pending` goes out now (or is filled from the store
 * past an overflow), as after any fill. */
static void replay_unavailable(sub_t *sub, const char *message, int64_t watermark) {
  send_replay_unavailable(sub, message, watermark,
                          config_retry_hint(sub->session->ss->cfg, sub->session->ss->rng));
  sub_fill_finish(sub, 0, 0);
}

/* A fill's store work failed (store down, pool overloaded): replay_unavailable,
 * and the subscription keeps filling, buffering live messages, until
 * session_tick starts the fill again after the same hint. Never at once: a
 * store that just failed would fail it again, in a loop. */
static void fill_failed(sub_t *sub, const char *message) {
  long hint = config_retry_hint(sub->session->ss->cfg, sub->session->ss->rng);
  send_replay_unavailable(sub, message, sub->delivered, hint);
  if (sub_set_state(sub, SUB_RETRY) != 0) return;
  sub->retry_at = util_mono_ms() + (uint64_t)hint;
  session_t *s = sub->session;
  if (!s->retry_due || sub->retry_at < s->retry_due) s->retry_due = sub->retry_at;
}

/* Head hints above `seq` in `pending` (bus.h) claim messages the store does
 * not have (a foreign notification): forget them. */
static void drop_hints_above(sub_t *sub, int64_t seq) {
  size_t k = 0;
  for (size_t i = 0; i < sub->npending; i++) {
    bus_msg_t *m = sub->pending[i];
    if (!m->frame && m->seq > seq)
      bus_msg_unref(m);
    else
      sub->pending[k++] = m;
  }
  sub->npending = k;
}

static void subscribe_done(sub_t *sub, fill_job_t *f);

static void fill_done(pool_job_t *job) {
  fill_job_t *f = container_of(job, fill_job_t, job);
  if (pool_job_unrun(job)) f->status = pool_job_unrun(job);
  if (f->replayed)
    metrics_add(f->ss->metrics, "converger_replay_queries_total", "kind=\"fill\"", 1);
  /* A row written is this node's to delete: in the table from now on, in
   * its grace until the subscription is announced (which never happens if
   * it ended meanwhile), so that it goes if no connection comes. */
  if (f->row) session_presence_orphan(f->ss, f->conv, f->user, f->client, f->row == 2);
  if (f->held.state == ADMISSION_HOLDING) /* its subscription is gone: the slot it took */
    admission_release(f->ss->admission, &f->held, util_mono_ms());
  if (f->admitted && f->conn->session) { /* the sync's store work is done: free its slot */
    sub_t *sub = session_find_sub_gen(f->conn->session, f->conv, f->gen);
    if (sub && sub->sync_job == f) {
      sub->sync_job = NULL;
      admission_release(f->conn->session->ss->admission, &sub->adm, util_mono_ms());
    }
  }
  if (conn_unref(f->conn)) {
    session_t *s = f->conn->session;
    sub_t *sub = s ? session_find_sub_gen(s, f->conv, f->gen) : NULL;
    if (sub && f->subscribe) {
      subscribe_done(sub, f);
    } else if (sub && f->status != 0) {
      log_warn("session %llu: replay of %s failed: %s", (unsigned long long)s->id, f->conv,
               cv_strerror(f->status));
      fill_failed(sub, "replay failed; sync again later");
    } else if (sub && f->replayed && f->n == 0) {
      /* Nothing after `delivered`: the target was above the head (the
       * store is gapless and notifies after commit, so only a foreign
       * notification claims that). Done at what the store has. */
      log_warn("session %llu: %s has no message after %lld, below the %lld asked for",
               (unsigned long long)s->id, f->conv, (long long)f->after, (long long)f->upto);
      drop_hints_above(sub, sub->delivered);
      sub_fill_finish(sub, sub->delivered, f->synced);
    } else if (sub && f->reset && !f->admitted && strcmp(f->reset, "epoch") == 0 &&
               strcmp(sub->epoch, f->head_epoch) == 0) {
      /* A fill of the node's own, whose epoch a live message moved on
       * while it was out (epoch_changed): not a reset any more; read
       * again in the new epoch. (A client's sync keeps its own epoch.) */
      sub_fill_start(sub, sub->delivered, -1, f->synced);
    } else if (sub && f->reset) {
      /* The history the subscription was in is not the store's: from the
       * head, and the client is told (synced with reset). What waits in
       * `pending` at or below the head is dropped by sub_fill_finish. */
      log_debug("session %llu: %s resets: watermark %lld epoch \"%s\", head %lld epoch %s (%s)",
                (unsigned long long)s->id, f->conv, (long long)f->after, f->epoch,
                (long long)f->upto, f->head_epoch, f->reset);
      sub_count_reset(f->ss, f->reset);
      sub->delivered = f->upto;
      strcpy(sub->epoch, f->head_epoch);
      sub->reset_pending = 1;
      sub_fill_finish(sub, f->upto, f->synced);
    } else if (sub) {
      if (f->head_epoch[0]) strcpy(sub->epoch, f->head_epoch);
      /* Only a target given by the caller (a head hint) can be below
       * `delivered`; a head read from the store was checked above. */
      if (sub->delivered > f->upto) sub->delivered = f->upto;
      if (conn_pending_bytes(f->conn) > OUT_HIGH_WATER) {
        /* Other pages filled the output meanwhile: read this one again
         * once the client has caught up. */
        sub_fill_start(sub, sub->delivered, f->upto, f->synced);
        goto out;
      }
      int64_t before = sub->delivered;
      sub_send_replay(sub, f->msgs, f->n);
      if (sub->delivered >= f->upto)
        sub_fill_finish(sub, f->upto, f->synced);
      else if (sub->delivered == before) /* never for a gapless store */
        fill_failed(sub, "replay made no progress; sync again later");
      else
        sub_fill_start(sub, sub->delivered, f->upto, f->synced);
    }
  }
out:
  store_msgs_free(f->msgs, f->n);
  free(f);
}

static void fill_submit(sub_t *sub, int64_t after, int64_t upto, int synced, int admitted,
                        const char *epoch);

void sub_fill_start(sub_t *sub, int64_t after, int64_t upto, int synced) {
  fill_submit(sub, after, upto, synced, 0, sub->epoch);
}

/* sub_fill_start for the first job of a sync that holds an admission slot:
 * never deferred (the slot is released when the job returns). `epoch` is
 * the epoch `after` is in ("": unknown). */
static void fill_submit(sub_t *sub, int64_t after, int64_t upto, int synced, int admitted,
                        const char *epoch) {
  conn_t *c = sub->session->conn;
  if (!admitted && conn_pending_bytes(c) > OUT_HIGH_WATER) {
    /* Let the client read what it has first: session_on_writable resumes. */
    if (sub_set_state(sub, SUB_DEFERRED) != 0) return;
    sub->deferred_after = after;
    sub->deferred_upto = upto;
    sub->deferred_synced = synced;
    return;
  }
  if (sub_set_state(sub, SUB_FILLING) != 0) {
    if (admitted) admission_release(c->session->ss->admission, &sub->adm, util_mono_ms());
    return;
  }
  fill_job_t *f = calloc(1, sizeof *f);
  if (!f) {
    if (admitted) admission_release(c->session->ss->admission, &sub->adm, util_mono_ms());
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  f->conn = c;
  f->ss = c->session->ss;
  strcpy(f->conv, sub->conv);
  f->gen = sub->gen;
  f->subscribe = admitted && !sub->announced;
  if (f->subscribe) {
    strcpy(f->client, c->session->client_id);
    strcpy(f->user, c->session->user);
  }
  f->deact_gen = bus_channel_gen(c->session->ss->bus);
  f->after = after;
  f->upto = upto;
  f->synced = synced;
  f->admitted = admitted;
  snprintf(f->epoch, sizeof f->epoch, "%s", epoch);
  if (admitted) sub->sync_job = f;
  f->job.kind = f->subscribe ? "subscribe" : admitted ? "sync" : "fill";
  f->job.deadline_ms = config_store_deadline(c->session->ss->cfg);
  conn_ref(c);
  pool_submit(*c->session->ss->pool, &f->job, fill_work, fill_done);
}

/* ---- sync ------------------------------------------------------------------- */

/* A sync's replay holds an admission slot for its first store job, like a
 * hello (the admission-queue decision record); gap fills do not. */
static void sync_begin(sub_t *sub) {
  sub->delivered = sub->adm_watermark;
  fill_submit(sub, sub->adm_watermark, -1, 1, 1, sub->adm_epoch);
}

/* No slot: replay_unavailable with the watermark asked for; the
 * connection stays and live delivery goes on. */
static void sync_refused(sub_t *sub, const char *message, uint64_t waited_ms) {
  session_observe_admission(sub->session->ss, "overloaded", waited_ms);
  replay_unavailable(sub, message, sub->adm_watermark);
}

static void sync_admitted(admission_waiter_t *w, int status, uint64_t waited_ms) {
  sub_t *sub = container_of(w, sub_t, adm);
  if (status != 0) {
    sync_refused(sub, "no replay slot in time; sync again later", waited_ms);
    return;
  }
  session_observe_admission(sub->session->ss, "ok", waited_ms);
  sync_begin(sub);
}

void sub_sync(sub_t *sub, int64_t watermark, const char *epoch) {
  sessions_t *ss = sub->session->ss;
  sub->adm_watermark = watermark;
  snprintf(sub->adm_epoch, sizeof sub->adm_epoch, "%s", epoch);
  int r = admission_acquire(ss->admission, &sub->adm, util_mono_ms(), sync_admitted);
  if (r == ADMISSION_GRANTED) {
    session_observe_admission(ss, "ok", 0);
    sync_begin(sub);
  } else if (r == ADMISSION_QUEUED) {
    sub_set_state(sub,
                  SUB_QUEUED); /* live messages wait in `pending` meanwhile; a refusal closes */
  } else {
    sync_refused(sub, "the replay queue is full; sync again later", 0);
  }
}

void sub_leave(sub_t *sub, uint64_t now) {
  if (sub->adm.state == ADMISSION_WAITING)
    admission_release(sub->session->ss->admission, &sub->adm, now);
}

void sub_cancel(sub_t *sub, uint64_t now) {
  pool_t *pool = *sub->session->ss->pool;
  if (sub->sync_job && pool && pool_cancel(pool, &sub->sync_job->job)) {
    sub->sync_job = NULL;
    admission_release(sub->session->ss->admission, &sub->adm, now);
  }
}

/* ---- subscribe (v1.1) --------------------------------------------------------- */

/* A subscribe got no admission slot, or its store job failed: `error
 * unavailable` with its conv and a retry hint, and no subscription. The
 * connection stays (docs/protocol.md 4.5); the client subscribes again
 * after the hint. */
static void subscribe_refused(sub_t *sub, const char *message) {
  session_t *s = sub->session;
  sub_refuse(sub, "unavailable", message, config_retry_hint(s->ss->cfg, s->ss->rng));
}

static void subscribe_done(sub_t *sub, fill_job_t *f) {
  session_t *s = sub->session;
  conn_t *c = s->conn;
  if (f->status == 0 && session_deactivated_since(s->ss, f->deact_gen, f->channel))
    f->status = -CV_EINACTIVE; /* deactivated after our read */
  if (f->status == -CV_ENOTFOUND || f->status == -CV_EINACTIVE) {
    const char *message, *code = session_conv_error(f->status, &message);
    sub_refuse(sub, code, message, 0);
    return;
  }
  if (f->status != 0) {
    log_warn("session %llu: subscribe to %s failed: %s", (unsigned long long)s->id, sub->conv,
             cv_strerror(f->status));
    subscribe_refused(sub, f->status == -CV_EBUSY    ? "store overloaded; subscribe again later"
                           : f->status == -CV_ESHARD ? "the conversation's shard is unavailable; "
                                                       "subscribe again later"
                                                     : "store unavailable; subscribe again later");
    return;
  }
  if (sub_set_channel(sub, f->channel) != 0) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  strcpy(sub->epoch, f->head_epoch);
  sub->presence = f->presence != 0;
  sub->signals = f->signals != 0;
  sub->announced = 1;
  if (f->reset) sub_count_reset(s->ss, f->reset);
  session_send_owned(
      c, frame_subscribed(sub->conv, f->upto, f->head_epoch, f->presence, f->reset != NULL, 0));
  if (sub->answers_owed > 0) sub->answers_owed--; /* the first subscribe's answer */
  session_presence_on(sub);
  /* null and a reset start at the head (told in `subscribed`, as in a
   * welcome entry); the first page goes out unless the output is high */
  sub->delivered = f->reset ? f->upto : f->after;
  sub_answer_already(sub); /* subscribes of it sent meanwhile */
  if (c->closing) return;
  if (conn_pending_bytes(c) <= OUT_HIGH_WATER) sub_send_replay(sub, f->msgs, f->n);
  if (sub->delivered < f->upto)
    sub_fill_start(sub, sub->delivered, f->upto, 1);
  else
    sub_fill_finish(sub, f->upto, 1);
}

static void subscribe_begin(sub_t *sub) {
  fill_submit(sub, sub->adm_watermark, -1, 1, 1, sub->adm_epoch);
}

static void subscribe_admitted(admission_waiter_t *w, int status, uint64_t waited_ms) {
  sub_t *sub = container_of(w, sub_t, adm);
  if (status != 0) {
    session_observe_admission(sub->session->ss, "overloaded", waited_ms);
    subscribe_refused(sub, "no subscribe slot in time; subscribe again later");
    return;
  }
  session_observe_admission(sub->session->ss, "ok", waited_ms);
  subscribe_begin(sub);
}

static void subscribe_acquire(sub_t *sub) {
  session_t *s = sub->session;
  int r = admission_acquire(s->ss->admission, &sub->adm, util_mono_ms(), subscribe_admitted);
  if (r == ADMISSION_GRANTED) {
    session_observe_admission(s->ss, "ok", 0);
    subscribe_begin(sub);
  } else if (r == ADMISSION_QUEUED) {
    if (sub->state != SUB_QUEUED) sub_set_state(sub, SUB_QUEUED); /* live messages wait */
  } else {
    session_observe_admission(s->ss, "overloaded", 0);
    subscribe_refused(sub, "the subscribe queue is full; subscribe again later");
  }
}

void sub_subscribe(session_t *s, const char *conv, int64_t watermark, const char *epoch,
                   int presence_events) {
  sub_t *sub = sub_new(s, conv);
  if (!sub) {
    ws_close(s->conn, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  sub->presence_events = presence_events;
  sub->answers_owed = 1; /* until `subscribed` or an error with its conv */
  sub->adm_watermark = watermark;
  snprintf(sub->adm_epoch, sizeof sub->adm_epoch, "%s", epoch);
  if (!s->drain_mark.welcomed) {
    /* Before the welcome: `subscribed` must not overtake it. The
     * subscription keeps live messages from now on and asks for its slot
     * once the welcome is out (sub_after_welcome). */
    sub_set_state(sub, SUB_QUEUED);
    sub->after_welcome = 1;
    return;
  }
  subscribe_acquire(sub);
}

void sub_after_welcome(session_t *s) {
  sub_t *sub = s->subs;
  while (sub) { /* a refusal removes the subscription: take the next first */
    sub_t *next = sub->next;
    if (sub->after_welcome) {
      sub->after_welcome = 0;
      subscribe_acquire(sub);
    }
    sub = next;
  }
}
