/*
 * pgnotify.c: the LISTEN connection of one node (see pgnotify.h).
 *
 * States: IDLE (no connection; the next attempt at retry_at), CONNECTING
 * (pgconn_connect on libuv's thread pool: libpq resolves host names with
 * a blocking call, which must not stall the loop), LISTEN_SENT (waiting
 * for LISTEN's answer), LISTENING. A timer every TICK_MS enforces the
 * answer deadlines and sends the keepalive query, so a server that stops
 * answering without closing the socket is noticed as surely as one that
 * closes it.
 *
 * Owns: the PGconn, its uv_poll handle (heap: a handle closes
 * asynchronously, and the next connection may need a new one before the
 * old one's close callback has run), the timer, at most one connect
 * request and at most one resync job. The listener is freed once its
 * timer is closed and no connect request is out.
 */
#include "bus/pgnotify.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus/bus.h"
#include "bus/heads.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"
#include "store/notify.h"
#include "store/pgconn.h"
#include "store/store.h"

#define TICK_MS 100

typedef enum { PN_IDLE, PN_CONNECTING, PN_LISTEN_SENT, PN_LISTENING } pn_state_t;

struct pgnotify_s {
  uv_loop_t *loop;
  bus_t *bus;
  pool_t *const *pool; /* the owner's pool pointer: NULL once the pool is closed */
  char *url;
  char shown[512]; /* the URL without its password */
  char app[64];    /* application_name: "converger listen NODE_ID" (PostgreSQL keeps 63 bytes) */
  char node_id[STORE_ID_MAX + 1]; /* this node's: its own user controls are not heard again */
  int connect_timeout_ms;
  pn_state_t state;
  PGconn *conn;
  uv_poll_t *poll; /* NULL when there is no connection */
  uv_timer_t timer;
  int timer_closed;
  struct connect_req_s *connecting; /* on the thread pool */
  uint64_t retry_at;                /* IDLE: monotonic ms of the next attempt */
  uint64_t deadline;                /* LISTEN_SENT, or a keepalive query in flight */
  uint64_t ping_due;                /* LISTENING: next keepalive query */
  int ping_out;                     /* a keepalive query is in flight */
  int lost;            /* listened before and lost it (for the log: every LISTEN resyncs) */
  int failures;        /* connection attempts failed in a row */
  uint64_t resync_due; /* monotonic ms: a check of the subscriptions is due; 0: none */
  int resync_failures; /* checks failed in a row */
  int resync;          /* a check is in the pool (bus/heads.h) */
  int closing;
};

typedef struct connect_req_s {
  uv_work_t req;
  pgnotify_t *l;
  PGconn *conn; /* NULL: failed, for the reason in `why` */
  char why[512];
} connect_req_t;

static void want_resync(pgnotify_t *l);
static void start_resync(pgnotify_t *l);

/* ---- connection ------------------------------------------------------- */

static void poll_closed(uv_handle_t *h) { free(h); }

static void drop_conn(pgnotify_t *l) {
  if (l->poll) {
    uv_close((uv_handle_t *)l->poll, poll_closed); /* stops it first */
    l->poll = NULL;
  }
  PQfinish(l->conn); /* after the poll stopped: the fd is ours to close */
  l->conn = NULL;
  l->ping_out = 0;
}

/* The connection failed (or an attempt did): close it and try again later. */
static void fail(pgnotify_t *l, const char *why) {
  char line[512];
  const char *msg =
      why ? why : pgconn_one_line(l->conn ? PQerrorMessage(l->conn) : "", line, sizeof line);
  if (l->state == PN_LISTENING) {
    log_warn("bus: LISTEN connection to %s lost (%s); not ready until it is back", l->shown, msg);
    l->lost = 1;
  } else if (l->failures++ == 0 || l->failures % 20 == 0) {
    log_warn("bus: cannot listen on %s (%s); retrying every %d ms", l->shown, msg,
             PGNOTIFY_RETRY_MS);
  }
  drop_conn(l);
  l->state = PN_IDLE;
  l->retry_at = util_mono_ms() + PGNOTIFY_RETRY_MS;
}

static void io_cb(uv_poll_t *h, int status, int events);

/* Poll the connection's socket for `events`. */
static int watch(pgnotify_t *l, int events) {
  if (!l->poll) {
    l->poll = malloc(sizeof *l->poll);
    if (!l->poll || uv_poll_init(l->loop, l->poll, PQsocket(l->conn)) != 0) {
      free(l->poll);
      l->poll = NULL;
      return -1;
    }
    l->poll->data = l;
  }
  return uv_poll_start(l->poll, events, io_cb) == 0 ? 0 : -1;
}

