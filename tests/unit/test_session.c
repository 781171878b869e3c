/* Unit tests of a protocol session against the in-process fixture
 * (fixture.h: the real transport, sessions, bus and store; an inline pool
 * and a fake clock):
 *  - every transition of the subscription table in proto/sub.c's design
 *    block, each test named after the rows it drives;
 *  - the hello's admission slot given back on every path: done, error,
 *    close while queued, close with its job not started, queue timeout;
 *  - v1.1: subscribe (replay, null, twice, reset, every refusal, queued
 *    and refused), unsubscribe (live, with its job out, racing a new
 *    subscribe; a subscribe it overtakes answered `error cancelled`),
 *    every subscribe answered (also one sent while the subscribe or hello
 *    that makes its subscription is under way), refresh (narrower scope,
 *    another user, a bad token) and the token's expiry with its leeway;
 *    the rate limits, the close for sustained abuse, and the per-user
 *    connection limit;
 *  - v1.2: presence (join and leave events by presenceEvents, the grace
 *    across a reconnect and a drain move, presence pages, refusals) and
 *    signals (fan-out, not stored, refusals, their rate). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jwt.h>

#include "common/util.h"
#include "core/errors.h"
#include "fixture.h"
#include "net/ws.h"
#include "proto/frames.h"
#include "proto/presence.h"
#include "proto/session_int.h"

/* ---- helpers ---------------------------------------------------------------- */

static int64_t seq_of(json_t *m) { return json_integer_value(json_object_get(m, "seq")); }

static int is_type(json_t *js, const char *type) {
  const char *t = json_string_value(json_object_get(js, "type"));
  return t && strcmp(t, type) == 0;
}

/* The next frame that is not filler (see stuff). */
static json_t *next(fx_peer_t *p) {
  for (;;) {
    json_t *js = fx_recv(p);
    if (!js || !is_type(js, "filler")) return js;
    json_decref(js);
  }
}

static json_t *expect(fx_peer_t *p, const char *type) {
  json_t *js = next(p);
  if (!js) fail_msg("expected %s, got nothing (closed %d code %d)", type, p->closed, p->close_code);
  if (!is_type(js, type)) fail_msg("expected %s, got %s", type, json_dumps(js, JSON_COMPACT));
  return js;
}

/* msg frames from..to, in order, each once. */
static void expect_msgs(fx_peer_t *p, int64_t from, int64_t to) {
  for (int64_t s = from; s <= to; s++) {
    json_t *m = expect(p, "msg");
    assert_int_equal(seq_of(m), s);
    json_decref(m);
  }
}

static void expect_synced(fx_peer_t *p, int64_t head, int reset) {
  json_t *js = expect(p, "synced");
  assert_int_equal(json_integer_value(json_object_get(js, "head")), head);
  assert_int_equal(json_is_true(json_object_get(js, "reset")), reset);
  json_decref(js);
}

static void expect_error(fx_peer_t *p, const char *code) {
  json_t *js = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(js, "code")), code);
  json_decref(js);
}

/* Commit message i to `conv` in the store only: the bus does not hear it
 * (a gap, as a lost notification makes one). */
static void store_only(fx_t *fx, const char *conv, int i) {
  char id[32], body[32];
  snprintf(id, sizeof id, "m-%d", i);
  snprintf(body, sizeof body, "{\"i\":%d}", i);
  store_msg_t m;
  int created;
  assert_int_equal(store_append(fx->db, conv, id, "fx", body, util_now_ms(), &m, &created), 0);
  store_msg_clear(&m);
}

/* Commit message i with a body of about `bytes` bytes, through the bus. */
static void big_append(fx_t *fx, const char *conv, int i, size_t bytes) {
  char *body = malloc(bytes + 64), id[32];
  int n = snprintf(body, bytes + 64, "{\"i\":%d,\"pad\":\"", i);
  memset(body + n, 'x', bytes);
  strcpy(body + n + bytes, "\"}");
  snprintf(id, sizeof id, "m-%d", i);
  store_msg_t m;
  int created;
  assert_int_equal(bus_append(fx->bus, fx->db, conv, id, "fx", body, util_now_ms(), &m, &created),
                   0);
  store_msg_clear(&m);
  free(body);
  fx_run(fx);
}

/* Queue 2 MiB of output on the peer's connection (one text frame the
 * client skips) so that it is above OUT_HIGH_WATER while the peer does not
 * read. */
static void stuff(fx_peer_t *p) {
  size_t n = 2u << 20;
  char *text = malloc(n + 32);
  int h = snprintf(text, 32, "{\"type\":\"filler\",\"x\":\"");
  memset(text + h, 'f', n);
  strcpy(text + h + n, "\"}");
  ws_send_text(p->conn, text, strlen(text));
  free(text);
  assert_true(conn_pending_bytes(p->conn) > OUT_HIGH_WATER);
}

/* Read the filler and everything queued, until the output is below the
 * low-water mark (the node's on_writable runs). Returns the frames that
 * are not filler, as a JSON array. */
static json_t *unstuff(fx_peer_t *p) {
  json_t *got = json_array();
  for (int i = 0; i < 1000 && (conn_pending_bytes(p->conn) > 0 || i < 2); i++) {
    json_t *js = fx_recv(p);
    if (js && !is_type(js, "filler"))
      json_array_append_new(got, js);
    else
      json_decref(js);
  }
  return got;
}

/* The value of one series in the fixture node's /metrics text, -1 when
 * absent. */
static double metric_value(fx_t *fx, const char *series) {
  size_t len = 0;
  char *text = metrics_render(fx->metrics, &len);
  assert_non_null(text);
  double v = -1;
  size_t n = strlen(series);
  for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, series, n) == 0 && line[n] == ' ') v = strtod(line + n + 1, NULL);
  free(text);
  return v;
}

/* A peer on `conv` from `watermark`, through its hello, live at `head`. */
static fx_peer_t *live_peer(fx_t *fx, const char *conv, int64_t watermark, int64_t head) {
  fx_peer_t *p = fx_connect(fx);
  fx_hello(p, conv, watermark);
  assert_true(fx_step(fx));
  json_decref(expect(p, "welcome"));
  if (watermark >= 0) expect_msgs(p, watermark + 1, head);
  expect_synced(p, head, 0);
  assert_int_equal(fx_sub_state(p, conv), SUB_LIVE);
  return p;
}

static void sync_frame(fx_peer_t *p, const char *conv, int64_t watermark, const char *epoch) {
  char text[256];
  if (epoch)
    snprintf(text, sizeof text,
             "{\"type\":\"sync\",\"conv\":\"%s\",\"watermark\":%lld,\"epoch\":\"%s\"}", conv,
             (long long)watermark, epoch);
  else
    snprintf(text, sizeof text, "{\"type\":\"sync\",\"conv\":\"%s\",\"watermark\":%lld}", conv,
             (long long)watermark);
  fx_send(p, text);
}

/* The welcome's clientId of a hello without one: "s-" and 16 lowercase
 * hex digits drawn for the connection; copied to `out` (>= 19 bytes). */
static void default_client_id(json_t *welcome, char *out) {
  const char *cid = json_string_value(json_object_get(welcome, "clientId"));
  assert_non_null(cid);
  assert_int_equal(strlen(cid), 18);
  assert_memory_equal(cid, "s-", 2);
  for (size_t i = 2; i < 18; i++)
    assert_true((cid[i] >= '0' && cid[i] <= '9') || (cid[i] >= 'a' && cid[i] <= 'f'));
  memcpy(out, cid, 19);
}

/* ---- the subscription's transitions ---------------------------------------- */

/* (new) hello admitted -> FILLING; FILLING job done, target reached ->
 * LIVE; LIVE message delivered + 1 -> LIVE (sent). */
static void test_hello_fills_then_live_delivery(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *p = fx_connect(&fx);
  fx_hello(p, "c1", 0);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_int_equal(admission_in_use(fx.admission), 1);
  fx_expect_nothing(p);
  assert_true(fx_step(&fx));
  json_t *w = expect(p, "welcome");
  /* no clientId in the hello: the connection is a client of its own */
  char cid[32];
  default_client_id(w, cid);
  assert_string_equal(json_string_value(json_object_get(w, "protocol")), "1.2");
  json_decref(w);
  expect_msgs(p, 1, 3);
  expect_synced(p, 3, 0);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_append(&fx, "c1", 4);
  expect_msgs(p, 4, 4);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_expect_nothing(p);
  /* another connection without one is another client */
  fx_peer_t *q = fx_connect(&fx);
  fx_hello(q, "c1", 4);
  assert_true(fx_step(&fx));
  w = expect(q, "welcome");
  char cid2[32];
  default_client_id(w, cid2);
  json_decref(w);
  assert_string_not_equal(cid, cid2);
  expect_synced(q, 4, 0);
  fx_peer_free(q);
  fx_peer_free(p);
  fx_free(&fx);
}

/* LIVE message at or below delivered -> dropped, LIVE. */
static void test_live_old_message_is_dropped(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 3);
  store_msg_t m = {.seq = 2, .id = "m-2", .sender = "fx", .body = "{\"i\":2}"};
  bus_publish(fx.bus, bus_msg_new("c1", 2, frame_msg("c1", &m)));
  fx_run(&fx);
  fx_expect_nothing(p);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* LIVE message past a gap -> FILLING (kept, fill up to it); not LIVE
 * message -> kept; FILLING done -> LIVE with what waited, in order. */
