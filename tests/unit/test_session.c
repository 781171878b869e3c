/* Unit tests of a protocol session against the in-process fixture
 * (fixture.h: the real transport, sessions, bus and store; an inline pool
 * and a fake clock):
 *  - every transition of the subscription table in proto/sub.c's design
 *    block, each test named after the rows it drives;
 *  - the hello's admission slot given back on every path: done, error,
 *    close while queued, close with its job not started, queue timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util.h"
#include "fixture.h"
#include "net/ws.h"
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
  json_decref(expect(p, "welcome"));
  expect_msgs(p, 1, 3);
  expect_synced(p, 3, 0);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  assert_int_equal(admission_in_use(fx.admission), 0);
  fx_append(&fx, "c1", 4);
  expect_msgs(p, 4, 4);
  assert_int_equal(fx_sub_state(p, "c1"), SUB_LIVE);
  fx_expect_nothing(p);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello_fills_then_live_delivery),
      cmocka_unit_test(test_live_old_message_is_dropped),
      cmocka_unit_test(test_gap_fills_then_sends_what_waited),
      cmocka_unit_test(test_head_hint_fills),
      cmocka_unit_test(test_slow_reader_defers_then_fills),
      cmocka_unit_test(test_fill_done_with_output_high_defers),
      cmocka_unit_test(test_long_replay_pages),
      cmocka_unit_test(test_sync_granted),
      cmocka_unit_test(test_sync_reset),
      cmocka_unit_test(test_sync_queued_then_granted),
      cmocka_unit_test(test_sync_queue_timeout),
      cmocka_unit_test(test_sync_queue_full),
      cmocka_unit_test(test_failed_fill_retries_after_the_hint),
      cmocka_unit_test(test_retry_with_output_high_defers),
      cmocka_unit_test(test_pending_overflow_refills_from_the_store),
      cmocka_unit_test(test_sync_while_filling_runs_after),
      cmocka_unit_test(test_close_leaves_the_queue_and_cancels),
      cmocka_unit_test(test_hello_error_gives_the_slot_back),
      cmocka_unit_test(test_hello_store_timeout_gives_the_slot_back),
      cmocka_unit_test(test_hello_close_paths),
      cmocka_unit_test(test_hello_queue_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
