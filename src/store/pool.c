/*
 * pool.c: worker threads, a FIFO of submitted jobs and a FIFO of finished
 * ones.
 *
 * Threads: submit/close/in_flight and every `done` run on the loop thread;
 * `work` runs on workers. `mu` guards both queues, the idle count and the
 * stop flag. A worker records how long each job waited (the pool checkout
 * wait) in the converger_pool_wait_ms histogram, and gives each job's
 * deadline to its store around `work`.
 *
 * Wake-ups are batched: pool_submit only queues, and a uv_prepare hook wakes
 * as many idle workers as there are new jobs once per loop turn, right
 * before the loop blocks. A burst of handshakes read in one turn then costs
 * a few wake-ups instead of one thread switch per job.
 */
#include "store/pool.h"

#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/dburl.h"
#include "core/metrics.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"

struct pool_s {
  uv_loop_t *loop;
  metrics_t *metrics;    /* borrowed; workers observe the wait histogram (its own lock) */
  store_shared_t shared; /* what the stores below share (store.h) */
  uv_async_t async;
  uv_prepare_t kick; /* wakes workers for the jobs submitted this turn */
  int unsignaled;    /* jobs queued since the last kick (loop thread) */
  int idle;          /* workers waiting on `cond` (under mu) */
  int handles_open;  /* async, kick and sweep, until their close callbacks ran */
  uv_timer_t sweep;  /* expires jobs past their deadline, drops stale ones of a slow pool */
  uv_mutex_t mu;
  uv_cond_t cond;
  pool_job_t *todo_head, *todo_tail;
  pool_job_t *done_head, *done_tail;
  int stopping;
  int in_flight;
  int size;
  int closing;
  uv_thread_t *threads;
  store_t **stores;
  int started;
  /* the queue-delay rule (under mu) */
  uint64_t target_ms, interval_ms;
  uint64_t interval_end;  /* monotonic ms: the current interval ends */
  uint64_t interval_min;  /* least wait of the jobs run in it */
  uint64_t interval_jobs; /* jobs taken in it, run or dropped */
  int slow;               /* the last interval had no wait under the target */
  int test_delay_ms;
  /* pool_submit_batch (under mu) */
  int batch_max;                      /* jobs per batch */
  int batch_lanes;                    /* workers that may run batches of one key at once */
  int batch_running[POOL_BATCH_KEYS]; /* workers running one now, per batch_key */
};

typedef struct {
  pool_t *pool;
  int index;
} worker_arg_t;

static void push(pool_job_t **head, pool_job_t **tail, pool_job_t *job) {
  job->next = NULL;
  if (*tail)
    (*tail)->next = job;
  else
    *head = job;
  *tail = job;
}

/* A new interval of the queue-delay rule starts at `now`. Under mu. */
static void reset_interval(pool_t *pool, uint64_t now) {
  pool->interval_end = now + pool->interval_ms;
  pool->interval_min = UINT64_MAX;
  pool->interval_jobs = 0;
}

/* Start a new interval of the queue-delay rule when the current one is
 * over. The next one is slow when, in the last one, jobs were taken and
 * none had waited less than the target, or none was taken at all while the
 * oldest waiting job has waited longer than the target (every worker
 * stuck). Under mu. */
static void roll_interval(pool_t *pool, uint64_t now) {
  if (now < pool->interval_end) return;
  if (pool->interval_jobs > 0)
    pool->slow = pool->interval_min > pool->target_ms;
  else
    pool->slow = pool->todo_head && now - pool->todo_head->submit_ms > pool->target_ms;
  reset_interval(pool, now);
}

/* The queue is empty: the pool kept up, and the next burst starts afresh
 * (DBConnection resets its state when its queue empties). Under mu. */
static void drained(pool_t *pool, uint64_t now) {
  pool->slow = 0;
  reset_interval(pool, now);
}

/* The queue-delay rule for a job taken at `now` after waiting `wait` ms:
 * 1 to drop it. A queue that has drained is not slow any more (the next
 * burst starts afresh, as in DBConnection). Under mu. */
static int should_drop(pool_t *pool, pool_job_t *job, uint64_t now, uint64_t wait) {
  roll_interval(pool, now);
  pool->interval_jobs++;
  int drop = pool->slow && !job->no_drop && wait > 2 * pool->target_ms;
  if (!drop && wait < pool->interval_min) pool->interval_min = wait;
  if (!pool->todo_head) drained(pool, now);
  return drop;
}

/* The period of sweep_cb: the target, but at least every SWEEP_MAX_MS so
 * that a deadline is kept whatever the target. */
