/*
 * local.c: the in-process bus behind bus.h.
 *
 * Index: a fixed hash table of conversation -> doubly linked subscribers.
 * Queue: a mutex-guarded list from workers to the loop, drained by a
 * uv_async callback, which encodes each frame once and fans it out.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/metrics.h"
#include "bus/bus.h"
#include "bus/chanlog.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"

#define BUS_BUCKETS 65536

struct bus_s {
  uv_async_t async;
  uv_mutex_t append_mu; /* serialises append + enqueue */
  uv_mutex_t queue_mu;
  bus_msg_t *head, *tail;
  _Atomic uint64_t appended; /* by this node's workers, not yet counted */
  int remote;                /* bus_set_remote: fan-out comes from a listener */
  bus_handler_t h;           /* the owner's (bus.h) */
  metrics_t *metrics;        /* the owner's registry, borrowed (loop thread) */
  chanlog_t chans;           /* recent channel state changes */
  size_t nsubs;
  bus_sub_t *buckets[BUS_BUCKETS];
};

static size_t hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
  return (size_t)(h % BUS_BUCKETS);
}

void bus_msg_ref(bus_msg_t *m) { m->refs++; }

void bus_msg_unref(bus_msg_t *m) {
  if (--m->refs > 0) return;
  free(m->json);
  free(m->frame);
  free(m);
}

bus_msg_t *bus_msg_new(const char *conv, int64_t seq, char *json) {
  bus_msg_t *m = calloc(1, sizeof *m);
  if (!m) {
    free(json);
    return NULL;
  }
  m->refs = 1;
  m->seq = seq;
  snprintf(m->conv, sizeof m->conv, "%s", conv);
  m->json = json;
  return m;
}

/* The first subscriber of `conv` in its bucket, or NULL. */
static bus_sub_t *first_sub(const bus_t *bus, const char *conv) {
  bus_sub_t *first = bus->buckets[hash(conv)];
  while (first && strcmp(first->conv, conv) != 0) first = first->next;
  return first;
}

int bus_has_sub(const bus_t *bus, const char *conv) { return first_sub(bus, conv) != NULL; }

void bus_publish(bus_t *bus, bus_msg_t *m) {
  bus_sub_t *first = first_sub(bus, m->conv);
  if (!first) { /* every node hears every conversation: most have no subscriber here */
    bus_msg_unref(m);
    return;
  }
  if (m->json) m->frame = bus->h.msg_wire(bus->h.ud, m->json, strlen(m->json), &m->frame_len);
  if (m->json && !m->frame) {
    /* Subscribers find the message through their next gap fill. */
    log_error("bus: cannot encode frame for %s seq %lld", m->conv, (long long)m->seq);
  } else {
    bus_sub_t *s = first;
    while (s) {
      bus_sub_t *sn = s->next;
      if (strcmp(s->conv, m->conv) == 0) s->deliver(s, m);
      s = sn;
    }
    if (m->frame && m->ts_ms > 0) {
      int64_t lat = util_now_ms() - m->ts_ms;
      metrics_observe_labels(bus->metrics, "converger_delivery_latency_ms",
                             m->remote ? "path=\"notify\"" : "path=\"local\"",
                             lat > 0 ? (double)lat : 0);
    }
  }
  bus_msg_unref(m);
}

static void drain_cb(uv_async_t *handle) {
  bus_t *bus = container_of(handle, bus_t, async);
  uv_mutex_lock(&bus->queue_mu);
  bus_msg_t *m = bus->head;
  bus->head = bus->tail = NULL;
  uv_mutex_unlock(&bus->queue_mu);
  while (m) {
    bus_msg_t *next = m->next;
    bus_publish(bus, m);
    m = next;
  }
  uint64_t appended = atomic_exchange(&bus->appended, 0);
  if (appended) metrics_add(bus->metrics, "converger_messages_appended_total", NULL, appended);
}

