/*
 * pool: the worker threads that run every blocking store call.
 *
 * N threads, each owning one store_t (one database connection) for its
 * whole life. The loop thread submits jobs; a worker runs job->work with its
 * store, then the job is handed back to the loop (uv_async) where job->done
 * runs. A job holds one connection for its whole life: a handshake that
 * reads the channel, the conversation, the head and the replay is one job,
 * one checkout (the admission-queue decision record).
 *
 * Jobs are embedded in the caller's struct (container_of); the pool never
 * allocates or frees them. Jobs start in submission order.
 *
 * Overload: the queue-delay rule of DBConnection (queue_target and
 * queue_interval), which the admission-queue decision record's pool used.
 * When no job taken during the last interval waited less than the target,
 * the pool is slow, and while it is slow a job that waited more than twice
 * the target is dropped: `work` never runs and `done` sees job->dropped.
 * Jobs are checked when a worker takes them and, every `target` ms (at
 * most SWEEP_MAX_MS), at the head of the queue, so refusals come fast even
 * when every worker is stuck.
 * A queue that drains is no longer slow.
 * Callers answer with a retryable refusal (503, unavailable,
 * replay_unavailable). A pool that keeps up never drops anything.
 *
 * Deadlines: a job may carry one (deadline_ms, set by the submitter;
 * interactive work gets CONVERGER_STORE_TIMEOUT_MS from submission, the
 * background jobs none). A job whose deadline passes before a worker takes
 * it is not run: `done` sees job->dropped and job->timed_out. The queue is
 * swept for those every `target` ms, at most SWEEP_MAX_MS, so they are
 * answered at their deadline even when every worker is stuck. While `work`
 * runs, the worker's store has the job's deadline (store_set_deadline):
 * its calls stop there with -CV_ETIMEDOUT, and job->timed_out says so.
 * converger_store_timeouts_total{kind} counts both.
 */
#ifndef CONVERGER_STORE_POOL_H
#define CONVERGER_STORE_POOL_H

#include <stdint.h>
#include <uv.h>

#define SWEEP_MAX_MS 50 /* longest period of the queue sweep (deadlines, drops) */

#include "core/errors.h"
#include "core/metrics.h"
#include "store/store.h"

typedef struct pool_s pool_t;
typedef struct pool_job_s pool_job_t;

/* Runs on a worker thread with that worker's store. Must not touch loop
 * state. */
typedef void (*pool_work_cb)(pool_job_t *job, store_t *db);
/* Runs on the loop thread after work returned. */
typedef void (*pool_done_cb)(pool_job_t *job);
/* Runs on a worker thread with that worker's store, for `n` jobs (1 or
 * more, in submission order) submitted with this callback: a group commit
 * (pool_submit_batch). Must not touch loop state. */
typedef void (*pool_batch_cb)(pool_job_t **jobs, size_t n, store_t *db);

struct pool_job_s {
  pool_work_cb work;   /* NULL for a batched job */
  pool_batch_cb batch; /* NULL for a job of its own */
  pool_done_cb done;
  const char *kind;   /* label of converger_pool_dropped_total (static string); NULL: "other" */
  uint64_t submit_ms; /* monotonic ms, set by pool_submit */
  uint64_t wait_ms;   /* time spent queued before a worker took it */
  int canceled;       /* set when pool_close dropped it before `work` ran */
  int dropped;        /* set when the queue-delay rule dropped it before `work` ran */
  int no_drop;        /* set by the caller: never dropped (e.g. the revocation refresh) */
  /* Set by the caller: monotonic ms (util_mono_ms) past which the job is
   * not started and its store calls stop (store_set_deadline); 0: none. */
  uint64_t deadline_ms;
  int timed_out; /* the deadline passed: before `work` (dropped is set too) or during it */
  int laned;     /* pool.c: a batch that holds a batch lane */
  /* Set by the caller of pool_submit_batch: jobs are batched only with
   * jobs of the same key, and each key has lanes of its own
   * (0..POOL_BATCH_KEYS-1; a sharded cluster's appends: their instance, so
   * that one instance that hangs holds only its own lane). */
  int batch_key;
  pool_job_t *next;
};

/* Why a job's `work` did not run, in its done callback: -CV_ETIMEDOUT
 * (dropped past its deadline), -CV_EBUSY (dropped by the queue-delay
 * rule), -CV_ECANCELED (pool_close took it back), or 0 (it ran). */
static inline int pool_job_unrun(const pool_job_t *job) {
  if (job->dropped) return job->timed_out ? -CV_ETIMEDOUT : -CV_EBUSY;
  return job->canceled ? -CV_ECANCELED : 0;
}

/* Open `size` store connections with `url`/`opt`, migrate the schema on the
 * first one, and start one worker per connection. The connections share
 * the pool's store_shared_t (store.h; opt->shared is ignored). On success
 * *out is a pool bound to `loop` (whose uv_async handle keeps the loop
 * alive until pool_close), recording in `metrics` (borrowed, may be NULL;
 * workers observe converger_pool_wait_ms into it, so it must outlive the
 * pool). Returns 0, or the store's error after logging it (nothing is left
 * running). Loop thread. */