static uint64_t sweep_period(const pool_t *pool) {
  return pool->target_ms < SWEEP_MAX_MS ? pool->target_ms : SWEEP_MAX_MS;
}

/* Move every queued job whose deadline has passed to the done queue, not
 * run (dropped and timed_out). Under mu. Returns how many. */
static int expire(pool_t *pool, uint64_t now) {
  int n = 0;
  pool_job_t *prev = NULL;
  for (pool_job_t *job = pool->todo_head; job;) {
    pool_job_t *next = job->next;
    if (job->deadline_ms != 0 && now >= job->deadline_ms) {
      if (prev)
        prev->next = next;
      else
        pool->todo_head = next;
      if (pool->todo_tail == job) pool->todo_tail = prev;
      job->wait_ms = now - job->submit_ms;
      job->dropped = job->timed_out = 1;
      push(&pool->done_head, &pool->done_tail, job);
      n++;
    } else {
      prev = job;
    }
    job = next;
  }
  return n;
}

/* Every sweep_period on the loop: jobs past their deadline leave the queue,
 * and while the pool is slow, the jobs at the head of the queue that waited
 * more than twice the target are dropped now, not when a worker frees up (a
 * store stuck in a busy wait would otherwise delay every refusal by that
 * wait). */
static void sweep_cb(uv_timer_t *t) {
  pool_t *pool = t->data;
  uint64_t now = util_mono_ms();
  uv_mutex_lock(&pool->mu);
  int dropped = expire(pool, now);
  roll_interval(pool, now);
  while (pool->slow && pool->todo_head && !pool->todo_head->no_drop &&
         now - pool->todo_head->submit_ms > 2 * pool->target_ms) {
    pool_job_t *job = pool->todo_head;
    pool->todo_head = job->next;
    if (!pool->todo_head) pool->todo_tail = NULL;
    job->wait_ms = now - job->submit_ms;
    job->dropped = 1;
    pool->interval_jobs++;
    push(&pool->done_head, &pool->done_tail, job);
    dropped++;
  }
  if (dropped && !pool->todo_head) drained(pool, now);
  uv_mutex_unlock(&pool->mu);
  if (dropped) uv_async_send(&pool->async);
}

/* The oldest queued job a worker may take now: any job, except a batched
 * one while every batch lane is busy. Its predecessor into *prev (NULL at
 * the head). NULL when there is none. Under mu. */
static pool_job_t *eligible(pool_t *pool, pool_job_t **prev) {
  *prev = NULL;
  for (pool_job_t *j = pool->todo_head; j; *prev = j, j = j->next)
    if (!j->batch || pool->batch_max == 1 || pool->batch_running[j->batch_key] < pool->batch_lanes)
      return j;
  return NULL;
}

/* Take `job` (after `prev`) out of the queue for running now, with the
 * queue-delay rule and its deadline applied (job->dropped,
 * job->timed_out). Under mu. */
static void take_one(pool_t *pool, pool_job_t *prev, pool_job_t *job, uint64_t now) {
  if (prev)
    prev->next = job->next;
  else
    pool->todo_head = job->next;
  if (pool->todo_tail == job) pool->todo_tail = prev;
  job->next = NULL;
  job->wait_ms = now - job->submit_ms;
  job->timed_out = job->deadline_ms != 0 && now >= job->deadline_ms;
  job->dropped = should_drop(pool, job, now, job->wait_ms) || job->timed_out;
}

/* Take the oldest job a worker may run (eligible), and for a batched one
 * the jobs queued behind it with the same callback, chained through
 * `next`, and take a batch lane. NULL when none may run now. Under mu. */
static pool_job_t *take(pool_t *pool) {
  pool_job_t *prev;
  pool_job_t *job = eligible(pool, &prev);
  if (!job) return NULL;
  uint64_t now = util_mono_ms();
  take_one(pool, prev, job, now);
  /* batches of one (CONVERGER_APPEND_BATCH=1): alone, on any worker */
  job->laned = job->batch && pool->batch_max > 1;
  if (!job->laned) return job;
  pool->batch_running[job->batch_key]++;
  pool_job_t *last = job;
  int n = 1;
  for (pool_job_t *p = NULL, *j = pool->todo_head; j && n < pool->batch_max;) {
    pool_job_t *next = j->next;
    if (j->batch == job->batch && j->batch_key == job->batch_key) {
      take_one(pool, p, j, now);
      last->next = j;
      last = j;
      n++;
    } else {
      p = j;
    }
    j = next;
  }
  return job;
}

/* Run what `take` took with `db` (not under mu), then queue it for `done`
 * on the loop: one job's `work`, or a batch's one `batch` call for the
 * jobs of the chain that were not dropped. */
