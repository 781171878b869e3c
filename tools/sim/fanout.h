/*
 * sim/fanout: `converger sim fanout`, the fleet on paper (issue 32, item 6;
 * docs/benchmarks/scale-out.md, "The fleet on paper"). For a fleet of
 * gateway nodes it computes each node's bus bytes in under two designs:
 *
 *   NOTIFY to all    (today's, one PostgreSQL): every append is one
 *                    NotificationResponse to every node's LISTEN session,
 *                    so every node receives all R appends a second.
 *   interest-routed  (the sharded design, docs SCALE-OUT): a node SUBSCRIBEs
 *                    on B Redis instances only to the conversations it has
 *                    subscribers for, so it receives each message of those
 *                    once (not once per local subscriber), plus control
 *                    traffic: the all-nodes control channel, the replies to
 *                    its PUBLISHes, and the (UN)SUBSCRIBE confirmations that
 *                    clients' reconnects cause.
 *
 * Method. Clients are placed on nodes by the load balancer (uniformly at
 * random: the node counts are one multinomial draw). Conversations are
 * generated one at a time and never stored: each draws its size (its
 * online subscribers, from a fixed, geometric or Zipf distribution with
 * the same mean) and then a node for each subscriber, with probability
 * proportional to the node's clients (a client's subscriptions are on its
 * node); a stamp array of one word per node finds the conversation's
 * distinct nodes. The work is one draw per subscription (C x S, 65 M at the
 * post-mortem's fleet) and the memory a few words per node and per bus
 * instance, so the full fleet runs in about a second. A conversation's
 * message rate is R x its size / the sum of sizes (each client appends at
 * the same rate: "a message per client every ~11 min") or R / the number
 * of conversations; the sums are kept in units of the weight and scaled
 * by R / (sum of weights) at the end, so one pass suffices.
 *
 * Wire sizes are the protocols' own bytes on the socket (no TCP, IP or
 * TLS headers), given by the fanout_*_bytes functions below.
 *
 * Main thread; fanout_run owns the process while it runs (one core).
 */
#ifndef CONVERGER_TOOLS_SIM_FANOUT_H
#define CONVERGER_TOOLS_SIM_FANOUT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "common/jitter.h"

typedef enum { FANOUT_SIZE_FIXED = 0, FANOUT_SIZE_GEOMETRIC, FANOUT_SIZE_ZIPF } fanout_size_dist_t;
typedef enum { FANOUT_RATE_SIZE = 0, FANOUT_RATE_CONV } fanout_rate_by_t;

/* PostgreSQL's LISTEN channel (store/store.h STORE_NOTIFY_CHANNEL), and the
 * Redis channels of the design: "cvg.m.<conv>" per conversation, and one
 * control channel every node subscribes to (its name is an assumption). */
#define FANOUT_NOTIFY_CHANNEL    "converger"
#define FANOUT_CONV_PREFIX       "cvg.m."
#define FANOUT_CONTROL_CHANNEL   "cvg.ctl"
#define FANOUT_NOTIFY_MAX        7999 /* PostgreSQL's payload limit (STORE_NOTIFY_PAYLOAD_MAX) */
#define FANOUT_SIZE_MAX_LIMIT    1000000
#define FANOUT_PER_INSTANCE_LIST 64 /* summary lists each instance's figures up to this B */

typedef struct {
  int64_t nodes, clients;
  int64_t appends_per_s;     /* R: messages appended per second, fleet-wide */
  int64_t msg_bytes;         /* a message's notification payload, bytes */
  int64_t subs_per_client;   /* S */
  int64_t online_per_conv;   /* M: mean online subscribers of a conversation */
  int size_dist;             /* fanout_size_dist_t */
  int64_t size_max;          /* geometric, zipf: the largest conversation */
  int rate_by;               /* fanout_rate_by_t */
  int64_t conv_id_bytes;     /* a conversation id's length (channel "cvg.m.<id>") */
  int64_t notify_batch;      /* messages packed in one NOTIFY (1: a lone one) */
  int64_t churn_per_million; /* steady reconnects per minute per 10^6 clients */
  int64_t control_per_s;     /* control-channel messages per second, fleet-wide */
  int64_t control_bytes;     /* a control message's payload, bytes */
  int64_t bus_instances;     /* B */
  int64_t seed;
} fanout_params_t;

/* Figures of one run. Per-node arrays have p.nodes entries, per-instance
 * arrays p.bus_instances; all owned by the fanout_t. Rates in B/s or
 * messages/s. */
