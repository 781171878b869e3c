/* Unit tests for the client SDK's sans-I/O core (client/client_core.c):
 * scripted server frames, a fake clock, seeded random sources, no sockets.
 * Each test plays the transport: it takes the core's actions (open, send,
 * close, timer) and answers with events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "converger/client.h"

/* ---- a fake transport and application ---------------------------------------------- */

#define MAX_ACTS 512
#define MAX_GOT  4096

typedef struct {
  cvg_action_type_t type;
  uint32_t t;
  char url[256];
  char data[2048];
  int code;
  int64_t at;
} act_t;

typedef struct {
  cvg_core_t *core;
  int64_t now;
  int64_t timer_at;
  act_t acts[MAX_ACTS]; /* every action since the last clear_acts */
  int nacts;
  int64_t got[MAX_GOT]; /* seqs delivered to on_message */
  int ngot;
  cvg_state_t state;
  int nstates;
  int64_t sent_seq;
  char sent_err[64];
  char sent_id[130];
  int nsent;
  char last_error[64];
  int nunsubs; /* on_unsubscribed calls, and the last conv */
  char unsub_conv[64];
  int token_calls; /* token callback calls, the last `why`, what it answers (NULL: fails) */
  char token_why[16];
  const char *token_next;
  int nresets; /* on_reset calls, and the arguments of the last one */
  int64_t reset_old, reset_head;
  char reset_old_epoch[64], reset_epoch[64], reset_conv[64];
  int npresence, presence_join; /* on_presence calls, and the last one's arguments */
  char presence_conv[64], presence_user[64], presence_client[64];
  int nsignals; /* on_signal calls, and the last one's arguments */
  int64_t signal_ts;
  char signal_conv[64], signal_sender[64], signal_body[256];
} h_t;

static void on_presence(void *ud, const char *conv, int join, const char *user,
                        const char *client) {
  h_t *h = ud;
  h->npresence++;
  h->presence_join = join;
  snprintf(h->presence_conv, sizeof h->presence_conv, "%s", conv);
  snprintf(h->presence_user, sizeof h->presence_user, "%s", user);
  snprintf(h->presence_client, sizeof h->presence_client, "%s", client);
}

static void on_signal(void *ud, const char *conv, const char *sender, int64_t ts_ms,
                      const char *body) {
  h_t *h = ud;
  h->nsignals++;
  h->signal_ts = ts_ms;
  snprintf(h->signal_conv, sizeof h->signal_conv, "%s", conv);
  snprintf(h->signal_sender, sizeof h->signal_sender, "%s", sender);
  snprintf(h->signal_body, sizeof h->signal_body, "%s", body);
}

static void on_reset(void *ud, const char *conv, int64_t old_watermark, const char *old_epoch,
                     int64_t head, const char *epoch) {
  h_t *h = ud;
  h->nresets++;
  h->reset_old = old_watermark;
  h->reset_head = head;
  snprintf(h->reset_conv, sizeof h->reset_conv, "%s", conv);
  snprintf(h->reset_old_epoch, sizeof h->reset_old_epoch, "%s", old_epoch);
  snprintf(h->reset_epoch, sizeof h->reset_epoch, "%s", epoch);
}

static void on_unsubscribed(void *ud, const char *conv) {
  h_t *h = ud;
  h->nunsubs++;
  snprintf(h->unsub_conv, sizeof h->unsub_conv, "%s", conv);
}

static int token_cb(void *ud, const char *why, char *out, size_t cap) {
  h_t *h = ud;
  h->token_calls++;
  snprintf(h->token_why, sizeof h->token_why, "%s", why);
  if (!h->token_next) return -1;
  snprintf(out, cap, "%s", h->token_next);
  return 0;
}

static void on_message(void *ud, const cvg_message_t *m) {
  h_t *h = ud;
  assert_true(h->ngot < MAX_GOT);
  h->got[h->ngot++] = m->seq;
  assert_non_null(strstr(m->frame, "\"type\":\"msg\""));
}

static void on_state(void *ud, cvg_state_t s, const char *detail) {
  h_t *h = ud;
  h->state = s;
  h->nstates++;
  assert_non_null(detail);
}

static void on_error(void *ud, const char *code, const char *message, const char *conv) {
  h_t *h = ud;
  snprintf(h->last_error, sizeof h->last_error, "%s", code);
}

static void on_sent(void *ud, const char *conv, const char *id, int64_t seq, const char *error) {
  h_t *h = ud;
  h->nsent++;
  h->sent_seq = seq;
  snprintf(h->sent_err, sizeof h->sent_err, "%s", error ? error : "");
  snprintf(h->sent_id, sizeof h->sent_id, "%s", id);
}

/* Take every pending action into h->acts. */
static void take(h_t *h) {
  cvg_action_t a;
  while (cvg_core_next_action(h->core, &a)) {
    if (a.type == CVG_ACT_TIMER) h->timer_at = a.at_ms;
    assert_true(h->nacts < MAX_ACTS);
    act_t *x = &h->acts[h->nacts++];
    memset(x, 0, sizeof *x);
    x->type = a.type;
    x->t = a.transport;
    x->code = a.code;
    x->at = a.at_ms;
    if (a.url) snprintf(x->url, sizeof x->url, "%s", a.url);
    if (a.data) {
      assert_int_equal(strlen(a.data), a.len);
      snprintf(x->data, sizeof x->data, "%s", a.data);
    }
  }
}

static void clear_acts(h_t *h) { h->nacts = 0; }

/* The last action of `type` (on transport `t`, 0: any) since clear_acts. */
static act_t *last(h_t *h, cvg_action_type_t type, uint32_t t) {
  for (int i = h->nacts - 1; i >= 0; i--)
    if (h->acts[i].type == type && (t == 0 || h->acts[i].t == t)) return &h->acts[i];
  return NULL;
}

static int count(h_t *h, cvg_action_type_t type) {
  int n = 0;
  for (int i = 0; i < h->nacts; i++) n += h->acts[i].type == type;
  return n;
}

static const char *const URLS3[] = {"ws://a:1/v1/ws", "ws://b:2/v1/ws", "ws://c:3/v1/ws"};

/* Options beyond make()'s: the reconnect policy, ignore_hints, backoff base. */
typedef struct {
  cvg_reconnect_t reconnect;
  int ignore_hints;
  int64_t base_ms;
  const char *const *epochs;
  int token_cb;            /* 1: the token callback */
  int ephemeral;           /* 1: on_presence and on_signal */
  const char *const *urls; /* NULL: URLS3 */
  uint64_t seed;           /* 0: 42 */
} more_t;

static void make_more(h_t *h, const cvg_sub_t *subs, size_t nsubs, size_t nurls,
                      cvg_backoff_strategy_t strategy, const more_t *more) {
  memset(h, 0, sizeof *h);
  h->timer_at = -1;
  cvg_options_t o;
  cvg_options_init(&o);
  o.urls = more && more->urls ? more->urls : URLS3;
  o.nurls = nurls;
  o.token = "tok";
  o.subs = subs;
  o.nsubs = nsubs;
  o.backoff = strategy;
  o.seed = more && more->seed ? more->seed : 42;
  o.cb.on_message = on_message;
  o.cb.on_state = on_state;
  o.cb.on_error = on_error;
  o.cb.on_reset = on_reset;
  o.cb.on_unsubscribed = on_unsubscribed;
  o.userdata = h;
  if (more) {
    o.reconnect = more->reconnect;
    o.ignore_hints = more->ignore_hints;
    o.backoff_base_ms = more->base_ms;
    o.epochs = more->epochs;
    if (more->token_cb) o.token_cb = token_cb;
    if (more->ephemeral) {
      o.on_presence = on_presence;
      o.on_signal = on_signal;
    }
  }
  char err[200];
  assert_int_equal(cvg_core_new(&o, &h->core, err, sizeof err), 0);
}

static void make(h_t *h, const cvg_sub_t *subs, size_t nsubs, size_t nurls,
                 cvg_backoff_strategy_t strategy) {
  make_more(h, subs, nsubs, nurls, strategy, NULL);
}

static void text(h_t *h, uint32_t t, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  cvg_core_text(h->core, t, buf, strlen(buf), h->now);
  take(h);
}

static void msg(h_t *h, uint32_t t, const char *conv, int64_t seq) {
  text(h, t,
       "{\"type\":\"msg\",\"conv\":\"%s\",\"seq\":%lld,\"id\":\"m%lld\",\"sender\":\"u\","
       "\"ts\":\"2026-11-29T00:00:00.000Z\",\"body\":{\"n\":%lld}}",
       conv, (long long)seq, (long long)seq, (long long)seq);
}

/* A msg frame with an epoch, as the node sends them. */
static void msg_in(h_t *h, uint32_t t, const char *conv, int64_t seq, const char *epoch) {
  text(h, t,
       "{\"type\":\"msg\",\"conv\":\"%s\",\"seq\":%lld,\"epoch\":\"%s\",\"id\":\"m%lld\","
       "\"sender\":\"u\",\"ts\":\"2026-11-29T00:00:00.000Z\",\"body\":{\"n\":%lld}}",
       conv, (long long)seq, epoch, (long long)seq, (long long)seq);
}

/* Start, open the first transport and welcome it with `head` for "c1".
 * Returns the transport id. */
/* Start and open the first transport (its hello is the last send).
 * Returns the transport id. */
static uint32_t open_first(h_t *h) {
  cvg_core_start(h->core, h->now);
  take(h);
  act_t *o = last(h, CVG_ACT_OPEN, 0);
  assert_non_null(o);
  uint32_t t = o->t;
  cvg_core_opened(h->core, t, h->now);
  take(h);
  assert_non_null(last(h, CVG_ACT_SEND, t));
  return t;
}

static uint32_t connect_first(h_t *h, int64_t head) {
  uint32_t t = open_first(h);
  text(h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n-%u\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":%lld,\"presence\":false}]}",
       t, (long long)head);
  assert_int_equal(h->state, CVG_STATE_CONNECTED);
  return t;
}

/* Fire the timer at the time it asks for. */
static void fire(h_t *h) {
  assert_true(h->timer_at >= 0);
  h->now = h->timer_at;
  cvg_core_timer(h->core, h->now);
  take(h);
}

static void destroy(h_t *h) { cvg_core_free(h->core); }

/* `data` is the hello `want` (JSON ending in "}") with the core's clientId
 * last. */
static void assert_hello(h_t *h, const char *data, const char *want) {
  char full[4096];
  snprintf(full, sizeof full, "%.*s,\"clientId\":\"%s\"}", (int)strlen(want) - 1, want,
           cvg_core_client_id(h->core));
  assert_string_equal(data, full);
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_constructor_errors(void **state) {
  cvg_options_t o;
  cvg_sub_t subs[2] = {{"c1", 0}, {"c1", 0}};
  const char *bad_urls[] = {"http://a/v1/ws", "wss://", "ws://", "ws://:80/x", "wss://a:0/x", NULL};
  char err[200];
  cvg_core_t *core;
  for (int i = 0; bad_urls[i]; i++) {
    cvg_options_init(&o);
    const char *u[] = {bad_urls[i]};
    o.urls = u;
    o.nurls = 1;
    o.token = "t";
    o.subs = subs;
    o.nsubs = 1;
    err[0] = '\0';
    assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
    assert_null(core);
    assert_non_null(strstr(err, "URL"));
  }
  const char *good[] = {"ws://127.0.0.1:8080/v1/ws", "wss://gw.example/v1/ws"}; /* wss: TLS */
  cvg_options_init(&o);
  o.urls = good;
  o.nurls = 1;
  o.subs = subs;
  o.nsubs = 1;
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL); /* no token */
  assert_non_null(strstr(err, "token"));
  o.token = "t";
  o.nsubs = 2; /* c1 twice */
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  assert_non_null(strstr(err, "twice"));
  o.nsubs = 101; /* over the node's default max_subs */
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  o.nsubs = 0; /* protocol 1.1: none, subscribed later */
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), 0);
  cvg_core_free(core);
  cvg_sub_t bad_conv = {"has space", 0};
  o.subs = &bad_conv;
  o.nsubs = 1;
  assert_int_equal(cvg_core_new(&o, &core, NULL, 0), CVG_EINVAL);
  cvg_sub_t neg = {"c1", -5};
  o.subs = &neg;
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  o.subs = subs;
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), 0);
  cvg_core_free(core);
  o.nurls = 2; /* ws:// and wss:// in one list: a client on wss never moves to ws */
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  assert_non_null(strstr(err, "mix ws:// and wss://"));
  const char *tls2[] = {"wss://a.example/v1/ws", "wss://b.example:8443/v1/ws"};
  o.urls = tls2; /* a wss:// URL is a URL like the others */
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), 0);
  cvg_core_free(core);
  /* the scheme in any case (RFC 3986 section 3.1): WSS:// is wss, and a
   * mix with ws:// (in any case) is refused as the lowercase one is */
  const char *upper[] = {"WSS://a.example/v1/ws", "Wss://b.example:8443/v1/ws"};
  o.urls = upper;
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), 0);
  cvg_core_free(core);
  const char *mixes[][2] = {{"WSS://a.example/v1/ws", "ws://b.example/v1/ws"},
                            {"wss://a.example/v1/ws", "WS://b.example/v1/ws"}};
  for (size_t i = 0; i < 2; i++) {
    o.urls = mixes[i];
    err[0] = '\0';
    assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
    assert_non_null(strstr(err, "mix ws:// and wss://"));
  }
  const char *https[] = {"HTTPS://a.example/v1/ws"}; /* not a WebSocket URL, in any case */
  o.urls = https;
  o.nurls = 1;
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  assert_non_null(strstr(err, "must start with ws:// or wss://"));
}

