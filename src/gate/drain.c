/*
 * drain.c: drain and shed (see drain.h).
 *
 * A batch is one set of connections told to move: the drain's (every
 * WebSocket connection) or a shed's (a random share). A connection's
 * its drain mark's batch says which one it belongs to (0: none). A batch begins with a
 * pool job that reads the live peers (reconnectTo), then sends its frames
 * (or, if that read takes over FRAME_WAIT_MS, with the peers read last
 * time) and sets its deadline. Only welcomed connections are told; one
 * welcomed later in the batch is told then, for the rest of the window
 * (drain_welcomed). At the deadline its connections still open go to the
 * close queue, which one timer empties at close_rate per second through a
 * token bucket holding at most one timer period's worth: closes are spread
 * evenly, and a stalled loop does not make up for lost time in a burst.
 *
 * A drain with no ready peer to move to (a single node, or every peer
 * draining, as the last successful read of the nodes says) sends no
 * frames: the clients would come back to this node or to none. Its
 * connections go to the close queue at once, closed with 1012 and a
 * jittered retry hint at close_rate per second, and the node stops as soon
 * as none is left (at once with none).
 *
 * reconnectTo is spread.h's water-filling, per scheme: when a batch's
 * frames go, the peers read last (ready, not this node: L_i) whose public
 * URL has a scheme, the connections of the other nodes in state "draining"
 * and the batch's own connections of that scheme (C; so D = C + the
 * others) make one spread_t that every frame of the batch to a connection
 * of that scheme, also those told later (drain_welcomed), draws from. A
 * wss client is never offered a ws peer, nor a ws client a wss one
 * (docs/protocol.md 5.6); with none of its scheme its reconnectTo is null.
 *
 * A Server-Sent Events stream is told at its moment instead (a min-heap
 * of moments, emptied by the same timer; see "streams' moments").
 *
 * Owns: the timer, the close queue (each entry holds a conn_ref), the
 * streams' heap (no conn_ref: an entry leaves it with its stream's close),
 * the peers job while it runs, the peers and the spread of the last read.
 */
#include "gate/drain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/metrics.h"
#include "cluster/membership.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/urlauth.h"
#include "common/util.h"
#include "gate/admission.h"
#include "gate/spread.h"
#include "net/conn.h"
#include "net/ws.h"

#define BATCH_DRAIN      1u  /* the drain's batch; sheds count up from 2 */
#define FRAME_WAIT_MS    500 /* longest wait for the peers read before the frames go anyway */
#define DEADLINE_STEP_MS 20  /* the timer's period while no close is queued */

typedef struct {
  uint32_t id;       /* 0: none */
  int64_t window_ms; /* afterMs drawn from [0, window) */
  int framing;       /* frames not sent yet (its peers job runs) */
  uint64_t began;    /* monotonic ms: the batch began */
  uint64_t deadline; /* monotonic ms: frames sent + window + grace; 0 before */
  int told;          /* connections sent a frame */
  int moved;         /* of those, closed by themselves (the log's counts) */
  uint64_t last_move; /* monotonic ms: the last of those closed; 0: none yet */
  int overtime;       /* past its deadline, waiting for moves still coming in */
  int closed;        /* closed with 1012 by the pacer */
  int no_peer;       /* the drain found no ready peer: closes, no frames */
} batch_t;

typedef struct {
  char url[STORE_URL_MAX + 1];
  int64_t load; /* connections + admission waiters, plus those we sent there */
  int tls;      /* its public URL is wss:// */
} peer_t;

/* A Server-Sent Events stream told to move, ended at `due` (monotonic
 * ms). No conn_ref: the entry leaves the heap when the stream closes
 * (drain_conn_closing), and m->sse_slot is its place. */
typedef struct {
  uint64_t due;
  conn_t *c;
  drain_mark_t *m; /* c's, kept by its session until the connection is freed */
} sse_due_t;

typedef struct {
  pool_job_t job;
  drain_t *d;
  batch_t *batch;
  store_node_t *nodes;
  size_t n;
  int status;
} peers_job_t;

