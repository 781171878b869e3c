/*
 * sim/model: the discrete-event model of `converger sim`: nodes, clients,
 * the load balancer, the restart controller, and the per-second figures.
 *
 * Time advances in steps of SIM_TICK_MS. Each client has at most one
 * pending event (its next attempt, drain move or drain close) in a timing
 * wheel of SIM_WHEEL_SLOTS steps, each slot an array of client ids; an
 * event further away waits in its slot for the right turn (the client
 * keeps its due step). A handshake waits in its node's FIFO ring, served
 * at the node's spare CPU. Nothing is allocated per client: a client is
 * 20 bytes in one array. The arrays (not linked lists) let the
 * loops prefetch the clients they are about to touch: at 13 M clients,
 * nearly all the time goes to those cache misses.
 *
 * The rules and their sources (details in docs/benchmarks/sim.md):
 * - CPU of a node = connections / capacity + the work of the handshakes it
 *   served and the attempts it refused, over the step (an assumption: the
 *   steady load is proportional to connections; capacity is what 100 % CPU
 *   holds, from the headroom).
 * - accept policy `refuse`: an attempt is taken only if its handshake can
 *   start within refuse_wait_ms; `queue`: the admission queue of the
 *   admission-queue decision record, a FIFO wait bounded in time and length,
 *   handshakes run only while the CPU is below admission_cpu. Under both, a
 *   waiter keeps the step it was queued and is refused once it has waited
 *   past the bound (the node's spare CPU may fall after it was taken).
 * - reconnect99_s per batch: a client on a batch's nodes when it begins
 *   draining is stamped with the batch; the batch is reconnected once its
 *   nodes are empty and <= 1 % of those clients are without a connection.
 * - collapse (the reconnect-storm post-mortem's cascade): a node at 100 %
 *   CPU for collapse_s seconds in a row drops collapse_share of its clients.
 * - clients back off with the SDK's own cvg_backoff_next (client/backoff.h);
 *   a retryAfterMs hint is a floor.
 * - drain `close`: 1012 closes at close_rate per node; `migrate`: each
 *   client moves at a uniform time in the window (the drain lesson) to the
 *   node's reconnectTo pick, make-before-break: `spread`, what
 *   src/gate/drain.c does (gate/spread.h: each draining node's water-filling
 *   share from the loads when the batch began, drawn when the client moves,
 *   the same distribution as drawing at frame time), `least`, the ready peer
 *   with the most spare capacity at move time (DESIGN.md; an oracle), or
 *   `two`, the less loaded of two random ready peers at move time;
 *   stragglers are closed at window + 2 s (DRAIN_GRACE_MS).
 * - every random draw comes from one jitter_rng_t seeded with `seed`.
 *
 * One thread; a sim_t is used by the thread that made it.
 */
#ifndef CONVERGER_TOOLS_SIM_MODEL_H
#define CONVERGER_TOOLS_SIM_MODEL_H

#include <stdint.h>

#include "backoff.h"
#include "cluster/rollpolicy.h"
#include "common/jitter.h"
#include "gate/spread.h"
#include "sim/params.h"

#define SIM_TICK_MS        10 /* one step */
#define SIM_TICKS_PER_S    (1000 / SIM_TICK_MS)
#define SIM_WHEEL_SLOTS    16384 /* steps the wheel spans (164 s); a power of two */
#define SIM_NONE           UINT32_MAX
#define SIM_NO_NODE        UINT16_MAX
#define SIM_HIST_BIN_MS    100  /* outage histogram bins */
#define SIM_RATE_WINDOW_S  10   /* attempts per minute = attempts in 10 s * 6 */
#define SIM_ALARM_DROP     0.05 /* the post-mortem's alarm: connections drop 5 % ... */
#define SIM_ALARM_WINDOW_S 60   /* ... within 60 s */

typedef enum {
  SIM_CONNECTED = 0, /* no pending event */
  SIM_WAITING,       /* no connection; next attempt pending */
  SIM_QUEUED,        /* handshake waiting in a node's queue; maybe still connected to `node` */
  SIM_MIGRATING,     /* connected; drain move (or its retry) pending */
  SIM_CLOSING,       /* connected; drain close pending */
} sim_state_t;

enum {
  SIM_F_PENDING = 1,         /* in the wheel */
  SIM_F_CHURN = 2,           /* this outage is ordinary churn, not the restart's */
  SIM_F_DEGRADED = 4,        /* counted in sessions_degraded */
  SIM_F_CHURN_DEGRADED = 16, /* counted in churn_degraded_sessions */
};

/* One client: 20 bytes. */
typedef struct {
  uint32_t due;     /* step of the pending event */
  uint32_t since;   /* step the connection was lost (SIM_NONE: connected) */
  uint32_t prev_ms; /* the backoff's previous delay (decorrelated) */
  uint16_t node;    /* node connected to (SIM_NO_NODE: none) */
  uint8_t state;    /* sim_state_t */
  uint8_t attempt;  /* attempts since the last welcome (saturates at 255) */
  uint8_t flags;    /* SIM_F_* */
  uint16_t batch;   /* 1 + the batch that displaced it last (0: none); fits in the padding */
} sim_client_t;
_Static_assert(sizeof(sim_client_t) == 20, "a client is 20 bytes");

/* A growable array of client ids (a wheel slot). */
typedef struct {
  uint32_t *v;
  uint32_t n, cap;
} sim_slot_t;