static void test_hello_carries_watermarks_and_delivers_in_order(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 5}, {"c2", CVG_WATERMARK_NONE}};
  make(&h, subs, 2, 1, CVG_BACKOFF_DECORRELATED);
  cvg_core_start(h.core, 0);
  take(&h);
  act_t *o = last(&h, CVG_ACT_OPEN, 0);
  assert_string_equal(o->url, URLS3[0]);
  uint32_t t = o->t;
  assert_int_equal(h.timer_at, 15000); /* the connect timeout */
  cvg_core_opened(h.core, t, 0);
  take(&h);
  assert_hello(&h, last(&h, CVG_ACT_SEND, t)->data,
               "{\"type\":\"hello\",\"token\":\"tok\",\"subs\":[{\"conv\":\"c1\",\"watermark\""
               ":5},{\"conv\":\"c2\",\"watermark\":null}]}");
  h.now = 40;
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"9\",\"node\":\"n1\",\"heartbeatMs\":0,\"subs\":["
       "{\"conv\":\"c1\",\"head\":8,\"presence\":false},{\"conv\":\"c2\",\"head\":42,"
       "\"presence\":false}]}");
  assert_int_equal(h.timer_at, -1); /* welcomed, no heartbeat: nothing to wait for */
  for (int64_t s = 6; s <= 8; s++) msg(&h, t, "c1", s);
  msg(&h, t, "c1", 7);  /* a duplicate */
  msg(&h, t, "c2", 43); /* started live at the head 42 */
  assert_int_equal(h.ngot, 4);
  assert_int_equal(h.got[0], 6);
  assert_int_equal(h.got[2], 8);
  assert_int_equal(h.got[3], 43);
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 8);
  assert_int_equal(cvg_core_watermark(h.core, "c2"), 43);
  assert_int_equal(cvg_core_watermark(h.core, "nope"), CVG_EINVAL);
  cvg_stats_t st;
  cvg_core_stats(h.core, 100, &st);
  assert_int_equal(st.attempts, 1);
  assert_int_equal(st.welcomes, 1);
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(st.delivered, 4);
  assert_int_equal(st.offline_ms, 40);
  assert_string_equal(st.node, "n1");
  assert_int_equal(st.state, CVG_STATE_CONNECTED);
  destroy(&h);
}

static void test_gap_sends_one_sync_and_replay_fills_it(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 5}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 5);
  clear_acts(&h);
  msg(&h, t, "c1", 8); /* 6 and 7 are missing */
  msg(&h, t, "c1", 9);
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":5}");
  assert_int_equal(h.ngot, 0);
  for (int64_t s = 6; s <= 9; s++) msg(&h, t, "c1", s); /* the replay */
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":9}");
  msg(&h, t, "c1", 9); /* the live copy of 9, after the replay */
  msg(&h, t, "c1", 10);
  assert_int_equal(h.ngot, 5);
  for (int i = 0; i < 5; i++) assert_int_equal(h.got[i], 6 + i);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.gaps, 1);
  assert_int_equal(st.gaps_filled, 1);
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  destroy(&h);
}

static void test_reconnect_waits_backoff_and_avoids_failed_url(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  cvg_core_start(h.core, 0);
  take(&h);
  char failed[256];
  for (int i = 0; i < 60; i++) {
    act_t *o = last(&h, CVG_ACT_OPEN, 0);
    assert_non_null(o);
    snprintf(failed, sizeof failed, "%s", o->url);
    uint32_t t = o->t;
    clear_acts(&h);
    cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "connect: connection refused", 27, h.now);
    take(&h);
    assert_int_equal(h.state, CVG_STATE_WAITING);
    assert_null(last(&h, CVG_ACT_OPEN, 0));
    int64_t delay = h.timer_at - h.now;
    assert_true(delay >= 250 && delay <= 10000);
    cvg_core_timer(h.core, h.timer_at - 1); /* early: nothing */
    take(&h);
    assert_null(last(&h, CVG_ACT_OPEN, 0));
    fire(&h);
    o = last(&h, CVG_ACT_OPEN, 0);
    assert_non_null(o);
    assert_string_not_equal(o->url, failed);
  }
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.attempts, 61);
  assert_int_equal(st.offline_ms, h.now);
  destroy(&h);
}

static void test_hint_is_a_floor_and_welcome_resets(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_EXPONENTIAL);
  uint32_t t = connect_first(&h, 0);
  /* unavailable with a hint, then 1013 with a larger one: the larger wins */
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"busy\",\"retryAfterMs\":5000}");
  assert_string_equal(h.last_error, "unavailable");
  cvg_core_closed(h.core, t, 1013, "{\"retryAfterMs\":7000}", 21, h.now);
  take(&h);
  assert_int_equal(h.timer_at - h.now, 7000);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.unavailable, 1); /* one refusal, counted once */
  /* exponential without hints: 500, 1000, 2000 (the first, 250, was under the hint) */
  int64_t want[] = {500, 1000, 2000};
  for (int i = 0; i < 3; i++) {
    fire(&h);
    uint32_t n = last(&h, CVG_ACT_OPEN, 0)->t;
    /* 1012 with a reason that is not JSON: no hint */
    cvg_core_closed(h.core, n, 1012, "restarting", 10, h.now);
    take(&h);
    assert_int_equal(h.timer_at - h.now, want[i]);
  }
  fire(&h);
  t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, h.now);
  text(&h, t, "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"subs\":[]}");
  cvg_core_closed(h.core, t, 1001, "", 0, h.now);
  take(&h);
  assert_int_equal(h.timer_at - h.now, 250); /* reset by the welcome */
  /* the cap: 10 s */
  for (int i = 0; i < 10; i++) {
    fire(&h);
    cvg_core_closed(h.core, last(&h, CVG_ACT_OPEN, 0)->t, CVG_CLOSE_ABORT, "", 0, h.now);
    take(&h);
    assert_true(h.timer_at - h.now <= 10000);
  }
  assert_int_equal(h.timer_at - h.now, 10000);
  destroy(&h);
}

static void test_unacknowledged_sends_resent_with_same_id(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 2, CVG_BACKOFF_FULL);
  uint32_t t = connect_first(&h, 0);
  clear_acts(&h);
  assert_int_equal(cvg_core_send(h.core, "c1", NULL, "{\"text\":\"hi\"}", on_sent, &h, h.now), 0);
  take(&h);
  act_t *s = last(&h, CVG_ACT_SEND, t);
  assert_non_null(s);
  char first[2048];
  snprintf(first, sizeof first, "%s", s->data);
  assert_non_null(strstr(first, "\"type\":\"send\""));
  assert_non_null(strstr(first, "\"body\":{\"text\":\"hi\"}"));
  /* a second send with an explicit id */
  assert_int_equal(cvg_core_send(h.core, "c1", "mine-1", "[1,2]", on_sent, &h, h.now), 0);
  take(&h);
  /* the connection dies before any `sent` */
  cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "", 0, h.now);
  take(&h);
  /* sent while offline: queued */
  assert_int_equal(cvg_core_send(h.core, "c1", "mine-2", "3", on_sent, &h, h.now), 0);
  take(&h);
  fire(&h);
  uint32_t n = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, n, h.now);
  take(&h);
  clear_acts(&h);
  text(&h, n, "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"subs\":[]}");
  assert_int_equal(count(&h, CVG_ACT_SEND), 3);
  assert_string_equal(h.acts[0].data, first); /* same frame, same id, first */
  assert_non_null(strstr(h.acts[1].data, "\"id\":\"mine-1\""));
  assert_non_null(strstr(h.acts[2].data, "\"id\":\"mine-2\""));
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.resent, 2);
  text(&h, n, "{\"type\":\"sent\",\"conv\":\"c1\",\"id\":\"mine-1\",\"seq\":7}");
  assert_int_equal(h.nsent, 1);
  assert_int_equal(h.sent_seq, 7);
  assert_string_equal(h.sent_id, "mine-1");
  assert_string_equal(h.sent_err, "");
  text(&h, n, "{\"type\":\"sent\",\"conv\":\"c1\",\"id\":\"mine-1\",\"seq\":7}"); /* again */
  assert_int_equal(h.nsent, 1);
  /* a send refused for good */
  text(&h, n,
       "{\"type\":\"error\",\"code\":\"forbidden\",\"message\":\"no\",\"conv\":\"c1\","
       "\"details\":{\"id\":\"mine-2\"}}");
  assert_int_equal(h.nsent, 2);
  assert_string_equal(h.sent_err, "forbidden");
  assert_int_equal(h.sent_seq, 0);
  /* bad sends are refused at once, without a callback */
  assert_int_equal(cvg_core_send(h.core, "c1", NULL, "{not json", on_sent, &h, h.now), CVG_EINVAL);
  assert_int_equal(cvg_core_send(h.core, "bad conv", NULL, "1", on_sent, &h, h.now), CVG_EINVAL);
  assert_int_equal(cvg_core_send(h.core, "c1", "bad id", "1", on_sent, &h, h.now), CVG_EINVAL);
  /* stop: the one still pending completes with "closed" */
  cvg_core_stop(h.core, h.now);
  take(&h);
  assert_int_equal(h.nsent, 3);
  assert_string_equal(h.sent_err, "closed");
  assert_int_equal(cvg_core_send(h.core, "c1", NULL, "1", on_sent, &h, h.now), CVG_ESTATE);
  assert_int_equal(h.state, CVG_STATE_CLOSED);
  assert_non_null(last(&h, CVG_ACT_CLOSE, n));
  destroy(&h);
}

static void test_drain_is_make_before_break(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  for (int64_t s = 1; s <= 3; s++) msg(&h, old, "c1", s);
  clear_acts(&h);
  h.now = 1000;
  text(&h, old,
       "{\"type\":\"drain\",\"afterMs\":3000,\"reconnectTo\":\"ws://next:9/v1/ws\","
       "\"deadlineMs\":30000}");
  assert_int_equal(h.timer_at, 4000);
  assert_null(last(&h, CVG_ACT_OPEN, 0));
  cvg_core_timer(h.core, 3999);
  take(&h);
  assert_null(last(&h, CVG_ACT_OPEN, 0));
  fire(&h); /* at afterMs */
  act_t *o = last(&h, CVG_ACT_OPEN, 0);
  assert_non_null(o);
  assert_int_equal(h.now, 4000);
  assert_string_equal(o->url, "ws://next:9/v1/ws");
  assert_int_equal(h.state, CVG_STATE_MIGRATING);
  uint32_t nt = o->t;
  msg(&h, old, "c1", 4); /* the old one still delivers */
  cvg_core_opened(h.core, nt, h.now);
  take(&h);
  assert_non_null(strstr(last(&h, CVG_ACT_SEND, nt)->data, "\"watermark\":4"));
  msg(&h, old, "c1", 5);                   /* after the new hello */
  assert_null(last(&h, CVG_ACT_CLOSE, 0)); /* not before the new welcome */
  text(&h, nt,
       "{\"type\":\"welcome\",\"session\":\"3\",\"node\":\"n-new\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":5,\"presence\":false}]}");
  act_t *c = last(&h, CVG_ACT_CLOSE, 0);
  assert_non_null(c);
  assert_int_equal(c->t, old);
  assert_int_equal(c->code, 1000);
  msg(&h, nt, "c1", 5);  /* the new connection's replay from 4: a duplicate */
  msg(&h, old, "c1", 6); /* a late frame of the closed connection: ignored */
  msg(&h, nt, "c1", 6);
  assert_int_equal(h.ngot, 6);
  for (int i = 0; i < 6; i++) assert_int_equal(h.got[i], i + 1);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.migrations, 1);
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(st.offline_ms, 0);
  assert_string_equal(st.node, "n-new");
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  destroy(&h);
}

/* A shed's frame, then a drain's with a shorter window: the move comes
 * forward to the earlier time; a later frame never pushes it back. */
static void test_second_drain_frame_only_brings_the_move_forward(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  clear_acts(&h);
  h.now = 1000;
  text(&h, old,
       "{\"type\":\"drain\",\"afterMs\":500000,\"reconnectTo\":null,\"deadlineMs\":600000}");
  assert_int_equal(h.timer_at, 501000);
  h.now = 2000;
  text(&h, old,
       "{\"type\":\"drain\",\"afterMs\":3000,\"reconnectTo\":\"ws://next:9/v1/ws\","
       "\"deadlineMs\":32000}");
  assert_int_equal(h.timer_at, 5000);
  h.now = 3000;
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":9000,\"reconnectTo\":null,\"deadlineMs\":11000}");
  assert_int_equal(h.timer_at, 5000);
  fire(&h);
  act_t *o = last(&h, CVG_ACT_OPEN, 0);
  assert_non_null(o);
  assert_int_equal(h.now, 5000);
  assert_string_equal(o->url, "ws://next:9/v1/ws");
  destroy(&h);
}

