/*
 * client_core.c: the sans-I/O state machine of libconverger-client (see
 * include/converger/client.h for the contract).
 *
 * State:
 *   - at most two transports (`t[]`): the welcomed one (`active`) and, while
 *     an attempt or a drain migration is in progress, the one being opened.
 *     A transport goes OPENING (open action issued) -> HELLO (opened, hello
 *     sent) -> WELCOMED. When the core closes a transport or hears that it
 *     closed, its slot is freed at once: later events with its id are
 *     ignored, so a late frame from a closed transport cannot be delivered;
 *   - per subscription a watermark, the last seq given to the application,
 *     and the epoch it belongs to. The watermark is the only de-duplication
 *     state: both transports of a migration are checked against it, and
 *     every hello carries it with the epoch. It moves only forward, by one
 *     delivered message, or to the head the node names in a reset
 *     (on_reset): never silently;
 *   - the sends not yet answered by `sent`, in submission order;
 *   - three deadlines (reconnect, migrate, and per transport connect or
 *     idle), of which the earliest is the one timer the caller arms.
 *
 * Every public event function ends with finish(), which arms the timer.
 * Actions wait in a queue with strings the core owns until the caller takes
 * the next one.
 *
 * Sources: RFC 6455 (close codes), docs/protocol.md, the reconnect-storm
 * post-mortem (jittered backoff with a server hint as a floor), the drain
 * lesson (migrate after afterMs, dedupe by seq).
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "converger/client.h"
#include "common/jitter.h"
#include "common/util.h"
#include "wsurl.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 15000
#define DEFAULT_MAX_PENDING_SENDS  10000
#define MAX_SUBS                   100
#define MAX_HINT_MS                3600000 /* server durations (hints, afterMs, heartbeatMs): at most 1 h */
#define DEFAULT_MAX_MESSAGE_BYTES  65536
#define NT                         2 /* transports at once: the active one and the one opening */

typedef enum { T_FREE = 0, T_OPENING, T_HELLO, T_WELCOMED } tstate_t;

typedef struct {
  uint32_t id;
  tstate_t st;
  int url;            /* its place in urls[]: the entry it opened; for a drain's reconnectTo, that
                         URL's entry when it is one, else the place of the connection it moves from
                         (a reconnect after its loss goes on from there); -1 none */
  int tls;            /* opened on a wss:// URL */
  int migration;      /* opened for a drain */
  int unavailable;    /* an `unavailable` error was counted on it */
  int unauthorized;   /* the server refused the token on it */
  int token_expired;  /* the server said token_expired on it */
  int64_t deadline;   /* connect deadline until welcomed, then idle deadline */
  int64_t idle_ms;    /* 0: no idle deadline (heartbeatMs 0) */
  int64_t hint_ms;    /* retryAfterMs of an error frame on it */
  int64_t hint_until; /* an answer that kept it open (a shard's `unavailable`) said "not before
                         this time": the floor of a reconnect after its loss; 0 none */
  char node[64];      /* from its welcome */
} ctrans_t;

typedef struct {
  char *conv;
  int64_t wm;                         /* watermark; CVG_WATERMARK_NONE until the first welcome */
  char epoch[CVG_EPOCH_MAX + 1];      /* the epoch `wm` is in; "" unknown */
  char left_epoch[CVG_EPOCH_MAX + 1]; /* the one a reset left: its late frames are dropped */
  char hello_epoch[NT][CVG_EPOCH_MAX + 1]; /* `epoch` when transport slot k's hello went out */
  char sync_epoch[CVG_EPOCH_MAX + 1];      /* `epoch` when the pending sync went out */
  int ended;                  /* forbidden, not found or inactive: left out of hellos */
  int sync_pending;           /* a gap sync is in flight on the active transport */
  int64_t retry_at;           /* replay_unavailable: sync again at this time; -1 none */
  int in_hello[NT];           /* transport slot k's hello carried it */
  int64_t hello_retry_at[NT]; /* slot k's hello entry was refused with `unavailable` (a shard
                                 down, protocol 2.3): subscribe again then, once k is welcomed */
  int live;                   /* granted on the active transport: in its welcome, or `subscribed` */
  int subscribing;            /* a `subscribe` is in flight on the active transport */
  int64_t sub_retry_at;       /* a refused subscribe: again at this time; -1 none */
} csub_t;

typedef struct psend_s {
  struct psend_s *next;
  char *conv;
  char id[129];
  char *frame; /* its send frame, built once (resends send it again) */
  cvg_sent_cb cb;
  void *ud;
  uint32_t sent_on; /* transport id it was last sent on; 0: never sent */
  size_t frame_len; /* bytes of its send frame */
  int64_t retry_at; /* rate_limited: send it again at this time; -1 none */
} psend_t;

typedef struct {
  cvg_action_t a;
  char *s; /* owned string of the action (url, data or reason) */
} qact_t;

struct cvg_core_s {
  cvg_options_t opt; /* strings below are the core's copies */
  char **urls;
  char *token, *client_name;
  char client_id[129]; /* every hello's clientId */
  csub_t *subs;
  size_t nsubs, subs_cap;
  struct unsub_due_s { /* unsubscribes whose `unsubscribed` answer is still to come */
    char *conv;
    uint32_t t;       /* the transport it went on */
    int64_t retry_at; /* rate_limited: send it again then; -1 none */
  } * unsub_due;
  size_t nunsub_due;
  int64_t refresh_at;   /* ask token_cb for a fresh token then; -1 none */
  int refresh_failures; /* token_cb failures in a row (its backoff) */
  int need_token;       /* token_expired: a new token before the next hello */
  jitter_rng_t rng;
  cvg_backoff_t backoff;
  cvg_state_t state;
  ctrans_t t[NT];
  uint32_t next_id;
  int active;                       /* slot of the welcomed transport, -1: none */
  int last_url;                     /* URL that failed or drains, avoided next; -1: none */
  int64_t reconnect_at, migrate_at; /* -1: none */
  int64_t migrate_deadline;         /* the drain's deadlineMs on our clock; -1: none */
  char *migrate_url;                /* the drain's reconnectTo, or NULL */
  int64_t hint_ms;                  /* floor for the next backoff, from the transport lost last */
  int64_t offline_since;            /* -1 while welcomed */
  int64_t timer_at;                 /* the timer the caller has armed, -1 none */
  psend_t *sends, **sends_tail;
  size_t nsends;
  qact_t *q;
  size_t qlen, qcap, qpos;
  char *taken; /* string of the action returned last */
  cvg_stats_t st;
};

/* ---- small helpers ---------------------------------------------------------------- */

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void push(cvg_core_t *core, cvg_action_t a, char *owned) {
  if (core->qlen == core->qcap) {
    size_t cap = core->qcap ? core->qcap * 2 : 8;
    qact_t *q = realloc(core->q, cap * sizeof *q);
    if (!q) { /* out of memory: the action is lost; the transport times out */
      free(owned);
      return;
    }
    core->q = q;
    core->qcap = cap;
  }
  core->q[core->qlen++] = (qact_t){a, owned};
}

static void push_send(cvg_core_t *core, uint32_t id, char *frame) {
  if (!frame) return;
  push(core,
       (cvg_action_t){.type = CVG_ACT_SEND, .transport = id, .data = frame, .len = strlen(frame)},
       frame);
}

static void push_close(cvg_core_t *core, uint32_t id, int code, const char *reason) {
  char *r = strdup(reason);
  push(core, (cvg_action_t){.type = CVG_ACT_CLOSE, .transport = id, .code = code, .reason = r}, r);
}

static char *dump(json_t *v) {
  char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
  json_decref(v);
  return s;
}

static void set_state(cvg_core_t *core, cvg_state_t s, const char *fmt, ...) {
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  core->state = s;
  if (core->opt.cb.on_state) core->opt.cb.on_state(core->opt.userdata, s, detail);
}

static csub_t *find_sub(cvg_core_t *core, const char *conv) {
  for (size_t i = 0; i < core->nsubs; i++)
    if (strcmp(core->subs[i].conv, conv) == 0) return &core->subs[i];
  return NULL;
}

static ctrans_t *find_t(cvg_core_t *core, uint32_t id) {
  for (int i = 0; i < NT; i++)
    if (core->t[i].st != T_FREE && core->t[i].id == id) return &core->t[i];
  return NULL;
}

static int slot_of(cvg_core_t *core, ctrans_t *t) { return (int)(t - core->t); }

static int live_count(cvg_core_t *core) {
  int n = 0;
  for (int i = 0; i < NT; i++) n += core->t[i].st != T_FREE;
  return n;
}

/* A random UUID (version 4 layout) from the core's seeded source. */
static void make_uuid(cvg_core_t *core, char out[37]) {
  uint8_t b[16];
  uint64_t x = jitter_next(&core->rng), y = jitter_next(&core->rng);
  memcpy(b, &x, 8);
  memcpy(b + 8, &y, 8);
  b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
  b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
           b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
}

