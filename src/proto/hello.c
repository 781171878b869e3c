/*
 * hello.c: the hello of a session (session_int.h), with its admission: the
 * slot is acquired here (handle_hello), given back when the hello's one
 * store job returns (hello_done) or when the connection closes before
 * (session_on_close in session.c, which also cancels a job not started).
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

/* ---- hello ------------------------------------------------------------------ */

typedef struct {
  char conv[STORE_ID_MAX + 1];
  uint64_t gen; /* its subscription's (sub_t.gen) */
  int64_t watermark;
  char epoch[STORE_EPOCH_MAX + 1]; /* the client's, "" when not given */
  const char *reset;               /* a sub_reset_reason (worker thread; read in done) */
  int status;
  int replayed; /* a replay query was made (worker thread; read in done) */
  int row; /* its presence row: 0 not written, 1 written, 2 written as a join (worker; read in done)
            */
  int presence_events;
  store_conv_t info;
  store_msg_t *msgs;
  size_t n;
} hello_item_t;

typedef struct hello_job_s {
  pool_job_t job;
  conn_t *conn;
  sessions_t *ss;     /* the connection's session may be gone when the job is done */
  uint64_t deact_gen; /* deactivations seen when the job was submitted */
  char client[STORE_ID_MAX + 1], user[STORE_ID_MAX + 1]; /* whose presence rows */
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
    it->reset = sub_reset_reason(it->watermark, it->epoch, &it->info);
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
  /* In a cluster, the presence rows in the same checkout (after the read:
   * they are writes), so the hello stays one job; none for a hello that
   * will be refused (a store error in any entry). */
  for (size_t i = 0; i < h->n; i++) {
    int st = h->items[i].status;
    if (st != 0 && st != -CV_ENOTFOUND && st != -CV_EINACTIVE && st != -CV_ESHARD) r = st;
  }
  for (size_t i = 0; i < h->n && r == 0 && h->ss->shared; i++)
    if (h->items[i].status == 0 && h->items[i].info.presence)
      h->items[i].row =
          1 + session_presence_store_join(h->ss, db, h->items[i].conv, h->client, h->user);
}