static void test_gap_fills_then_sends_what_waited(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 3);
  store_only(&fx, "c1", 4);
  store_only(&fx, "c1", 5);
  fx_append(&fx, "c1", 6); /* 6 with 4 and 5 unheard */
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  fx_append(&fx, "c1", 7); /* kept while filling */
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  fx_expect_nothing(p);
  assert_true(fx_step(&fx));
  expect_msgs(p, 4, 7);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  assert_false(fx_step(&fx)); /* one fill job was enough */
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* A head hint (bus.h) above delivered: LIVE -> FILLING up to its seq. */
static void test_head_hint_fills(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 2);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 2);
  store_only(&fx, "c1", 3);
  bus_publish(fx.bus, bus_msg_new("c1", 3, NULL));
  fx_run(&fx);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_msgs(p, 3, 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* LIVE message delivered + 1 with the output high -> DEFERRED; DEFERRED
 * output drained -> FILLING; then LIVE, nothing lost or doubled. */
static void test_slow_reader_defers_then_fills(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 1);
  stuff(p);
  fx_append(&fx, "c1", 2);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_DEFERRED);
  fx_append(&fx, "c1", 3); /* kept */
  assert_int_equal(fx_sub_state(p, "c1"), SUB_DEFERRED);
  assert_false(fx_step(&fx)); /* deferred: no store job yet */
  json_t *got = unstuff(p);   /* the client reads: on_writable */
  assert_int_equal(json_array_size(got), 0);
  json_decref(got);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_msgs(p, 2, 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* One frame shared by every subscriber (conn_write_shared): each gets
 * the same bytes in order; a subscriber whose socket is full keeps its
 * reference queued behind the write in flight, and one that goes away
 * with references queued releases them (the sanitizer run checks that
 * nothing leaks or is used after it is freed). */
static void test_shared_frames_to_many(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  enum { N = 4 };
  fx_peer_t *p[N];
  for (int i = 0; i < N; i++) p[i] = live_peer(&fx, "c1", 0, 1);
  /* p[1]: a write in flight, below the high-water mark */
  size_t n = 400u << 10;
  char *text = malloc(n + 32);
  int h = snprintf(text, 32, "{\"type\":\"filler\",\"x\":\"");
  memset(text + h, 'f', n);
  strcpy(text + h + n, "\"}");
  ws_send_text(p[1]->conn, text, strlen(text));
  free(text);
  fx_run(&fx);
  assert_true(conn_pending_bytes(p[1]->conn) > 0);
  assert_true(conn_pending_bytes(p[1]->conn) < OUT_HIGH_WATER);
  for (int i = 2; i <= 4; i++) fx_append(&fx, "c1", i);
  /* p[2] goes with its frames queued by reference */
  fx_peer_free(p[2]);
  fx_run(&fx);
  for (int i = 0; i < N; i++) {
    if (i == 2) continue;
    if (i == 1) {
      json_t *got = unstuff(p[1]), *js;
      while (json_array_size(got) < 3 && (js = fx_recv(p[1])) != NULL)
        json_array_append_new(got, js);
      assert_int_equal(json_array_size(got), 3);
      for (size_t k = 0; k < 3; k++)
        assert_int_equal(seq_of(json_array_get(got, k)), (int64_t)k + 2);
      json_decref(got);
    } else {
      expect_msgs(p[i], 2, 4);
    }
    fx_expect_nothing(p[i]);
  }
  for (int i = 0; i < N; i++)
    if (i != 2) fx_peer_free(p[i]);
  fx_free(&fx);
}

/* Counts the releases of a frame queued with conn_write_shared. */
static void count_release(void *ud) { (*(int *)ud)++; }

/* A burst of more shared frames than one writev(2) takes (FLUSH_IOV, 64
 * in net/conn.c), queued before the loop's flush: a connection whose
 * socket takes them writes them 64 at a time from inside the calls, so
 * its queue never holds more than 64 (the peak memory of a burst), and
 * one whose socket is full (a write in flight) keeps them all queued
 * behind it. Each peer reads every frame once and in order. */
static void test_burst_beyond_one_writev(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *fast = live_peer(&fx, "c1", 0, 1), *slow = live_peer(&fx, "c1", 0, 1);
  size_t n = 400u << 10; /* a write in flight, below the high-water mark */
  char *text = malloc(n + 32);
  int h = snprintf(text, 32, "{\"type\":\"filler\",\"x\":\"");
  memset(text + h, 'f', n);
  strcpy(text + h + n, "\"}");
  ws_send_text(slow->conn, text, strlen(text));
  free(text);
  fx_run(&fx);
  assert_true(conn_pending_bytes(slow->conn) > 0);

  enum { BURST = 200 };
  char *frames[BURST];
  size_t lens[BURST];
  int released[BURST] = {0}, released_slow[BURST] = {0};
  for (int i = 0; i < BURST; i++) {
    char json[256];
    snprintf(json, sizeof json, "{\"type\":\"msg\",\"conv\":\"c1\",\"seq\":%d,\"pad\":\"%0150d\"}",
             i + 2, i);
    frames[i] = ws_encode_text(&fx.net, json, strlen(json), &lens[i]);
    assert_non_null(frames[i]);
    assert_true(lens[i] >= CONN_SHARED_MIN);
  }
  for (int i = 0; i < BURST; i++) {
    assert_int_equal(conn_write_shared(fast->conn, frames[i], lens[i], count_release, &released[i]),
                     0);
    assert_true(fast->conn->nsegs < 64); /* written each time 64 waited */
  }
  int written = 0;
  for (int i = 0; i < BURST; i++) written += released[i];
  assert_int_equal(written, 3 * 64); /* before the loop ran at all */
  for (int i = 0; i < BURST; i++) {
    assert_int_equal(
        conn_write_shared(slow->conn, frames[i], lens[i], count_release, &released_slow[i]), 0);
  }
  assert_true(slow->conn->nsegs >= BURST); /* behind the write in flight */
  for (int i = 0; i < BURST; i++) assert_int_equal(released_slow[i], 0);
  fx_run(&fx);

  expect_msgs(fast, 2, BURST + 1);
  fx_expect_nothing(fast);
  json_t *got = unstuff(slow), *js;
  while (json_array_size(got) < BURST && (js = fx_recv(slow)) != NULL)
    json_array_append_new(got, js);
  assert_int_equal(json_array_size(got), BURST);
  for (size_t k = 0; k < BURST; k++)
    assert_int_equal(seq_of(json_array_get(got, k)), (int64_t)k + 2);
  json_decref(got);
  fx_expect_nothing(slow);
  for (int i = 0; i < BURST; i++) {
    assert_int_equal(released[i], 1);
    assert_int_equal(released_slow[i], 1);
    free(frames[i]);
  }
  fx_peer_free(fast);
  fx_peer_free(slow);
  fx_free(&fx);
}

/* FILLING job done with the output high -> DEFERRED (the same page again
 * once drained). */
static void test_fill_done_with_output_high_defers(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 1);
  store_only(&fx, "c1", 2);
  fx_append(&fx, "c1", 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  stuff(p);
  assert_true(fx_step(&fx));
  assert_int_equal(fx_sub_state(p, "c1"), SUB_DEFERRED);
  json_t *got = unstuff(p);
  assert_int_equal(json_array_size(got), 0); /* nothing of the page went out */
  json_decref(got);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_msgs(p, 2, 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* FILLING job done a page short of its target -> FILLING (the next page):
 * a history of three pages of 1 KiB bodies (PAGE_BYTES 256 KiB). */
static void test_long_replay_pages(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 0);
  int n = 700;
  for (int i = 1; i <= n; i++) big_append(&fx, "c1", i, 1024);
  fx_peer_t *p = fx_connect(&fx);
  fx_hello(p, "c1", 0);
  assert_true(fx_step(&fx)); /* the hello: welcome and its first page */
  json_decref(expect(p, "welcome"));
  int64_t got = 0;
  int jobs = 1;
  while (got < n) {
    json_t *m = next(p);
    if (!m) {
      assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING); /* a page short: the next one */
      assert_true(fx_step(&fx));
      jobs++;
      continue;
    }
    assert_true(is_type(m, "msg"));
    assert_int_equal(seq_of(m), ++got);
    json_decref(m);
  }
  expect_synced(p, n, 0);
  assert_true(jobs >= 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* LIVE sync, slot granted -> FILLING; FILLING job done -> LIVE (synced). */
static void test_sync_granted(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 5);
  fx_peer_t *p = live_peer(&fx, "c1", 5, 5);
  sync_frame(p, "c1", 2, NULL);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_int_equal(admission_in_use(fx.admission), 1); /* the sync's first job holds a slot */
  assert_true(fx_step(&fx));
  assert_int_equal(admission_in_use(fx.admission), 0);
  expect_msgs(p, 3, 5);
  expect_synced(p, 5, 0);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* FILLING job done, history reset -> synced with reset, LIVE at the head:
 * a sync in another epoch, and one above the head. */
static void test_sync_reset(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 4);
  fx_peer_t *p = live_peer(&fx, "c1", 4, 4);
  sync_frame(p, "c1", 2, "0000beef");
  assert_true(fx_step(&fx));
  expect_synced(p, 4, 1);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  sync_frame(p, "c1", 9, NULL);
  assert_true(fx_step(&fx));
  expect_synced(p, 4, 1);
  fx_append(&fx, "c1", 5);
  expect_msgs(p, 5, 5);
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* One slot, held by another connection's hello job. LIVE sync, queued ->
 * QUEUED (live messages kept); QUEUED slot granted -> FILLING -> LIVE. */
static void test_sync_queued_then_granted(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *a = live_peer(&fx, "c1", 3, 3);
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", -1); /* holds the slot while its job waits in the pool */
  assert_int_equal(admission_in_use(fx.admission), 1);
  sync_frame(a, "c1", 1, NULL);
  assert_int_equal(fx_sub_state(a, "c1"), SUB_QUEUED);
  fx_append(&fx, "c1", 4); /* kept while queued */
  fx_expect_nothing(a);
  assert_int_equal(fx_sub_state(a, "c1"), SUB_QUEUED);
  assert_true(fx_step(&fx)); /* b's hello returns: its slot goes to a's sync */
  json_decref(expect(b, "welcome"));
  assert_int_equal(fx_sub_state(a, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_msgs(a, 2, 4);
  expect_synced(a, 4, 0);
  assert_int_equal(fx_sub_state(a, "c1"), SUB_LIVE);
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_peer_free(a);
  fx_peer_free(b);
  fx_free(&fx);
}

/* QUEUED slot refused at the queue timeout -> replay_unavailable with a
 * retry hint, LIVE, and what waited goes out. */
static void test_sync_queue_timeout(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *a = live_peer(&fx, "c1", 3, 3);
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", -1);
  sync_frame(a, "c1", 1, NULL);
  assert_int_equal(fx_sub_state(a, "c1"), SUB_QUEUED);
  fx_append(&fx, "c1", 4);
  fx_advance(&fx, 999);
  assert_int_equal(fx_sub_state(a, "c1"), SUB_QUEUED);
  fx_advance(&fx, 1);
  json_t *e = expect(a, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "replay_unavailable");
  assert_true(json_integer_value(json_object_get(e, "retryAfterMs")) > 0);
  json_decref(e);
  expect_msgs(a, 4, 4); /* live delivery goes on */
  assert_int_equal(fx_sub_state(a, "c1"), SUB_LIVE);
  assert_int_equal(admission_waiting(fx.admission), 0);
  assert_true(fx_step(&fx));
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_peer_free(a);
  fx_peer_free(b);
  fx_free(&fx);
}

/* LIVE sync with the queue full -> replay_unavailable at once, LIVE. */
static void test_sync_queue_full(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 1, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *a = live_peer(&fx, "c1", 3, 3);
  fx_peer_t *b = fx_connect(&fx), *c = fx_connect(&fx);
  fx_hello(b, "c1", -1); /* holds the slot */
  fx_hello(c, "c1", -1); /* the one waiter allowed */
  assert_int_equal(admission_waiting(fx.admission), 1);
  sync_frame(a, "c1", 1, NULL);
  expect_error(a, "replay_unavailable");
  assert_int_equal(fx_sub_state(a, "c1"), SUB_LIVE);
  fx_append(&fx, "c1", 4);
  expect_msgs(a, 4, 4);
  fx_drain_pool(&fx);
  fx_peer_free(a);
  fx_peer_free(b);
  fx_peer_free(c);
  fx_free(&fx);
}

/* A live subscriber of c1 (history 1) whose gap fill fails: message 2 is in
 * the store only, 3 arrives live, and the fill job's deadline (100 ms)
 * passes before it runs. Returns the replay_unavailable hint (ms); the
 * subscription is in RETRY. */
static int64_t fail_a_fill(fx_t *fx, fx_peer_t **out) {
  fx->cfg.store_timeout_ms = 100;
  fx_conv(fx, "ch", "c1", 1);
  fx_peer_t *p = *out = live_peer(fx, "c1", 0, 1);
  store_only(fx, "c1", 2);
  fx_append(fx, "c1", 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  fx_advance(fx, 100); /* the fill job's deadline passes before it runs */
  assert_true(fx_step(fx));
  json_t *e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "replay_unavailable");
  int64_t hint = json_integer_value(json_object_get(e, "retryAfterMs"));
  assert_true(hint > 0);
  json_decref(e);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_RETRY);
  return hint;
}

/* FILLING job failed (its deadline passed in the queue) -> RETRY with a
 * replay_unavailable hint; RETRY tick at retry_at -> FILLING -> LIVE. */
static void test_failed_fill_retries_after_the_hint(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_peer_t *p;
  int64_t hint = fail_a_fill(&fx, &p);
  fx_append(&fx, "c1", 4); /* kept */
  fx_advance(&fx, (uint64_t)hint - 1);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_RETRY);
  assert_false(fx_step(&fx)); /* no job before the hint */
  fx_advance(&fx, 1);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_msgs(p, 2, 4);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* FILLING job done, its epoch moved meanwhile -> FILLING (read again in
 * the new epoch) -> LIVE. The retried fill goes out in the subscription's
 * epoch; before it runs the store's epoch is rotated (a restore under the
 * running node) and a live message of the new epoch arrives, which moves
 * the subscription on (epoch_changed). The job then finds the new epoch:
 * not a reset of the client's (no synced, no reset), but a second read in
 * it, and every message goes out once, in order, in the new epoch. */
static void test_fill_whose_epoch_moved_reads_again(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_peer_t *p;
  int64_t hint = fail_a_fill(&fx, &p); /* delivered 1; 2 in the store, 3 kept */
  fx_advance(&fx, (uint64_t)hint);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING); /* its job, in the old epoch, queued */
  int64_t rotated = 0;
  assert_int_equal(store_epoch_rotate(fx.db, "c1", &rotated), 0);
  assert_int_equal(rotated, 1);
  store_conv_t info;
  assert_int_equal(store_conv_get(fx.db, "c1", &info), 0);
  fx_append(&fx, "c1", 4); /* live, in the new epoch */
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx)); /* finds the new epoch: reads again */
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  fx_expect_nothing(p);
  assert_true(fx_step(&fx));
  for (int64_t seq = 2; seq <= 4; seq++) {
    json_t *m = expect(p, "msg");
    assert_int_equal(seq_of(m), seq);
    assert_string_equal(json_string_value(json_object_get(m, "epoch")), info.epoch);
    json_decref(m);
  }
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  assert_false(fx_step(&fx));
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* RETRY tick at retry_at with the output high -> DEFERRED; drained ->
 * FILLING -> LIVE. */
static void test_retry_with_output_high_defers(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_peer_t *p;
  int64_t hint = fail_a_fill(&fx, &p);
  stuff(p);
  fx_advance(&fx, (uint64_t)hint);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_DEFERRED);
  json_t *got = unstuff(p);
  assert_int_equal(json_array_size(got), 0);
  json_decref(got);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_msgs(p, 2, 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* not LIVE `pending` full -> forgotten, overflow; the fill's finish then
 * fills up to the head: everything once, in order. */
static void test_pending_overflow_refills_from_the_store(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 1);
  store_only(&fx, "c1", 2);
  fx_append(&fx, "c1", 3);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  for (int i = 4; i <= 23; i++) big_append(&fx, "c1", i, 64 * 1024); /* 1.25 MiB kept: too much */
  sub_t *sub = session_find_sub(p->conn->session, "c1");
  assert_true(sub->overflow);
  assert_int_equal(sub->npending, 0);
  int jobs = 0;
  int64_t got = 1;
  while (got < 23) {
    json_t *m = next(p);
    if (!m) {
      assert_true(fx_step(&fx));
      jobs++;
      continue;
    }
    assert_true(is_type(m, "msg"));
    assert_int_equal(seq_of(m), ++got);
    json_decref(m);
  }
  assert_true(jobs >= 2); /* the gap's fill, then the fill up to the head */
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  assert_false(sub->overflow);
  fx_peer_free(p);
  fx_free(&fx);
}

/* not LIVE sync -> the lowest is kept (sync_pending) and runs when the
 * fill finishes, as from LIVE. */
static void test_sync_while_filling_runs_after(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *p = live_peer(&fx, "c1", 3, 3);
  store_only(&fx, "c1", 4);
  fx_append(&fx, "c1", 5);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  sync_frame(p, "c1", 3, NULL);
  sync_frame(p, "c1", 1, NULL); /* the lower one wins */
  sync_frame(p, "c1", 2, NULL);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING);
  assert_int_equal(admission_in_use(fx.admission), 0); /* a gap fill holds no slot */
  assert_true(fx_step(&fx));
  expect_msgs(p, 4, 4); /* the gap; 5 waits behind the kept sync */
  fx_expect_nothing(p);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_FILLING); /* the kept sync, from LIVE */
  assert_int_equal(admission_in_use(fx.admission), 1);
  assert_true(fx_step(&fx));
  expect_msgs(p, 2, 5);
  expect_synced(p, 5, 0);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* any: the connection closes while a sync waits for its slot, and while
 * its sync job waits in the pool: the waiter leaves, the job is taken back
 * and its slot given back. */
