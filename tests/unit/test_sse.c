/* Unit tests of Server-Sent Events (proto/sse.c, net/ws.c's stream
 * writer; docs/protocol.md section 12) against the in-process fixture
 * (fixture.h: the real transport, sessions, bus and store; an inline pool
 * and a fake clock), the stream read byte by byte as a browser would:
 *  - session_sse_watermark: the ids the node writes and hand-written ones,
 *    several conversations, epochs, and every malformed form refused;
 *  - session_sse_id and the events that carry it: the welcome, each synced,
 *    every msg, a drain and a close, so that a stream that got no msg
 *    resumes where it began (the reconnect after a drain or a restart
 *    gets what was committed meanwhile, once and in order);
 *  - the writer: the 200 head and the first retry:, event/id/retry/data
 *    fields, a body of several lines as several data: lines, the heartbeat
 *    comment, events without id (signals);
 *  - the refusals before the stream begins as HTTP statuses with a JSON
 *    body: 401, 403, 404, 409, 429 and 503 with Retry-After;
 *  - streams waiting for their moments in a drain: one whose reader leaves,
 *    or that a stop during the drain closes, is gone at once (nws, nconns,
 *    the drain's stop), from anywhere in the drain's heap of moments; one
 *    told by a shed and again by the drain gets one drain event. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util.h"
#include "core/errors.h"
#include "fixture.h"
#include "net/ws.h"
#include "proto/frames.h"

/* ---- session_sse_watermark ---------------------------------------------------- */

static void expect_mark(const char *lei, const char *conv, int64_t watermark, const char *epoch) {
  int64_t w = 12345;
  char ep[STORE_EPOCH_MAX + 1] = "junk";
  if (session_sse_watermark(lei, conv, &w, ep) != 0) fail_msg("refused: \"%s\"", lei);
  if (w != watermark || strcmp(ep, epoch) != 0)
    fail_msg("\"%s\" for %s: %lld \"%s\", not %lld \"%s\"", lei, conv, (long long)w, ep,
             (long long)watermark, epoch);
}

/* What the node writes and what a person may write by hand: absent or
 * empty (live at the head), one or several conversations, with or without
 * their epoch, a conversation the id does not name (live at its head). */
static void test_watermark_good(void **state) {
  expect_mark(NULL, "c1", FRAME_WATERMARK_NONE, "");
  expect_mark("", "c1", FRAME_WATERMARK_NONE, "");
  expect_mark("c1 5", "c1", 5, "");
  expect_mark("c1 0", "c1", 0, "");
  expect_mark("c1 5 9c4e01af", "c1", 5, "9c4e01af");
  expect_mark("c1 5 9c4e01af", "c2", FRAME_WATERMARK_NONE, "");
  const char *two = "support-42 17 51d0b7e2,support-43 4 0a1b2c3d";
  expect_mark(two, "support-42", 17, "51d0b7e2");
  expect_mark(two, "support-43", 4, "0a1b2c3d");
  expect_mark(two, "support-44", FRAME_WATERMARK_NONE, "");
  expect_mark("a 1 e1,b 2,c:3 3 e3", "b", 2, "");
  expect_mark("a 1 e1,b 2,c:3 3 e3", "c:3", 3, "e3");
  expect_mark("a 007", "a", 7, "");
  expect_mark("a 9223372036854775807", "a", INT64_MAX, ""); /* the largest seq */
  char big[STORE_ID_MAX + 32];
  memset(big, 'x', STORE_ID_MAX);
  snprintf(big + STORE_ID_MAX, sizeof big - STORE_ID_MAX, " 3 0123456789abcdef");
  char conv[STORE_ID_MAX + 1];
  memset(conv, 'x', STORE_ID_MAX);
  conv[STORE_ID_MAX] = '\0';
  expect_mark(big, conv, 3, "0123456789abcdef"); /* the longest id and epoch */
}

/* Anything else is refused whole (the request's 400), also when the bad
 * entry names another conversation, and so is an id that names a
 * conversation twice (which of the two would it mean?). */