/* ---- creation --------------------------------------------------------------------- */

void cvg_options_init(cvg_options_t *o) {
  memset(o, 0, sizeof *o);
  o->migrate_on_drain = 1;
}

static const char *const state_names[] = {
    [CVG_STATE_IDLE] = "idle",           [CVG_STATE_CONNECTING] = "connecting",
    [CVG_STATE_CONNECTED] = "connected", [CVG_STATE_MIGRATING] = "migrating",
    [CVG_STATE_WAITING] = "waiting",     [CVG_STATE_FAILED] = "failed",
    [CVG_STATE_CLOSED] = "closed",
};

const char *cvg_state_name(cvg_state_t s) {
  return (size_t)s < sizeof state_names / sizeof state_names[0] ? state_names[s] : "unknown";
}

int cvg_core_new(const cvg_options_t *opt, cvg_core_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!opt || opt->nurls == 0 || !opt->urls) {
    set_err(err, errlen, "at least one URL is needed");
    return CVG_EINVAL;
  }
  for (size_t i = 0; i < opt->nurls; i++) {
    if (!wsurl_parse(opt->urls[i], NULL, err, errlen)) return CVG_EINVAL;
    /* a client on wss never moves to ws (docs/protocol.md 8): one list,
     * one scheme */
    if (wsurl_tls(opt->urls[i]) != wsurl_tls(opt->urls[0])) {
      set_err(err, errlen,
              "URLs '%s' and '%s' mix ws:// and wss://: give all of one (a client on wss never "
              "moves to ws)",
              opt->urls[0], opt->urls[i]);
      return CVG_EINVAL;
    }
  }
  if (!opt->token || !opt->token[0]) {
    set_err(err, errlen, "a token is needed");
    return CVG_EINVAL;
  }
  if (opt->nsubs > MAX_SUBS || (opt->nsubs && !opt->subs)) {
    set_err(err, errlen, "%zu subscriptions: at most %d", opt->nsubs, MAX_SUBS);
    return CVG_EINVAL;
  }
  for (size_t i = 0; i < opt->nsubs; i++) {
    if (!util_id_valid(opt->subs[i].conv)) {
      set_err(err, errlen, "conversation id '%s': 1-128 characters of [A-Za-z0-9._:-]",
              opt->subs[i].conv ? opt->subs[i].conv : "(null)");
      return CVG_EINVAL;
    }
    if (opt->subs[i].watermark < CVG_WATERMARK_NONE) {
      set_err(err, errlen, "conversation %s: watermark %lld is negative", opt->subs[i].conv,
              (long long)opt->subs[i].watermark);
      return CVG_EINVAL;
    }
    const char *e = opt->epochs ? opt->epochs[i] : NULL;
    if (e && e[0] && (strlen(e) > CVG_EPOCH_MAX || !util_id_valid(e))) {
      set_err(err, errlen, "conversation %s: epoch '%s': 1-%d characters of [A-Za-z0-9._:-]",
              opt->subs[i].conv, e, CVG_EPOCH_MAX);
      return CVG_EINVAL;
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(opt->subs[i].conv, opt->subs[j].conv) == 0) {
        set_err(err, errlen, "conversation %s is subscribed twice", opt->subs[i].conv);
        return CVG_EINVAL;
      }
  }
  if (opt->client_id && !util_id_valid(opt->client_id)) {
    set_err(err, errlen, "client id '%s': 1-128 characters of [A-Za-z0-9._:-]", opt->client_id);
    return CVG_EINVAL;
  }
  if ((unsigned)opt->presence_events > CVG_PRESENCE_CLIENTS) {
    set_err(err, errlen, "bad presence_events %d", opt->presence_events);
    return CVG_EINVAL;
  }
  if ((unsigned)opt->reconnect > CVG_RECONNECT_NEXT) {
    set_err(err, errlen, "bad reconnect policy %d", (int)opt->reconnect);
    return CVG_EINVAL;
  }
  if ((unsigned)opt->backoff > CVG_BACKOFF_PROPORTIONAL || opt->backoff_base_ms < 0 ||
      opt->backoff_cap_ms < 0 || opt->backoff_jitter_ms < 0 || opt->connect_timeout_ms < 0) {
    set_err(err, errlen, "bad backoff or timeout option");
    return CVG_EINVAL;
  }

  cvg_core_t *core = calloc(1, sizeof *core);
  if (!core) goto nomem;
  core->opt = *opt;
  core->active = -1;
  core->last_url = -1;
  core->reconnect_at = core->migrate_at = core->timer_at = core->migrate_deadline = -1;
  core->offline_since = -1;
  core->sends_tail = &core->sends;
  if (!core->opt.connect_timeout_ms) core->opt.connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;
  if (!core->opt.max_pending_sends) core->opt.max_pending_sends = DEFAULT_MAX_PENDING_SENDS;
  if (!core->opt.max_message_bytes) core->opt.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES;
  core->urls = calloc(opt->nurls, sizeof *core->urls);
  core->subs_cap = opt->nsubs > 4 ? opt->nsubs : 4;
  core->subs = calloc(core->subs_cap, sizeof *core->subs);
  core->refresh_at = -1;
  core->token = strdup(opt->token);
  core->client_name = dupstr(opt->client_name);
  if (!core->urls || !core->subs || !core->token || (opt->client_name && !core->client_name)) {
    cvg_core_free(core);
    goto nomem;
  }
  for (size_t i = 0; i < opt->nurls; i++)
    if (!(core->urls[i] = strdup(opt->urls[i]))) {
      cvg_core_free(core);
      goto nomem;
    }
  for (; core->nsubs < opt->nsubs; core->nsubs++) {
    csub_t *s = &core->subs[core->nsubs];
    s->wm = opt->subs[core->nsubs].watermark;
    const char *e = opt->epochs ? opt->epochs[core->nsubs] : NULL;
    snprintf(s->epoch, sizeof s->epoch, "%s", e ? e : "");
    s->retry_at = s->sub_retry_at = -1;
    for (int k = 0; k < NT; k++) s->hello_retry_at[k] = -1;
    if (!(s->conv = strdup(opt->subs[core->nsubs].conv))) {
      cvg_core_free(core);
      goto nomem;
    }
  }
  core->opt.urls = NULL; /* the copies are core->urls etc. */
  core->opt.subs = NULL;
  core->opt.epochs = NULL;
  core->opt.token = core->token;
  core->opt.client_name = core->client_name;
  if (opt->seed)
    jitter_seed(&core->rng, opt->seed);
  else
    jitter_seed_random(&core->rng);
  cvg_backoff_options_t bo = {opt->backoff, opt->backoff_base_ms, opt->backoff_cap_ms,
                              opt->backoff_jitter_ms};
  cvg_backoff_init(&core->backoff, &bo, &core->rng);
  if (opt->client_id)
    snprintf(core->client_id, sizeof core->client_id, "%s", opt->client_id);
  else
    make_uuid(core, core->client_id);
  core->opt.client_id = core->client_id;
  *out = core;
  return 0;
nomem:
  set_err(err, errlen, "out of memory");
  return CVG_ENOMEM;
}

static void complete_send(cvg_core_t *core, psend_t **link, int64_t seq, const char *error) {
  psend_t *p = *link;
  *link = p->next;
  if (core->sends_tail == &p->next) core->sends_tail = link;
  core->nsends--;
  if (p->cb) p->cb(p->ud, p->conv, p->id, seq, error);
  free(p->conv);
  free(p->frame);
  free(p);
}

void cvg_core_free(cvg_core_t *core) {
  if (!core) return;
  while (core->sends) { /* no callbacks: the application is freeing the client */
    psend_t *p = core->sends;
    core->sends = p->next;
    free(p->conv);
    free(p->frame);
    free(p);
  }
  for (size_t i = core->qpos; i < core->qlen; i++) free(core->q[i].s);
  free(core->q);
  free(core->taken);
  if (core->urls)
    for (size_t i = 0; i < core->opt.nurls; i++) free(core->urls[i]);
  free(core->urls);
  for (size_t i = 0; i < core->nsubs; i++) free(core->subs[i].conv);
  free(core->subs);
  for (size_t i = 0; i < core->nunsub_due; i++) free(core->unsub_due[i].conv);
  free(core->unsub_due);
  free(core->token);
  free(core->client_name);
  free(core->migrate_url);
  free(core);
}

/* ---- timer ------------------------------------------------------------------------ */

