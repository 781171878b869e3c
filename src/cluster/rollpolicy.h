/*
 * rollpolicy: the decisions of a rolling restart, without I/O: which nodes
 * restart together (batch choice), whether the fleet has the headroom to
 * start, whether a batch may start now (pause), and whether the restart
 * must stop (abort). The reconnect-storm post-mortem's action items: a
 * capacity headroom budget (35 %, so at most 65 % utilisation), a
 * restart-pause threshold, the abort criterion its runbook lacked ("if CPU
 * on any surviving node exceeds 80 % for more than 30 s, halt the
 * restart") and the total-connections alarm (down more than 5 % within
 * 60 s).
 *
 * Inputs are samples: per node, whether it answered, whether it is ready,
 * whether it belongs to the batch being restarted, its connections, its
 * published capacity and its CPU (the event loop's utilisation, 0..1; may
 * exceed 1 in the simulator, meaning work the node could not do). Outputs
 * are a verdict and the figures that made it. `converger roll` feeds it
 * samples read from real nodes once a second; `converger sim` feeds it its
 * simulated nodes once a simulated second. The time is the caller's
 * (monotonic ms), so tests replay recorded series.
 *
 * A survivor is a node that answered, is ready and is not in the batch
 * under way (before a batch: not in the next one). A node's utilisation
 * is connections / capacity when it publishes a capacity, else its CPU.
 *
 * Any thread; one rollpolicy_t per caller.
 */
#ifndef CONVERGER_CLUSTER_ROLLPOLICY_H
#define CONVERGER_CLUSTER_ROLLPOLICY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  double max_utilisation;  /* refuse to start above this fleet utilisation (0.65) */
  double pause_cpu;        /* no batch starts while a survivor is above (0.75); <= 0: off */
  double abort_cpu;        /* abort when a survivor stays above (0.80) ... ; <= 0: off */
  uint64_t abort_ms;       /* ... for this long (30 000 ms) */
  double drop_alarm;       /* the alarm: total connections down more than this fraction (0.05) */
  uint64_t drop_window_ms; /* ... within this window (60 000 ms); <= 0 fraction: off */
  int abort_on_drop;       /* the alarm aborts the restart (1) */
  uint64_t sample_ms;      /* the period of the caller's samples (1000 ms) */
} rollpolicy_params_t;

/* The defaults above. */
void rollpolicy_defaults(rollpolicy_params_t *p);

/* One node at one sample. */
typedef struct {
  const char *name;    /* for the reasons (borrowed; NULL: "node <index>") */
  int up;              /* it answered */
  int ready;           /* /readyz 200 (not draining, not starting) */
  int in_batch;        /* in the batch under way, or, before a batch, in the next one */
  int64_t connections; /* WebSocket connections */
  int64_t capacity;    /* connections it is sized for; 0: not published */
  double cpu;          /* event-loop utilisation, 0..1; < 0: unknown */
} rollpolicy_node_t;

typedef enum {
  ROLLPOLICY_GO = 0, /* go on (a batch may start, if one is due) */
  ROLLPOLICY_PAUSE,  /* do not start the next batch yet */
  ROLLPOLICY_ABORT,  /* start nothing more; the batch under way finishes its drain */
} rollpolicy_verdict_t;

/* The state of one restart: what each node's CPU has been doing, the
 * connections of the last window, and the verdict once aborted. */
typedef struct {
  rollpolicy_params_t p;
  size_t n;
  uint64_t *hot_since;              /* per node: first sample above abort_cpu in a row; 0: none */
  struct rollpolicy_sample_s *ring; /* (t, level) of the last drop window */
  size_t rlen, rcap;
  int64_t last_total; /* the previous sample's total; -1 before the first */
  int aborted;       /* latched */
  int alarm;         /* the drop alarm has fired (latched) */
  uint64_t alarm_ms; /* when */
  char why[320];     /* what tripped, with the figures (abort or alarm) */
} rollpolicy_t;

/* Set up `rp` for a fleet of `nodes` nodes with `p` (copied). 0, or -1
 * when out of memory. Free with rollpolicy_free. */
int rollpolicy_init(rollpolicy_t *rp, const rollpolicy_params_t *p, size_t nodes);
void rollpolicy_free(rollpolicy_t *rp);

/* A node's utilisation (0..1, may exceed 1): connections / capacity, or
 * its CPU without a capacity; < 0 when neither is known. */
double rollpolicy_node_utilisation(const rollpolicy_node_t *node);

/* The fleet's utilisation: total connections / total capacity when every
 * node publishes one, else the mean of the nodes' utilisations (nodes with
 * neither are left out); < 0 when nothing is known. */
double rollpolicy_fleet_utilisation(const rollpolicy_node_t *nodes, size_t n);

/* Batch choice: which batch each node is restarted in. The nodes are taken
 * in `order` (order[k] is the index of the k-th node to restart, each of
 * 0..n-1 once; NULL: index order, which for converger roll is the fleet's
 * listing: /admin/cluster's, by id, or --nodes as given), `batch` at a
 * time: batch_of[order[k]] = k / batch. Every batch but the last holds
 * `batch` nodes (a batch of 0 is taken as 1). Fills batch_of[0..n) (the
 * caller's array) and returns the number of batches, ceil(n / batch); 0
 * when n is 0. Both drivers call it, so a roll and its simulation restart
 * the same nodes together, in the same sequence. */
size_t rollpolicy_batches(size_t n, size_t batch, const size_t *order, size_t *batch_of);

/* Before a batch, the nodes of the next one stop being survivors: mark
 * in_batch on nodes[i] exactly when batch_of[i] == b (b: the batch under
 * way, or, before a batch, the next one; ROLLPOLICY_NO_BATCH, or a batch
 * past the last, marks none, as after the last batch or in a balance). So
 * both drivers feed the pause and abort checks the same survivors. */
#define ROLLPOLICY_NO_BATCH ((size_t)-1)
void rollpolicy_mark_batch(rollpolicy_node_t *nodes, size_t n, const size_t *batch_of, size_t b);

/* The headroom budget, before the restart: 0 when it may start. 1 when it
 * is refused, with the reason and its figures in `why` (NUL-terminated,
 * `len` bytes): the fleet's utilisation is above max_utilisation, or the
 * survivors of one of the batches could not hold the fleet's connections
 * below 100 % of their capacity (of their CPU without capacities).
 * `batch_of[i]` is node i's batch (0..nbatches-1). */
int rollpolicy_headroom(const rollpolicy_params_t *p, const rollpolicy_node_t *nodes, size_t n,
                        const size_t *batch_of, size_t nbatches, char *why, size_t len);

/* One sample at `now_ms` (monotonic, increasing). `before_batch`: the
 * caller would start a batch now (then in_batch marks the next batch's
 * nodes), so a hot survivor pauses it. `population`: the base of the drop
 * alarm (the simulator's client count); 0: the most connections seen in
 * the window. Returns the verdict; ABORT stays once given, with rp->why
 * saying what tripped. PAUSE fills rp->why as well. */
rollpolicy_verdict_t rollpolicy_observe(rollpolicy_t *rp, uint64_t now_ms,
                                        const rollpolicy_node_t *nodes, int before_batch,
                                        int64_t population);

#endif