static void test_close_leaves_the_queue_and_cancels(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 3);
  fx_peer_t *a = live_peer(&fx, "c1", 3, 3);
  fx_peer_t *a2 = live_peer(&fx, "c1", 3, 3);
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", -1); /* holds the slot */
  sync_frame(a, "c1", 1, NULL);
  assert_int_equal(admission_waiting(fx.admission), 1);
  fx_peer_free(a); /* queued: leaves */
  assert_int_equal(admission_waiting(fx.admission), 0);
  assert_true(fx_step(&fx)); /* b's hello; the slot is free again */
  assert_int_equal(admission_in_use(fx.admission), 0);
  sync_frame(a2, "c1", 1, NULL);
  assert_int_equal(fx_sub_state(a2, "c1"), SUB_FILLING);
  assert_int_equal(admission_in_use(fx.admission), 1);
  fx_peer_free(a2); /* its job not started: taken back, the slot given back */
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_step(&fx); /* the canceled job's done */
  assert_false(fx_step(&fx));
  fx_peer_free(b);
  fx_free(&fx);
}

/* ---- the hello's admission slot --------------------------------------------- */

/* error: a hello for a conversation that does not exist is answered, and
 * its slot given back. */
static void test_hello_error_gives_the_slot_back(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_peer_t *p = fx_connect(&fx);
  fx_hello(p, "missing", 0);
  assert_int_equal(admission_in_use(fx.admission), 1);
  assert_true(fx_step(&fx));
  assert_int_equal(admission_in_use(fx.admission), 0);
  json_t *js = next(p);
  int saw_not_found = 0;
  for (; js; js = next(p)) {
    if (is_type(js, "error"))
      saw_not_found |= strcmp(json_string_value(json_object_get(js, "code")), "not_found") == 0;
    json_decref(js);
  }
  assert_true(saw_not_found);
  fx_peer_free(p);
  fx_free(&fx);
}

/* The hello's job times out in the queue: unavailable and 1013, the slot
 * given back. */
static void test_hello_store_timeout_gives_the_slot_back(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.store_timeout_ms = 50;
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *p = fx_connect(&fx);
  fx_hello(p, "c1", 0);
  fx_advance(&fx, 50);
  assert_true(fx_step(&fx));
  expect_error(p, "unavailable");
  assert_null(next(p));
  assert_int_equal(p->close_code, WS_CLOSE_TRY_AGAIN_LATER);
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_peer_free(p);
  fx_free(&fx);
}

/* close while queued, and close with the job not started: nothing held
 * afterwards, and the next waiter gets the slot. */
static void test_hello_close_paths(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *a = fx_connect(&fx), *b = fx_connect(&fx), *c = fx_connect(&fx);
  fx_hello(a, "c1", 0); /* slot, job queued */
  fx_hello(b, "c1", 0); /* waits */
  fx_hello(c, "c1", 0); /* waits */
  assert_int_equal(admission_in_use(fx.admission), 1);
  assert_int_equal(admission_waiting(fx.admission), 2);
  fx_peer_free(b); /* queued: leaves the queue */
  assert_int_equal(admission_waiting(fx.admission), 1);
  fx_peer_free(a); /* job not started: canceled, the slot goes to c */
  assert_int_equal(admission_waiting(fx.admission), 0);
  assert_int_equal(admission_in_use(fx.admission), 1);
  fx_drain_pool(&fx);
  json_decref(expect(c, "welcome"));
  expect_msgs(c, 1, 1);
  expect_synced(c, 1, 0);
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_peer_free(c);
  fx_free(&fx);
}

/* timeout: a hello still queued after handshake_queue_ms is refused with
 * unavailable and 1013; the holder's slot is unaffected. */
static void test_hello_queue_timeout(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *a = fx_connect(&fx), *b = fx_connect(&fx);
  fx_hello(a, "c1", 0);
  fx_hello(b, "c1", 0);
  fx_advance(&fx, 1000);
  expect_error(b, "unavailable");
  assert_null(next(b));
  assert_int_equal(b->close_code, WS_CLOSE_TRY_AGAIN_LATER);
  assert_int_equal(admission_waiting(fx.admission), 0);
  assert_int_equal(admission_in_use(fx.admission), 1);
  assert_true(fx_step(&fx));
  json_decref(expect(a, "welcome"));
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_peer_free(a);
  fx_peer_free(b);
  fx_free(&fx);
}

/* ---- v1.1: subscribe, unsubscribe, refresh, the token's expiry ---------------- */

/* A peer whose hello (token for every conversation) made it live on `conv`
 * at its head `head`, from null. */
static fx_peer_t *star_peer(fx_t *fx, const char *conv, int64_t head) {
  fx_peer_t *p = fx_connect(fx);
  char *token = fx_token(fx, "alice", "*");
  fx_hello_token(p, token, conv, -1);
  free(token);
  assert_true(fx_step(fx));
  json_decref(expect(p, "welcome"));
  expect_synced(p, head, 0);
  return p;
}

static void subscribe_frame(fx_peer_t *p, const char *conv, int64_t watermark) {
  char text[256];
  if (watermark < 0)
    snprintf(text, sizeof text, "{\"type\":\"subscribe\",\"conv\":\"%s\",\"watermark\":null}",
             conv);
  else
    snprintf(text, sizeof text, "{\"type\":\"subscribe\",\"conv\":\"%s\",\"watermark\":%lld}", conv,
             (long long)watermark);
  fx_send(p, text);
}

static void unsubscribe_frame(fx_peer_t *p, const char *conv) {
  char text[256];
  snprintf(text, sizeof text, "{\"type\":\"unsubscribe\",\"conv\":\"%s\"}", conv);
  fx_send(p, text);
}

static void expect_subscribed(fx_peer_t *p, const char *conv, int64_t head, int reset,
                              int already) {
  json_t *js = expect(p, "subscribed");
  assert_string_equal(json_string_value(json_object_get(js, "conv")), conv);
  assert_int_equal(json_integer_value(json_object_get(js, "head")), head);
  assert_non_null(json_string_value(json_object_get(js, "epoch")));
  assert_true(json_is_boolean(json_object_get(js, "presence")));
  assert_int_equal(json_is_true(json_object_get(js, "reset")), reset);
  assert_int_equal(json_is_true(json_object_get(js, "already")), already);
  json_decref(js);
}

/* A subscribe of `conv` from its head (watermark null) on a live
 * connection, answered: subscribed, then synced, at `head`. */
static void subscribe_at_head(fx_t *fx, fx_peer_t *p, const char *conv, int64_t head) {
  subscribe_frame(p, conv, -1);
  assert_true(fx_step(fx));
  expect_subscribed(p, conv, head, 0, 0);
  expect_synced(p, head, 0);
}

static void expect_error_conv(fx_peer_t *p, const char *code, const char *conv) {
  json_t *js = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(js, "code")), code);
  assert_string_equal(json_string_value(json_object_get(js, "conv")), conv);
  json_decref(js);
}

static void expect_unsubscribed(fx_peer_t *p, const char *conv) {
  json_t *js = expect(p, "unsubscribed");
  assert_string_equal(json_string_value(json_object_get(js, "conv")), conv);
  json_decref(js);
}

/* The connection is open and answers. */
static void expect_open(fx_peer_t *p) {
  fx_send(p, "{\"type\":\"ping\"}");
  json_decref(expect(p, "pong"));
  assert_false(p->closed);
}

/* (new) subscribe, slot granted -> FILLING (its one job holds the slot);
 * job done -> subscribed, the replay, synced, LIVE; live messages kept
 * meanwhile follow in order. */
static void test_subscribe_replays_then_live(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 3);
  fx_peer_t *p = star_peer(&fx, "c1", 1);
  subscribe_frame(p, "c2", 1);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_FILLING);
  assert_int_equal(admission_in_use(fx.admission), 1);
  fx_append(&fx, "c2", 4); /* committed while the job is out: kept */
  fx_expect_nothing(p);
  assert_true(fx_step(&fx));
  assert_int_equal(admission_in_use(fx.admission), 0);
  expect_subscribed(p, "c2", 4, 0, 0);
  expect_msgs(p, 2, 4);
  expect_synced(p, 4, 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_LIVE);
  fx_append(&fx, "c2", 5);
  expect_msgs(p, 5, 5);
  fx_append(&fx, "c1", 2); /* the hello's subscription is untouched */
  expect_msgs(p, 2, 2);
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* A subscribe from null starts live at the head; a second subscribe is
 * answered "already" (after the first's answer when sent while the first
 * was under way), with no replay and no synced, and no message twice;
 * a watermark above the head is a reset in `subscribed`. */
static void test_subscribe_null_twice_and_reset(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 3);
  fx_conv(&fx, "ch", "c3", 2);
  fx_peer_t *p = star_peer(&fx, "c1", 1);
  subscribe_frame(p, "c2", -1);
  subscribe_frame(p, "c2", 0); /* while the first is under way: its own answer, after it */
  assert_true(fx_step(&fx));
  expect_subscribed(p, "c2", 3, 0, 0);
  expect_subscribed(p, "c2", 3, 0, 1);
  expect_synced(p, 3, 0);
  fx_expect_nothing(p);
  assert_false(fx_step(&fx)); /* one job */
  subscribe_frame(p, "c2", 0);
  expect_subscribed(p, "c2", 3, 0, 1);
  fx_expect_nothing(p);
  assert_false(fx_step(&fx));
  fx_append(&fx, "c2", 4);
  expect_msgs(p, 4, 4);
  fx_expect_nothing(p);
  subscribe_frame(p, "c3", 9);
  assert_true(fx_step(&fx));
  expect_subscribed(p, "c3", 2, 1, 0);
  expect_synced(p, 2, 0);
  fx_append(&fx, "c3", 3);
  expect_msgs(p, 3, 3);
  fx_peer_free(p);
  fx_free(&fx);
}

/* A channel deactivated (session_channel_changed, by the channel each
 * subscription was told at its announce): its announced subscriptions end
 * with channel_inactive and unsubscribed, those of other channels stay;
 * one not announced yet (its hello's job still out) is refused when that
 * job is done. */
