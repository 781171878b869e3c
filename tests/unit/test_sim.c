/* Unit tests for tools/sim: load balancer picks, the accept policies'
 * bounds, the collapse rule, determinism, reconnectTo at fleet shape, and
 * parameter parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "sim/model.h"
#include "sim/params.h"
#include "sim/report.h"

/* A small fleet with no restart inside `duration_s` and no churn. */
static sim_params_t small(int64_t nodes, int64_t clients) {
  sim_params_t p;
  assert_int_equal(sim_params_preset(&p, "fixed"), 0);
  p.nodes = nodes;
  p.clients = clients;
  p.batch = 1;
  p.churn_per_million = 0;
  p.duration_s = 10;
  p.start_s = 1000; /* after the end: no batch */
  return p;
}

static void test_random_picks_ready_nodes_only(void **state) {
  sim_params_t p = small(4, 100);
  p.lb = SIM_LB_RANDOM;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  s.n[2].ready = 0;
  s.nready = 0;
  for (uint16_t k = 0; k < 4; k++)
    if (s.n[k].ready) s.ready[s.nready++] = k;
  int seen[4] = {0};
  for (uint32_t i = 0; i < 3000; i++) seen[sim_lb_pick(&s, i % 100)]++;
  assert_int_equal(seen[2], 0);
  for (int k = 0; k < 4; k++)
    if (k != 2) assert_true(seen[k] > 800 && seen[k] < 1200);
  s.nready = 0;
  assert_int_equal(sim_lb_pick(&s, 0), SIM_NO_NODE);
  sim_free(&s);
}

static void test_hash_is_sticky_and_skips_down_nodes(void **state) {
  sim_params_t p = small(8, 1000);
  p.lb = SIM_LB_HASH;
  p.hash_vnodes = 2;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  uint16_t first[1000];
  for (uint32_t i = 0; i < 1000; i++) {
    first[i] = sim_lb_pick(&s, i);
    assert_int_equal(sim_lb_pick(&s, i), first[i]); /* the same node every time */
  }
  /* node 3 leaves: only its clients move, and each to one node */
  s.n[3].ready = 0;
  s.nready = 0;
  for (uint16_t k = 0; k < 8; k++)
    if (s.n[k].ready) s.ready[s.nready++] = k;
  int moved = 0;
  for (uint32_t i = 0; i < 1000; i++) {
    uint16_t k = sim_lb_pick(&s, i);
    assert_int_not_equal(k, 3);
    if (first[i] != 3)
      assert_int_equal(k, first[i]);
    else
      moved++;
  }
  assert_true(moved > 0);
  sim_free(&s);
}

static void test_leastconn_picks_the_emptiest(void **state) {
  sim_params_t p = small(3, 300);
  p.lb = SIM_LB_LEASTCONN;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  s.n[1].conns -= 10; /* bookkeeping only: the LB reads the counts */
  assert_int_equal(sim_lb_pick(&s, 0), 1);
  s.n[1].conns += 20;
  s.n[0].conns -= 5;
  assert_int_equal(sim_lb_pick(&s, 0), 0);
  sim_free(&s);
}

/* queue: a FIFO wait bounded by queue_ms at the spare handshake rate. */
static void test_admission_queue_bound(void **state) {
  sim_params_t p = small(1, 300);
  p.admission = SIM_ACCEPT_QUEUE;
  p.handshake_rate = 1000;
  p.headroom = 50;      /* capacity 600: load 0.5 */
  p.admission_cpu = 90; /* spare 0.4: 400 handshakes/s */
  p.queue_ms = 500;     /* => at most 200 waiters */
  p.queue_max = 10000;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  int taken = 0;
  for (uint32_t i = 0; i < 300; i++) taken += sim_node_offer(&s, 0, i);
  assert_int_equal(taken, 200);
  assert_int_equal(s.refusals, 100);
  /* a shorter length bound wins */
  sim_free(&s);
  p.queue_max = 50;
  assert_int_equal(sim_init(&s, &p), 0);
  taken = 0;
  for (uint32_t i = 0; i < 100; i++) taken += sim_node_offer(&s, 0, i);
  assert_int_equal(taken, 50);
  sim_free(&s);
}

