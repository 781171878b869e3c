/* Unit tests for tools/sim/fanout (`converger sim fanout`): the wire sizes
 * against the bytes themselves, NOTIFY to all as R x bytes on every node,
 * small fleets computed by hand, the spread of fixed-size conversations,
 * the size distributions' means, determinism, and parameter errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim/fanout.h"

/* A small fleet: `nodes` nodes, `clients` clients, fixed size 3. */
static fanout_params_t small(int64_t nodes, int64_t clients) {
  fanout_params_t p;
  fanout_params_default(&p);
  p.nodes = nodes;
  p.clients = clients;
  p.size_max = clients < 1000 ? clients : 1000;
  return p;
}

static void assert_near(double got, double want, double rel) {
  double d = got - want;
  if (d < 0) d = -d;
  if (d > rel * (want < 0 ? -want : want) + 1e-9)
    fail_msg("got %.9g, want %.9g (+- %g)", got, want, rel);
}

static void test_wire_sizes_are_the_bytes(void **state) {
  (void)state;
  char payload[301];
  memset(payload, 'x', 300);
  payload[300] = 0;
  /* a NotificationResponse: 'A', Int32 length, Int32 pid, channel NUL, payload NUL */
  size_t notify = 1 + 4 + 4 + strlen("converger") + 1 + strlen(payload) + 1;
  assert_int_equal(notify, 320);
  assert_near(fanout_notify_bytes_per_msg(300, 1), 320, 0);
  /* two packed: "b\n" "300 <payload>" "300 <payload>", one frame */
  size_t packed = 1 + 4 + 4 + 10 + strlen("b\n") + 2 * (strlen("300 ") + 300) + 1;
  assert_near(fanout_notify_bytes_per_msg(300, 2), (double)packed / 2, 0);

  const char *ch = "cvg.m.0123456789abcdef"; /* a 16-byte id */
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "*3\r\n$7\r\nmessage\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n",
                   strlen(ch), ch, strlen(payload), payload);
  assert_int_equal(fanout_push_bytes((int64_t)strlen(ch), 300), n);
  assert_int_equal(n, 354);
  n = snprintf(buf, sizeof buf, "*3\r\n$7\r\nPUBLISH\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", strlen(ch),
               ch, strlen(payload), payload);
  assert_int_equal(fanout_push_bytes((int64_t)strlen(ch), 300), n); /* the command, as long */
  assert_int_equal(fanout_reply_bytes(3), (int64_t)strlen(":3\r\n"));
  assert_int_equal(fanout_reply_bytes(480), (int64_t)strlen(":480\r\n"));
  n = snprintf(buf, sizeof buf, "*3\r\n$9\r\nsubscribe\r\n$%zu\r\n%s\r\n:8466\r\n", strlen(ch), ch);
  assert_int_equal(fanout_confirm_bytes(0, (int64_t)strlen(ch), 8466), n);
  n = snprintf(buf, sizeof buf, "*3\r\n$11\r\nunsubscribe\r\n$%zu\r\n%s\r\n:8466\r\n", strlen(ch),
               ch);
  assert_int_equal(fanout_confirm_bytes(1, (int64_t)strlen(ch), 8466), n);
}

/* NOTIFY to all: every node receives R x the notification's bytes,
 * whatever the conversations and wherever the clients. */
static void test_notify_is_r_times_bytes_on_every_node(void **state) {
  (void)state;
  for (int dist = FANOUT_SIZE_FIXED; dist <= FANOUT_SIZE_ZIPF; dist++) {
    fanout_params_t p = small(7, 1000);
    p.appends_per_s = 1234;
    p.msg_bytes = 100;
    p.notify_batch = 3;
    p.size_dist = dist;
    char err[256];
    assert_int_equal(fanout_params_check(&p, err, sizeof err), 0);
    fanout_t f;
    assert_int_equal(fanout_init(&f, &p), 0);
    f.clients_on[3] += f.clients_on[4], f.clients_on[4] = 0; /* an empty node hears it too */
    assert_int_equal(fanout_run(&f), 0);
    /* 3 packed: (frame 19 + "b\n" + NUL) / 3 + "100 " + 100 */
    double per_msg = (1 + 4 + 4 + 10 + 2 + 1) / 3.0 + 4 + 100;
    for (int k = 0; k < 7; k++) assert_true(f.notify_in[k] == 1234 * per_msg);
    fanout_free(&f);
  }
}

