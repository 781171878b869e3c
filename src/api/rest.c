/*
 * rest.c: routing and the REST handlers.
 *
 * Each store-backed route is a rest_job_t: the loop validates the request
 * and copies what the job needs, the worker runs the store calls and builds
 * the JSON answer, the loop writes it. A job holds a reference on the
 * connection; when the connection has gone meanwhile the answer is dropped
 * (the store work is done either way: an acknowledged write is committed).
 */
#include "api/rest.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <converger_commit.h> /* generated at build time: CONVERGER_COMMIT */

#include "gate/auth.h"
#include "core/metrics.h"
#include "bus/bus.h"
#include "bus/pgnotify.h"
#include "gate/drain.h"
#include "cluster/membership.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/procstat.h"
#include "common/util.h"
#include "gate/admission.h"
#include "gate/limiter.h"
#include "net/ws.h"
#include "proto/frames.h"
#include "proto/session.h"

#define REST_LIST_BYTES (2u << 20) /* bodies in one GET .../messages answer */

/* ---- jobs -------------------------------------------------------------------- */

typedef enum {
  J_CHANNEL_CREATE,
  J_CHANNEL_PATCH,
  J_CHANNEL_GET,
  J_CONV_CREATE,
  J_CONV_GET,
  J_MSG_APPEND,
  J_MSG_LIST,
  J_REVOKE,
  J_CLUSTER,
  J_ANNOUNCE, /* a user control, to the other nodes (store_announce) */
  J_PRESENCE, /* GET .../presence */
  J_SIGNAL,   /* POST .../signals */
} job_kind_t;

typedef struct {
  pool_job_t job;          /* every kind but J_MSG_APPEND */
  bus_append_job_t append; /* J_MSG_APPEND: the group commit's job */
  conn_t *conn;
  api_t *api;
  job_kind_t kind;
  char id[STORE_ID_MAX + 1];
  char other[STORE_ID_MAX + 1]; /* channel of a new conversation; sender */
  char key[STORE_ID_MAX + 1];   /* idempotency key */
  char *name;                   /* channel name; message body JSON */
  int flag;                     /* presence / active; presence: members */
  int signals;                  /* a new channel's signals */
  int64_t ts_ms;                /* a signal's time */
  int64_t after, limit, exp_s;
  uint64_t begun_ms;    /* monotonic: the request was read (converger_append_latency_ms) */
  store_member_t *rows; /* J_PRESENCE in a cluster */
  size_t nrows;
  int64_t count;
  /* results */
  int status;       /* HTTP status */
  json_t *answer;   /* body on success */
  const char *code; /* error code */
  const char *message;
} rest_job_t;

static json_t *channel_json(const store_channel_t *ch) {
  return json_pack("{s:s, s:s, s:b, s:b, s:b}", "id", ch->id, "name", ch->name, "presence",
                   ch->presence, "signals", ch->signals, "active", ch->active);
}

static json_t *conv_json(const store_conv_t *cv) {
  return json_pack("{s:s, s:s, s:I, s:s}", "id", cv->id, "channel", cv->channel, "head",
                   (json_int_t)cv->head, "epoch", cv->epoch);
}

static json_t *msg_json(const char *conv, const store_msg_t *m) {
  char ts[25];
  util_format_ts(m->ts_ms, ts);
  json_t *body = json_loads(m->body, JSON_DECODE_ANY, NULL);
  return json_pack("{s:s, s:I, s:s, s:s, s:s, s:o}", "conv", conv, "seq", (json_int_t)m->seq, "id",
                   m->id, "sender", m->sender, "ts", ts, "body", body ? body : json_null());
}

static json_t *node_json(const store_node_t *nd) {
  char ts[25];
  util_format_ts(nd->updated_ms, ts);
  json_t *v =
      json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:s}", "id", nd->id, "publicUrl", nd->public_url,
                "state", nd->state, "connections", (json_int_t)nd->connections, "waiters",
                (json_int_t)nd->waiters, "capacity", (json_int_t)nd->capacity, "updatedAt", ts);
  /* where its admin routes are, when not on the client port (CONVERGER_ADMIN_LISTEN) */
  if (v && nd->admin_url[0]) json_object_set_new(v, "adminUrl", json_string(nd->admin_url));
  return v;
}

/* Whether what this node's store commits is announced to other nodes:
 * PostgreSQL's NOTIFY (bus/pgnotify.h) or a sharded cluster's bus
 * (bus/redis.h). Alone (SQLite), the node acts on its own sockets. */
static int announced(const api_t *api) { return *api->pgnotify || bus_routed(api->bus); }

static void set_error(rest_job_t *j, int r) {
  switch (r) {
  case -CV_ENOTFOUND:
    j->status = 404;
    j->code = "not_found";
    j->message = j->kind == J_CONV_CREATE ? "no such channel" : "not found";
    break;
  case -CV_EEXISTS:
    j->status = 409;
    j->code = "conflict";
    j->message = "id already exists";
    break;
  case -CV_EINACTIVE:
    j->status = 409;
    j->code = "channel_inactive";
    j->message = "the conversation's channel is inactive";
    break;
  case -CV_EBUSY:
    j->status = 503;
    j->code = "unavailable";
    j->message = "store overloaded; retry after the hint";
    break;
  case -CV_ETIMEDOUT:
    j->status = 503;
    j->code = "unavailable";
    j->message = "the store did not answer in time; retry after the hint";
    break;
  case -CV_ESHARD:
    j->status = 503;
    j->code = "unavailable";
    j->message = "the conversation's shard is unavailable; retry after the hint";
    break;
  default:
    j->status = 503;
    j->code = "unavailable";
    j->message = "store unavailable";
    break;
  }
}

