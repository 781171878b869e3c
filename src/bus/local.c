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
#include "store/notify.h"
#include "store/sharded.h"

#define BUS_BUCKETS 65536

struct bus_s {
  uv_async_t async;
  uv_mutex_t append_mu; /* serialises append + enqueue */
  uv_mutex_t queue_mu;
  bus_msg_t *head, *tail;
  _Atomic uint64_t appended; /* by this node's workers, not yet counted */
  int remote;                /* bus_set_remote: fan-out comes from a listener */
  int routed;                /* bus_set_routed: fan-out through `out` too */
  store_shards_t *shards;    /* bus_set_shards: appends batched per instance */
  bus_remote_t out;
  char node_id[STORE_ID_MAX + 1];
  char **announced; /* bus_announce's payloads, for the loop (queue_mu) */
  size_t nannounced, announced_cap;
  bus_handler_t h;    /* the owner's (bus.h) */
  metrics_t *metrics; /* the owner's registry, borrowed (loop thread) */
  chanlog_t chans;    /* recent channel state changes */
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
  free(m->payload);
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
                             m->remote == BUS_PATH_NOTIFY ? "path=\"notify\""
                             : m->remote == BUS_PATH_BUS  ? "path=\"bus\""
                                                          : "path=\"local\"",
                             lat > 0 ? (double)lat : 0);
    }
  }
  bus_msg_unref(m);
}

/* An announced payload: told here as another node's would be, then sent
 * to the others (to a conversation's nodes, or to all). */
static void announce_one(bus_t *bus, const char *payload) {
  notify_t n;
  notify_kind_t kind = notify_decode(payload, &n);
  bus_heard(bus, payload, bus->node_id, BUS_PATH_LOCAL);
  int of_conv = kind == NOTIFY_PRESENCE_JOIN || kind == NOTIFY_PRESENCE_LEAVE ||
                kind == NOTIFY_SIGNAL || kind == NOTIFY_MESSAGE || kind == NOTIFY_HINT;
  bus->out.publish(bus->out.ud, of_conv ? n.conv : NULL, payload);
}