bus_t *bus_new(uv_loop_t *loop, const bus_handler_t *handler, metrics_t *metrics) {
  bus_t *bus = calloc(1, sizeof *bus);
  if (!bus) return NULL;
  bus->h = *handler;
  bus->metrics = metrics;
  uv_mutex_init(&bus->append_mu);
  uv_mutex_init(&bus->queue_mu);
  if (uv_async_init(loop, &bus->async, drain_cb) != 0) {
    free(bus);
    return NULL;
  }
  return bus;
}

static void closed_cb(uv_handle_t *h) {
  bus_t *bus = container_of((uv_async_t *)h, bus_t, async);
  bus_msg_t *m = bus->head;
  while (m) {
    bus_msg_t *n = m->next;
    bus_msg_unref(m);
    m = n;
  }
  uv_mutex_destroy(&bus->append_mu);
  uv_mutex_destroy(&bus->queue_mu);
  free(bus);
}

void bus_close(bus_t *bus) { uv_close((uv_handle_t *)&bus->async, closed_cb); }

void bus_subscribe(bus_t *bus, bus_sub_t *sub) {
  if (sub->linked) return;
  bus_sub_t **b = &bus->buckets[hash(sub->conv)];
  sub->prev = NULL;
  sub->next = *b;
  if (*b) (*b)->prev = sub;
  *b = sub;
  sub->linked = 1;
  bus->nsubs++;
  metrics_set(bus->metrics, "converger_subscriptions", NULL, (double)bus->nsubs);
}

void bus_unsubscribe(bus_t *bus, bus_sub_t *sub) {
  if (!sub->linked) return;
  if (sub->prev)
    sub->prev->next = sub->next;
  else
    bus->buckets[hash(sub->conv)] = sub->next;
  if (sub->next) sub->next->prev = sub->prev;
  sub->next = sub->prev = NULL;
  sub->linked = 0;
  bus->nsubs--;
  metrics_set(bus->metrics, "converger_subscriptions", NULL, (double)bus->nsubs);
}

size_t bus_count(const bus_t *bus) { return bus->nsubs; }

void bus_set_remote(bus_t *bus) { bus->remote = 1; }

int bus_convs(const bus_t *bus, char ***convs, size_t *n) {
  *convs = NULL;
  *n = 0;
  size_t cap = 0;
  for (size_t b = 0; b < BUS_BUCKETS; b++)
    for (const bus_sub_t *s = bus->buckets[b]; s; s = s->next) {
      int seen = 0; /* earlier in this chain: convs of one bucket are adjacent in the array */
      for (const bus_sub_t *e = bus->buckets[b]; e != s && !seen; e = e->next)
        seen = strcmp(e->conv, s->conv) == 0;
      if (seen) continue;
      if (*n == cap) {
        cap = cap ? cap * 2 : 64;
        char **v = realloc(*convs, cap * sizeof *v);
        if (!v) goto oom;
        *convs = v;
      }
      if (!((*convs)[*n] = strdup(s->conv))) goto oom;
      (*n)++;
    }
  return 0;
oom:
  store_strings_free(*convs, *n);
  *convs = NULL;
  *n = 0;
  return -CV_ENOMEM;
}

/* Queue the new message of `a` for fan-out on the loop. Under append_mu. */
static void queue_new(bus_t *bus, const store_append_t *a) {
  bus_msg_t *m = bus_msg_new(a->conv, a->msg.seq, bus->h.msg_json(bus->h.ud, a->conv, &a->msg));
  if (m) {
    snprintf(m->epoch, sizeof m->epoch, "%s", a->msg.epoch);
    m->ts_ms = a->msg.ts_ms;
  }
  if (m && m->json) {
    uv_mutex_lock(&bus->queue_mu);
    if (bus->tail)
      bus->tail->next = m;
    else
      bus->head = m;
    bus->tail = m;
    uv_mutex_unlock(&bus->queue_mu);
  } else {
    /* Subscribers find the message through their next gap fill. */
    log_error("bus: out of memory queueing %s seq %lld", a->conv, (long long)a->msg.seq);
    if (m) bus_msg_unref(m);
  }
}