static void job_work(pool_job_t *job, store_t *db) {
  rest_job_t *j = container_of(job, rest_job_t, job);
  int r = 0;
  switch (j->kind) {
  case J_CHANNEL_CREATE: {
    store_channel_t ch;
    unsigned flags =
        (j->flag ? STORE_CHANNEL_PRESENCE : 0) | (j->signals ? STORE_CHANNEL_SIGNALS : 0);
    if ((r = store_channel_create(db, j->id, j->name, flags, &ch)) == 0) {
      j->status = 201;
      j->answer = channel_json(&ch);
    }
    break;
  }
  case J_CHANNEL_PATCH:
  case J_CHANNEL_GET: {
    store_channel_t ch;
    r = j->kind == J_CHANNEL_PATCH ? store_channel_set_active(db, j->id, j->flag, &ch)
                                   : store_channel_get(db, j->id, &ch);
    if (r == 0) {
      j->status = 200;
      j->answer = channel_json(&ch);
    }
    break;
  }
  case J_CONV_CREATE:
  case J_CONV_GET: {
    store_conv_t cv;
    r = j->kind == J_CONV_CREATE ? store_conv_create(db, j->id, j->other, &cv)
                                 : store_conv_get(db, j->id, &cv);
    if (r == 0) {
      j->status = j->kind == J_CONV_CREATE ? 201 : 200;
      j->answer = conv_json(&cv);
    }
    break;
  }
  case J_MSG_APPEND: /* append_done */
    break;
  case J_MSG_LIST: {
    store_conv_t cv;
    store_msg_t *msgs = NULL;
    size_t n = 0;
    if ((r = store_conv_get(db, j->id, &cv)) != 0) break;
    /* Fewer than `limit` messages when they are large: the client pages on. */
    if ((r = store_replay(db, j->id, j->after, -1, (int)j->limit, REST_LIST_BYTES, &msgs, &n)) != 0)
      break;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, msg_json(j->id, &msgs[i]));
    store_msgs_free(msgs, n);
    j->status = 200;
    j->answer = json_pack("{s:o, s:I, s:s}", "messages", arr, "head", (json_int_t)cv.head, "epoch",
                          cv.epoch);
    break;
  }
  case J_REVOKE:
    if ((r = store_revoke(db, j->id, j->exp_s)) == 0) j->status = 204;
    break;
  case J_ANNOUNCE:
    if ((r = store_announce(db, j->name)) == 0) j->status = 202;
    break;
  case J_PRESENCE:
  case J_SIGNAL: {
    store_conv_t cv;
    if ((r = store_conv_get(db, j->id, &cv)) != 0) break;
    if (j->kind == J_PRESENCE && !cv.presence) {
      j->status = 409;
      j->code = "presence_disabled";
      j->message = "this conversation's channel has no presence";
    } else if (j->kind == J_SIGNAL && !cv.channel_active) {
      r = -CV_EINACTIVE;
    } else if (j->kind == J_SIGNAL && !cv.signals) {
      j->status = 409;
      j->code = "signals_disabled";
      j->message = "this conversation's channel does not take signals";
    } else if (j->kind == J_PRESENCE) {
      /* in a cluster the store's rows; on one node the table, read in done */
      j->status = 200;
      if (j->api->sessions->shared) {
        store_member_t *m = NULL;
        size_t n = 0;
        int64_t count = 0;
        if ((r = store_presence_list(db, j->id, j->key, j->flag ? (int)j->limit + 1 : 0, &m, &n,
                                     &count)) == 0) {
          j->rows = m;
          j->nrows = n;
          j->count = count;
        }
      }
    } else {
      /* a NOTIFY outside any append transaction: every node, this one too */
      j->status = 202;
      if (j->api->sessions->shared) {
        char *payload = notify_signal(j->id, j->ts_ms, j->other, j->name);
        r = payload ? store_announce(db, payload) : -CV_ENOMEM;
        free(payload);
      }
    }
    break;
  }
  case J_CLUSTER: {
    store_node_t *nodes = NULL;
    size_t n = 0;
    if ((r = store_nodes_live(db, util_now_ms(), MEMBERSHIP_MAX_AGE_MS, &nodes, &n)) != 0) break;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, node_json(&nodes[i]));
    store_nodes_free(nodes);
    j->status = 200;
    j->answer = json_pack("{s:o}", "nodes", arr);
    break;
  }
  }
  if (r != 0) set_error(j, r);
}

/* The end of every job: `job` is j->job, or j->append.job for an append. */
static void job_finish(rest_job_t *j, pool_job_t *job) {
  api_t *api = j->api;
  if (job->canceled) set_error(j, -CV_ECANCELED); /* 503: the node is stopping */
  if (job->dropped) /* 503: the pool is overloaded, or the deadline passed in its queue */
    set_error(j, job->timed_out ? -CV_ETIMEDOUT : -CV_EBUSY);
  /* Effects on live sockets happen whether or not the caller is still here. */
  /* On a shared store the change reaches this node's sockets as it
   * reaches every other node's, through the bus (bus/pgnotify.h), in
   * commit order with any other change of the channel. */
  if (j->kind == J_CHANNEL_PATCH && j->status == 200 && !announced(api)) {
    bus_channel_changed(api->bus, j->id, j->flag);
  }
  if (j->kind == J_MSG_APPEND && (j->status == 200 || j->status == 201))
    metrics_observe(api->metrics, "converger_append_latency_ms",
                    (double)(util_mono_ms() - j->begun_ms));
  if (j->kind == J_REVOKE && j->status == 204) {
    auth_add_revoked(api->auth, j->id);
    session_revoke_jti(api->sessions, j->id);
  }
  if (j->kind == J_PRESENCE && j->status == 200) {
    char *page = session_presence_page(api->sessions, j->id, j->key, (int)j->limit, j->flag,
                                       j->rows, j->nrows, j->count);
    json_t *v = page ? json_loads(page, 0, NULL) : NULL;
    free(page);
    if (v) json_object_del(v, "type"); /* the frame's fields, without its type */
    j->answer = v;
    if (!v) set_error(j, -CV_ENOMEM);
  }
  if (j->kind == J_SIGNAL && j->status == 202) {
    int n = api->sessions->shared
                ? -1
                : session_signal_deliver(api->sessions, j->id, j->other, j->ts_ms, j->name);
    metrics_add(api->metrics, "converger_signals_total", "result=\"ok\"", 1);
    j->answer = json_pack("{s:s, s:I}", "conv", j->id, "ts", (json_int_t)j->ts_ms);
    if (j->answer && n >= 0) json_object_set_new(j->answer, "delivered", json_integer(n));
  }
  if (j->kind == J_ANNOUNCE && j->status != 202) { /* acted here; the others were not told */
    json_decref(j->answer);
    j->answer = NULL;
  }
  if (conn_unref(j->conn)) {
    if (j->answer) {
      http_respond_json(j->conn, j->status, j->answer, NULL);
      j->answer = NULL;
    } else if (j->status == 204) {
      http_respond(j->conn, 204, "application/json", "", 0, NULL);
    } else {
      http_respond_error(j->conn, j->status, j->code, j->message,
                         j->status == 503 ? config_retry_hint(api->cfg, api->rng) : 0);
    }
  }
  json_decref(j->answer);
  free(j->rows);
  free(j->name);
  free(j);
}

static void job_done(pool_job_t *job) { job_finish(container_of(job, rest_job_t, job), job); }

/* A J_MSG_APPEND committed with the others of its group, or not run. */
static void append_done(pool_job_t *job) {
  rest_job_t *j = container_of(job, rest_job_t, append.job);
  store_append_t *a = &j->append.a;
  if (!pool_job_unrun(job)) {
    if (a->status == 0) {
      j->status = a->created ? 201 : 200;
      j->answer = json_pack("{s:I, s:s}", "seq", (json_int_t)a->msg.seq, "id", a->msg.id);
    } else {
      set_error(j, a->status);
    }
  }
  store_msg_clear(&a->msg);
  job_finish(j, job);
}

static rest_job_t *job_new(api_t *api, conn_t *c, job_kind_t kind) {
  rest_job_t *j = calloc(1, sizeof *j);
  if (!j) {
    http_respond_error(c, 503, "unavailable", "out of memory", 1000);
    return NULL;
  }
  j->conn = c;
  j->api = api;
  j->kind = kind;
  j->begun_ms = util_mono_ms();
  return j;
}

static void job_submit(rest_job_t *j) {
  conn_ref(j->conn);
  if (j->kind == J_MSG_APPEND) {
    /* conversation, idempotency key, sender and body: the job's own fields */
    j->append.a =
        (store_append_t){.conv = j->id, .id = j->key, .sender = j->other, .body = j->name};
    j->append.job.kind = "rest";
    j->append.job.deadline_ms = config_store_deadline(j->api->cfg);
    bus_append_submit(j->api->bus, *j->api->pool, &j->append, append_done);
    return;
  }
  j->job.kind = "rest";
  j->job.deadline_ms = config_store_deadline(j->api->cfg);
  pool_submit(*j->api->pool, &j->job, job_work, job_done);
}

/* ---- helpers ----------------------------------------------------------------- */

static void bad_request(conn_t *c, const char *message) {
  http_respond_error(c, 400, "bad_request", message, 0);
}

