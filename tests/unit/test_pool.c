/* Unit tests for store/pool: jobs run on workers with their own store and
 * come back on the loop in one piece; a burst is woken once per loop turn;
 * pool_close cancels what has not started, also jobs submitted by done
 * callbacks while closing; the queue-delay rule drops the jobs of a slow
 * pool and nothing else (on an inline pool with a fake clock); a job whose deadline passes in the
 * queue comes back at its deadline, not run, while its worker is still busy; a running job's store
 * calls stop at its deadline, and the next job's do not; batched jobs gather into one call, one
 * batch at a time per lane, the others untouched; the loop ends with no handle left open. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>
#include <uv.h>

#include "core/metrics.h"
#include "core/errors.h"
#include "common/util.h"
#include "store/pool.h"

typedef struct {
  pool_job_t job;
  int id;
  int ran_on_worker;
  uv_thread_t worker;
  int status;
  int *done_order;
  int *ndone;
} job_t;

static char dir[64], url[128];
static uv_thread_t loop_thread;

static int setup(void **state) {
  strcpy(dir, "/tmp/converger-pool-XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(url, sizeof url, "sqlite:%s/p.db", dir);
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void work_cb(pool_job_t *job, store_t *db) {
  job_t *j = container_of(job, job_t, job);
  j->worker = uv_thread_self();
  j->ran_on_worker = !uv_thread_equal(&j->worker, &loop_thread);
  j->status = store_ping(db);
}

static void done_cb(pool_job_t *job) {
  job_t *j = container_of(job, job_t, job);
  uv_thread_t self = uv_thread_self();
  assert_true(uv_thread_equal(&self, &loop_thread)); /* done runs on the loop */
  j->done_order[(*j->ndone)++] = j->id;
}

static void test_jobs_run_on_workers_and_come_back(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  assert_int_equal(pool_start(&loop, url, NULL, 4, NULL, &pool), 0);
  enum { N = 500 };
  job_t *jobs = calloc(N, sizeof *jobs);
  int order[N], ndone = 0;
  for (int i = 0; i < N; i++) {
    jobs[i].id = i;
    jobs[i].status = -1;
    jobs[i].done_order = order;
    jobs[i].ndone = &ndone;
    pool_submit(pool, &jobs[i].job, work_cb, done_cb);
  }
  assert_int_equal(pool_in_flight(pool), N);
  assert_int_equal(ndone, 0); /* never synchronously */
  while (ndone < N) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(pool_in_flight(pool), 0);
  int seen[N] = {0};
  for (int i = 0; i < N; i++) {
    assert_int_equal(jobs[i].status, 0);
    assert_true(jobs[i].ran_on_worker);
    assert_false(jobs[i].job.canceled);
    seen[order[i]]++;
  }
  for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  free(jobs);
}

/* A job that blocks its worker until released, to hold the pool busy. */
static uv_sem_t gate;
static void blocking_work_cb(pool_job_t *job, store_t *db) {
  uv_sem_wait(&gate);
  work_cb(job, db);
}

static pool_t *closing_pool;
static job_t late;
static void resubmit_done_cb(pool_job_t *job) {
  done_cb(job);
  /* A done callback that submits more work while the pool closes. */
  if (closing_pool) {
    late.id = 99;
    late.status = -1;
    late.done_order = container_of(job, job_t, job)->done_order;
    late.ndone = container_of(job, job_t, job)->ndone;
    pool_t *p = closing_pool;
    closing_pool = NULL;
    pool_submit(p, &late.job, work_cb, done_cb);
  }
}

static void release_gate(void *arg) {
  usleep(100 * 1000);
  uv_sem_post(&gate);
}

