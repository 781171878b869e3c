/*
 * test_lifecycle: a node's phases (lifecycle.h) on the real node, built by
 * node_open on a loop of the test's own, with its real store pool (SQLite
 * in a temporary directory), listeners on free loopback ports and signal
 * handlers. A watcher on the loop records every phase the node passes
 * through, so each test checks the whole way from ready to the end of the
 * loop:
 *   - SIGTERM: ready -> draining -> stopping -> stopped, the loop ends;
 *   - SIGTERM with CONVERGER_DRAIN_SHUTDOWN_MS=0, and SIGINT: no draining;
 *   - a second SIGTERM, node_drain while draining: nothing changes;
 *   - two nodes in one process, each on its loop, stopped by one SIGTERM;
 *   - a start that fails closes its own handles, not the caller's.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>
#include <uv.h>

#include "common/util.h"
#include "core/config.h"
#include "core/errors.h"
#include "lifecycle.h"
#include "node.h"
#include "serve.h"

#define PHASES_MAX 16
#define RUN_MS_MAX 20000 /* a test's loop must end well before this */

typedef struct {
  char dir[64];
  config_t cfg;
  uv_loop_t loop;
  node_t *node;
  uv_check_t watch; /* records node->phase after every loop turn */
  node_phase_t seen[PHASES_MAX];
  int nseen;
} tnode_t;

static void record(tnode_t *t) {
  node_phase_t p = t->node->phase;
  if (t->nseen == 0 || t->seen[t->nseen - 1] != p) {
    assert_true(t->nseen < PHASES_MAX);
    t->seen[t->nseen++] = p;
  }
}

static void watch_cb(uv_check_t *h) {
  tnode_t *t = h->data;
  record(t);
  /* the node has closed its handles: the watcher goes too, so that the
   * loop can end */
  if (t->node->phase == NODE_STOPPED && t->node->net.nconns == 0 && !t->node->bus)
    uv_close((uv_handle_t *)h, NULL);
}

/* Start a node named `id` with the extra settings `extra` (NULL-ended). */
static void tnode_start(tnode_t *t, const char *id, const char *const *extra) {
  memset(t, 0, sizeof *t);
  strcpy(t->dir, "/tmp/converger-lc-XXXXXX");
  assert_non_null(mkdtemp(t->dir));
  char db[128], node_id[64];
  snprintf(db, sizeof db, "--database-url=sqlite:%s/lc.db", t->dir);
  snprintf(node_id, sizeof node_id, "--node-id=%s", id);
  char *argv[16] = {db, node_id, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0",
                    "--pool-size=2"};
  int argc = 5;
  for (int i = 0; extra && extra[i]; i++) argv[argc++] = (char *)extra[i];
  assert_int_equal(config_parse(&t->cfg, argc, argv), 0);
  int key_from_file = 0;
  assert_int_equal(config_load_secrets(&t->cfg, 1, &key_from_file), 0);
  assert_int_equal(uv_loop_init(&t->loop), 0);
  assert_int_equal(node_open(&t->loop, &t->cfg, key_from_file, &t->node), 0);
  assert_non_null(t->node);
  uv_check_init(&t->loop, &t->watch);
  t->watch.data = t;
  uv_check_start(&t->watch, watch_cb);
  uv_unref((uv_handle_t *)&t->watch); /* it does not keep the loop alive */
  record(t);
  assert_int_equal(t->node->phase, NODE_READY);
}

/* One turn of the node's loop without blocking; 0 once the loop ended. */
static int tnode_turn(tnode_t *t) { return uv_run(&t->loop, UV_RUN_NOWAIT); }

/* Turn `n` loops until every one of them has ended, failing after
 * RUN_MS_MAX. */
static void run_until_ended(tnode_t **ts, int n) {
  uint64_t until = util_mono_ms() + RUN_MS_MAX;
  int alive = n;
  int done[8] = {0};
  while (alive > 0) {
    for (int i = 0; i < n; i++)
      if (!done[i] && !tnode_turn(ts[i])) {
        done[i] = 1;
        alive--;
      }
    if (util_mono_ms() > until)
      fail_msg("%d node loop(s) still running after %d ms", alive, RUN_MS_MAX);
    uv_sleep(1);
  }
}

/* Turn the loop until the node is in `phase` (or later), failing after
 * RUN_MS_MAX. */
static void run_until_phase(tnode_t *t, node_phase_t phase) {
  uint64_t until = util_mono_ms() + RUN_MS_MAX;
  while (t->node->phase < phase) {
    tnode_turn(t);
    if (util_mono_ms() > until)
      fail_msg("still %s after %d ms", node_phase_name(t->node->phase), RUN_MS_MAX);
    uv_sleep(1);
  }
}

static void tnode_free(tnode_t *t) {
  node_free(t->node);
  assert_int_equal(uv_loop_close(&t->loop), 0); /* every handle was closed */
  config_free(&t->cfg);
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf %s", t->dir);
  assert_int_equal(system(cmd), 0);
}

static void expect_phases(const tnode_t *t, const node_phase_t *want, int n) {
  for (int i = 0; i < t->nseen && i < n; i++)
    if (t->seen[i] != want[i])
      fail_msg("phase %d: %s, want %s", i, node_phase_name(t->seen[i]), node_phase_name(want[i]));
  assert_int_equal(t->nseen, n);
}

/* The two ways from ready to the end of the loop. */
static const node_phase_t DRAIN_THEN_STOP[] = {NODE_READY, NODE_DRAINING, NODE_STOPPING,
                                               NODE_STOPPED};
static const node_phase_t STOP_AT_ONCE[] = {NODE_READY, NODE_STOPPING, NODE_STOPPED};
#define NPHASES(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* Turn the node's loop until it ends; it went through `want`, no more. */
static void ends_through(tnode_t *t, const node_phase_t *want, int n) {
  tnode_t *all[] = {t};
  run_until_ended(all, 1);
  expect_phases(t, want, n);
}