/* Parse the body as a JSON object; answers 400 and returns NULL otherwise. */
static json_t *body_object(conn_t *c, http_request_t *req) {
  json_error_t err;
  json_t *v = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &err);
  if (!json_is_object(v)) {
    char msg[256];
    if (v)
      snprintf(msg, sizeof msg, "the body must be a JSON object");
    else
      snprintf(msg, sizeof msg, "malformed JSON body: %s", err.text);
    json_decref(v);
    bad_request(c, msg);
    return NULL;
  }
  return v;
}

static int require_key(api_t *api, conn_t *c, http_request_t *req) {
  if (auth_check_api_key(api->auth, req->authorization) == 0) return 0;
  http_respond_error(c, 401, "unauthorized",
                     "missing or wrong API key (Authorization: Bearer <key>)", 0);
  return -1;
}

/* Query parameter `name` as a non-negative integer; def when absent.
 * Returns -1 after answering 400 when present but invalid. */
static int query_int(conn_t *c, const char *query, const char *name, int64_t def, int64_t *out) {
  *out = def;
  size_t nl = strlen(name);
  for (const char *p = query; p && *p;) {
    const char *amp = strchr(p, '&');
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
      char buf[32];
      size_t vl = len - nl - 1;
      char *end;
      if (vl == 0 || vl >= sizeof buf) goto bad;
      memcpy(buf, p + nl + 1, vl);
      buf[vl] = '\0';
      errno = 0;
      long long v = strtoll(buf, &end, 10);
      if (errno || *end || v < 0) goto bad;
      *out = v;
    }
    p = amp ? amp + 1 : NULL;
  }
  return 0;
bad : {
  char msg[96];
  snprintf(msg, sizeof msg, "query parameter %s must be an integer >= 0", name);
  bad_request(c, msg);
  return -1;
}
}

/* The next `name=value` of the query string from *p on (percent-decoded,
 * '+' as a space) into `out` (`cap` bytes): 1 found, 0 none left, -1 a
 * value too long or badly encoded. *p moves past it. */
static int query_next(const char **p, const char *name, char *out, size_t cap) {
  size_t nl = strlen(name);
  while (*p && **p) {
    const char *q = *p, *amp = strchr(q, '&');
    size_t len = amp ? (size_t)(amp - q) : strlen(q);
    *p = amp ? amp + 1 : q + len;
    if (len < nl + 1 || strncmp(q, name, nl) != 0 || q[nl] != '=') continue;
    size_t k = 0;
    for (size_t i = nl + 1; i < len; i++) {
      char ch = q[i];
      if (ch == '+') {
        ch = ' ';
      } else if (ch == '%') {
        unsigned v;
        if (i + 2 >= len) return -1;
        if (sscanf(q + i + 1, "%2x", &v) != 1 || !isxdigit((unsigned char)q[i + 1]) ||
            !isxdigit((unsigned char)q[i + 2]))
          return -1;
        ch = (char)v;
        i += 2;
      }
      if (k + 1 >= cap || ch == '\0') return -1;
      out[k++] = ch;
    }
    out[k] = '\0';
    return 1;
  }
  return 0;
}

/* Split "/v1/conversations/ID/messages" style paths into at most 5
 * segments. A segment longer than an id is returned empty (an invalid id).
 * Returns the number of segments, or 6 when there are more than 5. */
static int split_path(const char *path, char seg[5][STORE_ID_MAX + 1]) {
  int n = 0;
  const char *p = path;
  while (*p == '/') p++;
  while (*p) {
    if (n == 5) return 6;
    const char *e = strchr(p, '/');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len > STORE_ID_MAX) len = 0;
    memcpy(seg[n], p, len);
    seg[n][len] = '\0';
    n++;
    if (!e) break;
    p = e + 1;
  }
  return n;
}

/* ---- handlers ---------------------------------------------------------------- */

/* The demo page's files (CONVERGER_WEB_DIR): "/" is index.html; otherwise
 * one name in web_dir, or in its converger-client/ (the JavaScript client's
 * modules), of letters, digits, '-', '_' and '.', not starting with '.',
 * ending in .html, .js or .css. Returns the Content-Type with the file's
 * path under web_dir in `file`, or NULL when `path` is no such file (then
 * the router goes on: an API route, or 404). */
static const char *web_file(const char *path, char *file, size_t len) {
  static const struct {
    const char *ext, *type;
  } types[] = {{".html", "text/html; charset=utf-8"},
               {".js", "text/javascript; charset=utf-8"},
               {".css", "text/css; charset=utf-8"}};
  if (strcmp(path, "/") == 0) path = "/index.html";
  const char *name = path + 1;
  if (strncmp(name, "converger-client/", 17) == 0) name += 17;
  size_t n = strlen(name);
  if (path[0] != '/' || n == 0 || name[0] == '.' || (size_t)(name - path) + n >= len) return NULL;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)name[i]) && !strchr("-_.", name[i])) return NULL;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    size_t e = strlen(types[i].ext);
    if (n > e && strcmp(name + n - e, types[i].ext) == 0) {
      snprintf(file, len, "%s", path + 1);
      return types[i].type;
    }
  }
  return NULL;
}

static void serve_file(api_t *api, conn_t *c, const char *name, const char *type) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", api->cfg->web_dir, name);
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size > 4 * 1024 * 1024) {
    if (fd >= 0) close(fd);
    http_respond_error(c, 404, "not_found", "no such file of the demo page (CONVERGER_WEB_DIR)", 0);
    return;
  }
  char *buf = malloc((size_t)st.st_size + 1);
  ssize_t n = buf ? read(fd, buf, (size_t)st.st_size) : -1;
  close(fd);
  if (n < 0) {
    free(buf);
    http_respond_error(c, 503, "unavailable", "cannot read the demo page", 1000);
    return;
  }
  http_respond(c, 200, type, buf, (size_t)n, NULL);
  free(buf);
}

/* Whether /readyz answers 200, and its status word. Without its LISTEN
 * connection a node would serve subscribers that hear nothing from other
 * nodes: the database is unreachable, or was. */
static int readiness(const api_t *api, const char **word) {
  int store_ok = !*api->pgnotify || pgnotify_listening(*api->pgnotify);
  int ready = *api->phase == NODE_READY && store_ok;
  if (word)
    *word = *api->phase != NODE_READY ? node_phase_name(*api->phase)
            : !store_ok               ? "store_unavailable"
                                      : "ready";
  return ready;
}

/* A sharded cluster's part of /admin/status: each PostgreSQL instance of
 * the shard map (store/sharded.h: its URL without the password) and the
 * bus's instances (bus/redis.h). */
static void add_sharded_status(api_t *api, json_t *v) {
  json_t *shards = json_array();
  int n = store_shards_count(api->shards);
  for (int i = 0; i < n && shards; i++) {
    store_shard_stats_t st;
    char url[2 * STORE_URL_MAX];
    store_shards_stats(api->shards, i, &st, url, sizeof url);
    json_array_append_new(shards,
                          json_pack("{s:i, s:s, s:b, s:I, s:I, s:i}", "instance", i, "url", url,
                                    "up", st.up, "calls", (json_int_t)st.calls, "errors",
                                    (json_int_t)st.errors, "inflight", st.inflight));
  }
  json_object_set_new(v, "shards", shards);
  const redis_bus_t *rb = *api->rbus;
  json_object_set_new(v, "bus",
                      json_pack("{s:i, s:i}", "instances", rb ? redis_bus_count(rb) : 0, "up",
                                rb ? redis_bus_up(rb) : 0));
}

