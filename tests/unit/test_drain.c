/* Unit tests of the drain (gate/drain.h) against the in-process fixture
 * (fixture.h: real connections and sessions, an inline pool, a fake clock):
 *  - the phases drain_state reports (ready, shedding, draining) and the
 *    stop it asks of its owner: when no connection is left, or at
 *    drain_shutdown_ms;
 *  - the frames: every welcomed connection told once, afterMs within the
 *    window, deadlineMs the window plus DRAIN_GRACE_MS, reconnectTo the
 *    ready peer below the fleet's level (never a draining one; null with
 *    none), a connection welcomed later told with what is left;
 *  - pacing: after the deadline, the connections still here closed with
 *    1012 and a retry hint, drain_close_rate per second; the overtime
 *    while clients are still moving, and its bounds;
 *  - a shed: a fraction told, the rest untouched, back to ready after its
 *    window. */
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

#define N 10

static int is_type(json_t *js, const char *type) {
  const char *t = json_string_value(json_object_get(js, "type"));
  return t && strcmp(t, type) == 0;
}

static fx_peer_t *live(fx_t *fx) {
  fx_peer_t *p = fx_connect(fx);
  fx_hello(p, "c1", -1);
  fx_step(fx);
  json_decref(fx_expect(p, "welcome"));
  json_decref(fx_expect(p, "synced"));
  return p;
}

static void beat(fx_t *fx, const char *id, const char *state, int64_t conns) {
  char url[64];
  snprintf(url, sizeof url, "ws://%s.test/v1/ws", id);
  assert_int_equal(store_node_beat(fx->db, id, url, "", state, conns, 0, 0, util_now_ms()), 0);
}

/* A peer `id` in `state` whose public URL is `url`. */
static void beat_url(fx_t *fx, const char *id, const char *url, const char *state, int64_t conns) {
  assert_int_equal(store_node_beat(fx->db, id, url, "", state, conns, 0, 0, util_now_ms()), 0);
}

static void setup_fx(fx_t *fx, int window_ms, int rate, int shutdown_ms) {
  fx_init(fx, NULL);
  fx->cfg.drain_window_ms = window_ms;
  fx->cfg.drain_close_rate = rate;
  fx->cfg.drain_shutdown_ms = shutdown_ms;
  fx_conv(fx, "ch", "c1", 0);
}

/* The drain frame of `p`, checked against the window; its reconnectTo
 * (heap, NULL for null). */
static char *expect_drain(fx_peer_t *p, int64_t window_ms) {
  json_t *f = fx_expect(p, "drain");
  int64_t after = json_integer_value(json_object_get(f, "afterMs"));
  assert_true(after >= 0 && after < (window_ms > 0 ? window_ms : 1));
  assert_int_equal(json_integer_value(json_object_get(f, "deadlineMs")),
                   window_ms + DRAIN_GRACE_MS);
  json_t *to = json_object_get(f, "reconnectTo");
  char *r = json_is_string(to) ? strdup(json_string_value(to)) : NULL;
  assert_true(json_is_string(to) || json_is_null(to));
  json_decref(f);
  return r;
}

/* ready -> draining; frames to all, reconnectTo the ready peer far below
 * the level (p1, 0 connections) rather than the full one (p2) or the
 * draining one (p3); the clients move (close first) and the drain asks for
 * the stop once none is left. */
static void test_drain_moves_everyone_then_stops(void **state) {
  fx_t fx;
  setup_fx(&fx, 10000, 100, 60000);
  beat(&fx, "p1", "ready", 0);
  beat(&fx, "p2", "ready", 100);
  beat(&fx, "p3", "draining", 0);
  fx_peer_t *p[N];
  for (int i = 0; i < N; i++) p[i] = live(&fx);
  assert_int_equal(drain_state(fx.drain), 0);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_int_equal(drain_start(fx.drain, "again"), -CV_EEXISTS);
  assert_int_equal(drain_state(fx.drain), 1);
  fx_expect_nothing(p[0]); /* the frames wait for the peers' read */
  assert_true(fx_step(&fx));
  for (int i = 0; i < N; i++) {
    char *to = expect_drain(p[i], 10000);
    assert_non_null(to);
    assert_string_equal(to, "ws://p1.test/v1/ws");
    free(to);
    fx_expect_nothing(p[i]); /* told once */
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(fx.stops, 0);
    fx_peer_free(p[i]); /* moved: closed by the client */
    fx_advance(&fx, 1);
  }
  assert_int_equal(fx.stops, 1);
  assert_non_null(strstr(fx.stop_why, "drain complete"));
  assert_non_null(strstr(fx.stop_why, "10 moved"));
  assert_int_equal(drain_state(fx.drain), 1);
  fx_free(&fx);
}