/* Send `sql` without waiting; its answer comes through io_cb. */
static int send_query(pgnotify_t *l, const char *sql) {
  if (!PQsendQuery(l->conn, sql)) return -1;
  l->deadline = util_mono_ms() + PGNOTIFY_PING_TIMEOUT_MS;
  int f = PQflush(l->conn); /* 1: more to send when the socket is writable */
  if (f < 0) return -1;
  return watch(l, UV_READABLE | (f ? UV_WRITABLE : 0));
}

static void maybe_free(pgnotify_t *l) {
  if (!l->closing || !l->timer_closed || l->connecting) return;
  free(l->url);
  free(l);
}

static void connect_work(uv_work_t *req) {
  connect_req_t *c = container_of(req, connect_req_t, req);
  c->conn = pgconn_connect(c->l->url, c->l->app, c->l->connect_timeout_ms, c->why, sizeof c->why);
}

static void connect_done(uv_work_t *req, int status) {
  connect_req_t *c = container_of(req, connect_req_t, req);
  pgnotify_t *l = c->l;
  l->connecting = NULL;
  if (l->closing || status != 0) {
    PQfinish(c->conn);
    free(c);
    maybe_free(l);
    return;
  }
  l->conn = c->conn;
  if (l->conn) PQsetNoticeProcessor(l->conn, pgconn_notice, NULL);
  if (!l->conn) {
    fail(l, c->why);
  } else if (PQsetnonblocking(l->conn, 1) != 0 ||
             send_query(l, "LISTEN " STORE_NOTIFY_CHANNEL) != 0) {
    fail(l, NULL);
  } else {
    l->state = PN_LISTEN_SENT;
  }
  free(c);
}

static void start_connect(pgnotify_t *l) {
  connect_req_t *c = calloc(1, sizeof *c);
  if (!c) {
    l->retry_at = util_mono_ms() + PGNOTIFY_RETRY_MS;
    return;
  }
  c->l = l;
  if (uv_queue_work(l->loop, &c->req, connect_work, connect_done) != 0) {
    free(c);
    l->retry_at = util_mono_ms() + PGNOTIFY_RETRY_MS;
    return;
  }
  l->connecting = c;
  l->state = PN_CONNECTING;
}

static void listening(pgnotify_t *l) {
  l->state = PN_LISTENING;
  l->failures = 0;
  l->ping_due = util_mono_ms() + PGNOTIFY_PING_EVERY_MS;
  if (l->lost)
    log_info("bus: listening on %s again; checking every local subscription", l->shown);
  else
    log_info("bus: listening for messages of other nodes on %s", l->shown);
  l->lost = 0;
  /* Whatever was committed before LISTEN took effect (an outage, or the
   * time before this node listened at all) is read from the store. */
  want_resync(l);
}

/* ---- notifications ---------------------------------------------------- */