/* Arm the caller's timer at the earliest deadline, when it changed. */
static void finish(cvg_core_t *core) {
  int64_t at = -1;
#define EARLIER(x)                                                                                 \
  if ((x) >= 0 && (at < 0 || (x) < at)) at = (x)
  EARLIER(core->reconnect_at);
  EARLIER(core->migrate_at);
  for (size_t i = 0; i < core->nsubs && core->active >= 0; i++)
    if (!core->subs[i].ended) EARLIER(core->subs[i].retry_at);
  for (psend_t *p = core->sends; p && core->active >= 0; p = p->next) EARLIER(p->retry_at);
  for (size_t i = 0; i < core->nsubs && core->active >= 0; i++)
    if (!core->subs[i].ended) EARLIER(core->subs[i].sub_retry_at);
  EARLIER(core->refresh_at);
  for (size_t i = 0; i < core->nunsub_due; i++) EARLIER(core->unsub_due[i].retry_at);
  for (int i = 0; i < NT; i++)
    if (core->t[i].st != T_FREE) EARLIER(core->t[i].deadline);
#undef EARLIER
  if (at == core->timer_at) return;
  core->timer_at = at;
  push(core, (cvg_action_t){.type = CVG_ACT_TIMER, .at_ms = at}, NULL);
}

/* ---- connections ------------------------------------------------------------------ */

/* A URL index after a failure of URL `avoid` (-1: none, or a drain's
 * reconnectTo): with CVG_RECONNECT_NEXT the one after it, otherwise one at
 * random, not `avoid` when there is another. */
static int pick_url(cvg_core_t *core, int avoid) {
  int n = (int)core->opt.nurls;
  if (core->opt.reconnect == CVG_RECONNECT_NEXT && avoid >= 0 && avoid < n) return (avoid + 1) % n;
  if (n == 1 || avoid < 0 || avoid >= n) return (int)jitter_range(&core->rng, 0, n - 1);
  int k = (int)jitter_range(&core->rng, 0, n - 2);
  return k >= avoid ? k + 1 : k;
}

static void open_transport(cvg_core_t *core, int url, const char *url_text, int migration,
                           int64_t now) {
  ctrans_t *t = NULL;
  for (int i = 0; i < NT && !t; i++)
    if (core->t[i].st == T_FREE) t = &core->t[i];
  if (!t) return; /* cannot happen: at most one attempt besides the active one */
  memset(t, 0, sizeof *t);
  t->id = ++core->next_id;
  if (t->id == 0) t->id = ++core->next_id;
  t->st = T_OPENING;
  t->url = url;
  if (url < 0 && url_text) { /* a reconnectTo: its entry in urls[], if any, else where we are */
    t->url = core->last_url;
    for (size_t i = 0; i < core->opt.nurls; i++)
      if (strcmp(core->urls[i], url_text) == 0) t->url = (int)i;
  }
  t->migration = migration;
  t->deadline = now + core->opt.connect_timeout_ms;
  char *u = strdup(url_text ? url_text : core->urls[url]);
  if (!u) {
    t->st = T_FREE;
    return;
  }
  t->tls = wsurl_tls(u);
  core->st.attempts++;
  push(core, (cvg_action_t){.type = CVG_ACT_OPEN, .transport = t->id, .url = u}, u);
  if (migration)
    set_state(core, CVG_STATE_MIGRATING, "drain: opening %s", u);
  else
    set_state(core, CVG_STATE_CONNECTING, "connecting to %s (attempt %llu)", u,
              (unsigned long long)core->backoff.attempt + 1);
}

/* The backoff's next delay, the hint of the transport lost last a floor
 * (hints are not taken in at all with ignore_hints); the hint is used up. */
static int64_t next_delay(cvg_core_t *core) {
  int64_t delay = cvg_backoff_next(&core->backoff, core->hint_ms);
  core->hint_ms = 0;
  return delay;
}

/* No transport is live and none is welcomed: wait for the backoff (with the
 * server's hint as a floor), then try another URL. */
static void schedule_reconnect(cvg_core_t *core, int failed_url, const char *why, int64_t now) {
  int64_t delay = next_delay(core);
  core->last_url = failed_url;
  core->reconnect_at = now + delay;
  set_state(core, CVG_STATE_WAITING, "%s; next attempt in %lld ms", why, (long long)delay);
}

static void fail_sends(cvg_core_t *core, const char *error) {
  while (core->sends) complete_send(core, &core->sends, 0, error);
}

/* Stop for good (the token was refused, or no subscription is left);
 * pending sends complete with `error`. */
static void fail(cvg_core_t *core, const char *why, const char *error, int64_t now) {
  if (core->active >= 0 && core->offline_since < 0) core->offline_since = now;
  core->st.node[0] = '\0';
  for (int i = 0; i < NT; i++)
    if (core->t[i].st != T_FREE) {
      push_close(core, core->t[i].id, 1000, why);
      core->t[i].st = T_FREE;
    }
  core->active = -1;
  core->reconnect_at = core->migrate_at = -1;
  set_state(core, CVG_STATE_FAILED, "%s", why);
  fail_sends(core, error);
}

static int64_t reason_hint(const char *reason, size_t len) {
  if (!reason || len == 0) return 0;
  json_t *j = json_loadb(reason, len, 0, NULL);
  json_t *h = json_object_get(j, "retryAfterMs");
  int64_t v = json_is_integer(h) ? (int64_t)json_integer_value(h) : 0;
  json_decref(j);
  return v > 0 ? (v < MAX_HINT_MS ? v : MAX_HINT_MS) : 0;
}

/* A duration from the server, in ms, within [0, MAX_HINT_MS]. */
static int64_t clamp_ms(json_int_t v) {
  return v < 0 ? 0 : v > MAX_HINT_MS ? MAX_HINT_MS : (int64_t)v;
}

/* A 1009 close: the server refused a frame as too large. The largest send
 * in flight on that transport is the one at fault; it completes with
 * too_large instead of going out again after every reconnect. */
static void fail_largest_send(cvg_core_t *core, uint32_t id) {
  psend_t **worst = NULL;
  for (psend_t **l = &core->sends; *l; l = &(*l)->next)
    if ((*l)->sent_on == id && (!worst || (*l)->frame_len > (*worst)->frame_len)) worst = l;
  if (worst) complete_send(core, worst, 0, "too_large");
}

static void unsub_due_forget(cvg_core_t *core, uint32_t t, int keep);

/* Transport `t` is gone (the server closed it, the TCP connection ended, or
 * a deadline passed). Its slot is freed. */
static void transport_lost(cvg_core_t *core, ctrans_t *t, int code, const char *reason, size_t len,
                           int64_t now) {
  int slot = slot_of(core, t);
  int was_active = slot == core->active;
  int was_migration = t->migration && !was_active;
  int url = t->url;
  /* a hint of an answer that kept the connection open counts from that
   * answer: what is left of it (docs/protocol.md 4.3) */
  int64_t hint = max64(t->hint_ms, t->hint_until > now ? t->hint_until - now : 0);
  unsub_due_forget(core, t->id, 0); /* its answers will not come */
  /* 1012, 1013 and an operator's disconnect with a hint (protocol 1.1)
   * carry {"retryAfterMs": n} as their reason; any other reason is no hint */
  if (!core->opt.ignore_hints) hint = max64(hint, reason_hint(reason, len));
  if (code == 1013 && !t->unavailable) core->st.unavailable++;
  int unauthorized = t->unauthorized;
  int expired = t->token_expired ||
                (code == 1008 && reason && len == 13 && memcmp(reason, "token_expired", 13) == 0);
  if (code == 1009) fail_largest_send(core, t->id);
  t->st = T_FREE;
  char why[300];
  snprintf(why, sizeof why, "connection closed (%d %.*s)", code, (int)(len > 200 ? 200 : len),
           reason ? reason : "");
  if (was_active) {
    core->active = -1;
    for (size_t i = 0; i < core->nsubs; i++) core->subs[i].live = 0;
    core->offline_since = now;
    core->st.node[0] = '\0';
    core->migrate_at = -1;
  }
  if (expired && !(was_migration && core->active >= 0)) {
    if (!core->opt.token_cb) {
      fail(core, "the token expired and no token callback can give another", "token_expired", now);
      return;
    }
    core->need_token = 1; /* asked for before the next hello (cvg_core_timer) */
  }
  if (unauthorized && !(was_migration && core->active >= 0)) {
    /* (a refusal on a drain's new connection keeps the old one) */
    fail(core, "the server refused the token (unauthorized)", "unauthorized", now);
    return;
  }
  core->hint_ms = max64(core->hint_ms, hint);
  if (was_active) {
    if (live_count(core) > 0) { /* the migration's connection takes over */
      set_state(core, CVG_STATE_CONNECTING, "%s; waiting for the new connection", why);
      return;
    }
    schedule_reconnect(core, url, why, now);
    return;
  }
  if (was_migration && core->active >= 0) {
    /* Keep the draining connection. Try the move again after the backoff
     * (the hint a floor) if that is still before the drain's deadline, when
     * the node closes what is left; otherwise wait for that close. */
    int64_t delay = next_delay(core);
    if (core->migrate_deadline >= 0 && now + delay < core->migrate_deadline) {
      free(core->migrate_url); /* a random other node this time */
      core->migrate_url = NULL;
      core->migrate_at = now + delay;
      set_state(core, CVG_STATE_CONNECTED,
                "drain migration failed (%s); keeping the connection, trying again in %lld ms", why,
                (long long)delay);
    } else {
      set_state(core, CVG_STATE_CONNECTED, "drain migration failed (%s); keeping the connection",
                why);
    }
    return;
  }
  schedule_reconnect(core, url, why, now);
}