static int url_index(const char *const *urls, const char *url) {
  for (int u = 0; u < 3; u++)
    if (strcmp(url, urls[u]) == 0) return u;
  return -1;
}

/* Move transport `old` by a drain naming `to` (NULL: null), make-before-
 * break: returns the new transport, welcomed; its URL in *url. */
static uint32_t move_by_drain(h_t *h, uint32_t old, const char *to, char *url, size_t cap) {
  clear_acts(h);
  if (to)
    text(h, old, "{\"type\":\"drain\",\"afterMs\":10,\"reconnectTo\":\"%s\",\"deadlineMs\":30000}",
         to);
  else
    text(h, old, "{\"type\":\"drain\",\"afterMs\":10,\"reconnectTo\":null,\"deadlineMs\":30000}");
  fire(h);
  act_t *o = last(h, CVG_ACT_OPEN, 0);
  assert_non_null(o);
  snprintf(url, cap, "%s", o->url);
  uint32_t nt = o->t;
  cvg_core_opened(h->core, nt, h->now);
  take(h);
  text(h, nt,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n-%u\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":false}]}",
       nt);
  assert_int_equal(last(h, CVG_ACT_CLOSE, 0)->t, old);
  return nt;
}

/* A client on wss:// never moves to ws://: a drain's ws:// reconnectTo is
 * not followed (the application hears downgrade_refused) and the move
 * goes to one of its own (wss) URLs; wss:// is followed. A ws:// client
 * may move to wss://, and from that wss connection not back to ws. */
static void test_drain_never_moves_wss_to_ws(void **state) {
  static const char *const tls3[] = {"wss://a:1/v1/ws", "wss://b:2/v1/ws", "wss://c:3/v1/ws"};
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  more_t m = {.urls = tls3};
  make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &m);
  uint32_t t = connect_first(&h, 0);
  char url[256];
  t = move_by_drain(&h, t, "ws://plain:9/v1/ws", url, sizeof url);
  assert_true(url_index(tls3, url) >= 0); /* a configured wss URL, not the ws one */
  assert_string_equal(h.last_error, "downgrade_refused");
  h.last_error[0] = '\0';
  t = move_by_drain(&h, t, "wss://other:9/v1/ws", url, sizeof url);
  assert_string_equal(url, "wss://other:9/v1/ws");
  assert_string_equal(h.last_error, "");
  destroy(&h);
  /* ws -> wss is fine; from that wss connection, not back to ws */
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  t = connect_first(&h, 0);
  t = move_by_drain(&h, t, "wss://secure:9/v1/ws", url, sizeof url);
  assert_string_equal(url, "wss://secure:9/v1/ws");
  assert_string_equal(h.last_error, "");
  t = move_by_drain(&h, t, "ws://plain:9/v1/ws", url, sizeof url);
  assert_string_equal(h.last_error, "downgrade_refused");
  assert_true(url_index(URLS3, url) >= 0); /* its own list's */
  destroy(&h);
  /* the scheme in any case: a WSS:// connection is TLS, refuses ws:// and
   * WS://, and follows WSS:// */
  static const char *const upper3[] = {"WSS://a:1/v1/ws", "Wss://b:2/v1/ws", "wSS://c:3/v1/ws"};
  m.urls = upper3;
  make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &m);
  t = connect_first(&h, 0);
  t = move_by_drain(&h, t, "ws://plain:9/v1/ws", url, sizeof url);
  assert_true(url_index(upper3, url) >= 0);
  assert_string_equal(h.last_error, "downgrade_refused");
  h.last_error[0] = '\0';
  t = move_by_drain(&h, t, "WS://plain:9/v1/ws", url, sizeof url);
  assert_true(url_index(upper3, url) >= 0);
  assert_string_equal(h.last_error, "downgrade_refused");
  h.last_error[0] = '\0';
  t = move_by_drain(&h, t, "WSS://other:9/v1/ws", url, sizeof url);
  assert_string_equal(url, "WSS://other:9/v1/ws");
  assert_string_equal(h.last_error, "");
  destroy(&h);
}

/* After a move, the move's target is the URL the client is on: the
 * reconnect after its loss goes on from its place in the list (with
 * CVG_RECONNECT_NEXT the entry after it), not from the node it left; a
 * target not in the list keeps the place of the connection it left. */
static void test_reconnect_after_a_move_goes_on_from_its_target(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  more_t next = {.reconnect = CVG_RECONNECT_NEXT};
  make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &next);
  uint32_t t = connect_first(&h, 0);
  int k = url_index(URLS3, last(&h, CVG_ACT_OPEN, 0)->url);
  char url[256];
  for (int round = 0; round < 6; round++) {
    int target = (k + 1) % 3; /* a listed peer */
    t = move_by_drain(&h, t, URLS3[target], url, sizeof url);
    assert_string_equal(url, URLS3[target]);
    if (round % 2 == 1) { /* and a move to a URL not in the list, on from there */
      t = move_by_drain(&h, t, "ws://elsewhere:9/v1/ws", url, sizeof url);
      assert_string_equal(url, "ws://elsewhere:9/v1/ws");
    }
    clear_acts(&h);
    cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "killed", 6, h.now); /* the new node dies */
    take(&h);
    fire(&h);
    act_t *o = last(&h, CVG_ACT_OPEN, 0);
    assert_string_equal(o->url, URLS3[(target + 1) % 3]);
    k = (target + 1) % 3;
    t = o->t;
    cvg_core_opened(h.core, t, h.now);
    take(&h);
    text(&h, t,
         "{\"type\":\"welcome\",\"session\":\"4\",\"node\":\"n\",\"heartbeatMs\":0,"
         "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":false}]}");
  }
  destroy(&h);
  /* the default policy: never back to the dead target first */
  for (uint64_t seed = 1; seed <= 20; seed++) {
    more_t m = {.seed = seed};
    make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &m);
    t = connect_first(&h, 0);
    k = url_index(URLS3, last(&h, CVG_ACT_OPEN, 0)->url);
    t = move_by_drain(&h, t, URLS3[(k + 1 + (int)(seed % 2)) % 3], url, sizeof url);
    clear_acts(&h);
    cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "killed", 6, h.now);
    take(&h);
    fire(&h);
    assert_string_not_equal(last(&h, CVG_ACT_OPEN, 0)->url, url);
    destroy(&h);
  }
}

/* A move refused by the new node is tried again after the backoff (the
 * hint a floor) while that is before the drain's deadline, on a random
 * other node, and the retry still moves make-before-break. */
static void test_failed_migration_is_retried_before_the_deadline(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  act_t *first = last(&h, CVG_ACT_OPEN, 0);
  char old_url[256];
  snprintf(old_url, sizeof old_url, "%s", first->url);
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":10000}");
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  clear_acts(&h);
  int64_t failed_at = h.now;
  cvg_core_closed(h.core, nt, 1013, "{\"retryAfterMs\":500}", 20, h.now);
  take(&h);
  assert_null(last(&h, CVG_ACT_OPEN, 0)); /* not at once */
  assert_null(last(&h, CVG_ACT_CLOSE, 0));
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  assert_true(h.timer_at >= failed_at + 500);
  assert_true(h.timer_at < failed_at + 10000);
  fire(&h);
  act_t *again = last(&h, CVG_ACT_OPEN, 0);
  assert_non_null(again);
  assert_string_not_equal(again->url, old_url); /* not the draining node */
  assert_int_equal(h.state, CVG_STATE_MIGRATING);
  uint32_t nt2 = again->t;
  cvg_core_opened(h.core, nt2, h.now);
  text(&h, nt2,
       "{\"type\":\"welcome\",\"session\":\"4\",\"node\":\"n-other\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":false}]}");
  act_t *c = last(&h, CVG_ACT_CLOSE, 0);
  assert_non_null(c);
  assert_int_equal(c->t, old);
  assert_int_equal(c->code, 1000);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.migrations, 1);
  assert_int_equal(st.offline_ms, 0);
  destroy(&h);
}

/* When the backoff (or the hint) would end after the drain's deadline, the
 * client does not try again and waits for the node's 1012. */
static void test_failed_migration_past_the_deadline_is_not_retried(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":2000}");
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  clear_acts(&h);
  cvg_core_closed(h.core, nt, 1013, "{\"retryAfterMs\":5000}", 21, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  int64_t until = h.now + 60000;
  while (h.timer_at >= 0 && h.timer_at < until) fire(&h);
  assert_null(last(&h, CVG_ACT_OPEN, 0));
  /* a drain frame with a bad deadlineMs is a bad frame, not a move */
  cvg_stats_t before, after;
  cvg_core_stats(h.core, h.now, &before);
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":\"soon\"}");
  cvg_core_stats(h.core, h.now, &after);
  assert_int_equal(after.bad_frames, before.bad_frames + 1);
  destroy(&h);
}

static void test_failed_migration_keeps_the_old_connection(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 2, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  char old_url[256];
  snprintf(old_url, sizeof old_url, "%s", URLS3[0]);
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":1000}");
  fire(&h);
  act_t *o = last(&h, CVG_ACT_OPEN, 0);
  uint32_t nt = o->t;
  assert_int_not_equal(nt, old);
  clear_acts(&h);
  cvg_core_closed(h.core, nt, 1013, "{\"retryAfterMs\":500}", 20, h.now);
  take(&h);
  assert_null(last(&h, CVG_ACT_CLOSE, 0));
  assert_null(last(&h, CVG_ACT_OPEN, 0));
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  msg(&h, old, "c1", 1); /* still delivering */
  assert_int_equal(h.ngot, 1);
  h.now += 1000;
  cvg_core_closed(h.core, old, 1012, "{\"retryAfterMs\":2000}", 21, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_WAITING);
  assert_true(h.timer_at - h.now >= 2000);
  destroy(&h);
}

static void test_connect_and_idle_timeouts(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  cvg_core_start(h.core, 0);
  take(&h);
  uint32_t t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, 100);
  take(&h);
  fire(&h); /* no welcome within 15 s */
  assert_int_equal(h.now, 15000);
  act_t *c = last(&h, CVG_ACT_CLOSE, t);
  assert_non_null(c);
  assert_int_equal(c->code, CVG_CLOSE_ABORT);
  assert_int_equal(h.state, CVG_STATE_WAITING);
  fire(&h);
  t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, h.now);
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":1000,\"subs\":[]}");
  int64_t welcomed = h.now;
  assert_int_equal(h.timer_at, welcomed + 2500);
  h.now += 2000;
  cvg_core_alive(h.core, t, h.now); /* a ping */
  take(&h);
  assert_int_equal(h.timer_at, h.now + 2500);
  clear_acts(&h);
  fire(&h); /* silence for 2.5 heartbeats */
  assert_int_equal(last(&h, CVG_ACT_CLOSE, t)->code, CVG_CLOSE_ABORT);
  assert_int_equal(h.state, CVG_STATE_WAITING);
  destroy(&h);
}

static void test_bad_frames_are_counted_and_ignored(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  const char *bad[] = {
      "not json",
      "[1,2]",
      "{\"type\":7}",
      "{\"type\":\"surprise\"}",
      "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":\"1\",\"id\":\"x\",\"sender\":\"u\",\"ts\":\"t\","
      "\"body\":1}",
      "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":1}",
      "{\"type\":\"msg\",\"conv\":\"other\",\"seq\":1,\"id\":\"x\",\"sender\":\"u\",\"ts\":\"t\","
      "\"body\":1}",
      "{\"type\":\"welcome\",\"subs\":{}}",
      "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":null}",
      "{\"type\":\"sent\",\"id\":1}",
      "{\"type\":\"error\",\"code\":\"x\",\"retryAfterMs\":\"soon\"}",
      "{\"type\":\"drain\",\"afterMs\":-5}",
      "{\"type\":\"msg\",\"type\":\"msg\"}",
      "",
  };
  size_t n = sizeof bad / sizeof bad[0];
  for (size_t i = 0; i < n; i++) {
    cvg_core_text(h.core, t, bad[i], strlen(bad[i]), h.now);
    take(&h);
  }
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.bad_frames, n);
  assert_int_equal(h.ngot, 0);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  assert_null(last(&h, CVG_ACT_CLOSE, 0));
  msg(&h, t, "c1", 1); /* and it still works */
  assert_int_equal(h.ngot, 1);
  destroy(&h);
}

static void test_unauthorized_stops_for_good(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = open_first(&h);
  assert_int_equal(cvg_core_send(h.core, "c1", NULL, "1", on_sent, &h, 0), 0);
  text(&h, t, "{\"type\":\"error\",\"code\":\"unauthorized\",\"message\":\"token expired\"}");
  clear_acts(&h);
  cvg_core_closed(h.core, t, 1008, "unauthorized", 12, 10);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_FAILED);
  assert_null(last(&h, CVG_ACT_OPEN, 0));
  assert_int_equal(h.timer_at, -1);
  assert_int_equal(h.nsent, 1);
  assert_string_equal(h.sent_err, "unauthorized");
  assert_int_equal(cvg_core_send(h.core, "c1", NULL, "1", on_sent, &h, 0), CVG_ESTATE);
  destroy(&h);
}