static void test_channel_deactivated(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "other-channel", "c2", 1);
  fx_peer_t *p = star_peer(&fx, "c1", 1);
  subscribe_at_head(&fx, p, "c2", 1);
  fx_peer_t *q = fx_connect(&fx);
  fx_hello(q, "c1", -1); /* its job not run yet: not announced */
  assert_int_equal(fx_sub_state(q, "c1"), SUB_FILLING);
  store_channel_t chan;
  assert_int_equal(store_channel_set_active(fx.db, "ch", 0, &chan), 0);
  bus_channel_changed(fx.bus, "ch", 0);
  expect_error_conv(p, "channel_inactive", "c1");
  expect_unsubscribed(p, "c1");
  assert_int_equal(fx_sub_state(p, "c1"), -1);
  fx_append(&fx, "c2", 2);
  expect_msgs(p, 2, 2);
  fx_expect_nothing(p);
  assert_true(fx_step(&fx)); /* q's hello reads an inactive channel */
  expect_error_conv(q, "channel_inactive", "c1");
  json_t *w = expect(q, "welcome");
  assert_int_equal(json_array_size(json_object_get(w, "subs")), 0);
  json_decref(w);
  fx_peer_free(q);
  fx_peer_free(p);
  fx_free(&fx);
}

/* Refusals carry `conv` and leave the connection open: forbidden (the
 * token does not cover it), not_found, channel_inactive,
 * too_many_subscriptions, bad_request. */
static void test_subscribe_refusals(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.max_subs = 2;
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 0);
  fx_conv(&fx, "off", "c3", 0);
  fx_peer_t *narrow = live_peer(&fx, "c1", 1, 1); /* token for c1 only */
  subscribe_frame(narrow, "c2", 0);
  expect_error_conv(narrow, "forbidden", "c2");
  assert_int_equal(fx_sub_state(narrow, "c2"), -1);
  expect_open(narrow);
  assert_int_equal(metric_value(&fx, "converger_subscriptions_refused_total{reason=\"forbidden\"}"),
                   1);

  fx_peer_t *p = star_peer(&fx, "c1", 1);
  subscribe_frame(p, "nope", 0);
  assert_true(fx_step(&fx));
  expect_error_conv(p, "not_found", "nope");
  assert_int_equal(fx_sub_state(p, "nope"), -1);
  store_channel_t chan;
  assert_int_equal(store_channel_set_active(fx.db, "off", 0, &chan), 0);
  subscribe_frame(p, "c3", 0);
  assert_true(fx_step(&fx));
  expect_error_conv(p, "channel_inactive", "c3");
  subscribe_frame(p, "c2", 0);
  assert_true(fx_step(&fx));
  expect_subscribed(p, "c2", 0, 0, 0);
  expect_synced(p, 0, 0);
  const char *too_many = "converger_subscriptions_refused_total{reason=\"too_many_subscriptions\"}";
  assert_int_equal(metric_value(&fx, too_many), -1); /* none refused so far */
  subscribe_frame(p, "c9", 0);                       /* c1 and c2: max_subs */
  expect_error_conv(p, "too_many_subscriptions", "c9");
  assert_false(fx_step(&fx));
  assert_int_equal(metric_value(&fx, too_many), 1);
  subscribe_frame(p, "c8", 0);
  expect_error_conv(p, "too_many_subscriptions", "c8");
  assert_int_equal(metric_value(&fx, too_many), 2);
  /* a hello over max_subs is a bad_request handshake, not counted here */
  fx_peer_t *q = fx_connect(&fx);
  fx_send(q, "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"c1\"},{\"conv\":\"c2\"},"
             "{\"conv\":\"c3\"}]}");
  expect_error(q, "bad_request");
  assert_int_equal(metric_value(&fx, too_many), 2);
  assert_int_equal(metric_value(&fx, "converger_handshakes_total{result=\"bad_request\"}"), 1);
  fx_peer_free(q);
  /* bad_request: with the frame's conv when it was valid and a later
   * field was not; without one when conv itself was bad */
  fx_send(p, "{\"type\":\"subscribe\",\"conv\":\"bad conv\"}");
  json_t *e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "bad_request");
  assert_null(json_object_get(e, "conv"));
  json_decref(e);
  fx_send(p, "{\"type\":\"subscribe\",\"conv\":\"c2\",\"watermark\":-3}");
  expect_error_conv(p, "bad_request", "c2");
  fx_send(p, "{\"type\":\"subscribe\",\"conv\":\"c9\",\"watermark\":0,\"epoch\":[1]}");
  expect_error_conv(p, "bad_request", "c9");
  assert_int_equal(fx_sub_state(p, "c9"), -1);
  expect_open(p);
  fx_peer_free(narrow);
  fx_peer_free(p);
  fx_free(&fx);
}

/* FILLING a subscribe's job failed (its store deadline passed before it
 * ran) -> error unavailable with the conversation and a retry hint, the
 * subscription freed and its admission slot given back; the connection
 * stays, and the same subscribe later succeeds. */
static void test_subscribe_job_failed(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.store_timeout_ms = 100;
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 2);
  fx_peer_t *p = star_peer(&fx, "c1", 1);
  subscribe_frame(p, "c2", 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_FILLING);
  assert_int_equal(admission_in_use(fx.admission), 1);
  fx_advance(&fx, 100); /* the job's deadline passes in the queue */
  assert_true(fx_step(&fx));
  json_t *e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "unavailable");
  assert_string_equal(json_string_value(json_object_get(e, "conv")), "c2");
  assert_true(json_integer_value(json_object_get(e, "retryAfterMs")) > 0);
  json_decref(e);
  assert_int_equal(fx_sub_state(p, "c2"), -1);
  assert_int_equal(admission_in_use(fx.admission), 0);
  expect_open(p);
  fx.cfg.store_timeout_ms = 5000;
  subscribe_frame(p, "c2", 0);
  assert_true(fx_step(&fx));
  expect_subscribed(p, "c2", 2, 0, 0);
  expect_msgs(p, 1, 2);
  expect_synced(p, 2, 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_LIVE);
  fx_peer_free(p);
  fx_free(&fx);
}

/* (new) subscribe, queued -> QUEUED; slot refused at the queue timeout ->
 * unavailable with conv and a hint, no subscription, the connection open;
 * with the queue full, at once. */
static void test_subscribe_queued_then_refused(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 1, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 1);
  fx_peer_t *a = star_peer(&fx, "c1", 1);
  fx_peer_t *b = fx_connect(&fx), *c = fx_connect(&fx);
  fx_hello(b, "c1", -1); /* holds the slot */
  subscribe_frame(a, "c2", 0);
  assert_int_equal(fx_sub_state(a, "c2"), SUB_QUEUED);
  fx_hello(c, "c1", -1); /* the queue (1) is full now */
  subscribe_frame(a, "c3", 0);
  json_t *e = expect(a, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "unavailable");
  assert_string_equal(json_string_value(json_object_get(e, "conv")), "c3");
  json_decref(e);
  fx_peer_free(c);
  fx_advance(&fx, 1000);
  e = expect(a, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "unavailable");
  assert_string_equal(json_string_value(json_object_get(e, "conv")), "c2");
  assert_true(json_integer_value(json_object_get(e, "retryAfterMs")) > 0);
  json_decref(e);
  assert_int_equal(fx_sub_state(a, "c2"), -1);
  expect_open(a);
  fx_append(&fx, "c2", 2); /* not subscribed: nothing */
  fx_expect_nothing(a);
  fx_drain_pool(&fx);
  fx_peer_free(a);
  fx_peer_free(b);
  fx_free(&fx);
}

/* A subscribe sent before the welcome (the hello's job still out) waits:
 * (new) before welcome -> QUEUED, no slot taken; `subscribed` comes after
 * the welcome, never before it. */
static void test_subscribe_before_welcome(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 2);
  fx_peer_t *p = fx_connect(&fx);
  char *token = fx_token(&fx, "alice", "*");
  fx_hello_token(p, token, "c1", 0);
  free(token);
  subscribe_frame(p, "c2", 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_QUEUED);
  assert_int_equal(admission_in_use(fx.admission), 1); /* the hello's only */
  assert_int_equal(admission_waiting(fx.admission), 0);
  fx_append(&fx, "c2", 3);   /* kept */
  assert_true(fx_step(&fx)); /* the hello's job: welcome; then the subscribe's slot */
  json_decref(expect(p, "welcome"));
  expect_msgs(p, 1, 1);
  expect_synced(p, 1, 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_FILLING);
  assert_true(fx_step(&fx));
  expect_subscribed(p, "c2", 3, 0, 0);
  expect_msgs(p, 1, 3);
  expect_synced(p, 3, 0);
  fx_expect_nothing(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* A move outside the table (LIVE to RETRY has no row) is refused in every
 * build, NDEBUG's included: the state stays, the metric counts it and the
 * connection ends with 1011 (internal error), for the client to resume
 * on a fresh session. */
static void test_transition_outside_table_refused(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 2);
  fx_peer_t *p = star_peer(&fx, "c1", 2);
  sub_t *sub = session_find_sub(p->conn->session, "c1");
  assert_non_null(sub);
  assert_int_equal(sub->state, SUB_LIVE);
  assert_int_equal(sub_set_state(sub, SUB_RETRY), -CV_EINVAL);
  assert_int_equal(sub->state, SUB_LIVE);
  assert_true(metric_value(&fx, "converger_subscription_transitions_refused_total"
                                "{from=\"live\",to=\"retry\"}") == 1);
  assert_int_equal(sub_set_state(sub, SUB_QUEUED), 0); /* a row of the table: made */
  assert_int_equal(sub->state, SUB_QUEUED);
  for (json_t *js; (js = fx_recv(p));) json_decref(js);
  assert_true(p->closed);
  assert_int_equal(p->close_code, WS_CLOSE_INTERNAL_ERROR);
  metrics_reset(fx.metrics); /* seen: fx_free fails a test that leaves one */
  fx_peer_free(p);
  fx_free(&fx);
}

/* unsubscribe: of a live subscription (nothing follows `unsubscribed`), of
 * one whose job is out (its result is dropped), and an unsubscribe and a
 * subscribe again before the first job ran (only the second answers). */
static void test_unsubscribe(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 2);
  fx_conv(&fx, "ch", "c2", 2);
  fx_peer_t *p = star_peer(&fx, "c1", 2);
  unsubscribe_frame(p, "c1");
  expect_unsubscribed(p, "c1");
  assert_int_equal(fx_sub_state(p, "c1"), -1);
  fx_append(&fx, "c1", 3);
  fx_expect_nothing(p);

  subscribe_frame(p, "c2", 0);
  fx_append(&fx, "c2", 3); /* kept by the subscription under way */
  unsubscribe_frame(p, "c2");
  expect_error_conv(p, "cancelled", "c2"); /* the subscribe's answer */
  expect_unsubscribed(p, "c2");
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_drain_pool(&fx); /* the job was taken back: nothing comes of it */
  fx_expect_nothing(p);

  subscribe_frame(p, "c2", 0);
  unsubscribe_frame(p, "c2");
  expect_error_conv(p, "cancelled", "c2");
  expect_unsubscribed(p, "c2");
  subscribe_frame(p, "c2", 1);
  fx_drain_pool(&fx);
  expect_subscribed(p, "c2", 3, 0, 0);
  expect_msgs(p, 2, 3);
  expect_synced(p, 3, 0);
  fx_expect_nothing(p);
  unsubscribe_frame(p, "c9"); /* never subscribed: answered all the same */
  expect_unsubscribed(p, "c9");
  fx_peer_free(p);
  fx_free(&fx);
}

/* Issue 31, item 5: every subscribe gets exactly one answer that names
 * it. An unsubscribe that overtakes it (its store job out, waiting for a
 * slot, before the welcome; a second subscribe of the same conversation
 * under way too; an operator's unsubscribe) is answered `error cancelled`
 * with its conv, then `unsubscribed`, and nothing of the subscribe comes
 * after. */
