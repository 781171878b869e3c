/*
 * ephemeral.c: what a session is told that is not stored (session_int.h):
 * presence (who is here, join and leave) and signals (docs/protocol.md
 * 4.9, 4.10, 5.11 to 5.13).
 *
 * On one node (SQLite) the presence table (proto/presence.h) decides and
 * events go out at once. In a cluster (PostgreSQL, ss->shared) the store
 * decides: the hello's or a subscribe's job writes the client's row, the
 * end of a grace deletes it (when this node still holds it), and the
 * change comes back to every node through the bus (session_ephemeral),
 * this one included, as messages do. A signal in a cluster is a NOTIFY
 * outside any append transaction; on one node it goes straight to the
 * subscribers. Neither is stored, replayed or retried: at most once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/metrics.h"
#include "net/ws.h"
#include "proto/presence.h"
#include "proto/session_int.h"
#include "store/notify.h"

/* ---- fan-out ------------------------------------------------------------------ */

typedef struct {
  sessions_t *ss;
  char *frame; /* encoded once */
  size_t len;
  const char *json; /* for streams (Server-Sent Events) */
  size_t json_len;
  int join;                  /* presence events: which */
  int edge;                  /* ... the user's first or last client */
  const char *user, *client; /* ... whose (not told to that client itself) */
  int presence;              /* 1: a presence event, 0: a signal */
  int sent;
} fanout_t;

static void fanout_one(bus_sub_t *bs, void *ud) {
  fanout_t *f = ud;
  sub_t *sub = container_of(bs, sub_t, bus);
  conn_t *c = sub->session->conn;
  if (!sub->announced || c->closing) return;
  if (f->presence) {
    if (sub->presence_events == FRAME_EVENTS_NONE ||
        (sub->presence_events == FRAME_EVENTS_USERS && !f->edge) ||
        (strcmp(sub->session->client_id, f->client) == 0 &&
         strcmp(sub->session->user, f->user) == 0))
      return;
  }
  ws_send_msg(c, f->frame, f->len, f->json, f->json_len, NULL);
  f->sent++;
}

/* Encode `json` (taken) once and send it to the subscribers of `conv`
 * that `f` selects. Returns how many. */
static int fanout(sessions_t *ss, const char *conv, char *json, fanout_t *f) {
  if (!json) return 0;
  f->ss = ss;
  f->json = json;
  f->json_len = strlen(json);
  f->frame = ws_encode_text(ss->net, json, f->json_len, &f->len);
  if (f->frame) bus_each(ss->bus, conv, fanout_one, f);
  free(f->frame);
  free(json);
  return f->sent;
}

static void presence_event(sessions_t *ss, int join, const char *conv, const char *user,
                           const char *client, int edge) {
  fanout_t f = {.join = join, .edge = edge, .user = user, .client = client, .presence = 1};
  int n = fanout(ss, conv, frame_presence_event(join, conv, user, client), &f);
  metrics_add(ss->metrics, "converger_presence_events_total",
              join ? "kind=\"join\"" : "kind=\"leave\"", 1);
  if (n > 0) metrics_add(ss->metrics, "converger_presence_frames_total", NULL, (double)n);
}

int session_signal_deliver(sessions_t *ss, const char *conv, const char *sender, int64_t ts_ms,
                           const char *body) {
  fanout_t f = {0};
  int n = fanout(ss, conv, frame_signal(conv, sender, ts_ms, body), &f);
  if (n > 0) metrics_add(ss->metrics, "converger_signal_frames_total", NULL, (double)n);
  return n;
}

void session_ephemeral(sessions_t *ss, const notify_t *n) {
  if (n->kind == NOTIFY_SIGNAL) {
    /* the node writes JSON; a payload that is not (not converger's) goes nowhere */
    json_t *body = json_loads(n->body, JSON_DECODE_ANY, NULL);
    if (body) session_signal_deliver(ss, n->conv, n->sender, n->ts_ms, n->body);
    json_decref(body);
  } else if (n->kind == NOTIFY_PRESENCE_JOIN || n->kind == NOTIFY_PRESENCE_LEAVE) {
    presence_event(ss, n->kind == NOTIFY_PRESENCE_JOIN, n->conv, n->user, n->client, n->edge);
  }
}

/* ---- presence ------------------------------------------------------------------ */

static void count_entries(sessions_t *ss) {
  metrics_set(ss->metrics, "converger_presence_entries", NULL,
              (double)presence_entries(ss->presence));
}