static void handle_status(api_t *api, conn_t *c) {
  static const char *const drain_states[] = {"ready", "draining", "shedding"};
  drain_progress_t dp;
  drain_progress(*api->drain, &dp);
  json_t *v = json_pack(
      "{s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:I, s:i, s:i, s:f, s:s, s:{s:i, s:i, s:i, s:i}, "
      "s:i, s:i, s:f}",
      "node", api->cfg->node_id, "version", CONVERGER_VERSION, "state",
      node_phase_name(*api->phase), "ready", readiness(api, NULL), "connections", api->net->nws,
      "maxConnections", *api->max_connections, "capacity", api->cfg->capacity_connections,
      "httpConnections", api->net->nconns - api->net->nws, "subscriptions",
      (json_int_t)bus_count(api->bus), "poolInFlight", pool_in_flight(*api->pool), "poolSize",
      api->cfg->pool_size, "loopUtilisation", *api->loop_utilisation, "drain",
      drain_states[drain_state(*api->drain)], "drainProgress", "told", dp.told, "moved", dp.moved,
      "closed", dp.closed, "remaining", dp.remaining, "drainWindowMs", api->cfg->drain_window_ms,
      "drainShutdownMs", api->cfg->drain_shutdown_ms, "startedAt", api->started_at);
  if (v && api->shards) add_sharded_status(api, v);
  http_respond_json(c, 200, v, NULL);
}

/* The gauges read at each scrape: admission, readiness, the bus, the
 * drain's progress, the process (core/procstat.h) and the build. */
static void refresh_gauges(api_t *api) {
  metrics_t *m = api->metrics;
  metrics_set(m, "converger_admission_in_use", NULL, admission_in_use(api->admission));
  metrics_set(m, "converger_admission_waiting", NULL, admission_waiting(api->admission));
  metrics_set(m, "converger_admission_queue_ms", NULL, api->cfg->handshake_queue_ms);
  metrics_set(m, "converger_ready", NULL, readiness(api, NULL));
  metrics_set(m, "converger_bus_listening", NULL,
              !*api->pgnotify || pgnotify_listening(*api->pgnotify));
  metrics_set(m, "converger_capacity_connections", NULL, api->cfg->capacity_connections);
  metrics_set(m, "converger_loop_utilisation", NULL, *api->loop_utilisation);
  drain_progress_t dp;
  drain_progress(*api->drain, &dp);
  metrics_set(m, "converger_drain_progress", "kind=\"told\"", dp.told);
  metrics_set(m, "converger_drain_progress", "kind=\"moved\"", dp.moved);
  metrics_set(m, "converger_drain_progress", "kind=\"closed\"", dp.closed);
  metrics_set(m, "converger_drain_progress", "kind=\"remaining\"", dp.remaining);
  metrics_set(m, "converger_build_info",
              "version=\"" CONVERGER_VERSION "\",commit=\"" CONVERGER_COMMIT "\"", 1);
  procstat_t ps;
  procstat_read(&ps);
  metrics_set(m, "process_cpu_seconds_total", NULL, ps.cpu_seconds);
  metrics_set(m, "process_resident_memory_bytes", NULL, (double)ps.resident_bytes);
  metrics_set(m, "process_open_fds", NULL, (double)ps.open_fds);
  metrics_set(m, "process_max_fds", NULL, (double)ps.max_fds);
  metrics_set(m, "process_start_time_seconds", NULL, ps.start_time_s);
}

/* POST /admin/drain: as SIGTERM (gate/drain.h). 202: begun; 409: already. */
static void handle_drain(api_t *api, conn_t *c) {
  if (api->drain_begin(api->ud, "POST /admin/drain") != 0)
    return http_respond_error(c, 409, "conflict", "the node is already draining or stopping", 0);
  http_respond_json(c, 202,
                    json_pack("{s:s, s:i, s:i, s:i, s:i}", "state", "draining", "connections",
                              api->net->nws, "windowMs", api->cfg->drain_window_ms, "closeRate",
                              api->cfg->drain_close_rate, "shutdownMs",
                              api->cfg->drain_shutdown_ms),
                    NULL);
}

/* POST /admin/shed {"fraction": f, "windowMs": w}: 0 < f <= 1, w in
 * 0..3600000 (default the drain window). 200 with the count told to move. */
static void handle_shed(api_t *api, conn_t *c, http_request_t *req) {
  json_t *b = body_object(c, req);
  if (!b) return;
  json_t *f = json_object_get(b, "fraction"), *w = json_object_get(b, "windowMs");
  double fraction = json_is_number(f) ? json_number_value(f) : -1;
  json_int_t window =
      w ? (json_is_integer(w) ? json_integer_value(w) : -1) : api->cfg->drain_window_ms;
  int chosen = 0, total = 0, r;
  if (!(fraction > 0 && fraction <= 1))
    bad_request(c, "fraction must be a number with 0 < fraction <= 1");
  else if (window < 0 || window > 3600000)
    bad_request(c, "windowMs must be an integer from 0 to 3600000");
  else if (*api->phase >= NODE_STOPPING ||
           (r = drain_shed(*api->drain, fraction, window, &chosen, &total)) == -CV_EBUSY)
    http_respond_error(c, 409, "conflict", "the node is draining or already shedding", 0);
  else if (r != 0)
    http_respond_error(c, 503, "unavailable", "out of memory", 1000);
  else
    http_respond_json(
        c, 200,
        json_pack("{s:i, s:i, s:I}", "chosen", chosen, "connections", total, "windowMs", window),
        NULL);
  json_decref(b);
}

/* A user control done here (its answer in `answer`, taken): on a shared
 * store it is announced to every other node first (payload taken), and
 * the answer waits for that; alone, it is the answer now. */
static void user_control_answer(api_t *api, conn_t *c, json_t *answer, char *payload) {
  if (!announced(api)) {
    free(payload);
    http_respond_json(c, 202, json_pack("{s:o, s:b}", "local", answer, "announced", 0), NULL);
    return;
  }
  if (!payload) {
    json_decref(answer);
    http_respond_error(c, 503, "unavailable", "out of memory", 1000);
    return;
  }
  rest_job_t *j = job_new(api, c, J_ANNOUNCE);
  if (!j) {
    json_decref(answer);
    free(payload);
    return;
  }
  j->name = payload;
  j->answer = json_pack("{s:o, s:b}", "local", answer, "announced", 1);
  job_submit(j);
}

/* An optional JSON object body: {} when there is none. */
static json_t *optional_body(conn_t *c, http_request_t *req) {
  return req->body_len ? body_object(c, req) : json_object();
}

/* POST /admin/users/{user}/disconnect {"code"?, "reason"?, "retryAfterMs"?}:
 * every connection of the user, on every node. */
static void handle_user_disconnect(api_t *api, conn_t *c, http_request_t *req, const char *user) {
  json_t *b = optional_body(c, req);
  if (!b) return;
  json_t *cv = json_object_get(b, "code"), *rv = json_object_get(b, "reason"),
         *hv = json_object_get(b, "retryAfterMs");
  json_int_t code = cv ? (json_is_integer(cv) ? json_integer_value(cv) : -1) : 1008;
  const char *reason = rv ? json_string_value(rv) : "disconnected by the server";
  json_int_t hint = hv ? (json_is_integer(hv) ? json_integer_value(hv) : -1) : 0;
  const char *why = notify_disconnect_check(code, reason, hint);
  if (why) {
    bad_request(c, why);
  } else {
    int n = session_disconnect_user(api->sessions, user, (int)code, reason, (long)hint);
    log_info("POST /admin/users/%s/disconnect: %d connection(s) closed here with %d", user, n,
             (int)code);
    user_control_answer(api, c, json_pack("{s:s, s:i}", "user", user, "closed", n),
                        notify_user_disconnect(api->cfg->node_id, user, (int)code, hint, reason));
  }
  json_decref(b);
}