static void test_unsubscribe_answers_the_subscribe(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 2);
  fx_peer_t *p = star_peer(&fx, "c1", 1);

  /* its store job out (FILLING), and a second subscribe under way: each
   * is answered cancelled */
  subscribe_frame(p, "c2", 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_FILLING);
  subscribe_frame(p, "c2", 0);
  fx_expect_nothing(p);
  unsubscribe_frame(p, "c2");
  json_t *e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "cancelled");
  assert_string_equal(json_string_value(json_object_get(e, "conv")), "c2");
  assert_null(json_object_get(e, "retryAfterMs"));
  json_decref(e);
  expect_error_conv(p, "cancelled", "c2");
  expect_unsubscribed(p, "c2");
  assert_int_equal(admission_in_use(fx.admission), 0);
  assert_int_equal(fx_drain_pool(&fx), 0); /* the job was taken back */
  fx_append(&fx, "c2", 3);
  fx_expect_nothing(p);

  /* waiting for a slot (QUEUED): another hello holds the only one */
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", -1);
  subscribe_frame(p, "c2", 0);
  assert_int_equal(fx_sub_state(p, "c2"), SUB_QUEUED);
  assert_int_equal(admission_waiting(fx.admission), 1);
  unsubscribe_frame(p, "c2");
  expect_error_conv(p, "cancelled", "c2");
  expect_unsubscribed(p, "c2");
  assert_int_equal(admission_waiting(fx.admission), 0);
  fx_drain_pool(&fx); /* b's hello */
  fx_advance(&fx, 1000);
  fx_expect_nothing(p);
  fx_peer_free(b);

  /* an operator's unsubscribe (POST /admin/users/{user}/unsubscribe) of a
   * subscribe under way, and of a live subscription: no error for that one */
  subscribe_frame(p, "c2", 0);
  assert_int_equal(session_unsubscribe_user(&fx.sessions, "alice", "c2"), 1);
  expect_error_conv(p, "cancelled", "c2");
  expect_unsubscribed(p, "c2");
  assert_int_equal(fx_drain_pool(&fx), 0);
  assert_int_equal(session_unsubscribe_user(&fx.sessions, "alice", "c1"), 1);
  expect_unsubscribed(p, "c1");
  fx_expect_nothing(p);

  /* answered, then unsubscribed: no error */
  subscribe_at_head(&fx, p, "c2", 3);
  unsubscribe_frame(p, "c2");
  expect_unsubscribed(p, "c2");
  expect_open(p);

  /* before the welcome: the hello's job still out */
  fx_peer_t *q = fx_connect(&fx);
  char *token = fx_token(&fx, "bob", "*");
  fx_hello_token(q, token, "c1", 0);
  free(token);
  subscribe_frame(q, "c2", 0);
  assert_int_equal(fx_sub_state(q, "c2"), SUB_QUEUED);
  unsubscribe_frame(q, "c2");
  expect_error_conv(q, "cancelled", "c2");
  expect_unsubscribed(q, "c2");
  assert_true(fx_step(&fx));
  json_decref(expect(q, "welcome"));
  expect_msgs(q, 1, 1);
  expect_synced(q, 1, 0);
  fx_drain_pool(&fx);
  fx_expect_nothing(q); /* no subscribed after the welcome */
  fx_peer_free(q);
  fx_peer_free(p);
  fx_free(&fx);
}

/* Issue 31, item 5: every subscribe frame gets its own answer naming its
 * conv, also one sent while the subscription is still being made, by a
 * subscribe or by the hello (before the welcome), in the order sent:
 * `subscribed` with "already" once that one is answered, its head what
 * the connection had delivered then; the same refusal when it is refused;
 * `cancelled` when an unsubscribe ends it (docs/protocol.md 4.5, 4.6). */
static void test_every_subscribe_answered(void **state) {
  fx_t fx;
  fx_options_t o = {.slots = 1, .queue_max = 4, .queue_ms = 1000};
  fx_init(&fx, &o);
  fx_conv(&fx, "ch", "c1", 2);
  fx_conv(&fx, "ch", "c2", 3);
  fx_conv(&fx, "ch", "c3", 1);
  char *token = fx_token(&fx, "alice", "*");

  /* made by the hello, its job still out: the welcome answers the hello,
   * then "already" the subscribe, before the replay */
  fx_peer_t *p = fx_connect(&fx);
  fx_hello_token(p, token, "c1", 0);
  subscribe_frame(p, "c1", 0);
  fx_expect_nothing(p);
  assert_true(fx_step(&fx));
  json_decref(expect(p, "welcome"));
  expect_subscribed(p, "c1", 0, 0, 1);
  expect_msgs(p, 1, 2);
  expect_synced(p, 2, 0);
  fx_expect_nothing(p);

  /* made by the hello, then a subscribe and an unsubscribe before the
   * welcome: cancelled answers the subscribe, unsubscribed the unsubscribe,
   * and the welcome has no entry for it */
  fx_peer_t *q = fx_connect(&fx);
  fx_hello_token(q, token, "c1", 0);
  subscribe_frame(q, "c1", 0);
  assert_int_equal(fx_sub_state(q, "c1"), SUB_FILLING);
  unsubscribe_frame(q, "c1");
  expect_error_conv(q, "cancelled", "c1");
  expect_unsubscribed(q, "c1");
  assert_true(fx_step(&fx));
  json_t *w = expect(q, "welcome");
  assert_int_equal(json_array_size(json_object_get(w, "subs")), 0);
  json_decref(w);
  fx_append(&fx, "c1", 3);
  expect_msgs(p, 3, 3);
  fx_expect_nothing(q);

  /* the hello's entry refused: its error, then the subscribe's */
  fx_peer_t *r = fx_connect(&fx);
  fx_hello_token(r, token, "c9", 0);
  subscribe_frame(r, "c9", 0);
  assert_true(fx_step(&fx));
  expect_error_conv(r, "not_found", "c9");
  expect_error_conv(r, "not_found", "c9");
  json_decref(expect(r, "welcome"));
  fx_expect_nothing(r);

  /* a subscribe's store job out, and a second one: subscribed, then
   * "already" from the watermark delivered so far, then the replay */
  subscribe_frame(p, "c2", 1);
  subscribe_frame(p, "c2", 1);
  fx_expect_nothing(p);
  assert_true(fx_step(&fx));
  expect_subscribed(p, "c2", 3, 0, 0);
  expect_subscribed(p, "c2", 1, 0, 1);
  expect_msgs(p, 2, 3);
  expect_synced(p, 3, 0);
  subscribe_frame(p, "c2", 0); /* answered already: at once */
  expect_subscribed(p, "c2", 3, 0, 1);
  fx_expect_nothing(p);
  assert_false(fx_step(&fx));

  /* refused by the store read: each gets the refusal */
  subscribe_frame(p, "c9", 0);
  subscribe_frame(p, "c9", 0);
  assert_true(fx_step(&fx));
  expect_error_conv(p, "not_found", "c9");
  expect_error_conv(p, "not_found", "c9");
  fx_expect_nothing(p);

  /* waiting for a slot, refused at the queue's timeout: each gets
   * unavailable with a retry hint */
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", -1); /* holds the only slot */
  subscribe_frame(p, "c3", 0);
  subscribe_frame(p, "c3", 0);
  assert_int_equal(fx_sub_state(p, "c3"), SUB_QUEUED);
  fx_expect_nothing(p);
  fx_advance(&fx, 1000);
  for (int i = 0; i < 2; i++) {
    json_t *e = expect(p, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "unavailable");
    assert_string_equal(json_string_value(json_object_get(e, "conv")), "c3");
    assert_true(json_integer_value(json_object_get(e, "retryAfterMs")) > 0);
    json_decref(e);
  }
  assert_int_equal(fx_sub_state(p, "c3"), -1);
  fx_expect_nothing(p);
  expect_open(p);
  fx_drain_pool(&fx);

  /* a refresh whose token no longer covers it, its job out: forbidden
   * for each, then unsubscribed (and one forbidden for a live one) */
  subscribe_frame(p, "c3", 0);
  subscribe_frame(p, "c3", 0);
  assert_int_equal(fx_sub_state(p, "c3"), SUB_FILLING);
  char *narrow = fx_token(&fx, "alice", "c1"), text[2048];
  snprintf(text, sizeof text, "{\"type\":\"refresh\",\"token\":\"%s\"}", narrow);
  free(narrow);
  fx_send(p, text);
  json_decref(expect(p, "refreshed"));
  expect_error_conv(p, "forbidden", "c3"); /* the newest subscription first */
  expect_error_conv(p, "forbidden", "c3");
  expect_unsubscribed(p, "c3");
  expect_error_conv(p, "forbidden", "c2");
  expect_unsubscribed(p, "c2");
  fx_expect_nothing(p);
  assert_int_equal(fx_drain_pool(&fx), 0); /* the job was taken back */
  fx_expect_nothing(p);
  free(token);
  fx_peer_free(b);
  fx_peer_free(r);
  fx_peer_free(q);
  fx_peer_free(p);
  fx_free(&fx);
}

/* A refresh with a narrower token: refreshed with its expiresInMs, then
 * forbidden and unsubscribed for what it no longer covers; a token of
 * another user is refused, the connection stays; a bad one closes 1008. */
static void test_refresh(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 1);
  fx_conv(&fx, "ch", "c2", 1);
  fx_peer_t *p = star_peer(&fx, "c1", 1);
  subscribe_at_head(&fx, p, "c2", 1);
  char *narrow = fx_token(&fx, "alice", "c1"), text[2048];
  snprintf(text, sizeof text, "{\"type\":\"refresh\",\"token\":\"%s\"}", narrow);
  fx_send(p, text);
  json_t *r = expect(p, "refreshed");
  int64_t left = json_integer_value(json_object_get(r, "expiresInMs"));
  assert_true(left > 3598000 && left <= 3600000);
  json_decref(r);
  expect_error_conv(p, "forbidden", "c2");
  expect_unsubscribed(p, "c2");
  fx_append(&fx, "c2", 2);
  fx_append(&fx, "c1", 2);
  expect_msgs(p, 2, 2); /* c1's only */
  fx_expect_nothing(p);
  subscribe_frame(p, "c2", -1); /* the new scope applies to subscribes too */
  expect_error_conv(p, "forbidden", "c2");
  free(narrow);

  char *bob = fx_token(&fx, "bob", "*");
  snprintf(text, sizeof text, "{\"type\":\"refresh\",\"token\":\"%s\"}", bob);
  fx_send(p, text); /* within the second: over the refresh rate (1/s, burst 1) */
  json_t *e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "rate_limited");
  assert_true(json_integer_value(json_object_get(e, "retryAfterMs")) > 0);
  json_decref(e);
  fx_advance(&fx, 1000);
  fx_send(p, text);
  expect_error(p, "forbidden");
  expect_open(p);
  free(bob);
  fx_advance(&fx, 1000);
  fx_send(p, "{\"type\":\"refresh\",\"token\":\"not-a-token\"}");
  expect_error(p, "unauthorized");
  assert_null(next(p));
  assert_int_equal(p->close_code, WS_CLOSE_POLICY_VIOLATION);
  fx_peer_free(p);
  fx_free(&fx);
}

/* The token's exp passes: welcome's expiresInMs, then the leeway, then
 * error token_expired and close 1008 "token_expired"; a refresh before
 * keeps the connection. */
static void test_token_expiry(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.token_leeway_ms = 5000;
  fx.cfg.heartbeat_ms = 3600000; /* no heartbeat close in the way */
  fx_conv(&fx, "ch", "c1", 0);
  fx_peer_t *p[2];
  int64_t left[2];
  for (int k = 0; k < 2; k++) {
    p[k] = fx_connect(&fx);
    char *token = fx_token_ttl(&fx, "alice", "c1", 3);
    fx_hello_token(p[k], token, "c1", -1);
    free(token);
    assert_true(fx_step(&fx));
    json_t *w = expect(p[k], "welcome");
    left[k] = json_integer_value(json_object_get(w, "expiresInMs"));
    assert_true(left[k] > 1000 && left[k] <= 3000);
    json_decref(w);
    expect_synced(p[k], 0, 0);
  }
  char *fresh = fx_token(&fx, "alice", "c1"), text[2048];
  snprintf(text, sizeof text, "{\"type\":\"refresh\",\"token\":\"%s\"}", fresh);
  fx_send(p[1], text);
  json_decref(expect(p[1], "refreshed"));
  free(fresh);
  int64_t first = left[0] < left[1] ? left[0] : left[1];
  fx_advance(&fx, (uint64_t)first + 5000 - 1000);
  expect_open(p[0]);
  fx_advance(&fx, (uint64_t)(left[0] - first) + 1000);
  expect_error(p[0], "token_expired");
  assert_null(next(p[0]));
  assert_int_equal(p[0]->close_code, WS_CLOSE_POLICY_VIOLATION);
  assert_string_equal(p[0]->close_reason, "token_expired");
  fx_advance(&fx, 10000);
  expect_open(p[1]);
  fx_peer_free(p[0]);
  fx_peer_free(p[1]);
  fx_free(&fx);
}

static void send_frame(fx_peer_t *p, const char *conv, const char *id) {
  char text[256];
  snprintf(text, sizeof text, "{\"type\":\"send\",\"conv\":\"%s\",\"id\":\"%s\",\"body\":{}}", conv,
           id);
  fx_send(p, text);
}

/* A token of `user` with `convs` (JSON array text), `scope` (JSON array
 * text; NULL: none, read and write) and `jti`, signed with the fixture's
 * secret, valid for an hour: heap. */