static void test_watermark_bad(void **state) {
  static const char *const bad[] = {
      "garbage",
      "c1",
      "c1 ",
      " c1 5",
      "c1  5",
      "c1 -1",
      "c1 +5",
      "c1 5abc",
      "c1 5 ",
      "c1 5 ep och",
      "c1 5 ep!",
      "c1 5,",
      ",c1 5",
      "c1 5,,c2 1",
      "c1 5;c2 1",
      "c1\t5",
      "bad id 5",
      "c1 x",
      "c1 0x10",
      "c1 5 e,c2 z",
      "c2 1,c1 oops",
      "c1 9223372036854775808",
      "c1 99999999999999999999",
      "c1 5 0123456789abcdef0" /* an epoch of 17 */,
      "c1 5,c1 6" /* a conversation named twice */,
      "c1 5 e1,c1 5 e1",
      "c2 1,c1 5,c2 1" /* twice, but not the one asked for */,
      "c1 5,c2 1,c3 2,c4 3,c1 9",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t w = 12345;
    char ep[STORE_EPOCH_MAX + 1] = "junk";
    if (session_sse_watermark(bad[i], "c1", &w, ep) != -1) fail_msg("accepted: \"%s\"", bad[i]);
  }
  char big[STORE_ID_MAX + 8];
  memset(big, 'x', STORE_ID_MAX + 1); /* an id of 129 */
  snprintf(big + STORE_ID_MAX + 1, sizeof big - STORE_ID_MAX - 1, " 3");
  int64_t w;
  char ep[STORE_EPOCH_MAX + 1];
  assert_int_equal(session_sse_watermark(big, "c1", &w, ep), -1);
}

/* ---- a stream as a browser reads it --------------------------------------------- */

typedef struct {
  char event[32];
  char id[1024]; /* "" when the event had no id: field */
  long retry;    /* -1: none */
  int ndata;     /* its data: lines */
  json_t *data;  /* the data lines joined by '\n', parsed; NULL: none */
} sse_event_t;

typedef struct {
  fx_peer_t *p;
  char *buf; /* read, not yet parsed */
  size_t len;
  int status;
  char head[1024];  /* the HTTP head, "\r\n\r\n" included */
  long first_retry; /* the retry: block before the first event */
  int comments;
  char last_id[1024]; /* what EventSource would send as Last-Event-ID */
} sse_t;

static void pull(sse_t *s) {
  char *more = fx_take(s->p);
  size_t n = strlen(more);
  s->buf = realloc(s->buf, s->len + n + 1);
  memcpy(s->buf + s->len, more, n + 1);
  s->len += n;
  free(more);
}

/* GET /v1/sse?`query` with `token` and `last_event_id` (NULL: none); its
 * hello job run; the head read. */
static sse_t *sse_open(fx_t *fx, const char *query, const char *token, const char *last_event_id) {
  char req[4096];
  snprintf(req, sizeof req,
           "GET /v1/sse?%s HTTP/1.1\r\nHost: fx\r\nAuthorization: Bearer %s\r\n%s%s%s\r\n", query,
           token, last_event_id ? "Last-Event-ID: " : "", last_event_id ? last_event_id : "",
           last_event_id ? "\r\n" : "");
  sse_t *s = calloc(1, sizeof *s);
  s->p = fx_connect_raw(fx, req);
  s->first_retry = -1;
  fx_drain_pool(fx);
  pull(s);
  char *end = strstr(s->buf ? s->buf : "", "\r\n\r\n");
  if (!end) fail_msg("no HTTP head: \"%s\"", s->buf ? s->buf : "");
  size_t n = (size_t)(end + 4 - s->buf);
  assert_true(n < sizeof s->head);
  memcpy(s->head, s->buf, n);
  s->head[n] = '\0';
  memmove(s->buf, s->buf + n, s->len - n + 1);
  s->len -= n;
  assert_int_equal(sscanf(s->head, "HTTP/1.1 %d", &s->status), 1);
  return s;
}

static void sse_close(sse_t *s) {
  fx_peer_free(s->p);
  free(s->buf);
  free(s);
}

/* The next event, or 0 when none is complete. Comment blocks are counted
 * and retry-only blocks kept in first_retry, as EventSource handles them. */
