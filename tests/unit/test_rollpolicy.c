/* Unit tests of the rolling-restart policy (cluster/rollpolicy.h) on
 * series one sample a second, made here and recorded (two bench roll
 * timelines of docs/benchmarks/rolling-restart): the headroom budget (capacity and
 * CPU), the batch choice, a normal roll of three nodes that never pauses
 * or aborts (its make-before-break dip stays under the drop alarm), a hot
 * survivor that pauses the next batch and aborts only after 30 s above
 * 80 %, and a storm-shaped connection drop that aborts at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/rollpolicy.h"

static rollpolicy_node_t node(int64_t conns, int64_t cap, double cpu) {
  return (rollpolicy_node_t){
      .up = 1, .ready = 1, .connections = conns, .capacity = cap, .cpu = cpu};
}

static void test_headroom_with_capacities(void **state) {
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  char why[320];
  rollpolicy_node_t n[3] = {node(6000, 10000, 0.3), node(6000, 10000, 0.3), node(6000, 10000, 0.3)};
  size_t one_each[3] = {0, 1, 2};
  assert_true(rollpolicy_fleet_utilisation(n, 3) > 0.599 &&
              rollpolicy_fleet_utilisation(n, 3) < 0.601);
  assert_int_equal(rollpolicy_headroom(&p, n, 3, one_each, 3, why, sizeof why), 0);
  /* 70 %: above the 65 % budget */
  for (int i = 0; i < 3; i++) n[i].connections = 7000;
  assert_int_equal(rollpolicy_headroom(&p, n, 3, one_each, 3, why, sizeof why), 1);
  assert_non_null(strstr(why, "fleet utilisation 70 %"));
  assert_non_null(strstr(why, "65 %"));
  /* 60 % fleet, but two of three at once: 18 000 on a capacity of 10 000 */
  for (int i = 0; i < 3; i++) n[i].connections = 6000;
  size_t two_then_one[3] = {0, 0, 1};
  assert_int_equal(rollpolicy_headroom(&p, n, 3, two_then_one, 2, why, sizeof why), 1);
  assert_non_null(strstr(why, "batch 1"));
  assert_non_null(strstr(why, "18000 connection(s) on a capacity of 10000"));
  size_t all_at_once[3] = {0, 0, 0};
  assert_int_equal(rollpolicy_headroom(&p, n, 3, all_at_once, 1, why, sizeof why), 1);
  assert_non_null(strstr(why, "no survivor"));
}

static void test_headroom_from_cpu(void **state) {
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  char why[320];
  rollpolicy_node_t n[4] = {node(100, 0, 0.40), node(100, 0, 0.50), node(100, 0, 0.30),
                            node(100, 0, 0.40)};
  size_t one_each[4] = {0, 1, 2, 3};
  assert_true(rollpolicy_fleet_utilisation(n, 4) > 0.399 &&
              rollpolicy_fleet_utilisation(n, 4) < 0.401);
  assert_int_equal(rollpolicy_headroom(&p, n, 4, one_each, 4, why, sizeof why), 0);
  size_t halves[4] = {0, 0, 1, 1}; /* 1.6 of CPU on two survivors: 80 % */
  assert_int_equal(rollpolicy_headroom(&p, n, 4, halves, 2, why, sizeof why), 0);
  for (int i = 0; i < 4; i++) n[i].cpu = 0.6; /* 2.4 on two: 120 % */
  assert_int_equal(rollpolicy_headroom(&p, n, 4, halves, 2, why, sizeof why), 1);
  assert_non_null(strstr(why, "120 % CPU"));
  rollpolicy_node_t unknown[2] = {node(1, 0, -1), node(1, 0, -1)};
  assert_true(rollpolicy_fleet_utilisation(unknown, 2) < 0);
}

/* Batch choice: `batch` nodes at a time in the given order, the last
 * batch holding the rest; the batch under way (or the next) is marked
 * in_batch, no other node is. */