/* A welcomed client whose upgrade carried `headers`. */
static fx_peer_t *live_with(fx_t *fx, const char *headers) {
  fx_peer_t *p = fx_connect_with(fx, headers);
  fx_hello(p, "c1", -1);
  fx_step(fx);
  json_decref(fx_expect(p, "welcome"));
  json_decref(fx_expect(p, "synced"));
  return p;
}

/* reconnectTo never changes the scheme (docs/protocol.md 5.6): a client
 * that came over TLS (here a proxy's: X-Forwarded-Proto https, or wss) is
 * offered only wss:// peers, any other client only ws:// ones, however
 * loaded; with no peer of its scheme, null. */
static void test_reconnect_to_keeps_the_scheme(void **state) {
  fx_t fx;
  setup_fx(&fx, 10000, 100, 60000);
  beat_url(&fx, "plain", "ws://plain.test/v1/ws", "ready", 0);
  beat_url(&fx, "secure", "wss://secure.test/v1/ws", "ready", 1000);
  fx_peer_t *p[6];
  p[0] = live(&fx);
  p[1] = live_with(&fx, "X-Forwarded-Proto: https\r\n");
  p[2] = live_with(&fx, "X-Forwarded-Proto: HTTPS, http\r\n");
  p[3] = live_with(&fx, "X-Forwarded-Proto: wss\r\n");
  p[4] = live_with(&fx, "X-Forwarded-Proto: http\r\n");
  p[5] = live_with(&fx, "X-Forwarded-Proto: httpsx\r\n");
  const char *want[6] = {"ws://plain.test/v1/ws",   "wss://secure.test/v1/ws",
                         "wss://secure.test/v1/ws", "wss://secure.test/v1/ws",
                         "ws://plain.test/v1/ws",   "ws://plain.test/v1/ws"};
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx));
  for (int i = 0; i < 6; i++) {
    char *to = expect_drain(p[i], 10000);
    assert_non_null(to);
    assert_string_equal(to, want[i]);
    free(to);
  }
  for (int i = 0; i < 6; i++) fx_peer_free(p[i]);
  fx_free(&fx);
  /* only ws peers: a TLS client's reconnectTo is null, a plain one's not */
  setup_fx(&fx, 10000, 100, 60000);
  beat_url(&fx, "plain", "ws://plain.test/v1/ws", "ready", 0);
  fx_peer_t *tls = live_with(&fx, "X-Forwarded-Proto: https\r\n"), *plain = live(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx));
  assert_null(expect_drain(tls, 10000));
  char *to = expect_drain(plain, 10000);
  assert_string_equal(to, "ws://plain.test/v1/ws");
  free(to);
  fx_peer_free(tls);
  fx_peer_free(plain);
  fx_free(&fx);
  /* the scheme of a peer's public URL in any case (RFC 3986 section 3.1):
   * WSS:// is wss, offered to the TLS client only, however loaded */
  setup_fx(&fx, 10000, 100, 60000);
  beat_url(&fx, "plain", "ws://plain.test/v1/ws", "ready", 1000);
  beat_url(&fx, "upper", "WSS://upper.test/v1/ws", "ready", 0);
  tls = live_with(&fx, "X-Forwarded-Proto: https\r\n");
  plain = live(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx));
  to = expect_drain(tls, 10000);
  assert_non_null(to);
  assert_string_equal(to, "WSS://upper.test/v1/ws");
  free(to);
  to = expect_drain(plain, 10000);
  assert_non_null(to);
  assert_string_equal(to, "ws://plain.test/v1/ws");
  free(to);
  fx_peer_free(tls);
  fx_peer_free(plain);
  fx_free(&fx);
}