static int sse_next(sse_t *s, sse_event_t *ev) {
  for (;;) {
    pull(s);
    char *end = strstr(s->buf, "\n\n");
    if (!end) return 0;
    *end = '\0';
    memset(ev, 0, sizeof *ev);
    ev->retry = -1;
    char data[65536] = "";
    size_t dlen = 0;
    int comment = 0;
    for (char *line = s->buf, *next; line; line = next) {
      next = strchr(line, '\n');
      if (next) *next++ = '\0';
      if (line[0] == ':') {
        comment = 1;
        continue;
      }
      char *v = strstr(line, ": ");
      if (!v) fail_msg("a line without \": \": \"%s\"", line);
      *v = '\0';
      v += 2;
      if (strcmp(line, "event") == 0) {
        snprintf(ev->event, sizeof ev->event, "%s", v);
      } else if (strcmp(line, "id") == 0) {
        assert_true(v[0] != '\0'); /* an empty id would make EventSource forget its own */
        snprintf(ev->id, sizeof ev->id, "%s", v);
        snprintf(s->last_id, sizeof s->last_id, "%s", v);
      } else if (strcmp(line, "retry") == 0) {
        ev->retry = strtol(v, NULL, 10);
      } else if (strcmp(line, "data") == 0) {
        dlen += (size_t)snprintf(data + dlen, sizeof data - dlen, "%s%s", ev->ndata ? "\n" : "", v);
        ev->ndata++;
      } else {
        fail_msg("an unknown field \"%s\"", line);
      }
    }
    size_t used = (size_t)(end + 2 - s->buf);
    memmove(s->buf, s->buf + used, s->len - used + 1);
    s->len -= used;
    if (comment && !ev->ndata && !ev->event[0]) {
      s->comments++;
      continue;
    }
    if (!ev->ndata && !ev->event[0]) {
      s->first_retry = ev->retry;
      continue;
    }
    json_error_t err;
    ev->data = json_loads(data, 0, &err);
    if (!ev->data) fail_msg("data is not JSON: \"%s\"", data);
    return 1;
  }
}

static sse_event_t expect_event(sse_t *s, const char *type) {
  sse_event_t ev;
  if (!sse_next(s, &ev)) fail_msg("expected a %s event, got none", type);
  if (strcmp(ev.event, type) != 0) fail_msg("expected a %s event, got %s", type, ev.event);
  const char *t = json_string_value(json_object_get(ev.data, "type"));
  assert_non_null(t);
  assert_string_equal(t, type); /* named by its frame's type */
  return ev;
}

static void expect_no_event(sse_t *s) {
  sse_event_t ev;
  if (sse_next(s, &ev)) fail_msg("expected no event, got %s", ev.event);
}

/* The stream ended: everything read, and the node closed its end. */
static void expect_end(sse_t *s) {
  expect_no_event(s);
  assert_int_equal(s->len, 0);
  assert_true(s->p->closed);
}

static const char *epoch_of(fx_t *fx, const char *conv, char out[STORE_EPOCH_MAX + 1]) {
  store_conv_t info;
  assert_int_equal(store_conv_get(fx->db, conv, &info), 0);
  strcpy(out, info.epoch);
  return out;
}

/* `id` says exactly these "CONV SEQ EPOCH" entries (in any order: the
 * node writes them in no particular one). */
static void expect_id(const char *id, const char *a, const char *b) {
  char want1[600], want2[600];
  snprintf(want1, sizeof want1, "%s%s%s", a, b ? "," : "", b ? b : "");
  snprintf(want2, sizeof want2, "%s%s%s", b ? b : "", b ? "," : "", b ? a : "");
  if (strcmp(id, want1) != 0 && (!b || strcmp(id, want2) != 0))
    fail_msg("id \"%s\", not \"%s\"", id, want1);
}

static void expect_msg(sse_t *s, const char *conv, int64_t seq, const char *id_a,
                       const char *id_b) {
  sse_event_t ev = expect_event(s, "msg");
  assert_string_equal(json_string_value(json_object_get(ev.data, "conv")), conv);
  assert_int_equal(json_integer_value(json_object_get(ev.data, "seq")), seq);
  expect_id(ev.id, id_a, id_b);
  json_decref(ev.data);
}

#define HEAD_200                                                                                   \
  "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"              \
  "X-Accel-Buffering: no\r\nConnection: keep-alive\r\n\r\n"

/* A stream with no Last-Event-ID: the head, the retry: block byte for
 * byte, then the welcome and the synced with the head as their id before
 * any msg; live messages with theirs; a signal without one; the
 * heartbeat as a comment. session_sse_id says the same. */