static void test_close_cancels_queued_jobs(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  uv_sem_init(&gate, 0);
  assert_int_equal(pool_start(&loop, url, NULL, 1, NULL, &pool), 0);
  job_t jobs[5] = {0};
  int order[8], ndone = 0;
  for (int i = 0; i < 5; i++) {
    jobs[i].id = i;
    jobs[i].status = -1;
    jobs[i].done_order = order;
    jobs[i].ndone = &ndone;
  }
  pool_submit(pool, &jobs[0].job, blocking_work_cb, done_cb);
  for (int i = 1; i < 5; i++) pool_submit(pool, &jobs[i].job, work_cb, resubmit_done_cb);
  uv_run(&loop, UV_RUN_NOWAIT); /* the kick wakes the single worker: job 0 blocks it */
  usleep(50 * 1000);
  uv_thread_t releaser;
  uv_thread_create(&releaser, release_gate, NULL);
  closing_pool = pool;
  pool_close(pool); /* job 0 finishes; 1..4 and the late one are canceled */
  uv_thread_join(&releaser);
  assert_int_equal(ndone, 6);
  assert_int_equal(jobs[0].status, 0);
  assert_false(jobs[0].job.canceled);
  for (int i = 1; i < 5; i++) {
    assert_true(jobs[i].job.canceled);
    assert_int_equal(jobs[i].status, -1); /* work never ran */
  }
  assert_true(late.job.canceled);
  assert_int_equal(late.status, -1);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  uv_sem_destroy(&gate);
}

/* The fake clock of test_queue_delay_rule (util_mono_fake). */
static uint64_t fake_now;

/* A job of a slow store: 20 ms of the fake clock. */
static void slow_work_cb(pool_job_t *job, store_t *db) {
  work_cb(job, db);
  fake_now += 20;
}

/* The queue-delay rule, on an inline pool (one "worker": pool_step) and a
 * fake clock: every job takes 20 ms, target 5 ms, interval 20 ms. The first
 * jobs run; once an interval has passed in which no job waited less than
 * the target, jobs that waited more than twice the target are dropped
 * without running. Once the queue has drained, a new burst is not dropped
 * for the old verdict. */
static void test_queue_delay_rule_drops_jobs_of_a_slow_pool(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  fake_now = 1000;
  util_mono_fake(&fake_now);
  assert_int_equal(pool_start_inline(&loop, url, NULL, NULL, &pool), 0);
  pool_set_queue_rule(pool, 5, 20);
  enum { N = 30 };
  job_t jobs[N];
  memset(jobs, 0, sizeof jobs);
  int order[N + 1], ndone = 0, order2[2], ndone2 = 0;
  for (int i = 0; i < N; i++) {
    jobs[i].id = i;
    jobs[i].status = -1;
    jobs[i].done_order = order;
    jobs[i].ndone = &ndone;
  }
  for (int i = 0; i < N; i++) pool_submit(pool, &jobs[i].job, slow_work_cb, done_cb);
  while (pool_step(pool)) {
  }
  assert_int_equal(ndone, N);
  int dropped = 0;
  for (int i = 0; i < N; i++) {
    assert_false(jobs[i].job.canceled);
    assert_int_equal(order[i], i); /* done in submission order */
    if (jobs[i].job.dropped) {
      dropped++;
      assert_int_equal(jobs[i].status, -1); /* work never ran */
      assert_true(jobs[i].job.wait_ms > 10);
    } else {
      assert_int_equal(jobs[i].status, 0);
    }
  }
  assert_false(jobs[0].job.dropped);
  assert_true(dropped >= N / 2);
  /* The queue drained: the next burst starts afresh. Two jobs at once
   * wait 0 and 20 ms; the second is not dropped although 20 > 2 x 5: the
   * interval before it had a job under the target (the first), and the
   * verdict of the overload above is forgotten. */
  fake_now += 60;
  job_t again[2];
  memset(again, 0, sizeof again);
  for (int i = 0; i < 2; i++) {
    again[i].id = 100 + i;
    again[i].status = -1;
    again[i].done_order = order2;
    again[i].ndone = &ndone2;
    pool_submit(pool, &again[i].job, slow_work_cb, done_cb);
  }
  while (pool_step(pool)) {
  }
  assert_int_equal(ndone2, 2);
  for (int i = 0; i < 2; i++) {
    assert_false(again[i].job.dropped);
    assert_int_equal(again[i].status, 0);
    assert_false(again[i].ran_on_worker); /* inline: on the caller's thread */
  }
  assert_true(again[1].job.wait_ms > 10);
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  util_mono_fake(NULL);
}

/* The value of one series in the metrics exposition, -1 when absent. */
static double metric_value(metrics_t *m, const char *series) {
  size_t len = 0;
  char *text = metrics_render(m, &len);
  assert_non_null(text);
  double v = -1;
  size_t n = strlen(series);
  for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, series, n) == 0 && line[n] == ' ') v = strtod(line + n + 1, NULL);
  free(text);
  return v;
}