/* refuse: taken only if the handshake starts within refuse_wait_ms. */
static void test_refuse_bound(void **state) {
  sim_params_t p = small(1, 100);
  p.admission = SIM_ACCEPT_REFUSE;
  p.handshake_rate = 1000;
  p.headroom = 50;        /* spare 0.5 of 100 %: 500 handshakes/s */
  p.refuse_wait_ms = 100; /* => 50 */
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  int taken = 0;
  for (uint32_t i = 0; i < 100; i++) taken += sim_node_offer(&s, 0, i);
  assert_int_equal(taken, 50);
  sim_free(&s);
}

/* Waiters taken at one rate are refused once they have waited past the
 * bound, when the node's handshake rate fell to 0 after they were queued
 * (here its connections reach 100 % of capacity): refusals with the hint,
 * backing off, connection kept (these are moves). */
static void test_waiters_time_out(void **state) {
  const sim_accept_t policy[] = {SIM_ACCEPT_QUEUE, SIM_ACCEPT_REFUSE};
  for (int i = 0; i < 2; i++) {
    sim_params_t p = small(1, 1000);
    p.admission = policy[i];
    p.handshake_rate = 1000;
    p.headroom = 50; /* capacity 2000: load 0.5 */
    p.queue_ms = 500;
    p.refuse_wait_ms = 500;
    p.hints = 1;
    p.hint_min_ms = p.hint_max_ms = 3000;
    sim_t s;
    assert_int_equal(sim_init(&s, &p), 0);
    int taken = 0;
    for (uint32_t ci = 0; ci < 100; ci++) taken += sim_node_offer(&s, 0, ci);
    assert_int_equal(taken, 100);
    s.capacity = 1000; /* the 1000 connections now fill the node: rate 0 */
    for (int t = 0; t <= 500 / SIM_TICK_MS; t++) sim_step(&s); /* waited 500 ms: not past */
    assert_int_equal(s.n[0].qlen, 100);                        /* nothing served */
    assert_int_equal(s.refusals, 0);
    sim_step(&s);
    assert_int_equal(s.n[0].qlen, 0);
    assert_int_equal(s.refusals, 100);
    assert_int_equal(s.sec[0].refusals, 100);
    for (uint32_t ci = 0; ci < 100; ci++) {
      assert_int_equal(s.c[ci].state, SIM_MIGRATING);
      assert_true(s.c[ci].flags & SIM_F_PENDING);
      assert_true(s.c[ci].due >= s.now - 1 + 3000 / SIM_TICK_MS); /* the hint is a floor */
    }
    assert_true(s.n[0].refuse_share > 0); /* their refusal cost CPU */
    sim_free(&s);
  }
}

/* The admission check counts the CPU the last step's refusals took. */
static void test_refusal_work_lowers_admission(void **state) {
  sim_params_t p = small(1, 100);
  p.admission = SIM_ACCEPT_REFUSE;
  p.handshake_rate = 1000;
  p.headroom = 50;        /* spare 0.5: 500 handshakes/s */
  p.refuse_wait_ms = 100; /* => 50 */
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  s.n[0].refuse_share = 0.25; /* => 0.25: 250/s, 25 */
  int taken = 0;
  for (uint32_t i = 0; i < 100; i++) taken += sim_node_offer(&s, 0, i);
  assert_int_equal(taken, 25);
  sim_free(&s);
}

/* reconnect99_s is per batch: a batch of 1 node in 200 (0.5 % of the
 * clients) whose clients stay out 20 s (the hint's floor) reports about
 * 20 s, though 99 % of all clients were connected all along. */
static void test_reconnect99_is_per_batch(void **state) {
  sim_params_t p = small(200, 20000);
  p.drain = SIM_DRAIN_CLOSE;
  p.close_rate = 0;
  p.hints = 1;
  p.hint_min_ms = p.hint_max_ms = 20000;
  p.start_s = 1;
  p.batch_interval_s = 1000; /* one batch in the run */
  p.pause_cpu = 0;
  p.duration_s = 40;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  assert_int_equal(sim_run(&s, NULL), 0);
  assert_int_equal(s.next_batch, 1);
  assert_int_equal(s.batch_displaced[0], 100);
  assert_int_equal(s.batch_out[0], 0);
  assert_true(s.reconnect99_s[0] >= 20 && s.reconnect99_s[0] <= 21);
  sim_free(&s);
}

