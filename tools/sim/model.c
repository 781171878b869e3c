/*
 * sim/model.c: the discrete-event model (see model.h for the rules and
 * their sources).
 *
 * Owns every array of the sim_t. Invariants: a client is in one wheel slot
 * iff SIM_F_PENDING; in exactly one node queue iff SIM_QUEUED; node != SIM_NO_NODE
 * iff it holds a connection (counted in that node's conns and in
 * s->connected); since == SIM_NONE iff it has a connection.
 */
#include "sim/model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gate/drain.h"
#include "stats/rank.h"

#define PREFETCH   8    /* clients ahead that a loop asks the cache for */
#define SPARE_KEEP 4096 /* largest slot array kept for reuse */

/* ---- random ------------------------------------------------------------- */

/* Uniform in [0, 1). */
static double unit(jitter_rng_t *r) { return (double)(jitter_next(r) >> 11) * 0x1.0p-53; }

/* Poisson-distributed count with mean `lambda` (Knuth below 30, normal
 * approximation above). */
static int64_t poisson(jitter_rng_t *r, double lambda) {
  if (lambda <= 0) return 0;
  if (lambda < 30) {
    double l = exp(-lambda), p = 1.0;
    int64_t k = -1;
    do {
      k++;
      p *= unit(r);
    } while (p > l);
    return k;
  }
  /* Box-Muller */
  double u1 = unit(r), u2 = unit(r);
  double z = sqrt(-2.0 * log(u1 > 0 ? u1 : 0x1.0p-53)) * cos(2 * M_PI * u2);
  double k = lambda + sqrt(lambda) * z + 0.5;
  return k > 0 ? (int64_t)k : 0;
}

/* A client's point on the hash ring (murmur3's 64-bit finaliser). */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/* ---- time --------------------------------------------------------------- */

static sim_second_t *cur(sim_t *s) {
  int i = (int)(s->now / SIM_TICKS_PER_S);
  return &s->sec[i < s->nsec ? i : s->nsec - 1];
}

/* Put client `ci` in the wheel `delay_ms` from now (at least one step). */
static void schedule(sim_t *s, uint32_t ci, int64_t delay_ms) {
  sim_client_t *c = &s->c[ci];
  int64_t d = (delay_ms + SIM_TICK_MS - 1) / SIM_TICK_MS;
  c->due = s->now + (uint32_t)(d < 1 ? 1 : d);
  sim_slot_t *slot = &s->wheel[c->due & (SIM_WHEEL_SLOTS - 1)];
  if (slot->n == slot->cap) {
    uint32_t cap = slot->cap ? slot->cap * 2 : 64;
    uint32_t *v = realloc(slot->v, cap * sizeof *v);
    if (!v) {
      s->failed = 1;
      return;
    }
    slot->v = v;
    slot->cap = cap;
  }
  slot->v[slot->n++] = ci;
  c->flags |= SIM_F_PENDING;
}

/* The SDK's next delay for `c` (client/backoff.c itself, on the client's
 * two words of backoff state). */
static int64_t backoff_delay(sim_t *s, sim_client_t *c, int64_t hint_ms) {
  cvg_backoff_t b = {
      .opt = s->backoff, .rng = &s->rng, .attempt = c->attempt, .prev_ms = c->prev_ms};
  int64_t d = cvg_backoff_next(&b, hint_ms);
  c->attempt = (uint8_t)(b.attempt < 255 ? b.attempt : 255);
  c->prev_ms = (uint32_t)b.prev_ms;
  return d;
}

/* A welcome: the SDK's reset of `c`'s backoff state (cvg_backoff_reset). */
static void backoff_reset(sim_t *s, sim_client_t *c) {
  cvg_backoff_t b = {.opt = s->backoff, .rng = &s->rng};
  cvg_backoff_reset(&b);
  c->attempt = (uint8_t)b.attempt;
  c->prev_ms = (uint32_t)b.prev_ms;
}

static int64_t hint(sim_t *s) {
  return s->p.hints ? jitter_retry_hint(&s->rng, s->p.hint_min_ms, s->p.hint_max_ms) : 0;
}

/* ---- nodes -------------------------------------------------------------- */

static void rebuild_ready(sim_t *s) {
  s->nready = 0;
  for (int64_t k = 0; k < s->p.nodes; k++)
    if (s->n[k].ready) s->ready[s->nready++] = (uint16_t)k;
}

static int64_t node_load(const sim_t *s, uint16_t k) { return s->n[k].conns + s->n[k].qlen; }