/* POST /admin/users/{user}/unsubscribe {"conv"}: that subscription of the
 * user, on every node. */
static void handle_user_unsubscribe(api_t *api, conn_t *c, http_request_t *req, const char *user) {
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *conv = json_string_value(json_object_get(b, "conv"));
  if (!util_id_valid(conv)) {
    bad_request(c, "conv must be an id matching [A-Za-z0-9._:-]{1,128}");
  } else {
    int n = session_unsubscribe_user(api->sessions, user, conv);
    log_info("POST /admin/users/%s/unsubscribe: %d subscription(s) of %s ended here", user, n,
             conv);
    user_control_answer(api, c,
                        json_pack("{s:s, s:s, s:i}", "user", user, "conv", conv, "removed", n),
                        notify_user_unsubscribe(api->cfg->node_id, user, conv));
  }
  json_decref(b);
}

static void handle_channel_create(api_t *api, conn_t *c, http_request_t *req) {
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *id = json_string_value(json_object_get(b, "id"));
  const char *name = json_string_value(json_object_get(b, "name"));
  json_t *presence = json_object_get(b, "presence");
  json_t *signals = json_object_get(b, "signals");
  char gen[37];
  if (json_object_get(b, "id") && !util_id_valid(id)) {
    bad_request(c, "id must match [A-Za-z0-9._:-]{1,128}");
  } else if (!name || strlen(name) == 0 || strlen(name) > STORE_NAME_MAX) {
    bad_request(c, "name must be a string of 1 to 256 bytes");
  } else if (presence && !json_is_boolean(presence)) {
    bad_request(c, "presence must be a boolean");
  } else if (signals && !json_is_boolean(signals)) {
    bad_request(c, "signals must be a boolean");
  } else {
    rest_job_t *j = job_new(api, c, J_CHANNEL_CREATE);
    if (j) {
      if (!id) {
        util_uuid(gen);
        id = gen;
      }
      strcpy(j->id, id);
      j->name = strdup(name);
      j->flag = json_is_true(presence);
      j->signals = json_is_true(signals);
      job_submit(j);
    }
  }
  json_decref(b);
}

static void handle_channel_patch(api_t *api, conn_t *c, http_request_t *req, const char *id) {
  json_t *b = body_object(c, req);
  if (!b) return;
  json_t *active = json_object_get(b, "active");
  if (!json_is_boolean(active)) {
    bad_request(c, "body must be {\"active\": true|false}");
  } else {
    rest_job_t *j = job_new(api, c, J_CHANNEL_PATCH);
    if (j) {
      strcpy(j->id, id);
      j->flag = json_is_true(active);
      job_submit(j);
    }
  }
  json_decref(b);
}

static void handle_conv_create(api_t *api, conn_t *c, http_request_t *req) {
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *id = json_string_value(json_object_get(b, "id"));
  const char *channel = json_string_value(json_object_get(b, "channel"));
  char gen[37];
  if (json_object_get(b, "id") && !util_id_valid(id)) {
    bad_request(c, "id must match [A-Za-z0-9._:-]{1,128}");
  } else if (!util_id_valid(channel)) {
    bad_request(c, "channel must be an id matching [A-Za-z0-9._:-]{1,128}");
  } else {
    rest_job_t *j = job_new(api, c, J_CONV_CREATE);
    if (j) {
      if (!id) {
        util_uuid(gen);
        id = gen;
      }
      strcpy(j->id, id);
      strcpy(j->other, channel);
      job_submit(j);
    }
  }
  json_decref(b);
}

/* The REST appends' rate limit (CONVERGER_REST_RATE), which signals share:
 * 1 when the request was refused here (429 with a hint), 0 to go on. */
static int rest_rate_refused(api_t *api, conn_t *c) {
  uint64_t now = util_mono_ms();
  if (api->cfg->rest_rate <= 0 || limiter_take(&api->rest_appends, now)) return 0;
  metrics_add(api->metrics, "converger_rate_limited_total", "kind=\"rest\"", 1);
  char message[96];
  snprintf(message, sizeof message, "more than %d appends and signals a second on this node",
           api->cfg->rest_rate);
  http_respond_error(c, 429, "rate_limited", message, limiter_wait_ms(&api->rest_appends, now));
  return 1;
}

/* A message's or a signal's {"sender", "body"}: the body as JSON text
 * (heap, the caller's) of at most `max` bytes, `*sender` pointing into
 * `b`. NULL after answering 400, 413 (`too_large`, its message) or 503. */
static char *sender_and_body(conn_t *c, json_t *b, size_t max, const char *too_large,
                             const char **sender) {
  *sender = json_string_value(json_object_get(b, "sender"));
  json_t *body = json_object_get(b, "body");
  char *text = NULL;
  if (!util_id_valid(*sender)) {
    bad_request(c, "sender must be an id matching [A-Za-z0-9._:-]{1,128}");
  } else if (!body) {
    bad_request(c, "body is required (any JSON value)");
  } else if (!(text = frame_dump(body))) {
    http_respond_error(c, 503, "unavailable", "out of memory", 1000);
  } else if (strlen(text) > max) {
    http_respond_error(c, 413, "too_large", too_large, 0);
    free(text);
    text = NULL;
  }
  return text;
}

static void handle_msg_append(api_t *api, conn_t *c, http_request_t *req, const char *conv) {
  if (rest_rate_refused(api, c)) return;
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *key = req->idempotency_key, *sender;
  char *text = NULL;
  if (key && !util_id_valid(key)) {
    bad_request(c, "Idempotency-Key must match [A-Za-z0-9._:-]{1,128}");
  } else if ((text = sender_and_body(c, b, (size_t)api->cfg->max_message_bytes,
                                     "message body is larger than CONVERGER_MAX_MESSAGE_BYTES",
                                     &sender)) != NULL) {
    rest_job_t *j = job_new(api, c, J_MSG_APPEND);
    if (j) {
      strcpy(j->id, conv);
      strcpy(j->other, sender);
      if (key)
        strcpy(j->key, key);
      else
        util_uuid(j->key);
      j->name = text;
      text = NULL;
      job_submit(j);
    }
  }
  free(text);
  json_decref(b);
}

static void handle_msg_list(api_t *api, conn_t *c, http_request_t *req, const char *conv) {
  int64_t after, limit;
  if (query_int(c, req->query, "after", 0, &after) != 0) return;
  if (query_int(c, req->query, "limit", 100, &limit) != 0) return;
  if (limit < 1 || limit > STORE_REPLAY_PAGE_MAX) {
    bad_request(c, "limit must be between 1 and 1000");
    return;
  }
  rest_job_t *j = job_new(api, c, J_MSG_LIST);
  if (!j) return;
  strcpy(j->id, conv);
  j->after = after;
  j->limit = limit;
  job_submit(j);
}

/* Query parameter `name` (percent-decoded) into `out` (`cap` bytes, ""
 * when absent): 1 when present, -1 after answering 400 when its value is
 * not an id (`what` says what it must be). */