int pool_start(uv_loop_t *loop, const char *url, const store_options_t *opt, int size,
               metrics_t *metrics, pool_t **out);

/* pool_start in two halves, for a caller that opens the store off the
 * loop (serve.c: a node whose database is down at start retries on
 * libuv's thread pool while it answers /livez).
 * pool_prepare: open the `size` connections and migrate the schema, as
 * pool_start does, but start no thread and no handle. opt->shared (may be
 * NULL) carries the store's outage state (store.h, connect_failing) from
 * one call to the next, so an outage met by every attempt is logged once;
 * the pool's connections still share the pool's own. Blocking; any one
 * thread. Returns 0 with *out a pool for pool_launch or pool_discard, or
 * the store's error (*out NULL, nothing left open), which the caller logs
 * (a migration's failure is logged here). */
int pool_prepare(const char *url, const store_options_t *opt, int size, metrics_t *metrics,
                 pool_t **out);

/* pool_launch: start the workers and the handles of a prepared pool on
 * `loop`; from then on it is a pool as pool_start's. Returns 0, or an
 * error with the pool freed. Loop thread. */
int pool_launch(pool_t *pool, uv_loop_t *loop);

/* pool_discard: close the connections of a prepared pool that was never
 * launched and free it (NULL: nothing). Any one thread. */
void pool_discard(pool_t *pool);

/* Tests only: a pool of one store connection and no worker thread. Jobs
 * wait in the queue (pool_cancel, deadlines and the queue-delay rule apply
 * as usual) until pool_step runs them on the caller's thread, so a test
 * decides exactly when each store job runs and returns. Returns as
 * pool_start. Loop thread. */
int pool_start_inline(uv_loop_t *loop, const char *url, const store_options_t *opt,
                      metrics_t *metrics, pool_t **out);

/* Tests only (a pool of pool_start_inline): run the oldest queued job's
 * `work` now on the calling (loop) thread, then the `done` of every
 * finished job, this one's included (a canceled or dropped job's too).
 * Returns 1 when a job was taken from the queue, 0 when it was empty (the
 * waiting `done`s still ran). */
int pool_step(pool_t *pool);

/* The queue-delay rule: target and interval in ms (defaults 50 and 1000).
 * Loop thread, before jobs are submitted. */
void pool_set_queue_rule(pool_t *pool, int target_ms, int interval_ms);

/* Tests only: every job sleeps `ms` on its worker before `work` (a slow
 * store). Loop thread, before jobs are submitted. */
void pool_set_test_delay(pool_t *pool, int ms);

/* Queue `job`: `work` runs on a worker, then `done` on the loop. Never fails
 * and never calls `done` synchronously; after pool_close has begun, the job
 * still runs (shutdown finishes in-flight work). job->kind, no_drop and
 * deadline_ms are the caller's, set before; the other fields are reset
 * here. Loop thread. */
void pool_submit(pool_t *pool, pool_job_t *job, pool_work_cb work, pool_done_cb done);

/* Take `job` back if no worker has started it: its `done` then runs later
 * (never synchronously) with job->canceled set and `work` never runs.
 * Returns 1 when it was taken back, 0 when it runs or ran. Loop thread. */
int pool_cancel(pool_t *pool, pool_job_t *job);

/* As pool_submit, for work that is cheaper done together: when a worker
 * takes `job`, it also takes every job queued behind it with the same
 * `batch` callback and job->batch_key (at most the pool's batch size), and
 * runs them in one call, `batch`, with the earliest deadline among them;
 * each still gets its own `done`. At most `lanes` workers (pool_set_batch)
 * run batches of one key at once, so while they run, the next jobs gather into the next batch
 * instead of spreading over the workers one each: a group commit, like
 * PostgreSQL's own commit_delay without the delay. A lone job runs at
 * once. Each job of a batch is checked against its own deadline and the
 * queue-delay rule when it is taken. Loop thread. */
void pool_submit_batch(pool_t *pool, pool_job_t *job, pool_batch_cb batch, pool_done_cb done);

/* The batches of pool_submit_batch: at most `max_jobs` jobs each
 * (1..POOL_BATCH_MAX), run by at most `lanes` workers at once per batch
 * key (1..the pool's size). `max_jobs` 1: every job alone and on any worker, as
 * pool_submit's (no lane). Defaults 256 and 1. Loop thread, before jobs
 * are submitted. */
#define POOL_BATCH_MAX  STORE_BATCH_MAX
#define POOL_BATCH_KEYS (STORE_INSTANCES_MAX + 1)
void pool_set_batch(pool_t *pool, int max_jobs, int lanes);

/* Jobs submitted whose `done` has not run yet; 0 for NULL (a node whose
 * store is not open yet). Loop thread. */
int pool_in_flight(const pool_t *pool);

/* Stop: jobs not started yet are canceled (their `done` runs with
 * job->canceled set and `work` never runs), running jobs finish, the
 * workers are joined, their stores closed, and the pool is freed from the
 * async handle's close callback. Call once, after the last pool_submit.
 * Loop thread (it waits for the running jobs). */
void pool_close(pool_t *pool);

#endif