void session_presence_on(sub_t *sub) {
  session_t *s = sub->session;
  sessions_t *ss = s->ss;
  if (!sub->presence || sub->present || !ss->presence || s->conn->closing || ws_close_sent(s->conn))
    return; /* a connection on its way out is not present */
  int bits = presence_add(ss->presence, sub->conv, s->user, s->client_id, util_now_ms());
  if (bits < 0) {
    log_warn("session %llu: out of memory for presence in %s", (unsigned long long)s->id,
             sub->conv);
    return;
  }
  sub->present = 1;
  count_entries(ss);
  if (!ss->shared && (bits & PRESENCE_JOINED))
    presence_event(ss, 1, sub->conv, s->user, s->client_id, (bits & PRESENCE_FIRST) != 0);
}

void session_presence_off(sub_t *sub) {
  if (!sub->present) return;
  sub->present = 0;
  presence_remove(sub->session->ss->presence, sub->conv, sub->session->user,
                  sub->session->client_id, util_mono_ms());
}

int session_presence_store_join(sessions_t *ss, store_t *db, const char *conv, const char *client,
                                const char *user) {
  int joined = 0, first = 0;
  int r =
      store_presence_join(db, conv, client, user, ss->cfg->node_id, util_now_ms(), &joined, &first);
  if (r != 0)
    log_warn("presence: %s of %s in %s not written: %s; it is not listed until it reconnects",
             client, user, conv, cv_strerror(r));
  return r != 0 ? -1 : joined;
}

/* In a cluster: a presence row written (join) or deleted (leave) by a job
 * of its own, outside a hello; the store announces what changes. */
typedef struct {
  pool_job_t job;
  sessions_t *ss;
  int join;
  char conv[STORE_ID_MAX + 1], user[STORE_ID_MAX + 1], client[STORE_ID_MAX + 1];
  int status;
} row_job_t;

static void row_submit(sessions_t *ss, int join, const char *conv, const char *user,
                       const char *client);

static void row_work(pool_job_t *job, store_t *db) {
  row_job_t *j = container_of(job, row_job_t, job);
  int a, b;
  const char *node = j->ss->cfg->node_id;
  j->status =
      j->join ? store_presence_join(db, j->conv, j->client, j->user, node, util_now_ms(), &a, &b)
              : store_presence_leave(db, j->conv, j->client, j->user, node, &a, &b);
}

static void row_done(pool_job_t *job) {
  row_job_t *j = container_of(job, row_job_t, job);
  int err = pool_job_unrun(job) ? pool_job_unrun(job) : j->status;
  if (err)
    log_warn("presence: the %s of %s of %s in %s was not written (%s)%s",
             j->join ? "join" : "leave", j->client, j->user, j->conv, cv_strerror(err),
             j->join ? "" : "; the row goes with this node's membership");
  /* The client came back while its row was being deleted (a hello whose
   * job found the row just before): write it again. */
  else if (!j->join && presence_has(j->ss->presence, j->conv, j->user, j->client))
    row_submit(j->ss, 1, j->conv, j->user, j->client);
  free(j);
}

static void row_submit(sessions_t *ss, int join, const char *conv, const char *user,
                       const char *client) {
  pool_t *pool = *ss->pool;
  row_job_t *j = pool ? calloc(1, sizeof *j) : NULL;
  if (!j) return; /* stopping: the rows go with the membership sweep */
  j->ss = ss;
  j->join = join;
  snprintf(j->conv, sizeof j->conv, "%s", conv);
  snprintf(j->user, sizeof j->user, "%s", user);
  snprintf(j->client, sizeof j->client, "%s", client);
  j->job.kind = "presence";
  j->job.deadline_ms = 0; /* not interactive: wait for a worker */
  pool_submit(pool, &j->job, row_work, row_done);
}

void session_presence_orphan(sessions_t *ss, const char *conv, const char *user, const char *client,
                             int joined) {
  int made = presence_add_idle(ss->presence, conv, user, client, util_now_ms(), util_mono_ms());
  if (made > 0) count_entries(ss);
  /* Made anew although the store had the row: the entry's grace ended while
   * the job ran, and its leave may delete the row: write it again. */
  if (made > 0 && !joined) row_submit(ss, 1, conv, user, client);
}

static void rewrite_one(void *ud, const char *conv, const char *user, const char *client) {
  row_submit(ud, 1, conv, user, client);
}

void session_presence_rewrite(sessions_t *ss) {
  if (!ss->shared || !ss->presence) return;
  size_t n = presence_entries(ss->presence);
  if (n > 0) log_info("presence: writing this node's presence rows again (%zu entries)", n);
  presence_each(ss->presence, rewrite_one, ss);
}

/* The end of a client's grace: on one node its leave; in a cluster its row
 * here goes (the leave, when no other node holds it, comes back through
 * the bus). */