/* A node at 100 % CPU for collapse_s seconds in a row drops its clients. */
static void test_collapse_rule(void **state) {
  sim_params_t p = small(2, 1000);
  p.collapse_s = 3;
  p.collapse_share = 100;
  p.headroom = 1;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  for (uint32_t i = 0; i < 1000; i++) s.c[i].node = 0; /* node 0 holds twice its capacity */
  s.n[0].conns = 1000;
  s.n[1].conns = 0;
  for (int i = 0; i < 2 * SIM_TICKS_PER_S; i++) sim_step(&s);
  assert_int_equal(s.collapses, 0);
  assert_int_equal(s.n[0].hot_s, 2);
  for (int i = 0; i < SIM_TICKS_PER_S; i++) sim_step(&s);
  assert_int_equal(s.collapses, 1);
  assert_int_equal(s.nodes_collapsed, 1);
  assert_int_equal(s.n[0].conns, 0);
  assert_int_equal(s.connected, 0);
  assert_int_equal(s.c[0].state, SIM_WAITING);
  sim_free(&s);

  /* a share: about half go */
  p.collapse_share = 50;
  assert_int_equal(sim_init(&s, &p), 0);
  for (uint32_t i = 0; i < 1000; i++) s.c[i].node = 0;
  s.n[0].conns = 1000;
  s.n[1].conns = 0;
  for (int i = 0; i < 3 * SIM_TICKS_PER_S; i++) sim_step(&s);
  assert_int_equal(s.collapses, 1);
  assert_true(s.n[0].conns > 400 && s.n[0].conns < 600);
  sim_free(&s);
}

/* The summary of one run of `p`, as a string (the caller frees it). */
static char *run_summary(const sim_params_t *p) {
  sim_t s;
  assert_int_equal(sim_init(&s, p), 0);
  assert_int_equal(sim_run(&s, NULL), 0);
  json_t *sum = report_summary(&s);
  assert_non_null(sum);
  char *text = json_dumps(sum, JSON_REAL_PRECISION(6));
  json_decref(sum);
  sim_free(&s);
  return text;
}

static void test_same_seed_same_summary(void **state) {
  sim_params_t p;
  assert_int_equal(sim_params_preset(&p, "postmortem"), 0);
  p.nodes = 16;
  p.clients = 20000;
  p.batch = 1;
  p.duration_s = 240;
  p.seed = 5;
  char *a = run_summary(&p), *b = run_summary(&p);
  assert_string_equal(a, b);
  p.seed = 6;
  char *c = run_summary(&p);
  assert_string_not_equal(a, c);
  free(a);
  free(b);
  free(c);
}

/* A drain with migrate moves every client once, make-before-break. */
static void test_migrate_moves_without_outage(void **state) {
  sim_params_t p = small(4, 4000);
  p.start_s = 1;
  p.duration_s = 120;
  p.drain_window_s = 10;
  p.batch_interval_s = 0;
  p.headroom = 50;
  p.pause_cpu = 0;
  sim_t s;
  assert_int_equal(sim_init(&s, &p), 0);
  assert_int_equal(sim_run(&s, NULL), 0);
  assert_int_equal(s.next_batch, 4);
  assert_true(s.restart_done > 0);
  assert_int_equal(s.moves, s.displaced);
  assert_true(s.disconnected_client_s == 0);
  assert_int_equal(s.attempts, s.displaced);
  assert_int_equal(s.connected, 4000);
  sim_free(&s);
}

/* The fixed fleet at 1/10 (sim.reduced's): reconnectTo by two random
 * choices leaves the restarted nodes nearly empty and the 75 % pause stops
 * the restart; spread (converger's drain) completes it, as least does. */