/* The ready node with the fewest connections and waiters. */
static uint16_t least_loaded(const sim_t *s) {
  uint16_t best = s->ready[0];
  for (int i = 1; i < s->nready; i++)
    if (node_load(s, s->ready[i]) < node_load(s, best)) best = s->ready[i];
  return best;
}

uint16_t sim_lb_pick(sim_t *s, uint32_t ci) {
  if (s->nready == 0) return SIM_NO_NODE;
  switch (s->p.lb) {
  case SIM_LB_LEASTCONN:
    return least_loaded(s);
  case SIM_LB_HASH: {
    uint64_t key = mix64((uint64_t)ci ^ ((uint64_t)s->p.seed << 32));
    size_t lo = 0, hi = s->nring; /* first point >= key */
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (s->ring_pos[mid] < key)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (size_t i = 0; i < s->nring; i++) {
      uint16_t k = s->ring_node[(lo + i) % s->nring];
      if (s->n[k].ready) return k;
    }
    return SIM_NO_NODE;
  }
  case SIM_LB_RANDOM:
  default:
    return s->ready[jitter_range(&s->rng, 0, s->nready - 1)];
  }
}

static void spreads_free(sim_t *s) {
  for (int i = 0; i < s->nspread; i++) spread_free(&s->spread[i]);
  free(s->spread);
  free(s->spread_ids);
  s->spread = NULL;
  s->spread_ids = NULL;
  s->nspread = 0;
}

/* The spreads of the batch that begins to drain (s->members, out of ready
 * already): L_i the ready nodes' connections + waiters now, D the batch's
 * connections. Out of memory: s->failed. */
static void spreads_build(sim_t *s) {
  spreads_free(s);
  int64_t dsum = 0;
  for (int m = 0; m < s->nmembers; m++) dsum += s->n[s->members[m]].conns;
  int64_t *load = malloc(((size_t)s->nready + 1) * sizeof *load);
  s->spread = calloc((size_t)s->nmembers + 1, sizeof *s->spread);
  s->spread_ids = malloc(((size_t)s->nready + 1) * sizeof *s->spread_ids);
  if (!load || !s->spread || !s->spread_ids) {
    free(load);
    spreads_free(s);
    s->failed = 1;
    return;
  }
  for (int i = 0; i < s->nready; i++) {
    s->spread_ids[i] = s->ready[i];
    load[i] = node_load(s, s->ready[i]);
  }
  s->nspread = s->nmembers;
  for (int m = 0; m < s->nmembers; m++)
    if (spread_init(&s->spread[m], load, (size_t)s->nready, s->n[s->members[m]].conns, dsum) != 0)
      s->failed = 1;
  free(load);
}

/* A draining node's reconnectTo for a client of node `from`: `spread` (its
 * spread_t; src/gate/drain.c), `least`, the ready peer with the most spare
 * capacity (DESIGN.md), or `two`, of two random ready peers the less
 * loaded. A spread's pick that is no longer ready falls back to `two`. */
static uint16_t reconnect_to(sim_t *s, uint16_t from) {
  if (s->nready == 0) return SIM_NO_NODE;
  if (s->p.reconnect_to == SIM_TO_LEAST) return least_loaded(s);
  int32_t m = s->member_of[from];
  if (s->p.reconnect_to == SIM_TO_SPREAD && m >= 0 && m < s->nspread && s->spread[m].n > 0) {
    uint16_t k = s->spread_ids[spread_pick(&s->spread[m], &s->rng)];
    if (s->n[k].ready) return k;
  }
  int i = (int)jitter_range(&s->rng, 0, s->nready - 1), j = i;
  if (s->nready > 1) {
    j = (int)jitter_range(&s->rng, 0, s->nready - 2);
    if (j >= i) j++;
  }
  return node_load(s, s->ready[j]) < node_load(s, s->ready[i]) ? s->ready[j] : s->ready[i];
}

/* The CPU share handshakes may use on node `k`, given `refuse` of it goes
 * to refusals: up to 100 % (refuse) or admission_cpu (queue), less the
 * connections' load, and never more than what the refusals leave. */
static double handshake_share(const sim_t *s, const sim_node_t *n, double refuse) {
  double load = (double)n->conns / (double)s->capacity;
  double limit = s->p.admission == SIM_ACCEPT_QUEUE ? (double)s->p.admission_cpu / 100.0 : 1.0;
  double share = limit - load;
  return share < 1.0 - load - refuse ? share : 1.0 - load - refuse;
}

/* The policy's wait bound, in ms. */
static int64_t wait_bound_ms(const sim_t *s) {
  return s->p.admission == SIM_ACCEPT_QUEUE ? s->p.queue_ms : s->p.refuse_wait_ms;
}