typedef struct {
  int64_t conns;  /* connected clients */
  uint32_t *q;    /* ring of queued handshakes, s->qcap entries */
  uint32_t *qt;   /* the step each entry was queued (same ring) */
  uint32_t qhead; /* index of the oldest */
  int64_t qlen;
  int up, ready, draining;
  uint32_t ready_at;    /* step it is ready again after a restart */
  uint32_t closes;      /* drain closes scheduled so far */
  double carry;         /* fraction of a handshake left from the last step */
  double work;          /* this second: CPU-seconds of handshakes and refusals */
  int64_t refused_step; /* refusals in this step */
  double refuse_share;  /* CPU share the last step's refusals took */
  double cpu;           /* the last whole second's CPU (1.0 = 100 %; may exceed) */
  int hot_s;            /* seconds in a row at >= 100 % */
  int collapsed;        /* collapsed at least once */
  int64_t welcomes_s, peak_welcomes;
} sim_node_t;

/* What happened in one simulated second (a row of timeline.csv). */
typedef struct {
  int64_t attempts, welcomes, refusals, connected, disconnected, on_hot;
  double max_cpu;
  int nodes_ready, nodes_hot, collapses, batch, paused;
} sim_second_t;

typedef struct {
  sim_params_t p;
  jitter_rng_t rng;
  cvg_backoff_options_t backoff; /* normalised once by cvg_backoff_init */
  int64_t capacity;              /* connections at 100 % CPU per node */
  uint32_t now;                  /* current step */
  sim_client_t *c;
  sim_slot_t *wheel; /* SIM_WHEEL_SLOTS slots */
  sim_slot_t spare;  /* the array of the slot being run, kept for reuse */
  int64_t qcap;      /* ring size of each node queue (the most the policy accepts) */
  int failed;        /* out of memory growing a slot: sim_run stops */
  sim_node_t *n;
  uint16_t *ready; /* ids of ready nodes */
  int nready;
  uint8_t *drop; /* per node: collapses at the end of this second */
  /* the hash ring: points sorted by position */
  uint64_t *ring_pos;
  uint16_t *ring_node;
  size_t nring;
  /* churn: expected churned clients per step */
  double churn_per_step;
  int64_t connected;
  /* restart controller */
  rollpolicy_t policy;      /* pause, abort and the drop alarm (cluster/rollpolicy.h) */
  rollpolicy_node_t *pnode; /* per node: the policy's sample of this second */
  size_t *batch_of;         /* per node: its batch (rollpolicy_batches, node order) */
  uint16_t *members;        /* the nodes of the batch under way (or the last), node order */
  int nmembers;
  int32_t *member_of; /* per node: its index in members; -1: not in that batch */
  int next_batch, nbatches, batch_active, aborted;
  uint32_t batch_start, batch_done, first_start, restart_done;
  int paused_now;
  int64_t paused_s;
  uint32_t *batch_start_s;  /* per batch: start second */
  uint32_t *batch_empty_s;  /* per batch: second its nodes were all empty (SIM_NONE: not yet) */
  int32_t *reconnect99_s;   /* per batch: -1 until reached */
  int64_t *batch_displaced; /* per batch: clients on its nodes when it began */
  int64_t *batch_out;       /* per batch: of those, now without a connection */
  int64_t max_batch_displaced;
  /* reconnectTo spread: one per node of the batch draining now (spread[i]
   * for members[i]), over the nodes ready when it began (spread_ids) */
  spread_t *spread;
  int nspread;
  uint16_t *spread_ids;
  /* totals */
  int64_t attempts, churn_attempts, displaced, refusals, collapses, nodes_collapsed;
  int64_t moves, degraded_sessions;
  double disconnected_client_s;       /* outages of the restart, not churn */
  double churn_disconnected_client_s; /* outages of churn */
  int64_t churn_degraded_sessions;
  uint64_t *hist;       /* outage durations, SIM_HIST_BIN_MS bins */
  int64_t nhist, nbins; /* outages; bins (they span the run) */
  int alarm_s;          /* first second the alarm fired, -1: never */
  /* per second */
  sim_second_t *sec;
  int nsec;
} sim_t;

/* Make a simulation of `p` (already checked by sim_params_check): every
 * client connected, spread evenly, at step 0. Returns 0, or -ENOMEM (the
 * partial state freed). */
int sim_init(sim_t *s, const sim_params_t *p);

/* Run one step (SIM_TICK_MS): restart controller, churn, due events, node
 * service; closes the second when the step ends one. */
void sim_step(sim_t *s);

/* Run to p.duration_s. `progress` (NULL: none) is called once per
 * simulated minute with the second just done. Returns 0, or -ENOMEM when a
 * wheel slot could not grow (the run is incomplete). */
int sim_run(sim_t *s, void (*progress)(const sim_t *s, int second));

/* Free everything sim_init allocated. */
void sim_free(sim_t *s);

/* The node the load balancer sends client `ci` to (SIM_NO_NODE when no
 * node is ready). random and leastconn over ready nodes; hash: the first
 * ready node clockwise from the client's point on the ring. */
uint16_t sim_lb_pick(sim_t *s, uint32_t ci);

/* Offer client `ci`'s handshake to node `k` under the accept policy:
 * 1 queued (served later), 0 refused (counted as CPU work on the node).
 * Taken only if the queue, at the rate the node's spare CPU gives now
 * (less the last step's refusal work), reaches it within the bound; a
 * waiter still queued past the bound (the rate fell) is refused then. */
int sim_node_offer(sim_t *s, uint16_t k, uint32_t ci);

/* Outage percentile `q` (0..1) of the restart's outages (stats/rank.h's
 * nearest rank), in ms (bin upper bound; make-before-break moves count 0).
 * -1 when there were none. */
int64_t sim_outage_percentile(const sim_t *s, double q);

#endif