static void test_ended_subscription_left_out_of_hello(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}, {"c2", 0}};
  make(&h, subs, 2, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"channel_inactive\",\"message\":\"off\",\"conv\":\"c2\"}");
  assert_string_equal(h.last_error, "channel_inactive");
  cvg_core_closed(h.core, t, 1001, "", 0, h.now);
  take(&h);
  fire(&h);
  t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, h.now);
  take(&h);
  const char *hello = last(&h, CVG_ACT_SEND, t)->data;
  assert_non_null(strstr(hello, "\"c1\""));
  assert_null(strstr(hello, "\"c2\""));
  destroy(&h);
}

static void test_too_large_send_is_failed_not_resent(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  char big[3000];
  memset(big, 'x', sizeof big);
  big[0] = '"';
  big[sizeof big - 2] = '"';
  big[sizeof big - 1] = '\0';
  assert_int_equal(cvg_core_send(h.core, "c1", "small", "1", on_sent, &h, h.now), 0);
  assert_int_equal(cvg_core_send(h.core, "c1", "big", big, on_sent, &h, h.now), 0);
  take(&h);
  /* the server's limit is lower than ours: it closes with 1009 */
  cvg_core_closed(h.core, t, 1009, "message too big", 15, h.now);
  take(&h);
  assert_int_equal(h.nsent, 1);
  assert_string_equal(h.sent_id, "big");
  assert_string_equal(h.sent_err, "too_large");
  fire(&h);
  t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, h.now);
  take(&h);
  clear_acts(&h);
  text(&h, t, "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"subs\":[]}");
  assert_int_equal(count(&h, CVG_ACT_SEND), 1); /* only the small one goes again */
  assert_non_null(strstr(h.acts[0].data, "\"id\":\"small\""));
  /* above max_message_bytes (64 KiB by default): refused at once */
  char *huge = malloc(70000);
  memset(huge, 'y', 70000);
  huge[0] = '"';
  huge[69998] = '"';
  huge[69999] = '\0';
  assert_int_equal(cvg_core_send(h.core, "c1", NULL, huge, on_sent, &h, h.now), CVG_E2BIG);
  free(huge);
  destroy(&h);
}

static void test_replay_unavailable_is_retried_after_its_hint(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 1}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 1);
  clear_acts(&h);
  msg(&h, t, "c1", 3); /* 2 is missing */
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"replay_unavailable\",\"message\":\"busy\",\"conv\":\"c1\","
       "\"retryAfterMs\":2000,\"details\":{\"watermark\":1}}");
  msg(&h, t, "c1", 4); /* another gap: no sync before the hint */
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_int_equal(h.timer_at, h.now + 2000);
  fire(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 2);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":1}");
  /* that hint was for the replay: it is no floor for a reconnect */
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"replay_unavailable\",\"message\":\"busy\",\"conv\":\"c1\","
       "\"retryAfterMs\":9000,\"details\":{\"watermark\":1}}");
  cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "", 0, h.now);
  take(&h);
  assert_true(h.timer_at - h.now <= 750); /* decorrelated, first step: [250, 750] */
  destroy(&h);
}

/* rate_limited (protocol 1.1): a refused send is sent again, the same
 * frame, after the hint, and completes on its `sent`; a refused sync is
 * asked again after its hint. Neither fails. */
static void test_rate_limited_send_and_sync_are_retried(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 1}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 1);
  clear_acts(&h);
  assert_int_equal(cvg_core_send(h.core, "c1", "r-1", "{}", on_sent, &h, h.now), 0);
  take(&h);
  char frame[2048];
  snprintf(frame, sizeof frame, "%s", last(&h, CVG_ACT_SEND, t)->data);
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"rate_limited\",\"message\":\"slow down\",\"conv\":\"c1\","
       "\"retryAfterMs\":300,\"details\":{\"frame\":\"send\",\"id\":\"r-1\"}}");
  assert_int_equal(h.nsent, 0); /* not failed */
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_int_equal(h.timer_at, h.now + 300);
  fire(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 2);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data, frame);
  text(&h, t, "{\"type\":\"sent\",\"conv\":\"c1\",\"id\":\"r-1\",\"seq\":2}");
  assert_int_equal(h.nsent, 1);
  assert_string_equal(h.sent_err, "");
  msg(&h, t, "c1", 2);
  msg(&h, t, "c1", 4); /* a gap: one sync */
  assert_int_equal(count(&h, CVG_ACT_SEND), 3);
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"rate_limited\",\"message\":\"slow down\",\"conv\":\"c1\","
       "\"retryAfterMs\":500,\"details\":{\"frame\":\"subscribe\"}}");
  assert_int_equal(h.timer_at, h.now + 500);
  fire(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 4);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":2}");
  destroy(&h);
}

static void test_no_subscription_left_fails_at_once(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  assert_int_equal(cvg_core_send(h.core, "c1", "s", "1", on_sent, &h, h.now), 0);
  clear_acts(&h);
  h.now += 10;
  text(&h, t, "{\"type\":\"error\",\"code\":\"not_found\",\"message\":\"gone\",\"conv\":\"c1\"}");
  assert_int_equal(h.state, CVG_STATE_FAILED);
  assert_int_equal(last(&h, CVG_ACT_CLOSE, t)->code, 1000);
  assert_string_equal(h.sent_err, "no_subscription");
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now + 500, &st);
  assert_string_equal(st.node, "");
  assert_int_equal(st.offline_ms, 500); /* offline since the failure */
  destroy(&h);
}

static void test_sent_matches_conversation_and_id(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}, {"c2", 0}};
  make(&h, subs, 2, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  assert_int_equal(cvg_core_send(h.core, "c1", "k1", "1", on_sent, &h, h.now), 0);
  assert_int_equal(cvg_core_send(h.core, "c2", "k1", "2", on_sent, &h, h.now), 0);
  text(&h, t, "{\"type\":\"sent\",\"conv\":\"c2\",\"id\":\"k1\",\"seq\":9}");
  assert_int_equal(h.nsent, 1);
  assert_int_equal(h.sent_seq, 9);
  text(&h, t, "{\"type\":\"sent\",\"id\":\"k1\",\"seq\":3}"); /* no conv: a bad frame */
  assert_int_equal(h.nsent, 1);
  text(&h, t, "{\"type\":\"sent\",\"conv\":\"c1\",\"id\":\"k1\",\"seq\":3}");
  assert_int_equal(h.nsent, 2);
  assert_int_equal(h.sent_seq, 3);
  destroy(&h);
}

static void test_refused_token_on_the_new_connection_keeps_the_old(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 2, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":1000}");
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, nt, h.now);
  text(&h, nt, "{\"type\":\"error\",\"code\":\"unauthorized\",\"message\":\"token expired\"}");
  clear_acts(&h);
  cvg_core_closed(h.core, nt, 1008, "unauthorized", 12, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  assert_null(last(&h, CVG_ACT_CLOSE, old));
  msg(&h, old, "c1", 1);
  assert_int_equal(h.ngot, 1);
  destroy(&h);
}

static void test_server_durations_are_capped(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  cvg_core_start(h.core, 0);
  take(&h);
  uint32_t t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, 0);
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":9000000000000000000,"
       "\"subs\":[]}");
  assert_true(h.timer_at > 0 && h.timer_at <= 3 * 3600000);
  text(
      &h, t,
      "{\"type\":\"drain\",\"afterMs\":9000000000000000000,\"reconnectTo\":null,\"deadlineMs\":1}");
  assert_true(h.timer_at > 0 && h.timer_at <= 3 * 3600000);
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"m\","
       "\"retryAfterMs\":9000000000000000000}");
  cvg_core_closed(h.core, t, 1013, "{\"retryAfterMs\":9000000000000000000}", 36, 10);
  take(&h);
  assert_int_equal(h.timer_at, 10 + 3600000); /* the hint, at most one hour */
  destroy(&h);
}

static void test_constructor_rejects_unusable_urls(void **state) {
  const char *bad[] = {"ws://h:99999/v1/ws",
                       "ws://h:abc/v1/ws",
                       "ws://[::1/v1/ws",
                       "ws://u@h:1/v1/ws",
                       "ws://h:/v1/ws",
                       "ws://[]:80/v1/ws",
                       NULL};
  cvg_sub_t sub = {"c1", 0};
  for (int i = 0; bad[i]; i++) {
    cvg_options_t o;
    cvg_options_init(&o);
    const char *u[] = {bad[i]};
    o.urls = u;
    o.nurls = 1;
    o.token = "t";
    o.subs = &sub;
    o.nsubs = 1;
    cvg_core_t *core;
    char err[200] = "";
    assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
    assert_non_null(strstr(err, bad[i]));
  }
  const char *good[] = {"ws://[::1]:8080/v1/ws", "ws://localhost/v1/ws", "ws://10.0.0.1:1", NULL};
  for (int i = 0; good[i]; i++) {
    cvg_options_t o;
    cvg_options_init(&o);
    const char *u[] = {good[i]};
    o.urls = u;
    o.nurls = 1;
    o.token = "t";
    o.subs = &sub;
    o.nsubs = 1;
    cvg_core_t *core;
    assert_int_equal(cvg_core_new(&o, &core, NULL, 0), 0);
    cvg_core_free(core);
  }
}

/* ---- the storm --------------------------------------------------------------------- */

#define CLIENTS  10000
#define REFUSALS 10

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* 10 000 welcomed clients lose their connection at t = 0 and each of their
 * next ten attempts is refused (connection refused, no hint). The times of
 * attempts 4 to 10 of every client are pooled; the result is the largest
 * number of them inside any 100 ms window, as a share of the clients. */
static double storm(cvg_backoff_strategy_t strategy, int64_t cap_ms, int64_t jitter_ms) {
  int64_t *at = malloc(sizeof(int64_t) * CLIENTS * (REFUSALS - 3));
  assert_non_null(at);
  size_t n = 0;
  const char *url[] = {"ws://127.0.0.1:1/v1/ws"};
  cvg_sub_t sub = {"c1", 0};
  h_t *h = malloc(sizeof *h); /* one, cleared for each client: no allocation per client (a
                                large one under ASan, the slowest part of this test there) */
  assert_non_null(h);
  for (int c = 0; c < CLIENTS; c++) {
    cvg_options_t o;
    cvg_options_init(&o);
    o.urls = url;
    o.nurls = 1;
    o.token = "t";
    o.subs = &sub;
    o.nsubs = 1;
    o.backoff = strategy;
    o.backoff_cap_ms = cap_ms;
    o.backoff_jitter_ms = jitter_ms;
    o.seed = 1000003u * (uint64_t)c + 17;
    memset(h, 0, sizeof *h);
    h->timer_at = -1;
    assert_int_equal(cvg_core_new(&o, &h->core, NULL, 0), 0);
    cvg_core_start(h->core, 0);
    take(h);
    uint32_t t = last(h, CVG_ACT_OPEN, 0)->t;
    cvg_core_opened(h->core, t, 0);
    text(h, t, "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"subs\":[]}");
    cvg_core_closed(h->core, t, 1006, "", 0, 0); /* everyone at once */
    take(h);
    for (int attempt = 1; attempt <= REFUSALS; attempt++) {
      clear_acts(h);
      fire(h);
      act_t *op = last(h, CVG_ACT_OPEN, 0);
      assert_non_null(op);
      if (attempt >= 4) at[n++] = h->now;
      cvg_core_closed(h->core, op->t, CVG_CLOSE_ABORT, "connection refused", 18, h->now);
      take(h);
    }
    cvg_core_free(h->core);
  }
  free(h);
  qsort(at, n, sizeof *at, cmp64);
  size_t best = 0;
  for (size_t lo = 0, hi = 0; hi < n; hi++) {
    while (at[hi] - at[lo] >= 100) lo++;
    if (hi - lo + 1 > best) best = hi - lo + 1;
  }
  free(at);
  return (double)best / CLIENTS;
}

static void test_storm_jitter_spreads_and_exponential_synchronises(void **state) {
  const cvg_backoff_strategy_t spread[] = {CVG_BACKOFF_FULL, CVG_BACKOFF_EQUAL,
                                           CVG_BACKOFF_DECORRELATED};
  for (size_t i = 0; i < 3; i++) {
    double share = storm(spread[i], 0, 0); /* defaults: 250 ms, cap 10 s */
    printf("  %-12s busiest 100 ms holds %5.1f%% of the clients\n", cvg_backoff_name(spread[i]),
           100 * share);
    assert_true(share <= 0.15);
  }
  /* The reconnect-storm post-mortem's clients: 250 ms, cap 30 s, 0-100 ms. */
  const cvg_backoff_strategy_t waves[] = {CVG_BACKOFF_EXPONENTIAL, CVG_BACKOFF_ADDITIVE};
  for (size_t i = 0; i < 2; i++) {
    double share = storm(waves[i], 30000, 100);
    printf("  %-12s busiest 100 ms holds %5.1f%% of the clients\n", cvg_backoff_name(waves[i]),
           100 * share);
    assert_true(share > 0.50);
  }
}