typedef struct {
  fanout_params_t p;
  int64_t *clients_on; /* clients the load balancer put on each node */
  /* per node */
  double *notify_in;  /* NOTIFY to all: R x fanout_notify_bytes_per_msg */
  double *msg_in;     /* interest-routed: message pushes of its conversations */
  double *control_in; /* interest-routed: control channel, PUBLISH replies, confirmations */
  double *kept;       /* messages/s of the conversations it has subscribers for */
  int64_t *pairs;     /* conversations it has subscribers for: its bus subscriptions */
  int64_t *subs;      /* its clients' subscriptions */
  int64_t *single;    /* ... that are their conversation's only one on the node */
  /* per bus instance */
  int64_t *bus_subs;   /* (conversation, node) pairs held, + nodes on the control channel's */
  double *bus_egress;  /* pushes, PUBLISH replies, confirmations */
  double *bus_ingress; /* PUBLISH and (UN)SUBSCRIBE commands */
  /* fleet */
  int64_t convs, subs_total, pairs_total, largest;
  double zipf_exponent; /* zipf: s of P(size = k) ~ k^-s solved for the mean; else 0 */
  double reply_bytes;   /* mean bytes of a PUBLISH reply */
  /* the generator's state */
  jitter_rng_t rng;
  double *zipf_cdf; /* zipf: P(size <= k + 1), size_max entries */
  uint64_t *accept; /* per node: accept a draw when its low 32 bits are below (2^32: always) */
  int64_t *stamp;   /* per node: 1 + the conversation last counted there */
  int64_t *count;   /* per node: that conversation's subscribers there */
  int64_t *seen;    /* the conversation's distinct nodes */
  double *w_msgs;   /* per node: sum of the weights of its conversations */
  double *bus_w, *bus_w_fan, *bus_w_reply;
} fanout_t;

/* The defaults: the reconnect-storm post-mortem's fleet (480 nodes, 13 M
 * clients; docs/background.md) and the assumptions of the scale-out design
 * (R = 20 000 appends/s, ~300 B a notification, 5 subscriptions per client,
 * ~3 online subscribers per conversation), listed with the rest in
 * docs/benchmarks/scale-out.md. */
void fanout_params_default(fanout_params_t *p);

/* Check `p` (ranges and the parameters against each other): 0, or -1 with
 * a one-line reason in `err` (`errlen` bytes). */
int fanout_params_check(const fanout_params_t *p, char *err, size_t errlen);

/* Allocate, seed, solve the Zipf exponent and place the clients on nodes
 * (clients_on; a caller may change it before fanout_run, e.g. to empty a
 * node). `p` must pass fanout_params_check. 0, or -1 when out of memory
 * (nothing left to free). */
int fanout_init(fanout_t *f, const fanout_params_t *p);

/* Generate every conversation, place its subscribers and fill the
 * figures. 0, or -1 when no node has a client. */
int fanout_run(fanout_t *f);

void fanout_free(fanout_t *f);

/* Wire bytes. A PostgreSQL NotificationResponse is 'A', Int32 length,
 * Int32 pid, the channel and the payload, each NUL-terminated; a NOTIFY of
 * `batch` > 1 messages packs them (store/postgres.c, migration 7) as
 * "b\n" then "<len> <payload>" each. Per message, framing included. */
double fanout_notify_bytes_per_msg(int64_t payload, int64_t batch);

/* A RESP2 pub/sub push, "*3\r\n$7\r\nmessage\r\n$<n>\r\n<channel>\r\n$<n>
 * \r\n<payload>\r\n", the same length as the PUBLISH command that causes
 * it ("*3\r\n$7\r\nPUBLISH\r\n..."). */
int64_t fanout_push_bytes(int64_t channel, int64_t payload);

/* PUBLISH's reply ":<receivers>\r\n". */
int64_t fanout_reply_bytes(int64_t receivers);

/* A SUBSCRIBE (unsub 0) or UNSUBSCRIBE (unsub 1) confirmation,
 * "*3\r\n$9\r\nsubscribe\r\n$<n>\r\n<channel>\r\n:<count>\r\n", `count`
 * the connection's subscriptions after it. */
int64_t fanout_confirm_bytes(int unsub, int64_t channel, int64_t count);

/* The summary of a finished run as a new JSON object (the caller owns
 * it; NULL when out of memory). Every figure is simulated (no wall time):
 * the same parameters give the same object. Keys in fanout.c and
 * docs/benchmarks/scale-out.md. */
json_t *fanout_summary(const fanout_t *f);

/* Print `sum` (from fanout_summary) as Markdown tables to `out`. */
void fanout_print(const json_t *sum, FILE *out);

/* `converger sim fanout`: argv excludes "sim fanout". Prints the figures
 * to stdout. Returns the exit status: 0 after a run (or --help), 1 when
 * out of memory, 2 on a bad flag or value. */
int fanout_main(int argc, char **argv);

#endif