static void test_stream_from_the_head(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 3);
  char ep[STORE_EPOCH_MAX + 1], at[64];
  epoch_of(&fx, "c1", ep);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s = sse_open(&fx, "conv=c1", tok, NULL);
  assert_string_equal(s->head, HEAD_200);
  assert_memory_equal(s->buf, "retry: 1234\n\nevent: welcome\nid: ", 32);
  snprintf(at, sizeof at, "c1 3 %s", ep);
  sse_event_t ev = expect_event(s, "welcome");
  assert_int_equal(s->first_retry, 1234);
  assert_string_equal(ev.id, at);
  assert_int_equal(ev.ndata, 1);
  json_decref(ev.data);
  ev = expect_event(s, "synced");
  assert_string_equal(ev.id, at);
  assert_int_equal(json_integer_value(json_object_get(ev.data, "head")), 3);
  json_decref(ev.data);
  expect_no_event(s);
  assert_string_equal(session_sse_id(s->p->conn->session), at);

  fx_append(&fx, "c1", 4);
  snprintf(at, sizeof at, "c1 4 %s", ep);
  expect_msg(s, "c1", 4, at, NULL);
  assert_string_equal(session_sse_id(s->p->conn->session), at);
  /* the exact bytes of the next one */
  fx_append(&fx, "c1", 5);
  char *raw = fx_take(s->p);
  char want[512];
  snprintf(want, sizeof want,
           "event: msg\nid: c1 5 %s\ndata: "
           "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":5,\"epoch\":\"%s\",\"id\":\"m-5\",\"sender\":"
           "\"fx\",",
           ep, ep);
  if (strncmp(raw, want, strlen(want)) != 0) fail_msg("\"%s\", not \"%s...\"", raw, want);
  const char *tail = "\"body\":{\"i\":5}}\n\n";
  assert_true(strlen(raw) > strlen(tail));
  assert_string_equal(raw + strlen(raw) - strlen(tail), tail);
  free(raw);

  assert_int_equal(session_signal_deliver(&fx.sessions, "c1", "bot", 1, "{\"typing\":true}"), 1);
  fx_run(&fx);
  ev = expect_event(s, "signal");
  assert_string_equal(ev.id, ""); /* says nothing of where the stream is */
  json_decref(ev.data);
  assert_int_equal(s->comments, 0);
  fx_advance(&fx, (uint64_t)fx.cfg.heartbeat_ms);
  raw = fx_take(s->p);
  assert_string_equal(raw, ": ping\n\n");
  free(raw);
  sse_close(s);
  free(tok);
  fx_free(&fx);
}

/* Last-Event-ID of c1 at 3, none for c2: the welcome's id says c1 at 3
 * and c2 at its head, every replayed msg says both, and each synced too;
 * the last id read back gives both watermarks. */
static void test_resume_two_conversations(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 5);
  fx_conv(&fx, "ch", "c2", 2);
  char e1[STORE_EPOCH_MAX + 1], e2[STORE_EPOCH_MAX + 1], lei[128], a[64], b[64];
  epoch_of(&fx, "c1", e1);
  epoch_of(&fx, "c2", e2);
  char *tok = fx_token(&fx, "ann", "*");
  snprintf(lei, sizeof lei, "c1 3 %s", e1);
  sse_t *s = sse_open(&fx, "conv=c1&conv=c2", tok, lei);
  assert_int_equal(s->status, 200);
  snprintf(b, sizeof b, "c2 2 %s", e2);
  sse_event_t ev = expect_event(s, "welcome");
  expect_id(ev.id, lei, b);
  assert_int_equal(json_array_size(json_object_get(ev.data, "subs")), 2);
  json_decref(ev.data);
  int synced = 0;
  for (int64_t seq = 4; seq <= 5;) {
    if (!sse_next(s, &ev)) fail_msg("the replay stopped at %lld", (long long)seq);
    snprintf(a, sizeof a, "c1 %lld %s", (long long)(strcmp(ev.event, "msg") == 0 ? seq : seq - 1),
             e1);
    expect_id(ev.id, a, b);
    if (strcmp(ev.event, "synced") == 0) { /* c2's, whenever it comes */
      assert_string_equal(json_string_value(json_object_get(ev.data, "conv")), "c2");
      synced++;
    } else {
      assert_string_equal(ev.event, "msg");
      assert_int_equal(json_integer_value(json_object_get(ev.data, "seq")), seq++);
    }
    json_decref(ev.data);
  }
  snprintf(a, sizeof a, "c1 5 %s", e1);
  while (synced < 2) {
    ev = expect_event(s, "synced");
    expect_id(ev.id, a, b);
    synced++;
    json_decref(ev.data);
  }
  expect_no_event(s);
  int64_t w;
  char ep[STORE_EPOCH_MAX + 1];
  assert_int_equal(session_sse_watermark(s->last_id, "c1", &w, ep), 0);
  assert_int_equal(w, 5);
  assert_string_equal(ep, e1);
  assert_int_equal(session_sse_watermark(s->last_id, "c2", &w, ep), 0);
  assert_int_equal(w, 2);
  assert_string_equal(ep, e2);
  fx_append(&fx, "c2", 3);
  snprintf(b, sizeof b, "c2 3 %s", e2);
  expect_msg(s, "c2", 3, a, b);
  sse_close(s);
  free(tok);
  fx_free(&fx);
}