static void test_batches(void **state) {
  size_t of[7];
  assert_int_equal(rollpolicy_batches(7, 3, NULL, of), 3);
  const size_t want[7] = {0, 0, 0, 1, 1, 1, 2};
  assert_memory_equal(of, want, sizeof want);
  assert_int_equal(rollpolicy_batches(6, 3, NULL, of), 2);
  assert_int_equal(of[5], 1);
  assert_int_equal(rollpolicy_batches(3, 1, NULL, of), 3);
  assert_int_equal(of[0], 0);
  assert_int_equal(of[2], 2);
  assert_int_equal(rollpolicy_batches(3, 10, NULL, of), 1); /* all at once */
  assert_int_equal(of[0] + of[1] + of[2], 0);
  assert_int_equal(rollpolicy_batches(2, 0, NULL, of), 2); /* 0 taken as 1 */
  assert_int_equal(rollpolicy_batches(0, 3, NULL, of), 0);
  /* an order: nodes 4, 2 first, then 0, 3, then 1 */
  const size_t order[5] = {4, 2, 0, 3, 1};
  assert_int_equal(rollpolicy_batches(5, 2, order, of), 3);
  const size_t want_o[5] = {1, 2, 0, 1, 0};
  assert_memory_equal(of, want_o, sizeof want_o);

  rollpolicy_node_t n[5] = {node(1, 0, 0.1), node(1, 0, 0.1), node(1, 0, 0.1), node(1, 0, 0.1),
                            node(1, 0, 0.1)};
  n[1].in_batch = 1; /* stale: cleared */
  rollpolicy_mark_batch(n, 5, of, 1);
  for (int i = 0; i < 5; i++) assert_int_equal(n[i].in_batch, i == 0 || i == 3);
  rollpolicy_mark_batch(n, 5, of, 3); /* past the last batch */
  for (int i = 0; i < 5; i++) assert_false(n[i].in_batch);
  rollpolicy_mark_batch(n, 5, of, 0);
  rollpolicy_mark_batch(n, 5, of, ROLLPOLICY_NO_BATCH);
  for (int i = 0; i < 5; i++) assert_false(n[i].in_batch);
}

/* Before a batch, the next batch's nodes are not survivors: a hot node
 * about to be drained pauses nothing; the same node as a survivor does. */
static void test_next_batch_is_no_survivor(void **state) {
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  rollpolicy_t rp;
  assert_int_equal(rollpolicy_init(&rp, &p, 3), 0);
  size_t of[3];
  assert_int_equal(rollpolicy_batches(3, 1, NULL, of), 3);
  rollpolicy_node_t n[3] = {node(100, 0, 0.9), node(100, 0, 0.3), node(100, 0, 0.3)};
  rollpolicy_mark_batch(n, 3, of, 0); /* node 0 is next */
  assert_int_equal(rollpolicy_observe(&rp, 1000, n, 1, 0), ROLLPOLICY_GO);
  rollpolicy_mark_batch(n, 3, of, 1); /* node 1 is next: node 0 survives, hot */
  assert_int_equal(rollpolicy_observe(&rp, 2000, n, 1, 0), ROLLPOLICY_PAUSE);
  assert_non_null(strstr(rp.why, "node 0 at 90 %"));
  rollpolicy_free(&rp);
}

/* A normal roll of three nodes of 3 000 clients, one batch each: the
 * draining node's clients open their new connection before the old one
 * closes (the total rises a little, then comes back), and the restarted
 * node comes back empty. Nothing pauses, nothing aborts, no alarm. */
static void test_normal_roll(void **state) {
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  rollpolicy_t rp;
  assert_int_equal(rollpolicy_init(&rp, &p, 3), 0);
  int64_t c[3] = {3000, 3000, 3000};
  int64_t total0 = 9000;
  uint64_t t = 0;
  for (int b = 0; b < 3; b++) {
    rollpolicy_node_t n[3];
    for (int i = 0; i < 3; i++) n[i] = node(c[i], 0, 0.35), n[i].in_batch = i == b;
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 1, 0), ROLLPOLICY_GO);
    /* 20 s of drain: a twentieth of its clients move each second, each
     * briefly counted twice */
    int64_t per_s = (c[b] + 19) / 20;
    for (int s = 0; s < 20; s++) {
      int64_t move = c[b] < per_s ? c[b] : per_s;
      c[b] -= move;
      for (int k = 1; k <= 2; k++) c[(b + k) % 3] += move / 2;
      c[(b + 1) % 3] += move % 2;
      for (int i = 0; i < 3; i++)
        n[i] = node(c[i] + (i == b ? 0 : 40), 0, i == b ? 0.2 : 0.55), n[i].in_batch = i == b;
      n[b].ready = 0; /* draining */
      assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 0, 0), ROLLPOLICY_GO);
    }
    /* down 10 s, then back, empty */
    for (int s = 0; s < 10; s++) {
      for (int i = 0; i < 3; i++) n[i] = node(c[i], 0, 0.5), n[i].in_batch = i == b;
      n[b].up = n[b].ready = 0;
      assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 0, 0), ROLLPOLICY_GO);
    }
  }
  assert_int_equal(c[0] + c[1] + c[2], total0); /* everyone moved */
  assert_int_equal(c[2], 0);                    /* and the last node is empty */
  assert_false(rp.alarm);
  assert_false(rp.aborted);
  rollpolicy_free(&rp);
}