static void drain_cb(uv_async_t *handle) {
  bus_t *bus = container_of(handle, bus_t, async);
  uv_mutex_lock(&bus->queue_mu);
  bus_msg_t *m = bus->head;
  bus->head = bus->tail = NULL;
  char **ann = bus->announced;
  size_t nann = bus->nannounced;
  bus->announced = NULL;
  bus->nannounced = bus->announced_cap = 0;
  uv_mutex_unlock(&bus->queue_mu);
  for (size_t i = 0; i < nann; i++) announce_one(bus, ann[i]);
  store_strings_free(ann, nann);
  while (m) {
    bus_msg_t *next = m->next;
    /* routed: the other nodes' subscribers hear it from the bus */
    if (bus->routed && m->payload) bus->out.publish(bus->out.ud, m->conv, m->payload);
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
  store_strings_free(bus->announced, bus->nannounced);
  uv_mutex_destroy(&bus->append_mu);
  uv_mutex_destroy(&bus->queue_mu);
  free(bus);
}

void bus_close(bus_t *bus) { uv_close((uv_handle_t *)&bus->async, closed_cb); }

void bus_subscribe(bus_t *bus, bus_sub_t *sub) {
  if (sub->linked) return;
  if (bus->routed && !first_sub(bus, sub->conv)) bus->out.interest(bus->out.ud, sub->conv, 1);
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
  if (bus->routed && !first_sub(bus, sub->conv)) bus->out.interest(bus->out.ud, sub->conv, 0);
}

size_t bus_count(const bus_t *bus) { return bus->nsubs; }

void bus_set_remote(bus_t *bus) { bus->remote = 1; }

void bus_set_routed(bus_t *bus, const bus_remote_t *remote, const char *node_id) {
  bus->routed = 1;
  bus->out = *remote;
  snprintf(bus->node_id, sizeof bus->node_id, "%s", node_id);
}

int bus_routed(const bus_t *bus) { return bus->routed; }

metrics_t *bus_metrics(const bus_t *bus) { return bus->metrics; }

void bus_set_shards(bus_t *bus, store_shards_t *shards) { bus->shards = shards; }

void bus_announce(void *ud, const char *payload) {
  bus_t *bus = ud;
  char *copy = strdup(payload);
  uv_mutex_lock(&bus->queue_mu);
  if (copy && bus->nannounced == bus->announced_cap) {
    size_t cap = bus->announced_cap ? 2 * bus->announced_cap : 16;
    char **v = realloc(bus->announced, cap * sizeof *v);
    if (v) {
      bus->announced = v;
      bus->announced_cap = cap;
    }
  }
  int queued = copy && bus->nannounced < bus->announced_cap;
  if (queued) bus->announced[bus->nannounced++] = copy;
  uv_mutex_unlock(&bus->queue_mu);
  if (!queued) {
    free(copy);
    log_error("bus: out of memory announcing %.40s; not told to other nodes", payload);
    return;
  }
  uv_async_send(&bus->async);
}

void bus_heard(bus_t *bus, const char *payload, const char *node_id, int path) {
  notify_t n;
  if (notify_is_batch(payload)) {
    /* a group commit's messages, in commit order (store/notify.h) */
    char buf[STORE_NOTIFY_PAYLOAD_MAX + 1];
    const char *p = payload + 2;
    int r;
    while ((r = notify_batch_next(&p, buf, sizeof buf)) == 1)
      if (!notify_is_batch(buf)) bus_heard(bus, buf, node_id, path);
    if (r < 0)
      log_warn("bus: a malformed group payload; its subscribers read the rest from the store");
    return;
  }
  switch (notify_decode(payload, &n)) {
  case NOTIFY_CHANNEL:
    bus_channel_changed(bus, n.conv, n.active);
    return;
  case NOTIFY_MESSAGE:
  case NOTIFY_FRAME:
  case NOTIFY_HINT: {
    if (!bus_has_sub(bus, n.conv)) return; /* most conversations have no subscriber here */
    char *json = NULL;
    if (n.kind == NOTIFY_FRAME && !(json = strdup(n.body)))
      log_error("bus: out of memory for %s seq %lld; subscribers read it from the store", n.conv,
                (long long)n.seq);
    if (n.kind == NOTIFY_MESSAGE) {
      store_msg_t m = {.seq = n.seq, .sender = n.sender, .body = (char *)n.body, .ts_ms = n.ts_ms};
      memcpy(m.id, n.id, sizeof m.id);
      memcpy(m.epoch, n.epoch, sizeof m.epoch);
      if (!(json = bus_msg_json(bus, n.conv, &m)))
        log_error("bus: out of memory for %s seq %lld; subscribers read it from the store", n.conv,
                  (long long)n.seq);
    }
    /* json NULL: a head hint (bus.h), for a message that did not fit */
    bus_msg_t *m = bus_msg_new(n.conv, n.seq, json);
    if (m) {
      snprintf(m->epoch, sizeof m->epoch, "%s", n.epoch);
      m->ts_ms = n.kind == NOTIFY_MESSAGE ? n.ts_ms : 0;
      m->remote = path;
      bus_publish(bus, m);
    }
    return;
  }
  case NOTIFY_USER_DISCONNECT:
  case NOTIFY_USER_UNSUBSCRIBE:
    /* the node the request came to acted on its own connections already */
    if (strcmp(n.origin, node_id) != 0) bus_user_control(bus, &n);
    return;
  case NOTIFY_PRESENCE_JOIN:
  case NOTIFY_PRESENCE_LEAVE:
  case NOTIFY_SIGNAL:
    if (bus_has_sub(bus, n.conv)) bus_ephemeral(bus, &n);
    return;
  case NOTIFY_BAD:
    break;
  }
  log_warn("bus: ignoring a notification that is not converger's: %.80s", payload);
}

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

/* Queue the new message of `a` for fan-out on the loop (routed: with the
 * payload the loop publishes). Under append_mu, or (routed) in its lane. */
static void queue_new(bus_t *bus, const store_append_t *a) {
  bus_msg_t *m = bus_msg_new(a->conv, a->msg.seq, bus->h.msg_json(bus->h.ud, a->conv, &a->msg));
  if (m) {
    snprintf(m->epoch, sizeof m->epoch, "%s", a->msg.epoch);
    m->ts_ms = a->msg.ts_ms;
    if (bus->routed && !(m->payload = notify_message(a->conv, &a->msg))) {
      bus_msg_unref(m);
      m = NULL;
    }
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
  /* Routed (a sharded cluster), no mutex either: the lanes of the
   * instances run side by side (one that hangs holds no other). The
   * appends of one conversation are committed by its instance's lane
   * (bus_append_submit), so its messages are mostly queued in seq order;
   * not always (CONVERGER_APPEND_BATCH=1 runs appends on any worker, and a
   * shard move changes a conversation's lane), and then a subscriber
   * fills the gap from the store and drops the late one as a duplicate,
   * as for any message of another node. */
  int serial = !bus->remote && !bus->routed;
  if (serial) uv_mutex_lock(&bus->append_mu);
  int r = store_append_batch(db, items, n);
  if (r != 0) /* failed as a whole: no item may look committed */
    for (size_t i = 0; i < n; i++)
      if (items[i]->status == 0) items[i]->status = r, items[i]->created = 0;
  uint64_t created = 0, found = 0;
  for (size_t i = 0; i < n; i++)
    if (items[i]->status == 0 && items[i]->created) {
      created++;
      if (!bus->remote) queue_new(bus, items[i]);
    } else if (items[i]->status == 0 && bus->routed) {
      /* an idempotent retry: the first attempt may have committed and
       * then lost its publish (a crash, a timeout) */
      found++;
      queue_new(bus, items[i]);
    }
  if (serial) uv_mutex_unlock(&bus->append_mu);
  if (created) atomic_fetch_add(&bus->appended, created);
  if (created || found) uv_async_send(&bus->async);
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
  /* its instance's lane; 0 (the one lane) before the map is read */
  j->job.batch_key = bus->shards ? 1 + store_shards_instance_of(bus->shards, j->a.conv) : 0;
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