/* The lost-messages case: a stream opened with no Last-Event-ID that got
 * no msg ends (the node stops: a close event with its retry hint); two
 * messages are committed while it is away; the reconnect with the last id
 * it saw gets both, once and in order, then live ones. */
static void test_a_stream_with_no_msg_resumes_where_it_was(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 3);
  char ep[STORE_EPOCH_MAX + 1], at[64];
  epoch_of(&fx, "c1", ep);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s = sse_open(&fx, "conv=c1", tok, NULL);
  json_decref(expect_event(s, "welcome").data);
  json_decref(expect_event(s, "synced").data);
  session_close_all(&fx.sessions, WS_CLOSE_SERVICE_RESTART, "{\"retryAfterMs\":900}");
  fx_run(&fx);
  snprintf(at, sizeof at, "c1 3 %s", ep);
  sse_event_t ev = expect_event(s, "close");
  assert_string_equal(ev.id, at);
  assert_int_equal(ev.retry, 900);
  assert_int_equal(json_integer_value(json_object_get(ev.data, "code")), WS_CLOSE_SERVICE_RESTART);
  json_decref(ev.data);
  expect_end(s);
  char last[sizeof s->last_id];
  strcpy(last, s->last_id);
  assert_string_equal(last, at);
  sse_close(s);

  fx_append(&fx, "c1", 4); /* committed while the stream is away */
  fx_append(&fx, "c1", 5);
  s = sse_open(&fx, "conv=c1", tok, last);
  ev = expect_event(s, "welcome");
  assert_string_equal(ev.id, at);
  assert_null(json_object_get(json_array_get(json_object_get(ev.data, "subs"), 0), "reset"));
  json_decref(ev.data);
  snprintf(at, sizeof at, "c1 4 %s", ep);
  expect_msg(s, "c1", 4, at, NULL);
  snprintf(at, sizeof at, "c1 5 %s", ep);
  expect_msg(s, "c1", 5, at, NULL);
  ev = expect_event(s, "synced");
  assert_string_equal(ev.id, at);
  json_decref(ev.data);
  fx_append(&fx, "c1", 6);
  snprintf(at, sizeof at, "c1 6 %s", ep);
  expect_msg(s, "c1", 6, at, NULL);
  expect_no_event(s);
  sse_close(s);
  free(tok);
  fx_free(&fx);
}

/* A drain window of `window_ms`, conversation c1 with `msgs` messages, a
 * ready peer for the drain's read, and `n` streams of c1 (token `tok`)
 * open in `s`, their welcome and synced read. */
static void streams_before_a_drain(fx_t *fx, int64_t window_ms, int msgs, const char *tok,
                                   sse_t **s, int n) {
  fx->cfg.drain_window_ms = window_ms;
  fx_conv(fx, "ch", "c1", msgs);
  assert_int_equal(
      store_node_beat(fx->db, "peer", "ws://peer.test/v1/ws", "", "ready", 0, 0, 0, util_now_ms()),
      0);
  for (int i = 0; i < n; i++) {
    s[i] = sse_open(fx, "conv=c1", tok, NULL);
    json_decref(expect_event(s[i], "welcome").data);
    json_decref(expect_event(s[i], "synced").data);
  }
}

/* A drain with a ready peer (gate/drain.h): the stream is told nothing
 * when the drain begins and keeps getting its messages; at its own moment
 * in the window (the fake clock) it gets the drain event, with its id (the
 * watermark after the last msg), a short jittered afterMs as retry:,
 * reconnectTo null (an EventSource reconnects to its own URL) and
 * deadlineMs 0, and the stream ends. */