/* Read what the server sent: answers to our queries, then notifications. */
static void read_input(pgnotify_t *l) {
  if (!PQconsumeInput(l->conn)) return fail(l, NULL);
  while (!PQisBusy(l->conn)) {
    PGresult *r = PQgetResult(l->conn);
    if (!r) break;
    ExecStatusType st = PQresultStatus(r);
    PQclear(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return fail(l, NULL);
    /* Each query is sent alone, so its last result ends it. */
    if (l->state == PN_LISTEN_SENT)
      listening(l);
    else
      l->ping_out = 0;
  }
  PGnotify *n;
  while (l->conn && (n = PQnotifies(l->conn)) != NULL) {
    /* NotificationResponse as it came: 'A', int32 length, int32 pid, the
     * channel and the payload with their NULs (side by side with a
     * sharded cluster's bus, same family: docs/benchmarks/scale-out.md) */
    metrics_add(bus_metrics(l->bus), "converger_bus_messages_in_total", "bus_instance=\"listen\"", 1);
    metrics_add(bus_metrics(l->bus), "converger_bus_bytes_in_total", "bus_instance=\"listen\"",
                9 + strlen(n->relname) + 1 + strlen(n->extra) + 1);
    if (strcmp(n->relname, STORE_NOTIFY_CHANNEL) == 0)
      bus_heard(l->bus, n->extra, l->node_id, BUS_PATH_NOTIFY);
    PQfreemem(n);
  }
}

static void io_cb(uv_poll_t *h, int status, int events) {
  pgnotify_t *l = h->data;
  if (h != l->poll) return; /* a closing handle of a dropped connection */
  if (status < 0) return fail(l, uv_strerror(status));
  if (events & UV_WRITABLE) {
    int f = PQflush(l->conn);
    if (f < 0) return fail(l, NULL);
    if (f == 0 && watch(l, UV_READABLE) != 0) return fail(l, "cannot poll its socket");
  }
  if (events & UV_READABLE) read_input(l);
}

static void tick_cb(uv_timer_t *t) {
  pgnotify_t *l = t->data;
  uint64_t now = util_mono_ms();
  switch (l->state) {
  case PN_IDLE:
    if (now >= l->retry_at) start_connect(l);
    break;
  case PN_CONNECTING: /* pgconn_connect keeps its own deadline */
    break;
  case PN_LISTEN_SENT:
    if (now >= l->deadline) fail(l, "no answer in time");
    break;
  case PN_LISTENING:
    if (l->resync_due && now >= l->resync_due && !l->resync && *l->pool) start_resync(l);
    if (l->ping_out && now >= l->deadline) {
      /* The answer may be waiting behind a stalled loop: read first. */
      read_input(l);
      if (l->state == PN_LISTENING && l->ping_out)
        fail(l, "no answer to a keepalive query in time");
    } else if (!l->ping_out && now >= l->ping_due) {
      l->ping_due = now + PGNOTIFY_PING_EVERY_MS;
      if (send_query(l, "SELECT 1") != 0)
        fail(l, NULL);
      else
        l->ping_out = 1;
    }
    break;
  }
}

/* ---- resync: every local subscription against the store ---------------- */

static void resync_done(void *ud, int canceled, char **failed, size_t nfailed, size_t n,
                        size_t inactive) {
  pgnotify_t *l = ud;
  l->resync = 0;
  store_strings_free(failed, nfailed);
  if (canceled || l->closing) return;
  if (nfailed > 0) {
    /* The store is not answering yet (workers reconnect on their own
     * schedule): check them all again a little later, never at once. */
    if (l->resync_failures++ == 0)
      log_warn("bus: cannot check %zu conversation(s) against the store yet; retrying every %d ms",
               n, PGNOTIFY_RETRY_MS);
    l->resync_due = util_mono_ms() + PGNOTIFY_RETRY_MS;
    return;
  }
  l->resync_failures = 0;
  log_info("bus: checked %zu conversation(s) against the store (%zu of an inactive channel)", n,
           inactive);
}

/* Submit the check now (from the tick, once resync_due has come). */
static void start_resync(pgnotify_t *l) {
  l->resync_due = 0;
  char **convs;
  size_t n;
  if (bus_convs(l->bus, &convs, &n) == 0) {
    if (n == 0) return;
    /* no_drop: the outage is over, this must run */
    if (heads_check(l->bus, *l->pool, convs, n, 1, resync_done, l) == 0) {
      l->resync = 1;
      return;
    }
  }
  log_error("bus: out of memory checking subscriptions; retrying");
  l->resync_due = util_mono_ms() + PGNOTIFY_RETRY_MS;
}

/* A check is due: now if none runs, else right after the one that runs
 * (its snapshot may predate what made this one due). */
static void want_resync(pgnotify_t *l) {
  if (!l->resync && *l->pool)
    start_resync(l);
  else
    l->resync_due = util_mono_ms();
}

/* ---- lifecycle ------------------------------------------------------- */

int pgnotify_start(uv_loop_t *loop, bus_t *bus, pool_t *const *pool, const char *node_id,
                   const char *url, pgnotify_t **out) {
  pgnotify_t *l = calloc(1, sizeof *l);
  if (!l) return -CV_ENOMEM;
  int err = pgconn_timeout_ms(url, &l->connect_timeout_ms);
  if (!err && !(l->url = strdup(url))) err = -CV_ENOMEM;
  if (err) {
    free(l);
    return err;
  }
  l->loop = loop;
  l->bus = bus;
  l->pool = pool;
  dburl_redact(url, l->shown, sizeof l->shown);
  snprintf(l->app, sizeof l->app, "converger listen %s", node_id);
  snprintf(l->node_id, sizeof l->node_id, "%s", node_id);
  uv_timer_init(loop, &l->timer);
  l->timer.data = l;
  uv_timer_start(&l->timer, tick_cb, TICK_MS, TICK_MS);
  start_connect(l);
  *out = l;
  return 0;
}

int pgnotify_listening(const pgnotify_t *l) { return l->state == PN_LISTENING; }

static void timer_closed(uv_handle_t *h) {
  pgnotify_t *l = h->data;
  l->timer_closed = 1;
  maybe_free(l);
}

void pgnotify_close(pgnotify_t *l) {
  l->closing = 1;
  if (l->connecting) uv_cancel((uv_req_t *)&l->connecting->req); /* or connect_done frees it */
  drop_conn(l);
  uv_close((uv_handle_t *)&l->timer, timer_closed);
}