int sim_node_offer(sim_t *s, uint16_t k, uint32_t ci) {
  sim_node_t *n = &s->n[k];
  double rate = (double)s->p.handshake_rate * handshake_share(s, n, n->refuse_share); /* per s */
  double bound_ms = (double)wait_bound_ms(s);
  if (n->up && n->ready && rate > 0 && n->qlen < s->qcap &&
      (double)(n->qlen + 1) * 1000.0 / rate <= bound_ms) {
    sim_client_t *c = &s->c[ci];
    uint32_t slot = (uint32_t)((n->qhead + n->qlen++) % s->qcap);
    n->q[slot] = ci;
    n->qt[slot] = s->now;
    c->state = SIM_QUEUED;
    return 1;
  }
  n->refused_step++;
  s->refusals++;
  cur(s)->refusals++;
  return 0;
}

/* Record the end of an outage of `ms` (a make-before-break move: 0). */
static void record_outage(sim_t *s, sim_client_t *c, double ms) {
  if (ms <= 0) {
    s->moves++;
    s->hist[0]++;
  } else {
    int64_t bin = (int64_t)(ms / SIM_HIST_BIN_MS) + 1;
    s->hist[bin < s->nbins ? bin : s->nbins - 1]++;
    s->disconnected_client_s += ms / 1000.0;
    if (ms > (double)s->p.degraded_ms && !(c->flags & SIM_F_DEGRADED)) {
      c->flags |= SIM_F_DEGRADED;
      s->degraded_sessions++;
    }
  }
  s->nhist++;
}

/* Record the end of a churn outage of `ms` (not the restart's). */
static void record_churn_outage(sim_t *s, sim_client_t *c, double ms) {
  s->churn_disconnected_client_s += ms / 1000.0;
  if (ms > (double)s->p.degraded_ms && !(c->flags & SIM_F_CHURN_DEGRADED)) {
    c->flags |= SIM_F_CHURN_DEGRADED;
    s->churn_degraded_sessions++;
  }
}

/* Client `ci` loses its connection: a drain close or the node going away
 * (hint: the close's retryAfterMs, 0 none), a collapse, or churn. */
static void lose(sim_t *s, uint32_t ci, int64_t hint_ms, int churn) {
  sim_client_t *c = &s->c[ci];
  s->n[c->node].conns--;
  s->connected--;
  if (c->batch) s->batch_out[c->batch - 1]++;
  c->node = SIM_NO_NODE;
  c->since = s->now;
  c->flags = (uint8_t)(churn ? c->flags | SIM_F_CHURN : c->flags & ~SIM_F_CHURN);
  if (c->state == SIM_QUEUED) return; /* a move in progress becomes a reconnect */
  c->state = SIM_WAITING;
  if (!(c->flags & SIM_F_PENDING)) schedule(s, ci, backoff_delay(s, c, hint_ms));
}

static void welcome(sim_t *s, uint16_t k, uint32_t ci) {
  sim_client_t *c = &s->c[ci];
  if (c->node != SIM_NO_NODE) { /* make-before-break */
    s->n[c->node].conns--;
    s->connected--;
    record_outage(s, c, 0);
  } else {
    if (c->flags & SIM_F_CHURN)
      record_churn_outage(s, c, (double)(s->now - c->since) * SIM_TICK_MS);
    else
      record_outage(s, c, (double)(s->now - c->since) * SIM_TICK_MS);
    if (c->batch) s->batch_out[c->batch - 1]--;
  }
  c->flags &= (uint8_t)~SIM_F_CHURN;
  c->node = k;
  c->since = SIM_NONE;
  c->state = SIM_CONNECTED;
  backoff_reset(s, c);
  s->n[k].conns++;
  s->n[k].welcomes_s++;
  s->connected++;
  cur(s)->welcomes++;
}

/* A refused attempt of `ci`: back off (a move keeps its connection). */
static void refused(sim_t *s, uint32_t ci, int64_t hint_ms) {
  sim_client_t *c = &s->c[ci];
  c->state = c->node != SIM_NO_NODE ? SIM_MIGRATING : SIM_WAITING;
  schedule(s, ci, backoff_delay(s, c, hint_ms));
}

/* A connection attempt: through the load balancer, or a drain move to the
 * draining node's reconnectTo. */
static void attempt(sim_t *s, uint32_t ci, int move) {
  sim_client_t *c = &s->c[ci];
  s->attempts++;
  if (c->flags & SIM_F_CHURN) s->churn_attempts++;
  cur(s)->attempts++;
  uint16_t k = move ? reconnect_to(s, c->node) : sim_lb_pick(s, ci);
  if (k == SIM_NO_NODE) {
    refused(s, ci, 0);
    return;
  }
  if (!sim_node_offer(s, k, ci)) {
    refused(s, ci, hint(s));
  }
}