static void test_drain_event_has_the_id(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s;
  streams_before_a_drain(&fx, 800, 2, tok, &s, 1);
  char ep[STORE_EPOCH_MAX + 1], at[64];
  epoch_of(&fx, "c1", ep);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  fx_drain_pool(&fx); /* the peers' read */
  expect_no_event(s); /* the stream goes on */
  assert_false(s->p->closed);
  fx_append(&fx, "c1", 3);
  snprintf(at, sizeof at, "c1 3 %s", ep);
  expect_msg(s, "c1", 3, at, NULL);
  sse_event_t ev;
  uint64_t waited = 0;
  while (!sse_next(s, &ev)) { /* its moment: in [0, 800) of the window */
    assert_true(waited < 800);
    fx_advance(&fx, 10);
    waited += 10;
  }
  assert_string_equal(ev.event, "drain");
  assert_string_equal(ev.id, at);
  int64_t after = json_integer_value(json_object_get(ev.data, "afterMs"));
  assert_true(after >= SSE_DRAIN_RETRY_MIN_MS && after <= SSE_DRAIN_RETRY_MAX_MS);
  assert_int_equal(ev.retry, after);
  assert_true(json_is_null(json_object_get(ev.data, "reconnectTo")));
  assert_int_equal(json_integer_value(json_object_get(ev.data, "deadlineMs")), 0);
  json_decref(ev.data);
  expect_end(s);
  sse_close(s);
  free(tok);
  fx_free(&fx);
}

/* Two streams told to move (waiting for their moments in a 30 s window),
 * the drain begun with a ready peer. */
static void two_waiting_streams(fx_t *fx, const char *tok, sse_t **s) {
  streams_before_a_drain(fx, 30000, 1, tok, s, 2);
  assert_int_equal(drain_start(fx->drain, "test"), 0);
  fx_drain_pool(fx); /* the peers' read: both told, their moments ahead */
  fx_advance(fx, 20);
  for (int i = 0; i < 2; i++) expect_no_event(s[i]); /* still streaming */
  assert_int_equal(fx->net.nws, 2);
  assert_int_equal(fx->stops, 0);
}

/* A reader that leaves before its moment is gone at once: the drain keeps
 * nothing of its connection (no reference until the moment), so it leaves
 * nws and nconns with its close, and the drain stops at its next tick once
 * the last reader has gone, not at the last one's moment. */
static void test_drain_a_reader_that_leaves_is_gone_at_once(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s[2];
  two_waiting_streams(&fx, tok, s);
  sse_close(s[0]); /* the reader goes away (EOF) */
  assert_int_equal(fx.net.nws, 1);
  assert_int_equal(fx.net.nconns, 1);
  sse_close(s[1]);
  assert_int_equal(fx.net.nws, 0);
  assert_int_equal(fx.net.nconns, 0);
  fx_advance(&fx, 20); /* one tick of the drain's timer */
  assert_int_equal(fx.stops, 1);
  assert_non_null(strstr(fx.stop_why, "drain complete"));
  assert_non_null(strstr(fx.stop_why, "2 moved")); /* told, and left by themselves */
  fx_advance(&fx, 31000);                          /* past every moment: nothing left to end */
  assert_int_equal(fx.stops, 1);
  free(tok);
  fx_free(&fx);
}

/* The node stops during the drain (SIGINT: node_stop closes every stream
 * with 1001) while streams wait for their moments: each gets its close
 * event and ends, and once its reader has closed, its connection is gone
 * at once (the node's stop waits for nconns to reach 0, STOP_GRACE_MS at
 * most; a stream still counted would hold it for that long). */
static void test_stop_during_a_drain_leaves_no_stream_behind(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s[2];
  two_waiting_streams(&fx, tok, s);
  session_close_all(&fx.sessions, WS_CLOSE_GOING_AWAY, "server shutting down"); /* node_stop */
  for (int i = 0; i < 2; i++) {
    sse_event_t ev = expect_event(s[i], "close");
    assert_int_equal(json_integer_value(json_object_get(ev.data, "code")), WS_CLOSE_GOING_AWAY);
    json_decref(ev.data);
    expect_end(s[i]);
    sse_close(s[i]); /* the reader closes its end */
  }
  assert_int_equal(fx.net.nws, 0);
  assert_int_equal(fx.net.nconns, 0);
  fx_advance(&fx, 31000); /* past every moment: nothing left to end */
  assert_int_equal(fx.stops, 1);
  free(tok);
  fx_free(&fx);
}

/* Many streams waiting, every third reader leaving at its own time
 * through the window (from anywhere in the heap of moments, before or
 * after others' moments): at every step nws is the streams still open,
 * every stream that stayed gets its drain event once, within the window,
 * and the drain stops at the tick after the last stream ended. */