static int query_id(conn_t *c, const char *query, const char *name, char *out, size_t cap,
                    const char *what) {
  const char *p = query;
  out[0] = '\0';
  int r = query_next(&p, name, out, cap);
  if (r == 0) return 0;
  if (r == 1 && util_id_valid(out)) return 1;
  out[0] = '\0';
  bad_request(c, what);
  return -1;
}

/* GET /v1/conversations/{id}/presence?limit=&cursor=&members= */
static void handle_presence(api_t *api, conn_t *c, http_request_t *req, const char *conv) {
  int64_t limit;
  char cursor[STORE_ID_MAX + 1], members[8];
  if (query_int(c, req->query, "limit", FRAME_PRESENCE_PAGE, &limit) != 0) return;
  if (limit < 1 || limit > FRAME_PRESENCE_PAGE_MAX)
    return bad_request(c, "limit must be between 1 and 1000");
  if (query_id(c, req->query, "cursor", cursor, sizeof cursor,
               "cursor must be the cursor of the page before") < 0)
    return;
  if (query_id(c, req->query, "members", members, sizeof members, "members must be true or false") <
      0)
    return;
  if (members[0] && strcmp(members, "true") != 0 && strcmp(members, "false") != 0)
    return bad_request(c, "members must be true or false");
  rest_job_t *j = job_new(api, c, J_PRESENCE);
  if (!j) return;
  strcpy(j->id, conv);
  strcpy(j->key, cursor);
  j->limit = limit;
  j->flag = strcmp(members, "false") != 0;
  job_submit(j);
}

/* POST /v1/conversations/{id}/signals {"sender", "body"}: not stored
 * (docs/protocol.md 9.7); the REST appends' rate limit counts it. */
static void handle_signal(api_t *api, conn_t *c, http_request_t *req, const char *conv) {
  if (rest_rate_refused(api, c)) return;
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *sender;
  char *text = sender_and_body(c, b, FRAME_SIGNAL_BYTES_MAX,
                               "a signal's body is at most 4096 bytes of JSON", &sender);
  rest_job_t *j = text ? job_new(api, c, J_SIGNAL) : NULL;
  if (j) {
    strcpy(j->id, conv);
    strcpy(j->other, sender);
    j->ts_ms = util_now_ms();
    j->name = text;
    text = NULL;
    job_submit(j);
  }
  free(text);
  json_decref(b);
}

static void handle_token(api_t *api, conn_t *c, http_request_t *req) {
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *sub = json_string_value(json_object_get(b, "sub"));
  json_t *convs = json_object_get(b, "convs");
  json_t *ttl = json_object_get(b, "ttlSeconds");
  int ok = util_id_valid(sub) && json_is_array(convs) && json_array_size(convs) > 0 &&
           json_array_size(convs) <= 1000;
  size_t i;
  json_t *v;
  if (ok) json_array_foreach(convs, i, v) {
      const char *s = json_string_value(v);
      if (!s || (strcmp(s, "*") != 0 && !util_id_valid(s))) ok = 0;
    }
  if (!ok) {
    bad_request(c, "body must be {\"sub\": id, \"convs\": [ids or \"*\"], \"ttlSeconds\"?: n}");
  } else if (ttl && (!json_is_integer(ttl) || json_integer_value(ttl) < 1 ||
                     json_integer_value(ttl) > 366 * 86400)) {
    bad_request(c, "ttlSeconds must be an integer between 1 and 31622400");
  } else {
    int64_t now = util_now_ms() / 1000, exp;
    char *token = NULL, jti[37], at[25];
    if (auth_sign(api->auth, sub, convs, now, ttl ? json_integer_value(ttl) : 3600, &token, jti,
                  &exp) != 0) {
      http_respond_error(c, 503, "unavailable", "cannot sign the token", 1000);
    } else {
      util_format_ts(exp * 1000, at);
      http_respond_json(
          c, 201, json_pack("{s:s, s:s, s:s}", "token", token, "jti", jti, "expiresAt", at), NULL);
    }
    free(token);
  }
  json_decref(b);
}

static void handle_revoke(api_t *api, conn_t *c, http_request_t *req) {
  json_t *b = body_object(c, req);
  if (!b) return;
  const char *jti = json_string_value(json_object_get(b, "jti"));
  if (!jti || !*jti || strlen(jti) > STORE_ID_MAX) {
    bad_request(c, "body must be {\"jti\": string}");
  } else {
    rest_job_t *j = job_new(api, c, J_REVOKE);
    if (j) {
      strcpy(j->id, jti);
      /* Keep the row for the longest token lifetime we issue. */
      j->exp_s = util_now_ms() / 1000 + 366 * 86400;
      job_submit(j);
    }
  }
  json_decref(b);
}

/* ---- router ------------------------------------------------------------------ */

static void method_not_allowed(conn_t *c, const char *allow) {
  char extra[64];
  snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
  json_t *err = json_pack("{s:{s:s, s:s}}", "error", "code", "method_not_allowed", "message",
                          "method not allowed on this path");
  http_respond_json(c, 405, err, extra);
}

static void not_found(conn_t *c) { http_respond_error(c, 404, "not_found", "no such route", 0); }

#define IS(m) (req->method == HTTP_##m)

/* The checks before a WebSocket or a stream is taken on: 1 when it was
 * refused here (503 with a hint), 0 when it may go on. */
static int connection_refused(api_t *api, conn_t *c) {
  if (*api->phase >= NODE_DRAINING) {
    http_respond_error(c, 503, "unavailable",
                       *api->phase >= NODE_STOPPING ? "node is shutting down"
                                                    : "node is draining; use another",
                       config_retry_hint(api->cfg, api->rng));
  } else if (api->net->nws >= *api->max_connections) {
    /* Refused while descriptors remain, so health checks, metrics and
     * the store keep theirs (serve.c: the reserve). */
    metrics_add(api->metrics, "converger_upgrades_refused_total", "reason=\"max_connections\"", 1);
    http_respond_error(c, 503, "too_many_connections",
                       "this node holds as many WebSocket connections as it may; retry later "
                       "or on another node",
                       config_retry_hint(api->cfg, api->rng));
  } else if (api->cfg->accept_rate > 0 && !limiter_take(api->accept, util_mono_ms())) {
    /* The accept limiter: refused before any WebSocket work. */
    metrics_add(api->metrics, "converger_accept_refused_total", NULL, 1);
    http_respond_error(c, 503, "unavailable", "too many connections are being opened; retry",
                       config_retry_hint(api->cfg, api->rng));
  } else {
    return 0;
  }
  return 1;
}

#define SSE_QUERY_MAX 16384 /* a Last-Event-ID or token in the query, bytes */

/* GET /v1/sse?conv=A&conv=B (docs/protocol.md 12): the token in
 * Authorization: Bearer or ?token=, the watermarks in Last-Event-ID (or
 * ?lastEventId=), then a stream through the hello's own path. */