/* A survivor at 85 %: the next batch pauses at once; the restart aborts
 * after 30 one-second samples above 80 %, not before; a survivor that
 * cools down in between starts its count again. */
static void test_hot_survivor_pauses_then_aborts_after_30_s(void **state) {
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  rollpolicy_t rp;
  assert_int_equal(rollpolicy_init(&rp, &p, 3), 0);
  rollpolicy_node_t n[3] = {node(3000, 0, 0.5), node(3000, 0, 0.85), node(3000, 0, 0.5)};
  n[1].name = "gw-2";
  n[0].in_batch = 1; /* the next batch */
  uint64_t t = 0;
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 1, 0), ROLLPOLICY_PAUSE);
  assert_non_null(strstr(rp.why, "gw-2 at 85 %"));
  for (int s = 2; s <= 20; s++)
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 1, 0), ROLLPOLICY_PAUSE);
  n[1].cpu = 0.78; /* below the abort line, above the pause line */
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 1, 0), ROLLPOLICY_PAUSE);
  n[1].cpu = 0.85;
  for (int s = 1; s < 30; s++)
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 1, 0), ROLLPOLICY_PAUSE);
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 1, 0), ROLLPOLICY_ABORT);
  assert_non_null(strstr(rp.why, "gw-2 has been above 80 % for 30 s"));
  n[1].cpu = 0.1;
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 0, 0), ROLLPOLICY_ABORT); /* latched */
  rollpolicy_free(&rp);
  /* the node being restarted is not a survivor: its CPU never counts */
  assert_int_equal(rollpolicy_init(&rp, &p, 2), 0);
  rollpolicy_node_t m[2] = {node(10, 0, 0.99), node(10, 0, 0.2)};
  m[0].in_batch = 1;
  for (int s = 0; s < 60; s++)
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, m, 0, 0), ROLLPOLICY_GO);
  rollpolicy_free(&rp);
}

/* A storm: a survivor dies and its 3 000 clients (a third) are offline:
 * the alarm fires and aborts at the sample where the drop passes 5 % of
 * the window's peak. */
static void test_connection_drop_aborts(void **state) {
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  rollpolicy_t rp;
  assert_int_equal(rollpolicy_init(&rp, &p, 3), 0);
  rollpolicy_node_t n[3] = {node(3000, 0, 0.5), node(3000, 0, 0.5), node(3000, 0, 0.5)};
  uint64_t t = 0;
  for (int s = 0; s < 30; s++)
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 0, 0), ROLLPOLICY_GO);
  n[2].connections = 2600; /* 400 of 9 000: 4.4 % */
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 0, 0), ROLLPOLICY_GO);
  n[2].up = 0; /* 3 000 gone */
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, n, 0, 0), ROLLPOLICY_ABORT);
  assert_true(rp.alarm);
  assert_non_null(strstr(rp.why, "from 9000 to 6000"));
  rollpolicy_free(&rp);
  /* a slow decline spread over more than the window never fires */
  assert_int_equal(rollpolicy_init(&rp, &p, 1), 0);
  rollpolicy_node_t one = node(10000, 0, 0.3);
  for (int s = 0; s < 600; s++) {
    one.connections = 10000 - s * 5; /* 300 a minute: 3 % */
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 0), ROLLPOLICY_GO);
  }
  assert_false(rp.alarm);
  rollpolicy_free(&rp);
  /* with a population and abort_on_drop off: the alarm is reported, the
   * restart goes on */
  p.abort_on_drop = 0;
  assert_int_equal(rollpolicy_init(&rp, &p, 1), 0);
  one.connections = 1000;
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 1000), ROLLPOLICY_GO);
  one.connections = 940;
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 1000), ROLLPOLICY_GO);
  assert_true(rp.alarm);
  assert_int_equal(rp.alarm_ms, t);
  rollpolicy_free(&rp);
  /* a one-sample overcount (clients moving make-before-break between two
   * reads, counted on both nodes: 30 clients read as 34) is no peak to
   * fall from; a level held for two samples is */
  p.abort_on_drop = 1;
  assert_int_equal(rollpolicy_init(&rp, &p, 1), 0);
  const int64_t series[] = {30, 30, 34, 30, 30};
  for (size_t s = 0; s < sizeof series / sizeof series[0]; s++) {
    one.connections = series[s];
    assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 0), ROLLPOLICY_GO);
  }
  assert_false(rp.alarm);
  one.connections = 34; /* 34 twice: a level */
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 0), ROLLPOLICY_GO);
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 0), ROLLPOLICY_GO);
  one.connections = 30;
  assert_int_equal(rollpolicy_observe(&rp, t += 1000, &one, 0, 0), ROLLPOLICY_ABORT);
  rollpolicy_free(&rp);
}