/* The n connections of p, each still open and sent nothing, closed one
 * at a time at 2/s from now: each with 1012 and a retry hint. */
static void expect_paced_closes(fx_t *fx, fx_peer_t **p, int n) {
  int closed = 0;
  for (int step = 0; step < n; step++) {
    fx_advance(fx, step == 0 ? 1 : 500);
    int now_closed = 0;
    for (int i = 0; i < n; i++) {
      if (!p[i]->closed) assert_null(fx_recv(p[i])); /* no frame: a close */
      if (p[i]->closed) {
        assert_int_equal(p[i]->close_code, WS_CLOSE_SERVICE_RESTART);
        assert_non_null(strstr(p[i]->close_reason, "retryAfterMs"));
        now_closed++;
      }
    }
    assert_int_equal(now_closed, closed + 1); /* one per 500 ms */
    closed = now_closed;
  }
}

/* After the window and the grace, the connections still here are closed
 * with 1012 at drain_close_rate per second (2/s: one at once, then one
 * every 500 ms), each with a retry hint. */
static void test_paced_closes_after_the_deadline(void **state) {
  fx_t fx;
  setup_fx(&fx, 1000, 2, 60000);
  beat(&fx, "p2", "ready", 0);
  beat(&fx, "p3", "draining", 0);
  fx_peer_t *p[4];
  for (int i = 0; i < 4; i++) p[i] = live(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx));
  for (int i = 0; i < 4; i++) free(expect_drain(p[i], 1000));
  fx_advance(&fx, 1000 + DRAIN_GRACE_MS - 1);
  for (int i = 0; i < 4; i++) fx_expect_nothing(p[i]);
  expect_paced_closes(&fx, p, 4);
  assert_int_equal(fx.stops, 0); /* their sockets are still open */
  for (int i = 0; i < 4; i++) fx_peer_free(p[i]);
  fx_advance(&fx, 1);
  assert_int_equal(fx.stops, 1);
  assert_non_null(strstr(fx.stop_why, "4 closed with 1012"));
  fx_free(&fx);
}

/* Past the deadline, while clients are still moving (one closed by
 * itself within DRAIN_PROGRESS_MS), the 1012s wait: a move drawn near the
 * end of the window whose welcome elsewhere is late completes instead of
 * being cut off. Once DRAIN_PROGRESS_MS pass with no move, the paced closes
 * begin as without the overtime. */
static void test_overtime_while_clients_move(void **state) {
  fx_t fx;
  setup_fx(&fx, 1000, 2, 60000);
  beat(&fx, "p2", "ready", 0);
  fx_peer_t *p[6];
  for (int i = 0; i < 6; i++) p[i] = live(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx));
  for (int i = 0; i < 6; i++) free(expect_drain(p[i], 1000));
  fx_advance(&fx, 1000 + DRAIN_GRACE_MS - 100);
  fx_peer_free(p[0]); /* moved 100 ms before the deadline */
  fx_advance(&fx, 100);  /* the deadline */
  fx_advance(&fx, 300);
  for (int i = 1; i < 6; i++) fx_expect_nothing(p[i]);
  fx_peer_free(p[1]); /* moved 300 ms past it: still coming in */
  fx_advance(&fx, DRAIN_PROGRESS_MS - 1);
  for (int i = 2; i < 6; i++) fx_expect_nothing(p[i]);
  expect_paced_closes(&fx, p + 2, 4); /* DRAIN_PROGRESS_MS with no move */
  for (int i = 2; i < 6; i++) fx_peer_free(p[i]);
  fx_advance(&fx, 1);
  assert_int_equal(fx.stops, 1);
  assert_non_null(strstr(fx.stop_why, "2 moved, 4 closed with 1012"));
  fx_free(&fx);
}

/* The overtime ends DRAIN_OVERTIME_MS past the deadline however steadily
 * clients keep moving; and a drain has none when the paced closes of
 * those left would then end after drain_shutdown_ms (here 9 left at 2/s,
 * 4.5 s of closes, with 4 s from the deadline to the shutdown). */