static void handle_sse(api_t *api, conn_t *c, http_request_t *req) {
  int max = api->cfg->max_subs;
  char **convs = calloc((size_t)max + 1, sizeof *convs);
  char *token = malloc(SSE_QUERY_MAX), *lei = malloc(SSE_QUERY_MAX);
  char client[STORE_ID_MAX + 1] = "", id[STORE_ID_MAX + 1], events[16] = "";
  size_t n = 0;
  int r = 0;
  if (!convs || !token || !lei) {
    http_respond_error(c, 503, "unavailable", "out of memory", 1000);
    goto out;
  }
  token[0] = lei[0] = '\0';
  for (const char *p = req->query; (r = query_next(&p, "conv", id, sizeof id)) == 1;) {
    if (!util_id_valid(id)) break;
    for (size_t i = 0; i < n; i++)
      if (strcmp(convs[i], id) == 0) r = 2;
    if (r == 2) break;
    if (n == (size_t)max) {
      r = 3;
      break;
    }
    if (!(convs[n] = strdup(id))) break;
    n++;
  }
  if (r != 0 || n == 0) {
    char msg[160];
    snprintf(msg, sizeof msg,
             r == 2 ? "a conversation appears twice in conv"
             : r == 3
                 ? "more than max_subs (%d) conversations"
                 : "conv must be given 1 to %d times, each an id matching [A-Za-z0-9._:-]{1,128}",
             max);
    bad_request(c, msg);
    goto out;
  }
  const char *q = req->query;
  if (req->authorization && strncasecmp(req->authorization, "Bearer ", 7) == 0)
    snprintf(token, SSE_QUERY_MAX, "%s", req->authorization + 7);
  else if ((r = query_next(&q, "token", token, SSE_QUERY_MAX)) < 0)
    token[0] = '\0';
  q = req->query;
  if (query_next(&q, "clientId", client, sizeof client) < 0 ||
      (client[0] && !util_id_valid(client))) {
    bad_request(c, "clientId must be an id matching [A-Za-z0-9._:-]{1,128}");
    goto out;
  }
  q = req->query;
  if (query_next(&q, "presenceEvents", events, sizeof events) < 0 ||
      (events[0] && strcmp(events, "true") != 0 && strcmp(events, "false") != 0 &&
       strcmp(events, "users") != 0 && strcmp(events, "clients") != 0)) {
    bad_request(c, "presenceEvents must be true, false, users or clients");
    goto out;
  }
  int presence_events = !events[0] || strcmp(events, "false") == 0 ? FRAME_EVENTS_NONE
                        : strcmp(events, "clients") == 0           ? FRAME_EVENTS_CLIENTS
                                                                   : FRAME_EVENTS_USERS;
  q = req->query;
  if (req->last_event_id)
    snprintf(lei, SSE_QUERY_MAX, "%s", req->last_event_id);
  else if (query_next(&q, "lastEventId", lei, SSE_QUERY_MAX) < 0)
    lei[0] = '\x01'; /* not decodable: refused below */
  for (size_t i = 0; i < n; i++) {
    int64_t w;
    char ep[STORE_EPOCH_MAX + 1];
    int rc = session_sse_watermark(lei, convs[i], &w, ep);
    if (rc == -CV_ENOMEM) {
      http_respond_error(c, 503, "unavailable", "out of memory", 1000);
      goto out;
    }
    if (rc != 0) {
      bad_request(c, "Last-Event-ID must be an id this node gave: CONV SEQ EPOCH, joined by ',', "
                     "each conversation once");
      goto out;
    }
  }
  if (!token[0]) {
    http_respond_error(c, 401, "unauthorized",
                       "no token (Authorization: Bearer TOKEN, or ?token=TOKEN)", 0);
    goto out;
  }
  /* The scope before the stream: a conversation outside the token is a
   * 403 here, not an error event (the hello would skip it). */
  auth_token_t t = {0};
  const char *why = NULL;
  if (auth_verify(api->auth, token, util_now_ms() / 1000, &t, &why) == 0) {
    for (size_t i = 0; i < n; i++)
      if (!t.can_read || !auth_token_allows(&t, convs[i])) {
        char msg[200];
        snprintf(msg, sizeof msg, "the token does not cover conversation %s", convs[i]);
        http_respond_error(c, 403, "forbidden", msg, 0);
        auth_token_clear(&t);
        goto out;
      }
  }
  auth_token_clear(&t); /* a bad token: the hello answers 401 */
  if (connection_refused(api, c)) goto out;
  if (ws_start_sse(c, config_retry_hint(api->cfg, api->rng)) == 0)
    session_sse_begin(c, token, client[0] ? client : NULL, (const char *const *)convs, n, lei,
                      presence_events);
out:
  for (size_t i = 0; convs && i < n; i++) free(convs[i]);
  free(convs);
  free(token);
  free(lei);
}

/* The operator's routes: with an admin listener (CONVERGER_ADMIN_LISTEN)
 * served there only; /readyz on both, for load balancers that can probe
 * only the port they send to. */
static int admin_path(const char *path) {
  while (path[0] == '/' && path[1] == '/') path++; /* "//admin/..." routes as "/admin/..." */
  return strcmp(path, "/metrics") == 0 || strcmp(path, "/livez") == 0 ||
         strncmp(path, "/admin/", 7) == 0 || strcmp(path, "/admin") == 0;
}

