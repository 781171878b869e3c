/*
 * fixture: a node's protocol layers in one test process, with no network
 * and no threads, for unit tests of the session, admission and drain.
 *
 * What is real: the transport (net/: HTTP through llhttp, the upgrade,
 * WebSocket framing through wslay), the sessions (proto/), the local bus,
 * admission, auth, the drain, and the store (SQLite in a temporary
 * directory). What is not: each client is one end of a socketpair(2) that
 * the test writes and reads itself (fx_peer_t); the pool is inline (its
 * jobs run when the test calls fx_step, store/pool.h); the monotonic clock
 * is fake (fx->now, util_mono_fake), moved only by fx_advance, which also
 * runs what the node's timers would (connection ticks, admission expiry).
 *
 * Loop thread = the test's thread. One fixture at a time (the fake clock is
 * process-wide).
 */
#ifndef CONVERGER_TESTS_FIXTURE_H
#define CONVERGER_TESTS_FIXTURE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "bus/bus.h"
#include "common/jitter.h"
#include "core/metrics.h"
#include "core/config.h"
#include "gate/admission.h"
#include "gate/auth.h"
#include "gate/drain.h"
#include "net/conn.h"
#include "proto/session.h"
#include "store/pool.h"
#include "store/store.h"

#define FX_SECRET "fixture-token-secret-of-at-least-32-bytes"

/* What fx_init sets up; the test may change cfg before fx_init's caller
 * opens peers (slots and queue are fixed at fx_init). */
typedef struct {
  int slots;     /* admission slots (default 2) */
  int queue_max; /* admission waiters (default 4) */
  int queue_ms;  /* longest admission wait (default 1000) */
} fx_options_t;

typedef struct fx_peer_s fx_peer_t;

#define FX_PEERS_MAX 64

typedef struct fx_s {
  uv_loop_t loop;
  config_t cfg;
  metrics_t *metrics; /* the fixture node's registry */
  uint64_t now;       /* the fake monotonic clock, ms */
  char dir[64];
  char url[128];
  store_t *db; /* the test's own connection to the store (setup, appends) */
  pool_t *pool;
  bus_t *bus;
  auth_t *auth;
  admission_t *admission;
  int64_t admission_at; /* the admission queue's armed deadline; -1: none */
  drain_t *drain;
  jitter_rng_t rng;
  net_t net;
  sessions_t sessions;
  int stops; /* times the drain asked the node to stop */
  char stop_why[128];
  fx_peer_t *peers[FX_PEERS_MAX]; /* open peers: a freed connection is forgotten */
} fx_t;

/* One client: the test's end of a socketpair whose other end is a node
 * connection. */
struct fx_peer_s {
  fx_t *fx;
  int fd;
  conn_t *conn;     /* the node's side; NULL once it was freed */
  char in[4 << 20]; /* bytes read from the node not yet parsed */
  size_t in_len;
  int closed;     /* a close frame or EOF came */
  int close_code; /* the close frame's code; 1006: EOF without one */
  char close_reason[128];
};

/* Set up the fixture in `fx` (zeroed by it) with `opt` (NULL: defaults).
 * Fails the test on error. */
void fx_init(fx_t *fx, const fx_options_t *opt);
/* Close every peer's connection, the drain, the bus and the pool; run the
 * loop until nothing is left; remove the directory. */
void fx_free(fx_t *fx);

/* A loop turn without blocking, then the connections' output written (the
 * node's uv_check), a few times over. */
void fx_run(fx_t *fx);
/* Run the oldest pool job (pool_step), then fx_run. Returns 1 when a job
 * ran. */
int fx_step(fx_t *fx);
/* Run pool jobs until none is left. Returns how many ran. */
int fx_drain_pool(fx_t *fx);
/* Move the fake clock `ms` forward and run what the node's timers would:
 * admission expiry at its armed deadline, conn_tick, drain_tick, then
 * fx_run. */
void fx_advance(fx_t *fx, uint64_t ms);

/* A channel `ch` and conversation `conv` in it, with `n` messages
 * (bodies {"i": 1..n}). */
void fx_conv(fx_t *fx, const char *ch, const char *conv, int n);
/* Commit one message to `conv` through the bus, as a send does, and run
 * the loop (live subscribers get it). Returns its seq. */
int64_t fx_append(fx_t *fx, const char *conv, int i);
/* A token for `sub` covering `conv` (or "*"), valid for an hour: heap. */
char *fx_token(fx_t *fx, const char *sub, const char *conv);
/* The same, valid for `ttl_s` seconds. */
char *fx_token_ttl(fx_t *fx, const char *sub, const char *conv, int64_t ttl_s);

/* A new client upgraded to WebSocket (the 101 read). Heap; fx_peer_free. */
fx_peer_t *fx_connect(fx_t *fx);
/* The same with `headers` (each line ending in "\r\n") in the upgrade
 * request, e.g. "X-Forwarded-Proto: https\r\n". */
fx_peer_t *fx_connect_with(fx_t *fx, const char *headers);
/* A new client that wrote `request` (raw HTTP) and read nothing yet. The
 * fixture routes GET /v1/ws (upgraded) and GET /v1/sse?conv=A&conv=B
 * (up to 4) with Authorization: Bearer TOKEN and an optional
 * Last-Event-ID: a stream of those conversations (session_sse_begin;
 * presenceEvents=true in the query for join and leave events; retry:
 * 1234), or 400 for a bad Last-Event-ID. Heap; fx_peer_free. */
fx_peer_t *fx_connect_raw(fx_t *fx, const char *request);
/* Every byte the node wrote to `p` and not taken yet (runs the loop
 * first), NUL-terminated; heap, the caller frees. For streams: the WebSocket
 * calls below parse frames instead. */
char *fx_take(fx_peer_t *p);
/* Close the client's end (the node sees EOF) and free it. */
void fx_peer_free(fx_peer_t *p);
/* Send `json` as one masked text frame, then fx_run. */
void fx_send(fx_peer_t *p, const char *json);
/* The hello of `conv` from `watermark` (< 0: null), with a token. */
void fx_hello(fx_peer_t *p, const char *conv, int64_t watermark);
/* The same hello with `token` (borrowed). */
void fx_hello_token(fx_peer_t *p, const char *token, const char *conv, int64_t watermark);
/* The next text frame the node sent, parsed (caller decrefs), or NULL
 * when none is waiting (after a close, p->closed says so). Pings are
 * answered and skipped. Runs the loop once first. */
json_t *fx_recv(fx_peer_t *p);
/* fx_recv, failing the test unless the frame has "type" `type`. */
json_t *fx_expect(fx_peer_t *p, const char *type);
/* Fail the test when a text frame is waiting. */
void fx_expect_nothing(fx_peer_t *p);
/* The session of the peer's connection's subscription to `conv`, for
 * the state machine tests: its state (sub_state_t), -1 when none. */
int fx_sub_state(fx_peer_t *p, const char *conv);

#endif