/* The core drops transport `t` itself: close it and handle the loss. */
static void drop(cvg_core_t *core, ctrans_t *t, const char *why, int64_t now) {
  push_close(core, t->id, CVG_CLOSE_ABORT, why);
  transport_lost(core, t, CVG_CLOSE_ABORT, why, strlen(why), now);
}

/* presenceEvents of a hello entry or a subscribe (protocol 1.2). */
static void set_presence_events(const cvg_core_t *core, json_t *f) {
  json_object_set_new(f, "presenceEvents",
                      core->opt.presence_events == CVG_PRESENCE_CLIENTS ? json_string("clients")
                                                                        : json_true());
}

/* join, leave and signal (protocol 1.2): told by the connection in use
 * only, so a drain move does not tell them twice, and only for a
 * conversation in the set: nothing of one follows its cvg_unsubscribe
 * (frames the node wrote before it took the unsubscribe are dropped, as
 * its `msg` frames are). */
static void on_ephemeral(cvg_core_t *core, ctrans_t *t, json_t *j, const char *type) {
  if (core->active < 0 || t != &core->t[core->active]) return;
  const char *conv = json_string_value(json_object_get(j, "conv"));
  if (!conv) {
    core->st.bad_frames++;
    return;
  }
  const csub_t *s = find_sub(core, conv);
  if (!s || s->ended) return;
  if (strcmp(type, "signal") == 0) {
    const char *sender = json_string_value(json_object_get(j, "sender"));
    char *body = json_dumps(json_object_get(j, "body"), JSON_COMPACT | JSON_ENCODE_ANY);
    if (sender && body && core->opt.on_signal)
      core->opt.on_signal(core->opt.userdata, conv, sender,
                          json_integer_value(json_object_get(j, "ts")), body);
    free(body);
    return;
  }
  const char *user = json_string_value(json_object_get(j, "user"));
  const char *client = json_string_value(json_object_get(j, "client"));
  if (!user || !client) {
    core->st.bad_frames++;
    return;
  }
  if (core->opt.on_presence)
    core->opt.on_presence(core->opt.userdata, conv, type[0] == 'j', user, client);
}

static char *hello_frame(cvg_core_t *core, int slot) {
  json_t *subs = json_array();
  for (size_t i = 0; i < core->nsubs; i++) {
    csub_t *s = &core->subs[i];
    s->in_hello[slot] = !s->ended;
    s->hello_retry_at[slot] = -1;
    if (s->ended) continue;
    memcpy(s->hello_epoch[slot], s->epoch, sizeof s->epoch);
    json_t *e = json_pack("{s:s, s:o}", "conv", s->conv, "watermark",
                          s->wm < 0 ? json_null() : json_integer(s->wm));
    if (e && s->wm >= 0 && s->epoch[0]) json_object_set_new(e, "epoch", json_string(s->epoch));
    if (e && core->opt.presence_events) set_presence_events(core, e);
    json_array_append_new(subs, e);
  }
  json_t *h = json_pack("{s:s, s:s, s:o}", "type", "hello", "token", core->token, "subs", subs);
  if (h && core->client_name) json_object_set_new(h, "client", json_string(core->client_name));
  if (h) json_object_set_new(h, "clientId", json_string(core->client_id));
  return dump(h);
}

static char *send_frame(const psend_t *p, json_t *body) {
  return dump(json_pack("{s:s, s:s, s:s, s:O}", "type", "send", "conv", p->conv, "id", p->id,
                        "body", body));
}

static void transmit(cvg_core_t *core, psend_t *p, ctrans_t *t) {
  if (p->sent_on) core->st.resent++;
  p->sent_on = t->id;
  p->retry_at = -1;
  push_send(core, t->id, strdup(p->frame));
}

/* ---- server frames ---------------------------------------------------------------- */

/* Every subscription ended (forbidden, not found, inactive): no hello can
 * be made any more, so the client stops now rather than after the next
 * loss. Returns 1 when it failed. */
static int no_subscription_left(cvg_core_t *core, int64_t now) {
  if (core->nsubs == 0) return 0; /* none asked for (yet): a hello without any is fine */
  for (size_t i = 0; i < core->nsubs; i++)
    if (!core->subs[i].ended) return 0;
  fail(core, "every subscription has ended (forbidden, not found or inactive)", "no_subscription",
       now);
  return 1;
}

/* ---- subscriptions on a live connection (protocol 1.1) ------------------------------ */

/* Send `subscribe` for `s` on the active transport. */
static void send_subscribe(cvg_core_t *core, csub_t *s) {
  if (core->active < 0) return;
  json_t *f = json_pack("{s:s, s:s, s:o}", "type", "subscribe", "conv", s->conv, "watermark",
                        s->wm < 0 ? json_null() : json_integer(s->wm));
  if (f && s->wm >= 0 && s->epoch[0]) json_object_set_new(f, "epoch", json_string(s->epoch));
  if (f && core->opt.presence_events) set_presence_events(core, f);
  s->subscribing = 1;
  s->sub_retry_at = -1;
  memcpy(s->sync_epoch, s->epoch, sizeof s->epoch); /* the epoch a reset in `subscribed` is of */
  push_send(core, core->t[core->active].id, dump(f));
}

static void remove_sub(cvg_core_t *core, csub_t *s) {
  size_t i = (size_t)(s - core->subs);
  free(s->conv);
  memmove(&core->subs[i], &core->subs[i + 1], (core->nsubs - i - 1) * sizeof *core->subs);
  core->nsubs--;
}

static void send_unsubscribe(cvg_core_t *core, uint32_t t, const char *conv) {
  push_send(core, t, dump(json_pack("{s:s, s:s}", "type", "unsubscribe", "conv", conv)));
}

/* Note that the answer to an unsubscribe of `conv` on transport `t` is
 * still to come, so that it is not taken for the node ending a later
 * subscription, and so that a rate_limited answer can send it again. */
static void unsub_due_add(cvg_core_t *core, const char *conv, uint32_t t) {
  struct unsub_due_s *v = realloc(core->unsub_due, (core->nunsub_due + 1) * sizeof *v);
  if (!v) return;
  core->unsub_due = v;
  char *c = strdup(conv);
  if (c) v[core->nunsub_due++] = (struct unsub_due_s){c, t, -1};
}

/* The pending unsubscribe of `conv` on transport `t`, or NULL. */
static struct unsub_due_s *unsub_due_find(cvg_core_t *core, const char *conv, uint32_t t) {
  for (size_t i = 0; i < core->nunsub_due; i++)
    if (core->unsub_due[i].t == t && strcmp(core->unsub_due[i].conv, conv) == 0)
      return &core->unsub_due[i];
  return NULL;
}

static void unsub_due_drop(cvg_core_t *core, struct unsub_due_s *u) {
  free(u->conv);
  *u = core->unsub_due[--core->nunsub_due];
}

/* Forget the answers due on transport `t` (gone: they will not come), or,
 * with keep set, those due on any transport but `t`. */
static void unsub_due_forget(cvg_core_t *core, uint32_t t, int keep) {
  for (size_t i = 0; i < core->nunsub_due;)
    if ((core->unsub_due[i].t == t) != keep)
      unsub_due_drop(core, &core->unsub_due[i]);
    else
      i++;
}

/* ---- the token (protocol 1.1) ------------------------------------------------------ */

/* When to ask for a fresh token: about 80 % of `lifetime_ms` from now
 * (uniform in 75..85 %), so that clients given tokens at one instant do
 * not all refresh at one instant. */
static void schedule_refresh(cvg_core_t *core, int64_t lifetime_ms, int64_t now) {
  if (!core->opt.token_cb || lifetime_ms <= 0) return;
  int64_t lo = lifetime_ms * 75 / 100, hi = lifetime_ms * 85 / 100;
  core->refresh_at =
      now + (hi > lo ? (int64_t)jitter_range(&core->rng, (uint64_t)lo, (uint64_t)hi) : lo);
  core->refresh_failures = 0;
}

/* Ask the callback for a token. 1 with core->token replaced; 0 when it
 * failed (core->refresh_at is then the next try, after a backoff). */