static char *scoped_token(const char *user, const char *convs, const char *scope, const char *jti) {
  jwt_t *jwt = NULL;
  char grants[512];
  snprintf(grants, sizeof grants, "{\"convs\":%s%s%s}", convs, scope ? ",\"scope\":" : "",
           scope ? scope : "");
  assert_int_equal(jwt_new(&jwt), 0);
  assert_int_equal(jwt_add_grant(jwt, "sub", user), 0);
  assert_int_equal(jwt_add_grant(jwt, "jti", jti), 0);
  assert_int_equal(jwt_add_grant_int(jwt, "exp", (long)(util_now_ms() / 1000 + 3600)), 0);
  assert_int_equal(jwt_add_grants_json(jwt, grants), 0);
  assert_int_equal(
      jwt_set_alg(jwt, JWT_ALG_HS256, (const unsigned char *)FX_SECRET, (int)strlen(FX_SECRET)), 0);
  char *token = jwt_encode_str(jwt);
  jwt_free(jwt);
  assert_non_null(token);
  return token;
}

/* What the session keeps of its token (its own compact copy, token.c):
 * every conversation of a convs list of several, the scope, and across a
 * refresh the new list, scope and jti with the same client id and user. */
static void test_token_convs_scope_across_refresh(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx_conv(&fx, "ch", "c1", 0);
  fx_conv(&fx, "ch", "c2", 0);
  fx_conv(&fx, "ch", "c3", 0);
  fx_peer_t *p = fx_connect(&fx);
  char *token = scoped_token("alice", "[\"c1\", \"c3\"]", "[\"read\"]", "jti-first");
  char text[2048];
  snprintf(text, sizeof text,
           "{\"type\":\"hello\",\"token\":\"%s\",\"clientId\":\"tab-7\",\"subs\":["
           "{\"conv\":\"c1\",\"watermark\":null},{\"conv\":\"c2\",\"watermark\":null},"
           "{\"conv\":\"c3\",\"watermark\":null}]}",
           token);
  free(token);
  fx_send(p, text);
  expect_error_conv(p, "forbidden", "c2");
  assert_true(fx_step(&fx));
  json_t *w = expect(p, "welcome");
  assert_string_equal(json_string_value(json_object_get(w, "clientId")), "tab-7");
  json_t *subs = json_object_get(w, "subs");
  assert_int_equal(json_array_size(subs), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(subs, 0), "conv")), "c1");
  assert_string_equal(json_string_value(json_object_get(json_array_get(subs, 1), "conv")), "c3");
  json_decref(w);
  expect_synced(p, 0, 0);
  expect_synced(p, 0, 0);
  send_frame(p, "c3", "m-read-only"); /* a read scope: no send */
  expect_error_conv(p, "forbidden", "c3");

  token = scoped_token("alice", "[\"c3\", \"c2\"]", NULL, "jti-second");
  snprintf(text, sizeof text, "{\"type\":\"refresh\",\"token\":\"%s\"}", token);
  free(token);
  fx_send(p, text);
  json_decref(expect(p, "refreshed"));
  expect_error_conv(p, "forbidden", "c1");
  expect_unsubscribed(p, "c1");
  session_t *s = p->conn->session;
  assert_string_equal(s->client_id, "tab-7");
  assert_string_equal(s->user, "alice");
  assert_string_equal(s->jti, "jti-second");
  assert_int_equal(users_count(fx.sessions.users, "alice"), 1);
  send_frame(p, "c3", "m-1"); /* read and write now */
  fx_drain_pool(&fx);
  json_t *a = next(p), *b = next(p);
  assert_true((is_type(a, "sent") && is_type(b, "msg")) ||
              (is_type(a, "msg") && is_type(b, "sent")));
  json_decref(a);
  json_decref(b);
  subscribe_at_head(&fx, p, "c2", 0);            /* the second conversation of the new list */
  session_revoke_jti(&fx.sessions, "jti-first"); /* the old token's: not this connection's now */
  expect_open(p);
  session_revoke_jti(&fx.sessions, "jti-second");
  expect_error(p, "unauthorized");
  assert_null(next(p));
  assert_int_equal(p->close_code, WS_CLOSE_POLICY_VIOLATION);
  fx_peer_free(p);
  fx_run(&fx);
  assert_int_equal(users_count(fx.sessions.users, "alice"), 0);
  fx_free(&fx);
}

/* The send bucket (rate 2, burst 2): the third and fourth sends at once
 * are refused with rate_limited, their ids, the bucket's name and hints
 * one interval of the rate apart (their turns); after its hint the third
 * goes through. The subscribe bucket counts sync too. */
static void test_rate_limits(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.rate_send = 2;
  fx.cfg.rate_send_burst = 2;
  fx.cfg.rate_subscribe = 1;
  fx.cfg.rate_subscribe_burst = 1;
  fx_conv(&fx, "ch", "c1", 1);
  fx_peer_t *p = live_peer(&fx, "c1", 1, 1);
  send_frame(p, "c1", "a");
  send_frame(p, "c1", "b");
  send_frame(p, "c1", "c");
  send_frame(p, "c1", "d");
  json_t *e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "rate_limited");
  assert_string_equal(json_string_value(json_object_get(e, "conv")), "c1");
  json_t *d = json_object_get(e, "details");
  assert_string_equal(json_string_value(json_object_get(d, "frame")), "send");
  assert_string_equal(json_string_value(json_object_get(d, "id")), "c");
  int64_t hint = json_integer_value(json_object_get(e, "retryAfterMs"));
  assert_true(hint > 0 && hint <= 500);
  json_decref(e);
  e = expect(p, "error"); /* the next refused frame's turn: one interval of the rate later */
  assert_string_equal(json_string_value(json_object_get(json_object_get(e, "details"), "id")), "d");
  assert_int_equal(json_integer_value(json_object_get(e, "retryAfterMs")), hint + 500);
  json_decref(e);
  fx_drain_pool(&fx);
  for (int k = 0; k < 4; k++) { /* a, b: sent and delivered (seq 2, 3), in some order */
    json_t *js = next(p);
    assert_non_null(js);
    assert_true(is_type(js, "sent") || is_type(js, "msg"));
    json_decref(js);
  }
  fx_advance(&fx, (uint64_t)hint);
  send_frame(p, "c1", "c");
  fx_drain_pool(&fx);
  json_t *a = next(p), *b = next(p);
  assert_true((is_type(a, "sent") && is_type(b, "msg")) ||
              (is_type(a, "msg") && is_type(b, "sent")));
  json_decref(a);
  json_decref(b);
  sync_frame(p, "c1", 4, NULL);
  fx_drain_pool(&fx);
  expect_synced(p, 4, 0);
  sync_frame(p, "c1", 4, NULL);
  e = expect(p, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "rate_limited");
  assert_string_equal(json_string_value(json_object_get(json_object_get(e, "details"), "frame")),
                      "subscribe");
  json_decref(e);
  expect_open(p);
  fx_peer_free(p);
  fx_free(&fx);
}

/* Sustained abuse: at least rate_abuse_factor x the rate in every second
 * for rate_abuse_ms closes the connection with 1008 rate_limited; the
 * same rate for a second less does not. */
static void test_rate_abuse_closes(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.heartbeat_ms = 3600000;
  fx.cfg.rate_refresh = 1;
  fx.cfg.rate_refresh_burst = 1;
  fx.cfg.rate_abuse_factor = 3;
  fx.cfg.rate_abuse_ms = 3000;
  fx_conv(&fx, "ch", "c1", 0);
  fx_peer_t *p = live_peer(&fx, "c1", 0, 0);
  char *token = fx_token(&fx, "alice", "c1"), text[2048];
  snprintf(text, sizeof text, "{\"type\":\"refresh\",\"token\":\"%s\"}", token);
  free(token);
  fx_advance(&fx, 1000 - fx.now % 1000); /* at the start of a second */
  for (int sec = 0; sec < 3; sec++) {    /* 3 whole seconds at 3 a second */
    for (int k = 0; k < 3; k++) fx_send(p, text);
    json_decref(expect(p, "refreshed"));
    expect_error(p, "rate_limited");
    expect_error(p, "rate_limited");
    fx_advance(&fx, 1000);
  }
  expect_open(p);
  fx_send(p, text); /* the fourth second: the 3 seconds before were all abuse */
  json_decref(expect(p, "refreshed"));
  fx_send(p, text);
  expect_error(p, "rate_limited");
  fx_send(p, text);
  expect_error(p, "rate_limited");
  assert_null(next(p));
  assert_int_equal(p->close_code, WS_CLOSE_POLICY_VIOLATION);
  assert_string_equal(p->close_reason, "rate_limited");
  fx_peer_free(p);
  fx_free(&fx);
}

/* max_conns_per_user 1: a second connection of the same user is refused
 * at hello (too_many_connections, 1008); another user's is not; once the
 * first is gone the user may connect again. */
static void test_conns_per_user(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  fx.cfg.max_conns_per_user = 1;
  fx_conv(&fx, "ch", "c1", 0);
  fx_peer_t *a = live_peer(&fx, "c1", 0, 0);
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", 0);
  expect_error(b, "too_many_connections");
  assert_null(next(b));
  assert_int_equal(b->close_code, WS_CLOSE_POLICY_VIOLATION);
  assert_string_equal(b->close_reason, "too_many_connections");
  fx_peer_t *bob = fx_connect(&fx);
  char *token = fx_token(&fx, "bob", "c1");
  fx_hello_token(bob, token, "c1", 0);
  free(token);
  assert_true(fx_step(&fx));
  json_decref(expect(bob, "welcome"));
  fx_peer_free(a);
  fx_run(&fx);
  fx_peer_t *again = live_peer(&fx, "c1", 0, 0);
  fx_peer_free(again);
  fx_peer_free(b);
  fx_peer_free(bob);
  fx_free(&fx);
}

/* ---- v1.2: presence and signals ------------------------------------------------ */

#define GRACE_MS 5000 /* cfg.presence_grace_ms's default, the fixture's table's */

/* A channel `ch` with `flags` (STORE_CHANNEL_*) and conversation `conv` in
 * it, without messages. */
static void conv_with(fx_t *fx, const char *ch, unsigned flags, const char *conv) {
  int r = store_channel_create(fx->db, ch, ch, flags, NULL);
  assert_true(r == 0 || r == -CV_EEXISTS);
  assert_int_equal(store_conv_create(fx->db, conv, ch, NULL), 0);
}

/* A client `client` of `user` (a token for every conversation) whose hello
 * made it live on the empty `conv`, its subscription asking for presence
 * events `events` (JSON text: true, "clients", ...; NULL: none). */
static fx_peer_t *member(fx_t *fx, const char *user, const char *client, const char *conv,
                         const char *events) {
  fx_peer_t *p = fx_connect(fx);
  char *token = fx_token(fx, user, "*");
  char text[2048];
  snprintf(text, sizeof text,
           "{\"type\":\"hello\",\"token\":\"%s\",\"clientId\":\"%s\",\"subs\":[{\"conv\":\"%s\","
           "\"watermark\":null%s%s}]}",
           token, client, conv, events ? ",\"presenceEvents\":" : "", events ? events : "");
  free(token);
  fx_send(p, text);
  assert_true(fx_step(fx));
  json_t *w = expect(p, "welcome");
  assert_string_equal(json_string_value(json_object_get(w, "clientId")), client);
  json_decref(w);
  expect_synced(p, 0, 0);
  assert_int_equal(fx_sub_state(p, conv), SUB_LIVE);
  return p;
}

/* A join or leave frame for `user`'s `client` in `conv`. */
static void expect_event(fx_peer_t *p, const char *type, const char *conv, const char *user,
                         const char *client) {
  json_t *e = expect(p, type);
  assert_string_equal(json_string_value(json_object_get(e, "conv")), conv);
  assert_string_equal(json_string_value(json_object_get(e, "user")), user);
  assert_string_equal(json_string_value(json_object_get(e, "client")), client);
  json_decref(e);
}

/* The fake clock `ms` on, then the node's presence tick at it. */
static void advance_presence(fx_t *fx, uint64_t ms) {
  fx_advance(fx, ms);
  session_presence_tick(&fx->sessions, fx->now);
  fx_run(fx);
}

static void close_peer(fx_t *fx, fx_peer_t *p) {
  fx_peer_free(p);
  fx_run(fx);
}

/* Two users' clients on a channel with presence: the first is told of the
 * second's join, neither of its own; the second's reconnect with the same
 * clientId within the grace is neither a leave nor a join (and the grace
 * it was in does not end it later); once it is gone for the whole grace,
 * its leave, to the first only. */