/* 2 nodes, every client on node 0: node 1's interest-routed bytes are the
 * control channel's alone; node 0 keeps every message, once each. */
static void test_all_on_one_node_leaves_the_other_control_only(void **state) {
  (void)state;
  fanout_params_t p = small(2, 100);
  p.appends_per_s = 600;
  p.msg_bytes = 300;
  p.bus_instances = 1;
  fanout_t f;
  assert_int_equal(fanout_init(&f, &p), 0);
  f.clients_on[0] = 100, f.clients_on[1] = 0;
  assert_int_equal(fanout_run(&f), 0);
  assert_int_equal(f.convs, 167); /* 100 clients x 5 / 3 */
  double push = 354, push_ctl = 4 + 13 + (1 + 1 + 2 + 7 + 2) + (1 + 3 + 2 + 200 + 2); /* 238 */
  /* node 1: no conversation, no client: 10 control messages/s */
  assert_true(f.msg_in[1] == 0 && f.kept[1] == 0 && f.pairs[1] == 0);
  assert_near(f.control_in[1], 10 * push_ctl, 1e-12);
  /* node 0: all 600 messages/s, once each (3 subscribers, one node), the
   * replies ":1\r\n" to its 600 PUBLISHes; no subscription is alone on
   * the node, so reconnects cost no (UN)SUBSCRIBE */
  assert_near(f.kept[0], 600, 1e-12);
  assert_near(f.msg_in[0], 600 * push, 1e-12);
  assert_int_equal(f.pairs[0], 167);
  assert_int_equal(f.single[0], 0);
  assert_near(f.control_in[0], 10 * push_ctl + 600 * 4, 1e-12);
  /* the one bus instance: every pair and both nodes on the control
   * channel; out, each message once and its reply, the control channel to
   * 2 nodes and its reply; in, the PUBLISHes */
  assert_int_equal(f.bus_subs[0], 167 + 2);
  assert_near(f.bus_egress[0], 600 * (push + 4) + 10 * (2 * push_ctl + 4), 1e-12);
  assert_near(f.bus_ingress[0], 600 * push + 10 * push_ctl, 1e-12);
  fanout_free(&f);
}

/* One node: every conversation's subscribers are all on it. */
static void test_one_node_keeps_everything(void **state) {
  (void)state;
  fanout_params_t p = small(1, 3000);
  p.size_dist = FANOUT_SIZE_GEOMETRIC;
  fanout_t f;
  assert_int_equal(fanout_init(&f, &p), 0);
  assert_int_equal(f.clients_on[0], 3000);
  assert_int_equal(fanout_run(&f), 0);
  assert_near(f.kept[0], (double)p.appends_per_s, 1e-12);
  assert_int_equal(f.pairs[0], f.convs);
  assert_int_equal(f.pairs_total, f.convs);
  fanout_free(&f);
}

/* Fixed size 3 over 48 nodes: a conversation is on 1 - (47/48)^3 of them
 * on average, each node keeps that share of the messages, and the bus
 * holds every pair once plus the control channel's. */
static void test_fixed_size_spreads_as_expected(void **state) {
  (void)state;
  fanout_params_t p = small(48, 96000);
  p.bus_instances = 5;
  fanout_t f;
  assert_int_equal(fanout_init(&f, &p), 0);
  assert_int_equal(fanout_run(&f), 0);
  assert_int_equal(f.convs, 160000);
  assert_int_equal(f.subs_total, 480000);
  double d = 48 * (1 - (47.0 / 48) * (47.0 / 48) * (47.0 / 48)); /* distinct nodes */
  assert_near((double)f.pairs_total, 160000 * d, 0.005);
  double kept = 0;
  for (int k = 0; k < 48; k++) {
    assert_near(f.kept[k] / (double)p.appends_per_s, d / 48, 0.05);
    kept += f.kept[k];
  }
  assert_near(kept, (double)p.appends_per_s * d, 0.005);
  int64_t subs = 0;
  for (int b = 0; b < 5; b++) subs += f.bus_subs[b];
  assert_int_equal(subs, f.pairs_total + 48);
  fanout_free(&f);
}

