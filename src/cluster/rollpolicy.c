/* rollpolicy.c: see rollpolicy.h. */
#include "cluster/rollpolicy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rollpolicy_sample_s {
  uint64_t t_ms;
  int64_t total;
};

/* The node's name for a reason: its own, or "node <i>" in `buf`. */
static const char *node_name(const rollpolicy_node_t *nd, size_t i, char buf[32]) {
  if (nd->name) return nd->name;
  snprintf(buf, 32, "node %zu", i);
  return buf;
}

void rollpolicy_defaults(rollpolicy_params_t *p) {
  *p = (rollpolicy_params_t){.max_utilisation = 0.65,
                             .pause_cpu = 0.75,
                             .abort_cpu = 0.80,
                             .abort_ms = 30000,
                             .drop_alarm = 0.05,
                             .drop_window_ms = 60000,
                             .abort_on_drop = 1,
                             .sample_ms = 1000};
}

int rollpolicy_init(rollpolicy_t *rp, const rollpolicy_params_t *p, size_t nodes) {
  memset(rp, 0, sizeof *rp);
  rp->p = *p;
  rp->n = nodes;
  rp->last_total = -1;
  rp->hot_since = calloc(nodes ? nodes : 1, sizeof *rp->hot_since);
  return rp->hot_since ? 0 : -1;
}

void rollpolicy_free(rollpolicy_t *rp) {
  free(rp->hot_since);
  free(rp->ring);
  memset(rp, 0, sizeof *rp);
}

double rollpolicy_node_utilisation(const rollpolicy_node_t *node) {
  if (node->capacity > 0) return (double)node->connections / (double)node->capacity;
  return node->cpu;
}

double rollpolicy_fleet_utilisation(const rollpolicy_node_t *nodes, size_t n) {
  int64_t conns = 0, cap = 0;
  int all_cap = n > 0;
  double sum = 0;
  size_t known = 0;
  for (size_t i = 0; i < n; i++) {
    conns += nodes[i].connections;
    cap += nodes[i].capacity;
    all_cap &= nodes[i].capacity > 0;
    double u = rollpolicy_node_utilisation(&nodes[i]);
    if (u >= 0) {
      sum += u;
      known++;
    }
  }
  if (all_cap) return (double)conns / (double)cap;
  return known ? sum / (double)known : -1;
}

size_t rollpolicy_batches(size_t n, size_t batch, const size_t *order, size_t *batch_of) {
  if (batch == 0) batch = 1;
  for (size_t k = 0; k < n; k++) batch_of[order ? order[k] : k] = k / batch;
  return (n + batch - 1) / batch;
}

void rollpolicy_mark_batch(rollpolicy_node_t *nodes, size_t n, const size_t *batch_of, size_t b) {
  for (size_t i = 0; i < n; i++) nodes[i].in_batch = b != ROLLPOLICY_NO_BATCH && batch_of[i] == b;
}

int rollpolicy_headroom(const rollpolicy_params_t *p, const rollpolicy_node_t *nodes, size_t n,
                        const size_t *batch_of, size_t nbatches, char *why, size_t len) {
  double u = rollpolicy_fleet_utilisation(nodes, n);
  if (u > p->max_utilisation) {
    snprintf(
        why, len,
        "fleet utilisation %.0f %% is above the %.0f %% budget (--max-utilisation): the "
        "survivors would have %.0f %% headroom, the reconnect-storm post-mortem asks for %.0f %% "
        "(docs/background.md)",
        u * 100, p->max_utilisation * 100, (1 - u) * 100, (1 - p->max_utilisation) * 100);
    return 1;
  }
  /* Each batch in turn: the survivors take every connection. */
  int64_t conns = 0;
  for (size_t i = 0; i < n; i++) conns += nodes[i].connections;
  for (size_t b = 0; b < nbatches; b++) {
    int64_t cap = 0;
    int all_cap = 1;
    double load = 0; /* without capacities: the fleet's CPU spread over the survivors */
    size_t survivors = 0;
    for (size_t i = 0; i < n; i++) {
      double ui = nodes[i].cpu > 0 ? nodes[i].cpu : 0;
      load += ui;
      if (batch_of[i] == b) continue;
      survivors++;
      cap += nodes[i].capacity;
      all_cap &= nodes[i].capacity > 0;
    }
    if (survivors == 0) {
      snprintf(why, len, "batch %zu restarts every node at once: no survivor holds its clients",
               b + 1);
      return 1;
    }
    double need = all_cap ? (double)conns / (double)cap : load / (double)survivors;
    if (need >= 1.0) {
      if (all_cap)
        snprintf(why, len,
                 "while batch %zu restarts, its %zu survivor(s) would hold %lld connection(s) on "
                 "a capacity of %lld (%.0f %%): use smaller batches (--batch) or add nodes",
                 b + 1, survivors, (long long)conns, (long long)cap, need * 100);
      else
        snprintf(why, len,
                 "while batch %zu restarts, its %zu survivor(s) would run at %.0f %% CPU: use "
                 "smaller batches (--batch) or add nodes",
                 b + 1, survivors, need * 100);
      return 1;
    }
  }
  return 0;
}

