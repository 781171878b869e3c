/*
 * spread: where a draining node sends its connections (the drain frame's
 * reconnectTo), shared by src/gate/drain.c and the simulator (tools/sim).
 *
 * The rule ("water-filling", split among the nodes draining at once): from
 * the membership table a draining node knows the ready peers' loads L_i
 * (connections + admission waiters) and D, the connections of every node
 * draining now, its own C included. Once every drain is done the load is
 * expected to sit level on the peers, at T = (sum L_i + D) / npeers; peer
 * i's deficit is d_i = max(0, T - L_i), and this node fills its share of
 * it, budget_i = d_i * C / D. Each pick draws a peer with probability
 * proportional to its remaining budget and takes one client from it, so
 * nodes that do this independently from the same snapshot fill each peer
 * up to about T instead of herding onto the few least loaded. Once the
 * budget left is below one client (a stale snapshot, or a level fleet),
 * a pick is two random choices over the loads counted so far (the less
 * loaded of two random peers; each pick counts one more).
 *
 * Why: `converger sim --scenario fixed --reconnect-to two` (docs/benchmarks/
 * sim.md) showed two random choices alone send only ~2 x 30 / 450 of the
 * moves to the 30 nodes just restarted, so the survivors creep up by 2-3
 * CPU points a batch until the restart's 75 % pause stops it; picking the
 * least loaded peer works only as a live oracle and herds from a stale one.
 *
 * A pick costs O(log npeers) (a Fenwick tree over the budgets, kept in
 * milli-clients). No I/O, no globals; a spread_t belongs to one thread.
 */
#ifndef CONVERGER_GATE_SPREAD_H
#define CONVERGER_GATE_SPREAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/jitter.h"

typedef struct {
  size_t n;        /* peers */
  int64_t *load;   /* L_i plus the picks so far (the fallback's counts) */
  int64_t *budget; /* remaining budget per peer, milli-clients */
  int64_t *tree;   /* Fenwick tree over budget, 1-based (tree[0] unused) */
  int64_t total;   /* sum of budget, milli-clients */
  double target;   /* T, clients per peer */
  size_t deficits; /* peers below T at init */
} spread_t;

/* Set up `s` for one draining node. `peer_load`: npeers loads (clients,
 * >= 0; copied, the caller keeps its array). `my_conns`: C, the
 * connections this node will tell to move; `draining_conns`: D, those of
 * every node draining now including C (a smaller D is taken as C). With
 * C or D 0 there is no budget and every pick is two random choices.
 * npeers may be 0 (then spread_pick must not be called). Returns 0, or -1
 * on a negative argument or out of memory (then `s` holds nothing and
 * spread_free is still safe). */
int spread_init(spread_t *s, const int64_t *peer_load, size_t npeers, int64_t my_conns,
                int64_t draining_conns);

/* The next connection's peer: an index in [0, npeers), drawn from `rng`.
 * Requires npeers > 0. Takes one client from that peer's budget (what is
 * left of it if less) and counts one on its load. */
size_t spread_pick(spread_t *s, jitter_rng_t *rng);

/* Budget left, in clients (rounded down). */
int64_t spread_budget_left(const spread_t *s);

/* Free what spread_init allocated and zero `s`. Safe on a zeroed or
 * failed spread_t. */
void spread_free(spread_t *s);

#endif