static void test_reconnect_to_refills_restarted_nodes(void **state) {
  const int to[] = {SIM_TO_SPREAD, SIM_TO_LEAST, SIM_TO_TWO};
  for (int i = 0; i < 3; i++) {
    sim_params_t p;
    assert_int_equal(sim_params_preset(&p, "fixed"), 0);
    p.nodes = 48;
    p.clients = 100000;
    p.batch = 3;
    p.seed = 7;
    p.reconnect_to = to[i];
    sim_t s;
    assert_int_equal(sim_init(&s, &p), 0);
    assert_int_equal(sim_run(&s, NULL), 0);
    if (to[i] == SIM_TO_TWO) {
      assert_int_equal(s.restart_done, 0);
      assert_true(s.next_batch < s.nbatches);
    } else {
      assert_true(s.restart_done > 0);
      assert_int_equal(s.collapses, 0);
      assert_int_equal(s.moves, s.displaced);
    }
    sim_free(&s);
  }
}

static void test_params_flags_and_errors(void **state) {
  sim_params_t p;
  const char *out;
  char *ok[] = {"--scenario", "postmortem", "--nodes", "48",           "--backoff",
                "full",       "--out",      "x",       "--headroom=35"};
  assert_int_equal(sim_params_parse(&p, &out, 9, ok), 0);
  assert_int_equal(p.nodes, 48);
  assert_int_equal(p.backoff, CVG_BACKOFF_FULL);
  assert_int_equal(p.lb, SIM_LB_HASH); /* from the scenario */
  assert_int_equal(p.headroom, 35);
  assert_string_equal(out, "x");
  char *bad1[] = {"--nodes", "0"};
  assert_int_equal(sim_params_parse(&p, &out, 2, bad1), 2);
  char *bad2[] = {"--lb", "roundrobin"};
  assert_int_equal(sim_params_parse(&p, &out, 2, bad2), 2);
  char *bad3[] = {"--frobnicate", "1"};
  assert_int_equal(sim_params_parse(&p, &out, 2, bad3), 2);
  char *bad4[] = {"--nodes", "10", "--batch", "11"};
  assert_int_equal(sim_params_parse(&p, &out, 4, bad4), 2);
  char *bad5[] = {"--scenario", "/nonexistent/x.json"};
  assert_int_equal(sim_params_parse(&p, &out, 2, bad5), 2);
}

static void test_params_file(void **state) {
  char path[] = "/tmp/test_sim_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char good[] =
      "{\"nodes\": 12, \"batch\": 2, \"drain-window-s\": 45, \"lb\": \"leastconn\"}";
  assert_int_equal(write(fd, good, sizeof good - 1), (ssize_t)(sizeof good - 1));
  close(fd);
  sim_params_t p;
  const char *out;
  char *argv[] = {"--scenario", path, "--nodes", "24"};
  assert_int_equal(sim_params_parse(&p, &out, 4, argv), 0);
  assert_int_equal(p.nodes, 24); /* the flag wins */
  assert_int_equal(p.drain_window_s, 45);
  assert_int_equal(p.lb, SIM_LB_LEASTCONN);
  char err[256];
  FILE *f = fopen(path, "w");
  fputs("{\"nodez\": 12}", f);
  fclose(f);
  assert_int_equal(sim_params_load_file(&p, path, err, sizeof err), -1);
  assert_non_null(strstr(err, "nodez"));
  f = fopen(path, "w");
  fputs("{\"nodes\": \"many\"}", f);
  fclose(f);
  assert_int_equal(sim_params_load_file(&p, path, err, sizeof err), -1);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_picks_ready_nodes_only),
      cmocka_unit_test(test_hash_is_sticky_and_skips_down_nodes),
      cmocka_unit_test(test_leastconn_picks_the_emptiest),
      cmocka_unit_test(test_admission_queue_bound),
      cmocka_unit_test(test_refuse_bound),
      cmocka_unit_test(test_waiters_time_out),
      cmocka_unit_test(test_refusal_work_lowers_admission),
      cmocka_unit_test(test_reconnect99_is_per_batch),
      cmocka_unit_test(test_collapse_rule),
      cmocka_unit_test(test_same_seed_same_summary),
      cmocka_unit_test(test_migrate_moves_without_outage),
      cmocka_unit_test(test_reconnect_to_refills_restarted_nodes),
      cmocka_unit_test(test_params_flags_and_errors),
      cmocka_unit_test(test_params_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