static void grace_ended(void *ud, const char *conv, const char *user, const char *client,
                        int last) {
  sessions_t *ss = ud;
  if (!ss->shared)
    presence_event(ss, 0, conv, user, client, last);
  else
    row_submit(ss, 0, conv, user, client);
}

void session_presence_tick(sessions_t *ss, uint64_t now) {
  if (!ss->presence) return;
  size_t before = presence_entries(ss->presence);
  presence_expire(ss->presence, now, grace_ended, ss);
  if (presence_entries(ss->presence) != before) count_entries(ss);
}

/* The answer to a presence frame, and the body of GET .../presence. */
char *session_presence_page(sessions_t *ss, const char *conv, const char *after, int limit,
                            int members, const store_member_t *rows, size_t nrows, int64_t count) {
  store_member_t *mine = NULL;
  int more = 0;
  size_t n = 0;
  int max = ss->cfg->max_presence;
  if (!ss->shared) {
    if (presence_list(ss->presence, conv, after, members ? limit : 0, max, &mine, &n, &count,
                      &more) != 0)
      return NULL;
    rows = mine;
  } else {
    /* the store's rows, one more than the page if there are: only the
     * first max_presence users in user order are listed */
    size_t k = 0;
    while (k < nrows && rows[k].rank <= max) k++;
    more = k > (size_t)limit;
    n = more ? (size_t)limit : k;
  }
  /* the cursor is the last user listed, when more follow */
  const char *cursor = more && n > 0 ? rows[n - 1].user : NULL;
  char *out =
      frame_presence(conv, rows, n, count, members, cursor, members && !more && count > max);
  free(mine);
  return out;
}

typedef struct {
  pool_job_t job;
  conn_t *conn;
  sessions_t *ss;
  char conv[STORE_ID_MAX + 1];
  char after[STORE_ID_MAX + 1];
  int limit, members;
  int status;
  store_member_t *m;
  size_t n;
  int64_t count;
} list_job_t;

static void list_work(pool_job_t *job, store_t *db) {
  list_job_t *j = container_of(job, list_job_t, job);
  j->status = store_presence_list(db, j->conv, j->after, j->members ? j->limit + 1 : 0, &j->m,
                                  &j->n, &j->count);
}

/* {"frame": name}: the details of an error that answers a `presence` or a
 * `signal` frame, so that a client tells which request it answers
 * (docs/protocol.md, sections 4.9 and 4.10). NULL on OOM (no details). */
static json_t *frame_of(const char *name) { return json_pack("{s:s}", "frame", name); }

static void list_done(pool_job_t *job) {
  list_job_t *j = container_of(job, list_job_t, job);
  if (pool_job_unrun(job)) j->status = pool_job_unrun(job);
  if (conn_unref(j->conn)) {
    if (j->status != 0)
      session_send_error(j->conn, "unavailable", "presence cannot be read now; ask again later",
                         j->conv, config_retry_hint(j->ss->cfg, j->ss->rng), frame_of("presence"));
    else
      session_send_owned(j->conn, session_presence_page(j->ss, j->conv, j->after, j->limit,
                                                        j->members, j->m, j->n, j->count));
  }
  free(j->m);
  free(j);
}

void session_handle_presence(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  sessions_t *ss = s->ss;
  sub_t *sub = session_find_sub(s, f->conv);
  if (!sub || !sub->announced) {
    session_send_error(c, "not_subscribed",
                       "presence of a conversation this connection is not subscribed to", f->conv,
                       0, frame_of("presence"));
    return;
  }
  if (!sub->presence) {
    session_send_error(c, "presence_disabled", "this conversation's channel has no presence",
                       f->conv, 0, frame_of("presence"));
    return;
  }
  if (!ss->shared) {
    session_send_owned(
        c, session_presence_page(ss, f->conv, f->cursor, f->limit, f->members, NULL, 0, 0));
    return;
  }
  list_job_t *j = calloc(1, sizeof *j);
  if (!j) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  j->conn = c;
  j->ss = ss;
  snprintf(j->conv, sizeof j->conv, "%s", f->conv);
  snprintf(j->after, sizeof j->after, "%s", f->cursor ? f->cursor : "");
  j->limit = f->limit;
  j->members = f->members;
  j->job.kind = "presence";
  j->job.deadline_ms = config_store_deadline(ss->cfg);
  conn_ref(c);
  pool_submit(*ss->pool, &j->job, list_work, list_done);
}

/* ---- signals -------------------------------------------------------------------- */

typedef struct {
  pool_job_t job;
  conn_t *conn;
  sessions_t *ss;
  char conv[STORE_ID_MAX + 1];
  char *payload;
  int status;
} signal_job_t;