static void run(pool_t *pool, pool_job_t *job, store_t *db) {
  pool_job_t *v[POOL_BATCH_MAX];
  size_t n = 0;
  uint64_t deadline = 0;
  for (pool_job_t *j = job; j; j = j->next) {
    metrics_observe(pool->metrics, "converger_pool_wait_ms", (double)j->wait_ms);
    if (j->dropped) continue;
    v[n++] = j;
    if (j->deadline_ms != 0 && (deadline == 0 || j->deadline_ms < deadline))
      deadline = j->deadline_ms;
  }
  if (n > 0) {
    if (pool->test_delay_ms > 0) uv_sleep((unsigned)pool->test_delay_ms);
    store_set_deadline(db, deadline);
    if (job->batch)
      job->batch(v, n, db);
    else
      job->work(job, db);
    int hit = store_deadline_hit(db);
    for (size_t i = 0; i < n; i++) v[i]->timed_out = hit;
    store_set_deadline(db, 0);
  }
  if (job->batch) metrics_observe(pool->metrics, "converger_store_batch_jobs", (double)n);
  uv_mutex_lock(&pool->mu);
  if (job->laned) {
    pool->batch_running[job->batch_key]--;
    /* A batch of another key may have waited for this lane while this
     * worker goes on to take the oldest job, which may be of a key whose
     * store hangs: wake an idle one for the rest (a sharded cluster's
     * instance lanes; with one key, this worker takes the next batch). */
    if (pool->todo_head && pool->idle > 0) uv_cond_signal(&pool->cond);
  }
  for (pool_job_t *j = job; j;) {
    pool_job_t *next = j->next;
    push(&pool->done_head, &pool->done_tail, j);
    j = next;
  }
  uv_mutex_unlock(&pool->mu);
  uv_async_send(&pool->async);
}

static void worker_main(void *arg) {
  worker_arg_t *wa = arg;
  pool_t *pool = wa->pool;
  store_t *db = pool->stores[wa->index];
  free(wa);
  for (;;) {
    uv_mutex_lock(&pool->mu);
    pool_job_t *job;
    /* batched jobs that wait for a lane are taken by the worker that
     * frees it, as its next batch */
    while (!(job = take(pool)) && !pool->stopping) {
      pool->idle++;
      uv_cond_wait(&pool->cond, &pool->mu);
      pool->idle--;
    }
    uv_mutex_unlock(&pool->mu);
    if (!job) return; /* stopping and nothing left */
    run(pool, job, db);
  }
}

static void async_cb(uv_async_t *handle) {
  pool_t *pool = container_of(handle, pool_t, async);
  uv_mutex_lock(&pool->mu);
  pool_job_t *job = pool->done_head;
  pool->done_head = pool->done_tail = NULL;
  uv_mutex_unlock(&pool->mu);
  while (job) {
    pool_job_t *next = job->next;
    pool->in_flight--;
    if (job->dropped || job->timed_out) {
      char labels[64];
      snprintf(labels, sizeof labels, "kind=\"%s\"", job->kind ? job->kind : "other");
      metrics_add(pool->metrics,
                  job->timed_out ? "converger_store_timeouts_total"
                                 : "converger_pool_dropped_total",
                  labels, 1);
    }
    job->done(job);
    job = next;
  }
  metrics_set(pool->metrics, "converger_pool_jobs_in_flight", NULL, pool->in_flight);
}

static void stop_workers(pool_t *pool) {
  uv_mutex_lock(&pool->mu);
  /* Jobs not started are canceled: their done callbacks run with the flag. */
  for (pool_job_t *j = pool->todo_head; j;) {
    pool_job_t *next = j->next;
    j->canceled = 1;
    push(&pool->done_head, &pool->done_tail, j);
    j = next;
  }
  pool->todo_head = pool->todo_tail = NULL;
  pool->stopping = 1;
  uv_cond_broadcast(&pool->cond);
  uv_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->started; i++) uv_thread_join(&pool->threads[i]);
  for (int i = 0; i < pool->size; i++) store_close(pool->stores[i]);
}

static void kick_cb(uv_prepare_t *h) {
  pool_t *pool = container_of(h, pool_t, kick);
  if (pool->unsignaled == 0) return;
  uv_mutex_lock(&pool->mu);
  if (pool->unsignaled >= pool->idle)
    uv_cond_broadcast(&pool->cond);
  else
    for (int i = 0; i < pool->unsignaled; i++) uv_cond_signal(&pool->cond);
  uv_mutex_unlock(&pool->mu);
  pool->unsignaled = 0;
}