/* ---- recorded series ------------------------------------------------------ */

/* Feed the policy a bench roll's timeline.csv (docs/benchmarks/
 * rolling-restart/...: each node's connections every 100 ms), one sample
 * a second from the first second every client is connected on; a node at
 * 0 connections counts as restarting (not up). Returns what the run
 * ended with: the alarm's state, and the verdicts seen. */
typedef struct {
  int samples, alarm, aborts;
  char why[320];
} replay_t;

static replay_t replay_timeline(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", CONVERGER_SOURCE_DIR, rel);
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("cannot open %s", path);
  rollpolicy_params_t p;
  rollpolicy_defaults(&p);
  rollpolicy_t rp;
  assert_int_equal(rollpolicy_init(&rp, &p, 3), 0);
  replay_t r = {0};
  char line[512];
  assert_non_null(fgets(line, sizeof line, f)); /* t_ms,conn_0,conn_1,conn_2,... */
  assert_non_null(strstr(line, "t_ms,conn_0,conn_1,conn_2,"));
  long long t, c[3], peak = 0;
  int started = 0;
  uint64_t next = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lld,%lld,%lld,%lld", &t, &c[0], &c[1], &c[2]) != 4) continue;
    long long total = c[0] + c[1] + c[2];
    if (total > peak) peak = total;
    if (!started && (total < peak || peak < 1000)) continue; /* still connecting */
    started = 1;
    if ((uint64_t)t < next) continue;
    next = (uint64_t)t + 1000;
    rollpolicy_node_t n[3];
    for (int i = 0; i < 3; i++) {
      n[i] = node(c[i], 0, 0.3);
      n[i].up = n[i].ready = c[i] > 0;
    }
    if (rollpolicy_observe(&rp, (uint64_t)t + 1, n, 0, 0) == ROLLPOLICY_ABORT) r.aborts++;
    r.samples++;
  }
  fclose(f);
  r.alarm = rp.alarm;
  snprintf(r.why, sizeof r.why, "%s", rp.why);
  rollpolicy_free(&rp);
  return r;
}

/* A real make-before-break roll of 10 000 clients over three nodes
 * (converger roll as the controller): no sample trips the drop alarm.
 * The same clients rolled without drain frames, reconnecting through the
 * admission queue (the "after" scenario of the admission-queue decision
 * record): the alarm fires, with the figures. */
static void test_recorded_rolls(void **state) {
  (void)state;
  replay_t ok = replay_timeline("docs/benchmarks/rolling-restart/controller/roll/timeline.csv");
  assert_true(ok.samples > 60);
  if (ok.alarm) fail_msg("a make-before-break roll tripped the alarm: %s", ok.why);
  assert_int_equal(ok.aborts, 0);
  replay_t storm = replay_timeline("docs/benchmarks/rolling-restart/adr/after/timeline.csv");
  assert_true(storm.samples > 30);
  assert_true(storm.alarm);
  assert_true(storm.aborts > 0);
  assert_non_null(strstr(storm.why, "connections"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_headroom_with_capacities),
      cmocka_unit_test(test_headroom_from_cpu),
      cmocka_unit_test(test_batches),
      cmocka_unit_test(test_next_batch_is_no_survivor),
      cmocka_unit_test(test_normal_roll),
      cmocka_unit_test(test_hot_survivor_pauses_then_aborts_after_30_s),
      cmocka_unit_test(test_connection_drop_aborts),
      cmocka_unit_test(test_recorded_rolls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