static int fetch_token(cvg_core_t *core, const char *why, int64_t now) {
  char buf[8192];
  buf[0] = '\0';
  if (core->opt.token_cb && core->opt.token_cb(core->opt.userdata, why, buf, sizeof buf) == 0 &&
      buf[0] && memchr(buf, '\0', sizeof buf)) {
    char *t = strdup(buf);
    if (t) {
      free(core->token);
      core->token = t;
      core->opt.token = t;
      core->refresh_failures = 0;
      return 1;
    }
  }
  int n = core->refresh_failures < 5 ? core->refresh_failures : 5;
  core->refresh_failures++;
  int64_t cap = 1000ll << n; /* 1, 2, 4 ... 32 s */
  if (cap > 30000) cap = 30000;
  core->refresh_at = now + (int64_t)jitter_range(&core->rng, (uint64_t)cap / 2, (uint64_t)cap);
  return 0;
}

static void send_refresh(cvg_core_t *core) {
  if (core->active < 0) return;
  push_send(core, core->t[core->active].id,
            dump(json_pack("{s:s, s:s}", "type", "refresh", "token", core->token)));
}

/* An `epoch` field: 1 with *out set (NULL when absent, null or ""), 0
 * when it is there but not an epoch (a bad frame). */
static int get_epoch(json_t *v, const char **out) {
  *out = NULL;
  if (!v || json_is_null(v)) return 1;
  const char *e = json_string_value(v);
  if (!e || strlen(e) > CVG_EPOCH_MAX) return 0;
  *out = e[0] ? e : NULL;
  return 1;
}

/* A reset the node reports for `s` (welcome entry, synced) that the client
 * has already made: the resume named epoch `sent`, and since it went out
 * the other connection's messages (a drain move) moved the subscription
 * into the reported epoch. Then the watermark stays (never backwards) and
 * nothing is reported twice. */
static int reset_already_made(const csub_t *s, const char *sent, const char *epoch) {
  return epoch && s->epoch[0] && strcmp(sent, s->epoch) != 0 && strcmp(epoch, s->epoch) == 0;
}

/* The node says `s`'s history is not the one its watermark was in: tell
 * the application and continue from `head` in `epoch` (client.h). */
static void reset_sub(cvg_core_t *core, csub_t *s, int64_t head, const char *epoch) {
  char old_epoch[CVG_EPOCH_MAX + 1];
  int64_t old = s->wm;
  memcpy(old_epoch, s->epoch, sizeof old_epoch);
  if (epoch && s->epoch[0] && strcmp(epoch, s->epoch) != 0)
    memcpy(s->left_epoch, s->epoch, sizeof s->left_epoch);
  s->wm = head;
  snprintf(s->epoch, sizeof s->epoch, "%s", epoch ? epoch : "");
  core->st.resets++;
  if (core->opt.cb.on_reset) { /* copies: the callback may unsubscribe it */
    char conv[130], now_epoch[CVG_EPOCH_MAX + 1];
    snprintf(conv, sizeof conv, "%s", s->conv);
    memcpy(now_epoch, s->epoch, sizeof now_epoch);
    core->opt.cb.on_reset(core->opt.userdata, conv, old, old_epoch, head, now_epoch);
  }
}

static void on_welcome(cvg_core_t *core, ctrans_t *t, json_t *j, int64_t now) {
  json_t *subs = json_object_get(j, "subs");
  json_t *hb = json_object_get(j, "heartbeatMs");
  const char *node = json_string_value(json_object_get(j, "node"));
  if (t->st != T_HELLO || !json_is_array(subs) || (hb && !json_is_integer(hb))) {
    core->st.bad_frames++;
    return;
  }
  /* live from now on: what this welcome lists. A hello entry it leaves out
   * was refused (an error with its conv, before the welcome or after it):
   * not live, and still in the set */
  for (size_t k = 0; k < core->nsubs; k++) core->subs[k].live = 0;
  size_t i;
  json_t *it;
  json_array_foreach(subs, i, it) {
    const char *conv = json_string_value(json_object_get(it, "conv"));
    json_t *head = json_object_get(it, "head");
    const char *epoch;
    csub_t *s = conv ? find_sub(core, conv) : NULL;
    if (!s || !json_is_integer(head) || json_integer_value(head) < 0 ||
        !get_epoch(json_object_get(it, "epoch"), &epoch))
      continue;
    int64_t h = (int64_t)json_integer_value(head);
    s->live = 1;
    if (json_is_true(json_object_get(it, "reset")) && s->wm != CVG_WATERMARK_NONE) {
      if (!reset_already_made(s, s->hello_epoch[slot_of(core, t)], epoch))
        reset_sub(core, s, h, epoch);
      continue;
    }
    if (s->wm == CVG_WATERMARK_NONE) s->wm = h; /* started live: the head is the watermark */
    if (epoch) snprintf(s->epoch, sizeof s->epoch, "%s", epoch);
  }
  t->st = T_WELCOMED;
  int64_t hb_ms = hb ? clamp_ms(json_integer_value(hb)) : 0;
  t->idle_ms = 2 * hb_ms + hb_ms / 2;
  t->deadline = t->idle_ms > 0 ? now + t->idle_ms : -1;
  snprintf(t->node, sizeof t->node, "%s", node ? node : "");
  core->st.welcomes++;
  cvg_backoff_reset(&core->backoff);
  core->hint_ms = 0;
  int migrated = 0;
  if (core->active >= 0) { /* make-before-break: the new one is welcomed, close the old */
    push_close(core, core->t[core->active].id, 1000, "migrated");
    core->t[core->active].st = T_FREE;
    core->st.migrations++;
    migrated = 1;
  }
  core->active = slot_of(core, t);
  t->migration = 0;
  if (core->offline_since >= 0) {
    core->st.offline_ms += now - core->offline_since;
    core->offline_since = -1;
  }
  memcpy(core->st.node, t->node, sizeof t->node);
  for (size_t k = 0; k < core->nsubs; k++) { /* the hello's watermarks cover any gap */
    csub_t *s = &core->subs[k];
    s->sync_pending = 0;
    s->retry_at = -1;
    s->subscribing = 0;
    /* its hello entry refused for now (unavailable: its shard is down,
     * docs/protocol.md 2.3): subscribe again after that answer's hint */
    s->sub_retry_at = s->in_hello[core->active] && !s->live ? s->hello_retry_at[core->active] : -1;
    s->hello_retry_at[core->active] = -1;
    /* subscribed after that hello went out: subscribe on this connection */
    if (!s->ended && !s->in_hello[core->active]) send_subscribe(core, s);
  }
  unsub_due_forget(core, t->id, 1); /* the old connection's answers will not come */
  json_t *exp = json_object_get(j, "expiresInMs");
  if (json_is_integer(exp)) schedule_refresh(core, clamp_ms(json_integer_value(exp)), now);
  /* Sends not answered on an earlier connection go again, same id. */
  for (psend_t *p = core->sends; p; p = p->next) transmit(core, p, t);
  set_state(core, CVG_STATE_CONNECTED, "%s node %s", migrated ? "migrated to" : "welcomed by",
            t->node);
  no_subscription_left(core, now);
}

/* One sync from the watermark on the active connection, unless one is in
 * flight or the server asked to wait (replay_unavailable's hint). */
static void request_sync(cvg_core_t *core, csub_t *s, int64_t now) {
  if (s->sync_pending || core->active < 0 || s->wm < 0) return;
  if (s->retry_at >= 0 && now < s->retry_at) return; /* the timer sends it */
  s->retry_at = -1;
  s->sync_pending = 1;
  core->st.gaps++;
  json_t *sync =
      json_pack("{s:s, s:s, s:I}", "type", "sync", "conv", s->conv, "watermark", (json_int_t)s->wm);
  if (sync && s->epoch[0]) json_object_set_new(sync, "epoch", json_string(s->epoch));
  memcpy(s->sync_epoch, s->epoch, sizeof s->epoch);
  push_send(core, core->t[core->active].id, dump(sync));
}

