/*
 * session.c: hello, sync, send and live delivery for one connection.
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
 *  - while `filling` (handshake replay, sync, gap fill), live messages are
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

#include "gate/auth.h"
#include "core/metrics.h"
#include "bus/bus.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"
#include "gate/admission.h"
#include "gate/drain.h"
#include "net/ws.h"
#include "proto/frames.h"

#define PENDING_MAX    10000         /* live messages buffered per subscription during a fill */
#define PAGE_BYTES     (256 * 1024)  /* bytes of bodies in one replay page */
#define HELLO_BYTES    (1024 * 1024) /* bytes of first pages in one hello job, all subs */
#define OUT_HIGH_WATER (1024 * 1024) /* queued output above which replay pauses */

typedef struct sub_s {
  bus_sub_t bus;
  admission_waiter_t adm;      /* a sync waiting for, or holding, an admission slot */
  int64_t adm_watermark;       /* that sync's watermark */
  char adm_epoch[STORE_EPOCH_MAX + 1]; /* and its epoch ("" when not given) */
  struct fill_job_s *sync_job; /* that sync's store job while it is in the pool */
  struct sub_s *next;
  session_t *session;
  char conv[STORE_ID_MAX + 1];
  char channel[STORE_ID_MAX + 1];
  char epoch[STORE_EPOCH_MAX + 1]; /* the conversation's epoch, as the store last said */
  int64_t delivered;
  int reset_pending; /* the next synced says "reset": a sync or fill found the history changed */
  int filling;
  int overflow;
  int sync_pending;
  int64_t sync_watermark;
  char sync_epoch[STORE_EPOCH_MAX + 1];
  uint64_t retry_at; /* monotonic ms: a failed fill starts again (session_tick); 0: none */
  int deferred;      /* a fill waits for the output to drain */
  int64_t deferred_after, deferred_upto;
  int deferred_synced;
  bus_msg_t **pending;
  size_t npending, cap;
  size_t pending_bytes; /* frame bytes held in pending */
} sub_t;

struct hello_job_s;

struct session_s {
  admission_waiter_t adm;            /* the hello waiting for, or holding, an admission slot */
  struct hello_job_s *hello;         /* the hello job waiting for its slot */
  struct hello_job_s *hello_running; /* the hello job in the pool */
  conn_t *conn;
  sessions_t *ss;
  uint64_t id;
  int hello_seen;
  auth_token_t token;
  sub_t *subs;
  uint64_t retry_due; /* the earliest retry_at of its subscriptions; 0: none */
  drain_mark_t drain_mark; /* this connection's drain state (gate/drain.h) */
};

drain_mark_t *session_drain_mark(session_t *s) { return s ? &s->drain_mark : NULL; }

/* 1 when the last change of `channel` since change `gen` deactivated it. */
static int deactivated_since(sessions_t *ss, uint64_t gen, const char *channel) {
  return bus_channel_last_change_since(ss->bus, gen, channel) == 0;
}

/* A retry hint for a refusal: uniform in the configured range, ms. */
static long retry_hint(sessions_t *ss) {
  return (long)jitter_retry_hint(ss->rng, ss->cfg->retry_after_min_ms, ss->cfg->retry_after_max_ms);
}

/* The deadline of interactive store work submitted now (CONVERGER_STORE_TIMEOUT_MS). */
static uint64_t store_deadline(const sessions_t *ss) {
  return util_mono_ms() + (uint64_t)ss->cfg->store_timeout_ms;
}

/* ---- sending -------------------------------------------------------------- */

static void send_text_owned(conn_t *c, char *text) {
  if (!text) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  ws_send_text(c, text, strlen(text));
  free(text);
}

static void send_error(conn_t *c, const char *code, const char *message, const char *conv,
                       long retry_after_ms, json_t *details) {
  send_text_owned(c, frame_error(code, message, conv, retry_after_ms, details));
}

static void count_handshake(const char *result) {
  char labels[64];
  snprintf(labels, sizeof labels, "result=\"%s\"", result);
  metrics_add("converger_handshakes_total", labels, 1);
}

/* `error unavailable` with a retry hint, then close 1013 with the same hint
 * in the reason (the admission-queue decision record). Steals `details`. */
static void refuse_unavailable(conn_t *c, const char *message, const char *conv, json_t *details) {
  long hint = retry_hint(c->session->ss);
  char reason[48];
  send_error(c, "unavailable", message, conv, hint, details);
  snprintf(reason, sizeof reason, "{\"retryAfterMs\":%ld}", hint);
  ws_close(c, WS_CLOSE_TRY_AGAIN_LATER, reason);
}

/* ---- subscriptions --------------------------------------------------------- */

static sub_t *find_sub(session_t *s, const char *conv) {
  for (sub_t *sub = s->subs; sub; sub = sub->next)
    if (strcmp(sub->conv, conv) == 0) return sub;
  return NULL;
}