/* Refuse node `k`'s head waiter (a timeout or a flush). */
static void refuse_head(sim_t *s, sim_node_t *n) {
  uint32_t ci = n->q[n->qhead];
  n->qhead = (uint32_t)((n->qhead + 1) % s->qcap);
  n->qlen--;
  n->refused_step++;
  s->refusals++;
  cur(s)->refusals++;
  refused(s, ci, hint(s));
}

/* Serve node `k`'s queue for one step and account its CPU work. Waiters
 * queued longer than the policy's bound are refused first (the rate may
 * have fallen since they were taken). */
static void node_step(sim_t *s, uint16_t k) {
  sim_node_t *n = &s->n[k];
  const double dt = SIM_TICK_MS / 1000.0, rate = (double)s->p.handshake_rate;
  uint32_t bound = (uint32_t)(wait_bound_ms(s) / SIM_TICK_MS);
  while (n->qlen > 0 && s->now - n->qt[n->qhead] > bound) refuse_head(s, n);
  double refuse_work = (double)n->refused_step * (double)s->p.refuse_cost / 100.0 / rate;
  double allowed = handshake_share(s, n, refuse_work / dt) * dt;
  double budget = allowed > 0 ? allowed * rate + n->carry : 0;
  int64_t served = 0;
  while (n->qlen > 0 && budget >= 1.0) {
    if (n->qlen > PREFETCH) __builtin_prefetch(&s->c[n->q[(n->qhead + PREFETCH) % s->qcap]], 1);
    uint32_t ci = n->q[n->qhead];
    n->qhead = (uint32_t)((n->qhead + 1) % s->qcap);
    n->qlen--;
    welcome(s, k, ci);
    budget -= 1.0;
    served++;
  }
  n->carry = n->qlen > 0 && budget > 0 ? budget : 0;
  n->work += (double)served / rate + refuse_work;
  n->refuse_share = refuse_work / dt;
  n->refused_step = 0;
}

/* Refuse everything in node `k`'s queue (it starts draining). */
static void flush_queue(sim_t *s, uint16_t k) {
  sim_node_t *n = &s->n[k];
  while (n->qlen > 0) refuse_head(s, n);
}

/* ---- restart controller ------------------------------------------------- */

/* The batch's nodes become s->members (the batch choice of
 * cluster/rollpolicy.h, as converger roll makes it). */
static void take_members(sim_t *s, int b) {
  for (int m = 0; m < s->nmembers; m++) s->member_of[s->members[m]] = -1;
  s->nmembers = 0;
  for (int64_t k = 0; k < s->p.nodes; k++)
    if (s->batch_of[k] == (size_t)b) {
      s->member_of[k] = s->nmembers;
      s->members[s->nmembers++] = (uint16_t)k;
    }
}

/* Every client of the batch's nodes: `close` closes them (all at once, or
 * paced at close_rate per node), `migrate` gives each a move time. */
static void start_batch(sim_t *s) {
  int b = s->next_batch++;
  take_members(s, b);
  for (int m = 0; m < s->nmembers; m++) {
    uint16_t k = s->members[m];
    s->n[k].ready = 0;
    s->n[k].draining = 1;
    s->n[k].closes = 0;
    flush_queue(s, k);
  }
  rebuild_ready(s);
  if (s->p.drain == SIM_DRAIN_MIGRATE && s->p.reconnect_to == SIM_TO_SPREAD) spreads_build(s);
  s->batch_active = 1;
  s->batch_start = s->now;
  if (b == 0) s->first_start = s->now;
  s->batch_start_s[b] = s->now / SIM_TICKS_PER_S;
  int64_t batch_conns = 0;
  for (int m = 0; m < s->nmembers; m++) batch_conns += s->n[s->members[m]].conns;
  s->displaced += batch_conns;
  s->batch_displaced[b] = batch_conns;
  if (batch_conns > s->max_batch_displaced) s->max_batch_displaced = batch_conns;
  for (uint32_t ci = 0; ci < (uint32_t)s->p.clients; ci++) {
    sim_client_t *c = &s->c[ci];
    if (c->node == SIM_NO_NODE || s->member_of[c->node] < 0) continue;
    c->batch = (uint16_t)(b + 1);    /* b < nodes < SIM_NO_NODE: no overflow */
    if (c->state != SIM_CONNECTED) { /* cannot happen between batches; closed if it did */
      lose(s, ci, hint(s), 0);
    } else if (s->p.drain == SIM_DRAIN_MIGRATE) {
      int64_t w = s->p.drain_window_s * 1000;
      c->state = SIM_MIGRATING;
      schedule(s, ci, w > 0 ? jitter_range(&s->rng, 0, w - 1) : 0);
    } else if (s->p.close_rate == 0) {
      lose(s, ci, hint(s), 0);
    } else {
      c->state = SIM_CLOSING;
      schedule(s, ci, (int64_t)s->n[c->node].closes++ * 1000 / s->p.close_rate);
    }
  }
}