/* CVG_RECONNECT_NEXT: every reconnect goes to the URL after the one that
 * failed, wrapping around; the default never retries the failed one and
 * reaches every other. */
static void test_reconnect_next_goes_round_the_list(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  more_t next = {.reconnect = CVG_RECONNECT_NEXT};
  make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &next);
  cvg_core_start(h.core, 0);
  take(&h);
  int prev = -1;
  for (int i = 0; i < 9; i++) {
    act_t *o = last(&h, CVG_ACT_OPEN, 0);
    assert_non_null(o);
    int k = -1;
    for (int u = 0; u < 3; u++)
      if (strcmp(o->url, URLS3[u]) == 0) k = u;
    assert_true(k >= 0);
    if (prev >= 0) assert_int_equal(k, (prev + 1) % 3);
    prev = k;
    uint32_t t = o->t;
    clear_acts(&h);
    cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "refused", 7, h.now);
    take(&h);
    fire(&h);
  }
  destroy(&h);
  /* a welcomed connection lost with 1012: the next URL too */
  make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &next);
  uint32_t t = connect_first(&h, 0);
  int k = -1;
  for (int u = 0; u < 3; u++)
    if (strcmp(last(&h, CVG_ACT_OPEN, 0)->url, URLS3[u]) == 0) k = u;
  clear_acts(&h);
  cvg_core_closed(h.core, t, 1012, "{\"retryAfterMs\":10}", 19, h.now);
  take(&h);
  fire(&h);
  assert_string_equal(last(&h, CVG_ACT_OPEN, 0)->url, URLS3[(k + 1) % 3]);
  destroy(&h);
}

/* ignore_hints: a 1013 with retryAfterMs 5000 (and an `unavailable` frame
 * with 6000, and a 503 given as 1013) does not hold back the next attempt:
 * the backoff alone, below 5000 for a base of 100 ms; by default the hint
 * is the floor. */
static void test_ignore_hints_drops_the_floor(void **state) {
  cvg_sub_t subs[] = {{"c1", 0}};
  for (int ignore = 0; ignore <= 1; ignore++) {
    h_t h;
    more_t m = {.ignore_hints = ignore, .base_ms = 100};
    make_more(&h, subs, 1, 2, CVG_BACKOFF_EQUAL, &m);
    uint32_t t = connect_first(&h, 0);
    text(&h, t,
         "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"busy\","
         "\"retryAfterMs\":6000}");
    cvg_core_closed(h.core, t, 1013, "{\"retryAfterMs\":5000}", 21, h.now);
    take(&h);
    int64_t delay = h.timer_at - h.now;
    if (ignore)
      assert_true(delay >= 50 && delay < 5000);
    else
      assert_int_equal(delay, 6000);
    fire(&h);
    /* an HTTP 503 with Retry-After: 5 reaches the core as this 1013 */
    cvg_core_closed(h.core, last(&h, CVG_ACT_OPEN, 0)->t, 1013, "{\"retryAfterMs\":5000}", 21,
                    h.now);
    take(&h);
    delay = h.timer_at - h.now;
    if (ignore)
      assert_true(delay < 5000);
    else
      assert_true(delay >= 5000);
    cvg_stats_t st;
    cvg_core_stats(h.core, h.now, &st);
    assert_int_equal(st.unavailable, 2); /* counted either way */
    destroy(&h);
  }
}

/* ---- epochs and resets ---------------------------------------------------------------- */

/* The defects issue's repro: a watermark (10) above the node's head (3).
 * The node answers reset; the application hears of it and every new
 * message (4..12) is delivered, none dropped as a duplicate. */
static void test_watermark_above_head_resets_and_delivers_what_follows(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 10}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = open_first(&h);
  assert_hello(&h, last(&h, CVG_ACT_SEND, t)->data,
               "{\"type\":\"hello\",\"token\":\"tok\",\"subs\":[{\"conv\":\"c1\",\"watermark\""
               ":10}]}"); /* no epoch known yet: none sent */
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":0,\"subs\":[{"
       "\"conv\":"
       "\"c1\",\"head\":3,\"epoch\":\"e1\",\"presence\":false,\"reset\":true}]}");
  assert_int_equal(h.nresets, 1);
  assert_string_equal(h.reset_conv, "c1");
  assert_int_equal(h.reset_old, 10);
  assert_string_equal(h.reset_old_epoch, "");
  assert_int_equal(h.reset_head, 3);
  assert_string_equal(h.reset_epoch, "e1");
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 3);
  assert_string_equal(cvg_core_epoch(h.core, "c1"), "e1");
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":3,\"epoch\":\"e1\"}");
  for (int64_t s = 4; s <= 12; s++) msg_in(&h, t, "c1", s, "e1");
  assert_int_equal(h.ngot, 9);
  for (int i = 0; i < 9; i++) assert_int_equal(h.got[i], 4 + i);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.duplicates, 0);
  assert_int_equal(st.resets, 1);
  assert_int_equal(h.nresets, 1);
  /* the next hello resumes in that epoch */
  clear_acts(&h);
  cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "gone", 4, h.now);
  take(&h);
  fire(&h);
  t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, h.now);
  take(&h);
  assert_hello(&h, last(&h, CVG_ACT_SEND, t)->data,
               "{\"type\":\"hello\",\"token\":\"tok\",\"subs\":[{\"conv\":\"c1\",\"watermark\""
               ":12,\"epoch\":\"e1\"}]}");
  assert_null(cvg_core_epoch(h.core, "nope"));
  destroy(&h);
}

/* An epoch the application kept goes in the first hello; a welcome with
 * no reset keeps the watermark and replays. A bad epoch is refused. */
static void test_epoch_option_is_sent_and_checked(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 4}};
  const char *const epochs[] = {"e0"};
  more_t more = {.epochs = epochs};
  make_more(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED, &more);
  uint32_t t = open_first(&h);
  assert_hello(&h, last(&h, CVG_ACT_SEND, t)->data,
               "{\"type\":\"hello\",\"token\":\"tok\",\"subs\":[{\"conv\":\"c1\",\"watermark\""
               ":4,\"epoch\":\"e0\"}]}");
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":0,\"subs\":[{"
       "\"conv\":"
       "\"c1\",\"head\":6,\"epoch\":\"e0\",\"presence\":false}]}");
  msg_in(&h, t, "c1", 5, "e0");
  msg_in(&h, t, "c1", 6, "e0");
  assert_int_equal(h.ngot, 2);
  assert_int_equal(h.nresets, 0);
  destroy(&h);

  cvg_options_t o;
  cvg_options_init(&o);
  const char *u[] = {"ws://127.0.0.1:1/v1/ws"};
  const char *const bad[] = {"has space"};
  o.urls = u, o.nurls = 1, o.token = "t", o.subs = subs, o.nsubs = 1, o.epochs = bad;
  cvg_core_t *core = NULL;
  char err[200];
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  assert_non_null(strstr(err, "epoch"));
}

/* A live msg in another epoch (the store was restored under a connection
 * that stayed): reset to just before it, and it is delivered. */
static void test_msg_in_a_new_epoch_resets(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  msg_in(&h, t, "c1", 1, "e1");
  msg_in(&h, t, "c1", 2, "e1");
  assert_int_equal(h.nresets, 0);
  assert_string_equal(cvg_core_epoch(h.core, "c1"), "e1");
  msg_in(&h, t, "c1", 2, "e2"); /* seq 2 again, but another history */
  assert_int_equal(h.nresets, 1);
  assert_int_equal(h.reset_old, 2);
  assert_string_equal(h.reset_old_epoch, "e1");
  assert_int_equal(h.reset_head, 1);
  assert_string_equal(h.reset_epoch, "e2");
  assert_int_equal(h.ngot, 3);
  assert_int_equal(h.got[2], 2);
  msg_in(&h, t, "c1", 3, "e2");
  assert_int_equal(h.ngot, 4);
  assert_int_equal(h.nresets, 1);
  destroy(&h);
}

/* A sync's answer with reset: the watermark moves to its head. */
static void test_synced_reset(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 5}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 5);
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":5,\"epoch\":\"e1\"}");
  clear_acts(&h);
  msg_in(&h, t, "c1", 8, "e1"); /* a gap: sync from 5 in e1 */
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":5,\"epoch\":\"e1\"}");
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":2,\"epoch\":\"e2\",\"reset\":true}");
  assert_int_equal(h.nresets, 1);
  assert_int_equal(h.reset_old, 5);
  assert_int_equal(h.reset_head, 2);
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 2);
  msg_in(&h, t, "c1", 3, "e2");
  assert_int_equal(h.ngot, 1);
  assert_int_equal(h.got[0], 3);
  /* a bad epoch field makes the frame a bad frame */
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  uint64_t bad = st.bad_frames;
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":3,\"epoch\":7}");
  msg_in(&h, t, "c1", 4, "0123456789abcdef0"); /* longer than CVG_EPOCH_MAX */
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.bad_frames, bad + 2);
  destroy(&h);
}

/* A drain move while the epoch changes: the old connection's messages
 * bring the new epoch after the new connection's hello went out with the
 * old one. The new welcome's reset is then one the client already made:
 * the watermark does not go back and on_reset is not called twice; a late
 * frame of the old epoch is dropped, not taken as another reset. */
static void test_reset_during_a_migration_is_made_once(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  msg_in(&h, old, "c1", 1, "e1");
  msg_in(&h, old, "c1", 2, "e1");
  text(&h, old,
       "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":\"ws://next:9/v1/"
       "ws\",\"deadlineMs\":30000}");
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, nt, h.now);
  take(&h);
  assert_non_null(strstr(last(&h, CVG_ACT_SEND, nt)->data, "\"watermark\":2,\"epoch\":\"e1\""));
  msg_in(&h, old, "c1", 2, "e2"); /* the store was restored and rotated: seq 2 again */
  assert_int_equal(h.nresets, 1);
  msg_in(&h, old, "c1", 3, "e2");
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 3);
  text(&h, nt,
       "{\"type\":\"welcome\",\"session\":\"3\",\"node\":\"n-new\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":3,\"epoch\":\"e2\",\"presence\":false,\"reset\":true}]"
       "}");
  assert_int_equal(h.nresets, 1);
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 3);
  msg_in(&h, old, "c1", 4, "e1"); /* late, from the closed connection and the old history */
  msg_in(&h, nt, "c1", 4, "e2");
  assert_int_equal(h.nresets, 1);
  assert_int_equal(h.ngot, 5); /* 1, 2 (e1); 2, 3, 4 (e2) */
  assert_int_equal(h.got[4], 4);
  destroy(&h);
}

/* A reset in the same epoch (a watermark above the head) keeps taking the
 * epoch's messages: only a reset that left an epoch drops that epoch's. */
static void test_reset_in_the_same_epoch_keeps_its_messages(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 9}};
  const char *const epochs[] = {"e1"};
  more_t more = {.epochs = epochs};
  make_more(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED, &more);
  uint32_t t = open_first(&h);
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":0,\"subs\":[{"
       "\"conv\":"
       "\"c1\",\"head\":3,\"epoch\":\"e1\",\"presence\":false,\"reset\":true}]}");
  assert_int_equal(h.nresets, 1);
  msg_in(&h, t, "c1", 4, "e1");
  assert_int_equal(h.ngot, 1);
  destroy(&h);
}

static void test_bad_reconnect_policy_is_refused(void **state) {
  cvg_sub_t subs[] = {{"c1", 0}};
  cvg_options_t o;
  cvg_options_init(&o);
  assert_int_equal(o.reconnect, CVG_RECONNECT_RANDOM);
  assert_int_equal(o.ignore_hints, 0);
  o.urls = URLS3;
  o.nurls = 3;
  o.token = "t";
  o.subs = subs;
  o.nsubs = 1;
  o.reconnect = (cvg_reconnect_t)7;
  cvg_core_t *core;
  char err[200] = "";
  assert_int_equal(cvg_core_new(&o, &core, err, sizeof err), CVG_EINVAL);
  assert_null(core);
  assert_non_null(strstr(err, "reconnect"));
}

/* ---- protocol 1.1: subscriptions, the token -------------------------------------- */

/* The last send on `t` contains `needle`. */
static int sent_with(h_t *h, uint32_t t, const char *needle) {
  act_t *a = last(h, CVG_ACT_SEND, t);
  return a && strstr(a->data, needle) != NULL;
}

/* subscribe on a live connection: `subscribe` out, `subscribed`, the
 * replay, synced; unsubscribe: nothing of it is delivered after, and its
 * answer is not taken for the node's; the node's own `unsubscribed` is
 * told (on_unsubscribed) and the next hello leaves it out. */