/* Geometric and Zipf sizes have the mean asked for, within sampling. */
static void test_size_distributions_have_the_mean(void **state) {
  (void)state;
  for (int dist = FANOUT_SIZE_GEOMETRIC; dist <= FANOUT_SIZE_ZIPF; dist++) {
    fanout_params_t p = small(16, 200000);
    p.size_dist = dist;
    p.size_max = 1000;
    fanout_t f;
    assert_int_equal(fanout_init(&f, &p), 0);
    assert_int_equal(fanout_run(&f), 0);
    assert_near((double)f.subs_total / (double)f.convs, 3.0, 0.05);
    assert_true(f.largest <= 1000 && f.largest > 10);
    if (dist == FANOUT_SIZE_ZIPF) assert_true(f.zipf_exponent > 1.5 && f.zipf_exponent < 3.5);
    fanout_free(&f);
  }
}

/* With sizes weighting the rate, a skewed distribution's large
 * conversations reach every node: each keeps far more than M / N. */
static void test_large_conversations_dominate_interest(void **state) {
  (void)state;
  fanout_params_t p = small(48, 96000);
  p.size_dist = FANOUT_SIZE_ZIPF;
  p.size_max = 10000;
  fanout_t f;
  assert_int_equal(fanout_init(&f, &p), 0);
  assert_int_equal(fanout_run(&f), 0);
  double fixed_share = 1 - (47.0 / 48) * (47.0 / 48) * (47.0 / 48);
  for (int k = 0; k < 48; k++)
    assert_true(f.kept[k] / (double)p.appends_per_s > 2 * fixed_share / 48);
  fanout_free(&f);
}

static json_t *summary_of(const fanout_params_t *p) {
  fanout_t f;
  assert_int_equal(fanout_init(&f, p), 0);
  assert_int_equal(fanout_run(&f), 0);
  json_t *s = fanout_summary(&f);
  assert_non_null(s);
  fanout_free(&f);
  return s;
}

static void test_same_seed_same_summary(void **state) {
  (void)state;
  fanout_params_t p = small(20, 20000);
  p.size_dist = FANOUT_SIZE_ZIPF;
  json_t *a = summary_of(&p), *b = summary_of(&p);
  assert_true(json_equal(a, b));
  p.seed = 2;
  json_t *c = summary_of(&p);
  assert_false(json_equal(a, c));
  /* the paper's arithmetic from the same parameters */
  const json_t *paper = json_object_get(a, "paper");
  assert_near(json_number_value(json_object_get(paper, "node_in_bytes_per_s")), 20000.0 * 300, 0);
  assert_near(json_number_value(json_object_get(paper, "postgres_egress_bytes_per_s")),
              20.0 * 20000 * 300, 0);
  json_decref(a), json_decref(b), json_decref(c);
}

static void test_params_errors(void **state) {
  (void)state;
  char err[256];
  fanout_params_t p;
  fanout_params_default(&p);
  assert_int_equal(fanout_params_check(&p, err, sizeof err), 0);
  p.size_dist = FANOUT_SIZE_ZIPF;
  p.online_per_conv = 60000; /* above the middle of [1, 100000] */
  assert_int_equal(fanout_params_check(&p, err, sizeof err), -1);
  assert_non_null(strstr(err, "zipf"));
  fanout_params_default(&p);
  p.notify_batch = 27; /* 2 + 27 x 304 > 7999 */
  assert_int_equal(fanout_params_check(&p, err, sizeof err), -1);
  p.notify_batch = 26;
  assert_int_equal(fanout_params_check(&p, err, sizeof err), 0);
  p.size_dist = FANOUT_SIZE_GEOMETRIC;
  p.clients = 1000; /* --conv-size-max 100000 is above the clients */
  assert_int_equal(fanout_params_check(&p, err, sizeof err), -1);
  assert_non_null(strstr(err, "--conv-size-max"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wire_sizes_are_the_bytes),
      cmocka_unit_test(test_notify_is_r_times_bytes_on_every_node),
      cmocka_unit_test(test_all_on_one_node_leaves_the_other_control_only),
      cmocka_unit_test(test_one_node_keeps_everything),
      cmocka_unit_test(test_fixed_size_spreads_as_expected),
      cmocka_unit_test(test_size_distributions_have_the_mean),
      cmocka_unit_test(test_large_conversations_dominate_interest),
      cmocka_unit_test(test_same_seed_same_summary),
      cmocka_unit_test(test_params_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