static void clear_pending(sub_t *sub) {
  for (size_t i = 0; i < sub->npending; i++) bus_msg_unref(sub->pending[i]);
  sub->npending = 0;
  sub->pending_bytes = 0;
}

static void remove_sub(session_t *s, sub_t *sub) {
  for (sub_t **p = &s->subs; *p; p = &(*p)->next)
    if (*p == sub) {
      *p = sub->next;
      break;
    }
  admission_release(s->ss->admission, &sub->adm, util_mono_ms());
  bus_unsubscribe(s->ss->bus, &sub->bus);
  clear_pending(sub);
  free(sub->pending);
  free(sub);
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

static void send_live(sub_t *sub, bus_msg_t *m) {
  ws_send_frame(sub->session->conn, m->frame, m->frame_len);
  sub->delivered = m->seq;
  sub->session->ss->delivered_unflushed++;
}

static void fill_start(sub_t *sub, int64_t after, int64_t upto, int synced);
static void sync_acquire(sub_t *sub, int64_t watermark, const char *epoch);

/* Why a resume is answered with reset (metric label), or NULL: its
 * watermark is above the head, or it names another epoch than the
 * conversation's. A watermark of NONE (start at the head) never resets. */
static const char *reset_reason(int64_t watermark, const char *epoch, const store_conv_t *info) {
  if (watermark < 0) return NULL;
  if (epoch[0] && strcmp(epoch, info->epoch) != 0) return "epoch";
  return watermark > info->head ? "ahead" : NULL;
}

static void count_reset(const char *reason) {
  char labels[32];
  snprintf(labels, sizeof labels, "reason=\"%s\"", reason);
  metrics_add("converger_resets_total", labels, 1);
}

/* How far a fill must read before `m` can follow: up to the message
 * before it, or up to a head hint's seq itself (bus.h). */
static int64_t fill_target(const bus_msg_t *m) { return m->frame ? m->seq - 1 : m->seq; }

/* The fill reached its target: send synced if asked, then what waited. */
static void fill_finish(sub_t *sub, int64_t head, int synced) {
  conn_t *c = sub->session->conn;
  if (synced || sub->reset_pending)
    send_text_owned(c, frame_synced(sub->conv, head, sub->epoch, sub->reset_pending));
  sub->reset_pending = 0;
  sub->filling = 0;
  if (c->closing) return;
  if (sub->sync_pending) { /* a sync that came during the fill: it queues like any sync */
    sub->sync_pending = 0;
    sync_acquire(sub, sub->sync_watermark, sub->sync_epoch);
    return;
  }
  if (sub->overflow) {
    sub->overflow = 0;
    clear_pending(sub);
    fill_start(sub, sub->delivered, -1, 0);
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
    fill_start(sub, sub->delivered, -1, 0);
  } else if (sub->npending) {
    fill_start(sub, sub->delivered, fill_target(sub->pending[0]), 0);
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
  count_reset("epoch");
  strcpy(sub->epoch, m->epoch);
  if (sub->delivered >= m->seq) sub->delivered = m->seq - 1;
}

static void deliver_cb(bus_sub_t *bs, bus_msg_t *m) {
  sub_t *sub = container_of(bs, sub_t, bus);
  if (sub->session->conn->closing) return;
  if (m->epoch[0] && sub->epoch[0] && strcmp(m->epoch, sub->epoch) != 0) epoch_changed(sub, m);
  if (sub->filling) {
    pending_add(sub, m);
    return;
  }
  if (m->seq <= sub->delivered) return;
  if (m->frame && m->seq == sub->delivered + 1) {
    if (conn_pending_bytes(sub->session->conn) > OUT_HIGH_WATER) {
      /* The client reads slower than the conversation moves: the store is
       * its buffer. Catch up from there, paced, instead of queueing more. */
      fill_start(sub, sub->delivered, -1, 0);
      return;
    }
    send_live(sub, m);
    return;
  }
  pending_add(sub, m);
  fill_start(sub, sub->delivered, fill_target(m), 0);
}

/* ---- fill job: replay pages, sync, gap fill -------------------------------- */

typedef struct fill_job_s {
  pool_job_t job;
  conn_t *conn;
  char conv[STORE_ID_MAX + 1];
  int64_t after, upto;
  int synced;
  int admitted; /* the first job of a sync: its subscription holds an admission slot */
  int replayed; /* a replay query was made (worker thread; read in done) */
  int status;
  /* With upto < 0 the job reads the conversation: `epoch` is the epoch
   * `after` belongs to ("" unknown), and the worker sets `reset` (a
   * reset_reason) and `head_epoch` from what it read. */
  char epoch[STORE_EPOCH_MAX + 1];
  char head_epoch[STORE_EPOCH_MAX + 1];
  const char *reset;
  store_msg_t *msgs;
  size_t n;
} fill_job_t;

static void fill_work(pool_job_t *job, store_t *db) {
  fill_job_t *f = container_of(job, fill_job_t, job);
  if (f->upto < 0) {
    store_conv_t info;
    if ((f->status = store_conv_get(db, f->conv, &info)) != 0) return;
    f->upto = info.head;
    strcpy(f->head_epoch, info.epoch);
    if ((f->reset = reset_reason(f->after, f->epoch, &info)) != NULL) return;
  }
  if (f->after >= f->upto) return;
  f->replayed = 1;
  f->status = store_replay(db, f->conv, f->after, f->upto, STORE_REPLAY_PAGE_MAX, PAGE_BYTES,
                           &f->msgs, &f->n);
}

/* Send replayed messages above `delivered` in order. */
static void send_replay(sub_t *sub, const store_msg_t *msgs, size_t n) {
  conn_t *c = sub->session->conn;
  for (size_t i = 0; i < n && !c->closing; i++) {
    if (msgs[i].seq <= sub->delivered) continue;
    if (msgs[i].seq != sub->delivered + 1) break; /* never: the store is gapless */
    send_text_owned(c, frame_msg(sub->conv, &msgs[i]));
    sub->delivered = msgs[i].seq;
    sub->session->ss->delivered_unflushed++;
  }
}

/* `error replay_unavailable` for the replay from `watermark`, with the
 * retry hint `hint_ms`; the subscription stays. */
static void send_replay_unavailable(sub_t *sub, const char *message, int64_t watermark,
                                    long hint_ms) {
  json_t *details = json_pack("{s:I}", "watermark", (json_int_t)watermark);
  send_error(sub->session->conn, "replay_unavailable", message, sub->conv, hint_ms, details);
  sub->sync_pending = 0; /* the client syncs again after the hint */
}

/* A sync got no admission slot: replay_unavailable, and live delivery goes
 * on: what waited in `pending` goes out now (or is filled from the store
 * past an overflow), as after any fill. */
static void replay_unavailable(sub_t *sub, const char *message, int64_t watermark) {
  send_replay_unavailable(sub, message, watermark, retry_hint(sub->session->ss));
  fill_finish(sub, 0, 0);
}

/* A fill's store work failed (store down, pool overloaded): replay_unavailable,
 * and the subscription keeps filling, buffering live messages, until
 * session_tick starts the fill again after the same hint. Never at once: a
 * store that just failed would fail it again, in a loop. */
static void fill_failed(sub_t *sub, const char *message) {
  long hint = retry_hint(sub->session->ss);
  send_replay_unavailable(sub, message, sub->delivered, hint);
  sub->filling = 1;
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

static void fill_done(pool_job_t *job) {
  fill_job_t *f = container_of(job, fill_job_t, job);
  if (job->canceled) f->status = -CV_ECANCELED;
  if (job->dropped) /* the pool is overloaded, or the deadline passed in its queue */
    f->status = job->timed_out ? -CV_ETIMEDOUT : -CV_EBUSY;
  if (f->replayed) metrics_add("converger_replay_queries_total", "kind=\"fill\"", 1);
  if (f->admitted && f->conn->session) { /* the sync's store work is done: free its slot */
    sub_t *sub = find_sub(f->conn->session, f->conv);
    if (sub && sub->sync_job == f) {
      sub->sync_job = NULL;
      admission_release(f->conn->session->ss->admission, &sub->adm, util_mono_ms());
    }
  }
  if (conn_unref(f->conn)) {
    session_t *s = f->conn->session;
    sub_t *sub = s ? find_sub(s, f->conv) : NULL;
    if (sub && f->status != 0) {
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
      fill_finish(sub, sub->delivered, f->synced);
    } else if (sub && f->reset && !f->admitted && strcmp(f->reset, "epoch") == 0 &&
               strcmp(sub->epoch, f->head_epoch) == 0) {
      /* A fill of the node's own, whose epoch a live message moved on
       * while it was out (epoch_changed): not a reset any more; read
       * again in the new epoch. (A client's sync keeps its own epoch.) */
      fill_start(sub, sub->delivered, -1, f->synced);
    } else if (sub && f->reset) {
      /* The history the subscription was in is not the store's: from the
       * head, and the client is told (synced with reset). What waits in
       * `pending` at or below the head is dropped by fill_finish. */
      log_debug("session %llu: %s resets: watermark %lld epoch \"%s\", head %lld epoch %s (%s)",
                (unsigned long long)s->id, f->conv, (long long)f->after, f->epoch,
                (long long)f->upto, f->head_epoch, f->reset);
      count_reset(f->reset);
      sub->delivered = f->upto;
      strcpy(sub->epoch, f->head_epoch);
      sub->reset_pending = 1;
      fill_finish(sub, f->upto, f->synced);
    } else if (sub) {
      if (f->head_epoch[0]) strcpy(sub->epoch, f->head_epoch);
      /* Only a target given by the caller (a head hint) can be below
       * `delivered`; a head read from the store was checked above. */
      if (sub->delivered > f->upto) sub->delivered = f->upto;
      if (conn_pending_bytes(f->conn) > OUT_HIGH_WATER) {
        /* Other pages filled the output meanwhile: read this one again
         * once the client has caught up. */
        fill_start(sub, sub->delivered, f->upto, f->synced);
        goto out;
      }
      int64_t before = sub->delivered;
      send_replay(sub, f->msgs, f->n);
      if (sub->delivered >= f->upto)
        fill_finish(sub, f->upto, f->synced);
      else if (sub->delivered == before) /* never for a gapless store */
        fill_failed(sub, "replay made no progress; sync again later");
      else
        fill_start(sub, sub->delivered, f->upto, f->synced);
    }
  }
out:
  store_msgs_free(f->msgs, f->n);
  free(f);
}

static void fill_submit(sub_t *sub, int64_t after, int64_t upto, int synced, int admitted,
                        const char *epoch);

static void fill_start(sub_t *sub, int64_t after, int64_t upto, int synced) {
  fill_submit(sub, after, upto, synced, 0, sub->epoch);
}

/* fill_start for the first job of a sync that holds an admission slot:
 * never deferred (the slot is released when the job returns). `epoch` is
 * the epoch `after` is in ("": unknown). */
static void fill_submit(sub_t *sub, int64_t after, int64_t upto, int synced, int admitted,
                        const char *epoch) {
  conn_t *c = sub->session->conn;
  sub->filling = 1;
  if (!admitted && conn_pending_bytes(c) > OUT_HIGH_WATER) {
    /* Let the client read what it has first: session_on_writable resumes. */
    sub->deferred = 1;
    sub->deferred_after = after;
    sub->deferred_upto = upto;
    sub->deferred_synced = synced;
    return;
  }
  fill_job_t *f = calloc(1, sizeof *f);
  if (!f) {
    if (admitted) admission_release(c->session->ss->admission, &sub->adm, util_mono_ms());
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  f->conn = c;
  strcpy(f->conv, sub->conv);
  f->after = after;
  f->upto = upto;
  f->synced = synced;
  f->admitted = admitted;
  snprintf(f->epoch, sizeof f->epoch, "%s", epoch);
  if (admitted) sub->sync_job = f;
  f->job.kind = admitted ? "sync" : "fill";
  f->job.deadline_ms = store_deadline(c->session->ss);
  conn_ref(c);
  pool_submit(*c->session->ss->pool, &f->job, fill_work, fill_done);
}

/* ---- hello ------------------------------------------------------------------ */

typedef struct {
  char conv[STORE_ID_MAX + 1];
  int64_t watermark;
  char epoch[STORE_EPOCH_MAX + 1]; /* the client's, "" when not given */
  const char *reset;               /* a reset_reason (worker thread; read in done) */
  int status;
  int replayed; /* a replay query was made (worker thread; read in done) */
  store_conv_t info;
  store_msg_t *msgs;
  size_t n;
} hello_item_t;

typedef struct hello_job_s {
  pool_job_t job;
  conn_t *conn;
  uint64_t deact_gen; /* deactivations seen when the job was submitted */
  size_t n;
  hello_item_t items[];
} hello_job_t;

/* Approximate bytes of a msg frame: the JSON around the fields, the fields. */
static size_t frame_bytes(const char *conv, const store_msg_t *m) {
  return 110 + strlen(conv) + strlen(m->id) + strlen(m->sender) + strlen(m->body);
}

/* One handshake = one pool job (one checkout): conversation, channel flags
 * and head in one read, then the first replay page unless the watermark is
 * already at the head (the admission-queue decision record). */
static void hello_work(pool_job_t *job, store_t *db) {
  hello_job_t *h = container_of(job, hello_job_t, job);
  size_t budget = HELLO_BYTES;  /* first pages of all subs together */
  int r = store_read_begin(db); /* one snapshot for every sub's head and replay */
  for (size_t i = 0; i < h->n && r != 0; i++) h->items[i].status = r;
  for (size_t i = 0; i < h->n && r == 0; i++) {
    hello_item_t *it = &h->items[i];
    it->status = store_conv_get(db, it->conv, &it->info);
    if (it->status != 0) continue;
    if (!it->info.channel_active) {
      it->status = -CV_EINACTIVE;
      continue;
    }
    /* The replay is skipped at the head and for a reset; past the budget
     * the rest of the replay comes in paced fill pages. */
    it->reset = reset_reason(it->watermark, it->epoch, &it->info);
    if (!it->reset && it->watermark >= 0 && it->watermark < it->info.head && budget > 0) {
      it->replayed = 1;
      it->status = store_replay(db, it->conv, it->watermark, it->info.head, STORE_REPLAY_PAGE_MAX,
                                budget < PAGE_BYTES ? budget : PAGE_BYTES, &it->msgs, &it->n);
      for (size_t k = 0; k < it->n; k++) {
        size_t b = frame_bytes(it->conv, &it->msgs[k]);
        budget = b < budget ? budget - b : 0;
      }
    }
  }
  store_read_end(db);
}

static void hello_done(pool_job_t *job) {
  hello_job_t *h = container_of(job, hello_job_t, job);
  if (job->canceled || job->dropped) { /* stopping, overloaded, or past the deadline */
    int st = !job->dropped ? -CV_ECANCELED : job->timed_out ? -CV_ETIMEDOUT : -CV_EBUSY;
    for (size_t i = 0; i < h->n; i++) h->items[i].status = st;
  }
  for (size_t i = 0; i < h->n; i++)
    if (h->items[i].replayed) metrics_add("converger_replay_queries_total", "kind=\"hello\"", 1);
  if (h->conn->session && h->conn->session->hello_running == h) {
    /* the store work is done: the slot goes to the next handshake */
    h->conn->session->hello_running = NULL;
    admission_release(h->conn->session->ss->admission, &h->conn->session->adm, util_mono_ms());
  }
  if (conn_unref(h->conn) && h->conn->session) {
    conn_t *c = h->conn;
    session_t *s = c->session;
    for (size_t i = 0; i < h->n; i++) {
      int st = h->items[i].status;
      if (st != 0 && st != -CV_ENOTFOUND && st != -CV_EINACTIVE) {
        /* The store failed or the pool dropped the job: the handshake
         * cannot be served now. */
        log_warn("session %llu: handshake failed: %s", (unsigned long long)s->id, cv_strerror(st));
        count_handshake(st == -CV_EBUSY ? "overloaded" : "unavailable");
        refuse_unavailable(c,
                           st == -CV_EBUSY ? "store overloaded; reconnect later"
                                           : "store unavailable; reconnect later",
                           NULL, NULL);
        goto out;
      }
    }
    json_t *subs = json_array();
    for (size_t i = 0; i < h->n; i++) {
      hello_item_t *it = &h->items[i];
      sub_t *sub = find_sub(s, it->conv);
      if (!sub) continue;
      if (it->status == 0 && deactivated_since(s->ss, h->deact_gen, it->info.channel))
        it->status = -CV_EINACTIVE; /* deactivated after our read */
      if (it->status != 0) {
        if (it->status == -CV_ENOTFOUND)
          send_error(c, "not_found", "no such conversation", it->conv, 0, NULL);
        else
          send_error(c, "channel_inactive", "the conversation's channel is inactive", it->conv, 0,
                     NULL);
        remove_sub(s, sub);
        continue;
      }
      strcpy(sub->channel, it->info.channel);
      strcpy(sub->epoch, it->info.epoch);
      json_t *entry =
          json_pack("{s:s, s:I, s:s, s:b}", "conv", it->conv, "head", (json_int_t)it->info.head,
                    "epoch", it->info.epoch, "presence", it->info.presence);
      if (entry && it->reset) {
        json_object_set_new(entry, "reset", json_true());
        count_reset(it->reset);
      }
      json_array_append_new(subs, entry);
    }
    char session_id[32];
    snprintf(session_id, sizeof session_id, "%llu", (unsigned long long)s->id);
    json_t *welcome =
        json_pack("{s:s, s:s, s:s, s:i, s:o}", "type", "welcome", "session", session_id, "node",
                  s->ss->cfg->node_id, "heartbeatMs", s->ss->cfg->heartbeat_ms, "subs", subs);
    send_text_owned(c, frame_dump(welcome));
    json_decref(welcome);
    count_handshake("ok");
    s->drain_mark.welcomed = 1;
    if (s->drain_mark.batch) drain_welcomed(*s->ss->drain, c); /* told now, not before welcome */
    for (size_t i = 0; i < h->n && !c->closing; i++) {
      hello_item_t *it = &h->items[i];
      sub_t *sub = it->status == 0 ? find_sub(s, it->conv) : NULL;
      if (!sub) continue;
      int64_t head = it->info.head;
      /* null: start at the head; a reset (told in the welcome) too */
      sub->delivered = it->watermark < 0 || it->reset ? head : it->watermark;
      /* Pace the first pages too: past the high-water mark the page is
       * read again later, when the client has taken what it has. */
      if (conn_pending_bytes(c) <= OUT_HIGH_WATER) send_replay(sub, it->msgs, it->n);
      if (sub->delivered < head)
        fill_start(sub, sub->delivered, head, 1);
      else
        fill_finish(sub, head, 1);
    }
  }
out:
  for (size_t i = 0; i < h->n; i++) store_msgs_free(h->items[i].msgs, h->items[i].n);
  free(h);
}

/* The hello has its admission slot: subscribe (before the head is read,
 * so anything committed from now on arrives live and waits in `pending`)
 * and run the handshake's one pool job. */
static void hello_submit(session_t *s) {
  hello_job_t *h = s->hello;
  conn_t *c = s->conn;
  s->hello = NULL;
  for (size_t i = 0; i < h->n; i++) {
    sub_t *sub = calloc(1, sizeof *sub);
    if (!sub) {
      free(h);
      admission_release(s->ss->admission, &s->adm, util_mono_ms());
      ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
      return;
    }
    sub->session = s;
    strcpy(sub->conv, h->items[i].conv);
    sub->bus.conv = sub->conv;
    sub->bus.deliver = deliver_cb;
    sub->filling = 1; /* until the handshake job returns */
    sub->next = s->subs;
    s->subs = sub;
    bus_subscribe(s->ss->bus, &sub->bus);
  }
  h->deact_gen = bus_channel_gen(s->ss->bus);
  h->job.kind = "hello";
  h->job.deadline_ms = store_deadline(s->ss);
  s->hello_running = h;
  conn_ref(c);
  pool_submit(*s->ss->pool, &h->job, hello_work, hello_done);
}

static void observe_admission(const char *result, uint64_t waited_ms) {
  char labels[32];
  snprintf(labels, sizeof labels, "result=\"%s\"", result);
  metrics_observe_labels("converger_protocol_admission_wait_ms", labels, (double)waited_ms);
}

/* No slot for the hello: the refusal clients already know from a
 * saturated pool, unavailable then 1013, both with a jittered hint. */
static void hello_overloaded(session_t *s, const char *message, uint64_t waited_ms) {
  free(s->hello);
  s->hello = NULL;
  observe_admission("overloaded", waited_ms);
  count_handshake("overloaded");
  refuse_unavailable(s->conn, message, NULL, NULL);
}

static void hello_admitted(admission_waiter_t *w, int status, uint64_t waited_ms) {
  session_t *s = container_of(w, session_t, adm);
  if (status != 0) {
    char message[96];
    snprintf(message, sizeof message, "no handshake slot within %d ms; reconnect later",
             s->ss->cfg->handshake_queue_ms);
    hello_overloaded(s, message, waited_ms);
    return;
  }
  observe_admission("ok", waited_ms);
  hello_submit(s);
}

static void handle_hello(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  const char *why = NULL;
  if (auth_verify(s->ss->auth, f->token, util_now_ms() / 1000, &s->token, &why) != 0 ||
      auth_is_revoked(s->ss->auth, s->token.jti)) {
    if (!why) why = "token revoked";
    count_handshake("unauthorized");
    send_error(c, "unauthorized", why, NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "unauthorized");
    return;
  }
  s->hello_seen = 1;
  c->deadline_ms = 0;
  hello_job_t *h = calloc(1, sizeof *h + f->nsubs * sizeof h->items[0]);
  if (!h) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  h->conn = c;
  for (size_t i = 0; i < f->nsubs; i++) {
    const char *conv = f->subs[i].conv;
    if (!s->token.can_read || !auth_token_allows(&s->token, conv)) {
      send_error(c, "forbidden", "the token does not cover this conversation", conv, 0, NULL);
      continue;
    }
    hello_item_t *it = &h->items[h->n++];
    strcpy(it->conv, conv);
    it->watermark = f->subs[i].watermark;
    strcpy(it->epoch, f->subs[i].epoch);
  }
  /* The store work of a handshake waits for an admission slot (the
   * admission-queue decision record): a burst queues here, in order,
   * instead of piling into the pool. */
  s->hello = h;
  int r = admission_acquire(s->ss->admission, &s->adm, util_mono_ms(), hello_admitted);
  if (r == ADMISSION_GRANTED) {
    observe_admission("ok", 0);
    hello_submit(s);
  } else if (r != ADMISSION_QUEUED) {
    hello_overloaded(s, "the handshake queue is full; reconnect later", 0);
  }
}

/* ---- send ------------------------------------------------------------------- */

typedef struct {
  pool_job_t job;
  conn_t *conn;
  char conv[STORE_ID_MAX + 1];
  char id[STORE_ID_MAX + 1];
  char sender[STORE_ID_MAX + 1];
  char *body;
  int status;
  int created;
  bus_t *bus; /* the appends fan out through it (the node outlives every job) */
  store_msg_t msg;
} send_job_t;

static void send_work(pool_job_t *job, store_t *db) {
  send_job_t *j = container_of(job, send_job_t, job);
  j->status = bus_append(j->bus, db, j->conv, j->id, j->sender, j->body, util_now_ms(), &j->msg,
                         &j->created);
}

static void send_done(pool_job_t *job) {
  send_job_t *j = container_of(job, send_job_t, job);
  if (job->canceled) j->status = -CV_ECANCELED;
  if (job->dropped) /* the pool is overloaded, or the deadline passed in its queue */
    j->status = job->timed_out ? -CV_ETIMEDOUT : -CV_EBUSY;
  if (conn_unref(j->conn)) {
    conn_t *c = j->conn;
    json_t *details = json_pack("{s:s}", "id", j->id);
    switch (j->status) {
    case 0:
      json_decref(details);
      send_text_owned(c, frame_sent(j->conv, j->msg.id, j->msg.seq));
      break;
    case -CV_ENOTFOUND:
      send_error(c, "not_found", "no such conversation", j->conv, 0, details);
      break;
    case -CV_EINACTIVE:
      send_error(c, "channel_inactive", "the conversation's channel is inactive", j->conv, 0,
                 details);
      break;
    default:
      /* The client reconnects after the hint and sends again with the same
       * id (docs/protocol.md: unavailable is followed by 1013). */
      log_warn("send to %s failed: %s", j->conv, cv_strerror(j->status));
      refuse_unavailable(c, "store unavailable; send again later", j->conv, details);
      break;
    }
  }
  store_msg_clear(&j->msg);
  free(j->body);
  free(j);
}

static void handle_send(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  json_t *details = json_pack("{s:s}", "id", f->id);
  if (!s->token.can_write || !auth_token_allows(&s->token, f->conv)) {
    send_error(c, "forbidden", "the token may not send to this conversation", f->conv, 0, details);
    return;
  }
  json_decref(details);
  send_job_t *j = calloc(1, sizeof *j);
  if (!j || !(j->body = frame_dump(f->body))) {
    free(j);
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  j->conn = c;
  j->bus = s->ss->bus;
  strcpy(j->conv, f->conv);
  strcpy(j->id, f->id);
  strcpy(j->sender, s->token.sub);
  j->job.kind = "ws_send";
  j->job.deadline_ms = store_deadline(s->ss);
  conn_ref(c);
  pool_submit(*s->ss->pool, &j->job, send_work, send_done);
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
  observe_admission("overloaded", waited_ms);
  replay_unavailable(sub, message, sub->adm_watermark);
}

static void sync_admitted(admission_waiter_t *w, int status, uint64_t waited_ms) {
  sub_t *sub = container_of(w, sub_t, adm);
  if (status != 0) {
    sync_refused(sub, "no replay slot in time; sync again later", waited_ms);
    return;
  }
  observe_admission("ok", waited_ms);
  sync_begin(sub);
}

static void sync_acquire(sub_t *sub, int64_t watermark, const char *epoch) {
  sessions_t *ss = sub->session->ss;
  sub->adm_watermark = watermark;
  snprintf(sub->adm_epoch, sizeof sub->adm_epoch, "%s", epoch);
  int r = admission_acquire(ss->admission, &sub->adm, util_mono_ms(), sync_admitted);
  if (r == ADMISSION_GRANTED) {
    observe_admission("ok", 0);
    sync_begin(sub);
  } else if (r == ADMISSION_QUEUED) {
    sub->filling = 1; /* live messages wait in `pending` meanwhile */
  } else {
    sync_refused(sub, "the replay queue is full; sync again later", 0);
  }
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

void session_on_text(conn_t *c, const char *text, size_t len) {
  session_t *s = c->session;
  frame_client_t f;
  char why[200];
  if (!s) return;
  if (frame_decode(text, len, s->ss->cfg->max_subs, &f, why, sizeof why) != 0) {
    send_error(c, "bad_request", why, NULL, 0, NULL);
    if (!s->hello_seen) {
      count_handshake("bad_request");
      /* An invalid hello may be corrected within the hello timeout; any
       * other first frame is a policy violation. */
      if (!f.known_type || f.type != FRAME_HELLO)
        ws_close(c, WS_CLOSE_POLICY_VIOLATION, "the first frame must be hello");
    }
    return;
  }
  if (!s->hello_seen && f.type != FRAME_HELLO) {
    count_handshake("bad_request");
    send_error(c, "bad_request", "the first frame must be hello", NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "the first frame must be hello");
    frame_client_clear(&f);
    return;
  }
  switch (f.type) {
  case FRAME_HELLO:
    if (s->hello_seen)
      send_error(c, "bad_request", "hello was already received on this connection", NULL, 0, NULL);
    else
      handle_hello(s, &f);
    break;
  case FRAME_SYNC: {
    sub_t *sub = find_sub(s, f.conv);
    if (!sub) {
      send_error(c, "bad_request", "sync for a conversation this connection is not subscribed to",
                 f.conv, 0, NULL);
    } else if (sub->filling) {
      if (!sub->sync_pending || f.watermark < sub->sync_watermark) {
        sub->sync_watermark = f.watermark;
        strcpy(sub->sync_epoch, f.epoch);
      }
      sub->sync_pending = 1;
    } else {
      sync_acquire(sub, f.watermark, f.epoch);
    }
    break;
  }
  case FRAME_SEND:
    handle_send(s, &f);
    break;
  case FRAME_PING:
    send_text_owned(c, frame_pong());
    break;
  }
  frame_client_clear(&f);
}

void session_tick(conn_t *c, uint64_t now) {
  session_t *s = c->session;
  if (!s || c->closing) return; /* no session: its start failed, the close is under way */
  sessions_t *ss = s->ss;
  if (!s->hello_seen && c->deadline_ms && now >= c->deadline_ms) {
    count_handshake("timeout");
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "no hello in time");
    return;
  }
  if (now - c->last_rx_ms > 2 * (uint64_t)ss->cfg->heartbeat_ms) {
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
    if (sub->retry_at && now >= sub->retry_at) {
      sub->retry_at = 0;
      fill_start(sub, sub->delivered, -1, 0); /* up to the head, then what waited */
    }
    /* not due yet, or failed again at once: the next one to wait for */
    if (sub->retry_at && (!s->retry_due || sub->retry_at < s->retry_due))
      s->retry_due = sub->retry_at;
  }
}

void session_on_writable(conn_t *c) {
  session_t *s = c->session;
  if (!s || c->closing) return;
  for (sub_t *sub = s->subs; sub; sub = sub->next) {
    if (!sub->deferred) continue;
    if (conn_pending_bytes(c) > OUT_HIGH_WATER) return;
    sub->deferred = 0;
    fill_start(sub, sub->deferred_after, sub->deferred_upto, sub->deferred_synced);
  }
}

void session_flush_metrics(sessions_t *ss) {
  if (ss->delivered_unflushed) {
    metrics_add("converger_messages_delivered_total", NULL, ss->delivered_unflushed);
    ss->delivered_unflushed = 0;
  }
}

void session_on_close(session_t *s) {
  if (!s) return;
  sessions_t *ss = s->ss;
  uint64_t now = util_mono_ms();
  if (*ss->drain) drain_conn_closing(*ss->drain, s->conn);
  /* Waiters leave the queue. */
  if (s->adm.state == ADMISSION_WAITING) admission_release(ss->admission, &s->adm, now);
  for (sub_t *sub = s->subs; sub; sub = sub->next)
    if (sub->adm.state == ADMISSION_WAITING) admission_release(ss->admission, &sub->adm, now);
  free(s->hello); /* a hello that was still waiting for its slot */
  s->hello = NULL;
  /* A holder whose job has not started takes it back and frees its slot
   * now; one whose job runs frees it when the job returns (its done
   * callback), so that jobs in the pool never outnumber the slots. */
  if (s->hello_running && *ss->pool && pool_cancel(*ss->pool, &s->hello_running->job)) {
    s->hello_running = NULL;
    admission_release(ss->admission, &s->adm, now);
  }
  for (sub_t *sub = s->subs; sub; sub = sub->next)
    if (sub->sync_job && *ss->pool && pool_cancel(*ss->pool, &sub->sync_job->job)) {
      sub->sync_job = NULL;
      admission_release(ss->admission, &sub->adm, now);
    }
}

void session_free(session_t *s) {
  if (!s) return;
  session_on_close(s);
  while (s->subs) remove_sub(s, s->subs);
  auth_token_clear(&s->token);
  free(s);
}

void session_revoke_jti(sessions_t *ss, const char *jti) {
  for (conn_t *c = ss->net->conns; c; c = c->next) {
    session_t *s = c->session;
    if (!s || c->closing || !s->hello_seen || !s->token.jti[0]) continue;
    if (jti ? strcmp(s->token.jti, jti) != 0 : !auth_is_revoked(ss->auth, s->token.jti)) continue;
    send_error(c, "unauthorized", "token revoked", NULL, 0, NULL);
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
      if (strcmp(sub->channel, channel) == 0) {
        send_error(c, "channel_inactive", "the conversation's channel was deactivated", sub->conv,
                   0, NULL);
        remove_sub(s, sub);
      }
      sub = next;
    }
  }
}

void session_close_all(sessions_t *ss, int code, const char *reason) {
  for (conn_t *c = ss->net->conns; c; c = c->next)
    if (c->mode == CONN_WS && !c->closing) ws_close(c, code, reason);
}