static void hello_done(pool_job_t *job) {
  hello_job_t *h = container_of(job, hello_job_t, job);
  int unrun = pool_job_unrun(job); /* stopping, overloaded, or past the deadline */
  for (size_t i = 0; i < h->n && unrun; i++) h->items[i].status = unrun;
  for (size_t i = 0; i < h->n; i++) {
    if (h->items[i].replayed)
      metrics_add(h->ss->metrics, "converger_replay_queries_total", "kind=\"hello\"", 1);
    if (h->items[i].row) /* this node's row: see session_presence_orphan */
      session_presence_orphan(h->ss, h->items[i].conv, h->user, h->client, h->items[i].row == 2);
  }
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
      if (st != 0 && st != -CV_ENOTFOUND && st != -CV_EINACTIVE && st != -CV_ESHARD) {
        /* The store failed or the pool dropped the job: the handshake
         * cannot be served now. */
        log_warn("session %llu: handshake failed: %s", (unsigned long long)s->id, cv_strerror(st));
        session_count_handshake(s->ss, st == -CV_EBUSY ? "overloaded" : "unavailable");
        session_refuse_unavailable(c,
                                   st == -CV_EBUSY ? "store overloaded; reconnect later"
                                                   : "store unavailable; reconnect later",
                                   NULL, NULL);
        goto out;
      }
    }
    json_t *subs = json_array();
    for (size_t i = 0; i < h->n; i++) {
      hello_item_t *it = &h->items[i];
      sub_t *sub = session_find_sub_gen(s, it->conv, it->gen);
      if (!sub) continue; /* unsubscribed meanwhile */
      if (it->status == 0 && session_deactivated_since(s->ss, h->deact_gen, it->info.channel))
        it->status = -CV_EINACTIVE; /* deactivated after our read */
      if (it->status != 0) {
        const char *message, *code = session_conv_error(it->status, &message);
        long hint = 0;
        if (it->status == -CV_ESHARD) { /* this conversation's shard only: subscribe again */
          code = "unavailable";
          message = "the conversation's shard is unavailable; subscribe again after the hint";
          hint = config_retry_hint(s->ss->cfg, s->ss->rng);
        }
        /* the hello entry's answer, then each subscribe's sent meanwhile */
        session_send_error(c, code, message, it->conv, hint, NULL);
        sub_refuse(sub, code, message, hint);
        if (ws_close_sent(c)) { /* a stream refused whole (net/ws.h) */
          json_decref(subs);
          goto out;
        }
        continue;
      }
      if (sub_set_channel(sub, it->info.channel) != 0) {
        json_decref(subs);
        ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
        goto out;
      }
      strcpy(sub->epoch, it->info.epoch);
      sub->presence = it->info.presence != 0;
      sub->signals = it->info.signals != 0;
      sub->announced = 1;
      /* null: start at the head; a reset (told in the welcome) too. Set for
       * every entry before any replay, so a stream's event ids say them all. */
      sub->delivered = it->watermark < 0 || it->reset ? it->info.head : it->watermark;
      json_t *entry =
          json_pack("{s:s, s:I, s:s, s:b}", "conv", it->conv, "head", (json_int_t)it->info.head,
                    "epoch", it->info.epoch, "presence", it->info.presence);
      if (entry && it->reset) {
        json_object_set_new(entry, "reset", json_true());
        sub_count_reset(s->ss, it->reset);
      }
      json_array_append_new(subs, entry);
    }
    char session_id[32];
    snprintf(session_id, sizeof session_id, "%llu", (unsigned long long)s->id);
    json_t *welcome =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:o}", "type", "welcome", "session",
                  session_id, "node", s->ss->cfg->node_id, "protocol", FRAME_PROTOCOL_VERSION,
                  "clientId", s->client_id, "heartbeatMs", s->ss->cfg->heartbeat_ms, "expiresInMs",
                  (json_int_t)session_token_expires_in(s, util_mono_ms()), "subs", subs);
    session_send_owned(c, frame_dump(welcome));
    json_decref(welcome);
    for (size_t i = 0; i < h->n; i++) { /* present from the welcome on; answered */
      sub_t *sub = h->items[i].status == 0
                       ? session_find_sub_gen(s, h->items[i].conv, h->items[i].gen)
                       : NULL;
      if (sub && sub->announced) {
        session_presence_on(sub);
        sub_answer_already(sub); /* subscribes of it sent before the welcome */
      }
    }
    metrics_observe(s->ss->metrics, "converger_hello_latency_ms",
                    (double)(util_mono_ms() - s->hello_ms));
    session_count_handshake(s->ss, "ok");
    s->drain_mark.welcomed = 1;
    if (s->drain_mark.batch) drain_welcomed(*s->ss->drain, c); /* told now, not before welcome */
    for (size_t i = 0; i < h->n && !c->closing; i++) {
      hello_item_t *it = &h->items[i];
      sub_t *sub = it->status == 0 ? session_find_sub_gen(s, it->conv, it->gen) : NULL;
      if (!sub) continue;
      int64_t head = it->info.head;
      /* Pace the first pages too: past the high-water mark the page is
       * read again later, when the client has taken what it has. */
      if (conn_pending_bytes(c) <= OUT_HIGH_WATER) sub_send_replay(sub, it->msgs, it->n);
      if (sub->delivered < head)
        sub_fill_start(sub, sub->delivered, head, 1);
      else
        sub_fill_finish(sub, head, 1);
    }
    if (!c->closing) sub_after_welcome(s);
  }
out:
  for (size_t i = 0; i < h->n; i++) store_msgs_free(h->items[i].msgs, h->items[i].n);
  free(h);
}

/* The hello has its admission slot: run the handshake's one pool job.
 * Its subscriptions were made at the hello, before the head is read, so
 * anything committed from then on arrives live and waits in `pending`. */
static void hello_submit(session_t *s) {
  hello_job_t *h = s->hello;
  conn_t *c = s->conn;
  s->hello = NULL;
  for (size_t i = 0; i < h->n; i++) { /* made at the hello; gone if unsubscribed meanwhile */
    sub_t *sub = session_find_sub_gen(s, h->items[i].conv, h->items[i].gen);
    if (sub && sub->state == SUB_QUEUED && sub_set_state(sub, SUB_FILLING) != 0) {
      /* Refused (sub_set_state logged a BUG and closed the connection
       * with 1011): no store work for a closing connection. Its close
       * passed this hello by (s->hello already NULL, hello_running not
       * set: session_hello_leave and session_hello_cancel) and will
       * again, so its job, never submitted, and the slot it was granted
       * are given back here. Unreachable while the table has QUEUED to
       * FILLING. */
      free(h);
      admission_release(s->ss->admission, &s->adm, util_mono_ms());
      return;
    }
  }
  h->deact_gen = bus_channel_gen(s->ss->bus);
  h->job.kind = "hello";
  h->job.deadline_ms = config_store_deadline(s->ss->cfg);
  s->hello_running = h;
  conn_ref(c);
  pool_submit(*s->ss->pool, &h->job, hello_work, hello_done);
}