struct drain_s {
  drain_env_t env;  /* what the drain works with (drain.h) */
  uv_timer_t timer; /* deadlines and pacing, while a batch is active */
  /* The policy's own progress, not the node's lifecycle (node->phase,
   * lifecycle.c, is that): */
  int begun;   /* drain_start ran: the node is draining, or stopping after it */
  int stopped; /* stop() called: later closes are the shutdown's */
  uint64_t began_ms, shutdown_at;
  uint32_t last_shed;
  batch_t drain, shed;
  conn_t **queue; /* paced closes, each with a conn_ref */
  size_t qhead, qlen, qcap;
  double tokens;      /* closes allowed now (token bucket) */
  uint64_t tokens_at; /* monotonic ms of the last refill */
  uint64_t every;     /* the timer's period, ms */
  peer_t *peers;      /* ready peers from the last read (reconnectTo) */
  size_t npeers;
  int peers_read;          /* a read of the nodes has succeeded: npeers is known */
  int64_t others_draining; /* connections of the other draining nodes, last read */
  /* The current batch's reconnectTo picks, one spread per scheme ([0] ws,
   * [1] wss: a connection is offered peers of its own scheme only), each
   * over that scheme's peers, spread_peer[s][k] the index in peers of its
   * k-th; spread_npeers the npeers they were built for (n 0: none). */
  spread_t spread[2];
  size_t *spread_peer[2];
  size_t spread_npeers;
  sse_due_t *sse; /* streams told to move: a min-heap by their moment */
  size_t nsse, sse_cap;
};

/* ---- close queue -------------------------------------------------------- */

static void enqueue(drain_t *d, conn_t *c) {
  if (d->qlen == d->qcap) {
    if (d->qhead > 0) { /* reuse the consumed front */
      memmove(d->queue, d->queue + d->qhead, (d->qlen - d->qhead) * sizeof *d->queue);
      d->qlen -= d->qhead;
      d->qhead = 0;
    }
    if (d->qlen == d->qcap) {
      size_t cap = d->qcap ? d->qcap * 2 : 256;
      conn_t **q = realloc(d->queue, cap * sizeof *q);
      if (!q) return; /* not closed by the pacer: the shutdown closes it */
      d->queue = q;
      d->qcap = cap;
    }
  }
  if (d->qhead == d->qlen) { /* empty: the first close may go at once */
    d->tokens = 1;
    d->tokens_at = util_mono_ms();
  }
  conn_ref(c);
  d->queue[d->qlen++] = c;
}

/* The drain state of `c`, kept by its session (drain_env_t.mark); NULL
 * for a connection that has none (HTTP, or a session that never began). */
static drain_mark_t *mark(drain_t *d, conn_t *c) {
  return c->mode == CONN_WS ? d->env.mark(d->env.ud, c) : NULL;
}

static uint32_t batch_id(drain_t *d, conn_t *c) {
  drain_mark_t *m = mark(d, c);
  return m ? m->batch : 0;
}

/* Queue every open WebSocket connection of `batch` (any batch: 0). */
static size_t enqueue_batch(drain_t *d, uint32_t batch) {
  size_t n = 0;
  for (conn_t *c = ws_next_open(d->env.net, NULL); c; c = ws_next_open(d->env.net, c))
    if (batch == 0 || batch_id(d, c) == batch) {
      enqueue(d, c);
      n++;
    }
  return n;
}

static batch_t *batch_of(drain_t *d, conn_t *c) {
  uint32_t id = batch_id(d, c);
  return id == BATCH_DRAIN ? &d->drain : id && id == d->shed.id ? &d->shed : NULL;
}

static void close_paced(drain_t *d, conn_t *c) {
  batch_t *b = batch_of(d, c);
  if (b) b->closed++;
  char reason[48];
  snprintf(reason, sizeof reason, "{\"retryAfterMs\":%ld}",
           config_retry_hint(d->env.cfg, d->env.rng));
  ws_close(c, WS_CLOSE_SERVICE_RESTART, reason);
  metrics_add(d->env.metrics, "converger_drain_closed_total", "reason=\"paced\"", 1);
}

static void pace(drain_t *d, uint64_t now) {
  double rate = d->env.cfg->drain_close_rate;
  double cap = rate * (double)d->every / 1000.0;
  if (cap < 1) cap = 1;
  d->tokens += (double)(now - d->tokens_at) * rate / 1000.0;
  if (d->tokens > cap) d->tokens = cap;
  d->tokens_at = now;
  while (d->qhead < d->qlen && d->tokens >= 1) {
    conn_t *c = d->queue[d->qhead++];
    /* conn_unref: 1 while it is open; one that left meanwhile costs nothing */
    if (conn_unref(c) && ws_is_open(c)) {
      close_paced(d, c);
      d->tokens -= 1;
    }
  }
}