/* Migrate: at window + DRAIN_GRACE_MS, the batch's nodes close whoever is
 * still connected to them (at once). */
static void close_stragglers(sim_t *s) {
  for (uint32_t ci = 0; ci < (uint32_t)s->p.clients; ci++) {
    uint16_t k = s->c[ci].node;
    if (k != SIM_NO_NODE && s->member_of[k] >= 0) lose(s, ci, hint(s), 0);
  }
}

static void controller(sim_t *s) {
  const sim_params_t *p = &s->p;
  if (s->batch_active) {
    int b = s->next_batch - 1, all_up = 1, all_empty = 1;
    if (p->drain == SIM_DRAIN_MIGRATE &&
        s->now ==
            s->batch_start + (uint32_t)((p->drain_window_s * 1000 + DRAIN_GRACE_MS) / SIM_TICK_MS))
      close_stragglers(s);
    for (int m = 0; m < s->nmembers; m++) {
      sim_node_t *n = &s->n[s->members[m]];
      if (n->draining && n->conns == 0 && n->qlen == 0) {
        n->draining = 0;
        n->up = 0;
        n->ready_at = s->now + (uint32_t)(p->restart_s * SIM_TICKS_PER_S);
      }
      if (!n->up && !n->draining && s->now >= n->ready_at) {
        n->up = n->ready = 1;
        n->hot_s = 0;
        n->cpu = 0;
        rebuild_ready(s);
      }
      if (n->draining) all_empty = 0;
      if (!n->up || n->draining) all_up = 0;
    }
    if (all_empty && s->batch_empty_s[b] == SIM_NONE)
      s->batch_empty_s[b] = s->now / SIM_TICKS_PER_S;
    if (all_up) {
      spreads_free(s); /* the drain is over */
      s->batch_active = 0;
      s->batch_done = s->now;
      if (s->next_batch == s->nbatches) s->restart_done = s->now;
    }
    return;
  }
  if (s->aborted || s->next_batch >= s->nbatches) return;
  if (s->now < (uint32_t)(p->start_s * SIM_TICKS_PER_S)) return;
  if (s->next_batch > 0 &&
      (s->now < s->batch_start + (uint32_t)(p->batch_interval_s * SIM_TICKS_PER_S) ||
       s->now < s->batch_done + (uint32_t)(p->settle_s * SIM_TICKS_PER_S)))
    return;
  if (s->paused_now) return;
  start_batch(s);
}

/* ---- seconds ------------------------------------------------------------ */

/* Drop collapse_share of the clients of every node marked `drop`. */
static void collapse(sim_t *s, const uint8_t *drop) {
  double share = (double)s->p.collapse_share / 100.0;
  for (uint32_t ci = 0; ci < (uint32_t)s->p.clients; ci++) {
    uint16_t k = s->c[ci].node;
    if (k != SIM_NO_NODE && drop[k] && (share >= 1.0 || unit(&s->rng) < share)) lose(s, ci, 0, 0);
  }
}