/* The connections-drop alarm at `now`: the highest level of the window
 * before `now` against `total`. A sample's level is the lower of its total
 * and the one before: a client moving make-before-break between two reads
 * of a sample is counted on both nodes, and such a one-sample overcount
 * must not become the peak a normal sample then seems to fall from (with a
 * small fleet, a few moves are more than 5 %). A real drop lasts: the level
 * before it is a level the fleet held for two samples. Keeps the window's
 * samples. 1 when it fires (rp->why says how). */
static int drop_alarm(rollpolicy_t *rp, uint64_t now, int64_t total, int64_t population) {
  const rollpolicy_params_t *p = &rp->p;
  size_t k = 0;
  for (size_t i = 0; i < rp->rlen; i++) /* forget what left the window */
    if (rp->ring[i].t_ms + p->drop_window_ms >= now) rp->ring[k++] = rp->ring[i];
  rp->rlen = k;
  int64_t peak = -1;
  uint64_t peak_t = 0;
  for (size_t i = 0; i < rp->rlen; i++)
    if (rp->ring[i].total > peak) {
      peak = rp->ring[i].total;
      peak_t = rp->ring[i].t_ms;
    }
  if (rp->rlen == rp->rcap) {
    size_t cap = rp->rcap ? rp->rcap * 2 : 128;
    struct rollpolicy_sample_s *r = realloc(rp->ring, cap * sizeof *r);
    if (r) {
      rp->ring = r;
      rp->rcap = cap;
    }
  }
  int64_t level = rp->last_total >= 0 && rp->last_total < total ? rp->last_total : total;
  rp->last_total = total;
  if (rp->rlen < rp->rcap) rp->ring[rp->rlen++] = (struct rollpolicy_sample_s){now, level};
  if (p->drop_alarm <= 0 || peak < 0) return 0;
  int64_t base = population > 0 ? population : peak;
  if ((double)(peak - total) <= p->drop_alarm * (double)base) return 0;
  snprintf(rp->why, sizeof rp->why,
           "connections-drop alarm: total connections fell from %lld to %lld (%.1f %% of %lld) in "
           "%.0f s, more than %.0f %% within %.0f s (--abort-drop)",
           (long long)peak, (long long)total, 100.0 * (double)(peak - total) / (double)base,
           (long long)base, (double)(now - peak_t) / 1000, p->drop_alarm * 100,
           (double)p->drop_window_ms / 1000);
  return 1;
}

rollpolicy_verdict_t rollpolicy_observe(rollpolicy_t *rp, uint64_t now_ms,
                                        const rollpolicy_node_t *nodes, int before_batch,
                                        int64_t population) {
  const rollpolicy_params_t *p = &rp->p;
  int64_t total = 0;
  double hottest = -1;
  size_t hot_node = 0;
  for (size_t i = 0; i < rp->n; i++) total += nodes[i].up ? nodes[i].connections : 0;
  if (drop_alarm(rp, now_ms, total, population) && !rp->alarm) {
    rp->alarm = 1;
    rp->alarm_ms = now_ms;
    if (p->abort_on_drop) rp->aborted = 1;
  }
  for (size_t i = 0; i < rp->n; i++) {
    const rollpolicy_node_t *nd = &nodes[i];
    int survivor = nd->up && nd->ready && !nd->in_batch;
    if (!survivor || nd->cpu < 0) {
      rp->hot_since[i] = 0;
      continue;
    }
    if (nd->cpu > hottest) {
      hottest = nd->cpu;
      hot_node = i;
    }
    if (p->abort_cpu <= 0 || nd->cpu <= p->abort_cpu) {
      rp->hot_since[i] = 0;
      continue;
    }
    if (!rp->hot_since[i]) rp->hot_since[i] = now_ms ? now_ms : 1;
    /* a sample stands for its whole period: n samples in a row above is
     * n periods above */
    uint64_t above = now_ms - rp->hot_since[i] + p->sample_ms;
    if (above >= p->abort_ms && !rp->aborted) {
      rp->aborted = 1;
      char name[32];
      snprintf(rp->why, sizeof rp->why,
               "CPU alarm: survivor %s has been above %.0f %% for %.0f s (now %.0f %%; "
               "--abort-cpu, --abort-s)",
               node_name(nd, i, name), p->abort_cpu * 100, (double)above / 1000, nd->cpu * 100);
    }
  }
  if (rp->aborted) return ROLLPOLICY_ABORT;
  if (before_batch && p->pause_cpu > 0 && hottest > p->pause_cpu) {
    char name[32];
    snprintf(rp->why, sizeof rp->why,
             "paused: survivor %s at %.0f %% CPU, above %.0f %% (--pause-cpu)",
             node_name(&nodes[hot_node], hot_node, name), hottest * 100, p->pause_cpu * 100);
    return ROLLPOLICY_PAUSE;
  }
  return ROLLPOLICY_GO;
}