#define MANY 30
static void test_drain_many_streams_some_leave(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s[MANY];
  int ended[MANY] = {0}, open = MANY;
  streams_before_a_drain(&fx, 3000, 1, tok, s, MANY);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  fx_drain_pool(&fx);
  for (uint64_t t = 0; open > 0; t += 20) {
    assert_true(t <= 3000 + 20);
    fx_advance(&fx, 20);
    for (int i = 0; i < MANY; i++) {
      if (!s[i]) continue;
      sse_event_t ev;
      if (sse_next(s[i], &ev)) { /* its moment */
        assert_string_equal(ev.event, "drain");
        json_decref(ev.data);
        expect_end(s[i]);
        ended[i]++;
      } else if (i % 3 == 0 && t >= (uint64_t)i * 100) { /* leaves before it */
        ended[i] = -1;
      } else {
        continue;
      }
      sse_close(s[i]);
      s[i] = NULL;
      open--;
      assert_int_equal(fx.net.nws, open);
      assert_int_equal(fx.net.nconns, open);
    }
    if (open) assert_int_equal(fx.stops, 0);
  }
  fx_advance(&fx, 20);
  assert_int_equal(fx.stops, 1);
  assert_non_null(strstr(fx.stop_why, "drain complete"));
  int left_early = 0;
  for (int i = 0; i < MANY; i++) {
    assert_true(ended[i] == 1 || (ended[i] == -1 && i % 3 == 0));
    left_early += ended[i] == -1;
  }
  assert_true(left_early >= 3); /* some did leave before their moment */
  free(tok);
  fx_free(&fx);
}

/* A stream told by a shed and then again by the drain that takes the shed
 * over waits once, for the earlier of its two moments, and gets one drain
 * event. */
static void test_shed_then_drain_one_event(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s;
  streams_before_a_drain(&fx, 30000, 1, tok, &s, 1); /* the drain's window: 30 s */
  int chosen, total;
  assert_int_equal(drain_shed(fx.drain, 1.0, 200, &chosen, &total), 0); /* the shed's: 200 ms */
  assert_int_equal(chosen, 1);
  fx_drain_pool(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  fx_drain_pool(&fx);
  sse_event_t ev;
  uint64_t waited = 0;
  while (!sse_next(s, &ev)) { /* the shed's moment, not one of the drain's 30 s */
    assert_true(waited <= 200);
    fx_advance(&fx, 20);
    waited += 20;
  }
  assert_string_equal(ev.event, "drain");
  json_decref(ev.data);
  expect_end(s);
  sse_close(s);
  assert_int_equal(fx.net.nconns, 0);
  fx_advance(&fx, 20);
  assert_int_equal(fx.stops, 1);
  free(tok);
  fx_free(&fx);
}

/* A Last-Event-ID in another epoch (the store was restored): the welcome
 * says reset, and its id is already the head in the conversation's
 * epoch, so that the reconnect after it does not reset again. */
static void test_reset_moves_the_id_to_the_new_epoch(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 4);
  char ep[STORE_EPOCH_MAX + 1], at[64];
  epoch_of(&fx, "c1", ep);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s = sse_open(&fx, "conv=c1", tok, strcmp(ep, "0bad0bad") ? "c1 2 0bad0bad" : "c1 2 1bad");
  sse_event_t ev = expect_event(s, "welcome");
  assert_true(
      json_is_true(json_object_get(json_array_get(json_object_get(ev.data, "subs"), 0), "reset")));
  snprintf(at, sizeof at, "c1 4 %s", ep);
  assert_string_equal(ev.id, at);
  json_decref(ev.data);
  ev = expect_event(s, "synced");
  assert_string_equal(ev.id, at);
  json_decref(ev.data);
  expect_no_event(s); /* nothing replayed: the client was told to start over */
  sse_close(s);
  free(tok);
  fx_free(&fx);
}

/* A body with line breaks (stored as it was sent) is one data: line per
 * line; joined with '\n' they are the frame. */
static void test_data_of_several_lines(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 0);
  char *tok = fx_token(&fx, "ann", "c1");
  sse_t *s = sse_open(&fx, "conv=c1", tok, NULL);
  json_decref(expect_event(s, "welcome").data);
  json_decref(expect_event(s, "synced").data);
  store_msg_t m;
  int created;
  assert_int_equal(bus_append(fx.bus, fx.db, "c1", "m-x", "fx", "{\n  \"a\": 1,\n  \"b\": \"x\"\n}",
                              util_now_ms(), &m, &created),
                   0);
  store_msg_clear(&m);
  fx_run(&fx);
  sse_event_t ev = expect_event(s, "msg");
  assert_int_equal(ev.ndata, 4);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(ev.data, "body"), "a")), 1);
  json_decref(ev.data);
  sse_close(s);
  free(tok);
  fx_free(&fx);
}

/* A refusal: `status` with a JSON body {"error": {"code": code, ...}} of
 * its Content-Length, and the end. Returns the head (static). */