static void on_msg(cvg_core_t *core, ctrans_t *t, json_t *j, const char *data, size_t len,
                   int64_t now) {
  const char *conv = json_string_value(json_object_get(j, "conv"));
  json_t *seqv = json_object_get(j, "seq");
  const char *id = json_string_value(json_object_get(j, "id"));
  const char *sender = json_string_value(json_object_get(j, "sender"));
  const char *ts = json_string_value(json_object_get(j, "ts"));
  json_t *body = json_object_get(j, "body");
  const char *epoch = NULL;
  csub_t *s = conv ? find_sub(core, conv) : NULL;
  if (t->st != T_WELCOMED || !s || !json_is_integer(seqv) || json_integer_value(seqv) < 1 || !id ||
      !sender || !ts || !body || !get_epoch(json_object_get(j, "epoch"), &epoch)) {
    core->st.bad_frames++;
    return;
  }
  int64_t seq = (int64_t)json_integer_value(seqv);
  if (s->ended) return;
  if (epoch && s->left_epoch[0] && strcmp(epoch, s->left_epoch) == 0) {
    core->st.duplicates++; /* late, from the history a reset left (the other connection) */
    return;
  }
  if (epoch && s->epoch[0] && strcmp(epoch, s->epoch) != 0 && s->wm != CVG_WATERMARK_NONE) {
    /* The history changed under a live subscription (the store was
     * restored while this connection stayed): what the watermark counted
     * is gone. This message starts the new history for us. */
    reset_sub(core, s, seq - 1, epoch);
    /* on_reset may have subscribed (moving the array) or unsubscribed */
    if (!(s = find_sub(core, conv))) return;
  } else if (epoch && !s->epoch[0]) {
    snprintf(s->epoch, sizeof s->epoch, "%s", epoch);
  }
  if (s->wm == CVG_WATERMARK_NONE) /* started live and the welcome named no head: */
    s->wm = seq - 1;               /* the first live message is the start */
  if (seq <= s->wm) {
    core->st.duplicates++;
    return;
  }
  if (seq > s->wm + 1) { /* a gap: the message comes again from the replay */
    request_sync(core, s, now);
    return;
  }
  s->wm = seq;
  core->st.delivered++;
  if (!core->opt.cb.on_message) return;
  char *text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
  cvg_message_t m = {conv, seq, id, sender, ts, text ? text : "null", data, len};
  core->opt.cb.on_message(core->opt.userdata, &m);
  free(text);
}

static void on_synced(cvg_core_t *core, ctrans_t *t, json_t *j, int64_t now) {
  const char *conv = json_string_value(json_object_get(j, "conv"));
  json_t *head = json_object_get(j, "head");
  const char *epoch;
  csub_t *s = conv ? find_sub(core, conv) : NULL;
  if (!s || !json_is_integer(head) || json_integer_value(head) < 0 ||
      !get_epoch(json_object_get(j, "epoch"), &epoch)) {
    core->st.bad_frames++;
    return;
  }
  if (s->sync_pending) core->st.gaps_filled++;
  s->sync_pending = 0;
  if (!s->ended && slot_of(core, t) == core->active) {
    int64_t h = (int64_t)json_integer_value(head);
    if (json_is_true(json_object_get(j, "reset")) && s->wm != CVG_WATERMARK_NONE &&
        !reset_already_made(s, s->sync_epoch, epoch))
      reset_sub(core, s, h, epoch);
    else if (epoch)
      snprintf(s->epoch, sizeof s->epoch, "%s", epoch);
  }
  if (core->opt.cb.on_synced)
    core->opt.cb.on_synced(core->opt.userdata, conv, json_integer_value(head));
  /* The callbacks above may have subscribed (moving the array) or
   * unsubscribed: look the subscription up again. */
  if (!(s = find_sub(core, conv))) return;
  /* Still behind the head the server just named: a message was lost on
   * the way (dropped as a gap while this replay ran); ask again. */
  if (!s->ended && slot_of(core, t) == core->active && s->wm >= 0 &&
      s->wm < (int64_t)json_integer_value(head))
    request_sync(core, s, now);
}

/* `subscribed` (protocol 1.1): the answer to a subscribe, like a welcome
 * entry; its replay and `synced` follow. */
static void on_subscribed(cvg_core_t *core, ctrans_t *t, json_t *j) {
  const char *conv = json_string_value(json_object_get(j, "conv"));
  json_t *head = json_object_get(j, "head");
  const char *epoch;
  csub_t *s = conv ? find_sub(core, conv) : NULL;
  if (conv && !s) return; /* unsubscribed meanwhile */
  if (!s || !json_is_integer(head) || json_integer_value(head) < 0 ||
      !get_epoch(json_object_get(j, "epoch"), &epoch)) {
    core->st.bad_frames++;
    return;
  }
  if (slot_of(core, t) != core->active || s->ended) return;
  s->subscribing = 0;
  s->live = 1;
  if (json_is_true(json_object_get(j, "already"))) return;
  int64_t h = (int64_t)json_integer_value(head);
  if (json_is_true(json_object_get(j, "reset")) && s->wm != CVG_WATERMARK_NONE) {
    if (!reset_already_made(s, s->sync_epoch, epoch)) reset_sub(core, s, h, epoch);
    return;
  }
  if (s->wm == CVG_WATERMARK_NONE) s->wm = h; /* from the head: the head is the watermark */
  if (epoch) snprintf(s->epoch, sizeof s->epoch, "%s", epoch);
}

/* `unsubscribed` (protocol 1.1): the answer to our unsubscribe, or the
 * node ending a subscription (on_unsubscribed). */
static void on_unsubscribed(cvg_core_t *core, ctrans_t *t, json_t *j) {
  const char *conv = json_string_value(json_object_get(j, "conv"));
  if (!conv) {
    core->st.bad_frames++;
    return;
  }
  struct unsub_due_s *u = unsub_due_find(core, conv, t->id);
  if (u) { /* the answer to ours */
    unsub_due_drop(core, u);
    return;
  }
  csub_t *s = find_sub(core, conv);
  if (!s) return;
  remove_sub(core, s);
  if (core->opt.cb.on_unsubscribed) core->opt.cb.on_unsubscribed(core->opt.userdata, conv);
}

static void on_refreshed(cvg_core_t *core, json_t *j, int64_t now) {
  json_t *exp = json_object_get(j, "expiresInMs");
  if (!json_is_integer(exp)) {
    core->st.bad_frames++;
    return;
  }
  core->st.refreshes++;
  schedule_refresh(core, clamp_ms(json_integer_value(exp)), now);
}

/* The pending send of `conv` with `id` (an id is unique within its
 * conversation only), or NULL. */
static psend_t **find_send(cvg_core_t *core, const char *conv, const char *id) {
  for (psend_t **l = &core->sends; *l; l = &(*l)->next)
    if (strcmp((*l)->id, id) == 0 && strcmp((*l)->conv, conv) == 0) return l;
  return NULL;
}

static void on_sent(cvg_core_t *core, json_t *j) {
  const char *conv = json_string_value(json_object_get(j, "conv"));
  const char *id = json_string_value(json_object_get(j, "id"));
  json_t *seq = json_object_get(j, "seq");
  if (!conv || !id || !json_is_integer(seq) || json_integer_value(seq) < 1) {
    core->st.bad_frames++;
    return;
  }
  psend_t **l = find_send(core, conv, id);
  if (l) complete_send(core, l, (int64_t)json_integer_value(seq), NULL);
  /* else: the answer to a resend of a send already completed */
}