static void end_second(sim_t *s) {
  const sim_params_t *p = &s->p;
  int sec = (int)(s->now / SIM_TICKS_PER_S);
  sim_second_t *row = &s->sec[sec];
  uint8_t *drop = s->drop;
  int ndrop = 0;
  for (int64_t k = 0; k < p->nodes; k++) {
    sim_node_t *n = &s->n[k];
    if (n->welcomes_s > n->peak_welcomes) n->peak_welcomes = n->welcomes_s;
    n->welcomes_s = 0;
    s->pnode[k] = (rollpolicy_node_t){
        .up = n->up, .ready = n->ready, .connections = n->up ? n->conns : 0, .cpu = -1};
    if (!n->up) continue;
    n->cpu = (double)n->conns / (double)s->capacity + n->work;
    n->work = 0;
    if (n->cpu > row->max_cpu) row->max_cpu = n->cpu;
    s->pnode[k].cpu = n->cpu;
    if (n->cpu >= 0.99) { /* at 100 % */
      row->nodes_hot++;
      row->on_hot += n->conns;
      if (++n->hot_s >= p->collapse_s) {
        drop[k] = 1;
        ndrop++;
        n->hot_s = 0;
        s->collapses++;
        if (!n->collapsed) s->nodes_collapsed++;
        n->collapsed = 1;
      }
    } else {
      n->hot_s = 0;
    }
  }
  if (ndrop) {
    collapse(s, drop);
    memset(drop, 0, (size_t)p->nodes);
  }
  row->nodes_ready = s->nready;
  row->connected = s->connected;
  row->disconnected = p->clients - s->connected;
  row->collapses = (int)s->collapses;
  row->batch = s->next_batch;
  /* Pause, abort and the connections-drop alarm: the policy converger roll
   * runs, on this second's nodes (a batch may start only while none is
   * active). Not survivors, as in converger roll: the batch under way, or,
   * before a batch, the next one. */
  rollpolicy_mark_batch(s->pnode, (size_t)p->nodes, s->batch_of,
                        (size_t)(s->batch_active ? s->next_batch - 1 : s->next_batch));
  rollpolicy_verdict_t v =
      rollpolicy_observe(&s->policy, (uint64_t)sec * 1000, s->pnode, !s->batch_active, p->clients);
  if (v == ROLLPOLICY_ABORT) s->aborted = 1;
  if (s->policy.alarm && s->alarm_s < 0) s->alarm_s = (int)(s->policy.alarm_ms / 1000);
  s->paused_now = v == ROLLPOLICY_PAUSE;
  row->paused = s->paused_now && !s->batch_active && !s->aborted && s->next_batch < s->nbatches &&
                s->now >= (uint32_t)(p->start_s * SIM_TICKS_PER_S);
  s->paused_s += row->paused;
  /* a batch is reconnected once its nodes are empty and at most 1 % of the
   * clients it displaced are without a connection */
  for (int i = 0; i < s->next_batch; i++)
    if (s->batch_empty_s[i] != SIM_NONE && s->reconnect99_s[i] < 0 &&
        (double)s->batch_out[i] <= 0.01 * (double)s->batch_displaced[i])
      s->reconnect99_s[i] = sec - (int)s->batch_start_s[i];
}

/* ---- steps -------------------------------------------------------------- */

void sim_step(sim_t *s) {
  controller(s);
  /* churn: ordinary reconnects of connected clients */
  int64_t churn = poisson(&s->rng, s->churn_per_step);
  for (int64_t i = 0; i < churn; i++) {
    uint32_t ci = (uint32_t)jitter_range(&s->rng, 0, s->p.clients - 1);
    if (s->c[ci].state == SIM_CONNECTED) lose(s, ci, 0, 1);
  }
  /* due events: run the slot's array while new events go to a fresh one */
  sim_slot_t *slot = &s->wheel[s->now & (SIM_WHEEL_SLOTS - 1)], run = *slot;
  *slot = s->spare;
  slot->n = 0;
  for (uint32_t i = 0; i < run.n; i++) {
    if (i + PREFETCH < run.n) __builtin_prefetch(&s->c[run.v[i + PREFETCH]], 1);
    uint32_t ci = run.v[i];
    sim_client_t *c = &s->c[ci];
    if (c->due != s->now) { /* a later turn of the wheel */
      c->flags &= (uint8_t)~SIM_F_PENDING;
      schedule(s, ci, (int64_t)(c->due - s->now) * SIM_TICK_MS);
    } else {
      c->flags &= (uint8_t)~SIM_F_PENDING;
      switch (c->state) {
      case SIM_WAITING:
        attempt(s, ci, 0);
        break;
      case SIM_MIGRATING:
        attempt(s, ci, 1);
        break;
      case SIM_CLOSING:
        lose(s, ci, hint(s), 0);
        break;
      default:
        break; /* cannot happen: connected and queued clients have no event */
      }
    }
  }
  if (run.cap > SPARE_KEEP) { /* a burst's array: do not let it settle in another slot */
    free(run.v);
    run = (sim_slot_t){0};
  }
  s->spare = run;
  for (int64_t k = 0; k < s->p.nodes; k++)
    if (s->n[k].up) node_step(s, (uint16_t)k);
  s->now++;
  if (s->now % SIM_TICKS_PER_S == 0) {
    s->now--; /* the second's own index */
    end_second(s);
    s->now++;
  }
}