static void test_subscribe_and_unsubscribe_live(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  clear_acts(&h);
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 0, NULL, h.now), 0);
  take(&h);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"subscribe\",\"conv\":\"c2\",\"watermark\":0}");
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 5, NULL, h.now), 0); /* already: nothing */
  take(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_int_equal(cvg_core_subscribe(h.core, "bad id", 0, NULL, h.now), CVG_EINVAL);
  text(&h, t,
       "{\"type\":\"subscribed\",\"conv\":\"c2\",\"head\":2,\"epoch\":\"e2\",\"presence\":false}");
  msg_in(&h, t, "c2", 1, "e2");
  msg_in(&h, t, "c2", 2, "e2");
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c2\",\"head\":2,\"epoch\":\"e2\"}");
  assert_int_equal(h.ngot, 2);
  assert_int_equal(cvg_core_watermark(h.core, "c2"), 2);
  assert_string_equal(cvg_core_epoch(h.core, "c2"), "e2");
  assert_int_equal(cvg_core_unsubscribe(h.core, "c2", h.now), 0);
  take(&h);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"unsubscribe\",\"conv\":\"c2\"}");
  assert_int_equal(cvg_core_unsubscribe(h.core, "c2", h.now), CVG_ENOENT);
  msg_in(&h, t, "c2", 3, "e2"); /* written before the node took the unsubscribe */
  assert_int_equal(h.ngot, 2);
  text(&h, t, "{\"type\":\"unsubscribed\",\"conv\":\"c2\"}"); /* the answer */
  assert_int_equal(h.nunsubs, 0);
  text(&h, t, "{\"type\":\"unsubscribed\",\"conv\":\"c1\"}"); /* the node's own */
  assert_int_equal(h.nunsubs, 1);
  assert_string_equal(h.unsub_conv, "c1");
  assert_int_equal(cvg_core_watermark(h.core, "c1"), CVG_EINVAL);
  assert_int_equal(h.state, CVG_STATE_CONNECTED); /* no subscription left is fine */
  clear_acts(&h);
  cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "", 0, h.now);
  take(&h);
  fire(&h);
  uint32_t n = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, n, h.now);
  take(&h);
  assert_true(sent_with(&h, n, "\"subs\":[]"));
  destroy(&h);
}

/* Issue 31, item 5: an unsubscribe that overtakes its subscribe makes the
 * node answer that subscribe with `error cancelled` (conv), then the
 * unsubscribe with `unsubscribed` (docs/protocol.md 4.6). Neither reaches
 * the application, which asked for the unsubscribe, nor a subscribe of the
 * same conversation made since: that one goes on to its `subscribed` and
 * replay. An operator's unsubscribe of a subscribe under way is the
 * node's: on_error cancelled, then on_unsubscribed. */
static void test_subscribe_cancelled_by_an_unsubscribe(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  h.last_error[0] = '\0';
  clear_acts(&h);
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 0, NULL, h.now), 0);
  assert_int_equal(cvg_core_unsubscribe(h.core, "c2", h.now), 0);
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 0, NULL, h.now), 0); /* at once again */
  take(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 3);
  text(&h, t, "{\"type\":\"error\",\"code\":\"cancelled\",\"message\":\"m\",\"conv\":\"c2\"}");
  text(&h, t, "{\"type\":\"unsubscribed\",\"conv\":\"c2\"}");
  assert_string_equal(h.last_error, ""); /* not the application's: it unsubscribed */
  assert_int_equal(h.nunsubs, 0);
  text(&h, t,
       "{\"type\":\"subscribed\",\"conv\":\"c2\",\"head\":2,\"epoch\":\"e2\",\"presence\":false}");
  msg_in(&h, t, "c2", 1, "e2");
  msg_in(&h, t, "c2", 2, "e2");
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c2\",\"head\":2,\"epoch\":\"e2\"}");
  assert_int_equal(h.ngot, 2);
  assert_int_equal(cvg_core_watermark(h.core, "c2"), 2);
  assert_string_equal(h.last_error, "");

  /* the node's own: an operator's unsubscribe of a subscribe under way */
  assert_int_equal(cvg_core_subscribe(h.core, "c3", 0, NULL, h.now), 0);
  take(&h);
  text(&h, t, "{\"type\":\"error\",\"code\":\"cancelled\",\"message\":\"m\",\"conv\":\"c3\"}");
  assert_string_equal(h.last_error, "cancelled");
  text(&h, t, "{\"type\":\"unsubscribed\",\"conv\":\"c3\"}");
  assert_int_equal(h.nunsubs, 1);
  assert_string_equal(h.unsub_conv, "c3");
  assert_int_equal(cvg_core_watermark(h.core, "c3"), CVG_EINVAL);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  destroy(&h);
}

/* Subscriptions changed while no connection is welcomed go in the next
 * hello; one made while a hello is on its way (not in it) is subscribed
 * once that hello is welcomed, and one removed then is unsubscribed on
 * that connection too. */
static void test_subscribe_across_a_reconnect(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}, {"c9", 0}};
  make(&h, subs, 2, 2, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  msg(&h, t, "c1", 1);
  cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "", 0, h.now);
  take(&h);
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 4, "e2", h.now), 0); /* offline */
  take(&h);
  fire(&h);
  uint32_t n = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, n, h.now);
  take(&h);
  act_t *hello = last(&h, CVG_ACT_SEND, n);
  assert_non_null(strstr(hello->data, "{\"conv\":\"c1\",\"watermark\":1}"));
  assert_non_null(strstr(hello->data, "{\"conv\":\"c2\",\"watermark\":4,\"epoch\":\"e2\"}"));
  clear_acts(&h);
  /* hello sent, no welcome yet */
  assert_int_equal(cvg_core_subscribe(h.core, "c3", CVG_WATERMARK_NONE, NULL, h.now), 0);
  take(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 0); /* not on an unwelcomed connection */
  assert_int_equal(cvg_core_unsubscribe(h.core, "c9", h.now), 0);
  take(&h);
  assert_true(sent_with(&h, n, "{\"type\":\"unsubscribe\",\"conv\":\"c9\"}"));
  clear_acts(&h);
  text(&h, n,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":1},{\"conv\":\"c2\",\"head\":4}]}");
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_string_equal(last(&h, CVG_ACT_SEND, n)->data,
                      "{\"type\":\"subscribe\",\"conv\":\"c3\",\"watermark\":null}");
  text(&h, n, "{\"type\":\"subscribed\",\"conv\":\"c3\",\"head\":7,\"presence\":false}");
  assert_int_equal(cvg_core_watermark(h.core, "c3"), 7); /* from the head */
  text(&h, n, "{\"type\":\"synced\",\"conv\":\"c3\",\"head\":7}");
  msg(&h, n, "c3", 8);
  assert_int_equal(h.got[h.ngot - 1], 8);
  destroy(&h);
}

/* A drain move: the new connection's hello carries the set as it is; a
 * subscribe made between that hello and its welcome goes on the new
 * connection once welcomed; a subscribe refused with rate_limited or
 * unavailable is sent again after its hint, the connection kept. */
static void test_subscribe_during_a_drain_move(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  uint32_t old = connect_first(&h, 0);
  text(&h, old,
       "{\"type\":\"drain\",\"afterMs\":100,\"reconnectTo\":\"ws://next:9/v1/ws\","
       "\"deadlineMs\":30000}");
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, nt, h.now);
  take(&h);
  clear_acts(&h);
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 0, NULL, h.now), 0);
  take(&h);
  assert_true(sent_with(&h, old, "\"type\":\"subscribe\"")); /* the welcomed one, meanwhile */
  text(&h, old, "{\"type\":\"subscribed\",\"conv\":\"c2\",\"head\":0,\"presence\":false}");
  clear_acts(&h);
  text(&h, nt,
       "{\"type\":\"welcome\",\"session\":\"3\",\"node\":\"n-new\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":0}]}");
  assert_true(sent_with(&h, nt, "{\"type\":\"subscribe\",\"conv\":\"c2\",\"watermark\":0}"));
  assert_int_equal(last(&h, CVG_ACT_CLOSE, 0)->t, old);
  h.now += 10;
  text(&h, nt,
       "{\"type\":\"error\",\"code\":\"rate_limited\",\"message\":\"slow\",\"conv\":\"c2\","
       "\"retryAfterMs\":400,\"details\":{\"frame\":\"subscribe\"}}");
  assert_int_equal(h.timer_at, h.now + 400);
  clear_acts(&h);
  fire(&h);
  assert_true(sent_with(&h, nt, "{\"type\":\"subscribe\",\"conv\":\"c2\",\"watermark\":0}"));
  text(&h, nt,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"busy\",\"conv\":\"c2\","
       "\"retryAfterMs\":900}");
  assert_int_equal(h.timer_at, h.now + 900);
  clear_acts(&h);
  fire(&h);
  assert_true(sent_with(&h, nt, "\"type\":\"subscribe\""));
  text(&h, nt, "{\"type\":\"subscribed\",\"conv\":\"c2\",\"head\":1,\"presence\":false}");
  msg(&h, nt, "c2", 1);
  assert_int_equal(h.got[h.ngot - 1], 1);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.rate_limited, 1);
  assert_int_equal(st.unavailable, 0); /* a subscribe's, not the connection's */
  destroy(&h);
}

/* A sharded cluster's node whose shard of a conversation is down
 * (docs/protocol.md 2.3): that hello entry gets `error unavailable` with
 * its conv and a hint, and the welcome lists the others. The connection
 * stays; the refused subscription is not live, stays in the set, and is
 * subscribed again on the same connection after the hint (the first
 * backoff step without one). One refused so after the welcome is too. */
static void test_hello_entry_refused_by_a_shard_is_subscribed_again(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}, {"c2", 3}, {"c3", 0}};
  make(&h, subs, 3, 2, CVG_BACKOFF_DECORRELATED);
  uint32_t t = open_first(&h);
  clear_acts(&h);
  h.now = 100;
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"shard\",\"conv\":\"c2\","
       "\"retryAfterMs\":1500}");
  assert_string_equal(h.last_error, "unavailable");
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":0}]}");
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  h.now = 200; /* an answer after the welcome, without a hint */
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"shard\",\"conv\":\"c3\"}");
  assert_int_equal(count(&h, CVG_ACT_SEND), 0); /* not at once */
  assert_int_equal(h.timer_at, 450);            /* c3: the first backoff step, 250 ms */
  msg(&h, t, "c1", 1);                          /* the others go on */
  assert_int_equal(h.ngot, 1);
  fire(&h);
  assert_true(sent_with(&h, t, "{\"type\":\"subscribe\",\"conv\":\"c3\",\"watermark\":0}"));
  assert_int_equal(h.timer_at, 1600); /* c2: its hint from the error's time */
  clear_acts(&h);
  fire(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_true(sent_with(&h, t, "{\"type\":\"subscribe\",\"conv\":\"c2\",\"watermark\":3}"));
  assert_int_equal(count(&h, CVG_ACT_OPEN) + count(&h, CVG_ACT_CLOSE), 0); /* the same one */
  text(&h, t, "{\"type\":\"subscribed\",\"conv\":\"c2\",\"head\":4,\"presence\":false}");
  msg(&h, t, "c2", 4);
  assert_int_equal(h.got[h.ngot - 1], 4);
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.attempts, 1);
  assert_int_equal(st.unavailable, 0); /* a subscription's, as a subscribe's */
  /* the set kept all three: the next hello carries them */
  cvg_core_closed(h.core, t, 1006, "", 0, h.now);
  take(&h);
  clear_acts(&h);
  fire(&h);
  uint32_t t2 = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t2, h.now);
  take(&h);
  act_t *hello = last(&h, CVG_ACT_SEND, t2);
  assert_non_null(strstr(hello->data, "{\"conv\":\"c1\",\"watermark\":1}"));
  assert_non_null(strstr(hello->data, "{\"conv\":\"c2\",\"watermark\":4}"));
  assert_non_null(strstr(hello->data, "{\"conv\":\"c3\",\"watermark\":0}"));
  destroy(&h);
}

/* A send whose conversation's shard is down (docs/protocol.md 4.3): `error
 * unavailable` with details.id and a hint, and the connection stays. The
 * same frame (same id) goes again on it after the hint, and completes on
 * its `sent`. An older node closes with 1013 after such an answer: then the
 * send goes once on the next connection, not again by the timer. The hint
 * of an answer that kept the connection open is the floor of a reconnect
 * after a later loss, counted from that answer. */