int bus_append_batch(bus_t *bus, store_t *db, store_append_t *const *items, size_t n) {
  /* Across nodes the append transaction notifies every node, this one
   * included: no local queue, and no mutex (the database orders the
   * commits). In process the mutex makes commit order the queue's order. */
  if (!bus->remote) uv_mutex_lock(&bus->append_mu);
  int r = store_append_batch(db, items, n);
  if (r != 0) /* failed as a whole: no item may look committed */
    for (size_t i = 0; i < n; i++)
      if (items[i]->status == 0) items[i]->status = r, items[i]->created = 0;
  uint64_t created = 0;
  for (size_t i = 0; i < n; i++)
    if (items[i]->status == 0 && items[i]->created) {
      created++;
      if (!bus->remote) queue_new(bus, items[i]);
    }
  if (!bus->remote) uv_mutex_unlock(&bus->append_mu);
  if (created) {
    atomic_fetch_add(&bus->appended, created);
    uv_async_send(&bus->async);
  }
  return r;
}

int bus_append(bus_t *bus, store_t *db, const char *conv, const char *id, const char *sender,
               const char *body, int64_t ts_ms, store_msg_t *out, int *created) {
  store_append_t a = {.conv = conv, .id = id, .sender = sender, .body = body, .ts_ms = ts_ms};
  store_append_t *items[] = {&a};
  int r = bus_append_batch(bus, db, items, 1);
  *out = a.msg;
  *created = a.created;
  return r ? r : a.status;
}

/* The group commit of bus_append_submit's jobs, on a worker. */
static void append_batch_cb(pool_job_t **jobs, size_t n, store_t *db) {
  store_append_t *items[POOL_BATCH_MAX];
  int64_t now = util_now_ms();
  for (size_t i = 0; i < n; i++) {
    bus_append_job_t *j = container_of(jobs[i], bus_append_job_t, job);
    j->a.ts_ms = now;
    items[i] = &j->a;
  }
  bus_append_job_t *first = container_of(jobs[0], bus_append_job_t, job);
  (void)bus_append_batch(first->bus, db, items, n);
}

void bus_append_submit(bus_t *bus, pool_t *pool, bus_append_job_t *j, pool_done_cb done) {
  j->bus = bus;
  pool_submit_batch(pool, &j->job, append_batch_cb, done);
}

void bus_channel_changed(bus_t *bus, const char *channel, int active) {
  chanlog_record(&bus->chans, channel, active);
  bus->h.channel_changed(bus->h.ud, channel, active);
}

uint64_t bus_channel_gen(const bus_t *bus) { return bus->chans.gen; }

void bus_user_control(bus_t *bus, const notify_t *n) { bus->h.user_control(bus->h.ud, n); }

void bus_ephemeral(bus_t *bus, const notify_t *n) { bus->h.ephemeral(bus->h.ud, n); }

void bus_each(bus_t *bus, const char *conv, void (*fn)(bus_sub_t *sub, void *ud), void *ud) {
  for (bus_sub_t *s = first_sub(bus, conv); s; s = s->next)
    if (strcmp(s->conv, conv) == 0) fn(s, ud);
}

int bus_channel_changed_since(const bus_t *bus, uint64_t gen, const char *channel) {
  return chanlog_changed_since(&bus->chans, gen, channel);
}

int bus_channel_last_change_since(const bus_t *bus, uint64_t gen, const char *channel) {
  return chanlog_last_change_since(&bus->chans, gen, channel);
}

char *bus_msg_json(bus_t *bus, const char *conv, const store_msg_t *m) {
  return bus->h.msg_json(bus->h.ud, conv, m);
}