static void signal_work(pool_job_t *job, store_t *db) {
  signal_job_t *j = container_of(job, signal_job_t, job);
  j->status = store_announce(db, j->payload);
}

static void signal_done(pool_job_t *job) {
  signal_job_t *j = container_of(job, signal_job_t, job);
  if (pool_job_unrun(job)) j->status = pool_job_unrun(job);
  metrics_add(j->ss->metrics, "converger_signals_total",
              j->status == 0 ? "result=\"ok\"" : "result=\"failed\"", 1);
  if (conn_unref(j->conn) && j->status != 0)
    session_send_error(j->conn, "unavailable", "the signal was not sent; it is not retried",
                       j->conv, config_retry_hint(j->ss->cfg, j->ss->rng), frame_of("signal"));
  free(j->payload);
  free(j);
}

void session_handle_signal(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  sessions_t *ss = s->ss;
  if (!session_may_write(s, f->conv)) {
    session_send_error(c, "forbidden", "the token does not allow writing to this conversation",
                       f->conv, 0, frame_of("signal"));
    return;
  }
  sub_t *sub = session_find_sub(s, f->conv);
  if (!sub || !sub->announced) {
    session_send_error(c, "not_subscribed",
                       "signals go to a conversation this connection is subscribed to", f->conv, 0,
                       frame_of("signal"));
    return;
  }
  if (!sub->signals) {
    session_send_error(c, "signals_disabled", "this conversation's channel does not take signals",
                       f->conv, 0, frame_of("signal"));
    return;
  }
  char *body = frame_dump(f->body);
  if (!body) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  if (strlen(body) > FRAME_SIGNAL_BYTES_MAX) {
    char msg[80];
    snprintf(msg, sizeof msg, "a signal's body is at most %d bytes of JSON",
             FRAME_SIGNAL_BYTES_MAX);
    session_send_error(c, "too_large", msg, f->conv, 0, frame_of("signal"));
    free(body);
    return;
  }
  int64_t ts = util_now_ms();
  if (!ss->shared) {
    session_signal_deliver(ss, f->conv, s->user, ts, body);
    metrics_add(ss->metrics, "converger_signals_total", "result=\"ok\"", 1);
    free(body);
    return;
  }
  signal_job_t *j = calloc(1, sizeof *j);
  if (j) j->payload = notify_signal(f->conv, ts, s->user, body);
  free(body);
  if (!j || !j->payload) {
    free(j);
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  j->conn = c;
  j->ss = ss;
  snprintf(j->conv, sizeof j->conv, "%s", f->conv);
  j->job.kind = "signal";
  j->job.deadline_ms = config_store_deadline(ss->cfg);
  conn_ref(c);
  pool_submit(*ss->pool, &j->job, signal_work, signal_done);
}

/* ---- a restart in a cluster ------------------------------------------------------ */

typedef struct {
  pool_job_t job;
  sessions_t *ss;
  char **convs, **clients, **users;
  size_t n;
  int status;
} restore_job_t;

static void restore_work(pool_job_t *job, store_t *db) {
  restore_job_t *j = container_of(job, restore_job_t, job);
  j->status =
      store_presence_of_node(db, j->ss->cfg->node_id, &j->convs, &j->clients, &j->users, &j->n);
}

static void restore_done(pool_job_t *job) {
  restore_job_t *j = container_of(job, restore_job_t, job);
  int err = pool_job_unrun(job) ? pool_job_unrun(job) : j->status;
  if (err) {
    log_warn("presence: the rows of this node from before its start were not read (%s); they "
             "stay until its clients reconnect elsewhere",
             cv_strerror(err));
  } else {
    for (size_t i = 0; i < j->n; i++)
      if (util_id_valid(j->convs[i]) && util_id_valid(j->users[i]) && util_id_valid(j->clients[i]))
        session_presence_orphan(j->ss, j->convs[i], j->users[i], j->clients[i], 1);
    if (j->n > 0)
      log_info("presence: %zu client(s) present through this node before its start are in "
               "their grace (%d ms)",
               j->n, j->ss->cfg->presence_grace_ms);
  }
  store_strings_free(j->convs, j->n);
  store_strings_free(j->clients, j->n);
  store_strings_free(j->users, j->n);
  free(j);
}

void session_presence_restore(sessions_t *ss) {
  restore_job_t *j = calloc(1, sizeof *j);
  if (!j) return;
  j->ss = ss;
  j->job.kind = "presence";
  j->job.no_drop = 1;
  pool_submit(*ss->pool, &j->job, restore_work, restore_done);
}
