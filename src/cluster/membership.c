/*
 * membership.c: the heartbeat timer and its pool job (membership.h).
 *
 * The job copies nothing from the loop but the counts and the state: the
 * node id and public URL are read from the config, which is immutable and
 * outlives the pool. The timestamp is taken on the worker, when the row is
 * written, so time spent in the pool queue does not age the row.
 */
#include "cluster/membership.h"

#include <stdlib.h>

#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"

typedef struct {
  pool_job_t job;
  membership_t *m;
  const char *id, *public_url, *admin_url, *state; /* cfg strings, a static string */
  int64_t connections, waiters, capacity;
  int64_t presence_max_age_ms; /* > 0: sweep presence rows of nodes gone that long */
  int status;
} beat_job_t;

static void beat_work(pool_job_t *job, store_t *db) {
  beat_job_t *b = container_of(job, beat_job_t, job);
  b->status = store_node_beat(db, b->id, b->public_url, b->admin_url, b->state, b->connections,
                              b->waiters, b->capacity, util_now_ms());
  if (b->status == 0 && b->presence_max_age_ms > 0) {
    int64_t removed = 0;
    int r = store_presence_sweep(db, util_now_ms(), b->presence_max_age_ms, &removed);
    if (r != 0)
      log_warn("membership: presence sweep failed: %s", cv_strerror(r));
    else if (removed > 0)
      log_info("membership: %lld presence row(s) of nodes gone for %lld ms removed (their "
               "clients left)",
               (long long)removed, (long long)b->presence_max_age_ms);
  }
}

static void beat(membership_t *m);

static void beat_done(pool_job_t *job) {
  beat_job_t *b = container_of(job, beat_job_t, job);
  membership_t *m = b->m;
  int status = job->canceled ? -CV_ECANCELED : b->status;
  free(b);
  m->in_flight = 0;
  if (m->again && status != -CV_ECANCELED && !uv_is_closing((uv_handle_t *)&m->timer)) {
    m->again = 0; /* the state changed while this beat was written */
    beat(m);
  }
  if (status != 0 && status != -CV_ECANCELED && !m->failing) {
    log_warn("membership: cannot write this node's heartbeat: %s (retrying every %d ms)",
             cv_strerror(status), MEMBERSHIP_BEAT_MS);
    m->failing = 1;
  } else if (status == 0 && m->failing) {
    log_info("membership: heartbeat written again");
    m->failing = 0;
    m->ok_since = util_mono_ms();
    if (m->recovered) m->recovered(m->ud); /* others may have taken this node for gone */
  }
}

static void beat(membership_t *m) {
  beat_job_t *b = calloc(1, sizeof *b);
  if (!b) return; /* the next tick tries again */
  membership_row_t row;
  m->row(m->ud, &row);
  m->in_flight = 1;
  b->m = m;
  b->id = m->cfg->node_id;
  b->public_url = m->cfg->public_url;
  b->admin_url = m->cfg->admin_url ? m->cfg->admin_url : "";
  b->state = row.draining ? "draining" : "ready";
  b->connections = row.connections;
  b->waiters = row.waiters;
  b->capacity = row.capacity;
  /* The sweep only once this node has beaten without a break for the
   * membership timeout: after an outage of the store, every other node had
   * the time to write its beat again before any of its rows is taken for a
   * gone node's. */
  uint64_t now = util_mono_ms();
  if (!m->ok_since) m->ok_since = now;
  if (!m->failing && now - m->ok_since >= (uint64_t)MEMBERSHIP_MAX_AGE_MS)
    b->presence_max_age_ms = row.presence_max_age_ms;
  b->job.kind = "membership";
  b->job.no_drop = 1; /* an overloaded node is still a member */
  pool_submit(*m->pool, &b->job, beat_work, beat_done);
}

static void timer_cb(uv_timer_t *t) {
  membership_t *m = t->data;
  if (m->in_flight) return; /* a slow store: skip, never queue beats */
  beat(m);
}

void membership_beat_now(membership_t *m) {
  if (uv_is_closing((uv_handle_t *)&m->timer)) return;
  if (m->in_flight) { /* it may carry the old state: beat again when it is done */
    m->again = 1;
    return;
  }
  beat(m);
  uv_timer_again(&m->timer); /* the next one a full period later */
}

void membership_start(membership_t *m, uv_loop_t *loop, pool_t *const *pool, const config_t *cfg,
                      membership_row_cb row, void *ud) {
  m->pool = pool;
  m->cfg = cfg;
  m->row = row;
  m->ud = ud;
  uv_timer_init(loop, &m->timer);
  m->timer.data = m;
  uv_timer_start(&m->timer, timer_cb, 0, MEMBERSHIP_BEAT_MS);
}

void membership_stop(membership_t *m) {
  uv_timer_t *t = &m->timer;
  if (uv_is_closing((uv_handle_t *)t)) return;
  uv_timer_stop(t);
  uv_close((uv_handle_t *)t, NULL);
  if (pool_in_flight(*m->pool) == 0) beat(m); /* stopping: "draining" */
}