/* One worker held busy by a job without a deadline: a job queued behind it
 * with a 100 ms deadline comes back at that deadline (the sweep), not run,
 * dropped and timed out, while the worker is still held; one whose
 * deadline has passed when the worker takes it is not run either; one with
 * a deadline far ahead runs. The queue-delay rule is out of the way (a
 * target of 100 s), so the deadlines alone decide. Only the expired jobs
 * count in converger_store_timeouts_total, none in the dropped total. */
static void test_deadline_expires_queued_jobs(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  uv_sem_init(&gate, 0);
  metrics_t *m = metrics_new();
  assert_non_null(m);
  assert_int_equal(pool_start(&loop, url, NULL, 1, m, &pool), 0);
  pool_set_queue_rule(pool, 100000, 100000);
  job_t jobs[4];
  memset(jobs, 0, sizeof jobs);
  int order[4], ndone = 0;
  for (int i = 0; i < 4; i++) {
    jobs[i].id = i;
    jobs[i].status = -1;
    jobs[i].done_order = order;
    jobs[i].ndone = &ndone;
    jobs[i].job.kind = "deadline-test";
  }
  uint64_t t0 = util_mono_ms();
  pool_submit(pool, &jobs[0].job, blocking_work_cb, done_cb); /* holds the worker */
  jobs[1].job.deadline_ms = t0 + 100;
  pool_submit(pool, &jobs[1].job, work_cb, done_cb);
  jobs[2].job.deadline_ms = t0 + 100000;
  pool_submit(pool, &jobs[2].job, work_cb, done_cb);
  while (ndone < 1) uv_run(&loop, UV_RUN_ONCE);
  uint64_t took = util_mono_ms() - t0;
  assert_int_equal(order[0], 1); /* before the job that holds the worker */
  assert_true(took >= 100 && took < 100 + SWEEP_MAX_MS + 400);
  assert_true(jobs[1].job.dropped && jobs[1].job.timed_out);
  assert_false(jobs[1].job.canceled);
  assert_int_equal(jobs[1].status, -1); /* work never ran */
  assert_true(jobs[1].job.wait_ms >= 100);

  /* already past when the worker takes it (or the sweep finds it) */
  jobs[3].job.deadline_ms = util_mono_ms();
  pool_submit(pool, &jobs[3].job, work_cb, done_cb);
  uv_sem_post(&gate);
  while (ndone < 4) uv_run(&loop, UV_RUN_ONCE);
  for (int i = 0; i < 4; i += 2) {
    assert_int_equal(jobs[i].status, 0);
    assert_false(jobs[i].job.dropped || jobs[i].job.timed_out);
  }
  assert_true(jobs[3].job.dropped && jobs[3].job.timed_out);
  assert_int_equal(jobs[3].status, -1);
  assert_true(metric_value(m, "converger_store_timeouts_total{kind=\"deadline-test\"}") == 2);
  assert_true(metric_value(m, "converger_pool_dropped_total{kind=\"deadline-test\"}") == -1);
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  uv_sem_destroy(&gate);
  metrics_free(m);
}

typedef struct {
  job_t base;
  uint64_t took_ms; /* how long store_revoke took on the worker */
} write_job_t;

static void revoke_work_cb(pool_job_t *job, store_t *db) {
  write_job_t *w = container_of(job, write_job_t, base.job);
  uint64_t t0 = util_mono_ms();
  w->base.status = store_revoke(db, "jti", 1);
  w->took_ms = util_mono_ms() - t0;
}

/* The database is locked by another connection (SQLite's write lock): a
 * job with a 200 ms deadline gets -CV_ETIMEDOUT from its write at about
 * that deadline, not after the 5 s busy timeout, and comes back with
 * timed_out (not dropped: it ran). Once the lock is gone, a job without a
 * deadline on the same worker writes: the deadline ended with its job. */