/* SIGTERM: the drain runs (nothing to move: it ends at once), then the
 * stop, and the loop ends. A second SIGTERM while draining, and a
 * node_drain, change nothing. */
static void test_sigterm_drains_then_stops(void **state) {
  (void)state;
  tnode_t t;
  tnode_start(&t, "lc-a", NULL);
  /* the drain's timer first runs on the loop turn after the signal's, so
   * the watcher sees the node draining before the drain ends it */
  assert_int_equal(raise(SIGTERM), 0);
  run_until_phase(&t, NODE_DRAINING);
  assert_int_equal(node_drain(t.node, "test"), -CV_EEXISTS);
  assert_int_equal(raise(SIGTERM), 0); /* ignored: already draining */
  ends_through(&t, DRAIN_THEN_STOP, NPHASES(DRAIN_THEN_STOP));
  tnode_free(&t);
}

/* SIGTERM with CONVERGER_DRAIN_SHUTDOWN_MS=0 stops at once: no draining. */
static void test_sigterm_without_drain_stops(void **state) {
  (void)state;
  tnode_t t;
  const char *extra[] = {"--drain-shutdown-ms=0", NULL};
  tnode_start(&t, "lc-b", extra);
  assert_int_equal(raise(SIGTERM), 0);
  ends_through(&t, STOP_AT_ONCE, NPHASES(STOP_AT_ONCE));
  tnode_free(&t);
}

/* SIGINT stops at once, from ready; node_drain after it is refused. */
static void test_sigint_stops(void **state) {
  (void)state;
  tnode_t t;
  tnode_start(&t, "lc-c", NULL);
  assert_int_equal(raise(SIGINT), 0);
  run_until_phase(&t, NODE_STOPPING);
  assert_int_equal(node_drain(t.node, "test"), -CV_EEXISTS);
  ends_through(&t, STOP_AT_ONCE, NPHASES(STOP_AT_ONCE));
  tnode_free(&t);
}

/* Two nodes in one process, each on its own loop, with their own
 * settings, store and listeners: one SIGTERM reaches both, and each goes
 * its own way to the end (one drains, the other has no drain). */
static void test_two_nodes_in_one_process(void **state) {
  (void)state;
  tnode_t a, b;
  tnode_start(&a, "lc-d", NULL);
  const char *extra[] = {"--drain-shutdown-ms=0", NULL};
  tnode_start(&b, "lc-e", extra);
  assert_int_not_equal(a.cfg.listen_port, b.cfg.listen_port);
  assert_true(a.node->metrics != b.node->metrics);
  assert_int_equal(raise(SIGTERM), 0);
  tnode_t *all[] = {&a, &b};
  run_until_ended(all, 2);
  expect_phases(&a, DRAIN_THEN_STOP, NPHASES(DRAIN_THEN_STOP));
  expect_phases(&b, STOP_AT_ONCE, NPHASES(STOP_AT_ONCE));
  tnode_free(&a);
  tnode_free(&b);
}

/* A loop handle of the caller's, there before node_open and after it. */
static void caller_timer_cb(uv_timer_t *h) { (void)h; }

/* A start that fails (the listen port taken: after the store's pool, the
 * bus and the drain were made; a public key file that does not exist:
 * before the pool) closes what node_open made and nothing else (serve.h):
 * the caller's timer on the same loop is neither closed nor stopped, and
 * once the caller closes it the loop closes clean, so nothing of the
 * node's was left on it. */
static void test_failed_start_closes_only_its_own(void **state) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(fd, 1), 0);
  socklen_t len = sizeof sa;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  char taken[64];
  snprintf(taken, sizeof taken, "--listen=127.0.0.1:%d", ntohs(sa.sin_port));
  const char *cases[][2] = {{taken, NULL}, {"--token-public-keys=/nonexistent/keys.pem", NULL}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tnode_t t;
    memset(&t, 0, sizeof t);
    strcpy(t.dir, "/tmp/converger-lc-XXXXXX");
    assert_non_null(mkdtemp(t.dir));
    char db[128];
    snprintf(db, sizeof db, "--database-url=sqlite:%s/lc.db", t.dir);
    char *argv[8] = {db,
                     "--node-id=fails",
                     "--listen=127.0.0.1:0",
                     "--admin-listen=127.0.0.1:0",
                     "--pool-size=2",
                     (char *)cases[i][0]};
    assert_int_equal(config_parse(&t.cfg, 6, argv), 0);
    int key_from_file = 0;
    assert_int_equal(config_load_secrets(&t.cfg, 1, &key_from_file), 0);
    assert_int_equal(uv_loop_init(&t.loop), 0);
    uv_timer_t mine;
    uv_timer_init(&t.loop, &mine);
    uv_timer_start(&mine, caller_timer_cb, 60000, 60000);
    assert_int_equal(node_open(&t.loop, &t.cfg, key_from_file, &t.node), 1);
    assert_null(t.node);
    assert_false(uv_is_closing((uv_handle_t *)&mine));
    assert_true(uv_is_active((uv_handle_t *)&mine));
    uv_close((uv_handle_t *)&mine, NULL);
    assert_int_equal(uv_run(&t.loop, UV_RUN_NOWAIT), 0);
    tnode_free(&t); /* uv_loop_close: 0, every handle of the node's is gone */
  }
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigterm_drains_then_stops),
      cmocka_unit_test(test_sigterm_without_drain_stops),
      cmocka_unit_test(test_sigint_stops),
      cmocka_unit_test(test_two_nodes_in_one_process),
      cmocka_unit_test(test_failed_start_closes_only_its_own),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