static void on_error(cvg_core_t *core, ctrans_t *t, json_t *j, int64_t now) {
  const char *code = json_string_value(json_object_get(j, "code"));
  const char *message = json_string_value(json_object_get(j, "message"));
  const char *conv = json_string_value(json_object_get(j, "conv"));
  json_t *ra = json_object_get(j, "retryAfterMs");
  const char *send_id = json_string_value(json_object_get(json_object_get(j, "details"), "id"));
  if (!code || (ra && !json_is_integer(ra))) {
    core->st.bad_frames++;
    return;
  }
  int64_t hint = ra && !core->opt.ignore_hints ? clamp_ms(json_integer_value(ra)) : 0;
  int64_t at = now + (hint > 0 ? hint : core->backoff.opt.base_ms); /* a retry, if one */
  int slot = slot_of(core, t);
  int ended = 0;
  if (conv && strcmp(code, "cancelled") == 0 && unsub_due_find(core, conv, t->id))
    return; /* the answer to a subscribe our own unsubscribe overtook (protocol 4.6): that
               subscription is gone from the set already, and one of the same conversation
               made since is not the one cancelled; the `unsubscribed` that follows is the
               unsubscribe's answer */
  csub_t *sub = conv ? find_sub(core, conv) : NULL;
  const char *frame = json_string_value(json_object_get(json_object_get(j, "details"), "frame"));
  struct unsub_due_s *unsub = conv && !sub && frame && strcmp(code, "rate_limited") == 0
                                  ? unsub_due_find(core, conv, t->id)
                                  : NULL;
  if (unsub) {
    /* an unsubscribe over the rate (it shares the subscribe bucket): the
     * node still delivers; send it again after the hint */
    unsub->retry_at = at;
    core->st.rate_limited++;
  } else if (!send_id && !frame && sub && !sub->ended && strcmp(code, "unavailable") == 0 &&
             t->st == T_HELLO && sub->in_hello[slot]) {
    /* A hello entry the node could not serve now (docs/protocol.md 2.3: a
     * sharded cluster's node whose shard of this conversation is down):
     * the connection stays and the welcome leaves it out; it stays in the
     * set, and once this connection is welcomed it is subscribed again
     * after the hint (on_welcome). The hint is also the floor of a
     * reconnect should the connection be lost. */
    sub->hello_retry_at[slot] = at;
    t->hint_until = max64(t->hint_until, now + hint);
  } else if (!send_id && !frame && sub && !sub->ended && strcmp(code, "unavailable") == 0 &&
             slot == core->active && (sub->subscribing || (sub->in_hello[slot] && !sub->live))) {
    /* a subscribe the node could not take now (protocol 4.5), or a hello
     * entry refused so after the welcome (2.3): the connection stays;
     * subscribe again after the hint */
    sub->subscribing = 0;
    sub->sub_retry_at = at;
    t->hint_until = max64(t->hint_until, now + hint);
  } else if (!send_id && sub && sub->subscribing && strcmp(code, "rate_limited") == 0 && frame &&
             strcmp(frame, "subscribe") == 0) {
    /* a subscribe over the rate (protocol 4.8): again after the hint */
    sub->subscribing = 0;
    sub->sub_retry_at = at;
    core->st.rate_limited++;
  } else if (!send_id && sub && strcmp(code, "cancelled") == 0) {
    /* an operator's unsubscribe overtook our subscribe: its `unsubscribed`
     * follows (on_unsubscribed) */
    sub->subscribing = 0;
  } else if (strcmp(code, "token_expired") == 0) {
    t->token_expired = 1; /* its 1008 close follows: a new token before the next hello */
  } else if (send_id && strcmp(code, "unavailable") == 0) {
    /* A send the node could not take now (docs/protocol.md 4.3). A sharded
     * cluster's node whose shard of this conversation is down keeps the
     * connection: the same frame (the same id: idempotent) goes again
     * after the hint, on this connection. An older node closes with 1013
     * next; then the send goes again after the reconnect's welcome, once
     * (its transmit there clears this retry), and the hint is the
     * reconnect's floor. Each refusal counts as an `unavailable` answer;
     * that 1013 is not counted again. */
    psend_t **l = conv ? find_send(core, conv, send_id) : NULL;
    if (l && (*l)->sent_on == t->id) (*l)->retry_at = at; /* else sent again since */
    t->hint_until = max64(t->hint_until, now + hint);
    core->st.unavailable++;
    t->unavailable = 1;
  } else if (strcmp(code, "unavailable") == 0) {
    /* its close (1013) follows: the hint is the floor of the next attempt */
    t->hint_ms = max64(t->hint_ms, hint);
    if (!t->unavailable) core->st.unavailable++;
    t->unavailable = 1;
  } else if (strcmp(code, "unauthorized") == 0) {
    t->unauthorized = 1;
  } else if (strcmp(code, "rate_limited") == 0) {
    /* over the connection's rate (protocol 1.1): the frame was not acted
     * on; the same frame again after the hint (or the first backoff step) */
    psend_t **l = send_id && conv ? find_send(core, conv, send_id) : NULL;
    core->st.rate_limited++;
    if (l) (*l)->retry_at = at;
    if (!send_id && sub && sub->sync_pending) { /* a sync's */
      sub->sync_pending = 0;
      sub->retry_at = at;
    }
    if (frame && strcmp(frame, "refresh") == 0 && core->opt.token_cb) core->refresh_at = at;
  } else if (send_id) { /* a send refused for good */
    psend_t **l = conv ? find_send(core, conv, send_id) : NULL;
    if (l) complete_send(core, l, 0, code);
  } else if (conv) {
    csub_t *s = sub;
    if (s && !s->ended &&
        (strcmp(code, "forbidden") == 0 || strcmp(code, "not_found") == 0 ||
         strcmp(code, "channel_inactive") == 0 || strcmp(code, "too_many_subscriptions") == 0)) {
      s->ended = ended = 1;
      s->subscribing = 0;
    }
    if (s && strcmp(code, "replay_unavailable") == 0) {
      /* sync again after the hint (or the first backoff step) */
      s->sync_pending = 0;
      s->retry_at = now + (hint > 0 ? hint : core->backoff.opt.base_ms);
    }
  }
  if (core->opt.cb.on_error)
    core->opt.cb.on_error(core->opt.userdata, code, message ? message : "", conv);
  if (ended && core->state != CVG_STATE_CLOSED && core->state != CVG_STATE_FAILED)
    no_subscription_left(core, now);
}

static void on_drain(cvg_core_t *core, ctrans_t *t, json_t *j, int64_t now) {
  json_t *after = json_object_get(j, "afterMs");
  json_t *to = json_object_get(j, "reconnectTo");
  json_t *deadline = json_object_get(j, "deadlineMs");
  if (!json_is_integer(after) || json_integer_value(after) < 0 ||
      (to && !json_is_null(to) && !json_is_string(to)) ||
      (deadline && (!json_is_integer(deadline) || json_integer_value(deadline) < 0))) {
    core->st.bad_frames++;
    return;
  }
  if (slot_of(core, t) != core->active || !core->opt.migrate_on_drain || live_count(core) > 1)
    return; /* without migration the server's 1012 close ends the connection */
  int64_t at = now + clamp_ms(json_integer_value(after));
  /* A second frame (a shed, then a drain with a shorter window) may only
   * bring the move forward: its deadline is the one that counts. */
  if (core->migrate_at >= 0 && core->migrate_at <= at) return;
  const char *url = json_string_value(to);
  if (url && !wsurl_parse(url, NULL, NULL, 0)) url = NULL; /* not a URL: as null */
  if (url && t->tls && !wsurl_tls(url)) {
    /* A connection over TLS never moves to plaintext (docs/protocol.md
     * 5.6): the move goes to one of the configured URLs instead. */
    if (core->opt.cb.on_error)
      core->opt.cb.on_error(
          core->opt.userdata, "downgrade_refused",
          "drain: reconnectTo is ws:// but this connection is wss://; moving to a "
          "configured URL instead",
          NULL);
    url = NULL;
  }
  free(core->migrate_url);
  core->migrate_url = url ? strdup(url) : NULL;
  core->migrate_at = at;
  core->migrate_deadline = deadline ? now + clamp_ms(json_integer_value(deadline)) : -1;
  core->last_url = t->url;
}

/* ---- events ----------------------------------------------------------------------- */

void cvg_core_start(cvg_core_t *core, int64_t now) {
  if (core->state != CVG_STATE_IDLE) return;
  core->offline_since = now;
  open_transport(core, pick_url(core, -1), NULL, 0, now);
  finish(core);
}

void cvg_core_opened(cvg_core_t *core, uint32_t id, int64_t now) {
  ctrans_t *t = find_t(core, id);
  if (!t || t->st != T_OPENING) return;
  if (no_subscription_left(core, now)) {
    finish(core);
    return;
  }
  t->st = T_HELLO;
  push_send(core, t->id, hello_frame(core, slot_of(core, t)));
  finish(core);
}

void cvg_core_text(cvg_core_t *core, uint32_t id, const char *data, size_t len, int64_t now) {
  ctrans_t *t = find_t(core, id);
  if (!t || t->st == T_OPENING) return;
  if (t->st == T_WELCOMED && t->idle_ms > 0) t->deadline = now + t->idle_ms;
  json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type)
    core->st.bad_frames++;
  else if (strcmp(type, "msg") == 0)
    on_msg(core, t, j, data, len, now);
  else if (strcmp(type, "welcome") == 0)
    on_welcome(core, t, j, now);
  else if (strcmp(type, "synced") == 0)
    on_synced(core, t, j, now);
  else if (strcmp(type, "sent") == 0)
    on_sent(core, j);
  else if (strcmp(type, "error") == 0)
    on_error(core, t, j, now);
  else if (strcmp(type, "drain") == 0)
    on_drain(core, t, j, now);
  else if (strcmp(type, "subscribed") == 0)
    on_subscribed(core, t, j);
  else if (strcmp(type, "unsubscribed") == 0)
    on_unsubscribed(core, t, j);
  else if (strcmp(type, "refreshed") == 0)
    on_refreshed(core, j, now);
  else if (strcmp(type, "signal") == 0 || strcmp(type, "join") == 0 || strcmp(type, "leave") == 0)
    on_ephemeral(core, t, j, type);
  else if (strcmp(type, "pong") != 0)
    core->st.bad_frames++;
  json_decref(j);
  finish(core);
}

void cvg_core_alive(cvg_core_t *core, uint32_t id, int64_t now) {
  ctrans_t *t = find_t(core, id);
  if (t && t->st == T_WELCOMED && t->idle_ms > 0) t->deadline = now + t->idle_ms;
  finish(core);
}

void cvg_core_closed(cvg_core_t *core, uint32_t id, int code, const char *reason, size_t len,
                     int64_t now) {
  ctrans_t *t = find_t(core, id);
  if (t) transport_lost(core, t, code, reason, len, now);
  finish(core);
}