static void free_pool(pool_t *pool) {
  uv_mutex_destroy(&pool->mu);
  uv_cond_destroy(&pool->cond);
  free(pool->threads);
  free(pool->stores);
  free(pool);
}

/* Both handles live in the pool: free it when the second one has closed. */
static void closed_cb(uv_handle_t *handle) {
  pool_t *pool = handle->data;
  if (--pool->handles_open == 0) free_pool(pool);
}

/* The blocking half of pool_start: the pool, its `size` store connections
 * and the schema migration; no thread, no handle yet. quiet: the caller
 * logs a failure (pool_prepare's), and opt->shared carries the outage's
 * log state from one attempt to the next. */
static int prepare(const char *url, const store_options_t *opt, int size, metrics_t *metrics,
                   int quiet, pool_t **out) {
  *out = NULL;
  pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return -CV_ENOMEM;
  pool->metrics = metrics;
  /* NULL: store_open's defaults (FULL, 0 = its default busy timeout) */
  store_options_t o = opt ? *opt : (store_options_t){.sync = STORE_SYNC_FULL};
  o.shared = &pool->shared;
  pool->size = size;
  pool->target_ms = 50;
  pool->interval_ms = 1000;
  pool->batch_max = 256;
  pool->batch_lanes = 1;
  pool->interval_min = UINT64_MAX;
  pool->threads = calloc((size_t)size, sizeof *pool->threads);
  pool->stores = calloc((size_t)size, sizeof *pool->stores);
  uv_mutex_init(&pool->mu);
  uv_cond_init(&pool->cond);
  store_shared_t *carry = quiet && opt ? opt->shared : NULL;
  if (carry) atomic_store(&pool->shared.connect_failing, atomic_load(&carry->connect_failing));
  int r = 0;
  if (!pool->threads || !pool->stores) r = -CV_ENOMEM;
  for (int i = 0; r == 0 && i < size; i++) {
    if ((r = store_open(url, &o, &pool->stores[i])) != 0) {
      char shown[512]; /* without a password */
      dburl_redact(url, shown, sizeof shown);
      if (!quiet) log_error("store: cannot open %s: %s", shown, cv_strerror(r));
    } else if (i == 0 && (r = store_migrate(pool->stores[0])) != 0)
      log_error("store: migration failed: %s", cv_strerror(r));
  }
  if (carry) atomic_store(&carry->connect_failing, atomic_load(&pool->shared.connect_failing));
  if (r != 0) {
    pool_discard(pool);
    return r;
  }
  *out = pool;
  return 0;
}

/* The loop half: `threads` workers (0: inline, pool_step runs the jobs)
 * and the handles. On failure the pool is gone. */
static int launch(pool_t *pool, uv_loop_t *loop, int threads) {
  pool->loop = loop;
  int r = 0;
  for (int i = 0; r == 0 && i < threads; i++) {
    worker_arg_t *wa = malloc(sizeof *wa);
    if (!wa) {
      r = -CV_ENOMEM;
      break;
    }
    wa->pool = pool;
    wa->index = i;
    if (uv_thread_create(&pool->threads[i], worker_main, wa) != 0) {
      free(wa);
      r = -CV_ENOMEM;
      break;
    }
    pool->started++;
  }
  if (r == 0) r = uv_async_init(loop, &pool->async, async_cb);
  if (r != 0) {
    stop_workers(pool);
    free_pool(pool);
    return r;
  }
  uv_prepare_init(loop, &pool->kick);
  uv_prepare_start(&pool->kick, kick_cb);
  uv_unref((uv_handle_t *)&pool->kick); /* the async handle keeps the loop alive */
  uv_timer_init(loop, &pool->sweep);
  uv_unref((uv_handle_t *)&pool->sweep);
  pool->async.data = pool->kick.data = pool->sweep.data = pool;
  uv_timer_start(&pool->sweep, sweep_cb, sweep_period(pool), sweep_period(pool));
  pool->handles_open = 3;
  return 0;
}

int pool_prepare(const char *url, const store_options_t *opt, int size, metrics_t *metrics,
                 pool_t **out) {
  return prepare(url, opt, size, metrics, 1, out);
}

int pool_launch(pool_t *pool, uv_loop_t *loop) { return launch(pool, loop, pool->size); }

void pool_discard(pool_t *pool) {
  if (!pool) return;
  for (int i = 0; pool->stores && i < pool->size; i++)
    if (pool->stores[i]) store_close(pool->stores[i]);
  free_pool(pool);
}