void rest_handle(api_t *api, conn_t *c, http_request_t *req) {
  const char *path = req->path;
  char seg[5][STORE_ID_MAX + 1];
  if (api->cfg->admin_host && strcmp(path, "/readyz") != 0 && admin_path(path) != c->admin) {
    req->route = c->admin ? "admin:other" : "admin";
    return http_respond_error(c, 404, "not_found",
                              c->admin ? "the admin listener serves /metrics, /admin/*, /livez and "
                                         "/readyz only; the rest is on the client port"
                                       : "served on the admin listener (CONVERGER_ADMIN_LISTEN), "
                                         "not on the client port",
                              0);
  }
  if (!*api->pool && strcmp(path, "/livez") != 0 && strcmp(path, "/readyz") != 0 &&
      strcmp(path, "/metrics") != 0 && strcmp(path, "/admin/status") != 0) {
    /* The store is not open yet (lifecycle.c retries it): nothing else can
     * be served, a WebSocket upgrade included. */
    req->route = "store_wait";
    return http_respond_error(c, 503, "unavailable", "the store is not open yet; retry later",
                              config_retry_hint(api->cfg, api->rng));
  }
  if (strcmp(path, "/v1/ws") == 0) {
    req->route = "/v1/ws";
    const char *why;
    int status = ws_check_upgrade(req, &why);
    if (status == 405) {
      method_not_allowed(c, "GET");
    } else if (status) {
      req->keep_alive = 0;
      http_respond_json(c, status,
                        json_pack("{s:{s:s, s:s}}", "error", "code", "bad_request", "message", why),
                        "Sec-WebSocket-Version: 13\r\n");
    } else if (!connection_refused(api, c)) {
      ws_upgrade(c, req);
    }
    return;
  }
  if (strcmp(path, "/v1/sse") == 0) {
    req->route = "/v1/sse";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    return handle_sse(api, c, req);
  }
  char file[96];
  const char *type = web_file(path, file, sizeof file);
  if (type) {
    req->route = "/";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    return serve_file(api, c, file, type);
  }
  if (strcmp(path, "/livez") == 0) {
    req->route = "/livez";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    return http_respond_json(c, 200, json_pack("{s:s}", "status", "ok"), NULL);
  }
  if (strcmp(path, "/readyz") == 0) {
    req->route = "/readyz";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    const char *state;
    int ready = readiness(api, &state);
    const store_wait_t *w = api->store_wait;
    if (!ready && w && w->waiting) /* why, for the operator: the store is not open yet */
      return http_respond_json(c, 503,
                               json_pack("{s:s, s:s, s:s, s:i}", "status", state, "reason",
                                         "store_unavailable", "message", w->why, "attempts",
                                         w->attempts),
                               NULL);
    return http_respond_json(c, ready ? 200 : 503, json_pack("{s:s}", "status", state), NULL);
  }
  if (strcmp(path, "/metrics") == 0) {
    req->route = "/metrics";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    size_t len;
    refresh_gauges(api); /* read now, not at the last tick */
    char *text = metrics_render(api->metrics, &len);
    if (!text) return http_respond_error(c, 503, "unavailable", "out of memory", 1000);
    http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
    free(text);
    return;
  }
  if (strcmp(path, "/admin/drain") == 0) {
    req->route = "/admin/drain";
    if (!IS(POST)) return method_not_allowed(c, "POST");
    if (require_key(api, c, req) != 0) return;
    return handle_drain(api, c);
  }
  if (strcmp(path, "/admin/shed") == 0) {
    req->route = "/admin/shed";
    if (!IS(POST)) return method_not_allowed(c, "POST");
    if (require_key(api, c, req) != 0) return;
    return handle_shed(api, c, req);
  }
  if (strcmp(path, "/admin/status") == 0) {
    req->route = "/admin/status";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    if (require_key(api, c, req) != 0) return;
    return handle_status(api, c);
  }
  if (strcmp(path, "/admin/cluster") == 0) {
    req->route = "/admin/cluster";
    if (!IS(GET)) return method_not_allowed(c, "GET");
    if (require_key(api, c, req) != 0) return;
    rest_job_t *j = job_new(api, c, J_CLUSTER);
    if (j) job_submit(j);
    return;
  }

  int n = split_path(path, seg);
  if (n == 4 && strcmp(seg[0], "admin") == 0 && strcmp(seg[1], "users") == 0 &&
      (strcmp(seg[3], "disconnect") == 0 || strcmp(seg[3], "unsubscribe") == 0)) {
    int disconnect = seg[3][0] == 'd';
    req->route = disconnect ? "/admin/users/{user}/disconnect" : "/admin/users/{user}/unsubscribe";
    if (!IS(POST)) return method_not_allowed(c, "POST");
    if (require_key(api, c, req) != 0) return;
    if (!util_id_valid(seg[2])) return bad_request(c, "user must match [A-Za-z0-9._:-]{1,128}");
    return disconnect ? handle_user_disconnect(api, c, req, seg[2])
                      : handle_user_unsubscribe(api, c, req, seg[2]);
  }
  if (n < 2 || n > 5 || strcmp(seg[0], "v1") != 0) return not_found(c);

  if (strcmp(seg[1], "channels") == 0) {
    if (n == 2) {
      req->route = "/v1/channels";
      if (!IS(POST)) return method_not_allowed(c, "POST");
      if (require_key(api, c, req) != 0) return;
      return handle_channel_create(api, c, req);
    }
    if (n == 3) {
      req->route = "/v1/channels/{id}";
      if (!IS(PATCH) && !IS(GET)) return method_not_allowed(c, "GET, PATCH");
      if (require_key(api, c, req) != 0) return;
      if (!util_id_valid(seg[2]))
        return bad_request(c, "channel id must match [A-Za-z0-9._:-]{1,128}");
      if (IS(PATCH)) return handle_channel_patch(api, c, req, seg[2]);
      rest_job_t *j = job_new(api, c, J_CHANNEL_GET);
      if (j) {
        strcpy(j->id, seg[2]);
        job_submit(j);
      }
      return;
    }
    return not_found(c);
  }
  if (strcmp(seg[1], "conversations") == 0) {
    if (n == 2) {
      req->route = "/v1/conversations";
      if (!IS(POST)) return method_not_allowed(c, "POST");
      if (require_key(api, c, req) != 0) return;
      return handle_conv_create(api, c, req);
    }
    if (n == 3 || (n == 4 && strcmp(seg[3], "messages") == 0)) {
      req->route = n == 3 ? "/v1/conversations/{id}" : "/v1/conversations/{id}/messages";
      if (n == 3 && !IS(GET)) return method_not_allowed(c, "GET");
      if (n == 4 && !IS(GET) && !IS(POST)) return method_not_allowed(c, "GET, POST");
      if (require_key(api, c, req) != 0) return;
      if (!util_id_valid(seg[2]))
        return bad_request(c, "conversation id must match [A-Za-z0-9._:-]{1,128}");
      if (n == 4)
        return IS(POST) ? handle_msg_append(api, c, req, seg[2])
                        : handle_msg_list(api, c, req, seg[2]);
      rest_job_t *j = job_new(api, c, J_CONV_GET);
      if (j) {
        strcpy(j->id, seg[2]);
        job_submit(j);
      }
      return;
    }
    if (n == 4 && (strcmp(seg[3], "presence") == 0 || strcmp(seg[3], "signals") == 0)) {
      int presence = seg[3][0] == 'p';
      req->route = presence ? "/v1/conversations/{id}/presence" : "/v1/conversations/{id}/signals";
      if (presence && !IS(GET)) return method_not_allowed(c, "GET");
      if (!presence && !IS(POST)) return method_not_allowed(c, "POST");
      if (require_key(api, c, req) != 0) return;
      if (!util_id_valid(seg[2]))
        return bad_request(c, "conversation id must match [A-Za-z0-9._:-]{1,128}");
      return presence ? handle_presence(api, c, req, seg[2]) : handle_signal(api, c, req, seg[2]);
    }
    return not_found(c);
  }
  if (strcmp(seg[1], "tokens") == 0 && (n == 2 || (n == 3 && strcmp(seg[2], "revoke") == 0))) {
    req->route = n == 2 ? "/v1/tokens" : "/v1/tokens/revoke";
    if (!IS(POST)) return method_not_allowed(c, "POST");
    if (require_key(api, c, req) != 0) return;
    return n == 2 ? handle_token(api, c, req) : handle_revoke(api, c, req);
  }
  not_found(c);
}

/* ---- revocation refresh -------------------------------------------------- */

typedef struct {
  pool_job_t job;
  api_t *api;
  char **jtis;
  size_t n;
  int status;
} refresh_job_t;

static void refresh_work(pool_job_t *job, store_t *db) {
  refresh_job_t *r = container_of(job, refresh_job_t, job);
  r->status = store_revocations(db, util_now_ms() / 1000, &r->jtis, &r->n);
}

static void refresh_done(pool_job_t *job) {
  refresh_job_t *r = container_of(job, refresh_job_t, job);
  if (r->status == 0) {
    /* Add, never replace: a revocation committed after this read was
     * already added by its own request. */
    for (size_t i = 0; i < r->n; i++) auth_add_revoked(r->api->auth, r->jtis[i]);
    if (r->n) session_revoke_jti(r->api->sessions, NULL);
  }
  r->api->revocation_running = 0;
  store_strings_free(r->jtis, r->n);
  free(r);
}

static void refresh_cb(uv_timer_t *t) {
  api_t *api = t->data;
  if (api->revocation_running || *api->phase >= NODE_STOPPING) return;
  refresh_job_t *r = calloc(1, sizeof *r);
  if (!r) return;
  r->api = api;
  api->revocation_running = 1;
  r->job.kind = "revocations";
  r->job.no_drop = 1; /* revocations must take effect under overload too */
  pool_submit(*api->pool, &r->job, refresh_work, refresh_done);
}

void rest_stop(api_t *api) {
  if (!uv_is_closing((uv_handle_t *)&api->revocation_timer))
    uv_close((uv_handle_t *)&api->revocation_timer, NULL);
}

void rest_start_revocation_refresh(api_t *api) {
  uv_timer_init(api->loop, &api->revocation_timer);
  api->revocation_timer.data = api;
  uv_timer_start(&api->revocation_timer, refresh_cb, 0, (uint64_t)api->cfg->revocation_refresh_ms);
}