static void release_queue(drain_t *d) {
  while (d->qhead < d->qlen) conn_unref(d->queue[d->qhead++]);
  d->qhead = d->qlen = 0;
}

/* ---- streams' moments ---------------------------------------------------- */

/* A Server-Sent Events stream cannot follow a reconnectTo (an EventSource
 * reconnects to its own URL) nor move make-before-break, so the drain
 * frame's afterMs would be the time it is away if the frame ended the
 * stream at once. Instead the stream is told nothing until its moment,
 * drawn as a WebSocket's afterMs is, and keeps its messages until then;
 * at that moment it gets a drain event with a short retry (drain.h) and
 * ends, and the reader is back at once, through its load balancer, on a
 * ready node, with its Last-Event-ID. The spread over the window is the
 * same as the WebSocket clients'.
 *
 * The moments are a min-heap that the timer empties, and it holds no
 * reference to the streams. A conn_ref would keep a stream whose reader
 * left before its moment allocated, and so counted in nws and nconns, until
 * that moment, up to the whole window: the drain, which stops the node
 * when nws reaches 0, would wait for it, and so would a stop during the
 * drain (SIGINT: node_stop closes the streams, and lifecycle_tick waits
 * for nconns to reach 0, logging a stop deadline passed after
 * STOP_GRACE_MS). Instead an entry leaves the heap when its stream
 * closes: every close path (the reader leaving, ws_close and so node_stop's
 * 1001, the stream's own end, conn_close) calls the session's on_close and
 * so drain_conn_closing, which takes the entry out through its place
 * (drain_mark_t.sse_slot), in O(log n). So no entry outlives its
 * connection, which is freed only after its close (a stream that ws_close
 * ended while its hello job was out may still be welcomed and pushed after
 * that close: its final conn_close takes the entry off again, and sse_due
 * ends only an open stream); the drain's
 * own stop (sse_release) only forgets the entries. Why not scan the open
 * connections for due moments on each tick instead, keeping the moment in
 * the mark: the drain's timer runs every 20 ms while it drains, and the
 * drain otherwise does no per-connection work per tick (its walks of the
 * connections run once per batch: the frames, the deadline's close queue,
 * the stop); the node's own walk (conn_tick) runs at its tick, once a
 * second with the default timeouts. A walk of every connection 50 times
 * a second for the few streams among them would cost more than the whole
 * drain; the heap costs O(log n) per stream, once at its push and once at
 * its moment or close. */

static void sse_put(drain_t *d, size_t i, sse_due_t e) {
  d->sse[i] = e;
  e.m->sse_slot = (uint32_t)i + 1;
}