static int start(uv_loop_t *loop, const char *url, const store_options_t *opt, int size,
                 int threads, metrics_t *metrics, pool_t **out) {
  pool_t *pool;
  int r = prepare(url, opt, size, metrics, 0, &pool);
  if (r == 0 && (r = launch(pool, loop, threads)) == 0) *out = pool;
  return r;
}

int pool_start(uv_loop_t *loop, const char *url, const store_options_t *opt, int size,
               metrics_t *metrics, pool_t **out) {
  return start(loop, url, opt, size, size, metrics, out);
}

int pool_start_inline(uv_loop_t *loop, const char *url, const store_options_t *opt,
                      metrics_t *metrics, pool_t **out) {
  return start(loop, url, opt, 1, 0, metrics, out);
}

int pool_step(pool_t *pool) {
  uv_mutex_lock(&pool->mu);
  pool_job_t *job = take(pool);
  uv_mutex_unlock(&pool->mu);
  if (job) run(pool, job, pool->stores[0]);
  async_cb(&pool->async); /* every done waiting, this one's included */
  return job != NULL;
}

static void submit(pool_t *pool, pool_job_t *job, pool_work_cb work, pool_batch_cb batch,
                   pool_done_cb done) {
  job->work = work;
  job->batch = batch;
  job->done = done;
  job->canceled = 0;
  job->dropped = 0; /* (no_drop, kind and deadline_ms are the caller's, set before) */
  job->timed_out = 0;
  if (job->batch_key < 0 || job->batch_key >= POOL_BATCH_KEYS) job->batch_key = 0;
  job->submit_ms = util_mono_ms();
  pool->in_flight++;
  uv_mutex_lock(&pool->mu);
  if (pool->stopping) { /* submitted by a done callback during pool_close */
    job->canceled = 1;
    push(&pool->done_head, &pool->done_tail, job);
  } else {
    push(&pool->todo_head, &pool->todo_tail, job);
    pool->unsignaled++; /* kick_cb wakes a worker before the loop blocks */
  }
  uv_mutex_unlock(&pool->mu);
}

void pool_submit(pool_t *pool, pool_job_t *job, pool_work_cb work, pool_done_cb done) {
  submit(pool, job, work, NULL, done);
}

void pool_submit_batch(pool_t *pool, pool_job_t *job, pool_batch_cb batch, pool_done_cb done) {
  submit(pool, job, NULL, batch, done);
}

void pool_set_batch(pool_t *pool, int max_jobs, int lanes) {
  uv_mutex_lock(&pool->mu);
  pool->batch_max = max_jobs < 1 ? 1 : max_jobs > POOL_BATCH_MAX ? POOL_BATCH_MAX : max_jobs;
  pool->batch_lanes = lanes < 1 ? 1 : lanes > pool->size ? pool->size : lanes;
  uv_mutex_unlock(&pool->mu);
}

int pool_in_flight(const pool_t *pool) { return pool ? pool->in_flight : 0; }

void pool_set_queue_rule(pool_t *pool, int target_ms, int interval_ms) {
  uv_mutex_lock(&pool->mu);
  pool->target_ms = target_ms > 0 ? (uint64_t)target_ms : 50;
  pool->interval_ms = interval_ms > 0 ? (uint64_t)interval_ms : 1000;
  uv_mutex_unlock(&pool->mu);
  uv_timer_start(&pool->sweep, sweep_cb, sweep_period(pool), sweep_period(pool));
}

int pool_cancel(pool_t *pool, pool_job_t *job) {
  int found = 0;
  uv_mutex_lock(&pool->mu);
  for (pool_job_t **l = &pool->todo_head, *prev = NULL; *l; prev = *l, l = &(*l)->next)
    if (*l == job) {
      *l = job->next;
      if (pool->todo_tail == job) pool->todo_tail = prev;
      job->canceled = 1;
      push(&pool->done_head, &pool->done_tail, job);
      found = 1;
      break;
    }
  uv_mutex_unlock(&pool->mu);
  if (found) uv_async_send(&pool->async);
  return found;
}

void pool_set_test_delay(pool_t *pool, int ms) { pool->test_delay_ms = ms; }

void pool_close(pool_t *pool) {
  if (pool->closing) return;
  pool->closing = 1;
  stop_workers(pool); /* queued jobs are canceled, running ones finish */
  while (pool->done_head)
    async_cb(&pool->async); /* their done callbacks, and any
                                job those submit (canceled) */
  uv_close((uv_handle_t *)&pool->kick, closed_cb);
  uv_close((uv_handle_t *)&pool->sweep, closed_cb);
  uv_close((uv_handle_t *)&pool->async, closed_cb);
}