static void test_send_refused_by_a_shard_is_sent_again_on_the_same_connection(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 2, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  assert_int_equal(cvg_core_send(h.core, "c1", "k-1", "{\"n\":1}", on_sent, &h, h.now), 0);
  take(&h);
  char frame[2048];
  snprintf(frame, sizeof frame, "%s", last(&h, CVG_ACT_SEND, t)->data);
  clear_acts(&h);
  h.now = 50;
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"shard\",\"conv\":\"c1\","
       "\"retryAfterMs\":700,\"details\":{\"id\":\"k-1\"}}");
  assert_int_equal(h.nsent, 0); /* not failed */
  assert_int_equal(count(&h, CVG_ACT_SEND), 0);
  assert_int_equal(h.timer_at, 750);
  h.now = 749;
  cvg_core_timer(h.core, h.now); /* early: nothing */
  take(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 0);
  fire(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data, frame);
  assert_int_equal(count(&h, CVG_ACT_OPEN) + count(&h, CVG_ACT_CLOSE), 0);
  text(&h, t, "{\"type\":\"sent\",\"conv\":\"c1\",\"id\":\"k-1\",\"seq\":1}");
  assert_int_equal(h.nsent, 1);
  assert_int_equal(h.sent_seq, 1);
  assert_string_equal(h.sent_err, "");

  /* an older node: the same answer, then close 1013 */
  assert_int_equal(cvg_core_send(h.core, "c1", "k-2", "{\"n\":2}", on_sent, &h, h.now), 0);
  take(&h);
  h.now = 1000;
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"busy\",\"conv\":\"c1\","
       "\"retryAfterMs\":2000,\"details\":{\"id\":\"k-2\"}}");
  cvg_core_closed(h.core, t, 1013, "{\"retryAfterMs\":2000}", 21, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_WAITING);
  assert_true(h.timer_at >= 3000);
  clear_acts(&h);
  fire(&h);
  uint32_t t2 = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t2, h.now);
  take(&h);
  text(&h, t2,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":1}]}");
  int k2 = 0;
  for (int i = 0; i < h.nacts; i++)
    k2 += h.acts[i].type == CVG_ACT_SEND && strstr(h.acts[i].data, "\"id\":\"k-2\"") != NULL;
  assert_int_equal(k2, 1);
  assert_int_equal(h.timer_at, -1); /* no second resend due */
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.unavailable, 2); /* two refusals; the 1013 not counted again */

  /* a refusal with a 4 s hint, the connection lost 1 s later: not before 3 s */
  assert_int_equal(cvg_core_send(h.core, "c1", "k-3", "{\"n\":3}", on_sent, &h, h.now), 0);
  take(&h);
  int64_t refused_at = h.now;
  text(&h, t2,
       "{\"type\":\"error\",\"code\":\"unavailable\",\"message\":\"shard\",\"conv\":\"c1\","
       "\"retryAfterMs\":4000,\"details\":{\"id\":\"k-3\"}}");
  h.now += 1000;
  cvg_core_closed(h.core, t2, 1006, "", 0, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_WAITING);
  assert_true(h.timer_at >= refused_at + 4000);
  destroy(&h);
}

/* An unsubscribe during a drain move. While the new connection's hello
 * (which carried the conversation) waits for its welcome, the unsubscribe
 * goes on both connections; nothing of the conversation is delivered after
 * it (msg, join, signal, from either connection, the new one's replay
 * included), neither answer is taken for the node ending it, and later
 * hellos leave it out. While the new connection is still opening, it goes
 * on the old one only, and the new one's hello leaves it out. */
static void test_unsubscribe_during_a_drain_move(void **state) {
  static const char *const drain =
      "{\"type\":\"drain\",\"afterMs\":100,\"reconnectTo\":\"ws://next:9/v1/ws\","
      "\"deadlineMs\":30000}";
  static const char *const welcome2 =
      "{\"type\":\"welcome\",\"session\":\"%s\",\"node\":\"%s\",\"heartbeatMs\":0,"
      "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":true},"
      "{\"conv\":\"c2\",\"head\":%d,\"presence\":true}]}";
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}, {"c2", 0}};
  more_t m = {.ephemeral = 1};
  make_more(&h, subs, 2, 3, CVG_BACKOFF_DECORRELATED, &m);
  uint32_t old = open_first(&h);
  text(&h, old, welcome2, "1", "n-old", 0);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  msg(&h, old, "c2", 1);
  text(&h, old, drain);
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, nt, h.now);
  take(&h);
  assert_true(sent_with(&h, nt, "{\"conv\":\"c2\",\"watermark\":1}")); /* its hello has c2 */
  clear_acts(&h);
  assert_int_equal(cvg_core_unsubscribe(h.core, "c2", h.now), 0);
  take(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 2);
  assert_true(sent_with(&h, old, "{\"type\":\"unsubscribe\",\"conv\":\"c2\"}"));
  assert_true(sent_with(&h, nt, "{\"type\":\"unsubscribe\",\"conv\":\"c2\"}"));
  assert_int_equal(cvg_core_watermark(h.core, "c2"), CVG_EINVAL);
  /* the old connection, before the node took it */
  msg(&h, old, "c2", 2);
  text(&h, old, "{\"type\":\"join\",\"conv\":\"c2\",\"user\":\"u\",\"client\":\"k\"}");
  text(&h, old,
       "{\"type\":\"signal\",\"conv\":\"c2\",\"sender\":\"u\",\"ts\":5,\"body\":{\"t\":1}}");
  text(&h, old, "{\"type\":\"unsubscribed\",\"conv\":\"c2\"}"); /* the answer to ours */
  /* the new one: its welcome, replay and synced of c2, then the answer */
  text(&h, nt, welcome2, "2", "n-new", 3);
  assert_int_equal(last(&h, CVG_ACT_CLOSE, 0)->t, old);
  assert_int_equal(h.state, CVG_STATE_CONNECTED);
  msg(&h, nt, "c2", 2);
  msg(&h, nt, "c2", 3);
  text(&h, nt, "{\"type\":\"synced\",\"conv\":\"c2\",\"head\":3}");
  text(&h, nt, "{\"type\":\"leave\",\"conv\":\"c2\",\"user\":\"u\",\"client\":\"k\"}");
  text(&h, nt, "{\"type\":\"unsubscribed\",\"conv\":\"c2\"}");
  assert_int_equal(h.ngot, 1); /* c2's seq 1, before the unsubscribe */
  assert_int_equal(h.got[0], 1);
  assert_int_equal(h.npresence, 0);
  assert_int_equal(h.nsignals, 0);
  assert_int_equal(h.nunsubs, 0);
  msg(&h, nt, "c1", 1); /* the rest goes on */
  assert_int_equal(h.ngot, 2);
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 1);
  clear_acts(&h);
  cvg_core_closed(h.core, nt, CVG_CLOSE_ABORT, "", 0, h.now); /* and the next hello */
  take(&h);
  fire(&h);
  uint32_t again = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, again, h.now);
  take(&h);
  assert_true(sent_with(&h, again, "\"subs\":[{\"conv\":\"c1\",\"watermark\":1}]"));
  destroy(&h);

  /* the new connection still opening: no hello has carried c2 on it */
  make_more(&h, subs, 2, 3, CVG_BACKOFF_DECORRELATED, &m);
  old = open_first(&h);
  text(&h, old, welcome2, "1", "n-old", 0);
  text(&h, old, drain);
  fire(&h);
  nt = last(&h, CVG_ACT_OPEN, 0)->t;
  clear_acts(&h);
  assert_int_equal(cvg_core_unsubscribe(h.core, "c2", h.now), 0);
  take(&h);
  assert_int_equal(count(&h, CVG_ACT_SEND), 1);
  assert_true(sent_with(&h, old, "{\"type\":\"unsubscribe\",\"conv\":\"c2\"}"));
  msg(&h, old, "c2", 1);
  cvg_core_opened(h.core, nt, h.now);
  take(&h);
  assert_true(sent_with(&h, nt, "\"subs\":[{\"conv\":\"c1\",\"watermark\":0}]"));
  clear_acts(&h);
  text(&h, nt,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n-new\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":true}]}");
  assert_int_equal(count(&h, CVG_ACT_SEND), 0); /* no subscribe, no unsubscribe on it */
  assert_int_equal(last(&h, CVG_ACT_CLOSE, 0)->t, old);
  msg(&h, nt, "c2", 1); /* a node that sent it anyway: not delivered */
  assert_int_equal(h.ngot, 0);
  assert_int_equal(h.nunsubs, 0);
  destroy(&h);
}

/* join, leave and signal frames reach on_presence and on_signal with their
 * fields; one without its fields is a bad frame; one of a conversation
 * not in the set is dropped. */
static void test_presence_and_signal_reach_their_callbacks(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  more_t m = {.ephemeral = 1};
  make_more(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED, &m);
  uint32_t t = connect_first(&h, 0);
  text(&h, t, "{\"type\":\"join\",\"conv\":\"c1\",\"user\":\"ann\",\"client\":\"tab-1\"}");
  assert_int_equal(h.npresence, 1);
  assert_int_equal(h.presence_join, 1);
  assert_string_equal(h.presence_conv, "c1");
  assert_string_equal(h.presence_user, "ann");
  assert_string_equal(h.presence_client, "tab-1");
  text(&h, t, "{\"type\":\"leave\",\"conv\":\"c1\",\"user\":\"bob\",\"client\":\"s-2\"}");
  assert_int_equal(h.npresence, 2);
  assert_int_equal(h.presence_join, 0);
  assert_string_equal(h.presence_user, "bob");
  assert_string_equal(h.presence_client, "s-2");
  text(&h, t,
       "{\"type\":\"signal\",\"conv\":\"c1\",\"sender\":\"ann\",\"ts\":1764374400123,"
       "\"body\":{\"typing\":true}}");
  assert_int_equal(h.nsignals, 1);
  assert_string_equal(h.signal_conv, "c1");
  assert_string_equal(h.signal_sender, "ann");
  assert_int_equal(h.signal_ts, 1764374400123);
  assert_string_equal(h.signal_body, "{\"typing\":true}");
  cvg_stats_t st;
  cvg_core_stats(h.core, h.now, &st);
  uint64_t bad = st.bad_frames;
  text(&h, t, "{\"type\":\"join\",\"conv\":\"c1\",\"client\":\"tab-1\"}");   /* no user */
  text(&h, t, "{\"type\":\"leave\",\"user\":\"ann\",\"client\":\"tab-1\"}"); /* no conv */
  cvg_core_stats(h.core, h.now, &st);
  assert_int_equal(st.bad_frames, bad + 2);
  text(&h, t, "{\"type\":\"join\",\"conv\":\"c7\",\"user\":\"ann\",\"client\":\"tab-1\"}");
  text(&h, t, "{\"type\":\"signal\",\"conv\":\"c7\",\"sender\":\"ann\",\"ts\":1,\"body\":1}");
  assert_int_equal(h.npresence, 2);
  assert_int_equal(h.nsignals, 1);
  assert_int_equal(h.ngot, 0); /* none of them is a message */
  assert_int_equal(cvg_core_watermark(h.core, "c1"), 0);
  destroy(&h);
}

/* During a drain move, join, leave and signal are told by the connection
 * in use only: the new one's are ignored until its welcome, the old one's
 * after it (so a move does not tell one change twice). */
static void test_presence_and_signal_only_from_the_active_connection(void **state) {
  static const char *const join = "{\"type\":\"join\",\"conv\":\"c1\",\"user\":\"%s\","
                                  "\"client\":\"k\"}";
  static const char *const signal =
      "{\"type\":\"signal\",\"conv\":\"c1\",\"sender\":\"%s\",\"ts\":1,\"body\":null}";
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  more_t m = {.ephemeral = 1};
  make_more(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED, &m);
  uint32_t old = connect_first(&h, 0);
  text(&h, old, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":5000}");
  fire(&h);
  uint32_t nt = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, nt, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_MIGRATING);
  text(&h, nt, join, "from-new"); /* its hello is not answered yet */
  text(&h, nt, signal, "from-new");
  assert_int_equal(h.npresence, 0);
  assert_int_equal(h.nsignals, 0);
  text(&h, old, join, "from-old"); /* the old one is still in use */
  text(&h, old, signal, "from-old");
  assert_int_equal(h.npresence, 1);
  assert_string_equal(h.presence_user, "from-old");
  assert_int_equal(h.nsignals, 1);
  assert_string_equal(h.signal_sender, "from-old");
  text(&h, nt,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n-new\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":0,\"presence\":true}]}");
  assert_int_equal(last(&h, CVG_ACT_CLOSE, 0)->t, old);
  text(&h, old, join, "late-old"); /* closed: its late frames are ignored */
  text(&h, old, signal, "late-old");
  assert_int_equal(h.npresence, 1);
  assert_int_equal(h.nsignals, 1);
  text(&h, nt, join, "now-new");
  text(&h, nt, signal, "now-new");
  assert_int_equal(h.npresence, 2);
  assert_string_equal(h.presence_user, "now-new");
  assert_int_equal(h.nsignals, 2);
  assert_string_equal(h.signal_sender, "now-new");
  destroy(&h);
}

/* The refresh comes at 75..85 % of welcome.expiresInMs (different with
 * another seed), through the token callback; `refreshed` schedules the
 * next; a callback that fails is asked again after 0.5..1 s, then 1..2 s. */