static void test_store_calls_stop_at_the_job_deadline(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  assert_int_equal(pool_start(&loop, url, NULL, 1, NULL, &pool), 0);
  char path[128];
  snprintf(path, sizeof path, "%s/p.db", dir);
  sqlite3 *raw = NULL;
  assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
  assert_int_equal(sqlite3_exec(raw, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);

  write_job_t w[2];
  memset(w, 0, sizeof w);
  int order[2], ndone = 0;
  for (int i = 0; i < 2; i++) {
    w[i].base.id = i;
    w[i].base.status = -1;
    w[i].base.done_order = order;
    w[i].base.ndone = &ndone;
  }
  w[0].base.job.deadline_ms = util_mono_ms() + 200;
  pool_submit(pool, &w[0].base.job, revoke_work_cb, done_cb);
  while (ndone < 1) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(w[0].base.status, -CV_ETIMEDOUT);
  assert_true(w[0].base.job.timed_out);
  assert_false(w[0].base.job.dropped);
  assert_true(w[0].took_ms >= 150 && w[0].took_ms < 1500);

  assert_int_equal(sqlite3_exec(raw, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(raw);
  pool_submit(pool, &w[1].base.job, revoke_work_cb, done_cb);
  while (ndone < 2) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(w[1].base.status, 0);
  assert_false(w[1].base.job.timed_out);
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- batches (pool_submit_batch) ----------------------------------------- */

/* Jobs 0..n-1 that record their done order in `order`, counted in *ndone. */
static void jobs_init(job_t *jobs, int n, int *order, int *ndone) {
  memset(jobs, 0, (size_t)n * sizeof *jobs);
  for (int i = 0; i < n; i++) {
    jobs[i].id = i;
    jobs[i].status = -1;
    jobs[i].done_order = order;
    jobs[i].ndone = ndone;
  }
}

static int batch_calls, batch_sizes[64], batch_now, batch_most;
static uv_mutex_t batch_mu;

static void batch_cb(pool_job_t **jobs, size_t n, store_t *db) {
  uv_mutex_lock(&batch_mu);
  int running = ++batch_now;
  if (running > batch_most) batch_most = running;
  if (batch_calls < 64) batch_sizes[batch_calls] = (int)n;
  batch_calls++;
  uv_mutex_unlock(&batch_mu);
  for (size_t i = 0; i < n; i++) work_cb(jobs[i], db);
  usleep(20 * 1000); /* a commit */
  uv_mutex_lock(&batch_mu);
  batch_now--;
  uv_mutex_unlock(&batch_mu);
}

static void other_batch_cb(pool_job_t **jobs, size_t n, store_t *db) {
  for (size_t i = 0; i < n; i++) work_cb(jobs[i], db);
}

/* On an inline pool: a batched job takes every queued job of its callback
 * with it (not another callback's, not a plain job), in submission order,
 * at most the batch size; a job past its deadline is not in the batch but
 * comes back dropped. */
static void test_batch_gathers_its_jobs(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  uv_mutex_init(&batch_mu);
  batch_calls = batch_now = batch_most = 0;
  assert_int_equal(pool_start_inline(&loop, url, NULL, NULL, &pool), 0);
  pool_set_batch(pool, 3, 1);
  job_t jobs[8];
  int order[8], ndone = 0;
  jobs_init(jobs, 8, order, &ndone);
  jobs[3].job.deadline_ms = 1; /* long past */
  pool_submit_batch(pool, &jobs[0].job, batch_cb, done_cb);
  pool_submit(pool, &jobs[1].job, work_cb, done_cb);
  pool_submit_batch(pool, &jobs[2].job, other_batch_cb, done_cb);
  for (int i = 3; i < 8; i++) pool_submit_batch(pool, &jobs[i].job, batch_cb, done_cb);
  /* 0, 3 (dropped) and 4: 0 and 4 run together */
  assert_int_equal(pool_step(pool), 1);
  assert_int_equal(batch_calls, 1);
  assert_int_equal(batch_sizes[0], 2);
  assert_int_equal(ndone, 3);
  assert_int_equal(order[0], 0);
  assert_int_equal(order[1], 3);
  assert_int_equal(order[2], 4);
  assert_true(jobs[3].job.dropped && jobs[3].job.timed_out);
  assert_int_equal(jobs[3].status, -1);
  assert_int_equal(jobs[0].status, 0);
  /* then the plain job, the other callback's, and 5, 6, 7 together */
  assert_int_equal(pool_step(pool), 1);
  assert_int_equal(order[3], 1);
  assert_int_equal(pool_step(pool), 1);
  assert_int_equal(order[4], 2);
  assert_int_equal(pool_step(pool), 1);
  assert_int_equal(batch_calls, 2);
  assert_int_equal(batch_sizes[1], 3);
  assert_int_equal(ndone, 8);
  assert_int_equal(pool_step(pool), 0);
  for (int i = 0; i < 8; i++) assert_int_equal(jobs[i].status, i == 3 ? -1 : 0);
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  uv_mutex_destroy(&batch_mu);
}

/* On four workers with one lane: batches never run side by side, the
 * jobs submitted while one runs gather into the next, and the other
 * workers keep running plain jobs meanwhile. */
static void test_batch_lanes_gather_while_busy(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  uv_mutex_init(&batch_mu);
  batch_calls = batch_now = batch_most = 0;
  assert_int_equal(pool_start(&loop, url, NULL, 4, NULL, &pool), 0);
  pool_set_batch(pool, 256, 1);
  enum { N = 60, PLAIN = 20 };
  job_t jobs[N + PLAIN];
  int order[N + PLAIN], ndone = 0;
  jobs_init(jobs, N + PLAIN, order, &ndone);
  /* three waves of 20, each submitted while the batch before runs */
  for (int w = 0; w < 3; w++) {
    for (int i = 0; i < 20; i++) pool_submit_batch(pool, &jobs[w * 20 + i].job, batch_cb, done_cb);
    if (w == 0)
      for (int i = 0; i < PLAIN; i++) pool_submit(pool, &jobs[N + i].job, work_cb, done_cb);
    uv_run(&loop, UV_RUN_NOWAIT); /* the kick: workers wake */
    usleep(5 * 1000);
  }
  while (ndone < N + PLAIN) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(batch_most, 1);
  int total = 0;
  for (int i = 0; i < batch_calls && i < 64; i++) total += batch_sizes[i];
  assert_int_equal(total, N);
  assert_true(batch_calls < N / 2); /* they gathered: far fewer calls than jobs */
  for (int i = 0; i < N + PLAIN; i++) {
    assert_int_equal(jobs[i].status, 0);
    assert_true(jobs[i].ran_on_worker);
  }
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  uv_mutex_destroy(&batch_mu);
}

/* Batches of one (CONVERGER_APPEND_BATCH=1): every job alone, and on
 * every worker at once, as plain jobs run: no lane holds them back. */
static void test_batch_of_one_runs_on_every_worker(void **state) {
  uv_loop_t loop;
  pool_t *pool;
  uv_loop_init(&loop);
  loop_thread = uv_thread_self();
  uv_mutex_init(&batch_mu);
  batch_calls = batch_now = batch_most = 0;
  assert_int_equal(pool_start(&loop, url, NULL, 4, NULL, &pool), 0);
  pool_set_batch(pool, 1, 1);
  enum { N = 12 };
  job_t jobs[N];
  int order[N], ndone = 0;
  jobs_init(jobs, N, order, &ndone);
  for (int i = 0; i < N; i++) pool_submit_batch(pool, &jobs[i].job, batch_cb, done_cb);
  while (ndone < N) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(batch_calls, N);
  for (int i = 0; i < N; i++) assert_int_equal(batch_sizes[i], 1);
  assert_true(batch_most > 1); /* side by side on the workers */
  pool_close(pool);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  uv_mutex_destroy(&batch_mu);
}

static void test_start_failure_leaves_nothing(void **state) {
  uv_loop_t loop;
  pool_t *pool = NULL;
  uv_loop_init(&loop);
  assert_true(pool_start(&loop, "postgres://127.0.0.1:1/nowhere", NULL, 2, NULL, &pool) < 0);
  assert_null(pool);
  assert_true(pool_start(&loop, "sqlite:/nonexistent-dir/x/y.db", NULL, 2, NULL, &pool) < 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_jobs_run_on_workers_and_come_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_close_cancels_queued_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_queue_delay_rule_drops_jobs_of_a_slow_pool, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_deadline_expires_queued_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_store_calls_stop_at_the_job_deadline, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batch_gathers_its_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batch_lanes_gather_while_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batch_of_one_runs_on_every_worker, setup, teardown),
      cmocka_unit_test_setup_teardown(test_start_failure_leaves_nothing, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
