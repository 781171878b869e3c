/*
 * heads.c: one pool job that reads heads and publishes head hints (see
 * heads.h).
 */
#include "bus/heads.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/errors.h"
#include "store/store.h"

typedef struct {
  pool_job_t job;
  bus_t *bus;
  uint64_t chan_gen; /* bus_channel_gen() when submitted */
  char **convs;
  size_t n;
  store_conv_t *info;
  int *status;
  heads_done_cb done;
  void *ud;
} heads_job_t;

static void heads_work(pool_job_t *job, store_t *db) {
  heads_job_t *j = container_of(job, heads_job_t, job);
  /* One snapshot per database. A failure of the store as a whole (one
   * database) leaves the rest unread; a sharded store's instance that
   * fails fails only its own conversations (-CV_ESHARD). */
  int r = store_read_begin(db);
  for (size_t i = 0; i < j->n; i++) {
    if (r != 0) {
      j->status[i] = r;
      continue;
    }
    j->status[i] = store_conv_get(db, j->convs[i], &j->info[i]);
    if (j->status[i] != 0 && j->status[i] != -CV_ENOTFOUND && j->status[i] != -CV_ESHARD)
      r = j->status[i];
  }
  store_read_end(db);
}

static void heads_free(heads_job_t *j) {
  store_strings_free(j->convs, j->n);
  free(j->info);
  free(j->status);
  free(j);
}

static void heads_done(pool_job_t *job) {
  heads_job_t *j = container_of(job, heads_job_t, job);
  if (job->canceled) {
    j->done(j->ud, 1, NULL, 0, j->n, 0);
    return heads_free(j);
  }
  char **failed = NULL;
  size_t nfailed = 0, inactive = 0;
  for (size_t i = 0; i < j->n; i++) {
    int st = job->dropped ? -CV_EBUSY : j->status[i];
    if (st == -CV_ENOTFOUND) continue;
    if (st != 0) { /* moved to the failed list */
      if (!failed && !(failed = calloc(j->n, sizeof *failed))) continue;
      failed[nfailed++] = j->convs[i];
      j->convs[i] = NULL;
      continue;
    }
    if (!j->info[i].channel_active) {
      /* unless a change heard since says otherwise: the newer wins */
      if (!bus_channel_changed_since(j->bus, j->chan_gen, j->info[i].channel)) {
        bus_channel_changed(j->bus, j->info[i].channel, 0);
        inactive++;
      }
      continue;
    }
    bus_msg_t *m = bus_msg_new(j->convs[i], j->info[i].head, NULL);
    if (m) bus_publish(j->bus, m);
  }
  j->done(j->ud, 0, failed, nfailed, j->n, inactive);
  heads_free(j);
}

int heads_check(bus_t *bus, pool_t *pool, char **convs, size_t n, int no_drop, heads_done_cb done,
                void *ud) {
  heads_job_t *j = calloc(1, sizeof *j);
  if (!j || (n > 0 && (!(j->info = calloc(n, sizeof *j->info)) ||
                       !(j->status = calloc(n, sizeof *j->status))))) {
    if (j) {
      free(j->info);
      free(j);
    }
    store_strings_free(convs, n);
    return -CV_ENOMEM;
  }
  j->bus = bus;
  j->convs = convs;
  j->n = n;
  j->done = done;
  j->ud = ud;
  j->chan_gen = bus_channel_gen(bus);
  j->job.kind = "heads";
  j->job.no_drop = no_drop;
  pool_submit(pool, &j->job, heads_work, heads_done);
  return 0;
}