static void test_refresh_at_80_percent_with_jitter(void **state) {
  int64_t at[2];
  for (int k = 0; k < 2; k++) {
    h_t h;
    cvg_sub_t subs[] = {{"c1", 0}};
    more_t m = {.token_cb = 1};
    make_more(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED, &m);
    if (k == 1) { /* another seed: another instant */
      cvg_core_free(h.core);
      cvg_options_t o;
      cvg_options_init(&o);
      o.urls = URLS3, o.nurls = 1, o.token = "tok", o.subs = subs, o.nsubs = 1, o.seed = 7;
      o.token_cb = token_cb, o.userdata = &h, o.cb.on_state = on_state;
      assert_int_equal(cvg_core_new(&o, &h.core, NULL, 0), 0);
    }
    uint32_t t = open_first(&h);
    text(&h, t,
         "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":0,"
         "\"expiresInMs\":100000,\"subs\":[{\"conv\":\"c1\",\"head\":0}]}");
    at[k] = h.timer_at - h.now;
    assert_true(at[k] >= 75000 && at[k] <= 85000);
    if (k == 1) {
      destroy(&h);
      break;
    }
    h.token_next = NULL; /* the callback fails twice */
    clear_acts(&h);
    fire(&h);
    assert_int_equal(h.token_calls, 1);
    assert_string_equal(h.token_why, "refresh");
    assert_int_equal(count(&h, CVG_ACT_SEND), 0);
    assert_true(h.timer_at - h.now >= 500 && h.timer_at - h.now <= 1000);
    fire(&h);
    assert_true(h.timer_at - h.now >= 1000 && h.timer_at - h.now <= 2000);
    h.token_next = "tok-2";
    fire(&h);
    assert_int_equal(h.token_calls, 3);
    assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                        "{\"type\":\"refresh\",\"token\":\"tok-2\"}");
    text(&h, t, "{\"type\":\"refreshed\",\"expiresInMs\":60000}");
    assert_true(h.timer_at - h.now >= 45000 && h.timer_at - h.now <= 51000);
    cvg_stats_t st;
    cvg_core_stats(h.core, h.now, &st);
    assert_int_equal(st.refreshes, 1);
    destroy(&h);
  }
  assert_true(at[0] != at[1]);
}

/* token_expired: the next hello waits for a new token from the callback
 * (asked with "expired", retried after a failure); without a callback the
 * client fails, its sends with "token_expired". */
static void test_token_expired_gets_a_new_token_first(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  more_t m = {.token_cb = 1};
  make_more(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED, &m);
  uint32_t t = connect_first(&h, 0);
  text(&h, t, "{\"type\":\"error\",\"code\":\"token_expired\",\"message\":\"expired\"}");
  cvg_core_closed(h.core, t, 1008, "token_expired", 13, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_WAITING);
  clear_acts(&h);
  fire(&h); /* the reconnect: no token yet */
  assert_int_equal(h.token_calls, 1);
  assert_string_equal(h.token_why, "expired");
  assert_null(last(&h, CVG_ACT_OPEN, 0));
  h.token_next = "fresh";
  fire(&h);
  assert_int_equal(h.token_calls, 2);
  uint32_t n = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, n, h.now);
  take(&h);
  assert_true(sent_with(&h, n, "\"token\":\"fresh\""));
  destroy(&h);

  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED); /* no callback */
  t = connect_first(&h, 0);
  assert_int_equal(cvg_core_send(h.core, "c1", "s1", "1", on_sent, &h, h.now), 0);
  cvg_core_closed(h.core, t, 1008, "token_expired", 13, h.now);
  take(&h);
  assert_int_equal(h.state, CVG_STATE_FAILED);
  assert_string_equal(h.sent_err, "token_expired");
  destroy(&h);
}

/* cvg_core_set_token: a refresh at once on the welcomed connection. */
static void test_set_token_refreshes_now(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  assert_int_equal(cvg_core_set_token(h.core, "", h.now), CVG_EINVAL);
  assert_int_equal(cvg_core_set_token(h.core, "tok-9", h.now), 0);
  take(&h);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"refresh\",\"token\":\"tok-9\"}");
  destroy(&h);
}

/* An unsubscribe refused with rate_limited (it shares the subscribe
 * bucket) is sent again after the hint; its late answer is not taken for
 * the node ending a later subscription of the same conversation. */
static void test_rate_limited_unsubscribe_is_retried(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}, {"c2", 0}};
  make(&h, subs, 2, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  assert_int_equal(cvg_core_unsubscribe(h.core, "c2", h.now), 0);
  take(&h);
  text(&h, t,
       "{\"type\":\"error\",\"code\":\"rate_limited\",\"message\":\"slow\",\"conv\":\"c2\","
       "\"retryAfterMs\":300,\"details\":{\"frame\":\"subscribe\"}}");
  assert_int_equal(h.timer_at, h.now + 300);
  clear_acts(&h);
  fire(&h);
  assert_string_equal(last(&h, CVG_ACT_SEND, t)->data,
                      "{\"type\":\"unsubscribe\",\"conv\":\"c2\"}");
  assert_int_equal(cvg_core_subscribe(h.core, "c2", 0, NULL, h.now), 0); /* again */
  take(&h);
  text(&h, t, "{\"type\":\"unsubscribed\",\"conv\":\"c2\"}"); /* the unsubscribe's answer */
  assert_int_equal(h.nunsubs, 0);
  assert_int_equal(cvg_core_watermark(h.core, "c2"), 0); /* still subscribed */
  destroy(&h);
}

/* A callback that changes the set (a subscribe that grows the array, an
 * unsubscribe of the conversation being handled) is safe. */
static void subscribe_many_on_synced(void *ud, const char *conv, int64_t head) {
  h_t *h = ud;
  char name[32];
  for (int i = 0; i < 20; i++) {
    snprintf(name, sizeof name, "more-%d", i);
    assert_int_equal(cvg_core_subscribe(h->core, name, 0, NULL, h->now), 0);
  }
  assert_int_equal(cvg_core_unsubscribe(h->core, conv, h->now), 0);
}

static void test_callbacks_may_change_the_set(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 1, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  (void)t;
  /* a core whose on_synced changes the set */
  cvg_core_free(h.core);
  cvg_options_t opt;
  cvg_options_init(&opt);
  opt.urls = URLS3, opt.nurls = 1, opt.token = "tok", opt.subs = subs, opt.nsubs = 1, opt.seed = 3;
  opt.cb.on_synced = subscribe_many_on_synced, opt.userdata = &h;
  assert_int_equal(cvg_core_new(&opt, &h.core, NULL, 0), 0);
  t = open_first(&h);
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"1\",\"node\":\"n\",\"heartbeatMs\":0,"
       "\"subs\":[{\"conv\":\"c1\",\"head\":3}]}");
  text(&h, t, "{\"type\":\"synced\",\"conv\":\"c1\",\"head\":5}"); /* behind: would sync */
  assert_int_equal(cvg_core_watermark(h.core, "c1"), CVG_EINVAL);
  assert_int_equal(cvg_core_watermark(h.core, "more-19"), 0);
  destroy(&h);
}

/* One client id in every hello: given in the options, or made at
 * creation; the same after a reconnect and on a drain move's connection. */
static void test_client_id_is_kept_across_connections(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 3, CVG_BACKOFF_DECORRELATED);
  const char *id = cvg_core_client_id(h.core);
  assert_int_equal(strlen(id), 36);
  char want[64];
  snprintf(want, sizeof want, "\"clientId\":\"%s\"", id);
  uint32_t t = connect_first(&h, 0);
  cvg_core_closed(h.core, t, CVG_CLOSE_ABORT, "", 0, h.now);
  take(&h);
  fire(&h);
  uint32_t n = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, n, h.now);
  take(&h);
  assert_true(sent_with(&h, n, want));
  text(&h, n,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"heartbeatMs\":0,\"subs\":[]}");
  text(&h, n, "{\"type\":\"drain\",\"afterMs\":0,\"reconnectTo\":null,\"deadlineMs\":5000}");
  fire(&h);
  uint32_t m = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, m, h.now);
  take(&h);
  assert_true(sent_with(&h, m, want));
  destroy(&h);
  cvg_options_t o;
  cvg_options_init(&o);
  o.urls = URLS3, o.nurls = 1, o.token = "t", o.client_id = "tab 1";
  cvg_core_t *core;
  assert_int_equal(cvg_core_new(&o, &core, NULL, 0), CVG_EINVAL);
  o.client_id = "tab-1";
  assert_int_equal(cvg_core_new(&o, &core, NULL, 0), 0);
  assert_string_equal(cvg_core_client_id(core), "tab-1");
  cvg_core_free(core);
}

/* An operator's disconnect with a hint (POST /admin/users/{user}/disconnect:
 * any code, reason {"retryAfterMs": n, "reason": ...}) is a floor of the
 * next attempt; a reason that is not JSON is no hint. */
static void test_close_reason_hint_of_any_code(void **state) {
  h_t h;
  cvg_sub_t subs[] = {{"c1", 0}};
  make(&h, subs, 1, 2, CVG_BACKOFF_DECORRELATED);
  uint32_t t = connect_first(&h, 0);
  const char *r = "{\"retryAfterMs\":4000,\"reason\":\"moderated\"}";
  cvg_core_closed(h.core, t, 4001, r, strlen(r), h.now);
  take(&h);
  assert_true(h.timer_at - h.now >= 4000);
  fire(&h);
  t = last(&h, CVG_ACT_OPEN, 0)->t;
  cvg_core_opened(h.core, t, h.now);
  take(&h);
  text(&h, t,
       "{\"type\":\"welcome\",\"session\":\"2\",\"node\":\"n\",\"heartbeatMs\":0,\"subs\":[]}");
  cvg_core_closed(h.core, t, 1008, "disconnected by the server", 26, h.now);
  take(&h);
  assert_true(h.timer_at - h.now <= 750); /* the backoff's first step only */
  destroy(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constructor_errors),
      cmocka_unit_test(test_hello_carries_watermarks_and_delivers_in_order),
      cmocka_unit_test(test_gap_sends_one_sync_and_replay_fills_it),
      cmocka_unit_test(test_reconnect_waits_backoff_and_avoids_failed_url),
      cmocka_unit_test(test_hint_is_a_floor_and_welcome_resets),
      cmocka_unit_test(test_unacknowledged_sends_resent_with_same_id),
      cmocka_unit_test(test_drain_is_make_before_break),
      cmocka_unit_test(test_drain_never_moves_wss_to_ws),
      cmocka_unit_test(test_reconnect_after_a_move_goes_on_from_its_target),
      cmocka_unit_test(test_second_drain_frame_only_brings_the_move_forward),
      cmocka_unit_test(test_failed_migration_keeps_the_old_connection),
      cmocka_unit_test(test_failed_migration_is_retried_before_the_deadline),
      cmocka_unit_test(test_failed_migration_past_the_deadline_is_not_retried),
      cmocka_unit_test(test_connect_and_idle_timeouts),
      cmocka_unit_test(test_bad_frames_are_counted_and_ignored),
      cmocka_unit_test(test_unauthorized_stops_for_good),
      cmocka_unit_test(test_ended_subscription_left_out_of_hello),
      cmocka_unit_test(test_too_large_send_is_failed_not_resent),
      cmocka_unit_test(test_replay_unavailable_is_retried_after_its_hint),
      cmocka_unit_test(test_rate_limited_send_and_sync_are_retried),
      cmocka_unit_test(test_subscribe_and_unsubscribe_live),
      cmocka_unit_test(test_subscribe_cancelled_by_an_unsubscribe),
      cmocka_unit_test(test_subscribe_across_a_reconnect),
      cmocka_unit_test(test_subscribe_during_a_drain_move),
      cmocka_unit_test(test_hello_entry_refused_by_a_shard_is_subscribed_again),
      cmocka_unit_test(test_send_refused_by_a_shard_is_sent_again_on_the_same_connection),
      cmocka_unit_test(test_unsubscribe_during_a_drain_move),
      cmocka_unit_test(test_presence_and_signal_reach_their_callbacks),
      cmocka_unit_test(test_presence_and_signal_only_from_the_active_connection),
      cmocka_unit_test(test_refresh_at_80_percent_with_jitter),
      cmocka_unit_test(test_token_expired_gets_a_new_token_first),
      cmocka_unit_test(test_set_token_refreshes_now),
      cmocka_unit_test(test_rate_limited_unsubscribe_is_retried),
      cmocka_unit_test(test_callbacks_may_change_the_set),
      cmocka_unit_test(test_client_id_is_kept_across_connections),
      cmocka_unit_test(test_close_reason_hint_of_any_code),
      cmocka_unit_test(test_no_subscription_left_fails_at_once),
      cmocka_unit_test(test_sent_matches_conversation_and_id),
      cmocka_unit_test(test_refused_token_on_the_new_connection_keeps_the_old),
      cmocka_unit_test(test_server_durations_are_capped),
      cmocka_unit_test(test_constructor_rejects_unusable_urls),
      cmocka_unit_test(test_storm_jitter_spreads_and_exponential_synchronises),
      cmocka_unit_test(test_reconnect_next_goes_round_the_list),
      cmocka_unit_test(test_ignore_hints_drops_the_floor),
      cmocka_unit_test(test_bad_reconnect_policy_is_refused),
      cmocka_unit_test(test_watermark_above_head_resets_and_delivers_what_follows),
      cmocka_unit_test(test_epoch_option_is_sent_and_checked),
      cmocka_unit_test(test_msg_in_a_new_epoch_resets),
      cmocka_unit_test(test_synced_reset),
      cmocka_unit_test(test_reset_during_a_migration_is_made_once),
      cmocka_unit_test(test_reset_in_the_same_epoch_keeps_its_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