static void test_presence_join_reconnect_leave(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  assert_int_equal(fx.cfg.presence_grace_ms, GRACE_MS);
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "p1", "true");
  fx_expect_nothing(a); /* not its own join */
  /* a watcher of every client's events, for what a user's edges hide */
  fx_peer_t *w = member(&fx, "walt", "tab-w", "p1", "\"clients\"");
  expect_event(a, "join", "p1", "walt", "tab-w");
  fx_peer_t *b = member(&fx, "bob", "tab-b", "p1", "true");
  expect_event(a, "join", "p1", "bob", "tab-b");
  expect_event(w, "join", "p1", "bob", "tab-b");
  fx_expect_nothing(a);
  fx_expect_nothing(w);
  fx_expect_nothing(b); /* not its own join, nor those of before */

  close_peer(&fx, b);
  advance_presence(&fx, GRACE_MS - 1000);
  fx_expect_nothing(a);
  fx_expect_nothing(w);
  b = member(&fx, "bob", "tab-b", "p1", "true"); /* back within the grace */
  fx_expect_nothing(a);                          /* no join */
  fx_expect_nothing(w);
  advance_presence(&fx, 2000); /* past the first grace's end */
  fx_expect_nothing(a);        /* no leave */
  fx_expect_nothing(w);
  fx_expect_nothing(b);

  close_peer(&fx, b);
  advance_presence(&fx, GRACE_MS - 1);
  fx_expect_nothing(a);
  fx_expect_nothing(w);
  advance_presence(&fx, 1);
  expect_event(a, "leave", "p1", "bob", "tab-b");
  expect_event(w, "leave", "p1", "bob", "tab-b");
  fx_expect_nothing(a);
  fx_expect_nothing(w);
  assert_false(presence_has(fx.sessions.presence, "p1", "bob", "tab-b"));
  assert_int_equal(presence_entries(fx.sessions.presence), 4); /* tab-a, alice, tab-w, walt */
  /* after its leave, the same client joins again */
  b = member(&fx, "bob", "tab-b", "p1", "true");
  expect_event(a, "join", "p1", "bob", "tab-b");
  expect_event(w, "join", "p1", "bob", "tab-b");
  close_peer(&fx, b);
  close_peer(&fx, w);
  close_peer(&fx, a);
  advance_presence(&fx, GRACE_MS);
  assert_int_equal(presence_entries(fx.sessions.presence), 0);
  fx_free(&fx);
}

/* A drain move: the new connection of a client is welcomed before the old
 * one closes; nothing is told, and the grace starts with the last one. */
static void test_presence_drain_move_is_silent(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "p1", "\"clients\"");
  fx_peer_t *b = member(&fx, "bob", "tab-b", "p1", NULL);
  expect_event(a, "join", "p1", "bob", "tab-b");
  fx_peer_t *b2 = member(&fx, "bob", "tab-b", "p1", NULL); /* the same client, a second conn */
  close_peer(&fx, b);
  advance_presence(&fx, GRACE_MS * 2);
  fx_expect_nothing(a);
  close_peer(&fx, b2);
  advance_presence(&fx, GRACE_MS);
  expect_event(a, "leave", "p1", "bob", "tab-b");
  fx_expect_nothing(a);
  close_peer(&fx, a);
  fx_free(&fx);
}

/* Two users naming one clientId are two clients: alice's and bob's "tab"
 * each join (told to the watcher, and bob's to alice: "not its own"
 * is the same user's same client), both are listed, and each leaves on
 * its own after its grace. */
static void test_presence_two_users_one_client_id(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  fx_peer_t *w = member(&fx, "walt", "tab-w", "p1", "\"clients\"");
  fx_peer_t *a = member(&fx, "alice", "tab", "p1", "true");
  expect_event(w, "join", "p1", "alice", "tab");
  fx_expect_nothing(a); /* its own */
  fx_peer_t *b = member(&fx, "bob", "tab", "p1", "true");
  expect_event(w, "join", "p1", "bob", "tab");
  expect_event(a, "join", "p1", "bob", "tab"); /* the same clientId, another user's */
  fx_expect_nothing(w);
  fx_expect_nothing(a);
  fx_expect_nothing(b);
  assert_true(presence_has(fx.sessions.presence, "p1", "alice", "tab"));
  assert_true(presence_has(fx.sessions.presence, "p1", "bob", "tab"));
  assert_int_equal(presence_entries(fx.sessions.presence), 6);

  fx_send(w, "{\"type\":\"presence\",\"conv\":\"p1\"}");
  json_t *pg = expect(w, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 3);
  json_t *ms = json_object_get(pg, "members");
  assert_int_equal(json_array_size(ms), 3);
  const char *order[] = {"alice", "bob", "walt"};
  for (size_t i = 0; i < 3; i++) {
    json_t *m = json_array_get(ms, i);
    assert_string_equal(json_string_value(json_object_get(m, "user")), order[i]);
    assert_int_equal(json_integer_value(json_object_get(m, "clients")), 1);
  }
  json_decref(pg);

  close_peer(&fx, a);
  advance_presence(&fx, GRACE_MS - 1);
  fx_expect_nothing(w);
  fx_expect_nothing(b);
  advance_presence(&fx, 1);
  expect_event(w, "leave", "p1", "alice", "tab");
  expect_event(b, "leave", "p1", "alice", "tab");
  fx_expect_nothing(w);
  fx_expect_nothing(b);
  assert_false(presence_has(fx.sessions.presence, "p1", "alice", "tab"));
  assert_true(presence_has(fx.sessions.presence, "p1", "bob", "tab"));
  fx_send(w, "{\"type\":\"presence\",\"conv\":\"p1\"}");
  pg = expect(w, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 2);
  ms = json_object_get(pg, "members");
  assert_int_equal(json_array_size(ms), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(ms, 0), "user")), "bob");
  json_decref(pg);

  close_peer(&fx, b);
  advance_presence(&fx, GRACE_MS - 1);
  fx_expect_nothing(w);
  advance_presence(&fx, 1);
  expect_event(w, "leave", "p1", "bob", "tab");
  fx_expect_nothing(w);
  assert_int_equal(presence_entries(fx.sessions.presence), 2); /* tab-w, walt */
  close_peer(&fx, w);
  advance_presence(&fx, GRACE_MS);
  assert_int_equal(presence_entries(fx.sessions.presence), 0);
  fx_free(&fx);
}

/* presenceEvents: true ("users") tells a user's first join and last leave
 * only; "clients" every client's; none (absent) nothing. */
static void test_presence_events_users_and_clients(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  fx_peer_t *users = member(&fx, "u-watch", "w-1", "p1", "\"users\"");
  fx_peer_t *clients = member(&fx, "c-watch", "w-2", "p1", "\"clients\"");
  fx_peer_t *none = member(&fx, "n-watch", "w-3", "p1", NULL);
  expect_event(users, "join", "p1", "c-watch", "w-2");
  expect_event(users, "join", "p1", "n-watch", "w-3");
  expect_event(clients, "join", "p1", "n-watch", "w-3");
  fx_expect_nothing(none);

  fx_peer_t *k1 = member(&fx, "kim", "k-1", "p1", NULL);
  expect_event(users, "join", "p1", "kim", "k-1");
  expect_event(clients, "join", "p1", "kim", "k-1");
  fx_peer_t *k2 = member(&fx, "kim", "k-2", "p1", NULL); /* kim's second client */
  fx_expect_nothing(users);
  expect_event(clients, "join", "p1", "kim", "k-2");
  close_peer(&fx, k1);
  advance_presence(&fx, GRACE_MS);
  fx_expect_nothing(users); /* kim is still here through k-2 */
  expect_event(clients, "leave", "p1", "kim", "k-1");
  close_peer(&fx, k2);
  advance_presence(&fx, GRACE_MS);
  expect_event(users, "leave", "p1", "kim", "k-2");
  expect_event(clients, "leave", "p1", "kim", "k-2");
  fx_expect_nothing(users);
  fx_expect_nothing(clients);
  fx_expect_nothing(none);

  close_peer(&fx, users);
  close_peer(&fx, clients);
  close_peer(&fx, none);
  fx_free(&fx);
}

/* A presence frame is answered from the table: count, members in user
 * order with their clients and since, a cursor while more follow, pages
 * with limit and cursor, the count alone with members false. */
static void test_presence_frame_pages(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  fx_peer_t *c = member(&fx, "carol", "c-1", "p1", NULL);
  fx_peer_t *a1 = member(&fx, "alice", "a-1", "p1", NULL);
  fx_peer_t *a2 = member(&fx, "alice", "a-2", "p1", NULL);
  fx_peer_t *b = member(&fx, "bob", "b-1", "p1", NULL);
  int64_t before = util_now_ms();

  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\"}");
  json_t *pg = expect(c, "presence");
  assert_string_equal(json_string_value(json_object_get(pg, "conv")), "p1");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 3);
  assert_true(json_is_null(json_object_get(pg, "cursor")));
  assert_null(json_object_get(pg, "truncated"));
  json_t *ms = json_object_get(pg, "members");
  assert_int_equal(json_array_size(ms), 3);
  const char *order[] = {"alice", "bob", "carol"};
  const int clients[] = {2, 1, 1};
  for (size_t i = 0; i < 3; i++) {
    json_t *m = json_array_get(ms, i);
    assert_string_equal(json_string_value(json_object_get(m, "user")), order[i]);
    assert_int_equal(json_integer_value(json_object_get(m, "clients")), clients[i]);
    int64_t since = json_integer_value(json_object_get(m, "since"));
    assert_true(since > 0 && since <= before);
  }
  json_decref(pg);

  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"limit\":2}");
  pg = expect(c, "presence");
  assert_int_equal(json_array_size(json_object_get(pg, "members")), 2);
  assert_string_equal(json_string_value(json_object_get(pg, "cursor")), "bob");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 3);
  json_decref(pg);
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"limit\":2,\"cursor\":\"bob\"}");
  pg = expect(c, "presence");
  ms = json_object_get(pg, "members");
  assert_int_equal(json_array_size(ms), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(ms, 0), "user")), "carol");
  assert_true(json_is_null(json_object_get(pg, "cursor")));
  json_decref(pg);

  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"members\":false}");
  pg = expect(c, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 3);
  assert_null(json_object_get(pg, "members"));
  assert_null(json_object_get(pg, "cursor"));
  json_decref(pg);

  /* max_presence: users past it are counted, not listed (truncated) */
  fx.cfg.max_presence = 2;
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\"}");
  pg = expect(c, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 3);
  assert_int_equal(json_array_size(json_object_get(pg, "members")), 2);
  assert_true(json_is_null(json_object_get(pg, "cursor")));
  assert_true(json_is_true(json_object_get(pg, "truncated")));
  json_decref(pg);
  fx.cfg.max_presence = 1000;

  /* a client in its grace is still listed */
  close_peer(&fx, b);
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"members\":false}");
  pg = expect(c, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 3);
  json_decref(pg);
  advance_presence(&fx, GRACE_MS);
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"members\":false}");
  pg = expect(c, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 2);
  json_decref(pg);
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"limit\":0}");
  expect_error(c, "bad_request");
  expect_open(c);
  close_peer(&fx, a1);
  close_peer(&fx, a2);
  close_peer(&fx, c);
  fx_free(&fx);
}

/* presence on a channel without it: presence_disabled (and nobody is in
 * the table); for a conversation not subscribed: not_subscribed. The
 * connection stays open. */
static void test_presence_refusals(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "plain", 0, "n1");
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "n1", "true");
  fx_peer_t *b = member(&fx, "bob", "tab-b", "n1", "true");
  fx_expect_nothing(a); /* no presence, no join */
  assert_int_equal(presence_entries(fx.sessions.presence), 0);
  fx_send(a, "{\"type\":\"presence\",\"conv\":\"n1\"}");
  expect_error_conv(a, "presence_disabled", "n1");
  fx_send(a, "{\"type\":\"presence\",\"conv\":\"p1\"}");
  expect_error_conv(a, "not_subscribed", "p1");
  fx_send(a, "{\"type\":\"presence\",\"conv\":\"nowhere\"}");
  expect_error_conv(a, "not_subscribed", "nowhere");
  expect_open(a);
  /* a subscription not yet announced (its hello's job not run): not yet */
  fx_peer_t *c = fx_connect(&fx);
  char *token = fx_token(&fx, "carol", "*");
  fx_hello_token(c, token, "p1", -1);
  free(token);
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\"}");
  expect_error_conv(c, "not_subscribed", "p1");
  assert_true(fx_step(&fx));
  json_decref(expect(c, "welcome"));
  expect_synced(c, 0, 0);
  fx_send(c, "{\"type\":\"presence\",\"conv\":\"p1\",\"members\":false}");
  json_t *pg = expect(c, "presence");
  assert_int_equal(json_integer_value(json_object_get(pg, "count")), 1);
  json_decref(pg);
  close_peer(&fx, c);
  close_peer(&fx, b);
  advance_presence(&fx, GRACE_MS);
  fx_expect_nothing(a); /* no leave either */
  close_peer(&fx, a);
  fx_free(&fx);
}