static void test_overtime_is_bounded(void **state) {
  for (int round = 0; round < 2; round++) {
    enum { M = 30 };
    fx_t fx;
    setup_fx(&fx, 1000, 2, round == 0 ? 60000 : 1000 + DRAIN_GRACE_MS + 4000);
    beat(&fx, "p2", "ready", 0);
    fx_peer_t *p[M];
    int n = round == 0 ? M : 10;
    for (int i = 0; i < n; i++) p[i] = live(&fx);
    assert_int_equal(drain_start(fx.drain, "test"), 0);
    assert_true(fx_step(&fx));
    for (int i = 0; i < n; i++) free(expect_drain(p[i], 1000));
    fx_advance(&fx, 1000 + DRAIN_GRACE_MS - 1);
    /* from 1 ms before the deadline, one moves every 400 ms */
    int moved = 0, first_close = 0;
    for (int t = 0; first_close == 0 && moved < n - 1; t++) {
      if (t % 400 == 0) fx_peer_free(p[moved++]);
      fx_advance(&fx, 1);
      for (int i = moved; i < n; i++) {
        if (!p[i]->closed) assert_null(fx_recv(p[i])); /* no frame: a close, or nothing */
        if (p[i]->closed) first_close = t + 1;         /* ms past deadline - 1 */
      }
    }
    assert_int_equal(first_close, round == 0 ? DRAIN_OVERTIME_MS + 1 : 1);
    for (int i = moved; i < n; i++) fx_peer_free(p[i]);
    fx_free(&fx);
  }
}

/* The connections that stay past drain_shutdown_ms: the stop is asked
 * then, naming them. */
static void test_shutdown_deadline_stops(void **state) {
  fx_t fx;
  setup_fx(&fx, 1000, 1, 5000);
  beat(&fx, "p1", "ready", 0);
  fx_peer_t *p[3];
  for (int i = 0; i < 3; i++) p[i] = live(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  fx_step(&fx);
  fx_advance(&fx, 4999);
  assert_int_equal(fx.stops, 0);
  fx_advance(&fx, 1);
  assert_int_equal(fx.stops, 1);
  assert_non_null(strstr(fx.stop_why, "drain deadline after 5000 ms"));
  fx_advance(&fx, 1000);
  assert_int_equal(fx.stops, 1); /* asked once */
  for (int i = 0; i < 3; i++) fx_peer_free(p[i]);
  fx_free(&fx);
}

/* A connection whose hello is answered while the peers are read is told
 * with the batch; one upgraded before the drain but welcomed after the
 * frames went is told on its welcome, with what is left of the window
 * (upgrades that come after the drain began are refused by the REST
 * layer, not here). */
static void test_late_welcome_is_told(void **state) {
  fx_t fx;
  setup_fx(&fx, 10000, 100, 60000);
  beat(&fx, "p1", "ready", 0);
  fx_peer_t *a = live(&fx);
  fx_peer_t *b = fx_connect(&fx);
  fx_hello(b, "c1", -1);          /* its job waits in the pool */
  fx_peer_t *c = fx_connect(&fx); /* upgraded, its hello comes later */
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx)); /* b's hello (FIFO): welcomed while the batch waits */
  json_decref(fx_expect(b, "welcome"));
  json_decref(fx_expect(b, "synced"));
  fx_expect_nothing(b);
  assert_true(fx_step(&fx)); /* the peers' read: the frames */
  free(expect_drain(a, 10000));
  free(expect_drain(b, 10000));
  fx_expect_nothing(c); /* not welcomed: not told */
  fx_advance(&fx, 3000);
  fx_hello(c, "c1", -1);
  assert_true(fx_step(&fx));
  json_decref(fx_expect(c, "welcome"));
  json_t *f = fx_expect(c, "drain"); /* right after welcome; 3000 ms in: 7000 left */
  assert_true(json_integer_value(json_object_get(f, "afterMs")) < 7000);
  assert_int_equal(json_integer_value(json_object_get(f, "deadlineMs")), 7000 + DRAIN_GRACE_MS);
  json_decref(f);
  json_decref(fx_expect(c, "synced"));
  fx_peer_free(a);
  fx_peer_free(b);
  fx_peer_free(c);
  fx_free(&fx);
}

