/*
 * local.c: the in-process bus behind bus.h.
 *
 * Index: a fixed hash table of conversation -> doubly linked subscribers.
 * Queue: a mutex-guarded list from workers to the loop, drained by a
 * uv_async callback, which encodes each frame once and fans it out.
 */
#include <stdlib.h>
#include <string.h>

#include "api/metrics.h"
#include "bus/bus.h"
#include "core/log.h"
#include "core/util.h"
#include "net/ws.h"
#include "proto/frames.h"

#define BUS_BUCKETS 65536

struct bus_s {
  uv_async_t async;
  uv_mutex_t append_mu; /* serialises append + enqueue */
  uv_mutex_t queue_mu;
  bus_msg_t *head, *tail;
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

static void drain_cb(uv_async_t *handle) {
  bus_t *bus = container_of(handle, bus_t, async);
  uv_mutex_lock(&bus->queue_mu);
  bus_msg_t *m = bus->head;
  bus->head = bus->tail = NULL;
  uv_mutex_unlock(&bus->queue_mu);
  uint64_t appended = 0;
  while (m) {
    bus_msg_t *next = m->next;
    appended++;
    m->frame = ws_encode_text(m->json, strlen(m->json), &m->frame_len);
    if (m->frame) {
      bus_sub_t *s = bus->buckets[hash(m->conv)];
      while (s) {
        bus_sub_t *sn = s->next;
        if (strcmp(s->conv, m->conv) == 0) s->deliver(s, m);
        s = sn;
      }
    } else {
      log_error("bus: cannot encode frame for %s seq %lld", m->conv, (long long)m->seq);
    }
    bus_msg_unref(m);
    m = next;
  }
  if (appended) metrics_add("converger_messages_appended_total", NULL, appended);
}

bus_t *bus_new(uv_loop_t *loop) {
  bus_t *bus = calloc(1, sizeof *bus);
  if (!bus) return NULL;
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
  metrics_set("converger_subscriptions", NULL, (double)bus->nsubs);
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
  metrics_set("converger_subscriptions", NULL, (double)bus->nsubs);
}

size_t bus_count(const bus_t *bus) { return bus->nsubs; }

int bus_append(bus_t *bus, store_t *db, const char *conv, const char *id, const char *sender,
               const char *body, int64_t ts_ms, store_msg_t *out, int *created) {
  uv_mutex_lock(&bus->append_mu);
  int r = store_append(db, conv, id, sender, body, ts_ms, out, created);
  if (r == 0 && *created) {
    bus_msg_t *m = calloc(1, sizeof *m);
    if (m) {
      m->refs = 1;
      m->seq = out->seq;
      strcpy(m->conv, conv);
      m->json = frame_msg(conv, out);
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
      log_error("bus: out of memory queueing %s seq %lld", conv, (long long)out->seq);
      if (m) free(m);
    }
  }
  uv_mutex_unlock(&bus->append_mu);
  if (r == 0 && *created) uv_async_send(&bus->async);
  return r;
}