static void sse_up(drain_t *d, size_t i) {
  sse_due_t e = d->sse[i];
  while (i > 0 && d->sse[(i - 1) / 2].due > e.due) {
    sse_put(d, i, d->sse[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  sse_put(d, i, e);
}

static void sse_down(drain_t *d, size_t i) {
  sse_due_t e = d->sse[i];
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    uint64_t least = e.due;
    if (l < d->nsse && d->sse[l].due < least) {
      m = l;
      least = d->sse[l].due;
    }
    if (r < d->nsse && d->sse[r].due < least) m = r;
    if (m == i) break;
    sse_put(d, i, d->sse[m]);
    i = m;
  }
  sse_put(d, i, e);
}

/* Queue stream `c` (its mark `m`) to end at `due`; one already queued (a
 * shed's, told again by the drain) keeps the earlier of its two moments.
 * 0, or -1 when out of memory (then it stays until the deadline's 1012
 * close). */
static int sse_push(drain_t *d, uint64_t due, conn_t *c, drain_mark_t *m) {
  if (m->sse_slot) {
    size_t i = m->sse_slot - 1;
    if (due < d->sse[i].due) {
      d->sse[i].due = due;
      sse_up(d, i);
    }
    return 0;
  }
  if (d->nsse == d->sse_cap) {
    size_t cap = d->sse_cap ? d->sse_cap * 2 : 64;
    sse_due_t *p = realloc(d->sse, cap * sizeof *p);
    if (!p) return -1;
    d->sse = p;
    d->sse_cap = cap;
  }
  d->sse[d->nsse] = (sse_due_t){due, c, m};
  sse_up(d, d->nsse++);
  return 0;
}

/* Take stream `m`'s entry off the heap (nothing when it has none). */
static void sse_remove(drain_t *d, drain_mark_t *m) {
  if (!m->sse_slot) return;
  size_t i = m->sse_slot - 1;
  m->sse_slot = 0;
  sse_due_t last = d->sse[--d->nsse];
  if (i == d->nsse) return; /* it was the last */
  d->sse[i] = last;
  sse_up(d, i); /* one of the two moves it, or neither */
  sse_down(d, last.m->sse_slot - 1);
}

int drain_check(const drain_t *d) {
  for (size_t i = 0; i < d->nsse; i++) {
    if (d->sse[i].m->sse_slot != i + 1) {
      log_error("drain: the stream at %zu of the heap of moments says it is at %u", i,
                (unsigned)d->sse[i].m->sse_slot);
      return -1;
    }
    if (i > 0 && d->sse[(i - 1) / 2].due > d->sse[i].due) {
      log_error("drain: the stream at %zu of the heap of moments is due before its parent", i);
      return -1;
    }
  }
  return 0;
}

/* The drain stops: forget every entry (the stop closes their streams). */
static void sse_release(drain_t *d) {
  for (size_t i = 0; i < d->nsse; i++) d->sse[i].m->sse_slot = 0;
  d->nsse = 0;
}

/* Stream `c`'s moment: the drain event, afterMs a short jittered retry,
 * reconnectTo null, deadlineMs 0 (net/ws.c writes afterMs as retry: and
 * ends the stream). It counts as moved: it leaves now, and its reader
 * comes back elsewhere after the retry. */
static void sse_move(drain_t *d, conn_t *c) {
  batch_t *b = batch_of(d, c);
  drain_mark_t *m = mark(d, c);
  char *f = d->env.frame(
      d->env.ud, jitter_range(d->env.rng, SSE_DRAIN_RETRY_MIN_MS, SSE_DRAIN_RETRY_MAX_MS), NULL, 0);
  if (!f) { /* out of memory: a close with the hint ends it all the same */
    close_paced(d, c);
    return;
  }
  if (m && !m->counted) {
    m->counted = 1;
    if (b) {
      b->moved++;
      b->last_move = util_mono_ms();
    }
    metrics_add(d->env.metrics, "converger_drain_migrated_total", NULL, 1);
  }
  ws_send_text(c, f, strlen(f));
  free(f);
}

/* End every stream whose moment has come (each one open: a stream's
 * close takes its entry off). */
static void sse_due(drain_t *d, uint64_t now) {
  while (d->nsse && d->sse[0].due <= now) {
    conn_t *c = d->sse[0].c;
    sse_remove(d, d->sse[0].m);
    if (ws_is_open(c)) sse_move(d, c);
  }
}

/* ---- frames ------------------------------------------------------------- */

static void spreads_free(drain_t *d) {
  for (int s = 0; s < 2; s++) {
    spread_free(&d->spread[s]);
    free(d->spread_peer[s]);
    d->spread_peer[s] = NULL;
  }
  d->spread_npeers = 0;
}

/* The batch's spreads from the last read, one per scheme (a wss client is
 * never sent to a ws peer, nor a ws client to a wss one: docs/protocol.md
 * 5.6): for scheme s, L_i the loads of the peers of that scheme (with what
 * earlier batches sent them), C the batch's connections of that scheme
 * still to tell, D = C + the other draining nodes' connections. A scheme
 * with no peer, or out of memory: no spread, and its frames say
 * reconnectTo null (the client picks from its own list). */
static void spread_build(drain_t *d, batch_t *b) {
  spreads_free(d);
  if (d->npeers == 0) return;
  for (int s = 0; s < 2; s++) {
    int64_t *load = malloc(d->npeers * sizeof *load), c = 0;
    size_t *idx = malloc(d->npeers * sizeof *idx), n = 0;
    for (size_t i = 0; load && idx && i < d->npeers; i++)
      if (d->peers[i].tls == s) {
        idx[n] = i;
        load[n++] = d->peers[i].load;
      }
    for (conn_t *x = ws_next_open(d->env.net, NULL); x; x = ws_next_open(d->env.net, x)) {
      drain_mark_t *m = mark(d, x);
      c += m && m->batch == b->id && !m->told && !ws_is_sse(x) && /* a stream takes none */
           x->client_tls == (unsigned)s;
    }
    if (!load || !idx || spread_init(&d->spread[s], load, n, c, c + d->others_draining) != 0) {
      log_warn("%s: out of memory for reconnectTo's spread: reconnectTo null",
               b->id == BATCH_DRAIN ? "drain" : "shed");
      free(idx);
      idx = NULL;
    }
    d->spread_peer[s] = idx;
    free(load);
    if (n == 0 && c > 0) /* safe (null), but no targeted move: say why at each build */
      log_warn("%s: %lld %s connection(s) and no ready peer with a %s:// public URL: their "
               "reconnectTo is null (behind a proxy that ends TLS, is X-Forwarded-Proto set?)",
               b->id == BATCH_DRAIN ? "drain" : "shed", (long long)c, s ? "TLS" : "plaintext",
               s ? "wss" : "ws");
  }
  d->spread_npeers = d->npeers;
}

/* reconnectTo for connection `c` (spread.h): a peer of its scheme, counted
 * on the peer; NULL (null) with none. */
static const char *pick_peer(drain_t *d, const conn_t *c) {
  int s = c->client_tls;
  if (d->spread[s].n == 0 || !d->spread_peer[s] || d->spread_npeers != d->npeers) return NULL;
  size_t k = d->spread_peer[s][spread_pick(&d->spread[s], d->env.rng)];
  d->peers[k].load++;
  return d->peers[k].url;
}

/* One drain frame to `c`: afterMs uniform in [0, window_ms), deadlineMs
 * window_ms + DRAIN_GRACE_MS. */
static void tell(drain_t *d, batch_t *b, conn_t *c, int64_t window_ms) {
  int64_t after = window_ms > 0 ? jitter_range(d->env.rng, 0, window_ms - 1) : 0;
  if (ws_is_sse(c)) { /* nothing now: its drain event at its moment (sse_move) */
    if (sse_push(d, util_mono_ms() + (uint64_t)after, c, mark(d, c)) != 0)
      return; /* closed at the deadline */
  } else {
    char *f = d->env.frame(d->env.ud, after, pick_peer(d, c), window_ms + DRAIN_GRACE_MS);
    if (!f) return; /* out of memory: it is closed at the deadline anyway */
    ws_send_text(c, f, strlen(f));
    free(f);
  }
  mark(d, c)->told = 1; /* only connections with a mark are told */
  b->told++;
}

/* The drain with no ready peer: every connection to the close queue now
 * (1012 with a retry hint, paced), no frames. */
static void close_without_peer(drain_t *d, batch_t *b) {
  b->framing = 0;
  b->no_peer = 1;
  b->deadline = UINT64_MAX; /* queued now, once: drain_tick has no deadline to keep */
  size_t n = enqueue_batch(d, 0);
  log_info("drain: no ready peer to move to: closing %zu connection(s) with 1012 and a retry "
           "hint at %d/s; exit when none is left",
           n, d->env.cfg->drain_close_rate);
}

static void send_frames(drain_t *d, batch_t *b) {
  if (b->id == BATCH_DRAIN && d->peers_read && d->npeers == 0) {
    close_without_peer(d, b);
    return;
  }
  b->framing = 0;
  spread_build(d, b);
  for (conn_t *c = ws_next_open(d->env.net, NULL); c; c = ws_next_open(d->env.net, c)) {
    drain_mark_t *m = mark(d, c);
    if (m && m->welcomed && m->batch == b->id && !m->told) tell(d, b, c, b->window_ms);
  }
  b->deadline = util_mono_ms() + (uint64_t)b->window_ms + DRAIN_GRACE_MS;
  log_info("%s: told %d connection(s) to move within %lld ms (%zu ready peer(s) for reconnectTo: "
           "ws %zu, level %.0f, %zu below it; wss %zu, level %.0f, %zu below it)",
           b->id == BATCH_DRAIN ? "drain" : "shed", b->told, (long long)b->window_ms, d->npeers,
           d->spread[0].n, d->spread[0].target, d->spread[0].deficits, d->spread[1].n,
           d->spread[1].target, d->spread[1].deficits);
}

static void peers_work(pool_job_t *job, store_t *db) {
  peers_job_t *j = container_of(job, peers_job_t, job);
  j->status = store_nodes_live(db, util_now_ms(), MEMBERSHIP_MAX_AGE_MS, &j->nodes, &j->n);
}

static void peers_done(pool_job_t *job) {
  peers_job_t *j = container_of(job, peers_job_t, job);
  drain_t *d = j->d;
  batch_t *b = j->batch;
  peer_t *peers = NULL;
  if (!job->canceled && !job->dropped && j->status == 0 &&
      (peers = calloc(j->n + 1, sizeof *peers)) != NULL) {
    size_t np = 0;
    int64_t others = 0;
    for (size_t i = 0; i < j->n; i++) {
      const store_node_t *nd = &j->nodes[i];
      if (strcmp(nd->id, d->env.cfg->node_id) == 0) continue; /* C: its live count */
      if (strcmp(nd->state, "draining") == 0) others += nd->connections;
      if (strcmp(nd->state, "ready") != 0) continue;
      snprintf(peers[np].url, sizeof peers[np].url, "%s", nd->public_url);
      urlauth_ws_scheme(nd->public_url, &peers[np].tls);
      peers[np++].load = nd->connections + nd->waiters;
    }
    free(d->peers);
    d->peers = peers;
    d->npeers = np;
    d->others_draining = others;
    d->peers_read = 1;
  } else if (!job->canceled) {
    log_warn("drain: cannot read the cluster's nodes (%s); reconnectTo from the last read (%zu)",
             job->dropped ? "pool overloaded" : cv_strerror(j->status), d->npeers);
  }
  /* Unless the frames already went (FRAME_WAIT_MS), or the node stopped.
   * When they went, the fresher read makes the spread for those told
   * later; new peers with an old spread would pick the wrong indices. */
  if (!job->canceled && b->id && !d->stopped) {
    if (b->framing)
      send_frames(d, b);
    else if (peers)
      spread_build(d, b);
  } else if (peers) {
    spreads_free(d);
  }
  store_nodes_free(j->nodes);
  free(j);
}

/* Read the peers, then send the batch's frames (peers_done). */
static void batch_begin(drain_t *d, batch_t *b) {
  peers_job_t *j = calloc(1, sizeof *j);
  b->framing = 1;
  b->began = util_mono_ms();
  if (!j) { /* the peers of the last read, but the frames go now */
    send_frames(d, b);
    return;
  }
  j->d = d;
  j->batch = b;
  j->job.kind = "drain";
  j->job.no_drop = 1;
  pool_submit(*d->env.pool, &j->job, peers_work, peers_done);
}

/* ---- deadlines ---------------------------------------------------------- */

static void set_state_metric(drain_t *d) {
  metrics_set(d->env.metrics, "converger_drain_state", NULL, drain_state(d));
}

static void timer_cb(uv_timer_t *t) { drain_tick(t->data); }

/* Whether batch `b`, at or past its deadline with `left` connections
 * still here, waits longer before its 1012s: while clients are still
 * moving (one told closed by itself within DRAIN_PROGRESS_MS), for at most
 * DRAIN_OVERTIME_MS past the deadline, and for a drain never so long that
 * the paced closes of those left would end after drain_shutdown_ms. A move
 * drawn near the end of the window whose welcome elsewhere is late (a
 * peer's admission queue under a burst of moves) then completes instead
 * of being cut off with a 1012 and an offline gap. Logs when it begins. */
static int overtime(drain_t *d, batch_t *b, uint64_t now, size_t left) {
  if (left == 0 || b->last_move == 0 || now - b->last_move >= DRAIN_PROGRESS_MS) return 0;
  uint64_t until = b->deadline + DRAIN_OVERTIME_MS;
  if (b == &d->drain) {
    int rate = d->env.cfg->drain_close_rate > 0 ? d->env.cfg->drain_close_rate : 1;
    uint64_t closing = (uint64_t)left * 1000 / (uint64_t)rate;
    uint64_t room = d->shutdown_at > closing ? d->shutdown_at - closing : 0;
    if (room < until) until = room;
  }
  if (now >= until) return 0;
  if (!b->overtime)
    log_info("%s: window over, %zu still here while clients are still moving: the 1012s wait "
             "until none has moved for %d ms, at most %llu ms",
             b == &d->drain ? "drain" : "shed", left, DRAIN_PROGRESS_MS,
             (unsigned long long)(until - now));
  b->overtime = 1;
  return 1;
}

void drain_tick(drain_t *d) {
  uint64_t now = util_mono_ms();
  if (d->stopped) return; /* the stop closes what is left */
  batch_t *bs[] = {&d->drain, &d->shed};
  for (int i = 0; i < 2; i++)
    if (bs[i]->id && bs[i]->framing && now >= bs[i]->began + FRAME_WAIT_MS) {
      log_warn("%s: the cluster's nodes not read within %d ms; reconnectTo from the last read",
               bs[i] == &d->drain ? "drain" : "shed", FRAME_WAIT_MS);
      send_frames(d, bs[i]);
    }
  if (d->shed.id && !d->shed.framing && d->shed.deadline && now >= d->shed.deadline &&
      !overtime(d, &d->shed, now, (size_t)(d->shed.told - d->shed.moved))) {
    size_t n = enqueue_batch(d, d->shed.id);
    if (n)
      log_info("shed: window over: %d told, %d moved, %zu still here, closing them with 1012 "
               "at %d/s",
               d->shed.told, d->shed.moved, n, d->env.cfg->drain_close_rate);
    else
      log_info("shed: window over: %d told, %d moved, none left", d->shed.told, d->shed.moved);
    d->shed.id = 0;
    set_state_metric(d);
  }
  if (d->drain.id && !d->drain.framing && d->drain.deadline && now >= d->drain.deadline &&
      !overtime(d, &d->drain, now, (size_t)d->env.net->nws)) {
    size_t n = enqueue_batch(d, 0);
    log_info("drain: window over: %llu moved, %zu still here, closing them with 1012 at %d/s",
             (unsigned long long)d->drain.moved, n, d->env.cfg->drain_close_rate);
    d->drain.deadline = UINT64_MAX; /* queued once */
  }
  sse_due(d, now);
  pace(d, now);
  if (d->begun && !d->stopped && (d->env.net->nws == 0 || now >= d->shutdown_at)) {
    d->stopped = 1;
    release_queue(d);
    sse_release(d); /* the stop closes them */
    int left = 0;   /* open, with no close frame sent yet: the stop closes them */
    for (conn_t *c = ws_next_open(d->env.net, NULL); c; c = ws_next_open(d->env.net, c)) left++;
    if (left)
      metrics_add(d->env.metrics, "converger_drain_closed_total", "reason=\"shutdown\"",
                  (uint64_t)left);
    char why[160];
    snprintf(why, sizeof why, "drain %s after %llu ms: %llu moved, %llu closed with 1012, %d left",
             left ? "deadline" : "complete", (unsigned long long)(now - d->began_ms),
             (unsigned long long)d->drain.moved, (unsigned long long)d->drain.closed, left);
    d->env.stop(d->env.ud, why);
  }
  if (!d->begun && !d->shed.id && d->qhead == d->qlen && d->nsse == 0) {
    uv_timer_stop(&d->timer);
    return;
  }
  /* Every pacing period while closes are queued; otherwise only the
   * deadlines need watching, at a coarser step. */
  uint64_t want = d->qhead < d->qlen ? d->every : DEADLINE_STEP_MS;
  if (uv_timer_get_repeat(&d->timer) != want) uv_timer_start(&d->timer, timer_cb, want, want);
}

static void timer_run(drain_t *d) {
  int rate = d->env.cfg->drain_close_rate;
  d->every = rate >= 1000 ? 1 : (uint64_t)(1000 / rate);
  if (d->every > DEADLINE_STEP_MS) d->every = DEADLINE_STEP_MS;
  if (!uv_is_active((uv_handle_t *)&d->timer)) uv_timer_start(&d->timer, timer_cb, 0, d->every);
}

/* ---- public ------------------------------------------------------------- */

drain_t *drain_new(const drain_env_t *env) {
  drain_t *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->env = *env;
  d->last_shed = BATCH_DRAIN;
  uv_timer_init(env->loop, &d->timer);
  d->timer.data = d;
  set_state_metric(d);
  return d;
}

static void closed_cb(uv_handle_t *h) {
  drain_t *d = h->data;
  release_queue(d);
  free(d->queue);
  free(d->sse); /* its entries hold nothing; their marks may be freed already */
  free(d->peers);
  spreads_free(d);
  free(d);
}

void drain_close(drain_t *d) { uv_close((uv_handle_t *)&d->timer, closed_cb); }

int drain_start(drain_t *d, const char *why) {
  if (d->begun) return -CV_EEXISTS;
  d->begun = 1;
  d->began_ms = util_mono_ms();
  d->shutdown_at = d->began_ms + (uint64_t)d->env.cfg->drain_shutdown_ms;
  d->drain.id = BATCH_DRAIN;
  d->drain.window_ms = d->env.cfg->drain_window_ms;
  /* The drain takes over a running shed: its connections are told again
   * (the SDK keeps the earlier of two moves) and closed at the drain's
   * deadline if they have not moved by then. */
  uint32_t shed = d->shed.id;
  if (shed) {
    log_info("%s: the shed under way (%d told, %d moved) is folded into the drain", why,
             d->shed.told, d->shed.moved);
    d->shed.id = 0;
  }
  /* every WebSocket not closing, a close frame sent or not: one whose
   * close is under way is not counted as moved (drain_moved) */
  for (conn_t *c = d->env.net->conns; c; c = c->next) {
    drain_mark_t *m = mark(d, c);
    if (m && !c->closing && (m->batch == 0 || m->batch == shed)) {
      m->batch = BATCH_DRAIN;
      m->told = 0;
    }
  }
  log_info("%s: draining: not ready; %d WebSocket connection(s) to move to a ready peer within "
           "%d ms (with none, closed with 1012 now), the rest closed at %d/s after it; exit when "
           "none is left or after %d ms",
           why, d->env.net->nws, d->env.cfg->drain_window_ms, d->env.cfg->drain_close_rate,
           d->env.cfg->drain_shutdown_ms);
  set_state_metric(d);
  if (d->env.membership)
    membership_beat_now(d->env.membership); /* peers stop sending clients here */
  if (d->env.cfg->drain_migrate) {
    batch_begin(d, &d->drain);
  } else { /* no frames: the deadline is now, the paced 1012 closes begin at once */
    d->drain.began = util_mono_ms();
    d->drain.deadline = d->drain.began;
    log_info("drain: CONVERGER_DRAIN_MIGRATE=0: no drain frames; closing at %d/s now",
             d->env.cfg->drain_close_rate);
  }
  timer_run(d);
  return 0;
}

int drain_shed(drain_t *d, double fraction, int64_t window_ms, int *chosen, int *total) {
  if (d->begun || d->shed.id) return -CV_EBUSY;
  conn_t **all = malloc(((size_t)d->env.net->nws + 1) * sizeof *all);
  if (!all) return -CV_ENOMEM;
  int n = 0;
  for (conn_t *c = ws_next_open(d->env.net, NULL); c && n < d->env.net->nws;
       c = ws_next_open(d->env.net, c)) {
    drain_mark_t *m = mark(d, c);
    if (m && m->welcomed && m->batch == 0) all[n++] = c;
  }
  int k = (int)(fraction * n + 0.5);
  if (k > n) k = n;
  /* A random k of them: the first k of a partial Fisher-Yates shuffle. */
  uint32_t id = ++d->last_shed;
  for (int i = 0; i < k; i++) {
    int r = (int)jitter_range(d->env.rng, i, n - 1);
    conn_t *t = all[i];
    all[i] = all[r];
    all[r] = t;
    mark(d, all[i])->batch = id;
  }
  free(all);
  memset(&d->shed, 0, sizeof d->shed);
  d->shed.id = id;
  d->shed.window_ms = window_ms;
  *chosen = k;
  *total = n;
  log_info("shed: %d of %d connection(s) (fraction %.3f) told to move within %lld ms", k, n,
           fraction, (long long)window_ms);
  set_state_metric(d);
  batch_begin(d, &d->shed);
  timer_run(d);
  return 0;
}

void drain_welcomed(drain_t *d, conn_t *c) {
  batch_t *b = batch_of(d, c);
  drain_mark_t *m = mark(d, c);
  if (!b || !m || b->framing || m->told || d->stopped) return; /* the batch's frames tell it */
  if (b->no_peer) return; /* queued for its 1012 with the others */
  uint64_t now = util_mono_ms();
  if (now >= b->deadline) return; /* it is queued for its 1012 anyway */
  int64_t left = (int64_t)(b->deadline - now) - DRAIN_GRACE_MS;
  tell(d, b, c, left > 0 ? left : 0);
}

void drain_conn_closing(drain_t *d, conn_t *c) {
  drain_mark_t *m = mark(d, c);
  if (m) sse_remove(d, m); /* the drain keeps nothing of a closed stream */
  if (!m || !m->told || c->closed_by_us || m->counted || d->stopped) return;
  m->counted = 1;
  batch_t *b = batch_of(d, c);
  if (b) {
    b->moved++;
    b->last_move = util_mono_ms();
  }
  metrics_add(d->env.metrics, "converger_drain_migrated_total", NULL, 1);
}

void drain_progress(const drain_t *d, drain_progress_t *out) {
  const batch_t *b = d->begun ? &d->drain : &d->shed;
  *out = (drain_progress_t){.told = b->told,
                            .moved = b->moved,
                            .closed = b->closed,
                            .remaining = d->begun ? d->env.net->nws : 0};
}

int drain_state(const drain_t *d) { return d->begun ? 1 : d->shed.id ? 2 : 0; }