static const char *expect_refusal(sse_t *s, int status, const char *code) {
  assert_int_equal(s->status, status);
  assert_non_null(strstr(s->head, "Content-Type: application/json\r\n"));
  const char *cl = strstr(s->head, "Content-Length: ");
  assert_non_null(cl);
  pull(s);
  assert_int_equal(strtol(cl + 16, NULL, 10), (long)s->len);
  json_error_t err;
  json_t *body = json_loads(s->buf, 0, &err);
  if (!body) fail_msg("not JSON: \"%s\"", s->buf);
  assert_string_equal(json_string_value(json_object_get(json_object_get(body, "error"), "code")),
                      code);
  assert_non_null(json_string_value(json_object_get(json_object_get(body, "error"), "message")));
  json_decref(body);
  assert_true(s->p->closed);
  return s->head;
}

/* Before the stream begins every refusal is an HTTP answer with its
 * status (net/ws.c's map): a bad token 401, a conversation outside it
 * 403, none such 404, an inactive channel 409, the per-user limit 429,
 * no admission slot 503 with Retry-After. */
static void test_refusals_are_http_answers(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 1, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "off", "c3", 0);
  store_channel_t chan;
  assert_int_equal(store_channel_set_active(fx.db, "off", 0, &chan), 0);
  char *tok = fx_token(&fx, "ann", "*"), *narrow = fx_token(&fx, "ann", "c1");
  struct {
    const char *query, *token;
    int status;
    const char *code;
  } cases[] = {
      {"conv=c1", "not-a-token", 401, "unauthorized"},
      {"conv=c1&conv=c3", narrow, 403, "forbidden"},
      {"conv=c1&conv=nope", tok, 404, "not_found"},
      {"conv=c3", tok, 409, "channel_inactive"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sse_t *s = sse_open(&fx, cases[i].query, cases[i].token, NULL);
    expect_refusal(s, cases[i].status, cases[i].code);
    sse_close(s);
  }
  char *expired = fx_token_ttl(&fx, "ann", "c1", -60);
  sse_t *s = sse_open(&fx, "conv=c1", expired, NULL);
  expect_refusal(s, 401, "unauthorized");
  sse_close(s);
  free(expired);

  fx.cfg.max_conns_per_user = 1;
  sse_t *first = sse_open(&fx, "conv=c1", tok, NULL);
  assert_int_equal(first->status, 200);
  s = sse_open(&fx, "conv=c1", tok, NULL);
  expect_refusal(s, 429, "too_many_connections");
  sse_close(s);
  sse_close(first);
  fx_run(&fx);
  fx.cfg.max_conns_per_user = 0;

  /* one slot, one waiter: b holds the slot, c waits, the stream is refused */
  fx_peer_t *b = fx_connect(&fx), *c = fx_connect(&fx);
  fx_hello(b, "c1", -1);
  fx_hello(c, "c1", -1);
  char req[1024];
  snprintf(req, sizeof req, "GET /v1/sse?conv=c1 HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n",
           tok);
  fx_peer_t *p = fx_connect_raw(&fx, req);
  char *raw = fx_take(p);
  assert_memory_equal(raw, "HTTP/1.1 503 ", 13);
  const char *ra = strstr(raw, "\r\nRetry-After: ");
  assert_non_null(ra);
  assert_true(strtol(ra + 15, NULL, 10) >= 1);
  assert_non_null(strstr(raw, "\"code\":\"unavailable\""));
  free(raw);
  fx_peer_free(p);
  fx_drain_pool(&fx);
  fx_peer_free(b);
  fx_peer_free(c);
  free(tok);
  free(narrow);
  fx_free(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_watermark_good),
      cmocka_unit_test(test_watermark_bad),
      cmocka_unit_test(test_stream_from_the_head),
      cmocka_unit_test(test_resume_two_conversations),
      cmocka_unit_test(test_a_stream_with_no_msg_resumes_where_it_was),
      cmocka_unit_test(test_drain_event_has_the_id),
      cmocka_unit_test(test_drain_a_reader_that_leaves_is_gone_at_once),
      cmocka_unit_test(test_stop_during_a_drain_leaves_no_stream_behind),
      cmocka_unit_test(test_drain_many_streams_some_leave),
      cmocka_unit_test(test_shed_then_drain_one_event),
      cmocka_unit_test(test_reset_moves_the_id_to_the_new_epoch),
      cmocka_unit_test(test_data_of_several_lines),
      cmocka_unit_test(test_refusals_are_http_answers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