/* A subscribe on an open connection makes its client present at
 * `subscribed` (a join for the others); its unsubscribe starts the grace
 * (a leave after it). */
static void test_presence_subscribe_unsubscribe(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p1");
  conv_with(&fx, "pch", STORE_CHANNEL_PRESENCE, "p2");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "p1", "true");
  fx_peer_t *b = member(&fx, "bob", "tab-b", "p2", NULL);
  fx_expect_nothing(a); /* bob is in p2 only */
  fx_send(b, "{\"type\":\"subscribe\",\"conv\":\"p1\",\"watermark\":null}");
  assert_true(fx_step(&fx));
  json_t *s = expect(b, "subscribed");
  assert_true(json_is_true(json_object_get(s, "presence")));
  json_decref(s);
  expect_synced(b, 0, 0);
  expect_event(a, "join", "p1", "bob", "tab-b");
  unsubscribe_frame(b, "p1");
  expect_unsubscribed(b, "p1");
  advance_presence(&fx, GRACE_MS - 1);
  fx_expect_nothing(a);
  advance_presence(&fx, 1);
  expect_event(a, "leave", "p1", "bob", "tab-b");
  assert_true(presence_has(fx.sessions.presence, "p2", "bob", "tab-b")); /* still in p2 */
  /* a second subscribe may change the events asked for: none from now on */
  fx_send(a, "{\"type\":\"subscribe\",\"conv\":\"p1\",\"presenceEvents\":false}");
  expect_subscribed(a, "p1", 0, 0, 1);
  fx_send(b, "{\"type\":\"subscribe\",\"conv\":\"p1\",\"watermark\":null}");
  assert_true(fx_step(&fx));
  json_decref(expect(b, "subscribed"));
  expect_synced(b, 0, 0);
  fx_expect_nothing(a);
  close_peer(&fx, a);
  close_peer(&fx, b);
  fx_free(&fx);
}

/* A signal on a channel with signals goes to every subscription of the
 * conversation, the sender's own included, with the token's sub as sender
 * and the body as sent; nothing is stored. */
static void test_signal_reaches_subscribers_not_the_store(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "sig", STORE_CHANNEL_SIGNALS, "s1");
  conv_with(&fx, "sig", STORE_CHANNEL_SIGNALS, "s2");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "s1", NULL);
  fx_peer_t *b = member(&fx, "bob", "tab-b", "s1", NULL);
  fx_peer_t *other = member(&fx, "kim", "tab-k", "s2", NULL);
  int64_t before = util_now_ms();
  fx_send(a, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":{\"typing\":true,\"n\":[1,\"x\"]}}");
  assert_false(fx_step(&fx)); /* one node: no store job */
  fx_peer_t *both[] = {a, b};
  for (int i = 0; i < 2; i++) {
    json_t *sg = expect(both[i], "signal");
    assert_string_equal(json_string_value(json_object_get(sg, "conv")), "s1");
    assert_string_equal(json_string_value(json_object_get(sg, "sender")), "alice");
    int64_t ts = json_integer_value(json_object_get(sg, "ts"));
    assert_true(ts >= before && ts <= util_now_ms());
    char *body = json_dumps(json_object_get(sg, "body"), JSON_COMPACT);
    assert_string_equal(body, "{\"typing\":true,\"n\":[1,\"x\"]}");
    free(body);
    json_decref(sg);
    fx_expect_nothing(both[i]);
  }
  fx_expect_nothing(other); /* another conversation */
  /* not stored: no message, the head unmoved */
  store_msg_t *msgs = NULL;
  size_t n = 99;
  assert_int_equal(store_replay(fx.db, "s1", 0, 100, 100, 1 << 20, &msgs, &n), 0);
  assert_int_equal(n, 0);
  store_msgs_free(msgs, n);
  store_conv_t cv;
  assert_int_equal(store_conv_get(fx.db, "s1", &cv), 0);
  assert_int_equal(cv.head, 0);
  assert_true(cv.signals);
  /* a later subscriber does not get it replayed */
  fx_peer_t *late = member(&fx, "lee", "tab-l", "s1", NULL);
  fx_expect_nothing(late);
  /* a body of exactly FRAME_SIGNAL_BYTES_MAX bytes goes */
  char *text = malloc(FRAME_SIGNAL_BYTES_MAX + 128);
  int h = snprintf(text, 128, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":\"");
  memset(text + h, 'x', FRAME_SIGNAL_BYTES_MAX - 2);
  strcpy(text + h + FRAME_SIGNAL_BYTES_MAX - 2, "\"}");
  fx_send(b, text);
  free(text);
  json_t *sg = expect(late, "signal");
  assert_int_equal(strlen(json_string_value(json_object_get(sg, "body"))),
                   FRAME_SIGNAL_BYTES_MAX - 2);
  assert_string_equal(json_string_value(json_object_get(sg, "sender")), "bob");
  json_decref(sg);
  json_decref(expect(a, "signal"));
  json_decref(expect(b, "signal"));
  close_peer(&fx, a);
  close_peer(&fx, b);
  close_peer(&fx, other);
  close_peer(&fx, late);
  fx_free(&fx);
}

/* Refusals, each with its conv, the connection open: signals_disabled on
 * a channel without signals (presence alone is not enough), not_subscribed,
 * too_large over FRAME_SIGNAL_BYTES_MAX bytes of JSON, bad_request without
 * a body. Nobody gets a signal. */
static void test_signal_refusals(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  conv_with(&fx, "plain", STORE_CHANNEL_PRESENCE, "n1");
  conv_with(&fx, "sig", STORE_CHANNEL_SIGNALS, "s1");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "n1", NULL);
  fx_peer_t *b = member(&fx, "bob", "tab-b", "n1", NULL);
  fx_send(a, "{\"type\":\"signal\",\"conv\":\"n1\",\"body\":{\"typing\":true}}");
  expect_error_conv(a, "signals_disabled", "n1");
  fx_send(a, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":1}");
  expect_error_conv(a, "not_subscribed", "s1");
  fx_send(a, "{\"type\":\"subscribe\",\"conv\":\"s1\",\"watermark\":null}");
  fx_send(a, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":2}"); /* its job not run */
  expect_error_conv(a, "not_subscribed", "s1");
  assert_true(fx_step(&fx));
  json_decref(expect(a, "subscribed"));
  expect_synced(a, 0, 0);
  char *text = malloc(FRAME_SIGNAL_BYTES_MAX + 128);
  int h = snprintf(text, 128, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":\"");
  memset(text + h, 'x', FRAME_SIGNAL_BYTES_MAX - 1); /* 4097 bytes with the quotes */
  strcpy(text + h + FRAME_SIGNAL_BYTES_MAX - 1, "\"}");
  fx_send(a, text);
  free(text);
  expect_error_conv(a, "too_large", "s1");
  fx_send(a, "{\"type\":\"signal\",\"conv\":\"s1\"}");
  expect_error(a, "bad_request");
  expect_open(a);
  fx_expect_nothing(a);
  fx_expect_nothing(b);
  close_peer(&fx, a);
  close_peer(&fx, b);
  fx_free(&fx);
}

/* The signal bucket (rate 5, burst 10 by default): ten at once go, the
 * eleventh is rate_limited with its conv, frame "signal" and a hint; after
 * the hint one goes again. Other buckets are untouched. */
static void test_signal_rate_limited(void **state) {
  fx_t fx;
  fx_init(&fx, NULL);
  assert_int_equal(fx.cfg.rate_signal, 5);
  assert_int_equal(fx.cfg.rate_signal_burst, 10);
  conv_with(&fx, "sig", STORE_CHANNEL_SIGNALS, "s1");
  fx_peer_t *a = member(&fx, "alice", "tab-a", "s1", NULL);
  fx_peer_t *b = member(&fx, "bob", "tab-b", "s1", NULL);
  for (int i = 0; i < 11; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":%d}", i);
    fx_send(a, text);
  }
  for (int i = 0; i < 10; i++) {
    json_t *sg = expect(b, "signal");
    assert_int_equal(json_integer_value(json_object_get(sg, "body")), i);
    json_decref(sg);
    json_decref(expect(a, "signal"));
  }
  json_t *e = expect(a, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "rate_limited");
  assert_string_equal(json_string_value(json_object_get(e, "conv")), "s1");
  assert_string_equal(json_string_value(json_object_get(json_object_get(e, "details"), "frame")),
                      "signal");
  int64_t hint = json_integer_value(json_object_get(e, "retryAfterMs"));
  assert_true(hint > 0 && hint <= 200);
  json_decref(e);
  fx_expect_nothing(a);
  fx_expect_nothing(b);
  expect_open(a);                                        /* ping takes no bucket */
  fx_send(a, "{\"type\":\"presence\",\"conv\":\"s1\"}"); /* the subscribe bucket: free */
  expect_error_conv(a, "presence_disabled", "s1");
  fx_advance(&fx, (uint64_t)hint);
  fx_send(a, "{\"type\":\"signal\",\"conv\":\"s1\",\"body\":\"again\"}");
  json_decref(expect(a, "signal"));
  json_t *sg = expect(b, "signal");
  assert_string_equal(json_string_value(json_object_get(sg, "body")), "again");
  json_decref(sg);
  close_peer(&fx, a);
  close_peer(&fx, b);
  fx_free(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello_fills_then_live_delivery),
      cmocka_unit_test(test_live_old_message_is_dropped),
      cmocka_unit_test(test_gap_fills_then_sends_what_waited),
      cmocka_unit_test(test_head_hint_fills),
      cmocka_unit_test(test_slow_reader_defers_then_fills),
      cmocka_unit_test(test_shared_frames_to_many),
      cmocka_unit_test(test_burst_beyond_one_writev),
      cmocka_unit_test(test_fill_done_with_output_high_defers),
      cmocka_unit_test(test_long_replay_pages),
      cmocka_unit_test(test_sync_granted),
      cmocka_unit_test(test_sync_reset),
      cmocka_unit_test(test_sync_queued_then_granted),
      cmocka_unit_test(test_sync_queue_timeout),
      cmocka_unit_test(test_sync_queue_full),
      cmocka_unit_test(test_failed_fill_retries_after_the_hint),
      cmocka_unit_test(test_fill_whose_epoch_moved_reads_again),
      cmocka_unit_test(test_retry_with_output_high_defers),
      cmocka_unit_test(test_pending_overflow_refills_from_the_store),
      cmocka_unit_test(test_sync_while_filling_runs_after),
      cmocka_unit_test(test_close_leaves_the_queue_and_cancels),
      cmocka_unit_test(test_hello_error_gives_the_slot_back),
      cmocka_unit_test(test_hello_store_timeout_gives_the_slot_back),
      cmocka_unit_test(test_hello_close_paths),
      cmocka_unit_test(test_hello_queue_timeout),
      cmocka_unit_test(test_subscribe_replays_then_live),
      cmocka_unit_test(test_subscribe_null_twice_and_reset),
      cmocka_unit_test(test_subscribe_refusals),
      cmocka_unit_test(test_channel_deactivated),
      cmocka_unit_test(test_subscribe_job_failed),
      cmocka_unit_test(test_subscribe_queued_then_refused),
      cmocka_unit_test(test_subscribe_before_welcome),
      cmocka_unit_test(test_unsubscribe),
      cmocka_unit_test(test_transition_outside_table_refused),
      cmocka_unit_test(test_unsubscribe_answers_the_subscribe),
      cmocka_unit_test(test_every_subscribe_answered),
      cmocka_unit_test(test_refresh),
      cmocka_unit_test(test_token_convs_scope_across_refresh),
      cmocka_unit_test(test_token_expiry),
      cmocka_unit_test(test_rate_limits),
      cmocka_unit_test(test_rate_abuse_closes),
      cmocka_unit_test(test_conns_per_user),
      cmocka_unit_test(test_presence_join_reconnect_leave),
      cmocka_unit_test(test_presence_drain_move_is_silent),
      cmocka_unit_test(test_presence_two_users_one_client_id),
      cmocka_unit_test(test_presence_events_users_and_clients),
      cmocka_unit_test(test_presence_frame_pages),
      cmocka_unit_test(test_presence_refusals),
      cmocka_unit_test(test_presence_subscribe_unsubscribe),
      cmocka_unit_test(test_signal_reaches_subscribers_not_the_store),
      cmocka_unit_test(test_signal_refusals),
      cmocka_unit_test(test_signal_rate_limited),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