void cvg_core_timer(cvg_core_t *core, int64_t now) {
  core->timer_at = -1; /* it fired; finish() arms the next one */
  for (int i = 0; i < NT; i++) {
    ctrans_t *t = &core->t[i];
    if (t->st == T_FREE || t->deadline < 0 || t->deadline > now) continue;
    drop(core, t,
         t->st == T_WELCOMED ? "no frame from the server for 2.5 heartbeats" : "connect timeout",
         now);
  }
  if (core->reconnect_at >= 0 && core->reconnect_at <= now) {
    core->reconnect_at = -1;
    if (core->need_token && !fetch_token(core, "expired", now)) {
      core->reconnect_at = core->refresh_at; /* the token callback's backoff */
      core->refresh_at = -1;
      set_state(core, CVG_STATE_WAITING, "no new token yet; next try in %lld ms",
                (long long)(core->reconnect_at - now));
    } else {
      core->need_token = 0;
      if (live_count(core) == 0) open_transport(core, pick_url(core, core->last_url), NULL, 0, now);
    }
  }
  if (core->refresh_at >= 0 && core->refresh_at <= now && !core->need_token) {
    core->refresh_at = -1;
    if (fetch_token(core, "refresh", now)) send_refresh(core); /* else: tried again later */
  }
  for (size_t i = 0; i < core->nunsub_due; i++) { /* unsubscribes refused with a hint */
    struct unsub_due_s *u = &core->unsub_due[i];
    if (u->retry_at >= 0 && u->retry_at <= now) {
      u->retry_at = -1;
      send_unsubscribe(core, u->t, u->conv);
    }
  }
  for (size_t i = 0; i < core->nsubs && core->active >= 0; i++) { /* refused subscribes */
    csub_t *s = &core->subs[i];
    if (s->sub_retry_at >= 0 && s->sub_retry_at <= now && !s->ended) send_subscribe(core, s);
  }
  for (size_t i = 0; i < core->nsubs; i++) { /* syncs refused with a hint */
    csub_t *s = &core->subs[i];
    if (s->retry_at >= 0 && s->retry_at <= now && !s->ended) request_sync(core, s, now);
  }
  for (psend_t *p = core->sends; p && core->active >= 0; p = p->next) /* sends refused so */
    if (p->retry_at >= 0 && p->retry_at <= now) transmit(core, p, &core->t[core->active]);
  if (core->migrate_at >= 0 && core->migrate_at <= now) {
    core->migrate_at = -1;
    if (core->active >= 0 && live_count(core) == 1) {
      const char *u = core->migrate_url;
      open_transport(core, u ? -1 : pick_url(core, core->last_url), u, 1, now);
    }
  }
  finish(core);
}

void cvg_core_stop(cvg_core_t *core, int64_t now) {
  if (core->state == CVG_STATE_CLOSED) return;
  for (int i = 0; i < NT; i++)
    if (core->t[i].st != T_FREE) {
      push_close(core, core->t[i].id, 1000, "client closing");
      core->t[i].st = T_FREE;
    }
  if (core->offline_since >= 0) core->st.offline_ms += now - core->offline_since;
  core->offline_since = -1;
  core->active = -1;
  core->reconnect_at = core->migrate_at = -1;
  core->st.node[0] = '\0';
  set_state(core, CVG_STATE_CLOSED, "closed by the application");
  fail_sends(core, "closed");
  finish(core);
}

const char *cvg_core_client_id(const cvg_core_t *core) { return core->client_id; }

int cvg_core_subscribe(cvg_core_t *core, const char *conv, int64_t watermark, const char *epoch,
                       int64_t now) {
  if (core->state == CVG_STATE_FAILED || core->state == CVG_STATE_CLOSED) return CVG_ESTATE;
  if (!util_id_valid(conv) || watermark < CVG_WATERMARK_NONE ||
      (epoch && epoch[0] && (strlen(epoch) > CVG_EPOCH_MAX || !util_id_valid(epoch))))
    return CVG_EINVAL;
  csub_t *s = find_sub(core, conv);
  if (s && !s->ended) return 0;
  if (!s) {
    if (core->nsubs == MAX_SUBS) return CVG_EBUSY;
    if (core->nsubs == core->subs_cap) {
      csub_t *v = realloc(core->subs, core->subs_cap * 2 * sizeof *v);
      if (!v) return CVG_ENOMEM;
      core->subs = v;
      core->subs_cap *= 2;
    }
    char *c = strdup(conv);
    if (!c) return CVG_ENOMEM;
    s = &core->subs[core->nsubs++];
    memset(s, 0, sizeof *s);
    s->conv = c;
  }
  s->ended = 0; /* a subscription the node had ended, asked for again */
  s->wm = watermark;
  snprintf(s->epoch, sizeof s->epoch, "%s", epoch ? epoch : "");
  s->left_epoch[0] = '\0';
  s->retry_at = s->sub_retry_at = -1;
  s->sync_pending = 0;
  s->live = 0;
  memset(s->in_hello, 0, sizeof s->in_hello); /* a hello on its way does not carry it */
  for (int k = 0; k < NT; k++) s->hello_retry_at[k] = -1;
  if (core->active >= 0) send_subscribe(core, s);
  finish(core);
  (void)now;
  return 0;
}

int cvg_core_unsubscribe(cvg_core_t *core, const char *conv, int64_t now) {
  csub_t *s = conv ? find_sub(core, conv) : NULL;
  if (!s) return CVG_ENOENT;
  /* on the welcomed connection, and on one whose hello (which carried it)
   * is not answered yet: the node takes it after that hello */
  for (int i = 0; i < NT; i++) {
    ctrans_t *t = &core->t[i];
    if (!(i == core->active || (t->st == T_HELLO && s->in_hello[i]))) continue;
    send_unsubscribe(core, t->id, conv);
    unsub_due_add(core, conv, t->id);
  }
  remove_sub(core, s);
  finish(core);
  (void)now;
  return 0;
}

int cvg_core_set_token(cvg_core_t *core, const char *token, int64_t now) {
  if (core->state == CVG_STATE_FAILED || core->state == CVG_STATE_CLOSED) return CVG_ESTATE;
  if (!token || !token[0]) return CVG_EINVAL;
  char *t = strdup(token);
  if (!t) return CVG_ENOMEM;
  free(core->token);
  core->token = t;
  core->opt.token = t;
  core->need_token = 0;
  send_refresh(core);
  finish(core);
  (void)now;
  return 0;
}

int cvg_core_send(cvg_core_t *core, const char *conv, const char *id, const char *body,
                  cvg_sent_cb cb, void *ud, int64_t now) {
  if (core->state == CVG_STATE_CLOSED || core->state == CVG_STATE_FAILED) return CVG_ESTATE;
  if (!util_id_valid(conv) || (id && !util_id_valid(id)) || !body) return CVG_EINVAL;
  if (core->nsends >= core->opt.max_pending_sends) return CVG_EBUSY;
  json_t *b = json_loads(body, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
  if (!b) return CVG_EINVAL;
  psend_t *p = calloc(1, sizeof *p);
  if (!p || !(p->conv = strdup(conv))) {
    free(p);
    json_decref(b);
    return CVG_ENOMEM;
  }
  if (id)
    snprintf(p->id, sizeof p->id, "%s", id);
  else
    make_uuid(core, p->id);
  p->frame = send_frame(p, b);
  json_decref(b);
  p->frame_len = p->frame ? strlen(p->frame) : 0;
  if (!p->frame || p->frame_len > core->opt.max_message_bytes) {
    int err = p->frame ? CVG_E2BIG : CVG_ENOMEM;
    free(p->frame);
    free(p->conv);
    free(p);
    return err;
  }
  p->cb = cb;
  p->ud = ud;
  p->retry_at = -1;
  *core->sends_tail = p;
  core->sends_tail = &p->next;
  core->nsends++;
  if (core->active >= 0) transmit(core, p, &core->t[core->active]);
  finish(core);
  return 0;
}

int cvg_core_next_action(cvg_core_t *core, cvg_action_t *out) {
  free(core->taken);
  core->taken = NULL;
  if (core->qpos == core->qlen) {
    core->qpos = core->qlen = 0;
    return 0;
  }
  qact_t *q = &core->q[core->qpos++];
  *out = q->a;
  core->taken = q->s;
  return 1;
}

void cvg_core_stats(const cvg_core_t *core, int64_t now, cvg_stats_t *out) {
  *out = core->st;
  out->state = core->state;
  if (core->offline_since >= 0 && now > core->offline_since)
    out->offline_ms += now - core->offline_since;
}

int64_t cvg_core_watermark(const cvg_core_t *core, const char *conv) {
  csub_t *s = conv ? find_sub((cvg_core_t *)core, conv) : NULL;
  return s ? s->wm : CVG_EINVAL;
}

const char *cvg_core_epoch(const cvg_core_t *core, const char *conv) {
  csub_t *s = conv ? find_sub((cvg_core_t *)core, conv) : NULL;
  return s ? s->epoch : NULL;
}