/* No slot for the hello: the refusal clients already know from a
 * saturated pool, unavailable then 1013, both with a jittered hint. */
static void hello_overloaded(session_t *s, const char *message, uint64_t waited_ms) {
  free(s->hello);
  s->hello = NULL;
  session_observe_admission(s->ss, "overloaded", waited_ms);
  session_count_handshake(s->ss, "overloaded");
  session_refuse_unavailable(s->conn, message, NULL, NULL);
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
  session_observe_admission(s->ss, "ok", waited_ms);
  hello_submit(s);
}

void session_handle_hello(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  const char *why = NULL;
  auth_token_t t = {0};
  if (auth_verify(s->ss->auth, f->token, util_now_ms() / 1000, &t, &why) != 0 ||
      auth_is_revoked(s->ss->auth, t.jti)) {
    if (!why) why = "token revoked";
    auth_token_clear(&t);
    session_count_handshake(s->ss, "unauthorized");
    session_send_error(c, "unauthorized", why, NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "unauthorized");
    return;
  }
  int max_user = s->ss->cfg->max_conns_per_user;
  if (max_user > 0 && s->ss->users && users_count(s->ss->users, t.sub) >= max_user) {
    char msg[96];
    snprintf(msg, sizeof msg, "this user already holds %d connections on this node", max_user);
    auth_token_clear(&t);
    session_count_handshake(s->ss, "too_many_connections");
    session_send_error(c, "too_many_connections", msg, NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "too_many_connections");
    return;
  }
  /* One client instance across its reconnects and drain moves; a client
   * that names none is this connection alone. */
  char client_id[STORE_ID_MAX + 1];
  if (f->client_id)
    snprintf(client_id, sizeof client_id, "%s", f->client_id);
  else
    snprintf(client_id, sizeof client_id, "s-%016llx",
             (unsigned long long)jitter_next(s->ss->rng)); /* unique on every node */
  if (session_token_set(s, &t, client_id) != 0) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  if (s->ss->users && users_add(s->ss->users, s->user) > 0) s->user_counted = 1;
  s->hello_seen = 1;
  s->hello_ms = util_mono_ms();
  c->deadline_ms = 0;
  hello_job_t *h = calloc(1, sizeof *h + f->nsubs * sizeof h->items[0]);
  if (!h) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  h->conn = c;
  h->ss = s->ss;
  strcpy(h->client, s->client_id);
  strcpy(h->user, s->user);
  for (size_t i = 0; i < f->nsubs; i++) {
    const char *conv = f->subs[i].conv;
    if (!session_may_read(s, conv)) {
      session_send_error(c, "forbidden", "the token does not cover this conversation", conv, 0,
                         NULL);
      continue;
    }
    /* The subscription exists from now on (in the bus index, keeping live
     * messages), so that a subscribe, unsubscribe, sync or refresh sent
     * before the welcome finds it; it waits for the hello's slot. */
    sub_t *sub = sub_new(s, conv);
    if (!sub) {
      free(h);
      ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
      return;
    }
    if (sub_set_state(sub, SUB_QUEUED) != 0) {
      free(h);
      return;
    }
    sub->presence_events = f->subs[i].presence_events;
    hello_item_t *it = &h->items[h->n++];
    strcpy(it->conv, conv);
    it->gen = sub->gen;
    it->watermark = f->subs[i].watermark;
    strcpy(it->epoch, f->subs[i].epoch);
  }
  /* The store work of a handshake waits for an admission slot (the
   * admission-queue decision record): a burst queues here, in order,
   * instead of piling into the pool. */
  s->hello = h;
  int r = admission_acquire(s->ss->admission, &s->adm, util_mono_ms(), hello_admitted);
  if (r == ADMISSION_GRANTED) {
    session_observe_admission(s->ss, "ok", 0);
    hello_submit(s);
  } else if (r != ADMISSION_QUEUED) {
    hello_overloaded(s, "the handshake queue is full; reconnect later", 0);
  }
}

void session_hello_leave(session_t *s, uint64_t now) {
  if (s->adm.state == ADMISSION_WAITING) admission_release(s->ss->admission, &s->adm, now);
  free(s->hello); /* a hello that was still waiting for its slot */
  s->hello = NULL;
}

void session_hello_cancel(session_t *s, uint64_t now) {
  pool_t *pool = *s->ss->pool;
  if (s->hello_running && pool && pool_cancel(pool, &s->hello_running->job)) {
    s->hello_running = NULL;
    admission_release(s->ss->admission, &s->adm, now);
  }
}