/* Outages still open at the end count up to the end. */
static void finish(sim_t *s) {
  for (uint32_t ci = 0; ci < (uint32_t)s->p.clients; ci++) {
    sim_client_t *c = &s->c[ci];
    if (c->node != SIM_NO_NODE) continue;
    if (c->flags & SIM_F_CHURN)
      record_churn_outage(s, c, (double)(s->now - c->since) * SIM_TICK_MS);
    else
      record_outage(s, c, (double)(s->now - c->since) * SIM_TICK_MS);
  }
}

int sim_run(sim_t *s, void (*progress)(const sim_t *s, int second)) {
  uint32_t end = (uint32_t)(s->p.duration_s * SIM_TICKS_PER_S);
  while (s->now < end) {
    sim_step(s);
    if (s->failed) return -ENOMEM;
    if (progress && s->now % (60 * SIM_TICKS_PER_S) == 0)
      progress(s, (int)(s->now / SIM_TICKS_PER_S) - 1);
  }
  finish(s);
  return 0;
}

/* ---- setup -------------------------------------------------------------- */

/* The client array, in transparent huge pages where the kernel allows
 * them (THP "madvise"): random access to 13 M clients otherwise misses the
 * TLB on nearly every event. NULL when out of memory. */
static sim_client_t *alloc_clients(size_t n) {
  void *p = mmap(NULL, n * sizeof(sim_client_t), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  madvise(p, n * sizeof(sim_client_t), MADV_HUGEPAGE); /* advice: failure is harmless */
  return p;
}

typedef struct {
  uint64_t pos;
  uint16_t node;
} point_t;

static int cmp_point(const void *a, const void *b) {
  const point_t *x = a, *y = b;
  return x->pos < y->pos ? -1 : x->pos > y->pos ? 1 : (int)x->node - (int)y->node;
}

static int build_ring(sim_t *s) {
  s->nring = (size_t)(s->p.nodes * s->p.hash_vnodes);
  point_t *pts = malloc(s->nring * sizeof *pts);
  s->ring_pos = malloc(s->nring * sizeof *s->ring_pos);
  s->ring_node = malloc(s->nring * sizeof *s->ring_node);
  if (!pts || !s->ring_pos || !s->ring_node) {
    free(pts);
    return -ENOMEM;
  }
  for (size_t i = 0; i < s->nring; i++)
    pts[i] = (point_t){jitter_next(&s->rng), (uint16_t)(i / (size_t)s->p.hash_vnodes)};
  qsort(pts, s->nring, sizeof *pts, cmp_point);
  for (size_t i = 0; i < s->nring; i++) {
    s->ring_pos[i] = pts[i].pos;
    s->ring_node[i] = pts[i].node;
  }
  free(pts);
  return 0;
}

int sim_init(sim_t *s, const sim_params_t *p) {
  memset(s, 0, sizeof *s);
  s->p = *p;
  jitter_seed(&s->rng, (uint64_t)p->seed);
  cvg_backoff_t tmpl;
  cvg_backoff_init(&tmpl,
                   &(cvg_backoff_options_t){(cvg_backoff_strategy_t)p->backoff, p->base_ms,
                                            p->cap_ms, p->jitter_ms},
                   &s->rng);
  s->backoff = tmpl.opt;
  double per_node = (double)p->clients / (double)p->nodes;
  s->capacity = (int64_t)ceil(per_node / (1.0 - (double)p->headroom / 100.0));
  s->churn_per_step =
      (double)p->clients * (double)p->churn_per_million / 1e6 / 60.0 / SIM_TICKS_PER_S;
  s->batch_of = malloc((size_t)p->nodes * sizeof *s->batch_of);
  s->members = malloc((size_t)p->nodes * sizeof *s->members);
  s->member_of = malloc((size_t)p->nodes * sizeof *s->member_of);
  if (!s->batch_of || !s->members || !s->member_of) {
    sim_free(s);
    return -ENOMEM;
  }
  for (int64_t k = 0; k < p->nodes; k++) s->member_of[k] = -1;
  s->nbatches = (int)rollpolicy_batches((size_t)p->nodes, (size_t)p->batch, NULL, s->batch_of);
  /* a queue never holds more than its policy's bound at the full rate */
  s->qcap = p->handshake_rate * wait_bound_ms(s) / 1000 + 1;
  if (p->admission == SIM_ACCEPT_QUEUE && s->qcap > p->queue_max) s->qcap = p->queue_max;
  s->nsec = (int)p->duration_s;
  s->alarm_s = -1;
  s->c = alloc_clients((size_t)p->clients);
  s->wheel = calloc(SIM_WHEEL_SLOTS, sizeof *s->wheel);
  s->n = calloc((size_t)p->nodes, sizeof *s->n);
  s->ready = malloc((size_t)p->nodes * sizeof *s->ready);
  s->drop = calloc((size_t)p->nodes, 1);
  s->pnode = calloc((size_t)p->nodes, sizeof *s->pnode);
  rollpolicy_params_t rpp;
  rollpolicy_defaults(&rpp);
  rpp.pause_cpu = (double)p->pause_cpu / 100.0; /* 0: off, as in the params */
  rpp.abort_cpu = (double)p->abort_cpu / 100.0;
  rpp.abort_ms = (uint64_t)p->abort_s * 1000;
  rpp.drop_alarm = SIM_ALARM_DROP;
  rpp.drop_window_ms = SIM_ALARM_WINDOW_S * 1000;
  rpp.abort_on_drop = p->abort_alarm;
  rpp.sample_ms = 1000;
  s->nbins = p->duration_s * (1000 / SIM_HIST_BIN_MS) + 2; /* up to the whole run */
  s->hist = calloc((size_t)s->nbins, sizeof *s->hist);
  s->sec = calloc((size_t)s->nsec, sizeof *s->sec);
  s->batch_start_s = malloc((size_t)s->nbatches * sizeof *s->batch_start_s);
  s->batch_empty_s = malloc((size_t)s->nbatches * sizeof *s->batch_empty_s);
  s->reconnect99_s = malloc((size_t)s->nbatches * sizeof *s->reconnect99_s);
  s->batch_displaced = calloc((size_t)s->nbatches, sizeof *s->batch_displaced);
  s->batch_out = calloc((size_t)s->nbatches, sizeof *s->batch_out);
  if (!s->c || !s->wheel || !s->n || !s->ready || !s->drop || !s->pnode ||
      rollpolicy_init(&s->policy, &rpp, (size_t)p->nodes) != 0 || !s->hist || !s->sec ||
      !s->batch_start_s || !s->batch_empty_s || !s->reconnect99_s || !s->batch_displaced ||
      !s->batch_out || build_ring(s) != 0) {
    sim_free(s);
    return -ENOMEM;
  }
  for (int i = 0; i < s->nbatches; i++) {
    s->batch_start_s[i] = s->batch_empty_s[i] = SIM_NONE;
    s->reconnect99_s[i] = -1;
  }
  for (int64_t k = 0; k < p->nodes; k++) {
    s->n[k] = (sim_node_t){.up = 1,
                           .ready = 1,
                           .q = malloc((size_t)s->qcap * sizeof(uint32_t)),
                           .qt = malloc((size_t)s->qcap * sizeof(uint32_t))};
    if (!s->n[k].q || !s->n[k].qt) {
      sim_free(s);
      return -ENOMEM;
    }
  }
  for (uint32_t ci = 0; ci < (uint32_t)p->clients; ci++) {
    uint16_t k = (uint16_t)(ci % (uint32_t)p->nodes); /* spread evenly, as planned */
    s->c[ci] = (sim_client_t){.due = 0,
                              .since = SIM_NONE,
                              .prev_ms = (uint32_t)s->backoff.base_ms,
                              .node = k,
                              .state = SIM_CONNECTED};
    s->n[k].conns++;
  }
  s->connected = p->clients;
  rebuild_ready(s);
  return 0;
}

void sim_free(sim_t *s) {
  if (s->c) munmap(s->c, (size_t)s->p.clients * sizeof *s->c);
  for (size_t i = 0; s->wheel && i < SIM_WHEEL_SLOTS; i++) free(s->wheel[i].v);
  free(s->wheel);
  free(s->spare.v);
  for (int64_t k = 0; s->n && k < s->p.nodes; k++) {
    free(s->n[k].q);
    free(s->n[k].qt);
  }
  free(s->n);
  free(s->ready);
  free(s->drop);
  free(s->pnode);
  rollpolicy_free(&s->policy);
  free(s->ring_pos);
  free(s->ring_node);
  free(s->hist);
  free(s->sec);
  free(s->batch_start_s);
  free(s->batch_empty_s);
  free(s->reconnect99_s);
  free(s->batch_displaced);
  free(s->batch_out);
  spreads_free(s);
  free(s->batch_of);
  free(s->members);
  free(s->member_of);
  memset(s, 0, sizeof *s);
}

int64_t sim_outage_percentile(const sim_t *s, double q) {
  if (s->nhist == 0) return -1;
  size_t i = rank_bin(s->hist, (size_t)s->nbins, q); /* bin i > 0 holds [i-1, i) * 100 ms */
  return (int64_t)(i < (size_t)s->nbins ? i : (size_t)s->nbins - 1) * SIM_HIST_BIN_MS;
}