/* No ready peer (a single node, or every peer draining): no frames, which
 * would send the clients back here; the connections are closed with 1012
 * and a retry hint at once, paced (2/s), and the stop comes as soon as
 * none is left. With no connection at all, the stop comes at once. */
static void test_no_ready_peer_closes_at_once_and_stops_when_none_is_left(void **state) {
  fx_t fx;
  setup_fx(&fx, 30000, 2, 60000);
  beat(&fx, "p3", "draining", 0);
  fx_peer_t *p[3];
  for (int i = 0; i < 3; i++) p[i] = live(&fx);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  assert_true(fx_step(&fx));      /* the peers' read: none ready */
  expect_paced_closes(&fx, p, 3); /* at once, not after the 30 s window */
  assert_int_equal(fx.stops, 0);
  for (int i = 0; i < 3; i++) fx_peer_free(p[i]);
  fx_advance(&fx, 20);
  assert_int_equal(fx.stops, 1); /* none left: long before the window's end */
  assert_non_null(strstr(fx.stop_why, "drain complete"));
  assert_non_null(strstr(fx.stop_why, "3 closed with 1012"));
  fx_free(&fx);

  setup_fx(&fx, 30000, 2, 60000);
  assert_int_equal(drain_start(fx.drain, "test"), 0);
  fx_advance(&fx, 1);
  assert_int_equal(fx.stops, 1); /* no connection: at once */
  fx_free(&fx);
}

/* ready -> shedding -> ready: half of the connections told, the others
 * not; after its window the ones that stayed are closed with 1012; a
 * second shed meanwhile is refused. */
static void test_shed_a_fraction(void **state) {
  fx_t fx;
  setup_fx(&fx, 10000, 1000, 60000);
  beat(&fx, "p1", "ready", 0);
  fx_peer_t *p[N];
  for (int i = 0; i < N; i++) p[i] = live(&fx);
  int chosen = 0, total = 0;
  assert_int_equal(drain_shed(fx.drain, 0.5, 2000, &chosen, &total), 0);
  assert_int_equal(chosen, 5);
  assert_int_equal(total, N);
  assert_int_equal(drain_state(fx.drain), 2);
  assert_int_equal(drain_shed(fx.drain, 0.5, 2000, &chosen, &total), -CV_EBUSY);
  assert_true(fx_step(&fx));
  int told[N], ntold = 0;
  for (int i = 0; i < N; i++) {
    json_t *js = fx_recv(p[i]);
    told[i] = js && is_type(js, "drain");
    ntold += told[i];
    json_decref(js);
  }
  assert_int_equal(ntold, 5);
  fx_advance(&fx, 2000 + DRAIN_GRACE_MS);
  assert_int_equal(drain_state(fx.drain), 0);
  for (int k = 0; k < 5; k++) fx_advance(&fx, 1); /* 1000/s: one close per 1 ms tick */
  for (int i = 0; i < N; i++) {
    assert_null(fx_recv(p[i]));
    assert_int_equal(p[i]->closed, told[i]);
    if (told[i]) assert_int_equal(p[i]->close_code, WS_CLOSE_SERVICE_RESTART);
  }
  assert_int_equal(fx.stops, 0); /* a shed never stops the node */
  for (int i = 0; i < N; i++) fx_peer_free(p[i]);
  fx_free(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_drain_moves_everyone_then_stops),
      cmocka_unit_test(test_reconnect_to_keeps_the_scheme),
      cmocka_unit_test(test_paced_closes_after_the_deadline),
      cmocka_unit_test(test_overtime_while_clients_move),
      cmocka_unit_test(test_overtime_is_bounded),
      cmocka_unit_test(test_shutdown_deadline_stops),
      cmocka_unit_test(test_late_welcome_is_told),
      cmocka_unit_test(test_no_ready_peer_closes_at_once_and_stops_when_none_is_left),
      cmocka_unit_test(test_shed_a_fraction),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
